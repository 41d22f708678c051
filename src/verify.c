/*
 * verify.c: re-hash states against their recorded digests, and read and
 * write state manifests. Format and rules in verify.h.
 */
#include "verify.h"

#include <errno.h>
#include <limits.h>
#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "fsutil.h"
#include "gpu.h"
#include "vload.h"
#include "hash.h"
#include "inventory.h"

const char *ms_vproblem_str(enum ms_vproblem_kind k)
{
	switch (k) {
	case MS_VPROBLEM_FILE_MISSING: return "file missing";
	case MS_VPROBLEM_FILE_UNREADABLE: return "file unreadable";
	case MS_VPROBLEM_FILE_SIZE: return "file size changed";
	case MS_VPROBLEM_FILE_DIGEST: return "file digest mismatch";
	case MS_VPROBLEM_HEADER: return "header changed";
	case MS_VPROBLEM_TENSOR_MISSING: return "tensor missing";
	case MS_VPROBLEM_TENSOR_EXTRA: return "extra tensor";
	case MS_VPROBLEM_TENSOR_LAYOUT: return "tensor layout changed";
	case MS_VPROBLEM_TENSOR_DIGEST: return "digest mismatch";
	case MS_VPROBLEM_CONFIG: return "config changed";
	case MS_VPROBLEM_STATE_DIGEST: return "state digest mismatch";
	}
	return "problem";
}

static int add_problem(struct ms_vreport *r, enum ms_vproblem_kind kind,
		       const char *file, const char *tensor, const char *detail)
{
	struct ms_vproblem *np = ms_realloc(r->problems, (r->nproblems + 1) * sizeof(*np));
	struct ms_vproblem *p;

	if (!np)
		return MS_ENOMEM;
	r->problems = np;
	p = &np[r->nproblems];
	p->kind = kind;
	p->file = file ? ms_strdup(file) : NULL;
	p->tensor = tensor ? ms_strdup(tensor) : NULL;
	p->detail = ms_strdup(detail ? detail : ms_vproblem_str(kind));
	if ((file && !p->file) || (tensor && !p->tensor) || !p->detail) {
		ms_free(p->file);
		ms_free(p->tensor);
		ms_free(p->detail);
		return MS_ENOMEM;
	}
	r->nproblems++;
	return MS_OK;
}

/* The detail of a problem found through another call's message: the
 * message without its leading "'<path>': " (the problem names the file). */
static const char *detail_of(const char *msg)
{
	const char *e = msg[0] == '\'' ? strstr(msg, "': ") : NULL;

	return e ? e + 3 : msg;
}

void ms_vreport_release(struct ms_vreport *r)
{
	for (size_t i = 0; i < r->nproblems; i++) {
		ms_free(r->problems[i].file);
		ms_free(r->problems[i].tensor);
		ms_free(r->problems[i].detail);
	}
	ms_free(r->problems);
	ms_free(r->trees);
	memset(r, 0, sizeof(*r));
}

static char *resolve(const struct ms_vstate *s, const char *path)
{
	if (path[0] == '/' || !s->root)
		return ms_strdup(path);
	return ms_path_join(s->root, path);
}

static void shape_text(uint32_t ndim, const uint64_t *shape, char *buf, size_t n)
{
	struct ms_tensor t;

	t.ndim = ndim;
	memcpy(t.shape, shape, sizeof(t.shape));
	ms_shape_str(&t, buf, n);
}

/* Compare one opened, hashed file with its expectation. */
static int compare_file(const struct ms_vfile *vf, const char *label,
			const struct ms_st_file *f, struct ms_vreport *r)
{
	char detail[512], hex[65], want[65];
	int rc = MS_OK;

	if (vf->has_header_digest && memcmp(vf->header_digest, f->header_digest, 32)) {
		ms_hex(f->header_digest, 32, hex);
		ms_hex(vf->header_digest, 32, want);
		snprintf(detail, sizeof(detail), "header digest %.16s..., expected %.16s...", hex, want);
		if ((rc = add_problem(r, MS_VPROBLEM_HEADER, label, NULL, detail)) != MS_OK)
			return rc;
	}
	for (size_t i = 0; i < vf->ntensors; i++) {
		const struct ms_vtensor *vt = &vf->tensors[i];
		const struct ms_tensor *t = ms_st_find(f, vt->name);
		char s1[200], s2[200];

		if (!t) {
			rc = add_problem(r, MS_VPROBLEM_TENSOR_MISSING, label, vt->name, "tensor missing");
		} else if (t->dtype != vt->dtype || t->ndim != vt->ndim ||
			   memcmp(t->shape, vt->shape, sizeof(uint64_t) * vt->ndim) ||
			   t->offset != vt->offset) {
			shape_text(t->ndim, t->shape, s1, sizeof(s1));
			shape_text(vt->ndim, vt->shape, s2, sizeof(s2));
			snprintf(detail, sizeof(detail),
				 "now %s %s at offset %llu, recorded %s %s at offset %llu",
				 ms_dtype_name(t->dtype), s1, (unsigned long long)t->offset,
				 ms_dtype_name(vt->dtype), s2, (unsigned long long)vt->offset);
			rc = add_problem(r, MS_VPROBLEM_TENSOR_LAYOUT, label, vt->name, detail);
		} else if (memcmp(t->digest, vt->digest, 32)) {
			ms_hex(t->digest, 32, hex);
			ms_hex(vt->digest, 32, want);
			snprintf(detail, sizeof(detail), "digest mismatch: sha256 %.16s..., expected %.16s...",
				 hex, want);
			rc = add_problem(r, MS_VPROBLEM_TENSOR_DIGEST, label, vt->name, detail);
		}
		if (rc != MS_OK)
			return rc;
	}
	for (size_t i = 0; i < f->ntensors; i++) {
		const char *name = f->tensors[i].name;
		int found = 0;

		for (size_t k = 0; k < vf->ntensors && !found; k++)
			found = !strcmp(vf->tensors[k].name, name);
		if (!found && (rc = add_problem(r, MS_VPROBLEM_TENSOR_EXTRA, label, name,
						"tensor not recorded in the state")) != MS_OK)
			return rc;
	}
	return MS_OK;
}

/* The recorded tensor of vf a file tensor t stands for, when its layout
 * is the recorded one (else the comparison reports the difference). */
static const struct ms_vtensor *same_layout(const struct ms_vfile *vf, const struct ms_tensor *t)
{
	for (size_t i = 0; i < vf->ntensors; i++) {
		const struct ms_vtensor *vt = &vf->tensors[i];

		if (strcmp(vt->name, t->name))
			continue;
		if (t->dtype != vt->dtype || t->ndim != vt->ndim || t->offset != vt->offset ||
		    t->nbytes != vt->nbytes ||
		    memcmp(t->shape, vt->shape, sizeof(uint64_t) * vt->ndim))
			return NULL;
		return vt;
	}
	return NULL;
}

/* Trees computed in the pass whose plain digest matched, for tensors that
 * had none recorded: the report hands them to the inventory. */
static int collect_trees(const struct ms_vfile *vf, const struct ms_st_file *f,
			 struct ms_vreport *r, size_t *cap)
{
	for (size_t i = 0; i < f->ntensors; i++) {
		const struct ms_tensor *t = &f->tensors[i];
		const struct ms_vtensor *vt = same_layout(vf, t);
		struct ms_tree_rec *rec;

		if (!vt || vt->has_tree || !t->has_tree || !t->has_digest ||
		    memcmp(t->digest, vt->digest, MS_SHA256_LEN))
			continue;
		if (r->ntrees == *cap) {
			size_t nc = *cap ? 2 * *cap : 16;
			struct ms_tree_rec *nt = ms_realloc(r->trees, nc * sizeof(*nt));

			if (!nt)
				return MS_ENOMEM;
			r->trees = nt;
			*cap = nc;
		}
		rec = &r->trees[r->ntrees++];
		memcpy(rec->digest, t->digest, MS_SHA256_LEN);
		memcpy(rec->tree, t->tree, MS_SHA256_LEN);
		rec->nbytes = t->nbytes;
		rec->log2 = MS_TREE_LOG2;
	}
	return MS_OK;
}

/* The device path of one opened file: tensors with a recorded tree are
 * loaded to the GPU and checked there by tree; on success they carry the
 * recorded plain digest (the tree was recorded for exactly those bytes).
 * *fallback is set when a tree differed: the caller then hashes the file
 * on the CPU, which names every difference. */
static int device_file(const struct ms_vfile *vf, struct ms_st_file *f, int nthreads,
		       struct ms_vreport *r, int *fallback, struct ms_err *err)
{
	struct ms_vload_item *items = ms_calloc(f->ntensors + 1, sizeof(*items));
	size_t k = 0;
	void *arena = NULL;
	int rc;

	*fallback = 0;
	if (!items)
		return ms_err_nomem(err);
	for (size_t i = 0; i < f->ntensors; i++) {
		const struct ms_vtensor *vt = same_layout(vf, &f->tensors[i]);

		if (!vt || !vt->has_tree)
			continue;
		items[k].tensor = &f->tensors[i];
		memcpy(items[k].expected_tree, vt->tree, MS_SHA256_LEN);
		items[k++].use_tree = 1;
	}
	rc = k ? ms_load_verified_gpu(items, k, nthreads, &arena, err) : MS_OK;
	ms_gpu_free(arena);
	if (rc == MS_ECHECK) {
		*fallback = 1;
		rc = MS_OK;
	} else if (rc == MS_OK) {
		for (size_t i = 0; i < k; i++) {
			struct ms_tensor *t = (struct ms_tensor *)items[i].tensor;

			memcpy(t->digest, same_layout(vf, t)->digest, MS_SHA256_LEN);
			t->has_digest = 1;
			r->device_bytes += t->nbytes;
		}
	}
	ms_free(items);
	return rc;
}

/* Hash what the CPU checks: every header, and the tensors the device did
 * not (all of them without a device); trees in the same pass for tensors
 * that have none recorded. */
static int hash_cpu(const struct ms_vstate *s, struct ms_st_file **files, const size_t *which,
		    size_t nopen, int nthreads, struct ms_err *err)
{
	struct ms_hash_job *jobs = NULL;
	size_t n = 0, k = 0;
	int rc;

	for (size_t i = 0; i < nopen; i++)
		n += files[i]->ntensors + 1;
	jobs = ms_calloc(n ? n : 1, sizeof(*jobs));
	if (!jobs)
		return ms_err_nomem(err);
	for (size_t i = 0; i < nopen; i++) {
		struct ms_st_file *f = files[i];

		jobs[k].data = f->map;
		jobs[k].n = 8 + f->header_len;
		jobs[k++].digest = f->header_digest;
		for (size_t t = 0; t < f->ntensors; t++) {
			struct ms_tensor *ts = &f->tensors[t];
			const struct ms_vtensor *vt = same_layout(&s->files[which[i]], ts);

			if (ts->has_digest)
				continue; /* checked on the device */
			jobs[k].data = ts->data;
			jobs[k].n = ts->nbytes;
			jobs[k].digest = ts->digest;
			jobs[k++].tree = vt && !vt->has_tree ? ts->tree : NULL;
		}
	}
	rc = ms_hash_run(jobs, k, nthreads, err);
	for (size_t i = 0; rc == MS_OK && i < nopen; i++) {
		files[i]->has_header_digest = 1;
		for (size_t t = 0; t < files[i]->ntensors; t++) {
			struct ms_tensor *ts = &files[i]->tensors[t];
			const struct ms_vtensor *vt = same_layout(&s->files[which[i]], ts);

			if (!ts->has_digest)
				ts->has_tree = vt && !vt->has_tree;
			ts->has_digest = 1;
		}
	}
	ms_free(jobs);
	return rc;
}

static int verify_state(const struct ms_vstate *s, int nthreads, int device,
			struct ms_vreport *r, struct ms_err *err);

int ms_verify_state(const struct ms_vstate *s, int nthreads, struct ms_vreport *r,
		    struct ms_err *err)
{
	return verify_state(s, nthreads, 0, r, err);
}

int ms_verify_state_gpu(const struct ms_vstate *s, int nthreads, struct ms_vreport *r,
			struct ms_err *err)
{
	memset(r, 0, sizeof(*r));
	if (!ms_gpu_available()) {
		/* the reason (no device, or a build without CUDA) */
		ms_gpu_describe(NULL, 0, err);
		return err && err->code ? err->code : MS_ENODEV;
	}
	return verify_state(s, nthreads, 1, r, err);
}

static int verify_state(const struct ms_vstate *s, int nthreads, int device,
			struct ms_vreport *r, struct ms_err *err)
{
	size_t tcap = 0;
	struct ms_st_file **files = NULL;
	size_t nopen = 0;
	size_t *which = NULL;
	double t0 = ms_now();
	char digest[MS_STATE_DIGEST_LEN];
	int rc = MS_OK;

	memset(r, 0, sizeof(*r));
	files = ms_calloc(s->nfiles ? s->nfiles : 1, sizeof(*files));
	which = ms_calloc(s->nfiles ? s->nfiles : 1, sizeof(*which));
	if (!files || !which) {
		rc = ms_err_nomem(err);
		goto out;
	}
	/* the recorded tensors must still give the recorded state digest: an
	 * edited digest in the database or manifest is caught here */
	if (s->digest[0]) {
		if ((rc = ms_vstate_digest(s, digest, err)) != MS_OK)
			goto out;
		if (strcmp(digest, s->digest)) {
			char detail[256];

			snprintf(detail, sizeof(detail),
				 "recorded tensors give %.23s..., the record says %.23s...", digest,
				 s->digest);
			if ((rc = add_problem(r, MS_VPROBLEM_STATE_DIGEST, NULL, NULL, detail)) != MS_OK)
				goto oom;
		}
	}
	for (size_t i = 0; i < s->nfiles; i++) {
		const struct ms_vfile *vf = &s->files[i];
		char *path = resolve(s, vf->path);
		struct ms_err ferr = {0};
		struct stat st;
		int frc;

		if (!path)
			goto oom;
		if (stat(path, &st)) {
			int e = errno;

			/* a file that is not there is a difference; a file that
			 * cannot be looked at is a failure of the check */
			if (e != ENOENT && e != ENOTDIR) {
				rc = ms_err_set(err, MS_EIO, "'%s': %s", path, strerror(e));
				ms_free(path);
				goto out;
			}
			rc = add_problem(r, MS_VPROBLEM_FILE_MISSING, vf->path, NULL, "file missing");
			ms_free(path);
			if (rc != MS_OK)
				goto oom;
			continue;
		}
		if ((uint64_t)st.st_size != vf->size) {
			char detail[128];

			snprintf(detail, sizeof(detail), "size %lld bytes, recorded %llu",
				 (long long)st.st_size, (unsigned long long)vf->size);
			if ((rc = add_problem(r, MS_VPROBLEM_FILE_SIZE, vf->path, NULL, detail)) != MS_OK) {
				ms_free(path);
				goto oom;
			}
		}
		frc = ms_st_open(path, &files[nopen], &ferr);
		ms_free(path);
		if (frc == MS_ENOMEM)
			goto oom;
		if (frc == MS_EIO) {
			/* open, stat or map failed: nothing was compared */
			rc = ms_err_set(err, frc, "%s", ferr.msg);
			goto out;
		}
		if (frc != MS_OK) {
			/* gone meanwhile, or no longer a valid file: a difference */
			rc = frc == MS_ENOTFOUND
				     ? add_problem(r, MS_VPROBLEM_FILE_MISSING, vf->path, NULL, "file missing")
				     : add_problem(r, MS_VPROBLEM_FILE_UNREADABLE, vf->path, NULL,
						   detail_of(ferr.msg));
			if (rc != MS_OK)
				goto oom;
			continue;
		}
		which[nopen++] = i;
	}
	for (size_t k = 0; device && k < nopen; k++) {
		int fallback = 0;

		if ((rc = device_file(&s->files[which[k]], files[k], nthreads, r, &fallback,
				      err)) != MS_OK)
			goto out;
		/* a tree differed: the CPU pass below lists every difference */
		for (size_t t = 0; fallback && t < files[k]->ntensors; t++)
			files[k]->tensors[t].has_digest = 0;
	}
	if ((rc = hash_cpu(s, files, which, nopen, nthreads, err)) != MS_OK)
		goto out;
	for (size_t k = 0; k < nopen; k++) {
		r->bytes += files[k]->size;
		r->ntensors += files[k]->ntensors;
		if ((rc = compare_file(&s->files[which[k]], s->files[which[k]].path, files[k], r)) != MS_OK ||
		    (rc = collect_trees(&s->files[which[k]], files[k], r, &tcap)) != MS_OK)
			goto oom;
	}
	r->nfiles = nopen;
	for (size_t i = 0; i < s->nconfigs; i++) {
		char *path = resolve(s, s->configs[i].path), *text = NULL;
		size_t len;
		uint8_t d[32];
		struct ms_err cerr = {0};
		int crc, fail = 0;

		if (!path)
			goto oom;
		crc = ms_file_read(path, MS_CKPT_MAX_SIDE, &text, &len, &cerr);
		if (crc == MS_ENOTFOUND || crc == MS_EINVAL) {
			/* gone, or no longer a regular file of a sane size */
			rc = add_problem(r, MS_VPROBLEM_CONFIG, s->configs[i].path, NULL,
					 crc == MS_ENOTFOUND ? "file missing" : detail_of(cerr.msg));
		} else if (crc != MS_OK) {
			/* a read or an allocation failed: nothing was compared */
			rc = ms_err_set(err, crc, "%s", cerr.msg);
			fail = 1;
		} else if ((crc = ms_sha256(text, len, d)) != MS_OK) {
			rc = crc == MS_ENOMEM ? ms_err_set(err, crc, "out of memory")
					      : ms_err_set(err, crc, "'%s': sha256 failed", path);
			fail = 1;
		} else if (memcmp(d, s->configs[i].digest, 32)) {
			rc = add_problem(r, MS_VPROBLEM_CONFIG, s->configs[i].path, NULL,
					 "configuration file changed");
		}
		r->bytes += text ? len : 0;
		ms_free(text);
		ms_free(path);
		if (fail)
			goto out;
		if (rc != MS_OK)
			goto oom;
	}
	r->seconds = ms_now() - t0;
	rc = r->nproblems ? MS_ECHECK : MS_OK;
	goto out;
oom:
	rc = ms_err_nomem(err);
out:
	for (size_t k = 0; k < nopen; k++)
		ms_st_close(files[k]);
	ms_free(files);
	ms_free(which);
	return rc;
}

void ms_vstate_free(struct ms_vstate *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->nfiles; i++) {
		for (size_t t = 0; t < s->files[i].ntensors; t++)
			ms_free(s->files[i].tensors[t].name);
		ms_free(s->files[i].tensors);
		ms_free(s->files[i].path);
	}
	ms_free(s->files);
	for (size_t i = 0; i < s->nconfigs; i++)
		ms_free(s->configs[i].path);
	ms_free(s->configs);
	ms_free(s->kind);
	ms_free(s->label);
	ms_free(s->layout);
	ms_free(s->root);
	ms_free(s);
}

int ms_vstate_digest(const struct ms_vstate *s, char out[MS_STATE_DIGEST_LEN],
		     struct ms_err *err)
{
	struct ms_tensor *ts = NULL, **ptrs = NULL;
	size_t n = 0, k = 0;
	int rc;

	for (size_t i = 0; i < s->nfiles; i++)
		n += s->files[i].ntensors;
	ts = ms_calloc(n ? n : 1, sizeof(*ts));
	ptrs = ms_calloc(n ? n : 1, sizeof(*ptrs));
	if (!ts || !ptrs) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < s->nfiles; i++) {
		for (size_t t = 0; t < s->files[i].ntensors; t++, k++) {
			const struct ms_vtensor *v = &s->files[i].tensors[t];

			ts[k].name = v->name;
			ts[k].dtype = v->dtype;
			ts[k].ndim = v->ndim;
			memcpy(ts[k].shape, v->shape, sizeof(ts[k].shape));
			memcpy(ts[k].digest, v->digest, 32);
			ts[k].has_digest = 1;
			ptrs[k] = &ts[k];
		}
	}
	rc = ms_state_digest(ptrs, n, out, err);
out:
	ms_free(ts);
	ms_free(ptrs);
	return rc;
}

int ms_vstate_from_ckpt(const struct ms_ckpt *c, struct ms_vstate **out,
			struct ms_err *err)
{
	struct ms_vstate *s = ms_calloc(1, sizeof(*s));
	int rc;

	*out = NULL;
	if (!s)
		return ms_err_nomem(err);
	s->ep_size = s->ep_rank = -1;
	s->files = ms_calloc(c->nfiles ? c->nfiles : 1, sizeof(*s->files));
	s->configs = ms_calloc(c->nconfigs ? c->nconfigs : 1, sizeof(*s->configs));
	if (!s->files || !s->configs)
		goto oom;
	for (size_t i = 0; i < c->nfiles; i++) {
		const struct ms_st_file *f = c->files[i];
		struct ms_vfile *vf = &s->files[i];

		s->nfiles++;
		if (!(vf->path = realpath(f->path, NULL)))
			vf->path = ms_strdup(f->path);
		vf->size = f->size;
		memcpy(vf->header_digest, f->header_digest, 32);
		vf->has_header_digest = f->has_header_digest;
		memcpy(vf->file_digest, f->file_digest, 32);
		vf->has_file_digest = f->has_file_digest;
		vf->tensors = ms_calloc(f->ntensors ? f->ntensors : 1, sizeof(*vf->tensors));
		if (!vf->path || !vf->tensors)
			goto oom;
		for (size_t t = 0; t < f->ntensors; t++) {
			const struct ms_tensor *src = &f->tensors[t];
			struct ms_vtensor *vt = &vf->tensors[t];

			if (!src->has_digest) {
				rc = ms_err_set(err, MS_EINVAL, "tensor '%s' has not been hashed", src->name);
				goto fail;
			}
			vf->ntensors++;
			if (!(vt->name = ms_strdup(src->name)))
				goto oom;
			vt->dtype = src->dtype;
			vt->ndim = src->ndim;
			memcpy(vt->shape, src->shape, sizeof(vt->shape));
			vt->offset = src->offset;
			vt->nbytes = src->nbytes;
			memcpy(vt->digest, src->digest, 32);
		}
	}
	for (size_t i = 0; i < c->nconfigs; i++) {
		s->nconfigs++;
		if (!(s->configs[i].path = realpath(c->configs[i].path, NULL)))
			s->configs[i].path = ms_strdup(c->configs[i].path);
		if (!s->configs[i].path)
			goto oom;
		memcpy(s->configs[i].digest, c->configs[i].digest, 32);
	}
	if ((rc = ms_state_digest(c->tensors, c->ntensors, s->digest, err)) != MS_OK)
		goto fail;
	*out = s;
	return MS_OK;
oom:
	rc = ms_err_nomem(err);
fail:
	ms_vstate_free(s);
	return rc;
}

/* ---- manifest ------------------------------------------------------------- */

/* path relative to root, or NULL when it does not lie under root */
static const char *under_root(const char *path, const char *root)
{
	size_t n = strlen(root);

	while (n > 1 && root[n - 1] == '/')
		n--;
	if (strncmp(path, root, n) || path[n] != '/')
		return NULL;
	return path + n + 1;
}

/* An integer as its exact decimal: cJSON prints numbers with 15 digits when
 * that is within a relative epsilon, so 9007199254740992 would come back as
 * 9007199254740990 and the state digest (over the shapes) would change. */
static cJSON *json_u64(uint64_t v)
{
	char b[24];

	snprintf(b, sizeof(b), "%llu", (unsigned long long)v);
	return cJSON_CreateRaw(b);
}

int ms_manifest_write(const struct ms_vstate *s, const char *root, char **json,
		      struct ms_err *err)
{
	/* members are added unchecked: the mark tells a short manifest */
	uint64_t mark = ms_json_mark();
	cJSON *o = cJSON_CreateObject(), *files, *configs;
	char hex[65];
	char *rroot = NULL;
	int rc = MS_OK;

	*json = NULL;
	if (!o)
		goto oom;
	if (root && !(rroot = realpath(root, NULL))) {
		rc = ms_err_set(err, MS_EIO, "'%s': %s", root, strerror(errno));
		goto out;
	}
	cJSON_AddStringToObject(o, "format", "msinv-manifest-v1");
	cJSON_AddStringToObject(o, "state", s->digest);
	if (s->kind)
		cJSON_AddStringToObject(o, "kind", s->kind);
	if (s->label)
		cJSON_AddStringToObject(o, "label", s->label);
	if (s->layout)
		cJSON_AddStringToObject(o, "layout", s->layout);
	if (s->ep_size > 0) {
		cJSON_AddNumberToObject(o, "ep_size", s->ep_size);
		cJSON_AddNumberToObject(o, "ep_rank", s->ep_rank);
	}
	files = cJSON_AddArrayToObject(o, "files");
	for (size_t i = 0; i < s->nfiles; i++) {
		const struct ms_vfile *vf = &s->files[i];
		cJSON *f = cJSON_CreateObject(), *ts;
		const char *rel = rroot ? under_root(vf->path, rroot) : vf->path;

		if (!f || !cJSON_AddItemToArray(files, f)) {
			cJSON_Delete(f);
			goto oom;
		}
		if (!rel) {
			rc = ms_err_set(err, MS_EINVAL, "'%s' does not lie under '%s'", vf->path, rroot);
			goto out;
		}
		cJSON_AddStringToObject(f, "path", rel);
		ms_json_put(f, "size", json_u64(vf->size));
		if (vf->has_header_digest) {
			ms_hex(vf->header_digest, 32, hex);
			cJSON_AddStringToObject(f, "header_sha256", hex);
		}
		if (vf->has_file_digest) {
			ms_hex(vf->file_digest, 32, hex);
			cJSON_AddStringToObject(f, "sha256", hex);
		}
		ts = cJSON_AddArrayToObject(f, "tensors");
		for (size_t t = 0; t < vf->ntensors; t++) {
			const struct ms_vtensor *vt = &vf->tensors[t];
			cJSON *j = cJSON_CreateObject(), *shape;

			if (!j || !cJSON_AddItemToArray(ts, j)) {
				cJSON_Delete(j);
				goto oom;
			}
			cJSON_AddStringToObject(j, "name", vt->name);
			cJSON_AddStringToObject(j, "dtype", ms_dtype_name(vt->dtype));
			shape = cJSON_AddArrayToObject(j, "shape");
			for (uint32_t d = 0; shape && d < vt->ndim; d++)
				cJSON_AddItemToArray(shape, json_u64(vt->shape[d]));
			ms_json_put(j, "offset", json_u64(vt->offset));
			ms_json_put(j, "bytes", json_u64(vt->nbytes));
			ms_hex(vt->digest, 32, hex);
			cJSON_AddStringToObject(j, "sha256", hex);
		}
	}
	configs = cJSON_AddArrayToObject(o, "configs");
	for (size_t i = 0; i < s->nconfigs; i++) {
		cJSON *c = cJSON_CreateObject();
		const char *rel = rroot ? under_root(s->configs[i].path, rroot) : s->configs[i].path;

		if (!c || !cJSON_AddItemToArray(configs, c)) {
			cJSON_Delete(c);
			goto oom;
		}
		if (!rel) {
			rc = ms_err_set(err, MS_EINVAL, "'%s' does not lie under '%s'",
					s->configs[i].path, rroot);
			goto out;
		}
		cJSON_AddStringToObject(c, "path", rel);
		ms_hex(s->configs[i].digest, 32, hex);
		cJSON_AddStringToObject(c, "sha256", hex);
	}
	*json = cJSON_Print(o);
	if (!*json || ms_json_failed(mark)) {
		cJSON_free(*json);
		*json = NULL;
		goto oom;
	}
	goto out;
oom:
	rc = ms_err_nomem(err);
out:
	free(rroot);
	cJSON_Delete(o);
	return rc;
}

/* Manifest paths: relative POSIX, no empty, "." or ".." component, and
 * names the file system can hold (a longer one could never be a file of
 * the state, and would surface as an I/O error instead of a bad manifest). */
static int plain_relative(const char *p)
{
	const char *c = p;

	if (!*p || *p == '/' || strlen(p) >= PATH_MAX)
		return 0;
	while (*c) {
		const char *e = strchr(c, '/');
		size_t n = e ? (size_t)(e - c) : strlen(c);

		if (n == 0 || n > NAME_MAX || (n == 1 && c[0] == '.') ||
		    (n == 2 && c[0] == '.' && c[1] == '.'))
			return 0;
		c += n;
		if (*c == '/')
			c++;
		else
			break;
	}
	return p[strlen(p) - 1] != '/';
}

static int get_u64(const cJSON *o, const char *key, uint64_t *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	/* cJSON numbers are doubles: integers are exact only up to 2^53 */
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
	    floor(v->valuedouble) != v->valuedouble)
		return -1;
	*out = (uint64_t)v->valuedouble;
	return 0;
}

static int get_hex(const cJSON *o, const char *key, uint8_t out[32])
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	if (!cJSON_IsString(v) || strlen(v->valuestring) != 64)
		return -1;
	return ms_unhex(v->valuestring, out, 32);
}

/* A copy of a string member into *out (NULL when absent or not a string).
 * -1 only when the copy cannot be allocated: out of memory is not a
 * malformed manifest. */
static int get_str(const cJSON *o, const char *key, char **out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	*out = NULL;
	if (!cJSON_IsString(v))
		return 0;
	return (*out = ms_strdup(v->valuestring)) ? 0 : -1;
}

int ms_manifest_parse(const char *json, size_t len, const char *label, const char *root,
		      struct ms_vstate **out, struct ms_err *err)
{
	cJSON *o = NULL, *files, *f, *configs;
	struct ms_vstate *s = NULL;
	char digest[MS_STATE_DIGEST_LEN];
	const cJSON *v;
	size_t k;
	int rc, nomem;

	*out = NULL;
	o = ms_json_parse(json, len, &nomem);
	if (nomem)
		goto oom;
	if (!o || !cJSON_IsObject(o)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': manifest is not a JSON object", label);
		goto out;
	}
	v = cJSON_GetObjectItemCaseSensitive(o, "format");
	if (!cJSON_IsString(v) || strcmp(v->valuestring, "msinv-manifest-v1")) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': \"format\" is not \"msinv-manifest-v1\"", label);
		goto out;
	}
	s = ms_calloc(1, sizeof(*s));
	if (!s)
		goto oom;
	s->ep_size = s->ep_rank = -1;
	v = cJSON_GetObjectItemCaseSensitive(o, "state");
	if (!cJSON_IsString(v) || strlen(v->valuestring) != MS_STATE_DIGEST_LEN - 1 ||
	    strncmp(v->valuestring, "sha256:", 7)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': \"state\" is not a sha256: digest", label);
		goto out;
	}
	memcpy(s->digest, v->valuestring, MS_STATE_DIGEST_LEN);
	if (get_str(o, "kind", &s->kind) || get_str(o, "label", &s->label) ||
	    get_str(o, "layout", &s->layout))
		goto oom;
	{
		uint64_t es, er;

		if (!get_u64(o, "ep_size", &es) && !get_u64(o, "ep_rank", &er) && es > 0 &&
		    es < 1u << 20 && er < es) {
			s->ep_size = (int32_t)es;
			s->ep_rank = (int32_t)er;
		}
	}
	if (root && !(s->root = ms_strdup(root)))
		goto oom;
	files = cJSON_GetObjectItemCaseSensitive(o, "files");
	if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) == 0) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': \"files\" is not a non-empty array", label);
		goto out;
	}
	s->files = ms_calloc((size_t)cJSON_GetArraySize(files), sizeof(*s->files));
	if (!s->files)
		goto oom;
	cJSON_ArrayForEach(f, files) {
		struct ms_vfile *vf = &s->files[s->nfiles++];
		cJSON *ts = cJSON_GetObjectItemCaseSensitive(f, "tensors"), *t;

		if (get_str(f, "path", &vf->path))
			goto oom;
		if (!vf->path || !plain_relative(vf->path)) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': file %zu: \"path\" is not a plain relative path", label,
					s->nfiles - 1);
			goto out;
		}
		if (get_u64(f, "size", &vf->size) || get_hex(f, "header_sha256", vf->header_digest) ||
		    !cJSON_IsArray(ts)) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': file '%s': needs \"size\", \"header_sha256\" and \"tensors\"",
					label, vf->path);
			goto out;
		}
		vf->has_header_digest = 1;
		if (cJSON_GetObjectItemCaseSensitive(f, "sha256")) {
			if (get_hex(f, "sha256", vf->file_digest)) {
				rc = ms_err_set(err, MS_EINVAL, "'%s': file '%s': bad \"sha256\"", label,
						vf->path);
				goto out;
			}
			vf->has_file_digest = 1;
		}
		vf->tensors = ms_calloc((size_t)cJSON_GetArraySize(ts) + 1, sizeof(*vf->tensors));
		if (!vf->tensors)
			goto oom;
		cJSON_ArrayForEach(t, ts) {
			struct ms_vtensor *vt = &vf->tensors[vf->ntensors++];
			cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape"), *d;
			const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");

			if (get_str(t, "name", &vt->name))
				goto oom;
			if (!vt->name || !*vt->name || !cJSON_IsString(dt) ||
			    ms_dtype_parse(dt->valuestring, strlen(dt->valuestring), &vt->dtype) ||
			    !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > MS_ST_MAX_RANK ||
			    get_u64(t, "offset", &vt->offset) || get_u64(t, "bytes", &vt->nbytes) ||
			    get_hex(t, "sha256", vt->digest)) {
				rc = ms_err_set(err, MS_EINVAL,
						"'%s': file '%s': tensor %zu is malformed (name, dtype, shape, offset, bytes, sha256)",
						label, vf->path, vf->ntensors - 1);
				goto out;
			}
			cJSON_ArrayForEach(d, shape) {
				if (!cJSON_IsNumber(d) || d->valuedouble < 0 ||
				    d->valuedouble > 9007199254740992.0 ||
				    floor(d->valuedouble) != d->valuedouble) {
					rc = ms_err_set(err, MS_EINVAL, "'%s': tensor '%s': bad shape",
							label, vt->name);
					goto out;
				}
				vt->shape[vt->ndim++] = (uint64_t)d->valuedouble;
			}
		}
	}
	configs = cJSON_GetObjectItemCaseSensitive(o, "configs");
	if (configs && !cJSON_IsArray(configs)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': \"configs\" is not an array", label);
		goto out;
	}
	k = configs ? (size_t)cJSON_GetArraySize(configs) : 0;
	s->configs = ms_calloc(k + 1, sizeof(*s->configs));
	if (!s->configs)
		goto oom;
	if (configs) {
		cJSON_ArrayForEach(f, configs) {
			struct ms_vconfig *c = &s->configs[s->nconfigs++];

			if (get_str(f, "path", &c->path))
				goto oom;
			if (!c->path || !plain_relative(c->path) || get_hex(f, "sha256", c->digest)) {
				rc = ms_err_set(err, MS_EINVAL, "'%s': config %zu is malformed", label,
						s->nconfigs - 1);
				goto out;
			}
		}
	}
	if ((rc = ms_vstate_digest(s, digest, err)) != MS_OK) {
		ms_err_prefix(err, "'%s'", label);
		goto out;
	}
	if (strcmp(digest, s->digest)) {
		rc = ms_err_set(err, MS_ECHECK,
				"'%s': the tensors listed give state %s, the manifest says %s", label,
				digest, s->digest);
		goto out;
	}
	*out = s;
	s = NULL;
	rc = MS_OK;
	goto out;
oom:
	rc = ms_err_nomem(err);
out:
	ms_vstate_free(s);
	cJSON_Delete(o);
	return rc;
}

/* ---- where a state lives ---------------------------------------------------- */

/* The directory holding every file of s (or the file, for one file). */
char *ms_vstate_location(const struct ms_vstate *s)
{
	char *d, *copy;

	if (s->nfiles == 1 && s->nconfigs == 0)
		return ms_strdup(s->files[0].path);
	copy = ms_strdup(s->files[0].path);
	if (!copy)
		return NULL;
	d = ms_strdup(dirname(copy));
	ms_free(copy);
	for (size_t i = 1; d && i < s->nfiles; i++) {
		size_t n = strlen(d);

		while (strncmp(s->files[i].path, d, n) || s->files[i].path[n] != '/') {
			char *up = ms_strdup(dirname(d));

			ms_free(d);
			d = up;
			if (!d || !strcmp(d, "/"))
				return d;
			n = strlen(d);
		}
	}
	return d;
}

/* ---- from the inventory ------------------------------------------------------ */

static int copy_files_exist(const struct ms_inv_files *f, uint32_t copy)
{
	struct stat st;

	for (size_t i = 0; i < f->n; i++)
		if (f->files[i].copy == copy && stat(f->files[i].path, &st))
			return 0;
	return 1;
}

int ms_vstate_from_inv(struct ms_inv *inv, const char *digest, uint32_t copy,
		       struct ms_vstate **out, struct ms_err *err)
{
	struct ms_inv_files files = {0};
	struct ms_inv_config *cfgs = NULL;
	struct ms_inv_state *st = NULL;
	struct ms_vstate *s = NULL;
	size_t ncfgs = 0, k = 0, nk = 0;
	int rc;

	*out = NULL;
	if ((rc = ms_inv_state_get(inv, digest, &st, err)) != MS_OK)
		return rc;
	if ((rc = ms_inv_state_files(inv, digest, 0, 1, &files, err)) != MS_OK)
		goto out;
	if ((rc = ms_inv_state_configs(inv, digest, &cfgs, &ncfgs, err)) != MS_OK)
		goto out;
	if (files.n == 0) {
		/* an ancestor recorded from a bundle's lineage: its bytes are
		 * elsewhere */
		rc = ms_err_set(err, MS_ENOTFOUND, "state %s has no copy in this inventory", digest);
		goto out;
	}
	if (!copy) {
		copy = files.files[0].copy;
		for (size_t i = 0; i < files.n; i++) {
			if (copy_files_exist(&files, files.files[i].copy)) {
				copy = files.files[i].copy;
				break;
			}
		}
	}
	s = ms_calloc(1, sizeof(*s));
	if (!s)
		goto oom;
	memcpy(s->digest, st->digest, MS_STATE_DIGEST_LEN);
	s->kind = ms_strdup(ms_inv_kind_name(st->kind));
	s->label = st->label ? ms_strdup(st->label) : NULL;
	s->layout = st->layout ? ms_strdup(st->layout) : NULL;
	s->ep_size = st->ep_size;
	s->ep_rank = st->ep_rank;
	if (!s->kind || (st->label && !s->label) || (st->layout && !s->layout))
		goto oom;
	for (size_t i = 0; i < files.n; i++)
		k += files.files[i].copy == copy;
	for (size_t i = 0; i < ncfgs; i++)
		nk += cfgs[i].copy == copy;
	if (k == 0) {
		rc = ms_err_set(err, MS_ENOTFOUND, "state %s has no copy %u", digest, copy);
		goto out;
	}
	s->files = ms_calloc(k, sizeof(*s->files));
	s->configs = ms_calloc(nk + 1, sizeof(*s->configs));
	if (!s->files || !s->configs)
		goto oom;
	for (size_t i = 0; i < files.n; i++) {
		const struct ms_inv_file *f = &files.files[i];
		struct ms_vfile *vf;

		if (f->copy != copy)
			continue;
		vf = &s->files[s->nfiles++];
		vf->path = ms_strdup(f->path);
		vf->size = f->size;
		memcpy(vf->header_digest, f->header_digest, 32);
		vf->has_header_digest = 1;
		vf->has_file_digest = f->has_file_digest;
		memcpy(vf->file_digest, f->file_digest, 32);
		vf->tensors = ms_calloc(f->ntensors + 1, sizeof(*vf->tensors));
		if (!vf->path || !vf->tensors)
			goto oom;
		for (size_t t = 0; t < f->ntensors; t++) {
			const struct ms_vtensor *it = &f->tensors[t];
			struct ms_vtensor *vt = &vf->tensors[vf->ntensors++];

			/* the inventory's record is the manifest's type: copied
			 * whole, the name duplicated */
			*vt = *it;
			if (!(vt->name = ms_strdup(it->name)))
				goto oom;
		}
	}
	for (size_t i = 0; i < ncfgs; i++) {
		struct ms_vconfig *c;

		if (cfgs[i].copy != copy)
			continue;
		c = &s->configs[s->nconfigs++];
		if (!(c->path = ms_strdup(cfgs[i].path)))
			goto oom;
		memcpy(c->digest, cfgs[i].digest, 32);
	}
	*out = s;
	s = NULL;
	rc = MS_OK;
	goto out;
oom:
	rc = ms_err_nomem(err);
out:
	ms_vstate_free(s);
	ms_inv_configs_free(cfgs, ncfgs);
	ms_inv_files_release(&files);
	ms_inv_state_free(st);
	return rc;
}

/* ---- verify and record ------------------------------------------------------ */

int ms_verify_record(struct ms_inv *inv, const char *digest, const struct ms_vstate *s,
		     unsigned flags, int nthreads, struct ms_vreport *r, size_t *trees_added,
		     struct ms_err *err)
{
	enum ms_inv_result res;
	int rc, vrc;

	if (trees_added)
		*trees_added = 0;
	vrc = (flags & MS_VERIFY_GPU) ? ms_verify_state_gpu(s, nthreads, r, err)
				      : ms_verify_state(s, nthreads, r, err);
	if (vrc != MS_OK && vrc != MS_ECHECK) {
		/* no verdict: nothing half-listed may pass for one */
		ms_vreport_release(r);
		return vrc;
	}
	if (flags & MS_VERIFY_NO_RECORD)
		return vrc;
	/* tensors whose plain digest matched gain the tree digest of the same
	 * pass (ms(5), "Tree digests") */
	if ((flags & MS_VERIFY_TREES) &&
	    (rc = ms_inv_record_trees(inv, digest, r->trees, r->ntrees, "verify", trees_added,
				      err)) != MS_OK)
		return rc;
	res = vrc == MS_OK ? MS_INV_RESULT_OK
	      : r->problems[0].kind == MS_VPROBLEM_FILE_MISSING ? MS_INV_RESULT_MISSING
							       : MS_INV_RESULT_MISMATCH;
	if ((rc = ms_inv_record_verification(inv, digest, res, r->bytes, r->seconds,
					     r->nproblems ? r->problems[0].detail : NULL,
					     err)) != MS_OK)
		return rc;
	return vrc;
}

int ms_verify_states_under(struct ms_inv *inv, const char *path,
			   char (**out)[MS_STATE_DIGEST_LEN], size_t *nout, struct ms_err *err)
{
	struct ms_inv_state *all = NULL;
	char (*list)[MS_STATE_DIGEST_LEN] = NULL;
	size_t n = 0, k = 0, len;
	char *real = realpath(path, NULL);
	int rc;

	*out = NULL;
	*nout = 0;
	if (!real)
		return ms_err_set(err, MS_ENOTFOUND, "'%s': no such file or directory", path);
	len = strlen(real);
	if ((rc = ms_inv_states_list(inv, MS_INV_KIND_ANY, &all, &n, err)) != MS_OK)
		goto out;
	if (!(list = ms_calloc(n ? n : 1, sizeof(*list)))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct ms_inv_files f = {0};
		int hit = 0;

		if ((rc = ms_inv_state_files(inv, all[i].digest, 0, 0, &f, err)) != MS_OK)
			goto out;
		/* the path itself, or a file below it (not "/a/bc" for "/a/b") */
		for (size_t j = 0; j < f.n && !hit; j++)
			hit = !strcmp(f.files[j].path, real) ||
			      (!strncmp(f.files[j].path, real, len) && f.files[j].path[len] == '/');
		ms_inv_files_release(&f);
		if (hit)
			memcpy(list[k++], all[i].digest, MS_STATE_DIGEST_LEN);
	}
	if (k == 0) {
		rc = ms_err_set(err, MS_ENOTFOUND, "'%s': no inventoried state has files there", path);
		goto out;
	}
	*out = list;
	*nout = k;
	list = NULL;
out:
	ms_free(list);
	ms_inv_states_free(all, n);
	free(real);
	return rc;
}
