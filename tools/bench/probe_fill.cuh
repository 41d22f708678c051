/*
 * probe_fill.cuh: the probes' operands (tools/bench/*_probe.cu), bf16 or
 * float32 values in [-0.5, 0.5) from a hash of the index and a seed: the
 * same values on every run, nothing read from the host.
 */
#ifndef MS_PROBE_FILL_CUH
#define MS_PROBE_FILL_CUH

#include <cuda_bf16.h>

__device__ __forceinline__ void probe_put(__nv_bfloat16 *p, float v)
{
	*p = __float2bfloat16_rn(v);
}

__device__ __forceinline__ void probe_put(float *p, float v)
{
	*p = v;
}

template <typename T>
__global__ void probe_fill(T *p, size_t n, unsigned seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		unsigned h = (unsigned)i * 2654435761u ^ seed;
		h ^= h >> 13;
		h *= 0x5bd1e995;
		h ^= h >> 15;
		probe_put(p + i, (h & 0xffff) / 65536.0f - 0.5f);
	}
}

#endif
