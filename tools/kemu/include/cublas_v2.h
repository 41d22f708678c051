/*
 * cublas_v2.h for the kemu emulator (tools/kemu): the types and constants a
 * kernel test names for its --bench comparison against cuBLAS, so the test
 * compiles unchanged. The bench mode is not run under emulation and cuBLAS
 * is opened by dlopen there, so no function is declared.
 */
#pragma once
typedef void *cublasHandle_t;
typedef int cublasStatus_t, cublasOperation_t, cudaDataType_t, cublasComputeType_t,
	cublasGemmAlgo_t;
enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_OP_N = 0,
	CUBLAS_OP_T = 1,
	CUDA_R_16BF = 14,
	CUDA_R_32F = 0,
	CUBLAS_COMPUTE_32F = 68,
	CUBLAS_GEMM_DEFAULT = -1,
	CUBLAS_VER_MAJOR = 13
};
