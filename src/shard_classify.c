/*
 * shard_classify.c: what each tensor of a model is to expert parallelism
 * (replicated, per-expert, fused LoRA A/B, grouped), its canonical
 * identity, and the expert count from the configs or the inventory.
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

static const char *const known_param_order[] = {
	/* the order transformers' fused expert modules declare their
	 * parameters, which is the order PEFT wraps them in (innermost
	 * first) */
	"gate_up_proj", "gate_proj", "up_proj", "down_proj",
};

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
	if (shard_json_u64(j, max, &v))
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
		if (shard_json_u64(hit, MAX_LORA_RANK, &v) || v == 0)
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
	const struct sconfig *c = shard_src_config(s, name);
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
		if (shard_json_u64(j, MS_EP_MAX_EXPERTS, &v) || v == 0)
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
		if (shard_json_u64(hit, MAX_LORA_RANK, &v) || v == 0)
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

/* What classifying the tensors of a model found, for settling E. */
struct census {
	struct wrapper *w;     /* [n] the fused LoRA wrappers, nw used */
	struct wrapper **wp;   /* [n] the same, to be sorted by module */
	size_t nw;
	uint32_t e_cfg, e_fused, e_grouped;
	const char *fused_from, *grouped_from, *max_from;
	int64_t max_expert;
};

/* Classify tensor i of s by its name and shape: per-expert, the A or B of
 * a fused LoRA wrapper (collected in c->w, resolved later), grouped, or
 * replicated. */
static int classify_tensor(struct src *s, const cJSON *acfg, size_t i, struct census *c,
			   struct ms_err *err)
{
	struct stensor *t = &s->t[i];
	struct ms_name_info in;
	int rc = MS_OK;

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
		if (in.expert > c->max_expert) {
			c->max_expert = in.expert;
			c->max_from = t->name;
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

		for (size_t j = 0; j < c->nw && !x; j++)
			if (c->w[j].plen == in.module_len &&
			    !memcmp(c->w[j].prefix, t->name, in.module_len))
				x = &c->w[j];
		if (!x) {
			x = &c->w[c->nw++];
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
		if (!c->e_grouped) {
			c->e_grouped = t->shape[0] > MS_EP_MAX_EXPERTS ? MS_EP_MAX_EXPERTS + 1
								       : (uint32_t)t->shape[0];
			c->grouped_from = t->name;
		} else if (t->shape[0] != c->e_grouped) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': %llu experts in its "
					"first dimension, but '%s' has %u", t->name, s->label,
					(unsigned long long)t->shape[0], c->grouped_from, c->e_grouped);
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
	/* everything else, including a fused scalar shared by all experts, is
	 * replicated */
out:
	return rc;
}

/* Pair each fused LoRA wrapper's A with its B, resolve the parameter of
 * its module that each wraps, and take the expert count they hold. */
static int resolve_wrappers(struct src *s, const cJSON *acfg, struct census *c,
			    struct ms_err *err)
{
	struct wrapper *w = c->w, **wp = c->wp;
	size_t nw = c->nw, k;
	int rc = MS_OK;

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
		if (!c->e_fused) {
			c->e_fused = ew;
			c->fused_from = a->name;
			s->e_from = a;
		} else if (ew != c->e_fused) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': %u experts at r=%u, but "
					"'%s' has %u", a->name, s->label, ew, w[j].r, c->fused_from,
					c->e_fused);
			goto out;
		}
		s->packing |= PACK_FUSED;
	}
out:
	return rc;
}

/* Set s->E from every source of the expert count, which must agree: the
 * caller's (e_given, named given_from), config.json's, the fused LoRA's,
 * the grouped tensors' and the highest expert index. */
static int settle_experts(struct src *s, uint32_t e_given, const char *given_from,
			  const struct census *c, struct ms_err *err)
{
	uint32_t e = e_given ? e_given : c->e_cfg ? c->e_cfg : c->e_fused ? c->e_fused
										     : c->e_grouped;
	int rc = MS_OK;

	if (c->e_cfg && c->e_cfg != e) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': config.json says %u experts, but %s says %u",
				s->label, c->e_cfg, given_from, e);
		goto out;
	}
	if (c->e_fused && c->e_fused != e) {
		rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': holds %u experts, but %s says %u",
				c->fused_from, s->label, c->e_fused,
				e_given ? given_from : "config.json", e);
		goto out;
	}
	if (c->e_grouped && c->e_grouped != e) {
		rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': holds %u experts, but %s says %u",
				c->grouped_from, s->label, c->e_grouped,
				e_given ? given_from : c->e_cfg ? "config.json" : "the fused LoRA", e);
		goto out;
	}
	if (!s->packing) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': no routed expert tensors: nothing to shard",
				s->label);
		goto out;
	}
	if (!e)
		e = (uint32_t)(c->max_expert + 1);
	if (c->max_expert >= (int64_t)e) {
		rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': expert %lld, but the model has %u "
				"experts", c->max_from, s->label, (long long)c->max_expert, e);
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
		    (t->nbytes % e || shard_shape_nbytes(t->dtype, t->ndim - 1, t->shape + 1, &one) ||
		     one * e != t->nbytes)) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' in '%s': one expert's slice is not "
					"whole bytes", t->name, s->label);
			goto out;
		}
	}
out:
	return rc;
}

/* The expert records, one per (expert, tensor) slice, in cmp_rec order;
 * no expert may have one slice in two tensors. */
static int build_records(struct src *s, struct ms_err *err)
{
	uint32_t e = s->E;
	size_t k = 0;
	int rc = MS_OK;

	s->nrec = 0;
	for (size_t i = 0; i < s->n; i++)
		s->nrec += s->t[i].kind == TK_EXPERT ? 1 : shard_is_sliced(s->t[i].kind) ? e : 0;
	ms_free(s->rec);
	s->rec = ms_calloc(s->nrec ? s->nrec : 1, sizeof(*s->rec));
	if (!s->rec) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < s->n; i++) {
		if (s->t[i].kind == TK_EXPERT) {
			s->rec[k].tensor = (uint32_t)i;
			s->rec[k++].expert = (uint32_t)s->t[i].expert;
		} else if (shard_is_sliced(s->t[i].kind)) {
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
out:
	return rc;
}

/*
 * Classify every tensor of s, resolve fused LoRA wrappers to parameters and
 * ranks, settle E and build the expert records. e_given is E when the
 * caller knows it (an option, a manifest), else 0; given_from names it.
 */
int shard_analyze(struct src *s, uint32_t e_given, const char *given_from,
		  struct ms_err *err)
{
	cJSON *acfg = NULL, *mcfg = NULL;
	struct census c = { .max_expert = -1 };
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
	if ((rc = config_experts(s, mcfg, &c.e_cfg, err)) != MS_OK)
		goto out;
	c.w = ms_calloc(s->n ? s->n : 1, sizeof(*c.w));
	c.wp = ms_calloc(s->n ? s->n : 1, sizeof(*c.wp));
	if (!c.w || !c.wp) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < s->n; i++)
		if ((rc = classify_tensor(s, acfg, i, &c, err)) != MS_OK)
			goto out;
	if ((rc = resolve_wrappers(s, acfg, &c, err)) != MS_OK ||
	    (rc = settle_experts(s, e_given, given_from, &c, err)) != MS_OK ||
	    (rc = build_records(s, err)) != MS_OK)
		goto out;
out:
	for (size_t j = 0; c.w && j < c.nw; j++)
		ms_free(c.w[j].module);
	ms_free(c.w);
	ms_free(c.wp);
	cJSON_Delete(acfg);
	cJSON_Delete(mcfg);
	return rc;
}

void shard_packing_str(unsigned packing, char *buf, size_t n)
{
	static const char *const names[] = { "per-expert", "fused", "grouped" };
	size_t k = 0;

	buf[0] = '\0';
	for (unsigned i = 0; i < 3; i++)
		if (packing & (1u << i))
			k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s%s", k ? "+" : "",
					      names[i]);
}
