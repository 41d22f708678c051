/*
 * safetensors.c: the strict safetensors reader and the atomic streaming
 * writer. The byte layout and every validation rule are in safetensors.h.
 *
 * The header is parsed by a purpose-built JSON reader rather than a general
 * library, because the format needs things general parsers do not give:
 * exact 64-bit integers (cJSON stores numbers as double and loses bits above
 * 2^53), duplicate-key detection, and a hard bound on nesting and sizes on
 * input that is hostile by assumption.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "hash.h"

/* ---- dtypes -------------------------------------------------------------- */

static const struct {
	const char *name;
	unsigned bits;
} dtype_table[MS_DTYPE_COUNT] = {
	[MS_DTYPE_BOOL] = {"BOOL", 8},
	[MS_DTYPE_F4] = {"F4", 4},
	[MS_DTYPE_F6_E2M3] = {"F6_E2M3", 6},
	[MS_DTYPE_F6_E3M2] = {"F6_E3M2", 6},
	[MS_DTYPE_U8] = {"U8", 8},
	[MS_DTYPE_I8] = {"I8", 8},
	[MS_DTYPE_F8_E5M2] = {"F8_E5M2", 8},
	[MS_DTYPE_F8_E4M3] = {"F8_E4M3", 8},
	[MS_DTYPE_F8_E8M0] = {"F8_E8M0", 8},
	[MS_DTYPE_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
	[MS_DTYPE_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
	[MS_DTYPE_I16] = {"I16", 16},
	[MS_DTYPE_U16] = {"U16", 16},
	[MS_DTYPE_F16] = {"F16", 16},
	[MS_DTYPE_BF16] = {"BF16", 16},
	[MS_DTYPE_I32] = {"I32", 32},
	[MS_DTYPE_U32] = {"U32", 32},
	[MS_DTYPE_F32] = {"F32", 32},
	[MS_DTYPE_C64] = {"C64", 64},
	[MS_DTYPE_F64] = {"F64", 64},
	[MS_DTYPE_I64] = {"I64", 64},
	[MS_DTYPE_U64] = {"U64", 64},
};

const char *ms_dtype_name(enum ms_dtype dt)
{
	if ((unsigned)dt >= MS_DTYPE_COUNT)
		return NULL;
	return dtype_table[dt].name;
}

int ms_dtype_parse(const char *s, size_t n, enum ms_dtype *out)
{
	for (int i = 0; i < MS_DTYPE_COUNT; i++) {
		if (strlen(dtype_table[i].name) == n && !memcmp(dtype_table[i].name, s, n)) {
			*out = (enum ms_dtype)i;
			return MS_OK;
		}
	}
	return MS_EINVAL;
}

unsigned ms_dtype_bits(enum ms_dtype dt)
{
	return (unsigned)dt < MS_DTYPE_COUNT ? dtype_table[dt].bits : 0;
}

int ms_dtype_nbytes(enum ms_dtype dt, uint64_t nelem, uint64_t *out)
{
	uint64_t bits = ms_dtype_bits(dt), whole, rest;

	/* Split by eight elements so the bit count never overflows where the
	 * byte count does not (2^62 U8 elements are 2^62 bytes, but 2^65 bits). */
	if (ms_mul_u64(nelem / 8, bits, &whole))
		return MS_EINVAL;
	rest = nelem % 8 * bits;
	if (rest % 8 || ms_add_u64(whole, rest / 8, out))
		return MS_EINVAL;
	return MS_OK;
}

float ms_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

uint16_t ms_f32_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40); /* quiet NaN, sign kept */
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

float ms_f16_to_f32(uint16_t h)
{
	uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
	uint32_t u;
	float f;

	if (e == 0) {
		f = ldexpf((float)m, -24);
		return s ? -f : f;
	}
	if (e == 31)
		u = s | 0x7f800000u | (m << 13);
	else
		u = s | ((e + 112) << 23) | (m << 13);
	memcpy(&f, &u, 4);
	return f;
}

uint16_t ms_f32_to_f16(float f)
{
	uint32_t u, s, e, m;

	memcpy(&u, &f, 4);
	s = (u >> 16) & 0x8000;
	e = (u >> 23) & 255;
	m = u & 0x7fffff;
	if (e == 255)
		return (uint16_t)(s | 0x7c00 | (m ? 0x200 : 0));
	{
		int exp = (int)e - 127 + 15;
		uint32_t mant = m | 0x800000, r;
		int shift;

		if (exp >= 31)
			return (uint16_t)(s | 0x7c00);
		if (exp <= 0) {
			if (exp < -10)
				return (uint16_t)s;
			shift = 14 - exp;
		} else {
			shift = 13;
		}
		r = mant >> shift;
		{
			uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);

			if (rem > half || (rem == half && (r & 1)))
				r++;
		}
		if (exp <= 0)
			return (uint16_t)(s | r);
		/* r carries the implicit bit; a carry out bumps the exponent */
		return (uint16_t)(s | (((uint32_t)exp << 10) + (r - 0x400)));
	}
}

/* A small float with exp_bits/man_bits/bias, optional inf/nan rules. */
static double minifloat(uint32_t v, int exp_bits, int man_bits, int bias)
{
	uint32_t sign = v >> (exp_bits + man_bits) & 1;
	uint32_t e = (v >> man_bits) & ((1u << exp_bits) - 1);
	uint32_t m = v & ((1u << man_bits) - 1);
	double x;

	if (e == 0)
		x = ldexp((double)m, 1 - bias - man_bits);
	else
		x = ldexp((double)(m | (1u << man_bits)), (int)e - bias - man_bits);
	return sign ? -x : x;
}

int ms_dtype_get_f64(enum ms_dtype dt, const uint8_t *d, uint64_t i, double *out)
{
	uint8_t b;

	switch (dt) {
	case MS_DTYPE_BOOL: *out = d[i] ? 1.0 : 0.0; return MS_OK;
	case MS_DTYPE_U8: *out = d[i]; return MS_OK;
	case MS_DTYPE_I8: *out = (int8_t)d[i]; return MS_OK;
	case MS_DTYPE_F4:
		b = d[i / 2];
		*out = minifloat(i & 1 ? b >> 4 : b & 15, 2, 1, 1);
		return MS_OK;
	case MS_DTYPE_F6_E2M3:
	case MS_DTYPE_F6_E3M2: {
		/* little-endian bit stream: element i occupies bits [6i, 6i+6) */
		uint64_t bit = i * 6;
		uint32_t v = d[bit / 8];

		if (bit % 8 > 2)
			v |= (uint32_t)d[bit / 8 + 1] << 8;
		v = (v >> (bit % 8)) & 63;
		*out = dt == MS_DTYPE_F6_E2M3 ? minifloat(v, 2, 3, 1) : minifloat(v, 3, 2, 3);
		return MS_OK;
	}
	case MS_DTYPE_F8_E4M3:
		b = d[i];
		*out = (b & 0x7f) == 0x7f ? NAN : minifloat(b, 4, 3, 7);
		return MS_OK;
	case MS_DTYPE_F8_E5M2:
		b = d[i];
		if ((b & 0x7c) == 0x7c)
			*out = (b & 3) ? NAN : (b & 0x80 ? -INFINITY : INFINITY);
		else
			*out = minifloat(b, 5, 2, 15);
		return MS_OK;
	case MS_DTYPE_F8_E8M0:
		b = d[i];
		*out = b == 0xff ? NAN : ldexp(1.0, (int)b - 127);
		return MS_OK;
	case MS_DTYPE_F8_E4M3FNUZ:
		b = d[i];
		*out = b == 0x80 ? NAN : minifloat(b, 4, 3, 8);
		return MS_OK;
	case MS_DTYPE_F8_E5M2FNUZ:
		b = d[i];
		*out = b == 0x80 ? NAN : minifloat(b, 5, 2, 16);
		return MS_OK;
	default:
		break;
	}
	{
		union {
			uint8_t b[8];
			uint16_t u16;
			int16_t i16;
			uint32_t u32;
			int32_t i32;
			uint64_t u64;
			int64_t i64;
			float f;
			double df;
		} u;
		unsigned sz = ms_dtype_bits(dt) / 8;

		memcpy(u.b, d + i * sz, sz);
		switch (dt) {
		case MS_DTYPE_I16: *out = u.i16; break;
		case MS_DTYPE_U16: *out = u.u16; break;
		case MS_DTYPE_F16: *out = ms_f16_to_f32(u.u16); break;
		case MS_DTYPE_BF16: *out = ms_bf16_to_f32(u.u16); break;
		case MS_DTYPE_I32: *out = u.i32; break;
		case MS_DTYPE_U32: *out = u.u32; break;
		case MS_DTYPE_F32: *out = u.f; break;
		case MS_DTYPE_F64: *out = u.df; break;
		case MS_DTYPE_I64: *out = (double)u.i64; break;
		case MS_DTYPE_U64: *out = (double)u.u64; break;
		default: return MS_EINVAL;
		}
	}
	return MS_OK;
}

/* ---- strict header parser ------------------------------------------------ */

struct jp {
	const uint8_t *s;
	size_t n, i;
	const char *label;
	struct ms_err *err;
};

static int jp_fail(struct jp *p, const char *rule)
{
	return ms_err_set(p->err, MS_EINVAL, "'%s': invalid header: %s (at byte %zu)",
			  p->label, rule, p->i + 8);
}

static void jp_ws(struct jp *p)
{
	while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' ||
			       p->s[p->i] == '\n' || p->s[p->i] == '\r'))
		p->i++;
}

static int jp_expect(struct jp *p, char c, const char *rule)
{
	jp_ws(p);
	if (p->i >= p->n || p->s[p->i] != (uint8_t)c)
		return jp_fail(p, rule);
	p->i++;
	return MS_OK;
}

/* Validate UTF-8 over the whole header once: shortest forms only, no
 * surrogates, nothing above U+10FFFF. */
static int utf8_valid(const uint8_t *s, size_t n, size_t *bad)
{
	size_t i = 0;

	while (i < n) {
		uint8_t c = s[i];
		uint32_t cp;
		int len;

		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xe0) == 0xc0) {
			len = 2;
			cp = c & 0x1f;
		} else if ((c & 0xf0) == 0xe0) {
			len = 3;
			cp = c & 0x0f;
		} else if ((c & 0xf8) == 0xf0) {
			len = 4;
			cp = c & 0x07;
		} else {
			goto bad;
		}
		if (i + (size_t)len > n)
			goto bad;
		for (int k = 1; k < len; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				goto bad;
			cp = cp << 6 | (s[i + k] & 0x3f);
		}
		if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
		    (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			goto bad;
		i += (size_t)len;
	}
	return 0;
bad:
	*bad = i;
	return -1;
}

static int hex4(const uint8_t *s, uint32_t *out)
{
	uint32_t v = 0;

	for (int k = 0; k < 4; k++) {
		uint8_t c = s[k];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (uint32_t)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (uint32_t)(c - 'A' + 10);
		else
			return -1;
	}
	*out = v;
	return 0;
}

/* Parse a string into a new NUL-terminated buffer. NUL characters (via
 * \u0000) are refused: names and metadata are C strings everywhere else. */
static int jp_string(struct jp *p, char **out, size_t *outlen, size_t maxlen)
{
	struct ms_buf b;
	int rc;

	*out = NULL;
	jp_ws(p);
	if (p->i >= p->n || p->s[p->i] != '"')
		return jp_fail(p, "expected a string");
	p->i++;
	ms_buf_init(&b);
	for (;;) {
		uint8_t c;

		if (p->i >= p->n) {
			rc = jp_fail(p, "unterminated string");
			goto out;
		}
		c = p->s[p->i++];
		if (c == '"')
			break;
		if (c < 0x20) {
			rc = jp_fail(p, "control character in string");
			goto out;
		}
		if (c != '\\') {
			ms_buf_append(&b, &c, 1);
		} else {
			uint32_t cp;
			char enc[4];
			int len;

			if (p->i >= p->n) {
				rc = jp_fail(p, "unterminated escape");
				goto out;
			}
			c = p->s[p->i++];
			switch (c) {
			case '"': case '\\': case '/': ms_buf_append(&b, &c, 1); continue;
			case 'b': ms_buf_append(&b, "\b", 1); continue;
			case 'f': ms_buf_append(&b, "\f", 1); continue;
			case 'n': ms_buf_append(&b, "\n", 1); continue;
			case 'r': ms_buf_append(&b, "\r", 1); continue;
			case 't': ms_buf_append(&b, "\t", 1); continue;
			case 'u': break;
			default:
				rc = jp_fail(p, "invalid escape in string");
				goto out;
			}
			if (p->i + 4 > p->n || hex4(p->s + p->i, &cp)) {
				rc = jp_fail(p, "invalid \\u escape");
				goto out;
			}
			p->i += 4;
			if (cp >= 0xd800 && cp <= 0xdbff) {
				uint32_t lo;

				if (p->i + 6 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' ||
				    hex4(p->s + p->i + 2, &lo) || lo < 0xdc00 || lo > 0xdfff) {
					rc = jp_fail(p, "unpaired surrogate in \\u escape");
					goto out;
				}
				p->i += 6;
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			} else if (cp >= 0xdc00 && cp <= 0xdfff) {
				rc = jp_fail(p, "unpaired surrogate in \\u escape");
				goto out;
			}
			if (cp == 0) {
				rc = jp_fail(p, "NUL character in string");
				goto out;
			}
			if (cp < 0x80) {
				enc[0] = (char)cp;
				len = 1;
			} else if (cp < 0x800) {
				enc[0] = (char)(0xc0 | cp >> 6);
				enc[1] = (char)(0x80 | (cp & 63));
				len = 2;
			} else if (cp < 0x10000) {
				enc[0] = (char)(0xe0 | cp >> 12);
				enc[1] = (char)(0x80 | (cp >> 6 & 63));
				enc[2] = (char)(0x80 | (cp & 63));
				len = 3;
			} else {
				enc[0] = (char)(0xf0 | cp >> 18);
				enc[1] = (char)(0x80 | (cp >> 12 & 63));
				enc[2] = (char)(0x80 | (cp >> 6 & 63));
				enc[3] = (char)(0x80 | (cp & 63));
				len = 4;
			}
			ms_buf_append(&b, enc, (size_t)len);
		}
		if (b.len > maxlen) {
			rc = jp_fail(p, "string too long");
			goto out;
		}
	}
	if (b.oom) {
		rc = ms_err_set(p->err, MS_ENOMEM, "out of memory");
		goto out;
	}
	if (outlen)
		*outlen = b.len;
	*out = ms_buf_detach(&b, NULL);
	if (!*out)
		return ms_err_set(p->err, MS_ENOMEM, "out of memory");
	return MS_OK;
out:
	ms_buf_release(&b);
	return rc;
}

/* A non-negative JSON integer that fits u64: digits only, no leading zero,
 * no sign, fraction or exponent. */
static int jp_u64(struct jp *p, uint64_t *out, const char *what)
{
	uint64_t v = 0;
	size_t start;

	jp_ws(p);
	start = p->i;
	if (p->i < p->n && p->s[p->i] == '-')
		return jp_fail(p, what[0] == 's' ? "negative shape entry" : "negative offset");
	while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
		if (ms_mul_u64(v, 10, &v) || ms_add_u64(v, (uint64_t)(p->s[p->i] - '0'), &v))
			return jp_fail(p, what[0] == 's' ? "shape entry overflows u64"
							 : "offset overflows u64");
		p->i++;
	}
	if (p->i == start)
		return jp_fail(p, what[0] == 's' ? "shape entry is not an integer"
						 : "offset is not an integer");
	if (p->i - start > 1 && p->s[start] == '0')
		return jp_fail(p, "integer with leading zero");
	if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))
		return jp_fail(p, what[0] == 's' ? "shape entry is not an integer"
						 : "offset is not an integer");
	*out = v;
	return MS_OK;
}

/* Consume a run of decimal digits; returns how many. */
static size_t jp_digits(struct jp *p)
{
	size_t start = p->i;

	while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
		p->i++;
	return p->i - start;
}

/* Skip any JSON value (for unknown fields), bounded in depth. */
static int jp_skip(struct jp *p, int depth)
{
	jp_ws(p);
	if (depth > MS_ST_MAX_DEPTH)
		return jp_fail(p, "nesting too deep");
	if (p->i >= p->n)
		return jp_fail(p, "unexpected end of header");
	switch (p->s[p->i]) {
	case '"': {
		char *s;
		int rc = jp_string(p, &s, NULL, MS_ST_MAX_HEADER);

		ms_free(s);
		return rc;
	}
	case '{': case '[': {
		char close = p->s[p->i] == '{' ? '}' : ']';
		int obj = close == '}', first = 1, rc;

		p->i++;
		for (;;) {
			jp_ws(p);
			if (p->i < p->n && p->s[p->i] == (uint8_t)close && first) {
				p->i++;
				return MS_OK;
			}
			if (obj) {
				char *k;

				if ((rc = jp_string(p, &k, NULL, MS_ST_MAX_HEADER)) != MS_OK)
					return rc;
				ms_free(k);
				if ((rc = jp_expect(p, ':', "expected ':'")) != MS_OK)
					return rc;
			}
			if ((rc = jp_skip(p, depth + 1)) != MS_OK)
				return rc;
			first = 0;
			jp_ws(p);
			if (p->i < p->n && p->s[p->i] == ',') {
				p->i++;
				continue;
			}
			return jp_expect(p, close, obj ? "expected ',' or '}'" : "expected ',' or ']'");
		}
	}
	default: {
		size_t start;
		static const char *const lits[] = {"true", "false", "null"};

		for (int k = 0; k < 3; k++) {
			size_t l = strlen(lits[k]);

			if (p->n - p->i >= l && !memcmp(p->s + p->i, lits[k], l)) {
				p->i += l;
				return MS_OK;
			}
		}
		/* a number as JSON defines it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
		 * (NUL and stray signs are not part of one) */
		if (p->s[p->i] == '-')
			p->i++;
		start = p->i;
		if (jp_digits(p) == 0 || (p->i - start > 1 && p->s[start] == '0'))
			return jp_fail(p, "invalid JSON value");
		if (p->i < p->n && p->s[p->i] == '.') {
			p->i++;
			if (jp_digits(p) == 0)
				return jp_fail(p, "invalid JSON value");
		}
		if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
			p->i++;
			if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
				p->i++;
			if (jp_digits(p) == 0)
				return jp_fail(p, "invalid JSON value");
		}
		return MS_OK;
	}
	}
}

static int cmp_offset(const void *a, const void *b)
{
	const struct ms_tensor *x = a, *y = b;

	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	if (x->nbytes != y->nbytes)
		return x->nbytes < y->nbytes ? -1 : 1;
	return 0;
}

static int cmp_name_ptr(const void *a, const void *b)
{
	const struct ms_tensor *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

static int cmp_meta(const void *a, const void *b)
{
	const struct ms_st_meta *x = a, *y = b;

	return strcmp(x->key, y->key);
}

/* One tensor entry: {"dtype": ..., "shape": [...], "data_offsets": [b, e]} */
static int parse_tensor(struct jp *p, struct ms_tensor *t, uint64_t *begin,
			uint64_t *end)
{
	int have_dtype = 0, have_shape = 0, have_off = 0, rc;

	if ((rc = jp_expect(p, '{', "tensor entry is not an object")) != MS_OK)
		return rc;
	jp_ws(p);
	if (p->i < p->n && p->s[p->i] == '}')
		return jp_fail(p, "tensor entry is empty");
	for (;;) {
		char *key;

		if ((rc = jp_string(p, &key, NULL, 64)) != MS_OK)
			return rc;
		if ((rc = jp_expect(p, ':', "expected ':'")) != MS_OK) {
			ms_free(key);
			return rc;
		}
		if (!strcmp(key, "dtype")) {
			char *v;
			size_t vl;

			ms_free(key);
			if (have_dtype++)
				return jp_fail(p, "duplicate key 'dtype'");
			if ((rc = jp_string(p, &v, &vl, 64)) != MS_OK)
				return rc;
			rc = ms_dtype_parse(v, vl, &t->dtype);
			if (rc != MS_OK) {
				rc = ms_err_set(p->err, MS_EINVAL,
						"'%s': invalid header: unknown dtype '%s' (at byte %zu)",
						p->label, v, p->i + 8);
				ms_free(v);
				return rc;
			}
			ms_free(v);
		} else if (!strcmp(key, "shape")) {
			ms_free(key);
			if (have_shape++)
				return jp_fail(p, "duplicate key 'shape'");
			if ((rc = jp_expect(p, '[', "shape is not an array")) != MS_OK)
				return rc;
			jp_ws(p);
			if (p->i < p->n && p->s[p->i] == ']') {
				p->i++;
			} else {
				for (;;) {
					if (t->ndim >= MS_ST_MAX_RANK)
						return jp_fail(p, "rank exceeds the limit of 8");
					if ((rc = jp_u64(p, &t->shape[t->ndim++], "shape")) != MS_OK)
						return rc;
					jp_ws(p);
					if (p->i < p->n && p->s[p->i] == ',') {
						p->i++;
						continue;
					}
					if ((rc = jp_expect(p, ']', "expected ',' or ']' in shape")) != MS_OK)
						return rc;
					break;
				}
			}
		} else if (!strcmp(key, "data_offsets")) {
			ms_free(key);
			if (have_off++)
				return jp_fail(p, "duplicate key 'data_offsets'");
			if ((rc = jp_expect(p, '[', "data_offsets is not an array")) != MS_OK ||
			    (rc = jp_u64(p, begin, "offset")) != MS_OK ||
			    (rc = jp_expect(p, ',', "data_offsets needs two entries")) != MS_OK ||
			    (rc = jp_u64(p, end, "offset")) != MS_OK ||
			    (rc = jp_expect(p, ']', "data_offsets needs exactly two entries")) != MS_OK)
				return rc;
		} else {
			ms_free(key);
			/* unknown fields are tolerated (as the reference reader does) */
			if ((rc = jp_skip(p, 3)) != MS_OK)
				return rc;
		}
		jp_ws(p);
		if (p->i < p->n && p->s[p->i] == ',') {
			p->i++;
			continue;
		}
		if ((rc = jp_expect(p, '}', "expected ',' or '}' in tensor entry")) != MS_OK)
			return rc;
		break;
	}
	if (!have_dtype)
		return jp_fail(p, "tensor entry without 'dtype'");
	if (!have_shape)
		return jp_fail(p, "tensor entry without 'shape'");
	if (!have_off)
		return jp_fail(p, "tensor entry without 'data_offsets'");
	return MS_OK;
}

static int parse_meta(struct jp *p, struct ms_st_file *f)
{
	size_t cap = 0;
	int rc;

	if ((rc = jp_expect(p, '{', "__metadata__ is not an object")) != MS_OK)
		return rc;
	jp_ws(p);
	if (p->i < p->n && p->s[p->i] == '}') {
		p->i++;
		return MS_OK;
	}
	for (;;) {
		struct ms_st_meta m = {NULL, NULL};

		if ((rc = jp_string(p, &m.key, NULL, MS_ST_MAX_HEADER)) != MS_OK)
			return rc;
		if ((rc = jp_expect(p, ':', "expected ':'")) != MS_OK) {
			ms_free(m.key);
			return rc;
		}
		jp_ws(p);
		if (p->i >= p->n || p->s[p->i] != '"') {
			ms_free(m.key);
			return jp_fail(p, "__metadata__ value is not a string");
		}
		if ((rc = jp_string(p, &m.value, NULL, MS_ST_MAX_HEADER)) != MS_OK) {
			ms_free(m.key);
			return rc;
		}
		if (f->nmeta == cap) {
			size_t nc = cap ? cap * 2 : 8;
			struct ms_st_meta *nm = ms_realloc(f->meta, nc * sizeof(*nm));

			if (!nm) {
				ms_free(m.key);
				ms_free(m.value);
				return ms_err_set(p->err, MS_ENOMEM, "out of memory");
			}
			f->meta = nm;
			cap = nc;
		}
		f->meta[f->nmeta++] = m;
		jp_ws(p);
		if (p->i < p->n && p->s[p->i] == ',') {
			p->i++;
			continue;
		}
		return jp_expect(p, '}', "expected ',' or '}' in __metadata__");
	}
}

static int parse_header(struct ms_st_file *f, const uint8_t *hdr, size_t n,
			uint64_t data_size, const char *label, struct ms_err *err)
{
	struct jp p = {hdr, n, 0, label, err};
	size_t cap = 0, bad;
	uint64_t *ends = NULL;
	int have_meta = 0, rc;

	if (utf8_valid(hdr, n, &bad)) {
		p.i = bad;
		return jp_fail(&p, "header is not valid UTF-8");
	}
	if ((rc = jp_expect(&p, '{', "header is not a JSON object")) != MS_OK)
		return rc;
	jp_ws(&p);
	if (p.i < p.n && p.s[p.i] == '}') {
		p.i++;
	} else {
		for (;;) {
			char *key;
			size_t klen;
			struct ms_tensor *t;
			uint64_t b = 0, e = 0;

			if ((rc = jp_string(&p, &key, &klen, MS_ST_MAX_NAME)) != MS_OK) {
				if (rc == MS_EINVAL && err && strstr(err->msg, "string too long"))
					rc = jp_fail(&p, "tensor name longer than 1024 bytes");
				goto out;
			}
			if ((rc = jp_expect(&p, ':', "expected ':'")) != MS_OK) {
				ms_free(key);
				goto out;
			}
			if (!strcmp(key, "__metadata__")) {
				ms_free(key);
				if (have_meta++) {
					rc = jp_fail(&p, "duplicate key '__metadata__'");
					goto out;
				}
				if ((rc = parse_meta(&p, f)) != MS_OK)
					goto out;
			} else {
				if (klen == 0) {
					ms_free(key);
					rc = jp_fail(&p, "empty tensor name");
					goto out;
				}
				if (f->ntensors >= MS_ST_MAX_TENSORS) {
					ms_free(key);
					rc = jp_fail(&p, "more than 1000000 tensors");
					goto out;
				}
				if (f->ntensors == cap) {
					size_t nc = cap ? cap * 2 : 64;
					struct ms_tensor *nt = ms_realloc(f->tensors, nc * sizeof(*nt));
					uint64_t *ne = ms_realloc(ends, nc * sizeof(*ne));

					if (nt)
						f->tensors = nt;
					if (ne)
						ends = ne;
					if (!nt || !ne) {
						ms_free(key);
						rc = ms_err_nomem(err);
						goto out;
					}
					cap = nc;
				}
				t = &f->tensors[f->ntensors];
				memset(t, 0, sizeof(*t));
				t->name = key;
				f->ntensors++;
				if ((rc = parse_tensor(&p, t, &b, &e)) != MS_OK) {
					ms_err_prefix(err, "tensor '%s'", key);
					goto out;
				}
				t->offset = b;
				ends[f->ntensors - 1] = e;
			}
			jp_ws(&p);
			if (p.i < p.n && p.s[p.i] == ',') {
				p.i++;
				continue;
			}
			if ((rc = jp_expect(&p, '}', "expected ',' or '}'")) != MS_OK)
				goto out;
			break;
		}
	}
	jp_ws(&p);
	if (p.i != p.n) {
		rc = jp_fail(&p, "trailing bytes after the JSON object");
		goto out;
	}

	/* sizes: element count and byte size without overflow; end - begin */
	for (size_t i = 0; i < f->ntensors; i++) {
		struct ms_tensor *t = &f->tensors[i];
		uint64_t ne = 1, nb;

		for (uint32_t d = 0; d < t->ndim; d++) {
			if (ms_mul_u64(ne, t->shape[d], &ne)) {
				rc = ms_err_set(err, MS_EINVAL,
						"'%s': tensor '%s': element count overflows u64",
						label, t->name);
				goto out;
			}
		}
		t->nelem = ne;
		if (ms_dtype_nbytes(t->dtype, ne, &nb)) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': tensor '%s': %s byte size %s", label, t->name,
					ms_dtype_name(t->dtype),
					ms_dtype_bits(t->dtype) % 8 ? "is not a whole number of bytes"
								    : "overflows u64");
			goto out;
		}
		if (ends[i] < t->offset) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': tensor '%s': data_offsets end %llu before begin %llu",
					label, t->name, (unsigned long long)ends[i],
					(unsigned long long)t->offset);
			goto out;
		}
		if (ends[i] - t->offset != nb) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': tensor '%s': data_offsets span %llu bytes but dtype %s and shape need %llu",
					label, t->name, (unsigned long long)(ends[i] - t->offset),
					ms_dtype_name(t->dtype), (unsigned long long)nb);
			goto out;
		}
		t->nbytes = nb;
	}

	/* names unique */
	f->by_name = ms_malloc((f->ntensors ? f->ntensors : 1) * sizeof(*f->by_name));
	if (!f->by_name) {
		rc = ms_err_nomem(err);
		goto out;
	}

	/* layout: sorted by offset, contiguous from 0 to the end of the file
	 * (a header without tensors has no array: qsort(NULL, 0) is undefined) */
	if (f->ntensors)
		qsort(f->tensors, f->ntensors, sizeof(*f->tensors), cmp_offset);
	{
		uint64_t pos = 0;

		for (size_t i = 0; i < f->ntensors; i++) {
			struct ms_tensor *t = &f->tensors[i];

			if (t->offset != pos) {
				rc = ms_err_set(err, MS_EINVAL,
						t->offset < pos
							? "'%s': tensor '%s': data overlaps the previous tensor (begins at %llu, previous ends at %llu)"
							: "'%s': tensor '%s': hole in the data buffer (begins at %llu, previous ends at %llu)",
						label, t->name, (unsigned long long)t->offset,
						(unsigned long long)pos);
				goto out;
			}
			pos += t->nbytes;
		}
		if (pos != data_size) {
			rc = ms_err_set(err, MS_EINVAL,
					pos < data_size
						? "'%s': %llu trailing bytes after the last tensor"
						: "'%s': tensor data extends %llu bytes past the end of the file",
					label,
					(unsigned long long)(pos < data_size ? data_size - pos
									     : pos - data_size));
			goto out;
		}
	}
	for (size_t i = 0; i < f->ntensors; i++)
		f->by_name[i] = &f->tensors[i];
	qsort(f->by_name, f->ntensors, sizeof(*f->by_name), cmp_name_ptr);
	for (size_t i = 1; i < f->ntensors; i++) {
		if (!strcmp(f->by_name[i - 1]->name, f->by_name[i]->name)) {
			rc = ms_err_set(err, MS_EINVAL, "'%s': invalid header: duplicate tensor name '%s'",
					label, f->by_name[i]->name);
			goto out;
		}
	}
	if (f->nmeta > 1) {
		struct ms_st_meta *sorted = ms_malloc(f->nmeta * sizeof(*sorted));

		if (!sorted) {
			rc = ms_err_nomem(err);
			goto out;
		}
		memcpy(sorted, f->meta, f->nmeta * sizeof(*sorted));
		qsort(sorted, f->nmeta, sizeof(*sorted), cmp_meta);
		for (size_t i = 1; i < f->nmeta; i++) {
			if (!strcmp(sorted[i - 1].key, sorted[i].key)) {
				rc = ms_err_set(err, MS_EINVAL,
						"'%s': invalid header: duplicate __metadata__ key '%s'",
						label, sorted[i].key);
				ms_free(sorted);
				goto out;
			}
		}
		ms_free(sorted);
	}
	rc = MS_OK;
out:
	ms_free(ends);
	return rc;
}

static void st_free(struct ms_st_file *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->ntensors; i++)
		ms_free((char *)f->tensors[i].name);
	ms_free(f->tensors);
	ms_free(f->by_name);
	for (size_t i = 0; i < f->nmeta; i++) {
		ms_free(f->meta[i].key);
		ms_free(f->meta[i].value);
	}
	ms_free(f->meta);
	if (f->mapped && f->map)
		munmap((void *)f->map, f->size);
	ms_free(f->path);
	ms_free(f->blob_digest);
	ms_free(f);
}

void ms_st_close(struct ms_st_file *f)
{
	st_free(f);
}

int ms_st_parse(const uint8_t *buf, uint64_t size, const char *label,
		struct ms_st_file **out, struct ms_err *err)
{
	struct ms_st_file *f;
	uint64_t n, hdr_end;
	int rc;

	*out = NULL;
	if (size < 8)
		return ms_err_set(err, MS_EINVAL,
				  "'%s': file is %llu bytes, shorter than the 8-byte header length",
				  label, (unsigned long long)size);
	n = (uint64_t)buf[0] | (uint64_t)buf[1] << 8 | (uint64_t)buf[2] << 16 |
	    (uint64_t)buf[3] << 24 | (uint64_t)buf[4] << 32 | (uint64_t)buf[5] << 40 |
	    (uint64_t)buf[6] << 48 | (uint64_t)buf[7] << 56;
	if (n > MS_ST_MAX_HEADER)
		return ms_err_set(err, MS_EINVAL,
				  "'%s': header length %llu exceeds the limit of 100000000 bytes",
				  label, (unsigned long long)n);
	if (n < 2)
		return ms_err_set(err, MS_EINVAL, "'%s': header length %llu is too small for a JSON object",
				  label, (unsigned long long)n);
	if (ms_add_u64(n, 8, &hdr_end) || hdr_end > size)
		return ms_err_set(err, MS_EINVAL,
				  "'%s': header length %llu runs past the end of the file (%llu bytes)",
				  label, (unsigned long long)n, (unsigned long long)size);
	f = ms_calloc(1, sizeof(*f));
	if (!f)
		return ms_err_nomem(err);
	f->path = ms_strdup(label);
	if (!f->path) {
		rc = ms_err_nomem(err);
		goto out;
	}
	f->map = buf;
	f->size = size;
	f->header_len = n;
	if ((rc = parse_header(f, buf + 8, (size_t)n, size - hdr_end, label, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < f->ntensors; i++) {
		f->tensors[i].offset += hdr_end;
		f->tensors[i].data = buf + f->tensors[i].offset;
		f->tensors[i].file = f;
	}
	*out = f;
	return MS_OK;
out:
	st_free(f);
	return rc;
}

int ms_st_open(const char *path, struct ms_st_file **out, struct ms_err *err)
{
	struct stat st;
	struct ms_st_file *f = NULL;
	void *map = NULL;
	int fd, rc;

	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ms_err_set(err, errno == ENOENT ? MS_ENOTFOUND : MS_EIO,
				  "'%s': cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st)) {
		rc = ms_err_set(err, MS_EIO, "'%s': cannot stat: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': not a regular file", path);
		goto out;
	}
	if (st.st_size > 0) {
		map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (map == MAP_FAILED) {
			rc = ms_err_set(err, MS_EIO, "'%s': cannot map: %s", path, strerror(errno));
			map = NULL;
			goto out;
		}
	}
	rc = ms_st_parse(map ? map : (const uint8_t *)"", (uint64_t)st.st_size, path, &f, err);
	if (rc != MS_OK)
		goto out;
	f->mapped = map != NULL;
	if (!map)
		f->map = NULL;
	map = NULL;
	f->dev = (uint64_t)st.st_dev;
	f->ino = (uint64_t)st.st_ino;
	f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	f->ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
	/* A Hugging Face cache snapshot links to blobs/<sha256 of the file>. */
	{
		char target[4096];
		ssize_t l = readlink(path, target, sizeof(target) - 1);

		if (l > 0) {
			const char *base;
			uint8_t tmp[32];

			target[l] = 0;
			base = ms_path_base(target);
			if (strstr(target, "blobs/") && strlen(base) == 64 && !ms_unhex(base, tmp, 32)) {
				f->blob_digest = ms_strdup(base);
				if (!f->blob_digest) {
					rc = ms_err_nomem(err);
					goto out;
				}
			}
		}
	}
	madvise((void *)f->map, f->size, MADV_SEQUENTIAL);
	*out = f;
	f = NULL;
out:
	if (map)
		munmap(map, (size_t)st.st_size);
	st_free(f);
	close(fd);
	return rc;
}

const struct ms_tensor *ms_st_find(const struct ms_st_file *f, const char *name)
{
	size_t lo = 0, hi = f->ntensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(f->by_name[mid]->name, name);

		if (c == 0)
			return f->by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const char *ms_st_meta_get(const struct ms_st_file *f, const char *key)
{
	for (size_t i = 0; i < f->nmeta; i++)
		if (!strcmp(f->meta[i].key, key))
			return f->meta[i].value;
	return NULL;
}

/* ---- writer -------------------------------------------------------------- */

struct wtensor {
	char *name;
	enum ms_dtype dtype;
	uint32_t ndim;
	uint64_t shape[MS_ST_MAX_RANK];
	uint64_t nbytes;
	const void *data; /* borrowed, for ms_st_writer_add */
	uint8_t digest[MS_SHA256_LEN];
};

struct ms_st_writer {
	struct ms_afile af;
	int force;
	int header_done;
	int committed;
	size_t n, cap;
	struct wtensor *t;
	size_t nmeta;
	struct ms_st_meta *meta;
	size_t cur;        /* tensor whose bytes are being written */
	uint64_t cur_pos;  /* bytes of it written so far */
	struct ms_sha256_ctx *sha;
};

int ms_st_writer_new(const char *path, int force, struct ms_st_writer **out,
		     struct ms_err *err)
{
	struct ms_st_writer *w = ms_calloc(1, sizeof(*w));
	int rc;

	*out = NULL;
	if (!w)
		return ms_err_nomem(err);
	w->force = force;
	if ((rc = ms_afile_open(&w->af, path, force, err)) != MS_OK) {
		ms_free(w);
		return rc;
	}
	*out = w;
	return MS_OK;
}

int ms_st_writer_meta(struct ms_st_writer *w, const char *key, const char *value,
		      struct ms_err *err)
{
	struct ms_st_meta *nm;
	size_t bad;

	if (w->header_done)
		return ms_err_set(err, MS_EINVAL, "metadata added after data");
	/* the header must stay valid UTF-8, or our own reader refuses it */
	if (utf8_valid((const uint8_t *)key, strlen(key), &bad) ||
	    utf8_valid((const uint8_t *)value, strlen(value), &bad))
		return ms_err_set(err, MS_EINVAL, "metadata '%s' is not valid UTF-8", key);
	for (size_t i = 0; i < w->nmeta; i++)
		if (!strcmp(w->meta[i].key, key))
			return ms_err_set(err, MS_EINVAL, "duplicate metadata key '%s'", key);
	nm = ms_realloc(w->meta, (w->nmeta + 1) * sizeof(*nm));
	if (!nm)
		return ms_err_nomem(err);
	w->meta = nm;
	nm[w->nmeta].key = ms_strdup(key);
	nm[w->nmeta].value = ms_strdup(value);
	if (!nm[w->nmeta].key || !nm[w->nmeta].value) {
		ms_free(nm[w->nmeta].key);
		ms_free(nm[w->nmeta].value);
		return ms_err_nomem(err);
	}
	w->nmeta++;
	return MS_OK;
}

static int declare(struct ms_st_writer *w, const char *name, enum ms_dtype dt,
		   uint32_t ndim, const uint64_t *shape, const void *data,
		   struct ms_err *err)
{
	struct wtensor *t;
	uint64_t ne = 1;
	size_t bad;

	if (w->header_done)
		return ms_err_set(err, MS_EINVAL, "tensor '%s' declared after data", name);
	if (!*name || strlen(name) > MS_ST_MAX_NAME || !strcmp(name, "__metadata__") ||
	    utf8_valid((const uint8_t *)name, strlen(name), &bad))
		return ms_err_set(err, MS_EINVAL, "invalid tensor name '%s'", name);
	if (ndim > MS_ST_MAX_RANK || !ms_dtype_name(dt))
		return ms_err_set(err, MS_EINVAL, "tensor '%s': invalid rank or dtype", name);
	for (size_t i = 0; i < w->n; i++)
		if (!strcmp(w->t[i].name, name))
			return ms_err_set(err, MS_EINVAL, "duplicate tensor name '%s'", name);
	if (w->n == w->cap) {
		size_t nc = w->cap ? w->cap * 2 : 32;
		struct wtensor *nt = ms_realloc(w->t, nc * sizeof(*nt));

		if (!nt)
			return ms_err_nomem(err);
		w->t = nt;
		w->cap = nc;
	}
	t = &w->t[w->n];
	memset(t, 0, sizeof(*t));
	for (uint32_t d = 0; d < ndim; d++) {
		if (ms_mul_u64(ne, shape[d], &ne))
			return ms_err_set(err, MS_EINVAL, "tensor '%s': element count overflows", name);
		t->shape[d] = shape[d];
	}
	if (ms_dtype_nbytes(dt, ne, &t->nbytes))
		return ms_err_set(err, MS_EINVAL, "tensor '%s': size is not whole bytes", name);
	t->name = ms_strdup(name);
	if (!t->name)
		return ms_err_nomem(err);
	t->dtype = dt;
	t->ndim = ndim;
	t->data = data;
	w->n++;
	return MS_OK;
}

int ms_st_writer_declare(struct ms_st_writer *w, const char *name, enum ms_dtype dt,
			 uint32_t ndim, const uint64_t *shape, struct ms_err *err)
{
	return declare(w, name, dt, ndim, shape, NULL, err);
}

int ms_st_writer_add(struct ms_st_writer *w, const char *name, enum ms_dtype dt,
		     uint32_t ndim, const uint64_t *shape, const void *data,
		     struct ms_err *err)
{
	return declare(w, name, dt, ndim, shape, data ? data : "", err);
}

static void json_str(struct ms_buf *b, const char *s)
{
	ms_buf_append(b, "\"", 1);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\') {
			ms_buf_append(b, "\\", 1);
			ms_buf_append(b, p, 1);
		} else if (*p < 0x20) {
			ms_buf_printf(b, "\\u%04x", *p);
		} else {
			ms_buf_append(b, p, 1);
		}
	}
	ms_buf_append(b, "\"", 1);
}

static int write_header(struct ms_st_writer *w, struct ms_err *err)
{
	struct ms_buf b;
	uint64_t off = 0, n;
	uint8_t len8[8];
	int rc;

	ms_buf_init(&b);
	ms_buf_puts(&b, "{");
	if (w->nmeta) {
		ms_buf_puts(&b, "\"__metadata__\":{");
		for (size_t i = 0; i < w->nmeta; i++) {
			if (i)
				ms_buf_puts(&b, ",");
			json_str(&b, w->meta[i].key);
			ms_buf_puts(&b, ":");
			json_str(&b, w->meta[i].value);
		}
		ms_buf_puts(&b, "}");
	}
	for (size_t i = 0; i < w->n; i++) {
		struct wtensor *t = &w->t[i];

		if (i || w->nmeta)
			ms_buf_puts(&b, ",");
		json_str(&b, t->name);
		ms_buf_printf(&b, ":{\"dtype\":\"%s\",\"shape\":[", ms_dtype_name(t->dtype));
		for (uint32_t d = 0; d < t->ndim; d++)
			ms_buf_printf(&b, d ? ",%llu" : "%llu", (unsigned long long)t->shape[d]);
		ms_buf_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
			      (unsigned long long)(off + t->nbytes));
		off += t->nbytes;
	}
	ms_buf_puts(&b, "}");
	/* an append that failed leaves len as it was: stop on oom */
	while (b.len % 8 && !b.oom)
		ms_buf_puts(&b, " ");
	if (b.oom) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (b.len > MS_ST_MAX_HEADER) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': header would exceed 100000000 bytes",
				w->af.path);
		goto out;
	}
	n = b.len;
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)(n >> (8 * i));
	if ((rc = ms_afile_write(&w->af, len8, 8, err)) != MS_OK)
		goto out;
	rc = ms_afile_write(&w->af, b.data, b.len, err);
	w->header_done = 1;
out:
	ms_buf_release(&b);
	return rc;
}

/* Write bytes into the current tensor; advances across tensor boundaries and
 * writes borrowed tensors (ms_st_writer_add) when their turn comes. */
static int put(struct ms_st_writer *w, const uint8_t *p, size_t n, int from_user,
	       struct ms_err *err);

static int finish_tensor(struct ms_st_writer *w, struct ms_err *err)
{
	int rc;

	if (!w->sha)
		return MS_OK;
	rc = ms_sha256_final(w->sha, w->t[w->cur].digest);
	ms_sha256_free(w->sha);
	w->sha = NULL;
	if (rc != MS_OK)
		return ms_err_set(err, rc, "sha256 failed");
	w->cur++;
	w->cur_pos = 0;
	return MS_OK;
}

static int advance(struct ms_st_writer *w, struct ms_err *err)
{
	int rc;

	for (;;) {
		struct wtensor *t;

		if (w->cur >= w->n)
			return MS_OK;
		t = &w->t[w->cur];
		if (!w->sha) {
			w->sha = ms_sha256_new();
			if (!w->sha)
				return ms_err_nomem(err);
		}
		if (w->cur_pos == t->nbytes) {
			if ((rc = finish_tensor(w, err)) != MS_OK)
				return rc;
			continue;
		}
		if (!t->data)
			return MS_OK;
		if ((rc = put(w, t->data, t->nbytes, 0, err)) != MS_OK)
			return rc;
	}
}

static int put(struct ms_st_writer *w, const uint8_t *p, size_t n, int from_user,
	       struct ms_err *err)
{
	int rc;

	while (n) {
		struct wtensor *t;
		uint64_t room;
		size_t k;

		if (from_user && (rc = advance(w, err)) != MS_OK)
			return rc;
		if (w->cur >= w->n)
			return ms_err_set(err, MS_EINVAL, "'%s': more data than the declared tensors hold",
					  w->af.path);
		t = &w->t[w->cur];
		room = t->nbytes - w->cur_pos;
		k = n < room ? n : (size_t)room;
		if ((rc = ms_afile_write(&w->af, p, k, err)) != MS_OK)
			return rc;
		if ((rc = ms_sha256_update(w->sha, p, k)) != MS_OK)
			return ms_err_set(err, rc, "sha256 failed");
		w->cur_pos += k;
		p += k;
		n -= k;
		if (w->cur_pos == t->nbytes && !from_user)
			return finish_tensor(w, err);
	}
	return MS_OK;
}

int ms_st_writer_data(struct ms_st_writer *w, const void *p, size_t n,
		      struct ms_err *err)
{
	int rc;

	if (!w->header_done && (rc = write_header(w, err)) != MS_OK)
		return rc;
	return put(w, p, n, 1, err);
}

int ms_st_writer_commit(struct ms_st_writer *w, struct ms_err *err)
{
	int rc;

	if (!w->header_done && (rc = write_header(w, err)) != MS_OK)
		return rc;
	if ((rc = advance(w, err)) != MS_OK)
		return rc;
	if (w->cur != w->n)
		return ms_err_set(err, MS_EINVAL,
				  "'%s': tensor '%s' is missing %llu bytes of data", w->af.path,
				  w->t[w->cur].name,
				  (unsigned long long)(w->t[w->cur].nbytes - w->cur_pos));
	if ((rc = ms_afile_commit(&w->af, w->force, err)) != MS_OK)
		return rc;
	w->committed = 1;
	return MS_OK;
}

const uint8_t *ms_st_writer_digest(const struct ms_st_writer *w, size_t i)
{
	return i < w->cur ? w->t[i].digest : NULL;
}

void ms_st_writer_free(struct ms_st_writer *w)
{
	if (!w)
		return;
	ms_afile_abort(&w->af);
	for (size_t i = 0; i < w->n; i++)
		ms_free(w->t[i].name);
	ms_free(w->t);
	for (size_t i = 0; i < w->nmeta; i++) {
		ms_free(w->meta[i].key);
		ms_free(w->meta[i].value);
	}
	ms_free(w->meta);
	ms_sha256_free(w->sha);
	ms_free(w);
}

void ms_st_file_info(const struct ms_st_file *f, struct ms_st_file_info *out)
{
	out->path = f->path;
	out->size = f->size;
	out->header_len = f->header_len;
	out->ntensors = f->ntensors;
	out->nmeta = f->nmeta;
	out->meta = f->meta;
	out->header_digest = f->header_digest;
	out->file_digest = f->file_digest;
}
