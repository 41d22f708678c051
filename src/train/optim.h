/*
 * optim.h: the trainer's optimizer: AdamW over fp32 master parameters, the
 * learning-rate schedule (linear warmup, then cosine or constant), global
 * gradient-norm clipping. The formulas are PyTorch's, so that a run here
 * and a run of torch.optim.AdamW + transformers' schedule agree:
 *
 *   schedule (transformers get_cosine_schedule_with_warmup; step k is the
 *   0-based index of the optimizer step, T the total steps, W the warmup):
 *     k < W:  lr_k = lr * k / max(1, W)
 *     else:   p = (k - W) / max(1, T - W);
 *             lr_k = lr * max(0, 0.5 * (1 + cos(pi * p)))   (cosine)
 *             lr_k = lr                                      (constant)
 *
 *   clipping (torch.nn.utils.clip_grad_norm_): n = sqrt(sum over every
 *     gradient element of g^2); when clip > 0, every gradient is scaled by
 *     min(1, clip / (n + 1e-6)).
 *
 *   AdamW step t = 1, 2, ... (torch.optim.AdamW, amsgrad off, decoupled
 *   weight decay):
 *     w <- w * (1 - lr * wd)
 *     m <- b1 * m + (1 - b1) * g
 *     v <- b2 * v + (1 - b2) * g^2
 *     w <- w - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *
 * Parameters, gradients and both moments are float32 (the fp32 master
 * copy); scalars are computed in double and each element's update in
 * float32, in a fixed order, so a step is deterministic across runs and
 * thread counts. The optimizer owns the moments; the parameters and
 * gradients are the caller's (borrowed for the optimizer's lifetime).
 */
#ifndef MS_TRAIN_OPTIM_H
#define MS_TRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

enum ms_sched_kind {
	MS_SCHED_COSINE,
	MS_SCHED_CONSTANT,
};

/* "cosine", "constant"; the parser returns MS_OK or MS_EINVAL. */
const char *ms_sched_name(enum ms_sched_kind k);
int ms_sched_parse(const char *s, enum ms_sched_kind *out);

struct ms_adamw_cfg {
	double lr;             /* peak learning rate, > 0 */
	double beta1, beta2;   /* in [0, 1) */
	double eps;            /* > 0 */
	double weight_decay;   /* >= 0 */
	double clip;           /* max global grad norm; 0: no clipping */
	uint64_t warmup;       /* warmup steps */
	uint64_t total_steps;  /* T of the schedule (>= 1) */
	enum ms_sched_kind schedule;
};

/* PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0.01 (as
 * torch.optim.AdamW), no clipping, no warmup, cosine over 1 step. */
void ms_adamw_cfg_init(struct ms_adamw_cfg *c);
/* MS_OK, or MS_EINVAL naming the first field out of range. */
int ms_adamw_cfg_check(const struct ms_adamw_cfg *c, struct ms_err *err);

/* The learning rate of 0-based optimizer step k (formula above). */
double ms_sched_lr(const struct ms_adamw_cfg *c, uint64_t k);

/* One trainable tensor: n float32 values and their gradient. */
struct ms_optim_param {
	const char *name;      /* borrowed; for messages and checkpoints */
	float *w;
	float *g;
	size_t n;
};

/* The global L2 norm of every gradient (double accumulation, in order). */
double ms_grad_norm(const struct ms_optim_param *p, size_t np);
/* Clip as torch does (scale every gradient by min(1, clip/(norm+1e-6)));
 * returns the norm before clipping. clip <= 0 only measures. */
double ms_grad_clip(const struct ms_optim_param *p, size_t np, double clip);

struct ms_adamw {
	struct ms_adamw_cfg cfg;
	size_t np;
	struct ms_optim_param *p;  /* copies of the caller's descriptors */
	float **m, **v;            /* first and second moments, per param */
	uint64_t step;             /* optimizer steps taken (t of the last) */
};

/* Moments zeroed, step 0. p is copied (the arrays it points to are not). */
int ms_adamw_new(const struct ms_adamw_cfg *cfg, const struct ms_optim_param *p,
		 size_t np, struct ms_adamw **out, struct ms_err *err);
void ms_adamw_free(struct ms_adamw *o);
/* One AdamW update of every parameter with learning rate lr (step += 1). */
void ms_adamw_update(struct ms_adamw *o, double lr);

#endif
