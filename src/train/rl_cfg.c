/*
 * rl_cfg.c: GRPO's configuration (rl.h): its defaults and range checks,
 * apart from the trainer so that what parses a plan (run_plan.c, and
 * through it msinv's footprint) does not link the model and its GPU code.
 */
#include <math.h>
#include <string.h>

#include "train/rl.h"

void ms_rl_cfg_init(struct ms_rl_cfg *c)
{
	memset(c, 0, sizeof *c);
	c->task = MS_TASK_COPY;
	c->prompts = 4;
	c->group = 4;
	c->prompt_len = 3;
	c->max_new = 4;
	c->temperature = 1.0;
	c->top_p = 1.0;
	c->std_norm = 1;
	c->clip_eps = 0.2;
	c->updates = 1;
	c->kl_est = MS_KL_K3;
	c->window = 3;
}

int ms_rl_cfg_check(const struct ms_rl_cfg *c, struct ms_err *err)
{
	if (c->task == MS_TASK_JSONL)
		return ms_err_set(err, MS_EINVAL, "rl: the task must be a synthetic one");
	if (!c->prompts || !c->group || !c->max_new || !c->prompt_len)
		return ms_err_set(err, MS_EINVAL,
				  "rl: prompts, group, prompt_len and max_new must be >= 1");
	if (c->group < 2)
		return ms_err_set(err, MS_EINVAL,
				  "rl: group must be >= 2 (advantages are relative to the group)");
	if (c->task == MS_TASK_MODSUM && c->prompt_len > 8)
		return ms_err_set(err, MS_EINVAL, "rl: modsum prompts hold at most 8 symbols");
	if (!(c->temperature > 0) || !(c->top_p > 0 && c->top_p <= 1))
		return ms_err_set(err, MS_EINVAL,
				  "rl: temperature must be > 0 and top_p in (0, 1]");
	if (!(c->clip_eps > 0) || !c->updates || !c->window)
		return ms_err_set(err, MS_EINVAL,
				  "rl: clip_eps must be > 0, updates and window >= 1");
	if (!(c->kl_coef >= 0) || !(c->ent_coef >= 0) || !(c->format_bonus >= 0) ||
	    !(c->length_penalty >= 0))
		return ms_err_set(err, MS_EINVAL,
				  "rl: kl_coef, ent_coef, format_bonus and length_penalty must be >= 0");
	if (!(c->zero_var_max >= 0) || !(c->reward_std_min >= 0) || !(c->entropy_min >= 0) ||
	    !(c->reg_share_max >= 0))
		return ms_err_set(err, MS_EINVAL, "rl: monitor thresholds must be >= 0");
	return MS_OK;
}
