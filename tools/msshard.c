/*
 * msshard: expert-parallel sharding of LoRA adapters and checkpoints:
 * plan, split, merge, reshard. This file parses arguments, calls libms
 * (src/shard.h) and prints; the logic and every check live in the library.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

/* "0-3" for a run, "0,2,4" otherwise; ids in local order. */
static void print_ids(FILE *f, const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n;) {
		uint32_t j = i;

		while (j + 1 < n && ids[j + 1] == ids[j] + 1)
			j++;
		fprintf(f, "%s", i ? "," : "");
		if (j >= i + 2)
			fprintf(f, "%u-%u", ids[i], ids[j]);
		else if (j == i + 1)
			fprintf(f, "%u,%u", ids[i], ids[j]);
		else
			fprintf(f, "%u", ids[i]);
		i = j + 1;
	}
	if (!n)
		fprintf(f, "none");
}

static cJSON *ids_json(const uint32_t *ids, uint32_t n)
{
	cJSON *a = cJSON_CreateArray();

	for (uint32_t i = 0; a && i < n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
	return a;
}

static cJSON *placement_json(const struct ms_ep_placement *p)
{
	cJSON *o = cJSON_CreateObject(), *a;

	if (!o)
		return NULL;
	cJSON_AddStringToObject(o, "name", ms_ep_placement_name(p->kind));
	a = cJSON_AddArrayToObject(o, "ranks");
	for (uint32_t r = 0; a && r < p->ep_size; r++)
		cJSON_AddItemToArray(a, ids_json(p->ids + p->first[r], p->first[r + 1] - p->first[r]));
	return o;
}

static int print_json(cJSON *root)
{
	char *text = root ? cJSON_Print(root) : NULL;

	cJSON_Delete(root);
	if (!text) {
		cli_errorf("out of memory");
		return CLI_IO;
	}
	printf("%s\n", text);
	cJSON_free(text);
	return CLI_OK;
}

static void progress(void *ctx, const char *path, size_t done, size_t total)
{
	(void)ctx;
	fprintf(stderr, "\r%s: wrote %zu/%zu: %s\033[K", cli_prog, done, total, ms_path_base(path));
	if (done == total)
		fputc('\n', stderr);
}

/* ---- plan ------------------------------------------------------------------ */

static int cmd_plan(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "experts", required_argument, NULL, 'e' },
		{ "ep-size", required_argument, NULL, 'n' },
		{ "placement", required_argument, NULL, 'p' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct ms_ep_placement *p = NULL;
	struct ms_err err = { 0 };
	const char *placement = NULL;
	uint64_t e = 0, n = 0;
	int c, json = 0, rc;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'e':
			if (cli_u64("--experts", optarg, MS_EP_MAX_EXPERTS, &e))
				return CLI_USAGE;
			break;
		case 'n':
			if (cli_u64("--ep-size", optarg, MS_EP_MAX_RANKS, &n))
				return CLI_USAGE;
			break;
		case 'p':
			placement = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			return cli_help();
		default:
			return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc)
		return cli_usage("unexpected argument '%s'", argv[optind]);
	if (!e || !n)
		return cli_usage("--experts and --ep-size are required and must be at least 1");
	if ((rc = ms_ep_placement_new(placement, (uint32_t)e, (uint32_t)n, &p, &err)) != MS_OK)
		return cli_fail(rc, &err);
	if (json) {
		cJSON *root = cJSON_CreateObject();

		if (root) {
			cJSON_AddNumberToObject(root, "num_experts", p->num_experts);
			cJSON_AddNumberToObject(root, "ep_size", p->ep_size);
			cJSON_AddItemToObject(root, "placement", placement_json(p));
		}
		rc = print_json(root);
	} else {
		printf("placement %s: %u experts on %u ranks\n", ms_ep_placement_name(p->kind),
		       p->num_experts, p->ep_size);
		for (uint32_t r = 0; r < p->ep_size; r++) {
			printf("rank %u:", r);
			for (uint32_t i = p->first[r]; i < p->first[r + 1]; i++)
				printf(" %u", p->ids[i]);
			printf("\n");
		}
		rc = CLI_OK;
	}
	ms_ep_placement_free(p);
	return rc;
}

/* ---- split, merge, reshard --------------------------------------------------- */

static void print_result(const char *op, const struct ms_shard_result *r, int dry_run,
			 int json)
{
	if (json) {
		cJSON *root = cJSON_CreateObject(), *files;

		if (!root) {
			print_json(NULL);
			return;
		}
		cJSON_AddStringToObject(root, "operation", op);
		cJSON_AddBoolToObject(root, "dry_run", dry_run);
		cJSON_AddStringToObject(root, "kind", r->is_adapter ? "adapter" : "checkpoint");
		if (r->source_digest[0])
			cJSON_AddStringToObject(root, "source_digest", r->source_digest);
		cJSON_AddNumberToObject(root, "num_experts", r->num_experts);
		cJSON_AddNumberToObject(root, "ep_size", r->ep_size);
		cJSON_AddItemToObject(root, "placement", placement_json(r->placement));
		cJSON_AddStringToObject(root, "packing", r->packing);
		if (r->r)
			cJSON_AddNumberToObject(root, "r", r->r);
		cJSON_AddNumberToObject(root, "replicated_tensors", (double)r->nreplicated);
		cJSON_AddNumberToObject(root, "routed_tensors", (double)r->nrouted);
		if (r->manifest_path)
			cJSON_AddStringToObject(root, "manifest", r->manifest_path);
		files = cJSON_AddArrayToObject(root, "files");
		for (size_t i = 0; files && i < r->nfiles; i++) {
			const struct ms_shard_out_file *f = &r->files[i];
			cJSON *o = cJSON_CreateObject();

			if (!o)
				break;
			cJSON_AddItemToArray(files, o);
			cJSON_AddStringToObject(o, "path", f->path);
			if (f->rank != UINT32_MAX) {
				cJSON_AddNumberToObject(o, "rank", f->rank);
				cJSON_AddItemToObject(o, "experts", ids_json(f->experts, f->nexperts));
			}
			cJSON_AddNumberToObject(o, "tensors", (double)f->ntensors);
			cJSON_AddNumberToObject(o, "bytes", (double)f->nbytes);
			if (f->state_digest[0])
				cJSON_AddStringToObject(o, "state_digest", f->state_digest);
		}
		print_json(root);
		return;
	}
	printf("%s%s: %s, %u experts, packing %s", dry_run ? "would " : "", op,
	       r->is_adapter ? "adapter" : "checkpoint", r->num_experts, r->packing);
	if (r->r)
		printf(", r=%u", r->r);
	printf(", %llu replicated and %llu routed tensors\n", (unsigned long long)r->nreplicated,
	       (unsigned long long)r->nrouted);
	if (r->source_digest[0])
		printf("source %s\n", r->source_digest);
	if (strcmp(op, "merge"))
		printf("placement %s on %u ranks\n", ms_ep_placement_name(r->placement->kind),
		       r->ep_size);
	for (size_t i = 0; i < r->nfiles; i++) {
		const struct ms_shard_out_file *f = &r->files[i];

		if (f->rank != UINT32_MAX) {
			printf("rank %u: experts ", f->rank);
			print_ids(stdout, f->experts, f->nexperts);
			printf("; ");
		}
		printf("%llu tensors, %llu bytes", (unsigned long long)f->ntensors,
		       (unsigned long long)f->nbytes);
		if (f->state_digest[0])
			printf(", %s", f->state_digest);
		printf(": %s\n", f->path);
	}
	if (r->manifest_path && !dry_run)
		printf("manifest %s\n", r->manifest_path);
}

/* ---- registration ---------------------------------------------------------- */

/* --db PATH, else $MSINV_DB: outputs are registered there unless
 * --no-register (see msshard(1)). */
static const char *reg_db;
static int reg_off;
/* --label: the merged state gets LABEL, EP rank R's shard "LABEL/rankR" */
static const char *reg_label;
static int g_argc;
static char **g_argv;

static int reg_wanted(void)
{
	const char *e = getenv("MSINV_DB");

	return !reg_off && (reg_db || (e && *e));
}


struct reg_ctx {
	struct ms_inv *inv;
	enum ms_shard_op op;
	const char *input;
	int check_base;  /* split without --base: the source's ancestors */
};

/* The library's publish step: the output is in place; record it and
 * commit, or fail and the library takes the output away again. The
 * batch was begun before the operation, so files in place and states
 * registered are one step. */
static int reg_publish(void *ctx, const struct ms_shard_result *r, struct ms_err *err)
{
	const struct reg_ctx *c = ctx;
	int rc = MS_OK;

	/* an adapter recorded as derived from a base: its expert count must be
	 * the base's (a wrong r in adapter_config.json splits 16 experts into
	 * "12" with every shape consistent) */
	if (c->check_base && r->is_adapter) {
		uint32_t be = 0;
		char *bl = NULL;

		int fused = strstr(r->packing, "fused") != NULL;
		char at[48] = "";

		if (fused)
			snprintf(at, sizeof(at), " at r=%u (adapter_config.json)", r->r);
		rc = ms_ep_base_experts(c->inv, NULL, r->source_digest, &be, &bl, err);
		if (rc == MS_OK && be && be != r->num_experts)
			rc = ms_err_set(err, MS_EINVAL, "'%s': %u experts%s, but the base '%s' (an "
					"ancestor in the inventory) has %u%s", c->input, r->num_experts, at,
					bl, be, fused ? ": \"r\" does not fit the fused LoRA's shapes" : "");
		ms_free(bl);
	}
	if (rc == MS_OK)
		rc = ms_shard_register(c->inv, c->op, c->input, r, reg_label, err);
	if (rc == MS_OK)
		return ms_inv_batch_end(c->inv, 1, err);
	(void)ms_inv_batch_end(c->inv, 0, NULL);
	return rc;
}

static int run_op(enum ms_shard_op op, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "output", required_argument, NULL, 'o' },
		{ "ep-size", required_argument, NULL, 'n' },
		{ "placement", required_argument, NULL, 'p' },
		{ "experts", required_argument, NULL, 'e' },
		{ "base", required_argument, NULL, 'B' },
		{ "dry-run", no_argument, NULL, 'd' },
		{ "force", no_argument, NULL, 'f' },
		{ "json", no_argument, NULL, 'j' },
		{ "db", required_argument, NULL, 'D' },
		{ "no-register", no_argument, NULL, 'R' },
		{ "label", required_argument, NULL, 'L' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static const char *const names[] = { "split", "merge", "reshard" };
	struct ms_shard_opts o;
	struct ms_shard_result *res = NULL;
	struct ms_err err = { 0 };
	const char *outdir = NULL;
	struct ms_inv *inv = NULL;
	struct reg_ctx reg;
	uint64_t v;
	int c, json = 0, rc;
	const char *base = NULL;
	char *blabel = NULL;

	memset(&o, 0, sizeof(o));
	while ((c = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
		switch (c) {
		case 'o':
			outdir = optarg;
			break;
		case 'n':
			if (op == MS_SHARD_OP_MERGE)
				return cli_usage("unknown option '%s'", argv[optind - 1]);
			if (cli_u64("--ep-size", optarg, MS_EP_MAX_RANKS, &v))
				return CLI_USAGE;
			o.ep_size = (uint32_t)v;
			break;
		case 'p':
			if (op == MS_SHARD_OP_MERGE)
				return cli_usage("unknown option '%s'", argv[optind - 1]);
			o.placement = optarg;
			break;
		case 'e':
			if (op != MS_SHARD_OP_SPLIT)
				return cli_usage("unknown option '%s'", argv[optind - 1]);
			if (cli_u64("--experts", optarg, MS_EP_MAX_EXPERTS, &v))
				return CLI_USAGE;
			o.num_experts = (uint32_t)v;
			break;
		case 'B':
			if (op != MS_SHARD_OP_SPLIT)
				return cli_usage("unknown option '%s'", argv[optind - 1]);
			base = optarg;
			break;
		case 'd':
			if (op == MS_SHARD_OP_MERGE)
				return cli_usage("unknown option '%s'", argv[optind - 1]);
			o.dry_run = 1;
			break;
		case 'f':
			o.force = 1;
			break;
		case 'j':
			json = 1;
			break;
		case 'D':
			reg_db = optarg;
			break;
		case 'R':
			reg_off = 1;
			break;
		case 'L':
			reg_label = optarg;
			break;
		case 'h':
			return cli_help();
		default:
			return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind + 1 != argc)
		return cli_usage(optind >= argc ? "missing input" : "unexpected argument '%s'",
				 optind >= argc ? "" : argv[optind + 1]);
	if (!outdir)
		return cli_usage("-o is required");
	if (op != MS_SHARD_OP_MERGE && o.ep_size == 0)
		return cli_usage("--ep-size is required and must be at least 1");
	if (reg_label && !o.dry_run && !reg_wanted())
		return cli_usage("--label names the registered output: it needs an inventory (--db or MSINV_DB)");
	if (reg_label) {
		/* refused before any work: the label, and the longest rank's */
		char longest[MS_INV_MAX_LABEL + 32];

		snprintf(longest, sizeof(longest), "%s/rank%u", reg_label,
			 o.ep_size ? o.ep_size - 1 : MS_EP_MAX_RANKS - 1);
		if ((rc = ms_inv_label_check(reg_label, &err)) != MS_OK ||
		    (op != MS_SHARD_OP_MERGE && (rc = ms_inv_label_check(longest, &err)) != MS_OK))
			return cli_fail(rc, &err);
	}
	if (cli_progress_enabled() && !o.dry_run)
		o.progress = progress;
	if (!o.dry_run)
		cli_catch_interrupts();
	/* open the inventory first: a missing one fails before any write */
	if (!o.dry_run && reg_wanted() &&
	    ((rc = ms_inv_open(cli_db_path(reg_db), 0, &inv, &err)) != MS_OK ||
	     (rc = ms_inv_set_origin(inv, "msshard", g_argc, g_argv, &err)) != MS_OK ||
	     (rc = ms_inv_batch_begin(inv, &err)) != MS_OK)) {
		ms_inv_close(inv);
		return cli_fail(rc, &err);
	}
	if (base) {
		/* a state reference needs the inventory, even with --no-register */
		struct ms_inv *binv = inv;
		const char *e = getenv("MSINV_DB");

		rc = MS_OK;
		if (!binv && access(base, F_OK) && (reg_db || (e && *e)))
			rc = ms_inv_open(cli_db_path(reg_db), 0, &binv, &err);
		if (rc == MS_OK)
			rc = ms_ep_base_experts(binv, base, NULL, &o.base_experts, &blabel, &err);
		if (binv != inv)
			ms_inv_close(binv);
		if (rc != MS_OK) {
			ms_inv_close(inv);
			return cli_fail(rc, &err);
		}
		o.base_label = blabel;
	}
	if (inv) {
		reg = (struct reg_ctx){ inv, op, op == MS_SHARD_OP_MERGE ? outdir : argv[optind],
					op == MS_SHARD_OP_SPLIT && !base };
		o.publish = reg_publish;
		o.publish_ctx = &reg;
	}
	if (op == MS_SHARD_OP_SPLIT)
		rc = ms_shard_split(argv[optind], outdir, &o, &res, &err);
	else if (op == MS_SHARD_OP_MERGE)
		rc = ms_shard_merge(argv[optind], outdir, &o, &res, &err);
	else
		rc = ms_shard_reshard(argv[optind], outdir, &o, &res, &err);
	/* a batch still open was not committed: nothing of it is recorded */
	if (inv)
		(void)ms_inv_batch_end(inv, 0, NULL);
	ms_inv_close(inv);
	ms_free(blabel);
	if (rc != MS_OK) {
		ms_shard_result_free(res);
		return cli_fail(rc, &err);
	}
	print_result(names[op], res, o.dry_run, json);
	ms_shard_result_free(res);
	return CLI_OK;
}

static int cmd_split(int argc, char **argv)
{
	return run_op(MS_SHARD_OP_SPLIT, argc, argv);
}

static int cmd_merge(int argc, char **argv)
{
	return run_op(MS_SHARD_OP_MERGE, argc, argv);
}

static int cmd_reshard(int argc, char **argv)
{
	return run_op(MS_SHARD_OP_RESHARD, argc, argv);
}

static const struct cli_cmd cmds[] = {
	{ "plan", cmd_plan, "plan --experts E --ep-size N [--placement P] [--json]",
	  "print the expert -> rank placement",
	  "--experts E\tthe number of experts\n"
	  "--ep-size N\tthe number of EP ranks\n"
	  "--placement P\tcontiguous (default), round-robin or a map.json\n" },
	{ "split", cmd_split,
	  "split ADAPTER_OR_CHECKPOINT -o DIR --ep-size N [--placement P] [--dry-run] [--force] "
	  "[--experts E] [--base PATH | STATE] [--json] [--label LABEL] [--db PATH | --no-register]",
	  "split an adapter or checkpoint into EP shards",
	  "-o DIR\tthe shard set to write\n"
	  "--ep-size N\tthe number of EP ranks\n"
	  "--placement P\tcontiguous (default), round-robin or a map.json\n"
	  "--dry-run\tprint the plan and write nothing\n"
	  "--force\treplace an existing DIR\n"
	  "--experts E\tthe number of experts, when the files do not say\n"
	  "--base PATH | STATE\tthe base whose expert count the adapter must have\n"
	  "--label LABEL\tlabel rank R's shard LABEL/rankR\n" },
	{ "merge", cmd_merge, "merge DIR -o OUT [--force] [--json] [--label LABEL] [--db PATH | --no-register]",
	  "check a shard set and write the original layout back",
	  "-o OUT\tthe merged output to write\n"
	  "--force\treplace an existing OUT\n"
	  "--label LABEL\tthe label of the merged state\n" },
	{ "reshard", cmd_reshard,
	  "reshard DIR -o OUT --ep-size M [--placement P] [--dry-run] [--force] [--json] [--label LABEL] [--db PATH | --no-register]",
	  "check a shard set and re-split it for another EP size",
	  "-o OUT\tthe new shard set to write\n"
	  "--ep-size M\tthe new number of EP ranks\n"
	  "--placement P\tcontiguous (default), round-robin or a map.json\n"
	  "--dry-run\tprint the plan and write nothing\n"
	  "--force\treplace an existing OUT\n"
	  "--label LABEL\tlabel rank R's shard LABEL/rankR\n" },
};

int main(int argc, char **argv)
{
	static const struct cli_tool tool = {
		"msshard", "Expert-parallel sharding of LoRA adapters and MoE checkpoints.", cmds,
		sizeof(cmds) / sizeof(cmds[0]),
	};

	g_argc = argc;
	g_argv = argv;
	return cli_main(&tool, argc, argv);
}
