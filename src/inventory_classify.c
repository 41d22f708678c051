/*
 * inventory_classify.c: what the files of a checkpoint say it is (kind,
 * layout, EP rank), read from its metadata and configs before it is added.
 */
#include "inventory_int.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sqlite3.h>

#include "fsutil.h"
#include "hash.h"
#include "names.h"

/* ---- what the files say ----------------------------------------------------------- */

/* The layouts an msinv.nvfp4 metadata value declares: the JSON object
 * msconvert writes, whose "layouts" array lists "rowwise" and/or
 * "columnwise" (quant.h), a "layout" member, or the word alone. 0: unknown,
 * 1 rowwise, 2 columnwise, 3 both; -1: out of memory (a columnwise file
 * must not pass for one that says nothing). */
static int meta_layout(const char *v)
{
	cJSON *o;
	int r = 0, nomem;

	if (!v)
		return 0;
	if (!strcmp(v, "rowwise"))
		return 1;
	if (!strcmp(v, "columnwise"))
		return 2;
	if (!strcmp(v, "both"))
		return 3;
	o = ms_json_parse(v, strlen(v), &nomem);
	if (nomem)
		return -1;
	if (cJSON_IsObject(o)) {
		cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "layout");
		cJSON *ls = cJSON_GetObjectItemCaseSensitive(o, "layouts"), *it;

		if (!cJSON_IsArray(ls))
			ls = NULL;
		cJSON_ArrayForEach(it, ls) {
			if (cJSON_IsString(it) && !strcmp(it->valuestring, "rowwise"))
				r |= 1;
			if (cJSON_IsString(it) && !strcmp(it->valuestring, "columnwise"))
				r |= 2;
		}
		if (!r && cJSON_IsString(l))
			r = !strcmp(l->valuestring, "rowwise") ? 1 :
			    !strcmp(l->valuestring, "columnwise") ? 2 :
			    !strcmp(l->valuestring, "both") ? 3 : 0;
	}
	cJSON_Delete(o);
	return r;
}

/* Expert ids: a JSON array of integers or "0,1,2"; canonical "[0,1,2]". */
static int parse_experts(const char *v, const char *file, char **out, struct ms_err *err)
{
	struct ms_buf b;
	cJSON *a = NULL;
	int rc = MS_OK, first = 1, bad = 0, nomem;

	*out = NULL;
	ms_buf_init(&b);
	ms_buf_puts(&b, "[");
	if (v[0] == '[') {
		cJSON *it;

		a = ms_json_parse(v, strlen(v), &nomem);
		if (nomem) {
			rc = inv_oom(err);
			goto out;
		}
		bad = !cJSON_IsArray(a);
		if (bad) {
			cJSON_Delete(a);
			a = NULL;
		}
		cJSON_ArrayForEach(it, a) {
			if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e9 ||
			    it->valuedouble != (double)(int64_t)it->valuedouble) {
				bad = 1;
				break;
			}
			ms_buf_printf(&b, first ? "%lld" : ",%lld", (long long)it->valuedouble);
			first = 0;
		}
	} else {
		for (const char *p = v; *p && !bad;) {
			char num[24];
			size_t n = strcspn(p, ",");
			uint64_t x = 0;

			if (n == 0 || n >= sizeof(num)) {
				bad = 1;
				break;
			}
			memcpy(num, p, n);
			num[n] = 0;
			bad = ms_parse_u64(num, 1000000000u, &x) != MS_OK;
			ms_buf_printf(&b, first ? "%llu" : ",%llu", (unsigned long long)x);
			first = 0;
			p += n;
			if (*p == ',' && !*++p)
				bad = 1; /* a trailing comma */
		}
	}
	ms_buf_puts(&b, "]");
	if (bad) {
		rc = ms_err_set(err, MS_EINVAL,
				"'%s': metadata msinv.ep.experts '%s' is not a list of expert ids", file, v);
		goto out;
	}
	if (b.oom) {
		rc = inv_oom(err);
		goto out;
	}
	*out = ms_buf_detach(&b, NULL);
out:
	cJSON_Delete(a);
	ms_buf_release(&b);
	return rc;
}

static int ep_meta(const struct ms_ckpt *c, struct classify *k, struct ms_err *err)
{
	const char *first = NULL, *none = NULL;

	for (size_t i = 0; i < c->nfiles; i++) {
		const struct ms_st_file *f = c->files[i];
		const char *r = ms_st_meta_get(f, "msinv.ep.rank");
		const char *s = ms_st_meta_get(f, "msinv.ep.size");
		const char *e = ms_st_meta_get(f, "msinv.ep.experts");
		uint64_t rank, size;
		char *experts = NULL;
		int rc;

		if (!r && !s && !e) {
			if (!none)
				none = f->path;
			continue;
		}
		if (!r || !s)
			return ms_err_set(err, MS_EINVAL,
					  "'%s': EP shard metadata needs both msinv.ep.rank and msinv.ep.size",
					  f->path);
		if (ms_parse_u64(s, 1u << 20, &size) || size == 0)
			return ms_err_set(err, MS_EINVAL,
					  "'%s': metadata msinv.ep.size '%s' is not a positive integer",
					  f->path, s);
		if (ms_parse_u64(r, 1u << 20, &rank) || rank >= size)
			return ms_err_set(err, MS_EINVAL,
					  "'%s': metadata msinv.ep.rank '%s' is not a rank below msinv.ep.size %llu",
					  f->path, r, (unsigned long long)size);
		if (e && (rc = parse_experts(e, f->path, &experts, err)) != MS_OK)
			return rc;
		if (!first) {
			first = f->path;
			k->ep_size = (int32_t)size;
			k->ep_rank = (int32_t)rank;
			k->experts = experts;
			continue;
		}
		if (k->ep_size != (int32_t)size || k->ep_rank != (int32_t)rank ||
		    (experts == NULL) != (k->experts == NULL) ||
		    (experts && strcmp(experts, k->experts))) {
			ms_free(experts);
			return ms_err_set(err, MS_EINVAL,
					  "'%s' and '%s' disagree on their EP shard metadata (msinv.ep.*): each rank's shard is a state of its own, add its file alone",
					  first, f->path);
		}
		ms_free(experts);
	}
	if (first && none)
		return ms_err_set(err, MS_EINVAL,
				  "'%s' has EP shard metadata (msinv.ep.*) but '%s' has none", first, none);
	return MS_OK;
}

struct modinfo {
	const struct ms_tensor *t;
	uint32_t module_len;
	struct ms_name_info info;
	int file_layout;   /* meta_layout of its file */
};

static int cmp_mod(const void *a, const void *b)
{
	const struct modinfo *x = a, *y = b;
	uint32_t n = x->module_len < y->module_len ? x->module_len : y->module_len;
	int c = memcmp(x->t->name, y->t->name, n);

	if (c)
		return c;
	return x->module_len < y->module_len ? -1 : x->module_len > y->module_len;
}

static int is_float(enum ms_dtype d)
{
	switch (d) {
	case MS_DTYPE_F16: case MS_DTYPE_BF16: case MS_DTYPE_F32: case MS_DTYPE_F64:
	case MS_DTYPE_F8_E4M3: case MS_DTYPE_F8_E5M2: case MS_DTYPE_F8_E4M3FNUZ:
	case MS_DTYPE_F8_E5M2FNUZ: case MS_DTYPE_F4: case MS_DTYPE_F6_E2M3:
	case MS_DTYPE_F6_E3M2:
		return 1;
	default:
		return 0;
	}
}

/*
 * NVFP4 weights are a U8 weight (.weight / .weight_packed) with an F8_E4M3
 * .weight_scale companion of the same module: rowwise, unless the file's
 * msinv.nvfp4 metadata says it holds columnwise copies; a U8 .weight_colwise
 * / .weight_packed_colwise with an F8_E4M3 colwise scale is columnwise.
 * Otherwise the layout is the dtype of the floating matrices (ndim >= 2,
 * scales aside) when they share one, else "mixed".
 */
static int classify_layout(const struct ms_ckpt *c, struct classify *k, struct ms_err *err)
{
	struct modinfo *m = NULL;
	size_t n = c->ntensors, fi = 0;
	int row = 0, col = 0, lora = 0, *layouts = NULL, rc = MS_OK;
	const char *row_example = NULL;
	int dt_seen = -1, dt_mixed = 0;

	/* the metadata is parsed once per file: it lists every quantized
	 * module, so once per tensor would be quadratic in the model's size */
	m = ms_calloc(n ? n : 1, sizeof(*m));
	layouts = ms_calloc(c->nfiles ? c->nfiles : 1, sizeof(*layouts));
	if (!m || !layouts) {
		rc = inv_oom(err);
		goto out;
	}
	for (size_t f = 0; f < c->nfiles; f++)
		if ((layouts[f] = meta_layout(ms_st_meta_get(c->files[f], "msinv.nvfp4"))) < 0) {
			rc = inv_oom(err);
			goto out;
		}
	for (size_t i = 0; i < n; i++) {
		const struct ms_tensor *t = c->tensors[i];

		m[i].t = t;
		if (ms_name_parse(t->name, &m[i].info) != MS_OK) {
			memset(&m[i].info, 0, sizeof(m[i].info));
			m[i].info.module_len = (uint32_t)strlen(t->name);
		}
		m[i].module_len = m[i].info.module_len;
		/* names sort across files: the last file is the usual match */
		if (fi >= c->nfiles || c->files[fi] != t->file)
			for (fi = 0; fi < c->nfiles && c->files[fi] != t->file; fi++)
				;
		m[i].file_layout = fi < c->nfiles ? layouts[fi]
				 : meta_layout(ms_st_meta_get(t->file, "msinv.nvfp4"));
		if (m[i].file_layout < 0) {
			rc = inv_oom(err);
			goto out;
		}
		if (m[i].info.role == MS_NAME_ROLE_LORA_A || m[i].info.role == MS_NAME_ROLE_LORA_B)
			lora = 1;
		if (t->ndim >= 2 && is_float(t->dtype) && m[i].info.role != MS_NAME_ROLE_SCALE &&
		    m[i].info.role != MS_NAME_ROLE_COLWISE_SCALE) {
			if (dt_seen < 0)
				dt_seen = (int)t->dtype;
			else if (dt_seen != (int)t->dtype)
				dt_mixed = 1;
		}
	}
	qsort(m, n, sizeof(*m), cmp_mod);
	for (size_t i = 0; i < n;) {
		size_t j = i;
		int w = 0, s = 0, cw = 0, cs = 0, fl = m[i].file_layout;
		const char *wname = NULL;

		while (j < n && !cmp_mod(&m[i], &m[j])) {
			const struct ms_name_info *in = &m[j].info;
			enum ms_dtype d = m[j].t->dtype;

			if (in->role == MS_NAME_ROLE_WEIGHT && d == MS_DTYPE_U8 && !in->colwise) {
				w = 1;
				wname = m[j].t->name;
			}
			if (in->role == MS_NAME_ROLE_SCALE && d == MS_DTYPE_F8_E4M3 && !in->colwise)
				s = 1;
			if (in->role == MS_NAME_ROLE_COLWISE && d == MS_DTYPE_U8)
				cw = 1;
			if (in->role == MS_NAME_ROLE_COLWISE_SCALE && d == MS_DTYPE_F8_E4M3)
				cs = 1;
			j++;
		}
		if (w && s) {
			if (fl == 2)
				col = 1;
			else
				row = 1;
			if (!row_example)
				row_example = wname;
		}
		if (cw && cs) {
			col = 1;
			if (!row_example)
				row_example = m[i].t->name;
		}
		i = j;
	}
	if (row || col) {
		snprintf(k->layout, sizeof(k->layout), "nvfp4-%s",
			 row && col ? "both" : row ? "rowwise" : "columnwise");
		if (k->kind == MS_INV_KIND_ANY) {
			k->kind = MS_INV_KIND_QUANTIZED;
			snprintf(k->why, sizeof(k->why),
				 "they hold NVFP4 weights (U8 '%s' with an F8_E4M3 scale)", row_example);
		}
	} else if (dt_seen < 0) {
		snprintf(k->layout, sizeof(k->layout), "%s", n ? "other" : "empty");
	} else if (dt_mixed) {
		snprintf(k->layout, sizeof(k->layout), "mixed");
	} else {
		const char *nm = ms_dtype_name((enum ms_dtype)dt_seen);
		size_t l = 0;

		for (; nm[l] && l + 1 < sizeof(k->layout); l++)
			k->layout[l] = (char)tolower((unsigned char)nm[l]);
		k->layout[l] = 0;
	}
	if (lora && k->kind == MS_INV_KIND_ANY) {
		k->kind = MS_INV_KIND_ADAPTER;
		snprintf(k->why, sizeof(k->why), "they hold LoRA factors");
	}
out:
	ms_free(m);
	ms_free(layouts);
	return rc;
}

int inv_classify_ckpt(const struct ms_ckpt *c, struct classify *k, struct ms_err *err)
{
	int rc;

	memset(k, 0, sizeof(*k));
	k->kind = MS_INV_KIND_ANY;
	k->ep_size = k->ep_rank = -1;
	if ((rc = ep_meta(c, k, err)) != MS_OK) {
		ms_free(k->experts);
		k->experts = NULL;
		return rc;
	}
	if (k->ep_size > 0) {
		k->kind = MS_INV_KIND_ADAPTER_SHARD;
		snprintf(k->why, sizeof(k->why), "they are EP shard %d of %d (msinv.ep.* metadata)",
			 k->ep_rank, k->ep_size);
	} else if (c->is_adapter) {
		k->kind = MS_INV_KIND_ADAPTER;
		snprintf(k->why, sizeof(k->why), "they are an adapter (adapter_config.json)");
	}
	if ((rc = classify_layout(c, k, err)) != MS_OK) {
		ms_free(k->experts);
		k->experts = NULL;
	}
	return rc;
}

int ms_inv_classify(const struct ms_ckpt *c, enum ms_inv_kind *kind, char *layout,
		    size_t layout_len, int32_t *ep_size, int32_t *ep_rank, char **experts,
		    struct ms_err *err)
{
	struct classify k;
	int rc = inv_classify_ckpt(c, &k, err);

	if (rc != MS_OK)
		return rc;
	*kind = k.kind;
	snprintf(layout, layout_len, "%s", k.layout);
	*ep_size = k.ep_size;
	*ep_rank = k.ep_rank;
	if (experts)
		*experts = k.experts;
	else
		ms_free(k.experts);
	return MS_OK;
}

/* May a state the files describe as said be recorded as wanted? An adapter
 * may be sharded or be part of a served policy; a quantized state may be
 * served. */
int inv_kind_compatible(enum ms_inv_kind said, enum ms_inv_kind wanted)
{
	if (said == MS_INV_KIND_ANY || said == wanted)
		return 1;
	if (said == MS_INV_KIND_ADAPTER &&
	    (wanted == MS_INV_KIND_ADAPTER_SHARD || wanted == MS_INV_KIND_POLICY))
		return 1;
	return said == MS_INV_KIND_QUANTIZED && wanted == MS_INV_KIND_POLICY;
}
