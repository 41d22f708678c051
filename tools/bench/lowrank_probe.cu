/*
 * lowrank_probe.cu: the folded expert LoRA's down products
 * (ms_ggemm_lowrank_bf16, kernels/ggemm.cu) at the trainer benchmark's
 * shapes: 64 experts, 65536 expert rows (8192 tokens, top-8 of distinct
 * experts, uniformly), rank 16, Y written into X's 16 tail columns:
 *
 *   A  U = X A^T      D 768 of a row of 784, W_e [16, 768] (fold_u's)
 *   B  dU = 2 dY B    D 1536 of 1552, W_e [1536, 16] read transposed
 *                     (fold_du's, the LoRA scale 2)
 *
 * Each against what the trainer runs today, one cuBLAS grouped GEMM
 * (cublasGemmGroupedBatchedEx, bf16 in and out, float32 compute, a group
 * an expert with rows, the operands and strides of train.cu's fold_u and
 * fold_du; the pointer arrays already on the device, so their upload per
 * call is not timed), and next to a device-to-device copy of X's bytes
 * (it reads them and writes as many). GPU time a call from CUDA events
 * over 20 calls after 3 warm-ups; TB/s counts X's bytes read once. The
 * kernel's Y is checked against cuBLAS's within bf16's rounding (agree,
 * or DIFFERS with the worst error) and against its own second run bit
 * for bit (repeatable); the exit status is 1 when either fails. Not
 * built by make; after `make` (libms's error text pulls in cJSON):
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels -Isrc -o lowrank_probe \
 *     tools/bench/lowrank_probe.cu build/libms.a -lcublas -lcjson
 *   ./lowrank_probe
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ms.h"
#include "ggemm.h"
#include "probe_fill.cuh"

#define PK(x) do { cudaError_t e_ = (x); if (e_) { printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)
#define PB(x) do { cublasStatus_t s_ = (x); if (s_) { printf("cublas %d line %d\n", (int)s_, __LINE__); exit(1);} } while (0)

typedef __nv_bfloat16 bf;

static float bf2f(uint16_t v)
{
	uint32_t u = (uint32_t)v << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

int main()
{
	const uint32_t T = 8192, K = 8, E = 64, R = 16;
	const uint64_t TK = (uint64_t)T * K;
	/* a routing: each token 8 distinct experts, uniformly (gather_probe's) */
	std::vector<uint32_t> cnt(E, 0), off(E + 1, 0);
	uint32_t lcg = 7;
	for (uint32_t t = 0; t < T; t++) {
		std::vector<int> pick;
		while (pick.size() < K) {
			lcg = lcg * 1664525u + 1013904223u;
			int e = (int)(lcg >> 8) % (int)E;
			if (std::find(pick.begin(), pick.end(), e) == pick.end())
				pick.push_back(e);
		}
		for (int e : pick)
			cnt[e]++;
	}
	for (uint32_t e = 0; e < E; e++)
		off[e + 1] = off[e] + cnt[e];
	printf("rows %llu, an expert %u .. %u\n", (unsigned long long)off[E],
	       *std::min_element(cnt.begin(), cnt.end()), *std::max_element(cnt.begin(), cnt.end()));

	struct ms_err err;
	memset(&err, 0, sizeof err);
	uint32_t *dcnt, *doff, *dtiles;
	PK(cudaMalloc(&dcnt, E * 4));
	PK(cudaMalloc(&doff, (E + 1) * 4));
	PK(cudaMalloc(&dtiles, (E + 1) * 4));
	PK(cudaMemcpy(dcnt, cnt.data(), E * 4, cudaMemcpyHostToDevice));
	if (ms_ggemm_index(dcnt, E, doff, dtiles, NULL, &err)) {
		printf("ms_ggemm_index: %s\n", err.msg);
		return 1;
	}
	cublasHandle_t h;
	PB(cublasCreate(&h));
	cudaEvent_t ea, eb;
	PK(cudaEventCreate(&ea));
	PK(cudaEventCreate(&eb));

	struct pcase {
		const char *name;
		uint32_t D;
		int wt;
		float alpha;
	} cs[] = {
		{"A  U = X A^T (fold_u)", 768, 0, 1.0f},
		{"B  dU = 2 dY B (fold_du)", 1536, 1, 2.0f},
	};
	int bad = 0;
	for (const struct pcase &c : cs) {
		uint64_t ld = c.D + R, nx = TK * ld, nw = (uint64_t)E * R * c.D;
		double xbytes = (double)TK * c.D * 2;
		bf *x, *w, *cp;
		PK(cudaMalloc(&x, nx * 2));
		PK(cudaMalloc(&cp, nx * 2));
		PK(cudaMalloc(&w, nw * 2));
		probe_fill<<<1024, 256>>>(x, nx, 21u + c.D);
		probe_fill<<<1024, 256>>>(w, nw, 22u + c.D);
		PK(cudaDeviceSynchronize());

		struct ms_ggemm_lowrank_bf16 p;
		memset(&p, 0, sizeof p);
		p.E = E;
		p.R = R;
		p.D = c.D;
		p.rows = TK;
		p.off = doff;
		p.tiles = dtiles;
		p.x = x;
		p.ldx = ld;
		p.w = w;
		p.wstride = (uint64_t)R * c.D;
		p.wt = c.wt;
		p.y = x + c.D;
		p.ldy = ld;
		p.alpha = c.alpha;

		/* the trainer's grouped GEMM, column-major: fold_u C [16, n] =
		 * A^T B with A [D, 16] (lda D: W_e [16, D] row-major), fold_du
		 * C = s A B with A [16, D] (lda 16: W_e [D, 16] row-major); B
		 * the expert's rows of X (ldb ld), C their tail (ldc ld) */
		int q = 0;
		std::vector<cublasOperation_t> ta, tb;
		std::vector<int> mm, nn, kk, lda, ldb, ldc, gs;
		std::vector<float> al, be;
		std::vector<const void *> hA, hB;
		std::vector<void *> hC;
		for (uint32_t e = 0; e < E; e++) {
			if (!cnt[e])
				continue;
			ta.push_back(c.wt ? CUBLAS_OP_N : CUBLAS_OP_T);
			tb.push_back(CUBLAS_OP_N);
			mm.push_back((int)R);
			nn.push_back((int)cnt[e]);
			kk.push_back((int)c.D);
			lda.push_back(c.wt ? (int)R : (int)c.D);
			ldb.push_back((int)ld);
			ldc.push_back((int)ld);
			gs.push_back(1);
			al.push_back(c.alpha);
			be.push_back(0.0f);
			hA.push_back(w + (uint64_t)e * R * c.D);
			hB.push_back(x + (uint64_t)off[e] * ld);
			hC.push_back(x + (uint64_t)off[e] * ld + c.D);
			q++;
		}
		void **parr;
		PK(cudaMalloc(&parr, 3 * q * sizeof(void *)));
		PK(cudaMemcpy(parr, hA.data(), q * sizeof(void *), cudaMemcpyHostToDevice));
		PK(cudaMemcpy(parr + q, hB.data(), q * sizeof(void *), cudaMemcpyHostToDevice));
		PK(cudaMemcpy(parr + 2 * q, hC.data(), q * sizeof(void *), cudaMemcpyHostToDevice));

		auto ours = [&] {
			if (ms_ggemm_lowrank_bf16(&p, NULL, &err)) {
				printf("ms_ggemm_lowrank_bf16: %s\n", err.msg);
				exit(1);
			}
		};
		auto blas = [&] {
			PB(cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), mm.data(), nn.data(),
						      kk.data(), al.data(), (const void *const *)parr,
						      CUDA_R_16BF, lda.data(),
						      (const void *const *)(parr + q), CUDA_R_16BF,
						      ldb.data(), be.data(), parr + 2 * q, CUDA_R_16BF,
						      ldc.data(), q, gs.data(), CUBLAS_COMPUTE_32F));
		};
		auto copy = [&] { PK(cudaMemcpyAsync(cp, x, nx * 2, cudaMemcpyDeviceToDevice)); };
		auto timeit = [&](const char *name, auto fn) {
			for (int i = 0; i < 3; i++)
				fn();
			PK(cudaEventRecord(ea));
			for (int i = 0; i < 20; i++)
				fn();
			PK(cudaEventRecord(eb));
			PK(cudaEventSynchronize(eb));
			PK(cudaGetLastError());
			float ms = 0;
			PK(cudaEventElapsedTime(&ms, ea, eb));
			ms /= 20;
			printf("  %-34s %8.4f ms  %6.2f TB/s of X\n", name, ms, xbytes / (ms * 1e-3) / 1e12);
		};

		/* Y's columns: ours (twice: bit for bit), then cuBLAS's */
		std::vector<uint16_t> y0(TK * R), y1(TK * R), yb(TK * R);
		auto tail = [&](std::vector<uint16_t> &v) {
			PK(cudaDeviceSynchronize());
			PK(cudaMemcpy2D(v.data(), R * 2, x + c.D, ld * 2, R * 2, TK,
					cudaMemcpyDeviceToHost));
		};
		PK(cudaMemset2D(x + c.D, ld * 2, 0xff, R * 2, TK));
		ours();
		tail(y0);
		PK(cudaMemset2D(x + c.D, ld * 2, 0xff, R * 2, TK));
		ours();
		tail(y1);
		PK(cudaMemset2D(x + c.D, ld * 2, 0xff, R * 2, TK));
		blas();
		tail(yb);
		double rms = 0, worst = 0, wabs = 0;
		uint64_t wi = 0;
		for (uint64_t i = 0; i < TK * R; i++)
			rms += (double)bf2f(yb[i]) * bf2f(yb[i]);
		rms = sqrt(rms / (double)(TK * R));
		/* two bf16 roundings of float sums in different orders: a unit
		 * or two of bf16 (2^-8) of the value, more near cancellation,
		 * so measured against |value| + the outputs' rms */
		for (uint64_t i = 0; i < TK * R; i++) {
			double a = bf2f(y0[i]), b = bf2f(yb[i]), d = fabs(a - b);
			double rel = d / (fabs(b) + rms);
			if (!(rel <= worst)) {
				worst = rel;
				wabs = d;
				wi = i;
			}
		}
		int same = !memcmp(y0.data(), y1.data(), TK * R * 2);
		int agree = worst <= 0x1p-6;
		printf("%s: D %u, ldx %llu, rank %u, alpha %g, %d groups\n", c.name, c.D,
		       (unsigned long long)ld, R, c.alpha, q);
		printf("  against cuBLAS: %s (worst %.3g of |y| + rms %.3g, |diff| %.3g at row %llu "
		       "column %llu: %.6g vs %.6g); %s\n", agree ? "agree" : "DIFFERS", worst, rms,
		       wabs, (unsigned long long)(wi / R), (unsigned long long)(wi % R),
		       bf2f(y0[wi]), bf2f(yb[wi]), same ? "repeatable" : "NOT REPEATABLE");
		bad |= !agree || !same;
		timeit("ms_ggemm_lowrank_bf16", ours);
		timeit("cublasGemmGroupedBatchedEx", blas);
		timeit("copy of X's bytes (reads + writes)", copy);
		PK(cudaFree(parr));
		PK(cudaFree(x));
		PK(cudaFree(cp));
		PK(cudaFree(w));
	}
	cublasDestroy(h);
	return bad;
}
