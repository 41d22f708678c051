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

#include "train_fixture.h"

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
	c.temperature = 0.7;
	c.kl_coef = 0.5;
	c.kl_est = est;
	c.ent_coef = 0.05;
	c.format_bonus = 1;
	c.seed = 3;
	optim_default(&o, 5e-2, 10);
	T_ASSERT_EQ_INT(ms_rl_new(f.m, &c, &o, NULL, &r, &err), MS_OK);
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

/* ---- rollouts ------------------------------------------------------------------ */

/* The behaviour log-probs kept while sampling token by token equal those
 * of one forward of the finished sequences, the completions follow the
 * rules (prompt kept, END ends one, PAD and mask 0 after), and a rollout
 * is a function of (seed, step): the same again, another for another
 * step or seed. */
static int test_rollout(void)
{
	struct fix f;
	struct ms_rl_cfg c;
	struct ms_adamw_cfg o;
	struct ms_rl *r = NULL, *r2 = NULL;
	struct ms_err err = {0};
	uint32_t V;
	size_t N, S;
	float *lg;
	int32_t *ids0;
	double worst = 0;
	uint64_t ntok = 0;

	T_ASSERT(fix_open(&f, 1, 0) == 0);
	ms_rl_cfg_init(&c);
	c.prompts = 3;
	c.group = 4;
	c.prompt_len = 3;
	c.max_new = 5;
	c.temperature = 0.5;
	c.top_p = 0.9;
	c.seed = 11;
	optim_default(&o, 1e-2, 10);
	T_ASSERT_EQ_INT(ms_rl_new(f.m, &c, &o, NULL, &r, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_rl_rollout(r, 2, &err), MS_OK);
	V = f.cfg.vocab;
	N = r->b.n;
	S = r->b.seq;
	T_ASSERT_EQ_INT(S, 4 + 5);
	lg = malloc(N * S * V * sizeof *lg);
	ids0 = malloc(N * S * sizeof *ids0);
	T_ASSERT(lg && ids0);
	T_ASSERT_EQ_INT(ms_model_forward(f.m, r->b.ids, (uint32_t)N, (uint32_t)S, lg, &err), MS_OK);
	for (size_t i = 0; i < N; i++) {
		int ended = 0;
		T_ASSERT_EQ_INT(r->b.ids[i * S + 3], MS_DATA_TOK_SEP);
		for (size_t t = 4; t < S; t++) {
			const float *z = lg + (i * S + t - 1) * V;
			double mx = z[0], sum = 0, lp;
			if (ended) {
				T_ASSERT(r->b.ids[i * S + t] == 0 && !r->b.mask[i * S + t]);
				continue;
			}
			T_ASSERT(r->b.mask[i * S + t]);
			for (uint32_t v = 1; v < V; v++)
				mx = z[v] > mx ? z[v] : mx;
			for (uint32_t v = 0; v < V; v++)
				sum += exp(((double)z[v] - mx) / c.temperature);
			lp = ((double)z[r->b.ids[i * S + t]] - mx) / c.temperature - log(sum);
			if (fabs(lp - r->b.logp_old[i * S + t]) > worst)
				worst = fabs(lp - r->b.logp_old[i * S + t]);
			ntok++;
			ended = r->b.ids[i * S + t] == MS_DATA_TOK_END;
		}
	}
	fprintf(stderr, "  %llu sampled tokens, behaviour log-prob vs full forward: %.3g\n",
		(unsigned long long)ntok, worst);
	T_ASSERT(ntok >= N);
	T_ASSERT_MSG(worst < 1e-5, "behaviour log-probs differ by %g", worst);
	memcpy(ids0, r->b.ids, N * S * sizeof *ids0);
	T_ASSERT_EQ_INT(ms_rl_new(f.m, &c, &o, NULL, &r2, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_rl_rollout(r2, 2, &err), MS_OK);
	T_ASSERT(!memcmp(ids0, r2->b.ids, N * S * sizeof *ids0));
	T_ASSERT_EQ_INT(ms_rl_rollout(r2, 3, &err), MS_OK);
	T_ASSERT(memcmp(ids0, r2->b.ids, N * S * sizeof *ids0) != 0);
	ms_rl_free(r2);
	r2 = NULL;
	c.seed = 12;
	T_ASSERT_EQ_INT(ms_rl_new(f.m, &c, &o, NULL, &r2, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_rl_rollout(r2, 2, &err), MS_OK);
	T_ASSERT(memcmp(ids0, r2->b.ids, N * S * sizeof *ids0) != 0);
	free(lg);
	free(ids0);
	ms_rl_free(r);
	ms_rl_free(r2);
	fix_close(&f);
	return 0;
}

/* Rewards: the exact answer scores 1 (+ the format bonus), a wrong one
 * less, a malformed one nothing. */
static int test_reward(void)
{
	struct fix f;
	struct ms_rl_cfg c;
	struct ms_adamw_cfg o;
	struct ms_rl *r = NULL;
	struct ms_err err = {0};
	size_t S;

	T_ASSERT(fix_open(&f, 0, MS_LORA_Q) == 0);
	ms_rl_cfg_init(&c);
	c.task = MS_TASK_REVERSE;
	c.prompts = 1;
	c.group = 2;
	c.prompt_len = 3;
	c.max_new = 4;
	c.format_bonus = 0.5;
	optim_default(&o, 1e-2, 10);
	T_ASSERT_EQ_INT(ms_rl_new(f.m, &c, &o, NULL, &r, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_rl_rollout(r, 0, &err), MS_OK);
	S = r->b.seq;
	T_ASSERT_EQ_INT(r->b.alen, 3);
	for (int k = 0; k < 3; k++) /* the answer is the prompt reversed */
		T_ASSERT_EQ_INT(r->b.answer[k], r->b.ids[2 - k]);
	{
		const int32_t *a = r->b.answer;
		int32_t good[4] = {a[0], a[1], a[2], MS_DATA_TOK_END};
		int32_t half[4] = {a[0], a[1] == 3 ? 4 : 3, a[2], 7};
		T_ASSERT(fabs(ms_rl_reward(r, good, 4, a, 3) - 1.5) < 1e-12);
		T_ASSERT(fabs(ms_rl_reward(r, half, 4, a, 3) - (2.0 / 3 + 0.5 * 3 / 4)) < 1e-12);
		T_ASSERT(fabs(ms_rl_reward(r, half, 0, a, 3)) < 1e-12);
	}
	(void)S;
	ms_rl_free(r);
	fix_close(&f);
	return 0;
}

/* ---- learning and collapse ------------------------------------------------------ */

struct run_out {
	double first, last;          /* mean reward of the first / last 10 steps */
	size_t nev;
	struct ms_rl_event ev[MS_RL_NRULES];
};

/* 60 fixed-seed GRPO steps on copy (2 symbols, completions of up to 3
 * tokens, 4 prompts x 4 samples, temperature 0.25, format bonus 1), the
 * reg_share rule at 1 over 5 steps. */
static int grpo_run(double kl_coef, double lr, uint64_t seed, struct run_out *ro)
{
	struct fix f;
	struct ms_rl_cfg c;
	struct ms_adamw_cfg o;
	struct ms_rl *r = NULL;
	struct ms_err err = {0};
	const int steps = 60;

	memset(ro, 0, sizeof *ro);
	T_ASSERT(fix_open(&f, 0, MS_LORA_EXPERTS | MS_LORA_Q | MS_LORA_K | MS_LORA_V |
			  MS_LORA_O) == 0);
	ms_rl_cfg_init(&c);
	c.prompts = 4;
	c.group = 4;
	c.prompt_len = 2;
	c.max_new = 3;
	c.temperature = 0.25;
	c.format_bonus = 1;
	c.kl_coef = kl_coef;
	c.seed = seed;
	c.window = 5;
	c.reg_share_max = 1;
	optim_default(&o, lr, steps);
	T_ASSERT_EQ_INT(ms_rl_new(f.m, &c, &o, NULL, &r, &err), MS_OK);
	for (int k = 0; k < steps; k++) {
		struct ms_rl_metrics s;
		struct ms_rl_event ev[MS_RL_NRULES];
		size_t nev;
		T_ASSERT_EQ_INT(ms_rl_step(r, &s, ev, &nev, &err), MS_OK);
		for (size_t e = 0; e < nev && ro->nev < MS_RL_NRULES; e++)
			ro->ev[ro->nev++] = ev[e];
		if (k < 10)
			ro->first += s.reward_mean / 10;
		if (k >= steps - 10)
			ro->last += s.reward_mean / 10;
	}
	fprintf(stderr, "  kl %g lr %g seed %llu: reward %.4f -> %.4f, %zu event(s)\n",
		kl_coef, lr, (unsigned long long)seed, ro->first, ro->last, ro->nev);
	ms_rl_free(r);
	fix_close(&f);
	return 0;
}

/* The healthy configuration learns (reward up by 0.1 at least: random
 * completions score about 0.03) and the monitor stays quiet; the same
 * with a KL weight of 5 stays at the random level and the regulariser
 * share rule fires within the first steps. */
static int test_learns_and_collapses(void)
{
	struct run_out h, k;
	T_ASSERT(grpo_run(0, 3e-2, 0, &h) == 0);
	T_ASSERT_MSG(h.last > h.first + 0.1, "reward %.4f -> %.4f: did not learn", h.first,
		     h.last);
	T_ASSERT_EQ_INT(h.nev, 0);
	T_ASSERT(grpo_run(5, 3e-2, 0, &k) == 0);
	T_ASSERT_MSG(k.last < h.last - 0.1, "KL 5: reward %.4f -> %.4f", k.first, k.last);
	T_ASSERT_EQ_INT(k.nev, 1);
	T_ASSERT_EQ_INT(k.ev[0].rule, MS_RL_REG_SHARE);
	T_ASSERT(k.ev[0].step <= 20 && k.ev[0].value > 1);
	return 0;
}

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
	T_CASE(test_rollout),
	T_CASE(test_reward),
	T_CASE(test_learns_and_collapses),
	T_CASE(test_monitor_window),
	T_CASE(test_event_record),
	T_CASE(test_fd_k3),
	T_CASE(test_fd_k1),
};

T_MAIN(cases)
