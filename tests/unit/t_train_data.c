/*
 * t_train_data.c: the synthetic tasks (shape, answer, loss mask,
 * determinism from the seed) and JSONL examples (order, padding, masks,
 * one clear error per bad line).
 */
#include "test.h"
#include "train/data.h"

static int write_text(const char *path, const char *s)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	fputs(s, f);
	return fclose(f);
}

static int open_task(enum ms_task t, uint32_t T, uint64_t seed, struct ms_data **d)
{
	struct ms_data_cfg c = {.task = t, .vocab = 32, .seq_len = T, .batch = 3, .seed = seed};
	struct ms_err err = {0};

	return ms_data_open(&c, d, &err);
}

static int test_tasks_answers(void)
{
	int32_t ids[20];
	uint8_t mask[20];
	uint32_t len, n = 9; /* (20 - 2) / 2 */
	struct ms_data *d = NULL;
	struct ms_err err = {0};

	for (enum ms_task t = MS_TASK_COPY; t <= MS_TASK_MODSUM; t++) {
		T_ASSERT(open_task(t, 20, 7, &d) == MS_OK);
		T_ASSERT_EQ_INT(d->alphabet, 10);
		for (uint64_t k = 0; k < 50; k++) {
			T_ASSERT(ms_data_example(d, k, ids, mask, &len, &err) == MS_OK);
			if (t == MS_TASK_MODSUM) {
				int32_t s = 0;

				T_ASSERT_EQ_INT(len, 8 + 3);
				for (int i = 0; i < 8; i++) {
					T_ASSERT(ids[i] >= 3 && ids[i] < 13);
					s += ids[i] - 3;
				}
				T_ASSERT_EQ_INT(ids[8], MS_DATA_TOK_SEP);
				T_ASSERT_EQ_INT(ids[9], 3 + s % 10);
				T_ASSERT_EQ_INT(ids[10], MS_DATA_TOK_END);
				for (int i = 0; i < 20; i++)
					T_ASSERT_EQ_INT(mask[i], i == 9 || i == 10);
				continue;
			}
			T_ASSERT_EQ_INT(len, 2 * n + 2);
			T_ASSERT_EQ_INT(ids[n], MS_DATA_TOK_SEP);
			T_ASSERT_EQ_INT(ids[2 * n + 1], MS_DATA_TOK_END);
			for (uint32_t i = 0; i < n; i++) {
				int32_t want = t == MS_TASK_REVERSE ? ids[n - 1 - i] : ids[i];

				if (t != MS_TASK_SORT)
					T_ASSERT_EQ_INT(ids[n + 1 + i], want);
				else if (i)
					T_ASSERT(ids[n + 1 + i] >= ids[n + i]);
			}
			if (t == MS_TASK_SORT) {
				int cnt[32] = {0};

				for (uint32_t i = 0; i < n; i++)
					cnt[ids[i]]++, cnt[ids[n + 1 + i]]--;
				for (int i = 0; i < 32; i++)
					T_ASSERT_EQ_INT(cnt[i], 0);
			}
			for (uint32_t i = 0; i < 20; i++)
				T_ASSERT_EQ_INT(mask[i], i > n && i < len);
		}
		ms_data_free(d);
		d = NULL;
	}
	return 0;
}

static int test_seed_determinism(void)
{
	struct ms_data *a = NULL, *b = NULL, *c = NULL;
	struct ms_batch ba, bb, bc;
	struct ms_err err = {0};

	T_ASSERT(open_task(MS_TASK_COPY, 16, 1, &a) == MS_OK);
	T_ASSERT(open_task(MS_TASK_COPY, 16, 1, &b) == MS_OK);
	T_ASSERT(open_task(MS_TASK_COPY, 16, 2, &c) == MS_OK);
	T_ASSERT(ms_batch_init(&ba, 3, 16, &err) == MS_OK);
	T_ASSERT(ms_batch_init(&bb, 3, 16, &err) == MS_OK);
	T_ASSERT(ms_batch_init(&bc, 3, 16, &err) == MS_OK);
	/* a reads two batches; b skips to the cursor: the second batches agree */
	T_ASSERT(ms_data_next(a, &ba, &err) == MS_OK);
	T_ASSERT(ms_data_next(a, &ba, &err) == MS_OK);
	b->cursor = 3;
	T_ASSERT(ms_data_next(b, &bb, &err) == MS_OK);
	T_ASSERT(!memcmp(ba.ids, bb.ids, 3 * 16 * sizeof(int32_t)));
	T_ASSERT(!memcmp(ba.mask, bb.mask, 3 * 16));
	T_ASSERT_EQ_INT(ba.ntargets, 3 * 8);
	T_ASSERT_EQ_INT(a->cursor, 6);
	/* another seed, other examples */
	c->cursor = 3;
	T_ASSERT(ms_data_next(c, &bc, &err) == MS_OK);
	T_ASSERT(memcmp(ba.ids, bc.ids, 3 * 16 * sizeof(int32_t)));
	ms_batch_release(&ba);
	ms_batch_release(&bb);
	ms_batch_release(&bc);
	ms_data_free(a);
	ms_data_free(b);
	ms_data_free(c);
	return 0;
}

static int open_jsonl(const char *text, uint32_t T, struct ms_data **d, struct ms_err *err)
{
	char path[512];
	struct ms_data_cfg c = {.task = MS_TASK_JSONL, .jsonl = path, .vocab = 100,
				.seq_len = T, .batch = 2, .seed = 3};

	snprintf(path, sizeof(path), "%s/d.jsonl", T_TMP);
	if (write_text(path, text))
		return -1;
	return ms_data_open(&c, d, err);
}

static int test_jsonl_epochs(void)
{
	struct ms_data *d = NULL;
	struct ms_err err = {0};
	int32_t ids[6];
	uint8_t mask[6];
	uint32_t len;
	int seen[3] = {0};

	T_ASSERT(open_jsonl("{\"input_ids\": [5, 6, 7]}\n\n"
			    "{\"input_ids\": [8, 9], \"loss_mask\": [0, 1], \"x\": 1}\r\n"
			    "{\"input_ids\": [10, 11, 12, 13, 14, 15], "
			    "\"loss_mask\": [0, 0, 0, 1, 1, 0]}", 6, &d, &err) == MS_OK);
	T_ASSERT_EQ_INT(d->nrec, 3);
	/* every epoch is a permutation of the file */
	for (uint64_t k = 0; k < 9; k++) {
		T_ASSERT(ms_data_example(d, k, ids, mask, &len, &err) == MS_OK);
		if (ids[0] == 5) {
			seen[0]++;
			T_ASSERT_EQ_INT(len, 3);
			T_ASSERT(mask[0] == 0 && mask[1] == 1 && mask[2] == 1 && mask[3] == 0);
			T_ASSERT(ids[3] == 0 && ids[5] == 0);
		} else if (ids[0] == 8) {
			seen[1]++;
			T_ASSERT(len == 2 && mask[1] == 1);
		} else {
			seen[2]++;
			T_ASSERT(len == 6 && ids[5] == 15);
			T_ASSERT(!mask[2] && mask[3] && mask[4] && !mask[5]);
		}
		if (k % 3 == 2) {
			T_ASSERT(seen[0] == seen[1] && seen[1] == seen[2]);
			T_ASSERT_EQ_INT(seen[0], (int)(k / 3) + 1);
		}
	}
	ms_data_free(d);
	return 0;
}

static int bad(const char *text, const char *want)
{
	struct ms_data *d = NULL;
	struct ms_err err = {0};
	int rc = open_jsonl(text, 8, &d, &err);

	if (rc != MS_EINVAL || !strstr(err.msg, want)) {
		fprintf(stderr, "got %d '%s', want '%s'\n", rc, err.msg, want);
		ms_data_free(d);
		return 1;
	}
	return 0;
}

static int test_jsonl_bad_lines(void)
{
	T_ASSERT(!bad("{\"input_ids\": [1, 2]}\n[1, 2]\n", "d.jsonl:2': not a JSON object"));
	T_ASSERT(!bad("{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 2\n",
		      "d.jsonl:2': not a JSON object"));
	T_ASSERT(!bad("\n\n{\"ids\": [1, 2]}\n", "d.jsonl:3': 'input_ids' is missing"));
	T_ASSERT(!bad("{\"input_ids\": [1, 2]} {\"input_ids\": [3, 4]}\n",
		      "d.jsonl:1': text after the JSON object"));
	T_ASSERT(!bad("{\"input_ids\": 4}\n", ":1': 'input_ids' is not an array"));
	T_ASSERT(!bad("{\"input_ids\": [1]}\n", ":1': 'input_ids' has 1 tokens, not 2..8"));
	T_ASSERT(!bad("{\"input_ids\": [1,2,3,4,5,6,7,8,9]}\n", "has 9 tokens, not 2..8"));
	T_ASSERT(!bad("{\"input_ids\": [1, 100]}\n", "'input_ids[1]' is not a token id in 0..99"));
	T_ASSERT(!bad("{\"input_ids\": [1, -1]}\n", "'input_ids[1]' is not a token id"));
	T_ASSERT(!bad("{\"input_ids\": [1, 2.5]}\n", "'input_ids[1]' is not a token id"));
	T_ASSERT(!bad("{\"input_ids\": [1, \"2\"]}\n", "'input_ids[1]' is not a token id"));
	T_ASSERT(!bad("{\"input_ids\": [1, 2], \"loss_mask\": [0]}\n",
		      "'loss_mask' is not an array of 2 entries"));
	T_ASSERT(!bad("{\"input_ids\": [1, 2], \"loss_mask\": [0, 2]}\n",
		      "'loss_mask[1]' is not 0 or 1"));
	T_ASSERT(!bad("{\"input_ids\": [1, 2], \"loss_mask\": [1, 1]}\n",
		      "'loss_mask[0]' is 1"));
	T_ASSERT(!bad("{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 0, 0]}\n",
		      ":1': 'loss_mask' selects no token"));
	T_ASSERT(!bad("\n  \n", "no examples"));
	return 0;
}

static int test_cfg_refusals(void)
{
	struct ms_data *d = NULL;
	struct ms_data_cfg c = {.task = MS_TASK_COPY, .vocab = 4, .seq_len = 16, .batch = 1};
	struct ms_err err = {0};
	enum ms_task t;

	T_ASSERT(ms_data_open(&c, &d, &err) == MS_EINVAL);
	c.vocab = 5;
	c.seq_len = 3;
	T_ASSERT(ms_data_open(&c, &d, &err) == MS_EINVAL);
	T_ASSERT(strstr(err.msg, "seq_len"));
	c.seq_len = 4;
	T_ASSERT(ms_data_open(&c, &d, &err) == MS_OK);
	T_ASSERT_EQ_INT(d->alphabet, 2);
	ms_data_free(d);
	T_ASSERT(ms_task_parse("modsum", &t) == MS_OK && t == MS_TASK_MODSUM);
	T_ASSERT(ms_task_parse("jsonl", &t) == MS_EINVAL);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_tasks_answers),
	T_CASE(test_seed_determinism),
	T_CASE(test_jsonl_epochs),
	T_CASE(test_jsonl_bad_lines),
	T_CASE(test_cfg_refusals),
};

T_MAIN(cases)
