/*
 * footprint.c: the per-GPU memory planner (see footprint.h for the plan
 * format and the rules of the count).
 *
 * Tensors are recorded as they are added, each with the bytes it costs in
 * every layout its entry's representation asks for (a "contribution").
 * Placement waits for ms_fp_calc_finish, because a per-expert tensor's rank
 * depends on the expert count of its layer, which only the whole plan shows.
 * Then three passes: every contribution onto its row's per-rank counts;
 * the resident contributions sorted by weight to find the weights held in
 * more than one (entry, layout) copy; the columnwise contributions that are
 * (or could be) built per layer, sorted by layer, for the largest layer.
 *
 * Per-rank counts are a shared part (replicated tensors, and fused expert
 * tensors split evenly) plus a sparse per-rank part (per-expert tensors), so
 * the per-layer pass costs what the tensors cost, not layers x ep_size.
 */
#include "footprint.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fsutil.h"
#include "inventory.h"
#include "names.h"

/* Every contribution together stays below this, so any sum of them (and a
 * resident sum plus a transient one) fits in 64 bits. */
#define MAX_TOTAL_BYTES (UINT64_C(1) << 62)
#define MAX_TENSORS (UINT32_C(1) << 26)
#define MAX_DUP_GROUPS 1024u
#define NROWS(plan) ((plan)->nentries * MS_FP_LAYOUT_COUNT)

static const char *const repr_names[MS_FP_REPR_COUNT] = {
	"as-is", "bf16", "nvfp4-rowwise", "nvfp4-columnwise", "nvfp4-both",
	"nvfp4-ondemand",
};

static const char *const layout_names[MS_FP_LAYOUT_COUNT] = {
	"as-is", "bf16", "nvfp4-rowwise", "nvfp4-columnwise",
	"nvfp4-columnwise-transient",
};

const char *ms_fp_repr_name(enum ms_fp_repr r)
{
	return (unsigned)r < MS_FP_REPR_COUNT ? repr_names[r] : NULL;
}

int ms_fp_repr_parse(const char *s, enum ms_fp_repr *out)
{
	for (unsigned i = 0; s && i < MS_FP_REPR_COUNT; i++) {
		if (!strcmp(s, repr_names[i])) {
			*out = (enum ms_fp_repr)i;
			return MS_OK;
		}
	}
	return MS_EINVAL;
}

const char *ms_fp_placement_name(enum ms_fp_placement p)
{
	switch (p) {
	case MS_FP_PLACEMENT_CONTIGUOUS: return "contiguous";
	case MS_FP_PLACEMENT_ROUND_ROBIN: return "round-robin";
	}
	return NULL;
}

int ms_fp_placement_parse(const char *s, enum ms_fp_placement *out)
{
	if (s && !strcmp(s, "contiguous")) {
		*out = MS_FP_PLACEMENT_CONTIGUOUS;
		return MS_OK;
	}
	if (s && !strcmp(s, "round-robin")) {
		*out = MS_FP_PLACEMENT_ROUND_ROBIN;
		return MS_OK;
	}
	return MS_EINVAL;
}

const char *ms_fp_layout_name(enum ms_fp_layout l)
{
	return (unsigned)l < MS_FP_LAYOUT_COUNT ? layout_names[l] : NULL;
}

/* ---- the plan ------------------------------------------------------------------ */

static int plan_errf(struct ms_err *err, const char *label, const char *key,
		     const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* "plan '<label>': key '<key>': <message>", always MS_EINVAL. */
static int plan_errf(struct ms_err *err, const char *label, const char *key,
		     const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (key)
		return ms_err_set(err, MS_EINVAL, "plan '%s': key '%s': %s", label,
				  key, msg);
	return ms_err_set(err, MS_EINVAL, "plan '%s': %s", label, msg);
}

/* cJSON keeps a key given twice and answers lookups with the first: a plan
 * whose second "repr" silently loses would plan something else than it says. */
static int check_dup_keys(const cJSON *obj, const char *label,
			  const char *prefix, struct ms_err *err)
{
	const cJSON *it;
	char **keys;
	size_t n = 0, k = 0;
	int rc = MS_OK;

	cJSON_ArrayForEach(it, obj)
		n++;
	keys = ms_malloc((n ? n : 1) * sizeof(*keys));
	if (!keys)
		return ms_err_nomem(err);
	cJSON_ArrayForEach(it, obj)
		keys[k++] = it->string ? it->string : "";
	qsort(keys, n, sizeof(*keys), ms_cmp_str);
	for (size_t i = 1; i < n; i++) {
		if (!strcmp(keys[i - 1], keys[i])) {
			char full[600];

			snprintf(full, sizeof(full), "%s%s", prefix, keys[i]);
			rc = plan_errf(err, label, full, "given twice");
			goto out;
		}
	}
out:
	ms_free(keys);
	return rc;
}

/* A string of 1..max bytes without control characters. */
static int get_string(const cJSON *obj, const char *name, const char *key,
		      const char *label, size_t max, int required,
		      const char **out, struct ms_err *err)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
	size_t len;

	*out = NULL;
	if (!it) {
		if (required)
			return plan_errf(err, label, key, "missing");
		return MS_OK;
	}
	if (!cJSON_IsString(it) || !it->valuestring)
		return plan_errf(err, label, key, "expected a string");
	len = strlen(it->valuestring);
	if (len == 0)
		return plan_errf(err, label, key, "empty");
	if (len > max)
		return plan_errf(err, label, key, "longer than %zu bytes", max);
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)it->valuestring[i];

		if (ch < 0x20 || ch == 0x7f)
			return plan_errf(err, label, key,
					 "control character at byte %zu", i);
	}
	*out = it->valuestring;
	return MS_OK;
}

/* An integral JSON number in [min, max]; *present says whether it was given. */
static int get_uint(const cJSON *obj, const char *name, const char *label,
		    uint64_t min, uint64_t max, int required, uint64_t *out,
		    int *present, struct ms_err *err)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
	double d;

	*present = 0;
	if (!it) {
		if (required)
			return plan_errf(err, label, name, "missing");
		return MS_OK;
	}
	if (!cJSON_IsNumber(it))
		return plan_errf(err, label, name, "expected an integer");
	d = it->valuedouble;
	if (!isfinite(d) || d != floor(d) || d < (double)min || d > (double)max)
		return plan_errf(err, label, name,
				 "must be an integer from %llu to %llu",
				 (unsigned long long)min, (unsigned long long)max);
	*out = (uint64_t)d;
	*present = 1;
	return MS_OK;
}

static int is_role_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
	       (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
}

static int valid_digest_ref(const char *s)
{
	if (strncmp(s, "sha256:", 7) || strlen(s) != 71)
		return 0;
	for (const char *p = s + 7; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return 0;
	return 1;
}

void ms_fp_plan_free(struct ms_fp_plan *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->nentries; i++) {
		ms_free(p->entries[i].role);
		ms_free(p->entries[i].state);
		ms_free(p->entries[i].path);
		ms_free(p->entries[i].resolved);
	}
	ms_free(p->entries);
	for (size_t i = 0; i < p->train.ntargets; i++)
		ms_free(p->train.targets[i]);
	ms_free(p->train.targets);
	ms_free(p->train.optimizer);
	ms_free(p->label);
	ms_free(p->name);
	ms_free(p->outputs);
	ms_free(p);
}

/* A JSON number that is an integer in [min, max] at key (a dotted path in
 * messages); absent is fine unless required. */
static int train_uint(const cJSON *obj, const char *name, const char *key,
		      const char *label, uint64_t min, uint64_t max, int required,
		      uint64_t *out, struct ms_err *err)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
	double d;

	if (!it)
		return required ? plan_errf(err, label, key, "missing") : MS_OK;
	d = it->valuedouble;
	if (!cJSON_IsNumber(it) || !isfinite(d) || d != floor(d) || d < (double)min ||
	    d > (double)max)
		return plan_errf(err, label, key, "must be an integer from %llu to %llu",
				 (unsigned long long)min, (unsigned long long)max);
	*out = (uint64_t)d;
	return MS_OK;
}

/* The "train" section: what the count needs of it, type-checked; the rest
 * (lr, steps, data, ...) is the trainer's. */
static int parse_train(struct ms_fp_plan *p, const cJSON *t, struct ms_err *err)
{
	const char *label = p->label;
	const cJSON *lora, *opt, *targets, *it;
	uint64_t v = 0;
	int rc;

	if (!cJSON_IsObject(t))
		return plan_errf(err, label, "train", "expected an object");
	if ((rc = check_dup_keys(t, label, "train.", err)) != MS_OK)
		return rc;
	p->train.present = 1;
	lora = cJSON_GetObjectItemCaseSensitive(t, "lora");
	if (lora) {
		if (!cJSON_IsObject(lora))
			return plan_errf(err, label, "train.lora", "expected an object");
		if ((rc = check_dup_keys(lora, label, "train.lora.", err)) != MS_OK ||
		    (rc = train_uint(lora, "r", "train.lora.r", label, 1, MS_FP_MAX_LORA_R, 1, &v,
				     err)) != MS_OK)
			return rc;
		p->train.lora_r = (uint32_t)v;
		for (int k = 0; k < 2; k++) {
			const char *n = k ? "dropout" : "alpha";

			it = cJSON_GetObjectItemCaseSensitive(lora, n);
			if (it && (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)))
				return plan_errf(err, label, k ? "train.lora.dropout" : "train.lora.alpha",
						 "expected a number");
		}
		targets = cJSON_GetObjectItemCaseSensitive(lora, "targets");
		if (!targets)
			return plan_errf(err, label, "train.lora.targets", "missing");
		if (!cJSON_IsArray(targets) || cJSON_GetArraySize(targets) < 1 ||
		    cJSON_GetArraySize(targets) > (int)MS_FP_MAX_TARGETS)
			return plan_errf(err, label, "train.lora.targets",
					 "expected an array of 1 to %u module names", MS_FP_MAX_TARGETS);
		p->train.targets = ms_calloc((size_t)cJSON_GetArraySize(targets),
					     sizeof(*p->train.targets));
		if (!p->train.targets)
			return ms_err_nomem(err);
		cJSON_ArrayForEach(it, targets) {
			const char *s = cJSON_IsString(it) ? it->valuestring : NULL;

			if (!s || !*s || strlen(s) >= MS_NAME_PROJ_MAX)
				return plan_errf(err, label, "train.lora.targets",
						 "every target is a module name of 1 to %d bytes (\"experts\", \"q_proj\", ...)",
						 MS_NAME_PROJ_MAX - 1);
			if (!(p->train.targets[p->train.ntargets] = ms_strdup(s)))
				return ms_err_nomem(err);
			p->train.ntargets++;
		}
	}
	opt = cJSON_GetObjectItemCaseSensitive(t, "optimizer");
	if (opt) {
		if (!cJSON_IsObject(opt))
			return plan_errf(err, label, "train.optimizer", "expected an object");
		if ((rc = check_dup_keys(opt, label, "train.optimizer.", err)) != MS_OK)
			return rc;
		/* any name parses (launch reads this plan too, and a trainer
		 * may know more optimizers); the count refuses what it cannot
		 * count */
		it = cJSON_GetObjectItemCaseSensitive(opt, "name");
		if (it && (!cJSON_IsString(it) || !*it->valuestring))
			return plan_errf(err, label, "train.optimizer.name", "expected a string");
		if (it && !(p->train.optimizer = ms_strdup(it->valuestring)))
			return ms_err_nomem(err);
	}
	if ((rc = train_uint(t, "batch", "train.batch", label, 1, UINT32_MAX, 0, &p->train.batch,
			     err)) != MS_OK ||
	    (rc = train_uint(t, "seq_len", "train.seq_len", label, 1, UINT32_MAX, 0,
			     &p->train.seq_len, err)) != MS_OK)
		return rc;
	return MS_OK;
}

static int dup_or_null(const char *s, char **out, struct ms_err *err)
{
	*out = NULL;
	if (s && !(*out = ms_strdup(s)))
		return ms_err_nomem(err);
	return MS_OK;
}

static int parse_entry(struct ms_fp_plan *p, const cJSON *e, size_t i,
		       struct ms_err *err)
{
	struct ms_fp_entry *en = &p->entries[i];
	const char *role, *state, *path, *repr, *experts;
	char prefix[48], key[64];
	int rc;

	snprintf(prefix, sizeof(prefix), "states[%zu].", i);
	snprintf(key, sizeof(key), "states[%zu]", i);
	if (!cJSON_IsObject(e))
		return plan_errf(err, p->label, key, "expected an object");
	if ((rc = check_dup_keys(e, p->label, prefix, err)) != MS_OK)
		return rc;

	snprintf(key, sizeof(key), "states[%zu].role", i);
	if ((rc = get_string(e, "role", key, p->label, MS_FP_MAX_ROLE, 1, &role,
			     err)) != MS_OK)
		return rc;
	for (const char *c = role; *c; c++)
		if (!is_role_char(*c))
			return plan_errf(err, p->label, key,
					 "role '%s' has a character other than letters, digits, '_', '-' and '.'",
					 role);
	for (size_t k = 0; k < i; k++)
		if (!strcmp(p->entries[k].role, role))
			return plan_errf(err, p->label, key,
					 "duplicate role '%s' (also states[%zu])",
					 role, k);

	snprintf(key, sizeof(key), "states[%zu].state", i);
	if ((rc = get_string(e, "state", key, p->label, MS_FP_MAX_REF, 0, &state,
			     err)) != MS_OK)
		return rc;
	if (state && !strncmp(state, "sha256:", 7) && !valid_digest_ref(state))
		return plan_errf(err, p->label, key,
				 "'%s' is not a state digest (sha256: and 64 lowercase hex digits)",
				 state);
	snprintf(key, sizeof(key), "states[%zu].path", i);
	if ((rc = get_string(e, "path", key, p->label, MS_FP_MAX_REF, 0, &path,
			     err)) != MS_OK)
		return rc;
	snprintf(key, sizeof(key), "states[%zu]", i);
	if (state && path)
		return plan_errf(err, p->label, key,
				 "both 'state' and 'path' given; name one");
	if (!state && !path)
		return plan_errf(err, p->label, key, "needs 'state' or 'path'");

	snprintf(key, sizeof(key), "states[%zu].repr", i);
	if ((rc = get_string(e, "repr", key, p->label, 64, 0, &repr, err)) != MS_OK)
		return rc;
	en->repr = MS_FP_REPR_AS_IS;
	if (repr && ms_fp_repr_parse(repr, &en->repr) != MS_OK)
		return plan_errf(err, p->label, key,
				 "unknown representation '%s' (expected as-is, bf16, nvfp4-rowwise, nvfp4-columnwise, nvfp4-both or nvfp4-ondemand)",
				 repr);

	snprintf(key, sizeof(key), "states[%zu].experts", i);
	if ((rc = get_string(e, "experts", key, p->label, 64, 0, &experts, err)) != MS_OK)
		return rc;
	if (experts && strcmp(experts, "per-expert") && strcmp(experts, "fused"))
		return plan_errf(err, p->label, key,
				 "unknown expert layout '%s' (expected per-expert or fused)", experts);
	en->experts_fused = experts && !strcmp(experts, "fused");

	if ((rc = dup_or_null(role, &en->role, err)) != MS_OK ||
	    (rc = dup_or_null(state, &en->state, err)) != MS_OK ||
	    (rc = dup_or_null(path, &en->path, err)) != MS_OK ||
	    (rc = dup_or_null(path, &en->resolved, err)) != MS_OK)
		return rc;
	return MS_OK;
}

int ms_fp_plan_parse(const char *json, size_t len, const char *label,
		     struct ms_fp_plan **out, struct ms_err *err)
{
	struct ms_fp_plan *p = NULL;
	cJSON *root = NULL;
	const cJSON *states, *it;
	const char *s, *end = NULL;
	char *text = NULL;
	uint64_t v;
	int rc = MS_OK, present, nomem;
	size_t n;

	*out = NULL;
	if (!label)
		label = "plan";
	p = ms_calloc(1, sizeof(*p));
	if (!p || !(p->label = ms_strdup(label))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (!json || len > MS_FP_MAX_PLAN) {
		rc = plan_errf(err, label, NULL, "larger than %u bytes",
			       MS_FP_MAX_PLAN);
		goto out;
	}
	if (memchr(json, '\0', len)) {
		rc = plan_errf(err, label, NULL, "contains a NUL byte at offset %zu",
			       (size_t)((const char *)memchr(json, '\0', len) - json));
		goto out;
	}
	text = ms_malloc(len + 1);
	if (!text) {
		rc = ms_err_nomem(err);
		goto out;
	}
	memcpy(text, json, len);
	text[len] = '\0';
	/* len + 1 counts the NUL, so cJSON checks nothing follows the value */
	root = ms_json_parse_opts(text, len + 1, &end, 1, &nomem);
	if (nomem) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (!root) {
		rc = plan_errf(err, label, NULL, "not valid JSON (at byte %zu)",
			       end && end >= text ? (size_t)(end - text) : (size_t)0);
		goto out;
	}
	if (!cJSON_IsObject(root)) {
		rc = plan_errf(err, label, NULL, "not a JSON object");
		goto out;
	}
	if ((rc = check_dup_keys(root, label, "", err)) != MS_OK)
		goto out;

	if ((rc = get_uint(root, "ep_size", label, 1, MS_FP_MAX_EP, 1, &v,
			   &present, err)) != MS_OK)
		goto out;
	p->ep_size = (uint32_t)v;
	if ((rc = get_uint(root, "num_experts", label, 1, MS_FP_MAX_EXPERTS, 0,
			   &v, &present, err)) != MS_OK)
		goto out;
	p->num_experts = present ? (uint32_t)v : 0;

	p->placement = MS_FP_PLACEMENT_CONTIGUOUS;
	if ((rc = get_string(root, "placement", "placement", label, 64, 0, &s,
			     err)) != MS_OK)
		goto out;
	if (s && ms_fp_placement_parse(s, &p->placement) != MS_OK) {
		rc = plan_errf(err, label, "placement",
			       "unknown placement '%s' (expected contiguous or round-robin)",
			       s);
		goto out;
	}

	it = cJSON_GetObjectItemCaseSensitive(root, "budget_gib");
	if (it) {
		double d = it->valuedouble;

		if (!cJSON_IsNumber(it)) {
			rc = plan_errf(err, label, "budget_gib", "expected a number");
			goto out;
		}
		if (!isfinite(d) || !(d > 0) || d > MS_FP_MAX_BUDGET_GIB) {
			rc = plan_errf(err, label, "budget_gib",
				       "must be a number above 0 and at most %.0f",
				       MS_FP_MAX_BUDGET_GIB);
			goto out;
		}
		p->has_budget = 1;
		p->budget_gib = d;
		/* exact for every budget a GiB count can state in a double;
		 * the cap keeps the product far below 2^64 */
		p->budget_bytes = (uint64_t)floor(d * 1073741824.0);
	}

	if ((rc = get_string(root, "name", "name", label, MS_FP_MAX_REF, 0, &s,
			     err)) != MS_OK ||
	    (rc = dup_or_null(s, &p->name, err)) != MS_OK)
		goto out;
	if ((rc = get_string(root, "outputs", "outputs", label, MS_FP_MAX_REF, 0,
			     &s, err)) != MS_OK ||
	    (rc = dup_or_null(s, &p->outputs, err)) != MS_OK)
		goto out;

	it = cJSON_GetObjectItemCaseSensitive(root, "train");
	if (it && (rc = parse_train(p, it, err)) != MS_OK)
		goto out;

	states = cJSON_GetObjectItemCaseSensitive(root, "states");
	if (!states) {
		rc = plan_errf(err, label, "states", "missing");
		goto out;
	}
	if (!cJSON_IsArray(states)) {
		rc = plan_errf(err, label, "states", "expected an array");
		goto out;
	}
	n = (size_t)cJSON_GetArraySize(states);
	if (n == 0) {
		rc = plan_errf(err, label, "states", "empty: a plan names at least one state");
		goto out;
	}
	if (n > MS_FP_MAX_ENTRIES) {
		rc = plan_errf(err, label, "states", "more than %u entries",
			       MS_FP_MAX_ENTRIES);
		goto out;
	}
	p->entries = ms_calloc(n, sizeof(*p->entries));
	if (!p->entries) {
		rc = ms_err_nomem(err);
		goto out;
	}
	cJSON_ArrayForEach(it, states) {
		/* count first: parse_entry may fail half-way and free needs it */
		size_t i = p->nentries++;

		if ((rc = parse_entry(p, it, i, err)) != MS_OK)
			goto out;
	}
	*out = p;
	p = NULL;
out:
	cJSON_Delete(root);
	ms_free(text);
	ms_fp_plan_free(p);
	return rc;
}

int ms_fp_plan_load(const char *path, struct ms_fp_plan **out,
		    struct ms_err *err)
{
	struct ms_fp_plan *p = NULL;
	char *text = NULL, *dir = NULL;
	const char *base;
	size_t len;
	int rc;

	*out = NULL;
	if ((rc = ms_file_read(path, MS_FP_MAX_PLAN, &text, &len, err)) != MS_OK) {
		ms_err_prefix(err, "plan '%s'", path);
		if (rc == MS_ENOTFOUND)
			rc = MS_EIO;
		goto out;
	}
	if ((rc = ms_fp_plan_parse(text, len, path, &p, err)) != MS_OK)
		goto out;
	base = ms_path_base(path);
	if (base > path) {
		dir = ms_strndup(path, (size_t)(base - path));
		if (!dir) {
			rc = ms_err_nomem(err);
			goto out;
		}
	}
	for (size_t i = 0; dir && i < p->nentries; i++) {
		struct ms_fp_entry *e = &p->entries[i];
		char *r;

		if (!e->path || e->path[0] == '/')
			continue;
		r = ms_path_join(dir, e->path);
		if (!r) {
			rc = ms_err_nomem(err);
			goto out;
		}
		ms_free(e->resolved);
		e->resolved = r;
	}
	*out = p;
	p = NULL;
out:
	ms_free(dir);
	ms_free(text);
	ms_fp_plan_free(p);
	return rc;
}

/* ---- sizes --------------------------------------------------------------------- */

static int float_source(enum ms_dtype dt)
{
	return dt == MS_DTYPE_BF16 || dt == MS_DTYPE_F16 || dt == MS_DTYPE_F32;
}

int ms_fp_quantizable(const char *name, enum ms_dtype dtype, uint32_t ndim,
		      const uint64_t *shape)
{
	struct ms_name_info info;

	if (!name || ndim > MS_ST_MAX_RANK || ms_name_parse(name, &info) != MS_OK)
		return 0;
	return ms_name_quantizable(name, &info, dtype, ndim, shape);
}

int ms_fp_nvfp4_bytes(uint64_t rows, uint64_t cols, int columnwise,
		      uint64_t *out)
{
	uint64_t r = columnwise ? cols : rows, c = columnwise ? rows : cols;
	uint64_t blocks, packed, total;

	/* Cp = roundup(c, 16): packed r*Cp/2 = r*blocks*8, scales r*blocks */
	blocks = c / 16 + (c % 16 != 0);
	if (ms_mul_u64(r, blocks, &blocks) ||
	    ms_mul_u64(blocks, 8, &packed) ||
	    ms_add_u64(packed, blocks, &total) ||
	    ms_add_u64(total, 4, &total))
		return MS_EINVAL;
	*out = total;
	return MS_OK;
}

/* ---- the accumulator --------------------------------------------------------- */

enum place {
	PLACE_REPLICATED,
	PLACE_EVEN,       /* fused expert tensor: an equal share on every rank */
	PLACE_OWNED,      /* per-expert tensor: all on one rank */
};

struct rec {
	char *name;
	uint32_t entry;
	uint32_t key_len;       /* name[0, key_len) names the weight */
	int32_t layer, expert;
	uint8_t part, role, lora, megatron_grouped;
	uint8_t lora_base;      /* a weight LoRA can train: quantizable, or a
				 * floating fused 3-D expert parameter */
	uint8_t place;
	uint32_t owner;
	uint32_t ndim;
	uint64_t shape[MS_ST_MAX_RANK];
};

struct contrib {
	uint32_t rec;
	uint32_t row;           /* entry * MS_FP_LAYOUT_COUNT + layout */
	uint8_t weight;         /* a quantizable weight */
	uint8_t companion;      /* layout follows its weight's (see companion()) */
	uint8_t cand;           /* resident columnwise with a resident rowwise twin */
	uint64_t bytes;
	uint64_t nelem;
};

static enum ms_fp_layout row_layout(uint32_t row)
{
	return (enum ms_fp_layout)(row % MS_FP_LAYOUT_COUNT);
}

struct ms_fp_calc {
	const struct ms_fp_plan *plan;
	struct rec *recs;
	size_t nrecs, caprecs;
	struct contrib *cons;
	size_t ncons, capcons;
	uint64_t *added;        /* tensors per entry */
	uint64_t total;         /* all contributions, bounded by MAX_TOTAL_BYTES */
};

int ms_fp_calc_new(const struct ms_fp_plan *plan, struct ms_fp_calc **out,
		   struct ms_err *err)
{
	struct ms_fp_calc *c;

	*out = NULL;
	if (!plan || plan->nentries == 0 || plan->ep_size == 0)
		return ms_err_set(err, MS_EINVAL, "footprint: empty plan");
	c = ms_calloc(1, sizeof(*c));
	if (!c || !(c->added = ms_calloc(plan->nentries, sizeof(*c->added)))) {
		ms_free(c);
		return ms_err_nomem(err);
	}
	c->plan = plan;
	*out = c;
	return MS_OK;
}

void ms_fp_calc_free(struct ms_fp_calc *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nrecs; i++)
		ms_free(c->recs[i].name);
	ms_free(c->recs);
	ms_free(c->cons);
	ms_free(c->added);
	ms_free(c);
}

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
	size_t n = *cap ? *cap : 256;
	void *q;

	if (need <= *cap)
		return MS_OK;
	while (n < need)
		n *= 2;
	q = ms_realloc(*p, n * size);
	if (!q)
		return MS_ENOMEM;
	*p = q;
	*cap = n;
	return MS_OK;
}

static int add_contrib(struct ms_fp_calc *c, uint32_t rec, uint32_t entry,
		       enum ms_fp_layout layout, int weight, int comp,
		       uint64_t bytes, uint64_t nelem)
{
	struct contrib *k;

	if (ms_add_u64(c->total, bytes, &c->total) || c->total > MAX_TOTAL_BYTES)
		return MS_EINVAL;
	if (grow((void **)&c->cons, &c->capcons, c->ncons + 1, sizeof(*c->cons)))
		return MS_ENOMEM;
	k = &c->cons[c->ncons++];
	k->rec = rec;
	k->row = entry * MS_FP_LAYOUT_COUNT + (uint32_t)layout;
	k->weight = (uint8_t)weight;
	k->companion = (uint8_t)comp;
	k->cand = 0;
	k->bytes = bytes;
	k->nelem = nelem;
	return MS_OK;
}

/* The layout of a tensor counted as it is stored. */
static enum ms_fp_layout stored_layout(const struct ms_name_info *info,
				       enum ms_dtype dt)
{
	if (info->lora_nesting >= 0)
		return MS_FP_LAYOUT_AS_IS;
	if (info->colwise)
		return MS_FP_LAYOUT_NVFP4_COLUMNWISE;
	switch (info->role) {
	case MS_NAME_ROLE_WEIGHT:
		if (info->packed || dt == MS_DTYPE_U8 || dt == MS_DTYPE_F4)
			return MS_FP_LAYOUT_NVFP4_ROWWISE;
		return MS_FP_LAYOUT_AS_IS;
	default:
		return MS_FP_LAYOUT_AS_IS;
	}
}

/* Is this role one of a weight's companions (identified by its module)? */
static int weight_family(const struct ms_name_info *info)
{
	if (info->lora_nesting >= 0)
		return 0;
	switch (info->role) {
	case MS_NAME_ROLE_WEIGHT:
	case MS_NAME_ROLE_SCALE:
	case MS_NAME_ROLE_SCALE2:
	case MS_NAME_ROLE_GLOBAL_SCALE:
	case MS_NAME_ROLE_INPUT_SCALE:
	case MS_NAME_ROLE_COLWISE:
	case MS_NAME_ROLE_COLWISE_SCALE:
		return 1;
	default:
		return 0;
	}
}

/* NVFP4 bytes of a quantizable weight [R, C] in one layout. A fused 3-D
 * expert tensor [E, R, C] is E matrices [R, C] with one tensor scale each
 * as msconvert --experts fused writes it, or as --experts per-expert does,
 * a gate_up slice as two modules [R/2, C] (gate, up) with one each. */
static int matrices_bytes(const struct ms_fp_tensor *t, int columnwise,
			  int experts_fused, uint64_t *out)
{
	uint64_t one;
	int kind = ms_name_fused_experts(t->name, t->dtype, t->ndim, t->shape);

	if (!kind)
		return ms_fp_nvfp4_bytes(t->shape[0], t->shape[1], columnwise, out) ?
		       MS_EINVAL : MS_OK;
	if (kind == 1 && !experts_fused) {
		if (ms_fp_nvfp4_bytes(t->shape[1] / 2, t->shape[2], columnwise, &one) ||
		    ms_mul_u64(one, 2, &one))
			return MS_EINVAL;
	} else if (ms_fp_nvfp4_bytes(t->shape[1], t->shape[2], columnwise, &one)) {
		return MS_EINVAL;
	}
	return ms_mul_u64(one, t->shape[0], out) ? MS_EINVAL : MS_OK;
}

/* A rowwise quantized weight's companion (scale, tensor scale, input
 * scale): it belongs to whatever layout its weight is in, which
 * ms_fp_calc_finish settles once all tensors are known (an FP8 weight's
 * scales are as-is, an NVFP4 weight's are rowwise). */
static int companion(const struct ms_name_info *info)
{
	if (info->lora_nesting >= 0 || info->colwise)
		return 0;
	return info->role == MS_NAME_ROLE_SCALE ||
	       info->role == MS_NAME_ROLE_SCALE2 ||
	       info->role == MS_NAME_ROLE_GLOBAL_SCALE ||
	       info->role == MS_NAME_ROLE_INPUT_SCALE;
}

/* Megatron's grouped "experts.weight1" / "experts.bias2": 2-D with the
 * experts along a matrix dimension, so dim 0 is not the expert count. */
static int megatron_grouped(const char *name)
{
	const char *last = strrchr(name, '.'), *d;

	last = last ? last + 1 : name;
	if (!strncmp(last, "weight", 6))
		d = last + 6;
	else if (!strncmp(last, "bias", 4))
		d = last + 4;
	else
		return 0;
	if (!*d)
		return 0;
	for (; *d; d++)
		if (*d < '0' || *d > '9')
			return 0;
	return 1;
}

static int add_one(struct ms_fp_calc *c, size_t entry, enum ms_fp_repr repr,
		   const struct ms_fp_tensor *t, struct ms_err *err)
{
	const char *role = c->plan->entries[entry].role;
	int fused = c->plan->entries[entry].experts_fused;
	struct ms_name_info info;
	struct rec *r;
	uint64_t nelem = 1, stored, bytes;
	uint32_t idx;
	size_t len;
	int q, rc;

	if (!t->name || !*t->name)
		return ms_err_set(err, MS_EINVAL, "entry '%s': a tensor has no name",
				  role);
	len = strnlen(t->name, MS_ST_MAX_NAME + 1);
	if (len > MS_ST_MAX_NAME)
		return ms_err_set(err, MS_EINVAL,
				  "entry '%s': a tensor name is longer than %d bytes",
				  role, MS_ST_MAX_NAME);
	if (t->ndim > MS_ST_MAX_RANK || (unsigned)t->dtype >= MS_DTYPE_COUNT)
		return ms_err_set(err, MS_EINVAL,
				  "entry '%s': tensor '%s': bad dtype or rank", role,
				  t->name);
	for (uint32_t d = 0; d < t->ndim; d++)
		if (ms_mul_u64(nelem, t->shape[d], &nelem))
			return ms_err_set(err, MS_EINVAL,
					  "entry '%s': tensor '%s': element count overflows",
					  role, t->name);
	if ((rc = ms_dtype_nbytes(t->dtype, nelem, &stored)) != MS_OK)
		return ms_err_set(err, MS_EINVAL,
				  "entry '%s': tensor '%s': byte size overflows or is not whole bytes",
				  role, t->name);
	if (c->nrecs >= MAX_TENSORS)
		return ms_err_set(err, MS_EINVAL, "footprint: more than %u tensors",
				  MAX_TENSORS);
	if (ms_name_parse(t->name, &info) != MS_OK) {
		/* every name that fits parses; keep the fallback total anyway */
		memset(&info, 0, sizeof(info));
		info.layer = info.expert = info.lora_nesting = -1;
		info.module_len = (uint32_t)len;
	}
	if (grow((void **)&c->recs, &c->caprecs, c->nrecs + 1, sizeof(*c->recs)))
		return ms_err_nomem(err);
	idx = (uint32_t)c->nrecs;
	r = &c->recs[idx];
	memset(r, 0, sizeof(*r));
	if (!(r->name = ms_strdup(t->name)))
		return ms_err_nomem(err);
	c->nrecs++;
	r->entry = (uint32_t)entry;
	r->key_len = weight_family(&info) && info.module_len > 0 ?
		     info.module_len : (uint32_t)len;
	r->layer = info.layer;
	r->expert = info.expert;
	r->part = (uint8_t)info.part;
	r->role = (uint8_t)info.role;
	r->lora = info.lora_nesting >= 0;
	r->megatron_grouped = info.part == MS_NAME_PART_EXPERTS_FUSED &&
			      megatron_grouped(t->name);
	r->ndim = t->ndim;
	memcpy(r->shape, t->shape, sizeof(r->shape));
	r->lora_base = ms_name_quantizable(t->name, &info, t->dtype, t->ndim, NULL) ||
		       (info.part == MS_NAME_PART_EXPERTS_FUSED && info.role == MS_NAME_ROLE_WEIGHT &&
			t->ndim == 3 && float_source(t->dtype));

	q = repr != MS_FP_REPR_AS_IS &&
	    ms_name_quantizable(t->name, &info, t->dtype, t->ndim, t->shape);
	if (!q) {
		rc = add_contrib(c, idx, (uint32_t)entry,
				 stored_layout(&info, t->dtype),
				 ms_name_quantizable(t->name, &info, t->dtype, t->ndim, t->shape),
				 companion(&info), stored, nelem);
		goto out;
	}
	if (repr == MS_FP_REPR_BF16) {
		rc = ms_mul_u64(nelem, 2, &bytes) ? MS_EINVAL :
		     add_contrib(c, idx, (uint32_t)entry, MS_FP_LAYOUT_BF16, 1, 0,
				 bytes, nelem);
		goto out;
	}
	if (repr != MS_FP_REPR_NVFP4_COLUMNWISE) {
		if ((rc = matrices_bytes(t, 0, fused, &bytes)) != MS_OK ||
		    (rc = add_contrib(c, idx, (uint32_t)entry,
				      MS_FP_LAYOUT_NVFP4_ROWWISE, 1, 0, bytes,
				      nelem)) != MS_OK)
			goto out;
	}
	if (repr != MS_FP_REPR_NVFP4_ROWWISE) {
		if ((rc = matrices_bytes(t, 1, fused, &bytes)) != MS_OK)
			goto out;
		rc = add_contrib(c, idx, (uint32_t)entry,
				 repr == MS_FP_REPR_NVFP4_ONDEMAND ?
				 MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT :
				 MS_FP_LAYOUT_NVFP4_COLUMNWISE,
				 1, 0, bytes, nelem);
	}
out:
	if (rc == MS_ENOMEM)
		return ms_err_set(err, rc, "out of memory");
	if (rc != MS_OK)
		return ms_err_set(err, MS_EINVAL,
				  "entry '%s': tensor '%s': byte count overflows (the plan totals more than 2^62 bytes)",
				  role, t->name);
	return MS_OK;
}

int ms_fp_calc_add_tensors(struct ms_fp_calc *c, size_t entry,
			   const struct ms_fp_tensor *t, size_t n,
			   struct ms_err *err)
{
	size_t nrecs, ncons;
	uint64_t total;
	int rc = MS_OK;

	if (!c || entry >= c->plan->nentries || (n && !t))
		return ms_err_set(err, MS_EINVAL, "footprint: no plan entry %zu",
				  entry);
	nrecs = c->nrecs;
	ncons = c->ncons;
	total = c->total;
	for (size_t i = 0; i < n; i++)
		if ((rc = add_one(c, entry, c->plan->entries[entry].repr, &t[i],
				  err)) != MS_OK)
			break;
	if (rc != MS_OK) {
		ms_err_prefix(err, "plan '%s'", c->plan->label);
		/* leave the calculator as it was before the call */
		while (c->nrecs > nrecs)
			ms_free(c->recs[--c->nrecs].name);
		c->ncons = ncons;
		c->total = total;
		return rc;
	}
	c->added[entry] += n;
	return MS_OK;
}

int ms_fp_calc_add_ckpt(struct ms_fp_calc *c, size_t entry,
			const struct ms_ckpt *ck, struct ms_err *err)
{
	struct ms_fp_tensor *list;
	int rc;

	if (!ck)
		return ms_err_set(err, MS_EINVAL, "footprint: no checkpoint");
	list = ms_malloc((ck->ntensors ? ck->ntensors : 1) * sizeof(*list));
	if (!list)
		return ms_err_nomem(err);
	for (size_t i = 0; i < ck->ntensors; i++) {
		const struct ms_tensor *t = ck->tensors[i];

		list[i].name = t->name;
		list[i].dtype = t->dtype;
		list[i].ndim = t->ndim;
		memcpy(list[i].shape, t->shape, sizeof(list[i].shape));
	}
	rc = ms_fp_calc_add_tensors(c, entry, list, ck->ntensors, err);
	ms_free(list);
	return rc;
}

int ms_fp_calc_add_state(struct ms_fp_calc *c, size_t entry, struct ms_inv *inv,
			 const char *ref, struct ms_err *err)
{
	struct ms_inv_files files = {0};
	struct ms_fp_tensor *list = NULL;
	char digest[MS_STATE_DIGEST_LEN];
	size_t n = 0, k = 0;
	int rc;

	if ((rc = ms_inv_resolve(inv, ref, digest, err)) != MS_OK)
		return rc;
	if ((rc = ms_inv_state_files(inv, digest, 1, 1, &files, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < files.n; i++)
		n += files.files[i].ntensors;
	if (!(list = ms_calloc(n ? n : 1, sizeof(*list)))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < files.n; i++) {
		for (size_t t = 0; t < files.files[i].ntensors; t++) {
			const struct ms_vtensor *te = &files.files[i].tensors[t];

			list[k].name = te->name;
			list[k].dtype = te->dtype;
			list[k].ndim = te->ndim;
			memcpy(list[k].shape, te->shape, sizeof(list[k].shape));
			k++;
		}
	}
	rc = ms_fp_calc_add_tensors(c, entry, list, n, err);
out:
	ms_free(list);
	ms_inv_files_release(&files);
	return rc;
}

int ms_fp_calc_add_path(struct ms_fp_calc *c, size_t entry,
			struct ms_err *err)
{
	const struct ms_fp_entry *e;
	struct ms_ckpt *ck = NULL;
	int rc;

	if (!c || entry >= c->plan->nentries)
		return ms_err_set(err, MS_EINVAL, "footprint: no plan entry %zu",
				  entry);
	e = &c->plan->entries[entry];
	if (!e->resolved)
		return ms_err_set(err, MS_EINVAL,
				  "plan '%s': entry '%s' names a state, not a path",
				  c->plan->label, e->role);
	if ((rc = ms_ckpt_open(e->resolved, &ck, err)) != MS_OK) {
		ms_err_prefix(err, "plan '%s': entry '%s'", c->plan->label, e->role);
		return rc;
	}
	rc = ms_fp_calc_add_ckpt(c, entry, ck, err);
	ms_ckpt_close(ck);
	return rc;
}

/* ---- per-rank counts ----------------------------------------------------------- */

/* Bytes on rank r: rep + even + (owned ? owned[r] : 0). */
struct acc {
	uint64_t rep, even;
	uint64_t *owned;        /* ep entries, allocated on first use */
	uint64_t owned_max;
};

static int acc_add(struct acc *a, uint32_t ep, const struct rec *r,
		   uint64_t bytes)
{
	switch (r->place) {
	case PLACE_REPLICATED:
		a->rep += bytes;
		break;
	case PLACE_EVEN:
		/* E % ep == 0 makes this exact for every whole-expert tensor;
		 * round up rather than lose bytes on an odd packing */
		a->even += bytes / ep + (bytes % ep != 0);
		break;
	case PLACE_OWNED:
		if (!a->owned && !(a->owned = ms_calloc(ep, sizeof(*a->owned))))
			return MS_ENOMEM;
		a->owned[r->owner] += bytes;
		if (a->owned[r->owner] > a->owned_max)
			a->owned_max = a->owned[r->owner];
		break;
	}
	return MS_OK;
}

static uint64_t acc_at(const struct acc *a, uint32_t r)
{
	return a->rep + a->even + (a->owned ? a->owned[r] : 0);
}

static uint64_t acc_max(const struct acc *a)
{
	return a->rep + a->even + a->owned_max;
}

static void acc_release(struct acc *a)
{
	ms_free(a->owned);
	memset(a, 0, sizeof(*a));
}

/* A per-rank array whose non-zero entries are listed, so that clearing it
 * and visiting it cost what was added, not ep. */
struct sparse {
	uint64_t base;
	uint64_t *v;
	uint32_t *touched;
	uint32_t ntouched;
};

static int sparse_init(struct sparse *s, uint32_t ep)
{
	memset(s, 0, sizeof(*s));
	s->v = ms_calloc(ep, sizeof(*s->v));
	s->touched = ms_calloc(ep, sizeof(*s->touched));
	return s->v && s->touched ? MS_OK : MS_ENOMEM;
}

static void sparse_add(struct sparse *s, uint32_t ep, const struct rec *r,
		       uint64_t bytes)
{
	switch (r->place) {
	case PLACE_REPLICATED:
		s->base += bytes;
		break;
	case PLACE_EVEN:
		s->base += bytes / ep + (bytes % ep != 0);
		break;
	case PLACE_OWNED:
		if (s->v[r->owner] == 0)
			s->touched[s->ntouched++] = r->owner;
		/* a zero-byte tensor leaves it untouched, which is the same */
		s->v[r->owner] += bytes;
		if (s->v[r->owner] == 0)
			s->ntouched--;
		break;
	}
}

static uint64_t sparse_max_owned(const struct sparse *s)
{
	uint64_t m = 0;

	for (uint32_t i = 0; i < s->ntouched; i++)
		if (s->v[s->touched[i]] > m)
			m = s->v[s->touched[i]];
	return m;
}

static void sparse_clear(struct sparse *s)
{
	for (uint32_t i = 0; i < s->ntouched; i++)
		s->v[s->touched[i]] = 0;
	s->ntouched = 0;
	s->base = 0;
}

static void sparse_release(struct sparse *s)
{
	ms_free(s->v);
	ms_free(s->touched);
}

/* The running maximum over layers of a per-rank quantity: rank r's value is
 * max(floor, best[r]); a layer raises the floor by its shared part and the
 * ranks it touched by their own totals. */
struct runmax {
	uint64_t floor;
	uint64_t *best;
};

static void runmax_fold(struct runmax *m, const struct sparse *s)
{
	if (s->base > m->floor)
		m->floor = s->base;
	for (uint32_t i = 0; i < s->ntouched; i++) {
		uint32_t r = s->touched[i];
		uint64_t v = s->base + s->v[r];

		if (v > m->best[r])
			m->best[r] = v;
	}
}

static uint64_t runmax_at(const struct runmax *m, uint32_t r)
{
	return m->best[r] > m->floor ? m->best[r] : m->floor;
}

/* ---- finish ---------------------------------------------------------------------- */

struct layer_e {
	int32_t layer;
	uint32_t experts;       /* E; 0 when the layer has no routed experts */
	uint32_t rec;           /* a tensor that showed it, for messages */
};

struct evidence {
	int32_t layer;
	uint8_t from_dim0;
	uint64_t value;
	uint32_t rec;
};

static int cmp_evidence(const void *a, const void *b)
{
	const struct evidence *x = a, *y = b;

	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	if (x->from_dim0 != y->from_dim0)
		return x->from_dim0 > y->from_dim0 ? -1 : 1;
	return x->rec < y->rec ? -1 : x->rec > y->rec;
}

static int cmp_layer_e(const void *a, const void *b)
{
	const struct layer_e *x = a, *y = b;

	return x->layer < y->layer ? -1 : x->layer > y->layer;
}

static int takes_dim0(const struct rec *r)
{
	return r->part == MS_NAME_PART_EXPERTS_FUSED && !r->lora &&
	       !r->megatron_grouped && r->ndim >= 1;
}

static void layer_str(int32_t layer, char *buf, size_t n)
{
	if (layer >= 0)
		snprintf(buf, n, "layer %d", (int)layer);
	else
		snprintf(buf, n, "the tensors outside any layer");
}

/* E of every layer with routed experts, from the tensors of all entries. */
static int expert_counts(struct ms_fp_calc *c, struct layer_e **out,
			 size_t *nout, struct ms_err *err)
{
	const struct ms_fp_plan *p = c->plan;
	struct evidence *ev = NULL;
	struct layer_e *le = NULL;
	size_t nev = 0, nle = 0;
	char ls[48];
	int rc = MS_OK;

	*out = NULL;
	*nout = 0;
	ev = ms_malloc((c->nrecs ? c->nrecs : 1) * sizeof(*ev));
	le = ms_malloc((c->nrecs ? c->nrecs : 1) * sizeof(*le));
	if (!ev || !le) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < c->nrecs; i++) {
		const struct rec *r = &c->recs[i];

		if (r->part == MS_NAME_PART_EXPERT && r->expert >= 0) {
			ev[nev].from_dim0 = 0;
			ev[nev].value = (uint64_t)r->expert + 1;
		} else if (takes_dim0(r)) {
			ev[nev].from_dim0 = 1;
			ev[nev].value = r->shape[0];
		} else {
			continue;
		}
		ev[nev].layer = r->layer;
		ev[nev].rec = (uint32_t)i;
		nev++;
	}
	qsort(ev, nev, sizeof(*ev), cmp_evidence);
	for (size_t i = 0; i < nev;) {
		size_t j = i;
		uint64_t dim0 = 0, maxid = 0;
		uint32_t dim0_rec = 0, id_rec = 0, e;

		/* dim0 evidence sorts first within a layer */
		for (; j < nev && ev[j].layer == ev[i].layer; j++) {
			const struct evidence *x = &ev[j];

			if (x->from_dim0) {
				if (dim0 && x->value != dim0) {
					layer_str(x->layer, ls, sizeof(ls));
					rc = ms_err_set(err, MS_EINVAL,
							"plan '%s': %s: fused expert tensors '%s' and '%s' disagree on the expert count (%llu vs %llu)",
							p->label, ls, c->recs[dim0_rec].name,
							c->recs[x->rec].name,
							(unsigned long long)dim0,
							(unsigned long long)x->value);
					goto out;
				}
				dim0 = x->value;
				dim0_rec = x->rec;
			} else if (x->value > maxid) {
				maxid = x->value;
				id_rec = x->rec;
			}
		}
		layer_str(ev[i].layer, ls, sizeof(ls));
		if (p->num_experts) {
			if ((dim0 && dim0 != p->num_experts) || maxid > p->num_experts) {
				rc = ms_err_set(err, MS_EINVAL,
						"plan '%s': key 'num_experts': %u, but tensor '%s' of %s shows %llu experts",
						p->label, p->num_experts,
						c->recs[dim0 && dim0 != p->num_experts ?
							dim0_rec : id_rec].name,
						ls, (unsigned long long)(dim0 && dim0 != p->num_experts ?
									 dim0 : maxid));
				goto out;
			}
			dim0 = p->num_experts;
		} else if (dim0 && maxid > dim0) {
			rc = ms_err_set(err, MS_EINVAL,
					"plan '%s': %s: tensor '%s' names expert %llu, but fused tensor '%s' holds %llu experts",
					p->label, ls, c->recs[id_rec].name,
					(unsigned long long)(maxid - 1),
					c->recs[dim0_rec].name, (unsigned long long)dim0);
			goto out;
		}
		if (!dim0) {
			dim0 = maxid;
			dim0_rec = id_rec;
		}
		if (dim0 > MS_FP_MAX_EXPERTS) {
			rc = ms_err_set(err, MS_EINVAL,
					"plan '%s': %s: tensor '%s' implies %llu experts (at most %u)",
					p->label, ls, c->recs[dim0_rec].name,
					(unsigned long long)dim0, MS_FP_MAX_EXPERTS);
			goto out;
		}
		e = (uint32_t)dim0;
		if (e % p->ep_size) {
			rc = ms_err_set(err, MS_EINVAL,
					"plan '%s': key 'ep_size': %s has %u routed experts (tensor '%s'), not divisible by ep_size %u",
					p->label, ls, e, c->recs[dim0_rec].name,
					p->ep_size);
			goto out;
		}
		le[nle].layer = ev[i].layer;
		le[nle].experts = e;
		le[nle].rec = dim0_rec;
		nle++;
		i = j;
	}
	qsort(le, nle, sizeof(*le), cmp_layer_e);
	*out = le;
	*nout = nle;
	le = NULL;
out:
	ms_free(ev);
	ms_free(le);
	return rc;
}

static int place_all(struct ms_fp_calc *c, struct ms_err *err)
{
	const struct ms_fp_plan *p = c->plan;
	struct layer_e *le = NULL;
	size_t nle = 0;
	int rc;

	if ((rc = expert_counts(c, &le, &nle, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < c->nrecs; i++) {
		struct rec *r = &c->recs[i];
		struct layer_e key = { .layer = r->layer }, *hit;
		uint32_t e;

		r->place = PLACE_REPLICATED;
		if ((r->part != MS_NAME_PART_EXPERT && r->part != MS_NAME_PART_EXPERTS_FUSED) ||
		    (r->part == MS_NAME_PART_EXPERT && r->expert < 0) ||
		    (r->part == MS_NAME_PART_EXPERTS_FUSED && r->ndim == 0))
			continue;
		hit = bsearch(&key, le, nle, sizeof(*le), cmp_layer_e);
		e = hit ? hit->experts : p->num_experts;
		if (!e) {
			char ls[48];

			layer_str(r->layer, ls, sizeof(ls));
			rc = ms_err_set(err, MS_EINVAL,
					"plan '%s': entry '%s': tensor '%s': the expert count of %s is not known from any tensor; give num_experts in the plan",
					p->label, p->entries[r->entry].role, r->name, ls);
			goto out;
		}
		if (e % p->ep_size) {
			rc = ms_err_set(err, MS_EINVAL,
					"plan '%s': key 'ep_size': num_experts %u is not divisible by ep_size %u",
					p->label, e, p->ep_size);
			goto out;
		}
		if (r->part == MS_NAME_PART_EXPERTS_FUSED) {
			r->place = PLACE_EVEN;
			continue;
		}
		r->place = PLACE_OWNED;
		r->owner = p->placement == MS_FP_PLACEMENT_CONTIGUOUS ?
			   (uint32_t)r->expert / (e / p->ep_size) :
			   (uint32_t)r->expert % p->ep_size;
	}
out:
	ms_free(le);
	return rc;
}

static int cmp_rec_name(const void *a, const void *b, void *ctx)
{
	const struct rec *recs = ctx;
	const struct rec *x = &recs[*(const uint32_t *)a], *y = &recs[*(const uint32_t *)b];

	if (x->entry != y->entry)
		return x->entry < y->entry ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int check_entries(struct ms_fp_calc *c, struct ms_err *err)
{
	const struct ms_fp_plan *p = c->plan;
	uint32_t *idx;
	int rc = MS_OK;

	for (size_t i = 0; i < p->nentries; i++)
		if (!c->added[i])
			return ms_err_set(err, MS_EINVAL,
					  "plan '%s': key 'states[%zu]': entry '%s' has no tensors (%s '%s' not resolved)",
					  p->label, i, p->entries[i].role,
					  p->entries[i].state ? "state" : "path",
					  p->entries[i].state ? p->entries[i].state :
					  p->entries[i].path);
	idx = ms_malloc((c->nrecs ? c->nrecs : 1) * sizeof(*idx));
	if (!idx)
		return ms_err_nomem(err);
	for (size_t i = 0; i < c->nrecs; i++)
		idx[i] = (uint32_t)i;
	qsort_r(idx, c->nrecs, sizeof(*idx), cmp_rec_name, c->recs);
	for (size_t i = 1; i < c->nrecs; i++) {
		const struct rec *a = &c->recs[idx[i - 1]], *b = &c->recs[idx[i]];

		if (a->entry == b->entry && !strcmp(a->name, b->name)) {
			rc = ms_err_set(err, MS_EINVAL,
					"plan '%s': entry '%s': tensor '%s' listed twice",
					p->label, p->entries[a->entry].role, a->name);
			break;
		}
	}
	ms_free(idx);
	return rc;
}

static int cmp_rec_key(const void *a, const void *b, void *ctx)
{
	const struct rec *recs = ctx;
	const struct rec *x = &recs[*(const uint32_t *)a], *y = &recs[*(const uint32_t *)b];
	size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
	int d;

	if (x->entry != y->entry)
		return x->entry < y->entry ? -1 : 1;
	if ((d = memcmp(x->name, y->name, n)) != 0)
		return d;
	if (x->key_len != y->key_len)
		return x->key_len < y->key_len ? -1 : 1;
	return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

/* Give every companion the layout of its weight (same entry, same module);
 * a companion without a weight stays as-is. */
static int resolve_companions(struct ms_fp_calc *c, struct ms_err *err)
{
	uint32_t *idx = NULL, *first = NULL;
	int rc = MS_OK;

	idx = ms_malloc((c->nrecs ? c->nrecs : 1) * sizeof(*idx));
	first = ms_malloc((c->nrecs ? c->nrecs : 1) * sizeof(*first));
	if (!idx || !first) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < c->nrecs; i++) {
		idx[i] = (uint32_t)i;
		first[i] = UINT32_MAX;
	}
	for (size_t i = 0; i < c->ncons; i++)
		if (first[c->cons[i].rec] == UINT32_MAX)
			first[c->cons[i].rec] = (uint32_t)i;
	qsort_r(idx, c->nrecs, sizeof(*idx), cmp_rec_key, c->recs);
	for (size_t i = 0; i < c->nrecs;) {
		const struct rec *a = &c->recs[idx[i]];
		enum ms_fp_layout layout = MS_FP_LAYOUT_AS_IS;
		size_t j = i;

		for (; j < c->nrecs; j++) {
			const struct rec *b = &c->recs[idx[j]];

			if (b->entry != a->entry || b->key_len != a->key_len ||
			    memcmp(a->name, b->name, a->key_len))
				break;
			if (b->role == MS_NAME_ROLE_WEIGHT && !b->lora &&
			    first[idx[j]] != UINT32_MAX &&
			    !c->cons[first[idx[j]]].companion)
				layout = row_layout(c->cons[first[idx[j]]].row);
		}
		for (size_t k = i; k < j; k++) {
			struct contrib *x;

			if (first[idx[k]] == UINT32_MAX)
				continue;
			x = &c->cons[first[idx[k]]];
			if (x->companion)
				x->row = a->entry * MS_FP_LAYOUT_COUNT + (uint32_t)layout;
		}
		i = j;
	}
out:
	ms_free(idx);
	ms_free(first);
	return rc;
}

struct sortctx {
	const struct rec *recs;
	const struct contrib *cons;
};

static int cmp_by_key(const void *a, const void *b, void *ctx)
{
	const struct sortctx *s = ctx;
	const struct contrib *x = &s->cons[*(const uint32_t *)a];
	const struct contrib *y = &s->cons[*(const uint32_t *)b];
	const struct rec *rx = &s->recs[x->rec], *ry = &s->recs[y->rec];
	size_t n = rx->key_len < ry->key_len ? rx->key_len : ry->key_len;
	int d = memcmp(rx->name, ry->name, n);

	if (d)
		return d;
	if (rx->key_len != ry->key_len)
		return rx->key_len < ry->key_len ? -1 : 1;
	if (x->row != y->row)
		return x->row < y->row ? -1 : 1;
	return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

static int cmp_by_layer(const void *a, const void *b, void *ctx)
{
	const struct sortctx *s = ctx;
	const struct contrib *x = &s->cons[*(const uint32_t *)a];
	const struct contrib *y = &s->cons[*(const uint32_t *)b];
	int32_t lx = s->recs[x->rec].layer, ly = s->recs[y->rec].layer;

	if (lx != ly)
		return lx < ly ? -1 : 1;
	if (x->row != y->row)
		return x->row < y->row ? -1 : 1;
	return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

/* Working state of one finish. */
struct rowwork {
	struct acc main, dup, cand;
	uint64_t ntensors, nweights, nelem, model_bytes;
	/* transient rows: the largest layer */
	uint64_t peak, peak_rep, peak_expert, peak_model;
	int32_t peak_layer;
	int has_peak;
	/* columnwise rows with candidates: max over layers, per rank */
	struct runmax cand_layer;
	size_t out;             /* index in the report, or SIZE_MAX */
};

struct dupwork {
	size_t nrows;
	uint32_t *rows;
	uint64_t nweights;
	struct acc all, excess;
	char *example;
};

static int dup_group(struct dupwork **groups, size_t *ngroups,
		     const uint32_t *rows, size_t nrows, struct dupwork **out)
{
	struct dupwork *g;

	for (size_t i = 0; i < *ngroups; i++) {
		g = &(*groups)[i];
		if (g->nrows == nrows && !memcmp(g->rows, rows, nrows * sizeof(*rows))) {
			*out = g;
			return MS_OK;
		}
	}
	if (*ngroups >= MAX_DUP_GROUPS)
		return MS_EINVAL;
	g = ms_realloc(*groups, (*ngroups + 1) * sizeof(**groups));
	if (!g)
		return MS_ENOMEM;
	*groups = g;
	g = &g[(*ngroups)++];
	memset(g, 0, sizeof(*g));
	g->rows = ms_malloc(nrows * sizeof(*rows));
	if (!g->rows)
		return MS_ENOMEM;
	memcpy(g->rows, rows, nrows * sizeof(*rows));
	g->nrows = nrows;
	*out = g;
	return MS_OK;
}

void ms_fp_report_free(struct ms_fp_report *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->ndups; i++) {
		ms_free(r->dups[i].rows);
		ms_free(r->dups[i].example);
	}
	ms_free(r->dups);
	ms_free(r->rows);
	ms_free(r);
}

/* Weights in more than one resident copy: flag them, group them by the set
 * of rows holding them, and mark columnwise copies with a rowwise twin. */
static int find_duplicates(struct ms_fp_calc *c, struct rowwork *rw,
			   struct dupwork **groups, size_t *ngroups,
			   uint64_t *nweights, struct ms_err *err)
{
	const uint32_t ep = c->plan->ep_size;
	struct sortctx sc = { c->recs, c->cons };
	uint32_t *idx = NULL, *rows = NULL;
	uint64_t *copy = NULL;
	size_t n = 0;
	int rc = MS_OK;

	idx = ms_malloc((c->ncons ? c->ncons : 1) * sizeof(*idx));
	rows = ms_malloc((c->ncons ? c->ncons : 1) * sizeof(*rows));
	copy = ms_malloc((c->ncons ? c->ncons : 1) * sizeof(*copy));
	if (!idx || !rows || !copy) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < c->ncons; i++)
		if (row_layout(c->cons[i].row) != MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT)
			idx[n++] = (uint32_t)i;
	qsort_r(idx, n, sizeof(*idx), cmp_by_key, &sc);
	for (size_t i = 0; i < n;) {
		size_t j = i + 1, nr = 0, minr = 0;
		int has_row = 0;
		struct dupwork *g;

		while (j < n) {
			const struct rec *a = &c->recs[c->cons[idx[i]].rec];
			const struct rec *b = &c->recs[c->cons[idx[j]].rec];

			if (a->key_len != b->key_len ||
			    memcmp(a->name, b->name, a->key_len))
				break;
			j++;
		}
		/* the distinct rows of this weight and each copy's bytes */
		for (size_t k = i; k < j; k++) {
			const struct contrib *x = &c->cons[idx[k]];

			if (nr == 0 || rows[nr - 1] != x->row) {
				rows[nr] = x->row;
				copy[nr++] = 0;
			}
			copy[nr - 1] += x->bytes;
		}
		if (nr < 2) {
			i = j;
			continue;
		}
		for (size_t k = 0; k < nr; k++) {
			enum ms_fp_layout l = row_layout(rows[k]);

			has_row |= l == MS_FP_LAYOUT_NVFP4_ROWWISE;
			if (copy[k] < copy[minr])
				minr = k;
		}
		rc = dup_group(groups, ngroups, rows, nr, &g);
		if (rc == MS_EINVAL) {
			rc = ms_err_set(err, MS_EINVAL,
					"plan '%s': more than %u distinct sets of states hold the same weights",
					c->plan->label, MAX_DUP_GROUPS);
			goto out;
		}
		if (rc != MS_OK) {
			rc = ms_err_nomem(err);
			goto out;
		}
		if (!g->example &&
		    !(g->example = ms_strndup(c->recs[c->cons[idx[i]].rec].name,
					      c->recs[c->cons[idx[i]].rec].key_len))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		g->nweights++;
		(*nweights)++;
		for (size_t k = i; k < j; k++) {
			struct contrib *x = &c->cons[idx[k]];
			const struct rec *r = &c->recs[x->rec];
			struct rowwork *w = &rw[x->row];

			if (acc_add(&w->dup, ep, r, x->bytes) ||
			    acc_add(&g->all, ep, r, x->bytes) ||
			    (x->row != rows[minr] &&
			     acc_add(&g->excess, ep, r, x->bytes))) {
				rc = ms_err_nomem(err);
				goto out;
			}
			if (has_row && row_layout(x->row) == MS_FP_LAYOUT_NVFP4_COLUMNWISE) {
				x->cand = 1;
				if (acc_add(&w->cand, ep, r, x->bytes)) {
					rc = ms_err_nomem(err);
					goto out;
				}
			}
		}
		i = j;
	}
out:
	ms_free(idx);
	ms_free(rows);
	ms_free(copy);
	return rc;
}

/* The per-layer pass over transient columnwise copies and candidates. */
static int layer_pass(struct ms_fp_calc *c, struct rowwork *rw,
		      struct runmax *tmax, struct runmax *tcmax,
		      struct ms_err *err)
{
	const uint32_t ep = c->plan->ep_size;
	struct sortctx sc = { c->recs, c->cons };
	struct sparse grp, lt, ltc;
	uint32_t *idx;
	size_t n = 0;
	int rc = MS_OK;

	memset(&grp, 0, sizeof(grp));
	memset(&lt, 0, sizeof(lt));
	memset(&ltc, 0, sizeof(ltc));
	idx = ms_malloc((c->ncons ? c->ncons : 1) * sizeof(*idx));
	if (!idx || sparse_init(&grp, ep) || sparse_init(&lt, ep) ||
	    sparse_init(&ltc, ep)) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < c->ncons; i++)
		if (c->cons[i].cand ||
		    row_layout(c->cons[i].row) == MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT)
			idx[n++] = (uint32_t)i;
	qsort_r(idx, n, sizeof(*idx), cmp_by_layer, &sc);
	for (size_t i = 0; i < n;) {
		int32_t layer = c->recs[c->cons[idx[i]].rec].layer;

		while (i < n && c->recs[c->cons[idx[i]].rec].layer == layer) {
			uint32_t row = c->cons[idx[i]].row;
			struct rowwork *w = &rw[row];
			int transient = row_layout(row) ==
					MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT;
			uint64_t model = 0, rep = 0, v, mo;

			for (; i < n && c->cons[idx[i]].row == row &&
			       c->recs[c->cons[idx[i]].rec].layer == layer; i++) {
				const struct contrib *x = &c->cons[idx[i]];
				const struct rec *r = &c->recs[x->rec];

				sparse_add(&grp, ep, r, x->bytes);
				sparse_add(&ltc, ep, r, x->bytes);
				if (transient)
					sparse_add(&lt, ep, r, x->bytes);
				if (r->place == PLACE_REPLICATED)
					rep += x->bytes;
				model += x->bytes;
			}
			mo = sparse_max_owned(&grp);
			v = grp.base + mo;
			if (transient && (!w->has_peak || v > w->peak)) {
				w->has_peak = 1;
				w->peak = v;
				w->peak_layer = layer;
				w->peak_rep = rep;
				w->peak_expert = v - rep;
				w->peak_model = model;
			}
			if (!transient) {
				if (!w->cand_layer.best &&
				    !(w->cand_layer.best = ms_calloc(ep, sizeof(uint64_t)))) {
					rc = ms_err_nomem(err);
					goto out;
				}
				runmax_fold(&w->cand_layer, &grp);
			}
			sparse_clear(&grp);
		}
		runmax_fold(tmax, &lt);
		runmax_fold(tcmax, &ltc);
		sparse_clear(&lt);
		sparse_clear(&ltc);
	}
out:
	sparse_release(&grp);
	sparse_release(&lt);
	sparse_release(&ltc);
	ms_free(idx);
	return rc;
}

/* ---- training state ---------------------------------------------------------- */

static int entry_with_role(const struct ms_fp_plan *p, const char *role, size_t *out)
{
	for (size_t i = 0; i < p->nentries; i++) {
		if (!strcmp(p->entries[i].role, role)) {
			*out = i;
			return 1;
		}
	}
	return 0;
}

/* Does a target of train.lora name this weight? PEFT's rule for a module
 * name (the leaf: "q_proj" trains every q_proj), plus "experts" for every
 * routed expert projection and "shared_experts" for the shared ones. */
static int lora_target_is(const struct ms_fp_train_plan *t, const char *name)
{
	for (size_t i = 0; i < t->ntargets; i++)
		if (!strcmp(t->targets[i], name))
			return 1;
	return 0;
}

static int lora_target(const struct ms_fp_train_plan *t, const struct ms_name_info *info)
{
	for (size_t i = 0; i < t->ntargets; i++) {
		const char *s = t->targets[i];

		if (!strcmp(s, "experts") &&
		    (info->part == MS_NAME_PART_EXPERT || info->part == MS_NAME_PART_EXPERTS_FUSED))
			return 1;
		if ((!strcmp(s, "shared_experts") || !strcmp(s, "shared_expert")) &&
		    info->part == MS_NAME_PART_SHARED_EXPERT)
			return 1;
		if (info->proj[0] && !strcmp(s, info->proj))
			return 1;
	}
	return 0;
}

/*
 * The trainable parameters on each rank (*tp) and what the report says of
 * them. With train.lora: a pair A [r, in], B [out, r] for every weight of
 * the 'base' entry a target names (a fused [E, a, b] expert parameter: one
 * pair per expert), placed as the weight is. Without it: the LoRA tensors
 * of the 'adapter' entry, as they are placed. Parameters of a warm-start
 * 'adapter' entry are resident in its own rows already; otherwise their
 * bf16 copy is counted here.
 */
static int train_pass(struct ms_fp_calc *c, struct acc *tp, struct ms_fp_train *tr,
		      struct ms_err *err)
{
	const struct ms_fp_plan *p = c->plan;
	size_t base = 0, adapter = 0;
	int has_base = entry_with_role(p, "base", &base);
	int has_adapter = entry_with_role(p, "adapter", &adapter);

	memset(tr, 0, sizeof(*tr));
	if (!p->train.present)
		return MS_OK;
	tr->present = 1;
	tr->from_lora = p->train.lora_r > 0;
	tr->params_resident = has_adapter;
	if (tr->from_lora && !has_base)
		return plan_errf(err, p->label, "train.lora",
				 "needs an entry with role 'base': its weight shapes give the LoRA sizes");
	if (!tr->from_lora && !has_adapter)
		return plan_errf(err, p->label, "train",
				 "nothing to train: no \"lora\" object and no entry with role 'adapter'");
	if (p->train.optimizer && strcmp(p->train.optimizer, "adamw"))
		return plan_errf(err, p->label, "train.optimizer.name",
				 "'%s': the footprint counts the state of \"adamw\" only",
				 p->train.optimizer);
	tr->entry = tr->from_lora ? base : adapter;
	for (size_t i = 0; i < c->nrecs; i++) {
		const struct rec *r = &c->recs[i];
		uint64_t n = 1;

		if (r->entry != tr->entry)
			continue;
		if (tr->from_lora) {
			struct ms_name_info info;
			uint64_t sides;

			if (!r->lora_base || ms_name_parse(r->name, &info) != MS_OK ||
			    !lora_target(&p->train, &info))
				continue;
			/* the "experts" target adapts the fused gate_up parameter
			 * (PEFT's target_parameters): one A over the input for gate
			 * and up together, so a per-expert up (w3) adds only its B */
			sides = r->shape[r->ndim - 2];
			if (!(info.part == MS_NAME_PART_EXPERT && lora_target_is(&p->train, "experts") &&
			      (!strcmp(info.proj, "up_proj") || !strcmp(info.proj, "w3"))) &&
			    ms_add_u64(sides, r->shape[r->ndim - 1], &sides))
				return ms_err_set(err, MS_EINVAL,
						  "plan '%s': tensor '%s': LoRA parameter count overflows",
						  p->label, r->name);
			if (ms_mul_u64(sides, p->train.lora_r, &n) ||
			    (r->ndim == 3 && ms_mul_u64(n, r->shape[0], &n)))
				return ms_err_set(err, MS_EINVAL,
						  "plan '%s': tensor '%s': LoRA parameter count overflows",
						  p->label, r->name);
		} else {
			if (!r->lora)
				continue;
			for (uint32_t d = 0; d < r->ndim; d++)
				if (ms_mul_u64(n, r->shape[d], &n))
					return ms_err_set(err, MS_EINVAL,
							  "plan '%s': tensor '%s': element count overflows",
							  p->label, r->name);
		}
		if (n > MAX_TOTAL_BYTES / 32 || tr->params > MAX_TOTAL_BYTES / 32)
			return ms_err_set(err, MS_EINVAL,
					  "plan '%s': the trainable parameters total more than 2^57",
					  p->label);
		tr->modules++;
		tr->params += n;
		if (acc_add(tp, p->ep_size, r, n))
			return ms_err_nomem(err);
	}
	if (tr->modules == 0)
		return tr->from_lora ?
		       plan_errf(err, p->label, "train.lora.targets",
				 "no weight of entry '%s' is a target", p->entries[base].role) :
		       plan_errf(err, p->label, "train",
				 "entry '%s' holds no LoRA tensors to train", p->entries[adapter].role);
	tr->per_param_bytes = (tr->params_resident ? 0 : MS_FP_TRAIN_PARAM_BYTES) +
			      MS_FP_TRAIN_GRAD_BYTES + MS_FP_TRAIN_ADAMW_BYTES;
	tr->params_per_gpu = acc_max(tp);
	tr->param_bytes_per_gpu = tr->params_resident ? 0 :
				  tr->params_per_gpu * MS_FP_TRAIN_PARAM_BYTES;
	tr->grad_bytes_per_gpu = tr->params_per_gpu * MS_FP_TRAIN_GRAD_BYTES;
	tr->optimizer_bytes_per_gpu = tr->params_per_gpu * MS_FP_TRAIN_ADAMW_BYTES;
	tr->bytes_per_gpu = tr->params_per_gpu * tr->per_param_bytes;
	return MS_OK;
}

int ms_fp_calc_finish(struct ms_fp_calc *c, struct ms_fp_report **out,
		      struct ms_err *err)
{
	const struct ms_fp_plan *p;
	struct ms_fp_report *rep = NULL;
	struct rowwork *rw = NULL;
	struct dupwork *groups = NULL;
	struct runmax tmax = { 0, NULL }, tcmax = { 0, NULL };
	struct acc tp = { 0, 0, NULL, 0 };
	uint64_t *resident = NULL, *candfull = NULL, dupw = 0;
	size_t ngroups = 0, nrows, nout = 0;
	uint32_t ep;
	int rc;

	*out = NULL;
	if (!c)
		return ms_err_set(err, MS_EINVAL, "footprint: no calculator");
	p = c->plan;
	ep = p->ep_size;
	nrows = NROWS(p);
	if ((rc = check_entries(c, err)) != MS_OK ||
	    (rc = place_all(c, err)) != MS_OK ||
	    (rc = resolve_companions(c, err)) != MS_OK)
		goto out;

	rw = ms_calloc(nrows, sizeof(*rw));
	resident = ms_calloc(ep, sizeof(*resident));
	candfull = ms_calloc(ep, sizeof(*candfull));
	tmax.best = ms_calloc(ep, sizeof(uint64_t));
	tcmax.best = ms_calloc(ep, sizeof(uint64_t));
	rep = ms_calloc(1, sizeof(*rep));
	if (!rw || !resident || !candfull || !tmax.best || !tcmax.best || !rep) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < c->ncons; i++) {
		const struct contrib *x = &c->cons[i];
		struct rowwork *w = &rw[x->row];

		if (acc_add(&w->main, ep, &c->recs[x->rec], x->bytes)) {
			rc = ms_err_nomem(err);
			goto out;
		}
		w->ntensors++;
		w->nweights += x->weight;
		w->nelem += x->nelem;
		w->model_bytes += x->bytes;
	}
	if ((rc = find_duplicates(c, rw, &groups, &ngroups, &dupw, err)) != MS_OK ||
	    (rc = layer_pass(c, rw, &tmax, &tcmax, err)) != MS_OK ||
	    (rc = train_pass(c, &tp, &rep->train, err)) != MS_OK)
		goto out;

	/* per-rank totals */
	for (size_t k = 0; k < nrows; k++) {
		const struct rowwork *w = &rw[k];

		rw[k].out = SIZE_MAX;
		if (!w->ntensors)
			continue;
		nout++;
		if (row_layout((uint32_t)k) == MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT)
			continue;
		rep->replicated_bytes += w->main.rep;
		for (uint32_t r = 0; r < ep; r++) {
			resident[r] += acc_at(&w->main, r);
			candfull[r] += acc_at(&w->cand, r);
		}
	}
	for (uint32_t r = 0; r < ep; r++) {
		/* the training state sits beside the weights on its rank */
		uint64_t train = acc_at(&tp, r) * rep->train.per_param_bytes;
		uint64_t total = resident[r] + runmax_at(&tmax, r) + train;
		uint64_t alt = resident[r] - candfull[r] + runmax_at(&tcmax, r) + train;

		if (r == 0 || total > rep->total_bytes_per_gpu) {
			rep->total_bytes_per_gpu = total;
			rep->peak_rank = r;
		}
		if (r == 0 || alt > rep->ondemand_total_bytes_per_gpu)
			rep->ondemand_total_bytes_per_gpu = alt;
	}
	rep->ondemand_saving_per_gpu = rep->total_bytes_per_gpu -
				       rep->ondemand_total_bytes_per_gpu;

	rep->rows = ms_calloc(nout ? nout : 1, sizeof(*rep->rows));
	if (!rep->rows) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t k = 0; k < nrows; k++) {
		struct rowwork *w = &rw[k];
		struct ms_fp_row *o;

		if (!w->ntensors)
			continue;
		w->out = rep->nrows;
		o = &rep->rows[rep->nrows++];
		o->entry = k / MS_FP_LAYOUT_COUNT;
		o->role = p->entries[o->entry].role;
		o->layout = row_layout((uint32_t)k);
		o->ntensors = w->ntensors;
		o->nweights = w->nweights;
		o->nelem = w->nelem;
		o->model_bytes = w->model_bytes;
		o->replicated_bytes = w->main.rep;
		o->expert_bytes_per_gpu = w->main.even + w->main.owned_max;
		o->bytes_per_gpu = acc_max(&w->main);
		o->peak_layer = -1;
		o->duplicate_bytes_per_gpu = acc_max(&w->dup);
		if (o->layout == MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT) {
			/* resident it would be the whole of main */
			o->ondemand_saving_per_gpu = acc_max(&w->main) - w->peak;
			o->bytes_per_gpu = w->peak;
			o->replicated_bytes = w->peak_rep;
			o->expert_bytes_per_gpu = w->peak_expert;
			o->model_bytes = w->peak_model;
			o->peak_layer = w->peak_layer;
		} else if (w->cand_layer.best) {
			uint64_t now = 0, alt = 0;

			for (uint32_t r = 0; r < ep; r++) {
				uint64_t a = acc_at(&w->main, r);
				uint64_t b = a - acc_at(&w->cand, r) +
					     runmax_at(&w->cand_layer, r);

				now = a > now ? a : now;
				alt = b > alt ? b : alt;
			}
			o->ondemand_saving_per_gpu = now - alt;
		}
	}

	rep->dups = ms_calloc(ngroups ? ngroups : 1, sizeof(*rep->dups));
	if (!rep->dups) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t g = 0; g < ngroups; g++) {
		struct ms_fp_dup *d = &rep->dups[rep->ndups++];

		d->rows = ms_malloc(groups[g].nrows * sizeof(*d->rows));
		if (!d->rows) {
			rc = ms_err_nomem(err);
			goto out;
		}
		d->nrows = groups[g].nrows;
		for (size_t k = 0; k < d->nrows; k++)
			d->rows[k] = rw[groups[g].rows[k]].out;
		d->nweights = groups[g].nweights;
		d->bytes_per_gpu = acc_max(&groups[g].all);
		d->excess_bytes_per_gpu = acc_max(&groups[g].excess);
		d->example = groups[g].example;
		groups[g].example = NULL;
	}
	rep->duplicate_weights = dupw;
	rep->plan = p;
	rep->has_budget = p->has_budget;
	rep->budget_bytes = p->budget_bytes;
	rep->over_budget = p->has_budget &&
			   rep->total_bytes_per_gpu > p->budget_bytes;
	*out = rep;
	rep = NULL;
out:
	for (size_t k = 0; rw && k < nrows; k++) {
		acc_release(&rw[k].main);
		acc_release(&rw[k].dup);
		acc_release(&rw[k].cand);
		ms_free(rw[k].cand_layer.best);
	}
	for (size_t g = 0; g < ngroups; g++) {
		ms_free(groups[g].rows);
		ms_free(groups[g].example);
		acc_release(&groups[g].all);
		acc_release(&groups[g].excess);
	}
	ms_free(groups);
	acc_release(&tp);
	ms_free(rw);
	ms_free(resident);
	ms_free(candfull);
	ms_free(tmax.best);
	ms_free(tcmax.best);
	ms_fp_report_free(rep);
	return rc;
}

/* ---- output ------------------------------------------------------------------- */

static void human(uint64_t b, char *buf, size_t n)
{
	char s[MS_BYTES_STR_LEN];

	snprintf(buf, n, "%s", ms_bytes_str(b, s));
}

static const char *row_source(const struct ms_fp_report *r, size_t i)
{
	const struct ms_fp_entry *e = &r->plan->entries[r->rows[i].entry];

	return e->state ? e->state : e->path;
}

int ms_fp_report_text(const struct ms_fp_report *r, struct ms_buf *out,
		      struct ms_err *err)
{
	const struct ms_fp_plan *p = r->plan;
	char a[32], b[32], c2[32], d[32];
	int rw = 4;

	ms_buf_printf(out, "plan '%s'", p->name ? p->name : p->label);
	if (p->name)
		ms_buf_printf(out, " (%s)", p->label);
	ms_buf_printf(out, ": ep_size %u, %s placement", p->ep_size,
		      ms_fp_placement_name(p->placement));
	if (p->has_budget) {
		human(p->budget_bytes, a, sizeof(a));
		ms_buf_printf(out, ", budget %s per gpu", a);
	}
	ms_buf_puts(out, "\n");
	for (size_t i = 0; i < r->nrows; i++)
		if ((int)strlen(r->rows[i].role) > rw)
			rw = (int)strlen(r->rows[i].role);
	ms_buf_printf(out, "%-*s  %-26s %8s %12s %12s %12s %12s  %s\n", rw, "role",
		      "layout", "tensors", "model", "replicated", "expert/gpu",
		      "per gpu", "source");
	for (size_t i = 0; i < r->nrows; i++) {
		const struct ms_fp_row *w = &r->rows[i];

		human(w->model_bytes, a, sizeof(a));
		human(w->replicated_bytes, b, sizeof(b));
		human(w->expert_bytes_per_gpu, c2, sizeof(c2));
		human(w->bytes_per_gpu, d, sizeof(d));
		ms_buf_printf(out, "%-*s  %-26s %8llu %12s %12s %12s %12s  %s\n", rw,
			      w->role, ms_fp_layout_name(w->layout),
			      (unsigned long long)w->ntensors, a, b, c2, d,
			      row_source(r, i));
	}
	for (size_t g = 0; g < r->ndups; g++) {
		const struct ms_fp_dup *x = &r->dups[g];

		ms_buf_printf(out, "duplicate: %llu weights resident %zu times (",
			      (unsigned long long)x->nweights, x->nrows);
		for (size_t k = 0; k < x->nrows; k++) {
			const struct ms_fp_row *w = &r->rows[x->rows[k]];

			ms_buf_printf(out, "%s%s %s", k ? ", " : "", w->role,
				      ms_fp_layout_name(w->layout));
		}
		human(x->bytes_per_gpu, a, sizeof(a));
		human(x->excess_bytes_per_gpu, b, sizeof(b));
		ms_buf_printf(out, "), e.g. '%s': %s per gpu, %s beyond one copy\n",
			      x->example, a, b);
	}
	for (size_t i = 0; i < r->nrows; i++) {
		const struct ms_fp_row *w = &r->rows[i];

		if (w->layout == MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT) {
			human(w->bytes_per_gpu, a, sizeof(a));
			human(w->ondemand_saving_per_gpu, b, sizeof(b));
			if (w->peak_layer >= 0)
				snprintf(c2, sizeof(c2), "layer %d", (int)w->peak_layer);
			else
				snprintf(c2, sizeof(c2), "no layer");
			ms_buf_printf(out,
				      "on-demand: '%s' builds columnwise one layer at a time (largest: %s, %s per gpu), %s per gpu less than resident\n",
				      w->role, c2, a, b);
		} else if (w->ondemand_saving_per_gpu) {
			human(w->ondemand_saving_per_gpu, a, sizeof(a));
			ms_buf_printf(out,
				      "on-demand: building '%s' %s per layer from its rowwise twin would save %s per gpu\n",
				      w->role, ms_fp_layout_name(w->layout), a);
		}
	}
	if (r->ondemand_saving_per_gpu) {
		human(r->ondemand_total_bytes_per_gpu, a, sizeof(a));
		human(r->total_bytes_per_gpu, b, sizeof(b));
		human(r->ondemand_saving_per_gpu, c2, sizeof(c2));
		ms_buf_printf(out,
			      "on-demand: with every duplicated columnwise copy built per layer: %s per gpu instead of %s (saves %s)\n",
			      a, b, c2);
	}
	if (r->train.present) {
		const struct ms_fp_train *t = &r->train;

		if (t->from_lora) {
			ms_buf_printf(out, "train: LoRA r=%u on %llu weights of '%s' (targets", p->train.lora_r,
				      (unsigned long long)t->modules, p->entries[t->entry].role);
			for (size_t i = 0; i < p->train.ntargets; i++)
				ms_buf_printf(out, "%s%s", i ? ", " : " ", p->train.targets[i]);
			ms_buf_puts(out, ")");
		} else {
			ms_buf_printf(out, "train: the %llu LoRA tensors of '%s'",
				      (unsigned long long)t->modules, p->entries[t->entry].role);
		}
		ms_buf_printf(out, ": %llu parameters, %llu on the largest gpu\n",
			      (unsigned long long)t->params, (unsigned long long)t->params_per_gpu);
		human(t->grad_bytes_per_gpu, b, sizeof(b));
		human(t->optimizer_bytes_per_gpu, c2, sizeof(c2));
		human(t->bytes_per_gpu, d, sizeof(d));
		if (t->params_resident) {
			ms_buf_printf(out, "train: per gpu: gradients %s (fp32), AdamW %s (fp32 master and two moments): %s; the LoRA weights are the 'adapter' rows\n",
				      b, c2, d);
		} else {
			human(t->param_bytes_per_gpu, a, sizeof(a));
			ms_buf_printf(out, "train: per gpu: LoRA weights %s (bf16), gradients %s (fp32), AdamW %s (fp32 master and two moments): %s\n",
				      a, b, c2, d);
		}
	}
	if (!r->trainer.present && r->trainer.why[0])
		ms_buf_printf(out, "trainer on one gpu: no prediction: %s\n", r->trainer.why);
	if (r->trainer.present) {
		const struct ms_fp_trainer *t = &r->trainer;

		ms_buf_printf(out, "trainer on one gpu (mstrain --device cuda, bf16 GEMMs, batch %llu x seq_len %llu):\n",
			      (unsigned long long)t->batch, (unsigned long long)t->seq_len);
		for (int m = 0; m < 2; m++) {
			char e[32], f[32], g[32];
			human(t->mode[m].nvfp4_rowwise, a, sizeof(a));
			human(t->mode[m].nvfp4_colwise, b, sizeof(b));
			human(t->mode[m].dense, c2, sizeof(c2));
			human(t->mode[m].lora, d, sizeof(d));
			human(t->mode[m].acts, e, sizeof(e));
			human(t->mode[m].scratch, f, sizeof(f));
			human(t->mode[m].total, g, sizeof(g));
			ms_buf_printf(out, "  colwise %s%s: NVFP4 rowwise %s, columnwise %s, float weights %s, LoRA with gradients and AdamW %s, activations %s, scratch %s: %llu bytes (%s)\n",
				      m ? "on-demand" : "resident",
				      m == t->colwise_ondemand ? " (the plan's)" : "", a, b, c2, d, e, f,
				      (unsigned long long)t->mode[m].total, g);
		}
	}
	/* what the total is of, and what it leaves out */
	ms_buf_puts(out, r->train.present ?
		    "counted: the weights each gpu holds (rows above), LoRA weights, gradients and AdamW state\n" :
		    "counted: the weights each gpu holds (rows above), nothing else\n");
	ms_buf_puts(out, "not counted: ");
	if (!r->train.present)
		ms_buf_puts(out, "gradients and optimizer state (the plan has no \"train\" section), ");
	ms_buf_puts(out, "activations");
	if (p->train.batch && p->train.seq_len)
		ms_buf_printf(out, " (batch %llu x seq_len %llu)", (unsigned long long)p->train.batch,
			      (unsigned long long)p->train.seq_len);
	ms_buf_puts(out, ", CUDA context and kernel workspaces, communication buffers, allocator fragmentation\n");
	human(r->total_bytes_per_gpu, a, sizeof(a));
	ms_buf_printf(out, "total: %llu bytes (%s) per gpu, largest on rank %u",
		      (unsigned long long)r->total_bytes_per_gpu, a, r->peak_rank);
	if (r->has_budget) {
		human(r->budget_bytes, b, sizeof(b));
		if (r->over_budget) {
			human(r->total_bytes_per_gpu - r->budget_bytes, c2, sizeof(c2));
			ms_buf_printf(out, "; budget %s: over by %s", b, c2);
		} else {
			human(r->budget_bytes - r->total_bytes_per_gpu, c2, sizeof(c2));
			ms_buf_printf(out, "; budget %s: the counted bytes fit, %s left for what is not counted",
				      b, c2);
		}
	}
	ms_buf_puts(out, "\n");
	if (out->oom)
		return ms_err_nomem(err);
	return MS_OK;
}

static cJSON *add_u64(cJSON *o, const char *k, uint64_t v)
{
	/* doubles hold every byte count below 2^53 (8 PiB) exactly */
	return cJSON_AddNumberToObject(o, k, (double)v);
}

int ms_fp_report_json(const struct ms_fp_report *r, struct ms_buf *out,
		      struct ms_err *err)
{
	const struct ms_fp_plan *p = r->plan;
	cJSON *root = cJSON_CreateObject(), *rows, *dups, *od;
	char *text = NULL;
	int rc = MS_OK;

	if (!root)
		goto oom;
	if (p->name)
		cJSON_AddStringToObject(root, "name", p->name);
	else
		cJSON_AddNullToObject(root, "name");
	cJSON_AddStringToObject(root, "plan", p->label);
	cJSON_AddNumberToObject(root, "ep_size", p->ep_size);
	cJSON_AddStringToObject(root, "placement", ms_fp_placement_name(p->placement));
	if (p->has_budget) {
		add_u64(root, "budget_bytes", p->budget_bytes);
		cJSON_AddNumberToObject(root, "budget_gib", p->budget_gib);
	} else {
		cJSON_AddNullToObject(root, "budget_bytes");
		cJSON_AddNullToObject(root, "budget_gib");
	}
	rows = cJSON_AddArrayToObject(root, "rows");
	for (size_t i = 0; rows && i < r->nrows; i++) {
		const struct ms_fp_row *w = &r->rows[i];
		const struct ms_fp_entry *e = &p->entries[w->entry];
		cJSON *o = cJSON_CreateObject();

		if (!o || !cJSON_AddItemToArray(rows, o))
			goto oom;
		cJSON_AddStringToObject(o, "role", w->role);
		cJSON_AddStringToObject(o, "layout", ms_fp_layout_name(w->layout));
		cJSON_AddNumberToObject(o, "entry", (double)w->entry);
		cJSON_AddStringToObject(o, e->state ? "state" : "path",
					e->state ? e->state : e->path);
		cJSON_AddStringToObject(o, "repr", ms_fp_repr_name(e->repr));
		add_u64(o, "tensors", w->ntensors);
		add_u64(o, "weights", w->nweights);
		add_u64(o, "elements", w->nelem);
		add_u64(o, "model_bytes", w->model_bytes);
		add_u64(o, "replicated_bytes", w->replicated_bytes);
		add_u64(o, "expert_bytes_per_gpu", w->expert_bytes_per_gpu);
		add_u64(o, "bytes_per_gpu", w->bytes_per_gpu);
		add_u64(o, "duplicate_bytes_per_gpu", w->duplicate_bytes_per_gpu);
		add_u64(o, "ondemand_saving_bytes_per_gpu", w->ondemand_saving_per_gpu);
		if (w->layout == MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT)
			cJSON_AddNumberToObject(o, "peak_layer", w->peak_layer);
	}
	dups = cJSON_AddArrayToObject(root, "duplicates");
	for (size_t g = 0; dups && g < r->ndups; g++) {
		const struct ms_fp_dup *x = &r->dups[g];
		cJSON *o = cJSON_CreateObject(), *held;

		if (!o || !cJSON_AddItemToArray(dups, o))
			goto oom;
		held = cJSON_AddArrayToObject(o, "held_by");
		for (size_t k = 0; held && k < x->nrows; k++) {
			const struct ms_fp_row *w = &r->rows[x->rows[k]];
			cJSON *h = cJSON_CreateObject();

			if (!h || !cJSON_AddItemToArray(held, h))
				goto oom;
			cJSON_AddStringToObject(h, "role", w->role);
			cJSON_AddStringToObject(h, "layout", ms_fp_layout_name(w->layout));
		}
		add_u64(o, "weights", x->nweights);
		add_u64(o, "bytes_per_gpu", x->bytes_per_gpu);
		add_u64(o, "excess_bytes_per_gpu", x->excess_bytes_per_gpu);
		cJSON_AddStringToObject(o, "example", x->example);
	}
	add_u64(root, "duplicate_weights", r->duplicate_weights);
	add_u64(root, "replicated_bytes", r->replicated_bytes);
	add_u64(root, "total_bytes_per_gpu", r->total_bytes_per_gpu);
	cJSON_AddNumberToObject(root, "peak_rank", r->peak_rank);
	od = cJSON_AddObjectToObject(root, "ondemand");
	if (!od)
		goto oom;
	add_u64(od, "total_bytes_per_gpu", r->ondemand_total_bytes_per_gpu);
	add_u64(od, "saving_bytes_per_gpu", r->ondemand_saving_per_gpu);
	if (r->train.present) {
		const struct ms_fp_train *t = &r->train;
		cJSON *tr = cJSON_AddObjectToObject(root, "train");

		if (!tr)
			goto oom;
		cJSON_AddStringToObject(tr, "from", t->from_lora ? "lora" : "adapter");
		cJSON_AddStringToObject(tr, "role", p->entries[t->entry].role);
		if (t->from_lora)
			cJSON_AddNumberToObject(tr, "r", p->train.lora_r);
		add_u64(tr, "modules", t->modules);
		add_u64(tr, "params", t->params);
		add_u64(tr, "params_per_gpu", t->params_per_gpu);
		cJSON_AddBoolToObject(tr, "params_resident", t->params_resident);
		cJSON_AddNumberToObject(tr, "bytes_per_param", t->per_param_bytes);
		add_u64(tr, "param_bytes_per_gpu", t->param_bytes_per_gpu);
		add_u64(tr, "grad_bytes_per_gpu", t->grad_bytes_per_gpu);
		add_u64(tr, "optimizer_bytes_per_gpu", t->optimizer_bytes_per_gpu);
		add_u64(tr, "bytes_per_gpu", t->bytes_per_gpu);
	} else {
		cJSON_AddNullToObject(root, "train");
	}
	if (!r->trainer.present && r->trainer.why[0]) {
		cJSON *tr = cJSON_AddObjectToObject(root, "trainer");

		if (!tr)
			goto oom;
		cJSON_AddStringToObject(tr, "error", r->trainer.why);
	}
	if (r->trainer.present) {
		const struct ms_fp_trainer *t = &r->trainer;
		cJSON *tr = cJSON_AddObjectToObject(root, "trainer");

		if (!tr)
			goto oom;
		cJSON_AddStringToObject(tr, "device", "cuda");
		add_u64(tr, "batch", t->batch);
		add_u64(tr, "seq_len", t->seq_len);
		cJSON_AddStringToObject(tr, "colwise", t->colwise_ondemand ? "on-demand" : "resident");
		for (int m = 0; m < 2; m++) {
			cJSON *o = cJSON_AddObjectToObject(tr, m ? "on-demand" : "resident");

			if (!o)
				goto oom;
			add_u64(o, "nvfp4_rowwise", t->mode[m].nvfp4_rowwise);
			add_u64(o, "nvfp4_colwise", t->mode[m].nvfp4_colwise);
			add_u64(o, "dense", t->mode[m].dense);
			add_u64(o, "lora", t->mode[m].lora);
			add_u64(o, "acts", t->mode[m].acts);
			add_u64(o, "scratch", t->mode[m].scratch);
			add_u64(o, "total", t->mode[m].total);
		}
		add_u64(tr, "total", t->mode[t->colwise_ondemand].total);
	}
	{
		static const char *const counted[] = {"weights", "lora_weights", "gradients",
						      "optimizer_state"};
		static const char *const not_counted[] = {"activations", "cuda_context",
							  "workspaces", "communication_buffers",
							  "fragmentation"};
		cJSON *a = cJSON_AddArrayToObject(root, "counted");
		cJSON *n = cJSON_AddArrayToObject(root, "not_counted");

		if (!a || !n)
			goto oom;
		for (size_t i = 0; i < (r->train.present ? 4u : 1u); i++)
			cJSON_AddItemToArray(a, cJSON_CreateString(counted[i]));
		for (size_t i = 1; !r->train.present && i < 4; i++)
			cJSON_AddItemToArray(n, cJSON_CreateString(counted[i]));
		for (size_t i = 0; i < sizeof(not_counted) / sizeof(not_counted[0]); i++)
			cJSON_AddItemToArray(n, cJSON_CreateString(not_counted[i]));
	}
	cJSON_AddBoolToObject(root, "over_budget", r->over_budget);
	text = cJSON_Print(root);
	if (!text)
		goto oom;
	ms_buf_puts(out, text);
	ms_buf_puts(out, "\n");
	if (out->oom)
		goto oom;
	goto out;
oom:
	rc = ms_err_nomem(err);
out:
	if (text)
		cJSON_free(text);
	cJSON_Delete(root);
	return rc;
}
