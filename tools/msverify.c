/*
 * msverify: checks that the bytes on disk are the bytes that were meant.
 * `sign` and `verify` speak the OpenSSF Model Signing format (see attest.h),
 * so signatures made here verify with the reference tool and the other way
 * round. This file parses arguments, calls libms and prints; everything
 * else lives in src/.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "cli.h"

/* ---- shared ------------------------------------------------------------ */


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
	struct cli_progress pr = {.what = "hashing"};
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
		o.progress = cli_progress_cb;
		o.progress_arg = &pr;
	}
	rc = ms_oms_sign_opts(argv[optind], key, sig, &o, &r, &err);
	cli_progress_end(&pr);
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
	struct cli_progress pr = {.what = "hashing"};
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
		o.progress = cli_progress_cb;
		o.progress_arg = &pr;
	}
	rc = ms_oms_verify_opts(argv[optind], sig, pub, &o, &r, &err);
	cli_progress_end(&pr);
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

/* ---- files -------------------------------------------------------------- */

/* Print the outcome of one state's check; returns CLI_OK or CLI_CHECK. */
static int report_state(const struct ms_vstate *s, int rc, const struct ms_vreport *r,
			cJSON *json_states)
{
	const char *name = s->label ? s->label : s->digest;

	if (json_states) {
		cJSON *o = cJSON_CreateObject(), *probs;

		cJSON_AddItemToArray(json_states, o);
		cJSON_AddStringToObject(o, "state", s->digest);
		if (s->label)
			cJSON_AddStringToObject(o, "label", s->label);
		cJSON_AddStringToObject(o, "result", rc == MS_OK ? "ok" : "mismatch");
		cJSON_AddNumberToObject(o, "files", (double)r->nfiles);
		cJSON_AddNumberToObject(o, "tensors", (double)r->ntensors);
		cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
		cJSON_AddNumberToObject(o, "seconds", r->seconds);
		probs = cJSON_AddArrayToObject(o, "problems");
		for (size_t i = 0; i < r->nproblems; i++) {
			const struct ms_vproblem *p = &r->problems[i];
			cJSON *q = cJSON_CreateObject();

			cJSON_AddItemToArray(probs, q);
			cJSON_AddStringToObject(q, "kind", ms_vproblem_str(p->kind));
			if (p->file)
				cJSON_AddStringToObject(q, "file", p->file);
			if (p->tensor)
				cJSON_AddStringToObject(q, "tensor", p->tensor);
			cJSON_AddStringToObject(q, "detail", p->detail);
		}
		return rc == MS_OK ? CLI_OK : CLI_CHECK;
	}
	if (rc == MS_OK) {
		char b[MS_BYTES_STR_LEN];

		printf("ok\t%s\t%zu files\t%zu tensors\t%s\t%.2f s\n", name, r->nfiles,
		       r->ntensors, ms_bytes_str(r->bytes, b), r->seconds);
		return CLI_OK;
	}
	for (size_t i = 0; i < r->nproblems; i++) {
		const struct ms_vproblem *p = &r->problems[i];

		if (p->tensor)
			printf("FAIL\t%s\ttensor '%s' in '%s': %s\n", name, p->tensor,
			       p->file ? p->file : "-", p->detail);
		else if (p->file)
			printf("FAIL\t%s\t'%s': %s\n", name, p->file, p->detail);
		else
			printf("FAIL\t%s\t%s\n", name, p->detail);
	}
	return CLI_CHECK;
}

/* The manifest's bytes must be exactly the payload a trusted key signed
 * (msinv export-manifest --sign): the manifest is the record it checks. */
static int check_manifest_sig(const char *manifest, const char *text, size_t len,
			      const char *sig, const char *pub, struct ms_err *err)
{
	struct ms_key *k = NULL;
	char *bundle = NULL, *type = NULL;
	uint8_t *payload = NULL;
	size_t blen, plen;
	int rc;

	if ((rc = ms_key_load_public(pub, &k, err)) != MS_OK ||
	    (rc = ms_file_read(sig, MS_OMS_MAX_SIG, &bundle, &blen, err)) != MS_OK ||
	    (rc = ms_sigstore_verify(bundle, blen, sig, k, &payload, &plen, &type, err)) != MS_OK)
		goto out;
	if (strcmp(type, "application/vnd.msinv.manifest.v1+json") || plen != len ||
	    memcmp(payload, text, len))
		rc = ms_err_set(err, MS_ECHECK, "'%s': not the manifest '%s' signs", manifest, sig);
out:
	ms_key_free(k);
	ms_free(bundle);
	ms_free(payload);
	ms_free(type);
	return rc;
}

static int cmd_files(int argc, char **argv)
{
	static const struct option opts[] = {
		{"manifest", required_argument, NULL, 'm'},
		{"sig", required_argument, NULL, 's'},
		{"pub", required_argument, NULL, 'p'},
		{"jobs", required_argument, NULL, 'j'},
		{"json", no_argument, NULL, 'J'},
		{"db", required_argument, NULL, 'D'},
		{"device", no_argument, NULL, 'G'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *manifest = NULL, *db = NULL, *sig = NULL, *pub = NULL;
	int jobs = 0, json = 0, device = 0, c, status = CLI_OK, rc = MS_OK;
	struct ms_err err = {0};
	struct ms_inv *inv = NULL;
	cJSON *root = NULL, *states = NULL;
	char (*digests)[MS_STATE_DIGEST_LEN] = NULL;
	size_t ndigests = 0;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': manifest = optarg; break;
		case 's': sig = optarg; break;
		case 'p': pub = optarg; break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &jobs))
				return CLI_USAGE;
			break;
		case 'J': json = 1; break;
		case 'D': db = optarg; break;
		case 'G': device = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (device && manifest)
		return cli_usage("--device needs the inventory's tree digests, not --manifest");
	if (json) {
		root = cJSON_CreateObject();
		states = cJSON_AddArrayToObject(root, "states");
	}
	if (manifest) {
		/* no database: the manifest is the record */
		struct ms_vstate *s = NULL;
		struct ms_vreport r;
		char *text = NULL, *dir = NULL;
		size_t len;

		if (optind != argc) {
			cJSON_Delete(root);
			return cli_usage("--manifest takes no STATE or PATH");
		}
		if (!sig != !pub) {
			cJSON_Delete(root);
			return cli_usage("--sig and --pub go together");
		}
		rc = ms_file_read(manifest, 256u << 20, &text, &len, &err);
		if (rc == MS_OK && sig)
			rc = check_manifest_sig(manifest, text, len, sig, pub, &err);
		if (rc == MS_OK) {
			char *slash;

			dir = strdup(manifest);
			slash = dir ? strrchr(dir, '/') : NULL;
			if (slash)
				*slash = 0;
			rc = ms_manifest_parse(text, len, manifest, slash ? dir : ".", &s, &err);
		}
		ms_free(text);
		free(dir);
		if (rc != MS_OK) {
			cJSON_Delete(root);
			return cli_fail(rc, &err);
		}
		rc = ms_verify_state(s, jobs, &r, &err);
		if (rc == MS_OK || rc == MS_ECHECK)
			status = report_state(s, rc, &r, states);
		ms_vreport_release(&r);
		ms_vstate_free(s);
		if (rc != MS_OK && rc != MS_ECHECK) {
			cJSON_Delete(root);
			return cli_fail(rc, &err);
		}
		goto done;
	}
	if ((rc = ms_inv_open(cli_db_path(db), 0, &inv, &err)) != MS_OK ||
	    (rc = ms_inv_set_origin(inv, "msverify", cli_argc, cli_argv, &err)) != MS_OK)
		goto fail;
	if (optind == argc) {
		struct ms_inv_state *all = NULL;
		size_t n = 0;

		if ((rc = ms_inv_states_list(inv, MS_INV_KIND_ANY, &all, &n, &err)) != MS_OK)
			goto fail;
		digests = ms_calloc(n + 1, sizeof(*digests));
		/* every state with a copy here (an ancestor known only from an
		 * imported bundle's lineage has none to check) */
		for (size_t i = 0; digests && i < n; i++)
			if (all[i].ncopies > 0)
				memcpy(digests[ndigests++], all[i].digest, MS_STATE_DIGEST_LEN);
		ms_inv_states_free(all, n);
		if (!digests) {
			rc = ms_err_nomem(&err);
			goto fail;
		}
	}
	for (int a = optind; a < argc; a++) {
		char (*more)[MS_STATE_DIGEST_LEN] = NULL, (*nd)[MS_STATE_DIGEST_LEN];
		size_t nmore = 0;
		struct stat st;

		if (stat(argv[a], &st) == 0) {
			if ((rc = ms_verify_states_under(inv, argv[a], &more, &nmore, &err)) != MS_OK)
				goto fail;
		} else {
			if (!(more = ms_malloc(sizeof(*more)))) {
				rc = ms_err_nomem(&err);
				goto fail;
			}
			nmore = 1;
			if ((rc = ms_inv_resolve(inv, argv[a], more[0], &err)) != MS_OK) {
				ms_free(more);
				goto fail;
			}
		}
		if (!(nd = ms_realloc(digests, (ndigests + nmore + 1) * sizeof(*nd)))) {
			ms_free(more);
			rc = ms_err_nomem(&err);
			goto fail;
		}
		digests = nd;
		memcpy(digests + ndigests, more, nmore * sizeof(*more));
		ndigests += nmore;
		ms_free(more);
	}
	for (size_t i = 0; i < ndigests; i++) {
		struct ms_vstate *s = NULL;
		struct ms_vreport r;
		size_t added = 0;

		if ((rc = ms_vstate_from_inv(inv, digests[i], 0, &s, &err)) != MS_OK)
			goto fail;
		rc = ms_verify_record(inv, digests[i], s,
				      MS_VERIFY_TREES | (device ? MS_VERIFY_GPU : 0u), jobs, &r,
				      &added, &err);
		if (rc == MS_OK || rc == MS_ECHECK) {
			if (report_state(s, rc, &r, states) != CLI_OK)
				status = CLI_CHECK;
			if (states) {
				cJSON *o = cJSON_GetArrayItem(states, cJSON_GetArraySize(states) - 1);

				cJSON_AddNumberToObject(o, "device_bytes", (double)r.device_bytes);
				cJSON_AddNumberToObject(o, "trees_recorded", (double)added);
			}
		}
		ms_vreport_release(&r);
		ms_vstate_free(s);
		if (rc != MS_OK && rc != MS_ECHECK)
			goto fail;
	}
done:
	if (root) {
		char *t = cJSON_Print(root);

		if (t)
			puts(t);
		cJSON_free(t);
	}
	if (status == CLI_CHECK)
		cli_errorf("verification failed");
	ms_free(digests);
	cJSON_Delete(root);
	ms_inv_close(inv);
	return status;
fail:
	ms_free(digests);
	cJSON_Delete(root);
	ms_inv_close(inv);
	return cli_fail(rc, &err);
}

/* ---- quant -------------------------------------------------------------- */

/* A STATE or PATH argument as a path on disk: an existing path is taken as
 * it is, anything else is resolved in the inventory (opened on first use). */
static int locate(const char *arg, const char *db, struct ms_inv **inv, char **path,
		  char digest[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	struct ms_vstate *vs = NULL;
	struct stat st;
	int rc;

	*path = NULL;
	if (digest)
		digest[0] = 0;
	if (stat(arg, &st) == 0) {
		*path = strdup(arg);
		return *path ? MS_OK : ms_err_set(err, MS_ENOMEM, "out of memory");
	}
	if (!*inv && (rc = ms_inv_open(cli_db_path(db), 0, inv, err)) != MS_OK)
		return rc;
	{
		char d[MS_STATE_DIGEST_LEN];

		if ((rc = ms_inv_resolve(*inv, arg, d, err)) != MS_OK)
			return rc;
		if ((rc = ms_vstate_from_inv(*inv, d, 0, &vs, err)) != MS_OK)
			return rc;
		if (digest)
			memcpy(digest, d, MS_STATE_DIGEST_LEN);
	}
	*path = ms_vstate_location(vs);
	ms_vstate_free(vs);
	return *path ? MS_OK : ms_err_set(err, MS_ENOMEM, "out of memory");
}

/* The state a quantized state was made from, by its "quantize" edge, and
 * the edge's parameters (a JSON object; NULL without an edge). */
static int quant_parent(struct ms_inv *inv, const char *digest, char **path,
			char **params, struct ms_err *err)
{
	struct ms_inv_edge *e = NULL;
	size_t n = 0;
	int rc;

	*path = NULL;
	*params = NULL;
	if ((rc = ms_inv_edges(inv, digest, MS_INV_EDGES_PARENTS, &e, &n, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < n && !*path && rc == MS_OK; i++) {
		if (strcmp(e[i].operation, "quantize"))
			continue;
		if ((rc = locate(e[i].parent, NULL, &inv, path, NULL, err)) != MS_OK)
			break;
		if (!(*params = strdup(e[i].params ? e[i].params : "{}")))
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
	}
	ms_inv_edges_free(e, n);
	return rc;
}

static int cmd_quant(int argc, char **argv)
{
	static const struct option opts[] = {
		{"source", required_argument, NULL, 's'},
		{"max-rel-err", required_argument, NULL, 'm'},
		{"jobs", required_argument, NULL, 'j'},
		{"json", no_argument, NULL, 'J'},
		{"db", required_argument, NULL, 'D'},
		{"strict", no_argument, NULL, 'S'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *source = NULL, *db = NULL;
	double bound = 0.2;
	int jobs = 0, json = 0, strict = 0, c, rc, status = CLI_OK;
	struct ms_err err = {0};
	struct ms_inv *inv = NULL;
	struct ms_qstats *qs = NULL;
	char *qpath = NULL, *spath = NULL, *params = NULL, digest[MS_STATE_DIGEST_LEN];
	char why_none[512] = "";
	cJSON *root = NULL, *arr = NULL;
	size_t nfail = 0;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's': source = optarg; break;
		case 'm':
			if (ms_parse_double(optarg, &bound) || bound <= 0)
				return cli_usage("option '--max-rel-err': '%s' is not a positive number", optarg);
			break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &jobs))
				return CLI_USAGE;
			break;
		case 'J': json = 1; break;
		case 'D': db = optarg; break;
		case 'S': strict = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind + 1 != argc)
		return cli_usage(optind == argc ? "missing QSTATE" : "one QSTATE only");
	if ((rc = locate(argv[optind], db, &inv, &qpath, digest, &err)) != MS_OK)
		goto fail;
	if (source) {
		rc = locate(source, db, &inv, &spath, NULL, &err);
	} else {
		/* a path: the state registered there, whatever its bytes are
		 * now (a tampered file no longer has the recorded digest) */
		if (!digest[0]) {
			if (!inv && (rc = ms_inv_open(cli_db_path(db), 0, &inv, &err)) != MS_OK) {
				if (rc != MS_ENOTFOUND)
					goto fail;
				snprintf(why_none, sizeof(why_none), "no inventory at '%s'",
					 cli_db_path(db));
			}
			if (inv && (rc = ms_inv_state_at_path(inv, qpath, digest, &err)) != MS_OK) {
				if (rc != MS_ENOTFOUND)
					goto fail;
				snprintf(why_none, sizeof(why_none), "no state of '%s' is recorded at '%s'",
					 ms_inv_path(inv), qpath);
			}
		}
		rc = MS_OK;
		if (digest[0]) {
			if ((rc = quant_parent(inv, digest, &spath, &params, &err)) != MS_OK)
				goto fail;
			if (!spath)
				snprintf(why_none, sizeof(why_none),
					 "state %.23s... has no quantize edge in '%s'", digest,
					 ms_inv_path(inv));
		}
	}
	if (rc != MS_OK)
		goto fail;
	if ((rc = ms_qstats_run(qpath, spath, jobs, &qs, &err)) != MS_OK)
		goto fail;
	if (qs->view.nweights == 0) {
		rc = ms_err_set(&err, MS_EINVAL, "'%s': no NVFP4 tensors", qpath);
		goto fail;
	}
	if (json) {
		root = cJSON_CreateObject();
		cJSON_AddStringToObject(root, "state", qpath);
		if (spath)
			cJSON_AddStringToObject(root, "source", spath);
		else
			cJSON_AddNullToObject(root, "source");
		if (!spath)
			cJSON_AddStringToObject(root, "no_source", why_none);
		cJSON_AddNumberToObject(root, "max_rel_err", bound);
		arr = cJSON_AddArrayToObject(root, "tensors");
	}
	for (size_t i = 0; i < qs->n; i++) {
		const struct ms_qstats_entry *e = &qs->e[i];
		int bad = e->has_source && !(e->rel_err <= bound);

		nfail += bad;
		if (arr) {
			cJSON *o = cJSON_CreateObject();

			cJSON_AddItemToArray(arr, o);
			cJSON_AddStringToObject(o, "weight", e->w->prefix);
			cJSON_AddStringToObject(o, "layout", ms_nvfp4_layout_name(e->layout));
			if (e->has_source)
				cJSON_AddNumberToObject(o, "rel_err", e->rel_err);
			cJSON_AddStringToObject(o, "result", bad ? "fail"
							    : e->has_source ? "ok" : "unchecked");
		} else if (bad) {
			printf("FAIL\t%s\t%s\trelative error %.4g exceeds %.4g\n", e->w->prefix,
			       ms_nvfp4_layout_name(e->layout), e->rel_err, bound);
		}
	}
	/* what the quantize edge says was made is what the files hold */
	for (size_t i = 0; params && i < qs->view.nweights; i++) {
		const struct ms_qweight *w = &qs->view.weights[i];
		char why[256];

		rc = ms_qweight_edge_check(w, params, why, sizeof(why), &err);
		if (rc == MS_EINVAL)
			break; /* parameters that are not JSON record nothing to compare */
		if (rc != MS_OK && rc != MS_ECHECK)
			goto fail;
		if (rc == MS_OK)
			continue;
		nfail++;
		if (arr) {
			cJSON *o = cJSON_CreateObject();

			cJSON_AddItemToArray(arr, o);
			cJSON_AddStringToObject(o, "weight", w->prefix);
			cJSON_AddStringToObject(o, "layout", "quantize-edge");
			cJSON_AddStringToObject(o, "result", "fail");
			cJSON_AddStringToObject(o, "detail", why);
		} else {
			printf("FAIL\t%s\t%s\n", w->prefix, why);
		}
	}
	rc = MS_OK;
	/* both layouts of one weight must agree */
	for (size_t i = 0; i < qs->view.nweights; i++) {
		const struct ms_qweight *w = &qs->view.weights[i];
		double diff;

		if (!w->packed[0] || !w->packed[1])
			continue;
		if ((rc = ms_qweight_layouts_agree(w, jobs, &diff, &err)) != MS_OK)
			goto fail;
		if ((w->block == MS_NVFP4_BLOCK_2D && diff != 0) ||
		    (w->block == MS_NVFP4_BLOCK_1D && !(diff <= bound))) {
			nfail++;
			if (arr) {
				cJSON *o = cJSON_CreateObject();

				cJSON_AddItemToArray(arr, o);
				cJSON_AddStringToObject(o, "weight", w->prefix);
				cJSON_AddStringToObject(o, "layout", "rowwise-vs-columnwise");
				cJSON_AddStringToObject(o, "result", "fail");
			} else if (w->block == MS_NVFP4_BLOCK_2D) {
				printf("FAIL\t%s\tcolumnwise is not the exact transpose of rowwise (2d blocks)\n",
				       w->prefix);
			} else {
				printf("FAIL\t%s\trowwise and columnwise decode %.4g apart (bound %.4g)\n",
				       w->prefix, diff, bound);
			}
		}
	}
	if (root) {
		char *t;

		cJSON_AddNumberToObject(root, "failed", (double)nfail);
		t = cJSON_Print(root);
		if (t)
			puts(t);
		cJSON_free(t);
	} else {
		if (spath)
			printf("%s\t%zu weights\t%zu checks\ttotal relative error %.4g\n",
			       nfail ? "FAIL" : "ok", qs->view.nweights, qs->n, qs->total.rel_err);
		else
			printf("%s\t%zu weights\tno source: decoded values not checked, rowwise/columnwise agreement only\n",
			       nfail ? "FAIL" : "UNCHECKED", qs->view.nweights);
	}
	if (nfail) {
		cli_errorf("'%s': %zu check%s failed", qpath, nfail, nfail == 1 ? "" : "s");
		status = CLI_CHECK;
	} else if (!spath) {
		/* a check that checked nothing must not pass as one */
		cli_errorf("%s'%s': no source to check the decoded values against (%s; pass --source)%s",
			   strict ? "" : "warning: ", qpath, why_none,
			   strict ? "" : ": not verified");
		if (strict)
			status = CLI_CHECK;
	}
	cJSON_Delete(root);
	free(params);
	ms_qstats_free(qs);
	free(qpath);
	free(spath);
	ms_inv_close(inv);
	return status;
fail:
	cJSON_Delete(root);
	free(params);
	ms_qstats_free(qs);
	free(qpath);
	free(spath);
	ms_inv_close(inv);
	return cli_fail(rc, &err);
}

/* ---- policy ------------------------------------------------------------- */

/* The served tensors' report: from a tensor map (one .json file), or from
 * the served files hashed, an engine's fused parameters sliced into what
 * checkpoints hold. */
static int policy_report(struct ms_inv *inv, char **paths, size_t npaths, int map, int jobs,
			 struct ms_ckpt **ck, struct ms_policy_report **r, struct ms_err *err)
{
	int rc;

	if (map) {
		char *text = NULL;
		size_t len;

		rc = ms_file_read(paths[0], MS_POLICY_MAX_MAP, &text, &len, err);
		if (rc == MS_OK)
			rc = ms_policy_from_map(text, len, paths[0], r, err);
		ms_free(text);
		return rc;
	}
	rc = ms_ckpt_open_many((const char *const *)paths, npaths, ck, err);
	if (rc == MS_OK)
		rc = ms_ckpt_hash(*ck, jobs, 0, err);
	if (rc == MS_OK)
		rc = ms_policy_from_ckpt(*ck, r, err);
	if (rc == MS_OK)
		rc = ms_policy_unfuse(inv, *ck, *r, err);
	return rc;
}

/* One part (or resembled policy) of the report as a JSON object. */
static cJSON *policy_part_json(const struct ms_policy_part *pp, int layout)
{
	cJSON *p = cJSON_CreateObject();

	cJSON_AddStringToObject(p, "state", pp->state);
	if (pp->label)
		cJSON_AddStringToObject(p, "label", pp->label);
	cJSON_AddStringToObject(p, "kind", ms_inv_kind_name(pp->kind));
	if (layout && pp->layout)
		cJSON_AddStringToObject(p, "layout", pp->layout);
	cJSON_AddNumberToObject(p, "served", (double)pp->served);
	cJSON_AddNumberToObject(p, "state_tensors", (double)pp->state_tensors);
	return p;
}

static void policy_print_json(const struct ms_policy_report *r, int identified)
{
	cJSON *o = cJSON_CreateObject(), *parts, *bad;
	char *text, hex[65];

	cJSON_AddStringToObject(o, "result", identified ? "identified" : "not identified");
	cJSON_AddNumberToObject(o, "tensors", (double)r->ntensors);
	cJSON_AddNumberToObject(o, "matched", (double)r->nmatched);
	parts = cJSON_AddArrayToObject(o, "parts");
	for (size_t i = 0; i < r->nparts; i++)
		cJSON_AddItemToArray(parts, policy_part_json(&r->parts[i], 1));
	parts = cJSON_AddArrayToObject(o, "resembles");
	for (size_t i = 0; i < r->npolicies; i++)
		cJSON_AddItemToArray(parts, policy_part_json(&r->policies[i], 0));
	parts = cJSON_AddArrayToObject(o, "unfused");
	for (size_t i = 0; i < r->nsources; i++)
		cJSON_AddItemToArray(parts, cJSON_CreateString(r->sources[i]));
	bad = cJSON_AddArrayToObject(o, "unaccounted");
	for (size_t i = 0; i < r->ntensors; i++) {
		const struct ms_policy_tensor *t = &r->tensors[i];
		cJSON *p;

		if (t->status == MS_POLICY_MATCHED)
			continue;
		p = cJSON_CreateObject();
		cJSON_AddItemToArray(bad, p);
		cJSON_AddStringToObject(p, "tensor", t->name);
		cJSON_AddStringToObject(p, "status", ms_policy_status_str(t->status));
		ms_hex(t->digest, 32, hex);
		cJSON_AddStringToObject(p, "sha256", hex);
		if (t->other)
			cJSON_AddStringToObject(p, "recorded_as", t->other);
		if (t->src >= 0)
			cJSON_AddStringToObject(p, "slice_of", r->sources[t->src]);
	}
	text = cJSON_Print(o);
	if (text)
		puts(text);
	cJSON_free(text);
	cJSON_Delete(o);
}

static void policy_print_text(const struct ms_policy_report *r, int identified)
{
	for (size_t i = 0; i < r->nparts; i++) {
		const struct ms_policy_part *p = &r->parts[i];

		printf("part\t%s\t%s\t%s\t%s\t%llu of %llu tensors%s\n", p->state,
		       p->label ? p->label : "-", ms_inv_kind_name(p->kind),
		       p->layout ? p->layout : "-", (unsigned long long)p->served,
		       (unsigned long long)p->state_tensors,
		       p->served < p->state_tensors ? " (partial)" : "");
	}
	for (size_t i = 0; i < r->npolicies; i++) {
		const struct ms_policy_part *p = &r->policies[i];

		printf("resembles\t%s\t%s\t%s\t%s\t%llu of %llu tensors\n", p->state,
		       p->label ? p->label : "-", ms_inv_kind_name(p->kind),
		       p->layout ? p->layout : "-", (unsigned long long)p->served,
		       (unsigned long long)p->state_tensors);
	}
	for (size_t i = 0; i < r->nsources; i++)
		printf("unfused\t%s\tsliced into the tensors checkpoints hold\n", r->sources[i]);
	for (size_t i = 0; i < r->ntensors; i++) {
		const struct ms_policy_tensor *t = &r->tensors[i];
		char from[600] = "";

		if (t->src >= 0)
			snprintf(from, sizeof(from), " (slice of '%s')", r->sources[t->src]);
		if (t->status == MS_POLICY_MISMATCH)
			printf("mismatch\t%s\tpart %s records other bytes under this name%s\n", t->name,
			       r->parts[t->part].label ? r->parts[t->part].label
						       : r->parts[t->part].state, from);
		else if (t->status == MS_POLICY_RENAMED)
			printf("renamed\t%s\tthe bytes of '%s' in %.23s...%s\n", t->name, t->other,
			       t->other_state, from);
		else if (t->status == MS_POLICY_UNKNOWN)
			printf("unknown\t%s\tno recorded state holds these bytes%s\n", t->name, from);
	}
	printf("%s\t%zu tensors\t%zu parts\t%zu matched, %zu mismatch, %zu renamed, %zu unknown\n",
	       identified ? "identified" : "NOT IDENTIFIED", r->ntensors, r->nparts,
	       r->nmatched, r->nmismatch, r->nrenamed, r->nunknown);
}

static int cmd_policy(int argc, char **argv)
{
	static const struct option opts[] = {
		{"register", no_argument, NULL, 'r'},
		{"label", required_argument, NULL, 'l'},
		{"jobs", required_argument, NULL, 'j'},
		{"json", no_argument, NULL, 'J'},
		{"db", required_argument, NULL, 'D'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL, *label = NULL;
	int jobs = 0, json = 0, reg = 0, c, rc, map = 0, status = CLI_OK;
	struct ms_err err = {0};
	struct ms_inv *inv = NULL;
	struct ms_ckpt *ck = NULL;
	struct ms_policy_report *r = NULL;
	struct stat st;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'r': reg = 1; break;
		case 'l': label = optarg; break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &jobs))
				return CLI_USAGE;
			break;
		case 'J': json = 1; break;
		case 'D': db = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return cli_usage("missing DIR or TENSOR_MAP");
	if (label && !reg)
		return cli_usage("--label goes with --register");
	/* one .json file that is no safetensors index: a tensor map */
	if (optind + 1 == argc && stat(argv[optind], &st) == 0 && S_ISREG(st.st_mode))
		map = ms_str_ends_with(argv[optind], ".json") && strlen(argv[optind]) > 5 &&
		      !strstr(argv[optind], "index");
	if (map && reg)
		return cli_usage("--register needs the served files, not a tensor map");
	if ((rc = ms_inv_open(cli_db_path(db), 0, &inv, &err)) != MS_OK ||
	    (rc = ms_inv_set_origin(inv, "msverify", cli_argc, cli_argv, &err)) != MS_OK ||
	    (rc = policy_report(inv, argv + optind, (size_t)(argc - optind), map, jobs, &ck, &r,
				&err)) != MS_OK)
		goto out;
	rc = ms_policy_identify(inv, r, &err);
	if (rc != MS_OK && rc != MS_ECHECK)
		goto out;
	if (json)
		policy_print_json(r, rc == MS_OK);
	else
		policy_print_text(r, rc == MS_OK);
	if (rc == MS_ECHECK) {
		cli_errorf("%zu of %zu served tensors are not accounted for by inventoried states",
			   r->ntensors - r->nmatched, r->ntensors);
		status = CLI_CHECK;
		rc = MS_OK;
		goto out;
	}
	if (reg) {
		char digest[MS_STATE_DIGEST_LEN];

		/* the composition is recorded: a policy state whose parents
		 * are its parts */
		if ((rc = ms_policy_register(inv, r, (const char *const *)argv + optind,
					     (size_t)(argc - optind), label, jobs, digest,
					     &err)) != MS_OK)
			goto out;
		printf("policy\t%s\n", digest);
	}
out:
	ms_policy_report_free(r);
	ms_ckpt_close(ck);
	ms_inv_close(inv);
	return rc == MS_OK ? status : cli_fail(rc, &err);
}

/* ---- ep ----------------------------------------------------------------- */

/* One fault of a shard set as a JSON object in arr; nonzero when out of memory. */
static int ep_json_fault(cJSON *arr, const struct ms_ep_fault *f)
{
	cJSON *o = cJSON_CreateObject();

	if (!o || !cJSON_AddItemToArray(arr, o))
		return cJSON_Delete(o), -1;
	if (!cJSON_AddStringToObject(o, "kind", ms_ep_fault_name(f->kind)) ||
	    !cJSON_AddStringToObject(o, "message", f->msg) ||
	    (f->tensor && !cJSON_AddStringToObject(o, "tensor", f->tensor)) ||
	    (f->file && !cJSON_AddStringToObject(o, "file", f->file)) ||
	    (f->rank >= 0 && !cJSON_AddNumberToObject(o, "rank", (double)f->rank)) ||
	    (f->expert >= 0 && !cJSON_AddNumberToObject(o, "expert", (double)f->expert)) ||
	    (f->other_expert >= 0 && !cJSON_AddNumberToObject(o, "other_expert", (double)f->other_expert)) ||
	    (f->other_rank >= 0 && !cJSON_AddNumberToObject(o, "other_rank", (double)f->other_rank)))
		return -1;
	return 0;
}

/* One stderr line per fault the library found. */
static void ep_print_faults(const char *dir, const struct ms_shard_result *res)
{
	for (size_t i = 0; i < res->nfaults; i++)
		cli_errorf("'%s': %s", dir, res->faults[i].msg);
	if (res->nfaults_more)
		cli_errorf("'%s': %llu more faults not listed", dir,
			   (unsigned long long)res->nfaults_more);
}

/* A fault found by the tool (EP size, inventory) rather than the library. */
static int ep_json_other(cJSON *arr, const char *kind, const char *file, int64_t rank, const char *msg)
{
	struct ms_ep_fault f = { MS_EP_FAULT_DIGEST, NULL, (char *)file, rank, -1, -1, -1, (char *)msg };
	cJSON *o;

	if (ep_json_fault(arr, &f))
		return -1;
	o = cJSON_GetArrayItem(arr, cJSON_GetArraySize(arr) - 1);
	return cJSON_ReplaceItemInObjectCaseSensitive(o, "kind", cJSON_CreateString(kind)) ? 0 : -1;
}

/* The document --json prints when the check could not run (bad input, I/O):
 * the result, the exit status and the message stderr has too. */
static void ep_json_error(const char *dir, int rc, const struct ms_err *err)
{
	cJSON *o = cJSON_CreateObject();
	char *t;

	if (!o)
		return;
	cJSON_AddStringToObject(o, "result", "error");
	cJSON_AddStringToObject(o, "path", dir ? dir : "");
	cJSON_AddNumberToObject(o, "exit", ms_exit_code(rc));
	cJSON_AddStringToObject(o, "error", err->msg);
	if ((t = cJSON_Print(o)))
		puts(t);
	cJSON_free(t);
	cJSON_Delete(o);
}

/* The document --json prints for a failed check that names one fault only. */
static int ep_json_fault_only(const char *dir, const struct ms_err *err)
{
	cJSON *o = cJSON_CreateObject(), *arr = o ? cJSON_AddArrayToObject(o, "faults") : NULL;
	char *t = NULL;

	if (arr && cJSON_AddStringToObject(o, "result", "fail") && cJSON_AddStringToObject(o, "path", dir) &&
	    !ep_json_other(arr, "check", NULL, -1, err->msg))
		t = cJSON_Print(o);
	cJSON_Delete(o);
	if (!t) {
		cli_errorf("out of memory");
		return CLI_IO;
	}
	puts(t);
	cJSON_free(t);
	return CLI_OK;
}

static int cmd_ep(int argc, char **argv)
{
	static const struct option opts[] = {
		{"ep-size", required_argument, NULL, 'n'},
		{"base", required_argument, NULL, 'B'},
		{"jobs", required_argument, NULL, 'j'},
		{"json", no_argument, NULL, 'J'},
		{"db", required_argument, NULL, 'D'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL, *env = getenv("MSINV_DB"), *base = NULL;
	int json = 0, c, rc, status = CLI_OK;
	uint64_t want_n = 0;
	char *blabel = NULL;
	struct ms_shard_opts o;
	struct ms_shard_result *res = NULL;
	struct ms_err err = {0};
	struct ms_inv *inv = NULL;
	char *dir = NULL;
	cJSON *root = NULL, *faults = NULL;

	memset(&o, 0, sizeof(o));
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			if (cli_u64("--ep-size", optarg, MS_EP_MAX_RANKS, &want_n))
				return CLI_USAGE;
			if (!want_n)
				return cli_usage("option '--ep-size': must be at least 1");
			break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &o.nthreads))
				return CLI_USAGE;
			break;
		case 'B': base = optarg; break;
		case 'J': json = 1; break;
		case 'D': db = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind + 1 != argc)
		return cli_usage(optind == argc ? "missing DIR or MANIFEST" : "one DIR or MANIFEST only");
	/* the inventory, when there is one, is opened first: the base may be a
	 * state, and the shards must be recorded ones */
	if ((db || (env && *env)) && (rc = ms_inv_open(cli_db_path(db), 0, &inv, &err)) != MS_OK)
		goto fail;
	if (base) {
		if ((rc = ms_ep_base_experts(inv, base, NULL, &o.base_experts, &blabel, &err)) != MS_OK)
			goto fail;
		o.base_label = blabel;
	}
	dir = strdup(argv[optind]);
	if (!dir) {
		rc = ms_err_set(&err, MS_ENOMEM, "out of memory");
		goto fail;
	}
	{
		size_t n = strlen(dir), m = strlen(MS_EP_MANIFEST);

		if (n >= m && !strcmp(dir + n - m, MS_EP_MANIFEST) && (n == m || dir[n - m - 1] == '/'))
			dir[n > m ? n - m - 1 : 0] = 0;
		if (!*dir)
			strcpy(dir, ".");
	}
	rc = ms_shard_check(dir, &o, &res, &err);
	if (rc == MS_ECHECK) {
		/* bytes or tensors differ: a check result, one line per fault */
		status = CLI_CHECK;
		if (!res) {
			cli_errorf("'%s': %s", dir, err.msg);
			if (json && ep_json_fault_only(dir, &err) != CLI_OK)
				status = CLI_IO;
			ms_inv_close(inv);
			ms_free(blabel);
			free(dir);
			return status;
		}
		/* the lines go out once nothing is left that could fail (with
		 * --json: once the document is built), so that running out of
		 * memory is one line, not a report cut short */
	} else if (rc != MS_OK) {
		goto fail;
	}
	if (!(root = cJSON_CreateObject()) || !(faults = cJSON_CreateArray()))
		goto nomem;
	for (size_t i = 0; i < res->nfaults; i++)
		if (ep_json_fault(faults, &res->faults[i]))
			goto nomem;
	if (want_n && res->ep_size != want_n) {
		cli_errorf("'%s': shards for EP=%u, the run uses EP=%llu: run 'msshard reshard --ep-size %llu'",
			   dir, res->ep_size, (unsigned long long)want_n, (unsigned long long)want_n);
		if (ep_json_other(faults, "ep-size", NULL, -1, "the shards are for another EP size"))
			goto nomem;
		status = CLI_CHECK;
	}
	/* without --base, the base is the source adapter's nearest ancestor in
	 * the inventory that declares an expert count */
	if (inv && !base) {
		uint32_t be = 0;

		if ((rc = ms_ep_base_experts(inv, NULL, res->source_digest, &be, &blabel, &err)) != MS_OK)
			goto fail;
		if (be && be != res->num_experts) {
			char msg[512];

			int fused = strstr(res->packing, "fused") != NULL;
			char at[48] = "";

			if (fused)
				snprintf(at, sizeof(at), " at r=%u (adapter_config.json)", res->r);
			snprintf(msg, sizeof(msg), "%u experts%s, but the base '%s' (an ancestor of its "
				 "source in the inventory) has %u%s", res->num_experts, at, blabel, be,
				 fused ? ": \"r\" does not fit the fused LoRA's shapes" : "");
			cli_errorf("'%s': %s", dir, msg);
			if (ep_json_other(faults, "experts", res->manifest_path, -1, msg))
				goto nomem;
			status = CLI_CHECK;
		}
	}
	/* with an inventory, each shard must be the state recorded for it */
	if (inv) {
		for (size_t i = 0; i < res->nfiles; i++) {
			struct ms_inv_state *st = NULL;
			struct ms_err lerr = {0};
			int r2 = ms_inv_state_get(inv, res->files[i].state_digest, &st, &lerr);

			if (r2 == MS_ENOTFOUND) {
				cli_errorf("'%s': rank %u: state %s is not in the inventory", res->files[i].path,
					   res->files[i].rank, res->files[i].state_digest);
				if (ep_json_other(faults, "inventory", res->files[i].path, res->files[i].rank,
						  "its state is not in the inventory"))
					goto nomem;
				status = CLI_CHECK;
			} else if (r2 != MS_OK) {
				ms_inv_close(inv);
				inv = NULL;
				rc = r2;
				err = lerr;
				goto fail;
			} else if (st->ep_size >= 0 &&
				   ((uint32_t)st->ep_size != res->ep_size || (uint32_t)st->ep_rank != res->files[i].rank)) {
				cli_errorf("'%s': the inventory records it as rank %d of %d, the shard says rank %u of %u",
					   res->files[i].path, st->ep_rank, st->ep_size, res->files[i].rank,
					   res->ep_size);
				if (ep_json_other(faults, "inventory", res->files[i].path, res->files[i].rank,
						  "the inventory records it as another rank"))
					goto nomem;
				status = CLI_CHECK;
			}
			ms_inv_state_free(st);
		}
		ms_inv_close(inv);
		inv = NULL;
	}
	if (json) {
		cJSON *ranks;
		char *t;

		cJSON_AddStringToObject(root, "result", status == CLI_OK ? "ok" : "fail");
		cJSON_AddStringToObject(root, "source", res->source_digest);
		cJSON_AddNumberToObject(root, "experts", res->num_experts);
		cJSON_AddNumberToObject(root, "ep_size", res->ep_size);
		cJSON_AddStringToObject(root, "placement", ms_ep_placement_name(res->placement->kind));
		ranks = cJSON_AddArrayToObject(root, "ranks");
		for (size_t i = 0; ranks && i < res->nfiles; i++) {
			cJSON *r = cJSON_CreateObject(), *ids = cJSON_AddArrayToObject(r, "experts");

			cJSON_AddItemToArray(ranks, r);
			cJSON_AddNumberToObject(r, "rank", res->files[i].rank);
			cJSON_AddStringToObject(r, "file", res->files[i].path);
			cJSON_AddStringToObject(r, "state", res->files[i].state_digest);
			for (uint32_t k = 0; k < res->files[i].nexperts; k++)
				cJSON_AddItemToArray(ids, cJSON_CreateNumber(res->files[i].experts[k]));
		}
		cJSON_AddItemToObject(root, "faults", faults);
		faults = NULL;
		if (res->nfaults_more)
			cJSON_AddNumberToObject(root, "faults_not_listed", (double)res->nfaults_more);
		if (!(t = cJSON_Print(root)))
			goto nomem;
		ep_print_faults(dir, res);
		puts(t);
		cJSON_free(t);
	} else {
		ep_print_faults(dir, res);
		printf("%s\t%s\t%u experts on %u ranks, %s, %s", status == CLI_OK ? "ok" : "FAIL", dir,
		       res->num_experts, res->ep_size, ms_ep_placement_name(res->placement->kind),
		       res->packing);
		if (res->nfaults || res->nfaults_more)
			printf(", %llu fault%s", (unsigned long long)(res->nfaults + res->nfaults_more),
			       res->nfaults + res->nfaults_more > 1 ? "s" : "");
		putchar('\n');
		for (size_t i = 0; i < res->nfiles; i++) {
			printf("rank %u\t%s\texperts", res->files[i].rank, res->files[i].state_digest);
			for (uint32_t k = 0; k < res->files[i].nexperts; k++)
				printf("%s%u", k ? "," : " ", res->files[i].experts[k]);
			putchar('\n');
		}
	}
	cJSON_Delete(root);
	cJSON_Delete(faults);
	ms_shard_result_free(res);
	ms_inv_close(inv);
	ms_free(blabel);
	free(dir);
	return status;
nomem:
	rc = ms_err_set(&err, MS_ENOMEM, "out of memory");
fail:
	if (json)
		ep_json_error(dir, rc, &err);
	ms_inv_close(inv);
	cJSON_Delete(root);
	cJSON_Delete(faults);
	ms_shard_result_free(res);
	ms_free(blabel);
	free(dir);
	return cli_fail(rc, &err);
}

static const struct cli_cmd cmds[] = {
	{"files", cmd_files, "files [--db PATH] [--device] [--jobs N] [--json] [--manifest M.json [--sig SIG --pub KEY.pub]] [STATE | PATH ...]",
	 "re-hash states against the inventory or a manifest",
	 "--device\tcheck tensors with tree digests on the GPU, over the bytes in device memory\n"
	 "--manifest M.json\tcheck against an exported manifest instead of the inventory\n"
	 "--sig SIG\tthe manifest's signature (with --pub)\n"
	 "--pub KEY.pub\tthe public key the signature must verify with\n"},
	{"ep", cmd_ep, "ep [--db PATH] [--ep-size N] [--base PATH | STATE] [--jobs N] [--json] DIR | MANIFEST",
	 "every expert on exactly one rank, with its own bytes",
	 "--ep-size N\tthe EP size the set must have been made for\n"
	 "--base PATH | STATE\tthe base whose expert count the adapter must have\n"},
	{"policy", cmd_policy,
	 "policy [--db PATH] [--jobs N] [--json] [--register [--label LABEL]] DIR... | TENSOR_MAP.json",
	 "which inventoried states a served policy is made of",
	 "--register\trecord an identified policy as a state of kind policy\n"
	 "--label LABEL\tthe label of the registered policy\n"},
	{"quant", cmd_quant, "quant [--db PATH] [--jobs N] [--json] [--max-rel-err X] [--source STATE] [--strict] QSTATE",
	 "check that an NVFP4 state decodes within bound of its source",
	 "--max-rel-err X\tthe largest relative error allowed per tensor\n"
	 "--source STATE\tthe source (a state or a path; default: the recorded parent)\n"
	 "--strict\texit 1 when there is no source to check against\n"},
	{"sign", cmd_sign, "sign [--force] [--jobs N] [--json] [-o SIG] --key KEY.pem PATH",
	 "sign a model directory (OpenSSF Model Signing, EC key)",
	 "--force\treplace an existing SIG\n"
	 "-o SIG\tthe signature to write\n"
	 "--key KEY.pem\tthe EC private key to sign with\n"},
	{"verify", cmd_verify, "verify [--jobs N] [--json] --sig SIG --pub KEY.pub PATH",
	 "verify a model directory against an OpenSSF Model Signing signature",
	 "--sig SIG\tthe signature (a sigstore bundle)\n"
	 "--pub KEY.pub\tthe public key it must verify with\n"},
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
