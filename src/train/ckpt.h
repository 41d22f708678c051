/*
 * ckpt.h: the trainer's checkpoints: a PEFT adapter and the optimizer
 * state, published as one directory and registered as one adapter state
 * (the layout, names and registration are in run.h, "Checkpoints").
 */
#ifndef MS_TRAIN_CKPT_H
#define MS_TRAIN_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "inventory.h"
#include "train/model.h"
#include "train/optim.h"

#define MS_TRAIN_CKPT_META "msinv.train"
#define MS_TRAIN_CKPT_OPTIM "optimizer.safetensors"
#define MS_TRAIN_CKPT_ADAPTER "adapter"

/* What a checkpoint holds besides the tensors. */
struct ms_train_ckpt_meta {
	uint64_t step;          /* optimizer steps taken */
	uint64_t data_cursor;   /* examples consumed */
	uint64_t data_seed, lora_seed;
};

struct ms_train_ckpt_save {
	const char *outputs;    /* the directory checkpoints go in */
	const struct ms_param *params;   /* the model's, in its order */
	size_t nparams;
	const struct ms_adamw *opt;      /* moments parallel to params */
	const char *adapter_config;      /* adapter_config.json text */
	struct ms_train_ckpt_meta meta;
	int64_t run_id;                  /* the run producing it (0: none) */
	const char *label;               /* full label of the adapter state */
	const char *const *parents;      /* state digests */
	size_t nparents;
	int jobs;
};

/* Write <outputs>/step-<NNNNNN>/ through a staging directory, publish it in
 * one rename and register its adapter/ in one inventory batch (taken away
 * again when that fails). *dir_out (caller frees) is the directory,
 * digest_out the adapter state, *label_out (caller frees) its label: s->label,
 * or the label the state already had when another run produced the same
 * bytes (training is deterministic: a resumed run's checkpoints are the
 * uninterrupted run's states). MS_EEXIST when the directory exists. */
int ms_train_ckpt_write(struct ms_inv *inv, const struct ms_train_ckpt_save *s,
			char **dir_out, char digest_out[MS_STATE_DIGEST_LEN],
			char **label_out, struct ms_err *err);

/* The optimizer state of a checkpoint directory, read into memory and
 * accepted only when the file's SHA-256 is expected (the bytes used are
 * the bytes checked): MS_ECHECK naming the file otherwise. Moments are
 * copied into opt (its params must have the checkpoint's names and
 * shapes: MS_EINVAL naming the tensor otherwise) and opt->step set. */
int ms_train_ckpt_read_optim(const char *dir, const uint8_t expected[32],
			     struct ms_adamw *opt, struct ms_train_ckpt_meta *meta,
			     struct ms_err *err);

#endif
