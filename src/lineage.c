/*
 * lineage.c: what a writer records in the inventory after it published an
 * output: the input as a state, and each output as a state derived from it
 * by the operation, with the operation's parameters on the edge (ms(5),
 * "Edges"). msconvert and msshard record through here, and so would any
 * other front end that converts or shards, so that the same operation
 * leaves the same record whoever ran it. The parameters are built with
 * cJSON and printed unformatted: the edge's bytes are the same every time.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "inventory.h"
#include "quant.h"
#include "shard.h"

/* Record path as a state derived from parent (none when parent is "") by
 * operation, with params (taken, deleted here) on the edge. */
static int derive(struct ms_inv *inv, const char *parent, const char *path,
		  const char *operation, cJSON *params, uint64_t mark, const char *label,
		  int jobs, char digest[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	struct ms_inv_add_opts a;
	const char *parents[1] = {parent};
	char *text = params ? cJSON_PrintUnformatted(params) : NULL;
	int rc;

	cJSON_Delete(params);
	/* every addition above may have failed silently: a record never
	 * lacks a field */
	if (!text || ms_json_failed(mark)) {
		rc = ms_err_nomem(err);
		goto out;
	}
	ms_inv_add_opts_init(&a);
	a.jobs = jobs;
	a.label = label;
	if (parent[0]) {
		a.parents = parents;
		a.nparents = 1;
		a.operation = operation;
		a.params_json = text;
	}
	rc = ms_inv_add_paths(inv, &path, 1, &a, digest, err);
out:
	cJSON_free(text);
	return rc;
}

const char *ms_quant_op_name(enum ms_quant_op op)
{
	switch (op) {
	case MS_QUANT_OP_QUANTIZE: return "quantize";
	case MS_QUANT_OP_DEQUANTIZE: return "dequantize";
	case MS_QUANT_OP_TRANSPOSE: return "transpose";
	}
	return "transpose";
}

int ms_quant_register(struct ms_inv *inv, const char *in, const char *out,
		      const struct ms_quant_opts *o, const char *tool, const char *label,
		      char digest[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	struct ms_inv_add_opts a;
	char parent[MS_STATE_DIGEST_LEN], who[128];
	uint64_t mark;
	cJSON *j;
	int rc;

	/* the input first (idempotent: unchanged files are not hashed again) */
	ms_inv_add_opts_init(&a);
	a.jobs = o->jobs;
	if ((rc = ms_inv_add_paths(inv, &in, 1, &a, parent, err)) != MS_OK)
		return rc;
	snprintf(who, sizeof(who), "%s %s", tool, MS_VERSION);
	mark = ms_json_mark();
	if ((j = cJSON_CreateObject()))
		ms_json_put(j, "tool", cJSON_CreateString(who));
	if (j && o->op == MS_QUANT_OP_QUANTIZE) {
		cJSON *l = cJSON_CreateArray();

		if (l && (o->layouts & MS_QUANT_ROWWISE))
			ms_json_put(l, NULL, cJSON_CreateString("rowwise"));
		if (l && (o->layouts & MS_QUANT_COLUMNWISE))
			ms_json_put(l, NULL, cJSON_CreateString("columnwise"));
		ms_json_put(j, "layouts", l);
		ms_json_put(j, "recipe", cJSON_CreateString(ms_nvfp4_recipe_name(o->recipe)));
		ms_json_put(j, "block", cJSON_CreateString(ms_nvfp4_block_name(o->block)));
		ms_json_put(j, "format", cJSON_CreateString(ms_quant_format_name(
					    o->format_set ? o->format : ms_quant_default_format(o->recipe))));
		ms_json_put(j, "fuse_scales", cJSON_CreateBool(!o->no_fuse));
		if (o->pad_ragged)
			ms_json_put(j, "pad_ragged", cJSON_CreateTrue());
		ms_json_put(j, "experts", cJSON_CreateString(ms_quant_experts_name(o->experts)));
		if (o->include)
			ms_json_put(j, "include", cJSON_CreateString(o->include));
		if (o->exclude)
			ms_json_put(j, "exclude", cJSON_CreateString(o->exclude));
	} else if (j && o->op == MS_QUANT_OP_DEQUANTIZE) {
		ms_json_put(j, "dtype", cJSON_CreateString(ms_dtype_name(o->dtype)));
	} else if (j && o->source) {
		ms_json_put(j, "source", cJSON_CreateString(o->source));
	}
	return derive(inv, parent, out, ms_quant_op_name(o->op), j, mark, label, o->jobs, digest,
		      err);
}

const char *ms_shard_op_name(enum ms_shard_op op)
{
	switch (op) {
	case MS_SHARD_OP_SPLIT: return "split";
	case MS_SHARD_OP_MERGE: return "merge";
	case MS_SHARD_OP_RESHARD: return "reshard";
	}
	return "reshard";
}

int ms_shard_register(struct ms_inv *inv, enum ms_shard_op op, const char *input,
		      const struct ms_shard_result *r, const char *label, struct ms_err *err)
{
	char parent[MS_STATE_DIGEST_LEN] = "", digest[MS_STATE_DIGEST_LEN];
	int rc;

	if (op == MS_SHARD_OP_SPLIT || op == MS_SHARD_OP_MERGE) {
		/* split: the input; merge: the output directory, the source's
		 * state again (another copy of it) */
		struct ms_inv_add_opts a;

		ms_inv_add_opts_init(&a);
		if (op == MS_SHARD_OP_MERGE)
			a.label = label;
		if ((rc = ms_inv_add_paths(inv, &input, 1, &a, parent, err)) != MS_OK ||
		    op == MS_SHARD_OP_MERGE)
			return rc;
	} else {
		/* reshard: derived from the source when the inventory knows it */
		struct ms_inv_state *st = NULL;
		struct ms_err lerr = {0};

		if (ms_inv_state_get(inv, r->source_digest, &st, &lerr) == MS_OK)
			memcpy(parent, r->source_digest, MS_STATE_DIGEST_LEN);
		ms_inv_state_free(st);
	}
	for (size_t i = 0; i < r->nfiles; i++) {
		const struct ms_shard_out_file *f = &r->files[i];
		uint64_t mark = ms_json_mark();
		cJSON *pj = cJSON_CreateObject();
		char rank_label[MS_INV_MAX_LABEL + 32];

		if (pj) {
			ms_json_put(pj, "ep_size", cJSON_CreateNumber(r->ep_size));
			ms_json_put(pj, "placement",
				    cJSON_CreateString(ms_ep_placement_name(r->placement->kind)));
		}
		if (pj && f->rank != UINT32_MAX) {
			cJSON *ids = cJSON_CreateArray();

			ms_json_put(pj, "rank", cJSON_CreateNumber(f->rank));
			for (uint32_t k = 0; ids && k < f->nexperts; k++)
				ms_json_put(ids, NULL, cJSON_CreateNumber(f->experts[k]));
			ms_json_put(pj, "experts", ids);
		}
		if (label && f->rank != UINT32_MAX)
			snprintf(rank_label, sizeof(rank_label), "%s/rank%u", label, f->rank);
		rc = derive(inv, parent, f->path, ms_shard_op_name(op), pj, mark,
			    label && f->rank != UINT32_MAX ? rank_label : NULL, 0, digest, err);
		if (rc != MS_OK)
			return rc;
	}
	return MS_OK;
}
