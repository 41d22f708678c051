/*
 * run_plan.c: the "train" section of a run plan (run.h has the format),
 * and the environment `msinv launch` hands the trainer.
 * Strict: every key known, every value typed and in range, a key given
 * twice refused; a hyper-parameter misspelt in a plan would otherwise be
 * trained with its default and nobody would know.
 */
#include "train/run.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fsutil.h"

struct pctx {
	const char *label;
	struct ms_err *err;
};

static int perr(struct pctx *c, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* "plan '<label>': key '<key>': <message>", MS_EINVAL (footprint.h's form). */
static int perr(struct pctx *c, const char *key, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return ms_err_set(c->err, MS_EINVAL, "plan '%s': key '%s': %s", c->label, key, msg);
}

/* Every member of obj is one of allowed (NULL-terminated), none twice. */
static int check_keys(struct pctx *c, const cJSON *obj, const char *prefix,
		      const char *const *allowed)
{
	const cJSON *it, *jt;
	char key[256];

	cJSON_ArrayForEach(it, obj) {
		size_t i;

		snprintf(key, sizeof(key), "%s.%s", prefix, it->string ? it->string : "");
		for (i = 0; allowed[i] && strcmp(allowed[i], it->string ? it->string : ""); i++)
			;
		if (!allowed[i])
			return perr(c, key, "unknown key");
		for (jt = it->next; jt; jt = jt->next)
			if (jt->string && !strcmp(jt->string, it->string))
				return perr(c, key, "given twice");
	}
	return MS_OK;
}

static const cJSON *member(const cJSON *obj, const char *name)
{
	return cJSON_GetObjectItemCaseSensitive(obj, name);
}

/* A number in [lo, hi] (integral when integer is set). */
static int get_num(struct pctx *c, const cJSON *obj, const char *prefix, const char *name,
		   double lo, double hi, int integer, int required, double *out)
{
	const cJSON *it = member(obj, name);
	char key[256];
	double d;

	snprintf(key, sizeof(key), "%s.%s", prefix, name);
	if (!it)
		return required ? perr(c, key, "missing") : MS_OK;
	if (!cJSON_IsNumber(it))
		return perr(c, key, integer ? "expected an integer" : "expected a number");
	d = it->valuedouble;
	if (!isfinite(d) || d < lo || d > hi || (integer && d != floor(d)))
		return perr(c, key, integer ? "must be an integer from %.17g to %.17g"
					    : "must be a number from %g to %g", lo, hi);
	*out = d;
	return MS_OK;
}

static int get_u64(struct pctx *c, const cJSON *obj, const char *prefix, const char *name,
		   uint64_t lo, uint64_t hi, int required, uint64_t *out)
{
	double d = (double)*out;
	int rc = get_num(c, obj, prefix, name, (double)lo, (double)hi, 1, required, &d);

	if (rc == MS_OK)
		*out = (uint64_t)d;
	return rc;
}

static int get_str(struct pctx *c, const cJSON *obj, const char *prefix, const char *name,
		   const char **out)
{
	const cJSON *it = member(obj, name);
	char key[256];

	snprintf(key, sizeof(key), "%s.%s", prefix, name);
	if (!it)
		return MS_OK;
	if (!cJSON_IsString(it) || !it->valuestring || !it->valuestring[0])
		return perr(c, key, "expected a non-empty string");
	for (const char *p = it->valuestring; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			return perr(c, key, "control character at byte %zu",
				    (size_t)(p - it->valuestring));
	*out = it->valuestring;
	return MS_OK;
}

static const char *const train_keys[] = {
	"lora", "optimizer", "batch", "seq_len", "grad_accum", "steps", "seed", "data",
	"checkpoint_every", "colwise", "label", "rl", NULL};
static const char *const rl_keys[] = {
	"prompts", "group", "prompt_len", "max_new", "temperature", "top_p", "format_bonus",
	"length_penalty", "std_norm", "clip_eps", "updates", "kl_coef", "kl_estimator",
	"ent_coef", "monitor", "reward_command", NULL};
static const char *const monitor_keys[] = {
	"window", "zero_var_max", "reward_std_min", "entropy_min", "reg_share_max", "stop", NULL};
static const char *const lora_keys[] = {"r", "alpha", "dropout", "targets", NULL};
static const char *const optim_keys[] = {
	"name", "lr", "betas", "eps", "weight_decay", "clip", "warmup", "schedule", NULL};
static const char *const data_keys[] = {"task", "jsonl", NULL};

static int parse_lora(struct pctx *c, const cJSON *lo, struct ms_lora_cfg *l)
{
	const cJSON *tg, *it;
	double d;
	int rc;

	if (!cJSON_IsObject(lo))
		return perr(c, "train.lora", lo ? "expected an object" : "missing");
	if ((rc = check_keys(c, lo, "train.lora", lora_keys)) != MS_OK)
		return rc;
	if ((rc = get_num(c, lo, "train.lora", "r", 1, 65536, 1, 1, &d)) != MS_OK)
		return rc;
	l->r = (uint32_t)d;
	l->alpha = l->r;
	if ((rc = get_num(c, lo, "train.lora", "alpha", 1e-6, 1e6, 0, 0, &l->alpha)) != MS_OK)
		return rc;
	if ((rc = get_num(c, lo, "train.lora", "dropout", 0, 0.999, 0, 0, &l->dropout)) != MS_OK)
		return rc;
	l->targets = MS_LORA_EXPERTS;
	if ((tg = member(lo, "targets"))) {
		int k = 0;

		if (!cJSON_IsArray(tg) || cJSON_GetArraySize(tg) < 1)
			return perr(c, "train.lora.targets", "expected a non-empty array of names");
		l->targets = 0;
		cJSON_ArrayForEach(it, tg) {
			uint32_t bit;
			char key[64];

			snprintf(key, sizeof(key), "train.lora.targets[%d]", k++);
			if (!cJSON_IsString(it) || ms_lora_target_parse(it->valuestring, &bit) != MS_OK)
				return perr(c, key, "not one of experts, q_proj, k_proj, v_proj, "
					    "o_proj");
			if (l->targets & bit)
				return perr(c, key, "'%s' given twice", it->valuestring);
			l->targets |= bit;
		}
	}
	return MS_OK;
}

static int parse_optim(struct pctx *c, const cJSON *op, struct ms_adamw_cfg *o)
{
	const cJSON *b;
	const char *s = NULL;
	int rc;

	if (!op)
		return MS_OK;
	if (!cJSON_IsObject(op))
		return perr(c, "train.optimizer", "expected an object");
	if ((rc = check_keys(c, op, "train.optimizer", optim_keys)) != MS_OK)
		return rc;
	if ((rc = get_str(c, op, "train.optimizer", "name", &s)) != MS_OK)
		return rc;
	if (s && strcmp(s, "adamw"))
		return perr(c, "train.optimizer.name", "'%s' is not an optimizer mstrain has "
			    "(adamw)", s);
	if ((rc = get_num(c, op, "train.optimizer", "lr", 1e-12, 1e2, 0, 0, &o->lr)) != MS_OK ||
	    (rc = get_num(c, op, "train.optimizer", "eps", 1e-30, 1, 0, 0, &o->eps)) != MS_OK ||
	    (rc = get_num(c, op, "train.optimizer", "weight_decay", 0, 1e2, 0, 0,
			  &o->weight_decay)) != MS_OK ||
	    (rc = get_num(c, op, "train.optimizer", "clip", 0, 1e30, 0, 0, &o->clip)) != MS_OK ||
	    (rc = get_u64(c, op, "train.optimizer", "warmup", 0, MS_TRAIN_MAX_STEPS, 0,
			  &o->warmup)) != MS_OK)
		return rc;
	if ((b = member(op, "betas"))) {
		if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2 ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(b, 0)) ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(b, 1)))
			return perr(c, "train.optimizer.betas", "expected two numbers");
		o->beta1 = cJSON_GetArrayItem(b, 0)->valuedouble;
		o->beta2 = cJSON_GetArrayItem(b, 1)->valuedouble;
		for (int i = 0; i < 2; i++) {
			double v = i ? o->beta2 : o->beta1;

			if (!(v >= 0 && v < 1))
				return perr(c, "train.optimizer.betas", "betas[%d] = %g is not in "
					    "[0, 1)", i, v);
		}
	}
	s = NULL;
	if ((rc = get_str(c, op, "train.optimizer", "schedule", &s)) != MS_OK)
		return rc;
	if (s && ms_sched_parse(s, &o->schedule) != MS_OK)
		return perr(c, "train.optimizer.schedule", "'%s' is not cosine or constant", s);
	return MS_OK;
}

/* A label mstrain may extend with "-step<N>": the inventory's label
 * characters, not "sha256:", room for the suffix. */
static int check_label(struct pctx *c, const char *s)
{
	size_t n = strlen(s);

	if (n + 16 > MS_INV_MAX_LABEL)
		return perr(c, "train.label", "longer than %u bytes", MS_INV_MAX_LABEL - 16);
	if (!strncmp(s, "sha256:", 7))
		return perr(c, "train.label", "must not start with 'sha256:'");
	for (size_t i = 0; i < n; i++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:@+/-",
			    s[i]))
			return perr(c, "train.label", "character '%c' is not one of "
				    "[A-Za-z0-9._:@+/-]", s[i]);
	return MS_OK;
}

static int get_bool(struct pctx *c, const cJSON *obj, const char *prefix, const char *name,
		    int *out)
{
	const cJSON *it = member(obj, name);
	char key[256];

	snprintf(key, sizeof(key), "%s.%s", prefix, name);
	if (!it)
		return MS_OK;
	if (!cJSON_IsBool(it))
		return perr(c, key, "expected true or false");
	*out = cJSON_IsTrue(it);
	return MS_OK;
}

static int get_u32(struct pctx *c, const cJSON *obj, const char *prefix, const char *name,
		   uint32_t lo, uint32_t hi, uint32_t *out)
{
	double d = *out;
	int rc = get_num(c, obj, prefix, name, lo, hi, 1, 0, &d);

	if (rc == MS_OK)
		*out = (uint32_t)d;
	return rc;
}

/* train.rl: GRPO (rl.h) instead of supervised steps. */
static int parse_rl(struct pctx *c, const cJSON *o, struct ms_train_plan *tp)
{
	struct ms_rl_cfg *r = &tp->rlc;
	const cJSON *mo;
	const char *est = NULL, *cmd = NULL;
	int rc;

	ms_rl_cfg_init(r);
	if (!cJSON_IsObject(o))
		return perr(c, "train.rl", "expected an object");
	if ((rc = check_keys(c, o, "train.rl", rl_keys)) != MS_OK ||
	    (rc = get_u32(c, o, "train.rl", "prompts", 1, 4096, &r->prompts)) != MS_OK ||
	    (rc = get_u32(c, o, "train.rl", "group", 2, 4096, &r->group)) != MS_OK ||
	    (rc = get_u32(c, o, "train.rl", "prompt_len", 1, 4096, &r->prompt_len)) != MS_OK ||
	    (rc = get_u32(c, o, "train.rl", "max_new", 1, 4096, &r->max_new)) != MS_OK ||
	    (rc = get_num(c, o, "train.rl", "temperature", 1e-3, 1e3, 0, 0, &r->temperature)) !=
		    MS_OK ||
	    (rc = get_num(c, o, "train.rl", "top_p", 1e-6, 1, 0, 0, &r->top_p)) != MS_OK ||
	    (rc = get_num(c, o, "train.rl", "format_bonus", 0, 1e6, 0, 0, &r->format_bonus)) !=
		    MS_OK ||
	    (rc = get_num(c, o, "train.rl", "length_penalty", 0, 1e6, 0, 0,
			  &r->length_penalty)) != MS_OK ||
	    (rc = get_bool(c, o, "train.rl", "std_norm", &r->std_norm)) != MS_OK ||
	    (rc = get_num(c, o, "train.rl", "clip_eps", 1e-6, 1e6, 0, 0, &r->clip_eps)) != MS_OK ||
	    (rc = get_u32(c, o, "train.rl", "updates", 1, 1024, &r->updates)) != MS_OK ||
	    (rc = get_num(c, o, "train.rl", "kl_coef", 0, 1e6, 0, 0, &r->kl_coef)) != MS_OK ||
	    (rc = get_num(c, o, "train.rl", "ent_coef", 0, 1e6, 0, 0, &r->ent_coef)) != MS_OK ||
	    (rc = get_str(c, o, "train.rl", "kl_estimator", &est)) != MS_OK)
		return rc;
	if ((rc = get_str(c, o, "train.rl", "reward_command", &cmd)) != MS_OK)
		return rc;
	if (cmd && !(tp->reward_cmd = ms_strdup(cmd)))
		return ms_err_nomem(c->err);
	r->reward_cmd = tp->reward_cmd;
	if (est && !strcmp(est, "k1"))
		r->kl_est = MS_KL_K1;
	else if (est && strcmp(est, "k3"))
		return perr(c, "train.rl.kl_estimator", "'%s' is not k1 or k3", est);
	if ((mo = member(o, "monitor"))) {
		if (!cJSON_IsObject(mo))
			return perr(c, "train.rl.monitor", "expected an object");
		if ((rc = check_keys(c, mo, "train.rl.monitor", monitor_keys)) != MS_OK ||
		    (rc = get_u32(c, mo, "train.rl.monitor", "window", 1, 1000000, &r->window)) !=
			    MS_OK ||
		    (rc = get_num(c, mo, "train.rl.monitor", "zero_var_max", 0, 1, 0, 0,
				  &r->zero_var_max)) != MS_OK ||
		    (rc = get_num(c, mo, "train.rl.monitor", "reward_std_min", 0, 1e6, 0, 0,
				  &r->reward_std_min)) != MS_OK ||
		    (rc = get_num(c, mo, "train.rl.monitor", "entropy_min", 0, 1e6, 0, 0,
				  &r->entropy_min)) != MS_OK ||
		    (rc = get_num(c, mo, "train.rl.monitor", "reg_share_max", 0, 1e12, 0, 0,
				  &r->reg_share_max)) != MS_OK ||
		    (rc = get_bool(c, mo, "train.rl.monitor", "stop", &tp->rl_stop)) != MS_OK)
			return rc;
	}
	tp->rl = 1;
	return MS_OK;
}

void ms_train_plan_release(struct ms_train_plan *p)
{
	ms_free(p->jsonl);
	ms_free(p->label);
	ms_free(p->reward_cmd);
	ms_free(p->reward_dir);
	memset(p, 0, sizeof(*p));
}

int ms_train_plan_parse(const char *json, size_t len, const char *label, const char *dir,
			struct ms_train_plan *out, struct ms_err *err)
{
	struct pctx c = {label, err};
	cJSON *root = NULL;
	const cJSON *tr, *d;
	const char *s = NULL;
	double v;
	int rc, nomem = 0;

	memset(out, 0, sizeof(*out));
	ms_adamw_cfg_init(&out->optim);
	out->batch = 1;
	out->seq_len = 64;
	out->grad_accum = 1;
	out->task = MS_TASK_COPY;
	out->colwise = MS_COLWISE_RESIDENT;
	if (!(root = ms_json_parse(json, len, &nomem)) || !cJSON_IsObject(root)) {
		rc = nomem ? ms_err_nomem(err)
			   : ms_err_set(err, MS_EINVAL, "plan '%s': not a JSON object", label);
		goto out;
	}
	tr = member(root, "train");
	if (!cJSON_IsObject(tr)) {
		rc = perr(&c, "train", tr ? "expected an object" : "missing (mstrain needs the "
			  "plan's train section)");
		goto out;
	}
	if ((rc = check_keys(&c, tr, "train", train_keys)) != MS_OK ||
	    (rc = parse_lora(&c, member(tr, "lora"), &out->lora)) != MS_OK ||
	    (rc = parse_optim(&c, member(tr, "optimizer"), &out->optim)) != MS_OK)
		goto out;
	if ((rc = get_u64(&c, tr, "train", "steps", 1, MS_TRAIN_MAX_STEPS, 1, &out->steps)) !=
		    MS_OK ||
	    (rc = get_u64(&c, tr, "train", "seed", 0, UINT64_C(1) << 53, 0, &out->seed)) != MS_OK ||
	    (rc = get_u64(&c, tr, "train", "checkpoint_every", 0, MS_TRAIN_MAX_STEPS, 0,
			  &out->checkpoint_every)) != MS_OK)
		goto out;
	v = out->batch;
	if ((rc = get_num(&c, tr, "train", "batch", 1, MS_TRAIN_MAX_BATCH, 1, 0, &v)) != MS_OK)
		goto out;
	out->batch = (uint32_t)v;
	v = out->seq_len;
	if ((rc = get_num(&c, tr, "train", "seq_len", 2, MS_DATA_MAX_SEQ, 1, 0, &v)) != MS_OK)
		goto out;
	out->seq_len = (uint32_t)v;
	v = out->grad_accum;
	if ((rc = get_num(&c, tr, "train", "grad_accum", 1, 65536, 1, 0, &v)) != MS_OK)
		goto out;
	out->grad_accum = (uint32_t)v;
	out->optim.total_steps = out->steps;
	out->lora.seed = out->seed;
	if ((d = member(tr, "data"))) {
		const char *task = NULL, *file = NULL;

		if (!cJSON_IsObject(d)) {
			rc = perr(&c, "train.data", "expected an object");
			goto out;
		}
		if ((rc = check_keys(&c, d, "train.data", data_keys)) != MS_OK ||
		    (rc = get_str(&c, d, "train.data", "task", &task)) != MS_OK ||
		    (rc = get_str(&c, d, "train.data", "jsonl", &file)) != MS_OK)
			goto out;
		if (!task == !file) {
			rc = perr(&c, "train.data", "give exactly one of 'task' and 'jsonl'");
			goto out;
		}
		if (task && ms_task_parse(task, &out->task) != MS_OK) {
			rc = perr(&c, "train.data.task", "'%s' is not copy, reverse, sort or modsum",
				  task);
			goto out;
		}
		if (file) {
			out->task = MS_TASK_JSONL;
			out->jsonl = file[0] == '/' || !dir ? ms_strdup(file) : ms_path_join(dir, file);
			if (!out->jsonl) {
				rc = ms_err_nomem(err);
				goto out;
			}
		}
	}
	s = NULL;
	if ((rc = get_str(&c, tr, "train", "colwise", &s)) != MS_OK)
		goto out;
	if (s && !strcmp(s, "on-demand"))
		out->colwise = MS_COLWISE_ON_DEMAND;
	else if (s && strcmp(s, "resident")) {
		rc = perr(&c, "train.colwise", "'%s' is not resident or on-demand", s);
		goto out;
	}
	s = NULL;
	if ((rc = get_str(&c, tr, "train", "label", &s)) != MS_OK ||
	    (s && (rc = check_label(&c, s)) != MS_OK))
		goto out;
	if (!(out->label = ms_strdup(s ? s : "lora"))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = ms_adamw_cfg_check(&out->optim, err)) != MS_OK) {
		ms_err_prefix(err, "plan '%s': train.optimizer", label);
		goto out;
	}
	if ((d = member(tr, "rl"))) {
		if ((rc = parse_rl(&c, d, out)) != MS_OK)
			goto out;
		if (out->task == MS_TASK_JSONL) {
			rc = perr(&c, "train.rl", "needs a synthetic task in train.data (the "
				  "rewards check its answers)");
			goto out;
		}
		out->rlc.task = out->task;
		out->rlc.seed = out->seed;
		if (out->reward_cmd && dir && !(out->reward_dir = ms_strdup(dir))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		out->rlc.reward_dir = out->reward_dir;
	}
out:
	cJSON_Delete(root);
	if (rc != MS_OK)
		ms_train_plan_release(out);
	return rc;
}

/* ---- the launch's environment ------------------------------------------------ */

void ms_train_launch_release(struct ms_train_launch *l)
{
	for (size_t i = 0; i < l->nroles; i++) {
		ms_free(l->roles[i]);
		ms_free(l->digests[i]);
	}
	ms_free(l->roles);
	ms_free(l->digests);
	memset(l, 0, sizeof(*l));
}

int ms_train_launch_parse(char *const *envp, struct ms_train_launch *out, struct ms_err *err)
{
	const char *run = NULL, *plan = NULL;
	size_t n = 0;
	int rc = MS_OK;

	memset(out, 0, sizeof(*out));
	for (size_t i = 0; envp && envp[i]; i++) {
		if (!strncmp(envp[i], "MSINV_RUN=", 10))
			run = envp[i] + 10;
		else if (!strncmp(envp[i], "MSINV_PLAN_DIGEST=", 18))
			plan = envp[i] + 18;
		else if (!strncmp(envp[i], "MSINV_STATE_", 12))
			n++;
	}
	if (!run)
		return MS_OK;
	{
		uint64_t v;

		if (ms_parse_u64(run, INT64_MAX, &v) || v == 0)
			return ms_err_set(err, MS_EINVAL, "MSINV_RUN='%s' is not a run number", run);
		out->run_id = (int64_t)v;
	}
	if (!plan || strlen(plan) != MS_STATE_DIGEST_LEN - 1 || strncmp(plan, "sha256:", 7))
		return ms_err_set(err, MS_EINVAL, "MSINV_RUN is set but MSINV_PLAN_DIGEST is %s",
				  plan ? "not a sha256:<hex> digest" : "missing");
	memcpy(out->plan_digest, plan, MS_STATE_DIGEST_LEN);
	out->active = 1;
	if (!(out->roles = ms_calloc(n + 1, sizeof(char *))) ||
	    !(out->digests = ms_calloc(n + 1, sizeof(char *)))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; envp[i]; i++) {
		const char *e = envp[i], *eq;

		if (strncmp(e, "MSINV_STATE_", 12) || !(eq = strchr(e, '=')))
			continue;
		if (!(out->roles[out->nroles] = ms_strndup(e + 12, (size_t)(eq - e - 12))) ||
		    !(out->digests[out->nroles] = ms_strdup(eq + 1))) {
			ms_free(out->roles[out->nroles]);
			rc = ms_err_nomem(err);
			goto out;
		}
		out->nroles++;
	}
out:
	if (rc != MS_OK)
		ms_train_launch_release(out);
	return rc;
}
