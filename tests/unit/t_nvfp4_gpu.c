/*
 * t_nvfp4_gpu.c: every GPU codec entry point (gpu.h) against the CPU
 * reference (nvfp4.h, the _ref functions), byte for byte, on seeded random
 * inputs of many shapes: ragged ones that need padding, ties on the E2M1
 * and E4M3 rounding boundaries, block maxima at amax (448 * 6 * S), tiny
 * values that give subnormal quotients, zero and negative-zero blocks,
 * tensors whose tensor scale underflows, NaN and Inf with and without
 * MS_NVFP4_ALLOW_NONFINITE, and the errors (same code, same message where
 * the reference's is reproducible). GPU outputs are poisoned before each
 * run so an unwritten byte cannot pass.
 *
 * GPU tier: tests/run.sh runs this binary only for `make test-gpu`. With
 * MS_TEST_GPU set a missing GPU is a failure; without it the binary says
 * it skipped.
 */
#include <math.h>

#include "test_gpu.h"
#include "nvfp4.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static double unif(void)
{
	return (double)(rnd() >> 11) * 0x1p-53;
}

static float gauss(void)
{
	double u = unif() + 1e-12, v = unif();

	return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

enum mode {
	MODE_NORMAL,   /* weights: N(0, 0.02) */
	MODE_WIDE,     /* log-uniform magnitudes over 50 binades, mixed in blocks */
	MODE_TIES,     /* exact E2M1 thresholds of exact scales, and their neighbours */
	MODE_EXTREME,  /* block maxima at or next to amax = 448 * 6 * S */
	MODE_TINY,     /* subnormal quotients; f32 subnormal inputs */
	MODE_ZEROS,    /* zero and -0 blocks among normal ones */
	MODE_DEGEN,    /* amax so small that the tensor scale underflows */
	MODE_COUNT
};

static const char *mode_name[MODE_COUNT] = {
	"normal", "wide", "ties", "extreme", "tiny", "zeros", "degenerate",
};

static float next_up(float x, int steps)
{
	uint32_t u;

	memcpy(&u, &x, 4);
	u += (uint32_t)steps;
	memcpy(&x, &u, 4);
	return x;
}

/* One value for mode m at flat position i of a [rows, cols] matrix. */
static float gen(enum mode m, uint64_t i, uint64_t cols, enum ms_dtype dt)
{
	static const float thr[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,
				    0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
	float s = (rnd() & 1) ? -1.0f : 1.0f;
	uint64_t blk = (i % cols) / 16 + 977 * (i / cols / 16);

	switch (m) {
	case MODE_NORMAL:
		return 0.02f * gauss();
	case MODE_WIDE:
		return s * (float)exp2(-40.0 + 50.0 * unif());
	case MODE_TIES: {
		/* amax 2.625 = 2688 * 2^-10: ws2 = 2^-10 exactly; per block an
		 * exact e4m3 scale s, elements s * 2^-10 * (threshold +- ulp) */
		float sc = (float)ldexp(1.0 + (double)(blk % 8) / 8.0, (int)(blk % 9) - 4);
		float base = sc * 0x1p-10f * thr[rnd() % 14];
		int wiggle = (int)(rnd() % 5) - 2;

		if (i == 0)
			return 2.625f;
		if (dt != MS_DTYPE_F32)
			wiggle *= 1 << (dt == MS_DTYPE_BF16 ? 16 : 13);
		if (rnd() % 3 == 0)
			wiggle = 0;
		return s * next_up(base, wiggle);
	}
	case MODE_EXTREME: {
		float amax = 3.0f;

		if (rnd() % 4 == 0)
			return s * amax;
		return s * amax * (float)(0.9 + 0.1 * unif());
	}
	case MODE_TINY:
		if (dt == MS_DTYPE_F32)
			return s * (float)exp2(-149.0 + 40.0 * unif());
		if (dt == MS_DTYPE_BF16)
			return s * (float)exp2(-133.0 + 40.0 * unif());
		return s * (float)exp2(-24.0 + 20.0 * unif());
	case MODE_ZEROS:
		if (blk % 3 == 0)
			return (rnd() & 1) ? -0.0f : 0.0f;
		return 0.5f * gauss();
	case MODE_DEGEN:
		/* amax/2688 subnormal: small scale bytes' factors underflow to
		 * 0 and code(0) becomes 7, so the launch runs the exact path */
		if (dt == MS_DTYPE_F32)
			return s * (float)exp2(-137.0 + 8.0 * unif());
		if (dt == MS_DTYPE_BF16)
			return s * (float)exp2(-133.0 + 4.0 * unif());
		return s * (float)exp2(-24.0 + 3.0 * unif());
	default:
		return 0.0f;
	}
}

static int esize(enum ms_dtype dt)
{
	return dt == MS_DTYPE_F32 ? 4 : 2;
}

static void *make_src(enum mode m, enum ms_dtype dt, uint64_t rows, uint64_t cols)
{
	uint64_t n = rows * cols;
	uint8_t *p = ms_malloc(n ? n * esize(dt) : 1);

	for (uint64_t i = 0; p && i < n; i++) {
		float v = gen(m, i, cols, dt);

		if (dt == MS_DTYPE_F32) {
			memcpy(p + 4 * i, &v, 4);
		} else {
			uint16_t h = dt == MS_DTYPE_BF16 ? ms_f32_to_bf16(v) : ms_f32_to_f16(v);

			memcpy(p + 2 * i, &h, 2);
		}
	}
	return p;
}

/* device copy of n host bytes */
static void *to_dev(const void *h, uint64_t n)
{
	void *d = NULL;
	struct ms_err err = {0};

	if (ms_gpu_malloc(&d, n, &err) != MS_OK)
		return NULL;
	if (n && ms_gpu_memcpy(d, h, n, &err) != MS_OK) {
		ms_gpu_free(d);
		return NULL;
	}
	return d;
}

static void *dev_poisoned(uint64_t n)
{
	void *d = NULL;
	struct ms_err err = {0};

	if (ms_gpu_malloc(&d, n, &err) != MS_OK)
		return NULL;
	if (n && ms_gpu_memset(d, 0xa5, n, &err) != MS_OK) {
		ms_gpu_free(d);
		return NULL;
	}
	return d;
}

/* compare n bytes of device memory d with host memory want */
static int same_dev(const void *d, const uint8_t *want, uint64_t n, const char *what,
		    const char *ctx)
{
	uint8_t *got = ms_malloc(n ? n : 1);
	struct ms_err err = {0};
	int ok = 1;

	if (!got || ms_gpu_memcpy(got, d, n, &err) != MS_OK) {
		fprintf(stderr, "%s: %s: copy back failed: %s\n", ctx, what, err.msg);
		ms_free(got);
		return 0;
	}
	for (uint64_t i = 0; i < n; i++) {
		if (got[i] != want[i]) {
			fprintf(stderr, "%s: %s: byte %llu is %02x, reference %02x\n", ctx, what,
				(unsigned long long)i, got[i], want[i]);
			ok = 0;
			break;
		}
	}
	ms_free(got);
	return ok;
}

static int same_host(const uint8_t *got, const uint8_t *want, uint64_t n, const char *what,
		     const char *ctx)
{
	for (uint64_t i = 0; i < n; i++) {
		if (got[i] != want[i]) {
			fprintf(stderr, "%s: %s: byte %llu is %02x, reference %02x\n", ctx, what,
				(unsigned long long)i, got[i], want[i]);
			return 0;
		}
	}
	return 1;
}

struct qref {
	uint64_t pn, sn, ptn, stn;   /* sizes rowwise, columnwise */
	uint8_t *p, *s, *pt, *st;    /* reference bytes */
};

static void qref_free(struct qref *q)
{
	ms_free(q->p);
	ms_free(q->s);
	ms_free(q->pt);
	ms_free(q->st);
}

static int qref_make(const struct ms_nvfp4_params *pp, const struct ms_nvfp4_src *src,
		     float amax, struct qref *q, int *rc_row, struct ms_err *err)
{
	struct ms_nvfp4_params p = *pp;
	uint64_t ps[2], ss[2], pst[2], sst[2];

	memset(q, 0, sizeof(*q));
	T_ASSERT(ms_nvfp4_shapes(src->rows, src->cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, err) == MS_OK);
	T_ASSERT(ms_nvfp4_shapes(src->rows, src->cols, MS_NVFP4_LAYOUT_COLUMNWISE, pst, sst,
				 err) == MS_OK);
	q->pn = ps[0] * ps[1];
	q->sn = ss[0] * ss[1];
	q->ptn = pst[0] * pst[1];
	q->stn = sst[0] * sst[1];
	q->p = ms_malloc(q->pn + 1);
	q->s = ms_malloc(q->sn + 1);
	q->pt = ms_malloc(q->ptn + 1);
	q->st = ms_malloc(q->stn + 1);
	T_ASSERT(q->p && q->s && q->pt && q->st);
	p.layout = MS_NVFP4_LAYOUT_ROWWISE;
	*rc_row = ms_nvfp4_quantize_ref(&p, src, amax, q->p, q->s, err);
	if (*rc_row != MS_OK)
		return 0;
	p.layout = MS_NVFP4_LAYOUT_COLUMNWISE;
	T_ASSERT_MSG(ms_nvfp4_quantize_ref(&p, src, amax, q->pt, q->st, err) == MS_OK, "%s",
		     err->msg);
	return 0;
}

/*
 * Quantize src with the GPU: device buffers, both layouts in one call, then
 * each layout alone; with host buffers (the streaming path, chunk rows
 * chunk) both layouts. Every output equals the reference's.
 */
static int check_quantize(const struct ms_nvfp4_params *p, const struct ms_nvfp4_src *src,
			  float amax, uint64_t chunk, const char *ctx)
{
	struct qref q;
	struct ms_err err = {0}, rerr = {0};
	struct ms_nvfp4_src dsrc = *src;
	uint8_t *dp = NULL, *ds = NULL, *dpt = NULL, *dst = NULL;
	uint8_t *hp = NULL, *hs = NULL, *hpt = NULL, *hst = NULL;
	int rc_ref = MS_OK, rc;

	T_ASSERT(qref_make(p, src, amax, &q, &rc_ref, &rerr) == 0);
	dsrc.data = to_dev(src->data, src->rows * src->cols * esize(src->dtype));
	T_ASSERT(dsrc.data);
	dp = dev_poisoned(q.pn);
	ds = dev_poisoned(q.sn);
	dpt = dev_poisoned(q.ptn);
	dst = dev_poisoned(q.stn);
	T_ASSERT(dp && ds && dpt && dst);
	rc = ms_gpu_nvfp4_quantize(p, &dsrc, amax, dp, ds, dpt, dst, &err);
	T_ASSERT_MSG(rc == rc_ref, "%s: gpu rc %d (%s), reference rc %d (%s)", ctx, rc, err.msg,
		     rc_ref, rerr.msg);
	if (rc_ref != MS_OK) {
		if (strstr(rerr.msg, "non-finite"))
			T_ASSERT_MSG(!strcmp(err.msg, rerr.msg), "%s: '%s' vs reference '%s'", ctx,
				     err.msg, rerr.msg);
		goto done;
	}
	T_ASSERT(same_dev(dp, q.p, q.pn, "rowwise packed", ctx));
	T_ASSERT(same_dev(ds, q.s, q.sn, "rowwise scales", ctx));
	T_ASSERT(same_dev(dpt, q.pt, q.ptn, "columnwise packed", ctx));
	T_ASSERT(same_dev(dst, q.st, q.stn, "columnwise scales", ctx));
	/* one layout at a time */
	T_ASSERT(ms_gpu_memset(dp, 0x5a, q.pn, &err) == MS_OK);
	T_ASSERT(ms_gpu_memset(ds, 0x5a, q.sn, &err) == MS_OK);
	T_ASSERT_MSG(ms_gpu_nvfp4_quantize(p, &dsrc, amax, dp, ds, NULL, NULL, &err) == MS_OK,
		     "%s", err.msg);
	T_ASSERT(same_dev(dp, q.p, q.pn, "rowwise packed (alone)", ctx));
	T_ASSERT(same_dev(ds, q.s, q.sn, "rowwise scales (alone)", ctx));
	T_ASSERT(ms_gpu_memset(dpt, 0x5a, q.ptn, &err) == MS_OK);
	T_ASSERT(ms_gpu_memset(dst, 0x5a, q.stn, &err) == MS_OK);
	T_ASSERT_MSG(ms_gpu_nvfp4_quantize(p, &dsrc, amax, NULL, NULL, dpt, dst, &err) == MS_OK,
		     "%s", err.msg);
	T_ASSERT(same_dev(dpt, q.pt, q.ptn, "columnwise packed (alone)", ctx));
	T_ASSERT(same_dev(dst, q.st, q.stn, "columnwise scales (alone)", ctx));
	/* host buffers: streamed through the GPU in chunks of rows */
	hp = ms_malloc(q.pn + 1);
	hs = ms_malloc(q.sn + 1);
	hpt = ms_malloc(q.ptn + 1);
	hst = ms_malloc(q.stn + 1);
	T_ASSERT(hp && hs && hpt && hst);
	memset(hp, 0xa5, q.pn);
	memset(hs, 0xa5, q.sn);
	memset(hpt, 0xa5, q.ptn);
	memset(hst, 0xa5, q.stn);
	T_ASSERT_MSG(ms_gpu_nvfp4_quantize_host(p, src, amax, chunk, hp, hs, hpt, hst, &err) ==
		     MS_OK, "%s: %s", ctx, err.msg);
	T_ASSERT(same_host(hp, q.p, q.pn, "rowwise packed (host)", ctx));
	T_ASSERT(same_host(hs, q.s, q.sn, "rowwise scales (host)", ctx));
	T_ASSERT(same_host(hpt, q.pt, q.ptn, "columnwise packed (host)", ctx));
	T_ASSERT(same_host(hst, q.st, q.stn, "columnwise scales (host)", ctx));
done:
	ms_gpu_free((void *)dsrc.data);
	ms_gpu_free(dp);
	ms_gpu_free(ds);
	ms_gpu_free(dpt);
	ms_gpu_free(dst);
	ms_free(hp);
	ms_free(hs);
	ms_free(hpt);
	ms_free(hst);
	qref_free(&q);
	return 0;
}

static const uint64_t shapes[][2] = {
	{1, 1}, {1, 16}, {16, 16}, {3, 40}, {17, 33}, {33, 8}, {8, 33}, {64, 128},
	{65, 130}, {100, 257}, {128, 256}, {200, 512}, {31, 1000}, {513, 24},
};
#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

static const enum ms_dtype dtypes[] = {MS_DTYPE_BF16, MS_DTYPE_F16, MS_DTYPE_F32};

/* all recipes x blocks x dtypes x modes, a few shapes each */
static int test_quantize_matches_reference(void)
{
	int cases = 0;

	for (int r = 0; r < MS_NVFP4_RECIPE_COUNT; r++) {
		for (int b = 0; b < 2; b++) {
			for (int d = 0; d < 3; d++) {
				for (int m = 0; m < MODE_COUNT; m++) {
					for (int k = 0; k < 3; k++) {
						const uint64_t *sh = shapes[rnd() % NSHAPES];
						struct ms_nvfp4_params p = {0};
						struct ms_nvfp4_src src = {dtypes[d], NULL, sh[0], sh[1]};
						struct ms_err err = {0};
						char ctx[200];
						float amax = 0.0f;

						p.recipe = (enum ms_nvfp4_recipe)r;
						p.block = b ? MS_NVFP4_BLOCK_2D : MS_NVFP4_BLOCK_1D;
						src.data = make_src((enum mode)m, src.dtype, sh[0], sh[1]);
						T_ASSERT(src.data);
						T_ASSERT(ms_nvfp4_amax_ref(&src, 0, &amax, &err) == MS_OK);
						snprintf(ctx, sizeof(ctx), "%s %s %s %s [%llu, %llu]",
							 ms_nvfp4_recipe_name(p.recipe),
							 ms_nvfp4_block_name(p.block),
							 ms_dtype_name(src.dtype), mode_name[m],
							 (unsigned long long)sh[0],
							 (unsigned long long)sh[1]);
						if (check_quantize(&p, &src, amax, 16 * (1 + rnd() % 3),
								   ctx)) {
							ms_free((void *)src.data);
							return 1;
						}
						ms_free((void *)src.data);
						cases++;
					}
				}
			}
		}
	}
	T_ASSERT(cases == MS_NVFP4_RECIPE_COUNT * 2 * 3 * MODE_COUNT * 3);
	return 0;
}

/* full tiles, many of them (the persistent grid loops), each recipe */
static int test_quantize_large(void)
{
	for (int r = 0; r < MS_NVFP4_RECIPE_COUNT; r++) {
		for (int b = 0; b < 2; b++) {
			struct ms_nvfp4_params p = {0};
			struct ms_nvfp4_src src = {MS_DTYPE_BF16, NULL, 1040, 2064};
			struct ms_err err = {0};
			char ctx[100];
			float amax = 0.0f;

			p.recipe = (enum ms_nvfp4_recipe)r;
			p.block = b ? MS_NVFP4_BLOCK_2D : MS_NVFP4_BLOCK_1D;
			src.data = make_src(MODE_NORMAL, src.dtype, src.rows, src.cols);
			T_ASSERT(src.data);
			T_ASSERT(ms_nvfp4_amax_ref(&src, 0, &amax, &err) == MS_OK);
			snprintf(ctx, sizeof(ctx), "large %s %s", ms_nvfp4_recipe_name(p.recipe),
				 ms_nvfp4_block_name(p.block));
			if (check_quantize(&p, &src, amax, 0, ctx)) {
				ms_free((void *)src.data);
				return 1;
			}
			ms_free((void *)src.data);
		}
	}
	return 0;
}

/* a fused group's amax above the tensor's own, and one below it */
static int test_quantize_amax_given(void)
{
	struct ms_nvfp4_params p = {0};
	struct ms_nvfp4_src src = {MS_DTYPE_BF16, NULL, 48, 80};
	struct ms_err err = {0};
	float amax = 0.0f;

	src.data = make_src(MODE_NORMAL, src.dtype, src.rows, src.cols);
	T_ASSERT(src.data);
	T_ASSERT(ms_nvfp4_amax_ref(&src, 0, &amax, &err) == MS_OK);
	for (int r = 0; r < MS_NVFP4_RECIPE_COUNT; r++) {
		p.recipe = (enum ms_nvfp4_recipe)r;
		T_ASSERT(check_quantize(&p, &src, amax * 7.5f, 16, "group amax") == 0);
		T_ASSERT(check_quantize(&p, &src, amax * 0.5f, 16, "amax below") == 0);
	}
	/* not a finite non-negative amax */
	T_ASSERT(check_quantize(&p, &src, NAN, 16, "nan amax") == 0);
	T_ASSERT(check_quantize(&p, &src, -1.0f, 16, "negative amax") == 0);
	ms_free((void *)src.data);
	return 0;
}

static void put(struct ms_nvfp4_src *s, uint64_t i, float v)
{
	uint8_t *p = (uint8_t *)s->data;

	if (s->dtype == MS_DTYPE_F32) {
		memcpy(p + 4 * i, &v, 4);
	} else {
		uint16_t h = s->dtype == MS_DTYPE_BF16 ? ms_f32_to_bf16(v) : ms_f32_to_f16(v);

		memcpy(p + 2 * i, &h, 2);
	}
}

/* NaN and Inf: the first one by flat index is reported, as the reference
 * does; with MS_NVFP4_ALLOW_NONFINITE the bytes are the reference's */
static int test_quantize_nonfinite(void)
{
	for (int d = 0; d < 3; d++) {
		for (int r = 0; r < MS_NVFP4_RECIPE_COUNT; r++) {
			for (int b = 0; b < 2; b++) {
				struct ms_nvfp4_params p = {0};
				struct ms_nvfp4_src src = {dtypes[d], NULL, 70, 90};
				struct ms_err err = {0};
				float amax = 0.0f;
				char ctx[100];

				p.recipe = (enum ms_nvfp4_recipe)r;
				p.block = b ? MS_NVFP4_BLOCK_2D : MS_NVFP4_BLOCK_1D;
				src.data = make_src(MODE_NORMAL, src.dtype, src.rows, src.cols);
				T_ASSERT(src.data);
				put(&src, 70 * 90 - 1, -INFINITY);
				put(&src, 1234, NAN);
				put(&src, 4321, INFINITY);
				put(&src, 555, -INFINITY);
				T_ASSERT(ms_nvfp4_amax_ref(&src, 1, &amax, &err) == MS_OK);
				snprintf(ctx, sizeof(ctx), "nonfinite %s %s %s",
					 ms_dtype_name(src.dtype), ms_nvfp4_recipe_name(p.recipe),
					 ms_nvfp4_block_name(p.block));
				T_ASSERT(check_quantize(&p, &src, amax, 32, ctx) == 0);
				p.flags = MS_NVFP4_ALLOW_NONFINITE;
				T_ASSERT(check_quantize(&p, &src, amax, 32, ctx) == 0);
				ms_free((void *)src.data);
			}
		}
	}
	return 0;
}

static int test_amax_matches_reference(void)
{
	for (int d = 0; d < 3; d++) {
		for (int m = 0; m < MODE_COUNT; m++) {
			for (int allow = 0; allow < 2; allow++) {
				const uint64_t *sh = shapes[rnd() % NSHAPES];
				struct ms_nvfp4_src src = {dtypes[d], NULL, sh[0] + 3, sh[1]};
				struct ms_nvfp4_src dsrc;
				struct ms_err err = {0}, rerr = {0};
				float want = -1, got = -2, goth = -3;
				int rc_ref, rc, rch;

				src.data = make_src((enum mode)m, src.dtype, src.rows, src.cols);
				T_ASSERT(src.data);
				if (m == MODE_WIDE) {
					put(&src, src.rows * src.cols / 2, NAN);
					put(&src, src.rows * src.cols / 3, -INFINITY);
				}
				dsrc = src;
				dsrc.data = to_dev(src.data, src.rows * src.cols * esize(src.dtype));
				T_ASSERT(dsrc.data);
				rc_ref = ms_nvfp4_amax_ref(&src, allow, &want, &rerr);
				rc = ms_gpu_nvfp4_amax(&dsrc, allow, &got, &err);
				T_ASSERT_EQ_INT(rc, rc_ref);
				if (rc == MS_OK)
					T_ASSERT_MSG(got == want, "amax %s %s: %g vs %g",
						     ms_dtype_name(src.dtype), mode_name[m],
						     (double)got, (double)want);
				else
					T_ASSERT_STR(err.msg, rerr.msg);
				rch = ms_gpu_nvfp4_amax(&src, allow, &goth, &err);
				T_ASSERT_EQ_INT(rch, rc_ref);
				if (rch == MS_OK)
					T_ASSERT(goth == want);
				else
					T_ASSERT_STR(err.msg, rerr.msg);
				ms_gpu_free((void *)dsrc.data);
				ms_free((void *)src.data);
			}
		}
	}
	return 0;
}

/* Decode one quantized matrix with the GPU (device and host buffers) to
 * bf16 and f32, against the reference. */
static int check_dequantize(const uint8_t *packed, const uint8_t *scales, uint64_t rows,
			    uint64_t cols, float tscale, enum ms_nvfp4_tscale_kind kind,
			    const char *ctx)
{
	uint64_t ps[2], ss[2];
	struct ms_err err = {0};

	T_ASSERT(ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, &err) == MS_OK);
	for (int f32 = 0; f32 < 2; f32++) {
		enum ms_dtype odt = f32 ? MS_DTYPE_F32 : MS_DTYPE_BF16;
		uint64_t on = rows * cols * (f32 ? 4 : 2);
		uint8_t *want = ms_malloc(on + 1), *goth = ms_malloc(on + 1);
		void *dp = to_dev(packed, ps[0] * ps[1]), *ds = to_dev(scales, ss[0] * ss[1]);
		void *dout = dev_poisoned(on);

		T_ASSERT(want && goth && dp && ds && dout);
		T_ASSERT(ms_nvfp4_dequantize_ref(packed, scales, rows, cols, tscale, kind, odt,
						 want, &err) == MS_OK);
		T_ASSERT_MSG(ms_gpu_nvfp4_dequantize(dp, ds, rows, cols, tscale, kind, odt, dout,
						     &err) == MS_OK, "%s", err.msg);
		T_ASSERT(same_dev(dout, want, on, f32 ? "f32" : "bf16", ctx));
		memset(goth, 0xa5, on);
		T_ASSERT_MSG(ms_gpu_nvfp4_dequantize(packed, scales, rows, cols, tscale, kind, odt,
						     goth, &err) == MS_OK, "%s", err.msg);
		T_ASSERT(same_host(goth, want, on, f32 ? "f32 (host)" : "bf16 (host)", ctx));
		ms_free(want);
		ms_free(goth);
		ms_gpu_free(dp);
		ms_gpu_free(ds);
		ms_gpu_free(dout);
	}
	return 0;
}

static int test_dequantize_matches_reference(void)
{
	for (int r = 0; r < MS_NVFP4_RECIPE_COUNT; r++) {
		for (int i = 0; i < 6; i++) {
			const uint64_t *sh = shapes[rnd() % NSHAPES];
			struct ms_nvfp4_params p = {0};
			struct ms_nvfp4_src src = {MS_DTYPE_BF16, NULL, sh[0], sh[1]};
			struct ms_nvfp4_tscale t;
			struct ms_err err = {0};
			struct qref q;
			float amax = 0.0f;
			int rc_row = 0;
			char ctx[100];

			p.recipe = (enum ms_nvfp4_recipe)r;
			p.block = (i & 1) ? MS_NVFP4_BLOCK_2D : MS_NVFP4_BLOCK_1D;
			src.data = make_src((enum mode)(i % MODE_COUNT), src.dtype, sh[0], sh[1]);
			T_ASSERT(src.data);
			T_ASSERT(ms_nvfp4_amax_ref(&src, 0, &amax, &err) == MS_OK);
			T_ASSERT(ms_nvfp4_tscale_init_src(p.recipe, amax, src.dtype, &t, &err) == MS_OK);
			T_ASSERT(qref_make(&p, &src, amax, &q, &rc_row, &err) == 0 && rc_row == MS_OK);
			snprintf(ctx, sizeof(ctx), "dequantize %s [%llu, %llu]",
				 ms_nvfp4_recipe_name(p.recipe), (unsigned long long)sh[0],
				 (unsigned long long)sh[1]);
			T_ASSERT(check_dequantize(q.p, q.s, sh[0], sh[1], t.stored, t.kind, ctx) == 0);
			T_ASSERT(check_dequantize(q.pt, q.st, sh[1], sh[0], t.stored, t.kind, ctx) == 0);
			qref_free(&q);
			ms_free((void *)src.data);
		}
	}
	return 0;
}

/* random bytes: every scale byte (NaN ones too), tensor scales that make
 * the decode factor overflow, underflow or NaN */
static int test_dequantize_any_bytes(void)
{
	static const float ts[] = {1.0f, 0x1p-100f, 0x1p100f, 3e38f, 1e-45f, 0.0f, -2.5f, NAN,
				   INFINITY};

	for (size_t k = 0; k < sizeof(ts) / sizeof(ts[0]); k++) {
		for (int kind = 0; kind < 2; kind++) {
			uint64_t rows = 37, cols = 300, ps[2], ss[2];
			struct ms_err err = {0};
			uint8_t *pk, *sc;
			char ctx[100];

			T_ASSERT(ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, &err) ==
				 MS_OK);
			pk = ms_malloc(ps[0] * ps[1]);
			sc = ms_malloc(ss[0] * ss[1]);
			T_ASSERT(pk && sc);
			for (uint64_t i = 0; i < ps[0] * ps[1]; i++)
				pk[i] = (uint8_t)rnd();
			for (uint64_t i = 0; i < ss[0] * ss[1]; i++)
				sc[i] = (uint8_t)(i < 256 ? i : rnd());
			/* the reference keeps the padding nibbles it is given */
			snprintf(ctx, sizeof(ctx), "dequantize bytes tscale %g kind %d", (double)ts[k],
				 kind);
			T_ASSERT(check_dequantize(pk, sc, rows, cols, ts[k],
						  (enum ms_nvfp4_tscale_kind)kind, ctx) == 0);
			ms_free(pk);
			ms_free(sc);
		}
	}
	return 0;
}

static int test_transpose_matches_reference(void)
{
	for (int i = 0; i < 12; i++) {
		const uint64_t *sh = shapes[i % NSHAPES];
		struct ms_nvfp4_params p = {0};
		struct ms_nvfp4_src src = {MS_DTYPE_BF16, NULL, sh[0], sh[1]};
		struct ms_err err = {0};
		struct qref q;
		uint8_t *wp, *ws, *hp, *hs;
		void *dp, *ds, *dpt, *dst;
		float amax = 0.0f;
		int rc_row = 0;
		char ctx[100];

		p.recipe = (enum ms_nvfp4_recipe)(i % 3);
		p.block = MS_NVFP4_BLOCK_2D;
		src.data = make_src((enum mode)(i % MODE_COUNT), src.dtype, sh[0], sh[1]);
		T_ASSERT(src.data);
		T_ASSERT(ms_nvfp4_amax_ref(&src, 0, &amax, &err) == MS_OK);
		T_ASSERT(qref_make(&p, &src, amax, &q, &rc_row, &err) == 0 && rc_row == MS_OK);
		wp = ms_malloc(q.ptn + 1);
		ws = ms_malloc(q.stn + 1);
		hp = ms_malloc(q.ptn + 1);
		hs = ms_malloc(q.stn + 1);
		T_ASSERT(wp && ws && hp && hs);
		T_ASSERT(ms_nvfp4_transpose(p.block, sh[0], sh[1], q.p, q.s, wp, ws, &err) == MS_OK);
		/* the reference's theorem: transposed rowwise == columnwise */
		T_ASSERT(!memcmp(wp, q.pt, q.ptn) && !memcmp(ws, q.st, q.stn));
		dp = to_dev(q.p, q.pn);
		ds = to_dev(q.s, q.sn);
		dpt = dev_poisoned(q.ptn);
		dst = dev_poisoned(q.stn);
		T_ASSERT(dp && ds && dpt && dst);
		snprintf(ctx, sizeof(ctx), "transpose [%llu, %llu]", (unsigned long long)sh[0],
			 (unsigned long long)sh[1]);
		T_ASSERT_MSG(ms_gpu_nvfp4_transpose(p.block, sh[0], sh[1], dp, ds, dpt, dst, &err) ==
			     MS_OK, "%s", err.msg);
		T_ASSERT(same_dev(dpt, wp, q.ptn, "packed", ctx));
		T_ASSERT(same_dev(dst, ws, q.stn, "scales", ctx));
		/* and back */
		T_ASSERT(ms_gpu_memset(dp, 0xa5, q.pn, &err) == MS_OK);
		T_ASSERT(ms_gpu_memset(ds, 0xa5, q.sn, &err) == MS_OK);
		T_ASSERT(ms_gpu_nvfp4_transpose(p.block, sh[1], sh[0], dpt, dst, dp, ds, &err) ==
			 MS_OK);
		T_ASSERT(same_dev(dp, q.p, q.pn, "packed (back)", ctx));
		T_ASSERT(same_dev(ds, q.s, q.sn, "scales (back)", ctx));
		/* host buffers */
		memset(hp, 0xa5, q.ptn);
		memset(hs, 0xa5, q.stn);
		T_ASSERT(ms_gpu_nvfp4_transpose(p.block, sh[0], sh[1], q.p, q.s, hp, hs, &err) ==
			 MS_OK);
		T_ASSERT(same_host(hp, wp, q.ptn, "packed (host)", ctx));
		T_ASSERT(same_host(hs, ws, q.stn, "scales (host)", ctx));
		ms_gpu_free(dp);
		ms_gpu_free(ds);
		ms_gpu_free(dpt);
		ms_gpu_free(dst);
		ms_free(wp);
		ms_free(ws);
		ms_free(hp);
		ms_free(hs);
		qref_free(&q);
		ms_free((void *)src.data);
	}
	return 0;
}

/* bad input: the reference's error and message; outputs untouched */
static int test_transpose_rejects(void)
{
	struct ms_nvfp4_params p = {0};
	struct ms_nvfp4_src src = {MS_DTYPE_BF16, NULL, 40, 50};
	struct ms_err err = {0}, rerr = {0};
	struct qref q;
	uint8_t *wp, *ws;
	void *dp, *ds, *dpt, *dst;
	float amax = 0.0f;
	int rc_row = 0;

	p.block = MS_NVFP4_BLOCK_2D;
	src.data = make_src(MODE_NORMAL, src.dtype, src.rows, src.cols);
	T_ASSERT(src.data);
	T_ASSERT(ms_nvfp4_amax_ref(&src, 0, &amax, &err) == MS_OK);
	T_ASSERT(qref_make(&p, &src, amax, &q, &rc_row, &err) == 0 && rc_row == MS_OK);
	wp = ms_malloc(q.ptn);
	ws = ms_malloc(q.stn);
	dpt = dev_poisoned(q.ptn);
	dst = dev_poisoned(q.stn);
	T_ASSERT(wp && ws && dpt && dst);
	for (int k = 0; k < 3; k++) {
		uint8_t *bp = ms_malloc(q.pn), *bs = ms_malloc(q.sn);

		T_ASSERT(bp && bs);
		memcpy(bp, q.p, q.pn);
		memcpy(bs, q.s, q.sn);
		if (k == 0)
			bs[21 * (q.sn / 40) + 2] ^= 1;  /* row 21 vs row 16 */
		else if (k == 1)
			bp[7 * (q.pn / 40) + 27] |= 0x20; /* column 55 >= 50: padding */
		else {
			bs[38 * (q.sn / 40) + 1] ^= 4;   /* both: the earlier row wins */
			bp[35 * (q.pn / 40) + 25] |= 0x10;
		}
		dp = to_dev(bp, q.pn);
		ds = to_dev(bs, q.sn);
		T_ASSERT(dp && ds);
		T_ASSERT_EQ_INT(ms_nvfp4_transpose(p.block, 40, 50, bp, bs, wp, ws, &rerr), MS_EINVAL);
		T_ASSERT_EQ_INT(ms_gpu_nvfp4_transpose(p.block, 40, 50, dp, ds, dpt, dst, &err),
				MS_EINVAL);
		T_ASSERT_STR(err.msg, rerr.msg);
		memset(wp, 0xa5, q.ptn);
		T_ASSERT(same_dev(dpt, wp, q.ptn, "untouched", "transpose reject"));
		ms_gpu_free(dp);
		ms_gpu_free(ds);
		ms_free(bp);
		ms_free(bs);
	}
	T_ASSERT_EQ_INT(ms_gpu_nvfp4_transpose(MS_NVFP4_BLOCK_1D, 40, 50, q.p, q.s, wp, ws, &err),
			MS_EINVAL);
	ms_gpu_free(dpt);
	ms_gpu_free(dst);
	ms_free(wp);
	ms_free(ws);
	qref_free(&q);
	ms_free((void *)src.data);
	return 0;
}

static int test_bad_calls(void)
{
	struct ms_nvfp4_params p = {0};
	struct ms_nvfp4_src src = {MS_DTYPE_BF16, NULL, 16, 16};
	struct ms_err err = {0};
	uint8_t hp[128], hs[16];
	void *dsrc, *hsrc;

	hsrc = make_src(MODE_NORMAL, src.dtype, 16, 16);
	T_ASSERT(hsrc);
	src.data = hsrc;
	dsrc = to_dev(hsrc, 512);
	T_ASSERT(dsrc);
	/* no output */
	T_ASSERT_EQ_INT(ms_gpu_nvfp4_quantize(&p, &src, 1.0f, NULL, NULL, NULL, NULL, &err),
			MS_EINVAL);
	/* half a pair */
	T_ASSERT_EQ_INT(ms_gpu_nvfp4_quantize(&p, &src, 1.0f, hp, NULL, NULL, NULL, &err),
			MS_EINVAL);
	/* device source, host outputs */
	src.data = dsrc;
	T_ASSERT_EQ_INT(ms_gpu_nvfp4_quantize(&p, &src, 1.0f, hp, hs, NULL, NULL, &err),
			MS_EINVAL);
	T_ASSERT(strstr(err.msg, "host memory or all on the gpu"));
	/* unsupported dtype */
	src.dtype = MS_DTYPE_I32;
	T_ASSERT_EQ_INT(ms_gpu_nvfp4_quantize(&p, &src, 1.0f, hp, hs, NULL, NULL, &err),
			MS_EINVAL);
	/* dequantize to an unsupported dtype */
	T_ASSERT_EQ_INT(ms_gpu_nvfp4_dequantize(hp, hs, 16, 16, 1.0f, MS_NVFP4_TSCALE_MUL,
						MS_DTYPE_F16, hp, &err), MS_EINVAL);
	ms_gpu_free(dsrc);
	ms_free(hsrc);
	return 0;
}

static int test_describe(void)
{
	char buf[256];
	struct ms_err err = {0};

	T_ASSERT(ms_gpu_describe(buf, sizeof(buf), &err) == MS_OK);
	T_ASSERT(strstr(buf, "sm_"));
	printf("device: %s\n", buf);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_describe),
	T_CASE(test_quantize_matches_reference),
	T_CASE(test_quantize_large),
	T_CASE(test_quantize_amax_given),
	T_CASE(test_quantize_nonfinite),
	T_CASE(test_amax_matches_reference),
	T_CASE(test_dequantize_matches_reference),
	T_CASE(test_dequantize_any_bytes),
	T_CASE(test_transpose_matches_reference),
	T_CASE(test_transpose_rejects),
	T_CASE(test_bad_calls),
};

T_GPU_MAIN(cases)

