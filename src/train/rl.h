/*
 * rl.h: GRPO on the trainer model, CPU or GPU (the same code over
 * model.h's interface): rollouts from the current policy (the base with
 * its LoRA adapters), verifiable rewards on the synthetic tasks of data.h,
 * the clipped importance-ratio loss with a KL regulariser to a reference
 * policy and an entropy term, and the reward-collapse monitor.
 *
 * Rollouts: for each of P prompts (synthetic example k's tokens up to and
 * including SEP), G completions of at most max_new tokens are sampled one
 * token at a time from softmax(logits / temperature) restricted to the
 * smallest set of tokens whose probability reaches top_p; a completion
 * stops at END. The policy is softmax(logits / temperature) throughout
 * (behaviour, loss, KL and entropy alike, as TRL and verl do): each sampled
 * token's log-probability under it, before the top_p cut, is kept as the
 * behaviour log-prob of the importance ratio.
 * Each draw comes from a generator seeded by (seed, step, sequence), so a
 * rollout is a function of the seed, the step and the weights alone. The
 * batch decodes incrementally through a KV cache (ms_model_decode), whose
 * logits are those of a full forward of the prefix, bit for bit on the
 * CPU (on the GPU within its GEMMs' rounding).
 *
 * Reward of a completion c against the task's answer a (the tokens between
 * SEP and END of example k, n of them):
 *   answer   matches / n, matches = positions i < n with c[i] == a[i]
 *            (1 exactly when the answer is right)
 *   + format_bonus * (well-formed share): positions i < n holding a symbol
 *            of the task's alphabet, plus END at position n, over n + 1
 *   - length_penalty * (tokens generated / max_new)
 * With an external reward command the command's number replaces the
 * answer term (the shaping terms are added to it): the completions go to
 * its standard input as JSONL, one object per completion in batch order
 * ({"index", "group", "task", "prompt", "completion", "answer"}: token
 * ids, the completion without padding), and it writes one finite number
 * per line, exactly one per completion, and exits 0; anything else stops
 * the step with MS_EINVAL naming the command and the line.
 *
 * GRPO (per token t of completion i of a group, token-mean over the batch):
 *   A_i   = r_i - mean(r of the group), / (std + 1e-6) when std_norm
 *   ratio = exp(logp - logp_behaviour)
 *   L     = -min(ratio A_i, clip(ratio, 1 - clip_eps, 1 + clip_eps) A_i)
 *           + kl_coef * KL + ent_coef * (-H)
 *   KL    k1: logp - logp_ref;  k3: exp(logp_ref - logp) - (logp_ref - logp) - 1
 *   H     the entropy of the policy's next-token distribution there
 * The reference is the policy the run started from (the base when the
 * adapter starts fresh, LoRA B being zero; the warm-start adapter when one
 * is given), held as a copy of the starting LoRA tensors.
 *
 * Monitor rules (a rule whose threshold is 0 is off; window W >= 1):
 *   zero_var      share of groups with zero reward variance > zero_var_max
 *                 for W consecutive steps
 *   reward_std    mean within-group reward std < reward_std_min for W steps
 *   entropy       mean entropy < entropy_min for W steps
 *   reg_share     ||d(regularisers)/d logits|| / ||d(policy term)/d logits||
 *                 > reg_share_max for W steps: a regulariser drowning the
 *                 policy signal
 * Each rule fires once per run (the step at which its window fills).
 */
#ifndef MS_TRAIN_RL_H
#define MS_TRAIN_RL_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "inventory.h"
#include "train/data.h"
#include "train/model.h"
#include "train/optim.h"

enum ms_kl_est { MS_KL_K1, MS_KL_K3 };

struct ms_rl_cfg {
	enum ms_task task;           /* a synthetic task */
	uint32_t prompts, group;     /* P prompts x G samples per step */
	uint32_t prompt_len;         /* symbols n of each prompt (>= 1) */
	uint32_t max_new;            /* completion tokens at most */
	double temperature, top_p;
	double format_bonus, length_penalty;
	const char *reward_cmd;      /* external reward (borrowed) or NULL */
	const char *reward_dir;      /* the directory it runs in (NULL: .) */
	int std_norm;
	double clip_eps;
	uint32_t updates;            /* optimizer updates per batch, >= 1 */
	double kl_coef;
	enum ms_kl_est kl_est;
	double ent_coef;
	uint64_t seed;
	/* monitor */
	uint32_t window;
	double zero_var_max, reward_std_min, entropy_min, reg_share_max;
};

void ms_rl_cfg_init(struct ms_rl_cfg *c);
int ms_rl_cfg_check(const struct ms_rl_cfg *c, struct ms_err *err);



struct ms_rl_monitor {
	uint32_t run[MS_RL_NRULES];       /* consecutive steps over the line */
	int fired[MS_RL_NRULES];
};

/* Feed one step; *nev (<= MS_RL_NRULES) events that fired at this step. */
void ms_rl_monitor_feed(struct ms_rl_monitor *mon, const struct ms_rl_cfg *c,
			const struct ms_rl_metrics *s, struct ms_rl_event *ev,
			size_t *nev);

/* The record of an event (ms_rl_event_json, ms.h) on an inventory run, an
 * event of kind "rl_collapse". The inventory's errors. */
int ms_rl_event_record(struct ms_inv *inv, int64_t run_id,
		       const struct ms_rl_event *e, struct ms_err *err);

/* A rollout batch: N = prompts * group sequences of S = prompt tokens
 * (n symbols + SEP) + max_new. */
struct ms_rl_batch {
	uint32_t n, seq, plen;
	int32_t *ids;                     /* [N, S], PAD after a completion */
	uint8_t *mask;                    /* [N, S] 1 on completion tokens */
	float *logp_old;                  /* [N, S] behaviour log-prob of ids[t] */
	float *logp_ref;                  /* [N, S] reference log-prob */
	int32_t *answer;                  /* [prompts, plen - 1 + 1] a and END */
	uint32_t alen;                    /* answer symbols n' */
	double *reward, *adv;             /* [N] */
	uint32_t *len;                    /* [N] completion tokens */
};

struct ms_rl {
	struct ms_rl_cfg cfg;
	struct ms_model *m;               /* borrowed */
	struct ms_data *data;
	struct ms_adamw *opt;
	int own_opt;                      /* opt is ours to free */
	size_t np;
	const struct ms_param *ps;
	struct ms_optim_param *op;
	float **ref;                      /* the reference LoRA tensors */
	struct ms_rl_batch b;
	struct ms_kv_cache *kv;           /* the rollouts' incremental decode */
	struct ms_rl_monitor mon;
	uint64_t step;
};

/* A trainer over model m (borrowed, its parameters as they are now are the
 * reference), with a new AdamW of optim, or opt (borrowed: the run's, whose
 * moments its checkpoints keep) when not NULL. MS_EINVAL for a bad
 * configuration; MS_ENOMEM. */
int ms_rl_new(struct ms_model *m, const struct ms_rl_cfg *cfg,
	      const struct ms_adamw_cfg *optim, struct ms_adamw *opt,
	      struct ms_rl **out, struct ms_err *err);
void ms_rl_free(struct ms_rl *r);

/* The reward (the header's formula) of completion c of len tokens against
 * the answer a of alen symbols. */
double ms_rl_reward(const struct ms_rl *r, const int32_t *c, uint32_t len,
		    const int32_t *a, uint32_t alen);

/* Sample the batch of step k (rewards and advantages included). */
int ms_rl_rollout(struct ms_rl *r, uint64_t k, struct ms_err *err);

/* The GRPO loss of the current batch under the current weights: forward
 * only; *loss its value (for finite differences). */
int ms_rl_loss(struct ms_rl *r, double *loss, struct ms_err *err);
/* Forward + backward of that loss, gradients accumulated into g. */
int ms_rl_backward(struct ms_rl *r, double *loss, struct ms_err *err);

/* One GRPO step: rollout, reference log-probs, updates; metrics out and
 * the monitor's events (up to MS_RL_NRULES). */
int ms_rl_step(struct ms_rl *r, struct ms_rl_metrics *s, struct ms_rl_event *ev,
	       size_t *nev, struct ms_err *err);

#endif
