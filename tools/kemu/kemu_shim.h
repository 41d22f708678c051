/*
 * kemu_shim.h: what a CUDA kernel source needs from the CUDA headers, for
 * host C++ under the kemu emulator (tools/kemu). kemu_transform.py puts it
 * where the kernel included <cuda_bf16.h>; kemu_runtime.cpp implements the
 * declarations at the end.
 *
 * The bf16 conversion rounds to nearest even and keeps NaN a NaN, as
 * __floats2bfloat162_rn does on the device, so the emulated products see
 * the same bf16 inputs the tensor cores would.
 */
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>
extern "C" {
#include "ms.h"
}
using std::min;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct dim3 {
	unsigned x, y, z;
	dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint2 {
	uint32_t x, y;
};
struct uint4 {
	uint32_t x, y, z, w;
};
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w)
{
	return {x, y, z, w};
}
struct float2 {
	float x, y;
};
static inline float2 make_float2(float x, float y)
{
	return {x, y};
}
struct float4 {
	float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w)
{
	return {x, y, z, w};
}
#define __align__(n) alignas(n)

struct __nv_bfloat16 {
	uint16_t bits;
};
struct __nv_bfloat162 {
	__nv_bfloat16 x, y;
};

static inline __nv_bfloat16 kemu_float_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000) /* NaN: keep it quiet, never round to inf */
		return {(uint16_t)((u >> 16) | 0x40)};
	u += 0x7fffu + ((u >> 16) & 1u);
	return {(uint16_t)(u >> 16)};
}

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
	return kemu_float_to_bf16(f);
}

static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
	return {kemu_float_to_bf16(lo), kemu_float_to_bf16(hi)};
}

static inline float __bfloat162float(__nv_bfloat16 h)
{
	uint32_t u = (uint32_t)h.bits << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline float __int_as_float(int i)
{
	float f;
	memcpy(&f, &i, 4);
	return f;
}

typedef void *cudaStream_t;
typedef int cudaError_t;
#define cudaSuccess 0
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

/* the largest dynamic shared memory a block may opt into (sm_90's 227 KiB) */
#define KEMU_SMEM_OPTIN_MAX 232448

extern thread_local dim3 threadIdx, blockIdx, gridDim, blockDim;
/* the running block's dynamic shared memory */
extern thread_local void *kemu_smem;
/* what the kernel opted into by cudaFuncSetAttribute; a launch above 48 KiB
 * must stay within it, as on the device */
extern size_t kemu_smem_optin;

template <class F>
cudaError_t cudaFuncSetAttribute(F, int, int bytes)
{
	if (bytes > KEMU_SMEM_OPTIN_MAX) {
		fprintf(stderr, "kemu: shared memory attribute %d above the device's %d\n", bytes,
			KEMU_SMEM_OPTIN_MAX);
		abort();
	}
	kemu_smem_optin = bytes;
	return cudaSuccess;
}

static inline cudaError_t cudaGetLastError(void)
{
	return cudaSuccess;
}

/* the emulated device, for a launch that sizes its grid by it: an H200's
 * 132 SMs, each holding as many blocks as 2048 threads and 227 KiB of
 * shared memory allow (at most 32) */
enum { cudaDevAttrMultiProcessorCount = 16 };

static inline cudaError_t cudaGetDevice(int *d)
{
	*d = 0;
	return cudaSuccess;
}

static inline cudaError_t cudaDeviceGetAttribute(int *v, int attr, int)
{
	*v = attr == cudaDevAttrMultiProcessorCount ? 132 : 0;
	return cudaSuccess;
}

template <class F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F, int threads, size_t smem)
{
	int b = threads > 0 ? 2048 / threads : 1;
	if (smem && (size_t)b * smem > KEMU_SMEM_OPTIN_MAX)
		b = (int)(KEMU_SMEM_OPTIN_MAX / smem);
	*n = b < 1 ? 1 : b > 32 ? 32 : b;
	return cudaSuccess;
}

/* device memory is host memory here; launches run in order, so the
 * stream's order is the call order */
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t)
{
	memset(p, v, n);
	return cudaSuccess;
}

/* the project's own CUDA error mapping (gpu.cu), for the kernel's CK() */
int ms_gpu_cuda_err(struct ms_err *err, cudaError_t e, const char *what);
#define CK(call)                                                        \
	do {                                                            \
		cudaError_t ck_e_ = (call);                             \
		if (ck_e_ != cudaSuccess) {                             \
			rc = ms_gpu_cuda_err(err, ck_e_, #call);        \
			goto out;                                       \
		}                                                       \
	} while (0)

void __syncthreads(void);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
void kemu_mma(float c[4], const uint32_t a[4], const uint32_t b[2]);
void kemu_ldmatrix(uint32_t r[4], const void *row, int trans);
void kemu_cp_async(void *dst, const void *src, int size, int n);
void kemu_cp_commit(void);
void kemu_cp_wait(int n);
void kemu_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> kernel);
