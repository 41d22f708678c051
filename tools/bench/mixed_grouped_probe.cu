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
 * Each form also with the weights as operand A (see Grouped); e2m1 also
 * with our own conversions (declared below) and a float scale; and
 * NVFP4 itself (nvfp4_mixed.cuh: a factor every 16 values, the LoRA's
 * bf16 tail as one more K tile), timed against the decode followed by
 * the bf16 GEMM on the same operands, the outputs compared bit for bit.
 * Forms are named on the command line (nvfp4 bf16 bf16-swap int4-swap
 * e2m1-swap e2m1f-swap int4 e2m1), all of them without.
 * Not built by make (it needs CUTLASS's headers and sm_90a; without
 * -DNDEBUG ptxas serialises the wgmma pipeline):
 *
 *   sh tools/fetch_headers.sh cutlass .deps/cutlass-4.2.0.0
 *   nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90a --expt-relaxed-constexpr \
 *        -I.deps/cutlass-4.2.0.0/include -o mixed_grouped_probe \
 *        tools/bench/mixed_grouped_probe.cu
 *
 * The NVFP4 form's earlier variants (nvfp4_mixed.cuh), each measured
 * slower: -DNVFP4_PROBE_EVERY_FACTOR (each fragment value's factor formed
 * on its own), -DNVFP4_PROBE_TAIL_SELECT (the LoRA's tail by a select on
 * every register, not one uniform branch a k_block),
 * -DNVFP4_PROBE_E4M3_BRANCH (the e4m3 factor by a branch, not its bits);
 * the reference decode keeps the branching e4m3 either way.
 */

#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/numeric_conversion.h"
#include "nvfp4_mixed.cuh" /* (declares nothing that instantiates a converter) */

/* e2m1 to float and to bf16 by their bits, declared before any collective
 * is instantiated: CUTLASS 4.2 converts e2m1 on sm_90 one element at a
 * time through its software float path (about a tenth of the GEMM's rate
 * when measured), as cvt from e2m1 is Blackwell's. The magnitude's three
 * bits placed at the lowest exponent bits and the mantissa's first read
 * as a number 2^-126 too small for every code, the subnormal 0.5
 * included, so one exact multiply by 2^126 gives the value (without
 * flushing subnormals: nvcc's default). */
namespace cutlass {
template <>
struct NumericArrayConverter<float, float_e2m1_t, 8, FloatRoundStyle::round_to_nearest> {
	using result_type = Array<float, 8>;
	using source_type = Array<float_e2m1_t, 8>;
	static FloatRoundStyle const round_style = FloatRoundStyle::round_to_nearest;
	CUTLASS_DEVICE static result_type convert(source_type const &s)
	{
		uint32_t x = reinterpret_cast<uint32_t const &>(s);
		result_type r;
		CUTLASS_PRAGMA_UNROLL
		for (int i = 0; i < 8; i++)
			r[i] = nvfp4_e2m1f(x >> (4 * i));
		return r;
	}
	CUTLASS_DEVICE result_type operator()(source_type const &s) const { return convert(s); }
};
/* bf16 the same way, two a register: the codes' magnitudes at bits 8:6
 * of each half, the signs at 15, one bf16x2 multiply by 2^126 */
template <int N, FloatRoundStyle Round>
struct NumericArrayConverter<bfloat16_t, float_e2m1_t, N, Round> {
	static_assert(N % 8 == 0, "eight codes a register");
	using result_type = Array<bfloat16_t, N>;
	using source_type = Array<float_e2m1_t, N>;
	static FloatRoundStyle const round_style = Round;
	CUTLASS_DEVICE static result_type convert(source_type const &s)
	{
		uint32_t const *x = reinterpret_cast<uint32_t const *>(&s);
		result_type r;
		uint32_t *o = reinterpret_cast<uint32_t *>(&r);
		const __nv_bfloat162 two126 = __halves2bfloat162(__ushort_as_bfloat16(0x7e80),
								    __ushort_as_bfloat16(0x7e80));
		CUTLASS_PRAGMA_UNROLL
		for (int w = 0; w < N / 8; w++)
			CUTLASS_PRAGMA_UNROLL
			for (int j = 0; j < 4; j++) {
				uint32_t v = x[w] >> (8 * j); /* codes 2j (3:0), 2j+1 (7:4) */
				uint32_t b = ((v & 7u) << 6) | ((v & 8u) << 12) | ((v & 0x70u) << 18) |
					     ((v & 0x80u) << 24);
				__nv_bfloat162 h = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&b), two126);
				o[4 * w + j] = *reinterpret_cast<uint32_t *>(&h);
			}
		return r;
	}
	CUTLASS_DEVICE result_type operator()(source_type const &s) const { return convert(s); }
};
} // namespace cutlass

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

/* the weights' element: bf16 (the trainer's GEMM) or a tuple (4-bit
 * type, its scale), which makes the builder pick the mixed-input
 * collective. SWAP false: X [rows, K] is A and W is B, as xgemm.cu has
 * them; the collective then swaps the operands inside (the narrow one
 * must be A, wgmma's register operand), which the grouped kernel's tile
 * scheduler and epilogue do not follow. SWAP true: W [N, K] is A
 * (row-major, K-major), X is B (K x rows column-major) and D = (X W^T)^T
 * is written column-major, so Y [rows, N] row-major as before: the form
 * the trainer would use. */
template <class EW, int AlignW, bool SWAP, class T = PTile, class C = PCl> struct Grouped {
	using LDx = cute::conditional_t<SWAP, cutlass::layout::ColumnMajor, LD>;
	using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, C,
		cutlass::epilogue::collective::EpilogueTileAuto, float, float, ED, LDx *, 8, ED, LDx *,
		8, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
		cutlass::epilogue::fusion::LinearCombination<ED, float>>::CollectiveOp;
	using Stages = cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
		sizeof(typename Epi::SharedStorage))>;
	using Sched = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
	using MainAB = typename cutlass::gemm::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, LA *, 8, EW, LB *, AlignW,
		float, T, C, Stages, Sched>::CollectiveOp;
	using MainWX = typename cutlass::gemm::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EW, cutlass::layout::RowMajor *,
		AlignW, EA, cutlass::layout::ColumnMajor *, 8, float, T, C, Stages,
		Sched>::CollectiveOp;
	using Main = cute::conditional_t<SWAP, MainWX, MainAB>;
	using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Main, Epi>;
	using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};
using GBf = Grouped<EA, 8, false>;
using GBfS = Grouped<EA, 8, true>;
using GI4 = Grouped<cute::tuple<cutlass::int4b_t, ES>, 32, false>;
using GE2 = Grouped<cute::tuple<cutlass::float_e2m1_t, ES>, 32, false>;
using GI4S = Grouped<cute::tuple<cutlass::int4b_t, ES>, 32, true>;
using GE2S = Grouped<cute::tuple<cutlass::float_e2m1_t, ES>, 32, true>;
/* a float scale: the decode's arithmetic (the code's value times the
 * block's float factor, rounded to bf16 once) */
using GE2FS = Grouped<cute::tuple<cutlass::float_e2m1_t, float>, 32, true>;
/* NVFP4: a factor every 16 values (nvfp4_mixed.cuh) */
using GNV = Grouped<cute::tuple<cutlass::float_e2m1_t, nvfp4_pack>, 32, true>;

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

/* whether the command line asks for form f (no arguments: all, the
 * swapped forms first, since a fault ends the process) */
static bool want(int argc, char **argv, const char *f)
{
	if (argc < 2)
		return true;
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], f))
			return true;
	return false;
}

/* the mainloop's scale type (bf16 where it has none) */
template <class M, class = void> struct scale_of {
	using type = ES;
};
template <class M> struct scale_of<M, std::void_t<typename M::ElementScale>> {
	using type = typename M::ElementScale;
};

/* a product's operands on the device: X [rows, K] bf16, W [E][N, K] (bf16
 * or 4-bit codes), S (and Z, NVFP4's second pair) the scales of each
 * expert's [N, K / 64] in N-major order, Y [rows, N] bf16 */
struct Bufs {
	uint8_t *X, *W, *S, *Z, *Y;
};

/* times product G over b (random operands where b is null), Y left in
 * b->Y. MIXED: 0 none, 1 a scale a K tile (NVFP4's packs among them) */
template <class G, int MIXED, bool SWAP>
static void run(const char *name, const std::vector<int> &off, int N, int K, double flop,
		const Bufs *b = nullptr)
{
	using Gemm = typename G::Gemm;
	using SA = typename Gemm::GemmKernel::InternalStrideA;
	using SB = typename Gemm::GemmKernel::InternalStrideB;
	using SD = typename Gemm::GemmKernel::InternalStrideD;
	using Main = typename G::Main;
	using EX = cute::conditional_t<SWAP, typename Main::ElementB, typename Main::ElementA>;
	using EB = cute::conditional_t<SWAP, typename Main::ElementA, typename Main::ElementB>;
	using SS = cute::Stride<cute::Int<1>, int64_t, int64_t>; /* the collective's StrideScale */
	int E = (int)off.size() - 1;
	size_t rows = (size_t)off[E];
	size_t bbits = cutlass::sizeof_bits<EB>::value;
	int chunk = size<2>(PTile{});
	std::vector<typename ProblemShape::UnderlyingProblemShape> ps(E);
	std::vector<const EX *> pa(E);
	std::vector<const EB *> pb(E);
	std::vector<ED *> pd(E);
	using ESc = typename scale_of<Main>::type;
	std::vector<const ESc *> psc(E);
	std::vector<const void *> pz(E);
	std::vector<SA> sa(E);
	std::vector<SB> sb(E);
	std::vector<SD> sd(E);
	std::vector<SS> ss(E);
	size_t nsc = (size_t)E * N * (K / chunk + 1) * sizeof(ESc);
	Bufs o = {};
	if (b)
		o = *b;
	else {
		CK(cudaMalloc(&o.X, rows * K * 2));
		CK(cudaMalloc(&o.W, (size_t)E * N * K * bbits / 8));
		CK(cudaMalloc(&o.S, nsc));
		CK(cudaMalloc(&o.Y, rows * N * 2));
		fill<<<1024, 256>>>(o.X, rows * K * 2, 1, 1);
		fill<<<1024, 256>>>(o.W, (size_t)E * N * K * bbits / 8, 2, bbits == 16);
		fill<<<1024, 256>>>(o.S, nsc, 3, 1);
		o.Z = o.S;
	}
	for (int e = 0; e < E; e++) {
		int m = off[e + 1] - off[e];
		ps[e] = SWAP ? typename ProblemShape::UnderlyingProblemShape{N, m, K}
			     : typename ProblemShape::UnderlyingProblemShape{m, N, K};
		pa[e] = (const EX *)o.X + (size_t)off[e] * K;
		pb[e] = (const EB *)(o.W + (size_t)e * N * K * bbits / 8);
		pd[e] = (ED *)o.Y + (size_t)off[e] * N;
		psc[e] = (const ESc *)o.S + (size_t)e * N * (K / chunk);
		pz[e] = (const ESc *)o.Z + (size_t)e * N * (K / chunk); /* (Z's elements are ESc's size) */
		/* (the operands' roles swap with SWAP: W's strides are A's) */
		sa[e] = cutlass::make_cute_packed_stride(SA{}, SWAP ? cute::make_shape(N, K, 1)
								   : cute::make_shape(m, K, 1));
		sb[e] = cutlass::make_cute_packed_stride(SB{}, SWAP ? cute::make_shape(m, K, 1)
								   : cute::make_shape(N, K, 1));
		sd[e] = cutlass::make_cute_packed_stride(SD{}, SWAP ? cute::make_shape(N, m, 1)
								   : cute::make_shape(m, N, 1));
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
	auto dpz = up(pz);
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
	if constexpr (SWAP) {
		ma.ptr_A = (decltype(ma.ptr_A))dpb;
		ma.dA = dsa;
		ma.ptr_B = (decltype(ma.ptr_B))dpa;
		ma.dB = dsb;
	} else {
		ma.ptr_A = (decltype(ma.ptr_A))dpa;
		ma.dA = dsa;
		ma.ptr_B = (decltype(ma.ptr_B))dpb;
		ma.dB = dsb;
	}
	if constexpr (MIXED) {
		ma.ptr_S = (const ESc **)dpsc;
		ma.dS = dss;
		ma.chunk_size = chunk;
	}
	/* the mixed-input collective's can_implement reads the strides
	 * through their (device) pointers whenever host shapes are given, so
	 * it gets none and checks nothing: the shapes here are known good */
	args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
					{E, dps, MIXED ? nullptr : ps.data()},
					ma,
					{fa, (const ED **)dpd, dsd, (ED **)dpd, dsd},
					hw};
	Gemm gemm;
	void *wsp;
	if (probe_init(gemm, args, &wsp, name, N, K))
		probe_time(gemm, name, N, K, flop);
	cudaFree(wsp);
	if (!b)
		cudaFree(o.X), cudaFree(o.W), cudaFree(o.S), cudaFree(o.Y);
	cudaFree(dps), cudaFree(dpa), cudaFree(dpb), cudaFree(dpd), cudaFree(dpsc), cudaFree(dpz);
	cudaFree(dsa), cudaFree(dsb), cudaFree(dsd), cudaFree(dss);
}

/* NVFP4 packs: each row's four e4m3 block scales of a K tile (exponents
 * 5..9: factors in [0.25, 8) before the tensor scale; one in 32 a
 * subnormal) and its expert's
 * tensor scale 1 + e / 64 (not a power of two, so the product rounds),
 * N-major: S[e][t][n] */
__global__ void fill_packs(nvfp4_pack *S, size_t n, int N, int KT)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint32_t x = (uint32_t)i * 2246822519u ^ 0x9e3779b9u;
		x ^= x >> 13;
		x *= 3266489917u;
		x ^= x >> 16;
		uint32_t lo = 0;
		for (int j = 0; j < 4; j++) {
			uint32_t b = (x >> (8 * j)) & 0xff;
			/* one in 32 subnormal (e4m3's exponent 0) */
			uint32_t ex = (b & 31u) ? 5u + b % 5u : 0u;
			lo |= (ex << 3 | (b >> 5)) << (8 * j);
		}
		float t = 1.0f + (float)(i / ((size_t)N * KT)) / 64.0f;
		S[i] = (uint64_t)__float_as_uint(t) << 32 | lo;
	}
}

/* W's bf16: each code times its block's factor, rounded once (k_decode's
 * arithmetic), a thread a byte of codes; in the tail tile (the last 64
 * columns) v_j at column 16 kb + 2t (j = 4 kb + t), zeros elsewhere */
__global__ void decode_ref(const uint8_t *codes, const nvfp4_pack *S, __nv_bfloat16 *W, int E, int N,
			   int K)
{
	size_t n = (size_t)E * N * K / 2;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t el = 2 * i;
		int k = (int)(el % K);
		size_t row = el / K; /* e N + n */
		if (k >= K - 64) {
			const uint8_t *tail = codes + row * (K / 2) + (K - 64) / 2;
			int kk = k - (K - 64), kb = kk / 16, p = kk % 16; /* p even */
			__nv_bfloat16 v = __ushort_as_bfloat16(0);
			if (p / 2 < 4)
				v = __ushort_as_bfloat16(
					(unsigned short)(tail[8 * kb + p / 2] | tail[8 * kb + p / 2 + 4] << 8));
			W[el] = v;
			W[el + 1] = __ushort_as_bfloat16(0);
			continue;
		}
		int e = (int)(row / N), r = (int)(row % N);
		size_t fi = ((size_t)e * (K / 64) + k / 64) * N + r;
		float f = nvfp4_factor<true>(S[fi], (k % 64) / 16);
		W[el] = __float2bfloat16_rn(nvfp4_e2m1f(codes[i]) * f);
		W[el + 1] = __float2bfloat16_rn(nvfp4_e2m1f(codes[i] >> 4) * f);
	}
}

/* the tail tile: each row's 16 bf16 (random, finite) packed into its last
 * 32 bytes of codes, its factors the raw mark; X's tail columns zero but
 * at 16 kb + 2t */
__global__ void make_tail(uint8_t *codes, nvfp4_pack *S, __nv_bfloat16 *X, int E, int N, int K,
			  size_t rows, int base_only)
{
	size_t nr = (size_t)E * N;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nr + rows;
	     i += (size_t)gridDim.x * blockDim.x) {
		if (i < nr) {
			uint16_t v[16];
			for (int j = 0; j < 16; j++) {
				uint32_t x = (uint32_t)(i * 16 + j) * 2654435761u ^ 0x5bd1e995u;
				x ^= x >> 15;
				x *= 2246822519u;
				x ^= x >> 13;
				v[j] = (uint16_t)((x & 0x807f) | (0x3c00 + ((x >> 8) & 0x0780)));
			}
			nvfp4_tail_pack(v, codes + i * (K / 2) + (K - 64) / 2);
			size_t e = i / N, r = i % N, fi = (e * (K / 64) + K / 64 - 1) * N + r;
			S[fi] = (uint64_t)NVFP4_RAW << 32;
		} else {
			__nv_bfloat16 *x = X + (i - nr) * K + (K - 64);
			for (int c = 0; c < 64; c++)
				if (base_only || !(c % 2 == 0 && (c % 16) / 2 < 4))
					x[c] = __ushort_as_bfloat16(0);
		}
	}
}

/* the NVFP4 product (K columns of codes and a tail tile of the LoRA's 16
 * bf16) against the decode followed by the bf16 GEMM (the same W as A,
 * and as xgemm.cu's operand order): timed, and the outputs compared bit
 * for bit */
static void nvfp4_check(const std::vector<int> &off, int N, int K0, double flop, int base_only)
{
	int E = (int)off.size() - 1, K = K0 + 64;
	size_t rows = (size_t)off[E], nf = (size_t)E * N * (K / 64);
	Bufs q = {}, d = {};
	__nv_bfloat16 *Wd;
	uint8_t *Y2, *Y3;
	CK(cudaMalloc(&q.X, rows * K * 2));
	CK(cudaMalloc(&q.W, (size_t)E * N * K / 2));
	CK(cudaMalloc(&q.S, nf * sizeof(nvfp4_pack)));
	q.Z = q.S;
	CK(cudaMalloc(&q.Y, rows * N * 2));
	CK(cudaMalloc(&Y2, rows * N * 2));
	CK(cudaMalloc(&Y3, rows * N * 2));
	CK(cudaMalloc(&Wd, (size_t)E * N * K * 2));
	fill<<<1024, 256>>>(q.X, rows * K * 2, 1, 1);
	fill<<<1024, 256>>>(q.W, (size_t)E * N * K / 2, 2, 0);
	fill_packs<<<1024, 256>>>((nvfp4_pack *)q.S, nf, N, K / 64);
	make_tail<<<1024, 256>>>(q.W, (nvfp4_pack *)q.S, (__nv_bfloat16 *)q.X, E, N, K, rows, base_only);
	decode_ref<<<1024, 256>>>(q.W, (nvfp4_pack *)q.S, Wd, E, N, K);
	CK(cudaGetLastError());
	run<GNV, 1, true>("NVFP4 W as A + tail tile", off, N, K, flop, &q);
	d = q;
	d.W = (uint8_t *)Wd;
	d.Y = Y2;
	run<GBfS, 0, true>("decoded bf16, W as A", off, N, K, flop, &d);
	d.Y = Y3;
	run<GBf, 0, false>("decoded bf16, X as A", off, N, K, flop, &d);
	CK(cudaDeviceSynchronize());
	std::vector<uint16_t> a(rows * N), b(rows * N), c(rows * N);
	CK(cudaMemcpy(a.data(), q.Y, rows * N * 2, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(b.data(), Y2, rows * N * 2, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(c.data(), Y3, rows * N * 2, cudaMemcpyDeviceToHost));
	auto f32 = [](uint16_t h) {
		uint32_t u = (uint32_t)h << 16;
		float f;
		memcpy(&f, &u, 4);
		return f;
	};
	size_t dab = 0, dbc = 0, nz = 0;
	double mab = 0, mbc = 0, mag = 0;
	for (size_t i = 0; i < a.size(); i++) {
		dab += a[i] != b[i];
		dbc += b[i] != c[i];
		nz += b[i] != 0;
		mab = std::max(mab, (double)fabsf(f32(a[i]) - f32(b[i])));
		mbc = std::max(mbc, (double)fabsf(f32(b[i]) - f32(c[i])));
		mag = std::max(mag, (double)fabsf(f32(b[i])));
	}
	printf("  check%s: NVFP4 vs decoded (W as A): %zu of %zu outputs differ (max %.3g); decoded W as A vs X as "
	       "A: %zu differ (max %.3g); max |Y| %.3g, %zu nonzero\n",
	       base_only ? " (tail's products zero)" : "", dab, a.size(), mab, dbc, mbc, mag, nz);
	for (size_t i = 0, shown = 0; i < a.size() && shown < 4; i++)
		if (a[i] != b[i]) {
			printf("    row %zu col %zu: %04x against %04x\n", i / N, i % N, a[i], b[i]);
			shown++;
		}
	cudaFree(q.X), cudaFree(q.W), cudaFree(q.S), cudaFree(q.Y);
	cudaFree(Y2), cudaFree(Y3), cudaFree(Wd);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, nullptr, _IOLBF, 0); /* lines out before any fault */
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
	static const int nk0[4] = {2048, 768, 2048, 1536};
	static const char *nm[4] = {"gate/up forward", "down forward", "down backward (dX)",
				    "gate/up backward (dX)"};
	for (int p = 0; p < 4; p++) {
		int N = nk[p][0], K = nk[p][1];
		/* K a multiple of the tile's for the scale a K tile */
		int Kc = (K + 63) / 64 * 64;
		double flop = 2.0 * off[64] * N * K;
		printf("== %s\n", nm[p]);
		if (want(argc, argv, "bf16"))
			run<GBf, 0, false>("bf16 x bf16", off, N, K, flop);
		if (want(argc, argv, "bf16-swap"))
			run<GBfS, 0, true>("bf16, W as A", off, N, K, flop);
		if (want(argc, argv, "int4-swap"))
			run<GI4S, 1, true>("int4 W as A, scale a K tile", off, N, Kc, flop * Kc / K);
		if (want(argc, argv, "e2m1-swap"))
			run<GE2S, 1, true>("e2m1 W as A, scale a K tile", off, N, Kc, flop * Kc / K);
		if (want(argc, argv, "e2m1f-swap"))
			run<GE2FS, 1, true>("e2m1 W as A, float scale", off, N, Kc, flop * Kc / K);
		/* the base's K (the products' K less the LoRA's 16 and the
		 * rounding) and a tail tile: the same useful work */
		if (want(argc, argv, "nvfp4")) {
			nvfp4_check(off, N, nk0[p], flop, 0);
			nvfp4_check(off, N, nk0[p], flop, 1);
		}
		if (want(argc, argv, "int4"))
			run<GI4, 1, false>("bf16 x int4, scale a K tile", off, N, Kc, flop * Kc / K);
		if (want(argc, argv, "e2m1"))
			run<GE2, 1, false>("bf16 x e2m1, scale a K tile", off, N, Kc, flop * Kc / K);
	}
	return 0;
}
