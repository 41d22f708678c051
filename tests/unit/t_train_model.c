/*
 * t_train_model.c: the trainer's model (src/train/model.h) against
 * transformers + PEFT goldens (tests/fixtures/train/<family>, written by
 * tests/oracle/train_golden.py), against finite differences of its own
 * loss, resident vs on-demand columnwise weights (bit-identical), EP
 * virtual ranks vs one rank, thread counts, gradient accumulation, and the
 * refusals of configs and weights it does not implement.
 */
#include <math.h>

#include "test.h"
#include "checkpoint.h"
#include "nvfp4.h"
#include "train/model.h"

/* ---- fixtures ------------------------------------------------------------------ */

struct tset {
	struct ms_ckpt *c;
	struct ms_wtensor *t;
	size_t n;
};

static int tset_open(struct tset *s, const char *path)
{
	struct ms_err err = {0};
	memset(s, 0, sizeof *s);
	if (ms_ckpt_open(path, &s->c, &err)) {
		fprintf(stderr, "%s: %s\n", path, err.msg);
		return -1;
	}
	s->n = s->c->ntensors;
	s->t = calloc(s->n ? s->n : 1, sizeof *s->t);
	if (!s->t)
		return -1;
	for (size_t i = 0; i < s->n; i++) {
		const struct ms_tensor *x = s->c->tensors[i];
		s->t[i].name = x->name;
		s->t[i].dtype = x->dtype;
		s->t[i].ndim = x->ndim;
		memcpy(s->t[i].shape, x->shape, sizeof x->shape);
		s->t[i].data = x->data;
		s->t[i].nbytes = x->nbytes;
	}
	return 0;
}

static void tset_close(struct tset *s)
{
	free(s->t);
	ms_ckpt_close(s->c);
	memset(s, 0, sizeof *s);
}

static const struct ms_wtensor *tset_find(const struct tset *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->t[i].name, name))
			return &s->t[i];
	return NULL;
}

struct fam {
	struct ms_model_cfg cfg;
	struct tset base, quant, adapter, gold;
};

static int fam_open(struct fam *f, const char *name)
{
	char p[512];
	const struct ms_ckpt_config *cj;
	struct ms_err err = {0};

	memset(f, 0, sizeof *f);
	if (!strcmp(name, "glm4moe"))
		snprintf(p, sizeof p, "%s/train/glm4moe/base", T_FIXTURES);
	else
		snprintf(p, sizeof p, "%s/hf/%s", T_FIXTURES, name);
	if (tset_open(&f->base, p))
		return -1;
	snprintf(p, sizeof p, "%s/train/%s/quant", T_FIXTURES, name);
	if (tset_open(&f->quant, p))
		return -1;
	snprintf(p, sizeof p, "%s/train/%s/adapter", T_FIXTURES, name);
	if (tset_open(&f->adapter, p))
		return -1;
	snprintf(p, sizeof p, "%s/train/%s/golden.safetensors", T_FIXTURES, name);
	if (tset_open(&f->gold, p))
		return -1;
	cj = ms_ckpt_config(f->base.c, "config.json");
	if (!cj || ms_model_cfg_parse(cj->text, cj->len, &f->cfg, &err)) {
		fprintf(stderr, "%s config: %s\n", name, err.msg);
		return -1;
	}
	return 0;
}

static void fam_close(struct fam *f)
{
	tset_close(&f->base);
	tset_close(&f->quant);
	tset_close(&f->adapter);
	tset_close(&f->gold);
}

static const struct ms_lora_cfg LORA_ALL = {
	.r = 4, .alpha = 8, .dropout = 0,
	.targets = MS_LORA_EXPERTS | MS_LORA_Q | MS_LORA_K | MS_LORA_V | MS_LORA_O,
	.seed = 1,
};

static struct ms_model *fam_model(struct fam *f, const struct ms_model_opts *o,
				  int warm)
{
	struct ms_model *m = NULL;
	struct ms_err err = {0};
	if (ms_model_build(&m, &f->cfg, f->base.t, f->base.n, f->quant.t, f->quant.n,
			   &LORA_ALL, warm ? f->adapter.t : NULL,
			   warm ? f->adapter.n : 0, o, &err)) {
		fprintf(stderr, "build: %s\n", err.msg);
		return NULL;
	}
	return m;
}

static float fget(const struct ms_wtensor *t, size_t i)
{
	float f;
	memcpy(&f, (const uint8_t *)t->data + 4 * i, 4);
	return f;
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

/* ---- finite differences -------------------------------------------------------- */

static double loss_of(struct ms_model *m, const int32_t *ids, uint32_t B, uint32_t S)
{
	double l = 0;
	uint64_t nt;
	struct ms_err err = {0};
	const struct ms_param *ps;
	size_t np = ms_model_params(m, &ps);
	/* the step accumulates gradients; keep them out of the way */
	if (ms_model_step(m, ids, NULL, B, S, 0.0, 0, &l, &nt, &err))
		return NAN;
	(void)np;
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
static int fd(const char *name)
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
	m = fam_model(&f, NULL, 1);
	T_ASSERT(m);
	for (int i = 0; i < 14; i++)
		ids[i] = (i * 37 + 11) % (int)f.cfg.vocab;
	np = ms_model_params(m, &ps);
	ms_model_zero_grad(m);
	T_ASSERT(ms_model_step(m, ids, NULL, 2, 7, 1.0, 0, &l0, &nt, &err) == MS_OK);
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
			lp = loss_of(m, ids, 2, 7);
			for (uint64_t e = 0; e < ps[i].n; e++)
				ps[i].w[e] = (float)(w0[e] - h * v[e]);
			lm = loss_of(m, ids, 2, 7);
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

static int test_fd_qwen3moe(void) { return fd("qwen3moe"); }
static int test_fd_mixtral(void) { return fd("mixtral"); }
static int test_fd_glm4moe(void) { return fd("glm4moe"); }

static const struct t_case cases[] = {
	T_CASE(test_golden_qwen3moe),
	T_CASE(test_golden_mixtral),
	T_CASE(test_golden_glm4moe),
	T_CASE(test_fd_qwen3moe),
	T_CASE(test_fd_mixtral),
	T_CASE(test_fd_glm4moe),
};

T_MAIN(cases)
