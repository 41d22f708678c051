/*
 * router.cu: a MoE router's float32 logits (router.h says what and why).
 *
 * The tile: 128 threads as 8 x 16 (ty, tx); thread (ty, tx) owns tokens
 * 4 ty .. +3 and experts 4 tx .. +3 of its block's 32 x 64. Shared memory
 * holds a step of 32 along H transposed ([k][token], [k][expert]), so a
 * thread's four tokens and four experts of one k are one 16-byte read
 * each: the token read is the same for the 16 threads of a ty (a
 * broadcast), the expert read a 256-byte row over a warp's tx. The global
 * loads are 16 bytes along H (a row's 32 floats by 8 threads), taken into
 * registers one step ahead.
 */
#include "gpu_internal.h"
#include "mma.h"
#include "router.h"

#define RT_BM 32     /* tokens a block */
#define RT_BN 64     /* experts a block */
#define RT_BK 32     /* H a step */
#define RT_NTH 128

/* a thread's share of step k's tiles into registers: h's rows lr and
 * lr + 16 and W's lr + 16 q (zeros past T and E), 16 bytes at column lc */
__device__ __forceinline__ void rt_load(const float *h, const float *W, uint32_t T,
					uint32_t E, uint32_t H, uint32_t t0, uint32_t e0,
					uint32_t k, int lr, int lc, float4 pa[2], float4 pb[4])
{
	const float4 z4 = make_float4(0, 0, 0, 0);
#pragma unroll
	for (int q = 0; q < 2; q++) {
		uint32_t t = t0 + lr + 16 * q;
		pa[q] = t < T ? *(const float4 *)(h + (uint64_t)t * H + k + lc) : z4;
	}
#pragma unroll
	for (int q = 0; q < 4; q++) {
		uint32_t e = e0 + lr + 16 * q;
		pb[q] = e < E ? *(const float4 *)(W + (uint64_t)e * H + k + lc) : z4;
	}
}

/* v's four floats down a column of a [k][row] tile whose rows are ld apart
 * (the transpose into shared memory) */
__device__ __forceinline__ void put_col(float *p, int ld, float4 v)
{
	p[0] = v.x;
	p[ld] = v.y;
	p[2 * ld] = v.z;
	p[3 * ld] = v.w;
}

/* acc[i][j] += a_i b_j: a step's outer product of a thread's four rows and
 * four columns (both kernels' inner loop) */
__device__ __forceinline__ void fma4x4(float acc[4][4], float4 a, float4 b)
{
	float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < 4; j++)
			acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
}

__global__ void __launch_bounds__(RT_NTH) k_router_tiled(const float *h, const float *W,
							   float *z, uint32_t T, uint32_t E,
							   uint32_t H)
{
	__align__(16) __shared__ float as[RT_BK][RT_BM + 4];
	__align__(16) __shared__ float bs[RT_BK][RT_BN + 4];
	uint32_t t0 = blockIdx.x * RT_BM, e0 = blockIdx.y * RT_BN;
	int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
	/* a thread's loads of a step: rows lr, lr + 16 (+ 32, + 48 of W), a
	 * float4 at column lc of the step */
	int lr = tid / (RT_BK / 4), lc = tid % (RT_BK / 4) * 4;
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

/*
 * The logits where H is a multiple of RR_BK: each step of RR_BK along H
 * (512 bytes of a row) streamed into shared memory by cp.async, two
 * stages, the tiles in their global layout ([token][k], [expert][k]; rows
 * RR_BK + 4 floats apart, so that the sixteen expert rows a warp reads at
 * one k fall on distinct banks). Thread (ty, tx) owns tokens ty + 8 i and
 * experts tx + 16 j. Each logit is the same chain of FMAs over H in order
 * as k_router_tiled's: the same bits.
 *
 * Why: on the H200 (Nsight Compute) k_router_tiled is bound by its
 * shared-memory loads (L1 at 90% of its rate, the FMA pipe at 36%), and
 * its global loads, 128 bytes of each of a block's rows a step, 8 KB
 * apart, left it at 0.0927 ms alone at the bench shape; this ring with
 * steps of 128 floats took 0.0808 (with steps of 32, 0.0994; of 64,
 * 0.0860; of 256, one block an SM, 0.0950: tools/bench/router_probe.cu).
 */
#define RR_BK 128
/* shared memory of a ring of BK: two stages of both tiles, rows BK + 4 */
#define RR_SMEM(BK) (2 * (RT_BM + RT_BN) * ((BK) + 4) * 4)

template <int BK>
__device__ __forceinline__ void rr_stage(float (*as)[BK + 4], float (*bs)[BK + 4],
					 const float *h, const float *W, uint32_t T, uint32_t E,
					 uint32_t H, uint32_t t0, uint32_t e0, uint32_t k)
{
	for (int i = threadIdx.x; i < RT_BM * (BK / 4); i += RT_NTH) {
		int r = i / (BK / 4), c = i % (BK / 4) * 4;
		uint32_t t = t0 + r;
		cp16(&as[r][c], t < T ? h + (uint64_t)t * H + k + c : h, t < T ? 16 : 0);
	}
	for (int i = threadIdx.x; i < RT_BN * (BK / 4); i += RT_NTH) {
		int r = i / (BK / 4), c = i % (BK / 4) * 4;
		uint32_t e = e0 + r;
		cp16(&bs[r][c], e < E ? W + (uint64_t)e * H + k + c : W, e < E ? 16 : 0);
	}
	cp_commit();
}

/* BK: the step along H (the template lets router_probe.cu time others) */
template <int BK>
__global__ void __launch_bounds__(RT_NTH) k_router_ring(const float *h, const float *W,
							  float *z, uint32_t T, uint32_t E,
							  uint32_t H)
{
	constexpr int LD = BK + 4;
	/* dynamic, as uint4: 16-byte aligned for cp.async (RR_SMEM(BK) bytes) */
	extern __shared__ uint4 rr_smem[];
	float (*as)[RT_BM][LD] = (float (*)[RT_BM][LD])rr_smem;
	float (*bs)[RT_BN][LD] = (float (*)[RT_BN][LD])(rr_smem + 2 * RT_BM * LD / 4);
	uint32_t t0 = blockIdx.x * RT_BM, e0 = blockIdx.y * RT_BN, nst = H / BK;
	int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
	float acc[4][4] = {};
	rr_stage<BK>(as[0], bs[0], h, W, T, E, H, t0, e0, 0);
	for (uint32_t s = 0; s < nst; s++) {
		int b = s & 1;
		/* the next step into the buffer the last one read (its closing
		 * barrier passed); an empty group past the end keeps the wait's
		 * count */
		if (s + 1 < nst)
			rr_stage<BK>(as[b ^ 1], bs[b ^ 1], h, W, T, E, H, t0, e0,
					(s + 1) * BK);
		else
			cp_commit();
		cp_wait<1>();
		__syncthreads();
#pragma unroll 4
		for (int kk = 0; kk < BK; kk += 4) {
			float4 a[4], w[4];
#pragma unroll
			for (int i = 0; i < 4; i++)
				a[i] = *(const float4 *)&as[b][ty + 8 * i][kk];
#pragma unroll
			for (int j = 0; j < 4; j++)
				w[j] = *(const float4 *)&bs[b][tx + 16 * j][kk];
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < 4; j++) {
					acc[i][j] = fmaf(a[i].x, w[j].x, acc[i][j]);
					acc[i][j] = fmaf(a[i].y, w[j].y, acc[i][j]);
					acc[i][j] = fmaf(a[i].z, w[j].z, acc[i][j]);
					acc[i][j] = fmaf(a[i].w, w[j].w, acc[i][j]);
				}
		}
		__syncthreads();
	}
	cp_wait<0>();
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < 4; j++) {
			uint32_t t = t0 + ty + 8 * i, e = e0 + tx + 16 * j;
			if (t < T && e < E)
				z[(uint64_t)t * E + e] = acc[i][j];
		}
}

/* dh [T, H] = dz [T, E] W [E, H], E in order (the router's input
 * gradient, K = E: cuBLAS's float32 GEMM of it, pedantic, cost the H200
 * bench 1.7 ms a step and, once the host had nothing else to wait for,
 * 7.6, with its host time equal to its GPU time). A block 32 tokens x 128
 * columns, a thread 4 x 4 of it, E in steps of RT_BK through shared
 * memory (zeros past E, T and H). */
__global__ void __launch_bounds__(256) k_router_dgrad(const float *dz, const float *W,
						       float *dh, uint32_t T, uint32_t E,
						       uint32_t H)
{
	__align__(16) __shared__ float as[RT_BK][32 + 4];
	__align__(16) __shared__ float bs[RT_BK][128 + 4];
	uint32_t t0 = blockIdx.x * 32, j0 = blockIdx.y * 128;
	int tid = threadIdx.x, tx = tid % 32, ty = tid / 32;
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

extern "C" int ms_router_ok(const float *h, const float *W, uint32_t H)
{
	return h && W && H % RT_BK == 0 && !((uintptr_t)h & 15) && !((uintptr_t)W & 15);
}

extern "C" int ms_router_logits(const float *h, const float *W, float *z, uint32_t T,
				uint32_t E, uint32_t H, void *stream, struct ms_err *err)
{
	int rc = MS_OK;
	if (!z || !ms_router_ok(h, W, H))
		return ms_err_set(err, MS_EINVAL, "router logits: H %u (a multiple of %u), 16-byte "
				  "aligned h and W, or a NULL pointer", H, RT_BK);
	if (!T || !E)
		return MS_OK;
	if ((E + RT_BN - 1) / RT_BN > 65535)
		return ms_err_set(err, MS_EINVAL, "router logits: %u experts: too many", E);
	if (H % RR_BK == 0) {
		/* past 48 KB of shared memory: asked for (a cheap call, made at
		 * each launch so that no state outlives a device reset) */
		CK(cudaFuncSetAttribute(k_router_ring<RR_BK>,
					cudaFuncAttributeMaxDynamicSharedMemorySize, RR_SMEM(RR_BK)));
		k_router_ring<RR_BK><<<dim3((T + RT_BM - 1) / RT_BM, (E + RT_BN - 1) / RT_BN),
				       RT_NTH, RR_SMEM(RR_BK), (cudaStream_t)stream>>>(h, W, z, T,
											 E, H);
	} else {
		k_router_tiled<<<dim3((T + RT_BM - 1) / RT_BM, (E + RT_BN - 1) / RT_BN), RT_NTH, 0,
				 (cudaStream_t)stream>>>(h, W, z, T, E, H);
	}
	CK(cudaGetLastError());
out:
	return rc;
}

extern "C" int ms_router_dgrad_ok(const float *W, const float *dh, uint32_t H)
{
	return W && dh && H % 4 == 0 && !((uintptr_t)W & 15) && !((uintptr_t)dh & 15);
}

extern "C" int ms_router_dgrad(const float *dz, const float *W, float *dh, uint32_t T,
			       uint32_t E, uint32_t H, void *stream, struct ms_err *err)
{
	int rc = MS_OK;
	if (!dz || !ms_router_dgrad_ok(W, dh, H))
		return ms_err_set(err, MS_EINVAL, "router input gradient: H %u (a multiple of 4), "
				  "16-byte aligned W and dh, or a NULL pointer", H);
	if (!T || !H)
		return MS_OK;
	if ((H + 127) / 128 > 65535)
		return ms_err_set(err, MS_EINVAL, "router input gradient: H %u: too wide", H);
	k_router_dgrad<<<dim3((T + 31) / 32, (H + 127) / 128), 256, 0, (cudaStream_t)stream>>>(
		dz, W, dh, T, E, H);
	CK(cudaGetLastError());
out:
	return rc;
}
