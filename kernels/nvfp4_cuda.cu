/*
 * nvfp4_cuda.cu: the NVFP4 codec on the GPU (gpu.h), byte for byte the CPU
 * reference's (src/nvfp4.c). Byte layouts: nvfp4.h.
 *
 * How the bytes stay the reference's:
 *
 * - Block scales. The scale byte of a block is computed by a line-by-line
 *   port of ms_nvfp4_block_scale's first half (the same float32 operations
 *   in the same order, written with __fdiv_rn/__fmul_rn so that nvcc can
 *   neither contract them into FMAs nor use its approximate division), and
 *   the E4M3 encoder is the reference's bit algorithm.
 *
 * - Elements, without dividing. For a fixed scale byte s8 the code of x is
 *   a monotone step function of |x| in every recipe (x / f and x * inv are
 *   monotone under round-to-nearest, so are the clamps and the E2M1
 *   comparisons), with the sign nibble set iff x < 0 and the rounded
 *   quotient is not zero. So it is fully described by seven thresholds
 *   X1..X7 (code magnitude = number of Xk below |x|) and one sign
 *   threshold Xs (sign iff x < -Xs). The host finds them for each of the
 *   127 possible scale bytes by bisection over float bit patterns, calling
 *   the reference's own ms_nvfp4_encode_elem as the predicate: the table is
 *   exact by construction, for every recipe, and the kernels only compare.
 *   For bf16 input the thresholds are rounded down to bf16 (for a bf16 x,
 *   |x| > X iff |x| > bf16_rd(X)) and eight packed bf16x2 comparisons
 *   (HSET2) encode two elements at a time. A scale byte whose step
 *   function is not of that shape (a factor that underflowed to 0 makes
 *   code(0) = 7) makes the whole launch take the slow path.
 *
 * - The slow path (a warp that holds a NaN or Inf, or such a scale) is a
 *   port of the reference's element step (__fdiv_rn, __fmul_rn) with the
 *   reference's maxima (non-finite values left out when allowed).
 *
 * - Dequantization multiplies e2m1(code) by the block's decode factor,
 *   taken from a 256-entry table the host fills with the reference's
 *   ms_nvfp4_block_decode, and rounds to bf16 with the hardware's
 *   round-to-nearest-even. Where that factor is not finite the product is
 *   formed as x86-64 SSE forms it (NaN operands propagate, 0 * Inf is the
 *   negative default NaN), since those are the reference's bits there.
 *
 * Work layout of quantize and transpose: a CTA of 4 warps owns a tile of
 * 64 rows x 128 columns; a lane owns 8 rows x 8 columns (16-byte loads of
 * bf16), so a 1x16 row block spans a lane pair (lane ^ 1), a 16x1 column
 * block or a 16x16 tile spans lanes ^ 1 and ^ 16 of one warp: block maxima
 * are two shuffles, and both layouts come out of one read of the source.
 * The grid is persistent and walks tiles down the rows first; the next
 * tile is copied into shared memory (cp.async) while this one is encoded,
 * and the columnwise outputs leave through shared memory as whole 32-byte
 * sectors (see ColOut). What bounds the quantizer now is integer issue:
 * the exact encoding costs about 15 integer and logic instructions per
 * element and layout, and on the H200 the ALU pipe ran at 73% of its peak
 * with the memory system at 44% (1D, both layouts).
 */
#include "gpu_internal.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define FULL 0xffffffffu
#define NO_INDEX 0xffffffffffffffffull

enum { DT_BF16, DT_F32, DT_F16 };

/* ---- asynchronous copies to shared memory ------------------------------------ */

/* 16 bytes from global to shared memory, the bytes past src_bytes zeroed;
 * cached in L2 only (every byte is read once) */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes)
{
	unsigned d = (unsigned)__cvta_generic_to_shared(smem);

	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(gmem),
		     "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;");
}

/* wait until at most one group (the prefetch of the next tile) is pending */
__device__ __forceinline__ void cp_async_wait1(void)
{
	asm volatile("cp.async.wait_group 1;");
}

/* ---- device scalar steps (ports of nvfp4.c) -------------------------------- */

__device__ __forceinline__ uint32_t e4m3_enc(float x)
{
	uint32_t u = __float_as_uint(x), sign = (u >> 24) & 0x80u,
		 mag = u & 0x7fffffffu, code;

	if (mag > 0x7f800000u)
		return 0x7f;
	if (mag < 0x3c800000u) { /* below 2^-6: multiples of 2^-9 */
		float y = __fmul_rn(__uint_as_float(mag), 512.0f);
		uint32_t m = __float2uint_rz(y);
		float frac = __fsub_rn(y, __uint2float_rn(m));

		if (frac > 0.5f || (frac == 0.5f && (m & 1)))
			m++;
		code = m;
	} else {
		uint32_t r = (mag + 0x7ffffu + ((mag >> 20) & 1)) >> 20;

		code = r - ((127u - 7u) << 3);
		if (code > 0x7e)
			code = 0x7e;
	}
	return sign | code;
}

__device__ __forceinline__ float bf16_round_d(float x)
{
	uint32_t u = __float_as_uint(x);

	u += 0x7fffu + ((u >> 16) & 1);
	return __uint_as_float(u & 0xffff0000u);
}

/* ms_nvfp4_round_src for f16 (the reference's algorithm) */
__device__ __forceinline__ float f16_round_d(float x)
{
	float a = fabsf(x);

	if (!isfinite(x))
		return x;
	if (a >= 65520.0f)
		return copysignf(__int_as_float(0x7f800000), x);
	if (a < 0x1p-14f)
		return copysignf(__fmul_rn(rintf(__fmul_rn(a, 0x1p24f)), 0x1p-24f), x);
	uint32_t u = __float_as_uint(x);

	u += 0xfffu + ((u >> 13) & 1);
	return __uint_as_float(u & 0xffffe000u);
}

/* ms_nvfp4_block_scale's scale byte for a finite block maximum; sdt is the
 * source dtype (DT_*), which compressed-tensors' amax / 6 is rounded to. */
__device__ __forceinline__ uint32_t block_s8(int recipe, float bamax, float k0,
					     float k1, int sdt)
{
	if (recipe == MS_NVFP4_RECIPE_MODELOPT) {
		float pbs = __fdiv_rn(bamax, k1);

		if (pbs == 0.0f)
			pbs = 1.0f;
		if (pbs < 0x1p-9f)
			pbs = 0x1p-9f;
		if (pbs > 448.0f)
			pbs = 448.0f;
		return e4m3_enc(pbs);
	}
	if (recipe == MS_NVFP4_RECIPE_COMPRESSED_TENSORS) {
		float d6 = __fdiv_rn(bamax, 6.0f);
		float pre = __fmul_rn(k0, sdt == DT_BF16 ? bf16_round_d(d6)
					  : sdt == DT_F16 ? f16_round_d(d6) : d6);
		uint32_t s8;

		if (pre < 0.0f)
			pre = 0.0f;
		if (pre > 448.0f)
			pre = 448.0f;
		s8 = e4m3_enc(pre);
		return (s8 & 0x7f) == 0 ? 0x20u : s8;
	}
	return e4m3_enc(__fmul_rn(bamax, k0));
}

__device__ __forceinline__ uint32_t e2m1_enc(float q)
{
	float a = fabsf(q);
	uint32_t c;

	if (a <= 0.25f)
		c = 0;
	else if (a < 0.75f)
		c = 1;
	else if (a <= 1.25f)
		c = 2;
	else if (a < 1.75f)
		c = 3;
	else if (a <= 2.5f)
		c = 4;
	else if (a < 3.5f)
		c = 5;
	else if (a <= 5.0f)
		c = 6;
	else
		c = 7;
	if (q < 0.0f)
		c |= 8;
	return c;
}

/* ms_nvfp4_encode_elem. */
__device__ __forceinline__ uint32_t encode_exact(int recipe, float x, float f)
{
	float q;

	if (recipe == MS_NVFP4_RECIPE_TE)
		return e2m1_enc(__fmul_rn(x, f));
	q = __fdiv_rn(x, f);
	if (recipe == MS_NVFP4_RECIPE_COMPRESSED_TENSORS) {
		if (q < -6.0f)
			q = -6.0f;
		if (q > 6.0f)
			q = 6.0f;
	}
	return e2m1_enc(q);
}

/* ---- packed comparisons ------------------------------------------------------ */

/* per 16-bit half: 0xffff where a > b (bf16 compare), else 0 */
__device__ __forceinline__ uint32_t hgt(uint32_t a, uint32_t b)
{
	uint32_t r;

	asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
	return r;
}

__device__ __forceinline__ uint32_t hlt(uint32_t a, uint32_t b)
{
	uint32_t r;

	asm("set.lt.u32.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
	return r;
}

/* 0xffffffff where a > b (float compare, subnormals kept), else 0 */
__device__ __forceinline__ uint32_t fgt(float a, float b)
{
	uint32_t r;

	asm("set.gt.u32.f32 %0, %1, %2;" : "=r"(r) : "f"(a), "f"(b));
	return r;
}

__device__ __forceinline__ uint32_t flt(float a, float b)
{
	uint32_t r;

	asm("set.lt.u32.f32 %0, %1, %2;" : "=r"(r) : "f"(a), "f"(b));
	return r;
}

/*
 * Eight codes from four bf16x2 words P[p] = (element p, element p + 4) and
 * the block's thresholds t (t0.x..t1.z: X1..X7 as bf16 pairs; t1.w: -Xs).
 * Per pair the seven masks (0xffff per passing half) are summed as one
 * 32-bit integer: s = -sum = n_lo + (n_hi - n_lo) * 2^16 (mod 2^32), and
 * s * 0x10001 = n_lo + n_hi * 2^16, which lands the two counts on nibbles
 * p and p + 4 when multiplied by 0x10001 << 4p. Counts are at most 7, so
 * nothing carries between nibbles. Nibble i of the result is element i.
 */
__device__ __forceinline__ uint32_t enc8_bf16(const uint32_t P[4], uint4 t0,
					      uint4 t1)
{
	uint32_t acc = 0;

#pragma unroll
	for (int p = 0; p < 4; p++) {
		uint32_t x = P[p], ax = x & 0x7fff7fffu;
		uint32_t s = 0u - hgt(ax, t0.x) - hgt(ax, t0.y) - hgt(ax, t0.z) -
			     hgt(ax, t0.w) - hgt(ax, t1.x) - hgt(ax, t1.y) -
			     hgt(ax, t1.z);

		acc += s * (0x10001u << (4 * p));
		acc |= hlt(x, t1.w) & (0x00080008u << (4 * p));
	}
	return acc;
}

/* The same for eight float32 elements; t holds X1..X7, -Xs as floats. */
__device__ __forceinline__ uint32_t enc8_f32(const float x[8], uint4 t0, uint4 t1)
{
	const float T0 = __uint_as_float(t0.x), T1 = __uint_as_float(t0.y),
		    T2 = __uint_as_float(t0.z), T3 = __uint_as_float(t0.w),
		    T4 = __uint_as_float(t1.x), T5 = __uint_as_float(t1.y),
		    T6 = __uint_as_float(t1.z), TS = __uint_as_float(t1.w);
	uint32_t acc = 0;

#pragma unroll
	for (int i = 0; i < 8; i++) {
		float a = fabsf(x[i]);
		uint32_t s = 0u - fgt(a, T0) - fgt(a, T1) - fgt(a, T2) - fgt(a, T3) -
			     fgt(a, T4) - fgt(a, T5) - fgt(a, T6);

		s |= flt(x[i], TS) & 8u;
		acc |= s << (4 * i);
	}
	return acc;
}

/* r[k] nibble i = code(row k, col i)  ->  r[j] nibble i = code(row i, col j) */
__device__ __forceinline__ void nib_transpose8(uint32_t r[8])
{
#pragma unroll
	for (int k = 0; k < 8; k += 2) {
		uint32_t t = ((r[k] >> 4) ^ r[k + 1]) & 0x0f0f0f0fu;

		r[k + 1] ^= t;
		r[k] ^= t << 4;
	}
#pragma unroll
	for (int k = 0; k < 8; k++) {
		if (k & 2)
			continue;
		uint32_t t = ((r[k] >> 8) ^ r[k + 2]) & 0x00ff00ffu;

		r[k + 2] ^= t;
		r[k] ^= t << 8;
	}
#pragma unroll
	for (int k = 0; k < 4; k++) {
		uint32_t t = ((r[k] >> 16) ^ r[k + 4]) & 0x0000ffffu;

		r[k + 4] ^= t;
		r[k] ^= t << 16;
	}
}

/* ---- amax ------------------------------------------------------------------------ */

struct AStatus {
	unsigned long long first_bad; /* flat index of the first NaN/Inf */
	unsigned int max_bits;        /* float bits of the largest finite |x| */
	unsigned int pad;
};

/* |x| of element raw (its 16 or 32 bits) as float bits, and whether finite */
template <int DT>
__device__ __forceinline__ uint32_t abs_bits(uint32_t raw, bool *finite)
{
	if (DT == DT_BF16) {
		*finite = (raw & 0x7f80u) != 0x7f80u;
		return (raw & 0x7fffu) << 16;
	}
	if (DT == DT_F16) {
		*finite = (raw & 0x7c00u) != 0x7c00u;
		return __float_as_uint(fabsf(__half2float(__ushort_as_half((unsigned short)raw))));
	}
	*finite = (raw & 0x7f800000u) != 0x7f800000u;
	return raw & 0x7fffffffu;
}

template <int DT>
__device__ __forceinline__ uint32_t elem_raw(const void *src, long long i)
{
	if (DT == DT_F32)
		return ((const uint32_t *)src)[i];
	return ((const uint16_t *)src)[i];
}

template <int DT>
__device__ __forceinline__ void amax_elem(const void *src, long long i,
					  long long base, int allow, AStatus *st,
					  uint32_t *m)
{
	bool fin;
	uint32_t b = abs_bits<DT>(elem_raw<DT>(src, i), &fin);

	if (fin)
		*m = b > *m ? b : *m;
	else if (!allow)
		atomicMin(&st->first_bad, (unsigned long long)(base + i));
}

template <int DT>
__global__ void __launch_bounds__(256) amax_kernel(const void *src, long long n,
						   long long base, int allow,
						   int vec, AStatus *st)
{
	const int EPU = DT == DT_F32 ? 4 : 8; /* elements per 16-byte unit */
	const uint32_t NF = DT == DT_BF16 ? 0x7f80u : 0x7c00u;
	const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	const long long nth = (long long)gridDim.x * blockDim.x;
	__shared__ uint32_t s_red[8];
	uint32_t m = 0, m16 = 0;
	long long done = 0;

	if (vec) {
		const long long nu = n / EPU;
		const uint4 *u = (const uint4 *)src;

		for (long long i = tid; i < nu; i += 4 * nth) {
			uint4 q[4];

#pragma unroll
			for (int k = 0; k < 4; k++) {
				long long j = i + k * nth;

				q[k] = j < nu ? __ldcs(u + j) : make_uint4(0, 0, 0, 0);
			}
#pragma unroll
			for (int k = 0; k < 4; k++) {
				long long j = i + k * nth;
				bool bad;

				if (j >= nu)
					break;
				if (DT == DT_F32) {
					uint32_t a0 = q[k].x & 0x7fffffffu, a1 = q[k].y & 0x7fffffffu,
						 a2 = q[k].z & 0x7fffffffu, a3 = q[k].w & 0x7fffffffu;
					uint32_t mm = max(max(a0, a1), max(a2, a3));

					bad = mm >= 0x7f800000u;
					if (!bad)
						m = mm > m ? mm : m;
				} else {
					uint32_t mm = __vmaxu2(__vmaxu2(q[k].x & 0x7fff7fffu, q[k].y & 0x7fff7fffu),
							       __vmaxu2(q[k].z & 0x7fff7fffu, q[k].w & 0x7fff7fffu));

					bad = (mm & 0xffffu) >= NF || (mm >> 16) >= NF;
					if (!bad)
						m16 = __vmaxu2(m16, mm);
				}
				if (bad) {
					for (int e = 0; e < EPU; e++)
						amax_elem<DT>(src, j * EPU + e, base, allow, st, &m);
				}
			}
		}
		done = nu * EPU;
		if (DT != DT_F32) {
			uint32_t h = max(m16 & 0xffffu, m16 >> 16);
			bool fin;

			h = abs_bits<DT>(h, &fin);
			m = h > m ? h : m;
		}
	}
	for (long long i = done + tid; i < n; i += nth)
		amax_elem<DT>(src, i, base, allow, st, &m);
	for (int o = 16; o; o >>= 1) {
		uint32_t x = __shfl_xor_sync(FULL, m, o);

		m = x > m ? x : m;
	}
	if ((threadIdx.x & 31) == 0)
		s_red[threadIdx.x >> 5] = m;
	__syncthreads();
	if (threadIdx.x == 0) {
		for (int w = 1; w < (int)(blockDim.x >> 5); w++)
			m = s_red[w] > m ? s_red[w] : m;
		atomicMax(&st->max_bits, m);
	}
}

/* ---- quantize ------------------------------------------------------------------ */

struct QStatus {
	unsigned long long first_bad; /* flat index of the first NaN/Inf */
	unsigned int over;            /* float bits of the largest block max > amax */
	unsigned int pad;
};

#define QT_ROWS 64
#define QT_COLS 128
#define QT_THREADS 128
/* words per row of the columnwise staging area: 128 columns plus one pad
 * word per 8, so that a warp's 32 stores hit 32 different banks */
#define CT_STRIDE 144

/*
 * The columnwise outputs of a tile go through shared memory: each lane
 * leaves its 4-byte pieces there, then the CTA writes every column's 32
 * bytes as two 16-byte stores. Written directly they would be 8-byte
 * pieces of 16 different rows per instruction, and the number of L2
 * requests, not bytes, bounded the kernels (measured: 16% of the copy
 * bandwidth that way for 1D quantization into both layouts).
 */
struct ColOut {
	uint8_t *packed_t, *scales_t; /* [cols, rp/2], [cols, rp/16] */
	long long cols, rp;
	int vec16, vec4s, vec_out;    /* 16-byte packed, 4-byte scale, 4-byte stores */
};

struct ColStage {
	uint32_t ct[8 * CT_STRIDE];   /* word (row group 2w+h) of column c */
	uint32_t cs[QT_COLS];         /* byte w: scale of rows 16w.. of column c */
};

/* lane's share: cc[j] = codes of rows 8h..8h+7 (of warp w) of column 8g+j;
 * cs_lo/hi = scale bytes of its columns 0-3 / 4-7 */
__device__ __forceinline__ void stage_col(ColStage *sm, int w, int lane, const uint32_t cc[8],
					  uint32_t cs_lo, uint32_t cs_hi)
{
	const int g = lane & 15, h = lane >> 4;
	uint8_t *csb = (uint8_t *)sm->cs;
	uint32_t sw = h ? cs_hi : cs_lo;

#pragma unroll
	for (int j = 0; j < 8; j++)
		sm->ct[(2 * w + h) * CT_STRIDE + 8 * g + j + g] = cc[j];
#pragma unroll
	for (int i = 0; i < 4; i++)
		csb[(8 * g + 4 * h + i) * 4 + w] = (uint8_t)(sw >> (8 * i));
}

/* the whole CTA, between two barriers: tile (rt, ct) of the staging area
 * to global memory; bytes at or past row rp (absent warps) are not written */
__device__ __forceinline__ void flush_col(const ColOut &o, long long rt, long long ct,
					  const ColStage *sm)
{
	const long long pp = o.rp / 2, sp = o.rp / 16;

	for (int q = threadIdx.x; q < 2 * QT_COLS; q += blockDim.x) {
		const int cl = q >> 1, half = q & 1;
		const long long c = ct * QT_COLS + cl, boff = rt * 32 + 16 * half;
		uint32_t wv[4];

		if (c >= o.cols || boff >= pp)
			continue;
#pragma unroll
		for (int i = 0; i < 4; i++)
			wv[i] = sm->ct[(4 * half + i) * CT_STRIDE + cl + (cl >> 3)];
		uint8_t *d = o.packed_t + c * pp + boff;

		if (o.vec16 && boff + 16 <= pp) {
			*(uint4 *)d = make_uint4(wv[0], wv[1], wv[2], wv[3]);
			continue;
		}
		for (int i = 0; i < 4; i++) {
			if (boff + 4 * i + 4 > pp)
				break;
			if (o.vec_out) {
				*(uint32_t *)(d + 4 * i) = wv[i];
			} else {
				for (int b = 0; b < 4; b++)
					d[4 * i + b] = (uint8_t)(wv[i] >> (8 * b));
			}
		}
	}
	for (int cl = threadIdx.x; cl < QT_COLS; cl += blockDim.x) {
		const long long c = ct * QT_COLS + cl, so = rt * 4;
		const uint32_t sw = sm->cs[cl];
		uint8_t *d = o.scales_t + c * sp + so;

		if (c >= o.cols || so >= sp)
			continue;
		if (o.vec4s && so + 4 <= sp) {
			*(uint32_t *)d = sw;
		} else {
			for (int b = 0; b < 4 && so + b < sp; b++)
				d[b] = (uint8_t)(sw >> (8 * b));
		}
	}
}

struct QArgs {
	const void *src;
	long long rows, cols;     /* src [rows, cols], row pitch cols */
	long long cp, rp;         /* roundup16(cols), roundup16(rows) */
	long long row_base;       /* rows before this one, for error indices */
	uint8_t *packed, *scales;     /* rowwise [rows, cp/2], [rows, cp/16] */
	ColOut co;                    /* columnwise; co.packed_t NULL if not wanted */
	QStatus *st;
	long long ntiles, ntr;    /* tiles, tiles down the rows */
	int recipe, allow, slow_any, vec_in, vec_out;
	int sdt;                  /* source dtype (DT_*), for block_s8 */
	uint32_t slowmask[4];     /* scale bytes whose blocks take the exact path */
	float k0, k1, amax;
	uint32_t tab[128][8];     /* per scale byte: X1..X7, -Xs (bf16x2 or f32) */
	float factor[128];        /* per scale byte: the reference's factor */
};

template <int DT>
__device__ __forceinline__ float load_elem(const QArgs &a, long long r, long long c)
{
	if (r >= a.rows || c >= a.cols)
		return 0.0f;
	uint32_t raw = elem_raw<DT>(a.src, r * a.cols + c);

	if (DT == DT_BF16)
		return __uint_as_float(raw << 16);
	if (DT == DT_F16)
		return __half2float(__ushort_as_half((unsigned short)raw));
	return __uint_as_float(raw);
}

/* Write one lane's share: rowwise codes rc[k] (row k, 8 columns) and scale
 * bytes of rows 0-3/4-7 (rs_lo/hi) to memory; columnwise codes cc[j]
 * (column j, 8 rows) and scale bytes of columns 0-3/4-7 (cs_lo/hi) to the
 * staging area. */
__device__ __forceinline__ void store_lane(const QArgs &a, long long wr0,
					   long long c0, int lane, ColStage *sm,
					   const uint32_t rc[8], const uint32_t cc[8],
					   uint32_t rs_lo, uint32_t rs_hi,
					   uint32_t cs_lo, uint32_t cs_hi)
{
	const int h = lane >> 4, odd = lane & 1;
	const long long r0 = wr0 + 8 * h;

	if (a.packed && c0 < a.cp) {
		const long long pp = a.cp / 2, sp = a.cp / 16;
		uint32_t sw = odd ? rs_hi : rs_lo;

		const int nr = (int)(a.rows - r0 < 8 ? a.rows - r0 : 8);
		uint8_t *d = a.packed + r0 * pp + c0 / 2;
		uint8_t *ds = a.scales + (r0 + 4 * odd) * sp + c0 / 16;

#pragma unroll
		for (int k = 0; k < 8; k++, d += pp) {
			if (k >= nr)
				break;
			if (a.vec_out) {
				*(uint32_t *)d = rc[k];
			} else {
				for (int b = 0; b < 4; b++)
					d[b] = (uint8_t)(rc[k] >> (8 * b));
			}
		}
#pragma unroll
		for (int i = 0; i < 4; i++, ds += sp) {
			if (4 * odd + i >= nr)
				break;
			*ds = (uint8_t)(sw >> (8 * i));
		}
	}
	if (a.co.packed_t)
		stage_col(sm, (int)(threadIdx.x >> 5), lane, cc, cs_lo, cs_hi);
}

/*
 * The exact path for a warp's 16 x 128 region: a port of the reference's
 * loops, element by element. Block maxima leave non-finite values out (the
 * reference's isfinite test); without allow_nonfinite each one is recorded
 * (the smallest flat index wins) and the call fails.
 */
template <bool TWO_D, int DT>
__device__ __noinline__ void slow_tile(const QArgs &a, long long wr0, long long c0,
				       int lane, ColStage *sm)
{
	const int h = lane >> 4;
	const long long r0 = wr0 + 8 * h;
	float rmax[8], cmax[8], tmax = 0.0f, over = 0.0f;
	uint32_t rc[8], cc[8], rs_lo = 0, rs_hi = 0, cs_lo = 0, cs_hi = 0;

#pragma unroll
	for (int k = 0; k < 8; k++)
		rmax[k] = cmax[k] = 0.0f;
	for (int k = 0; k < 8; k++) {
		for (int e = 0; e < 8; e++) {
			float x = load_elem<DT>(a, r0 + k, c0 + e);
			float ax = fabsf(x);

			if (isfinite(ax)) {
				if (ax > rmax[k])
					rmax[k] = ax;
				if (ax > cmax[e])
					cmax[e] = ax;
			} else if (!a.allow) {
				atomicMin(&a.st->first_bad,
					  (unsigned long long)((a.row_base + r0 + k) * a.cols + c0 + e));
			}
		}
	}
#pragma unroll
	for (int k = 0; k < 8; k++) {
		rmax[k] = fmaxf(rmax[k], __shfl_xor_sync(FULL, rmax[k], 1));
		cmax[k] = fmaxf(cmax[k], __shfl_xor_sync(FULL, cmax[k], 16));
		tmax = fmaxf(tmax, rmax[k]);
		over = fmaxf(over, fmaxf(rmax[k], cmax[k]));
	}
	tmax = fmaxf(tmax, __shfl_xor_sync(FULL, tmax, 16));
	if (over > a.amax)
		atomicMax(&a.st->over, __float_as_uint(over));
	for (int k = 0; k < 8; k++) {
		uint32_t s8 = block_s8(a.recipe, TWO_D ? tmax : rmax[k], a.k0, a.k1, a.sdt);
		float f = a.factor[s8];
		uint32_t w = 0;

		for (int e = 0; e < 8; e++)
			w |= encode_exact(a.recipe, load_elem<DT>(a, r0 + k, c0 + e), f) << (4 * e);
		rc[k] = w;
		if (k < 4)
			rs_lo |= s8 << (8 * k);
		else
			rs_hi |= s8 << (8 * (k - 4));
	}
	for (int j = 0; j < 8; j++) {
		uint32_t s8 = block_s8(a.recipe, TWO_D ? tmax : cmax[j], a.k0, a.k1, a.sdt);
		float f = a.factor[s8];
		uint32_t w = 0;

		for (int k = 0; k < 8; k++)
			w |= encode_exact(a.recipe, load_elem<DT>(a, r0 + k, c0 + j), f) << (4 * k);
		cc[j] = w;
		if (j < 4)
			cs_lo |= s8 << (8 * j);
		else
			cs_hi |= s8 << (8 * (j - 4));
	}
	store_lane(a, wr0, c0, lane, sm, rc, cc, rs_lo, rs_hi, cs_lo, cs_hi);
}

__device__ __forceinline__ float hi16f(uint32_t w)
{
	return __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ float lo16f(uint32_t w)
{
	return __uint_as_float(w << 16);
}

/* Scale bytes of four blocks whose maxima are the bf16 halves of w0, w1
 * (lo, hi, lo, hi) or the float bits m[0..3], packed into one word. */
__device__ __forceinline__ uint32_t s8x4_bf16(const QArgs &a, uint32_t w0, uint32_t w1)
{
	return block_s8(a.recipe, lo16f(w0), a.k0, a.k1, a.sdt) |
	       block_s8(a.recipe, hi16f(w0), a.k0, a.k1, a.sdt) << 8 |
	       block_s8(a.recipe, lo16f(w1), a.k0, a.k1, a.sdt) << 16 |
	       block_s8(a.recipe, hi16f(w1), a.k0, a.k1, a.sdt) << 24;
}

__device__ __forceinline__ uint32_t s8x4_f32(const QArgs &a, uint32_t m0, uint32_t m1,
					     uint32_t m2, uint32_t m3)
{
	return block_s8(a.recipe, __uint_as_float(m0), a.k0, a.k1, a.sdt) |
	       block_s8(a.recipe, __uint_as_float(m1), a.k0, a.k1, a.sdt) << 8 |
	       block_s8(a.recipe, __uint_as_float(m2), a.k0, a.k1, a.sdt) << 16 |
	       block_s8(a.recipe, __uint_as_float(m3), a.k0, a.k1, a.sdt) << 24;
}

/* does one of the lane's scale bytes (of the layouts being written) have a
 * table entry that does not describe its step function? */
__device__ __forceinline__ bool slow_scale(const QArgs &a, uint32_t rs_lo, uint32_t rs_hi,
					   uint32_t cs_lo, uint32_t cs_hi)
{
	uint32_t w[4] = {rs_lo, rs_hi, cs_lo, cs_hi};
	bool bad = false;

	for (int i = a.packed ? 0 : 2; i < (a.co.packed_t ? 4 : 2); i++) {
		for (int b = 0; b < 4; b++) {
			uint32_t s8 = (w[i] >> (8 * b)) & 0x7f;

			bad |= (a.slowmask[s8 >> 5] >> (s8 & 31)) & 1;
		}
	}
	return bad;
}

__device__ __forceinline__ void tab_get(const uint4 *s_tab, uint32_t s8, uint4 *t0,
					uint4 *t1)
{
	*t0 = s_tab[2 * s8];
	*t1 = s_tab[2 * s8 + 1];
}

/* The fast path for bf16 input: elements stay packed two to a word. */
/* stile: the CTA's tile in shared memory (rows of 256 bytes), or NULL to
 * read global memory element by element (unaligned or ragged sources) */
template <bool TWO_D>
__device__ __forceinline__ void tile_bf16(const QArgs &a, const uint4 *s_tab,
					  const uint4 *stile, long long wr0, long long c0,
					  int lane, ColStage *sm)
{
	const int h = lane >> 4, odd = lane & 1;
	const long long r0 = wr0 + 8 * h;
	const uint16_t *src = (const uint16_t *)a.src;
	uint32_t v[8][4], rp2[4], cm[4], rc[8] = {0}, cc[8] = {0};
	uint32_t rs_lo = 0, rs_hi = 0, cs_lo = 0, cs_hi = 0;

#pragma unroll
	for (int k = 0; k < 8; k++) {
		long long r = r0 + k;

		v[k][0] = v[k][1] = v[k][2] = v[k][3] = 0;
		if (stile) {
			uint4 q = stile[((threadIdx.x >> 5) * 16 + 8 * h + k) * 16 + (lane & 15)];

			v[k][0] = q.x;
			v[k][1] = q.y;
			v[k][2] = q.z;
			v[k][3] = q.w;
		} else if (r < a.rows && c0 < a.cols) {
			{
				for (int e = 0; e < 8; e++) {
					uint32_t hv = c0 + e < a.cols ? src[r * a.cols + c0 + e] : 0u;

					v[k][e >> 1] |= hv << (16 * (e & 1));
				}
			}
		}
	}
	/* maxima of |x| as bf16 bit patterns (integer order = value order,
	 * NaN and Inf above every finite value) */
#pragma unroll
	for (int q = 0; q < 4; q++) {
		uint32_t m0 = __vmaxu2(__vmaxu2(v[2 * q][0] & 0x7fff7fffu, v[2 * q][1] & 0x7fff7fffu),
				       __vmaxu2(v[2 * q][2] & 0x7fff7fffu, v[2 * q][3] & 0x7fff7fffu));
		uint32_t m1 = __vmaxu2(__vmaxu2(v[2 * q + 1][0] & 0x7fff7fffu, v[2 * q + 1][1] & 0x7fff7fffu),
				       __vmaxu2(v[2 * q + 1][2] & 0x7fff7fffu, v[2 * q + 1][3] & 0x7fff7fffu));

		rp2[q] = __vmaxu2(__byte_perm(m0, m1, 0x5410), __byte_perm(m0, m1, 0x7632));
		rp2[q] = __vmaxu2(rp2[q], __shfl_xor_sync(FULL, rp2[q], 1));
	}
#pragma unroll
	for (int j = 0; j < 4; j++) {
		uint32_t m = v[0][j] & 0x7fff7fffu;

#pragma unroll
		for (int k = 1; k < 8; k++)
			m = __vmaxu2(m, v[k][j] & 0x7fff7fffu);
		cm[j] = __vmaxu2(m, __shfl_xor_sync(FULL, m, 16));
	}
	{
		uint32_t all = __vmaxu2(__vmaxu2(rp2[0], rp2[1]), __vmaxu2(rp2[2], rp2[3]));
		uint32_t top = max(all & 0xffffu, all >> 16);
		bool nonfinite = top >= 0x7f80u;

		if (__any_sync(FULL, nonfinite)) {
			slow_tile<TWO_D, DT_BF16>(a, wr0, c0, lane, sm);
			return;
		}
		if (__uint_as_float(top << 16) > a.amax)
			atomicMax(&a.st->over, top << 16);
		if (TWO_D) {
			uint32_t t = max(top, __shfl_xor_sync(FULL, top, 16));
			uint32_t s8 = block_s8(a.recipe, __uint_as_float(t << 16), a.k0, a.k1, a.sdt);

			rs_lo = rs_hi = cs_lo = cs_hi = s8 * 0x01010101u;
		}
	}
	if (!TWO_D) {
		/* each lane of a pair computes half of the pair's blocks */
		if (a.packed) {
			/* select the inputs, not the results: one computation per lane */
			uint32_t mine = s8x4_bf16(a, odd ? rp2[2] : rp2[0], odd ? rp2[3] : rp2[1]);
			uint32_t other = __shfl_xor_sync(FULL, mine, 1);

			rs_lo = odd ? other : mine;
			rs_hi = odd ? mine : other;
		}
		if (a.co.packed_t) {
			uint32_t mine = s8x4_bf16(a, h ? cm[2] : cm[0], h ? cm[3] : cm[1]);
			uint32_t other = __shfl_xor_sync(FULL, mine, 16);

			cs_lo = h ? other : mine;
			cs_hi = h ? mine : other;
		}
	}
	if (a.slow_any && __any_sync(FULL, slow_scale(a, rs_lo, rs_hi, cs_lo, cs_hi))) {
		slow_tile<TWO_D, DT_BF16>(a, wr0, c0, lane, sm);
		return;
	}
	if (a.packed || TWO_D) {
#pragma unroll
		for (int k = 0; k < 8; k++) {
			uint32_t s8 = ((k < 4 ? rs_lo : rs_hi) >> (8 * (k & 3))) & 0xffu, P[4];
			uint4 t0, t1;

			tab_get(s_tab, s8, &t0, &t1);
#pragma unroll
			for (int p = 0; p < 4; p++)
				P[p] = __byte_perm(v[k][p >> 1], v[k][2 + (p >> 1)],
						   (p & 1) ? 0x7632 : 0x5410);
			rc[k] = enc8_bf16(P, t0, t1);
		}
	}
	if (TWO_D) {
#pragma unroll
		for (int k = 0; k < 8; k++)
			cc[k] = rc[k];
		nib_transpose8(cc);
	} else if (a.co.packed_t) {
#pragma unroll
		for (int j = 0; j < 8; j++) {
			uint32_t s8 = ((j < 4 ? cs_lo : cs_hi) >> (8 * (j & 3))) & 0xffu, P[4];
			uint4 t0, t1;

			tab_get(s_tab, s8, &t0, &t1);
#pragma unroll
			for (int p = 0; p < 4; p++)
				P[p] = __byte_perm(v[p][j >> 1], v[p + 4][j >> 1],
						   (j & 1) ? 0x7632 : 0x5410);
			cc[j] = enc8_bf16(P, t0, t1);
		}
	}
	store_lane(a, wr0, c0, lane, sm, rc, cc, rs_lo, rs_hi, cs_lo, cs_hi);
}

/* The fast path for f32 and f16 input: elements as floats. */
template <bool TWO_D, int DT>
__device__ __forceinline__ void tile_f32(const QArgs &a, const uint4 *s_tab,
					 const uint4 *stile, long long wr0, long long c0,
					 int lane, ColStage *sm)
{
	const int h = lane >> 4, odd = lane & 1;
	const long long r0 = wr0 + 8 * h;
	const int row0 = (threadIdx.x >> 5) * 16 + 8 * h;
	float x[8][8];
	uint32_t rm[8], cmx[8], rc[8] = {0}, cc[8] = {0};
	uint32_t rs_lo = 0, rs_hi = 0, cs_lo = 0, cs_hi = 0;

#pragma unroll
	for (int k = 0; k < 8; k++) {
		long long r = r0 + k;

#pragma unroll
		for (int e = 0; e < 8; e++)
			x[k][e] = 0.0f;
		if (stile && DT == DT_F32) {
			/* rows of 512 bytes: 32 chunks, two per lane */
			uint4 q = stile[(row0 + k) * 32 + 2 * (lane & 15)];

			x[k][0] = __uint_as_float(q.x);
			x[k][1] = __uint_as_float(q.y);
			x[k][2] = __uint_as_float(q.z);
			x[k][3] = __uint_as_float(q.w);
			q = stile[(row0 + k) * 32 + 2 * (lane & 15) + 1];
			x[k][4] = __uint_as_float(q.x);
			x[k][5] = __uint_as_float(q.y);
			x[k][6] = __uint_as_float(q.z);
			x[k][7] = __uint_as_float(q.w);
			continue;
		}
		if (stile) {
			uint4 q = stile[(row0 + k) * 16 + (lane & 15)];
			uint32_t w[4] = {q.x, q.y, q.z, q.w};

#pragma unroll
			for (int e = 0; e < 8; e++)
				x[k][e] = __half2float(__ushort_as_half(
					(unsigned short)(w[e >> 1] >> (16 * (e & 1)))));
			continue;
		}
		if (r >= a.rows || c0 >= a.cols)
			continue;
#pragma unroll
		for (int e = 0; e < 8; e++)
			x[k][e] = load_elem<DT>(a, r, c0 + e);
	}
#pragma unroll
	for (int k = 0; k < 8; k++) {
		uint32_t m = 0;

#pragma unroll
		for (int e = 0; e < 8; e++)
			m = max(m, __float_as_uint(x[k][e]) & 0x7fffffffu);
		rm[k] = max(m, __shfl_xor_sync(FULL, m, 1));
	}
#pragma unroll
	for (int e = 0; e < 8; e++) {
		uint32_t m = 0;

#pragma unroll
		for (int k = 0; k < 8; k++)
			m = max(m, __float_as_uint(x[k][e]) & 0x7fffffffu);
		cmx[e] = max(m, __shfl_xor_sync(FULL, m, 16));
	}
	{
		uint32_t top = 0;

#pragma unroll
		for (int k = 0; k < 8; k++)
			top = max(top, rm[k]);
		if (__any_sync(FULL, top >= 0x7f800000u)) {
			slow_tile<TWO_D, DT>(a, wr0, c0, lane, sm);
			return;
		}
		if (__uint_as_float(top) > a.amax)
			atomicMax(&a.st->over, top);
		if (TWO_D) {
			uint32_t t = max(top, __shfl_xor_sync(FULL, top, 16));
			uint32_t s8 = block_s8(a.recipe, __uint_as_float(t), a.k0, a.k1, a.sdt);

			rs_lo = rs_hi = cs_lo = cs_hi = s8 * 0x01010101u;
		}
	}
	if (!TWO_D) {
		if (a.packed) {
			uint32_t mine = s8x4_f32(a, odd ? rm[4] : rm[0], odd ? rm[5] : rm[1],
						 odd ? rm[6] : rm[2], odd ? rm[7] : rm[3]);
			uint32_t other = __shfl_xor_sync(FULL, mine, 1);

			rs_lo = odd ? other : mine;
			rs_hi = odd ? mine : other;
		}
		if (a.co.packed_t) {
			uint32_t mine = s8x4_f32(a, h ? cmx[4] : cmx[0], h ? cmx[5] : cmx[1],
						 h ? cmx[6] : cmx[2], h ? cmx[7] : cmx[3]);
			uint32_t other = __shfl_xor_sync(FULL, mine, 16);

			cs_lo = h ? other : mine;
			cs_hi = h ? mine : other;
		}
	}
	if (a.slow_any && __any_sync(FULL, slow_scale(a, rs_lo, rs_hi, cs_lo, cs_hi))) {
		slow_tile<TWO_D, DT>(a, wr0, c0, lane, sm);
		return;
	}
	if (a.packed || TWO_D) {
#pragma unroll
		for (int k = 0; k < 8; k++) {
			uint32_t s8 = ((k < 4 ? rs_lo : rs_hi) >> (8 * (k & 3))) & 0xffu;
			uint4 t0, t1;

			tab_get(s_tab, s8, &t0, &t1);
			rc[k] = enc8_f32(x[k], t0, t1);
		}
	}
	if (TWO_D) {
#pragma unroll
		for (int k = 0; k < 8; k++)
			cc[k] = rc[k];
		nib_transpose8(cc);
	} else if (a.co.packed_t) {
#pragma unroll
		for (int j = 0; j < 8; j++) {
			uint32_t s8 = ((j < 4 ? cs_lo : cs_hi) >> (8 * (j & 3))) & 0xffu;
			float col[8];
			uint4 t0, t1;

			tab_get(s_tab, s8, &t0, &t1);
#pragma unroll
			for (int k = 0; k < 8; k++)
				col[k] = x[k][j];
			cc[j] = enc8_f32(col, t0, t1);
		}
	}
	store_lane(a, wr0, c0, lane, sm, rc, cc, rs_lo, rs_hi, cs_lo, cs_hi);
}

/* 16-byte chunks in one row of a tile, and in a tile */
#define Q_CPR(DT) ((DT) == DT_F32 ? 32 : 16)
#define Q_CHUNKS(DT) (QT_ROWS * Q_CPR(DT))

/* Start copying tile t of the source into shared memory (zeros past the
 * last row and column); the caller commits the group. */
template <int DT>
__device__ __forceinline__ void q_prefetch(const QArgs &a, long long rt, long long ct,
					   uint4 *dst)
{
	const int es = DT == DT_F32 ? 4 : 2, epc = 16 / es;
	const int step = QT_THREADS / Q_CPR(DT); /* rows a thread advances by */
	const int row0 = threadIdx.x / Q_CPR(DT), cc = threadIdx.x % Q_CPR(DT);
	const long long gc = ct * QT_COLS + (long long)cc * epc;
	const int rows_left = (int)(a.rows - rt * QT_ROWS < QT_ROWS ? a.rows - rt * QT_ROWS : QT_ROWS);
	const uint8_t *p = (const uint8_t *)a.src + ((rt * QT_ROWS + row0) * a.cols + gc) * es;
	const long long pstep = (long long)step * a.cols * es;

#pragma unroll
	for (int row = row0, q = threadIdx.x; row < QT_ROWS; row += step, q += QT_THREADS) {
		const bool ok = row < rows_left && gc < a.cols;

		cp_async16(dst + q, ok ? p : a.src, ok ? 16 : 0);
		p += pstep;
	}
}

/*
 * A CTA walks tiles t = blockIdx.x, + gridDim.x, ... . With a 16-byte
 * aligned source whose rows are whole 16-byte chunks, the next tile is
 * copied into shared memory (cp.async) while this one is computed, so the
 * memory system always has a tile per CTA in flight: loading a tile only
 * when it was its turn left the SMs idle between compute phases (20-28% of
 * the copy bandwidth, measured). Otherwise lanes read global memory
 * element by element.
 */
template <int DT, bool TWO_D>
__global__ void __launch_bounds__(QT_THREADS) quant_kernel(const __grid_constant__ QArgs a)
{
	extern __shared__ uint4 s_in[]; /* 2 tiles when a.vec_in */
	__shared__ uint4 s_tab[256];
	__shared__ ColStage sm;
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	/* tiles advance by gridDim.x: (rt, ct) step by (dr, dc) with a carry,
	 * which spares a 64-bit division per tile */
	const long long dc = gridDim.x / a.ntr, dr = gridDim.x % a.ntr;
	long long rt = blockIdx.x % a.ntr, ct = blockIdx.x / a.ntr;
	int buf = 0;

	for (int i = threadIdx.x; i < 256; i += QT_THREADS)
		s_tab[i] = ((const uint4 *)a.tab)[i];
	if (a.vec_in && blockIdx.x < a.ntiles)
		q_prefetch<DT>(a, rt, ct, s_in);
	cp_async_commit();
	__syncthreads();
	for (long long t = blockIdx.x; t < a.ntiles; t += gridDim.x, buf ^= 1) {
		long long wr0 = rt * QT_ROWS + 16 * w;
		long long c0 = ct * QT_COLS + 8 * (lane & 15);
		long long nrt = rt + dr, nct = ct + dc;
		const uint4 *stile = NULL;

		if (nrt >= a.ntr) {
			nrt -= a.ntr;
			nct++;
		}
		if (a.vec_in) {
			if (t + gridDim.x < a.ntiles)
				q_prefetch<DT>(a, nrt, nct, s_in + (buf ^ 1) * Q_CHUNKS(DT));
			cp_async_commit();
			cp_async_wait1();
			__syncthreads();
			stile = s_in + buf * Q_CHUNKS(DT);
		}
		/* warp-uniform: a warp below the last row only joins the barriers */
		if (wr0 < a.rows) {
			if (DT == DT_BF16)
				tile_bf16<TWO_D>(a, s_tab, stile, wr0, c0, lane, &sm);
			else
				tile_f32<TWO_D, DT>(a, s_tab, stile, wr0, c0, lane, &sm);
		}
		/* every lane is past reading s_in[buf] before it is refilled */
		__syncthreads();
		if (a.co.packed_t) {
			flush_col(a.co, rt, ct, &sm);
			__syncthreads();
		}
		rt = nrt;
		ct = nct;
	}
}

/* ---- dequantize ------------------------------------------------------------------ */

struct DArgs {
	const uint8_t *packed, *scales;
	void *out;
	long long rows, cols, nb; /* nb = cp / 16 blocks per row */
	int out_f32, vec_in, vec_out;
	float dtab[256];          /* ms_nvfp4_block_decode of each scale byte */
};

/* e2m1(code) * f as x86-64 SSE computes it when f is not finite */
__device__ __forceinline__ float mul_x86(float m, float f)
{
	if (isnan(f))
		return __uint_as_float(__float_as_uint(f) | 0x400000u);
	if (isinf(f) && m == 0.0f)
		return __uint_as_float(0xffc00000u);
	return __fmul_rn(m, f);
}

__device__ __forceinline__ uint16_t bf16_bits_ref(float v)
{
	uint32_t u = __float_as_uint(v);

	if (isnan(v))
		return (uint16_t)((u | 0x400000u) >> 16);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float e2m1_value_d(uint32_t code)
{
	uint32_t m = code & 7, bits = m >= 2 ? (m + 252u) << 22 : (m ? 0x3f000000u : 0u);

	return __uint_as_float(bits | (code & 8u) << 28);
}

/* PTX prmt in its default mode, where selector bit 3 replicates the sign
 * bit of the chosen byte (__byte_perm masks that bit off) */
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s)
{
	uint32_t r;

	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
	return r;
}

/* 8 values e2m1(code_i) * f of the codes in word cw (nibble i = element i) */
__device__ __forceinline__ void dec8(uint32_t cw, float f, float v[8])
{
	const uint32_t sl = cw & 0x7777u, sh = (cw >> 16) & 0x7777u;
	/* byte tables of the e2m1 magnitudes' float bits: top byte, next byte */
	const uint32_t H0 = __byte_perm(0x3f3f3f00u, 0x40404040u, sl),
		       L0 = __byte_perm(0xc0800000u, 0xc0804000u, sl),
		       H1 = __byte_perm(0x3f3f3f00u, 0x40404040u, sh),
		       L1 = __byte_perm(0xc0800000u, 0xc0804000u, sh);

#pragma unroll
	for (int i = 0; i < 8; i++) {
		const uint32_t ii = i & 3;
		/* bytes 0,1: sign-replicated H bytes, whose top bit is 0 */
		const uint32_t sel = (4 + ii) << 12 | ii << 8 | (12 + ii) << 4 | (12 + ii);
		uint32_t bits = prmt(i < 4 ? L0 : L1, i < 4 ? H0 : H1, sel);

		bits |= (cw << (28 - 4 * i)) & 0x80000000u;
		v[i] = __fmul_rn(__uint_as_float(bits), f);
	}
}

__global__ void __launch_bounds__(256) dequant_kernel(const __grid_constant__ DArgs a)
{
	__shared__ float s_tab[256];
	const long long nblocks = a.rows * a.nb;
	const long long nth = (long long)gridDim.x * blockDim.x;

	for (int i = threadIdx.x; i < 256; i += blockDim.x)
		s_tab[i] = a.dtab[i];
	__syncthreads();
	for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks; b += nth) {
		const long long r = b / a.nb, c0 = (b - r * a.nb) * 16;
		const long long o = r * a.cols + c0;
		const int n = a.cols - c0 < 16 ? (int)(a.cols - c0) : 16;
		uint32_t cw[2];
		float f, v[16];

		if (a.vec_in) {
			uint2 q = __ldcs((const uint2 *)a.packed + b);

			cw[0] = q.x;
			cw[1] = q.y;
		} else {
			const uint8_t *p = a.packed + 8 * b;

			cw[0] = p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
			cw[1] = p[4] | p[5] << 8 | p[6] << 16 | (uint32_t)p[7] << 24;
		}
		f = s_tab[a.scales[b]];
		if (isfinite(f)) {
			dec8(cw[0], f, v);
			dec8(cw[1], f, v + 8);
		} else {
#pragma unroll
			for (int i = 0; i < 16; i++)
				v[i] = mul_x86(e2m1_value_d(cw[i >> 3] >> (4 * (i & 7))), f);
		}
		if (a.out_f32) {
			float *out = (float *)a.out + o;

			if (a.vec_out && n == 16) {
#pragma unroll
				for (int q = 0; q < 4; q++)
					__stcs((float4 *)out + q,
					       make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]));
			} else {
#pragma unroll
				for (int i = 0; i < 16; i++)
					if (i < n)
						out[i] = v[i];
			}
		} else {
			uint16_t *out = (uint16_t *)a.out + o;
			uint32_t hw[8];

			if (isfinite(f)) {
#pragma unroll
				for (int q = 0; q < 8; q++) {
					__nv_bfloat162 p2 = __floats2bfloat162_rn(v[2 * q], v[2 * q + 1]);

					hw[q] = *(uint32_t *)&p2;
				}
			} else {
#pragma unroll
				for (int q = 0; q < 8; q++)
					hw[q] = bf16_bits_ref(v[2 * q]) | (uint32_t)bf16_bits_ref(v[2 * q + 1]) << 16;
			}
			if (a.vec_out && n == 16) {
				__stcs((uint4 *)out, make_uint4(hw[0], hw[1], hw[2], hw[3]));
				__stcs((uint4 *)out + 1, make_uint4(hw[4], hw[5], hw[6], hw[7]));
			} else if (a.vec_out && n == 8) {
				__stcs((uint4 *)out, make_uint4(hw[0], hw[1], hw[2], hw[3]));
			} else {
#pragma unroll
				for (int i = 0; i < 16; i++)
					if (i < n)
						out[i] = (uint16_t)(hw[i >> 1] >> (16 * (i & 1)));
			}
		}
	}
}

/* ---- transpose ------------------------------------------------------------------ */

/* Keys order the first problem as the reference finds it: by row, then a
 * scale disagreement (kind 0, tile column) before a padding nibble (kind
 * 1, column). */
#define TKEY(r, kind, i) ((unsigned long long)(r) << 33 | (unsigned long long)(kind) << 32 | (unsigned long long)(i))

__global__ void __launch_bounds__(256) tvalid_kernel(const uint8_t *packed,
						     const uint8_t *scales,
						     long long rows, long long cols,
						     long long cp,
						     unsigned long long *first)
{
	const long long nb = cp / 16;

	/* a CTA per row at a time, its threads along the row (coalesced) */
	for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
		const uint8_t *row = scales + r * nb, *lead = scales + (r & ~15LL) * nb;

		for (long long b = threadIdx.x; b < nb; b += blockDim.x) {
			if (row[b] != lead[b])
				atomicMin(first, TKEY(r, 0, b));
		}
		if (threadIdx.x == 0) {
			for (long long c = cols; c < cp; c++) {
				if ((packed[r * (cp / 2) + c / 2] >> (4 * (c & 1))) & 15) {
					atomicMin(first, TKEY(r, 1, c));
					break;
				}
			}
		}
	}
}

struct TArgs {
	const uint8_t *packed, *scales;
	ColOut co;
	long long rows, cols, cp, rp, ntiles, ntr;
	int vec_in;               /* 16-byte aligned rows: prefetch with cp.async */
};

/* tile (rt, ct) of the packed input (64 rows of 64 bytes) into shared
 * memory; row r goes to row r ^ ((r >> 3) & 1) so that the two half-warps,
 * 8 rows apart, read different banks */
__device__ __forceinline__ void t_prefetch(const TArgs &a, long long rt, long long ct,
					   uint4 *dst)
{
	const long long pp = a.cp / 2;

	for (int q = threadIdx.x; q < QT_ROWS * 4; q += QT_THREADS) {
		const int row = q >> 2, cc = q & 3;
		const long long gr = rt * QT_ROWS + row, gb = ct * 64 + 16 * cc;
		const int n = gr < a.rows && gb < pp ? (pp - gb < 16 ? (int)(pp - gb) : 16) : 0;

		cp_async16(dst + ((row ^ ((row >> 3) & 1)) * 4 + cc),
			   a.packed + (n ? gr * pp + gb : 0), n);
	}
}

/* the scale byte of a lane's 8 columns and 16 rows (0 past the columns) */
__device__ __forceinline__ uint32_t t_scale(const TArgs &a, long long wr0, long long c0)
{
	return wr0 < a.rows && c0 < a.cp ? a.scales[wr0 * (a.cp / 16) + c0 / 16] : 0;
}

/* Same tiles, lanes and staging as quantize; the next tile is prefetched
 * (cp.async, and its scale bytes into registers) while this one is
 * transposed. */
__global__ void __launch_bounds__(QT_THREADS) transpose_kernel(const __grid_constant__ TArgs a)
{
	__shared__ uint4 s_in[2][QT_ROWS * 4];
	__shared__ ColStage sm;
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, h = lane >> 4;
	const long long dc = gridDim.x / a.ntr, dr = gridDim.x % a.ntr;
	long long rt = blockIdx.x % a.ntr, ct = blockIdx.x / a.ntr;
	uint32_t s_next;
	int buf = 0;

	if (a.vec_in && blockIdx.x < a.ntiles)
		t_prefetch(a, rt, ct, s_in[0]);
	cp_async_commit();
	s_next = t_scale(a, rt * QT_ROWS + 16 * w, ct * QT_COLS + 8 * (lane & 15));
	for (long long t = blockIdx.x; t < a.ntiles; t += gridDim.x, buf ^= 1) {
		const long long wr0 = rt * QT_ROWS + 16 * w, r0 = wr0 + 8 * h;
		const long long c0 = ct * QT_COLS + 8 * (lane & 15);
		const uint32_t s = s_next;
		long long nrt = rt + dr, nct = ct + dc;
		uint32_t m[8];

		if (nrt >= a.ntr) {
			nrt -= a.ntr;
			nct++;
		}
		if (a.vec_in) {
			if (t + gridDim.x < a.ntiles)
				t_prefetch(a, nrt, nct, s_in[buf ^ 1]);
			cp_async_commit();
		}
		if (t + gridDim.x < a.ntiles)
			s_next = t_scale(a, nrt * QT_ROWS + 16 * w, nct * QT_COLS + 8 * (lane & 15));
		if (a.vec_in) {
			cp_async_wait1();
			__syncthreads();
		}
		if (wr0 < a.rows) { /* warp-uniform */
#pragma unroll
			for (int k = 0; k < 8; k++) {
				const uint8_t *p = a.packed + (r0 + k) * (a.cp / 2) + c0 / 2;
				const int row = 16 * w + 8 * h + k;

				m[k] = 0;
				if (a.vec_in)
					m[k] = ((const uint32_t *)s_in[buf])[(row ^ ((row >> 3) & 1)) * 16 +
									     (lane & 15)];
				else if (r0 + k < a.rows && c0 < a.cp)
					m[k] = p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
			}
			nib_transpose8(m);
			stage_col(&sm, w, lane, m, s * 0x01010101u, s * 0x01010101u);
		}
		__syncthreads();
		flush_col(a.co, rt, ct, &sm);
		__syncthreads();
		rt = nrt;
		ct = nct;
	}
}

/* ---- host: tables ----------------------------------------------------------------- */

static float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* The element factor ms_nvfp4_block_scale returns along with scale byte
 * s8 (volatile: one rounding per operation, as in the reference). */
static float tab_factor(const struct ms_nvfp4_tscale *t, uint32_t s8)
{
	volatile float v = ms_nvfp4_e4m3_value((uint8_t)s8), r;

	switch (t->recipe) {
	case MS_NVFP4_RECIPE_MODELOPT:
		r = v * t->k0;
		return r;
	case MS_NVFP4_RECIPE_COMPRESSED_TENSORS:
		r = v / t->k0;
		return r;
	default: {
		volatile float d = v * t->k1;

		r = 1.0f / d;
		return r > FLT_MAX ? FLT_MAX : r;
	}
	}
}

/* code magnitude of x below k (k 1..7), or: no sign nibble on -x (k 0) */
static int below(const struct ms_nvfp4_tscale *t, float f, int k, uint32_t u)
{
	if (k)
		return (ms_nvfp4_encode_elem(t, u2f(u), f) & 7) < k;
	return !(ms_nvfp4_encode_elem(t, -u2f(u), f) & 8);
}

/* the code steps of q = x / f (x * f for te): magnitude k (1..7) starts
 * past qstep[k - 1]; the sign nibble past 2^-150 (q no longer rounds to 0) */
static const double qstep[8] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0x1p-150};

/*
 * The largest finite x >= 0 for which below() holds (it holds at 0). The
 * step sits within an ulp or two of qstep * f (qstep / f for te), so the
 * search gallops out from there and then bisects: a handful of reference
 * calls per threshold instead of 31.
 */
static uint32_t search(const struct ms_nvfp4_tscale *t, float f, int k)
{
	const uint64_t maxf = 0x7f7fffffu;
	double est = t->recipe == MS_NVFP4_RECIPE_TE ? qstep[k ? k - 1 : 7] / (double)f
						     : qstep[k ? k - 1 : 7] * (double)f;
	uint64_t u, lo = 0, hi = maxf + 1, step = 1;

	if (!(est > 0.0))
		u = 0;
	else if (est >= (double)FLT_MAX)
		u = maxf;
	else {
		float fe = (float)est;
		uint32_t b;

		memcpy(&b, &fe, 4);
		u = b;
	}
	if (below(t, f, k, (uint32_t)u)) {
		lo = u;
		for (;;) {
			if (lo + step > maxf) {
				if (below(t, f, k, (uint32_t)maxf))
					return (uint32_t)maxf;
				hi = maxf;
				break;
			}
			if (!below(t, f, k, (uint32_t)(lo + step))) {
				hi = lo + step;
				break;
			}
			lo += step;
			step *= 2;
		}
	} else {
		hi = u;
		for (;;) {
			if (hi < step) {
				lo = 0;
				break;
			}
			if (below(t, f, k, (uint32_t)(hi - step))) {
				lo = hi - step;
				break;
			}
			hi -= step;
			step *= 2;
		}
	}
	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (below(t, f, k, (uint32_t)mid))
			lo = mid;
		else
			hi = mid;
	}
	return (uint32_t)lo;
}

static uint32_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (uint32_t)(*s >> 16);
}

/*
 * Fill a->tab, a->factor and a->slowmask for t. An entry whose code is not
 * a monotone step function of |x| with code(+-0) == 0 (checked at 0 and on
 * sample points against the reference) is "slow": a warp that meets its
 * scale byte takes the exact path.
 */
static void qtab_build(const struct ms_nvfp4_tscale *t, int bf16, struct QArgs *a)
{
	uint64_t rs = 0x9e3779b97f4a7c15ull;
	int slow[128] = {0};

	for (uint32_t s8 = 0; s8 < 128; s8++) {
		float f = tab_factor(t, s8);
		uint32_t X[8];

		a->factor[s8] = f;
		if (s8 == 0x7f || !below(t, f, 1, 0) || !below(t, f, 0, 0) ||
		    (ms_nvfp4_encode_elem(t, -0.0f, f) & 7)) {
			slow[s8] = 1;
			memset(a->tab[s8], 0, sizeof(a->tab[s8]));
			continue;
		}
		for (int k = 1; k <= 7; k++)
			X[k - 1] = search(t, f, k);
		X[7] = search(t, f, 0);
		/* insurance: the model against the reference on sample points */
		for (int i = 0; i < 24 && !slow[s8]; i++) {
			float x = u2f(rng_next(&rs) & 0x7f7fffffu);
			uint8_t want, got = 0;

			if (i & 1) /* near the thresholds too */
				x = u2f(X[i % 8] + (rng_next(&rs) % 5) - 2);
			if (!isfinite(x))
				continue;
			if (i & 2)
				x = -x;
			want = ms_nvfp4_encode_elem(t, x, f);
			for (int k = 0; k < 7; k++)
				got += fabsf(x) > u2f(X[k]);
			if (x < -u2f(X[7]))
				got |= 8;
			if (got != want)
				slow[s8] = 1;
		}
		for (int k = 0; k < 8; k++) {
			uint32_t w;

			if (bf16) {
				/* for bf16 x: |x| > X iff |x| > X rounded down to bf16 */
				uint32_t b = X[k] >> 16;

				if (k == 7)
					b |= 0x8000u;
				w = b | b << 16;
			} else {
				w = k == 7 ? X[k] | 0x80000000u : X[k];
			}
			a->tab[s8][k] = w;
		}
	}
	/* never produced: modelopt clamps the scale to >= 2^-9 and
	 * compressed-tensors replaces a zero one; 0x7f is NaN */
	if (t->recipe != MS_NVFP4_RECIPE_TE)
		slow[0] = 0;
	slow[0x7f] = 0;
	memset(a->slowmask, 0, sizeof(a->slowmask));
	a->slow_any = 0;
	for (int s8 = 0; s8 < 128; s8++) {
		if (slow[s8]) {
			a->slowmask[s8 >> 5] |= 1u << (s8 & 31);
			a->slow_any = 1;
		}
	}
}

/* ---- host: helpers ------------------------------------------------------------------ */

static long long rup16(long long x)
{
	return (x + 15) & ~15LL;
}

static int elem_size(enum ms_dtype dt)
{
	return dt == MS_DTYPE_F32 ? 4 : 2;
}

static int dt_code(enum ms_dtype dt)
{
	return dt == MS_DTYPE_BF16 ? DT_BF16 : dt == MS_DTYPE_F16 ? DT_F16 : DT_F32;
}

static int aligned(const void *p, unsigned n)
{
	return ((uintptr_t)p & (n - 1)) == 0;
}

static int check_src(const struct ms_nvfp4_src *s, struct ms_err *err)
{
	uint64_t n;

	if (s->dtype != MS_DTYPE_BF16 && s->dtype != MS_DTYPE_F16 &&
	    s->dtype != MS_DTYPE_F32)
		return ms_err_set(err, MS_EINVAL,
				  "dtype %s cannot be quantized (bf16, f16 or f32 only)",
				  ms_dtype_name(s->dtype) ? ms_dtype_name(s->dtype) : "?");
	if (ms_mul_u64(s->rows, s->cols, &n) || ms_mul_u64(n, 4, &n))
		return ms_err_set(err, MS_EINVAL, "shape [%llu, %llu] overflows",
				  (unsigned long long)s->rows,
				  (unsigned long long)s->cols);
	if (n && !s->data)
		return ms_err_set(err, MS_EINVAL, "no data");
	return MS_OK;
}

static int check_dims(uint64_t rows, uint64_t cols, struct ms_err *err)
{
	if (rows >= (1ull << 31) || cols >= (1ull << 31))
		return ms_err_set(err, MS_EINVAL,
				  "shape [%llu, %llu] is too large for the gpu kernels "
				  "(each dimension must be below 2^31)",
				  (unsigned long long)rows, (unsigned long long)cols);
	return MS_OK;
}

/* The reference's message for a non-finite element at flat index i. */
static int nonfinite_err(enum ms_dtype dt, const void *data, unsigned long long i,
			 struct ms_err *err)
{
	uint32_t raw = 0;
	float v;
	int es = elem_size(dt), rc = MS_OK;

	if (ms_gpu_is_device_ptr(data))
		CK(cudaMemcpy(&raw, (const uint8_t *)data + i * es, es, cudaMemcpyDeviceToHost));
	else
		memcpy(&raw, (const uint8_t *)data + i * es, es);
	if (dt == MS_DTYPE_BF16)
		v = u2f(raw << 16);
	else if (dt == MS_DTYPE_F16)
		v = ms_f16_to_f32((uint16_t)raw);
	else
		v = u2f(raw);
	return ms_err_set(err, MS_EINVAL, "non-finite value (%s) at element %llu",
			  isnan(v) ? "nan" : v > 0 ? "inf" : "-inf", i);
out:
	return rc;
}

/* Grid of a persistent kernel: as many CTAs as fit on the device at once,
 * but no more than there is work. */
static int grid_for_smem(const void *kernel, int threads, size_t smem, long long work,
			 int *grid, struct ms_err *err)
{
	/* the answer depends on the kernel alone (one device per process is
	 * what the library drives): computed once per kernel */
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static struct {
		const void *k;
		size_t smem;
		int blocks;
	} cache[32];
	static int ncache;
	int dev = 0, sms = 0, per = 0, rc = MS_OK, cached = 0;

	pthread_mutex_lock(&lock);
	for (int i = 0; i < ncache; i++) {
		if (cache[i].k == kernel && cache[i].smem == smem) {
			per = cache[i].blocks;
			cached = 1;
		}
	}
	pthread_mutex_unlock(&lock);
	if (!cached) {
		CK(cudaGetDevice(&dev));
		CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
		if (smem > 48 * 1024)
			CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
						(int)smem));
		CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, threads, smem));
		if (per < 1)
			per = 1;
		per *= sms;
		pthread_mutex_lock(&lock);
		if (ncache < 32)
			cache[ncache++] = {kernel, smem, per};
		pthread_mutex_unlock(&lock);
	}
	*grid = (int)(per < work ? per : work);
	if (*grid < 1)
		*grid = 1;
out:
	return rc;
}

static int grid_for(const void *kernel, int threads, long long work, int *grid,
		    struct ms_err *err)
{
	return grid_for_smem(kernel, threads, 0, work, grid, err);
}

/* ---- host: amax ------------------------------------------------------------------- */

static int amax_launch(int dt, const void *src, long long n, long long base,
		       int allow, AStatus *st, cudaStream_t s, struct ms_err *err)
{
	const void *k = dt == DT_BF16 ? (const void *)amax_kernel<DT_BF16>
			: dt == DT_F16 ? (const void *)amax_kernel<DT_F16>
				       : (const void *)amax_kernel<DT_F32>;
	int grid = 1, vec = aligned(src, 16), rc = MS_OK;

	if (!n)
		return MS_OK;
	if ((rc = grid_for(k, 256, (n + 2047) / 2048, &grid, err)) != MS_OK)
		goto out;
	if (dt == DT_BF16)
		amax_kernel<DT_BF16><<<grid, 256, 0, s>>>(src, n, base, allow, vec, st);
	else if (dt == DT_F16)
		amax_kernel<DT_F16><<<grid, 256, 0, s>>>(src, n, base, allow, vec, st);
	else
		amax_kernel<DT_F32><<<grid, 256, 0, s>>>(src, n, base, allow, vec, st);
	CK(cudaGetLastError());
out:
	return rc;
}

static const AStatus astatus_init = {NO_INDEX, 0, 0};

extern "C" int ms_gpu_nvfp4_amax(const struct ms_nvfp4_src *src, int allow_nonfinite,
				 float *amax, struct ms_err *err)
{
	AStatus *dst = NULL, hst;
	uint8_t *pbuf[2] = {NULL, NULL}, *dbuf[2] = {NULL, NULL};
	cudaStream_t st[2] = {NULL, NULL};
	cudaEvent_t ev[2] = {NULL, NULL};
	long long n = (long long)(src->rows * src->cols);
	int es = elem_size(src->dtype), dt = dt_code(src->dtype), rc;

	if ((rc = check_src(src, err)) != MS_OK)
		return rc;
	if ((rc = ms_gpu_ready(err)) != MS_OK)
		return rc;
	*amax = 0.0f;
	if (!n)
		return MS_OK;
	CK(cudaMallocAsync((void **)&dst, sizeof(*dst), 0));
	CK(cudaMemcpyAsync(dst, &astatus_init, sizeof(*dst), cudaMemcpyHostToDevice, 0));
	CK(cudaStreamSynchronize(0));
	if (ms_gpu_is_device_ptr(src->data)) {
		if ((rc = amax_launch(dt, src->data, n, 0, allow_nonfinite, dst, 0, err)) != MS_OK)
			goto out;
	} else {
		/* stream the host tensor through two pinned buffers */
		const long long chunk = (64ll << 20) / es;

		for (int i = 0; i < 2; i++) {
			CK(cudaHostAlloc((void **)&pbuf[i], chunk * es, cudaHostAllocDefault));
			CK(cudaMalloc((void **)&dbuf[i], chunk * es));
			CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
			CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
		}
		for (long long off = 0, k = 0; off < n; off += chunk, k++) {
			const int s = (int)(k & 1);
			const long long len = n - off < chunk ? n - off : chunk;

			CK(cudaEventSynchronize(ev[s]));
			memcpy(pbuf[s], (const uint8_t *)src->data + off * es, len * es);
			CK(cudaMemcpyAsync(dbuf[s], pbuf[s], len * es, cudaMemcpyHostToDevice, st[s]));
			if ((rc = amax_launch(dt, dbuf[s], len, off, allow_nonfinite, dst,
					      st[s], err)) != MS_OK)
				goto out;
			CK(cudaEventRecord(ev[s], st[s]));
		}
		for (int i = 0; i < 2; i++)
			CK(cudaStreamSynchronize(st[i]));
	}
	CK(cudaMemcpy(&hst, dst, sizeof(hst), cudaMemcpyDeviceToHost));
	if (hst.first_bad != NO_INDEX) {
		rc = nonfinite_err(src->dtype, src->data, hst.first_bad, err);
		if (rc == MS_OK)
			rc = MS_EINVAL;
		goto out;
	}
	*amax = u2f(hst.max_bits);
out:
	for (int i = 0; i < 2; i++) {
		if (st[i])
			cudaStreamSynchronize(st[i]);
		if (st[i])
			cudaStreamDestroy(st[i]);
		if (ev[i])
			cudaEventDestroy(ev[i]);
		cudaFreeHost(pbuf[i]);
		cudaFree(dbuf[i]);
	}
	if (dst)
		cudaFreeAsync(dst, 0);
	return rc;
}

/* ---- host: quantize ------------------------------------------------------------------ */

/* A 2D host copy: count rows of n bytes. The streaming quantizer's copies
 * between pageable and pinned memory are memory-bound on one core, so they
 * are spread over threads. */
struct pcopy {
	uint8_t *dst;
	const uint8_t *src;
	size_t n, count, dpitch, spitch;
};

struct pcopy_job {
	const struct pcopy *c;
	int nc, part, parts;
};

static void *pcopy_worker(void *arg)
{
	const struct pcopy_job *j = (const struct pcopy_job *)arg;

	for (int k = 0; k < j->nc; k++) {
		const struct pcopy *c = &j->c[k];

		if (c->count == 1) {
			size_t per = (c->n + j->parts - 1) / j->parts, b = per * j->part;

			if (b < c->n)
				memcpy(c->dst + b, c->src + b, c->n - b < per ? c->n - b : per);
			continue;
		}
		for (size_t r = j->part; r < c->count; r += j->parts)
			memcpy(c->dst + r * c->dpitch, c->src + r * c->spitch, c->n);
	}
	return NULL;
}

static void par_copy(const struct pcopy *c, int nc)
{
	struct pcopy_job jobs[16];
	pthread_t th[16];
	size_t total = 0;
	int parts = ms_ncpus() < 16 ? ms_ncpus() : 16, started = 1;

	for (int k = 0; k < nc; k++)
		total += c[k].n * c[k].count;
	if (total < (4u << 20))
		parts = 1;
	for (int i = 0; i < parts; i++)
		jobs[i] = (struct pcopy_job){c, nc, i, parts};
	for (int i = 1; i < parts; i++) {
		if (pthread_create(&th[i], NULL, pcopy_worker, &jobs[i]))
			break;
		started = i + 1;
	}
	pcopy_worker(&jobs[0]);
	/* parts that got no thread are done here */
	for (int i = started; i < parts; i++)
		pcopy_worker(&jobs[i]);
	for (int i = 1; i < started; i++)
		pthread_join(th[i], NULL);
}

static void col_out_init(ColOut *o, long long cols, long long rp)
{
	o->cols = cols;
	o->rp = rp;
	o->vec_out = !o->packed_t || aligned(o->packed_t, 4);
	o->vec16 = o->packed_t && aligned(o->packed_t, 16) && (rp / 2) % 16 == 0;
	o->vec4s = o->scales_t && aligned(o->scales_t, 4) && (rp / 16) % 4 == 0;
}

/* The last table built, reused while the same tensor (recipe, amax, input
 * form) is quantized again: the streaming helper's chunks, a benchmark's
 * repetitions. */
static pthread_mutex_t qtab_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	int valid, recipe, bf16, slow_any, sdt;
	float amax;
	uint32_t tab[128][8], slowmask[4];
	float factor[128];
} qtab_last;

static void qtab_cached(const struct ms_nvfp4_tscale *t, int bf16, QArgs *a)
{
	int hit;

	pthread_mutex_lock(&qtab_lock);
	hit = qtab_last.valid && qtab_last.recipe == (int)t->recipe && qtab_last.bf16 == bf16 &&
	      qtab_last.sdt == (int)t->src_dtype &&
	      !memcmp(&qtab_last.amax, &t->amax, sizeof(float));
	if (hit) {
		memcpy(a->tab, qtab_last.tab, sizeof(a->tab));
		memcpy(a->factor, qtab_last.factor, sizeof(a->factor));
		memcpy(a->slowmask, qtab_last.slowmask, sizeof(a->slowmask));
		a->slow_any = qtab_last.slow_any;
	}
	pthread_mutex_unlock(&qtab_lock);
	if (hit)
		return;
	qtab_build(t, bf16, a);
	pthread_mutex_lock(&qtab_lock);
	qtab_last.valid = 1;
	qtab_last.recipe = (int)t->recipe;
	qtab_last.bf16 = bf16;
	qtab_last.sdt = (int)t->src_dtype;
	qtab_last.amax = t->amax;
	memcpy(qtab_last.tab, a->tab, sizeof(a->tab));
	memcpy(qtab_last.factor, a->factor, sizeof(a->factor));
	memcpy(qtab_last.slowmask, a->slowmask, sizeof(a->slowmask));
	qtab_last.slow_any = a->slow_any;
	pthread_mutex_unlock(&qtab_lock);
}

static int q_prepare(const struct ms_nvfp4_params *p, const struct ms_nvfp4_src *src,
		     float amax, QArgs *a, struct ms_err *err)
{
	struct ms_nvfp4_tscale t;
	int rc;

	if ((rc = check_src(src, err)) != MS_OK)
		return rc;
	if ((rc = check_dims(src->rows, src->cols, err)) != MS_OK)
		return rc;
	if (p->block != MS_NVFP4_BLOCK_1D && p->block != MS_NVFP4_BLOCK_2D)
		return ms_err_set(err, MS_EINVAL, "unknown nvfp4 block shape %d", (int)p->block);
	if ((rc = ms_nvfp4_tscale_init_src(p->recipe, amax, src->dtype, &t, err)) != MS_OK)
		return rc;
	memset(a, 0, sizeof(*a));
	a->sdt = dt_code(src->dtype);
	a->rows = (long long)src->rows;
	a->cols = (long long)src->cols;
	a->cp = rup16(a->cols);
	a->rp = rup16(a->rows);
	a->recipe = (int)p->recipe;
	a->allow = (p->flags & MS_NVFP4_ALLOW_NONFINITE) != 0;
	a->k0 = t.k0;
	a->k1 = t.k1;
	a->amax = amax;
	qtab_cached(&t, src->dtype == MS_DTYPE_BF16, a);
	return MS_OK;
}

/* Launch on rows [0, a->rows) of a->src (a device pointer) with the
 * outputs and status already in a. */
static int q_launch(QArgs *a, enum ms_dtype dtype, int two_d, cudaStream_t s,
		    struct ms_err *err)
{
	const int dt = dt_code(dtype), es = elem_size(dtype);
	const void *k;
	size_t smem;
	int grid = 1, rc = MS_OK;

	a->ntr = (a->rows + QT_ROWS - 1) / QT_ROWS;
	a->ntiles = a->ntr * ((a->cp + QT_COLS - 1) / QT_COLS);
	a->vec_in = aligned(a->src, 16) && (a->cols * es) % 16 == 0;
	a->vec_out = !a->packed || aligned(a->packed, 4);
	col_out_init(&a->co, a->cols, a->rp);
	if (!a->ntiles)
		return MS_OK;
#define QK(D, T) (const void *)quant_kernel<D, T>
	k = dt == DT_BF16 ? (two_d ? QK(DT_BF16, true) : QK(DT_BF16, false))
	  : dt == DT_F16 ? (two_d ? QK(DT_F16, true) : QK(DT_F16, false))
			 : (two_d ? QK(DT_F32, true) : QK(DT_F32, false));
#undef QK
	smem = a->vec_in ? 2 * 16 * (size_t)(dt == DT_F32 ? Q_CHUNKS(DT_F32) : Q_CHUNKS(DT_BF16)) : 0;
	if ((rc = grid_for_smem(k, QT_THREADS, smem, a->ntiles, &grid, err)) != MS_OK)
		goto out;
	if (dt == DT_BF16 && two_d)
		quant_kernel<DT_BF16, true><<<grid, QT_THREADS, smem, s>>>(*a);
	else if (dt == DT_BF16)
		quant_kernel<DT_BF16, false><<<grid, QT_THREADS, smem, s>>>(*a);
	else if (dt == DT_F16 && two_d)
		quant_kernel<DT_F16, true><<<grid, QT_THREADS, smem, s>>>(*a);
	else if (dt == DT_F16)
		quant_kernel<DT_F16, false><<<grid, QT_THREADS, smem, s>>>(*a);
	else if (two_d)
		quant_kernel<DT_F32, true><<<grid, QT_THREADS, smem, s>>>(*a);
	else
		quant_kernel<DT_F32, false><<<grid, QT_THREADS, smem, s>>>(*a);
	CK(cudaGetLastError());
out:
	return rc;
}

static const QStatus qstatus_init = {NO_INDEX, 0, 0};

static int q_status_err(const QStatus *h, const struct ms_nvfp4_src *src, float amax,
			struct ms_err *err)
{
	int rc;

	if (h->first_bad != NO_INDEX) {
		rc = nonfinite_err(src->dtype, src->data, h->first_bad, err);
		return rc == MS_OK ? MS_EINVAL : rc;
	}
	if (h->over)
		return ms_err_set(err, MS_EINVAL, "amax %.9g is below the block maximum %.9g",
				  (double)amax, (double)u2f(h->over));
	return MS_OK;
}

static int check_outputs(const uint8_t *packed, const uint8_t *scales,
			 const uint8_t *packed_t, const uint8_t *scales_t,
			 struct ms_err *err)
{
	if (!packed != !scales || !packed_t != !scales_t)
		return ms_err_set(err, MS_EINVAL,
				  "nvfp4 outputs come in pairs: packed with scales");
	if (!packed && !packed_t)
		return ms_err_set(err, MS_EINVAL, "no nvfp4 output asked for");
	return MS_OK;
}

/*
 * The streaming quantizer's buffers and streams, kept from one call to the
 * next: msconvert quantizes tensor after tensor, most of them a few MiB,
 * and pinning 16 MiB chunks, allocating device memory and creating streams
 * for each tensor cost more than its copies and kernels (measured on a
 * 4.2 GB checkpoint of expert tensors: 24.8 s with per-call allocation
 * against 13.5 s on the CPU). The buffers only grow; a call that fails on
 * a CUDA error drops them, so the next call starts from fresh ones. One
 * call at a time uses them (the lock): the GPU is the shared resource.
 */
struct qstage {
	long long in_cap, out_cap;
	uint8_t *pin_in[2], *pin_out[2], *d_in[2], *d_out[2];
	QStatus *d_st[2], *h_st[2];
	cudaStream_t st[2];
	cudaEvent_t ev[2];
};

static pthread_mutex_t qstage_lock = PTHREAD_MUTEX_INITIALIZER;
static struct qstage qstage;

static void qstage_drop(struct qstage *q)
{
	for (int i = 0; i < 2; i++) {
		if (q->st[i]) {
			cudaStreamSynchronize(q->st[i]);
			cudaStreamDestroy(q->st[i]);
		}
		if (q->ev[i])
			cudaEventDestroy(q->ev[i]);
		cudaFreeHost(q->pin_in[i]);
		cudaFreeHost(q->pin_out[i]);
		cudaFreeHost(q->h_st[i]);
		cudaFree(q->d_in[i]);
		cudaFree(q->d_out[i]);
		cudaFree(q->d_st[i]);
	}
	memset(q, 0, sizeof(*q));
}

static int qstage_reserve(struct qstage *q, long long in, long long out, struct ms_err *err)
{
	int rc = MS_OK;

	if (q->st[0] && in <= q->in_cap && out <= q->out_cap)
		return MS_OK;
	qstage_drop(q);
	/* some headroom, so that a slightly larger tensor does not reallocate */
	in += in / 4;
	out += out / 4;
	for (int i = 0; i < 2; i++) {
		CK(cudaHostAlloc((void **)&q->pin_in[i], in, cudaHostAllocDefault));
		CK(cudaHostAlloc((void **)&q->pin_out[i], out, cudaHostAllocDefault));
		CK(cudaHostAlloc((void **)&q->h_st[i], sizeof(QStatus), cudaHostAllocDefault));
		CK(cudaMalloc((void **)&q->d_in[i], in));
		CK(cudaMalloc((void **)&q->d_out[i], out));
		CK(cudaMalloc((void **)&q->d_st[i], sizeof(QStatus)));
		CK(cudaStreamCreateWithFlags(&q->st[i], cudaStreamNonBlocking));
		CK(cudaEventCreateWithFlags(&q->ev[i], cudaEventDisableTiming));
	}
	q->in_cap = in;
	q->out_cap = out;
	return MS_OK;
out:
	qstage_drop(q);
	return rc;
}

extern "C" int ms_gpu_nvfp4_quantize_host(const struct ms_nvfp4_params *p,
					  const struct ms_nvfp4_src *src, float amax,
					  uint64_t chunk_rows, uint8_t *packed,
					  uint8_t *scales, uint8_t *packed_t,
					  uint8_t *scales_t, struct ms_err *err)
{
	struct qstage *q = &qstage;
	QArgs *a = NULL;
	long long rows, cols, cp, rp, ch, row_bytes, out_row, out_col, nch;
	int es = elem_size(src->dtype), rc, locked = 0, cuda_failed = 0;

	if ((rc = check_outputs(packed, scales, packed_t, scales_t, err)) != MS_OK)
		return rc;
	if ((rc = ms_gpu_ready(err)) != MS_OK)
		return rc;
	a = (QArgs *)ms_malloc(sizeof(*a));
	if (!a)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	if ((rc = q_prepare(p, src, amax, a, err)) != MS_OK)
		goto out;
	rows = a->rows;
	cols = a->cols;
	cp = a->cp;
	rp = a->rp;
	if (!rows || !cols)
		goto out;
	row_bytes = cols * es;
	/* 16 MiB of input per chunk: two chunks in flight already keep the
	 * copy engines busy */
	ch = chunk_rows ? (long long)chunk_rows : (16ll << 20) / (row_bytes ? row_bytes : 1);
	ch = rup16(ch < 16 ? 16 : ch);
	if (ch > rp)
		ch = rp;
	nch = (rows + ch - 1) / ch;
	out_row = packed ? ch * (cp / 2 + cp / 16) : 0;
	out_col = packed_t ? cols * (ch / 2 + ch / 16) : 0;
	pthread_mutex_lock(&qstage_lock);
	locked = 1;
	cuda_failed = 1; /* until the CUDA calls below have all succeeded */
	if ((rc = qstage_reserve(q, ch * row_bytes, out_row + out_col, err)) != MS_OK)
		goto out;
	/* chunk k is issued, then chunk k - 1 is collected: the CPU copies of
	 * one chunk overlap the GPU's work on the other */
	for (long long k = 0; k <= nch; k++) {
		if (k < nch) {
			const int s = (int)(k & 1);
			const long long r0 = k * ch, h = rows - r0 < ch ? rows - r0 : ch;
			const long long hp = rup16(h);

			{
				const struct pcopy in = {q->pin_in[s],
							 (const uint8_t *)src->data + r0 * row_bytes,
							 (size_t)(h * row_bytes), 1, 0, 0};

				par_copy(&in, 1);
			}
			CK(cudaMemcpyAsync(q->d_in[s], q->pin_in[s], h * row_bytes,
					   cudaMemcpyHostToDevice, q->st[s]));
			CK(cudaMemsetAsync(&q->d_st[s]->first_bad, 0xff, sizeof(q->d_st[s]->first_bad),
					   q->st[s]));
			CK(cudaMemsetAsync(&q->d_st[s]->over, 0, 2 * sizeof(unsigned int), q->st[s]));
			a->src = q->d_in[s];
			a->rows = h;
			a->rp = hp;
			a->row_base = r0;
			a->st = q->d_st[s];
			a->packed = packed ? q->d_out[s] : NULL;
			a->scales = packed ? q->d_out[s] + ch * (cp / 2) : NULL;
			a->co.packed_t = packed_t ? q->d_out[s] + out_row : NULL;
			a->co.scales_t = packed_t ? q->d_out[s] + out_row + cols * (hp / 2) : NULL;
			if ((rc = q_launch(a, src->dtype, p->block == MS_NVFP4_BLOCK_2D,
					   q->st[s], err)) != MS_OK)
				goto out;
			if (packed) {
				CK(cudaMemcpyAsync(q->pin_out[s], q->d_out[s], h * (cp / 2),
						   cudaMemcpyDeviceToHost, q->st[s]));
				CK(cudaMemcpyAsync(q->pin_out[s] + ch * (cp / 2),
						   q->d_out[s] + ch * (cp / 2), h * (cp / 16),
						   cudaMemcpyDeviceToHost, q->st[s]));
			}
			if (packed_t)
				CK(cudaMemcpyAsync(q->pin_out[s] + out_row, q->d_out[s] + out_row,
						   cols * (hp / 2 + hp / 16),
						   cudaMemcpyDeviceToHost, q->st[s]));
			CK(cudaMemcpyAsync(q->h_st[s], q->d_st[s], sizeof(QStatus),
					   cudaMemcpyDeviceToHost, q->st[s]));
			CK(cudaEventRecord(q->ev[s], q->st[s]));
		}
		if (k >= 1) {
			const int s = (int)((k - 1) & 1);
			const long long r0 = (k - 1) * ch, h = rows - r0 < ch ? rows - r0 : ch;
			const long long hp = rup16(h);

			CK(cudaEventSynchronize(q->ev[s]));
			if ((rc = q_status_err(q->h_st[s], src, amax, err)) != MS_OK) {
				/* bad input, not a CUDA failure: the staging stays */
				for (int i = 0; i < 2; i++)
					cudaStreamSynchronize(q->st[i]);
				cuda_failed = 0;
				goto out;
			}
			{
				const uint8_t *pc = q->pin_out[s] + out_row, *sc = pc + cols * (hp / 2);
				struct pcopy outs[4];
				int no = 0;

				if (packed) {
					outs[no++] = (struct pcopy){packed + r0 * (cp / 2), q->pin_out[s],
								    (size_t)(h * (cp / 2)), 1, 0, 0};
					outs[no++] = (struct pcopy){scales + r0 * (cp / 16),
								    q->pin_out[s] + ch * (cp / 2),
								    (size_t)(h * (cp / 16)), 1, 0, 0};
				}
				if (packed_t) {
					outs[no++] = (struct pcopy){packed_t + r0 / 2, pc, (size_t)(hp / 2),
								    (size_t)cols, (size_t)(rp / 2),
								    (size_t)(hp / 2)};
					outs[no++] = (struct pcopy){scales_t + r0 / 16, sc, (size_t)(hp / 16),
								    (size_t)cols, (size_t)(rp / 16),
								    (size_t)(hp / 16)};
				}
				par_copy(outs, no);
			}
		}
	}
	cuda_failed = 0;
out:
	if (locked) {
		if (cuda_failed)
			qstage_drop(q);
		pthread_mutex_unlock(&qstage_lock);
	}
	ms_free(a);
	return rc;
}

extern "C" int ms_gpu_nvfp4_quantize(const struct ms_nvfp4_params *p,
				     const struct ms_nvfp4_src *src, float amax,
				     uint8_t *packed, uint8_t *scales, uint8_t *packed_t,
				     uint8_t *scales_t, struct ms_err *err)
{
	QArgs *a = NULL;
	QStatus *d_st = NULL, h_st;
	int on_dev, rc;

	if ((rc = check_outputs(packed, scales, packed_t, scales_t, err)) != MS_OK)
		return rc;
	if ((rc = ms_gpu_ready(err)) != MS_OK)
		return rc;
	on_dev = ms_gpu_is_device_ptr(src->data);
	if ((packed && ms_gpu_is_device_ptr(packed) != on_dev) ||
	    (scales && ms_gpu_is_device_ptr(scales) != on_dev) ||
	    (packed_t && ms_gpu_is_device_ptr(packed_t) != on_dev) ||
	    (scales_t && ms_gpu_is_device_ptr(scales_t) != on_dev))
		return ms_err_set(err, MS_EINVAL,
				  "nvfp4 buffers must all be in host memory or all on the gpu");
	if (!on_dev && src->rows && src->cols)
		return ms_gpu_nvfp4_quantize_host(p, src, amax, 0, packed, scales,
						  packed_t, scales_t, err);
	a = (QArgs *)ms_malloc(sizeof(*a));
	if (!a)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	if ((rc = q_prepare(p, src, amax, a, err)) != MS_OK)
		goto out;
	if (!a->rows || !a->cols)
		goto out;
	/* stream-ordered: no device-wide synchronization per call */
	CK(cudaMallocAsync((void **)&d_st, sizeof(*d_st), 0));
	CK(cudaMemcpyAsync(d_st, &qstatus_init, sizeof(*d_st), cudaMemcpyHostToDevice, 0));
	a->src = src->data;
	a->packed = packed;
	a->scales = scales;
	a->co.packed_t = packed_t;
	a->co.scales_t = scales_t;
	a->st = d_st;
	if ((rc = q_launch(a, src->dtype, p->block == MS_NVFP4_BLOCK_2D, 0, err)) != MS_OK)
		goto out;
	CK(cudaMemcpy(&h_st, d_st, sizeof(h_st), cudaMemcpyDeviceToHost));
	rc = q_status_err(&h_st, src, amax, err);
out:
	if (d_st)
		cudaFreeAsync(d_st, 0);
	ms_free(a);
	return rc;
}

/* ---- host: dequantize -------------------------------------------------------------- */

extern "C" int ms_gpu_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales,
				       uint64_t rows, uint64_t cols, float tscale,
				       enum ms_nvfp4_tscale_kind kind,
				       enum ms_dtype out_dtype, void *out,
				       struct ms_err *err)
{
	uint64_t ps[2] = {0, 0}, ss[2] = {0, 0};
	DArgs *a = NULL;
	uint8_t *dp = NULL, *ds = NULL, *dout = NULL;
	long long nblocks, osz;
	int on_dev, grid = 1, rc;

	if (out_dtype != MS_DTYPE_F32 && out_dtype != MS_DTYPE_BF16)
		return ms_err_set(err, MS_EINVAL, "nvfp4 dequantizes to f32 or bf16 only");
	if ((rc = ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, err)) != MS_OK)
		return rc;
	if ((rc = check_dims(rows, cols, err)) != MS_OK)
		return rc;
	if ((rc = ms_gpu_ready(err)) != MS_OK)
		return rc;
	if (!rows || !cols)
		return MS_OK;
	on_dev = ms_gpu_is_device_ptr(packed);
	if (ms_gpu_is_device_ptr(scales) != on_dev || ms_gpu_is_device_ptr(out) != on_dev)
		return ms_err_set(err, MS_EINVAL,
				  "nvfp4 buffers must all be in host memory or all on the gpu");
	a = (DArgs *)ms_calloc(1, sizeof(*a));
	if (!a)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	nblocks = (long long)(rows * ss[1]);
	osz = (long long)(rows * cols) * (out_dtype == MS_DTYPE_F32 ? 4 : 2);
	for (int s = 0; s < 256; s++)
		a->dtab[s] = ms_nvfp4_block_decode((uint8_t)s, tscale, kind);
	a->rows = (long long)rows;
	a->cols = (long long)cols;
	a->nb = (long long)ss[1];
	a->out_f32 = out_dtype == MS_DTYPE_F32;
	if (on_dev) {
		a->packed = packed;
		a->scales = scales;
		a->out = out;
	} else {
		CK(cudaMalloc((void **)&dp, nblocks * 8));
		CK(cudaMalloc((void **)&ds, nblocks));
		CK(cudaMalloc((void **)&dout, osz));
		CK(cudaMemcpy(dp, packed, nblocks * 8, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(ds, scales, nblocks, cudaMemcpyHostToDevice));
		a->packed = dp;
		a->scales = ds;
		a->out = dout;
	}
	a->vec_in = aligned(a->packed, 8);
	a->vec_out = aligned(a->out, 16) &&
		     (a->cols * (a->out_f32 ? 4 : 2)) % 16 == 0;
	if ((rc = grid_for((const void *)dequant_kernel, 256, (nblocks + 255) / 256, &grid,
			   err)) != MS_OK)
		goto out;
	dequant_kernel<<<grid, 256>>>(*a);
	CK(cudaGetLastError());
	if (!on_dev)
		CK(cudaMemcpy(out, dout, osz, cudaMemcpyDeviceToHost));
	else
		CK(cudaDeviceSynchronize());
out:
	cudaFree(dp);
	cudaFree(ds);
	cudaFree(dout);
	ms_free(a);
	return rc;
}

/* ---- host: transpose ----------------------------------------------------------------- */

extern "C" int ms_gpu_nvfp4_transpose(enum ms_nvfp4_block block, uint64_t rows,
				      uint64_t cols, const uint8_t *packed,
				      const uint8_t *scales, uint8_t *packed_t,
				      uint8_t *scales_t, struct ms_err *err)
{
	uint64_t ps[2] = {0, 0}, ss[2] = {0, 0}, pst[2] = {0, 0}, sst[2] = {0, 0};
	unsigned long long *d_first = NULL, first = NO_INDEX;
	uint8_t *dp = NULL, *ds = NULL, *dpt = NULL, *dst = NULL;
	TArgs a;
	int on_dev, grid = 1, rc;

	if (block != MS_NVFP4_BLOCK_2D)
		return ms_err_set(err, MS_EINVAL,
				  "1d-block nvfp4 cannot be transposed from its bytes: "
				  "the other orientation's 1x16 blocks need the "
				  "high-precision source");
	if ((rc = ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, err)) != MS_OK ||
	    (rc = ms_nvfp4_shapes(cols, rows, MS_NVFP4_LAYOUT_ROWWISE, pst, sst, err)) != MS_OK)
		return rc;
	if ((rc = check_dims(rows, cols, err)) != MS_OK)
		return rc;
	if ((rc = ms_gpu_ready(err)) != MS_OK)
		return rc;
	if (!rows || !cols)
		return MS_OK;
	on_dev = ms_gpu_is_device_ptr(packed);
	if (ms_gpu_is_device_ptr(scales) != on_dev || ms_gpu_is_device_ptr(packed_t) != on_dev ||
	    ms_gpu_is_device_ptr(scales_t) != on_dev)
		return ms_err_set(err, MS_EINVAL,
				  "nvfp4 buffers must all be in host memory or all on the gpu");
	memset(&a, 0, sizeof(a));
	if (on_dev) {
		a.packed = packed;
		a.scales = scales;
		a.co.packed_t = packed_t;
		a.co.scales_t = scales_t;
	} else {
		CK(cudaMalloc((void **)&dp, ps[0] * ps[1]));
		CK(cudaMalloc((void **)&ds, ss[0] * ss[1]));
		CK(cudaMalloc((void **)&dpt, pst[0] * pst[1]));
		CK(cudaMalloc((void **)&dst, sst[0] * sst[1]));
		CK(cudaMemcpy(dp, packed, ps[0] * ps[1], cudaMemcpyHostToDevice));
		CK(cudaMemcpy(ds, scales, ss[0] * ss[1], cudaMemcpyHostToDevice));
		a.packed = dp;
		a.scales = ds;
		a.co.packed_t = dpt;
		a.co.scales_t = dst;
	}
	a.rows = (long long)rows;
	a.cols = (long long)cols;
	a.cp = (long long)ps[1] * 2;
	a.rp = (long long)pst[1] * 2;
	a.ntr = (a.rows + QT_ROWS - 1) / QT_ROWS;
	a.ntiles = a.ntr * ((a.cp + QT_COLS - 1) / QT_COLS);
	a.vec_in = aligned(a.packed, 16) && (a.cp / 2) % 16 == 0;
	col_out_init(&a.co, a.cols, a.rp);
	CK(cudaMallocAsync((void **)&d_first, sizeof(*d_first), 0));
	CK(cudaMemcpyAsync(d_first, &first, sizeof(first), cudaMemcpyHostToDevice, 0));
	if ((rc = grid_for((const void *)tvalid_kernel, 256, a.rows, &grid, err)) != MS_OK)
		goto out;
	tvalid_kernel<<<grid, 256>>>(a.packed, a.scales, a.rows, a.cols, a.cp, d_first);
	CK(cudaGetLastError());
	CK(cudaMemcpy(&first, d_first, sizeof(first), cudaMemcpyDeviceToHost));
	if (first != NO_INDEX) {
		unsigned long long r = first >> 33, kind = (first >> 32) & 1,
				   i = first & 0xffffffffull;

		if (kind == 0)
			rc = ms_err_set(err, MS_EINVAL,
					"not a 2d-block quantization: row %llu disagrees with "
					"row %llu on the scale of tile column %llu",
					r, r & ~15ull, i);
		else
			rc = ms_err_set(err, MS_EINVAL, "padding element [%llu, %llu] is not zero",
					r, i);
		goto out;
	}
	if ((rc = grid_for((const void *)transpose_kernel, QT_THREADS, a.ntiles, &grid,
			   err)) != MS_OK)
		goto out;
	transpose_kernel<<<grid, QT_THREADS>>>(a);
	CK(cudaGetLastError());
	if (!on_dev) {
		CK(cudaMemcpy(packed_t, dpt, pst[0] * pst[1], cudaMemcpyDeviceToHost));
		CK(cudaMemcpy(scales_t, dst, sst[0] * sst[1], cudaMemcpyDeviceToHost));
	} else {
		CK(cudaDeviceSynchronize());
	}
out:
	if (d_first)
		cudaFreeAsync(d_first, 0);
	cudaFree(dp);
	cudaFree(ds);
	cudaFree(dpt);
	cudaFree(dst);
	return rc;
}
