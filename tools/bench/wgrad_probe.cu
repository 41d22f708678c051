/*
 * wgrad_probe.cu: the folded expert LoRA's weight gradients
 * (ms_ggemm_wgrad_bf16, kernels/ggemm.cu) at the trainer benchmark's
 * shapes: 64 experts, 65536 expert rows (8192 tokens, top-8) routed
 * uniformly or skewed, rank 16, X the down adapter's dY (N 2048, row
 * stride 2064), gate/up's dY (1536 of 1552) and the down input (768 of
 * 784). For each way to cut the experts' rows (every expert in 1 to 8
 * runs, or only those past run_rows, train.cu's wgrad_run_rows) and each
 * block width (128, 256, or the launch's pick): GPU time a call (CUDA
 * events over 20 calls) and the rate at which it reads X and U, next to
 * a device-to-device copy of X's bytes (the memory's rate here); and,
 * for the down adapter's gB, the dense alternative train.cu takes at rank
 * 16 (fold_gb_dn: one cuBLAS GEMM of every token against every expert's
 * U, [E R, T] x [T, H], bf16 in, float32 out); and gate/up's gB with its
 * DU (dU = dY B_e in the same pass, train.cu's fold_du_gb) at each
 * width. The ring's depth is a -D
 * (kernels/ggemm.cu reads WB_ST). Not built by make:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -Isrc -Ikernels -o wgrad_probe \
 *     tools/bench/wgrad_probe.cu -Lbuild -lms -lcublas
 *   LD_LIBRARY_PATH=build ./wgrad_probe
 */

#include "../../kernels/ggemm.cu"

#include <cublas_v2.h>

#include "probe_fill.cuh"
#include <cstdio>
#include <cstdlib>
#include <vector>

/* gpu.cu's, which libms does not export */
int ms_gpu_cuda_err(struct ms_err *err, cudaError_t e, const char *what)
{
	return ms_err_set(err, MS_EIO, "%s: %s", what, cudaGetErrorString(e));
}

#define PK(x) do { cudaError_t e_ = (x); if (e_) { printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)

/* 64 experts' rows for 8192 tokens, top-8 of distinct experts, expert e
 * drawn with weight 1 (uniform) or 16 + e (skewed, as t_ggemm_gpu
 * --bench routes) */
static void route(int skew, uint32_t E, uint32_t T, uint32_t K, std::vector<uint32_t> &off)
{
	std::vector<uint32_t> cnt(E, 0);
	uint32_t wsum = 0;
	for (uint32_t e = 0; e < E; e++)
		wsum += skew ? 16 + e : 1;
	srand(1);
	for (uint32_t t = 0; t < T; t++) {
		uint32_t pick[8], n = 0;
		while (n < K) {
			uint32_t x = (uint32_t)rand() % wsum, e = 0;
			while (x >= (skew ? 16 + e : 1))
				x -= skew ? 16 + e : 1, e++;
			uint32_t dup = 0;
			for (uint32_t j = 0; j < n; j++)
				dup |= pick[j] == e;
			if (!dup)
				pick[n++] = e;
		}
		for (uint32_t j = 0; j < K; j++)
			cnt[pick[j]]++;
	}
	off.assign(E + 1, 0);
	for (uint32_t e = 0; e < E; e++)
		off[e + 1] = off[e] + cnt[e];
}

/* ms a call of p over reps calls after one (its errors said), -1 on one */
static float time_wb(const struct ms_ggemm_wgrad_bf16 &p, cudaEvent_t e0, cudaEvent_t e1,
		     int reps)
{
	struct ms_err err = {0};
	float ms = 0;
	if (ms_ggemm_wgrad_bf16(&p, 0, &err)) {
		printf("  error: %s\n", err.msg);
		return -1;
	}
	PK(cudaDeviceSynchronize());
	PK(cudaEventRecord(e0));
	for (int i = 0; i < reps; i++)
		ms_ggemm_wgrad_bf16(&p, 0, &err);
	PK(cudaEventRecord(e1));
	PK(cudaEventSynchronize(e1));
	PK(cudaEventElapsedTime(&ms, e0, e1));
	return ms / reps;
}

int main(void)
{
	const uint32_t E = 64, T = 8192, K = 8, R = 16, TK = T * K;
	const uint32_t Ns[3] = {2048, 1536, 768}, lds[3] = {2064, 1552, 784};
	const char *what[3] = {"down gB (dY)", "gate/up gB (dY)", "down gA (act)"};
	uint32_t *doff;
	bf16 *x, *u, *xb, *ud;
	float *g, *part, *gd;
	PK(cudaMalloc(&doff, (E + 1) * 4));
	PK(cudaMalloc(&x, (size_t)TK * 2064 * 2));
	PK(cudaMalloc(&xb, (size_t)TK * 2064 * 2));
	PK(cudaMalloc(&u, (size_t)TK * R * 2));
	PK(cudaMalloc(&ud, (size_t)T * E * R * 2));
	PK(cudaMalloc(&g, (size_t)E * R * 2048 * 4));
	PK(cudaMalloc(&gd, (size_t)E * R * 2048 * 4));
	PK(cudaMalloc(&part, (size_t)16 * E * R * 2048 * 4));
	bf16 *wb;
	float *dpart;
	PK(cudaMalloc(&wb, (size_t)E * 1536 * R * 2));
	PK(cudaMalloc(&dpart, ms_ggemm_wgrad_bf16_dpart(1536, R, TK) * 4));
	probe_fill<<<1024, 256>>>(wb, (size_t)E * 1536 * R, 4);
	probe_fill<<<1024, 256>>>(x, (size_t)TK * 2064, 1);
	probe_fill<<<1024, 256>>>(u, (size_t)TK * R, 2);
	probe_fill<<<1024, 256>>>(ud, (size_t)T * E * R, 3);
	PK(cudaMemset(g, 0, (size_t)E * R * 2048 * 4));
	PK(cudaDeviceSynchronize());
	cudaEvent_t e0, e1;
	PK(cudaEventCreate(&e0));
	PK(cudaEventCreate(&e1));
	const int reps = 20;
	printf("WB_ST %d WB_KC %d\n", WB_ST, WB_KC);
	for (int skew = 0; skew < 2; skew++) {
		std::vector<uint32_t> off;
		route(skew, E, T, K, off);
		uint32_t mx = 0, mn = TK;
		for (uint32_t e = 0; e < E; e++) {
			uint32_t c = off[e + 1] - off[e];
			mx = c > mx ? c : mx;
			mn = c < mn ? c : mn;
		}
		/* train.cu's wgrad_run_rows: a quarter above the mean */
		uint32_t rr = (5 * TK + 4 * E - 1) / (4 * E);
		printf("routing %s: %u rows, an expert's %u .. %u (mean %u); run_rows %u\n",
		       skew ? "skewed (weight 16 + e)" : "uniform", TK, mn, mx, TK / E, rr);
		PK(cudaMemcpy(doff, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice));
		for (int c = 0; c < 3; c++) {
			uint32_t N = Ns[c];
			double xbytes = (double)TK * N * 2 + (double)TK * R * 2;
			float ms = 0;
			/* the memory's rate: a copy of X's rows */
			PK(cudaEventRecord(e0));
			for (int i = 0; i < reps; i++)
				PK(cudaMemcpy2DAsync(xb, (size_t)lds[c] * 2, x, (size_t)lds[c] * 2,
						     (size_t)N * 2, TK, cudaMemcpyDeviceToDevice));
			PK(cudaEventRecord(e1));
			PK(cudaEventSynchronize(e1));
			PK(cudaEventElapsedTime(&ms, e0, e1));
			printf("%-16s N %4u: copy of X %.3f ms, %.2f TB/s (read + write)\n", what[c],
			       N, ms / reps, 2.0 * TK * N * 2 / (ms / reps * 1e9));
			/* split, run_rows, width */
			const uint32_t cf[8][3] = {{1, 0, 0},  {2, 0, 0},    {4, 0, 0},
						   {8, 0, 0},  {4, rr, 0},   {4, rr, 128},
						   {4, rr, 256}, {1, 0, 256}};
			for (int k = 0; k < 8; k++) {
				struct ms_ggemm_wgrad_bf16 p = {E, R, N, doff, u, R, x, lds[c], g,
								(uint64_t)N * R, 1, 1.0f, 1, NULL, 1,
								cf[k][0], part, cf[k][1], cf[k][2]};
				if ((ms = time_wb(p, e0, e1, reps)) < 0)
					return 1;
				printf("  split %u, run_rows %4u, width %3s: %.3f ms (%.2f TB/s of X "
				       "and U)\n", cf[k][0], cf[k][1],
				       cf[k][2] ? (cf[k][2] == 128 ? "128" : "256") : "any",
				       ms, xbytes / (ms * 1e9));
			}
			/* gate/up: with its DU as train.cu's fold_du_gb takes it
			 * (dU = dY B_e into X's tail, B_e [N, 16]), run_rows as
			 * the trainer's, each width */
			for (int k = 0; c == 1 && k < 3; k++) {
				const uint32_t wd[3] = {0, 128, 256};
				struct ms_ggemm_wgrad_bf16 p = {E, R, N, doff, u, R, x, lds[c], g,
								(uint64_t)N * R, 1, 1.0f, 1, NULL, 1,
								4, part, rr, wd[k]};
				p.w = wb, p.ldw = R, p.wstride = (uint64_t)N * R;
				p.du = x + N, p.lddu = lds[c], p.dalpha = 2.0f, p.dpart = dpart;
				p.drows = TK;
				if ((ms = time_wb(p, e0, e1, reps)) < 0)
					return 1;
				printf("  with DU, run_rows %4u, width %3s: %.3f ms (%.2f TB/s of X "
				       "and U)\n", rr, wd[k] ? (wd[k] == 128 ? "128" : "256") : "any",
				       ms, xbytes / (ms * 1e9));
			}
		}
	}
	/* the dense alternative for the down adapter's gB: [E R, H] = Ud^T dy */
	cublasHandle_t h;
	if (cublasCreate(&h) == CUBLAS_STATUS_SUCCESS) {
		float al = 1.0f, be = 0.0f, ms = 0;
		/* row-major C [E R, H] = A^T B with A = ud [T, E R], B = dy [T, H]:
		 * column-major C^T [H, E R] = B^T-as-[H,T] x A-as-[T, E R] */
		auto run = [&]() {
			return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, 2048, E * R, T, &al, x,
					    CUDA_R_16BF, 2048, ud, CUDA_R_16BF, E * R, &be, gd,
					    CUDA_R_32F, 2048, CUBLAS_COMPUTE_32F,
					    CUBLAS_GEMM_DEFAULT);
		};
		if (run() != CUBLAS_STATUS_SUCCESS) {
			printf("dense gB: cublas failed\n");
			return 1;
		}
		PK(cudaDeviceSynchronize());
		PK(cudaEventRecord(e0));
		for (int i = 0; i < reps; i++)
			run();
		PK(cudaEventRecord(e1));
		PK(cudaEventSynchronize(e1));
		PK(cudaEventElapsedTime(&ms, e0, e1));
		printf("dense down gB (cuBLAS [%u, %u] x [%u, 2048], bf16 -> float32): %.3f ms, "
		       "%.0f TFLOP/s\n", E * R, T, T, ms / reps,
		       2.0 * E * R * T * 2048 / (ms / reps * 1e9));
	}
	return 0;
}
