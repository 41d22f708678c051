/*
 * fz_train_jsonl.c: fuzz target for the trainer's JSONL examples
 * (ms_data_open, src/train/data.h). The input is the file's bytes, written
 * to a scratch file (the reader takes a path). A rejection must be one line
 * naming the file (and, for a bad line, "file:line"); an accepted file must
 * give examples that keep the header's promises: 2..seq_len tokens below
 * the vocabulary, padding after the end, no target at position 0 and at
 * least one target, every record once per epoch.
 */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define VOCAB 100u
#define SEQ 12u

static char path[64];

static void cleanup(void)
{
	unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ms_data_cfg c = {.task = MS_TASK_JSONL, .vocab = VOCAB, .seq_len = SEQ,
				.batch = 2, .seed = 11};
	struct ms_data *d = NULL;
	struct ms_err err = {0};
	int32_t ids[SEQ];
	uint8_t mask[SEQ];
	uint32_t len;
	FILE *f;
	int rc;

	if (!path[0]) {
		snprintf(path, sizeof(path), "%s/fz-train-%ld.jsonl",
			 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
		atexit(cleanup);
	}
	f = fopen(path, "wb");
	assert(f);
	assert(fwrite(data, 1, size, f) == size || size == 0);
	assert(fclose(f) == 0);
	c.jsonl = path;
	rc = ms_data_open(&c, &d, &err);
	if (rc != MS_OK) {
		assert(d == NULL);
		assert(rc == MS_EINVAL || rc == MS_ENOMEM);
		assert(err.code == rc && err.msg[0] && strchr(err.msg, '\n') == NULL);
		if (rc == MS_EINVAL)
			assert(strstr(err.msg, path) != NULL);
		return 0;
	}
	assert(d->nrec >= 1);
	for (uint64_t k = 0; k < 2 * d->nrec && k < 64; k++) {
		uint32_t targets = 0;

		assert(ms_data_example(d, k, ids, mask, &len, &err) == MS_OK);
		assert(len >= 2 && len <= SEQ);
		assert(mask[0] == 0);
		for (uint32_t t = 0; t < SEQ; t++) {
			assert(ids[t] >= 0 && (uint32_t)ids[t] < VOCAB);
			assert(mask[t] <= 1);
			if (t >= len)
				assert(ids[t] == 0 && mask[t] == 0);
			targets += mask[t];
		}
		assert(targets >= 1);
	}
	ms_data_free(d);
	return 0;
}
