/*
 * run_fp.c: the GPU trainer's device memory for a run plan, for `msinv
 * footprint`: the plan's train section (the trainer's own parser), the
 * 'base' state's config.json (from the inventory, or beside a path entry)
 * and gpu_plan.c's prediction in both colwise modes.
 */
#include <string.h>

#include "fsutil.h"
#include "train/run.h"

/* config.json of the plan's 'base' entry: recorded with its state, or the
 * file beside a path entry */
static int base_config(struct ms_inv *inv, const struct ms_fp_plan *fp, char **text,
		       size_t *len, struct ms_err *err)
{
	const struct ms_fp_entry *e = NULL;
	char digest[MS_STATE_DIGEST_LEN];
	struct ms_inv_config *cf = NULL;
	size_t n = 0;
	int rc;

	*text = NULL;
	for (size_t i = 0; i < fp->nentries; i++)
		if (!strcmp(fp->entries[i].role, "base"))
			e = &fp->entries[i];
	if (!e)
		return ms_err_set(err, MS_EINVAL, "plan '%s': the trainer needs a 'base' entry",
				  fp->label);
	if (!e->state) {
		char *p = ms_path_join(e->resolved, "config.json");
		if (!p)
			return ms_err_nomem(err);
		rc = ms_file_read(p, 1u << 20, text, len, err);
		ms_free(p);
		return rc;
	}
	if ((rc = ms_inv_resolve(inv, e->state, digest, err)) != MS_OK ||
	    (rc = ms_inv_state_configs(inv, digest, &cf, &n, err)) != MS_OK)
		return rc;
	rc = ms_err_set(err, MS_EINVAL, "role 'base': state %.23s... has no config.json", digest);
	for (size_t i = 0; i < n; i++)
		if (!strcmp(cf[i].name, "config.json")) {
			if (!(*text = ms_malloc(cf[i].len + 1))) {
				rc = ms_err_nomem(err);
				break;
			}
			memcpy(*text, cf[i].text, cf[i].len);
			(*text)[cf[i].len] = 0;
			*len = cf[i].len;
			rc = MS_OK;
			break;
		}
	ms_inv_configs_free(cf, n);
	return rc;
}

static int train_footprint(struct ms_inv *inv, const struct ms_fp_plan *fp,
		       const char *plan_text, size_t plan_len, struct ms_fp_trainer *out,
		       struct ms_err *err)
{
	struct ms_train_plan tp;
	struct ms_model_cfg cfg;
	char *text = NULL;
	size_t len = 0;
	int rc;

	memset(out, 0, sizeof *out);
	memset(&tp, 0, sizeof tp);
	if ((rc = ms_train_plan_parse(plan_text, plan_len, fp->label, NULL, &tp, err)) != MS_OK)
		return rc;
	if ((rc = base_config(inv, fp, &text, &len, err)) != MS_OK)
		goto out;
	if ((rc = ms_model_cfg_parse(text, len, &cfg, err)) != MS_OK) {
		ms_err_prefix(err, "role 'base': config.json");
		goto out;
	}
	{
		/* what the trainer would refuse (its part says so) */
		int on;
		if ((rc = ms_gmodel_decode_ahead(&on, err)) != MS_OK)
			goto out;
	}
	out->present = 1;
	out->batch = tp.batch;
	out->seq_len = tp.seq_len;
	out->colwise_ondemand = tp.colwise != MS_COLWISE_RESIDENT;
	for (int m = 0; m < 2; m++) {
		struct ms_model_mem mm;
		ms_gmodel_predict(&cfg, &tp.lora, tp.batch, tp.seq_len,
				  m ? MS_COLWISE_ON_DEMAND : MS_COLWISE_RESIDENT, 0, 0,
				  MS_ATTENTION_AUTO, &mm);
		out->mode[m].nvfp4_rowwise = mm.nvfp4_rowwise;
		out->mode[m].nvfp4_colwise = mm.nvfp4_colwise;
		out->mode[m].dense = mm.dense;
		out->mode[m].lora = mm.lora;
		out->mode[m].acts = mm.acts;
		out->mode[m].scratch = mm.scratch;
		out->mode[m].total = mm.peak;
	}
out:
	ms_free(text);
	ms_train_plan_release(&tp);
	return rc;
}

int ms_fp_report_add_trainer(struct ms_inv *inv, struct ms_fp_report *r,
			     const char *plan_path, struct ms_err *err)
{
	struct ms_err e = {0};
	char *text = NULL;
	size_t len = 0;
	int rc = MS_OK;

	memset(&r->trainer, 0, sizeof r->trainer);
	if (!r->plan->train.present)
		return MS_OK;
	if ((rc = ms_file_read(plan_path, MS_FP_MAX_PLAN, &text, &len, &e)) == MS_OK)
		rc = train_footprint(inv, r->plan, text, len, &r->trainer, &e);
	ms_free(text);
	if (rc == MS_ENOMEM)
		return ms_err_nomem(err);
	if (!r->trainer.present)
		snprintf(r->trainer.why, sizeof r->trainer.why, "%s",
			 e.msg[0] ? e.msg : "unknown");
	return MS_OK;
}
