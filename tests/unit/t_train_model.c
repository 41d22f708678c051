/*
 * t_train_model.c: the trainer's model (src/train/model.h) against
 * transformers + PEFT goldens (tests/fixtures/train/<family>, written by
 * tests/oracle/train_golden.py), against finite differences of its own
 * loss, resident vs on-demand columnwise weights (bit-identical), EP
 * virtual ranks vs one rank, thread counts, gradient accumulation, and the
 * refusals of configs and weights it does not implement.
 */
#include <math.h>

#include <cjson/cJSON.h>

#include "test.h"
#include "checkpoint.h"
#include "nvfp4.h"
#include "train/model.h"
#include "train/model_int.h"

/* ---- fixtures ------------------------------------------------------------------ */

#include "train_fixture.h"

static struct ms_model *fam_model(struct fam *f, const struct ms_model_opts *o,
				  int warm)
{
	struct ms_model *m = NULL;
	struct ms_err err = {0};
	if (ms_model_build(&m, &f->cfg, f->base.t, f->base.n, f->quant.t, f->quant.n,
			   &f->lora, warm ? f->adapter.t : NULL,
			   warm ? f->adapter.n : 0, o, &err)) {
		fprintf(stderr, "build: %s\n", err.msg);
		return NULL;
	}
	return m;
}

/* ---- goldens ------------------------------------------------------------------ */

/*
 * Tolerances: both sides compute in float32 from the same decoded weights
 * (torch with its own summation order and, for the expert LoRA, the merged
 * weight W + s B A; here dot products accumulate in double), so differences
 * are float32 rounding amplified through the layers: logits within 1e-4
 * absolute (they are O(1)), loss within 1e-5 relative, each gradient
 * tensor within 1e-4 of its largest magnitude element-wise.
 */
static int golden(const char *name)
{
	struct fam f;
	struct ms_model *m = NULL;
	struct ms_err err = {0};
	const struct ms_wtensor *ids_t, *mask_t, *lg_t, *loss_t, *nt_t;
	int32_t ids[64];
	uint8_t mask[64];
	float *logits = NULL;
	double loss = 0, want_loss;
	uint64_t nt = 0;
	int64_t want_nt;
	uint32_t B, S, V;
	const struct ms_param *ps;
	size_t np;
	int rc = 1;

	T_ASSERT(fam_open(&f, name) == 0);
	ids_t = tset_find(&f.gold, "ids");
	mask_t = tset_find(&f.gold, "mask");
	lg_t = tset_find(&f.gold, "logits");
	loss_t = tset_find(&f.gold, "loss_sum");
	nt_t = tset_find(&f.gold, "n_tokens");
	T_ASSERT(ids_t && mask_t && lg_t && loss_t && nt_t);
	B = (uint32_t)ids_t->shape[0];
	S = (uint32_t)ids_t->shape[1];
	V = f.cfg.vocab;
	T_ASSERT(B * S <= 64);
	memcpy(ids, ids_t->data, B * S * 4);
	memcpy(mask, mask_t->data, B * S);
	memcpy(&want_loss, loss_t->data, 8);
	memcpy(&want_nt, nt_t->data, 8);
	m = fam_model(&f, NULL, 1);
	T_ASSERT(m);
	logits = calloc((size_t)B * S * V, sizeof *logits);
	T_ASSERT(logits);
	T_ASSERT(ms_model_forward(m, ids, B, S, logits, &err) == MS_OK);
	{
		double worst = 0;
		for (size_t i = 0; i < (size_t)B * S * V; i++) {
			double d = fabs((double)logits[i] - fget(lg_t, i));
			if (d > worst)
				worst = d;
		}
		fprintf(stderr, "  %s: logits max |diff| %.3g\n", name, worst);
		T_ASSERT_MSG(worst < 1e-4, "logits differ by %g", worst);
	}
	T_ASSERT(ms_model_step(m, ids, mask, B, S, 1.0, 0, &loss, &nt, &err) == MS_OK);
	fprintf(stderr, "  %s: loss %.9g (transformers %.9g) over %llu labels\n", name,
		loss, want_loss, (unsigned long long)nt);
	T_ASSERT_EQ_INT(nt, want_nt);
	T_ASSERT_MSG(fabs(loss - want_loss) <= 1e-5 * fabs(want_loss), "loss %.9g vs %.9g",
		     loss, want_loss);
	np = ms_model_params(m, &ps);
	T_ASSERT(np > 0);
	{
		size_t ngrad = 0;
		double worst = 0;
		for (size_t i = 0; i < f.gold.n; i++)
			ngrad += !strncmp(f.gold.t[i].name, "grad:", 5);
		T_ASSERT_EQ_INT(ngrad, np);
		for (size_t i = 0; i < np; i++) {
			char key[512];
			const struct ms_wtensor *g;
			double gmax = 0, dmax = 0;
			snprintf(key, sizeof key, "grad:%s", ps[i].name);
			g = tset_find(&f.gold, key);
			T_ASSERT_MSG(g, "no golden gradient for %s", ps[i].name);
			T_ASSERT(g->ndim == 2 && g->shape[0] == ps[i].shape[0] &&
				 g->shape[1] == ps[i].shape[1]);
			for (uint64_t e = 0; e < ps[i].n; e++) {
				double w = fget(g, e), d = fabs(w - ps[i].g[e]);
				if (fabs(w) > gmax)
					gmax = fabs(w);
				if (d > dmax)
					dmax = d;
			}
			T_ASSERT_MSG(gmax > 0, "%s: golden gradient is zero", ps[i].name);
			T_ASSERT_MSG(dmax <= 1e-4 * gmax, "%s: gradient differs by %g (max %g)",
				     ps[i].name, dmax, gmax);
			if (dmax / gmax > worst)
				worst = dmax / gmax;
		}
		fprintf(stderr, "  %s: %zu gradient tensors, worst relative diff %.3g\n",
			name, np, worst);
	}
	rc = 0;
	free(logits);
	ms_model_free(m);
	fam_close(&f);
	return rc;
}

static int test_golden_qwen3moe(void) { return golden("qwen3moe"); }
static int test_golden_mixtral(void) { return golden("mixtral"); }
static int test_golden_glm4moe(void) { return golden("glm4moe"); }
static int test_golden_qwen3moe_var(void) { return golden("qwen3moe-var"); }
static int test_golden_glm4moe_var(void) { return golden("glm4moe-var"); }

/* ---- finite differences -------------------------------------------------------- */

static double loss_of(struct ms_model *m, const int32_t *ids, uint32_t B, uint32_t S,
		      uint64_t step)
{
	double l = 0;
	uint64_t nt;
	struct ms_err err = {0};
	/* grad_scale 0: the gradients the test compares stay untouched */
	if (ms_model_step(m, ids, NULL, B, S, 0.0, step, &l, &nt, &err))
		return NAN;
	return l;
}

/*
 * For every parameter kind (each LoRA tensor of layer 0 and the last layer,
 * A and B), the directional derivative along the gradient itself and along
 * a random direction: (L(w + h v) - L(w - h v)) / 2h against g . v. The
 * forward is float32, so h is large enough for the loss difference to be
 * far above its rounding (the loss sums O(10) values) and the central
 * difference's h^2 term stays under the 2% the check allows.
 */
static int fd_with(const char *name, const struct ms_lora_cfg *lc, uint64_t step)
{
	struct fam f;
	struct ms_model *m;
	struct ms_err err = {0};
	int32_t ids[2 * 7];
	const struct ms_param *ps;
	size_t np, checked = 0;
	double worst = 0;
	uint64_t nt;
	double l0;

	T_ASSERT(fam_open(&f, name) == 0);
	m = NULL;
	T_ASSERT(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, f.quant.t, f.quant.n, lc,
				f.adapter.t, f.adapter.n, NULL, &err) == MS_OK);
	for (int i = 0; i < 14; i++)
		ids[i] = (i * 37 + 11) % (int)f.cfg.vocab;
	np = ms_model_params(m, &ps);
	ms_model_zero_grad(m);
	T_ASSERT(ms_model_step(m, ids, NULL, 2, 7, 1.0, step, &l0, &nt, &err) == MS_OK);
	for (size_t i = 0; i < np; i++) {
		float *g = malloc(ps[i].n * sizeof *g), *w0 = malloc(ps[i].n * sizeof *w0);
		float *v = malloc(ps[i].n * sizeof *v);
		T_ASSERT(g && w0 && v);
		memcpy(g, ps[i].g, ps[i].n * sizeof *g);
		memcpy(w0, ps[i].w, ps[i].n * sizeof *w0);
		for (int dir = 0; dir < 2; dir++) {
			double gn = 0, gv = 0, h, lp, lm, num;
			for (uint64_t e = 0; e < ps[i].n; e++)
				gn += (double)g[e] * g[e];
			gn = sqrt(gn);
			T_ASSERT_MSG(gn > 0, "%s: zero gradient", ps[i].name);
			for (uint64_t e = 0; e < ps[i].n; e++) {
				double r = dir == 0 ? g[e] / gn
						    : sin((double)(e * 7919 + i * 104729 + 1));
				v[e] = (float)r;
			}
			{
				double vn = 0;
				for (uint64_t e = 0; e < ps[i].n; e++)
					vn += (double)v[e] * v[e];
				vn = sqrt(vn);
				for (uint64_t e = 0; e < ps[i].n; e++) {
					v[e] = (float)(v[e] / vn);
					gv += (double)g[e] * v[e];
				}
			}
			if (dir == 1 && fabs(gv) < 0.05 * gn)
				continue; /* nearly orthogonal: nothing to measure */
			h = 1e-3;
			for (uint64_t e = 0; e < ps[i].n; e++)
				ps[i].w[e] = (float)(w0[e] + h * v[e]);
			lp = loss_of(m, ids, 2, 7, step);
			for (uint64_t e = 0; e < ps[i].n; e++)
				ps[i].w[e] = (float)(w0[e] - h * v[e]);
			lm = loss_of(m, ids, 2, 7, step);
			memcpy(ps[i].w, w0, ps[i].n * sizeof *w0);
			num = (lp - lm) / (2 * h);
			T_ASSERT_MSG(fabs(num - gv) <= 0.02 * fabs(gv) + 1e-4,
				     "%s dir %d: finite difference %.6g, gradient %.6g",
				     ps[i].name, dir, num, gv);
			if (fabs(num - gv) / fabs(gv) > worst)
				worst = fabs(num - gv) / fabs(gv);
			checked++;
		}
		free(g);
		free(w0);
		free(v);
	}
	fprintf(stderr, "  %s: %zu directional derivatives, worst relative diff %.3g\n",
		name, checked, worst);
	T_ASSERT(checked >= np);
	ms_model_free(m);
	fam_close(&f);
	return 0;
}

static int fd(const char *name)
{
	struct ms_lora_cfg lc = LORA_ALL;
	if (strstr(name, "-var"))
		lc.r = 3;
	return fd_with(name, &lc, 0);
}

/* dropout: the gradient is that of the loss under the step's masks */
static int test_fd_dropout(void)
{
	struct ms_lora_cfg lc = LORA_ALL;
	lc.dropout = 0.3;
	return fd_with("glm4moe", &lc, 5);
}

static int test_fd_qwen3moe(void) { return fd("qwen3moe"); }
static int test_fd_mixtral(void) { return fd("mixtral"); }
static int test_fd_glm4moe(void) { return fd("glm4moe"); }
static int test_fd_qwen3moe_var(void) { return fd("qwen3moe-var"); }
static int test_fd_glm4moe_var(void) { return fd("glm4moe-var"); }

/* ---- bit-exact variants ------------------------------------------------------------ */

/* One step of a model built with opts; copies of every gradient and the
 * loss. */
struct shot {
	double loss;
	size_t np;
	float **g;
	char **names;
	float *logits;
};

static void shot_free(struct shot *s)
{
	for (size_t i = 0; i < s->np; i++) {
		free(s->g[i]);
		free(s->names[i]);
	}
	free(s->g);
	free(s->names);
	free(s->logits);
	memset(s, 0, sizeof *s);
}

static int shot_take(struct fam *f, const struct ms_model_opts *o,
		     const struct ms_lora_cfg *lc, uint32_t B, uint32_t S,
		     uint64_t step, struct shot *s)
{
	struct ms_model *m = NULL;
	struct ms_err err = {0};
	const struct ms_param *ps;
	int32_t *ids = calloc((size_t)B * S, sizeof *ids);
	uint64_t nt;

	memset(s, 0, sizeof *s);
	if (!ids)
		return -1;
	for (size_t i = 0; i < (size_t)B * S; i++)
		ids[i] = (int32_t)((i * 131 + 7 + i / S * 17) % f->cfg.vocab);
	if (ms_model_build(&m, &f->cfg, f->base.t, f->base.n, f->quant.t, f->quant.n,
			   lc ? lc : &LORA_ALL, f->adapter.t, f->adapter.n, o, &err) ||
	    ms_model_step(m, ids, NULL, B, S, 1.0 / 64, step, &s->loss, &nt, &err)) {
		fprintf(stderr, "shot: %s\n", err.msg);
		ms_model_free(m);
		free(ids);
		return -1;
	}
	s->logits = calloc((size_t)B * S * f->cfg.vocab, sizeof *s->logits);
	if (!s->logits || ms_model_forward(m, ids, B, S, s->logits, &err))
		return -1;
	s->np = ms_model_params(m, &ps);
	s->g = calloc(s->np, sizeof *s->g);
	s->names = calloc(s->np, sizeof *s->names);
	for (size_t i = 0; i < s->np; i++) {
		s->g[i] = malloc(ps[i].n * sizeof(float));
		memcpy(s->g[i], ps[i].g, ps[i].n * sizeof(float));
		s->names[i] = strdup(ps[i].name);
	}
	ms_model_free(m);
	free(ids);
	return 0;
}

/* Resident and on-demand columnwise weights: the same loss, logits and
 * gradients, bit for bit (the dgrad reads W^T built from the transposed
 * NVFP4 bytes either at build time or inside the layer's backward). */
static int colwise(const char *name)
{
	struct fam f;
	struct shot a, b;
	struct ms_model_opts ro = {
			.colwise = MS_COLWISE_RESIDENT, .ep_size = 1, .nthreads = 2};
	struct ms_model_opts od = {
			.colwise = MS_COLWISE_ON_DEMAND, .ep_size = 1, .nthreads = 2};
	size_t n = 0;

	T_ASSERT(fam_open(&f, name) == 0);
	T_ASSERT(shot_take(&f, &ro, NULL, 2, 8, 0, &a) == 0);
	T_ASSERT(shot_take(&f, &od, NULL, 2, 8, 0, &b) == 0);
	T_ASSERT(memcmp(&a.loss, &b.loss, sizeof a.loss) == 0);
	T_ASSERT(memcmp(a.logits, b.logits, 2 * 8 * f.cfg.vocab * sizeof(float)) == 0);
	T_ASSERT_EQ_INT(a.np, b.np);
	for (size_t i = 0; i < a.np; i++)
		T_ASSERT_STR(a.names[i], b.names[i]);
	{
		/* element counts from the golden's gradient shapes */
		for (size_t i = 0; i < a.np; i++) {
			char key[512];
			const struct ms_wtensor *g;
			snprintf(key, sizeof key, "grad:%s", a.names[i]);
			g = tset_find(&f.gold, key);
			T_ASSERT(g);
			T_ASSERT_MSG(memcmp(a.g[i], b.g[i], g->nbytes) == 0,
				     "%s: resident and on-demand gradients differ",
				     a.names[i]);
			n += g->nbytes / 4;
		}
	}
	fprintf(stderr, "  %s: %zu gradient elements bit-identical\n", name, n);
	shot_free(&a);
	shot_free(&b);
	fam_close(&f);
	return 0;
}

static int test_colwise_qwen3moe(void) { return colwise("qwen3moe"); }
static int test_colwise_glm4moe(void) { return colwise("glm4moe"); }

/*
 * transformers 5's fused 3D expert tensors (mlp.experts.gate_up_proj [E,
 * 2F, H], gate rows first; down_proj [E, H, F]) load like the per-expert
 * ones: the same base written both ways gives bit-identical logits and
 * gradients (here without a quantized state: every projection from the
 * base in its own dtype).
 */
/* ms_model_routing: refused before a forward and for the dense layer
 * (qwen3moe-var's layer 1); after one, every MoE layer's experts are K
 * distinct ids in range, in the order of their scores, and the softmax
 * scores of each token sum to 1 */
static int test_routing(void)
{
	struct fam f;
	struct ms_model *m = NULL;
	struct ms_err err = {0};
	struct ms_model_opts o = {.colwise = MS_COLWISE_RESIDENT, .ep_size = 1};
	int32_t ids[2 * 5], *sel;
	float *p;
	uint32_t E, K, T = 2 * 5;

	T_ASSERT(fam_open(&f, "qwen3moe-var") == 0);
	E = f.cfg.n_experts;
	K = f.cfg.top_k;
	T_ASSERT(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, f.quant.t, f.quant.n, &f.lora,
				f.adapter.t, f.adapter.n, &o, &err) == MS_OK);
	sel = malloc(T * K * sizeof *sel);
	p = malloc(T * E * sizeof *p);
	T_ASSERT(sel && p);
	T_ASSERT_EQ_INT(ms_model_routing(m, 0, sel, p, &err), MS_EINVAL);
	for (uint32_t i = 0; i < T; i++)
		ids[i] = (int32_t)((i * 37 + 11) % f.cfg.vocab);
	T_ASSERT(ms_model_forward(m, ids, 2, 5, NULL, &err) == MS_OK);
	T_ASSERT_EQ_INT(ms_model_routing(m, 1, sel, p, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_model_routing(m, f.cfg.n_layers, sel, p, &err), MS_EINVAL);
	for (uint32_t l = 0; l < f.cfg.n_layers; l += 2) {
		T_ASSERT_MSG(ms_model_routing(m, l, sel, p, &err) == MS_OK, "%s", err.msg);
		for (uint32_t t = 0; t < T; t++) {
			double s = 0;
			for (uint32_t e = 0; e < E; e++)
				s += p[t * E + e];
			T_ASSERT(fabs(s - 1) < 1e-5);
			for (uint32_t k = 0; k < K; k++) {
				int32_t e = sel[t * K + k];
				T_ASSERT(e >= 0 && (uint32_t)e < E);
				for (uint32_t j = 0; j < k; j++)
					T_ASSERT(sel[t * K + j] != e &&
						 p[t * E + sel[t * K + j]] >= p[t * E + e]);
			}
		}
	}
	free(sel);
	free(p);
	ms_model_free(m);
	fam_close(&f);
	return 0;
}

static int test_fused_experts(void)
{
	struct fam f;
	struct ms_wtensor *b;
	float *fused[2][2];
	char names[2][2][128];
	size_t nb = 0;
	uint32_t E, F, H;
	struct shot a, c;
	struct ms_model_opts o = {
			.colwise = MS_COLWISE_RESIDENT, .ep_size = 1, .nthreads = 2};

	T_ASSERT(fam_open(&f, "qwen3moe") == 0);
	E = f.cfg.n_experts;
	F = f.cfg.moe_ffn;
	H = f.cfg.hidden;
	b = calloc(f.base.n + 4, sizeof *b);
	T_ASSERT(b);
	for (size_t i = 0; i < f.base.n; i++)
		if (!strstr(f.base.t[i].name, ".mlp.experts."))
			b[nb++] = f.base.t[i];
	for (uint32_t l = 0; l < 2; l++) {
		fused[l][0] = calloc((size_t)E * 2 * F * H, sizeof(float));
		fused[l][1] = calloc((size_t)E * H * F, sizeof(float));
		T_ASSERT(fused[l][0] && fused[l][1]);
		for (uint32_t e = 0; e < E; e++) {
			static const char *pn[3] = {"gate_proj", "up_proj", "down_proj"};
			for (int k = 0; k < 3; k++) {
				char nm[128];
				const struct ms_wtensor *t;
				float *dst = k < 2 ? fused[l][0] + ((size_t)e * 2 * F + k * F) * H
						   : fused[l][1] + (size_t)e * H * F;
				snprintf(nm, sizeof nm, "model.layers.%u.mlp.experts.%u.%s.weight",
					 l, e, pn[k]);
				t = tset_find(&f.base, nm);
				T_ASSERT(t && t->dtype == MS_DTYPE_BF16);
				for (uint64_t i = 0; i < t->nbytes / 2; i++) {
					uint16_t h;
					memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
					dst[i] = ms_bf16_to_f32(h);
				}
			}
		}
		snprintf(names[l][0], 128, "model.layers.%u.mlp.experts.gate_up_proj", l);
		snprintf(names[l][1], 128, "model.layers.%u.mlp.experts.down_proj", l);
		for (int k = 0; k < 2; k++) {
			struct ms_wtensor *t = &b[nb++];
			t->name = names[l][k];
			t->dtype = MS_DTYPE_F32;
			t->ndim = 3;
			t->shape[0] = E;
			t->shape[1] = k ? H : 2 * F;
			t->shape[2] = k ? F : H;
			t->data = fused[l][k];
			t->nbytes = (uint64_t)E * 2 * F * H * 4 / (k ? 2 : 1);
		}
	}
	/* per-expert, no quantized state */
	tset_close(&f.quant);
	T_ASSERT(shot_take(&f, &o, NULL, 2, 8, 0, &a) == 0);
	/* fused */
	{
		struct ms_wtensor *keep = f.base.t;
		size_t keepn = f.base.n;
		f.base.t = b;
		f.base.n = nb;
		T_ASSERT(shot_take(&f, &o, NULL, 2, 8, 0, &c) == 0);
		f.base.t = keep;
		f.base.n = keepn;
	}
	T_ASSERT(memcmp(&a.loss, &c.loss, sizeof a.loss) == 0);
	T_ASSERT(memcmp(a.logits, c.logits, 16 * f.cfg.vocab * sizeof(float)) == 0);
	for (size_t i = 0; i < a.np; i++) {
		char key[512];
		const struct ms_wtensor *g;
		snprintf(key, sizeof key, "grad:%s", a.names[i]);
		g = tset_find(&f.gold, key);
		T_ASSERT(g && memcmp(a.g[i], c.g[i], g->nbytes) == 0);
	}
	/* and the NVFP4 base is not the bf16 one: the quantized state matters */
	{
		struct shot qz;
		char p[512];
		snprintf(p, sizeof p, "%s/train/qwen3moe/quant", T_FIXTURES);
		T_ASSERT(tset_open(&f.quant, p) == 0);
		T_ASSERT(shot_take(&f, &o, NULL, 2, 8, 0, &qz) == 0);
		T_ASSERT(qz.loss != a.loss);
		shot_free(&qz);
	}
	shot_free(&a);
	shot_free(&c);
	for (uint32_t l = 0; l < 2; l++) {
		free(fused[l][0]);
		free(fused[l][1]);
	}
	free(b);
	fam_close(&f);
	return 0;
}

/* Thread counts give bit-identical results. */
static int test_threads_bitexact(void)
{
	struct fam f;
	struct shot a, b;
	struct ms_model_opts o1 = {
			.colwise = MS_COLWISE_RESIDENT, .ep_size = 1, .nthreads = 1};
	struct ms_model_opts o3 = {
			.colwise = MS_COLWISE_RESIDENT, .ep_size = 1, .nthreads = 3};

	T_ASSERT(fam_open(&f, "mixtral") == 0);
	T_ASSERT(shot_take(&f, &o1, NULL, 2, 8, 0, &a) == 0);
	T_ASSERT(shot_take(&f, &o3, NULL, 2, 8, 0, &b) == 0);
	T_ASSERT(memcmp(&a.loss, &b.loss, sizeof a.loss) == 0);
	for (size_t i = 0; i < a.np; i++) {
		char key[512];
		const struct ms_wtensor *g;
		snprintf(key, sizeof key, "grad:%s", a.names[i]);
		g = tset_find(&f.gold, key);
		T_ASSERT(g && memcmp(a.g[i], b.g[i], g->nbytes) == 0);
	}
	shot_free(&a);
	shot_free(&b);
	fam_close(&f);
	return 0;
}

/*
 * EP virtual ranks: 2 and 4 ranks (2 and 4 experts each of 8) against one.
 * The forward is the same arithmetic on every token whichever rank runs
 * it, so the loss and logits are bit-identical; the replicated attention
 * LoRA gradients are per-rank partial sums reduced in rank order, equal to
 * one rank's within float32 rounding (1e-6 of the tensor's largest value);
 * the expert LoRA gradients come from one rank each.
 */
static int ep(const char *name)
{
	struct fam f;
	struct shot one, k;
	double worst = 0;

	T_ASSERT(fam_open(&f, name) == 0);
	{
		struct ms_model_opts o = {
				.colwise = MS_COLWISE_RESIDENT, .ep_size = 1, .nthreads = 2};
		T_ASSERT(shot_take(&f, &o, NULL, 4, 6, 0, &one) == 0);
	}
	for (uint32_t n = 2; n <= 4; n *= 2) {
		struct ms_model_opts o = {
				.colwise = MS_COLWISE_ON_DEMAND, .ep_size = n, .nthreads = 2};
		T_ASSERT(shot_take(&f, &o, NULL, 4, 6, 0, &k) == 0);
		T_ASSERT(memcmp(&one.loss, &k.loss, sizeof k.loss) == 0);
		T_ASSERT(memcmp(one.logits, k.logits, 4 * 6 * f.cfg.vocab * sizeof(float)) == 0);
		for (size_t i = 0; i < k.np; i++) {
			char key[512];
			const struct ms_wtensor *g;
			double gmax = 0, dmax = 0;
			snprintf(key, sizeof key, "grad:%s", k.names[i]);
			g = tset_find(&f.gold, key);
			T_ASSERT(g);
			for (uint64_t e = 0; e < g->nbytes / 4; e++) {
				double d = fabs((double)one.g[i][e] - k.g[i][e]);
				if (fabs(one.g[i][e]) > gmax)
					gmax = fabs(one.g[i][e]);
				if (d > dmax)
					dmax = d;
			}
			T_ASSERT_MSG(dmax <= 1e-6 * gmax, "EP %u %s: differs by %g (max %g)",
				     n, k.names[i], dmax, gmax);
			if (gmax > 0 && dmax / gmax > worst)
				worst = dmax / gmax;
		}
		shot_free(&k);
	}
	fprintf(stderr, "  %s: EP 2 and 4 vs EP 1: loss and logits identical, "
		"gradients within %.3g relative\n", name, worst);
	shot_free(&one);
	fam_close(&f);
	return 0;
}

static int test_ep_qwen3moe(void) { return ep("qwen3moe"); }
static int test_ep_glm4moe(void) { return ep("glm4moe"); }

static int test_ep_refusals(void)
{
	struct fam f;
	struct ms_model *m = NULL;
	struct ms_err err = {0};
	struct ms_model_opts o3 = {
			.colwise = MS_COLWISE_RESIDENT, .ep_size = 3, .nthreads = 1};
	struct ms_model_opts o2 = {
			.colwise = MS_COLWISE_RESIDENT, .ep_size = 2, .nthreads = 1};
	int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
	double l;
	uint64_t nt;

	T_ASSERT(fam_open(&f, "qwen3moe") == 0);
	T_ASSERT(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, f.quant.t, f.quant.n,
				&LORA_ALL, NULL, 0, &o3, &err) == MS_EINVAL);
	T_ASSERT(strstr(err.msg, "EP size 3"));
	T_ASSERT(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, f.quant.t, f.quant.n,
				&LORA_ALL, NULL, 0, &o2, &err) == MS_OK);
	T_ASSERT(ms_model_step(m, ids, NULL, 3, 3, 1, 0, &l, &nt, &err) == MS_EINVAL);
	T_ASSERT(strstr(err.msg, "multiple of the EP size"));
	ms_model_free(m);
	fam_close(&f);
	return 0;
}

/* Gradients accumulate: two steps equal twice one (exactly: x + x = 2x). */
static int test_accumulate(void)
{
	struct fam f;
	struct ms_model *m;
	struct ms_err err = {0};
	int32_t ids[12] = {5, 9, 13, 2, 77, 31, 8, 1, 200, 45, 3, 3};
	const struct ms_param *ps;
	size_t np;
	double l1, l2;
	uint64_t nt;
	float *g1;

	T_ASSERT(fam_open(&f, "qwen3moe") == 0);
	m = fam_model(&f, NULL, 1);
	T_ASSERT(m);
	np = ms_model_params(m, &ps);
	T_ASSERT(ms_model_step(m, ids, NULL, 2, 6, 0.5, 0, &l1, &nt, &err) == MS_OK);
	T_ASSERT_EQ_INT(nt, 10);
	g1 = malloc(ps[0].n * sizeof *g1);
	T_ASSERT(g1);
	memcpy(g1, ps[0].g, ps[0].n * sizeof *g1);
	T_ASSERT(ms_model_step(m, ids, NULL, 2, 6, 0.5, 0, &l2, &nt, &err) == MS_OK);
	T_ASSERT(l1 == l2);
	for (uint64_t e = 0; e < ps[0].n; e++)
		T_ASSERT(ps[0].g[e] == 2 * g1[e]);
	ms_model_zero_grad(m);
	for (size_t i = 0; i < np; i++)
		for (uint64_t e = 0; e < ps[i].n; e++)
			T_ASSERT(ps[i].g[e] == 0);
	free(g1);
	ms_model_free(m);
	fam_close(&f);
	return 0;
}

/*
 * LoRA dropout: masks depend on (seed, step), so one step is reproducible,
 * another step differs, the loss differs from no dropout, the forward
 * (inference) ignores it (test_fd_dropout checks its gradient).
 */
static int test_dropout(void)
{
	struct fam f;
	struct ms_lora_cfg lc = LORA_ALL;
	struct shot a, b, c, d;
	struct ms_model_opts o = {
			.colwise = MS_COLWISE_RESIDENT, .ep_size = 1, .nthreads = 2};

	lc.dropout = 0.25;
	T_ASSERT(fam_open(&f, "qwen3moe") == 0);
	T_ASSERT(shot_take(&f, &o, &lc, 2, 8, 3, &a) == 0);
	T_ASSERT(shot_take(&f, &o, &lc, 2, 8, 3, &b) == 0);
	T_ASSERT(shot_take(&f, &o, &lc, 2, 8, 4, &c) == 0);
	T_ASSERT(shot_take(&f, &o, NULL, 2, 8, 3, &d) == 0);
	T_ASSERT(a.loss == b.loss);
	T_ASSERT(a.loss != c.loss);
	T_ASSERT(a.loss != d.loss);
	T_ASSERT(memcmp(a.logits, d.logits, 16 * f.cfg.vocab * sizeof(float)) == 0);
	for (size_t i = 0; i < a.np; i++) {
		char key[512];
		const struct ms_wtensor *g;
		snprintf(key, sizeof key, "grad:%s", a.names[i]);
		g = tset_find(&f.gold, key);
		T_ASSERT(g && memcmp(a.g[i], b.g[i], g->nbytes) == 0);
	}
	shot_free(&a);
	shot_free(&b);
	shot_free(&c);
	shot_free(&d);
	fam_close(&f);
	return 0;
}

/* ---- warm start ---------------------------------------------------------------------- */

static const struct ms_param *param_named(struct ms_model *m, const char *name)
{
	const struct ms_param *ps;
	size_t np = ms_model_params(m, &ps);
	for (size_t i = 0; i < np; i++)
		if (!strcmp(ps[i].name, name))
			return &ps[i];
	return NULL;
}

/* The expert e block [rows r0 .. r0+nr) of s B_e A_e from the fused
 * parameters of module key, against PEFT's delta (float32 [nr, in] at
 * want); returns the largest difference relative to the largest value. */
static double delta_diff(struct ms_model *m, const char *key, uint32_t E,
			 uint32_t r, double s, uint32_t e, uint32_t r0, uint32_t nr,
			 uint32_t in, const struct ms_wtensor *want, size_t woff)
{
	char na[400], nb[400];
	const struct ms_param *A, *B;
	double dmax = 0, vmax = 0;
	snprintf(na, sizeof na, "%s.lora_A.weight", key);
	snprintf(nb, sizeof nb, "%s.lora_B.weight", key);
	A = param_named(m, na);
	B = param_named(m, nb);
	if (!A || !B)
		return INFINITY;
	for (uint32_t o = 0; o < nr; o++)
		for (uint32_t i = 0; i < in; i++) {
			double d = 0, w = fget(want, woff + (size_t)o * in + i);
			for (uint32_t k = 0; k < r; k++)
				d += (double)B->w[(size_t)(r0 + o) * r * E + k * E + e] *
				     A->w[(size_t)(e * r + k) * in + i];
			d *= s;
			if (fabs(w) > vmax)
				vmax = fabs(w);
			if (fabs(d - w) > dmax)
				dmax = fabs(d - w);
		}
	return vmax > 0 ? dmax / vmax : INFINITY;
}

static int open_peft(struct fam *f, const char *dir)
{
	char p[512];
	const struct ms_ckpt_config *cj;
	struct ms_err err = {0};
	memset(f, 0, sizeof *f);
	snprintf(p, sizeof p, "%s/peft/%s/base", T_FIXTURES, dir);
	if (tset_open(&f->base, p))
		return -1;
	snprintf(p, sizeof p, "%s/peft/%s/adapter", T_FIXTURES, dir);
	if (tset_open(&f->adapter, p))
		return -1;
	snprintf(p, sizeof p, "%s/peft/%s/peft_delta_truth.safetensors", T_FIXTURES, dir);
	if (tset_open(&f->gold, p))
		return -1;
	cj = ms_ckpt_config(f->base.c, "config.json");
	if (!cj || ms_model_cfg_parse(cj->text, cj->len, &f->cfg, &err)) {
		fprintf(stderr, "%s: %s\n", dir, err.msg);
		return -1;
	}
	return 0;
}

/*
 * A PEFT adapter with rank_pattern (layer 1's down_proj at rank 2 of 3)
 * warm-starts the fused expert adapters with PEFT's own delta
 * (get_delta_weight in peft_delta_truth): at the adapter's rank and alpha,
 * and at a larger run rank with another alpha (ranks padded, B rescaled).
 */
static int test_warm_rank_pattern(void)
{
	struct fam f;
	struct ms_err err = {0};
	double worst = 0;
	static const struct { uint32_t r; double alpha; } runs[2] = {{3, 5}, {5, 8}};

	T_ASSERT(open_peft(&f, "qwen3moe-E6-r3") == 0);
	for (int v = 0; v < 2; v++) {
		struct ms_model *m = NULL;
		struct ms_lora_cfg lc = {.r = runs[v].r, .alpha = runs[v].alpha,
					 .targets = MS_LORA_EXPERTS | MS_LORA_Q | MS_LORA_V,
					 .seed = 3};
		struct ms_model_opts o = {.nthreads = 1, .warm_alpha = 5};
		uint32_t E = f.cfg.n_experts, F = f.cfg.moe_ffn, H = f.cfg.hidden;
		double s = lc.alpha / lc.r;
		T_ASSERT_MSG(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, NULL, 0, &lc,
					    f.adapter.t, f.adapter.n, &o, &err) == MS_OK,
			     "%s", err.msg);
		for (uint32_t l = 0; l < f.cfg.n_layers; l++) {
			char key[300], tk[300];
			const struct ms_wtensor *gu, *dn;
			snprintf(tk, sizeof tk, "base_model.model.model.layers.%u.mlp.experts."
				 "base_layer::gate_up_proj", l);
			gu = tset_find(&f.gold, tk);
			snprintf(tk, sizeof tk, "base_model.model.model.layers.%u.mlp.experts::"
				 "down_proj", l);
			dn = tset_find(&f.gold, tk);
			T_ASSERT(gu && dn);
			for (uint32_t e = 0; e < E; e++) {
				double d1, d2;
				snprintf(key, sizeof key, "base_model.model.model.layers.%u."
					 "mlp.experts.base_layer", l);
				d1 = delta_diff(m, key, E, lc.r, s, e, 0, 2 * F, H, gu,
						(size_t)e * 2 * F * H);
				snprintf(key, sizeof key, "base_model.model.model.layers.%u."
					 "mlp.experts", l);
				d2 = delta_diff(m, key, E, lc.r, s, e, 0, H, F, dn,
						(size_t)e * H * F);
				T_ASSERT_MSG(d1 < 1e-6 && d2 < 1e-6,
					     "r %u layer %u expert %u: delta differs %g %g",
					     lc.r, l, e, d1, d2);
				worst = fmax(worst, fmax(d1, d2));
			}
		}
		ms_model_free(m);
	}
	fprintf(stderr, "  fused experts with rank_pattern: delta within %.3g of PEFT's\n",
		worst);
	fam_close(&f);
	return 0;
}

/*
 * A Mixtral adapter of per-expert modules (w1, w3, w2 each with its own
 * LoRA, r = 3) warm-starts the fused layout at rank 6 with PEFT's deltas
 * for every expert (w1 -> gate rows, w3 -> up rows, w2 -> down); at rank 3
 * it is refused: w1 and w3 cannot share one A.
 */
static int test_warm_perexpert_mixtral(void)
{
	struct fam f;
	struct ms_err err = {0};
	struct ms_model *m = NULL;
	struct ms_lora_cfg lc = {.r = 6, .alpha = 12, .seed = 3,
				 .targets = MS_LORA_EXPERTS | MS_LORA_Q | MS_LORA_V};
	struct ms_model_opts o = {.nthreads = 1, .warm_alpha = 5};
	uint32_t E, F, H;
	double worst = 0;

	T_ASSERT(open_peft(&f, "mixtral-perexpert-E6-r3") == 0);
	E = f.cfg.n_experts;
	F = f.cfg.moe_ffn;
	H = f.cfg.hidden;
	T_ASSERT_MSG(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, NULL, 0, &lc,
				    f.adapter.t, f.adapter.n, &o, &err) == MS_OK, "%s",
		     err.msg);
	for (uint32_t l = 0; l < f.cfg.n_layers; l++)
		for (uint32_t e = 0; e < E; e++) {
			static const char *wn[3] = {"w1", "w3", "w2"};
			for (int p = 0; p < 3; p++) {
				char key[300], tk[300];
				const struct ms_wtensor *t;
				double d;
				snprintf(tk, sizeof tk, "base_model.model.model.layers.%u."
					 "block_sparse_moe.experts.%u.%s::weight", l, e, wn[p]);
				t = tset_find(&f.gold, tk);
				T_ASSERT(t);
				snprintf(key, sizeof key, "base_model.model.model.layers.%u."
					 "mlp.experts%s", l, p < 2 ? ".base_layer" : "");
				d = p < 2 ? delta_diff(m, key, E, 6, 2.0, e, (uint32_t)p * F, F,
						       H, t, 0)
					  : delta_diff(m, key, E, 6, 2.0, e, 0, H, F, t, 0);
				T_ASSERT_MSG(d < 1e-6, "layer %u expert %u %s: delta differs %g",
					     l, e, wn[p], d);
				worst = fmax(worst, d);
			}
		}
	ms_model_free(m);
	fprintf(stderr, "  per-expert Mixtral adapter: delta within %.3g of PEFT's\n",
		worst);
	lc.r = 3;
	T_ASSERT(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, NULL, 0, &lc,
				f.adapter.t, f.adapter.n, &o, &err) == MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "w3.lora_A.weight") &&
		     strstr(err.msg, "at least 6"), "%s", err.msg);
	fam_close(&f);
	return 0;
}

/* ---- refusals ---------------------------------------------------------------------- */

static int cfg_refused(const char *json, const char *field)
{
	struct ms_model_cfg c;
	struct ms_err err = {0};
	int rc = ms_model_cfg_parse(json, strlen(json), &c, &err);
	if (rc != MS_EINVAL || !strstr(err.msg, field)) {
		fprintf(stderr, "config not refused as expected (%d): %s\n", rc, err.msg);
		return 1;
	}
	return 0;
}

#define QWEN_BASE "\"model_type\":\"qwen3_moe\",\"vocab_size\":256,\"hidden_size\":64," \
	"\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2," \
	"\"head_dim\":16,\"num_experts\":8,\"num_experts_per_tok\":2," \
	"\"moe_intermediate_size\":32"

static int test_cfg_refusals(void)
{
	struct ms_model_cfg c;
	struct ms_err err = {0};
	const char *ok = "{" QWEN_BASE "}";

	T_ASSERT(ms_model_cfg_parse(ok, strlen(ok), &c, &err) == MS_OK);
	T_ASSERT(c.family == MS_MODEL_QWEN3_MOE && c.n_experts == 8 && c.qk_norm);
	/* RoPE: rope_parameters first, top-level fields where it has none */
	{
		const char *a = "{" QWEN_BASE ",\"partial_rotary_factor\":0.5,"
				"\"rope_parameters\":{\"rope_type\":\"default\","
				"\"partial_rotary_factor\":1.0}}";
		const char *b = "{" QWEN_BASE ",\"partial_rotary_factor\":0.5,"
				"\"rope_theta\":500000,\"rope_parameters\":"
				"{\"rope_type\":\"default\"}}";
		T_ASSERT(ms_model_cfg_parse(a, strlen(a), &c, &err) == MS_OK);
		T_ASSERT_EQ_INT(c.rotary_dim, 16);
		T_ASSERT(c.rope_theta == 10000.0);
		T_ASSERT(ms_model_cfg_parse(b, strlen(b), &c, &err) == MS_OK);
		T_ASSERT_EQ_INT(c.rotary_dim, 8);
		T_ASSERT(c.rope_theta == 500000.0);
	}
	T_ASSERT(!cfg_refused("{\"model_type\":\"llama\"}", "model_type"));
	T_ASSERT(!cfg_refused("{" QWEN_BASE ",\"hidden_act\":\"gelu\"}", "hidden_act"));
	T_ASSERT(!cfg_refused("{" QWEN_BASE ",\"rope_parameters\":{\"rope_type\":\"yarn\","
			      "\"rope_theta\":10000}}", "rope_parameters.rope_type"));
	T_ASSERT(!cfg_refused("{" QWEN_BASE ",\"rope_scaling\":{\"type\":\"linear\","
			      "\"factor\":2}}", "rope_scaling"));
	T_ASSERT(!cfg_refused("{" QWEN_BASE ",\"use_sliding_window\":true}",
			      "use_sliding_window"));
	T_ASSERT(!cfg_refused("{" QWEN_BASE ",\"output_router_logits\":true}",
			      "output_router_logits"));
	T_ASSERT(!cfg_refused("{" QWEN_BASE ",\"attention_dropout\":0.1}",
			      "attention_dropout"));
	T_ASSERT(!cfg_refused("{" QWEN_BASE ",\"layer_types\":[\"full_attention\","
			      "\"sliding_attention\"]}", "layer_types"));
	T_ASSERT(!cfg_refused("{\"model_type\":\"mixtral\",\"vocab_size\":256,"
			      "\"hidden_size\":64,\"num_hidden_layers\":2,"
			      "\"num_attention_heads\":4,\"num_local_experts\":8,"
			      "\"num_experts_per_tok\":2,\"intermediate_size\":32,"
			      "\"sliding_window\":4096}", "sliding_window"));
	T_ASSERT(!cfg_refused("{\"model_type\":\"qwen3_moe\",\"vocab_size\":256,"
			      "\"hidden_size\":64,\"num_hidden_layers\":2,"
			      "\"num_attention_heads\":4,\"num_experts\":8,"
			      "\"num_experts_per_tok\":9,\"moe_intermediate_size\":32}",
			      "top-k"));
	T_ASSERT(!cfg_refused("{\"model_type\":\"qwen3_moe\"}", "vocab_size"));
	T_ASSERT(!cfg_refused("not json", "not JSON"));
	return 0;
}

/* Weights: a missing or misshapen tensor, a 1D-block NVFP4 projection, a
 * warm-start adapter of another rank or with a stray tensor: each refused
 * with one line naming the tensor. */
static int test_weight_refusals(void)
{
	struct fam f;
	struct ms_model *m = NULL;
	struct ms_err err = {0};
	struct ms_wtensor *b, *q;
	struct ms_lora_cfg r3 = LORA_ALL;

	T_ASSERT(fam_open(&f, "qwen3moe") == 0);
	b = calloc(f.base.n, sizeof *b);
	q = calloc(f.quant.n, sizeof *q);
	T_ASSERT(b && q);
	/* missing */
	memcpy(b, f.base.t, f.base.n * sizeof *b);
	for (size_t i = 0; i < f.base.n; i++)
		if (!strcmp(b[i].name, "model.layers.1.post_attention_layernorm.weight"))
			b[i].name = "renamed";
	T_ASSERT(ms_model_build(&m, &f.cfg, b, f.base.n, NULL, 0, &LORA_ALL, NULL, 0,
				NULL, &err) == MS_EINVAL);
	T_ASSERT(strstr(err.msg, "model.layers.1.post_attention_layernorm.weight") &&
		 strstr(err.msg, "missing"));
	/* misshapen */
	memcpy(b, f.base.t, f.base.n * sizeof *b);
	for (size_t i = 0; i < f.base.n; i++)
		if (!strcmp(b[i].name, "model.layers.0.self_attn.k_proj.weight"))
			b[i].shape[0] = 16;
	T_ASSERT(ms_model_build(&m, &f.cfg, b, f.base.n, NULL, 0, &LORA_ALL, NULL, 0,
				NULL, &err) == MS_EINVAL);
	T_ASSERT(strstr(err.msg, "model.layers.0.self_attn.k_proj.weight"));
	/* 1D blocks: a scale row of a 2D tile changed so the tile disagrees */
	memcpy(q, f.quant.t, f.quant.n * sizeof *q);
	for (size_t i = 0; i < f.quant.n; i++)
		if (!strcmp(q[i].name, "model.layers.0.self_attn.o_proj.weight_scale")) {
			uint8_t *s = malloc(q[i].nbytes);
			T_ASSERT(s);
			memcpy(s, q[i].data, q[i].nbytes);
			s[q[i].shape[1]] ^= 1; /* row 1, block 0 */
			q[i].data = s;
		}
	T_ASSERT(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, q, f.quant.n, &LORA_ALL,
				NULL, 0, NULL, &err) == MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "model.layers.0.self_attn.o_proj"), "%s", err.msg);
	for (size_t i = 0; i < f.quant.n; i++)
		if (q[i].data != f.quant.t[i].data)
			free((void *)q[i].data);
	/* the same tensors untouched build */
	T_ASSERT(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, f.quant.t, f.quant.n,
				&LORA_ALL, f.adapter.t, f.adapter.n, NULL, &err) == MS_OK);
	ms_model_free(m);
	/* warm start of another rank */
	r3.r = 3;
	T_ASSERT(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, f.quant.t, f.quant.n,
				&r3, f.adapter.t, f.adapter.n, NULL, &err) == MS_EINVAL);
	T_ASSERT(strstr(err.msg, "warm-start adapter") && strstr(err.msg, "lora_A"));
	/* warm start with a tensor no target of the run uses */
	r3 = LORA_ALL;
	r3.targets = MS_LORA_EXPERTS;
	T_ASSERT(ms_model_build(&m, &f.cfg, f.base.t, f.base.n, f.quant.t, f.quant.n,
				&r3, f.adapter.t, f.adapter.n, NULL, &err) == MS_EINVAL);
	T_ASSERT(strstr(err.msg, "self_attn") && strstr(err.msg, "matches no"));
	free(b);
	free(q);
	fam_close(&f);
	return 0;
}

/* adapter_config.json says what PEFT needs to load the adapter back. */
static int test_adapter_config(void)
{
	struct fam f;
	struct ms_model *m;
	struct ms_err err = {0};
	char *js = NULL;

	T_ASSERT(fam_open(&f, "mixtral") == 0);
	m = fam_model(&f, NULL, 0);
	T_ASSERT(m);
	T_ASSERT(ms_model_adapter_config(m, &js, &err) == MS_OK);
	T_ASSERT(strstr(js, "\"peft_type\":\t\"LORA\""));
	T_ASSERT(strstr(js, "\"r\":\t4"));
	T_ASSERT(strstr(js, "\"lora_alpha\":\t8"));
	T_ASSERT(strstr(js, "\"MixtralForCausalLM\""));
	T_ASSERT(strstr(js, "transformers.models.mixtral.modeling_mixtral"));
	T_ASSERT(strstr(js, "\"mlp.experts.gate_up_proj\""));
	T_ASSERT(strstr(js, "\"q_proj\""));
	ms_free(js);
	ms_model_free(m);
	fam_close(&f);
	return 0;
}

/* adapter_config.json as the library writes it against the one PEFT wrote
 * for the same adapter (tests/fixtures/train/<family>/adapter): every key
 * ours has, PEFT's has too; the fields PEFT reads to rebuild the adapter
 * are equal (target_modules and target_parameters as sets: PEFT writes
 * them from Python sets, in no fixed order, and nests the fused expert
 * wrappers by the parameters' declaration order, not the list's). */
static int same_json(const cJSON *a, const cJSON *b)
{
	char *x = cJSON_PrintUnformatted(a), *y = cJSON_PrintUnformatted(b);
	int eq = x && y && !strcmp(x, y);
	cJSON_free(x);
	cJSON_free(y);
	return eq;
}

static int adapter_config_vs_peft(const char *name)
{
	struct fam f;
	struct ms_model *m;
	struct ms_err err = {0};
	const struct ms_ckpt_config *pc;
	char *js = NULL;
	cJSON *ours, *peft, *it;
	static const char *same[] = {"r", "lora_alpha", "lora_dropout", "peft_type",
				     "auto_mapping", "bias",
				     "fan_in_fan_out", "use_dora", "use_rslora",
				     "modules_to_save", "lora_bias", "layers_to_transform",
				     "rank_pattern", "alpha_pattern"};

	T_ASSERT(fam_open(&f, name) == 0);
	m = fam_model(&f, NULL, 0);
	T_ASSERT(m);
	T_ASSERT(ms_model_adapter_config(m, &js, &err) == MS_OK);
	pc = ms_ckpt_config(f.adapter.c, "adapter_config.json");
	T_ASSERT(pc);
	ours = cJSON_Parse(js);
	peft = cJSON_Parse(pc->text);
	T_ASSERT(ours && peft);
	cJSON_ArrayForEach(it, ours)
		T_ASSERT_MSG(cJSON_GetObjectItemCaseSensitive(peft, it->string),
			     "key '%s' is not PEFT's", it->string);
	for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
		T_ASSERT_MSG(same_json(cJSON_GetObjectItemCaseSensitive(ours, same[i]),
				       cJSON_GetObjectItemCaseSensitive(peft, same[i])),
			     "%s: '%s' differs from PEFT's", name, same[i]);
	for (int k = 0; k < 2; k++) {
		const char *key = k ? "target_parameters" : "target_modules";
		const cJSON *a = cJSON_GetObjectItemCaseSensitive(ours, key);
		const cJSON *b = cJSON_GetObjectItemCaseSensitive(peft, key);
		const cJSON *x;
		T_ASSERT(cJSON_IsArray(a) && cJSON_IsArray(b));
		T_ASSERT(cJSON_GetArraySize(a) == cJSON_GetArraySize(b));
		cJSON_ArrayForEach(x, a) {
			const cJSON *y;
			int hit = 0;
			cJSON_ArrayForEach(y, b)
				hit |= !strcmp(x->valuestring, y->valuestring);
			T_ASSERT_MSG(hit, "%s: %s", key, x->valuestring);
		}
	}
	cJSON_Delete(ours);
	cJSON_Delete(peft);
	ms_free(js);
	ms_model_free(m);
	fam_close(&f);
	return 0;
}

static int test_adapter_config_peft(void)
{
	static const char *fams[] = {"qwen3moe", "mixtral", "glm4moe", "qwen3moe-var"};
	for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++)
		if (adapter_config_vs_peft(fams[i]))
			return 1;
	return 0;
}

/* Incremental decoding with the KV cache against a full forward of the
 * same prefixes: every position's logits, bit for bit, with the warm-start
 * adapter applied, 3 sequences of 9 tokens; with EP 2 too; and the cache's
 * refusals. */
static int kv_decode(const char *name, uint32_t ep)
{
	struct fam f;
	struct ms_model *m;
	struct ms_model_opts o = {.ep_size = ep};
	struct ms_kv_cache *kv = NULL;
	struct ms_err err = {0};
	enum { B = 4, S = 9 };
	int32_t ids[B * S], step[B];
	uint32_t V;
	float *full, *lg;
	size_t differ = 0;

	T_ASSERT(fam_open(&f, name) == 0);
	T_ASSERT((m = fam_model(&f, &o, 1)) != NULL);
	V = f.cfg.vocab;
	for (int i = 0; i < B * S; i++)
		ids[i] = (i * 53 + 7) % (int)V;
	full = malloc((size_t)B * S * V * sizeof *full);
	lg = malloc((size_t)B * V * sizeof *lg);
	T_ASSERT(full && lg);
	T_ASSERT_EQ_INT(ms_model_forward(m, ids, B, S, full, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_kv_cache_new(m, B, S, &kv, &err), MS_OK);
	for (int t = 0; t < S; t++) {
		for (int b = 0; b < B; b++)
			step[b] = ids[b * S + t];
		T_ASSERT_EQ_INT(ms_model_decode(m, kv, step, lg, &err), MS_OK);
		for (int b = 0; b < B; b++)
			differ += memcmp(lg + (size_t)b * V, full + ((size_t)b * S + t) * V,
					 V * sizeof(float)) != 0;
	}
	T_ASSERT_MSG(differ == 0, "%s: %zu of %d decoded rows differ from the full forward",
		     name, differ, B * S);
	T_ASSERT_EQ_INT(ms_kv_cache_len(kv), S);
	T_ASSERT_EQ_INT(ms_model_decode(m, kv, step, lg, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "full") != NULL);
	ms_kv_cache_reset(kv);
	for (int b = 0; b < B; b++)
		step[b] = ids[b * S];
	T_ASSERT_EQ_INT(ms_model_decode(m, kv, step, lg, &err), MS_OK);
	T_ASSERT(!memcmp(lg, full, V * sizeof(float))); /* position 0 again */
	ms_kv_cache_free(kv);
	free(full);
	free(lg);
	ms_model_free(m);
	fam_close(&f);
	return 0;
}

static int test_kv_decode(void)
{
	static const char *fams[] = {"qwen3moe", "mixtral", "glm4moe", "glm4moe-var"};
	for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++)
		if (kv_decode(fams[i], 1))
			return 1;
	return kv_decode("qwen3moe", 2);
}

/* cuBLAS, which the GPU model opens at its first build (no GPU needed to
 * open it): every function it calls is found, in a build with nvcc (whose
 * toolkit has the library); without nvcc the call says there is no GPU
 * support */
static int test_blas_symbols(void)
{
	struct ms_err err = {0};
	int rc = ms_gmodel_blas_load(&err);
#ifdef MS_HAVE_CUDA
	T_ASSERT_MSG(rc == MS_OK, "%s", err.msg);
	fprintf(stderr, "  cuBLAS opened, every function the GPU model calls found\n");
#else
	T_ASSERT_EQ_INT(rc, MS_ENODEV);
	fprintf(stderr, "  no GPU support in this build: %s\n", err.msg);
#endif
	return 0;
}

/* gpu_plan.c's prediction of the GPU model's attention memory: on the bf16
 * path, fused attention (cuDNN's, tried for head dims that are multiples of
 * 8, or the flash kernels for those they cover) holds no S x S scratch
 * (scratch and activations affine in S: zero second difference over S =
 * 256, 512, 768) and a per-layer LSE of T * heads floats, except cuDNN's
 * workspace, whose second difference is its own (its deterministic
 * backward's partial sums grow as S^2, model.h); the float32 test mode and
 * a head dim neither covers keep scores, dP (float) and P, dS (GEMM type)
 * of heads * S * S each: second difference 2 * heads * (8 + 2 * esz) *
 * 256^2. cuDNN's buffers are bf16 O, dQ, dK, dV and its workspace, the
 * flash kernels' T * heads floats. */
static int test_predict_flash_attention(void)
{
	struct fam f;
	T_ASSERT(fam_open(&f, "qwen3moe") == 0);
	/* LoRA dropout: the expert LoRA stays unfolded in every mode, so its
	 * activations are the same in bf16 and float32 */
	f.lora.dropout = 0.1;
	/* mode: 0 auto (cuDNN), 1 float32, 2 head dim 24 with flash only, 3
	 * head dim 24 auto (cuDNN), 4 flash */
	for (int mode = 0; mode < 5; mode++) {
		struct ms_model_cfg c = f.cfg;
		struct ms_model_mem m[3], f32;
		int64_t d2s, d2a, h = 256, nh = c.n_heads, want;
		int isf32 = mode == 1, fused = mode == 0 || mode >= 3;
		int att = mode == 2 || mode == 4 ? MS_ATTENTION_FLASH : MS_ATTENTION_AUTO;
		if (mode == 2 || mode == 3)
			c.head_dim = 24;
		for (int i = 0; i < 3; i++)
			T_ASSERT(ms_gmodel_predict(&c, &f.lora, 2, (uint32_t)(h * (i + 1)),
						   MS_COLWISE_RESIDENT, isf32, 0, att, &m[i]) == MS_OK);
		d2s = (int64_t)m[2].scratch - 2 * (int64_t)m[1].scratch + (int64_t)m[0].scratch;
		d2a = (int64_t)m[2].acts - 2 * (int64_t)m[1].acts + (int64_t)m[0].acts;
		want = !fused ? 2 * nh * (8 + 2 * (isf32 ? 4 : 2)) * h * h
		       : att == MS_ATTENTION_AUTO
			       ? (int64_t)ms_gmodel_sdpa_ws(2, (uint32_t)nh, 3 * (uint32_t)h) -
					 2 * (int64_t)ms_gmodel_sdpa_ws(2, (uint32_t)nh, 2 * (uint32_t)h) +
					 (int64_t)ms_gmodel_sdpa_ws(2, (uint32_t)nh, (uint32_t)h)
			       : 0;
		T_ASSERT_EQ_INT(d2s, want);
		T_ASSERT_EQ_INT(d2a, 0);
		/* activations: the LSE is the only difference between the modes */
		T_ASSERT(ms_gmodel_predict(&c, &f.lora, 2, (uint32_t)h, MS_COLWISE_RESIDENT, 1, 0,
					   att, &f32) == MS_OK);
		T_ASSERT_EQ_INT(m[0].acts - f32.acts,
				fused ? (int64_t)c.n_layers * 2 * h * nh * 4 : 0);
	}
	{
		/* cuDNN against flash at one shape: its bf16 buffers and its
		 * workspace in place of flash's */
		struct ms_model_mem a, b;
		uint64_t T = 2 * 256, dq = (uint64_t)f.cfg.n_heads * f.cfg.head_dim;
		uint64_t dkv = (uint64_t)f.cfg.n_kv_heads * f.cfg.head_dim;
		T_ASSERT(ms_gmodel_predict(&f.cfg, &f.lora, 2, 256, MS_COLWISE_RESIDENT, 0, 0,
					   MS_ATTENTION_AUTO, &a) == MS_OK);
		T_ASSERT(ms_gmodel_predict(&f.cfg, &f.lora, 2, 256, MS_COLWISE_RESIDENT, 0, 0,
					   MS_ATTENTION_FLASH, &b) == MS_OK);
		T_ASSERT_EQ_INT((int64_t)(a.scratch - b.scratch),
				(int64_t)(ms_gmodel_sdpa_ws(2, f.cfg.n_heads, 256) +
					  T * (2 * dq + 2 * dkv) * 2 - T * f.cfg.n_heads * 4));
		T_ASSERT(a.acts == b.acts && a.dense == b.dense && a.lora == b.lora);
	}
	fam_close(&f);
	return 0;
}

/* gpu_plan.c's prediction for the grouped expert GEMMs: per MoE layer four
 * arrays of E weight pointers (scratch) and E + 1 row offsets and E + 1
 * tile offsets (activations), nothing else; nothing in the float32 test
 * mode, which keeps cuBLAS; the same for either colwise mode. Fused: the
 * same activations, less scratch (the experts are not decoded into it).
 * Compared with LoRA dropout on, which keeps the per-expert path's LoRA
 * unfolded; folded (dropout 0, bf16), that path holds more scratch (the
 * factors' columns, its gradients' partials) and keeps the expert
 * activations (gate/up's output, SwiGLU's, the experts' outputs) in bf16
 * (half of their float32 bytes; SwiGLU's the rank padded to 16 columns
 * wider, the down GEMM's operand with U in them), nothing else. */
static int test_predict_grouped(void)
{
	const char *fams[] = {"qwen3moe", "glm4moe"};
	for (size_t i = 0; i < 2; i++) {
		struct fam f;
		int64_t nmoe = 0, E;
		T_ASSERT(fam_open(&f, fams[i]) == 0);
		E = f.cfg.n_experts;
		for (uint32_t l = 0; l < f.cfg.n_layers; l++)
			nmoe += !f.cfg.dense[l];
		{
			/* dropout's own scratch, from the float32 mode (which never
			 * folds), then what folding adds in bf16 */
			struct ms_model_mem u[2], fo[2];
			struct ms_lora_cfg l0 = f.lora;
			l0.dropout = 0;
			f.lora.dropout = 0.1;
			for (int f32 = 0; f32 < 2; f32++) {
				T_ASSERT(ms_gmodel_predict(&f.cfg, &f.lora, 2, 16, MS_COLWISE_RESIDENT,
							   f32, 0, 0, &u[f32]) == MS_OK);
				T_ASSERT(ms_gmodel_predict(&f.cfg, &l0, 2, 16, MS_COLWISE_RESIDENT, f32,
							   0, 0, &fo[f32]) == MS_OK);
				/* gate/up's and SwiGLU's outputs, (TK + 128) x
				 * 3F, in bf16, less SwiGLU's fr more columns
				 * and the norm's bf16 output (T x H) kept; the
				 * experts' outputs ((TK + 128) x H) out of the
				 * activations (one scratch buffer) */
				int64_t fr = ((int64_t)l0.r + 15) / 16 * 16;
				int64_t half = f32 ? 0
						   : nmoe * ((2 * 16 * (int64_t)f.cfg.top_k + 128) *
								     (3 * (int64_t)f.cfg.moe_ffn +
								      2 * (int64_t)f.cfg.hidden - fr) * 2 -
							     2 * 16 * (int64_t)f.cfg.hidden * 2);
				T_ASSERT_EQ_INT((int64_t)fo[f32].acts, (int64_t)u[f32].acts - half);
				T_ASSERT(fo[f32].dense == u[f32].dense && fo[f32].lora == u[f32].lora &&
					 fo[f32].nvfp4_rowwise == u[f32].nvfp4_rowwise);
			}
			T_ASSERT(u[1].scratch > fo[1].scratch);
			T_ASSERT(fo[0].scratch > u[0].scratch - (u[1].scratch - fo[1].scratch));
		}
		T_ASSERT(nmoe > 0);
		for (int f32 = 0; f32 < 2; f32++)
			for (int cw = 0; cw < 2; cw++) {
				struct ms_model_mem a, b;
				enum ms_colwise_mode col = cw ? MS_COLWISE_ON_DEMAND
							     : MS_COLWISE_RESIDENT;
				T_ASSERT(ms_gmodel_predict(&f.cfg, &f.lora, 2, 16, col, f32, 0, 0, &a) ==
					 MS_OK);
				T_ASSERT(ms_gmodel_predict(&f.cfg, &f.lora, 2, 16, col, f32, 1, 0, &b) ==
					 MS_OK);
				/* grouped: pointer arrays instead of the per-expert
				 * GEMMs' streams' workspaces */
				T_ASSERT_EQ_INT((int64_t)(b.scratch - a.scratch),
						f32 ? 0
						    : nmoe * 4 * E * (int64_t)sizeof(void *) -
							      (int64_t)MS_GMODEL_LANES *
								      MS_GMODEL_LANE_WS -
							      MS_GMODEL_XGEMM_WS);
				T_ASSERT_EQ_INT((int64_t)(b.acts - a.acts),
						f32 ? 0 : nmoe * 2 * (E + 1) * 4);
				T_ASSERT(b.nvfp4_rowwise == a.nvfp4_rowwise &&
					 b.nvfp4_colwise == a.nvfp4_colwise && b.dense == a.dense &&
					 b.lora == a.lora);
				T_ASSERT_EQ_INT((int64_t)(b.peak - a.peak),
						(int64_t)(b.scratch - a.scratch + b.acts - a.acts));
				/* fused: descriptors instead of pointers, and the
				 * experts out of the decode scratch */
				T_ASSERT(ms_gmodel_predict(&f.cfg, &f.lora, 2, 16, col, f32,
							   MS_EXPERT_GEMM_FUSED, 0, &a) == MS_OK);
				T_ASSERT_EQ_INT((int64_t)a.acts, (int64_t)b.acts);
				T_ASSERT(f32 ? a.scratch == b.scratch : a.scratch < b.scratch);
			}
		fam_close(&f);
	}
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_blas_symbols),
	T_CASE(test_predict_flash_attention),
	T_CASE(test_predict_grouped),
	T_CASE(test_golden_qwen3moe),
	T_CASE(test_golden_mixtral),
	T_CASE(test_golden_glm4moe),
	T_CASE(test_golden_qwen3moe_var),
	T_CASE(test_golden_glm4moe_var),
	T_CASE(test_fd_qwen3moe),
	T_CASE(test_fd_mixtral),
	T_CASE(test_fd_glm4moe),
	T_CASE(test_fd_qwen3moe_var),
	T_CASE(test_fd_glm4moe_var),
	T_CASE(test_fd_dropout),
	T_CASE(test_colwise_qwen3moe),
	T_CASE(test_colwise_glm4moe),
	T_CASE(test_routing),
	T_CASE(test_fused_experts),
	T_CASE(test_threads_bitexact),
	T_CASE(test_ep_qwen3moe),
	T_CASE(test_ep_glm4moe),
	T_CASE(test_ep_refusals),
	T_CASE(test_accumulate),
	T_CASE(test_dropout),
	T_CASE(test_warm_rank_pattern),
	T_CASE(test_warm_perexpert_mixtral),
	T_CASE(test_cfg_refusals),
	T_CASE(test_weight_refusals),
	T_CASE(test_adapter_config),
	T_CASE(test_adapter_config_peft),
	T_CASE(test_kv_decode),
};

T_MAIN(cases)
