/*
 * cpasync_probe.cu: what loading the operands with cp.async instead of TMA
 * costs CUTLASS's Hopper warp-specialised GEMM (cooperative 128x256x64,
 * bf16 in, bf16 out, wgmma either way), at the trainer benchmark's four
 * expert products taken as one dense GEMM of all 65536 routed rows. A
 * GEMM that gathers its activation rows on load (the dispatched X and the
 * twin dY never written: about 1 GB a layer of the MoE's [T K, H] traffic,
 * tools/bench/NOTES.md) needs per-thread addresses, which Hopper's TMA
 * cannot take; CUTLASS 4.2 has a cp.async warp-specialised mainloop for
 * sm90 (not a grouped one). This measures the rate such a mainloop keeps
 * before any gather is added: a ceiling for the gathered form, the
 * gather's index loads coming on top. GPU time a call (CUDA events over
 * 20 calls) and TFLOP/s; random values, not checked. Not built by make:
 *
 *   sh tools/fetch_headers.sh cutlass .deps/cutlass-4.2.0.0
 *   nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90a --expt-relaxed-constexpr \
 *        -I.deps/cutlass-4.2.0.0/include -o cpasync_probe \
 *        tools/bench/cpasync_probe.cu
 */

#include <cstdio>
#include <vector>

#include <cuda_bf16.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "cutlass_probe.cuh"

using namespace cute;

using Dense = Shape<int, int, int, int>;

template <class KSched, class T = Shape<_128, _256, _64>, class C = Shape<_1, _1, _1>>
struct Plain {
	using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, C,
		cutlass::epilogue::collective::EpilogueTileAuto, float, float, ED, LD, 8, ED, LD, 8,
		cutlass::epilogue::TmaWarpSpecializedCooperative,
		cutlass::epilogue::fusion::LinearCombination<ED, float>>::CollectiveOp;
	using Main = typename cutlass::gemm::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, LA, 8, EA, LB, 8, float, T, C,
		cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
			sizeof(typename Epi::SharedStorage))>,
		KSched>::CollectiveOp;
	using Kernel = cutlass::gemm::kernel::GemmUniversal<Dense, Main, Epi>;
	using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};
using Tma = Plain<cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
using Cpa = Plain<cutlass::gemm::KernelCpAsyncWarpSpecializedCooperative>;

template <class G>
static void run(const char *name, int M, int N, int K, const EA *X, const EA *W, ED *Y)
{
	using Gemm = typename G::Gemm;
	using SA = typename Gemm::GemmKernel::StrideA;
	using SB = typename Gemm::GemmKernel::StrideB;
	using SD = typename Gemm::GemmKernel::StrideD;
	cutlass::KernelHardwareInfo hw;
	hw.device_id = 0;
	hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
	typename Gemm::Arguments args;
	auto fa = probe_epilogue_args<Gemm>();
	SA sa = cutlass::make_cute_packed_stride(SA{}, {M, K, 1});
	SB sb = cutlass::make_cute_packed_stride(SB{}, {N, K, 1});
	SD sd = cutlass::make_cute_packed_stride(SD{}, {M, N, 1});
	args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGemm,
					{M, N, K, 1},
					{X, sa, W, sb},
					{fa, Y, sd, Y, sd},
					hw};
	Gemm gemm;
	void *wsp;
	if (!probe_init(gemm, args, &wsp, name, N, K))
		return;
	probe_time(gemm, name, N, K, 2.0 * M * N * K);
	cudaFree(wsp);
}

/* bf16 values of modest size from a hash of the index */
__global__ void fill(__nv_bfloat16 *p, size_t n, uint32_t seed)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint32_t x = (uint32_t)i * 2654435761u ^ seed;
		x ^= x >> 15;
		p[i] = __float2bfloat16_rn(((float)(x & 0xffff) - 32768.0f) / 65536.0f);
	}
}

int main(void)
{
	const int M = 65536;
	static const int nk[4][2] = {{1536, 2112}, {2048, 832}, {768, 2112}, {2048, 1600}};
	static const char *nm[4] = {"gate/up forward", "down forward", "down backward (dX)",
				    "gate/up backward (dX)"};
	EA *X, *W;
	ED *Y;
	CK(cudaMalloc(&X, (size_t)M * 2112 * 2));
	CK(cudaMalloc(&W, (size_t)2048 * 2112 * 2));
	CK(cudaMalloc(&Y, (size_t)M * 2048 * 2));
	fill<<<1024, 256>>>((__nv_bfloat16 *)X, (size_t)M * 2112, 1);
	fill<<<1024, 256>>>((__nv_bfloat16 *)W, (size_t)2048 * 2112, 2);
	for (int p = 0; p < 4; p++) {
		int N = nk[p][0], K = nk[p][1];
		printf("== %s, %d rows as one GEMM\n", nm[p], M);
		run<Tma>("TMA loads", M, N, K, X, W, Y);
		run<Cpa>("cp.async loads", M, N, K, X, W, Y);
	}
	return 0;
}
