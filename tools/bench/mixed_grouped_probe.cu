/*
 * mixed_grouped_probe.cu: what CUTLASS's Hopper mixed-input grouped GEMM
 * (the weights' 4-bit codes converted to bf16 in registers before wgmma,
 * a bf16 scale per weight row and chunk of K) costs against the bf16
 * grouped GEMM kernels/xgemm.cu builds (cooperative 128x256x64, 1x1), at
 * the trainer benchmark's four expert products (64 experts, 65536 routed
 * rows, bf16 out, K with the folded LoRA's 16 columns where the product
 * has them, rounded up to the 4-bit operand's 32). It answers one
 * question before any mainloop of our own is written: how much of the
 * bf16 GEMM's rate a GEMM that converts the weights itself keeps, since
 * the decode's bytes it would save (about 6 ms a step, tools/bench/
 * NOTES.md) are worth having only if the converting GEMM loses less.
 *
 * It is a ceiling, not NVFP4: CUTLASS 4.2 takes a scale a K tile (its
 * chunk_size a multiple of the tile's K), NVFP4 one every 16 values (a
 * K tile of 16 does not build: the builder's 4-bit shared memory atom
 * wants a longer K), and e2m1 converts in software on sm_90. Three forms a product, each GPU
 * time a call (CUDA events over 20 calls) and TFLOP/s: bf16 x bf16; bf16
 * x int4 with a scale a K tile (CUTLASS's fastest 4-bit path, its
 * conversion by lookup); bf16 x e2m1 with a scale a K tile. The values
 * are random and not checked against a reference: only the time counts.
 * Not built by make (it needs CUTLASS's headers and sm_90a; without
 * -DNDEBUG ptxas serialises the wgmma pipeline):
 *
 *   sh tools/fetch_headers.sh cutlass .deps/cutlass-4.2.0.0
 *   nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90a --expt-relaxed-constexpr \
 *        -I.deps/cutlass-4.2.0.0/include -o mixed_grouped_probe \
 *        tools/bench/mixed_grouped_probe.cu
 */

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_bf16.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "cutlass_probe.cuh"

using namespace cute;

using ES = cutlass::bfloat16_t;
using PTile = Shape<_128, _256, _64>;
using PCl = Shape<_1, _1, _1>;

/* B's element: bf16 (the trainer's GEMM) or a tuple (4-bit type, its
 * scale), which makes the builder pick the mixed-input collective */
template <class EB, int AlignB, class T = PTile, class C = PCl> struct Grouped {
	using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, C,
		cutlass::epilogue::collective::EpilogueTileAuto, float, float, ED, LD *, 8, ED, LD *, 8,
		cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
		cutlass::epilogue::fusion::LinearCombination<ED, float>>::CollectiveOp;
	using Main = typename cutlass::gemm::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, LA *, 8, EB, LB *, AlignB,
		float, T, C,
		cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
			sizeof(typename Epi::SharedStorage))>,
		cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
	using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Main, Epi>;
	using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};
using GBf = Grouped<EA, 8>;
using GI4 = Grouped<cute::tuple<cutlass::int4b_t, ES>, 32>;
using GE2 = Grouped<cute::tuple<cutlass::float_e2m1_t, ES>, 32>;

/* bytes of random bits (the 4-bit operands' codes, bf16 values kept
 * finite by clearing the exponent's top bit) */
__global__ void fill(uint8_t *p, size_t n, uint32_t seed, int bf)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint32_t x = (uint32_t)i * 2654435761u ^ seed;
		x ^= x >> 15;
		x *= 2246822519u;
		x ^= x >> 13;
		p[i] = bf && (i & 1) ? (uint8_t)((x & 0xbf) | 0x30) & 0xbf : (uint8_t)x;
	}
}

template <class G, bool MIXED>
static void run(const char *name, const std::vector<int> &off, int N, int K, double flop)
{
	using Gemm = typename G::Gemm;
	using SA = typename Gemm::GemmKernel::InternalStrideA;
	using SB = typename Gemm::GemmKernel::InternalStrideB;
	using SD = typename Gemm::GemmKernel::InternalStrideD;
	using Main = typename G::Main;
	using EB = typename Main::ElementB;
	using SS = cute::Stride<cute::Int<1>, int64_t, int64_t>; /* the collective's StrideScale */
	int E = (int)off.size() - 1;
	size_t rows = (size_t)off[E];
	size_t bbits = cutlass::sizeof_bits<EB>::value;
	int chunk = size<2>(PTile{});
	std::vector<typename ProblemShape::UnderlyingProblemShape> ps(E);
	std::vector<const EA *> pa(E);
	std::vector<const EB *> pb(E);
	std::vector<ED *> pd(E);
	std::vector<const ES *> psc(E);
	std::vector<SA> sa(E);
	std::vector<SB> sb(E);
	std::vector<SD> sd(E);
	std::vector<SS> ss(E);
	uint8_t *X, *W, *S, *Y;
	CK(cudaMalloc(&X, rows * K * 2));
	CK(cudaMalloc(&W, (size_t)E * N * K * bbits / 8));
	CK(cudaMalloc(&S, (size_t)E * N * (K / chunk + 1) * 2));
	CK(cudaMalloc(&Y, rows * N * 2));
	fill<<<1024, 256>>>(X, rows * K * 2, 1, 1);
	fill<<<1024, 256>>>(W, (size_t)E * N * K * bbits / 8, 2, bbits == 16);
	fill<<<1024, 256>>>(S, (size_t)E * N * (K / chunk + 1) * 2, 3, 1);
	for (int e = 0; e < E; e++) {
		int m = off[e + 1] - off[e];
		ps[e] = {m, N, K};
		pa[e] = (const EA *)X + (size_t)off[e] * K;
		pb[e] = (const EB *)(W + (size_t)e * N * K * bbits / 8);
		pd[e] = (ED *)Y + (size_t)off[e] * N;
		psc[e] = (const ES *)S + (size_t)e * N * (K / chunk);
		sa[e] = cutlass::make_cute_packed_stride(SA{}, {m, K, 1});
		sb[e] = cutlass::make_cute_packed_stride(SB{}, {N, K, 1});
		sd[e] = cutlass::make_cute_packed_stride(SD{}, {m, N, 1});
		ss[e] = cutlass::make_cute_packed_stride(SS{}, {N, K / chunk, 1});
	}
	/* the arrays to the device in one buffer */
	auto up = [](auto &v) {
		void *d;
		size_t n = v.size() * sizeof v[0];
		CK(cudaMalloc(&d, n));
		CK(cudaMemcpy(d, v.data(), n, cudaMemcpyHostToDevice));
		return (decltype(v.data()))d;
	};
	auto dps = up(ps);
	auto dpa = up(pa);
	auto dpb = up(pb);
	auto dpd = up(pd);
	auto dpsc = up(psc);
	auto dsa = up(sa);
	auto dsb = up(sb);
	auto dsd = up(sd);
	auto dss = up(ss);
	cutlass::KernelHardwareInfo hw;
	hw.device_id = 0;
	hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
	typename Gemm::Arguments args;
	auto fa = probe_epilogue_args<Gemm>();
	typename Main::Arguments ma{};
	ma.ptr_A = (const EA **)dpa;
	ma.dA = dsa;
	ma.ptr_B = (const EB **)dpb;
	ma.dB = dsb;
	if constexpr (MIXED) {
		ma.ptr_S = (const ES **)dpsc;
		ma.dS = dss;
		ma.chunk_size = chunk;
	}
	args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
					{E, dps, ps.data()},
					ma,
					{fa, (const ED **)dpd, dsd, (ED **)dpd, dsd},
					hw};
	Gemm gemm;
	void *wsp;
	if (!probe_init(gemm, args, &wsp, name, N, K))
		return;
	probe_time(gemm, name, N, K, flop);
	cudaFree(X), cudaFree(W), cudaFree(S), cudaFree(Y), cudaFree(wsp);
	cudaFree(dps), cudaFree(dpa), cudaFree(dpb), cudaFree(dpd), cudaFree(dpsc);
	cudaFree(dsa), cudaFree(dsb), cudaFree(dsd), cudaFree(dss);
}

int main(void)
{
	/* the bench's uniform routing: 8192 tokens, top-8 of 64, counts near
	 * 1024 (cutlass_grouped_probe.cu's generator) */
	std::vector<int> cnt(64, 0), off(65, 0);
	unsigned long long x = 12345;
	for (int i = 0; i < 65536; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		cnt[(x >> 11) % 64]++;
	}
	for (int e = 0; e < 64; e++)
		off[e + 1] = off[e] + cnt[e];
	/* N, K: gate/up and down forward, down and gate/up dX (the folded
	 * tails' 16 columns, K rounded up to 32 for the 4-bit operand) */
	static const int nk[4][2] = {{1536, 2080}, {2048, 800}, {768, 2080}, {2048, 1568}};
	static const char *nm[4] = {"gate/up forward", "down forward", "down backward (dX)",
				    "gate/up backward (dX)"};
	for (int p = 0; p < 4; p++) {
		int N = nk[p][0], K = nk[p][1];
		/* K a multiple of the tile's for the scale a K tile */
		int Kc = (K + 63) / 64 * 64;
		double flop = 2.0 * off[64] * N * K;
		printf("== %s\n", nm[p]);
		run<GBf, false>("bf16 x bf16", off, N, K, flop);
		run<GI4, true>("bf16 x int4, scale a K tile", off, N, Kc, flop * Kc / K);
		run<GE2, true>("bf16 x e2m1, scale a K tile", off, N, Kc, flop * Kc / K);
	}
	return 0;
}
