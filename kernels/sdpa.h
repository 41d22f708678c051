/*
 * sdpa.h: causal attention through cuDNN's fused SDPA (scaled dot-product
 * attention: the forward with its per-row log-sum-exp, the backward with
 * cuDNN's deterministic algorithm), built with the cuDNN frontend's graph
 * API (kernels/sdpa.cpp). The trainer's own flash kernels (flash.h) run
 * the FlashAttention-2 algorithm on mma.sync; cuDNN's Hopper kernels use
 * wgmma and TMA, which is where the backward's time was.
 *
 * cuDNN is opened with dlopen (libcudnn.so.<major of cudnn.h>), like
 * cuBLAS: a program that never builds a GPU model neither needs it
 * installed nor pays for loading it, and a machine without it keeps the
 * flash kernels.
 *
 * Layouts are flash.h's (token-major, head h at columns h*hd), with the
 * context and the gradients in bf16 (cuDNN writes bf16):
 *   Q, O, dO, dQ  bf16 [B*S, nh*hd]
 *   K, V, dK, dV  bf16 [B*S, nkv*hd]    query head h reads KV head h/(nh/nkv)
 *   LSE           float [B, nh, S]      log sum_j exp(scale * q.k_j), j <= row
 * scale = 1/sqrt(hd). Device pointers, 16-byte aligned.
 *
 * The backward is deterministic (cuDNN's deterministic algorithm, required
 * at plan time: a cuDNN that has none for the shape refuses the plan), so
 * two runs of the same step give the same bits.
 *
 * Internal to libms (not in ms.h). Errors: MS_ENODEV when cuDNN cannot be
 * opened, MS_EINVAL when it has no plan for the shape (the caller keeps
 * its flash kernels), MS_EIO for a failed run; nothing is printed.
 */
#ifndef MS_SDPA_H
#define MS_SDPA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ms_err;
struct ms_flash_shape;
struct ms_sdpa;

/* The loaded cuDNN's version (cudnnGetVersion: major*10000 + minor*100 +
 * patch), opening it on the first call; 0 with err set when it cannot be
 * opened or this build has no cuDNN frontend. */
uint64_t ms_sdpa_version(struct ms_err *err);

/* The forward and backward plans of shape sh on the current device.
 * *out is freed with ms_sdpa_free. */
int ms_sdpa_new(const struct ms_flash_shape *sh, struct ms_sdpa **out, struct ms_err *err);
void ms_sdpa_free(struct ms_sdpa *s);
/* the device workspace either call needs, in bytes */
uint64_t ms_sdpa_workspace_bytes(const struct ms_sdpa *s);

/* O, LSE from Q, K, V on stream (a cudaStream_t) */
int ms_sdpa_fwd(struct ms_sdpa *s, const void *q, const void *k, const void *v, void *o,
		float *lse, void *ws, void *stream, struct ms_err *err);
/* dQ, dK, dV (overwritten) from Q, K, V, the forward's O and LSE, and dO */
int ms_sdpa_bwd(struct ms_sdpa *s, const void *q, const void *k, const void *v, const void *o,
		const void *dout, const float *lse, void *dq, void *dk, void *dv, void *ws,
		void *stream, struct ms_err *err);

#ifdef __cplusplus
}
#endif

#endif
