/*
 * t_frontend.c: the library functions that hold what a front end (a tool,
 * the Python package, mstrain) would otherwise do itself: verify and
 * record, the states under a path, the quantized state's self-checks, the
 * records a conversion, a split and a policy leave in the inventory, and
 * the footprint of an inventoried state.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <sys/stat.h>

#include "test.h"
#include "footprint.h"
#include "inventory.h"
#include "policy.h"
#include "quant.h"
#include "shard.h"
#include "verify.h"

static char *fx(const char *rel)
{
	static char buf[4][512];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", T_FIXTURES, rel);
	return buf[k];
}

static char *tmp(const char *rel)
{
	static char buf[4][512];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", T_TMP, rel);
	return buf[k];
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
	char cmd[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return system(cmd);
}

/* A writable copy of a fixture under T_TMP/name. */
static const char *copy_fixture(const char *rel, const char *name)
{
	const char *dst = tmp(name);

	if (sh("rm -rf '%s' && cp -r '%s' '%s' && chmod -R u+w '%s'", dst, fx(rel), dst, dst))
		return NULL;
	return dst;
}

static struct ms_inv *fresh(const char *name)
{
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};

	unlink(tmp(name));
	if (ms_inv_open(tmp(name), MS_INV_CREATE, &inv, &err) != MS_OK)
		fprintf(stderr, "open: %s\n", err.msg);
	return inv;
}

static int add(struct ms_inv *inv, const char *path, const char *label,
	       char digest[MS_STATE_DIGEST_LEN])
{
	struct ms_inv_add_opts o;
	struct ms_err err = {0};
	int rc;

	ms_inv_add_opts_init(&o);
	o.label = label;
	if ((rc = ms_inv_add_paths(inv, &path, 1, &o, digest, &err)) != MS_OK)
		fprintf(stderr, "add '%s': %s\n", path, err.msg);
	return rc;
}

static int flip(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	if (fd < 0 || pread(fd, &b, 1, off) != 1)
		return -1;
	b ^= 1;
	if (pwrite(fd, &b, 1, off) != 1)
		return -1;
	return close(fd);
}

/* The parameters of the one edge from parent to child, by operation. */
static char *edge_params(struct ms_inv *inv, const char *child, const char *op)
{
	struct ms_inv_edge *e = NULL;
	struct ms_err err = {0};
	char *p = NULL;
	size_t n = 0;

	if (ms_inv_edges(inv, child, MS_INV_EDGES_PARENTS, &e, &n, &err) != MS_OK)
		return NULL;
	for (size_t i = 0; i < n && !p; i++)
		if (!strcmp(e[i].operation, op))
			p = ms_strdup(e[i].params);
	ms_inv_edges_free(e, n);
	return p;
}

static int test_verify_record(void)
{
	struct ms_inv *inv = fresh("vr.db");
	const char *dir = copy_fixture("hf/qwen3moe", "vr");
	char d[MS_STATE_DIGEST_LEN], file[600];
	struct ms_inv_verification *v = NULL;
	struct ms_vstate *s = NULL;
	struct ms_vreport r;
	struct ms_err err = {0};
	size_t n = 0, added = 7;

	T_ASSERT(inv && dir);
	T_ASSERT_EQ_INT(add(inv, dir, NULL, d), MS_OK);
	T_ASSERT_EQ_INT(ms_vstate_from_inv(inv, d, 0, &s, &err), MS_OK);
	/* a dry run records nothing */
	T_ASSERT_EQ_INT(ms_verify_record(inv, d, s, MS_VERIFY_NO_RECORD, 2, &r, &added, &err), MS_OK);
	ms_vreport_release(&r);
	T_ASSERT_EQ_INT(added, 0);
	T_ASSERT_EQ_INT(ms_inv_verifications(inv, d, &v, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 0);
	ms_inv_verifications_free(v, n);
	/* an ok verification is recorded with the bytes hashed */
	T_ASSERT_EQ_INT(ms_verify_record(inv, d, s, MS_VERIFY_TREES, 2, &r, &added, &err), MS_OK);
	T_ASSERT(r.bytes > 0);
	ms_vreport_release(&r);
	T_ASSERT_EQ_INT(ms_inv_verifications(inv, d, &v, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 1);
	T_ASSERT_EQ_INT(v[0].result, MS_INV_RESULT_OK);
	T_ASSERT(v[0].nbytes > 0);
	ms_inv_verifications_free(v, n);
	/* a flipped byte: MS_ECHECK, the problems listed, a mismatch recorded */
	snprintf(file, sizeof(file), "%s/model.safetensors", dir);
	T_ASSERT_EQ_INT(flip(file, 4000), 0);
	T_ASSERT_EQ_INT(ms_verify_record(inv, d, s, 0, 2, &r, NULL, &err), MS_ECHECK);
	T_ASSERT(r.nproblems > 0);
	ms_vreport_release(&r);
	T_ASSERT_EQ_INT(ms_inv_verifications(inv, d, &v, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 2);
	T_ASSERT_EQ_INT(v[0].result, MS_INV_RESULT_MISMATCH);
	ms_inv_verifications_free(v, n);
	/* the file gone: recorded as missing */
	T_ASSERT_EQ_INT(unlink(file), 0);
	T_ASSERT_EQ_INT(ms_verify_record(inv, d, s, 0, 2, &r, NULL, &err), MS_ECHECK);
	ms_vreport_release(&r);
	T_ASSERT_EQ_INT(ms_inv_verifications(inv, d, &v, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 3);
	T_ASSERT_EQ_INT(v[0].result, MS_INV_RESULT_MISSING);
	ms_inv_verifications_free(v, n);
	ms_vstate_free(s);
	ms_inv_close(inv);
	return 0;
}

static int test_states_under(void)
{
	struct ms_inv *inv = fresh("su.db");
	char a[MS_STATE_DIGEST_LEN], b[MS_STATE_DIGEST_LEN], (*out)[MS_STATE_DIGEST_LEN] = NULL;
	struct ms_err err = {0};
	size_t n = 0;

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(sh("rm -rf '%s' && mkdir -p '%s/empty'", tmp("su"), tmp("su")), 0);
	/* "d" and "dd": a path is not a prefix of its sibling's */
	T_ASSERT(copy_fixture("hf/qwen3moe", "su/d"));
	T_ASSERT(copy_fixture("hf/mixtral", "su/dd"));
	T_ASSERT_EQ_INT(add(inv, tmp("su/d"), NULL, a), MS_OK);
	T_ASSERT_EQ_INT(add(inv, tmp("su/dd"), NULL, b), MS_OK);
	T_ASSERT_EQ_INT(ms_verify_states_under(inv, tmp("su/d"), &out, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 1);
	T_ASSERT_STR(out[0], a);
	ms_free(out);
	/* a file of the state, and the directory above both */
	T_ASSERT_EQ_INT(ms_verify_states_under(inv, tmp("su/dd/model.safetensors"), &out, &n, &err),
			MS_OK);
	T_ASSERT_EQ_INT(n, 1);
	T_ASSERT_STR(out[0], b);
	ms_free(out);
	T_ASSERT_EQ_INT(ms_verify_states_under(inv, tmp("su"), &out, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 2);
	ms_free(out);
	T_ASSERT_EQ_INT(ms_verify_states_under(inv, tmp("su/empty"), &out, &n, &err), MS_ENOTFOUND);
	T_ASSERT(!out && n == 0);
	T_ASSERT_MSG(strstr(err.msg, "no inventoried state has files there"), "%s", err.msg);
	T_ASSERT_EQ_INT(ms_verify_states_under(inv, tmp("su/none"), &out, &n, &err), MS_ENOTFOUND);
	ms_inv_close(inv);
	return 0;
}

/* Quantize the small fixture into T_TMP/name. */
static int quantize(const char *name, enum ms_nvfp4_block block, unsigned layouts,
		    struct ms_quant_opts *o)
{
	struct ms_quant_plan *p = NULL;
	struct ms_err err = {0};
	int rc;

	memset(o, 0, sizeof(*o));
	o->op = MS_QUANT_OP_QUANTIZE;
	o->recipe = MS_NVFP4_RECIPE_COMPRESSED_TENSORS;
	o->block = block;
	o->layouts = layouts;
	o->force = 1;
	o->jobs = 2;
	rc = ms_quant_plan_new(fx("hf/qwen3moe"), tmp(name), o, &p, &err);
	if (rc == MS_OK)
		rc = ms_quant_execute(p, NULL, NULL, &err);
	if (rc != MS_OK)
		fprintf(stderr, "quantize: %s\n", err.msg);
	ms_quant_plan_free(p);
	return rc;
}

static int test_layouts_agree(void)
{
	struct ms_quant_opts o;
	struct ms_ckpt *c = NULL;
	struct ms_qview v;
	struct ms_err err = {0};
	double diff = -1;

	/* 2D blocks: the columnwise copy is the exact transpose */
	T_ASSERT_EQ_INT(quantize("la2", MS_NVFP4_BLOCK_2D, MS_QUANT_ROWWISE | MS_QUANT_COLUMNWISE, &o),
			MS_OK);
	T_ASSERT_EQ_INT(ms_ckpt_open(tmp("la2"), &c, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_qview_open(c, &v, &err), MS_OK);
	T_ASSERT(v.nweights >= 2);
	for (size_t i = 0; i < v.nweights; i++) {
		T_ASSERT_EQ_INT(ms_qweight_layouts_agree(&v.weights[i], 2, &diff, &err), MS_OK);
		T_ASSERT_MSG(diff == 0, "%s: %g", v.weights[i].prefix, diff);
	}
	/* another weight's columnwise copy of the same shape is not */
	for (size_t i = 1; i < v.nweights; i++) {
		struct ms_qweight w = v.weights[0];
		const struct ms_qweight *x = &v.weights[i];

		if (x->rows != w.rows || x->cols != w.cols)
			continue;
		w.packed[MS_NVFP4_LAYOUT_COLUMNWISE] = x->packed[MS_NVFP4_LAYOUT_COLUMNWISE];
		w.scales[MS_NVFP4_LAYOUT_COLUMNWISE] = x->scales[MS_NVFP4_LAYOUT_COLUMNWISE];
		T_ASSERT_EQ_INT(ms_qweight_layouts_agree(&w, 2, &diff, &err), MS_OK);
		T_ASSERT(diff == 1);
		/* one layout only: nothing to compare */
		w.packed[MS_NVFP4_LAYOUT_COLUMNWISE] = NULL;
		T_ASSERT_EQ_INT(ms_qweight_layouts_agree(&w, 2, &diff, &err), MS_EINVAL);
		break;
	}
	ms_qview_release(&v);
	ms_ckpt_close(c);
	/* 1D blocks: the two decodes are close, not equal */
	T_ASSERT_EQ_INT(quantize("la1", MS_NVFP4_BLOCK_1D, MS_QUANT_ROWWISE | MS_QUANT_COLUMNWISE, &o),
			MS_OK);
	T_ASSERT_EQ_INT(ms_ckpt_open(tmp("la1"), &c, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_qview_open(c, &v, &err), MS_OK);
	for (size_t i = 0; i < v.nweights; i++) {
		T_ASSERT_EQ_INT(ms_qweight_layouts_agree(&v.weights[i], 2, &diff, &err), MS_OK);
		T_ASSERT_MSG(diff > 0 && diff < 0.2, "%s: %g", v.weights[i].prefix, diff);
	}
	ms_qview_release(&v);
	ms_ckpt_close(c);
	return 0;
}

static int test_edge_check(void)
{
	struct ms_quant_opts o;
	struct ms_ckpt *c = NULL;
	struct ms_qview v;
	struct ms_err err = {0};
	char why[256], ok[256];
	const struct ms_qweight *w;

	T_ASSERT_EQ_INT(quantize("ec", MS_NVFP4_BLOCK_1D, MS_QUANT_ROWWISE, &o), MS_OK);
	T_ASSERT_EQ_INT(ms_ckpt_open(tmp("ec"), &c, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_qview_open(c, &v, &err), MS_OK);
	T_ASSERT(v.nweights > 0);
	w = &v.weights[0];
	snprintf(ok, sizeof(ok), "{\"recipe\":\"%s\",\"block\":\"%s\",\"layouts\":[\"rowwise\"]}",
		 ms_nvfp4_recipe_name(w->recipe), ms_nvfp4_block_name(w->block));
	T_ASSERT_EQ_INT(ms_qweight_edge_check(w, ok, why, sizeof(why), &err), MS_OK);
	T_ASSERT_EQ_INT(ms_qweight_edge_check(w, "{}", why, sizeof(why), &err), MS_OK);
	T_ASSERT_EQ_INT(ms_qweight_edge_check(w, "{\"recipe\":\"no-such\"}", why, sizeof(why), &err),
			MS_ECHECK);
	T_ASSERT_MSG(strstr(why, "the quantize edge records no-such"), "%s", why);
	T_ASSERT_EQ_INT(ms_qweight_edge_check(w, "{\"block\":\"2d\"}", why, sizeof(why), &err),
			MS_ECHECK);
	T_ASSERT_MSG(strstr(why, "blocks, the quantize edge records 2d"), "%s", why);
	T_ASSERT_EQ_INT(ms_qweight_edge_check(w, "{\"layouts\":[\"rowwise\",\"columnwise\"]}", why,
					      sizeof(why), &err),
			MS_ECHECK);
	T_ASSERT_STR(why, "no columnwise copy, the quantize edge records one");
	T_ASSERT_EQ_INT(ms_qweight_edge_check(w, "not json", why, sizeof(why), &err), MS_EINVAL);
	ms_qview_release(&v);
	ms_ckpt_close(c);
	return 0;
}

static int test_quant_register(void)
{
	struct ms_inv *inv = fresh("qr.db");
	struct ms_quant_opts o;
	struct ms_err err = {0};
	char d[MS_STATE_DIGEST_LEN], byl[MS_STATE_DIGEST_LEN], want[512], *params;

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(quantize("qr", MS_NVFP4_BLOCK_2D, MS_QUANT_ROWWISE | MS_QUANT_COLUMNWISE, &o),
			MS_OK);
	o.include = "experts";
	T_ASSERT_EQ_INT(ms_quant_register(inv, fx("hf/qwen3moe"), tmp("qr"), &o, "msconvert", "q4", d,
					  &err),
			MS_OK);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "q4", byl, &err), MS_OK);
	T_ASSERT_STR(byl, d);
	/* the edge's parameters, byte for byte */
	snprintf(want, sizeof(want),
		 "{\"tool\":\"msconvert %s\",\"layouts\":[\"rowwise\",\"columnwise\"],\"recipe\":\"%s\","
		 "\"block\":\"2d\",\"format\":\"%s\",\"fuse_scales\":true,\"experts\":\"%s\","
		 "\"include\":\"experts\"}",
		 MS_VERSION, ms_nvfp4_recipe_name(o.recipe),
		 ms_quant_format_name(ms_quant_default_format(o.recipe)),
		 ms_quant_experts_name(o.experts));
	params = edge_params(inv, d, "quantize");
	T_ASSERT_STR(params, want);
	ms_free(params);
	/* a dequantization records its dtype */
	o.op = MS_QUANT_OP_DEQUANTIZE;
	o.dtype = MS_DTYPE_BF16;
	T_ASSERT_STR(ms_quant_op_name(o.op), "dequantize");
	ms_inv_close(inv);
	return 0;
}

static int test_shard_register(void)
{
	struct ms_inv *inv = fresh("sr.db");
	struct ms_shard_opts so = {.ep_size = 2, .force = 1};
	struct ms_shard_result *r = NULL;
	struct ms_err err = {0};
	char d[MS_STATE_DIGEST_LEN], want[512], *params;
	size_t k;

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(ms_shard_split(fx("hf/qwen3moe"), tmp("sr"), &so, &r, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_shard_register(inv, MS_SHARD_OP_SPLIT, fx("hf/qwen3moe"), r, "ep", &err),
			MS_OK);
	for (k = 0; k < r->nfiles && r->files[k].rank != 1; k++)
		;
	T_ASSERT(k < r->nfiles);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "ep/rank1", d, &err), MS_OK);
	T_ASSERT_STR(d, r->files[k].state_digest);
	{
		size_t w = (size_t)snprintf(want, sizeof(want),
					    "{\"ep_size\":2,\"placement\":\"%s\",\"rank\":1,\"experts\":[",
					    ms_ep_placement_name(r->placement->kind));

		for (uint32_t e = 0; e < r->files[k].nexperts; e++)
			w += (size_t)snprintf(want + w, sizeof(want) - w, e ? ",%u" : "%u",
					      r->files[k].experts[e]);
		snprintf(want + w, sizeof(want) - w, "]}");
	}
	params = edge_params(inv, d, "split");
	T_ASSERT_STR(params, want);
	ms_free(params);
	T_ASSERT_STR(ms_shard_op_name(MS_SHARD_OP_RESHARD), "reshard");
	ms_shard_result_free(r);
	ms_inv_close(inv);
	return 0;
}

static int test_policy_register(void)
{
	struct ms_inv *inv = fresh("pr.db");
	const char *served[2];
	struct ms_policy_report *r = NULL;
	struct ms_ckpt *c = NULL;
	struct ms_inv_state *st = NULL;
	struct ms_inv_add_opts o;
	struct ms_err err = {0};
	char base[MS_STATE_DIGEST_LEN], lora[MS_STATE_DIGEST_LEN], d[MS_STATE_DIGEST_LEN];
	char want[1024], *params;
	const char *adapter = fx("peft/qwen3moe-E8-r4/adapter"), *bp = "base";

	/* a base and an adapter trained from it, served side by side */
	T_ASSERT(inv);
	T_ASSERT_EQ_INT(add(inv, fx("peft/qwen3moe-E8-r4/base"), "base", base), MS_OK);
	ms_inv_add_opts_init(&o);
	o.label = "lora";
	o.parents = &bp;
	o.nparents = 1;
	o.operation = "train";
	T_ASSERT_EQ_INT(ms_inv_add_paths(inv, &adapter, 1, &o, lora, &err), MS_OK);
	T_ASSERT_EQ_INT(sh("rm -rf '%s' && mkdir -p '%s' && cp -r '%s' '%s' '%s/'", tmp("pr"),
			   tmp("pr"), fx("peft/qwen3moe-E8-r4/base"), adapter, tmp("pr")), 0);
	served[0] = tmp("pr/base");
	served[1] = tmp("pr/adapter");
	T_ASSERT_EQ_INT(ms_ckpt_open_many(served, 2, &c, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_ckpt_hash(c, 2, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_policy_from_ckpt(c, &r, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_policy_identify(inv, r, &err), MS_OK);
	T_ASSERT_EQ_INT(r->nparts, 2);
	T_ASSERT_MSG(ms_policy_register(inv, r, served, 2, "pol", 2, d, &err) == MS_OK, "%s",
		     err.msg);
	T_ASSERT_EQ_INT(ms_inv_state_get(inv, d, &st, &err), MS_OK);
	T_ASSERT_STR(st->label, "pol");
	T_ASSERT_EQ_INT(st->kind, MS_INV_KIND_POLICY);
	ms_inv_state_free(st);
	/* the parts in the report's order, each with what it serves */
	{
		size_t w = (size_t)snprintf(want, sizeof(want), "{\"parts\":[");

		for (size_t i = 0; i < r->nparts; i++) {
			const struct ms_policy_part *p = &r->parts[i];
			char lay[64] = "";

			if (p->layout)
				snprintf(lay, sizeof(lay), ",\"layout\":\"%s\"", p->layout);
			w += (size_t)snprintf(want + w, sizeof(want) - w,
					      "%s{\"state\":\"%s\",\"kind\":\"%s\"%s,\"tensors\":%llu}",
					      i ? "," : "", p->state, ms_inv_kind_name(p->kind), lay,
					      (unsigned long long)p->served);
		}
		snprintf(want + w, sizeof(want) - w, "]}");
	}
	T_ASSERT(strstr(want, base) && strstr(want, lora));
	params = edge_params(inv, d, "compose");
	T_ASSERT_STR(params, want);
	ms_free(params);
	ms_policy_report_free(r);
	ms_ckpt_close(c);
	ms_inv_close(inv);
	return 0;
}

static int test_fp_calc_add_state(void)
{
	struct ms_inv *inv = fresh("fp.db");
	char d[MS_STATE_DIGEST_LEN], json[1024];
	uint64_t total[2] = {0, 0};
	struct ms_err err = {0};

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(add(inv, fx("hf/qwen3moe"), "fpbase", d), MS_OK);
	/* the same checkpoint as a path entry and as a state entry: the
	 * record gives what the headers give */
	for (int k = 0; k < 2; k++) {
		struct ms_fp_plan *p = NULL;
		struct ms_fp_calc *c = NULL;
		struct ms_fp_report *rep = NULL;

		snprintf(json, sizeof(json),
			 "{\"ep_size\": 1, \"states\": [{\"role\": \"b\", \"%s\": \"%s\", "
			 "\"repr\": \"nvfp4-rowwise\"}]}",
			 k ? "state" : "path", k ? "fpbase" : fx("hf/qwen3moe"));
		T_ASSERT_EQ_INT(ms_fp_plan_parse(json, strlen(json), "t.json", &p, &err), MS_OK);
		T_ASSERT_EQ_INT(ms_fp_calc_new(p, &c, &err), MS_OK);
		if (k)
			T_ASSERT_EQ_INT(ms_fp_calc_add_state(c, 0, inv, "fpbase", &err), MS_OK);
		else
			T_ASSERT_EQ_INT(ms_fp_calc_add_path(c, 0, &err), MS_OK);
		T_ASSERT_EQ_INT(ms_fp_calc_finish(c, &rep, &err), MS_OK);
		total[k] = rep->total_bytes_per_gpu;
		ms_fp_report_free(rep);
		ms_fp_calc_free(c);
		ms_fp_plan_free(p);
	}
	T_ASSERT(total[0] > 0);
	T_ASSERT_EQ_INT(total[1], total[0]);
	{
		struct ms_fp_plan *p = NULL;
		struct ms_fp_calc *c = NULL;

		T_ASSERT_EQ_INT(ms_fp_plan_parse(json, strlen(json), "t.json", &p, &err), MS_OK);
		T_ASSERT_EQ_INT(ms_fp_calc_new(p, &c, &err), MS_OK);
		T_ASSERT_EQ_INT(ms_fp_calc_add_state(c, 0, inv, "no-such-label", &err), MS_ENOTFOUND);
		ms_fp_calc_free(c);
		ms_fp_plan_free(p);
	}
	ms_inv_close(inv);
	return 0;
}

static int test_inv_text(void)
{
	struct ms_inv_config c = {0};
	struct ms_err err = {0};
	char *t = NULL;
	char cfg[] = "{\"hidden_size\": 8, \"quantization_config\": {\"quant_method\": \"modelopt\", "
		     "\"group_size\": 16}}";

	T_ASSERT_EQ_INT(ms_inv_argv_text("[\"msinv\", \"add\", \"--label\", \"a b\"]", &t, &err), MS_OK);
	T_ASSERT_STR(t, "msinv add --label a b");
	ms_free(t);
	T_ASSERT_EQ_INT(ms_inv_argv_text(NULL, &t, &err), MS_OK);
	T_ASSERT(t == NULL);
	/* not an array: nothing to show, not an error */
	T_ASSERT_EQ_INT(ms_inv_argv_text("{", &t, &err), MS_OK);
	T_ASSERT_STR(t, "");
	ms_free(t);
	c.name = "config.json";
	c.text = cfg;
	c.len = strlen(cfg);
	T_ASSERT_EQ_INT(ms_inv_config_quant(&c, &t, &err), MS_OK);
	T_ASSERT_STR(t, "{\"quant_method\":\"modelopt\",\"group_size\":16}");
	ms_free(t);
	c.name = "generation_config.json";
	T_ASSERT_EQ_INT(ms_inv_config_quant(&c, &t, &err), MS_OK);
	T_ASSERT(t == NULL);
	c.name = "config.json";
	c.text = "{\"hidden_size\": 8}";
	c.len = strlen(c.text);
	T_ASSERT_EQ_INT(ms_inv_config_quant(&c, &t, &err), MS_OK);
	T_ASSERT(t == NULL);
	return 0;
}

static int test_st_file_info(void)
{
	struct ms_ckpt *c = NULL;
	struct ms_st_file_info fi;
	struct ms_err err = {0};
	const struct ms_st_file *f;

	T_ASSERT_EQ_INT(ms_ckpt_open(fx("hf/qwen3moe"), &c, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_ckpt_hash(c, 2, 0, &err), MS_OK);
	T_ASSERT(c->nfiles == 1);
	f = c->files[0];
	ms_st_file_info(f, &fi);
	T_ASSERT_STR(fi.path, f->path);
	T_ASSERT_EQ_INT(fi.size, f->size);
	T_ASSERT_EQ_INT(fi.header_len, f->header_len);
	T_ASSERT(8 + fi.header_len < fi.size);
	T_ASSERT_EQ_INT(fi.ntensors, c->ntensors);
	T_ASSERT_EQ_INT(fi.nmeta, f->nmeta);
	T_ASSERT(fi.meta == f->meta);
	T_ASSERT(!memcmp(fi.header_digest, f->header_digest, MS_SHA256_LEN));
	T_ASSERT(f->has_header_digest);
	T_ASSERT(fi.file_digest == f->file_digest);
	ms_ckpt_close(c);
	return 0;
}

static int test_quant_staged_path(void)
{
	struct ms_quant_opts o = {.op = MS_QUANT_OP_QUANTIZE, .recipe = MS_NVFP4_RECIPE_MODELOPT,
				  .block = MS_NVFP4_BLOCK_1D, .layouts = MS_QUANT_ROWWISE, .jobs = 2};
	struct ms_quant_plan *p = NULL;
	struct ms_err err = {0};
	struct stat st;
	const char *staged;
	char *keep;

	T_ASSERT_EQ_INT(sh("rm -rf '%s'", tmp("sp")), 0);
	T_ASSERT_EQ_INT(ms_quant_plan_new(fx("hf/qwen3moe"), tmp("sp"), &o, &p, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_quant_stage(p, NULL, NULL, &err), MS_OK);
	/* the staged output exists under its staging name, beside OUT */
	staged = ms_quant_staged_path(p);
	T_ASSERT(staged && strstr(staged, ".tmp-"));
	T_ASSERT_EQ_INT(stat(staged, &st), 0);
	T_ASSERT(stat(tmp("sp"), &st) != 0);
	keep = ms_strdup(staged);
	/* nothing kept: the staging is removed */
	ms_quant_finish(p, 0);
	T_ASSERT(stat(keep, &st) != 0);
	ms_free(keep);
	ms_quant_plan_free(p);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_st_file_info),
	T_CASE(test_quant_staged_path),
	T_CASE(test_inv_text),
	T_CASE(test_verify_record),
	T_CASE(test_states_under),
	T_CASE(test_layouts_agree),
	T_CASE(test_edge_check),
	T_CASE(test_quant_register),
	T_CASE(test_shard_register),
	T_CASE(test_policy_register),
	T_CASE(test_fp_calc_add_state),
};

T_MAIN(cases)
