/*
 * norm_rope_f.cuh: the q/k RMSNorm + RoPE of the bf16 path, forward and
 * backward, with a row's sums in float.
 *
 * Where these run, the output is a bf16 operand (cuDNN's Q and K in the
 * forward; the input-gradient GEMM's [dq dk dv] operand in the backward),
 * so the row's sums need no more than float: their error (about 1e-7 of
 * the sum) is far under the bf16 rounding that follows, and rstd, which
 * the backward reads, comes from the same forward on the same device. The
 * float32 test mode and every other width keep train.cu's kernels, whose
 * sums are in double like the CPU path's. In double the conversions
 * (a quarter of the float rate an SM) and the per-row double division and
 * square root were about half of the kernels' issue; Nsight Compute had
 * the backward at a third of the memory's rate.
 *
 * A warp a head's row of n = 32 NV values, lane l holding the NV
 * consecutive values from NV l (one 16-byte load of x at NV 4, 8 bytes of
 * bf16); RoPE's partner of value i (i +- half) is the same slot of lane
 * l +- half / NV, one shuffle a value (half a multiple of 32, so a lane's
 * values are all below half, all in [half, 2 half) or all past 2 half).
 * R rows a warp step, all their loads before the first row's sums.
 *
 * Included by kernels/train.cu and tools/bench/norm_rope_probe.cu.
 */
#ifndef MS_NORM_ROPE_F_CUH
#define MS_NORM_ROPE_F_CUH

#include <cuda_bf16.h>
#include <cstdint>

template <int NV> __device__ __forceinline__ void nrf_ldf(float (&v)[NV], const float *p)
{
	if constexpr (NV % 4 == 0) {
#pragma unroll
		for (int k = 0; k < NV; k += 4) {
			float4 t = *(const float4 *)(p + k);
			v[k] = t.x;
			v[k + 1] = t.y;
			v[k + 2] = t.z;
			v[k + 3] = t.w;
		}
	} else if constexpr (NV == 2) {
		float2 t = *(const float2 *)p;
		v[0] = t.x;
		v[1] = t.y;
	} else {
		v[0] = *p;
	}
}

/* NV bf16 values (2 NV bytes, aligned so) widened to float */
template <int NV> __device__ __forceinline__ void nrf_ldb(float (&v)[NV], const __nv_bfloat16 *p)
{
	if constexpr (NV == 1) {
		v[0] = __bfloat162float(*p);
	} else {
		uint32_t u[NV / 2];
		if constexpr (NV == 8) {
			uint4 t = *(const uint4 *)p;
			u[0] = t.x, u[1] = t.y, u[2] = t.z, u[3] = t.w;
		} else if constexpr (NV == 4) {
			uint2 t = *(const uint2 *)p;
			u[0] = t.x, u[1] = t.y;
		} else {
			u[0] = *(const uint32_t *)p;
		}
#pragma unroll
		for (int k = 0; k < NV / 2; k++) {
			/* a bf16 is a float's high half */
			v[2 * k] = __uint_as_float(u[k] << 16);
			v[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
		}
	}
}

/* NV floats rounded to bf16 (nearest even, as tocv) and stored together */
template <int NV> __device__ __forceinline__ void nrf_stb(__nv_bfloat16 *p, const float (&v)[NV])
{
	if constexpr (NV == 1) {
		*p = __float2bfloat16_rn(v[0]);
	} else {
		uint32_t u[NV / 2];
#pragma unroll
		for (int k = 0; k < NV / 2; k++) {
			__nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
			u[k] = *(uint32_t *)&h;
		}
		if constexpr (NV == 8)
			*(uint4 *)p = make_uint4(u[0], u[1], u[2], u[3]);
		else if constexpr (NV == 4)
			*(uint2 *)p = make_uint2(u[0], u[1]);
		else
			*(uint32_t *)p = u[0];
	}
}

__device__ __forceinline__ float nrf_sum(float s)
{
	/* a butterfly: every lane ends with the same bits */
#pragma unroll
	for (int o = 16; o; o >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, o);
	return s;
}

/* a lane's place in its row: its first value i0, whether its values are
 * RoPE's first half (lo) or rotated at all (rot), its partner's lane and
 * the offset f0 of its cos / sin; the warp's index and count over the
 * grid */
struct nrf_lane {
	uint32_t i0, src, f0, gw, nw;
	int lo, rot;
};

template <int NV> __device__ __forceinline__ nrf_lane nrf_place(uint32_t half)
{
	nrf_lane L;
	uint32_t lane = threadIdx.x & 31, hl = half / NV;
	L.i0 = lane * NV;
	L.gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	L.nw = (gridDim.x * blockDim.x) >> 5;
	L.lo = L.i0 < half;
	L.rot = L.i0 < 2 * half;
	L.src = L.lo ? lane + hl : L.rot ? lane - hl : lane;
	L.f0 = L.lo ? L.i0 : L.i0 - half;
	return L;
}

/* x [rows, n] float -> y [rows, n] bf16 (normed, weighted, rotated), rstd */
template <int NV, int R>
__global__ void k_norm_rope_f(const float *x, const float *w, __nv_bfloat16 *y, float *rstd,
			      uint32_t rows, uint32_t nhead, uint32_t half, uint32_t S,
			      const float *cs, const float *sn, float eps)
{
	const uint32_t n = 32 * NV;
	const nrf_lane L = nrf_place<NV>(half);
	float wv[NV];
	nrf_ldf<NV>(wv, w + L.i0);
	for (uint32_t row0 = L.gw * R; row0 < rows; row0 += L.nw * R) {
		float v[R][NV];
#pragma unroll
		for (int q = 0; q < R; q++) {
			uint32_t row = row0 + q < rows ? row0 + q : rows - 1;
			nrf_ldf<NV>(v[q], x + (uint64_t)row * n + L.i0);
		}
#pragma unroll
		for (int q = 0; q < R; q++) {
			uint32_t row = row0 + q;
			if (row >= rows)
				break;
			float ss = 0.0f;
#pragma unroll
			for (int j = 0; j < NV; j++)
				ss = fmaf(v[q][j], v[q][j], ss);
			ss = nrf_sum(ss);
			/* n is a power of two: the product is the quotient */
			float r = 1.0f / sqrtf(ss * (1.0f / n) + eps);
			if (!(threadIdx.x & 31))
				rstd[row] = r;
			float sr[NV], c[NV], s[NV], o[NV];
#pragma unroll
			for (int j = 0; j < NV; j++)
				sr[j] = wv[j] * (v[q][j] * r);
			uint32_t pos = (row / nhead) % S;
			if (L.rot) {
				nrf_ldf<NV>(c, cs + (uint64_t)pos * half + L.f0);
				nrf_ldf<NV>(s, sn + (uint64_t)pos * half + L.f0);
			}
#pragma unroll
			for (int j = 0; j < NV; j++) {
				float p = __shfl_sync(0xffffffffu, sr[j], L.src);
				o[j] = !L.rot ? sr[j]
				     : L.lo   ? sr[j] * c[j] - p * s[j]
					      : sr[j] * c[j] + p * s[j];
			}
			nrf_stb<NV>(y + (uint64_t)row * n + L.i0, o);
		}
	}
}

/* dy [rows, n] bf16 (RoPE's output gradient) -> dx (the norm's input
 * gradient), head h of token t at t ldo + c0 + h n */
template <int NV, int R>
__global__ void k_rope_norm_bwd_f(const __nv_bfloat16 *dy, const float *x, const float *w,
				  const float *rstd, __nv_bfloat16 *dx, uint32_t rows,
				  uint32_t nhead, uint32_t half, uint32_t S, const float *cs,
				  const float *sn, uint32_t ldo, uint32_t c0)
{
	const uint32_t n = 32 * NV;
	const nrf_lane L = nrf_place<NV>(half);
	float wv[NV];
	nrf_ldf<NV>(wv, w + L.i0);
	for (uint32_t row0 = L.gw * R; row0 < rows; row0 += L.nw * R) {
		float dv[R][NV], xv[R][NV], rr[R];
#pragma unroll
		for (int q = 0; q < R; q++) {
			uint32_t row = row0 + q < rows ? row0 + q : rows - 1;
			nrf_ldb<NV>(dv[q], dy + (uint64_t)row * n + L.i0);
			nrf_ldf<NV>(xv[q], x + (uint64_t)row * n + L.i0);
			rr[q] = rstd[row];
		}
#pragma unroll
		for (int q = 0; q < R; q++) {
			uint32_t row = row0 + q;
			if (row >= rows)
				break;
			uint32_t pos = (row / nhead) % S;
			float c[NV], s[NV], gv[NV], o[NV];
			if (L.rot) {
				nrf_ldf<NV>(c, cs + (uint64_t)pos * half + L.f0);
				nrf_ldf<NV>(s, sn + (uint64_t)pos * half + L.f0);
			}
			float dot = 0.0f;
#pragma unroll
			for (int j = 0; j < NV; j++) {
				float p = __shfl_sync(0xffffffffu, dv[q][j], L.src);
				gv[j] = !L.rot ? dv[q][j]
				      : L.lo ? dv[q][j] * c[j] + p * s[j]
					     : dv[q][j] * c[j] - p * s[j];
				dot = fmaf(wv[j] * gv[j], xv[q][j], dot);
			}
			dot = nrf_sum(dot);
			float r = rr[q], k = r * r * r * dot * (1.0f / n);
#pragma unroll
			for (int j = 0; j < NV; j++)
				o[j] = r * wv[j] * gv[j] - k * xv[q][j];
			nrf_stb<NV>(dx + (uint64_t)(row / nhead) * ldo + c0 + (row % nhead) * n + L.i0,
				    o);
		}
	}
}

/* whether the float kernels' vector accesses are aligned: f the float
 * operands (x, w, cos, sin), b the bf16 ones, ldo and c0 dx's row stride
 * and column offset (a head's row of 32 NV values) */
static inline int nrf_aligned(int nv, const float *const *f, int nf, const void *const *b, int nb,
			      uint64_t ldo, uint64_t c0)
{
	uintptr_t fa = nv >= 4 ? 16 : 4 * (uintptr_t)nv, ba = 2 * (uintptr_t)nv;
	for (int i = 0; i < nf; i++)
		if ((uintptr_t)f[i] % fa)
			return 0;
	for (int i = 0; i < nb; i++)
		if ((uintptr_t)b[i] % ba)
			return 0;
	return !(ldo % nv) && !(c0 % nv);
}

#endif
