/*
 * policy.c: identify a served policy as a composition of inventoried
 * states (policy.h).
 */
#include "policy.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "hash.h"

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
	for (size_t i = 0; i < r->npolicies; i++) {
		ms_free(r->policies[i].label);
		ms_free(r->policies[i].layout);
	}
	ms_free(r->policies);
	for (size_t i = 0; i < r->nsources; i++)
		ms_free(r->sources[i]);
	ms_free(r->sources);
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
	for (size_t i = 0; i < r->ntensors; i++)
		r->tensors[i].src = -1;
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
		return ms_err_nomem(err);
	}
	for (size_t i = 0; i < c->ntensors; i++) {
		const struct ms_tensor *t = c->tensors[i];

		if (!t->has_digest) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' has not been hashed", t->name);
			goto fail;
		}
		if (!(r->tensors[i].name = ms_strdup(t->name))) {
			rc = ms_err_nomem(err);
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
		rc = ms_err_nomem(err);
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
		rc = ms_err_nomem(err);
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
			rc = ms_err_nomem(err);
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

/* ---- fused names of serving engines ---------------------------------------- */

static int ends_with(const char *s, const char *suffix, size_t *stem)
{
	size_t n = strlen(s), m = strlen(suffix);

	if (n < m || strcmp(s + n - m, suffix))
		return 0;
	*stem = n - m;
	return 1;
}

/* Sizes of q, k and v in a fused qkv_proj of `rows` rows, from config.json;
 * 0 when it does not say or does not fit. */
static void qkv_sizes(const struct ms_ckpt *c, uint64_t rows, uint64_t sz[3])
{
	const struct ms_ckpt_config *cf = ms_ckpt_config(c, "config.json");
	cJSON *j = NULL, *x;
	double nh = 0, nkv = 0, hd = 0, hs = 0;
	int nomem;

	sz[0] = sz[1] = sz[2] = 0;
	if (!cf || !(j = ms_json_parse(cf->text, cf->len, &nomem)))
		return;
	if (cJSON_IsNumber(x = cJSON_GetObjectItemCaseSensitive(j, "num_attention_heads")))
		nh = x->valuedouble;
	nkv = nh;
	if (cJSON_IsNumber(x = cJSON_GetObjectItemCaseSensitive(j, "num_key_value_heads")))
		nkv = x->valuedouble;
	if (cJSON_IsNumber(x = cJSON_GetObjectItemCaseSensitive(j, "hidden_size")))
		hs = x->valuedouble;
	if (cJSON_IsNumber(x = cJSON_GetObjectItemCaseSensitive(j, "head_dim")))
		hd = x->valuedouble;
	else if (nh > 0)
		hd = hs / nh;
	cJSON_Delete(j);
	if (nh < 1 || nkv < 1 || hd < 1 || nh > 1e6 || nkv > 1e6 || hd > 1e6 ||
	    (double)(uint64_t)(nh * hd) != nh * hd || (double)(uint64_t)(nkv * hd) != nkv * hd ||
	    (uint64_t)(nh * hd) + 2 * (uint64_t)(nkv * hd) != rows)
		return;
	sz[0] = (uint64_t)(nh * hd);
	sz[1] = sz[2] = (uint64_t)(nkv * hd);
}

/* Append a slice (its name from a printf format, its bytes hashed) of the
 * served tensor sources[src] to r. */
static int slice_add(struct ms_policy_report *r, size_t *cap, int src, const uint8_t *p,
		     uint64_t n, struct ms_err *err, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));
static int slice_add(struct ms_policy_report *r, size_t *cap, int src, const uint8_t *p,
		     uint64_t n, struct ms_err *err, const char *fmt, ...)
{
	struct ms_policy_tensor *t;
	char name[1024];
	va_list ap;
	int rc;

	if (r->ntensors == *cap) {
		size_t nc = *cap * 2 + 16;
		struct ms_policy_tensor *nt = ms_realloc(r->tensors, nc * sizeof(*nt));

		if (!nt)
			return ms_err_nomem(err);
		r->tensors = nt;
		*cap = nc;
	}
	t = &r->tensors[r->ntensors];
	memset(t, 0, sizeof(*t));
	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	if ((rc = ms_sha256(p, (size_t)n, t->digest)) != MS_OK)
		return ms_err_set(err, rc, rc == MS_ENOMEM ? "out of memory" : "sha256 failed");
	if (!(t->name = ms_strdup(name)))
		return ms_err_nomem(err);
	t->src = src;
	t->part = -1;
	r->ntensors++;
	return MS_OK;
}

int ms_policy_unfuse(struct ms_inv *inv, const struct ms_ckpt *c, struct ms_policy_report *r,
		     struct ms_err *err)
{
	size_t cap = r->ntensors, n0 = r->ntensors, keep = 0;
	int rc = MS_OK;

	for (size_t i = 0; i < n0; i++) {
		struct ms_policy_tensor *t = &r->tensors[i];
		const struct ms_tensor *y = ms_ckpt_find(c, t->name);
		struct ms_inv_owner *o = NULL;
		size_t no = 0, stem;
		enum { F_NONE, F_W13, F_W2, F_QKV, F_GATE_UP } kind = F_NONE;
		const char *pre;
		int mixtral, src;
		uint64_t es, row;
		char **ns;

		if (ends_with(t->name, ".experts.w13_weight", &stem))
			kind = F_W13;
		else if (ends_with(t->name, ".experts.w2_weight", &stem))
			kind = F_W2;
		else if (ends_with(t->name, ".qkv_proj.weight", &stem))
			kind = F_QKV;
		else if (ends_with(t->name, ".gate_up_proj.weight", &stem))
			kind = F_GATE_UP;
		if (kind == F_NONE || !y || ms_dtype_bits(y->dtype) % 8 ||
		    y->ndim != (kind == F_W13 || kind == F_W2 ? 3u : 2u) || !y->nbytes)
			continue;
		/* an inventoried state in the engine's own layout matches as is */
		if ((rc = ms_inv_tensor_owners(inv, t->digest, &o, &no, err)) != MS_OK)
			return rc;
		ms_inv_owners_free(o, no);
		if (no)
			continue;
		es = ms_dtype_bits(y->dtype) / 8;
		row = y->shape[y->ndim - 1] * es;
		if ((kind == F_W13 || kind == F_GATE_UP) && y->shape[y->ndim - 2] % 2)
			continue;
		if (kind == F_QKV) {
			uint64_t sz[3];

			qkv_sizes(c, y->shape[0], sz);
			if (!sz[0])
				continue;
		}
		if (!(ns = ms_realloc(r->sources, (r->nsources + 1) * sizeof(*ns))))
			return ms_err_nomem(err);
		r->sources = ns;
		if (!(ns[r->nsources] = ms_strdup(t->name)))
			return ms_err_nomem(err);
		src = (int)r->nsources++;
		pre = t->name;
		mixtral = strstr(t->name, "block_sparse_moe.") != NULL;
		if (kind == F_W13 || kind == F_W2) {
			/* stem ends before ".experts.": the per-expert names
			 * go under "<stem>.experts.<e>." */
			uint64_t e_bytes = y->nbytes / y->shape[0];

			for (uint64_t e = 0; e < y->shape[0] && rc == MS_OK; e++) {
				const uint8_t *p = y->data + e * e_bytes;

				if (kind == F_W2) {
					rc = slice_add(r, &cap, src, p, e_bytes, err, "%.*s.experts.%llu.%s.weight",
						       (int)stem, pre, (unsigned long long)e,
						       mixtral ? "w2" : "down_proj");
					continue;
				}
				rc = slice_add(r, &cap, src, p, e_bytes / 2, err, "%.*s.experts.%llu.%s.weight",
					       (int)stem, pre, (unsigned long long)e,
					       mixtral ? "w1" : "gate_proj");
				if (rc == MS_OK)
					rc = slice_add(r, &cap, src, p + e_bytes / 2, e_bytes / 2, err,
						       "%.*s.experts.%llu.%s.weight", (int)stem, pre,
						       (unsigned long long)e, mixtral ? "w3" : "up_proj");
			}
		} else if (kind == F_GATE_UP) {
			rc = slice_add(r, &cap, src, y->data, y->nbytes / 2, err, "%.*s.gate_proj.weight",
				       (int)stem, pre);
			if (rc == MS_OK)
				rc = slice_add(r, &cap, src, y->data + y->nbytes / 2, y->nbytes / 2, err,
					       "%.*s.up_proj.weight", (int)stem, pre);
		} else {
			static const char *const qkv[] = {"q_proj", "k_proj", "v_proj"};
			uint64_t sz[3], at = 0;

			qkv_sizes(c, y->shape[0], sz);
			for (int k = 0; k < 3 && rc == MS_OK; k++) {
				rc = slice_add(r, &cap, src, y->data + at * row, sz[k] * row, err,
					       "%.*s.%s.weight", (int)stem, pre, qkv[k]);
				at += sz[k];
			}
		}
		if (rc != MS_OK)
			return rc;
		/* r->tensors may have moved: the fused one is dropped below */
		r->tensors[i].src = -2;
	}
	/* drop the tensors that were replaced by their slices */
	for (size_t i = 0; i < r->ntensors; i++) {
		if (r->tensors[i].src == -2) {
			ms_free(r->tensors[i].name);
			ms_free(r->tensors[i].other);
			continue;
		}
		r->tensors[keep++] = r->tensors[i];
	}
	r->ntensors = keep;
	qsort(r->tensors, r->ntensors, sizeof(*r->tensors), cmp_tensor);
	for (size_t i = 1; i < r->ntensors; i++)
		if (!strcmp(r->tensors[i].name, r->tensors[i - 1].name))
			return ms_err_set(err, MS_EINVAL, "served checkpoint: tensor '%s' is served both "
					  "fused and on its own", r->tensors[i].name);
	return MS_OK;
}

/* A candidate state and the served tensors it holds under their names. */
struct cand {
	char state[MS_STATE_DIGEST_LEN];
	size_t left;      /* of them, not yet given to a part */
	size_t held;      /* all of them */
	int part;         /* -1 until chosen */
	int is_policy;    /* a policy state: a composition, not a constituent */
};

/* A part (or a policy the served tensors resemble) from its state. */
static int part_fill(struct ms_inv *inv, struct ms_policy_part *p, const char *state,
		     struct ms_err *err)
{
	struct ms_inv_state *st = NULL;
	int rc;

	memset(p, 0, sizeof(*p));
	memcpy(p->state, state, MS_STATE_DIGEST_LEN);
	if ((rc = ms_inv_state_get(inv, p->state, &st, err)) != MS_OK)
		return rc;
	p->kind = st->kind;
	p->state_tensors = st->ntensors;
	p->label = st->label ? ms_strdup(st->label) : NULL;
	p->layout = st->layout ? ms_strdup(st->layout) : NULL;
	rc = (st->label && !p->label) || (st->layout && !p->layout)
		     ? ms_err_nomem(err)
		     : MS_OK;
	ms_inv_state_free(st);
	return rc;
}

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
	for (size_t k = 0; k < nc; k++) {
		struct ms_inv_state *st = NULL;

		if ((rc = ms_inv_state_get(inv, c[k].state, &st, err)) != MS_OK)
			goto out;
		c[k].is_policy = st->kind == MS_INV_KIND_POLICY;
		c[k].held = c[k].left;
		ms_inv_state_free(st);
	}
	/* Greedy cover: the state holding most of what is left becomes the
	 * next part, until every name-matched tensor has one. A base and a
	 * quantized copy share norms and embeddings; the larger wins them.
	 * Constituent states (base, adapter, quantized, shards) go first: a
	 * policy registered from these very files holds all of them, and
	 * matching a changed copy against it would say "132 of 133 of the
	 * policy" and never name the base or adapter the bytes came from. A
	 * policy is a part only for tensors no constituent holds. */
	for (;;) {
		size_t best = SIZE_MAX;
		struct ms_policy_part *np, *p;

		for (int pass = 0; pass < 2 && best == SIZE_MAX; pass++)
			for (size_t k = 0; k < nc; k++)
				if (c[k].part < 0 && c[k].left && c[k].is_policy == pass &&
				    (best == SIZE_MAX || c[k].left > c[best].left))
					best = k;
		if (best == SIZE_MAX)
			break;
		np = ms_realloc(r->parts, (r->nparts + 1) * sizeof(*np));
		if (!np)
			goto oom;
		r->parts = np;
		p = &np[r->nparts];
		c[best].part = (int)r->nparts++;
		if ((rc = part_fill(inv, p, c[best].state, err)) != MS_OK)
			goto out;
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
	/* the registered policies the served tensors resemble, named beside
	 * the parts (a changed copy of a policy: most of its tensors) */
	for (size_t k = 0; k < nc; k++) {
		struct ms_policy_part *np;

		if (!c[k].is_policy || c[k].part >= 0 || !c[k].held)
			continue;
		np = ms_realloc(r->policies, (r->npolicies + 1) * sizeof(*np));
		if (!np)
			goto oom;
		r->policies = np;
		if ((rc = part_fill(inv, &np[r->npolicies], c[k].state, err)) != MS_OK) {
			r->npolicies++;
			goto out;
		}
		np[r->npolicies++].served = c[k].held;
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
		qsort(names, nn, sizeof(*names), ms_cmp_str);
		for (size_t i = 0; i < r->ntensors; i++) {
			struct ms_policy_tensor *t = &r->tensors[i];
			const char *key = t->name;

			if (t->status == MS_POLICY_MATCHED || t->status == MS_POLICY_MISMATCH)
				continue;
			if (bsearch(&key, names, nn, sizeof(*names), ms_cmp_str)) {
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
	rc = ms_err_nomem(err);
out:
	ms_free(c);
	ms_free(first);
	ms_free(count);
	ms_free(idx);
	return rc;
}

int ms_policy_register(struct ms_inv *inv, const struct ms_policy_report *r,
		       const char *const *paths, size_t npaths, const char *label, int jobs,
		       char digest[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	struct ms_inv_add_opts o;
	const char **parents = ms_calloc(r->nparts + 1, sizeof(*parents));
	uint64_t mark = ms_json_mark();
	cJSON *params = cJSON_CreateObject(), *arr = cJSON_CreateArray();
	char *ptext = NULL;
	int rc;

	for (size_t i = 0; parents && arr && i < r->nparts; i++) {
		cJSON *p = cJSON_CreateObject();

		parents[i] = r->parts[i].state;
		ms_json_put(p, "state", cJSON_CreateString(r->parts[i].state));
		ms_json_put(p, "kind", cJSON_CreateString(ms_inv_kind_name(r->parts[i].kind)));
		if (r->parts[i].layout)
			ms_json_put(p, "layout", cJSON_CreateString(r->parts[i].layout));
		ms_json_put(p, "tensors", cJSON_CreateNumber((double)r->parts[i].served));
		ms_json_put(arr, NULL, p);
	}
	ms_json_put(params, "parts", arr);
	if (params)
		ptext = cJSON_PrintUnformatted(params);
	if (!parents || !ptext || ms_json_failed(mark)) {
		rc = ms_err_nomem(err);
		goto out;
	}
	ms_inv_add_opts_init(&o);
	o.kind = MS_INV_KIND_POLICY;
	o.label = label;
	o.parents = parents;
	o.nparents = r->nparts;
	o.operation = "compose";
	o.params_json = ptext;
	o.jobs = jobs;
	rc = ms_inv_add_paths(inv, paths, npaths, &o, digest, err);
out:
	cJSON_Delete(params);
	cJSON_free(ptext);
	ms_free(parents);
	return rc;
}
