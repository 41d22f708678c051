/*
 * grouped_gemm_probe.cu: one cublasGemmEx per expert against cuBLAS's
 * grouped GEMM (cublasGemmGroupedBatchedEx) for the trainer benchmark's
 * expert shapes (64 experts, row counts rounded to 128, bf16 operands,
 * float32 and bf16 outputs): GPU time per layer call (CUDA events over 20
 * calls), host time to queue it, TFLOP/s, and the largest difference
 * between the two. The numbers in NOTES.md come from it. Not built by make
 * (it links cuBLAS, which the trainer opens at run time):
 *
 *   nvcc -O2 -arch=sm_90 -o grouped_gemm_probe tools/bench/grouped_gemm_probe.cu -lcublas
 */

#include <cstdio>
#include <cstdlib>
#include <vector>
#include <functional>
#include <cmath>
#include <chrono>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)
#define CB(x) do { cublasStatus_t s_ = (x); if (s_) { printf("cublas status %d line %d\n", (int)s_, __LINE__); return; } } while (0)
__global__ void fill(__nv_bfloat16 *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f));
  }
}
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
void run(int E, int Mavg, int N, int K, cudaDataType_t ct) {
  cublasHandle_t h; cublasCreate(&h);
  std::vector<int> m(E);
  size_t rows = 0;
  for (int e = 0; e < E; e++) { int n = Mavg + ((e * 37) % 61) - 30; m[e] = (n + 127) / 128 * 128; rows += m[e]; }
  __nv_bfloat16 *X, *W; void *Y, *Y2;
  size_t osz = ct == CUDA_R_32F ? 4 : 2;
  CK(cudaMalloc(&X, rows * K * 2)); CK(cudaMalloc(&W, (size_t)E * N * K * 2));
  CK(cudaMalloc(&Y, rows * N * osz)); CK(cudaMalloc(&Y2, rows * N * osz));
  fill<<<1024, 256>>>(X, rows * K, 1); fill<<<1024, 256>>>(W, (size_t)E * N * K, 2);
  float al = 1, be = 0;
  std::vector<const void *> A(E), B(E); std::vector<void *> C(E), C2(E);
  size_t off = 0;
  for (int e = 0; e < E; e++) { A[e] = W + (size_t)e * N * K; B[e] = X + off * K; C[e] = (char *)Y + off * N * osz; C2[e] = (char *)Y2 + off * N * osz; off += m[e]; }
  // Y[rows_e, N] = X_e [rows_e, K] W_e^T : column-major: C^T[N, rows] = W (N x K, ld K)^T-op ... as train.cu: gemm(ta=0,tb=1,M=rows,N,K)
  auto loop = [&]() {
    for (int e = 0; e < E; e++)
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, m[e], K, &al, A[e], CUDA_R_16BF, K, B[e], CUDA_R_16BF, K, &be, C[e], ct, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  void **dp; CK(cudaMalloc(&dp, 3 * E * sizeof(void *)));
  std::vector<void *> hp(3 * E);
  for (int e = 0; e < E; e++) { hp[e] = (void *)A[e]; hp[E + e] = (void *)B[e]; hp[2 * E + e] = C2[e]; }
  CK(cudaMemcpy(dp, hp.data(), 3 * E * sizeof(void *), cudaMemcpyHostToDevice));
  std::vector<cublasOperation_t> ta(E, CUBLAS_OP_T), tb(E, CUBLAS_OP_N);
  std::vector<int> nn(E, N), kk(E, K), lda(E, K), ldb(E, K), ldc(E, N), gs(E, 1);
  std::vector<float> alv(E, 1), bev(E, 0);
  cublasStatus_t gst = CUBLAS_STATUS_SUCCESS;
  auto grouped = [&]() {
    gst = cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), nn.data(), m.data(), kk.data(), alv.data(), (const void *const *)dp, CUDA_R_16BF, lda.data(), (const void *const *)(dp + E), CUDA_R_16BF, ldb.data(), bev.data(), dp + 2 * E, ct, ldc.data(), E, gs.data(), CUBLAS_COMPUTE_32F);
  };
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  double flop = 2.0 * rows * N * K;
  for (int mode = 0; mode < 2; mode++) {
    (mode ? std::function<void()>(grouped) : std::function<void()>(loop))(); CK(cudaDeviceSynchronize());
    if (mode && gst) { printf("  grouped (%s out): status %d\n", ct == CUDA_R_32F ? "f32" : "bf16", (int)gst); break; }
    int R = 20; double h0 = now(); cudaEventRecord(a);
    for (int r = 0; r < R; r++) (mode ? std::function<void()>(grouped) : std::function<void()>(loop))();
    double h1 = now(); cudaEventRecord(b); CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    printf("  E=%d rows=%zu N=%d K=%d %s out, %s: %.3f ms/call GPU, host enqueue %.3f ms/call, %.0f TFLOP/s\n", E, rows, N, K, ct == CUDA_R_32F ? "f32" : "bf16", mode ? "grouped" : "loop", ms / R, (h1 - h0) * 1e3 / R, flop / (ms / R * 1e-3) / 1e12);
  }
  if (!gst) {
    std::vector<unsigned char> y1(rows * N * osz), y2(rows * N * osz);
    CK(cudaMemcpy(y1.data(), Y, y1.size(), cudaMemcpyDeviceToHost)); CK(cudaMemcpy(y2.data(), Y2, y2.size(), cudaMemcpyDeviceToHost));
    double md = 0;
    for (size_t i = 0; i < rows * N; i++) {
      double u, v;
      if (osz == 4) { u = ((float *)y1.data())[i]; v = ((float *)y2.data())[i]; } else { u = __bfloat162float(((__nv_bfloat16 *)y1.data())[i]); v = __bfloat162float(((__nv_bfloat16 *)y2.data())[i]); }
      md = fabs(u - v) > md ? fabs(u - v) : md;
    }
    printf("  max |loop - grouped| %.3g\n", md);
  }
  cudaFree(X); cudaFree(W); cudaFree(Y); cudaFree(Y2); cudaFree(dp); cublasDestroy(h);
}
int main() {
  int v; cublasGetVersion(NULL, &v); printf("cublas %d\n", v);
  run(64, 1024, 1536, 2048, CUDA_R_32F);   // expert gate/up fwd
  run(64, 1024, 2048, 768, CUDA_R_32F);    // expert down fwd
  run(64, 1024, 1536, 2048, CUDA_R_16BF);
  run(64, 1024, 2048, 768, CUDA_R_16BF);
  return 0;
}
