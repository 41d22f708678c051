/*
 * run.c: the trainer's run (run.h): the gate on every state it loads, the
 * training loop and its checkpoints.
 *
 * Nothing here trusts a path: a state is named by its digest in the
 * inventory, and its bytes reach the model only through ms_load_verified
 * against the digests recorded there, so what is trained on is what was
 * checked (the same pass hashes and copies). Under `msinv launch` the plan
 * and every state must moreover be the ones the launch verified: a plan
 * edited, or a label moved to another state, between the launch's check and
 * our load is refused.
 */
#include "train/run.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "fsutil.h"
#include "hash.h"
#include "names.h"
#include "shard.h"
#include "train/ckpt.h"
#include "verify.h"
#include "vload.h"

static int oom(struct ms_err *err)
{
	return ms_err_set(err, MS_ENOMEM, "out of memory");
}

/* The launch's digest for role (gate.h's spelling of it), or NULL. */
static const char *launch_digest(const struct ms_train_launch *l, const char *role)
{
	char up[96];
	size_t k = 0;

	for (; *role && k + 1 < sizeof(up); role++)
		up[k++] = isalnum((unsigned char)*role) ? (char)toupper((unsigned char)*role) : '_';
	up[k] = 0;
	for (size_t i = 0; i < l->nroles; i++)
		if (!strcmp(l->roles[i], up))
			return l->digests[i];
	return NULL;
}

/* ---- loading a state through the gate ---------------------------------------- */

void ms_train_state_release(struct ms_train_state *s)
{
	for (size_t i = 0; s->t && i < s->n; i++) {
		ms_free((void *)s->t[i].name);
		ms_free((void *)s->t[i].data);
	}
	ms_free(s->t);
	ms_free(s->role);
	ms_free(s->label);
	ms_free(s->where);
	ms_free(s->config);
	ms_free(s->adapter_config);
	memset(s, 0, sizeof(*s));
}

/* Drop the tensor bytes, keep the identity (for the result). */
static void state_drop_tensors(struct ms_train_state *s)
{
	for (size_t i = 0; s->t && i < s->n; i++) {
		ms_free((void *)s->t[i].name);
		ms_free((void *)s->t[i].data);
	}
	ms_free(s->t);
	s->t = NULL;
	s->n = 0;
}

/* "label" or the digest's first hex digits: how refusals name a state. */
static void state_name(const struct ms_train_state *s, char *buf, size_t n)
{
	if (s->label)
		snprintf(buf, n, "'%s' (%.23s...)", s->label, s->digest);
	else
		snprintf(buf, n, "%.23s...", s->digest);
}

static char *vpath(const struct ms_vstate *vs, const char *p)
{
	return p[0] == '/' || !vs->root ? ms_strdup(p) : ms_path_join(vs->root, p);
}

/* Configuration files must hash to their record; config.json is kept. */
static int load_configs(const struct ms_vstate *vs, struct ms_train_state *s, const char *who,
			struct ms_err *err)
{
	int rc = MS_OK;

	for (size_t i = 0; i < vs->nconfigs; i++) {
		char *p = vpath(vs, vs->configs[i].path), *text = NULL;
		uint8_t d[32];
		size_t len = 0;

		if (!p)
			return oom(err);
		rc = ms_file_read(p, MS_CKPT_MAX_CONFIG, &text, &len, err);
		if (rc != MS_OK && rc != MS_ENOMEM && access(p, F_OK) != 0 && errno == ENOENT) {
			rc = ms_err_set(err, MS_ECHECK, "role '%s': state %s: '%s': missing", s->role,
					who, p);
		} else if (rc == MS_EINVAL) {
			/* too large or not a regular file: not what was recorded */
			rc = ms_err_set(err, MS_ECHECK, "role '%s': state %s: '%s': %s", s->role, who,
					p, err->msg);
		} else if (rc == MS_OK && (rc = ms_sha256(text, len, d)) != MS_OK) {
			rc = ms_sha256_err(err, rc);
		} else if (rc == MS_OK && memcmp(d, vs->configs[i].digest, 32)) {
			rc = ms_err_set(err, MS_ECHECK, "role '%s': state %s: '%s': changed since it "
					"was recorded (digest mismatch)", s->role, who, p);
		} else if (rc == MS_OK && !strcmp(ms_path_base(p), "config.json") && !s->config) {
			s->config = text;
			s->config_len = len;
			text = NULL;
		} else if (rc == MS_OK && !strcmp(ms_path_base(p), "adapter_config.json") &&
			   !s->adapter_config) {
			s->adapter_config = text;
			text = NULL;
		}
		ms_free(text);
		ms_free(p);
		if (rc != MS_OK)
			return rc;
	}
	return MS_OK;
}

/* Every tensor of vs, through the verified load against its recorded
 * digest. */
static int load_tensors(const struct ms_vstate *vs, struct ms_train_state *s, const char *who,
			int nthreads, struct ms_err *err)
{
	struct ms_st_file **files = NULL;
	struct ms_vload_item *items = NULL;
	size_t n = 0, k = 0;
	int rc = MS_OK;

	for (size_t i = 0; i < vs->nfiles; i++)
		n += vs->files[i].ntensors;
	if (!(files = ms_calloc(vs->nfiles + 1, sizeof(*files))) ||
	    !(items = ms_calloc(n + 1, sizeof(*items))) ||
	    !(s->t = ms_calloc(n + 1, sizeof(*s->t)))) {
		rc = oom(err);
		goto out;
	}
	for (size_t i = 0; i < vs->nfiles; i++) {
		const struct ms_vfile *vf = &vs->files[i];
		char *p = vpath(vs, vf->path);
		struct ms_err lerr = {0};

		if (!p) {
			rc = oom(err);
			goto out;
		}
		rc = ms_st_open(p, &files[i], &lerr);
		if (rc != MS_OK) {
			struct stat sb;

			rc = rc == MS_ENOMEM ? oom(err)
					     : ms_err_set(err, MS_ECHECK, "role '%s': state %s: file "
							  "'%s': %s", s->role, who, p,
							  stat(p, &sb) ? "missing" : lerr.msg);
			ms_free(p);
			goto out;
		}
		for (size_t j = 0; j < vf->ntensors; j++) {
			const struct ms_vtensor *vt = &vf->tensors[j];
			const struct ms_tensor *t = ms_st_find(files[i], vt->name);
			struct ms_wtensor *w = &s->t[k];

			if (!t || t->dtype != vt->dtype || t->ndim != vt->ndim ||
			    t->nbytes != vt->nbytes ||
			    memcmp(t->shape, vt->shape, vt->ndim * sizeof(vt->shape[0]))) {
				rc = ms_err_set(err, MS_ECHECK, "role '%s': state %s: tensor '%s' in "
						"'%s': %s", s->role, who, vt->name, p,
						t ? "dtype or shape differs from the record"
						  : "missing");
				ms_free(p);
				goto out;
			}
			items[k].tensor = t;
			memcpy(items[k].expected, vt->digest, 32);
			if (!(w->name = ms_strdup(vt->name)) ||
			    !(items[k].dst = ms_malloc(t->nbytes ? t->nbytes : 1))) {
				rc = oom(err);
				ms_free(p);
				goto out;
			}
			w->data = items[k].dst;
			w->dtype = t->dtype;
			w->ndim = t->ndim;
			memcpy(w->shape, t->shape, sizeof(w->shape));
			w->nbytes = t->nbytes;
			s->bytes += t->nbytes;
			k++;
			s->n = k;
		}
		ms_free(p);
	}
	rc = ms_load_verified(items, k, nthreads, err);
	if (rc == MS_ECHECK)
		ms_err_prefix(err, "role '%s': state %s", s->role, who);
out:
	for (size_t i = 0; files && i < vs->nfiles; i++)
		ms_st_close(files[i]);
	ms_free(files);
	ms_free(items);
	return rc;
}

int ms_train_state_load(struct ms_inv *inv, const char *role, const char *ref, const char *path,
			const struct ms_train_launch *launch, int nthreads,
			struct ms_train_state *out, struct ms_err *err)
{
	struct ms_inv_state *st = NULL;
	struct ms_inv_verification *v = NULL;
	struct ms_vstate *vs = NULL;
	struct ms_ckpt *ck = NULL;
	struct ms_err lerr = {0};
	char who[160];
	size_t nv = 0;
	int rc;

	memset(out, 0, sizeof(*out));
	if (!(out->role = ms_strdup(role)))
		return oom(err);
	if (ref) {
		rc = ms_inv_resolve(inv, ref, out->digest, &lerr);
		if (rc == MS_ENOTFOUND || rc == MS_EINVAL) {
			rc = ms_err_set(err, MS_ECHECK, "role '%s': %s", role, lerr.msg);
			goto out;
		}
		if (rc != MS_OK) {
			rc = ms_err_set(err, rc, "%s", lerr.msg);
			goto out;
		}
	} else {
		/* a path: hash it to learn which state it holds */
		rc = ms_ckpt_open(path, &ck, &lerr);
		if (rc == MS_OK)
			rc = ms_ckpt_hash(ck, nthreads, 0, &lerr);
		if (rc == MS_OK)
			rc = ms_state_digest(ck->tensors, ck->ntensors, out->digest, &lerr);
		if (rc == MS_OK)
			rc = ms_vstate_from_ckpt(ck, &vs, &lerr);
		if (rc == MS_EINVAL || rc == MS_ENOTFOUND ||
		    (rc == MS_EIO && access(path, F_OK) != 0 && errno == ENOENT)) {
			/* missing or not a checkpoint: a refusal (the message
			 * names the path); a read that failed stays an I/O error */
			rc = ms_err_set(err, MS_ECHECK, "role '%s': %s", role, lerr.msg);
			goto out;
		}
		if (rc != MS_OK) {
			rc = ms_err_set(err, rc, "role '%s': %s", role, lerr.msg);
			goto out;
		}
	}
	rc = ms_inv_state_get(inv, out->digest, &st, &lerr);
	if (rc == MS_ENOTFOUND) {
		rc = ms_err_set(err, MS_ECHECK, "role '%s': '%s' is state %.23s..., which is not in "
				"the inventory (add it with msinv add)", role, ref ? ref : path,
				out->digest);
		goto out;
	}
	if (rc != MS_OK) {
		rc = ms_err_set(err, rc, "%s", lerr.msg);
		goto out;
	}
	if (st->label && !(out->label = ms_strdup(st->label))) {
		rc = oom(err);
		goto out;
	}
	out->kind = st->kind;
	out->ep_size = st->ep_size;
	out->ep_rank = st->ep_rank;
	state_name(out, who, sizeof(who));
	if (launch && launch->active) {
		const char *d = launch_digest(launch, role);

		if (!d) {
			rc = ms_err_set(err, MS_ECHECK, "role '%s': state %s was not verified by the "
					"launch of run %" PRId64, role, who, launch->run_id);
			goto out;
		}
		if (strcmp(d, out->digest)) {
			rc = ms_err_set(err, MS_ECHECK, "role '%s': state %s is not the state run %"
					PRId64 " verified (%.23s...)", role, who, launch->run_id, d);
			goto out;
		}
	}
	/* a state whose last check found it changed stays refused until a
	 * check passes again (msverify files, msinv launch) */
	if ((rc = ms_inv_verifications(inv, out->digest, &v, &nv, err)) != MS_OK)
		goto out;
	if (nv && v[0].result != MS_INV_RESULT_OK) {
		rc = ms_err_set(err, MS_ECHECK, "role '%s': state %s: unverified: its last "
				"verification (%s) found it %s%s%s", role, who, v[0].at,
				ms_inv_result_name(v[0].result), v[0].detail ? ": " : "",
				v[0].detail ? v[0].detail : "");
		goto out;
	}
	if (!vs && (rc = ms_vstate_from_inv(inv, out->digest, 0, &vs, err)) != MS_OK)
		goto out;
	if (!(out->where = ms_vstate_location(vs))) {
		rc = oom(err);
		goto out;
	}
	if ((rc = load_configs(vs, out, who, err)) != MS_OK ||
	    (rc = load_tensors(vs, out, who, nthreads, err)) != MS_OK)
		goto out;
out:
	ms_inv_verifications_free(v, nv);
	ms_inv_state_free(st);
	ms_vstate_free(vs);
	ms_ckpt_close(ck);
	if (rc != MS_OK)
		ms_train_state_release(out);
	return rc;
}

/* ---- a warm start from an EP shard set ------------------------------------------- */

/* Append one tensor (name copied, bytes owned) to s->t. */
static struct ms_wtensor *state_push(struct ms_train_state *s, const char *name,
				     enum ms_dtype dt, uint32_t ndim, const uint64_t *shape,
				     uint64_t nbytes, struct ms_err *err)
{
	struct ms_wtensor *nt = ms_realloc(s->t, (s->n + 1) * sizeof(*nt)), *w;

	if (!nt) {
		oom(err);
		return NULL;
	}
	s->t = nt;
	w = &nt[s->n];
	memset(w, 0, sizeof(*w));
	if (!(w->name = ms_strdup(name)) || !(w->data = ms_calloc(1, nbytes ? nbytes : 1))) {
		ms_free((void *)w->name);
		ms_free((void *)w->data);
		oom(err);
		return NULL;
	}
	w->dtype = dt;
	w->ndim = ndim;
	memcpy(w->shape, shape, ndim * sizeof(shape[0]));
	w->nbytes = nbytes;
	s->n++;
	return w;
}

static struct ms_wtensor *state_find(struct ms_train_state *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->t[i].name, name))
			return &s->t[i];
	return NULL;
}

/*
 * One rank's verified shard into the whole adapter being rebuilt: fused
 * expert LoRA factors go back to their global rows (A [E*r, in]: row
 * e*r+k) and columns (B [out, r*E]: column k*E+e) from the shard's local
 * ones (le*r+k, k*El+le), the expert ids the manifest gives; per-expert and
 * replicated tensors are taken once (ms_ep_load_rank checked every rank's
 * replicas against the manifest).
 */
static int shard_merge(struct ms_train_state *s, const struct ms_ep_rank *r,
		       const struct ms_wtensor *t, struct ms_err *err)
{
	struct ms_name_info ni;
	struct ms_wtensor *w;
	uint64_t es, shape[MS_ST_MAX_RANK], El = r->nexperts, E = r->num_experts, rk;
	int a;

	if (ms_name_parse(t->name, &ni) != MS_OK || ni.part != MS_NAME_PART_EXPERTS_FUSED ||
	    (ni.role != MS_NAME_ROLE_LORA_A && ni.role != MS_NAME_ROLE_LORA_B)) {
		if (state_find(s, t->name))
			return MS_OK;
		if (!(w = state_push(s, t->name, t->dtype, t->ndim, t->shape, t->nbytes, err)))
			return MS_ENOMEM;
		memcpy((void *)w->data, t->data, t->nbytes);
		return MS_OK;
	}
	a = ni.role == MS_NAME_ROLE_LORA_A;
	if (t->ndim != 2 || !El || !E || (a ? t->shape[0] : t->shape[1]) % El)
		return ms_err_set(err, MS_EINVAL, "shard '%s': tensor '%s' is not a fused LoRA "
				  "factor of %llu experts", r->shard_path, t->name,
				  (unsigned long long)El);
	if (ms_dtype_nbytes(t->dtype, 1, &es) != MS_OK || es == 0 ||
	    t->nbytes != t->shape[0] * t->shape[1] * es)
		return ms_err_set(err, MS_EINVAL, "shard '%s': tensor '%s': unsupported dtype",
				  r->shard_path, t->name);
	rk = (a ? t->shape[0] : t->shape[1]) / El;
	shape[0] = a ? E * rk : t->shape[0];
	shape[1] = a ? t->shape[1] : rk * E;
	if (!(w = state_find(s, t->name)) &&
	    !(w = state_push(s, t->name, t->dtype, 2, shape, shape[0] * shape[1] * es, err)))
		return MS_ENOMEM;
	if (w->shape[0] != shape[0] || w->shape[1] != shape[1] || w->dtype != t->dtype)
		return ms_err_set(err, MS_EINVAL, "shard '%s': tensor '%s' disagrees with the other "
				  "ranks' shape", r->shard_path, t->name);
	for (uint64_t le = 0; le < El; le++) {
		uint64_t g = r->experts[le];
		uint8_t *dst = (uint8_t *)w->data;
		const uint8_t *src = t->data;

		if (g >= E)
			return ms_err_set(err, MS_EINVAL, "shard '%s': expert %llu out of range",
					  r->shard_path, (unsigned long long)g);
		for (uint64_t k = 0; k < rk; k++) {
			if (a) {
				memcpy(dst + (g * rk + k) * t->shape[1] * es,
				       src + (le * rk + k) * t->shape[1] * es, t->shape[1] * es);
			} else {
				for (uint64_t o = 0; o < t->shape[0]; o++)
					memcpy(dst + (o * shape[1] + k * E + g) * es,
					       src + (o * t->shape[1] + k * El + le) * es, es);
			}
		}
	}
	return MS_OK;
}

/*
 * The plan's adapter as an msshard set (a directory with ep_manifest.json)
 * for ep ranks: each rank's shard through the EP-aware loader (a set of
 * another EP size, a placement or an expert's bytes that disagree with the
 * manifest, every rank holding the same block: refused), each shard an
 * inventoried state loaded through the verified load, then put together
 * into the whole adapter the model takes (its virtual ranks slice it
 * again).
 */
static int load_shard_set(struct ms_inv *inv, const char *dir, uint32_t ep, int nthreads,
			  struct ms_train_state *out, struct ms_err *err)
{
	struct ms_ep_rank *r = NULL;
	struct ms_train_state sh;
	struct ms_err lerr = {0};
	int rc = MS_OK;

	memset(out, 0, sizeof(*out));
	memset(&sh, 0, sizeof(sh));
	if (!(out->role = ms_strdup("adapter")) || !(out->where = ms_strdup(dir))) {
		rc = oom(err);
		goto out;
	}
	out->kind = MS_INV_KIND_ADAPTER;
	out->ep_size = out->ep_rank = -1;
	for (uint32_t k = 0; k < ep; k++) {
		rc = ms_ep_load_rank(dir, ep, k, &r, &lerr);
		if (rc == MS_EINVAL || rc == MS_ECHECK || rc == MS_ENOTFOUND) {
			rc = ms_err_set(err, MS_ECHECK, "role 'adapter': %s", lerr.msg);
			goto out;
		}
		if (rc != MS_OK) {
			rc = ms_err_set(err, rc, "role 'adapter': %s", lerr.msg);
			goto out;
		}
		/* the shard is a state like any other: inventoried, verified */
		if ((rc = ms_train_state_load(inv, "adapter", NULL, r->shard_path, NULL, nthreads,
					      &sh, err)) != MS_OK)
			goto out;
		if (strcmp(sh.digest, r->state_digest)) {
			rc = ms_err_set(err, MS_ECHECK, "role 'adapter': '%s' changed while it was "
					"read", r->shard_path);
			goto out;
		}
		if (k == 0)
			memcpy(out->digest, r->source_digest, sizeof(out->digest));
		for (size_t i = 0; i < sh.n; i++)
			if ((rc = shard_merge(out, r, &sh.t[i], err)) != MS_OK)
				goto out;
		out->bytes += sh.bytes;
		ms_train_state_release(&sh);
		ms_ep_rank_free(r);
		r = NULL;
	}
	/* the adapter's alpha: from the recorded adapter_config.json of the
	 * unsharded adapter, when the inventory has it (else the run's) */
	{
		struct ms_inv_config *c = NULL;
		size_t nc = 0;

		if (ms_inv_state_configs(inv, out->digest, &c, &nc, &lerr) == MS_OK) {
			for (size_t i = 0; i < nc && !out->adapter_config; i++)
				if (!strcmp(c[i].name, "adapter_config.json") &&
				    !(out->adapter_config = ms_strndup(c[i].text, c[i].len)))
					rc = oom(err);
			ms_inv_configs_free(c, nc);
		}
		if (rc == MS_OK) {
			/* a lineage parent must be a recorded state: without the
			 * unsharded adapter in the inventory the checkpoints
			 * derive from the base states only */
			struct ms_inv_state *st = NULL;

			if (ms_inv_state_get(inv, out->digest, &st, &lerr) == MS_ENOTFOUND)
				memset(out->digest, 0, sizeof(out->digest));
			else if (st && st->label && !(out->label = ms_strdup(st->label)))
				rc = oom(err);
			ms_inv_state_free(st);
		}
	}
out:
	ms_ep_rank_free(r);
	ms_train_state_release(&sh);
	if (rc != MS_OK)
		ms_train_state_release(out);
	return rc;
}

/* ---- the run ------------------------------------------------------------------- */

void ms_train_result_release(struct ms_train_result *r)
{
	for (size_t i = 0; i < r->nckpts; i++) {
		ms_free(r->ckpts[i].path);
		ms_free(r->ckpts[i].label);
	}
	ms_free(r->ckpts);
	for (size_t i = 0; i < r->nstates; i++)
		ms_train_state_release(&r->states[i]);
	ms_free(r->states);
	ms_free(r->profile);
	memset(r, 0, sizeof(*r));
}

/* The optimizer_sha256 and plan a checkpoint adapter's train edge records. */
static int resume_record(struct ms_inv *inv, const char *digest, const char *dir,
			 uint8_t sha[32], struct ms_err *err)
{
	struct ms_inv_edge *e = NULL;
	size_t n = 0;
	int rc, found = 0;

	if ((rc = ms_inv_edges(inv, digest, MS_INV_EDGES_PARENTS, &e, &n, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < n && !found; i++) {
		cJSON *p;
		const cJSON *h;

		if (strcmp(e[i].operation, "train") || !e[i].params)
			continue;
		p = ms_json_parse(e[i].params, strlen(e[i].params), NULL);
		h = p ? cJSON_GetObjectItemCaseSensitive(p, "optimizer_sha256") : NULL;
		if (cJSON_IsString(h) && strlen(h->valuestring) == 64 &&
		    ms_unhex(h->valuestring, sha, 32) == 0)
			found = 1;
		cJSON_Delete(p);
	}
	ms_inv_edges_free(e, n);
	if (!found)
		return ms_err_set(err, MS_ECHECK, "'%s': its adapter %.23s... was not recorded as a "
				  "checkpoint of mstrain (no train edge with an optimizer digest)",
				  dir, digest);
	return MS_OK;
}

struct loop {
	struct ms_inv *inv;
	const struct ms_train_opts *o;
	const struct ms_train_plan *tp;
	const char *outputs, *plan_digest;
	int64_t run_id;
	struct ms_model *model;
	const struct ms_param *params;
	size_t np;
	struct ms_adamw *opt;
	struct ms_data *data;
	const char *parents[3];
	size_t nparents;
	struct ms_train_result *res;
};

static int checkpoint(struct loop *L, uint64_t step, struct ms_err *err)
{
	struct ms_train_ckpt_save s;
	struct ms_train_ckpt *c, *nc;
	char *acfg = NULL, *label = NULL, *had = NULL, *dir = NULL, digest[MS_STATE_DIGEST_LEN];
	int rc;

	/* a GPU model's parameters and moments come to the host first */
	if ((rc = ms_model_sync(L->model, L->opt, MS_MODEL_TO_HOST, err)) != MS_OK ||
	    (rc = ms_model_adapter_config(L->model, &acfg, err)) != MS_OK)
		return rc;
	if (!(label = ms_asprintf("%s-step%" PRIu64, L->tp->label, step))) {
		rc = oom(err);
		goto out;
	}
	memset(&s, 0, sizeof(s));
	s.outputs = L->outputs;
	s.params = L->params;
	s.nparams = L->np;
	s.opt = L->opt;
	s.adapter_config = acfg;
	s.meta.step = step;
	s.meta.data_cursor = L->data->cursor;
	s.meta.data_seed = L->tp->seed;
	s.meta.lora_seed = L->tp->lora.seed;
	s.run_id = L->run_id;
	s.label = label;
	s.parents = L->parents;
	s.nparents = L->nparents;
	s.jobs = L->o->nthreads;
	if ((rc = ms_train_ckpt_write(L->inv, &s, &dir, digest, &had, err)) != MS_OK)
		goto out;
	nc = ms_realloc(L->res->ckpts, (L->res->nckpts + 1) * sizeof(*nc));
	if (!nc) {
		rc = oom(err);
		goto out;
	}
	L->res->ckpts = nc;
	c = &nc[L->res->nckpts++];
	c->step = step;
	c->path = dir;
	c->label = had;
	memcpy(c->digest, digest, sizeof(digest));
	dir = had = NULL;
	if (L->o->on_ckpt)
		L->o->on_ckpt(L->o->ctx, c);
out:
	ms_free(acfg);
	ms_free(label);
	ms_free(had);
	ms_free(dir);
	return rc;
}

static int train_loop(struct loop *L, uint64_t start, uint64_t stop, struct ms_err *err)
{
	const struct ms_train_plan *tp = L->tp;
	struct ms_batch *bs = NULL;
	uint32_t A = tp->grad_accum;
	int rc = MS_OK;
	double t0 = ms_now();

	if (!(bs = ms_calloc(A, sizeof(*bs)))) {
		rc = oom(err);
		goto out;
	}
	for (uint32_t a = 0; a < A; a++)
		if ((rc = ms_batch_init(&bs[a], tp->batch, tp->seq_len, err)) != MS_OK)
			goto out;
	for (uint64_t step = start + 1; step <= stop; step++) {
		struct ms_train_step s = {0};
		double t = ms_now(), loss = 0;
		uint64_t ntok = 0;

		/* every micro-batch first: the mean is over the step's tokens */
		for (uint32_t a = 0; a < A; a++) {
			if ((rc = ms_data_next(L->data, &bs[a], err)) != MS_OK)
				goto out;
			ntok += bs[a].ntargets;
		}
		ms_model_zero_grad(L->model);
		for (uint32_t a = 0; a < A; a++) {
			double ls = 0;
			uint64_t nt = 0;

			if ((rc = ms_model_step(L->model, bs[a].ids, bs[a].mask, tp->batch,
						tp->seq_len, 1.0 / (double)ntok, step - 1, &ls, &nt,
						err)) != MS_OK)
				goto out;
			loss += ls;
		}
		s.step = step;
		s.total = tp->steps;
		s.loss = loss / (double)ntok;
		s.tokens = ntok;
		s.lr = ms_sched_lr(&tp->optim, step - 1);
		if ((rc = ms_model_optim_step(L->model, L->opt, s.lr, &s.grad_norm, err)) != MS_OK)
			goto out;
		s.seconds = ms_now() - t;
		s.tokens_per_s = s.seconds > 0 ? (double)A * tp->batch * tp->seq_len / s.seconds : 0;
		if (step == start + 1) {
			L->res->first_step = step;
			L->res->first_loss = s.loss;
		}
		L->res->last_step = step;
		L->res->last_loss = s.loss;
		L->res->tokens += ntok;
		if (L->o->on_step && (rc = L->o->on_step(L->o->ctx, &s, err)) != MS_OK)
			goto out;
		if ((tp->checkpoint_every && step % tp->checkpoint_every == 0) || step == stop)
			if ((rc = checkpoint(L, step, err)) != MS_OK)
				goto out;
	}
out:
	L->res->seconds = ms_now() - t0;
	for (uint32_t a = 0; bs && a < A; a++)
		ms_batch_release(&bs[a]);
	ms_free(bs);
	return rc;
}

/*
 * GRPO steps (train.rl) over the run's model and optimizer: the monitor's
 * events are recorded in the inventory (on the launch's run, or on no run
 * when not launched) as they fire; with monitor.stop the first event ends
 * the run after a checkpoint of that step. first_loss/last_loss report
 * the mean reward of the first and last steps.
 */
static int rl_loop(struct loop *L, uint64_t start, uint64_t stop, struct ms_err *err)
{
	const struct ms_train_plan *tp = L->tp;
	struct ms_rl *r = NULL;
	double t0 = ms_now();
	int rc;

	L->res->rl = 1;
	if ((rc = ms_rl_new(L->model, &tp->rlc, &tp->optim, L->opt, &r, err)) != MS_OK)
		goto out;
	r->step = start;
	for (uint64_t step = start + 1; step <= stop; step++) {
		struct ms_rl_metrics s;
		struct ms_rl_event ev[MS_RL_NRULES];
		size_t nev;

		if ((rc = ms_rl_step(r, &s, ev, &nev, err)) != MS_OK)
			goto out;
		if (step == start + 1) {
			L->res->first_step = step;
			L->res->first_loss = s.reward_mean;
		}
		L->res->last_step = step;
		L->res->last_loss = s.reward_mean;
		for (size_t e = 0; e < nev; e++) {
			if ((rc = ms_rl_event_record(L->inv, L->run_id, &ev[e], err)) != MS_OK)
				goto out;
			L->res->rl_events++;
		}
		if (L->o->on_rl_step && (rc = L->o->on_rl_step(L->o->ctx, &s, ev, nev, err)) != MS_OK)
			goto out;
		if (nev && tp->rl_stop) {
			L->res->rl_stopped = 1;
			rc = checkpoint(L, step, err);
			goto out;
		}
		if ((tp->checkpoint_every && step % tp->checkpoint_every == 0) || step == stop)
			if ((rc = checkpoint(L, step, err)) != MS_OK)
				goto out;
	}
out:
	L->res->seconds = ms_now() - t0;
	ms_rl_free(r);
	return rc;
}

/* Keep a loaded state's identity in the result. */
static int keep_state(struct ms_train_result *res, struct ms_train_state *s, struct ms_err *err)
{
	struct ms_train_state *ns = ms_realloc(res->states, (res->nstates + 1) * sizeof(*ns));

	if (!ns)
		return oom(err);
	res->states = ns;
	ns[res->nstates++] = *s;
	memset(s, 0, sizeof(*s));
	return MS_OK;
}

/* What the run trained, as an event of the launch's run: the inventory
 * keeps the outcome beside the states the run consumed and produced. */
static int summary_event(struct ms_inv *inv, const struct ms_train_result *r,
			 struct ms_err *err)
{
	struct ms_buf b;
	char *js = NULL;
	int rc;

	ms_buf_init(&b);
	if (r->rl)
		ms_buf_printf(&b, "{\"first_step\":%" PRIu64 ",\"last_step\":%" PRIu64
			      ",\"first_reward\":%.17g,\"last_reward\":%.17g,\"rl_events\":%"
			      PRIu64 ",\"rl_stopped\":%s,\"seconds\":%.3f,\"checkpoints\":[",
			      r->first_step, r->last_step, r->first_loss, r->last_loss,
			      r->rl_events, r->rl_stopped ? "true" : "false", r->seconds);
	else
		ms_buf_printf(&b, "{\"first_step\":%" PRIu64 ",\"last_step\":%" PRIu64
			      ",\"first_loss\":%.17g,\"last_loss\":%.17g,\"tokens\":%" PRIu64
			      ",\"seconds\":%.3f,\"checkpoints\":[", r->first_step,
			      r->last_step, r->first_loss, r->last_loss, r->tokens, r->seconds);
	for (size_t i = 0; i < r->nckpts; i++)
		ms_buf_printf(&b, "%s{\"step\":%" PRIu64 ",\"state\":\"%s\"}", i ? "," : "",
			      r->ckpts[i].step, r->ckpts[i].digest);
	ms_buf_puts(&b, "]}");
	if (b.oom || !(js = ms_buf_detach(&b, NULL))) {
		ms_buf_release(&b);
		return oom(err);
	}
	rc = ms_inv_event_add(inv, r->run_id, "train_summary", js, NULL, err);
	ms_free(js);
	return rc;
}

/* lora_alpha of a warm-start adapter's (verified) adapter_config.json. */
static int warm_alpha(const struct ms_train_state *a, double *alpha, struct ms_err *err)
{
	int nomem = 0;
	cJSON *j = ms_json_parse(a->adapter_config, strlen(a->adapter_config), &nomem);
	const cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, "lora_alpha") : NULL;
	int rc = MS_OK;

	if (!j)
		rc = nomem ? oom(err)
			   : ms_err_set(err, MS_EINVAL, "role '%s': adapter_config.json: not JSON",
					a->role);
	else if (cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble > 0)
		*alpha = v->valuedouble;
	else if (v)
		rc = ms_err_set(err, MS_EINVAL, "role '%s': adapter_config.json: 'lora_alpha' is "
				"not a positive number", a->role);
	cJSON_Delete(j);
	return rc;
}

static const struct ms_fp_entry *plan_role(const struct ms_fp_plan *p, const char *role)
{
	for (size_t i = 0; i < p->nentries; i++)
		if (!strcmp(p->entries[i].role, role))
			return &p->entries[i];
	return NULL;
}

static char *plan_dir(const char *plan_path)
{
	const char *b = ms_path_base(plan_path);

	return b == plan_path ? ms_strdup(".") : ms_strndup(plan_path, (size_t)(b - plan_path - 1));
}

/* A directory holding an msshard set's manifest. */
static int is_shard_set(const char *p)
{
	char *m = ms_path_join(p, MS_EP_MANIFEST);
	struct stat sb;
	int yes = m && stat(m, &sb) == 0 && S_ISREG(sb.st_mode);

	ms_free(m);
	return yes;
}

static char *under(const char *dir, const char *p)
{
	return p[0] == '/' || !strcmp(dir, ".") ? ms_strdup(p) : ms_path_join(dir, p);
}

int ms_train_run(struct ms_inv *inv, const struct ms_train_opts *o, struct ms_train_result *res,
		 struct ms_err *err)
{
	struct ms_fp_plan *fp = NULL;
	struct ms_train_plan tp;
	struct ms_train_state base = {0}, quant = {0}, adapter = {0};
	struct ms_model_cfg cfg;
	struct ms_model_opts mo;
	struct ms_data_cfg dc;
	struct ms_optim_param *op = NULL;
	struct ms_train_ckpt_meta meta;
	struct loop L;
	char *text = NULL, *dir = NULL, *outputs = NULL, *p = NULL, *rdir = NULL;
	uint8_t d[32];
	size_t len = 0;
	uint64_t start = 0, stop;
	int rc;

	memset(res, 0, sizeof(*res));
	memset(&tp, 0, sizeof(tp));
	memset(&L, 0, sizeof(L));
	/* one read: the digest compared with the launch's is that of the
	 * bytes parsed */
	if ((rc = ms_file_read(o->plan_path, MS_FP_MAX_PLAN, &text, &len, err)) != MS_OK)
		goto out;
	if ((rc = ms_sha256(text, len, d)) != MS_OK) {
		rc = ms_sha256_err(err, rc);
		goto out;
	}
	memcpy(res->plan_digest, "sha256:", 7);
	ms_hex(d, 32, res->plan_digest + 7);
	if (o->launch && o->launch->active) {
		res->run_id = o->launch->run_id;
		if (strcmp(o->launch->plan_digest, res->plan_digest)) {
			rc = ms_err_set(err, MS_ECHECK, "plan '%s': not the plan run %" PRId64 " verified "
					"(the launch checked %.23s..., this file is %.23s...)",
					o->plan_path, o->launch->run_id, o->launch->plan_digest,
					res->plan_digest);
			goto out;
		}
	}
	if (!(dir = plan_dir(o->plan_path))) {
		rc = oom(err);
		goto out;
	}
	if ((rc = ms_fp_plan_parse(text, len, o->plan_path, &fp, err)) != MS_OK ||
	    (rc = ms_train_plan_parse(text, len, o->plan_path, dir, &tp, err)) != MS_OK)
		goto out;
	if (!fp->outputs) {
		rc = ms_err_set(err, MS_EINVAL, "plan '%s': key 'outputs': missing (the directory "
				"mstrain writes its checkpoints to)", o->plan_path);
		goto out;
	}
	if (!(outputs = under(dir, fp->outputs))) {
		rc = oom(err);
		goto out;
	}
	if (!plan_role(fp, "base")) {
		rc = ms_err_set(err, MS_EINVAL, "plan '%s': key 'states': no entry with role 'base'",
				o->plan_path);
		goto out;
	}
	/* the gate: every state through the inventory and the verified load */
	{
		static const char *const roles[] = {"base", "quantized", "adapter"};
		struct ms_train_state *dst[] = {&base, &quant, &adapter};

		for (size_t i = 0; i < 3; i++) {
			const struct ms_fp_entry *e = plan_role(fp, roles[i]);

			if (!e || (i == 2 && o->resume))
				continue;
			ms_free(p);
			p = NULL;
			if (e->path && !(p = under(dir, e->path))) {
				rc = oom(err);
				goto out;
			}
			if (i == 2 && p && is_shard_set(p)) {
				if ((rc = load_shard_set(inv, p, o->ep_size ? o->ep_size : fp->ep_size,
							 o->nthreads, dst[i], err)) != MS_OK)
					goto out;
				continue;
			}
			if ((rc = ms_train_state_load(inv, roles[i], e->state, p, o->launch,
						      o->nthreads, dst[i], err)) != MS_OK)
				goto out;
		}
	}
	if (o->resume) {
		/* the checkpoint's adapter is a state like any other; it is the
		 * adapter the resumed run starts from */
		if (!(rdir = ms_path_join(o->resume, MS_TRAIN_CKPT_ADAPTER))) {
			rc = oom(err);
			goto out;
		}
		if ((rc = ms_train_state_load(inv, "resume", NULL, rdir, NULL, o->nthreads, &adapter,
					      err)) != MS_OK)
			goto out;
	}
	if (adapter.role && adapter.kind == MS_INV_KIND_ADAPTER_SHARD) {
		/* one rank's slice is not the adapter: starting from it would
		 * train every rank on the same experts */
		uint32_t ep = o->ep_size ? o->ep_size : fp->ep_size;

		if (adapter.ep_size >= 0 && (uint32_t)adapter.ep_size != ep)
			rc = ms_err_set(err, MS_ECHECK, "role 'adapter': state %.23s... is a shard of "
					"an EP=%d split, this run is EP=%u: run 'msshard reshard "
					"--ep-size %u' (or 'msshard merge') and add the result",
					adapter.digest, adapter.ep_size, ep, ep);
		else
			rc = ms_err_set(err, MS_EINVAL, "role 'adapter': state %.23s... is the shard of "
					"rank %d of an EP set: mstrain starts from a whole adapter "
					"(run 'msshard merge' and add the result)", adapter.digest,
					adapter.ep_rank);
		goto out;
	}
	if (!base.config) {
		rc = ms_err_set(err, MS_EINVAL, "role 'base': state %.23s... has no config.json",
				base.digest);
		goto out;
	}
	if ((rc = ms_model_cfg_parse(base.config, base.config_len, &cfg, err)) != MS_OK) {
		ms_err_prefix(err, "role 'base': config.json");
		goto out;
	}
	memset(&mo, 0, sizeof(mo));
	mo.colwise = o->colwise >= 0 ? (enum ms_colwise_mode)o->colwise : tp.colwise;
	mo.ep_size = o->ep_size ? o->ep_size : fp->ep_size;
	mo.nthreads = o->nthreads;
	mo.device = o->device;
	mo.gpu_f32 = o->gpu_f32;
	mo.expert_gemm = o->expert_gemm;
	mo.attention = o->attention;
	/* a warm start keeps its own delta: the model rescales B from the
	 * adapter's alpha to the run's */
	if (adapter.adapter_config && (rc = warm_alpha(&adapter, &mo.warm_alpha, err)) != MS_OK)
		goto out;
	if (tp.batch % mo.ep_size) {
		rc = ms_err_set(err, MS_EINVAL, "plan '%s': key 'train.batch': %u sequences do not "
				"divide over %u EP ranks", o->plan_path, tp.batch, mo.ep_size);
		goto out;
	}
	if ((rc = ms_model_build(&L.model, &cfg, base.t, base.n, quant.t, quant.n, &tp.lora,
				 adapter.t, adapter.n, &mo, err)) != MS_OK)
		goto out;
	/* the model holds its own copies: the loaded bytes can go */
	state_drop_tensors(&base);
	state_drop_tensors(&quant);
	state_drop_tensors(&adapter);
	L.np = ms_model_params(L.model, &L.params);
	if (!(op = ms_calloc(L.np + 1, sizeof(*op)))) {
		rc = oom(err);
		goto out;
	}
	for (size_t i = 0; i < L.np; i++) {
		op[i].name = L.params[i].name;
		op[i].w = L.params[i].w;
		op[i].g = L.params[i].g;
		op[i].n = L.params[i].n;
		res->nparams += L.params[i].n;
	}
	if ((rc = ms_adamw_new(&tp.optim, op, L.np, &L.opt, err)) != MS_OK)
		goto out;
	memset(&dc, 0, sizeof(dc));
	dc.task = tp.task;
	dc.jsonl = tp.jsonl;
	dc.vocab = cfg.vocab;
	dc.seq_len = tp.seq_len;
	dc.batch = tp.batch;
	dc.seed = tp.seed;
	if ((rc = ms_data_open(&dc, &L.data, err)) != MS_OK)
		goto out;
	if (o->resume) {
		uint8_t sha[32];

		if ((rc = resume_record(inv, adapter.digest, o->resume, sha, err)) != MS_OK ||
		    (rc = ms_train_ckpt_read_optim(o->resume, sha, L.opt, &meta, err)) != MS_OK)
			goto out;
		/* another seed would draw other examples and dropout masks
		 * than the run being continued */
		if (meta.data_seed != tp.seed || meta.lora_seed != tp.lora.seed) {
			rc = ms_err_set(err, MS_EINVAL, "'%s': written by a run of seed %" PRIu64
					", the plan's seed is %" PRIu64, o->resume, meta.data_seed,
					tp.seed);
			goto out;
		}
		start = meta.step;
		L.data->cursor = meta.data_cursor;
		/* the moments read into the host optimizer go to the device */
		if ((rc = ms_model_sync(L.model, L.opt, MS_MODEL_TO_DEVICE, err)) != MS_OK)
			goto out;
	}
	stop = o->stop_step && o->stop_step < tp.steps ? o->stop_step : tp.steps;
	if (start >= stop) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': already at step %" PRIu64 ", the run stops "
				"at %" PRIu64, o->resume ? o->resume : o->plan_path, start, stop);
		goto out;
	}
	L.inv = inv;
	L.o = o;
	L.tp = &tp;
	L.outputs = outputs;
	L.plan_digest = res->plan_digest;
	L.run_id = res->run_id;
	L.res = res;
	L.parents[L.nparents++] = base.digest;
	if (quant.role)
		L.parents[L.nparents++] = quant.digest;
	if (adapter.role && adapter.digest[0])
		L.parents[L.nparents++] = adapter.digest;
	if (tp.rl && o->resume) {
		/* the rollouts' and the monitor's state are not in a checkpoint */
		rc = ms_err_set(err, MS_EINVAL, "'%s': a GRPO run (train.rl) cannot be resumed",
				o->resume);
		goto out;
	}
	rc = tp.rl ? rl_loop(&L, start, stop, err) : train_loop(&L, start, stop, err);
	if (rc == MS_OK && res->run_id)
		rc = summary_event(inv, res, err);
out:
	{
		/* the identities are a report; losing them to memory is no
		 * failure of the run */
		struct ms_err lerr;

		if (base.role)
			(void)keep_state(res, &base, &lerr);
		if (quant.role)
			(void)keep_state(res, &quant, &lerr);
		if (adapter.role)
			(void)keep_state(res, &adapter, &lerr);
	}
	ms_train_state_release(&base);
	ms_train_state_release(&quant);
	ms_train_state_release(&adapter);
	ms_data_free(L.data);
	if (L.model && o->device != MS_DEVICE_CPU) {
		/* what the device held and where its time went, for --profile */
		ms_model_mem(L.model, &res->mem);
		if (!res->profile)
			ms_model_profile(L.model, &res->profile, NULL);
	}
	ms_adamw_free(L.opt);
	ms_model_free(L.model);
	ms_free(op);
	ms_train_plan_release(&tp);
	ms_fp_plan_free(fp);
	ms_free(text);
	ms_free(dir);
	ms_free(outputs);
	ms_free(p);
	ms_free(rdir);
	return rc;
}
