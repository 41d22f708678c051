/*
 * gpu_none.c: gpu.h and the device half of vload.h for a build without
 * CUDA (no nvcc at build time). Nothing here pretends: ms_gpu_available()
 * is 0 and every entry point that needs a GPU returns MS_ENODEV saying that
 * this build has no GPU support. With nvcc the kernels/ objects provide
 * these functions instead and this file compiles to nothing.
 */
#ifndef MS_HAVE_CUDA

#include "gpu.h"
#include "vload.h"

#include <stdio.h>

static int nodev(struct ms_err *err)
{
	return ms_err_set(err, MS_ENODEV,
			  "no gpu support in this build (built without nvcc)");
}

int ms_gpu_available(void)
{
	return 0;
}

int ms_gpu_describe(char *buf, size_t n, struct ms_err *err)
{
	if (n)
		snprintf(buf, n, "none");
	return nodev(err);
}

int ms_gpu_malloc(void **p, uint64_t n, struct ms_err *err)
{
	*p = NULL;
	return nodev(err);
}

void ms_gpu_free(void *p)
{
	(void)p;
}

int ms_gpu_host_alloc(void **p, uint64_t n, struct ms_err *err)
{
	*p = NULL;
	return nodev(err);
}

void ms_gpu_host_free(void *p)
{
	(void)p;
}

int ms_gpu_memcpy(void *dst, const void *src, uint64_t n, struct ms_err *err)
{
	return nodev(err);
}

int ms_gpu_memset(void *dst, int byte, uint64_t n, struct ms_err *err)
{
	return nodev(err);
}

int ms_gpu_sync(struct ms_err *err)
{
	return nodev(err);
}

int ms_gpu_is_device_ptr(const void *p)
{
	(void)p;
	return 0;
}

int ms_gpu_nvfp4_amax(const struct ms_nvfp4_src *src, int allow_nonfinite,
		      float *amax, struct ms_err *err)
{
	return nodev(err);
}

int ms_gpu_nvfp4_quantize(const struct ms_nvfp4_params *p,
			  const struct ms_nvfp4_src *src, float amax,
			  uint8_t *packed, uint8_t *scales, uint8_t *packed_t,
			  uint8_t *scales_t, struct ms_err *err)
{
	return nodev(err);
}

int ms_gpu_nvfp4_quantize_host(const struct ms_nvfp4_params *p,
			       const struct ms_nvfp4_src *src, float amax,
			       uint64_t chunk_rows, uint8_t *packed,
			       uint8_t *scales, uint8_t *packed_t,
			       uint8_t *scales_t, struct ms_err *err)
{
	return nodev(err);
}

int ms_gpu_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales,
			    uint64_t rows, uint64_t cols, float tscale,
			    enum ms_nvfp4_tscale_kind kind,
			    enum ms_dtype out_dtype, void *out,
			    struct ms_err *err)
{
	return nodev(err);
}

int ms_gpu_nvfp4_transpose(enum ms_nvfp4_block block, uint64_t rows,
			   uint64_t cols, const uint8_t *packed,
			   const uint8_t *scales, uint8_t *packed_t,
			   uint8_t *scales_t, struct ms_err *err)
{
	return nodev(err);
}

int ms_gpu_tree_chunks(const void *data, uint64_t n, unsigned log2,
		       uint8_t *out, void *stream, struct ms_err *err)
{
	return nodev(err);
}

int ms_gpu_tree_chunks_batch(const struct ms_gpu_tree_seg *segs, size_t nseg,
			     unsigned log2, struct ms_err *err)
{
	return nodev(err);
}

int ms_gpu_tree_digest(const void *data, uint64_t n, unsigned log2,
		       uint8_t out[MS_SHA256_LEN], struct ms_err *err)
{
	return nodev(err);
}

int ms_load_verified_gpu(struct ms_vload_item *items, size_t n, int nthreads,
			 void **arena, struct ms_err *err)
{
	if (arena)
		*arena = NULL;
	for (size_t i = 0; i < n; i++)
		items[i].dst = NULL;
	return nodev(err);
}

#endif
