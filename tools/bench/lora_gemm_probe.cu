/*
 * lora_gemm_probe.cu: the dense LoRA's float32 products (q and v at the
 * trainer benchmark's shape: 8192 rows, hidden 2048, out 2048 or 512,
 * rank 16) on cuBLASLt, every algorithm its heuristic offers (TF32 tensor
 * cores, as the trainer asks), and on cublasGemmEx: GPU time a call (CUDA
 * events over 20 calls), the host's time to queue one, and the bytes the
 * product must move against that time. Row-major terms as kernels/train.cu's
 * gemm(): C [M, N] = alpha op(A) op(B) + beta C. Which algorithm the
 * heuristic puts first, and what each costs, is what the numbers in
 * NOTES.md come from. Not built by make:
 *
 *   nvcc -O2 -arch=sm_90 -o lora_gemm_probe tools/bench/lora_gemm_probe.cu -lcublasLt -lcublas
 */

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cublasLt.h>
#include <cublas_v2.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)
#define CL(x) do { cublasStatus_t s_ = (x); if (s_) { printf("cublas status %d line %d\n", (int)s_, __LINE__); exit(1);} } while (0)

__global__ void fill(float *p, size_t n, unsigned seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		unsigned h = (unsigned)i * 2654435761u ^ seed;
		h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
		p[i] = (h & 0xffff) / 65536.0f - 0.5f;
	}
}

static double now()
{
	return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static cublasLtHandle_t lt;
static cublasHandle_t bl;
static void *ws;
static const size_t WS = 32u << 20;
static cudaStream_t st;

/* one product: GPU ms and host us a call of each way to run it */
static void probe(const char *name, int ta, int tb, int M, int N, int K, const float *A, int lda,
		  const float *B, int ldb, float beta, float *C, int ldc)
{
	float alpha = 1.0f;
	double mb = 4.0 * ((double)M * K + (double)K * N + (beta != 0 ? 2.0 : 1.0) * M * N) / 1e6;
	cublasOperation_t oa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, ob = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasLtMatmulDesc_t op;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulPreference_t pref;
	cublasLtMatmulHeuristicResult_t res[8];
	int nres = 0;
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	CL(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F));
	CL(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
	CL(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
	CL(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, tb ? K : N, tb ? N : K, ldb));
	CL(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, ta ? M : K, ta ? K : M, lda));
	CL(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, ldc));
	CL(cublasLtMatmulPreferenceCreate(&pref));
	CL(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS,
						sizeof WS));
	CL(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 8, res, &nres));
	printf("%-34s %5dx%5dx%5d  %s%s  %.1f MB\n", name, M, N, K, ta ? "A^T" : "A", tb ? " B^T" : " B", mb);
	for (int a = -1; a < nres; a++) {
		auto call = [&]() {
			if (a < 0)
				CL(cublasGemmEx(bl, oa, ob, N, M, K, &alpha, B, CUDA_R_32F, ldb, A,
						CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc,
						CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
			else
				CL(cublasLtMatmul(lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc,
						  &res[a].algo, ws, WS, st));
		};
		for (int i = 0; i < 3; i++)
			call();
		CK(cudaStreamSynchronize(st));
		double h0 = now();
		CK(cudaEventRecord(e0, st));
		for (int i = 0; i < 20; i++)
			call();
		CK(cudaEventRecord(e1, st));
		double h1 = now();
		CK(cudaEventSynchronize(e1));
		float ms = 0;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		ms /= 20;
		printf("  %-22s GPU %8.1f us  host %6.1f us  %7.0f GB/s\n",
		       a < 0 ? "cublasGemmEx" : a == 0 ? "Lt heuristic #0 (ours)" : "Lt heuristic", 1e3 * ms,
		       1e6 * (h1 - h0) / 20, mb / ms);
	}
	cublasLtMatmulPreferenceDestroy(pref);
	cublasLtMatrixLayoutDestroy(la);
	cublasLtMatrixLayoutDestroy(lb);
	cublasLtMatrixLayoutDestroy(lc);
	cublasLtMatmulDescDestroy(op);
}

int main()
{
	const int T = 8192, H = 2048, r = 16, outs[2] = {2048, 512};
	float *X, *dY, *Y, *A, *At, *B, *U, *dU, *gA, *gB, *gBt, *dX;
	CK(cudaStreamCreate(&st));
	CL(cublasLtCreate(&lt));
	CL(cublasCreate(&bl));
	CL(cublasSetStream(bl, st));
	CK(cudaMalloc(&ws, WS));
	CK(cudaMalloc(&X, (size_t)T * H * 4));
	CK(cudaMalloc(&dY, (size_t)T * H * 4));
	CK(cudaMalloc(&Y, (size_t)T * H * 4));
	CK(cudaMalloc(&dX, (size_t)T * H * 4));
	CK(cudaMalloc(&A, (size_t)r * H * 4));
	CK(cudaMalloc(&At, (size_t)r * H * 4));
	CK(cudaMalloc(&B, (size_t)r * H * 4));
	CK(cudaMalloc(&gA, (size_t)r * H * 4));
	CK(cudaMalloc(&gB, (size_t)r * H * 4));
	CK(cudaMalloc(&gBt, (size_t)r * H * 4));
	CK(cudaMalloc(&U, (size_t)T * r * 4));
	CK(cudaMalloc(&dU, (size_t)T * r * 4));
	fill<<<1024, 256>>>(X, (size_t)T * H, 1);
	fill<<<1024, 256>>>(dY, (size_t)T * H, 2);
	fill<<<1024, 256>>>(A, (size_t)r * H, 3);
	fill<<<1024, 256>>>(At, (size_t)r * H, 4);
	fill<<<1024, 256>>>(B, (size_t)r * H, 5);
	fill<<<1024, 256>>>(U, (size_t)T * r, 6);
	fill<<<1024, 256>>>(dU, (size_t)T * r, 7);
	CK(cudaDeviceSynchronize());
	for (int o = 0; o < 2; o++) {
		int out = outs[o];
		printf("== out %d\n", out);
		/* the trainer's forms (lora_fwd, lora_bwd) */
		probe("fwd U = X A^T", 0, 1, T, r, H, X, H, A, H, 0.0f, U, r);
		probe("fwd Y += s U B^T", 0, 1, T, out, r, U, r, B, r, 1.0f, Y, out);
		probe("bwd dU = s dY B", 0, 0, T, r, out, dY, out, B, r, 0.0f, dU, r);
		probe("bwd gB += s dY^T U", 1, 0, out, r, T, dY, out, U, r, 1.0f, gB, r);
		probe("bwd gA += dU^T X", 1, 0, r, H, T, dU, r, X, H, 1.0f, gA, H);
		probe("bwd dX += dU A", 0, 0, T, H, r, dU, r, A, H, 1.0f, dX, H);
		/* alternatives: A kept transposed ([in, r]); gB's transpose */
		probe("alt fwd U = X At (At [in, r])", 0, 0, T, r, H, X, H, At, r, 0.0f, U, r);
		probe("alt gB^T += s U^T dY", 1, 0, r, out, T, U, r, dY, out, 1.0f, gBt, out);
	}
	return 0;
}
