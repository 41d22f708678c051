/*
 * nvfp4_fast.c: the fast NVFP4 path: threads over strips of 16 rows, and
 * per 16-element block AVX-512 or AVX2 code chosen at run time (scalar C
 * elsewhere). It must give the bytes of the reference (nvfp4.c) on every
 * input; tests/unit/t_nvfp4.c checks each instruction set against it.
 *
 * Why it is exact: every float step is the reference's IEEE operation done
 * lane-wise (vdivps/vmulps round like divss/mulss; no expression has the
 * a*b+c form FMA contraction could fuse, and -std=c11 turns contraction
 * off anyway). The block scale step runs 16 blocks at a time with the
 * reference's rounding rewritten for lanes (E4M3 by integer rounding of the
 * bit pattern, round-to-nearest-even below 2^-6; bfloat16 likewise); the
 * scalar path calls the reference's own function. The E2M1 thresholds are
 * the reference's comparisons written with unordered predicates so that
 * NaN still lands on code 7. The block maximum is an integer maximum of
 * |x|'s bit patterns, which orders non-negative floats exactly like float
 * comparison and puts NaN and Inf above every finite value, so one compare
 * also detects them.
 * compressed-tensors' clamp of x/d to [-6, 6] changes no code (the encoder
 * saturates and the clamp keeps NaN), so the vector code leaves it out.
 */
#include "nvfp4.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "pool.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NVFP4_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

#ifdef __FAST_MATH__
#error "nvfp4_fast.c must not be built with -ffast-math: it must match nvfp4.c"
#endif

#define NONFINITE_BITS 0x7f800000u

/* Instruction-set specific block primitives. p points at 16 elements of
 * dtype dt (any alignment). */
struct isa_ops {
	/* max of |x| bit patterns over 16 elements */
	uint32_t (*amax16)(const uint8_t *p, enum ms_dtype dt);
	/* 16 codes of the block with factor f, packed into 8 bytes */
	void (*encode16)(const uint8_t *p, enum ms_dtype dt,
			 const struct ms_nvfp4_tscale *t, float f, uint8_t *out);
	/* decode 8 packed bytes with block factor f into 16 floats */
	void (*decode16)(const uint8_t *in, float f, float *out);
	/* the block step of 16 blocks at once: bits[k] are |x| maxima
	 * (finite, <= t->amax); scale bytes into s8, factors into f */
	void (*scales16)(const struct ms_nvfp4_tscale *t, const uint32_t *bits,
			 uint8_t *s8, float *f);
};

static unsigned dt_size(enum ms_dtype dt)
{
	return dt == MS_DTYPE_F32 ? 4 : 2;
}

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

/* One element as float32 (exact for bf16, f16 and f32). */
static float load1(const uint8_t *p, enum ms_dtype dt)
{
	uint16_t h;
	uint32_t u;

	switch (dt) {
	case MS_DTYPE_BF16:
		memcpy(&h, p, 2);
		return u2f((uint32_t)h << 16);
	case MS_DTYPE_F16: {
		uint32_t sign, e, m;

		memcpy(&h, p, 2);
		sign = (uint32_t)(h & 0x8000) << 16;
		e = (h >> 10) & 31;
		m = h & 0x3ff;
		if (e == 31)
			return u2f(sign | 0x7f800000u | (m << 13));
		if (e == 0) {
			float v = (float)m * 0x1p-24f;
			return sign ? -v : v;
		}
		return u2f(sign | ((e + 112u) << 23) | (m << 13));
	}
	default:
		memcpy(&u, p, 4);
		return u2f(u);
	}
}

/* ---- scalar -------------------------------------------------------------- */

static uint32_t amax16_scalar(const uint8_t *p, enum ms_dtype dt)
{
	unsigned sz = dt_size(dt);
	uint32_t m = 0;

	for (int i = 0; i < 16; i++) {
		uint32_t a = f2u(load1(p + i * sz, dt)) & 0x7fffffffu;

		if (a > m)
			m = a;
	}
	return m;
}

static void encode16_scalar(const uint8_t *p, enum ms_dtype dt,
			    const struct ms_nvfp4_tscale *t, float f, uint8_t *out)
{
	unsigned sz = dt_size(dt);

	for (int k = 0; k < 8; k++) {
		uint8_t lo = ms_nvfp4_encode_elem(t, load1(p + 2 * k * sz, dt), f);
		uint8_t hi = ms_nvfp4_encode_elem(t, load1(p + (2 * k + 1) * sz, dt), f);

		out[k] = (uint8_t)(lo | hi << 4);
	}
}

static void decode16_scalar(const uint8_t *in, float f, float *out)
{
	for (int k = 0; k < 8; k++) {
		out[2 * k] = ms_nvfp4_e2m1_value(in[k] & 15) * f;
		out[2 * k + 1] = ms_nvfp4_e2m1_value(in[k] >> 4) * f;
	}
}

static void scales16_scalar(const struct ms_nvfp4_tscale *t, const uint32_t *bits,
			    uint8_t *s8, float *f)
{
	for (int k = 0; k < 16; k++)
		s8[k] = ms_nvfp4_block_scale(t, u2f(bits[k]), &f[k]);
}

static const struct isa_ops ops_scalar = {
	amax16_scalar, encode16_scalar, decode16_scalar, scales16_scalar,
};

static const float e2m1_table[16] = {
	0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
	-0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

#ifdef NVFP4_X86
/* ---- AVX2 ---------------------------------------------------------------- */

#define T_AVX2 __attribute__((target("avx2,f16c")))

T_AVX2 static inline __m256 load8_avx2(const uint8_t *p, enum ms_dtype dt)
{
	switch (dt) {
	case MS_DTYPE_BF16:
		return _mm256_castsi256_ps(_mm256_slli_epi32(
			_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
	case MS_DTYPE_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
	default:
		return _mm256_loadu_ps((const float *)p);
	}
}

T_AVX2 static uint32_t amax16_avx2(const uint8_t *p, enum ms_dtype dt)
{
	const __m256i mask = _mm256_set1_epi32(0x7fffffff);
	unsigned sz = dt_size(dt);
	__m256i a = _mm256_and_si256(_mm256_castps_si256(load8_avx2(p, dt)), mask);
	__m256i b = _mm256_and_si256(_mm256_castps_si256(load8_avx2(p + 8 * sz, dt)), mask);
	__m128i m;

	a = _mm256_max_epu32(a, b);
	m = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
	m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
	m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
	return (uint32_t)_mm_cvtsi128_si32(m);
}

/* codes (0..15 in each 32-bit lane) of 8 values */
T_AVX2 static inline __m256i e2m1_avx2(__m256 q)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	__m256 a = _mm256_and_ps(q, absmask);
	/* each passed threshold is a -1 lane; NLE/NLT are true on NaN */
	__m256i c = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(0.25f), _CMP_NLE_UQ));

	c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(0.75f), _CMP_NLT_UQ)));
	c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(1.25f), _CMP_NLE_UQ)));
	c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(1.75f), _CMP_NLT_UQ)));
	c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(2.5f), _CMP_NLE_UQ)));
	c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(3.5f), _CMP_NLT_UQ)));
	c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(5.0f), _CMP_NLE_UQ)));
	c = _mm256_sub_epi32(_mm256_setzero_si256(), c);
	return _mm256_or_si256(c, _mm256_and_si256(
		_mm256_castps_si256(_mm256_cmp_ps(q, _mm256_setzero_ps(), _CMP_LT_OQ)),
		_mm256_set1_epi32(8)));
}

T_AVX2 static void encode16_avx2(const uint8_t *p, enum ms_dtype dt,
				 const struct ms_nvfp4_tscale *t, float f,
				 uint8_t *out)
{
	unsigned sz = dt_size(dt);
	__m256 x0 = load8_avx2(p, dt), x1 = load8_avx2(p + 8 * sz, dt);
	__m256 vf = _mm256_set1_ps(f);
	__m256i c0, c1, w;

	if (t->recipe == MS_NVFP4_RECIPE_TE) {
		x0 = _mm256_mul_ps(x0, vf);
		x1 = _mm256_mul_ps(x1, vf);
	} else {
		x0 = _mm256_div_ps(x0, vf);
		x1 = _mm256_div_ps(x1, vf);
	}
	c0 = e2m1_avx2(x0);
	c1 = e2m1_avx2(x1);
	/* 16-bit codes in element order */
	w = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xd8);
	/* in each 32-bit lane, c[2i] | c[2i+1] << 16 -> low byte c[2i] | c[2i+1] << 4 */
	w = _mm256_or_si256(w, _mm256_srli_epi32(w, 12));
	w = _mm256_shuffle_epi8(w, _mm256_setr_epi8(
		0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
		0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
	{
		uint32_t lo = (uint32_t)_mm256_extract_epi32(w, 0);
		uint32_t hi = (uint32_t)_mm256_extract_epi32(w, 4);

		memcpy(out, &lo, 4);
		memcpy(out + 4, &hi, 4);
	}
}

T_AVX2 static void decode16_avx2(const uint8_t *in, float f, float *out)
{
	const __m256 lo_tab = _mm256_loadu_ps(e2m1_table), hi_tab = _mm256_loadu_ps(e2m1_table + 8);
	__m256 vf = _mm256_set1_ps(f);
	__m128i b = _mm_loadl_epi64((const __m128i *)in);
	__m128i nib = _mm_unpacklo_epi8(_mm_and_si128(b, _mm_set1_epi8(15)),
					_mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15)));

	for (int h = 0; h < 2; h++) {
		__m256i idx = _mm256_cvtepu8_epi32(h ? _mm_srli_si128(nib, 8) : nib);
		__m256 v0 = _mm256_permutevar8x32_ps(lo_tab, idx);
		__m256 v1 = _mm256_permutevar8x32_ps(hi_tab, idx);
		__m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
		/* multiply the looked-up value, as the scalar code does */
		_mm256_storeu_ps(out + 8 * h, _mm256_mul_ps(_mm256_blendv_ps(v0, v1, sel), vf));
	}
}

/* E4M3 codes of 8 non-negative floats (no NaN): the reference's
 * rounding, lane-wise: integer rounding of the bit pattern for normals,
 * round-to-nearest-even of x * 512 below 2^-6, saturation at 0x7e. */
T_AVX2 static inline __m256i e4m3_code_avx2(__m256 x)
{
	__m256i u = _mm256_castps_si256(x);
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1));
	__m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7ffff)),
						       lsb), 20);
	__m256i normal = _mm256_sub_epi32(r, _mm256_set1_epi32(120 << 3));
	__m256i sub = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(512.0f)),
							 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	__m256i is_sub = _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ));

	return _mm256_min_epi32(_mm256_blendv_epi8(normal, sub, is_sub), _mm256_set1_epi32(0x7e));
}

/* Values of E4M3 codes 0..0x7e. */
T_AVX2 static inline __m256 e4m3_value_avx2(__m256i code)
{
	__m256i e = _mm256_srli_epi32(code, 3), m = _mm256_and_si256(code, _mm256_set1_epi32(7));
	__m256 normal = _mm256_castsi256_ps(_mm256_or_si256(
		_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(120)), 23),
		_mm256_slli_epi32(m, 20)));
	__m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(0x1p-9f));
	__m256i is_sub = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());

	return _mm256_blendv_ps(normal, sub, _mm256_castsi256_ps(is_sub));
}

T_AVX2 static void scales16_avx2(const struct ms_nvfp4_tscale *t, const uint32_t *bits,
				 uint8_t *s8, float *f)
{
	const __m256 k0 = _mm256_set1_ps(t->k0), k1 = _mm256_set1_ps(t->k1);

	/* the vector compressed-tensors step rounds amax / 6 to bf16; the
	 * other source dtypes take the reference's block step */
	if (t->recipe == MS_NVFP4_RECIPE_COMPRESSED_TENSORS && t->src_dtype != MS_DTYPE_BF16) {
		scales16_scalar(t, bits, s8, f);
		return;
	}

	for (int h = 0; h < 2; h++) {
		__m256 bam = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(bits + 8 * h)));
		__m256i code;
		__m256 v, fac;
		uint32_t c[8];

		switch (t->recipe) {
		case MS_NVFP4_RECIPE_MODELOPT: {
			__m256 pbs = _mm256_div_ps(bam, k1);

			pbs = _mm256_blendv_ps(pbs, _mm256_set1_ps(1.0f),
					       _mm256_cmp_ps(pbs, _mm256_setzero_ps(), _CMP_EQ_OQ));
			pbs = _mm256_min_ps(_mm256_max_ps(pbs, _mm256_set1_ps(0x1p-9f)),
					    _mm256_set1_ps(448.0f));
			code = e4m3_code_avx2(pbs);
			fac = _mm256_mul_ps(e4m3_value_avx2(code), k0);
			break;
		}
		case MS_NVFP4_RECIPE_COMPRESSED_TENSORS: {
			__m256i u = _mm256_castps_si256(_mm256_div_ps(bam, _mm256_set1_ps(6.0f)));
			__m256 pre;
			__m256i zero;

			/* bfloat16, nearest even (the values are finite) */
			u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
				_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
			u = _mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u));
			pre = _mm256_mul_ps(k0, _mm256_castsi256_ps(u));
			pre = _mm256_min_ps(pre, _mm256_set1_ps(448.0f));
			code = e4m3_code_avx2(pre);
			zero = _mm256_cmpeq_epi32(code, _mm256_setzero_si256());
			code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x20), zero);
			fac = _mm256_div_ps(e4m3_value_avx2(code), k0);
			break;
		}
		default:
			code = e4m3_code_avx2(_mm256_mul_ps(bam, k0));
			v = _mm256_mul_ps(e4m3_value_avx2(code), k1);
			fac = _mm256_min_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), v),
					    _mm256_set1_ps(FLT_MAX));
			break;
		}
		_mm256_storeu_si256((__m256i *)c, code);
		for (int k = 0; k < 8; k++)
			s8[8 * h + k] = (uint8_t)c[k];
		_mm256_storeu_ps(f + 8 * h, fac);
	}
}

static const struct isa_ops ops_avx2 = {
	amax16_avx2, encode16_avx2, decode16_avx2, scales16_avx2,
};

/* ---- AVX-512 ------------------------------------------------------------- */

#define T_AVX512 __attribute__((target("avx512f")))

T_AVX512 static inline __m512 load16_avx512(const uint8_t *p, enum ms_dtype dt)
{
	switch (dt) {
	case MS_DTYPE_BF16:
		return _mm512_castsi512_ps(_mm512_slli_epi32(
			_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
	case MS_DTYPE_F16:
		return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
	default:
		return _mm512_loadu_ps((const float *)p);
	}
}

T_AVX512 static uint32_t amax16_avx512(const uint8_t *p, enum ms_dtype dt)
{
	__m512i a = _mm512_and_si512(_mm512_castps_si512(load16_avx512(p, dt)),
				     _mm512_set1_epi32(0x7fffffff));
	__m256i m = _mm256_max_epu32(_mm512_castsi512_si256(a),
				     _mm512_extracti64x4_epi64(a, 1));
	__m128i n = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));

	n = _mm_max_epu32(n, _mm_shuffle_epi32(n, 0x4e));
	n = _mm_max_epu32(n, _mm_shuffle_epi32(n, 0xb1));
	return (uint32_t)_mm_cvtsi128_si32(n);
}

T_AVX512 static void encode16_avx512(const uint8_t *p, enum ms_dtype dt,
				     const struct ms_nvfp4_tscale *t, float f,
				     uint8_t *out)
{
	const __m512i one = _mm512_set1_epi32(1);
	__m512 q = load16_avx512(p, dt), vf = _mm512_set1_ps(f), a;
	__m512i c = _mm512_setzero_si512();
	__m128i b;

	q = t->recipe == MS_NVFP4_RECIPE_TE ? _mm512_mul_ps(q, vf) : _mm512_div_ps(q, vf);
	a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(q),
						 _mm512_set1_epi32(0x7fffffff)));
	c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_NLE_UQ), c, one);
	c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.75f), _CMP_NLT_UQ), c, one);
	c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.25f), _CMP_NLE_UQ), c, one);
	c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.75f), _CMP_NLT_UQ), c, one);
	c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.5f), _CMP_NLE_UQ), c, one);
	c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.5f), _CMP_NLT_UQ), c, one);
	c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(a, _mm512_set1_ps(5.0f), _CMP_NLE_UQ), c, one);
	c = _mm512_mask_or_epi32(c, _mm512_cmp_ps_mask(q, _mm512_setzero_ps(), _CMP_LT_OQ),
				 c, _mm512_set1_epi32(8));
	/* 16 codes as bytes; then in each 16-bit lane c[2i] | c[2i+1] << 8
	 * becomes c[2i] | c[2i+1] << 4 in its low byte */
	b = _mm512_cvtepi32_epi8(c);
	b = _mm_or_si128(b, _mm_srli_epi16(b, 4));
	b = _mm_and_si128(b, _mm_set1_epi16(0xff));
	_mm_storel_epi64((__m128i *)out, _mm_packus_epi16(b, b));
}

T_AVX512 static void decode16_avx512(const uint8_t *in, float f, float *out)
{
	__m512 tab = _mm512_loadu_ps(e2m1_table);
	__m128i b = _mm_loadl_epi64((const __m128i *)in);
	__m128i nib = _mm_unpacklo_epi8(_mm_and_si128(b, _mm_set1_epi8(15)),
					_mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15)));
	__m512 v = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(nib), tab);

	_mm512_storeu_ps(out, _mm512_mul_ps(v, _mm512_set1_ps(f)));
}

/* As e4m3_code_avx2, 16 lanes. */
T_AVX512 static inline __m512i e4m3_code_avx512(__m512 x)
{
	__m512i u = _mm512_castps_si512(x);
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 20), _mm512_set1_epi32(1));
	__m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7ffff)),
						       lsb), 20);
	__m512i normal = _mm512_sub_epi32(r, _mm512_set1_epi32(120 << 3));
	__m512i sub = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(512.0f)),
							      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	__mmask16 is_sub = _mm512_cmp_ps_mask(x, _mm512_set1_ps(0x1p-6f), _CMP_LT_OQ);

	return _mm512_min_epi32(_mm512_mask_blend_epi32(is_sub, normal, sub), _mm512_set1_epi32(0x7e));
}

T_AVX512 static inline __m512 e4m3_value_avx512(__m512i code)
{
	__m512i e = _mm512_srli_epi32(code, 3), m = _mm512_and_si512(code, _mm512_set1_epi32(7));
	__m512 normal = _mm512_castsi512_ps(_mm512_or_si512(
		_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(120)), 23),
		_mm512_slli_epi32(m, 20)));
	__m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(m), _mm512_set1_ps(0x1p-9f));

	return _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()), normal, sub);
}

T_AVX512 static void scales16_avx512(const struct ms_nvfp4_tscale *t, const uint32_t *bits,
				     uint8_t *s8, float *f)
{
	const __m512 k0 = _mm512_set1_ps(t->k0), k1 = _mm512_set1_ps(t->k1);
	__m512 bam = _mm512_castsi512_ps(_mm512_loadu_si512(bits)), fac;
	__m512i code;

	if (t->recipe == MS_NVFP4_RECIPE_COMPRESSED_TENSORS && t->src_dtype != MS_DTYPE_BF16) {
		scales16_scalar(t, bits, s8, f);
		return;
	}

	switch (t->recipe) {
	case MS_NVFP4_RECIPE_MODELOPT: {
		__m512 pbs = _mm512_div_ps(bam, k1);

		pbs = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(pbs, _mm512_setzero_ps(), _CMP_EQ_OQ),
					   pbs, _mm512_set1_ps(1.0f));
		pbs = _mm512_min_ps(_mm512_max_ps(pbs, _mm512_set1_ps(0x1p-9f)), _mm512_set1_ps(448.0f));
		code = e4m3_code_avx512(pbs);
		fac = _mm512_mul_ps(e4m3_value_avx512(code), k0);
		break;
	}
	case MS_NVFP4_RECIPE_COMPRESSED_TENSORS: {
		__m512i u = _mm512_castps_si512(_mm512_div_ps(bam, _mm512_set1_ps(6.0f)));
		__m512 pre;

		u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
			_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
		u = _mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u));
		pre = _mm512_min_ps(_mm512_mul_ps(k0, _mm512_castsi512_ps(u)), _mm512_set1_ps(448.0f));
		code = e4m3_code_avx512(pre);
		code = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(code, _mm512_setzero_si512()),
					       code, _mm512_set1_epi32(0x20));
		fac = _mm512_div_ps(e4m3_value_avx512(code), k0);
		break;
	}
	default:
		code = e4m3_code_avx512(_mm512_mul_ps(bam, k0));
		fac = _mm512_min_ps(_mm512_div_ps(_mm512_set1_ps(1.0f),
						  _mm512_mul_ps(e4m3_value_avx512(code), k1)),
				    _mm512_set1_ps(FLT_MAX));
		break;
	}
	_mm_storeu_si128((__m128i *)s8, _mm512_cvtepi32_epi8(code));
	_mm512_storeu_ps(f, fac);
}

static const struct isa_ops ops_avx512 = {
	amax16_avx512, encode16_avx512, decode16_avx512, scales16_avx512,
};
#endif /* NVFP4_X86 */

int ms_nvfp4_isa_supported(enum ms_nvfp4_isa isa)
{
	switch (isa) {
	case MS_NVFP4_ISA_AUTO:
	case MS_NVFP4_ISA_SCALAR:
		return 1;
#ifdef NVFP4_X86
	case MS_NVFP4_ISA_AVX2: {
		/* f16c (the f16 loads) by cpuid: not every compiler's
		 * __builtin_cpu_supports knows it; every AVX2 CPU has it */
		unsigned a, b, c, d;

		__builtin_cpu_init();
		return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) &&
		       (c & bit_F16C);
	}
	case MS_NVFP4_ISA_AVX512:
		__builtin_cpu_init();
		return __builtin_cpu_supports("avx512f");
#endif
	default:
		return 0;
	}
}

enum ms_nvfp4_isa ms_nvfp4_isa_best(void)
{
	if (ms_nvfp4_isa_supported(MS_NVFP4_ISA_AVX512))
		return MS_NVFP4_ISA_AVX512;
	if (ms_nvfp4_isa_supported(MS_NVFP4_ISA_AVX2))
		return MS_NVFP4_ISA_AVX2;
	return MS_NVFP4_ISA_SCALAR;
}

const char *ms_nvfp4_isa_name(enum ms_nvfp4_isa isa)
{
	switch (isa) {
	case MS_NVFP4_ISA_AUTO: return "auto";
	case MS_NVFP4_ISA_SCALAR: return "scalar";
	case MS_NVFP4_ISA_AVX2: return "avx2";
	case MS_NVFP4_ISA_AVX512: return "avx512";
	}
	return "?";
}

static int pick_ops(enum ms_nvfp4_isa isa, const struct isa_ops **ops,
		    struct ms_err *err)
{
	if (isa == MS_NVFP4_ISA_AUTO)
		isa = ms_nvfp4_isa_best();
	if (!ms_nvfp4_isa_supported(isa))
		return ms_err_set(err, MS_ENODEV, "this cpu cannot run the %s nvfp4 path",
				  ms_nvfp4_isa_name(isa));
	switch (isa) {
#ifdef NVFP4_X86
	case MS_NVFP4_ISA_AVX512:
		*ops = &ops_avx512;
		break;
	case MS_NVFP4_ISA_AVX2:
		*ops = &ops_avx2;
		break;
#endif
	default:
		*ops = &ops_scalar;
		break;
	}
	return MS_OK;
}

/* ---- threads ------------------------------------------------------------- */

/* Run fn(arg_i) for n work items [0, n) split into contiguous ranges over
 * up to nthreads threads; fn gets (ctx, begin, end, worker index). */
typedef int (*range_fn)(void *ctx, uint64_t begin, uint64_t end, int worker);

struct range_job {
	range_fn fn;
	void *ctx;
	uint64_t begin, end;
	int worker;
	int rc;
};

/* Range i on the pool; its status is kept for run_ranges to pick in
 * worker order, so the pool never stops the other ranges. */
static int range_job(struct ms_pool *pool, size_t i, uint8_t *scratch, struct ms_err *err)
{
	struct range_job *j = &((struct range_job *)pool->ctx)[i];

	j->rc = j->fn(j->ctx, j->begin, j->end, j->worker);
	return MS_OK;
}

/* Threads for n items when each item costs about item_bytes of input:
 * below ~1 MiB per thread a thread costs more than it saves. */
static int thread_count(int nthreads, uint64_t n, uint64_t item_bytes)
{
	uint64_t by_work = item_bytes ? (n * item_bytes) / (1u << 20) : n;

	if (nthreads <= 0)
		nthreads = ms_ncpus();
	if ((uint64_t)nthreads > n)
		nthreads = (int)n;
	if ((uint64_t)nthreads > by_work)
		nthreads = (int)(by_work ? by_work : 1);
	return nthreads < 1 ? 1 : nthreads;
}

/* Returns the first non-zero worker status (in worker order), or MS_OK. */
static int run_ranges(range_fn fn, void *ctx, uint64_t n, int nthreads,
		      struct ms_err *err)
{
	struct range_job *jobs = NULL;
	struct ms_pool pool = { .njobs = (size_t)nthreads, .nthreads = nthreads,
				.run = range_job };
	int rc = MS_OK;

	if (nthreads <= 1 || n <= 1)
		return fn(ctx, 0, n, 0);
	jobs = ms_calloc((size_t)nthreads, sizeof(*jobs));
	if (!jobs) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (int i = 0; i < nthreads; i++) {
		jobs[i].fn = fn;
		jobs[i].ctx = ctx;
		jobs[i].begin = n * (uint64_t)i / (uint64_t)nthreads;
		jobs[i].end = n * (uint64_t)(i + 1) / (uint64_t)nthreads;
		jobs[i].worker = i;
	}
	/* one range per thread, the caller's among them */
	pool.ctx = jobs;
	if ((rc = ms_pool_run(&pool, err)) != MS_OK)
		goto out;
	for (int i = 0; i < nthreads && rc == MS_OK; i++)
		rc = jobs[i].rc;
out:
	ms_free(jobs);
	return rc;
}

/* ---- amax ---------------------------------------------------------------- */

/* Worker statuses (not MS_* codes: the message is made afterwards). */
enum {
	W_OK = 0,
	W_NONFINITE = -1,
	W_ABOVE_AMAX = -2,
	W_NOMEM = -3,
};

struct amax_ctx {
	const struct ms_nvfp4_src *src;
	const struct isa_ops *ops;
	uint64_t n;
	int allow;
	uint32_t *partial; /* per worker */
};

/* Elements [begin, end) of the source, as bit patterns of |x|. */
static int amax_range(struct amax_ctx *c, uint64_t begin, uint64_t end,
		      uint32_t *out)
{
	enum ms_dtype dt = c->src->dtype;
	unsigned sz = dt_size(dt);
	const uint8_t *p = c->src->data;
	uint32_t m = 0;
	uint64_t i = begin;

	for (; i + 16 <= end; i += 16) {
		uint32_t b = c->ops->amax16(p + i * sz, dt);

		if (b >= NONFINITE_BITS) {
			if (!c->allow)
				return W_NONFINITE;
			/* leave the non-finite ones out */
			for (int k = 0; k < 16; k++) {
				uint32_t a = f2u(load1(p + (i + k) * sz, dt)) & 0x7fffffffu;

				if (a < NONFINITE_BITS && a > m)
					m = a;
			}
		} else if (b > m) {
			m = b;
		}
	}
	for (; i < end; i++) {
		uint32_t a = f2u(load1(p + i * sz, dt)) & 0x7fffffffu;

		if (a >= NONFINITE_BITS) {
			if (!c->allow)
				return W_NONFINITE;
			continue;
		}
		if (a > m)
			m = a;
	}
	*out = m;
	return W_OK;
}

/* Items are runs of 16 elements, so the vector code sees whole runs. */
static int amax_worker(void *arg, uint64_t begin, uint64_t end, int worker)
{
	struct amax_ctx *c = arg;
	uint64_t e = end * 16 < c->n ? end * 16 : c->n;

	return amax_range(c, begin * 16, e, &c->partial[worker]);
}

int ms_nvfp4_amax(const struct ms_nvfp4_src *src, int allow_nonfinite,
		  int nthreads, enum ms_nvfp4_isa isa, float *amax,
		  struct ms_err *err)
{
	struct amax_ctx c;
	uint64_t n;
	uint32_t m = 0;
	int rc, nt;

	memset(&c, 0, sizeof(c));
	if (src->dtype != MS_DTYPE_BF16 && src->dtype != MS_DTYPE_F16 &&
	    src->dtype != MS_DTYPE_F32)
		return ms_nvfp4_amax_ref(src, allow_nonfinite, amax, err);
	if (ms_mul_u64(src->rows, src->cols, &n) || n > UINT64_MAX / 4 || (n && !src->data))
		return ms_nvfp4_amax_ref(src, allow_nonfinite, amax, err);
	if ((rc = pick_ops(isa, &c.ops, err)) != MS_OK)
		return rc;
	c.src = src;
	c.n = n;
	c.allow = allow_nonfinite;
	/* items are runs of 16 elements, so worker ranges stay aligned */
	nt = thread_count(nthreads, (n + 15) / 16, 16 * dt_size(src->dtype));
	c.partial = ms_calloc((size_t)nt, sizeof(uint32_t));
	if (!c.partial)
		return ms_err_nomem(err);
	rc = run_ranges(amax_worker, &c, (n + 15) / 16, nt, err);
	if (rc == W_NONFINITE) {
		/* the reference names the first bad element in source order */
		rc = ms_nvfp4_amax_ref(src, 0, amax, err);
		goto out;
	}
	if (rc != MS_OK)
		goto out;
	for (int i = 0; i < nt; i++)
		if (c.partial[i] > m)
			m = c.partial[i];
	*amax = u2f(m);
out:
	ms_free(c.partial);
	return rc;
}

/* ---- quantize ------------------------------------------------------------ */

struct q_ctx {
	const struct ms_nvfp4_src *src;
	const struct ms_nvfp4_tscale *t;
	const struct isa_ops *ops;
	uint64_t R, C, cp, nb;   /* the matrix being quantized: [R, C] */
	uint8_t *packed, *scales;
	int colwise, allow, twod;
	uint32_t amax_bits;
};

/* Bits of the largest finite |x| of a block known to hold a NaN or Inf. */
static uint32_t finite_amax16(const uint8_t *p, enum ms_dtype dt)
{
	unsigned sz = dt_size(dt);
	uint32_t m = 0;

	for (int k = 0; k < 16; k++) {
		uint32_t a = f2u(load1(p + k * sz, dt)) & 0x7fffffffu;

		if (a < NONFINITE_BITS && a > m)
			m = a;
	}
	return m;
}

/* Block maximum with the checks every path makes; W_* status. */
static int block_bits(const struct q_ctx *c, const uint8_t *p, uint32_t *out)
{
	uint32_t b = c->ops->amax16(p, c->src->dtype);

	if (b >= NONFINITE_BITS) {
		if (!c->allow)
			return W_NONFINITE;
		b = finite_amax16(p, c->src->dtype);
	}
	if (b > c->amax_bits)
		return W_ABOVE_AMAX;
	*out = b;
	return W_OK;
}

/* Columns [r0, r0+nr) of the source as rows of tbuf (row stride cp), in
 * 16x16 tiles so that reads and writes both run along rows. */
static void transpose_strip(const struct q_ctx *c, uint64_t r0, uint64_t nr,
			    uint8_t *tbuf)
{
	const uint8_t *src = c->src->data;
	uint64_t cols = c->src->cols;

	for (uint64_t j0 = 0; j0 < c->C; j0 += 16) {
		uint64_t nj = c->C - j0 < 16 ? c->C - j0 : 16;

		if (dt_size(c->src->dtype) == 2) {
			uint16_t tile[16][16], *out = (uint16_t *)tbuf;

			for (uint64_t jj = 0; jj < nj; jj++)
				memcpy(tile[jj], src + ((j0 + jj) * cols + r0) * 2, nr * 2);
			for (uint64_t i = 0; i < nr; i++)
				for (uint64_t jj = 0; jj < nj; jj++)
					out[i * c->cp + j0 + jj] = tile[jj][i];
		} else {
			uint32_t tile[16][16], *out = (uint32_t *)tbuf;

			for (uint64_t jj = 0; jj < nj; jj++)
				memcpy(tile[jj], src + ((j0 + jj) * cols + r0) * 4, nr * 4);
			for (uint64_t i = 0; i < nr; i++)
				for (uint64_t jj = 0; jj < nj; jj++)
					out[i * c->cp + j0 + jj] = tile[jj][i];
		}
	}
}

/* Block b of a row; a rowwise source row ends at C, so its last block is
 * padded in a zeroed copy. */
static const uint8_t *block_ptr(const struct q_ctx *c, const uint8_t *row, uint64_t b,
				uint8_t *tail)
{
	unsigned sz = dt_size(c->src->dtype);

	if (c->colwise || 16 * b + 16 <= c->C)
		return row + 16 * b * sz;
	memset(tail, 0, 16 * 4);
	memcpy(tail, row + 16 * b * sz, (c->C - 16 * b) * sz);
	return tail;
}

static int q_worker(void *arg, uint64_t s_begin, uint64_t s_end, int worker)
{
	struct q_ctx *c = arg;
	enum ms_dtype dt = c->src->dtype;
	unsigned sz = dt_size(dt);
	uint8_t *tbuf = NULL, *tile_s8 = NULL, tail[16 * 4];
	float *tile_f = NULL;
	uint32_t *tile_bits = NULL;
	uint64_t nb16 = (c->nb + 15) & ~(uint64_t)15;
	int rc = W_OK;

	(void)worker;
	if (c->colwise) {
		/* 16 source columns transposed into 16 rows, zero-padded to cp */
		tbuf = ms_calloc(16 * (size_t)c->cp, sz);
		if (!tbuf) {
			rc = W_NOMEM;
			goto out;
		}
	}
	if (c->twod) {
		tile_bits = ms_malloc((size_t)nb16 * sizeof(*tile_bits));
		tile_f = ms_malloc((size_t)nb16 * sizeof(*tile_f));
		tile_s8 = ms_malloc((size_t)nb16);
		if (!tile_bits || !tile_f || !tile_s8) {
			rc = W_NOMEM;
			goto out;
		}
	}
	for (uint64_t s = s_begin; s < s_end; s++) {
		uint64_t r0 = 16 * s, nr = c->R - r0 < 16 ? c->R - r0 : 16;
		const uint8_t *rows[16];

		if (c->colwise) {
			transpose_strip(c, r0, nr, tbuf);
			for (uint64_t i = 0; i < nr; i++)
				rows[i] = tbuf + i * c->cp * sz;
		} else {
			for (uint64_t i = 0; i < nr; i++)
				rows[i] = (const uint8_t *)c->src->data + (r0 + i) * c->C * sz;
		}
		if (c->twod) {
			/* tile maxima over the strip's rows, then their scales
			 * 16 at a time (the arrays are padded to 16) */
			memset(tile_bits, 0, nb16 * sizeof(*tile_bits));
			for (uint64_t i = 0; i < nr; i++) {
				for (uint64_t b = 0; b < c->nb; b++) {
					uint32_t bits;

					if ((rc = block_bits(c, block_ptr(c, rows[i], b, tail), &bits)) != W_OK)
						goto out;
					if (bits > tile_bits[b])
						tile_bits[b] = bits;
				}
			}
			for (uint64_t b0 = 0; b0 < c->nb; b0 += 16)
				c->ops->scales16(c->t, tile_bits + b0, tile_s8 + b0, tile_f + b0);
			for (uint64_t i = 0; i < nr; i++) {
				uint64_t o = (r0 + i) * c->nb;

				memcpy(c->scales + o, tile_s8, c->nb);
				for (uint64_t b = 0; b < c->nb; b++)
					c->ops->encode16(block_ptr(c, rows[i], b, tail), dt, c->t, tile_f[b],
							 c->packed + (o + b) * 8);
			}
			continue;
		}
		for (uint64_t i = 0; i < nr; i++) {
			for (uint64_t b0 = 0; b0 < c->nb; b0 += 16) {
				uint64_t n = c->nb - b0 < 16 ? c->nb - b0 : 16, o = (r0 + i) * c->nb + b0;
				uint32_t bits[16] = {0};
				uint8_t s8[16];
				float f[16];

				for (uint64_t k = 0; k < n; k++)
					if ((rc = block_bits(c, block_ptr(c, rows[i], b0 + k, tail),
							     &bits[k])) != W_OK)
						goto out;
				c->ops->scales16(c->t, bits, s8, f);
				memcpy(c->scales + o, s8, n);
				for (uint64_t k = 0; k < n; k++)
					c->ops->encode16(block_ptr(c, rows[i], b0 + k, tail), dt, c->t, f[k],
							 c->packed + (o + k) * 8);
			}
		}
	}
out:
	ms_free(tbuf);
	ms_free(tile_bits);
	ms_free(tile_f);
	ms_free(tile_s8);
	return rc;
}

int ms_nvfp4_quantize(const struct ms_nvfp4_params *p,
		      const struct ms_nvfp4_src *src, float amax,
		      uint8_t *packed, uint8_t *scales, struct ms_err *err)
{
	uint64_t pshape[2] = {0, 0}, sshape[2] = {0, 0}, n, strips;
	struct ms_nvfp4_tscale t;
	struct q_ctx c;
	int rc, nt;

	memset(&c, 0, sizeof(c));
	if (src->dtype != MS_DTYPE_BF16 && src->dtype != MS_DTYPE_F16 &&
	    src->dtype != MS_DTYPE_F32)
		return ms_nvfp4_quantize_ref(p, src, amax, packed, scales, err);
	if (ms_mul_u64(src->rows, src->cols, &n) || n > UINT64_MAX / 4 ||
	    (n && !src->data))
		return ms_nvfp4_quantize_ref(p, src, amax, packed, scales, err);
	if ((rc = ms_nvfp4_shapes(src->rows, src->cols, p->layout, pshape, sshape,
				  err)) != MS_OK)
		return rc;
	if ((rc = ms_nvfp4_tscale_init_src(p->recipe, amax, src->dtype, &t, err)) != MS_OK)
		return rc;
	if ((rc = pick_ops(p->isa, &c.ops, err)) != MS_OK)
		return rc;
	c.src = src;
	c.t = &t;
	c.colwise = p->layout == MS_NVFP4_LAYOUT_COLUMNWISE;
	c.R = pshape[0];
	c.C = c.colwise ? src->rows : src->cols;
	c.cp = pshape[1] * 2;
	c.nb = sshape[1];
	c.packed = packed;
	c.scales = scales;
	c.allow = (p->flags & MS_NVFP4_ALLOW_NONFINITE) != 0;
	c.twod = p->block == MS_NVFP4_BLOCK_2D;
	c.amax_bits = f2u(amax);
	strips = (c.R + 15) / 16;
	nt = thread_count(p->nthreads, strips, 16 * c.cp * dt_size(src->dtype));
	rc = run_ranges(q_worker, &c, strips, nt, err);
	switch (rc) {
	case W_OK:
		return MS_OK;
	case W_NONFINITE:
		/* the reference names the first bad element in source order */
		return ms_nvfp4_amax_ref(src, 0, &amax, err);
	case W_ABOVE_AMAX: {
		float m = 0.0f;

		if (ms_nvfp4_amax(src, c.allow, p->nthreads, p->isa, &m, err) != MS_OK)
			return err ? err->code : MS_EINVAL;
		return ms_err_set(err, MS_EINVAL,
				  "amax %.9g is below the largest magnitude %.9g",
				  (double)amax, (double)m);
	}
	case W_NOMEM:
		return ms_err_nomem(err);
	default:
		return rc;
	}
}

/* ---- dequantize ---------------------------------------------------------- */

struct dq_ctx {
	const uint8_t *packed, *scales;
	uint64_t rows, cols, pc, nb;
	float tscale;
	enum ms_nvfp4_tscale_kind kind;
	enum ms_dtype out_dtype;
	uint8_t *out;
	const struct isa_ops *ops;
};

static int dq_worker(void *arg, uint64_t begin, uint64_t end, int worker)
{
	struct dq_ctx *c = arg;
	float v[16];

	(void)worker;
	for (uint64_t r = begin; r < end; r++) {
		for (uint64_t b = 0; b < c->nb; b++) {
			float f = ms_nvfp4_block_decode(c->scales[r * c->nb + b], c->tscale,
							c->kind);
			uint64_t n = c->cols - 16 * b < 16 ? c->cols - 16 * b : 16;
			uint64_t o = r * c->cols + 16 * b;

			c->ops->decode16(c->packed + r * c->pc + 8 * b, f, v);
			if (c->out_dtype == MS_DTYPE_F32) {
				memcpy(c->out + 4 * o, v, 4 * n);
			} else {
				for (uint64_t k = 0; k < n; k++) {
					uint32_t u = f2u(v[k]);
					uint16_t h;

					if ((u & 0x7fffffffu) > NONFINITE_BITS)
						h = (uint16_t)((u | 0x400000u) >> 16);
					else
						h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
					memcpy(c->out + 2 * (o + k), &h, 2);
				}
			}
		}
	}
	return W_OK;
}

int ms_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales,
			uint64_t rows, uint64_t cols, float tscale,
			enum ms_nvfp4_tscale_kind kind, enum ms_dtype out_dtype,
			void *out, int nthreads, struct ms_err *err)
{
	uint64_t ps[2] = {0, 0}, ss[2] = {0, 0};
	struct dq_ctx c;
	int rc;

	if (out_dtype != MS_DTYPE_F32 && out_dtype != MS_DTYPE_BF16)
		return ms_nvfp4_dequantize_ref(packed, scales, rows, cols, tscale, kind,
					       out_dtype, out, err);
	if ((rc = ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss,
				  err)) != MS_OK)
		return rc;
	memset(&c, 0, sizeof(c));
	if ((rc = pick_ops(MS_NVFP4_ISA_AUTO, &c.ops, err)) != MS_OK)
		return rc;
	c.packed = packed;
	c.scales = scales;
	c.rows = rows;
	c.cols = cols;
	c.pc = ps[1];
	c.nb = ss[1];
	c.tscale = tscale;
	c.kind = kind;
	c.out_dtype = out_dtype;
	c.out = out;
	rc = run_ranges(dq_worker, &c, rows,
			thread_count(nthreads, rows, cols * 2 + 1), err);
	return rc == W_OK ? MS_OK : rc;
}
