/*
 * xgemm.h: the experts' frozen products of a MoE layer as one grouped
 * GEMM on Hopper's wgmma tensor cores (CUTLASS's TMA warp-specialised
 * grouped GEMM, kernels/xgemm.cu), the row counts read on the device.
 *
 * One cublasGemmEx per expert costs the host about as long as the GPU
 * takes to run it (64 calls a product, about 10 us each) and needs the
 * counts on the host; the project's own grouped GEMM (ggemm.h) has the
 * counts on the device but, on mma.sync, half the rate. Measured on the
 * H200 at the trainer bench's expert shapes (tools/bench/
 * cutlass_grouped_probe.cu): 470-600 TFLOP/s against cuBLAS's loop's
 * 290-445, about 12 us of host time a call against 600-800 us, and the
 * same float32 sums bit for bit.
 *
 *   group e (0 <= e < E) owns rows off[e] .. off[e+1]-1 of X and Y:
 *   Y[row, 0:N] = X[row, 0:K] W_e^T,  W_e [N, K] row-major at w + e * wstride
 *   X bf16 [rows, K], Y float32 or bf16 (ybf16) [rows, N], both packed
 *   (row stride K, N); the bf16 Y is the float32 one rounded to nearest
 *   even (the same main loop).
 *
 * The CUTLASS half is built when its headers are there (the Makefile
 * fetches them; MS_HAVE_CUTLASS); without them, or on a GPU that is not
 * sm_90, ms_xgemm_ok says no and the caller keeps its per-expert loop.
 * Internal to libms (not in ms.h); nothing is printed.
 */
#ifndef MS_XGEMM_H
#define MS_XGEMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ms_err;

/* the device memory one product's call needs (its groups' shapes,
 * pointers and strides, and CUTLASS's workspace): the caller allocates it
 * once (and the footprint planner counts it) */
#define MS_XGEMM_SCRATCH (1u << 20)

struct ms_xgemm {
	uint32_t E, N, K;
	const uint32_t *off;         /* device [E + 1] row offsets */
	const void *x;               /* device bf16 [off[E], K] */
	const void *w;               /* device bf16, W_e at w + e * wstride */
	uint64_t wstride;            /* elements */
	void *y;                     /* device [off[E], N] */
	void *scratch;               /* device, MS_XGEMM_SCRATCH bytes */
	int ybf16;                   /* y in bf16 instead of float32 */
};

/* 1 when this build and this device run it for N and K (multiples of 8),
 * 0 otherwise */
int ms_xgemm_ok(uint32_t N, uint32_t K);
/* 1 when the current device is one the kernel is for (sm_90), whatever
 * the build */
int ms_xgemm_device_ok(void);

/* queue the product on stream; MS_OK, MS_EINVAL for what ms_xgemm_ok
 * refuses or a scratch too small, CUDA or CUTLASS failures as MS_EIO */
int ms_xgemm_run(const struct ms_xgemm *p, void *stream, struct ms_err *err);

#ifdef __cplusplus
}
#endif

#endif
