/*
 * router.h: a MoE router's logits and their input gradient in float32
 * (kernels/router.cu).
 *
 *   z [T, E] = h [T, H] W [E, H]^T
 *
 * each logit summed over H in order with float32 FMAs: the trainer's bf16
 * path routes in float32 as the CPU reference does. cuBLAS's float32 GEMM
 * took about 0.24 ms a layer at the bench shape (8192 x 64 x 2048), far
 * from the multiply rate (N = 64 experts), pedantic or not. A block a tile
 * of 32 tokens x 64 experts, a thread 4 x 4 of it, H in steps of 32
 * through shared memory with the next step's loads in flight, laid out so
 * a warp's reads of a step are broadcasts or one 256-byte row (the first
 * kernel, 2 x 4 a thread, read twice for eight FMAs and took 0.14 ms a
 * layer; this one 0.093 on the H200). Where H is a multiple of 128, the
 * same chains through a two-stage cp.async ring of 128 along H (a block
 * reads 512 bytes of each row a step instead of 128: 0.081 ms alone in
 * tools/bench/router_probe.cu); both give the same bits.
 *
 * Covered: H a multiple of 32, h and W 16-byte aligned (MS_EINVAL
 * otherwise: the caller keeps cuBLAS). Internal to libms (not in ms.h).
 */
#ifndef MS_ROUTER_H
#define MS_ROUTER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ms_err;

/* whether ms_router_logits covers h, W and H (1) or refuses them (0) */
int ms_router_ok(const float *h, const float *W, uint32_t H);

int ms_router_logits(const float *h, const float *W, float *z, uint32_t T, uint32_t E,
		     uint32_t H, void *stream, struct ms_err *err);

/*
 * The router's input gradient, dh [T, H] = dz [T, E] W [E, H], each
 * element summed over E in order in float32 FMAs (set, not accumulated).
 * Covered: H a multiple of 4, W and dh 16-byte aligned (ms_router_dgrad_ok;
 * MS_EINVAL otherwise, the caller keeps cuBLAS).
 */
int ms_router_dgrad_ok(const float *W, const float *dh, uint32_t H);

int ms_router_dgrad(const float *dz, const float *W, float *dh, uint32_t T, uint32_t E,
		    uint32_t H, void *stream, struct ms_err *err);

#ifdef __cplusplus
}
#endif

#endif
