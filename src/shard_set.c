/*
 * shard_set.c: reading a shard set through its manifest: every check of
 * ms_shard_check, the source model rebuilt from the shards for reshard
 * and merge, and the EP-aware load of one rank.
 */
#include "shard_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fsutil.h"
#include "hash.h"
#include "inventory.h"
#include "names.h"
#include "safetensors.h"
#include "stage.h"

/* ---- reading a shard set ---------------------------------------------------- */

const char *ms_ep_fault_name(enum ms_ep_fault_kind kind)
{
	static const char *const names[] = {
		"same-block", "swap", "wrong-expert", "missing", "duplicate", "misplaced",
		"shape", "unknown", "replica", "digest", "state", "source", "experts",
	};

	return (size_t)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "?";
}

static void faults_free(struct ms_ep_fault *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		ms_free(v[i].tensor);
		ms_free(v[i].file);
		ms_free(v[i].msg);
	}
	ms_free(v);
}

void shard_sset_release(struct sset *ss)
{
	for (uint32_t r = 0; ss->pl && r < ss->pl->ep_size; r++) {
		if (ss->ck)
			ms_ckpt_close(ss->ck[r]);
		if (ss->names)
			ms_free(ss->names[r]);
	}
	ms_free(ss->ck);
	ms_free(ss->names);
	ms_free(ss->sdig);
	ms_free(ss->by_name);
	faults_free(ss->faults, ss->nfaults);
	ms_free(ss->tbad);
	ms_free(ss->missing);
	ms_free(ss->rbad);
	ms_free(ss->stray);
	ms_ep_placement_free(ss->pl);
	shard_src_release(&ss->s);
	cJSON_Delete(ss->m);
	ms_free(ss->dir);
	ms_free(ss->mpath);
	memset(ss, 0, sizeof(*ss));
}

static int bad(const struct sset *ss, struct ms_err *err, const char *what)
{
	return ms_err_set(err, MS_EINVAL, "'%s': %s", ss->mpath, what);
}

static const char *jstr(const cJSON *o, const char *key)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsString(j) && j->valuestring ? j->valuestring : NULL;
}

static int valid_state_digest(const char *d)
{
	uint8_t tmp[MS_SHA256_LEN];

	return d && strlen(d) == MS_STATE_DIGEST_LEN - 1 && !strncmp(d, "sha256:", 7) &&
	       ms_unhex(d + 7, tmp, MS_SHA256_LEN) == 0;
}

static int hex_digest(const cJSON *o, const char *key, uint8_t *out)
{
	const char *h = jstr(o, key);

	return h && strlen(h) == 2 * MS_SHA256_LEN && ms_unhex(h, out, MS_SHA256_LEN) == 0 ? 0 : -1;
}

static int ids_equal(const cJSON *a, const uint32_t *ids, uint32_t n)
{
	const cJSON *x;
	uint32_t i = 0;
	uint64_t v;

	if (!cJSON_IsArray(a) || (uint32_t)cJSON_GetArraySize(a) != n)
		return 0;
	cJSON_ArrayForEach(x, a)
		if (shard_json_u64(x, UINT32_MAX, &v) || v != ids[i++])
			return 0;
	return 1;
}

static int cmp_stensor_name(const void *a, const void *b)
{
	return strcmp((*(struct stensor *const *)a)->name, (*(struct stensor *const *)b)->name);
}

static struct stensor *sset_find(const struct sset *ss, const char *name)
{
	size_t lo = 0, hi = ss->s.n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(ss->by_name[mid]->name, name);

		if (!c)
			return ss->by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* Source files, index, configs (read from the set's directory, digests
 * checked) and tensors, from the manifest. */
static int sset_read_source(struct sset *ss, struct ms_err *err)
{
	const cJSON *src = cJSON_GetObjectItemCaseSensitive(ss->m, "source");
	const cJSON *files, *f, *ix, *cfgs, *c, *tens, *t;
	struct src *s = &ss->s;
	size_t k;
	int rc;

	if (!cJSON_IsObject(src) || !valid_state_digest(jstr(src, "state_digest")))
		return bad(ss, err, "\"source\" must hold a \"state_digest\" (sha256:<64 hex>)");
	memcpy(s->digest, jstr(src, "state_digest"), MS_STATE_DIGEST_LEN);
	files = cJSON_GetObjectItemCaseSensitive(src, "files");
	if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) < 1)
		return bad(ss, err, "\"source.files\" must be a non-empty array");
	s->files = ms_calloc((size_t)cJSON_GetArraySize(files), sizeof(*s->files));
	if (!s->files)
		return ms_err_nomem(err);
	cJSON_ArrayForEach(f, files) {
		const cJSON *meta = cJSON_GetObjectItemCaseSensitive(f, "metadata"), *kv;
		struct sfile *sf = &s->files[s->nfiles];
		const char *name = jstr(f, "name");

		if (!name || !ms_name_is_plain(name) || !cJSON_IsObject(meta))
			return bad(ss, err, "each of \"source.files\" needs a plain \"name\" and a "
				   "\"metadata\" object");
		s->nfiles++;
		if (!(sf->name = ms_strdup(name)))
			return ms_err_nomem(err);
		sf->meta = ms_calloc((size_t)cJSON_GetArraySize(meta) + 1, sizeof(*sf->meta));
		if (!sf->meta)
			return ms_err_nomem(err);
		cJSON_ArrayForEach(kv, meta) {
			if (!cJSON_IsString(kv))
				return bad(ss, err, "file metadata values must be strings");
			sf->meta[sf->nmeta].key = ms_strdup(kv->string);
			sf->meta[sf->nmeta].value = ms_strdup(kv->valuestring);
			sf->nmeta++;
			if (!sf->meta[sf->nmeta - 1].key || !sf->meta[sf->nmeta - 1].value)
				return ms_err_nomem(err);
		}
	}
	ix = cJSON_GetObjectItemCaseSensitive(src, "index");
	if (ix && !cJSON_IsNull(ix)) {
		const cJSON *im = cJSON_GetObjectItemCaseSensitive(ix, "metadata");

		if (!jstr(ix, "name") || !ms_name_is_plain(jstr(ix, "name")) ||
		    (im && !cJSON_IsObject(im)))
			return bad(ss, err, "\"source.index\" needs a plain \"name\"");
		if (!(s->index_name = ms_strdup(jstr(ix, "name"))))
			return ms_err_nomem(err);
		if (im && !(s->index_meta = cJSON_Duplicate(im, 1)))
			return ms_err_nomem(err);
	}

	cfgs = cJSON_GetObjectItemCaseSensitive(ss->m, "configs");
	if (!cJSON_IsArray(cfgs))
		return bad(ss, err, "\"configs\" must be an array");
	cJSON_ArrayForEach(c, cfgs) {
		const char *name = jstr(c, "name");
		uint8_t want[MS_SHA256_LEN], got[MS_SHA256_LEN];
		char *path, *text = NULL;
		size_t len;

		if (!name || !ms_name_is_plain(name) || hex_digest(c, "sha256", want))
			return bad(ss, err, "each of \"configs\" needs a plain \"name\" and a \"sha256\"");
		if (!(path = ms_path_join(ss->dir, name)))
			return ms_err_nomem(err);
		rc = ms_file_read(path, MS_CKPT_MAX_SIDE, &text, &len, err);
		if (rc == MS_ENOTFOUND)
			rc = ms_err_set(err, MS_EINVAL, "'%s' is missing (the manifest lists it)", path);
		if (rc == MS_OK && (rc = ms_sha256(text, len, got)) != MS_OK)
			rc = rc == MS_ENOMEM ? ms_err_nomem(err) : ms_err_set(err, rc, "'%s': sha256 failed", path);
		if (rc == MS_OK && memcmp(got, want, MS_SHA256_LEN))
			rc = ms_err_set(err, MS_ECHECK, "'%s': its sha256 does not match the manifest",
					path);
		if (rc == MS_OK)
			rc = shard_src_add_config(s, name, text, len, got, err);
		ms_free(text);
		ms_free(path);
		if (rc != MS_OK)
			return rc;
	}
	s->is_adapter = shard_src_config(s, "adapter_config.json") != NULL;

	tens = cJSON_GetObjectItemCaseSensitive(ss->m, "tensors");
	if (!cJSON_IsArray(tens) || cJSON_GetArraySize(tens) < 1)
		return bad(ss, err, "\"tensors\" must be a non-empty array");
	s->t = ms_calloc((size_t)cJSON_GetArraySize(tens), sizeof(*s->t));
	ss->by_name = ms_calloc((size_t)cJSON_GetArraySize(tens), sizeof(*ss->by_name));
	if (!s->t || !ss->by_name)
		return ms_err_nomem(err);
	cJSON_ArrayForEach(t, tens) {
		struct stensor *x = &s->t[s->n];
		const char *name = jstr(t, "name"), *dt = jstr(t, "dtype");
		const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape"), *d;
		uint64_t v;

		if (!name || !*name || strlen(name) > MS_ST_MAX_NAME || !dt ||
		    ms_dtype_parse(dt, strlen(dt), &x->dtype) != MS_OK || !cJSON_IsArray(shape) ||
		    cJSON_GetArraySize(shape) > MS_ST_MAX_RANK || hex_digest(t, "sha256", x->digest) ||
		    shard_json_u64(cJSON_GetObjectItemCaseSensitive(t, "file"), s->nfiles - 1, &v))
			return bad(ss, err, "each of \"tensors\" needs \"name\", a known \"dtype\", "
				   "\"shape\", \"sha256\" and a \"file\" index");
		x->file = (uint32_t)v;
		cJSON_ArrayForEach(d, shape) {
			if (shard_json_u64(d, UINT64_MAX, &x->shape[x->ndim]))
				return bad(ss, err, "tensor shapes must be arrays of integers");
			x->ndim++;
		}
		if (shard_shape_nbytes(x->dtype, x->ndim, x->shape, &x->nbytes))
			return ms_err_set(err, MS_EINVAL, "'%s': tensor '%s': its size overflows or is not "
					  "whole bytes", ss->mpath, name);
		x->has_digest = 1;
		if (!(x->name = ms_strdup(name)))
			return ms_err_nomem(err);
		ss->by_name[s->n] = x;
		s->n++;
	}
	qsort(ss->by_name, s->n, sizeof(*ss->by_name), cmp_stensor_name);
	for (k = 1; k < s->n; k++)
		if (!strcmp(ss->by_name[k]->name, ss->by_name[k - 1]->name))
			return ms_err_set(err, MS_EINVAL, "'%s': tensor '%s' is listed twice", ss->mpath,
					  ss->by_name[k]->name);
	return MS_OK;
}

/* The manifest's classification must be the one the names, shapes and
 * configs give: a manifest cannot make a routed tensor replicated. */
static int sset_check_classes(struct sset *ss, struct ms_err *err)
{
	const cJSON *tens = cJSON_GetObjectItemCaseSensitive(ss->m, "tensors"), *t;
	const cJSON *recs = cJSON_GetObjectItemCaseSensitive(ss->m, "experts"), *x;
	struct src *s = &ss->s;
	char packing[48];
	const char *mp = jstr(ss->m, "packing");
	const cJSON *mr = cJSON_GetObjectItemCaseSensitive(ss->m, "r");
	uint64_t v;
	size_t i = 0;

	shard_packing_str(s->packing, packing, sizeof(packing));
	if (!mp || strcmp(mp, packing))
		return ms_err_set(err, MS_EINVAL, "'%s': packing '%s', but the tensors are '%s'",
				  ss->mpath, mp ? mp : "(none)", packing);
	if (s->r ? (shard_json_u64(mr, UINT32_MAX, &v) || v != s->r) : (mr && !cJSON_IsNull(mr)))
		return ms_err_set(err, MS_EINVAL, "'%s': \"r\" does not match adapter_config.json",
				  ss->mpath);
	cJSON_ArrayForEach(t, tens) {
		const struct stensor *y = &s->t[i++];
		const char *kind = jstr(t, "kind");
		int ok = kind && !strcmp(kind, shard_tkind_names[y->kind]);

		if (ok && y->kind == TK_EXPERT)
			ok = !shard_json_u64(cJSON_GetObjectItemCaseSensitive(t, "expert"), UINT32_MAX, &v) &&
			     v == (uint64_t)y->expert;
		if (ok && y->kind != TK_REPLICATED)
			ok = jstr(t, "param") && !strcmp(jstr(t, "param"), y->param) &&
			     jstr(t, "part") && !strcmp(jstr(t, "part"), y->part);
		if (ok && (y->kind == TK_FUSED_A || y->kind == TK_FUSED_B))
			ok = !shard_json_u64(cJSON_GetObjectItemCaseSensitive(t, "r"), UINT32_MAX, &v) &&
			     v == y->r;
		if (!ok)
			return ms_err_set(err, MS_EINVAL, "'%s': tensor '%s' is recorded as '%s', but its "
					  "name, shape and config make it %s%s%s", ss->mpath, y->name,
					  kind ? kind : "(none)", shard_tkind_names[y->kind],
					  y->param ? " of " : "", y->param ? y->param : "");
	}
	if (!cJSON_IsArray(recs) || (size_t)cJSON_GetArraySize(recs) != s->nrec)
		return ms_err_set(err, MS_EINVAL, "'%s': \"experts\" must list %zu expert slices",
				  ss->mpath, s->nrec);
	i = 0;
	cJSON_ArrayForEach(x, recs) {
		struct srec *r = &s->rec[i++];
		const struct stensor *y = &s->t[r->tensor];

		if (shard_json_u64(cJSON_GetObjectItemCaseSensitive(x, "expert"), UINT32_MAX, &v) ||
		    v != r->expert || !jstr(x, "param") || strcmp(jstr(x, "param"), y->param) ||
		    !jstr(x, "part") || strcmp(jstr(x, "part"), y->part) || !jstr(x, "tensor") ||
		    strcmp(jstr(x, "tensor"), y->name) || hex_digest(x, "sha256", r->want))
			return ms_err_set(err, MS_EINVAL, "'%s': expert slice %zu should be expert %u of "
					  "'%s' (%s) from '%s', with a sha256", ss->mpath, i - 1,
					  r->expert, y->param, y->part, y->name);
		r->has_want = 1;
	}
	return MS_OK;
}

static const char *shard_label(const struct sset *ss, uint32_t r)
{
	return ss->ck && ss->ck[r] ? ss->ck[r]->files[0]->path : ss->names[r];
}

/*
 * Record a fault and go on checking: f gives the kind, tensor, file, ranks
 * and experts (copied), fmt the one-line message; ti is the source tensor
 * the fault is about (-1: none), so that checks derived from it (a state
 * digest over that tensor, the reassembly) do not report it again.
 */
static int fault_add(struct sset *ss, struct ms_ep_fault fv, int64_t ti,
		     struct ms_err *err, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int fault_add(struct sset *ss, struct ms_ep_fault fv, int64_t ti,
		     struct ms_err *err, const char *fmt, ...)
{
	const struct ms_ep_fault *f = &fv;
	struct ms_ep_fault *x;
	char msg[sizeof(err->msg)];
	va_list ap;

	if (ti >= 0 && ss->tbad)
		ss->tbad[ti] = 1;
	if (f->rank >= 0 && ss->rbad)
		ss->rbad[f->rank]++;
	if (f->kind == MS_EP_FAULT_MISPLACED && f->other_rank >= 0 && ss->rbad)
		ss->rbad[f->other_rank]++;
	if (ss->nfaults >= MS_EP_MAX_FAULTS) {
		ss->nfaults_more++;
		return MS_OK;
	}
	if (ss->nfaults == ss->capfaults) {
		size_t cap = ss->capfaults ? 2 * ss->capfaults : 16;
		struct ms_ep_fault *v = ms_realloc(ss->faults, cap * sizeof(*v));

		if (!v)
			return ms_err_nomem(err);
		ss->faults = v;
		ss->capfaults = cap;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	x = &ss->faults[ss->nfaults];
	*x = *f;
	x->tensor = f->tensor ? ms_strdup(f->tensor) : NULL;
	x->file = f->file ? ms_strdup(f->file) : NULL;
	x->msg = ms_strdup(msg);
	if ((f->tensor && !x->tensor) || (f->file && !x->file) || !x->msg) {
		ms_free(x->tensor);
		ms_free(x->file);
		ms_free(x->msg);
		return ms_err_nomem(err);
	}
	ss->nfaults++;
	return MS_OK;
}

/* A fault template: kind, tensor, file, rank, expert, other expert, its rank. */
static struct ms_ep_fault fault_of(enum ms_ep_fault_kind kind, const char *tensor, const char *file,
				   int64_t rank, int64_t expert, int64_t other, int64_t orank)
{
	struct ms_ep_fault f = { kind, (char *)tensor, (char *)file, rank, expert, other, orank, NULL };

	return f;
}

/* The verdict of a check: the first fault (and how many more) when any. */
static int sset_verdict(const struct sset *ss, struct ms_err *err)
{
	uint64_t more;

	if (!ss->nfaults)
		return MS_OK;
	more = ss->nfaults - 1 + ss->nfaults_more;
	if (more)
		return ms_err_set(err, MS_ECHECK, "%s (and %llu more fault%s)", ss->faults[0].msg,
				  (unsigned long long)more, more > 1 ? "s" : "");
	return ms_err_set(err, MS_ECHECK, "%s", ss->faults[0].msg);
}

/*
 * The file tensor of shard r holding source tensor t, when it is there with
 * the dtype and shape rank r should hold; NULL otherwise (a fault already
 * recorded by sset_check_shard).
 */
static const struct ms_tensor *shard_tensor(const struct sset *ss, uint32_t r,
					    const struct stensor *t)
{
	const struct ms_tensor *y;
	uint64_t shape[MS_ST_MAX_RANK];

	if (!ss->ck[r] || !(y = ms_st_find(ss->ck[r]->files[0], t->name)))
		return NULL;
	shard_local_shape(t, ss->pl->first[r + 1] - ss->pl->first[r], shape);
	if (y->dtype != t->dtype || y->ndim != t->ndim ||
	    memcmp(y->shape, shape, t->ndim * sizeof(uint64_t)))
		return NULL;
	return y;
}

/*
 * Expert tensors found on another rank than their own (stray) and missing
 * from their own, once every shard that is opened was read: an expert that
 * moved is misplaced, one on two ranks duplicated, one nowhere missing.
 * With one rank opened (only >= 0) a stray one is only known to be loaded
 * twice, and a missing one missing.
 */
static int sset_resolve_strays(struct sset *ss, int64_t only, struct ms_err *err)
{
	const struct ms_ep_placement *pl = ss->pl;
	int rc;

	for (size_t k = 0; k < ss->nstray; k++) {
		uint32_t i = (uint32_t)(ss->stray[k] >> 32), r = (uint32_t)ss->stray[k];
		const struct stensor *t = &ss->s.t[i];
		uint32_t h = pl->rank_of[t->expert];
		const char *f = shard_label(ss, r);

		if (only < 0 && ss->missing[i] == 1) {
			ss->missing[i] = 2;
			rc = fault_add(ss, fault_of(MS_EP_FAULT_MISPLACED, t->name, f, r,
									 t->expert, -1, h), i, err,
				       "tensor '%s' in '%s': expert %d is misplaced: it is on rank %u, "
				       "but the placement puts it on rank %u ('%s'), which lacks it",
				       t->name, f, t->expert, r, h, shard_label(ss, h));
		} else if (only < 0) {
			rc = fault_add(ss, fault_of(MS_EP_FAULT_DUPLICATE, t->name, f, r,
									 t->expert, -1, h), i, err,
				       "tensor '%s' in '%s': expert %d is duplicated: rank %u holds it "
				       "besides its own rank %u ('%s'): it would be loaded twice",
				       t->name, f, t->expert, r, h, shard_label(ss, h));
		} else {
			rc = fault_add(ss, fault_of(MS_EP_FAULT_DUPLICATE, t->name, f, r,
									 t->expert, -1, h), i, err,
				       "tensor '%s' in '%s': expert %d belongs on rank %u, not %u: it "
				       "would be loaded twice", t->name, f, t->expert, h, r);
		}
		if (rc != MS_OK)
			return rc;
	}
	for (size_t i = 0; i < ss->s.n; i++) {
		const struct stensor *t = &ss->s.t[i];
		uint32_t h;

		if (ss->missing[i] != 1)
			continue;
		h = pl->rank_of[t->expert];
		if ((rc = fault_add(ss, fault_of(MS_EP_FAULT_MISSING, t->name,
								      shard_label(ss, h), h, t->expert,
								      -1, -1),
				    (int64_t)i, err, "tensor '%s' in '%s': missing: expert %d is placed "
				    "on rank %u", t->name, shard_label(ss, h), t->expert, h)) != MS_OK)
			return rc;
	}
	return MS_OK;
}

/* One opened shard: metadata (a difference is bad input, MS_EINVAL) and
 * tensor set (each difference a fault; expert tensors on the wrong rank are
 * noted for sset_resolve_strays). */
static int sset_check_shard(struct sset *ss, uint32_t r, struct ms_err *err)
{
	const struct ms_st_file *f = ss->ck[r]->files[0];
	const struct ms_ep_placement *pl = ss->pl;
	const char *v;
	uint64_t x;
	uint32_t l = pl->first[r + 1] - pl->first[r];
	struct ms_buf b;
	int same;

	v = ms_st_meta_get(f, META_PREFIX "rank");
	if (!v)
		return ms_err_set(err, MS_EINVAL, "'%s': no " META_PREFIX "rank metadata: not an EP "
				  "shard", f->path);
	if (ms_parse_u64(v, UINT32_MAX, &x) || x != r)
		return ms_err_set(err, MS_EINVAL, "'%s': its metadata says rank %s, but the manifest "
				  "puts rank %u in this file: a copy of another rank's shard?",
				  f->path, v, r);
	v = ms_st_meta_get(f, META_PREFIX "size");
	if (!v || ms_parse_u64(v, UINT32_MAX, &x) || x != pl->ep_size)
		return ms_err_set(err, MS_EINVAL, "'%s': made for EP size %s, but the manifest is for %u",
				  f->path, v ? v : "(none)", pl->ep_size);
	v = ms_st_meta_get(f, META_PREFIX "num_experts");
	if (!v || ms_parse_u64(v, UINT32_MAX, &x) || x != ss->s.E)
		return ms_err_set(err, MS_EINVAL, "'%s': made for %s experts, but the manifest has %u",
				  f->path, v ? v : "(none)", ss->s.E);
	v = ms_st_meta_get(f, META_PREFIX "placement");
	if (!v || strcmp(v, ms_ep_placement_name(pl->kind)))
		return ms_err_set(err, MS_EINVAL, "'%s': made with placement '%s', but the manifest "
				  "says '%s'", f->path, v ? v : "(none)",
				  ms_ep_placement_name(pl->kind));
	ms_buf_init(&b);
	for (uint32_t i = 0; i < l; i++)
		ms_buf_printf(&b, i ? ",%u" : "%u", pl->ids[pl->first[r] + i]);
	if (b.oom) {
		ms_buf_release(&b);
		return ms_err_nomem(err);
	}
	v = ms_st_meta_get(f, META_PREFIX "experts");
	same = v && !strcmp(v, b.data ? b.data : "");
	ms_buf_release(&b);
	if (!same)
		return ms_err_set(err, MS_EINVAL, "'%s': holds experts [%s], but the placement puts "
				  "others on rank %u", f->path, v ? v : "", r);
	v = ms_st_meta_get(f, META_PREFIX "source");
	if (!v || strcmp(v, ss->s.digest))
		return ms_err_set(err, MS_EINVAL, "'%s': split from state %s, but the manifest's source "
				  "is %s", f->path, v ? v : "(none)", ss->s.digest);

	for (size_t i = 0; i < ss->s.n; i++) {
		const struct stensor *t = &ss->s.t[i];
		const struct ms_tensor *y;
		uint64_t shape[MS_ST_MAX_RANK];
		int rc;

		if (t->kind == TK_EXPERT && pl->rank_of[t->expert] != r)
			continue;
		y = ms_st_find(f, t->name);
		if (!y) {
			if (t->kind == TK_EXPERT) {
				ss->missing[i] = 1;
				continue;
			}
			if ((rc = fault_add(ss, fault_of(MS_EP_FAULT_MISSING, t->name,
									      f->path, r, -1, -1, -1),
					    (int64_t)i, err, "tensor '%s' in '%s': missing", t->name,
					    f->path)) != MS_OK)
				return rc;
			continue;
		}
		shard_local_shape(t, l, shape);
		if (y->dtype != t->dtype || y->ndim != t->ndim ||
		    memcmp(y->shape, shape, t->ndim * sizeof(uint64_t))) {
			char want_s[24 * MS_ST_MAX_RANK + 4], got_s[24 * MS_ST_MAX_RANK + 4];

			shard_shape_text(t->ndim, shape, want_s, sizeof(want_s));
			ms_shape_str(y, got_s, sizeof(got_s));
			if ((rc = fault_add(ss, fault_of(MS_EP_FAULT_SHAPE, t->name,
									      f->path, r, t->expert, -1, -1),
					    (int64_t)i, err, "tensor '%s' in '%s': %s %s, but rank %u "
					    "should hold %s %s", t->name, f->path, ms_dtype_name(y->dtype),
					    got_s, r, ms_dtype_name(t->dtype), want_s)) != MS_OK)
				return rc;
		}
	}
	for (size_t i = 0; i < f->ntensors; i++) {
		const struct ms_tensor *y = &f->tensors[i];
		const struct stensor *t = sset_find(ss, y->name);
		int rc;

		if (!t) {
			if ((rc = fault_add(ss, fault_of(MS_EP_FAULT_UNKNOWN, y->name,
									      f->path, r, -1, -1, -1),
					    -1, err, "tensor '%s' in '%s': not part of the source this "
					    "set was split from", y->name, f->path)) != MS_OK)
				return rc;
		} else if (t->kind == TK_EXPERT && pl->rank_of[t->expert] != r) {
			uint64_t *nv = ms_realloc(ss->stray, (ss->nstray + 1) * sizeof(*nv));

			if (!nv)
				return ms_err_nomem(err);
			ss->stray = nv;
			ss->stray[ss->nstray++] = (uint64_t)(t - ss->s.t) << 32 | r;
		}
	}
	return MS_OK;
}

/* Point the source tensors at the opened shards. */
static int sset_point(struct sset *ss, struct ms_err *err)
{
	struct src *s = &ss->s;
	const struct ms_ep_placement *pl = ss->pl;

	for (size_t i = 0; i < s->n; i++) {
		struct stensor *t = &s->t[i];

		/* a tensor missing or of the wrong shape (a fault already)
		 * stays without bytes: what is there is still checked */
		if (t->kind == TK_REPLICATED) {
			for (uint32_t r = 0; r < pl->ep_size && !t->data; r++)
				if ((t->st = shard_tensor(ss, r, t)))
					t->data = t->st->data;
		} else if (t->kind == TK_EXPERT) {
			uint32_t r = pl->rank_of[t->expert];

			if ((t->st = shard_tensor(ss, r, t)))
				t->data = t->st->data;
		} else {
			t->edata = ms_calloc(s->E, sizeof(*t->edata));
			t->epos = ms_calloc(s->E, sizeof(*t->epos));
			t->en = ms_calloc(s->E, sizeof(*t->en));
			if (!t->edata || !t->epos || !t->en)
				return ms_err_nomem(err);
			for (uint32_t e = 0; e < s->E; e++) {
				uint32_t r = pl->rank_of[e];
				const struct ms_tensor *y;

				t->epos[e] = pl->local_of[e];
				t->en[e] = pl->first[r + 1] - pl->first[r];
				if ((y = shard_tensor(ss, r, t)))
					t->edata[e] = y->data;
			}
		}
	}
	return MS_OK;
}

/* Record indices ordered by the digest the manifest gives each slice. */
static int cmp_rec_want(const void *a, const void *b, void *ctx)
{
	const struct srec *rec = ctx;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	int c = memcmp(rec[x].want, rec[y].want, MS_SHA256_LEN);

	return c ? c : (x > y) - (x < y);
}

/* The slice of another expert of the same layer, parameter and part as r
 * whose manifest digest is d (idx: cmp_rec_want order); NULL if none. */
static const struct srec *rec_by_want(const struct src *s, const uint32_t *idx,
				      const struct srec *r, const uint8_t *d)
{
	const struct stensor *tr = &s->t[r->tensor];
	size_t lo = 0, hi = s->nrec;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (memcmp(s->rec[idx[mid]].want, d, MS_SHA256_LEN) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < s->nrec && !memcmp(s->rec[idx[lo]].want, d, MS_SHA256_LEN); lo++) {
		const struct srec *q = &s->rec[idx[lo]];
		const struct stensor *tq = &s->t[q->tensor];

		if (q->expert != r->expert && tq->layer == tr->layer && !strcmp(tq->param, tr->param) &&
		    !strcmp(tq->part, tr->part))
			return q;
	}
	return NULL;
}

/*
 * An expert slice whose bytes are not the manifest's, described by whose
 * they are: the bytes of an expert placed on another rank (the same block
 * loaded under two global ids, the signature of a warm start that ignored
 * expert parallelism), of a partner on the same rank holding this one's
 * (a swap, reported once per pair), of another expert of the same rank,
 * or of no expert at all (a plain digest mismatch).
 */
static int slice_fault(struct sset *ss, const uint32_t *idx, const struct srec *r,
		       struct ms_err *err)
{
	const struct src *s = &ss->s;
	const struct ms_ep_placement *pl = ss->pl;
	const struct stensor *t = &s->t[r->tensor];
	const struct srec *q = rec_by_want(s, idx, r, r->got);
	uint32_t rank = pl->rank_of[r->expert], qrank;
	const char *f = shard_label(ss, rank);
	struct ms_ep_fault tf;

	if (!q) {
		tf = fault_of(MS_EP_FAULT_DIGEST, t->name, f, rank, r->expert, -1, -1);
		return fault_add(ss, tf, r->tensor, err, "tensor '%s' in '%s': expert %u of '%s' (%s): "
				 "digest does not match the manifest", t->name, f, r->expert, t->param,
				 t->part);
	}
	qrank = pl->rank_of[q->expert];
	if (qrank != rank) {
		tf = fault_of(MS_EP_FAULT_SAME_BLOCK, t->name, f, rank, r->expert, q->expert, qrank);
		return fault_add(ss, tf, r->tensor, err,
				 "tensor '%s': the same expert block appears under different global "
				 "expert ids: rank %u ('%s') holds the bytes of global expert %u (rank %u) "
				 "as expert %u: every rank loaded the same block instead of its own "
				 "experts", t->name, rank, f, q->expert, qrank, r->expert);
	}
	if (q->has_got && !memcmp(q->got, r->want, MS_SHA256_LEN)) {
		/* the partner reports the pair when its expert id is lower */
		if (q->expert < r->expert) {
			ss->tbad[r->tensor] = 1;
			ss->rbad[rank]++;
			return MS_OK;
		}
		tf = fault_of(MS_EP_FAULT_SWAP, t->name, f, rank, r->expert, q->expert, rank);
		return fault_add(ss, tf, r->tensor, err,
				 "tensor '%s' in '%s': experts %u and %u of rank %u are swapped: each "
				 "holds the other's bytes", t->name, f, r->expert, q->expert, rank);
	}
	tf = fault_of(MS_EP_FAULT_WRONG_EXPERT, t->name, f, rank, r->expert, q->expert, rank);
	return fault_add(ss, tf, r->tensor, err,
			 "tensor '%s' in '%s': expert %u holds the bytes of expert %u, which rank %u "
			 "also holds", t->name, f, r->expert, q->expert, rank);
}

/*
 * Bytes against digests, once the jobs of shard_sset_jobs ran; every fault is
 * recorded (fault_add) and the check goes on. Every byte of the opened
 * shards is checked: replicated tensors by their digests, routed experts
 * through every expert's canonical slices (a per-expert tensor's is its
 * digest). With V_SHARDS also the state digest of each shard without a
 * fault of its own, with V_REASSEMBLE (when nothing else failed) the
 * source digests of the sliced tensors.
 */
int shard_sset_check(struct sset *ss, unsigned what, struct ms_err *err)
{
	struct src *s = &ss->s;
	const struct ms_ep_placement *pl = ss->pl;
	char hex1[65], hex2[65];
	uint8_t *buf = NULL;
	uint32_t *all = NULL, *idx = NULL;
	struct ms_ep_fault tf;
	int rc = MS_OK;

	for (size_t i = 0; i < s->n; i++) {
		const struct stensor *t = &s->t[i];
		const struct ms_tensor *ref = NULL, *good = NULL;
		uint32_t rref = 0, rgood = 0;

		if (t->kind != TK_REPLICATED)
			continue;
		for (uint32_t r = 0; r < pl->ep_size; r++) {
			const struct ms_tensor *y = shard_tensor(ss, r, t);

			if (y && !ref) {
				ref = y;
				rref = r;
			}
			if (y && !good && !memcmp(y->digest, t->digest, MS_SHA256_LEN)) {
				good = y;
				rgood = r;
			}
		}
		for (uint32_t r = 0; r < pl->ep_size; r++) {
			const struct ms_tensor *y = shard_tensor(ss, r, t);

			if (!y || !memcmp(y->digest, t->digest, MS_SHA256_LEN))
				continue;
			if (good) {
				tf = fault_of(MS_EP_FAULT_REPLICA, t->name, shard_label(ss, r), r, -1, -1,
					      rgood);
				rc = fault_add(ss, tf, (int64_t)i, err, "tensor '%s': replicas differ "
					       "between rank %u ('%s') and rank %u ('%s'): rank %u's are "
					       "not the manifest's", t->name, rgood, shard_label(ss, rgood),
					       r, shard_label(ss, r), r);
			} else if (r == rref || memcmp(y->digest, ref->digest, MS_SHA256_LEN)) {
				/* no rank has the manifest's bytes: one fault per
				 * distinct wrong copy */
				ms_hex(y->digest, MS_SHA256_LEN, hex1);
				ms_hex(t->digest, MS_SHA256_LEN, hex2);
				tf = fault_of(r == rref ? MS_EP_FAULT_DIGEST : MS_EP_FAULT_REPLICA, t->name,
					      shard_label(ss, r), r, -1, -1, -1);
				rc = r == rref ? fault_add(ss, tf, (int64_t)i, err, "tensor '%s' in '%s': "
							   "digest %s, but the manifest says %s", t->name,
							   shard_label(ss, r), hex1, hex2)
					       : fault_add(ss, tf, (int64_t)i, err, "tensor '%s': replicas "
							   "differ between rank %u ('%s') and rank %u "
							   "('%s')", t->name, rref,
							   shard_label(ss, rref), r, shard_label(ss, r));
			}
			if (rc != MS_OK)
				return rc;
		}
	}
	for (size_t i = 0; i < s->nrec; i++) {
		const struct srec *r = &s->rec[i];

		if (!r->has_got || !r->has_want || !memcmp(r->got, r->want, MS_SHA256_LEN))
			continue;
		if (!idx) {
			if (!(idx = ms_malloc(s->nrec * sizeof(*idx)))) {
				rc = ms_err_nomem(err);
				goto out;
			}
			for (size_t k = 0; k < s->nrec; k++)
				idx[k] = (uint32_t)k;
			qsort_r(idx, s->nrec, sizeof(*idx), cmp_rec_want, s->rec);
		}
		if ((rc = slice_fault(ss, idx, r, err)) != MS_OK)
			goto out;
	}
	for (uint32_t r = 0; (what & V_SHARDS) && r < pl->ep_size; r++) {
		char d[MS_STATE_DIGEST_LEN];

		if (!ss->ck[r] || ss->rbad[r])
			continue;
		if ((rc = ms_state_digest(ss->ck[r]->tensors, ss->ck[r]->ntensors, d, err)) != MS_OK)
			goto out;
		tf = fault_of(MS_EP_FAULT_STATE, NULL, shard_label(ss, r), r, -1, -1, -1);
		if (strcmp(d, ss->sdig[r]) &&
		    (rc = fault_add(ss, tf, -1, err, "'%s': state digest %s, but the manifest says %s",
				    shard_label(ss, r), d, ss->sdig[r])) != MS_OK)
			goto out;
	}
	{
		char d[MS_STATE_DIGEST_LEN];

		if ((rc = shard_src_state_digest(s, d, err)) != MS_OK)
			goto out;
		tf = fault_of(MS_EP_FAULT_SOURCE, NULL, ss->mpath, -1, -1, -1, -1);
		if (strcmp(d, s->digest) &&
		    (rc = fault_add(ss, tf, -1, err, "'%s': its tensors make state %s, but it says the "
				    "source is %s", ss->mpath, d, s->digest)) != MS_OK)
			goto out;
	}
	/* bytes missing or already found wrong: nothing to put back together */
	if (ss->nfaults || ss->nfaults_more) {
		rc = sset_verdict(ss, err);
		goto out;
	}
	if (!(what & V_REASSEMBLE))
		goto out;
	/* The sliced tensors put back together must be the source's. */
	buf = ms_malloc(CHUNK);
	all = ms_malloc((size_t)s->E * sizeof(*all));
	if (!buf || !all) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (uint32_t e = 0; e < s->E; e++)
		all[e] = e;
	for (size_t i = 0; i < s->n; i++) {
		const struct stensor *t = &s->t[i];
		struct ms_sha256_ctx *c;
		uint8_t d[MS_SHA256_LEN];

		if (!shard_is_sliced(t->kind))
			continue;
		if (!(c = ms_sha256_new())) {
			rc = ms_err_nomem(err);
			goto out;
		}
		rc = shard_emit(s, t, all, s->E, buf, shard_sink_sha, c, err);
		if (rc == MS_OK && (rc = ms_sha256_final(c, d)) != MS_OK)
			rc = shard_sha_fail(rc, err);
		ms_sha256_free(c);
		if (rc != MS_OK)
			goto out;
		tf = fault_of(MS_EP_FAULT_SOURCE, t->name, ss->mpath, -1, -1, -1, -1);
		if (memcmp(d, t->digest, MS_SHA256_LEN) &&
		    (rc = fault_add(ss, tf, (int64_t)i, err, "tensor '%s': the shards put back together "
				    "differ from the manifest's digest", t->name)) != MS_OK)
			goto out;
	}
	rc = sset_verdict(ss, err);
out:
	ms_free(buf);
	ms_free(all);
	ms_free(idx);
	return rc;
}

/*
 * The hashing a check of the opened shards needs, as pool jobs: faulting
 * the mappings in (when they fit easily in memory: the hashing and the
 * writing threads then take no page fault per 4 KiB, a large part of the
 * time otherwise) as the first *npre jobs; the shards' tensors (all of
 * them with V_SHARDS, and the headers; else those not sliced, whose
 * digests are checked); every expert's canonical slices (shard_rec_jobs).
 */
int shard_sset_jobs(struct sset *ss, unsigned what, struct jobs *jl, size_t *npre,
		    struct ms_err *err)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	uint64_t total = 0;
	size_t from;
	int rc;

	for (uint32_t r = 0; r < ss->pl->ep_size; r++)
		if (ss->ck[r])
			total += ss->ck[r]->files[0]->size;
	for (uint32_t r = 0; r < ss->pl->ep_size; r++) {
		const struct ms_st_file *f = ss->ck[r] ? ss->ck[r]->files[0] : NULL;
		struct job *j;

		if (!f || !f->map || !f->size || pages <= 0 || psz <= 0 ||
		    total > (uint64_t)pages * (uint64_t)psz / 4)
			continue;
		if (!(j = shard_jobs_add(jl, JOB_PREFAULT)))
			return ms_err_nomem(err);
		j->data = f->map;
		j->n = f->size;
	}
	*npre = from = jl->n;
	for (uint32_t r = 0; r < ss->pl->ep_size; r++) {
		struct ms_st_file *f = ss->ck[r] ? ss->ck[r]->files[0] : NULL;
		struct job *j;

		if (!f)
			continue;
		if ((what & V_SHARDS) && f->map) {
			if (!(j = shard_jobs_add(jl, JOB_HASH)))
				return ms_err_nomem(err);
			j->data = f->map;
			j->n = 8 + f->header_len;
			j->digest = f->header_digest;
		}
		for (size_t i = 0; i < f->ntensors; i++) {
			struct ms_tensor *t = &f->tensors[i];
			const struct stensor *x = sset_find(ss, t->name);

			if (!(what & V_SHARDS) && (!x || shard_is_sliced(x->kind)))
				continue;
			if (!(j = shard_jobs_add(jl, JOB_HASH)))
				return ms_err_nomem(err);
			j->data = t->data;
			j->n = t->nbytes;
			j->digest = t->digest;
		}
	}
	if ((rc = shard_rec_jobs(&ss->s, jl, err)) != MS_OK)
		return rc;
	shard_jobs_sort(jl, from);
	return MS_OK;
}

/* After the jobs of shard_sset_jobs ran: what they hashed has its digest. */
void shard_sset_jobs_done(struct sset *ss, unsigned what)
{
	for (uint32_t r = 0; r < ss->pl->ep_size; r++) {
		struct ms_st_file *f = ss->ck[r] ? ss->ck[r]->files[0] : NULL;

		if (!f)
			continue;
		if ((what & V_SHARDS) && f->map)
			f->has_header_digest = 1;
		for (size_t i = 0; i < f->ntensors; i++) {
			const struct stensor *x = sset_find(ss, f->tensors[i].name);

			f->tensors[i].has_digest = (what & V_SHARDS) || (x && !shard_is_sliced(x->kind));
		}
	}
	shard_rec_finish(&ss->s);
}

/* Hash the opened shards and check them (see shard_sset_check). */
int shard_sset_hash_verify(struct sset *ss, int nthreads, unsigned what, struct ms_err *err)
{
	struct jobs jl = { 0 };
	struct pool p = { 0 };
	size_t npre;
	int rc;

	if ((rc = shard_sset_jobs(ss, what, &jl, &npre, err)) == MS_OK) {
		p.jobs = jl.v;
		p.njobs = jl.n;
		rc = shard_pool_run(&p, nthreads, err);
	}
	shard_jobs_release(&jl);
	if (rc != MS_OK)
		return rc;
	shard_sset_jobs_done(ss, what);
	return shard_sset_check(ss, what, err);
}

/* The manifest of the set at path (its directory, or the manifest
 * itself), read and parsed into ss->m. */
static int sset_read_manifest(struct sset *ss, const char *path, struct ms_err *err)
{
	struct stat st;
	char *text = NULL;
	size_t len;
	int rc, nomem;

	if (stat(path, &st))
		return ms_err_set(err, errno == ENOENT ? MS_ENOTFOUND : MS_EIO, "'%s': %s", path,
				  strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		ss->dir = ms_strdup(path);
		ss->mpath = ms_path_join(path, MS_EP_MANIFEST);
	} else {
		const char *slash = strrchr(path, '/');

		ss->dir = slash ? ms_strndup(path, (size_t)(slash - path) + (slash == path))
				: ms_strdup(".");
		ss->mpath = ms_strdup(path);
	}
	if (!ss->dir || !ss->mpath)
		return ms_err_nomem(err);
	ss->s.label = ss->mpath;
	ss->s.rank_code = MS_ECHECK;
	rc = ms_file_read(ss->mpath, MS_EP_MAX_MANIFEST, &text, &len, err);
	if (rc == MS_ENOTFOUND)
		return ms_err_set(err, MS_EINVAL, "'%s': no %s: not an EP shard set (or an unfinished "
				  "one)", ss->dir, MS_EP_MANIFEST);
	if (rc != MS_OK)
		return rc;
	ss->m = ms_json_parse(text, len, &nomem);
	ms_free(text);
	if (nomem)
		return ms_err_nomem(err);
	if (!ss->m || !cJSON_IsObject(ss->m))
		return bad(ss, err, "not a JSON object");
	return MS_OK;
}

/* The manifest's header: format, version, kind and stem (into ss->stem),
 * the expert count *e and EP size *n, which must be the caller's
 * expect_n (0: any) and hold rank only (-1: all). */
static int sset_header(struct sset *ss, int64_t only, uint32_t expect_n, const char **kind,
		       uint64_t *e, uint64_t *n, struct ms_err *err)
{
	const char *stem;
	uint64_t v;

	if (!jstr(ss->m, "format") || strcmp(jstr(ss->m, "format"), MS_EP_MANIFEST_FORMAT))
		return bad(ss, err, "not an EP manifest (\"format\" is not \"" MS_EP_MANIFEST_FORMAT "\")");
	if (shard_json_u64(cJSON_GetObjectItemCaseSensitive(ss->m, "version"), UINT32_MAX, &v) ||
	    v != MS_EP_MANIFEST_VERSION)
		return bad(ss, err, "unsupported manifest version");
	*kind = jstr(ss->m, "kind");
	stem = jstr(ss->m, "stem");
	if (!*kind || (strcmp(*kind, "adapter") && strcmp(*kind, "checkpoint")) || !stem ||
	    strcmp(stem, !strcmp(*kind, "adapter") ? "adapter_model" : "model"))
		return bad(ss, err, "\"kind\" must be adapter (stem adapter_model) or checkpoint "
			   "(stem model)");
	snprintf(ss->stem, sizeof(ss->stem), "%s", stem);
	if (shard_json_u64(cJSON_GetObjectItemCaseSensitive(ss->m, "num_experts"), MS_EP_MAX_EXPERTS, e) ||
	    *e == 0 ||
	    shard_json_u64(cJSON_GetObjectItemCaseSensitive(ss->m, "ep_size"), MS_EP_MAX_RANKS, n) || *n == 0)
		return bad(ss, err, "\"num_experts\" and \"ep_size\" must be positive integers");
	if (expect_n && *n != expect_n)
		return ms_err_set(err, MS_EINVAL, "'%s': the shards were made for EP size %llu, but this "
				  "run has EP size %u: run 'msshard reshard %s -o DIR --ep-size %u' "
				  "and load that", ss->dir, (unsigned long long)*n, expect_n, ss->dir,
				  expect_n);
	if (only >= (int64_t)*n)
		return ms_err_set(err, MS_EINVAL, "rank %lld is not in 0..%llu", (long long)only,
				  (unsigned long long)(*n - 1));
	return MS_OK;
}

/* The manifest's placement table (into ss->pl), which must be the
 * built-in placement its name says, or a map. */
static int sset_placement(struct sset *ss, uint64_t e, uint64_t n, struct ms_err *err)
{
	const cJSON *pj = cJSON_GetObjectItemCaseSensitive(ss->m, "placement");
	const char *pname = jstr(pj, "name");
	int rc;

	if (!cJSON_IsObject(pj) || !pname)
		return bad(ss, err, "\"placement\" needs a \"name\" and \"ranks\"");
	if ((rc = shard_placement_from_ranks(cJSON_GetObjectItemCaseSensitive(pj, "ranks"), ss->mpath,
				             (uint32_t)e, (uint32_t)n, &ss->pl, err)) != MS_OK)
		return rc;
	if (!strcmp(pname, "contiguous") || !strcmp(pname, "round-robin")) {
		struct ms_ep_placement *b;
		int eq;

		if ((rc = shard_placement_builtin(!strcmp(pname, "contiguous") ? MS_EP_PLACEMENT_CONTIGUOUS
									       : MS_EP_PLACEMENT_ROUND_ROBIN,
					          (uint32_t)e, (uint32_t)n, &b, err)) != MS_OK)
			return ms_err_prefix(err, "'%s'", ss->mpath);
		eq = shard_placement_equal(b, ss->pl);
		ms_ep_placement_free(b);
		if (!eq)
			return ms_err_set(err, MS_EINVAL, "'%s': the placement table is not the '%s' "
					  "placement its name says", ss->mpath, pname);
		ss->pl->kind = !strcmp(pname, "contiguous") ? MS_EP_PLACEMENT_CONTIGUOUS
							     : MS_EP_PLACEMENT_ROUND_ROBIN;
	} else if (strcmp(pname, "map")) {
		return bad(ss, err, "placement name must be contiguous, round-robin or map");
	}
	return MS_OK;
}

/* The manifest's "shards": one entry per rank, in rank order, naming the
 * rank's file, its experts (the placement's) and its state digest (into
 * ss->sdig); the per-rank and per-tensor tables are allocated here. */
static int sset_shard_list(struct sset *ss, uint64_t n, struct ms_err *err)
{
	const cJSON *shards = cJSON_GetObjectItemCaseSensitive(ss->m, "shards"), *x;
	uint32_t r = 0;

	if (!cJSON_IsArray(shards) || (uint64_t)cJSON_GetArraySize(shards) != n)
		return ms_err_set(err, MS_EINVAL, "'%s': \"shards\" must list %llu shards", ss->mpath,
				  (unsigned long long)n);
	ss->ck = ms_calloc(n, sizeof(*ss->ck));
	ss->names = ms_calloc(n, sizeof(*ss->names));
	ss->sdig = ms_calloc(n, sizeof(*ss->sdig));
	ss->rbad = ms_calloc(n, sizeof(*ss->rbad));
	ss->tbad = ms_calloc(ss->s.n ? ss->s.n : 1, 1);
	ss->missing = ms_calloc(ss->s.n ? ss->s.n : 1, 1);
	if (!ss->ck || !ss->names || !ss->sdig || !ss->rbad || !ss->tbad || !ss->missing)
		return ms_err_nomem(err);
	cJSON_ArrayForEach(x, shards) {
		uint64_t got;
		const char *file = jstr(x, "file"), *d = jstr(x, "state_digest");

		if (!(ss->names[r] = shard_name(ss->stem, r, (uint32_t)n)))
			return ms_err_nomem(err);
		if (shard_json_u64(cJSON_GetObjectItemCaseSensitive(x, "rank"), UINT32_MAX, &got) || got != r ||
		    !file || strcmp(file, ss->names[r]) || !valid_state_digest(d) ||
		    !ids_equal(cJSON_GetObjectItemCaseSensitive(x, "experts"),
			       ss->pl->ids + ss->pl->first[r],
			       ss->pl->first[r + 1] - ss->pl->first[r]))
			return ms_err_set(err, MS_EINVAL, "'%s': shard %u must be rank %u in file '%s' with "
					  "the placement's experts and a state digest", ss->mpath, r,
					  r, ss->names[r]);
		memcpy(ss->sdig[r], d, MS_STATE_DIGEST_LEN);
		r++;
	}
	return MS_OK;
}

/* Open the shard of each rank (only: that one; -1: all) and check it
 * against the manifest; no shard of another set may lie among them. */
static int sset_open_shards(struct sset *ss, int64_t only, uint64_t n, struct ms_err *err)
{
	char *foreign = NULL;
	uint32_t foreign_n = 0;
	struct stat st;
	int rc;

	if ((rc = shard_foreign_shard(ss->dir, ss->stem, (uint32_t)n, &foreign, &foreign_n, err)) != MS_OK)
		return rc;
	if (foreign) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': a shard of another set (EP size %u) among the "
				"shards of EP size %llu: remove it, or reshard", foreign, foreign_n,
				(unsigned long long)n);
		ms_free(foreign);
		return rc;
	}
	for (uint32_t r = 0; r < n; r++) {
		char *p;

		if (only >= 0 && r != (uint64_t)only)
			continue;
		if (!(p = ms_path_join(ss->dir, ss->names[r])))
			return ms_err_nomem(err);
		if (stat(p, &st) && errno == ENOENT) {
			rc = ms_err_set(err, MS_EINVAL, "'%s': the shard of rank %u is missing", p, r);
			ms_free(p);
			return rc;
		}
		rc = ms_ckpt_open(p, &ss->ck[r], err);
		ms_free(p);
		if (rc != MS_OK)
			return rc;
		if ((rc = sset_check_shard(ss, r, err)) != MS_OK)
			return rc;
	}
	return MS_OK;
}

/*
 * Open the set at path (directory or manifest). only: the one rank to
 * open, or -1 for all; expect_n: the EP size the caller needs (0: any);
 * hash: hash the shards and verify them, with the extra checks in what.
 */
int shard_sset_open(const char *path, int64_t only, uint32_t expect_n, int hash,
		    unsigned what, int nthreads, const struct ms_shard_opts *o, struct sset *ss,
		    struct ms_err *err)
{
	const char *kind = NULL;
	uint64_t e = 0, n = 0;
	int rc;

	memset(ss, 0, sizeof(*ss));
	if ((rc = sset_read_manifest(ss, path, err)) != MS_OK ||
	    (rc = sset_header(ss, only, expect_n, &kind, &e, &n, err)) != MS_OK ||
	    (rc = sset_placement(ss, e, n, err)) != MS_OK ||
	    (rc = sset_read_source(ss, err)) != MS_OK)
		return rc;
	if ((!strcmp(kind, "adapter")) != ss->s.is_adapter)
		return bad(ss, err, "\"kind\" does not match the config files (adapter_config.json)");
	if ((rc = shard_analyze(&ss->s, (uint32_t)e, "the manifest", err)) != MS_OK ||
	    (rc = sset_check_classes(ss, err)) != MS_OK)
		return rc;
	/* a set split with a wrong r is self-consistent: only the base's
	 * expert count shows it (a fault; the rest is still checked) */
	if (shard_check_base(&ss->s, o, MS_ECHECK, err) != MS_OK &&
	    (rc = fault_add(ss, fault_of(MS_EP_FAULT_EXPERTS, ss->s.e_from ? ss->s.e_from->name : NULL,
					 ss->mpath, -1, -1, -1, -1), -1, err, "%s", err->msg)) != MS_OK)
		return rc;
	if ((rc = sset_shard_list(ss, n, err)) != MS_OK ||
	    (rc = sset_open_shards(ss, only, n, err)) != MS_OK ||
	    (rc = sset_resolve_strays(ss, only, err)) != MS_OK ||
	    (rc = sset_point(ss, err)) != MS_OK)
		return rc;
	return hash ? shard_sset_hash_verify(ss, nthreads, what, err) : sset_verdict(ss, err);
}

static int sset_result(const struct sset *ss, struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_shard_result *res;
	int rc = shard_result_new(&ss->s, ss->pl, ss->pl->ep_size, &res, err);

	if (rc != MS_OK)
		return rc;
	for (uint32_t r = 0; r < ss->pl->ep_size; r++) {
		struct ms_shard_out_file *f = &res->files[r];
		uint32_t l = ss->pl->first[r + 1] - ss->pl->first[r];

		f->rank = r;
		f->path = ms_path_join(ss->dir, ss->names[r]);
		f->experts = ms_malloc((l ? l : 1) * sizeof(uint32_t));
		if (!f->path || !f->experts) {
			ms_shard_result_free(res);
			return ms_err_nomem(err);
		}
		memcpy(f->experts, ss->pl->ids + ss->pl->first[r], l * sizeof(uint32_t));
		f->nexperts = l;
		memcpy(f->state_digest, ss->sdig[r], MS_STATE_DIGEST_LEN);
		if (ss->ck[r]) {
			f->ntensors = ss->ck[r]->ntensors;
			for (size_t i = 0; i < ss->ck[r]->ntensors; i++)
				f->nbytes += ss->ck[r]->tensors[i]->nbytes;
		}
	}
	res->manifest_path = ms_strdup(ss->mpath);
	if (!res->manifest_path) {
		ms_shard_result_free(res);
		return ms_err_nomem(err);
	}
	*out = res;
	return MS_OK;
}

int ms_shard_check(const char *dir, const struct ms_shard_opts *o,
		   struct ms_shard_result **out, struct ms_err *err)
{
	struct sset ss;
	int rc;

	if (out)
		*out = NULL;
	rc = shard_sset_open(dir, -1, 0, 1, V_SHARDS | V_REASSEMBLE, o ? o->nthreads : 0, o, &ss, err);
	if ((rc == MS_OK || (rc == MS_ECHECK && ss.nfaults)) && out) {
		struct ms_err e2 = { 0 };
		int r2 = sset_result(&ss, out, rc == MS_OK ? err : &e2);

		if (r2 != MS_OK) {
			if (rc != MS_OK)
				*err = e2;
			rc = r2;
		} else if (rc == MS_ECHECK) {
			/* the faults go with the result */
			(*out)->faults = ss.faults;
			(*out)->nfaults = ss.nfaults;
			(*out)->nfaults_more = ss.nfaults_more;
			ss.faults = NULL;
			ss.nfaults = 0;
		}
	}
	shard_sset_release(&ss);
	return rc;
}
/* ---- the EP-aware load ---------------------------------------------------- */

void ms_ep_rank_free(struct ms_ep_rank *r)
{
	if (!r)
		return;
	ms_free(r->experts);
	ms_free(r->shard_path);
	ms_ckpt_close(r->ckpt);
	ms_free(r);
}

int ms_ep_load_rank(const char *manifest_or_dir, uint32_t ep_size, uint32_t rank,
		    struct ms_ep_rank **out, struct ms_err *err)
{
	struct ms_ep_rank *r = NULL;
	struct sset ss;
	uint32_t l;
	int rc;

	*out = NULL;
	if (ep_size == 0)
		return ms_err_set(err, MS_EINVAL, "ep size must be at least 1");
	if (rank >= ep_size)
		return ms_err_set(err, MS_EINVAL, "rank %u is not in 0..%u", rank, ep_size - 1);
	rc = shard_sset_open(manifest_or_dir, rank, ep_size, 1, V_SHARDS, 0, NULL, &ss, err);
	if (rc != MS_OK)
		goto out;
	r = ms_calloc(1, sizeof(*r));
	l = ss.pl->first[rank + 1] - ss.pl->first[rank];
	if (!r || !(r->experts = ms_malloc((l ? l : 1) * sizeof(uint32_t))) ||
	    !(r->shard_path = ms_path_join(ss.dir, ss.names[rank]))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	r->rank = rank;
	r->ep_size = ep_size;
	r->num_experts = ss.s.E;
	r->placement = ss.pl->kind;
	r->nexperts = l;
	memcpy(r->experts, ss.pl->ids + ss.pl->first[rank], l * sizeof(uint32_t));
	memcpy(r->state_digest, ss.sdig[rank], MS_STATE_DIGEST_LEN);
	memcpy(r->source_digest, ss.s.digest, MS_STATE_DIGEST_LEN);
	r->is_adapter = ss.s.is_adapter;
	r->ckpt = ss.ck[rank];
	ss.ck[rank] = NULL;
	*out = r;
	r = NULL;
out:
	ms_ep_rank_free(r);
	shard_sset_release(&ss);
	return rc;
}
