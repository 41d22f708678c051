/*
 * t_quant.c: checkpoint-level conversion: the default selection, fused
 * groups, plans on the bundled fixtures (counts, names, shards, refusals),
 * the bytes written against the reference codec with an independently
 * computed group amax, reading quantized checkpoints (and refusing broken
 * ones), and the statistics.
 */
#include <math.h>
#include <sys/stat.h>

#include "test.h"
#include "quant.h"

static char *fx(const char *rel)
{
	static char buf[4][512];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", T_FIXTURES, rel);
	return buf[k];
}

static char *tmp(const char *rel)
{
	static char buf[4][512];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", T_TMP, rel);
	return buf[k];
}

static int selected(const char *name, enum ms_dtype dt, uint32_t ndim)
{
	struct ms_tensor t;

	memset(&t, 0, sizeof(t));
	t.name = name;
	t.dtype = dt;
	t.ndim = ndim;
	t.shape[0] = 32;
	t.shape[1] = 64;
	return ms_quant_default_selected(&t);
}

static int test_default_selection(void)
{
	static const char *const yes[] = {
		"model.layers.0.self_attn.q_proj.weight",
		"model.layers.3.self_attn.o_proj.weight",
		"model.layers.0.mlp.experts.7.down_proj.weight",
		"model.layers.0.block_sparse_moe.experts.7.w1.weight",
		"model.layers.0.mlp.shared_expert.up_proj.weight",
		"model.layers.0.mlp.gate_proj.weight",
	};
	static const char *const no[] = {
		"model.embed_tokens.weight", "lm_head.weight",
		"model.layers.0.mlp.gate.weight",
		"model.layers.0.block_sparse_moe.gate.weight",
		"model.layers.0.input_layernorm.weight",
		"model.layers.0.self_attn.q_proj.bias",
		"model.norm.weight",
	};

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		T_ASSERT_MSG(selected(yes[i], MS_DTYPE_BF16, 2), "%s", yes[i]);
		T_ASSERT_MSG(selected(yes[i], MS_DTYPE_F32, 2), "%s", yes[i]);
		T_ASSERT(!selected(yes[i], MS_DTYPE_I32, 2));
		T_ASSERT(!selected(yes[i], MS_DTYPE_BF16, 3));
	}
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		T_ASSERT_MSG(!selected(no[i], MS_DTYPE_BF16, 2), "%s", no[i]);
	return 0;
}

static int test_fuse_keys(void)
{
	char a[256], b[256];

	T_ASSERT(ms_quant_fuse_key("model.layers.2.self_attn.q_proj.weight", a, sizeof(a)));
	T_ASSERT(ms_quant_fuse_key("model.layers.2.self_attn.v_proj.weight", b, sizeof(b)));
	T_ASSERT_STR(a, b);
	T_ASSERT_STR(a, "model.layers.2.self_attn.{qkv}");
	T_ASSERT(ms_quant_fuse_key("model.layers.2.self_attn.k_proj.weight", b, sizeof(b)));
	T_ASSERT_STR(a, b);
	T_ASSERT(ms_quant_fuse_key("model.layers.1.mlp.experts.5.gate_proj.weight", a, sizeof(a)));
	T_ASSERT(ms_quant_fuse_key("model.layers.1.mlp.experts.5.up_proj.weight", b, sizeof(b)));
	T_ASSERT_STR(a, b);
	T_ASSERT(ms_quant_fuse_key("model.layers.1.mlp.experts.6.up_proj.weight", b, sizeof(b)));
	T_ASSERT(strcmp(a, b)); /* another expert */
	T_ASSERT(ms_quant_fuse_key("model.layers.0.block_sparse_moe.experts.1.w3.weight", a, sizeof(a)));
	T_ASSERT_STR(a, "model.layers.0.block_sparse_moe.experts.1.{w13}");
	T_ASSERT(!ms_quant_fuse_key("model.layers.0.block_sparse_moe.experts.1.w2.weight", a, sizeof(a)));
	T_ASSERT(!ms_quant_fuse_key("model.layers.0.self_attn.o_proj.weight", a, sizeof(a)));
	T_ASSERT(!ms_quant_fuse_key("model.layers.0.mlp.gate.weight", a, sizeof(a)));
	T_ASSERT(!ms_quant_fuse_key("q_proj.weight", a, sizeof(a)));
	T_ASSERT(!ms_quant_fuse_key("model.layers.0.self_attn.q_proj.weight", a, 8));
	return 0;
}

static int test_parsers(void)
{
	enum ms_quant_format f;
	enum ms_quant_device d;

	T_ASSERT_EQ_INT(ms_quant_format_parse("compressed-tensors", &f), MS_OK);
	T_ASSERT_EQ_INT(f, MS_QUANT_FORMAT_COMPRESSED_TENSORS);
	T_ASSERT_EQ_INT(ms_quant_format_parse("gguf", &f), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_quant_device_parse("cuda", &d), MS_OK);
	T_ASSERT_EQ_INT(ms_quant_device_parse("tpu", &d), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_quant_default_format(MS_NVFP4_RECIPE_TE), MS_QUANT_FORMAT_MODELOPT);
	T_ASSERT_EQ_INT(ms_quant_default_format(MS_NVFP4_RECIPE_COMPRESSED_TENSORS),
			MS_QUANT_FORMAT_COMPRESSED_TENSORS);
	return 0;
}

static const struct ms_qout *find_out(const struct ms_quant_plan *p, const char *name)
{
	for (size_t i = 0; i < p->nouts; i++)
		if (!strcmp(p->outs[i].name, name))
			return &p->outs[i];
	return NULL;
}

static int test_plan_sharded(void)
{
	struct ms_quant_opts o = {.op = MS_QUANT_OP_QUANTIZE, .layouts = MS_QUANT_ROWWISE |
								   MS_QUANT_COLUMNWISE};
	struct ms_quant_plan *p = NULL;
	struct ms_err err = {0};
	const struct ms_qout *q;
	uint64_t sum = 0;

	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe-sharded"), tmp("plan-out"), &o, &p, &err),
			MS_OK);
	T_ASSERT(p->out_is_dir);
	T_ASSERT_EQ_INT(p->nfiles, 2);
	T_ASSERT_EQ_INT(p->nquantized, 56);
	T_ASSERT_EQ_INT(p->ncopied, 13);
	/* q/k/v of 2 layers, gate/up of 8 experts in 2 layers */
	T_ASSERT_EQ_INT(p->ngroups, 18);
	/* 56 weights x (2 layouts x 2 + 1) + 13 copies */
	T_ASSERT_EQ_INT(p->nouts, 56 * 5 + 13);
	q = find_out(p, "model.layers.1.mlp.experts.2.down_proj.weight_colwise");
	T_ASSERT(q && q->dtype == MS_DTYPE_U8 && q->shape[0] == 32 && q->shape[1] == 32);
	q = find_out(p, "model.layers.1.mlp.experts.2.down_proj.weight_scale_2");
	T_ASSERT(q && q->dtype == MS_DTYPE_F32 && q->ndim == 0);
	/* every output sits in the shard its source came from */
	for (size_t i = 0; i < p->nouts; i++) {
		const struct ms_qitem *it = &p->items[p->outs[i].item];

		T_ASSERT(it->src && it->src->file == p->in->files[p->outs[i].file]);
		sum += p->outs[i].nbytes;
	}
	T_ASSERT_EQ_INT(sum, p->bytes_out);
	T_ASSERT(p->nexcluded == 3 && !strcmp(p->excluded[0], "lm_head"));
	T_ASSERT(strstr(p->file_meta[0], "\"layouts\":[\"rowwise\",\"columnwise\"]"));
	ms_quant_plan_free(p);
	/* --no-fuse-scales: no group */
	o.no_fuse = 1;
	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe-sharded"), tmp("plan-out"), &o, &p, &err),
			MS_OK);
	T_ASSERT_EQ_INT(p->ngroups, 0);
	for (size_t i = 0; i < p->nitems; i++)
		T_ASSERT_EQ_INT(p->items[i].group, -1);
	ms_quant_plan_free(p);
	return 0;
}

static int test_plan_refusals(void)
{
	struct ms_quant_opts o = {.op = MS_QUANT_OP_QUANTIZE};
	struct ms_quant_plan *p = NULL;
	struct ms_err err = {0};

	/* an existing output */
	T_ASSERT_EQ_INT(mkdir(tmp("exists"), 0755), 0);
	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe"), tmp("exists"), &o, &p, &err), MS_EEXIST);
	T_ASSERT(strstr(err.msg, "already exists"));
	o.force = 1;
	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe"), tmp("exists"), &o, &p, &err), MS_OK);
	ms_quant_plan_free(p);
	o.force = 0;
	/* patterns */
	o.include = "(a";
	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe"), tmp("r"), &o, &p, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "include pattern '(a'"));
	o.include = "norm";
	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe"), tmp("r"), &o, &p, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "matches the include pattern"));
	o.include = "lm_head";
	o.exclude = "experts\\.[0-3]\\.";
	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe"), tmp("r"), &o, &p, &err), MS_OK);
	T_ASSERT_EQ_INT(p->nquantized, 56 - 2 * 4 * 3 + 1);
	ms_quant_plan_free(p);
	o.include = o.exclude = NULL;
	/* the device choice */
	o.device = MS_QUANT_DEVICE_CUDA;
	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe"), tmp("r"), &o, &p, &err), MS_ENODEV);
	T_ASSERT(strstr(err.msg, "CUDA"));
	T_ASSERT_EQ_INT(ms_exit_code(MS_ENODEV), 3);
	/* dequantize of a checkpoint with nothing quantized */
	o.device = MS_QUANT_DEVICE_AUTO;
	o.op = MS_QUANT_OP_DEQUANTIZE;
	o.dtype = MS_DTYPE_BF16;
	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe"), tmp("r"), &o, &p, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "no nvfp4 weights"));
	return 0;
}

/* largest |x| of a bf16 tensor, computed here */
static float bf16_amax(const struct ms_tensor *t)
{
	float m = 0;

	for (uint64_t i = 0; i < t->nelem; i++) {
		uint32_t u = (uint32_t)(t->data[2 * i] | t->data[2 * i + 1] << 8) << 16;
		float f;

		memcpy(&f, &u, 4);
		if (fabsf(f) > m)
			m = fabsf(f);
	}
	return m;
}

static int test_execute_matches_reference(void)
{
	static const char *const prefixes[] = {
		"model.layers.0.mlp.experts.3.gate_proj", "model.layers.0.mlp.experts.3.up_proj",
		"model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.o_proj",
	};
	struct ms_quant_opts o = {.op = MS_QUANT_OP_QUANTIZE, .recipe = MS_NVFP4_RECIPE_COMPRESSED_TENSORS,
				  .block = MS_NVFP4_BLOCK_2D, .layouts = MS_QUANT_COLUMNWISE};
	struct ms_quant_plan *p = NULL;
	struct ms_ckpt *src = NULL, *out = NULL;
	struct ms_err err = {0};
	char digest[MS_STATE_DIGEST_LEN], again[MS_STATE_DIGEST_LEN];

	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe"), tmp("ct2d"), &o, &p, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_quant_execute(p, NULL, NULL, &err), MS_OK);
	ms_quant_plan_free(p);
	T_ASSERT_EQ_INT(ms_ckpt_open(fx("hf/qwen3moe"), &src, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_ckpt_open(tmp("ct2d"), &out, &err), MS_OK);
	for (size_t i = 0; i < 4; i++) {
		char name[256], group[2][256];
		const struct ms_tensor *w, *pk, *sc, *gs;
		struct ms_nvfp4_params np = {.recipe = o.recipe, .block = o.block,
					     .layout = MS_NVFP4_LAYOUT_COLUMNWISE};
		struct ms_nvfp4_src s;
		struct ms_nvfp4_tscale ts;
		uint8_t *rp, *rs;
		float amax, stored;

		snprintf(name, sizeof(name), "%s.weight", prefixes[i]);
		w = ms_ckpt_find(src, name);
		T_ASSERT(w);
		amax = bf16_amax(w);
		/* the group: q/k/v or gate/up, by name here */
		if (i < 2) {
			snprintf(group[0], 256, "model.layers.0.mlp.experts.3.gate_proj.weight");
			snprintf(group[1], 256, "model.layers.0.mlp.experts.3.up_proj.weight");
		} else if (i == 2) {
			snprintf(group[0], 256, "model.layers.1.self_attn.q_proj.weight");
			snprintf(group[1], 256, "model.layers.1.self_attn.v_proj.weight");
		}
		for (int g = 0; i < 3 && g < 2; g++) {
			float a = bf16_amax(ms_ckpt_find(src, group[g]));

			amax = a > amax ? a : amax;
		}
		s = (struct ms_nvfp4_src){w->dtype, w->data, w->shape[0], w->shape[1]};
		rp = malloc(w->nelem);
		rs = malloc(w->nelem / 8);
		T_ASSERT_EQ_INT(ms_nvfp4_quantize_ref(&np, &s, amax, rp, rs, &err), MS_OK);
		snprintf(name, sizeof(name), "%s.weight_packed_colwise", prefixes[i]);
		pk = ms_ckpt_find(out, name);
		snprintf(name, sizeof(name), "%s.weight_scale_colwise", prefixes[i]);
		sc = ms_ckpt_find(out, name);
		snprintf(name, sizeof(name), "%s.weight_global_scale", prefixes[i]);
		gs = ms_ckpt_find(out, name);
		T_ASSERT(pk && sc && gs && gs->ndim == 1 && gs->shape[0] == 1);
		T_ASSERT(!memcmp(pk->data, rp, pk->nbytes) && !memcmp(sc->data, rs, sc->nbytes));
		T_ASSERT_EQ_INT(ms_nvfp4_tscale_init_src(o.recipe, amax, w->dtype, &ts, &err), MS_OK);
		memcpy(&stored, gs->data, 4);
		T_ASSERT(stored == ts.global_scale);
		free(rp);
		free(rs);
	}
	/* the digest hook is the state digest of what is on disk */
	T_ASSERT_EQ_INT(ms_quant_output_digest(tmp("ct2d"), 1, digest, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_ckpt_hash(out, 1, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_state_digest(out->tensors, out->ntensors, again, &err), MS_OK);
	T_ASSERT_STR(digest, again);
	ms_ckpt_close(src);
	ms_ckpt_close(out);
	return 0;
}

/* A one-module checkpoint file with the given companions. */
static int write_module(const char *path, int with_tscale, uint64_t scale_cols,
			const char *meta)
{
	struct ms_st_writer *w = NULL;
	static uint8_t zeros[4096];
	uint64_t ps[2] = {32, 16}, ss[2] = {32, scale_cols}, none[1] = {0};
	float one = 1.0f;
	int rc;

	if ((rc = ms_st_writer_new(path, 1, &w, NULL)) != MS_OK)
		return rc;
	if (meta)
		ms_st_writer_meta(w, MS_QUANT_META_KEY, meta, NULL);
	ms_st_writer_add(w, "m.proj.weight", MS_DTYPE_U8, 2, ps, zeros, NULL);
	ms_st_writer_add(w, "m.proj.weight_scale", MS_DTYPE_F8_E4M3, 2, ss, zeros, NULL);
	if (with_tscale)
		ms_st_writer_add(w, "m.proj.weight_scale_2", MS_DTYPE_F32, 0, none, &one, NULL);
	rc = ms_st_writer_commit(w, NULL);
	ms_st_writer_free(w);
	return rc;
}

static int view_of(const char *path, struct ms_ckpt **c, struct ms_qview *v,
		   struct ms_err *err)
{
	int rc = ms_ckpt_open(path, c, err);

	if (rc != MS_OK)
		return rc;
	rc = ms_qview_open(*c, v, err);
	if (rc != MS_OK) {
		ms_ckpt_close(*c);
		*c = NULL;
	}
	return rc;
}

static int test_qview(void)
{
	struct ms_ckpt *c = NULL;
	struct ms_qview v;
	struct ms_err err = {0};

	/* foreign producer, no metadata: 1D, shape from the packed bytes */
	T_ASSERT_EQ_INT(write_module(tmp("mod.safetensors"), 1, 2, NULL), MS_OK);
	T_ASSERT_EQ_INT(view_of(tmp("mod.safetensors"), &c, &v, &err), MS_OK);
	T_ASSERT_EQ_INT(v.nweights, 1);
	T_ASSERT_STR(v.weights[0].prefix, "m.proj");
	T_ASSERT(v.weights[0].rows == 32 && v.weights[0].cols == 32 && !v.weights[0].recorded);
	T_ASSERT(v.weights[0].block == MS_NVFP4_BLOCK_1D && v.weights[0].tscale_value == 1.0f);
	T_ASSERT(v.weights[0].format == MS_QUANT_FORMAT_MODELOPT && !v.weights[0].packed[1]);
	for (size_t i = 0; i < c->ntensors; i++)
		T_ASSERT_EQ_INT(v.owner[i], 0);
	ms_qview_release(&v);
	ms_ckpt_close(c);
	/* recorded: a logical shape that pads */
	T_ASSERT_EQ_INT(write_module(tmp("mod2.safetensors"), 1, 2,
				     "{\"block\":\"2d\",\"recipe\":\"te\",\"tensors\":{\"m.proj\":{\"shape\":[32,30],\"dtype\":\"F16\"}}}"),
			MS_OK);
	T_ASSERT_EQ_INT(view_of(tmp("mod2.safetensors"), &c, &v, &err), MS_OK);
	T_ASSERT(v.weights[0].cols == 30 && v.weights[0].block == MS_NVFP4_BLOCK_2D &&
		 v.weights[0].recipe == MS_NVFP4_RECIPE_TE && v.weights[0].src_dtype == MS_DTYPE_F16);
	ms_qview_release(&v);
	ms_ckpt_close(c);
	/* columnwise copies under the rowwise names, as the metadata says */
	T_ASSERT_EQ_INT(write_module(tmp("mod3.safetensors"), 1, 2,
				     "{\"layouts\":[\"columnwise\"],\"tensors\":{\"m.proj\":{\"shape\":[20,32]}}}"),
			MS_OK);
	T_ASSERT_EQ_INT(view_of(tmp("mod3.safetensors"), &c, &v, &err), MS_OK);
	T_ASSERT(!v.weights[0].packed[0] && v.weights[0].packed[1] && v.weights[0].scales[1]);
	T_ASSERT(v.weights[0].rows == 20 && v.weights[0].cols == 32);
	ms_qview_release(&v);
	ms_ckpt_close(c);
	/* broken ones */
	T_ASSERT_EQ_INT(write_module(tmp("bad1.safetensors"), 0, 2, NULL), MS_OK);
	T_ASSERT_EQ_INT(view_of(tmp("bad1.safetensors"), &c, &v, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "without 'm.proj.weight_scale_2'"));
	T_ASSERT_EQ_INT(write_module(tmp("bad2.safetensors"), 1, 3, NULL), MS_OK);
	T_ASSERT_EQ_INT(view_of(tmp("bad2.safetensors"), &c, &v, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "do not fit"));
	T_ASSERT_EQ_INT(write_module(tmp("bad3.safetensors"), 1, 2,
				     "{\"tensors\":{\"m.proj\":{\"shape\":[32,64]}}}"), MS_OK);
	T_ASSERT_EQ_INT(view_of(tmp("bad3.safetensors"), &c, &v, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(write_module(tmp("bad4.safetensors"), 1, 2, "{not json"), MS_OK);
	T_ASSERT_EQ_INT(view_of(tmp("bad4.safetensors"), &c, &v, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "not a JSON object"));
	return 0;
}

static int test_stats(void)
{
	struct ms_quant_opts o = {.op = MS_QUANT_OP_QUANTIZE, .layouts = MS_QUANT_ROWWISE};
	struct ms_quant_plan *p = NULL;
	struct ms_qstats *s = NULL;
	struct ms_err err = {0};
	uint64_t blocks = 0;

	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/mixtral"), tmp("mx"), &o, &p, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_quant_execute(p, NULL, NULL, &err), MS_OK);
	ms_quant_plan_free(p);
	T_ASSERT_EQ_INT(ms_qstats_run(tmp("mx"), fx("hf/mixtral"), 1, &s, &err), MS_OK);
	T_ASSERT_EQ_INT(s->n, 2 * (8 * 3 + 4));
	for (size_t i = 0; i < s->n; i++) {
		const struct ms_qstats_entry *e = &s->e[i];

		T_ASSERT(e->has_source && e->rel_err > 0.02 && e->rel_err < 0.2);
		/* a block maximum is at most 6 * 448 / 448 of its scale unless
		 * the scale rounded down: then only the largest few saturate */
		T_ASSERT(e->saturated < e->nelem / 8);
		T_ASSERT(e->scale_hist[16] == 0);
	}
	for (int k = 0; k < MS_QSTATS_BUCKETS; k++)
		blocks += s->total.scale_hist[k];
	T_ASSERT_EQ_INT(blocks, s->total.nelem / 16);
	ms_qstats_free(s);
	T_ASSERT_EQ_INT(ms_qstats_run(tmp("mx"), NULL, 1, &s, &err), MS_OK);
	T_ASSERT(!s->total.has_source);
	ms_qstats_free(s);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_default_selection),
	T_CASE(test_fuse_keys),
	T_CASE(test_parsers),
	T_CASE(test_plan_sharded),
	T_CASE(test_plan_refusals),
	T_CASE(test_execute_matches_reference),
	T_CASE(test_qview),
	T_CASE(test_stats),
};

T_MAIN(cases)
