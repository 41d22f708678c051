/*
 * sdpa_graph.hpp: the cuDNN frontend graphs of the trainer's causal SDPA
 * (forward with its log-sum-exp, backward), built here once so that
 * kernels/sdpa.cpp plans them and tools/bench/sdpa_plans_probe.cpp times
 * every plan cuDNN offers for the very same graphs.
 *
 * Host C++ only, included where MS_HAVE_CUDNN_FE is set after
 * cudnn_frontend.h and flash.h (struct ms_flash_shape).
 */
#ifndef MS_SDPA_GRAPH_HPP
#define MS_SDPA_GRAPH_HPP

#include <stdint.h>

#include <memory>

namespace ms_sdpa_graph {

namespace fe = cudnn_frontend;

/* tensor uids of the two graphs' variant packs */
enum { U_Q = 1, U_K, U_V, U_O, U_LSE, U_DO, U_DQ, U_DK, U_DV };

typedef std::shared_ptr<fe::graph::Tensor_attributes> tensor_t;

/* a [B, heads, S, hd] view of a token-major bf16 matrix [B*S, heads*hd]:
 * element (b, h, s, d) at ((b * S + s) * heads + h) * hd + d */
static inline tensor_t view(const struct ms_flash_shape *sh, uint32_t heads)
{
	int64_t B = sh->B, S = sh->S, hd = sh->hd, n = heads;
	return std::make_shared<fe::graph::Tensor_attributes>(
		fe::graph::Tensor_attributes()
			.set_dim({B, n, S, hd})
			.set_stride({S * n * hd, hd, n * hd, 1})
			.set_data_type(fe::DataType_t::BFLOAT16));
}

static inline tensor_t input(fe::graph::Graph &g, tensor_t t, const char *name, int64_t uid)
{
	t->set_name(name).set_uid(uid);
	return g.tensor(*t);
}

static inline void output(tensor_t t, tensor_t like, int64_t uid)
{
	t->set_output(true).set_uid(uid).set_dim(like->get_dim()).set_stride(like->get_stride());
}

static inline void io_types(fe::graph::Graph &g)
{
	g.set_io_data_type(fe::DataType_t::BFLOAT16)
		.set_intermediate_data_type(fe::DataType_t::FLOAT)
		.set_compute_data_type(fe::DataType_t::FLOAT);
}

/* the forward's log-sum-exp, float [B, nh, S] */
static inline tensor_t lse_view(fe::graph::Graph &g, const struct ms_flash_shape *sh)
{
	int64_t B = sh->B, S = sh->S, nh = sh->nh;
	return g.tensor(fe::graph::Tensor_attributes()
				.set_name("lse")
				.set_uid(U_LSE)
				.set_dim({B, nh, S, 1})
				.set_stride({nh * S, S, 1, 1})
				.set_data_type(fe::DataType_t::FLOAT));
}

static inline float attn_scale(const struct ms_flash_shape *sh)
{
	return (float)(1.0 / __builtin_sqrt((double)sh->hd));
}

/* the forward into g: O (bf16, Q's layout) and the float log-sum-exp
 * [B, nh, S] the backward takes */
static inline void forward(fe::graph::Graph &g, const struct ms_flash_shape *sh)
{
	io_types(g);
	auto o = fe::graph::SDPA_attributes()
			 .set_name("sdpa")
			 .set_generate_stats(true)
			 .set_causal_mask(true)
			 .set_attn_scale(attn_scale(sh));
	auto [O, L] = g.sdpa(input(g, view(sh, sh->nh), "q", U_Q),
			     input(g, view(sh, sh->nkv), "k", U_K),
			     input(g, view(sh, sh->nkv), "v", U_V), o);
	output(O, view(sh, sh->nh), U_O);
	L->set_output(true).set_uid(U_LSE).set_data_type(fe::DataType_t::FLOAT);
}

/* the backward into g: dQ, dK, dV (bf16) from Q, K, V, O, dO and the
 * log-sum-exp; deterministic: cuDNN's algorithm without atomics, the
 * same bits on every run (what the trainer asks for) */
static inline void backward(fe::graph::Graph &g, const struct ms_flash_shape *sh,
			    bool deterministic)
{
	io_types(g);
	auto o = fe::graph::SDPA_backward_attributes()
			 .set_name("sdpa_backward")
			 .set_causal_mask(true)
			 .set_attn_scale(attn_scale(sh))
			 .set_deterministic_algorithm(deterministic);
	auto [dQ, dK, dV] = g.sdpa_backward(
		input(g, view(sh, sh->nh), "q", U_Q), input(g, view(sh, sh->nkv), "k", U_K),
		input(g, view(sh, sh->nkv), "v", U_V), input(g, view(sh, sh->nh), "o", U_O),
		input(g, view(sh, sh->nh), "do", U_DO), lse_view(g, sh), o);
	output(dQ, view(sh, sh->nh), U_DQ);
	output(dK, view(sh, sh->nkv), U_DK);
	output(dV, view(sh, sh->nkv), U_DV);
}

} /* namespace ms_sdpa_graph */

#endif
