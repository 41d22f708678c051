/*
 * optim.c: AdamW, the warmup + cosine schedule and gradient clipping (see
 * optim.h for the formulas). The element-wise update follows the order of
 * operations of torch.optim.AdamW's single-tensor path on float32 tensors
 * (lerp for the first moment, mul + addcmul for the second, addcdiv for the
 * step, each evaluated left to right as ATen's CPU kernels do), so that its
 * rounding is the same step for step.
 */
#include "train/optim.h"

#include <math.h>
#include <string.h>

static const char *const sched_names[] = {
	[MS_SCHED_COSINE] = "cosine",
	[MS_SCHED_CONSTANT] = "constant",
};

const char *ms_sched_name(enum ms_sched_kind k)
{
	return (unsigned)k < sizeof(sched_names) / sizeof(sched_names[0]) ? sched_names[k] : "?";
}

int ms_sched_parse(const char *s, enum ms_sched_kind *out)
{
	for (size_t i = 0; i < sizeof(sched_names) / sizeof(sched_names[0]); i++)
		if (!strcmp(s, sched_names[i])) {
			*out = (enum ms_sched_kind)i;
			return MS_OK;
		}
	return MS_EINVAL;
}

void ms_adamw_cfg_init(struct ms_adamw_cfg *c)
{
	memset(c, 0, sizeof(*c));
	c->lr = 1e-3;
	c->beta1 = 0.9;
	c->beta2 = 0.999;
	c->eps = 1e-8;
	c->weight_decay = 0.01;
	c->total_steps = 1;
	c->schedule = MS_SCHED_COSINE;
}

int ms_adamw_cfg_check(const struct ms_adamw_cfg *c, struct ms_err *err)
{
	/* written so that NaN fails every test */
	if (!(c->lr > 0 && c->lr < 1e3))
		return ms_err_set(err, MS_EINVAL, "'lr': %g is not in (0, 1000)", c->lr);
	if (!(c->beta1 >= 0 && c->beta1 < 1))
		return ms_err_set(err, MS_EINVAL, "'betas[0]': %g is not in [0, 1)", c->beta1);
	if (!(c->beta2 >= 0 && c->beta2 < 1))
		return ms_err_set(err, MS_EINVAL, "'betas[1]': %g is not in [0, 1)", c->beta2);
	if (!(c->eps > 0 && c->eps < 1))
		return ms_err_set(err, MS_EINVAL, "'eps': %g is not in (0, 1)", c->eps);
	if (!(c->weight_decay >= 0 && c->weight_decay < 1e3))
		return ms_err_set(err, MS_EINVAL, "'weight_decay': %g is not in [0, 1000)",
				  c->weight_decay);
	if (!(c->clip >= 0 && c->clip < 1e30))
		return ms_err_set(err, MS_EINVAL, "'clip': %g is not a norm >= 0", c->clip);
	if (c->total_steps < 1)
		return ms_err_set(err, MS_EINVAL, "'steps': must be at least 1");
	return MS_OK;
}

double ms_sched_lr(const struct ms_adamw_cfg *c, uint64_t k)
{
	double p, f;

	if (k < c->warmup)
		return c->lr * (double)k / (double)(c->warmup ? c->warmup : 1);
	if (c->schedule == MS_SCHED_CONSTANT)
		return c->lr;
	p = (double)(k - c->warmup) /
	    (double)(c->total_steps > c->warmup ? c->total_steps - c->warmup : 1);
	f = 0.5 * (1.0 + cos(M_PI * p));
	return c->lr * (f > 0 ? f : 0);
}

double ms_grad_norm(const struct ms_optim_param *p, size_t np)
{
	double s = 0;

	for (size_t i = 0; i < np; i++)
		for (size_t j = 0; j < p[i].n; j++)
			s += (double)p[i].g[j] * (double)p[i].g[j];
	return sqrt(s);
}

double ms_grad_clip(const struct ms_optim_param *p, size_t np, double clip)
{
	double norm = ms_grad_norm(p, np), coef;
	float cf;

	if (clip <= 0)
		return norm;
	coef = clip / (norm + 1e-6);
	if (!(coef < 1.0))
		return norm;
	cf = (float)coef;
	for (size_t i = 0; i < np; i++)
		for (size_t j = 0; j < p[i].n; j++)
			p[i].g[j] *= cf;
	return norm;
}

void ms_adamw_free(struct ms_adamw *o)
{
	if (!o)
		return;
	for (size_t i = 0; o->m && i < o->np; i++)
		ms_free(o->m[i]);
	for (size_t i = 0; o->v && i < o->np; i++)
		ms_free(o->v[i]);
	ms_free(o->m);
	ms_free(o->v);
	ms_free(o->p);
	ms_free(o);
}

int ms_adamw_new(const struct ms_adamw_cfg *cfg, const struct ms_optim_param *p,
		 size_t np, struct ms_adamw **out, struct ms_err *err)
{
	struct ms_adamw *o;
	int rc;

	*out = NULL;
	if ((rc = ms_adamw_cfg_check(cfg, err)) != MS_OK)
		return rc;
	if (!(o = ms_calloc(1, sizeof(*o))))
		return ms_err_nomem(err);
	o->cfg = *cfg;
	o->np = np;
	if (!(o->p = ms_calloc(np ? np : 1, sizeof(*o->p))) ||
	    !(o->m = ms_calloc(np ? np : 1, sizeof(*o->m))) ||
	    !(o->v = ms_calloc(np ? np : 1, sizeof(*o->v))))
		goto oom;
	for (size_t i = 0; i < np; i++) {
		o->p[i] = p[i];
		if (!(o->m[i] = ms_calloc(p[i].n ? p[i].n : 1, sizeof(float))) ||
		    !(o->v[i] = ms_calloc(p[i].n ? p[i].n : 1, sizeof(float))))
			goto oom;
	}
	*out = o;
	return MS_OK;
oom:
	ms_adamw_free(o);
	return ms_err_nomem(err);
}

/* torch's lerp on CPU: self + w * (end - self) for |w| < 0.5, else
 * end - (end - self) * (1 - w). */
static inline float lerpf(float self, float end, float w)
{
	return fabsf(w) < 0.5f ? self + w * (end - self) : end - (end - self) * (1.0f - w);
}

void ms_adamw_update(struct ms_adamw *o, double lr)
{
	const struct ms_adamw_cfg *c = &o->cfg;
	double bc1, bc2;
	float decay, w1, b2, w2, step_size, bc2_sqrt, eps;

	o->step++;
	bc1 = 1.0 - pow(c->beta1, (double)o->step);
	bc2 = 1.0 - pow(c->beta2, (double)o->step);
	decay = (float)(1.0 - lr * c->weight_decay);
	w1 = (float)(1.0 - c->beta1);
	b2 = (float)c->beta2;
	w2 = (float)(1.0 - c->beta2);
	step_size = (float)(lr / bc1);
	bc2_sqrt = (float)sqrt(bc2);
	eps = (float)c->eps;
	for (size_t i = 0; i < o->np; i++) {
		float *w = o->p[i].w, *m = o->m[i], *v = o->v[i];
		const float *g = o->p[i].g;

		for (size_t j = 0; j < o->p[i].n; j++) {
			float denom;

			if (c->weight_decay != 0)
				w[j] *= decay;
			m[j] = lerpf(m[j], g[j], w1);
			v[j] = v[j] * b2 + w2 * g[j] * g[j];
			denom = sqrtf(v[j]) / bc2_sqrt + eps;
			w[j] = w[j] + (-step_size) * m[j] / denom;
		}
	}
}
