/*
 * quant.c: checkpoint-level NVFP4 conversion (see quant.h for the on-disk
 * names and the metadata): tensor selection, fused tensor-scale groups,
 * reading quantized checkpoints of both flavors, planning quantize,
 * dequantize and transpose, writing the outputs and their configuration
 * files, and the quantization statistics.
 */
#include "quant.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fsutil.h"
#ifdef MS_QUANT_GPU
#include "gpu.h"
#endif
#include "hash.h"
#include "names.h"



#define INDEX_NAME "model.safetensors.index.json"
#define MAX_COPY_FILE (4ull << 30) /* other files of a checkpoint directory */

/* Tensor name suffixes by format f and layout l, from the table the name
 * parser reads them with (names.h), so that what is written is what is
 * recognized. */
static const char *sfx_packed(int f, int l)
{
	return ms_name_nvfp4_suffix(l ? MS_NAME_ROLE_COLWISE : MS_NAME_ROLE_WEIGHT, (unsigned)f);
}

static const char *sfx_scales(int f, int l)
{
	return ms_name_nvfp4_suffix(l ? MS_NAME_ROLE_COLWISE_SCALE : MS_NAME_ROLE_SCALE,
				    (unsigned)f);
}

static const char *sfx_tscale(int f)
{
	return ms_name_nvfp4_suffix(f ? MS_NAME_ROLE_GLOBAL_SCALE : MS_NAME_ROLE_SCALE2,
				    (unsigned)f);
}

static const char *sfx_input(int f)
{
	return ms_name_nvfp4_suffix(MS_NAME_ROLE_INPUT_SCALE, (unsigned)f);
}

const char *ms_quant_format_name(enum ms_quant_format f)
{
	return f == MS_QUANT_FORMAT_COMPRESSED_TENSORS ? "compressed-tensors" : "modelopt";
}

int ms_quant_format_parse(const char *s, enum ms_quant_format *out)
{
	if (!strcmp(s, "modelopt"))
		*out = MS_QUANT_FORMAT_MODELOPT;
	else if (!strcmp(s, "compressed-tensors"))
		*out = MS_QUANT_FORMAT_COMPRESSED_TENSORS;
	else
		return MS_EINVAL;
	return MS_OK;
}

int ms_quant_device_parse(const char *s, enum ms_quant_device *out)
{
	if (!strcmp(s, "auto"))
		*out = MS_QUANT_DEVICE_AUTO;
	else if (!strcmp(s, "cpu"))
		*out = MS_QUANT_DEVICE_CPU;
	else if (!strcmp(s, "cuda"))
		*out = MS_QUANT_DEVICE_CUDA;
	else
		return MS_EINVAL;
	return MS_OK;
}

const char *ms_quant_experts_name(enum ms_quant_experts e)
{
	return e == MS_QUANT_EXPERTS_FUSED ? "fused" : "per-expert";
}

int ms_quant_experts_parse(const char *s, enum ms_quant_experts *out)
{
	if (!strcmp(s, "per-expert"))
		*out = MS_QUANT_EXPERTS_PER_EXPERT;
	else if (!strcmp(s, "fused"))
		*out = MS_QUANT_EXPERTS_FUSED;
	else
		return MS_EINVAL;
	return MS_OK;
}

enum ms_quant_format ms_quant_default_format(enum ms_nvfp4_recipe r)
{
	return r == MS_NVFP4_RECIPE_COMPRESSED_TENSORS ? MS_QUANT_FORMAT_COMPRESSED_TENSORS
						       : MS_QUANT_FORMAT_MODELOPT;
}

static int is_float(enum ms_dtype dt)
{
	return dt == MS_DTYPE_BF16 || dt == MS_DTYPE_F16 || dt == MS_DTYPE_F32;
}

static int quantizable(const struct ms_tensor *t)
{
	return is_float(t->dtype) && t->ndim == 2 && ms_str_ends_with(t->name, ".weight") &&
	       strlen(t->name) > 7;
}

static int fused_experts_of(const struct ms_tensor *t)
{
	return ms_name_fused_experts(t->name, t->dtype, t->ndim, t->shape);
}

int ms_quant_default_selected(const struct ms_tensor *t)
{
	struct ms_name_info info;

	if (fused_experts_of(t))
		return 1;
	return ms_name_parse(t->name, &info) == MS_OK &&
	       ms_name_quantizable(t->name, &info, t->dtype, t->ndim, NULL);
}

int ms_quant_fuse_key(const char *name, char *buf, size_t n)
{
	static const struct { const char *leaf, *group; } groups[] = {
		{"q_proj", "{qkv}"}, {"k_proj", "{qkv}"}, {"v_proj", "{qkv}"},
		{"gate_proj", "{gate_up}"}, {"up_proj", "{gate_up}"},
		{"w1", "{w13}"}, {"w3", "{w13}"},
		/* DeepSeek's multi-latent attention: both read the hidden
		 * state (llm-compressor's FUSED_LAYER_NAMES, Model Optimizer's
		 * shared-input fusion at export) */
		{"q_a_proj", "{mla_a}"}, {"kv_a_proj_with_mqa", "{mla_a}"},
	};
	size_t len = strlen(name), plen;
	const char *leaf;

	if (!ms_str_ends_with(name, ".weight"))
		return 0;
	plen = len - 7;
	leaf = name + plen;
	while (leaf > name && leaf[-1] != '.')
		leaf--;
	if (leaf == name)
		return 0;
	for (size_t i = 0; i < sizeof(groups) / sizeof(groups[0]); i++) {
		size_t ll = strlen(groups[i].leaf);

		if ((size_t)(name + plen - leaf) == ll && !strncmp(leaf, groups[i].leaf, ll)) {
			int k = snprintf(buf, n, "%.*s%s", (int)(leaf - name), name,
					 groups[i].group);

			return k > 0 && (size_t)k < n;
		}
	}
	return 0;
}

/* Index of a tensor of c in c->tensors (sorted by name). */
static size_t ckpt_index(const struct ms_ckpt *c, const struct ms_tensor *t)
{
	size_t lo = 0, hi = c->ntensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int r = strcmp(c->tensors[mid]->name, t->name);

		if (r == 0)
			return mid;
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return c->ntensors;
}

static const struct ms_tensor *find_sfx(const struct ms_ckpt *c, const char *prefix,
					const char *sfx)
{
	char name[MS_ST_MAX_NAME + 64];

	if ((size_t)snprintf(name, sizeof(name), "%s%s", prefix, sfx) >= sizeof(name))
		return NULL;
	return ms_ckpt_find(c, name);
}

static size_t file_index(const struct ms_ckpt *c, const struct ms_st_file *f)
{
	for (size_t i = 0; i < c->nfiles; i++)
		if (c->files[i] == f)
			return i;
	return 0;
}

static float read_f32(const uint8_t *p)
{
	uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
		     (uint32_t)p[3] << 24;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static void write_f32(uint8_t *p, float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(u >> (8 * i));
}

/* A 2-D view of rows [r0, r0 + nrows) of expert e of a 3-D tensor t
 * (named as t, for lookups and messages; the bytes are t's). */
static void slice_view(const struct ms_tensor *t, uint64_t e, uint64_t r0, uint64_t nrows,
		       struct ms_tensor *v)
{
	uint64_t rowb = t->nbytes / (t->shape[0] * t->shape[1]);

	memset(v, 0, sizeof(*v));
	v->name = t->name;
	v->dtype = t->dtype;
	v->ndim = 2;
	v->shape[0] = nrows;
	v->shape[1] = t->shape[2];
	v->nelem = nrows * t->shape[2];
	v->nbytes = nrows * rowb;
	v->offset = t->offset + (e * t->shape[1] + r0) * rowb;
	v->data = t->data ? t->data + (e * t->shape[1] + r0) * rowb : NULL;
	v->file = t->file;
}

/* The high-precision weight of module prefix in c: "<prefix>.weight", or
 * for a per-expert name "<m>.experts.<e>.<proj>" (gate_proj, up_proj,
 * gate_up_proj, down_proj) the slice of expert e of the fused 3-D tensor
 * "<m>.experts.gate_up_proj" / ".down_proj" (a view written into *tmp). */
static const struct ms_tensor *source_weight(const struct ms_ckpt *c, const char *prefix,
					     struct ms_tensor *tmp)
{
	char name[MS_ST_MAX_NAME + 64];
	const struct ms_tensor *t;
	const char *x = NULL, *p, *proj;
	uint64_t e = 0;
	int kind;

	if ((size_t)snprintf(name, sizeof(name), "%s.weight", prefix) >= sizeof(name))
		return NULL;
	if ((t = ms_ckpt_find(c, name)))
		return t;
	for (p = strstr(prefix, ".experts."); p; p = strstr(p + 1, ".experts."))
		x = p;
	if (!x)
		return NULL;
	p = x + 9;
	if (*p < '0' || *p > '9')
		return NULL;
	for (; *p >= '0' && *p <= '9'; p++)
		if (ms_mul_u64(e, 10, &e) || ms_add_u64(e, (uint64_t)(*p - '0'), &e))
			return NULL;
	if (*p++ != '.')
		return NULL;
	proj = p;
	kind = !strcmp(proj, "down_proj") ? 2
	       : (!strcmp(proj, "gate_proj") || !strcmp(proj, "up_proj") ||
		  !strcmp(proj, "gate_up_proj")) ? 1 : 0;
	if (!kind)
		return NULL;
	snprintf(name, sizeof(name), "%.*s.experts.%s", (int)(x - prefix), prefix,
		 kind == 1 ? "gate_up_proj" : "down_proj");
	t = ms_ckpt_find(c, name);
	if (!t || fused_experts_of(t) != kind ||
	    e >= t->shape[0])
		return NULL;
	if (!strcmp(proj, "gate_proj"))
		slice_view(t, e, 0, t->shape[1] / 2, tmp);
	else if (!strcmp(proj, "up_proj"))
		slice_view(t, e, t->shape[1] / 2, t->shape[1] / 2, tmp);
	else
		slice_view(t, e, 0, t->shape[1], tmp);
	return tmp;
}

/* ---- reading quantized checkpoints -------------------------------------- */

/* Metadata of one file, parsed once. */
struct file_meta {
	int parsed;
	cJSON *root; /* NULL when the file has none */
};

static int meta_get(const struct ms_ckpt *c, struct file_meta *fm, size_t fi,
		    cJSON **out, struct ms_err *err)
{
	const char *text;
	int nomem;

	if (!fm[fi].parsed) {
		fm[fi].parsed = 1;
		text = ms_st_meta_get(c->files[fi], MS_QUANT_META_KEY);
		if (text) {
			fm[fi].root = ms_json_parse(text, strlen(text), &nomem);
			if (nomem)
				return ms_err_nomem(err);
			if (!fm[fi].root || !cJSON_IsObject(fm[fi].root))
				return ms_err_set(err, MS_EINVAL,
						  "'%s': metadata '%s' is not a JSON object",
						  c->files[fi]->path, MS_QUANT_META_KEY);
		}
	}
	*out = fm[fi].root;
	return MS_OK;
}

/* A string member of obj (or of fallback when obj lacks it). */
static const char *json_str_of(const cJSON *obj, const cJSON *fallback, const char *key)
{
	const cJSON *it = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;

	if (!cJSON_IsString(it) && fallback)
		it = cJSON_GetObjectItemCaseSensitive(fallback, key);
	return cJSON_IsString(it) ? it->valuestring : NULL;
}

static int cmp_qweight(const void *a, const void *b)
{
	return strcmp(((const struct ms_qweight *)a)->prefix,
		      ((const struct ms_qweight *)b)->prefix);
}

/* Fill w from the tensors of prefix; the message names what is wrong. */
static int scan_weight(struct ms_ckpt *c, struct file_meta *fm, const char *prefix,
		       struct ms_qweight *w, struct ms_err *err)
{
	const struct ms_tensor *any = NULL;
	cJSON *meta = NULL, *entry = NULL;
	const char *path;
	int rc, f;

	memset(w, 0, sizeof(*w));
	if (!(w->prefix = ms_strdup(prefix)))
		return ms_err_nomem(err);
	f = find_sfx(c, prefix, sfx_packed(1, 0)) || find_sfx(c, prefix, sfx_packed(1, 1)) ||
	    find_sfx(c, prefix, sfx_tscale(1));
	w->format = f ? MS_QUANT_FORMAT_COMPRESSED_TENSORS : MS_QUANT_FORMAT_MODELOPT;
	for (int l = 0; l < 2; l++) {
		w->packed[l] = find_sfx(c, prefix, sfx_packed(f, l));
		w->scales[l] = find_sfx(c, prefix, sfx_scales(f, l));
		if (!!w->packed[l] != !!w->scales[l]) {
			const struct ms_tensor *t = w->packed[l] ? w->packed[l] : w->scales[l];

			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s' in '%s': %s nvfp4 data without its %s",
					  t->name, t->file->path,
					  ms_nvfp4_layout_name((enum ms_nvfp4_layout)l),
					  w->packed[l] ? "block scales" : "packed values");
		}
		if (!w->packed[l])
			continue;
		if (!any)
			any = w->packed[l];
		if (w->packed[l]->dtype != MS_DTYPE_U8 || w->packed[l]->ndim != 2)
			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s' in '%s': packed nvfp4 values must be 2-d U8",
					  w->packed[l]->name, w->packed[l]->file->path);
		if (w->scales[l]->dtype != MS_DTYPE_F8_E4M3 || w->scales[l]->ndim != 2)
			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s' in '%s': nvfp4 block scales must be 2-d F8_E4M3",
					  w->scales[l]->name, w->scales[l]->file->path);
	}
	if (!any) {
		const struct ms_tensor *s = find_sfx(c, prefix, sfx_scales(f, 0));

		s = s ? s : find_sfx(c, prefix, sfx_scales(f, 1));
		return ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': block scales without packed values",
				  s ? s->name : prefix, s ? s->file->path : "?");
	}
	path = any->file->path;
	w->tscale = find_sfx(c, prefix, sfx_tscale(f));
	if (!w->tscale)
		return ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': nvfp4 weight without '%s%s'",
				  any->name, path, prefix, sfx_tscale(f));
	if (w->tscale->dtype != MS_DTYPE_F32 || w->tscale->nelem != 1 || w->tscale->ndim > 1)
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s' in '%s': a tensor scale must be one F32 ([] or [1])",
				  w->tscale->name, w->tscale->file->path);
	w->tscale_value = read_f32(w->tscale->data);
	w->tscale_kind = f ? MS_NVFP4_TSCALE_DIV : MS_NVFP4_TSCALE_MUL;
	if (!isfinite(w->tscale_value) || w->tscale_value < 0 || (f && w->tscale_value == 0))
		return ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': tensor scale %g is not usable",
				  w->tscale->name, w->tscale->file->path,
				  (double)w->tscale_value);
	/* what the metadata records, else what the flavor implies */
	w->file = file_index(c, any->file);
	w->block = MS_NVFP4_BLOCK_1D;
	w->recipe = f ? MS_NVFP4_RECIPE_COMPRESSED_TENSORS : MS_NVFP4_RECIPE_MODELOPT;
	w->src_dtype = MS_DTYPE_BF16;
	if ((rc = meta_get(c, fm, w->file, &meta, err)) != MS_OK)
		return rc;
	if (meta) {
		cJSON *tensors = cJSON_GetObjectItemCaseSensitive(meta, "tensors");
		cJSON *lays = cJSON_GetObjectItemCaseSensitive(meta, "layouts");

		/* a file that says it holds only columnwise copies may keep
		 * them under the rowwise names (ms(5)) */
		if (cJSON_IsArray(lays) && cJSON_GetArraySize(lays) == 1 &&
		    cJSON_IsString(cJSON_GetArrayItem(lays, 0)) &&
		    !strcmp(cJSON_GetArrayItem(lays, 0)->valuestring, "columnwise") &&
		    w->packed[0] && !w->packed[1]) {
			w->packed[1] = w->packed[0];
			w->scales[1] = w->scales[0];
			w->packed[0] = w->scales[0] = NULL;
		}

		entry = cJSON_IsObject(tensors) ? cJSON_GetObjectItemCaseSensitive(tensors, prefix)
						: NULL;
	}
	if (entry) {
		cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
		const char *s;

		if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) != 2 ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(shape, 0)) ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(shape, 1)) ||
		    cJSON_GetArrayItem(shape, 0)->valuedouble < 0 ||
		    cJSON_GetArrayItem(shape, 1)->valuedouble < 0 ||
		    cJSON_GetArrayItem(shape, 0)->valuedouble > 9e15 ||
		    cJSON_GetArrayItem(shape, 1)->valuedouble > 9e15)
			return ms_err_set(err, MS_EINVAL,
					  "'%s': metadata '%s' gives module '%s' no valid shape",
					  path, MS_QUANT_META_KEY, prefix);
		w->rows = (uint64_t)cJSON_GetArrayItem(shape, 0)->valuedouble;
		w->cols = (uint64_t)cJSON_GetArrayItem(shape, 1)->valuedouble;
		if ((s = json_str_of(entry, meta, "block")) &&
		    ms_nvfp4_block_parse(s, &w->block) != MS_OK)
			return ms_err_set(err, MS_EINVAL, "'%s': metadata '%s': unknown block '%s'",
					  path, MS_QUANT_META_KEY, s);
		if ((s = json_str_of(entry, meta, "recipe")) &&
		    ms_nvfp4_recipe_parse(s, &w->recipe) != MS_OK)
			return ms_err_set(err, MS_EINVAL, "'%s': metadata '%s': unknown recipe '%s'",
					  path, MS_QUANT_META_KEY, s);
		if ((s = json_str_of(entry, NULL, "dtype")) &&
		    (ms_dtype_parse(s, strlen(s), &w->src_dtype) != MS_OK ||
		     !is_float(w->src_dtype)))
			return ms_err_set(err, MS_EINVAL, "'%s': metadata '%s': bad dtype '%s'",
					  path, MS_QUANT_META_KEY, s);
		w->recorded = 1;
	} else if (w->packed[0]) {
		w->rows = w->packed[0]->shape[0];
		w->cols = w->packed[0]->shape[1] * 2;
	} else {
		w->cols = w->packed[1]->shape[0];
		w->rows = w->packed[1]->shape[1] * 2;
	}
	for (int l = 0; l < 2; l++) {
		uint64_t ps[2], ss[2];

		if (!w->packed[l])
			continue;
		if ((rc = ms_nvfp4_shapes(w->rows, w->cols, (enum ms_nvfp4_layout)l, ps, ss, err)) != MS_OK)
			return ms_err_prefix(err, "module '%s' in '%s'", prefix, path);
		if (w->packed[l]->shape[0] != ps[0] || w->packed[l]->shape[1] != ps[1] ||
		    w->scales[l]->shape[0] != ss[0] || w->scales[l]->shape[1] != ss[1])
			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s' in '%s': shapes of the packed values and block scales do not fit a [%llu, %llu] weight",
					  w->scales[l]->name, w->scales[l]->file->path,
					  (unsigned long long)w->rows, (unsigned long long)w->cols);
	}
	return MS_OK;
}

/* The fused 3-D modelopt tensors of stem ("<m>.experts.gate_up_proj",
 * its _weight_scale and _weight_scale_2 [E]): one weight per expert slice,
 * appended to v->weights, their tensors views in v->views. */
static int scan_fused(struct ms_ckpt *c, struct file_meta *fm, const char *stem,
		      struct ms_qview *v, struct ms_err *err)
{
	const struct ms_tensor *pk = ms_ckpt_find(c, stem), *sc = find_sfx(c, stem, "_weight_scale");
	const struct ms_tensor *ts = find_sfx(c, stem, "_weight_scale_2");
	cJSON *meta = NULL, *tensors, *entry = NULL;
	const char *path = sc->file->path, *leaf = strrchr(stem, '.') + 1, *s;
	uint64_t E = sc->shape[0], R, C, ps[2], ss[2];
	enum ms_nvfp4_block block = MS_NVFP4_BLOCK_1D;
	enum ms_nvfp4_recipe recipe = MS_NVFP4_RECIPE_MODELOPT;
	enum ms_dtype dt = MS_DTYPE_BF16;
	int rc, recorded = 0;

	if (!pk || pk->dtype != MS_DTYPE_U8 || pk->ndim != 3 || pk->shape[0] != E)
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s' in '%s': fused nvfp4 block scales without U8 [%llu, ...] packed values '%s'",
				  sc->name, path, (unsigned long long)E, stem);
	if (!ts || ts->dtype != MS_DTYPE_F32 || ts->nelem != E || ts->ndim != 1)
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s' in '%s': fused nvfp4 weight without an F32 [%llu] '%s_weight_scale_2'",
				  pk->name, pk->file->path, (unsigned long long)E, stem);
	R = pk->shape[1];
	C = pk->shape[2] * 2;
	if ((rc = meta_get(c, fm, file_index(c, pk->file), &meta, err)) != MS_OK)
		return rc;
	tensors = meta ? cJSON_GetObjectItemCaseSensitive(meta, "tensors") : NULL;
	entry = cJSON_IsObject(tensors) ? cJSON_GetObjectItemCaseSensitive(tensors, stem) : NULL;
	if (entry) {
		cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");

		if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) != 3 ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(shape, 0)) ||
		    cJSON_GetArrayItem(shape, 0)->valuedouble != (double)E ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(shape, 1)) ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(shape, 2)) ||
		    cJSON_GetArrayItem(shape, 1)->valuedouble < 1 ||
		    cJSON_GetArrayItem(shape, 2)->valuedouble < 1 ||
		    cJSON_GetArrayItem(shape, 1)->valuedouble > 9e15 ||
		    cJSON_GetArrayItem(shape, 2)->valuedouble > 9e15)
			return ms_err_set(err, MS_EINVAL,
					  "'%s': metadata '%s' gives fused tensor '%s' no valid [%llu, rows, cols] shape",
					  pk->file->path, MS_QUANT_META_KEY, stem, (unsigned long long)E);
		R = (uint64_t)cJSON_GetArrayItem(shape, 1)->valuedouble;
		C = (uint64_t)cJSON_GetArrayItem(shape, 2)->valuedouble;
		if ((s = json_str_of(entry, meta, "block")) && ms_nvfp4_block_parse(s, &block) != MS_OK)
			return ms_err_set(err, MS_EINVAL, "'%s': metadata '%s': unknown block '%s'",
					  pk->file->path, MS_QUANT_META_KEY, s);
		if ((s = json_str_of(entry, meta, "recipe")) && ms_nvfp4_recipe_parse(s, &recipe) != MS_OK)
			return ms_err_set(err, MS_EINVAL, "'%s': metadata '%s': unknown recipe '%s'",
					  pk->file->path, MS_QUANT_META_KEY, s);
		if ((s = json_str_of(entry, NULL, "dtype")) &&
		    (ms_dtype_parse(s, strlen(s), &dt) != MS_OK || !is_float(dt)))
			return ms_err_set(err, MS_EINVAL, "'%s': metadata '%s': bad dtype '%s'",
					  pk->file->path, MS_QUANT_META_KEY, s);
		recorded = 1;
	}
	if ((rc = ms_nvfp4_shapes(R, C, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, err)) != MS_OK)
		return ms_err_prefix(err, "fused tensor '%s' in '%s'", stem, path);
	if (pk->shape[1] != ps[0] || pk->shape[2] != ps[1] || sc->shape[1] != ss[0] ||
	    sc->shape[2] != ss[1])
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s' in '%s': shapes of the packed values and block scales do not fit [%llu, %llu, %llu] weights",
				  sc->name, path, (unsigned long long)E, (unsigned long long)R,
				  (unsigned long long)C);
	for (uint64_t e = 0; e < E; e++) {
		struct ms_qweight *w = &v->weights[v->nweights];
		struct ms_tensor *tv = &v->views[v->nviews];

		memset(w, 0, sizeof(*w));
		if (!(w->prefix = ms_asprintf("%.*s.%llu.%s", (int)(leaf - 1 - stem), stem,
					      (unsigned long long)e, leaf)))
			return ms_err_nomem(err);
		v->nweights++;
		slice_view(pk, e, 0, R, &tv[0]);
		slice_view(sc, e, 0, R, &tv[1]);
		memset(&tv[2], 0, sizeof(tv[2]));
		tv[2].name = ts->name;
		tv[2].dtype = MS_DTYPE_F32;
		tv[2].nelem = 1;
		tv[2].nbytes = 4;
		tv[2].offset = ts->offset + 4 * e;
		tv[2].data = ts->data + 4 * e;
		tv[2].file = ts->file;
		v->nviews += 3;
		w->format = MS_QUANT_FORMAT_MODELOPT;
		w->rows = R;
		w->cols = C;
		w->src_dtype = dt;
		w->block = block;
		w->recipe = recipe;
		w->recorded = recorded;
		w->packed[0] = &tv[0];
		w->scales[0] = &tv[1];
		w->tscale = &tv[2];
		w->tscale_value = read_f32(tv[2].data);
		w->tscale_kind = MS_NVFP4_TSCALE_MUL;
		w->file = file_index(c, pk->file);
		w->expert = (int64_t)e;
		if (!isfinite(w->tscale_value) || w->tscale_value < 0)
			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s' in '%s': tensor scale %g of expert %llu is not usable",
					  ts->name, ts->file->path, (double)w->tscale_value,
					  (unsigned long long)e);
	}
	return MS_OK;
}

int ms_qview_open(struct ms_ckpt *c, struct ms_qview *v, struct ms_err *err)
{
	struct file_meta *fm = NULL;
	char **prefixes = NULL;
	const struct ms_tensor **fused = NULL;
	size_t np = 0, nfused = 0;
	uint64_t nslices = 0;
	int rc = MS_OK;

	memset(v, 0, sizeof(*v));
	v->ckpt = c;
	fm = ms_calloc(c->nfiles + 1, sizeof(*fm));
	prefixes = ms_calloc(c->ntensors + 1, sizeof(*prefixes));
	v->owner = ms_malloc((c->ntensors + 1) * sizeof(*v->owner));
	fused = ms_calloc(c->ntensors + 1, sizeof(*fused));
	if (!fm || !prefixes || !v->owner || !fused) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < c->ntensors; i++) {
		const char *name = c->tensors[i]->name;
		static const char *const keys[] = {".weight_scale", ".weight_colwise_scale",
						   ".weight_scale_colwise"};

		v->owner[i] = -1;
		/* fused 3-D experts: "<m>.experts.gate_up_proj_weight_scale"
		 * [E, rows, cols/16] */
		if (c->tensors[i]->dtype == MS_DTYPE_F8_E4M3 && c->tensors[i]->ndim == 3 &&
		    (ms_str_ends_with(name, ".experts.gate_up_proj_weight_scale") ||
		     ms_str_ends_with(name, ".experts.down_proj_weight_scale")) &&
		    c->tensors[i]->shape[0] > 0 && c->tensors[i]->shape[1] > 0) {
			fused[nfused++] = c->tensors[i];
			if (ms_add_u64(nslices, c->tensors[i]->shape[0], &nslices) ||
			    nslices > (SIZE_MAX / 4) / sizeof(struct ms_tensor)) {
				rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': too many experts",
						name, c->tensors[i]->file->path);
				goto out;
			}
			continue;
		}
		/* NVFP4 block scales are 2-D F8_E4M3; an FP8 checkpoint's
		 * per-tensor F32 weight_scale is not ours */
		if (c->tensors[i]->dtype != MS_DTYPE_F8_E4M3 || c->tensors[i]->ndim != 2)
			continue;
		for (size_t k = 0; k < 3; k++) {
			if (ms_str_ends_with(name, keys[k]) && strlen(name) > strlen(keys[k])) {
				prefixes[np] = ms_strndup(name, strlen(name) - strlen(keys[k]));
				if (!prefixes[np++]) {
					rc = ms_err_nomem(err);
					goto out;
				}
				break;
			}
		}
	}
	qsort(prefixes, np, sizeof(*prefixes), ms_cmp_str);
	v->weights = ms_calloc(np + (size_t)nslices + 1, sizeof(*v->weights));
	v->views = ms_calloc(3 * (size_t)nslices + 1, sizeof(*v->views));
	if (!v->weights || !v->views) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < np; i++) {
		struct ms_qweight *w;

		if (i && !strcmp(prefixes[i], prefixes[i - 1]))
			continue;
		w = &v->weights[v->nweights++];
		if ((rc = scan_weight(c, fm, prefixes[i], w, err)) != MS_OK)
			goto out;
		w->expert = -1;
	}
	for (size_t i = 0; i < nfused; i++) {
		char *stem = ms_strndup(fused[i]->name, strlen(fused[i]->name) - 13);

		if (!stem) {
			rc = ms_err_nomem(err);
			goto out;
		}
		rc = scan_fused(c, fm, stem, v, err);
		ms_free(stem);
		if (rc != MS_OK)
			goto out;
	}
	qsort(v->weights, v->nweights, sizeof(*v->weights), cmp_qweight);
	for (size_t i = 0; i < v->nweights; i++) {
		struct ms_qweight *w = &v->weights[i];
		const struct ms_tensor *parts[8] = {
			w->packed[0], w->packed[1], w->scales[0], w->scales[1], w->tscale,
			find_sfx(c, w->prefix, sfx_input(0)), find_sfx(c, w->prefix, sfx_input(1)),
		};

		for (size_t k = 0; k < 8; k++) {
			size_t ix;

			if (!parts[k])
				continue;
			ix = ckpt_index(c, parts[k]);
			/* the slices of one fused tensor: it stays with the first */
			if (ix < c->ntensors && v->owner[ix] >= 0 && w->expert >= 0)
				continue;
			if (ix < c->ntensors && v->owner[ix] >= 0 && v->owner[ix] != (int64_t)i) {
				rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s' belongs to two nvfp4 modules",
						parts[k]->name, parts[k]->file->path);
				goto out;
			}
			if (ix < c->ntensors)
				v->owner[ix] = (int64_t)i;
		}
	}
out:
	if (fm) {
		for (size_t i = 0; i < c->nfiles; i++)
			cJSON_Delete(fm[i].root);
		ms_free(fm);
	}
	if (prefixes) {
		for (size_t i = 0; i < np; i++)
			ms_free(prefixes[i]);
		ms_free(prefixes);
	}
	ms_free(fused);
	if (rc != MS_OK)
		ms_qview_release(v);
	return rc;
}

void ms_qview_release(struct ms_qview *v)
{
	if (!v)
		return;
	for (size_t i = 0; i < v->nweights; i++)
		ms_free(v->weights[i].prefix);
	ms_free(v->weights);
	ms_free(v->owner);
	ms_free(v->views);
	memset(v, 0, sizeof(*v));
}

int ms_qweight_decode(const struct ms_qweight *w, enum ms_nvfp4_layout layout,
		      int nthreads, float *out, struct ms_err *err)
{
	int col = layout == MS_NVFP4_LAYOUT_COLUMNWISE;
	int rc;

	if (!w->packed[layout])
		return ms_err_set(err, MS_EINVAL, "module '%s' has no %s nvfp4 copy", w->prefix,
				  ms_nvfp4_layout_name(layout));
	rc = ms_nvfp4_dequantize(w->packed[layout]->data, w->scales[layout]->data,
				 col ? w->cols : w->rows, col ? w->rows : w->cols,
				 w->tscale_value, w->tscale_kind, MS_DTYPE_F32, out, nthreads,
				 err);
	if (rc != MS_OK)
		return ms_err_prefix(err, "tensor '%s' in '%s'", w->packed[layout]->name,
				     w->packed[layout]->file->path);
	return MS_OK;
}

/* ---- plans -------------------------------------------------------------- */

static int add_out(struct ms_quant_plan *p, size_t *cap, const char *name,
		   enum ms_dtype dt, uint32_t ndim, const uint64_t *shape,
		   enum ms_qout_kind kind, enum ms_nvfp4_layout layout, size_t item,
		   size_t file, struct ms_err *err)
{
	struct ms_qout *o;
	uint64_t ne = 1;

	if (p->nouts == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		struct ms_qout *no = ms_realloc(p->outs, nc * sizeof(*no));

		if (!no)
			return ms_err_nomem(err);
		p->outs = no;
		*cap = nc;
	}
	o = &p->outs[p->nouts];
	memset(o, 0, sizeof(*o));
	for (uint32_t d = 0; d < ndim; d++) {
		o->shape[d] = shape[d];
		if (ms_mul_u64(ne, shape[d], &ne))
			return ms_err_set(err, MS_EINVAL, "tensor '%s': shape overflows", name);
	}
	if (ms_dtype_nbytes(dt, ne, &o->nbytes) != MS_OK)
		return ms_err_set(err, MS_EINVAL, "tensor '%s': size overflows", name);
	if (!(o->name = ms_strdup(name)))
		return ms_err_nomem(err);
	o->dtype = dt;
	o->ndim = ndim;
	o->kind = kind;
	o->layout = layout;
	o->item = item;
	o->file = file;
	p->nouts++;
	p->bytes_out += o->nbytes;
	return MS_OK;
}

static int add_item(struct ms_quant_plan *p, size_t *cap, const struct ms_tensor *src,
		    struct ms_err *err)
{
	struct ms_qitem *it;

	if (p->nitems == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		struct ms_qitem *ni = ms_realloc(p->items, nc * sizeof(*ni));

		if (!ni)
			return ms_err_nomem(err);
		p->items = ni;
		*cap = nc;
	}
	it = &p->items[p->nitems++];
	memset(it, 0, sizeof(*it));
	it->src = src;
	it->qweight = -1;
	it->group = -1;
	return MS_OK;
}

/* The outputs of one quantized module: format names, chosen layouts. */
static int add_weight_outs(struct ms_quant_plan *p, size_t *cap, const char *prefix,
			   uint64_t rows, uint64_t cols, unsigned layouts,
			   enum ms_quant_format fmt, int with_tscale, size_t item,
			   size_t file, struct ms_err *err)
{
	char name[MS_ST_MAX_NAME + 64];
	int rc;

	for (int l = 0; l < 2; l++) {
		uint64_t ps[2], ss[2];

		if (!(layouts & (1u << l)))
			continue;
		if ((rc = ms_nvfp4_shapes(rows, cols, (enum ms_nvfp4_layout)l, ps, ss, err)) != MS_OK)
			return rc;
		snprintf(name, sizeof(name), "%s%s", prefix, sfx_packed(fmt, l));
		if ((rc = add_out(p, cap, name, MS_DTYPE_U8, 2, ps, MS_QOUT_PACKED,
				  (enum ms_nvfp4_layout)l, item, file, err)) != MS_OK)
			return rc;
		snprintf(name, sizeof(name), "%s%s", prefix, sfx_scales(fmt, l));
		if ((rc = add_out(p, cap, name, MS_DTYPE_F8_E4M3, 2, ss, MS_QOUT_SCALES,
				  (enum ms_nvfp4_layout)l, item, file, err)) != MS_OK)
			return rc;
		if (l == 0 && with_tscale) {
			uint64_t one = 1;

			snprintf(name, sizeof(name), "%s%s", prefix, sfx_tscale(fmt));
			if ((rc = add_out(p, cap, name, MS_DTYPE_F32,
					  fmt == MS_QUANT_FORMAT_MODELOPT ? 0 : 1, &one,
					  MS_QOUT_TSCALE, MS_NVFP4_LAYOUT_ROWWISE, item, file,
					  err)) != MS_OK)
				return rc;
			with_tscale = 0;
		}
	}
	if (with_tscale) {
		uint64_t one = 1;

		snprintf(name, sizeof(name), "%s%s", prefix, sfx_tscale(fmt));
		return add_out(p, cap, name, MS_DTYPE_F32, fmt == MS_QUANT_FORMAT_MODELOPT ? 0 : 1,
			       &one, MS_QOUT_TSCALE, MS_NVFP4_LAYOUT_ROWWISE, item, file, err);
	}
	return MS_OK;
}

/*
 * The one place where the device is chosen. The GPU path is gpu.h's
 * streaming quantizer (byte for byte the reference's). It is compiled in
 * with MS_QUANT_GPU, to be defined by the build once the kernels provide
 * ms_gpu_nvfp4_quantize_host; until then --device cuda is refused and
 * auto means the CPU.
 */
static int choose_device(enum ms_quant_device want, enum ms_quant_device *got,
			 struct ms_err *err)
{
#ifdef MS_QUANT_GPU
	int have = ms_gpu_available();
#endif

	switch (want) {
	case MS_QUANT_DEVICE_CPU:
		*got = MS_QUANT_DEVICE_CPU;
		return MS_OK;
	case MS_QUANT_DEVICE_CUDA:
#ifdef MS_QUANT_GPU
		if (!have)
			return ms_err_set(err, MS_ENODEV, "no CUDA device available");
		*got = MS_QUANT_DEVICE_CUDA;
		return MS_OK;
#else
		return ms_err_set(err, MS_ENODEV, "no CUDA device support in this build");
#endif
	default:
#ifdef MS_QUANT_GPU
		*got = have ? MS_QUANT_DEVICE_CUDA : MS_QUANT_DEVICE_CPU;
#else
		*got = MS_QUANT_DEVICE_CPU;
#endif
		return MS_OK;
	}
}

static int run_quantize(const struct ms_quant_plan *p, const struct ms_nvfp4_params *np,
			const struct ms_nvfp4_src *src, float amax, uint8_t *packed,
			uint8_t *scales, struct ms_err *err)
{
#ifdef MS_QUANT_GPU
	if (p->device == MS_QUANT_DEVICE_CUDA) {
		int col = np->layout == MS_NVFP4_LAYOUT_COLUMNWISE;

		return ms_gpu_nvfp4_quantize_host(np, src, amax, 0, col ? NULL : packed,
						  col ? NULL : scales, col ? packed : NULL,
						  col ? scales : NULL, err);
	}
#endif
	(void)p;
	return ms_nvfp4_quantize(np, src, amax, packed, scales, err);
}

static int replaceable(const struct ms_quant_plan *p, const struct stat *st,
		       struct ms_err *err);

static int file_exists(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0;
}

/* Other regular files of an input directory, for copying. */
static int list_copies(struct ms_quant_plan *p, const char *dir, struct ms_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t cap = 0;
	int rc = MS_OK;

	if (!d)
		return ms_err_set(err, MS_EIO, "'%s': cannot read directory: %s", dir, strerror(errno));
	while ((de = readdir(d))) {
		char *path, **nn;
		struct stat st;

		if (de->d_name[0] == '.' || ms_str_ends_with(de->d_name, ".safetensors") ||
		    !strcmp(de->d_name, INDEX_NAME))
			continue;
		if (!(path = ms_path_join(dir, de->d_name))) {
			rc = ms_err_nomem(err);
			break;
		}
		if (stat(path, &st) || !S_ISREG(st.st_mode)) {
			ms_free(path);
			continue;
		}
		ms_free(path);
		if (p->ncopies == cap) {
			cap = cap ? cap * 2 : 8;
			nn = ms_realloc(p->copy_names, cap * sizeof(*nn));
			if (!nn) {
				rc = ms_err_nomem(err);
				break;
			}
			p->copy_names = nn;
		}
		if (!(p->copy_names[p->ncopies] = ms_strdup(de->d_name))) {
			rc = ms_err_nomem(err);
			break;
		}
		p->ncopies++;
	}
	closedir(d);
	if (rc == MS_OK)
		qsort(p->copy_names, p->ncopies, sizeof(*p->copy_names), ms_cmp_str);
	return rc;
}

/* Per-file metadata JSON for the modules of file fi. */
static int build_file_meta(struct ms_quant_plan *p, size_t fi, struct ms_err *err)
{
	/* the members are added unchecked: the mark tells a short tree */
	uint64_t mark = ms_json_mark();
	cJSON *root = cJSON_CreateObject(), *tensors, *lays;
	const char *recipe = NULL, *block = NULL, *fmt = NULL;
	unsigned layouts = 0;
	int any = 0, rc = MS_OK;

	if (!root)
		return ms_err_nomem(err);
	/* the common values first, then per-module exceptions */
	for (size_t i = 0; i < p->nitems; i++) {
		const struct ms_qitem *it = &p->items[i];

		if (p->opts.op == MS_QUANT_OP_QUANTIZE) {
			if (!it->quantized || file_index(p->in, it->src->file) != fi)
				continue;
			recipe = ms_nvfp4_recipe_name(p->opts.recipe);
			block = ms_nvfp4_block_name(p->opts.block);
			fmt = ms_quant_format_name(p->opts.format);
			layouts = p->opts.layouts;
		} else {
			const struct ms_qweight *w;

			if (it->qweight < 0)
				continue;
			w = &p->view.weights[it->qweight];
			if (w->file != fi)
				continue;
			if (!recipe) {
				recipe = ms_nvfp4_recipe_name(w->recipe);
				block = ms_nvfp4_block_name(w->block);
				fmt = ms_quant_format_name(w->format);
			}
			layouts |= w->packed[0] ? MS_QUANT_COLUMNWISE : MS_QUANT_ROWWISE;
		}
		any = 1;
	}
	if (!any)
		goto out;
	cJSON_AddNumberToObject(root, "version", 1);
	cJSON_AddStringToObject(root, "recipe", recipe);
	cJSON_AddStringToObject(root, "block", block);
	cJSON_AddStringToObject(root, "format", fmt);
	lays = cJSON_AddArrayToObject(root, "layouts");
	for (int l = 0; lays && l < 2; l++)
		if (layouts & (1u << l))
			cJSON_AddItemToArray(lays, cJSON_CreateString(
				ms_nvfp4_layout_name((enum ms_nvfp4_layout)l)));
	tensors = cJSON_AddObjectToObject(root, "tensors");
	for (size_t i = 0; tensors && i < p->nitems; i++) {
		const struct ms_qitem *it = &p->items[i];
		const char *prefix, *dt;
		char buf[MS_ST_MAX_NAME + 1];
		cJSON *e, *sh;

		if (p->opts.op == MS_QUANT_OP_QUANTIZE) {
			if (!it->quantized || file_index(p->in, it->src->file) != fi)
				continue;
			snprintf(buf, sizeof(buf), "%.*s",
				 (int)(strlen(it->src->name) - (it->experts ? 0 : 7)), it->src->name);
			prefix = buf;
			dt = ms_dtype_name(it->src->dtype);
		} else {
			const struct ms_qweight *w;

			if (it->qweight < 0)
				continue;
			w = &p->view.weights[it->qweight];
			if (w->file != fi)
				continue;
			prefix = w->prefix;
			dt = ms_dtype_name(w->src_dtype);
		}
		e = cJSON_AddObjectToObject(tensors, prefix);
		sh = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
		if (!sh)
			break;
		if (it->experts)
			cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)it->experts));
		cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)it->rows));
		cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)it->cols));
		cJSON_AddStringToObject(e, "dtype", dt);
		/* quantized padded on request: engines cannot load it */
		if (p->opts.op == MS_QUANT_OP_QUANTIZE && it->cols % MS_NVFP4_BLOCK)
			cJSON_AddTrueToObject(e, "padded");
		if (it->qweight >= 0) {
			const struct ms_qweight *w = &p->view.weights[it->qweight];

			if (strcmp(ms_nvfp4_block_name(w->block), block))
				cJSON_AddStringToObject(e, "block", ms_nvfp4_block_name(w->block));
			if (strcmp(ms_nvfp4_recipe_name(w->recipe), recipe))
				cJSON_AddStringToObject(e, "recipe", ms_nvfp4_recipe_name(w->recipe));
		}
	}
	p->file_meta[fi] = cJSON_PrintUnformatted(root);
	if (!p->file_meta[fi] || ms_json_failed(mark)) {
		cJSON_free(p->file_meta[fi]);
		p->file_meta[fi] = NULL;
		rc = ms_err_nomem(err);
	}
out:
	cJSON_Delete(root);
	return rc;
}

/* Append name less its last cut bytes to the list (*v, *n). */
static int push_name(char ***v, size_t *n, const char *name, size_t cut, struct ms_err *err)
{
	char **nv = ms_realloc(*v, (*n + 1) * sizeof(*nv));

	if (!nv)
		return ms_err_nomem(err);
	*v = nv;
	if (!(nv[*n] = ms_strndup(name, strlen(name) - cut)))
		return ms_err_nomem(err);
	(*n)++;
	return MS_OK;
}

/* Put item it into the fused tensor-scale group of its name (keys holds
 * the group keys seen so far). */
static int join_group(struct ms_qitem *it, const char *name, char **keys, size_t *nkeys,
		      struct ms_err *err)
{
	char key[MS_ST_MAX_NAME + 16];
	size_t g;

	if (!ms_quant_fuse_key(name, key, sizeof(key)))
		return MS_OK;
	for (g = 0; g < *nkeys; g++)
		if (!strcmp(keys[g], key))
			break;
	if (g == *nkeys && !(keys[(*nkeys)++] = ms_strdup(key)))
		return ms_err_nomem(err);
	it->group = (int64_t)g;
	return MS_OK;
}

/* A selected fused 3-D expert tensor t (kind: 1 gate_up, 2 down) of input
 * file fi: per expert, one module per projection on a view of its slice;
 * or (fused) one item quantizing every slice into [E, ...] tensors. */
static int plan_fused(struct ms_quant_plan *p, size_t *icap, size_t *ocap,
		      const struct ms_tensor *t, int kind, size_t fi, char **keys,
		      size_t *nkeys, struct ms_err *err)
{
	const struct ms_quant_opts *o = &p->opts;
	uint64_t E = t->shape[0], R = t->shape[1], C = t->shape[2];
	size_t base = strlen(t->name) - (kind == 1 ? strlen(".gate_up_proj") : strlen(".down_proj"));
	struct ms_qitem *it;
	int rc;

	/* [E, H, 2I] / [E, I, H] (experts stored as [in, out], as some
	 * checkpoints do) would put the blocks along the output dimension */
	if (p->hidden_size && (kind == 1 ? C : R) != p->hidden_size)
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s' in '%s': shape [%llu, %llu, %llu] is not %s with hidden_size %llu (config.json): fused experts stored as [in, out] are not supported",
				  t->name, t->file->path, (unsigned long long)E, (unsigned long long)R,
				  (unsigned long long)C, kind == 1 ? "[E, 2I, H]" : "[E, H, I]",
				  (unsigned long long)p->hidden_size);
	if (o->experts == MS_QUANT_EXPERTS_FUSED) {
		char name[MS_ST_MAX_NAME + 64];
		uint64_t ps[2], ss[2], sh[3];

		if (o->format != MS_QUANT_FORMAT_MODELOPT)
			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s' in '%s': --experts fused is written in the modelopt format only (engines load no fused compressed-tensors experts); use --experts per-expert",
					  t->name, t->file->path);
		if (o->layouts != MS_QUANT_ROWWISE)
			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s' in '%s': --experts fused writes the rowwise layout only; use --experts per-expert for columnwise copies",
					  t->name, t->file->path);
		if (o->no_fuse && kind == 1)
			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s' in '%s': --experts fused keeps one tensor scale per expert for gate and up; it cannot be combined with --no-fuse-scales",
					  t->name, t->file->path);
		if ((rc = add_item(p, icap, t, err)) != MS_OK)
			return rc;
		it = &p->items[p->nitems - 1];
		it->quantized = 1;
		it->rows = R;
		it->cols = C;
		it->experts = E;
		p->nquantized++;
		if ((rc = ms_nvfp4_shapes(R, C, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, err)) != MS_OK)
			return ms_err_prefix(err, "tensor '%s' in '%s'", t->name, t->file->path);
		sh[0] = E;
		sh[1] = ps[0];
		sh[2] = ps[1];
		if ((rc = add_out(p, ocap, t->name, MS_DTYPE_U8, 3, sh, MS_QOUT_PACKED,
				  MS_NVFP4_LAYOUT_ROWWISE, p->nitems - 1, fi, err)) != MS_OK)
			return rc;
		snprintf(name, sizeof(name), "%s_weight_scale", t->name);
		sh[1] = ss[0];
		sh[2] = ss[1];
		if ((rc = add_out(p, ocap, name, MS_DTYPE_F8_E4M3, 3, sh, MS_QOUT_SCALES,
				  MS_NVFP4_LAYOUT_ROWWISE, p->nitems - 1, fi, err)) != MS_OK)
			return rc;
		snprintf(name, sizeof(name), "%s_weight_scale_2", t->name);
		return add_out(p, ocap, name, MS_DTYPE_F32, 1, &E, MS_QOUT_TSCALE,
			       MS_NVFP4_LAYOUT_ROWWISE, p->nitems - 1, fi, err);
	}
	for (uint64_t e = 0; e < E; e++) {
		for (int part = 0; part < (kind == 1 ? 2 : 1); part++) {
			static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
			struct ms_tensor *v = &p->views[p->nviews];
			char *name;
			uint64_t rows = kind == 1 ? R / 2 : R;

			slice_view(t, e, (uint64_t)part * rows, rows, v);
			name = ms_asprintf("%.*s.%llu.%s.weight", (int)base, t->name,
					   (unsigned long long)e, proj[kind == 1 ? part : 2]);
			if (!name)
				return ms_err_nomem(err);
			v->name = name;
			p->nviews++;
			if ((rc = add_item(p, icap, v, err)) != MS_OK)
				return rc;
			it = &p->items[p->nitems - 1];
			it->quantized = 1;
			it->rows = rows;
			it->cols = C;
			p->nquantized++;
			if (!o->no_fuse && (rc = join_group(it, name, keys, nkeys, err)) != MS_OK)
				return rc;
			{
				char prefix[MS_ST_MAX_NAME + 1];

				snprintf(prefix, sizeof(prefix), "%.*s", (int)(strlen(name) - 7), name);
				if ((rc = add_weight_outs(p, ocap, prefix, rows, C, o->layouts,
							  o->format, 1, p->nitems - 1, fi, err)) != MS_OK)
					return rc;
			}
		}
	}
	return MS_OK;
}

/* config.json's hidden_size (or text_config's), which tells fused expert
 * tensors in transformers 5's layout from those stored the other way
 * round; 0 when the directory has no readable config saying it. */
static int read_hidden_size(struct ms_quant_plan *p, const char *dir, struct ms_err *err)
{
	char *path = ms_path_join(dir, "config.json"), *text = NULL;
	struct ms_err ignored = {0};
	cJSON *j = NULL, *h;
	size_t len;
	int nomem = 0, rc;

	if (!path)
		return ms_err_nomem(err);
	/* a missing or unreadable config is reported where it is copied */
	if (file_exists(path)) {
		rc = ms_file_read(path, MAX_COPY_FILE, &text, &len, &ignored);
		if (rc == MS_OK)
			j = ms_json_parse(text, len, &nomem);
		else
			nomem = rc == MS_ENOMEM;
	}
	h = cJSON_GetObjectItemCaseSensitive(j, "hidden_size");
	if (!cJSON_IsNumber(h))
		h = cJSON_GetObjectItemCaseSensitive(
			cJSON_GetObjectItemCaseSensitive(j, "text_config"), "hidden_size");
	if (cJSON_IsNumber(h) && h->valuedouble >= 1 && h->valuedouble <= 9e15)
		p->hidden_size = (uint64_t)h->valuedouble;
	cJSON_Delete(j);
	ms_free(text);
	ms_free(path);
	return nomem ? ms_err_nomem(err) : MS_OK;
}

static int plan_quantize(struct ms_quant_plan *p, size_t *icap, size_t *ocap,
			 struct ms_err *err)
{
	const struct ms_quant_opts *o = &p->opts;
	regex_t inc, exc;
	int have_inc = 0, have_exc = 0, rc = MS_OK;
	char **keys = NULL;
	size_t nkeys = 0, nviews_max = 0;

	if (p->view.nweights) {
		const struct ms_qweight *w = &p->view.weights[0];
		const struct ms_tensor *t = w->packed[0] ? w->packed[0] : w->packed[1];

		return ms_err_set(err, MS_EINVAL, "'%s' is already quantized (tensor '%s' in '%s')",
				  p->in_path, t->name, t->file->path);
	}
	if (o->include) {
		int r = regcomp(&inc, o->include, REG_EXTENDED | REG_NOSUB);

		if (r) {
			char msg[256];

			regerror(r, &inc, msg, sizeof(msg));
			return ms_err_set(err, MS_EINVAL, "include pattern '%s': %s", o->include, msg);
		}
		have_inc = 1;
	}
	if (o->exclude) {
		int r = regcomp(&exc, o->exclude, REG_EXTENDED | REG_NOSUB);

		if (r) {
			char msg[256];

			regerror(r, &exc, msg, sizeof(msg));
			rc = ms_err_set(err, MS_EINVAL, "exclude pattern '%s': %s", o->exclude, msg);
			goto out;
		}
		have_exc = 1;
	}
	/* the per-expert views of fused 3-D expert tensors, made once so
	 * that items may point at them */
	if (o->experts == MS_QUANT_EXPERTS_PER_EXPERT) {
		uint64_t nv = 0;

		for (size_t i = 0; i < p->in->ntensors; i++) {
			int k = fused_experts_of(p->in->tensors[i]);

			/* gate_up: a gate and an up view per expert */
			if (k && (ms_add_u64(nv, p->in->tensors[i]->shape[0], &nv) ||
				  (k == 1 && ms_add_u64(nv, p->in->tensors[i]->shape[0], &nv)))) {
				rc = ms_err_set(err, MS_EINVAL, "'%s': too many experts", p->in_path);
				goto out;
			}
		}
		if (nv > (SIZE_MAX / 4) / sizeof(*p->views) ||
		    !(p->views = ms_calloc((size_t)nv + 1, sizeof(*p->views)))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		nviews_max = (size_t)nv;
	}
	keys = ms_calloc(p->in->ntensors + nviews_max + 1, sizeof(*keys));
	if (!keys) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t fi = 0; fi < p->in->nfiles; fi++) {
		const struct ms_st_file *f = p->in->files[fi];

		for (size_t k = 0; k < f->ntensors; k++) {
			const struct ms_tensor *t = &f->tensors[k];
			int sel = ms_quant_default_selected(t);
			struct ms_qitem *it;

			if (have_inc && regexec(&inc, t->name, 0, NULL, 0) == 0) {
				if (!quantizable(t) && !fused_experts_of(t)) {
					rc = ms_err_set(err, MS_EINVAL,
							"tensor '%s' in '%s': matches the include pattern but is not a 2-d bf16, f16 or f32 '.weight' or a fused 3-d expert tensor",
							t->name, f->path);
					goto out;
				}
				sel = 1;
			}
			if (have_exc && regexec(&exc, t->name, 0, NULL, 0) == 0)
				sel = 0;
			/* an input dimension that is not a multiple of 16: both
			 * producers refuse it and loaders cannot load the padded
			 * shape, so it stays as it is (and is listed in the
			 * ignore lists) unless padding was asked for; the input
			 * dimension is the last, of a 2-D weight and of a fused
			 * 3-D expert tensor alike */
			if (sel && t->shape[t->ndim - 1] % MS_NVFP4_BLOCK && !o->pad_ragged) {
				sel = 0;
				if ((rc = push_name(&p->ragged, &p->nragged, t->name, 0, err)) != MS_OK)
					goto out;
			}
			if (sel && fused_experts_of(t)) {
				p->bytes_in += t->nbytes;
				if ((rc = plan_fused(p, icap, ocap, t, fused_experts_of(t), fi, keys,
						     &nkeys, err)) != MS_OK)
					goto out;
				continue;
			}
			if ((rc = add_item(p, icap, t, err)) != MS_OK)
				goto out;
			it = &p->items[p->nitems - 1];
			p->bytes_in += t->nbytes;
			if (!sel) {
				struct ms_name_info info;

				if ((rc = add_out(p, ocap, t->name, t->dtype, t->ndim, t->shape,
						  MS_QOUT_COPY, MS_NVFP4_LAYOUT_ROWWISE,
						  p->nitems - 1, fi, err)) != MS_OK)
					goto out;
				p->ncopied++;
				/* linear-like weights left out, for the
				 * configs' exclude/ignore lists */
				if (fused_experts_of(t)) {
					if ((rc = push_name(&p->excluded, &p->nexcluded, t->name, 0,
							    err)) != MS_OK)
						goto out;
				} else if (quantizable(t) && ms_name_parse(t->name, &info) == MS_OK &&
					   info.part != MS_NAME_PART_NORM &&
					   (rc = push_name(info.part == MS_NAME_PART_EMBED ? &p->embeds
											    : &p->excluded,
							   info.part == MS_NAME_PART_EMBED ? &p->nembeds
											    : &p->nexcluded,
							   t->name, 7, err)) != MS_OK) {
					goto out;
				}
				continue;
			}
			it->quantized = 1;
			it->rows = t->shape[0];
			it->cols = t->shape[1];
			p->nquantized++;
			/* fused group: items with the same key */
			if (!o->no_fuse && (rc = join_group(it, t->name, keys, &nkeys, err)) != MS_OK)
				goto out;
			{
				char prefix[MS_ST_MAX_NAME + 1];

				snprintf(prefix, sizeof(prefix), "%.*s", (int)(strlen(t->name) - 7),
					 t->name);
				if ((rc = add_weight_outs(p, ocap, prefix, it->rows, it->cols, o->layouts,
							  o->format, 1, p->nitems - 1, fi, err)) != MS_OK)
					goto out;
			}
		}
	}
	if (p->excluded)
		qsort(p->excluded, p->nexcluded, sizeof(*p->excluded), ms_cmp_str);
	if (p->embeds)
		qsort(p->embeds, p->nembeds, sizeof(*p->embeds), ms_cmp_str);
	/* a group of one shares with nobody */
	for (size_t g = 0; g < nkeys; g++) {
		size_t members = 0;

		for (size_t i = 0; i < p->nitems; i++)
			members += p->items[i].group == (int64_t)g;
		if (members < 2) {
			for (size_t i = 0; i < p->nitems; i++)
				if (p->items[i].group == (int64_t)g)
					p->items[i].group = -1;
		} else {
			p->ngroups++;
		}
	}
out:
	if (have_inc)
		regfree(&inc);
	if (have_exc)
		regfree(&exc);
	for (size_t g = 0; g < nkeys; g++)
		ms_free(keys[g]);
	ms_free(keys);
	return rc;
}

static int plan_read(struct ms_quant_plan *p, size_t *icap, size_t *ocap,
		     struct ms_err *err)
{
	int transpose = p->opts.op == MS_QUANT_OP_TRANSPOSE;
	int rc;

	if (p->view.nweights == 0)
		return ms_err_set(err, MS_EINVAL, "'%s' holds no nvfp4 weights", p->in_path);
	for (size_t i = 0; i < p->view.nweights; i++) {
		const struct ms_qweight *w = &p->view.weights[i];

		if (w->expert >= 0 && transpose)
			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s' in '%s': fused 3-d nvfp4 experts cannot be transposed (quantize with --experts per-expert)",
					  w->packed[0]->name, w->packed[0]->file->path);
	}
	if (transpose && p->source &&
	    !(p->views = ms_calloc(p->view.nweights + 1, sizeof(*p->views))))
		return ms_err_nomem(err);
	if (transpose) {
		for (size_t i = 0; i < p->view.nweights; i++) {
			const struct ms_qweight *w = &p->view.weights[i];

			if (w->packed[0] && w->packed[1])
				return ms_err_set(err, MS_EINVAL,
						  "module '%s' in '%s' already holds both layouts",
						  w->prefix, w->packed[0]->file->path);
			if (w->block == MS_NVFP4_BLOCK_1D && !p->source)
				return ms_err_set(err, MS_EINVAL,
						  "module '%s' in '%s' has 1d blocks: its other layout must be quantized from the high-precision weights (pass them with --source)",
						  w->prefix, w->packed[0] ? w->packed[0]->file->path
									 : w->packed[1]->file->path);
		}
	}
	for (size_t fi = 0; fi < p->in->nfiles; fi++) {
		const struct ms_st_file *f = p->in->files[fi];

		for (size_t k = 0; k < f->ntensors; k++) {
			const struct ms_tensor *t = &f->tensors[k];
			int64_t owner = p->view.owner[ckpt_index(p->in, t)];
			const struct ms_qweight *w;
			int have;
			struct ms_qitem *it;

			p->bytes_in += t->nbytes;
			if (owner < 0) {
				if ((rc = add_item(p, icap, t, err)) != MS_OK ||
				    (rc = add_out(p, ocap, t->name, t->dtype, t->ndim, t->shape,
						  MS_QOUT_COPY, MS_NVFP4_LAYOUT_ROWWISE, p->nitems - 1,
						  fi, err)) != MS_OK)
					return rc;
				p->ncopied++;
				continue;
			}
			w = &p->view.weights[owner];
			have = w->packed[0] ? 0 : 1;
			if (w->expert >= 0) {
				/* dequantize a fused tensor back to [E, rows, cols]
				 * under its own name; its scales are dropped */
				uint64_t shape[3] = {t->shape[0], w->rows, w->cols};

				if (strcmp(t->name, w->packed[0]->name))
					continue;
				if ((rc = add_item(p, icap, NULL, err)) != MS_OK)
					return rc;
				it = &p->items[p->nitems - 1];
				it->qweight = owner;
				it->rows = w->rows;
				it->cols = w->cols;
				it->experts = t->shape[0];
				p->nquantized++;
				if ((rc = add_out(p, ocap, t->name, p->opts.dtype, 3, shape,
						  MS_QOUT_DECODED, MS_NVFP4_LAYOUT_ROWWISE,
						  p->nitems - 1, fi, err)) != MS_OK)
					return rc;
				continue;
			}
			if (t != w->packed[have] && (transpose ? t != w->scales[have] : 1)) {
				if (transpose) {
					if ((rc = add_item(p, icap, t, err)) != MS_OK ||
					    (rc = add_out(p, ocap, t->name, t->dtype, t->ndim, t->shape,
							  MS_QOUT_COPY, MS_NVFP4_LAYOUT_ROWWISE,
							  p->nitems - 1, fi, err)) != MS_OK)
						return rc;
				}
				continue; /* dequantize drops the companions */
			}
			if (t == w->scales[have])
				continue; /* written beside the packed values */
			if ((rc = add_item(p, icap, NULL, err)) != MS_OK)
				return rc;
			it = &p->items[p->nitems - 1];
			it->qweight = owner;
			it->rows = w->rows;
			it->cols = w->cols;
			p->nquantized++;
			if (transpose) {
				if (w->block == MS_NVFP4_BLOCK_1D) {
					char name[MS_ST_MAX_NAME + 16];

					snprintf(name, sizeof(name), "%s.weight", w->prefix);
					/* a fused 3-D source serves per-expert modules:
					 * the view of the slice lives in the plan */
					it->src = source_weight(p->source, w->prefix,
								&p->views[p->nviews]);
					if (!it->src)
						return ms_err_set(err, MS_EINVAL,
								  "source '%s' has no tensor '%s' (nor a fused expert tensor holding it)",
								  p->opts.source, name);
					if (it->src == &p->views[p->nviews]) {
						struct ms_tensor *v = &p->views[p->nviews];

						if (!(v->name = ms_strdup(v->name)))
							return ms_err_nomem(err);
						p->nviews++;
					}
					if (!is_float(it->src->dtype) || it->src->ndim != 2 ||
					    it->src->shape[0] != w->rows || it->src->shape[1] != w->cols)
						return ms_err_set(err, MS_EINVAL,
								  "tensor '%s' in '%s': the source must be a bf16, f16 or f32 [%llu, %llu] matrix",
								  name, it->src->file->path,
								  (unsigned long long)w->rows,
								  (unsigned long long)w->cols);
				}
				rc = add_weight_outs(p, ocap, w->prefix, w->rows, w->cols,
						     have ? MS_QUANT_ROWWISE : MS_QUANT_COLUMNWISE,
						     w->format, 0, p->nitems - 1, fi, err);
			} else {
				uint64_t shape[2] = {w->rows, w->cols};
				char name[MS_ST_MAX_NAME + 16];

				snprintf(name, sizeof(name), "%s.weight", w->prefix);
				rc = add_out(p, ocap, name, p->opts.dtype, 2, shape, MS_QOUT_DECODED,
					     MS_NVFP4_LAYOUT_ROWWISE, p->nitems - 1, fi, err);
			}
			if (rc != MS_OK)
				return rc;
		}
	}
	return MS_OK;
}

static int cmp_qout_ptr(const void *a, const void *b)
{
	return strcmp((*(const struct ms_qout *const *)a)->name,
		      (*(const struct ms_qout *const *)b)->name);
}

/* An output name made twice (an input tensor already called like a
 * companion the plan adds) is refused before anything is written. */
static int check_unique(const struct ms_quant_plan *p, struct ms_err *err)
{
	const struct ms_qout **v = ms_malloc((p->nouts + 1) * sizeof(*v));
	int rc = MS_OK;

	if (!v)
		return ms_err_nomem(err);
	for (size_t i = 0; i < p->nouts; i++)
		v[i] = &p->outs[i];
	qsort(v, p->nouts, sizeof(*v), cmp_qout_ptr);
	for (size_t i = 1; i < p->nouts; i++) {
		if (!strcmp(v[i]->name, v[i - 1]->name)) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': the output would hold two tensors named '%s'",
					p->in_path, v[i]->name);
			break;
		}
	}
	ms_free(v);
	return rc;
}

int ms_quant_plan_new(const char *in_path, const char *out_path,
		      const struct ms_quant_opts *opts,
		      struct ms_quant_plan **out, struct ms_err *err)
{
	struct ms_quant_plan *p = ms_calloc(1, sizeof(*p));
	size_t icap = 0, ocap = 0;
	struct stat st;
	char *in_dir = NULL;
	int rc;

	*out = NULL;
	if (!p || !(p->stage = ms_malloc(sizeof(*p->stage)))) {
		ms_free(p);
		return ms_err_nomem(err);
	}
	ms_stage_init(p->stage);
	p->opts = *opts;
	/* the strings are the plan's own, so opts may go away */
	p->opts.include = p->opts.exclude = p->opts.source = NULL;
	if ((opts->include && !(p->opts.include = ms_strdup(opts->include))) ||
	    (opts->exclude && !(p->opts.exclude = ms_strdup(opts->exclude)))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	p->in_path = ms_strdup(in_path);
	p->out_path = ms_strdup(out_path);
	p->dest = ms_strdup(out_path);
	if (!p->in_path || !p->out_path || !p->dest) {
		rc = ms_err_nomem(err);
		goto out;
	}
	/* "out/" names the directory out: renames and names beside it need
	 * the name without the slash */
	for (size_t n = strlen(p->dest); n > 1 && p->dest[n - 1] == '/'; n--)
		p->dest[n - 1] = 0;
	if (opts->op == MS_QUANT_OP_QUANTIZE) {
		if (!opts->format_set)
			p->opts.format = ms_quant_default_format(opts->recipe);
		if (!(p->opts.layouts & (MS_QUANT_ROWWISE | MS_QUANT_COLUMNWISE)))
			p->opts.layouts = MS_QUANT_ROWWISE;
		if ((rc = choose_device(opts->device, &p->device, err)) != MS_OK)
			goto out;
	}
	if (opts->op == MS_QUANT_OP_DEQUANTIZE && opts->dtype != MS_DTYPE_BF16 &&
	    opts->dtype != MS_DTYPE_F32) {
		rc = ms_err_set(err, MS_EINVAL, "dequantize writes bf16 or f32");
		goto out;
	}
	if ((rc = ms_ckpt_open(in_path, &p->in, err)) != MS_OK)
		goto out;
	if (opts->source) {
		if ((rc = ms_ckpt_open(opts->source, &p->source, err)) != MS_OK)
			goto out;
		if (!(p->opts.source = ms_strdup(opts->source))) {
			rc = ms_err_nomem(err);
			goto out;
		}
	}
	if ((rc = ms_qview_open(p->in, &p->view, err)) != MS_OK)
		goto out;
	if (stat(in_path, &st) == 0 && S_ISDIR(st.st_mode)) {
		in_dir = ms_strdup(in_path);
		p->out_is_dir = 1;
	} else if (ms_str_ends_with(in_path, ".json")) {
		const char *slash = strrchr(in_path, '/');

		in_dir = slash ? ms_strndup(in_path, (size_t)(slash - in_path) + (slash == in_path))
			       : ms_strdup(".");
		p->out_is_dir = 1;
	}
	if (p->out_is_dir && !in_dir) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (!p->out_is_dir && p->in->nfiles != 1) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': expected one file", in_path);
		goto out;
	}
	if (!opts->force && file_exists(out_path)) {
		rc = ms_err_set(err, MS_EEXIST, "'%s' already exists (--force replaces it)",
				out_path);
		goto out;
	}
	if (opts->force && lstat(p->dest, &st) == 0 && (rc = replaceable(p, &st, err)) != MS_OK)
		goto out;
	p->nfiles = p->in->nfiles;
	p->files = ms_calloc(p->nfiles, sizeof(*p->files));
	p->file_names = ms_calloc(p->nfiles, sizeof(*p->file_names));
	p->file_meta = ms_calloc(p->nfiles, sizeof(*p->file_meta));
	if (!p->files || !p->file_names || !p->file_meta) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < p->nfiles; i++) {
		p->file_names[i] = ms_strdup(p->out_is_dir ? p->in->file_names[i]
							 : ms_path_base(out_path));
		p->files[i] = p->out_is_dir ? ms_path_join(out_path, p->in->file_names[i])
					    : ms_strdup(out_path);
		if (!p->files[i] || !p->file_names[i]) {
			rc = ms_err_nomem(err);
			goto out;
		}
	}
	if (p->out_is_dir && (rc = list_copies(p, in_dir, err)) != MS_OK)
		goto out;
	if (opts->op == MS_QUANT_OP_QUANTIZE && p->out_is_dir &&
	    (rc = read_hidden_size(p, in_dir, err)) != MS_OK)
		goto out;
	if (opts->op == MS_QUANT_OP_QUANTIZE)
		rc = plan_quantize(p, &icap, &ocap, err);
	else
		rc = plan_read(p, &icap, &ocap, err);
	if (rc != MS_OK)
		goto out;
	if ((rc = check_unique(p, err)) != MS_OK)
		goto out;
	if (opts->op != MS_QUANT_OP_DEQUANTIZE) {
		for (size_t i = 0; i < p->nfiles; i++)
			if ((rc = build_file_meta(p, i, err)) != MS_OK)
				goto out;
	}
	rc = MS_OK;
out:
	ms_free(in_dir);
	if (rc != MS_OK) {
		ms_quant_plan_free(p);
		return rc;
	}
	*out = p;
	return MS_OK;
}

void ms_quant_plan_free(struct ms_quant_plan *p)
{
	if (!p)
		return;
	ms_stage_abort(p->stage);
	ms_free(p->stage);
	ms_free(p->dest);
	ms_qview_release(&p->view);
	ms_ckpt_close(p->in);
	ms_ckpt_close(p->source);
	for (size_t i = 0; i < p->nouts; i++)
		ms_free(p->outs[i].name);
	ms_free(p->outs);
	for (size_t i = 0; i < p->nitems; i++)
		ms_free(p->items[i].eamax);
	ms_free(p->items);
	for (size_t i = 0; i < p->nviews; i++)
		ms_free((char *)p->views[i].name);
	ms_free(p->views);
	for (size_t i = 0; i < p->nfiles; i++) {
		if (p->files)
			ms_free(p->files[i]);
		if (p->file_names)
			ms_free(p->file_names[i]);
		if (p->file_meta)
			cJSON_free(p->file_meta[i]);
	}
	ms_free(p->files);
	ms_free(p->file_names);
	ms_free(p->file_meta);
	for (size_t i = 0; i < p->ncopies; i++)
		ms_free(p->copy_names[i]);
	ms_free(p->copy_names);
	for (size_t i = 0; i < p->nexcluded; i++)
		ms_free(p->excluded[i]);
	ms_free(p->excluded);
	for (size_t i = 0; i < p->nembeds; i++)
		ms_free(p->embeds[i]);
	ms_free(p->embeds);
	for (size_t i = 0; i < p->nragged; i++)
		ms_free(p->ragged[i]);
	ms_free(p->ragged);
	ms_free(p->in_path);
	ms_free(p->out_path);
	ms_free((char *)p->opts.source);
	ms_free((char *)p->opts.include);
	ms_free((char *)p->opts.exclude);
	ms_free(p);
}

/* ---- execute ------------------------------------------------------------ */

static struct ms_nvfp4_src src_of(const struct ms_tensor *t)
{
	struct ms_nvfp4_src s = {t->dtype, t->data, t->shape[0], t->shape[1]};

	return s;
}

static int tensor_amax(const struct ms_quant_plan *p, const struct ms_tensor *t,
		       float *amax, struct ms_err *err)
{
	struct ms_nvfp4_src s = src_of(t);

	if (ms_nvfp4_amax(&s, p->opts.allow_nonfinite, p->opts.jobs, MS_NVFP4_ISA_AUTO,
			  amax, err) != MS_OK)
		return ms_err_prefix(err, "tensor '%s' in '%s'", t->name, t->file->path);
	return MS_OK;
}

/* quantize: every selected tensor's amax (finding non-finite values before
 * anything is written), then each fused group's maximum */
static int prepass_quantize(struct ms_quant_plan *p, struct ms_err *err)
{
	float *gmax = ms_calloc(p->nitems + 1, sizeof(float));
	int rc = MS_OK;

	if (!gmax)
		return ms_err_nomem(err);
	for (size_t i = 0; i < p->nitems && rc == MS_OK; i++) {
		struct ms_qitem *it = &p->items[i];

		if (!it->quantized)
			continue;
		if (it->experts) {
			/* each expert slice has its own tensor scale */
			if (!(it->eamax = ms_malloc((size_t)it->experts * sizeof(float)))) {
				rc = ms_err_nomem(err);
				break;
			}
			it->amax = 0;
			for (uint64_t e = 0; e < it->experts && rc == MS_OK; e++) {
				struct ms_tensor v;
				struct ms_nvfp4_src sv;

				slice_view(it->src, e, 0, it->rows, &v);
				sv = src_of(&v);
				/* an element index is within the expert's slice */
				if ((rc = ms_nvfp4_amax(&sv, p->opts.allow_nonfinite, p->opts.jobs,
							MS_NVFP4_ISA_AUTO, &it->eamax[e], err)) != MS_OK)
					ms_err_prefix(err, "tensor '%s' in '%s', expert %llu", v.name,
						      v.file->path, (unsigned long long)e);
				else if (it->eamax[e] > it->amax)
					it->amax = it->eamax[e];
			}
			continue;
		}
		if ((rc = tensor_amax(p, it->src, &it->amax, err)) != MS_OK)
			break;
		if (it->group >= 0 && it->amax > gmax[it->group])
			gmax[it->group] = it->amax;
	}
	for (size_t i = 0; i < p->nitems && rc == MS_OK; i++) {
		struct ms_qitem *it = &p->items[i];

		it->tscale_amax = it->group >= 0 ? gmax[it->group] : it->amax;
	}
	ms_free(gmax);
	return rc;
}

static int qweight_params(const struct ms_qweight *w, enum ms_nvfp4_layout layout,
			  int jobs, struct ms_nvfp4_params *np)
{
	memset(np, 0, sizeof(*np));
	np->recipe = w->recipe;
	np->block = w->block;
	np->layout = layout;
	np->nthreads = jobs;
	return MS_OK;
}

/* transpose with 1D blocks: the tensor scale the source reproduces (own
 * amax, or its fused group's), and a check that the source gives the bytes
 * the checkpoint holds */
static int prepass_transpose(struct ms_quant_plan *p, struct ms_err *err)
{
	uint8_t *pk = NULL, *sc = NULL;
	int rc = MS_OK;

	for (size_t i = 0; i < p->nitems && rc == MS_OK; i++) {
		struct ms_qitem *it = &p->items[i];
		const struct ms_qweight *w;
		struct ms_nvfp4_tscale ts;
		struct ms_nvfp4_params np;
		struct ms_nvfp4_src s;
		char key[MS_ST_MAX_NAME + 16], name[MS_ST_MAX_NAME + 16];
		float group = 0.0f, cand[2];
		int have, found = 0;
		uint64_t ps[2], ss[2];

		if (it->qweight < 0 || !it->src)
			continue;
		w = &p->view.weights[it->qweight];
		have = w->packed[0] ? 0 : 1;
		if ((rc = tensor_amax(p, it->src, &it->amax, err)) != MS_OK)
			break;
		snprintf(name, sizeof(name), "%s.weight", w->prefix);
		group = it->amax;
		if (ms_quant_fuse_key(name, key, sizeof(key))) {
			for (size_t k = 0; k < p->view.nweights; k++) {
				const struct ms_qweight *o = &p->view.weights[k];
				char okey[MS_ST_MAX_NAME + 16], oname[MS_ST_MAX_NAME + 16];
				const struct ms_tensor *os;
				struct ms_tensor oslice;
				float a;

				snprintf(oname, sizeof(oname), "%s.weight", o->prefix);
				if (o == w || !ms_quant_fuse_key(oname, okey, sizeof(okey)) ||
				    strcmp(okey, key) || o->tscale_value != w->tscale_value)
					continue;
				os = source_weight(p->source, o->prefix, &oslice);
				if (!os || !is_float(os->dtype) || os->ndim != 2)
					continue;
				if ((rc = tensor_amax(p, os, &a, err)) != MS_OK)
					goto out;
				if (a > group)
					group = a;
			}
		}
		cand[0] = it->amax;
		cand[1] = group;
		for (int c = 0; c < 2 && !found; c++) {
			if (ms_nvfp4_tscale_init_src(w->recipe, cand[c], it->src->dtype, &ts, NULL) == MS_OK &&
			    ms_nvfp4_tscale_value(&ts, w->tscale_kind) == w->tscale_value) {
				it->tscale_amax = cand[c];
				found = 1;
			}
		}
		if (!found) {
			ms_nvfp4_tscale_init_src(w->recipe, it->amax, it->src->dtype, &ts, NULL);
			rc = ms_err_set(err, MS_EINVAL,
					"tensor '%s' in '%s' is not the source of module '%s': its tensor scale would be %.9g (recipe %s), '%s' holds %.9g",
					it->src->name, it->src->file->path, w->prefix,
					(double)ms_nvfp4_tscale_value(&ts, w->tscale_kind),
					ms_nvfp4_recipe_name(w->recipe),
					w->tscale->name, (double)w->tscale_value);
			break;
		}
		/* the bytes the checkpoint holds must come out again */
		qweight_params(w, (enum ms_nvfp4_layout)have, p->opts.jobs, &np);
		np.flags = p->opts.allow_nonfinite ? MS_NVFP4_ALLOW_NONFINITE : 0;
		ms_nvfp4_shapes(w->rows, w->cols, (enum ms_nvfp4_layout)have, ps, ss, NULL);
		ms_free(pk);
		ms_free(sc);
		pk = ms_malloc(ps[0] * ps[1] + 1);
		sc = ms_malloc(ss[0] * ss[1] + 1);
		if (!pk || !sc) {
			rc = ms_err_nomem(err);
			break;
		}
		s = src_of(it->src);
		if ((rc = run_quantize(p, &np, &s, it->tscale_amax, pk, sc, err)) != MS_OK) {
			ms_err_prefix(err, "tensor '%s' in '%s'", it->src->name, it->src->file->path);
			break;
		}
		if (memcmp(pk, w->packed[have]->data, ps[0] * ps[1]) ||
		    memcmp(sc, w->scales[have]->data, ss[0] * ss[1])) {
			rc = ms_err_set(err, MS_EINVAL,
					"tensor '%s' in '%s' does not reproduce the %s bytes of module '%s' with recipe %s: not its source, or another recipe",
					it->src->name, it->src->file->path,
					ms_nvfp4_layout_name((enum ms_nvfp4_layout)have), w->prefix,
					ms_nvfp4_recipe_name(w->recipe));
			break;
		}
	}
out:
	ms_free(pk);
	ms_free(sc);
	return rc;
}

/* The bytes of one item's outputs, made when its first output is written. */
struct item_bufs {
	size_t item;
	int ready;
	uint8_t *pk[2], *sc[2];
	uint8_t ts[4];
	uint8_t *tsv;   /* a fused item's tensor scales, one per expert */
	void *dec;
};

static void bufs_release(struct item_bufs *b)
{
	for (int l = 0; l < 2; l++) {
		ms_free(b->pk[l]);
		ms_free(b->sc[l]);
	}
	ms_free(b->dec);
	ms_free(b->tsv);
	memset(b, 0, sizeof(*b));
}

static int alloc_layout(struct item_bufs *b, int l, uint64_t rows, uint64_t cols,
			struct ms_err *err)
{
	uint64_t ps[2], ss[2];
	int rc;

	if ((rc = ms_nvfp4_shapes(rows, cols, (enum ms_nvfp4_layout)l, ps, ss, err)) != MS_OK)
		return rc;
	if (ps[0] * ps[1] > SIZE_MAX - 1 || !(b->pk[l] = ms_malloc((size_t)(ps[0] * ps[1]) + 1)) ||
	    !(b->sc[l] = ms_malloc((size_t)(ss[0] * ss[1]) + 1)))
		return ms_err_nomem(err);
	return MS_OK;
}

/* A fused 3-D item: every expert slice into its place of [E, ...]. */
static int produce_fused(struct ms_quant_plan *p, const struct ms_qitem *it,
			 struct item_bufs *b, struct ms_err *err)
{
	struct ms_nvfp4_params np = {
		.recipe = p->opts.recipe, .block = p->opts.block,
		.layout = MS_NVFP4_LAYOUT_ROWWISE,
		.flags = p->opts.allow_nonfinite ? MS_NVFP4_ALLOW_NONFINITE : 0,
		.nthreads = p->opts.jobs,
	};
	uint64_t ps[2], ss[2], np_b, ns_b;
	int rc;

	if ((rc = ms_nvfp4_shapes(it->rows, it->cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, err)) != MS_OK)
		return rc;
	if (ms_mul_u64(ps[0] * ps[1], it->experts, &np_b) ||
	    ms_mul_u64(ss[0] * ss[1], it->experts, &ns_b) || np_b > SIZE_MAX - 1 ||
	    !(b->pk[0] = ms_malloc((size_t)np_b + 1)) || !(b->sc[0] = ms_malloc((size_t)ns_b + 1)) ||
	    !(b->tsv = ms_malloc((size_t)it->experts * 4)))
		return ms_err_nomem(err);
	for (uint64_t e = 0; e < it->experts; e++) {
		struct ms_nvfp4_tscale ts;
		struct ms_tensor v;
		struct ms_nvfp4_src s;

		slice_view(it->src, e, 0, it->rows, &v);
		s = src_of(&v);
		if ((rc = run_quantize(p, &np, &s, it->eamax[e], b->pk[0] + e * ps[0] * ps[1],
				       b->sc[0] + e * ss[0] * ss[1], err)) != MS_OK ||
		    (rc = ms_nvfp4_tscale_init(p->opts.recipe, it->eamax[e], &ts, err)) != MS_OK)
			return ms_err_prefix(err, "tensor '%s' in '%s', expert %llu", it->src->name,
					     it->src->file->path, (unsigned long long)e);
		write_f32(b->tsv + 4 * e,
			  ms_nvfp4_tscale_value(&ts, p->opts.format == MS_QUANT_FORMAT_MODELOPT
							     ? MS_NVFP4_TSCALE_MUL
							     : MS_NVFP4_TSCALE_DIV));
	}
	return MS_OK;
}

static int produce_quantize(struct ms_quant_plan *p, const struct ms_qitem *it,
			    struct item_bufs *b, struct ms_err *err)
{
	struct ms_nvfp4_tscale ts;
	int rc;

	if (it->experts)
		return produce_fused(p, it, b, err);

#ifdef MS_QUANT_GPU
	/* both layouts from one pass over the tensor, as the kernels can: the
	 * bytes cross the bus once */
	if (p->device == MS_QUANT_DEVICE_CUDA && (p->opts.layouts & 3u) == 3u) {
		struct ms_nvfp4_params np = {
			.recipe = p->opts.recipe, .block = p->opts.block,
			.flags = p->opts.allow_nonfinite ? MS_NVFP4_ALLOW_NONFINITE : 0,
		};
		struct ms_nvfp4_src s = src_of(it->src);

		if ((rc = alloc_layout(b, 0, it->rows, it->cols, err)) != MS_OK ||
		    (rc = alloc_layout(b, 1, it->rows, it->cols, err)) != MS_OK)
			return rc;
		if ((rc = ms_gpu_nvfp4_quantize_host(&np, &s, it->tscale_amax, 0, b->pk[0],
						     b->sc[0], b->pk[1], b->sc[1], err)) != MS_OK)
			return ms_err_prefix(err, "tensor '%s' in '%s'", it->src->name,
					     it->src->file->path);
		goto tscale;
	}
#endif
	for (int l = 0; l < 2; l++) {
		struct ms_nvfp4_params np = {
			.recipe = p->opts.recipe, .block = p->opts.block,
			.layout = (enum ms_nvfp4_layout)l,
			.flags = p->opts.allow_nonfinite ? MS_NVFP4_ALLOW_NONFINITE : 0,
			.nthreads = p->opts.jobs,
		};
		struct ms_nvfp4_src s = src_of(it->src);

		if (!(p->opts.layouts & (1u << l)))
			continue;
		if ((rc = alloc_layout(b, l, it->rows, it->cols, err)) != MS_OK)
			return rc;
		if ((rc = run_quantize(p, &np, &s, it->tscale_amax, b->pk[l], b->sc[l], err)) != MS_OK)
			return ms_err_prefix(err, "tensor '%s' in '%s'", it->src->name,
					     it->src->file->path);
	}
#ifdef MS_QUANT_GPU
tscale:
#endif
	if ((rc = ms_nvfp4_tscale_init_src(p->opts.recipe, it->tscale_amax, it->src->dtype,
						   &ts, err)) != MS_OK)
		return ms_err_prefix(err, "tensor '%s' in '%s'", it->src->name, it->src->file->path);
	write_f32(b->ts, ms_nvfp4_tscale_value(&ts, p->opts.format == MS_QUANT_FORMAT_MODELOPT
							 ? MS_NVFP4_TSCALE_MUL
							 : MS_NVFP4_TSCALE_DIV));
	return MS_OK;
}

static int produce_transpose(struct ms_quant_plan *p, const struct ms_qitem *it,
			     struct item_bufs *b, struct ms_err *err)
{
	const struct ms_qweight *w = &p->view.weights[it->qweight];
	int have = w->packed[0] ? 0 : 1, want = 1 - have;
	int rc;

	if ((rc = alloc_layout(b, want, w->rows, w->cols, err)) != MS_OK)
		return rc;
	if (w->block == MS_NVFP4_BLOCK_2D) {
		rc = ms_nvfp4_transpose(MS_NVFP4_BLOCK_2D, have ? w->cols : w->rows,
					have ? w->rows : w->cols, w->packed[have]->data,
					w->scales[have]->data, b->pk[want], b->sc[want], err);
		if (rc != MS_OK)
			return ms_err_prefix(err, "tensor '%s' in '%s'", w->packed[have]->name,
					     w->packed[have]->file->path);
		return MS_OK;
	} else {
		struct ms_nvfp4_params np;
		struct ms_nvfp4_src s = src_of(it->src);

		qweight_params(w, (enum ms_nvfp4_layout)want, p->opts.jobs, &np);
		np.flags = p->opts.allow_nonfinite ? MS_NVFP4_ALLOW_NONFINITE : 0;
		if ((rc = run_quantize(p, &np, &s, it->tscale_amax, b->pk[want], b->sc[want],
				       err)) != MS_OK)
			return ms_err_prefix(err, "tensor '%s' in '%s'", it->src->name,
					     it->src->file->path);
	}
	return MS_OK;
}

static int produce_decoded(struct ms_quant_plan *p, const struct ms_qitem *it,
			   struct item_bufs *b, struct ms_err *err)
{
	const struct ms_qweight *w = &p->view.weights[it->qweight];
	enum ms_dtype dt = p->opts.dtype;
	uint64_t n = w->rows * w->cols;
	float *tmp = NULL;
	int rc = MS_OK;

	if (it->experts) {
		/* every slice of a fused tensor; w is one of them, and the
		 * slices lie one after the other in the tensors it views */
		uint64_t ps[2], ss[2], esz = dt == MS_DTYPE_F32 ? 4 : 2;
		const uint8_t *pk, *sc, *ts;

		if ((rc = ms_nvfp4_shapes(w->rows, w->cols, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, err)) != MS_OK)
			return rc;
		pk = w->packed[0]->data - (uint64_t)w->expert * ps[0] * ps[1];
		sc = w->scales[0]->data - (uint64_t)w->expert * ss[0] * ss[1];
		ts = w->tscale->data - (uint64_t)w->expert * 4;
		if (!(b->dec = ms_malloc((size_t)(n * it->experts * esz) + 1)))
			return ms_err_nomem(err);
		for (uint64_t e = 0; e < it->experts; e++) {
			rc = ms_nvfp4_dequantize(pk + e * ps[0] * ps[1], sc + e * ss[0] * ss[1], w->rows,
						 w->cols, read_f32(ts + 4 * e), w->tscale_kind, dt,
						 (uint8_t *)b->dec + e * n * esz, p->opts.jobs, err);
			if (rc != MS_OK)
				return ms_err_prefix(err, "tensor '%s' in '%s', expert %llu",
						     w->packed[0]->name, w->packed[0]->file->path,
						     (unsigned long long)e);
		}
		return MS_OK;
	}
	if (!(b->dec = ms_malloc((size_t)n * (dt == MS_DTYPE_F32 ? 4 : 2) + 1)))
		return ms_err_nomem(err);
	if (w->packed[0]) {
		rc = ms_nvfp4_dequantize(w->packed[0]->data, w->scales[0]->data, w->rows, w->cols,
					 w->tscale_value, w->tscale_kind, dt, b->dec,
					 p->opts.jobs, err);
		if (rc != MS_OK)
			rc = ms_err_prefix(err, "tensor '%s' in '%s'", w->packed[0]->name,
					   w->packed[0]->file->path);
		goto out;
	}
	/* only the columnwise copy: decode W^T and transpose it back */
	if (!(tmp = ms_malloc((size_t)n * 4 + 1))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = ms_qweight_decode(w, MS_NVFP4_LAYOUT_COLUMNWISE, p->opts.jobs, tmp, err)) != MS_OK)
		goto out;
	for (uint64_t r = 0; r < w->rows; r++) {
		for (uint64_t c = 0; c < w->cols; c++) {
			float v = tmp[c * w->rows + r];
			uint8_t *o = (uint8_t *)b->dec + (r * w->cols + c) * (dt == MS_DTYPE_F32 ? 4 : 2);

			if (dt == MS_DTYPE_F32) {
				write_f32(o, v);
			} else {
				uint32_t u;

				memcpy(&u, (float[]){ms_nvfp4_bf16_round(v)}, 4);
				o[0] = (uint8_t)(u >> 16);
				o[1] = (uint8_t)(u >> 24);
			}
		}
	}
out:
	ms_free(tmp);
	return rc;
}

static int produce(struct ms_quant_plan *p, size_t item, struct item_bufs *b,
		   struct ms_err *err)
{
	const struct ms_qitem *it = &p->items[item];
	int rc;

	bufs_release(b);
	b->item = item;
	b->ready = 1;
	switch (p->opts.op) {
	case MS_QUANT_OP_QUANTIZE:
		rc = produce_quantize(p, it, b, err);
		break;
	case MS_QUANT_OP_TRANSPOSE:
		rc = produce_transpose(p, it, b, err);
		break;
	default:
		rc = produce_decoded(p, it, b, err);
		break;
	}
	return rc;
}

/*
 * The next item's outputs are made while this one's are written: the
 * writer hashes and writes on one thread, and making an item (the codec on
 * every CPU, or the GPU and the bus) is idle otherwise. A producer thread
 * walks the items in the order the files need them (an item is made once
 * per file it has outputs in, as without the thread) and fills two slots
 * in turn; the writer takes them in the same order and gives each back
 * when it is written. Outputs are the same bytes: each item is made by the
 * same call either way. Without a thread (none could be started, or one
 * item in all) items are made in line.
 */
struct producer {
	struct ms_quant_plan *p;
	size_t *seq, nseq;         /* item indices, in the order they are needed */
	struct item_bufs slot[2];
	int full[2];
	size_t filled, taken;      /* positions in seq */
	int stop, rc, held;        /* held: the writer holds slot[taken & 1] */
	struct ms_err err;
	pthread_mutex_t m;
	pthread_cond_t c;
	pthread_t th;
	int started;
};

static void *produce_all(void *arg)
{
	struct producer *q = arg;

	for (size_t k = 0; k < q->nseq; k++) {
		struct item_bufs *b = &q->slot[k & 1];
		struct ms_err err = {0};
		int rc;

		pthread_mutex_lock(&q->m);
		while (q->full[k & 1] && !q->stop)
			pthread_cond_wait(&q->c, &q->m);
		pthread_mutex_unlock(&q->m);
		if (q->stop)
			break;
		/* interrupted: fail as a produce would, so the writer wakes */
		if ((rc = ms_interrupt_check(&err)) == MS_OK)
			rc = produce(q->p, q->seq[k], b, &err);
		pthread_mutex_lock(&q->m);
		if (rc != MS_OK) {
			q->rc = rc;
			q->err = err;
		} else {
			q->full[k & 1] = 1;
			q->filled = k + 1;
		}
		pthread_cond_broadcast(&q->c);
		pthread_mutex_unlock(&q->m);
		if (rc != MS_OK)
			break;
	}
	return NULL;
}

/* The items write_file asks for, file by file. */
static int producer_start(struct producer *q, struct ms_quant_plan *p, struct ms_err *err)
{
	memset(q, 0, sizeof(*q));
	q->p = p;
	if (!(q->seq = ms_malloc((p->nouts ? p->nouts : 1) * sizeof(*q->seq))))
		return ms_err_nomem(err);
	for (size_t fi = 0; fi < p->nfiles; fi++) {
		size_t first = q->nseq;

		for (size_t i = 0; i < p->nouts; i++) {
			const struct ms_qout *o = &p->outs[i];

			if (o->file != fi || o->kind == MS_QOUT_COPY)
				continue;
			if (q->nseq == first || q->seq[q->nseq - 1] != o->item)
				q->seq[q->nseq++] = o->item;
		}
	}
	if (q->nseq < 2)
		return MS_OK;
	pthread_mutex_init(&q->m, NULL);
	pthread_cond_init(&q->c, NULL);
	if (pthread_create(&q->th, NULL, produce_all, q) == 0) {
		q->started = 1;
	} else {
		pthread_cond_destroy(&q->c);
		pthread_mutex_destroy(&q->m);
	}
	return MS_OK;
}

static void producer_stop(struct producer *q)
{
	if (q->started) {
		pthread_mutex_lock(&q->m);
		q->stop = 1;
		pthread_cond_broadcast(&q->c);
		pthread_mutex_unlock(&q->m);
		pthread_join(q->th, NULL);
		pthread_cond_destroy(&q->c);
		pthread_mutex_destroy(&q->m);
		q->started = 0;
	}
	bufs_release(&q->slot[0]);
	bufs_release(&q->slot[1]);
	ms_free(q->seq);
	q->seq = NULL;
}

/* The outputs of item, made by the producer (NULL q: made now into *inl). */
static int producer_take(struct producer *q, struct ms_quant_plan *p, size_t item,
			 struct item_bufs *inl, struct item_bufs **out, struct ms_err *err)
{
	struct item_bufs *b;
	int rc;

	if (!q || !q->started) {
		*out = inl;
		return produce(p, item, inl, err);
	}
	pthread_mutex_lock(&q->m);
	while (!q->full[q->taken & 1] && q->rc == MS_OK)
		pthread_cond_wait(&q->c, &q->m);
	b = &q->slot[q->taken & 1];
	if (!q->full[q->taken & 1]) {
		rc = q->rc;
		if (err)
			*err = q->err;
		pthread_mutex_unlock(&q->m);
		return rc;
	}
	q->held = 1;
	pthread_mutex_unlock(&q->m);
	if (q->taken >= q->nseq || q->seq[q->taken] != item || b->item != item)
		return ms_err_set(err, MS_EINVAL, "internal: items out of order");
	*out = b;
	return MS_OK;
}

/* The writer is done with the item it holds. */
static void producer_give(struct producer *q, struct item_bufs *b)
{
	if (!q || !q->started) {
		bufs_release(b);
		return;
	}
	pthread_mutex_lock(&q->m);
	if (q->held) {
		bufs_release(&q->slot[q->taken & 1]);
		q->full[q->taken & 1] = 0;
		q->taken++;
		q->held = 0;
		pthread_cond_broadcast(&q->c);
	}
	pthread_mutex_unlock(&q->m);
}

/* Write output file fi into the staged directory dir, or to the staged
 * file itself (dir NULL). The staging name is new, so nothing is replaced. */
static int write_file(struct ms_quant_plan *p, size_t fi, const char *dir,
		      struct producer *q, struct item_bufs *inl, uint64_t *done,
		      void (*progress)(void *ctx, uint64_t done, uint64_t total),
		      void *progress_ctx, struct ms_err *err)
{
	const struct ms_st_file *in = p->in->files[fi];
	struct ms_st_writer *w = NULL;
	struct item_bufs *b = NULL; /* the item being written, NULL between items */
	char *path = dir ? ms_path_join(dir, p->file_names[fi]) : ms_strdup(ms_stage_path(p->stage));
	int rc;

	if (!path) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = ms_st_writer_new(path, 0, &w, err)) != MS_OK)
		goto out;
	for (size_t m = 0; m < in->nmeta; m++) {
		if (!strcmp(in->meta[m].key, MS_QUANT_META_KEY))
			continue;
		if ((rc = ms_st_writer_meta(w, in->meta[m].key, in->meta[m].value, err)) != MS_OK)
			goto out;
	}
	if (p->file_meta[fi] &&
	    (rc = ms_st_writer_meta(w, MS_QUANT_META_KEY, p->file_meta[fi], err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < p->nouts; i++) {
		const struct ms_qout *o = &p->outs[i];

		if (o->file == fi &&
		    (rc = ms_st_writer_declare(w, o->name, o->dtype, o->ndim, o->shape, err)) != MS_OK)
			goto out;
	}
	for (size_t i = 0; i < p->nouts; i++) {
		const struct ms_qout *o = &p->outs[i];
		const struct ms_qitem *it = &p->items[o->item];
		const void *data = NULL;

		if (o->file != fi)
			continue;
		if ((rc = ms_interrupt_check(err)) != MS_OK)
			goto out;
		if (o->kind != MS_QOUT_COPY && (!b || b->item != o->item)) {
			if (b)
				producer_give(q, b);
			b = NULL;
			if ((rc = producer_take(q, p, o->item, inl, &b, err)) != MS_OK) {
				b = NULL;
				goto out;
			}
		}
		switch (o->kind) {
		case MS_QOUT_COPY:
			data = it->src->data;
			break;
		case MS_QOUT_PACKED:
			data = b->pk[o->layout];
			break;
		case MS_QOUT_SCALES:
			data = b->sc[o->layout];
			break;
		case MS_QOUT_TSCALE:
			data = b->tsv ? b->tsv : b->ts;
			break;
		case MS_QOUT_DECODED:
			data = b->dec;
			break;
		}
		if ((rc = ms_st_writer_data(w, data, o->nbytes, err)) != MS_OK)
			goto out;
		/* an item's outputs are consecutive: free them after its last */
		if (b && (i + 1 == p->nouts || p->outs[i + 1].item != b->item)) {
			producer_give(q, b);
			b = NULL;
		}
		*done += o->nbytes;
		if (progress)
			progress(progress_ctx, *done, p->bytes_out);
	}
	rc = ms_st_writer_commit(w, err);
out:
	ms_st_writer_free(w);
	if (b)
		producer_give(q, b);
	ms_free(path);
	return rc;
}

static cJSON *string_array(char *const *v, size_t n)
{
	cJSON *a = cJSON_CreateArray();

	for (size_t i = 0; a && i < n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateString(v[i]));
	return a;
}

/* Model Optimizer's producer block. Engines key on the name; the version
 * says which tool wrote the files (a PEP 440 local version). */
static cJSON *producer_json(void)
{
	cJSON *pr = cJSON_CreateObject();

	cJSON_AddStringToObject(pr, "name", "modelopt");
	cJSON_AddStringToObject(pr, "version", "0.0.0+msconvert." MS_VERSION);
	return pr;
}

/* Model Optimizer's exclude_modules: every module left unquantized that it
 * lists, Linear layers and embeddings (sorted; the embeddings are not
 * Linear, so compressed-tensors' ignore leaves them out) */
static cJSON *modelopt_excluded(const struct ms_quant_plan *p)
{
	cJSON *a = cJSON_CreateArray();
	size_t i = 0, k = 0;

	while (a && (i < p->nexcluded || k < p->nembeds)) {
		const char *s = k == p->nembeds ||
				 (i < p->nexcluded && strcmp(p->excluded[i], p->embeds[k]) < 0)
					? p->excluded[i++]
					: p->embeds[k++];

		cJSON_AddItemToArray(a, cJSON_CreateString(s));
	}
	return a;
}

/* hf_quant_config.json of the modelopt flavor: weight-only, as Model
 * Optimizer's W4A16_NVFP4 export writes it ("NVFP4" would declare
 * activation quantization, which msconvert does not do) */
static cJSON *hf_quant_config(const struct ms_quant_plan *p)
{
	cJSON *root = cJSON_CreateObject(), *q;

	ms_json_put(root, "producer", producer_json());
	q = cJSON_AddObjectToObject(root, "quantization");
	cJSON_AddStringToObject(q, "quant_algo", "W4A16_NVFP4");
	cJSON_AddNullToObject(q, "kv_cache_quant_algo");
	cJSON_AddNumberToObject(q, "group_size", 16);
	ms_json_put(q, "exclude_modules", modelopt_excluded(p));
	return root;
}

/* The compressed-tensors release whose nvfp4-pack-quantized checkpoints
 * msconvert reproduces (loaders compare it with their own) */
#define CT_FORMAT_VERSION "0.19.0"

/* config.json's quantization_config: Model Optimizer's own conversion of
 * hf_quant_config (weights only: msconvert writes no input scales), or
 * compressed-tensors' nvfp4-pack-quantized weight-only scheme (NVFP4A16)
 * with the fields llm-compressor writes */
static cJSON *quantization_config(const struct ms_quant_plan *p)
{
	cJSON *root = cJSON_CreateObject(), *groups, *g, *wt;

	groups = cJSON_AddObjectToObject(root, "config_groups");
	g = cJSON_AddObjectToObject(groups, "group_0");
	if (p->opts.format == MS_QUANT_FORMAT_MODELOPT) {
		wt = cJSON_AddObjectToObject(g, "weights");
		cJSON_AddFalseToObject(wt, "dynamic");
		cJSON_AddNumberToObject(wt, "num_bits", 4);
		cJSON_AddStringToObject(wt, "type", "float");
		cJSON_AddNumberToObject(wt, "group_size", 16);
		ms_json_put(g, "targets", cJSON_CreateStringArray((const char *[]){"Linear"}, 1));
		ms_json_put(root, "ignore", modelopt_excluded(p));
		cJSON_AddStringToObject(root, "quant_algo", "W4A16_NVFP4");
		ms_json_put(root, "producer", producer_json());
		cJSON_AddStringToObject(root, "quant_method", "modelopt");
		return root;
	}
	cJSON_AddStringToObject(g, "format", "nvfp4-pack-quantized");
	cJSON_AddNullToObject(g, "input_activations");
	cJSON_AddNullToObject(g, "output_activations");
	ms_json_put(g, "targets", cJSON_CreateStringArray((const char *[]){"Linear"}, 1));
	wt = cJSON_AddObjectToObject(g, "weights");
	cJSON_AddNullToObject(wt, "actorder");
	cJSON_AddNullToObject(wt, "block_structure");
	cJSON_AddFalseToObject(wt, "dynamic");
	cJSON_AddNumberToObject(wt, "group_size", 16);
	cJSON_AddNumberToObject(wt, "num_bits", 4);
	cJSON_AddStringToObject(wt, "observer", "memoryless_minmax");
	cJSON_AddObjectToObject(wt, "observer_kwargs");
	cJSON_AddStringToObject(wt, "scale_dtype", "torch.float8_e4m3fn");
	cJSON_AddStringToObject(wt, "strategy", "tensor_group");
	cJSON_AddTrueToObject(wt, "symmetric");
	cJSON_AddStringToObject(wt, "type", "float");
	cJSON_AddNullToObject(wt, "zp_dtype");
	cJSON_AddStringToObject(root, "format", "nvfp4-pack-quantized");
	cJSON_AddNullToObject(root, "global_compression_ratio");
	ms_json_put(root, "ignore", string_array(p->excluded, p->nexcluded));
	cJSON_AddNullToObject(root, "kv_cache_scheme");
	cJSON_AddStringToObject(root, "quant_method", "compressed-tensors");
	cJSON_AddStringToObject(root, "quantization_status", "compressed");
	cJSON_AddObjectToObject(root, "sparsity_config");
	cJSON_AddObjectToObject(root, "transform_config");
	cJSON_AddStringToObject(root, "version", CT_FORMAT_VERSION);
	return root;
}

/* j was built since mark (ms_json_mark): written only when whole. */
static int write_json(const char *path, cJSON *j, uint64_t mark, int force, struct ms_err *err)
{
	char *text = j ? cJSON_Print(j) : NULL;
	int rc;

	if (!text || ms_json_failed(mark)) {
		cJSON_free(text);
		return ms_err_nomem(err);
	}
	rc = ms_file_write_atomic(path, text, strlen(text), force, err);
	cJSON_free(text);
	return rc;
}

/* The other files of the directory, config.json rewritten per operation. */
static int write_side_files(struct ms_quant_plan *p, const char *out_dir,
			    struct ms_err *err)
{
	const char *in_dir = p->in->files[0]->path;
	char *dir = NULL, *text = NULL, *src = NULL, *dst = NULL;
	cJSON *j = NULL;
	size_t len;
	int rc = MS_OK;
	uint64_t mark = ms_json_mark();

	/* the input directory is where its first file lives */
	{
		const char *slash = strrchr(in_dir, '/');

		dir = slash ? ms_strndup(in_dir, (size_t)(slash - in_dir) + (slash == in_dir))
			    : ms_strdup(".");
		if (!dir)
			return ms_err_nomem(err);
	}
	for (size_t i = 0; i < p->ncopies && rc == MS_OK; i++) {
		const char *name = p->copy_names[i];
		int is_cfg = !strcmp(name, "config.json");

		if (!strcmp(name, "hf_quant_config.json") && p->opts.op != MS_QUANT_OP_TRANSPOSE)
			continue; /* rewritten or dropped below */
		src = ms_path_join(dir, name);
		dst = ms_path_join(out_dir, name);
		if (!src || !dst) {
			rc = ms_err_nomem(err);
			break;
		}
		if ((rc = ms_file_read(src, MAX_COPY_FILE, &text, &len, err)) != MS_OK)
			break;
		if (is_cfg && p->opts.op != MS_QUANT_OP_TRANSPOSE) {
			/* only quantization_config changes: the rest of the
			 * text is kept byte for byte (a reprint would turn
			 * 1.0 into 1, which transformers refuses where the
			 * model's config declares a float) */
			char *qtext = NULL, *edited = NULL;
			size_t elen;
			int nomem;

			j = ms_json_parse(text, len, &nomem);
			if (nomem) {
				rc = ms_err_nomem(err);
				break;
			}
			if (!cJSON_IsObject(j)) {
				rc = ms_err_set(err, MS_EINVAL, "'%s' is not a JSON object", src);
				break;
			}
			cJSON_Delete(j);
			j = NULL;
			if (p->opts.op == MS_QUANT_OP_QUANTIZE) {
				j = quantization_config(p);
				qtext = j ? cJSON_Print(j) : NULL;
				cJSON_Delete(j);
				j = NULL;
				if (!qtext || ms_json_failed(mark)) {
					cJSON_free(qtext);
					rc = ms_err_nomem(err);
					break;
				}
			}
			rc = ms_json_splice_member(text, len, "quantization_config", qtext, &edited,
						   &elen, err);
			cJSON_free(qtext);
			if (rc == MS_EINVAL)
				rc = ms_err_prefix(err, "'%s'", src);
			if (rc == MS_OK)
				rc = ms_file_write_atomic(dst, edited, elen, 0, err);
			ms_free(edited);
		} else {
			rc = ms_file_write_atomic(dst, text, len, 0, err);
		}
		ms_free(text);
		ms_free(src);
		ms_free(dst);
		text = src = dst = NULL;
	}
	if (rc == MS_OK && p->opts.op == MS_QUANT_OP_QUANTIZE &&
	    p->opts.format == MS_QUANT_FORMAT_MODELOPT) {
		if (!(dst = ms_path_join(out_dir, "hf_quant_config.json"))) {
			rc = ms_err_nomem(err);
		} else {
			j = hf_quant_config(p);
			rc = write_json(dst, j, mark, 0, err);
		}
	}
	cJSON_Delete(j);
	ms_free(text);
	ms_free(src);
	ms_free(dst);
	ms_free(dir);
	return rc;
}

static int cmp_out_name(const void *a, const void *b)
{
	return strcmp((*(const struct ms_qout *const *)a)->name,
		      (*(const struct ms_qout *const *)b)->name);
}

static int write_index(struct ms_quant_plan *p, const char *out_dir, struct ms_err *err)
{
	uint64_t mark = ms_json_mark();
	const struct ms_qout **v = ms_malloc((p->nouts + 1) * sizeof(*v));
	cJSON *root = cJSON_CreateObject(), *meta, *map;
	char *path = ms_path_join(out_dir, INDEX_NAME);
	int rc;

	if (!v || !root || !path) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < p->nouts; i++)
		v[i] = &p->outs[i];
	qsort(v, p->nouts, sizeof(*v), cmp_out_name);
	meta = cJSON_AddObjectToObject(root, "metadata");
	cJSON_AddNumberToObject(meta, "total_size", (double)p->bytes_out);
	map = cJSON_AddObjectToObject(root, "weight_map");
	for (size_t i = 0; map && i < p->nouts; i++)
		cJSON_AddStringToObject(map, v[i]->name, p->file_names[v[i]->file]);
	rc = write_json(path, root, mark, 0, err);
out:
	ms_free(v);
	ms_free(path);
	cJSON_Delete(root);
	return rc;
}

/* ---- staging and publishing ---------------------------------------------- */

/* What --force may replace: an output of the same kind (see quant.h), so a
 * mistyped OUT never takes a directory of other things with it. st is
 * lstat of p->dest. */
static int replaceable(const struct ms_quant_plan *p, const struct stat *st,
		       struct ms_err *err)
{
	struct dirent *de;
	DIR *d;
	int rc = MS_OK;

	if (S_ISLNK(st->st_mode) || (!p->out_is_dir && S_ISREG(st->st_mode)))
		return MS_OK;
	if (!p->out_is_dir || !S_ISDIR(st->st_mode))
		return ms_err_set(err, MS_EEXIST, "'%s' exists and is not a %s; not replacing it",
				  p->dest, p->out_is_dir ? "directory" : "file");
	if (!(d = opendir(p->dest)))
		return ms_err_set(err, MS_EIO, "'%s': cannot read directory: %s", p->dest,
				  strerror(errno));
	while ((de = readdir(d))) {
		struct stat e;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fstatat(dirfd(d), de->d_name, &e, AT_SYMLINK_NOFOLLOW)) {
			rc = ms_err_set(err, MS_EIO, "'%s/%s': %s", p->dest, de->d_name,
					strerror(errno));
			break;
		}
		if (!S_ISREG(e.st_mode) && !S_ISLNK(e.st_mode)) {
			rc = ms_err_set(err, MS_EEXIST,
					"'%s' holds '%s', which is not a file; not replacing it",
					p->dest, de->d_name);
			break;
		}
	}
	closedir(d);
	return rc;
}

int ms_quant_stage(struct ms_quant_plan *p,
		   void (*progress)(void *ctx, uint64_t done, uint64_t total),
		   void *progress_ctx, struct ms_err *err)
{
	struct item_bufs b;
	struct producer q;
	uint64_t done = 0;
	int rc;

	memset(&b, 0, sizeof(b));
	memset(&q, 0, sizeof(q));
	if (p->stage->tmp)
		return ms_err_set(err, MS_EINVAL, "'%s': the output is already written", p->dest);
	if (p->opts.op == MS_QUANT_OP_QUANTIZE)
		rc = prepass_quantize(p, err);
	else if (p->opts.op == MS_QUANT_OP_TRANSPOSE)
		rc = prepass_transpose(p, err);
	else
		rc = MS_OK;
	if (rc != MS_OK)
		return rc;
	/* the missing parents of a directory output are created, and removed
	 * again when it is not kept */
	if ((rc = ms_stage_open(p->stage, p->dest, "output",
				p->out_is_dir ? MS_STAGE_DIR | MS_STAGE_PARENTS : 0, err)) != MS_OK)
		return rc;
	rc = producer_start(&q, p, err);
	for (size_t fi = 0; fi < p->nfiles && rc == MS_OK; fi++)
		rc = write_file(p, fi, p->out_is_dir ? ms_stage_path(p->stage) : NULL, &q, &b, &done, progress,
				progress_ctx, err);
	producer_stop(&q);
	bufs_release(&b);
	if (rc == MS_OK && p->out_is_dir && p->in->index_path)
		rc = write_index(p, ms_stage_path(p->stage), err);
	if (rc == MS_OK && p->out_is_dir)
		rc = write_side_files(p, ms_stage_path(p->stage), err);
	if (rc != MS_OK) {
		ms_stage_fix_msg(p->stage, err);
		ms_quant_finish(p, 0);
	}
	return rc;
}

const char *ms_quant_staged_path(const struct ms_quant_plan *p)
{
	return ms_stage_path(p->stage);
}

int ms_quant_publish(struct ms_quant_plan *p, struct ms_err *err)
{
	struct stat st;
	int rc;

	if (!p->stage->tmp || p->stage->published)
		return ms_err_set(err, MS_EINVAL, "'%s': nothing staged to publish", p->dest);
	if (!p->opts.force || lstat(p->dest, &st))
		return ms_stage_publish(p->stage, MS_STAGE_NEW, err);
	if ((rc = replaceable(p, &st, err)) != MS_OK)
		return rc;
	/* the old output waits until finish */
	return ms_stage_publish(p->stage, MS_STAGE_REPLACE, err);
}

void ms_quant_finish(struct ms_quant_plan *p, int keep)
{
	if (keep && p->stage->published)
		ms_stage_commit(p->stage);
	else
		ms_stage_abort(p->stage);
}

int ms_quant_execute(struct ms_quant_plan *p,
		     void (*progress)(void *ctx, uint64_t done, uint64_t total),
		     void *progress_ctx, struct ms_err *err)
{
	int rc = ms_quant_stage(p, progress, progress_ctx, err);

	if (rc == MS_OK)
		rc = ms_quant_publish(p, err);
	ms_quant_finish(p, rc == MS_OK);
	return rc;
}

int ms_quant_output_digest(const char *out_path, int nthreads,
			   char out[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	struct ms_ckpt *c = NULL;
	int rc;

	if ((rc = ms_ckpt_open(out_path, &c, err)) != MS_OK)
		return rc;
	if ((rc = ms_ckpt_hash(c, nthreads, 0, err)) == MS_OK)
		rc = ms_state_digest(c->tensors, c->ntensors, out, err);
	ms_ckpt_close(c);
	return rc;
}

/* ---- stats -------------------------------------------------------------- */

static void stats_add(struct ms_qstats_entry *t, const struct ms_qstats_entry *e)
{
	for (int k = 0; k < MS_QSTATS_BUCKETS; k++)
		t->scale_hist[k] += e->scale_hist[k];
	t->nelem += e->nelem;
	if (!e->has_source)
		return;
	t->has_source = 1;
	t->err2 += e->err2;
	t->src2 += e->src2;
	t->saturated += e->saturated;
	if (e->max_abs_err > t->max_abs_err)
		t->max_abs_err = e->max_abs_err;
	t->rel_err = t->src2 > 0 ? sqrt(t->err2 / t->src2) : (t->err2 > 0 ? INFINITY : 0.0);
}

static int stats_entry(struct ms_qstats *s, const struct ms_qweight *w,
		       enum ms_nvfp4_layout l, int nthreads, struct ms_qstats_entry *e,
		       struct ms_err *err)
{
	const struct ms_tensor *sc = w->scales[l], *src = NULL;
	struct ms_tensor slice;
	int col = l == MS_NVFP4_LAYOUT_COLUMNWISE;
	uint64_t R = col ? w->cols : w->rows, C = col ? w->rows : w->cols, nb = sc->shape[1];
	float *deq = NULL;
	int rc = MS_OK;

	memset(e, 0, sizeof(*e));
	e->w = w;
	e->layout = l;
	e->nelem = R * C;
	for (uint64_t i = 0; i < sc->nbytes; i++) {
		uint8_t b = sc->data[i];

		e->scale_hist[(b & 0x7f) == 0x7f ? 16 : (b >> 3) & 15]++;
	}
	if (!s->source)
		return MS_OK;
	{
		char name[MS_ST_MAX_NAME + 16];

		snprintf(name, sizeof(name), "%s.weight", w->prefix);
		src = source_weight(s->source, w->prefix, &slice);
		if (!src)
			return ms_err_set(err, MS_EINVAL, "the source has no tensor '%s' (nor a fused expert tensor holding it)", name);
		if (!is_float(src->dtype) || src->ndim != 2 || src->shape[0] != w->rows ||
		    src->shape[1] != w->cols)
			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s' in '%s': the source must be a bf16, f16 or f32 [%llu, %llu] matrix",
					  name, src->file->path, (unsigned long long)w->rows,
					  (unsigned long long)w->cols);
	}
	if (!(deq = ms_malloc((size_t)(R * C) * sizeof(float) + 1)))
		return ms_err_nomem(err);
	if ((rc = ms_qweight_decode(w, l, nthreads, deq, err)) != MS_OK)
		goto out;
	{
		struct ms_nvfp4_src sv = src_of(src);

		e->has_source = 1;
		for (uint64_t r = 0; r < R; r++) {
			for (uint64_t c = 0; c < C; c++) {
				double x = ms_nvfp4_src_get(&sv, col ? c * w->cols + r : r * w->cols + c);
				double d = (double)deq[r * C + c] - x;
				double f = ms_nvfp4_block_decode(sc->data[r * nb + c / 16],
								 w->tscale_value, w->tscale_kind);

				if (!isfinite(x))
					continue;
				e->err2 += d * d;
				e->src2 += x * x;
				if (fabs(d) > e->max_abs_err || isnan(d))
					e->max_abs_err = fabs(d);
				if (f == 0 ? x != 0 : fabs(x) > 6.0 * f)
					e->saturated++;
			}
		}
		e->rel_err = e->src2 > 0 ? sqrt(e->err2 / e->src2) : (e->err2 > 0 ? INFINITY : 0.0);
	}
out:
	ms_free(deq);
	return rc;
}

int ms_qstats_run(const char *path, const char *source_path, int nthreads,
		  struct ms_qstats **out, struct ms_err *err)
{
	struct ms_qstats *s = ms_calloc(1, sizeof(*s));
	int rc;

	*out = NULL;
	if (!s)
		return ms_err_nomem(err);
	if ((rc = ms_ckpt_open(path, &s->ckpt, err)) != MS_OK)
		goto out;
	if (source_path && (rc = ms_ckpt_open(source_path, &s->source, err)) != MS_OK)
		goto out;
	if ((rc = ms_qview_open(s->ckpt, &s->view, err)) != MS_OK)
		goto out;
	if (s->view.nweights == 0) {
		rc = ms_err_set(err, MS_EINVAL, "'%s' holds no nvfp4 weights", path);
		goto out;
	}
	s->e = ms_calloc(2 * s->view.nweights, sizeof(*s->e));
	if (!s->e) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < s->view.nweights; i++) {
		for (int l = 0; l < 2; l++) {
			struct ms_qstats_entry *e = &s->e[s->n];

			if (!s->view.weights[i].packed[l])
				continue;
			if ((rc = stats_entry(s, &s->view.weights[i], (enum ms_nvfp4_layout)l,
					      nthreads, e, err)) != MS_OK)
				goto out;
			stats_add(&s->total, e);
			s->n++;
		}
	}
	rc = MS_OK;
out:
	if (rc != MS_OK) {
		ms_qstats_free(s);
		return rc;
	}
	*out = s;
	return MS_OK;
}

void ms_qstats_free(struct ms_qstats *s)
{
	if (!s)
		return;
	ms_qview_release(&s->view);
	ms_ckpt_close(s->ckpt);
	ms_ckpt_close(s->source);
	ms_free(s->e);
	ms_free(s);
}
