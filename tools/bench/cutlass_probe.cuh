/*
 * cutlass_probe.cuh: what tools/bench's CUTLASS grouped GEMM probes
 * (cutlass_grouped_probe.cu, mixed_grouped_probe.cu) share: the check of
 * a CUDA call, the grouped problem shape, the operands' types and
 * layouts as kernels/xgemm.cu has them, and the epilogue's arguments for
 * D = the product (alpha 1, beta 0, no per-group scalars).
 */
#ifndef MS_CUTLASS_PROBE_CUH
#define MS_CUTLASS_PROBE_CUH

#include <cstdio>
#include <cstdlib>

#include "cutlass/cutlass.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"

#define CK(x)                                                                                  \
	do {                                                                                   \
		cudaError_t e_ = (x);                                                          \
		if (e_) {                                                                      \
			printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__);         \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using EA = cutlass::bfloat16_t;
using ED = cutlass::bfloat16_t;
using LA = cutlass::layout::RowMajor;    /* X [rows, K] */
using LB = cutlass::layout::ColumnMajor; /* W [N, K] row-major: K x N column-major (K-major) */
using LD = cutlass::layout::RowMajor;    /* Y [rows, N] */

/* the grouped epilogue's per-group scalar arrays, none (the plain one
 * has no such members) */
template <class F>
static auto probe_no_arrays(F &f, int) -> decltype(f.alpha_ptr_array = nullptr, void())
{
	f.alpha_ptr_array = nullptr;
	f.beta_ptr_array = nullptr;
}
template <class F> static void probe_no_arrays(F &, long) {}

/* the epilogue's strides of alpha and beta, where its thread operation has
 * them (the no-smem epilogue's older one has not) */
template <class F>
static auto probe_no_strides(F &f, int) -> decltype(f.dAlpha = {cute::_0{}, cute::_0{}, 0}, void())
{
	f.dAlpha = {cute::_0{}, cute::_0{}, 0};
	f.dBeta = {cute::_0{}, cute::_0{}, 0};
}
template <class F> static void probe_no_strides(F &, long) {}

/* Gemm's epilogue arguments for D = the product */
template <class Gemm> static auto probe_epilogue_args()
{
	typename Gemm::Arguments args;
	decltype(args.epilogue.thread) fa;
	fa.alpha = 1.0f;
	fa.beta = 0.0f;
	fa.alpha_ptr = nullptr;
	fa.beta_ptr = nullptr;
	probe_no_arrays(fa, 0);
	probe_no_strides(fa, 0);
	return fa;
}

/* gemm made ready for args, its workspace in *wsp (freed by the caller);
 * false, with a line naming the product, where CUTLASS refuses it */
template <class Gemm>
static bool probe_init(Gemm &gemm, typename Gemm::Arguments &args, void **wsp, const char *name,
		       int N, int K)
{
	size_t ws = Gemm::get_workspace_size(args);
	*wsp = nullptr;
	CK(cudaMalloc(wsp, ws ? ws : 16));
	if (gemm.can_implement(args) != cutlass::Status::kSuccess) {
		printf("  %-30s N %4d K %4d: CUTLASS cannot implement it\n", name, N, K);
		return false;
	}
	if (gemm.initialize(args, *wsp) != cutlass::Status::kSuccess) {
		printf("  %-30s N %4d K %4d: initialize failed\n", name, N, K);
		return false;
	}
	return true;
}

/* gemm's GPU time a call (CUDA events over 20 runs after 2), printed
 * with its rate for flop */
template <class Gemm>
static void probe_time(Gemm &gemm, const char *name, int N, int K, double flop)
{
	cudaEvent_t a, b;
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	int bad = 0;
	for (int it = 0; it < 22; it++) {
		if (it == 2)
			CK(cudaEventRecord(a));
		bad |= gemm.run() != cutlass::Status::kSuccess;
	}
	CK(cudaEventRecord(b));
	CK(cudaEventSynchronize(b));
	CK(cudaGetLastError());
	float ms = 0;
	CK(cudaEventElapsedTime(&ms, a, b));
	ms /= 20;
	if (bad)
		printf("  %-30s N %4d K %4d: run failed\n", name, N, K);
	else
		printf("  %-30s N %4d K %4d: %.3f ms, %.0f TFLOP/s\n", name, N, K, ms,
		       flop / (ms * 1e-3) / 1e12);
	cudaEventDestroy(a);
	cudaEventDestroy(b);
}

#endif
