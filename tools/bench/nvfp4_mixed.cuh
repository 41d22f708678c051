/*
 * nvfp4_mixed.cuh: NVFP4 weights in CUTLASS 4.2's Hopper grouped
 * mixed-input GEMM (the 4-bit operand A converted in registers before
 * wgmma), with NVFP4's factor every 16 values along K, by specialising
 * the collective's conversion helper (detail::MixedInputUtils) for one
 * element type and changing nothing of CUTLASS itself.
 *
 * The stock collective takes one scale (and zero) a row and K tile, by a
 * TMA box of (BLK_M, 1) a stage; NVFP4 has four factors a row in a K
 * tile of 64. So the tuple's scale type is nvfp4_f2, two floats, and its
 * zero type uint64_t, the same two floats' bits (the collective builds
 * the zero's TMA on the element type itself, which must be one TMA
 * knows): the row's factors for K blocks 0 and 1 of the tile ride in the
 * "scale", those for blocks 2 and 3 in the "zero", each an MN-major
 * [rows, K / 64] tensor loaded by the collective's own TMA with its
 * chunk_size 64. What this header supplies is how they are used: each of
 * the tile's four k_blocks (wgmma's K of 16) is one NVFP4 block, so the
 * copy of a k_block's codes to registers also reads that block's factor
 * for each of the thread's fragment elements (from a shared-memory view
 * of the factors broadcast along K), and the conversion forms
 * bf16(e2m1(code) x factor), the float product rounded once, which is
 * the NVFP4 decode's arithmetic (kernels/train.cu's k_decode), so the
 * converted operand should be the decoded bf16 weight bit for bit.
 * Not yet shown: on the H200 the GEMM built with this stops with
 * "illegal instruction" (tools/bench/NOTES.md), so neither its rate nor
 * mixed_grouped_probe.cu's bit-for-bit check has run.
 *
 * The factor is the block's e4m3 scale times (or divided by) the tensor
 * scale, formed in float as ms_nvfp4_block_decode forms it.
 *
 * Include after CUTLASS's collective headers and before any GEMM type
 * that uses cute::tuple<cutlass::float_e2m1_t, nvfp4_f2, uint64_t> is
 * instantiated. Only the K-major A, a K tile of 64 and bf16 as the MMA
 * type are handled (static_asserts say so).
 */
#ifndef MS_NVFP4_MIXED_CUH
#define MS_NVFP4_MIXED_CUH

#include <cuda_bf16.h>

#include "cute/tensor.hpp"
#include "cutlass/detail/collective/mixed_input_utils.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"

/* two NVFP4 block factors of one weight row (8 bytes: TMA moves it as
 * one 64-bit element) */
struct alignas(8) nvfp4_f2 {
	float f[2];
};

/* the factor that marks a block as raw bf16 (a signalling NaN's payload
 * that no NVFP4 factor table produces): the LoRA's tail. A K tile of
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

namespace cutlass::gemm::collective::detail {

template <class Policy, class Tile, class StrideA, class... Rest>
struct MixedInputUtils<CollectiveMma<Policy, Tile, cute::tuple<cutlass::float_e2m1_t, nvfp4_f2, uint64_t>,
				     StrideA, Rest...>> {
	using Collective = CollectiveMma<Policy, Tile, cute::tuple<cutlass::float_e2m1_t, nvfp4_f2, uint64_t>,
					 StrideA, Rest...>;
	using SmemLayoutA = typename Collective::SmemLayoutA;
	using SmemLayoutB = typename Collective::SmemLayoutB;
	using SmemLayoutScale = typename Collective::SmemLayoutScale;
	using SwappedElementA = typename Collective::SwappedElementA;
	using SwappedElementB = typename Collective::SwappedElementB;
	static constexpr int BLK_K = cute::size<2>(Tile{});
	static_assert(BLK_K == 64, "a K tile of four NVFP4 blocks");
	static_assert(!Collective::SwapAB, "the NVFP4 weights must be operand A");
	static_assert(Collective::KernelConversionMode == cutlass::detail::ConversionMode::ConvertAndScaleWithZero,
		      "the factors ride as scale and zero");

	static constexpr auto elements_per_smem_scale() { return cute::cosize_v<SmemLayoutScale>; }
	static constexpr auto elements_per_smem_zero() { return cute::cosize_v<SmemLayoutScale>; }

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
	/* the scale's and the zero's (BLK_M, 1) boxes */
	static constexpr uint32_t compute_tma_transaction_bytes_extra()
	{
		constexpr uint32_t b = cute::size<0>(SmemLayoutScale{}) * cute::size<1>(SmemLayoutScale{}) *
				       (uint32_t)sizeof(nvfp4_f2);
		static_assert(b % 128 == 0, "TMA moves whole 128-byte lines a stage");
		return 2 * b;
	}

	/* the producer's views: the factor tiles in global memory and their
	 * stages in shared memory, as the collective's load() indexes them */
	template <class Params, class TensorStorage, class... Ts>
	CUTLASS_DEVICE static auto partition_extra_tma_inputs(Params const &p, cute::tuple<Ts...> const &load_inputs,
							      TensorStorage &st, uint2 const &cluster_local_block_id,
							      int const m_coord, int const l_coord)
	{
		using namespace cute;
		Tensor sS = make_tensor(make_smem_ptr(st.smem_scale.begin()), SmemLayoutScale{});
		Tensor sZ = make_tensor(make_smem_ptr(st.smem_zero.begin()), SmemLayoutScale{});
		auto ts = p.tma_load_scale.get_slice(cluster_local_block_id.y);
		auto tz = p.tma_load_zero.get_slice(cluster_local_block_id.y);
		Tensor gS = get<2>(load_inputs)(_, _, m_coord, _, l_coord);
		Tensor gZ = get<3>(load_inputs)(_, _, m_coord, _, l_coord);
		return make_tuple(ts.partition_S(gS), ts.partition_D(sS), tz.partition_S(gZ), tz.partition_D(sZ));
	}

	/* a stage's factors seen as a (BLK_M, BLK_K) tile, broadcast along K,
	 * so partitioning it like A gives each fragment element its row's
	 * pair */
	template <class Ptr> CUTLASS_DEVICE static auto broadcast_view(Ptr ptr)
	{
		using namespace cute;
		auto l = make_layout(cute::layout<0>(SmemLayoutScale{}), make_layout(Int<BLK_K>{}, Int<0>{}),
				     cute::layout<2>(SmemLayoutScale{}));
		return make_tensor(make_smem_ptr(ptr), l);
	}

	/* the consumer's: (smem factors of the scale, of the zero, the
	 * registers holding each fragment element's own factor a k_block) */
	template <class ThreadMma, class TensorStorage>
	CUTLASS_DEVICE static auto partition_extra_mma_info(ThreadMma const &mma, TensorStorage &st)
	{
		using namespace cute;
		Tensor sS = broadcast_view(st.smem_scale.begin());
		Tensor sZ = broadcast_view(st.smem_zero.begin());
		static_assert(sizeof(*st.smem_zero.begin()) == sizeof(nvfp4_f2), "the zero holds a pair too");
		Tensor tCsS = mma.partition_A(sS); /* (MMA, MMA_M, MMA_K, PIPE) */
		Tensor tCsZ = mma.partition_A(sZ);
		Tensor tCrF = make_tensor<float>(mma.partition_fragment_A(sS(_, _, Int<0>{})).layout());
		return make_tuple(tCsS, tCsZ, tCrF);
	}

	/* a view of the factor registers the copies write through (the
	 * collective hands copy_tensors_MK the partitions as const) */
	template <class TiledMma, class... Ts>
	CUTLASS_DEVICE static auto retile_extra_mma_info(TiledMma const &, cute::tuple<Ts...> &pi, int const)
	{
		auto &r = cute::get<2>(pi);
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
		if (k_block < 2) {
			auto s = get<0>(pi)(_, _, k_block, read_stage);
			CUTLASS_PRAGMA_UNROLL
			for (int i = 0; i < size(r); i++)
				r(i) = s(i).f[k_block & 1];
		} else {
			auto z = get<1>(pi)(_, _, k_block, read_stage);
			CUTLASS_PRAGMA_UNROLL
			for (int i = 0; i < size(r); i++) {
				uint64_t v = z(i);
				r(i) = __uint_as_float((uint32_t)(v >> (32 * (k_block & 1))));
			}
		}
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
		Tensor f = get<2>(pi)(_, _, k_block);
		static_assert(decltype(size(src))::value % 8 == 0, "whole registers of codes");
		auto &&codes = recast<uint32_t>(src);
		auto &&out = recast<uint32_t>(dst);
		CUTLASS_PRAGMA_UNROLL
		for (int w = 0; w < size(codes); w++) {
			uint32_t c = codes(w);
			/* the tail's bf16 (rows g and g + 8 from bytes 0, 2 and
			 * 1, 3, at elements 0 and 2: k = 2t), chosen by select,
			 * not a branch: wgmma wants its warpgroup converged */
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
	}
};

} // namespace cutlass::gemm::collective::detail

#endif
