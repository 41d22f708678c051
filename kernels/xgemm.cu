/*
 * xgemm.cu: the grouped expert GEMM of xgemm.h on CUTLASS's Hopper kernel
 * (TMA loads, wgmma, a cooperative warp-specialised persistent schedule
 * over a 128 x 256 x 64 tile, float32 or bf16 out through a TMA store),
 * the fastest of the configurations tools/bench/cutlass_grouped_probe.cu
 * measured on the H200 at the trainer's shapes (seven, with the bf16
 * output: clusters, 256 x 128, ping-pong). The two outputs are two
 * instantiations with the same main loop: the same float32 sums, the bf16
 * one rounding them to nearest even on the way out.
 *
 * Before each product a small kernel writes the groups' sizes, pointers
 * and strides from the offsets routing left on the device, into the
 * caller's scratch; the GEMM reads them there (no host copy of the
 * shapes: CUTLASS then sizes the persistent grid by the SM count). A
 * group of zero rows has no tiles.
 *
 * Built as sm_90a (wgmma and the TMA forms need it); without CUTLASS's
 * headers only the refusing half is compiled.
 */
#include <cuda_runtime.h>

#include "gpu_internal.h"
#include "xgemm.h"

/* the device's SM count when it is an sm_90, else 0 (cached per device) */
static int sm90_sms(void)
{
	static int cached[64], known[64];
	int dev = 0, maj = 0, min = 0, n = 0;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
		cudaGetLastError();
		return 0;
	}
	if (known[dev])
		return cached[dev];
	if (cudaDeviceGetAttribute(&maj, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&min, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	cached[dev] = maj == 9 && min == 0 ? n : 0;
	known[dev] = 1;
	return cached[dev];
}

extern "C" int ms_xgemm_device_ok(void)
{
	return sm90_sms() > 0;
}

#ifdef MS_HAVE_CUTLASS

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace ms_xg {

using namespace cute;
using Shp = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using EA = cutlass::bfloat16_t;
using LA = cutlass::layout::RowMajor;    /* X [rows, K] */
using LB = cutlass::layout::ColumnMajor; /* W [N, K] row-major is K x N column-major */
using LD = cutlass::layout::RowMajor;    /* Y [rows, N] */
/* MS_XG_TILE_K: the K tile (a build-time trial; the folded LoRA's 16
 * columns of K past F or H take a whole K tile of zeros past them) */
#ifndef MS_XG_TILE_K
#define MS_XG_TILE_K 64
#endif
using Tile = Shape<_128, _256, Int<MS_XG_TILE_K>>;
using Cluster = Shape<_1, _1, _1>;

/* the kernel for an output element type D (float or bfloat16_t) */
template <typename D> struct xk {
	static constexpr int AL = 16 / (int)sizeof(D); /* 16-byte accesses */
	using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
		cutlass::epilogue::collective::EpilogueTileAuto, float, float, D, LD *, AL, D,
		LD *, AL, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
		cutlass::epilogue::fusion::LinearCombination<D, float>>::CollectiveOp;
	using Main = typename cutlass::gemm::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, LA *, 8, EA, LB *, 8,
		float, Tile, Cluster,
		cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
			sizeof(typename Epi::SharedStorage))>,
		cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
	using Kernel = cutlass::gemm::kernel::GemmUniversal<Shp, Main, Epi>;
	using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};
/* the strides do not depend on D */
using SA = xk<float>::Gemm::GemmKernel::InternalStrideA;
using SB = xk<float>::Gemm::GemmKernel::InternalStrideB;
using SD = xk<float>::Gemm::GemmKernel::InternalStrideD;
static_assert(std::is_same<SD, xk<cutlass::bfloat16_t>::Gemm::GemmKernel::InternalStrideD>::value,
	      "one stride type for both outputs");
using PS = Shp::UnderlyingProblemShape;

/* the scratch: the per-group arrays, then CUTLASS's workspace */
struct lay {
	PS *ps;
	const EA **pa, **pb;
	void **pd;
	SA *sa;
	SB *sb;
	SD *sd;
	void *ws;
	size_t used;
};

size_t up256(size_t n)
{
	return (n + 255) / 256 * 256;
}

lay layout(void *base, uint32_t E)
{
	lay l;
	char *p = (char *)base;
	size_t o = 0;
	l.ps = (PS *)(p + o);
	o += up256(E * sizeof(PS));
	l.pa = (const EA **)(p + o);
	o += up256(E * sizeof(void *));
	l.pb = (const EA **)(p + o);
	o += up256(E * sizeof(void *));
	l.pd = (void **)(p + o);
	o += up256(E * sizeof(void *));
	l.sa = (SA *)(p + o);
	o += up256(E * sizeof(SA));
	l.sb = (SB *)(p + o);
	o += up256(E * sizeof(SB));
	l.sd = (SD *)(p + o);
	o += up256(E * sizeof(SD));
	l.ws = p + o;
	l.used = o;
	return l;
}

__global__ void k_groups(const uint32_t *off, uint32_t E, int N, int K, const EA *x,
			 const EA *w, uint64_t wstride, char *y, uint32_t ysz, lay l)
{
	uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= E)
		return;
	int m = (int)(off[e + 1] - off[e]);
	l.ps[e] = {m, N, K};
	l.pa[e] = x + (uint64_t)off[e] * K;
	l.pb[e] = w + e * wstride;
	l.pd[e] = y + (uint64_t)off[e] * N * ysz;
	l.sa[e] = cutlass::make_cute_packed_stride(SA{}, {m, K, 1});
	l.sb[e] = cutlass::make_cute_packed_stride(SB{}, {N, K, 1});
	l.sd[e] = cutlass::make_cute_packed_stride(SD{}, {m, N, 1});
}

template <typename D>
typename xk<D>::Gemm::Arguments args_of(const struct ms_xgemm *p, const lay &l, int dev, int sms)
{
	using Gemm = typename xk<D>::Gemm;
	cutlass::KernelHardwareInfo hw;
	hw.device_id = dev;
	hw.sm_count = sms;
	typename Gemm::Arguments a;
	decltype(a.epilogue.thread) f;
	f.alpha = 1.0f;
	f.beta = 0.0f; /* C is not read */
	f.alpha_ptr = nullptr;
	f.beta_ptr = nullptr;
	f.alpha_ptr_array = nullptr;
	f.beta_ptr_array = nullptr;
	f.dAlpha = {cute::_0{}, cute::_0{}, 0};
	f.dBeta = {cute::_0{}, cute::_0{}, 0};
	a = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
				     {(int)p->E, l.ps, nullptr},
				     {l.pa, l.sa, l.pb, l.sb},
				     {f, (const D **)l.pd, l.sd, (D **)l.pd, l.sd},
				     hw};
	return a;
}

/* the product with output type D, the groups' arrays already written */
template <typename D>
int run_as(const struct ms_xgemm *p, const lay &l, int dev, int sms, cudaStream_t st,
	   struct ms_err *err)
{
	using Gemm = typename xk<D>::Gemm;
	typename Gemm::Arguments a = args_of<D>(p, l, dev, sms);
	Gemm gemm;
	if (l.used + Gemm::get_workspace_size(a) > MS_XGEMM_SCRATCH)
		return ms_err_set(err, MS_EINVAL, "grouped expert GEMM (CUTLASS): %u groups need %zu "
				  "bytes of scratch, more than %u", p->E,
				  l.used + Gemm::get_workspace_size(a), (unsigned)MS_XGEMM_SCRATCH);
	if (gemm.can_implement(a) != cutlass::Status::kSuccess)
		return ms_err_set(err, MS_EINVAL, "grouped expert GEMM (CUTLASS): N %u, K %u: "
				  "the kernel cannot take it", p->N, p->K);
	if (gemm.initialize(a, l.ws, st) != cutlass::Status::kSuccess ||
	    gemm.run(st) != cutlass::Status::kSuccess) {
		cudaGetLastError();
		return ms_err_set(err, MS_EIO, "grouped expert GEMM (CUTLASS): the launch failed");
	}
	return MS_OK;
}

} /* namespace ms_xg */

using namespace ms_xg;

extern "C" int ms_xgemm_ok(uint32_t N, uint32_t K)
{
	return N && K && N % 8 == 0 && K % 8 == 0 && N <= (1u << 30) && K <= (1u << 30) &&
	       sm90_sms() > 0;
}

extern "C" int ms_xgemm_run(const struct ms_xgemm *p, void *stream, struct ms_err *err)
{
	int rc = MS_OK;
	cudaStream_t st = (cudaStream_t)stream;
	int sms = sm90_sms();
	if (!p->E || !ms_xgemm_ok(p->N, p->K) || !sms)
		return ms_err_set(err, MS_EINVAL, "grouped expert GEMM (CUTLASS): %u groups of N %u, "
				  "K %u on this device: not covered", p->E, p->N, p->K);
	int dev = 0;
	cudaError_t de = cudaGetDevice(&dev);
	if (de != cudaSuccess)
		return ms_gpu_cuda_err(err, de, "cudaGetDevice");
	lay l = layout(p->scratch, p->E);
	k_groups<<<(p->E + 127) / 128, 128, 0, st>>>(p->off, p->E, (int)p->N, (int)p->K,
						       (const EA *)p->x, (const EA *)p->w,
						       p->wstride, (char *)p->y, p->ybf16 ? 2 : 4, l);
	CK(cudaGetLastError());
	if ((rc = p->ybf16 ? run_as<cutlass::bfloat16_t>(p, l, dev, sms, st, err)
			   : run_as<float>(p, l, dev, sms, st, err)))
		return rc;
	CK(cudaGetLastError());
out:
	return rc;
}

#else /* no CUTLASS in this build */

extern "C" int ms_xgemm_ok(uint32_t N, uint32_t K)
{
	(void)N, (void)K;
	return 0;
}

extern "C" int ms_xgemm_run(const struct ms_xgemm *p, void *stream, struct ms_err *err)
{
	(void)p, (void)stream;
	return ms_err_set(err, MS_EINVAL, "grouped expert GEMM (CUTLASS): not in this build");
}

#endif
