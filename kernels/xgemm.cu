/*
 * xgemm.cu: the grouped expert GEMM of xgemm.h on CUTLASS's Hopper kernel
 * (TMA loads, wgmma, a cooperative warp-specialised persistent schedule
 * over a 128 x 256 x 64 tile, float32 out through a TMA store), the
 * fastest of the three configurations tools/bench/cutlass_grouped_probe.cu
 * measured on the H200 at the trainer's shapes.
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
using Tile = Shape<_128, _256, _64>;
using Cluster = Shape<_1, _1, _1>;

using Epi = cutlass::epilogue::collective::CollectiveBuilder<
	cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
	cutlass::epilogue::collective::EpilogueTileAuto, float, float, float, LD *, 4, float, LD *,
	4, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
	cutlass::epilogue::fusion::LinearCombination<float, float>>::CollectiveOp;
using Main = cutlass::gemm::collective::CollectiveBuilder<
	cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, LA *, 8, EA, LB *, 8, float, Tile,
	Cluster,
	cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
		sizeof(typename Epi::SharedStorage))>,
	cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shp, Main, Epi>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
using SA = Gemm::GemmKernel::InternalStrideA;
using SB = Gemm::GemmKernel::InternalStrideB;
using SD = Gemm::GemmKernel::InternalStrideD;
using PS = Shp::UnderlyingProblemShape;

/* the scratch: the per-group arrays, then CUTLASS's workspace */
struct lay {
	PS *ps;
	const EA **pa, **pb;
	float **pd;
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
	l.pd = (float **)(p + o);
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
			 const EA *w, uint64_t wstride, float *y, lay l)
{
	uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= E)
		return;
	int m = (int)(off[e + 1] - off[e]);
	l.ps[e] = {m, N, K};
	l.pa[e] = x + (uint64_t)off[e] * K;
	l.pb[e] = w + e * wstride;
	l.pd[e] = y + (uint64_t)off[e] * N;
	l.sa[e] = cutlass::make_cute_packed_stride(SA{}, {m, K, 1});
	l.sb[e] = cutlass::make_cute_packed_stride(SB{}, {N, K, 1});
	l.sd[e] = cutlass::make_cute_packed_stride(SD{}, {m, N, 1});
}

Gemm::Arguments args_of(const struct ms_xgemm *p, const lay &l, int dev, int sms)
{
	cutlass::KernelHardwareInfo hw;
	hw.device_id = dev;
	hw.sm_count = sms;
	Gemm::Arguments a;
	decltype(a.epilogue.thread) f;
	f.alpha = 1.0f;
	f.beta = 0.0f; /* C is not read */
	f.alpha_ptr = nullptr;
	f.beta_ptr = nullptr;
	f.alpha_ptr_array = nullptr;
	f.beta_ptr_array = nullptr;
	f.dAlpha = {cute::_0{}, cute::_0{}, 0};
	f.dBeta = {cute::_0{}, cute::_0{}, 0};
	a = Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
			    {(int)p->E, l.ps, nullptr},
			    {l.pa, l.sa, l.pb, l.sb},
			    {f, (const float **)l.pd, l.sd, l.pd, l.sd},
			    hw};
	return a;
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
	Gemm::Arguments a = args_of(p, l, dev, sms);
	size_t need = l.used + Gemm::get_workspace_size(a);
	Gemm gemm;
	if (need > MS_XGEMM_SCRATCH)
		return ms_err_set(err, MS_EINVAL, "grouped expert GEMM (CUTLASS): %u groups need %zu "
				  "bytes of scratch, more than %u", p->E, need,
				  (unsigned)MS_XGEMM_SCRATCH);
	k_groups<<<(p->E + 127) / 128, 128, 0, st>>>(p->off, p->E, (int)p->N, (int)p->K,
						       (const EA *)p->x, (const EA *)p->w,
						       p->wstride, p->y, l);
	CK(cudaGetLastError());
	if (gemm.can_implement(a) != cutlass::Status::kSuccess)
		return ms_err_set(err, MS_EINVAL, "grouped expert GEMM (CUTLASS): N %u, K %u: "
				  "the kernel cannot take it", p->N, p->K);
	if (gemm.initialize(a, l.ws, st) != cutlass::Status::kSuccess ||
	    gemm.run(st) != cutlass::Status::kSuccess) {
		cudaGetLastError();
		return ms_err_set(err, MS_EIO, "grouped expert GEMM (CUTLASS): the launch failed");
	}
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
