/*
 * nvfp4_mixed.cuh: NVFP4 weights in CUTLASS 4.2's Hopper grouped
 * mixed-input GEMM (the 4-bit operand A converted in registers before
 * wgmma), with NVFP4's factor every 16 values along K, by specialising
 * the collective's conversion helper (detail::MixedInputUtils) for one
 * element type and changing nothing of CUTLASS itself.
 *
 * The stock collective takes one scale a row and K tile, by a TMA box of
 * (BLK_M, 1) a stage; NVFP4 has four block scales a row in a K tile of
 * 64. So the tuple's scale type is nvfp4_pack, 64 bits: the row's four
 * e4m3 block scales of the tile (block kb in byte kb) and, in the high
 * word, the tensor scale's float bits, an MN-major [rows, K / 64] tensor
 * loaded by the collective's own TMA with its chunk_size 64 (the
 * collective's ConvertAndScale mode). What this header supplies is how
 * they are used: each of the tile's four k_blocks (wgmma's K of 16) is
 * one NVFP4 block, so the copy of a k_block's codes to registers also
 * forms that block's factor, e4m3 x tensor scale in float, for each of the
 * thread's fragment elements (from a shared-memory view of the packs
 * broadcast along K), and the conversion forms bf16(e2m1(code) x factor),
 * the float product rounded once: the NVFP4 decode's arithmetic
 * (kernels/train.cu's k_decode), so the converted operand is the decoded
 * bf16 weight bit for bit.
 *
 * A first form carried the factors as floats in the scale and the zero
 * (ConvertAndScaleWithZero) and stopped with "illegal instruction" on the
 * H200: compute-sanitizer put it at the scale's TMA load. In that mode
 * the grouped collective (sm90_mma_array_tma_gmma_rs_warpspecialized_
 * mixed_input.hpp, CUTLASS 4.2 and its main branch as read) copies,
 * updates and fences only the zero's tensormap, so the scale's
 * descriptor is never written, and its TMA load runs on garbage. Scale
 * only (ConvertAndScale) is handled.
 *
 * Include after CUTLASS's collective headers and before any GEMM type
 * that uses cute::tuple<cutlass::float_e2m1_t, nvfp4_pack> is
 * instantiated. Only the K-major A, a K tile of 64 and bf16 as the MMA
 * type are handled (static_asserts say so).
 */
#ifndef MS_NVFP4_MIXED_CUH
#define MS_NVFP4_MIXED_CUH

#include <cuda_bf16.h>

#include "cute/tensor.hpp"
#include "cutlass/detail/collective/mixed_input_utils.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"

/* a weight row's four e4m3 block scales of one K tile (block kb in
 * byte kb) and its tensor's scale (float bits) in the high word: TMA
 * moves it as one 64-bit element */
typedef uint64_t nvfp4_pack;

/* the tensor scale that marks a K tile as raw bf16 (a signalling NaN's
 * payload, no tensor's scale): the LoRA's tail. A K tile of
 * such blocks carries 16 bf16 values a row in its 32 bytes of codes:
 * wgmma's A fragment gives each thread of a quad (t = lane % 4) a row's
 * codes at k = 2t, 2t + 1 (its register's byte 0, or 1 for the row 8
 * below) and k = 2t + 8, 2t + 9 (byte 2, or 3), so in k_block kb the
 * thread reads bytes 8 kb + t and 8 kb + t + 4 of the row's tail: one
 * bf16, low byte first, which becomes its element at k = 16 kb + 2t, the
 * row's other three elements zero. The 16 values v_j (j = 4 kb + t) sit
 * at k = 16 kb + 2t of the tile; the other operand puts its 16 tail
 * columns there and zeros elsewhere. nvfp4_tail_pack lays a row out. */
#define NVFP4_RAW 0x7fa0b16fu

__host__ __device__ inline void nvfp4_tail_pack(const uint16_t v[16], uint8_t out[32])
{
	for (int kb = 0; kb < 4; kb++)
		for (int t = 0; t < 4; t++) {
			out[8 * kb + t] = (uint8_t)v[4 * kb + t];
			out[8 * kb + t + 4] = (uint8_t)(v[4 * kb + t] >> 8);
		}
}

/* e2m1 by its bits, exactly: the three magnitude bits at the lowest
 * exponent bits and the mantissa's first, read as a float 2^-126 too
 * small for every code (the subnormal 0.5 included), times 2^126. Needs
 * subnormals kept (nvcc's default, not --use_fast_math). */
__device__ __forceinline__ float nvfp4_e2m1f(uint32_t c)
{
	return __uint_as_float(((c & 7u) << 22) | ((c & 8u) << 28)) * 0x1p126f;
}

/* e4m3 (the block scale; no NaN code in a valid scale) exactly. The
 * reference: normal codes by their bits, subnormals as m 2^-9. The GEMM's:
 * the code's bits read as a float 2^-120 too small (subnormal where e4m3's
 * is), times 2^120, without a branch (NVFP4_PROBE_E4M3_BRANCH: the
 * reference's form there too) */
__device__ __forceinline__ float nvfp4_e4m3f_ref(uint32_t c)
{
	uint32_t e = (c >> 3) & 15u, m = c & 7u;
	float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0x1p-9f;
	return c & 0x80u ? -v : v;
}

__device__ __forceinline__ float nvfp4_e4m3f(uint32_t c)
{
#ifndef NVFP4_PROBE_E4M3_BRANCH
	return __uint_as_float(((c & 0x7fu) << 20) | ((c & 0x80u) << 24)) * 0x1p120f;
#else
	return nvfp4_e4m3f_ref(c);
#endif
}

/* the factor of block kb of a pack: e4m3 x tensor scale in float, as
 * k_decode forms it (s * tscale); the raw mark passed on. REF: by the
 * branching e4m3 (what the probe's reference decode uses, whatever the
 * GEMM's build) */
template <bool REF = false> __device__ __forceinline__ float nvfp4_factor(nvfp4_pack p, int kb)
{
	uint32_t hi = (uint32_t)(p >> 32), c = (uint32_t)(p >> (8 * kb)) & 0xffu;
	float t = __uint_as_float(hi);
	if (hi == NVFP4_RAW)
		return t;
	return (REF ? nvfp4_e4m3f_ref(c) : nvfp4_e4m3f(c)) * t;
}

namespace cutlass::gemm::collective::detail {

template <class Policy, class Tile, class StrideA, class... Rest>
struct MixedInputUtils<CollectiveMma<Policy, Tile, cute::tuple<cutlass::float_e2m1_t, nvfp4_pack>,
				     StrideA, Rest...>> {
	using Collective = CollectiveMma<Policy, Tile, cute::tuple<cutlass::float_e2m1_t, nvfp4_pack>,
					 StrideA, Rest...>;
	using SmemLayoutA = typename Collective::SmemLayoutA;
	using SmemLayoutB = typename Collective::SmemLayoutB;
	using SmemLayoutScale = typename Collective::SmemLayoutScale;
	using SwappedElementA = typename Collective::SwappedElementA;
	using SwappedElementB = typename Collective::SwappedElementB;
	static constexpr int BLK_K = cute::size<2>(Tile{});
	static_assert(BLK_K == 64, "a K tile of four NVFP4 blocks");
	static_assert(!Collective::SwapAB, "the NVFP4 weights must be operand A");
	static_assert(Collective::KernelConversionMode == cutlass::detail::ConversionMode::ConvertAndScale,
		      "the packs ride as the scale");

	static constexpr auto elements_per_smem_scale() { return cute::cosize_v<SmemLayoutScale>; }
	static constexpr auto elements_per_smem_zero() { return 0; }

	static constexpr uint32_t compute_tma_transaction_bytes_mk()
	{
		return cutlass::bits_to_bytes(cute::size<0>(SmemLayoutA{}) * cute::size<1>(SmemLayoutA{}) *
					      static_cast<uint32_t>(cute::sizeof_bits_v<SwappedElementA>));
	}
	static constexpr uint32_t compute_tma_transaction_bytes_nk()
	{
		return cutlass::bits_to_bytes(cute::size<0>(SmemLayoutB{}) * cute::size<1>(SmemLayoutB{}) *
					      static_cast<uint32_t>(cute::sizeof_bits_v<SwappedElementB>));
	}
	/* the scale's (BLK_M, 1) box */
	static constexpr uint32_t compute_tma_transaction_bytes_extra()
	{
		constexpr uint32_t b = cute::size<0>(SmemLayoutScale{}) * cute::size<1>(SmemLayoutScale{}) *
				       (uint32_t)sizeof(nvfp4_pack);
		static_assert(b % 128 == 0, "TMA moves whole 128-byte lines a stage");
		return b;
	}

	/* the producer's views: the pack tiles in global memory and their
	 * stages in shared memory, as the collective's load() indexes them */
	template <class Params, class TensorStorage, class... Ts>
	CUTLASS_DEVICE static auto partition_extra_tma_inputs(Params const &p, cute::tuple<Ts...> const &load_inputs,
							      TensorStorage &st, uint2 const &cluster_local_block_id,
							      int const m_coord, int const l_coord)
	{
		using namespace cute;
		Tensor sS = make_tensor(make_smem_ptr(st.smem_scale.begin()), SmemLayoutScale{});
		auto ts = p.tma_load_scale.get_slice(cluster_local_block_id.y);
		Tensor gS = get<2>(load_inputs)(_, _, m_coord, _, l_coord);
		return make_tuple(ts.partition_S(gS), ts.partition_D(sS));
	}

	/* a stage's packs seen as a (BLK_M, BLK_K) tile, broadcast along K,
	 * so partitioning it like A gives each fragment element its row's
	 * pack */
	template <class Ptr> CUTLASS_DEVICE static auto broadcast_view(Ptr ptr)
	{
		using namespace cute;
		auto l = make_layout(cute::layout<0>(SmemLayoutScale{}), make_layout(Int<BLK_K>{}, Int<0>{}),
				     cute::layout<2>(SmemLayoutScale{}));
		return make_tensor(make_smem_ptr(ptr), l);
	}

	/* the consumer's: (smem packs, the registers holding each fragment
	 * element's own factor a k_block) */
	template <class ThreadMma, class TensorStorage>
	CUTLASS_DEVICE static auto partition_extra_mma_info(ThreadMma const &mma, TensorStorage &st)
	{
		using namespace cute;
		Tensor sS = broadcast_view(st.smem_scale.begin());
		Tensor tCsS = mma.partition_A(sS); /* (MMA, MMA_M, MMA_K, PIPE) */
		Tensor tCrF = make_tensor<float>(mma.partition_fragment_A(sS(_, _, Int<0>{})).layout());
		return make_tuple(tCsS, tCrF);
	}

	/* a view of the factor registers the copies write through (the
	 * collective hands copy_tensors_MK the partitions as const) */
	template <class TiledMma, class... Ts>
	CUTLASS_DEVICE static auto retile_extra_mma_info(TiledMma const &, cute::tuple<Ts...> &pi, int const)
	{
		auto &r = cute::get<1>(pi);
		return cute::make_tuple(cute::make_tensor(r.data(), r.layout()));
	}

	/* the k_block's codes to registers, as the collective does, and each
	 * element's factor of that k_block's NVFP4 block */
	template <class SmemTiledCopyA, class TensorASmemView, class TensorACopyView, class... Ts, class... Us>
	CUTLASS_DEVICE static void copy_tensors_MK(SmemTiledCopyA const &smem_tiled_copy_A, TensorASmemView const &tCsA,
						   TensorACopyView &tCrA_copy_view, cute::tuple<Ts...> const &pi,
						   cute::tuple<Us...> const &views, int k_block, int read_stage)
	{
		using namespace cute;
		copy(smem_tiled_copy_A, tCsA(_, _, k_block, read_stage), tCrA_copy_view(_, _, k_block));
		auto r = get<0>(views)(_, _, k_block);
#ifdef NVFP4_PROBE_NO_FACTORS
		/* (a probe's build: no factor reads, to tell their cost) */
		CUTLASS_PRAGMA_UNROLL
		for (int i = 0; i < size(r); i++)
			r(i) = 1.0f;
		return;
#endif
		auto s = get<0>(pi)(_, _, k_block, read_stage);
		static_assert(decltype(size(r))::value % 8 == 0, "whole fragments of eight");
#ifdef NVFP4_PROBE_EVERY_FACTOR
		/* (a probe's build: each element's factor formed on its own) */
		CUTLASS_PRAGMA_UNROLL
		for (int i = 0; i < size(r); i++)
			r(i) = nvfp4_factor(s(i), k_block);
#else
		/* wgmma's A fragment, eight values a thread and 64-row atom:
		 * value v at k + (v & 1) + 8 (v >> 2) of row g + 8 ((v >> 1) & 1),
		 * so two rows, two factors */
		CUTLASS_PRAGMA_UNROLL
		for (int a = 0; a < size(r); a += 8) {
			float f0 = nvfp4_factor(s(a), k_block), f1 = nvfp4_factor(s(a + 2), k_block);
			CUTLASS_PRAGMA_UNROLL
			for (int v = 0; v < 8; v++)
				r(a + v) = v & 2 ? f1 : f0;
		}
#endif
	}

	/* bf16(e2m1(code) x factor) for the k_block's fragment, two
	 * elements a register, as k_decode rounds them */
	template <class EngineIn, class EngineOut, class LayoutIn, class LayoutOut, class... Ts>
	CUTLASS_DEVICE static void dequantize_A_kblock(cute::Tensor<EngineIn, LayoutIn> const &tCrA_load,
						       cute::Tensor<EngineOut, LayoutOut> &tCrA_mma,
						       cute::tuple<Ts...> &pi, int const k_block)
	{
		using namespace cute;
		static_assert(is_same_v<typename EngineOut::value_type, cutlass::bfloat16_t>, "bf16 MMA");
		Tensor src = tCrA_load(_, _, k_block);
		Tensor dst = tCrA_mma(_, _, k_block);
		Tensor f = get<1>(pi)(_, _, k_block);
		static_assert(decltype(size(src))::value % 8 == 0, "whole registers of codes");
		auto &&codes = recast<uint32_t>(src);
		auto &&out = recast<uint32_t>(dst);
#ifndef NVFP4_PROBE_TAIL_SELECT
		/* the tail chosen once a k_block by a branch, which every thread
		 * of the warpgroup takes alike, as the whole K tile carries the
		 * mark (wgmma stays converged) */
		if (__float_as_uint(f(0)) == NVFP4_RAW) {
			CUTLASS_PRAGMA_UNROLL
			for (int w = 0; w < size(codes); w++) {
				uint32_t c = codes(w);
				out(4 * w) = (c & 0xffu) | ((c >> 8) & 0xff00u);
				out(4 * w + 1) = ((c >> 8) & 0xffu) | ((c >> 16) & 0xff00u);
				out(4 * w + 2) = 0u;
				out(4 * w + 3) = 0u;
			}
			return;
		}
		CUTLASS_PRAGMA_UNROLL
		for (int w = 0; w < size(codes); w++) {
			uint32_t c = codes(w);
			CUTLASS_PRAGMA_UNROLL
			for (int j = 0; j < 4; j++) {
				int i = 8 * w + 2 * j;
				__nv_bfloat162 h = __floats2bfloat162_rn(nvfp4_e2m1f(c >> (8 * j)) * f(i),
									 nvfp4_e2m1f(c >> (8 * j + 4)) * f(i + 1));
				out(4 * w + j) = reinterpret_cast<uint32_t &>(h);
			}
		}
#else
		CUTLASS_PRAGMA_UNROLL
		for (int w = 0; w < size(codes); w++) {
			uint32_t c = codes(w);
			/* (the first form, NVFP4_PROBE_TAIL_SELECT: the tail's bf16
			 * (rows g and g + 8 from bytes 0, 2 and 1, 3, at elements 0
			 * and 2: k = 2t) chosen by select on every register) */
			bool raw = __float_as_uint(f(8 * w)) == NVFP4_RAW;
			uint32_t t0 = (c & 0xffu) | ((c >> 8) & 0xff00u);
			uint32_t t1 = ((c >> 8) & 0xffu) | ((c >> 16) & 0xff00u);
			CUTLASS_PRAGMA_UNROLL
			for (int j = 0; j < 4; j++) {
				int i = 8 * w + 2 * j;
				__nv_bfloat162 h = __floats2bfloat162_rn(nvfp4_e2m1f(c >> (8 * j)) * f(i),
									 nvfp4_e2m1f(c >> (8 * j + 4)) * f(i + 1));
				uint32_t v = reinterpret_cast<uint32_t &>(h);
				out(4 * w + j) = raw ? (j == 0 ? t0 : j == 1 ? t1 : 0u) : v;
			}
		}
#endif
	}
};

} // namespace cutlass::gemm::collective::detail

#endif
