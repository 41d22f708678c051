/*
 * fz_plan.c: fuzz target for the run plan parser (ms_fp_plan_parse,
 * footprint.h). The input is the plan file's bytes. A rejection must be
 * one line naming the plan, the same without an error buffer. An accepted
 * plan must hold what the header promises (ranges, roles, exactly one of
 * state and path), and is then counted: every entry gets the tensors of a
 * checkpoint opened once (the qwen3moe fixture, the fused-LoRA adapter) or
 * a synthetic list whose fused expert tensors have the plan's own expert
 * count, so the fuzzer drives the placement arithmetic (ep_size,
 * num_experts, placement, repr, budget) as well. Entry paths are never
 * opened: a plan could name any file on the machine. The report must come
 * out as text and as JSON that parses, and agree with the budget.
 */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "footprint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LABEL "fuzz-plan.json"
#define NCKPT 2

static struct ms_ckpt *ckpt[NCKPT];
static int ready;

static void cleanup(void)
{
	for (int i = 0; i < NCKPT; i++)
		ms_ckpt_close(ckpt[i]);
}

static void setup(void)
{
	static const char *const rel[NCKPT] = {
		"hf/qwen3moe", "peft/qwen3moe-E8-r4/adapter",
	};
	const char *fx = getenv("MS_FIXTURES");
	struct ms_err err = {0};
	char path[4096];

	for (int i = 0; i < NCKPT; i++) {
		snprintf(path, sizeof(path), "%s/%s", fx && *fx ? fx : "tests/fixtures", rel[i]);
		if (ms_ckpt_open(path, &ckpt[i], &err) != MS_OK) {
			fprintf(stderr, "fz_plan: %s (run from the repository root or set MS_FIXTURES)\n",
				err.msg);
			abort();
		}
	}
	atexit(cleanup);
	ready = 1;
}

/* A small MoE model whose fused tensors hold e experts: the fuzzed
 * num_experts reaches the placement without a checkpoint of that size. */
static size_t synthetic(uint32_t e, struct ms_fp_tensor *t, char names[][96])
{
	static const struct {
		const char *name;
		enum ms_dtype dtype;
		uint32_t ndim;
		uint64_t d1, d2; /* after the expert dimension when fused */
		int fused;
	} spec[] = {
		{"model.embed_tokens.weight", MS_DTYPE_BF16, 2, 128, 64, 0},
		{"model.layers.0.self_attn.q_proj.weight", MS_DTYPE_BF16, 2, 64, 64, 0},
		{"model.layers.0.self_attn.o_proj.weight", MS_DTYPE_BF16, 2, 30, 50, 0},
		{"model.layers.0.mlp.gate.weight", MS_DTYPE_BF16, 2, 8, 64, 0},
		{"model.layers.0.mlp.experts.gate_up_proj", MS_DTYPE_BF16, 3, 64, 64, 1},
		{"model.layers.0.mlp.experts.down_proj", MS_DTYPE_BF16, 3, 32, 64, 1},
		{"model.layers.1.mlp.experts.0.up_proj.weight", MS_DTYPE_BF16, 2, 32, 64, 0},
		{"model.layers.1.mlp.experts.0.up_proj.weight_packed", MS_DTYPE_U8, 2, 32, 32, 0},
		{"model.layers.1.mlp.shared_expert.up_proj.weight", MS_DTYPE_F32, 2, 17, 33, 0},
		{"lm_head.weight", MS_DTYPE_BF16, 2, 128, 64, 0},
	};
	size_t n = sizeof(spec) / sizeof(spec[0]);

	for (size_t i = 0; i < n; i++) {
		snprintf(names[i], 96, "%s", spec[i].name);
		t[i].name = names[i];
		t[i].dtype = spec[i].dtype;
		t[i].ndim = spec[i].ndim;
		memset(t[i].shape, 0, sizeof(t[i].shape));
		if (spec[i].fused) {
			t[i].shape[0] = e;
			t[i].shape[1] = spec[i].d1;
			t[i].shape[2] = spec[i].d2;
		} else {
			t[i].shape[0] = spec[i].d1;
			t[i].shape[1] = spec[i].d2;
		}
	}
	return n;
}

static int role_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '.' || c == '-';
}

static void check_plan(const struct ms_fp_plan *p)
{
	assert(!strcmp(p->label, LABEL));
	assert(p->ep_size >= 1 && p->ep_size <= MS_FP_MAX_EP);
	assert(p->num_experts <= MS_FP_MAX_EXPERTS);
	assert(p->placement == MS_FP_PLACEMENT_CONTIGUOUS ||
	       p->placement == MS_FP_PLACEMENT_ROUND_ROBIN);
	if (p->has_budget)
		assert(p->budget_gib > 0 && p->budget_gib <= MS_FP_MAX_BUDGET_GIB &&
		       p->budget_bytes <= (uint64_t)(MS_FP_MAX_BUDGET_GIB * 1073741824.0));
	assert(p->nentries >= 1 && p->nentries <= MS_FP_MAX_ENTRIES);
	for (size_t i = 0; i < p->nentries; i++) {
		const struct ms_fp_entry *e = &p->entries[i];
		size_t rl = strlen(e->role);

		assert(rl >= 1 && rl <= MS_FP_MAX_ROLE);
		for (size_t k = 0; k < rl; k++)
			assert(role_char(e->role[k]));
		for (size_t j = 0; j < i; j++)
			assert(strcmp(p->entries[j].role, e->role) != 0);
		assert(!e->state != !e->path);
		if (e->path)
			assert(e->resolved && !strcmp(e->resolved, e->path));
		else
			assert(!e->resolved && *e->state && strlen(e->state) <= MS_FP_MAX_REF);
		assert((unsigned)e->repr < MS_FP_REPR_COUNT);
		assert(ms_fp_repr_name(e->repr) != NULL);
	}
}

static void count(const struct ms_fp_plan *p)
{
	struct ms_fp_tensor syn[16];
	char names[16][96];
	struct ms_fp_calc *c = NULL;
	struct ms_fp_report *r = NULL;
	struct ms_err err = {0};
	struct ms_buf b;
	size_t nsyn;
	cJSON *j;
	int rc;

	nsyn = synthetic(p->num_experts ? p->num_experts : 8, syn, names);
	rc = ms_fp_calc_new(p, &c, &err);
	assert(rc == MS_OK);
	for (size_t i = 0; i < p->nentries; i++) {
		if (i % 3 < NCKPT)
			rc = ms_fp_calc_add_ckpt(c, i, ckpt[i % 3], &err);
		else
			rc = ms_fp_calc_add_tensors(c, i, syn, nsyn, &err);
		assert(rc == MS_OK || rc == MS_EINVAL);
		if (rc != MS_OK) {
			assert(err.code == rc && !strchr(err.msg, '\n'));
			goto out;
		}
	}
	rc = ms_fp_calc_finish(c, &r, &err);
	/* triage: how far the count went */
	if (getenv("FZ_PLAN_VERBOSE"))
		fprintf(stderr, "fz_plan: count: rc %d: %s\n", rc, rc ? err.msg : "report");
	if (rc != MS_OK) {
		/* e.g. experts that do not divide over the ranks */
		assert(rc == MS_EINVAL && err.code == rc);
		assert(err.msg[0] && strchr(err.msg, '\n') == NULL);
		goto out;
	}
	assert(r->plan == p);
	assert(r->has_budget == p->has_budget);
	assert(r->over_budget == (r->has_budget && r->total_bytes_per_gpu > r->budget_bytes));
	assert(r->peak_rank < p->ep_size);
	assert(r->ondemand_total_bytes_per_gpu <= r->total_bytes_per_gpu);
	for (size_t i = 0; i < r->nrows; i++) {
		assert(r->rows[i].entry < p->nentries);
		assert(r->rows[i].bytes_per_gpu <= r->total_bytes_per_gpu ||
		       r->rows[i].layout == MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT);
	}
	for (size_t i = 0; i < r->ndups; i++) {
		assert(r->dups[i].nrows >= 2);
		for (size_t k = 0; k < r->dups[i].nrows; k++)
			assert(r->dups[i].rows[k] < r->nrows);
	}
	ms_buf_init(&b);
	assert(ms_fp_report_text(r, &b, &err) == MS_OK);
	assert(b.len > 0 && memchr(b.data, '\0', b.len) == NULL);
	ms_buf_release(&b);
	ms_buf_init(&b);
	assert(ms_fp_report_json(r, &b, &err) == MS_OK);
	j = cJSON_ParseWithLength(b.data, b.len);
	assert(cJSON_IsObject(j));
	cJSON_Delete(j);
	ms_buf_release(&b);
out:
	ms_fp_report_free(r);
	ms_fp_calc_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ms_fp_plan *p = NULL;
	struct ms_err err = {0};
	int rc;

	if (!ready)
		setup();
	rc = ms_fp_plan_parse((const char *)data, size, LABEL, &p, &err);
	if (getenv("FZ_PLAN_VERBOSE"))
		fprintf(stderr, "fz_plan: parse: rc %d: %s\n", rc, rc ? err.msg : "ok");
	if (rc != MS_OK) {
		assert(p == NULL);
		assert(rc == MS_EINVAL && err.code == rc);
		assert(strstr(err.msg, LABEL) != NULL);
		assert(strchr(err.msg, '\n') == NULL);
		assert(ms_fp_plan_parse((const char *)data, size, LABEL, &p, NULL) == rc);
		assert(p == NULL);
		return 0;
	}
	check_plan(p);
	count(p);
	ms_fp_plan_free(p);
	return 0;
}
