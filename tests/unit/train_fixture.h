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

#endif
