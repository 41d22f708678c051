/*
 * fz_adapter_config.c: fuzz target for the readers of adapter_config.json
 * and config.json. They are internal to their modules, so the input goes
 * in as a file beside a valid model and the public entry point that reads
 * the directory is called. The first byte picks the reader:
 *   'C'   the rest is config.json beside the qwen3moe-E8-r4 adapter (fused
 *         expert LoRA) and its own adapter_config.json: the expert count
 *         keys, read by an EP split (ms_shard_split, dry run);
 *   'Q'   the rest is config.json of a one-weight BF16 model converted to
 *         NVFP4 (ms_quant_plan_new + ms_quant_execute), which rewrites it
 *         with a quantization_config;
 *   other the whole input is adapter_config.json beside the adapter's
 *         tensors: "r", "rank_pattern" (its keys are regular expressions)
 *         and "target_parameters", read by the split's dry run, for an EP
 *         size of 1 + size % 4.
 * Whatever the bytes, a refusal is one line with the code returned; a dry
 * run writes nothing; an accepted split places every expert evenly (E
 * follows "r": the fused factors hold E*r rows); a conversion that
 * succeeds writes a config.json that is a JSON object with a
 * quantization_config.
 */
#include <assert.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "quant.h"
#include "shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char root[400], adapter[500], acfg[600], mcfg[600], out[500];
static char base[500], base_cfg[600], qout[500];
static char *fixture_acfg;
static size_t fixture_acfg_len;

static void rm_dir(const char *dir)
{
	char path[900];
	struct dirent *de;
	DIR *d = opendir(dir);

	while (d && (de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

static void cleanup(void)
{
	rm_dir(adapter);
	rm_dir(base);
	rm_dir(qout);
	rm_dir(out);
	rmdir(root);
	free(fixture_acfg);
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	assert(f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0);
	buf = malloc((size_t)n + 1);
	assert(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	buf[n] = 0;
	*len = (size_t)n;
	return buf;
}

static void spill(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");

	assert(f);
	assert(n == 0 || fwrite(p, 1, n, f) == n);
	assert(fclose(f) == 0);
}

/* One BF16 attention weight [16, 16] with finite, distinct values. */
static void write_base(const char *path)
{
	static const char hdr[] = "{\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\","
				  "\"shape\":[16,16],\"data_offsets\":[0,512]}}";
	size_t n = sizeof(hdr) - 1, pad = (8 - n % 8) % 8;
	uint8_t buf[8 + 256 + 512];
	size_t k = 0;

	for (int i = 0; i < 8; i++)
		buf[k++] = (uint8_t)((uint64_t)(n + pad) >> (8 * i));
	memcpy(buf + k, hdr, n);
	k += n;
	memset(buf + k, ' ', pad);
	k += pad;
	for (int i = 0; i < 256; i++) {
		/* bf16 of (i - 128) / 64: sign, exponent and mantissa vary */
		float v = (float)(i - 128) / 64.0f;
		uint32_t u;

		memcpy(&u, &v, 4);
		buf[k++] = (uint8_t)(u >> 16);
		buf[k++] = (uint8_t)(u >> 24);
	}
	spill(path, buf, k);
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR"), *fx = getenv("MS_FIXTURES");
	char src[4096], path[700];
	size_t n;
	char *t;

	fx = fx && *fx ? fx : "tests/fixtures";
	snprintf(root, sizeof(root), "%s/ms-fz-config-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
	assert(mkdtemp(root));
	atexit(cleanup);
	snprintf(adapter, sizeof(adapter), "%s/adapter", root);
	snprintf(acfg, sizeof(acfg), "%s/adapter_config.json", adapter);
	snprintf(mcfg, sizeof(mcfg), "%s/config.json", adapter);
	snprintf(out, sizeof(out), "%s/out", root);
	snprintf(base, sizeof(base), "%s/base", root);
	snprintf(base_cfg, sizeof(base_cfg), "%s/config.json", base);
	snprintf(qout, sizeof(qout), "%s/qout", root);
	assert(mkdir(adapter, 0755) == 0 && mkdir(base, 0755) == 0);
	snprintf(src, sizeof(src), "%s/peft/qwen3moe-E8-r4/adapter/adapter_model.safetensors", fx);
	t = slurp(src, &n);
	snprintf(path, sizeof(path), "%s/adapter_model.safetensors", adapter);
	spill(path, t, n);
	free(t);
	snprintf(src, sizeof(src), "%s/peft/qwen3moe-E8-r4/adapter/adapter_config.json", fx);
	fixture_acfg = slurp(src, &fixture_acfg_len);
	snprintf(path, sizeof(path), "%s/model.safetensors", base);
	write_base(path);
}

static int exists(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0;
}

static void one_line(int rc, const struct ms_err *err)
{
	assert(err->code == rc);
	assert(err->msg[0] && strchr(err->msg, '\n') == NULL);
}

static void split(uint32_t ep)
{
	struct ms_shard_opts o = {0};
	struct ms_shard_result *res = NULL;
	struct ms_err err = {0};
	int rc;

	o.ep_size = ep;
	o.dry_run = 1;
	o.nthreads = 1;
	rc = ms_shard_split(adapter, out, &o, &res, &err);
	if (getenv("FZ_CONFIG_VERBOSE"))
		fprintf(stderr, "fz_adapter_config: split: rc %d: %s\n", rc, rc ? err.msg : "ok");
	assert(!exists(out));
	if (rc != MS_OK) {
		assert(res == NULL && rc == MS_EINVAL);
		one_line(rc, &err);
		return;
	}
	/* E is rows / r of the fused factors: another "r" is another E */
	assert(res && res->is_adapter && res->ep_size == ep);
	assert(res->num_experts >= 1 && res->num_experts % ep == 0);
	assert(res->r >= 1 && strstr(res->packing, "fused"));
	assert(res->nfiles == ep && !res->manifest_path);
	for (size_t i = 0; i < res->nfiles; i++)
		assert(res->files[i].rank == i && res->files[i].nexperts == res->num_experts / ep);
	ms_shard_result_free(res);
}

static void convert(void)
{
	struct ms_quant_opts o;
	struct ms_quant_plan *p = NULL;
	struct ms_err err = {0};
	char path[700], *t;
	size_t n;
	cJSON *j;
	int rc;

	memset(&o, 0, sizeof(o));
	o.op = MS_QUANT_OP_QUANTIZE;
	o.recipe = MS_NVFP4_RECIPE_MODELOPT;
	o.block = MS_NVFP4_BLOCK_1D;
	o.layouts = MS_QUANT_ROWWISE;
	o.device = MS_QUANT_DEVICE_CPU;
	o.jobs = 1;
	o.force = 1;
	rc = ms_quant_plan_new(base, qout, &o, &p, &err);
	if (rc == MS_OK)
		rc = ms_quant_execute(p, NULL, NULL, &err);
	ms_quant_plan_free(p);
	if (getenv("FZ_CONFIG_VERBOSE"))
		fprintf(stderr, "fz_adapter_config: convert: rc %d: %s\n", rc, rc ? err.msg : "ok");
	if (rc != MS_OK) {
		assert(rc == MS_EINVAL);
		one_line(rc, &err);
		return;
	}
	snprintf(path, sizeof(path), "%s/config.json", qout);
	t = slurp(path, &n);
	j = cJSON_ParseWithLength(t, n);
	assert(cJSON_IsObject(j));
	assert(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "quantization_config")));
	cJSON_Delete(j);
	free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!root[0])
		setup();
	if (size && data[0] == 'Q') {
		spill(base_cfg, data + 1, size - 1);
		convert();
		return 0;
	}
	if (size && data[0] == 'C') {
		spill(acfg, fixture_acfg, fixture_acfg_len);
		spill(mcfg, data + 1, size - 1);
	} else {
		spill(acfg, data, size);
		unlink(mcfg);
	}
	split(1 + (uint32_t)(size % 4));
	return 0;
}
