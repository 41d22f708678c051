/*
 * model_cfg.c: config.json of the trainer's model families, the LoRA
 * target names, and adapter_config.json for the adapter the model trains.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "train/model.h"

static const cJSON *get(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return (v && !cJSON_IsNull(v)) ? v : NULL;
}

/* An unsigned integer field; required unless def is given (def >= 0). */
static int get_u32(const cJSON *o, const char *k, long long def, uint32_t *out,
		   struct ms_err *err)
{
	const cJSON *v = get(o, k);
	if (!v) {
		if (def < 0)
			return ms_err_set(err, MS_EINVAL,
					  "config.json: '%s' is missing", k);
		*out = (uint32_t)def;
		return MS_OK;
	}
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 ||
	    v->valuedouble > 1e9 || v->valuedouble != floor(v->valuedouble))
		return ms_err_set(err, MS_EINVAL,
				  "config.json: '%s' is not a non-negative integer",
				  k);
	*out = (uint32_t)v->valuedouble;
	return MS_OK;
}

static int get_num(const cJSON *o, const char *k, double def, int required,
		   double *out, struct ms_err *err)
{
	const cJSON *v = get(o, k);
	if (!v) {
		if (required)
			return ms_err_set(err, MS_EINVAL,
					  "config.json: '%s' is missing", k);
		*out = def;
		return MS_OK;
	}
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
		return ms_err_set(err, MS_EINVAL,
				  "config.json: '%s' is not a number", k);
	*out = v->valuedouble;
	return MS_OK;
}

static int get_bool(const cJSON *o, const char *k, int def, int *out,
		    struct ms_err *err)
{
	const cJSON *v = get(o, k);
	if (!v) {
		*out = def;
		return MS_OK;
	}
	if (!cJSON_IsBool(v))
		return ms_err_set(err, MS_EINVAL,
				  "config.json: '%s' is not a boolean", k);
	*out = cJSON_IsTrue(v);
	return MS_OK;
}

/* A field that must be absent, null, false or zero: something we would
 * otherwise silently ignore. */
static int refuse_set(const cJSON *o, const char *k, const char *why,
		      struct ms_err *err)
{
	const cJSON *v = get(o, k);
	if (!v || cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0))
		return MS_OK;
	return ms_err_set(err, MS_EINVAL, "config.json: '%s' is set (%s): not implemented",
			  k, why);
}

/* RoPE: only the default (unscaled) kind. transformers 5 writes
 * rope_parameters {rope_type, rope_theta, partial_rotary_factor}; older
 * configs write rope_theta and rope_scaling at the top level. */
static int parse_rope(const cJSON *root, double *theta, double *partial,
		      struct ms_err *err)
{
	const cJSON *rp = get(root, "rope_parameters");
	const cJSON *rs = get(root, "rope_scaling");
	int rc;

	if (rs) {
		const cJSON *t = cJSON_IsObject(rs) ? get(rs, "rope_type") : NULL;
		if (!t)
			t = cJSON_IsObject(rs) ? get(rs, "type") : NULL;
		if (!t || !cJSON_IsString(t) || strcmp(t->valuestring, "default"))
			return ms_err_set(err, MS_EINVAL,
					  "config.json: 'rope_scaling' is set: "
					  "only default RoPE is implemented");
	}
	if (rp) {
		const cJSON *t;
		if (!cJSON_IsObject(rp))
			return ms_err_set(err, MS_EINVAL,
					  "config.json: 'rope_parameters' is not an object");
		t = get(rp, "rope_type");
		if (t && (!cJSON_IsString(t) || strcmp(t->valuestring, "default")))
			return ms_err_set(err, MS_EINVAL,
					  "config.json: 'rope_parameters.rope_type' is "
					  "'%s': only 'default' is implemented",
					  cJSON_IsString(t) ? t->valuestring : "?");
		if ((rc = get_num(rp, "rope_theta", 10000.0, 0, theta, err)) ||
		    (!get(rp, "rope_theta") &&
		     (rc = get_num(root, "rope_theta", 10000.0, 0, theta, err))))
			return rc;
		if (get(rp, "partial_rotary_factor") &&
		    (rc = get_num(rp, "partial_rotary_factor", 1.0, 0, partial, err)))
			return rc;
	} else if ((rc = get_num(root, "rope_theta", 10000.0, 0, theta, err))) {
		return rc;
	}
	/* transformers reads rope_parameters; a top-level factor (GLM's config
	 * class writes its default there too) counts only when that has none */
	if ((!rp || !get(rp, "partial_rotary_factor")) &&
	    get(root, "partial_rotary_factor") &&
	    (rc = get_num(root, "partial_rotary_factor", 1.0, 0, partial, err)))
		return rc;
	if (!(*theta > 0))
		return ms_err_set(err, MS_EINVAL, "config.json: 'rope_theta' must be > 0");
	if (!(*partial > 0 && *partial <= 1))
		return ms_err_set(err, MS_EINVAL,
				  "config.json: 'partial_rotary_factor' must be in (0, 1]");
	return MS_OK;
}

static int parse(const cJSON *root, struct ms_model_cfg *c, struct ms_err *err)
{
	const cJSON *v;
	double partial = 1.0;
	int rc;

	if (!cJSON_IsObject(root))
		return ms_err_set(err, MS_EINVAL, "config.json: not a JSON object");
	v = get(root, "model_type");
	if (!v || !cJSON_IsString(v))
		return ms_err_set(err, MS_EINVAL, "config.json: 'model_type' is missing");
	if (!strcmp(v->valuestring, "qwen3_moe"))
		c->family = MS_MODEL_QWEN3_MOE;
	else if (!strcmp(v->valuestring, "mixtral"))
		c->family = MS_MODEL_MIXTRAL;
	else if (!strcmp(v->valuestring, "glm4_moe"))
		c->family = MS_MODEL_GLM4_MOE;
	else
		return ms_err_set(err, MS_EINVAL,
				  "config.json: 'model_type' is '%.64s': not implemented "
				  "(qwen3_moe, mixtral, glm4_moe)", v->valuestring);
	snprintf(c->model_type, sizeof c->model_type, "%s", v->valuestring);
	v = get(root, "architectures");
	if (v && cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0 &&
	    cJSON_IsString(cJSON_GetArrayItem(v, 0)))
		snprintf(c->arch, sizeof c->arch, "%s",
			 cJSON_GetArrayItem(v, 0)->valuestring);
	v = get(root, "hidden_act");
	if (v && (!cJSON_IsString(v) || strcmp(v->valuestring, "silu")))
		return ms_err_set(err, MS_EINVAL,
				  "config.json: 'hidden_act' is '%.64s': only 'silu' is "
				  "implemented", cJSON_IsString(v) ? v->valuestring : "?");

	if ((rc = get_u32(root, "vocab_size", -1, &c->vocab, err)) ||
	    (rc = get_u32(root, "hidden_size", -1, &c->hidden, err)) ||
	    (rc = get_u32(root, "num_hidden_layers", -1, &c->n_layers, err)) ||
	    (rc = get_u32(root, "num_attention_heads", -1, &c->n_heads, err)) ||
	    (rc = get_u32(root, "num_key_value_heads", c->n_heads, &c->n_kv_heads,
			  err)) ||
	    (rc = get_num(root, "rms_norm_eps", 1e-6, 0, &c->rms_eps, err)) ||
	    (rc = get_bool(root, "tie_word_embeddings", 0,
			   &c->tie_word_embeddings, err)) ||
	    (rc = get_bool(root, "attention_bias", 0, &c->attention_bias, err)) ||
	    (rc = parse_rope(root, &c->rope_theta, &partial, err)))
		return rc;
	if (!c->vocab || !c->hidden || !c->n_layers || !c->n_heads ||
	    !c->n_kv_heads)
		return ms_err_set(err, MS_EINVAL,
				  "config.json: a size (vocab, hidden, layers, heads) is 0");
	if (c->n_layers > MS_MODEL_MAX_LAYERS)
		return ms_err_set(err, MS_EINVAL,
				  "config.json: 'num_hidden_layers' %u is over %u",
				  c->n_layers, MS_MODEL_MAX_LAYERS);
	if (c->n_heads % c->n_kv_heads)
		return ms_err_set(err, MS_EINVAL,
				  "config.json: 'num_attention_heads' is not a multiple "
				  "of 'num_key_value_heads'");
	if ((rc = get_u32(root, "head_dim", c->hidden / c->n_heads, &c->head_dim,
			  err)))
		return rc;
	if (!c->head_dim || c->head_dim % 2)
		return ms_err_set(err, MS_EINVAL, "config.json: 'head_dim' must be even");
	if (c->head_dim > MS_MODEL_MAX_HEAD_DIM)
		return ms_err_set(err, MS_EINVAL,
				  "config.json: 'head_dim' %u is over %d: not implemented",
				  c->head_dim, MS_MODEL_MAX_HEAD_DIM);
	c->rotary_dim = (uint32_t)((double)c->head_dim * partial);
	if (c->rotary_dim % 2 || !c->rotary_dim)
		return ms_err_set(err, MS_EINVAL,
				  "config.json: 'partial_rotary_factor' gives an odd "
				  "rotary dimension");
	if (!(c->rms_eps > 0))
		return ms_err_set(err, MS_EINVAL, "config.json: 'rms_norm_eps' must be > 0");
	if ((rc = refuse_set(root, "attention_dropout", "dropout in attention", err)) ||
	    (rc = refuse_set(root, "use_sliding_window", "sliding-window attention",
			     err)) ||
	    (rc = refuse_set(root, "output_router_logits",
			     "the router auxiliary loss", err)))
		return rc;
	if (c->family == MS_MODEL_MIXTRAL &&
	    (rc = refuse_set(root, "sliding_window", "sliding-window attention", err)))
		return rc;
	if ((rc = refuse_set(root, "layer_types", "per-layer attention types", err)))
		return rc;

	c->router = MS_ROUTER_SOFTMAX;
	c->routed_scaling_factor = 1.0;
	c->n_group = c->topk_group = 1;
	memset(c->dense, 0, sizeof c->dense);
	switch (c->family) {
	case MS_MODEL_QWEN3_MOE: {
		uint32_t step, i;
		const cJSON *mo, *e;
		c->qk_norm = 1;
		if ((rc = get_u32(root, "num_experts", 0, &c->n_experts, err)))
			return rc;
		if (!c->n_experts &&
		    (rc = get_u32(root, "num_local_experts", -1, &c->n_experts, err)))
			return rc;
		if ((rc = get_u32(root, "num_experts_per_tok", -1, &c->top_k, err)) ||
		    (rc = get_u32(root, "moe_intermediate_size", -1, &c->moe_ffn, err)) ||
		    (rc = get_u32(root, "intermediate_size", 0, &c->dense_ffn, err)) ||
		    (rc = get_bool(root, "norm_topk_prob", 0, &c->norm_topk_prob, err)) ||
		    (rc = get_u32(root, "decoder_sparse_step", 1, &step, err)))
			return rc;
		mo = get(root, "mlp_only_layers");
		if (mo && !cJSON_IsArray(mo))
			return ms_err_set(err, MS_EINVAL,
					  "config.json: 'mlp_only_layers' is not a list");
		for (i = 0; i < c->n_layers; i++)
			c->dense[i] = !(step > 0 && (i + 1) % step == 0);
		cJSON_ArrayForEach(e, mo) {
			if (!cJSON_IsNumber(e) || e->valuedouble < 0 ||
			    e->valuedouble >= c->n_layers)
				return ms_err_set(err, MS_EINVAL,
						  "config.json: 'mlp_only_layers' holds "
						  "a bad layer index");
			c->dense[(uint32_t)e->valuedouble] = 1;
		}
		break;
	}
	case MS_MODEL_MIXTRAL:
		c->norm_topk_prob = 1;
		if ((rc = get_u32(root, "num_local_experts", -1, &c->n_experts, err)) ||
		    (rc = get_u32(root, "num_experts_per_tok", -1, &c->top_k, err)) ||
		    (rc = get_u32(root, "intermediate_size", -1, &c->moe_ffn, err)) ||
		    (rc = refuse_set(root, "router_jitter_noise",
				     "router jitter in training", err)))
			return rc;
		break;
	case MS_MODEL_GLM4_MOE: {
		uint32_t fk, i;
		c->router = MS_ROUTER_SIGMOID;
		if ((rc = get_u32(root, "n_routed_experts", -1, &c->n_experts, err)) ||
		    (rc = get_u32(root, "num_experts_per_tok", -1, &c->top_k, err)) ||
		    (rc = get_u32(root, "moe_intermediate_size", -1, &c->moe_ffn, err)) ||
		    (rc = get_u32(root, "intermediate_size", -1, &c->dense_ffn, err)) ||
		    (rc = get_u32(root, "n_shared_experts", 0, &c->n_shared_experts,
				  err)) ||
		    (rc = get_u32(root, "n_group", 1, &c->n_group, err)) ||
		    (rc = get_u32(root, "topk_group", 1, &c->topk_group, err)) ||
		    (rc = get_num(root, "routed_scaling_factor", 1.0, 0,
				  &c->routed_scaling_factor, err)) ||
		    (rc = get_bool(root, "norm_topk_prob", 1, &c->norm_topk_prob, err)) ||
		    (rc = get_bool(root, "use_qk_norm", 0, &c->qk_norm, err)) ||
		    (rc = get_u32(root, "first_k_dense_replace", 0, &fk, err)))
			return rc;
		if (!c->n_group || c->n_experts % c->n_group ||
		    c->topk_group > c->n_group || !c->topk_group)
			return ms_err_set(err, MS_EINVAL,
					  "config.json: 'n_group'/'topk_group' do not "
					  "divide the experts");
		if (c->n_experts / c->n_group < 2 && c->n_group > 1)
			return ms_err_set(err, MS_EINVAL,
					  "config.json: 'n_group' leaves fewer than 2 "
					  "experts per group");
		for (i = 0; i < c->n_layers; i++)
			c->dense[i] = i < fk;
		break;
	}
	}
	if (!c->n_experts || !c->top_k || c->top_k > c->n_experts || !c->moe_ffn)
		return ms_err_set(err, MS_EINVAL,
				  "config.json: experts, top-k or expert size invalid");
	for (uint32_t i = 0; i < c->n_layers; i++)
		if (c->dense[i] && !c->dense_ffn)
			return ms_err_set(err, MS_EINVAL,
					  "config.json: 'intermediate_size' is missing "
					  "for dense MLP layers");
	return MS_OK;
}

int ms_model_cfg_parse(const char *json, size_t len, struct ms_model_cfg *cfg,
		       struct ms_err *err)
{
	int oom = 0, rc;
	cJSON *root = ms_json_parse(json, len, &oom);

	memset(cfg, 0, sizeof *cfg);
	if (!root)
		return oom ? ms_err_nomem(err)
			   : ms_err_set(err, MS_EINVAL, "config.json: not JSON");
	rc = parse(root, cfg, err);
	cJSON_Delete(root);
	return rc;
}

int ms_lora_target_parse(const char *name, uint32_t *bit)
{
	static const struct { const char *n; uint32_t b; } t[] = {
		{"experts", MS_LORA_EXPERTS}, {"q_proj", MS_LORA_Q},
		{"k_proj", MS_LORA_K}, {"v_proj", MS_LORA_V}, {"o_proj", MS_LORA_O},
	};
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
		if (!strcmp(name, t[i].n)) {
			*bit = t[i].b;
			return MS_OK;
		}
	return MS_EINVAL;
}
