/*
 * shard.c: expert-parallel sharding (contract and on-disk layout in shard.h).
 *
 * Every operation works on one model: the source state as a list of tensors
 * (struct src), each classified as replicated, per-expert, fused LoRA A/B or
 * grouped, with a pointer to where each expert's bytes live. For a split
 * the bytes come from the checkpoint being split; for merge, reshard, check
 * and the rank load they come from the shards of a set, described by its
 * manifest. Writers then only ask for "tensor t laid out for experts
 * ids[0..L)", so split, reshard and merge share one code path and reshard
 * gives the bytes split gives.
 */
#include "shard.h"

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

#define META_PREFIX "msinv.ep."
#define MAX_MAP_FILE (64u * 1024u * 1024u)
#define MAX_LORA_RANK (1u << 20)

static const char *const known_param_order[] = {
	/* the order transformers' fused expert modules declare their
	 * parameters, which is the order PEFT wraps them in (innermost
	 * first) */
	"gate_up_proj", "gate_proj", "up_proj", "down_proj",
};

/* ---- placement ----------------------------------------------------------- */

const char *ms_ep_placement_name(enum ms_ep_placement_kind kind)
{
	switch (kind) {
	case MS_EP_PLACEMENT_CONTIGUOUS: return "contiguous";
	case MS_EP_PLACEMENT_ROUND_ROBIN: return "round-robin";
	case MS_EP_PLACEMENT_MAP: return "map";
	}
	return "?";
}

void ms_ep_placement_free(struct ms_ep_placement *p)
{
	if (!p)
		return;
	ms_free(p->rank_of);
	ms_free(p->local_of);
	ms_free(p->first);
	ms_free(p->ids);
	ms_free(p);
}

static int placement_alloc(uint32_t e, uint32_t n, struct ms_ep_placement **out,
			   struct ms_err *err)
{
	struct ms_ep_placement *p = ms_calloc(1, sizeof(*p));

	*out = NULL;
	if (!p)
		return ms_err_nomem(err);
	p->num_experts = e;
	p->ep_size = n;
	p->rank_of = ms_calloc(e ? e : 1, sizeof(uint32_t));
	p->local_of = ms_calloc(e ? e : 1, sizeof(uint32_t));
	p->first = ms_calloc((size_t)n + 1, sizeof(uint32_t));
	p->ids = ms_calloc(e ? e : 1, sizeof(uint32_t));
	if (!p->rank_of || !p->local_of || !p->first || !p->ids) {
		ms_ep_placement_free(p);
		return ms_err_nomem(err);
	}
	*out = p;
	return MS_OK;
}

static void placement_index(struct ms_ep_placement *p)
{
	for (uint32_t r = 0; r < p->ep_size; r++)
		for (uint32_t i = p->first[r]; i < p->first[r + 1]; i++) {
			p->rank_of[p->ids[i]] = r;
			p->local_of[p->ids[i]] = i - p->first[r];
		}
}

static int placement_builtin(enum ms_ep_placement_kind kind, uint32_t e, uint32_t n,
			     struct ms_ep_placement **out, struct ms_err *err)
{
	struct ms_ep_placement *p;
	uint32_t l;
	int rc;

	*out = NULL;
	if (n == 0 || n > MS_EP_MAX_RANKS)
		return ms_err_set(err, MS_EINVAL, "ep size %u is not in 1..%u", n, MS_EP_MAX_RANKS);
	if (e == 0 || e > MS_EP_MAX_EXPERTS)
		return ms_err_set(err, MS_EINVAL, "number of experts %u is not in 1..%u", e,
				  MS_EP_MAX_EXPERTS);
	if (e % n)
		return ms_err_set(err, MS_EINVAL,
				  "%u experts do not divide evenly over %u ranks: the %s placement "
				  "needs a multiple; give an explicit placement map",
				  e, n, ms_ep_placement_name(kind));
	if ((rc = placement_alloc(e, n, &p, err)) != MS_OK)
		return rc;
	p->kind = kind;
	l = e / n;
	for (uint32_t r = 0; r <= n; r++)
		p->first[r] = r * l;
	for (uint32_t r = 0; r < n; r++)
		for (uint32_t i = 0; i < l; i++)
			p->ids[r * l + i] = kind == MS_EP_PLACEMENT_CONTIGUOUS ? r * l + i : i * n + r;
	placement_index(p);
	*out = p;
	return MS_OK;
}

/* An integral JSON number in [0, max]. */
static int json_u64(const cJSON *j, uint64_t max, uint64_t *out)
{
	double v;

	if (!cJSON_IsNumber(j))
		return -1;
	v = j->valuedouble;
	if (!(v >= 0) || v > (double)max || v != floor(v) || v > 9007199254740992.0)
		return -1;
	*out = (uint64_t)v;
	return 0;
}

static int placement_from_ranks(const cJSON *ranks, const char *label, uint32_t e,
				uint32_t n, struct ms_ep_placement **out,
				struct ms_err *err)
{
	struct ms_ep_placement *p = NULL;
	uint8_t *seen = NULL;
	uint64_t total = 0, nr;
	const cJSON *rank, *id;
	uint32_t r, k;
	int rc = MS_OK;

	*out = NULL;
	if (!cJSON_IsArray(ranks))
		return ms_err_set(err, MS_EINVAL, "'%s': \"ranks\" must be an array of arrays of expert ids",
				  label);
	nr = (uint64_t)cJSON_GetArraySize(ranks);
	if (nr == 0 || nr > MS_EP_MAX_RANKS)
		return ms_err_set(err, MS_EINVAL, "'%s': %llu ranks; want 1..%u", label,
				  (unsigned long long)nr, MS_EP_MAX_RANKS);
	if (n && nr != n)
		return ms_err_set(err, MS_EINVAL, "'%s': the map has %llu ranks, but the ep size is %u",
				  label, (unsigned long long)nr, n);
	cJSON_ArrayForEach(rank, ranks) {
		if (!cJSON_IsArray(rank))
			return ms_err_set(err, MS_EINVAL, "'%s': every rank must be an array of expert ids",
					  label);
		total += (uint64_t)cJSON_GetArraySize(rank);
	}
	if (total == 0 || total > MS_EP_MAX_EXPERTS)
		return ms_err_set(err, MS_EINVAL, "'%s': the map places %llu experts; want 1..%u", label,
				  (unsigned long long)total, MS_EP_MAX_EXPERTS);
	if (e && total != e)
		return ms_err_set(err, MS_EINVAL, "'%s': the map places %llu experts, but the model has %u",
				  label, (unsigned long long)total, e);
	if ((rc = placement_alloc((uint32_t)total, (uint32_t)nr, &p, err)) != MS_OK)
		return rc;
	p->kind = MS_EP_PLACEMENT_MAP;
	seen = ms_calloc((size_t)total, 1);
	if (!seen) {
		rc = ms_err_nomem(err);
		goto out;
	}
	r = 0;
	k = 0;
	cJSON_ArrayForEach(rank, ranks) {
		p->first[r] = k;
		cJSON_ArrayForEach(id, rank) {
			uint64_t v;

			if (json_u64(id, total - 1, &v)) {
				rc = ms_err_set(err, MS_EINVAL,
						"'%s': rank %u: expert ids must be integers in 0..%llu",
						label, r, (unsigned long long)(total - 1));
				goto out;
			}
			if (seen[v]) {
				rc = ms_err_set(err, MS_EINVAL, "'%s': expert %llu is placed twice",
						label, (unsigned long long)v);
				goto out;
			}
			seen[v] = 1;
			p->ids[k++] = (uint32_t)v;
		}
		r++;
	}
	p->first[r] = k;
	placement_index(p);
	*out = p;
	p = NULL;
out:
	ms_free(seen);
	ms_ep_placement_free(p);
	return rc;
}

int ms_ep_placement_from_json(const char *text, size_t len, const char *label,
			      uint32_t num_experts, uint32_t ep_size,
			      struct ms_ep_placement **out, struct ms_err *err)
{
	cJSON *root;
	int rc, nomem;

	*out = NULL;
	root = ms_json_parse(text, len, &nomem);
	if (nomem)
		return ms_err_nomem(err);
	if (!root || !cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return ms_err_set(err, MS_EINVAL, "'%s': not a JSON object {\"ranks\": [[...], ...]}",
				  label);
	}
	rc = placement_from_ranks(cJSON_GetObjectItemCaseSensitive(root, "ranks"), label,
				  num_experts, ep_size, out, err);
	cJSON_Delete(root);
	return rc;
}

int ms_ep_placement_new(const char *spec, uint32_t num_experts, uint32_t ep_size,
			struct ms_ep_placement **out, struct ms_err *err)
{
	char *text = NULL;
	size_t len;
	int rc;

	*out = NULL;
	if (!spec || !strcmp(spec, "contiguous"))
		return placement_builtin(MS_EP_PLACEMENT_CONTIGUOUS, num_experts, ep_size, out, err);
	if (!strcmp(spec, "round-robin") || !strcmp(spec, "round_robin"))
		return placement_builtin(MS_EP_PLACEMENT_ROUND_ROBIN, num_experts, ep_size, out,
					 err);
	if ((rc = ms_file_read(spec, MAX_MAP_FILE, &text, &len, err)) != MS_OK) {
		if (rc == MS_ENOTFOUND || rc == MS_EIO)
			ms_err_prefix(err, "placement '%s' is neither contiguous, round-robin nor a "
				      "readable map file", spec);
		return rc;
	}
	rc = ms_ep_placement_from_json(text, len, spec, num_experts, ep_size, out, err);
	ms_free(text);
	return rc;
}

static int placement_equal(const struct ms_ep_placement *a, const struct ms_ep_placement *b)
{
	return a->num_experts == b->num_experts && a->ep_size == b->ep_size &&
	       !memcmp(a->first, b->first, ((size_t)a->ep_size + 1) * sizeof(uint32_t)) &&
	       !memcmp(a->ids, b->ids, (size_t)a->num_experts * sizeof(uint32_t));
}

static int placement_copy(const struct ms_ep_placement *a, struct ms_ep_placement **out,
			  struct ms_err *err)
{
	int rc = placement_alloc(a->num_experts, a->ep_size, out, err);

	if (rc != MS_OK)
		return rc;
	(*out)->kind = a->kind;
	memcpy((*out)->first, a->first, ((size_t)a->ep_size + 1) * sizeof(uint32_t));
	memcpy((*out)->ids, a->ids, (size_t)a->num_experts * sizeof(uint32_t));
	placement_index(*out);
	return MS_OK;
}

/* ---- the source model ------------------------------------------------------ */

enum tkind { TK_REPLICATED, TK_EXPERT, TK_FUSED_A, TK_FUSED_B, TK_GROUPED, TK_COUNT };

static const char *const tkind_names[TK_COUNT] = {
	"replicated", "expert", "fused-lora-a", "fused-lora-b", "grouped",
};

#define PACK_PER_EXPERT 1u
#define PACK_FUSED 2u
#define PACK_GROUPED 4u

struct stensor {
	char *name;
	enum ms_dtype dtype;
	uint32_t ndim;
	uint64_t shape[MS_ST_MAX_RANK];
	uint64_t nbytes;
	uint32_t file;                 /* index of the source file */
	uint8_t digest[MS_SHA256_LEN]; /* of the whole source tensor */
	int has_digest;
	enum tkind kind;
	int32_t layer, expert;         /* expert: TK_EXPERT only */
	uint32_t r;                    /* fused LoRA rank */
	char *param, *part;            /* routed kinds: canonical identity */
	/* where the bytes are: data for a tensor one file holds whole; for
	 * sliced kinds, per global expert e the tensor holding it (edata),
	 * e's position there (epos) and how many experts it holds (en) */
	const uint8_t *data;
	const uint8_t **edata;
	uint32_t *epos, *en;
	/* the file tensor behind data (hashed by the caller), if any: its
	 * digest is the one of the bytes actually present */
	const struct ms_tensor *st;
};

/* The canonical slice of one expert of one tensor. */
struct srec {
	uint32_t tensor, expert;
	uint8_t want[MS_SHA256_LEN]; /* from a manifest */
	uint8_t got[MS_SHA256_LEN];  /* computed */
	int has_want, has_got;
};

struct sfile {
	char *name;
	size_t nmeta;
	struct ms_st_meta *meta;
};

struct sconfig {
	char *name;
	char *text;
	size_t len;
	uint8_t digest[MS_SHA256_LEN];
};

struct src {
	const char *label;      /* the input, for messages */
	int is_adapter;
	uint32_t E, r;
	unsigned packing;
	char *index_name;       /* NULL without an index */
	cJSON *index_meta;      /* the index's "metadata", may be NULL */
	size_t nfiles;
	struct sfile *files;
	size_t nconfigs;
	struct sconfig *configs;
	size_t n;
	struct stensor *t;      /* source order: file by file, offset order */
	size_t nrec;
	struct srec *rec;       /* sorted by layer, expert, param, part */
	char digest[MS_STATE_DIGEST_LEN];
	const struct stensor *e_from; /* the fused LoRA A that gave E, if one did */
	int rank_code;          /* the code of a LoRA shape that contradicts r:
				 * MS_EINVAL (0 means it) for an input, MS_ECHECK
				 * for a shard set being verified */
};

static void src_release(struct src *s)
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

static const struct sconfig *src_config(const struct src *s, const char *name)
{
	for (size_t i = 0; i < s->nconfigs; i++)
		if (!strcmp(s->configs[i].name, name))
			return &s->configs[i];
	return NULL;
}

static int is_sliced(enum tkind k)
{
	return k == TK_FUSED_A || k == TK_FUSED_B || k == TK_GROUPED;
}

/* Bytes of one expert's slice of a sliced tensor (whole rows of A or of a
 * grouped tensor; B has no contiguous slice and is handled elementwise). */
static uint64_t slice_bytes(const struct stensor *t, uint32_t e_total)
{
	return t->nbytes / e_total;
}

/* Shape of tensor t when it holds l experts. */
static void local_shape(const struct stensor *t, uint32_t l, uint64_t *shape)
{
	memcpy(shape, t->shape, sizeof(t->shape));
	if (t->kind == TK_FUSED_A)
		shape[0] = (uint64_t)l * t->r;
	else if (t->kind == TK_FUSED_B)
		shape[1] = (uint64_t)l * t->r;
	else if (t->kind == TK_GROUPED)
		shape[0] = l;
}

static int shape_nbytes(enum ms_dtype dt, uint32_t ndim, const uint64_t *shape,
			uint64_t *out)
{
	uint64_t ne = 1;

	for (uint32_t d = 0; d < ndim; d++)
		if (ms_mul_u64(ne, shape[d], &ne))
			return -1;
	return ms_dtype_nbytes(dt, ne, out) ? -1 : 0;
}

static void shape_text(uint32_t ndim, const uint64_t *shape, char *buf, size_t n)
{
	size_t k = 0;

	k += (size_t)snprintf(buf, n, "[");
	for (uint32_t d = 0; d < ndim && k < n; d++)
		k += (size_t)snprintf(buf + k, n - k, d ? ",%llu" : "%llu",
				      (unsigned long long)shape[d]);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

/* ---- classification -------------------------------------------------------- */

static int comp_is(const char *s, size_t l, const char *w)
{
	return strlen(w) == l && !memcmp(s, w, l);
}

static int comp_is_num(const char *s, size_t l)
{
	if (l == 0)
		return 0;
	for (size_t i = 0; i < l; i++)
		if (s[i] < '0' || s[i] > '9')
			return 0;
	return 1;
}

/*
 * The canonical path of name[0, len): without PEFT's "base_model.model."
 * and "base_layer" wrappers and, with drop_expert, without the expert id
 * after "experts" / "local_experts". Per-expert and fused forms of one
 * parameter thus get the same path ("model.layers.0.mlp.experts.down_proj").
 */
static char *canon_path(const char *name, size_t len, int drop_expert)
{
	struct ms_buf b;
	const char *p = name, *end = name + len, *prev = NULL;
	size_t prevl = 0, i = 0;
	int dropped = 0;

	ms_buf_init(&b);
	while (p <= end) {
		const char *dot = memchr(p, '.', (size_t)(end - p));
		const char *ce = dot ? dot : end;
		size_t l = (size_t)(ce - p);
		int skip = 0;

		if (i == 0 && comp_is(p, l, "base_model") && ce + 6 <= end &&
		    !strncmp(ce, ".model", 6) && (ce + 6 == end || ce[6] == '.')) {
			/* PEFT's prefix: skip "base_model" and "model" */
			p = ce + 7;
			i += 2;
			if (ce + 6 == end)
				break;
			continue;
		}
		if (comp_is(p, l, "base_layer"))
			skip = 1;
		else if (drop_expert && !dropped && prev && comp_is_num(p, l) &&
			 (comp_is(prev, prevl, "experts") || comp_is(prev, prevl, "local_experts")))
			skip = dropped = 1;
		if (!skip) {
			if (b.len)
				ms_buf_append(&b, ".", 1);
			ms_buf_append(&b, p, l);
			prev = p;
			prevl = l;
		}
		i++;
		if (!dot)
			break;
		p = dot + 1;
	}
	if (b.oom) {
		ms_buf_release(&b);
		return NULL;
	}
	if (!b.data)
		return ms_strdup("");
	return ms_buf_detach(&b, NULL);
}

/* The part of a parameter a tensor holds: "lora_A", "weight", "weight_scale"... */
static char *canon_part(const char *name, const struct ms_name_info *in)
{
	const char *s = name + in->module_len;

	if (in->role == MS_NAME_ROLE_LORA_A || in->role == MS_NAME_ROLE_LORA_B)
		return ms_strdup(ms_name_role_str(in->role));
	if (in->lora_nesting >= 0)
		return ms_strdup("lora_magnitude_vector");
	if (!*s)
		return ms_strdup(ms_name_role_str(in->role));
	s++; /* the '.' or '_' joining module and suffix */
	/* Megatron's "weight<e>": the id is the expert, not the part */
	if ((!strncmp(s, "weight", 6) && comp_is_num(s + 6, strlen(s + 6))) ||
	    (!strncmp(s, "bias", 4) && comp_is_num(s + 4, strlen(s + 4))))
		return ms_strdup(ms_name_role_str(in->role));
	return ms_strdup(s);
}

/* A fused LoRA wrapper: one lora_A/lora_B pair on a fused experts module. */
struct wrapper {
	const char *prefix;  /* the wrapper path: name of A up to module_len */
	uint32_t plen;
	char *module;        /* canonical module path */
	int32_t nesting;
	int64_t a, b;        /* tensor indices, -1 until seen */
	const char *pname;   /* resolved parameter (points into the config) */
	uint32_t r;
};

static int cfg_u32(const cJSON *o, const char *key, uint32_t max, uint32_t *out)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	uint64_t v;

	if (!j)
		return 1;
	if (json_u64(j, max, &v))
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* glibc compiles a{m,n} and a+ by copying a, so one key of an outside
 * config could take gigabytes (a{1,32767} alone: 8 GB, 10 s). PEFT keys
 * name modules: no repeat counts, a few '+', a bounded length. */
static int pattern_cheap(const char *k)
{
	size_t plus = 0, n = 0;

	for (; *k; k++, n++) {
		if (*k == '{')
			return 0;
		plus += *k == '+';
	}
	return n <= 256 && plus <= 8;
}

/* PEFT's get_pattern_key: the first key of pattern (in order) for which
 * re.match(r"(.*\.)?(KEY)$", target) holds. */
static int pattern_lookup(const cJSON *pattern, const char *target, const char *label,
			  const cJSON **hit, struct ms_err *err)
{
	const cJSON *k;

	*hit = NULL;
	if (!pattern)
		return MS_OK;
	if (!cJSON_IsObject(pattern))
		return ms_err_set(err, MS_EINVAL, "'%s': rank_pattern must be an object", label);
	cJSON_ArrayForEach(k, pattern) {
		regex_t re;
		char *rx = ms_asprintf("^(.*\\.)?(%s)$", k->string);
		int m;

		if (!rx)
			return ms_err_nomem(err);
		m = pattern_cheap(k->string) ? regcomp(&re, rx, REG_EXTENDED | REG_NOSUB) : REG_BADPAT;
		if (m) {
			ms_free(rx);
			/* regcomp's REG_ESPACE is an allocation that failed */
			if (m == REG_ESPACE)
				return ms_err_nomem(err);
			return ms_err_set(err, MS_EINVAL, "'%s': rank_pattern key '%s' is not a regular "
					  "expression this reader understands", label, k->string);
		}
		m = regexec(&re, target, 0, NULL, 0);
		regfree(&re);
		ms_free(rx);
		if (m == 0) {
			*hit = k;
			return MS_OK;
		}
	}
	return MS_OK;
}

static int wrapper_rank(const cJSON *acfg, const struct wrapper *w, const char *pname,
			const char *label, uint32_t *r, struct ms_err *err)
{
	const cJSON *hit;
	char *key;
	uint64_t v;
	int rc;

	if (cfg_u32(acfg, "r", MAX_LORA_RANK, r) || *r == 0)
		return ms_err_set(err, MS_EINVAL, "'%s': adapter_config.json needs \"r\", an integer "
				  "in 1..%u, for fused expert LoRA", label, MAX_LORA_RANK);
	/* PEFT matches rank_pattern against "<module>.<parameter>" */
	key = ms_asprintf("%s.%s", w->module, pname);
	if (!key)
		return ms_err_nomem(err);
	rc = pattern_lookup(cJSON_GetObjectItemCaseSensitive(acfg, "rank_pattern"), key, label,
			    &hit, err);
	ms_free(key);
	if (rc != MS_OK)
		return rc;
	if (hit) {
		if (json_u64(hit, MAX_LORA_RANK, &v) || v == 0)
			return ms_err_set(err, MS_EINVAL, "'%s': rank_pattern '%s' is not a rank in 1..%u",
					  label, hit->string, MAX_LORA_RANK);
		*r = (uint32_t)v;
	}
	return MS_OK;
}

static int known_index(const char *p)
{
	for (size_t i = 0; i < sizeof(known_param_order) / sizeof(known_param_order[0]); i++)
		if (!strcmp(p, known_param_order[i]))
			return (int)i;
	return -1;
}

#define MAX_WRAP 16

/*
 * Give the k wrappers of one module (w[d] at nesting d) their parameters,
 * from order[0] innermost (nesting k-1) out, and check the shapes.
 * Returns MS_OK, or MS_EINVAL with the reason in err.
 */
static int try_order(const struct src *s, const cJSON *acfg, struct wrapper **w, size_t k,
		     const char *const *order, struct ms_err *err)
{
	const struct stensor *ga = NULL, *gb = NULL, *da = NULL, *db = NULL;
	uint32_t e_mod = 0;
	int rc;

	for (size_t d = 0; d < k; d++) {
		struct wrapper *x = w[d];
		const struct stensor *a = &s->t[x->a], *b = &s->t[x->b];
		const char *pname = order[k - 1 - d];
		uint32_t r;

		if ((rc = wrapper_rank(acfg, x, pname, s->label, &r, err)) != MS_OK)
			return rc;
		if (a->ndim != 2 || b->ndim != 2)
			return ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': fused LoRA factors must be "
					  "2-D", a->ndim != 2 ? a->name : b->name, s->label);
		if (a->shape[0] != b->shape[1])
			return ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': lora_B has %llu columns "
					  "but lora_A %llu rows", b->name, s->label,
					  (unsigned long long)b->shape[1],
					  (unsigned long long)a->shape[0]);
		if (a->shape[0] == 0 || a->shape[0] % r)
			return ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': %llu rows are not a "
					  "multiple of r=%u (parameter '%s')", a->name, s->label,
					  (unsigned long long)a->shape[0], r, pname);
		if (a->shape[0] / r > MS_EP_MAX_EXPERTS)
			return ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': more than %u experts",
					  a->name, s->label, MS_EP_MAX_EXPERTS);
		if (e_mod && a->shape[0] / r != e_mod)
			return ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': %llu experts at r=%u, "
					  "but another parameter of the module has %u", a->name,
					  s->label, (unsigned long long)(a->shape[0] / r), r, e_mod);
		e_mod = (uint32_t)(a->shape[0] / r);
		x->pname = pname;
		x->r = r;
		if (!strcmp(pname, "gate_up_proj")) {
			ga = a;
			gb = b;
		} else if (!strcmp(pname, "down_proj")) {
			da = a;
			db = b;
		}
	}
	/* A SwiGLU expert: gate_up_proj maps H -> 2I, down_proj I -> H. */
	if (ga && da && (ga->shape[1] != db->shape[0] || gb->shape[0] != 2 * da->shape[1]))
		return ms_err_set(err, MS_EINVAL, "'%s': the LoRA shapes of module '%s' do not fit "
				  "gate_up_proj [2I, H] and down_proj [H, I] in this nesting order",
				  s->label, w[0]->module);
	return MS_OK;
}

static int resolve_module(const struct src *s, const cJSON *acfg, struct wrapper **w,
			  size_t k, struct ms_err *err)
{
	const char *cand[MAX_WRAP], *known[MAX_WRAP];
	const cJSON *tps = acfg ? cJSON_GetObjectItemCaseSensitive(acfg, "target_parameters") : NULL;
	const cJSON *tp;
	size_t nc = 0;
	int all_known = 1, rc;
	struct ms_err first = { 0 };

	if (k > MAX_WRAP)
		return ms_err_set(err, MS_EINVAL, "'%s': module '%s' has %zu LoRA wrappers (at most %d)",
				  s->label, w[0]->module, k, MAX_WRAP);
	for (size_t d = 0; d < k; d++)
		if (w[d]->nesting != (int32_t)d)
			return ms_err_set(err, MS_EINVAL, "'%s': module '%s' has LoRA at nesting %d but "
					  "not at nesting %zu", s->label, w[0]->module,
					  w[d]->nesting, d);
	if (!cJSON_IsArray(tps))
		return ms_err_set(err, MS_EINVAL, "'%s': fused expert LoRA on '%s' but "
				  "adapter_config.json has no target_parameters list", s->label,
				  w[0]->module);
	/* PEFT's match: "<module>.<param>" equals the entry or ends with
	 * "." + entry */
	cJSON_ArrayForEach(tp, tps) {
		const char *e, *pn;
		char *key;
		size_t el, kl;
		int dup = 0, match;

		if (!cJSON_IsString(tp))
			return ms_err_set(err, MS_EINVAL, "'%s': target_parameters must be strings",
					  s->label);
		e = tp->valuestring;
		pn = strrchr(e, '.');
		pn = pn ? pn + 1 : e;
		key = ms_asprintf("%s.%s", w[0]->module, pn);
		if (!key)
			return ms_err_nomem(err);
		el = strlen(e);
		kl = strlen(key);
		match = !strcmp(key, e) ||
			(kl > el && !strcmp(key + kl - el, e) && key[kl - el - 1] == '.');
		ms_free(key);
		if (!match)
			continue;
		for (size_t i = 0; i < nc; i++)
			dup |= !strcmp(cand[i], pn);
		if (dup)
			continue;
		if (nc == MAX_WRAP)
			break;
		cand[nc++] = pn;
	}
	if (nc != k)
		return ms_err_set(err, MS_EINVAL, "'%s': module '%s' has %zu fused LoRA wrappers but "
				  "target_parameters names %zu of its parameters", s->label,
				  w[0]->module, k, nc);
	for (size_t i = 0; i < nc; i++) {
		known[i] = cand[i];
		all_known &= known_index(cand[i]) >= 0;
	}
	if (all_known) {
		/* insertion sort by declaration order */
		for (size_t i = 1; i < nc; i++)
			for (size_t j = i; j > 0 && known_index(known[j]) < known_index(known[j - 1]); j--) {
				const char *x = known[j];

				known[j] = known[j - 1];
				known[j - 1] = x;
			}
		rc = try_order(s, acfg, w, k, known, &first);
		if (rc == MS_OK)
			return MS_OK;
		if (rc != MS_EINVAL)
			return ms_err_set(err, rc, "%s", first.msg);
	}
	/* The order of target_parameters, the older PEFT rule. Only its own
	 * refusal gives way to the first one's (an allocation that failed is
	 * reported as such). */
	rc = try_order(s, acfg, w, k, cand, err);
	if (rc == MS_EINVAL && all_known)
		return ms_err_set(err, MS_EINVAL, "%s", first.msg);
	return rc;
}

static int cmp_wrapper(const void *a, const void *b)
{
	const struct wrapper *x = *(const struct wrapper *const *)a;
	const struct wrapper *y = *(const struct wrapper *const *)b;
	int c = strcmp(x->module, y->module);

	if (c)
		return c;
	return (x->nesting > y->nesting) - (x->nesting < y->nesting);
}

static int cmp_rec(const void *a, const void *b, void *ctx)
{
	const struct srec *x = a, *y = b;
	const struct src *s = ctx;
	const struct stensor *tx = &s->t[x->tensor], *ty = &s->t[y->tensor];
	int c;

	if (tx->layer != ty->layer)
		return tx->layer < ty->layer ? -1 : 1;
	if (x->expert != y->expert)
		return x->expert < y->expert ? -1 : 1;
	if ((c = strcmp(tx->param, ty->param)))
		return c;
	return strcmp(tx->part, ty->part);
}

static int parse_config(const struct src *s, const char *name, cJSON **out,
			struct ms_err *err)
{
	const struct sconfig *c = src_config(s, name);
	int nomem;

	*out = NULL;
	if (!c)
		return MS_OK;
	*out = ms_json_parse(c->text, c->len, &nomem);
	if (nomem)
		return ms_err_nomem(err);
	if (!*out || !cJSON_IsObject(*out)) {
		cJSON_Delete(*out);
		*out = NULL;
		return ms_err_set(err, MS_EINVAL, "'%s': %s is not a JSON object", s->label, name);
	}
	return MS_OK;
}

/* The number of routed experts a parsed config.json declares (0 when it
 * does not); label names the model in errors. */
static int config_experts_json(const char *label, const cJSON *mcfg, uint32_t *e,
			       struct ms_err *err)
{
	static const char *const keys[] = {
		"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
	};

	*e = 0;
	for (size_t i = 0; mcfg && i < sizeof(keys) / sizeof(keys[0]); i++) {
		const cJSON *j = cJSON_GetObjectItemCaseSensitive(mcfg, keys[i]);
		uint64_t v;

		if (!j || cJSON_IsNull(j))
			continue;
		if (json_u64(j, MS_EP_MAX_EXPERTS, &v) || v == 0)
			return ms_err_set(err, MS_EINVAL, "'%s': config.json \"%s\" is not an expert "
					  "count in 1..%u", label, keys[i], MS_EP_MAX_EXPERTS);
		*e = (uint32_t)v;
		return MS_OK;
	}
	return MS_OK;
}

static int config_experts(const struct src *s, const cJSON *mcfg, uint32_t *e,
			  struct ms_err *err)
{
	return config_experts_json(s->label, mcfg, e, err);
}

int ms_ep_config_experts(const char *text, size_t len, const char *label, uint32_t *e,
			 struct ms_err *err)
{
	int nomem, rc;
	cJSON *j = ms_json_parse(text, len, &nomem);

	*e = 0;
	if (nomem)
		return ms_err_nomem(err);
	if (!j || !cJSON_IsObject(j))
		rc = ms_err_set(err, MS_EINVAL, "'%s': config.json is not a JSON object", label);
	else
		rc = config_experts_json(label, j, e, err);
	cJSON_Delete(j);
	return rc;
}

/* The expert count in the recorded config.json of state digest (0: none
 * recorded, or it declares none). */
static int inv_state_experts(struct ms_inv *inv, const char *digest, const char *label,
			     uint32_t *e, struct ms_err *err)
{
	struct ms_inv_config *c = NULL;
	size_t n = 0;
	int rc;

	*e = 0;
	if ((rc = ms_inv_state_configs(inv, digest, &c, &n, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < n; i++)
		if (!strcmp(c[i].name, "config.json")) {
			rc = ms_ep_config_experts(c[i].text, c[i].len, label, e, err);
			break;
		}
	ms_inv_configs_free(c, n);
	return rc;
}

int ms_ep_base_experts(struct ms_inv *inv, const char *base, const char *source_digest,
		       uint32_t *e, char **label, struct ms_err *err)
{
	char (*level)[MS_STATE_DIGEST_LEN] = NULL, (*next)[MS_STATE_DIGEST_LEN] = NULL;
	size_t nlevel = 0, nnext = 0;
	struct stat st;
	int rc = MS_OK;

	*e = 0;
	*label = NULL;
	if (base && stat(base, &st) == 0) {
		char *dir = S_ISDIR(st.st_mode) ? ms_strdup(base) : NULL, *cfg, *text = NULL;
		size_t len;

		if (!S_ISDIR(st.st_mode)) {
			const char *slash = strrchr(base, '/');

			dir = slash ? ms_strndup(base, (size_t)(slash - base) + (slash == base))
				    : ms_strdup(".");
		}
		cfg = dir ? ms_path_join(dir, "config.json") : NULL;
		ms_free(dir);
		if (!cfg)
			return ms_err_nomem(err);
		rc = ms_file_read(cfg, MAX_MAP_FILE, &text, &len, err);
		if (rc == MS_ENOTFOUND)
			rc = ms_err_set(err, MS_EINVAL, "'%s': no config.json beside the base: its "
					"expert count is unknown", base);
		if (rc == MS_OK)
			rc = ms_ep_config_experts(text, len, base, e, err);
		ms_free(text);
		ms_free(cfg);
		if (rc == MS_OK && !*e)
			rc = ms_err_set(err, MS_EINVAL, "'%s': its config.json declares no expert count",
					base);
		if (rc == MS_OK && !(*label = ms_strdup(base)))
			rc = ms_err_nomem(err);
		return rc;
	}
	if (base) {
		char d[MS_STATE_DIGEST_LEN];

		if (!inv)
			return ms_err_set(err, MS_ENOTFOUND, "'%s': no such file, and no inventory to "
					  "look a state up in", base);
		if ((rc = ms_inv_resolve(inv, base, d, err)) != MS_OK ||
		    (rc = inv_state_experts(inv, d, base, e, err)) != MS_OK)
			return rc;
		if (!*e)
			return ms_err_set(err, MS_EINVAL, "state '%s': no recorded config.json declares "
					  "its expert count", base);
		return (*label = ms_strdup(base)) ? MS_OK : ms_err_nomem(err);
	}
	if (!inv || !source_digest || !*source_digest)
		return MS_OK;
	/* the nearest ancestor that declares an expert count, level by level */
	if (!(level = ms_malloc(sizeof(*level))))
		return ms_err_nomem(err);
	memcpy(level[0], source_digest, MS_STATE_DIGEST_LEN);
	nlevel = 1;
	for (int depth = 0; depth < 64 && nlevel && !*e; depth++) {
		nnext = 0;
		for (size_t i = 0; i < nlevel && !*e; i++) {
			struct ms_inv_edge *ed = NULL;
			size_t ne = 0;

			rc = ms_inv_edges(inv, level[i], MS_INV_EDGES_PARENTS, &ed, &ne, err);
			if (rc == MS_ENOTFOUND) {
				rc = MS_OK;
				continue;
			}
			if (rc != MS_OK)
				goto out;
			for (size_t k = 0; k < ne && !*e && rc == MS_OK; k++) {
				void *g;

				rc = inv_state_experts(inv, ed[k].parent, ed[k].parent, e, err);
				if (rc == MS_OK && *e) {
					*label = ed[k].parent_label ? ms_strdup(ed[k].parent_label)
								    : ms_strdup(ed[k].parent);
					if (!*label)
						rc = ms_err_nomem(err);
				} else if (rc == MS_OK) {
					if (!(g = ms_realloc(next, (nnext + 1) * sizeof(*next)))) {
						rc = ms_err_nomem(err);
					} else {
						next = g;
						memcpy(next[nnext++], ed[k].parent, MS_STATE_DIGEST_LEN);
					}
				}
			}
			ms_inv_edges_free(ed, ne);
			if (rc != MS_OK)
				goto out;
		}
		ms_free(level);
		level = next;
		nlevel = nnext;
		next = NULL;
	}
out:
	ms_free(level);
	ms_free(next);
	if (rc != MS_OK) {
		*e = 0;
		ms_free(*label);
		*label = NULL;
	}
	return rc;
}

/*
 * A per-module LoRA factor (attention, a per-expert LoRA) against r:
 * lora_A is [r, in] and lora_B [out, r], with r from adapter_config.json
 * or its rank_pattern (PEFT's key: the module path). The fused LoRA of the
 * experts is E*r rows, which any r dividing it fits: these factors are
 * what shows a wrong r when the adapter has them.
 */
static int lora_rank_check(const struct src *s, const cJSON *acfg, const struct stensor *t,
			   const struct ms_name_info *in, struct ms_err *err)
{
	const cJSON *hit;
	uint32_t r;
	uint64_t v, got;
	char *mod;
	int rc;

	if (!acfg || t->ndim != 2 || cfg_u32(acfg, "r", MAX_LORA_RANK, &r) || r == 0)
		return MS_OK;
	if (!(mod = canon_path(t->name, in->module_len, 0)))
		return ms_err_nomem(err);
	rc = pattern_lookup(cJSON_GetObjectItemCaseSensitive(acfg, "rank_pattern"), mod, s->label,
			    &hit, err);
	if (rc == MS_OK && hit) {
		if (json_u64(hit, MAX_LORA_RANK, &v) || v == 0)
			rc = ms_err_set(err, MS_EINVAL, "'%s': rank_pattern '%s' is not a rank in 1..%u",
					s->label, hit->string, MAX_LORA_RANK);
		else
			r = (uint32_t)v;
	}
	got = in->role == MS_NAME_ROLE_LORA_A ? t->shape[0] : t->shape[1];
	if (rc == MS_OK && got != r)
		rc = ms_err_set(err, s->rank_code ? s->rank_code : MS_EINVAL,
				"tensor '%s' in '%s': %s has rank %llu, but adapter_config.json gives "
				"r=%u for '%s' (lora_A is [r, in], lora_B [out, r])", t->name, s->label,
				ms_name_role_str(in->role), (unsigned long long)got, r, mod);
	ms_free(mod);
	return rc;
}

/*
 * Classify every tensor of s, resolve fused LoRA wrappers to parameters and
 * ranks, settle E and build the expert records. e_given is E when the
 * caller knows it (an option, a manifest), else 0; given_from names it.
 */
static int analyze(struct src *s, uint32_t e_given, const char *given_from,
		   struct ms_err *err)
{
	cJSON *acfg = NULL, *mcfg = NULL;
	struct wrapper *w = NULL, **wp = NULL;
	size_t nw = 0, k;
	uint32_t e_cfg = 0, e_fused = 0, e_grouped = 0, e;
	const char *fused_from = NULL, *grouped_from = NULL, *max_from = NULL;
	int64_t max_expert = -1;
	int rc;

	s->packing = 0;
	s->r = 0;
	s->e_from = NULL;
	if ((rc = parse_config(s, "adapter_config.json", &acfg, err)) != MS_OK ||
	    (rc = parse_config(s, "config.json", &mcfg, err)) != MS_OK)
		goto out;
	if (acfg && cfg_u32(acfg, "r", MAX_LORA_RANK, &s->r) < 0) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': adapter_config.json \"r\" is not a rank in 1..%u",
				s->label, MAX_LORA_RANK);
		goto out;
	}
	if ((rc = config_experts(s, mcfg, &e_cfg, err)) != MS_OK)
		goto out;
	w = ms_calloc(s->n ? s->n : 1, sizeof(*w));
	wp = ms_calloc(s->n ? s->n : 1, sizeof(*wp));
	if (!w || !wp) {
		rc = ms_err_nomem(err);
		goto out;
	}

	for (size_t i = 0; i < s->n; i++) {
		struct stensor *t = &s->t[i];
		struct ms_name_info in;

		ms_free(t->param);
		ms_free(t->part);
		t->param = t->part = NULL;
		t->kind = TK_REPLICATED;
		t->expert = -1;
		t->r = 0;
		if (ms_name_parse(t->name, &in) != MS_OK) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': name too long", t->name,
					s->label);
			goto out;
		}
		t->layer = in.layer;
		if ((in.role == MS_NAME_ROLE_LORA_A || in.role == MS_NAME_ROLE_LORA_B) &&
		    in.part != MS_NAME_PART_EXPERTS_FUSED &&
		    (rc = lora_rank_check(s, acfg, t, &in, err)) != MS_OK)
			goto out;
		if (in.part == MS_NAME_PART_EXPERT && in.expert >= 0) {
			t->kind = TK_EXPERT;
			t->expert = in.expert;
			if (in.expert > max_expert) {
				max_expert = in.expert;
				max_from = t->name;
			}
			t->param = canon_path(t->name, in.module_len, 1);
			t->part = canon_part(t->name, &in);
			if (!t->param || !t->part) {
				rc = ms_err_nomem(err);
				goto out;
			}
			s->packing |= PACK_PER_EXPERT;
		} else if (in.part == MS_NAME_PART_EXPERTS_FUSED &&
			   (in.role == MS_NAME_ROLE_LORA_A || in.role == MS_NAME_ROLE_LORA_B)) {
			struct wrapper *x = NULL;

			for (size_t j = 0; j < nw && !x; j++)
				if (w[j].plen == in.module_len &&
				    !memcmp(w[j].prefix, t->name, in.module_len))
					x = &w[j];
			if (!x) {
				x = &w[nw++];
				x->prefix = t->name;
				x->plen = in.module_len;
				x->nesting = in.lora_nesting;
				x->a = x->b = -1;
				if (!(x->module = canon_path(t->name, in.module_len, 0))) {
					rc = ms_err_nomem(err);
					goto out;
				}
			}
			if (in.role == MS_NAME_ROLE_LORA_A ? x->a >= 0 : x->b >= 0) {
				rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': a second %s for "
						"the same fused LoRA wrapper", t->name, s->label,
						ms_name_role_str(in.role));
				goto out;
			}
			if (in.role == MS_NAME_ROLE_LORA_A) {
				x->a = (int64_t)i;
				t->kind = TK_FUSED_A;
			} else {
				x->b = (int64_t)i;
				t->kind = TK_FUSED_B;
			}
			if (ms_dtype_bits(t->dtype) % 8) {
				rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': fused LoRA in a "
						"sub-byte dtype cannot be sliced", t->name, s->label);
				goto out;
			}
		} else if (in.part == MS_NAME_PART_EXPERTS_FUSED && in.lora_nesting >= 0) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': this LoRA tensor of a fused "
					"experts module cannot be split by expert", t->name, s->label);
			goto out;
		} else if (in.part == MS_NAME_PART_EXPERTS_FUSED && t->ndim >= 1 &&
			   t->nbytes > 0 && !(t->ndim == 1 && t->shape[0] == 1)) {
			t->kind = TK_GROUPED;
			if (!e_grouped) {
				e_grouped = t->shape[0] > MS_EP_MAX_EXPERTS ? MS_EP_MAX_EXPERTS + 1
									    : (uint32_t)t->shape[0];
				grouped_from = t->name;
			} else if (t->shape[0] != e_grouped) {
				rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': %llu experts in its "
						"first dimension, but '%s' has %u", t->name, s->label,
						(unsigned long long)t->shape[0], grouped_from, e_grouped);
				goto out;
			}
			t->param = canon_path(t->name, in.module_len, 0);
			t->part = canon_part(t->name, &in);
			if (!t->param || !t->part) {
				rc = ms_err_nomem(err);
				goto out;
			}
			s->packing |= PACK_GROUPED;
		}
		/* everything else, including a fused scalar shared by all
		 * experts, is replicated */
	}

	for (size_t j = 0; j < nw; j++) {
		if (w[j].a < 0 || w[j].b < 0) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': %s without its %s",
					s->t[w[j].a >= 0 ? w[j].a : w[j].b].name, s->label,
					w[j].a >= 0 ? "lora_A" : "lora_B",
					w[j].a >= 0 ? "lora_B" : "lora_A");
			goto out;
		}
		wp[j] = &w[j];
	}
	qsort(wp, nw, sizeof(*wp), cmp_wrapper);
	for (size_t j = 0; j < nw; j += k) {
		for (k = 1; j + k < nw && !strcmp(wp[j + k]->module, wp[j]->module); k++)
			;
		if ((rc = resolve_module(s, acfg, wp + j, k, err)) != MS_OK)
			goto out;
	}
	for (size_t j = 0; j < nw; j++) {
		struct stensor *a = &s->t[w[j].a], *b = &s->t[w[j].b];
		uint32_t ew = (uint32_t)(a->shape[0] / w[j].r);

		a->r = b->r = w[j].r;
		a->param = ms_asprintf("%s.%s", w[j].module, w[j].pname);
		b->param = ms_strdup(a->param ? a->param : "");
		a->part = ms_strdup("lora_A");
		b->part = ms_strdup("lora_B");
		if (!a->param || !b->param || !a->part || !b->part) {
			rc = ms_err_nomem(err);
			goto out;
		}
		if (!e_fused) {
			e_fused = ew;
			fused_from = a->name;
			s->e_from = a;
		} else if (ew != e_fused) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': %u experts at r=%u, but "
					"'%s' has %u", a->name, s->label, ew, w[j].r, fused_from,
					e_fused);
			goto out;
		}
		s->packing |= PACK_FUSED;
	}

	/* Every source of E must agree. */
	e = e_given ? e_given : e_cfg ? e_cfg : e_fused ? e_fused : e_grouped;
	if (e_cfg && e_cfg != e) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': config.json says %u experts, but %s says %u",
				s->label, e_cfg, given_from, e);
		goto out;
	}
	if (e_fused && e_fused != e) {
		rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': holds %u experts, but %s says %u",
				fused_from, s->label, e_fused, e_given ? given_from : "config.json", e);
		goto out;
	}
	if (e_grouped && e_grouped != e) {
		rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': holds %u experts, but %s says %u",
				grouped_from, s->label, e_grouped,
				e_given ? given_from : e_cfg ? "config.json" : "the fused LoRA", e);
		goto out;
	}
	if (!s->packing) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': no routed expert tensors: nothing to shard",
				s->label);
		goto out;
	}
	if (!e)
		e = (uint32_t)(max_expert + 1);
	if (max_expert >= (int64_t)e) {
		rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': expert %lld, but the model has %u "
				"experts", max_from, s->label, (long long)max_expert, e);
		goto out;
	}
	if (e > MS_EP_MAX_EXPERTS) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': more than %u experts", s->label,
				MS_EP_MAX_EXPERTS);
		goto out;
	}
	s->E = e;
	for (size_t i = 0; i < s->n; i++) {
		const struct stensor *t = &s->t[i];
		uint64_t one;

		if (t->kind == TK_GROUPED &&
		    (t->nbytes % e || shape_nbytes(t->dtype, t->ndim - 1, t->shape + 1, &one) ||
		     one * e != t->nbytes)) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': one expert's slice is not "
					"whole bytes", t->name, s->label);
			goto out;
		}
	}

	/* The expert records, one per (expert, tensor) slice. */
	s->nrec = 0;
	for (size_t i = 0; i < s->n; i++)
		s->nrec += s->t[i].kind == TK_EXPERT ? 1 : is_sliced(s->t[i].kind) ? e : 0;
	ms_free(s->rec);
	s->rec = ms_calloc(s->nrec ? s->nrec : 1, sizeof(*s->rec));
	if (!s->rec) {
		rc = ms_err_nomem(err);
		goto out;
	}
	k = 0;
	for (size_t i = 0; i < s->n; i++) {
		if (s->t[i].kind == TK_EXPERT) {
			s->rec[k].tensor = (uint32_t)i;
			s->rec[k++].expert = (uint32_t)s->t[i].expert;
		} else if (is_sliced(s->t[i].kind)) {
			for (uint32_t x = 0; x < e; x++) {
				s->rec[k].tensor = (uint32_t)i;
				s->rec[k++].expert = x;
			}
		}
	}
	qsort_r(s->rec, s->nrec, sizeof(*s->rec), cmp_rec, s);
	for (size_t i = 1; i < s->nrec; i++) {
		const struct srec *x = &s->rec[i - 1], *y = &s->rec[i];
		const struct stensor *tx = &s->t[x->tensor], *ty = &s->t[y->tensor];

		if (x->expert == y->expert && !strcmp(tx->param, ty->param) &&
		    !strcmp(tx->part, ty->part)) {
			rc = ms_err_set(err, MS_EINVAL, "'%s': expert %u of '%s' (%s) is in both '%s' and "
					"'%s'", s->label, x->expert, tx->param, tx->part, tx->name,
					ty->name);
			goto out;
		}
	}
	rc = MS_OK;
out:
	for (size_t j = 0; w && j < nw; j++)
		ms_free(w[j].module);
	ms_free(w);
	ms_free(wp);
	cJSON_Delete(acfg);
	cJSON_Delete(mcfg);
	return rc;
}

static void packing_str(unsigned packing, char *buf, size_t n)
{
	static const char *const names[] = { "per-expert", "fused", "grouped" };
	size_t k = 0;

	buf[0] = '\0';
	for (unsigned i = 0; i < 3; i++)
		if (packing & (1u << i))
			k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s%s", k ? "+" : "",
					      names[i]);
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

static int src_add_config(struct src *s, const char *name, const char *text, size_t len,
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

static int src_from_ckpt(struct src *s, const struct ms_ckpt *c, struct ms_err *err)
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
		if ((rc = src_add_config(s, c->configs[i].name, c->configs[i].text, c->configs[i].len,
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
static int src_point_whole(struct src *s, struct ms_err *err)
{
	for (size_t i = 0; i < s->n; i++) {
		struct stensor *t = &s->t[i];

		if (!is_sliced(t->kind))
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
static int src_state_digest(const struct src *s, char out[MS_STATE_DIGEST_LEN],
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

/* ---- writing ------------------------------------------------------------- */

/* Bytes handed to a sink at a time, and each pool thread's buffer: small
 * enough that the writer's hash reads them back from cache after write(2)
 * copied them, large enough that the calls cost nothing. */
#define CHUNK (1u << 20)
/* B rows regrouped per tile: the tile stays in cache while every expert's
 * columns are picked out of it. */
#define TILE (256u << 10)

typedef int (*sink_fn)(void *ctx, const void *p, size_t n, struct ms_err *err);

static int sink_writer(void *ctx, const void *p, size_t n, struct ms_err *err)
{
	return ms_st_writer_data(ctx, p, n, err);
}

static int sink_sha(void *ctx, const void *p, size_t n, struct ms_err *err)
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
static void gather(uint8_t *d, const uint8_t *p, uint64_t m, size_t stride, size_t es)
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
static int emit(const struct src *s, const struct stensor *t, const uint32_t *ids,
		uint32_t l, uint8_t *buf, sink_fn sink, void *ctx, struct ms_err *err)
{
	size_t used = 0, es;
	int rc;

	if (!is_sliced(t->kind))
		return sink_all(sink, ctx, t->data, t->nbytes, err);
	if (t->kind != TK_FUSED_B) {
		uint64_t sl = slice_bytes(t, s->E);

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

struct outspec {
	const char *path;           /* where it is written (in the staging directory) */
	int64_t file;               /* only this source file's tensors; -1: all */
	const uint32_t *ids;        /* experts, local order */
	uint32_t l;
	const int32_t *lpos;        /* [E] local position, -1 when absent */
	size_t nmeta;
	const struct ms_st_meta *meta;
};

static int out_includes(const struct outspec *o, const struct stensor *t)
{
	if (o->file >= 0 && t->file != (uint32_t)o->file)
		return 0;
	return t->kind != TK_EXPERT || o->lpos[t->expert] >= 0;
}

/* Count what o writes into res (its tensors and bytes). */
static int out_plan(const struct src *s, const struct outspec *o,
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
		local_shape(t, o->l, shape);
		if (shape_nbytes(t->dtype, t->ndim, shape, &nb))
			return ms_err_set(err, MS_EINVAL, "tensor '%s': size overflows", t->name);
		res->ntensors++;
		res->nbytes += nb;
	}
	return MS_OK;
}

/* Write every byte of o into a new writer (buf: CHUNK bytes of scratch),
 * left uncommitted in *out: its temporary file disappears unless
 * out_commit renames it into place. */
static int out_stream(const struct src *s, const struct outspec *o, uint8_t *buf,
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
		local_shape(t, o->l, shape);
		if ((rc = ms_st_writer_declare(w, t->name, t->dtype, t->ndim, shape, err)) != MS_OK)
			goto out;
	}
	for (size_t i = 0; i < s->n; i++)
		if (out_includes(o, &s->t[i]) &&
		    (rc = emit(s, &s->t[i], o->ids, o->l, buf, sink_writer, w, err)) != MS_OK)
			goto out;
	*out = w;
	w = NULL;
out:
	ms_st_writer_free(w);
	return rc;
}

/* Commit w (fsync, rename) and fill res->state_digest from the digests the
 * writer computed of what it wrote. */
static int out_commit(const struct src *s, const struct outspec *o, struct ms_st_writer *w,
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
		local_shape(t, o->l, ts[nt].shape);
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

/* ---- the work pool ---------------------------------------------------------- */

/*
 * One pool of threads does all the heavy work of an operation, taking jobs
 * in the order given: faulting in the input mappings, hashing input bytes
 * for their checks, and writing and committing each output file. Each
 * thread has its own CHUNK-byte buffer. Writers wait in write(2) and
 * fsync(2), so the pool has a thread more than there are CPUs: the disk
 * works while the others hash, and no fsync waits for another.
 */
enum job_kind { JOB_PREFAULT, JOB_HASH, JOB_HASH_B, JOB_FILE };

struct job {
	enum job_kind kind;
	const uint8_t *data;      /* PREFAULT, HASH; HASH_B: the tensor holding experts */
	uint64_t n;               /* PREFAULT, HASH: bytes */
	uint8_t *digest;          /* HASH: its SHA-256 */
	const struct stensor *t;  /* HASH_B: the B tensor */
	uint32_t en;              /* HASH_B: experts the holder holds */
	uint8_t **dst;            /* HASH_B: [en] digest of the expert at each position
				   * (NULL: not wanted) */
	uint32_t file;            /* FILE: index into the pool's outputs */
};

struct pool {
	const struct job *jobs;
	size_t njobs;
	const struct src *s;             /* FILE jobs: the model, */
	const struct outspec *os;        /* what each output holds */
	struct ms_shard_out_file *files; /* and where to say what was written */
	size_t nfiles;
	const struct ms_shard_opts *o;   /* progress (may be NULL) */
	pthread_mutex_t lock;
	size_t next, done;
	int rc;                          /* first failure */
	struct ms_err err;
};

static int sha_fail(int rc, struct ms_err *err)
{
	return rc == MS_ENOMEM ? ms_err_nomem(err) : ms_err_set(err, rc, "sha256 failed");
}

/* Scatter rows [o0, o1) of a [out, r*n] B tensor (row bytes apart) into n
 * contiguous blocks of buf, one per position pos: block pos holds B_pos's
 * rows [o0, o1) as [o1 - o0, r]. One pass reading the tile in order. */
static void scatter_b(uint8_t *buf, const uint8_t *holder, uint64_t o0, uint64_t o1,
		      uint64_t r, uint32_t n, size_t es, uint64_t blk)
{
	uint64_t row = r * n * es;

	for (uint64_t o = o0; o < o1; o++) {
		const uint8_t *p = holder + o * row;
		uint8_t *d = buf + (o - o0) * r * es;

		for (uint64_t k = 0; k < r; k++, d += es) {
			uint8_t *q = d;

			switch (es) {
			case 2:
				for (uint32_t pos = 0; pos < n; pos++, p += 2, q += blk)
					memcpy(q, p, 2);
				break;
			case 4:
				for (uint32_t pos = 0; pos < n; pos++, p += 4, q += blk)
					memcpy(q, p, 4);
				break;
			default:
				for (uint32_t pos = 0; pos < n; pos++, p += es, q += blk)
					memcpy(q, p, es);
			}
		}
	}
}

/*
 * Canonical B slices of every expert that holder (a [out, r*n] tensor)
 * holds: dst[pos] (NULL: skip) receives the SHA-256 of B_e as [out, r]
 * contiguous, whose element (o, k) is column k*n + pos. A tile of rows
 * is regrouped per expert into buf in one pass and each expert's part
 * hashed from there, in cache: the tensor is never regrouped as a whole.
 * (When a tile's blocks do not fit in buf, each expert's columns are
 * picked out of it in turn.)
 */
static int hash_b(const struct stensor *t, const uint8_t *holder, uint32_t n,
		  uint8_t *const *dst, uint8_t *buf, struct ms_err *err)
{
	size_t es = ms_dtype_bits(t->dtype) / 8;
	uint64_t out = t->shape[0], r = t->r, row = r * n * es;
	uint64_t tile = row >= TILE ? 1 : TILE / row;
	struct ms_sha256_ctx **c = ms_calloc(n ? n : 1, sizeof(*c));
	int rc = MS_OK;

	if (!c)
		return ms_err_nomem(err);
	for (uint32_t pos = 0; pos < n; pos++)
		if (dst[pos] && !(c[pos] = ms_sha256_new())) {
			rc = ms_err_nomem(err);
			goto out;
		}
	for (uint64_t o0 = 0; o0 < out; o0 += tile) {
		uint64_t o1 = o0 + tile < out ? o0 + tile : out;

		/* blocks a cache line apart from a multiple of 4 KiB: stores
		 * 4 KiB apart would all fall in one set of the L1 cache */
		uint64_t blk = (o1 - o0) * r * es, stride = (blk + 63) / 64 * 64 + 64;

		if (stride * n <= CHUNK) {
			scatter_b(buf, holder, o0, o1, r, n, es, stride);
			for (uint32_t pos = 0; pos < n; pos++) {
				if (!c[pos])
					continue;
				if ((rc = ms_sha256_update(c[pos], buf + pos * stride, blk)) != MS_OK) {
					rc = sha_fail(rc, err);
					goto out;
				}
			}
			continue;
		}
		for (uint32_t pos = 0; pos < n; pos++) {
			size_t used = 0;

			if (!c[pos])
				continue;
			for (uint64_t o = o0; o < o1; o++) {
				const uint8_t *p = holder + o * row + (uint64_t)pos * es;

				for (uint64_t k = 0; k < r;) {
					uint64_t m = (CHUNK - used) / es;

					if (m > r - k)
						m = r - k;
					if (!m) {
						if ((rc = ms_sha256_update(c[pos], buf, used)) != MS_OK) {
							rc = sha_fail(rc, err);
							goto out;
						}
						used = 0;
						continue;
					}
					gather(buf + used, p, m, (size_t)n * es, es);
					p += m * n * es;
					k += m;
					used += (size_t)(m * es);
				}
			}
			if (used && (rc = ms_sha256_update(c[pos], buf, used)) != MS_OK) {
				rc = sha_fail(rc, err);
				goto out;
			}
		}
	}
	for (uint32_t pos = 0; pos < n; pos++)
		if (c[pos] && (rc = ms_sha256_final(c[pos], dst[pos])) != MS_OK) {
			rc = sha_fail(rc, err);
			goto out;
		}
out:
	for (uint32_t pos = 0; pos < n; pos++)
		ms_sha256_free(c[pos]);
	ms_free(c);
	return rc;
}

static void prefault(const uint8_t *p, uint64_t n)
{
	/* advice only: a kernel without MADV_POPULATE_READ faults as it goes */
#ifdef MADV_POPULATE_READ
	if (madvise((void *)p, (size_t)n, MADV_POPULATE_READ) == 0)
		return;
#endif
	madvise((void *)p, (size_t)n, MADV_WILLNEED);
}

static int run_job(struct pool *p, const struct job *j, uint8_t *buf, struct ms_err *err)
{
	struct ms_st_writer *w = NULL;
	int rc;

	switch (j->kind) {
	case JOB_PREFAULT:
		prefault(j->data, j->n);
		return MS_OK;
	case JOB_HASH:
		if ((rc = ms_sha256(j->data, (size_t)j->n, j->digest)) != MS_OK)
			return sha_fail(rc, err);
		return MS_OK;
	case JOB_HASH_B:
		return hash_b(j->t, j->data, j->en, j->dst, buf, err);
	case JOB_FILE:
		break;
	}
	rc = out_stream(p->s, &p->os[j->file], buf, &w, err);
	if (rc == MS_OK)
		rc = out_commit(p->s, &p->os[j->file], w, &p->files[j->file], err);
	ms_st_writer_free(w);
	if (rc == MS_OK && p->o && p->o->progress) {
		pthread_mutex_lock(&p->lock);
		p->o->progress(p->o->progress_ctx, p->files[j->file].path, ++p->done, p->nfiles);
		pthread_mutex_unlock(&p->lock);
	}
	return rc;
}

static void pool_fail(struct pool *p, int rc, const struct ms_err *err)
{
	pthread_mutex_lock(&p->lock);
	if (p->rc == MS_OK) {
		p->rc = rc;
		p->err = *err;
	}
	pthread_mutex_unlock(&p->lock);
}

static void *pool_main(void *arg)
{
	struct pool *p = arg;
	uint8_t *buf = ms_malloc(CHUNK);
	struct ms_err err = { 0 };

	if (!buf) {
		pool_fail(p, ms_err_nomem(&err), &err);
		return NULL;
	}
	for (;;) {
		size_t i;
		int rc;

		pthread_mutex_lock(&p->lock);
		i = p->next < p->njobs && p->rc == MS_OK ? p->next++ : SIZE_MAX;
		pthread_mutex_unlock(&p->lock);
		if (i == SIZE_MAX)
			break;
		if ((rc = run_job(p, &p->jobs[i], buf, &err)) != MS_OK)
			pool_fail(p, rc, &err);
	}
	ms_free(buf);
	return NULL;
}

/* Run p's jobs on nthreads threads (0: one per CPU, and one more when
 * there are files to write), the caller being one of them. The first
 * failure stops the rest and is returned. */
static int pool_run(struct pool *p, int nthreads, struct ms_err *err)
{
	pthread_t th[64];
	int started = 0, nth = nthreads;

	if (nth <= 0)
		nth = ms_ncpus() + (p->nfiles ? 1 : 0);
	if (nth > 64)
		nth = 64;
	if ((size_t)nth > p->njobs)
		nth = p->njobs ? (int)p->njobs : 1;
	p->next = p->done = 0;
	p->rc = MS_OK;
	pthread_mutex_init(&p->lock, NULL);
	for (int i = 1; i < nth; i++) {
		if (pthread_create(&th[started], NULL, pool_main, p))
			break;
		started++;
	}
	pool_main(p);
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&p->lock);
	if (p->rc != MS_OK)
		return ms_err_set(err, p->rc, "%s", p->err.msg);
	return MS_OK;
}

/* A growable job list. */
struct jobs {
	struct job *v;
	size_t n, cap;
	uint8_t ***dsts;   /* HASH_B pointer arrays, freed with the list */
	size_t ndsts;
};

static void jobs_release(struct jobs *j)
{
	for (size_t i = 0; i < j->ndsts; i++)
		ms_free(j->dsts[i]);
	ms_free(j->dsts);
	ms_free(j->v);
	memset(j, 0, sizeof(*j));
}

static struct job *jobs_add(struct jobs *j, enum job_kind kind)
{
	if (j->n == j->cap) {
		size_t nc = j->cap ? 2 * j->cap : 64;
		struct job *nv = ms_realloc(j->v, nc * sizeof(*nv));

		if (!nv)
			return NULL;
		j->v = nv;
		j->cap = nc;
	}
	memset(&j->v[j->n], 0, sizeof(j->v[0]));
	j->v[j->n].kind = kind;
	return &j->v[j->n++];
}

/* Largest first among [from, n): one huge tensor must not start last. */
static int cmp_job_size(const void *a, const void *b)
{
	const struct job *x = a, *y = b;
	uint64_t nx = x->kind == JOB_HASH_B ? x->t->nbytes : x->n;
	uint64_t ny = y->kind == JOB_HASH_B ? y->t->nbytes : y->n;

	return nx < ny ? 1 : nx > ny ? -1 : 0;
}

static void jobs_sort(struct jobs *j, size_t from)
{
	if (j->n > from)
		qsort(j->v + from, j->n - from, sizeof(*j->v), cmp_job_size);
}

/* ---- canonical expert digests --------------------------------------------- */

struct holder {
	const uint8_t *data;
	size_t job;
};

static int cmp_holder(const void *a, const void *b)
{
	const struct holder *x = a, *y = b;

	return x->data < y->data ? -1 : x->data > y->data;
}

/*
 * Jobs computing the canonical digest (rec->got) of every expert slice
 * whose bytes are present: slices of A and of grouped tensors are hashed
 * in place, B's are regrouped tile by tile (hash_b), one job per tensor
 * holding experts. A per-expert tensor's canonical digest is its tensor
 * digest, taken from its file tensor by rec_finish once that is hashed.
 * The records' has_got is set here: their digests are valid once the jobs
 * ran.
 */
static int rec_jobs(struct src *s, struct jobs *jl, struct ms_err *err)
{
	size_t *base = ms_calloc(s->n ? s->n : 1, sizeof(*base));
	struct srec **rec_of = ms_calloc(s->nrec ? s->nrec : 1, sizeof(*rec_of));
	struct holder *h = ms_calloc(s->E ? s->E : 1, sizeof(*h));
	size_t k = 0;
	int rc = MS_OK;

	if (!base || !rec_of || !h) {
		rc = ms_err_nomem(err);
		goto out;
	}
	/* record of (tensor i, expert e): rec_of[base[i] + e] */
	for (size_t i = 0; i < s->n; i++) {
		base[i] = k;
		k += s->t[i].kind == TK_EXPERT ? 1 : is_sliced(s->t[i].kind) ? s->E : 0;
	}
	for (size_t i = 0; i < s->nrec; i++) {
		const struct stensor *t = &s->t[s->rec[i].tensor];

		rec_of[base[s->rec[i].tensor] + (t->kind == TK_EXPERT ? 0 : s->rec[i].expert)] =
			&s->rec[i];
	}
	for (size_t i = 0; i < s->n; i++) {
		const struct stensor *t = &s->t[i];
		size_t nh = 0;

		if (t->kind == TK_FUSED_A || t->kind == TK_GROUPED) {
			uint64_t sl = slice_bytes(t, s->E);

			for (uint32_t e = 0; e < s->E; e++) {
				struct srec *r = rec_of[base[i] + e];
				struct job *j;

				if (!t->edata[e])
					continue;
				if (!(j = jobs_add(jl, JOB_HASH))) {
					rc = ms_err_nomem(err);
					goto out;
				}
				j->data = t->edata[e] + (uint64_t)t->epos[e] * sl;
				j->n = sl;
				j->digest = r->got;
				r->has_got = 1;
			}
			continue;
		}
		if (t->kind != TK_FUSED_B)
			continue;
		/* one job per holder: the expert at its position 0 opens it */
		for (uint32_t e = 0; e < s->E; e++) {
			uint8_t ***nd;
			struct job *j;

			if (!t->edata[e] || t->epos[e] != 0)
				continue;
			nd = ms_realloc(jl->dsts, (jl->ndsts + 1) * sizeof(*nd));
			if (!nd) {
				rc = ms_err_nomem(err);
				goto out;
			}
			jl->dsts = nd;
			if (!(nd[jl->ndsts] = ms_calloc(t->en[e] ? t->en[e] : 1, sizeof(uint8_t *)))) {
				rc = ms_err_nomem(err);
				goto out;
			}
			jl->ndsts++;
			if (!(j = jobs_add(jl, JOB_HASH_B))) {
				rc = ms_err_nomem(err);
				goto out;
			}
			j->t = t;
			j->data = t->edata[e];
			j->en = t->en[e];
			j->dst = nd[jl->ndsts - 1];
			h[nh].data = t->edata[e];
			h[nh++].job = jl->n - 1;
		}
		qsort(h, nh, sizeof(*h), cmp_holder);
		for (uint32_t g = 0; g < s->E; g++) {
			struct srec *r = rec_of[base[i] + g];
			size_t lo = 0, hi = nh;

			if (!t->edata[g])
				continue;
			while (lo < hi) {
				size_t mid = lo + (hi - lo) / 2;

				if (h[mid].data < t->edata[g])
					lo = mid + 1;
				else
					hi = mid;
			}
			/* a holder without an expert at position 0 (or a
			 * position past its count) is not one sset_point or
			 * src_point_whole make */
			if (lo == nh || h[lo].data != t->edata[g] || t->epos[g] >= jl->v[h[lo].job].en) {
				rc = ms_err_set(err, MS_EINVAL, "tensor '%s': expert %u is not in the "
						"tensor that should hold it", t->name, g);
				goto out;
			}
			jl->v[h[lo].job].dst[t->epos[g]] = r->got;
			r->has_got = 1;
		}
	}
out:
	ms_free(base);
	ms_free(rec_of);
	ms_free(h);
	return rc;
}

/* After the jobs of rec_jobs (and the hashing of the file tensors) ran:
 * per-expert records take their file tensor's digest. */
static void rec_finish(struct src *s)
{
	for (size_t i = 0; i < s->nrec; i++) {
		struct srec *r = &s->rec[i];
		const struct stensor *t = &s->t[r->tensor];

		if (t->kind == TK_EXPERT && t->st && t->st->has_digest) {
			memcpy(r->got, t->st->digest, MS_SHA256_LEN);
			r->has_got = 1;
		}
	}
}

/* Canonical digests of every expert slice whose bytes are present (the
 * file tensors already hashed). */
static int hash_records(struct src *s, int nthreads, struct ms_err *err)
{
	struct jobs jl = { 0 };
	struct pool p = { 0 };
	int rc;

	if ((rc = rec_jobs(s, &jl, err)) == MS_OK) {
		jobs_sort(&jl, 0);
		p.jobs = jl.v;
		p.njobs = jl.n;
		rc = pool_run(&p, nthreads, err);
	}
	if (rc == MS_OK)
		rec_finish(s);
	jobs_release(&jl);
	return rc;
}

/* ---- the manifest ---------------------------------------------------------- */

static const char *stem_of(const struct src *s)
{
	return s->is_adapter ? "adapter_model" : "model";
}

static char *shard_name(const char *stem, uint32_t rank, uint32_t n)
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
static int manifest_text(const struct src *s, const struct ms_ep_placement *pl,
			 const struct ms_shard_out_file *files, char **text, size_t *len,
			 struct ms_err *err)
{
	cJSON *m = cJSON_CreateObject(), *o, *a = NULL, *x;
	char packing[48], *p = NULL;
	int ok = m != NULL;

	*text = NULL;
	packing_str(s->packing, packing, sizeof(packing));
	ok = ok && cJSON_AddStringToObject(m, "format", MS_EP_MANIFEST_FORMAT);
	ok = ok && cJSON_AddNumberToObject(m, "version", MS_EP_MANIFEST_VERSION);
	ok = ok && cJSON_AddStringToObject(m, "kind", s->is_adapter ? "adapter" : "checkpoint");
	ok = ok && cJSON_AddStringToObject(m, "stem", stem_of(s));
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
		ok = ok && cJSON_AddStringToObject(x, "kind", tkind_names[t->kind]);
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

static int result_new(const struct src *s, const struct ms_ep_placement *pl, size_t nfiles,
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
	packing_str(s->packing, r->packing, sizeof(r->packing));
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
	if ((rc = placement_copy(pl, &r->placement, err)) != MS_OK) {
		ms_shard_result_free(r);
		return rc;
	}
	*out = r;
	return MS_OK;
}

/* ---- staging and publication ----------------------------------------------- */

/*
 * An output directory is written whole into a staging directory beside it,
 * ".<name>.tmp-<pid>-<hex>" (the name of every writer's temporary, so that
 * `msinv gc` removes a killed writer's staging with what it holds), every
 * file fsynced, then renamed into place in one step and the parent
 * fsynced: readers, a crash and the inventory see no output or all of it.
 *
 * An existing output is replaced (--force) only once the new one is
 * complete: the two are exchanged (renameat2 RENAME_EXCHANGE; where the
 * file system cannot, the old one is first moved aside to
 * ".<name>.replaced-<pid>-<hex>"), and the old one is removed only once
 * the caller accepted the publication (ms_shard_opts.publish); until then
 * it can be put back. --force replaces only what these commands write: a
 * directory of safetensors and JSON files (an empty directory needs no
 * --force). The parent is locked (flock, released when the process dies)
 * from the start to the end, so that two writers of one output cannot
 * interleave: the second is refused at once. The mechanism is stage.h's;
 * what may be replaced is this file's rule.
 */
struct stage {
	struct ms_stage s;
	int force;
	int existed;     /* the output existed: empty, or replaced under --force */
};

/* What these commands write into an output directory: safetensors files,
 * JSON (configs, index, manifest) and, from a killed run, temporaries. */
static int own_entry(int dfd, const char *name)
{
	size_t l = strlen(name);
	struct stat st;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
		return 0;
	if (name[0] == '.')
		return strstr(name, MS_TMP_MARKER) != NULL;
	return (l > 12 && !strcmp(name + l - 12, ".safetensors")) ||
	       (l > 5 && !strcmp(name + l - 5, ".json"));
}

/* May the existing directory dir be replaced? Sets st->existed. */
static int stage_check_existing(struct stage *st, const char *dir, struct ms_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char *foreign = NULL;
	int empty = 1, rc = MS_OK;

	if (!d)
		return ms_err_set(err, MS_EIO, "'%s': cannot read directory: %s", dir,
				  strerror(errno));
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		empty = 0;
		if (!own_entry(dirfd(d), de->d_name)) {
			foreign = ms_strdup(de->d_name);
			if (!foreign)
				rc = ms_err_nomem(err);
			break;
		}
	}
	closedir(d);
	if (rc != MS_OK)
		return rc;
	if (!empty && !st->force)
		rc = ms_err_set(err, MS_EEXIST, "'%s': output exists (use --force to replace it)",
				dir);
	else if (foreign)
		rc = ms_err_set(err, MS_EEXIST, "'%s': exists and holds '%s', which is not a file a "
				"split, merge or reshard writes: not replacing it", dir, foreign);
	ms_free(foreign);
	st->existed = rc == MS_OK;
	return rc;
}

static void stage_init(struct stage *st)
{
	memset(st, 0, sizeof(*st));
	ms_stage_init(&st->s);
}

/* Lock dir's parent, check what dir holds and make the staging directory
 * beside it. */
static int stage_open(struct stage *st, const char *dir, int force, struct ms_err *err)
{
	struct stat sb;
	int rc;

	st->force = force;
	if ((rc = ms_stage_open(&st->s, dir, "output", MS_STAGE_DIR | MS_STAGE_LOCK | MS_STAGE_MKDIR,
				err)) != MS_OK)
		return rc;
	if (lstat(st->s.dest, &sb) == 0) {
		if (!S_ISDIR(sb.st_mode))
			return ms_err_set(err, MS_EEXIST, "'%s': exists and is not a directory", dir);
		return stage_check_existing(st, st->s.dest, err);
	}
	if (errno != ENOENT)
		return ms_err_set(err, MS_EIO, "'%s': %s", dir, strerror(errno));
	return MS_OK;
}

/* Where a file of the output is written before publication. */
static char *stage_path(const struct stage *st, const char *name)
{
	return ms_path_join(ms_stage_path(&st->s), name);
}

/* Remove what is left unpublished (putting back what a publication that
 * was not recorded replaced), unlock. */
static void stage_release(struct stage *st)
{
	ms_stage_abort(&st->s);
}

/* Messages name the output, not its staging directory. */
static void stage_fix_msg(const struct stage *st, struct ms_err *err)
{
	ms_stage_fix_msg(&st->s, err);
}

/*
 * Publish the staged output and let the caller record it (o->publish):
 * when that fails, its error is returned and stage_release takes the
 * output away again and puts back what it replaced. Then what it replaced
 * is removed.
 */
static int stage_commit(struct stage *st, const struct ms_shard_result *res,
			const struct ms_shard_opts *o, struct ms_err *err)
{
	enum ms_stage_how how = !st->existed ? MS_STAGE_NEW
			      : !st->force   ? MS_STAGE_OVER_EMPTY
					     : MS_STAGE_REPLACE;
	int rc;

	if ((rc = ms_stage_publish(&st->s, how, err)) != MS_OK)
		return rc;
	if (o->publish && (rc = o->publish(o->publish_ctx, res, err)) != MS_OK)
		return rc;
	ms_stage_commit(&st->s);
	return MS_OK;
}

/* ---- split ------------------------------------------------------------------ */

/* Parse "<stem>-ep<rank:05d>-of-<n:05d>.safetensors"; 0 when name is not one. */
static int parse_shard_name(const char *name, char *stem, size_t stemsz, uint32_t *rank,
			    uint32_t *n)
{
	const char *suffix = ".safetensors", *p;
	size_t l = strlen(name), sl = strlen(suffix);
	int32_t v1, v2;

	/* "-epDDDDD-of-DDDDD" is 17 bytes */
	if (l < sl + 18 || strcmp(name + l - sl, suffix))
		return 0;
	p = name + l - sl - 17;
	if (strncmp(p, "-ep", 3) || strncmp(p + 8, "-of-", 4))
		return 0;
	for (int i = 0; i < 5; i++)
		if (p[3 + i] < '0' || p[3 + i] > '9' || p[12 + i] < '0' || p[12 + i] > '9')
			return 0;
	v1 = (int32_t)strtol(p + 3, NULL, 10);
	v2 = (int32_t)strtol(p + 12, NULL, 10);
	if ((size_t)(p - name) >= stemsz)
		return 0;
	memcpy(stem, name, (size_t)(p - name));
	stem[p - name] = '\0';
	*rank = (uint32_t)v1;
	*n = (uint32_t)v2;
	return 1;
}

/* A shard file in dir that does not belong to the set (stem, n). */
static int foreign_shard(const char *dir, const char *stem, uint32_t n, char **found,
			 uint32_t *found_n, struct ms_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int rc = MS_OK;

	*found = NULL;
	if (!d) {
		if (errno == ENOENT)
			return MS_OK;
		return ms_err_set(err, MS_EIO, "'%s': cannot read directory: %s", dir, strerror(errno));
	}
	while ((de = readdir(d))) {
		char st[256];
		uint32_t r, m;

		if (de->d_name[0] == '.' || !parse_shard_name(de->d_name, st, sizeof(st), &r, &m))
			continue;
		if (m != n || strcmp(st, stem)) {
			if (!(*found = ms_path_join(dir, de->d_name)))
				rc = ms_err_nomem(err);
			*found_n = m;
			break;
		}
	}
	closedir(d);
	return rc;
}

/* Checks of the inputs that run on the pool beside the writing (reshard):
 * jobs[0, npre) before the output files, the rest after them; then check
 * must pass before anything is published. */
struct vplan {
	const struct job *jobs;
	size_t npre, njobs;
	int (*check)(void *ctx, struct ms_err *err);
	void *ctx;
};

/*
 * Write s as the shard set of placement pl to dir: the shards, the config
 * files and the manifest (last) into the staging directory st (opened by
 * the caller, unless o->dry_run), published as one step once complete
 * (stage_commit). Without v, s has its digests and expert records
 * computed; with v, its jobs run on the pool beside the writing and
 * v->check must pass before anything is published.
 */
static int split_src(const struct src *s, const struct ms_ep_placement *pl, const char *dir,
		     struct stage *st, const struct ms_shard_opts *o, const struct vplan *v,
		     struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_shard_result *res = NULL;
	struct ms_st_meta *meta = NULL;
	struct outspec *os = NULL;
	struct pool pool;
	struct job *jobs = NULL;
	int32_t *lpos = NULL;
	char **strs = NULL, **spaths = NULL;
	char *mtext = NULL, *p = NULL, num[16], size_s[16], e_s[16];
	const char *fdir;
	size_t mlen = 0, nbase = 0, nmeta = 0, nj = 0;
	const struct sfile *f0 = s->nfiles ? &s->files[0] : NULL;
	uint32_t n = pl->ep_size;
	int rc;

	*out = NULL;
	memset(&pool, 0, sizeof(pool));
	fdir = o->dry_run ? dir : st->s.dest;
	if ((rc = result_new(s, pl, n, &res, err)) != MS_OK)
		goto out;
	/* Each shard keeps the source's metadata and says what it is. */
	for (size_t k = 0; f0 && k < f0->nmeta; k++)
		nbase += strncmp(f0->meta[k].key, META_PREFIX, strlen(META_PREFIX)) != 0;
	nmeta = nbase + 7;
	meta = ms_calloc((size_t)n * nmeta, sizeof(*meta));
	strs = ms_calloc((size_t)n * 2, sizeof(*strs));
	spaths = ms_calloc(n, sizeof(*spaths));
	lpos = ms_malloc((size_t)n * s->E * sizeof(*lpos));
	os = ms_calloc(n, sizeof(*os));
	if (!meta || !strs || !spaths || !lpos || !os) {
		rc = ms_err_nomem(err);
		goto out;
	}
	snprintf(size_s, sizeof(size_s), "%u", n);
	snprintf(e_s, sizeof(e_s), "%u", s->E);
	snprintf(num, sizeof(num), "%d", MS_EP_MANIFEST_VERSION);
	for (uint32_t r = 0; r < n; r++) {
		struct ms_shard_out_file *f = &res->files[r];
		struct ms_st_meta *m = meta + (size_t)r * nmeta;
		int32_t *lp = lpos + (size_t)r * s->E;
		char *name = shard_name(stem_of(s), r, n);
		uint32_t l = pl->first[r + 1] - pl->first[r];
		struct ms_buf b;
		size_t k = 0;

		f->path = name ? ms_path_join(fdir, name) : NULL;
		spaths[r] = name && !o->dry_run ? stage_path(st, name) : NULL;
		ms_free(name);
		f->experts = ms_malloc((l ? l : 1) * sizeof(uint32_t));
		if (!f->path || !f->experts || (!o->dry_run && !spaths[r])) {
			rc = ms_err_nomem(err);
			goto out;
		}
		memcpy(f->experts, pl->ids + pl->first[r], l * sizeof(uint32_t));
		f->nexperts = l;
		f->rank = r;
		for (size_t i = 0; f0 && i < f0->nmeta; i++)
			if (strncmp(f0->meta[i].key, META_PREFIX, strlen(META_PREFIX)))
				m[k++] = f0->meta[i];
		ms_buf_init(&b);
		for (uint32_t i = 0; i < f->nexperts; i++)
			ms_buf_printf(&b, i ? ",%u" : "%u", f->experts[i]);
		strs[2 * r] = ms_asprintf("%u", r);
		strs[2 * r + 1] = b.oom ? NULL : b.data ? ms_buf_detach(&b, NULL) : ms_strdup("");
		ms_buf_release(&b);
		if (!strs[2 * r] || !strs[2 * r + 1]) {
			rc = ms_err_nomem(err);
			goto out;
		}
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "version", num };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "rank", strs[2 * r] };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "size", size_s };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "num_experts", e_s };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "placement",
					      (char *)ms_ep_placement_name(pl->kind) };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "experts", strs[2 * r + 1] };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "source", (char *)s->digest };
		for (uint32_t e = 0; e < s->E; e++)
			lp[e] = -1;
		for (uint32_t i = 0; i < f->nexperts; i++)
			lp[f->experts[i]] = (int32_t)i;
		os[r] = (struct outspec){ .path = spaths[r], .file = -1, .ids = f->experts,
					  .l = f->nexperts, .lpos = lp, .nmeta = k, .meta = m };
		if ((rc = out_plan(s, &os[r], f, err)) != MS_OK)
			goto out;
	}
	if (o->dry_run)
		goto done;

	/* the inputs' faulting in first, then the shards (whose fsyncs then
	 * overlap the checks that follow them), then the checks */
	nj = (size_t)n + (v ? v->njobs : 0);
	if (!(jobs = ms_calloc(nj ? nj : 1, sizeof(*jobs)))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; v && i < v->npre; i++)
		jobs[i] = v->jobs[i];
	for (uint32_t r = 0; r < n; r++) {
		jobs[(v ? v->npre : 0) + r].kind = JOB_FILE;
		jobs[(v ? v->npre : 0) + r].file = r;
	}
	for (size_t i = v ? v->npre : 0; v && i < v->njobs; i++)
		jobs[n + i] = v->jobs[i];
	pool = (struct pool){ .jobs = jobs, .njobs = nj, .s = s, .os = os, .files = res->files,
			      .nfiles = n, .o = o };
	if ((rc = pool_run(&pool, o->nthreads, err)) != MS_OK)
		goto out;
	if (v && (rc = v->check(v->ctx, err)) != MS_OK)
		goto out;
	for (size_t c = 0; c < s->nconfigs; c++) {
		if (!(p = stage_path(st, s->configs[c].name))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		rc = ms_file_write_atomic(p, s->configs[c].text, s->configs[c].len, 0, err);
		ms_free(p);
		p = NULL;
		if (rc != MS_OK)
			goto out;
	}
	/* The manifest last: a set without one is incomplete and is refused. */
	if ((rc = manifest_text(s, pl, res->files, &mtext, &mlen, err)) != MS_OK)
		goto out;
	if (!(p = stage_path(st, MS_EP_MANIFEST))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = ms_file_write_atomic(p, mtext, mlen, 0, err)) != MS_OK)
		goto out;
	if (!(res->manifest_path = ms_path_join(fdir, MS_EP_MANIFEST))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = stage_commit(st, res, o, err)) != MS_OK)
		goto out;
done:
	*out = res;
	res = NULL;
out:
	for (uint32_t r = 0; strs && r < 2 * n; r++)
		ms_free(strs[r]);
	for (uint32_t r = 0; spaths && r < n; r++)
		ms_free(spaths[r]);
	ms_free(strs);
	ms_free(spaths);
	ms_free(os);
	ms_free(jobs);
	ms_shard_result_free(res);
	ms_free(meta);
	ms_free(lpos);
	ms_free(mtext);
	ms_free(p);
	return rc;
}

static int same_dir(const char *a, const char *b)
{
	struct stat x, y;

	return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* Is dir the directory that holds the file path? */
static int same_parent(const char *path, const char *dir)
{
	struct stat st;
	char *parent;
	const char *slash;
	int same;

	if (stat(path, &st) || S_ISDIR(st.st_mode))
		return 0;
	slash = strrchr(path, '/');
	parent = slash ? ms_strndup(path, (size_t)(slash - path) + (slash == path)) : ms_strdup(".");
	same = parent && same_dir(parent, dir);
	ms_free(parent);
	return same;
}

/*
 * The expert count the tensors were read with against the base model's
 * (o->base_experts; 0: unknown). A fused LoRA's rows are E*r: r in
 * adapter_config.json is what turns them into experts, so a wrong r splits
 * 16 experts into "12" with every shape consistent; only the base can tell.
 * Returns MS_OK, or code with the tensor, the rule and both counts.
 */
static int check_base(const struct src *s, const struct ms_shard_opts *o, int code,
		      struct ms_err *err)
{
	const char *bl = o && o->base_label ? o->base_label : "the base";

	if (!o || !o->base_experts || s->E == o->base_experts)
		return MS_OK;
	if (s->e_from)
		return ms_err_set(err, code, "tensor '%s' in '%s': %llu rows at r=%u "
				  "(adapter_config.json) make %u experts, but the base '%s' has %u: "
				  "\"r\" does not fit the fused LoRA's shapes", s->e_from->name, s->label,
				  (unsigned long long)s->e_from->shape[0], s->e_from->r, s->E, bl,
				  o->base_experts);
	return ms_err_set(err, code, "'%s': %u experts, but the base '%s' has %u", s->label, s->E,
			  bl, o->base_experts);
}

int ms_shard_split(const char *src, const char *dir, const struct ms_shard_opts *o,
		   struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_ckpt *c = NULL;
	struct ms_ep_placement *pl = NULL;
	struct stage st;
	struct src s;
	int rc;

	*out = NULL;
	stage_init(&st);
	memset(&s, 0, sizeof(s));
	s.label = src;
	if (same_dir(src, dir) || same_parent(src, dir)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': split into another directory than its input's",
				dir);
		goto out;
	}
	if ((rc = ms_ckpt_open(src, &c, err)) != MS_OK)
		goto out;
	if ((rc = src_from_ckpt(&s, c, err)) != MS_OK)
		goto out;
	if ((rc = analyze(&s, o->num_experts, "--experts", err)) != MS_OK ||
	    (rc = check_base(&s, o, MS_EINVAL, err)) != MS_OK)
		goto out;
	if ((rc = ms_ep_placement_new(o->placement, s.E, o->ep_size, &pl, err)) != MS_OK)
		goto out;
	if ((rc = src_point_whole(&s, err)) != MS_OK)
		goto out;
	/* an output that may not be replaced is refused before the hashing */
	if (!o->dry_run && (rc = stage_open(&st, dir, o->force, err)) != MS_OK)
		goto out;
	if (!o->dry_run) {
		if ((rc = ms_ckpt_hash(c, o->nthreads, 0, err)) != MS_OK)
			goto out;
		for (size_t i = 0; i < s.n; i++) {
			memcpy(s.t[i].digest, s.t[i].st->digest, MS_SHA256_LEN);
			s.t[i].has_digest = 1;
		}
		if ((rc = src_state_digest(&s, s.digest, err)) != MS_OK ||
		    (rc = hash_records(&s, o->nthreads, err)) != MS_OK)
			goto out;
	}
	rc = split_src(&s, pl, dir, &st, o, NULL, out, err);
out:
	if (rc != MS_OK)
		stage_fix_msg(&st, err);
	/* the lock goes last: the output is complete or removed by now */
	stage_release(&st);
	ms_ep_placement_free(pl);
	src_release(&s);
	ms_ckpt_close(c);
	return rc;
}

/* ---- reading a shard set ---------------------------------------------------- */

struct sset {
	char *dir;
	char *mpath;
	cJSON *m;
	struct src s;
	struct ms_ep_placement *pl;
	char stem[16];
	struct ms_ckpt **ck;               /* [N], NULL where not opened */
	char **names;                      /* [N] shard file names */
	char (*sdig)[MS_STATE_DIGEST_LEN]; /* [N] the manifest's shard digests */
	struct stensor **by_name;          /* src tensors sorted by name */
	/* every fault found (a check goes on after the first) */
	struct ms_ep_fault *faults;
	size_t nfaults, capfaults;
	uint64_t nfaults_more;
	uint8_t *tbad;                     /* [src n] a fault names the tensor */
	uint8_t *missing;                  /* [src n] an expert tensor absent
					    * from its own rank */
	uint32_t *rbad;                    /* [N] faults on each rank */
	uint64_t *stray;                   /* (tensor << 32 | rank) of expert
					    * tensors on another rank */
	size_t nstray;
};

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

static void sset_release(struct sset *ss)
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
	src_release(&ss->s);
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
		if (json_u64(x, UINT32_MAX, &v) || v != ids[i++])
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
			rc = src_add_config(s, name, text, len, got, err);
		ms_free(text);
		ms_free(path);
		if (rc != MS_OK)
			return rc;
	}
	s->is_adapter = src_config(s, "adapter_config.json") != NULL;

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
		    json_u64(cJSON_GetObjectItemCaseSensitive(t, "file"), s->nfiles - 1, &v))
			return bad(ss, err, "each of \"tensors\" needs \"name\", a known \"dtype\", "
				   "\"shape\", \"sha256\" and a \"file\" index");
		x->file = (uint32_t)v;
		cJSON_ArrayForEach(d, shape) {
			if (json_u64(d, UINT64_MAX, &x->shape[x->ndim]))
				return bad(ss, err, "tensor shapes must be arrays of integers");
			x->ndim++;
		}
		if (shape_nbytes(x->dtype, x->ndim, x->shape, &x->nbytes))
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

	packing_str(s->packing, packing, sizeof(packing));
	if (!mp || strcmp(mp, packing))
		return ms_err_set(err, MS_EINVAL, "'%s': packing '%s', but the tensors are '%s'",
				  ss->mpath, mp ? mp : "(none)", packing);
	if (s->r ? (json_u64(mr, UINT32_MAX, &v) || v != s->r) : (mr && !cJSON_IsNull(mr)))
		return ms_err_set(err, MS_EINVAL, "'%s': \"r\" does not match adapter_config.json",
				  ss->mpath);
	cJSON_ArrayForEach(t, tens) {
		const struct stensor *y = &s->t[i++];
		const char *kind = jstr(t, "kind");
		int ok = kind && !strcmp(kind, tkind_names[y->kind]);

		if (ok && y->kind == TK_EXPERT)
			ok = !json_u64(cJSON_GetObjectItemCaseSensitive(t, "expert"), UINT32_MAX, &v) &&
			     v == (uint64_t)y->expert;
		if (ok && y->kind != TK_REPLICATED)
			ok = jstr(t, "param") && !strcmp(jstr(t, "param"), y->param) &&
			     jstr(t, "part") && !strcmp(jstr(t, "part"), y->part);
		if (ok && (y->kind == TK_FUSED_A || y->kind == TK_FUSED_B))
			ok = !json_u64(cJSON_GetObjectItemCaseSensitive(t, "r"), UINT32_MAX, &v) &&
			     v == y->r;
		if (!ok)
			return ms_err_set(err, MS_EINVAL, "'%s': tensor '%s' is recorded as '%s', but its "
					  "name, shape and config make it %s%s%s", ss->mpath, y->name,
					  kind ? kind : "(none)", tkind_names[y->kind],
					  y->param ? " of " : "", y->param ? y->param : "");
	}
	if (!cJSON_IsArray(recs) || (size_t)cJSON_GetArraySize(recs) != s->nrec)
		return ms_err_set(err, MS_EINVAL, "'%s': \"experts\" must list %zu expert slices",
				  ss->mpath, s->nrec);
	i = 0;
	cJSON_ArrayForEach(x, recs) {
		struct srec *r = &s->rec[i++];
		const struct stensor *y = &s->t[r->tensor];

		if (json_u64(cJSON_GetObjectItemCaseSensitive(x, "expert"), UINT32_MAX, &v) ||
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
	local_shape(t, ss->pl->first[r + 1] - ss->pl->first[r], shape);
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
		local_shape(t, l, shape);
		if (y->dtype != t->dtype || y->ndim != t->ndim ||
		    memcmp(y->shape, shape, t->ndim * sizeof(uint64_t))) {
			char want_s[24 * MS_ST_MAX_RANK + 4], got_s[24 * MS_ST_MAX_RANK + 4];

			shape_text(t->ndim, shape, want_s, sizeof(want_s));
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

/* What a verification covers beyond every byte of the opened shards. */
#define V_SHARDS 1u     /* each shard's state digest: whole sliced tensors hashed */
#define V_REASSEMBLE 2u /* sliced tensors put back together: the source's digests */

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
 * Bytes against digests, once the jobs of sset_jobs ran; every fault is
 * recorded (fault_add) and the check goes on. Every byte of the opened
 * shards is checked: replicated tensors by their digests, routed experts
 * through every expert's canonical slices (a per-expert tensor's is its
 * digest). With V_SHARDS also the state digest of each shard without a
 * fault of its own, with V_REASSEMBLE (when nothing else failed) the
 * source digests of the sliced tensors.
 */
static int sset_check(struct sset *ss, unsigned what, struct ms_err *err)
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

		if ((rc = src_state_digest(s, d, err)) != MS_OK)
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

		if (!is_sliced(t->kind))
			continue;
		if (!(c = ms_sha256_new())) {
			rc = ms_err_nomem(err);
			goto out;
		}
		rc = emit(s, t, all, s->E, buf, sink_sha, c, err);
		if (rc == MS_OK && (rc = ms_sha256_final(c, d)) != MS_OK)
			rc = sha_fail(rc, err);
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
 * digests are checked); every expert's canonical slices (rec_jobs).
 */
static int sset_jobs(struct sset *ss, unsigned what, struct jobs *jl, size_t *npre,
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
		if (!(j = jobs_add(jl, JOB_PREFAULT)))
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
			if (!(j = jobs_add(jl, JOB_HASH)))
				return ms_err_nomem(err);
			j->data = f->map;
			j->n = 8 + f->header_len;
			j->digest = f->header_digest;
		}
		for (size_t i = 0; i < f->ntensors; i++) {
			struct ms_tensor *t = &f->tensors[i];
			const struct stensor *x = sset_find(ss, t->name);

			if (!(what & V_SHARDS) && (!x || is_sliced(x->kind)))
				continue;
			if (!(j = jobs_add(jl, JOB_HASH)))
				return ms_err_nomem(err);
			j->data = t->data;
			j->n = t->nbytes;
			j->digest = t->digest;
		}
	}
	if ((rc = rec_jobs(&ss->s, jl, err)) != MS_OK)
		return rc;
	jobs_sort(jl, from);
	return MS_OK;
}

/* After the jobs of sset_jobs ran: what they hashed has its digest. */
static void sset_jobs_done(struct sset *ss, unsigned what)
{
	for (uint32_t r = 0; r < ss->pl->ep_size; r++) {
		struct ms_st_file *f = ss->ck[r] ? ss->ck[r]->files[0] : NULL;

		if (!f)
			continue;
		if ((what & V_SHARDS) && f->map)
			f->has_header_digest = 1;
		for (size_t i = 0; i < f->ntensors; i++) {
			const struct stensor *x = sset_find(ss, f->tensors[i].name);

			f->tensors[i].has_digest = (what & V_SHARDS) || (x && !is_sliced(x->kind));
		}
	}
	rec_finish(&ss->s);
}

/* Hash the opened shards and check them (see sset_check). */
static int sset_hash_verify(struct sset *ss, int nthreads, unsigned what, struct ms_err *err)
{
	struct jobs jl = { 0 };
	struct pool p = { 0 };
	size_t npre;
	int rc;

	if ((rc = sset_jobs(ss, what, &jl, &npre, err)) == MS_OK) {
		p.jobs = jl.v;
		p.njobs = jl.n;
		rc = pool_run(&p, nthreads, err);
	}
	jobs_release(&jl);
	if (rc != MS_OK)
		return rc;
	sset_jobs_done(ss, what);
	return sset_check(ss, what, err);
}

/*
 * Open the set at path (directory or manifest). only: the one rank to
 * open, or -1 for all; expect_n: the EP size the caller needs (0: any);
 * hash: hash the shards and verify them, with the extra checks in what.
 */
static int sset_open(const char *path, int64_t only, uint32_t expect_n, int hash,
		     unsigned what, int nthreads, const struct ms_shard_opts *o, struct sset *ss,
		     struct ms_err *err)
{
	struct stat st;
	char *text = NULL, *foreign = NULL;
	size_t len;
	const cJSON *pj, *shards, *x;
	const char *kind, *stem, *pname;
	uint64_t e, n, v;
	uint32_t foreign_n = 0;
	int rc, nomem;

	memset(ss, 0, sizeof(*ss));
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
	if (!jstr(ss->m, "format") || strcmp(jstr(ss->m, "format"), MS_EP_MANIFEST_FORMAT))
		return bad(ss, err, "not an EP manifest (\"format\" is not \"" MS_EP_MANIFEST_FORMAT "\")");
	if (json_u64(cJSON_GetObjectItemCaseSensitive(ss->m, "version"), UINT32_MAX, &v) ||
	    v != MS_EP_MANIFEST_VERSION)
		return bad(ss, err, "unsupported manifest version");
	kind = jstr(ss->m, "kind");
	stem = jstr(ss->m, "stem");
	if (!kind || (strcmp(kind, "adapter") && strcmp(kind, "checkpoint")) || !stem ||
	    strcmp(stem, !strcmp(kind, "adapter") ? "adapter_model" : "model"))
		return bad(ss, err, "\"kind\" must be adapter (stem adapter_model) or checkpoint "
			   "(stem model)");
	snprintf(ss->stem, sizeof(ss->stem), "%s", stem);
	if (json_u64(cJSON_GetObjectItemCaseSensitive(ss->m, "num_experts"), MS_EP_MAX_EXPERTS, &e) ||
	    e == 0 ||
	    json_u64(cJSON_GetObjectItemCaseSensitive(ss->m, "ep_size"), MS_EP_MAX_RANKS, &n) || n == 0)
		return bad(ss, err, "\"num_experts\" and \"ep_size\" must be positive integers");
	if (expect_n && n != expect_n)
		return ms_err_set(err, MS_EINVAL, "'%s': the shards were made for EP size %llu, but this "
				  "run has EP size %u: run 'msshard reshard %s -o DIR --ep-size %u' "
				  "and load that", ss->dir, (unsigned long long)n, expect_n, ss->dir,
				  expect_n);
	if (only >= (int64_t)n)
		return ms_err_set(err, MS_EINVAL, "rank %lld is not in 0..%llu", (long long)only,
				  (unsigned long long)(n - 1));
	pj = cJSON_GetObjectItemCaseSensitive(ss->m, "placement");
	pname = jstr(pj, "name");
	if (!cJSON_IsObject(pj) || !pname)
		return bad(ss, err, "\"placement\" needs a \"name\" and \"ranks\"");
	if ((rc = placement_from_ranks(cJSON_GetObjectItemCaseSensitive(pj, "ranks"), ss->mpath,
				       (uint32_t)e, (uint32_t)n, &ss->pl, err)) != MS_OK)
		return rc;
	if (!strcmp(pname, "contiguous") || !strcmp(pname, "round-robin")) {
		struct ms_ep_placement *b;
		int eq;

		if ((rc = placement_builtin(!strcmp(pname, "contiguous") ? MS_EP_PLACEMENT_CONTIGUOUS
									 : MS_EP_PLACEMENT_ROUND_ROBIN,
					    (uint32_t)e, (uint32_t)n, &b, err)) != MS_OK)
			return ms_err_prefix(err, "'%s'", ss->mpath);
		eq = placement_equal(b, ss->pl);
		ms_ep_placement_free(b);
		if (!eq)
			return ms_err_set(err, MS_EINVAL, "'%s': the placement table is not the '%s' "
					  "placement its name says", ss->mpath, pname);
		ss->pl->kind = !strcmp(pname, "contiguous") ? MS_EP_PLACEMENT_CONTIGUOUS
							     : MS_EP_PLACEMENT_ROUND_ROBIN;
	} else if (strcmp(pname, "map")) {
		return bad(ss, err, "placement name must be contiguous, round-robin or map");
	}

	if ((rc = sset_read_source(ss, err)) != MS_OK)
		return rc;
	if ((!strcmp(kind, "adapter")) != ss->s.is_adapter)
		return bad(ss, err, "\"kind\" does not match the config files (adapter_config.json)");
	if ((rc = analyze(&ss->s, (uint32_t)e, "the manifest", err)) != MS_OK ||
	    (rc = sset_check_classes(ss, err)) != MS_OK)
		return rc;
	/* a set split with a wrong r is self-consistent: only the base's
	 * expert count shows it (a fault; the rest is still checked) */
	if (check_base(&ss->s, o, MS_ECHECK, err) != MS_OK &&
	    (rc = fault_add(ss, fault_of(MS_EP_FAULT_EXPERTS, ss->s.e_from ? ss->s.e_from->name : NULL,
					 ss->mpath, -1, -1, -1, -1), -1, err, "%s", err->msg)) != MS_OK)
		return rc;

	shards = cJSON_GetObjectItemCaseSensitive(ss->m, "shards");
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
	v = 0;
	cJSON_ArrayForEach(x, shards) {
		uint32_t r = (uint32_t)v++;
		uint64_t got;
		const char *file = jstr(x, "file"), *d = jstr(x, "state_digest");

		if (!(ss->names[r] = shard_name(ss->stem, r, (uint32_t)n)))
			return ms_err_nomem(err);
		if (json_u64(cJSON_GetObjectItemCaseSensitive(x, "rank"), UINT32_MAX, &got) || got != r ||
		    !file || strcmp(file, ss->names[r]) || !valid_state_digest(d) ||
		    !ids_equal(cJSON_GetObjectItemCaseSensitive(x, "experts"),
			       ss->pl->ids + ss->pl->first[r],
			       ss->pl->first[r + 1] - ss->pl->first[r]))
			return ms_err_set(err, MS_EINVAL, "'%s': shard %u must be rank %u in file '%s' with "
					  "the placement's experts and a state digest", ss->mpath, r,
					  r, ss->names[r]);
		memcpy(ss->sdig[r], d, MS_STATE_DIGEST_LEN);
	}

	if ((rc = foreign_shard(ss->dir, ss->stem, (uint32_t)n, &foreign, &foreign_n, err)) != MS_OK)
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
	if ((rc = sset_resolve_strays(ss, only, err)) != MS_OK ||
	    (rc = sset_point(ss, err)) != MS_OK)
		return rc;
	return hash ? sset_hash_verify(ss, nthreads, what, err) : sset_verdict(ss, err);
}

static int sset_result(const struct sset *ss, struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_shard_result *res;
	int rc = result_new(&ss->s, ss->pl, ss->pl->ep_size, &res, err);

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
	rc = sset_open(dir, -1, 0, 1, V_SHARDS | V_REASSEMBLE, o ? o->nthreads : 0, o, &ss, err);
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
	sset_release(&ss);
	return rc;
}

/* After the reshard's checking jobs ran beside the writing. */
static int reshard_check(void *ctx, struct ms_err *err)
{
	struct sset *ss = ctx;

	sset_jobs_done(ss, 0);
	return sset_check(ss, 0, err);
}

int ms_shard_reshard(const char *dir, const char *out_dir, const struct ms_shard_opts *o,
		     struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_ep_placement *pl = NULL;
	struct jobs jl = { 0 };
	struct vplan v = { 0 };
	struct stage st;
	struct sset ss;
	int rc;

	*out = NULL;
	stage_init(&st);
	rc = sset_open(dir, -1, 0, 0, 0, o->nthreads, NULL, &ss, err);
	if (rc != MS_OK)
		goto out;
	if (same_dir(ss.dir, out_dir)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': reshard into another directory than its input",
				out_dir);
		goto out;
	}
	if ((rc = ms_ep_placement_new(o->placement, ss.s.E, o->ep_size, &pl, err)) != MS_OK)
		goto out;
	if (!o->dry_run) {
		if ((rc = stage_open(&st, out_dir, o->force, err)) != MS_OK ||
		    (rc = sset_jobs(&ss, 0, &jl, &v.npre, err)) != MS_OK)
			goto out;
		v.jobs = jl.v;
		v.njobs = jl.n;
		v.check = reshard_check;
		v.ctx = &ss;
	}
	/* The inputs are checked on the pool while the outputs are written
	 * there; nothing is published before the check passed. The expert
	 * digests of the output are the input's, verified. */
	rc = split_src(&ss.s, pl, out_dir, &st, o, o->dry_run ? NULL : &v, out, err);
out:
	if (rc != MS_OK)
		stage_fix_msg(&st, err);
	stage_release(&st);
	jobs_release(&jl);
	ms_ep_placement_free(pl);
	sset_release(&ss);
	return rc;
}

/* A JSON string as Python's json.dumps writes it (ensure_ascii). */
static void py_str(struct ms_buf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	ms_buf_puts(b, "\"");
	while (*p) {
		uint32_t cp = *p;
		size_t len = 1;

		if (cp >= 0x80) {
			/* decode UTF-8; a malformed byte is copied as it is */
			len = cp >= 0xf0 ? 4 : cp >= 0xe0 ? 3 : cp >= 0xc0 ? 2 : 1;
			cp &= len == 4 ? 0x07 : len == 3 ? 0x0f : 0x1f;
			for (size_t i = 1; i < len; i++) {
				if ((p[i] & 0xc0) != 0x80) {
					len = 0;
					break;
				}
				cp = (cp << 6) | (p[i] & 0x3f);
			}
			if (len < 2) {
				ms_buf_append(b, p, 1);
				p++;
				continue;
			}
			if (cp >= 0x10000) {
				cp -= 0x10000;
				ms_buf_printf(b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
					      0xdc00 + (cp & 0x3ff));
			} else {
				ms_buf_printf(b, "\\u%04x", cp);
			}
			p += len;
			continue;
		}
		switch (cp) {
		case '"': ms_buf_puts(b, "\\\""); break;
		case '\\': ms_buf_puts(b, "\\\\"); break;
		case '\n': ms_buf_puts(b, "\\n"); break;
		case '\r': ms_buf_puts(b, "\\r"); break;
		case '\t': ms_buf_puts(b, "\\t"); break;
		case '\b': ms_buf_puts(b, "\\b"); break;
		case '\f': ms_buf_puts(b, "\\f"); break;
		default:
			if (cp < 0x20)
				ms_buf_printf(b, "\\u%04x", cp);
			else
				ms_buf_append(b, p, 1);
		}
		p++;
	}
	ms_buf_puts(b, "\"");
}

static int cmp_json_key(const void *a, const void *b)
{
	return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/*
 * JSON as Python's json.dumps(x, indent=2, sort_keys=True) writes it: the
 * format of the model.safetensors.index.json that save_pretrained writes,
 * so a merged checkpoint gets back the very bytes of its index. MS_EINVAL
 * for what it cannot write (nesting past 64), MS_ENOMEM.
 */
static int py_json(struct ms_buf *b, const cJSON *j, int depth)
{
	const cJSON *c;
	const cJSON **kids = NULL;
	size_t n = 0, k = 0;
	int rc;

	if (depth > 64)
		return MS_EINVAL;
	if (cJSON_IsNull(j)) {
		ms_buf_puts(b, "null");
	} else if (cJSON_IsBool(j)) {
		ms_buf_puts(b, cJSON_IsTrue(j) ? "true" : "false");
	} else if (cJSON_IsNumber(j)) {
		double v = j->valuedouble;
		char num[40];

		if (v == floor(v) && fabs(v) < 9007199254740992.0) {
			ms_buf_printf(b, "%.0f", v);
		} else {
			/* the shortest form that reads back, as repr() */
			for (int prec = 15; prec <= 17; prec++) {
				snprintf(num, sizeof(num), "%.*g", prec, v);
				if (strtod(num, NULL) == v)
					break;
			}
			ms_buf_puts(b, num);
		}
	} else if (cJSON_IsString(j)) {
		py_str(b, j->valuestring);
	} else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
		int obj = cJSON_IsObject(j);

		cJSON_ArrayForEach(c, j)
			n++;
		if (!n) {
			ms_buf_puts(b, obj ? "{}" : "[]");
			return MS_OK;
		}
		if (!(kids = ms_malloc(n * sizeof(*kids))))
			return MS_ENOMEM;
		cJSON_ArrayForEach(c, j)
			kids[k++] = c;
		if (obj)
			qsort(kids, n, sizeof(*kids), cmp_json_key);
		ms_buf_puts(b, obj ? "{\n" : "[\n");
		for (k = 0; k < n; k++) {
			ms_buf_printf(b, "%*s", 2 * (depth + 1), "");
			if (obj) {
				py_str(b, kids[k]->string);
				ms_buf_puts(b, ": ");
			}
			if ((rc = py_json(b, kids[k], depth + 1)) != MS_OK) {
				ms_free(kids);
				return rc;
			}
			ms_buf_puts(b, k + 1 < n ? ",\n" : "\n");
		}
		ms_buf_printf(b, "%*s%s", 2 * depth, "", obj ? "}" : "]");
		ms_free(kids);
	} else {
		return MS_EINVAL;
	}
	return MS_OK;
}

static int write_index(const struct src *s, const char *out_dir, struct ms_err *err)
{
	cJSON *root = cJSON_CreateObject(), *wm = NULL;
	char *path = NULL;
	struct ms_buf b;
	int rc = MS_OK, ok = root != NULL;

	ms_buf_init(&b);
	if (ok && s->index_meta)
		ok = ms_json_put(root, "metadata", cJSON_Duplicate(s->index_meta, 1));
	ok = ok && (wm = cJSON_AddObjectToObject(root, "weight_map"));
	for (size_t i = 0; ok && i < s->n; i++)
		ok = cJSON_AddStringToObject(wm, s->t[i].name, s->files[s->t[i].file].name) != NULL;
	if (ok && (rc = py_json(&b, root, 0)) == MS_EINVAL)
		rc = ms_err_set(err, rc, "'%s': the index metadata is nested too deeply", s->label);
	else if (rc == MS_OK && ok)
		ok = ms_buf_puts(&b, "\n") == 0 && !b.oom;
	path = ms_path_join(out_dir, s->index_name);
	if (rc == MS_OK && (!ok || !path))
		rc = ms_err_nomem(err);
	else if (rc == MS_ENOMEM)
		ms_err_nomem(err);
	else if (rc == MS_OK)
		rc = ms_file_write_atomic(path, b.data, b.len, 0, err);
	ms_buf_release(&b);
	cJSON_Delete(root);
	ms_free(path);
	return rc;
}

int ms_shard_merge(const char *dir, const char *out_dir, const struct ms_shard_opts *o,
		   struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_shard_result *res = NULL;
	struct outspec *os = NULL;
	struct job *jobs = NULL;
	struct stage st;
	struct pool pool;
	struct sset ss;
	uint32_t *all = NULL;
	int32_t *lpos = NULL;
	char **spaths = NULL, *p = NULL;
	const char *fdir = out_dir;
	size_t nf = 0;
	int rc;

	*out = NULL;
	stage_init(&st);
	rc = sset_open(dir, -1, 0, 0, 0, o->nthreads, NULL, &ss, err);
	if (rc != MS_OK)
		goto out;
	if (same_dir(ss.dir, out_dir)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': merge into another directory than its input",
				out_dir);
		goto out;
	}
	/* an output that may not be replaced is refused before the hashing */
	if (!o->dry_run) {
		if ((rc = stage_open(&st, out_dir, o->force, err)) != MS_OK ||
		    (rc = sset_hash_verify(&ss, o->nthreads, V_SHARDS | V_REASSEMBLE, err)) != MS_OK)
			goto out;
		fdir = st.s.dest;
	}
	nf = ss.s.nfiles;
	if ((rc = result_new(&ss.s, ss.pl, nf, &res, err)) != MS_OK)
		goto out;
	all = ms_malloc((size_t)ss.s.E * sizeof(*all));
	lpos = ms_malloc((size_t)ss.s.E * sizeof(*lpos));
	os = ms_calloc(nf, sizeof(*os));
	spaths = ms_calloc(nf, sizeof(*spaths));
	jobs = ms_calloc(nf, sizeof(*jobs));
	if (!all || !lpos || !os || !spaths || !jobs) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (uint32_t e = 0; e < ss.s.E; e++) {
		all[e] = e;
		lpos[e] = (int32_t)e;
	}
	for (size_t f = 0; f < nf; f++) {
		struct ms_shard_out_file *of = &res->files[f];

		of->rank = UINT32_MAX;
		of->path = ms_path_join(fdir, ss.s.files[f].name);
		of->experts = ms_malloc((size_t)ss.s.E * sizeof(uint32_t));
		spaths[f] = o->dry_run ? NULL : stage_path(&st, ss.s.files[f].name);
		if (!of->path || !of->experts || (!o->dry_run && !spaths[f])) {
			rc = ms_err_nomem(err);
			goto out;
		}
		memcpy(of->experts, all, (size_t)ss.s.E * sizeof(uint32_t));
		of->nexperts = ss.s.E;
		os[f] = (struct outspec){ .path = spaths[f], .file = (int64_t)f, .ids = all,
					  .l = ss.s.E, .lpos = lpos, .nmeta = ss.s.files[f].nmeta,
					  .meta = ss.s.files[f].meta };
		if ((rc = out_plan(&ss.s, &os[f], of, err)) != MS_OK)
			goto out;
		jobs[f].kind = JOB_FILE;
		jobs[f].file = (uint32_t)f;
	}
	if (o->dry_run)
		goto done;
	pool = (struct pool){ .jobs = jobs, .njobs = nf, .s = &ss.s, .os = os,
			      .files = res->files, .nfiles = nf, .o = o };
	if ((rc = pool_run(&pool, o->nthreads, err)) != MS_OK)
		goto out;
	if (ss.s.index_name && (rc = write_index(&ss.s, ms_stage_path(&st.s), err)) != MS_OK)
		goto out;
	for (size_t c = 0; c < ss.s.nconfigs; c++) {
		if (!(p = stage_path(&st, ss.s.configs[c].name))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		rc = ms_file_write_atomic(p, ss.s.configs[c].text, ss.s.configs[c].len, 0, err);
		ms_free(p);
		p = NULL;
		if (rc != MS_OK)
			goto out;
	}
	if ((rc = stage_commit(&st, res, o, err)) != MS_OK)
		goto out;
done:
	*out = res;
	res = NULL;
out:
	if (rc != MS_OK)
		stage_fix_msg(&st, err);
	stage_release(&st);
	for (size_t f = 0; spaths && f < nf; f++)
		ms_free(spaths[f]);
	ms_free(spaths);
	ms_free(os);
	ms_free(jobs);
	ms_shard_result_free(res);
	ms_free(all);
	ms_free(lpos);
	sset_release(&ss);
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
	rc = sset_open(manifest_or_dir, rank, ep_size, 1, V_SHARDS, 0, NULL, &ss, err);
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
	sset_release(&ss);
	return rc;
}
