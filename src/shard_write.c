/*
 * shard_write.c: writing a shard set: each tensor laid out for a rank's
 * experts, the output files, the manifest, and the result handed back.
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

/* ---- writing ------------------------------------------------------------- */

static int sink_writer(void *ctx, const void *p, size_t n, struct ms_err *err)
{
	return ms_st_writer_data(ctx, p, n, err);
}

int shard_sink_sha(void *ctx, const void *p, size_t n, struct ms_err *err)
{
	if (ms_sha256_update(ctx, p, n) != MS_OK)
		return ms_err_set(err, MS_EIO, "sha256 failed");
	return MS_OK;
}

/* n bytes at p, CHUNK at a time. */
static int sink_all(sink_fn sink, void *ctx, const uint8_t *p, uint64_t n, struct ms_err *err)
{
	int rc;

	while (n) {
		size_t k = n < CHUNK ? (size_t)n : CHUNK;

		if ((rc = sink(ctx, p, k, err)) != MS_OK)
			return rc;
		p += k;
		n -= k;
	}
	return MS_OK;
}

/* Copy m elements of es bytes, stride bytes apart, to d (contiguous); the
 * common sizes become plain moves. */
void shard_gather(uint8_t *d, const uint8_t *p, uint64_t m, size_t stride, size_t es)
{
	switch (es) {
	case 2:
		for (uint64_t i = 0; i < m; i++, d += 2, p += stride)
			memcpy(d, p, 2);
		break;
	case 4:
		for (uint64_t i = 0; i < m; i++, d += 4, p += stride)
			memcpy(d, p, 4);
		break;
	case 8:
		for (uint64_t i = 0; i < m; i++, d += 8, p += stride)
			memcpy(d, p, 8);
		break;
	default:
		for (uint64_t i = 0; i < m; i++, d += es, p += stride)
			memcpy(d, p, es);
	}
}

/*
 * Emit the bytes of tensor t laid out for experts ids[0, l) (local order):
 * whole for replicated and per-expert tensors; the experts' rows of A and
 * of grouped tensors; B column k*l + le taken from column k*n + pos of the
 * tensor holding expert ids[le]. Runs of experts that sit side by side in
 * their source are copied in one piece. buf holds CHUNK bytes.
 */
int shard_emit(const struct src *s, const struct stensor *t, const uint32_t *ids,
		uint32_t l, uint8_t *buf, sink_fn sink, void *ctx, struct ms_err *err)
{
	size_t used = 0, es;
	int rc;

	if (!shard_is_sliced(t->kind))
		return sink_all(sink, ctx, t->data, t->nbytes, err);
	if (t->kind != TK_FUSED_B) {
		uint64_t sl = shard_slice_bytes(t, s->E);

		for (uint32_t i = 0; i < l;) {
			uint32_t g = ids[i], run = 1;

			while (i + run < l && t->edata[ids[i + run]] == t->edata[g] &&
			       t->epos[ids[i + run]] == t->epos[g] + run)
				run++;
			if ((rc = sink_all(sink, ctx, t->edata[g] + (uint64_t)t->epos[g] * sl, run * sl,
					   err)) != MS_OK)
				return rc;
			i += run;
		}
		return MS_OK;
	}
	es = ms_dtype_bits(t->dtype) / 8;
	{
		/* the runs, found once: the loop below is per element group */
		struct { const uint8_t *base; uint64_t en; size_t bytes; } run[32];
		uint32_t nr = 0, i;

		for (i = 0; i < l && nr < 32; nr++) {
			uint32_t g = ids[i], m = 1;

			while (i + m < l && t->edata[ids[i + m]] == t->edata[g] &&
			       t->epos[ids[i + m]] == t->epos[g] + m)
				m++;
			run[nr].base = t->edata[g] + (uint64_t)t->epos[g] * es;
			run[nr].en = t->en[g];
			run[nr].bytes = (size_t)m * es;
			i += m;
		}
		if (i == l && (size_t)l * es <= CHUNK) {
			for (uint64_t o = 0; o < t->shape[0]; o++)
				for (uint64_t k = 0; k < t->r; k++) {
					uint64_t ok = o * t->r + k;

					if (used + (size_t)l * es > CHUNK) {
						if ((rc = sink(ctx, buf, used, err)) != MS_OK)
							return rc;
						used = 0;
					}
					for (uint32_t q = 0; q < nr; q++) {
						memcpy(buf + used, run[q].base + ok * run[q].en * es,
						       run[q].bytes);
						used += run[q].bytes;
					}
				}
			return used ? sink(ctx, buf, used, err) : MS_OK;
		}
	}
	for (uint64_t o = 0; o < t->shape[0]; o++)
		for (uint64_t k = 0; k < t->r; k++)
			for (uint32_t i = 0; i < l;) {
				uint32_t g = ids[i], run = 1;
				const uint8_t *p;
				uint64_t bytes;

				while (i + run < l && t->edata[ids[i + run]] == t->edata[g] &&
				       t->epos[ids[i + run]] == t->epos[g] + run)
					run++;
				p = t->edata[g] + ((o * t->r + k) * t->en[g] + t->epos[g]) * es;
				bytes = (uint64_t)run * es;
				if (used + bytes > CHUNK) {
					if ((rc = sink(ctx, buf, used, err)) != MS_OK)
						return rc;
					used = 0;
				}
				if (bytes > CHUNK) {
					if ((rc = sink_all(sink, ctx, p, bytes, err)) != MS_OK)
						return rc;
				} else {
					memcpy(buf + used, p, bytes);
					used += bytes;
				}
				i += run;
			}
	return used ? sink(ctx, buf, used, err) : MS_OK;
}

static int out_includes(const struct outspec *o, const struct stensor *t)
{
	if (o->file >= 0 && t->file != (uint32_t)o->file)
		return 0;
	return t->kind != TK_EXPERT || o->lpos[t->expert] >= 0;
}

/* Count what o writes into res (its tensors and bytes). */
int shard_out_plan(const struct src *s, const struct outspec *o,
		   struct ms_shard_out_file *res, struct ms_err *err)
{
	res->ntensors = 0;
	res->nbytes = 0;
	res->state_digest[0] = '\0';
	for (size_t i = 0; i < s->n; i++) {
		const struct stensor *t = &s->t[i];
		uint64_t shape[MS_ST_MAX_RANK], nb;

		if (!out_includes(o, t))
			continue;
		shard_local_shape(t, o->l, shape);
		if (shard_shape_nbytes(t->dtype, t->ndim, shape, &nb))
			return ms_err_set(err, MS_EINVAL, "tensor '%s': size overflows", t->name);
		res->ntensors++;
		res->nbytes += nb;
	}
	return MS_OK;
}

/* Write every byte of o into a new writer (buf: CHUNK bytes of scratch),
 * left uncommitted in *out: its temporary file disappears unless
 * shard_out_commit renames it into place. */
int shard_out_stream(const struct src *s, const struct outspec *o, uint8_t *buf,
		     struct ms_st_writer **out, struct ms_err *err)
{
	struct ms_st_writer *w = NULL;
	int rc;

	*out = NULL;
	if ((rc = ms_st_writer_new(o->path, 0, &w, err)) != MS_OK)
		goto out;
	for (size_t k = 0; k < o->nmeta; k++)
		if ((rc = ms_st_writer_meta(w, o->meta[k].key, o->meta[k].value, err)) != MS_OK)
			goto out;
	for (size_t i = 0; i < s->n; i++) {
		const struct stensor *t = &s->t[i];
		uint64_t shape[MS_ST_MAX_RANK];

		if (!out_includes(o, t))
			continue;
		shard_local_shape(t, o->l, shape);
		if ((rc = ms_st_writer_declare(w, t->name, t->dtype, t->ndim, shape, err)) != MS_OK)
			goto out;
	}
	for (size_t i = 0; i < s->n; i++)
		if (out_includes(o, &s->t[i]) &&
		    (rc = shard_emit(s, &s->t[i], o->ids, o->l, buf, sink_writer, w, err)) != MS_OK)
			goto out;
	*out = w;
	w = NULL;
out:
	ms_st_writer_free(w);
	return rc;
}

/* Commit w (fsync, rename) and fill res->state_digest from the digests the
 * writer computed of what it wrote. */
int shard_out_commit(const struct src *s, const struct outspec *o, struct ms_st_writer *w,
		     struct ms_shard_out_file *res, struct ms_err *err)
{
	struct ms_tensor *ts = ms_calloc(res->ntensors ? res->ntensors : 1, sizeof(*ts));
	struct ms_tensor **tp = ms_calloc(res->ntensors ? res->ntensors : 1, sizeof(*tp));
	size_t nt = 0;
	int rc;

	if (!ts || !tp) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = ms_st_writer_commit(w, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < s->n && nt < res->ntensors; i++) {
		const struct stensor *t = &s->t[i];
		const uint8_t *d;

		if (!out_includes(o, t))
			continue;
		d = ms_st_writer_digest(w, nt);
		if (!d) {
			rc = ms_err_set(err, MS_EIO, "'%s': tensor '%s' was not hashed", o->path, t->name);
			goto out;
		}
		ts[nt].name = t->name;
		ts[nt].dtype = t->dtype;
		ts[nt].ndim = t->ndim;
		shard_local_shape(t, o->l, ts[nt].shape);
		memcpy(ts[nt].digest, d, MS_SHA256_LEN);
		ts[nt].has_digest = 1;
		tp[nt] = &ts[nt];
		nt++;
	}
	rc = ms_state_digest(tp, nt, res->state_digest, err);
out:
	ms_free(ts);
	ms_free(tp);
	return rc;
}

/* ---- the manifest ---------------------------------------------------------- */

const char *shard_stem_of(const struct src *s)
{
	return s->is_adapter ? "adapter_model" : "model";
}

char *shard_name(const char *stem, uint32_t rank, uint32_t n)
{
	return ms_asprintf("%s-ep%05u-of-%05u.safetensors", stem, rank, n);
}

static cJSON *json_ids(const uint32_t *ids, uint32_t n)
{
	cJSON *a = cJSON_CreateArray();

	for (uint32_t i = 0; a && i < n; i++) {
		cJSON *v = cJSON_CreateNumber(ids[i]);

		if (!v || !cJSON_AddItemToArray(a, v)) {
			cJSON_Delete(v);
			cJSON_Delete(a);
			return NULL;
		}
	}
	return a;
}

static cJSON *json_shape(uint32_t ndim, const uint64_t *shape)
{
	cJSON *a = cJSON_CreateArray();

	for (uint32_t d = 0; a && d < ndim; d++) {
		cJSON *v = cJSON_CreateNumber((double)shape[d]);

		if (!v || !cJSON_AddItemToArray(a, v)) {
			cJSON_Delete(v);
			cJSON_Delete(a);
			return NULL;
		}
	}
	return a;
}

static cJSON *json_meta(const struct ms_st_meta *meta, size_t n)
{
	cJSON *o = cJSON_CreateObject();

	for (size_t k = 0; o && k < n; k++)
		if (!cJSON_AddStringToObject(o, meta[k].key, meta[k].value)) {
			cJSON_Delete(o);
			return NULL;
		}
	return o;
}

static int add_hex(cJSON *o, const char *key, const uint8_t *d)
{
	char hex[2 * MS_SHA256_LEN + 1];

	ms_hex(d, MS_SHA256_LEN, hex);
	return cJSON_AddStringToObject(o, key, hex) != NULL;
}

/* The manifest text of s split by pl into files (one per rank). */
int shard_manifest_text(const struct src *s, const struct ms_ep_placement *pl,
			const struct ms_shard_out_file *files, char **text, size_t *len,
			struct ms_err *err)
{
	cJSON *m = cJSON_CreateObject(), *o, *a = NULL, *x;
	char packing[48], *p = NULL;
	int ok = m != NULL;

	*text = NULL;
	shard_packing_str(s->packing, packing, sizeof(packing));
	ok = ok && cJSON_AddStringToObject(m, "format", MS_EP_MANIFEST_FORMAT);
	ok = ok && cJSON_AddNumberToObject(m, "version", MS_EP_MANIFEST_VERSION);
	ok = ok && cJSON_AddStringToObject(m, "kind", s->is_adapter ? "adapter" : "checkpoint");
	ok = ok && cJSON_AddStringToObject(m, "stem", shard_stem_of(s));
	ok = ok && cJSON_AddNumberToObject(m, "num_experts", s->E);
	ok = ok && cJSON_AddNumberToObject(m, "ep_size", pl->ep_size);
	if (ok && (o = cJSON_AddObjectToObject(m, "placement"))) {
		ok = cJSON_AddStringToObject(o, "name", ms_ep_placement_name(pl->kind)) != NULL;
		ok = ok && (a = cJSON_AddArrayToObject(o, "ranks"));
		for (uint32_t r = 0; ok && r < pl->ep_size; r++)
			ok = (x = json_ids(pl->ids + pl->first[r], pl->first[r + 1] - pl->first[r])) &&
			     cJSON_AddItemToArray(a, x);
	} else {
		ok = 0;
	}
	ok = ok && cJSON_AddStringToObject(m, "packing", packing);
	if (ok && s->r)
		ok = cJSON_AddNumberToObject(m, "r", s->r) != NULL;
	else if (ok)
		ok = cJSON_AddNullToObject(m, "r") != NULL;
	if (ok && (o = cJSON_AddObjectToObject(m, "source"))) {
		ok = cJSON_AddStringToObject(o, "state_digest", s->digest) != NULL;
		if (ok && s->index_name) {
			cJSON *ix = cJSON_AddObjectToObject(o, "index");

			ok = ix && cJSON_AddStringToObject(ix, "name", s->index_name);
			if (ok && s->index_meta)
				ok = ms_json_put(ix, "metadata", cJSON_Duplicate(s->index_meta, 1));
		} else if (ok) {
			ok = cJSON_AddNullToObject(o, "index") != NULL;
		}
		ok = ok && (a = cJSON_AddArrayToObject(o, "files"));
		for (size_t f = 0; ok && f < s->nfiles; f++) {
			ok = (x = cJSON_CreateObject()) && cJSON_AddItemToArray(a, x);
			ok = ok && cJSON_AddStringToObject(x, "name", s->files[f].name);
			ok = ok && ms_json_put(x, "metadata",
					    json_meta(s->files[f].meta, s->files[f].nmeta));
		}
	} else {
		ok = 0;
	}
	ok = ok && (a = cJSON_AddArrayToObject(m, "configs"));
	for (size_t c = 0; ok && c < s->nconfigs; c++) {
		ok = (x = cJSON_CreateObject()) && cJSON_AddItemToArray(a, x);
		ok = ok && cJSON_AddStringToObject(x, "name", s->configs[c].name);
		ok = ok && add_hex(x, "sha256", s->configs[c].digest);
	}
	ok = ok && (a = cJSON_AddArrayToObject(m, "shards"));
	for (uint32_t r = 0; ok && r < pl->ep_size; r++) {
		ok = (x = cJSON_CreateObject()) && cJSON_AddItemToArray(a, x);
		ok = ok && cJSON_AddNumberToObject(x, "rank", r);
		ok = ok && cJSON_AddStringToObject(x, "file", ms_path_base(files[r].path));
		ok = ok && ms_json_put(x, "experts", json_ids(files[r].experts, files[r].nexperts));
		ok = ok && cJSON_AddStringToObject(x, "state_digest", files[r].state_digest);
	}
	ok = ok && (a = cJSON_AddArrayToObject(m, "tensors"));
	for (size_t i = 0; ok && i < s->n; i++) {
		const struct stensor *t = &s->t[i];

		ok = (x = cJSON_CreateObject()) && cJSON_AddItemToArray(a, x);
		ok = ok && cJSON_AddStringToObject(x, "name", t->name);
		ok = ok && cJSON_AddStringToObject(x, "dtype", ms_dtype_name(t->dtype));
		ok = ok && ms_json_put(x, "shape", json_shape(t->ndim, t->shape));
		ok = ok && add_hex(x, "sha256", t->digest);
		ok = ok && cJSON_AddNumberToObject(x, "file", t->file);
		ok = ok && cJSON_AddStringToObject(x, "kind", shard_tkind_names[t->kind]);
		if (ok && t->kind == TK_EXPERT)
			ok = cJSON_AddNumberToObject(x, "expert", t->expert) != NULL;
		if (ok && t->kind != TK_REPLICATED)
			ok = cJSON_AddStringToObject(x, "param", t->param) &&
			     cJSON_AddStringToObject(x, "part", t->part);
		if (ok && (t->kind == TK_FUSED_A || t->kind == TK_FUSED_B))
			ok = cJSON_AddNumberToObject(x, "r", t->r) != NULL;
	}
	ok = ok && (a = cJSON_AddArrayToObject(m, "experts"));
	for (size_t i = 0; ok && i < s->nrec; i++) {
		const struct srec *r = &s->rec[i];
		const struct stensor *t = &s->t[r->tensor];

		ok = (x = cJSON_CreateObject()) && cJSON_AddItemToArray(a, x);
		if (ok && t->layer >= 0)
			ok = cJSON_AddNumberToObject(x, "layer", t->layer) != NULL;
		ok = ok && cJSON_AddNumberToObject(x, "expert", r->expert);
		ok = ok && cJSON_AddStringToObject(x, "param", t->param);
		ok = ok && cJSON_AddStringToObject(x, "part", t->part);
		ok = ok && cJSON_AddStringToObject(x, "tensor", t->name);
		ok = ok && add_hex(x, "sha256", r->got);
	}
	if (ok)
		p = cJSON_Print(m);
	cJSON_Delete(m);
	if (!p)
		return ms_err_nomem(err);
	*len = strlen(p);
	*text = ms_malloc(*len + 2);
	if (*text) {
		memcpy(*text, p, *len);
		(*text)[(*len)++] = '\n';
		(*text)[*len] = '\0';
	}
	cJSON_free(p);
	return *text ? MS_OK : ms_err_nomem(err);
}

/* ---- results --------------------------------------------------------------- */

void ms_shard_result_free(struct ms_shard_result *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->nfiles; i++) {
		ms_free(r->files[i].path);
		ms_free(r->files[i].experts);
	}
	ms_free(r->files);
	ms_free(r->manifest_path);
	ms_ep_placement_free(r->placement);
	for (size_t i = 0; i < r->nfaults; i++) {
		ms_free(r->faults[i].tensor);
		ms_free(r->faults[i].file);
		ms_free(r->faults[i].msg);
	}
	ms_free(r->faults);
	ms_free(r);
}

int shard_result_new(const struct src *s, const struct ms_ep_placement *pl, size_t nfiles,
		     struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_shard_result *r = ms_calloc(1, sizeof(*r));
	int rc;

	*out = NULL;
	if (!r)
		return ms_err_nomem(err);
	r->is_adapter = s->is_adapter;
	memcpy(r->source_digest, s->digest, sizeof(r->source_digest));
	r->num_experts = s->E;
	r->ep_size = pl->ep_size;
	shard_packing_str(s->packing, r->packing, sizeof(r->packing));
	r->r = s->r;
	for (size_t i = 0; i < s->n; i++) {
		if (s->t[i].kind == TK_REPLICATED)
			r->nreplicated++;
		else
			r->nrouted++;
	}
	r->files = ms_calloc(nfiles ? nfiles : 1, sizeof(*r->files));
	if (!r->files) {
		ms_shard_result_free(r);
		return ms_err_nomem(err);
	}
	r->nfiles = nfiles;
	if ((rc = shard_placement_copy(pl, &r->placement, err)) != MS_OK) {
		ms_shard_result_free(r);
		return rc;
	}
	*out = r;
	return MS_OK;
}
