/*
 * msinv: the inventory of model weight states. This file parses arguments,
 * calls libms and prints; everything else lives in src/.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

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
		struct ms_st_file_info fi, *f = &fi;
		cJSON *o = cJSON_CreateObject(), *meta;

		ms_st_file_info(c->files[i], &fi);
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
		struct ms_st_file_info fi;

		ms_st_file_info(t->file, &fi);
		cJSON_AddItemToArray(tensors, o);
		cJSON_AddStringToObject(o, "name", t->name);
		cJSON_AddStringToObject(o, "dtype", ms_dtype_name(t->dtype));
		cJSON_AddItemToObject(o, "shape", shape_json(t));
		cJSON_AddNumberToObject(o, "bytes", (double)t->nbytes);
		cJSON_AddStringToObject(o, "file", ms_path_base(fi.path));
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
		struct ms_st_file_info fi, *f = &fi;
		char hex[65];

		ms_st_file_info(ck->files[i], &fi);
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

/* ---- the inventory commands ----------------------------------------------------- */

/* main's arguments, recorded as the provenance of every change */
static int g_argc;
static char **g_argv;

static int open_inv(const char *db, unsigned flags, struct ms_inv **inv)
{
	struct ms_err err = {0};
	int rc = ms_inv_open(cli_db_path(db), flags, inv, &err);

	if (rc == MS_OK)
		rc = ms_inv_set_origin(*inv, "msinv", g_argc, g_argv, &err);
	if (rc != MS_OK) {
		ms_inv_close(*inv);
		*inv = NULL;
		return cli_fail(rc, &err);
	}
	return CLI_OK;
}

/* Print a cJSON value (consumed) on stdout. */
static int print_json(cJSON *o)
{
	char *text = o ? cJSON_Print(o) : NULL;

	cJSON_Delete(o);
	if (!text) {
		cli_errorf("out of memory");
		return CLI_IO;
	}
	puts(text);
	cJSON_free(text);
	return CLI_OK;
}

static void human_bytes(uint64_t n, char *buf, size_t len)
{
	char s[MS_BYTES_STR_LEN];

	snprintf(buf, len, "%s", ms_bytes_str(n, s));
}

/* "sha256:0123456789abcdef" for text output meant for people. */
static const char *short_digest(const char *d, char buf[32])
{
	snprintf(buf, 32, "%.23s", d);
	return buf;
}

static void shape_text(uint32_t ndim, const uint64_t *shape, char *buf, size_t n)
{
	size_t k = (size_t)snprintf(buf, n, "[");

	for (uint32_t d = 0; d < ndim && k < n; d++)
		k += (size_t)snprintf(buf + k, n - k, d ? ",%llu" : "%llu",
				      (unsigned long long)shape[d]);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

/* Options every inventory command takes. */
#define DB_OPTION {"db", required_argument, NULL, 'D'}
#define HELP_OPTION {"help", no_argument, NULL, 'h'}

/* ---- init -------------------------------------------------------------------------- */

static int cmd_init(int argc, char **argv)
{
	static const struct option opts[] = { DB_OPTION, HELP_OPTION, {NULL, 0, NULL, 0} };
	const char *db = NULL;
	struct ms_inv *inv = NULL;
	int c, rc, existed;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc)
		return cli_usage("unexpected argument '%s'", argv[optind]);
	existed = access(cli_db_path(db), F_OK) == 0;
	if ((rc = open_inv(db, MS_INV_CREATE, &inv)) != CLI_OK)
		return rc;
	printf("%s '%s' (schema version %d)\n", existed ? "inventory" : "created",
	       ms_inv_path(inv), ms_inv_schema_version(inv));
	ms_inv_close(inv);
	return CLI_OK;
}

/* ---- add --------------------------------------------------------------------------- */

static int cmd_add(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"kind", required_argument, NULL, 'k'},
		{"label", required_argument, NULL, 'l'},
		{"parent", required_argument, NULL, 'p'},
		{"op", required_argument, NULL, 'o'},
		{"params", required_argument, NULL, 'P'},
		{"ep-size", required_argument, NULL, 'S'},
		{"ep-rank", required_argument, NULL, 'R'},
		{"jobs", required_argument, NULL, 'j'},
		{"rehash", no_argument, NULL, 'r'},
		{"file-digests", no_argument, NULL, 'f'},
		{"json", no_argument, NULL, 'J'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL, *parents[MS_INV_MAX_PARENTS];
	struct ms_inv_add_opts o;
	struct ms_inv_add_stats stats;
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};
	char digest[MS_STATE_DIGEST_LEN];
	struct cli_progress pr = {.what = "hashing"};
	int c, rc, json = 0, v;

	ms_inv_add_opts_init(&o);
	o.stats = &stats;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'k':
			if (ms_inv_kind_parse(optarg, &o.kind) != MS_OK)
				return cli_usage("unknown kind '%s' (base, quantized, adapter, adapter_shard, policy)",
						 optarg);
			break;
		case 'l': o.label = optarg; break;
		case 'p':
			if (o.nparents == MS_INV_MAX_PARENTS)
				return cli_usage("at most %d --parent options", MS_INV_MAX_PARENTS);
			parents[o.nparents++] = optarg;
			break;
		case 'o': o.operation = optarg; break;
		case 'P': o.params_json = optarg; break;
		case 'S':
			if (cli_int("--ep-size", optarg, 1 << 20, &v))
				return CLI_USAGE;
			o.ep_size = v;
			break;
		case 'R':
			if (cli_int("--ep-rank", optarg, 1 << 20, &v))
				return CLI_USAGE;
			o.ep_rank = v;
			break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &o.jobs))
				return CLI_USAGE;
			break;
		case 'r': o.rehash = 1; break;
		case 'f': o.file_digests = 1; break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return cli_usage("missing PATH");
	if ((o.ep_size < 0) != (o.ep_rank < 0))
		return cli_usage("--ep-size and --ep-rank go together");
	if (o.nparents && !o.operation)
		return cli_usage("--parent needs --op (the operation that made the state)");
	if (o.operation && !o.nparents)
		return cli_usage("--op needs --parent");
	if (o.params_json && !o.nparents)
		return cli_usage("--params needs --parent and --op");
	o.parents = parents;
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	cli_progress_inv(inv, &pr);
	cli_catch_interrupts();
	rc = ms_inv_add_paths(inv, (const char *const *)argv + optind, (size_t)(argc - optind), &o,
			      digest, &err);
	cli_progress_end(&pr);
	ms_inv_close(inv);
	if (rc != MS_OK)
		return cli_fail(rc, &err);
	if (cli_progress_enabled()) {
		char b[32], h[32];

		human_bytes(stats.bytes, b, sizeof(b));
		human_bytes(stats.bytes_hashed, h, sizeof(h));
		fprintf(stderr, "msinv: %s in %u file%s; hashed %s (%u file%s) in %.2f s; %s\n", b,
			stats.files, stats.files == 1 ? "" : "s", h, stats.files_hashed,
			stats.files_hashed == 1 ? "" : "s", stats.seconds_hash,
			stats.new_state ? "new state" : stats.new_copy ? "new copy of a recorded state" :
			"already recorded");
	}
	if (json) {
		cJSON *j = cJSON_CreateObject();

		cJSON_AddStringToObject(j, "state", digest);
		cJSON_AddStringToObject(j, "kind", ms_inv_kind_name(stats.kind));
		cJSON_AddStringToObject(j, "layout", stats.layout);
		cJSON_AddBoolToObject(j, "new_state", stats.new_state);
		cJSON_AddBoolToObject(j, "new_copy", stats.new_copy);
		cJSON_AddNumberToObject(j, "copy", stats.copy);
		cJSON_AddNumberToObject(j, "files", stats.files);
		cJSON_AddNumberToObject(j, "files_hashed", stats.files_hashed);
		cJSON_AddNumberToObject(j, "tensors", (double)stats.tensors);
		cJSON_AddNumberToObject(j, "bytes", (double)stats.bytes);
		cJSON_AddNumberToObject(j, "bytes_hashed", (double)stats.bytes_hashed);
		cJSON_AddNumberToObject(j, "seconds_hash", stats.seconds_hash);
		cJSON_AddNumberToObject(j, "seconds_db", stats.seconds_db);
		return print_json(j);
	}
	printf("%s\n", digest);
	return CLI_OK;
}

/* ---- ls ------------------------------------------------------------------------------ */

/* "labels": every label of the state, oldest first (the library gives
 * them space-separated: a label has no spaces). */
static void labels_json(cJSON *o, const char *labels)
{
	cJSON *a = cJSON_AddArrayToObject(o, "labels");

	for (const char *p = labels; a && p && *p;) {
		size_t n = strcspn(p, " ");
		char *l = ms_strndup(p, n);

		if (l)
			cJSON_AddItemToArray(a, cJSON_CreateString(l));
		ms_free(l);
		p += n;
		p += *p == ' ';
	}
}

static cJSON *state_json(const struct ms_inv_state *s)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddStringToObject(o, "state", s->digest);
	if (s->label)
		cJSON_AddStringToObject(o, "label", s->label);
	else
		cJSON_AddNullToObject(o, "label");
	cJSON_AddStringToObject(o, "kind", ms_inv_kind_name(s->kind));
	cJSON_AddStringToObject(o, "layout", s->layout);
	cJSON_AddNumberToObject(o, "tensors", (double)s->ntensors);
	cJSON_AddNumberToObject(o, "bytes", (double)s->nbytes);
	if (s->ep_size > 0) {
		cJSON_AddNumberToObject(o, "ep_size", s->ep_size);
		cJSON_AddNumberToObject(o, "ep_rank", s->ep_rank);
		if (s->experts)
			cJSON_AddRawToObject(o, "experts", s->experts);
	}
	cJSON_AddNumberToObject(o, "copies", s->ncopies);
	cJSON_AddStringToObject(o, "created_at", s->created_at);
	cJSON_AddStringToObject(o, "user", s->user);
	cJSON_AddStringToObject(o, "host", s->host);
	cJSON_AddStringToObject(o, "tool", s->tool);
	cJSON_AddRawToObject(o, "argv", s->argv);
	if (s->cwd)
		cJSON_AddStringToObject(o, "cwd", s->cwd);
	else
		cJSON_AddNullToObject(o, "cwd");
	labels_json(o, s->labels);
	return o;
}

static int cmd_ls(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"kind", required_argument, NULL, 'k'},
		{"json", no_argument, NULL, 'J'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	enum ms_inv_kind kind = MS_INV_KIND_ANY;
	struct ms_inv *inv = NULL;
	struct ms_inv_state *s = NULL;
	struct ms_err err = {0};
	size_t n = 0;
	int c, rc, json = 0;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'k':
			if (ms_inv_kind_parse(optarg, &kind) != MS_OK)
				return cli_usage("unknown kind '%s' (base, quantized, adapter, adapter_shard, policy)",
						 optarg);
			break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc)
		return cli_usage("unexpected argument '%s'", argv[optind]);
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	rc = ms_inv_states_list(inv, kind, &s, &n, &err);
	ms_inv_close(inv);
	if (rc != MS_OK)
		return cli_fail(rc, &err);
	if (json) {
		cJSON *a = cJSON_CreateArray();

		for (size_t i = 0; i < n; i++)
			cJSON_AddItemToArray(a, state_json(&s[i]));
		ms_inv_states_free(s, n);
		return print_json(a);
	}
	for (size_t i = 0; i < n; i++) {
		char ep[32] = "-";

		if (s[i].ep_size > 0)
			snprintf(ep, sizeof(ep), "%d/%d", s[i].ep_rank, s[i].ep_size);
		/* several labels: comma-separated (a label has no comma) */
		for (char *p = s[i].labels; p && *p; p++)
			if (*p == ' ')
				*p = ',';
		printf("%s\t%s\t%s\t%s\t%llu\t%llu\t%s\t%s\n", s[i].digest, ms_inv_kind_name(s[i].kind),
		       s[i].layout, ep, (unsigned long long)s[i].ntensors,
		       (unsigned long long)s[i].nbytes, s[i].labels ? s[i].labels : "-", s[i].created_at);
	}
	ms_inv_states_free(s, n);
	return CLI_OK;
}

/* ---- show ---------------------------------------------------------------------------- */

struct show_data {
	struct ms_inv_state *s;
	struct ms_inv_files files;
	struct ms_inv_config *cfg;
	size_t ncfg;
	struct ms_inv_edge *parents, *children;
	size_t nparents, nchildren;
	struct ms_inv_verification *ver;
	size_t nver;
	struct ms_inv_run *runs, *made_by;
	size_t nruns, nmade_by;
};

static void show_free(struct show_data *d)
{
	ms_inv_state_free(d->s);
	ms_inv_files_release(&d->files);
	ms_inv_configs_free(d->cfg, d->ncfg);
	ms_inv_edges_free(d->parents, d->nparents);
	ms_inv_edges_free(d->children, d->nchildren);
	ms_inv_verifications_free(d->ver, d->nver);
	ms_inv_runs_free(d->runs, d->nruns);
	ms_inv_runs_free(d->made_by, d->nmade_by);
}

static cJSON *edge_json(const struct ms_inv_edge *e, int parent_side)
{
	cJSON *o = cJSON_CreateObject();
	const char *d = parent_side ? e->parent : e->child;
	const char *l = parent_side ? e->parent_label : e->child_label;

	cJSON_AddStringToObject(o, "state", d);
	if (l)
		cJSON_AddStringToObject(o, "label", l);
	cJSON_AddStringToObject(o, "operation", e->operation);
	cJSON_AddRawToObject(o, "params", e->params);
	if (e->run_id)
		cJSON_AddNumberToObject(o, "run", (double)e->run_id);
	cJSON_AddStringToObject(o, "created_at", e->created_at);
	return o;
}

static cJSON *run_json(const struct ms_inv_run *r)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddNumberToObject(o, "run", (double)r->id);
	cJSON_AddStringToObject(o, "plan", r->plan_digest);
	cJSON_AddStringToObject(o, "status", r->status);
	if (r->has_exit_code)
		cJSON_AddNumberToObject(o, "exit_code", r->exit_code);
	if (r->role)
		cJSON_AddStringToObject(o, "role", r->role);
	cJSON_AddStringToObject(o, "started_at", r->started_at);
	if (r->ended_at)
		cJSON_AddStringToObject(o, "ended_at", r->ended_at);
	cJSON_AddStringToObject(o, "user", r->user);
	cJSON_AddStringToObject(o, "host", r->host);
	return o;
}

static int show_json(const struct show_data *d, int tensors)
{
	cJSON *o = state_json(d->s), *a;
	char hex[65];

	a = cJSON_AddArrayToObject(o, "files");
	for (size_t i = 0; i < d->files.n; i++) {
		const struct ms_inv_file *f = &d->files.files[i];
		cJSON *fo = cJSON_CreateObject();

		cJSON_AddNumberToObject(fo, "copy", f->copy);
		cJSON_AddStringToObject(fo, "name", f->name);
		cJSON_AddStringToObject(fo, "path", f->path);
		cJSON_AddNumberToObject(fo, "size", (double)f->size);
		ms_hex(f->header_digest, 32, hex);
		cJSON_AddStringToObject(fo, "header_sha256", hex);
		if (f->has_file_digest) {
			ms_hex(f->file_digest, 32, hex);
			cJSON_AddStringToObject(fo, "sha256", hex);
		}
		if (tensors) {
			cJSON *ta = cJSON_AddArrayToObject(fo, "tensors");

			for (size_t t = 0; t < f->ntensors; t++) {
				const struct ms_vtensor *te = &f->tensors[t];
				cJSON *to = cJSON_CreateObject(), *sh = cJSON_CreateArray();

				cJSON_AddStringToObject(to, "name", te->name);
				cJSON_AddStringToObject(to, "dtype", ms_dtype_name(te->dtype));
				for (uint32_t k = 0; k < te->ndim; k++)
					cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)te->shape[k]));
				cJSON_AddItemToObject(to, "shape", sh);
				cJSON_AddNumberToObject(to, "offset", (double)te->offset);
				cJSON_AddNumberToObject(to, "bytes", (double)te->nbytes);
				ms_hex(te->digest, 32, hex);
				cJSON_AddStringToObject(to, "sha256", hex);
				cJSON_AddItemToArray(ta, to);
			}
		}
		cJSON_AddItemToArray(a, fo);
	}
	a = cJSON_AddArrayToObject(o, "configs");
	for (size_t i = 0; i < d->ncfg; i++) {
		cJSON *co = cJSON_CreateObject();
		char *note;

		if (ms_inv_config_quant(&d->cfg[i], &note, NULL) != MS_OK) {
			cJSON_Delete(co);
			cJSON_Delete(o);
			cli_errorf("out of memory");
			return CLI_IO;
		}
		cJSON_AddNumberToObject(co, "copy", d->cfg[i].copy);
		cJSON_AddStringToObject(co, "name", d->cfg[i].name);
		cJSON_AddStringToObject(co, "path", d->cfg[i].path);
		ms_hex(d->cfg[i].digest, 32, hex);
		cJSON_AddStringToObject(co, "sha256", hex);
		if (note)
			cJSON_AddRawToObject(co, "quantization_config", note);
		ms_free(note);
		cJSON_AddItemToArray(a, co);
	}
	a = cJSON_AddArrayToObject(o, "parents");
	for (size_t i = 0; i < d->nparents; i++)
		cJSON_AddItemToArray(a, edge_json(&d->parents[i], 1));
	a = cJSON_AddArrayToObject(o, "children");
	for (size_t i = 0; i < d->nchildren; i++)
		cJSON_AddItemToArray(a, edge_json(&d->children[i], 0));
	a = cJSON_AddArrayToObject(o, "verifications");
	for (size_t i = 0; i < d->nver; i++) {
		cJSON *v = cJSON_CreateObject();

		cJSON_AddStringToObject(v, "at", d->ver[i].at);
		cJSON_AddStringToObject(v, "result", ms_inv_result_name(d->ver[i].result));
		cJSON_AddNumberToObject(v, "bytes", (double)d->ver[i].nbytes);
		cJSON_AddNumberToObject(v, "seconds", d->ver[i].seconds);
		cJSON_AddStringToObject(v, "host", d->ver[i].host);
		cJSON_AddStringToObject(v, "user", d->ver[i].user);
		cJSON_AddStringToObject(v, "tool", d->ver[i].tool);
		if (d->ver[i].detail)
			cJSON_AddStringToObject(v, "detail", d->ver[i].detail);
		cJSON_AddItemToArray(a, v);
	}
	a = cJSON_AddArrayToObject(o, "consumed_by");
	for (size_t i = 0; i < d->nruns; i++)
		cJSON_AddItemToArray(a, run_json(&d->runs[i]));
	a = cJSON_AddArrayToObject(o, "produced_by");
	for (size_t i = 0; i < d->nmade_by; i++)
		cJSON_AddItemToArray(a, run_json(&d->made_by[i]));
	return print_json(o);
}

/* The command line recorded as a JSON array, words separated by spaces.
 * MS_OK, or MS_ENOMEM with nothing printed. */
static int print_argv(const char *json)
{
	char *text = NULL;
	int rc = ms_inv_argv_text(json, &text, NULL);

	if (text)
		fputs(text, stdout);
	ms_free(text);
	return rc;
}

static int show_text(const struct show_data *d, int tensors)
{
	const struct ms_inv_state *s = d->s;
	char b[32], hex[65], sd[32];
	uint32_t copy = 0;

	human_bytes(s->nbytes, b, sizeof(b));
	printf("state     %s\n", s->digest);
	printf("label     %s\n", s->labels ? s->labels : "-");
	printf("kind      %s\n", ms_inv_kind_name(s->kind));
	printf("layout    %s\n", s->layout);
	printf("tensors   %llu\n", (unsigned long long)s->ntensors);
	printf("bytes     %llu (%s)\n", (unsigned long long)s->nbytes, b);
	if (s->ep_size > 0)
		printf("ep        rank %d of %d, experts %s\n", s->ep_rank, s->ep_size,
		       s->experts ? s->experts : "(not recorded)");
	printf("created   %s by %s@%s: ", s->created_at, s->user, s->host);
	if (print_argv(s->argv) != MS_OK)
		goto oom;
	if (s->cwd)
		printf(" (in %s)", s->cwd);
	putchar('\n');
	if (d->files.n == 0)
		printf("copies    none here (an ancestor recorded from an imported bundle)\n");
	for (size_t i = 0; i < d->files.n; i++) {
		const struct ms_inv_file *f = &d->files.files[i];

		if (f->copy != copy) {
			copy = f->copy;
			printf("copy %u\n", copy);
			for (size_t k = 0; k < d->ncfg; k++) {
				char *note;

				if (d->cfg[k].copy != copy)
					continue;
				ms_hex(d->cfg[k].digest, 32, hex);
				printf("  config  %s  sha256 %s\n", d->cfg[k].path, hex);
				if (ms_inv_config_quant(&d->cfg[k], &note, NULL) != MS_OK)
					goto oom;
				if (note)
					printf("          quantization_config %s\n", note);
				ms_free(note);
			}
		}
		ms_hex(f->header_digest, 32, hex);
		printf("  file    %s  %llu bytes  header sha256 %s", f->path,
		       (unsigned long long)f->size, hex);
		if (f->has_file_digest) {
			ms_hex(f->file_digest, 32, hex);
			printf("  sha256 %s", hex);
		}
		putchar('\n');
	}
	for (size_t i = 0; i < d->nparents; i++)
		printf("parent    %s%s%s%s  %s %s\n", d->parents[i].parent,
		       d->parents[i].parent_label ? " (" : "",
		       d->parents[i].parent_label ? d->parents[i].parent_label : "",
		       d->parents[i].parent_label ? ")" : "", d->parents[i].operation,
		       d->parents[i].params);
	for (size_t i = 0; i < d->nchildren; i++)
		printf("child     %s%s%s%s  %s %s\n", d->children[i].child,
		       d->children[i].child_label ? " (" : "",
		       d->children[i].child_label ? d->children[i].child_label : "",
		       d->children[i].child_label ? ")" : "", d->children[i].operation,
		       d->children[i].params);
	for (size_t i = 0; i < d->nver; i++)
		printf("verified  %s  %s  %llu bytes in %.3f s  %s@%s%s%s\n", d->ver[i].at,
		       ms_inv_result_name(d->ver[i].result), (unsigned long long)d->ver[i].nbytes,
		       d->ver[i].seconds, d->ver[i].user, d->ver[i].host,
		       d->ver[i].detail ? "  " : "", d->ver[i].detail ? d->ver[i].detail : "");
	for (size_t i = 0; i < d->nruns; i++)
		printf("run       %lld  plan %s  %s%s  %s\n", (long long)d->runs[i].id,
		       short_digest(d->runs[i].plan_digest, sd), d->runs[i].status,
		       d->runs[i].role ? " as " : "", d->runs[i].role ? d->runs[i].role : "");
	for (size_t i = 0; i < d->nmade_by; i++)
		printf("made by   run %lld  plan %s  %s\n", (long long)d->made_by[i].id,
		       short_digest(d->made_by[i].plan_digest, sd), d->made_by[i].status);
	if (!tensors)
		return CLI_OK;
	for (size_t i = 0; i < d->files.n; i++) {
		const struct ms_inv_file *f = &d->files.files[i];

		if (f->copy != d->files.files[0].copy)
			break;
		for (size_t t = 0; t < f->ntensors; t++) {
			const struct ms_vtensor *te = &f->tensors[t];
			char shape[24 * MS_ST_MAX_RANK + 4];

			shape_text(te->ndim, te->shape, shape, sizeof(shape));
			ms_hex(te->digest, 32, hex);
			printf("%s\t%s\t%s\t%llu\t%s\t%s\n", te->name, ms_dtype_name(te->dtype), shape,
			       (unsigned long long)te->nbytes, hex, f->name);
		}
	}
	return CLI_OK;
oom:
	putchar('\n');
	cli_errorf("out of memory");
	return CLI_IO;
}

static int cmd_show(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"tensors", no_argument, NULL, 't'},
		{"json", no_argument, NULL, 'J'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};
	struct show_data d;
	char digest[MS_STATE_DIGEST_LEN];
	int c, rc, json = 0, tensors = 0;

	memset(&d, 0, sizeof(d));
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 't': tensors = 1; break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc - 1)
		return cli_usage(optind >= argc ? "missing STATE" : "one STATE only");
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	if ((rc = ms_inv_resolve(inv, argv[optind], digest, &err)) != MS_OK ||
	    (rc = ms_inv_state_get(inv, digest, &d.s, &err)) != MS_OK ||
	    (rc = ms_inv_state_files(inv, digest, 0, tensors, &d.files, &err)) != MS_OK ||
	    (rc = ms_inv_state_configs(inv, digest, &d.cfg, &d.ncfg, &err)) != MS_OK ||
	    (rc = ms_inv_edges(inv, digest, MS_INV_EDGES_PARENTS, &d.parents, &d.nparents, &err)) != MS_OK ||
	    (rc = ms_inv_edges(inv, digest, MS_INV_EDGES_CHILDREN, &d.children, &d.nchildren, &err)) != MS_OK ||
	    (rc = ms_inv_verifications(inv, digest, &d.ver, &d.nver, &err)) != MS_OK ||
	    (rc = ms_inv_state_runs(inv, digest, 1, &d.runs, &d.nruns, &err)) != MS_OK ||
	    (rc = ms_inv_state_runs(inv, digest, 0, &d.made_by, &d.nmade_by, &err)) != MS_OK) {
		ms_inv_close(inv);
		show_free(&d);
		return cli_fail(rc, &err);
	}
	ms_inv_close(inv);
	if (json)
		rc = show_json(&d, tensors);
	else
		rc = show_text(&d, tensors);
	show_free(&d);
	return rc;
}

/* ---- lineage --------------------------------------------------------------------------- */

/* A string as a Graphviz double-quoted string (quotes and backslashes escaped,
 * control characters dropped). */
static void dot_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			putchar('\\');
		if ((unsigned char)*s >= 0x20)
			putchar(*s);
	}
	putchar('"');
}

static void dot_node(const char *digest, const char *label, enum ms_inv_kind kind,
		     const char *layout, int self)
{
	char text[512], sd[32];

	snprintf(text, sizeof(text), "%s%s%s %s\n%s", label ? label : "", label ? "\n" : "",
		 ms_inv_kind_name(kind), layout ? layout : "", short_digest(digest, sd));
	printf("\t");
	dot_str(digest);
	printf(" [label=");
	/* dot reads \n inside a label as a line break */
	putchar('"');
	for (const char *p = text; *p; p++) {
		if (*p == '\n') {
			fputs("\\n", stdout);
			continue;
		}
		if (*p == '"' || *p == '\\')
			putchar('\\');
		if ((unsigned char)*p >= 0x20)
			putchar(*p);
	}
	putchar('"');
	printf("%s];\n", self ? ", style=bold" : "");
}

static int lineage_dot(const struct ms_inv_state *s, struct ms_inv_edge *e, size_t n)
{
	char **seen = ms_calloc(2 * n + 1, sizeof(*seen));
	size_t ns = 0;

	if (!seen) {
		cli_errorf("out of memory");
		return CLI_IO;
	}
	printf("digraph lineage {\n\tnode [shape=box];\n");
	dot_node(s->digest, s->label, s->kind, s->layout, 1);
	seen[ns++] = (char *)s->digest;
	for (size_t i = 0; i < n; i++) {
		for (int side = 0; side < 2; side++) {
			const char *d = side ? e[i].child : e[i].parent;
			size_t k;

			for (k = 0; k < ns && strcmp(seen[k], d); k++)
				;
			if (k < ns)
				continue;
			seen[ns++] = (char *)d;
			if (side)
				dot_node(d, e[i].child_label, e[i].child_kind, e[i].child_layout, 0);
			else
				dot_node(d, e[i].parent_label, e[i].parent_kind, e[i].parent_layout, 0);
		}
	}
	for (size_t i = 0; i < n; i++) {
		char *label = ms_asprintf("%s %s", e[i].operation, e[i].params);

		printf("\t");
		dot_str(e[i].parent);
		printf(" -> ");
		dot_str(e[i].child);
		printf(" [label=");
		dot_str(label ? label : e[i].operation);
		printf("];\n");
		ms_free(label);
	}
	printf("}\n");
	ms_free(seen);
	return CLI_OK;
}

static void edge_text(const struct ms_inv_edge *e)
{
	char a[32], b[32];

	printf("  %s%s%s%s -> %s%s%s%s  %s %s\n", short_digest(e->parent, a),
	       e->parent_label ? " (" : "", e->parent_label ? e->parent_label : "",
	       e->parent_label ? ")" : "", short_digest(e->child, b), e->child_label ? " (" : "",
	       e->child_label ? e->child_label : "", e->child_label ? ")" : "", e->operation,
	       e->params);
}

static cJSON *edges_json(const struct ms_inv_edge *e, size_t n)
{
	cJSON *a = cJSON_CreateArray();

	for (size_t i = 0; i < n; i++) {
		cJSON *o = cJSON_CreateObject();

		cJSON_AddStringToObject(o, "parent", e[i].parent);
		cJSON_AddStringToObject(o, "child", e[i].child);
		cJSON_AddStringToObject(o, "operation", e[i].operation);
		cJSON_AddRawToObject(o, "params", e[i].params);
		if (e[i].run_id)
			cJSON_AddNumberToObject(o, "run", (double)e[i].run_id);
		cJSON_AddStringToObject(o, "created_at", e[i].created_at);
		cJSON_AddItemToArray(a, o);
	}
	return a;
}

static int cmd_lineage(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"dot", no_argument, NULL, 'd'},
		{"json", no_argument, NULL, 'J'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	struct ms_inv *inv = NULL;
	struct ms_inv_state *s = NULL;
	struct ms_inv_edge *anc = NULL, *desc = NULL, *all = NULL;
	size_t nanc = 0, ndesc = 0;
	struct ms_err err = {0};
	char digest[MS_STATE_DIGEST_LEN], sd[32];
	int c, rc, json = 0, dot = 0;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'd': dot = 1; break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc - 1)
		return cli_usage(optind >= argc ? "missing STATE" : "one STATE only");
	if (dot && json)
		return cli_usage("--dot and --json exclude each other");
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	if ((rc = ms_inv_resolve(inv, argv[optind], digest, &err)) != MS_OK ||
	    (rc = ms_inv_state_get(inv, digest, &s, &err)) != MS_OK ||
	    (rc = ms_inv_edges(inv, digest, MS_INV_EDGES_ANCESTORS, &anc, &nanc, &err)) != MS_OK ||
	    (rc = ms_inv_edges(inv, digest, MS_INV_EDGES_DESCENDANTS, &desc, &ndesc, &err)) != MS_OK) {
		ms_inv_close(inv);
		rc = cli_fail(rc, &err);
		goto out;
	}
	ms_inv_close(inv);
	if (json) {
		cJSON *o = cJSON_CreateObject();

		cJSON_AddItemToObject(o, "state", state_json(s));
		cJSON_AddItemToObject(o, "ancestors", edges_json(anc, nanc));
		cJSON_AddItemToObject(o, "descendants", edges_json(desc, ndesc));
		rc = print_json(o);
	} else if (dot) {
		all = ms_calloc(nanc + ndesc + 1, sizeof(*all));
		if (!all) {
			cli_errorf("out of memory");
			rc = CLI_IO;
			goto out;
		}
		/* shallow copies: the strings stay owned by anc and desc */
		if (nanc)
			memcpy(all, anc, nanc * sizeof(*all));
		if (ndesc)
			memcpy(all + nanc, desc, ndesc * sizeof(*all));
		rc = lineage_dot(s, all, nanc + ndesc);
	} else {
		printf("%s%s%s%s  %s %s\n", short_digest(s->digest, sd), s->label ? " (" : "",
		       s->label ? s->label : "", s->label ? ")" : "", ms_inv_kind_name(s->kind),
		       s->layout);
		printf("ancestors: %zu edge%s\n", nanc, nanc == 1 ? "" : "s");
		for (size_t i = 0; i < nanc; i++)
			edge_text(&anc[i]);
		printf("descendants: %zu edge%s\n", ndesc, ndesc == 1 ? "" : "s");
		for (size_t i = 0; i < ndesc; i++)
			edge_text(&desc[i]);
		rc = CLI_OK;
	}
out:
	ms_free(all);
	ms_inv_edges_free(anc, nanc);
	ms_inv_edges_free(desc, ndesc);
	ms_inv_state_free(s);
	return rc;
}

/* ---- dup ------------------------------------------------------------------------------- */

static int cmd_dup(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"json", no_argument, NULL, 'J'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	struct ms_inv *inv = NULL;
	struct ms_inv_dup_report r;
	struct ms_err err = {0};
	int c, rc, json = 0;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc)
		return cli_usage("unexpected argument '%s'", argv[optind]);
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	rc = ms_inv_dup(inv, &r, &err);
	ms_inv_close(inv);
	if (rc != MS_OK)
		return cli_fail(rc, &err);
	if (json) {
		cJSON *o = cJSON_CreateObject(), *a;

		cJSON_AddNumberToObject(o, "stored_tensors", (double)r.stored_tensors);
		cJSON_AddNumberToObject(o, "stored_bytes", (double)r.stored_bytes);
		cJSON_AddNumberToObject(o, "unique_bytes", (double)r.unique_bytes);
		cJSON_AddNumberToObject(o, "redundant_bytes", (double)r.redundant_bytes);
		a = cJSON_AddArrayToObject(o, "pairs");
		for (size_t i = 0; i < r.npairs; i++) {
			cJSON *p = cJSON_CreateObject();

			cJSON_AddStringToObject(p, "a", r.pairs[i].a);
			cJSON_AddStringToObject(p, "b", r.pairs[i].b);
			cJSON_AddNumberToObject(p, "tensors", (double)r.pairs[i].ntensors);
			cJSON_AddNumberToObject(p, "bytes", (double)r.pairs[i].nbytes);
			cJSON_AddItemToArray(a, p);
		}
		a = cJSON_AddArrayToObject(o, "duplicates");
		for (size_t i = 0; i < r.n; i++) {
			cJSON *d = cJSON_CreateObject(), *pa;

			cJSON_AddStringToObject(d, "sha256", r.dups[i].digest);
			cJSON_AddNumberToObject(d, "bytes", (double)r.dups[i].nbytes);
			cJSON_AddNumberToObject(d, "copies", (double)r.dups[i].nplaces);
			pa = cJSON_AddArrayToObject(d, "places");
			for (size_t p = 0; p < r.dups[i].nplaces; p++) {
				const struct ms_inv_dup_place *pl = &r.dups[i].places[p];
				cJSON *po = cJSON_CreateObject(), *sa;

				cJSON_AddStringToObject(po, "path", pl->path);
				cJSON_AddStringToObject(po, "tensor", pl->tensor);
				sa = cJSON_AddArrayToObject(po, "states");
				for (size_t s = 0; s < pl->nstates; s++)
					cJSON_AddItemToArray(sa, cJSON_CreateString(pl->states[s]));
				cJSON_AddItemToArray(pa, po);
			}
			cJSON_AddItemToArray(a, d);
		}
		ms_inv_dup_release(&r);
		return print_json(o);
	}
	{
		char s[32], u[32], w[32];

		human_bytes(r.stored_bytes, s, sizeof(s));
		human_bytes(r.unique_bytes, u, sizeof(u));
		human_bytes(r.redundant_bytes, w, sizeof(w));
		printf("# stored %llu tensors, %llu bytes (%s); unique %llu bytes (%s); redundant %llu bytes (%s)\n",
		       (unsigned long long)r.stored_tensors, (unsigned long long)r.stored_bytes, s,
		       (unsigned long long)r.unique_bytes, u, (unsigned long long)r.redundant_bytes, w);
	}
	for (size_t i = 0; i < r.npairs; i++)
		printf("pair\t%s\t%s\t%llu\t%llu\n", r.pairs[i].a, r.pairs[i].b,
		       (unsigned long long)r.pairs[i].ntensors, (unsigned long long)r.pairs[i].nbytes);
	for (size_t i = 0; i < r.n; i++) {
		printf("dup\t%s\t%llu\t%zu\n", r.dups[i].digest, (unsigned long long)r.dups[i].nbytes,
		       r.dups[i].nplaces);
		for (size_t p = 0; p < r.dups[i].nplaces; p++) {
			const struct ms_inv_dup_place *pl = &r.dups[i].places[p];

			printf("\t%s\t%s\t", pl->path, pl->tensor);
			for (size_t s = 0; s < pl->nstates; s++)
				printf("%s%s", s ? "," : "", pl->states[s]);
			putchar('\n');
		}
	}
	ms_inv_dup_release(&r);
	return CLI_OK;
}

/* ---- log ------------------------------------------------------------------------------- */

static int log_print(const struct ms_inv_log_entry *e, void *ctx)
{
	cJSON *a = ctx;

	if (a) {
		cJSON *o = cJSON_CreateObject();

		cJSON_AddNumberToObject(o, "seq", (double)e->seq);
		cJSON_AddStringToObject(o, "at", e->at);
		cJSON_AddStringToObject(o, "user", e->user);
		cJSON_AddStringToObject(o, "host", e->host);
		cJSON_AddStringToObject(o, "tool", e->tool);
		cJSON_AddRawToObject(o, "argv", e->argv);
		if (e->cwd)
			cJSON_AddStringToObject(o, "cwd", e->cwd);
		else
			cJSON_AddNullToObject(o, "cwd");
		cJSON_AddStringToObject(o, "action", e->action);
		cJSON_AddStringToObject(o, "subject", e->subject);
		cJSON_AddRawToObject(o, "detail", e->detail);
		cJSON_AddStringToObject(o, "prev_hash", e->prev_hash);
		cJSON_AddStringToObject(o, "hash", e->hash);
		cJSON_AddItemToArray(a, o);
		return 0;
	}
	printf("%lld\t%s\t%s@%s\t", (long long)e->seq, e->at, e->user, e->host);
	/* MS_ENOMEM ends the walk; cmd_log reports it */
	if (print_argv(e->argv) != MS_OK)
		return MS_ENOMEM;
	printf("\t%s\t%s\t%s\n", e->action, e->subject, e->detail);
	return 0;
}

static int cmd_log(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"check", no_argument, NULL, 'c'},
		{"json", no_argument, NULL, 'J'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};
	int c, rc, json = 0, check = 0;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'c': check = 1; break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc)
		return cli_usage("unexpected argument '%s'", argv[optind]);
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	if (check) {
		int64_t n = 0;
		char head[65] = "";

		rc = ms_inv_log_check(inv, &n, head, &err);
		ms_inv_close(inv);
		if (json) {
			cJSON *o = cJSON_CreateObject();

			cJSON_AddBoolToObject(o, "ok", rc == MS_OK);
			if (rc == MS_OK) {
				cJSON_AddNumberToObject(o, "entries", (double)n);
				cJSON_AddStringToObject(o, "head", head);
			} else {
				cJSON_AddStringToObject(o, "error", err.msg);
			}
			if (rc == MS_OK || rc == MS_ECHECK) {
				int prc = print_json(o);

				if (rc == MS_OK)
					return prc;
			} else {
				cJSON_Delete(o);
			}
		} else if (rc == MS_OK) {
			printf("log: %lld entries, chain intact, head %s\n", (long long)n, head);
		}
		return cli_fail(rc, &err);
	}
	if (json) {
		cJSON *a = cJSON_CreateArray();

		rc = ms_inv_log_each(inv, log_print, a, &err);
		ms_inv_close(inv);
		if (rc != MS_OK) {
			cJSON_Delete(a);
			return cli_fail(rc, &err);
		}
		return print_json(a);
	}
	rc = ms_inv_log_each(inv, log_print, NULL, &err);
	ms_inv_close(inv);
	return cli_fail(rc, &err);
}

/* ---- label ------------------------------------------------------------------------------ */

/* Labels are names for states: "label STATE LABEL" adds one (a state may
 * have several), --rename OLD NEW gives OLD's state NEW and forgets OLD in
 * one transaction, --delete LABEL forgets one. --force moves a label that
 * names another state. Each change is in the audit log. */
static int cmd_label(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"force", no_argument, NULL, 'f'},
		{"rename", no_argument, NULL, 'r'},
		{"delete", no_argument, NULL, 'd'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};
	char digest[MS_STATE_DIGEST_LEN];
	int c, rc, force = 0, rename = 0, del = 0;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'f': force = 1; break;
		case 'r': rename = 1; break;
		case 'd': del = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (rename && del)
		return cli_usage("--rename and --delete exclude each other");
	if (del && force)
		return cli_usage("--force moves a label; --delete forgets one");
	if (del ? optind != argc - 1 : optind != argc - 2)
		return cli_usage(del ? "--delete takes one LABEL" :
				 rename ? "--rename takes OLD and NEW" : "missing STATE or LABEL");
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	if (del) {
		rc = ms_inv_label_remove(inv, argv[optind], &err);
		if (rc == MS_OK)
			printf("unlabelled %s\n", argv[optind]);
		ms_inv_close(inv);
		return cli_fail(rc, &err);
	}
	rc = ms_inv_resolve(inv, argv[optind], digest, &err);
	if (rc == MS_OK && rename)
		rc = ms_inv_batch_begin(inv, &err);
	if (rc == MS_OK)
		rc = ms_inv_label_add(inv, digest, argv[optind + 1], force, &err);
	/* the old name must be a label (not a digest or a path) */
	if (rc == MS_OK && rename)
		rc = ms_inv_label_remove(inv, argv[optind], &err);
	if (rename) {
		struct ms_err e2 = {0};
		int rc2 = ms_inv_batch_end(inv, rc == MS_OK, &e2);

		if (rc == MS_OK && rc2 != MS_OK) {
			rc = rc2;
			err = e2;
		}
	}
	if (rc == MS_OK)
		printf("labelled %s %s\n", digest, argv[optind + 1]);
	ms_inv_close(inv);
	return cli_fail(rc, &err);
}

/* ---- rm, gc ------------------------------------------------------------------------------ */

static int cmd_rm(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"force", no_argument, NULL, 'f'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};
	char digest[MS_STATE_DIGEST_LEN];
	int c, rc, force = 0;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'f': force = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc - 1)
		return cli_usage(optind >= argc ? "missing STATE" : "one STATE only");
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	rc = ms_inv_resolve(inv, argv[optind], digest, &err);
	if (rc == MS_OK)
		rc = ms_inv_rm(inv, digest, force, &err);
	ms_inv_close(inv);
	if (rc != MS_OK)
		return cli_fail(rc, &err);
	printf("removed %s\n", digest);
	return CLI_OK;
}

struct gc_out {
	int dry_run;
};

static void gc_print(enum ms_inv_gc_what what, const char *path, void *ctx)
{
	const struct gc_out *g = ctx;

	if (what == MS_INV_GC_TEMP_FILE)
		printf("%s temporary %s\n", g->dry_run ? "would remove" : "removed", path);
	else
		printf("%s file record %s\n", g->dry_run ? "would forget" : "forgot", path);
}

static int cmd_gc(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"dry-run", no_argument, NULL, 'n'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};
	struct gc_out g = {0};
	uint64_t n = 0;
	int c, rc;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'n': g.dry_run = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	rc = ms_inv_gc(inv, (const char *const *)argv + optind, (size_t)(argc - optind), g.dry_run,
		       gc_print, &g, &n, &err);
	ms_inv_close(inv);
	if (rc != MS_OK)
		return cli_fail(rc, &err);
	printf("%s %llu item%s\n", g.dry_run ? "would remove" : "removed", (unsigned long long)n,
	       n == 1 ? "" : "s");
	return CLI_OK;
}

/* ---- footprint -------------------------------------------------------------------------- */

static int cmd_footprint(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"json", no_argument, NULL, 'J'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	struct ms_inv *inv = NULL;
	struct ms_fp_plan *plan = NULL;
	struct ms_fp_calc *calc = NULL;
	struct ms_fp_report *report = NULL;
	struct ms_err err = {0};
	struct ms_buf out;
	int c, rc, json = 0, status;

	ms_buf_init(&out);
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc - 1)
		return cli_usage(optind >= argc ? "missing PLAN" : "one PLAN only");
	if ((rc = ms_fp_plan_load(argv[optind], &plan, &err)) != MS_OK)
		return cli_fail(rc, &err);
	status = CLI_OK;
	rc = ms_fp_calc_new(plan, &calc, &err);
	for (size_t i = 0; rc == MS_OK && i < plan->nentries; i++) {
		const struct ms_fp_entry *e = &plan->entries[i];

		if (!e->state) {
			rc = ms_fp_calc_add_path(calc, i, &err);
			continue;
		}
		/* the inventory is needed only for state entries: a what-if plan
		 * of paths runs without one */
		if (!inv && (status = open_inv(db, 0, &inv)) != CLI_OK)
			goto out;
		if ((rc = ms_fp_calc_add_state(calc, i, inv, e->state, &err)) != MS_OK)
			ms_err_prefix(&err, "plan '%s': role '%s'", plan->label, e->role);
	}
	if (rc == MS_OK)
		rc = ms_fp_calc_finish(calc, &report, &err);
	if (rc == MS_OK && plan->train.present)
		rc = ms_fp_report_add_trainer(inv, report, argv[optind], &err);
	if (rc == MS_OK)
		rc = json ? ms_fp_report_json(report, &out, &err) : ms_fp_report_text(report, &out, &err);
	if (rc != MS_OK) {
		status = cli_fail(rc, &err);
		goto out;
	}
	fwrite(out.data, 1, out.len, stdout);
	if (out.len && out.data[out.len - 1] != '\n')
		putchar('\n');
	status = report->over_budget ? CLI_CHECK : CLI_OK;
out:
	ms_buf_release(&out);
	ms_fp_report_free(report);
	ms_fp_calc_free(calc);
	ms_fp_plan_free(plan);
	ms_inv_close(inv);
	return status;
}

/* ---- export / import ------------------------------------------------------------ */

static int cmd_export(int argc, char **argv)
{
	static const struct option opts[] = {
		{"output", required_argument, NULL, 'o'},
		{"force", no_argument, NULL, 'f'},
		{"jobs", required_argument, NULL, 'j'},
		{"db", required_argument, NULL, 'D'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *out = NULL, *db = NULL;
	int force = 0, jobs = 0, c, rc;
	struct ms_err err = {0};
	struct ms_inv *inv = NULL;
	struct cli_progress pr = {.what = "exporting (verify, then pack)"};
	char digest[MS_STATE_DIGEST_LEN];

	while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
		switch (c) {
		case 'o': out = optarg; break;
		case 'f': force = 1; break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &jobs))
				return CLI_USAGE;
			break;
		case 'D': db = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (!out)
		return cli_usage("missing -o FILE.tar.zst");
	if (optind + 1 != argc)
		return cli_usage(optind == argc ? "missing STATE" : "one STATE only");
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	cli_progress_inv(inv, &pr);
	cli_catch_interrupts();
	rc = ms_inv_resolve(inv, argv[optind], digest, &err);
	if (rc == MS_OK)
		rc = ms_bundle_export(inv, digest, out, force, jobs, &err);
	cli_progress_end(&pr);
	if (rc == MS_OK)
		printf("exported\t%s\t%s\n", digest, out);
	ms_inv_close(inv);
	return cli_fail(rc, &err);
}

static int cmd_import(int argc, char **argv)
{
	static const struct option opts[] = {
		{"label", required_argument, NULL, 'l'},
		{"force", no_argument, NULL, 'f'},
		{"jobs", required_argument, NULL, 'j'},
		{"max-bytes", required_argument, NULL, 'B'},
		{"max-ratio", required_argument, NULL, 'R'},
		{"dry-run", no_argument, NULL, 'n'},
		{"json", no_argument, NULL, 'J'},
		{"db", required_argument, NULL, 'D'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	struct cli_progress pr = {.what = "importing"};
	int dry = 0, json = 0, c, rc;
	struct ms_err err = {0};
	struct ms_bundle_import_opts o;
	struct ms_bundle_import_stats stats;
	struct ms_inv *inv = NULL;
	char digest[MS_STATE_DIGEST_LEN];

	ms_bundle_import_opts_init(&o);
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'l': o.label = optarg; break;
		case 'f': o.force = 1; break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &o.nthreads))
				return CLI_USAGE;
			break;
		case 'B':
			if (cli_u64("--max-bytes", optarg, UINT64_MAX, &o.max_total))
				return CLI_USAGE;
			break;
		case 'R':
			if (cli_u64("--max-ratio", optarg, 1u << 30, &o.max_ratio))
				return CLI_USAGE;
			break;
		case 'n': dry = 1; break;
		case 'J': json = 1; break;
		case 'D': db = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind + 2 != argc)
		return cli_usage("need FILE.tar.zst and DIR");
	if (dry) {
		struct ms_bundle_import_plan *p = NULL;

		if ((rc = ms_bundle_import_plan_read(argv[optind], &o, &p, &err)) != MS_OK)
			return cli_fail(rc, &err);
		if (json) {
			cJSON *j = cJSON_CreateObject(), *m;

			cJSON_AddStringToObject(j, "state", p->digest);
			if (p->kind)
				cJSON_AddStringToObject(j, "kind", p->kind);
			if (p->label)
				cJSON_AddStringToObject(j, "label", p->label);
			if (p->layout)
				cJSON_AddStringToObject(j, "layout", p->layout);
			cJSON_AddNumberToObject(j, "total_bytes", (double)p->total_bytes);
			m = cJSON_AddArrayToObject(j, "members");
			for (size_t i = 0; i < p->nmembers; i++) {
				cJSON *e = cJSON_CreateObject();
				char hex[65];

				cJSON_AddItemToArray(m, e);
				cJSON_AddStringToObject(e, "path", p->members[i].path);
				cJSON_AddNumberToObject(e, "size", (double)p->members[i].size);
				ms_hex(p->members[i].sha256, 32, hex);
				cJSON_AddStringToObject(e, "sha256", hex);
			}
			rc = print_json(j);
		} else {
			printf("state\t%s\t%s\t%s\t%llu bytes\n", p->digest, p->kind ? p->kind : "-",
			       p->label ? p->label : "-", (unsigned long long)p->total_bytes);
			for (size_t i = 0; i < p->nmembers; i++)
				printf("member\t%s\t%llu\n", p->members[i].path,
				       (unsigned long long)p->members[i].size);
			rc = CLI_OK;
		}
		ms_bundle_import_plan_free(p);
		return rc;
	}
	o.stats = &stats;
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	cli_progress_inv(inv, &pr);
	cli_catch_interrupts();
	rc = ms_bundle_import(inv, argv[optind], argv[optind + 1], &o, digest, &err);
	cli_progress_end(&pr);
	/* "adopted": DIR was already there, complete, from an earlier run of
	 * this import that stopped before registering it */
	if (rc == MS_OK)
		printf("%s\t%s\t%s\t%llu files, %llu bytes\n",
		       stats.adopted ? "adopted" : "imported", digest, argv[optind + 1],
		       (unsigned long long)stats.members, (unsigned long long)stats.bytes);
	ms_inv_close(inv);
	return cli_fail(rc, &err);
}

/* ---- launch ------------------------------------------------------------------ */

static volatile sig_atomic_t launch_child;

/* The launcher stands between the user and the command: signals meant for
 * the run go to the command, and the launcher stays to record its end. */
static void launch_forward(int sig)
{
	if (launch_child > 0)
		kill((pid_t)launch_child, sig);
}

static int cmd_launch(int argc, char **argv)
{
	static const struct option opts[] = {
		{"plan", required_argument, NULL, 'p'},
		{"dry-run", no_argument, NULL, 'n'},
		{"trust-recent", no_argument, NULL, 't'},
		{"jobs", required_argument, NULL, 'j'},
		{"db", required_argument, NULL, 'D'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	static const int fwd[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
	const char *plan = NULL, *db = NULL;
	unsigned flags = 0;
	int jobs = 0, c, rc, status;
	struct ms_err err = {0};
	struct ms_inv *inv = NULL;
	struct ms_gate *g = NULL;
	pid_t pid;

	/* "+": options end at the command, which has options of its own */
	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (c) {
		case 'p': plan = optarg; break;
		case 'n': flags |= MS_GATE_DRY_RUN; break;
		case 't': flags |= MS_GATE_TRUST_RECENT; break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &jobs))
				return CLI_USAGE;
			break;
		case 'D': db = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (!plan)
		return cli_usage("missing --plan PLAN");
	if (optind >= argc && !(flags & MS_GATE_DRY_RUN))
		return cli_usage("missing the command to run (after --)");
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	rc = ms_gate_check(inv, plan, flags, jobs, &g, &err);
	if (rc == MS_ECHECK) {
		if (g->run_id)
			cli_errorf("run %lld refused: %s", (long long)g->run_id, g->why);
		else
			cli_errorf("refused: %s", g->why);
		ms_gate_free(g);
		ms_inv_close(inv);
		return CLI_CHECK;
	}
	if (rc != MS_OK) {
		ms_inv_close(inv);
		return cli_fail(rc, &err);
	}
	for (size_t i = 0; i < g->ninputs; i++) {
		const struct ms_gate_input *in = &g->inputs[i];

		if (in->nshards)
			fprintf(stderr, "%s: %s %s verified as an EP=%d shard set of %zu shards in '%s' (%s)\n",
				cli_prog, in->role, in->digest, in->ep_size, in->nshards, in->path,
				in->label ? in->label : ms_inv_kind_name(in->kind));
		else
			fprintf(stderr, "%s: %s %s %s (%s)\n", cli_prog, in->role, in->digest,
				in->trusted ? "trusted: verified since its files last changed" : "verified",
				in->label ? in->label : ms_inv_kind_name(in->kind));
	}
	if (flags & MS_GATE_DRY_RUN) {
		fprintf(stderr, "%s: dry run: every state verified; nothing recorded, nothing run\n",
			cli_prog);
		ms_gate_free(g);
		ms_inv_close(inv);
		return CLI_OK;
	}
	fprintf(stderr, "%s: run %lld: starting %s\n", cli_prog, (long long)g->run_id, argv[optind]);
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		ms_err_set(&err, MS_EIO, "cannot fork: %s", strerror(errno));
		/* recorded with the status the launcher exits with */
		ms_gate_end(inv, g, ms_exit_code(MS_EIO), NULL);
		goto fail;
	}
	if (pid == 0) {
		for (size_t i = 0; i < g->nenv; i++)
			putenv(g->env[i]);
		execvp(argv[optind], argv + optind);
		fprintf(stderr, "%s: cannot run '%s': %s\n", cli_prog, argv[optind], strerror(errno));
		_exit(127);
	}
	launch_child = pid;
	for (size_t i = 0; i < sizeof(fwd) / sizeof(fwd[0]); i++) {
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = launch_forward;
		sigemptyset(&sa.sa_mask);
		sa.sa_flags = SA_RESTART;
		sigaction(fwd[i], &sa, NULL);
	}
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR) {
			ms_err_set(&err, MS_EIO, "waitpid: %s", strerror(errno));
			goto fail;
		}
	}
	launch_child = 0;
	rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	if (ms_gate_end(inv, g, rc, &err) != MS_OK)
		cli_errorf("run %lld: cannot record the end: %s", (long long)g->run_id, err.msg);
	if (rc)
		cli_errorf("run %lld: command exited with status %d", (long long)g->run_id, rc);
	ms_gate_free(g);
	ms_inv_close(inv);
	return rc;
fail:
	ms_gate_free(g);
	ms_inv_close(inv);
	return cli_fail(MS_EIO, &err);
}

/* ---- export-manifest ------------------------------------------------------ */

#define MANIFEST_PAYLOAD_TYPE "application/vnd.msinv.manifest.v1+json"

static int cmd_export_manifest(int argc, char **argv)
{
	static const struct option opts[] = {
		{"output", required_argument, NULL, 'o'},
		{"sign", required_argument, NULL, 's'},
		{"force", no_argument, NULL, 'f'},
		{"db", required_argument, NULL, 'D'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *out = NULL, *key = NULL, *db = NULL;
	int force = 0, c, rc;
	struct ms_err err = {0};
	struct ms_inv *inv = NULL;
	struct ms_vstate *vs = NULL;
	struct ms_key *k = NULL;
	char digest[MS_STATE_DIGEST_LEN], *root = NULL, *json = NULL, *sig = NULL, *sigpath = NULL;
	size_t siglen;

	while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
		switch (c) {
		case 'o': out = optarg; break;
		case 's': key = optarg; break;
		case 'f': force = 1; break;
		case 'D': db = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (!out)
		return cli_usage("missing -o M.json");
	if (optind + 1 != argc)
		return cli_usage(optind == argc ? "missing STATE" : "one STATE only");
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	if ((rc = ms_inv_resolve(inv, argv[optind], digest, &err)) != MS_OK ||
	    (rc = ms_vstate_from_inv(inv, digest, 0, &vs, &err)) != MS_OK)
		goto out;
	/* paths in the manifest are relative to the state's directory */
	root = ms_vstate_location(vs);
	if (!root) {
		rc = ms_err_set(&err, MS_ENOMEM, "out of memory");
		goto out;
	}
	if (vs->nfiles == 1 && !strcmp(root, vs->files[0].path)) {
		char *slash = strrchr(root, '/');

		if (slash)
			*slash = 0;
	}
	if ((rc = ms_manifest_write(vs, root, &json, &err)) != MS_OK)
		goto out;
	if (key) {
		if ((rc = ms_key_load_private(key, &k, &err)) != MS_OK ||
		    (rc = ms_sigstore_sign(json, strlen(json), MANIFEST_PAYLOAD_TYPE, k, &sig, &siglen,
					 &err)) != MS_OK)
			goto out;
		if (!(sigpath = ms_asprintf("%s.sig", out))) {
			rc = ms_err_set(&err, MS_ENOMEM, "out of memory");
			goto out;
		}
		if ((rc = ms_file_write_atomic(sigpath, sig, siglen, force, &err)) != MS_OK)
			goto out;
	}
	if ((rc = ms_file_write_atomic(out, json, strlen(json), force, &err)) != MS_OK)
		goto out;
	printf("%s\t%s%s%s\n", digest, out, sigpath ? "\t" : "", sigpath ? sigpath : "");
out:
	ms_key_free(k);
	ms_free(sig);
	ms_free(sigpath);
	ms_free(json);
	ms_free(root);
	ms_vstate_free(vs);
	ms_inv_close(inv);
	return cli_fail(rc, &err);
}

/* One run: its record, its events, and the RL collapse monitor's events
 * spelt out (which rule, at which step, on which numbers). */
static int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		DB_OPTION,
		{"json", no_argument, NULL, 'J'},
		HELP_OPTION,
		{NULL, 0, NULL, 0},
	};
	const char *db = NULL;
	struct ms_inv *inv = NULL;
	struct ms_inv_run *r = NULL;
	struct ms_inv_event *ev = NULL;
	struct ms_err err = {0};
	size_t nev = 0, ncol = 0;
	uint64_t id;
	int c, rc, json = 0;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'D': db = optarg; break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind + 1 != argc)
		return cli_usage(optind == argc ? "a run number is required"
				 : "unexpected argument '%s'", argv[optind + 1]);
	if (cli_u64("RUN", argv[optind], INT64_MAX, &id))
		return CLI_USAGE;
	if ((rc = open_inv(db, 0, &inv)) != CLI_OK)
		return rc;
	if ((rc = ms_inv_run_get(inv, (int64_t)id, &r, &err)) != MS_OK ||
	    (rc = ms_inv_run_events(inv, (int64_t)id, &ev, &nev, &err)) != MS_OK)
		goto out;
	if (json) {
		cJSON *o = cJSON_CreateObject(), *a = cJSON_CreateArray();

		cJSON_AddNumberToObject(o, "run", (double)r->id);
		cJSON_AddStringToObject(o, "plan", r->plan_digest ? r->plan_digest : "");
		cJSON_AddStringToObject(o, "status", r->status ? r->status : "");
		if (r->has_exit_code)
			cJSON_AddNumberToObject(o, "exit_code", r->exit_code);
		else
			cJSON_AddNullToObject(o, "exit_code");
		cJSON_AddStringToObject(o, "started_at", r->started_at ? r->started_at : "");
		if (r->ended_at)
			cJSON_AddStringToObject(o, "ended_at", r->ended_at);
		else
			cJSON_AddNullToObject(o, "ended_at");
		for (size_t i = 0; i < nev; i++) {
			cJSON *e = cJSON_CreateObject(), *d = cJSON_Parse(ev[i].data);

			cJSON_AddNumberToObject(e, "id", (double)ev[i].id);
			cJSON_AddStringToObject(e, "at", ev[i].at ? ev[i].at : "");
			cJSON_AddStringToObject(e, "kind", ev[i].kind ? ev[i].kind : "");
			if (d)
				cJSON_AddItemToObject(e, "data", d);
			else
				cJSON_AddNullToObject(e, "data");
			cJSON_AddItemToArray(a, e);
		}
		cJSON_AddItemToObject(o, "events", a);
		rc = print_json(o);
		goto done;
	}
	printf("run      %lld\n", (long long)r->id);
	printf("plan     %s\n", r->plan_digest ? r->plan_digest : "");
	if (r->has_exit_code)
		printf("status   %s (exit %d)\n", r->status ? r->status : "", r->exit_code);
	else
		printf("status   %s\n", r->status ? r->status : "");
	printf("started  %s\n", r->started_at ? r->started_at : "");
	if (r->ended_at)
		printf("ended    %s\n", r->ended_at);
	if (r->user || r->host)
		printf("by       %s@%s\n", r->user ? r->user : "?", r->host ? r->host : "?");
	printf("events   %zu\n", nev);
	for (size_t i = 0; i < nev; i++)
		printf("  %s  %s  %s\n", ev[i].at ? ev[i].at : "", ev[i].kind ? ev[i].kind : "",
		       ev[i].data ? ev[i].data : "");
	for (size_t i = 0; i < nev; i++) {
		cJSON *d;
		const cJSON *ru, *st, *va, *th, *wi;

		if (!ev[i].kind || strcmp(ev[i].kind, "rl_collapse") || !ev[i].data ||
		    !(d = cJSON_Parse(ev[i].data)))
			continue;
		ru = cJSON_GetObjectItemCaseSensitive(d, "rule");
		st = cJSON_GetObjectItemCaseSensitive(d, "step");
		va = cJSON_GetObjectItemCaseSensitive(d, "value");
		th = cJSON_GetObjectItemCaseSensitive(d, "threshold");
		wi = cJSON_GetObjectItemCaseSensitive(d, "window");
		if (cJSON_IsString(ru) && cJSON_IsNumber(st) && cJSON_IsNumber(va) &&
		    cJSON_IsNumber(th) && cJSON_IsNumber(wi)) {
			if (!ncol++)
				printf("collapse (the RL monitor's rules that fired)\n");
			printf("  %-10s step %.0f: %.6g against %.6g for %.0f steps\n",
			       ru->valuestring, st->valuedouble, va->valuedouble, th->valuedouble,
			       wi->valuedouble);
		}
		cJSON_Delete(d);
	}
	rc = MS_OK;
out:
	rc = cli_fail(rc, &err);
done:
	ms_inv_events_free(ev, nev);
	ms_inv_runs_free(r, r ? 1 : 0);
	ms_inv_close(inv);
	return rc;
}

static const struct cli_cmd cmds[] = {
	{"inspect", cmd_inspect, "inspect [--digests] [--file-digests] [--jobs N] [--json] PATH...",
	 "print the tensors of safetensors files, checkpoints and adapters",
	 "--digests\talso hash every tensor and header, and print the state digest\n"
	 "--file-digests\talso the whole-file SHA-256 of every file\n"
	 "--jobs N\thashing threads (default: one per CPU)\n"},
	{"init", cmd_init, "init [--db PATH]", "create the inventory database (or upgrade its schema)",
	 NULL},
	{"add", cmd_add,
	 "add [--db PATH] [--kind KIND] [--label LABEL] [--parent STATE]... [--op OPERATION] "
	 "[--params JSON] [--ep-size N --ep-rank R] [--jobs N] [--rehash] [--file-digests] "
	 "[--json] PATH...",
	 "hash files, checkpoints or adapters and register them as a state",
	 "--kind KIND\tbase, quantized, adapter, adapter_shard or policy (default: what the files say)\n"
	 "--label LABEL\ta name for the state (a state may have several)\n"
	 "--parent STATE\tthe state it was made from (repeatable; needs --op)\n"
	 "--op OPERATION\tquantize, dequantize, transpose, split, reshard, merge, train or compose\n"
	 "--params JSON\tthe operation's parameters, a JSON object\n"
	 "--ep-size N\tthe EP size of an adapter shard (with --ep-rank)\n"
	 "--ep-rank R\tthe EP rank of an adapter shard (with --ep-size)\n"
	 "--jobs N\thashing threads (default: one per CPU)\n"
	 "--rehash\thash every file, even those recorded unchanged\n"
	 "--file-digests\talso record the whole-file SHA-256 of every file\n"},
	{"ls", cmd_ls, "ls [--db PATH] [--kind KIND] [--json]", "list the recorded states",
	 "--kind KIND\tlist one kind only\n"},
	{"show", cmd_show, "show [--db PATH] [--tensors] [--json] STATE",
	 "everything recorded about a state",
	 "--tensors\talso every tensor of every file\n"},
	{"lineage", cmd_lineage, "lineage [--db PATH] [--dot | --json] STATE",
	 "the states a state was derived from and those derived from it",
	 "--dot\tprint the graph in Graphviz dot\n"},
	{"dup", cmd_dup, "dup [--db PATH] [--json]", "bytes stored more than once across states",
	 NULL},
	{"run", cmd_run, "run [--db PATH] [--json] RUN",
	 "a run: its record, its events and the RL monitor's collapse events", NULL},
	{"log", cmd_log, "log [--db PATH] [--check] [--json]",
	 "the audit log of every change, and its chain check",
	 "--check\twalk the hash chain instead; exit 1 if an entry was edited, removed or reordered\n"},
	{"rm", cmd_rm, "rm [--db PATH] [--force] STATE", "forget a state",
	 "--force\talso when states were derived from it (their edges go)\n"},
	{"label", cmd_label,
	 "label [--db PATH] [--force] STATE LABEL | --rename OLD NEW | --delete LABEL",
	 "give a state another label, rename a label, or forget one",
	 "--force\tmove LABEL when it names another state\n"
	 "--rename OLD NEW\tgive the state labelled OLD the label NEW and forget OLD\n"
	 "--delete LABEL\tforget a label\n"},
	{"gc", cmd_gc, "gc [--db PATH] [--dry-run] [DIR...]",
	 "remove temporaries of interrupted writes and unused file records",
	 "--dry-run\tprint what would be removed\n"},
	{"footprint", cmd_footprint, "footprint [--db PATH] [--json] PLAN",
	 "the per-GPU memory of a run plan, by state and layout",
	 NULL},
	{"export", cmd_export, "export [--db PATH] [--force] [--jobs N] -o FILE.tar.zst STATE",
	 "a state as one .tar.zst bundle",
	 "--force\treplace an existing FILE.tar.zst\n"
	 "--jobs N\thashing and compression threads (default: one per CPU)\n"
	 "-o FILE.tar.zst\tthe bundle to write\n"},
	{"import", cmd_import,
	 "import [--db PATH] [--label LABEL] [--force] [--jobs N] [--max-bytes N] [--max-ratio N] "
	 "[--dry-run] [--json] FILE.tar.zst DIR",
	 "verify a bundle and register the state it holds",
	 "--label LABEL\tthe label of the imported state (default: the bundle's)\n"
	 "--force\treplace DIR when it holds a previous import or is empty\n"
	 "--jobs N\thashing threads (default: one per CPU)\n"
	 "--max-bytes N\trefuse a bundle declaring more bytes (default 1 TiB)\n"
	 "--max-ratio N\trefuse more tar bytes per archive byte (default 1000)\n"
	 "--dry-run\tcheck the manifest and print what would be extracted\n"},
	{"launch", cmd_launch,
	 "launch [--db PATH] [--dry-run] [--jobs N] [--trust-recent] --plan PLAN -- CMD [ARG...]",
	 "verify every state of a plan, record the run, then run CMD",
	 "--dry-run\tverify and print the environment; run nothing, record nothing\n"
	 "--jobs N\thashing threads (default: one per CPU)\n"
	 "--trust-recent\ttrust a verification newer than the files instead of re-hashing\n"
	 "--plan PLAN\tthe run plan: the states, their roles and the EP size\n"},
	{"export-manifest", cmd_export_manifest,
	 "export-manifest [--db PATH] [--force] [--sign KEY.pem] -o M.json STATE",
	 "a state's files, tensors and digests as one JSON, optionally signed",
	 "--force\treplace an existing M.json\n"
	 "--sign KEY.pem\talso sign it (M.json.sig, OpenSSF Model Signing)\n"
	 "-o M.json\tthe manifest to write\n"},
};

int main(int argc, char **argv)
{
	static const struct cli_tool tool = {
		"msinv", "The inventory of model weight states.", cmds,
		sizeof(cmds) / sizeof(cmds[0]),
	};

	g_argc = argc;
	g_argv = argv;
	return cli_main(&tool, argc, argv);
}
