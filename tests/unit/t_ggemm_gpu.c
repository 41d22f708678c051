/*
 * t_ggemm_gpu.c: the grouped expert GEMM (kernels/ggemm.h) against a host
 * reference in double from the same bf16 inputs.
 *
 * Cases: groups with 0, 1, 127, 128, 129 and a few hundred rows (empty
 * groups, tails of the 128-row tile, exact tiles, several tiles), N and K
 * from 8 (the smallest covered) through tails of the 128-column and 32-K
 * tiles to a few tiles, row strides wider than the matrices, one group and
 * 64 groups; every case written (C = A B^T) and accumulated (C += A B^T).
 * The offsets and tile offsets come from ms_ggemm_index on the device and
 * are checked against the host's running sums. Both tile shapes
 * (MS_GGEMM_NARROW, MS_GGEMM_WIDE) run every case. C is poisoned with NaN
 * before each launch, so a row or column the kernel does not write fails;
 * the columns between N and ldc and the rows past the last group hold a
 * sentinel that must survive. Each case runs twice and must be
 * bit-identical. Refused shapes and pointers give MS_EINVAL.
 *
 * Tolerance, per element: |gpu - ref| <= K 2^-23 mag + 1e-30, mag the sum
 * of |a b| over k: the inputs are bf16, so every product is exact in
 * float and the only error is float32 accumulation (at most about K u
 * mag, u = 2^-24; twice that for the accumulated case's one more add).
 * A wrong row, column or group is off by the size of the value.
 *
 * GPU tier: without a GPU the binary says it skipped (with MS_TEST_GPU
 * set, a missing GPU is a failure).
 *
 * t_ggemm_gpu --bench: the trainer's four expert products at the bench
 * model's shape (64 experts, 8192 tokens x top-8 rows routed unevenly,
 * hidden 2048, expert ffn 768), grouped against one cuBLAS GEMM per expert
 * (cublasGemmEx, bf16 in, float32 out, the counts on the host, as the
 * trainer's loop), each tile shape: the median of 20 runs of each after 3
 * warm-up runs, CUDA events around each run, and their TFLOP/s and ratio.
 */
#include <dlfcn.h>
#include <math.h>

#include "test_gpu.h"
#ifdef MS_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "ggemm.h"
#include "test_bf16.h"

#define SENTINEL 12345.0f

struct gcase {
	uint32_t E, N, K;
	const uint32_t *cnt;        /* E counts, or NULL: random (0 .. 300) */
	uint32_t lda_pad, ldc_pad;  /* strides past K and N */
};

/* one case's data on the host and the device */
struct grun {
	const struct gcase *c;
	int cfg;
	uint32_t *cnt, off[MS_GGEMM_MAX_E + 1], tiles[MS_GGEMM_MAX_E + 1];
	uint64_t rows, lda, ldc, slack;
	uint16_t *a, *b;
	double *av, *bv, *ref, *mag;
	float *c0, *c1, *c2;
	void *ga, *gb, *gc, *gcnt, *goff, *gtiles, *gbp;
};

static void grun_free(struct grun *u)
{
	free(u->cnt);
	free(u->a);
	free(u->b);
	free(u->av);
	free(u->bv);
	free(u->ref);
	free(u->mag);
	free(u->c0);
	free(u->c1);
	free(u->c2);
	ms_gpu_free(u->ga);
	ms_gpu_free(u->gb);
	ms_gpu_free(u->gc);
	ms_gpu_free(u->gcnt);
	ms_gpu_free(u->goff);
	ms_gpu_free(u->gtiles);
	ms_gpu_free(u->gbp);
}

/* C's host image before a launch: NaN where the kernel writes, the
 * sentinel in the padding columns and the slack rows */
static void poison(const struct grun *u, float *h)
{
	for (uint64_t r = 0; r < u->rows + u->slack; r++)
		for (uint64_t j = 0; j < u->ldc; j++)
			h[r * u->ldc + j] = r < u->rows && j < u->c->N ? NAN : SENTINEL;
}

/* the reference: ref = A B_e^T per row of group e, mag = sum |a b| */
static void reference(struct grun *u)
{
	const struct gcase *c = u->c;
	for (uint32_t e = 0; e < c->E; e++)
		for (uint64_t r = u->off[e]; r < u->off[e + 1]; r++)
			for (uint32_t n = 0; n < c->N; n++) {
				const double *x = u->av + r * u->lda;
				const double *w = u->bv + ((uint64_t)e * c->N + n) * c->K;
				double s = 0, m = 0;
				for (uint32_t k = 0; k < c->K; k++) {
					s += x[k] * w[k];
					m += fabs(x[k] * w[k]);
				}
				u->ref[r * c->N + n] = s;
				u->mag[r * c->N + n] = m;
			}
}

/* got against ref (+ base when accumulating): 0 when every element is
 * within tolerance and the padding and slack kept the sentinel */
static int check(const char *what, const struct grun *u, const float *got, const float *base,
		 double tol_k)
{
	const struct gcase *c = u->c;
	double worst = 0;
	for (uint64_t r = 0; r < u->rows + u->slack; r++)
		for (uint64_t j = 0; j < u->ldc; j++) {
			float g = got[r * u->ldc + j];
			if (r >= u->rows || j >= c->N) {
				if (g != SENTINEL) {
					fprintf(stderr, "%s: E %u N %u K %u: row %llu column %llu "
						"outside the groups was written (%g)\n", what, c->E,
						c->N, c->K, (unsigned long long)r,
						(unsigned long long)j, (double)g);
					return 1;
				}
				continue;
			}
			double want = u->ref[r * c->N + j] + (base ? base[r * u->ldc + j] : 0);
			double mag = u->mag[r * c->N + j] + (base ? fabs(base[r * u->ldc + j]) : 0);
			double err = fabs((double)g - want), lim = tol_k * c->K * 0x1p-23 * mag + 1e-30;
			if (!(err <= lim)) {
				fprintf(stderr, "%s: E %u N %u K %u: row %llu column %llu: gpu %.9g "
					"ref %.9g mag %.3g\n", what, c->E, c->N, c->K,
					(unsigned long long)r, (unsigned long long)j, (double)g, want,
					mag);
				return 1;
			}
			if (mag > 0 && err / mag > worst)
				worst = err / mag;
		}
	printf("ggemm %s %s E %u N %u K %u rows %llu: max err/mag %.3g\n",
	       u->cfg == MS_GGEMM_WIDE ? "wide" : "narrow", what, c->E, c->N, c->K,
	       (unsigned long long)u->rows, worst);
	return 0;
}

static int launch(const struct grun *u, int acc, float *host, struct ms_err *err)
{
	const struct gcase *c = u->c;
	struct ms_ggemm p = {
		/* a bound past the groups' rows: the blocks past them must exit */
		.E = c->E, .N = c->N, .K = c->K, .rows = u->rows + u->slack, .off = u->goff,
		.tiles = u->gtiles, .a = u->ga, .lda = u->lda, .b = (const void *const *)u->gbp,
		.ldb = c->K, .c = u->gc, .ldc = u->ldc, .accumulate = acc, .cfg = u->cfg,
	};
	uint64_t nc = (u->rows + u->slack) * u->ldc * 4;
	int rc;
	if ((rc = ms_gpu_memcpy(u->gc, host, nc, err)) ||
	    (rc = ms_ggemm_run(&p, NULL, err)) || (rc = ms_gpu_sync(err)))
		return rc;
	return cudaMemcpy(host, u->gc, nc, cudaMemcpyDeviceToHost) == cudaSuccess ? MS_OK : MS_EIO;
}

static int run_case(const struct gcase *c, int cfg)
{
	struct grun u = {.c = c, .cfg = cfg};
	struct ms_err err = {0};
	uint32_t goff[MS_GGEMM_MAX_E + 1], gtl[MS_GGEMM_MAX_E + 1];
	void *bp[MS_GGEMM_MAX_E];
	uint64_t nb = (uint64_t)c->E * c->N * c->K, nc;
	int rc = 1;

	u.cnt = calloc(c->E, sizeof *u.cnt);
	T_ASSERT(u.cnt);
	u.off[0] = u.tiles[0] = 0;
	for (uint32_t e = 0; e < c->E; e++) {
		u.cnt[e] = c->cnt ? c->cnt[e] : (uint32_t)(rnd() % 301);
		u.off[e + 1] = u.off[e] + u.cnt[e];
		u.tiles[e + 1] = u.tiles[e] + (u.cnt[e] + 127) / 128;
	}
	u.rows = u.off[c->E];
	u.lda = c->K + c->lda_pad;
	u.ldc = c->N + c->ldc_pad;
	u.slack = 3;
	nc = (u.rows + u.slack) * u.ldc;
	u.a = malloc((u.rows + 1) * u.lda * 2);
	u.av = malloc((u.rows + 1) * u.lda * sizeof(double));
	u.b = malloc(nb * 2 + 2);
	u.bv = malloc(nb * sizeof(double) + 8);
	u.ref = malloc((u.rows + 1) * c->N * sizeof(double));
	u.mag = malloc((u.rows + 1) * c->N * sizeof(double));
	u.c0 = malloc(nc * 4);
	u.c1 = malloc(nc * 4);
	u.c2 = malloc(nc * 4);
	if (!u.a || !u.av || !u.b || !u.bv || !u.ref || !u.mag || !u.c0 || !u.c1 || !u.c2)
		goto out;
	fill(u.a, u.av, u.rows * u.lda, 1.0);
	fill(u.b, u.bv, nb, 1.0);
	reference(&u);
	if (ms_gpu_malloc(&u.ga, (u.rows + 1) * u.lda * 2, &err) ||
	    ms_gpu_malloc(&u.gb, nb * 2 + 16, &err) || ms_gpu_malloc(&u.gc, nc * 4, &err) ||
	    ms_gpu_malloc(&u.gcnt, c->E * 4, &err) || ms_gpu_malloc(&u.goff, (c->E + 1) * 4, &err) ||
	    ms_gpu_malloc(&u.gtiles, (c->E + 1) * 4, &err) ||
	    ms_gpu_malloc(&u.gbp, c->E * sizeof(void *), &err))
		goto fail;
	for (uint32_t e = 0; e < c->E; e++)
		bp[e] = (char *)u.gb + (uint64_t)e * c->N * c->K * 2;
	if ((u.rows && ms_gpu_memcpy(u.ga, u.a, u.rows * u.lda * 2, &err)) ||
	    ms_gpu_memcpy(u.gb, u.b, nb * 2, &err) ||
	    ms_gpu_memcpy(u.gcnt, u.cnt, c->E * 4, &err) ||
	    ms_gpu_memcpy(u.gbp, bp, c->E * sizeof(void *), &err) ||
	    ms_ggemm_index(u.gcnt, c->E, u.goff, u.gtiles, NULL, &err) || ms_gpu_sync(&err))
		goto fail;
	if (cudaMemcpy(goff, u.goff, (c->E + 1) * 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
	    cudaMemcpy(gtl, u.gtiles, (c->E + 1) * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
		goto out;
	if (memcmp(goff, u.off, (c->E + 1) * 4) || memcmp(gtl, u.tiles, (c->E + 1) * 4)) {
		fprintf(stderr, "E %u: the device's offsets or tile offsets differ from the "
			"host's\n", c->E);
		goto out;
	}
	/* written, twice (bit-identical), then accumulated onto the first */
	poison(&u, u.c0);
	poison(&u, u.c1);
	if (launch(&u, 0, u.c0, &err) || launch(&u, 0, u.c1, &err))
		goto fail;
	if (check("write", &u, u.c0, NULL, 1.0))
		goto out;
	if (memcmp(u.c0, u.c1, nc * 4)) {
		fprintf(stderr, "E %u N %u K %u: two runs differ\n", c->E, c->N, c->K);
		goto out;
	}
	memcpy(u.c2, u.c0, nc * 4);
	if (launch(&u, 1, u.c2, &err))
		goto fail;
	if (check("accumulate", &u, u.c2, u.c0, 2.0))
		goto out;
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "E %u N %u K %u: %s\n", c->E, c->N, c->K,
		err.msg[0] ? err.msg : "a CUDA copy failed");
out:
	grun_free(&u);
	return rc;
}

static int test_ggemm_shapes(void)
{
	static const uint32_t edge[] = {0, 1, 127, 128, 129, 0, 300, 5};
	static const uint32_t one[] = {200};
	static const uint32_t none[] = {0, 0, 0};
	static const struct gcase cs[] = {
		{8, 8, 8, edge, 0, 0},
		{8, 24, 40, edge, 8, 2},
		{8, 136, 264, edge, 0, 8},
		{1, 256, 64, one, 16, 0},
		{3, 48, 16, none, 0, 0},
		{64, 48, 24, NULL, 0, 0},
		{5, 128, 32, NULL, 8, 0},
	};
	for (int cfg = MS_GGEMM_NARROW; cfg <= MS_GGEMM_WIDE; cfg++)
		for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
			T_ASSERT(run_case(&cs[i], cfg) == 0);
	return 0;
}

static int test_ggemm_refuses(void)
{
	struct ms_err err = {0};
	void *p = NULL;
	uint32_t *d;
	T_ASSERT(ms_gpu_malloc(&p, 4096, &err) == MS_OK);
	d = p;
	{
		struct ms_ggemm ok = {
			.E = 2, .N = 8, .K = 8, .rows = 4, .off = d, .tiles = d, .a = p, .lda = 8,
			.b = (const void *const *)p, .ldb = 8, .c = p, .ldc = 8,
		}, bad;
		T_ASSERT(!ms_ggemm_supported(12, 8) && !ms_ggemm_supported(8, 4));
		bad = ok, bad.N = 12;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		bad = ok, bad.K = 20;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		bad = ok, bad.E = 0;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		bad = ok, bad.E = MS_GGEMM_MAX_E + 1;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		bad = ok, bad.a = (char *)p + 2;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		T_ASSERT(strstr(err.msg, "misaligned"));
		bad = ok, bad.lda = 12;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		bad = ok, bad.ldc = 9;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		bad = ok, bad.ldb = 0;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		bad = ok, bad.cfg = MS_GGEMM_WIDE + 1;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		bad = ok, bad.rows = 1ull << 24;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		T_ASSERT(strstr(err.msg, "too many"));
		T_ASSERT_EQ_INT(ms_ggemm_index(d, 0, d, d, NULL, &err), MS_EINVAL);
		T_ASSERT_EQ_INT(ms_ggemm_index(d, MS_GGEMM_MAX_E + 1, d, d, NULL, &err),
				MS_EINVAL);
	}
	ms_gpu_free(p);
	return 0;
}

/* ---- --bench ------------------------------------------------------------------------- */

#define BENCH_WARM 3
#define BENCH_RUNS 20

/* cuBLAS, opened as the trainer opens it (the library is not linked) */
static struct {
	void *so;
	cublasStatus_t (*create)(cublasHandle_t *);
	cublasStatus_t (*destroy)(cublasHandle_t);
	cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
			       int, const void *, const void *, cudaDataType_t, int, const void *,
			       cudaDataType_t, int, const void *, void *, cudaDataType_t, int,
			       cublasComputeType_t, cublasGemmAlgo_t);
} cb;

static int cb_open(void)
{
	char name[64];
	snprintf(name, sizeof name, "libcublas.so.%d", CUBLAS_VER_MAJOR);
	if (!(cb.so = dlopen(name, RTLD_NOW | RTLD_LOCAL)))
		return -1;
	*(void **)&cb.create = dlsym(cb.so, "cublasCreate_v2");
	*(void **)&cb.destroy = dlsym(cb.so, "cublasDestroy_v2");
	*(void **)&cb.gemm = dlsym(cb.so, "cublasGemmEx");
	return cb.create && cb.destroy && cb.gemm ? 0 : -1;
}

/* the per-expert loop: C_e [cnt_e, N] = A_e B_e^T, one cublasGemmEx each
 * (column-major: C^T = B_e A_e^T) */
static int loop_run(cublasHandle_t h, const uint32_t *cnt, uint32_t E, uint32_t N, uint32_t K,
		    const void *A, void *const *B, float *C)
{
	const float one = 1.0f, zero = 0.0f;
	uint64_t off = 0;
	for (uint32_t e = 0; e < E; e++) {
		if (cnt[e] && cb.gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)cnt[e], (int)K, &one,
				      B[e], CUDA_R_16BF, (int)K, (const char *)A + off * K * 2,
				      CUDA_R_16BF, (int)K, &zero, C + off * N, CUDA_R_32F, (int)N,
				      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
			return -1;
		off += cnt[e];
	}
	return 0;
}

/* the median ms of BENCH_RUNS runs of one side (0: grouped, p's shape;
 * 1: the loop) */
static float bench_side(int side, const struct ms_ggemm *p, cublasHandle_t h,
			const uint32_t *cnt, void *const *B, cudaEvent_t *ev)
{
	struct ms_err err = {0};
	float ms[BENCH_RUNS];
	for (int i = 0; i < BENCH_WARM + BENCH_RUNS; i++) {
		int j = i - BENCH_WARM, bad;
		if (j >= 0 && cudaEventRecord(ev[2 * j], NULL) != cudaSuccess)
			return -1;
		bad = side ? loop_run(h, cnt, p->E, p->N, p->K, p->a, B, p->c)
			   : ms_ggemm_run(p, NULL, &err);
		if (bad) {
			fprintf(stderr, "bench: %s\n", side ? "cublasGemmEx failed" : err.msg);
			return -1;
		}
		if (j >= 0 && cudaEventRecord(ev[2 * j + 1], NULL) != cudaSuccess)
			return -1;
	}
	if (cudaDeviceSynchronize() != cudaSuccess)
		return -1;
	for (int j = 0; j < BENCH_RUNS; j++)
		if (cudaEventElapsedTime(&ms[j], ev[2 * j], ev[2 * j + 1]) != cudaSuccess)
			return -1;
	return t_median(ms, BENCH_RUNS);
}

static int bench(void)
{
	/* gate/up and down forward, then their input gradients (W^T) */
	static const struct { uint32_t N, K; const char *what; } pr[] = {
		{1536, 2048, "gate/up forward"},
		{2048, 768, "down forward"},
		{768, 2048, "down input gradient"},
		{2048, 1536, "gate/up input gradient"},
	};
	const uint32_t E = 64, T = 8192, TOPK = 8;
	uint32_t cnt[64] = {0};
	uint64_t rows = (uint64_t)T * TOPK, maxn = 2048, maxk = 2048;
	void *ga = NULL, *gb = NULL, *gc = NULL, *gcnt = NULL, *goff = NULL, *gt = NULL, *gbp = NULL;
	void *bp[64];
	uint16_t *h = NULL;
	cudaEvent_t ev[2 * BENCH_RUNS];
	cublasHandle_t hb = NULL;
	struct ms_err err = {0};
	int rc = 1, nev = 0;

	if (cb_open() || cb.create(&hb) != CUBLAS_STATUS_SUCCESS) {
		const char *why = dlerror();
		fprintf(stderr, "bench: cuBLAS: %s\n", why ? why : "cublasCreate failed");
		return 1;
	}
	/* top-8 of 64 per token, skewed: expert e drawn with weight 1 + e / 16 */
	for (uint32_t t = 0; t < T; t++) {
		uint64_t taken = 0;
		for (uint32_t k = 0; k < TOPK; k++) {
			uint32_t e;
			do {
				uint64_t x = rnd() % (64 * 16 + 64 * 63 / 2);
				for (e = 0; e < 63 && x >= 16 + e; e++)
					x -= 16 + e;
			} while (taken >> e & 1);
			taken |= 1ull << e;
			cnt[e]++;
		}
	}
	for (; nev < 2 * BENCH_RUNS; nev++)
		if (cudaEventCreate(&ev[nev]) != cudaSuccess)
			goto out;
	if (!(h = malloc(maxk * maxn * E * 2)) || ms_gpu_malloc(&ga, rows * maxk * 2, &err) ||
	    ms_gpu_malloc(&gb, maxk * maxn * E * 2, &err) ||
	    ms_gpu_malloc(&gc, rows * maxn * 4, &err) || ms_gpu_malloc(&gcnt, E * 4, &err) ||
	    ms_gpu_malloc(&goff, (E + 1) * 4, &err) || ms_gpu_malloc(&gt, (E + 1) * 4, &err) ||
	    ms_gpu_malloc(&gbp, E * sizeof(void *), &err))
		goto fail;
	for (uint64_t i = 0; i < maxk * maxn * E; i++)
		h[i] = to_bf16((float)(0.05 * gauss()));
	if (ms_gpu_memcpy(gb, h, maxk * maxn * E * 2, &err) ||
	    ms_gpu_memcpy(ga, h, rows * maxk * 2 < maxk * maxn * E * 2 ? rows * maxk * 2
									: maxk * maxn * E * 2,
			  &err) ||
	    ms_gpu_memcpy(gcnt, cnt, E * 4, &err) ||
	    ms_ggemm_index(gcnt, E, goff, gt, NULL, &err))
		goto fail;
	for (size_t i = 0; i < sizeof pr / sizeof *pr; i++) {
		struct ms_ggemm p = {
			.E = E, .N = pr[i].N, .K = pr[i].K, .rows = rows, .off = goff, .tiles = gt,
			.a = ga, .lda = pr[i].K, .b = (const void *const *)gbp, .ldb = pr[i].K,
			.c = gc, .ldc = pr[i].N, .accumulate = 0,
		};
		double flop = 2.0 * rows * pr[i].N * pr[i].K;
		float t[3];
		for (uint32_t e = 0; e < E; e++)
			bp[e] = (char *)gb + (uint64_t)e * pr[i].N * pr[i].K * 2;
		if (ms_gpu_memcpy(gbp, bp, E * sizeof(void *), &err))
			goto fail;
		if ((t[0] = bench_side(1, &p, hb, cnt, bp, ev)) < 0)
			goto out;
		printf("bench %s (64 experts, %llu rows, N %u, K %u): cuBLAS per expert %.3f ms "
		       "%.1f TFLOP/s\n", pr[i].what, (unsigned long long)rows, pr[i].N, pr[i].K,
		       t[0], flop / (t[0] * 1e-3) / 1e12);
		for (p.cfg = MS_GGEMM_NARROW; p.cfg <= MS_GGEMM_WIDE; p.cfg++) {
			if ((t[1 + p.cfg] = bench_side(0, &p, hb, cnt, bp, ev)) < 0)
				goto out;
			printf("bench %s: grouped %s %.3f ms %.1f TFLOP/s, %.2fx the loop\n",
			       pr[i].what, p.cfg == MS_GGEMM_WIDE ? "wide" : "narrow", t[1 + p.cfg],
			       flop / (t[1 + p.cfg] * 1e-3) / 1e12, t[0] / t[1 + p.cfg]);
		}
	}
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "bench: %s\n", err.msg[0] ? err.msg : "a CUDA call failed");
out:
	for (int i = 0; i < nev; i++)
		cudaEventDestroy(ev[i]);
	cb.destroy(hb);
	free(h);
	ms_gpu_free(ga);
	ms_gpu_free(gb);
	ms_gpu_free(gc);
	ms_gpu_free(gcnt);
	ms_gpu_free(goff);
	ms_gpu_free(gt);
	ms_gpu_free(gbp);
	return rc;
}

static const struct t_case cases[] = {
	T_CASE(test_ggemm_shapes),
	T_CASE(test_ggemm_refuses),
};
#endif

int main(int argc, char **argv)
{
	int rc = t_gpu_skip(__FILE__);

	if (rc >= 0)
		return rc;
#ifdef MS_HAVE_CUDA
	if (argc > 1 && !strcmp(argv[1], "--bench"))
		return bench() ? 1 : 0;
	return t_main(__FILE__, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
#else
	(void)argc;
	(void)argv;
	return 0;
#endif
}
