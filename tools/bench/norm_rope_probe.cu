/*
 * norm_rope_probe.cu: the q/k norm + RoPE kernels (train.cu's
 * k_norm_rope / k_rope_norm_bwd, copied here as they were, the shared-
 * memory form) against register forms, at the trainer benchmark's shapes
 * (8192 tokens, 16 query heads of 128, full rotary: q's rows; bf16 out,
 * the backward's dy in bf16), each bit-compared with the first:
 *
 *   regs, R rows   lane l holds the row's l + 32 j; RoPE's partner at
 *                  j +- half / 32 in the same lane (half a multiple of
 *                  32); R rows a warp step, all loads first
 *   general        any head width and half: the partner by two shuffles
 *                  (tried: slower, and the forward's bits differ from the
 *                  shared-memory kernel's, the compiler contracting the
 *                  rotation's products differently)
 *
 *   float          kernels/norm_rope_f.cuh (the trainer's bf16 path):
 *                  lane l holds the NV consecutive values from NV l
 *                  (vector loads), the partner one shuffle away, the
 *                  sums in float; counted against the double kernels'
 *                  bf16 outputs (how many differ, by how many units)
 *
 * and a device copy of the bytes as the floor. GPU time a call from CUDA
 * events over 20 calls after 3; TB/s counts x read and y written
 * (forward), dy, x read and dx written (backward). Not built by make:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -Itools/bench -o norm_rope_probe \
 *     tools/bench/norm_rope_probe.cu
 *   ./norm_rope_probe
 */
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstring>
#include "probe_fill.cuh"
#include "../../kernels/norm_rope_f.cuh"
#define PK(x) do { cudaError_t e_ = (x); if (e_) { printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)
#define NTH 256
#define NR_MAXN 256
template <typename T> __device__ __forceinline__ T tocv(float x);
template <> __device__ __forceinline__ float tocv<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 tocv<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float f32_of(float v) { return v; }
__device__ __forceinline__ float f32_of(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float warp_rstd(const float *xr, uint32_t n, float eps,
					   uint32_t lane)
{
	double ss = 0;
	for (uint32_t i = lane; i < n; i += 32)
		ss += (double)xr[i] * xr[i];
	for (int o = 16; o; o >>= 1)
		ss += __shfl_xor_sync(0xffffffffu, ss, o);
	float var = (float)(ss / n);
	return (float)(1.0 / sqrt((double)(var + eps)));
}

__device__ __forceinline__ float rope_at(const float *v, uint32_t i, uint32_t half, float c,
					 float s, int bwd)
{
	if (!bwd) {
		if (i < half) {
			float a = v[i] * c, b = -v[i + half] * s;
			return a + b;
		}
		float a2 = v[i] * c, b2 = v[i - half] * s;
		return a2 + b2;
	}
	if (i < half)
		return v[i] * c + v[i + half] * s;
	return v[i] * c - v[i - half] * s;
}

/* Y: float, or bf16 where the output is cuDNN's operand only (att16) */
template <typename Y>
__global__ void k_norm_rope(const float *x, const float *w, Y *y, float *rstd,
			    uint64_t rows, uint32_t n, uint32_t nhead, uint32_t half, uint32_t S,
			    const float *cs, const float *sn, float eps)
{
	__shared__ float sb[NTH / 32][NR_MAXN];
	uint32_t lane = threadIdx.x & 31, wi = threadIdx.x >> 5, wpb = blockDim.x >> 5;
	float *sr = sb[wi];
	for (uint64_t row = (uint64_t)blockIdx.x * wpb + wi; row < rows;
	     row += (uint64_t)gridDim.x * wpb) {
		const float *xr = x + row * n;
		float r = warp_rstd(xr, n, eps, lane);
		if (!lane)
			rstd[row] = r;
		for (uint32_t i = lane; i < n; i += 32)
			sr[i] = w[i] * (xr[i] * r);
		__syncwarp();
		uint64_t pos = (row / nhead) % S;
		for (uint32_t i = lane; i < n; i += 32) {
			uint32_t f = i < half ? i : i - half;
			y[row * n + i] = tocv<Y>(i >= 2 * half
							 ? sr[i]
							 : rope_at(sr, i, half, cs[pos * half + f],
								   sn[pos * half + f], 0));
		}
		/* the row is read before the next one overwrites it */
		__syncwarp();
	}
}

template <typename X, typename Y>
__global__ void k_rope_norm_bwd(const X *dy, const float *x, const float *w, const float *rstd,
				Y *dx, uint64_t rows, uint32_t n, uint32_t nhead,
				uint32_t half, uint32_t S, const float *cs, const float *sn,
				uint32_t ldo, uint32_t c0)
{
	/* dx: head h of token t at t ldo + c0 + h n (ldo = nhead n, c0 = 0:
	 * [rows, n]; or straight into the input gradient GEMM's bf16
	 * operand [dq dk dv], no concatenating pass) */
	__shared__ float sb[NTH / 32][NR_MAXN];
	__shared__ float sd[NTH / 32][NR_MAXN];
	uint32_t lane = threadIdx.x & 31, wi = threadIdx.x >> 5, wpb = blockDim.x >> 5;
	float *sr = sb[wi], *sg = sd[wi];
	for (uint64_t row = (uint64_t)blockIdx.x * wpb + wi; row < rows;
	     row += (uint64_t)gridDim.x * wpb) {
		uint64_t o = row * n, pos = (row / nhead) % S;
		for (uint32_t i = lane; i < n; i += 32)
			sr[i] = f32_of(dy[o + i]);
		__syncwarp();
		for (uint32_t i = lane; i < n; i += 32) {
			uint32_t f = i < half ? i : i - half;
			sg[i] = i >= 2 * half ? sr[i]
					      : rope_at(sr, i, half, cs[pos * half + f],
							sn[pos * half + f], 1);
		}
		__syncwarp();
		double dot = 0;
		for (uint32_t i = lane; i < n; i += 32)
			dot += (double)w[i] * sg[i] * x[o + i];
		for (int k = 16; k; k >>= 1)
			dot += __shfl_xor_sync(0xffffffffu, dot, k);
		double r = rstd[row];
		double c = r * r * r * dot / n;
		Y *dr = dx + (row / nhead) * ldo + c0 + (row % nhead) * n;
		for (uint32_t i = lane; i < n; i += 32)
			dr[i] = tocv<Y>((float)(r * w[i] * sg[i] - c * x[o + i]));
		__syncwarp();
	}
}


/* register-only: n = 32 NV, half a multiple of 32 (RoPE's partner in the
 * same lane, j +- half / 32), R rows a warp step */
template <typename Y, int NV, int R>
__global__ void v_fwd(const float *x, const float *w, Y *y, float *rstd, uint32_t rows,
		      uint32_t nhead, uint32_t half, uint32_t S, const float *cs, const float *sn,
		      float eps)
{
	const uint32_t n = 32 * NV, hj = half / 32;
	uint32_t lane = threadIdx.x & 31;
	uint32_t gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
	float wv[NV];
#pragma unroll
	for (int j = 0; j < NV; j++)
		wv[j] = w[lane + 32 * j];
	for (uint32_t row0 = gw * R; row0 < rows; row0 += nw * R) {
		float v[R][NV];
#pragma unroll
		for (int q = 0; q < R; q++)
#pragma unroll
			for (int j = 0; j < NV; j++)
				v[q][j] = row0 + q < rows ? x[(uint64_t)(row0 + q) * n + lane + 32 * j] : 0.0f;
#pragma unroll
		for (int q = 0; q < R; q++) {
			uint32_t row = row0 + q;
			if (row >= rows)
				break;
			double ss = 0;
#pragma unroll
			for (int j = 0; j < NV; j++)
				ss += (double)v[q][j] * v[q][j];
			for (int o = 16; o; o >>= 1)
				ss += __shfl_xor_sync(0xffffffffu, ss, o);
			float var = (float)(ss / n);
			float r = (float)(1.0 / sqrt((double)(var + eps)));
			if (!lane)
				rstd[row] = r;
			float sr[NV];
#pragma unroll
			for (int j = 0; j < NV; j++)
				sr[j] = wv[j] * (v[q][j] * r);
			uint32_t pos = (row / nhead) % S;
#pragma unroll
			for (int j = 0; j < NV; j++) {
				uint32_t i = lane + 32 * j;
				float o;
				if (i >= 2 * half) {
					o = sr[j];
				} else {
					uint32_t f = i < half ? i : i - half;
					float c = cs[(uint64_t)pos * half + f], s = sn[(uint64_t)pos * half + f];
					if (i < half) {
						float a = sr[j] * c, b = -sr[j + hj] * s;
						o = a + b;
					} else {
						float a2 = sr[j] * c, b2 = sr[j - hj] * s;
						o = a2 + b2;
					}
				}
				y[(uint64_t)row * n + i] = tocv<Y>(o);
			}
		}
	}
}

template <typename X, typename Y, int NV, int R>
__global__ void v_bwd(const X *dy, const float *x, const float *w, const float *rstd, Y *dx,
		      uint32_t rows, uint32_t nhead, uint32_t half, uint32_t S, const float *cs,
		      const float *sn, uint32_t ldo, uint32_t c0)
{
	const uint32_t n = 32 * NV, hj = half / 32;
	uint32_t lane = threadIdx.x & 31;
	uint32_t gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
	float wv[NV];
#pragma unroll
	for (int j = 0; j < NV; j++)
		wv[j] = w[lane + 32 * j];
	for (uint32_t row0 = gw * R; row0 < rows; row0 += nw * R) {
		float dv[R][NV], xv[R][NV];
		double rr[R];
#pragma unroll
		for (int q = 0; q < R; q++) {
			uint32_t row = row0 + q < rows ? row0 + q : rows - 1;
#pragma unroll
			for (int j = 0; j < NV; j++) {
				dv[q][j] = f32_of(dy[(uint64_t)row * n + lane + 32 * j]);
				xv[q][j] = x[(uint64_t)row * n + lane + 32 * j];
			}
			rr[q] = rstd[row];
		}
#pragma unroll
		for (int q = 0; q < R; q++) {
			uint32_t row = row0 + q;
			if (row >= rows)
				break;
			uint32_t pos = (row / nhead) % S;
			float gv[NV];
			double dot = 0;
#pragma unroll
			for (int j = 0; j < NV; j++) {
				uint32_t i = lane + 32 * j;
				if (i >= 2 * half) {
					gv[j] = dv[q][j];
				} else {
					uint32_t f = i < half ? i : i - half;
					float c = cs[(uint64_t)pos * half + f], s = sn[(uint64_t)pos * half + f];
					gv[j] = i < half ? dv[q][j] * c + dv[q][j + hj] * s
							 : dv[q][j] * c - dv[q][j - hj] * s;
				}
				dot += (double)wv[j] * gv[j] * xv[q][j];
			}
			for (int k = 16; k; k >>= 1)
				dot += __shfl_xor_sync(0xffffffffu, dot, k);
			double r = rr[q];
			double c = r * r * r * dot / n;
			Y *dr = dx + (uint64_t)(row / nhead) * ldo + c0 + (row % nhead) * n;
#pragma unroll
			for (int j = 0; j < NV; j++)
				dr[lane + 32 * j] = tocv<Y>((float)(r * wv[j] * gv[j] - c * xv[q][j]));
		}
	}
}

/* general: any n <= 32 NV, any half; RoPE's partner (i +- half) fetched
 * from its lane by shuffles (two, the partner's register index being one
 * of two across the warp) */
template <int NV>
__device__ __forceinline__ float nr_partner(const float *v, int j, uint32_t lane, uint32_t half,
					    int up)
{
	/* up: the value at i + half (i < half), else at i - half */
	uint32_t hl = half & 31, hq = half >> 5;
	float a = 0, b = 0;
	if (up) {
		uint32_t src = (lane + hl) & 31;
		int j0 = j + (int)hq, j1 = j0 + 1;
#pragma unroll
		for (int k = 0; k < NV; k++) {
			if (k == j0) a = v[k];
			if (k == j1) b = v[k];
		}
		a = __shfl_sync(0xffffffffu, a, src);
		b = __shfl_sync(0xffffffffu, b, src);
		return lane + hl >= 32 ? b : a;
	}
	uint32_t src = (lane - hl) & 31;
	int j0 = j - (int)hq, j1 = j0 - 1;
#pragma unroll
	for (int k = 0; k < NV; k++) {
		if (k == j0) a = v[k];
		if (k == j1) b = v[k];
	}
	a = __shfl_sync(0xffffffffu, a, src);
	b = __shfl_sync(0xffffffffu, b, src);
	return lane < hl ? b : a;
}

template <typename Y, int NV, int R>
__global__ void g_fwd(const float *x, const float *w, Y *y, float *rstd, uint32_t rows,
		      uint32_t n, uint32_t nhead, uint32_t half, uint32_t S, const float *cs,
		      const float *sn, float eps)
{
	uint32_t lane = threadIdx.x & 31;
	uint32_t gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
	float wv[NV];
#pragma unroll
	for (int j = 0; j < NV; j++)
		wv[j] = lane + 32 * j < n ? w[lane + 32 * j] : 0.0f;
	for (uint32_t row0 = gw * R; row0 < rows; row0 += nw * R) {
		float v[R][NV];
#pragma unroll
		for (int q = 0; q < R; q++)
#pragma unroll
			for (int j = 0; j < NV; j++) {
				uint32_t i = lane + 32 * j;
				v[q][j] = row0 + q < rows && i < n ? x[(uint64_t)(row0 + q) * n + i] : 0.0f;
			}
#pragma unroll
		for (int q = 0; q < R; q++) {
			uint32_t row = row0 + q;
			if (row >= rows)
				break;
			double ss = 0;
#pragma unroll
			for (int j = 0; j < NV; j++)
				if (lane + 32 * j < n)
					ss += (double)v[q][j] * v[q][j];
			for (int o = 16; o; o >>= 1)
				ss += __shfl_xor_sync(0xffffffffu, ss, o);
			float var = (float)(ss / n);
			float r = (float)(1.0 / sqrt((double)(var + eps)));
			if (!lane)
				rstd[row] = r;
			float sr[NV];
#pragma unroll
			for (int j = 0; j < NV; j++)
				sr[j] = wv[j] * (v[q][j] * r);
			uint32_t pos = (row / nhead) % S;
#pragma unroll
			for (int j = 0; j < NV; j++) {
				uint32_t i = lane + 32 * j;
				float pu = nr_partner<NV>(sr, j, lane, half, 1);
				float pd = nr_partner<NV>(sr, j, lane, half, 0);
				if (i >= n)
					continue;
				float o;
				if (i >= 2 * half) {
					o = sr[j];
				} else {
					uint32_t f = i < half ? i : i - half;
					float c = cs[(uint64_t)pos * half + f], s = sn[(uint64_t)pos * half + f];
					if (i < half) {
						float a = sr[j] * c, b = -pu * s;
						o = a + b;
					} else {
						float a2 = sr[j] * c, b2 = pd * s;
						o = a2 + b2;
					}
				}
				y[(uint64_t)row * n + i] = tocv<Y>(o);
			}
		}
	}
}

template <typename X, typename Y, int NV, int R>
__global__ void g_bwd(const X *dy, const float *x, const float *w, const float *rstd, Y *dx,
		      uint32_t rows, uint32_t n, uint32_t nhead, uint32_t half, uint32_t S,
		      const float *cs, const float *sn, uint32_t ldo, uint32_t c0)
{
	uint32_t lane = threadIdx.x & 31;
	uint32_t gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
	float wv[NV];
#pragma unroll
	for (int j = 0; j < NV; j++)
		wv[j] = lane + 32 * j < n ? w[lane + 32 * j] : 0.0f;
	for (uint32_t row0 = gw * R; row0 < rows; row0 += nw * R) {
		float dv[R][NV], xv[R][NV];
		double rr[R];
#pragma unroll
		for (int q = 0; q < R; q++) {
			uint32_t row = row0 + q < rows ? row0 + q : rows - 1;
#pragma unroll
			for (int j = 0; j < NV; j++) {
				uint32_t i = lane + 32 * j;
				dv[q][j] = i < n ? f32_of(dy[(uint64_t)row * n + i]) : 0.0f;
				xv[q][j] = i < n ? x[(uint64_t)row * n + i] : 0.0f;
			}
			rr[q] = rstd[row];
		}
#pragma unroll
		for (int q = 0; q < R; q++) {
			uint32_t row = row0 + q;
			if (row >= rows)
				break;
			uint32_t pos = (row / nhead) % S;
			float gv[NV];
			double dot = 0;
#pragma unroll
			for (int j = 0; j < NV; j++) {
				uint32_t i = lane + 32 * j;
				float pu = nr_partner<NV>(dv[q], j, lane, half, 1);
				float pd = nr_partner<NV>(dv[q], j, lane, half, 0);
				gv[j] = 0.0f;
				if (i >= n)
					continue;
				if (i >= 2 * half) {
					gv[j] = dv[q][j];
				} else {
					uint32_t f = i < half ? i : i - half;
					float c = cs[(uint64_t)pos * half + f], s = sn[(uint64_t)pos * half + f];
					gv[j] = i < half ? dv[q][j] * c + pu * s : dv[q][j] * c - pd * s;
				}
				dot += (double)wv[j] * gv[j] * xv[q][j];
			}
			for (int k = 16; k; k >>= 1)
				dot += __shfl_xor_sync(0xffffffffu, dot, k);
			double r = rr[q];
			double c = r * r * r * dot / n;
			Y *dr = dx + (uint64_t)(row / nhead) * ldo + c0 + (row % nhead) * n;
#pragma unroll
			for (int j = 0; j < NV; j++) {
				uint32_t i = lane + 32 * j;
				if (i < n)
					dr[i] = tocv<Y>((float)(r * wv[j] * gv[j] - c * xv[q][j]));
			}
		}
	}
}

typedef __nv_bfloat16 bf;
int main()
{
	const uint32_t T = 8192, nh = 16, hd = 128, half = 64, S = 2048;
	const uint32_t rq = T * nh;
	float *x, *w, *rs, *rs2, *cs, *sn;
	bf *y, *y2, *dy, *dx, *dx2;
	PK(cudaMalloc(&x, (size_t)rq * hd * 4));
	PK(cudaMalloc(&w, hd * 4));
	PK(cudaMalloc(&rs, (size_t)rq * 8 * 4));
	PK(cudaMalloc(&rs2, (size_t)rq * 8 * 4));
	PK(cudaMalloc(&cs, S * half * 4));
	PK(cudaMalloc(&sn, S * half * 4));
	PK(cudaMalloc(&y, (size_t)rq * hd * 2));
	PK(cudaMalloc(&y2, (size_t)rq * hd * 2));
	PK(cudaMalloc(&dy, (size_t)rq * hd * 2));
	PK(cudaMalloc(&dx, (size_t)rq * hd * 2));
	PK(cudaMalloc(&dx2, (size_t)rq * hd * 2));
	probe_fill<<<1024, 256>>>(x, (size_t)rq * hd, 1u);
	probe_fill<<<1, 128>>>(w, hd, 2u);
	probe_fill<<<256, 256>>>(cs, (size_t)S * half, 3u);
	probe_fill<<<256, 256>>>(sn, (size_t)S * half, 4u);
	probe_fill<<<1024, 256>>>(dy, (size_t)rq * hd, 5u);
	PK(cudaDeviceSynchronize());
	cudaEvent_t a, b;
	PK(cudaEventCreate(&a));
	PK(cudaEventCreate(&b));
	auto timeit = [&](const char *name, double bytes, auto fn) {
		for (int i = 0; i < 3; i++)
			fn();
		PK(cudaEventRecord(a));
		for (int i = 0; i < 20; i++)
			fn();
		PK(cudaEventRecord(b));
		PK(cudaEventSynchronize(b));
		PK(cudaGetLastError());
		float ms = 0;
		PK(cudaEventElapsedTime(&ms, a, b));
		ms /= 20;
		printf("%-40s %.4f ms  %.2f TB/s\n", name, ms, bytes / (ms * 1e-3) / 1e12);
	};
	auto same = [&](const char *name, const void *p, const void *q, size_t nb) {
		std::vector<char> hp(nb), hq(nb);
		PK(cudaMemcpy(hp.data(), p, nb, cudaMemcpyDeviceToHost));
		PK(cudaMemcpy(hq.data(), q, nb, cudaMemcpyDeviceToHost));
		printf("%-40s %s\n", name, memcmp(hp.data(), hq.data(), nb) ? "DIFFERS" : "same bits");
	};
	/* the float kernels' outputs against the double ones': how many bf16
	 * values differ and by how many units in the last place at most */
	auto ulps = [&](const char *name, const void *p, const void *q, size_t n) {
		std::vector<uint16_t> hp(n), hq(n);
		PK(cudaMemcpy(hp.data(), p, n * 2, cudaMemcpyDeviceToHost));
		PK(cudaMemcpy(hq.data(), q, n * 2, cudaMemcpyDeviceToHost));
		size_t nd = 0;
		int mx = 0;
		for (size_t i = 0; i < n; i++) {
			if (hp[i] == hq[i])
				continue;
			nd++;
			/* ordered: sign-magnitude to a line */
			int a = hp[i] & 0x8000 ? -(hp[i] & 0x7fff) : hp[i];
			int b = hq[i] & 0x8000 ? -(hq[i] & 0x7fff) : hq[i];
			int d = a > b ? a - b : b - a;
			mx = d > mx ? d : mx;
		}
		printf("%-40s %zu of %zu differ (%.2e), at most %d ulp\n", name, nd, n, (double)nd / n, mx);
	};
	auto rel = [&](const char *name, const float *p, const float *q, size_t n) {
		std::vector<float> hp(n), hq(n);
		PK(cudaMemcpy(hp.data(), p, n * 4, cudaMemcpyDeviceToHost));
		PK(cudaMemcpy(hq.data(), q, n * 4, cudaMemcpyDeviceToHost));
		double mx = 0;
		for (size_t i = 0; i < n; i++) {
			double d = fabs((double)hp[i] - hq[i]) / fabs((double)hp[i]);
			mx = d > mx ? d : mx;
		}
		printf("%-40s max relative difference %.2e\n", name, mx);
	};
	double fb = (double)rq * hd * 6, bb = (double)rq * hd * 8;
	int sms = 0;
	PK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	unsigned g8 = (rq + 7) / 8;
	timeit("fwd old (k_norm_rope)", fb, [&] { k_norm_rope<bf><<<g8, NTH>>>(x, w, y, rs, rq, hd, nh, half, S, cs, sn, 1e-6f); });
	timeit("fwd regs, 1 row", fb, [&] { v_fwd<bf, 4, 1><<<g8, NTH>>>(x, w, y2, rs2, rq, nh, half, S, cs, sn, 1e-6f); });
	same("  fwd regs 1: y", y, y2, (size_t)rq * hd * 2);
	same("  fwd regs 1: rstd", rs, rs2, rq * 4);
	PK(cudaMemset(y2, 0, (size_t)rq * hd * 2));
	timeit("fwd regs, 2 rows", fb, [&] { v_fwd<bf, 4, 2><<<(rq + 15) / 16, NTH>>>(x, w, y2, rs2, rq, nh, half, S, cs, sn, 1e-6f); });
	same("  fwd regs 2: y", y, y2, (size_t)rq * hd * 2);
	PK(cudaMemset(y2, 0, (size_t)rq * hd * 2));
	timeit("fwd regs, 4 rows", fb, [&] { v_fwd<bf, 4, 4><<<(rq + 31) / 32, NTH>>>(x, w, y2, rs2, rq, nh, half, S, cs, sn, 1e-6f); });
	same("  fwd regs 4: y", y, y2, (size_t)rq * hd * 2);
	PK(cudaMemset(y2, 0, (size_t)rq * hd * 2));
	timeit("fwd regs, 2 rows, 16 warps an SM x8", fb, [&] { v_fwd<bf, 4, 2><<<sms * 8, NTH>>>(x, w, y2, rs2, rq, nh, half, S, cs, sn, 1e-6f); });
	same("  fwd regs 2 grid: y", y, y2, (size_t)rq * hd * 2);
	timeit("fwd float (norm_rope_f.cuh), 1 row", fb, [&] { k_norm_rope_f<4, 1><<<g8, NTH>>>(x, w, y2, rs2, rq, nh, half, S, cs, sn, 1e-6f); });
	ulps("  fwd float 1: y", y, y2, (size_t)rq * hd);
	rel("  fwd float 1: rstd", rs, rs2, rq);
	timeit("fwd float (norm_rope_f.cuh), 2 rows", fb, [&] { k_norm_rope_f<4, 2><<<(rq + 15) / 16, NTH>>>(x, w, y2, rs2, rq, nh, half, S, cs, sn, 1e-6f); });
	ulps("  fwd float 2: y", y, y2, (size_t)rq * hd);
	timeit("fwd float (norm_rope_f.cuh), 4 rows", fb, [&] { k_norm_rope_f<4, 4><<<(rq + 31) / 32, NTH>>>(x, w, y2, rs2, rq, nh, half, S, cs, sn, 1e-6f); });
	ulps("  fwd float 4: y", y, y2, (size_t)rq * hd);
	PK(cudaMemset(y2, 0, (size_t)rq * hd * 2));
	timeit("fwd general (shuffles), 2 rows", fb, [&] { g_fwd<bf, 4, 2><<<(rq + 15) / 16, NTH>>>(x, w, y2, rs2, rq, hd, nh, half, S, cs, sn, 1e-6f); });
	same("  fwd general 2: y", y, y2, (size_t)rq * hd * 2);
	PK(cudaMemset(y2, 0, (size_t)rq * hd * 2));
	timeit("fwd general (shuffles), 1 row", fb, [&] { g_fwd<bf, 4, 1><<<g8, NTH>>>(x, w, y2, rs2, rq, hd, nh, half, S, cs, sn, 1e-6f); });
	same("  fwd general 1: y", y, y2, (size_t)rq * hd * 2);
	PK(cudaMemset(y2, 0, (size_t)rq * hd * 2));
	{
		/* a 16-wide head, half 4 (partial, shuffled partners): against the old kernel */
		uint32_t r16 = rq * 8;
		k_norm_rope<bf><<<(r16 + 7) / 8, NTH>>>(x, w, y, rs, r16, 16, nh, 4, S, cs, sn, 1e-6f);
		g_fwd<bf, 1, 2><<<(r16 + 15) / 16, NTH>>>(x, w, y2, rs2, r16, 16, nh, 4, S, cs, sn, 1e-6f);
		same("  fwd general, hd 16 half 4: y", y, y2, (size_t)r16 * 16 * 2);
		k_norm_rope<bf><<<(rq + 7) / 8, NTH>>>(x, w, y, rs, rq, 128, nh, 40, S, cs, sn, 1e-6f);
		g_fwd<bf, 4, 2><<<(rq + 15) / 16, NTH>>>(x, w, y2, rs2, rq, 128, nh, 40, S, cs, sn, 1e-6f);
		same("  fwd general, hd 128 half 40: y", y, y2, (size_t)rq * 128 * 2);
		k_norm_rope<bf><<<g8, NTH>>>(x, w, y, rs, rq, hd, nh, half, S, cs, sn, 1e-6f);
	}
	uint32_t ldo = nh * hd;
	timeit("bwd old (k_rope_norm_bwd)", bb, [&] { k_rope_norm_bwd<bf, bf><<<g8, NTH>>>(dy, x, w, rs, dx, rq, hd, nh, half, S, cs, sn, ldo, 0); });
	timeit("bwd regs, 1 row", bb, [&] { v_bwd<bf, bf, 4, 1><<<g8, NTH>>>(dy, x, w, rs, dx2, rq, nh, half, S, cs, sn, ldo, 0); });
	same("  bwd regs 1: dx", dx, dx2, (size_t)rq * hd * 2);
	PK(cudaMemset(dx2, 0, (size_t)rq * hd * 2));
	timeit("bwd regs, 2 rows", bb, [&] { v_bwd<bf, bf, 4, 2><<<(rq + 15) / 16, NTH>>>(dy, x, w, rs, dx2, rq, nh, half, S, cs, sn, ldo, 0); });
	same("  bwd regs 2: dx", dx, dx2, (size_t)rq * hd * 2);
	PK(cudaMemset(dx2, 0, (size_t)rq * hd * 2));
	timeit("bwd regs, 4 rows", bb, [&] { v_bwd<bf, bf, 4, 4><<<(rq + 31) / 32, NTH>>>(dy, x, w, rs, dx2, rq, nh, half, S, cs, sn, ldo, 0); });
	same("  bwd regs 4: dx", dx, dx2, (size_t)rq * hd * 2);
	PK(cudaMemset(dx2, 0, (size_t)rq * hd * 2));
	timeit("bwd float (norm_rope_f.cuh), 1 row", bb, [&] { k_rope_norm_bwd_f<4, 1><<<g8, NTH>>>(dy, x, w, rs, dx2, rq, nh, half, S, cs, sn, ldo, 0); });
	ulps("  bwd float 1: dx", dx, dx2, (size_t)rq * hd);
	timeit("bwd float (norm_rope_f.cuh), 2 rows", bb, [&] { k_rope_norm_bwd_f<4, 2><<<(rq + 15) / 16, NTH>>>(dy, x, w, rs, dx2, rq, nh, half, S, cs, sn, ldo, 0); });
	ulps("  bwd float 2: dx", dx, dx2, (size_t)rq * hd);
	timeit("bwd float (norm_rope_f.cuh), 4 rows", bb, [&] { k_rope_norm_bwd_f<4, 4><<<(rq + 31) / 32, NTH>>>(dy, x, w, rs, dx2, rq, nh, half, S, cs, sn, ldo, 0); });
	ulps("  bwd float 4: dx", dx, dx2, (size_t)rq * hd);
	PK(cudaMemset(dx2, 0, (size_t)rq * hd * 2));
	timeit("bwd general (shuffles), 2 rows", bb, [&] { g_bwd<bf, bf, 4, 2><<<(rq + 15) / 16, NTH>>>(dy, x, w, rs, dx2, rq, hd, nh, half, S, cs, sn, ldo, 0); });
	same("  bwd general 2: dx", dx, dx2, (size_t)rq * hd * 2);
	PK(cudaMemset(dx2, 0, (size_t)rq * hd * 2));
	timeit("bwd general (shuffles), 1 row", bb, [&] { g_bwd<bf, bf, 4, 1><<<g8, NTH>>>(dy, x, w, rs, dx2, rq, hd, nh, half, S, cs, sn, ldo, 0); });
	same("  bwd general 1: dx", dx, dx2, (size_t)rq * hd * 2);
	{
		uint32_t r16 = rq * 8;
		k_rope_norm_bwd<bf, bf><<<(r16 + 7) / 8, NTH>>>(dy, x, w, rs, dx, r16, 16, nh, 4, S, cs, sn, nh * 16, 0);
		g_bwd<bf, bf, 1, 2><<<(r16 + 15) / 16, NTH>>>(dy, x, w, rs, dx2, r16, 16, nh, 4, S, cs, sn, nh * 16, 0);
		same("  bwd general, hd 16 half 4: dx", dx, dx2, (size_t)r16 * 16 * 2);
		k_rope_norm_bwd<bf, bf><<<g8, NTH>>>(dy, x, w, rs, dx, rq, 128, nh, 40, S, cs, sn, ldo, 0);
		g_bwd<bf, bf, 4, 2><<<(rq + 15) / 16, NTH>>>(dy, x, w, rs, dx2, rq, 128, nh, 40, S, cs, sn, ldo, 0);
		same("  bwd general, hd 128 half 40: dx", dx, dx2, (size_t)rq * 128 * 2);
	}
	timeit("copy of x (float, read + write)", (double)rq * hd * 8, [&] { PK(cudaMemcpyAsync(dx2, x, (size_t)rq * hd * 2, cudaMemcpyDeviceToDevice)); PK(cudaMemcpyAsync(y2, (char *)x + (size_t)rq * hd * 2, (size_t)rq * hd * 2, cudaMemcpyDeviceToDevice)); });
	return 0;
}
