/*
 * msinv: the inventory of model weight states. This file parses arguments,
 * calls libms and prints; everything else lives in src/.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "names.h"

/* ---- inspect --------------------------------------------------------------- */

static void print_structure(const char *name, char *buf, size_t n)
{
	struct ms_name_info info;

	if (ms_name_parse(name, &info) != MS_OK) {
		snprintf(buf, n, "-");
		return;
	}
	ms_name_info_str(&info, buf, n);
}

static cJSON *structure_json(const char *name)
{
	struct ms_name_info info;
	cJSON *o = cJSON_CreateObject();

	if (!o || ms_name_parse(name, &info) != MS_OK)
		return o;
	if (info.layer >= 0)
		cJSON_AddNumberToObject(o, "layer", info.layer);
	if (info.expert >= 0)
		cJSON_AddNumberToObject(o, "expert", info.expert);
	cJSON_AddStringToObject(o, "part", ms_name_part_str(info.part));
	if (info.proj[0])
		cJSON_AddStringToObject(o, "proj", info.proj);
	cJSON_AddStringToObject(o, "role", ms_name_role_str(info.role));
	if (info.lora_nesting >= 0)
		cJSON_AddNumberToObject(o, "lora_nesting", info.lora_nesting);
	return o;
}

static cJSON *shape_json(const struct ms_tensor *t)
{
	cJSON *a = cJSON_CreateArray();

	for (uint32_t d = 0; a && d < t->ndim; d++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber((double)t->shape[d]));
	return a;
}

static int inspect_json(struct ms_ckpt *c, int digests, int file_digests,
			const char *state)
{
	cJSON *root = cJSON_CreateObject(), *files, *tensors, *configs;
	char hex[65], *text;
	int rc = CLI_OK;

	if (!root)
		goto oom;
	files = cJSON_AddArrayToObject(root, "files");
	for (size_t i = 0; i < c->nfiles; i++) {
		struct ms_st_file *f = c->files[i];
		cJSON *o = cJSON_CreateObject(), *meta;

		cJSON_AddItemToArray(files, o);
		cJSON_AddStringToObject(o, "path", f->path);
		cJSON_AddNumberToObject(o, "size", (double)f->size);
		cJSON_AddNumberToObject(o, "header_bytes", (double)(8 + f->header_len));
		cJSON_AddNumberToObject(o, "tensors", (double)f->ntensors);
		if (digests) {
			ms_hex(f->header_digest, 32, hex);
			cJSON_AddStringToObject(o, "header_sha256", hex);
		}
		if (file_digests) {
			ms_hex(f->file_digest, 32, hex);
			cJSON_AddStringToObject(o, "sha256", hex);
		}
		meta = cJSON_AddObjectToObject(o, "metadata");
		for (size_t m = 0; m < f->nmeta; m++)
			cJSON_AddStringToObject(meta, f->meta[m].key, f->meta[m].value);
	}
	configs = cJSON_AddArrayToObject(root, "configs");
	for (size_t i = 0; i < c->nconfigs; i++) {
		cJSON *o = cJSON_CreateObject();

		cJSON_AddItemToArray(configs, o);
		cJSON_AddStringToObject(o, "name", c->configs[i].name);
		ms_hex(c->configs[i].digest, 32, hex);
		cJSON_AddStringToObject(o, "sha256", hex);
	}
	tensors = cJSON_AddArrayToObject(root, "tensors");
	for (size_t i = 0; i < c->ntensors; i++) {
		const struct ms_tensor *t = c->tensors[i];
		cJSON *o = cJSON_CreateObject();

		cJSON_AddItemToArray(tensors, o);
		cJSON_AddStringToObject(o, "name", t->name);
		cJSON_AddStringToObject(o, "dtype", ms_dtype_name(t->dtype));
		cJSON_AddItemToObject(o, "shape", shape_json(t));
		cJSON_AddNumberToObject(o, "bytes", (double)t->nbytes);
		cJSON_AddStringToObject(o, "file", ms_path_base(t->file->path));
		cJSON_AddNumberToObject(o, "offset", (double)t->offset);
		cJSON_AddItemToObject(o, "structure", structure_json(t->name));
		if (digests) {
			ms_hex(t->digest, 32, hex);
			cJSON_AddStringToObject(o, "sha256", hex);
		}
	}
	if (state)
		cJSON_AddStringToObject(root, "state_digest", state);
	text = cJSON_Print(root);
	if (!text)
		goto oom;
	puts(text);
	cJSON_free(text);
	cJSON_Delete(root);
	return rc;
oom:
	cJSON_Delete(root);
	cli_errorf("out of memory");
	return CLI_IO;
}

static int cmd_inspect(int argc, char **argv)
{
	static const struct option opts[] = {
		{"digests", no_argument, NULL, 'd'},
		{"file-digests", no_argument, NULL, 'f'},
		{"json", no_argument, NULL, 'J'},
		{"jobs", required_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	int digests = 0, file_digests = 0, json = 0, jobs = 0, c, rc;
	struct ms_err err = {0};
	struct ms_ckpt *ck = NULL;
	char state[MS_STATE_DIGEST_LEN] = "";

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'd': digests = 1; break;
		case 'f': file_digests = 1; break;
		case 'J': json = 1; break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &jobs))
				return CLI_USAGE;
			break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return cli_usage("missing PATH");
	rc = ms_ckpt_open_many((const char *const *)argv + optind, (size_t)(argc - optind), &ck,
			       &err);
	if (rc != MS_OK)
		return cli_fail(rc, &err);
	if (digests || file_digests) {
		rc = ms_ckpt_hash(ck, jobs, file_digests, &err);
		if (rc == MS_OK)
			rc = ms_state_digest(ck->tensors, ck->ntensors, state, &err);
		if (rc != MS_OK) {
			ms_ckpt_close(ck);
			return cli_fail(rc, &err);
		}
		digests = 1;
	}
	if (json) {
		rc = inspect_json(ck, digests, file_digests, digests ? state : NULL);
		ms_ckpt_close(ck);
		return rc;
	}
	for (size_t i = 0; i < ck->nfiles; i++) {
		struct ms_st_file *f = ck->files[i];
		char hex[65];

		printf("# file %s: %llu bytes, %zu tensors\n", f->path, (unsigned long long)f->size,
		       f->ntensors);
		if (digests) {
			ms_hex(f->header_digest, 32, hex);
			printf("# header sha256 %s\n", hex);
		}
		if (file_digests) {
			ms_hex(f->file_digest, 32, hex);
			printf("# file sha256 %s\n", hex);
		}
	}
	for (size_t i = 0; i < ck->nconfigs; i++) {
		char hex[65];

		ms_hex(ck->configs[i].digest, 32, hex);
		printf("# config %s sha256 %s\n", ck->configs[i].name, hex);
	}
	for (size_t i = 0; i < ck->ntensors; i++) {
		const struct ms_tensor *t = ck->tensors[i];
		char shape[24 * MS_ST_MAX_RANK + 4], st[256], hex[65];

		ms_shape_str(t, shape, sizeof(shape));
		print_structure(t->name, st, sizeof(st));
		printf("%s\t%s\t%s\t%llu\t%s", t->name, ms_dtype_name(t->dtype), shape,
		       (unsigned long long)t->nbytes, st);
		if (digests) {
			ms_hex(t->digest, 32, hex);
			printf("\t%s", hex);
		}
		putchar('\n');
	}
	if (digests)
		printf("# state %s\n", state);
	ms_ckpt_close(ck);
	return CLI_OK;
}

static const struct cli_cmd cmds[] = {
	{"inspect", cmd_inspect, "inspect [--digests] [--file-digests] [--jobs N] [--json] PATH...",
	 "print the tensors of safetensors files, checkpoints and adapters"},
};

int main(int argc, char **argv)
{
	static const struct cli_tool tool = {
		"msinv", "The inventory of model weight states.", cmds,
		sizeof(cmds) / sizeof(cmds[0]),
	};

	return cli_main(&tool, argc, argv);
}
