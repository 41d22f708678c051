/*
 * t_shard.c: expert-parallel sharding against independent truth.
 *
 * The LoRA checks rebuild each expert's delta from the shards alone
 * (B_e @ A_e * alpha / r, in double, with the expert's global id computed
 * here from the placement formula) and compare it with PEFT's own
 * get_delta_weight in peft_delta_truth.safetensors. Round trips are
 * compared by state digest (through checkpoint.c, not shard.c) and bytes.
 * Hostile inputs are made by copying a good set and breaking one thing.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>

#include "test.h"
#include "shard.h"

#define FX_E8 "peft/qwen3moe-E8-r4"
#define FX_E6 "peft/qwen3moe-E6-r3"
#define FX_MIX "peft/mixtral-perexpert-E6-r3"

/* snprintf for paths; a path that does not fit is cut (and then not found) */
static void bprintf(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void bprintf(char *buf, size_t n, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, n, fmt, ap);
	va_end(ap);
}

static char *fx(const char *rel)
{
	static char buf[4][1024];
	static int k;

	k = (k + 1) % 4;
	bprintf(buf[k], sizeof(buf[k]), "%s/%s", T_FIXTURES, rel);
	return buf[k];
}

static char *tmp(const char *rel)
{
	static char buf[4][1024];
	static int k;

	k = (k + 1) % 4;
	bprintf(buf[k], sizeof(buf[k]), "%s/%s", T_TMP, rel);
	return buf[k];
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return system(cmd);
}

/* State digest through checkpoint.c only. */
static int digest_of(const char *path, char out[MS_STATE_DIGEST_LEN])
{
	struct ms_ckpt *c;
	struct ms_err err = { 0 };
	int rc;

	if ((rc = ms_ckpt_open(path, &c, &err)) != MS_OK) {
		fprintf(stderr, "%s\n", err.msg);
		return rc;
	}
	rc = ms_ckpt_hash(c, 0, 0, &err);
	if (rc == MS_OK)
		rc = ms_state_digest(c->tensors, c->ntensors, out, &err);
	ms_ckpt_close(c);
	return rc;
}

static int same_file(const char *a, const char *b)
{
	return sh("cmp -s '%s' '%s'", a, b) == 0;
}

/* The placement, computed here from its definition. */
static void want_ids(const char *placement, uint32_t e, uint32_t n, uint32_t rank,
		     uint32_t *ids, uint32_t *l)
{
	*l = e / n;
	for (uint32_t i = 0; i < *l; i++)
		ids[i] = placement && !strcmp(placement, "round-robin") ? i * n + rank
								       : rank * (e / n) + i;
}

static int split(const char *src, const char *dir, uint32_t n, const char *placement,
		 struct ms_err *err)
{
	struct ms_shard_opts o = { .ep_size = n, .placement = placement, .force = 1 };
	struct ms_shard_result *r = NULL;
	int rc = ms_shard_split(src, dir, &o, &r, err);

	ms_shard_result_free(r);
	return rc;
}

static double val(const struct ms_tensor *t, uint64_t i)
{
	double v = NAN;

	ms_dtype_get_f64(t->dtype, t->data, i, &v);
	return v;
}

static double json_num(const char *path, const char *key)
{
	char *text = NULL;
	size_t len;
	struct ms_err err = { 0 };
	cJSON *root;
	double v = NAN;

	if (ms_file_read(path, 1 << 20, &text, &len, &err) != MS_OK)
		return NAN;
	root = cJSON_Parse(text);
	if (cJSON_IsNumber(cJSON_GetObjectItem(root, key)))
		v = cJSON_GetObjectItem(root, key)->valuedouble;
	cJSON_Delete(root);
	ms_free(text);
	return v;
}

static char *shard_path(const char *dir, uint32_t rank, uint32_t n, const char *stem)
{
	static char buf[1024];

	bprintf(buf, sizeof(buf), "%s/%s-ep%05u-of-%05u.safetensors", dir, stem, rank, n);
	return buf;
}

/* The parameter the manifest gives tensor name. */
static int manifest_param(const char *dir, const char *name, char *out, size_t n)
{
	char path[1024], *text = NULL;
	size_t len;
	struct ms_err err = { 0 };
	cJSON *root, *t;
	int found = 0;

	bprintf(path, sizeof(path), "%s/ep_manifest.json", dir);
	if (ms_file_read(path, 64 << 20, &text, &len, &err) != MS_OK)
		return 0;
	root = cJSON_Parse(text);
	cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tensors")) {
		if (!strcmp(cJSON_GetObjectItem(t, "name")->valuestring, name) &&
		    cJSON_GetObjectItem(t, "param")) {
			bprintf(out, n, "%s", cJSON_GetObjectItem(t, "param")->valuestring);
			found = 1;
		}
	}
	cJSON_Delete(root);
	ms_free(text);
	return found;
}

/*
 * Fused LoRA: every expert's delta rebuilt from its rank's shard equals
 * PEFT's delta of the global expert the placement puts there; replicated
 * tensors are the source's bytes.
 */
static int check_fused(const char *fixture, uint32_t n, const char *placement)
{
	char adir[1024], dir[1024], path[1024];
	struct ms_st_file *truth = NULL, *src = NULL;
	struct ms_err err = { 0 };
	double alpha;
	uint32_t e = 0;

	bprintf(adir, sizeof(adir), "%s/adapter", fx(fixture));
	bprintf(dir, sizeof(dir), "%s/fused-%s-%u-%s", T_TMP, strchr(fixture, '/') + 1, n,
		 placement ? placement : "contiguous");
	T_ASSERT_MSG(split(adir, dir, n, placement, &err) == MS_OK, "%s", err.msg);
	bprintf(path, sizeof(path), "%s/peft_delta_truth.safetensors", fx(fixture));
	T_ASSERT(ms_st_open(path, &truth, &err) == MS_OK);
	bprintf(path, sizeof(path), "%s/adapter_model.safetensors", adir);
	T_ASSERT(ms_st_open(path, &src, &err) == MS_OK);
	bprintf(path, sizeof(path), "%s/adapter_config.json", adir);
	alpha = json_num(path, "lora_alpha");
	T_ASSERT(!isnan(alpha));

	for (uint32_t rank = 0; rank < n; rank++) {
		struct ms_st_file *sf;
		uint32_t ids[64], l;
		char want_meta[512] = "";
		size_t k = 0;

		want_ids(placement, truth->tensors[0].shape[0], n, rank, ids, &l);
		T_ASSERT_MSG(ms_st_open(shard_path(dir, rank, n, "adapter_model"), &sf, &err) == MS_OK,
			     "%s", err.msg);
		for (uint32_t i = 0; i < l; i++)
			k += (size_t)snprintf(want_meta + k, sizeof(want_meta) - k, i ? ",%u" : "%u",
					      ids[i]);
		T_ASSERT_STR(ms_st_meta_get(sf, "msinv.ep.experts"), want_meta);
		T_ASSERT_STR(ms_st_meta_get(sf, "format"), "pt");
		for (size_t ti = 0; ti < truth->ntensors; ti++) {
			const struct ms_tensor *tt = &truth->tensors[ti];
			const char *sep = strstr(tt->name, "::");
			char wrapper[512], an[600], bn[600], param[512];
			const struct ms_tensor *a, *b, *a0;
			uint64_t out, in, r;

			T_ASSERT(sep);
			bprintf(wrapper, sizeof(wrapper), "%.*s", (int)(sep - tt->name), tt->name);
			bprintf(an, sizeof(an), "%s.lora_A.weight", wrapper);
			bprintf(bn, sizeof(bn), "%s.lora_B.weight", wrapper);
			e = (uint32_t)tt->shape[0];
			out = tt->shape[1];
			in = tt->shape[2];
			a0 = ms_st_find(src, an);
			T_ASSERT(a0 && a0->shape[0] % e == 0);
			r = a0->shape[0] / e;
			a = ms_st_find(sf, an);
			b = ms_st_find(sf, bn);
			T_ASSERT_MSG(a && b, "rank %u lacks %s", rank, wrapper);
			T_ASSERT(a->shape[0] == l * r && a->shape[1] == in);
			T_ASSERT(b->shape[0] == out && b->shape[1] == r * l);
			/* the manifest names the parameter PEFT adapted */
			T_ASSERT(manifest_param(dir, an, param, sizeof(param)));
			T_ASSERT_MSG(strlen(param) > strlen(sep + 2) &&
					     !strcmp(param + strlen(param) - strlen(sep + 2), sep + 2),
				     "%s: manifest says %s, PEFT %s", an, param, sep + 2);
			for (uint32_t le = 0; le < l; le++) {
				uint32_t g = ids[le];

				for (uint64_t o = 0; o < out; o++)
					for (uint64_t i = 0; i < in; i++) {
						double d = 0, want;

						for (uint64_t kk = 0; kk < r; kk++)
							d += val(b, o * r * l + kk * l + le) *
							     val(a, (le * r + kk) * in + i);
						d *= alpha / (double)r;
						want = val(tt, ((uint64_t)g * out + o) * in + i);
						T_ASSERT_MSG(fabs(d - want) <= 1e-6 + 1e-5 * fabs(want),
							     "%s expert %u (rank %u local %u) [%llu,%llu]: "
							     "%g != %g", tt->name, g, rank, le,
							     (unsigned long long)o,
							     (unsigned long long)i, d, want);
					}
			}
		}
		/* everything that is not fused expert LoRA is the source's bytes */
		for (size_t i = 0; i < src->ntensors; i++) {
			const struct ms_tensor *x = &src->tensors[i], *y;

			if (strstr(x->name, ".experts.lora_") || strstr(x->name, ".experts.base_layer."))
				continue;
			y = ms_st_find(sf, x->name);
			T_ASSERT_MSG(y && y->nbytes == x->nbytes && !memcmp(y->data, x->data, x->nbytes),
				     "rank %u: replicated tensor %s", rank, x->name);
		}
		T_ASSERT_EQ_INT(sf->ntensors, src->ntensors);
		ms_st_close(sf);
	}
	ms_st_close(truth);
	ms_st_close(src);
	return 0;
}

static int test_fused_deltas_e8(void)
{
	static const uint32_t ns[] = { 1, 2, 4, 8 };

	for (size_t i = 0; i < 4; i++) {
		if (check_fused(FX_E8, ns[i], "contiguous") || check_fused(FX_E8, ns[i], "round-robin"))
			return 1;
	}
	return 0;
}

/* E=6, r=3 (r=2 on one wrapper by rank_pattern), target_parameters saved in
 * the reverse of the nesting order. */
static int test_fused_deltas_e6(void)
{
	static const uint32_t ns[] = { 1, 2, 3, 6 };

	for (size_t i = 0; i < 4; i++) {
		if (check_fused(FX_E6, ns[i], "contiguous") || check_fused(FX_E6, ns[i], "round-robin"))
			return 1;
	}
	return 0;
}

/* Per-expert LoRA: each expert's A/B only on its rank, deltas as PEFT's. */
static int check_per_expert(uint32_t n, const char *placement)
{
	char adir[1024], dir[1024], path[1024];
	struct ms_st_file *truth = NULL, *sf[8];
	struct ms_err err = { 0 };
	double alpha;

	bprintf(adir, sizeof(adir), "%s/adapter", fx(FX_MIX));
	bprintf(dir, sizeof(dir), "%s/perexp-%u-%s", T_TMP, n, placement);
	T_ASSERT_MSG(split(adir, dir, n, placement, &err) == MS_OK, "%s", err.msg);
	bprintf(path, sizeof(path), "%s/peft_delta_truth.safetensors", fx(FX_MIX));
	T_ASSERT(ms_st_open(path, &truth, &err) == MS_OK);
	bprintf(path, sizeof(path), "%s/adapter_config.json", adir);
	alpha = json_num(path, "lora_alpha");
	for (uint32_t rank = 0; rank < n; rank++)
		T_ASSERT(ms_st_open(shard_path(dir, rank, n, "adapter_model"), &sf[rank], &err) == MS_OK);
	for (size_t ti = 0; ti < truth->ntensors; ti++) {
		const struct ms_tensor *tt = &truth->tensors[ti];
		const char *sep = strstr(tt->name, "::"), *ex = strstr(tt->name, ".experts.");
		char an[600], bn[600];
		int g = -1, owner = -1;

		T_ASSERT(sep && ex && sscanf(ex, ".experts.%d.", &g) == 1);
		for (uint32_t rank = 0; rank < n; rank++) {
			uint32_t ids[64], l;

			want_ids(placement, 6, n, rank, ids, &l);
			for (uint32_t i = 0; i < l; i++)
				if (ids[i] == (uint32_t)g)
					owner = (int)rank;
		}
		T_ASSERT(owner >= 0);
		bprintf(an, sizeof(an), "%.*s.lora_A.weight", (int)(sep - tt->name), tt->name);
		bprintf(bn, sizeof(bn), "%.*s.lora_B.weight", (int)(sep - tt->name), tt->name);
		for (uint32_t rank = 0; rank < n; rank++) {
			const struct ms_tensor *a = ms_st_find(sf[rank], an), *b = ms_st_find(sf[rank], bn);
			uint64_t r, out = tt->shape[0], in = tt->shape[1];

			if (rank != (uint32_t)owner) {
				T_ASSERT_MSG(!a && !b, "%s on rank %u, owner %d", an, rank, owner);
				continue;
			}
			T_ASSERT(a && b);
			r = a->shape[0];
			for (uint64_t o = 0; o < out; o++)
				for (uint64_t i = 0; i < in; i++) {
					double d = 0, want = val(tt, o * in + i);

					for (uint64_t k = 0; k < r; k++)
						d += val(b, o * r + k) * val(a, k * in + i);
					d *= alpha / (double)r;
					T_ASSERT_MSG(fabs(d - want) <= 1e-6 + 1e-5 * fabs(want), "%s: %g != %g",
						     tt->name, d, want);
				}
		}
	}
	for (uint32_t rank = 0; rank < n; rank++)
		ms_st_close(sf[rank]);
	ms_st_close(truth);
	return 0;
}

static int test_per_expert_deltas(void)
{
	return check_per_expert(1, "contiguous") || check_per_expert(2, "round-robin") ||
	       check_per_expert(3, "contiguous") || check_per_expert(6, "round-robin");
}

/* merge(split(A, N)) is A, for every N and placement, by digest and bytes;
 * reshard(split(A, N), M) is split(A, M), byte for byte. */
static int roundtrip(const char *src_rel, const char *stem, uint32_t n, const char *placement,
		     const char *const *files, size_t nfiles)
{
	char dir[1024], mdir[1024], want[MS_STATE_DIGEST_LEN], got[MS_STATE_DIGEST_LEN];
	struct ms_shard_opts o = { .force = 1 };
	struct ms_shard_result *res = NULL;
	struct ms_err err = { 0 };

	bprintf(dir, sizeof(dir), "%s/rt-%s-%u-%s", T_TMP, stem, n, placement);
	bprintf(mdir, sizeof(mdir), "%s.merged", dir);
	for (char *p = dir + strlen(T_TMP) + 1; *p; p++)
		if (*p == '/')
			*p = '_';
	bprintf(mdir, sizeof(mdir), "%s.merged", dir);
	T_ASSERT_MSG(split(fx(src_rel), dir, n, placement, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_MSG(ms_shard_merge(dir, mdir, &o, &res, &err) == MS_OK, "%s", err.msg);
	T_ASSERT(digest_of(fx(src_rel), want) == MS_OK);
	T_ASSERT(digest_of(mdir, got) == MS_OK);
	T_ASSERT_STR(got, want);
	T_ASSERT_STR(res->source_digest, want);
	for (size_t i = 0; i < nfiles; i++) {
		char a[1024], b[1024];

		bprintf(a, sizeof(a), "%s/%s", fx(src_rel), files[i]);
		bprintf(b, sizeof(b), "%s/%s", mdir, files[i]);
		T_ASSERT_MSG(same_file(a, b), "%s differs after merge", b);
	}
	ms_shard_result_free(res);
	return 0;
}

static int test_merge_roundtrip_adapters(void)
{
	static const char *const files[] = { "adapter_model.safetensors", "adapter_config.json" };
	static const uint32_t ns[] = { 1, 2, 4, 8 };

	for (size_t i = 0; i < 4; i++)
		for (int p = 0; p < 2; p++)
			if (roundtrip(FX_E8 "/adapter", "e8", ns[i], p ? "round-robin" : "contiguous",
				      files, 2))
				return 1;
	return roundtrip(FX_E6 "/adapter", "e6", 3, "round-robin", files, 2) ||
	       roundtrip(FX_E6 "/adapter", "e6", 6, "contiguous", files, 2) ||
	       roundtrip(FX_MIX "/adapter", "mix", 2, "contiguous", files, 2) ||
	       roundtrip(FX_MIX "/adapter", "mix", 3, "round-robin", files, 2);
}

static int test_merge_roundtrip_checkpoints(void)
{
	static const char *const one[] = { "model.safetensors", "config.json" };
	static const char *const two[] = { "model-00001-of-00002.safetensors",
					   "model-00002-of-00002.safetensors", "config.json" };

	return roundtrip("hf/qwen3moe", "q", 4, "round-robin", one, 2) ||
	       roundtrip("hf/qwen3moe", "q", 8, "contiguous", one, 2) ||
	       roundtrip("hf/qwen3moe-sharded", "qs", 2, "contiguous", two, 3) ||
	       roundtrip("hf/mixtral", "m", 4, "contiguous", one, 2) ||
	       roundtrip("hf/mixtral-sharded", "ms", 8, "round-robin", two, 3) ||
	       roundtrip(FX_E8 "/base", "b8", 2, "round-robin", one, 2) ||
	       roundtrip(FX_E6 "/base", "b6", 3, "contiguous", one, 2);
}

/* A base checkpoint's shard: its experts' tensors, every replicated one. */
static int test_checkpoint_shard_contents(void)
{
	struct ms_st_file *src, *sf;
	struct ms_err err = { 0 };
	char dir[1024];

	bprintf(dir, sizeof(dir), "%s/ck-contents", T_TMP);
	T_ASSERT(split(fx("hf/qwen3moe"), dir, 4, "round-robin", &err) == MS_OK);
	T_ASSERT(ms_st_open(fx("hf/qwen3moe/model.safetensors"), &src, &err) == MS_OK);
	for (uint32_t rank = 0; rank < 4; rank++) {
		size_t want = 0;

		T_ASSERT(ms_st_open(shard_path(dir, rank, 4, "model"), &sf, &err) == MS_OK);
		for (size_t i = 0; i < src->ntensors; i++) {
			const struct ms_tensor *x = &src->tensors[i], *y = ms_st_find(sf, x->name);
			const char *ex = strstr(x->name, ".experts.");
			int e;

			if (ex && sscanf(ex, ".experts.%d.", &e) == 1 && (uint32_t)e % 4 != rank) {
				T_ASSERT_MSG(!y, "rank %u holds %s", rank, x->name);
				continue;
			}
			want++;
			T_ASSERT_MSG(y && !memcmp(y->data, x->data, x->nbytes), "rank %u: %s", rank,
				     x->name);
		}
		T_ASSERT_EQ_INT(sf->ntensors, want);
		T_ASSERT_STR(ms_st_meta_get(sf, "msinv.ep.placement"), "round-robin");
		ms_st_close(sf);
	}
	ms_st_close(src);
	return 0;
}

static int test_reshard_equals_split(void)
{
	static const struct { uint32_t n; const char *p; uint32_t m; const char *q; } cases[] = {
		{ 2, "contiguous", 4, "contiguous" },
		{ 8, "contiguous", 2, "round-robin" },
		{ 1, "round-robin", 8, "round-robin" },
	};
	static const char *const srcs[] = { FX_E8 "/adapter", "hf/qwen3moe-sharded" };

	for (size_t s = 0; s < 2; s++)
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			char a[1024], b[1024], c[1024];
			struct ms_shard_opts o = { .ep_size = cases[i].m, .placement = cases[i].q };
			struct ms_shard_result *res = NULL;
			struct ms_err err = { 0 };
			const char *stem = s ? "model" : "adapter_model";

			bprintf(a, sizeof(a), "%s/rs%zu-%zu-from", T_TMP, s, i);
			bprintf(b, sizeof(b), "%s/rs%zu-%zu-resharded", T_TMP, s, i);
			bprintf(c, sizeof(c), "%s/rs%zu-%zu-direct", T_TMP, s, i);
			T_ASSERT(split(fx(srcs[s]), a, cases[i].n, cases[i].p, &err) == MS_OK);
			T_ASSERT_MSG(ms_shard_reshard(a, b, &o, &res, &err) == MS_OK, "%s", err.msg);
			T_ASSERT(split(fx(srcs[s]), c, cases[i].m, cases[i].q, &err) == MS_OK);
			for (uint32_t r = 0; r < cases[i].m; r++) {
				char x[1024];

				bprintf(x, sizeof(x), "%s", shard_path(b, r, cases[i].m, stem));
				T_ASSERT_MSG(same_file(x, shard_path(c, r, cases[i].m, stem)),
					     "%s differs from a direct split", x);
				T_ASSERT_EQ_INT(res->files[r].rank, r);
			}
			bprintf(a, sizeof(a), "%s/ep_manifest.json", b);
			bprintf(b, sizeof(b), "%s/ep_manifest.json", c);
			T_ASSERT(same_file(a, b));
			ms_shard_result_free(res);
		}
	return 0;
}

/* ---- grouped tensors and NVFP4 companions, on a synthetic checkpoint ----- */

#define GE 6

static int write_grouped(const char *path)
{
	struct ms_st_writer *w;
	struct ms_err err = { 0 };
	static uint16_t gate_up[GE * 8 * 4], down[GE * 4 * 4], router[GE * 4];
	static uint8_t packed[GE][4 * 4], scale[GE][4];
	static float s2[GE];
	uint64_t s_gu[3] = { GE, 8, 4 }, s_d[3] = { GE, 4, 4 }, s_r[2] = { GE, 4 };
	uint64_t s_p[2] = { 4, 4 }, s_s[2] = { 4, 1 }, s_e[1] = { GE };
	char name[128];

	for (size_t i = 0; i < sizeof(gate_up) / 2; i++)
		gate_up[i] = (uint16_t)(0x3c00 + i * 7);
	for (size_t i = 0; i < sizeof(down) / 2; i++)
		down[i] = (uint16_t)(0x4000 + i * 13);
	for (size_t i = 0; i < sizeof(router) / 2; i++)
		router[i] = (uint16_t)i;
	for (int e = 0; e < GE; e++) {
		for (int i = 0; i < 16; i++)
			packed[e][i] = (uint8_t)(e * 16 + i);
		for (int i = 0; i < 4; i++)
			scale[e][i] = (uint8_t)(0x30 + e + i);
		s2[e] = 0.01f * (float)(e + 1);
	}
	T_ASSERT(ms_st_writer_new(path, 1, &w, &err) == MS_OK);
	T_ASSERT(ms_st_writer_meta(w, "format", "pt", &err) == MS_OK);
	T_ASSERT(ms_st_writer_add(w, "model.layers.0.mlp.experts.gate_up_proj", MS_DTYPE_BF16, 3,
				  s_gu, gate_up, &err) == MS_OK);
	T_ASSERT(ms_st_writer_add(w, "model.layers.0.mlp.experts.down_proj", MS_DTYPE_BF16, 3, s_d,
				  down, &err) == MS_OK);
	T_ASSERT(ms_st_writer_add(w, "model.layers.0.mlp.gate.weight", MS_DTYPE_BF16, 2, s_r, router,
				  &err) == MS_OK);
	/* fused NVFP4 companions: one tensor scale per expert, and one input
	 * scale shared by all of them */
	T_ASSERT(ms_st_writer_add(w, "model.layers.0.mlp.experts.down_proj_weight_scale_2",
				  MS_DTYPE_F32, 1, s_e, s2, &err) == MS_OK);
	T_ASSERT(ms_st_writer_add(w, "model.layers.0.mlp.experts.down_proj_input_scale",
				  MS_DTYPE_F32, 0, NULL, s2, &err) == MS_OK);
	for (int e = 0; e < GE; e++) {
		bprintf(name, sizeof(name), "model.layers.1.mlp.experts.%d.down_proj.weight", e);
		T_ASSERT(ms_st_writer_add(w, name, MS_DTYPE_U8, 2, s_p, packed[e], &err) == MS_OK);
		bprintf(name, sizeof(name), "model.layers.1.mlp.experts.%d.down_proj.weight_scale", e);
		T_ASSERT(ms_st_writer_add(w, name, MS_DTYPE_F8_E4M3, 2, s_s, scale[e], &err) == MS_OK);
		bprintf(name, sizeof(name), "model.layers.1.mlp.experts.%d.down_proj.weight_scale_2",
			 e);
		T_ASSERT(ms_st_writer_add(w, name, MS_DTYPE_F32, 0, NULL, &s2[e], &err) == MS_OK);
	}
	T_ASSERT(ms_st_writer_commit(w, &err) == MS_OK);
	ms_st_writer_free(w);
	return 0;
}

static int test_grouped_and_nvfp4(void)
{
	char src[1024], dir[1024], want[MS_STATE_DIGEST_LEN], got[MS_STATE_DIGEST_LEN];
	struct ms_st_file *in, *sf;
	struct ms_err err = { 0 };
	struct ms_shard_opts o = { .force = 1 };
	struct ms_shard_result *res = NULL;
	const char *pl[2] = { "contiguous", "round-robin" };

	T_ASSERT(sh("mkdir -p '%s/grouped'", T_TMP) == 0);
	bprintf(src, sizeof(src), "%s/grouped/model.safetensors", T_TMP);
	T_ASSERT(write_grouped(src) == 0);
	T_ASSERT(ms_st_open(src, &in, &err) == MS_OK);
	for (int p = 0; p < 2; p++) {
		bprintf(dir, sizeof(dir), "%s/grouped-%s", T_TMP, pl[p]);
		T_ASSERT_MSG(split(src, dir, 3, pl[p], &err) == MS_OK, "%s", err.msg);
		for (uint32_t rank = 0; rank < 3; rank++) {
			uint32_t ids[8], l;
			const struct ms_tensor *g, *gs;

			want_ids(pl[p], GE, 3, rank, ids, &l);
			T_ASSERT(ms_st_open(shard_path(dir, rank, 3, "model"), &sf, &err) == MS_OK);
			g = ms_st_find(sf, "model.layers.0.mlp.experts.gate_up_proj");
			gs = ms_st_find(in, "model.layers.0.mlp.experts.gate_up_proj");
			T_ASSERT(g && g->shape[0] == l && g->shape[1] == 8 && g->shape[2] == 4);
			for (uint32_t i = 0; i < l; i++)
				T_ASSERT(!memcmp(g->data + i * 64, gs->data + ids[i] * 64, 64));
			g = ms_st_find(sf, "model.layers.0.mlp.experts.down_proj_weight_scale_2");
			gs = ms_st_find(in, "model.layers.0.mlp.experts.down_proj_weight_scale_2");
			T_ASSERT(g && g->ndim == 1 && g->shape[0] == l);
			for (uint32_t i = 0; i < l; i++)
				T_ASSERT(!memcmp(g->data + i * 4, gs->data + ids[i] * 4, 4));
			g = ms_st_find(sf, "model.layers.0.mlp.experts.down_proj_input_scale");
			T_ASSERT(g && g->ndim == 0);
			for (int e = 0; e < GE; e++) {
				char name[128];
				int mine = 0;

				for (uint32_t i = 0; i < l; i++)
					mine |= ids[i] == (uint32_t)e;
				bprintf(name, sizeof(name),
					 "model.layers.1.mlp.experts.%d.down_proj.weight_scale_2", e);
				T_ASSERT((ms_st_find(sf, name) != NULL) == mine);
				bprintf(name, sizeof(name),
					 "model.layers.1.mlp.experts.%d.down_proj.weight_scale", e);
				T_ASSERT((ms_st_find(sf, name) != NULL) == mine);
			}
			T_ASSERT(ms_st_find(sf, "model.layers.0.mlp.gate.weight"));
			ms_st_close(sf);
		}
		bprintf(want, sizeof(want), "%s.merged", dir);
		T_ASSERT_MSG(ms_shard_merge(dir, want, &o, &res, &err) == MS_OK, "%s", err.msg);
		T_ASSERT_STR(res->packing, "per-expert+grouped");
		ms_shard_result_free(res);
		T_ASSERT(same_file(src, strcat(want, "/model.safetensors")));
		T_ASSERT(digest_of(src, want) == MS_OK);
		bprintf(got, sizeof(got), "x");
		bprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), ".merged");
		T_ASSERT(digest_of(dir, got) == MS_OK);
		T_ASSERT_STR(got, want);
	}
	ms_st_close(in);
	return 0;
}

/* ---- placement ---------------------------------------------------------------- */

static int test_placement(void)
{
	struct ms_ep_placement *p;
	struct ms_err err = { 0 };
	char path[1024];

	T_ASSERT(ms_ep_placement_new("round-robin", 8, 4, &p, &err) == MS_OK);
	for (uint32_t e = 0; e < 8; e++) {
		T_ASSERT_EQ_INT(p->rank_of[e], e % 4);
		T_ASSERT_EQ_INT(p->local_of[e], e / 4);
	}
	ms_ep_placement_free(p);
	T_ASSERT(ms_ep_placement_new(NULL, 8, 4, &p, &err) == MS_OK);
	T_ASSERT_EQ_INT(p->kind, MS_EP_PLACEMENT_CONTIGUOUS);
	for (uint32_t e = 0; e < 8; e++)
		T_ASSERT_EQ_INT(p->rank_of[e], e / 2);
	ms_ep_placement_free(p);
	T_ASSERT_EQ_INT(ms_ep_placement_new("contiguous", 6, 4, &p, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "divide"));
	T_ASSERT_EQ_INT(ms_ep_placement_new("round-robin", 6, 0, &p, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_ep_placement_new("contiguous", 0, 2, &p, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_ep_placement_new("no-such-placement", 8, 2, &p, &err), MS_ENOTFOUND);

	/* a map: uneven, any order */
	static const char map[] = "{\"ranks\": [[5, 0], [1], [2, 3], [4]]}";
	T_ASSERT(ms_ep_placement_from_json(map, sizeof(map) - 1, "m", 6, 4, &p, &err) == MS_OK);
	T_ASSERT_EQ_INT(p->kind, MS_EP_PLACEMENT_MAP);
	T_ASSERT_EQ_INT(p->rank_of[5], 0);
	T_ASSERT_EQ_INT(p->local_of[5], 0);
	T_ASSERT_EQ_INT(p->local_of[0], 1);
	T_ASSERT_EQ_INT(p->rank_of[4], 3);
	ms_ep_placement_free(p);
	T_ASSERT(ms_ep_placement_from_json(map, sizeof(map) - 1, "m", 0, 0, &p, &err) == MS_OK);
	T_ASSERT_EQ_INT(p->num_experts, 6);
	T_ASSERT_EQ_INT(p->ep_size, 4);
	ms_ep_placement_free(p);
	static const struct { const char *json; const char *msg; } bad[] = {
		{ "{\"ranks\": [[0, 1], [1, 2]]}", "twice" },
		{ "{\"ranks\": [[0, 1], [2, 7]]}", "0..3" },
		{ "{\"ranks\": [[0, 1], [2, -3]]}", "0..3" },
		{ "{\"ranks\": [[0, 1], [2, 3.5]]}", "0..3" },
		{ "{\"ranks\": []}", "ranks" },
		{ "{\"ranks\": [0, 1]}", "array" },
		{ "{\"ranks\": [[0, 1], [2, 3]]", "JSON" },
		{ "[]", "JSON" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		T_ASSERT_EQ_INT(ms_ep_placement_from_json(bad[i].json, strlen(bad[i].json), "m", 0, 0,
							  &p, &err), MS_EINVAL);
		T_ASSERT_MSG(strstr(err.msg, bad[i].msg), "%s: %s", bad[i].json, err.msg);
	}
	T_ASSERT_EQ_INT(ms_ep_placement_from_json(map, sizeof(map) - 1, "m", 8, 0, &p, &err),
			MS_EINVAL);
	T_ASSERT_EQ_INT(ms_ep_placement_from_json(map, sizeof(map) - 1, "m", 0, 2, &p, &err),
			MS_EINVAL);
	bprintf(path, sizeof(path), "%s/map.json", T_TMP);
	T_ASSERT(ms_file_write_atomic(path, map, sizeof(map) - 1, 1, &err) == MS_OK);
	T_ASSERT(ms_ep_placement_new(path, 6, 4, &p, &err) == MS_OK);
	ms_ep_placement_free(p);
	return 0;
}

/* E not divisible by N: refused by the built-ins, fine with a map. */
static int test_uneven_map(void)
{
	static const char map[] = "{\"ranks\": [[0, 5], [1], [2, 3], [4]]}";
	char path[1024], dir[1024], mdir[1024], want[MS_STATE_DIGEST_LEN], got[MS_STATE_DIGEST_LEN];
	struct ms_err err = { 0 };
	struct ms_shard_opts o = { .force = 1 };
	struct ms_shard_result *res = NULL;
	struct ms_st_file *sf;

	bprintf(path, sizeof(path), "%s/uneven.json", T_TMP);
	bprintf(dir, sizeof(dir), "%s/uneven", T_TMP);
	bprintf(mdir, sizeof(mdir), "%s/uneven.merged", T_TMP);
	T_ASSERT(ms_file_write_atomic(path, map, sizeof(map) - 1, 1, &err) == MS_OK);
	T_ASSERT_EQ_INT(split(fx(FX_E6 "/adapter"), dir, 4, "contiguous", &err), MS_EINVAL);
	T_ASSERT_EQ_INT(split(fx(FX_E6 "/adapter"), dir, 4, "round-robin", &err), MS_EINVAL);
	T_ASSERT_MSG(split(fx(FX_E6 "/adapter"), dir, 4, path, &err) == MS_OK, "%s", err.msg);
	T_ASSERT(ms_st_open(shard_path(dir, 0, 4, "adapter_model"), &sf, &err) == MS_OK);
	T_ASSERT_STR(ms_st_meta_get(sf, "msinv.ep.experts"), "0,5");
	T_ASSERT_STR(ms_st_meta_get(sf, "msinv.ep.placement"), "map");
	/* 2 local experts at r=3: 6 rows */
	T_ASSERT_EQ_INT(ms_st_find(sf, "base_model.model.model.layers.0.mlp.experts.lora_A.weight")
				->shape[0], 6);
	ms_st_close(sf);
	T_ASSERT_MSG(ms_shard_merge(dir, mdir, &o, &res, &err) == MS_OK, "%s", err.msg);
	ms_shard_result_free(res);
	T_ASSERT(digest_of(fx(FX_E6 "/adapter"), want) == MS_OK);
	T_ASSERT(digest_of(mdir, got) == MS_OK);
	T_ASSERT_STR(got, want);
	return 0;
}

/* ---- hostile inputs -------------------------------------------------------------- */

static int flip_tensor_byte(const char *path, const char *tensor)
{
	struct ms_st_file *f;
	struct ms_err err = { 0 };
	const struct ms_tensor *t;
	uint64_t off;
	FILE *fp;
	int c;

	T_ASSERT(ms_st_open(path, &f, &err) == MS_OK);
	t = ms_st_find(f, tensor);
	T_ASSERT(t);
	off = t->offset + t->nbytes / 2;
	ms_st_close(f);
	fp = fopen(path, "r+b");
	T_ASSERT(fp);
	T_ASSERT(fseek(fp, (long)off, SEEK_SET) == 0);
	c = fgetc(fp);
	T_ASSERT(fseek(fp, (long)off, SEEK_SET) == 0);
	fputc(c ^ 0x01, fp);
	T_ASSERT(fclose(fp) == 0);
	return 0;
}

static int replace_in_file(const char *path, const char *from, const char *to)
{
	char *text = NULL, *p;
	size_t len;
	struct ms_err err = { 0 };
	struct ms_buf b;

	T_ASSERT(ms_file_read(path, 64 << 20, &text, &len, &err) == MS_OK);
	p = strstr(text, from);
	T_ASSERT_MSG(p, "'%s' not in %s", from, path);
	ms_buf_init(&b);
	ms_buf_append(&b, text, (size_t)(p - text));
	ms_buf_puts(&b, to);
	ms_buf_puts(&b, p + strlen(from));
	T_ASSERT(ms_file_write_atomic(path, b.data, b.len, 1, &err) == MS_OK);
	ms_buf_release(&b);
	ms_free(text);
	return 0;
}

/* Copy the good set to a fresh directory to break. */
static const char *broken(const char *good, const char *name)
{
	static char dir[1024];

	bprintf(dir, sizeof(dir), "%s/broken-%s", T_TMP, name);
	if (sh("rm -rf '%s' && cp -r '%s' '%s'", dir, good, dir))
		return NULL;
	return dir;
}

/* check and merge fail with code and a message holding m1 (and m2);
 * reshard fails with code too, or succeeds when reshard_ok (it checks
 * every byte it reads, not the input shards' own digests) */
static int expect_fail_r(const char *dir, int code, const char *m1, const char *m2,
			 int reshard_ok)
{
	struct ms_err err = { 0 };
	struct ms_shard_opts o = { .force = 1 };
	struct ms_shard_result *res = NULL;
	char out[1024];
	int rc;

	rc = ms_shard_check(dir, NULL, NULL, &err);
	T_ASSERT_MSG(rc == code, "%s: check gave %d (%s), want %d", dir, rc, err.msg, code);
	T_ASSERT_MSG(strstr(err.msg, m1) && (!m2 || strstr(err.msg, m2)), "%s: '%s'", dir, err.msg);
	bprintf(out, sizeof(out), "%s.out", dir);
	T_ASSERT_EQ_INT(ms_shard_merge(dir, out, &o, &res, &err), code);
	o.ep_size = 2;
	T_ASSERT_EQ_INT(ms_shard_reshard(dir, out, &o, &res, &err), reshard_ok ? MS_OK : code);
	T_ASSERT((res != NULL) == reshard_ok);
	ms_shard_result_free(res);
	return 0;
}

static int expect_fail(const char *dir, int code, const char *m1, const char *m2)
{
	return expect_fail_r(dir, code, m1, m2, 0);
}

static int test_hostile_sets(void)
{
	char good[1024], other[1024], a[1024];
	const char *d;
	struct ms_err err = { 0 };
	const char *attn = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight";

	bprintf(good, sizeof(good), "%s/good2", T_TMP);
	bprintf(other, sizeof(other), "%s/good4", T_TMP);
	T_ASSERT(split(fx(FX_E8 "/adapter"), good, 2, "contiguous", &err) == MS_OK);
	T_ASSERT(split(fx(FX_E8 "/adapter"), other, 4, "contiguous", &err) == MS_OK);
	T_ASSERT_MSG(ms_shard_check(good, NULL, NULL, &err) == MS_OK, "%s", err.msg);

	/* a rank's shard missing */
	T_ASSERT((d = broken(good, "missing")));
	T_ASSERT(sh("rm '%s'", shard_path(d, 1, 2, "adapter_model")) == 0);
	if (expect_fail(d, MS_EINVAL, "rank 1 is missing", NULL))
		return 1;
	/* rank 0's shard also under rank 1's name */
	T_ASSERT((d = broken(good, "duplicated")));
	bprintf(a, sizeof(a), "%s", shard_path(d, 0, 2, "adapter_model"));
	T_ASSERT(sh("cp '%s' '%s'", a, shard_path(d, 1, 2, "adapter_model")) == 0);
	if (expect_fail(d, MS_EINVAL, "says rank 0", "rank 1"))
		return 1;
	/* a shard of an EP=4 set among the EP=2 shards */
	T_ASSERT((d = broken(good, "other-n")));
	T_ASSERT(sh("cp '%s' '%s'", shard_path(other, 3, 4, "adapter_model"), d) == 0);
	if (expect_fail(d, MS_EINVAL, "another set", "EP size 4"))
		return 1;
	/* an EP=4 shard renamed into the EP=2 set */
	T_ASSERT((d = broken(good, "other-n-renamed")));
	bprintf(a, sizeof(a), "%s", shard_path(d, 1, 2, "adapter_model"));
	T_ASSERT(sh("cp '%s' '%s'", shard_path(other, 1, 4, "adapter_model"), a) == 0);
	if (expect_fail(d, MS_EINVAL, "EP size 4", NULL))
		return 1;
	/* a replicated tensor that differs on one rank */
	T_ASSERT((d = broken(good, "replica")));
	T_ASSERT(flip_tensor_byte(shard_path(d, 1, 2, "adapter_model"), attn) == 0);
	if (expect_fail(d, MS_ECHECK, attn, "rank 0"))
		return 1;
	/* a fused expert's bytes changed on its rank */
	T_ASSERT((d = broken(good, "expert-bytes")));
	T_ASSERT(flip_tensor_byte(shard_path(d, 1, 2, "adapter_model"),
				  "base_model.model.model.layers.0.mlp.experts.lora_B.weight") == 0);
	if (expect_fail(d, MS_ECHECK, "expert", "does not match the manifest"))
		return 1;
	/* the manifest lies about a shard's digest */
	T_ASSERT((d = broken(good, "lying-shard-digest")));
	bprintf(a, sizeof(a), "%s/ep_manifest.json", d);
	{
		struct ms_shard_result *res = NULL;
		char want[MS_STATE_DIGEST_LEN], lie[MS_STATE_DIGEST_LEN];

		T_ASSERT(ms_shard_check(good, NULL, &res, &err) == MS_OK);
		memcpy(want, res->files[1].state_digest, sizeof(want));
		ms_shard_result_free(res);
		memcpy(lie, want, sizeof(lie));
		lie[10] = lie[10] == 'a' ? 'b' : 'a';
		T_ASSERT(replace_in_file(a, want, lie) == 0);
	}
	if (expect_fail_r(d, MS_ECHECK, "state digest", "manifest", 1))
		return 1;
	/* the manifest lies about an expert's digest */
	T_ASSERT((d = broken(good, "lying-expert-digest")));
	bprintf(a, sizeof(a), "%s/ep_manifest.json", d);
	{
		/* the first lora_B record's digest: change its first hex digit */
		char *text = NULL, *p;
		size_t len;

		T_ASSERT(ms_file_read(a, 64 << 20, &text, &len, &err) == MS_OK);
		p = strstr(text, "\"experts\":\t[{");
		T_ASSERT(p && (p = strstr(p, "\"part\":\t\"lora_B\"")) && (p = strstr(p, "\"sha256\":\t\"")));
		p += strlen("\"sha256\":\t\"");
		*p = *p == '0' ? '1' : '0';
		T_ASSERT(ms_file_write_atomic(a, text, len, 1, &err) == MS_OK);
		ms_free(text);
	}
	if (expect_fail(d, MS_ECHECK, "expert", "does not match the manifest"))
		return 1;
	/* the manifest lies about a fused tensor's source digest */
	T_ASSERT((d = broken(good, "lying-source-digest")));
	bprintf(a, sizeof(a), "%s/ep_manifest.json", d);
	{
		char *text = NULL, *p;
		size_t len;

		T_ASSERT(ms_file_read(a, 64 << 20, &text, &len, &err) == MS_OK);
		p = strstr(text, "\"tensors\":\t[{");
		T_ASSERT(p && (p = strstr(p, "\"sha256\":\t\"")));
		p += strlen("\"sha256\":\t\"");
		*p = *p == '0' ? '1' : '0';
		T_ASSERT(ms_file_write_atomic(a, text, len, 1, &err) == MS_OK);
		ms_free(text);
	}
	if (expect_fail(d, MS_ECHECK, "source", NULL))
		return 1;
	/* the manifest calls a fused LoRA tensor replicated */
	T_ASSERT((d = broken(good, "reclassified")));
	bprintf(a, sizeof(a), "%s/ep_manifest.json", d);
	T_ASSERT(replace_in_file(a, "\"kind\":\t\"fused-lora-a\"", "\"kind\":\t\"replicated\"") == 0);
	if (expect_fail(d, MS_EINVAL, "recorded as 'replicated'", "fused-lora-a"))
		return 1;
	/* the manifest's placement table disagrees with its name */
	T_ASSERT((d = broken(good, "placement-table")));
	bprintf(a, sizeof(a), "%s/ep_manifest.json", d);
	T_ASSERT(replace_in_file(a, "[[0, 1, 2, 3], [4, 5, 6, 7]]", "[[0, 1, 2, 4], [3, 5, 6, 7]]") == 0);
	if (expect_fail(d, MS_EINVAL, "placement", NULL))
		return 1;
	/* the config file was changed after the split */
	T_ASSERT((d = broken(good, "config")));
	bprintf(a, sizeof(a), "%s/adapter_config.json", d);
	T_ASSERT(replace_in_file(a, "\"lora_alpha\": 8", "\"lora_alpha\": 16") == 0);
	if (expect_fail(d, MS_ECHECK, "adapter_config.json", "sha256"))
		return 1;
	/* no manifest: an unfinished set */
	T_ASSERT((d = broken(good, "no-manifest")));
	bprintf(a, sizeof(a), "%s/ep_manifest.json", d);
	T_ASSERT(unlink(a) == 0);
	if (expect_fail(d, MS_EINVAL, "ep_manifest.json", NULL))
		return 1;
	/* truncated manifest */
	T_ASSERT((d = broken(good, "truncated")));
	bprintf(a, sizeof(a), "%s/ep_manifest.json", d);
	T_ASSERT(truncate(a, 300) == 0);
	if (expect_fail(d, MS_EINVAL, "JSON", NULL))
		return 1;
	return 0;
}

/* A per-expert tensor of rank 1's expert smuggled into rank 0's shard. */
static int test_expert_on_two_ranks(void)
{
	char good[1024], path[1024];
	const char *d;
	struct ms_st_file *s0, *s1;
	struct ms_st_writer *w;
	struct ms_err err = { 0 };
	const char *extra = "model.layers.0.mlp.experts.7.down_proj.weight";

	bprintf(good, sizeof(good), "%s/dup-expert", T_TMP);
	T_ASSERT(split(fx("hf/qwen3moe"), good, 2, "contiguous", &err) == MS_OK);
	T_ASSERT((d = broken(good, "dup-expert")));
	T_ASSERT(ms_st_open(shard_path(good, 0, 2, "model"), &s0, &err) == MS_OK);
	T_ASSERT(ms_st_open(shard_path(good, 1, 2, "model"), &s1, &err) == MS_OK);
	bprintf(path, sizeof(path), "%s", shard_path(d, 0, 2, "model"));
	T_ASSERT(ms_st_writer_new(path, 1, &w, &err) == MS_OK);
	for (size_t i = 0; i < s0->nmeta; i++)
		T_ASSERT(ms_st_writer_meta(w, s0->meta[i].key, s0->meta[i].value, &err) == MS_OK);
	for (size_t i = 0; i < s0->ntensors; i++) {
		const struct ms_tensor *t = &s0->tensors[i];

		T_ASSERT(ms_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &err) ==
			 MS_OK);
	}
	{
		const struct ms_tensor *t = ms_st_find(s1, extra);

		T_ASSERT(t);
		T_ASSERT(ms_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &err) ==
			 MS_OK);
	}
	T_ASSERT(ms_st_writer_commit(w, &err) == MS_OK);
	ms_st_writer_free(w);
	ms_st_close(s0);
	ms_st_close(s1);
	return expect_fail(d, MS_ECHECK, extra, "rank 1");
}

static int test_split_refusals(void)
{
	char dir[1024], path[1024];
	struct ms_err err = { 0 };
	struct ms_shard_opts o = { .ep_size = 2 };
	struct ms_shard_result *res = NULL;

	bprintf(dir, sizeof(dir), "%s/refuse", T_TMP);
	T_ASSERT(split(fx(FX_E8 "/adapter"), dir, 2, NULL, &err) == MS_OK);
	/* existing outputs need --force */
	T_ASSERT_EQ_INT(ms_shard_split(fx(FX_E8 "/adapter"), dir, &o, &res, &err), MS_EEXIST);
	T_ASSERT(strstr(err.msg, "--force"));
	/* --force replaces the whole set: no shard of the old one stays */
	o.ep_size = 4;
	o.force = 1;
	T_ASSERT_MSG(ms_shard_split(fx(FX_E8 "/adapter"), dir, &o, &res, &err) == MS_OK, "%s",
		     err.msg);
	ms_shard_result_free(res);
	res = NULL;
	T_ASSERT(access(shard_path(dir, 3, 4, "adapter_model"), F_OK) == 0);
	T_ASSERT(access(shard_path(dir, 0, 2, "adapter_model"), F_OK) != 0);
	/* a shard or a shard set is not a source */
	bprintf(path, sizeof(path), "%s/again", T_TMP);
	T_ASSERT_EQ_INT(ms_shard_split(shard_path(dir, 0, 4, "adapter_model"), path, &o, &res, &err),
			MS_EINVAL);
	T_ASSERT(strstr(err.msg, "already an EP shard"));
	T_ASSERT_EQ_INT(ms_shard_split(dir, path, &o, &res, &err), MS_EINVAL);
	/* not into the input's own directory */
	bprintf(path, sizeof(path), "%s/own", T_TMP);
	T_ASSERT(sh("cp -r '%s' '%s'", fx(FX_E8 "/adapter"), path) == 0);
	T_ASSERT_EQ_INT(ms_shard_split(path, path, &o, &res, &err), MS_EINVAL);
	strcat(path, "/adapter_model.safetensors");
	T_ASSERT_EQ_INT(ms_shard_split(path, tmp("own"), &o, &res, &err), MS_EINVAL);
	bprintf(path, sizeof(path), "%s/again", T_TMP);
	/* nothing routed: nothing to shard */
	T_ASSERT_EQ_INT(ms_shard_split(fx("dtypes/all.safetensors"), path, &o, &res, &err),
			MS_EINVAL);
	T_ASSERT(strstr(err.msg, "nothing to shard"));
	/* --experts that contradicts the tensors */
	o.num_experts = 16;
	T_ASSERT_EQ_INT(ms_shard_split(fx(FX_E8 "/adapter"), path, &o, &res, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "16"));
	/* config.json's expert count is checked against the tensors */
	o.num_experts = 4;
	T_ASSERT_EQ_INT(ms_shard_split(fx("hf/qwen3moe"), path, &o, &res, &err), MS_EINVAL);
	/* a dry run writes nothing */
	o.num_experts = 0;
	o.dry_run = 1;
	T_ASSERT(ms_shard_split(fx(FX_E8 "/adapter"), path, &o, &res, &err) == MS_OK);
	T_ASSERT_EQ_INT(res->nfiles, 4);
	T_ASSERT(res->files[0].ntensors == 16 && res->files[0].state_digest[0] == '\0');
	ms_shard_result_free(res);
	T_ASSERT(access(path, F_OK) != 0);
	return 0;
}

/* An adapter whose target_parameters cannot be matched to its wrappers. */
static int test_unresolvable_fused(void)
{
	char dir[1024], path[1024];
	struct ms_err err = { 0 };

	bprintf(dir, sizeof(dir), "%s/unresolvable", T_TMP);
	T_ASSERT(sh("mkdir -p '%s' && cp '%s/adapter_model.safetensors' '%s/'", dir,
		    fx(FX_E8 "/adapter"), dir) == 0);
	bprintf(path, sizeof(path), "%s/adapter_config.json", dir);
	T_ASSERT(sh("cp '%s/adapter_config.json' '%s'", fx(FX_E8 "/adapter"), path) == 0);
	T_ASSERT(replace_in_file(path, "\"mlp.experts.down_proj\"", "\"mlp.experts.other\"") == 0);
	/* gate_up_proj + other: not both known, saved order puts gate_up_proj
	 * innermost, which fits; but r must divide */
	T_ASSERT(replace_in_file(path, "\"r\": 4", "\"r\": 5") == 0);
	T_ASSERT_EQ_INT(split(dir, tmp("unres-out"), 2, NULL, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "r=5"), "%s", err.msg);
	T_ASSERT(replace_in_file(path, "\"r\": 5", "\"r\": 4") == 0);
	T_ASSERT(replace_in_file(path, "\"mlp.experts.gate_up_proj\",", "") == 0);
	T_ASSERT_EQ_INT(split(dir, tmp("unres-out"), 2, NULL, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "target_parameters"), "%s", err.msg);
	return 0;
}

/* ---- EP-aware loading ------------------------------------------------------------ */

static int test_load_rank(void)
{
	char dir[1024], mpath[1024];
	struct ms_ep_rank *r = NULL;
	struct ms_err err = { 0 };
	const char *d;

	bprintf(dir, sizeof(dir), "%s/load", T_TMP);
	T_ASSERT(split(fx(FX_E8 "/adapter"), dir, 4, "round-robin", &err) == MS_OK);
	for (uint32_t rank = 0; rank < 4; rank++) {
		T_ASSERT_MSG(ms_ep_load_rank(dir, 4, rank, &r, &err) == MS_OK, "%s", err.msg);
		T_ASSERT_EQ_INT(r->nexperts, 2);
		T_ASSERT_EQ_INT(r->experts[0], rank);
		T_ASSERT_EQ_INT(r->experts[1], rank + 4);
		T_ASSERT_EQ_INT(r->placement, MS_EP_PLACEMENT_ROUND_ROBIN);
		T_ASSERT_EQ_INT(r->ckpt->nfiles, 1);
		T_ASSERT(strstr(r->shard_path, rank == 2 ? "ep00002-of-00004" : "-of-00004"));
		T_ASSERT(ms_ckpt_find(r->ckpt, "base_model.model.model.layers.0.mlp.experts.lora_A.weight")
				 ->shape[0] == 8);
		T_ASSERT(r->is_adapter);
		ms_ep_rank_free(r);
		r = NULL;
	}
	bprintf(mpath, sizeof(mpath), "%s/ep_manifest.json", dir);
	T_ASSERT(ms_ep_load_rank(mpath, 4, 3, &r, &err) == MS_OK);
	ms_ep_rank_free(r);
	/* another EP size: refused, with the way out */
	T_ASSERT_EQ_INT(ms_ep_load_rank(dir, 8, 0, &r, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "msshard reshard") && strstr(err.msg, "--ep-size 8"), "%s",
		     err.msg);
	T_ASSERT_EQ_INT(ms_ep_load_rank(dir, 4, 4, &r, &err), MS_EINVAL);
	T_ASSERT(r == NULL);
	/* a corrupt rank 2 fails its own load, not rank 1's */
	T_ASSERT((d = broken(dir, "load")));
	T_ASSERT(flip_tensor_byte(shard_path(d, 2, 4, "adapter_model"),
				  "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight") ==
		 0);
	T_ASSERT_EQ_INT(ms_ep_load_rank(d, 4, 2, &r, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, "expert 2") || strstr(err.msg, "expert 6"), "%s", err.msg);
	T_ASSERT(ms_ep_load_rank(d, 4, 1, &r, &err) == MS_OK);
	ms_ep_rank_free(r);
	/* a rank's replica that differs from the manifest */
	T_ASSERT((d = broken(dir, "load-replica")));
	T_ASSERT(flip_tensor_byte(shard_path(d, 3, 4, "adapter_model"),
				  "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight") == 0);
	T_ASSERT_EQ_INT(ms_ep_load_rank(d, 4, 3, &r, &err), MS_ECHECK);
	T_ASSERT(strstr(err.msg, "q_proj.lora_A"));
	return 0;
}

/* Canonical expert digests do not depend on the layout: a per-expert
 * adapter and its shards give the same digests in every manifest. */
static int test_expert_digests_layout_free(void)
{
	char a[1024], b[1024];
	struct ms_err err = { 0 };
	char *t1 = NULL, *t2 = NULL;
	size_t l1, l2;
	cJSON *m1, *m2;

	bprintf(a, sizeof(a), "%s/lf2", T_TMP);
	bprintf(b, sizeof(b), "%s/lf3", T_TMP);
	T_ASSERT(split(fx(FX_E6 "/adapter"), a, 2, "contiguous", &err) == MS_OK);
	T_ASSERT(split(fx(FX_E6 "/adapter"), b, 3, "round-robin", &err) == MS_OK);
	strcat(a, "/ep_manifest.json");
	strcat(b, "/ep_manifest.json");
	T_ASSERT(ms_file_read(a, 64 << 20, &t1, &l1, &err) == MS_OK);
	T_ASSERT(ms_file_read(b, 64 << 20, &t2, &l2, &err) == MS_OK);
	m1 = cJSON_Parse(t1);
	m2 = cJSON_Parse(t2);
	T_ASSERT(cJSON_Compare(cJSON_GetObjectItem(m1, "experts"), cJSON_GetObjectItem(m2, "experts"),
			       1));
	T_ASSERT_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(m1, "experts")), 2 * 2 * 2 * 6);
	cJSON_Delete(m1);
	cJSON_Delete(m2);
	ms_free(t1);
	ms_free(t2);
	return 0;
}


/* A sharded checkpoint's index comes back byte for byte, in the format
 * save_pretrained writes (json.dumps(indent=2, sort_keys=True)), odd
 * metadata included. */
static int test_index_roundtrip(void)
{
	static const char index[] =
		"{\n  \"metadata\": {\n    \"big\": 1e+300,\n    \"empty\": {},\n    \"list\": [\n"
		"      1,\n      2.5,\n      true,\n      null\n    ],\n    \"note\": "
		"\"na\\u00efve \\u2603 \\ud83d\\ude00\\n\\\"q\\\"\\t\\\\\",\n    \"ratio\": 0.1,\n"
		"    \"total_size\": 1234,\n    \"z\": []\n  },\n  \"weight_map\": {\n"
		"    \"model.layers.0.mlp.experts.0.w1.weight\": \"a.safetensors\",\n"
		"    \"model.layers.0.mlp.experts.1.w1.weight\": \"b.safetensors\",\n"
		"    \"model.norm.weight\": \"a.safetensors\"\n  }\n}\n";
	static const uint16_t w0[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, w1[8] = { 9, 8, 7, 6, 5, 4, 3, 2 };
	static const uint16_t nrm[4] = { 0x3f80, 0x3f80, 0x3f80, 0x3f80 };
	uint64_t s2[2] = { 2, 4 }, s1[1] = { 4 };
	char dir[1024], path[1024], sd[1024], md[1024];
	struct ms_st_writer *w;
	struct ms_err err = { 0 };
	struct ms_shard_opts o = { .force = 1 };
	struct ms_shard_result *res = NULL;

	bprintf(dir, sizeof(dir), "%s/indexed", T_TMP);
	T_ASSERT(sh("mkdir -p '%s'", dir) == 0);
	bprintf(path, sizeof(path), "%s/a.safetensors", dir);
	T_ASSERT(ms_st_writer_new(path, 1, &w, &err) == MS_OK);
	T_ASSERT(ms_st_writer_add(w, "model.layers.0.mlp.experts.0.w1.weight", MS_DTYPE_BF16, 2, s2,
				  w0, &err) == MS_OK);
	T_ASSERT(ms_st_writer_add(w, "model.norm.weight", MS_DTYPE_BF16, 1, s1, nrm, &err) == MS_OK);
	T_ASSERT(ms_st_writer_commit(w, &err) == MS_OK);
	ms_st_writer_free(w);
	bprintf(path, sizeof(path), "%s/b.safetensors", dir);
	T_ASSERT(ms_st_writer_new(path, 1, &w, &err) == MS_OK);
	T_ASSERT(ms_st_writer_meta(w, "format", "pt", &err) == MS_OK);
	T_ASSERT(ms_st_writer_add(w, "model.layers.0.mlp.experts.1.w1.weight", MS_DTYPE_BF16, 2, s2,
				  w1, &err) == MS_OK);
	T_ASSERT(ms_st_writer_commit(w, &err) == MS_OK);
	ms_st_writer_free(w);
	bprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
	T_ASSERT(ms_file_write_atomic(path, index, sizeof(index) - 1, 1, &err) == MS_OK);

	bprintf(sd, sizeof(sd), "%s.ep", dir);
	bprintf(md, sizeof(md), "%s.merged", dir);
	T_ASSERT_MSG(split(dir, sd, 2, "contiguous", &err) == MS_OK, "%s", err.msg);
	T_ASSERT_MSG(ms_shard_merge(sd, md, &o, &res, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(res->nfiles, 2);
	ms_shard_result_free(res);
	for (int i = 0; i < 3; i++) {
		static const char *const f[] = { "a.safetensors", "b.safetensors",
						 "model.safetensors.index.json" };
		char x[1100], y[1100];

		bprintf(x, sizeof(x), "%s/%s", dir, f[i]);
		bprintf(y, sizeof(y), "%s/%s", md, f[i]);
		T_ASSERT_MSG(same_file(x, y), "%s differs", y);
	}
	return 0;
}

/* ---- all-or-nothing output ------------------------------------------------ */

/* Names in dir (sorted, '\n'-joined) into buf; -1 when dir is unreadable. */
static int listing(const char *dir, char *buf, size_t n)
{
	char cmd[1200];
	FILE *p;
	size_t k;

	bprintf(cmd, sizeof(cmd), "ls -A '%s' 2>/dev/null | sort", dir);
	if (!(p = popen(cmd, "r")))
		return -1;
	k = fread(buf, 1, n - 1, p);
	buf[k] = '\0';
	return pclose(p) == 0 ? 0 : -1;
}

struct pub_probe {
	int calls;
	int fail;           /* return this code (0: MS_OK) */
	int saw_all;        /* every result path existed when called */
	char staging[1024]; /* a staging directory found beside the output */
	const char *parent;
};

static int probe_publish(void *ctx, const struct ms_shard_result *res, struct ms_err *err)
{
	struct pub_probe *p = ctx;
	char names[4096];

	p->calls++;
	p->saw_all = access(res->manifest_path ? res->manifest_path : res->files[0].path, F_OK) == 0;
	for (size_t i = 0; i < res->nfiles; i++)
		p->saw_all &= access(res->files[i].path, F_OK) == 0;
	/* while published, the replaced output (if any) waits under a
	 * staging name */
	p->staging[0] = '\0';
	if (listing(p->parent, names, sizeof(names)) == 0 && strstr(names, ".tmp-"))
		bprintf(p->staging, sizeof(p->staging), "%s", names);
	if (p->fail)
		return ms_err_set(err, p->fail, "recording refused");
	return MS_OK;
}

static int test_publish_all_or_nothing(void)
{
	char parent[1024], dir[1100], before[4096], after[4096], m0[1200], m1[1200];
	struct pub_probe probe = { 0 };
	struct ms_shard_opts o = { .ep_size = 2, .publish = probe_publish, .publish_ctx = &probe };
	struct ms_shard_result *res = NULL;
	struct ms_err err = { 0 };

	bprintf(parent, sizeof(parent), "%s/pub", T_TMP);
	bprintf(dir, sizeof(dir), "%s/set", parent);
	probe.parent = parent;
	T_ASSERT(sh("mkdir -p '%s'", parent) == 0);

	/* a refused publication leaves nothing: no output, no staging */
	probe.fail = MS_EDB;
	T_ASSERT_EQ_INT(ms_shard_split(fx(FX_E8 "/adapter"), dir, &o, &res, &err), MS_EDB);
	T_ASSERT(strstr(err.msg, "recording refused"));
	T_ASSERT_EQ_INT(probe.calls, 1);
	T_ASSERT_MSG(probe.saw_all, "the output was not in place when publish was called");
	T_ASSERT(res == NULL);
	T_ASSERT(listing(parent, after, sizeof(after)) == 0);
	T_ASSERT_MSG(after[0] == '\0', "left in %s: %s", parent, after);

	/* accepted: the set is there, nothing else */
	probe.fail = 0;
	T_ASSERT_MSG(ms_shard_split(fx(FX_E8 "/adapter"), dir, &o, &res, &err) == MS_OK, "%s",
		     err.msg);
	T_ASSERT_EQ_INT(probe.calls, 2);
	T_ASSERT(probe.saw_all && probe.staging[0] == '\0');
	ms_shard_result_free(res);
	res = NULL;
	T_ASSERT(listing(parent, after, sizeof(after)) == 0);
	T_ASSERT_STR(after, "set\n");
	T_ASSERT(listing(dir, before, sizeof(before)) == 0);

	/* --force with a refused publication puts the old set back, byte for
	 * byte (a reshard to EP=4 would replace it with other files) */
	bprintf(m0, sizeof(m0), "%s/ep_manifest.json", dir);
	bprintf(m1, sizeof(m1), "%s/manifest.before", T_TMP);
	T_ASSERT(sh("cp '%s' '%s'", m0, m1) == 0);
	o.force = 1;
	o.ep_size = 4;
	probe.fail = MS_EIO;
	T_ASSERT_EQ_INT(ms_shard_reshard(dir, tmp("pub/set"), &o, &res, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "another directory"));
	T_ASSERT_EQ_INT(ms_shard_split(fx(FX_E8 "/adapter"), dir, &o, &res, &err), MS_EIO);
	T_ASSERT_EQ_INT(probe.calls, 3);
	/* the old set waited beside the new one */
	T_ASSERT_MSG(probe.staging[0], "no staging name held the replaced set");
	T_ASSERT(listing(dir, after, sizeof(after)) == 0);
	T_ASSERT_STR(after, before);
	T_ASSERT(same_file(m0, m1));
	T_ASSERT(listing(parent, after, sizeof(after)) == 0);
	T_ASSERT_STR(after, "set\n");

	/* accepted: replaced, the old one removed */
	probe.fail = 0;
	T_ASSERT_MSG(ms_shard_split(fx(FX_E8 "/adapter"), dir, &o, &res, &err) == MS_OK, "%s",
		     err.msg);
	ms_shard_result_free(res);
	res = NULL;
	T_ASSERT(access(shard_path(dir, 3, 4, "adapter_model"), F_OK) == 0);
	T_ASSERT(access(shard_path(dir, 1, 2, "adapter_model"), F_OK) != 0);
	T_ASSERT(listing(parent, after, sizeof(after)) == 0);
	T_ASSERT_STR(after, "set\n");

	/* merge: the same protocol */
	o.force = 0;
	probe.fail = MS_EDB;
	bprintf(m0, sizeof(m0), "%s/merged", parent);
	T_ASSERT_EQ_INT(ms_shard_merge(dir, m0, &o, &res, &err), MS_EDB);
	T_ASSERT(listing(parent, after, sizeof(after)) == 0);
	T_ASSERT_STR(after, "set\n");
	probe.fail = 0;
	T_ASSERT_MSG(ms_shard_merge(dir, m0, &o, &res, &err) == MS_OK, "%s", err.msg);
	ms_shard_result_free(res);
	res = NULL;
	bprintf(m1, sizeof(m1), "%s/adapter_model.safetensors", m0);
	T_ASSERT(same_file(m1, fx(FX_E8 "/adapter/adapter_model.safetensors")));
	T_ASSERT(listing(parent, after, sizeof(after)) == 0);
	T_ASSERT_STR(after, "merged\nset\n");
	return 0;
}

/* What --force may replace, and what an existing directory means. */
static int test_existing_outputs(void)
{
	char dir[1024], other[1024], names[4096];
	struct ms_shard_opts o = { .ep_size = 2 };
	struct ms_shard_result *res = NULL;
	struct ms_err err = { 0 };

	/* an empty directory is taken without --force */
	bprintf(dir, sizeof(dir), "%s/exist/empty", T_TMP);
	T_ASSERT(sh("mkdir -p '%s'", dir) == 0);
	T_ASSERT_MSG(ms_shard_split(fx(FX_E8 "/adapter"), dir, &o, &res, &err) == MS_OK, "%s",
		     err.msg);
	ms_shard_result_free(res);
	res = NULL;
	T_ASSERT(access(shard_path(dir, 1, 2, "adapter_model"), F_OK) == 0);
	/* a directory holding anything else is never replaced, not even
	 * with --force, and stays as it was */
	bprintf(other, sizeof(other), "%s/exist/mine", T_TMP);
	T_ASSERT(sh("mkdir -p '%s/sub' && echo notes > '%s/README.md'", other, other) == 0);
	T_ASSERT_EQ_INT(ms_shard_split(fx(FX_E8 "/adapter"), other, &o, &res, &err), MS_EEXIST);
	T_ASSERT(strstr(err.msg, "--force"));
	o.force = 1;
	T_ASSERT_EQ_INT(ms_shard_split(fx(FX_E8 "/adapter"), other, &o, &res, &err), MS_EEXIST);
	T_ASSERT_MSG(strstr(err.msg, "not replacing"), "%s", err.msg);
	T_ASSERT(listing(other, names, sizeof(names)) == 0);
	T_ASSERT_STR(names, "README.md\nsub\n");
	/* a file is not a directory to replace */
	bprintf(other, sizeof(other), "%s/exist/file", T_TMP);
	T_ASSERT(sh("echo x > '%s'", other) == 0);
	T_ASSERT_EQ_INT(ms_shard_split(fx(FX_E8 "/adapter"), other, &o, &res, &err), MS_EEXIST);
	/* nothing staged is left beside them */
	bprintf(other, sizeof(other), "%s/exist", T_TMP);
	T_ASSERT(listing(other, names, sizeof(names)) == 0);
	T_ASSERT_STR(names, "empty\nfile\nmine\n");
	/* the messages name the output, never its staging directory */
	o.force = 0;
	T_ASSERT_EQ_INT(ms_shard_split(fx(FX_E8 "/adapter"), dir, &o, &res, &err), MS_EEXIST);
	T_ASSERT(!strstr(err.msg, ".tmp-"));
	return 0;
}

/* ---- large shapes: many runs of experts, rows larger than a tile --------- */

/*
 * A synthetic fused LoRA (one wrapper, down_proj) of E experts at rank r,
 * A [E*r, in] and B [out, r*E], F32 with seeded values. The expert
 * digests the manifest records are compared with the SHA-256 of B_e and
 * A_e regrouped here, and reshard with split and merge with the source.
 */
static int fused_case(const char *name, uint32_t E, uint32_t r, uint32_t in, uint32_t out)
{
	char src[1024], d2[1100], d4[1100], d4s[1100], m[1100], x[1200], y[1200], *text = NULL;
	uint64_t sa[2] = { (uint64_t)E * r, in }, sb[2] = { out, (uint64_t)r * E };
	float *A = calloc((size_t)E * r * in, sizeof(float));
	float *B = calloc((size_t)out * r * E, sizeof(float));
	float *be = malloc((size_t)out * r * sizeof(float));
	struct ms_st_writer *w = NULL;
	struct ms_shard_opts o = { .ep_size = 4, .placement = "round-robin" };
	struct ms_shard_result *res = NULL;
	struct ms_err err = { 0 };
	const cJSON *ex;
	cJSON *root;
	uint32_t seed = 12345;
	size_t len, checked = 0;

	T_ASSERT(A && B && be);
	for (size_t i = 0; i < (size_t)E * r * in; i++)
		A[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8) / 16777216.0f;
	for (size_t i = 0; i < (size_t)out * r * E; i++)
		B[i] = (float)((seed = seed * 1103515245u + 12345u) >> 8) / 16777216.0f;
	bprintf(src, sizeof(src), "%s/%s", T_TMP, name);
	T_ASSERT(sh("mkdir -p '%s'", src) == 0);
	bprintf(x, sizeof(x), "%s/adapter_config.json", src);
	bprintf(y, sizeof(y), "{\"peft_type\": \"LORA\", \"r\": %u, \"lora_alpha\": %u, "
		"\"target_modules\": [], \"target_parameters\": [\"mlp.experts.down_proj\"]}\n",
		r, 2 * r);
	T_ASSERT(ms_file_write_atomic(x, y, strlen(y), 1, &err) == MS_OK);
	bprintf(x, sizeof(x), "%s/adapter_model.safetensors", src);
	T_ASSERT(ms_st_writer_new(x, 1, &w, &err) == MS_OK);
	T_ASSERT(ms_st_writer_add(w, "base_model.model.model.layers.0.mlp.experts.lora_A.weight",
				  MS_DTYPE_F32, 2, sa, A, &err) == MS_OK);
	T_ASSERT(ms_st_writer_add(w, "base_model.model.model.layers.0.mlp.experts.lora_B.weight",
				  MS_DTYPE_F32, 2, sb, B, &err) == MS_OK);
	T_ASSERT_MSG(ms_st_writer_commit(w, &err) == MS_OK, "%s", err.msg);
	ms_st_writer_free(w);

	bprintf(d2, sizeof(d2), "%s-ep2", src);
	bprintf(d4, sizeof(d4), "%s-ep4", src);
	bprintf(d4s, sizeof(d4s), "%s-ep4s", src);
	bprintf(m, sizeof(m), "%s-merged", src);
	T_ASSERT_MSG(split(src, d2, 2, NULL, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_MSG(ms_shard_reshard(d2, d4, &o, &res, &err) == MS_OK, "%s", err.msg);
	ms_shard_result_free(res);
	T_ASSERT(split(src, d4s, 4, "round-robin", &err) == MS_OK);
	for (uint32_t k = 0; k < 4; k++) {
		bprintf(y, sizeof(y), "%s", shard_path(d4s, k, 4, "adapter_model"));
		T_ASSERT_MSG(same_file(shard_path(d4, k, 4, "adapter_model"), y), "%s: rank %u", name, k);
	}
	o.placement = NULL;
	T_ASSERT_MSG(ms_shard_merge(d4, m, &o, &res, &err) == MS_OK, "%s", err.msg);
	ms_shard_result_free(res);
	bprintf(y, sizeof(y), "%s/adapter_model.safetensors", m);
	T_ASSERT_MSG(same_file(x, y), "%s: merge differs from the source", name);

	/* every expert's digests, regrouped here */
	bprintf(x, sizeof(x), "%s/ep_manifest.json", d4);
	T_ASSERT(ms_file_read(x, 1u << 30, &text, &len, &err) == MS_OK);
	root = cJSON_Parse(text);
	free(text);
	T_ASSERT(root);
	cJSON_ArrayForEach(ex, cJSON_GetObjectItem(root, "experts")) {
		uint32_t e = (uint32_t)cJSON_GetObjectItem(ex, "expert")->valueint;
		const char *part = cJSON_GetObjectItem(ex, "part")->valuestring;
		uint8_t d[MS_SHA256_LEN];
		char hex[2 * MS_SHA256_LEN + 1];

		if (!strcmp(part, "lora_B")) {
			for (uint32_t oo = 0; oo < out; oo++)
				for (uint32_t k = 0; k < r; k++)
					be[(size_t)oo * r + k] = B[(size_t)oo * r * E + (size_t)k * E + e];
			T_ASSERT(ms_sha256(be, (size_t)out * r * sizeof(float), d) == MS_OK);
		} else {
			T_ASSERT(ms_sha256(A + (size_t)e * r * in, (size_t)r * in * sizeof(float), d) ==
				 MS_OK);
		}
		ms_hex(d, MS_SHA256_LEN, hex);
		T_ASSERT_MSG(!strcmp(hex, cJSON_GetObjectItem(ex, "sha256")->valuestring),
			     "%s: expert %u %s", name, e, part);
		checked++;
	}
	cJSON_Delete(root);
	T_ASSERT_EQ_INT(checked, 2 * E);
	free(A);
	free(B);
	free(be);
	return 0;
}

static int test_large_shapes(void)
{
	/* 256 experts, round robin over 4 ranks from 2: 64 runs of one
	 * expert per rank and B row */
	if (fused_case("runs", 256, 1, 8, 8))
		return 1;
	/* a B row of 1.3 MB: regrouped one expert at a time in the split,
	 * in tiles when resharded from two halves */
	return fused_case("wide", 16, 20000, 1, 2);
}

static const struct t_case cases[] = {
	T_CASE(test_placement),
	T_CASE(test_fused_deltas_e8),
	T_CASE(test_fused_deltas_e6),
	T_CASE(test_per_expert_deltas),
	T_CASE(test_merge_roundtrip_adapters),
	T_CASE(test_merge_roundtrip_checkpoints),
	T_CASE(test_checkpoint_shard_contents),
	T_CASE(test_reshard_equals_split),
	T_CASE(test_grouped_and_nvfp4),
	T_CASE(test_uneven_map),
	T_CASE(test_hostile_sets),
	T_CASE(test_expert_on_two_ranks),
	T_CASE(test_split_refusals),
	T_CASE(test_unresolvable_fused),
	T_CASE(test_load_rank),
	T_CASE(test_expert_digests_layout_free),
	T_CASE(test_index_roundtrip),
	T_CASE(test_publish_all_or_nothing),
	T_CASE(test_existing_outputs),
	T_CASE(test_large_shapes),
};

T_MAIN(cases)
