/*
 * run.h: the trainer's run: the plan's "train" section, the gate on what
 * it loads, the training loop and its checkpoints. mstrain(1) is a thin
 * front end over it; ms(5) documents the plan.
 *
 * ---- The plan's "train" section ------------------------------------------
 *
 * The plan is the JSON of footprint.h (one file drives msinv footprint,
 * msinv launch and mstrain). mstrain reads its "states" by role:
 *   base       required: the base checkpoint (config.json, embedding,
 *              norms, routers, lm_head, and every projection not in quantized)
 *   quantized  optional: the NVFP4 state (2D blocks) the attention and
 *              expert projections are taken from
 *   adapter    optional: a PEFT adapter to start from, or (a "path" entry)
 *              an msshard set of the run's EP size: each rank's shard is
 *              loaded through ms_ep_load_rank (EP size, placement and every
 *              expert's bytes against the set's manifest: the same-block
 *              fault is refused) and the verified load, and the whole
 *              adapter put back together from them; one shard alone is
 *              refused
 * and "outputs" (required: the directory checkpoints go to; a relative path
 * is relative to the plan's directory), "ep_size" (the virtual EP ranks of
 * the CPU path), and this object:
 *
 *   "train": {
 *     "lora": {"r": 4, "alpha": 8, "dropout": 0.0,
 *              "targets": ["experts", "q_proj", "k_proj", "v_proj", "o_proj"]},
 *     "optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.999],
 *                   "eps": 1e-8, "weight_decay": 0.0, "clip": 1.0,
 *                   "warmup": 10, "schedule": "cosine"},
 *     "batch": 4, "seq_len": 64, "grad_accum": 1, "steps": 200, "seed": 0,
 *     "data": {"task": "copy"}  or  {"jsonl": "data.jsonl"},
 *     "checkpoint_every": 50,
 *     "colwise": "resident",
 *     "label": "lora-run1"
 *   }
 *
 * and, for GRPO instead of supervised steps (rl.h; ms(5) has every key):
 *     "rl": {"prompts": 4, "group": 4, "prompt_len": 2, "max_new": 3,
 *            "temperature": 0.25, "top_p": 1, "format_bonus": 1,
 *            "length_penalty": 0, "std_norm": true, "clip_eps": 0.2,
 *            "updates": 1, "kl_coef": 0, "kl_estimator": "k3", "ent_coef": 0,
 *            "reward_command": "python3 check.py",
 *            "monitor": {"window": 5, "zero_var_max": 0, "reward_std_min": 0,
 *                        "entropy_min": 0, "reg_share_max": 1, "stop": false}}
 *
 * Required: lora.r, steps. Defaults: alpha = r, dropout 0, targets
 * ["experts"]; optimizer as torch.optim.AdamW (lr 1e-3, betas (0.9, 0.999),
 * eps 1e-8, weight_decay 0.01), clip 0 (none), warmup 0, cosine; batch 1,
 * seq_len 64, grad_accum 1, seed 0, data {"task": "copy"}, checkpoint_every
 * 0 (only the last step), colwise "resident", label "lora" (with
 * "-step<N>" appended per checkpoint). A relative jsonl path is relative
 * to the plan's directory. Unknown keys are errors here (a misspelt
 * hyper-parameter must not be silently ignored); every error names the
 * plan and the key: plan 'p.json': key 'train.lora.r': missing.
 *
 * ---- The gate ---------------------------------------------------------------
 *
 * Every state is resolved in the inventory (a "state" entry by reference,
 * a "path" entry by hashing its files) and loaded only through the
 * verified load (vload.h) against the inventory's recorded tensor digests;
 * its config.json / adapter_config.json must hash to the recorded digest.
 * The run is refused (MS_ECHECK, one line naming the role, the state and
 * the file) when a state is not in the inventory, when its newest recorded
 * verification failed (unverified: msverify or a launch found it changed),
 * or when a file is missing or its bytes differ from the record.
 *
 * Started by `msinv launch` (MSINV_RUN in the environment, gate.h), the run
 * also checks that the plan file is the one the launch verified (its
 * SHA-256 is MSINV_PLAN_DIGEST) and that every state it loads is the one
 * the launch verified (MSINV_STATE_<ROLE>); its checkpoints are recorded
 * as outputs of that run, and at the end a "train_summary" event of the
 * run holds {"first_step", "last_step", "first_loss", "last_loss",
 * "tokens", "seconds", "checkpoints": [{"step", "state"}]}.
 *
 * ---- Checkpoints --------------------------------------------------------------
 *
 * Every checkpoint_every optimizer steps and after the last, the directory
 * <outputs>/step-<NNNNNN>/ is written whole into a staging directory beside
 * it (".step-<NNNNNN>.tmp-<pid>-<hex>", which msinv gc removes when its
 * writer died), every file fsynced, renamed into place in one step, and
 * registered in one inventory batch; a failed registration takes it away
 * again. It holds
 *   adapter/adapter_config.json       PEFT's configuration
 *   adapter/adapter_model.safetensors the LoRA tensors, PEFT's keys, F32
 *   optimizer.safetensors             "<key>.exp_avg", "<key>.exp_avg_sq"
 *                                     per LoRA tensor (F32), metadata
 *                                     "msinv.train": {"version":1,"step":N,
 *                                     "data_cursor":C,"data_seed":S,
 *                                     "lora_seed":L}
 * adapter/ is registered as an adapter state labelled "<label>-step<N>",
 * derived (operation "train", the edge's run being the launch's run) from
 * the base, the quantized state and the starting adapter, each edge with
 * parameters {"step": N, "optimizer_sha256": "<hex of optimizer.safetensors>"}.
 * Both files are functions of the training alone (no run number, no plan
 * path), so a checkpoint two runs reach (an uninterrupted and a resumed
 * one) is one state with one label (the first) and the same edges.
 *
 * Resume (--resume DIR, a checkpoint directory): the adapter is loaded
 * through the gate like any state (it must be inventoried), the optimizer
 * file must hash to the optimizer_sha256 its adapter's train edge records,
 * and its seed must be the plan's. Moments, step and data cursor are
 * restored, so with the same train section the losses after the resume
 * are bit-identical to those of a run that was never interrupted.
 */
#ifndef MS_TRAIN_RUN_H
#define MS_TRAIN_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "footprint.h"
#include "inventory.h"
#include "train/data.h"
#include "train/model.h"
#include "train/optim.h"
#include "train/rl.h"


/* The parsed "train" section (strings owned). */
struct ms_train_plan {
	struct ms_lora_cfg lora;
	struct ms_adamw_cfg optim;
	uint32_t batch, seq_len, grad_accum;
	uint64_t steps, seed, checkpoint_every;
	enum ms_task task;
	char *jsonl;           /* resolved against the plan's directory */
	enum ms_colwise_mode colwise;
	char *label;
	int rl;                /* train.rl given: GRPO steps */
	struct ms_rl_cfg rlc;
	int rl_stop;           /* train.rl.monitor.stop */
	char *reward_cmd;      /* train.rl.reward_command (rlc points here) */
	char *reward_dir;      /* the plan's directory, where it runs */
};

/* Parse the "train" object of a plan's JSON text (len bytes). dir (may be
 * NULL) resolves a relative jsonl path. MS_EINVAL naming label and key. */
int ms_train_plan_parse(const char *json, size_t len, const char *label,
			const char *dir, struct ms_train_plan *out,
			struct ms_err *err);
void ms_train_plan_release(struct ms_train_plan *p);




/*
 * Resolve and load one state: ref (a digest, prefix or label) or path
 * (files hashed to find the state) must name an inventoried state whose
 * newest verification did not fail; its tensors are loaded through
 * ms_load_verified against the recorded digests, and its configuration
 * files checked against theirs. With launch active, the state must be the
 * one verified for role. MS_ECHECK refusals name role, state and file.
 */
int ms_train_state_load(struct ms_inv *inv, const char *role, const char *ref,
			const char *path, const struct ms_train_launch *launch,
			int nthreads, struct ms_train_state *out,
			struct ms_err *err);


#endif
