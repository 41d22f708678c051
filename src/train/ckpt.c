/*
 * ckpt.c: writing a checkpoint directory (PEFT adapter + optimizer state)
 * through a staging directory, publishing it in one rename, registering it
 * in one inventory batch; reading the optimizer state back verified.
 */
#include "train/ckpt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "fsutil.h"
#include "hash.h"
#include "safetensors.h"
#include "stage.h"

/* The metadata JSON of optimizer.safetensors. Nothing of the run's
 * identity goes in (its number, its plan file): the file, and so the
 * digest the edges record, is a function of the training trajectory
 * alone, and the same checkpoint reached by two runs (an uninterrupted
 * one and a resumed one) is recorded once, with the same edges. */
static char *meta_json(const struct ms_train_ckpt_meta *m)
{
	return ms_asprintf("{\"version\":1,\"step\":%" PRIu64 ",\"data_cursor\":%" PRIu64
			   ",\"data_seed\":%" PRIu64 ",\"lora_seed\":%" PRIu64 "}",
			   m->step, m->data_cursor, m->data_seed, m->lora_seed);
}

static int write_adapter(const struct ms_train_ckpt_save *s, const char *dir, struct ms_err *err)
{
	struct ms_st_writer *w = NULL;
	char *p = ms_path_join(dir, "adapter_config.json");
	int rc;

	if (!p)
		return ms_err_nomem(err);
	rc = ms_file_write_atomic(p, s->adapter_config, strlen(s->adapter_config), 0, err);
	ms_free(p);
	if (rc != MS_OK)
		return rc;
	if (!(p = ms_path_join(dir, "adapter_model.safetensors")))
		return ms_err_nomem(err);
	if ((rc = ms_st_writer_new(p, 0, &w, err)) != MS_OK)
		goto out;
	/* PEFT's save_pretrained writes {"format": "pt"} */
	if ((rc = ms_st_writer_meta(w, "format", "pt", err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < s->nparams; i++) {
		const struct ms_param *q = &s->params[i];

		if ((rc = ms_st_writer_add(w, q->name, MS_DTYPE_F32, q->ndim, q->shape, q->w, err)) !=
		    MS_OK)
			goto out;
	}
	rc = ms_st_writer_commit(w, err);
out:
	ms_st_writer_free(w);
	ms_free(p);
	return rc;
}

static int write_optim(const struct ms_train_ckpt_save *s, const char *path, struct ms_err *err)
{
	struct ms_st_writer *w = NULL;
	char *meta = meta_json(&s->meta), *name = NULL;
	int rc;

	if (!meta)
		return ms_err_nomem(err);
	if ((rc = ms_st_writer_new(path, 0, &w, err)) != MS_OK)
		goto out;
	if ((rc = ms_st_writer_meta(w, MS_TRAIN_CKPT_META, meta, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < s->nparams; i++) {
		const struct ms_param *q = &s->params[i];

		for (int k = 0; k < 2; k++) {
			ms_free(name);
			if (!(name = ms_asprintf("%s.%s", q->name, k ? "exp_avg_sq" : "exp_avg"))) {
				rc = ms_err_nomem(err);
				goto out;
			}
			if ((rc = ms_st_writer_add(w, name, MS_DTYPE_F32, q->ndim, q->shape,
						   k ? s->opt->v[i] : s->opt->m[i], err)) != MS_OK)
				goto out;
		}
	}
	rc = ms_st_writer_commit(w, err);
out:
	ms_st_writer_free(w);
	ms_free(name);
	ms_free(meta);
	return rc;
}

/* The derivation parameters every edge of the checkpoint carries (the run
 * is the edge's own run column). */
static char *edge_params(const struct ms_train_ckpt_save *s, const uint8_t sha[32])
{
	char hex[65];

	ms_hex(sha, 32, hex);
	return ms_asprintf("{\"step\":%" PRIu64 ",\"optimizer_sha256\":\"%s\"}", s->meta.step,
			   hex);
}

/* The state the staged adapter directory holds, and the label it already
 * carries in the inventory (NULL when it is new or unlabelled). */
static int known_label(struct ms_inv *inv, const char *adir, int jobs, char **label,
		       struct ms_err *err)
{
	struct ms_ckpt *ck = NULL;
	struct ms_inv_state *st = NULL;
	char digest[MS_STATE_DIGEST_LEN];
	int rc;

	*label = NULL;
	if ((rc = ms_ckpt_open(adir, &ck, err)) != MS_OK ||
	    (rc = ms_ckpt_hash(ck, jobs, 0, err)) != MS_OK ||
	    (rc = ms_state_digest(ck->tensors, ck->ntensors, digest, err)) != MS_OK)
		goto out;
	rc = ms_inv_state_get(inv, digest, &st, err);
	if (rc == MS_ENOTFOUND) {
		rc = MS_OK;
		goto out;
	}
	if (rc == MS_OK && st->label && !(*label = ms_strdup(st->label)))
		rc = ms_err_nomem(err);
out:
	ms_inv_state_free(st);
	ms_ckpt_close(ck);
	return rc;
}

int ms_train_ckpt_write(struct ms_inv *inv, const struct ms_train_ckpt_save *s, char **dir_out,
			char digest_out[MS_STATE_DIGEST_LEN], char **label_out, struct ms_err *err)
{
	struct ms_stage stg;
	char *had = NULL;
	char name[64], *final = NULL, *adir = NULL, *opath = NULL;
	char *params = NULL, *reg = NULL;
	uint8_t sha[32];
	struct ms_inv_add_opts a;
	struct stat sb;
	int rc = MS_OK, batch = 0;

	ms_stage_init(&stg);
	*dir_out = NULL;
	*label_out = NULL;
	snprintf(name, sizeof(name), "step-%06" PRIu64, s->meta.step);
	if (!(final = ms_path_join(s->outputs, name))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	/* a failed first checkpoint removes the outputs directories it made,
	 * so that it leaves nothing behind */
	if ((rc = ms_stage_open(&stg, final, "checkpoint", MS_STAGE_DIR | MS_STAGE_PARENTS,
				err)) != MS_OK)
		goto out;
	if (lstat(final, &sb) == 0) {
		rc = ms_err_set(err, MS_EEXIST, "'%s': checkpoint exists (another run wrote to "
				"these outputs)", final);
		goto out;
	}
	if (!(adir = ms_path_join(ms_stage_path(&stg), MS_TRAIN_CKPT_ADAPTER)) ||
	    !(opath = ms_path_join(ms_stage_path(&stg), MS_TRAIN_CKPT_OPTIM))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (mkdir(adir, 0755)) {
		rc = ms_err_set(err, MS_EIO, "'%s': cannot create: %s", adir, strerror(errno));
		goto out;
	}
	if ((rc = write_adapter(s, adir, err)) != MS_OK || (rc = write_optim(s, opath, err)) != MS_OK)
		goto out;
	if ((rc = ms_sha256_file(opath, sha, err)) != MS_OK)
		goto out;
	if (ms_fsync_dir_of(adir) || ms_fsync_dir_of(ms_stage_path(&stg))) {
		rc = ms_err_set(err, MS_EIO, "'%s': fsync of directory failed: %s", final,
				strerror(errno));
		goto out;
	}
	if ((rc = ms_stage_publish(&stg, MS_STAGE_NEW, err)) != MS_OK)
		goto out;
	/* registration: one batch, so the adapter, its edges and its run
	 * output are recorded together or not at all */
	if (!(params = edge_params(s, sha)) ||
	    !(reg = ms_path_join(final, MS_TRAIN_CKPT_ADAPTER))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	/* a state has one label: the same bytes from another run keep theirs */
	if ((rc = known_label(inv, reg, s->jobs, &had, err)) != MS_OK)
		goto out;
	ms_inv_add_opts_init(&a);
	a.kind = MS_INV_KIND_ADAPTER;
	a.label = had ? NULL : s->label;
	a.parents = s->parents;
	a.nparents = s->nparents;
	a.operation = s->nparents ? "train" : NULL;
	a.params_json = s->nparents ? params : NULL;
	a.run_id = s->run_id;
	a.jobs = s->jobs;
	if ((rc = ms_inv_batch_begin(inv, err)) != MS_OK)
		goto out;
	batch = 1;
	{
		const char *paths[1] = {reg};

		rc = ms_inv_add_paths(inv, paths, 1, &a, digest_out, err);
	}
	batch = 0;
	if (rc != MS_OK) {
		(void)ms_inv_batch_end(inv, 0, NULL);
		goto out;
	}
	if ((rc = ms_inv_batch_end(inv, 1, err)) != MS_OK)
		goto out;
	if (!(*label_out = had ? had : ms_strdup(s->label))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	had = NULL;
	*dir_out = final;
	final = NULL;
	ms_stage_commit(&stg);
out:
	if (batch)
		(void)ms_inv_batch_end(inv, 0, NULL);
	if (rc != MS_OK) {
		/* name the checkpoint, not its staging directory; one not
		 * recorded is taken away again, nothing unregistered stays */
		ms_stage_fix_msg(&stg, err);
		ms_stage_abort(&stg);
	}
	ms_free(final);
	ms_free(adir);
	ms_free(opath);
	ms_free(params);
	ms_free(reg);
	ms_free(had);
	return rc;
}

static int meta_u64(const cJSON *o, const char *k, uint64_t *out)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);

	if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 9007199254740992.0 ||
	    it->valuedouble != (double)(uint64_t)it->valuedouble)
		return -1;
	*out = (uint64_t)it->valuedouble;
	return 0;
}

int ms_train_ckpt_read_optim(const char *dir, const uint8_t expected[32], struct ms_adamw *opt,
			     struct ms_train_ckpt_meta *meta, struct ms_err *err)
{
	char *path = ms_path_join(dir, MS_TRAIN_CKPT_OPTIM), *text = NULL, *name = NULL;
	struct ms_st_file *f = NULL;
	cJSON *mj = NULL;
	const char *ms;
	uint8_t got[32];
	size_t len = 0;
	int rc, nomem = 0;

	memset(meta, 0, sizeof(*meta));
	if (!path)
		return ms_err_nomem(err);
	if ((rc = ms_file_read(path, UINT64_C(1) << 40, &text, &len, err)) != MS_OK)
		goto out;
	if ((rc = ms_sha256(text, len, got)) != MS_OK) {
		rc = ms_sha256_err(err, rc);
		goto out;
	}
	if (memcmp(got, expected, 32)) {
		char h1[65], h2[65];

		ms_hex(expected, 32, h1);
		ms_hex(got, 32, h2);
		rc = ms_err_set(err, MS_ECHECK, "'%s': optimizer state differs from the one its "
				"checkpoint recorded (expected sha256 %.16s..., got %.16s...)", path,
				h1, h2);
		goto out;
	}
	if ((rc = ms_st_parse((const uint8_t *)text, len, path, &f, err)) != MS_OK)
		goto out;
	if (!(ms = ms_st_meta_get(f, MS_TRAIN_CKPT_META)) ||
	    !(mj = ms_json_parse(ms, strlen(ms), &nomem)) || !cJSON_IsObject(mj) ||
	    meta_u64(mj, "step", &meta->step) || meta_u64(mj, "data_cursor", &meta->data_cursor) ||
	    meta_u64(mj, "data_seed", &meta->data_seed) ||
	    meta_u64(mj, "lora_seed", &meta->lora_seed)) {
		rc = nomem ? ms_err_nomem(err)
			   : ms_err_set(err, MS_EINVAL, "'%s': metadata '%s' missing or malformed",
					path, MS_TRAIN_CKPT_META);
		goto out;
	}
	if (f->ntensors != 2 * opt->np) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': %zu tensors, the model's LoRA needs %zu", path,
				f->ntensors, 2 * opt->np);
		goto out;
	}
	for (size_t i = 0; i < opt->np; i++) {
		for (int k = 0; k < 2; k++) {
			const struct ms_tensor *t;

			ms_free(name);
			if (!(name = ms_asprintf("%s.%s", opt->p[i].name, k ? "exp_avg_sq" : "exp_avg"))) {
				rc = ms_err_nomem(err);
				goto out;
			}
			t = ms_st_find(f, name);
			if (!t || t->dtype != MS_DTYPE_F32 || t->nelem != opt->p[i].n) {
				rc = ms_err_set(err, MS_EINVAL, "'%s': tensor '%s' %s", path, name,
						t ? "has another dtype or size than the model's"
						  : "is missing");
				goto out;
			}
			memcpy(k ? opt->v[i] : opt->m[i], t->data, t->nbytes);
		}
	}
	opt->step = meta->step;
out:
	cJSON_Delete(mj);
	ms_st_close(f);
	ms_free(text);
	ms_free(name);
	ms_free(path);
	return rc;
}
