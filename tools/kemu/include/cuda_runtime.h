/*
 * cuda_runtime.h for the kemu emulator (tools/kemu): the runtime calls a
 * kernel test makes itself. Device memory is host memory, so a copy is a
 * memcpy. The event and synchronize calls exist only for the tests' --bench
 * mode, which is not run under emulation: they fail, so a bench run says so
 * rather than printing made-up times.
 */
#pragma once
#include <string.h>

/* the tests compile their shared timing helper (t_bench) where this is
 * defined, as CUDA's own header defines it */
#define CUDART_VERSION 13000

typedef int cudaError_t;
typedef void *cudaEvent_t;
#define cudaSuccess 0
/* any non-zero code: "no device to time on" */
#define KEMU_NO_TIMING 1

static inline cudaError_t cudaEventCreate(cudaEvent_t *e)
{
	*e = 0;
	return KEMU_NO_TIMING;
}

static inline cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	(void)e;
	return cudaSuccess;
}

static inline cudaError_t cudaEventRecord(cudaEvent_t e, void *stream)
{
	(void)e;
	(void)stream;
	return KEMU_NO_TIMING;
}

static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
	(void)ms;
	(void)a;
	(void)b;
	return KEMU_NO_TIMING;
}

static inline cudaError_t cudaDeviceSynchronize(void)
{
	return KEMU_NO_TIMING;
}

enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };

static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
	(void)k;
	memcpy(dst, src, n);
	return cudaSuccess;
}
