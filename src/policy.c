/*
 * policy.c: identify a served policy as a composition of inventoried
 * states (policy.h).
 */
#include "policy.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

void ms_policy_report_free(struct ms_policy_report *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->ntensors; i++) {
		ms_free(r->tensors[i].name);
		ms_free(r->tensors[i].other);
	}
	ms_free(r->tensors);
	for (size_t i = 0; i < r->nparts; i++) {
		ms_free(r->parts[i].label);
		ms_free(r->parts[i].layout);
	}
	ms_free(r->parts);
	ms_free(r);
}

const char *ms_policy_status_str(enum ms_policy_status s)
{
	switch (s) {
	case MS_POLICY_MATCHED: return "matched";
	case MS_POLICY_RENAMED: return "renamed";
	case MS_POLICY_MISMATCH: return "mismatch";
	case MS_POLICY_UNKNOWN: return "unknown";
	}
	return "?";
}

static int cmp_tensor(const void *a, const void *b)
{
	return strcmp(((const struct ms_policy_tensor *)a)->name,
		      ((const struct ms_policy_tensor *)b)->name);
}

/* Sort by name; a name given twice is bad input. */
static int finish_list(struct ms_policy_report *r, const char *label, struct ms_err *err)
{
	qsort(r->tensors, r->ntensors, sizeof(*r->tensors), cmp_tensor);
	for (size_t i = 1; i < r->ntensors; i++)
		if (!strcmp(r->tensors[i].name, r->tensors[i - 1].name))
			return ms_err_set(err, MS_EINVAL, "'%s': tensor '%s' is listed twice", label,
					  r->tensors[i].name);
	for (size_t i = 0; i < r->ntensors; i++)
		r->tensors[i].part = -1;
	return MS_OK;
}

int ms_policy_from_ckpt(const struct ms_ckpt *c, struct ms_policy_report **out,
			struct ms_err *err)
{
	struct ms_policy_report *r = ms_calloc(1, sizeof(*r));
	int rc;

	*out = NULL;
	if (!r || !(r->tensors = ms_calloc(c->ntensors + 1, sizeof(*r->tensors)))) {
		ms_free(r);
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < c->ntensors; i++) {
		const struct ms_tensor *t = c->tensors[i];

		if (!t->has_digest) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' has not been hashed", t->name);
			goto fail;
		}
		if (!(r->tensors[i].name = ms_strdup(t->name))) {
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto fail;
		}
		memcpy(r->tensors[i].digest, t->digest, MS_SHA256_LEN);
		r->ntensors++;
	}
	if ((rc = finish_list(r, "served checkpoint", err)) != MS_OK)
		goto fail;
	*out = r;
	return MS_OK;
fail:
	ms_policy_report_free(r);
	return rc;
}

int ms_policy_from_map(const char *json, size_t len, const char *label,
		       struct ms_policy_report **out, struct ms_err *err)
{
	struct ms_policy_report *r = NULL;
	cJSON *root, *map, *it;
	int rc, nomem;

	*out = NULL;
	root = ms_json_parse(json, len, &nomem);
	if (nomem) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto fail;
	}
	if (!cJSON_IsObject(root)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': not a JSON object", label);
		goto fail;
	}
	map = cJSON_GetObjectItemCaseSensitive(root, "tensors");
	if (!map)
		map = root;
	if (!cJSON_IsObject(map) || cJSON_GetArraySize(map) == 0) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': no tensor name -> sha256 entries", label);
		goto fail;
	}
	r = ms_calloc(1, sizeof(*r));
	if (!r || !(r->tensors = ms_calloc((size_t)cJSON_GetArraySize(map), sizeof(*r->tensors)))) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto fail;
	}
	cJSON_ArrayForEach(it, map) {
		struct ms_policy_tensor *t = &r->tensors[r->ntensors];
		const char *hex = cJSON_IsString(it) ? it->valuestring : NULL;

		if (hex && !strncmp(hex, "sha256:", 7))
			hex += 7;
		if (!it->string || !*it->string || !hex || strlen(hex) != 64 ||
		    ms_unhex(hex, t->digest, MS_SHA256_LEN)) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': entry '%s' is not a tensor name with a SHA-256 (64 hex digits)",
					label, it->string ? it->string : "");
			goto fail;
		}
		if (!(t->name = ms_strdup(it->string))) {
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto fail;
		}
		r->ntensors++;
	}
	if ((rc = finish_list(r, label, err)) != MS_OK)
		goto fail;
	cJSON_Delete(root);
	*out = r;
	return MS_OK;
fail:
	cJSON_Delete(root);
	ms_policy_report_free(r);
	return rc;
}

/* A candidate state and the served tensors it holds under their names. */
struct cand {
	char state[MS_STATE_DIGEST_LEN];
	size_t left;      /* of them, not yet given to a part */
	int part;         /* -1 until chosen */
};

static int cand_index(struct cand **c, size_t *n, size_t *cap, const char *state)
{
	for (size_t i = 0; i < *n; i++)
		if (!strcmp((*c)[i].state, state))
			return (int)i;
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 8;
		struct cand *nn = ms_realloc(*c, nc * sizeof(*nn));

		if (!nn)
			return -1;
		*c = nn;
		*cap = nc;
	}
	memcpy((*c)[*n].state, state, MS_STATE_DIGEST_LEN);
	(*c)[*n].left = 0;
	(*c)[*n].part = -1;
	return (int)(*n)++;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int ms_policy_identify(struct ms_inv *inv, struct ms_policy_report *r, struct ms_err *err)
{
	struct cand *c = NULL;
	size_t nc = 0, ccap = 0;
	/* per tensor: its candidate indices, flattened */
	size_t *first = NULL, *count = NULL, *idx = NULL, nidx = 0, icap = 0;
	int rc = MS_OK;

	first = ms_calloc(r->ntensors + 1, sizeof(*first));
	count = ms_calloc(r->ntensors + 1, sizeof(*count));
	if (!first || !count)
		goto oom;
	for (size_t i = 0; i < r->ntensors; i++) {
		struct ms_policy_tensor *t = &r->tensors[i];
		struct ms_inv_owner *o = NULL;
		size_t n = 0;

		if ((rc = ms_inv_tensor_owners(inv, t->digest, &o, &n, err)) != MS_OK)
			goto out;
		first[i] = nidx;
		for (size_t k = 0; k < n; k++) {
			int ci;

			if (strcmp(o[k].name, t->name))
				continue;
			if ((ci = cand_index(&c, &nc, &ccap, o[k].state)) < 0)
				goto oom_owners;
			if (nidx == icap) {
				size_t ncap = icap ? icap * 2 : 64;
				size_t *ni = ms_realloc(idx, ncap * sizeof(*ni));

				if (!ni)
					goto oom_owners;
				idx = ni;
				icap = ncap;
			}
			idx[nidx++] = (size_t)ci;
			c[ci].left++;
			count[i]++;
		}
		if (!count[i] && n) {
			t->status = MS_POLICY_RENAMED;
			memcpy(t->other_state, o[0].state, MS_STATE_DIGEST_LEN);
			if (!(t->other = ms_strdup(o[0].name)))
				goto oom_owners;
		} else if (!n) {
			t->status = MS_POLICY_UNKNOWN;
		}
		ms_inv_owners_free(o, n);
		continue;
oom_owners:
		ms_inv_owners_free(o, n);
		goto oom;
	}
	/* Greedy cover: the state holding most of what is left becomes the
	 * next part, until every name-matched tensor has one. A base and a
	 * quantized copy share norms and embeddings; the larger wins them. */
	for (;;) {
		size_t best = SIZE_MAX;
		struct ms_policy_part *np, *p;
		struct ms_inv_state *st = NULL;

		for (size_t k = 0; k < nc; k++)
			if (c[k].part < 0 && c[k].left && (best == SIZE_MAX || c[k].left > c[best].left))
				best = k;
		if (best == SIZE_MAX)
			break;
		np = ms_realloc(r->parts, (r->nparts + 1) * sizeof(*np));
		if (!np)
			goto oom;
		r->parts = np;
		p = &np[r->nparts];
		memset(p, 0, sizeof(*p));
		memcpy(p->state, c[best].state, MS_STATE_DIGEST_LEN);
		c[best].part = (int)r->nparts++;
		if ((rc = ms_inv_state_get(inv, p->state, &st, err)) != MS_OK)
			goto out;
		p->kind = st->kind;
		p->state_tensors = st->ntensors;
		p->label = st->label ? ms_strdup(st->label) : NULL;
		p->layout = st->layout ? ms_strdup(st->layout) : NULL;
		ms_inv_state_free(st);
		for (size_t i = 0; i < r->ntensors; i++) {
			int has = 0;

			if (r->tensors[i].part >= 0 || !count[i])
				continue;
			for (size_t k = 0; k < count[i]; k++)
				has |= idx[first[i] + k] == best;
			if (!has)
				continue;
			r->tensors[i].part = c[best].part;
			r->tensors[i].status = MS_POLICY_MATCHED;
			p->served++;
			for (size_t k = 0; k < count[i]; k++)
				c[idx[first[i] + k]].left--;
		}
	}
	/* bytes nobody recorded under a name a part has: a mismatch */
	for (size_t pi = 0; pi < r->nparts; pi++) {
		struct ms_inv_files f = {0};
		char **names = NULL;
		size_t nn = 0;

		if ((rc = ms_inv_state_files(inv, r->parts[pi].state, 0, 1, &f, err)) != MS_OK)
			goto out;
		for (size_t i = 0; i < f.n; i++)
			nn += f.files[i].ntensors;
		names = ms_malloc((nn + 1) * sizeof(*names));
		if (!names) {
			ms_inv_files_release(&f);
			goto oom;
		}
		nn = 0;
		for (size_t i = 0; i < f.n; i++)
			for (size_t t = 0; t < f.files[i].ntensors; t++)
				names[nn++] = f.files[i].tensors[t].name;
		qsort(names, nn, sizeof(*names), cmp_str);
		for (size_t i = 0; i < r->ntensors; i++) {
			struct ms_policy_tensor *t = &r->tensors[i];
			const char *key = t->name;

			if (t->status == MS_POLICY_MATCHED || t->status == MS_POLICY_MISMATCH)
				continue;
			if (bsearch(&key, names, nn, sizeof(*names), cmp_str)) {
				t->status = MS_POLICY_MISMATCH;
				t->part = (int)pi;
			}
		}
		ms_free(names);
		ms_inv_files_release(&f);
	}
	r->nmatched = r->nrenamed = r->nmismatch = r->nunknown = 0;
	for (size_t i = 0; i < r->ntensors; i++) {
		switch (r->tensors[i].status) {
		case MS_POLICY_MATCHED: r->nmatched++; break;
		case MS_POLICY_RENAMED: r->nrenamed++; break;
		case MS_POLICY_MISMATCH: r->nmismatch++; break;
		case MS_POLICY_UNKNOWN: r->nunknown++; break;
		}
	}
	rc = r->nmatched == r->ntensors ? MS_OK : MS_ECHECK;
	goto out;
oom:
	rc = ms_err_set(err, MS_ENOMEM, "out of memory");
out:
	ms_free(c);
	ms_free(first);
	ms_free(count);
	ms_free(idx);
	return rc;
}
