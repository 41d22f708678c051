/*
 * msconvert: NVFP4 conversion of checkpoints: quantize (rowwise,
 * columnwise or both; 1D or 2D blocks; the arithmetic of Model Optimizer,
 * compressed-tensors or Transformer Engine), dequantize, transpose and
 * stats. This file parses arguments, calls libms (quant.h, nvfp4.h) and
 * prints; everything else lives in src/.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

/* ---- shared -------------------------------------------------------------- */


static void shape_str(uint32_t ndim, const uint64_t *shape, char *buf, size_t n)
{
	size_t k = 0;

	k += (size_t)snprintf(buf + k, n - k, "[");
	for (uint32_t d = 0; d < ndim && k < n; d++)
		k += (size_t)snprintf(buf + k, n - k, d ? ",%llu" : "%llu",
				      (unsigned long long)shape[d]);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

/* The plan as text: one line per input tensor and what becomes of it. */
static void print_plan(const struct ms_quant_plan *p)
{
	size_t o = 0;

	for (size_t i = 0; i < p->nitems; i++) {
		const struct ms_qitem *it = &p->items[i];
		char shape[24 * MS_ST_MAX_RANK + 4];
		uint64_t out = 0;

		if (it->src && it->qweight < 0) {
			shape_str(it->src->ndim, it->src->shape, shape, sizeof(shape));
			printf("%s\t%s\t%s\t%s\t%llu", it->quantized ? "quantize" : "copy",
			       it->src->name, ms_dtype_name(it->src->dtype), shape,
			       (unsigned long long)it->src->nbytes);
		} else {
			const struct ms_qweight *w = &p->view.weights[it->qweight];
			uint64_t in = 0, lshape[3] = {it->experts, w->rows, w->cols};

			for (int l = 0; l < 2; l++)
				if (w->packed[l])
					in += w->packed[l]->nbytes + w->scales[l]->nbytes;
			/* a fused tensor: every expert slice, under its own name */
			if (it->experts)
				in = (in + w->tscale->nbytes) * it->experts;
			shape_str(it->experts ? 3 : 2, lshape + !it->experts, shape, sizeof(shape));
			printf("%s\t%s\tnvfp4\t%s\t%llu",
			       p->opts.op == MS_QUANT_OP_TRANSPOSE ? "transpose" : "dequantize",
			       it->experts ? w->packed[0]->name : w->prefix, shape,
			       (unsigned long long)in);
		}
		while (o < p->nouts && p->outs[o].item < i)
			o++;
		printf("\t->");
		for (size_t k = o; k < p->nouts && p->outs[k].item == i; k++) {
			const struct ms_qout *q = &p->outs[k];

			shape_str(q->ndim, q->shape, shape, sizeof(shape));
			printf("%s %s %s %s", k > o ? "," : "", q->name, ms_dtype_name(q->dtype),
			       shape);
			out += q->nbytes;
		}
		printf("\t%llu", (unsigned long long)out);
		if (it->group >= 0)
			printf("\tfused-group %lld", (long long)it->group);
		putchar('\n');
	}
	for (size_t f = 0; f < p->nfiles; f++)
		printf("# file %s\n", p->files[f]);
	printf("# %zu %s, %zu copied, %zu fused groups, %zu files; bytes in %llu, out %llu\n",
	       p->nquantized,
	       p->opts.op == MS_QUANT_OP_QUANTIZE ? "quantized"
	       : p->opts.op == MS_QUANT_OP_TRANSPOSE ? "transposed" : "dequantized",
	       p->ncopied, p->ngroups, p->nfiles, (unsigned long long)p->bytes_in,
	       (unsigned long long)p->bytes_out);
}

/* ---- registration ---------------------------------------------------------- */

/* --db PATH, else $MSINV_DB: outputs are registered in that inventory,
 * derived from their input, unless --no-register. */
static const char *reg_db;
static int reg_off;
/* --label: the label the registered output gets */
static const char *reg_label;
/* main's arguments: the provenance recorded with every registration */
static int g_argc;
static char **g_argv;

static int reg_wanted(void)
{
	const char *e = getenv("MSINV_DB");

	return !reg_off && (reg_db || (e && *e));
}

/* One line per weight left in its dtype for a ragged input dimension, and
 * per weight quantized padded (--pad-ragged). */
static void print_ragged(const struct ms_quant_plan *p)
{
	for (size_t i = 0; i < p->nragged; i++) {
		const struct ms_tensor *t = ms_ckpt_find(p->in, p->ragged[i]);

		if (t)
			fprintf(stderr,
				"%s: tensor '%s': input dimension %llu is not a multiple of 16: left in %s, listed in the ignore list (--pad-ragged quantizes it padded, which engines cannot load)\n",
				cli_prog, t->name, (unsigned long long)t->shape[1],
				ms_dtype_name(t->dtype));
	}
	for (size_t i = 0; i < p->nitems; i++) {
		const struct ms_qitem *it = &p->items[i];

		if (p->opts.op == MS_QUANT_OP_QUANTIZE && it->quantized && it->cols % 16)
			fprintf(stderr,
				"%s: tensor '%s': input dimension %llu padded to %llu: engines cannot load this module\n",
				cli_prog, it->src->name, (unsigned long long)it->cols,
				(unsigned long long)((it->cols + 15) / 16 * 16));
	}
}

/*
 * Plan, (print,) write the output under a staging name, then publish it.
 * With an inventory, publishing and registering are one step: inside one
 * batch the output is renamed into place, the input and the output are
 * registered, and the batch is committed; any failure rolls the batch back
 * and undoes the rename (a replaced OUT comes back). A failed command thus
 * leaves the directory as it was and records nothing. A kill between the
 * rename and the commit leaves the complete output, unregistered.
 */
static int convert(const char *in, const char *out, const struct ms_quant_opts *o,
		   int dry_run, const char *verb)
{
	struct ms_quant_plan *p = NULL;
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};
	struct cli_progress pr = {.what = verb};
	char digest[MS_STATE_DIGEST_LEN];
	enum ms_quant_device device;
	int rc, batch = 0;

	if (reg_label && !reg_wanted())
		return cli_usage("--label names the registered output: it needs an inventory (--db or MSINV_DB)");
	if (reg_label && (rc = ms_inv_label_check(reg_label, &err)) != MS_OK)
		return cli_fail(rc, &err);
	if ((rc = ms_quant_plan_new(in, out, o, &p, &err)) != MS_OK)
		return cli_fail(rc, &err);
	if (dry_run) {
		print_ragged(p);
		print_plan(p);
		ms_quant_plan_free(p);
		return CLI_OK;
	}
	cli_catch_interrupts();
	/* open the inventory before writing: a missing one fails fast */
	if (reg_wanted() && ((rc = ms_inv_open(cli_db_path(reg_db), 0, &inv, &err)) != MS_OK ||
			     (rc = ms_inv_set_origin(inv, "msconvert", g_argc, g_argv, &err)) != MS_OK))
		goto out;
	rc = ms_quant_stage(p, cli_progress_enabled() ? cli_progress_cb : NULL, &pr, &err);
	cli_progress_end(&pr);
	if (rc != MS_OK)
		goto out;
	if (!inv) {
		/* nothing to record: the digest of the staged files, then the
		 * rename */
		if ((rc = ms_quant_output_digest(ms_quant_staged_path(p), o->jobs, digest, &err)) == MS_OK)
			rc = ms_quant_publish(p, &err);
		goto out;
	}
	if ((rc = ms_inv_batch_begin(inv, &err)) != MS_OK)
		goto out;
	batch = 1;
	if ((rc = ms_quant_publish(p, &err)) != MS_OK ||
	    (rc = ms_quant_register(inv, in, out, o, "msconvert", reg_label, digest, &err)) != MS_OK)
		goto out;
	batch = 0;
	rc = ms_inv_batch_end(inv, 1, &err);
out:
	if (batch)
		(void)ms_inv_batch_end(inv, 0, NULL);
	/* keep the output, or undo everything this run did to the directory */
	ms_quant_finish(p, rc == MS_OK);
	if (rc == MS_OK)
		print_ragged(p);
	device = p->device;
	ms_quant_plan_free(p);
	ms_inv_close(inv);
	if (rc != MS_OK)
		return cli_fail(rc, &err);
	/* --device auto says what it chose (after the fact: an error stays the
	 * one line on stderr) */
	if (o->op == MS_QUANT_OP_QUANTIZE && o->device == MS_QUANT_DEVICE_AUTO)
		fprintf(stderr, "%s: quantized on the %s\n", cli_prog,
			device == MS_QUANT_DEVICE_CUDA ? "GPU" : "CPU (no usable GPU)");
	printf("%s %s %s\n", verb, digest, out);
	return CLI_OK;
}

/* ---- quantize ------------------------------------------------------------ */

static int cmd_quantize(int argc, char **argv)
{
	static const struct option opts[] = {
		{"recipe", required_argument, NULL, 'r'},
		{"block", required_argument, NULL, 'b'},
		{"layout", required_argument, NULL, 'l'},
		{"format", required_argument, NULL, 'F'},
		{"include", required_argument, NULL, 'i'},
		{"exclude", required_argument, NULL, 'x'},
		{"no-fuse-scales", no_argument, NULL, 'n'},
		{"pad-ragged", no_argument, NULL, 'P'},
		{"experts", required_argument, NULL, 'E'},
		{"allow-nonfinite", no_argument, NULL, 'a'},
		{"device", required_argument, NULL, 'd'},
		{"jobs", required_argument, NULL, 'j'},
		{"dry-run", no_argument, NULL, 'D'},
		{"force", no_argument, NULL, 'f'},
		{"db", required_argument, NULL, 'B'},
		{"no-register", no_argument, NULL, 'R'},
		{"label", required_argument, NULL, 'L'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct ms_quant_opts o;
	const char *out = NULL;
	int c, dry_run = 0;

	memset(&o, 0, sizeof(o));
	o.op = MS_QUANT_OP_QUANTIZE;
	o.layouts = MS_QUANT_ROWWISE;
	while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
		switch (c) {
		case 'o': out = optarg; break;
		case 'r':
			if (ms_nvfp4_recipe_parse(optarg, &o.recipe) != MS_OK)
				return cli_usage("unknown recipe '%s'", optarg);
			break;
		case 'b':
			if (ms_nvfp4_block_parse(optarg, &o.block) != MS_OK)
				return cli_usage("unknown block shape '%s'", optarg);
			break;
		case 'l':
			if (!strcmp(optarg, "rowwise"))
				o.layouts = MS_QUANT_ROWWISE;
			else if (!strcmp(optarg, "columnwise"))
				o.layouts = MS_QUANT_COLUMNWISE;
			else if (!strcmp(optarg, "both"))
				o.layouts = MS_QUANT_ROWWISE | MS_QUANT_COLUMNWISE;
			else
				return cli_usage("unknown layout '%s'", optarg);
			break;
		case 'F':
			if (ms_quant_format_parse(optarg, &o.format) != MS_OK)
				return cli_usage("unknown format '%s'", optarg);
			o.format_set = 1;
			break;
		case 'i': o.include = optarg; break;
		case 'x': o.exclude = optarg; break;
		case 'n': o.no_fuse = 1; break;
		case 'P': o.pad_ragged = 1; break;
		case 'E':
			if (ms_quant_experts_parse(optarg, &o.experts) != MS_OK)
				return cli_usage("unknown expert layout '%s' (per-expert or fused)", optarg);
			break;
		case 'a': o.allow_nonfinite = 1; break;
		case 'd':
			if (ms_quant_device_parse(optarg, &o.device) != MS_OK)
				return cli_usage("unknown device '%s'", optarg);
			break;
		case 'j':
			if (cli_int("--jobs", optarg, 4096, &o.jobs))
				return CLI_USAGE;
			break;
		case 'D': dry_run = 1; break;
		case 'f': o.force = 1; break;
		case 'B': reg_db = optarg; break;
		case 'R': reg_off = 1; break;
		case 'L': reg_label = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind + 1 != argc)
		return cli_usage(optind >= argc ? "missing IN" : "more than one IN");
	if (!out)
		return cli_usage("missing -o OUT");
	return convert(argv[optind], out, &o, dry_run, "quantized");
}

/* ---- dequantize ---------------------------------------------------------- */

static int cmd_dequantize(int argc, char **argv)
{
	static const struct option opts[] = {
		{"dtype", required_argument, NULL, 't'},
		{"force", no_argument, NULL, 'f'},
		{"db", required_argument, NULL, 'B'},
		{"no-register", no_argument, NULL, 'R'},
		{"label", required_argument, NULL, 'L'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct ms_quant_opts o;
	const char *out = NULL;
	int c;

	memset(&o, 0, sizeof(o));
	o.op = MS_QUANT_OP_DEQUANTIZE;
	o.dtype = MS_DTYPE_BF16;
	while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
		switch (c) {
		case 'o': out = optarg; break;
		case 't':
			if (!strcmp(optarg, "bf16"))
				o.dtype = MS_DTYPE_BF16;
			else if (!strcmp(optarg, "f32"))
				o.dtype = MS_DTYPE_F32;
			else
				return cli_usage("unknown dtype '%s' (bf16 or f32)", optarg);
			break;
		case 'f': o.force = 1; break;
		case 'B': reg_db = optarg; break;
		case 'R': reg_off = 1; break;
		case 'L': reg_label = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind + 1 != argc)
		return cli_usage(optind >= argc ? "missing IN" : "more than one IN");
	if (!out)
		return cli_usage("missing -o OUT");
	return convert(argv[optind], out, &o, 0, "dequantized");
}

/* ---- transpose ----------------------------------------------------------- */

static int cmd_transpose(int argc, char **argv)
{
	static const struct option opts[] = {
		{"source", required_argument, NULL, 's'},
		{"force", no_argument, NULL, 'f'},
		{"db", required_argument, NULL, 'B'},
		{"no-register", no_argument, NULL, 'R'},
		{"label", required_argument, NULL, 'L'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct ms_quant_opts o;
	const char *out = NULL;
	int c;

	memset(&o, 0, sizeof(o));
	o.op = MS_QUANT_OP_TRANSPOSE;
	while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
		switch (c) {
		case 'o': out = optarg; break;
		case 's': o.source = optarg; break;
		case 'f': o.force = 1; break;
		case 'B': reg_db = optarg; break;
		case 'R': reg_off = 1; break;
		case 'L': reg_label = optarg; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind + 1 != argc)
		return cli_usage(optind >= argc ? "missing IN" : "more than one IN");
	if (!out)
		return cli_usage("missing -o OUT");
	return convert(argv[optind], out, &o, 0, "transposed");
}

/* ---- stats --------------------------------------------------------------- */

static const char *const bucket_names[MS_QSTATS_BUCKETS] = {
	"0 (subnormal, 0)", "1 (2^-6)", "2 (2^-5)", "3 (2^-4)", "4 (2^-3)", "5 (2^-2)",
	"6 (2^-1)", "7 (2^0)", "8 (2^1)", "9 (2^2)", "10 (2^3)", "11 (2^4)", "12 (2^5)",
	"13 (2^6)", "14 (2^7)", "15 (2^8)", "nan",
};

static cJSON *entry_json(const struct ms_qstats_entry *e)
{
	cJSON *o = cJSON_CreateObject(), *h;

	if (e->w) {
		const struct ms_qweight *w = e->w;
		cJSON *shape = cJSON_AddArrayToObject(o, "shape");

		cJSON_AddStringToObject(o, "module", w->prefix);
		cJSON_AddStringToObject(o, "layout", ms_nvfp4_layout_name(e->layout));
		cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)w->rows));
		cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)w->cols));
		cJSON_AddStringToObject(o, "format", ms_quant_format_name(w->format));
		cJSON_AddStringToObject(o, "block", ms_nvfp4_block_name(w->block));
		cJSON_AddStringToObject(o, "recipe", ms_nvfp4_recipe_name(w->recipe));
		cJSON_AddNumberToObject(o, "tensor_scale", (double)w->tscale_value);
	}
	cJSON_AddNumberToObject(o, "elements", (double)e->nelem);
	if (e->has_source) {
		cJSON_AddNumberToObject(o, "rel_err", isfinite(e->rel_err) ? e->rel_err : -1);
		cJSON_AddNumberToObject(o, "max_abs_err", isfinite(e->max_abs_err) ? e->max_abs_err : -1);
		cJSON_AddNumberToObject(o, "saturated", (double)e->saturated);
		cJSON_AddNumberToObject(o, "saturated_share",
					e->nelem ? (double)e->saturated / (double)e->nelem : 0.0);
	}
	h = cJSON_AddArrayToObject(o, "scale_exponents");
	for (int k = 0; k < MS_QSTATS_BUCKETS; k++)
		cJSON_AddItemToArray(h, cJSON_CreateNumber((double)e->scale_hist[k]));
	return o;
}

static int stats_json(const struct ms_qstats *s, const char *path, const char *source)
{
	cJSON *root = cJSON_CreateObject(), *arr;
	char *text;

	cJSON_AddStringToObject(root, "path", path);
	if (source)
		cJSON_AddStringToObject(root, "source", source);
	else
		cJSON_AddNullToObject(root, "source");
	arr = cJSON_AddArrayToObject(root, "tensors");
	for (size_t i = 0; i < s->n; i++)
		cJSON_AddItemToArray(arr, entry_json(&s->e[i]));
	cJSON_AddItemToObject(root, "total", entry_json(&s->total));
	text = cJSON_Print(root);
	cJSON_Delete(root);
	if (!text) {
		cli_errorf("out of memory");
		return CLI_IO;
	}
	puts(text);
	cJSON_free(text);
	return CLI_OK;
}

static void print_errs(const struct ms_qstats_entry *e)
{
	if (!e->has_source) {
		printf("\t-\t-\t-");
		return;
	}
	printf("\t%.6g\t%.6g\t%.4f%%", e->rel_err, e->max_abs_err,
	       e->nelem ? 100.0 * (double)e->saturated / (double)e->nelem : 0.0);
}

static int cmd_stats(int argc, char **argv)
{
	static const struct option opts[] = {
		{"source", required_argument, NULL, 's'},
		{"json", no_argument, NULL, 'J'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *source = NULL;
	struct ms_qstats *s = NULL;
	struct ms_err err = {0};
	int c, json = 0, rc;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's': source = optarg; break;
		case 'J': json = 1; break;
		case 'h': return cli_help();
		default: return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind + 1 != argc)
		return cli_usage(optind >= argc ? "missing QUANTIZED" : "more than one QUANTIZED");
	if ((rc = ms_qstats_run(argv[optind], source, 0, &s, &err)) != MS_OK)
		return cli_fail(rc, &err);
	if (json) {
		rc = stats_json(s, argv[optind], source);
		ms_qstats_free(s);
		return rc;
	}
	printf("module\tlayout\tshape\tblock\trecipe\ttensor_scale\trel_err\tmax_abs_err\tsaturated\n");
	for (size_t i = 0; i < s->n; i++) {
		const struct ms_qstats_entry *e = &s->e[i];
		const struct ms_qweight *w = e->w;

		printf("%s\t%s\t[%llu,%llu]\t%s\t%s\t%.9g", w->prefix,
		       ms_nvfp4_layout_name(e->layout), (unsigned long long)w->rows,
		       (unsigned long long)w->cols, ms_nvfp4_block_name(w->block),
		       ms_nvfp4_recipe_name(w->recipe), (double)w->tscale_value);
		print_errs(e);
		putchar('\n');
	}
	printf("total\t%zu\t%llu elements\t\t\t", s->n, (unsigned long long)s->total.nelem);
	print_errs(&s->total);
	putchar('\n');
	printf("# scale exponent field: blocks\n");
	for (int k = 0; k < MS_QSTATS_BUCKETS; k++)
		if (s->total.scale_hist[k])
			printf("# %s: %llu\n", bucket_names[k],
			       (unsigned long long)s->total.scale_hist[k]);
	ms_qstats_free(s);
	return CLI_OK;
}

static const struct cli_cmd cmds[] = {
	{"quantize", cmd_quantize,
	 "quantize IN -o OUT [--recipe modelopt|compressed-tensors|te] [--block 1d|2d] "
	 "[--layout rowwise|columnwise|both] [--format modelopt|compressed-tensors] "
	 "[--include RE] [--exclude RE] [--no-fuse-scales] [--pad-ragged] [--experts per-expert|fused] [--allow-nonfinite] "
	 "[--device auto|cpu|cuda] [--jobs N] [--dry-run] [--force] [--label LABEL] [--db PATH | --no-register]",
	 "quantize the linear weights of a checkpoint to NVFP4",
	 "-o OUT\tthe output file or directory\n"
	 "--recipe modelopt|compressed-tensors|te\twhose float32 arithmetic to reproduce (default modelopt)\n"
	 "--block 1d|2d\t1x16 blocks (default) or 16x16 tiles\n"
	 "--layout rowwise|columnwise|both\tW, W^T or both (default rowwise)\n"
	 "--format modelopt|compressed-tensors\ttensor names and configs to write (default: the recipe's)\n"
	 "--include RE\tquantize only the weights whose names match\n"
	 "--exclude RE\tleave out the weights whose names match\n"
	 "--no-fuse-scales\tgive every weight its own tensor scale\n"
	 "--experts per-expert|fused\tfused 3-D experts written per expert (default, what engines load) or fused\n"
	 "--pad-ragged\tpad weights whose input dimension is not a multiple of 16 (engines cannot load them)\n"
	 "--allow-nonfinite\tquantize NaN and Inf instead of refusing them\n"
	 "--device auto|cpu|cuda\twhere to quantize (default auto: the GPU when usable)\n"
	 "--force\treplace an existing OUT\n"
	 "--label LABEL\tthe label of the registered output\n"},
	{"dequantize", cmd_dequantize, "dequantize IN -o OUT [--dtype bf16|f32] [--force] [--label LABEL] [--db PATH | --no-register]",
	 "decode an NVFP4 checkpoint back to bf16 or f32",
	 "-o OUT\tthe output file or directory\n"
	 "--dtype bf16|f32\tthe dtype to write (default bf16)\n"
	 "--force\treplace an existing OUT\n"},
	{"transpose", cmd_transpose, "transpose IN -o OUT [--source ORIGINAL] [--force] [--label LABEL] [--db PATH | --no-register]",
	 "turn rowwise NVFP4 into columnwise or back",
	 "-o OUT\tthe output file or directory\n"
	 "--source ORIGINAL\tthe high-precision original, for 1D blocks (requantized from it)\n"
	 "--force\treplace an existing OUT\n"},
	{"stats", cmd_stats, "stats QUANTIZED [--source ORIGINAL] [--json]",
	 "quantization error and scale statistics per tensor",
	 "--source ORIGINAL\tthe original, to measure the error against\n"},
};

int main(int argc, char **argv)
{
	static const struct cli_tool tool = {
		"msconvert", "NVFP4 conversion of model checkpoints.", cmds,
		sizeof(cmds) / sizeof(cmds[0]),
	};

	g_argc = argc;
	g_argv = argv;
	return cli_main(&tool, argc, argv);
}
