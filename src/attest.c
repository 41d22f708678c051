/*
 * attest.c: OpenSSF Model Signing v1.0 (see attest.h for the byte layout):
 * EC keys and ECDSA through OpenSSL's EVP interface, DSSE envelopes, the
 * Sigstore bundle, the file manifest of a model directory, and a strict,
 * bounded JSON reader for the signature files, which come from outside.
 */
#include "attest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "fsutil.h"
#include "hash.h"
#include "pool.h"

#define KEY_MAX_BYTES (1u << 20)
#define JSON_MAX_DEPTH 16
#define JSON_MAX_VALUES (4u << 20)
#define DSSE_MAX_SIGS 64
#define HASH_BUF (4u << 20)

static const char *const git_ignores[] = {".git", ".gitattributes", ".github",
					  ".gitignore"};
#define NGIT (sizeof(git_ignores) / sizeof(git_ignores[0]))

/* ---- base64 (RFC 4648) ------------------------------------------------- */

static const char b64_alphabet[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64_encode(struct ms_buf *b, const uint8_t *p, size_t n)
{
	char q[4];

	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16;

		if (i + 1 < n)
			v |= (uint32_t)p[i + 1] << 8;
		if (i + 2 < n)
			v |= p[i + 2];
		q[0] = b64_alphabet[v >> 18 & 63];
		q[1] = b64_alphabet[v >> 12 & 63];
		q[2] = i + 1 < n ? b64_alphabet[v >> 6 & 63] : '=';
		q[3] = i + 2 < n ? b64_alphabet[v & 63] : '=';
		if (ms_buf_append(b, q, 4))
			return MS_ENOMEM;
	}
	return MS_OK;
}

static int b64_val(char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+' || c == '-')
		return 62;
	if (c == '/' || c == '_')
		return 63;
	return -1;
}

/* Strict decoder: the standard or URL-safe alphabet (proto3 JSON allows
 * both), padding optional but exact when present, no whitespace, unused
 * bits zero. Returns MS_OK, MS_EINVAL or MS_ENOMEM; *out has a NUL added. */
static int b64_decode(const char *s, size_t n, uint8_t **out, size_t *outlen)
{
	size_t pad = 0, full, rem, len, o = 0;
	uint8_t *d;

	*out = NULL;
	if (n % 4 == 0 && n >= 4) {
		if (s[n - 1] == '=')
			pad++;
		if (pad && s[n - 2] == '=')
			pad++;
		n -= pad;
	}
	rem = n % 4;
	if (rem == 1 || (pad && rem == 0))
		return MS_EINVAL;
	full = n / 4;
	len = full * 3 + (rem ? rem - 1 : 0);
	d = ms_malloc(len + 1);
	if (!d)
		return MS_ENOMEM;
	for (size_t i = 0; i < n; i += 4) {
		size_t k = n - i < 4 ? n - i : 4;
		uint32_t v = 0;

		for (size_t j = 0; j < 4; j++) {
			int c = j < k ? b64_val(s[i + j]) : 0;

			if (c < 0) {
				ms_free(d);
				return MS_EINVAL;
			}
			v = v << 6 | (uint32_t)c;
		}
		d[o++] = (uint8_t)(v >> 16);
		if (k > 2)
			d[o++] = (uint8_t)(v >> 8);
		if (k > 3)
			d[o++] = (uint8_t)v;
		/* non-canonical: bits past the last byte must be zero */
		if ((k == 2 && (v & 0xffff)) || (k == 3 && (v & 0xff))) {
			ms_free(d);
			return MS_EINVAL;
		}
	}
	d[o] = 0;
	*out = d;
	*outlen = o;
	return MS_OK;
}

/* ---- strict JSON reader (RFC 8259) -------------------------------------- */

/*
 * Why a reader of our own beside cJSON: the signature files come from
 * outside, and what a signed statement says must not depend on which
 * parser reads it. cJSON takes the first of two members of one name
 * (others take the last), accepts invalid UTF-8 and lone surrogates in
 * strings and has no bound on the values it allocates. This reader refuses
 * all of these, bounded in depth and values, and says at which byte.
 */

enum jtype { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };

struct jv {
	enum jtype type;
	char *key;            /* member name inside an object, else NULL */
	size_t keylen;
	char *str;            /* J_STR unescaped, NUL-ended */
	size_t len;
	struct jv *kids;      /* J_ARR items, J_OBJ members */
	size_t n;
};

struct jparser {
	const char *p, *end, *start;
	size_t values;
	const char *label;
	struct ms_err *err;
};

static void jv_release(struct jv *v)
{
	for (size_t i = 0; i < v->n; i++)
		jv_release(&v->kids[i]);
	ms_free(v->kids);
	ms_free(v->key);
	ms_free(v->str);
	memset(v, 0, sizeof(*v));
}

static int jerr(struct jparser *jp, const char *what)
{
	return ms_err_set(jp->err, MS_EINVAL, "'%s': malformed json at byte %zu: %s",
			  jp->label, (size_t)(jp->p - jp->start), what);
}

static int joom(struct jparser *jp)
{
	return ms_err_set(jp->err, MS_ENOMEM, "'%s': out of memory reading json",
			  jp->label);
}

static void jws(struct jparser *jp)
{
	while (jp->p < jp->end &&
	       (*jp->p == ' ' || *jp->p == '\t' || *jp->p == '\n' || *jp->p == '\r'))
		jp->p++;
}

static int hex4(const char *s, uint32_t *out)
{
	uint32_t v = 0;

	for (int i = 0; i < 4; i++) {
		char c = s[i];
		int d = c >= '0' && c <= '9' ? c - '0'
			: c >= 'a' && c <= 'f' ? c - 'a' + 10
			: c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;

		if (d < 0)
			return -1;
		v = v << 4 | (uint32_t)d;
	}
	*out = v;
	return 0;
}

/* Length of the valid UTF-8 sequence at p (at most n bytes), 0 if invalid:
 * no overlong forms, no surrogates, nothing past U+10FFFF. */
static size_t utf8_seq(const uint8_t *p, size_t n)
{
	uint8_t c = p[0];
	uint8_t lo = 0x80, hi = 0xbf;
	size_t len;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		if (c == 0xe0)
			lo = 0xa0;
		if (c == 0xed)
			hi = 0x9f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		if (c == 0xf0)
			lo = 0x90;
		if (c == 0xf4)
			hi = 0x8f;
	} else
		return 0;
	if (n < len || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	return len;
}

static int utf8_valid(const char *s, size_t n)
{
	const uint8_t *p = (const uint8_t *)s;

	for (size_t i = 0; i < n;) {
		size_t k = utf8_seq(p + i, n - i);

		if (!k)
			return 0;
		i += k;
	}
	return 1;
}

static size_t utf8_put(char *o, uint32_t cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
	o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* A string token at jp->p (the opening quote): unescaped into a new
 * buffer. An unescaped string is never longer than its source. */
static int jstring(struct jparser *jp, char **out, size_t *outlen)
{
	const char *s = jp->p + 1, *q = s;
	char *d, *o;

	while (q < jp->end && *q != '"') {
		if (*q == '\\') {
			/* a backslash last: unterminated, not the closing quote */
			if (q + 1 >= jp->end) {
				q = jp->end;
				break;
			}
			q++;
		}
		q++;
	}
	if (q >= jp->end) {
		jp->p = jp->end;
		return jerr(jp, "unterminated string");
	}
	d = o = ms_malloc((size_t)(q - s) + 1);
	if (!d)
		return joom(jp);
	jp->p = s;
	while (jp->p < q) {
		uint8_t c = (uint8_t)*jp->p;

		if (c < 0x20) {
			ms_free(d);
			return jerr(jp, "control character in string");
		}
		if (c != '\\') {
			size_t k = utf8_seq((const uint8_t *)jp->p, (size_t)(q - jp->p));

			if (!k) {
				ms_free(d);
				return jerr(jp, "invalid utf-8 in string");
			}
			memcpy(o, jp->p, k);
			o += k;
			jp->p += k;
			continue;
		}
		jp->p++;
		switch (*jp->p) {
		case '"': *o++ = '"'; break;
		case '\\': *o++ = '\\'; break;
		case '/': *o++ = '/'; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case 'n': *o++ = '\n'; break;
		case 'r': *o++ = '\r'; break;
		case 't': *o++ = '\t'; break;
		case 'u': {
			uint32_t cp, lo;

			if (q - jp->p < 5 || hex4(jp->p + 1, &cp)) {
				ms_free(d);
				return jerr(jp, "bad \\u escape");
			}
			jp->p += 4;
			if (cp >= 0xdc00 && cp <= 0xdfff) {
				ms_free(d);
				return jerr(jp, "lone low surrogate");
			}
			if (cp >= 0xd800 && cp <= 0xdbff) {
				if (q - jp->p < 7 || jp->p[1] != '\\' || jp->p[2] != 'u' ||
				    hex4(jp->p + 3, &lo) || lo < 0xdc00 || lo > 0xdfff) {
					ms_free(d);
					return jerr(jp, "unpaired high surrogate");
				}
				jp->p += 6;
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			}
			if (cp == 0) {
				ms_free(d);
				return jerr(jp, "NUL in string");
			}
			o += utf8_put(o, cp);
			break;
		}
		default:
			ms_free(d);
			return jerr(jp, "bad escape");
		}
		jp->p++;
	}
	*o = 0;
	jp->p = q + 1;
	*out = d;
	*outlen = (size_t)(o - d);
	return MS_OK;
}

static int jnumber(struct jparser *jp, struct jv *v)
{
	const char *p = jp->p;

#define DIGIT(c) ((c) >= '0' && (c) <= '9')
	if (p < jp->end && *p == '-')
		p++;
	if (p < jp->end && *p == '0')
		p++;
	else if (p < jp->end && DIGIT(*p))
		while (p < jp->end && DIGIT(*p))
			p++;
	else
		return jerr(jp, "bad number");
	if (p < jp->end && *p == '.') {
		p++;
		if (p >= jp->end || !DIGIT(*p))
			return jerr(jp, "bad number");
		while (p < jp->end && DIGIT(*p))
			p++;
	}
	if (p < jp->end && (*p == 'e' || *p == 'E')) {
		p++;
		if (p < jp->end && (*p == '+' || *p == '-'))
			p++;
		if (p >= jp->end || !DIGIT(*p))
			return jerr(jp, "bad number");
		while (p < jp->end && DIGIT(*p))
			p++;
	}
#undef DIGIT
	/* No member OMS reads is a number: check the form, keep nothing. */
	v->type = J_NUM;
	jp->p = p;
	return MS_OK;
}

static int jv_keycmp(const void *a, const void *b)
{
	const struct jv *x = *(const struct jv *const *)a;
	const struct jv *y = *(const struct jv *const *)b;
	size_t n = x->keylen < y->keylen ? x->keylen : y->keylen;
	int c = memcmp(x->key, y->key, n);

	if (c)
		return c;
	return x->keylen < y->keylen ? -1 : x->keylen > y->keylen;
}

static int jdupcheck(struct jparser *jp, struct jv *v)
{
	struct jv **s;
	int rc = MS_OK;

	if (v->n < 2)
		return MS_OK;
	s = ms_malloc(v->n * sizeof(*s));
	if (!s)
		return joom(jp);
	for (size_t i = 0; i < v->n; i++)
		s[i] = &v->kids[i];
	qsort(s, v->n, sizeof(*s), jv_keycmp);
	for (size_t i = 1; i < v->n; i++)
		if (!jv_keycmp(&s[i - 1], &s[i])) {
			rc = ms_err_set(jp->err, MS_EINVAL,
					"'%s': malformed json: duplicate key '%s'",
					jp->label, s[i]->key);
			break;
		}
	ms_free(s);
	return rc;
}

static int jvalue(struct jparser *jp, struct jv *v, int depth);

static int jcontainer(struct jparser *jp, struct jv *v, int depth)
{
	int obj = *jp->p == '{';
	char close = obj ? '}' : ']';
	size_t cap = 0;
	int rc;

	v->type = obj ? J_OBJ : J_ARR;
	if (depth >= JSON_MAX_DEPTH)
		return jerr(jp, "nesting too deep");
	jp->p++;
	jws(jp);
	if (jp->p < jp->end && *jp->p == close) {
		jp->p++;
		return MS_OK;
	}
	for (;;) {
		struct jv *k;

		if (v->n == cap) {
			size_t ncap = cap ? cap * 2 : 4;
			struct jv *nk = ms_realloc(v->kids, ncap * sizeof(*nk));

			if (!nk)
				return joom(jp);
			v->kids = nk;
			cap = ncap;
		}
		k = &v->kids[v->n];
		memset(k, 0, sizeof(*k));
		v->n++;
		if (obj) {
			if (jp->p >= jp->end || *jp->p != '"')
				return jerr(jp, "expected a member name");
			if ((rc = jstring(jp, &k->key, &k->keylen)) != MS_OK)
				return rc;
			jws(jp);
			if (jp->p >= jp->end || *jp->p != ':')
				return jerr(jp, "expected ':'");
			jp->p++;
			jws(jp);
		}
		if ((rc = jvalue(jp, k, depth + 1)) != MS_OK)
			return rc;
		jws(jp);
		if (jp->p < jp->end && *jp->p == ',') {
			jp->p++;
			jws(jp);
			continue;
		}
		if (jp->p < jp->end && *jp->p == close) {
			jp->p++;
			break;
		}
		return jerr(jp, obj ? "expected ',' or '}'" : "expected ',' or ']'");
	}
	return obj ? jdupcheck(jp, v) : MS_OK;
}

static int jlit(struct jparser *jp, const char *lit, enum jtype t, struct jv *v)
{
	size_t n = strlen(lit);

	if ((size_t)(jp->end - jp->p) < n || memcmp(jp->p, lit, n))
		return jerr(jp, "unexpected token");
	jp->p += n;
	v->type = t;
	return MS_OK;
}

static int jvalue(struct jparser *jp, struct jv *v, int depth)
{
	if (++jp->values > JSON_MAX_VALUES)
		return jerr(jp, "too many values");
	if (jp->p >= jp->end)
		return jerr(jp, "unexpected end");
	switch (*jp->p) {
	case '{':
	case '[':
		return jcontainer(jp, v, depth);
	case '"':
		v->type = J_STR;
		return jstring(jp, &v->str, &v->len);
	case 't':
		return jlit(jp, "true", J_TRUE, v);
	case 'f':
		return jlit(jp, "false", J_FALSE, v);
	case 'n':
		return jlit(jp, "null", J_NULL, v);
	case '-':
	case '0': case '1': case '2': case '3': case '4':
	case '5': case '6': case '7': case '8': case '9':
		return jnumber(jp, v);
	default:
		return jerr(jp, "unexpected character");
	}
}

/* Parse n bytes of JSON into root (released by the caller, also on error). */
static int json_parse(const char *s, size_t n, const char *label, struct jv *root,
		      struct ms_err *err)
{
	struct jparser jp = {s, s + n, s, 0, label, err};
	int rc;

	memset(root, 0, sizeof(*root));
	jws(&jp);
	if ((rc = jvalue(&jp, root, 0)) != MS_OK)
		return rc;
	jws(&jp);
	if (jp.p != jp.end)
		return jerr(&jp, "trailing data after the value");
	return MS_OK;
}

static const struct jv *jget(const struct jv *obj, const char *key)
{
	size_t n = strlen(key);

	if (!obj || obj->type != J_OBJ)
		return NULL;
	for (size_t i = 0; i < obj->n; i++)
		if (obj->kids[i].keylen == n && !memcmp(obj->kids[i].key, key, n))
			return &obj->kids[i];
	return NULL;
}

/* The string member key of obj, or NULL (absent or not a string). */
static const char *jgets(const struct jv *obj, const char *key)
{
	const struct jv *v = jget(obj, key);

	return v && v->type == J_STR ? v->str : NULL;
}

/* ---- JSON writing ------------------------------------------------------- */

static int json_put_str(struct ms_buf *b, const char *s)
{
	ms_buf_puts(b, "\"");
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		switch (*p) {
		case '"': ms_buf_puts(b, "\\\""); break;
		case '\\': ms_buf_puts(b, "\\\\"); break;
		case '\n': ms_buf_puts(b, "\\n"); break;
		case '\r': ms_buf_puts(b, "\\r"); break;
		case '\t': ms_buf_puts(b, "\\t"); break;
		case '\b': ms_buf_puts(b, "\\b"); break;
		case '\f': ms_buf_puts(b, "\\f"); break;
		default:
			if (*p < 0x20)
				ms_buf_printf(b, "\\u%04x", *p);
			else
				ms_buf_append(b, p, 1);
		}
	}
	return ms_buf_puts(b, "\"");
}

/* ---- keys --------------------------------------------------------------- */

struct ms_key {
	EVP_PKEY *pkey;
	const EVP_MD *md;
	char curve[32];
};

/* Never prompt on a terminal for a pass phrase: an encrypted key fails. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
	(void)buf; (void)size; (void)rwflag; (void)u;
	return -1;
}

static int key_check(struct ms_key *k, const char *path, struct ms_err *err)
{
	size_t len = 0;

	if (EVP_PKEY_get_base_id(k->pkey) != EVP_PKEY_EC)
		return ms_err_set(err, MS_EINVAL,
				  "'%s': unsupported key type (OMS keys are EC P-256, P-384 or P-521)",
				  path);
	if (!EVP_PKEY_get_utf8_string_param(k->pkey, OSSL_PKEY_PARAM_GROUP_NAME,
					    k->curve, sizeof(k->curve), &len))
		return ms_err_set(err, MS_EINVAL, "'%s': EC key without a named curve",
				  path);
	/* The hash follows the curve size, as the reference does. */
	if (!strcmp(k->curve, "prime256v1"))
		k->md = EVP_sha256();
	else if (!strcmp(k->curve, "secp384r1"))
		k->md = EVP_sha384();
	else if (!strcmp(k->curve, "secp521r1"))
		k->md = EVP_sha512();
	else
		return ms_err_set(err, MS_EINVAL,
				  "'%s': unsupported curve '%s' (OMS accepts P-256, P-384, P-521)",
				  path, k->curve);
	return MS_OK;
}

static int key_load(const char *path, int private, struct ms_key **out,
		    struct ms_err *err)
{
	struct ms_key *k = NULL;
	char *text = NULL;
	size_t len = 0;
	BIO *bio = NULL;
	int rc;

	*out = NULL;
	if ((rc = ms_file_read(path, KEY_MAX_BYTES, &text, &len, err)) != MS_OK)
		goto out;
	k = ms_calloc(1, sizeof(*k));
	bio = BIO_new_mem_buf(text, (int)len);
	if (!k || !bio) {
		rc = ms_err_nomem(err);
		goto out;
	}
	k->pkey = private ? PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL)
			  : PEM_read_bio_PUBKEY(bio, NULL, no_passphrase, NULL);
	ERR_clear_error();
	if (!k->pkey) {
		if (private && strstr(text, "ENCRYPTED"))
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': encrypted private keys are not supported", path);
		else
			rc = ms_err_set(err, MS_EINVAL, "'%s': not a PEM %s key", path,
					private ? "private" : "public (SubjectPublicKeyInfo)");
		goto out;
	}
	if ((rc = key_check(k, path, err)) != MS_OK)
		goto out;
	*out = k;
	k = NULL;
out:
	BIO_free(bio);
	if (text) {
		OPENSSL_cleanse(text, len);
		ms_free(text);
	}
	ms_key_free(k);
	return rc;
}

int ms_key_load_private(const char *path, struct ms_key **out, struct ms_err *err)
{
	return key_load(path, 1, out, err);
}

int ms_key_load_public(const char *path, struct ms_key **out, struct ms_err *err)
{
	return key_load(path, 0, out, err);
}

void ms_key_free(struct ms_key *k)
{
	if (!k)
		return;
	EVP_PKEY_free(k->pkey);
	ms_free(k);
}

const char *ms_key_curve(const struct ms_key *k)
{
	return k->curve;
}

int ms_key_hint(const struct ms_key *k, char hint[MS_OMS_HEX_LEN],
		struct ms_err *err)
{
	BIO *bio = BIO_new(BIO_s_mem());
	uint8_t d[MS_SHA256_LEN];
	char *pem = NULL;
	long n;
	int rc = MS_OK;

	if (!bio || !PEM_write_bio_PUBKEY(bio, k->pkey)) {
		ERR_clear_error();
		rc = ms_err_set(err, MS_ENOMEM, "cannot encode the public key");
		goto out;
	}
	n = BIO_get_mem_data(bio, &pem);
	if (n <= 0 || ms_sha256(pem, (size_t)n, d) != MS_OK) {
		rc = ms_err_set(err, MS_EIO, "cannot hash the public key");
		goto out;
	}
	ms_hex(d, sizeof(d), hint);
out:
	BIO_free(bio);
	return rc;
}

/* ---- DSSE --------------------------------------------------------------- */

int ms_dsse_pae(const char *type, const void *body, size_t n, uint8_t **out,
		size_t *outlen)
{
	struct ms_buf b;

	ms_buf_init(&b);
	ms_buf_printf(&b, "DSSEv1 %zu %s %zu ", strlen(type), type, n);
	ms_buf_append(&b, body, n);
	*out = (uint8_t *)ms_buf_detach(&b, outlen);
	return *out ? MS_OK : MS_ENOMEM;
}

static int ecdsa_sign(const struct ms_key *k, const uint8_t *msg, size_t n,
		      uint8_t **sig, size_t *siglen, struct ms_err *err)
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	uint8_t *s = NULL;
	size_t len = 0;
	int rc = MS_OK;

	*sig = NULL;
	if (!ctx || EVP_DigestSignInit(ctx, NULL, k->md, NULL, k->pkey) != 1 ||
	    EVP_DigestSign(ctx, NULL, &len, msg, n) != 1) {
		rc = ms_err_set(err, MS_EINVAL, "cannot sign with this key (is it a private key?)");
		goto out;
	}
	s = ms_malloc(len);
	if (!s) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (EVP_DigestSign(ctx, s, &len, msg, n) != 1) {
		rc = ms_err_set(err, MS_EIO, "ecdsa signing failed");
		goto out;
	}
	*sig = s;
	*siglen = len;
	s = NULL;
out:
	ERR_clear_error();
	ms_free(s);
	EVP_MD_CTX_free(ctx);
	return rc;
}

/* 1 when sig is a valid DER ECDSA signature of msg by k, else 0. */
static int ecdsa_verify(const struct ms_key *k, const uint8_t *msg, size_t n,
			const uint8_t *sig, size_t siglen)
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int ok = 0;

	if (ctx && EVP_DigestVerifyInit(ctx, NULL, k->md, NULL, k->pkey) == 1)
		ok = EVP_DigestVerify(ctx, sig, siglen, msg, n) == 1;
	ERR_clear_error();
	EVP_MD_CTX_free(ctx);
	return ok;
}

/* The envelope object of a bundle or of a bare DSSE file, as JSON. */
static int envelope_write(struct ms_buf *b, const void *payload, size_t n,
			  const char *payload_type, const struct ms_key *key,
			  struct ms_err *err)
{
	uint8_t *pae = NULL, *sig = NULL;
	size_t pae_len = 0, sig_len = 0;
	int rc;

	if ((rc = ms_dsse_pae(payload_type, payload, n, &pae, &pae_len)) != MS_OK) {
		ms_err_set(err, rc, "out of memory");
		goto out;
	}
	if ((rc = ecdsa_sign(key, pae, pae_len, &sig, &sig_len, err)) != MS_OK)
		goto out;
	ms_buf_puts(b, "{\"payload\":\"");
	b64_encode(b, payload, n);
	ms_buf_puts(b, "\",\"payloadType\":");
	json_put_str(b, payload_type);
	ms_buf_puts(b, ",\"signatures\":[{\"sig\":\"");
	b64_encode(b, sig, sig_len);
	ms_buf_puts(b, "\",\"keyid\":\"\"}]}");
	if (b->oom)
		rc = ms_err_nomem(err);
out:
	ms_free(pae);
	ms_free(sig);
	return rc;
}

/* Check an envelope object: some signature must verify with pub. */
static int envelope_check(const struct jv *env, const char *label,
			  const struct ms_key *pub, uint8_t **payload,
			  size_t *payload_len, char **payload_type,
			  enum ms_oms_fail *fail, struct ms_err *err)
{
	const struct jv *sigs = jget(env, "signatures");
	const char *p64 = jgets(env, "payload"), *ptype = jgets(env, "payloadType");
	uint8_t *body = NULL, *pae = NULL;
	size_t body_len = 0, pae_len = 0;
	int rc = MS_OK, ok = 0;

	*payload = NULL;
	*payload_type = NULL;
	if (!env || env->type != J_OBJ || !p64 || !ptype || !sigs ||
	    sigs->type != J_ARR) {
		rc = ms_err_set(err, MS_EINVAL,
				"'%s': dsse envelope needs string payload, payloadType and an array signatures",
				label);
		goto out;
	}
	if (sigs->n == 0 || sigs->n > DSSE_MAX_SIGS) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': dsse envelope has %zu signatures (1..%d)",
				label, sigs->n, DSSE_MAX_SIGS);
		goto out;
	}
	if ((rc = b64_decode(p64, strlen(p64), &body, &body_len)) != MS_OK) {
		ms_err_set(err, rc, "'%s': dsse payload is not base64", label);
		goto out;
	}
	if ((rc = ms_dsse_pae(ptype, body, body_len, &pae, &pae_len)) != MS_OK) {
		ms_err_set(err, rc, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < sigs->n; i++) {
		const struct jv *s = &sigs->kids[i];
		const char *s64 = jgets(s, "sig");
		const struct jv *kid = jget(s, "keyid");
		uint8_t *raw = NULL;
		size_t raw_len = 0;

		if (s->type != J_OBJ || !s64 || (kid && kid->type != J_STR)) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': dsse signature %zu needs a string sig", label, i);
			goto out;
		}
		if ((rc = b64_decode(s64, strlen(s64), &raw, &raw_len)) != MS_OK) {
			ms_err_set(err, rc, "'%s': dsse signature %zu is not base64", label, i);
			goto out;
		}
		if (!ok)
			ok = raw_len > 0 && ecdsa_verify(pub, pae, pae_len, raw, raw_len);
		ms_free(raw);
	}
	if (!ok) {
		*fail = MS_OMS_FAIL_SIGNATURE;
		rc = ms_err_set(err, MS_ECHECK,
				"'%s': bad signature (not made by this key over this payload)",
				label);
		goto out;
	}
	*payload_type = ms_strdup(ptype);
	if (!*payload_type) {
		rc = ms_err_nomem(err);
		goto out;
	}
	*payload = body;
	*payload_len = body_len;
	body = NULL;
out:
	ms_free(body);
	ms_free(pae);
	return rc;
}

int ms_dsse_sign(const void *payload, size_t n, const char *payload_type,
		 const struct ms_key *key, char **envelope, size_t *len,
		 struct ms_err *err)
{
	struct ms_buf b;
	int rc;

	ms_buf_init(&b);
	*envelope = NULL;
	if ((rc = envelope_write(&b, payload, n, payload_type, key, err)) != MS_OK)
		goto out;
	*envelope = ms_buf_detach(&b, len);
	if (!*envelope)
		rc = ms_err_nomem(err);
out:
	ms_buf_release(&b);
	return rc;
}

int ms_dsse_verify(const char *envelope, size_t n, const char *label,
		   const struct ms_key *pub, uint8_t **payload,
		   size_t *payload_len, char **payload_type, struct ms_err *err)
{
	enum ms_oms_fail fail = MS_OMS_FAIL_NONE;
	struct jv root;
	int rc;

	*payload = NULL;
	*payload_type = NULL;
	if (n > MS_OMS_MAX_SIG)
		return ms_err_set(err, MS_EINVAL, "'%s': envelope larger than %u bytes",
				  label, MS_OMS_MAX_SIG);
	if ((rc = json_parse(envelope, n, label, &root, err)) == MS_OK)
		rc = envelope_check(&root, label, pub, payload, payload_len,
				    payload_type, &fail, err);
	jv_release(&root);
	return rc;
}

int ms_sigstore_sign(const void *payload, size_t n, const char *payload_type,
		   const struct ms_key *key, char **bundle, size_t *len,
		   struct ms_err *err)
{
	char hint[MS_OMS_HEX_LEN];
	struct ms_buf b;
	int rc;

	ms_buf_init(&b);
	*bundle = NULL;
	if ((rc = ms_key_hint(key, hint, err)) != MS_OK)
		goto out;
	/* Member order and layout as the reference writes them. */
	ms_buf_puts(&b, "{\"mediaType\":\"" MS_OMS_BUNDLE_MEDIA_TYPE "\","
		    "\"verificationMaterial\":{\"publicKey\":{\"hint\":\"");
	ms_buf_puts(&b, hint);
	ms_buf_puts(&b, "\"},\"tlogEntries\":[]},\"dsseEnvelope\":");
	if ((rc = envelope_write(&b, payload, n, payload_type, key, err)) != MS_OK)
		goto out;
	ms_buf_puts(&b, "}");
	*bundle = ms_buf_detach(&b, len);
	if (!*bundle)
		rc = ms_err_nomem(err);
out:
	ms_buf_release(&b);
	return rc;
}

static int bundle_check(const char *bundle, size_t n, const char *label,
			const struct ms_key *pub, uint8_t **payload,
			size_t *payload_len, char **payload_type,
			enum ms_oms_fail *fail, char hint_out[MS_OMS_HEX_LEN],
			struct ms_err *err)
{
	const struct jv *vm, *pk, *tlog, *env;
	const char *media, *hint;
	char want[MS_OMS_HEX_LEN];
	struct jv root;
	int rc;

	*payload = NULL;
	*payload_type = NULL;
	if (n > MS_OMS_MAX_SIG)
		return ms_err_set(err, MS_EINVAL, "'%s': signature larger than %u bytes",
				  label, MS_OMS_MAX_SIG);
	if ((rc = json_parse(bundle, n, label, &root, err)) != MS_OK)
		goto out;
	if (root.type != J_OBJ) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': bundle is not a json object", label);
		goto out;
	}
	media = jgets(&root, "mediaType");
	if (!media || strcmp(media, MS_OMS_BUNDLE_MEDIA_TYPE)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': bundle media type is '%s', not '%s'",
				label, media ? media : "(none)", MS_OMS_BUNDLE_MEDIA_TYPE);
		goto out;
	}
	vm = jget(&root, "verificationMaterial");
	pk = jget(vm, "publicKey");
	tlog = jget(vm, "tlogEntries");
	if (!vm || vm->type != J_OBJ || !pk || pk->type != J_OBJ ||
	    (tlog && tlog->type != J_ARR)) {
		rc = ms_err_set(err, MS_EINVAL,
				"'%s': bundle has no public key identifier (only key-signed bundles are supported)",
				label);
		goto out;
	}
	hint = jgets(pk, "hint");
	if (jget(pk, "hint") && !hint && jget(pk, "hint")->type != J_NULL) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': public key hint is not a string", label);
		goto out;
	}
	if ((rc = ms_key_hint(pub, want, err)) != MS_OK)
		goto out;
	if (hint_out)
		memcpy(hint_out, want, MS_OMS_HEX_LEN);
	/* An empty or absent hint is the older format: nothing to compare. */
	if (hint && *hint && strcmp(hint, want)) {
		*fail = MS_OMS_FAIL_KEY;
		rc = ms_err_set(err, MS_ECHECK,
				"'%s': signed with another key (hint %.16s..., this key %.16s...)",
				label, hint, want);
		goto out;
	}
	env = jget(&root, "dsseEnvelope");
	if (!env || env->type != J_OBJ) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': bundle has no dsseEnvelope", label);
		goto out;
	}
	rc = envelope_check(env, label, pub, payload, payload_len, payload_type, fail,
			    err);
out:
	jv_release(&root);
	return rc;
}

int ms_sigstore_verify(const char *bundle, size_t n, const char *label,
		     const struct ms_key *pub, uint8_t **payload,
		     size_t *payload_len, char **payload_type, struct ms_err *err)
{
	enum ms_oms_fail fail = MS_OMS_FAIL_NONE;

	return bundle_check(bundle, n, label, pub, payload, payload_len, payload_type,
			    &fail, NULL, err);
}

/* ---- paths -------------------------------------------------------------- */

int ms_oms_path_cmp(const char *a, const char *b)
{
	const unsigned char *x = (const unsigned char *)a;
	const unsigned char *y = (const unsigned char *)b;

	/* Rank the end of the path below '/', and '/' below every byte:
	 * that orders paths as lists of components. */
	for (;; x++, y++) {
		int cx = *x ? (*x == '/' ? 0 : *x + 1) : -1;
		int cy = *y ? (*y == '/' ? 0 : *y + 1) : -1;

		if (cx != cy)
			return cx < cy ? -1 : 1;
		if (cx < 0)
			return 0;
	}
}

char *ms_oms_model_name(const char *model_dir)
{
	const char *p = model_dir, *last = NULL;
	size_t last_len = 0;
	char *real, *name;

	/* The last component that is neither empty nor ".", as pathlib. */
	while (*p) {
		const char *s = p;

		while (*p && *p != '/')
			p++;
		if (p > s && !(p - s == 1 && *s == '.')) {
			last = s;
			last_len = (size_t)(p - s);
		}
		while (*p == '/')
			p++;
	}
	if (last && !(last_len == 2 && !memcmp(last, "..", 2)))
		return ms_strndup(last, last_len);
	real = realpath(model_dir, NULL);
	if (!real)
		return ms_strdup("");
	name = ms_strdup(ms_path_base(real));
	free(real);
	return name;
}

/* A relative path as PurePosixPath prints it: empty and "." components
 * dropped. NULL when it is absolute or has "..": such an ignore entry can
 * never match a file found under the model. *empty when nothing is left. */
static char *path_norm(const char *in, int *empty)
{
	struct ms_buf b;
	const char *p = in;

	*empty = 0;
	if (*in == '/')
		return NULL;
	ms_buf_init(&b);
	while (*p) {
		const char *s = p;

		while (*p && *p != '/')
			p++;
		if (p - s == 2 && !memcmp(s, "..", 2)) {
			ms_buf_release(&b);
			return NULL;
		}
		if (p > s && !(p - s == 1 && *s == '.')) {
			if (b.len)
				ms_buf_puts(&b, "/");
			ms_buf_append(&b, s, (size_t)(p - s));
		}
		while (*p == '/')
			p++;
	}
	if (!b.len)
		*empty = 1;
	return ms_buf_detach(&b, NULL);
}

/* Is rel the path prefix, or below it (component-wise)? */
static int path_under(const char *rel, const char *prefix)
{
	size_t n = strlen(prefix);

	return !strncmp(rel, prefix, n) && (rel[n] == 0 || rel[n] == '/');
}

/* A resource name the reference would have written: relative, canonical. */
static int path_canonical(const char *s, size_t len)
{
	const char *p = s;

	if (!len || strlen(s) != len || *s == '/')
		return 0;
	while (*p) {
		const char *c = p;

		while (*p && *p != '/')
			p++;
		if (p == c || (p - c == 1 && *c == '.') ||
		    (p - c == 2 && c[0] == '.' && c[1] == '.'))
			return 0;
		if (*p == '/') {
			p++;
			if (!*p)
				return 0;
		}
	}
	return 1;
}

/* The path of sig relative to the model's real path when it lies inside
 * it (so that it is not signed), else NULL. */
static char *sig_rel_path(const char *model_dir, const char *sig_path)
{
	char *root = realpath(model_dir, NULL), *real = realpath(sig_path, NULL);
	char *sig = NULL, *rel = NULL;
	size_t n;

	if (real) {
		sig = ms_strdup(real);
	} else {
		/* Not written yet: its directory's real path and its name. */
		char *copy = ms_strdup(sig_path);
		char *dir = copy ? realpath(dirname(copy), NULL) : NULL;

		if (dir)
			sig = ms_path_join(dir, ms_path_base(sig_path));
		free(dir);
		ms_free(copy);
	}
	if (root && sig) {
		n = strlen(root);
		if (n == 1)
			n = 0; /* the model is "/" */
		if (!strncmp(sig, root, n) && sig[n] == '/' && sig[n + 1])
			rel = ms_strdup(sig + n + 1);
	}
	free(root);
	free(real);
	ms_free(sig);
	return rel;
}

/* ---- the manifest ------------------------------------------------------- */

struct scan {
	struct ms_oms_manifest *m;
	const char *root;
	size_t cap;
	struct ms_err *err;
};

static int is_ignored(const struct ms_oms_manifest *m, const char *rel)
{
	for (size_t i = 0; i < m->nignore; i++)
		if (path_under(rel, m->ignore[i]))
			return 1;
	return 0;
}

static int scan_add(struct scan *s, const char *rel, uint64_t size)
{
	struct ms_oms_manifest *m = s->m;

	if (!utf8_valid(rel, strlen(rel)))
		return ms_err_set(s->err, MS_EINVAL,
				  "'%s' in '%s': file name is not valid utf-8", rel, s->root);
	if (m->nfiles >= MS_OMS_MAX_FILES)
		return ms_err_set(s->err, MS_EINVAL, "'%s': more than %u files", s->root,
				  MS_OMS_MAX_FILES);
	if (m->nfiles == s->cap) {
		size_t ncap = s->cap ? s->cap * 2 : 64;
		struct ms_oms_file *f = ms_realloc(m->files, ncap * sizeof(*f));

		if (!f)
			return ms_err_set(s->err, MS_ENOMEM, "out of memory");
		m->files = f;
		s->cap = ncap;
	}
	m->files[m->nfiles].name = ms_strdup(rel);
	if (!m->files[m->nfiles].name)
		return ms_err_set(s->err, MS_ENOMEM, "out of memory");
	m->files[m->nfiles].size = size;
	memset(m->files[m->nfiles].digest, 0, MS_SHA256_LEN);
	m->nfiles++;
	m->total_bytes += size;
	return MS_OK;
}

/* Walk the whole tree, ignored parts too: the reference refuses a link
 * anywhere, and so must we to accept and refuse the same models. */
static int scan_dir(struct scan *s, const char *abs, const char *rel, int depth)
{
	DIR *d = NULL;
	struct dirent *e;
	char *crel = NULL, *cabs = NULL;
	int rc = MS_OK;

	if (depth > MS_OMS_MAX_DEPTH)
		return ms_err_set(s->err, MS_EINVAL, "'%s' in '%s': directories nested deeper than %d",
				  rel, s->root, MS_OMS_MAX_DEPTH);
	d = opendir(abs);
	if (!d)
		return ms_err_set(s->err, MS_EIO, "'%s': cannot open directory: %s", abs,
				  strerror(errno));
	for (;;) {
		struct stat st;

		errno = 0;
		e = readdir(d);
		if (!e) {
			if (errno)
				rc = ms_err_set(s->err, MS_EIO, "'%s': cannot read directory: %s",
						abs, strerror(errno));
			break;
		}
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		crel = rel ? ms_asprintf("%s/%s", rel, e->d_name) : ms_strdup(e->d_name);
		cabs = ms_path_join(abs, e->d_name);
		if (!crel || !cabs) {
			rc = ms_err_set(s->err, MS_ENOMEM, "out of memory");
			break;
		}
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW)) {
			rc = ms_err_set(s->err, MS_EIO, "'%s': cannot stat: %s", cabs,
					strerror(errno));
			break;
		}
		if (S_ISLNK(st.st_mode)) {
			rc = ms_err_set(s->err, MS_EINVAL,
					"'%s' in '%s': symbolic link (signed models hold regular files only)",
					crel, s->root);
			break;
		}
		if (S_ISDIR(st.st_mode))
			rc = scan_dir(s, cabs, crel, depth + 1);
		else if (S_ISREG(st.st_mode))
			rc = is_ignored(s->m, crel) ? MS_OK
						    : scan_add(s, crel, (uint64_t)st.st_size);
		else
			rc = ms_err_set(s->err, MS_EINVAL,
					"'%s' in '%s': special file (not a regular file or directory)",
					crel, s->root);
		if (rc != MS_OK)
			break;
		ms_free(crel);
		ms_free(cabs);
		crel = cabs = NULL;
	}
	ms_free(crel);
	ms_free(cabs);
	closedir(d);
	return rc;
}

static int file_cmp(const void *a, const void *b)
{
	return ms_oms_path_cmp(((const struct ms_oms_file *)a)->name,
			       ((const struct ms_oms_file *)b)->name);
}

void ms_oms_manifest_free(struct ms_oms_manifest *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->nfiles; i++)
		ms_free(m->files[i].name);
	for (size_t i = 0; i < m->nignore; i++)
		ms_free(m->ignore[i]);
	ms_free(m->files);
	ms_free(m->ignore);
	ms_free(m->model_name);
	ms_free(m);
}

/* A copy of model_dir without trailing slashes, so that lstat sees a link
 * to a directory as the link (pathlib drops them too). */
static char *strip_slashes(const char *p)
{
	size_t n = strlen(p);

	while (n > 1 && p[n - 1] == '/')
		n--;
	return ms_strndup(p, n);
}

int ms_oms_manifest_scan(const char *model_dir, const char *const *ignore,
			 size_t nignore, struct ms_oms_manifest **out,
			 struct ms_err *err)
{
	struct ms_oms_manifest *m = NULL;
	struct scan s = {0};
	struct stat st;
	char *root = NULL;
	int rc = MS_OK;

	*out = NULL;
	root = strip_slashes(model_dir);
	m = ms_calloc(1, sizeof(*m));
	if (!root || !m) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (lstat(root, &st)) {
		rc = ms_err_set(err, errno == ENOENT ? MS_ENOTFOUND : MS_EIO,
				"'%s': cannot open model: %s", model_dir, strerror(errno));
		goto out;
	}
	if (S_ISLNK(st.st_mode)) {
		rc = ms_err_set(err, MS_EINVAL,
				"'%s': model path is a symbolic link (give the real directory)",
				model_dir);
		goto out;
	}
	if (!S_ISDIR(st.st_mode)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': model is not a directory", model_dir);
		goto out;
	}
	m->model_name = ms_oms_model_name(model_dir);
	m->ignore = ms_calloc(nignore ? nignore : 1, sizeof(*m->ignore));
	if (!m->model_name || !m->ignore) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < nignore; i++) {
		int empty;
		char *p = path_norm(ignore[i], &empty);

		if (!p)
			continue;
		if (empty) {
			ms_free(p);
			rc = ms_err_set(err, MS_EINVAL,
					"ignore path '%s' would ignore the whole model", ignore[i]);
			goto out;
		}
		m->ignore[m->nignore++] = p;
	}
	s.m = m;
	s.root = model_dir;
	s.err = err;
	if ((rc = scan_dir(&s, root, NULL, 0)) != MS_OK)
		goto out;
	qsort(m->files, m->nfiles, sizeof(*m->files), file_cmp);
	*out = m;
	m = NULL;
out:
	ms_free(root);
	ms_oms_manifest_free(m);
	return rc;
}

/* ---- parallel hashing ---------------------------------------------------- */

/* What the pool's jobs share (ms_pool.ctx). */
struct hpool {
	struct ms_oms_manifest *m;
	const char *root;
	size_t *order;          /* file indexes, largest first */
	uint64_t done;          /* atomic: bytes hashed */
	const struct ms_oms_opts *opts;
};

static int hash_one(struct ms_pool *pool, struct ms_oms_file *f, uint8_t *buf,
		    struct ms_err *err)
{
	struct ms_sha256_ctx *c = NULL;
	struct hpool *hp = pool->ctx;
	char *path = ms_path_join(hp->root, f->name);
	uint64_t got = 0;
	struct stat st;
	int fd = -1, rc = MS_OK;

	if (!path || !(c = ms_sha256_new())) {
		rc = ms_err_nomem(err);
		goto out;
	}
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		rc = ms_err_set(err, MS_EIO, "'%s': cannot open: %s", path, strerror(errno));
		goto out;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != f->size) {
		rc = ms_err_set(err, MS_EIO, "'%s': file changed while the model was read",
				path);
		goto out;
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	for (;;) {
		ssize_t r = read(fd, buf, HASH_BUF);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 || ms_fault("read")) {
			rc = ms_err_set(err, MS_EIO, "'%s': read failed: %s", path,
					strerror(r < 0 ? errno : EIO));
			goto out;
		}
		if (r == 0)
			break;
		got += (uint64_t)r;
		if (got > f->size)
			break;
		if ((rc = ms_sha256_update(c, buf, (size_t)r)) != MS_OK) {
			ms_err_set(err, rc, "'%s': sha256 failed", path);
			goto out;
		}
		__atomic_add_fetch(&hp->done, (uint64_t)r, __ATOMIC_RELAXED);
		if (ms_pool_stopping(pool))
			goto out;
	}
	if (got != f->size) {
		rc = ms_err_set(err, MS_EIO, "'%s': file changed while the model was read",
				path);
		goto out;
	}
	if ((rc = ms_sha256_final(c, f->digest)) != MS_OK)
		ms_err_set(err, rc, "'%s': sha256 failed", path);
out:
	if (fd >= 0)
		close(fd);
	ms_sha256_free(c);
	ms_free(path);
	return rc;
}

static int hash_job(struct ms_pool *pool, size_t i, uint8_t *buf, struct ms_err *err)
{
	struct hpool *hp = pool->ctx;

	return hash_one(pool, &hp->m->files[hp->order[i]], buf, err);
}

static void hash_report(struct ms_pool *pool)
{
	struct hpool *hp = pool->ctx;

	hp->opts->progress(hp->opts->progress_arg, __atomic_load_n(&hp->done, __ATOMIC_RELAXED),
			   hp->m->total_bytes);
}

static int by_size_desc(const void *a, const void *b, void *arg)
{
	const struct ms_oms_manifest *m = arg;
	uint64_t x = m->files[*(const size_t *)a].size;
	uint64_t y = m->files[*(const size_t *)b].size;

	return x < y ? 1 : x > y ? -1 : 0;
}

int ms_oms_manifest_hash(struct ms_oms_manifest *m, const char *model_dir,
			 const struct ms_oms_opts *opts, struct ms_err *err)
{
	struct hpool hp = { .m = m, .root = model_dir, .opts = opts };
	struct ms_pool pool = { .njobs = m->nfiles, .scratch = HASH_BUF, .run = hash_job,
				.ctx = &hp };
	struct ms_sha256_ctx *c = NULL;
	int rc = MS_OK;

	pool.nthreads = opts && opts->nthreads > 0 ? opts->nthreads : ms_ncpus();
	if (pool.nthreads > 256)
		pool.nthreads = 256;
	/* with a progress callback the calling thread reports; else it works */
	if (opts && opts->progress)
		pool.report = hash_report;
	hp.order = ms_malloc((m->nfiles ? m->nfiles : 1) * sizeof(*hp.order));
	if (!hp.order) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < m->nfiles; i++)
		hp.order[i] = i;
	/* Largest first, so one big shard does not start last. */
	qsort_r(hp.order, m->nfiles, sizeof(*hp.order), by_size_desc, m);
	if ((rc = ms_pool_run(&pool, err)) != MS_OK)
		goto out;
	c = ms_sha256_new();
	if (!c) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < m->nfiles && rc == MS_OK; i++)
		rc = ms_sha256_update(c, m->files[i].digest, MS_SHA256_LEN);
	if (rc == MS_OK)
		rc = ms_sha256_final(c, m->root);
	if (rc != MS_OK)
		ms_err_set(err, rc, "sha256 failed");
out:
	ms_sha256_free(c);
	ms_free(hp.order);
	return rc;
}

int ms_oms_statement(const struct ms_oms_manifest *m, char **json, size_t *len,
		     struct ms_err *err)
{
	char hex[MS_OMS_HEX_LEN];
	struct ms_buf b;

	ms_buf_init(&b);
	*json = NULL;
	ms_hex(m->root, MS_SHA256_LEN, hex);
	ms_buf_puts(&b, "{\n  \"_type\": \"" MS_OMS_STATEMENT_TYPE "\",\n"
		    "  \"subject\": [\n    {\n      \"name\": ");
	json_put_str(&b, m->model_name);
	ms_buf_printf(&b, ",\n      \"digest\": {\n        \"sha256\": \"%s\"\n"
		      "      }\n    }\n  ],\n", hex);
	ms_buf_puts(&b, "  \"predicateType\": \"" MS_OMS_PREDICATE_TYPE "\",\n"
		    "  \"predicate\": {\n    \"serialization\": {\n"
		    "      \"method\": \"files\",\n      \"hash_type\": \"sha256\",\n"
		    "      \"allow_symlinks\": false");
	if (m->nignore) {
		ms_buf_puts(&b, ",\n      \"ignore_paths\": [");
		for (size_t i = 0; i < m->nignore; i++) {
			ms_buf_puts(&b, i ? ",\n        " : "\n        ");
			json_put_str(&b, m->ignore[i]);
		}
		ms_buf_puts(&b, "\n      ]");
	}
	ms_buf_puts(&b, "\n    },\n    \"resources\": [");
	for (size_t i = 0; i < m->nfiles; i++) {
		ms_hex(m->files[i].digest, MS_SHA256_LEN, hex);
		ms_buf_puts(&b, i ? ",\n      {\n        \"name\": "
				  : "\n      {\n        \"name\": ");
		json_put_str(&b, m->files[i].name);
		ms_buf_printf(&b, ",\n        \"algorithm\": \"sha256\",\n"
			      "        \"digest\": \"%s\"\n      }", hex);
	}
	ms_buf_puts(&b, m->nfiles ? "\n    ]\n  }\n}" : "]\n  }\n}");
	*json = ms_buf_detach(&b, len);
	if (!*json)
		return ms_err_nomem(err);
	return MS_OK;
}

/* ---- sign ----------------------------------------------------------------- */

void ms_oms_result_release(struct ms_oms_result *res)
{
	if (!res)
		return;
	ms_free(res->model_name);
	ms_free(res->path);
	memset(res, 0, sizeof(*res));
}

int ms_oms_sign(const char *model_dir, const char *key_pem_path,
		const char *sig_path, int nthreads, struct ms_err *err)
{
	struct ms_oms_opts o = {0};

	o.nthreads = nthreads;
	return ms_oms_sign_opts(model_dir, key_pem_path, sig_path, &o, NULL, err);
}

int ms_oms_sign_opts(const char *model_dir, const char *key_pem_path,
		     const char *sig_path, const struct ms_oms_opts *opts,
		     struct ms_oms_result *res, struct ms_err *err)
{
	const char *ignore[NGIT + 1];
	struct ms_oms_manifest *m = NULL;
	struct ms_key *key = NULL;
	char *rel = NULL, *stmt = NULL, *bundle = NULL;
	size_t nignore = 0, stmt_len = 0, bundle_len = 0;
	struct stat st;
	double t0;
	int rc;

	if (res)
		memset(res, 0, sizeof(*res));
	if ((rc = ms_key_load_private(key_pem_path, &key, err)) != MS_OK)
		goto out;
	/* Fail before hours of hashing, not after; the commit checks again. */
	if (!(opts && opts->force) && lstat(sig_path, &st) == 0) {
		rc = ms_err_set(err, MS_EEXIST, "'%s': output exists (use --force to replace it)",
				sig_path);
		goto out;
	}
	rel = sig_rel_path(model_dir, sig_path);
	if (rel)
		ignore[nignore++] = rel;
	for (size_t i = 0; i < NGIT; i++)
		ignore[nignore++] = git_ignores[i];
	if ((rc = ms_oms_manifest_scan(model_dir, ignore, nignore, &m, err)) != MS_OK)
		goto out;
	t0 = ms_now();
	if ((rc = ms_oms_manifest_hash(m, model_dir, opts, err)) != MS_OK)
		goto out;
	if (res) {
		res->seconds = ms_now() - t0;
		res->nfiles = m->nfiles;
		res->nbytes = m->total_bytes;
		ms_hex(m->root, MS_SHA256_LEN, res->root_digest);
		res->model_name = ms_strdup(m->model_name);
		if ((rc = ms_key_hint(key, res->key_hint, err)) != MS_OK)
			goto out;
	}
	if ((rc = ms_oms_statement(m, &stmt, &stmt_len, err)) != MS_OK)
		goto out;
	if ((rc = ms_sigstore_sign(stmt, stmt_len, MS_OMS_PAYLOAD_TYPE, key, &bundle,
				 &bundle_len, err)) != MS_OK)
		goto out;
	rc = ms_file_write_atomic(sig_path, bundle, bundle_len, opts && opts->force, err);
out:
	ms_free(bundle);
	ms_free(stmt);
	ms_free(rel);
	ms_oms_manifest_free(m);
	ms_key_free(key);
	return rc;
}

/* ---- verify --------------------------------------------------------------- */

struct signed_manifest {
	char *model_name;
	char root_hex[MS_OMS_HEX_LEN];
	size_t nfiles;
	struct ms_oms_file *files;   /* sorted */
	size_t nignore;
	char **ignore;
};

static void signed_release(struct signed_manifest *s)
{
	for (size_t i = 0; i < s->nfiles; i++)
		ms_free(s->files[i].name);
	for (size_t i = 0; i < s->nignore; i++)
		ms_free(s->ignore[i]);
	ms_free(s->files);
	ms_free(s->ignore);
	ms_free(s->model_name);
	memset(s, 0, sizeof(*s));
}

static int is_lower_hex64(const char *s)
{
	if (strlen(s) != 64)
		return 0;
	for (; *s; s++)
		if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
			return 0;
	return 1;
}

/* Read the in-toto statement the way the reference does (and stricter on
 * form: canonical unique names, digests of 64 hex digits). */
static int statement_parse(const uint8_t *payload, size_t n, const char *label,
			   struct signed_manifest *sm, struct ms_err *err)
{
	const struct jv *subj, *s0, *pred, *ser, *res, *ign, *allow;
	const char *t, *ptype, *name, *dig, *method, *htype;
	struct ms_sha256_ctx *c = NULL;
	uint8_t root[MS_SHA256_LEN];
	char hex[MS_OMS_HEX_LEN];
	struct jv doc;
	int rc;

	memset(sm, 0, sizeof(*sm));
	if ((rc = json_parse((const char *)payload, n, label, &doc, err)) != MS_OK)
		goto out;
	t = jgets(&doc, "_type");
	if (doc.type != J_OBJ || !t || strcmp(t, MS_OMS_STATEMENT_TYPE)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': payload is not an in-toto statement v1",
				label);
		goto out;
	}
	ptype = jgets(&doc, "predicateType");
	if (!ptype || strcmp(ptype, MS_OMS_PREDICATE_TYPE)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': predicate type '%s' is not supported (want '%s')",
				label, ptype ? ptype : "(none)", MS_OMS_PREDICATE_TYPE);
		goto out;
	}
	subj = jget(&doc, "subject");
	if (!subj || subj->type != J_ARR || subj->n != 1) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': statement needs exactly one subject", label);
		goto out;
	}
	s0 = &subj->kids[0];
	name = jgets(s0, "name");
	dig = jgets(jget(s0, "digest"), "sha256");
	if (!name || !dig || !is_lower_hex64(dig)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': subject needs a name and a sha256 digest",
				label);
		goto out;
	}
	pred = jget(&doc, "predicate");
	ser = jget(pred, "serialization");
	res = jget(pred, "resources");
	if (!ser || ser->type != J_OBJ || !res || res->type != J_ARR) {
		rc = ms_err_set(err, MS_EINVAL,
				"'%s': predicate needs a serialization object and a resources array",
				label);
		goto out;
	}
	method = jgets(ser, "method");
	htype = jgets(ser, "hash_type");
	allow = jget(ser, "allow_symlinks");
	ign = jget(ser, "ignore_paths");
	if (!method || strcmp(method, "files")) {
		rc = ms_err_set(err, MS_EINVAL,
				"'%s': serialization method '%s' is not supported (only 'files')",
				label, method ? method : "(none)");
		goto out;
	}
	if (!htype || strcmp(htype, "sha256")) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': hash type '%s' is not supported (only 'sha256')",
				label, htype ? htype : "(none)");
		goto out;
	}
	if (!allow || (allow->type != J_TRUE && allow->type != J_FALSE) ||
	    (ign && ign->type != J_ARR)) {
		rc = ms_err_set(err, MS_EINVAL,
				"'%s': serialization needs boolean allow_symlinks and an array ignore_paths",
				label);
		goto out;
	}
	sm->model_name = ms_strdup(name);
	sm->files = ms_calloc(res->n ? res->n : 1, sizeof(*sm->files));
	sm->ignore = ms_calloc(ign && ign->n ? ign->n : 1, sizeof(*sm->ignore));
	c = ms_sha256_new();
	if (!sm->model_name || !sm->files || !sm->ignore || !c) {
		rc = ms_err_nomem(err);
		goto out;
	}
	memcpy(sm->root_hex, dig, MS_OMS_HEX_LEN);
	for (size_t i = 0; ign && i < ign->n; i++) {
		int empty;
		char *p;

		if (ign->kids[i].type != J_STR) {
			rc = ms_err_set(err, MS_EINVAL, "'%s': ignore_paths holds a non-string", label);
			goto out;
		}
		p = path_norm(ign->kids[i].str, &empty);
		if (p && empty) {
			ms_free(p);
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': signed ignore path '%s' would ignore the whole model",
					label, ign->kids[i].str);
			goto out;
		}
		if (p)
			sm->ignore[sm->nignore++] = p;
	}
	for (size_t i = 0; i < res->n; i++) {
		const struct jv *r = &res->kids[i];
		const struct jv *nm = jget(r, "name");
		const char *alg = jgets(r, "algorithm"), *d = jgets(r, "digest");
		struct ms_oms_file *f = &sm->files[i];

		if (r->type != J_OBJ || !nm || nm->type != J_STR || !alg || !d) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': resource %zu needs string name, algorithm and digest",
					label, i);
			goto out;
		}
		if (strcmp(alg, "sha256")) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': resource '%s': algorithm '%s' is not supported",
					label, nm->str, alg);
			goto out;
		}
		if (!path_canonical(nm->str, nm->len)) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': resource name '%s' is not a canonical relative path",
					label, nm->str);
			goto out;
		}
		if (strlen(d) != 64 || ms_unhex(d, f->digest, MS_SHA256_LEN)) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': resource '%s': digest is not 64 hex digits", label,
					nm->str);
			goto out;
		}
		f->name = ms_strdup(nm->str);
		if (!f->name) {
			rc = ms_err_nomem(err);
			goto out;
		}
		sm->nfiles++;
		ms_sha256_update(c, f->digest, MS_SHA256_LEN);
	}
	/* The root covers the resources in the order they are listed. */
	if ((rc = ms_sha256_final(c, root)) != MS_OK) {
		ms_err_set(err, rc, "sha256 failed");
		goto out;
	}
	ms_hex(root, MS_SHA256_LEN, hex);
	if (strcmp(hex, dig)) {
		rc = ms_err_set(err, MS_EINVAL,
				"'%s': inconsistent statement: resources hash to %s, subject says %s",
				label, hex, dig);
		goto out;
	}
	qsort(sm->files, sm->nfiles, sizeof(*sm->files), file_cmp);
	for (size_t i = 1; i < sm->nfiles; i++)
		if (!ms_oms_path_cmp(sm->files[i - 1].name, sm->files[i].name)) {
			rc = ms_err_set(err, MS_EINVAL, "'%s': resource '%s' listed twice", label,
					sm->files[i].name);
			goto out;
		}
out:
	ms_sha256_free(c);
	jv_release(&doc);
	return rc;
}

int ms_oms_verify(const char *model_dir, const char *sig_path,
		  const char *pub_pem_path, struct ms_oms_result *res,
		  struct ms_err *err)
{
	return ms_oms_verify_opts(model_dir, sig_path, pub_pem_path, NULL, res, err);
}

static int diff_note(struct ms_oms_result *res, enum ms_oms_fail kind,
		     const char *path)
{
	if (res->fail != MS_OMS_FAIL_NONE)
		return MS_OK;
	res->fail = kind;
	res->path = ms_strdup(path);
	return res->path ? MS_OK : MS_ENOMEM;
}

int ms_oms_verify_opts(const char *model_dir, const char *sig_path,
		       const char *pub_pem_path, const struct ms_oms_opts *opts,
		       struct ms_oms_result *res, struct ms_err *err)
{
	const char *ignore[NGIT + 1];
	struct signed_manifest sm = {0};
	struct ms_oms_manifest *m = NULL;
	struct ms_oms_result dummy;
	struct ms_key *pub = NULL;
	char *text = NULL, *ptype = NULL, *rel = NULL;
	const char **all = NULL;
	uint8_t *payload = NULL;
	size_t text_len = 0, payload_len = 0, nignore = 0, nall = 0, i, j;
	double t0;
	int rc;

	if (!res)
		res = &dummy;
	memset(res, 0, sizeof(*res));
	if ((rc = ms_key_load_public(pub_pem_path, &pub, err)) != MS_OK)
		goto out;
	if ((rc = ms_file_read(sig_path, MS_OMS_MAX_SIG, &text, &text_len, err)) != MS_OK)
		goto out;
	if ((rc = bundle_check(text, text_len, sig_path, pub, &payload, &payload_len,
			       &ptype, &res->fail, res->key_hint, err)) != MS_OK)
		goto out;
	if (strcmp(ptype, MS_OMS_PAYLOAD_TYPE)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': payload type '%s' is not '%s'", sig_path,
				ptype, MS_OMS_PAYLOAD_TYPE);
		goto out;
	}
	if ((rc = statement_parse(payload, payload_len, sig_path, &sm, err)) != MS_OK)
		goto out;
	res->model_name = ms_strdup(sm.model_name);
	memcpy(res->root_digest, sm.root_hex, MS_OMS_HEX_LEN);
	res->nfiles = sm.nfiles;
	if (!res->model_name) {
		rc = ms_err_nomem(err);
		goto out;
	}

	/* What to leave out: the signed ignore list, the signature itself, and
	 * the git paths unless the signer chose to cover files under them. */
	rel = sig_rel_path(model_dir, sig_path);
	if (rel)
		ignore[nignore++] = rel;
	for (i = 0; i < NGIT; i++) {
		int covered = 0;

		for (j = 0; j < sm.nfiles && !covered; j++)
			covered = path_under(sm.files[j].name, git_ignores[i]);
		if (!covered)
			ignore[nignore++] = git_ignores[i];
	}
	all = ms_calloc(nignore + sm.nignore + 1, sizeof(*all));
	if (!all) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (i = 0; i < nignore; i++)
		all[nall++] = ignore[i];
	for (i = 0; i < sm.nignore; i++)
		all[nall++] = sm.ignore[i];
	if ((rc = ms_oms_manifest_scan(model_dir, all, nall, &m, err)) != MS_OK)
		goto out;

	/* Same set of names first: cheap, and names the file at fault. */
	for (i = 0, j = 0; i < sm.nfiles || j < m->nfiles;) {
		int c = i == sm.nfiles ? 1
			: j == m->nfiles ? -1
			: ms_oms_path_cmp(sm.files[i].name, m->files[j].name);

		if (c < 0) {
			res->nmissing++;
			if ((rc = diff_note(res, MS_OMS_FAIL_MISSING, sm.files[i].name)) != MS_OK)
				break;
			i++;
		} else if (c > 0) {
			res->nextra++;
			if ((rc = diff_note(res, MS_OMS_FAIL_EXTRA, m->files[j].name)) != MS_OK)
				break;
			j++;
		} else {
			i++;
			j++;
		}
	}
	if (rc != MS_OK) {
		ms_err_set(err, rc, "out of memory");
		goto out;
	}
	if (res->fail != MS_OMS_FAIL_NONE) {
		rc = ms_err_set(err, MS_ECHECK, "file '%s' in '%s': %s (%llu missing, %llu extra)",
				res->path, model_dir,
				res->fail == MS_OMS_FAIL_MISSING ? "signed but missing"
								 : "extra file, not covered by the signature",
				(unsigned long long)res->nmissing, (unsigned long long)res->nextra);
		goto out;
	}
	t0 = ms_now();
	if ((rc = ms_oms_manifest_hash(m, model_dir, opts, err)) != MS_OK)
		goto out;
	res->seconds = ms_now() - t0;
	res->nbytes = m->total_bytes;
	for (i = 0, j = 0; i < m->nfiles; i++) {
		if (!memcmp(m->files[i].digest, sm.files[i].digest, MS_SHA256_LEN))
			continue;
		if (res->ndigest++ == 0)
			j = i;
		if ((rc = diff_note(res, MS_OMS_FAIL_DIGEST, m->files[i].name)) != MS_OK) {
			ms_err_set(err, rc, "out of memory");
			goto out;
		}
	}
	if (res->ndigest) {
		char want[MS_OMS_HEX_LEN], got[MS_OMS_HEX_LEN];

		ms_hex(sm.files[j].digest, MS_SHA256_LEN, want);
		ms_hex(m->files[j].digest, MS_SHA256_LEN, got);
		rc = ms_err_set(err, MS_ECHECK,
				"file '%s' in '%s': digest mismatch (signed %s, found %s; %llu file%s)",
				m->files[j].name, model_dir, want, got,
				(unsigned long long)res->ndigest, res->ndigest == 1 ? " differs" : "s differ");
		goto out;
	}
out:
	if (res == &dummy)
		ms_oms_result_release(&dummy);
	ms_free(all);
	ms_free(rel);
	ms_oms_manifest_free(m);
	signed_release(&sm);
	ms_free(payload);
	ms_free(ptype);
	ms_free(text);
	ms_key_free(pub);
	return rc;
}
