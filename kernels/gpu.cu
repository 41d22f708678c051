/*
 * gpu.cu: the device half of gpu.h that is not the codec: finding the
 * device, describing it, memory and copies, and turning CUDA errors into
 * struct ms_err.
 *
 * A machine without a GPU (or without a driver) is normal here: the CUDA
 * runtime is linked statically, cudaGetDeviceCount fails cleanly, and
 * ms_gpu_available() says 0 with the reason kept for MS_ENODEV messages.
 */
#include "gpu_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_ok;
static char probe_why[256];

static void probe(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess) {
		snprintf(probe_why, sizeof(probe_why), "%s", cudaGetErrorString(e));
		cudaGetLastError();
		return;
	}
	if (n < 1) {
		snprintf(probe_why, sizeof(probe_why), "no cuda device found");
		return;
	}
	probe_ok = 1;
}

extern "C" int ms_gpu_available(void)
{
	pthread_once(&probe_once, probe);
	return probe_ok;
}

int ms_gpu_ready(struct ms_err *err)
{
	if (ms_gpu_available())
		return MS_OK;
	return ms_err_set(err, MS_ENODEV, "no usable gpu: %s", probe_why);
}

int ms_gpu_cuda_err(struct ms_err *err, cudaError_t e, const char *what)
{
	const char *paren = strchr(what, '(');
	int len = paren ? (int)(paren - what) : (int)strlen(what);
	int code = MS_EIO;

	if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
	    e == cudaErrorInitializationError || e == cudaErrorDevicesUnavailable)
		code = MS_ENODEV;
	/* clears the error unless it is sticky (a kernel fault), which then
	 * shows again on the next call: the caller sees each failure */
	cudaGetLastError();
	return ms_err_set(err, code, "cuda: %.*s: %s", len, what,
			  cudaGetErrorString(e));
}

extern "C" int ms_gpu_describe(char *buf, size_t n, struct ms_err *err)
{
	cudaDeviceProp prop;
	int dev = 0, rc = MS_OK;

	if (n)
		buf[0] = 0;
	if ((rc = ms_gpu_ready(err)) != MS_OK)
		goto out;
	CK(cudaGetDevice(&dev));
	CK(cudaGetDeviceProperties(&prop, dev));
	snprintf(buf, n, "%s (sm_%d%d, %d SMs, %.1f GiB)", prop.name, prop.major,
		 prop.minor, prop.multiProcessorCount,
		 (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
out:
	return rc;
}

extern "C" int ms_gpu_malloc(void **p, uint64_t n, struct ms_err *err)
{
	int rc = MS_OK;

	*p = NULL;
	if ((rc = ms_gpu_ready(err)) != MS_OK)
		goto out;
	CK(cudaMalloc(p, n ? (size_t)n : 1));
out:
	return rc;
}

extern "C" void ms_gpu_free(void *p)
{
	if (p && ms_gpu_available())
		cudaFree(p);
}

extern "C" int ms_gpu_host_alloc(void **p, uint64_t n, struct ms_err *err)
{
	int rc = MS_OK;

	*p = NULL;
	if ((rc = ms_gpu_ready(err)) != MS_OK)
		goto out;
	CK(cudaHostAlloc(p, n ? (size_t)n : 1, cudaHostAllocDefault));
out:
	return rc;
}

extern "C" void ms_gpu_host_free(void *p)
{
	if (p && ms_gpu_available())
		cudaFreeHost(p);
}

extern "C" int ms_gpu_memcpy(void *dst, const void *src, uint64_t n,
			     struct ms_err *err)
{
	int rc = MS_OK;

	if ((rc = ms_gpu_ready(err)) != MS_OK)
		goto out;
	if (n)
		CK(cudaMemcpy(dst, src, (size_t)n, cudaMemcpyDefault));
out:
	return rc;
}

extern "C" int ms_gpu_memset(void *dst, int byte, uint64_t n, struct ms_err *err)
{
	int rc = MS_OK;

	if ((rc = ms_gpu_ready(err)) != MS_OK)
		goto out;
	if (n)
		CK(cudaMemset(dst, byte, (size_t)n));
out:
	return rc;
}

extern "C" int ms_gpu_sync(struct ms_err *err)
{
	int rc = MS_OK;

	if ((rc = ms_gpu_ready(err)) != MS_OK)
		goto out;
	CK(cudaDeviceSynchronize());
out:
	return rc;
}

extern "C" int ms_gpu_is_device_ptr(const void *p)
{
	cudaPointerAttributes at;

	if (!p || !ms_gpu_available())
		return 0;
	if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}
