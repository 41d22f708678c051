/*
 * gather_probe.cu: the MoE dispatch copy at the trainer benchmark's shapes
 * (8192 tokens, top-8 of 64 experts, hidden 2048): each token's bf16 row
 * copied to its 8 places in the experts' order, rows of a twin 2064 wide
 * (the folded LoRA's 16 columns after them, not written here). Ways to
 * lay it, each bit-compared with the first:
 *
 *   gather 4     a block GATHER_ROWS = 4 destination rows, reading each
 *                token's row once per place (train.cu's k_gather)
 *   gather 8     the same, 8 rows a block step
 *   gather grid  gather 4 on a grid of 8 blocks an SM, striding
 *   scatter      a block a token: its row read once (16 bytes a thread),
 *                then written to its 8 places (pos)
 *   scatter 2    the same, two tokens a block step, both loads first
 *
 * and for the backward's, where the source is the float32 gradient and
 * its bf16 copy is wanted too: k_cast then gather 4 (the trainer's two
 * passes), against one scatter pass writing the copy and the 8 places.
 * Next to it what the memory allows: a kernel writing the same rows with
 * no loads (store only), and a device copy of the twin's bytes. GPU time
 * a call from CUDA events over 20 calls after 3. Not built by make:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -o gather_probe tools/bench/gather_probe.cu
 *   ./gather_probe
 */
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

#include "probe_fill.cuh"

#define PK(x) do { cudaError_t e_ = (x); if (e_) { printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)

typedef __nv_bfloat16 bf;

/* dst[j] = src[perm[j] / K], R rows a block step (k_gather's form) */
template <int R>
__global__ void g_gather(const bf *src, const int32_t *perm, uint32_t K, bf *dst, uint64_t n,
			 uint32_t H, uint32_t ldt)
{
	for (uint64_t j0 = (uint64_t)blockIdx.x * R; j0 < n; j0 += (uint64_t)gridDim.x * R) {
		const bf *s[R];
#pragma unroll
		for (int q = 0; q < R; q++)
			s[q] = j0 + q < n ? src + (uint64_t)(perm[j0 + q] / K) * H : NULL;
		for (uint32_t c = threadIdx.x * 8; c < H; c += blockDim.x * 8) {
			uint4 v[R];
#pragma unroll
			for (int q = 0; q < R; q++)
				if (s[q])
					v[q] = *(const uint4 *)(s[q] + c);
#pragma unroll
			for (int q = 0; q < R; q++)
				if (s[q])
					*(uint4 *)(dst + (j0 + q) * ldt + c) = v[q];
		}
	}
}

/* a token's row read once, written at pos[t K + k], NT tokens a block step */
template <int NT>
__global__ void g_scatter(const bf *src, const int32_t *pos, uint32_t K, bf *dst, uint64_t T,
			  uint32_t H, uint32_t ldt)
{
	for (uint64_t t0 = (uint64_t)blockIdx.x * NT; t0 < T; t0 += (uint64_t)gridDim.x * NT)
		for (uint32_t c = threadIdx.x * 8; c < H; c += blockDim.x * 8) {
			uint4 v[NT];
#pragma unroll
			for (int q = 0; q < NT; q++)
				if (t0 + q < T)
					v[q] = *(const uint4 *)(src + (t0 + q) * H + c);
#pragma unroll
			for (int q = 0; q < NT; q++) {
				if (t0 + q >= T)
					break;
				for (uint32_t k = 0; k < K; k++)
					*(uint4 *)(dst + (uint64_t)pos[(t0 + q) * K + k] * ldt + c) = v[q];
			}
		}
}

/* the backward's: x float32 rows to their bf16 copy xb and its 8 places */
__global__ void g_scatter_cast(const float *x, const int32_t *pos, uint32_t K, bf *xb, bf *dst,
			       uint64_t T, uint32_t H, uint32_t ldt)
{
	for (uint64_t t = blockIdx.x; t < T; t += gridDim.x)
		for (uint32_t c = threadIdx.x * 8; c < H; c += blockDim.x * 8) {
			float4 a = *(const float4 *)(x + t * H + c), b = *(const float4 *)(x + t * H + c + 4);
			__nv_bfloat162 h[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
					       __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
			uint4 v = *(uint4 *)h;
			*(uint4 *)(xb + t * H + c) = v;
			for (uint32_t k = 0; k < K; k++)
				*(uint4 *)(dst + (uint64_t)pos[t * K + k] * ldt + c) = v;
		}
}

__global__ void g_cast(const float *x, bf *y, uint64_t n)
{
	for (uint64_t i = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x * 8) {
		float4 a = *(const float4 *)(x + i), b = *(const float4 *)(x + i + 4);
		__nv_bfloat162 h[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
				       __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
		*(uint4 *)(y + i) = *(uint4 *)h;
	}
}

/* the twin's rows written with no loads: the stores' floor */
__global__ void g_store(bf *dst, uint64_t n, uint32_t H, uint32_t ldt)
{
	uint4 z = make_uint4(1, 2, 3, 4);
	for (uint64_t j = blockIdx.x; j < n; j += gridDim.x)
		for (uint32_t c = threadIdx.x * 8; c < H; c += blockDim.x * 8)
			*(uint4 *)(dst + j * ldt + c) = z;
}

int main()
{
	const uint32_t T = 8192, K = 8, E = 64, H = 2048, ldt = H + 16;
	const uint64_t TK = (uint64_t)T * K;
	int sms = 0;
	PK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	/* a routing: each token 8 distinct experts, uniformly; perm sorts the
	 * selections by expert (stable), pos inverts it */
	std::vector<int32_t> sel(TK), perm(TK), pos(TK);
	uint32_t x = 7;
	for (uint32_t t = 0; t < T; t++) {
		std::vector<int> pick;
		while (pick.size() < K) {
			x = x * 1664525u + 1013904223u;
			int e = (int)(x >> 8) % (int)E;
			if (std::find(pick.begin(), pick.end(), e) == pick.end())
				pick.push_back(e);
		}
		for (uint32_t k = 0; k < K; k++)
			sel[t * K + k] = pick[k];
	}
	{
		std::vector<uint32_t> off(E + 1, 0);
		for (uint64_t i = 0; i < TK; i++)
			off[sel[i] + 1]++;
		for (uint32_t e = 0; e < E; e++)
			off[e + 1] += off[e];
		for (uint64_t i = 0; i < TK; i++) {
			uint32_t q = off[sel[i]]++;
			perm[q] = (int32_t)i;
			pos[i] = (int32_t)q;
		}
	}
	bf *src, *dst, *ref, *xb, *xbr, *cp;
	float *xf;
	int32_t *dperm, *dpos;
	PK(cudaMalloc(&src, (size_t)T * H * 2));
	PK(cudaMalloc(&xf, (size_t)T * H * 4));
	PK(cudaMalloc(&xb, (size_t)T * H * 2));
	PK(cudaMalloc(&xbr, (size_t)T * H * 2));
	PK(cudaMalloc(&dst, TK * ldt * 2));
	PK(cudaMalloc(&ref, TK * ldt * 2));
	PK(cudaMalloc(&cp, TK * ldt * 2));
	PK(cudaMalloc(&dperm, TK * 4));
	PK(cudaMalloc(&dpos, TK * 4));
	PK(cudaMemcpy(dperm, perm.data(), TK * 4, cudaMemcpyHostToDevice));
	PK(cudaMemcpy(dpos, pos.data(), TK * 4, cudaMemcpyHostToDevice));
	probe_fill<<<1024, 256>>>(src, (size_t)T * H, 11u);
	probe_fill<<<1024, 256>>>(xf, (size_t)T * H, 12u);
	PK(cudaDeviceSynchronize());
	cudaEvent_t a, b;
	PK(cudaEventCreate(&a));
	PK(cudaEventCreate(&b));
	double wbytes = (double)TK * H * 2;
	auto timeit = [&](const char *name, double bytes, auto fn) {
		for (int i = 0; i < 3; i++)
			fn();
		PK(cudaEventRecord(a));
		for (int i = 0; i < 20; i++)
			fn();
		PK(cudaEventRecord(b));
		PK(cudaEventSynchronize(b));
		float ms = 0;
		PK(cudaEventElapsedTime(&ms, a, b));
		ms /= 20;
		printf("%-34s %.4f ms  %.2f TB/s\n", name, ms, bytes / (ms * 1e-3) / 1e12);
	};
	auto same = [&](const char *name, const bf *p, const bf *q, size_t n) {
		/* only the first H columns of each twin row are ours */
		std::vector<uint16_t> hp(n), hq(n);
		PK(cudaMemcpy(hp.data(), p, n * 2, cudaMemcpyDeviceToHost));
		PK(cudaMemcpy(hq.data(), q, n * 2, cudaMemcpyDeviceToHost));
		size_t bad = 0;
		for (size_t i = 0; i < n; i++)
			if ((i % ldt) < H && hp[i] != hq[i])
				bad++;
		printf("%-34s %s\n", name, bad ? "DIFFERS" : "same bits");
	};
	unsigned gb4 = (unsigned)((TK + 3) / 4), gb8 = (unsigned)((TK + 7) / 8);
	double fb = wbytes + (double)T * H * 2; /* the rows written + the tokens read once */
	PK(cudaMemset(ref, 0, TK * ldt * 2));
	PK(cudaMemset(dst, 0, TK * ldt * 2));
	timeit("gather 4 (k_gather)", fb, [&] { g_gather<4><<<gb4, 256>>>(src, dperm, K, ref, TK, H, ldt); });
	timeit("gather 8", fb, [&] { g_gather<8><<<gb8, 256>>>(src, dperm, K, dst, TK, H, ldt); });
	same("  gather 8", dst, ref, TK * ldt);
	PK(cudaMemset(dst, 0, TK * ldt * 2));
	timeit("gather grid (8 blocks an SM)", fb, [&] { g_gather<4><<<sms * 8, 256>>>(src, dperm, K, dst, TK, H, ldt); });
	same("  gather grid", dst, ref, TK * ldt);
	PK(cudaMemset(dst, 0, TK * ldt * 2));
	timeit("scatter", fb, [&] { g_scatter<1><<<T, 256>>>(src, dpos, K, dst, T, H, ldt); });
	same("  scatter", dst, ref, TK * ldt);
	PK(cudaMemset(dst, 0, TK * ldt * 2));
	timeit("scatter 2", fb, [&] { g_scatter<2><<<T / 2, 256>>>(src, dpos, K, dst, T, H, ldt); });
	same("  scatter 2", dst, ref, TK * ldt);
	PK(cudaMemset(dst, 0, TK * ldt * 2));
	timeit("scatter, 128 threads", fb, [&] { g_scatter<1><<<T, 128>>>(src, dpos, K, dst, T, H, ldt); });
	same("  scatter, 128 threads", dst, ref, TK * ldt);
	timeit("store only", wbytes, [&] { g_store<<<(unsigned)TK, 256>>>(dst, TK, H, ldt); });
	timeit("copy of the twin (cudaMemcpyAsync)", 2.0 * TK * ldt * 2,
	       [&] { PK(cudaMemcpyAsync(cp, ref, TK * ldt * 2, cudaMemcpyDeviceToDevice)); });

	/* the backward's: float32 source, its bf16 copy too */
	double bb = wbytes + (double)T * H * 6;
	PK(cudaMemset(ref, 0, TK * ldt * 2));
	PK(cudaMemset(dst, 0, TK * ldt * 2));
	timeit("bwd: cast, then gather 4", bb, [&] {
		g_cast<<<(unsigned)((T * (uint64_t)H / 8 + 255) / 256), 256>>>(xf, xbr, (uint64_t)T * H);
		g_gather<4><<<gb4, 256>>>(xbr, dperm, K, ref, TK, H, ldt);
	});
	timeit("bwd: the cast alone", (double)T * H * 6, [&] {
		g_cast<<<(unsigned)((T * (uint64_t)H / 8 + 255) / 256), 256>>>(xf, xbr, (uint64_t)T * H);
	});
	timeit("bwd: scatter with the cast", bb, [&] {
		g_scatter_cast<<<T, 256>>>(xf, dpos, K, xb, dst, T, H, ldt);
	});
	same("  bwd scatter: the twin", dst, ref, TK * ldt);
	{
		std::vector<uint16_t> p((size_t)T * H), q((size_t)T * H);
		PK(cudaMemcpy(p.data(), xb, p.size() * 2, cudaMemcpyDeviceToHost));
		PK(cudaMemcpy(q.data(), xbr, q.size() * 2, cudaMemcpyDeviceToHost));
		printf("%-34s %s\n", "  bwd scatter: the copy", p == q ? "same bits" : "DIFFERS");
	}
	return 0;
}
