/*
 * inventory_log.c: the inventory's audit log: each entry chained to the
 * one before by hash, appended in the transaction of the change it
 * describes, and read back and verified (ms_inv_log, ms_inv_log_verify).
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

/* ---- the audit log ----------------------------------------------------------- */

static int put_field(struct ms_sha256_ctx *c, const char *s)
{
	char len[32];
	size_t n = strlen(s);
	int k = snprintf(len, sizeof(len), "%zu:", n);

	if (ms_sha256_update(c, len, (size_t)k) || ms_sha256_update(c, s, n) ||
	    ms_sha256_update(c, "\n", 1))
		return MS_EIO;
	return MS_OK;
}

int ms_inv_log_hash(const struct ms_inv_log_entry *e, char out[65])
{
	struct ms_sha256_ctx *c = ms_sha256_new();
	char seq[32];
	uint8_t d[MS_SHA256_LEN];
	const char *fields[10];
	int rc = MS_OK;

	if (!c)
		return MS_ENOMEM;
	snprintf(seq, sizeof(seq), "%lld", (long long)e->seq);
	fields[0] = e->prev_hash;
	fields[1] = seq;
	fields[2] = e->at;
	fields[3] = e->user;
	fields[4] = e->host;
	fields[5] = e->tool;
	fields[6] = e->argv;
	fields[7] = e->action;
	fields[8] = e->subject;
	fields[9] = e->detail;
	rc = ms_sha256_update(c, "msinv-log-v1\n", 13);
	for (int i = 0; rc == MS_OK && i < 10; i++)
		rc = put_field(c, fields[i] ? fields[i] : "");
	/* entries written before the inventory recorded a working directory
	 * have none, and hash as they always did */
	if (rc == MS_OK && e->cwd)
		rc = put_field(c, e->cwd);
	if (rc == MS_OK)
		rc = ms_sha256_final(c, d);
	ms_sha256_free(c);
	if (rc == MS_OK)
		ms_hex(d, MS_SHA256_LEN, out);
	return rc;
}

/* Append one entry; the caller holds the write transaction. detail is a
 * JSON text (NULL: {}). */
static int log_append(struct ms_inv *inv, const char *action, const char *subject,
		      const char *detail, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_log_entry e = {0};
	char at[ISO_LEN], prev[65], hash[65];
	int rc;

	if ((rc = inv_prep(inv, "SELECT seq, hash FROM log_head WHERE one = 1", &st, err)) != MS_OK)
		return rc;
	if (sqlite3_step(st) != SQLITE_ROW || sqlite3_column_bytes(st, 1) != 64) {
		rc = ms_err_set(err, MS_EDB, "'%s': the audit log head is missing or malformed",
				inv->path);
		goto out;
	}
	e.seq = sqlite3_column_int64(st, 0) + 1;
	memcpy(prev, sqlite3_column_text(st, 1), 64);
	prev[64] = 0;
	sqlite3_finalize(st);
	st = NULL;
	inv_now_iso(at);
	e.at = at;
	e.user = inv->user;
	e.host = inv->host;
	e.tool = inv->tool;
	e.argv = inv->argv_json;
	e.cwd = inv->cwd;
	e.action = action;
	e.subject = subject ? subject : "";
	e.detail = detail ? detail : "{}";
	e.prev_hash = prev;
	if ((rc = ms_inv_log_hash(&e, hash)) != MS_OK) {
		rc = ms_sha256_err(err, rc);
		goto out;
	}
	if ((rc = inv_prep(inv,
		           "INSERT INTO log (seq, at, user, host, tool, argv, action, subject, detail, prev_hash, hash, cwd) "
		           "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", &st, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, e.seq);
	inv_bind_text(st, 2, e.at);
	inv_bind_text(st, 3, e.user);
	inv_bind_text(st, 4, e.host);
	inv_bind_text(st, 5, e.tool);
	inv_bind_text(st, 6, e.argv);
	inv_bind_text(st, 7, e.action);
	inv_bind_text(st, 8, e.subject);
	inv_bind_text(st, 9, e.detail);
	inv_bind_text(st, 10, prev);
	inv_bind_text(st, 11, hash);
	inv_bind_text(st, 12, e.cwd);
	if (sqlite3_step(st) != SQLITE_DONE) {
		rc = inv_db_fail(inv, err, "cannot append to the audit log");
		goto out;
	}
	sqlite3_finalize(st);
	if ((rc = inv_prep(inv, "UPDATE log_head SET seq = ?, hash = ? WHERE one = 1", &st, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, e.seq);
	inv_bind_text(st, 2, hash);
	if (sqlite3_step(st) != SQLITE_DONE || sqlite3_changes(inv->db) != 1)
		rc = inv_db_fail(inv, err, "cannot update the audit log head");
out:
	sqlite3_finalize(st);
	return rc;
}

/* log_append with a cJSON detail object (consumed), built inside the
 * transaction: the details are built without checking each member, and an
 * entry of the log must not be recorded short of one (nor must a record
 * whose parameters a caller built since its batch began). */
int inv_log_json(struct ms_inv *inv, const char *action, const char *subject, cJSON *detail,
		   struct ms_err *err)
{
	char *s = inv_json_take(detail);
	int rc;

	if (!s || ms_json_failed(inv->json_mark)) {
		ms_free(s);
		return inv_oom(err);
	}
	rc = log_append(inv, action, subject, s, err);
	ms_free(s);
	return rc;
}

/* ---- the audit log --------------------------------------------------------------------------- */

static void log_row(sqlite3_stmt *st, struct ms_inv_log_entry *e)
{
	e->seq = sqlite3_column_int64(st, 0);
	e->at = inv_col_str(st, 1);
	e->user = inv_col_str(st, 2);
	e->host = inv_col_str(st, 3);
	e->tool = inv_col_str(st, 4);
	e->argv = inv_col_str(st, 5);
	e->action = inv_col_str(st, 6);
	e->subject = inv_col_str(st, 7);
	e->detail = inv_col_str(st, 8);
	e->prev_hash = inv_col_str(st, 9);
	e->hash = inv_col_str(st, 10);
	e->cwd = sqlite3_column_type(st, 11) == SQLITE_NULL ? NULL : inv_col_str(st, 11);
}

#define LOG_SELECT                                                                         \
	"SELECT seq, at, user, host, tool, argv, action, subject, detail, prev_hash, hash, " \
	"cwd FROM log ORDER BY seq"

int ms_inv_log_each(struct ms_inv *inv, int (*fn)(const struct ms_inv_log_entry *e, void *ctx),
		    void *ctx, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = inv_prep(inv, LOG_SELECT, &st, err)) != MS_OK)
		return rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct ms_inv_log_entry e;
		int r;

		log_row(st, &e);
		if ((r = fn(&e, ctx)) != 0) {
			sqlite3_finalize(st);
			return r;
		}
	}
	sqlite3_finalize(st);
	return rc == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot read the audit log");
}

int ms_inv_log_check(struct ms_inv *inv, int64_t *nout, char head[65], struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	char prev[65] = ZERO_HASH, hash[65];
	int64_t expect = 1, hseq;
	int rc;

	if ((rc = inv_prep(inv, LOG_SELECT, &st, err)) != MS_OK)
		return rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct ms_inv_log_entry e;

		log_row(st, &e);
		if (e.seq != expect) {
			rc = ms_err_set(err, MS_ECHECK,
					e.seq > expect ?
					"log entry %lld is missing (the next is %lld): entries were removed" :
					"log entry %lld is out of sequence (found %lld)",
					(long long)expect, (long long)e.seq);
			goto out;
		}
		if (strcmp(e.prev_hash, prev)) {
			rc = ms_err_set(err, MS_ECHECK,
					"log entry %lld does not follow entry %lld: entries were edited, removed or reordered",
					(long long)e.seq, (long long)e.seq - 1);
			goto out;
		}
		if ((rc = ms_inv_log_hash(&e, hash)) != MS_OK) {
			rc = ms_sha256_err(err, rc);
			goto out;
		}
		if (strcmp(hash, e.hash)) {
			rc = ms_err_set(err, MS_ECHECK,
					"log entry %lld was edited: its hash does not match its fields",
					(long long)e.seq);
			goto out;
		}
		memcpy(prev, hash, sizeof(prev));
		expect++;
	}
	if (rc != SQLITE_DONE) {
		rc = inv_db_fail(inv, err, "cannot read the audit log");
		goto out;
	}
	sqlite3_finalize(st);
	st = NULL;
	if ((rc = inv_prep(inv, "SELECT seq, hash FROM log_head WHERE one = 1", &st, err)) != MS_OK)
		return rc;
	if (sqlite3_step(st) != SQLITE_ROW) {
		rc = ms_err_set(err, MS_ECHECK, "the log head is missing");
		goto out;
	}
	hseq = sqlite3_column_int64(st, 0);
	if (hseq != expect - 1) {
		rc = ms_err_set(err, MS_ECHECK,
				hseq > expect - 1 ?
				"the log ends at entry %lld but its head records entry %lld: the newest entries were removed" :
				"the log ends at entry %lld but its head records entry %lld: the head was edited",
				(long long)(expect - 1), (long long)hseq);
		goto out;
	}
	if (strcmp(inv_col_str(st, 1), prev)) {
		rc = ms_err_set(err, MS_ECHECK,
				"the log head does not match entry %lld: the entry or the head was edited",
				(long long)(expect - 1));
		goto out;
	}
	if (nout)
		*nout = expect - 1;
	if (head)
		memcpy(head, prev, 65);
	rc = MS_OK;
out:
	sqlite3_finalize(st);
	return rc;
}
