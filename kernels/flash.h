/*
 * flash.h: fused causal attention on bf16 tensor cores (kernels/flash.cu),
 * the FlashAttention-2 algorithm: the scores of a tile of query rows are
 * made, softmaxed online and multiplied into the context without an S x S
 * matrix ever reaching memory; the forward keeps each row's log-sum-exp so
 * the backward recomputes the probabilities tile by tile.
 *
 * Layouts (token-major, as the trainer keeps its activations):
 *   Q, dO  bf16  [B*S, nh*hd]    row t = b*S + s, head h at columns h*hd
 *   K, V   bf16  [B*S, nkv*hd]   query head h reads KV head h / (nh/nkv)
 *   O, dQ  float [B*S, nh*hd]
 *   dK, dV float [B*S, nkv*hd]   summed over the query heads of each group
 *   LSE    float [B, nh, S]      log sum_j exp(scale * q.k_j), keys j <= row
 * scale = 1/sqrt(hd). Device pointers, 16-byte aligned.
 *
 * The backward is deterministic: no atomics; dK, dV are made by one block
 * per key tile looping over the group's heads and the query tiles, dQ by a
 * second kernel per query tile, so every sum has a fixed order.
 *
 * Internal to libms (not in ms.h). Errors: MS_EINVAL for a shape or head
 * dimension the kernels do not cover (the caller keeps its other path),
 * CUDA failures through ms_gpu_cuda_err; nothing is printed.
 */
#ifndef MS_FLASH_H
#define MS_FLASH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ms_err;

struct ms_flash_shape {
	uint32_t B, S;     /* sequences, tokens per sequence */
	uint32_t nh, nkv;  /* query heads, KV heads (nh a multiple of nkv) */
	uint32_t hd;       /* head dimension: 16, 32, 64 or 128 */
};

/* 1 when the kernels cover head dimension hd, else 0. */
int ms_flash_supported(uint32_t hd);
/* The device scratch the backward needs (D = rowsum(dO * O), float
 * [B, nh, S]), in bytes. */
uint64_t ms_flash_workspace_bytes(const struct ms_flash_shape *sh);
/* O, LSE from Q, K, V on stream (a cudaStream_t; NULL: the default). */
int ms_flash_fwd(const struct ms_flash_shape *sh, const void *q, const void *k, const void *v,
		 float *o, float *lse, void *stream, struct ms_err *err);
/* dQ, dK, dV (overwritten) from Q, K, V, the forward's O and LSE and dO;
 * ws holds ms_flash_workspace_bytes(sh). */
int ms_flash_bwd(const struct ms_flash_shape *sh, const void *q, const void *k, const void *v,
		 const float *o, const void *dout, const float *lse, float *dq, float *dk,
		 float *dv, void *ws, void *stream, struct ms_err *err);

#ifdef __cplusplus
}
#endif

#endif
