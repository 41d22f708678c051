/*
 * lowrank.cu: a LoRA's low-rank products over one dense projection's rows
 * (lowrank.h says what and why).
 *
 * k_lr_down: a warp four rows, a lane every 32nd k of a 256-wide chunk of
 * W held in shared memory ([k][LR_R + 4]: a lane's LR_R values by four
 * conflict-free 16-byte reads), the lanes' partial sums added by shuffles.
 */
#include "gpu_internal.h"
#include "lowrank.h"

#define LR_R 16   /* MS_LR_MAX_R: the kernels' register and shared-memory width */
#define LR_KC 256

__global__ void __launch_bounds__(256) k_lr_down(const float *X, uint64_t ldx, uint64_t n,
						  uint32_t K, const float *W, uint64_t wk,
						  uint64_t wj, uint32_t r, float alpha, float *U)
{
	__align__(16) __shared__ float sw[LR_KC][LR_R + 4];
	uint32_t lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
	uint64_t r0 = ((uint64_t)blockIdx.x * 8 + wi) * 4;
	float acc[4][LR_R];
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < LR_R; j++)
			acc[i][j] = 0.0f;
	for (uint32_t k0 = 0; k0 < K; k0 += LR_KC) {
		__syncthreads();
		/* W's chunk, zeros past K and r; read along whichever of its
		 * strides is 1 (A's rows run along k, B's along j) */
		for (uint32_t i = threadIdx.x; i < LR_KC * LR_R; i += blockDim.x) {
			uint32_t k = wk == 1 ? i % LR_KC : i / LR_R, j = wk == 1 ? i / LR_KC : i % LR_R;
			sw[k][j] = k0 + k < K && j < r ? W[(uint64_t)(k0 + k) * wk + j * wj] : 0.0f;
		}
		__syncthreads();
		/* a lane's loads of four k steps (sixteen floats) issued before
		 * their FMAs: one load at a time left the X stream at a fraction
		 * of the memory's rate (the H200 profile: 5.6 ms a step for what
		 * reads 2 GB). Past K the loads give zeros, against W's zeros */
		uint32_t kn = K - k0 < LR_KC ? K - k0 : LR_KC;
#pragma unroll
		for (int s0 = 0; s0 < LR_KC / 32; s0 += 4) {
			float x[4][4];
#pragma unroll
			for (int t = 0; t < 4; t++) {
				uint32_t k = lane + 32 * (s0 + t);
#pragma unroll
				for (int i = 0; i < 4; i++)
					x[t][i] = k < kn && r0 + i < n ? X[(r0 + i) * ldx + k0 + k]
									: 0.0f;
			}
#pragma unroll
			for (int t = 0; t < 4; t++) {
				uint32_t k = lane + 32 * (s0 + t);
#pragma unroll
				for (int q = 0; q < LR_R / 4; q++) {
					float4 w = *(const float4 *)&sw[k][4 * q];
#pragma unroll
					for (int i = 0; i < 4; i++) {
						acc[i][4 * q] = fmaf(x[t][i], w.x, acc[i][4 * q]);
						acc[i][4 * q + 1] = fmaf(x[t][i], w.y, acc[i][4 * q + 1]);
						acc[i][4 * q + 2] = fmaf(x[t][i], w.z, acc[i][4 * q + 2]);
						acc[i][4 * q + 3] = fmaf(x[t][i], w.w, acc[i][4 * q + 3]);
					}
				}
			}
		}
	}
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < LR_R; j++)
#pragma unroll
			for (int o = 16; o; o >>= 1)
				acc[i][j] += __shfl_xor_sync(0xffffffffu, acc[i][j], o);
	/* every lane holds the sums: lane l writes (row l / LR_R, column l %
	 * LR_R) and the same 32 on */
#pragma unroll
	for (int h = 0; h < 4 * LR_R / 32; h++) {
		uint32_t idx = lane + 32 * h, i = idx / LR_R, j = idx % LR_R;
		float v = 0.0f;
#pragma unroll
		for (int a = 0; a < 4; a++)
#pragma unroll
			for (int b = 0; b < LR_R; b++)
				if ((uint32_t)a == i && (uint32_t)b == j)
					v = acc[a][b];
		if (r0 + i < n && j < r)
			U[(r0 + i) * r + j] = alpha * v;
	}
}

/* k_lr_up: Y [n, N] = beta Y + alpha U [n, r] V^T, V(j, q) = V[j * vj + q *
 * vq]. A thread four columns (16-byte accesses of Y: N a multiple of 4,
 * Y aligned) with their V in registers, a block 32 rows of U in shared
 * memory (read by all its threads at once). */
__global__ void __launch_bounds__(128) k_lr_up(const float *U, uint64_t n, uint32_t r,
						const float *V, uint64_t vj, uint64_t vq, float alpha,
						float beta, float *Y, uint32_t N)
{
	__align__(16) __shared__ float su[32][LR_R];
	uint32_t j0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
	uint64_t r0 = (uint64_t)blockIdx.y * 32;
	float v[4][LR_R];
#pragma unroll
	for (int c = 0; c < 4; c++)
#pragma unroll
		for (int q = 0; q < LR_R; q++)
			v[c][q] = j0 + c < N && (uint32_t)q < r ? V[(j0 + c) * vj + q * vq] : 0.0f;
	for (uint32_t i = threadIdx.x; i < 32 * LR_R; i += blockDim.x) {
		uint32_t rr = i / LR_R, q = i % LR_R;
		su[rr][q] = r0 + rr < n && q < r ? U[(r0 + rr) * r + q] : 0.0f;
	}
	__syncthreads();
	if (j0 >= N)
		return;
	/* four rows at a time, their Y loads issued before any store (the
	 * compiler cannot move a load past a store to the same array) */
	uint32_t nr = n - r0 < 32 ? (uint32_t)(n - r0) : 32;
	for (uint32_t rr = 0; rr < nr; rr += 4) {
		float4 b[4];
#pragma unroll
		for (int t = 0; t < 4; t++)
			b[t] = beta != 0.0f && rr + t < nr
				       ? *(const float4 *)(Y + (r0 + rr + t) * N + j0)
				       : make_float4(0, 0, 0, 0);
#pragma unroll
		for (int t = 0; t < 4; t++) {
			if (rr + t >= nr)
				break;
			float a[4] = {0, 0, 0, 0};
#pragma unroll
			for (int q = 0; q < LR_R / 4; q++) {
				float4 u = *(const float4 *)&su[rr + t][4 * q];
#pragma unroll
				for (int c = 0; c < 4; c++) {
					a[c] = fmaf(u.x, v[c][4 * q], a[c]);
					a[c] = fmaf(u.y, v[c][4 * q + 1], a[c]);
					a[c] = fmaf(u.z, v[c][4 * q + 2], a[c]);
					a[c] = fmaf(u.w, v[c][4 * q + 3], a[c]);
				}
			}
			float4 o;
			o.x = beta * b[t].x + alpha * a[0];
			o.y = beta * b[t].y + alpha * a[1];
			o.z = beta * b[t].z + alpha * a[2];
			o.w = beta * b[t].w + alpha * a[3];
			*(float4 *)(Y + (r0 + rr + t) * N + j0) = o;
		}
	}
}

/* k_lr_wgrad: P[s] (j, q) = sum over split s's rows i of D [i, j] U [i, q]
 * (D [n, N], N a multiple of 4, aligned); a thread four columns and all of
 * r, a block a split's rows, U's rows 32 at a time through shared memory.
 * k_lr_wsum: G(j, q) = beta G + alpha sum over s in order (deterministic,
 * where atomics would not be), G(j, q) = G[j * gj + q * gq]. */
__global__ void __launch_bounds__(128) k_lr_wgrad(const float *D, uint64_t n, uint32_t N,
						   const float *U, uint32_t r, uint64_t run,
						   float *P)
{
	__align__(16) __shared__ float su[32][LR_R];
	uint32_t j0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
	uint64_t a0 = (uint64_t)blockIdx.y * run, a1 = a0 + run < n ? a0 + run : n;
	float acc[4][LR_R];
#pragma unroll
	for (int c = 0; c < 4; c++)
#pragma unroll
		for (int q = 0; q < LR_R; q++)
			acc[c][q] = 0.0f;
	for (uint64_t b0 = a0; b0 < a1; b0 += 32) {
		__syncthreads();
		for (uint32_t i = threadIdx.x; i < 32 * LR_R; i += blockDim.x) {
			uint32_t rr = i / LR_R, q = i % LR_R;
			su[rr][q] = b0 + rr < a1 && q < r ? U[(b0 + rr) * r + q] : 0.0f;
		}
		__syncthreads();
		if (j0 >= N)
			continue;
		/* eight rows' loads in flight before their FMAs (one at a
		 * time, the few threads a run's 128 columns give could not
		 * keep the memory busy); rows past the run read as zeros,
		 * against U's zero rows */
		uint32_t nr = a1 - b0 < 32 ? (uint32_t)(a1 - b0) : 32;
		for (uint32_t rr = 0; rr < nr; rr += 8) {
			float4 d[8];
#pragma unroll
			for (int t = 0; t < 8; t++)
				d[t] = rr + t < nr ? *(const float4 *)(D + (b0 + rr + t) * N + j0)
						   : make_float4(0, 0, 0, 0);
#pragma unroll
			for (int t = 0; t < 8; t++) {
				float dv[4] = {d[t].x, d[t].y, d[t].z, d[t].w};
#pragma unroll
				for (int q = 0; q < LR_R / 4; q++) {
					float4 u = *(const float4 *)&su[rr + t][4 * q];
#pragma unroll
					for (int c = 0; c < 4; c++) {
						acc[c][4 * q] = fmaf(dv[c], u.x, acc[c][4 * q]);
						acc[c][4 * q + 1] = fmaf(dv[c], u.y, acc[c][4 * q + 1]);
						acc[c][4 * q + 2] = fmaf(dv[c], u.z, acc[c][4 * q + 2]);
						acc[c][4 * q + 3] = fmaf(dv[c], u.w, acc[c][4 * q + 3]);
					}
				}
			}
		}
	}
	if (j0 >= N)
		return;
	float *p = P + (uint64_t)blockIdx.y * N * LR_R;
#pragma unroll
	for (int c = 0; c < 4; c++)
#pragma unroll
		for (int q = 0; q < LR_R; q++)
			if (j0 + c < N)
				p[(uint64_t)(j0 + c) * LR_R + q] = acc[c][q];
}

__global__ void k_lr_wsum(const float *P, uint32_t ns, uint32_t N, uint32_t r, float alpha,
			  float beta, float *G, uint64_t gj, uint64_t gq)
{
	uint64_t tot = (uint64_t)N * r;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < tot;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t j = i / r, q = i % r;
		float s = 0.0f;
		for (uint32_t z = 0; z < ns; z++)
			s += P[((uint64_t)z * N + j) * LR_R + q];
		float *gp = G + j * gj + q * gq;
		*gp = (beta != 0.0f ? beta * *gp : 0.0f) + alpha * s;
	}
}


extern "C" int ms_lr_down(const float *X, uint64_t n, uint32_t K, const float *W, uint64_t wk,
			  uint64_t wj, uint32_t r, float alpha, float *U, void *stream,
			  struct ms_err *err)
{
	int rc = MS_OK;
	if (!r || r > MS_LR_MAX_R || !X || !W || !U)
		return ms_err_set(err, MS_EINVAL, "low-rank product: rank %u (1 .. %u) or a "
				  "NULL pointer", r, MS_LR_MAX_R);
	if (!n)
		return MS_OK;
	if ((n + 31) / 32 > 0x7fffffffull)
		return ms_err_set(err, MS_EINVAL, "low-rank product: %llu rows: too many",
				  (unsigned long long)n);
	k_lr_down<<<(unsigned)((n + 31) / 32), 256, 0, (cudaStream_t)stream>>>(X, K, n, K, W, wk,
									      wj, r, alpha, U);
	CK(cudaGetLastError());
out:
	return rc;
}

/* N a multiple of 4 and the rows' floats 16-byte aligned */
static int lr_wide_ok(const float *p, uint32_t N)
{
	return p && N % 4 == 0 && !((uintptr_t)p & 15);
}

extern "C" int ms_lr_up(const float *U, uint64_t n, uint32_t r, const float *V, uint64_t vj,
			uint64_t vq, float alpha, float beta, float *Y, uint32_t N, void *stream,
			struct ms_err *err)
{
	int rc = MS_OK;
	if (!r || r > MS_LR_MAX_R || !U || !V || !lr_wide_ok(Y, N))
		return ms_err_set(err, MS_EINVAL, "low-rank product: rank %u (1 .. %u), %u "
				  "columns (a multiple of 4, 16-byte aligned rows) or a NULL "
				  "pointer", r, MS_LR_MAX_R, N);
	if (!n || !N)
		return MS_OK;
	if ((n + 31) / 32 > 65535)
		return ms_err_set(err, MS_EINVAL, "low-rank product: %llu rows: too many",
				  (unsigned long long)n);
	k_lr_up<<<dim3((N / 4 + 127) / 128, (unsigned)((n + 31) / 32)), 128, 0,
		   (cudaStream_t)stream>>>(U, n, r, V, vj, vq, alpha, beta, Y, N);
	CK(cudaGetLastError());
out:
	return rc;
}

extern "C" int ms_lr_wgrad(const float *D, uint64_t n, uint32_t N, const float *U, uint32_t r,
			   float alpha, float beta, float *G, uint64_t gj, uint64_t gq,
			   float *part, uint64_t npart, void *stream, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t ns, run, cap;
	if (!r || r > MS_LR_MAX_R || !U || !G || !part || !lr_wide_ok(D, N))
		return ms_err_set(err, MS_EINVAL, "low-rank gradient: rank %u (1 .. %u), %u "
				  "columns (a multiple of 4, 16-byte aligned rows) or a NULL "
				  "pointer", r, MS_LR_MAX_R, N);
	if (!N)
		return MS_OK;
	cap = npart / ((uint64_t)N * LR_R);
	if (!cap)
		return ms_err_set(err, MS_EINVAL, "low-rank gradient: %llu floats of partial sums "
				  "hold no run of %u columns", (unsigned long long)npart, N);
	/* runs of about 64 rows (enough blocks to fill the GPU at the
	 * trainer's shapes: 8192 rows of 2048 columns give 512 blocks), at
	 * most 128 and what part holds */
	ns = (n + 63) / 64;
	ns = ns > 128 ? 128 : ns;
	ns = ns > cap ? cap : ns;
	ns = ns ? ns : 1;
	run = (n + ns - 1) / ns;
	ns = run ? (n + run - 1) / run : 1;
	if (n)
		k_lr_wgrad<<<dim3((N / 4 + 127) / 128, (unsigned)ns), 128, 0,
			      (cudaStream_t)stream>>>(D, n, N, U, r, run, part);
	else
		CK(cudaMemsetAsync(part, 0, (uint64_t)N * LR_R * sizeof(float),
				   (cudaStream_t)stream));
	CK(cudaGetLastError());
	{
		uint64_t tot = (uint64_t)N * r, nb = (tot + 255) / 256;
		k_lr_wsum<<<(unsigned)(nb < 4096 ? nb : 4096), 256, 0, (cudaStream_t)stream>>>(
			part, (uint32_t)ns, N, r, alpha, beta, G, gj, gq);
	}
	CK(cudaGetLastError());
out:
	return rc;
}
