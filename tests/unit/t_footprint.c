/*
 * t_footprint.c: the per-GPU footprint planner against arithmetic done by
 * hand in the comments (every expected number is derived there, never
 * taken from the code's own output), the plan parser against each kind of
 * bad plan, and the bundled example plans on the bundled checkpoints.
 */
#include <stdarg.h>

#include "test.h"
#include "footprint.h"
#include "names.h"
#include "quant.h"

/* ---- helpers ------------------------------------------------------------------ */

#define TL_MAX 512

struct tlist {
	struct ms_fp_tensor t[TL_MAX];
	char names[TL_MAX][160];
	size_t n;
};

static void tl_add(struct tlist *l, enum ms_dtype dt, uint32_t ndim,
		   uint64_t s0, uint64_t s1, uint64_t s2, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));

static void tl_add(struct tlist *l, enum ms_dtype dt, uint32_t ndim,
		   uint64_t s0, uint64_t s1, uint64_t s2, const char *fmt, ...)
{
	struct ms_fp_tensor *t;
	va_list ap;

	if (l->n >= TL_MAX)
		abort();
	t = &l->t[l->n];
	va_start(ap, fmt);
	vsnprintf(l->names[l->n], sizeof(l->names[0]), fmt, ap);
	va_end(ap);
	memset(t, 0, sizeof(*t));
	t->name = l->names[l->n];
	t->dtype = dt;
	t->ndim = ndim;
	t->shape[0] = s0;
	t->shape[1] = s1;
	t->shape[2] = s2;
	l->n++;
}

struct run {
	struct ms_fp_plan *plan;
	struct ms_fp_calc *calc;
	struct ms_fp_report *rep;
	struct ms_err err;
};

static void run_free(struct run *r)
{
	ms_fp_report_free(r->rep);
	ms_fp_calc_free(r->calc);
	ms_fp_plan_free(r->plan);
	memset(r, 0, sizeof(*r));
}

/* Parse json, give entry i the tensors of lists[i], finish. */
static int run_plan(struct run *r, const char *json, struct tlist *const *lists)
{
	int rc;

	memset(r, 0, sizeof(*r));
	if ((rc = ms_fp_plan_parse(json, strlen(json), "t.json", &r->plan,
				   &r->err)) != MS_OK)
		return rc;
	if ((rc = ms_fp_calc_new(r->plan, &r->calc, &r->err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < r->plan->nentries; i++)
		if ((rc = ms_fp_calc_add_tensors(r->calc, i, lists[i]->t, lists[i]->n,
						 &r->err)) != MS_OK)
			return rc;
	return ms_fp_calc_finish(r->calc, &r->rep, &r->err);
}

static const struct ms_fp_row *find_row(const struct ms_fp_report *rep,
					const char *role, enum ms_fp_layout l)
{
	for (size_t i = 0; i < rep->nrows; i++)
		if (!strcmp(rep->rows[i].role, role) && rep->rows[i].layout == l)
			return &rep->rows[i];
	return NULL;
}

/*
 * The hand-checkable model (bf16 throughout):
 *   layer 0: experts 0..7, each gate_proj [32,64] and down_proj [64,32];
 *            self_attn.q_proj [64,64]; input_layernorm [64]; mlp.gate
 *            (router) [8,64]
 *   layer 1: experts 0..7, each gate_proj [32,64]; self_attn.q_proj [64,64]
 *   embed_tokens [100,64]
 *
 * Kept at bf16 whatever the repr (not projections), replicated:
 *   embed 100*64*2 = 12800, norm 64*2 = 128, router 8*64*2 = 1024
 *   -> as-is row: 13952 bytes on every GPU.
 *
 * NVFP4 of one [32,64] (or [64,32]) matrix, either layout: every dim is a
 * multiple of 16, so packed 32*64/2 = 1024, scales 32*64/16 = 128, tensor
 * scale 4 -> 1156 (0.5625 B/param + 4). q_proj [64,64]: 2048 + 256 + 4 =
 * 2308. In bf16: [32,64] = 4096, [64,64] = 8192.
 *
 * EP = 4, contiguous: E = 8 in both layers, rank k owns experts 2k, 2k+1.
 * Per GPU in one NVFP4 layout:
 *   layer 0: q_proj 2308 (replicated) + 2 experts * 2 weights * 1156 = 4624
 *            -> 6932
 *   layer 1: 2308 + 2 experts * 1 weight * 1156 = 2312 -> 4620
 *   both layers: replicated 4616, expert 6936 -> 11552
 *   whole state: 2*2308 + 24*1156 = 4616 + 27744 = 32360
 * Quantizable weights: 16 + 8 experts + 2 q_proj = 26.
 */
static void hand_model(struct tlist *l)
{
	l->n = 0;
	for (int e = 0; e < 8; e++) {
		tl_add(l, MS_DTYPE_BF16, 2, 32, 64, 0,
		       "model.layers.0.mlp.experts.%d.gate_proj.weight", e);
		tl_add(l, MS_DTYPE_BF16, 2, 64, 32, 0,
		       "model.layers.0.mlp.experts.%d.down_proj.weight", e);
		tl_add(l, MS_DTYPE_BF16, 2, 32, 64, 0,
		       "model.layers.1.mlp.experts.%d.gate_proj.weight", e);
	}
	tl_add(l, MS_DTYPE_BF16, 2, 64, 64, 0, "model.layers.0.self_attn.q_proj.weight");
	tl_add(l, MS_DTYPE_BF16, 2, 64, 64, 0, "model.layers.1.self_attn.q_proj.weight");
	tl_add(l, MS_DTYPE_BF16, 1, 64, 0, 0, "model.layers.0.input_layernorm.weight");
	tl_add(l, MS_DTYPE_BF16, 2, 8, 64, 0, "model.layers.0.mlp.gate.weight");
	tl_add(l, MS_DTYPE_BF16, 2, 100, 64, 0, "model.embed_tokens.weight");
}

static struct tlist L0, L1;

/* ---- sizes -------------------------------------------------------------------- */

static int test_nvfp4_bytes(void)
{
	uint64_t b;

	/* [32,64]: 32*64/2 + 32*64/16 + 4 */
	T_ASSERT_EQ_INT(ms_fp_nvfp4_bytes(32, 64, 0, &b), MS_OK);
	T_ASSERT_EQ_INT(b, 1024 + 128 + 4);
	T_ASSERT_EQ_INT(ms_fp_nvfp4_bytes(32, 64, 1, &b), MS_OK);
	T_ASSERT_EQ_INT(b, 1156);
	/* ragged [30,50] rowwise: cols pad to 64 -> 30*64/2 + 30*64/16 + 4
	 * = 960 + 120 + 4 */
	T_ASSERT_EQ_INT(ms_fp_nvfp4_bytes(30, 50, 0, &b), MS_OK);
	T_ASSERT_EQ_INT(b, 1084);
	/* columnwise is W^T [50,30]: 30 pads to 32 -> 50*32/2 + 50*32/16 + 4
	 * = 800 + 100 + 4 */
	T_ASSERT_EQ_INT(ms_fp_nvfp4_bytes(30, 50, 1, &b), MS_OK);
	T_ASSERT_EQ_INT(b, 904);
	/* [1,1]: one block of 16 -> 8 + 1 + 4 */
	T_ASSERT_EQ_INT(ms_fp_nvfp4_bytes(1, 1, 0, &b), MS_OK);
	T_ASSERT_EQ_INT(b, 13);
	T_ASSERT(ms_fp_nvfp4_bytes(UINT64_MAX / 2, 64, 0, &b) != MS_OK);
	return 0;
}

static int test_quantizable_rule(void)
{
	uint64_t s2[2] = { 32, 64 }, s1[1] = { 64 }, s3[3] = { 8, 32, 64 };

	T_ASSERT(ms_fp_quantizable("model.layers.0.self_attn.q_proj.weight", MS_DTYPE_BF16, 2, s2));
	T_ASSERT(ms_fp_quantizable("model.layers.0.mlp.experts.3.down_proj.weight", MS_DTYPE_F32, 2, s2));
	T_ASSERT(ms_fp_quantizable("model.layers.0.mlp.shared_expert.up_proj.weight", MS_DTYPE_F16, 2, s2));
	T_ASSERT(ms_fp_quantizable("model.layers.0.mlp.down_proj.weight", MS_DTYPE_BF16, 2, s2));
	/* fused 3-D experts are quantized, as msconvert does */
	T_ASSERT(ms_fp_quantizable("model.layers.0.mlp.experts.gate_up_proj", MS_DTYPE_BF16, 3, s3));
	T_ASSERT(ms_fp_quantizable("model.layers.0.mlp.experts.down_proj", MS_DTYPE_F32, 3, s3));
	T_ASSERT(!ms_fp_quantizable("model.layers.0.mlp.experts.gate_up_proj", MS_DTYPE_U8, 3, s3));
	T_ASSERT(!ms_fp_quantizable("model.layers.0.mlp.experts.gate_up_proj", MS_DTYPE_BF16, 2, s2));
	/* kept at their dtype */
	T_ASSERT(!ms_fp_quantizable("model.embed_tokens.weight", MS_DTYPE_BF16, 2, s2));
	T_ASSERT(!ms_fp_quantizable("lm_head.weight", MS_DTYPE_BF16, 2, s2));
	T_ASSERT(!ms_fp_quantizable("model.layers.0.mlp.gate.weight", MS_DTYPE_BF16, 2, s2));
	T_ASSERT(!ms_fp_quantizable("model.layers.0.input_layernorm.weight", MS_DTYPE_BF16, 1, s1));
	T_ASSERT(!ms_fp_quantizable("model.layers.0.self_attn.q_proj.bias", MS_DTYPE_BF16, 2, s2));
	T_ASSERT(!ms_fp_quantizable("model.layers.0.self_attn.q_proj.weight", MS_DTYPE_U8, 2, s2));
	T_ASSERT(!ms_fp_quantizable("model.layers.0.self_attn.q_proj.weight", MS_DTYPE_F8_E4M3, 2, s2));
	T_ASSERT(!ms_fp_quantizable("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
				    MS_DTYPE_F32, 2, s2));
	/* the one rule behind both (names.h): without a shape a fused 3-D
	 * weight is not tested, with one it is */
	{
		const char *fused = "model.layers.0.mlp.experts.gate_up_proj";
		struct ms_name_info info;

		T_ASSERT_EQ_INT(ms_name_parse(fused, &info), MS_OK);
		T_ASSERT(!ms_name_quantizable(fused, &info, MS_DTYPE_BF16, 3, NULL));
		T_ASSERT(ms_name_quantizable(fused, &info, MS_DTYPE_BF16, 3, s3));
	}
	return 0;
}

/* The planner quantizes exactly what msconvert quantizes by default: every
 * tensor of every bundled checkpoint, and names of the other families. */
static int same_as_msconvert(const char *name, enum ms_dtype dt, uint32_t ndim,
			     const uint64_t *shape)
{
	struct ms_tensor t;

	memset(&t, 0, sizeof(t));
	t.name = name;
	t.dtype = dt;
	t.ndim = ndim;
	memcpy(t.shape, shape, ndim * sizeof(*shape));
	return !ms_fp_quantizable(name, dt, ndim, shape) ==
	       !ms_quant_default_selected(&t);
}

static int test_rule_matches_msconvert(void)
{
	static const char *const dirs[] = {
		"hf/qwen3moe", "hf/mixtral-sharded", "peft/qwen3moe-E8-r4/base",
		"peft/qwen3moe-E8-r4/adapter",
	};
	static const char *const names[] = {
		"model.layers.0.mlp.experts.gate_up_proj",
		"model.layers.0.mlp.experts.down_proj.weight",
		"decoder.layers.0.mlp.experts.linear_fc1.weight7",
		"decoder.layers.0.mlp.experts.local_experts.7.linear_fc1.weight",
		"model.layers.0.mlp.shared_expert_gate.weight",
		"model.layers.0.mlp.router.weight",
		"model.layers.0.self_attn.q_proj.weight_packed",
		"model.layers.0.self_attn.q_proj.weight_colwise",
		"model.layers.0.mlp.down_proj.weight",
		"model.layers.0.self_attn.linear_qkv.layer_norm_weight",
		"lm_head.weight", "output.weight", "model.norm.weight", ".weight",
	};
	static const enum ms_dtype dts[] = { MS_DTYPE_BF16, MS_DTYPE_F32, MS_DTYPE_U8 };
	uint64_t shape[3] = { 16, 32, 8 };
	size_t selected = 0;

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		struct ms_ckpt *ck;
		struct ms_err err;
		char path[512];

		snprintf(path, sizeof(path), "%s/%s", T_FIXTURES, dirs[i]);
		T_ASSERT_MSG(ms_ckpt_open(path, &ck, &err) == MS_OK, "%s", err.msg);
		for (size_t k = 0; k < ck->ntensors; k++) {
			const struct ms_tensor *t = ck->tensors[k];

			T_ASSERT_MSG(same_as_msconvert(t->name, t->dtype, t->ndim, t->shape),
				     "%s", t->name);
			selected += ms_fp_quantizable(t->name, t->dtype, t->ndim, t->shape) != 0;
		}
		ms_ckpt_close(ck);
	}
	/* qwen3moe 56, mixtral 2 layers x (4 attention + 8 x 3 experts),
	 * the peft base 56 */
	T_ASSERT_EQ_INT(selected, 56 + 56 + 56);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
			for (uint32_t nd = 1; nd <= 3; nd++)
				T_ASSERT_MSG(same_as_msconvert(names[i], dts[d], nd, shape),
					     "%s ndim %u", names[i], nd);
	return 0;
}

/* ---- the hand-checked plans -------------------------------------------------- */

static int test_rowwise(void)
{
	struct tlist *lists[] = { &L0 };
	const struct ms_fp_row *row, *asis;
	struct run r;

	hand_model(&L0);
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": [{\"role\": \"base\","
				     " \"state\": \"base-bf16\", \"repr\": \"nvfp4-rowwise\"}]}",
				 lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->nrows, 2);
	row = find_row(r.rep, "base", MS_FP_LAYOUT_NVFP4_ROWWISE);
	asis = find_row(r.rep, "base", MS_FP_LAYOUT_AS_IS);
	T_ASSERT(row && asis);
	T_ASSERT_EQ_INT(row->ntensors, 26);
	T_ASSERT_EQ_INT(row->nweights, 26);
	T_ASSERT_EQ_INT(row->replicated_bytes, 4616);
	T_ASSERT_EQ_INT(row->expert_bytes_per_gpu, 6936);
	T_ASSERT_EQ_INT(row->bytes_per_gpu, 11552);
	T_ASSERT_EQ_INT(row->model_bytes, 32360);
	T_ASSERT_EQ_INT(row->duplicate_bytes_per_gpu, 0);
	T_ASSERT_EQ_INT(asis->ntensors, 3);
	T_ASSERT_EQ_INT(asis->replicated_bytes, 13952);
	T_ASSERT_EQ_INT(asis->bytes_per_gpu, 13952);
	/* 11552 + 13952 */
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 25504);
	T_ASSERT_EQ_INT(r.rep->ndups, 0);
	T_ASSERT_EQ_INT(r.rep->duplicate_weights, 0);
	T_ASSERT_EQ_INT(r.rep->ondemand_total_bytes_per_gpu, 25504);
	T_ASSERT_EQ_INT(r.rep->ondemand_saving_per_gpu, 0);
	T_ASSERT(!r.rep->has_budget && !r.rep->over_budget);
	run_free(&r);
	return 0;
}

/*
 * nvfp4-both: the columnwise copy costs what the rowwise one does, so the
 * frozen base doubles: 2 * 11552 + 13952 = 37056 per GPU. All 26 weights
 * are resident twice: 23104 per GPU, 11552 beyond one copy.
 * On demand instead: rowwise resident + the largest layer's columnwise
 * (layer 0: 6932) = 11552 + 13952 + 6932 = 32436, saving 37056 - 32436 =
 * 4620 (= 11552 - 6932).
 */
static int test_both_doubles(void)
{
	struct tlist *lists[] = { &L0 };
	const struct ms_fp_row *row, *col;
	struct ms_buf b;
	struct run r;

	hand_model(&L0);
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": [{\"role\": \"base\","
				     " \"state\": \"base-bf16\", \"repr\": \"nvfp4-both\"}]}",
				 lists), MS_OK);
	row = find_row(r.rep, "base", MS_FP_LAYOUT_NVFP4_ROWWISE);
	col = find_row(r.rep, "base", MS_FP_LAYOUT_NVFP4_COLUMNWISE);
	T_ASSERT(row && col);
	T_ASSERT_EQ_INT(row->bytes_per_gpu, 11552);
	T_ASSERT_EQ_INT(col->bytes_per_gpu, 11552);
	T_ASSERT_EQ_INT(col->replicated_bytes, 4616);
	T_ASSERT_EQ_INT(col->expert_bytes_per_gpu, 6936);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 37056);
	T_ASSERT_EQ_INT(row->duplicate_bytes_per_gpu, 11552);
	T_ASSERT_EQ_INT(col->duplicate_bytes_per_gpu, 11552);
	T_ASSERT_EQ_INT(r.rep->duplicate_weights, 26);
	T_ASSERT_EQ_INT(r.rep->ndups, 1);
	T_ASSERT_EQ_INT(r.rep->dups[0].nrows, 2);
	T_ASSERT_EQ_INT(r.rep->dups[0].nweights, 26);
	T_ASSERT_EQ_INT(r.rep->dups[0].bytes_per_gpu, 23104);
	T_ASSERT_EQ_INT(r.rep->dups[0].excess_bytes_per_gpu, 11552);
	T_ASSERT_EQ_INT(col->ondemand_saving_per_gpu, 4620);
	T_ASSERT_EQ_INT(row->ondemand_saving_per_gpu, 0);
	T_ASSERT_EQ_INT(r.rep->ondemand_total_bytes_per_gpu, 32436);
	T_ASSERT_EQ_INT(r.rep->ondemand_saving_per_gpu, 4620);

	ms_buf_init(&b);
	T_ASSERT_EQ_INT(ms_fp_report_text(r.rep, &b, &r.err), MS_OK);
	T_ASSERT(b.data && strstr(b.data, "duplicate: 26 weights resident 2 times"));
	T_ASSERT(strstr(b.data, "total: 37056 bytes"));
	ms_buf_release(&b);
	ms_buf_init(&b);
	T_ASSERT_EQ_INT(ms_fp_report_json(r.rep, &b, &r.err), MS_OK);
	T_ASSERT(b.data && strstr(b.data, "\"total_bytes_per_gpu\":\t37056"));
	T_ASSERT(strstr(b.data, "\"over_budget\":\tfalse"));
	ms_buf_release(&b);
	run_free(&r);
	return 0;
}

static int test_ondemand(void)
{
	struct tlist *lists[] = { &L0 };
	const struct ms_fp_row *row, *tr;
	struct run r;

	hand_model(&L0);
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": [{\"role\": \"base\","
				     " \"state\": \"base-bf16\", \"repr\": \"nvfp4-ondemand\"}]}",
				 lists), MS_OK);
	row = find_row(r.rep, "base", MS_FP_LAYOUT_NVFP4_ROWWISE);
	tr = find_row(r.rep, "base", MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT);
	T_ASSERT(row && tr);
	T_ASSERT(!find_row(r.rep, "base", MS_FP_LAYOUT_NVFP4_COLUMNWISE));
	T_ASSERT_EQ_INT(row->bytes_per_gpu, 11552);
	/* layer 0 is the larger: 2308 + 4624 */
	T_ASSERT_EQ_INT(tr->bytes_per_gpu, 6932);
	T_ASSERT_EQ_INT(tr->peak_layer, 0);
	T_ASSERT_EQ_INT(tr->replicated_bytes, 2308);
	T_ASSERT_EQ_INT(tr->expert_bytes_per_gpu, 4624);
	/* layer 0 whole: 2308 + 16 * 1156 */
	T_ASSERT_EQ_INT(tr->model_bytes, 20804);
	T_ASSERT_EQ_INT(tr->ondemand_saving_per_gpu, 4620);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 32436);
	T_ASSERT_EQ_INT(r.rep->ndups, 0);
	/* nothing left to build on demand */
	T_ASSERT_EQ_INT(r.rep->ondemand_saving_per_gpu, 0);
	T_ASSERT_EQ_INT(r.rep->ondemand_total_bytes_per_gpu, 32436);
	run_free(&r);
	return 0;
}

/*
 * The base named twice: one state rowwise, one columnwise. Both hold the
 * bf16 leftovers too, so those are duplicates as well:
 *   total 2 * 11552 + 2 * 13952 = 51008
 *   group 1: 26 weights (base rowwise, base_colwise columnwise): 23104, 11552
 *   group 2: 3 tensors (base as-is, base_colwise as-is): 27904, 13952
 * Building base_colwise per layer from base's rowwise saves 4620 as above.
 */
static int test_base_named_twice(void)
{
	struct tlist *lists[] = { &L0, &L0 };
	const struct ms_fp_row *col;
	struct run r;
	int seen = 0;

	hand_model(&L0);
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": ["
				     "{\"role\": \"base\", \"state\": \"b\", \"repr\": \"nvfp4-rowwise\"},"
				     "{\"role\": \"base_colwise\", \"state\": \"b\", \"repr\": \"nvfp4-columnwise\"}]}",
				 lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->nrows, 4);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 51008);
	T_ASSERT_EQ_INT(r.rep->ndups, 2);
	T_ASSERT_EQ_INT(r.rep->duplicate_weights, 29);
	for (size_t g = 0; g < r.rep->ndups; g++) {
		const struct ms_fp_dup *d = &r.rep->dups[g];
		const struct ms_fp_row *a = &r.rep->rows[d->rows[0]];

		T_ASSERT_EQ_INT(d->nrows, 2);
		if (a->layout == MS_FP_LAYOUT_NVFP4_ROWWISE) {
			T_ASSERT_EQ_INT(d->nweights, 26);
			T_ASSERT_EQ_INT(d->bytes_per_gpu, 23104);
			T_ASSERT_EQ_INT(d->excess_bytes_per_gpu, 11552);
			T_ASSERT_EQ_INT(r.rep->rows[d->rows[1]].layout,
					MS_FP_LAYOUT_NVFP4_COLUMNWISE);
			T_ASSERT_STR(r.rep->rows[d->rows[1]].role, "base_colwise");
			seen |= 1;
		} else {
			T_ASSERT_EQ_INT(a->layout, MS_FP_LAYOUT_AS_IS);
			T_ASSERT_EQ_INT(d->nweights, 3);
			T_ASSERT_EQ_INT(d->bytes_per_gpu, 27904);
			T_ASSERT_EQ_INT(d->excess_bytes_per_gpu, 13952);
			seen |= 2;
		}
	}
	T_ASSERT_EQ_INT(seen, 3);
	col = find_row(r.rep, "base_colwise", MS_FP_LAYOUT_NVFP4_COLUMNWISE);
	T_ASSERT(col);
	T_ASSERT_EQ_INT(col->ondemand_saving_per_gpu, 4620);
	T_ASSERT_EQ_INT(r.rep->ondemand_total_bytes_per_gpu, 51008 - 4620);
	run_free(&r);
	return 0;
}

/*
 * bf16: q_proj 2 * 8192 replicated = 16384; experts per GPU: layer 0
 * 4 * 4096, layer 1 2 * 4096 = 24576; row 40960, total 40960 + 13952.
 */
static int test_bf16(void)
{
	struct tlist *lists[] = { &L0 };
	const struct ms_fp_row *row;
	struct run r;

	hand_model(&L0);
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": [{\"role\": \"base\","
				     " \"state\": \"base-bf16\", \"repr\": \"bf16\"}]}",
				 lists), MS_OK);
	row = find_row(r.rep, "base", MS_FP_LAYOUT_BF16);
	T_ASSERT(row);
	T_ASSERT_EQ_INT(row->replicated_bytes, 16384);
	T_ASSERT_EQ_INT(row->expert_bytes_per_gpu, 24576);
	T_ASSERT_EQ_INT(row->bytes_per_gpu, 40960);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 54912);
	run_free(&r);

	/* as-is counts the same bytes, all in the as-is row */
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": [{\"role\": \"base\","
				     " \"state\": \"base-bf16\"}]}", lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->nrows, 1);
	T_ASSERT_EQ_INT(r.rep->rows[0].nweights, 26);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 54912);
	run_free(&r);
	return 0;
}

/* A ragged projection: rowwise 1084, columnwise 904 (see test_nvfp4_bytes). */
static int test_ragged_plan(void)
{
	struct tlist *lists[] = { &L0 };
	struct run r;

	L0.n = 0;
	tl_add(&L0, MS_DTYPE_BF16, 2, 30, 50, 0, "model.layers.0.self_attn.o_proj.weight");
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 2, \"states\": [{\"role\": \"b\","
				     " \"state\": \"x\", \"repr\": \"nvfp4-both\"}]}", lists),
			MS_OK);
	T_ASSERT_EQ_INT(find_row(r.rep, "b", MS_FP_LAYOUT_NVFP4_ROWWISE)->bytes_per_gpu, 1084);
	T_ASSERT_EQ_INT(find_row(r.rep, "b", MS_FP_LAYOUT_NVFP4_COLUMNWISE)->bytes_per_gpu, 904);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 1988);
	/* one layer: on demand holds the same columnwise bytes, saves nothing */
	T_ASSERT_EQ_INT(r.rep->ondemand_saving_per_gpu, 0);
	run_free(&r);
	return 0;
}

/*
 * Replicated against expert-sharded, EP = 4, as-is:
 *   shared_expert.up_proj [32,64] bf16: 4096 on every GPU
 *   fused experts.gate_up_proj [8,64,32] bf16: 8*64*32*2 = 32768, split
 *   evenly: 8192 per GPU
 *   nvfp4-rowwise: the shared expert becomes 1156; the fused tensor is
 *   quantized as msconvert does: per expert (default) a gate and an up
 *   [32,32], 2 * (512 + 64 + 4) = 1160 per expert, 9280 in all, 2320 per
 *   GPU; "experts": "fused" one [64,32] with one tensor scale per expert,
 *   1024 + 128 + 4 = 1156 per expert, 9248 in all, 2312 per GPU
 */
static int test_replicated_vs_expert(void)
{
	struct tlist *lists[] = { &L0 };
	const struct ms_fp_row *row;
	struct run r;

	L0.n = 0;
	tl_add(&L0, MS_DTYPE_BF16, 2, 32, 64, 0, "model.layers.0.mlp.shared_expert.up_proj.weight");
	tl_add(&L0, MS_DTYPE_BF16, 3, 8, 64, 32, "model.layers.0.mlp.experts.gate_up_proj");
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": [{\"role\": \"b\","
				     " \"state\": \"x\"}]}", lists), MS_OK);
	row = find_row(r.rep, "b", MS_FP_LAYOUT_AS_IS);
	T_ASSERT(row);
	T_ASSERT_EQ_INT(row->replicated_bytes, 4096);
	T_ASSERT_EQ_INT(row->expert_bytes_per_gpu, 8192);
	T_ASSERT_EQ_INT(row->bytes_per_gpu, 12288);
	T_ASSERT_EQ_INT(row->model_bytes, 4096 + 32768);
	run_free(&r);

	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": [{\"role\": \"b\","
				     " \"state\": \"x\", \"repr\": \"nvfp4-rowwise\"}]}", lists),
			MS_OK);
	row = find_row(r.rep, "b", MS_FP_LAYOUT_NVFP4_ROWWISE);
	T_ASSERT(row);
	T_ASSERT_EQ_INT(row->replicated_bytes, 1156);
	T_ASSERT_EQ_INT(row->expert_bytes_per_gpu, 2320);
	T_ASSERT_EQ_INT(row->model_bytes, 1156 + 9280);
	T_ASSERT(!find_row(r.rep, "b", MS_FP_LAYOUT_AS_IS) ||
		 find_row(r.rep, "b", MS_FP_LAYOUT_AS_IS)->bytes_per_gpu == 0);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 1156 + 2320);
	run_free(&r);

	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": [{\"role\": \"b\","
				     " \"state\": \"x\", \"repr\": \"nvfp4-rowwise\","
				     " \"experts\": \"fused\"}]}", lists),
			MS_OK);
	row = find_row(r.rep, "b", MS_FP_LAYOUT_NVFP4_ROWWISE);
	T_ASSERT(row);
	T_ASSERT_EQ_INT(row->expert_bytes_per_gpu, 2312);
	T_ASSERT_EQ_INT(row->model_bytes, 1156 + 9248);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 1156 + 2312);
	run_free(&r);

	/* 8 experts do not divide over 3 ranks */
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 3, \"states\": [{\"role\": \"b\","
				     " \"state\": \"x\"}]}", lists), MS_EINVAL);
	T_ASSERT_MSG(strstr(r.err.msg, "layer 0 has 8 routed experts") &&
		     strstr(r.err.msg, "ep_size 3"), "%s", r.err.msg);
	run_free(&r);
	return 0;
}

/*
 * Placement. Experts 0 and 1 hold [16,16] bf16 (512 bytes each), expert 7
 * a [1,16] (32 bytes), so E = 8; EP = 4.
 *   contiguous: rank 0 owns 0,1 -> 1024; rank 3 owns 6,7 -> 32: 1024
 *   round-robin: rank 0 owns 0,4 -> 512; rank 1 owns 1,5 -> 512: 512
 */
static int test_placement(void)
{
	struct tlist *lists[] = { &L0 };
	struct run r;

	L0.n = 0;
	tl_add(&L0, MS_DTYPE_BF16, 2, 16, 16, 0, "model.layers.0.mlp.experts.0.up_proj.weight");
	tl_add(&L0, MS_DTYPE_BF16, 2, 16, 16, 0, "model.layers.0.mlp.experts.1.up_proj.weight");
	tl_add(&L0, MS_DTYPE_BF16, 2, 1, 16, 0, "model.layers.0.mlp.experts.7.up_proj.weight");
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"placement\": \"contiguous\","
				     " \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
				 lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 1024);
	T_ASSERT_EQ_INT(r.rep->peak_rank, 0);
	run_free(&r);
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"placement\": \"round-robin\","
				     " \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
				 lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 512);
	T_ASSERT_EQ_INT(r.rep->peak_rank, 0);
	run_free(&r);
	/* num_experts 16: contiguous ranks own 4 each: rank 0 owns 0..3 */
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"num_experts\": 16,"
				     " \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
				 lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 1024);
	run_free(&r);
	/* rank 1 carries more: experts 2 and 3 at [16,32] -> 2048 */
	tl_add(&L0, MS_DTYPE_BF16, 2, 16, 32, 0, "model.layers.0.mlp.experts.2.up_proj.weight");
	tl_add(&L0, MS_DTYPE_BF16, 2, 16, 32, 0, "model.layers.0.mlp.experts.3.up_proj.weight");
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": [{\"role\": \"b\","
				     " \"state\": \"x\"}]}", lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 2048);
	T_ASSERT_EQ_INT(r.rep->peak_rank, 1);
	run_free(&r);
	/* num_experts below what the tensors show */
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"num_experts\": 4,"
				     " \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
				 lists), MS_EINVAL);
	T_ASSERT_MSG(strstr(r.err.msg, "num_experts"), "%s", r.err.msg);
	run_free(&r);
	return 0;
}

/* E = 6 at EP = 4: an error under either placement, naming the layer. */
static int test_not_divisible(void)
{
	struct tlist *lists[] = { &L0 };
	static const char *const plans[] = {
		"{\"ep_size\": 4, \"placement\": \"contiguous\", \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
		"{\"ep_size\": 4, \"placement\": \"round-robin\", \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	};
	struct run r;

	L0.n = 0;
	for (int e = 0; e < 6; e++)
		tl_add(&L0, MS_DTYPE_BF16, 2, 16, 16, 0, "model.layers.5.mlp.experts.%d.w1.weight", e);
	for (size_t i = 0; i < 2; i++) {
		T_ASSERT_EQ_INT(run_plan(&r, plans[i], lists), MS_EINVAL);
		T_ASSERT_MSG(strstr(r.err.msg, "plan 't.json'") &&
			     strstr(r.err.msg, "layer 5 has 6 routed experts") &&
			     strstr(r.err.msg, "not divisible by ep_size 4"), "%s",
			     r.err.msg);
		run_free(&r);
	}
	/* the same at EP 2 and 3 divides */
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 3, \"placement\": \"round-robin\","
				     " \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
				 lists), MS_OK);
	/* 2 experts of 512 per rank */
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 1024);
	run_free(&r);
	return 0;
}

/*
 * Budget: the rowwise plan totals 25504 bytes per GPU. 25504 / 2^30 and
 * 25503 / 2^30 are exact decimals, so the budget is exact bytes.
 */
static int test_budget(void)
{
	struct tlist *lists[] = { &L0 };
	struct ms_buf b;
	struct run r;

	hand_model(&L0);
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"budget_gib\": 0.0000237524509429931640625,"
				     " \"states\": [{\"role\": \"base\", \"state\": \"b\","
				     " \"repr\": \"nvfp4-rowwise\"}]}", lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->budget_bytes, 25504);
	T_ASSERT(r.rep->has_budget && !r.rep->over_budget);
	run_free(&r);
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"budget_gib\": 0.000023751519620418548583984375,"
				     " \"states\": [{\"role\": \"base\", \"state\": \"b\","
				     " \"repr\": \"nvfp4-rowwise\"}]}", lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->budget_bytes, 25503);
	T_ASSERT(r.rep->over_budget);
	ms_buf_init(&b);
	T_ASSERT_EQ_INT(ms_fp_report_text(r.rep, &b, &r.err), MS_OK);
	T_ASSERT_MSG(strstr(b.data, "over by 1 B"), "%s", b.data);
	ms_buf_release(&b);
	run_free(&r);
	/* 80 GiB */
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"budget_gib\": 80,"
				     " \"states\": [{\"role\": \"base\", \"state\": \"b\"}]}",
				 lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->budget_bytes, 80ull << 30);
	T_ASSERT(!r.rep->over_budget);
	run_free(&r);
	return 0;
}

/*
 * Tensors already quantized count as they are: a modelopt rowwise weight
 * [32,64] (U8 [32,32] + F8_E4M3 [32,4] + F32 []) = 1024 + 128 + 4 = 1156,
 * and its columnwise copy in the same state = 1156 more: a duplicate.
 * An FP8 weight's scales stay with it in the as-is row (no duplicate).
 */
static int test_as_is_quantized(void)
{
	struct tlist *lists[] = { &L0 };
	const struct ms_fp_row *row, *col, *asis;
	struct run r;

	L0.n = 0;
	tl_add(&L0, MS_DTYPE_U8, 2, 32, 32, 0, "model.layers.0.self_attn.q_proj.weight");
	tl_add(&L0, MS_DTYPE_F8_E4M3, 2, 32, 4, 0, "model.layers.0.self_attn.q_proj.weight_scale");
	tl_add(&L0, MS_DTYPE_F32, 0, 0, 0, 0, "model.layers.0.self_attn.q_proj.weight_scale_2");
	tl_add(&L0, MS_DTYPE_U8, 2, 64, 16, 0, "model.layers.0.self_attn.q_proj.weight_colwise");
	tl_add(&L0, MS_DTYPE_F8_E4M3, 2, 64, 2, 0, "model.layers.0.self_attn.q_proj.weight_colwise_scale");
	tl_add(&L0, MS_DTYPE_F32, 0, 0, 0, 0, "model.layers.0.self_attn.q_proj.weight_colwise_scale_2");
	tl_add(&L0, MS_DTYPE_F8_E4M3, 2, 32, 64, 0, "model.layers.0.self_attn.k_proj.weight");
	tl_add(&L0, MS_DTYPE_F32, 0, 0, 0, 0, "model.layers.0.self_attn.k_proj.weight_scale");
	tl_add(&L0, MS_DTYPE_F32, 0, 0, 0, 0, "model.layers.0.self_attn.k_proj.input_scale");
	/* every repr: already-quantized tensors are not converted again */
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 1, \"states\": [{\"role\": \"q\","
				     " \"state\": \"x\", \"repr\": \"nvfp4-both\"}]}", lists),
			MS_OK);
	row = find_row(r.rep, "q", MS_FP_LAYOUT_NVFP4_ROWWISE);
	col = find_row(r.rep, "q", MS_FP_LAYOUT_NVFP4_COLUMNWISE);
	asis = find_row(r.rep, "q", MS_FP_LAYOUT_AS_IS);
	T_ASSERT(row && col && asis);
	T_ASSERT_EQ_INT(row->ntensors, 3);
	T_ASSERT_EQ_INT(row->bytes_per_gpu, 1156);
	T_ASSERT_EQ_INT(col->ntensors, 3);
	T_ASSERT_EQ_INT(col->bytes_per_gpu, 1156);
	/* 32*64 + 4 + 4 */
	T_ASSERT_EQ_INT(asis->ntensors, 3);
	T_ASSERT_EQ_INT(asis->bytes_per_gpu, 2056);
	T_ASSERT_EQ_INT(r.rep->ndups, 1);
	T_ASSERT_EQ_INT(r.rep->duplicate_weights, 1);
	T_ASSERT_STR(r.rep->dups[0].example, "model.layers.0.self_attn.q_proj");
	T_ASSERT_EQ_INT(r.rep->dups[0].bytes_per_gpu, 2312);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 1156 + 1156 + 2056);
	run_free(&r);
	return 0;
}

/* A bf16 base and an NVFP4 copy of it in one plan: two layouts resident. */
static int test_bf16_and_nvfp4(void)
{
	struct tlist *lists[] = { &L0, &L0 };
	struct run r;

	L0.n = 0;
	tl_add(&L0, MS_DTYPE_BF16, 2, 32, 64, 0, "model.layers.0.mlp.experts.0.up_proj.weight");
	tl_add(&L0, MS_DTYPE_BF16, 2, 32, 64, 0, "model.layers.0.mlp.experts.1.up_proj.weight");
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 2, \"states\": ["
				     "{\"role\": \"ref\", \"state\": \"x\"},"
				     "{\"role\": \"base\", \"state\": \"x\", \"repr\": \"nvfp4-rowwise\"}]}",
				 lists), MS_OK);
	/* rank k holds expert k: 4096 + 1156 */
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 5252);
	T_ASSERT_EQ_INT(r.rep->duplicate_weights, 2);
	T_ASSERT_EQ_INT(r.rep->ndups, 1);
	T_ASSERT_EQ_INT(r.rep->dups[0].bytes_per_gpu, 5252);
	/* one copy beyond the smallest (the NVFP4 one) */
	T_ASSERT_EQ_INT(r.rep->dups[0].excess_bytes_per_gpu, 4096);
	/* no rowwise/columnwise pair: nothing to build on demand */
	T_ASSERT_EQ_INT(r.rep->ondemand_saving_per_gpu, 0);
	run_free(&r);
	return 0;
}

static int test_calc_errors(void)
{
	struct tlist *lists[] = { &L0, &L1 };
	struct run r;

	/* a tensor listed twice in one entry */
	L0.n = 0;
	tl_add(&L0, MS_DTYPE_BF16, 2, 16, 16, 0, "a.weight");
	tl_add(&L0, MS_DTYPE_BF16, 2, 16, 16, 0, "a.weight");
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 1, \"states\": [{\"role\": \"b\","
				     " \"state\": \"x\"}]}", lists), MS_EINVAL);
	T_ASSERT_MSG(strstr(r.err.msg, "entry 'b': tensor 'a.weight' listed twice"),
		     "%s", r.err.msg);
	run_free(&r);
	/* an entry left without tensors */
	L0.n = 1;
	L1.n = 0;
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 1, \"states\": [{\"role\": \"b\","
				     " \"state\": \"x\"}, {\"role\": \"c\", \"state\": \"y\"}]}",
				 lists), MS_EINVAL);
	T_ASSERT_MSG(strstr(r.err.msg, "entry 'c' has no tensors"), "%s", r.err.msg);
	run_free(&r);
	/* a fused LoRA factor with nothing saying the expert count */
	L0.n = 0;
	tl_add(&L0, MS_DTYPE_F32, 2, 32, 64, 0,
	       "base_model.model.model.layers.0.mlp.experts.lora_A.weight");
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"states\": [{\"role\": \"b\","
				     " \"state\": \"x\"}]}", lists), MS_EINVAL);
	T_ASSERT_MSG(strstr(r.err.msg, "give num_experts"), "%s", r.err.msg);
	run_free(&r);
	/* ... which num_experts settles: 8192 bytes split over 4 */
	T_ASSERT_EQ_INT(run_plan(&r, "{\"ep_size\": 4, \"num_experts\": 8, \"states\":"
				     " [{\"role\": \"b\", \"state\": \"x\"}]}", lists), MS_OK);
	T_ASSERT_EQ_INT(r.rep->total_bytes_per_gpu, 2048);
	run_free(&r);
	/* a bad tensor: the call keeps nothing */
	{
		struct ms_fp_plan *p;
		struct ms_fp_calc *c;
		struct ms_fp_report *rep;
		struct ms_err err;
		const char *j = "{\"ep_size\": 1, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}";

		T_ASSERT_EQ_INT(ms_fp_plan_parse(j, strlen(j), "t.json", &p, &err), MS_OK);
		T_ASSERT_EQ_INT(ms_fp_calc_new(p, &c, &err), MS_OK);
		L0.n = 0;
		tl_add(&L0, MS_DTYPE_BF16, 2, 16, 16, 0, "ok.weight");
		tl_add(&L0, MS_DTYPE_BF16, 2, UINT64_MAX / 2, 16, 0, "huge.weight");
		T_ASSERT_EQ_INT(ms_fp_calc_add_tensors(c, 0, L0.t, L0.n, &err), MS_EINVAL);
		T_ASSERT_MSG(strstr(err.msg, "tensor 'huge.weight'"), "%s", err.msg);
		T_ASSERT_EQ_INT(ms_fp_calc_add_tensors(c, 0, L0.t, 1, &err), MS_OK);
		T_ASSERT_EQ_INT(ms_fp_calc_finish(c, &rep, &err), MS_OK);
		T_ASSERT_EQ_INT(rep->total_bytes_per_gpu, 512);
		T_ASSERT_EQ_INT(ms_fp_calc_add_tensors(c, 1, L0.t, 1, &err), MS_EINVAL);
		ms_fp_report_free(rep);
		ms_fp_calc_free(c);
		ms_fp_plan_free(p);
	}
	return 0;
}

/* ---- the parser ---------------------------------------------------------------- */

static int test_parse_good(void)
{
	static const char j[] =
		"{\"name\": \"grpo-run\", \"ep_size\": 8, \"placement\": \"round-robin\","
		" \"budget_gib\": 80, \"trainer\": {\"kl\": 0.1, \"ep_size\": \"ignored\"},"
		" \"states\": ["
		"  {\"role\": \"base\", \"state\": \"sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"},"
		"  {\"role\": \"base_colwise\", \"state\": \"label\", \"digest\": 5},"
		"  {\"role\": \"adapter\", \"path\": \"/ckpt/adapter\", \"repr\": \"as-is\"},"
		"  {\"role\": \"ref.v2\", \"path\": \"ckpt/model\", \"repr\": \"nvfp4-both\"}],"
		" \"outputs\": \"/runs/x\"}";
	struct ms_fp_plan *p;
	struct ms_err err;

	T_ASSERT_EQ_INT(ms_fp_plan_parse(j, strlen(j), "run.json", &p, &err), MS_OK);
	T_ASSERT_STR(p->name, "grpo-run");
	T_ASSERT_STR(p->label, "run.json");
	T_ASSERT_STR(p->outputs, "/runs/x");
	T_ASSERT_EQ_INT(p->ep_size, 8);
	T_ASSERT_EQ_INT(p->placement, MS_FP_PLACEMENT_ROUND_ROBIN);
	T_ASSERT(p->has_budget);
	T_ASSERT_EQ_INT(p->budget_bytes, 80ull << 30);
	T_ASSERT_EQ_INT(p->num_experts, 0);
	T_ASSERT_EQ_INT(p->nentries, 4);
	T_ASSERT_STR(p->entries[0].role, "base");
	T_ASSERT(p->entries[0].path == NULL && p->entries[0].resolved == NULL);
	T_ASSERT_EQ_INT(p->entries[0].repr, MS_FP_REPR_AS_IS);
	T_ASSERT_STR(p->entries[1].state, "label");
	T_ASSERT_STR(p->entries[2].path, "/ckpt/adapter");
	T_ASSERT_STR(p->entries[3].resolved, "ckpt/model");
	T_ASSERT_EQ_INT(p->entries[3].repr, MS_FP_REPR_NVFP4_BOTH);
	ms_fp_plan_free(p);
	return 0;
}

struct bad {
	const char *json;
	const char *msg;  /* expected in the error, after "plan 'bad.json': " */
};

static const struct bad bad_plans[] = {
	{ "", "not valid JSON (at byte 0)" },
	{ "{\"ep_size\": 4,", "not valid JSON" },
	{ "{\"ep_size\": 4} x", "not valid JSON" },
	{ "[1, 2]", "not a JSON object" },
	{ "{\"states\": [{\"role\": \"b\", \"state\": \"x\"}]}", "key 'ep_size': missing" },
	{ "{\"ep_size\": -1, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'ep_size': must be an integer from 1 to 4096" },
	{ "{\"ep_size\": 0, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'ep_size': must be an integer from 1 to 4096" },
	{ "{\"ep_size\": 2.5, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'ep_size': must be an integer" },
	{ "{\"ep_size\": 1e300, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'ep_size': must be an integer" },
	{ "{\"ep_size\": 1e999, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'ep_size': must be an integer" },
	{ "{\"ep_size\": 99999999999999999999, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'ep_size': must be an integer" },
	{ "{\"ep_size\": \"8\", \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'ep_size': expected an integer" },
	{ "{\"ep_size\": true, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'ep_size': expected an integer" },
	{ "{\"ep_size\": 4, \"ep_size\": 8, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'ep_size': given twice" },
	{ "{\"ep_size\": 4}", "key 'states': missing" },
	{ "{\"ep_size\": 4, \"states\": {}}", "key 'states': expected an array" },
	{ "{\"ep_size\": 4, \"states\": []}", "key 'states': empty" },
	{ "{\"ep_size\": 4, \"states\": [5]}", "key 'states[0]': expected an object" },
	{ "{\"ep_size\": 4, \"states\": [{\"state\": \"x\"}]}", "key 'states[0].role': missing" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": 7, \"state\": \"x\"}]}",
	  "key 'states[0].role': expected a string" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"\", \"state\": \"x\"}]}",
	  "key 'states[0].role': empty" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"a b\", \"state\": \"x\"}]}",
	  "key 'states[0].role': role 'a b' has a character" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"b\", \"state\": \"x\"}, {\"role\": \"b\", \"path\": \"/m\"}]}",
	  "key 'states[1].role': duplicate role 'b' (also states[0])" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"b\"}]}",
	  "key 'states[0]': needs 'state' or 'path'" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"b\", \"state\": \"x\", \"path\": \"/m\"}]}",
	  "key 'states[0]': both 'state' and 'path' given" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"b\", \"state\": \"x\", \"state\": \"y\"}]}",
	  "key 'states[0].state': given twice" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"b\", \"state\": \"sha256:abc\"}]}",
	  "key 'states[0].state': 'sha256:abc' is not a state digest" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"b\", \"state\": \"a\\u0001b\"}]}",
	  "key 'states[0].state': control character at byte 1" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"b\", \"path\": [\"/m\"]}]}",
	  "key 'states[0].path': expected a string" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"b\", \"path\": \"/m\", \"repr\": \"fp4\"}]}",
	  "key 'states[0].repr': unknown representation 'fp4'" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"b\", \"path\": \"/m\", \"repr\": \"NVFP4-BOTH\"}]}",
	  "key 'states[0].repr': unknown representation 'NVFP4-BOTH'" },
	{ "{\"ep_size\": 4, \"states\": [{\"role\": \"b\", \"path\": \"/m\", \"repr\": null}]}",
	  "key 'states[0].repr': expected a string" },
	{ "{\"ep_size\": 4, \"placement\": \"striped\", \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'placement': unknown placement 'striped'" },
	{ "{\"ep_size\": 4, \"budget_gib\": -80, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'budget_gib': must be a number above 0" },
	{ "{\"ep_size\": 4, \"budget_gib\": 0, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'budget_gib': must be a number above 0" },
	{ "{\"ep_size\": 4, \"budget_gib\": 1e300, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'budget_gib': must be a number above 0 and at most 1048576" },
	{ "{\"ep_size\": 4, \"budget_gib\": \"80\", \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'budget_gib': expected a number" },
	{ "{\"ep_size\": 4, \"num_experts\": 0, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'num_experts': must be an integer from 1 to 65536" },
	{ "{\"ep_size\": 4, \"outputs\": 3, \"states\": [{\"role\": \"b\", \"state\": \"x\"}]}",
	  "key 'outputs': expected a string" },
};

static int test_parse_bad(void)
{
	char want[600];

	for (size_t i = 0; i < sizeof(bad_plans) / sizeof(bad_plans[0]); i++) {
		struct ms_fp_plan *p = (struct ms_fp_plan *)1;
		struct ms_err err;
		int rc;

		memset(&err, 0, sizeof(err));
		rc = ms_fp_plan_parse(bad_plans[i].json, strlen(bad_plans[i].json),
				      "bad.json", &p, &err);
		T_ASSERT_MSG(rc == MS_EINVAL, "plan %zu: rc %d", i, rc);
		T_ASSERT(p == NULL);
		snprintf(want, sizeof(want), "plan 'bad.json': %s", bad_plans[i].msg);
		T_ASSERT_MSG(!strncmp(err.msg, want, strlen(want)),
			     "plan %zu: got '%s', want '%s...'", i, err.msg, want);
	}
	return 0;
}

static int test_parse_limits(void)
{
	struct ms_fp_plan *p;
	struct ms_err err;
	struct ms_buf b;
	static const char nul[] = "{\"ep_size\": 4,\0 \"states\": []}";

	T_ASSERT_EQ_INT(ms_fp_plan_parse(nul, sizeof(nul) - 1, "n.json", &p, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "plan 'n.json': contains a NUL byte at offset 14"),
		     "%s", err.msg);

	/* too many entries */
	ms_buf_init(&b);
	ms_buf_puts(&b, "{\"ep_size\": 1, \"states\": [");
	for (unsigned i = 0; i <= MS_FP_MAX_ENTRIES; i++)
		ms_buf_printf(&b, "%s{\"role\": \"r%u\", \"state\": \"s\"}", i ? "," : "", i);
	ms_buf_puts(&b, "]}");
	T_ASSERT_EQ_INT(ms_fp_plan_parse(b.data, b.len, "big.json", &p, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "key 'states': more than 256 entries"), "%s", err.msg);
	ms_buf_release(&b);

	/* deep nesting in a key the planner ignores: refused, not a crash */
	ms_buf_init(&b);
	ms_buf_puts(&b, "{\"ep_size\": 1, \"x\": ");
	for (int i = 0; i < 5000; i++)
		ms_buf_puts(&b, "[");
	for (int i = 0; i < 5000; i++)
		ms_buf_puts(&b, "]");
	ms_buf_puts(&b, ", \"states\": [{\"role\": \"b\", \"state\": \"s\"}]}");
	T_ASSERT_EQ_INT(ms_fp_plan_parse(b.data, b.len, "deep.json", &p, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "not valid JSON"), "%s", err.msg);
	ms_buf_release(&b);

	/* a plan larger than the cap */
	T_ASSERT_EQ_INT(ms_fp_plan_parse("{}", (size_t)MS_FP_MAX_PLAN + 1, "h.json", &p, &err),
			MS_EINVAL);
	return 0;
}

/* ---- the bundled plans on the bundled checkpoints ------------------------------ */

static int test_fixture_duplicate_role(void)
{
	char path[512];
	struct ms_fp_plan *p;
	struct ms_err err;

	snprintf(path, sizeof(path), "%s/plans/bad-duplicate-role.json", T_FIXTURES);
	T_ASSERT_EQ_INT(ms_fp_plan_load(path, &p, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "key 'states[1].role': duplicate role 'base'") &&
		     strstr(err.msg, "bad-duplicate-role.json"), "%s", err.msg);
	snprintf(path, sizeof(path), "%s/plans/no-such-plan.json", T_FIXTURES);
	T_ASSERT_EQ_INT(ms_fp_plan_load(path, &p, &err), MS_EIO);
	T_ASSERT_MSG(strstr(err.msg, "no-such-plan.json"), "%s", err.msg);
	snprintf(path, sizeof(path), "%s/plans/grpo-run.json", T_FIXTURES);
	T_ASSERT_EQ_INT(ms_fp_plan_load(path, &p, &err), MS_OK);
	T_ASSERT_EQ_INT(p->nentries, 3);
	T_ASSERT_STR(p->entries[1].state, "glm-base-nvfp4-colwise");
	T_ASSERT_EQ_INT(p->budget_bytes, 80ull << 30);
	ms_fp_plan_free(p);
	return 0;
}

static int ends(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);

	return a >= b && !strcmp(s + a - b, suf);
}

/*
 * The Qwen3-MoE fixture under nvfp4-both / nvfp4-ondemand, against an
 * independent count over its header: projections ("*_proj.weight", 2-D)
 * are quantized, expert e of 8 lives on rank e / 2 (contiguous) or e % 4
 * (round-robin), everything else is replicated at its stored size.
 */
static int expect_qwen(const struct ms_ckpt *ck, int round_robin,
		       uint64_t *rowwise_gpu, uint64_t *other_gpu,
		       uint64_t *layer_max_gpu)
{
	uint64_t rank_row[4] = { 0 }, rep_row = 0, other = 0;
	uint64_t layer_rank[2][4] = { { 0 } }, layer_rep[2] = { 0 };

	for (size_t i = 0; i < ck->ntensors; i++) {
		const struct ms_tensor *t = ck->tensors[i];
		const char *ex = strstr(t->name, ".experts.");
		int layer = -1, expert = -1;
		uint64_t r, c, q;

		sscanf(t->name, "model.layers.%d.", &layer);
		if (ex)
			sscanf(ex, ".experts.%d.", &expert);
		if (!(ends(t->name, "_proj.weight") && t->ndim == 2)) {
			other += t->nbytes;
			continue;
		}
		r = t->shape[0];
		c = t->shape[1];
		/* both layouts: rows * ceil(cols/16) blocks of 9 bytes + 4 */
		q = r * ((c + 15) / 16) * 9 + 4;
		if (q != c * ((r + 15) / 16) * 9 + 4)
			return -1; /* the fixture's dims are multiples of 16 */
		if (layer < 0 || layer > 1)
			return -1;
		if (expert >= 0) {
			int k = round_robin ? expert % 4 : expert / 2;

			rank_row[k] += q;
			layer_rank[layer][k] += q;
		} else {
			rep_row += q;
			layer_rep[layer] += q;
		}
	}
	*rowwise_gpu = 0;
	*layer_max_gpu = 0;
	for (int k = 0; k < 4; k++) {
		if (rep_row + rank_row[k] > *rowwise_gpu)
			*rowwise_gpu = rep_row + rank_row[k];
		for (int l = 0; l < 2; l++)
			if (layer_rep[l] + layer_rank[l][k] > *layer_max_gpu)
				*layer_max_gpu = layer_rep[l] + layer_rank[l][k];
	}
	*other_gpu = other;
	return 0;
}

static int run_fixture_plan(const char *name, struct ms_fp_plan **p,
			    struct ms_fp_calc **c, struct ms_fp_report **rep,
			    struct ms_err *err)
{
	char path[512];
	int rc;

	snprintf(path, sizeof(path), "%s/plans/%s", T_FIXTURES, name);
	if ((rc = ms_fp_plan_load(path, p, err)) != MS_OK ||
	    (rc = ms_fp_calc_new(*p, c, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < (*p)->nentries; i++)
		if ((rc = ms_fp_calc_add_path(*c, i, err)) != MS_OK)
			return rc;
	return ms_fp_calc_finish(*c, rep, err);
}

static int test_fixture_qwen_both(void)
{
	struct ms_fp_plan *p = NULL;
	struct ms_fp_calc *c = NULL;
	struct ms_fp_report *rep = NULL;
	struct ms_ckpt *ck;
	struct ms_err err;
	char path[512];
	uint64_t row, other, lmax;

	snprintf(path, sizeof(path), "%s/hf/qwen3moe", T_FIXTURES);
	T_ASSERT_EQ_INT(ms_ckpt_open(path, &ck, &err), MS_OK);
	T_ASSERT_EQ_INT(expect_qwen(ck, 0, &row, &other, &lmax), 0);
	ms_ckpt_close(ck);

	T_ASSERT_MSG(run_fixture_plan("qwen3moe-whatif.json", &p, &c, &rep, &err) == MS_OK,
		     "%s", err.msg);
	T_ASSERT_EQ_INT(find_row(rep, "base", MS_FP_LAYOUT_NVFP4_ROWWISE)->bytes_per_gpu, row);
	T_ASSERT_EQ_INT(find_row(rep, "base", MS_FP_LAYOUT_NVFP4_COLUMNWISE)->bytes_per_gpu, row);
	T_ASSERT_EQ_INT(find_row(rep, "base", MS_FP_LAYOUT_AS_IS)->bytes_per_gpu, other);
	T_ASSERT_EQ_INT(rep->total_bytes_per_gpu, 2 * row + other);
	T_ASSERT_EQ_INT(rep->ondemand_total_bytes_per_gpu, row + other + lmax);
	/* 2 layers x (8 experts x 3 + 4 attention) projections */
	T_ASSERT_EQ_INT(rep->duplicate_weights, 56);
	/* budget 0.0001 GiB = 107374 bytes */
	T_ASSERT_EQ_INT(rep->budget_bytes, 107374);
	T_ASSERT_EQ_INT(rep->over_budget, 2 * row + other > 107374);
	ms_fp_report_free(rep);
	ms_fp_calc_free(c);
	ms_fp_plan_free(p);
	return 0;
}

static int test_fixture_qwen_ondemand(void)
{
	struct ms_fp_plan *p = NULL;
	struct ms_fp_calc *c = NULL;
	struct ms_fp_report *rep = NULL;
	struct ms_ckpt *ck;
	struct ms_err err;
	char path[512];
	uint64_t row, other, lmax;

	snprintf(path, sizeof(path), "%s/hf/qwen3moe-sharded", T_FIXTURES);
	T_ASSERT_EQ_INT(ms_ckpt_open(path, &ck, &err), MS_OK);
	T_ASSERT_EQ_INT(expect_qwen(ck, 1, &row, &other, &lmax), 0);
	ms_ckpt_close(ck);

	T_ASSERT_MSG(run_fixture_plan("qwen3moe-ondemand.json", &p, &c, &rep, &err) == MS_OK,
		     "%s", err.msg);
	T_ASSERT_EQ_INT(find_row(rep, "base", MS_FP_LAYOUT_NVFP4_ROWWISE)->bytes_per_gpu, row);
	T_ASSERT_EQ_INT(find_row(rep, "base", MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT)->bytes_per_gpu,
			lmax);
	T_ASSERT_EQ_INT(find_row(rep, "base", MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT)->ondemand_saving_per_gpu,
			row - lmax);
	T_ASSERT_EQ_INT(rep->total_bytes_per_gpu, row + other + lmax);
	T_ASSERT_EQ_INT(rep->ndups, 0);
	ms_fp_report_free(rep);
	ms_fp_calc_free(c);
	ms_fp_plan_free(p);
	return 0;
}

/*
 * The PEFT adapter beside its base: the fused LoRA factors take E = 8 from
 * the base's per-expert tensors and split over EP = 4 (F32):
 *   experts.base_layer.lora_A [32,64] 8192, lora_B [64,32] 8192,
 *   experts.lora_A [32,32] 4096, lora_B [64,32] 8192
 *   -> (8192 + 8192 + 4096 + 8192) / 4 = 7168 per GPU
 *   q_proj A [4,64] 1024, B [64,4] 1024; v_proj A [4,64] 1024, B [32,4] 512
 *   -> 3584 replicated
 * The same again in layer 1: 16 tensors, 14336 per GPU, 7168 replicated.
 */
static int test_fixture_adapter(void)
{
	struct ms_fp_plan *p = NULL;
	struct ms_fp_calc *c = NULL;
	struct ms_fp_report *rep = NULL;
	const struct ms_fp_row *a;
	struct ms_err err;

	T_ASSERT_MSG(run_fixture_plan("peft-adapter.json", &p, &c, &rep, &err) == MS_OK,
		     "%s", err.msg);
	a = find_row(rep, "adapter", MS_FP_LAYOUT_AS_IS);
	T_ASSERT(a);
	T_ASSERT_EQ_INT(a->ntensors, 16);
	T_ASSERT_EQ_INT(a->expert_bytes_per_gpu, 14336);
	T_ASSERT_EQ_INT(a->replicated_bytes, 7168);
	T_ASSERT_EQ_INT(a->bytes_per_gpu, 14336 + 7168);
	T_ASSERT_EQ_INT(rep->ndups, 0);
	ms_fp_report_free(rep);
	ms_fp_calc_free(c);
	ms_fp_plan_free(p);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_nvfp4_bytes),
	T_CASE(test_quantizable_rule),
	T_CASE(test_rule_matches_msconvert),
	T_CASE(test_rowwise),
	T_CASE(test_both_doubles),
	T_CASE(test_ondemand),
	T_CASE(test_base_named_twice),
	T_CASE(test_bf16),
	T_CASE(test_ragged_plan),
	T_CASE(test_replicated_vs_expert),
	T_CASE(test_placement),
	T_CASE(test_not_divisible),
	T_CASE(test_budget),
	T_CASE(test_as_is_quantized),
	T_CASE(test_bf16_and_nvfp4),
	T_CASE(test_calc_errors),
	T_CASE(test_parse_good),
	T_CASE(test_parse_bad),
	T_CASE(test_parse_limits),
	T_CASE(test_fixture_duplicate_role),
	T_CASE(test_fixture_qwen_both),
	T_CASE(test_fixture_qwen_ondemand),
	T_CASE(test_fixture_adapter),
};

T_MAIN(cases)
