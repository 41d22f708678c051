/*
 * data.h: the trainer's examples: token-id sequences from a JSONL file or
 * from a built-in synthetic task, cut into batches of fixed shape
 * [batch, seq_len] with a loss mask.
 *
 * A batch holds ids[b * seq_len + t] and mask[b * seq_len + t]: mask 1
 * means token t is a target, predicted from positions 0..t-1 (so mask is
 * always 0 at t = 0). Sequences shorter than seq_len are padded with token 0
 * and mask 0 at the end (the model is causal, so padding after a sequence
 * does not change what comes before it).
 *
 * JSONL (one object per line; blank lines are skipped):
 *   {"input_ids": [12, 7, 99, ...], "loss_mask": [0, 0, 1, ...]}
 * input_ids: 2..seq_len integers in [0, vocab); loss_mask (optional): as
 * many 0/1 integers, 0 at position 0 and 1 somewhere else; without it
 * every token but the first is a target. Any other key is ignored. A line that breaks a rule
 * is MS_EINVAL, "'<file>:<line>: <rule>", and nothing is trained.
 *
 * Synthetic tasks (token 0 pad, 1 separator, 2 end; the alphabet is the A =
 * min(vocab - 3, 10) tokens 3..A+2; n symbols drawn uniformly):
 *   copy     x1..xn SEP x1..xn END          n = (seq_len - 2) / 2
 *   reverse  x1..xn SEP xn..x1 END          n = (seq_len - 2) / 2
 *   sort     x1..xn SEP sorted(x) END       n = (seq_len - 2) / 2
 *   modsum   x1..xn SEP s END, s = 3 + (sum of (xi - 3)) mod A,
 *                                           n = min(seq_len - 3, 8)
 * The loss mask covers the answer after SEP and END.
 *
 * Order and determinism: example k of a run is a function of (seed, k)
 * alone: the synthetic example k is drawn from a generator seeded with
 * (seed, k); JSONL examples are taken in the order of a permutation of the
 * file drawn per epoch from (seed, epoch). The data cursor (examples
 * consumed) is therefore the whole state a resumed run needs.
 */
#ifndef MS_TRAIN_DATA_H
#define MS_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define MS_DATA_MAX_FILE (1ull << 32) /* JSONL bytes */
#define MS_DATA_MAX_SEQ 65536u
#define MS_DATA_TOK_PAD 0
#define MS_DATA_TOK_SEP 1
#define MS_DATA_TOK_END 2
#define MS_DATA_MIN_VOCAB 5u

enum ms_task {
	MS_TASK_JSONL,
	MS_TASK_COPY,
	MS_TASK_REVERSE,
	MS_TASK_SORT,
	MS_TASK_MODSUM,
};

/* "jsonl", "copy", "reverse", "sort", "modsum"; the parser accepts the four
 * synthetic tasks only (a file is given by path). */
const char *ms_task_name(enum ms_task t);
int ms_task_parse(const char *s, enum ms_task *out);

struct ms_data_cfg {
	enum ms_task task;
	const char *jsonl;     /* MS_TASK_JSONL: the file (borrowed for open) */
	uint32_t vocab;        /* the model's vocabulary size */
	uint32_t seq_len;      /* 2..MS_DATA_MAX_SEQ (synthetic: >= 4) */
	uint32_t batch;        /* sequences per batch, >= 1 */
	uint64_t seed;
};

struct ms_batch {
	uint32_t batch, seq_len;
	int32_t *ids;          /* [batch * seq_len] */
	uint8_t *mask;         /* [batch * seq_len] */
	uint64_t ntargets;     /* mask ones */
};

struct ms_data {
	struct ms_data_cfg cfg;
	char *path;            /* JSONL file, owned */
	uint64_t cursor;       /* examples consumed so far */
	/* JSONL: every record, concatenated */
	size_t nrec;
	uint64_t *off;         /* [nrec + 1] into tok/msk */
	int32_t *tok;
	uint8_t *msk;
	uint32_t *perm;        /* the permutation of epoch perm_epoch */
	uint64_t perm_epoch;
	uint32_t alphabet;     /* synthetic: A */
};

/* Open the source (a JSONL file is read and checked whole here). */
int ms_data_open(const struct ms_data_cfg *cfg, struct ms_data **out,
		 struct ms_err *err);
void ms_data_free(struct ms_data *d);

/* A batch of cfg->batch x cfg->seq_len, filled by ms_data_next. */
int ms_batch_init(struct ms_batch *b, uint32_t batch, uint32_t seq_len,
		  struct ms_err *err);
void ms_batch_release(struct ms_batch *b);
/* The next cfg->batch examples from the cursor (which moves on). */
int ms_data_next(struct ms_data *d, struct ms_batch *b, struct ms_err *err);

/* Example k alone, into ids/mask of seq_len entries; *len gets its length
 * before padding. */
int ms_data_example(struct ms_data *d, uint64_t k, int32_t *ids, uint8_t *mask,
		    uint32_t *len, struct ms_err *err);

/* splitmix64: the generator every seeded draw of the trainer uses. */
uint64_t ms_rng_next(uint64_t *state);
/* A generator state derived from a seed and a stream number. */
uint64_t ms_rng_seed(uint64_t seed, uint64_t stream);

#endif
