/*
 * gpu_internal.h: what the CUDA files of kernels/ share and the library
 * does not export: turning a CUDA error into struct ms_err, the "is there a
 * device" check, and the CK() macro that checks every CUDA call.
 *
 * Library headers are C; they are included inside extern "C" here so that
 * the .cu files link against libms's C symbols.
 */
#ifndef MS_GPU_INTERNAL_H
#define MS_GPU_INTERNAL_H

#include <cuda_runtime.h>

extern "C" {
#include "common.h"
#include "hash.h"
#include "nvfp4.h"
#include "safetensors.h"
}
#include "gpu.h"
#include "vload.h"

/* Fill err from a failed CUDA call (MS_ENODEV when the failure means there
 * is no usable device, else MS_EIO) and clear CUDA's non-sticky error
 * state. what is the call's text; only its function name is kept. */
int ms_gpu_cuda_err(struct ms_err *err, cudaError_t e, const char *what);
/* MS_OK when a device is usable, else MS_ENODEV with the reason. */
int ms_gpu_ready(struct ms_err *err);

/* Check a CUDA call; on failure set rc and jump to the function's out:
 * label (every function using it has `int rc` and `out:`). */
#define CK(call)                                                               \
	do {                                                                   \
		cudaError_t ck_e_ = (call);                                    \
		if (ck_e_ != cudaSuccess) {                                    \
			rc = ms_gpu_cuda_err(err, ck_e_, #call);               \
			goto out;                                              \
		}                                                              \
	} while (0)

#endif
