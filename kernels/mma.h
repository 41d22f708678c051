/*
 * mma.h: the warp-level tensor-core building blocks the CUDA kernels of
 * kernels/ share (flash.cu, ggemm.cu): mma.sync m16n8k16 on bf16 with
 * float accumulators, ldmatrix fragment loads from shared memory and
 * cp.async copies into it. CUDA device code: included by .cu files only.
 *
 * Fragment layouts are PTX's (the ISA specifies mma.sync's, unlike
 * wmma's), so a kernel may read a row and column off the lane number:
 * lane l holds C elements (row l / 4, columns 2 (l % 4), +1) and the same
 * 8 rows down.
 */
#ifndef MS_MMA_H
#define MS_MMA_H

#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

/* c += a b, a 16x16 (row), b 16x8 (col), bf16 in, float accumulate */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2])
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* two floats as a bf16 pair, lo in the low half (the lower column) */
__device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
	return *(uint32_t *)&v;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

/* four 8x8 bf16 matrices; lane l gives the address of row l % 8 of
 * matrix l / 8; r[i] gets matrix i's (row lane / 4, columns 2 (lane % 4),
 * +1) */
__device__ __forceinline__ void ldsm4(uint32_t r[4], const bf16 *p)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(smem_u32(p)));
}

/* the same, each matrix transposed: r[i] gets matrix i's (rows
 * 2 (lane % 4), +1; column lane / 4) */
__device__ __forceinline__ void ldsm4t(uint32_t r[4], const bf16 *p)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(smem_u32(p)));
}

/* 16 bytes global -> shared, asynchronous; n < 16 source bytes zero-fill
 * the rest (n = 0: zeros, nothing read) */
__device__ __forceinline__ void cp16(void *dst, const void *src, int n)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
		     "l"(src), "r"(n));
}

/* 4 bytes global -> shared, asynchronous, zero-fill as cp16 */
__device__ __forceinline__ void cp4(void *dst, const void *src, int n)
{
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)),
		     "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::);
}

/* wait until at most N of this thread's committed groups are in flight */
template <int N>
__device__ __forceinline__ void cp_wait(void)
{
	/* "memory": no shared-memory read is moved above the wait */
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* A fragment (16x16 at rows m0, columns k0) of a row-major tile: matrices
 * (m0, k0), (m0 + 8, k0), (m0, k0 + 8), (m0 + 8, k0 + 8) */
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const bf16 *s, int ld, int m0, int k0)
{
	int l = threadIdx.x & 31, i = l >> 3;
	ldsm4(a, s + (m0 + (l & 7) + 8 * (i & 1)) * ld + k0 + 8 * (i >> 1));
}

/* B fragments of columns n0.. and n0 + 8.. (k0..k0+15) where
 * B[k][n] = s[n*ld + k] (K in Q K^T): b[0..1] columns n0, b[2..3] n0 + 8 */
__device__ __forceinline__ void ldsm_bn(uint32_t b[4], const bf16 *s, int ld, int k0, int n0)
{
	int l = threadIdx.x & 31, i = l >> 3;
	ldsm4(b, s + (n0 + (l & 7) + 8 * (i >> 1)) * ld + k0 + 8 * (i & 1));
}

/* the same where B[k][n] = s[k*ld + n] (V in P V), through .trans */
__device__ __forceinline__ void ldsm_bk(uint32_t b[4], const bf16 *s, int ld, int k0, int n0)
{
	int l = threadIdx.x & 31, i = l >> 3;
	ldsm4t(b, s + (k0 + (l & 7) + 8 * (i & 1)) * ld + n0 + 8 * (i >> 1));
}

#endif
