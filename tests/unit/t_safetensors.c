/*
 * t_safetensors.c: the strict reader and the writer.
 *
 * - every dtype of the format: names, widths, byte sizes, decoding against
 *   an independent decoder and fixed anchor values;
 * - the bundled fixtures (written by the Python safetensors library) decode
 *   to the values in tests/fixtures/dtypes/truth.json;
 * - every validation rule, on images built here byte by byte, each giving
 *   its own one-line error naming the file;
 * - writer round trips for every dtype. With MS_ST_WRITE_DIR set, the
 *   round-trip files are kept there so tests/script/inspect_cli.sh can load
 *   them with the Python safetensors package.
 */
#include <math.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "test.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* A file image: u64 length, header padded with spaces to 8, then ndata
 * bytes (pattern, so a wrong offset reads wrong values). */
static int no_pad; /* set to make the header end at its last character */

static uint8_t *image(const char *hdr, uint64_t ndata, uint64_t *size)
{
	size_t n = strlen(hdr), padded = no_pad ? n : (n + 7) / 8 * 8;
	uint8_t *p = malloc(8 + padded + ndata + 1);

	if (!p)
		return NULL;
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)((uint64_t)padded >> (8 * i));
	memcpy(p + 8, hdr, n);
	memset(p + 8 + n, ' ', padded - n);
	for (uint64_t i = 0; i < ndata; i++)
		p[8 + padded + i] = (uint8_t)(i * 7 + 1);
	*size = 8 + padded + ndata;
	return p;
}

/* The image must be refused with MS_EINVAL and a one-line message that
 * names the file and contains frag. */
static int bad(const char *hdr, uint64_t ndata, const char *frag)
{
	uint64_t size;
	uint8_t *p = image(hdr, ndata, &size);
	struct ms_st_file *f = (struct ms_st_file *)1;
	struct ms_err err = {0};
	int rc;

	T_ASSERT(p);
	rc = ms_st_parse(p, size, "bad.safetensors", &f, &err);
	free(p);
	T_ASSERT_MSG(rc == MS_EINVAL, "header %s: rc %d, want refusal '%s'", hdr, rc, frag);
	T_ASSERT(f == NULL);
	T_ASSERT_MSG(strstr(err.msg, frag), "header %s: message '%s' lacks '%s'", hdr, err.msg, frag);
	T_ASSERT_MSG(strstr(err.msg, "'bad.safetensors'"), "message '%s' does not name the file",
		     err.msg);
	T_ASSERT_MSG(!strchr(err.msg, '\n'), "message is not one line: '%s'", err.msg);
	/* the error buffer is optional */
	p = image(hdr, ndata, &size);
	T_ASSERT(p);
	T_ASSERT_EQ_INT(ms_st_parse(p, size, "bad.safetensors", &f, NULL), MS_EINVAL);
	free(p);
	return 0;
}

#define T_BAD(hdr, ndata, frag) T_ASSERT_EQ_INT(bad(hdr, ndata, frag), 0)

static int good(const char *hdr, uint64_t ndata, struct ms_st_file **out, uint8_t **mem)
{
	uint64_t size;
	uint8_t *p = image(hdr, ndata, &size);
	struct ms_err err = {0};
	int rc;

	T_ASSERT(p);
	rc = ms_st_parse(p, size, "good.safetensors", out, &err);
	T_ASSERT_MSG(rc == MS_OK, "header %s: %s", hdr, err.msg);
	*mem = p;
	return 0;
}

/* ---- dtypes --------------------------------------------------------------- */

static const struct {
	const char *name;
	unsigned bits;
} spec_dtypes[] = {
	{"BOOL", 8}, {"F4", 4}, {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8}, {"I8", 8},
	{"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
	{"F8_E5M2FNUZ", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16}, {"BF16", 16},
	{"I32", 32}, {"U32", 32}, {"F32", 32}, {"C64", 64}, {"F64", 64}, {"I64", 64},
	{"U64", 64},
};
#define NSPEC (sizeof(spec_dtypes) / sizeof(spec_dtypes[0]))

static int test_dtype_table(void)
{
	enum ms_dtype dt;

	T_ASSERT_EQ_INT(NSPEC, MS_DTYPE_COUNT);
	for (size_t i = 0; i < NSPEC; i++) {
		const char *s = spec_dtypes[i].name;

		T_ASSERT_MSG(ms_dtype_parse(s, strlen(s), &dt) == MS_OK, "%s", s);
		T_ASSERT_STR(ms_dtype_name(dt), s);
		T_ASSERT_EQ_INT(ms_dtype_bits(dt), spec_dtypes[i].bits);
	}
	T_ASSERT_EQ_INT(ms_dtype_parse("F32xyz", 3, &dt), MS_OK); /* length-bounded */
	T_ASSERT_EQ_INT(dt, MS_DTYPE_F32);
	T_ASSERT_EQ_INT(ms_dtype_parse("F32 ", 4, &dt), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_dtype_parse("F32", 2, &dt), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_dtype_parse("f32", 3, &dt), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_dtype_parse("", 0, &dt), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_dtype_parse("F8_E4M3FNUZX", 12, &dt), MS_EINVAL);
	T_ASSERT(ms_dtype_name(MS_DTYPE_COUNT) == NULL);
	T_ASSERT(ms_dtype_name((enum ms_dtype)-1) == NULL);
	T_ASSERT_EQ_INT(ms_dtype_bits(MS_DTYPE_COUNT), 0);
	return 0;
}

static int test_dtype_nbytes(void)
{
	uint64_t n;

	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_F4, 4, &n), MS_OK);
	T_ASSERT_EQ_INT(n, 2);
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_F4, 3, &n), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_F6_E2M3, 4, &n), MS_OK);
	T_ASSERT_EQ_INT(n, 3);
	for (uint64_t k = 1; k < 4; k++)
		T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_F6_E3M2, k, &n), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_F6_E3M2, 0, &n), MS_OK);
	T_ASSERT_EQ_INT(n, 0);
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_C64, 3, &n), MS_OK);
	T_ASSERT_EQ_INT(n, 24);
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_BOOL, 5, &n), MS_OK);
	T_ASSERT_EQ_INT(n, 5);
	/* the largest counts that still fit, and the first that do not */
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_F64, UINT64_MAX / 8, &n), MS_OK);
	T_ASSERT(n == UINT64_MAX / 8 * 8);
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_F64, UINT64_MAX / 8 + 1, &n), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_C64, UINT64_MAX, &n), MS_EINVAL);
	/* one byte per element never overflows, whatever the bit count says */
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_U8, UINT64_MAX, &n), MS_OK);
	T_ASSERT(n == UINT64_MAX);
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_U16, UINT64_MAX / 2 + 1, &n), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_F4, UINT64_MAX - 1, &n), MS_OK);
	T_ASSERT(n == UINT64_MAX / 2);
	T_ASSERT_EQ_INT(ms_dtype_nbytes(MS_DTYPE_F6_E2M3, UINT64_MAX - 3, &n), MS_OK);
	T_ASSERT(n == (UINT64_MAX - 3) / 4 * 3);
	return 0;
}

/* An independent minifloat reference: sign, exponent field e, mantissa
 * field m; normal (1 + m/2^mb) * 2^(e-bias), subnormal m/2^mb * 2^(1-bias). */
static double ref_mini(unsigned v, int eb, int mb, int bias)
{
	unsigned s = (v >> (eb + mb)) & 1, e = (v >> mb) & ((1u << eb) - 1),
		 m = v & ((1u << mb) - 1);
	double frac = (double)m / (double)(1u << mb);
	double x = e ? (1.0 + frac) * pow(2.0, (double)e - bias) : frac * pow(2.0, 1.0 - bias);

	return s ? -x : x;
}

static int same(double a, double b)
{
	if (isnan(a) || isnan(b))
		return isnan(a) && isnan(b);
	return a == b && signbit(a) == signbit(b);
}

static int test_decode_every_8bit_code(void)
{
	for (unsigned v = 0; v < 256; v++) {
		uint8_t b = (uint8_t)v;
		double x, want;

		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F8_E4M3, &b, 0, &x), MS_OK);
		want = (v & 0x7f) == 0x7f ? NAN : ref_mini(v, 4, 3, 7);
		T_ASSERT_MSG(same(x, want), "E4M3 0x%02x: %g != %g", v, x, want);

		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F8_E5M2, &b, 0, &x), MS_OK);
		if ((v & 0x7c) == 0x7c)
			want = (v & 3) ? NAN : (v & 0x80) ? -INFINITY : INFINITY;
		else
			want = ref_mini(v, 5, 2, 15);
		T_ASSERT_MSG(same(x, want), "E5M2 0x%02x: %g != %g", v, x, want);

		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F8_E8M0, &b, 0, &x), MS_OK);
		want = v == 0xff ? NAN : pow(2.0, (double)v - 127);
		T_ASSERT_MSG(same(x, want), "E8M0 0x%02x: %g != %g", v, x, want);

		/* fnuz: one NaN (0x80, the would-be -0), no infinities */
		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F8_E4M3FNUZ, &b, 0, &x), MS_OK);
		want = v == 0x80 ? NAN : ref_mini(v, 4, 3, 8);
		T_ASSERT_MSG(same(x, want), "E4M3FNUZ 0x%02x: %g != %g", v, x, want);
		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F8_E5M2FNUZ, &b, 0, &x), MS_OK);
		want = v == 0x80 ? NAN : ref_mini(v, 5, 2, 16);
		T_ASSERT_MSG(same(x, want), "E5M2FNUZ 0x%02x: %g != %g", v, x, want);

		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_U8, &b, 0, &x), MS_OK);
		T_ASSERT(x == (double)v);
		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_I8, &b, 0, &x), MS_OK);
		T_ASSERT(x == (double)(v < 128 ? (int)v : (int)v - 256));
		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_BOOL, &b, 0, &x), MS_OK);
		T_ASSERT(x == (v ? 1.0 : 0.0));
	}
	return 0;
}

/* Values every implementation of these formats agrees on. */
static int test_decode_anchor_values(void)
{
	static const struct {
		enum ms_dtype dt;
		uint8_t code;
		double want;
	} anchors[] = {
		{MS_DTYPE_F8_E4M3, 0x7e, 448.0},       {MS_DTYPE_F8_E4M3, 0x01, 0x1p-9},
		{MS_DTYPE_F8_E4M3, 0x38, 1.0},         {MS_DTYPE_F8_E4M3, 0xb8, -1.0},
		{MS_DTYPE_F8_E5M2, 0x7b, 57344.0},     {MS_DTYPE_F8_E5M2, 0x01, 0x1p-16},
		{MS_DTYPE_F8_E5M2, 0x3c, 1.0},         {MS_DTYPE_F8_E8M0, 0x7f, 1.0},
		{MS_DTYPE_F8_E8M0, 0x00, 0x1p-127},    {MS_DTYPE_F8_E8M0, 0xfe, 0x1p127},
		{MS_DTYPE_F8_E4M3FNUZ, 0x7f, 240.0},   {MS_DTYPE_F8_E4M3FNUZ, 0x40, 1.0},
		{MS_DTYPE_F8_E4M3FNUZ, 0x01, 0x1p-10}, {MS_DTYPE_F8_E5M2FNUZ, 0x7f, 57344.0},
		{MS_DTYPE_F8_E5M2FNUZ, 0x40, 1.0},     {MS_DTYPE_F8_E5M2FNUZ, 0x01, 0x1p-17},
	};

	for (size_t i = 0; i < sizeof(anchors) / sizeof(anchors[0]); i++) {
		double x;

		T_ASSERT_EQ_INT(ms_dtype_get_f64(anchors[i].dt, &anchors[i].code, 0, &x), MS_OK);
		T_ASSERT_MSG(x == anchors[i].want, "%s 0x%02x: %g, want %g",
			     ms_dtype_name(anchors[i].dt), anchors[i].code, x, anchors[i].want);
	}
	return 0;
}

/* F4 (E2M1): two per byte, element 2i in the low nibble. */
static int test_decode_f4(void)
{
	static const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

	for (unsigned v = 0; v < 256; v++) {
		uint8_t b = (uint8_t)v;
		double lo, hi;

		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F4, &b, 0, &lo), MS_OK);
		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F4, &b, 1, &hi), MS_OK);
		T_ASSERT(same(lo, (v & 8 ? -1 : 1) * e2m1[v & 7]));
		T_ASSERT(same(hi, (v & 0x80 ? -1 : 1) * e2m1[(v >> 4) & 7]));
	}
	return 0;
}

/* F6: a little-endian bit stream, element i in bits [6i, 6i+6); four
 * elements in three bytes. Every code in every slot. */
static int test_decode_f6(void)
{
	for (int slot = 0; slot < 4; slot++) {
		for (unsigned v = 0; v < 64; v++) {
			uint32_t word = 0x2aaaaa & ~(63u << (6 * slot)); /* other slots busy */
			uint8_t b[3];
			double x;

			word |= v << (6 * slot);
			b[0] = (uint8_t)word;
			b[1] = (uint8_t)(word >> 8);
			b[2] = (uint8_t)(word >> 16);
			T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F6_E2M3, b, (uint64_t)slot, &x), MS_OK);
			T_ASSERT_MSG(same(x, ref_mini(v, 2, 3, 1)), "E2M3 slot %d code %u", slot, v);
			T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F6_E3M2, b, (uint64_t)slot, &x), MS_OK);
			T_ASSERT_MSG(same(x, ref_mini(v, 3, 2, 3)), "E3M2 slot %d code %u", slot, v);
		}
	}
	{
		uint8_t max[3] = {0x1f, 0, 0};
		double x;

		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F6_E2M3, max, 0, &x), MS_OK);
		T_ASSERT(x == 7.5);
		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F6_E3M2, max, 0, &x), MS_OK);
		T_ASSERT(x == 28.0);
	}
	return 0;
}

static int test_decode_wide_types(void)
{
	uint8_t b[8];
	double x;

	/* little-endian in the file, whatever the host */
	memcpy(b, "\x01\x80", 2);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_I16, b, 0, &x), MS_OK);
	T_ASSERT(x == -32767.0);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_U16, b, 0, &x), MS_OK);
	T_ASSERT(x == 32769.0);
	memcpy(b, "\x00\x3c", 2);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F16, b, 0, &x), MS_OK);
	T_ASSERT(x == 1.0);
	memcpy(b, "\xff\x7b", 2);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F16, b, 0, &x), MS_OK);
	T_ASSERT(x == 65504.0);
	memcpy(b, "\x01\x00", 2);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F16, b, 0, &x), MS_OK);
	T_ASSERT(x == 0x1p-24);
	memcpy(b, "\x80\xbf", 2);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_BF16, b, 0, &x), MS_OK);
	T_ASSERT(x == -1.0);
	memcpy(b, "\xff\xff\xff\xff", 4);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_U32, b, 0, &x), MS_OK);
	T_ASSERT(x == 4294967295.0);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_I32, b, 0, &x), MS_OK);
	T_ASSERT(x == -1.0);
	memcpy(b, "\x00\x00\x00\x00\x00\x00\x00\x80", 8);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_I64, b, 0, &x), MS_OK);
	T_ASSERT(x == -0x1p63);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_U64, b, 0, &x), MS_OK);
	T_ASSERT(x == 0x1p63);
	memcpy(b, "\x00\x00\x00\x00\x00\x00\xf0\x3f", 8);
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F64, b, 0, &x), MS_OK);
	T_ASSERT(x == 1.0);
	/* element index scales by the width */
	{
		uint8_t two[4] = {0x00, 0x3c, 0x00, 0xc0};

		T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_F16, two, 1, &x), MS_OK);
		T_ASSERT(x == -2.0);
	}
	/* C64 has no single real value */
	T_ASSERT_EQ_INT(ms_dtype_get_f64(MS_DTYPE_C64, b, 0, &x), MS_EINVAL);
	return 0;
}

/* f16 and bf16 conversions: every f16 survives f16 -> f32 -> f16; bf16
 * rounds to nearest even. */
static int test_half_conversions(void)
{
	for (uint32_t h = 0; h < 65536; h++) {
		float f = ms_f16_to_f32((uint16_t)h);
		uint16_t back = ms_f32_to_f16(f);

		if (isnan(f))
			T_ASSERT((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
		else
			T_ASSERT_MSG(back == h, "f16 0x%04x -> %g -> 0x%04x", h, (double)f, back);
		T_ASSERT(ms_f32_to_bf16(ms_bf16_to_f32((uint16_t)h)) == h ||
			 isnan(ms_bf16_to_f32((uint16_t)h)));
	}
	/* halfway cases: ties go to the even mantissa */
	T_ASSERT_EQ_INT(ms_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
	T_ASSERT_EQ_INT(ms_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-7f), 0x3f82);
	T_ASSERT_EQ_INT(ms_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	T_ASSERT_EQ_INT(ms_f32_to_f16(1.0f + 0x1p-11f + 0x1p-10f), 0x3c02);
	T_ASSERT_EQ_INT(ms_f32_to_f16(65520.0f), 0x7c00); /* rounds up to inf */
	T_ASSERT_EQ_INT(ms_f32_to_f16(65519.0f), 0x7bff);
	T_ASSERT_EQ_INT(ms_f32_to_f16(0x1p-25f), 0x0000); /* tie to even zero */
	T_ASSERT_EQ_INT(ms_f32_to_f16(0x1.8p-25f), 0x0001);
	T_ASSERT(isnan(ms_bf16_to_f32(ms_f32_to_bf16(NAN))));
	return 0;
}

/* ---- the bundled fixtures against truth.json ------------------------------ */

/* Flatten a nested JSON array of numbers or booleans into out[]. */
static int flatten(const cJSON *j, double *out, size_t cap, size_t *n)
{
	const cJSON *it;

	if (cJSON_IsArray(j)) {
		cJSON_ArrayForEach(it, j)
			if (flatten(it, out, cap, n))
				return -1;
		return 0;
	}
	if (*n >= cap)
		return -1;
	if (cJSON_IsBool(j))
		out[(*n)++] = cJSON_IsTrue(j) ? 1.0 : 0.0;
	else if (cJSON_IsNumber(j))
		out[(*n)++] = j->valuedouble;
	else
		return -1;
	return 0;
}

static int check_against_truth(const struct ms_st_file *f, const cJSON *truth, int *checked)
{
	static double want[4096];

	for (size_t i = 0; i < f->ntensors; i++) {
		const struct ms_tensor *t = &f->tensors[i];
		const cJSON *tj = cJSON_GetObjectItemCaseSensitive(truth, t->name);
		size_t n = 0;

		T_ASSERT_MSG(tj, "'%s' has no truth", t->name);
		T_ASSERT_EQ_INT(flatten(tj, want, 4096, &n), 0);
		if (t->dtype == MS_DTYPE_F4) {
			/* truth is the packed bytes; decode the nibbles here too */
			T_ASSERT_EQ_INT(n, t->nbytes);
			for (size_t k = 0; k < n; k++) {
				static const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
				double lo, hi;
				unsigned b = (unsigned)want[k];

				T_ASSERT_MSG(t->data[k] == b, "%s byte %zu", t->name, k);
				T_ASSERT_EQ_INT(ms_dtype_get_f64(t->dtype, t->data, 2 * k, &lo), MS_OK);
				T_ASSERT_EQ_INT(ms_dtype_get_f64(t->dtype, t->data, 2 * k + 1, &hi), MS_OK);
				T_ASSERT(same(lo, (b & 8 ? -1 : 1) * e2m1[b & 7]));
				T_ASSERT(same(hi, (b & 0x80 ? -1 : 1) * e2m1[(b >> 4) & 7]));
			}
			T_ASSERT_EQ_INT(t->nelem, 2 * n);
		} else {
			T_ASSERT_MSG(n == t->nelem, "'%s': %zu values, %llu elements", t->name, n,
				     (unsigned long long)t->nelem);
			for (uint64_t k = 0; k < t->nelem; k++) {
				double x;

				T_ASSERT_EQ_INT(ms_dtype_get_f64(t->dtype, t->data, k, &x), MS_OK);
				/* truth.json prints float64 with round-trip precision */
				T_ASSERT_MSG(x == want[k], "'%s'[%llu] = %.17g, truth %.17g", t->name,
					     (unsigned long long)k, x, want[k]);
			}
		}
		(*checked)++;
	}
	return 0;
}

static int test_fixtures_match_truth(void)
{
	static const char *const names[] = {
		"all", "one_bf16", "one_bool", "one_empty", "one_f16", "one_f32",
		"one_f64", "one_f8e4m3", "one_f8e5m2", "one_f8e8m0", "one_fp4x2",
		"one_i16", "one_i32", "one_i64", "one_i8", "one_scalar", "one_u8",
	};
	char *path = ms_path_join(T_FIXTURES, "dtypes/truth.json"), *text = NULL;
	size_t len;
	struct ms_err err = {0};
	cJSON *truth;
	int checked = 0, ntruth;

	T_ASSERT_EQ_INT(ms_file_read(path, 1 << 20, &text, &len, &err), MS_OK);
	truth = cJSON_Parse(text);
	T_ASSERT(truth);
	ntruth = cJSON_GetArraySize(truth);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char rel[64], *p;
		struct ms_st_file *f;

		snprintf(rel, sizeof(rel), "dtypes/%s.safetensors", names[i]);
		p = ms_path_join(T_FIXTURES, rel);
		T_ASSERT_MSG(ms_st_open(p, &f, &err) == MS_OK, "%s", err.msg);
		if (i == 0)
			T_ASSERT_EQ_INT(f->ntensors, ntruth); /* all.safetensors has every one */
		else
			T_ASSERT_EQ_INT(f->ntensors, 1);
		T_ASSERT_STR(ms_st_meta_get(f, "format"), "pt");
		T_ASSERT_EQ_INT(check_against_truth(f, truth, &checked), 0);
		ms_st_close(f);
		ms_free(p);
	}
	T_ASSERT_EQ_INT(checked, 2 * ntruth);
	{
		/* shapes the library wrote: F4 counts logical elements */
		struct ms_st_file *f;
		const struct ms_tensor *t;

		ms_free(path);
		path = ms_path_join(T_FIXTURES, "dtypes/all.safetensors");
		T_ASSERT_EQ_INT(ms_st_open(path, &f, &err), MS_OK);
		t = ms_st_find(f, "fp4x2");
		T_ASSERT(t && t->ndim == 2 && t->shape[0] == 4 && t->shape[1] == 8 && t->nbytes == 16);
		t = ms_st_find(f, "scalar");
		T_ASSERT(t && t->ndim == 0 && t->nelem == 1 && t->nbytes == 4);
		t = ms_st_find(f, "empty");
		T_ASSERT(t && t->ndim == 2 && t->nelem == 0 && t->nbytes == 0);
		T_ASSERT(ms_st_find(f, "nope") == NULL);
		ms_st_close(f);
	}
	cJSON_Delete(truth);
	ms_free(text);
	ms_free(path);
	return 0;
}

/* ---- validation rules ----------------------------------------------------- */

#define E(dt, shape, b, e) "{\"dtype\":\"" dt "\",\"shape\":[" shape "],\"data_offsets\":[" b "," e "]}"

static int test_rule_length_field(void)
{
	struct ms_st_file *f;
	struct ms_err err = {0};
	uint8_t buf[64] = {0};

	/* shorter than the length field: 0..7 bytes */
	for (uint64_t n = 0; n < 8; n++) {
		T_ASSERT_EQ_INT(ms_st_parse(buf, n, "short.safetensors", &f, &err), MS_EINVAL);
		T_ASSERT(strstr(err.msg, "'short.safetensors'") &&
			 strstr(err.msg, "shorter than the 8-byte header length"));
	}
	/* header length past the end, with checked arithmetic near 2^64 */
	{
		static const uint64_t lens[] = {56, 57, 100000000, 100000001,
						UINT64_MAX - 7, UINT64_MAX};

		memcpy(buf + 8, "{}", 2);
		memset(buf + 10, ' ', sizeof(buf) - 10);
		for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
			int rc;

			for (int k = 0; k < 8; k++)
				buf[k] = (uint8_t)(lens[i] >> (8 * k));
			rc = ms_st_parse(buf, sizeof(buf), "len.safetensors", &f, &err);
			if (lens[i] == 56) {
				T_ASSERT_MSG(rc == MS_OK, "len %llu: %s", (unsigned long long)lens[i], err.msg);
				T_ASSERT_EQ_INT(f->ntensors, 0);
				ms_st_close(f);
			} else {
				T_ASSERT_EQ_INT(rc, MS_EINVAL);
				T_ASSERT_MSG(strstr(err.msg, lens[i] > 100000000 ? "exceeds the limit of 100000000 bytes"
										 : "runs past the end of the file"),
					     "%s", err.msg);
			}
		}
	}
	/* 0 and 1 cannot hold an object */
	for (int n = 0; n < 2; n++) {
		memset(buf, 0, 8);
		buf[0] = (uint8_t)n;
		T_ASSERT_EQ_INT(ms_st_parse(buf, 16, "tiny.safetensors", &f, &err), MS_EINVAL);
		T_ASSERT(strstr(err.msg, "too small for a JSON object"));
	}
	return 0;
}

/* The limit itself is accepted: a header of exactly 100 MB of which all but
 * "{}" is padding; one byte more is refused. */
static int test_rule_header_limit_exact(void)
{
	uint64_t n = MS_ST_MAX_HEADER;
	uint8_t *p = malloc(8 + n + 1);
	struct ms_st_file *f;
	struct ms_err err = {0};

	T_ASSERT(p);
	memset(p + 8, ' ', n + 1);
	memcpy(p + 8, "{}", 2);
	for (int k = 0; k < 8; k++)
		p[k] = (uint8_t)(n >> (8 * k));
	T_ASSERT_MSG(ms_st_parse(p, 8 + n, "max.safetensors", &f, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(f->header_len, n);
	ms_st_close(f);
	n++;
	for (int k = 0; k < 8; k++)
		p[k] = (uint8_t)(n >> (8 * k));
	T_ASSERT_EQ_INT(ms_st_parse(p, 8 + n, "max.safetensors", &f, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "exceeds the limit"));
	free(p);
	return 0;
}

static int test_rule_utf8_and_json(void)
{
	T_BAD("{\"t\xff\":" E("F32", "2", "0", "8") "}", 8, "header is not valid UTF-8");
	T_BAD("{\"t\xc0\xae\":" E("F32", "2", "0", "8") "}", 8, "header is not valid UTF-8");
	T_BAD("{\"t\xe0\x80\xae\":" E("F32", "2", "0", "8") "}", 8, "header is not valid UTF-8");
	T_BAD("{\"t\xed\xb0\x80\":" E("F32", "2", "0", "8") "}", 8, "header is not valid UTF-8");
	T_BAD("{\"t\xf4\x90\x80\x80\":" E("F32", "2", "0", "8") "}", 8, "header is not valid UTF-8");
	T_BAD("{\"t\x80\":" E("F32", "2", "0", "8") "}", 8, "header is not valid UTF-8");
	T_BAD("{\"t\xf8\x88\x80\x80\x80\":" E("F32", "2", "0", "8") "}", 8, "header is not valid UTF-8");
	T_BAD("[]", 0, "header is not a JSON object");
	T_BAD("\"x\"", 0, "header is not a JSON object");
	T_BAD("{} {}", 0, "trailing bytes after the JSON object");
	T_BAD("{}x", 0, "trailing bytes after the JSON object");
	T_BAD("{\"t\":" E("F32", "2", "0", "8"), 8, "expected ',' or '}'");
	T_BAD("{\"t\" " E("F32", "2", "0", "8") "}", 8, "expected ':'");
	T_BAD("{\"t\":" E("F32", "2", "0", "8") ",}", 8, "expected a string");
	T_BAD("{t:1}", 0, "expected a string");
	T_BAD("{\"t\\q\":" E("F32", "2", "0", "8") "}", 8, "invalid escape in string");
	T_BAD("{\"t\\u00zz\":" E("F32", "2", "0", "8") "}", 8, "invalid \\u escape");
	T_BAD("{\"t\\u12\":1}", 0, "invalid \\u escape");
	T_BAD("{\"t\\ud800\":" E("F32", "2", "0", "8") "}", 8, "unpaired surrogate");
	T_BAD("{\"t\\ud800\\u0041\":" E("F32", "2", "0", "8") "}", 8, "unpaired surrogate");
	T_BAD("{\"t\\ud800\\ud800\":" E("F32", "2", "0", "8") "}", 8, "unpaired surrogate");
	T_BAD("{\"t\\udfff\":" E("F32", "2", "0", "8") "}", 8, "unpaired surrogate");
	T_BAD("{\"t\\u0000\":" E("F32", "2", "0", "8") "}", 8, "NUL character in string");
	T_BAD("{\"t\x01\":" E("F32", "2", "0", "8") "}", 8, "control character in string");
	T_BAD("{\"t\tx\":" E("F32", "2", "0", "8") "}", 8, "control character in string");
	no_pad = 1;
	T_BAD("{\"t", 0, "unterminated string");
	T_BAD("{\"t\\", 0, "unterminated escape");
	T_BAD("{\"t\\u00", 0, "invalid \\u escape");
	T_BAD("{\"t\\ud800\\u", 0, "unpaired surrogate");
	T_BAD("{\"t\":", 0, "tensor entry is not an object");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2", 0, "expected ',' or ']' in shape");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"x\":", 0, "unexpected end of header");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"x\":tru", 0, "invalid JSON value");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8", 0, "data_offsets needs exactly two entries");
	T_BAD("{ ", 0, "expected a string");
	no_pad = 0;
	/* nesting is bounded in skipped fields */
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":"
	      "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}",
	      8, "nesting too deep");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":"
	      "{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":"
	      "{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{}}}}}}}}}}}}}}}}}}}",
	      8, "nesting too deep");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":nul}}", 8,
	      "invalid JSON value");
	/* values of unknown fields are skipped, but must still be JSON */
	{
		static const char *const nums[] = {"01", "1.", ".5", "1e", "1e+", "-", "+1", "--1", "-a"};

		for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
			char hdr[200];

			snprintf(hdr, sizeof(hdr),
				 "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":%s}}",
				 nums[i]);
			T_ASSERT_EQ_INT(bad(hdr, 8, "invalid JSON value"), 0);
		}
		T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":0x10}}", 8,
		      "expected ',' or '}' in tensor entry");
		T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1.2.3}}", 8,
		      "expected ',' or '}' in tensor entry");
	}
	{
		/* a NUL byte is neither JSON whitespace nor part of a number */
		static const char hdr[] = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1\0}}   ";
		uint8_t img[8 + sizeof(hdr) - 1 + 8];
		struct ms_st_file *f;
		struct ms_err err = {0};

		for (int k = 0; k < 8; k++)
			img[k] = (uint8_t)((uint64_t)(sizeof(hdr) - 1) >> (8 * k));
		memcpy(img + 8, hdr, sizeof(hdr) - 1);
		memset(img + 8 + sizeof(hdr) - 1, 0, 8);
		T_ASSERT_EQ_INT(ms_st_parse(img, sizeof(img), "nul.safetensors", &f, &err), MS_EINVAL);
		T_ASSERT_MSG(strstr(err.msg, "expected ',' or '}' in tensor entry"), "%s", err.msg);
		/* the same refusal without an error buffer */
		T_ASSERT_EQ_INT(ms_st_parse(img, sizeof(img), "nul.safetensors", &f, NULL), MS_EINVAL);
	}
	return 0;
}

static int test_rule_duplicates(void)
{
	T_BAD("{\"t\":" E("F32", "2", "0", "8") ",\"t\":" E("F32", "2", "8", "16") "}", 16,
	      "duplicate tensor name 't'");
	/* the same name spelled two ways is the same name */
	T_BAD("{\"\\u00e9\":" E("F32", "2", "0", "8") ",\"\xc3\xa9\":" E("F32", "2", "8", "16") "}", 16,
	      "duplicate tensor name '\xc3\xa9'");
	T_BAD("{\"__metadata__\":{\"a\":\"1\",\"b\":\"2\",\"a\":\"3\"}}", 0,
	      "duplicate __metadata__ key 'a'");
	T_BAD("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key '__metadata__'");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
	      "duplicate key 'shape'");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"data_offsets\":[0,8]}}",
	      8, "duplicate key 'data_offsets'");
	/* a newline in a duplicated name stays inside one line */
	T_BAD("{\"a\\nb\":" E("F32", "2", "0", "8") ",\"a\\nb\":" E("F32", "2", "8", "16") "}", 16,
	      "duplicate tensor name 'a\\x0ab'");
	return 0;
}

static int test_rule_metadata(void)
{
	struct ms_st_file *f;
	uint8_t *mem;

	T_BAD("{\"__metadata__\":{\"a\":1}}", 0, "__metadata__ value is not a string");
	T_BAD("{\"__metadata__\":{\"a\":null}}", 0, "__metadata__ value is not a string");
	T_BAD("{\"__metadata__\":{\"a\":[\"x\"]}}", 0, "__metadata__ value is not a string");
	T_BAD("{\"__metadata__\":{\"a\":{}}}", 0, "__metadata__ value is not a string");
	T_BAD("{\"__metadata__\":\"x\"}", 0, "__metadata__ is not an object");
	T_BAD("{\"__metadata__\":{\"a\":\"\\u0000\"}}", 0, "NUL character in string");
	/* accepted: escapes decode, order kept, lookup by key */
	T_ASSERT_EQ_INT(good("{\"__metadata__\":{\"format\":\"pt\",\"q\\\"\":\"a\\\\b\\u00e9\\ud83d\\ude00\"},"
			     "\"t\":" E("U8", "3", "0", "3") "}", 3, &f, &mem), 0);
	T_ASSERT_EQ_INT(f->nmeta, 2);
	T_ASSERT_STR(f->meta[0].key, "format");
	T_ASSERT_STR(ms_st_meta_get(f, "q\""), "a\\b\xc3\xa9\xf0\x9f\x98\x80");
	T_ASSERT(ms_st_meta_get(f, "missing") == NULL);
	ms_st_close(f);
	free(mem);
	return 0;
}

static int test_rule_entries(void)
{
	T_BAD("{\"t\":[]}", 0, "tensor entry is not an object");
	T_BAD("{\"t\":{}}", 0, "tensor entry is empty");
	T_BAD("{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor entry without 'dtype'");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "tensor entry without 'shape'");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "tensor entry without 'data_offsets'");
	T_BAD("{\"t\":" E("F16x", "2", "0", "4") "}", 4, "unknown dtype 'F16x'");
	T_BAD("{\"t\":" E("bf16", "2", "0", "4") "}", 4, "unknown dtype 'bf16'");
	T_BAD("{\"t\":{\"dtype\":16,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "expected a string");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,8]}}", 8, "shape is not an array");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":0}}", 8, "data_offsets is not an array");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets needs two entries");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8,
	      "data_offsets needs exactly two entries");
	T_BAD("{\"t\":" E("U8", "1,1,1,1,1,1,1,1,1", "0", "1") "}", 1, "rank exceeds the limit of 8");
	T_BAD("{\"\":" E("F32", "2", "0", "8") "}", 8, "empty tensor name");
	T_BAD("{\"t\":{\"dtype\":\"F32\",\"shape\":[2,],\"data_offsets\":[0,8]}}", 8, "shape entry is not an integer");
	return 0;
}

static int test_rule_numbers(void)
{
	T_BAD("{\"t\":" E("F32", "2.0", "0", "8") "}", 8, "shape entry is not an integer");
	T_BAD("{\"t\":" E("F32", "2e0", "0", "8") "}", 8, "shape entry is not an integer");
	T_BAD("{\"t\":" E("F32", "\"2\"", "0", "8") "}", 8, "shape entry is not an integer");
	T_BAD("{\"t\":" E("F32", "true", "0", "8") "}", 8, "shape entry is not an integer");
	T_BAD("{\"t\":" E("F32", "-2", "0", "8") "}", 8, "negative shape entry");
	T_BAD("{\"t\":" E("F32", "+2", "0", "8") "}", 8, "shape entry is not an integer");
	T_BAD("{\"t\":" E("F32", "02", "0", "8") "}", 8, "integer with leading zero");
	T_BAD("{\"t\":" E("F32", "2", "00", "8") "}", 8, "integer with leading zero");
	T_BAD("{\"t\":" E("F32", "2", "0", "8.0") "}", 8, "offset is not an integer");
	T_BAD("{\"t\":" E("F32", "2", "0", "8E0") "}", 8, "offset is not an integer");
	T_BAD("{\"t\":" E("F32", "2", "0", "0.8e1") "}", 8, "offset is not an integer");
	T_BAD("{\"t\":" E("F32", "2", "-0", "8") "}", 8, "negative offset");
	T_BAD("{\"t\":" E("U8", "18446744073709551616", "0", "8") "}", 8, "shape entry overflows u64");
	T_BAD("{\"t\":" E("U8", "99999999999999999999999", "0", "8") "}", 8, "shape entry overflows u64");
	T_BAD("{\"t\":" E("U8", "8", "0", "18446744073709551616") "}", 8, "offset overflows u64");
	/* u64 max parses exactly, then fails on the size rule */
	T_BAD("{\"t\":" E("U8", "18446744073709551615", "0", "18446744073709551615") "}", 8,
	      "tensor data extends 18446744073709551607 bytes past the end of the file");
	/* 2^53 + 1 is not rounded to 2^53 */
	T_BAD("{\"t\":" E("U8", "9007199254740992", "0", "9007199254740993") "}", 8,
	      "data_offsets span 9007199254740993 bytes but dtype U8 and shape need 9007199254740992");
	T_BAD("{\"t\":" E("U8", "4294967296,4294967296", "0", "8") "}", 8, "element count overflows u64");
	T_BAD("{\"t\":" E("U8", "4294967296,4294967296,0", "0", "0") "}", 0, "element count overflows u64");
	T_BAD("{\"t\":" E("F64", "2305843009213693952", "0", "8") "}", 8, "byte size overflows u64");
	T_BAD("{\"t\":" E("F4", "3", "0", "2") "}", 2, "F4 byte size is not a whole number of bytes");
	T_BAD("{\"t\":" E("F6_E3M2", "2", "0", "2") "}", 2, "is not a whole number of bytes");
	return 0;
}

static int test_rule_layout(void)
{
	T_BAD("{\"t\":" E("F32", "3", "0", "8") "}", 8, "data_offsets span 8 bytes but dtype F32 and shape need 12");
	T_BAD("{\"t\":" E("F32", "2", "8", "0") "}", 8, "data_offsets end 0 before begin 8");
	T_BAD("{\"a\":" E("F32", "2", "0", "8") ",\"b\":" E("F32", "2", "4", "12") "}", 12,
	      "tensor 'b': data overlaps the previous tensor (begins at 4, previous ends at 8)");
	T_BAD("{\"a\":" E("F32", "2", "0", "8") ",\"b\":" E("F32", "2", "0", "8") "}", 8,
	      "data overlaps the previous tensor");
	T_BAD("{\"a\":" E("F32", "2", "0", "8") ",\"b\":" E("F32", "2", "9", "17") "}", 17,
	      "tensor 'b': hole in the data buffer (begins at 9, previous ends at 8)");
	T_BAD("{\"a\":" E("F32", "2", "1", "9") "}", 9, "hole in the data buffer (begins at 1, previous ends at 0)");
	T_BAD("{\"a\":" E("F32", "2", "0", "8") "}", 9, "1 trailing bytes after the last tensor");
	T_BAD("{}", 1, "1 trailing bytes after the last tensor");
	T_BAD("{\"a\":" E("F32", "4", "0", "16") "}", 15, "tensor data extends 1 bytes past the end of the file");
	/* a zero-size tensor between two others is fine; the real bytes must
	 * still be contiguous */
	T_BAD("{\"a\":" E("F32", "2", "0", "8") ",\"z\":" E("F32", "0", "12", "12") ",\"b\":"
	      E("F32", "2", "8", "16") "}", 16, "data overlaps the previous tensor");
	return 0;
}

static int test_rule_name_length(void)
{
	char name[MS_ST_MAX_NAME + 2], hdr[MS_ST_MAX_NAME + 200];
	struct ms_st_file *f;
	uint8_t *mem;

	/* 1024 bytes is the limit, 1025 is over */
	memset(name, 'n', sizeof(name));
	name[MS_ST_MAX_NAME] = 0;
	snprintf(hdr, sizeof(hdr), "{\"%s\":" E("U8", "1", "0", "1") "}", name);
	T_ASSERT_EQ_INT(good(hdr, 1, &f, &mem), 0);
	T_ASSERT_EQ_INT(strlen(f->tensors[0].name), MS_ST_MAX_NAME);
	ms_st_close(f);
	free(mem);
	name[MS_ST_MAX_NAME] = 'n';
	name[MS_ST_MAX_NAME + 1] = 0;
	snprintf(hdr, sizeof(hdr), "{\"%s\":" E("U8", "1", "0", "1") "}", name);
	T_BAD(hdr, 1, "tensor name longer than 1024 bytes");
	/* the limit counts decoded bytes: 512 two-byte characters fit */
	{
		struct ms_buf b;

		ms_buf_init(&b);
		ms_buf_puts(&b, "{\"");
		for (int i = 0; i < MS_ST_MAX_NAME / 2; i++)
			ms_buf_puts(&b, "\\u00e9");
		ms_buf_puts(&b, "\":" E("U8", "1", "0", "1") "}");
		T_ASSERT_EQ_INT(good(b.data, 1, &f, &mem), 0);
		T_ASSERT_EQ_INT(strlen(f->tensors[0].name), MS_ST_MAX_NAME);
		ms_st_close(f);
		free(mem);
		ms_buf_release(&b);
	}
	return 0;
}

/* More than MS_ST_MAX_TENSORS entries: refused when the cap is crossed,
 * before the layout is looked at. */
static int test_rule_tensor_count(void)
{
	struct ms_buf b;
	uint64_t size;
	uint8_t *p;
	struct ms_st_file *f;
	struct ms_err err = {0};

	ms_buf_init(&b);
	ms_buf_puts(&b, "{");
	for (uint32_t i = 0; i <= MS_ST_MAX_TENSORS; i++)
		ms_buf_printf(&b, "%s\"%x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}",
			      i ? "," : "", i);
	ms_buf_puts(&b, "}");
	T_ASSERT(!b.oom);
	p = image(b.data, 0, &size);
	T_ASSERT(p);
	T_ASSERT_EQ_INT(ms_st_parse(p, size, "many.safetensors", &f, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "more than 1000000 tensors"), "%s", err.msg);
	free(p);
	ms_buf_release(&b);
	return 0;
}

/* What must be accepted: order in the header differs from the data order,
 * whitespace anywhere, unknown fields, zero-size tensors, rank 8, scalars,
 * escaped names, the empty file set. */
static int test_accepts_valid_variants(void)
{
	struct ms_st_file *f;
	uint8_t *mem;
	const struct ms_tensor *t;
	double x;

	T_ASSERT_EQ_INT(good(" \t\r\n{ \"b\" : " E("U8", "2", "4", "6") " , \"a\":"
			     "{\"data_offsets\":[0,4],\"extra\":{\"k\":[1,-2.5e3,true,null,\"s\",0,-0,"
			     "1.5E-3,12e+4,[],{}]},"
			     "\"shape\":[ 2 , 1 ],\"dtype\":\"I16\"},"
			     "\"z\":" E("F32", "0,3", "6", "6") ",\"r8\":" E("U8", "1,1,1,1,1,1,1,2", "6", "8")
			     ",\"s\":" E("F32", "", "8", "12") ",\"\\u00e9\\ud83d\\ude00/x\":"
			     E("BOOL", "1", "12", "13") "}\n",
			     13, &f, &mem), 0);
	T_ASSERT_EQ_INT(f->ntensors, 6);
	/* in offset order; zero-size tensors sort before the tensor they share
	 * an offset with */
	T_ASSERT_STR(f->tensors[0].name, "a");
	T_ASSERT_STR(f->tensors[1].name, "b");
	T_ASSERT_STR(f->tensors[2].name, "z");
	T_ASSERT_STR(f->tensors[3].name, "r8");
	T_ASSERT_EQ_INT(f->tensors[0].offset, 8 + f->header_len);
	T_ASSERT(f->tensors[0].data == mem + 8 + f->header_len);
	t = ms_st_find(f, "a");
	T_ASSERT(t && t->dtype == MS_DTYPE_I16 && t->ndim == 2 && t->nelem == 2 && t->nbytes == 4);
	/* pattern byte i is i*7+1: bytes 1, 8 -> 0x0801 */
	T_ASSERT_EQ_INT(ms_dtype_get_f64(t->dtype, t->data, 0, &x), MS_OK);
	T_ASSERT(x == 0x0801);
	t = ms_st_find(f, "r8");
	T_ASSERT(t && t->ndim == 8 && t->nelem == 2);
	t = ms_st_find(f, "s");
	T_ASSERT(t && t->ndim == 0 && t->nelem == 1 && t->nbytes == 4);
	t = ms_st_find(f, "\xc3\xa9\xf0\x9f\x98\x80/x");
	T_ASSERT(t && t->dtype == MS_DTYPE_BOOL);
	T_ASSERT(t->file == f);
	ms_st_close(f);
	free(mem);
	/* no tensors at all */
	T_ASSERT_EQ_INT(good("{}", 0, &f, &mem), 0);
	T_ASSERT_EQ_INT(f->ntensors, 0);
	T_ASSERT(ms_st_find(f, "x") == NULL);
	ms_st_close(f);
	free(mem);
	T_ASSERT_EQ_INT(good("{\"__metadata__\":{}}", 0, &f, &mem), 0);
	T_ASSERT_EQ_INT(f->nmeta, 0);
	ms_st_close(f);
	free(mem);
	/* only zero-size tensors */
	T_ASSERT_EQ_INT(good("{\"e\":" E("F64", "0", "0", "0") ",\"d\":" E("C64", "4,0", "0", "0") "}", 0,
			     &f, &mem), 0);
	T_ASSERT_EQ_INT(f->ntensors, 2);
	ms_st_close(f);
	free(mem);
	return 0;
}

static int test_open_paths(void)
{
	struct ms_st_file *f = NULL;
	struct ms_err err = {0};
	char *p = ms_path_join(T_TMP, "nothing.safetensors"), *link;

	T_ASSERT_EQ_INT(ms_st_open(p, &f, &err), MS_ENOTFOUND);
	T_ASSERT(strstr(err.msg, "nothing.safetensors") && !f);
	T_ASSERT_EQ_INT(ms_st_open(T_TMP, &f, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "not a regular file"));
	/* an empty file is bad input, not a crash in mmap */
	T_ASSERT_EQ_INT(ms_file_write_atomic(p, "", 0, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_open(p, &f, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "file is 0 bytes"));
	ms_free(p);
	/* links are followed; the file keeps the name it was opened by */
	p = ms_path_join(T_FIXTURES, "dtypes/one_f16.safetensors");
	link = ms_path_join(T_TMP, "link.safetensors");
	{
		char abs[4096];

		T_ASSERT(realpath(p, abs));
		T_ASSERT_EQ_INT(symlink(abs, link), 0);
	}
	T_ASSERT_MSG(ms_st_open(link, &f, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_STR(f->path, link);
	T_ASSERT(f->blob_digest == NULL); /* not a blob store link */
	T_ASSERT(f->mapped && f->size == 176 && f->ino != 0);
	T_ASSERT(ms_st_find(f, "f16"));
	ms_st_close(f);
	ms_st_close(NULL);
	ms_free(p);
	ms_free(link);
	return 0;
}

/* ---- writer --------------------------------------------------------------- */

/* Where round-trip files go: MS_ST_WRITE_DIR (kept, for the Python check in
 * inspect_cli.sh) or the scratch directory. */
static char *out_path(const char *name)
{
	const char *d = getenv("MS_ST_WRITE_DIR");

	return ms_path_join(d && *d ? d : T_TMP, name);
}

static int count_temporaries(const char *dir)
{
	char cmd[600];
	FILE *p;
	int n = -1;

	snprintf(cmd, sizeof(cmd), "ls -a '%s' | grep -c -- '" MS_TMP_MARKER "'", dir);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	if (fscanf(p, "%d", &n) != 1)
		n = -1;
	pclose(p);
	return n;
}

struct wt {
	char name[32];
	enum ms_dtype dt;
	uint32_t ndim;
	uint64_t shape[MS_ST_MAX_RANK];
	uint8_t *bytes;
	uint64_t nbytes;
	int streamed; /* declared without data and streamed */
};

/* Read back path and compare with the tensors that were written. */
static int check_read_back(const char *path, struct wt *ts, size_t n,
			   struct ms_st_writer *w)
{
	struct ms_st_file *f;
	struct ms_err err = {0};
	uint64_t total = 0;

	T_ASSERT_MSG(ms_st_open(path, &f, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(f->ntensors, n);
	T_ASSERT_EQ_INT(f->header_len % 8, 0);
	T_ASSERT_STR(ms_st_meta_get(f, "format"), "pt");
	T_ASSERT_STR(ms_st_meta_get(f, "writer \"test\"\n"), "t_safetensors\t\\");
	for (size_t i = 0; i < n; i++) {
		const struct ms_tensor *t = ms_st_find(f, ts[i].name);
		uint8_t d[MS_SHA256_LEN];

		T_ASSERT_MSG(t, "'%s' missing", ts[i].name);
		T_ASSERT_EQ_INT(t->dtype, ts[i].dt);
		T_ASSERT_EQ_INT(t->ndim, ts[i].ndim);
		for (uint32_t k = 0; k < t->ndim; k++)
			T_ASSERT(t->shape[k] == ts[i].shape[k]);
		T_ASSERT_EQ_INT(t->nbytes, ts[i].nbytes);
		T_ASSERT_MSG(!memcmp(t->data, ts[i].bytes, ts[i].nbytes), "'%s' bytes differ",
			     ts[i].name);
		/* written in declaration order */
		T_ASSERT(t == &f->tensors[i]);
		T_ASSERT_EQ_INT(ms_sha256(ts[i].bytes, ts[i].nbytes, d), MS_OK);
		T_ASSERT(ms_st_writer_digest(w, i) != NULL);
		T_ASSERT(!memcmp(ms_st_writer_digest(w, i), d, MS_SHA256_LEN));
		total += ts[i].nbytes;
	}
	T_ASSERT(ms_st_writer_digest(w, n) == NULL);
	T_ASSERT_EQ_INT(f->size, 8 + f->header_len + total);
	ms_st_close(f);
	return 0;
}

/* Write ts to path: borrowed tensors through ms_st_writer_add, the others
 * streamed in random chunks that cross tensor boundaries. */
static int write_tensors(const char *path, struct wt *ts, size_t n, int check)
{
	struct ms_st_writer *w;
	struct ms_err err = {0};
	struct ms_buf stream;

	ms_buf_init(&stream);
	T_ASSERT_MSG(ms_st_writer_new(path, 1, &w, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(ms_st_writer_meta(w, "format", "pt", &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_meta(w, "writer \"test\"\n", "t_safetensors\t\\", &err), MS_OK);
	for (size_t i = 0; i < n; i++) {
		if (ts[i].streamed) {
			T_ASSERT_MSG(ms_st_writer_declare(w, ts[i].name, ts[i].dt, ts[i].ndim,
							  ts[i].shape, &err) == MS_OK, "%s", err.msg);
			ms_buf_append(&stream, ts[i].bytes, ts[i].nbytes);
		} else {
			T_ASSERT_MSG(ms_st_writer_add(w, ts[i].name, ts[i].dt, ts[i].ndim, ts[i].shape,
						      ts[i].bytes, &err) == MS_OK, "%s", err.msg);
		}
	}
	T_ASSERT(!stream.oom);
	for (size_t pos = 0; pos < stream.len;) {
		size_t k = 1 + (size_t)(rnd() % 97);

		if (k > stream.len - pos)
			k = stream.len - pos;
		T_ASSERT_MSG(ms_st_writer_data(w, stream.data + pos, k, &err) == MS_OK, "%s", err.msg);
		pos += k;
	}
	T_ASSERT_MSG(ms_st_writer_commit(w, &err) == MS_OK, "%s", err.msg);
	if (check)
		T_ASSERT_EQ_INT(check_read_back(path, ts, n, w), 0);
	ms_st_writer_free(w);
	ms_buf_release(&stream);
	return 0;
}

/* Every dtype: one file each ("rt_<DTYPE>.safetensors") and one with all
 * of them, plus a scalar and an empty tensor. */
static int test_writer_roundtrip_every_dtype(void)
{
	struct wt ts[MS_DTYPE_COUNT + 2];
	size_t n = 0;

	for (int d = 0; d < MS_DTYPE_COUNT; d++) {
		struct wt *t = &ts[n++];

		memset(t, 0, sizeof(*t));
		snprintf(t->name, sizeof(t->name), "t.%s", ms_dtype_name((enum ms_dtype)d));
		t->dt = (enum ms_dtype)d;
		/* 4 x 6 = 24 elements: whole bytes for F4 (12) and F6 (18) */
		t->ndim = 2;
		t->shape[0] = 4;
		t->shape[1] = 6;
		T_ASSERT_EQ_INT(ms_dtype_nbytes(t->dt, 24, &t->nbytes), MS_OK);
		t->bytes = malloc(t->nbytes);
		T_ASSERT(t->bytes);
		for (uint64_t k = 0; k < t->nbytes; k++)
			t->bytes[k] = (uint8_t)(rnd() >> 24);
		if (t->dt == MS_DTYPE_BOOL)
			for (uint64_t k = 0; k < t->nbytes; k++)
				t->bytes[k] &= 1;
		t->streamed = d % 2;
	}
	memset(&ts[n], 0, 2 * sizeof(ts[0]));
	strcpy(ts[n].name, "scalar");
	ts[n].dt = MS_DTYPE_F32;
	ts[n].nbytes = 4;
	ts[n].bytes = malloc(4);
	memcpy(ts[n].bytes, "\x00\x00\x60\x40", 4);
	ts[n++].streamed = 1;
	strcpy(ts[n].name, "empty");
	ts[n].dt = MS_DTYPE_BF16;
	ts[n].ndim = 2;
	ts[n].shape[0] = 0;
	ts[n].shape[1] = 5;
	ts[n].bytes = malloc(1);
	ts[n++].streamed = 0;

	for (size_t i = 0; i < MS_DTYPE_COUNT; i++) {
		char name[64], *path;

		snprintf(name, sizeof(name), "rt_%s.safetensors", ms_dtype_name(ts[i].dt));
		path = out_path(name);
		T_ASSERT_EQ_INT(write_tensors(path, &ts[i], 1, 1), 0);
		ms_free(path);
	}
	{
		char *path = out_path("rt_all.safetensors");

		T_ASSERT_EQ_INT(write_tensors(path, ts, n, 1), 0);
		ms_free(path);
	}
	T_ASSERT_EQ_INT(count_temporaries(T_TMP), 0);
	for (size_t i = 0; i < n; i++)
		free(ts[i].bytes);
	return 0;
}

/* The header the writer emits, read with a general JSON parser: keys,
 * dtypes, shapes and offsets as the format defines them. */
static int test_writer_header_is_plain_json(void)
{
	char *path = ms_path_join(T_TMP, "hdr.safetensors"), *text = NULL;
	uint64_t shape[2] = {3, 2};
	uint8_t data[24] = {1};
	struct ms_st_writer *w;
	struct ms_err err = {0};
	size_t len;
	uint64_t n = 0;
	cJSON *j, *e;

	T_ASSERT_EQ_INT(ms_st_writer_new(path, 0, &w, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_add(w, "w\"1", MS_DTYPE_F32, 2, shape, data, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_add(w, "w2", MS_DTYPE_F4, 1, shape + 1, data, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_commit(w, &err), MS_OK);
	ms_st_writer_free(w);
	T_ASSERT_EQ_INT(ms_file_read(path, 4096, &text, &len, &err), MS_OK);
	for (int k = 7; k >= 0; k--)
		n = n << 8 | (uint8_t)text[k];
	T_ASSERT_EQ_INT(len, 8 + n + 24 + 1);
	T_ASSERT(n % 8 == 0);
	text[8 + n] = 0;
	j = cJSON_Parse(text + 8);
	T_ASSERT(j && cJSON_GetArraySize(j) == 2);
	e = cJSON_GetObjectItemCaseSensitive(j, "w\"1");
	T_ASSERT(e);
	T_ASSERT_STR(cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring, "F32");
	T_ASSERT(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(e, "shape"), 0)->valuedouble == 3);
	T_ASSERT(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), 1)->valuedouble == 24);
	e = cJSON_GetObjectItemCaseSensitive(j, "w2");
	T_ASSERT_STR(cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring, "F4");
	T_ASSERT(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(e, "shape")) == 1);
	T_ASSERT(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), 0)->valuedouble == 24);
	T_ASSERT(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), 1)->valuedouble == 25);
	cJSON_Delete(j);
	ms_free(text);
	ms_free(path);
	return 0;
}

static int test_writer_refusals(void)
{
	char *path = ms_path_join(T_TMP, "w.safetensors");
	uint64_t shape[MS_ST_MAX_RANK + 1] = {2, 2, 1, 1, 1, 1, 1, 1, 1};
	uint64_t huge[3] = {UINT64_MAX / 2, 4, 1};
	char longname[MS_ST_MAX_NAME + 2];
	struct ms_st_writer *w;
	struct ms_err err = {0};
	uint8_t data[64] = {0};

	T_ASSERT_EQ_INT(ms_st_writer_new(path, 0, &w, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, "", MS_DTYPE_U8, 1, shape, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, "__metadata__", MS_DTYPE_U8, 1, shape, &err), MS_EINVAL);
	/* what the reader would refuse is never written */
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, "bad\xff", MS_DTYPE_U8, 1, shape, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_st_writer_meta(w, "k\xc0\x80", "v", &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_st_writer_meta(w, "k", "\xed\xa0\x80", &err), MS_EINVAL);
	memset(longname, 'x', sizeof(longname));
	longname[MS_ST_MAX_NAME + 1] = 0;
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, longname, MS_DTYPE_U8, 1, shape, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, "r9", MS_DTYPE_U8, MS_ST_MAX_RANK + 1, shape, &err),
			MS_EINVAL);
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, "dt", MS_DTYPE_COUNT, 1, shape, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, "odd", MS_DTYPE_F4, 1, (uint64_t[]){3}, &err),
			MS_EINVAL);
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, "huge", MS_DTYPE_U8, 3, huge, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "overflows"));
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, "a", MS_DTYPE_U8, 2, shape, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, "a", MS_DTYPE_U8, 2, shape, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "duplicate tensor name 'a'"));
	T_ASSERT_EQ_INT(ms_st_writer_meta(w, "k", "v", &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_meta(w, "k", "v2", &err), MS_EINVAL);
	/* 4 bytes declared: 3 written, then commit says what is missing */
	T_ASSERT_EQ_INT(ms_st_writer_data(w, data, 3, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_declare(w, "late", MS_DTYPE_U8, 1, shape, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_st_writer_meta(w, "late", "v", &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_st_writer_commit(w, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "tensor 'a' is missing 1 bytes"), "%s", err.msg);
	/* too much data */
	T_ASSERT_EQ_INT(ms_st_writer_data(w, data, 2, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "more data than the declared tensors hold"));
	/* freeing an uncommitted writer leaves neither output nor temporary */
	ms_st_writer_free(w);
	ms_st_writer_free(NULL);
	T_ASSERT(access(path, F_OK) != 0);
	T_ASSERT_EQ_INT(count_temporaries(T_TMP), 0);
	ms_free(path);
	return 0;
}

/* Never overwrite without force; with force, replace atomically. */
static int test_writer_no_overwrite(void)
{
	char *path = ms_path_join(T_TMP, "exists.safetensors");
	struct ms_st_writer *w;
	struct ms_st_file *f;
	struct ms_err err = {0};
	uint64_t shape[1] = {4};

	T_ASSERT_EQ_INT(ms_file_write_atomic(path, "keep", 4, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_new(path, 0, &w, &err), MS_EEXIST);
	T_ASSERT(strstr(err.msg, "exists.safetensors"));
	T_ASSERT_EQ_INT(ms_st_writer_new(path, 1, &w, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_add(w, "x", MS_DTYPE_U8, 1, shape, "abcd", &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_commit(w, &err), MS_OK);
	ms_st_writer_free(w);
	T_ASSERT_EQ_INT(ms_st_open(path, &f, &err), MS_OK);
	T_ASSERT(!memcmp(ms_st_find(f, "x")->data, "abcd", 4));
	ms_st_close(f);
	/* a file that appears while the writer works: the writer loses */
	unlink(path);
	T_ASSERT_EQ_INT(ms_st_writer_new(path, 0, &w, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_add(w, "x", MS_DTYPE_U8, 1, shape, "abcd", &err), MS_OK);
	T_ASSERT_EQ_INT(ms_file_write_atomic(path, "won", 3, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_writer_commit(w, &err), MS_EEXIST);
	ms_st_writer_free(w);
	{
		char *text;
		size_t len;

		T_ASSERT_EQ_INT(ms_file_read(path, 16, &text, &len, &err), MS_OK);
		T_ASSERT_STR(text, "won");
		ms_free(text);
	}
	T_ASSERT_EQ_INT(count_temporaries(T_TMP), 0);
	ms_free(path);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_dtype_table),
	T_CASE(test_dtype_nbytes),
	T_CASE(test_decode_every_8bit_code),
	T_CASE(test_decode_anchor_values),
	T_CASE(test_decode_f4),
	T_CASE(test_decode_f6),
	T_CASE(test_decode_wide_types),
	T_CASE(test_half_conversions),
	T_CASE(test_fixtures_match_truth),
	T_CASE(test_rule_length_field),
	T_CASE(test_rule_header_limit_exact),
	T_CASE(test_rule_utf8_and_json),
	T_CASE(test_rule_duplicates),
	T_CASE(test_rule_metadata),
	T_CASE(test_rule_entries),
	T_CASE(test_rule_numbers),
	T_CASE(test_rule_layout),
	T_CASE(test_rule_name_length),
	T_CASE(test_rule_tensor_count),
	T_CASE(test_accepts_valid_variants),
	T_CASE(test_open_paths),
	T_CASE(test_writer_roundtrip_every_dtype),
	T_CASE(test_writer_header_is_plain_json),
	T_CASE(test_writer_refusals),
	T_CASE(test_writer_no_overwrite),
};

T_MAIN(cases)
