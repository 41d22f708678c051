/*
 * shard_src.c: the source model every sharding operation works on
 * (struct src, shard_int.h): releasing and measuring it, and reading it
 * from a checkpoint to split.
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

/* ---- the source model ------------------------------------------------------ */

const char *const shard_tkind_names[TK_COUNT] = {
	"replicated", "expert", "fused-lora-a", "fused-lora-b", "grouped",
};

void shard_src_release(struct src *s)
{
	for (size_t i = 0; i < s->n; i++) {
		struct stensor *t = &s->t[i];

		ms_free(t->name);
		ms_free(t->param);
		ms_free(t->part);
		ms_free(t->edata);
		ms_free(t->epos);
		ms_free(t->en);
	}
	ms_free(s->t);
	for (size_t i = 0; i < s->nfiles; i++) {
		ms_free(s->files[i].name);
		for (size_t k = 0; k < s->files[i].nmeta; k++) {
			ms_free(s->files[i].meta[k].key);
			ms_free(s->files[i].meta[k].value);
		}
		ms_free(s->files[i].meta);
	}
	ms_free(s->files);
	for (size_t i = 0; i < s->nconfigs; i++) {
		ms_free(s->configs[i].name);
		ms_free(s->configs[i].text);
	}
	ms_free(s->configs);
	ms_free(s->index_name);
	cJSON_Delete(s->index_meta);
	ms_free(s->rec);
	memset(s, 0, sizeof(*s));
}

const struct sconfig *shard_src_config(const struct src *s, const char *name)
{
	for (size_t i = 0; i < s->nconfigs; i++)
		if (!strcmp(s->configs[i].name, name))
			return &s->configs[i];
	return NULL;
}

int shard_is_sliced(enum tkind k)
{
	return k == TK_FUSED_A || k == TK_FUSED_B || k == TK_GROUPED;
}

/* Bytes of one expert's slice of a sliced tensor (whole rows of A or of a
 * grouped tensor; B has no contiguous slice and is handled elementwise). */
uint64_t shard_slice_bytes(const struct stensor *t, uint32_t e_total)
{
	return t->nbytes / e_total;
}

/* Shape of tensor t when it holds l experts. */
void shard_local_shape(const struct stensor *t, uint32_t l, uint64_t *shape)
{
	memcpy(shape, t->shape, sizeof(t->shape));
	if (t->kind == TK_FUSED_A)
		shape[0] = (uint64_t)l * t->r;
	else if (t->kind == TK_FUSED_B)
		shape[1] = (uint64_t)l * t->r;
	else if (t->kind == TK_GROUPED)
		shape[0] = l;
}

int shard_shape_nbytes(enum ms_dtype dt, uint32_t ndim, const uint64_t *shape,
			uint64_t *out)
{
	uint64_t ne = 1;

	for (uint32_t d = 0; d < ndim; d++)
		if (ms_mul_u64(ne, shape[d], &ne))
			return -1;
	return ms_dtype_nbytes(dt, ne, out) ? -1 : 0;
}

void shard_shape_text(uint32_t ndim, const uint64_t *shape, char *buf, size_t n)
{
	size_t k = 0;

	k += (size_t)snprintf(buf, n, "[");
	for (uint32_t d = 0; d < ndim && k < n; d++)
		k += (size_t)snprintf(buf + k, n - k, d ? ",%llu" : "%llu",
				      (unsigned long long)shape[d]);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

/* ---- reading a checkpoint to split ---------------------------------------- */

static int copy_meta(const struct ms_st_file *f, struct sfile *out, struct ms_err *err)
{
	out->meta = ms_calloc(f->nmeta ? f->nmeta : 1, sizeof(*out->meta));
	if (!out->meta)
		return ms_err_nomem(err);
	for (size_t k = 0; k < f->nmeta; k++) {
		out->meta[k].key = ms_strdup(f->meta[k].key);
		out->meta[k].value = ms_strdup(f->meta[k].value);
		out->nmeta = k + 1;
		if (!out->meta[k].key || !out->meta[k].value)
			return ms_err_nomem(err);
	}
	return MS_OK;
}

int shard_src_add_config(struct src *s, const char *name, const char *text, size_t len,
			 const uint8_t *digest, struct ms_err *err)
{
	struct sconfig *nc = ms_realloc(s->configs, (s->nconfigs + 1) * sizeof(*nc));
	struct sconfig *c;

	if (!nc)
		return ms_err_nomem(err);
	s->configs = nc;
	c = &nc[s->nconfigs];
	memset(c, 0, sizeof(*c));
	c->name = ms_strdup(name);
	c->text = ms_malloc(len + 1);
	if (!c->name || !c->text) {
		ms_free(c->name);
		ms_free(c->text);
		return ms_err_nomem(err);
	}
	memcpy(c->text, text, len);
	c->text[len] = '\0';
	c->len = len;
	memcpy(c->digest, digest, MS_SHA256_LEN);
	s->nconfigs++;
	return MS_OK;
}

static int read_index_meta(struct src *s, const char *path, struct ms_err *err)
{
	char *text = NULL;
	size_t len;
	cJSON *root = NULL, *meta;
	int rc, nomem;

	if ((rc = ms_file_read(path, MS_CKPT_MAX_INDEX, &text, &len, err)) != MS_OK)
		return rc;
	root = ms_json_parse(text, len, &nomem);
	ms_free(text);
	if (nomem)
		return ms_err_nomem(err);
	if (!root || !cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return ms_err_set(err, MS_EINVAL, "'%s': not a JSON object", path);
	}
	meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
	if (meta && cJSON_IsObject(meta)) {
		s->index_meta = cJSON_Duplicate(meta, 1);
		if (!s->index_meta)
			rc = ms_err_nomem(err);
	}
	cJSON_Delete(root);
	s->index_name = ms_strdup(ms_path_base(path));
	if (rc == MS_OK && !s->index_name)
		rc = ms_err_nomem(err);
	return rc;
}

int shard_src_from_ckpt(struct src *s, const struct ms_ckpt *c, struct ms_err *err)
{
	size_t n = 0, k = 0;
	int rc;

	s->is_adapter = c->is_adapter;
	for (size_t i = 0; i < c->nconfigs; i++)
		if (!strcmp(c->configs[i].name, MS_EP_MANIFEST))
			return ms_err_set(err, MS_EINVAL, "'%s' is an EP shard set: use msshard reshard "
					  "or msshard merge on it", s->label);
	s->files = ms_calloc(c->nfiles ? c->nfiles : 1, sizeof(*s->files));
	if (!s->files)
		return ms_err_nomem(err);
	for (size_t i = 0; i < c->nfiles; i++) {
		const struct ms_st_file *f = c->files[i];
		const char *rank = ms_st_meta_get(f, META_PREFIX "rank");

		if (rank)
			return ms_err_set(err, MS_EINVAL, "'%s' is already an EP shard (rank %s of %s): "
					  "split its source, or use msshard reshard on its set",
					  f->path, rank,
					  ms_st_meta_get(f, META_PREFIX "size") ?
					  ms_st_meta_get(f, META_PREFIX "size") : "?");
		s->nfiles = i + 1;
		if (!(s->files[i].name = ms_strdup(c->file_names[i])))
			return ms_err_nomem(err);
		if ((rc = copy_meta(f, &s->files[i], err)) != MS_OK)
			return rc;
		n += f->ntensors;
	}
	for (size_t i = 0; i < c->nconfigs; i++) {
		/* every output lays the tensors out anew and writes its own
		 * index (or none): the input's is not carried */
		if (c->index_path && !strcmp(c->configs[i].name, ms_path_base(c->index_path)))
			continue;
		if ((rc = shard_src_add_config(s, c->configs[i].name, c->configs[i].text, c->configs[i].len,
					       c->configs[i].digest, err)) != MS_OK)
			return rc;
	}
	if (c->index_path && (rc = read_index_meta(s, c->index_path, err)) != MS_OK)
		return rc;
	s->t = ms_calloc(n ? n : 1, sizeof(*s->t));
	if (!s->t)
		return ms_err_nomem(err);
	for (size_t i = 0; i < c->nfiles; i++) {
		const struct ms_st_file *f = c->files[i];

		for (size_t j = 0; j < f->ntensors; j++) {
			const struct ms_tensor *x = &f->tensors[j];
			struct stensor *t = &s->t[k];

			if (!(t->name = ms_strdup(x->name)))
				return ms_err_nomem(err);
			s->n = ++k;
			t->dtype = x->dtype;
			t->ndim = x->ndim;
			memcpy(t->shape, x->shape, sizeof(t->shape));
			t->nbytes = x->nbytes;
			t->file = (uint32_t)i;
			t->data = x->data;
			t->st = x;
		}
	}
	return MS_OK;
}

/* Sliced tensors of a checkpoint: every expert in the one source tensor. */
int shard_src_point_whole(struct src *s, struct ms_err *err)
{
	for (size_t i = 0; i < s->n; i++) {
		struct stensor *t = &s->t[i];

		if (!shard_is_sliced(t->kind))
			continue;
		t->edata = ms_calloc(s->E, sizeof(*t->edata));
		t->epos = ms_calloc(s->E, sizeof(*t->epos));
		t->en = ms_calloc(s->E, sizeof(*t->en));
		if (!t->edata || !t->epos || !t->en)
			return ms_err_nomem(err);
		for (uint32_t e = 0; e < s->E; e++) {
			t->edata[e] = t->data;
			t->epos[e] = e;
			t->en[e] = s->E;
		}
	}
	return MS_OK;
}

/* The state digest of s from its tensors' (source) digests. */
int shard_src_state_digest(const struct src *s, char out[MS_STATE_DIGEST_LEN],
			   struct ms_err *err)
{
	struct ms_tensor *ts = ms_calloc(s->n ? s->n : 1, sizeof(*ts));
	struct ms_tensor **tp = ms_calloc(s->n ? s->n : 1, sizeof(*tp));
	int rc;

	if (!ts || !tp) {
		ms_free(ts);
		ms_free(tp);
		return ms_err_nomem(err);
	}
	for (size_t i = 0; i < s->n; i++) {
		ts[i].name = s->t[i].name;
		ts[i].dtype = s->t[i].dtype;
		ts[i].ndim = s->t[i].ndim;
		memcpy(ts[i].shape, s->t[i].shape, sizeof(ts[i].shape));
		ts[i].nbytes = s->t[i].nbytes;
		memcpy(ts[i].digest, s->t[i].digest, MS_SHA256_LEN);
		ts[i].has_digest = s->t[i].has_digest;
		tp[i] = &ts[i];
	}
	rc = ms_state_digest(tp, s->n, out, err);
	ms_free(ts);
	ms_free(tp);
	return rc;
}
