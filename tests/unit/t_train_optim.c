/*
 * t_train_optim.c: AdamW, the schedule and clipping against hand-computed
 * values and against an independent double-precision implementation of
 * torch.optim.AdamW's formula.
 */
#include <math.h>

#include "test.h"
#include "train/optim.h"

static int close_rel(double a, double b, double tol)
{
	return fabs(a - b) <= tol * (fabs(b) > 1e-12 ? fabs(b) : 1e-12);
}

/* transformers' cosine-with-warmup at hand-computed points. */
static int test_schedule_points(void)
{
	struct ms_adamw_cfg c;

	ms_adamw_cfg_init(&c);
	c.lr = 2e-3;
	c.warmup = 10;
	c.total_steps = 110;
	T_ASSERT(ms_sched_lr(&c, 0) == 0.0);
	T_ASSERT(close_rel(ms_sched_lr(&c, 5), 1e-3, 1e-12));
	T_ASSERT(close_rel(ms_sched_lr(&c, 10), 2e-3, 1e-12));
	T_ASSERT(close_rel(ms_sched_lr(&c, 60), 1e-3, 1e-12));   /* half way */
	T_ASSERT(close_rel(ms_sched_lr(&c, 35), 2e-3 * 0.5 * (1 + cos(M_PI / 4)), 1e-12));
	T_ASSERT(fabs(ms_sched_lr(&c, 110)) < 1e-18);
	T_ASSERT(ms_sched_lr(&c, 500) >= 0);                      /* clamped */
	c.schedule = MS_SCHED_CONSTANT;
	T_ASSERT(close_rel(ms_sched_lr(&c, 5), 1e-3, 1e-12));
	T_ASSERT(ms_sched_lr(&c, 100) == 2e-3);
	c.warmup = 0;
	c.schedule = MS_SCHED_COSINE;
	T_ASSERT(ms_sched_lr(&c, 0) == 2e-3);                     /* no warmup */
	return 0;
}

/* clip_grad_norm_: [3, 4] has norm 5; clip 1 scales by 1 / (5 + 1e-6). */
static int test_clip(void)
{
	float w[2] = {0, 0}, g[2] = {3, 4}, w2[1] = {0}, g2[1] = {0};
	struct ms_optim_param p[2] = {{"a", w, g, 2}, {"b", w2, g2, 1}};
	double n;

	n = ms_grad_clip(p, 2, 1.0);
	T_ASSERT(n == 5.0);
	T_ASSERT(g[0] == (float)3 * (float)(1.0 / (5.0 + 1e-6)));
	T_ASSERT(g[1] == (float)4 * (float)(1.0 / (5.0 + 1e-6)));
	/* under the limit nothing changes */
	g[0] = 0.3f;
	g[1] = 0.4f;
	n = ms_grad_clip(p, 2, 1.0);
	T_ASSERT(close_rel(n, 0.5, 1e-6));
	T_ASSERT(g[0] == 0.3f && g[1] == 0.4f);
	/* clip 0 only measures */
	g[0] = 30;
	n = ms_grad_clip(p, 2, 0);
	T_ASSERT(g[0] == 30 && n > 30);
	return 0;
}

/* The first step, by hand: m_hat = g and v_hat = g^2, so every weight
 * moves by lr * g / (|g| + eps) after the decoupled decay w * (1 - lr wd). */
static int test_first_step_by_hand(void)
{
	float w[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.25f, -4.0f, 1e-3f};
	struct ms_optim_param p = {"w", w, g, 3};
	struct ms_adamw_cfg c;
	struct ms_adamw *o = NULL;
	struct ms_err err = {0};
	double lr = 0.01, wd = 0.1, want[3];

	ms_adamw_cfg_init(&c);
	c.weight_decay = wd;
	c.eps = 1e-8;
	for (int i = 0; i < 3; i++)
		want[i] = w[i] * (1 - lr * wd) - lr * g[i] / (fabs(g[i]) + 1e-8);
	T_ASSERT(ms_adamw_new(&c, &p, 1, &o, &err) == MS_OK);
	ms_adamw_update(o, lr);
	T_ASSERT_EQ_INT(o->step, 1);
	for (int i = 0; i < 3; i++)
		T_ASSERT_MSG(close_rel(w[i], want[i], 1e-6), "w[%d] %.9g want %.9g", i, w[i],
			     want[i]);
	/* the moments are torch's after one step */
	T_ASSERT(close_rel(o->m[0][1], 0.1 * -4.0, 1e-6));
	T_ASSERT(close_rel(o->v[0][1], 0.001 * 16.0, 1e-6));
	ms_adamw_free(o);
	return 0;
}

/* 200 steps with changing gradients, weight decay and a warmup + cosine
 * schedule against a double-precision AdamW written from the formula. */
static int test_trajectory_vs_reference(void)
{
	enum { N = 37, STEPS = 200 };
	float w[N], g[N];
	double rw[N], rm[N] = {0}, rv[N] = {0};
	struct ms_optim_param p = {"w", w, g, N};
	struct ms_adamw_cfg c;
	struct ms_adamw *o = NULL;
	struct ms_err err = {0};
	double maxrel = 0;

	ms_adamw_cfg_init(&c);
	c.lr = 3e-3;
	c.beta1 = 0.8;
	c.beta2 = 0.95;
	c.eps = 1e-6;
	c.weight_decay = 0.05;
	c.warmup = 20;
	c.total_steps = STEPS;
	for (int i = 0; i < N; i++)
		rw[i] = w[i] = (float)sin(i * 0.7) * 0.5f;
	T_ASSERT(ms_adamw_new(&c, &p, 1, &o, &err) == MS_OK);
	for (int t = 1; t <= STEPS; t++) {
		double lr = ms_sched_lr(&c, (uint64_t)t - 1);

		/* gradient of 0.5 * (w - target)^2 plus a wobble: never zero */
		for (int i = 0; i < N; i++)
			g[i] = (float)((rw[i] - cos(i * 0.3)) + 0.1 * sin(t * 0.37 + i));
		for (int i = 0; i < N; i++) {
			double gi = g[i];

			rw[i] *= 1 - lr * c.weight_decay;
			rm[i] = c.beta1 * rm[i] + (1 - c.beta1) * gi;
			rv[i] = c.beta2 * rv[i] + (1 - c.beta2) * gi * gi;
			rw[i] -= lr / (1 - pow(c.beta1, t)) * rm[i] /
				 (sqrt(rv[i]) / sqrt(1 - pow(c.beta2, t)) + c.eps);
		}
		ms_adamw_update(o, lr);
		/* the float path follows the double one; both see the same g,
		 * computed from the reference weights */
		for (int i = 0; i < N; i++) {
			double d = fabs(w[i] - rw[i]);

			if (d > maxrel)
				maxrel = d;
			w[i] = (float)rw[i];
		}
	}
	T_ASSERT_MSG(maxrel < 2e-6, "largest difference per step %.3g", maxrel);
	T_ASSERT_EQ_INT(o->step, STEPS);
	ms_adamw_free(o);
	return 0;
}

/* A step is a pure function of the state: two optimizers fed the same
 * gradients give the same bits. */
static int test_deterministic(void)
{
	float w1[5] = {1, 2, 3, 4, 5}, w2[5] = {1, 2, 3, 4, 5}, g[5];
	struct ms_optim_param p1 = {"w", w1, g, 5}, p2 = {"w", w2, g, 5};
	struct ms_adamw_cfg c;
	struct ms_adamw *a = NULL, *b = NULL;
	struct ms_err err = {0};

	ms_adamw_cfg_init(&c);
	T_ASSERT(ms_adamw_new(&c, &p1, 1, &a, &err) == MS_OK);
	T_ASSERT(ms_adamw_new(&c, &p2, 1, &b, &err) == MS_OK);
	for (int t = 0; t < 50; t++) {
		for (int i = 0; i < 5; i++)
			g[i] = (float)(w1[i] * 0.1 - 0.2 * i);
		ms_adamw_update(a, 1e-2);
		ms_adamw_update(b, 1e-2);
	}
	T_ASSERT(!memcmp(w1, w2, sizeof(w1)));
	T_ASSERT(!memcmp(a->m[0], b->m[0], 5 * sizeof(float)));
	ms_adamw_free(a);
	ms_adamw_free(b);
	return 0;
}

static int test_cfg_check(void)
{
	struct ms_adamw_cfg c;
	struct ms_err err = {0};

	ms_adamw_cfg_init(&c);
	T_ASSERT(ms_adamw_cfg_check(&c, &err) == MS_OK);
	c.beta2 = 1.0;
	T_ASSERT(ms_adamw_cfg_check(&c, &err) == MS_EINVAL);
	T_ASSERT(strstr(err.msg, "betas[1]"));
	ms_adamw_cfg_init(&c);
	c.lr = NAN;
	T_ASSERT(ms_adamw_cfg_check(&c, &err) == MS_EINVAL);
	T_ASSERT(strstr(err.msg, "'lr'"));
	ms_adamw_cfg_init(&c);
	c.eps = 0;
	T_ASSERT(ms_adamw_cfg_check(&c, &err) == MS_EINVAL);
	enum ms_sched_kind k;
	T_ASSERT(ms_sched_parse("cosine", &k) == MS_OK && k == MS_SCHED_COSINE);
	T_ASSERT(ms_sched_parse("linear-ish", &k) == MS_EINVAL);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_schedule_points),
	T_CASE(test_clip),
	T_CASE(test_first_step_by_hand),
	T_CASE(test_trajectory_vs_reference),
	T_CASE(test_deterministic),
	T_CASE(test_cfg_check),
};

T_MAIN(cases)
