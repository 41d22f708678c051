/*
 * inventory.c: the SQLite store of weight states (contract in inventory.h,
 * tables and rules in ms(5)).
 *
 * Writers hash first, with no lock held, and then record everything in one
 * BEGIN IMMEDIATE transaction that also appends the audit log entries, so
 * the log chain is extended under the same write lock as the change it
 * describes, and a killed writer leaves the whole change or none of it.
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
#include "schema_sql.h"

/* ---- names ------------------------------------------------------------------ */

static const char *const kind_names[MS_INV_KIND_COUNT] = {
	"any", "base", "quantized", "adapter", "adapter_shard", "policy",
};

const char *ms_inv_kind_name(enum ms_inv_kind k)
{
	return (unsigned)k < MS_INV_KIND_COUNT ? kind_names[k] : "?";
}

int ms_inv_kind_parse(const char *s, enum ms_inv_kind *out)
{
	for (int k = MS_INV_KIND_BASE; k < MS_INV_KIND_COUNT; k++) {
		if (s && !strcmp(s, kind_names[k])) {
			*out = (enum ms_inv_kind)k;
			return MS_OK;
		}
	}
	return MS_EINVAL;
}

static const char *const op_names[] = {
	"quantize", "dequantize", "transpose", "split", "reshard", "merge", "train", "compose",
};

int ms_inv_op_valid(const char *op)
{
	for (size_t i = 0; op && i < sizeof(op_names) / sizeof(op_names[0]); i++)
		if (!strcmp(op, op_names[i]))
			return 1;
	return 0;
}

static const char *const result_names[] = { "ok", "mismatch", "missing", "error" };

const char *ms_inv_result_name(enum ms_inv_result r)
{
	return (unsigned)r < 4 ? result_names[r] : "?";
}

int inv_result_parse(const char *s, enum ms_inv_result *out)
{
	for (int i = 0; s && i < 4; i++) {
		if (!strcmp(s, result_names[i])) {
			*out = (enum ms_inv_result)i;
			return MS_OK;
		}
	}
	return MS_EINVAL;
}

/* ---- small helpers ------------------------------------------------------------ */

int inv_db_fail(struct ms_inv *inv, struct ms_err *err, const char *what)
{
	return ms_err_set(err, MS_EDB, "'%s': %s: %s", inv->path, what, sqlite3_errmsg(inv->db));
}

int inv_oom(struct ms_err *err)
{
	return ms_err_set(err, MS_ENOMEM, "out of memory");
}

int inv_prep(struct ms_inv *inv, const char *sql, sqlite3_stmt **st, struct ms_err *err)
{
	if (sqlite3_prepare_v2(inv->db, sql, -1, st, NULL) != SQLITE_OK) {
		*st = NULL;
		return inv_db_fail(inv, err, "cannot prepare a query");
	}
	return MS_OK;
}

int inv_exec_sql(struct ms_inv *inv, const char *sql, struct ms_err *err)
{
	if (sqlite3_exec(inv->db, sql, NULL, NULL, NULL) != SQLITE_OK)
		return inv_db_fail(inv, err, "query failed");
	return MS_OK;
}

/* A copy of a text column (NULL stays NULL); *bad set on allocation failure. */
char *inv_col_dup(sqlite3_stmt *st, int i, int *bad)
{
	const unsigned char *t = sqlite3_column_text(st, i);
	char *s;

	if (!t)
		return NULL;
	s = ms_strndup((const char *)t, (size_t)sqlite3_column_bytes(st, i));
	if (!s)
		*bad = 1;
	return s;
}

const char *inv_col_str(sqlite3_stmt *st, int i)
{
	const unsigned char *t = sqlite3_column_text(st, i);

	return t ? (const char *)t : "";
}

void inv_bind_text(sqlite3_stmt *st, int i, const char *s)
{
	if (s)
		sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
	else
		sqlite3_bind_null(st, i);
}

void inv_now_iso(char out[ISO_LEN])
{
	struct timespec ts;
	struct tm tm;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	snprintf(out, ISO_LEN, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		 (long)(ts.tv_nsec / 1000));
}

int inv_hex_ok(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isxdigit((unsigned char)s[i]))
			return 0;
	return s[n] == 0;
}

int inv_digest_from_hex(const char *hex, uint8_t out[MS_SHA256_LEN])
{
	if (!hex || strlen(hex) != 64)
		return -1;
	return ms_unhex(hex, out, MS_SHA256_LEN);
}

/* A JSON array of strings. */
char *inv_argv_to_json(int argc, char *const *argv)
{
	cJSON *a = cJSON_CreateArray();
	char *s = NULL, *out = NULL;

	if (!a)
		return NULL;
	for (int i = 0; i < argc; i++) {
		cJSON *v = cJSON_CreateString(argv[i] ? argv[i] : "");

		if (!v)
			goto out;
		cJSON_AddItemToArray(a, v);
	}
	s = cJSON_PrintUnformatted(a);
	if (s)
		out = ms_strdup(s);
out:
	cJSON_free(s);
	cJSON_Delete(a);
	return out;
}

/* cJSON_AddItemToObject and cJSON_AddItemToArray taking item in every case
 * (deleted when it cannot be added: o missing, or the key's copy failed). */
void inv_json_put(cJSON *o, const char *key, cJSON *item)
{
	if (!cJSON_AddItemToObject(o, key, item))
		cJSON_Delete(item);
}

void inv_json_push(cJSON *a, cJSON *item)
{
	if (!cJSON_AddItemToArray(a, item))
		cJSON_Delete(item);
}

/* cJSON object to a string owned by ms_malloc (NULL on allocation failure);
 * consumes o. */
char *inv_json_take(cJSON *o)
{
	char *s = o ? cJSON_PrintUnformatted(o) : NULL, *out = NULL;

	if (s)
		out = ms_strdup(s);
	cJSON_free(s);
	cJSON_Delete(o);
	return out;
}

/* ---- transactions ------------------------------------------------------------- */

static void backoff(unsigned *delay_us)
{
	unsigned d = *delay_us + (unsigned)rand() % (*delay_us + 1);

	usleep(d);
	*delay_us = *delay_us < 50000 ? *delay_us * 2 : 100000;
}

/* BEGIN IMMEDIATE takes the write lock now, so the transaction never has to
 * upgrade a read lock (which fails with SQLITE_BUSY_SNAPSHOT under WAL);
 * the busy handler waits BUSY_TIMEOUT_MS per attempt and we retry beyond. */
int inv_tx_begin(struct ms_inv *inv, struct ms_err *err)
{
	double deadline = ms_now() + BUSY_DEADLINE_S;
	unsigned delay = 1000;

	if (inv->batch) {
		if (inv->batch_failed)
			return ms_err_set(err, MS_EDB,
					  "'%s': an earlier write of this batch failed", inv->path);
		if (inv->batch_open)
			return MS_OK;
	}
	for (;;) {
		int rc = sqlite3_exec(inv->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);

		if (rc == SQLITE_OK) {
			inv->batch_open = inv->batch;
			if (!inv->batch)
				inv->json_mark = ms_json_mark();
			return MS_OK;
		}
		if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED)
			return inv_db_fail(inv, err, "cannot begin a transaction");
		if (ms_now() > deadline)
			return ms_err_set(err, MS_EDB,
					  "'%s': the inventory stayed locked by another writer for %.0f s",
					  inv->path, BUSY_DEADLINE_S);
		backoff(&delay);
	}
}

/* Inside a batch a failed write takes the whole batch with it: the batch's
 * earlier writes may be what the failed one built on. */
void inv_tx_rollback(struct ms_inv *inv)
{
	if (!sqlite3_get_autocommit(inv->db))
		sqlite3_exec(inv->db, "ROLLBACK", NULL, NULL, NULL);
	if (inv->batch && inv->batch_open) {
		inv->batch_open = 0;
		inv->batch_failed = 1;
	}
}

static int tx_commit_now(struct ms_inv *inv, struct ms_err *err);

int inv_tx_commit(struct ms_inv *inv, struct ms_err *err)
{
	if (inv->batch)
		return MS_OK;
	return tx_commit_now(inv, err);
}

static int tx_commit_now(struct ms_inv *inv, struct ms_err *err)
{
	double deadline = ms_now() + BUSY_DEADLINE_S;
	unsigned delay = 1000;

	for (;;) {
		int rc = sqlite3_exec(inv->db, "COMMIT", NULL, NULL, NULL);

		if (rc == SQLITE_OK)
			return MS_OK;
		/* A busy COMMIT leaves the transaction open: retrying is safe. */
		if (((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) &&
		    ms_now() < deadline) {
			backoff(&delay);
			continue;
		}
		rc = inv_db_fail(inv, err, "cannot commit");
		inv_tx_rollback(inv);
		return rc;
	}
}

/* ---- opening ------------------------------------------------------------------- */

int ms_inv_schema_latest(void)
{
	return NMIGRATIONS;
}

int ms_inv_schema_version(const struct ms_inv *inv)
{
	return inv->version;
}

const char *ms_inv_path(const struct ms_inv *inv)
{
	return inv->path;
}

static int pragma_int(struct ms_inv *inv, const char *sql, int64_t *out, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if (sqlite3_prepare_v2(inv->db, sql, -1, &st, NULL) != SQLITE_OK) {
		rc = sqlite3_errcode(inv->db);
		if (rc == SQLITE_NOTADB)
			return ms_err_set(err, MS_EDB, "'%s': not an inventory (not a database)",
					  inv->path);
		return inv_db_fail(inv, err, "cannot read the database header");
	}
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		int code = sqlite3_errcode(inv->db);

		sqlite3_finalize(st);
		if (code == SQLITE_NOTADB)
			return ms_err_set(err, MS_EDB, "'%s': not an inventory (not a database)",
					  inv->path);
		return inv_db_fail(inv, err, "cannot read the database header");
	}
	*out = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return MS_OK;
}

/* Retried: the first switch to WAL needs the lock another opener may hold. */
static int set_wal(struct ms_inv *inv, struct ms_err *err)
{
	double deadline = ms_now() + BUSY_DEADLINE_S;
	unsigned delay = 1000;

	for (;;) {
		sqlite3_stmt *st = NULL;
		int rc = sqlite3_prepare_v2(inv->db, "PRAGMA journal_mode = WAL", -1, &st, NULL);
		const char *mode = NULL;

		if (rc == SQLITE_OK) {
			rc = sqlite3_step(st);
			if (rc == SQLITE_ROW)
				mode = (const char *)sqlite3_column_text(st, 0);
			if (mode && !strcmp(mode, "wal")) {
				sqlite3_finalize(st);
				return MS_OK;
			}
		}
		sqlite3_finalize(st);
		rc = sqlite3_errcode(inv->db);
		if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED)
			return ms_err_set(err, MS_EDB,
					  "'%s': cannot switch to WAL journaling (%s); is it on a local disk?",
					  inv->path, mode ? mode : sqlite3_errmsg(inv->db));
		if (ms_now() > deadline)
			return ms_err_set(err, MS_EDB, "'%s': locked by another process", inv->path);
		backoff(&delay);
	}
}

static int migrate(struct ms_inv *inv, struct ms_err *err)
{
	int64_t v, app;
	int rc, from;

	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
		return rc;
	/* again under the lock: another process may have migrated meanwhile */
	if ((rc = pragma_int(inv, "PRAGMA user_version", &v, err)) != MS_OK ||
	    (rc = pragma_int(inv, "PRAGMA application_id", &app, err)) != MS_OK)
		goto out;
	if (v >= NMIGRATIONS) {
		inv->version = (int)v;
		rc = inv_tx_commit(inv, err);
		return rc;
	}
	from = (int)v;
	for (int i = from; i < NMIGRATIONS; i++) {
		char sql[96];

		if (sqlite3_exec(inv->db, ms_schema_migrations[i], NULL, NULL, NULL) != SQLITE_OK) {
			rc = ms_err_set(err, MS_EDB, "'%s': schema migration %d failed: %s", inv->path,
					i + 1, sqlite3_errmsg(inv->db));
			goto out;
		}
		snprintf(sql, sizeof(sql), "PRAGMA user_version = %d", i + 1);
		if ((rc = inv_exec_sql(inv, sql, err)) != MS_OK)
			goto out;
	}
	{
		char sql[96];

		snprintf(sql, sizeof(sql), "PRAGMA application_id = %d", MS_INV_APPLICATION_ID);
		if ((rc = inv_exec_sql(inv, sql, err)) != MS_OK)
			goto out;
	}
	{
		cJSON *d = cJSON_CreateObject();

		cJSON_AddNumberToObject(d, "from", from);
		cJSON_AddNumberToObject(d, "to", NMIGRATIONS);
		cJSON_AddStringToObject(d, "library", MS_VERSION);
		if ((rc = inv_log_json(inv, from == 0 ? "init" : "migrate", inv->path, d, err)) != MS_OK)
			goto out;
	}
	if ((rc = inv_tx_commit(inv, err)) != MS_OK)
		return rc;
	inv->version = NMIGRATIONS;
	return MS_OK;
out:
	inv_tx_rollback(inv);
	return rc;
}

/* Until ms_inv_set_origin says otherwise, records name the running program
 * and its command line, so even the log entry of the migration that
 * ms_inv_open may perform says who did it. */
static int default_origin(struct ms_inv *inv)
{
	char *text = NULL, **argv = NULL;
	size_t len = 0;
	int argc = 0, rc = MS_OK, fd;

	inv->tool = ms_strdup(program_invocation_short_name[0] ? program_invocation_short_name
								 : "libms");
	if (!inv->tool)
		return MS_ENOMEM;
	text = ms_malloc(CMDLINE_MAX + 1);
	if (!text)
		return MS_ENOMEM;
	/* /proc files report size 0: read until end of file */
	fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	while (fd >= 0 && len < CMDLINE_MAX) {
		ssize_t r = read(fd, text + len, CMDLINE_MAX - len);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	if (fd >= 0)
		close(fd);
	text[len] = 0;
	if (len) {
		argv = ms_calloc(len + 1, sizeof(*argv));
		if (!argv) {
			rc = MS_ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < len; i += strlen(text + i) + 1)
			argv[argc++] = text + i;
	}
	inv->argv_json = argc ? inv_argv_to_json(argc, argv) : ms_strdup("[]");
	if (!inv->argv_json) {
		rc = MS_ENOMEM;
		goto out;
	}
	/* the directory the argv's relative paths are relative to; a removed
	 * working directory is recorded as unknown */
	if (!(inv->cwd = ms_malloc(PATH_MAX))) {
		rc = MS_ENOMEM;
		goto out;
	}
	if (!getcwd(inv->cwd, PATH_MAX)) {
		ms_free(inv->cwd);
		inv->cwd = NULL;
	}
out:
	ms_free(argv);
	ms_free(text);
	return rc;
}

static void identify(struct ms_inv *inv)
{
	struct passwd pw, *res = NULL;
	char buf[4096];

	if (getpwuid_r(geteuid(), &pw, buf, sizeof(buf), &res) == 0 && res && res->pw_name)
		snprintf(inv->user, sizeof(inv->user), "%s", res->pw_name);
	else
		snprintf(inv->user, sizeof(inv->user), "uid%ld", (long)geteuid());
	if (gethostname(inv->host, sizeof(inv->host)) != 0)
		snprintf(inv->host, sizeof(inv->host), "unknown");
	inv->host[sizeof(inv->host) - 1] = 0;
}

int ms_inv_open(const char *path, unsigned flags, struct ms_inv **out, struct ms_err *err)
{
	struct ms_inv *inv;
	struct stat st;
	int64_t app = 0, ver = 0, ntables = 0;
	int rc, exists;

	*out = NULL;
	exists = stat(path, &st) == 0;
	if (!exists && errno != ENOENT)
		return ms_err_set(err, MS_EIO, "'%s': %s", path, strerror(errno));
	if (!exists && !(flags & MS_INV_CREATE))
		return ms_err_set(err, MS_ENOTFOUND,
				  "'%s': no inventory there (create one with 'msinv init')", path);
	if (exists && !S_ISREG(st.st_mode))
		return ms_err_set(err, MS_EINVAL, "'%s': not a regular file", path);
	inv = ms_calloc(1, sizeof(*inv));
	if (!inv || !(inv->path = ms_strdup(path)) || default_origin(inv) != MS_OK) {
		rc = inv_oom(err);
		goto out;
	}
	identify(inv);
	if (sqlite3_open_v2(path, &inv->db,
			    SQLITE_OPEN_READWRITE | ((flags & MS_INV_CREATE) ? SQLITE_OPEN_CREATE : 0),
			    NULL) != SQLITE_OK) {
		rc = ms_err_set(err, MS_EDB, "'%s': cannot open: %s", path,
				inv->db ? sqlite3_errmsg(inv->db) : "out of memory");
		goto out;
	}
	sqlite3_extended_result_codes(inv->db, 1);
	sqlite3_busy_timeout(inv->db, BUSY_TIMEOUT_MS);
	if ((rc = pragma_int(inv, "PRAGMA application_id", &app, err)) != MS_OK ||
	    (rc = pragma_int(inv, "PRAGMA user_version", &ver, err)) != MS_OK ||
	    (rc = pragma_int(inv, "SELECT count(*) FROM sqlite_master", &ntables, err)) != MS_OK)
		goto out;
	if (app != MS_INV_APPLICATION_ID && !(app == 0 && ver == 0 && ntables == 0)) {
		rc = ms_err_set(err, MS_EDB, "'%s': not an inventory (application id %lld)", path,
				(long long)app);
		goto out;
	}
	if (ntables == 0 && !(flags & MS_INV_CREATE)) {
		rc = ms_err_set(err, MS_ENOTFOUND,
				"'%s': no inventory there (create one with 'msinv init')", path);
		goto out;
	}
	if (ver > NMIGRATIONS) {
		rc = ms_err_set(err, MS_EDB,
				"'%s': inventory schema version %lld is newer than this build knows (%d); use a newer msinv",
				path, (long long)ver, NMIGRATIONS);
		goto out;
	}
	inv->version = (int)ver;
	if ((rc = inv_exec_sql(inv, "PRAGMA foreign_keys = ON", err)) != MS_OK ||
	    (rc = inv_exec_sql(inv, "PRAGMA synchronous = FULL", err)) != MS_OK ||
	    (rc = set_wal(inv, err)) != MS_OK)
		goto out;
	if (ver < NMIGRATIONS && (rc = migrate(inv, err)) != MS_OK)
		goto out;
	rc = MS_OK;
out:
	if (rc != MS_OK) {
		ms_inv_close(inv);
		return rc;
	}
	*out = inv;
	return MS_OK;
}

int ms_inv_batch_begin(struct ms_inv *inv, struct ms_err *err)
{
	if (inv->batch)
		return ms_err_set(err, MS_EINVAL, "'%s': a batch is already open", inv->path);
	inv->batch = 1;
	inv->batch_open = inv->batch_failed = 0;
	inv->json_mark = ms_json_mark();
	return MS_OK;
}

int ms_inv_batch_end(struct ms_inv *inv, int commit, struct ms_err *err)
{
	int rc = MS_OK;

	if (!inv->batch)
		return commit ? ms_err_set(err, MS_EINVAL, "'%s': no batch is open", inv->path)
			      : MS_OK;
	inv->batch = 0;
	if (commit && inv->batch_failed)
		rc = ms_err_set(err, MS_EDB, "'%s': a write of this batch failed; nothing recorded",
				inv->path);
	else if (commit && inv->batch_open)
		rc = tx_commit_now(inv, err);
	else if (inv->batch_open && !sqlite3_get_autocommit(inv->db))
		sqlite3_exec(inv->db, "ROLLBACK", NULL, NULL, NULL);
	inv->batch_open = inv->batch_failed = 0;
	return rc;
}

void ms_inv_close(struct ms_inv *inv)
{
	if (!inv)
		return;
	/* an open batch is abandoned: nothing of it is recorded */
	if (inv->db && inv->batch)
		(void)ms_inv_batch_end(inv, 0, NULL);
	if (inv->db)
		sqlite3_close_v2(inv->db);
	ms_free(inv->path);
	ms_free(inv->tool);
	ms_free(inv->argv_json);
	ms_free(inv->cwd);
	ms_free(inv);
}

void ms_inv_set_progress(struct ms_inv *inv, const struct ms_progress *progress)
{
	if (progress)
		inv->progress = *progress;
	else
		memset(&inv->progress, 0, sizeof(inv->progress));
}

const struct ms_progress *ms_inv_progress(const struct ms_inv *inv)
{
	return inv && inv->progress.fn ? &inv->progress : NULL;
}

int ms_inv_set_origin(struct ms_inv *inv, const char *tool, int argc, char *const *argv,
		      struct ms_err *err)
{
	char *t = ms_strdup(tool ? tool : "libms");
	char *a = inv_argv_to_json(argc, argv);

	if (!t || !a) {
		ms_free(t);
		ms_free(a);
		return inv_oom(err);
	}
	ms_free(inv->tool);
	ms_free(inv->argv_json);
	inv->tool = t;
	inv->argv_json = a;
	return MS_OK;
}
