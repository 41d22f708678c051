/*
 * t_router_gpu.c: the router's float32 logits (kernels/router.h) against a
 * host reference in double from the same inputs.
 *
 * Cases: tokens 1, 31, 33 and 300 (a block's 32 rows and tails), experts
 * 1, 6, 64 and 65 (a block's 64 and a tail), H 32, 96 and 2048 (one step,
 * several); H 128 and 384 (the kernel for H a multiple of 128, one step
 * and three) with tokens 1, 33 and 300 and experts 1 and 65. The output
 * is poisoned with NaN and a sentinel row follows it (which must
 * survive); each case runs twice and must be bit-identical.
 * Refused: H not a multiple of 32, a misaligned row, a NULL pointer.
 * The input gradient (ms_router_dgrad) likewise: tokens 1 .. 70, experts
 * 1, 6, 33 and 64 (steps of 32 and tails), H 4, 132 and 2048 (a block's
 * 128 columns and tails); tokens 260 and 300 with experts 64, 128 and
 * 129; refused: H not a multiple of 4, a misaligned W
 * or dh, a NULL pointer.
 *
 * Tolerance, per logit: |gpu - ref| <= (H + 2) 2^-23 mag + 1e-30, mag the
 * sum of |h w| over H (float32 accumulation of H products); and the bits
 * of the host's chain of float32 FMAs over H in order (router.h's
 * order; the input gradient's over E).
 *
 * GPU tier: without a GPU the binary says it skipped.
 */
#include <math.h>

#include "test_gpu.h"
#ifdef MS_HAVE_CUDA
#include <cuda_runtime.h>

#include "router.h"

#define SENTINEL 12345.0f

#include "test_rng.h"

static int logits_case(uint32_t T, uint32_t E, uint32_t H)
{
	struct ms_err err = {0};
	int rc = -1;
	uint64_t nz = ((uint64_t)T + 1) * E;
	float *h = malloc((uint64_t)T * H * 4), *w = malloc((uint64_t)E * H * 4);
	float *z = malloc(nz * 4), *z2 = malloc(nz * 4);
	void *dh = NULL, *dw = NULL, *dz = NULL;
	if (!h || !w || !z || !z2)
		goto out;
	for (uint64_t i = 0; i < (uint64_t)T * H; i++)
		h[i] = (float)gauss();
	for (uint64_t i = 0; i < (uint64_t)E * H; i++)
		w[i] = (float)gauss();
	for (uint64_t i = 0; i < nz; i++)
		z[i] = i < (uint64_t)T * E ? NAN : SENTINEL;
	if (ms_gpu_malloc(&dh, (uint64_t)T * H * 4, &err) ||
	    ms_gpu_malloc(&dw, (uint64_t)E * H * 4, &err) || ms_gpu_malloc(&dz, nz * 4, &err) ||
	    ms_gpu_memcpy(dh, h, (uint64_t)T * H * 4, &err) ||
	    ms_gpu_memcpy(dw, w, (uint64_t)E * H * 4, &err))
		goto out;
	for (int run = 0; run < 2; run++)
		if (ms_gpu_memcpy(dz, z, nz * 4, &err) ||
		    ms_router_logits(dh, dw, dz, T, E, H, NULL, &err) || ms_gpu_sync(&err) ||
		    cudaMemcpy(run ? z2 : z, dz, nz * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
			goto out;
	if (memcmp(z, z2, nz * 4)) {
		fprintf(stderr, "router T %u E %u H %u: two runs differ\n", T, E, H);
		goto out;
	}
	for (uint32_t t = 0; t < T; t++)
		for (uint32_t e = 0; e < E; e++) {
			double s = 0, m = 0, g = z[(uint64_t)t * E + e];
			float c = 0;
			for (uint32_t k = 0; k < H; k++) {
				double p = (double)h[(uint64_t)t * H + k] * w[(uint64_t)e * H + k];
				s += p;
				m += fabs(p);
				c = fmaf(h[(uint64_t)t * H + k], w[(uint64_t)e * H + k], c);
			}
			/* router.h's order: one chain of float32 FMAs over H */
			if (memcmp(&c, &z[(uint64_t)t * E + e], 4)) {
				fprintf(stderr, "router T %u E %u H %u: (%u, %u): gpu %.9g, the FMA chain "
					"over H in order %.9g\n", T, E, H, t, e, g, c);
				goto out;
			}
			if (!(fabs(g - s) <= (H + 2) * 0x1p-23 * m + 1e-30)) {
				fprintf(stderr, "router T %u E %u H %u: (%u, %u): gpu %.9g ref %.9g\n", T,
					E, H, t, e, g, s);
				goto out;
			}
		}
	for (uint32_t e = 0; e < E; e++)
		if (z[(uint64_t)T * E + e] != SENTINEL) {
			fprintf(stderr, "router: the row past z was written\n");
			goto out;
		}
	rc = 0;
out:
	if (rc && err.msg[0])
		fprintf(stderr, "router: %s\n", err.msg);
	free(h), free(w), free(z), free(z2);
	ms_gpu_free(dh), ms_gpu_free(dw), ms_gpu_free(dz);
	return rc;
}

static int test_router_logits(void)
{
	static const uint32_t ts[] = {1, 31, 33, 300}, es[] = {1, 6, 64, 65};
	for (size_t i = 0; i < 4; i++)
		for (size_t j = 0; j < 4; j++)
			T_ASSERT(logits_case(ts[i], es[j], i % 2 ? 96 : 32) == 0);
	T_ASSERT(logits_case(130, 64, 2048) == 0);
	/* H a multiple of 128: the ring kernel, one step and three, with the
	 * token and expert tails */
	static const uint32_t tr[] = {1, 33, 300}, er[] = {1, 65};
	for (size_t i = 0; i < 3; i++)
		for (size_t j = 0; j < 2; j++)
			T_ASSERT(logits_case(tr[i], er[j], i == 1 ? 128 : 384) == 0);
	return 0;
}

/* dh [T, H] = dz [T, E] W [E, H]: the same poisoning, sentinel row and
 * bit-identical rerun; tolerance (E + 2) 2^-23 mag + 1e-30 */
static int dgrad_case(uint32_t T, uint32_t E, uint32_t H)
{
	struct ms_err err = {0};
	int rc = -1;
	uint64_t nh = ((uint64_t)T + 1) * H;
	float *dz = malloc((uint64_t)T * E * 4), *w = malloc((uint64_t)E * H * 4);
	float *dh = malloc(nh * 4), *dh2 = malloc(nh * 4);
	void *ddz = NULL, *dw = NULL, *ddh = NULL;
	if (!dz || !w || !dh || !dh2)
		goto out;
	for (uint64_t i = 0; i < (uint64_t)T * E; i++)
		dz[i] = (float)gauss();
	for (uint64_t i = 0; i < (uint64_t)E * H; i++)
		w[i] = (float)gauss();
	for (uint64_t i = 0; i < nh; i++)
		dh[i] = i < (uint64_t)T * H ? NAN : SENTINEL;
	if (ms_gpu_malloc(&ddz, (uint64_t)T * E * 4 + 4, &err) ||
	    ms_gpu_malloc(&dw, (uint64_t)E * H * 4, &err) || ms_gpu_malloc(&ddh, nh * 4, &err) ||
	    ms_gpu_memcpy(ddz, dz, (uint64_t)T * E * 4, &err) ||
	    ms_gpu_memcpy(dw, w, (uint64_t)E * H * 4, &err))
		goto out;
	for (int run = 0; run < 2; run++)
		if (ms_gpu_memcpy(ddh, dh, nh * 4, &err) ||
		    ms_router_dgrad(ddz, dw, ddh, T, E, H, NULL, &err) || ms_gpu_sync(&err) ||
		    cudaMemcpy(run ? dh2 : dh, ddh, nh * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
			goto out;
	if (memcmp(dh, dh2, nh * 4)) {
		fprintf(stderr, "router dgrad T %u E %u H %u: two runs differ\n", T, E, H);
		goto out;
	}
	for (uint32_t t = 0; t < T; t++)
		for (uint32_t j = 0; j < H; j++) {
			double s = 0, m = 0, g = dh[(uint64_t)t * H + j];
			float c = 0;
			for (uint32_t e = 0; e < E; e++) {
				double p = (double)dz[(uint64_t)t * E + e] * w[(uint64_t)e * H + j];
				s += p;
				m += fabs(p);
				c = fmaf(dz[(uint64_t)t * E + e], w[(uint64_t)e * H + j], c);
			}
			/* router.h's order: one chain of float32 FMAs over E */
			if (memcmp(&c, &dh[(uint64_t)t * H + j], 4)) {
				fprintf(stderr, "router dgrad T %u E %u H %u: (%u, %u): gpu %.9g, the FMA "
					"chain over E in order %.9g\n", T, E, H, t, j, g, c);
				goto out;
			}
			if (!(fabs(g - s) <= (E + 2) * 0x1p-23 * m + 1e-30)) {
				fprintf(stderr, "router dgrad T %u E %u H %u: (%u, %u): gpu %.9g ref %.9g\n",
					T, E, H, t, j, g, s);
				goto out;
			}
		}
	for (uint32_t j = 0; j < H; j++)
		if (dh[(uint64_t)T * H + j] != SENTINEL) {
			fprintf(stderr, "router dgrad: the row past dh was written\n");
			goto out;
		}
	rc = 0;
out:
	if (rc && err.msg[0])
		fprintf(stderr, "router dgrad: %s\n", err.msg);
	free(dz), free(w), free(dh), free(dh2);
	ms_gpu_free(ddz), ms_gpu_free(dw), ms_gpu_free(ddh);
	return rc;
}

static int test_router_dgrad(void)
{
	static const uint32_t ts[] = {1, 31, 33, 70}, es[] = {1, 6, 33, 64};
	for (size_t i = 0; i < 4; i++)
		for (size_t j = 0; j < 4; j++)
			T_ASSERT(dgrad_case(ts[i], es[j], i % 2 ? 132 : 4) == 0);
	T_ASSERT(dgrad_case(40, 64, 2048) == 0);
	/* more tokens and experts: several steps of E and a tail of each */
	T_ASSERT(dgrad_case(300, 64, 260) == 0);
	T_ASSERT(dgrad_case(260, 128, 132) == 0);
	T_ASSERT(dgrad_case(33, 129, 132) == 0);
	return 0;
}

static int test_router_refuses(void)
{
	struct ms_err err = {0};
	const float *p = (const float *)(uintptr_t)64, *odd = (const float *)(uintptr_t)68;
	T_ASSERT_EQ_INT(ms_router_logits(p, p, (float *)64, 4, 4, 48, NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_router_logits(odd, p, (float *)64, 4, 4, 64, NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_router_logits(p, odd, (float *)64, 4, 4, 64, NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_router_logits(NULL, p, (float *)64, 4, 4, 64, NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_router_dgrad(p, p, (float *)64, 4, 4, 6, NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_router_dgrad(p, odd, (float *)64, 4, 4, 64, NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_router_dgrad(p, p, (float *)68, 4, 4, 64, NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_router_dgrad(NULL, p, (float *)64, 4, 4, 64, NULL, &err), MS_EINVAL);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_router_logits),
	T_CASE(test_router_dgrad),
	T_CASE(test_router_refuses),
};

T_GPU_MAIN(cases)
#else
int main(void)
{
	return t_gpu_skip(__FILE__);
}
#endif
