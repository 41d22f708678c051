/*
 * flash.cu: fused causal attention, forward and backward (flash.h), on the
 * bf16 tensor cores through mma.sync m16n8k16 (float accumulators).
 *
 * Blocks of 8 warps; a warp owns 16 rows of its block's tile and
 * keeps them in registers in the PTX fragment layouts, so the online
 * softmax reads a score's row and column off the lane number (the layout
 * of mma.sync's C fragment is specified by PTX; wmma's is not). A score
 * tile's C fragments turn into the A operand of the next product without
 * leaving registers (the FlashAttention-2 arrangement). Tiles of the other
 * operand are streamed through shared memory in 16-byte loads, rows padded
 * by 16 bytes against bank conflicts; rows past S load as zeros and their
 * scores are masked. Tiles wholly above the diagonal are never visited.
 *
 * Scores and softmax are float32 in the log2 domain (scale * log2(e)
 * folded into one multiply, exp2f); the probabilities (and in the backward
 * dS) are rounded to bf16 for their product, as every bf16 flash
 * attention does.
 */
#include <cuda_bf16.h>
#include <math.h>

#include "gpu_internal.h"
#include "flash.h"
#include "mma.h"

#define FL_NTH 128     /* k_flash_dot's block: 4 warps, a row each */
#define FL_LOG2E 1.4426950408889634f
#define FL_LN2 0.6931471805599453f

/* The A fragment of k-chunk j from C fragments c[2j], c[2j+1] (a 16-row
 * block of a product, as the left operand of the next one) */
__device__ __forceinline__ void c2a(uint32_t a[4], const float c0[4], const float c1[4])
{
	a[0] = pack2(c0[0], c0[1]);
	a[1] = pack2(c0[2], c0[3]);
	a[2] = pack2(c1[0], c1[1]);
	a[3] = pack2(c1[2], c1[3]);
}

/* ---- backward ----------------------------------------------------------------------- */

/* D[b, h, s] = dO . O of the row (one warp per row and head) */
template <int HD>
__global__ void k_flash_dot(const bf16 *dO, const float *O, float *D, int S, int nh,
			    uint64_t rows)
{
	uint64_t i = (uint64_t)blockIdx.x * (FL_NTH / 32) + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;
	if (i >= rows)
		return;
	/* i = (b*S + s)*nh + h: consecutive warps read neighbouring heads */
	uint64_t tok = i / nh;
	int h = (int)(i % nh);
	const bf16 *d = dO + i * HD;
	const float *o = O + i * HD;
	float a = 0.0f;
	for (int x = lane; x < HD; x += 32)
		a += __bfloat162float(d[x]) * o[x];
	for (int k = 16; k; k >>= 1)
		a += __shfl_xor_sync(0xffffffffu, a, k);
	if (lane == 0) {
		uint64_t b = tok / S, s = tok % S;
		D[(b * nh + h) * S + s] = a;
	}
}

/* ---- the kernels' building blocks ---------------------------------------------------
 *
 * What bounds a flash kernel on the H200 is the memory side and the
 * barriers (a first version with 32- and 16-bit fragment loads, one
 * shared-memory stage and 4-warp blocks ran the bench shape's forward at
 * 118 TFLOP/s and its backward at 88; this arrangement, 208 and 124):
 *  - fragments come out of shared memory by ldmatrix (one instruction for
 *    a 16x16 A fragment or two 16x8 B fragments; .trans gives V's, dO's,
 *    Q's and K's column-major B fragments);
 *  - the streamed tiles are fetched by cp.async into three stages: the
 *    next tile's copy is in flight while the current one is multiplied,
 *    and the stage a copy overwrites was left before the tile's one
 *    barrier;
 *  - blocks of 8 warps (128 rows in registers) halve the streamed traffic
 *    per row and the number of barriers per product;
 *  - the grid orders the longest tiles first over all heads (fl_block).
 * Scores and softmax are float32, P and dS rounded to bf16 for their
 * products, sums in a fixed order. */

#define FL_NW 8                 /* warps of a block */
#define FL_BTH (FL_NW * 32)
#define FL_BM (FL_NW * 16)     /* rows in registers */

/* The grids are (heads x sequences, tiles): blocks start (in
 * practice) in the order of their linear index, x fastest, so the tile
 * rank (blockIdx.y) orders the whole grid and the longest tiles, rank 0,
 * start first over every head and sequence (with the tile in x they are
 * ordered only within each head: a head's long tiles could start in the
 * last wave and make the tail). */
__device__ __forceinline__ void fl_block(int nhead, int *h, int *b)
{
	*h = blockIdx.x % nhead;
	*b = blockIdx.x / nhead;
}

/* rows r0.. (n of them) of a [*, st] bf16 matrix into a shared tile of
 * row stride HD + 8 by cp.async; rows at or past S are zeros (read from
 * row 0, which exists, with a source size of 0) */
template <int HD>
__device__ __forceinline__ void cp_tile(bf16 *sm, const bf16 *src, uint64_t st, int r0, int n,
					int S)
{
	constexpr int CPR = HD / 8;
	for (int i = threadIdx.x; i < n * CPR; i += FL_BTH) {
		int r = i / CPR, c = (i % CPR) * 8, ok = r0 + r < S;
		cp16(sm + r * (HD + 8) + c, src + (uint64_t)(ok ? r0 + r : 0) * st + c, ok ? 16 : 0);
	}
}

/* n floats of a row of S from index r0 (past S: zeros) by cp.async */
__device__ __forceinline__ void cp_row(float *sm, const float *src, int r0, int n, int S)
{
	for (int i = threadIdx.x; i < n; i += FL_BTH) {
		int ok = r0 + i < S;
		cp4(sm + i, src + (ok ? r0 + i : 0), ok ? 4 : 0);
	}
}

/* the streamed tiles, in keys or queries, and the blocks
 * per SM each kernel's register budget is set for (ptxas -v: no spills).
 * Up to head dim 64 the tiles are as small as it takes for two blocks
 * (16 warps) to share an SM: 32 rows where the 64-row tile's score
 * fragments would push the kernel past 128 registers; at 128 one block
 * per SM (the accumulators alone are 64 or 128 registers) and the dK/dV
 * kernel's Q/dO tile of 32 keeps it under 255. */
template <int HD>
struct fl_tiles {
	static constexpr int FWD = HD == 64 ? 32 : 64;
	static constexpr int DKV = HD >= 32 ? 32 : 64;
	static constexpr int DQ = 32;
	static constexpr int FWD_MIN = HD <= 64 ? 2 : 1;
	static constexpr int DKV_MIN = HD <= 64 ? 2 : 1;
	static constexpr int DQ_MIN = HD <= 64 ? 2 : 1;
};

/* grid (nh x B, query tiles of 128); K/V tiles in three stages */
template <int HD>
__global__ void __launch_bounds__(FL_BTH, fl_tiles<HD>::FWD_MIN)
k_flash_fwd(const bf16 *Q, const bf16 *K, const bf16 *V, float *O, float *LSE, int S, int nh,
	     int nkv, float sl2)
{
	constexpr int LD = HD + 8, KS = HD / 16, NO = HD / 8, BN = fl_tiles<HD>::FWD, NS = BN / 8;
	extern __shared__ uint4 fl_smem[];
	bf16 *sq = (bf16 *)fl_smem, *skv = sq + FL_BM * LD; /* stage i: K, V at 2 i BN LD */
	int h, b;
	fl_block(nh, &h, &b);
	int kh = h / (nh / nkv);
	/* the longest rows (the last tiles) first: the grid's tail is short */
	int q0 = (gridDim.y - 1 - blockIdx.y) * FL_BM, w = threadIdx.x >> 5;
	int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
	uint64_t qst = (uint64_t)nh * HD, kst = (uint64_t)nkv * HD;
	const bf16 *qb = Q + (uint64_t)b * S * qst + (uint64_t)h * HD;
	const bf16 *kb = K + (uint64_t)b * S * kst + (uint64_t)kh * HD;
	const bf16 *vb = V + (uint64_t)b * S * kst + (uint64_t)kh * HD;
	int rlo = q0 + w * 16 + g, rhi = rlo + 8, wlast = q0 + w * 16 + 15;
	int qlast = min(q0 + FL_BM, S) - 1, nkt = qlast / BN + 1;
	uint32_t qa[KS][4];
	float acc[NO][4], mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

	/* groups: Q with K/V tile 0, then tile 1 (empty past the last) */
	cp_tile<HD>(sq, qb, qst, q0, FL_BM, S);
	cp_tile<HD>(skv, kb, kst, 0, BN, S);
	cp_tile<HD>(skv + BN * LD, vb, kst, 0, BN, S);
	cp_commit();
	if (nkt > 1) {
		cp_tile<HD>(skv + 2 * BN * LD, kb, kst, BN, BN, S);
		cp_tile<HD>(skv + 3 * BN * LD, vb, kst, BN, BN, S);
	}
	cp_commit();
	cp_wait<1>();
	__syncthreads();
#pragma unroll
	for (int kk = 0; kk < KS; kk++)
		ldsm_a(qa[kk], sq, LD, w * 16, kk * 16);
#pragma unroll
	for (int n = 0; n < NO; n++)
		acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
	for (int kt = 0; kt < nkt; kt++) {
		int k0 = kt * BN;
		const bf16 *sk = skv + kt % 3 * 2 * BN * LD, *sv = sk + BN * LD;
		if (kt) {
			cp_wait<1>(); /* tile kt's group (only kt + 1's in flight) */
			__syncthreads();
		}
		/* three stages: tile kt + 2 goes where kt - 1 was, which every warp
		 * has left (it passed the barrier above): one barrier a tile */
		if (kt + 2 < nkt) {
			bf16 *nk = skv + (kt + 2) % 3 * 2 * BN * LD;
			cp_tile<HD>(nk, kb, kst, k0 + 2 * BN, BN, S);
			cp_tile<HD>(nk + BN * LD, vb, kst, k0 + 2 * BN, BN, S);
		}
		cp_commit();
		if (wlast >= k0) { /* else the warp's rows are all above this tile */
			float s[NS][4];
#pragma unroll
			for (int n = 0; n < NS; n++)
				s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
			for (int kk = 0; kk < KS; kk++) {
#pragma unroll
				for (int n = 0; n < NS; n += 2) {
					uint32_t bf[4];
					ldsm_bn(bf, sk, LD, kk * 16, n * 8);
					mma16816(s[n], qa[kk], bf);
					mma16816(s[n + 1], qa[kk], bf + 2);
				}
			}
			float m0 = -INFINITY, m1 = -INFINITY;
			int need = k0 + BN - 1 > q0 + w * 16 || k0 + BN > S;
#pragma unroll
			for (int n = 0; n < NS; n++) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int col = k0 + n * 8 + 2 * t + (e & 1), row = e < 2 ? rlo : rhi;
					float v = s[n][e] * sl2;
					if (need && (col > row || col >= S))
						v = -INFINITY;
					s[n][e] = v;
				}
				m0 = fmaxf(m0, fmaxf(s[n][0], s[n][1]));
				m1 = fmaxf(m1, fmaxf(s[n][2], s[n][3]));
			}
			m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
			m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
			m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
			m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
			float n0 = fmaxf(mx[0], m0), n1 = fmaxf(mx[1], m1);
			/* a row with nothing unmasked yet keeps exp2(-inf - 0) = 0 */
			float u0 = n0 == -INFINITY ? 0.0f : n0, u1 = n1 == -INFINITY ? 0.0f : n1;
			float al0 = exp2f(mx[0] - u0), al1 = exp2f(mx[1] - u1);
			float ps0 = 0.0f, ps1 = 0.0f;
			mx[0] = n0;
			mx[1] = n1;
#pragma unroll
			for (int n = 0; n < NS; n++) {
				s[n][0] = exp2f(s[n][0] - u0);
				s[n][1] = exp2f(s[n][1] - u0);
				s[n][2] = exp2f(s[n][2] - u1);
				s[n][3] = exp2f(s[n][3] - u1);
				ps0 += s[n][0] + s[n][1];
				ps1 += s[n][2] + s[n][3];
			}
			l[0] = l[0] * al0 + ps0;
			l[1] = l[1] * al1 + ps1;
#pragma unroll
			for (int n = 0; n < NO; n++) {
				acc[n][0] *= al0;
				acc[n][1] *= al0;
				acc[n][2] *= al1;
				acc[n][3] *= al1;
			}
#pragma unroll
			for (int j = 0; j < BN / 16; j++) {
				uint32_t pa[4];
				c2a(pa, s[2 * j], s[2 * j + 1]);
#pragma unroll
				for (int n = 0; n < NO; n += 2) {
					uint32_t bf[4];
					ldsm_bk(bf, sv, LD, j * 16, n * 8);
					mma16816(acc[n], pa, bf);
					mma16816(acc[n + 1], pa, bf + 2);
				}
			}
		}
	}
	/* the row sums were kept per lane: add the quad's four */
	for (int i = 0; i < 2; i++) {
		l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
		l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
	}
	for (int i = 0; i < 2; i++) {
		int row = i ? rhi : rlo;
		float inv = 1.0f / l[i];
		if (row >= S)
			continue;
		float *o = O + ((uint64_t)b * S + row) * qst + (uint64_t)h * HD + 2 * t;
#pragma unroll
		for (int n = 0; n < NO; n++)
			*(float2 *)(o + n * 8) = make_float2(acc[n][2 * i] * inv, acc[n][2 * i + 1] * inv);
		if (t == 0)
			LSE[((uint64_t)b * nh + h) * S + row] = mx[i] * FL_LN2 + logf(l[i]);
	}
}

/* The backward's two products of a tile, for the warp's 16 rows r0.. of
 * a1 and a2 (row-major [rows, HD] tiles) against the NS * 8 rows of the
 * streamed b1 and b2: p = a1 b1^T, dp = a2 b2^T (scores and dP, or their
 * transposes), float accumulators from zero */
template <int HD, int NS>
__device__ __forceinline__ void two_products(float p[NS][4], float dp[NS][4], const bf16 *a1,
					     const bf16 *a2, const bf16 *b1, const bf16 *b2,
					     int r0)
{
	constexpr int LD = HD + 8, KS = HD / 16;
#pragma unroll
	for (int n = 0; n < NS; n++) {
		p[n][0] = p[n][1] = p[n][2] = p[n][3] = 0.0f;
		dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
	}
#pragma unroll
	for (int kk = 0; kk < KS; kk++) {
		uint32_t x[4], y[4];
		ldsm_a(x, a1, LD, r0, kk * 16);
		ldsm_a(y, a2, LD, r0, kk * 16);
#pragma unroll
		for (int n = 0; n < NS; n += 2) {
			uint32_t bf[4];
			ldsm_bn(bf, b1, LD, kk * 16, n * 8);
			mma16816(p[n], x, bf);
			mma16816(p[n + 1], x, bf + 2);
			ldsm_bn(bf, b2, LD, kk * 16, n * 8);
			mma16816(dp[n], y, bf);
			mma16816(dp[n + 1], y, bf + 2);
		}
	}
}

/* dK, dV: grid (nkv x B, key tiles of 128); each warp 16 keys; for each of
 * the group's query heads in order, query tiles from the first one
 * the tile's keys see, in three stages (Q, dO, LSE, D) */
template <int HD>
__global__ void __launch_bounds__(FL_BTH, fl_tiles<HD>::DKV_MIN)
k_flash_dkv(const bf16 *Q, const bf16 *K, const bf16 *V, const bf16 *dO, const float *LSE,
	     const float *D, float *dK, float *dV, int S, int nh, int nkv, float sl2,
	     float scale)
{
	constexpr int LD = HD + 8, NO = HD / 8, BQ = fl_tiles<HD>::DKV, NS = BQ / 8;
	/* a stage: Q and dO tiles, then LSE and D of their BQ queries */
	constexpr int STG = 2 * BQ * LD + 4 * BQ; /* in bf16 units */
	extern __shared__ uint4 fl_smem[];
	bf16 *sk = (bf16 *)fl_smem, *sv = sk + FL_BM * LD, *stg = sv + FL_BM * LD;
	int kh, b, rep = nh / nkv;
	fl_block(nkv, &kh, &b);
	/* the longest key tiles (the first) first */
	int key0 = blockIdx.y * FL_BM, w = threadIdx.x >> 5;
	int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
	int klo = key0 + w * 16 + g, khi = klo + 8, wfirst = key0 + w * 16;
	int nqt = (S - key0 + BQ - 1) / BQ, nit = rep * nqt;
	uint64_t qst = (uint64_t)nh * HD, kst = (uint64_t)nkv * HD;
	float dk[NO][4], dv[NO][4];

#pragma unroll
	for (int n = 0; n < NO; n++)
		dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = dv[n][0] = dv[n][1] = dv[n][2] =
			dv[n][3] = 0.0f;
	cp_tile<HD>(sk, K + (uint64_t)b * S * kst + (uint64_t)kh * HD, kst, key0, FL_BM, S);
	cp_tile<HD>(sv, V + (uint64_t)b * S * kst + (uint64_t)kh * HD, kst, key0, FL_BM, S);
	/* iteration it: head kh * rep + it / nqt, queries from key0 + (it % nqt)
	 * BQ, in stage it % 3; groups: K, V with iteration 0's tiles, then 1's
	 * (empty past the last) */
	auto issue = [&](int it) {
		int h = kh * rep + it / nqt, q0 = key0 + it % nqt * BQ;
		bf16 *sq = stg + it % 3 * STG, *sdo = sq + BQ * LD;
		float *sl = (float *)(sdo + BQ * LD), *sd = sl + BQ;
		uint64_t hb = (uint64_t)b * S * qst + (uint64_t)h * HD;
		cp_tile<HD>(sq, Q + hb, qst, q0, BQ, S);
		cp_tile<HD>(sdo, dO + hb, qst, q0, BQ, S);
		cp_row(sl, LSE + ((uint64_t)b * nh + h) * S, q0, BQ, S);
		cp_row(sd, D + ((uint64_t)b * nh + h) * S, q0, BQ, S);
	};
	issue(0);
	cp_commit();
	if (nit > 1)
		issue(1);
	cp_commit();
	for (int it = 0; it < nit; it++) {
		cp_wait<1>(); /* iteration it's group (only it + 1's in flight) */
		__syncthreads();
		/* three stages: it + 2 goes where it - 1 was, which every warp has
		 * left (it passed the barrier above): one barrier an iteration */
		if (it + 2 < nit)
			issue(it + 2);
		cp_commit();
		int q0 = key0 + it % nqt * BQ;
		if (q0 + BQ - 1 >= wfirst) { /* else every query precedes the warp's keys */
			const bf16 *sq = stg + it % 3 * STG, *sdo = sq + BQ * LD;
			const float *sl = (const float *)(sdo + BQ * LD), *sd = sl + BQ;
			float p[NS][4], dp[NS][4];
			/* S^T = K Q^T and dP^T = V dO^T, 16 keys x BQ queries */
			two_products<HD, NS>(p, dp, sk, sv, sq, sdo, w * 16);
#pragma unroll
			for (int n = 0; n < NS; n++) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int qc = n * 8 + 2 * t + (e & 1), q = q0 + qc;
					int key = e < 2 ? klo : khi;
					float pv = 0.0f;
					if (q >= key && q < S)
						pv = exp2f(p[n][e] * sl2 - sl[qc] * FL_LOG2E);
					p[n][e] = pv;
					dp[n][e] = pv * (dp[n][e] - sd[qc]);
				}
			}
			/* dV += P^T dO, dK += dS^T Q (scale applied at the end) */
#pragma unroll
			for (int j = 0; j < BQ / 16; j++) {
				uint32_t pa[4], sa[4];
				c2a(pa, p[2 * j], p[2 * j + 1]);
				c2a(sa, dp[2 * j], dp[2 * j + 1]);
#pragma unroll
				for (int n = 0; n < NO; n += 2) {
					uint32_t bf[4];
					ldsm_bk(bf, sdo, LD, j * 16, n * 8);
					mma16816(dv[n], pa, bf);
					mma16816(dv[n + 1], pa, bf + 2);
					ldsm_bk(bf, sq, LD, j * 16, n * 8);
					mma16816(dk[n], sa, bf);
					mma16816(dk[n + 1], sa, bf + 2);
				}
			}
		}
	}
	for (int i = 0; i < 2; i++) {
		int key = i ? khi : klo;
		if (key >= S)
			continue;
		uint64_t off = ((uint64_t)b * S + key) * kst + (uint64_t)kh * HD + 2 * t;
#pragma unroll
		for (int n = 0; n < NO; n++) {
			*(float2 *)(dK + off + n * 8) =
				make_float2(dk[n][2 * i] * scale, dk[n][2 * i + 1] * scale);
			*(float2 *)(dV + off + n * 8) = make_float2(dv[n][2 * i], dv[n][2 * i + 1]);
		}
	}
}

/* dQ: grid (nh x B, query tiles of 128); each warp 16 queries; key tiles
 * up to the diagonal in three stages (K, V) */
template <int HD>
__global__ void __launch_bounds__(FL_BTH, fl_tiles<HD>::DQ_MIN)
k_flash_dq(const bf16 *Q, const bf16 *K, const bf16 *V, const bf16 *dO, const float *LSE,
	    const float *D, float *dQ, int S, int nh, int nkv, float sl2, float scale)
{
	constexpr int LD = HD + 8, NO = HD / 8, BK = fl_tiles<HD>::DQ, NS = BK / 8;
	extern __shared__ uint4 fl_smem[];
	bf16 *sq = (bf16 *)fl_smem, *sdo = sq + FL_BM * LD, *skv = sdo + FL_BM * LD;
	int h, b;
	fl_block(nh, &h, &b);
	int kh = h / (nh / nkv);
	/* the longest rows (the last tiles) first: the grid's tail is short */
	int q0 = (gridDim.y - 1 - blockIdx.y) * FL_BM, w = threadIdx.x >> 5;
	int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
	int rlo = q0 + w * 16 + g, rhi = rlo + 8, wlast = q0 + w * 16 + 15;
	int qlast = min(q0 + FL_BM, S) - 1, nkt = qlast / BK + 1;
	uint64_t qst = (uint64_t)nh * HD, kst = (uint64_t)nkv * HD;
	const bf16 *kb = K + (uint64_t)b * S * kst + (uint64_t)kh * HD;
	const bf16 *vb = V + (uint64_t)b * S * kst + (uint64_t)kh * HD;
	const float *lb = LSE + ((uint64_t)b * nh + h) * S, *db = D + ((uint64_t)b * nh + h) * S;
	float lse[2], dd[2], dq[NO][4];

	cp_tile<HD>(sq, Q + (uint64_t)b * S * qst + (uint64_t)h * HD, qst, q0, FL_BM, S);
	cp_tile<HD>(sdo, dO + (uint64_t)b * S * qst + (uint64_t)h * HD, qst, q0, FL_BM, S);
	cp_tile<HD>(skv, kb, kst, 0, BK, S);
	cp_tile<HD>(skv + BK * LD, vb, kst, 0, BK, S);
	cp_commit(); /* groups: Q, dO with K/V tile 0, then tile 1 (empty past the last) */
	if (nkt > 1) {
		cp_tile<HD>(skv + 2 * BK * LD, kb, kst, BK, BK, S);
		cp_tile<HD>(skv + 3 * BK * LD, vb, kst, BK, BK, S);
	}
	cp_commit();
	lse[0] = rlo < S ? lb[rlo] * FL_LOG2E : 0.0f;
	lse[1] = rhi < S ? lb[rhi] * FL_LOG2E : 0.0f;
	dd[0] = rlo < S ? db[rlo] : 0.0f;
	dd[1] = rhi < S ? db[rhi] : 0.0f;
#pragma unroll
	for (int n = 0; n < NO; n++)
		dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
	for (int kt = 0; kt < nkt; kt++) {
		int k0 = kt * BK;
		const bf16 *sk = skv + kt % 3 * 2 * BK * LD, *sv = sk + BK * LD;
		cp_wait<1>(); /* tile kt's group (only kt + 1's in flight) */
		__syncthreads();
		/* three stages, one barrier a tile (as the forward) */
		if (kt + 2 < nkt) {
			bf16 *nk = skv + (kt + 2) % 3 * 2 * BK * LD;
			cp_tile<HD>(nk, kb, kst, k0 + 2 * BK, BK, S);
			cp_tile<HD>(nk + BK * LD, vb, kst, k0 + 2 * BK, BK, S);
		}
		cp_commit();
		if (wlast >= k0) {
			float p[NS][4], dp[NS][4];
			/* S = Q K^T, dP = dO V^T, 16 queries x BK keys */
			two_products<HD, NS>(p, dp, sq, sdo, sk, sv, w * 16);
#pragma unroll
			for (int n = 0; n < NS; n++) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int col = k0 + n * 8 + 2 * t + (e & 1), i = e >> 1;
					int row = i ? rhi : rlo;
					float pv = 0.0f;
					if (col <= row && col < S)
						pv = exp2f(p[n][e] * sl2 - lse[i]);
					dp[n][e] = pv * (dp[n][e] - dd[i]);
				}
			}
			/* dQ += dS K */
#pragma unroll
			for (int j = 0; j < BK / 16; j++) {
				uint32_t sa[4];
				c2a(sa, dp[2 * j], dp[2 * j + 1]);
#pragma unroll
				for (int n = 0; n < NO; n += 2) {
					uint32_t bf[4];
					ldsm_bk(bf, sk, LD, j * 16, n * 8);
					mma16816(dq[n], sa, bf);
					mma16816(dq[n + 1], sa, bf + 2);
				}
			}
		}
	}
	for (int i = 0; i < 2; i++) {
		int row = i ? rhi : rlo;
		if (row >= S)
			continue;
		float *o = dQ + ((uint64_t)b * S + row) * qst + (uint64_t)h * HD + 2 * t;
#pragma unroll
		for (int n = 0; n < NO; n++)
			*(float2 *)(o + n * 8) = make_float2(dq[n][2 * i] * scale, dq[n][2 * i + 1] * scale);
	}
}

/* ---- launches ----------------------------------------------------------------------- */

static int check_shape(const struct ms_flash_shape *sh, struct ms_err *err)
{
	if (!sh || !sh->B || !sh->S || !sh->nh || !sh->nkv || sh->nh % sh->nkv)
		return ms_err_set(err, MS_EINVAL,
				  "flash attention: bad shape (B, S, heads >= 1, heads a "
				  "multiple of KV heads)");
	if (!ms_flash_supported(sh->hd))
		return ms_err_set(err, MS_EINVAL,
				  "flash attention: head dimension %u (16, 32, 64 or 128)", sh->hd);
	/* grid y and z, and int row arithmetic in the kernels */
	if (sh->nh > 65535 || sh->B > 65535 || sh->S > (1u << 30))
		return ms_err_set(err, MS_EINVAL, "flash attention: shape too large");
	return MS_OK;
}

static int aligned(const void *p)
{
	return p && !((uintptr_t)p & 15);
}

/* the grid (heads x sequences, tiles of 128) within CUDA's limits */
static int grid_ok(const struct ms_flash_shape *sh, uint32_t nhead, struct ms_err *err)
{
	if ((uint64_t)nhead * sh->B > 0x7fffffffu || (sh->S + FL_BM - 1) / FL_BM > 65535)
		return ms_err_set(err, MS_EINVAL, "flash attention: shape too large");
	return MS_OK;
}

template <int HD>
static int fwd_launch(const struct ms_flash_shape *sh, const bf16 *q, const bf16 *k,
		      const bf16 *v, float *o, float *lse, cudaStream_t st, struct ms_err *err)
{
	int rc = MS_OK;
	/* the Q tile and three stages of K, V */
	size_t smem = (size_t)(FL_BM + 6 * fl_tiles<HD>::FWD) * (HD + 8) * sizeof(bf16);
	float sl2 = (float)(FL_LOG2E / sqrt((double)HD));
	dim3 grid(sh->nh * sh->B, (sh->S + FL_BM - 1) / FL_BM);
	if ((rc = grid_ok(sh, sh->nh, err)))
		goto out;
	CK(cudaFuncSetAttribute(k_flash_fwd<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				(int)smem));
	k_flash_fwd<HD><<<grid, FL_BTH, smem, st>>>(q, k, v, o, lse, (int)sh->S, (int)sh->nh,
						       (int)sh->nkv, sl2);
	CK(cudaGetLastError());
out:
	return rc;
}

/* the dK, dV and dQ kernels (D made by k_flash_dot before) */
template <int HD>
static int bwd_kernels(const struct ms_flash_shape *sh, const bf16 *q, const bf16 *k,
		       const bf16 *v, const bf16 *dout, const float *lse, float *dq, float *dk,
		       float *dv, const float *D, cudaStream_t st, struct ms_err *err)
{
	int rc = MS_OK;
	constexpr int BQ = fl_tiles<HD>::DKV, BK = fl_tiles<HD>::DQ;
	/* dK, dV: the key tile's K and V, three stages of Q, dO and their LSE,
	 * D; dQ: the query tile's Q and dO, three stages of K and V */
	size_t smem_kv = (size_t)(2 * FL_BM + 6 * BQ) * (HD + 8) * sizeof(bf16) +
			 (size_t)6 * BQ * sizeof(float);
	size_t smem_q = (size_t)(2 * FL_BM + 6 * BK) * (HD + 8) * sizeof(bf16);
	double sc = 1.0 / sqrt((double)HD);
	float sl2 = (float)(FL_LOG2E * sc), scale = (float)sc;
	dim3 gkv(sh->nkv * sh->B, (sh->S + FL_BM - 1) / FL_BM);
	dim3 gq(sh->nh * sh->B, (sh->S + FL_BM - 1) / FL_BM);
	if ((rc = grid_ok(sh, sh->nh, err)))
		return rc;
	CK(cudaFuncSetAttribute(k_flash_dkv<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				(int)smem_kv));
	k_flash_dkv<HD><<<gkv, FL_BTH, smem_kv, st>>>(q, k, v, dout, lse, D, dk, dv, (int)sh->S,
							 (int)sh->nh, (int)sh->nkv, sl2, scale);
	CK(cudaGetLastError());
	CK(cudaFuncSetAttribute(k_flash_dq<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				(int)smem_q));
	k_flash_dq<HD><<<gq, FL_BTH, smem_q, st>>>(q, k, v, dout, lse, D, dq, (int)sh->S,
						      (int)sh->nh, (int)sh->nkv, sl2, scale);
	CK(cudaGetLastError());
out:
	return rc;
}

/* D first (k_flash_dot), then the dK/dV and the dQ kernels */
template <int HD>
static int bwd_launch(const struct ms_flash_shape *sh, const bf16 *q, const bf16 *k,
		      const bf16 *v, const float *o, const bf16 *dout, const float *lse, float *dq,
		      float *dk, float *dv, float *D, cudaStream_t st, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t rows = (uint64_t)sh->B * sh->S * sh->nh;
	if ((rows + 3) / 4 > 0x7fffffffull)
		return ms_err_set(err, MS_EINVAL, "flash attention: shape too large");
	k_flash_dot<HD><<<(unsigned)((rows + 3) / 4), FL_NTH, 0, st>>>(dout, o, D, (int)sh->S,
									(int)sh->nh, rows);
	CK(cudaGetLastError());
	return bwd_kernels<HD>(sh, q, k, v, dout, lse, dq, dk, dv, D, st, err);
out:
	return rc;
}

extern "C" int ms_flash_supported(uint32_t hd)
{
	return hd == 16 || hd == 32 || hd == 64 || hd == 128;
}

extern "C" uint64_t ms_flash_workspace_bytes(const struct ms_flash_shape *sh)
{
	return (uint64_t)sh->B * sh->nh * sh->S * sizeof(float);
}

extern "C" int ms_flash_fwd(const struct ms_flash_shape *sh, const void *q, const void *k,
			    const void *v, float *o, float *lse, void *stream, struct ms_err *err)
{
	int rc;
	const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v;
	cudaStream_t st = (cudaStream_t)stream;
	if ((rc = check_shape(sh, err)))
		return rc;
	if (!aligned(q) || !aligned(k) || !aligned(v) || !aligned(o) || !lse)
		return ms_err_set(err, MS_EINVAL, "flash attention: a pointer is NULL or not "
						  "16-byte aligned");
	switch (sh->hd) {
	case 16:
		return fwd_launch<16>(sh, Q, K, V, o, lse, st, err);
	case 32:
		return fwd_launch<32>(sh, Q, K, V, o, lse, st, err);
	case 64:
		return fwd_launch<64>(sh, Q, K, V, o, lse, st, err);
	default:
		return fwd_launch<128>(sh, Q, K, V, o, lse, st, err);
	}
}

extern "C" int ms_flash_bwd(const struct ms_flash_shape *sh, const void *q, const void *k,
			    const void *v, const float *o, const void *dout, const float *lse,
			    float *dq, float *dk, float *dv, void *ws, void *stream,
			    struct ms_err *err)
{
	int rc;
	const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v;
	const bf16 *dO = (const bf16 *)dout;
	float *D = (float *)ws;
	cudaStream_t st = (cudaStream_t)stream;
	if ((rc = check_shape(sh, err)))
		return rc;
	if (!aligned(q) || !aligned(k) || !aligned(v) || !aligned(o) || !aligned(dout) || !lse ||
	    !aligned(dq) || !aligned(dk) || !aligned(dv) || !ws)
		return ms_err_set(err, MS_EINVAL, "flash attention: a pointer is NULL or not "
						  "16-byte aligned");
	switch (sh->hd) {
	case 16:
		return bwd_launch<16>(sh, Q, K, V, o, dO, lse, dq, dk, dv, D, st, err);
	case 32:
		return bwd_launch<32>(sh, Q, K, V, o, dO, lse, dq, dk, dv, D, st, err);
	case 64:
		return bwd_launch<64>(sh, Q, K, V, o, dO, lse, dq, dk, dv, D, st, err);
	default:
		return bwd_launch<128>(sh, Q, K, V, o, dO, lse, dq, dk, dv, D, st, err);
	}
}
