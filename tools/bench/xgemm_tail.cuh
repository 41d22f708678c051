/*
 * xgemm_tail.cuh: a consumer for CUTLASS's grouped Hopper GEMM (the
 * collective kernels/xgemm.cu builds) that leaves out the wgmma steps that
 * multiply only zeros, for tools/bench/cutlass_grouped_probe.cu. Measured
 * on the H200 and not kept (tools/bench/NOTES.md): the same bits as the
 * stock consumer, 1-2% slower alone at the two long-K expert products, and
 * the trainer's step no faster. Needs CUTLASS's headers and sm_90a.
 */
#ifndef MS_XGEMM_TAIL_CUH
#define MS_XGEMM_TAIL_CUH

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace ms_xgt {

using namespace cute;

/*
 * The stock collective's consumer runs every k_block (wgmma's K of 16) of
 * every K tile, in both of the tile's warpgroups (rows 0-63 and 64-127).
 * Two kinds of those steps multiply only TMA's zero fill:
 *
 * - K's last tile. The folded LoRA's 16 columns past F or H leave the
 *   last K tile of each product 16 columns of data and 48 of zeros, so 3
 *   of its 4 steps are zeros: a K tile in 13 (down's forward, K 768 + 16)
 *   to one in 33. Here the last K tile of a work tile runs only the
 *   k_blocks that hold a column below K (last_kb, the same for every group
 *   of a launch: they share K).
 * - An expert's last row tile. Its rows past the expert's count are
 *   zeros; at the trainer's routing (about 1024 rows an expert, give or
 *   take 32) about half the experts end on a tile of a few rows, so the
 *   second warpgroup's half is all zeros. Here a warpgroup whose 64 rows
 *   all lie past the group's M issues no wgmma for that work tile (it
 *   still waits for and releases every stage, as the pipeline counts its
 *   arrivals), and the other warpgroup has the tensor cores to itself;
 *   the epilogue's TMA store writes no row past M, so the idle half's
 *   accumulators (whatever they hold) go nowhere.
 *
 * The producer tells the consumers the tile's rows through shared memory:
 * before it acquires the first stage of a work tile it writes the count
 * into a slot of that stage and phase, and the consumer reads it after its
 * wait on that stage (the barrier's arrive releases, its wait acquires;
 * the slot's previous use was read before the stage was released two
 * fills ago). The group's M comes from the problem shape the kernel hands
 * load_init and tensors_perform_update, kept as a third input.
 *
 * Every step that runs is the stock one, in the same order, so the sums
 * are those of the stock loop (a skipped step would add products of
 * zeros). The TMA loads, the pipeline, the scheduler and the epilogue are
 * the stock ones.
 */
template <class Base> struct TailMma : Base {
	static constexpr int Stages = Base::DispatchPolicy::Stages;
	static constexpr int BM = decltype(size<0>(typename Base::TileShape{}))::value;

	struct Arguments : Base::Arguments {
		int last_kb; /* k_blocks of the last K tile that hold data */
	};
	struct Params : Base::Params {
		int last_kb;
	};
	/* the stock tiles, and the rows of a work tile a stage and phase */
	struct TensorStorage : Base::TensorStorage {
		int rows[2 * Stages];
	};

	template <class PShape>
	static Params to_underlying_arguments(PShape ps, Arguments const &a, void *ws)
	{
		Params p;
		static_cast<typename Base::Params &>(p) = Base::to_underlying_arguments(ps, a, ws);
		p.last_kb = a.last_kb;
		return p;
	}

	/* the stock inputs and the group's M */
	template <class PS>
	CUTLASS_DEVICE auto load_init(PS const &ps, Params const &mp) const
	{
		auto in = Base::load_init(ps, mp);
		return cute::make_tuple(get<0>(in), get<1>(in), (int)get<0>(ps));
	}

	template <class In, class PS>
	CUTLASS_DEVICE auto tensors_perform_update(In const &in, Params const &mp, PS ps,
						   int32_t next_batch)
	{
		return cute::make_tuple(get<0>(in), get<1>(in), (int)get<0>(ps));
	}

	/* the stock producer, after the tile's rows are left for the consumers */
	template <class TA, class TB, class TMA, class TMB, class KIt, class BlockCoord>
	CUTLASS_DEVICE void load(Params const &mp, typename Base::MainloopPipeline pipeline,
				 typename Base::PipelineState smem_pipe_write,
				 cute::tuple<TA, TB, int> const &in,
				 cute::tuple<TMA, TMB> const &tmaps, BlockCoord const &blk_coord,
				 KIt k_tile_iter, int k_tile_count, int thread_idx,
				 uint32_t block_rank_in_cluster, TensorStorage &shared_tensors)
	{
		if (k_tile_count > 0 && cute::elect_one_sync()) {
			int m0 = (int)get<0>(blk_coord) * BM, rows = get<2>(in) - m0;
			/* the slot of the consumer's phase for this fill: CUTLASS's
			 * producer state starts at phase 1, the consumer's at 0 */
			shared_tensors.rows[2 * smem_pipe_write.index() + (smem_pipe_write.phase() ^ 1)] =
				rows < BM ? rows : BM;
		}
		__syncwarp();
		Base::load(mp, pipeline, smem_pipe_write, cute::make_tuple(get<0>(in), get<1>(in)),
			   tmaps, blk_coord, k_tile_iter, k_tile_count, thread_idx,
			   block_rank_in_cluster, shared_tensors);
	}

	/* n k_blocks of the stage's tile into accum, straight-line between the
	 * warpgroup's arrive and commit (a branch among the wgmma issues would
	 * have ptxas serialise them) */
	template <int n, class Mma, class FA, class FB, class Acc>
	CUTLASS_DEVICE static void steps(Mma &tiled_mma, FA const &tCrA, FB const &tCrB, int stage,
					 Acc &accum)
	{
		warpgroup_arrive();
		CUTLASS_PRAGMA_UNROLL
		for (int kb = 0; kb < n; ++kb) {
			cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), accum);
			tiled_mma.accumulate_ = GMMA::ScaleOut::One;
		}
		warpgroup_commit_batch();
	}

	template <int KB, class Mma, class FA, class FB, class Acc>
	CUTLASS_DEVICE static void tile(Mma &tiled_mma, FA const &tCrA, FB const &tCrB, int stage,
					int nkb, Acc &accum)
	{
		static_assert(KB >= 1 && KB <= 8, "K tile of 16 to 128 columns");
		if (nkb >= KB)
			steps<KB>(tiled_mma, tCrA, tCrB, stage, accum);
		else if (nkb == 1)
			steps<1>(tiled_mma, tCrA, tCrB, stage, accum);
		else if constexpr (KB > 2) {
			if (nkb == 2)
				steps<2>(tiled_mma, tCrA, tCrB, stage, accum);
			else if constexpr (KB > 3) {
				if (nkb == 3)
					steps<3>(tiled_mma, tCrA, tCrB, stage, accum);
				else
					/* K tiles of more than 64 columns: the rest whole */
					steps<KB>(tiled_mma, tCrA, tCrB, stage, accum);
			}
		}
	}

	/* the consumer: the stock one's schedule (one K tile's wgmma in
	 * flight, its stage released once the next is issued) */
	template <class FrgTensorC>
	CUTLASS_DEVICE void mma(typename Base::MainloopPipeline pipeline,
				typename Base::PipelineState smem_pipe_read, FrgTensorC &accum,
				int k_tile_count, int thread_idx, TensorStorage &shared_tensors,
				Params const &mp)
	{
		static_assert(Base::K_PIPE_MMAS == 1, "one K tile's wgmma in flight");
		Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()),
					typename Base::SmemLayoutA{});
		Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()),
					typename Base::SmemLayoutB{});
		using TM = typename Base::TiledMma;
		constexpr int WG = size(TM{}) / cutlass::NumThreadsPerWarpGroup;
		static_assert(BM % WG == 0, "the warpgroups split the tile's rows");
		Layout wgl = make_layout(Int<WG>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
		int wg = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
		TM tiled_mma;
		auto thr = tiled_mma.get_slice(wgl(wg));
		Tensor tCsA = thr.partition_A(sA);
		Tensor tCsB = thr.partition_B(sB);
		Tensor tCrA = thr.make_fragment_A(tCsA);
		Tensor tCrB = thr.make_fragment_B(tCsB);
		constexpr int KB = decltype(size<2>(tCrA))::value;
		int last = mp.last_kb;

		auto smem_pipe_release = smem_pipe_read;
		tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
		warpgroup_fence_operand(accum);
		if (k_tile_count <= 0)
			return;
		auto tok = pipeline.consumer_try_wait(smem_pipe_read);
		pipeline.consumer_wait(smem_pipe_read, tok);
		/* this warpgroup's rows all past the group's M: waits and
		 * releases only (uniform over the warpgroup) */
		int rows = shared_tensors.rows[2 * smem_pipe_read.index() + smem_pipe_read.phase()];
		if (wg * (BM / WG) >= rows) {
			/* accum is left as it is: clearing it here would have ptxas
			 * serialise the wgmma pipeline, and its rows are not stored */
			++smem_pipe_read;
			CUTLASS_PRAGMA_NO_UNROLL
			for (int kt = k_tile_count - 1; kt > 0; --kt) {
				auto t2 = pipeline.consumer_try_wait(smem_pipe_read);
				pipeline.consumer_wait(smem_pipe_read, t2);
				pipeline.consumer_release(smem_pipe_release);
				++smem_pipe_read;
				++smem_pipe_release;
			}
			warpgroup_fence_operand(accum);
			return;
		}
		tile<KB>(tiled_mma, tCrA, tCrB, smem_pipe_read.index(), k_tile_count == 1 ? last : KB,
			 accum);
		++smem_pipe_read;
		warpgroup_fence_operand(accum);
		CUTLASS_PRAGMA_NO_UNROLL
		for (int kt = k_tile_count - 1; kt > 0; --kt) {
			auto t2 = pipeline.consumer_try_wait(smem_pipe_read);
			pipeline.consumer_wait(smem_pipe_read, t2);
			warpgroup_fence_operand(accum);
			tile<KB>(tiled_mma, tCrA, tCrB, smem_pipe_read.index(), kt == 1 ? last : KB,
				 accum);
			warpgroup_wait<1>();
			warpgroup_fence_operand(accum);
			pipeline.consumer_release(smem_pipe_release);
			++smem_pipe_read;
			++smem_pipe_release;
		}
		warpgroup_fence_operand(accum);
	}
};

/* the k_blocks (wgmma's K of 16) of K's last K tile (tk columns) that
 * hold data */
inline int last_kb_of(int K, int tk)
{
	int r = K - (K - 1) / tk * tk;
	return (r + 15) / 16;
}

} /* namespace ms_xgt */

#endif
