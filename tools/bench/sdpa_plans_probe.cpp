/*
 * sdpa_plans_probe.cpp: every execution plan cuDNN offers for the trainer's
 * causal SDPA at the bench shape, each timed, and each backward checked for
 * run-to-run identity and against the deterministic list's first plan
 * (heuristics A's first, which the list leads: the plan kernels/sdpa.cpp
 * builds; the probe prints its engine and knob to compare).
 *
 * Why: the cuDNN backward is the step's largest kernel after the expert
 * GEMMs (about 10 ms of 98), at about 340 TFLOP/s alone. sdpa.cpp builds
 * the first plan heuristics A names; whether another engine or another
 * knob setting of the same engine runs faster, and still gives the same
 * bits on every run (the trainer's resident and on-demand runs must agree
 * bit for bit), is what this measures.
 *
 * The graphs are sdpa.cpp's own (kernels/sdpa_graph.hpp).
 * Build (host C++, the frontend's dynamic loading, as the Makefile builds
 * sdpa.cpp):
 *   g++ -std=c++17 -O1 -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING -Isrc -Ikernels \
 *     -isystem $CUDA_HOME/include -isystem .deps/cudnn-frontend-1.32.0/include \
 *     -o sdpa_plans tools/bench/sdpa_plans_probe.cpp -L$CUDA_HOME/lib64 -lcudart -ldl
 * Run: ./sdpa_plans [B S heads kv_heads hd] (default 4 2048 16 4 128).
 * SDPA_KNOBS=1 also walks each knob of the chosen backward engine over its
 * range (up to 64 values), one knob at a time from the chosen setting;
 * SDPA_KNOB_FROM=v starts each walk at v.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

extern "C" {
#include "common.h"
}
#include "flash.h"
#include "sdpa_graph.hpp"

namespace fe = cudnn_frontend;
namespace cudnn_frontend {
void *cudnn_dlhandle;
}

#define CK(x)                                                                          \
	do {                                                                           \
		cudaError_t e_ = (x);                                                  \
		if (e_ != cudaSuccess) {                                               \
			fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,             \
				cudaGetErrorString(e_));                               \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

using namespace ms_sdpa_graph;

static int64_t B = 4, S = 2048, NH = 16, NKV = 4, HD = 128;
static struct ms_flash_shape SH;

/* sdpa.cpp's graphs (sdpa_graph.hpp), each in a graph of its own */
static std::unique_ptr<fe::graph::Graph> fwd_graph()
{
	auto g = std::make_unique<fe::graph::Graph>();
	forward(*g, &SH);
	return g;
}

static std::unique_ptr<fe::graph::Graph> bwd_graph(bool det)
{
	auto g = std::make_unique<fe::graph::Graph>();
	backward(*g, &SH, det);
	return g;
}

static bool ok(fe::error_t st, const char *what)
{
	if (st.is_good())
		return true;
	printf("    %s: %s\n", what, st.get_message().c_str());
	return false;
}

struct bufs {
	void *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
	size_t nq, nk;
};

static std::unordered_map<int64_t, void *> pack(const bufs &b, bool bwd)
{
	std::unordered_map<int64_t, void *> p = {
		{U_Q, b.q}, {U_K, b.k}, {U_V, b.v}, {U_O, b.o}, {U_LSE, b.lse}};
	if (bwd) {
		p[U_DO] = b.dout;
		p[U_DQ] = b.dq;
		p[U_DK] = b.dk;
		p[U_DV] = b.dv;
	}
	return p;
}

/* median ms of n runs of plan i (a warm-up first); -1 when it fails */
static double time_plan(fe::graph::Graph &g, cudnnHandle_t h, int64_t i,
			std::unordered_map<int64_t, void *> &p, int n)
{
	int64_t ws = 0;
	if (!ok(g.get_workspace_size_plan_at_index(i, ws), "workspace"))
		return -1;
	void *w = NULL;
	if (ws && cudaMalloc(&w, ws) != cudaSuccess)
		return -1;
	cudaEvent_t a, z;
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&z));
	std::vector<float> t;
	bool good = ok(g.execute_plan_at_index(h, p, w, i), "warm-up");
	CK(cudaDeviceSynchronize());
	for (int r = 0; good && r < n; r++) {
		CK(cudaEventRecord(a));
		good = ok(g.execute_plan_at_index(h, p, w, i), "run");
		CK(cudaEventRecord(z));
		CK(cudaEventSynchronize(z));
		float ms;
		CK(cudaEventElapsedTime(&ms, a, z));
		t.push_back(ms);
	}
	cudaEventDestroy(a);
	cudaEventDestroy(z);
	if (w)
		cudaFree(w);
	if (!good)
		return -1;
	std::sort(t.begin(), t.end());
	return t[t.size() / 2];
}

static std::vector<uint16_t> host(void *d, size_t n)
{
	std::vector<uint16_t> h(n);
	CK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
	return h;
}

static std::string plan_desc(fe::graph::Graph &g, int64_t i)
{
	std::string name;
	(void)g.get_plan_name_at_index(i, name);
	int64_t eng = -1;
	std::unordered_map<fe::KnobType_t, int64_t> kn;
	std::string s = name;
	if (g.get_engine_and_knobs_at_index(i, eng, kn).is_good()) {
		s += " [engine " + std::to_string(eng);
		for (auto &k : kn)
			s += " k" + std::to_string((int64_t)k.first) + "=" + std::to_string(k.second);
		s += "]";
	}
	return s;
}

/* the backward's outputs of plan i of g, run once with a fresh workspace */
static bool run_bwd(fe::graph::Graph &g, cudnnHandle_t h, int64_t i, const bufs &b,
		    std::vector<uint16_t> out[3])
{
	auto p = pack(b, true);
	int64_t ws = 0;
	(void)g.get_workspace_size_plan_at_index(i, ws);
	void *w = NULL;
	if (ws)
		CK(cudaMalloc(&w, ws));
	CK(cudaMemset(b.dq, 0, b.nq * 2));
	CK(cudaMemset(b.dk, 0, b.nk * 2));
	CK(cudaMemset(b.dv, 0, b.nk * 2));
	bool good = ok(g.execute_plan_at_index(h, p, w, i), "run");
	CK(cudaDeviceSynchronize());
	if (w)
		cudaFree(w);
	out[0] = host(b.dq, b.nq);
	out[1] = host(b.dk, b.nk);
	out[2] = host(b.dv, b.nk);
	return good;
}

static float bf(uint16_t x)
{
	uint32_t u = (uint32_t)x << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static void compare(const char *what, std::vector<uint16_t> *a, std::vector<uint16_t> *r)
{
	size_t diff = 0;
	double mx = 0;
	for (int t = 0; t < 3; t++)
		for (size_t j = 0; j < a[t].size(); j++)
			if (a[t][j] != r[t][j]) {
				diff++;
				mx = fmax(mx, fabs((double)bf(a[t][j]) - bf(r[t][j])));
			}
	printf("      %s: %zu values differ (max |diff| %.3g)\n", what, diff, mx);
}

int main(int argc, char **argv)
{
	if (argc == 6) {
		B = atoll(argv[1]), S = atoll(argv[2]), NH = atoll(argv[3]);
		NKV = atoll(argv[4]), HD = atoll(argv[5]);
	}
	SH.B = (uint32_t)B, SH.S = (uint32_t)S, SH.nh = (uint32_t)NH, SH.nkv = (uint32_t)NKV;
	SH.hd = (uint32_t)HD;
	void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "libcudnn.so.9: %s\n", dlerror());
		return 1;
	}
	fe::cudnn_dlhandle = lib;
	cudnnHandle_t h;
	if (fe::detail::create_handle(&h) != CUDNN_STATUS_SUCCESS) {
		fprintf(stderr, "cudnnCreate failed\n");
		return 1;
	}
	printf("cuDNN %lld, B %lld S %lld heads %lld/%lld hd %lld\n",
	       (long long)fe::detail::get_backend_version(), (long long)B, (long long)S,
	       (long long)NH, (long long)NKV, (long long)HD);

	bufs b;
	b.nq = (size_t)B * S * NH * HD, b.nk = (size_t)B * S * NKV * HD;
	void **all[] = {&b.q, &b.k, &b.v, &b.o, &b.dout, &b.dq, &b.dk, &b.dv};
	size_t sz[] = {b.nq, b.nk, b.nk, b.nq, b.nq, b.nq, b.nk, b.nk};
	for (int i = 0; i < 8; i++) {
		CK(cudaMalloc(all[i], sz[i] * 2));
		std::vector<uint16_t> v(sz[i]);
		uint64_t s = 0x9e3779b97f4a7c15ull * (i + 1);
		for (auto &x : v) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			float f = ((double)(s >> 11) / 9007199254740992.0 - 0.5) * 2.0;
			uint32_t u;
			memcpy(&u, &f, 4);
			x = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
		}
		CK(cudaMemcpy(*all[i], v.data(), sz[i] * 2, cudaMemcpyHostToDevice));
	}
	CK(cudaMalloc(&b.lse, (size_t)B * NH * S * 4));

	/* causal attention, the bench's count: 4 B S^2 heads hd / 2 forward,
	 * 2.5 times that backward */
	double ff = 4.0 * B * S * S * NH * HD / 2, fb = 2.5 * ff;

	std::vector<fe::HeurMode_t> modes = {fe::HeurMode_t::A, fe::HeurMode_t::B,
					     fe::HeurMode_t::FALLBACK};
	/* forward: every plan, timed; the first (sdpa.cpp's) fills O and LSE */
	{
		auto g = fwd_graph();
		if (!ok(g->validate(), "fwd validate") || !ok(g->build_operation_graph(h), "fwd op graph") ||
		    !ok(g->create_execution_plans(modes), "fwd heuristics") ||
		    !ok(g->check_support(h), "fwd support") ||
		    !ok(g->build_plans(h, fe::BuildPlanPolicy_t::ALL), "fwd plans"))
			return 1;
		auto p = pack(b, false);
		int64_t n = g->get_execution_plan_count();
		printf("forward: %lld plans\n", (long long)n);
		for (int64_t i = n - 1; i >= 0; i--) {
			double ms = time_plan(*g, h, i, p, 20);
			printf("  %lld %-60s %8.4f ms %6.1f TFLOP/s\n", (long long)i,
			       plan_desc(*g, i).c_str(), ms, ms > 0 ? ff / ms / 1e9 : 0.0);
		}
	}
	/* backward: deterministic, then not, every plan of each */
	std::vector<uint16_t> ref[3];
	int64_t ref_engine = -1;
	std::unordered_map<fe::KnobType_t, int64_t> ref_knobs;
	for (int det = 1; det >= 0; det--) {
		auto g = bwd_graph(det);
		if (!ok(g->validate(), "bwd validate") || !ok(g->build_operation_graph(h), "bwd op graph") ||
		    !ok(g->create_execution_plans(modes), "bwd heuristics") ||
		    !ok(g->check_support(h), "bwd support") ||
		    !ok(g->build_plans(h, fe::BuildPlanPolicy_t::ALL), "bwd plans"))
			continue;
		auto p = pack(b, true);
		int64_t n = g->get_execution_plan_count();
		printf("backward, deterministic %d: %lld plans\n", det, (long long)n);
		for (int64_t i = 0; i < n; i++) {
			int64_t ws = 0;
			(void)g->get_workspace_size_plan_at_index(i, ws);
			double ms = time_plan(*g, h, i, p, 20);
			printf("  %lld %-60s ws %10lld %8.4f ms %6.1f TFLOP/s\n", (long long)i,
			       plan_desc(*g, i).c_str(), (long long)ws, ms,
			       ms > 0 ? fb / ms / 1e9 : 0.0);
			if (ms < 0)
				continue;
			std::vector<uint16_t> o1[3], o2[3];
			run_bwd(*g, h, i, b, o1);
			run_bwd(*g, h, i, b, o2);
			compare("run against run", o1, o2);
			if (det && i == 0) {
				for (int t = 0; t < 3; t++)
					ref[t] = o1[t];
				(void)g->get_engine_and_knobs_at_index(0, ref_engine, ref_knobs);
			} else if (ref[0].size()) {
				compare("against sdpa.cpp's plan", o1, ref);
			}
		}
	}
	if (!getenv("SDPA_KNOBS") || ref_engine < 0)
		return 0;
	/* the chosen backward engine, one knob at a time over its range */
	auto g0 = bwd_graph(true);
	(void)g0->validate();
	(void)g0->build_operation_graph(h);
	std::vector<fe::Knob> knobs;
	if (!ok(g0->get_knobs_for_engine(ref_engine, knobs), "knobs"))
		return 0;
	printf("engine %lld knobs:", (long long)ref_engine);
	for (auto &k : knobs)
		printf(" k%lld [%lld..%lld by %lld]", (long long)k.type, (long long)k.minValue,
		       (long long)k.maxValue, (long long)k.stride);
	printf("\n");
	for (auto &k : knobs) {
		int64_t st = k.stride > 0 ? k.stride : 1;
		int count = 0;
		int64_t from = getenv("SDPA_KNOB_FROM") ? atoll(getenv("SDPA_KNOB_FROM")) : k.minValue;
		for (int64_t v = from > k.minValue ? from : k.minValue; v <= k.maxValue && count < 64;
		     v += st, count++) {
			auto kv = ref_knobs;
			if (kv.count(k.type) && kv[k.type] == v)
				continue;
			kv[k.type] = v;
			auto g = bwd_graph(true);
			std::string d = "k" + std::to_string((int64_t)k.type) + "=" + std::to_string(v);
			if (!g->validate().is_good() || !g->build_operation_graph(h).is_good() ||
			    !g->create_execution_plan(ref_engine, kv).is_good() ||
			    !g->check_support(h).is_good() ||
			    !g->build_plans(h, fe::BuildPlanPolicy_t::ALL).is_good() ||
			    g->get_execution_plan_count() < 1) {
				printf("  %-12s not supported\n", d.c_str());
				continue;
			}
			auto p = pack(b, true);
			double ms = time_plan(*g, h, 0, p, 20);
			printf("  %-12s %8.4f ms %6.1f TFLOP/s\n", d.c_str(), ms,
			       ms > 0 ? fb / ms / 1e9 : 0.0);
			if (ms > 0) {
				std::vector<uint16_t> o1[3], o2[3];
				run_bwd(*g, h, 0, b, o1);
				run_bwd(*g, h, 0, b, o2);
				compare("run against run", o1, o2);
				compare("against sdpa.cpp's plan", o1, ref);
			}
		}
	}
	return 0;
}
