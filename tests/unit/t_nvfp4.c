/*
 * t_nvfp4.c: the NVFP4 codec: the worked example of NVFP4.md, E2M1 and E4M3
 * rounding against an independent nearest-value search, saturation, signed
 * zero, all-zero blocks per recipe, padding, recipe differences worked out
 * by hand, 2D transpose exactness, and the fast path (every instruction set
 * the CPU has, threads) against the reference on many random tensors.
 */
#include <float.h>
#include <math.h>

#include "test.h"
#include "nvfp4.h"

static const enum ms_nvfp4_recipe all_recipes[] = {
	MS_NVFP4_RECIPE_MODELOPT, MS_NVFP4_RECIPE_COMPRESSED_TENSORS,
	MS_NVFP4_RECIPE_TE,
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	uint64_t x = rng_state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

static double rnd01(void)
{
	return (double)(rnd() >> 11) * 0x1p-53;
}

static uint32_t bits_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

/* bfloat16 bits of f, nearest even (finite inputs) */
static uint16_t to_bf16(float f)
{
	uint32_t u = bits_of(f);

	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* Independent E2M1: the nearest of the eight magnitudes by distance in
 * double, ties to the even code, beyond 6 saturating. */
static uint8_t e2m1_nearest(float q)
{
	static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
	double a = fabs((double)q), best = INFINITY;
	uint8_t code = 7;

	for (int k = 0; k < 8; k++) {
		double d = fabs(a - mag[k]);

		if (d < best || (d == best && (k & 1) == 0)) {
			best = d;
			code = (uint8_t)k;
		}
	}
	return (uint8_t)(code | (q < 0 ? 8 : 0));
}

/* Independent E4M3 value by formula. */
static double e4m3_formula(uint8_t b)
{
	int e = (b >> 3) & 15, m = b & 7;
	double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m, -9);

	return (b & 0x80) ? -v : v;
}

static int test_worked_example(void)
{
	static const float vals[16] = {0.1f, -0.3f, 2.5f, 0.0f, 1.0f, -1.75f, 3.3f,
				       0.75f, -0.05f, 0.6f, 2.0f, -4.0f, 0.25f,
				       1.2f, -0.9f, 0.45f};
	static const uint8_t want[8] = {0x90, 0x06, 0xD3, 0x27, 0x28, 0xF5, 0x41, 0x1B};
	uint16_t bf[16];

	for (int i = 0; i < 16; i++)
		bf[i] = to_bf16(vals[i]);
	for (size_t r = 0; r < sizeof(all_recipes) / sizeof(all_recipes[0]); r++) {
		struct ms_nvfp4_params p = {.recipe = all_recipes[r]};
		struct ms_nvfp4_src s = {MS_DTYPE_BF16, bf, 1, 16};
		uint8_t packed[8], scale[1], packed2[8], scale2[1];
		struct ms_err err = {0};

		T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, 10.0f, packed, scale, &err), MS_OK);
		T_ASSERT_MSG(scale[0] == 0x73, "%s: scale 0x%02x",
			     ms_nvfp4_recipe_name(all_recipes[r]), scale[0]);
		T_ASSERT_MSG(!memcmp(packed, want, 8), "%s: packed differs",
			     ms_nvfp4_recipe_name(all_recipes[r]));
		T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, 10.0f, packed2, scale2, &err), MS_OK);
		T_ASSERT(scale2[0] == 0x73 && !memcmp(packed2, want, 8));
	}
	return 0;
}

static int test_e2m1_ties_and_saturation(void)
{
	/* every tie point, with the code the even-code rule gives */
	static const struct { float q; uint8_t code; } ties[] = {
		{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4},
		{2.5f, 4}, {3.5f, 6}, {5.0f, 6},
		{-0.25f, 8}, {-0.75f, 10}, {-1.25f, 10}, {-1.75f, 12},
		{-2.5f, 12}, {-3.5f, 14}, {-5.0f, 14},
	};

	for (size_t i = 0; i < sizeof(ties) / sizeof(ties[0]); i++) {
		float q = ties[i].q;

		T_ASSERT_MSG(ms_nvfp4_e2m1_encode(q) == ties[i].code, "tie %g", (double)q);
		T_ASSERT(e2m1_nearest(q) == ties[i].code);
		/* one ulp either side leaves the tie */
		T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(nextafterf(q, 0.0f)),
				e2m1_nearest(nextafterf(q, 0.0f)));
		T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(nextafterf(q, q * 2)),
				e2m1_nearest(nextafterf(q, q * 2)));
	}
	/* exact values, saturation, infinities, NaN, signed zero */
	for (int k = 0; k < 16; k++)
		T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(ms_nvfp4_e2m1_value((uint8_t)k)),
				k == 8 ? 0 : k);
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(6.0f), 0x7);
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(6.5f), 0x7);
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(-100.0f), 0xF);
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(FLT_MAX), 0x7);
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(INFINITY), 0x7);
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(-INFINITY), 0xF);
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(NAN), 0x7);
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(0.0f), 0x0);
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(-0.0f), 0x0); /* x < 0 is false */
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(-0.08f), 0x8);
	T_ASSERT_EQ_INT(ms_nvfp4_e2m1_encode(-FLT_TRUE_MIN), 0x8);
	/* a dense sweep against the independent search */
	for (int i = 0; i < 200000; i++) {
		float q = (float)(rnd01() * 16.0 - 8.0);

		T_ASSERT_MSG(ms_nvfp4_e2m1_encode(q) == e2m1_nearest(q), "q %.9g", (double)q);
	}
	return 0;
}

static int test_e4m3_rounding(void)
{
	for (int b = 0; b <= 0x7e; b++) {
		double v = e4m3_formula((uint8_t)b);

		T_ASSERT_MSG(ms_nvfp4_e4m3_value((uint8_t)b) == (float)v, "byte 0x%02x", b);
		T_ASSERT_MSG(ms_nvfp4_e4m3_value((uint8_t)(b | 0x80)) == (float)-v, "byte 0x%02x", b | 0x80);
		T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode((float)v), b);
		if (b < 0x7e) {
			double next = e4m3_formula((uint8_t)(b + 1));
			float mid = (float)((v + next) / 2); /* exact: few bits */

			/* the tie goes to the even mantissa */
			T_ASSERT_MSG(ms_nvfp4_e4m3_encode(mid) == ((b & 1) ? b + 1 : b),
				     "tie between 0x%02x and 0x%02x", b, b + 1);
			T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(nextafterf(mid, 0.0f)), b);
			T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(nextafterf(mid, 1000.0f)), b + 1);
		}
	}
	T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(448.0f), 0x7e);
	T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(463.9f), 0x7e);
	T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(464.0f), 0x7e); /* saturates, no NaN */
	T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(1e30f), 0x7e);
	T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(INFINITY), 0x7e);
	T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(-INFINITY), 0xfe);
	T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(NAN), 0x7f);
	T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(0x1p-10f), 0x00); /* tie to 0 */
	T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(0x1.8p-9f), 0x02); /* 1.5 -> 2 */
	T_ASSERT_EQ_INT(ms_nvfp4_e4m3_encode(1e-30f), 0x00);
	T_ASSERT(isnan(ms_nvfp4_e4m3_value(0x7f)) && isnan(ms_nvfp4_e4m3_value(0xff)));
	return 0;
}

static int test_bf16_round(void)
{
	T_ASSERT(ms_nvfp4_bf16_round(1.0f) == 1.0f);
	/* 1 + 2^-8 is the tie between 1 and 1 + 2^-7: even is 1 */
	T_ASSERT(ms_nvfp4_bf16_round(1.0f + 0x1p-8f) == 1.0f);
	T_ASSERT(ms_nvfp4_bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
	T_ASSERT(ms_nvfp4_bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
	T_ASSERT(ms_nvfp4_bf16_round(8.516667f) == 8.5f);
	return 0;
}

/* Scale bytes worked out by hand. Tensor amax 2688 makes ws2 = 1, gs = 1,
 * S_enc = 1. A block maximum of 51.1 (f32): modelopt 51.1/6 = 8.5167 ->
 * e4m3 9 (0x51); compressed-tensors keeps amax / 6 in the source dtype,
 * f32 here, -> 9 (rounded to bf16 it would be 8.5, a tie -> 8, 0x50: see
 * test_ct_round_src); te 51.1 * 0.16666667 -> 9. */
static int test_recipes_differ(void)
{
	float x[16] = {51.1f, 1.0f, -2.0f, 3.0f};
	static const uint8_t want[3] = {0x51, 0x51, 0x51};

	for (int r = 0; r < 3; r++) {
		struct ms_nvfp4_params p = {.recipe = all_recipes[r]};
		struct ms_nvfp4_src s = {MS_DTYPE_F32, x, 1, 16};
		uint8_t packed[8], scale;

		T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, 2688.0f, packed, &scale, NULL), MS_OK);
		T_ASSERT_MSG(scale == want[r], "%s: 0x%02x", ms_nvfp4_recipe_name(all_recipes[r]), scale);
		/* 51.1/9 = 5.68 -> 6 (code 7); 51.1/8 = 6.39 saturates too */
		T_ASSERT_EQ_INT(packed[0] & 15, 7);
	}
	return 0;
}

/* compressed-tensors rounds amax / 6 to the source dtype before the
 * product with gs: tensor amax 10 (gs 270 for bf16), block maximum
 * 0.1884765625 (bf16): /6 = 0.031412760 -> bf16 0.031494141, * 270 =
 * 8.5034 -> 0x51, where the unrounded 8.4814 would give 0x50. An f32
 * source of the same values: gs 268.800018, no rounding -> 0x50. */
static int test_ct_round_src(void)
{
	static const uint16_t bf[16] = {0x3e41}; /* 0.1884765625 */
	float f[16] = {0.1884765625f};
	struct ms_nvfp4_params p = {.recipe = MS_NVFP4_RECIPE_COMPRESSED_TENSORS};
	struct ms_nvfp4_src sb = {MS_DTYPE_BF16, bf, 1, 16}, sf = {MS_DTYPE_F32, f, 1, 16};
	uint8_t packed[8], scale;

	T_ASSERT(ms_nvfp4_bf16_round(0.1884765625f) == 0.1884765625f);
	T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &sb, 10.0f, packed, &scale, NULL), MS_OK);
	T_ASSERT_MSG(scale == 0x51, "bf16: 0x%02x", scale);
	T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &sb, 10.0f, packed, &scale, NULL), MS_OK);
	T_ASSERT_MSG(scale == 0x51, "bf16 fast: 0x%02x", scale);
	T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &sf, 10.0f, packed, &scale, NULL), MS_OK);
	T_ASSERT_MSG(scale == 0x50, "f32: 0x%02x", scale);
	T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &sf, 10.0f, packed, &scale, NULL), MS_OK);
	T_ASSERT_MSG(scale == 0x50, "f32 fast: 0x%02x", scale);
	/* f16 rounding: ties to even, subnormals, overflow */
	T_ASSERT(ms_nvfp4_round_src(1.0f + 0x1p-11f, MS_DTYPE_F16) == 1.0f);
	T_ASSERT(ms_nvfp4_round_src(1.0f + 3 * 0x1p-11f, MS_DTYPE_F16) == 1.0f + 0x1p-9f);
	T_ASSERT(ms_nvfp4_round_src(0x1p-25f + 0x1p-30f, MS_DTYPE_F16) == 0x1p-24f);
	T_ASSERT(ms_nvfp4_round_src(0x1p-25f, MS_DTYPE_F16) == 0.0f);
	T_ASSERT(ms_nvfp4_round_src(65519.0f, MS_DTYPE_F16) == 65504.0f);
	T_ASSERT(isinf(ms_nvfp4_round_src(65520.0f, MS_DTYPE_F16)));
	T_ASSERT(ms_nvfp4_round_src(0.1f, MS_DTYPE_F32) == 0.1f);
	return 0;
}

static int test_tensor_scales(void)
{
	struct ms_nvfp4_tscale t;

	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_MODELOPT, 10.0f, &t, NULL), MS_OK);
	T_ASSERT(t.stored == 10.0f / 2688.0f && t.kind == MS_NVFP4_TSCALE_MUL);
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init_src(MS_NVFP4_RECIPE_COMPRESSED_TENSORS, 10.0f,
						 MS_DTYPE_F32, &t, NULL), MS_OK);
	{
		volatile float r = 1.0f / 10.0f, gs = r * 2688.0f;

		/* two f32 roundings (268.800018), not 2688 / 10 (268.8) */
		T_ASSERT(t.stored == gs && t.stored != 2688.0f / 10.0f);
	}
	T_ASSERT(t.kind == MS_NVFP4_TSCALE_DIV);
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_TE, 10.0f, &t, NULL), MS_OK);
	T_ASSERT(t.stored == 1.0f / (2688.0f / 10.0f) && t.kind == MS_NVFP4_TSCALE_MUL);
	/* both stored forms, each as the recipe computes it */
	T_ASSERT(t.scale_2 == 1.0f / (2688.0f / 10.0f) && t.global_scale == 2688.0f / 10.0f);
	T_ASSERT(ms_nvfp4_tscale_value(&t, MS_NVFP4_TSCALE_DIV) == 2688.0f / 10.0f);
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_MODELOPT, 10.0f, &t, NULL), MS_OK);
	T_ASSERT(t.scale_2 == 10.0f / 2688.0f && t.global_scale == 1.0f / (10.0f / 2688.0f));
	/* compressed-tensors on a bf16 weight: 1/10 -> 0.10009765625,
	 * * 2688 = 269.0625 -> 270 (bf16) */
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init_src(MS_NVFP4_RECIPE_COMPRESSED_TENSORS, 10.0f,
						 MS_DTYPE_BF16, &t, NULL), MS_OK);
	T_ASSERT(t.global_scale == 270.0f && t.scale_2 == 1.0f / 270.0f);
	/* the value real bf16 checkpoints carry where 2688 / amax would be
	 * 35516.285 */
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init_src(MS_NVFP4_RECIPE_COMPRESSED_TENSORS, 0.07568359375f,
						 MS_DTYPE_BF16, &t, NULL), MS_OK);
	T_ASSERT(t.global_scale == 35328.0f);
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_COMPRESSED_TENSORS, 0.07568359375f,
					     &t, NULL), MS_OK);
	T_ASSERT(t.global_scale == 35328.0f);
	/* f16: 1/10 -> 0.0999755859375, * 2688 = 268.734375 -> 268.75; the
	 * clamp is f16's smallest normal, and an overflow to Inf gives 1 */
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init_src(MS_NVFP4_RECIPE_COMPRESSED_TENSORS, 10.0f,
						 MS_DTYPE_F16, &t, NULL), MS_OK);
	T_ASSERT(t.global_scale == 268.75f);
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init_src(MS_NVFP4_RECIPE_COMPRESSED_TENSORS, 0.01f,
						 MS_DTYPE_F16, &t, NULL), MS_OK);
	T_ASSERT(t.global_scale == 1.0f);
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init_src(MS_NVFP4_RECIPE_COMPRESSED_TENSORS, 1.0f,
						 MS_DTYPE_I32, &t, NULL), MS_EINVAL);
	/* degenerate amax */
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_COMPRESSED_TENSORS, 0.0f, &t, NULL), MS_OK);
	T_ASSERT(t.stored == 1.0f); /* 2688 / FLT_MIN overflows */
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_TE, 0.0f, &t, NULL), MS_OK);
	T_ASSERT(t.stored == 1.0f);
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_MODELOPT, 0.0f, &t, NULL), MS_OK);
	T_ASSERT(t.stored == 0.0f);
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_MODELOPT, NAN, &t, NULL), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_MODELOPT, -1.0f, &t, NULL), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_TE, INFINITY, &t, NULL), MS_EINVAL);
	return 0;
}

static int test_zero_blocks(void)
{
	static const uint8_t zero_byte[3] = {0x38, 0x20, 0x00};
	float x[2 * 32];

	for (int i = 0; i < 64; i++)
		x[i] = (i % 32) < 16 ? 0.0f : (float)(i - 40) * 0.37f + 0.1f;
	x[1] = -0.0f;
	for (int r = 0; r < 3; r++) {
		for (int blk = 0; blk < 2; blk++) {
			struct ms_nvfp4_params p = {.recipe = all_recipes[r],
						    .block = (enum ms_nvfp4_block)blk};
			struct ms_nvfp4_src s = {MS_DTYPE_F32, x, 2, 32};
			struct ms_nvfp4_src z = {MS_DTYPE_F32, x, 1, 16};
			uint8_t packed[32], scales[4], fpacked[32], fscales[4];
			float amax;

			T_ASSERT_EQ_INT(ms_nvfp4_amax_ref(&s, 0, &amax, NULL), MS_OK);
			T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, amax, packed, scales, NULL), MS_OK);
			T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, amax, fpacked, fscales, NULL), MS_OK);
			T_ASSERT(!memcmp(packed, fpacked, 32) && !memcmp(scales, fscales, 4));
			for (int row = 0; row < 2; row++) {
				T_ASSERT_EQ_INT(scales[row * 2], zero_byte[r]);
				for (int k = 0; k < 8; k++)
					T_ASSERT_EQ_INT(packed[row * 16 + k], 0);
				T_ASSERT(scales[row * 2 + 1] != zero_byte[r]);
			}
			/* an all-zero tensor (amax 0) */
			T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &z, 0.0f, packed, scales, NULL), MS_OK);
			T_ASSERT_EQ_INT(scales[0], zero_byte[r]);
			for (int k = 0; k < 8; k++)
				T_ASSERT_EQ_INT(packed[k], 0);
			T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &z, 0.0f, fpacked, fscales, NULL), MS_OK);
			T_ASSERT(fscales[0] == zero_byte[r] && !memcmp(packed, fpacked, 8));
		}
	}
	return 0;
}

static int test_padding(void)
{
	/* [3, 20] pads to 32 columns: the bytes are those of the explicitly
	 * zero-padded [3, 32], and the shapes say so */
	float x[3 * 20], xp[3 * 32];
	uint64_t ps[2], ss[2];

	memset(xp, 0, sizeof(xp));
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 20; j++)
			xp[i * 32 + j] = x[i * 20 + j] = (float)((i * 7 + j * 3) % 11) - 5.3f;
	T_ASSERT_EQ_INT(ms_nvfp4_shapes(3, 20, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, NULL), MS_OK);
	T_ASSERT(ps[0] == 3 && ps[1] == 16 && ss[0] == 3 && ss[1] == 2);
	T_ASSERT_EQ_INT(ms_nvfp4_shapes(3, 20, MS_NVFP4_LAYOUT_COLUMNWISE, ps, ss, NULL), MS_OK);
	T_ASSERT(ps[0] == 20 && ps[1] == 8 && ss[0] == 20 && ss[1] == 1);
	for (int r = 0; r < 3; r++) {
		for (int blk = 0; blk < 2; blk++) {
			struct ms_nvfp4_params p = {.recipe = all_recipes[r],
						    .block = (enum ms_nvfp4_block)blk};
			struct ms_nvfp4_src s = {MS_DTYPE_F32, x, 3, 20};
			struct ms_nvfp4_src sp = {MS_DTYPE_F32, xp, 3, 32};
			uint8_t a[48], as[6], b[48], bs[6], c[48], cs[6];

			T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, 5.3f, a, as, NULL), MS_OK);
			T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &sp, 5.3f, b, bs, NULL), MS_OK);
			T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, 5.3f, c, cs, NULL), MS_OK);
			T_ASSERT(!memcmp(a, b, 48) && !memcmp(as, bs, 6));
			T_ASSERT(!memcmp(a, c, 48) && !memcmp(as, cs, 6));
			for (int i = 0; i < 3; i++)
				for (int k = 10; k < 16; k++)
					T_ASSERT_EQ_INT(a[i * 16 + k], 0);
		}
	}
	return 0;
}

/* Random source values that are never zero: per 16-element run a regime
 * (ordinary, wide exponent range, mixed huge and tiny, subnormal, exact
 * ties against the scale that amax 2688 gives, near-saturation). */
static void fill_random(float *x, uint64_t n, int f16_range, int *tie_used)
{
	static const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,
				     0.5f, 1.0f, 6.0f};
	float lim = f16_range ? 60000.0f : 1e37f;

	for (uint64_t i = 0; i < n; i += 16) {
		int regime = (int)(rnd() % 6);
		float s = (float)e4m3_formula((uint8_t)(rnd() % 0x60 + 0x10));

		for (uint64_t k = i; k < i + 16 && k < n; k++) {
			double m = 1.0 + rnd01(), v;

			switch (regime) {
			case 0:
				v = m * ldexp(1.0, (int)(rnd() % 9) - 4);
				break;
			case 1:
				v = m * ldexp(1.0, (int)(rnd() % (f16_range ? 30 : 120)) -
							   (f16_range ? 15 : 60));
				break;
			case 2:
				v = (rnd() & 1) ? m * 1e-30 : m * 1e4;
				if (f16_range)
					v = (rnd() & 1) ? m * 1e-7 : m * 1e4;
				break;
			case 3:
				v = m * (f16_range ? 0x1p-20 : 0x1p-130);
				break;
			case 4:
				/* x / s lands on a threshold when the block max
				 * is 6 s: then every recipe's scale is s */
				v = (k == i) ? 6.0 * s : s * ties[rnd() % 10];
				*tie_used = 1;
				break;
			default:
				v = m * 2.9;
				break;
			}
			if (v > lim)
				v = lim;
			x[k] = (float)((rnd() & 1) ? -v : v);
			if (x[k] == 0.0f)
				x[k] = 1.0f;
		}
	}
}

static void *make_src(const float *x, uint64_t n, enum ms_dtype dt)
{
	uint8_t *p = malloc(n * 4 + 1);

	if (!p)
		return NULL;
	for (uint64_t i = 0; i < n; i++) {
		if (dt == MS_DTYPE_F32) {
			memcpy(p + 1 + 4 * i, &x[i], 4);
		} else {
			uint16_t h = dt == MS_DTYPE_BF16 ? to_bf16(x[i]) : ms_f32_to_f16(x[i]);

			memcpy(p + 1 + 2 * i, &h, 2);
		}
	}
	return p;
}

/* Quantize with the reference and with every fast variant; compare. */
static int compare_paths(const struct ms_nvfp4_params *base,
			 const struct ms_nvfp4_src *s, float amax)
{
	uint64_t ps[2], ss[2];
	uint8_t *rp, *rs, *fp, *fs;
	struct ms_err err = {0};
	int rc, bad = 0;
	static const enum ms_nvfp4_isa isas[] = {MS_NVFP4_ISA_SCALAR, MS_NVFP4_ISA_AVX2,
						 MS_NVFP4_ISA_AVX512};

	if (ms_nvfp4_shapes(s->rows, s->cols, base->layout, ps, ss, NULL))
		return 1;
	rp = calloc(ps[0] * ps[1] + 1, 1);
	rs = calloc(ss[0] * ss[1] + 1, 1);
	fp = calloc(ps[0] * ps[1] + 1, 1);
	fs = calloc(ss[0] * ss[1] + 1, 1);
	rc = ms_nvfp4_quantize_ref(base, s, amax, rp, rs, &err);
	if (rc != MS_OK) {
		fprintf(stderr, "reference: %s\n", err.msg);
		bad = 1;
	}
	for (size_t i = 0; !bad && i < 3; i++) {
		struct ms_nvfp4_params p = *base;

		if (!ms_nvfp4_isa_supported(isas[i]))
			continue;
		p.isa = isas[i];
		memset(fp, 0xaa, ps[0] * ps[1]);
		memset(fs, 0xaa, ss[0] * ss[1]);
		rc = ms_nvfp4_quantize(&p, s, amax, fp, fs, &err);
		if (rc != MS_OK || memcmp(rp, fp, ps[0] * ps[1]) ||
		    memcmp(rs, fs, ss[0] * ss[1])) {
			fprintf(stderr, "%s %s %s %s [%llu,%llu] %s: fast path differs (rc %d)\n",
				ms_nvfp4_isa_name(isas[i]), ms_nvfp4_recipe_name(p.recipe),
				ms_nvfp4_block_name(p.block), ms_nvfp4_layout_name(p.layout),
				(unsigned long long)s->rows, (unsigned long long)s->cols,
				ms_dtype_name(s->dtype), rc);
			bad = 1;
		}
	}
	free(rp);
	free(rs);
	free(fp);
	free(fs);
	return bad;
}

static int test_fast_matches_reference(void)
{
	static const uint64_t shapes[][2] = {
		{1, 16}, {3, 20}, {16, 16}, {17, 33}, {64, 64}, {5, 1}, {1, 5},
		{33, 250}, {48, 96}, {40, 17}, {128, 160},
	};
	static const enum ms_dtype dts[] = {MS_DTYPE_BF16, MS_DTYPE_F16, MS_DTYPE_F32};
	int cases = 0;

	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		for (size_t di = 0; di < 3; di++) {
			uint64_t n = shapes[si][0] * shapes[si][1];
			float *x = malloc(n * 4);
			int tie = 0;
			uint8_t *buf;
			struct ms_nvfp4_src s;
			float amax;

			fill_random(x, n, dts[di] == MS_DTYPE_F16, &tie);
			buf = make_src(x, n, dts[di]);
			/* unaligned on purpose: tensors in files need not be */
			s = (struct ms_nvfp4_src){dts[di], buf + 1, shapes[si][0], shapes[si][1]};
			T_ASSERT_EQ_INT(ms_nvfp4_amax_ref(&s, 0, &amax, NULL), MS_OK);
			for (int r = 0; r < 3; r++) {
				for (int blk = 0; blk < 2; blk++) {
					for (int lay = 0; lay < 2; lay++) {
						struct ms_nvfp4_params p = {
							.recipe = all_recipes[r],
							.block = (enum ms_nvfp4_block)blk,
							.layout = (enum ms_nvfp4_layout)lay,
							.nthreads = 1,
						};

						T_ASSERT(!compare_paths(&p, &s, amax));
						/* the scale of a fused group, and the
						 * one that makes exact ties */
						T_ASSERT(!compare_paths(&p, &s, amax * 3.0f));
						if (tie && amax <= 2688.0f)
							T_ASSERT(!compare_paths(&p, &s, 2688.0f));
						cases++;
					}
				}
			}
			free(buf);
			free(x);
		}
	}
	T_ASSERT(cases > 0);
	return 0;
}

/* Whole tensors in one extreme regime, so that the tensor scale itself is
 * extreme: subnormal ws2, gs near overflow, e4m3 scales that underflow,
 * te's inverse overflowing to FLT_MAX. */
static int test_fast_extremes(void)
{
	static const double base[] = {1e-38, 1e-42, 3e38, 1e-30, 5e-8, 1.0};
	uint64_t rows = 37, cols = 70, n = rows * cols;
	float *x = malloc(n * 4);

	for (size_t bi = 0; bi < sizeof(base) / sizeof(base[0]); bi++) {
		for (int mix = 0; mix < 2; mix++) {
			struct ms_nvfp4_src s = {MS_DTYPE_F32, x, rows, cols};
			float amax;

			for (uint64_t i = 0; i < n; i++) {
				double v = base[bi] * (0.5 + rnd01());

				/* mix: one block in a thousand far larger */
				if (mix && i % 1000 == 7)
					v = base[bi] < 1 ? 1e30 : 1.0;
				if (v > 3.4e38)
					v = 3.4e38;
				x[i] = (float)((rnd() & 1) ? -v : v);
			}
			T_ASSERT_EQ_INT(ms_nvfp4_amax_ref(&s, 0, &amax, NULL), MS_OK);
			for (int r = 0; r < 3; r++) {
				for (int blk = 0; blk < 2; blk++) {
					for (int lay = 0; lay < 2; lay++) {
						struct ms_nvfp4_params p = {
							.recipe = all_recipes[r],
							.block = (enum ms_nvfp4_block)blk,
							.layout = (enum ms_nvfp4_layout)lay,
							.nthreads = 1,
						};

						T_ASSERT_MSG(!compare_paths(&p, &s, amax), "base %g mix %d",
							     base[bi], mix);
					}
				}
			}
		}
	}
	free(x);
	return 0;
}

static int test_fast_threads(void)
{
	/* big enough that the fast path starts several threads */
	uint64_t rows = 512, cols = 1040, n = rows * cols;
	float *x = malloc(n * 4), amax;
	int tie = 0;
	uint8_t *buf;
	struct ms_nvfp4_src s;

	fill_random(x, n, 0, &tie);
	buf = make_src(x, n, MS_DTYPE_F32);
	s = (struct ms_nvfp4_src){MS_DTYPE_F32, buf + 1, rows, cols};
	T_ASSERT_EQ_INT(ms_nvfp4_amax(&s, 0, 4, MS_NVFP4_ISA_AUTO, &amax, NULL), MS_OK);
	{
		float r;

		T_ASSERT_EQ_INT(ms_nvfp4_amax_ref(&s, 0, &r, NULL), MS_OK);
		T_ASSERT(r == amax);
	}
	for (int blk = 0; blk < 2; blk++) {
		for (int lay = 0; lay < 2; lay++) {
			struct ms_nvfp4_params p = {
				.recipe = all_recipes[(blk + lay) % 3],
				.block = (enum ms_nvfp4_block)blk,
				.layout = (enum ms_nvfp4_layout)lay,
				.nthreads = 4,
			};

			T_ASSERT(!compare_paths(&p, &s, amax));
		}
	}
	free(buf);
	free(x);
	return 0;
}

static int test_nonfinite(void)
{
	float x[4 * 32];
	struct ms_err err = {0};
	uint8_t packed[256], scales[32], p2[256], s2[32]; /* fits both layouts */

	for (int i = 0; i < 128; i++)
		x[i] = (float)(i % 13) - 6.5f;
	x[37] = NAN;
	x[50] = INFINITY;
	x[3] = -INFINITY; /* after 37 in columnwise order, before in source order */
	for (int lay = 0; lay < 2; lay++) {
		struct ms_nvfp4_params p = {.layout = (enum ms_nvfp4_layout)lay};
		struct ms_nvfp4_src s = {MS_DTYPE_F32, x, 4, 32};
		float amax;

		T_ASSERT_EQ_INT(ms_nvfp4_amax_ref(&s, 0, &amax, &err), MS_EINVAL);
		T_ASSERT_STR(err.msg, "non-finite value (-inf) at element 3");
		T_ASSERT_EQ_INT(ms_nvfp4_amax(&s, 0, 2, MS_NVFP4_ISA_AUTO, &amax, &err), MS_EINVAL);
		T_ASSERT_STR(err.msg, "non-finite value (-inf) at element 3");
		T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, 6.5f, packed, scales, &err), MS_EINVAL);
		T_ASSERT_STR(err.msg, "non-finite value (-inf) at element 3");
		T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, 6.5f, packed, scales, &err), MS_EINVAL);
		T_ASSERT_STR(err.msg, "non-finite value (-inf) at element 3");
		/* allowed: skipped by amax, encoded by the element rule */
		T_ASSERT_EQ_INT(ms_nvfp4_amax(&s, 1, 1, MS_NVFP4_ISA_AUTO, &amax, &err), MS_OK);
		T_ASSERT(amax == 6.5f);
		p.flags = MS_NVFP4_ALLOW_NONFINITE;
		for (int r = 0; r < 3; r++) {
			p.recipe = all_recipes[r];
			for (int blk = 0; blk < 2; blk++) {
				p.block = (enum ms_nvfp4_block)blk;
				T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, amax, packed, scales, &err), MS_OK);
				T_ASSERT(!compare_paths(&p, &s, amax));
				T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, amax, p2, s2, &err), MS_OK);
				if (lay == 0) {
					/* rowwise: element 37 is row 1, col 5;
					 * 50 row 1, col 18; 3 row 0, col 3 */
					T_ASSERT_EQ_INT((packed[16 + 2] >> 4) & 15, 0x7);
					T_ASSERT_EQ_INT(packed[16 + 9] & 15, 0x7);
					T_ASSERT_EQ_INT((packed[1] >> 4) & 15, 0xF);
				}
			}
		}
	}
	return 0;
}

static int test_amax_below(void)
{
	float x[16] = {1, 2, 3, -7};
	struct ms_nvfp4_params p = {0};
	struct ms_nvfp4_src s = {MS_DTYPE_F32, x, 1, 16};
	uint8_t packed[8], scale[1];
	struct ms_err err = {0};

	T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, 6.0f, packed, scale, &err), MS_EINVAL);
	T_ASSERT_STR(err.msg, "amax 6 is below the largest magnitude 7");
	T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, 6.0f, packed, scale, &err), MS_EINVAL);
	T_ASSERT_STR(err.msg, "amax 6 is below the largest magnitude 7");
	return 0;
}

static int test_transpose_2d_exact(void)
{
	for (int iter = 0; iter < 40; iter++) {
		uint64_t rows = 1 + rnd() % 70, cols = 1 + rnd() % 70, n = rows * cols;
		uint64_t ps[2], ss[2], pt[2], st[2];
		float *x = malloc(n * 4), *xt = malloc(n * 4), amax;
		int tie = 0;
		uint8_t *a, *as, *b, *bs, *c, *cs, *d, *ds;
		struct ms_nvfp4_params p = {.recipe = all_recipes[iter % 3],
					    .block = MS_NVFP4_BLOCK_2D};
		struct ms_nvfp4_src s, sT;
		struct ms_err err = {0};

		fill_random(x, n, 0, &tie);
		for (uint64_t i = 0; i < rows; i++)
			for (uint64_t j = 0; j < cols; j++)
				xt[j * rows + i] = x[i * cols + j];
		s = (struct ms_nvfp4_src){MS_DTYPE_F32, x, rows, cols};
		sT = (struct ms_nvfp4_src){MS_DTYPE_F32, xt, cols, rows};
		T_ASSERT_EQ_INT(ms_nvfp4_amax_ref(&s, 0, &amax, NULL), MS_OK);
		ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, NULL);
		ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_COLUMNWISE, pt, st, NULL);
		a = malloc(ps[0] * ps[1] + 1); as = malloc(ss[0] * ss[1] + 1);
		b = malloc(pt[0] * pt[1] + 1); bs = malloc(st[0] * st[1] + 1);
		c = malloc(pt[0] * pt[1] + 1); cs = malloc(st[0] * st[1] + 1);
		d = malloc(ps[0] * ps[1] + 1); ds = malloc(ss[0] * ss[1] + 1);
		/* quantize(W) transposed == quantize(W^T), from the source
		 * transposed here (not by the codec) */
		T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, amax, a, as, NULL), MS_OK);
		T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &sT, amax, b, bs, NULL), MS_OK);
		T_ASSERT_EQ_INT(ms_nvfp4_transpose(MS_NVFP4_BLOCK_2D, rows, cols, a, as, c, cs, &err), MS_OK);
		T_ASSERT_MSG(!memcmp(b, c, pt[0] * pt[1]) && !memcmp(bs, cs, st[0] * st[1]),
			     "[%llu, %llu] %s", (unsigned long long)rows,
			     (unsigned long long)cols, ms_nvfp4_recipe_name(p.recipe));
		/* the columnwise layout is the same bytes */
		p.layout = MS_NVFP4_LAYOUT_COLUMNWISE;
		T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, amax, c, cs, NULL), MS_OK);
		T_ASSERT(!memcmp(b, c, pt[0] * pt[1]) && !memcmp(bs, cs, st[0] * st[1]));
		/* and back */
		T_ASSERT_EQ_INT(ms_nvfp4_transpose(MS_NVFP4_BLOCK_2D, cols, rows, b, bs, d, ds, &err), MS_OK);
		T_ASSERT(!memcmp(a, d, ps[0] * ps[1]) && !memcmp(as, ds, ss[0] * ss[1]));
		/* 1D: refused */
		T_ASSERT_EQ_INT(ms_nvfp4_transpose(MS_NVFP4_BLOCK_1D, rows, cols, a, as, c, cs, &err), MS_EINVAL);
		T_ASSERT(strstr(err.msg, "high-precision source"));
		/* not a 2D quantization: a tile whose rows disagree */
		if (rows > 1) {
			as[ss[1]] ^= 1;
			T_ASSERT_EQ_INT(ms_nvfp4_transpose(MS_NVFP4_BLOCK_2D, rows, cols, a, as, c, cs, &err), MS_EINVAL);
			as[ss[1]] ^= 1;
		}
		free(x); free(xt); free(a); free(as); free(b); free(bs);
		free(c); free(cs); free(d); free(ds);
	}
	return 0;
}

static int test_1d_columnwise_is_transpose_source(void)
{
	/* 1D columnwise quantizes W^T: same bytes as rowwise of W^T, and in
	 * general not the transpose of the rowwise bytes */
	uint64_t rows = 48, cols = 32, n = rows * cols;
	float x[48 * 32], xt[48 * 32], amax;
	uint8_t a[32 * 24], as[32 * 3], b[32 * 24], bs[32 * 3];
	int tie = 0;
	struct ms_nvfp4_params p = {.layout = MS_NVFP4_LAYOUT_COLUMNWISE};
	struct ms_nvfp4_params q = {0};
	struct ms_nvfp4_src s = {MS_DTYPE_F32, x, rows, cols}, sT = {MS_DTYPE_F32, xt, cols, rows};

	fill_random(x, n, 0, &tie);
	for (uint64_t i = 0; i < rows; i++)
		for (uint64_t j = 0; j < cols; j++)
			xt[j * rows + i] = x[i * cols + j];
	T_ASSERT_EQ_INT(ms_nvfp4_amax_ref(&s, 0, &amax, NULL), MS_OK);
	T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, amax, a, as, NULL), MS_OK);
	T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&q, &sT, amax, b, bs, NULL), MS_OK);
	T_ASSERT(!memcmp(a, b, sizeof(a)) && !memcmp(as, bs, sizeof(as)));
	return 0;
}

static int test_dequantize(void)
{
	uint64_t rows = 37, cols = 45, n = rows * cols;
	uint64_t ps[2], ss[2];
	float *x = malloc(n * 4), *ref = malloc(n * 4), *fast = malloc(n * 4), amax;
	uint16_t *rb = malloc(n * 2), *fb = malloc(n * 2);
	int tie = 0;

	fill_random(x, n, 0, &tie);
	ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, NULL);
	for (int r = 0; r < 3; r++) {
		struct ms_nvfp4_params p = {.recipe = all_recipes[r]};
		struct ms_nvfp4_src s = {MS_DTYPE_F32, x, rows, cols};
		struct ms_nvfp4_tscale t;
		uint8_t *packed = malloc(ps[0] * ps[1]), *scales = malloc(ss[0] * ss[1]);

		T_ASSERT_EQ_INT(ms_nvfp4_amax_ref(&s, 0, &amax, NULL), MS_OK);
		T_ASSERT_EQ_INT(ms_nvfp4_tscale_init_src(p.recipe, amax, s.dtype, &t, NULL), MS_OK);
		T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, amax, packed, scales, NULL), MS_OK);
		T_ASSERT_EQ_INT(ms_nvfp4_dequantize_ref(packed, scales, rows, cols, t.stored, t.kind,
							MS_DTYPE_F32, ref, NULL), MS_OK);
		T_ASSERT_EQ_INT(ms_nvfp4_dequantize(packed, scales, rows, cols, t.stored, t.kind,
						    MS_DTYPE_F32, fast, 3, NULL), MS_OK);
		T_ASSERT(!memcmp(ref, fast, n * 4));
		T_ASSERT_EQ_INT(ms_nvfp4_dequantize_ref(packed, scales, rows, cols, t.stored, t.kind,
							MS_DTYPE_BF16, rb, NULL), MS_OK);
		T_ASSERT_EQ_INT(ms_nvfp4_dequantize(packed, scales, rows, cols, t.stored, t.kind,
						    MS_DTYPE_BF16, fb, 3, NULL), MS_OK);
		T_ASSERT(!memcmp(rb, fb, n * 2));
		for (uint64_t i = 0; i < rows; i++) {
			for (uint64_t j = 0; j < cols; j++) {
				uint8_t code = (packed[i * ps[1] + j / 2] >> (4 * (j & 1))) & 15;
				double sv = e4m3_formula(scales[i * ss[1] + j / 16]);
				double e = (code & 7) < 4 ? (code & 7) * 0.5 : ((code & 7) == 7 ? 6 : (code & 7) - 2);
				float blk = t.kind == MS_NVFP4_TSCALE_DIV ? (float)sv / t.stored
									  : (float)sv * t.stored;
				float want = (float)((code & 8) ? -e : e) * blk;
				float got = ref[i * cols + j];

				T_ASSERT_MSG(bits_of(got) == bits_of(want), "[%llu,%llu]",
					     (unsigned long long)i, (unsigned long long)j);
				T_ASSERT_EQ_INT(rb[i * cols + j], to_bf16(want));
			}
		}
		free(packed);
		free(scales);
	}
	free(x); free(ref); free(fast); free(rb); free(fb);
	return 0;
}

static int test_bad_arguments(void)
{
	uint16_t h[16] = {0};
	struct ms_nvfp4_params p = {0};
	struct ms_nvfp4_src s = {MS_DTYPE_I32, h, 1, 8};
	uint8_t packed[8], scale[1];
	struct ms_err err = {0};
	enum ms_nvfp4_recipe r;

	T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, 1.0f, packed, scale, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "cannot be quantized"));
	T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, 1.0f, packed, scale, &err), MS_EINVAL);
	s.dtype = MS_DTYPE_BF16;
	T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, NAN, packed, scale, &err), MS_EINVAL);
	s.rows = UINT64_MAX / 2;
	T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, 1.0f, packed, scale, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_nvfp4_recipe_parse("compressed-tensors", &r), MS_OK);
	T_ASSERT_EQ_INT(r, MS_NVFP4_RECIPE_COMPRESSED_TENSORS);
	T_ASSERT_EQ_INT(ms_nvfp4_recipe_parse("fp4", &r), MS_EINVAL);
	/* an empty matrix is fine and writes nothing */
	s.rows = 0;
	T_ASSERT_EQ_INT(ms_nvfp4_quantize(&p, &s, 0.0f, packed, scale, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&p, &s, 0.0f, packed, scale, &err), MS_OK);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_worked_example),
	T_CASE(test_e2m1_ties_and_saturation),
	T_CASE(test_e4m3_rounding),
	T_CASE(test_bf16_round),
	T_CASE(test_ct_round_src),
	T_CASE(test_recipes_differ),
	T_CASE(test_tensor_scales),
	T_CASE(test_zero_blocks),
	T_CASE(test_padding),
	T_CASE(test_fast_matches_reference),
	T_CASE(test_fast_extremes),
	T_CASE(test_fast_threads),
	T_CASE(test_nonfinite),
	T_CASE(test_amax_below),
	T_CASE(test_transpose_2d_exact),
	T_CASE(test_1d_columnwise_is_transpose_source),
	T_CASE(test_dequantize),
	T_CASE(test_bad_arguments),
};

T_MAIN(cases)
