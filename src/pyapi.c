/*
 * pyapi.c: the flat entry points of pyapi.h, for the Python package (and
 * any other foreign-function binding) over libms.so.
 *
 * Everything here is composition: the records come from the inventory
 * (ms_vstate_from_inv), a manifest (ms_manifest_parse), a caller's digest
 * map or an EP shard check (ms_ep_load_rank); the files are opened with
 * the strict reader; the loading is ms_load_verified / ms_load_verified_gpu.
 * What this file adds is the matching of a record against the opened
 * files (so that a tensor moved, re-typed, missing or added is refused
 * before any byte is read), one allocation per load for zero-copy hand
 * over (arenas), and the DLPack structure with its deleter.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fsutil.h"
#include "gpu.h"
#include "hash.h"
#include "pyapi.h"
#include "shard.h"
#include "verify.h"
#include "vload.h"

int ms_py_abi(void)
{
	return MS_PY_ABI;
}

const char *ms_py_version(void)
{
	return MS_VERSION;
}

size_t ms_py_err_size(void)
{
	return sizeof(struct ms_err);
}

/* ---- load sets ------------------------------------------------------------- */

struct ms_py_item {
	const struct ms_tensor *t;  /* in one of the set's files */
	uint8_t expected[MS_SHA256_LEN];
};

struct ms_py_set {
	size_t nfiles;
	struct ms_st_file **files;  /* owned unless ep is set */
	size_t n;
	struct ms_py_item *items;   /* sorted by name */
	char state[MS_STATE_DIGEST_LEN];
	struct ms_ep_rank *ep;      /* owns the files of an EP set */
};

void ms_py_set_free(struct ms_py_set *s)
{
	if (!s)
		return;
	if (!s->ep)
		for (size_t i = 0; i < s->nfiles; i++)
			ms_st_close(s->files[i]);
	if (!s->ep)
		ms_free(s->files);
	ms_ep_rank_free(s->ep);
	ms_free(s->items);
	ms_free(s);
}

static int cmp_item(const void *a, const void *b)
{
	return strcmp(((const struct ms_py_item *)a)->t->name,
		      ((const struct ms_py_item *)b)->t->name);
}

/* The state digest the expected digests make, into s->state (duplicate
 * names are refused there). */
static int set_digest(struct ms_py_set *s, struct ms_err *err)
{
	struct ms_tensor *copies = ms_calloc(s->n ? s->n : 1, sizeof(*copies));
	struct ms_tensor **ptrs = ms_calloc(s->n ? s->n : 1, sizeof(*ptrs));
	int rc;

	if (!copies || !ptrs) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < s->n; i++) {
		copies[i] = *s->items[i].t;
		memcpy(copies[i].digest, s->items[i].expected, MS_SHA256_LEN);
		copies[i].has_digest = 1;
		ptrs[i] = &copies[i];
	}
	rc = ms_state_digest(ptrs, s->n, s->state, err);
out:
	ms_free(copies);
	ms_free(ptrs);
	return rc;
}

static int same_layout(const struct ms_tensor *t, const struct ms_vtensor *vt)
{
	return t->dtype == vt->dtype && t->ndim == vt->ndim && t->offset == vt->offset &&
	       t->nbytes == vt->nbytes &&
	       !memcmp(t->shape, vt->shape, sizeof(uint64_t) * vt->ndim);
}

/* Open every file of v and match its tensors against the record. */
static int set_from_vstate(const struct ms_vstate *v, struct ms_py_set **out,
			   struct ms_err *err)
{
	struct ms_py_set *s = ms_calloc(1, sizeof(*s));
	size_t total = 0;
	char *path = NULL;
	int rc = MS_OK;

	*out = NULL;
	if (!s)
		return ms_err_nomem(err);
	for (size_t i = 0; i < v->nfiles; i++)
		total += v->files[i].ntensors;
	s->files = ms_calloc(v->nfiles ? v->nfiles : 1, sizeof(*s->files));
	s->items = ms_calloc(total ? total : 1, sizeof(*s->items));
	if (!s->files || !s->items)
		goto oom;
	for (size_t i = 0; i < v->nfiles; i++) {
		const struct ms_vfile *vf = &v->files[i];
		struct ms_st_file *f;

		path = vf->path[0] == '/' || !v->root ? ms_strdup(vf->path)
						       : ms_path_join(v->root, vf->path);
		if (!path)
			goto oom;
		if ((rc = ms_st_open(path, &s->files[s->nfiles], err)) != MS_OK)
			goto out;
		f = s->files[s->nfiles++];
		for (size_t k = 0; k < vf->ntensors; k++) {
			const struct ms_vtensor *vt = &vf->tensors[k];
			const struct ms_tensor *t = ms_st_find(f, vt->name);

			if (!t) {
				rc = ms_err_set(err, MS_ECHECK, "tensor '%s' in '%s': missing",
						vt->name, path);
				goto out;
			}
			if (!same_layout(t, vt)) {
				rc = ms_err_set(err, MS_ECHECK,
						"tensor '%s' in '%s': dtype, shape or offset differ from the record",
						vt->name, path);
				goto out;
			}
			s->items[s->n].t = t;
			memcpy(s->items[s->n].expected, vt->digest, MS_SHA256_LEN);
			s->n++;
		}
		/* every recorded tensor was found once, so a count above the
		 * record's is a tensor the record does not list */
		if (f->ntensors != vf->ntensors) {
			const char *extra = "?";

			for (size_t k = 0; k < f->ntensors; k++) {
				size_t j = 0;

				while (j < vf->ntensors && strcmp(vf->tensors[j].name, f->tensors[k].name))
					j++;
				if (j == vf->ntensors) {
					extra = f->tensors[k].name;
					break;
				}
			}
			rc = ms_err_set(err, MS_ECHECK, "tensor '%s' in '%s': not in the record",
					extra, path);
			goto out;
		}
		ms_free(path);
		path = NULL;
	}
	qsort(s->items, s->n, sizeof(*s->items), cmp_item);
	if ((rc = set_digest(s, err)) != MS_OK)
		goto out;
	if (v->digest[0] && strcmp(v->digest, s->state)) {
		rc = ms_err_set(err, MS_ECHECK,
				"recorded tensors give %.23s..., the record says %.23s...",
				s->state, v->digest);
		goto out;
	}
	*out = s;
	s = NULL;
	goto out;
oom:
	rc = ms_err_nomem(err);
out:
	ms_free(path);
	ms_py_set_free(s);
	return rc;
}

int ms_py_set_from_inv(struct ms_inv *inv, const char *ref,
		       struct ms_py_set **out, struct ms_err *err)
{
	char digest[MS_STATE_DIGEST_LEN];
	struct ms_vstate *v = NULL;
	int rc;

	*out = NULL;
	if ((rc = ms_inv_resolve(inv, ref, digest, err)) != MS_OK)
		return rc;
	if ((rc = ms_vstate_from_inv(inv, digest, 0, &v, err)) != MS_OK)
		return rc;
	rc = set_from_vstate(v, out, err);
	ms_vstate_free(v);
	return rc;
}

int ms_py_set_from_inv_file(struct ms_inv *inv, const char *path,
			    struct ms_py_set **out, struct ms_err *err)
{
	struct ms_inv_state *st = NULL;
	struct ms_vstate *v = NULL, one;
	char digest[MS_STATE_DIGEST_LEN];
	char *real = ms_malloc(PATH_MAX);
	size_t n = 0, which = 0;
	int rc, found = 0;

	*out = NULL;
	if (!real)
		return ms_err_nomem(err);
	/* files are recorded by real path */
	if (!realpath(path, real)) {
		rc = ms_err_set(err, errno == ENOENT ? MS_ENOTFOUND : MS_EIO, "'%s': %s", path,
				strerror(errno));
		goto out;
	}
	if ((rc = ms_inv_states_list(inv, MS_INV_KIND_ANY, &st, &n, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < n && !found; i++) {
		struct ms_inv_files f = {0};

		if ((rc = ms_inv_state_files(inv, st[i].digest, 0, 0, &f, err)) != MS_OK)
			goto out;
		for (size_t k = 0; k < f.n && !found; k++) {
			if (strcmp(f.files[k].path, real))
				continue;
			/* the copy holding this path, and the file's place in it */
			rc = ms_vstate_from_inv(inv, st[i].digest, f.files[k].copy, &v, err);
			found = 1;
		}
		ms_inv_files_release(&f);
		if (rc != MS_OK)
			goto out;
	}
	if (!found) {
		rc = ms_err_set(err, MS_ENOTFOUND, "'%s': not a file of any recorded state", path);
		goto out;
	}
	/* the record as a whole must give its state digest, or its digests
	 * of this file are not the state's */
	if ((rc = ms_vstate_digest(v, digest, err)) != MS_OK)
		goto out;
	if (strcmp(digest, v->digest)) {
		rc = ms_err_set(err, MS_ECHECK,
				"recorded tensors give %.23s..., the record says %.23s...", digest,
				v->digest);
		goto out;
	}
	while (which < v->nfiles && strcmp(v->files[which].path, real))
		which++;
	if (which == v->nfiles) {
		rc = ms_err_set(err, MS_EDB, "'%s': recorded, but not in its copy", path);
		goto out;
	}
	one = *v;
	one.digest[0] = '\0';
	one.nfiles = 1;
	one.files = &v->files[which];
	if ((rc = set_from_vstate(&one, out, err)) != MS_OK)
		goto out;
	memcpy((*out)->state, v->digest, MS_STATE_DIGEST_LEN);
out:
	ms_vstate_free(v);
	ms_inv_states_free(st, n);
	ms_free(real);
	return rc;
}

int ms_py_set_from_manifest(const char *path, struct ms_py_set **out,
			    struct ms_err *err)
{
	struct ms_vstate *v = NULL;
	char *text = NULL, *root = NULL, *slash;
	size_t len;
	int rc;

	*out = NULL;
	if ((rc = ms_file_read(path, MS_CKPT_MAX_INDEX, &text, &len, err)) != MS_OK)
		return rc;
	if (!(root = ms_strdup(path))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	slash = strrchr(root, '/');
	if (slash)
		slash == root ? (void)(slash[1] = '\0') : (void)(*slash = '\0');
	else
		strcpy(root, ".");
	if ((rc = ms_manifest_parse(text, len, path, root, &v, err)) != MS_OK)
		goto out;
	rc = set_from_vstate(v, out, err);
out:
	ms_vstate_free(v);
	ms_free(root);
	ms_free(text);
	return rc;
}

int ms_py_set_from_file(const char *path, size_t n, const char *const *names,
			const uint8_t *digests, struct ms_py_set **out,
			struct ms_err *err)
{
	struct ms_py_set *s = ms_calloc(1, sizeof(*s));
	struct ms_st_file *f;
	int rc;

	*out = NULL;
	if (!s)
		return ms_err_nomem(err);
	s->files = ms_calloc(1, sizeof(*s->files));
	if (!s->files) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = ms_st_open(path, &s->files[0], err)) != MS_OK)
		goto out;
	f = s->files[0];
	s->nfiles = 1;
	s->items = ms_calloc(f->ntensors ? f->ntensors : 1, sizeof(*s->items));
	if (!s->items) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if (!ms_st_find(f, names[i])) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': not in the file",
					names[i], path);
			goto out;
		}
	}
	/* f->by_name is sorted, so the set is too */
	for (size_t k = 0; k < f->ntensors; k++) {
		const struct ms_tensor *t = f->by_name[k];
		size_t i = 0;

		while (i < n && strcmp(names[i], t->name))
			i++;
		if (i == n) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': no expected digest",
					t->name, path);
			goto out;
		}
		s->items[s->n].t = t;
		memcpy(s->items[s->n].expected, digests + 32 * i, MS_SHA256_LEN);
		s->n++;
	}
	if ((rc = set_digest(s, err)) != MS_OK)
		goto out;
	*out = s;
	s = NULL;
out:
	ms_py_set_free(s);
	return rc;
}

int ms_py_set_from_ep(const char *manifest_or_dir, uint32_t ep_size,
		      uint32_t rank, struct ms_py_set **out, struct ms_err *err)
{
	struct ms_py_set *s = ms_calloc(1, sizeof(*s));
	struct ms_ckpt *c;
	int rc;

	*out = NULL;
	if (!s)
		return ms_err_nomem(err);
	if ((rc = ms_ep_load_rank(manifest_or_dir, ep_size, rank, &s->ep, err)) != MS_OK)
		goto out;
	c = s->ep->ckpt;
	s->nfiles = c->nfiles;
	s->files = c->files;
	s->items = ms_calloc(c->ntensors ? c->ntensors : 1, sizeof(*s->items));
	if (!s->items) {
		rc = ms_err_nomem(err);
		goto out;
	}
	/* c->tensors is sorted by name and hashed by the check */
	for (size_t i = 0; i < c->ntensors; i++) {
		s->items[i].t = c->tensors[i];
		memcpy(s->items[i].expected, c->tensors[i]->digest, MS_SHA256_LEN);
	}
	s->n = c->ntensors;
	memcpy(s->state, s->ep->state_digest, MS_STATE_DIGEST_LEN);
	*out = s;
	s = NULL;
out:
	ms_py_set_free(s);
	return rc;
}

int ms_py_set_from_unsharded(const char *src, const char *tmpdir,
			     uint32_t ep_size, uint32_t rank,
			     const char *placement, struct ms_py_set **out,
			     struct ms_err *err)
{
	struct ms_shard_opts o;
	struct ms_shard_result *res = NULL;
	int rc;

	*out = NULL;
	memset(&o, 0, sizeof(o));
	o.ep_size = ep_size;
	o.placement = placement;
	if ((rc = ms_shard_split(src, tmpdir, &o, &res, err)) != MS_OK)
		return rc;
	ms_shard_result_free(res);
	return ms_py_set_from_ep(tmpdir, ep_size, rank, out, err);
}

size_t ms_py_set_count(const struct ms_py_set *s)
{
	return s->n;
}

int ms_py_set_tensor(const struct ms_py_set *s, size_t i, const char **name,
		     int32_t *dtype, uint32_t *ndim, uint64_t *shape,
		     uint64_t *nbytes, uint8_t *expected)
{
	const struct ms_tensor *t;

	if (i >= s->n)
		return MS_EINVAL;
	t = s->items[i].t;
	if (name)
		*name = t->name;
	if (dtype)
		*dtype = (int32_t)t->dtype;
	if (ndim)
		*ndim = t->ndim;
	if (shape)
		memcpy(shape, t->shape, sizeof(t->shape));
	if (nbytes)
		*nbytes = t->nbytes;
	if (expected)
		memcpy(expected, s->items[i].expected, MS_SHA256_LEN);
	return MS_OK;
}

const char *ms_py_set_state(const struct ms_py_set *s)
{
	return s->state;
}

size_t ms_py_set_nfiles(const struct ms_py_set *s)
{
	return s->nfiles;
}

const char *ms_py_set_file(const struct ms_py_set *s, size_t i)
{
	return i < s->nfiles ? s->files[i]->path : NULL;
}

int ms_py_set_ep(const struct ms_py_set *s, uint32_t *rank, uint32_t *ep_size,
		 uint32_t *num_experts, uint32_t *nexperts,
		 const uint32_t **experts, const char **source_digest)
{
	if (!s->ep)
		return MS_EINVAL;
	*rank = s->ep->rank;
	*ep_size = s->ep->ep_size;
	*num_experts = s->ep->num_experts;
	*nexperts = s->ep->nexperts;
	*experts = s->ep->experts;
	*source_digest = s->ep->source_digest;
	return MS_OK;
}

static struct ms_vload_item *items_new(const struct ms_py_set *s)
{
	struct ms_vload_item *it = ms_calloc(s->n ? s->n : 1, sizeof(*it));

	if (!it)
		return NULL;
	for (size_t i = 0; i < s->n; i++) {
		it[i].tensor = s->items[i].t;
		memcpy(it[i].expected, s->items[i].expected, MS_SHA256_LEN);
	}
	return it;
}

int ms_py_set_load(const struct ms_py_set *s, void *const *dsts, int nthreads,
		   struct ms_err *err)
{
	struct ms_vload_item *it = items_new(s);
	int rc;

	if (!it)
		return ms_err_nomem(err);
	for (size_t i = 0; i < s->n; i++)
		it[i].dst = dsts[i];
	rc = ms_load_verified(it, s->n, nthreads, err);
	ms_free(it);
	return rc;
}

/* ---- arenas -------------------------------------------------------------------- */

struct ms_py_arena {
	void *base;
	int device;
	uint64_t refs;   /* atomic: tensors are freed on any thread */
};

static uint64_t arenas_live;

void *ms_py_arena_base(const struct ms_py_arena *a)
{
	return a->base;
}

void ms_py_arena_retain(struct ms_py_arena *a)
{
	__atomic_add_fetch(&a->refs, 1, __ATOMIC_RELAXED);
}

void ms_py_arena_release(struct ms_py_arena *a)
{
	if (!a || __atomic_sub_fetch(&a->refs, 1, __ATOMIC_ACQ_REL) != 0)
		return;
	if (a->device == MS_PY_CUDA)
		ms_gpu_free(a->base);
	else
		ms_free(a->base);
	ms_free(a);
	__atomic_sub_fetch(&arenas_live, 1, __ATOMIC_RELAXED);
}

uint64_t ms_py_arenas_live(void)
{
	return __atomic_load_n(&arenas_live, __ATOMIC_RELAXED);
}

/* The device loader's alignment, so host and device arenas look alike. */
#define ARENA_ALIGN 256u

int ms_py_set_load_arena(const struct ms_py_set *s, int device, int nthreads,
			 uint64_t *offsets, struct ms_py_arena **out,
			 struct ms_err *err)
{
	struct ms_vload_item *it = NULL;
	struct ms_py_arena *a = NULL;
	uint64_t total = 0;
	int rc;

	*out = NULL;
	if (device != MS_PY_HOST && device != MS_PY_CUDA)
		return ms_err_set(err, MS_EINVAL, "unknown device %d", device);
	if (!(it = items_new(s)) || !(a = ms_calloc(1, sizeof(*a)))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	a->device = device;
	a->refs = 1;
	if (device == MS_PY_CUDA) {
		if ((rc = ms_load_verified_gpu(it, s->n, nthreads, &a->base, err)) != MS_OK)
			goto out;
		for (size_t i = 0; i < s->n; i++)
			offsets[i] = (uint64_t)((uint8_t *)it[i].dst - (uint8_t *)a->base);
	} else {
		for (size_t i = 0; i < s->n; i++) {
			offsets[i] = total;
			if (ms_add_u64(total, (s->items[i].t->nbytes + ARENA_ALIGN - 1) /
					      ARENA_ALIGN * ARENA_ALIGN, &total)) {
				rc = ms_err_set(err, MS_EINVAL, "tensors too large for one arena");
				goto out;
			}
		}
		if (total > SIZE_MAX || !(a->base = ms_malloc((size_t)total))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		for (size_t i = 0; i < s->n; i++)
			it[i].dst = (uint8_t *)a->base + offsets[i];
		if ((rc = ms_load_verified(it, s->n, nthreads, err)) != MS_OK)
			goto out;
	}
	__atomic_add_fetch(&arenas_live, 1, __ATOMIC_RELAXED);
	*out = a;
	a = NULL;
out:
	if (a) {
		/* a failed device load has freed its memory already */
		if (device == MS_PY_HOST)
			ms_free(a->base);
		ms_free(a);
	}
	ms_free(it);
	return rc;
}

/* ---- DLPack ----------------------------------------------------------------------- */

/* dlpack.h's structures (ABI of version 0.8), under our names. */
struct ms_dl_device {
	int32_t device_type;   /* kDLCPU 1, kDLCUDA 2 */
	int32_t device_id;
};

struct ms_dl_dtype {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
};

struct ms_dl_tensor {
	void *data;
	struct ms_dl_device device;
	int32_t ndim;
	struct ms_dl_dtype dtype;
	int64_t *shape;
	int64_t *strides;      /* NULL: compact row-major */
	uint64_t byte_offset;
};

struct ms_dl_managed {
	struct ms_dl_tensor dl_tensor;
	void *manager_ctx;     /* the arena */
	void (*deleter)(struct ms_dl_managed *self);
};

/* The managed tensor and its shape are one allocation. */
struct dl_block {
	struct ms_dl_managed m;
	int64_t shape[MS_ST_MAX_RANK + 1];
};

static void dl_deleter(struct ms_dl_managed *m)
{
	if (!m)
		return;
	ms_py_arena_release(m->manager_ctx);
	ms_free(m);
}

void *ms_py_dlpack_new(struct ms_py_arena *a, uint64_t offset, uint32_t ndim,
		       const int64_t *shape, uint8_t code, uint8_t bits,
		       int32_t device_id)
{
	struct dl_block *b;

	if (ndim > MS_ST_MAX_RANK || !(b = ms_calloc(1, sizeof(*b))))
		return NULL;
	memcpy(b->shape, shape, ndim * sizeof(int64_t));
	b->m.dl_tensor.data = (uint8_t *)a->base + offset;
	b->m.dl_tensor.device.device_type = a->device == MS_PY_CUDA ? 2 : 1;
	b->m.dl_tensor.device.device_id = a->device == MS_PY_CUDA ? device_id : 0;
	b->m.dl_tensor.ndim = (int32_t)ndim;
	b->m.dl_tensor.dtype.code = code;
	b->m.dl_tensor.dtype.bits = bits;
	b->m.dl_tensor.dtype.lanes = 1;
	b->m.dl_tensor.shape = b->shape;
	b->m.manager_ctx = a;
	b->m.deleter = dl_deleter;
	ms_py_arena_retain(a);
	return &b->m;
}

void ms_py_dlpack_delete(void *managed)
{
	struct ms_dl_managed *m = managed;

	if (m && m->deleter)
		m->deleter(m);
}

/* ---- digests of tensors held in memory ---------------------------------------- */

int ms_py_sha256_many(size_t n, const void *const *ptrs, const uint64_t *lens,
		      uint8_t *out, int nthreads, struct ms_err *err)
{
	struct ms_hash_job *jobs = ms_calloc(n ? n : 1, sizeof(*jobs));
	int rc;

	if (!jobs)
		return ms_err_nomem(err);
	for (size_t i = 0; i < n; i++) {
		jobs[i].data = ptrs[i];
		jobs[i].n = lens[i];
		jobs[i].digest = out + (size_t)MS_SHA256_LEN * i;
	}
	rc = ms_hash_run(jobs, n, nthreads, err);
	ms_free(jobs);
	return rc;
}

int ms_py_state_digest(size_t n, const char *const *names, const int32_t *dtypes,
		       const uint32_t *ndims, const uint64_t *shapes,
		       const uint8_t *digests, char out[MS_STATE_DIGEST_LEN],
		       struct ms_err *err)
{
	struct ms_tensor *t = ms_calloc(n ? n : 1, sizeof(*t));
	struct ms_tensor **p = ms_calloc(n ? n : 1, sizeof(*p));
	int rc = MS_OK;

	if (!t || !p) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if (!ms_dtype_name((enum ms_dtype)dtypes[i]) || ndims[i] > MS_ST_MAX_RANK) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s': bad dtype or rank", names[i]);
			goto out;
		}
		t[i].name = names[i];
		t[i].dtype = (enum ms_dtype)dtypes[i];
		t[i].ndim = ndims[i];
		memcpy(t[i].shape, shapes + (size_t)MS_ST_MAX_RANK * i, sizeof(t[i].shape));
		memcpy(t[i].digest, digests + (size_t)32 * i, 32);
		t[i].has_digest = 1;
		p[i] = &t[i];
	}
	rc = ms_state_digest(p, n, out, err);
out:
	ms_free(t);
	ms_free(p);
	return rc;
}

/* ---- the inventory as JSON ------------------------------------------------------ */

static cJSON *state_json(const struct ms_inv_state *st)
{
	cJSON *o = cJSON_CreateObject();

	if (!o)
		return NULL;
	cJSON_AddStringToObject(o, "digest", st->digest);
	cJSON_AddStringToObject(o, "kind", ms_inv_kind_name(st->kind));
	cJSON_AddStringToObject(o, "layout", st->layout ? st->layout : "");
	if (st->label)
		cJSON_AddStringToObject(o, "label", st->label);
	else
		cJSON_AddNullToObject(o, "label");
	cJSON_AddNumberToObject(o, "tensors", (double)st->ntensors);
	cJSON_AddNumberToObject(o, "bytes", (double)st->nbytes);
	cJSON_AddNumberToObject(o, "ep_size", st->ep_size);
	cJSON_AddNumberToObject(o, "ep_rank", st->ep_rank);
	if (st->experts)
		cJSON_AddItemToObject(o, "experts",
				      ms_json_parse(st->experts, strlen(st->experts), NULL));
	else
		cJSON_AddNullToObject(o, "experts");
	cJSON_AddNumberToObject(o, "copies", st->ncopies);
	cJSON_AddStringToObject(o, "tool", st->tool ? st->tool : "");
	cJSON_AddStringToObject(o, "created_at", st->created_at ? st->created_at : "");
	return o;
}

static int json_detach(cJSON *root, uint64_t mark, char **json, struct ms_err *err)
{
	if (!root || ms_json_failed(mark) || !(*json = cJSON_PrintUnformatted(root))) {
		cJSON_Delete(root);
		return ms_err_nomem(err);
	}
	cJSON_Delete(root);
	return MS_OK;
}

int ms_py_inv_states_json(struct ms_inv *inv, const char *kind, char **json,
			  struct ms_err *err)
{
	enum ms_inv_kind k = MS_INV_KIND_ANY;
	struct ms_inv_state *st = NULL;
	cJSON *arr = NULL;
	uint64_t mark;
	size_t n = 0;
	int rc;

	*json = NULL;
	if (kind && strcmp(kind, "any") && ms_inv_kind_parse(kind, &k) != MS_OK)
		return ms_err_set(err, MS_EINVAL, "unknown kind '%s'", kind);
	if ((rc = ms_inv_states_list(inv, k, &st, &n, err)) != MS_OK)
		return rc;
	ms_json_init();
	mark = ms_json_mark();
	if ((arr = cJSON_CreateArray()))
		for (size_t i = 0; i < n; i++)
			cJSON_AddItemToArray(arr, state_json(&st[i]));
	rc = json_detach(arr, mark, json, err);
	ms_inv_states_free(st, n);
	return rc;
}

int ms_py_inv_state_json(struct ms_inv *inv, const char *ref, char **json,
			 struct ms_err *err)
{
	char digest[MS_STATE_DIGEST_LEN], hex[65];
	struct ms_inv_state *st = NULL;
	struct ms_inv_files files = {0};
	struct ms_inv_config *cfgs = NULL;
	size_t ncfgs = 0;
	cJSON *o = NULL, *fa, *ca;
	uint64_t mark;
	int rc;

	*json = NULL;
	if ((rc = ms_inv_resolve(inv, ref, digest, err)) != MS_OK ||
	    (rc = ms_inv_state_get(inv, digest, &st, err)) != MS_OK ||
	    (rc = ms_inv_state_files(inv, digest, 0, 0, &files, err)) != MS_OK ||
	    (rc = ms_inv_state_configs(inv, digest, &cfgs, &ncfgs, err)) != MS_OK)
		goto out;
	ms_json_init();
	mark = ms_json_mark();
	if ((o = state_json(st))) {
		fa = cJSON_AddArrayToObject(o, "files");
		ca = cJSON_AddArrayToObject(o, "configs");
		for (size_t i = 0; fa && i < files.n; i++) {
			const struct ms_inv_file *f = &files.files[i];
			cJSON *e = cJSON_CreateObject();

			cJSON_AddItemToArray(fa, e);
			cJSON_AddNumberToObject(e, "copy", f->copy);
			cJSON_AddStringToObject(e, "name", f->name);
			cJSON_AddStringToObject(e, "path", f->path);
			cJSON_AddNumberToObject(e, "size", (double)f->size);
		}
		for (size_t i = 0; ca && i < ncfgs; i++) {
			cJSON *e = cJSON_CreateObject();

			ms_hex(cfgs[i].digest, 32, hex);
			cJSON_AddItemToArray(ca, e);
			cJSON_AddNumberToObject(e, "copy", cfgs[i].copy);
			cJSON_AddStringToObject(e, "name", cfgs[i].name);
			cJSON_AddStringToObject(e, "path", cfgs[i].path);
			cJSON_AddStringToObject(e, "sha256", hex);
		}
	}
	rc = json_detach(o, mark, json, err);
out:
	ms_inv_configs_free(cfgs, ncfgs);
	ms_inv_files_release(&files);
	ms_inv_state_free(st);
	return rc;
}
