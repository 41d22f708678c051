/*
 * cutlass_grouped_probe.cu: CUTLASS's Hopper grouped GEMM (TMA, wgmma,
 * warp-specialised, the problem sizes read on the device) against one
 * cublasGemmEx per expert, for the trainer benchmark's four expert
 * products (64 experts, 65536 routed rows, bf16 operands, bf16 out as the
 * trainer's folded layers write them, K with the folded LoRA's 16
 * columns): GPU time per layer call (CUDA events over 20 calls), host time
 * to queue it, TFLOP/s, the largest difference from the float32 cuBLAS
 * product (the bf16 output's rounding), and how many outputs differ from
 * the first configuration's, bit for bit. Seven configurations:
 * cooperative 128x256 (the one kernels/xgemm.cu builds) with clusters 1x1
 * and 2x1, cooperative 256x128 with 1x1 and 1x2, ping-pong 128x128 with
 * 1x1 and 2x1, ping-pong 64x256. Measured on the H200 (tools/bench/
 * NOTES.md): the cooperative 128x256 1x1 fastest at all four shapes.
 * Then that one with xgemm_tail.cuh's consumer (the wgmma steps that
 * multiply only TMA's zero fill left out), alone and with the epilogue's
 * subtile 128x64 or 128x128 or no shared memory: the same bits, none
 * faster (NOTES.md); CGP_NEW_ONLY=1 runs only these, between two runs of
 * the first. Not
 * built by make: it needs CUTLASS's headers (the build's
 * tools/fetch_headers.sh puts them in .deps) and sm_90a; without -DNDEBUG
 * ptxas serialises the wgmma pipeline (CUTLASS's device asserts are
 * calls):
 *
 *   sh tools/fetch_headers.sh cutlass .deps/cutlass-4.2.0.0
 *   nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90a --expt-relaxed-constexpr \
 *        -I.deps/cutlass-4.2.0.0/include -o cutlass_grouped_probe \
 *        tools/bench/cutlass_grouped_probe.cu -lcublas
 */

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include "probe_fill.cuh"

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
#include "xgemm_tail.cuh"

using namespace cute;


/* Tail: xgemm_tail.cuh's consumer (the wgmma steps on zeros left out: K's
 * last tile past K, a row tile's empty half) instead of the stock one;
 * ETile: the epilogue's subtile */
template <class Tile, class Cluster, class KSched, class ESched, bool Tail = false,
	  class ETile = cutlass::epilogue::collective::EpilogueTileAuto>
struct Grouped {
	using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, ETile, float,
		float, ED, LD *, 8, ED, LD *, 8, ESched,
		cutlass::epilogue::fusion::LinearCombination<ED, float>>::CollectiveOp;
	using Main = typename cutlass::gemm::collective::CollectiveBuilder<
		cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, LA *, 8, EA, LB *, 8, float,
		Tile, Cluster,
		cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
			sizeof(typename Epi::SharedStorage))>,
		KSched>::CollectiveOp;
	using Kernel = cutlass::gemm::kernel::GemmUniversal<
		ProblemShape, std::conditional_t<Tail, ms_xgt::TailMma<Main>, Main>, Epi>;
	using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

/* the two schedules, by tile and cluster */
template <class Tile, class Cluster>
using Coop = Grouped<Tile, Cluster, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
		     cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
template <class Tile, class Cluster>
using Ping = Grouped<Tile, Cluster, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
		     cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
using C1 = Coop<Shape<_128, _256, _64>, Shape<_1, _1, _1>>;
using C2 = Coop<Shape<_128, _256, _64>, Shape<_2, _1, _1>>;
using C3 = Coop<Shape<_256, _128, _64>, Shape<_1, _1, _1>>;
using C4 = Coop<Shape<_256, _128, _64>, Shape<_1, _2, _1>>;
using P1 = Ping<Shape<_128, _128, _64>, Shape<_1, _1, _1>>;
using P2 = Ping<Shape<_64, _256, _64>, Shape<_1, _1, _1>>;
using P3 = Ping<Shape<_128, _128, _64>, Shape<_2, _1, _1>>;
/* C1 with the steps on zeros left out, and that with its epilogue's
 * subtile or schedule changed (with CGP_NEW_ONLY set, these between two
 * runs of C1 and nothing else) */
using T128 = Shape<_128, _256, _64>;
using C1T = Grouped<T128, Shape<_1, _1, _1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
		    cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, true>;
using C1TE64 = Grouped<T128, Shape<_1, _1, _1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
		       cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, true, Shape<_128, _64>>;
using C1TE128 = Grouped<T128, Shape<_1, _1, _1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
			cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, true, Shape<_128, _128>>;
using C1TNS = Grouped<T128, Shape<_1, _1, _1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
		      cutlass::epilogue::PtrArrayNoSmemWarpSpecialized, true>;

/* the first configuration's bf16 output of the current product */
static std::vector<uint16_t> first_out;

template <class MA> static constexpr auto requires_tail(int) -> decltype(MA{}.last_kb, true)
{
	return true;
}
template <class MA> static constexpr bool requires_tail(long)
{
	return false;
}

/* what the trainer would run before each product: the groups' sizes and
 * pointers from the row offsets on the device (no host round trip) */
template <class SA, class SB, class SD>
__global__ void groups(const int *off, int E, int N, int K, const EA *X, const EA *W, ED *Y,
		       ProblemShape::UnderlyingProblemShape *ps, const EA **pa, const EA **pb,
		       ED **pd, SA *sa, SB *sb, SD *sd)
{
	int e = blockIdx.x * blockDim.x + threadIdx.x;
	if (e >= E)
		return;
	int m = off[e + 1] - off[e];
	ps[e] = {m, N, K};
	pa[e] = X + (size_t)off[e] * K;
	pb[e] = W + (size_t)e * N * K;
	pd[e] = Y + (size_t)off[e] * N;
	sa[e] = cutlass::make_cute_packed_stride(SA{}, {m, K, 1});
	sb[e] = cutlass::make_cute_packed_stride(SB{}, {N, K, 1});
	sd[e] = cutlass::make_cute_packed_stride(SD{}, {m, N, 1});
}

/* the mainloop's arguments: the stock four, and with xgemm_tail.cuh's
 * consumer the k_blocks of K's last tile that hold data */
template <class Gemm, class PA, class SA, class PB, class SB>
static auto mainloop_args(PA pa, SA sa, PB pb, SB sb, int K)
{
	using MA = typename Gemm::GemmKernel::MainloopArguments;
	MA m{};
	m.ptr_A = pa, m.dA = sa, m.ptr_B = pb, m.dB = sb;
	if constexpr (requires_tail<MA>(0))
		m.last_kb = ms_xgt::last_kb_of(K, 64);
	return m;
}

static double now()
{
	return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
		.count();
}

/* f's GPU time a call (CUDA events over 20 calls after 2 to warm up) in
 * ms, and the host's time to queue it in us */
template <class F> static void timed(F f, float *ms, double *host_us)
{
	cudaEvent_t a, b;
	double host = 0;
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	for (int it = 0; it < 22; it++) {
		if (it == 2)
			CK(cudaEventRecord(a));
		double t0 = now();
		f();
		if (it >= 2)
			host += now() - t0;
	}
	CK(cudaEventRecord(b));
	CK(cudaEventSynchronize(b));
	CK(cudaGetLastError());
	CK(cudaEventElapsedTime(ms, a, b));
	*ms /= 20;
	*host_us = host / 20 * 1e6;
	cudaEventDestroy(a);
	cudaEventDestroy(b);
}

template <class G>
static void grouped(const char *name, int E, const std::vector<int> &cnt, int N, int K,
		    const int *doff, const EA *X, const EA *W, ED *Y, const float *ref,
		    double flop)
{
	using Gemm = typename G::Gemm;
	using SA = typename Gemm::GemmKernel::InternalStrideA;
	using SB = typename Gemm::GemmKernel::InternalStrideB;
	using SD = typename Gemm::GemmKernel::InternalStrideD;
	ProblemShape::UnderlyingProblemShape *ps;
	const EA **pa, **pb;
	ED **pd;
	SA *sa;
	SB *sb;
	SD *sd;
	CK(cudaMalloc(&ps, E * sizeof *ps));
	CK(cudaMalloc(&pa, E * sizeof *pa));
	CK(cudaMalloc(&pb, E * sizeof *pb));
	CK(cudaMalloc(&pd, E * sizeof *pd));
	CK(cudaMalloc(&sa, E * sizeof *sa));
	CK(cudaMalloc(&sb, E * sizeof *sb));
	CK(cudaMalloc(&sd, E * sizeof *sd));
	cutlass::KernelHardwareInfo hw;
	hw.device_id = 0;
	hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
	typename Gemm::Arguments args;
	auto fa = probe_epilogue_args<Gemm>();
	args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
					{E, ps, nullptr},
					mainloop_args<Gemm>(pa, sa, pb, sb, K),
					{fa, (const ED **)pd, sd, pd, sd},
					hw};
	Gemm gemm;
	void *wsp;
	if (!probe_init(gemm, args, &wsp, name, N, K))
		return;
	CK(cudaMemset(Y, 0, (size_t)(65536 + 128) * N * 2));
	float ms = 0;
	double host = 0;
	int bad = 0;
	timed(
		[&] {
			groups<SA, SB, SD><<<(E + 63) / 64, 64>>>(doff, E, N, K, X, W, Y, ps, pa, pb,
								  pd, sa, sb, sd);
			bad |= gemm.run() != cutlass::Status::kSuccess;
		},
		&ms, &host);
	if (bad) {
		printf("%s: run failed\n", name);
		return;
	}
	std::vector<uint16_t> yb((size_t)65536 * N);
	std::vector<float> y((size_t)65536 * N), r((size_t)65536 * N);
	CK(cudaMemcpy(yb.data(), Y, yb.size() * 2, cudaMemcpyDeviceToHost));
	for (size_t i = 0; i < y.size(); i++) { uint32_t u = (uint32_t)yb[i] << 16; memcpy(&y[i], &u, 4); }
	CK(cudaMemcpy(r.data(), ref, r.size() * 4, cudaMemcpyDeviceToHost));
	double md = 0, mm = 0;
	for (size_t i = 0; i < y.size(); i++) {
		md = fmax(md, fabs((double)y[i] - r[i]));
		mm = fmax(mm, fabs((double)r[i]));
	}
	/* bit for bit against the product's first configuration */
	size_t nd = 0;
	if (first_out.empty())
		first_out = yb;
	else
		for (size_t i = 0; i < yb.size(); i++)
			nd += yb[i] != first_out[i];
	printf("%-34s N %4d K %4d: %.3f ms, %.0f TFLOP/s, host %.1f us a call, max |diff| / max "
	       "%.2e, %zu outputs differ from the first\n",
	       name, N, K, ms, flop / (ms * 1e-3) / 1e12, host, md / mm, nd);
	cudaFree(ps), cudaFree(pa), cudaFree(pb), cudaFree(pd), cudaFree(sa), cudaFree(sb);
	cudaFree(sd), cudaFree(wsp);
	(void)cnt;
}

static void one_product(const std::vector<int> &cnt, int N, int K, const char *what)
{
	int E = (int)cnt.size();
	std::vector<int> off(E + 1, 0);
	for (int e = 0; e < E; e++)
		off[e + 1] = off[e] + cnt[e];
	size_t rows = (size_t)off[E] + 128;
	EA *X, *W;
	ED *Y;
	float *R;
	int *doff;
	CK(cudaMalloc(&X, rows * K * 2));
	CK(cudaMalloc(&W, (size_t)E * N * K * 2));
	CK(cudaMalloc(&Y, rows * N * 4));
	CK(cudaMalloc(&R, rows * N * 4));
	CK(cudaMalloc(&doff, (E + 1) * 4));
	CK(cudaMemcpy(doff, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice));
	probe_fill<<<1024, 256>>>((__nv_bfloat16 *)X, rows * K, 1);
	probe_fill<<<1024, 256>>>((__nv_bfloat16 *)W, (size_t)E * N * K, 2);
	double flop = 2.0 * off[E] * N * K;
	first_out.clear();
	/* the trainer's loop: one cublasGemmEx per expert, rows rounded up to
	 * 128 (the last expert's into the slack), in expert order */
	cublasHandle_t h;
	cublasCreate(&h);
	float al = 1, be = 0, ms = 0;
	double host = 0;
	timed(
		[&] {
			for (int e = 0; e < E; e++) {
				int m = (cnt[e] + 127) / 128 * 128;
				if (!cnt[e])
					continue;
				cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, m, K, &al,
					     W + (size_t)e * N * K, CUDA_R_16BF, K,
					     X + (size_t)off[e] * K, CUDA_R_16BF, K, &be,
					     R + (size_t)off[e] * N, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
					     CUBLAS_GEMM_DEFAULT);
			}
		},
		&ms, &host);
	printf("%s\n%-34s N %4d K %4d: %.3f ms, %.0f TFLOP/s, host %.1f us a call\n", what,
	       "cublasGemmEx per expert", N, K, ms, flop / (ms * 1e-3) / 1e12, host);
	grouped<C1>("coop 128x256 1x1", E, cnt, N, K, doff, X, W, Y, R, flop);
	grouped<C1T>("coop 128x256 1x1, tail steps cut", E, cnt, N, K, doff, X, W, Y, R, flop);
	grouped<C1TE64>("  the same, epilogue 128x64", E, cnt, N, K, doff, X, W, Y, R, flop);
	grouped<C1TE128>("  the same, epilogue 128x128", E, cnt, N, K, doff, X, W, Y, R, flop);
	grouped<C1TNS>("  the same, epilogue without smem", E, cnt, N, K, doff, X, W, Y, R, flop);
	grouped<C1>("coop 128x256 1x1 (again)", E, cnt, N, K, doff, X, W, Y, R, flop);
	if (getenv("CGP_NEW_ONLY"))
		goto done;
	grouped<C2>("coop 128x256 2x1", E, cnt, N, K, doff, X, W, Y, R, flop);
	grouped<C3>("coop 256x128 1x1", E, cnt, N, K, doff, X, W, Y, R, flop);
	grouped<C4>("coop 256x128 1x2", E, cnt, N, K, doff, X, W, Y, R, flop);
	grouped<P1>("ping 128x128 1x1", E, cnt, N, K, doff, X, W, Y, R, flop);
	grouped<P2>("ping 64x256 1x1", E, cnt, N, K, doff, X, W, Y, R, flop);
	grouped<P3>("ping 128x128 2x1", E, cnt, N, K, doff, X, W, Y, R, flop);
done:
	cublasDestroy(h);
	cudaFree(X), cudaFree(W), cudaFree(Y), cudaFree(R), cudaFree(doff);
}

int main(void)
{
	/* the bench's routing: 8192 tokens, top-8 of 64, uniform: counts near
	 * 1024; and a skewed one (expert e drawn with weight 16 + e), with an
	 * expert left empty */
	for (int skew = 0; skew < 2; skew++) {
		std::vector<int> cnt(64, 0);
		unsigned long long x = 12345;
		double wsum = 0;
		for (int e = 0; e < 64; e++)
			wsum += skew ? 16 + e : 1;
		for (int i = 0; i < 65536; i++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			double u = (double)(x >> 11) / 9007199254740992.0 * wsum, c = 0;
			int e = 0;
			for (; e < 63; e++) {
				c += skew ? 16 + e : 1;
				if (u < c)
					break;
			}
			cnt[e]++;
		}
		if (skew) {
			cnt[1] += cnt[0];
			cnt[0] = 0;
		}
		const char *r = skew ? "skewed routing (weight 16 + e, expert 0 empty)" : "uniform routing";
		static const int nk[4][2] = {{1536, 2064}, {2048, 784}, {768, 2064}, {2048, 1552}};
		static const char *nm[4] = {"gate/up forward", "down forward", "down backward (dX)",
					    "gate/up backward (dX)"};
		for (int p = 0; p < 4; p++) {
			char what[160];
			snprintf(what, sizeof what, "== %s, %s", r, nm[p]);
			one_product(cnt, nk[p][0], nk[p][1], what);
		}
	}
	return 0;
}
