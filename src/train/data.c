/*
 * data.c: JSONL token sequences and the synthetic tasks (see data.h for the
 * formats and the order of examples).
 */
#include "train/data.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"

static const char *const task_names[] = {
	[MS_TASK_JSONL] = "jsonl",
	[MS_TASK_COPY] = "copy",
	[MS_TASK_REVERSE] = "reverse",
	[MS_TASK_SORT] = "sort",
	[MS_TASK_MODSUM] = "modsum",
};

const char *ms_task_name(enum ms_task t)
{
	return (unsigned)t < sizeof(task_names) / sizeof(task_names[0]) ? task_names[t] : "?";
}

int ms_task_parse(const char *s, enum ms_task *out)
{
	for (size_t i = MS_TASK_COPY; i < sizeof(task_names) / sizeof(task_names[0]); i++)
		if (!strcmp(s, task_names[i])) {
			*out = (enum ms_task)i;
			return MS_OK;
		}
	return MS_EINVAL;
}

uint64_t ms_rng_next(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t ms_rng_seed(uint64_t seed, uint64_t stream)
{
	uint64_t s = seed, t;

	t = ms_rng_next(&s);
	s = t ^ (stream * 0xd1b54a32d192ed03ull);
	return ms_rng_next(&s);
}

/* Uniform in [0, n) without modulo bias worth speaking of (n is small). */
static uint32_t rng_below(uint64_t *s, uint32_t n)
{
	return (uint32_t)(((ms_rng_next(s) >> 32) * (uint64_t)n) >> 32);
}

void ms_data_free(struct ms_data *d)
{
	if (!d)
		return;
	ms_free(d->path);
	ms_free(d->off);
	ms_free(d->tok);
	ms_free(d->msk);
	ms_free(d->perm);
	ms_free(d);
}

/* An integer member of a JSON array, in [lo, hi]. */
static int json_int(const cJSON *it, double lo, double hi, int32_t *out)
{
	double v;

	if (!cJSON_IsNumber(it))
		return -1;
	v = it->valuedouble;
	if (!(v >= lo && v <= hi) || v != (double)(int64_t)v)
		return -1;
	*out = (int32_t)v;
	return 0;
}

/* Check one JSONL line and append its record. */
static int jsonl_line(struct ms_data *d, const char *line, size_t len, uint64_t lineno,
		      size_t *cap, struct ms_err *err)
{
	const struct ms_data_cfg *c = &d->cfg;
	cJSON *root = NULL;
	const cJSON *ids, *mask, *it;
	const char *end = NULL;
	uint64_t base = d->off[d->nrec];
	int nomem = 0, rc = MS_OK, n, k;

	root = ms_json_parse_opts(line, len, &end, 0, &nomem);
	/* one value per line: anything after it but blanks is an error */
	while (root && end < line + len && (*end == ' ' || *end == '\t' || *end == '\r'))
		end++;
	if (root && end < line + len) {
		rc = ms_err_set(err, MS_EINVAL, "'%s:%llu': text after the JSON object", d->path,
				(unsigned long long)lineno);
		goto out;
	}
	if (!root) {
		rc = nomem ? ms_err_nomem(err)
			   : ms_err_set(err, MS_EINVAL, "'%s:%llu': not a JSON object", d->path,
					(unsigned long long)lineno);
		goto out;
	}
	if (!cJSON_IsObject(root)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s:%llu': not a JSON object", d->path,
				(unsigned long long)lineno);
		goto out;
	}
	ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
	mask = cJSON_GetObjectItemCaseSensitive(root, "loss_mask");
	if (!ids || !cJSON_IsArray(ids)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s:%llu': 'input_ids' %s", d->path,
				(unsigned long long)lineno, ids ? "is not an array" : "is missing");
		goto out;
	}
	n = cJSON_GetArraySize(ids);
	if (n < 2 || (uint32_t)n > c->seq_len) {
		rc = ms_err_set(err, MS_EINVAL, "'%s:%llu': 'input_ids' has %d tokens, not 2..%u "
				"(seq_len)", d->path, (unsigned long long)lineno, n, c->seq_len);
		goto out;
	}
	if (mask && (!cJSON_IsArray(mask) || cJSON_GetArraySize(mask) != n)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s:%llu': 'loss_mask' is not an array of %d "
				"entries like 'input_ids'", d->path, (unsigned long long)lineno, n);
		goto out;
	}
	if (base + (uint64_t)n > *cap) {
		size_t ncap = *cap ? *cap : 4096;
		int32_t *t;
		uint8_t *m;

		while (ncap < base + (uint64_t)n)
			ncap *= 2;
		if (!(t = ms_realloc(d->tok, ncap * sizeof(*t)))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		d->tok = t;
		if (!(m = ms_realloc(d->msk, ncap))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		d->msk = m;
		*cap = ncap;
	}
	k = 0;
	cJSON_ArrayForEach(it, ids) {
		if (json_int(it, 0, (double)c->vocab - 1, &d->tok[base + k])) {
			rc = ms_err_set(err, MS_EINVAL, "'%s:%llu': 'input_ids[%d]' is not a token id "
					"in 0..%u", d->path, (unsigned long long)lineno, k,
					c->vocab - 1);
			goto out;
		}
		d->msk[base + k] = k > 0;
		k++;
	}
	if (mask) {
		k = 0;
		cJSON_ArrayForEach(it, mask) {
			int32_t v;

			if (json_int(it, 0, 1, &v)) {
				rc = ms_err_set(err, MS_EINVAL, "'%s:%llu': 'loss_mask[%d]' is not 0 "
						"or 1", d->path, (unsigned long long)lineno, k);
				goto out;
			}
			if (k == 0 && v) {
				rc = ms_err_set(err, MS_EINVAL, "'%s:%llu': 'loss_mask[0]' is 1: the "
						"first token has nothing to be predicted from",
						d->path, (unsigned long long)lineno);
				goto out;
			}
			d->msk[base + k] = (uint8_t)v;
			k++;
		}
	}
	for (k = 1; k < n && !d->msk[base + k]; k++)
		;
	if (k == n) {
		/* a batch of such lines would have no loss to take a mean of */
		rc = ms_err_set(err, MS_EINVAL, "'%s:%llu': 'loss_mask' selects no token",
				d->path, (unsigned long long)lineno);
		goto out;
	}
	d->off[d->nrec + 1] = base + (uint64_t)n;
	d->nrec++;
out:
	cJSON_Delete(root);
	return rc;
}

static int jsonl_load(struct ms_data *d, struct ms_err *err)
{
	char *text = NULL;
	size_t len = 0, cap = 0, ncap_rec = 0, lines = 1;
	uint64_t lineno = 0;
	int rc;

	if ((rc = ms_file_read(d->path, MS_DATA_MAX_FILE, &text, &len, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < len; i++)
		lines += text[i] == '\n';
	ncap_rec = lines;
	if (!(d->off = ms_calloc(ncap_rec + 1, sizeof(*d->off)))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t pos = 0; pos < len;) {
		const char *nl = memchr(text + pos, '\n', len - pos);
		size_t end = nl ? (size_t)(nl - text) : len, l = end - pos;
		size_t j;

		lineno++;
		for (j = pos; j < end && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r'); j++)
			;
		if (j < end) {
			if (memchr(text + pos, '\0', l)) {
				rc = ms_err_set(err, MS_EINVAL, "'%s:%llu': holds a NUL byte", d->path,
						(unsigned long long)lineno);
				goto out;
			}
			if ((rc = jsonl_line(d, text + pos, l, lineno, &cap, err)) != MS_OK)
				goto out;
		}
		pos = end + 1;
	}
	if (d->nrec == 0)
		rc = ms_err_set(err, MS_EINVAL, "'%s': no examples", d->path);
	else if (d->nrec > UINT32_MAX)
		rc = ms_err_set(err, MS_EINVAL, "'%s': more than %u examples", d->path, UINT32_MAX);
	else if (!(d->perm = ms_malloc(d->nrec * sizeof(*d->perm))))
		rc = ms_err_nomem(err);
	d->perm_epoch = UINT64_MAX;
out:
	ms_free(text);
	return rc;
}

int ms_data_open(const struct ms_data_cfg *cfg, struct ms_data **out, struct ms_err *err)
{
	struct ms_data *d;
	int rc = MS_OK;

	*out = NULL;
	if (cfg->vocab < MS_DATA_MIN_VOCAB)
		return ms_err_set(err, MS_EINVAL, "a vocabulary of %u tokens is too small for the "
				  "trainer's data (at least %u)", cfg->vocab, MS_DATA_MIN_VOCAB);
	if (cfg->seq_len < (cfg->task == MS_TASK_JSONL ? 2u : 4u) || cfg->seq_len > MS_DATA_MAX_SEQ)
		return ms_err_set(err, MS_EINVAL, "'seq_len': %u is not in %u..%u", cfg->seq_len,
				  cfg->task == MS_TASK_JSONL ? 2u : 4u, MS_DATA_MAX_SEQ);
	if (cfg->batch < 1)
		return ms_err_set(err, MS_EINVAL, "'batch': must be at least 1");
	if (!(d = ms_calloc(1, sizeof(*d))))
		return ms_err_nomem(err);
	d->cfg = *cfg;
	d->cfg.jsonl = NULL;
	d->alphabet = cfg->vocab - 3 < 10 ? cfg->vocab - 3 : 10;
	if (cfg->task == MS_TASK_JSONL) {
		if (!cfg->jsonl || !(d->path = ms_strdup(cfg->jsonl))) {
			rc = cfg->jsonl ? ms_err_nomem(err)
					: ms_err_set(err, MS_EINVAL, "no JSONL file given");
			goto out;
		}
		if ((rc = jsonl_load(d, err)) != MS_OK)
			goto out;
	}
	*out = d;
	d = NULL;
out:
	ms_data_free(d);
	return rc;
}

int ms_batch_init(struct ms_batch *b, uint32_t batch, uint32_t seq_len, struct ms_err *err)
{
	memset(b, 0, sizeof(*b));
	b->batch = batch;
	b->seq_len = seq_len;
	b->ids = ms_calloc((size_t)batch * seq_len, sizeof(*b->ids));
	b->mask = ms_calloc((size_t)batch * seq_len, 1);
	if (!b->ids || !b->mask) {
		ms_batch_release(b);
		return ms_err_nomem(err);
	}
	return MS_OK;
}

void ms_batch_release(struct ms_batch *b)
{
	ms_free(b->ids);
	ms_free(b->mask);
	memset(b, 0, sizeof(*b));
}

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	return (x > y) - (x < y);
}

static void synth(const struct ms_data *d, uint64_t k, int32_t *ids, uint8_t *mask,
		  uint32_t *len)
{
	uint32_t T = d->cfg.seq_len, A = d->alphabet, n, i, sum = 0;
	uint64_t s = ms_rng_seed(d->cfg.seed, k);

	memset(ids, 0, T * sizeof(*ids));
	memset(mask, 0, T);
	n = d->cfg.task == MS_TASK_MODSUM ? (T - 3 < 8 ? T - 3 : 8) : (T - 2) / 2;
	for (i = 0; i < n; i++) {
		ids[i] = 3 + (int32_t)rng_below(&s, A);
		sum += (uint32_t)ids[i] - 3;
	}
	ids[n] = MS_DATA_TOK_SEP;
	switch (d->cfg.task) {
	case MS_TASK_MODSUM:
		ids[n + 1] = 3 + (int32_t)(sum % A);
		ids[n + 2] = MS_DATA_TOK_END;
		*len = n + 3;
		break;
	default:
		for (i = 0; i < n; i++)
			ids[n + 1 + i] = d->cfg.task == MS_TASK_REVERSE ? ids[n - 1 - i] : ids[i];
		if (d->cfg.task == MS_TASK_SORT)
			qsort(ids + n + 1, n, sizeof(*ids), cmp_i32);
		ids[2 * n + 1] = MS_DATA_TOK_END;
		*len = 2 * n + 2;
		break;
	}
	for (i = n + 1; i < *len; i++)
		mask[i] = 1;
}

/* The permutation of the JSONL records for an epoch (Fisher-Yates). */
static void jsonl_perm(struct ms_data *d, uint64_t epoch)
{
	uint64_t s = ms_rng_seed(d->cfg.seed ^ 0x6a736f6e6cull, epoch);

	if (d->perm_epoch == epoch)
		return;
	for (size_t i = 0; i < d->nrec; i++)
		d->perm[i] = (uint32_t)i;
	for (size_t i = d->nrec; i > 1; i--) {
		size_t j = (size_t)(ms_rng_next(&s) % i);
		uint32_t t = d->perm[i - 1];

		d->perm[i - 1] = d->perm[j];
		d->perm[j] = t;
	}
	d->perm_epoch = epoch;
}

int ms_data_example(struct ms_data *d, uint64_t k, int32_t *ids, uint8_t *mask,
		    uint32_t *len, struct ms_err *err)
{
	size_t r;
	uint64_t n;

	if (d->cfg.task != MS_TASK_JSONL) {
		synth(d, k, ids, mask, len);
		return MS_OK;
	}
	jsonl_perm(d, k / d->nrec);
	r = d->perm[k % d->nrec];
	n = d->off[r + 1] - d->off[r];
	memset(ids, 0, d->cfg.seq_len * sizeof(*ids));
	memset(mask, 0, d->cfg.seq_len);
	memcpy(ids, d->tok + d->off[r], n * sizeof(*ids));
	memcpy(mask, d->msk + d->off[r], n);
	*len = (uint32_t)n;
	return MS_OK;
}

int ms_data_next(struct ms_data *d, struct ms_batch *b, struct ms_err *err)
{
	uint32_t T = d->cfg.seq_len, len;
	int rc;

	if (b->batch != d->cfg.batch || b->seq_len != T)
		return ms_err_set(err, MS_EINVAL, "batch of %ux%u for data of %ux%u", b->batch,
				  b->seq_len, d->cfg.batch, T);
	b->ntargets = 0;
	for (uint32_t i = 0; i < b->batch; i++) {
		if ((rc = ms_data_example(d, d->cursor + i, b->ids + (size_t)i * T,
					  b->mask + (size_t)i * T, &len, err)) != MS_OK)
			return rc;
		for (uint32_t t = 0; t < T; t++)
			b->ntargets += b->mask[(size_t)i * T + t];
	}
	d->cursor += b->batch;
	return MS_OK;
}
