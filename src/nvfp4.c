/*
 * nvfp4.c: the reference NVFP4 codec (see nvfp4.h for the byte layout).
 *
 * This file is the truth: plain scalar C, one IEEE float32 operation per
 * recipe step, in the producers' order (NVFP4.md, "Flavors"). The fast path
 * (nvfp4_fast.c) and the CUDA kernels are tested against it byte for byte,
 * and tests/oracle/nvfp4_oracle.py checks it against an independent numpy
 * implementation. Keep it obvious rather than fast.
 */
#include "nvfp4.h"

#include <float.h>
#include <math.h>
#include <string.h>

#ifdef __FAST_MATH__
#error "nvfp4.c must not be built with -ffast-math: the recipes are bit-exact"
#endif
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "nvfp4.c needs float expressions evaluated in float (FLT_EVAL_METHOD 0)"
#endif

static const char *const recipe_names[MS_NVFP4_RECIPE_COUNT] = {
	"modelopt", "compressed-tensors", "te",
};

const char *ms_nvfp4_recipe_name(enum ms_nvfp4_recipe r)
{
	return (unsigned)r < MS_NVFP4_RECIPE_COUNT ? recipe_names[r] : NULL;
}

int ms_nvfp4_recipe_parse(const char *s, enum ms_nvfp4_recipe *out)
{
	for (int i = 0; i < MS_NVFP4_RECIPE_COUNT; i++) {
		if (!strcmp(s, recipe_names[i])) {
			*out = (enum ms_nvfp4_recipe)i;
			return MS_OK;
		}
	}
	return MS_EINVAL;
}

const char *ms_nvfp4_block_name(enum ms_nvfp4_block b)
{
	switch (b) {
	case MS_NVFP4_BLOCK_1D: return "1d";
	case MS_NVFP4_BLOCK_2D: return "2d";
	}
	return NULL;
}

int ms_nvfp4_block_parse(const char *s, enum ms_nvfp4_block *out)
{
	if (!strcmp(s, "1d"))
		*out = MS_NVFP4_BLOCK_1D;
	else if (!strcmp(s, "2d"))
		*out = MS_NVFP4_BLOCK_2D;
	else
		return MS_EINVAL;
	return MS_OK;
}

const char *ms_nvfp4_layout_name(enum ms_nvfp4_layout l)
{
	switch (l) {
	case MS_NVFP4_LAYOUT_ROWWISE: return "rowwise";
	case MS_NVFP4_LAYOUT_COLUMNWISE: return "columnwise";
	}
	return NULL;
}

int ms_nvfp4_layout_parse(const char *s, enum ms_nvfp4_layout *out)
{
	if (!strcmp(s, "rowwise"))
		*out = MS_NVFP4_LAYOUT_ROWWISE;
	else if (!strcmp(s, "columnwise"))
		*out = MS_NVFP4_LAYOUT_COLUMNWISE;
	else
		return MS_EINVAL;
	return MS_OK;
}

/* ---- scalars ----------------------------------------------------------- */

static uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

uint8_t ms_nvfp4_e2m1_encode(float q)
{
	float a = fabsf(q);
	uint8_t code;

	/* NVFP4.md thresholds; the boundaries that are included (<=) are the
	 * ties that round down to an even code, the excluded ones (<) the ties
	 * that round up. NaN falls through every test to 6. */
	if (a <= 0.25f)
		code = 0;
	else if (a < 0.75f)
		code = 1;
	else if (a <= 1.25f)
		code = 2;
	else if (a < 1.75f)
		code = 3;
	else if (a <= 2.5f)
		code = 4;
	else if (a < 3.5f)
		code = 5;
	else if (a <= 5.0f)
		code = 6;
	else
		code = 7;
	if (q < 0.0f)
		code |= 8;
	return code;
}

float ms_nvfp4_e2m1_value(uint8_t code)
{
	static const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
	float m = v[code & 7];

	return (code & 8) ? -m : m;
}

uint8_t ms_nvfp4_e4m3_encode(float x)
{
	uint32_t u = f2u(x), sign = (u >> 24) & 0x80, mag = u & 0x7fffffffu;
	float a = u2f(mag);
	uint32_t code;

	if (isnan(x))
		return 0x7f;
	if (a < 0x1p-6f) {
		/* subnormal range: multiples of 2^-9; a*512 is exact, and the
		 * fraction of a value below 8 is exact too */
		float y = a * 512.0f;
		uint32_t m = (uint32_t)y;
		float frac = y - (float)m;

		if (frac > 0.5f || (frac == 0.5f && (m & 1)))
			m++;
		code = m; /* m == 8 is 2^-6, the first normal: code 0x08 */
	} else {
		/* keep 3 of 23 mantissa bits, ties to even; a carry into the
		 * exponent is the right answer */
		uint32_t r = mag + 0x7ffffu + ((mag >> 20) & 1);

		r >>= 20;
		/* rebias 127 -> 7; a >= 2^-6 so the exponent is >= 1 */
		code = r - ((127u - 7u) << 3);
		if (code > 0x7e)
			code = 0x7e; /* above 448 (and Inf): saturate */
	}
	return (uint8_t)(sign | code);
}

float ms_nvfp4_e4m3_value(uint8_t b)
{
	uint32_t e = (b >> 3) & 15, m = b & 7;
	float v;

	if ((b & 0x7f) == 0x7f)
		return NAN;
	if (e == 0)
		v = (float)m * 0x1p-9f;
	else
		v = u2f(((e + 127u - 7u) << 23) | (m << 20));
	return (b & 0x80) ? -v : v;
}

float ms_nvfp4_bf16_round(float x)
{
	uint32_t u = f2u(x);

	if (isnan(x))
		return u2f((u | 0x400000u) & 0xffff0000u);
	u += 0x7fffu + ((u >> 16) & 1);
	return u2f(u & 0xffff0000u);
}

static float f16_round(float x)
{
	float a = fabsf(x);

	if (!isfinite(x))
		return x;
	if (a >= 65520.0f) /* half-way above 65504 and beyond: Inf */
		return copysignf(INFINITY, x);
	if (a < 0x1p-14f) /* subnormal: multiples of 2^-24 */
		return copysignf(rintf(a * 0x1p24f) * 0x1p-24f, x);
	{
		uint32_t u = f2u(x);

		u += 0xfffu + ((u >> 13) & 1);
		return u2f(u & 0xffffe000u);
	}
}

float ms_nvfp4_round_src(float x, enum ms_dtype dtype)
{
	switch (dtype) {
	case MS_DTYPE_BF16:
		return ms_nvfp4_bf16_round(x);
	case MS_DTYPE_F16:
		return f16_round(x);
	default:
		return x;
	}
}

/* ---- recipes ------------------------------------------------------------- */

int ms_nvfp4_tscale_init(enum ms_nvfp4_recipe recipe, float amax,
			 struct ms_nvfp4_tscale *t, struct ms_err *err)
{
	return ms_nvfp4_tscale_init_src(recipe, amax, MS_DTYPE_BF16, t, err);
}

int ms_nvfp4_tscale_init_src(enum ms_nvfp4_recipe recipe, float amax,
			     enum ms_dtype src_dtype, struct ms_nvfp4_tscale *t,
			     struct ms_err *err)
{
	memset(t, 0, sizeof(*t));
	if (!(amax >= 0.0f) || isinf(amax))
		return ms_err_set(err, MS_EINVAL,
				  "tensor amax %g is not a finite non-negative number",
				  (double)amax);
	if (src_dtype != MS_DTYPE_BF16 && src_dtype != MS_DTYPE_F16 &&
	    src_dtype != MS_DTYPE_F32)
		return ms_err_set(err, MS_EINVAL,
				  "dtype %s cannot be quantized (bf16, f16 or f32 only)",
				  ms_dtype_name(src_dtype) ? ms_dtype_name(src_dtype) : "?");
	t->recipe = recipe;
	t->amax = amax;
	t->src_dtype = src_dtype;
	switch (recipe) {
	case MS_NVFP4_RECIPE_MODELOPT: {
		float ws2 = amax / 2688.0f;

		t->stored = t->scale_2 = ws2;
		t->kind = MS_NVFP4_TSCALE_MUL;
		t->global_scale = 1.0f / ws2;
		if (!isfinite(t->global_scale))
			t->global_scale = 1.0f; /* decodes zeros either way */
		/* ws2 == 0 (amax 0, or below 2688 times the smallest
		 * subnormal) would make block_amax / (6 * ws2) a 0/0 and the
		 * scales NaN. Such a tensor decodes to zeros whatever its
		 * codes, so compute as if amax were 1 (all-zero blocks still
		 * get 0x38, every code is 0) and store the true ws2. */
		if (ws2 == 0.0f)
			ws2 = 1.0f / 2688.0f;
		t->k0 = ws2;
		t->k1 = 6.0f * ws2;
		break;
	}
	case MS_NVFP4_RECIPE_COMPRESSED_TENSORS: {
		/* generate_gparam: 448 * 6 / clamp(amax, min=finfo.tiny) on a
		 * tensor of the weight's dtype is torch's __rdiv__,
		 * reciprocal() * 2688: two roundings to that dtype; Inf or
		 * NaN becomes 1.0 (nan_to_num) */
		float tiny = src_dtype == MS_DTYPE_F16 ? 0x1p-14f : FLT_MIN;
		float r = ms_nvfp4_round_src(1.0f / (amax > tiny ? amax : tiny), src_dtype);
		float gs = ms_nvfp4_round_src(r * 2688.0f, src_dtype);

		if (!isfinite(gs))
			gs = 1.0f;
		t->stored = t->global_scale = gs;
		t->kind = MS_NVFP4_TSCALE_DIV;
		t->scale_2 = 1.0f / gs;
		t->k0 = gs;
		break;
	}
	case MS_NVFP4_RECIPE_TE: {
		float s_enc = 1.0f, s_dec;

		if (amax != 0.0f) {
			s_enc = 2688.0f / amax;
			if (s_enc == 0.0f || isinf(s_enc))
				s_enc = 1.0f;
		}
		s_dec = 1.0f / s_enc;
		t->stored = t->scale_2 = s_dec;
		t->kind = MS_NVFP4_TSCALE_MUL;
		t->global_scale = s_enc;
		t->k0 = s_enc * (1.0f / 6.0f);
		t->k1 = s_dec;
		break;
	}
	default:
		return ms_err_set(err, MS_EINVAL, "unknown nvfp4 recipe %d",
				  (int)recipe);
	}
	return MS_OK;
}

float ms_nvfp4_tscale_value(const struct ms_nvfp4_tscale *t,
			    enum ms_nvfp4_tscale_kind kind)
{
	return kind == MS_NVFP4_TSCALE_DIV ? t->global_scale : t->scale_2;
}

uint8_t ms_nvfp4_block_scale(const struct ms_nvfp4_tscale *t, float bamax,
			     float *factor)
{
	uint8_t s8;

	switch (t->recipe) {
	case MS_NVFP4_RECIPE_MODELOPT: {
		float pbs = bamax / t->k1;

		if (pbs == 0.0f)
			pbs = 1.0f;
		if (pbs < 0x1p-9f)
			pbs = 0x1p-9f;
		if (pbs > 448.0f)
			pbs = 448.0f;
		s8 = ms_nvfp4_e4m3_encode(pbs);
		*factor = ms_nvfp4_e4m3_value(s8) * t->k0;
		return s8;
	}
	case MS_NVFP4_RECIPE_COMPRESSED_TENSORS: {
		/* amax / 6 in the weight's dtype, the product in f32 */
		float pre = t->k0 * ms_nvfp4_round_src(bamax / 6.0f, t->src_dtype);

		if (pre < 0.0f)
			pre = 0.0f;
		if (pre > 448.0f)
			pre = 448.0f;
		s8 = ms_nvfp4_e4m3_encode(pre);
		if (ms_nvfp4_e4m3_value(s8) == 0.0f)
			s8 = 0x20; /* e4m3's eps, 0.125, instead of a zero scale */
		*factor = ms_nvfp4_e4m3_value(s8) / t->k0;
		return s8;
	}
	case MS_NVFP4_RECIPE_TE:
	default: {
		float inv;

		/* e4m3_satfinite: the encoder saturates */
		s8 = ms_nvfp4_e4m3_encode(bamax * t->k0);
		inv = 1.0f / (ms_nvfp4_e4m3_value(s8) * t->k1);
		if (inv > FLT_MAX)
			inv = FLT_MAX;
		*factor = inv;
		return s8;
	}
	}
}

uint8_t ms_nvfp4_encode_elem(const struct ms_nvfp4_tscale *t, float x,
			     float factor)
{
	float q;

	switch (t->recipe) {
	case MS_NVFP4_RECIPE_MODELOPT:
		q = x / factor;
		break;
	case MS_NVFP4_RECIPE_COMPRESSED_TENSORS:
		q = x / factor;
		/* torch.clamp keeps NaN, so no fminf/fmaxf here */
		if (q < -6.0f)
			q = -6.0f;
		if (q > 6.0f)
			q = 6.0f;
		break;
	case MS_NVFP4_RECIPE_TE:
	default:
		q = x * factor;
		break;
	}
	return ms_nvfp4_e2m1_encode(q);
}

float ms_nvfp4_block_decode(uint8_t s8, float tscale,
			    enum ms_nvfp4_tscale_kind kind)
{
	float s = ms_nvfp4_e4m3_value(s8);

	return kind == MS_NVFP4_TSCALE_DIV ? s / tscale : s * tscale;
}

/* ---- element access ------------------------------------------------------ */

static float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31,
		 m = h & 0x3ff;

	if (e == 31)
		return u2f(sign | 0x7f800000u | (m << 13));
	if (e == 0) {
		/* m * 2^-24, exact in float */
		float v = (float)m * 0x1p-24f;

		return sign ? -v : v;
	}
	return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

float ms_nvfp4_src_get(const struct ms_nvfp4_src *s, uint64_t i)
{
	const uint8_t *p = s->data;

	switch (s->dtype) {
	case MS_DTYPE_BF16:
		p += 2 * i;
		return u2f((uint32_t)(p[0] | p[1] << 8) << 16);
	case MS_DTYPE_F16:
		p += 2 * i;
		return f16_to_f32((uint16_t)(p[0] | p[1] << 8));
	default:
		p += 4 * i;
		return u2f((uint32_t)p[0] | (uint32_t)p[1] << 8 |
			   (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
	}
}

static int check_src(const struct ms_nvfp4_src *s, struct ms_err *err)
{
	uint64_t n;

	if (s->dtype != MS_DTYPE_BF16 && s->dtype != MS_DTYPE_F16 &&
	    s->dtype != MS_DTYPE_F32)
		return ms_err_set(err, MS_EINVAL,
				  "dtype %s cannot be quantized (bf16, f16 or f32 only)",
				  ms_dtype_name(s->dtype) ? ms_dtype_name(s->dtype) : "?");
	if (ms_mul_u64(s->rows, s->cols, &n) || ms_mul_u64(n, 4, &n))
		return ms_err_set(err, MS_EINVAL, "shape [%llu, %llu] overflows",
				  (unsigned long long)s->rows,
				  (unsigned long long)s->cols);
	if (n && !s->data)
		return ms_err_set(err, MS_EINVAL, "no data");
	return MS_OK;
}

static int nonfinite_at(const struct ms_nvfp4_src *s, uint64_t i,
			struct ms_err *err)
{
	float v = ms_nvfp4_src_get(s, i);

	return ms_err_set(err, MS_EINVAL, "non-finite value (%s) at element %llu",
			  isnan(v) ? "nan" : v > 0 ? "inf" : "-inf",
			  (unsigned long long)i);
}

int ms_nvfp4_amax_ref(const struct ms_nvfp4_src *src, int allow_nonfinite,
		      float *amax, struct ms_err *err)
{
	uint64_t n = src->rows * src->cols;
	float m = 0.0f;
	int rc;

	if ((rc = check_src(src, err)) != MS_OK)
		return rc;
	for (uint64_t i = 0; i < n; i++) {
		float a = fabsf(ms_nvfp4_src_get(src, i));

		if (!isfinite(a)) {
			if (allow_nonfinite)
				continue;
			return nonfinite_at(src, i, err);
		}
		if (a > m)
			m = a;
	}
	*amax = m;
	return MS_OK;
}

int ms_nvfp4_shapes(uint64_t rows, uint64_t cols, enum ms_nvfp4_layout layout,
		    uint64_t packed_shape[2], uint64_t scale_shape[2],
		    struct ms_err *err)
{
	uint64_t r = layout == MS_NVFP4_LAYOUT_COLUMNWISE ? cols : rows;
	uint64_t c = layout == MS_NVFP4_LAYOUT_COLUMNWISE ? rows : cols, cp, n;

	if (ms_add_u64(c, 15, &cp) || ms_mul_u64(r, cp, &n))
		return ms_err_set(err, MS_EINVAL, "shape [%llu, %llu] overflows",
				  (unsigned long long)rows, (unsigned long long)cols);
	cp &= ~(uint64_t)15;
	packed_shape[0] = r;
	packed_shape[1] = cp / 2;
	scale_shape[0] = r;
	scale_shape[1] = cp / 16;
	return MS_OK;
}

/* ---- quantize ------------------------------------------------------------ */

int ms_nvfp4_quantize_ref(const struct ms_nvfp4_params *p,
			  const struct ms_nvfp4_src *src, float amax,
			  uint8_t *packed, uint8_t *scales, struct ms_err *err)
{
	int colwise = p->layout == MS_NVFP4_LAYOUT_COLUMNWISE;
	int allow = (p->flags & MS_NVFP4_ALLOW_NONFINITE) != 0;
	uint64_t R = colwise ? src->cols : src->rows;
	uint64_t C = colwise ? src->rows : src->cols;
	uint64_t pshape[2] = {0, 0}, sshape[2] = {0, 0}, cp, nb;
	struct ms_nvfp4_tscale t;
	float *buf = NULL;
	int rc;

	if ((rc = check_src(src, err)) != MS_OK)
		goto out;
	if ((rc = ms_nvfp4_shapes(src->rows, src->cols, p->layout, pshape, sshape,
				  err)) != MS_OK)
		goto out;
	if ((rc = ms_nvfp4_tscale_init_src(p->recipe, amax, src->dtype, &t, err)) != MS_OK)
		goto out;
	cp = pshape[1] * 2;
	nb = sshape[1];
	/* one strip of 16 rows of the matrix being quantized, as float32,
	 * zero-padded to cp columns */
	buf = ms_calloc(16 * (size_t)(cp ? cp : 1), sizeof(float));
	if (!buf) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (uint64_t r0 = 0; r0 < R; r0 += 16) {
		uint64_t nr = R - r0 < 16 ? R - r0 : 16;

		for (uint64_t i = 0; i < nr; i++) {
			for (uint64_t j = 0; j < C; j++) {
				uint64_t si = colwise ? j * src->cols + (r0 + i)
						      : (r0 + i) * src->cols + j;
				float v = ms_nvfp4_src_get(src, si);

				if (!isfinite(v) && !allow) {
					/* report the first in source order */
					rc = ms_nvfp4_amax_ref(src, 0, &v, err);
					goto out;
				}
				buf[i * cp + j] = v;
			}
		}
		for (uint64_t b = 0; b < nb; b++) {
			float tile = 0.0f;

			for (uint64_t i = 0; i < nr; i++) {
				for (uint64_t j = 16 * b; j < 16 * b + 16; j++) {
					float a = fabsf(buf[i * cp + j]);

					if (isfinite(a) && a > tile)
						tile = a;
				}
			}
			if (tile > amax) {
				float m = 0.0f;

				if ((rc = ms_nvfp4_amax_ref(src, allow, &m, err)) == MS_OK)
					rc = ms_err_set(err, MS_EINVAL,
							"amax %.9g is below the largest magnitude %.9g",
							(double)amax, (double)m);
				goto out;
			}
			for (uint64_t i = 0; i < nr; i++) {
				float bam = 0.0f, f;
				uint8_t s8, *dst = packed + (r0 + i) * (cp / 2) + 8 * b;

				if (p->block == MS_NVFP4_BLOCK_2D) {
					bam = tile;
				} else {
					for (uint64_t j = 16 * b; j < 16 * b + 16; j++) {
						float a = fabsf(buf[i * cp + j]);

						if (isfinite(a) && a > bam)
							bam = a;
					}
				}
				s8 = ms_nvfp4_block_scale(&t, bam, &f);
				scales[(r0 + i) * nb + b] = s8;
				for (uint64_t k = 0; k < 8; k++) {
					const float *x = buf + i * cp + 16 * b + 2 * k;
					uint8_t lo = ms_nvfp4_encode_elem(&t, x[0], f);
					uint8_t hi = ms_nvfp4_encode_elem(&t, x[1], f);

					dst[k] = (uint8_t)(lo | hi << 4);
				}
			}
		}
	}
	rc = MS_OK;
out:
	ms_free(buf);
	return rc;
}

/* ---- transpose ----------------------------------------------------------- */

int ms_nvfp4_transpose(enum ms_nvfp4_block block, uint64_t rows, uint64_t cols,
		       const uint8_t *packed, const uint8_t *scales,
		       uint8_t *packed_t, uint8_t *scales_t, struct ms_err *err)
{
	uint64_t ps[2] = {0, 0}, ss[2] = {0, 0}, pst[2] = {0, 0}, sst[2] = {0, 0};
	int rc;

	if (block != MS_NVFP4_BLOCK_2D)
		return ms_err_set(err, MS_EINVAL,
				  "1d-block nvfp4 cannot be transposed from its bytes: "
				  "the other orientation's 1x16 blocks need the "
				  "high-precision source");
	if ((rc = ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss,
				  err)) != MS_OK ||
	    (rc = ms_nvfp4_shapes(cols, rows, MS_NVFP4_LAYOUT_ROWWISE, pst, sst,
				  err)) != MS_OK)
		return rc;
	/* validate first so that a bad input leaves no partial output */
	for (uint64_t r = 0; r < rows; r++) {
		for (uint64_t b = 0; b < ss[1]; b++) {
			if (scales[r * ss[1] + b] != scales[(r & ~(uint64_t)15) * ss[1] + b])
				return ms_err_set(err, MS_EINVAL,
						  "not a 2d-block quantization: row %llu "
						  "disagrees with row %llu on the scale of "
						  "tile column %llu",
						  (unsigned long long)r,
						  (unsigned long long)(r & ~(uint64_t)15),
						  (unsigned long long)b);
		}
		for (uint64_t c = cols; c < ps[1] * 2; c++) {
			if ((packed[r * ps[1] + c / 2] >> (4 * (c & 1))) & 15)
				return ms_err_set(err, MS_EINVAL,
						  "padding element [%llu, %llu] is not zero",
						  (unsigned long long)r,
						  (unsigned long long)c);
		}
	}
	memset(packed_t, 0, pst[0] * pst[1]);
	for (uint64_t r = 0; r < rows; r++) {
		for (uint64_t c = 0; c < cols; c++) {
			uint8_t code = (packed[r * ps[1] + c / 2] >> (4 * (c & 1))) & 15;

			packed_t[c * pst[1] + r / 2] |= (uint8_t)(code << (4 * (r & 1)));
		}
	}
	for (uint64_t c = 0; c < cols; c++)
		for (uint64_t b = 0; b < sst[1]; b++)
			scales_t[c * sst[1] + b] = scales[16 * b * ss[1] + c / 16];
	return MS_OK;
}

/* ---- dequantize ---------------------------------------------------------- */

static uint16_t f32_to_bf16_bits(float x)
{
	return (uint16_t)(f2u(ms_nvfp4_bf16_round(x)) >> 16);
}

int ms_nvfp4_dequantize_ref(const uint8_t *packed, const uint8_t *scales,
			    uint64_t rows, uint64_t cols, float tscale,
			    enum ms_nvfp4_tscale_kind kind,
			    enum ms_dtype out_dtype, void *out,
			    struct ms_err *err)
{
	uint64_t ps[2] = {0, 0}, ss[2] = {0, 0};
	uint8_t *o = out;
	int rc;

	if (out_dtype != MS_DTYPE_F32 && out_dtype != MS_DTYPE_BF16)
		return ms_err_set(err, MS_EINVAL,
				  "nvfp4 dequantizes to f32 or bf16 only");
	if ((rc = ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss,
				  err)) != MS_OK)
		return rc;
	for (uint64_t r = 0; r < rows; r++) {
		for (uint64_t c = 0; c < cols; c++) {
			uint8_t code = (packed[r * ps[1] + c / 2] >> (4 * (c & 1))) & 15;
			float f = ms_nvfp4_block_decode(scales[r * ss[1] + c / 16],
							tscale, kind);
			float v = ms_nvfp4_e2m1_value(code) * f;
			uint64_t i = r * cols + c;

			if (out_dtype == MS_DTYPE_F32) {
				uint32_t u = f2u(v);

				o[4 * i] = (uint8_t)u;
				o[4 * i + 1] = (uint8_t)(u >> 8);
				o[4 * i + 2] = (uint8_t)(u >> 16);
				o[4 * i + 3] = (uint8_t)(u >> 24);
			} else {
				uint16_t h = f32_to_bf16_bits(v);

				o[2 * i] = (uint8_t)h;
				o[2 * i + 1] = (uint8_t)(h >> 8);
			}
		}
	}
	return MS_OK;
}
