/*
 * t_names.c: tensor name parsing. Every name of every bundled fixture is
 * parsed and checked against facts read off the name with plain string
 * scanning (layer after "layers.", expert after "experts.", role from the
 * suffix); hand-written names of each family are checked field by field.
 */
#include <dirent.h>
#include <sys/stat.h>

#include "test.h"
#include "names.h"

struct want {
	const char *name;
	int32_t layer, expert;
	enum ms_name_part part;
	enum ms_name_role role;
	const char *proj;
	int32_t nesting;
	const char *module; /* expected name[0, module_len) */
	const char *str;    /* expected ms_name_info_str */
};

#define P(x) MS_NAME_PART_##x
#define R(x) MS_NAME_ROLE_##x

static const struct want wants[] = {
	{ "model.layers.3.mlp.experts.7.down_proj.weight", 3, 7, P(EXPERT), R(WEIGHT),
	  "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj weight" },
	{ "model.layers.0.block_sparse_moe.experts.7.w1.weight", 0, 7, P(EXPERT), R(WEIGHT),
	  "w1", -1, "model.layers.0.block_sparse_moe.experts.7.w1",
	  "layer 0 expert 7 w1 weight" },
	{ "model.layers.12.block_sparse_moe.experts.0.w3.weight", 12, 0, P(EXPERT), R(WEIGHT),
	  "w3", -1, "model.layers.12.block_sparse_moe.experts.0.w3",
	  "layer 12 expert 0 w3 weight" },
	{ "model.layers.1.mlp.shared_expert.gate_proj.weight", 1, -1, P(SHARED_EXPERT),
	  R(WEIGHT), "gate_proj", -1, "model.layers.1.mlp.shared_expert.gate_proj",
	  "layer 1 shared_expert gate_proj weight" },
	{ "model.layers.4.mlp.shared_experts.down_proj.weight", 4, -1, P(SHARED_EXPERT),
	  R(WEIGHT), "down_proj", -1, "model.layers.4.mlp.shared_experts.down_proj",
	  "layer 4 shared_expert down_proj weight" },
	{ "model.layers.0.mlp.gate.weight", 0, -1, P(ROUTER), R(WEIGHT), "gate", -1,
	  "model.layers.0.mlp.gate", "layer 0 router gate weight" },
	{ "model.layers.2.block_sparse_moe.gate.weight", 2, -1, P(ROUTER), R(WEIGHT), "gate",
	  -1, "model.layers.2.block_sparse_moe.gate", "layer 2 router gate weight" },
	{ "model.layers.0.mlp.shared_expert_gate.weight", 0, -1, P(ROUTER), R(WEIGHT),
	  "shared_expert_gate", -1, "model.layers.0.mlp.shared_expert_gate",
	  "layer 0 router shared_expert_gate weight" },
	{ "model.layers.3.mlp.gate.e_score_correction_bias", 3, -1, P(ROUTER), R(BIAS),
	  "gate", -1, "model.layers.3.mlp.gate", "layer 3 router gate bias" },
	{ "model.layers.5.mlp.router.weight", 5, -1, P(ROUTER), R(WEIGHT), "router", -1,
	  "model.layers.5.mlp.router", "layer 5 router weight" },
	{ "model.layers.0.mlp.experts.gate_up_proj", 0, -1, P(EXPERTS_FUSED), R(WEIGHT),
	  "gate_up_proj", -1, "model.layers.0.mlp.experts.gate_up_proj",
	  "layer 0 experts gate_up_proj weight" },
	{ "model.layers.1.mlp.experts.down_proj", 1, -1, P(EXPERTS_FUSED), R(WEIGHT),
	  "down_proj", -1, "model.layers.1.mlp.experts.down_proj",
	  "layer 1 experts down_proj weight" },
	{ "model.layers.1.mlp.experts.gate_up_proj_bias", 1, -1, P(EXPERTS_FUSED), R(BIAS),
	  "gate_up_proj", -1, "model.layers.1.mlp.experts.gate_up_proj",
	  "layer 1 experts gate_up_proj bias" },
	{ "model.layers.1.mlp.experts.down_proj_blocks", 1, -1, P(EXPERTS_FUSED), R(WEIGHT),
	  "down_proj", -1, "model.layers.1.mlp.experts.down_proj",
	  "layer 1 experts down_proj weight packed" },
	{ "model.layers.1.mlp.experts.down_proj_scales", 1, -1, P(EXPERTS_FUSED), R(SCALE),
	  "down_proj", -1, "model.layers.1.mlp.experts.down_proj",
	  "layer 1 experts down_proj scale" },
	{ "model.layers.2.mlp.experts.w13_weight_scale_2", 2, -1, P(EXPERTS_FUSED), R(SCALE2),
	  "w13", -1, "model.layers.2.mlp.experts.w13", "layer 2 experts w13 scale_2" },
	{ "base_model.model.model.layers.0.mlp.experts.lora_A.weight", 0, -1,
	  P(EXPERTS_FUSED), R(LORA_A), "", 0, "base_model.model.model.layers.0.mlp.experts",
	  "layer 0 experts lora_A nesting 0" },
	{ "base_model.model.model.layers.1.mlp.experts.base_layer.lora_B.weight", 1, -1,
	  P(EXPERTS_FUSED), R(LORA_B), "", 1,
	  "base_model.model.model.layers.1.mlp.experts.base_layer",
	  "layer 1 experts lora_B nesting 1" },
	{ "base_model.model.model.layers.1.mlp.experts.base_layer.base_layer.lora_A.weight",
	  1, -1, P(EXPERTS_FUSED), R(LORA_A), "", 2,
	  "base_model.model.model.layers.1.mlp.experts.base_layer.base_layer",
	  "layer 1 experts lora_A nesting 2" },
	{ "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", 0, -1, P(ATTN),
	  R(LORA_A), "q_proj", 0, "base_model.model.model.layers.0.self_attn.q_proj",
	  "layer 0 attn q_proj lora_A" },
	{ "base_model.model.model.layers.0.self_attn.v_proj.lora_B.default.weight", 0, -1,
	  P(ATTN), R(LORA_B), "v_proj", 0, "base_model.model.model.layers.0.self_attn.v_proj",
	  "layer 0 attn v_proj lora_B" },
	{ "base_model.model.model.layers.2.mlp.experts.5.down_proj.lora_B.weight", 2, 5,
	  P(EXPERT), R(LORA_B), "down_proj", 0,
	  "base_model.model.model.layers.2.mlp.experts.5.down_proj",
	  "layer 2 expert 5 down_proj lora_B" },
	{ "base_model.model.model.layers.0.block_sparse_moe.experts.3.w2.lora_A.weight", 0,
	  3, P(EXPERT), R(LORA_A), "w2", 0,
	  "base_model.model.model.layers.0.block_sparse_moe.experts.3.w2",
	  "layer 0 expert 3 w2 lora_A" },
	{ "base_model.model.model.embed_tokens.lora_embedding_A", -1, -1, P(EMBED), R(LORA_A),
	  "embed_tokens", 0, "base_model.model.model.embed_tokens",
	  "embed embed_tokens lora_A" },
	{ "decoder.layers.0.mlp.experts.linear_fc1.weight0", 0, 0, P(EXPERT), R(WEIGHT),
	  "linear_fc1", -1, "decoder.layers.0.mlp.experts.linear_fc1",
	  "layer 0 expert 0 linear_fc1 weight" },
	{ "decoder.layers.7.mlp.experts.linear_fc2.weight63", 7, 63, P(EXPERT), R(WEIGHT),
	  "linear_fc2", -1, "decoder.layers.7.mlp.experts.linear_fc2",
	  "layer 7 expert 63 linear_fc2 weight" },
	{ "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight", 0, 3, P(EXPERT),
	  R(WEIGHT), "linear_fc1", -1,
	  "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1",
	  "layer 0 expert 3 linear_fc1 weight" },
	{ "decoder.layers.1.mlp.experts.weight1", 1, -1, P(EXPERTS_FUSED), R(WEIGHT),
	  "linear_fc1", -1, "decoder.layers.1.mlp.experts.weight1",
	  "layer 1 experts linear_fc1 weight" },
	{ "decoder.layers.1.mlp.experts.weight2", 1, -1, P(EXPERTS_FUSED), R(WEIGHT),
	  "linear_fc2", -1, "decoder.layers.1.mlp.experts.weight2",
	  "layer 1 experts linear_fc2 weight" },
	{ "decoder.layers.0.mlp.router.weight", 0, -1, P(ROUTER), R(WEIGHT), "router", -1,
	  "decoder.layers.0.mlp.router", "layer 0 router weight" },
	{ "decoder.layers.0.mlp.shared_experts.linear_fc1.weight", 0, -1, P(SHARED_EXPERT),
	  R(WEIGHT), "linear_fc1", -1, "decoder.layers.0.mlp.shared_experts.linear_fc1",
	  "layer 0 shared_expert linear_fc1 weight" },
	{ "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", 0, -1, P(NORM),
	  R(WEIGHT), "input_layernorm", -1, "decoder.layers.0.self_attention.linear_qkv",
	  "layer 0 norm input_layernorm weight" },
	{ "decoder.layers.0.self_attention.linear_proj.weight", 0, -1, P(ATTN), R(WEIGHT),
	  "linear_proj", -1, "decoder.layers.0.self_attention.linear_proj",
	  "layer 0 attn linear_proj weight" },
	{ "decoder.layers.0.mlp.linear_fc1.layer_norm_weight", 0, -1, P(NORM), R(WEIGHT),
	  "pre_mlp_layernorm", -1, "decoder.layers.0.mlp.linear_fc1",
	  "layer 0 norm pre_mlp_layernorm weight" },
	{ "decoder.final_layernorm.weight", -1, -1, P(NORM), R(WEIGHT), "final_layernorm", -1,
	  "decoder.final_layernorm", "norm final_layernorm weight" },
	{ "embedding.word_embeddings.weight", -1, -1, P(EMBED), R(WEIGHT), "word_embeddings",
	  -1, "embedding.word_embeddings", "embed word_embeddings weight" },
	{ "output_layer.weight", -1, -1, P(LM_HEAD), R(WEIGHT), "output_layer", -1,
	  "output_layer", "lm_head output_layer weight" },
	{ "model.layers.3.mlp.experts.7.down_proj.weight_scale", 3, 7, P(EXPERT), R(SCALE),
	  "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj scale" },
	{ "model.layers.3.mlp.experts.7.down_proj.weight_scale_2", 3, 7, P(EXPERT), R(SCALE2),
	  "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj scale_2" },
	{ "model.layers.3.mlp.experts.7.down_proj.input_scale", 3, 7, P(EXPERT),
	  R(INPUT_SCALE), "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj input_scale" },
	{ "model.layers.3.mlp.experts.7.down_proj.weight_packed", 3, 7, P(EXPERT), R(WEIGHT),
	  "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj weight packed" },
	{ "model.layers.3.mlp.experts.7.down_proj.weight_global_scale", 3, 7, P(EXPERT),
	  R(GLOBAL_SCALE), "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj global_scale" },
	{ "model.layers.3.mlp.experts.7.down_proj.input_global_scale", 3, 7, P(EXPERT),
	  R(INPUT_SCALE), "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj input_scale" },
	{ "model.layers.3.mlp.experts.7.down_proj.weight_colwise", 3, 7, P(EXPERT),
	  R(COLWISE), "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj colwise" },
	{ "model.layers.3.mlp.experts.7.down_proj.weight_colwise_scale", 3, 7, P(EXPERT),
	  R(COLWISE_SCALE), "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj colwise_scale" },
	{ "model.layers.3.mlp.experts.7.down_proj.weight_packed_colwise", 3, 7, P(EXPERT),
	  R(COLWISE), "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj colwise packed" },
	{ "model.layers.3.mlp.experts.7.down_proj.weight_scale_colwise", 3, 7, P(EXPERT),
	  R(COLWISE_SCALE), "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj colwise_scale" },
	{ "model.layers.3.mlp.experts.7.down_proj.weight_colwise_scale_2", 3, 7, P(EXPERT),
	  R(SCALE2), "down_proj", -1, "model.layers.3.mlp.experts.7.down_proj",
	  "layer 3 expert 7 down_proj scale_2 colwise" },
	{ "model.layers.0.self_attn.q_proj.weight_scale", 0, -1, P(ATTN), R(SCALE), "q_proj",
	  -1, "model.layers.0.self_attn.q_proj", "layer 0 attn q_proj scale" },
	{ "model.layers.0.self_attn.o_proj.bias", 0, -1, P(ATTN), R(BIAS), "o_proj", -1,
	  "model.layers.0.self_attn.o_proj", "layer 0 attn o_proj bias" },
	{ "model.layers.0.self_attn.k_norm.weight", 0, -1, P(NORM), R(WEIGHT), "k_norm", -1,
	  "model.layers.0.self_attn.k_norm", "layer 0 norm k_norm weight" },
	{ "model.layers.9.post_attention_layernorm.weight", 9, -1, P(NORM), R(WEIGHT),
	  "post_attention_layernorm", -1, "model.layers.9.post_attention_layernorm",
	  "layer 9 norm post_attention_layernorm weight" },
	{ "model.norm.weight", -1, -1, P(NORM), R(WEIGHT), "norm", -1, "model.norm",
	  "norm weight" },
	{ "model.embed_tokens.weight", -1, -1, P(EMBED), R(WEIGHT), "embed_tokens", -1,
	  "model.embed_tokens", "embed embed_tokens weight" },
	{ "lm_head.weight", -1, -1, P(LM_HEAD), R(WEIGHT), "lm_head", -1, "lm_head",
	  "lm_head weight" },
	{ "model.layers.0.mlp.gate_proj.weight", 0, -1, P(MLP), R(WEIGHT), "gate_proj", -1,
	  "model.layers.0.mlp.gate_proj", "layer 0 mlp gate_proj weight" },
	{ "model.rotary_emb.inv_freq", -1, -1, P(OTHER), R(OTHER), "inv_freq", -1,
	  "model.rotary_emb.inv_freq", "other inv_freq" },
	{ "bf16", -1, -1, P(OTHER), R(OTHER), "bf16", -1, "bf16", "other bf16" },
	/* a routed-expert suffix outside an experts block is not an expert */
	{ "foo.linear.weight3", -1, -1, P(OTHER), R(WEIGHT), "linear", -1, "foo.linear",
	  "other linear weight" },
	/* PEFT full-model state dicts keep base weights under base_layer */
	{ "base_model.model.model.layers.0.mlp.experts.base_layer.base_layer.gate_up_proj",
	  0, -1, P(EXPERTS_FUSED), R(WEIGHT), "gate_up_proj", -1,
	  "base_model.model.model.layers.0.mlp.experts.base_layer.base_layer.gate_up_proj",
	  "layer 0 experts gate_up_proj weight" },
	{ "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight", 0, -1,
	  P(ATTN), R(WEIGHT), "q_proj", -1,
	  "base_model.model.model.layers.0.self_attn.q_proj.base_layer",
	  "layer 0 attn q_proj weight" },
	/* numbers too large for int32 are not ids */
	{ "model.layers.99999999999.mlp.experts.3.w1.weight", -1, 3, P(EXPERT), R(WEIGHT),
	  "w1", -1, "model.layers.99999999999.mlp.experts.3.w1", "expert 3 w1 weight" },
};

static int check_want(const struct want *w)
{
	struct ms_name_info in;
	char buf[256];

	T_ASSERT_EQ_INT(ms_name_parse(w->name, &in), MS_OK);
	T_ASSERT_MSG(in.layer == w->layer, "%s: layer %d", w->name, in.layer);
	T_ASSERT_MSG(in.expert == w->expert, "%s: expert %d", w->name, in.expert);
	T_ASSERT_MSG(in.part == w->part, "%s: part %s", w->name, ms_name_part_str(in.part));
	T_ASSERT_MSG(in.role == w->role, "%s: role %s", w->name, ms_name_role_str(in.role));
	T_ASSERT_MSG(!strcmp(in.proj, w->proj), "%s: proj '%s'", w->name, in.proj);
	T_ASSERT_MSG(in.lora_nesting == w->nesting, "%s: nesting %d", w->name,
		     in.lora_nesting);
	T_ASSERT_MSG(in.module_len == strlen(w->module) &&
			     !strncmp(w->name, w->module, in.module_len),
		     "%s: module '%.*s'", w->name, (int)in.module_len, w->name);
	ms_name_info_str(&in, buf, sizeof(buf));
	T_ASSERT_STR(buf, w->str);
	return 0;
}

static int test_families(void)
{
	for (size_t i = 0; i < sizeof(wants) / sizeof(wants[0]); i++)
		if (check_want(&wants[i]))
			return 1;
	return 0;
}

static int test_peft_flag(void)
{
	struct ms_name_info in;

	T_ASSERT_EQ_INT(ms_name_parse("base_model.model.lm_head.lora_A.weight", &in), MS_OK);
	T_ASSERT_EQ_INT(in.peft, 1);
	T_ASSERT_EQ_INT(in.part, MS_NAME_PART_LM_HEAD);
	T_ASSERT_EQ_INT(ms_name_parse("model.layers.0.mlp.experts.3.w1.weight", &in), MS_OK);
	T_ASSERT_EQ_INT(in.peft, 0);
	T_ASSERT_EQ_INT(ms_name_is_routed_expert(&in), 1);
	T_ASSERT_EQ_INT(ms_name_parse("model.layers.0.mlp.shared_expert.up_proj.weight", &in),
			MS_OK);
	T_ASSERT_EQ_INT(ms_name_is_routed_expert(&in), 0);
	return 0;
}

static int test_bad_input(void)
{
	struct ms_name_info in;
	char big[MS_NAME_MAX + 2];
	char buf[8];

	T_ASSERT_EQ_INT(ms_name_parse(NULL, &in), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_name_parse("", &in), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_name_parse("x", NULL), MS_EINVAL);
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	T_ASSERT_EQ_INT(ms_name_parse(big, &in), MS_EINVAL);
	/* the longest accepted name, all separators: every component empty */
	memset(big, '.', MS_NAME_MAX);
	big[MS_NAME_MAX] = '\0';
	T_ASSERT_EQ_INT(ms_name_parse(big, &in), MS_OK);
	T_ASSERT_EQ_INT(in.part, MS_NAME_PART_OTHER);
	/* odd shapes of names never crash and never claim an expert */
	const char *odd[] = { ".", "experts", "experts.", ".experts.1", "layers.1",
			      "lora_A", "base_model.model", "a.lora_B", "x.experts.weight1",
			      "experts.1", "base_layer.lora_A.weight", "..weight" };
	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		T_ASSERT_EQ_INT(ms_name_parse(odd[i], &in), MS_OK);
		T_ASSERT(in.module_len <= strlen(odd[i]));
		T_ASSERT(ms_name_info_str(&in, buf, sizeof(buf)) > 0);
		T_ASSERT(strlen(buf) < sizeof(buf));
	}
	T_ASSERT_EQ_INT(ms_name_parse("experts.1", &in), MS_OK);
	T_ASSERT_EQ_INT(in.expert, -1);
	return 0;
}

/* ---- every fixture name ----------------------------------------------- */

/* Facts read off the name without the parser. */
static int32_t number_after(const char *name, const char *key)
{
	const char *p = name;
	size_t kl = strlen(key);

	while ((p = strstr(p, key)) != NULL) {
		if ((p == name || p[-1] == '.') && p[kl] >= '0' && p[kl] <= '9') {
			long v = strtol(p + kl, NULL, 10);
			return (int32_t)v;
		}
		p += kl;
	}
	return -1;
}

static int ends_with(const char *s, const char *suf)
{
	size_t n = strlen(s), m = strlen(suf);

	return n >= m && !strcmp(s + n - m, suf);
}

static int check_fixture_name(const char *file, const char *name, size_t *nexpert,
			      size_t *nlora)
{
	struct ms_name_info in;
	char buf[256];
	int32_t layer = number_after(name, "layers.");
	int32_t expert = number_after(name, "experts.");

	T_ASSERT_MSG(ms_name_parse(name, &in) == MS_OK, "%s: %s", file, name);
	T_ASSERT_MSG(in.layer == layer, "%s: %s: layer %d, want %d", file, name, in.layer,
		     layer);
	T_ASSERT_MSG(in.expert == expert, "%s: %s: expert %d, want %d", file, name,
		     in.expert, expert);
	if (expert >= 0) {
		T_ASSERT_MSG(in.part == MS_NAME_PART_EXPERT, "%s: %s", file, name);
		(*nexpert)++;
	}
	if (strstr(name, ".lora_A.")) {
		T_ASSERT_MSG(in.role == MS_NAME_ROLE_LORA_A, "%s: %s", file, name);
		(*nlora)++;
	} else if (strstr(name, ".lora_B.")) {
		T_ASSERT_MSG(in.role == MS_NAME_ROLE_LORA_B, "%s: %s", file, name);
		(*nlora)++;
	} else if (ends_with(name, ".weight")) {
		T_ASSERT_MSG(in.role == MS_NAME_ROLE_WEIGHT, "%s: %s", file, name);
	}
	if (strstr(name, ".lora_")) {
		int32_t nest = 0;

		for (const char *p = name; (p = strstr(p, ".base_layer.")); p++)
			nest++;
		T_ASSERT_MSG(in.lora_nesting == nest, "%s: %s: nesting %d", file, name,
			     in.lora_nesting);
		if (strstr(name, ".experts.lora_") || strstr(name, ".experts.base_layer.lora_"))
			T_ASSERT_MSG(in.part == MS_NAME_PART_EXPERTS_FUSED && !in.proj[0],
				     "%s: %s", file, name);
	} else {
		T_ASSERT_MSG(in.lora_nesting == -1, "%s: %s", file, name);
	}
	if (strstr(name, "self_attn.") && strstr(name, "_proj."))
		T_ASSERT_MSG(in.part == MS_NAME_PART_ATTN, "%s: %s", file, name);
	if (strstr(name, "norm."))
		T_ASSERT_MSG(in.part == MS_NAME_PART_NORM, "%s: %s", file, name);
	if (strstr(name, "embed_tokens."))
		T_ASSERT_MSG(in.part == MS_NAME_PART_EMBED, "%s: %s", file, name);
	if (!strncmp(name, "lm_head.", 8))
		T_ASSERT_MSG(in.part == MS_NAME_PART_LM_HEAD, "%s: %s", file, name);
	if (ends_with(name, "mlp.gate.weight") || ends_with(name, "moe.gate.weight"))
		T_ASSERT_MSG(in.part == MS_NAME_PART_ROUTER, "%s: %s", file, name);
	if (!strchr(name, '.'))
		T_ASSERT_MSG(in.part == MS_NAME_PART_OTHER, "%s: %s", file, name);
	/* the proj of an expert is the component after its id */
	if (expert >= 0) {
		const char *p = strstr(name, "experts.");

		p = strchr(p + 8, '.') + 1;
		T_ASSERT_MSG(!strncmp(p, in.proj, strlen(in.proj)) &&
				     p[strlen(in.proj)] == '.',
			     "%s: %s: proj '%s'", file, name, in.proj);
	}
	T_ASSERT(in.module_len <= strlen(name));
	T_ASSERT(name[in.module_len] == '\0' || name[in.module_len] == '.');
	T_ASSERT(ms_name_info_str(&in, buf, sizeof(buf)) > 0);
	return 0;
}

static int walk(const char *dir, size_t *nfiles, size_t *nnames, size_t *nexpert,
		size_t *nlora)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int fail = 0;

	T_ASSERT_MSG(d != NULL, "cannot open %s", dir);
	while (!fail && (de = readdir(d))) {
		char *path;
		struct stat st;

		if (de->d_name[0] == '.')
			continue;
		path = ms_path_join(dir, de->d_name);
		T_ASSERT(path);
		if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
			fail = walk(path, nfiles, nnames, nexpert, nlora);
		} else if (ends_with(de->d_name, ".safetensors") &&
			   strcmp(de->d_name, "peft_delta_truth.safetensors")) {
			/* (truth files are keyed "<module>::<parameter>", not by
			 * tensor names) */
			struct ms_st_file *f;
			struct ms_err err = { 0 };

			/* invalid-on-purpose fixtures are the reader's business */
			if (ms_st_open(path, &f, &err) == MS_OK) {
				(*nfiles)++;
				for (size_t i = 0; i < f->ntensors && !fail; i++) {
					fail = check_fixture_name(path, f->tensors[i].name,
								  nexpert, nlora);
					(*nnames)++;
				}
				ms_st_close(f);
			}
		}
		ms_free(path);
	}
	closedir(d);
	return fail;
}

static int test_every_fixture_name(void)
{
	size_t nfiles = 0, nnames = 0, nexpert = 0, nlora = 0;

	T_ASSERT_EQ_INT(walk(T_FIXTURES, &nfiles, &nnames, &nexpert, &nlora), 0);
	/* the bundled fixtures hold MoE checkpoints and LoRA adapters: make
	 * sure the walk really saw them */
	T_ASSERT(nfiles >= 10);
	T_ASSERT(nexpert >= 100);
	T_ASSERT(nlora >= 16);
	return 0;
}

static int test_info_str_truncates(void)
{
	struct ms_name_info in;
	char buf[10];
	int need;

	T_ASSERT_EQ_INT(ms_name_parse("model.layers.3.mlp.experts.7.down_proj.weight", &in),
			MS_OK);
	need = ms_name_info_str(&in, buf, sizeof(buf));
	T_ASSERT_EQ_INT(need, (int)strlen("layer 3 expert 7 down_proj weight"));
	T_ASSERT_STR(buf, "layer 3 e");
	return 0;
}

/* quant.c names the NVFP4 companions it writes with ms_name_nvfp4_suffix:
 * each name it can write parses back to the role it was written for, and
 * each format writes a full set (packed and scales in both layouts, the
 * per-tensor and the input scale). */
static int test_nvfp4_suffix_round_trip(void)
{
	static const enum ms_name_role roles[] = {
		R(WEIGHT), R(SCALE), R(SCALE2), R(GLOBAL_SCALE), R(INPUT_SCALE), R(COLWISE),
		R(COLWISE_SCALE),
	};
	static const char *const want[2][7] = {
		{ ".weight", ".weight_scale", ".weight_scale_2", NULL, ".input_scale",
		  ".weight_colwise", ".weight_colwise_scale" },
		{ ".weight_packed", ".weight_scale", NULL, ".weight_global_scale",
		  ".input_global_scale", ".weight_packed_colwise", ".weight_scale_colwise" },
	};

	for (unsigned f = 0; f < 2; f++)
		for (size_t k = 0; k < sizeof(roles) / sizeof(roles[0]); k++) {
			const char *sfx = ms_name_nvfp4_suffix(roles[k], f);
			struct ms_name_info in;
			char name[128];

			if (!want[f][k]) {
				T_ASSERT_MSG(sfx == NULL, "format %u role %s: '%s'", f,
					     ms_name_role_str(roles[k]), sfx);
				continue;
			}
			T_ASSERT_MSG(sfx != NULL, "format %u role %s: none", f,
				     ms_name_role_str(roles[k]));
			T_ASSERT_STR(sfx, want[f][k]);
			snprintf(name, sizeof(name), "model.layers.2.mlp.experts.5.up_proj%s", sfx);
			T_ASSERT_EQ_INT(ms_name_parse(name, &in), MS_OK);
			T_ASSERT_MSG(in.role == roles[k], "'%s' parses as %s", name,
				     ms_name_role_str(in.role));
			T_ASSERT_EQ_INT(in.colwise,
					roles[k] == R(COLWISE) || roles[k] == R(COLWISE_SCALE));
			T_ASSERT_EQ_INT(in.expert, 5);
		}
	T_ASSERT(ms_name_nvfp4_suffix(R(BIAS), 0) == NULL);
	T_ASSERT(ms_name_nvfp4_suffix(R(WEIGHT), 2) == NULL);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_families),
	T_CASE(test_peft_flag),
	T_CASE(test_bad_input),
	T_CASE(test_every_fixture_name),
	T_CASE(test_info_str_truncates),
	T_CASE(test_nvfp4_suffix_round_trip),
};

T_MAIN(cases)
