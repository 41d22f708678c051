/*
 * names.c: tensor name parsing (see names.h for the families).
 *
 * A name is split into its '.'-separated components. The tail says the role
 * (".weight", ".weight_scale_2", "lora_A.weight", Megatron's "weight7"), the
 * rest names the module, which is classified by the components it contains
 * ("experts" + number, "shared_expert", "self_attn", ...). Checks run from the
 * most specific family to the least, so "mlp.experts.7.gate_proj" is an
 * expert before it could be a dense MLP.
 */
#include "names.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* n separators make n + 1 components */
#define MAX_COMPS (MS_NAME_MAX + 1)

struct comp {
	uint16_t off;
	uint16_t len;
};

struct parse {
	const char *name;
	struct comp c[MAX_COMPS];
	size_t n;
};

static int ceq(const struct parse *p, size_t i, const char *s)
{
	size_t l = strlen(s);

	return i < p->n && p->c[i].len == l && !memcmp(p->name + p->c[i].off, s, l);
}

/* A non-empty all-digit string of len bytes that fits int32. */
static int parse_digits(const char *s, size_t len, int32_t *out)
{
	int64_t v = 0;

	if (len == 0 || len > 10)
		return 0;
	for (size_t k = 0; k < len; k++) {
		if (s[k] < '0' || s[k] > '9')
			return 0;
		v = v * 10 + (s[k] - '0');
	}
	if (v > INT32_MAX)
		return 0;
	if (out)
		*out = (int32_t)v;
	return 1;
}

static int cnum(const struct parse *p, size_t i, int32_t *out)
{
	return i < p->n && parse_digits(p->name + p->c[i].off, p->c[i].len, out);
}

static int ccontains(const struct parse *p, size_t i, const char *s)
{
	size_t l = strlen(s);
	const char *c = p->name + p->c[i].off;

	for (size_t k = 0; k + l <= p->c[i].len; k++)
		if (!memcmp(c + k, s, l))
			return 1;
	return 0;
}

static void set_proj(struct ms_name_info *out, const char *s, size_t len)
{
	if (len >= sizeof(out->proj))
		len = sizeof(out->proj) - 1;
	memcpy(out->proj, s, len);
	out->proj[len] = '\0';
}

static void set_proj_comp(struct ms_name_info *out, const struct parse *p,
			  size_t i)
{
	if (i < p->n)
		set_proj(out, p->name + p->c[i].off, p->c[i].len);
}

struct suffix {
	const char *s;
	enum ms_name_role role;
	uint8_t colwise, packed;
	uint8_t writes; /* NVFP4 formats that write it: bit f for format f */
};

#define W_MO (1u << 0) /* ModelOpt (MS_QUANT_FORMAT_MODELOPT) */
#define W_CT (1u << 1) /* compressed-tensors (MS_QUANT_FORMAT_COMPRESSED_TENSORS) */

/* The last component of a non-LoRA name, with its dot. The NVFP4
 * companions are also the names quant.c writes (ms_name_nvfp4_suffix), so
 * that what the writer names is what this parser reads. */
static const struct suffix role_suffixes[] = {
	{ ".weight", MS_NAME_ROLE_WEIGHT, 0, 0, W_MO },
	{ ".bias", MS_NAME_ROLE_BIAS, 0, 0, 0 },
	{ ".weight_packed", MS_NAME_ROLE_WEIGHT, 0, 1, W_CT },
	{ ".weight_scale", MS_NAME_ROLE_SCALE, 0, 0, W_MO | W_CT },
	{ ".weight_scale_2", MS_NAME_ROLE_SCALE2, 0, 0, W_MO },
	{ ".weight_global_scale", MS_NAME_ROLE_GLOBAL_SCALE, 0, 0, W_CT },
	{ ".input_scale", MS_NAME_ROLE_INPUT_SCALE, 0, 0, W_MO },
	{ ".input_global_scale", MS_NAME_ROLE_INPUT_SCALE, 0, 0, W_CT },
	{ ".weight_colwise", MS_NAME_ROLE_COLWISE, 1, 0, W_MO },
	{ ".weight_packed_colwise", MS_NAME_ROLE_COLWISE, 1, 1, W_CT },
	{ ".weight_colwise_packed", MS_NAME_ROLE_COLWISE, 1, 1, 0 },
	{ ".weight_colwise_scale", MS_NAME_ROLE_COLWISE_SCALE, 1, 0, W_MO },
	{ ".weight_scale_colwise", MS_NAME_ROLE_COLWISE_SCALE, 1, 0, W_CT },
	{ ".weight_colwise_scale_2", MS_NAME_ROLE_SCALE2, 1, 0, 0 },
	{ ".weight_scale_2_colwise", MS_NAME_ROLE_SCALE2, 1, 0, 0 },
	{ ".e_score_correction_bias", MS_NAME_ROLE_BIAS, 0, 0, 0 },
	{ ".expert_bias", MS_NAME_ROLE_BIAS, 0, 0, 0 },
	{ ".layer_norm_weight", MS_NAME_ROLE_WEIGHT, 0, 0, 0 },
	{ ".layer_norm_bias", MS_NAME_ROLE_BIAS, 0, 0, 0 },
};

const char *ms_name_nvfp4_suffix(enum ms_name_role role, unsigned format)
{
	for (size_t k = 0; format < 8 && k < sizeof(role_suffixes) / sizeof(role_suffixes[0]); k++)
		if (role_suffixes[k].role == role && (role_suffixes[k].writes & (1u << format)))
			return role_suffixes[k].s;
	return NULL;
}

/* Tails glued to a fused expert parameter ("gate_up_proj_bias",
 * "w13_weight_scale_2"); longest first so "_weight_scale_2" wins. */
static const struct suffix fused_suffixes[] = {
	{ "_weight_scale_2", MS_NAME_ROLE_SCALE2, 0, 0, 0 },
	{ "_weight_global_scale", MS_NAME_ROLE_GLOBAL_SCALE, 0, 0, 0 },
	{ "_input_global_scale", MS_NAME_ROLE_INPUT_SCALE, 0, 0, 0 },
	{ "_weight_packed", MS_NAME_ROLE_WEIGHT, 0, 1, 0 },
	{ "_weight_scale", MS_NAME_ROLE_SCALE, 0, 0, 0 },
	{ "_input_scale", MS_NAME_ROLE_INPUT_SCALE, 0, 0, 0 },
	{ "_scale_2", MS_NAME_ROLE_SCALE2, 0, 0, 0 },
	{ "_blocks", MS_NAME_ROLE_WEIGHT, 0, 1, 0 },
	{ "_scales", MS_NAME_ROLE_SCALE, 0, 0, 0 },
	{ "_weight", MS_NAME_ROLE_WEIGHT, 0, 0, 0 },
	{ "_scale", MS_NAME_ROLE_SCALE, 0, 0, 0 },
	{ "_bias", MS_NAME_ROLE_BIAS, 0, 0, 0 },
};

static const struct suffix *find_suffix(const struct parse *p, size_t i)
{
	for (size_t k = 0; k < sizeof(role_suffixes) / sizeof(role_suffixes[0]); k++)
		if (ceq(p, i, role_suffixes[k].s + 1))
			return &role_suffixes[k];
	return NULL;
}

/* Megatron's TE grouped linear names each expert's weight "weight<e>". */
static int megatron_expert_suffix(const struct parse *p, size_t i,
				  enum ms_name_role *role, int32_t *expert)
{
	const char *s = p->name + p->c[i].off;
	size_t skip;

	if (p->c[i].len > 6 && !memcmp(s, "weight", 6)) {
		*role = MS_NAME_ROLE_WEIGHT;
		skip = 6;
	} else if (p->c[i].len > 4 && !memcmp(s, "bias", 4)) {
		*role = MS_NAME_ROLE_BIAS;
		skip = 4;
	} else {
		return 0;
	}
	return parse_digits(s + skip, p->c[i].len - skip, expert);
}

/* The nearest component before i that is not a PEFT "base_layer" wrapper
 * (p->n when there is none). */
static size_t prev_real(const struct parse *p, size_t start, size_t i)
{
	while (i-- > start)
		if (!ceq(p, i, "base_layer"))
			return i;
	return p->n;
}

static int is_lora_comp(const struct parse *p, size_t i, enum ms_name_role *role)
{
	if (ceq(p, i, "lora_A") || ceq(p, i, "lora_embedding_A")) {
		*role = MS_NAME_ROLE_LORA_A;
		return 1;
	}
	if (ceq(p, i, "lora_B") || ceq(p, i, "lora_embedding_B")) {
		*role = MS_NAME_ROLE_LORA_B;
		return 1;
	}
	if (ceq(p, i, "lora_magnitude_vector")) {
		*role = MS_NAME_ROLE_OTHER;
		return 1;
	}
	return 0;
}

static int is_moe_container(const struct parse *p, size_t i)
{
	return ceq(p, i, "mlp") || ceq(p, i, "block_sparse_moe") ||
	       ceq(p, i, "feed_forward") || ceq(p, i, "moe") ||
	       ceq(p, i, "ffn");
}

static int is_attention(const struct parse *p, size_t i)
{
	return ceq(p, i, "self_attn") || ceq(p, i, "self_attention") ||
	       ceq(p, i, "attention") || ceq(p, i, "attn") ||
	       ceq(p, i, "cross_attn") || ceq(p, i, "cross_attention");
}

static int is_norm_comp(const struct parse *p, size_t i)
{
	return ccontains(p, i, "norm") || ceq(p, i, "ln_f") || ceq(p, i, "ln_1") ||
	       ceq(p, i, "ln_2") || ceq(p, i, "ln");
}

static int is_embed_comp(const struct parse *p, size_t i)
{
	return ceq(p, i, "embed_tokens") || ceq(p, i, "word_embeddings") ||
	       ceq(p, i, "wte") || ceq(p, i, "tok_embeddings") ||
	       ceq(p, i, "embeddings") || ceq(p, i, "embedding") ||
	       ceq(p, i, "embed");
}

/*
 * Classify the module components [b, e) of p. PEFT's "base_layer" wrappers
 * say nothing about the module and are skipped. out->expert carries in the
 * expert id of a Megatron "weight<e>" suffix.
 */
static void classify(const struct parse *p, size_t b, size_t e,
		     struct ms_name_info *out, int megatron_grouped,
		     int layer_norm_suffix)
{
	struct parse v;
	size_t m = 0;
	int32_t num, suffix_expert = out->expert;

	/* A view of just the module components, so indices are contiguous. */
	out->expert = -1;
	v.name = p->name;
	for (size_t k = b; k < e; k++)
		if (!ceq(p, k, "base_layer"))
			v.c[m++] = p->c[k];
	v.n = m;

	for (size_t k = 0; k + 1 < m; k++) {
		if ((ceq(&v, k, "layers") || ceq(&v, k, "layer") || ceq(&v, k, "h") ||
		     ceq(&v, k, "blocks")) && cnum(&v, k + 1, &num)) {
			out->layer = num;
			break;
		}
	}

	/* Routers: "router", the MoE block's "gate", Qwen2-MoE's gate of the
	 * shared expert. */
	for (size_t k = 0; k < m; k++) {
		if (ceq(&v, k, "shared_expert_gate") || ceq(&v, k, "router") ||
		    (ceq(&v, k, "gate") && k == m - 1 && k > 0 &&
		     is_moe_container(&v, k - 1))) {
			out->part = MS_NAME_PART_ROUTER;
			set_proj_comp(out, &v, k);
			return;
		}
	}
	for (size_t k = 0; k < m; k++) {
		if (ceq(&v, k, "shared_expert") || ceq(&v, k, "shared_experts") ||
		    ceq(&v, k, "shared_mlp")) {
			out->part = MS_NAME_PART_SHARED_EXPERT;
			if (k + 1 < m)
				set_proj_comp(out, &v, m - 1);
			return;
		}
	}
	for (size_t k = 0; k + 1 < m; k++) {
		if ((ceq(&v, k, "experts") || ceq(&v, k, "local_experts")) &&
		    cnum(&v, k + 1, &num)) {
			out->part = MS_NAME_PART_EXPERT;
			out->expert = num;
			if (k + 2 < m)
				set_proj_comp(out, &v, m - 1);
			return;
		}
	}
	for (size_t k = 0; k < m; k++) {
		if (!ceq(&v, k, "experts"))
			continue;
		if (suffix_expert >= 0) {
			/* Megatron "experts.linear_fc1.weight<e>" */
			out->part = MS_NAME_PART_EXPERT;
			out->expert = suffix_expert;
			if (k + 1 < m)
				set_proj_comp(out, &v, m - 1);
			return;
		}
		out->part = MS_NAME_PART_EXPERTS_FUSED;
		if (k + 1 < m)
			set_proj_comp(out, &v, m - 1);
		else if (megatron_grouped == 1)
			set_proj(out, "linear_fc1", 10);
		else if (megatron_grouped == 2)
			set_proj(out, "linear_fc2", 10);
		return;
	}
	for (size_t k = 0; k < m; k++) {
		if (!is_attention(&v, k))
			continue;
		if (layer_norm_suffix) {
			out->part = MS_NAME_PART_NORM;
			set_proj(out, "input_layernorm", 15);
		} else if (k + 1 < m && is_norm_comp(&v, m - 1)) {
			out->part = MS_NAME_PART_NORM;
			set_proj_comp(out, &v, m - 1);
		} else {
			out->part = MS_NAME_PART_ATTN;
			if (k + 1 < m)
				set_proj_comp(out, &v, m - 1);
		}
		return;
	}
	if (m > 0 && is_norm_comp(&v, m - 1)) {
		out->part = MS_NAME_PART_NORM;
		set_proj_comp(out, &v, m - 1);
		return;
	}
	for (size_t k = m; k-- > 0;) {
		if (is_embed_comp(&v, k)) {
			out->part = MS_NAME_PART_EMBED;
			set_proj_comp(out, &v, k);
			return;
		}
	}
	for (size_t k = 0; k < m; k++) {
		if (ceq(&v, k, "lm_head") || ceq(&v, k, "output_layer") ||
		    (m == 1 && ceq(&v, k, "output"))) {
			out->part = MS_NAME_PART_LM_HEAD;
			set_proj_comp(out, &v, k);
			return;
		}
	}
	for (size_t k = 0; k + 1 < m; k++) {
		if (is_moe_container(&v, k)) {
			if (layer_norm_suffix) {
				out->part = MS_NAME_PART_NORM;
				set_proj(out, "pre_mlp_layernorm", 17);
			} else {
				out->part = MS_NAME_PART_MLP;
				set_proj_comp(out, &v, m - 1);
			}
			return;
		}
	}
	out->part = MS_NAME_PART_OTHER;
	if (m > 0)
		set_proj_comp(out, &v, m - 1);
}

int ms_name_parse(const char *name, struct ms_name_info *out)
{
	struct parse p;
	size_t len, start = 0, end, lora = 0, nest = 0;
	enum ms_name_role role = MS_NAME_ROLE_OTHER;
	int32_t mexp = -1;
	int megatron_grouped = 0, layer_norm_suffix = 0, is_lora = 0;
	const struct suffix *suf;

	if (!out)
		return MS_EINVAL;
	memset(out, 0, sizeof(*out));
	out->layer = -1;
	out->expert = -1;
	out->lora_nesting = -1;
	if (!name || !*name)
		return MS_EINVAL;
	len = strnlen(name, MS_NAME_MAX + 1);
	if (len > MS_NAME_MAX)
		return MS_EINVAL;

	p.name = name;
	p.n = 0;
	for (size_t i = 0, b = 0; i <= len; i++) {
		if (i == len || name[i] == '.') {
			p.c[p.n].off = (uint16_t)b;
			p.c[p.n].len = (uint16_t)(i - b);
			p.n++;
			b = i + 1;
		}
	}
	if (ceq(&p, 0, "base_model") && ceq(&p, 1, "model") && p.n > 2) {
		out->peft = 1;
		start = 2;
	}
	end = p.n;

	for (size_t i = p.n; i-- > start;) {
		if (is_lora_comp(&p, i, &role)) {
			lora = i;
			is_lora = 1;
			break;
		}
	}
	if (is_lora) {
		end = lora;
		while (end > start && ceq(&p, end - 1, "base_layer")) {
			nest++;
			end--;
		}
		out->role = role;
		out->lora_nesting = (int32_t)nest;
		out->module_len = lora > 0 ? (uint32_t)(p.c[lora - 1].off +
							p.c[lora - 1].len) : 0;
	} else if ((suf = find_suffix(&p, p.n - 1)) != NULL && p.n - 1 > start) {
		out->role = suf->role;
		out->colwise = suf->colwise;
		out->packed = suf->packed;
		end = p.n - 1;
		layer_norm_suffix = ccontains(&p, p.n - 1, "layer_norm");
		out->module_len = (uint32_t)(p.c[end - 1].off + p.c[end - 1].len);
	} else if (p.n - 1 > start &&
		   megatron_expert_suffix(&p, p.n - 1, &role, &mexp)) {
		out->role = role;
		end = p.n - 1;
		out->module_len = (uint32_t)(p.c[end - 1].off + p.c[end - 1].len);
		if (ceq(&p, end - 1, "experts")) {
			/* grouped "experts.weight1" (fc1) / "weight2" (fc2) */
			megatron_grouped = mexp == 1 ? 1 : mexp == 2 ? 2 : 0;
			mexp = -1;
			out->module_len = (uint32_t)len;
		}
		out->expert = mexp;
	} else if (p.n - 1 > start && ceq(&p, prev_real(&p, start, p.n - 1), "experts")) {
		/* A fused expert parameter: "experts.gate_up_proj[_bias]". */
		const char *s = name + p.c[p.n - 1].off;
		size_t l = p.c[p.n - 1].len;

		out->role = MS_NAME_ROLE_WEIGHT;
		for (size_t k = 0; k < sizeof(fused_suffixes) / sizeof(fused_suffixes[0]); k++) {
			size_t sl = strlen(fused_suffixes[k].s);

			if (l > sl && !memcmp(s + l - sl, fused_suffixes[k].s, sl)) {
				out->role = fused_suffixes[k].role;
				out->packed = fused_suffixes[k].packed;
				l -= sl;
				break;
			}
		}
		out->module_len = (uint32_t)(p.c[p.n - 1].off + l);
		classify(&p, start, p.n - 1, out, 0, 0);
		set_proj(out, s, l);
		return MS_OK;
	} else {
		out->role = MS_NAME_ROLE_OTHER;
		out->module_len = (uint32_t)len;
	}

	classify(&p, start, end, out, megatron_grouped, layer_norm_suffix);
	/* Fused LoRA does not name its parameter; say nothing rather than
	 * guess (the caller resolves it from the nesting). */
	if (is_lora && out->part == MS_NAME_PART_EXPERTS_FUSED &&
	    ceq(&p, prev_real(&p, start, end), "experts"))
		out->proj[0] = '\0';
	return MS_OK;
}

const char *ms_name_part_str(enum ms_name_part part)
{
	switch (part) {
	case MS_NAME_PART_OTHER: return "other";
	case MS_NAME_PART_ATTN: return "attn";
	case MS_NAME_PART_EXPERT: return "expert";
	case MS_NAME_PART_EXPERTS_FUSED: return "experts";
	case MS_NAME_PART_SHARED_EXPERT: return "shared_expert";
	case MS_NAME_PART_ROUTER: return "router";
	case MS_NAME_PART_NORM: return "norm";
	case MS_NAME_PART_EMBED: return "embed";
	case MS_NAME_PART_LM_HEAD: return "lm_head";
	case MS_NAME_PART_MLP: return "mlp";
	case MS_NAME_PART_COUNT: break;
	}
	return "?";
}

const char *ms_name_role_str(enum ms_name_role role)
{
	switch (role) {
	case MS_NAME_ROLE_OTHER: return "other";
	case MS_NAME_ROLE_WEIGHT: return "weight";
	case MS_NAME_ROLE_BIAS: return "bias";
	case MS_NAME_ROLE_LORA_A: return "lora_A";
	case MS_NAME_ROLE_LORA_B: return "lora_B";
	case MS_NAME_ROLE_SCALE: return "scale";
	case MS_NAME_ROLE_SCALE2: return "scale_2";
	case MS_NAME_ROLE_GLOBAL_SCALE: return "global_scale";
	case MS_NAME_ROLE_INPUT_SCALE: return "input_scale";
	case MS_NAME_ROLE_COLWISE: return "colwise";
	case MS_NAME_ROLE_COLWISE_SCALE: return "colwise_scale";
	case MS_NAME_ROLE_COUNT: break;
	}
	return "?";
}

int ms_name_is_routed_expert(const struct ms_name_info *info)
{
	return info->part == MS_NAME_PART_EXPERT ||
	       info->part == MS_NAME_PART_EXPERTS_FUSED;
}

static size_t put(char *buf, size_t l, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Append to buf at l, keeping it NUL-terminated and l within cap: the
 * fields of a description (at most ~130 bytes) always fit the caller's
 * buffer, but a cut is safe too. */
static size_t put(char *buf, size_t l, size_t cap, const char *fmt, ...)
{
	va_list ap;
	int w;

	if (l + 1 >= cap)
		return l;
	va_start(ap, fmt);
	w = vsnprintf(buf + l, cap - l, fmt, ap);
	va_end(ap);
	if (w < 0)
		return l;
	return (size_t)w < cap - l ? l + (size_t)w : cap - 1;
}

int ms_name_info_str(const struct ms_name_info *info, char *buf, size_t n)
{
	char t[256];
	size_t l = 0;

	t[0] = '\0';
	if (info->layer >= 0)
		l = put(t, l, sizeof(t), "layer %d ", (int)info->layer);
	if (info->part == MS_NAME_PART_EXPERT && info->expert >= 0)
		l = put(t, l, sizeof(t), "expert %d ", (int)info->expert);
	else
		l = put(t, l, sizeof(t), "%s ", ms_name_part_str(info->part));
	if (info->proj[0] && strcmp(info->proj, ms_name_part_str(info->part)))
		l = put(t, l, sizeof(t), "%.*s ", (int)sizeof(info->proj), info->proj);
	if (info->lora_nesting >= 0 && info->role == MS_NAME_ROLE_OTHER)
		l = put(t, l, sizeof(t), "lora_magnitude ");
	else if (info->role != MS_NAME_ROLE_OTHER)
		l = put(t, l, sizeof(t), "%s ", ms_name_role_str(info->role));
	if (info->colwise && info->role != MS_NAME_ROLE_COLWISE &&
	    info->role != MS_NAME_ROLE_COLWISE_SCALE)
		l = put(t, l, sizeof(t), "colwise ");
	if (info->packed)
		l = put(t, l, sizeof(t), "packed ");
	if (info->lora_nesting > 0 ||
	    (info->lora_nesting == 0 && info->part == MS_NAME_PART_EXPERTS_FUSED))
		l = put(t, l, sizeof(t), "nesting %d ", (int)info->lora_nesting);
	while (l > 0 && t[l - 1] == ' ')
		t[--l] = '\0';
	return snprintf(buf, n, "%s", t);
}

int ms_name_quantizable(const char *name, const struct ms_name_info *info, enum ms_dtype dt,
			uint32_t ndim, const uint64_t *shape)
{
	if (shape && ms_name_fused_experts(name, dt, ndim, shape))
		return 1;
	if ((dt != MS_DTYPE_BF16 && dt != MS_DTYPE_F16 && dt != MS_DTYPE_F32) || ndim != 2 ||
	    !ms_str_ends_with(name, ".weight") || strlen(name) <= 7 ||
	    info->role != MS_NAME_ROLE_WEIGHT)
		return 0;
	return info->part == MS_NAME_PART_ATTN || info->part == MS_NAME_PART_EXPERT ||
	       info->part == MS_NAME_PART_SHARED_EXPERT || info->part == MS_NAME_PART_MLP;
}

int ms_name_fused_experts(const char *name, enum ms_dtype dt, uint32_t ndim,
			  const uint64_t *shape)
{
	if ((dt != MS_DTYPE_BF16 && dt != MS_DTYPE_F16 && dt != MS_DTYPE_F32) || ndim != 3 ||
	    !name || !shape || !shape[0] || !shape[1] || !shape[2])
		return 0;
	if (ms_str_ends_with(name, ".experts.gate_up_proj") && shape[1] % 2 == 0)
		return 1;
	if (ms_str_ends_with(name, ".experts.down_proj"))
		return 2;
	return 0;
}
