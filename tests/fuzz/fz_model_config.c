/*
 * fz_model_config.c: fuzz target for the trainer model's config.json parser
 * (ms_model_cfg_parse, src/train/model.h). The input is the file's bytes.
 * A rejection must be one line naming config.json, MS_EINVAL (or
 * MS_ENOMEM), and the same without an error buffer. An accepted config
 * must hold what the header promises (sizes non-zero, heads dividing,
 * rotary dimension even and within the head, top-k within the experts,
 * groups dividing them), and when it is small enough the model is built
 * from random float32 tensors of the shapes it asks for (EP 2 when the
 * experts divide) and runs a step and a forward: every accepted config
 * must build, and give a finite loss over the tokens it counts.
 */
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ELEMS (1u << 20) /* per tensor and in all: build only small ones */
#define MAX_TENSORS 4096

struct tl {
	struct ms_wtensor t[MAX_TENSORS];
	char name[MAX_TENSORS][128];
	size_t n;
	uint64_t total;
	int too_big;
	const float *buf;
};

static void add(struct tl *l, uint64_t d0, uint64_t d1, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void add(struct tl *l, uint64_t d0, uint64_t d1, const char *fmt, ...)
{
	va_list ap;
	struct ms_wtensor *t;
	uint64_t n = d0 * (d1 ? d1 : 1);

	if (l->n >= MAX_TENSORS || n > MAX_ELEMS || l->total + n > 16ull * MAX_ELEMS) {
		l->too_big = 1;
		return;
	}
	t = &l->t[l->n];
	va_start(ap, fmt);
	vsnprintf(l->name[l->n], sizeof l->name[0], fmt, ap);
	va_end(ap);
	memset(t, 0, sizeof *t);
	t->name = l->name[l->n];
	t->dtype = MS_DTYPE_F32;
	t->ndim = d1 ? 2 : 1;
	t->shape[0] = d0;
	t->shape[1] = d1;
	t->data = l->buf;
	t->nbytes = n * 4;
	l->total += n;
	l->n++;
}

static void mlp(struct tl *l, const char *p, uint32_t ffn, uint32_t H)
{
	add(l, ffn, H, "%s.gate_proj.weight", p);
	add(l, ffn, H, "%s.up_proj.weight", p);
	add(l, H, ffn, "%s.down_proj.weight", p);
}

/* The tensors a config asks for, by transformers' names. */
static void tensors(struct tl *l, const struct ms_model_cfg *c)
{
	uint32_t H = c->hidden, hd = c->head_dim;
	uint32_t dq = c->n_heads * hd, dkv = c->n_kv_heads * hd;
	int mix = c->family == MS_MODEL_MIXTRAL;

	add(l, c->vocab, H, "model.embed_tokens.weight");
	add(l, H, 0, "model.norm.weight");
	if (!c->tie_word_embeddings)
		add(l, c->vocab, H, "lm_head.weight");
	for (uint32_t i = 0; i < c->n_layers && !l->too_big; i++) {
		char p[96];
		add(l, H, 0, "model.layers.%u.input_layernorm.weight", i);
		add(l, H, 0, "model.layers.%u.post_attention_layernorm.weight", i);
		add(l, dq, H, "model.layers.%u.self_attn.q_proj.weight", i);
		add(l, dkv, H, "model.layers.%u.self_attn.k_proj.weight", i);
		add(l, dkv, H, "model.layers.%u.self_attn.v_proj.weight", i);
		add(l, H, dq, "model.layers.%u.self_attn.o_proj.weight", i);
		if (c->attention_bias) {
			add(l, dq, 0, "model.layers.%u.self_attn.q_proj.bias", i);
			add(l, dkv, 0, "model.layers.%u.self_attn.k_proj.bias", i);
			add(l, dkv, 0, "model.layers.%u.self_attn.v_proj.bias", i);
			if (c->family == MS_MODEL_QWEN3_MOE)
				add(l, H, 0, "model.layers.%u.self_attn.o_proj.bias", i);
		}
		if (c->qk_norm) {
			add(l, hd, 0, "model.layers.%u.self_attn.q_norm.weight", i);
			add(l, hd, 0, "model.layers.%u.self_attn.k_norm.weight", i);
		}
		if (c->dense[i]) {
			snprintf(p, sizeof p, "model.layers.%u.mlp", i);
			mlp(l, p, c->dense_ffn, H);
			continue;
		}
		add(l, c->n_experts, H, "model.layers.%u.%s.gate.weight", i,
		    mix ? "block_sparse_moe" : "mlp");
		if (c->router == MS_ROUTER_SIGMOID)
			add(l, c->n_experts, 0,
			    "model.layers.%u.mlp.gate.e_score_correction_bias", i);
		for (uint32_t e = 0; e < c->n_experts && !l->too_big; e++) {
			if (mix) {
				add(l, c->moe_ffn, H,
				    "model.layers.%u.block_sparse_moe.experts.%u.w1.weight", i, e);
				add(l, c->moe_ffn, H,
				    "model.layers.%u.block_sparse_moe.experts.%u.w3.weight", i, e);
				add(l, H, c->moe_ffn,
				    "model.layers.%u.block_sparse_moe.experts.%u.w2.weight", i, e);
			} else {
				snprintf(p, sizeof p, "model.layers.%u.mlp.experts.%u", i, e);
				mlp(l, p, c->moe_ffn, H);
			}
		}
		if (c->n_shared_experts) {
			snprintf(p, sizeof p, "model.layers.%u.mlp.shared_experts", i);
			mlp(l, p, c->moe_ffn * c->n_shared_experts, H);
		}
	}
}

static void check(const struct ms_model_cfg *c)
{
	assert(c->vocab && c->hidden && c->n_layers && c->n_heads && c->n_kv_heads);
	assert(c->n_layers <= MS_MODEL_MAX_LAYERS);
	assert(c->n_heads % c->n_kv_heads == 0);
	assert(c->head_dim && c->head_dim % 2 == 0 && c->head_dim <= MS_MODEL_MAX_HEAD_DIM);
	assert(c->rotary_dim && c->rotary_dim % 2 == 0 && c->rotary_dim <= c->head_dim);
	assert(c->rope_theta > 0 && isfinite(c->rope_theta));
	assert(c->rms_eps > 0 && isfinite(c->rms_eps));
	assert(c->n_experts && c->top_k && c->top_k <= c->n_experts && c->moe_ffn);
	assert(c->n_group && c->n_experts % c->n_group == 0);
	assert(c->topk_group && c->topk_group <= c->n_group);
	for (uint32_t i = 0; i < c->n_layers; i++)
		assert(!c->dense[i] || c->dense_ffn);
	assert((c->family == MS_MODEL_QWEN3_MOE && !strcmp(c->model_type, "qwen3_moe")) ||
	       (c->family == MS_MODEL_MIXTRAL && !strcmp(c->model_type, "mixtral")) ||
	       (c->family == MS_MODEL_GLM4_MOE && !strcmp(c->model_type, "glm4_moe")));
}

static void run(const struct ms_model_cfg *c)
{
	static float buf[MAX_ELEMS];
	static struct tl l;
	struct ms_lora_cfg lc = {.r = 2, .alpha = 4, .dropout = 0.1, .seed = 5,
				 .targets = MS_LORA_EXPERTS | MS_LORA_Q | MS_LORA_K |
					    MS_LORA_V | MS_LORA_O};
	struct ms_model_opts o = {.colwise = MS_COLWISE_ON_DEMAND, .nthreads = 2};
	struct ms_model *m = NULL;
	struct ms_err err = {0};
	int32_t ids[6];
	uint8_t mask[6] = {1, 1, 0, 1, 1, 1};
	double loss = -1;
	uint64_t nt = 0;
	float *logits;
	int rc;

	if (!buf[0])
		for (size_t i = 0; i < MAX_ELEMS; i++)
			buf[i] = (float)sin((double)i * 0.7) * 0.1f;
	memset(&l, 0, sizeof l);
	l.buf = buf;
	tensors(&l, c);
	if (l.too_big || (uint64_t)c->vocab * 6 > MAX_ELEMS)
		return;
	o.ep_size = c->n_experts % 2 == 0 ? 2 : 1;
	rc = ms_model_build(&m, c, l.t, l.n, NULL, 0, &lc, NULL, 0, &o, &err);
	if (rc == MS_ENOMEM)
		return;
	if (rc != MS_OK)
		fprintf(stderr, "fz_model_config: build: %s\n", err.msg);
	assert(rc == MS_OK);
	for (int i = 0; i < 6; i++)
		ids[i] = (int32_t)((i * 7 + 3) % c->vocab);
	rc = ms_model_step(m, ids, mask, 2, 3, 0.25, 1, &loss, &nt, &err);
	assert(rc == MS_OK || rc == MS_ENOMEM);
	if (rc == MS_OK) {
		assert(nt == 3 && isfinite(loss) && loss > 0);
		logits = malloc((size_t)c->vocab * 6 * sizeof *logits);
		if (logits) {
			rc = ms_model_forward(m, ids, 2, 3, logits, &err);
			assert(rc == MS_OK || rc == MS_ENOMEM);
			for (size_t i = 0; rc == MS_OK && i < (size_t)c->vocab * 6; i++)
				assert(isfinite(logits[i]));
			free(logits);
		}
	}
	ms_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ms_model_cfg c;
	struct ms_err err = {0};
	int rc = ms_model_cfg_parse((const char *)data, size, &c, &err);

	if (rc != MS_OK) {
		assert(rc == MS_EINVAL || rc == MS_ENOMEM);
		assert(err.code == rc && err.msg[0] && strchr(err.msg, '\n') == NULL);
		if (rc == MS_EINVAL)
			assert(strstr(err.msg, "config.json") != NULL);
		assert(ms_model_cfg_parse((const char *)data, size, &c, NULL) == rc);
		return 0;
	}
	check(&c);
	run(&c);
	return 0;
}
