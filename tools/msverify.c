/*
 * msverify: checks that the bytes on disk are the bytes that were meant.
 * `sign` and `verify` speak the OpenSSF Model Signing format (see attest.h),
 * so signatures made here verify with the reference tool and the other way
 * round. This file parses arguments, calls libms and prints; everything
 * else lives in src/.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "attest.h"
#include "cli.h"

/* ---- shared ------------------------------------------------------------ */

struct progress {
	const char *what;
	int shown;
};

static void progress_cb(void *arg, uint64_t done, uint64_t total)
{
	struct progress *p = arg;

	fprintf(stderr, "\r%s: %s %.2f / %.2f GB (%3.0f%%)", cli_prog, p->what,
		(double)done / 1e9, (double)total / 1e9,
		total ? 100.0 * (double)done / (double)total : 100.0);
	p->shown = 1;
}

static void progress_end(struct progress *p)
{
	if (p->shown)
		fputc('\n', stderr);
}

static const char *fail_name(enum ms_oms_fail f)
{
	switch (f) {
	case MS_OMS_FAIL_NONE: return "none";
	case MS_OMS_FAIL_KEY: return "key";
	case MS_OMS_FAIL_SIGNATURE: return "signature";
	case MS_OMS_FAIL_MISSING: return "missing";
	case MS_OMS_FAIL_EXTRA: return "extra";
	case MS_OMS_FAIL_DIGEST: return "digest";
	}
	return "unknown";
}

/* Print the result as one JSON object; CLI_IO when out of memory. */
static int print_result_json(const char *model, const char *sig,
			     const struct ms_oms_result *r, int rc)
{
	cJSON *o = cJSON_CreateObject();
	char root[7 + MS_OMS_HEX_LEN];
	char *text = NULL;

	if (o) {
		cJSON_AddBoolToObject(o, "ok", rc == MS_OK);
		cJSON_AddStringToObject(o, "model", model);
		cJSON_AddStringToObject(o, "signature", sig);
		if (r->model_name)
			cJSON_AddStringToObject(o, "name", r->model_name);
		if (r->root_digest[0]) {
			snprintf(root, sizeof(root), "sha256:%s", r->root_digest);
			cJSON_AddStringToObject(o, "root_digest", root);
		}
		if (r->key_hint[0])
			cJSON_AddStringToObject(o, "key_hint", r->key_hint);
		cJSON_AddNumberToObject(o, "files", (double)r->nfiles);
		cJSON_AddNumberToObject(o, "bytes", (double)r->nbytes);
		cJSON_AddNumberToObject(o, "seconds", r->seconds);
		if (r->fail != MS_OMS_FAIL_NONE) {
			cJSON_AddStringToObject(o, "failure", fail_name(r->fail));
			if (r->path)
				cJSON_AddStringToObject(o, "path", r->path);
			cJSON_AddNumberToObject(o, "missing", (double)r->nmissing);
			cJSON_AddNumberToObject(o, "extra", (double)r->nextra);
			cJSON_AddNumberToObject(o, "digest_mismatches", (double)r->ndigest);
		}
		text = cJSON_Print(o);
		cJSON_Delete(o);
	}
	if (!text) {
		cli_errorf("out of memory");
		return CLI_IO;
	}
	puts(text);
	cJSON_free(text);
	return CLI_OK;
}

/* ---- sign -------------------------------------------------------------- */

static int cmd_sign(int argc, char **argv)
{
	static const struct option opts[] = {
		{"key", required_argument, NULL, 'k'},
		{"output", required_argument, NULL, 'o'},
		{"force", no_argument, NULL, 'f'},
		{"jobs", required_argument, NULL, 'j'},
		{"json", no_argument, NULL, 'J'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	/* The reference's default: model.sig in the current directory. */
	const char *key = NULL, *sig = "model.sig";
	struct ms_oms_opts o = {0};
	struct ms_oms_result r = {0};
	struct progress pr = {"hashing", 0};
	struct ms_err err = {0};
	int json = 0, c, rc;

	while ((c = getopt_long(argc, argv, "hk:o:fj:", opts, NULL)) != -1) {
		switch (c) {
		case 'k': key = optarg; break;
		case 'o': sig = optarg; break;
		case 'f': o.force = 1; break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &o.nthreads))
				return CLI_USAGE;
			break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return cli_usage("missing PATH");
	if (optind + 1 < argc)
		return cli_usage("one PATH only");
	if (!key)
		return cli_usage("missing --key");
	if (cli_progress_enabled()) {
		o.progress = progress_cb;
		o.progress_arg = &pr;
	}
	rc = ms_oms_sign_opts(argv[optind], key, sig, &o, &r, &err);
	progress_end(&pr);
	if (rc != MS_OK) {
		ms_oms_result_release(&r);
		return cli_fail(rc, &err);
	}
	if (json)
		rc = print_result_json(argv[optind], sig, &r, MS_OK);
	else
		printf("signed '%s' into '%s': %llu files, %llu bytes, root sha256:%s\n",
		       argv[optind], sig, (unsigned long long)r.nfiles,
		       (unsigned long long)r.nbytes, r.root_digest);
	ms_oms_result_release(&r);
	return rc;
}

/* ---- verify ------------------------------------------------------------ */

static int cmd_verify(int argc, char **argv)
{
	static const struct option opts[] = {
		{"sig", required_argument, NULL, 's'},
		{"pub", required_argument, NULL, 'p'},
		{"jobs", required_argument, NULL, 'j'},
		{"json", no_argument, NULL, 'J'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *sig = NULL, *pub = NULL;
	struct ms_oms_opts o = {0};
	struct ms_oms_result r = {0};
	struct progress pr = {"hashing", 0};
	struct ms_err err = {0};
	int json = 0, c, rc, status;

	while ((c = getopt_long(argc, argv, "hj:", opts, NULL)) != -1) {
		switch (c) {
		case 's': sig = optarg; break;
		case 'p': pub = optarg; break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &o.nthreads))
				return CLI_USAGE;
			break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return cli_usage("missing PATH");
	if (optind + 1 < argc)
		return cli_usage("one PATH only");
	if (!sig)
		return cli_usage("missing --sig");
	if (!pub)
		return cli_usage("missing --pub");
	if (cli_progress_enabled()) {
		o.progress = progress_cb;
		o.progress_arg = &pr;
	}
	rc = ms_oms_verify_opts(argv[optind], sig, pub, &o, &r, &err);
	progress_end(&pr);
	status = cli_fail(rc, &err);
	/* A failed check is still a result worth printing; bad input is not. */
	if (json && (rc == MS_OK || rc == MS_ECHECK)) {
		int jrc = print_result_json(argv[optind], sig, &r, rc);

		if (jrc != CLI_OK && status == CLI_OK)
			status = jrc;
	} else if (rc == MS_OK) {
		printf("verified '%s' with '%s': %llu files, %llu bytes, root sha256:%s\n",
		       argv[optind], pub, (unsigned long long)r.nfiles,
		       (unsigned long long)r.nbytes, r.root_digest);
	}
	ms_oms_result_release(&r);
	return status;
}

static const struct cli_cmd cmds[] = {
	{"sign", cmd_sign, "sign [--force] [--jobs N] [--json] [-o SIG] --key KEY.pem PATH",
	 "sign a model directory (OpenSSF Model Signing, EC key)"},
	{"verify", cmd_verify, "verify [--jobs N] [--json] --sig SIG --pub KEY.pub PATH",
	 "verify a model directory against an OpenSSF Model Signing signature"},
};

int main(int argc, char **argv)
{
	static const struct cli_tool tool = {
		"msverify",
		"Check that model files on disk are the bytes that were meant.",
		cmds, sizeof(cmds) / sizeof(cmds[0]),
	};

	return cli_main(&tool, argc, argv);
}
