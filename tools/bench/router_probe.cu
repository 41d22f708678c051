/*
 * router_probe.cu: the router's two float32 products (kernels/router.cu)
 * at the trainer benchmark's shape, T 8192 tokens, E 64 experts, H 2048:
 * the logits z = h W^T and the input gradient dh = dz W, router.cu's
 * kernels (included) against forms tried:
 * - warps of 4 x 8 threads (two shared memory wavefronts for a k's 16
 *   FMAs where router.cu's 16 x 2 read three) with the logits' transposed
 *   stores in 32 distinct banks: slower;
 * - three diagnostics of the tiled logits kernel (diag_logits): W read from
 *   one of 64 copies (are the blocks' reads of the same L2 lines the
 *   limit?), no global loads in the loop, the loads without the FMAs;
 * - the logits through router.cu's two-stage cp.async ring at other steps
 *   along H than its 128 (32, 64, 256; measured first with three stages
 *   at 32 and 64);
 * - both products on the bf16 tensor cores, each float split into three
 *   bf16 parts and six products summed (tc_logits, tc_dgrad): not the FMA
 *   chain's bits, so their largest difference from router.cu's over the
 *   sum of |products| is printed instead.
 * The FMA forms run each sum in the same order, so their outputs are
 * compared bit for bit. GPU time a call from CUDA events over 50 calls
 * after 5, next to the FMA floor (132 SMs x 128 lanes x the clock). Not
 * built by make:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -Isrc -Ikernels -o router_probe \
 *     tools/bench/router_probe.cu
 *   ./router_probe
 */
#include "../../kernels/router.cu"

#include "../../kernels/mma.h"
#include "probe_fill.cuh"
#include <cmath>
#include <cstdio>
#include <cstring>
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

/* Three diagnostics of router.cu's logits kernel, to tell where its time
 * goes (the kernel has stayed about 3x its FMA floor in every layout
 * tried): MODE 1 reads W from one of NREP copies picked by the block, so
 * that the blocks' reads of a step do not all fall on the same L2 lines;
 * MODE 2 loads its global tiles once and then runs every step's FMAs on
 * them (no global traffic in the loop); MODE 3 runs the loads and stores
 * without the FMAs (one FMA a step kept, so the loads are not removed).
 * Only MODE 1 gives router.cu's bits. */
#define NREP 64
template <int MODE>
__global__ void __launch_bounds__(RT_NTH) diag_logits(const float *h, const float *W, float *z,
						    uint32_t T, uint32_t E, uint32_t H)
{
	__align__(16) __shared__ float as[RT_BK][RT_BM + 4];
	__align__(16) __shared__ float bs[RT_BK][RT_BN + 4];
	uint32_t t0 = blockIdx.x * RT_BM, e0 = blockIdx.y * RT_BN;
	int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
	int lr = tid / (RT_BK / 4), lc = tid % (RT_BK / 4) * 4;
	if (MODE == 1)
		W += (uint64_t)(blockIdx.x % NREP) * E * H;
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
		if (k1 < H && MODE != 2)
			rt_load(h, W, T, E, H, t0, e0, k1, lr, lc, pa, pb);
		if (MODE == 3) {
			fma4x4(acc, *(const float4 *)&as[tid % RT_BK][ty * 4],
			       *(const float4 *)&bs[tid % RT_BK][tx * 4]);
		} else {
#pragma unroll
			for (int k = 0; k < RT_BK; k++)
				fma4x4(acc, *(const float4 *)&as[k][ty * 4],
				       *(const float4 *)&bs[k][tx * 4]);
		}
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

/* router.cu's ring kernel at a step of BK along H */
template <int BK> void pipe_launch(dim3 g, const float *h, const float *W, float *z, uint32_t T,
				   uint32_t E, uint32_t H)
{
	PK(cudaFuncSetAttribute(k_router_ring<BK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				RR_SMEM(BK)));
	k_router_ring<BK><<<g, RT_NTH, RR_SMEM(BK)>>>(h, W, z, T, E, H);
}

/*
 * The router's products on the bf16 tensor cores, for speed against the
 * FMA kernels: each float32 operand split into three bf16 parts that sum
 * to it exactly (hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi -
 * mid): 24 bits of significand in three 8-bit pieces), and the six
 * products whose size reaches float32's rounding (hh, hm, mh, hl, lh, mm)
 * accumulated by mma.sync in float32. Not the FMA chain's bits: the
 * probe reports the largest difference from router.cu's logits over the
 * row's sum of |h w|. W (frozen) is split once, beforehand, into three
 * bf16 arrays; h and dz are split as they are read.
 */
__global__ void tc_split(const float *x, bf16 *p, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = x[i];
		bf16 a = __float2bfloat16_rn(v);
		float r = v - __bfloat162float(a);
		bf16 b = __float2bfloat16_rn(r);
		bf16 c = __float2bfloat16_rn(r - __bfloat162float(b));
		p[i] = a;
		p[n + i] = b;
		p[2 * n + i] = c;
	}
}

/* two floats into three bf16 pairs (hi, mid, lo), lo element in the low half */
__device__ __forceinline__ void split2(float x0, float x1, uint32_t &h, uint32_t &m, uint32_t &l)
{
	__nv_bfloat162 a = __floats2bfloat162_rn(x0, x1);
	float r0 = x0 - __low2float(a), r1 = x1 - __high2float(a);
	__nv_bfloat162 b = __floats2bfloat162_rn(r0, r1);
	__nv_bfloat162 c = __floats2bfloat162_rn(r0 - __low2float(b), r1 - __high2float(b));
	h = *(uint32_t *)&a;
	m = *(uint32_t *)&b;
	l = *(uint32_t *)&c;
}

/* the A fragment (m16 x k16) of a float row-major tile, split: lane (g, t)
 * holds rows g, g + 8 and columns 2t, 2t + 1, 2t + 8, 2t + 9 */
__device__ __forceinline__ void a_split(uint32_t ah[4], uint32_t am[4], uint32_t al[4],
					const float *s, int ld, int m0, int k0)
{
	int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
#pragma unroll
	for (int q = 0; q < 4; q++) {
		int r = m0 + g + 8 * (q & 1), c = k0 + 2 * t + 8 * (q >> 1);
		float2 v = *(const float2 *)(s + r * ld + c);
		split2(v.x, v.y, ah[q], am[q], al[q]);
	}
}

/* c += the six products of (ah, am, al) and (bh, bm, bl) */
__device__ __forceinline__ void mma6(float c[4], const uint32_t ah[4], const uint32_t am[4],
				     const uint32_t al[4], const uint32_t *bh, const uint32_t *bm,
				     const uint32_t *bl)
{
	mma16816(c, am, bm);
	mma16816(c, al, bh);
	mma16816(c, ah, bl);
	mma16816(c, am, bh);
	mma16816(c, ah, bm);
	mma16816(c, ah, bh);
}

/* logits: a block 64 tokens x 64 experts (E = 64 here), warp w tokens
 * 16 w.., K in steps of 32 through a ring of 3 cp.async stages */
#define TC_ST 3
#define TC_BK 32
#define TC_LDA (TC_BK + 4)   /* floats */
#define TC_LDB (TC_BK + 8)   /* bf16 */
#define TC_SMEM (TC_ST * (64 * TC_LDA * 4 + 3 * 64 * TC_LDB * 2))
__global__ void __launch_bounds__(128) tc_logits(const float *h, const bf16 *Ws, float *z,
						  uint32_t T, uint32_t E, uint32_t H)
{
	extern __shared__ uint4 tc_smem[];
	char *base = (char *)tc_smem;
	auto As = [&](int b) { return (float *)(base + b * (64 * TC_LDA * 4 + 3 * 64 * TC_LDB * 2)); };
	auto Bs = [&](int b, int p) {
		return (bf16 *)(base + b * (64 * TC_LDA * 4 + 3 * 64 * TC_LDB * 2) + 64 * TC_LDA * 4) +
		       p * 64 * TC_LDB;
	};
	uint32_t t0 = blockIdx.x * 64, nst = H / TC_BK;
	int w = threadIdx.x >> 5;
	size_t EH = (size_t)E * H;
	float c[8][4] = {};
	auto stage = [&](int b, uint32_t k) {
		float *a = As(b);
		for (int i = threadIdx.x; i < 64 * (TC_BK / 4); i += 128) {
			int r = i / (TC_BK / 4), cc = i % (TC_BK / 4) * 4;
			uint32_t t = t0 + r;
			cp16(a + r * TC_LDA + cc, t < T ? h + (uint64_t)t * H + k + cc : h, t < T ? 16 : 0);
		}
		for (int p = 0; p < 3; p++) {
			bf16 *bb = Bs(b, p);
			for (int i = threadIdx.x; i < 64 * (TC_BK / 8); i += 128) {
				int r = i / (TC_BK / 8), cc = i % (TC_BK / 8) * 8;
				cp16(bb + r * TC_LDB + cc, r < (int)E ? Ws + p * EH + (uint64_t)r * H + k + cc : Ws,
				     r < (int)E ? 16 : 0);
			}
		}
		cp_commit();
	};
	for (int s = 0; s < TC_ST - 1; s++) {
		if ((uint32_t)s < nst)
			stage(s, s * TC_BK);
		else
			cp_commit();
	}
	for (uint32_t s = 0; s < nst; s++) {
		uint32_t f = s + TC_ST - 1;
		int b = s % TC_ST;
		if (f < nst)
			stage(f % TC_ST, f * TC_BK);
		else
			cp_commit();
		cp_wait<TC_ST - 1>();
		__syncthreads();
#pragma unroll
		for (int k0 = 0; k0 < TC_BK; k0 += 16) {
			uint32_t ah[4], am[4], al[4];
			a_split(ah, am, al, As(b), TC_LDA, 16 * w, k0);
#pragma unroll
			for (int n = 0; n < 64; n += 16) {
				uint32_t bh[4], bm[4], bl[4];
				ldsm_bn(bh, Bs(b, 0), TC_LDB, k0, n);
				ldsm_bn(bm, Bs(b, 1), TC_LDB, k0, n);
				ldsm_bn(bl, Bs(b, 2), TC_LDB, k0, n);
				mma6(c[n / 8], ah, am, al, bh, bm, bl);
				mma6(c[n / 8 + 1], ah, am, al, bh + 2, bm + 2, bl + 2);
			}
		}
		__syncthreads();
	}
	cp_wait<0>();
	int l = threadIdx.x & 31, g = l >> 2, tq = l & 3;
#pragma unroll
	for (int n = 0; n < 8; n++)
#pragma unroll
		for (int q = 0; q < 4; q++) {
			uint32_t t = t0 + 16 * w + g + 8 * (q >> 1), e = 8 * n + 2 * tq + (q & 1);
			if (t < T && e < E)
				z[(uint64_t)t * E + e] = c[n][q];
		}
}

/* the input gradient dh [T, H] = dz [T, E] W [E, H], E = 64 whole: a block
 * 64 tokens x 128 columns, warp w tokens 16 w.. */
#define TD_LDA (64 + 4)
#define TD_LDB (128 + 8)
#define TD_SMEM (64 * TD_LDA * 4 + 3 * 64 * TD_LDB * 2)
__global__ void __launch_bounds__(128) tc_dgrad(const float *dz, const bf16 *Ws, float *dh,
						 uint32_t T, uint32_t E, uint32_t H)
{
	extern __shared__ uint4 tc_smem[];
	float *a = (float *)tc_smem;
	bf16 *bs = (bf16 *)((char *)tc_smem + 64 * TD_LDA * 4);
	uint32_t t0 = blockIdx.x * 64, j0 = blockIdx.y * 128;
	int w = threadIdx.x >> 5;
	size_t EH = (size_t)E * H;
	for (int i = threadIdx.x; i < 64 * 16; i += 128) {
		int r = i / 16, cc = i % 16 * 4;
		uint32_t t = t0 + r;
		cp16(a + r * TD_LDA + cc, t < T ? dz + (uint64_t)t * E + cc : dz, t < T ? 16 : 0);
	}
	for (int p = 0; p < 3; p++)
		for (int i = threadIdx.x; i < 64 * 16; i += 128) {
			int r = i / 16, cc = i % 16 * 8;
			cp16(bs + (p * 64 + r) * TD_LDB + cc, Ws + p * EH + (uint64_t)r * H + j0 + cc, 16);
		}
	cp_commit();
	cp_wait<0>();
	__syncthreads();
	float c[16][4] = {};
#pragma unroll
	for (int k0 = 0; k0 < 64; k0 += 16) {
		uint32_t ah[4], am[4], al[4];
		a_split(ah, am, al, a, TD_LDA, 16 * w, k0);
#pragma unroll
		for (int n = 0; n < 128; n += 16) {
			uint32_t bh[4], bm[4], bl[4];
			ldsm_bk(bh, bs, TD_LDB, k0, n);
			ldsm_bk(bm, bs + 64 * TD_LDB, TD_LDB, k0, n);
			ldsm_bk(bl, bs + 128 * TD_LDB, TD_LDB, k0, n);
			mma6(c[n / 8], ah, am, al, bh, bm, bl);
			mma6(c[n / 8 + 1], ah, am, al, bh + 2, bm + 2, bl + 2);
		}
	}
	int l = threadIdx.x & 31, g = l >> 2, tq = l & 3;
#pragma unroll
	for (int n = 0; n < 16; n++)
#pragma unroll
		for (int q = 0; q < 4; q += 2) {
			uint32_t t = t0 + 16 * w + g + 8 * (q >> 1), j = j0 + 8 * n + 2 * tq;
			if (t < T)
				*(float2 *)(dh + (uint64_t)t * H + j) = make_float2(c[n][q], c[n][q + 1]);
		}
}

int main()
{
	const uint32_t T = 8192, E = 64, H = 2048;
	float *h, *W, *Wr, *z, *z2, *dh, *dh2;
	PK(cudaMalloc(&h, (size_t)T * H * 4));
	PK(cudaMalloc(&W, (size_t)E * H * 4));
	PK(cudaMalloc(&z, (size_t)T * E * 4));
	PK(cudaMalloc(&z2, (size_t)T * E * 4));
	PK(cudaMalloc(&dh, (size_t)T * H * 4));
	PK(cudaMalloc(&dh2, (size_t)T * H * 4));
	probe_fill<<<1024, 256>>>(h, (size_t)T * H, 1);
	probe_fill<<<1024, 256>>>(W, (size_t)E * H, 2);
	PK(cudaMalloc(&Wr, (size_t)NREP * E * H * 4));
	for (int i = 0; i < NREP; i++)
		PK(cudaMemcpy(Wr + (size_t)i * E * H, W, (size_t)E * H * 4, cudaMemcpyDeviceToDevice));
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
	/* the largest |x - y| of two products out [M, N] = A [M, K] B over the
	 * element's sum of |products|, every step-th row; B's element (k, n)
	 * at k bk + n bn (W [E, H]: the logits' B^T, the input gradient's B) */
	auto near = [&](const float *x, const float *y, const float *A, const float *B, uint32_t M,
			uint32_t N, uint32_t K, uint32_t bk, uint32_t bn, uint32_t step) {
		std::vector<float> p((size_t)M * N), q((size_t)M * N), av((size_t)M * K), bv((size_t)K * N);
		PK(cudaMemcpy(p.data(), x, p.size() * 4, cudaMemcpyDeviceToHost));
		PK(cudaMemcpy(q.data(), y, q.size() * 4, cudaMemcpyDeviceToHost));
		PK(cudaMemcpy(av.data(), A, av.size() * 4, cudaMemcpyDeviceToHost));
		PK(cudaMemcpy(bv.data(), B, bv.size() * 4, cudaMemcpyDeviceToHost));
		double worst = 0;
		for (uint32_t t = 0; t < M; t += step)
			for (uint32_t n = 0; n < N; n++) {
				double m = 0;
				for (uint32_t k = 0; k < K; k++)
					m += fabs((double)av[(size_t)t * K + k] * bv[(size_t)k * bk + (size_t)n * bn]);
				double d = fabs((double)p[(size_t)t * N + n] - q[(size_t)t * N + n]) / (m > 0 ? m : 1);
				worst = d > worst ? d : worst;
			}
		printf("  largest difference / sum of |products|: %.3g (2^-24 = %.3g)\n", worst,
		       ldexp(1.0, -24));
	};
	dim3 gl((T + RT_BM - 1) / RT_BM, (E + RT_BN - 1) / RT_BN);
	time("logits, 4 x 8 warps (tried)", [&] { tried_logits<<<gl, RT_NTH>>>(h, W, z2, T, E, H); });
	time("logits, router.cu (the ring)", [&] { ms_router_logits(h, W, z, T, E, H, 0, NULL); });
	same(z, z2, (size_t)T * E);
	time("logits, router.cu's tiled kernel", [&] { k_router_tiled<<<gl, RT_NTH>>>(h, W, z2, T, E, H); });
	same(z, z2, (size_t)T * E);
	time("logits, W in 64 copies (diag)", [&] { diag_logits<1><<<gl, RT_NTH>>>(h, Wr, z2, T, E, H); });
	same(z, z2, (size_t)T * E);
	time("logits, ring of BK 32", [&] { pipe_launch<32>(gl, h, W, z2, T, E, H); });
	same(z, z2, (size_t)T * E);
	time("logits, ring of BK 64", [&] { pipe_launch<64>(gl, h, W, z2, T, E, H); });
	same(z, z2, (size_t)T * E);
	time("logits, ring of BK 256", [&] { pipe_launch<256>(gl, h, W, z2, T, E, H); });
	same(z, z2, (size_t)T * E);
	{
		bf16 *Ws;
		PK(cudaMalloc(&Ws, (size_t)3 * E * H * 2));
		tc_split<<<256, 256>>>(W, Ws, (size_t)E * H);
		PK(cudaFuncSetAttribute(tc_logits, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_SMEM));
		PK(cudaFuncSetAttribute(tc_dgrad, cudaFuncAttributeMaxDynamicSharedMemorySize, TD_SMEM));
		time("logits, bf16 x 6 tensor cores", [&] { tc_logits<<<T / 64, 128, TC_SMEM>>>(h, Ws, z2, T, E, H); });
		near(z, z2, h, W, T, E, H, 1, H, 7);
		time("input gradient, bf16 x 6 tensor cores", [&] { tc_dgrad<<<dim3(T / 64, H / 128), 128, TD_SMEM>>>(z, Ws, dh2, T, E, H); });
		ms_router_dgrad(z, W, dh, T, E, H, 0, NULL);
		near(dh, dh2, z, W, T, H, E, H, 1, 13);
		PK(cudaFree(Ws));
	}
	time("logits, no loads in the loop (diag)", [&] { diag_logits<2><<<gl, RT_NTH>>>(h, W, z2, T, E, H); });
	time("logits, loads without FMAs (diag)", [&] { diag_logits<3><<<gl, RT_NTH>>>(h, W, z2, T, E, H); });
	dim3 gd((T + 31) / 32, (H + 127) / 128);
	time("input gradient, 4 x 8 (tried)", [&] { tried_dgrad<<<gd, 256>>>(z, W, dh2, T, E, H); });
	time("input gradient, router.cu", [&] { ms_router_dgrad(z, W, dh, T, E, H, 0, NULL); });
	same(dh, dh2, (size_t)T * H);
	return 0;
}
