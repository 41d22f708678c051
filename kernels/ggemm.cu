/*
 * ggemm.cu: the grouped expert GEMM (ggemm.h) on the bf16 tensor cores
 * through mma.sync m16n8k16 (mma.h), float32 accumulators and output.
 *
 * A block computes a BM x BN tile of one group's C with 8 warps, each
 * holding its WM x WN part in registers. A and B tiles of 32 along K
 * stream through shared-memory stages by cp.async (the copies of the next
 * stages in flight while one is multiplied; one barrier a stage), rows
 * padded by 16 bytes so that ldmatrix's eight row addresses fall in
 * distinct banks. Rows past the group's count and columns past N are
 * fetched as zeros (a cp.async of source size 0 reads nothing) and never
 * stored.
 *
 * Two shapes (ggemm.h's cfg), because which one is faster is the
 * device's to say: 128 x 128 with warps of 64 x 32 (120 registers, two
 * blocks an SM), and 128 x 256 with warps of 64 x 64, which reads half
 * the shared memory per product (an mma.sync kernel on Hopper is bounded
 * near there) at one block an SM.
 *
 * With an NVFP4 B (ms_ggemm.bq) a stage fetches B's codes (16 bytes a row)
 * instead of its bf16 values and the block decodes them into one bf16
 * tile after the stage's barrier, then a second barrier before the
 * products; the block's rows' scales for the whole K are read once, at
 * the start, into shared memory (cp.async's 4-byte granule does not fit
 * two scale bytes a row a stage). Every block decodes its B tile again,
 * so an expert's weights are decoded once per row tile: what this costs
 * against a separate decode into scratch is what t_ggemm_gpu --bench
 * measures.
 *
 * The grid is (column tiles, a bound on the row tiles of all groups): the
 * row tiles of group e are tiles[e] .. tiles[e+1]-1, so a block finds its
 * group by a binary search of tiles, and blocks past tiles[E] (the bound
 * is ceil(rows / 128) + E, the real count known only on the device) return
 * at once. Column tiles vary fastest, so the blocks running together share
 * their A tile in L2 and walk one expert's B at a time.
 *
 * Also here, over the same device offsets: the LoRA factors' grouped
 * weight gradients, in float32 on the CUDA cores (ms_ggemm_wgrad) and in
 * bf16 on the tensor cores (ms_ggemm_wgrad_bf16, the folded expert LoRA's
 * in train.cu), the float32 low-rank products (ms_ggemm_lowrank) and the
 * bf16 down product (ms_ggemm_lowrank_bf16), streamed through
 * shared-memory stages as the GEMM's A where the rows are 16-byte aligned.
 */
#include <cuda_bf16.h>

#include "gpu_internal.h"
#include "fp4.h"
#include "ggemm.h"
#include "mma.h"

#define GG_BM 128                      /* rows of a tile (ms_ggemm_index's) */
static_assert(GG_BM == MS_GGEMM_TILE_ROWS, "ggemm.h's tile rows");
#define GG_BK 32                       /* K of a stage */
#define GG_NTH 256                     /* 8 warps */
#define GG_LD (GG_BK + 8)              /* a shared row, in bf16 (80 bytes) */

/* a tile shape: BN_ columns, warps of WN_ columns (2 x (BN / WN) warps
 * of 64 rows), ST_ stages, MINB_ blocks an SM the registers are budgeted
 * for */
template <int BN_, int WN_, int ST_, int MINB_>
struct gg_cfg {
	static constexpr int BN = BN_, WN = WN_, ST = ST_, MINB = MINB_;
	static constexpr int WM = 64, MI = WM / 16, NJ = WN / 8;
	static constexpr int STAGE = (GG_BM + BN) * GG_LD;
	static constexpr int SMEM = ST * STAGE * (int)sizeof(bf16);
	/* NVFP4 B: a stage is A's tile and B's codes (16 bytes a row), then
	 * the decoded B tile, then the scales (BN rows of ks bytes) */
	static constexpr int QSTAGE = GG_BM * GG_LD + BN * 8;
	static constexpr int QDEC = ST * QSTAGE;
	static int qsmem(uint32_t ks)
	{
		return (QDEC + BN * GG_LD) * (int)sizeof(bf16) + (int)((BN * ks + 15) / 16 * 16);
	}
	static_assert((GG_BM / WM) * (BN / WN) == GG_NTH / 32, "8 warps");
};
typedef gg_cfg<128, 32, 4, 2> gg_narrow;
typedef gg_cfg<256, 64, 4, 1> gg_wide;

/* One stage: rows r0.. of A (up to r1, the group's end) and rows n0.. of
 * B (up to N), columns k0 .. k0 + 31, by 16-byte cp.async; K is a multiple
 * of 8, so a chunk of 8 is wholly inside K or wholly past it. */
/* A's part of a stage */
__device__ __forceinline__ void gg_stage_a(bf16 *sa, const struct ms_ggemm &p, const bf16 *A,
					   uint32_t r0, uint32_t r1, uint32_t k0)
{
	for (int i = threadIdx.x; i < GG_BM * (GG_BK / 8); i += GG_NTH) {
		int r = i >> 2, c = (i & 3) * 8;
		uint32_t k = k0 + c;
		int ok = r0 + r < r1 && k < p.K;
		cp16(sa + r * GG_LD + c, ok ? A + (uint64_t)(r0 + r) * p.lda + k : A, ok ? 16 : 0);
	}
}

/* The part of an NVFP4 B that holds row n, column k of B: the part, its
 * row and its column */
__device__ __forceinline__ const struct ms_ggemm_q4 *gg_part(const struct ms_ggemm_nvfp4 *q,
							   uint32_t n, uint32_t k,
							   uint32_t *pn, uint32_t *pk)
{
	int one = q->along_k ? k >= q->split : n >= q->split;
	*pn = n - (one && !q->along_k ? q->split : 0);
	*pk = k - (one && q->along_k ? q->split : 0);
	return &q->part[one];
}

/* An NVFP4 B's codes of a stage: rows n0.. (up to N), the 32 codes from
 * k0 (K is a multiple of 32, so a stage lies in one part along K) */
template <int BN>
__device__ __forceinline__ void gg_stage_q(uint8_t *sc, const struct ms_ggemm &p,
					   const struct ms_ggemm_nvfp4 *q, uint32_t n0,
					   uint32_t k0)
{
	for (int r = threadIdx.x; r < BN; r += GG_NTH) {
		uint32_t pn, pk;
		const struct ms_ggemm_q4 *pt = gg_part(q, n0 + r, k0, &pn, &pk);
		int ok = n0 + r < p.N;
		cp16(sc + r * 16, ok ? pt->codes + (uint64_t)pn * pt->code_stride + pk / 2 : pt->codes,
		     ok ? 16 : 0);
	}
}

/* Decode the stage's codes (BN rows of 32) into the bf16 tile sb, row
 * stride GG_LD: a thread a half row (16 codes, one scale) at a time */
template <int BN>
__device__ __forceinline__ void gg_decode(bf16 *sb, const uint8_t *sc, const uint8_t *ss,
					  uint32_t ks, const struct ms_ggemm_nvfp4 *q, uint32_t n0,
					  uint32_t k0)
{
	for (int i = threadIdx.x; i < 2 * BN; i += GG_NTH) {
		int r = i >> 1, h = i & 1;
		uint32_t pn, pk;
		const struct ms_ggemm_q4 *pt = gg_part(q, n0 + r, k0, &pn, &pk);
		float s = e4m3v(ss[(uint32_t)r * ks + k0 / 16 + h]);
		float f = pt->divide ? s / pt->tscale : s * pt->tscale;
		uint2 w = *(const uint2 *)(sc + r * 16 + h * 8);
		uint32_t o[8];
#pragma unroll
		for (int b = 0; b < 8; b++) {
			unsigned byte = ((b < 4 ? w.x : w.y) >> (8 * (b & 3))) & 255u;
			o[b] = pack2(e2m1v(byte & 15u) * f, e2m1v(byte >> 4) * f);
		}
		uint4 *d = (uint4 *)(sb + r * GG_LD + h * 16);
		d[0] = make_uint4(o[0], o[1], o[2], o[3]);
		d[1] = make_uint4(o[4], o[5], o[6], o[7]);
	}
}

template <int BN>
__device__ __forceinline__ void gg_stage(bf16 *sa, const struct ms_ggemm &p, const bf16 *A,
					 const bf16 *B, uint32_t r0, uint32_t r1, uint32_t n0,
					 uint32_t k0)
{
	bf16 *sb = sa + GG_BM * GG_LD;
	gg_stage_a(sa, p, A, r0, r1, k0);
	for (int i = threadIdx.x; i < BN * (GG_BK / 8); i += GG_NTH) {
		int r = i >> 2, c = (i & 3) * 8;
		uint32_t k = k0 + c;
		int ok = n0 + r < p.N && k < p.K;
		cp16(sb + r * GG_LD + c, ok ? B + (uint64_t)(n0 + r) * p.ldb + k : B, ok ? 16 : 0);
	}
}

/* Row tile y of all groups: its group *e and rows *r0 .. min(r0 + GG_BM,
 * *r1); 0 past the last tile (the grid's bound is above the real count).
 * The group is found by a binary search for tiles[e] <= y < tiles[e + 1];
 * groups without rows have tiles[e] == tiles[e + 1] and are passed over. */
__device__ __forceinline__ int gg_tile(const uint32_t *off, const uint32_t *tiles, uint32_t E,
				       uint32_t y, uint32_t *e, uint32_t *r0, uint32_t *r1)
{
	uint32_t lo = 0, hi = E;
	if (y >= tiles[E])
		return 0;
	while (hi - lo > 1) {
		uint32_t mid = (lo + hi) >> 1;
		if (tiles[mid] <= y)
			lo = mid;
		else
			hi = mid;
	}
	*e = lo;
	*r0 = off[lo] + (y - tiles[lo]) * GG_BM;
	*r1 = off[lo + 1];
	return 1;
}

template <class C, bool Q>
__global__ void __launch_bounds__(GG_NTH, C::MINB) k_ggemm(struct ms_ggemm p)
{
	constexpr int BN = C::BN, WN = C::WN, ST = C::ST;
	constexpr int SLOT = Q ? C::QSTAGE : C::STAGE;
	extern __shared__ uint4 gg_smem[];
	bf16 *sm = (bf16 *)gg_smem;
	uint32_t lo, r0, r1;
	if (!gg_tile(p.off, p.tiles, p.E, blockIdx.y, &lo, &r0, &r1))
		return;
	uint32_t n0 = blockIdx.x * BN;
	const bf16 *A = (const bf16 *)p.a, *B = NULL;
	const struct ms_ggemm_nvfp4 *q = NULL;
	int warp = threadIdx.x >> 5, wm = warp / (BN / WN), wn = warp % (BN / WN);
	int nk = (int)((p.K + GG_BK - 1) / GG_BK);
	uint32_t ks = p.K / 16;
	bf16 *sdec = sm + C::QDEC;                 /* NVFP4: the decoded B tile */
	uint8_t *ssc = (uint8_t *)(sdec + BN * GG_LD); /* and its rows' scales */
	float acc[C::MI][C::NJ][4];

	if constexpr (Q) {
		q = p.bq + lo;
		/* the rows' scales for the whole K (past N: zeros); the first
		 * barrier of the loop publishes them */
		for (uint32_t i = threadIdx.x; i < BN * ks; i += GG_NTH) {
			uint32_t r = i / ks, j = i % ks, pn, pk;
			const struct ms_ggemm_q4 *pt = gg_part(q, n0 + r, 16 * j, &pn, &pk);
			ssc[i] = n0 + r < p.N ? pt->scales[(uint64_t)pn * pt->scale_stride + pk / 16] : 0;
		}
	} else {
		B = (const bf16 *)p.b[lo];
	}

#pragma unroll
	for (int i = 0; i < C::MI; i++)
#pragma unroll
		for (int j = 0; j < C::NJ; j++)
#pragma unroll
			for (int h = 0; h < 4; h++)
				acc[i][j][h] = 0.0f;
	for (int s = 0; s < ST - 1; s++) {
		if (s < nk) {
			if constexpr (Q) {
				gg_stage_a(sm + s * SLOT, p, A, r0, r1, (uint32_t)s * GG_BK);
				gg_stage_q<BN>((uint8_t *)(sm + s * SLOT + GG_BM * GG_LD), p, q, n0,
					       (uint32_t)s * GG_BK);
			} else {
				gg_stage<BN>(sm + s * SLOT, p, A, B, r0, r1, n0, (uint32_t)s * GG_BK);
			}
		}
		cp_commit();
	}
	for (int kt = 0; kt < nk; kt++) {
		/* stage kt landed (at most ST - 2 later groups in flight), and
		 * every warp is past stage kt - 1, which the prefetch of
		 * kt + ST - 1 overwrites */
		cp_wait<ST - 2>();
		__syncthreads();
		if (kt + ST - 1 < nk) {
			bf16 *slot = sm + ((kt + ST - 1) % ST) * SLOT;
			uint32_t k0 = (uint32_t)(kt + ST - 1) * GG_BK;
			if constexpr (Q) {
				gg_stage_a(slot, p, A, r0, r1, k0);
				gg_stage_q<BN>((uint8_t *)(slot + GG_BM * GG_LD), p, q, n0, k0);
			} else {
				gg_stage<BN>(slot, p, A, B, r0, r1, n0, k0);
			}
		}
		cp_commit();
		const bf16 *sa = sm + (kt % ST) * SLOT, *sb = sa + GG_BM * GG_LD;
		if constexpr (Q) {
			/* every warp is past the previous tile's products (the
			 * barrier above): decode this stage's codes over it */
			gg_decode<BN>(sdec, (const uint8_t *)sb, ssc, ks, q, n0,
				      (uint32_t)kt * GG_BK);
			__syncthreads();
			sb = sdec;
		}
#pragma unroll
		for (int kk = 0; kk < GG_BK; kk += 16) {
			uint32_t af[C::MI][4], bq[C::NJ / 2][4];
#pragma unroll
			for (int i = 0; i < C::MI; i++)
				ldsm_a(af[i], sa, GG_LD, wm * C::WM + i * 16, kk);
#pragma unroll
			for (int j = 0; j < C::NJ / 2; j++)
				ldsm_bn(bq[j], sb, GG_LD, kk, wn * WN + j * 16);
#pragma unroll
			for (int i = 0; i < C::MI; i++)
#pragma unroll
				for (int j = 0; j < C::NJ; j++)
					mma16816(acc[i][j], af[i], &bq[j >> 1][(j & 1) * 2]);
		}
	}
	/* lane (g, t) holds rows g and g + 8 of each 16-row block, columns
	 * 2t and 2t + 1 of each 8-column block; N is a multiple of 8, so a
	 * pair is wholly inside N or wholly past it */
	int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
	for (int i = 0; i < C::MI; i++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			uint32_t row = r0 + wm * C::WM + i * 16 + g + 8 * h;
			if (row >= r1)
				continue;
			float *crow = p.c + (uint64_t)row * p.ldc;
#pragma unroll
			for (int j = 0; j < C::NJ; j++) {
				uint32_t col = n0 + wn * WN + j * 8 + 2 * t;
				if (col >= p.N)
					continue;
				float2 v = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
				if (p.accumulate) {
					float2 o = *(const float2 *)(crow + col);
					v.x += o.x;
					v.y += o.y;
				}
				*(float2 *)(crow + col) = v;
			}
		}
}

/* off and tiles as running sums of cnt and of ceil(cnt / GG_BM): one
 * block, a Hillis-Steele scan of both in shared memory */
__global__ void k_ggemm_index(const uint32_t *cnt, uint32_t E, uint32_t *off, uint32_t *tiles)
{
	__shared__ uint32_t sr[MS_GGEMM_MAX_E], st[MS_GGEMM_MAX_E];
	uint32_t e = threadIdx.x;
	uint32_t c = e < E ? cnt[e] : 0;
	sr[e] = c;
	st[e] = (c + GG_BM - 1) / GG_BM;
	__syncthreads();
	for (uint32_t d = 1; d < blockDim.x; d <<= 1) {
		uint32_t a = e >= d ? sr[e - d] : 0, b = e >= d ? st[e - d] : 0;
		__syncthreads();
		sr[e] += a;
		st[e] += b;
		__syncthreads();
	}
	if (e == 0)
		off[0] = tiles[0] = 0;
	if (e < E) {
		off[e + 1] = sr[e];
		tiles[e + 1] = st[e];
	}
}

#define GW_NTH 128    /* the weight gradient's block: a column each */
#define GW_ROWS 32    /* rows of U staged in shared memory at a time */

/* grid (column blocks of GW_NTH, E): the block's group's rows in chunks of
 * GW_ROWS, their U rows in shared memory (every thread reads the same
 * U[row, j]: a broadcast), X read once, coalesced; thread n keeps the R
 * sums of column n in registers (predicated up to the bound) */
__global__ void __launch_bounds__(GW_NTH) k_ggemm_wgrad(struct ms_ggemm_wgrad p)
{
	__shared__ float su[GW_ROWS][MS_GGEMM_WGRAD_MAX_R];
	uint32_t e = blockIdx.y, n = blockIdx.x * GW_NTH + threadIdx.x;
	uint32_t r0 = p.off[e], r1 = p.off[e + 1];
	float acc[MS_GGEMM_WGRAD_MAX_R];
#pragma unroll
	for (uint32_t j = 0; j < MS_GGEMM_WGRAD_MAX_R; j++)
		acc[j] = 0.0f;
	for (uint32_t c = r0; c < r1; c += GW_ROWS) {
		uint32_t nr = r1 - c < GW_ROWS ? r1 - c : GW_ROWS;
		__syncthreads();   /* the previous chunk's readers are done */
		for (uint32_t i = threadIdx.x; i < nr * p.R; i += GW_NTH)
			su[i / p.R][i % p.R] = p.u[(uint64_t)(c + i / p.R) * p.ldu + i % p.R];
		__syncthreads();
		if (n >= p.N)
			continue;
		/* unrolled by 8: the loads of eight rows in flight at once (one
		 * at a time, the kernel waited on memory latency: 0.55 TB/s on
		 * the H200); the sums keep their order */
#pragma unroll 8
		for (uint32_t i = 0; i < nr; i++) {
			float x = p.x[(uint64_t)(c + i) * p.ldx + n];
#pragma unroll
			for (uint32_t j = 0; j < MS_GGEMM_WGRAD_MAX_R; j++)
				if (j < p.R)
					acc[j] += su[i][j] * x;
		}
	}
	if (n >= p.N)
		return;
	float *g = p.g + (uint64_t)e * p.gstride;
#pragma unroll
	for (uint32_t j = 0; j < MS_GGEMM_WGRAD_MAX_R; j++)
		if (j < p.R) {
			float *d = p.trans ? g + (uint64_t)n * p.R + j : g + (uint64_t)j * p.N + n;
			*d = p.alpha * acc[j] + (p.accumulate ? *d : 0.0f);
		}
}

extern "C" int ms_ggemm_wgrad(const struct ms_ggemm_wgrad *p, void *stream, struct ms_err *err)
{
	int rc = MS_OK;
	if (!p->E || p->E > 65535 || !p->R || p->R > MS_GGEMM_WGRAD_MAX_R || !p->off || !p->u ||
	    !p->x || !p->g || p->ldu < p->R || p->ldx < p->N)
		return ms_err_set(err, MS_EINVAL, "grouped weight gradient: %u groups, rank %u "
				  "(1 .. %u), N %u: not covered, or a NULL pointer or short "
				  "stride", p->E, p->R, MS_GGEMM_WGRAD_MAX_R, p->N);
	if (!p->N)
		return MS_OK;
	k_ggemm_wgrad<<<dim3((p->N + GW_NTH - 1) / GW_NTH, p->E), GW_NTH, 0,
			(cudaStream_t)stream>>>(*p);
	CK(cudaGetLastError());
out:
	return rc;
}

/* k_wgrad_bf's blocks are 128 or 256 columns of X wide, a warp each 32
 * (wb_launch picks); the ring's depth overridable for
 * tools/bench/wgrad_probe.cu */
#ifndef WB_KC
#define WB_KC 32    /* rows a stage */
#endif
#ifndef WB_ST
#define WB_ST 4     /* stages in the ring (k_wgrad_bf) */
#endif

/* the runs a group of `rows` rows is cut into, of at most `most`: all of
 * them, or with run_rows as many as keep a run to about that many rows
 * (at least one) */
__device__ __forceinline__ uint32_t wb_runs(const struct ms_ggemm_wgrad_bf16 &p,
					    uint32_t rows, uint32_t most)
{
	if (most < 2 || !p.run_rows)
		return most < 2 ? 1 : most;
	uint32_t k = (rows + p.run_rows - 1) / p.run_rows;
	return k < 1 ? 1 : k > most ? most : k;
}

/* one stage of k_wgrad_bf: rows rb .. rb + WB_KC - 1 of X's block columns
 * and of U's R columns padded to RP, into shared memory, past r1, N or R
 * zeros; asynchronous (cp.async, one commit group) where U's rows are
 * 16-byte aligned with R a multiple of 8 (ua), else U by plain loads (a
 * sixteenth of the bytes, but each stage then waits for them) */
template <int RP, int NT>
__device__ __forceinline__ void wb_stage(bf16 (*sx)[NT + 8], bf16 (*su)[RP + 8],
					 const struct ms_ggemm_wgrad_bf16 &p, uint32_t rb,
					 uint32_t r1, uint32_t n0, bool ua)
{
	const bf16 *X = (const bf16 *)p.x, *U = (const bf16 *)p.u;
	for (int i = threadIdx.x; i < WB_KC * (NT / 8); i += NT) {
		int rr = i / (NT / 8), cc = i % (NT / 8) * 8;
		uint32_t row = rb + rr, col = n0 + cc;
		int ok = row < r1 && col < p.N;
		uint64_t xr = ok && p.xperm ? (uint32_t)p.xperm[row] / p.xdiv : row;
		cp16(&sx[rr][cc], ok ? X + xr * p.ldx + col : X, ok ? 16 : 0);
	}
	if (ua) {
		for (int i = threadIdx.x; i < WB_KC * (RP / 8); i += NT) {
			int rr = i / (RP / 8), cc = i % (RP / 8) * 8;
			uint32_t row = rb + rr;
			int ok = row < r1 && (uint32_t)cc < p.R;
			cp16(&su[rr][cc], ok ? U + (uint64_t)row * p.ldu + cc : U, ok ? 16 : 0);
		}
		cp_commit();
		return;
	}
	cp_commit();
	for (int i = threadIdx.x; i < WB_KC * RP; i += NT) {
		int rr = i / RP, cc = i % RP;
		uint32_t row = rb + rr;
		su[rr][cc] = row < r1 && (uint32_t)cc < p.R ? U[(uint64_t)row * p.ldu + cc]
							 : __float2bfloat16_rn(0.0f);
	}
}

/* grid (column slices of NT, E): the product as C [n, j] = sum_row
 * X[row, n] U[row, j], X^T the mma's A (ldmatrix .trans of X's rows), U
 * its B; warp w owns columns w*32 .. +31 (two m16 tiles) and all of the
 * rank, padded to R (a multiple of 16) with zero columns. WB_ST stages in
 * a ring, WB_ST - 1 of them loading while one is summed: the kernel is a
 * stream of X, and with two stages (one in flight) a block waited on
 * each load in turn. */
template <int R, int NT, bool DU>
__global__ void __launch_bounds__(NT) k_wgrad_bf(struct ms_ggemm_wgrad_bf16 p)
{
	/* dynamic, as uint4: 16-byte aligned for cp.async and ldmatrix
	 * (wb_smem_bytes) */
	extern __shared__ uint4 wb_smem[];
	bf16 (*sx)[WB_KC][NT + 8] = (bf16 (*)[WB_KC][NT + 8])wb_smem;
	bf16 (*su)[WB_KC][R + 8] =
		(bf16 (*)[WB_KC][R + 8])(wb_smem + WB_ST * WB_KC * (NT + 8) / 8);
	/* DU at a rank past 16 (the two-warp form below): W_e's rows of this
	 * column slice, [NT][R], after the ring */
	bf16 (*sw)[R + 8] = (bf16 (*)[R + 8])(wb_smem + WB_ST * WB_KC * (NT + 8) / 8 +
					      WB_ST * WB_KC * (R + 8) / 8);
	uint32_t e = blockIdx.y, n0 = blockIdx.x * NT;
	uint32_t r0 = p.off[e], r1 = p.off[e + 1];
	bool ua = p.R % 8 == 0 && p.ldu % 8 == 0 && (uintptr_t)p.u % 16 == 0;
	uint32_t ns = wb_runs(p, r1 - r0, gridDim.z);
	if (blockIdx.z >= ns)
		return;   /* a run this group does not have */
	int w = threadIdx.x >> 5, l = threadIdx.x & 31, i4 = l >> 3;
	const bf16 *W = DU ? (const bf16 *)p.w + (uint64_t)e * p.wstride : NULL;
	/* DU at rank 16: the B fragments of W_e's rows under this warp's 32
	 * columns (two k16 steps, two n8 tiles), in registers for the whole
	 * block: lane l's (k 2 (l % 4), +1 and +8, +9; n l / 4) */
	uint32_t wf[2][2][2] = {};
	if (DU && R == 16) {
#pragma unroll
		for (int t = 0; t < 2; t++)
#pragma unroll
			for (int h = 0; h < 2; h++)
#pragma unroll
				for (int q = 0; q < 2; q++) {
					const uint16_t *W16 = (const uint16_t *)W;
					uint32_t k = n0 + w * 32 + 16 * t + 2 * (l & 3) + 8 * q;
					uint32_t n = 8 * h + (l >> 2);
					uint16_t lo = 0, hi = 0;
					if (k < p.N)
						lo = W16[(uint64_t)k * p.ldw + n];
					if (k + 1 < p.N)
						hi = W16[(uint64_t)(k + 1) * p.ldw + n];
					wf[t][h][q] = (uint32_t)lo | (uint32_t)hi << 16;
				}
	}
	if (DU && R > 16) {
		/* its own commit group, ahead of the ring's: landed by the
		 * first stage's wait */
		for (int i = threadIdx.x; i < NT * (R / 8); i += NT) {
			int k = i / (R / 8), cc = i % (R / 8) * 8;
			int ok = n0 + k < p.N;
			cp16(&sw[k][cc], ok ? W + (uint64_t)(n0 + k) * p.ldw + cc : W, ok ? 16 : 0);
		}
		cp_commit();
	}
	if (ns > 1) {
		/* this block's run of the group's rows (blockIdx.z of ns) */
		uint32_t run = (r1 - r0 + ns - 1) / ns;
		run = (run + WB_KC - 1) / WB_KC * WB_KC;
		uint32_t a0 = r0 + blockIdx.z * run;
		r0 = a0 < r1 ? a0 : r1;
		r1 = r0 + run < r1 ? r0 + run : r1;
	}
	uint32_t nst = (r1 - r0 + WB_KC - 1) / WB_KC;
	float acc[2][R / 8][4];
#pragma unroll
	for (int t = 0; t < 2; t++)
#pragma unroll
		for (int q = 0; q < R / 8; q++)
#pragma unroll
			for (int c = 0; c < 4; c++)
				acc[t][q][c] = 0.0f;
	/* the ring's first WB_ST - 1 stages; every iteration then commits one
	 * group (empty past the last stage), so waiting until at most WB_ST -
	 * 1 are in flight always means stage s has landed */
#pragma unroll
	for (int s = 0; s < WB_ST - 1; s++) {
		if ((uint32_t)s < nst)
			wb_stage<R, NT>(sx[s], su[s], p, r0 + s * WB_KC, r1, n0, ua);
		else
			cp_commit();
	}
	for (uint32_t s = 0; s < nst; s++) {
		int b = s % WB_ST;
		uint32_t f = s + WB_ST - 1;
		if (f < nst)
			wb_stage<R, NT>(sx[f % WB_ST], su[f % WB_ST], p, r0 + f * WB_KC, r1, n0, ua);
		else
			cp_commit();
		cp_wait<WB_ST - 1>();
		__syncthreads();
#pragma unroll
		for (int k0 = 0; k0 < WB_KC; k0 += 16) {
			uint32_t a[2][4];
#pragma unroll
			for (int t = 0; t < 2; t++)
				ldsm4t(a[t], &sx[b][k0 + (l & 7) + 8 * (i4 >> 1)]
						[w * 32 + 16 * t + 8 * (i4 & 1)]);
#pragma unroll
			for (int q = 0; q < R / 16; q++) {
				uint32_t bb[4];
				ldsm_bk(bb, &su[b][0][0], R + 8, k0, 16 * q);
#pragma unroll
				for (int t = 0; t < 2; t++) {
					mma16816(acc[t][2 * q], a[t], bb);
					mma16816(acc[t][2 * q + 1], a[t], bb + 2);
				}
			}
		}
		if (DU && R == 16) {
			/* every warp the stage's 32 rows times its 32 columns'
			 * slice of W_e, then the warps' partials added in warp
			 * order through the stage's own buffer, read by now (a
			 * warp's [WB_KC][16] floats: NT / 32 of them fit in
			 * its WB_KC rows of NT + 8 bf16). Where two warps did
			 * a row tile's whole slice each, with W_e in shared
			 * memory, they set the stage's time (A/B on the H200:
			 * the fused launch 0.136 ms a layer) and W_e's slice
			 * cost blocks an SM. */
			float d[WB_KC / 16][2][4] = {};
#pragma unroll
			for (int t = 0; t < 2; t++)
#pragma unroll
				for (int mt = 0; mt < WB_KC / 16; mt++) {
					uint32_t a[4];
					ldsm_a(a, &sx[b][0][0], NT + 8, 16 * mt, w * 32 + 16 * t);
#pragma unroll
					for (int h = 0; h < 2; h++)
						mma16816(d[mt][h], a, wf[t][h]);
				}
			__syncthreads();
			float (*red)[WB_KC][16] = (float (*)[WB_KC][16])&sx[b][0][0];
#pragma unroll
			for (int mt = 0; mt < WB_KC / 16; mt++)
#pragma unroll
				for (int h = 0; h < 2; h++)
#pragma unroll
					for (int c = 0; c < 4; c++)
						red[w][16 * mt + (l >> 2) + 8 * (c >> 1)]
						   [8 * h + 2 * (l & 3) + (c & 1)] = d[mt][h][c];
			__syncthreads();
			float *dp = p.dpart + (uint64_t)blockIdx.x * p.drows * 16;
			for (int i = threadIdx.x; i < WB_KC * 16; i += NT) {
				uint32_t row = r0 + s * WB_KC + i / 16;
				float v = 0.0f;
				for (int q = 0; q < NT / 32; q++)
					v += red[q][i / 16][i % 16];
				if (row < r1)
					dp[(uint64_t)row * 16 + i % 16] = v;
			}
		}
		if (DU && R > 16 && w < WB_KC / 16) {
			/* the stage's rows 16 w .. +15 times W_e's slice: a warp
			 * a row tile over all NT columns, so no warp's partial
			 * needs another's (the kernel waits on X, not on these) */
			float d[R / 8][4];
#pragma unroll
			for (int q = 0; q < R / 8; q++)
#pragma unroll
				for (int c = 0; c < 4; c++)
					d[q][c] = 0.0f;
#pragma unroll 4
			for (int k0 = 0; k0 < NT; k0 += 16) {
				uint32_t a[4];
				ldsm_a(a, &sx[b][0][0], NT + 8, 16 * w, k0);
#pragma unroll
				for (int q = 0; q < R / 16; q++) {
					uint32_t bb[4];
					ldsm_bk(bb, &sw[0][0], R + 8, k0, 16 * q);
					mma16816(d[2 * q], a, bb);
					mma16816(d[2 * q + 1], a, bb + 2);
				}
			}
			float *dp = p.dpart + (uint64_t)blockIdx.x * p.drows * R;
#pragma unroll
			for (int q = 0; q < R / 8; q++)
#pragma unroll
				for (int c = 0; c < 4; c++) {
					uint32_t row = r0 + s * WB_KC + 16 * w + (l >> 2) + 8 * (c >> 1);
					if (row < r1)
						dp[(uint64_t)row * R + 8 * q + 2 * (l & 3) + (c & 1)] =
							d[q][c];
				}
		}
		/* the stage's readers are done before it is refilled */
		__syncthreads();
	}
	cp_wait<0>();
	float *g = p.g + (uint64_t)e * p.gstride;
	/* split: the raw partial sum, [R][N] of (split, group) */
	float *pt = p.part + ((uint64_t)blockIdx.z * gridDim.y + e) * p.R * p.N;
#pragma unroll
	for (int t = 0; t < 2; t++)
#pragma unroll
		for (int q = 0; q < R / 8; q++)
#pragma unroll
			for (int c = 0; c < 4; c++) {
				uint32_t n = n0 + w * 32 + 16 * t + (l >> 2) + 8 * (c >> 1);
				uint32_t j = 8 * q + 2 * (l & 3) + (c & 1);
				if (n >= p.N || j >= p.R)
					continue;
				if (ns > 1) {
					pt[(uint64_t)j * p.N + n] = acc[t][q][c];
					continue;
				}
				float *d = p.trans ? g + (uint64_t)n * p.R + j : g + (uint64_t)j * p.N + n;
				*d = p.alpha * acc[t][q][c] + (p.accumulate ? *d : 0.0f);
			}
}

/* the split form's second half: G_e = alpha * (sum over the splits, in
 * order, of the partials) (+ G_e) */
__global__ void k_wgrad_sum(struct ms_ggemm_wgrad_bf16 p)
{
	uint64_t rn = (uint64_t)p.R * p.N, n = (uint64_t)p.E * rn;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t e = i / rn, jn = i % rn, j = jn / p.N, c = jn % p.N;
		uint32_t ns = wb_runs(p, p.off[e + 1] - p.off[e], p.nsplit);
		float s = 0.0f;
		if (ns < 2)
			continue;   /* its one run's block wrote G */
		for (uint32_t z = 0; z < ns; z++)
			s += p.part[(uint64_t)z * n + i];
		float *d = p.g + e * p.gstride + (p.trans ? c * p.R + j : j * p.N + c);
		*d = p.alpha * s + (p.accumulate ? *d : 0.0f);
	}
}

/* DU's second half: DU[row, j] = dalpha * (the slices' partials, added
 * in slice order), rounded once to bf16 */
__global__ void k_wgrad_du_sum(struct ms_ggemm_wgrad_bf16 p, uint32_t RP, uint32_t nsl)
{
	uint64_t n = (uint64_t)p.off[p.E] * RP;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		float s = 0.0f;
		for (uint32_t z = 0; z < nsl; z++)
			s += p.dpart[z * p.drows * RP + i];
		((bf16 *)p.du)[i / RP * p.lddu + i % RP] = __float2bfloat16_rn(p.dalpha * s);
	}
}

/* k_wgrad_bf's shared memory: WB_ST stages of X's rows (NT wide) and U's;
 * with DU past rank 16, W_e's NT rows of this slice (at 16 they are in
 * registers, the blocks an SM holds those without DU) */
static size_t wb_smem_bytes(uint32_t R, uint32_t NT, bool du)
{
	return (size_t)(WB_ST * WB_KC * (NT + 8) + WB_ST * WB_KC * (R + 8) +
			(du && R > 16 ? NT * (R + 8) : 0)) * sizeof(bf16);
}

/* k_wgrad_bf<R, NT>'s launch over grid (columns, groups, splits), its shared
 * memory allowed past the default 48 KB where the ring needs it; with occ,
 * only the blocks an SM holds at once (nothing launched) */
template <int R, int NT, bool DU>
static int wb_launch(const struct ms_ggemm_wgrad_bf16 *p, uint32_t ns, cudaStream_t st,
		     int *occ, struct ms_err *err)
{
	int rc = MS_OK;
	size_t smem = wb_smem_bytes(R, NT, DU);
	if (smem > 48 * 1024)
		CK(cudaFuncSetAttribute(k_wgrad_bf<R, NT, DU>,
					cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	if (occ) {
		/* the device's answer, kept (one device a process) */
		static int known;
		if (!known)
			CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
				&known, k_wgrad_bf<R, NT, DU>, NT, smem));
		*occ = known;
		return MS_OK;
	}
	k_wgrad_bf<R, NT, DU><<<dim3((p->N + NT - 1) / NT, p->E, ns), NT, smem, st>>>(*p);
	CK(cudaGetLastError());
	if (DU) {
		uint64_t n = p->drows * R, nb = (n + 255) / 256;
		k_wgrad_du_sum<<<(unsigned)(nb < 4096 ? nb : 4096), 256, 0, st>>>(
			*p, R, (p->N + NT - 1) / NT);
	}
	CK(cudaGetLastError());
out:
	return rc;
}

/* The width of k_wgrad_bf's blocks whose grid fills the device's block
 * slots (SMs times the blocks each holds) best over whole waves: the
 * blocks of a launch do about the same work, so a last wave a few blocks
 * deep costs about a whole wave's time (tools/bench/wgrad_probe.cu, on
 * the H200 at the bench's shapes, one split: gate/up's N 1536 over 64
 * experts took 0.099 ms in blocks of 128 and 0.071 in 256, the down
 * input's N 768 0.041 and 0.052). 256 only where it fills strictly more. */
template <int R, bool DU>
static int wb_run(const struct ms_ggemm_wgrad_bf16 *p, uint32_t ns, cudaStream_t st,
		  struct ms_err *err)
{
	static int sms;
	int rc, dev = 0, o1 = 0, o2 = 0;
	if ((rc = wb_launch<R, 128, DU>(p, ns, st, &o1, err)) ||
	    (rc = wb_launch<R, 256, DU>(p, ns, st, &o2, err)))
		return rc;
	if (!sms && (cudaGetDevice(&dev) != cudaSuccess ||
		     cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
			     cudaSuccess))
		cudaGetLastError();
	double fill[2] = {0, 0};
	int occ[2] = {o1, o2}, nt[2] = {128, 256};
	for (int k = 0; k < 2; k++) {
		/* with run_rows, most groups' blocks past their first run return
		 * at once: counted as one run each */
		double b = (double)((p->N + nt[k] - 1) / nt[k]) * p->E * (p->run_rows ? 1 : ns),
		       slots = (double)occ[k] * sms;
		if (slots > 0)
			fill[k] = b / (__builtin_ceil(b / slots) * slots);
	}
	if (p->width)
		return p->width == 256 ? wb_launch<R, 256, DU>(p, ns, st, NULL, err)
				       : wb_launch<R, 128, DU>(p, ns, st, NULL, err);
	return fill[1] > fill[0] ? wb_launch<R, 256, DU>(p, ns, st, NULL, err)
				 : wb_launch<R, 128, DU>(p, ns, st, NULL, err);
}

extern "C" uint64_t ms_ggemm_wgrad_bf16_dpart(uint32_t N, uint32_t R, uint64_t drows)
{
	/* the narrower block width's slices: enough for either */
	return (uint64_t)((N + 127) / 128) * drows * ((R + 15) / 16 * 16);
}

extern "C" int ms_ggemm_wgrad_bf16(const struct ms_ggemm_wgrad_bf16 *p, void *stream,
				   struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t ns = p->nsplit > 1 ? p->nsplit : 1;
	if (!p->E || p->E > 65535 || !p->off || !p->u || !p->x || !p->g ||
	    (ns > 1 && (!p->part || ns > 64)))
		return ms_err_set(err, MS_EINVAL, "grouped weight gradient (bf16): %u groups, "
				  "%u splits (at most 64, with their partials) or a NULL pointer",
				  p->E, p->nsplit);
	if (!p->R || p->R > MS_GGEMM_WGRAD_BF16_MAX_R || p->N % 8 || p->ldx % 8 ||
	    p->ldu < p->R || p->ldx < p->N || (uintptr_t)p->x % 16 || (uintptr_t)p->u % 2 ||
	    (p->xperm && !p->xdiv) || (p->width && p->width != 128 && p->width != 256))
		return ms_err_set(err, MS_EINVAL, "grouped weight gradient (bf16): rank %u (1 .. "
				  "%u), N %u and X's stride %llu (multiples of 8, at least N), "
				  "U's stride %llu (at least R), X 16-byte aligned, a permutation's "
				  "divisor (at least 1), a width of 0, 128 or 256: not covered",
				  p->R, MS_GGEMM_WGRAD_BF16_MAX_R, p->N,
				  (unsigned long long)p->ldx, (unsigned long long)p->ldu);
	uint32_t rp = (p->R + 15) / 16 * 16;
	if (p->du && (!p->N || !p->w || !p->dpart || p->ldw < rp || p->ldw % 8 ||
		      p->wstride % 8 || (uintptr_t)p->w % 16 || (uintptr_t)p->du % 2 ||
		      p->lddu < rp))
		return ms_err_set(err, MS_EINVAL, "grouped weight gradient (bf16) with its "
				  "low-rank product: N of 0, W's stride %llu (a multiple of 8, at "
				  "least %u), W 16-byte aligned, DU's stride %llu (at least %u), "
				  "the partials' buffer: not covered",
				  (unsigned long long)p->ldw, rp, (unsigned long long)p->lddu, rp);
	if (!p->N)
		return MS_OK;
	switch (rp) {
	case 16:
		rc = p->du ? wb_run<16, true>(p, ns, (cudaStream_t)stream, err)
			   : wb_run<16, false>(p, ns, (cudaStream_t)stream, err);
		break;
	case 32:
		rc = p->du ? wb_run<32, true>(p, ns, (cudaStream_t)stream, err)
			   : wb_run<32, false>(p, ns, (cudaStream_t)stream, err);
		break;
	case 48:
		rc = p->du ? wb_run<48, true>(p, ns, (cudaStream_t)stream, err)
			   : wb_run<48, false>(p, ns, (cudaStream_t)stream, err);
		break;
	default:
		rc = p->du ? wb_run<64, true>(p, ns, (cudaStream_t)stream, err)
			   : wb_run<64, false>(p, ns, (cudaStream_t)stream, err);
		break;
	}
	if (rc)
		return rc;
	if (ns > 1) {
		uint64_t n = (uint64_t)p->E * p->R * p->N, nb = (n + 255) / 256;
		k_wgrad_sum<<<(unsigned)(nb < 4096 ? nb : 4096), 256, 0, (cudaStream_t)stream>>>(
			*p);
		CK(cudaGetLastError());
	}
out:
	return rc;
}

#define LR_KC 64    /* the down product's chunk of D staged at a time */

/* down: a block a row tile of one group, a thread a row; W_e's chunk of D
 * staged in shared memory as [d][j] (every thread reads the same element:
 * a broadcast), the row's R sums in registers */
__global__ void __launch_bounds__(GG_BM) k_lowrank_down(struct ms_ggemm_lowrank p)
{
	__shared__ float sw[LR_KC][MS_GGEMM_WGRAD_MAX_R];
	uint32_t e, r0, r1;
	if (!gg_tile(p.off, p.tiles, p.E, blockIdx.y, &e, &r0, &r1))
		return;
	uint64_t row = r0 + threadIdx.x;
	int ok = row < r1;
	const float *w = p.w + (uint64_t)e * p.wstride, *x = p.x + row * p.ldx;
	float acc[MS_GGEMM_WGRAD_MAX_R];
#pragma unroll
	for (uint32_t j = 0; j < MS_GGEMM_WGRAD_MAX_R; j++)
		acc[j] = 0.0f;
	for (uint32_t d0 = 0; d0 < p.D; d0 += LR_KC) {
		uint32_t nd = p.D - d0 < LR_KC ? p.D - d0 : LR_KC;
		__syncthreads();   /* the previous chunk's readers are done */
		for (uint32_t i = threadIdx.x; i < nd * p.R; i += GG_BM) {
			uint32_t d = i / p.R, j = i % p.R;
			sw[d][j] = p.wt ? w[(uint64_t)(d0 + d) * p.R + j] : w[(uint64_t)j * p.D + d0 + d];
		}
		__syncthreads();
		if (!ok)
			continue;
		/* unrolled: a thread's loads of its row in flight together (one
		 * at a time it waited on memory: 0.37 TB/s on the H200) */
#pragma unroll 16
		for (uint32_t d = 0; d < nd; d++) {
			float v = x[d0 + d];
#pragma unroll
			for (uint32_t j = 0; j < MS_GGEMM_WGRAD_MAX_R; j++)
				if (j < p.R)
					acc[j] += sw[d][j] * v;
		}
	}
	if (!ok)
		return;
	float *y = p.y + row * p.ldy;
#pragma unroll
	for (uint32_t j = 0; j < MS_GGEMM_WGRAD_MAX_R; j++)
		if (j < p.R)
			y[j] = p.alpha * acc[j] + (p.accumulate ? y[j] : 0.0f);
}

/* up: grid (column blocks of GG_BM, row tiles); the tile's rows of X (R
 * each) in shared memory, a thread a column with W_e's row of it in
 * registers, the rows in order (coalesced across the threads) */
__global__ void __launch_bounds__(GG_BM) k_lowrank_up(struct ms_ggemm_lowrank p)
{
	__shared__ float sx[GG_BM][MS_GGEMM_WGRAD_MAX_R];
	uint32_t e, r0, r1;
	if (!gg_tile(p.off, p.tiles, p.E, blockIdx.y, &e, &r0, &r1))
		return;
	uint32_t nr = r1 - r0 < GG_BM ? r1 - r0 : GG_BM, n = blockIdx.x * GG_BM + threadIdx.x;
	const float *w = p.w + (uint64_t)e * p.wstride;
	float wr[MS_GGEMM_WGRAD_MAX_R];
	for (uint32_t i = threadIdx.x; i < nr * p.R; i += GG_BM)
		sx[i / p.R][i % p.R] = p.x[(uint64_t)(r0 + i / p.R) * p.ldx + i % p.R];
	__syncthreads();
	if (n >= p.D)
		return;
#pragma unroll
	for (uint32_t j = 0; j < MS_GGEMM_WGRAD_MAX_R; j++)
		wr[j] = j < p.R ? (p.wt ? w[(uint64_t)j * p.D + n] : w[(uint64_t)n * p.R + j]) : 0.0f;
#pragma unroll 4
	for (uint32_t i = 0; i < nr; i++) {
		float s = 0.0f, *y = p.y + (uint64_t)(r0 + i) * p.ldy + n;
#pragma unroll
		for (uint32_t j = 0; j < MS_GGEMM_WGRAD_MAX_R; j++)
			if (j < p.R)
				s += sx[i][j] * wr[j];
		*y = p.alpha * s + (p.accumulate ? *y : 0.0f);
	}
}

extern "C" int ms_ggemm_lowrank(const struct ms_ggemm_lowrank *p, void *stream,
				struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t ytiles;
	if (!p->E || p->E > MS_GGEMM_MAX_E || !p->R || p->R > MS_GGEMM_WGRAD_MAX_R || !p->off ||
	    !p->tiles || !p->x || !p->w || !p->y || p->ldx < (p->up ? p->R : p->D) ||
	    p->ldy < (p->up ? p->D : p->R))
		return ms_err_set(err, MS_EINVAL, "grouped low-rank product: %u groups, rank %u "
				  "(1 .. %u): not covered, or a NULL pointer or short stride",
				  p->E, p->R, MS_GGEMM_WGRAD_MAX_R);
	if (!p->rows || !p->D)
		return MS_OK;
	ytiles = (p->rows + GG_BM - 1) / GG_BM + p->E;
	if (ytiles > 65535)
		return ms_err_set(err, MS_EINVAL, "grouped low-rank product: %llu rows: too many",
				  (unsigned long long)p->rows);
	if (p->up)
		k_lowrank_up<<<dim3((p->D + GG_BM - 1) / GG_BM, (unsigned)ytiles), GG_BM, 0,
			       (cudaStream_t)stream>>>(*p);
	else
		k_lowrank_down<<<dim3(1, (unsigned)ytiles), GG_BM, 0, (cudaStream_t)stream>>>(*p);
	CK(cudaGetLastError());
out:
	return rc;
}

#define LRB_KC 128  /* the bf16 down product's chunk of D staged at a time */

/* the bf16 down product where X or W_e is not 16-byte aligned (else
 * k_lowrank_pipe, below): a block (256 threads) a row tile of one group,
 * a warp 16 of its rows, the R outputs as R / 8 mma tiles of 16 x 8; X's
 * fragments loaded straight from global memory (each element once, a
 * lane two adjacent), W_e's chunk staged as [n][k] with rows padded so
 * that a fragment's eight rows fall in distinct banks */
__global__ void __launch_bounds__(256) k_lowrank_bf16(struct ms_ggemm_lowrank_bf16 p)
{
	__align__(16) __shared__ bf16 sw[MS_GGEMM_WGRAD_MAX_R][LRB_KC + 8];
	uint32_t e, r0, r1;
	if (!gg_tile(p.off, p.tiles, p.E, blockIdx.y, &e, &r0, &r1))
		return;
	uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, nt = p.R / 8;
	uint64_t ra = r0 + 16 * warp + lane / 4, rb = ra + 8;
	int va = ra < r1, vb = rb < r1, any = r0 + 16 * warp < r1;
	const bf16 *xa = (const bf16 *)p.x + ra * p.ldx, *xb = (const bf16 *)p.x + rb * p.ldx;
	const bf16 *w = (const bf16 *)p.w + (uint64_t)e * p.wstride;
	float c[MS_GGEMM_WGRAD_MAX_R / 8][4] = {};
	for (uint32_t d0 = 0; d0 < p.D; d0 += LRB_KC) {
		uint32_t nd = p.D - d0 < LRB_KC ? p.D - d0 : LRB_KC;
		__syncthreads();   /* the previous chunk's readers are done */
		for (uint32_t i = threadIdx.x; i < p.R * LRB_KC; i += blockDim.x) {
			uint32_t n = i / LRB_KC, k = i % LRB_KC;
			bf16 v = __float2bfloat16_rn(0.0f);
			if (k < nd)
				v = p.wt ? w[(uint64_t)(d0 + k) * p.R + n] : w[(uint64_t)n * p.D + d0 + k];
			sw[n][k] = v;
		}
		__syncthreads();
		if (!any)
			continue;
#pragma unroll 4
		for (uint32_t k = 0; k < nd; k += 16) {
			/* A's fragment: rows ra, rb; columns kc, kc + 1 and 8 on
			 * (nd is a multiple of 8: a pair is in or out whole) */
			uint32_t kc = d0 + k + 2 * (lane % 4), a[4];
			a[0] = va && kc < p.D ? *(const uint32_t *)(xa + kc) : 0u;
			a[1] = vb && kc < p.D ? *(const uint32_t *)(xb + kc) : 0u;
			a[2] = va && kc + 8 < p.D ? *(const uint32_t *)(xa + kc + 8) : 0u;
			a[3] = vb && kc + 8 < p.D ? *(const uint32_t *)(xb + kc + 8) : 0u;
#pragma unroll
			for (uint32_t t = 0; t < MS_GGEMM_WGRAD_MAX_R / 8; t++) {
				if (t >= nt)
					break;
				const bf16 *bn = &sw[8 * t + lane / 4][k + 2 * (lane % 4)];
				uint32_t b[2] = {*(const uint32_t *)bn, *(const uint32_t *)(bn + 8)};
				mma16816(c[t], a, b);
			}
		}
	}
	bf16 *ya = (bf16 *)p.y + ra * p.ldy, *yb = (bf16 *)p.y + rb * p.ldy;
#pragma unroll
	for (uint32_t t = 0; t < MS_GGEMM_WGRAD_MAX_R / 8; t++) {
		if (t >= nt)
			break;
		uint32_t col = 8 * t + 2 * (lane % 4);
		if (va)
			*(uint32_t *)(ya + col) = pack2(p.alpha * c[t][0], p.alpha * c[t][1]);
		if (vb)
			*(uint32_t *)(yb + col) = pack2(p.alpha * c[t][2], p.alpha * c[t][3]);
	}
}

/*
 * The bf16 down product streamed (k_lowrank_pipe), where X's rows and
 * W_e are 16-byte aligned (x and w 16-byte aligned, ldx and wstride
 * multiples of 8): the product reads X once and does 2 R flops a byte of
 * it, so it is bound by the memory, and k_lowrank_bf16's 4-byte loads of
 * X's fragments (half the sectors an instruction used) and W_e's scalar
 * staging between two barriers leave most of it idle.
 *
 * A block (4 warps, a warp 16 rows) takes half a row tile: at the
 * trainer's shapes about 1100 blocks of 100 or 200 KB of X, four an SM,
 * smaller and more even pieces for the SMs than whole tiles. X's rows
 * and W_e stream through LRP_ST shared-memory stages of LRP_KC columns
 * of D by 16-byte cp.async (the next stages in flight while one is
 * multiplied; one barrier a stage), then into the fragments by ldmatrix:
 * X's rows and W_e [R, D]'s rows padded to 144 bytes, W_e [D, R]'s (read
 * through ldmatrix .trans) to an odd number of 16 bytes, so that
 * ldmatrix's eight row addresses fall in distinct banks. W_e's chunk
 * rides with each stage (R x 64 bf16, 1 to 4 KiB, from L2 after
 * the first block of the group) rather than whole once a block: a stage
 * then holds for any D, and the extra reads (a quarter of X's bytes at
 * R = 16) are L2's, not the memory's.
 * Rows past the group and columns past D are fetched as zeros (a cp.async
 * of source size 0 reads nothing), so the k step of 16 that D ends 8 into
 * adds zeros; the sums run over D in order, as k_lowrank_bf16's, whatever
 * the timing. Y is stored from the accumulators as k_lowrank_bf16 does.
 */
#define LRP_BM 64                      /* rows of a block: half a tile */
static_assert(GG_BM % LRP_BM == 0, "a tile's halves");
#define LRP_KC 64                      /* D of a stage */
#define LRP_LD (LRP_KC + 8)            /* a shared row of X or W_e [R, D] (144 bytes) */
#define LRP_ST 4                       /* stages: three in flight */
#define LRP_NTH 128                    /* 4 warps of 16 rows */
static_assert(LRP_BM == 16 * (LRP_NTH / 32), "a warp 16 rows");

/* a rank's stage: X's LRP_BM rows, then W_e's chunk, [n][k] (RP rows:
 * ldmatrix reads 16 rows of W a load, those past R unused) or, stored
 * transposed, [k][n] (LDW: R + 8 or R + 16, an odd number of 16 bytes,
 * at least RP) */
template <int NT, int WT>
struct lrp_cfg {
	static constexpr int R = 8 * NT, RP = (R + 15) / 16 * 16;
	static constexpr int LDW = WT ? (NT % 2 ? R + 16 : R + 8) : LRP_LD;
	static constexpr int STAGE = LRP_BM * LRP_LD + (WT ? LRP_KC * LDW : RP * LRP_LD);
	static constexpr int SMEM = LRP_ST * STAGE * (int)sizeof(bf16);
};

/* One stage: rows r0.. (up to r1) of X and W_e's rows (or, transposed,
 * its rows k0..), columns k0 .. k0 + LRP_KC - 1 of D; D is a multiple of
 * 8, so a chunk of 8 is wholly inside D or wholly past it */
template <int NT, int WT>
__device__ __forceinline__ void lrp_stage(bf16 *s, const struct ms_ggemm_lowrank_bf16 &p,
					  const bf16 *x, const bf16 *w, uint32_t r0, uint32_t r1,
					  uint32_t k0)
{
	typedef lrp_cfg<NT, WT> C;
	bf16 *sw = s + LRP_BM * LRP_LD;
	/* eight lanes a row: a warp four 128-byte runs of X, a thread's
	 * copies issued back to back */
	static_assert(LRP_BM * (LRP_KC / 8) % LRP_NTH == 0, "whole rounds of X");
#pragma unroll
	for (int j = 0; j < LRP_BM * (LRP_KC / 8) / LRP_NTH; j++) {
		int i = (int)threadIdx.x + j * LRP_NTH;
		int r = i / (LRP_KC / 8), c = i % (LRP_KC / 8) * 8;
		int ok = r0 + r < r1 && k0 + c < p.D;
		cp16(s + r * LRP_LD + c, ok ? x + (uint64_t)(r0 + r) * p.ldx + k0 + c : x,
		     ok ? 16 : 0);
	}
	if constexpr (WT) {
		for (int i = threadIdx.x; i < LRP_KC * NT; i += LRP_NTH) {
			int k = i / NT, c = i % NT * 8;
			int ok = k0 + k < p.D;
			cp16(sw + k * C::LDW + c, ok ? w + (uint64_t)(k0 + k) * C::R + c : w,
			     ok ? 16 : 0);
		}
	} else {
		for (int i = threadIdx.x; i < C::R * (LRP_KC / 8); i += LRP_NTH) {
			int n = i / (LRP_KC / 8), c = i % (LRP_KC / 8) * 8;
			int ok = k0 + c < p.D;
			cp16(sw + n * LRP_LD + c, ok ? w + (uint64_t)n * p.D + k0 + c : w,
			     ok ? 16 : 0);
		}
	}
}

template <int NT, int WT>
__global__ void __launch_bounds__(LRP_NTH) k_lowrank_pipe(struct ms_ggemm_lowrank_bf16 p)
{
	typedef lrp_cfg<NT, WT> C;
	extern __shared__ uint4 lrp_smem[];
	bf16 *sm = (bf16 *)lrp_smem;
	uint32_t e, r0, r1;
	if (!gg_tile(p.off, p.tiles, p.E, blockIdx.y, &e, &r0, &r1))
		return;
	r0 += blockIdx.x * LRP_BM;
	if (r0 >= r1)
		return;
	uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	int nk = (int)((p.D + LRP_KC - 1) / LRP_KC), any = r0 + 16 * warp < r1;
	const bf16 *x = (const bf16 *)p.x, *w = (const bf16 *)p.w + (uint64_t)e * p.wstride;
	float c[NT][4];
#pragma unroll
	for (int t = 0; t < NT; t++)
#pragma unroll
		for (int h = 0; h < 4; h++)
			c[t][h] = 0.0f;
	for (int s = 0; s < LRP_ST - 1; s++) {
		if (s < nk)
			lrp_stage<NT, WT>(sm + s * C::STAGE, p, x, w, r0, r1, (uint32_t)s * LRP_KC);
		cp_commit();
	}
	for (int kt = 0; kt < nk; kt++) {
		/* stage kt landed (at most LRP_ST - 2 later groups in flight),
		 * and every warp is past stage kt - 1, which the prefetch of
		 * kt + LRP_ST - 1 overwrites */
		cp_wait<LRP_ST - 2>();
		__syncthreads();
		if (kt + LRP_ST - 1 < nk)
			lrp_stage<NT, WT>(sm + ((kt + LRP_ST - 1) % LRP_ST) * C::STAGE, p, x, w, r0,
					  r1, (uint32_t)(kt + LRP_ST - 1) * LRP_KC);
		cp_commit();
		/* a warp whose rows are all past the group only stages */
		if (!any)
			continue;
		const bf16 *sx = sm + (kt % LRP_ST) * C::STAGE, *sw = sx + LRP_BM * LRP_LD;
		uint32_t k0 = (uint32_t)kt * LRP_KC;
#pragma unroll
		for (int k = 0; k < LRP_KC; k += 16) {
			if (k0 + k >= p.D)
				break;
			uint32_t a[4];
			ldsm_a(a, sx, LRP_LD, 16 * warp, k);
#pragma unroll
			for (int t = 0; t < NT; t += 2) {
				uint32_t b[4];
				if constexpr (WT)
					ldsm_bk(b, sw, C::LDW, k, 8 * t);
				else
					ldsm_bn(b, sw, LRP_LD, k, 8 * t);
				mma16816(c[t], a, b);
				if (t + 1 < NT)
					mma16816(c[t + 1], a, b + 2);
			}
		}
	}
	if (!any)
		return;
	uint64_t ra = r0 + 16 * warp + lane / 4, rb = ra + 8;
	bf16 *ya = (bf16 *)p.y + ra * p.ldy, *yb = (bf16 *)p.y + rb * p.ldy;
#pragma unroll
	for (int t = 0; t < NT; t++) {
		uint32_t col = 8 * t + 2 * (lane % 4);
		if (ra < r1)
			*(uint32_t *)(ya + col) = pack2(p.alpha * c[t][0], p.alpha * c[t][1]);
		if (rb < r1)
			*(uint32_t *)(yb + col) = pack2(p.alpha * c[t][2], p.alpha * c[t][3]);
	}
}

template <int NT, int WT>
static int lrp_launch(const struct ms_ggemm_lowrank_bf16 *p, uint64_t ytiles, cudaStream_t st,
		      struct ms_err *err)
{
	int rc = MS_OK;
	typedef lrp_cfg<NT, WT> C;
	CK(cudaFuncSetAttribute(k_lowrank_pipe<NT, WT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				C::SMEM));
	k_lowrank_pipe<NT, WT><<<dim3(GG_BM / LRP_BM, (unsigned)ytiles), LRP_NTH, C::SMEM, st>>>(*p);
	CK(cudaGetLastError());
out:
	return rc;
}

template <int WT>
static int lrp_run(const struct ms_ggemm_lowrank_bf16 *p, uint64_t ytiles, cudaStream_t st,
		   struct ms_err *err)
{
	static_assert(MS_GGEMM_WGRAD_MAX_R == 32, "a kernel for each rank");
	switch (p->R) {
	case 8:
		return lrp_launch<1, WT>(p, ytiles, st, err);
	case 16:
		return lrp_launch<2, WT>(p, ytiles, st, err);
	case 24:
		return lrp_launch<3, WT>(p, ytiles, st, err);
	default:
		return lrp_launch<4, WT>(p, ytiles, st, err);
	}
}

extern "C" int ms_ggemm_lowrank_bf16(const struct ms_ggemm_lowrank_bf16 *p, void *stream,
				     struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t ytiles;
	if (!p->E || p->E > MS_GGEMM_MAX_E || !p->R || p->R % 8 || p->R > MS_GGEMM_WGRAD_MAX_R ||
	    p->D % 8 || !p->off || !p->tiles || !p->x || !p->w || !p->y || p->ldx < p->D ||
	    p->ldy < p->R || p->ldx % 2 || p->ldy % 2 || ((uintptr_t)p->x & 3) ||
	    ((uintptr_t)p->y & 3))
		return ms_err_set(err, MS_EINVAL, "grouped low-rank product (bf16): %u groups, rank "
				  "%u (a multiple of 8 up to %u), width %u (a multiple of 8): not "
				  "covered, or a NULL pointer, short or odd stride, or a pointer "
				  "not 4-byte aligned", p->E, p->R, MS_GGEMM_WGRAD_MAX_R, p->D);
	if (!p->rows || !p->D)
		return MS_OK;
	ytiles = (p->rows + GG_BM - 1) / GG_BM + p->E;
	if (ytiles > 65535)
		return ms_err_set(err, MS_EINVAL, "grouped low-rank product (bf16): %llu rows: too "
				  "many", (unsigned long long)p->rows);
	/* the streamed form where its 16-byte copies are aligned; else the
	 * 4-byte one */
	if (!((uintptr_t)p->x % 16) && !(p->ldx % 8) && !((uintptr_t)p->w % 16) &&
	    !(p->wstride % 8))
		return p->wt ? lrp_run<1>(p, ytiles, (cudaStream_t)stream, err)
			     : lrp_run<0>(p, ytiles, (cudaStream_t)stream, err);
	k_lowrank_bf16<<<dim3(1, (unsigned)ytiles), 256, 0, (cudaStream_t)stream>>>(*p);
	CK(cudaGetLastError());
out:
	return rc;
}

extern "C" int ms_ggemm_supported(uint32_t N, uint32_t K)
{
	return N % 8 == 0 && K % 8 == 0;
}

extern "C" int ms_ggemm_index(const uint32_t *cnt, uint32_t E, uint32_t *off, uint32_t *tiles,
			      void *stream, struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t nth = 32;
	if (!E || E > MS_GGEMM_MAX_E || !cnt || !off || !tiles)
		return ms_err_set(err, MS_EINVAL, "grouped GEMM: %u groups (1 .. %u) or a NULL "
						  "pointer", E, MS_GGEMM_MAX_E);
	while (nth < E)
		nth <<= 1;
	k_ggemm_index<<<1, nth, 0, (cudaStream_t)stream>>>(cnt, E, off, tiles);
	CK(cudaGetLastError());
out:
	return rc;
}

static int aligned(const void *p, uintptr_t n)
{
	return p && !((uintptr_t)p % n);
}

extern "C" int ms_ggemm_nvfp4_check(const struct ms_ggemm_nvfp4 *d, uint32_t N, uint32_t K,
				    struct ms_err *err)
{
	if (K % 32 || K > MS_GGEMM_NVFP4_MAX_K || N % 8)
		return ms_err_set(err, MS_EINVAL, "grouped GEMM, NVFP4 B: N %u, K %u: N must be a "
				  "multiple of 8 and K of 32, at most %u", N, K,
				  MS_GGEMM_NVFP4_MAX_K);
	if (d->along_k && d->split < K && d->split % 32)
		return ms_err_set(err, MS_EINVAL, "grouped GEMM, NVFP4 B: a split of K at %u is "
				  "not a multiple of 32", d->split);
	for (int i = 0; i < 2; i++) {
		const struct ms_ggemm_q4 *q = &d->part[i];
		uint32_t lim = d->along_k ? K : N, sp = d->split < lim ? d->split : lim;
		uint32_t pk = d->along_k ? (i ? K - sp : sp) : K;   /* the part's K */
		if (i == 1 && sp == lim)
			break;
		if (!aligned(q->codes, 16) || !q->scales || q->code_stride % 16 ||
		    q->code_stride < pk / 2 || q->scale_stride < pk / 16)
			return ms_err_set(err, MS_EINVAL, "grouped GEMM, NVFP4 B: part %d: codes "
					  "NULL or not 16-byte aligned, or a stride short or "
					  "(codes) not a multiple of 16", i);
	}
	return MS_OK;
}

template <class C, bool Q>
static int gg_launch(const struct ms_ggemm *p, uint64_t ytiles, cudaStream_t st,
		     struct ms_err *err)
{
	int rc = MS_OK;
	int smem = Q ? C::qsmem(p->K / 16) : C::SMEM;
	CK(cudaFuncSetAttribute(k_ggemm<C, Q>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	k_ggemm<C, Q><<<dim3((p->N + C::BN - 1) / C::BN, (unsigned)ytiles), GG_NTH, smem, st>>>(*p);
	CK(cudaGetLastError());
out:
	return rc;
}

extern "C" int ms_ggemm_run(const struct ms_ggemm *p, void *stream, struct ms_err *err)
{
	uint64_t ytiles;
	cudaStream_t st = (cudaStream_t)stream;
	if (!p->E || p->E > MS_GGEMM_MAX_E || !ms_ggemm_supported(p->N, p->K) ||
	    p->cfg > MS_GGEMM_WIDE)
		return ms_err_set(err, MS_EINVAL, "grouped GEMM: %u groups, N %u, K %u, shape "
						  "%d: not covered (1 .. %u groups, N and K "
						  "multiples of 8)", p->E, p->N, p->K, p->cfg,
				  MS_GGEMM_MAX_E);
	if (p->bq && (p->K % 32 || p->K > MS_GGEMM_NVFP4_MAX_K))
		return ms_err_set(err, MS_EINVAL, "grouped GEMM: an NVFP4 B needs K a multiple "
						  "of 32 up to %u (K %u)", MS_GGEMM_NVFP4_MAX_K,
				  p->K);
	if (!aligned(p->a, 16) || (!p->b && !p->bq) || !aligned(p->c, 8) || !p->off || !p->tiles ||
	    p->lda % 8 || p->ldb % 8 || p->ldc % 2 || p->lda < p->K || p->ldb < p->K ||
	    p->ldc < p->N)
		return ms_err_set(err, MS_EINVAL, "grouped GEMM: a pointer is NULL or "
						  "misaligned, or a row stride is short or "
						  "not a multiple of 8 (2 for C)");
	if (!p->rows || !p->N)
		return MS_OK;
	ytiles = (p->rows + GG_BM - 1) / GG_BM + p->E;
	if (ytiles > 65535 || p->rows > 0xffffffffull)
		return ms_err_set(err, MS_EINVAL, "grouped GEMM: %llu rows: too many",
				  (unsigned long long)p->rows);
	if (p->bq)
		return p->cfg == MS_GGEMM_NARROW ? gg_launch<gg_narrow, true>(p, ytiles, st, err)
						 : gg_launch<gg_wide, true>(p, ytiles, st, err);
	return p->cfg == MS_GGEMM_NARROW ? gg_launch<gg_narrow, false>(p, ytiles, st, err)
					 : gg_launch<gg_wide, false>(p, ytiles, st, err);
}
