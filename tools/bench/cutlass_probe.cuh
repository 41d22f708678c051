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

/* Gemm's epilogue arguments for D = the product */
template <class Gemm> static auto probe_epilogue_args()
{
	typename Gemm::Arguments args;
	decltype(args.epilogue.thread) fa;
	fa.alpha = 1.0f;
	fa.beta = 0.0f;
	fa.alpha_ptr = nullptr;
	fa.beta_ptr = nullptr;
	fa.alpha_ptr_array = nullptr;
	fa.beta_ptr_array = nullptr;
	fa.dAlpha = {cute::_0{}, cute::_0{}, 0};
	fa.dBeta = {cute::_0{}, cute::_0{}, 0};
	return fa;
}

#endif
