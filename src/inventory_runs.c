/*
 * inventory_runs.c: what happened to states: verifications, runs and
 * events, and the Merkle trees recorded for them.
 */
#include "inventory_int.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sqlite3.h>

#include "fsutil.h"
#include "hash.h"
#include "names.h"

/* ---- verifications, runs, events --------------------------------------------------------- */

int ms_inv_record_verification(struct ms_inv *inv, const char *digest, enum ms_inv_result result,
			       uint64_t nbytes, double seconds, const char *detail,
			       struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	char at[ISO_LEN];
	int64_t sid;
	int rc;

	if ((unsigned)result > MS_INV_RESULT_ERROR || !(seconds >= 0) || nbytes > INT64_MAX)
		return ms_err_set(err, MS_EINVAL, "bad verification record");
	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
		return rc;
	sid = inv_state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		goto out;
	inv_now_iso(at);
	if ((rc = inv_prep(inv, "INSERT INTO verifications (state_id, at, host, user, tool, result, nbytes, "
			        "seconds, detail) VALUES (?,?,?,?,?,?,?,?,?)", &st, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, sid);
	inv_bind_text(st, 2, at);
	inv_bind_text(st, 3, inv->host);
	inv_bind_text(st, 4, inv->user);
	inv_bind_text(st, 5, inv->tool);
	inv_bind_text(st, 6, ms_inv_result_name(result));
	sqlite3_bind_int64(st, 7, (int64_t)nbytes);
	sqlite3_bind_double(st, 8, seconds);
	inv_bind_text(st, 9, detail);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot record a verification");
	sqlite3_finalize(st);
	if (rc == MS_OK) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddStringToObject(d, "result", ms_inv_result_name(result));
		cJSON_AddNumberToObject(d, "bytes", (double)nbytes);
		cJSON_AddNumberToObject(d, "seconds", seconds);
		if (detail)
			cJSON_AddStringToObject(d, "detail", detail);
		rc = inv_log_json(inv, "verify", digest, d, err);
	}
	if (rc == MS_OK)
		return inv_tx_commit(inv, err);
out:
	inv_tx_rollback(inv);
	return rc;
}

int ms_inv_record_trees(struct ms_inv *inv, const char *state, const struct ms_tree_rec *recs,
			size_t n, const char *source, size_t *added, struct ms_err *err)
{
	char at[ISO_LEN];
	size_t k = 0;
	int rc;

	if (added)
		*added = 0;
	if (!source || (strcmp(source, "verify") && strcmp(source, "load") && strcmp(source, "add")))
		return ms_err_set(err, MS_EINVAL, "bad tree digest source");
	if (!n)
		return MS_OK;
	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
		return rc;
	inv_now_iso(at);
	if ((rc = inv_put_trees(inv, recs, n, source, at, &k, err)) != MS_OK)
		goto out;
	if (k && (rc = inv_log_trees(inv, state, source, k, err)) != MS_OK)
		goto out;
	if ((rc = inv_tx_commit(inv, err)) != MS_OK)
		return rc;
	if (added)
		*added = k;
	return MS_OK;
out:
	inv_tx_rollback(inv);
	return rc;
}

void ms_inv_verifications_free(struct ms_inv_verification *v, size_t n)
{
	for (size_t i = 0; v && i < n; i++) {
		ms_free(v[i].at);
		ms_free(v[i].host);
		ms_free(v[i].user);
		ms_free(v[i].tool);
		ms_free(v[i].detail);
	}
	ms_free(v);
}

static int verification_row(struct ms_inv *inv, sqlite3_stmt *st, void *e,
			    struct ms_err *err)
{
	struct ms_inv_verification *v = e;
	int bad = 0;

	(void)inv;
	v->at = inv_col_dup(st, 0, &bad);
	v->host = inv_col_dup(st, 1, &bad);
	v->user = inv_col_dup(st, 2, &bad);
	v->tool = inv_col_dup(st, 3, &bad);
	inv_result_parse(inv_col_str(st, 4), &v->result);
	v->nbytes = (uint64_t)sqlite3_column_int64(st, 5);
	v->seconds = sqlite3_column_double(st, 6);
	v->detail = inv_col_dup(st, 7, &bad);
	return bad ? inv_oom(err) : MS_OK;
}

int ms_inv_verifications(struct ms_inv *inv, const char *digest, struct ms_inv_verification **out,
			 size_t *n, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_verification *a = NULL;
	size_t k = 0;
	int64_t sid;
	int rc;

	*out = NULL;
	*n = 0;
	sid = inv_state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		return rc;
	if ((rc = inv_prep(inv, "SELECT at, host, user, tool, result, nbytes, seconds, detail FROM "
			        "verifications WHERE state_id = ? ORDER BY id DESC", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	rc = inv_rows(inv, st, sizeof(*a), verification_row, "cannot read verifications", (void **)&a, &k, err);
	if (rc != MS_OK) {
		ms_inv_verifications_free(a, k);
		return rc;
	}
	*out = a;
	*n = k;
	return MS_OK;
}

int ms_inv_run_begin(struct ms_inv *inv, const char *plan_digest,
		     const struct ms_inv_run_input *inputs, size_t n, int64_t *run_id,
		     struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	cJSON *d = NULL, *in = NULL;
	char at[ISO_LEN];
	int64_t rid;
	int rc;

	if (!plan_digest || !*plan_digest)
		return ms_err_set(err, MS_EINVAL, "a run needs its plan digest");
	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
		return rc;
	inv_now_iso(at);
	if ((rc = inv_prep(inv, "INSERT INTO runs (plan_digest, status, started_at, tool, argv, user, host) "
			        "VALUES (?, 'running', ?, ?, ?, ?, ?)", &st, err)) != MS_OK)
		goto out;
	inv_bind_text(st, 1, plan_digest);
	inv_bind_text(st, 2, at);
	inv_bind_text(st, 3, inv->tool);
	inv_bind_text(st, 4, inv->argv_json);
	inv_bind_text(st, 5, inv->user);
	inv_bind_text(st, 6, inv->host);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot record a run");
	sqlite3_finalize(st);
	st = NULL;
	if (rc != MS_OK)
		goto out;
	rid = sqlite3_last_insert_rowid(inv->db);
	d = cJSON_CreateObject();
	cJSON_AddStringToObject(d, "plan", plan_digest);
	in = cJSON_AddArrayToObject(d, "inputs");
	if ((rc = inv_prep(inv, "INSERT INTO run_inputs (run_id, digest, state_id, role) VALUES (?,?,?,?)",
		           &st, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < n; i++) {
		int64_t sid = inv_state_id_of(inv, inputs[i].digest, err, &rc);
		cJSON *o;

		if (rc != MS_OK)
			goto out;
		sqlite3_reset(st);
		sqlite3_bind_int64(st, 1, rid);
		inv_bind_text(st, 2, inputs[i].digest);
		sqlite3_bind_int64(st, 3, sid);
		inv_bind_text(st, 4, inputs[i].role);
		if (sqlite3_step(st) != SQLITE_DONE) {
			rc = inv_db_fail(inv, err, "cannot record a run input");
			goto out;
		}
		o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "state", inputs[i].digest);
		if (inputs[i].role)
			cJSON_AddStringToObject(o, "role", inputs[i].role);
		inv_json_push(in, o);
	}
	sqlite3_finalize(st);
	st = NULL;
	{
		char subj[32];

		snprintf(subj, sizeof(subj), "run %lld", (long long)rid);
		rc = inv_log_json(inv, "run_begin", subj, d, err);
		d = NULL;
		if (rc != MS_OK)
			goto out;
	}
	if ((rc = inv_tx_commit(inv, err)) == MS_OK)
		*run_id = rid;
	return rc;
out:
	cJSON_Delete(d);
	sqlite3_finalize(st);
	inv_tx_rollback(inv);
	return rc;
}

int ms_inv_run_end(struct ms_inv *inv, int64_t run_id, int exit_code, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	char at[ISO_LEN], subj[32];
	int running = 0, rc;

	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
		return rc;
	if ((rc = inv_run_exists(inv, run_id, &running, err)) != MS_OK)
		goto out;
	if (!running) {
		rc = ms_err_set(err, MS_EINVAL, "run %lld has already ended", (long long)run_id);
		goto out;
	}
	inv_now_iso(at);
	if ((rc = inv_prep(inv, "UPDATE runs SET status = ?, exit_code = ?, ended_at = ? WHERE id = ?", &st,
		           err)) != MS_OK)
		goto out;
	inv_bind_text(st, 1, exit_code == 0 ? "ok" : "failed");
	sqlite3_bind_int(st, 2, exit_code);
	inv_bind_text(st, 3, at);
	sqlite3_bind_int64(st, 4, run_id);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot end a run");
	sqlite3_finalize(st);
	if (rc == MS_OK) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddStringToObject(d, "status", exit_code == 0 ? "ok" : "failed");
		cJSON_AddNumberToObject(d, "exit_code", exit_code);
		snprintf(subj, sizeof(subj), "run %lld", (long long)run_id);
		rc = inv_log_json(inv, "run_end", subj, d, err);
	}
	if (rc == MS_OK)
		return inv_tx_commit(inv, err);
out:
	inv_tx_rollback(inv);
	return rc;
}

int ms_inv_run_output(struct ms_inv *inv, int64_t run_id, const char *digest, struct ms_err *err)
{
	int64_t sid;
	int rc;

	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
		return rc;
	sid = inv_state_id_of(inv, digest, err, &rc);
	if (rc == MS_OK)
		rc = inv_run_output_locked(inv, run_id, digest, sid, err);
	if (rc == MS_OK)
		return inv_tx_commit(inv, err);
	inv_tx_rollback(inv);
	return rc;
}

void ms_inv_runs_free(struct ms_inv_run *r, size_t n)
{
	for (size_t i = 0; r && i < n; i++) {
		ms_free(r[i].plan_digest);
		ms_free(r[i].status);
		ms_free(r[i].started_at);
		ms_free(r[i].ended_at);
		ms_free(r[i].role);
		ms_free(r[i].user);
		ms_free(r[i].host);
	}
	ms_free(r);
}

int ms_inv_run_get(struct ms_inv *inv, int64_t run_id, struct ms_inv_run **out,
		   struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_run *a = NULL;
	int rc, bad = 0;

	*out = NULL;
	if ((rc = inv_prep(inv, "SELECT id, plan_digest, status, started_at, ended_at, exit_code, "
		           "user, host FROM runs WHERE id = ?", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, run_id);
	rc = sqlite3_step(st);
	if (rc == SQLITE_DONE) {
		rc = ms_err_set(err, MS_ENOTFOUND, "no run %lld in '%s'", (long long)run_id,
				inv->path);
		goto out;
	}
	if (rc != SQLITE_ROW) {
		rc = inv_db_fail(inv, err, "cannot read runs");
		goto out;
	}
	if (!(a = ms_calloc(1, sizeof(*a)))) {
		rc = inv_oom(err);
		goto out;
	}
	a->id = sqlite3_column_int64(st, 0);
	a->plan_digest = inv_col_dup(st, 1, &bad);
	a->status = inv_col_dup(st, 2, &bad);
	a->started_at = inv_col_dup(st, 3, &bad);
	a->ended_at = inv_col_dup(st, 4, &bad);
	a->has_exit_code = sqlite3_column_type(st, 5) != SQLITE_NULL;
	a->exit_code = sqlite3_column_int(st, 5);
	a->user = inv_col_dup(st, 6, &bad);
	a->host = inv_col_dup(st, 7, &bad);
	rc = bad ? inv_oom(err) : MS_OK;
out:
	sqlite3_finalize(st);
	if (rc != MS_OK) {
		ms_inv_runs_free(a, a ? 1 : 0);
		return rc;
	}
	*out = a;
	return MS_OK;
}

void ms_inv_events_free(struct ms_inv_event *e, size_t n)
{
	for (size_t i = 0; e && i < n; i++) {
		ms_free(e[i].at);
		ms_free(e[i].kind);
		ms_free(e[i].data);
	}
	ms_free(e);
}

static int event_row(struct ms_inv *inv, sqlite3_stmt *st, void *e, struct ms_err *err)
{
	struct ms_inv_event *v = e;
	int bad = 0;

	(void)inv;
	v->id = sqlite3_column_int64(st, 0);
	v->at = inv_col_dup(st, 1, &bad);
	v->kind = inv_col_dup(st, 2, &bad);
	v->data = inv_col_dup(st, 3, &bad);
	return bad ? inv_oom(err) : MS_OK;
}

int ms_inv_run_events(struct ms_inv *inv, int64_t run_id, struct ms_inv_event **out, size_t *n,
		      struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_event *a = NULL;
	size_t k = 0;
	int rc;

	*out = NULL;
	*n = 0;
	if ((rc = inv_prep(inv, "SELECT id, at, kind, data FROM events WHERE run_id = ? ORDER BY id",
		           &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, run_id);
	rc = inv_rows(inv, st, sizeof(*a), event_row, "cannot read events", (void **)&a, &k, err);
	if (rc != MS_OK) {
		ms_inv_events_free(a, k);
		return rc;
	}
	*out = a;
	*n = k;
	return MS_OK;
}

static int run_row(struct ms_inv *inv, sqlite3_stmt *st, void *e, struct ms_err *err)
{
	struct ms_inv_run *r = e;
	int bad = 0;

	(void)inv;
	r->id = sqlite3_column_int64(st, 0);
	r->plan_digest = inv_col_dup(st, 1, &bad);
	r->status = inv_col_dup(st, 2, &bad);
	r->started_at = inv_col_dup(st, 3, &bad);
	r->ended_at = inv_col_dup(st, 4, &bad);
	r->has_exit_code = sqlite3_column_type(st, 5) != SQLITE_NULL;
	r->exit_code = sqlite3_column_int(st, 5);
	r->role = inv_col_dup(st, 6, &bad);
	r->user = inv_col_dup(st, 7, &bad);
	r->host = inv_col_dup(st, 8, &bad);
	return bad ? inv_oom(err) : MS_OK;
}

int ms_inv_state_runs(struct ms_inv *inv, const char *digest, int consumed, struct ms_inv_run **out,
		      size_t *n, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_run *a = NULL;
	size_t k = 0;
	int rc;

	*out = NULL;
	*n = 0;
	rc = inv_prep(inv, consumed ?
		      "SELECT r.id, r.plan_digest, r.status, r.started_at, r.ended_at, r.exit_code, i.role, "
		      "r.user, r.host FROM run_inputs i JOIN runs r ON r.id = i.run_id WHERE i.digest = ? "
		      "ORDER BY r.id DESC" :
		      "SELECT r.id, r.plan_digest, r.status, r.started_at, r.ended_at, r.exit_code, NULL, "
		      "r.user, r.host FROM run_outputs o JOIN runs r ON r.id = o.run_id WHERE o.digest = ? "
		      "ORDER BY r.id DESC", &st, err);
	if (rc != MS_OK)
		return rc;
	inv_bind_text(st, 1, digest);
	rc = inv_rows(inv, st, sizeof(*a), run_row, "cannot read runs", (void **)&a, &k, err);
	if (rc != MS_OK) {
		ms_inv_runs_free(a, k);
		return rc;
	}
	*out = a;
	*n = k;
	return MS_OK;
}

int ms_inv_event_add(struct ms_inv *inv, int64_t run_id, const char *kind, const char *json,
		     int64_t *event_id, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	cJSON *j = NULL, *d;
	char at[ISO_LEN], *canon = NULL, subj[32];
	int64_t eid;
	int rc, nomem = 0;

	if (!kind || !*kind || strlen(kind) > 64 || strspn(kind, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(kind))
		return ms_err_set(err, MS_EINVAL, "event kind '%s': use [a-z0-9_], 1 to 64 bytes",
				  kind ? kind : "");
	if (json && strlen(json) <= MS_INV_MAX_PARAMS &&
	    !(j = ms_json_parse(json, strlen(json), &nomem)) && nomem)
		return inv_oom(err);
	if (!cJSON_IsObject(j)) {
		cJSON_Delete(j);
		return ms_err_set(err, MS_EINVAL, "event '%s': data is not a JSON object", kind);
	}
	canon = inv_json_take(j);
	if (!canon)
		return inv_oom(err);
	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
		goto out;
	if (run_id > 0 && (rc = inv_run_exists(inv, run_id, NULL, err)) != MS_OK)
		goto out;
	inv_now_iso(at);
	if ((rc = inv_prep(inv, "INSERT INTO events (run_id, at, kind, data) VALUES (?,?,?,?)", &st,
		           err)) != MS_OK)
		goto out;
	if (run_id > 0)
		sqlite3_bind_int64(st, 1, run_id);
	else
		sqlite3_bind_null(st, 1);
	inv_bind_text(st, 2, at);
	inv_bind_text(st, 3, kind);
	inv_bind_text(st, 4, canon);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot record an event");
	sqlite3_finalize(st);
	if (rc != MS_OK)
		goto out;
	eid = sqlite3_last_insert_rowid(inv->db);
	d = cJSON_CreateObject();
	cJSON_AddNumberToObject(d, "event", (double)eid);
	cJSON_AddStringToObject(d, "kind", kind);
	if (run_id > 0)
		cJSON_AddNumberToObject(d, "run", (double)run_id);
	cJSON_AddRawToObject(d, "data", canon);
	if (run_id > 0)
		snprintf(subj, sizeof(subj), "run %lld", (long long)run_id);
	else
		snprintf(subj, sizeof(subj), "event %lld", (long long)eid);
	if ((rc = inv_log_json(inv, "event", subj, d, err)) != MS_OK)
		goto out;
	if ((rc = inv_tx_commit(inv, err)) == MS_OK && event_id)
		*event_id = eid;
	/* committed (or, in a batch, left for the batch's end): nothing to
	 * roll back, and a rollback here would take the batch with it */
	ms_free(canon);
	return rc;
out:
	inv_tx_rollback(inv);
	ms_free(canon);
	return rc;
}
