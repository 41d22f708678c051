/*
 * rl_ablation.c: GRPO runs on the CPU over the bundled qwen3moe checkpoint
 * (tests/fixtures/hf/qwen3moe, fresh attention LoRA), for the regulariser
 * ablation of RL-ABLATION.md. Every option is key=value:
 *
 *   rl_ablation FIXTURES OUT.jsonl [steps=N] [lr=X] [seed=N] [kl=X]
 *               [kl_est=k1|k3] [ent=X] [task=copy|reverse|sort|modsum]
 *               [prompts=N] [group=N] [n=N] [max_new=N] [temp=X]
 *               [top_p=X] [format=X] [len_pen=X] [updates=N] [clip=X]
 *               [window=N] [zero_var=X] [reward_std=X] [entropy=X]
 *               [reg_share=X] [model=DIR] [quant=DIR] [device=cpu|cuda]
 *               [r=N] [alpha=X]
 *
 * model: another Hugging Face checkpoint (default FIXTURES/hf/qwen3moe);
 * quant: its NVFP4 state (msconvert's output), the base's projections then
 * come from it; device: the model's (cuda: the GPU model, bf16 GEMMs,
 * rollouts decoded on the device); r, alpha: the LoRA's (default 4, 8).
 *
 * OUT.jsonl gets one metrics line per step (ms_rl_metrics_json) and one
 * {"event": {...}} line per monitor event; stdout a summary line:
 *   RESULT first=<mean reward, first 5 steps> last=<last 5 steps>
 *          collapse_step=<first event's step or 0> events=<rules>
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msint.h"
#include "checkpoint.h"
#include "train/rl.h"

/* a checkpoint's tensors as the model builder takes them */
static struct ms_wtensor *wtensors(const struct ms_ckpt *ck)
{
	struct ms_wtensor *wt = calloc(ck->ntensors ? ck->ntensors : 1, sizeof *wt);
	for (size_t i = 0; wt && i < ck->ntensors; i++) {
		const struct ms_tensor *x = ck->tensors[i];
		wt[i].name = x->name;
		wt[i].dtype = x->dtype;
		wt[i].ndim = x->ndim;
		memcpy(wt[i].shape, x->shape, sizeof x->shape);
		wt[i].data = x->data;
		wt[i].nbytes = x->nbytes;
	}
	return wt;
}

static int die(const char *msg)
{
	fprintf(stderr, "rl_ablation: %s\n", msg);
	return 2;
}

int main(int argc, char **argv)
{
	struct ms_rl_cfg c;
	struct ms_adamw_cfg o;
	struct ms_lora_cfg lc = {.r = 4, .alpha = 8, .targets = MS_LORA_EXPERTS | MS_LORA_Q |
				 MS_LORA_K | MS_LORA_V | MS_LORA_O, .seed = 1};
	struct ms_model_opts mo = {.nthreads = 0};
	struct ms_model_cfg mc;
	struct ms_model *m = NULL;
	struct ms_ckpt *ck = NULL, *qk = NULL;
	struct ms_wtensor *wt = NULL, *qt = NULL;
	const char *model = NULL, *quant = NULL;
	struct ms_rl *r = NULL;
	struct ms_err err = {0};
	const struct ms_ckpt_config *cj;
	uint64_t steps = 40, coll = 0;
	double first = 0, last = 0, lr = 1e-2;
	char path[1024], evs[256] = "";
	FILE *out;
	int rc = 3;

	if (argc < 3)
		return die("usage: rl_ablation FIXTURES OUT.jsonl [key=value ...]");
	ms_rl_cfg_init(&c);
	c.prompts = 4;
	c.group = 4;
	c.prompt_len = 2;
	c.max_new = 3;
	c.format_bonus = 1;
	for (int i = 3; i < argc; i++) {
		char *v = strchr(argv[i], '=');
		if (!v)
			return die(argv[i]);
		*v++ = 0;
		if (!strcmp(argv[i], "steps")) steps = strtoull(v, NULL, 10);
		else if (!strcmp(argv[i], "lr")) lr = atof(v);
		else if (!strcmp(argv[i], "seed")) c.seed = strtoull(v, NULL, 10);
		else if (!strcmp(argv[i], "kl")) c.kl_coef = atof(v);
		else if (!strcmp(argv[i], "kl_est")) c.kl_est = !strcmp(v, "k1") ? MS_KL_K1 : MS_KL_K3;
		else if (!strcmp(argv[i], "ent")) c.ent_coef = atof(v);
		else if (!strcmp(argv[i], "task")) { if (ms_task_parse(v, &c.task)) return die(v); }
		else if (!strcmp(argv[i], "prompts")) c.prompts = (uint32_t)atoi(v);
		else if (!strcmp(argv[i], "group")) c.group = (uint32_t)atoi(v);
		else if (!strcmp(argv[i], "n")) c.prompt_len = (uint32_t)atoi(v);
		else if (!strcmp(argv[i], "max_new")) c.max_new = (uint32_t)atoi(v);
		else if (!strcmp(argv[i], "temp")) c.temperature = atof(v);
		else if (!strcmp(argv[i], "top_p")) c.top_p = atof(v);
		else if (!strcmp(argv[i], "format")) c.format_bonus = atof(v);
		else if (!strcmp(argv[i], "len_pen")) c.length_penalty = atof(v);
		else if (!strcmp(argv[i], "updates")) c.updates = (uint32_t)atoi(v);
		else if (!strcmp(argv[i], "clip")) c.clip_eps = atof(v);
		else if (!strcmp(argv[i], "window")) c.window = (uint32_t)atoi(v);
		else if (!strcmp(argv[i], "zero_var")) c.zero_var_max = atof(v);
		else if (!strcmp(argv[i], "reward_std")) c.reward_std_min = atof(v);
		else if (!strcmp(argv[i], "entropy")) c.entropy_min = atof(v);
		else if (!strcmp(argv[i], "reg_share")) c.reg_share_max = atof(v);
		else if (!strcmp(argv[i], "model")) model = v;
		else if (!strcmp(argv[i], "quant")) quant = v;
		else if (!strcmp(argv[i], "device")) {
			if (ms_device_parse(v, &mo.device)) return die(v);
		}
		else if (!strcmp(argv[i], "r")) lc.r = (uint32_t)atoi(v);
		else if (!strcmp(argv[i], "alpha")) lc.alpha = atof(v);
		else return die(argv[i]);
	}
	ms_adamw_cfg_init(&o);
	o.lr = lr;
	o.weight_decay = 0;
	o.clip = 1.0;
	o.total_steps = steps;
	o.schedule = MS_SCHED_CONSTANT;
	snprintf(path, sizeof path, "%s/hf/qwen3moe", argv[1]);
	if (ms_ckpt_open(model ? model : path, &ck, &err) != MS_OK ||
	    (quant && ms_ckpt_open(quant, &qk, &err) != MS_OK))
		goto fail;
	if (!(wt = wtensors(ck)) || (qk && !(qt = wtensors(qk))))
		return die("out of memory");
	if (!(cj = ms_ckpt_config(ck, "config.json")))
		return die("no config.json");
	if (ms_model_cfg_parse(cj->text, cj->len, &mc, &err) != MS_OK ||
	    ms_model_build(&m, &mc, wt, ck->ntensors, qt, qk ? qk->ntensors : 0, &lc, NULL, 0,
			   &mo, &err) != MS_OK ||
	    ms_rl_new(m, &c, &o, NULL, &r, &err) != MS_OK)
		goto fail;
	if (!(out = fopen(argv[2], "w")))
		return die(argv[2]);
	for (uint64_t k = 0; k < steps; k++) {
		struct ms_rl_metrics s;
		struct ms_rl_event ev[MS_RL_NRULES];
		size_t nev;
		char *js;
		if (ms_rl_step(r, &s, ev, &nev, &err) != MS_OK ||
		    ms_rl_metrics_json(&s, &js, &err) != MS_OK)
			goto fail;
		fprintf(out, "%s\n", js);
		ms_free(js);
		for (size_t e = 0; e < nev; e++) {
			if (ms_rl_event_json(&ev[e], &js, &err) != MS_OK)
				goto fail;
			fprintf(out, "{\"event\":%s}\n", js);
			ms_free(js);
			if (!coll)
				coll = ev[e].step;
			snprintf(evs + strlen(evs), sizeof evs - strlen(evs), "%s%s",
				 *evs ? "," : "", ms_rl_rule_name(ev[e].rule));
		}
		if (k < 5)
			first += s.reward_mean / 5;
		if (k + 5 >= steps)
			last += s.reward_mean / 5;
	}
	if (fclose(out))
		return die(argv[2]);
	printf("RESULT first=%.4f last=%.4f collapse_step=%llu events=%s\n", first, last,
	       (unsigned long long)coll, *evs ? evs : "none");
	rc = 0;
	goto done;
fail:
	fprintf(stderr, "rl_ablation: %s\n", err.msg);
done:
	ms_rl_free(r);
	ms_model_free(m);
	free(wt);
	free(qt);
	ms_ckpt_close(ck);
	ms_ckpt_close(qk);
	return rc;
}
