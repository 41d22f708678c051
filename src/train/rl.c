/*
 * rl.c: GRPO on the CPU (rl.h): rollouts, rewards, the loss and its
 * gradient through ms_model_step_fn, and the collapse monitor.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "train/rl.h"

static int oom(struct ms_err *err)
{
	return ms_err_set(err, MS_ENOMEM, "out of memory");
}

/* ---- monitor ---------------------------------------------------------------- */

const char *ms_rl_rule_name(enum ms_rl_rule r)
{
	static const char *n[MS_RL_NRULES] = {"zero_var", "reward_std", "entropy",
					      "reg_share"};
	return (unsigned)r < MS_RL_NRULES ? n[r] : "?";
}

void ms_rl_monitor_feed(struct ms_rl_monitor *mon, const struct ms_rl_cfg *c,
			const struct ms_rl_metrics *s, struct ms_rl_event *ev, size_t *nev)
{
	double thr[MS_RL_NRULES] = {c->zero_var_max, c->reward_std_min, c->entropy_min,
				    c->reg_share_max};
	double val[MS_RL_NRULES] = {s->zero_var_share, s->group_std, s->entropy,
				    s->reg_share};
	*nev = 0;
	for (int k = 0; k < MS_RL_NRULES; k++) {
		/* zero_var and reg_share fire above their line, the others below */
		int over = k == MS_RL_ZERO_VAR || k == MS_RL_REG_SHARE ? val[k] > thr[k]
								       : val[k] < thr[k];
		if (thr[k] <= 0)
			continue;
		mon->run[k] = over ? mon->run[k] + 1 : 0;
		if (mon->run[k] >= c->window && !mon->fired[k]) {
			mon->fired[k] = 1;
			ev[*nev].rule = (enum ms_rl_rule)k;
			ev[*nev].step = s->step;
			ev[*nev].window = c->window;
			ev[*nev].value = val[k];
			ev[*nev].threshold = thr[k];
			(*nev)++;
		}
	}
}

int ms_rl_event_json(const struct ms_rl_event *e, char **json, struct ms_err *err)
{
	uint64_t mark = ms_json_mark();
	cJSON *o;
	char *s = NULL;

	*json = NULL;
	ms_json_init();
	if (!(o = cJSON_CreateObject()))
		return oom(err);
	cJSON_AddStringToObject(o, "rule", ms_rl_rule_name(e->rule));
	cJSON_AddNumberToObject(o, "step", (double)e->step);
	cJSON_AddNumberToObject(o, "window", e->window);
	cJSON_AddNumberToObject(o, "value", e->value);
	cJSON_AddNumberToObject(o, "threshold", e->threshold);
	if (!ms_json_failed(mark))
		s = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	if (!s || ms_json_failed(mark)) {
		ms_free(s);
		return oom(err);
	}
	*json = s;
	return MS_OK;
}

int ms_rl_metrics_json(const struct ms_rl_metrics *s, char **json, struct ms_err *err)
{
	uint64_t mark = ms_json_mark();
	cJSON *o;
	char *t = NULL;

	*json = NULL;
	ms_json_init();
	if (!(o = cJSON_CreateObject()))
		return oom(err);
	cJSON_AddNumberToObject(o, "step", (double)s->step);
	cJSON_AddNumberToObject(o, "reward_mean", s->reward_mean);
	cJSON_AddNumberToObject(o, "reward_std", s->reward_std);
	cJSON_AddNumberToObject(o, "group_std", s->group_std);
	cJSON_AddNumberToObject(o, "zero_var_share", s->zero_var_share);
	cJSON_AddNumberToObject(o, "kl", s->kl);
	cJSON_AddNumberToObject(o, "entropy", s->entropy);
	cJSON_AddNumberToObject(o, "clip_frac", s->clip_frac);
	cJSON_AddNumberToObject(o, "grad_norm", s->grad_norm);
	cJSON_AddNumberToObject(o, "pg_norm", s->pg_norm);
	cJSON_AddNumberToObject(o, "reg_norm", s->reg_norm);
	cJSON_AddNumberToObject(o, "reg_share", s->reg_share);
	cJSON_AddNumberToObject(o, "resp_len", s->resp_len);
	cJSON_AddNumberToObject(o, "tokens_per_s", s->tokens_per_s);
	cJSON_AddNumberToObject(o, "seconds", s->seconds);
	if (!ms_json_failed(mark))
		t = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	if (!t || ms_json_failed(mark)) {
		ms_free(t);
		return oom(err);
	}
	*json = t;
	return MS_OK;
}

int ms_rl_event_record(struct ms_inv *inv, int64_t run_id, const struct ms_rl_event *e,
		       struct ms_err *err)
{
	char *js = NULL;
	int rc;

	if ((rc = ms_rl_event_json(e, &js, err)) != MS_OK)
		return rc;
	rc = ms_inv_event_add(inv, run_id, "rl_collapse", js, NULL, err);
	ms_free(js);
	return rc;
}

/* ---- trainer ------------------------------------------------------------------ */

static void batch_release(struct ms_rl_batch *b)
{
	ms_free(b->ids);
	ms_free(b->mask);
	ms_free(b->logp_old);
	ms_free(b->logp_ref);
	ms_free(b->answer);
	ms_free(b->reward);
	ms_free(b->adv);
	ms_free(b->len);
	memset(b, 0, sizeof *b);
}

void ms_rl_free(struct ms_rl *r)
{
	if (!r)
		return;
	if (r->ref)
		for (size_t i = 0; i < r->np; i++)
			ms_free(r->ref[i]);
	ms_free(r->ref);
	ms_free(r->op);
	if (r->own_opt)
		ms_adamw_free(r->opt);
	ms_data_free(r->data);
	ms_kv_cache_free(r->kv);
	batch_release(&r->b);
	ms_free(r);
}

int ms_rl_new(struct ms_model *m, const struct ms_rl_cfg *cfg,
	      const struct ms_adamw_cfg *optim, struct ms_adamw *opt, struct ms_rl **out,
	      struct ms_err *err)
{
	struct ms_rl *r = NULL;
	struct ms_data_cfg dc = {0};
	struct ms_rl_batch *b;
	uint32_t n = cfg->prompt_len;
	size_t N, S;
	int rc;

	*out = NULL;
	if ((rc = ms_rl_cfg_check(cfg, err)) != MS_OK ||
	    (rc = ms_adamw_cfg_check(optim, err)) != MS_OK)
		return rc;
	if (!(r = ms_calloc(1, sizeof *r)))
		return oom(err);
	r->cfg = *cfg;
	r->m = m;
	dc.task = cfg->task;
	dc.vocab = ms_model_config(m)->vocab;
	/* the data's sequence length that gives prompts of n symbols */
	dc.seq_len = cfg->task == MS_TASK_MODSUM ? n + 3 : 2 * n + 2;
	if (dc.seq_len < 4)
		dc.seq_len = 4;
	dc.batch = 1;
	dc.seed = cfg->seed;
	if ((rc = ms_data_open(&dc, &r->data, err)) != MS_OK)
		goto out;
	r->np = ms_model_params(m, &r->ps);
	if (!(r->op = ms_calloc(r->np + 1, sizeof *r->op)) ||
	    !(r->ref = ms_calloc(r->np + 1, sizeof *r->ref))) {
		rc = oom(err);
		goto out;
	}
	for (size_t i = 0; i < r->np; i++) {
		r->op[i].name = r->ps[i].name;
		r->op[i].w = r->ps[i].w;
		r->op[i].g = r->ps[i].g;
		r->op[i].n = r->ps[i].n;
		if (!(r->ref[i] = ms_malloc(r->ps[i].n * sizeof(float)))) {
			rc = oom(err);
			goto out;
		}
		memcpy(r->ref[i], r->ps[i].w, r->ps[i].n * sizeof(float));
	}
	if (opt) {
		r->opt = opt;
	} else {
		if ((rc = ms_adamw_new(optim, r->op, r->np, &r->opt, err)) != MS_OK)
			goto out;
		r->own_opt = 1;
	}
	b = &r->b;
	b->n = cfg->prompts * cfg->group;
	b->plen = n + 1;
	b->seq = b->plen + cfg->max_new;
	N = b->n;
	S = b->seq;
	if (!(b->ids = ms_calloc(N * S, sizeof *b->ids)) ||
	    !(b->mask = ms_calloc(N * S, 1)) ||
	    !(b->logp_old = ms_calloc(N * S, sizeof(float))) ||
	    !(b->logp_ref = ms_calloc(N * S, sizeof(float))) ||
	    !(b->answer = ms_calloc((size_t)cfg->prompts * (n + 1), sizeof(int32_t))) ||
	    !(b->reward = ms_calloc(N, sizeof(double))) ||
	    !(b->adv = ms_calloc(N, sizeof(double))) ||
	    !(b->len = ms_calloc(N, sizeof(uint32_t)))) {
		rc = oom(err);
		goto out;
	}
	*out = r;
	r = NULL;
out:
	ms_rl_free(r);
	return rc;
}

static double uniform(uint64_t *st)
{
	return (double)(ms_rng_next(st) >> 11) * 0x1p-53;
}

struct cand {
	double p;
	uint32_t v;
};

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->p != y->p)
		return x->p > y->p ? -1 : 1;
	return x->v < y->v ? -1 : x->v > y->v; /* ties: lower id first, fixed */
}

/* Draw from softmax(z / T) within top_p; *logp1 gets the draw's log-prob
 * under softmax(z / T) (before the top_p cut). */
static uint32_t sample(const float *z, uint32_t V, double T, double top_p,
		       struct cand *c, uint64_t *st, float *logp1)
{
	double mx = z[0], sum = 0, u, acc = 0, keep = 0;
	uint32_t k, nk = V, tok;

	for (uint32_t v = 1; v < V; v++)
		if (z[v] > mx)
			mx = z[v];
	for (uint32_t v = 0; v < V; v++) {
		c[v].p = exp(((double)z[v] - mx) / T);
		c[v].v = v;
		sum += c[v].p;
	}
	for (uint32_t v = 0; v < V; v++)
		c[v].p /= sum;
	if (top_p < 1) {
		qsort(c, V, sizeof *c, cand_cmp);
		for (k = 0; k < V; k++) {
			acc += c[k].p;
			if (acc >= top_p) {
				k++;
				break;
			}
		}
		nk = k < V ? k : V;
	}
	for (k = 0; k < nk; k++)
		keep += c[k].p;
	u = uniform(st) * keep;
	acc = 0;
	tok = c[nk - 1].v;
	for (k = 0; k < nk; k++) {
		acc += c[k].p;
		if (u < acc) {
			tok = c[k].v;
			break;
		}
	}
	*logp1 = (float)(((double)z[tok] - mx) / T - log(sum));
	return tok;
}

/* The shaping terms: the format bonus and the length penalty. */
static double shaping(const struct ms_rl *r, const int32_t *c, uint32_t len, uint32_t alen)
{
	uint32_t A = r->data->alphabet, form = 0;

	for (uint32_t i = 0; i < alen && i < len; i++)
		form += c[i] >= 3 && (uint32_t)c[i] < 3 + A;
	form += len > alen && c[alen] == MS_DATA_TOK_END;
	return r->cfg.format_bonus * (double)form / (alen + 1) -
	       r->cfg.length_penalty * (double)len / r->cfg.max_new;
}

double ms_rl_reward(const struct ms_rl *r, const int32_t *c, uint32_t len,
		    const int32_t *a, uint32_t alen)
{
	uint32_t match = 0;

	for (uint32_t i = 0; i < alen && i < len; i++)
		match += c[i] == a[i];
	return (double)match / alen + shaping(r, c, len, alen);
}

static void put_ids(FILE *f, const char *key, const int32_t *v, uint32_t n)
{
	fprintf(f, "\"%s\":[", key);
	for (uint32_t i = 0; i < n; i++)
		fprintf(f, "%s%d", i ? "," : "", v[i]);
	fputc(']', f);
}

/*
 * The external reward: the batch's completions as JSONL on the command's
 * standard input (one object per completion, in batch order: "index",
 * "group", "task", "prompt", "completion", "answer", token ids; the
 * completion without padding, END included when sampled), one finite
 * number per line on its standard output, exactly one per completion.
 * The command runs through /bin/sh in the directory dir. Anything else is
 * MS_EINVAL naming the command and what was wrong.
 */
static int external_rewards(struct ms_rl *r, double *out, struct ms_err *err)
{
	const struct ms_rl_batch *b = &r->b;
	const struct ms_rl_cfg *c = &r->cfg;
	const char *tmp = getenv("TMPDIR");
	char *path = NULL, *cmd = NULL, *qd = NULL, line[512];
	FILE *f = NULL, *p = NULL;
	size_t got = 0, nq = 0;
	int fd, rc = MS_OK, st;

	if (!(path = ms_asprintf("%s/ms-rl-reward-XXXXXX", tmp && *tmp ? tmp : "/tmp")))
		return oom(err);
	if ((fd = mkstemp(path)) < 0 || !(f = fdopen(fd, "w"))) {
		rc = ms_err_set(err, MS_EIO, "'%s': cannot create: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		goto out;
	}
	for (uint32_t i = 0; i < b->n; i++) {
		uint32_t g = i / c->group;
		fprintf(f, "{\"index\":%u,\"group\":%u,\"task\":\"%s\",", i, g,
			ms_task_name(c->task));
		put_ids(f, "prompt", b->ids + (size_t)i * b->seq, b->plen);
		fputc(',', f);
		put_ids(f, "completion", b->ids + (size_t)i * b->seq + b->plen, b->len[i]);
		fputc(',', f);
		put_ids(f, "answer", b->answer + (size_t)g * b->plen, b->alen);
		fputs("}\n", f);
	}
	if (fclose(f)) {
		f = NULL;
		rc = ms_err_set(err, MS_EIO, "'%s': write failed: %s", path, strerror(errno));
		goto out;
	}
	f = NULL;
	/* the directory single-quoted for the shell ('\'' for a quote) */
	if (!(qd = ms_malloc(4 * strlen(c->reward_dir ? c->reward_dir : ".") + 1))) {
		rc = oom(err);
		goto out;
	}
	for (const char *d = c->reward_dir ? c->reward_dir : "."; *d; d++) {
		if (*d == '\'') {
			memcpy(qd + nq, "'\\''", 4);
			nq += 4;
		} else {
			qd[nq++] = *d;
		}
	}
	qd[nq] = 0;
	if (!(cmd = ms_asprintf("cd '%s' && { %s\n} <'%s'", qd, c->reward_cmd, path))) {
		rc = oom(err);
		goto out;
	}
	fflush(NULL);
	if (!(p = popen(cmd, "r"))) {
		rc = ms_err_set(err, MS_EIO, "reward command '%s': cannot start: %s", c->reward_cmd,
				strerror(errno));
		goto out;
	}
	while (fgets(line, sizeof line, p)) {
		char *end;
		double v;
		size_t n = strlen(line);

		if (n && line[n - 1] == '\n')
			line[--n] = 0;
		if (got == b->n) {
			rc = ms_err_set(err, MS_EINVAL, "reward command '%s': more than %u lines of "
					"rewards for %u completions", c->reward_cmd, b->n, b->n);
			break;
		}
		v = strtod(line, &end);
		while (*end == ' ' || *end == '\t' || *end == '\r')
			end++;
		if (end == line || *end || !isfinite(v)) {
			rc = ms_err_set(err, MS_EINVAL, "reward command '%s': line %zu: '%.40s' is not "
					"a finite number", c->reward_cmd, got + 1, line);
			break;
		}
		out[got++] = v;
	}
	/* read to the end so the command does not die of a broken pipe */
	while (rc != MS_OK && fgets(line, sizeof line, p))
		;
	st = pclose(p);
	if (rc == MS_OK && st != 0)
		rc = ms_err_set(err, MS_EINVAL, "reward command '%s': exited with status %d",
				c->reward_cmd, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
	else if (rc == MS_OK && got != b->n)
		rc = ms_err_set(err, MS_EINVAL, "reward command '%s': %zu rewards for %u "
				"completions (one line each)", c->reward_cmd, got, b->n);
out:
	if (f)
		fclose(f);
	unlink(path);
	ms_free(path);
	ms_free(cmd);
	ms_free(qd);
	return rc;
}

/* log-probs of every completion token of the batch under the current
 * weights into lp. */
static int batch_logp(struct ms_rl *r, float *lp, struct ms_err *err)
{
	struct ms_rl_batch *b = &r->b;
	uint32_t V = ms_model_config(r->m)->vocab;
	size_t N = b->n, S = b->seq;
	double T = r->cfg.temperature;
	float *lg = NULL;
	int rc;

	if (!(lg = ms_malloc(N * S * V * sizeof(float))))
		return oom(err);
	if ((rc = ms_model_forward(r->m, b->ids, b->n, b->seq, lg, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < N; i++)
		for (size_t t = 1; t < S; t++) {
			const float *z = lg + (i * S + t - 1) * V;
			double mx = z[0], sum = 0;
			if (!b->mask[i * S + t])
				continue;
			for (uint32_t v = 1; v < V; v++)
				if (z[v] > mx)
					mx = z[v];
			for (uint32_t v = 0; v < V; v++)
				sum += exp(((double)z[v] - mx) / T);
			lp[i * S + t] = (float)(((double)z[b->ids[i * S + t]] - mx) / T - log(sum));
		}
out:
	ms_free(lg);
	return rc;
}

int ms_rl_rollout(struct ms_rl *r, uint64_t k, struct ms_err *err)
{
	struct ms_rl_batch *b = &r->b;
	const struct ms_rl_cfg *c = &r->cfg;
	uint32_t V = ms_model_config(r->m)->vocab, G = c->group;
	size_t N = b->n, S = b->seq, alive = N;
	int32_t *ex = NULL, *pre = NULL;
	uint8_t *exm = NULL;
	float *lg = NULL;
	struct cand *cd = NULL;
	uint64_t *st = NULL;
	uint32_t elen;
	int rc = MS_OK;

	if (!(ex = ms_malloc(r->data->cfg.seq_len * sizeof *ex)) ||
	    !(exm = ms_malloc(r->data->cfg.seq_len)) ||
	    !(pre = ms_malloc(N * sizeof *pre)) ||
	    !(lg = ms_malloc(N * V * sizeof(float))) ||
	    !(cd = ms_malloc(V * sizeof *cd)) || !(st = ms_malloc(N * sizeof *st))) {
		rc = oom(err);
		goto out;
	}
	/* the cache is made at the first rollout, so that a trainer over a
	 * model without one (the GPU model) can still take batches made
	 * elsewhere (ms_rl_backward) */
	if (!r->kv && (rc = ms_kv_cache_new(r->m, b->n, b->seq, &r->kv, err)) != MS_OK)
		goto out;
	memset(b->ids, 0, N * S * sizeof *b->ids);
	memset(b->mask, 0, N * S);
	memset(b->logp_old, 0, N * S * sizeof(float));
	memset(b->logp_ref, 0, N * S * sizeof(float));
	for (uint32_t p = 0; p < c->prompts; p++) {
		uint32_t sep = 0, alen = 0;
		if ((rc = ms_data_example(r->data, k * c->prompts + p, ex, exm, &elen,
					  err)) != MS_OK)
			goto out;
		while (sep < elen && ex[sep] != MS_DATA_TOK_SEP)
			sep++;
		if (sep + 1 != b->plen) {
			rc = ms_err_set(err, MS_EINVAL, "rl: prompt of %u tokens, expected %u",
					sep + 1, b->plen);
			goto out;
		}
		while (sep + 1 + alen < elen && ex[sep + 1 + alen] != MS_DATA_TOK_END)
			alen++;
		b->alen = alen;
		memcpy(b->answer + (size_t)p * b->plen, ex + sep + 1, alen * sizeof *ex);
		for (uint32_t g = 0; g < G; g++)
			memcpy(b->ids + ((size_t)p * G + g) * S, ex, b->plen * sizeof *ex);
	}
	for (size_t i = 0; i < N; i++) {
		b->len[i] = 0;
		st[i] = ms_rng_seed(c->seed ^ 0x726c726f6c6c6f75ull, k * N + i);
	}
	/* the prompt through the KV cache; its last logits give the first draw */
	ms_kv_cache_reset(r->kv);
	for (uint32_t pos = 0; pos < b->plen; pos++) {
		for (size_t i = 0; i < N; i++)
			pre[i] = b->ids[i * S + pos];
		if ((rc = ms_model_decode(r->m, r->kv, pre, lg, err)) != MS_OK)
			goto out;
	}
	for (uint32_t pos = b->plen; pos < S && alive; pos++) {
		if (pos > b->plen) {
			/* a finished sequence decodes its padding: its logits go unused */
			for (size_t i = 0; i < N; i++)
				pre[i] = b->ids[i * S + pos - 1];
			if ((rc = ms_model_decode(r->m, r->kv, pre, lg, err)) != MS_OK)
				goto out;
		}
		for (size_t i = 0; i < N; i++) {
			float lp;
			uint32_t tok;
			if (b->len[i] && b->ids[i * S + b->plen + b->len[i] - 1] ==
						 MS_DATA_TOK_END)
				continue; /* finished */
			tok = sample(lg + i * V, V, c->temperature, c->top_p, cd, &st[i], &lp);
			b->ids[i * S + pos] = (int32_t)tok;
			b->mask[i * S + pos] = 1;
			b->logp_old[i * S + pos] = lp;
			b->len[i]++;
			if (tok == MS_DATA_TOK_END)
				alive--;
		}
	}
	if (c->reward_cmd) {
		if ((rc = external_rewards(r, b->reward, err)) != MS_OK)
			goto out;
		for (size_t i = 0; i < N; i++)
			b->reward[i] += shaping(r, b->ids + i * S + b->plen, b->len[i], b->alen);
	}
	for (uint32_t p = 0; p < c->prompts; p++) {
		double mean = 0, var = 0, sd;
		for (uint32_t g = 0; g < G; g++) {
			size_t i = (size_t)p * G + g;
			if (!c->reward_cmd)
				b->reward[i] = ms_rl_reward(r, b->ids + i * S + b->plen, b->len[i],
							    b->answer + (size_t)p * b->plen,
							    b->alen);
			mean += b->reward[i];
		}
		mean /= G;
		for (uint32_t g = 0; g < G; g++)
			var += (b->reward[p * G + g] - mean) * (b->reward[p * G + g] - mean);
		sd = sqrt(var / G);
		for (uint32_t g = 0; g < G; g++) {
			size_t i = (size_t)p * G + g;
			b->adv[i] = b->reward[i] - mean;
			if (c->std_norm)
				b->adv[i] /= sd + 1e-6;
		}
	}
	if (c->kl_coef > 0) {
		/* the reference's log-probs: its tensors in place for one forward */
		float **cur = ms_calloc(r->np + 1, sizeof *cur);
		int got = cur != NULL;
		for (size_t i = 0; got && i < r->np; i++)
			got = (cur[i] = ms_malloc(r->ps[i].n * sizeof(float))) != NULL;
		/* a GPU model's parameters come to the host first and go back
		 * after each swap (a no-op on the CPU) */
		if (got && (rc = ms_model_sync(r->m, NULL, MS_MODEL_TO_HOST, err)) != MS_OK)
			got = 0;
		if (got) {
			struct ms_err e2 = {0};
			int rc2;
			for (size_t i = 0; i < r->np; i++) {
				memcpy(cur[i], r->ps[i].w, r->ps[i].n * sizeof(float));
				memcpy(r->ps[i].w, r->ref[i], r->ps[i].n * sizeof(float));
			}
			if ((rc = ms_model_sync(r->m, NULL, MS_MODEL_TO_DEVICE, err)) == MS_OK)
				rc = batch_logp(r, b->logp_ref, err);
			for (size_t i = 0; i < r->np; i++)
				memcpy(r->ps[i].w, cur[i], r->ps[i].n * sizeof(float));
			/* the policy goes back even after a failed forward, whose
			 * message stays the one reported */
			rc2 = ms_model_sync(r->m, NULL, MS_MODEL_TO_DEVICE, rc == MS_OK ? err : &e2);
			if (rc == MS_OK)
				rc = rc2;
		} else if (rc == MS_OK) {
			rc = oom(err);
		}
		for (size_t i = 0; cur && i < r->np; i++)
			ms_free(cur[i]);
		ms_free(cur);
	}
out:
	ms_free(ex);
	ms_free(exm);
	ms_free(pre);
	ms_free(lg);
	ms_free(cd);
	ms_free(st);
	return rc;
}

/* ---- the loss ------------------------------------------------------------------- */

struct loss_job {
	struct ms_rl *r;
	int grad;
	double loss, kl, ent, pg_sq, reg_sq;
	uint64_t ntok, clipped;
};

static int loss_fn(void *ctx, float *lg, size_t T, uint32_t V, struct ms_err *err)
{
	struct loss_job *j = ctx;
	const struct ms_rl *r = j->r;
	const struct ms_rl_batch *b = &r->b;
	const struct ms_rl_cfg *c = &r->cfg;
	size_t S = b->seq;
	uint64_t ntok = 0;
	double w, it = 1.0 / c->temperature;

	(void)err;
	for (size_t t = 0; t < (size_t)b->n * S; t++)
		ntok += b->mask[t];
	w = ntok ? 1.0 / (double)ntok : 0;
	for (size_t t = 0; t < T; t++) {
		size_t i = t / S, s = t % S;
		float *z = lg + t * V;
		double mx, sum = 0, lse, logp, H = 0, ratio, A, un, cl, gpg, gkl = 0, kl = 0;
		int32_t lab;

		if (s + 1 >= S || !b->mask[t + 1]) {
			if (j->grad)
				memset(z, 0, V * sizeof(float));
			continue;
		}
		lab = b->ids[t + 1];
		mx = z[0] * it;
		for (uint32_t v = 1; v < V; v++)
			if (z[v] * it > mx)
				mx = z[v] * it;
		for (uint32_t v = 0; v < V; v++)
			sum += exp((double)z[v] * it - mx);
		lse = mx + log(sum);
		for (uint32_t v = 0; v < V; v++) {
			double lp = (double)z[v] * it - lse;
			H -= exp(lp) * lp;
		}
		logp = (double)z[lab] * it - lse;
		ratio = exp(logp - b->logp_old[t + 1]);
		A = b->adv[i];
		un = ratio * A;
		cl = fmin(fmax(ratio, 1 - c->clip_eps), 1 + c->clip_eps) * A;
		/* the min takes the clipped term when it is the smaller: constant
		 * in the weights, so no gradient through it */
		gpg = cl < un ? 0 : -A * ratio;
		j->clipped += cl < un;
		if (c->kl_coef > 0) {
			double d = (double)b->logp_ref[t + 1] - logp;
			if (c->kl_est == MS_KL_K3) {
				kl = exp(d) - d - 1;
				gkl = c->kl_coef * (1 - exp(d));
			} else {
				kl = -d;
				gkl = c->kl_coef;
			}
		}
		j->loss += w * (-fmin(un, cl) + c->kl_coef * kl - c->ent_coef * H);
		j->kl += kl;
		j->ent += H;
		j->ntok++;
		if (!j->grad)
			continue;
		for (uint32_t v = 0; v < V; v++) {
			double lp = (double)z[v] * it - lse, p = exp(lp), oh = v == (uint32_t)lab;
			/* d/dz = (1/T) d/d(z/T) */
			double dpg = it * w * gpg * (oh - p);
			double dreg = it * w * (gkl * (oh - p) + c->ent_coef * p * (lp + H));
			j->pg_sq += dpg * dpg;
			j->reg_sq += dreg * dreg;
			z[v] = (float)(dpg + dreg);
		}
	}
	return MS_OK;
}

int ms_rl_loss(struct ms_rl *r, double *loss, struct ms_err *err)
{
	struct loss_job j = {.r = r};
	uint32_t V = ms_model_config(r->m)->vocab;
	float *lg;
	int rc;

	if (!(lg = ms_malloc((size_t)r->b.n * r->b.seq * V * sizeof(float))))
		return oom(err);
	if ((rc = ms_model_forward(r->m, r->b.ids, r->b.n, r->b.seq, lg, err)) == MS_OK)
		rc = loss_fn(&j, lg, (size_t)r->b.n * r->b.seq, V, err);
	ms_free(lg);
	*loss = j.loss;
	return rc;
}

static int backward(struct ms_rl *r, struct loss_job *j, struct ms_err *err)
{
	memset(j, 0, sizeof *j);
	j->r = r;
	j->grad = 1;
	return ms_model_step_fn(r->m, r->b.ids, r->b.n, r->b.seq, r->step, loss_fn, j, err);
}

int ms_rl_backward(struct ms_rl *r, double *loss, struct ms_err *err)
{
	struct loss_job j;
	int rc = backward(r, &j, err);
	*loss = j.loss;
	return rc;
}

int ms_rl_step(struct ms_rl *r, struct ms_rl_metrics *s, struct ms_rl_event *ev,
	       size_t *nev, struct ms_err *err)
{
	const struct ms_rl_cfg *c = &r->cfg;
	struct ms_rl_batch *b = &r->b;
	double t0 = ms_now(), sum = 0, sq = 0, gsd = 0, len = 0;
	uint32_t zero = 0, G = c->group;
	uint64_t gen = 0;
	int rc;

	memset(s, 0, sizeof *s);
	*nev = 0;
	if ((rc = ms_rl_rollout(r, r->step, err)) != MS_OK)
		return rc;
	for (uint32_t p = 0; p < c->prompts; p++) {
		double m = 0, v = 0;
		for (uint32_t g = 0; g < G; g++)
			m += b->reward[p * G + g];
		m /= G;
		for (uint32_t g = 0; g < G; g++)
			v += (b->reward[p * G + g] - m) * (b->reward[p * G + g] - m);
		gsd += sqrt(v / G);
		zero += v == 0;
	}
	for (uint32_t i = 0; i < b->n; i++) {
		sum += b->reward[i];
		len += b->len[i];
		gen += b->len[i];
	}
	s->reward_mean = sum / b->n;
	for (uint32_t i = 0; i < b->n; i++)
		sq += (b->reward[i] - s->reward_mean) * (b->reward[i] - s->reward_mean);
	s->reward_std = sqrt(sq / b->n);
	s->group_std = gsd / c->prompts;
	s->zero_var_share = (double)zero / c->prompts;
	s->resp_len = len / b->n;
	for (uint32_t u = 0; u < c->updates; u++) {
		struct loss_job j;
		ms_model_zero_grad(r->m);
		if ((rc = backward(r, &j, err)) != MS_OK)
			return rc;
		if (u == 0) {
			s->kl = j.ntok ? j.kl / j.ntok : 0;
			s->entropy = j.ntok ? j.ent / j.ntok : 0;
			s->pg_norm = sqrt(j.pg_sq);
			s->reg_norm = sqrt(j.reg_sq);
			/* no policy signal at all (every group zero-variance)
			 * with a regulariser on counts as drowned, finitely */
			s->reg_share = s->reg_norm / fmax(s->pg_norm, 1e-12);
		}
		s->clip_frac = j.ntok ? (double)j.clipped / j.ntok : 0;
		if ((rc = ms_model_optim_step(r->m, r->opt, ms_sched_lr(&r->opt->cfg, r->step),
					      &s->grad_norm, err)) != MS_OK)
			return rc;
	}
	r->step++;
	s->step = r->step;
	s->seconds = ms_now() - t0;
	s->tokens_per_s = s->seconds > 0
		? (double)(gen + (uint64_t)c->updates * b->n * b->seq) / s->seconds : 0;
	ms_rl_monitor_feed(&r->mon, c, s, ev, nev);
	return MS_OK;
}
