/*
 * router_probe.cu: the router's two float32 products (kernels/router.cu)
 * at the trainer benchmark's shape, T 8192 tokens, E 64 experts, H 2048:
 * the logits z = h W^T and the input gradient dh = dz W. router.cu's
 * kernels (included) against a layout tried and not kept: warps of 4 x 8
 * threads (two shared memory wavefronts for a k's 16 FMAs where
 * router.cu's 16 x 2 and 32 x 1 read three and five) and the logits'
 * global loads mapped so that their transposed stores land in 32 distinct
 * banks (router.cu's are 4-way conflicted). Each thread's sums run in the
 * same order in both, so the outputs are compared bit for bit. GPU time a
 * call from CUDA events over 50 calls after 5, next to the FMA floor (132
 * SMs x 128 lanes x the clock). Not built by make:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -Isrc -Ikernels -o router_probe \
 *     tools/bench/router_probe.cu
 *   ./router_probe
 */
#include "../../kernels/router.cu"

#include "probe_fill.cuh"
#include <cstdio>
#include <cstdlib>
#include <vector>

/* libms's error reporting, which the probe does not link: the probe
 * passes no error record and stops on any failure */
int ms_err_set(struct ms_err *err, int code, const char *fmt, ...)
{
	(void)err;
	printf("router: error %d (%s)\n", code, fmt);
	exit(1);
}

int ms_gpu_cuda_err(struct ms_err *err, cudaError_t e, const char *what)
{
	return ms_err_set(err, MS_EIO, "%s: %s", what, cudaGetErrorString(e));
}

#define PK(x) do { cudaError_t e_ = (x); if (e_) { printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)

/* the logits, 4 x 8 warps: warp w's tx 8 (w % 2) + lane % 8, ty 4 (w / 2)
 * + lane / 8; its loads rows lane / 2 (+ 16 q), columns 8 w + 4 (lane % 2) */
__global__ void __launch_bounds__(RT_NTH) tried_logits(const float *h, const float *W, float *z,
						     uint32_t T, uint32_t E, uint32_t H)
{
	__align__(16) __shared__ float as[RT_BK][RT_BM + 4];
	__align__(16) __shared__ float bs[RT_BK][RT_BN + 4];
	uint32_t t0 = blockIdx.x * RT_BM, e0 = blockIdx.y * RT_BN;
	int tid = threadIdx.x, w = tid / 32, l = tid % 32;
	int tx = 8 * (w % 2) + l % 8, ty = 4 * (w / 2) + l / 8;
	int lr = l / 2, lc = (2 * w + l % 2) * 4;
	float4 pa[2], pb[4];
	float acc[4][4] = {};
	rt_load(h, W, T, E, H, t0, e0, 0, lr, lc, pa, pb);
	for (uint32_t k0 = 0; k0 < H; k0 += RT_BK) {
#pragma unroll
		for (int q = 0; q < 2; q++)
			put_col(&as[lc][lr + 16 * q], RT_BM + 4, pa[q]);
#pragma unroll
		for (int q = 0; q < 4; q++)
			put_col(&bs[lc][lr + 16 * q], RT_BN + 4, pb[q]);
		__syncthreads();
		uint32_t k1 = k0 + RT_BK;
		if (k1 < H)
			rt_load(h, W, T, E, H, t0, e0, k1, lr, lc, pa, pb);
#pragma unroll
		for (int k = 0; k < RT_BK; k++)
			fma4x4(acc, *(const float4 *)&as[k][ty * 4], *(const float4 *)&bs[k][tx * 4]);
		__syncthreads();
	}
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < 4; j++) {
			uint32_t t = t0 + ty * 4 + i, e = e0 + tx * 4 + j;
			if (t < T && e < E)
				z[(uint64_t)t * E + e] = acc[i][j];
		}
}

/* the input gradient, 4 x 8 warps: warp w's tx 8 (w % 4) + lane % 8, ty
 * 4 (w / 4) + lane / 8 */
__global__ void __launch_bounds__(256) tried_dgrad(const float *dz, const float *W, float *dh,
						 uint32_t T, uint32_t E, uint32_t H)
{
	__align__(16) __shared__ float as[RT_BK][32 + 4];
	__align__(16) __shared__ float bs[RT_BK][128 + 4];
	uint32_t t0 = blockIdx.x * 32, j0 = blockIdx.y * 128;
	int tid = threadIdx.x, w = tid / 32, l = tid % 32;
	int tx = 8 * (w % 4) + l % 8, ty = 4 * (w / 4) + l / 8;
	float acc[4][4] = {};
	for (uint32_t k0 = 0; k0 < E; k0 += RT_BK) {
		for (int i = tid; i < 32 * RT_BK; i += 256) {
			uint32_t r = i / RT_BK, k = i % RT_BK, t = t0 + r, e = k0 + k;
			as[k][r] = t < T && e < E ? dz[(uint64_t)t * E + e] : 0.0f;
		}
		for (int i = tid; i < RT_BK * 32; i += 256) {
			uint32_t k = i / 32, c = i % 32 * 4, e = k0 + k, j = j0 + c;
			float4 v = e < E && j < H ? *(const float4 *)(W + (uint64_t)e * H + j)
						  : make_float4(0, 0, 0, 0);
			*(float4 *)&bs[k][c] = v;
		}
		__syncthreads();
#pragma unroll
		for (int k = 0; k < RT_BK; k++)
			fma4x4(acc, *(const float4 *)&as[k][ty * 4], *(const float4 *)&bs[k][tx * 4]);
		__syncthreads();
	}
#pragma unroll
	for (int i = 0; i < 4; i++) {
		uint32_t t = t0 + ty * 4 + i, j = j0 + tx * 4;
		if (t < T && j < H)
			*(float4 *)(dh + (uint64_t)t * H + j) =
				make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
	}
}

int main()
{
	const uint32_t T = 8192, E = 64, H = 2048;
	float *h, *W, *z, *z2, *dh, *dh2;
	PK(cudaMalloc(&h, (size_t)T * H * 4));
	PK(cudaMalloc(&W, (size_t)E * H * 4));
	PK(cudaMalloc(&z, (size_t)T * E * 4));
	PK(cudaMalloc(&z2, (size_t)T * E * 4));
	PK(cudaMalloc(&dh, (size_t)T * H * 4));
	PK(cudaMalloc(&dh2, (size_t)T * H * 4));
	probe_fill<<<1024, 256>>>(h, (size_t)T * H, 1);
	probe_fill<<<1024, 256>>>(W, (size_t)E * H, 2);
	PK(cudaGetLastError());
	int clk = 0, sms = 0;
	PK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
	PK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	double floor_ms = (double)T * E * H / (sms * 128.0 * clk * 1e3) * 1e3;
	printf("T %u E %u H %u: the FMA floor %.4f ms (%d SMs, %d kHz)\n", T, E, H, floor_ms, sms,
	       clk);
	cudaEvent_t a, b;
	PK(cudaEventCreate(&a));
	PK(cudaEventCreate(&b));
	auto time = [&](const char *name, auto launch) {
		for (int i = 0; i < 5; i++)
			launch();
		PK(cudaGetLastError());
		PK(cudaEventRecord(a));
		for (int i = 0; i < 50; i++)
			launch();
		PK(cudaEventRecord(b));
		PK(cudaEventSynchronize(b));
		float ms;
		PK(cudaEventElapsedTime(&ms, a, b));
		printf("  %-34s %7.4f ms  %4.1fx the floor\n", name, ms / 50, ms / 50 / floor_ms);
	};
	auto same = [&](const float *x, const float *y, size_t n) {
		std::vector<float> p(n), q(n);
		PK(cudaMemcpy(p.data(), x, n * 4, cudaMemcpyDeviceToHost));
		PK(cudaMemcpy(q.data(), y, n * 4, cudaMemcpyDeviceToHost));
		size_t bad = 0;
		for (size_t i = 0; i < n; i++)
			bad += memcmp(&p[i], &q[i], 4) != 0;
		printf("  %s (%zu of %zu differ)\n", bad ? "DIFFER" : "same bits", bad, n);
	};
	dim3 gl((T + RT_BM - 1) / RT_BM, (E + RT_BN - 1) / RT_BN);
	time("logits, 4 x 8 warps (tried)", [&] { tried_logits<<<gl, RT_NTH>>>(h, W, z2, T, E, H); });
	time("logits, router.cu", [&] { ms_router_logits(h, W, z, T, E, H, 0, NULL); });
	same(z, z2, (size_t)T * E);
	dim3 gd((T + 31) / 32, (H + 127) / 128);
	time("input gradient, 4 x 8 (tried)", [&] { tried_dgrad<<<gd, 256>>>(z, W, dh2, T, E, H); });
	time("input gradient, router.cu", [&] { ms_router_dgrad(z, W, dh, T, E, H, 0, NULL); });
	same(dh, dh2, (size_t)T * H);
	return 0;
}
