/*
 * gpu.h: the NVFP4 codec on an NVIDIA GPU, behind a plain C interface.
 *
 * The kernels (kernels/nvfp4_cuda.cu) give the bytes of the CPU reference
 * (nvfp4.h: ms_nvfp4_quantize_ref, ms_nvfp4_amax_ref,
 * ms_nvfp4_dequantize_ref, ms_nvfp4_transpose) on every input, including
 * the error they report for bad input (same code; the same message where
 * the reference's can be reproduced). The byte layouts are nvfp4.h's.
 *
 * Buffers: every function here takes host or device pointers and looks at
 * where they live (cudaPointerGetAttributes). All device pointers: the work
 * runs in place. All host pointers (pageable or pinned): the bytes are
 * staged through the GPU (the quantizer streams them in chunks of rows,
 * see ms_gpu_nvfp4_quantize_host). A mix of the two is MS_EINVAL. Every
 * function returns once its results are in place; none keeps a pointer.
 *
 * Builds: with nvcc the kernels are compiled for sm_90 (plus PTX) and
 * linked statically; the program still runs on machines without a GPU,
 * where ms_gpu_available() is 0 and every other function returns
 * MS_ENODEV. A build without nvcc has the same functions (gpu_none.c),
 * all MS_ENODEV. Errors never abort the process: a failed CUDA call is
 * MS_EIO (MS_ENODEV when no usable device exists) with CUDA's own error
 * text in struct ms_err.
 *
 * Limits: rows and cols below 2^31 (larger is MS_EINVAL).
 */
#ifndef MS_GPU_H
#define MS_GPU_H

#include "ms.h"
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "nvfp4.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the device ---------------------------------------------------------- */

/* One line about the device in use, e.g. "NVIDIA H200 (sm_90, 132 SMs,
 * 139.8 GiB)", into buf. MS_ENODEV without one. */
int ms_gpu_describe(char *buf, size_t n, struct ms_err *err);

/* Device memory (cudaMalloc; n == 0 gives a valid pointer), pinned host
 * memory (cudaHostAlloc), copies between any two (synchronous; direction
 * from the pointers), memset of device memory, and a wait for all work.
 * ms_gpu_free and ms_gpu_host_free accept NULL. */
int ms_gpu_malloc(void **p, uint64_t n, struct ms_err *err);
void ms_gpu_free(void *p);
int ms_gpu_host_alloc(void **p, uint64_t n, struct ms_err *err);
void ms_gpu_host_free(void *p);
int ms_gpu_memcpy(void *dst, const void *src, uint64_t n, struct ms_err *err);
int ms_gpu_memset(void *dst, int byte, uint64_t n, struct ms_err *err);
int ms_gpu_sync(struct ms_err *err);
/* 1 when p is device (or managed) memory, 0 when host memory. */
int ms_gpu_is_device_ptr(const void *p);

/* ---- tree digests (hash.h) ------------------------------------------------ */

/* The SHA-256 of every 2^log2-byte chunk of n bytes of device memory at
 * data (the last chunk short) into out (device memory, 32 bytes a chunk,
 * in order), one thread per chunk (kernels/sha256_tree.cu). Queued on
 * stream (a cudaStream_t; NULL: the default stream) and not waited for. */
int ms_gpu_tree_chunks(const void *data, uint64_t n, unsigned log2,
		       uint8_t *out, void *stream, struct ms_err *err);
/* Many device buffers in one launch (small ones: one thread per chunk
 * takes as long on a 64 KiB buffer as on a 64 MiB one, so their launches
 * are batched): the chunk digests of segs[i].data into segs[i].out.
 * Synchronous. */
struct ms_gpu_tree_seg {
	const uint8_t *data;   /* device */
	uint64_t n;
	uint8_t *out;          /* device, 32 bytes a chunk */
};
int ms_gpu_tree_chunks_batch(const struct ms_gpu_tree_seg *segs, size_t nseg,
			     unsigned log2, struct ms_err *err);
/* The tree digest of n bytes of device memory at data: the chunks hashed
 * on the GPU, folded on the CPU (ms_tree_fold). Synchronous. */
int ms_gpu_tree_digest(const void *data, uint64_t n, unsigned log2,
		       uint8_t out[MS_SHA256_LEN], struct ms_err *err);

/* ---- NVFP4 --------------------------------------------------------------- */

/* ms_nvfp4_amax_ref on the GPU: largest finite |x| of src; a NaN or Inf is
 * MS_EINVAL naming the first one (flat row-major index), unless
 * allow_nonfinite. */
int ms_gpu_nvfp4_amax(const struct ms_nvfp4_src *src, int allow_nonfinite,
		      float *amax, struct ms_err *err);

/*
 * Quantize src [rows, cols] with p->recipe and p->block (p->flags as in
 * ms_nvfp4_quantize_ref; p->layout, p->isa and p->nthreads are not used)
 * into the rowwise layout (packed, scales: the quantized W) and/or the
 * columnwise layout (packed_t, scales_t: the quantized W^T), in one pass
 * over src: pass NULL for the pair not wanted (at least one pair). Sizes
 * as ms_nvfp4_shapes gives for each layout. Each output is byte for byte
 * ms_nvfp4_quantize_ref's for that layout. Errors as the reference's: a
 * non-finite value names its first element; an amax below a block maximum
 * names the largest such maximum.
 */
int ms_gpu_nvfp4_quantize(const struct ms_nvfp4_params *p,
			  const struct ms_nvfp4_src *src, float amax,
			  uint8_t *packed, uint8_t *scales, uint8_t *packed_t,
			  uint8_t *scales_t, struct ms_err *err);

/*
 * The streaming form for a tensor in host memory (what msconvert --device
 * cuda uses): chunks of chunk_rows rows (rounded up to a multiple of 16; 0
 * picks about 16 MiB of input per chunk) go through pinned buffers on two
 * streams, so that the copy in of one chunk, the kernel of another and the
 * copy out of a third overlap; the copies between the caller's pageable
 * memory and the pinned buffers are spread over threads. Outputs as
 * ms_gpu_nvfp4_quantize, in host memory, identical to the CPU path's bytes.
 */
int ms_gpu_nvfp4_quantize_host(const struct ms_nvfp4_params *p,
			       const struct ms_nvfp4_src *src, float amax,
			       uint64_t chunk_rows, uint8_t *packed,
			       uint8_t *scales, uint8_t *packed_t,
			       uint8_t *scales_t, struct ms_err *err);

/* ms_nvfp4_dequantize_ref on the GPU: decode a quantized [rows, cols] (of
 * either layout: rows, cols are its logical shape) to out (MS_DTYPE_BF16 or
 * MS_DTYPE_F32, [rows, cols] row-major). */
int ms_gpu_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales,
			    uint64_t rows, uint64_t cols, float tscale,
			    enum ms_nvfp4_tscale_kind kind,
			    enum ms_dtype out_dtype, void *out,
			    struct ms_err *err);

/* ms_nvfp4_transpose on the GPU: the other orientation of a 2D-block
 * quantization by nibble repacking and scale transposition; the input is
 * validated first (same errors as the reference), so a bad one leaves the
 * outputs untouched. 1D blocks are MS_EINVAL. */
int ms_gpu_nvfp4_transpose(enum ms_nvfp4_block block, uint64_t rows,
			   uint64_t cols, const uint8_t *packed,
			   const uint8_t *scales, uint8_t *packed_t,
			   uint8_t *scales_t, struct ms_err *err);

#ifdef __cplusplus
}
#endif

#endif
