/*
 * t_lowrank_gpu.c: the dense LoRA's low-rank products (kernels/lowrank.h)
 * against a host reference in double from the same float32 inputs.
 *
 * Cases: rows 1, 31, 33, 130 and 1000 (a warp's four rows, a block's 32,
 * tails of both); K and N of 4 through 2060 (tails of the 256-wide chunk
 * of W and of a block's 512 columns); ranks 1, 3, 16; W and V read both
 * ways (a LoRA's A and B through the strides); up written (beta 0, over a
 * NaN output) and accumulated (beta 1); wgrad with room for one run of
 * partial sums and for many, into both layouts of G. Every output is
 * checked, and what lies past the output (a sentinel) must survive. Each
 * case runs twice and must be bit-identical. Refused: a rank past the
 * bound, N not a multiple of 4, a misaligned row, no room for partials.
 *
 * Tolerance, per element: |gpu - ref| <= (terms + 2) 2^-23 mag + 1e-30,
 * mag the sum of |products| (and of the kept output): float32
 * accumulation over the terms, the partial sums' adds, alpha and beta.
 *
 * GPU tier: without a GPU the binary says it skipped.
 */
#include <math.h>

#include "test_gpu.h"
#ifdef MS_HAVE_CUDA
#include <cuda_runtime.h>

#include "lowrank.h"

#include "test_rng.h"

#define SENTINEL 12345.0f

static float *dev_of(const float *h, uint64_t n, struct ms_err *err)
{
	void *d = NULL;
	if (ms_gpu_malloc(&d, (n ? n : 1) * 4, err) || (n && ms_gpu_memcpy(d, h, n * 4, err))) {
		ms_gpu_free(d);
		return NULL;
	}
	return (float *)d;
}

static int back(float *h, const float *d, uint64_t n)
{
	return cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

static float *randf(uint64_t n)
{
	float *p = (float *)malloc((n ? n : 1) * 4);
	for (uint64_t i = 0; p && i < n; i++)
		p[i] = (float)gauss();
	return p;
}

static int close_to(double got, double want, double mag, uint64_t terms, const char *what,
		    uint64_t i, uint64_t j)
{
	if (fabs(got - want) <= (double)(terms + 2) * 0x1p-23 * mag + 1e-30)
		return 1;
	fprintf(stderr, "%s: (%llu, %llu): gpu %.9g ref %.9g mag %.3g\n", what,
		(unsigned long long)i, (unsigned long long)j, got, want, mag);
	return 0;
}

/* down: U [n, r] = 0.5 X [n, K] W, W as A [r, K] (tw 0) or B [K, r] (1);
 * U poisoned with NaN, a sentinel row after it */
static int down_case(uint64_t n, uint32_t K, uint32_t r, int tw)
{
	struct ms_err err = {0};
	int rc = -1;
	uint64_t wk = tw ? r : 1, wj = tw ? 1 : K;
	float *x = randf(n * K), *w = randf((uint64_t)K * r);
	float *u = (float *)malloc((n + 1) * r * 4), *u2 = (float *)malloc((n + 1) * r * 4);
	float *dx = NULL, *dw = NULL, *du = NULL;
	for (uint64_t i = 0; u && i < (n + 1) * r; i++)
		u[i] = i < n * r ? NAN : SENTINEL;
	if (!x || !w || !u || !u2 || !(dx = dev_of(x, n * K, &err)) ||
	    !(dw = dev_of(w, (uint64_t)K * r, &err)) || !(du = dev_of(u, (n + 1) * r, &err)))
		goto out;
	for (int run = 0; run < 2; run++) {
		if (ms_lr_down(dx, n, K, dw, wk, wj, r, 0.5f, du, NULL, &err) || ms_gpu_sync(&err) ||
		    back(run ? u2 : u, du, (n + 1) * r))
			goto out;
	}
	if (memcmp(u, u2, (n + 1) * r * 4)) {
		fprintf(stderr, "down: two runs differ\n");
		goto out;
	}
	for (uint64_t i = 0; i < n; i++)
		for (uint32_t j = 0; j < r; j++) {
			double s = 0, m = 0;
			for (uint32_t k = 0; k < K; k++) {
				double t = (double)x[i * K + k] * w[k * wk + j * wj];
				s += t;
				m += fabs(t);
			}
			if (!close_to(u[i * r + j], 0.5 * s, 0.5 * m, K, "down", i, j))
				goto out;
		}
	for (uint32_t j = 0; j < r; j++)
		if (u[n * r + j] != SENTINEL) {
			fprintf(stderr, "down: the row past U was written\n");
			goto out;
		}
	rc = 0;
out:
	if (rc && err.msg[0])
		fprintf(stderr, "down: %s\n", err.msg);
	free(x), free(w), free(u), free(u2);
	ms_gpu_free(dx), ms_gpu_free(dw), ms_gpu_free(du);
	return rc;
}

/* up: Y [n, N] = beta Y + 0.25 U [n, r] V^T, V as B [N, r] (tv 0) or A
 * [r, N] (1); beta 0 over NaN, or 1 over random values */
static int up_case(uint64_t n, uint32_t N, uint32_t r, int tv, float beta)
{
	struct ms_err err = {0};
	int rc = -1;
	uint64_t vj = tv ? 1 : r, vq = tv ? N : 1, ny = (n + 1) * N;
	float *u = randf(n * r), *v = randf((uint64_t)N * r), *y0 = randf(ny);
	float *y = (float *)malloc(ny * 4), *y2 = (float *)malloc(ny * 4);
	float *du = NULL, *dv = NULL, *dy = NULL;
	for (uint64_t i = 0; y0 && i < ny; i++)
		y0[i] = i >= n * N ? SENTINEL : beta == 0 ? NAN : y0[i];
	if (!u || !v || !y0 || !y || !y2 || !(du = dev_of(u, n * r, &err)) ||
	    !(dv = dev_of(v, (uint64_t)N * r, &err)))
		goto out;
	for (int run = 0; run < 2; run++) {
		ms_gpu_free(dy);
		if (!(dy = dev_of(y0, ny, &err)) ||
		    ms_lr_up(du, n, r, dv, vj, vq, 0.25f, beta, dy, N, NULL, &err) ||
		    ms_gpu_sync(&err) || back(run ? y2 : y, dy, ny))
			goto out;
	}
	if (memcmp(y, y2, ny * 4)) {
		fprintf(stderr, "up: two runs differ\n");
		goto out;
	}
	for (uint64_t i = 0; i < n; i++)
		for (uint32_t j = 0; j < N; j++) {
			double s = 0, m = 0, keep = beta != 0 ? y0[i * N + j] : 0;
			for (uint32_t q = 0; q < r; q++) {
				double t = (double)u[i * r + q] * v[j * vj + q * vq];
				s += t;
				m += fabs(t);
			}
			if (!close_to(y[i * N + j], keep + 0.25 * s, fabs(keep) + 0.25 * m, r, "up",
				      i, j))
				goto out;
		}
	for (uint32_t j = 0; j < N; j++)
		if (y[n * N + j] != SENTINEL) {
			fprintf(stderr, "up: the row past Y was written\n");
			goto out;
		}
	rc = 0;
out:
	if (rc && err.msg[0])
		fprintf(stderr, "up: %s\n", err.msg);
	free(u), free(v), free(y0), free(y), free(y2);
	ms_gpu_free(du), ms_gpu_free(dv), ms_gpu_free(dy);
	return rc;
}

/* wgrad: G (j, q) = G + 2 sum_i D [i, j] U [i, q], G as gB [N, r] (tg 0)
 * or gA [r, N] (1); npart floats of partial sums */
static int wgrad_case(uint64_t n, uint32_t N, uint32_t r, int tg, uint64_t npart)
{
	struct ms_err err = {0};
	int rc = -1;
	uint64_t gj = tg ? 1 : r, gq = tg ? N : 1, ng = (uint64_t)N * r;
	float *d = randf(n * N), *u = randf(n * r), *g0 = randf(ng + 1);
	float *g = (float *)malloc((ng + 1) * 4), *g2 = (float *)malloc((ng + 1) * 4);
	float *dd = NULL, *du = NULL, *dg = NULL, *dp = NULL;
	if (g0)
		g0[ng] = SENTINEL;
	if (!d || !u || !g0 || !g || !g2 || !(dd = dev_of(d, n * N, &err)) ||
	    !(du = dev_of(u, n * r, &err)) || ms_gpu_malloc((void **)&dp, npart * 4, &err))
		goto out;
	for (int run = 0; run < 2; run++) {
		ms_gpu_free(dg);
		if (!(dg = dev_of(g0, ng + 1, &err)) ||
		    ms_lr_wgrad(dd, n, N, du, r, 2.0f, 1.0f, dg, gj, gq, dp, npart, NULL, &err) ||
		    ms_gpu_sync(&err) || back(run ? g2 : g, dg, ng + 1))
			goto out;
	}
	if (memcmp(g, g2, (ng + 1) * 4)) {
		fprintf(stderr, "wgrad: two runs differ\n");
		goto out;
	}
	for (uint32_t j = 0; j < N; j++)
		for (uint32_t q = 0; q < r; q++) {
			double s = 0, m = 0, keep = g0[j * gj + q * gq];
			for (uint64_t i = 0; i < n; i++) {
				double t = (double)d[i * N + j] * u[i * r + q];
				s += t;
				m += fabs(t);
			}
			/* n terms, the runs' 64 adds at most */
			if (!close_to(g[j * gj + q * gq], keep + 2 * s, fabs(keep) + 2 * m, n + 64,
				      "wgrad", j, q))
				goto out;
		}
	if (g[ng] != SENTINEL) {
		fprintf(stderr, "wgrad: past G was written\n");
		goto out;
	}
	rc = 0;
out:
	if (rc && err.msg[0])
		fprintf(stderr, "wgrad: %s\n", err.msg);
	free(d), free(u), free(g0), free(g), free(g2);
	ms_gpu_free(dd), ms_gpu_free(du), ms_gpu_free(dg), ms_gpu_free(dp);
	return rc;
}

static int test_lr_down(void)
{
	static const uint64_t ns[] = {1, 31, 33, 130};
	for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
		T_ASSERT(down_case(ns[i], 4, 1, 0) == 0);
		T_ASSERT(down_case(ns[i], 260, 3, 1) == 0);
		T_ASSERT(down_case(ns[i], 513, 16, 0) == 0);
		T_ASSERT(down_case(ns[i], 48, 3, 0) == 0);
	}
	T_ASSERT(down_case(1000, 2048, 16, 1) == 0);
	return 0;
}

static int test_lr_up(void)
{
	static const uint64_t ns[] = {1, 31, 33, 130};
	for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
		T_ASSERT(up_case(ns[i], 4, 1, 0, 0.0f) == 0);
		T_ASSERT(up_case(ns[i], 516, 3, 1, 1.0f) == 0);
		T_ASSERT(up_case(ns[i], 1028, 16, 0, 1.0f) == 0);
		T_ASSERT(up_case(ns[i], 48, 3, 0, 1.0f) == 0);
	}
	T_ASSERT(up_case(1000, 2048, 16, 1, 0.0f) == 0);
	return 0;
}

static int test_lr_wgrad(void)
{
	T_ASSERT(wgrad_case(1, 4, 1, 0, 4 * MS_LR_MAX_R) == 0);
	T_ASSERT(wgrad_case(31, 516, 3, 1, 516 * MS_LR_MAX_R) == 0);
	T_ASSERT(wgrad_case(130, 516, 16, 0, 1u << 20) == 0);
	T_ASSERT(wgrad_case(1000, 2060, 16, 1, 1u << 22) == 0);
	T_ASSERT(wgrad_case(1000, 64, 7, 0, 5 * 64 * MS_LR_MAX_R) == 0);
	return 0;
}

static int test_lr_refuses(void)
{
	struct ms_err err = {0};
	float *p = (float *)(uintptr_t)64, *odd = (float *)(uintptr_t)68;
	T_ASSERT_EQ_INT(ms_lr_down(p, 1, 4, p, 1, 4, MS_LR_MAX_R + 1, 1, p, NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_lr_up(p, 1, 4, p, 1, 4, 1, 0, p, 6, NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_lr_up(p, 1, 4, p, 1, 4, 1, 0, odd, 8, NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_lr_wgrad(odd, 1, 8, p, 4, 1, 1, p, 4, 1, p, 1024, NULL, &err),
			MS_EINVAL);
	T_ASSERT_EQ_INT(ms_lr_wgrad(p, 1, 8, p, 4, 1, 1, p, 4, 1, p, 8, NULL, &err), MS_EINVAL);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_lr_down),
	T_CASE(test_lr_up),
	T_CASE(test_lr_wgrad),
	T_CASE(test_lr_refuses),
};

T_GPU_MAIN(cases)
#else
int main(void)
{
	return t_gpu_skip(__FILE__);
}
#endif
