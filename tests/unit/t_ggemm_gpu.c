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
 * The grouped weight gradient (ms_ggemm_wgrad) against a double
 * reference: groups of 0 .. 300 rows, ranks 1, 3, 4, 16 and 32, columns
 * within and past a block, both layouts of G, written and accumulated;
 * its bf16 tensor-core form (ms_ggemm_wgrad_bf16) the same way, ranks 3
 * to 64, and with its DU (the low-rank product of the same pass over X,
 * rank 16's every-warp form and the wider ranks' two-warp one, 128- and
 * 256-wide blocks, runs, a permuted X, 64 groups at the bench's 1536
 * columns) against a double reference within the float sums' error and
 * one bf16 rounding, DU's columns past the padded rank and its rows past
 * the groups left as they were;
 * and the grouped low-rank products (ms_ggemm_lowrank), down and up, and
 * the bf16 down product on the tensor cores (ms_ggemm_lowrank_bf16), with
 * W stored and transposed, the same way, through both its kernels (rows
 * 16-byte aligned, streamed; and not), every rank, and with Y in X's
 * tail columns as the trainer has it.
 *
 * With an NVFP4 B (decoded inside the kernel): one part, two parts along
 * N (gate and up stacked) and two along K (their transpose), random codes
 * and scales, tensor scales that multiply and that divide; the reference's
 * B is the project's NVFP4 reference decoder's bf16
 * (ms_nvfp4_dequantize_ref), which the kernel's decode must equal, so the
 * same tolerance holds.
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
 * trainer's loop), each tile shape, and with B in NVFP4: decoded inside
 * the GEMM against decoded first into a bf16 scratch (the library's GPU
 * decoder over the experts' stacked bytes, then the bf16 grouped GEMM):
 * the median of 20 runs of each after 3 warm-up runs, CUDA events around
 * each run, and their TFLOP/s and ratios.
 */
#include <dlfcn.h>
#include <math.h>

#include "test_gpu.h"
#ifdef MS_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "ggemm.h"
#include "nvfp4.h"
#include "test_bf16.h"

#define SENTINEL 12345.0f

struct gcase {
	uint32_t E, N, K;
	const uint32_t *cnt;        /* E counts, or NULL: random (0 .. 300) */
	uint32_t lda_pad, ldc_pad;  /* strides past K and N */
	int q;                      /* B: 0 bf16; NVFP4 of 1 part, 2 parts
				       along N, 2 along K */
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
	void *ga, *gb, *gc, *gcnt, *goff, *gtiles, *gbp, *gq, *gbq;
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
	ms_gpu_free(u->gq);
	ms_gpu_free(u->gbq);
}

static uint64_t pad16(uint64_t n)
{
	return (n + 15) / 16 * 16;
}

/*
 * Every group's B in NVFP4 (u->c->q parts): random codes, scales of e4m3
 * values between 2^-2 and 7.5, each part's tensor scale multiplying or
 * dividing; u->bv becomes the reference decoder's bf16 of each part; the
 * bytes and the descriptors go to the device.
 */
static int nvfp4_b(struct grun *u, struct ms_err *err)
{
	const struct gcase *c = u->c;
	uint32_t N = c->N, K = c->K, E = c->E;
	int along_k = c->q == 3, np = c->q == 1 ? 1 : 2;
	uint32_t split = c->q == 1 ? (along_k ? K : N) : along_k ? K / 2 / 32 * 32 : N / 2 / 8 * 8;
	struct ms_ggemm_nvfp4 *d = calloc(E, sizeof *d);
	uint64_t total = 0, at = 0;
	uint8_t *hb = NULL;
	uint16_t *tmp = malloc((uint64_t)N * K * 2);
	int rc = MS_ENOMEM;
	if (!d || !tmp)
		goto out;
	for (uint32_t e = 0; e < E; e++)
		for (int i = 0; i < np; i++) {
			uint64_t rows = along_k || np == 1 ? N : i ? N - split : split;
			uint64_t cols = !along_k || np == 1 ? K : i ? K - split : split;
			total += pad16(rows * cols / 2) + pad16(rows * cols / 16);
		}
	if (!(hb = malloc(total)) || (rc = ms_gpu_malloc(&u->gq, total, err)) ||
	    (rc = ms_gpu_malloc(&u->gbq, E * sizeof *d, err)))
		goto out;
	for (uint32_t e = 0; e < E; e++) {
		d[e].split = split;
		d[e].along_k = along_k;
		for (int i = 0; i < np; i++) {
			uint64_t rows = along_k || np == 1 ? N : i ? N - split : split;
			uint64_t cols = !along_k || np == 1 ? K : i ? K - split : split;
			uint64_t r0 = !along_k && i ? split : 0, k0 = along_k && i ? split : 0;
			uint8_t *codes = hb + at, *scales = codes + pad16(rows * cols / 2);
			struct ms_ggemm_q4 *q = &d[e].part[i];
			for (uint64_t x = 0; x < rows * cols / 2; x++)
				codes[x] = (uint8_t)rnd();
			for (uint64_t x = 0; x < rows * cols / 16; x++)
				scales[x] = (uint8_t)(0x28 + rnd() % 0x28);
			q->tscale = rnd() % 2 ? 0.02f : 3.0f;
			q->divide = (int)(rnd() % 2);
			q->code_stride = (uint32_t)(cols / 2);
			q->scale_stride = (uint32_t)(cols / 16);
			if ((rc = ms_nvfp4_dequantize_ref(codes, scales, rows, cols, q->tscale,
							  q->divide ? MS_NVFP4_TSCALE_DIV
								    : MS_NVFP4_TSCALE_MUL,
							  MS_DTYPE_BF16, tmp, err)))
				goto out;
			for (uint64_t r = 0; r < rows; r++)
				for (uint64_t k = 0; k < cols; k++)
					u->bv[((uint64_t)e * N + r0 + r) * K + k0 + k] =
						from_bf16(tmp[r * cols + k]);
			q->codes = (const uint8_t *)u->gq + at;
			q->scales = (const uint8_t *)u->gq + (scales - hb);
			at += pad16(rows * cols / 2) + pad16(rows * cols / 16);
		}
		if ((rc = ms_ggemm_nvfp4_check(&d[e], N, K, err)))
			goto out;
	}
	if ((rc = ms_gpu_memcpy(u->gq, hb, total, err)) ||
	    (rc = ms_gpu_memcpy(u->gbq, d, E * sizeof *d, err)))
		goto out;
	rc = MS_OK;
out:
	if (rc == MS_ENOMEM && !err->msg[0])
		ms_err_set(err, MS_ENOMEM, "out of memory");
	free(d);
	free(hb);
	free(tmp);
	return rc;
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
	static const char *qn[] = {"bf16", "nvfp4", "nvfp4 2 parts along N", "nvfp4 2 parts along K"};
	printf("ggemm %s %s %s E %u N %u K %u rows %llu: max err/mag %.3g\n",
	       u->cfg == MS_GGEMM_WIDE ? "wide" : "narrow", qn[c->q], what, c->E, c->N, c->K,
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
		.bq = c->q ? u->gbq : NULL,
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
	if (c->q && nvfp4_b(&u, &err))
		goto fail;
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
		{8, 8, 8, edge, 0, 0, 0},
		{8, 24, 40, edge, 8, 2, 0},
		{8, 136, 264, edge, 0, 8, 0},
		{1, 256, 64, one, 16, 0, 0},
		{3, 48, 16, none, 0, 0, 0},
		{64, 48, 24, NULL, 0, 0, 0},
		{5, 128, 32, NULL, 8, 0, 0},
		{8, 24, 32, edge, 0, 0, 1},
		{8, 136, 96, edge, 8, 0, 2},
		{8, 48, 128, edge, 0, 2, 3},
		{3, 264, 64, NULL, 0, 0, 2},
		{64, 16, 64, NULL, 0, 0, 3},
	};
	for (int cfg = MS_GGEMM_NARROW; cfg <= MS_GGEMM_WIDE; cfg++)
		for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
			T_ASSERT(run_case(&cs[i], cfg) == 0);
	return 0;
}

/* One case of the grouped weight gradient against a double reference:
 * rows per group from cnt (NULL: random 0 .. 300), U and X random (float32,
 * or with bf bf16 values through ms_ggemm_wgrad_bf16) with row strides past
 * their widths, G poisoned (written) or holding random values
 * (accumulated), a sentinel between the groups' G that must survive.
 * Tolerance: float32 sums of exact (bf16) or float32 products, (rows + 2)
 * 2^-23 (float32) or 2^-22 (the tensor cores' accumulation order is the
 * hardware's) of the sum of magnitudes. */
static int wgrad_run_w(int bf, uint32_t E, uint32_t R, uint32_t N, const uint32_t *cnt,
		       int trans, int acc, int perm, uint32_t nsplit, uint32_t width,
		       uint32_t run_rows, int dup)
{
	uint32_t off[65];
	uint64_t rows, ldu = bf ? R + 8 : R + 3, ldx = bf ? N + 16 : N + 1;
	uint64_t gs = (uint64_t)R * N + 5, ng = E * gs, esz = bf ? 2 : 4;
	void *u = NULL, *x = NULL;
	double *uv = NULL, *xv = NULL;
	float *g = NULL, *g0 = NULL;
	void *du = NULL, *dx = NULL, *dg = NULL, *doff = NULL, *dp = NULL, *dpart = NULL;
	int32_t *xp = NULL;
	double *xg = NULL;
	/* dup: DU = 0.25 X W_e as well, W_e [N, RP] (stride RP + 8), DU's
	 * stride RP + 5, its columns past RP and a row past the groups'
	 * sentinels */
	uint32_t rp = (R + 15) / 16 * 16;
	uint64_t ldw = rp + 8, lddu = rp + 5, nw = (uint64_t)E * N * ldw;
	uint16_t *w = NULL, *hdu = NULL;
	double *wv = NULL;
	void *dw = NULL, *ddu = NULL, *ddp = NULL;
	const char *what = bf ? dup ? "wgrad bf16 with DU" : "wgrad bf16" : "wgrad";
	struct ms_err err = {0};
	double worst = 0, ulp = bf ? 0x1p-22 : 0x1p-23;
	int rc = 1;

	off[0] = 0;
	for (uint32_t e = 0; e < E; e++)
		off[e + 1] = off[e] + (cnt ? cnt[e] : (uint32_t)(rnd() % 301));
	rows = off[E];
	u = malloc((rows + 1) * ldu * esz);
	x = malloc((rows + 1) * ldx * esz);
	uv = malloc((rows + 1) * ldu * 8);
	xv = malloc((rows + 1) * ldx * 8);
	g = malloc(ng * 4);
	g0 = malloc(ng * 4);
	T_ASSERT(u && x && uv && xv && g && g0);
	if (bf) {
		fill(u, uv, rows * ldu, 1.0);
		fill(x, xv, rows * ldx, 1.0);
	} else {
		for (uint64_t i = 0; i < rows * ldu; i++)
			uv[i] = ((float *)u)[i] = (float)gauss();
		for (uint64_t i = 0; i < rows * ldx; i++)
			xv[i] = ((float *)x)[i] = (float)gauss();
	}
	for (uint64_t i = 0; i < ng; i++)
		g0[i] = i % gs >= (uint64_t)R * N ? SENTINEL : acc ? (float)gauss() : NAN;
	if (perm) {
		/* row i reads x's row xp[i] / 3 (any of them, some twice, as
		 * the experts' rows read their tokens): xg is what it reads */
		xp = malloc((rows + 1) * 4);
		xg = malloc((rows + 1) * ldx * 8);
		T_ASSERT(xp && xg);
		for (uint64_t i = 0; i < rows; i++) {
			uint64_t src = rnd() % rows;
			xp[i] = (int32_t)(src * 3 + rnd() % 3);
			memcpy(xg + i * ldx, xv + src * ldx, ldx * 8);
		}
		free(xv);
		xv = xg;
		xg = NULL;
		if (ms_gpu_malloc(&dp, (rows + 1) * 4, &err) ||
		    (rows && ms_gpu_memcpy(dp, xp, rows * 4, &err)))
			goto fail;
	}
	if (ms_gpu_malloc(&du, (rows + 1) * ldu * esz, &err) ||
	    ms_gpu_malloc(&dx, (rows + 1) * ldx * esz, &err) || ms_gpu_malloc(&dg, ng * 4, &err) ||
	    ms_gpu_malloc(&doff, (E + 1) * 4, &err) ||
	    (rows && (ms_gpu_memcpy(du, u, rows * ldu * esz, &err) ||
		      ms_gpu_memcpy(dx, x, rows * ldx * esz, &err))) ||
	    ms_gpu_memcpy(dg, g0, ng * 4, &err) || ms_gpu_memcpy(doff, off, (E + 1) * 4, &err))
		goto fail;
	if (nsplit > 1 && ms_gpu_malloc(&dpart, (uint64_t)nsplit * E * R * N * 4, &err))
		goto fail;
	if (dup) {
		w = malloc(nw * 2);
		wv = malloc(nw * 8);
		hdu = malloc((rows + 1) * lddu * 2);
		T_ASSERT(w && wv && hdu);
		fill(w, wv, nw, 1.0);
		for (uint64_t i = 0; i < (rows + 1) * lddu; i++)
			hdu[i] = 0x7fc1;   /* a NaN: what the kernel must overwrite or leave */
		if (ms_gpu_malloc(&dw, nw * 2, &err) || ms_gpu_malloc(&ddu, (rows + 1) * lddu * 2, &err) ||
		    ms_gpu_malloc(&ddp, ms_ggemm_wgrad_bf16_dpart(N, R, rows + 1) * 4, &err) ||
		    ms_gpu_memcpy(dw, w, nw * 2, &err) ||
		    ms_gpu_memcpy(ddu, hdu, (rows + 1) * lddu * 2, &err))
			goto fail;
	}
	if (bf) {
		struct ms_ggemm_wgrad_bf16 p = {
			.E = E, .R = R, .N = N, .off = doff, .u = du, .ldu = ldu, .x = dx,
			.ldx = ldx, .g = dg, .gstride = gs, .trans = trans, .alpha = 0.5f,
			.accumulate = acc, .xperm = dp, .xdiv = 3, .nsplit = nsplit, .part = dpart,
			.width = width, .run_rows = run_rows,
		};
		if (dup) {
			p.w = dw, p.ldw = ldw, p.wstride = (uint64_t)N * ldw, p.du = ddu;
			p.lddu = lddu, p.dalpha = 0.25f, p.dpart = (float *)ddp, p.drows = rows + 1;
		}
		if (ms_ggemm_wgrad_bf16(&p, NULL, &err) || ms_gpu_sync(&err))
			goto fail;
	} else {
		struct ms_ggemm_wgrad p = {
			.E = E, .R = R, .N = N, .off = doff, .u = du, .ldu = ldu, .x = dx,
			.ldx = ldx, .g = dg, .gstride = gs, .trans = trans, .alpha = 0.5f,
			.accumulate = acc,
		};
		if (ms_ggemm_wgrad(&p, NULL, &err) || ms_gpu_sync(&err))
			goto fail;
	}
	if (cudaMemcpy(g, dg, ng * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
		goto out;
	for (uint32_t e = 0; e < E; e++) {
		const float *ge = g + e * gs, *g0e = g0 + e * gs;
		for (uint64_t i = (uint64_t)R * N; i < gs; i++)
			if (ge[i] != SENTINEL) {
				fprintf(stderr, "%s: group %u: past its G was written\n", what, e);
				goto out;
			}
		for (uint32_t j = 0; j < R; j++)
			for (uint32_t n = 0; n < N; n++) {
				uint64_t at = trans ? (uint64_t)n * R + j : (uint64_t)j * N + n;
				double s = 0, m = 0, want, err_;
				for (uint64_t r = off[e]; r < off[e + 1]; r++) {
					double t = uv[r * ldu + j] * xv[r * ldx + n];
					s += t;
					m += fabs(t);
				}
				want = 0.5 * s + (acc ? g0e[at] : 0);
				m = 0.5 * m + (acc ? fabs(g0e[at]) : 0);
				err_ = fabs(ge[at] - want);
				if (!(err_ <= (off[e + 1] - off[e] + 2) * ulp * m + 1e-30)) {
					fprintf(stderr, "%s E %u R %u N %u trans %d acc %d: group %u "
						"(%u, %u): gpu %.9g ref %.9g mag %.3g\n", what, E, R, N,
						trans, acc, e, j, n, (double)ge[at], want, m);
					goto out;
				}
				if (m > 0 && err_ / m > worst)
					worst = err_ / m;
			}
	}
	if (dup) {
		/* DU against a double reference: the float sums' error as G's,
		 * then one rounding to bf16 (half its ulp: 2^-8 of the value) */
		double dworst = 0;
		if (cudaMemcpy(hdu, ddu, (rows + 1) * lddu * 2, cudaMemcpyDeviceToHost) !=
		    cudaSuccess)
			goto out;
		for (uint32_t e = 0; e < E; e++)
			for (uint64_t r = off[e]; r < off[e + 1]; r++)
				for (uint32_t j = 0; j < lddu; j++) {
					double s = 0, m = 0, got = from_bf16(hdu[r * lddu + j]), d;
					if (j >= rp) {
						if (hdu[r * lddu + j] != 0x7fc1) {
							fprintf(stderr, "%s: row %llu: DU past its %u "
								"columns was written\n", what,
								(unsigned long long)r, rp);
							goto out;
						}
						continue;
					}
					for (uint32_t n = 0; n < N; n++) {
						double t = xv[r * ldx + n] *
							   wv[((uint64_t)e * N + n) * ldw + j];
						s += t;
						m += fabs(t);
					}
					s *= 0.25, m *= 0.25;
					d = fabs(got - s);
					if (!(d <= 0x1p-8 * fabs(s) + (N + 2) * 0x1p-22 * m + 1e-30)) {
						fprintf(stderr, "%s E %u R %u N %u: DU row %llu col %u: "
							"gpu %.9g ref %.9g mag %.3g\n", what, E, R, N,
							(unsigned long long)r, j, got, s, m);
						goto out;
					}
					if (m > 0 && d / m > dworst)
						dworst = d / m;
				}
		for (uint32_t j = 0; j < lddu; j++)
			if (hdu[rows * lddu + j] != 0x7fc1) {
				fprintf(stderr, "%s: DU's row past the groups was written\n", what);
				goto out;
			}
		printf("%s: DU max err/mag %.3g\n", what, dworst);
	}
	printf("%s E %u R %u N %u rows %llu trans %d %s%s, %u split(s) (%u rows a run), width "
	       "%u: max err/mag %.3g\n", what, E, R, N, (unsigned long long)rows, trans,
	       acc ? "accumulate" : "write", perm ? ", X through a permutation" : "",
	       nsplit ? nsplit : 1, run_rows, width, worst);
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "%s: %s\n", what, err.msg[0] ? err.msg : "a CUDA copy failed");
out:
	free(u);
	free(x);
	free(uv);
	free(xv);
	free(g);
	free(g0);
	ms_gpu_free(du);
	ms_gpu_free(dx);
	ms_gpu_free(dg);
	ms_gpu_free(doff);
	ms_gpu_free(dp);
	ms_gpu_free(dpart);
	ms_gpu_free(dw);
	ms_gpu_free(ddu);
	ms_gpu_free(ddp);
	free(w);
	free(wv);
	free(hdu);
	free(xp);
	return rc;
}

static int wgrad_run(int bf, uint32_t E, uint32_t R, uint32_t N, const uint32_t *cnt,
		     int trans, int acc, int perm, uint32_t nsplit)
{
	return wgrad_run_w(bf, E, R, N, cnt, trans, acc, perm, nsplit, 0, 0, 0);
}

static int wgrad_case(uint32_t E, uint32_t R, uint32_t N, const uint32_t *cnt, int trans,
		      int acc)
{
	return wgrad_run(0, E, R, N, cnt, trans, acc, 0, 0);
}

static int wgrad_bf_case(uint32_t E, uint32_t R, uint32_t N, const uint32_t *cnt, int trans,
			 int acc)
{
	return wgrad_run(1, E, R, N, cnt, trans, acc, 0, 0);
}

static int test_ggemm_wgrad(void)
{
	static const uint32_t edge[] = {0, 1, 31, 32, 33, 0, 300, 65};
	struct ms_err err = {0};
	struct ms_ggemm_wgrad bad = {.E = 1, .R = 33, .N = 8, .off = (const uint32_t *)8,
				     .u = (const float *)8, .ldu = 33, .x = (const float *)8,
				     .ldx = 8, .g = (float *)8};
	T_ASSERT(wgrad_case(8, 16, 300, edge, 0, 1) == 0);
	T_ASSERT(wgrad_case(8, 16, 300, edge, 1, 0) == 0);
	T_ASSERT(wgrad_case(8, 1, 5, edge, 0, 0) == 0);
	T_ASSERT(wgrad_case(8, 3, 128, edge, 1, 1) == 0);
	T_ASSERT(wgrad_case(8, 32, 129, edge, 0, 1) == 0);
	T_ASSERT(wgrad_case(64, 4, 48, NULL, 1, 1) == 0);
	/* refused: a rank past the bound, a short stride */
	T_ASSERT_EQ_INT(ms_ggemm_wgrad(&bad, NULL, &err), MS_EINVAL);
	bad.R = 4, bad.ldx = 7;
	T_ASSERT_EQ_INT(ms_ggemm_wgrad(&bad, NULL, &err), MS_EINVAL);
	return 0;
}

/* ranks that fill the padded width and ranks that do not (3, 4, 8: U's
 * rows then not 16-byte aligned), groups empty and across a stage (32
 * rows), N under, at and across a block's 128 or 256 columns (each
 * width taken), both G layouts, X read directly and through a row
 * permutation, rows in one run a block or cut into runs with partial sums
 * (every group, or only those past run_rows);
 * refused: a rank past the bound, an X stride not a multiple of 8, a
 * width neither 128 nor 256 */
static int test_ggemm_wgrad_bf16(void)
{
	static const uint32_t edge[] = {0, 1, 31, 32, 33, 0, 300, 65};
	struct ms_err err = {0};
	struct ms_ggemm_wgrad_bf16 bad = {.E = 1, .R = 65, .N = 8, .off = (const uint32_t *)8,
					  .u = (const void *)16, .ldu = 8,
					  .x = (const void *)16, .ldx = 8, .g = (float *)8};
	T_ASSERT(wgrad_bf_case(8, 16, 136, edge, 1, 1) == 0);
	T_ASSERT(wgrad_bf_case(8, 16, 64, edge, 0, 0) == 0);
	T_ASSERT(wgrad_bf_case(8, 32, 128, edge, 0, 1) == 0);
	T_ASSERT(wgrad_bf_case(4, 48, 40, NULL, 1, 0) == 0);
	T_ASSERT(wgrad_bf_case(4, 64, 264, NULL, 0, 1) == 0);
	T_ASSERT(wgrad_bf_case(8, 3, 136, edge, 1, 1) == 0);
	T_ASSERT(wgrad_bf_case(8, 4, 64, edge, 0, 0) == 0);
	T_ASSERT(wgrad_bf_case(4, 8, 40, NULL, 1, 0) == 0);
	/* X's rows through a permutation (xperm / xdiv) */
	T_ASSERT(wgrad_run(1, 8, 16, 136, edge, 1, 1, 1, 0) == 0);
	T_ASSERT(wgrad_run(1, 4, 3, 64, NULL, 0, 0, 1, 0) == 0);
	/* rows cut into runs a block each, partials summed after: groups
	 * shorter than the runs (empty runs), longer, both layouts */
	T_ASSERT(wgrad_run(1, 8, 16, 136, edge, 1, 1, 1, 4) == 0);
	T_ASSERT(wgrad_run(1, 8, 16, 256, edge, 0, 0, 0, 4) == 0);
	T_ASSERT(wgrad_run(1, 4, 48, 40, NULL, 1, 0, 0, 3) == 0);
	/* each block width, whichever the device's fill would pick: N past
	 * one block of either, and short of one */
	for (uint32_t w = 128; w <= 256; w += 128) {
		T_ASSERT(wgrad_run_w(1, 8, 16, 392, edge, 1, 1, 1, 0, w, 0, 0) == 0);
		T_ASSERT(wgrad_run_w(1, 8, 16, 520, edge, 0, 0, 0, 4, w, 0, 0) == 0);
		T_ASSERT(wgrad_run_w(1, 4, 64, 40, NULL, 1, 1, 0, 0, w, 0, 0) == 0);
	}
	/* runs only where a group passes run_rows (edge's 300 in 4 runs at
	 * most, 65 in 2, 33 and under whole: those write G directly, the
	 * others through partials), X direct and permuted, accumulating and
	 * not; a run_rows no group passes (every group one run) */
	T_ASSERT(wgrad_run_w(1, 8, 16, 136, edge, 1, 1, 1, 4, 0, 40, 0) == 0);
	T_ASSERT(wgrad_run_w(1, 8, 3, 264, edge, 0, 0, 0, 4, 256, 64, 0) == 0);
	T_ASSERT(wgrad_run_w(1, 8, 16, 136, edge, 0, 1, 0, 4, 128, 1000, 0) == 0);
	/* with DU, the low-rank product of the same pass: ranks that fill
	 * 16 and not (3: W and DU 16 wide), 32, 64; groups empty and across
	 * a stage, N past a block of either width and short of one, X
	 * direct and permuted, one run a group or cut into runs */
	for (uint32_t w = 128; w <= 256; w += 128) {
		T_ASSERT(wgrad_run_w(1, 8, 16, 392, edge, 1, 1, 0, 0, w, 0, 1) == 0);
		T_ASSERT(wgrad_run_w(1, 8, 3, 136, edge, 0, 0, 1, 4, w, 40, 1) == 0);
		T_ASSERT(wgrad_run_w(1, 4, 64, 40, NULL, 1, 1, 0, 0, w, 0, 1) == 0);
	}
	T_ASSERT(wgrad_run_w(1, 8, 32, 520, edge, 0, 1, 1, 4, 0, 0, 1) == 0);
	T_ASSERT(wgrad_run_w(1, 64, 16, 1536, NULL, 1, 0, 0, 4, 0, 1000, 1) == 0);
	T_ASSERT_EQ_INT(ms_ggemm_wgrad_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.R = 16, bad.ldu = 16, bad.ldx = 12;
	T_ASSERT_EQ_INT(ms_ggemm_wgrad_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.ldx = 8;
	/* splits without their partials' buffer, a divisor of 0 */
	bad.nsplit = 4;
	T_ASSERT_EQ_INT(ms_ggemm_wgrad_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.nsplit = 0;
	bad.xperm = (const int32_t *)8;
	T_ASSERT_EQ_INT(ms_ggemm_wgrad_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.xperm = NULL;
	/* a width neither 128 nor 256 */
	bad.width = 192;
	T_ASSERT_EQ_INT(ms_ggemm_wgrad_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.width = 0;
	/* DU with W's stride short of the padded rank, then W misaligned,
	 * then without the partials' buffer */
	bad.du = (void *)16, bad.lddu = 16, bad.w = (const void *)16, bad.ldw = 8;
	bad.dpart = (float *)16;
	T_ASSERT_EQ_INT(ms_ggemm_wgrad_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.ldw = 16, bad.w = (const void *)8;
	T_ASSERT_EQ_INT(ms_ggemm_wgrad_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.w = (const void *)16, bad.dpart = NULL;
	T_ASSERT_EQ_INT(ms_ggemm_wgrad_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.du = NULL;
	bad.N = 0;
	T_ASSERT_EQ_INT(ms_ggemm_wgrad_bf16(&bad, NULL, &err), MS_OK);
	return 0;
}

/* One case of the grouped low-rank product against a double reference
 * (the offsets and tiles by ms_ggemm_index): Y poisoned (written) or
 * random (accumulated), a sentinel in Y's columns past its width and in
 * the rows past the groups (the row bound passed is past them too). */
static int lowrank_case(uint32_t E, uint32_t R, uint32_t D, const uint32_t *cnt, int up, int wt,
			int acc)
{
	uint32_t c[64], off[65];
	uint64_t rows, slack = 5, xw = up ? R : D, yw = up ? D : R, ldx = xw + 2, ldy = yw + 3;
	uint64_t ws = (uint64_t)R * D + 7, ny;
	float *x = NULL, *w = NULL, *y = NULL, *y0 = NULL;
	void *dx = NULL, *dw = NULL, *dy = NULL, *dc = NULL, *doff = NULL, *dt = NULL;
	struct ms_err err = {0};
	double worst = 0;
	int rc = 1;

	off[0] = 0;
	for (uint32_t e = 0; e < E; e++) {
		c[e] = cnt ? cnt[e] : (uint32_t)(rnd() % 301);
		off[e + 1] = off[e] + c[e];
	}
	rows = off[E];
	ny = (rows + slack) * ldy;
	x = malloc((rows + 1) * ldx * 4);
	w = malloc(E * ws * 4);
	y = malloc(ny * 4);
	y0 = malloc(ny * 4);
	T_ASSERT(x && w && y && y0);
	for (uint64_t i = 0; i < rows * ldx; i++)
		x[i] = (float)gauss();
	for (uint64_t i = 0; i < E * ws; i++)
		w[i] = (float)gauss();
	for (uint64_t i = 0; i < ny; i++)
		y0[i] = i / ldy >= rows || i % ldy >= yw ? SENTINEL : acc ? (float)gauss() : NAN;
	if (ms_gpu_malloc(&dx, (rows + 1) * ldx * 4, &err) || ms_gpu_malloc(&dw, E * ws * 4, &err) ||
	    ms_gpu_malloc(&dy, ny * 4, &err) || ms_gpu_malloc(&dc, E * 4, &err) ||
	    ms_gpu_malloc(&doff, (E + 1) * 4, &err) || ms_gpu_malloc(&dt, (E + 1) * 4, &err) ||
	    (rows && ms_gpu_memcpy(dx, x, rows * ldx * 4, &err)) ||
	    ms_gpu_memcpy(dw, w, E * ws * 4, &err) || ms_gpu_memcpy(dy, y0, ny * 4, &err) ||
	    ms_gpu_memcpy(dc, c, E * 4, &err) || ms_ggemm_index(dc, E, doff, dt, NULL, &err))
		goto fail;
	{
		struct ms_ggemm_lowrank p = {
			.E = E, .R = R, .D = D, .up = up, .rows = rows + slack, .off = doff,
			.tiles = dt, .x = dx, .ldx = ldx, .w = dw, .wstride = ws, .wt = wt,
			.y = dy, .ldy = ldy, .alpha = 0.5f, .accumulate = acc,
		};
		if (ms_ggemm_lowrank(&p, NULL, &err) || ms_gpu_sync(&err))
			goto fail;
	}
	if (cudaMemcpy(y, dy, ny * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
		goto out;
	for (uint32_t e = 0; e < E; e++) {
		const float *we = w + e * ws;
		for (uint64_t r = off[e]; r < off[e + 1]; r++)
			for (uint64_t o = 0; o < yw; o++) {
				double s = 0, m = 0, want, er;
				uint64_t K = up ? R : D;
				for (uint64_t k = 0; k < K; k++) {
					/* W_e [yw, K] as stored, or transposed */
					double t = (double)x[r * ldx + k] *
						   (wt ? we[k * yw + o] : we[o * K + k]);
					s += t;
					m += fabs(t);
				}
				want = 0.5 * s + (acc ? y0[r * ldy + o] : 0);
				m = 0.5 * m + (acc ? fabs(y0[r * ldy + o]) : 0);
				er = fabs(y[r * ldy + o] - want);
				if (!(er <= (K + 2) * 0x1p-23 * m + 1e-30)) {
					fprintf(stderr, "lowrank %s E %u R %u D %u wt %d acc %d: row "
						"%llu column %llu: gpu %.9g ref %.9g mag %.3g\n",
						up ? "up" : "down", E, R, D, wt, acc,
						(unsigned long long)r, (unsigned long long)o,
						(double)y[r * ldy + o], want, m);
					goto out;
				}
				if (m > 0 && er / m > worst)
					worst = er / m;
			}
	}
	for (uint64_t i = 0; i < ny; i++)
		if ((i / ldy >= rows || i % ldy >= yw) && y[i] != SENTINEL) {
			fprintf(stderr, "lowrank: element %llu outside the groups' rows and width "
				"was written\n", (unsigned long long)i);
			goto out;
		}
	printf("lowrank %s E %u R %u D %u rows %llu wt %d %s: max err/mag %.3g\n",
	       up ? "up" : "down", E, R, D, (unsigned long long)rows, wt,
	       acc ? "accumulate" : "write", worst);
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "lowrank: %s\n", err.msg[0] ? err.msg : "a CUDA copy failed");
out:
	free(x);
	free(w);
	free(y);
	free(y0);
	ms_gpu_free(dx);
	ms_gpu_free(dw);
	ms_gpu_free(dy);
	ms_gpu_free(dc);
	ms_gpu_free(doff);
	ms_gpu_free(dt);
	return rc;
}

static int test_ggemm_lowrank(void)
{
	static const uint32_t edge[] = {0, 1, 127, 128, 129, 0, 300, 5};
	struct ms_err err = {0};
	struct ms_ggemm_lowrank bad = {.E = 1, .R = 33, .D = 8, .off = (const uint32_t *)8,
				       .tiles = (const uint32_t *)8, .x = (const float *)8,
				       .ldx = 8, .w = (const float *)8, .y = (float *)8, .ldy = 33};
	for (int up = 0; up < 2; up++) {
		T_ASSERT(lowrank_case(8, 16, 200, edge, up, 0, 0) == 0);
		T_ASSERT(lowrank_case(8, 16, 200, edge, up, 1, 1) == 0);
		T_ASSERT(lowrank_case(8, 1, 7, edge, up, 0, 1) == 0);
		T_ASSERT(lowrank_case(8, 32, 129, edge, up, 1, 0) == 0);
		T_ASSERT(lowrank_case(64, 3, 48, NULL, up, 0, 1) == 0);
	}
	T_ASSERT_EQ_INT(ms_ggemm_lowrank(&bad, NULL, &err), MS_EINVAL);
	bad.R = 4, bad.ldx = 7;
	T_ASSERT_EQ_INT(ms_ggemm_lowrank(&bad, NULL, &err), MS_EINVAL);
	return 0;
}

/* One case of the bf16 low-rank product (ms_ggemm_lowrank_bf16) against a
 * double reference from the same bf16 inputs: Y poisoned, a sentinel in
 * its columns past R and rows past the groups (or, with Y in X's tail
 * columns, X's other bytes unchanged). Tolerance: the float sum's (D + 2)
 * units of 2^-23 of the products' magnitude, plus the one rounding to
 * bf16 (2^-8 of the value). */
#define BF_SENTINEL 0x7f7fu
struct lbcase {
	uint32_t E, R, D;
	const uint32_t *cnt;   /* E counts, or NULL: random (0 .. 300) */
	int wt;
	uint32_t xpad, wpad;   /* X's stride past D (and R, alias), W_e's past R D */
	uint32_t xoff;         /* X starts this many elements into its buffer */
	int alias;             /* Y in X's columns D .. D + R - 1 (the trainer's) */
};

static int lowrank_bf_case(const struct lbcase *lc)
{
	uint32_t E = lc->E, R = lc->R, D = lc->D, c[64], off[65];
	uint64_t rows, slack = 5, ldx = D + lc->xpad + (lc->alias ? R : 0);
	uint64_t ldy = lc->alias ? ldx : R + 6, ws = (uint64_t)R * D + lc->wpad, ny, nx, y0;
	uint16_t *x = NULL, *w = NULL, *y = NULL;
	void *dx = NULL, *dw = NULL, *dy = NULL, *dc = NULL, *doff = NULL, *dt = NULL;
	struct ms_err err = {0};
	double worst = 0;
	int rc = 1, wt = lc->wt;

	off[0] = 0;
	for (uint32_t e = 0; e < E; e++) {
		c[e] = lc->cnt ? lc->cnt[e] : (uint32_t)(rnd() % 301);
		off[e + 1] = off[e] + c[e];
	}
	rows = off[E];
	/* X's rows from its buffer's element xoff; with alias Y is that
	 * buffer, its rows' columns from D (y0: where Y starts in y) */
	nx = lc->xoff + (rows + 1) * ldx;
	ny = lc->alias ? nx : (rows + slack) * ldy;
	y0 = lc->alias ? lc->xoff + D : 0;
	x = malloc(nx * 2);
	w = malloc(E * ws * 2);
	y = malloc(ny * 2);
	T_ASSERT(x && w && y);
	for (uint64_t i = 0; i < nx; i++)
		x[i] = to_bf16((float)gauss());
	for (uint64_t i = 0; i < E * ws; i++)
		w[i] = to_bf16((float)gauss());
	for (uint64_t i = 0; i < ny; i++) {
		uint64_t q = i - y0, in = i >= y0 && q / ldy < rows && q % ldy < R;
		if (lc->alias)
			x[i] = y[i] = in ? 0xffffu : x[i];
		else
			y[i] = in ? 0xffffu : BF_SENTINEL;
	}
	if (ms_gpu_malloc(&dx, nx * 2, &err) || ms_gpu_malloc(&dw, E * ws * 2, &err) ||
	    (!lc->alias && ms_gpu_malloc(&dy, ny * 2, &err)) || ms_gpu_malloc(&dc, E * 4, &err) ||
	    ms_gpu_malloc(&doff, (E + 1) * 4, &err) || ms_gpu_malloc(&dt, (E + 1) * 4, &err) ||
	    ms_gpu_memcpy(dx, x, nx * 2, &err) || ms_gpu_memcpy(dw, w, E * ws * 2, &err) ||
	    (!lc->alias && ms_gpu_memcpy(dy, y, ny * 2, &err)) ||
	    ms_gpu_memcpy(dc, c, E * 4, &err) || ms_ggemm_index(dc, E, doff, dt, NULL, &err))
		goto fail;
	{
		struct ms_ggemm_lowrank_bf16 p = {
			.E = E, .R = R, .D = D, .rows = rows + slack, .off = doff, .tiles = dt,
			.x = (const uint16_t *)dx + lc->xoff, .ldx = ldx, .w = dw, .wstride = ws,
			.wt = wt, .y = (uint16_t *)(lc->alias ? dx : dy) + y0, .ldy = ldy,
			.alpha = 0.5f,
		};
		if (ms_ggemm_lowrank_bf16(&p, NULL, &err) || ms_gpu_sync(&err))
			goto fail;
	}
	if (cudaMemcpy(y, lc->alias ? dx : dy, ny * 2, cudaMemcpyDeviceToHost) != cudaSuccess)
		goto out;
	for (uint32_t e = 0; e < E; e++) {
		const uint16_t *we = w + e * ws;
		for (uint64_t r = off[e]; r < off[e + 1]; r++)
			for (uint64_t o = 0; o < R; o++) {
				double s = 0, m = 0, want, er, got = from_bf16(y[y0 + r * ldy + o]);
				for (uint64_t k = 0; k < D; k++) {
					/* W_e [R, D] as stored, or [D, R] */
					double t = from_bf16(x[lc->xoff + r * ldx + k]) *
						   from_bf16(wt ? we[k * R + o] : we[o * D + k]);
					s += t;
					m += fabs(t);
				}
				want = 0.5 * s;
				er = fabs(got - want);
				if (!(er <= 0x1p-8 * fabs(want) + (D + 2) * 0x1p-23 * 0.5 * m + 1e-30)) {
					fprintf(stderr, "lowrank bf16 E %u R %u D %u wt %d: row %llu "
						"column %llu: gpu %.6g ref %.9g mag %.3g\n", E, R, D, wt,
						(unsigned long long)r, (unsigned long long)o, got, want,
						0.5 * m);
					goto out;
				}
				if (m > 0 && er / (0.5 * m) > worst)
					worst = er / (0.5 * m);
			}
	}
	for (uint64_t i = 0; i < ny; i++) {
		uint64_t q = i - y0, in = i >= y0 && q / ldy < rows && q % ldy < R;
		if (!in && y[i] != (lc->alias ? x[i] : BF_SENTINEL)) {
			fprintf(stderr, "lowrank bf16: element %llu outside the groups' rows and "
				"width was written\n", (unsigned long long)i);
			goto out;
		}
	}
	printf("lowrank bf16 E %u R %u D %u rows %llu wt %d ldx %llu%s: max err/mag %.3g\n", E,
	       R, D, (unsigned long long)rows, wt, (unsigned long long)ldx,
	       lc->alias ? " (Y in X)" : "", worst);
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "lowrank bf16: %s\n", err.msg[0] ? err.msg : "a CUDA copy failed");
out:
	free(x);
	free(w);
	free(y);
	ms_gpu_free(dx);
	ms_gpu_free(dw);
	ms_gpu_free(dy);
	ms_gpu_free(dc);
	ms_gpu_free(doff);
	ms_gpu_free(dt);
	return rc;
}

static int test_ggemm_lowrank_bf16(void)
{
	static const uint32_t edge[] = {0, 1, 127, 128, 129, 0, 300, 5};
	/* a half tile (64 rows, k_lowrank_pipe's block) +- 1, a tile + 1 */
	static const uint32_t half[] = {1, 0, 63, 64, 65, 129};
	/* every case: x, w from ms_gpu_malloc (aligned); xpad 4 makes ldx
	 * 4 mod 8, xoff 4 moves x 8 bytes, wpad 4 makes wstride 4 mod 8:
	 * each leaves k_lowrank_pipe for k_lowrank_bf16 */
	static const struct lbcase cs[] = {
		/* k_lowrank_bf16: D past its chunk (128) and not a multiple
		 * of 16; W either way; ranks 8, 16, 32; groups empty, one
		 * row, a tile +- 1 */
		{8, 16, 200, edge, 0, 4, 8, 0, 0},
		{8, 16, 136, edge, 1, 4, 8, 0, 0},
		{8, 8, 24, edge, 0, 4, 8, 0, 0},
		{8, 32, 264, edge, 1, 4, 8, 0, 0},
		{64, 16, 48, NULL, 0, 4, 8, 0, 0},
		{6, 16, 64, half, 0, 0, 0, 4, 0},
		{6, 16, 64, half, 1, 0, 4, 0, 0},
		/* k_lowrank_pipe: the trainer's two (Y in X's tail, D 768 and
		 * 1536 over 12 and 24 stages), on fewer rows */
		{6, 16, 768, half, 0, 0, 0, 0, 1},
		{4, 16, 1536, half, 1, 0, 0, 0, 1},
		/* every rank either way; D ending 8 into a k step of 16, past
		 * a stage, under one (8, 24); the edge groups */
		{8, 8, 200, edge, 0, 0, 0, 0, 0},
		{8, 8, 200, edge, 1, 8, 8, 0, 0},
		{6, 24, 136, half, 0, 0, 0, 0, 0},
		{6, 24, 136, half, 1, 0, 0, 0, 0},
		{6, 32, 264, half, 0, 0, 0, 0, 1},
		{6, 32, 264, half, 1, 0, 8, 0, 0},
		{6, 16, 8, half, 1, 0, 0, 0, 0},
		{6, 32, 24, half, 0, 0, 0, 0, 0},
		{64, 16, 48, NULL, 1, 0, 0, 0, 0},
	};
	struct ms_err err = {0};
	struct ms_ggemm_lowrank_bf16 bad = {.E = 1, .R = 12, .D = 16,
					    .off = (const uint32_t *)8,
					    .tiles = (const uint32_t *)8, .x = (const void *)8,
					    .ldx = 16, .w = (const void *)8, .y = (void *)8,
					    .ldy = 16};
	for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
		T_ASSERT(lowrank_bf_case(&cs[i]) == 0);
	/* a rank not a multiple of 8, a width not a multiple of 8, an odd
	 * stride, a misaligned pointer */
	T_ASSERT_EQ_INT(ms_ggemm_lowrank_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.R = 16, bad.D = 12;
	T_ASSERT_EQ_INT(ms_ggemm_lowrank_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.D = 16, bad.ldx = 17;
	T_ASSERT_EQ_INT(ms_ggemm_lowrank_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.ldx = 16, bad.y = (void *)10;
	T_ASSERT_EQ_INT(ms_ggemm_lowrank_bf16(&bad, NULL, &err), MS_EINVAL);
	bad.y = (void *)8, bad.rows = 0;
	T_ASSERT_EQ_INT(ms_ggemm_lowrank_bf16(&bad, NULL, &err), MS_OK);
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
		/* NVFP4 B: K a multiple of 32, the layout's strides */
		bad = ok, bad.bq = (const struct ms_ggemm_nvfp4 *)p, bad.K = 40, bad.lda = 40,
		bad.ldb = 40;
		T_ASSERT_EQ_INT(ms_ggemm_run(&bad, NULL, &err), MS_EINVAL);
		T_ASSERT(strstr(err.msg, "multiple of 32"));
		{
			struct ms_ggemm_nvfp4 q = {
				.part = {{.codes = p, .scales = p, .code_stride = 32,
					  .scale_stride = 4, .tscale = 1}},
				.split = 64,
			}, qb;
			T_ASSERT_EQ_INT(ms_ggemm_nvfp4_check(&q, 64, 64, &err), MS_OK);
			T_ASSERT_EQ_INT(ms_ggemm_nvfp4_check(&q, 64, 48, &err), MS_EINVAL);
			T_ASSERT_EQ_INT(ms_ggemm_nvfp4_check(&q, 60, 64, &err), MS_EINVAL);
			qb = q, qb.part[0].code_stride = 24;
			T_ASSERT_EQ_INT(ms_ggemm_nvfp4_check(&qb, 64, 64, &err), MS_EINVAL);
			qb = q, qb.part[0].scale_stride = 3;
			T_ASSERT_EQ_INT(ms_ggemm_nvfp4_check(&qb, 64, 64, &err), MS_EINVAL);
			qb = q, qb.part[0].codes = (const uint8_t *)p + 8;
			T_ASSERT_EQ_INT(ms_ggemm_nvfp4_check(&qb, 64, 64, &err), MS_EINVAL);
			/* a second part where the split leaves one: it is checked */
			qb = q, qb.split = 32;
			T_ASSERT_EQ_INT(ms_ggemm_nvfp4_check(&qb, 64, 64, &err), MS_EINVAL);
			qb.part[1] = q.part[0];
			T_ASSERT_EQ_INT(ms_ggemm_nvfp4_check(&qb, 64, 64, &err), MS_OK);
			qb.along_k = 1, qb.split = 48;
			T_ASSERT_EQ_INT(ms_ggemm_nvfp4_check(&qb, 64, 64, &err), MS_EINVAL);
			T_ASSERT(strstr(err.msg, "split"));
		}
		T_ASSERT_EQ_INT(ms_ggemm_index(d, 0, d, d, NULL, &err), MS_EINVAL);
		T_ASSERT_EQ_INT(ms_ggemm_index(d, MS_GGEMM_MAX_E + 1, d, d, NULL, &err),
				MS_EINVAL);
	}
	ms_gpu_free(p);
	return 0;
}

/* ---- --bench ------------------------------------------------------------------------- */

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

/* what a timed run does */
enum side { S_GROUPED, S_LOOP, S_DECODE, S_LOWRANK, S_WGRAD, S_WGRAD_BF };

/* the NVFP4 bytes of every expert stacked ([E N, K]: one tensor, as the
 * decoder takes it) and where they decode to */
struct q4set {
	const uint8_t *codes, *scales;
	uint64_t rows;
	void *out;
};

/* one timed run of one side: the grouped GEMM (p, its shape and B), the
 * per-expert loop over bf16 B, or the decode of q */
struct gg_run {
	enum side side;
	const struct ms_ggemm *p;
	const struct ms_ggemm_lowrank *lr;
	const struct ms_ggemm_wgrad *wg;
	cublasHandle_t h;
	const uint32_t *cnt;
	void *const *B;
	const struct q4set *q;
	const struct ms_ggemm_wgrad_bf16 *wb;
};

static int gg_once(void *ctx)
{
	const struct gg_run *r = ctx;
	const struct ms_ggemm *p = r->p;
	struct ms_err err = {0};
	if (r->side == S_LOOP) {
		if (loop_run(r->h, r->cnt, p->E, p->N, p->K, p->a, r->B, p->c)) {
			fprintf(stderr, "bench: cublasGemmEx failed\n");
			return -1;
		}
		return 0;
	}
	if (r->side == S_LOWRANK || r->side == S_WGRAD || r->side == S_WGRAD_BF) {
		if (r->side == S_LOWRANK  ? ms_ggemm_lowrank(r->lr, NULL, &err)
		    : r->side == S_WGRAD ? ms_ggemm_wgrad(r->wg, NULL, &err)
					 : ms_ggemm_wgrad_bf16(r->wb, NULL, &err)) {
			fprintf(stderr, "bench: %s\n", err.msg);
			return -1;
		}
		return 0;
	}
	if (r->side == S_DECODE ? ms_gpu_nvfp4_dequantize(r->q->codes, r->q->scales, r->q->rows,
							   p->K, 0.02f, MS_NVFP4_TSCALE_MUL,
							   MS_DTYPE_BF16, r->q->out, &err)
				: ms_ggemm_run(p, NULL, &err)) {
		fprintf(stderr, "bench: %s\n", err.msg);
		return -1;
	}
	return 0;
}

static float bench_side(enum side side, const struct ms_ggemm *p, cublasHandle_t h,
			const uint32_t *cnt, void *const *B, const struct q4set *q,
			cudaEvent_t *ev)
{
	struct gg_run r = {side, p, NULL, NULL, h, cnt, B, q, NULL};
	return t_bench(gg_once, &r, ev);
}

static const char *shape_name(int cfg)
{
	return cfg == MS_GGEMM_WIDE ? "wide" : "narrow";
}

/* one product at the bench shape: the loop and both shapes over bf16 B,
 * then B in NVFP4: decoded into the bf16 B and the grouped GEMM, against
 * both shapes decoding inside */
static int bench_product(struct ms_ggemm *p, const char *what, cublasHandle_t hb,
			 const uint32_t *cnt, void **bp, void *gb, const uint8_t *gq,
			 struct ms_ggemm_nvfp4 *qd, void *gbq, cudaEvent_t *ev,
			 struct ms_err *err)
{
	uint64_t rows = p->rows, nk = (uint64_t)p->N * p->K;
	struct q4set q = {gq, gq + p->E * nk / 2, (uint64_t)p->E * p->N, gb};
	double flop = 2.0 * rows * p->N * p->K;
	float t[2][2], tl, td;
#define TF(ms) (flop / ((ms) * 1e-3) / 1e12)
	for (uint32_t e = 0; e < p->E; e++) {
		bp[e] = (char *)gb + e * nk * 2;
		memset(&qd[e], 0, sizeof qd[e]);
		qd[e].part[0].codes = q.codes + e * nk / 2;
		qd[e].part[0].scales = q.scales + e * nk / 16;
		qd[e].part[0].code_stride = p->K / 2;
		qd[e].part[0].scale_stride = p->K / 16;
		qd[e].part[0].tscale = 0.02f;
		qd[e].split = p->N;
		if (ms_ggemm_nvfp4_check(&qd[e], p->N, p->K, err))
			return -1;
	}
	if (ms_gpu_memcpy((void *)p->b, bp, p->E * sizeof(void *), err) ||
	    ms_gpu_memcpy(gbq, qd, p->E * sizeof *qd, err))
		return -1;
	p->bq = NULL;
	if ((tl = bench_side(S_LOOP, p, hb, cnt, bp, &q, ev)) < 0 ||
	    (td = bench_side(S_DECODE, p, hb, cnt, bp, &q, ev)) < 0)
		return -1;
	printf("bench %s (64 experts, %llu rows, N %u, K %u): cuBLAS per expert %.3f ms "
	       "%.1f TFLOP/s\n", what, (unsigned long long)rows, p->N, p->K, tl, TF(tl));
	for (int f = 0; f < 2; f++)
		for (p->cfg = MS_GGEMM_NARROW; p->cfg <= MS_GGEMM_WIDE; p->cfg++) {
			p->bq = f ? gbq : NULL;
			if ((t[f][p->cfg] = bench_side(S_GROUPED, p, hb, cnt, bp, &q, ev)) < 0)
				return -1;
		}
	for (int c = MS_GGEMM_NARROW; c <= MS_GGEMM_WIDE; c++)
		printf("bench %s: grouped %s, bf16 B: %.3f ms %.1f TFLOP/s, %.2fx the loop\n",
		       what, shape_name(c), t[0][c], TF(t[0][c]), tl / t[0][c]);
	for (int c = MS_GGEMM_NARROW; c <= MS_GGEMM_WIDE; c++)
		printf("bench %s: NVFP4 B, grouped %s: decoded first (the library's GPU decoder, "
		       "%.3f ms) %.3f ms, decoded inside %.3f ms %.1f TFLOP/s: inside / first "
		       "%.2f\n", what, shape_name(c), td, td + t[0][c], t[1][c], TF(t[1][c]),
		       t[1][c] / (td + t[0][c]));
#undef TF
	return 0;
}

/* The expert LoRA's kernels at the bench shape (rank 16 over the same
 * rows): each product's time and the bandwidth of its wide side (read,
 * or read and written), the bound these kernels are meant to meet. */
static int bench_lora(const uint32_t *goff, const uint32_t *gt, uint64_t rows, uint32_t E,
		      float *wide, float *narrow, float *w, float *g, cudaEvent_t *ev)
{
	const uint32_t R = 16;
	static const struct { uint32_t D; int up, wt; const char *what; } lr[] = {
		{2048, 0, 0, "U = X A^T (in 2048)"},
		{1536, 0, 1, "dU = s dY B (out 1536)"},
		{2048, 1, 0, "Y += s U B^T (out 2048)"},
		{2048, 1, 1, "dX += dU A (in 2048)"},
	};
	for (size_t i = 0; i < sizeof lr / sizeof *lr; i++) {
		struct ms_ggemm_lowrank p = {
			.E = E, .R = R, .D = lr[i].D, .up = lr[i].up, .rows = rows, .off = goff,
			.tiles = gt, .x = lr[i].up ? narrow : wide, .ldx = lr[i].up ? R : lr[i].D,
			.w = w, .wstride = (uint64_t)R * lr[i].D, .wt = lr[i].wt,
			.y = lr[i].up ? wide : narrow, .ldy = lr[i].up ? lr[i].D : R, .alpha = 1.0f,
			.accumulate = lr[i].up,
		};
		struct gg_run r = {S_LOWRANK, NULL, &p, NULL, NULL, NULL, NULL, NULL, NULL};
		double bytes = (double)rows * lr[i].D * 4 * (lr[i].up ? 2 : 1);
		float t = t_bench(gg_once, &r, ev);
		if (t < 0)
			return -1;
		printf("bench LoRA %s: %.3f ms, %.0f GB/s of its wide side\n", lr[i].what, t,
		       bytes / (t * 1e-3) / 1e9);
	}
	for (int tr = 0; tr < 2; tr++) {
		uint32_t N = tr ? 1536 : 2048;
		struct ms_ggemm_wgrad p = {
			.E = E, .R = R, .N = N, .off = goff, .u = narrow, .ldu = R, .x = wide, .ldx = N,
			.g = g, .gstride = (uint64_t)R * N, .trans = tr, .alpha = 1.0f, .accumulate = 1,
		};
		struct gg_run r = {S_WGRAD, NULL, NULL, &p, NULL, NULL, NULL, NULL, NULL};
		float t = t_bench(gg_once, &r, ev);
		if (t < 0)
			return -1;
		printf("bench LoRA %s: %.3f ms, %.0f GB/s of X\n",
		       tr ? "gB = s dY^T U (out 1536)" : "gA = dU^T X (in 2048)", t,
		       (double)rows * N * 4 / (t * 1e-3) / 1e9);
	}
	/* the same sums with bf16 operands on the tensor cores (the folded
	 * expert LoRA's) */
	for (int tr = 0; tr < 2; tr++) {
		uint32_t N = tr ? 1536 : 2048;
		struct ms_ggemm_wgrad_bf16 p = {
			.E = E, .R = R, .N = N, .off = goff, .u = narrow, .ldu = R, .x = wide, .ldx = N,
			.g = g, .gstride = (uint64_t)R * N, .trans = tr, .alpha = 1.0f, .accumulate = 1,
		};
		struct gg_run r = {S_WGRAD_BF, NULL, NULL, NULL, NULL, NULL, NULL, NULL, &p};
		float t = t_bench(gg_once, &r, ev);
		if (t < 0)
			return -1;
		printf("bench LoRA %s, bf16 tensor cores: %.3f ms, %.0f GB/s of X\n",
		       tr ? "gB = s dY^T U (out 1536)" : "gA = dU^T X (in 2048)", t,
		       (double)rows * N * 2 / (t * 1e-3) / 1e9);
	}
	/* and as the trainer's folded layer calls them (fold_wgrad): split in
	 * MS_GMODEL_WGRAD_SPLIT (4) runs, X the bf16 twin of its GEMM (U's
	 * columns in its tail, row stride N + 16) or, for gate/up's gA, the
	 * token-major input through the rows' permutation */
	{
		static const struct { uint32_t N, ldx, ldu; int trans, perm; const char *what; } tw[] = {
			{1536, 1552, 16, 1, 0, "gB gate/up (dY twin [rows, 1552])"},
			{2048, 2048, 1552, 0, 1, "gA gate/up (X through the permutation)"},
			{2048, 2064, 16, 1, 0, "gB down (dY twin [rows, 2064])"},
			{768, 768, 2064, 0, 0, "gA down (X [rows, 768])"},
		};
		uint16_t *xb = (uint16_t *)wide;
		int32_t *hp = malloc(rows * sizeof *hp), *dp = NULL;
		float *part = g + (uint64_t)E * 16 * 2048;
		struct ms_err err = {0};
		if (!hp || ms_gpu_malloc((void **)&dp, rows * sizeof *dp, &err)) {
			free(hp);
			fprintf(stderr, "bench: %s\n", err.msg[0] ? err.msg : "out of memory");
			return -1;
		}
		/* a random permutation of the rows (each token's k-th pick) */
		for (uint64_t i = 0; i < rows; i++)
			hp[i] = (int32_t)i;
		for (uint64_t i = rows - 1; i > 0; i--) {
			uint64_t j = rnd() % (i + 1);
			int32_t t = hp[i];
			hp[i] = hp[j];
			hp[j] = t;
		}
		if (ms_gpu_memcpy(dp, hp, rows * sizeof *dp, &err)) {
			free(hp);
			ms_gpu_free(dp);
			fprintf(stderr, "bench: %s\n", err.msg);
			return -1;
		}
		free(hp);
		for (size_t i = 0; i < sizeof tw / sizeof *tw; i++) {
			struct ms_ggemm_wgrad_bf16 p = {
				.E = E, .R = 16, .N = tw[i].N, .off = goff,
				.u = tw[i].ldu == 16 ? (const void *)narrow : (const void *)(xb + tw[i].N),
				.ldu = tw[i].ldu, .x = xb, .ldx = tw[i].ldx, .g = g,
				.gstride = (uint64_t)16 * tw[i].N, .trans = tw[i].trans, .alpha = 1.0f,
				.accumulate = 1, .xperm = tw[i].perm ? dp : NULL, .xdiv = 8,
				.nsplit = 4, .part = part,
			};
			struct gg_run r = {S_WGRAD_BF, NULL, NULL, NULL, NULL, NULL, NULL, NULL, &p};
			float t = t_bench(gg_once, &r, ev);
			/* bytes: X's rows (each token row once for the permuted
			 * X, which sits in L2 for the rest) and U's */
			double xb_ = tw[i].perm ? (double)rows / 8 * tw[i].N * 2
						: (double)rows * tw[i].N * 2;
			if (t < 0) {
				ms_gpu_free(dp);
				return -1;
			}
			printf("bench LoRA %s, as the trainer calls it: %.3f ms, %.0f GB/s\n",
			       tw[i].what, t, (xb_ + (double)rows * 32) / (t * 1e-3) / 1e9);
		}
		ms_gpu_free(dp);
	}
	return 0;
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
	uint64_t rows = (uint64_t)T * TOPK, maxnk = 2048 * 2048;
	void *ga = NULL, *gb = NULL, *gc = NULL, *gcnt = NULL, *goff = NULL, *gt = NULL, *gbp = NULL;
	void *gq = NULL, *gbq = NULL;
	void *bp[64];
	struct ms_ggemm_nvfp4 qd[64];
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
	/* top-8 of 64 per token, skewed: expert e drawn with weight 16 + e */
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
	/* A: random bf16 rows; the NVFP4 bytes: random codes, scales of
	 * e4m3 values between 2^-2 and 7.5 (the same bytes serve every
	 * product's shape) */
	if (!(h = malloc(maxnk * E * 2)) || ms_gpu_malloc(&ga, rows * 2048 * 2, &err) ||
	    ms_gpu_malloc(&gb, maxnk * E * 2, &err) || ms_gpu_malloc(&gc, rows * 2048 * 4, &err) ||
	    ms_gpu_malloc(&gcnt, E * 4, &err) || ms_gpu_malloc(&goff, (E + 1) * 4, &err) ||
	    ms_gpu_malloc(&gt, (E + 1) * 4, &err) || ms_gpu_malloc(&gbp, E * sizeof(void *), &err) ||
	    ms_gpu_malloc(&gq, maxnk * E / 2 + maxnk * E / 16, &err) ||
	    ms_gpu_malloc(&gbq, E * sizeof *qd, &err))
		goto fail;
	for (uint64_t i = 0; i < rows * 2048; i++)
		h[i] = to_bf16((float)gauss());
	if (ms_gpu_memcpy(ga, h, rows * 2048 * 2, &err))
		goto fail;
	for (uint64_t i = 0; i < maxnk * E / 2; i++)
		((uint8_t *)h)[i] = (uint8_t)rnd();
	for (uint64_t i = 0; i < maxnk * E / 16; i++)
		((uint8_t *)h)[maxnk * E / 2 + i] = (uint8_t)(0x28 + rnd() % 0x28);
	if (ms_gpu_memcpy(gq, h, maxnk * E / 2 + maxnk * E / 16, &err) ||
	    ms_gpu_memcpy(gcnt, cnt, E * 4, &err) ||
	    ms_ggemm_index(gcnt, E, goff, gt, NULL, &err))
		goto fail;
	for (size_t i = 0; i < sizeof pr / sizeof *pr; i++) {
		struct ms_ggemm p = {
			.E = E, .N = pr[i].N, .K = pr[i].K, .rows = rows, .off = goff, .tiles = gt,
			.a = ga, .lda = pr[i].K, .b = (const void *const *)gbp, .ldb = pr[i].K,
			.c = gc, .ldc = pr[i].N,
		};
		/* the bf16 B: the decoder's output of the NVFP4 bytes */
		struct q4set q = {gq, (const uint8_t *)gq + (uint64_t)E * pr[i].N * pr[i].K / 2,
				  (uint64_t)E * pr[i].N, gb};
		if (bench_side(S_DECODE, &p, hb, cnt, bp, &q, ev) < 0 ||
		    bench_product(&p, pr[i].what, hb, cnt, bp, gb, gq, qd, gbq, ev, &err))
			goto fail;
	}
	/* the LoRA kernels over buffers the products are done with: the
	 * wide side in gc, the rank side, the factors and their gradients in
	 * gb */
	if (bench_lora(goff, gt, rows, E, gc, (float *)gb, (float *)gb + rows * 16,
		       (float *)gb + rows * 16 + (uint64_t)E * 16 * 2048, ev))
		goto fail;
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
	ms_gpu_free(gq);
	ms_gpu_free(gbq);
	return rc;
}

static const struct t_case cases[] = {
	T_CASE(test_ggemm_shapes),
	T_CASE(test_ggemm_refuses),
	T_CASE(test_ggemm_wgrad),
	T_CASE(test_ggemm_wgrad_bf16),
	T_CASE(test_ggemm_lowrank),
	T_CASE(test_ggemm_lowrank_bf16),
};
#endif

T_GPU_MAIN_BENCH(cases, bench)
