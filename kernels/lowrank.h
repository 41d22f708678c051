/*
 * lowrank.h: a LoRA's low-rank products over the rows of one dense
 * projection (kernels/lowrank.cu), in float32 FMAs on the CUDA cores.
 *
 * The trainer's attention LoRA (q/k/v/o, rank r, n = batch x sequence
 * rows) multiplies a wide matrix by a skinny one three ways:
 *
 *   down:  U [n, r]  = alpha X [n, K] W,          W (k, j) = W[k wk + j wj]
 *   up:    Y [n, N]  = beta Y + alpha U [n, r] V^T, V (j, q) = V[j vj + q vq]
 *   wgrad: G (j, q)  = beta G + alpha sum_i D [i, j] U [i, q],
 *                      G (j, q) = G[j gj + q gq]
 *
 * so a LoRA's A [r, in] and B [out, r] serve either way round through the
 * strides (forward: U = X A^T down, Y += s U B^T up; backward: dU = s dY B
 * down, gB += s dY^T U and gA += dU^T X wgrad, dX += dU A up). cuBLAS ran
 * these as TF32 GEMMs with N or K = r, about 30 us of host time a launch,
 * which the step could not hide. Each function here is one or two
 * launches, bound by reading (and for up writing) the wide side once.
 * ggemm.h's grouped float32 products (ms_ggemm_lowrank, ms_ggemm_wgrad)
 * are built for the experts' many groups: a thread a row, and a block a
 * 128-column slice of a whole group's rows; one dense group of 8192 rows
 * gives them 64 and 16 blocks. These cut the rows among warps and blocks
 * instead (the weight gradient in runs with ordered partial sums).
 *
 * Covered: r of 1 .. MS_LR_MAX_R; up and wgrad: N a multiple of 4 and Y /
 * D 16-byte aligned with rows of exactly N floats. wgrad cuts the rows
 * into runs whose float32 partial sums go to part (npart floats: at
 * least N x MS_LR_MAX_R, more runs where it holds more, at most 128) and
 * are added in run order: every result sums in a fixed order, run to run.
 *
 * Internal to libms (not in ms.h). Errors: MS_EINVAL for what is not
 * covered (the caller keeps its other path), CUDA failures through
 * ms_gpu_cuda_err; nothing is printed.
 */
#ifndef MS_LOWRANK_H
#define MS_LOWRANK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ms_err;

#define MS_LR_MAX_R 16u

int ms_lr_down(const float *X, uint64_t n, uint32_t K, const float *W, uint64_t wk,
	       uint64_t wj, uint32_t r, float alpha, float *U, void *stream,
	       struct ms_err *err);

int ms_lr_up(const float *U, uint64_t n, uint32_t r, const float *V, uint64_t vj, uint64_t vq,
	     float alpha, float beta, float *Y, uint32_t N, void *stream, struct ms_err *err);

int ms_lr_wgrad(const float *D, uint64_t n, uint32_t N, const float *U, uint32_t r,
		float alpha, float beta, float *G, uint64_t gj, uint64_t gq, float *part,
		uint64_t npart, void *stream, struct ms_err *err);

#ifdef __cplusplus
}
#endif

#endif
