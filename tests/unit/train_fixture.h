/*
 * train_fixture.h: a checkpoint's tensors as the model's input records
 * (struct ms_wtensor), for the trainer's unit tests. The model never reads
 * files; mstrain hands it verified host bytes, and these tests hand it a
 * fixture's mapped bytes the same way.
 */
#ifndef MS_TEST_TRAIN_FIXTURE_H
#define MS_TEST_TRAIN_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "train/model.h"

struct tset {
	struct ms_ckpt *c;
	struct ms_wtensor *t;
	size_t n;
};

static inline int tset_open(struct tset *s, const char *path)
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

static inline void tset_close(struct tset *s)
{
	free(s->t);
	ms_ckpt_close(s->c);
	memset(s, 0, sizeof *s);
}


/* ---- a model family's fixtures (tests/fixtures/train/<family>) ---------- */

#include <unistd.h>

#include "test.h"

static inline const struct ms_wtensor *tset_find(const struct tset *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->t[i].name, name))
			return &s->t[i];
	return NULL;
}

static const struct ms_lora_cfg LORA_ALL = {
	.r = 4, .alpha = 8, .dropout = 0,
	.targets = MS_LORA_EXPERTS | MS_LORA_Q | MS_LORA_K | MS_LORA_V | MS_LORA_O,
	.seed = 1,
};

struct fam {
	struct ms_model_cfg cfg;
	struct ms_lora_cfg lora;     /* the golden adapter's */
	struct tset base, quant, adapter, gold;
};

static inline int fam_open(struct fam *f, const char *name)
{
	char p[512];
	const struct ms_ckpt_config *cj;
	struct ms_err err = {0};

	memset(f, 0, sizeof *f);
	/* the bundled checkpoint, or one the golden generator wrote */
	snprintf(p, sizeof p, "%s/train/%s/base", T_FIXTURES, name);
	if (access(p, F_OK))
		snprintf(p, sizeof p, "%s/hf/%s", T_FIXTURES, name);
	if (tset_open(&f->base, p))
		return -1;
	f->lora = LORA_ALL;
	if (strstr(name, "-var"))
		f->lora.r = 3;
	snprintf(p, sizeof p, "%s/train/%s/quant", T_FIXTURES, name);
	if (tset_open(&f->quant, p))
		return -1;
	snprintf(p, sizeof p, "%s/train/%s/adapter", T_FIXTURES, name);
	if (tset_open(&f->adapter, p))
		return -1;
	snprintf(p, sizeof p, "%s/train/%s/golden.safetensors", T_FIXTURES, name);
	if (tset_open(&f->gold, p))
		return -1;
	cj = ms_ckpt_config(f->base.c, "config.json");
	if (!cj || ms_model_cfg_parse(cj->text, cj->len, &f->cfg, &err)) {
		fprintf(stderr, "%s config: %s\n", name, err.msg);
		return -1;
	}
	return 0;
}

static inline void fam_close(struct fam *f)
{
	tset_close(&f->base);
	tset_close(&f->quant);
	tset_close(&f->adapter);
	tset_close(&f->gold);
}

static inline float fget(const struct ms_wtensor *t, size_t i)
{
	float f;
	memcpy(&f, (const uint8_t *)t->data + 4 * i, 4);
	return f;
}

#endif
