/*
 * inventory.c: the SQLite store of weight states (contract in inventory.h,
 * tables and rules in ms(5)).
 *
 * Writers hash first, with no lock held, and then record everything in one
 * BEGIN IMMEDIATE transaction that also appends the audit log entries, so
 * the log chain is extended under the same write lock as the change it
 * describes, and a killed writer leaves the whole change or none of it.
 */
#include "inventory.h"

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

/* MS_TREE_LOG2 as SQL text */
#define TREE_LOG2_TEXT_(x) #x
#define TREE_LOG2_TEXT_X(x) TREE_LOG2_TEXT_(x)
#define TREE_LOG2_TEXT TREE_LOG2_TEXT_X(MS_TREE_LOG2)
#define NMIGRATIONS ((int)(sizeof(ms_schema_migrations) / sizeof(ms_schema_migrations[0])))
#define BUSY_TIMEOUT_MS 10000
#define BUSY_DEADLINE_S 300.0
#define ISO_LEN 64
#define CMDLINE_MAX 65536
#define ZERO_HASH "0000000000000000000000000000000000000000000000000000000000000000"

struct ms_inv {
	sqlite3 *db;
	char *path;
	int version;
	char *tool;
	char *argv_json;
	char *cwd;            /* the working directory at open; NULL: unknown */
	struct ms_progress progress;  /* fn NULL: none (ms_inv_set_progress) */
	char user[256];
	char host[256];
	/* ms_inv_batch_begin: the writes that follow share one transaction,
	 * begun by the first of them, ended by ms_inv_batch_end */
	int batch;
	int batch_open;   /* BEGIN IMMEDIATE done */
	int batch_failed; /* a write in the batch failed and rolled all back */
	/* cJSON's failures when the transaction (or the batch) began: what
	 * is recorded since, an audit log detail or a caller's parameters
	 * built with unchecked additions, may be short if that count moved
	 * (log_json) */
	uint64_t json_mark;
};

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

static int result_parse(const char *s, enum ms_inv_result *out)
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

static int db_fail(struct ms_inv *inv, struct ms_err *err, const char *what)
{
	return ms_err_set(err, MS_EDB, "'%s': %s: %s", inv->path, what, sqlite3_errmsg(inv->db));
}

static int oom(struct ms_err *err)
{
	return ms_err_set(err, MS_ENOMEM, "out of memory");
}

static int prep(struct ms_inv *inv, const char *sql, sqlite3_stmt **st, struct ms_err *err)
{
	if (sqlite3_prepare_v2(inv->db, sql, -1, st, NULL) != SQLITE_OK) {
		*st = NULL;
		return db_fail(inv, err, "cannot prepare a query");
	}
	return MS_OK;
}

static int exec_sql(struct ms_inv *inv, const char *sql, struct ms_err *err)
{
	if (sqlite3_exec(inv->db, sql, NULL, NULL, NULL) != SQLITE_OK)
		return db_fail(inv, err, "query failed");
	return MS_OK;
}

/* A copy of a text column (NULL stays NULL); *bad set on allocation failure. */
static char *col_dup(sqlite3_stmt *st, int i, int *bad)
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

static const char *col_str(sqlite3_stmt *st, int i)
{
	const unsigned char *t = sqlite3_column_text(st, i);

	return t ? (const char *)t : "";
}

static void bind_text(sqlite3_stmt *st, int i, const char *s)
{
	if (s)
		sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
	else
		sqlite3_bind_null(st, i);
}

static void now_iso(char out[ISO_LEN])
{
	struct timespec ts;
	struct tm tm;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	snprintf(out, ISO_LEN, "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		 (long)(ts.tv_nsec / 1000));
}

static int hex_ok(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isxdigit((unsigned char)s[i]))
			return 0;
	return s[n] == 0;
}

static int digest_from_hex(const char *hex, uint8_t out[MS_SHA256_LEN])
{
	if (!hex || strlen(hex) != 64)
		return -1;
	return ms_unhex(hex, out, MS_SHA256_LEN);
}

/* A JSON array of strings. */
static char *argv_to_json(int argc, char *const *argv)
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
static void json_put(cJSON *o, const char *key, cJSON *item)
{
	if (!cJSON_AddItemToObject(o, key, item))
		cJSON_Delete(item);
}

static void json_push(cJSON *a, cJSON *item)
{
	if (!cJSON_AddItemToArray(a, item))
		cJSON_Delete(item);
}

/* cJSON object to a string owned by ms_malloc (NULL on allocation failure);
 * consumes o. */
static char *json_take(cJSON *o)
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
static int tx_begin(struct ms_inv *inv, struct ms_err *err)
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
			return db_fail(inv, err, "cannot begin a transaction");
		if (ms_now() > deadline)
			return ms_err_set(err, MS_EDB,
					  "'%s': the inventory stayed locked by another writer for %.0f s",
					  inv->path, BUSY_DEADLINE_S);
		backoff(&delay);
	}
}

/* Inside a batch a failed write takes the whole batch with it: the batch's
 * earlier writes may be what the failed one built on. */
static void tx_rollback(struct ms_inv *inv)
{
	if (!sqlite3_get_autocommit(inv->db))
		sqlite3_exec(inv->db, "ROLLBACK", NULL, NULL, NULL);
	if (inv->batch && inv->batch_open) {
		inv->batch_open = 0;
		inv->batch_failed = 1;
	}
}

static int tx_commit_now(struct ms_inv *inv, struct ms_err *err);

static int tx_commit(struct ms_inv *inv, struct ms_err *err)
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
		rc = db_fail(inv, err, "cannot commit");
		tx_rollback(inv);
		return rc;
	}
}

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

	if ((rc = prep(inv, "SELECT seq, hash FROM log_head WHERE one = 1", &st, err)) != MS_OK)
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
	now_iso(at);
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
	if ((rc = prep(inv,
		       "INSERT INTO log (seq, at, user, host, tool, argv, action, subject, detail, prev_hash, hash, cwd) "
		       "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", &st, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, e.seq);
	bind_text(st, 2, e.at);
	bind_text(st, 3, e.user);
	bind_text(st, 4, e.host);
	bind_text(st, 5, e.tool);
	bind_text(st, 6, e.argv);
	bind_text(st, 7, e.action);
	bind_text(st, 8, e.subject);
	bind_text(st, 9, e.detail);
	bind_text(st, 10, prev);
	bind_text(st, 11, hash);
	bind_text(st, 12, e.cwd);
	if (sqlite3_step(st) != SQLITE_DONE) {
		rc = db_fail(inv, err, "cannot append to the audit log");
		goto out;
	}
	sqlite3_finalize(st);
	if ((rc = prep(inv, "UPDATE log_head SET seq = ?, hash = ? WHERE one = 1", &st, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, e.seq);
	bind_text(st, 2, hash);
	if (sqlite3_step(st) != SQLITE_DONE || sqlite3_changes(inv->db) != 1)
		rc = db_fail(inv, err, "cannot update the audit log head");
out:
	sqlite3_finalize(st);
	return rc;
}

/* log_append with a cJSON detail object (consumed), built inside the
 * transaction: the details are built without checking each member, and an
 * entry of the log must not be recorded short of one (nor must a record
 * whose parameters a caller built since its batch began). */
static int log_json(struct ms_inv *inv, const char *action, const char *subject, cJSON *detail,
		    struct ms_err *err)
{
	char *s = json_take(detail);
	int rc;

	if (!s || ms_json_failed(inv->json_mark)) {
		ms_free(s);
		return oom(err);
	}
	rc = log_append(inv, action, subject, s, err);
	ms_free(s);
	return rc;
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
		return db_fail(inv, err, "cannot read the database header");
	}
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		int code = sqlite3_errcode(inv->db);

		sqlite3_finalize(st);
		if (code == SQLITE_NOTADB)
			return ms_err_set(err, MS_EDB, "'%s': not an inventory (not a database)",
					  inv->path);
		return db_fail(inv, err, "cannot read the database header");
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

	if ((rc = tx_begin(inv, err)) != MS_OK)
		return rc;
	/* again under the lock: another process may have migrated meanwhile */
	if ((rc = pragma_int(inv, "PRAGMA user_version", &v, err)) != MS_OK ||
	    (rc = pragma_int(inv, "PRAGMA application_id", &app, err)) != MS_OK)
		goto out;
	if (v >= NMIGRATIONS) {
		inv->version = (int)v;
		rc = tx_commit(inv, err);
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
		if ((rc = exec_sql(inv, sql, err)) != MS_OK)
			goto out;
	}
	{
		char sql[96];

		snprintf(sql, sizeof(sql), "PRAGMA application_id = %d", MS_INV_APPLICATION_ID);
		if ((rc = exec_sql(inv, sql, err)) != MS_OK)
			goto out;
	}
	{
		cJSON *d = cJSON_CreateObject();

		cJSON_AddNumberToObject(d, "from", from);
		cJSON_AddNumberToObject(d, "to", NMIGRATIONS);
		cJSON_AddStringToObject(d, "library", MS_VERSION);
		if ((rc = log_json(inv, from == 0 ? "init" : "migrate", inv->path, d, err)) != MS_OK)
			goto out;
	}
	if ((rc = tx_commit(inv, err)) != MS_OK)
		return rc;
	inv->version = NMIGRATIONS;
	return MS_OK;
out:
	tx_rollback(inv);
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
	inv->argv_json = argc ? argv_to_json(argc, argv) : ms_strdup("[]");
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
		rc = oom(err);
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
	if ((rc = exec_sql(inv, "PRAGMA foreign_keys = ON", err)) != MS_OK ||
	    (rc = exec_sql(inv, "PRAGMA synchronous = FULL", err)) != MS_OK ||
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
	char *a = argv_to_json(argc, argv);

	if (!t || !a) {
		ms_free(t);
		ms_free(a);
		return oom(err);
	}
	ms_free(inv->tool);
	ms_free(inv->argv_json);
	inv->tool = t;
	inv->argv_json = a;
	return MS_OK;
}

/* ---- what the files say ----------------------------------------------------------- */

struct classify {
	enum ms_inv_kind kind;     /* ANY: the files say nothing */
	char why[512];             /* what in the files says it */
	char layout[32];
	int32_t ep_size, ep_rank;
	char *experts;             /* JSON array or NULL */
};

/* The layouts an msinv.nvfp4 metadata value declares: the JSON object
 * msconvert writes, whose "layouts" array lists "rowwise" and/or
 * "columnwise" (quant.h), a "layout" member, or the word alone. 0: unknown,
 * 1 rowwise, 2 columnwise, 3 both; -1: out of memory (a columnwise file
 * must not pass for one that says nothing). */
static int meta_layout(const char *v)
{
	cJSON *o;
	int r = 0, nomem;

	if (!v)
		return 0;
	if (!strcmp(v, "rowwise"))
		return 1;
	if (!strcmp(v, "columnwise"))
		return 2;
	if (!strcmp(v, "both"))
		return 3;
	o = ms_json_parse(v, strlen(v), &nomem);
	if (nomem)
		return -1;
	if (cJSON_IsObject(o)) {
		cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "layout");
		cJSON *ls = cJSON_GetObjectItemCaseSensitive(o, "layouts"), *it;

		if (!cJSON_IsArray(ls))
			ls = NULL;
		cJSON_ArrayForEach(it, ls) {
			if (cJSON_IsString(it) && !strcmp(it->valuestring, "rowwise"))
				r |= 1;
			if (cJSON_IsString(it) && !strcmp(it->valuestring, "columnwise"))
				r |= 2;
		}
		if (!r && cJSON_IsString(l))
			r = !strcmp(l->valuestring, "rowwise") ? 1 :
			    !strcmp(l->valuestring, "columnwise") ? 2 :
			    !strcmp(l->valuestring, "both") ? 3 : 0;
	}
	cJSON_Delete(o);
	return r;
}

/* Expert ids: a JSON array of integers or "0,1,2"; canonical "[0,1,2]". */
static int parse_experts(const char *v, const char *file, char **out, struct ms_err *err)
{
	struct ms_buf b;
	cJSON *a = NULL;
	int rc = MS_OK, first = 1, bad = 0, nomem;

	*out = NULL;
	ms_buf_init(&b);
	ms_buf_puts(&b, "[");
	if (v[0] == '[') {
		cJSON *it;

		a = ms_json_parse(v, strlen(v), &nomem);
		if (nomem) {
			rc = oom(err);
			goto out;
		}
		bad = !cJSON_IsArray(a);
		if (bad) {
			cJSON_Delete(a);
			a = NULL;
		}
		cJSON_ArrayForEach(it, a) {
			if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e9 ||
			    it->valuedouble != (double)(int64_t)it->valuedouble) {
				bad = 1;
				break;
			}
			ms_buf_printf(&b, first ? "%lld" : ",%lld", (long long)it->valuedouble);
			first = 0;
		}
	} else {
		for (const char *p = v; *p && !bad;) {
			char num[24];
			size_t n = strcspn(p, ",");
			uint64_t x = 0;

			if (n == 0 || n >= sizeof(num)) {
				bad = 1;
				break;
			}
			memcpy(num, p, n);
			num[n] = 0;
			bad = ms_parse_u64(num, 1000000000u, &x) != MS_OK;
			ms_buf_printf(&b, first ? "%llu" : ",%llu", (unsigned long long)x);
			first = 0;
			p += n;
			if (*p == ',' && !*++p)
				bad = 1; /* a trailing comma */
		}
	}
	ms_buf_puts(&b, "]");
	if (bad) {
		rc = ms_err_set(err, MS_EINVAL,
				"'%s': metadata msinv.ep.experts '%s' is not a list of expert ids", file, v);
		goto out;
	}
	if (b.oom) {
		rc = oom(err);
		goto out;
	}
	*out = ms_buf_detach(&b, NULL);
out:
	cJSON_Delete(a);
	ms_buf_release(&b);
	return rc;
}

static int ep_meta(const struct ms_ckpt *c, struct classify *k, struct ms_err *err)
{
	const char *first = NULL, *none = NULL;

	for (size_t i = 0; i < c->nfiles; i++) {
		const struct ms_st_file *f = c->files[i];
		const char *r = ms_st_meta_get(f, "msinv.ep.rank");
		const char *s = ms_st_meta_get(f, "msinv.ep.size");
		const char *e = ms_st_meta_get(f, "msinv.ep.experts");
		uint64_t rank, size;
		char *experts = NULL;
		int rc;

		if (!r && !s && !e) {
			if (!none)
				none = f->path;
			continue;
		}
		if (!r || !s)
			return ms_err_set(err, MS_EINVAL,
					  "'%s': EP shard metadata needs both msinv.ep.rank and msinv.ep.size",
					  f->path);
		if (ms_parse_u64(s, 1u << 20, &size) || size == 0)
			return ms_err_set(err, MS_EINVAL,
					  "'%s': metadata msinv.ep.size '%s' is not a positive integer",
					  f->path, s);
		if (ms_parse_u64(r, 1u << 20, &rank) || rank >= size)
			return ms_err_set(err, MS_EINVAL,
					  "'%s': metadata msinv.ep.rank '%s' is not a rank below msinv.ep.size %llu",
					  f->path, r, (unsigned long long)size);
		if (e && (rc = parse_experts(e, f->path, &experts, err)) != MS_OK)
			return rc;
		if (!first) {
			first = f->path;
			k->ep_size = (int32_t)size;
			k->ep_rank = (int32_t)rank;
			k->experts = experts;
			continue;
		}
		if (k->ep_size != (int32_t)size || k->ep_rank != (int32_t)rank ||
		    (experts == NULL) != (k->experts == NULL) ||
		    (experts && strcmp(experts, k->experts))) {
			ms_free(experts);
			return ms_err_set(err, MS_EINVAL,
					  "'%s' and '%s' disagree on their EP shard metadata (msinv.ep.*): each rank's shard is a state of its own, add its file alone",
					  first, f->path);
		}
		ms_free(experts);
	}
	if (first && none)
		return ms_err_set(err, MS_EINVAL,
				  "'%s' has EP shard metadata (msinv.ep.*) but '%s' has none", first, none);
	return MS_OK;
}

struct modinfo {
	const struct ms_tensor *t;
	uint32_t module_len;
	struct ms_name_info info;
	int file_layout;   /* meta_layout of its file */
};

static int cmp_mod(const void *a, const void *b)
{
	const struct modinfo *x = a, *y = b;
	uint32_t n = x->module_len < y->module_len ? x->module_len : y->module_len;
	int c = memcmp(x->t->name, y->t->name, n);

	if (c)
		return c;
	return x->module_len < y->module_len ? -1 : x->module_len > y->module_len;
}

static int is_float(enum ms_dtype d)
{
	switch (d) {
	case MS_DTYPE_F16: case MS_DTYPE_BF16: case MS_DTYPE_F32: case MS_DTYPE_F64:
	case MS_DTYPE_F8_E4M3: case MS_DTYPE_F8_E5M2: case MS_DTYPE_F8_E4M3FNUZ:
	case MS_DTYPE_F8_E5M2FNUZ: case MS_DTYPE_F4: case MS_DTYPE_F6_E2M3:
	case MS_DTYPE_F6_E3M2:
		return 1;
	default:
		return 0;
	}
}

/*
 * NVFP4 weights are a U8 weight (.weight / .weight_packed) with an F8_E4M3
 * .weight_scale companion of the same module: rowwise, unless the file's
 * msinv.nvfp4 metadata says it holds columnwise copies; a U8 .weight_colwise
 * / .weight_packed_colwise with an F8_E4M3 colwise scale is columnwise.
 * Otherwise the layout is the dtype of the floating matrices (ndim >= 2,
 * scales aside) when they share one, else "mixed".
 */
static int classify_layout(const struct ms_ckpt *c, struct classify *k, struct ms_err *err)
{
	struct modinfo *m = NULL;
	size_t n = c->ntensors, fi = 0;
	int row = 0, col = 0, lora = 0, *layouts = NULL, rc = MS_OK;
	const char *row_example = NULL;
	int dt_seen = -1, dt_mixed = 0;

	/* the metadata is parsed once per file: it lists every quantized
	 * module, so once per tensor would be quadratic in the model's size */
	m = ms_calloc(n ? n : 1, sizeof(*m));
	layouts = ms_calloc(c->nfiles ? c->nfiles : 1, sizeof(*layouts));
	if (!m || !layouts) {
		rc = oom(err);
		goto out;
	}
	for (size_t f = 0; f < c->nfiles; f++)
		if ((layouts[f] = meta_layout(ms_st_meta_get(c->files[f], "msinv.nvfp4"))) < 0) {
			rc = oom(err);
			goto out;
		}
	for (size_t i = 0; i < n; i++) {
		const struct ms_tensor *t = c->tensors[i];

		m[i].t = t;
		if (ms_name_parse(t->name, &m[i].info) != MS_OK) {
			memset(&m[i].info, 0, sizeof(m[i].info));
			m[i].info.module_len = (uint32_t)strlen(t->name);
		}
		m[i].module_len = m[i].info.module_len;
		/* names sort across files: the last file is the usual match */
		if (fi >= c->nfiles || c->files[fi] != t->file)
			for (fi = 0; fi < c->nfiles && c->files[fi] != t->file; fi++)
				;
		m[i].file_layout = fi < c->nfiles ? layouts[fi]
				 : meta_layout(ms_st_meta_get(t->file, "msinv.nvfp4"));
		if (m[i].file_layout < 0) {
			rc = oom(err);
			goto out;
		}
		if (m[i].info.role == MS_NAME_ROLE_LORA_A || m[i].info.role == MS_NAME_ROLE_LORA_B)
			lora = 1;
		if (t->ndim >= 2 && is_float(t->dtype) && m[i].info.role != MS_NAME_ROLE_SCALE &&
		    m[i].info.role != MS_NAME_ROLE_COLWISE_SCALE) {
			if (dt_seen < 0)
				dt_seen = (int)t->dtype;
			else if (dt_seen != (int)t->dtype)
				dt_mixed = 1;
		}
	}
	qsort(m, n, sizeof(*m), cmp_mod);
	for (size_t i = 0; i < n;) {
		size_t j = i;
		int w = 0, s = 0, cw = 0, cs = 0, fl = m[i].file_layout;
		const char *wname = NULL;

		while (j < n && !cmp_mod(&m[i], &m[j])) {
			const struct ms_name_info *in = &m[j].info;
			enum ms_dtype d = m[j].t->dtype;

			if (in->role == MS_NAME_ROLE_WEIGHT && d == MS_DTYPE_U8 && !in->colwise) {
				w = 1;
				wname = m[j].t->name;
			}
			if (in->role == MS_NAME_ROLE_SCALE && d == MS_DTYPE_F8_E4M3 && !in->colwise)
				s = 1;
			if (in->role == MS_NAME_ROLE_COLWISE && d == MS_DTYPE_U8)
				cw = 1;
			if (in->role == MS_NAME_ROLE_COLWISE_SCALE && d == MS_DTYPE_F8_E4M3)
				cs = 1;
			j++;
		}
		if (w && s) {
			if (fl == 2)
				col = 1;
			else
				row = 1;
			if (!row_example)
				row_example = wname;
		}
		if (cw && cs) {
			col = 1;
			if (!row_example)
				row_example = m[i].t->name;
		}
		i = j;
	}
	if (row || col) {
		snprintf(k->layout, sizeof(k->layout), "nvfp4-%s",
			 row && col ? "both" : row ? "rowwise" : "columnwise");
		if (k->kind == MS_INV_KIND_ANY) {
			k->kind = MS_INV_KIND_QUANTIZED;
			snprintf(k->why, sizeof(k->why),
				 "they hold NVFP4 weights (U8 '%s' with an F8_E4M3 scale)", row_example);
		}
	} else if (dt_seen < 0) {
		snprintf(k->layout, sizeof(k->layout), "%s", n ? "other" : "empty");
	} else if (dt_mixed) {
		snprintf(k->layout, sizeof(k->layout), "mixed");
	} else {
		const char *nm = ms_dtype_name((enum ms_dtype)dt_seen);
		size_t l = 0;

		for (; nm[l] && l + 1 < sizeof(k->layout); l++)
			k->layout[l] = (char)tolower((unsigned char)nm[l]);
		k->layout[l] = 0;
	}
	if (lora && k->kind == MS_INV_KIND_ANY) {
		k->kind = MS_INV_KIND_ADAPTER;
		snprintf(k->why, sizeof(k->why), "they hold LoRA factors");
	}
out:
	ms_free(m);
	ms_free(layouts);
	return rc;
}

static int classify_ckpt(const struct ms_ckpt *c, struct classify *k, struct ms_err *err)
{
	int rc;

	memset(k, 0, sizeof(*k));
	k->kind = MS_INV_KIND_ANY;
	k->ep_size = k->ep_rank = -1;
	if ((rc = ep_meta(c, k, err)) != MS_OK) {
		ms_free(k->experts);
		k->experts = NULL;
		return rc;
	}
	if (k->ep_size > 0) {
		k->kind = MS_INV_KIND_ADAPTER_SHARD;
		snprintf(k->why, sizeof(k->why), "they are EP shard %d of %d (msinv.ep.* metadata)",
			 k->ep_rank, k->ep_size);
	} else if (c->is_adapter) {
		k->kind = MS_INV_KIND_ADAPTER;
		snprintf(k->why, sizeof(k->why), "they are an adapter (adapter_config.json)");
	}
	if ((rc = classify_layout(c, k, err)) != MS_OK) {
		ms_free(k->experts);
		k->experts = NULL;
	}
	return rc;
}

int ms_inv_classify(const struct ms_ckpt *c, enum ms_inv_kind *kind, char *layout,
		    size_t layout_len, int32_t *ep_size, int32_t *ep_rank, char **experts,
		    struct ms_err *err)
{
	struct classify k;
	int rc = classify_ckpt(c, &k, err);

	if (rc != MS_OK)
		return rc;
	*kind = k.kind;
	snprintf(layout, layout_len, "%s", k.layout);
	*ep_size = k.ep_size;
	*ep_rank = k.ep_rank;
	if (experts)
		*experts = k.experts;
	else
		ms_free(k.experts);
	return MS_OK;
}

/* May a state the files describe as said be recorded as wanted? An adapter
 * may be sharded or be part of a served policy; a quantized state may be
 * served. */
static int kind_compatible(enum ms_inv_kind said, enum ms_inv_kind wanted)
{
	if (said == MS_INV_KIND_ANY || said == wanted)
		return 1;
	if (said == MS_INV_KIND_ADAPTER &&
	    (wanted == MS_INV_KIND_ADAPTER_SHARD || wanted == MS_INV_KIND_POLICY))
		return 1;
	return said == MS_INV_KIND_QUANTIZED && wanted == MS_INV_KIND_POLICY;
}

/* ---- adding ------------------------------------------------------------------------ */

void ms_inv_add_opts_init(struct ms_inv_add_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->kind = MS_INV_KIND_ANY;
	o->ep_size = o->ep_rank = -1;
}

static int label_check(const char *l, struct ms_err *err)
{
	size_t n = strlen(l);
	int nonhex = 0;

	if (n == 0 || n > MS_INV_MAX_LABEL)
		return ms_err_set(err, MS_EINVAL, "label '%s': must be 1 to %d bytes", l,
				  MS_INV_MAX_LABEL);
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)l[i];

		if (!isalnum(ch) && !strchr("._:@+/-", ch))
			return ms_err_set(err, MS_EINVAL,
					  "label '%s': only letters, digits and ._:@+/- are allowed", l);
		if (!isxdigit(ch))
			nonhex = 1;
	}
	if (!strncmp(l, "sha256:", 7) || !nonhex)
		return ms_err_set(err, MS_EINVAL,
				  "label '%s': would read as a digest prefix; add a letter that is not a hex digit",
				  l);
	return MS_OK;
}

struct addfile {
	struct ms_st_file *f;
	const char *name;        /* file name inside the checkpoint */
	char *real;              /* absolute realpath */
	int reused;              /* digests taken from the record */
	int64_t row;             /* files.id once recorded */
	char content[65];
};

struct addctx {
	struct ms_inv *inv;
	const struct ms_inv_add_opts *o;
	struct ms_ckpt *ck;
	struct addfile *af;
	char digest[MS_STATE_DIGEST_LEN];
	enum ms_inv_kind kind;
	struct classify cls;
	int32_t ep_size, ep_rank;
	char (*parents)[MS_STATE_DIGEST_LEN];
	char *params;
	uint64_t nbytes;
	char now[ISO_LEN];
	struct ms_inv_add_stats st;
	size_t trees_added;        /* tree digests this add recorded */
};

/* Digests of a file recorded with the same size, mtime, ctime, device and
 * inode, when its header still hashes the same: 1 when taken, 0 when the
 * file must be hashed. */
static int reuse_digests(struct ms_inv *inv, struct addfile *a, int want_file_digest,
			 int *taken, struct ms_err *err)
{
	struct ms_st_file *f = a->f;
	sqlite3_stmt *st = NULL;
	uint8_t hd[MS_SHA256_LEN], rec[MS_SHA256_LEN], fd[MS_SHA256_LEN];
	int64_t id;
	int has_fd = 0, rc;
	size_t count = 0;

	*taken = 0;
	if ((rc = prep(inv,
		       "SELECT id, header_len, header_digest, file_digest, ntensors FROM files "
		       "WHERE path = ?1 AND size = ?2 AND mtime_ns = ?3 AND ctime_ns = ?4 AND dev = ?5 "
		       "AND inode = ?6 ORDER BY id DESC LIMIT 1", &st, err)) != MS_OK)
		return rc;
	bind_text(st, 1, a->real);
	sqlite3_bind_int64(st, 2, (int64_t)f->size);
	sqlite3_bind_int64(st, 3, f->mtime_ns);
	sqlite3_bind_int64(st, 4, f->ctime_ns);
	sqlite3_bind_int64(st, 5, (int64_t)f->dev);
	sqlite3_bind_int64(st, 6, (int64_t)f->ino);
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		sqlite3_finalize(st);
		return rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot look up a file");
	}
	id = sqlite3_column_int64(st, 0);
	if ((uint64_t)sqlite3_column_int64(st, 1) != f->header_len ||
	    (uint64_t)sqlite3_column_int64(st, 4) != f->ntensors ||
	    digest_from_hex(col_str(st, 2), rec)) {
		sqlite3_finalize(st);
		return MS_OK;
	}
	if (sqlite3_column_type(st, 3) != SQLITE_NULL) {
		if (digest_from_hex(col_str(st, 3), fd)) {
			sqlite3_finalize(st);
			return MS_OK;
		}
		has_fd = 1;
	}
	sqlite3_finalize(st);
	st = NULL;
	if (want_file_digest && !has_fd)
		return MS_OK;
	/* the header is small: hashing it guards against a rewrite that kept
	 * every stat field */
	if ((rc = ms_sha256(f->map, (size_t)(8 + f->header_len), hd)) != MS_OK)
		return ms_sha256_err(err, rc);
	if (memcmp(hd, rec, sizeof(hd)))
		return MS_OK;
	if ((rc = prep(inv, "SELECT name, digest FROM tensors WHERE file_id = ?", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, id);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct ms_tensor *t = (struct ms_tensor *)ms_st_find(f, col_str(st, 0));

		if (!t || digest_from_hex(col_str(st, 1), t->digest)) {
			sqlite3_finalize(st);
			return MS_OK;
		}
		count++;
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return db_fail(inv, err, "cannot read recorded tensors");
	if (count != f->ntensors)
		return MS_OK;
	for (size_t i = 0; i < f->ntensors; i++)
		f->tensors[i].has_digest = 1;
	memcpy(f->header_digest, hd, sizeof(hd));
	f->has_header_digest = 1;
	if (has_fd) {
		memcpy(f->file_digest, fd, sizeof(fd));
		f->has_file_digest = 1;
	}
	*taken = 1;
	return MS_OK;
}

/* The file's content digest (ms(5)): header digest and tensor digests in
 * offset order, which together cover every byte. */
static int content_digest(const struct ms_st_file *f, char out[65])
{
	struct ms_sha256_ctx *c = ms_sha256_new();
	uint8_t d[MS_SHA256_LEN];
	char hex[66];
	int rc;

	if (!c)
		return MS_ENOMEM;
	rc = ms_sha256_update(c, "msinv-file-v1\n", 14);
	ms_hex(f->header_digest, MS_SHA256_LEN, hex);
	hex[64] = '\n';
	if (rc == MS_OK)
		rc = ms_sha256_update(c, hex, 65);
	for (size_t i = 0; rc == MS_OK && i < f->ntensors; i++) {
		ms_hex(f->tensors[i].digest, MS_SHA256_LEN, hex);
		hex[64] = '\n';
		rc = ms_sha256_update(c, hex, 65);
	}
	if (rc == MS_OK)
		rc = ms_sha256_final(c, d);
	ms_sha256_free(c);
	if (rc == MS_OK)
		ms_hex(d, MS_SHA256_LEN, out);
	return rc;
}

static int insert_tensors(struct ms_inv *inv, const struct ms_st_file *f, int64_t file_id,
			  struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = prep(inv,
		       "INSERT INTO tensors (file_id, name, dtype, shape, byte_offset, nbytes, digest) "
		       "VALUES (?,?,?,?,?,?,?)", &st, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < f->ntensors; i++) {
		const struct ms_tensor *t = &f->tensors[i];
		char shape[24 * MS_ST_MAX_RANK + 4], hex[65];

		ms_shape_str(t, shape, sizeof(shape));
		ms_hex(t->digest, MS_SHA256_LEN, hex);
		sqlite3_bind_int64(st, 1, file_id);
		sqlite3_bind_text(st, 2, t->name, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, ms_dtype_name(t->dtype), -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 4, shape, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 5, (int64_t)t->offset);
		sqlite3_bind_int64(st, 6, (int64_t)t->nbytes);
		sqlite3_bind_text(st, 7, hex, 64, SQLITE_STATIC);
		if (sqlite3_step(st) != SQLITE_DONE) {
			rc = db_fail(inv, err, "cannot record a tensor");
			break;
		}
		sqlite3_reset(st);
		sqlite3_clear_bindings(st);
	}
	sqlite3_finalize(st);
	return rc;
}

/* Find or insert the row of a file with this content; refresh its stat. */
static int upsert_file(struct addctx *x, struct addfile *a, struct ms_err *err)
{
	struct ms_inv *inv = x->inv;
	struct ms_st_file *f = a->f;
	sqlite3_stmt *st = NULL;
	char hd[65], fd[65];
	int rc;

	ms_hex(f->header_digest, MS_SHA256_LEN, hd);
	if (f->has_file_digest)
		ms_hex(f->file_digest, MS_SHA256_LEN, fd);
	if ((rc = prep(inv, "SELECT id FROM files WHERE path = ? AND content_digest = ?", &st,
		       err)) != MS_OK)
		return rc;
	bind_text(st, 1, a->real);
	bind_text(st, 2, a->content);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		a->row = sqlite3_column_int64(st, 0);
		sqlite3_finalize(st);
		if ((rc = prep(inv,
			       "UPDATE files SET size = ?2, mtime_ns = ?3, ctime_ns = ?4, dev = ?5, inode = ?6, "
			       "file_digest = coalesce(file_digest, ?7) WHERE id = ?1 AND (size <> ?2 OR "
			       "mtime_ns <> ?3 OR ctime_ns <> ?4 OR dev <> ?5 OR inode <> ?6 OR "
			       "(file_digest IS NULL AND ?7 IS NOT NULL))", &st, err)) != MS_OK)
			return rc;
	} else if (rc == SQLITE_DONE) {
		sqlite3_finalize(st);
		if ((rc = prep(inv,
			       "INSERT INTO files (path, size, mtime_ns, ctime_ns, dev, inode, header_len, "
			       "header_digest, content_digest, file_digest, ntensors, added_at) "
			       "VALUES (?8, ?2, ?3, ?4, ?5, ?6, ?9, ?10, ?11, ?7, ?12, ?13)", &st, err)) != MS_OK)
			return rc;
		a->row = 0;
	} else {
		sqlite3_finalize(st);
		return db_fail(inv, err, "cannot look up a file");
	}
	sqlite3_bind_int64(st, 1, a->row);
	sqlite3_bind_int64(st, 2, (int64_t)f->size);
	sqlite3_bind_int64(st, 3, f->mtime_ns);
	sqlite3_bind_int64(st, 4, f->ctime_ns);
	sqlite3_bind_int64(st, 5, (int64_t)f->dev);
	sqlite3_bind_int64(st, 6, (int64_t)f->ino);
	bind_text(st, 7, f->has_file_digest ? fd : NULL);
	if (!a->row) {
		bind_text(st, 8, a->real);
		sqlite3_bind_int64(st, 9, (int64_t)f->header_len);
		bind_text(st, 10, hd);
		bind_text(st, 11, a->content);
		sqlite3_bind_int64(st, 12, (int64_t)f->ntensors);
		bind_text(st, 13, x->now);
	}
	if (sqlite3_step(st) != SQLITE_DONE) {
		rc = db_fail(inv, err, "cannot record a file");
		sqlite3_finalize(st);
		return rc;
	}
	sqlite3_finalize(st);
	if (a->row)
		return MS_OK;
	a->row = sqlite3_last_insert_rowid(inv->db);
	return insert_tensors(inv, f, a->row, err);
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

/* The copy of state sid made of exactly these files, or 0; *maxcopy the
 * largest copy number recorded. */
static int find_copy(struct ms_inv *inv, int64_t sid, const int64_t *ids, size_t n,
		     uint32_t *copy, uint32_t *maxcopy, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int64_t cur = -1;
	size_t k = 0;
	int match = 0, rc;

	*copy = 0;
	*maxcopy = 0;
	if ((rc = prep(inv, "SELECT copy, file_id FROM state_files WHERE state_id = ? "
			    "ORDER BY copy, file_id", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		int64_t c = sqlite3_column_int64(st, 0), fid = sqlite3_column_int64(st, 1);

		if (c != cur) {
			if (cur >= 0 && match && k == n)
				*copy = (uint32_t)cur;
			cur = c;
			k = 0;
			match = 1;
		}
		if (k >= n || ids[k] != fid)
			match = 0;
		k++;
		if ((uint64_t)c > *maxcopy)
			*maxcopy = (uint32_t)c;
	}
	if (cur >= 0 && match && k == n && !*copy)
		*copy = (uint32_t)cur;
	sqlite3_finalize(st);
	return rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot read the copies of a state");
}

static int insert_configs(struct ms_inv *inv, int64_t sid, uint32_t copy,
			  const struct ms_ckpt *ck, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = prep(inv, "INSERT INTO state_configs (state_id, copy, name, path, digest, content) "
			    "VALUES (?,?,?,?,?,?)", &st, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < ck->nconfigs; i++) {
		const struct ms_ckpt_config *c = &ck->configs[i];
		char hex[65], *real = realpath(c->path, NULL);

		ms_hex(c->digest, MS_SHA256_LEN, hex);
		sqlite3_bind_int64(st, 1, sid);
		sqlite3_bind_int64(st, 2, copy);
		bind_text(st, 3, c->name);
		bind_text(st, 4, real ? real : c->path);
		bind_text(st, 5, hex);
		/* a side file (a tokenizer of tens of megabytes, a model card) is
		 * recorded by digest; only configuration files keep their text */
		sqlite3_bind_text(st, 6, c->side ? "" : c->text, c->side ? 0 : (int)c->len,
				  SQLITE_STATIC);
		rc = sqlite3_step(st);
		free(real);
		if (rc != SQLITE_DONE) {
			sqlite3_finalize(st);
			return db_fail(inv, err, "cannot record a configuration file");
		}
		sqlite3_reset(st);
	}
	sqlite3_finalize(st);
	return MS_OK;
}

static cJSON *configs_json(const struct ms_ckpt *ck)
{
	cJSON *a = cJSON_CreateArray();

	for (size_t i = 0; a && i < ck->nconfigs; i++) {
		cJSON *o = cJSON_CreateObject();
		char hex[65];

		ms_hex(ck->configs[i].digest, MS_SHA256_LEN, hex);
		cJSON_AddStringToObject(o, "name", ck->configs[i].name);
		cJSON_AddStringToObject(o, "sha256", hex);
		cJSON_AddItemToArray(a, o);
	}
	return a;
}

/* Configurations recorded for an existing copy differ from the files now
 * beside it: replace them (and log it). */
static int refresh_configs(struct addctx *x, int64_t sid, uint32_t copy, struct ms_err *err)
{
	struct ms_inv *inv = x->inv;
	sqlite3_stmt *st = NULL;
	size_t k = 0;
	int same = 1, rc;

	if ((rc = prep(inv, "SELECT name, digest FROM state_configs WHERE state_id = ? AND copy = ? "
			    "ORDER BY name", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, copy);
	/* ck->configs is not sorted: compare by lookup */
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const struct ms_ckpt_config *c = ms_ckpt_config(x->ck, col_str(st, 0));
		char hex[65];

		k++;
		if (!c) {
			same = 0;
			continue;
		}
		ms_hex(c->digest, MS_SHA256_LEN, hex);
		if (strcmp(hex, col_str(st, 1)))
			same = 0;
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return db_fail(inv, err, "cannot read recorded configurations");
	if (same && k == x->ck->nconfigs)
		return MS_OK;
	if ((rc = prep(inv, "DELETE FROM state_configs WHERE state_id = ? AND copy = ?", &st,
		       err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, copy);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot replace configurations");
	sqlite3_finalize(st);
	if (rc == MS_OK)
		rc = insert_configs(inv, sid, copy, x->ck, err);
	if (rc == MS_OK) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddNumberToObject(d, "copy", copy);
		json_put(d, "configs", configs_json(x->ck));
		rc = log_json(inv, "configs", x->digest, d, err);
	}
	return rc;
}

static int64_t state_id_of(struct ms_inv *inv, const char *digest, struct ms_err *err, int *rcp)
{
	sqlite3_stmt *st = NULL;
	int64_t id = 0;
	int rc;

	*rcp = prep(inv, "SELECT id FROM states WHERE digest = ?", &st, err);
	if (*rcp != MS_OK)
		return 0;
	bind_text(st, 1, digest);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		id = sqlite3_column_int64(st, 0);
	else if (rc == SQLITE_DONE)
		*rcp = ms_err_set(err, MS_ENOTFOUND, "no state %s in '%s'", digest, inv->path);
	else
		*rcp = db_fail(inv, err, "cannot look up a state");
	sqlite3_finalize(st);
	return id;
}

static int run_exists(struct ms_inv *inv, int64_t run_id, int *running, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = prep(inv, "SELECT status FROM runs WHERE id = ?", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, run_id);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		if (running)
			*running = !strcmp(col_str(st, 0), "running");
		rc = MS_OK;
	} else if (rc == SQLITE_DONE) {
		rc = ms_err_set(err, MS_ENOTFOUND, "no run %lld in '%s'", (long long)run_id, inv->path);
	} else {
		rc = db_fail(inv, err, "cannot look up a run");
	}
	sqlite3_finalize(st);
	return rc;
}

/* Under the write lock. */
static int run_output_locked(struct ms_inv *inv, int64_t run_id, const char *digest, int64_t sid,
			     struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = run_exists(inv, run_id, NULL, err)) != MS_OK)
		return rc;
	if ((rc = prep(inv, "INSERT OR IGNORE INTO run_outputs (run_id, digest, state_id) VALUES (?,?,?)",
		       &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, run_id);
	bind_text(st, 2, digest);
	sqlite3_bind_int64(st, 3, sid);
	if (sqlite3_step(st) != SQLITE_DONE) {
		rc = db_fail(inv, err, "cannot record a run output");
		sqlite3_finalize(st);
		return rc;
	}
	sqlite3_finalize(st);
	if (sqlite3_changes(inv->db) == 1) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddNumberToObject(d, "run", (double)run_id);
		rc = log_json(inv, "run_output", digest, d, err);
	}
	return rc;
}

static int add_edge(struct addctx *x, int64_t sid, const char *parent, struct ms_err *err)
{
	struct ms_inv *inv = x->inv;
	sqlite3_stmt *st = NULL;
	int64_t pid;
	int rc;

	pid = state_id_of(inv, parent, err, &rc);
	if (rc != MS_OK)
		return rc;
	if (pid == sid)
		return ms_err_set(err, MS_EINVAL, "state %s cannot derive from itself", x->digest);
	/* a parent that descends from the child would close a cycle */
	if ((rc = prep(inv,
		       "WITH RECURSIVE d(id) AS (SELECT ?1 UNION SELECT child_id FROM derivations "
		       "JOIN d ON parent_id = d.id) SELECT 1 FROM d WHERE id = ?2 LIMIT 1", &st,
		       err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, pid);
	rc = sqlite3_step(st);
	sqlite3_finalize(st);
	if (rc == SQLITE_ROW)
		return ms_err_set(err, MS_EINVAL,
				  "parent %s derives from %s: the edge would close a cycle", parent,
				  x->digest);
	if (rc != SQLITE_DONE)
		return db_fail(inv, err, "cannot walk the derivations");
	if ((rc = prep(inv, "SELECT params FROM derivations WHERE child_id = ? AND parent_id = ? "
			    "AND operation = ?", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, pid);
	bind_text(st, 3, x->o->operation);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		if (strcmp(col_str(st, 0), x->params))
			rc = ms_err_set(err, MS_EEXIST,
					"%s is already recorded as '%s' of %s with parameters %s",
					x->digest, x->o->operation, parent, col_str(st, 0));
		else
			rc = MS_OK;
		sqlite3_finalize(st);
		return rc;
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return db_fail(inv, err, "cannot look up a derivation");
	if ((rc = prep(inv, "INSERT INTO derivations (child_id, parent_id, operation, params, run_id, "
			    "created_at) VALUES (?,?,?,?,?,?)", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, pid);
	bind_text(st, 3, x->o->operation);
	bind_text(st, 4, x->params);
	if (x->o->run_id > 0)
		sqlite3_bind_int64(st, 5, x->o->run_id);
	else
		sqlite3_bind_null(st, 5);
	bind_text(st, 6, x->now);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot record a derivation");
	sqlite3_finalize(st);
	if (rc == MS_OK) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddStringToObject(d, "parent", parent);
		cJSON_AddStringToObject(d, "operation", x->o->operation);
		cJSON_AddRawToObject(d, "params", x->params);
		if (x->o->run_id > 0)
			cJSON_AddNumberToObject(d, "run", (double)x->o->run_id);
		rc = log_json(inv, "derive", x->digest, d, err);
	}
	return rc;
}

/* The state (id and digest) a label names; *sid 0 when none. */
static int label_owner(struct ms_inv *inv, const char *l, int64_t *sid,
		       char digest[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	*sid = 0;
	if ((rc = prep(inv, "SELECT s.id, s.digest FROM labels l JOIN states s ON s.id = l.state_id "
			    "WHERE l.name = ?", &st, err)) != MS_OK)
		return rc;
	bind_text(st, 1, l);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW && sqlite3_column_bytes(st, 1) == MS_STATE_DIGEST_LEN - 1) {
		*sid = sqlite3_column_int64(st, 0);
		if (digest)
			memcpy(digest, sqlite3_column_text(st, 1), MS_STATE_DIGEST_LEN);
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		return db_fail(inv, err, "cannot look up a label");
	return MS_OK;
}

/* states.label is the state's oldest label (what ls, show and lineage
 * print first); the labels table is the truth it is kept in step with. */
static int label_sync(struct ms_inv *inv, int64_t sid, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = prep(inv, "UPDATE states SET label = (SELECT name FROM labels WHERE state_id = ?1 "
			    "ORDER BY created_at, name LIMIT 1) WHERE id = ?1", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot set a label");
	sqlite3_finalize(st);
	return rc;
}

/* Give state sid (digest) the label l, in the caller's transaction. A label
 * of another state is MS_EEXIST, unless force, which moves it (logged with
 * the state it came from). Nothing is written when it is already there. */
static int label_put(struct ms_inv *inv, int64_t sid, const char *digest, const char *l,
		     int force, struct ms_err *err)
{
	char from[MS_STATE_DIGEST_LEN], at[ISO_LEN];
	sqlite3_stmt *st = NULL;
	int64_t owner;
	cJSON *d;
	int rc;

	if ((rc = label_owner(inv, l, &owner, from, err)) != MS_OK)
		return rc;
	if (owner == sid)
		return MS_OK;
	if (owner && !force)
		return ms_err_set(err, MS_EEXIST,
				  "label '%s' already names %s (move it with 'msinv label --force')",
				  l, from);
	if (owner) {
		if ((rc = prep(inv, "DELETE FROM labels WHERE name = ?", &st, err)) != MS_OK)
			return rc;
		bind_text(st, 1, l);
		rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot move a label");
		sqlite3_finalize(st);
		if (rc != MS_OK || (rc = label_sync(inv, owner, err)) != MS_OK)
			return rc;
	}
	now_iso(at);
	if ((rc = prep(inv, "INSERT INTO labels (name, state_id, created_at) VALUES (?,?,?)", &st,
		       err)) != MS_OK)
		return rc;
	bind_text(st, 1, l);
	sqlite3_bind_int64(st, 2, sid);
	bind_text(st, 3, at);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot set a label");
	sqlite3_finalize(st);
	if (rc != MS_OK || (rc = label_sync(inv, sid, err)) != MS_OK)
		return rc;
	d = cJSON_CreateObject();
	cJSON_AddStringToObject(d, "label", l);
	if (owner)
		cJSON_AddStringToObject(d, "from", from);
	return log_json(inv, "label", digest, d, err);
}

/* add's --label: one more name for the state (a second copy may bring
 * its own) */
static int set_label(struct addctx *x, int64_t sid, struct ms_err *err)
{
	if (!x->o->label)
		return MS_OK;
	return label_put(x->inv, sid, x->digest, x->o->label, 0, err);
}

int ms_inv_label_check(const char *label, struct ms_err *err)
{
	return label_check(label, err);
}

int ms_inv_label_add(struct ms_inv *inv, const char *digest, const char *label, int force,
		     struct ms_err *err)
{
	struct ms_inv_state *s = NULL;
	int rc;

	if ((rc = label_check(label, err)) != MS_OK)
		return rc;
	if ((rc = tx_begin(inv, err)) != MS_OK)
		return rc;
	if ((rc = ms_inv_state_get(inv, digest, &s, err)) != MS_OK ||
	    (rc = label_put(inv, s->id, s->digest, label, force, err)) != MS_OK)
		goto out;
	rc = tx_commit(inv, err);
	ms_inv_state_free(s);
	return rc;
out:
	tx_rollback(inv);
	ms_inv_state_free(s);
	return rc;
}

int ms_inv_label_remove(struct ms_inv *inv, const char *label, struct ms_err *err)
{
	char digest[MS_STATE_DIGEST_LEN];
	sqlite3_stmt *st = NULL;
	int64_t owner;
	cJSON *d;
	int rc;

	if ((rc = tx_begin(inv, err)) != MS_OK)
		return rc;
	if ((rc = label_owner(inv, label, &owner, digest, err)) != MS_OK)
		goto out;
	if (!owner) {
		rc = ms_err_set(err, MS_ENOTFOUND, "no state labelled '%s' in '%s'", label, inv->path);
		goto out;
	}
	if ((rc = prep(inv, "DELETE FROM labels WHERE name = ?", &st, err)) != MS_OK)
		goto out;
	bind_text(st, 1, label);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot remove a label");
	sqlite3_finalize(st);
	if (rc != MS_OK || (rc = label_sync(inv, owner, err)) != MS_OK)
		goto out;
	d = cJSON_CreateObject();
	cJSON_AddStringToObject(d, "label", label);
	if ((rc = log_json(inv, "unlabel", digest, d, err)) != MS_OK)
		goto out;
	return tx_commit(inv, err);
out:
	tx_rollback(inv);
	return rc;
}

static int insert_state(struct addctx *x, int64_t *sid, struct ms_err *err)
{
	struct ms_inv *inv = x->inv;
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = prep(inv, "INSERT INTO states (digest, kind, layout, label, ntensors, nbytes, ep_size, "
			    "ep_rank, experts, tool, argv, user, host, created_at, cwd) "
			    "VALUES (?,?,?,NULL,?,?,?,?,?,?,?,?,?,?,?)", &st, err)) != MS_OK)
		return rc;
	bind_text(st, 1, x->digest);
	bind_text(st, 2, ms_inv_kind_name(x->kind));
	bind_text(st, 3, x->cls.layout);
	sqlite3_bind_int64(st, 4, (int64_t)x->ck->ntensors);
	sqlite3_bind_int64(st, 5, (int64_t)x->nbytes);
	if (x->ep_size > 0) {
		sqlite3_bind_int64(st, 6, x->ep_size);
		sqlite3_bind_int64(st, 7, x->ep_rank);
	} else {
		sqlite3_bind_null(st, 6);
		sqlite3_bind_null(st, 7);
	}
	bind_text(st, 8, x->cls.experts);
	bind_text(st, 9, inv->tool);
	bind_text(st, 10, inv->argv_json);
	bind_text(st, 11, inv->user);
	bind_text(st, 12, inv->host);
	bind_text(st, 13, x->now);
	bind_text(st, 14, inv->cwd);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot record the state");
	sqlite3_finalize(st);
	*sid = sqlite3_last_insert_rowid(inv->db);
	return rc;
}

static int insert_copy(struct addctx *x, int64_t sid, uint32_t copy, struct ms_err *err)
{
	struct ms_inv *inv = x->inv;
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = prep(inv, "INSERT INTO state_files (state_id, copy, file_id, name) VALUES (?,?,?,?)",
		       &st, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < x->ck->nfiles; i++) {
		sqlite3_bind_int64(st, 1, sid);
		sqlite3_bind_int64(st, 2, copy);
		sqlite3_bind_int64(st, 3, x->af[i].row);
		bind_text(st, 4, x->af[i].name);
		if (sqlite3_step(st) != SQLITE_DONE) {
			sqlite3_finalize(st);
			return db_fail(inv, err, "cannot record the files of a state");
		}
		sqlite3_reset(st);
	}
	sqlite3_finalize(st);
	return insert_configs(inv, sid, copy, x->ck, err);
}

static cJSON *files_json(const struct addctx *x)
{
	cJSON *a = cJSON_CreateArray();

	for (size_t i = 0; a && i < x->ck->nfiles; i++)
		json_push(a, cJSON_CreateString(x->af[i].real));
	return a;
}

/* Insert tree digests inside the caller's transaction (see
 * ms_inv_record_trees); *added counts the new rows. */
static int put_trees(struct ms_inv *inv, const struct ms_tree_rec *r, size_t n,
		     const char *source, const char *at, size_t *added, struct ms_err *err)
{
	sqlite3_stmt *sel = NULL, *ins = NULL;
	int rc;

	*added = 0;
	if ((rc = prep(inv, "SELECT tree FROM tree_digests WHERE digest = ?1 AND chunk_log2 = ?2",
		       &sel, err)) != MS_OK ||
	    (rc = prep(inv, "INSERT INTO tree_digests (digest, chunk_log2, nbytes, tree, source, "
			    "recorded_at) SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE EXISTS (SELECT 1 FROM "
			    "tensors WHERE digest = ?1 AND nbytes = ?3)", &ins, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < n; i++) {
		char hd[65], ht[65];

		if (r[i].log2 < MS_TREE_LOG2_MIN || r[i].log2 > MS_TREE_LOG2_MAX ||
		    r[i].nbytes > INT64_MAX) {
			rc = ms_err_set(err, MS_EINVAL, "bad tree digest record");
			goto out;
		}
		ms_hex(r[i].digest, MS_SHA256_LEN, hd);
		ms_hex(r[i].tree, MS_SHA256_LEN, ht);
		sqlite3_reset(sel);
		sqlite3_bind_text(sel, 1, hd, 64, SQLITE_STATIC);
		sqlite3_bind_int(sel, 2, (int)r[i].log2);
		rc = sqlite3_step(sel);
		if (rc == SQLITE_ROW) {
			if (strcmp(col_str(sel, 0), ht)) {
				rc = ms_err_set(err, MS_ECHECK,
						"'%s': tree digest %.16s... of bytes %.16s... differs from "
						"the recorded %.16s...; nothing recorded",
						inv->path, ht, hd, col_str(sel, 0));
				goto out;
			}
			continue;
		}
		if (rc != SQLITE_DONE) {
			rc = db_fail(inv, err, "cannot look up a tree digest");
			goto out;
		}
		sqlite3_reset(ins);
		sqlite3_bind_text(ins, 1, hd, 64, SQLITE_STATIC);
		sqlite3_bind_int(ins, 2, (int)r[i].log2);
		sqlite3_bind_int64(ins, 3, (int64_t)r[i].nbytes);
		sqlite3_bind_text(ins, 4, ht, 64, SQLITE_STATIC);
		bind_text(ins, 5, source);
		bind_text(ins, 6, at);
		if (sqlite3_step(ins) != SQLITE_DONE) {
			rc = db_fail(inv, err, "cannot record a tree digest");
			goto out;
		}
		*added += (size_t)sqlite3_changes(inv->db);
	}
	rc = MS_OK;
out:
	sqlite3_finalize(sel);
	sqlite3_finalize(ins);
	return rc;
}

static int log_trees(struct ms_inv *inv, const char *state, const char *source, size_t added,
		     struct ms_err *err)
{
	cJSON *d = cJSON_CreateObject();

	cJSON_AddStringToObject(d, "source", source);
	cJSON_AddNumberToObject(d, "trees", (double)added);
	cJSON_AddNumberToObject(d, "chunk_log2", MS_TREE_LOG2);
	return log_json(inv, "trees", state ? state : "-", d, err);
}

/* The tree digests add computed (same pass as the plain digests) of the
 * files it hashed. */
static int add_trees(struct addctx *x, struct ms_err *err)
{
	struct ms_tree_rec *r = NULL;
	size_t n = 0, added = 0;
	int rc = MS_OK;

	for (size_t i = 0; i < x->ck->nfiles; i++)
		n += x->af[i].f->ntensors;
	r = ms_calloc(n ? n : 1, sizeof(*r));
	if (!r)
		return oom(err);
	n = 0;
	for (size_t i = 0; i < x->ck->nfiles; i++) {
		const struct ms_st_file *f = x->af[i].f;

		for (size_t t = 0; t < f->ntensors; t++) {
			if (!f->tensors[t].has_tree || !f->tensors[t].has_digest)
				continue;
			memcpy(r[n].digest, f->tensors[t].digest, MS_SHA256_LEN);
			memcpy(r[n].tree, f->tensors[t].tree, MS_SHA256_LEN);
			r[n].nbytes = f->tensors[t].nbytes;
			r[n++].log2 = MS_TREE_LOG2;
		}
	}
	if (n)
		rc = put_trees(x->inv, r, n, "add", x->now, &added, err);
	x->trees_added = added;
	ms_free(r);
	return rc;
}

static int record(struct addctx *x, struct ms_err *err)
{
	struct ms_inv *inv = x->inv;
	sqlite3_stmt *st = NULL;
	int64_t sid = 0, *ids = NULL;
	uint32_t copy = 0, maxcopy = 0;
	int rc;
	size_t nf = x->ck->nfiles;

	if ((rc = tx_begin(inv, err)) != MS_OK)
		return rc;
	now_iso(x->now);
	for (size_t i = 0; i < nf; i++)
		if ((rc = upsert_file(x, &x->af[i], err)) != MS_OK)
			goto out;
	if ((rc = add_trees(x, err)) != MS_OK)
		goto out;
	ids = ms_malloc(nf * sizeof(*ids));
	if (!ids) {
		rc = oom(err);
		goto out;
	}
	for (size_t i = 0; i < nf; i++)
		ids[i] = x->af[i].row;
	qsort(ids, nf, sizeof(*ids), cmp_i64);

	if ((rc = prep(inv, "SELECT id, kind, ep_size, ep_rank, layout FROM states WHERE digest = ?",
		       &st, err)) != MS_OK)
		goto out;
	bind_text(st, 1, x->digest);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		enum ms_inv_kind k = MS_INV_KIND_ANY;
		int32_t es = sqlite3_column_type(st, 2) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 2);
		int32_t er = sqlite3_column_type(st, 3) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 3);

		sid = sqlite3_column_int64(st, 0);
		ms_inv_kind_parse(col_str(st, 1), &k);
		if (strcmp(col_str(st, 4), x->cls.layout)) {
			/* same tensors, other metadata: the record is what the digest names */
			rc = ms_err_set(err, MS_EINVAL,
					"%s is recorded with layout %s, but these files say %s (their msinv.nvfp4 metadata differs)",
					x->digest, col_str(st, 4), x->cls.layout);
			goto out;
		}
		sqlite3_finalize(st);
		st = NULL;
		if (x->o->kind != MS_INV_KIND_ANY && x->o->kind != k) {
			rc = ms_err_set(err, MS_EINVAL, "%s is recorded as %s, not %s", x->digest,
					ms_inv_kind_name(k), ms_inv_kind_name(x->o->kind));
			goto out;
		}
		if (!kind_compatible(x->cls.kind, k)) {
			rc = ms_err_set(err, MS_EINVAL, "%s is recorded as %s, but the files say otherwise: %s",
					x->digest, ms_inv_kind_name(k), x->cls.why);
			goto out;
		}
		if (x->ep_size > 0 && (x->ep_size != es || x->ep_rank != er)) {
			rc = ms_err_set(err, MS_EINVAL, "%s is recorded with ep rank %d of %d, not %d of %d",
					x->digest, er, es, x->ep_rank, x->ep_size);
			goto out;
		}
		x->kind = k;
		x->ep_size = es;
		x->ep_rank = er;
		if ((rc = find_copy(inv, sid, ids, nf, &copy, &maxcopy, err)) != MS_OK)
			goto out;
		if (copy) {
			if ((rc = refresh_configs(x, sid, copy, err)) != MS_OK)
				goto out;
		} else {
			cJSON *d;

			copy = maxcopy + 1;
			x->st.new_copy = 1;
			if ((rc = insert_copy(x, sid, copy, err)) != MS_OK)
				goto out;
			/* made after the inserts, which may fail (a trigger refusing) */
			d = cJSON_CreateObject();
			cJSON_AddNumberToObject(d, "copy", copy);
			json_put(d, "files", files_json(x));
			json_put(d, "configs", configs_json(x->ck));
			if (x->trees_added)
				cJSON_AddNumberToObject(d, "trees", (double)x->trees_added);
			if ((rc = log_json(inv, "copy", x->digest, d, err)) != MS_OK)
				goto out;
		}
	} else if (rc == SQLITE_DONE) {
		cJSON *d;

		sqlite3_finalize(st);
		st = NULL;
		if ((rc = insert_state(x, &sid, err)) != MS_OK)
			goto out;
		copy = 1;
		x->st.new_state = x->st.new_copy = 1;
		if ((rc = insert_copy(x, sid, copy, err)) != MS_OK)
			goto out;
		/* made after the inserts, which may fail (a trigger refusing) */
		d = cJSON_CreateObject();
		cJSON_AddStringToObject(d, "kind", ms_inv_kind_name(x->kind));
		cJSON_AddStringToObject(d, "layout", x->cls.layout);
		cJSON_AddNumberToObject(d, "tensors", (double)x->ck->ntensors);
		cJSON_AddNumberToObject(d, "bytes", (double)x->nbytes);
		if (x->ep_size > 0) {
			cJSON_AddNumberToObject(d, "ep_size", x->ep_size);
			cJSON_AddNumberToObject(d, "ep_rank", x->ep_rank);
			if (x->cls.experts)
				cJSON_AddRawToObject(d, "experts", x->cls.experts);
		}
		cJSON_AddNumberToObject(d, "copy", copy);
		json_put(d, "files", files_json(x));
		json_put(d, "configs", configs_json(x->ck));
		if (x->trees_added)
			cJSON_AddNumberToObject(d, "trees", (double)x->trees_added);
		if ((rc = log_json(inv, "add", x->digest, d, err)) != MS_OK)
			goto out;
	} else {
		rc = db_fail(inv, err, "cannot look up a state");
		goto out;
	}
	x->st.copy = copy;
	if ((rc = set_label(x, sid, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < x->o->nparents; i++)
		if ((rc = add_edge(x, sid, x->parents[i], err)) != MS_OK)
			goto out;
	if (x->o->run_id > 0 && (rc = run_output_locked(inv, x->o->run_id, x->digest, sid, err)) != MS_OK)
		goto out;
	/* trees of files already recorded (no add or copy entry above says so) */
	if (x->trees_added && !x->st.new_copy &&
	    (rc = log_trees(inv, x->digest, "add", x->trees_added, err)) != MS_OK)
		goto out;
	rc = tx_commit(inv, err);
	ms_free(ids);
	return rc;
out:
	sqlite3_finalize(st);
	tx_rollback(inv);
	ms_free(ids);
	return rc;
}

/* Reconcile the kind and EP placement asked for with what the files say. */
static int reconcile(struct addctx *x, struct ms_err *err)
{
	const struct ms_inv_add_opts *o = x->o;
	enum ms_inv_kind kind = o->kind;

	if (kind != MS_INV_KIND_ANY && !kind_compatible(x->cls.kind, kind))
		return ms_err_set(err, MS_EINVAL, "--kind %s contradicts the files: %s",
				  ms_inv_kind_name(kind), x->cls.why);
	x->ep_size = x->cls.ep_size;
	x->ep_rank = x->cls.ep_rank;
	if (o->ep_size >= 0) {
		if (x->cls.ep_size > 0 && (x->cls.ep_size != o->ep_size || x->cls.ep_rank != o->ep_rank))
			return ms_err_set(err, MS_EINVAL,
					  "--ep-size %d --ep-rank %d contradict the files: %s",
					  o->ep_size, o->ep_rank, x->cls.why);
		x->ep_size = o->ep_size;
		x->ep_rank = o->ep_rank;
	}
	if (x->ep_size > 0) {
		if (kind == MS_INV_KIND_ANY && (x->cls.kind == MS_INV_KIND_ANY ||
						kind_compatible(x->cls.kind, MS_INV_KIND_ADAPTER_SHARD)))
			kind = MS_INV_KIND_ADAPTER_SHARD;
		if (kind != MS_INV_KIND_ADAPTER_SHARD)
			return ms_err_set(err, MS_EINVAL,
					  "an EP placement (rank %d of %d) is only for adapter_shard states, and %s",
					  x->ep_rank, x->ep_size,
					  o->kind != MS_INV_KIND_ANY ? "--kind says otherwise" : x->cls.why);
	}
	if (kind == MS_INV_KIND_ANY)
		kind = x->cls.kind == MS_INV_KIND_ANY ? MS_INV_KIND_BASE : x->cls.kind;
	if (kind == MS_INV_KIND_ADAPTER_SHARD && x->ep_size <= 0)
		return ms_err_set(err, MS_EINVAL,
				  "an adapter_shard needs --ep-size and --ep-rank (or msinv.ep.* metadata in its files)");
	x->kind = kind;
	return MS_OK;
}

static int check_opts(struct ms_inv *inv, const struct ms_inv_add_opts *o, struct addctx *x,
		      struct ms_err *err)
{
	int rc;

	if ((unsigned)o->kind >= MS_INV_KIND_COUNT)
		return ms_err_set(err, MS_EINVAL, "unknown kind %d", (int)o->kind);
	if (o->label && (rc = label_check(o->label, err)) != MS_OK)
		return rc;
	if (o->nparents > MS_INV_MAX_PARENTS)
		return ms_err_set(err, MS_EINVAL, "at most %d parents", MS_INV_MAX_PARENTS);
	if (o->nparents && !o->operation)
		return ms_err_set(err, MS_EINVAL, "a parent needs the operation that made the state (--op)");
	if (o->operation && !o->nparents)
		return ms_err_set(err, MS_EINVAL, "an operation needs the parent it was applied to (--parent)");
	if (o->params_json && !o->nparents)
		return ms_err_set(err, MS_EINVAL, "parameters need a parent and an operation (--parent, --op)");
	if (o->operation && !ms_inv_op_valid(o->operation))
		return ms_err_set(err, MS_EINVAL,
				  "unknown operation '%s' (quantize, dequantize, transpose, split, reshard, merge, train, compose)",
				  o->operation);
	if ((o->ep_size < 0) != (o->ep_rank < 0))
		return ms_err_set(err, MS_EINVAL, "--ep-size and --ep-rank go together");
	if (o->ep_size == 0 || (o->ep_size > 0 && o->ep_rank >= o->ep_size))
		return ms_err_set(err, MS_EINVAL, "ep rank %d is not a rank of ep size %d", o->ep_rank,
				  o->ep_size);
	if (o->run_id < 0)
		return ms_err_set(err, MS_EINVAL, "bad run id %lld", (long long)o->run_id);
	{
		const char *p = o->params_json ? o->params_json : "{}";
		cJSON *j;
		int nomem;

		if (strlen(p) > MS_INV_MAX_PARAMS)
			return ms_err_set(err, MS_EINVAL, "parameters are longer than %u bytes",
					  MS_INV_MAX_PARAMS);
		j = ms_json_parse(p, strlen(p), &nomem);
		if (nomem)
			return oom(err);
		if (!cJSON_IsObject(j)) {
			cJSON_Delete(j);
			return ms_err_set(err, MS_EINVAL, "parameters '%s' are not a JSON object", p);
		}
		x->params = json_take(j);
		if (!x->params)
			return oom(err);
	}
	if (o->nparents) {
		x->parents = ms_calloc(o->nparents, sizeof(*x->parents));
		if (!x->parents)
			return oom(err);
		for (size_t i = 0; i < o->nparents; i++)
			if ((rc = ms_inv_resolve(inv, o->parents[i], x->parents[i], err)) != MS_OK)
				return ms_err_prefix(err, "parent");
	}
	return MS_OK;
}

/* Every file read in full must still be the file that was opened. */
static int unchanged_since_open(const struct ms_st_file *f, struct ms_err *err)
{
	struct stat st;

	if (stat(f->path, &st))
		return ms_err_set(err, MS_EIO, "'%s': vanished while it was being hashed", f->path);
	if ((uint64_t)st.st_size != f->size || (uint64_t)st.st_ino != f->ino ||
	    (uint64_t)st.st_dev != f->dev ||
	    (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec != f->mtime_ns ||
	    (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec != f->ctime_ns)
		return ms_err_set(err, MS_EIO, "'%s': changed while it was being hashed", f->path);
	return MS_OK;
}

int ms_inv_add_paths(struct ms_inv *inv, const char *const *paths, size_t n,
		     const struct ms_inv_add_opts *opts, char digest_out[MS_STATE_DIGEST_LEN],
		     struct ms_err *err)
{
	struct ms_inv_add_opts defaults;
	struct addctx x;
	struct ms_st_file **tohash = NULL;
	char *saved_tool = NULL, *saved_argv = NULL, *argv_json = NULL;
	size_t m = 0;
	double t0;
	int rc;

	memset(&x, 0, sizeof(x));
	x.cls.ep_size = x.cls.ep_rank = -1;
	if (!opts) {
		ms_inv_add_opts_init(&defaults);
		opts = &defaults;
	}
	if (opts->stats)
		memset(opts->stats, 0, sizeof(*opts->stats));
	x.inv = inv;
	x.o = opts;
	if (n == 0)
		return ms_err_set(err, MS_EINVAL, "no paths given");
	if ((rc = check_opts(inv, opts, &x, err)) != MS_OK)
		goto out;
	if ((rc = ms_ckpt_open_many(paths, n, &x.ck, err)) != MS_OK)
		goto out;
	x.af = ms_calloc(x.ck->nfiles, sizeof(*x.af));
	tohash = ms_calloc(x.ck->nfiles, sizeof(*tohash));
	if (!x.af || !tohash) {
		rc = oom(err);
		goto out;
	}
	for (size_t i = 0; i < x.ck->nfiles; i++) {
		struct addfile *a = &x.af[i];
		char *r = realpath(x.ck->files[i]->path, NULL);

		a->f = x.ck->files[i];
		a->name = x.ck->file_names[i];
		if (!r) {
			rc = ms_err_set(err, MS_EIO, "'%s': %s", a->f->path, strerror(errno));
			goto out;
		}
		a->real = ms_strdup(r);
		free(r);
		if (!a->real) {
			rc = oom(err);
			goto out;
		}
		if (!opts->rehash &&
		    (rc = reuse_digests(inv, a, opts->file_digests, &a->reused, err)) != MS_OK)
			goto out;
		if (!a->reused) {
			tohash[m++] = a->f;
			x.st.bytes_hashed += a->f->size;
		}
	}
	t0 = ms_now();
	/* tree digests in the same pass: a state is ready for fast verified
	 * loads from the start (ms(5), "Tree digests") */
	if (m && (rc = ms_st_hash_files_ex(tohash, m, opts->jobs, opts->file_digests, 1,
					   ms_inv_progress(inv), err)) != MS_OK)
		goto out;
	x.st.seconds_hash = ms_now() - t0;
	for (size_t i = 0; i < m; i++) {
		if ((rc = unchanged_since_open(tohash[i], err)) != MS_OK)
			goto out;
		if (tohash[i]->blob_digest && tohash[i]->has_file_digest) {
			char hex[65];

			ms_hex(tohash[i]->file_digest, MS_SHA256_LEN, hex);
			if (strcmp(hex, tohash[i]->blob_digest)) {
				rc = ms_err_set(err, MS_ECHECK,
						"'%s': file digest %s does not match its blob name %s",
						tohash[i]->path, hex, tohash[i]->blob_digest);
				goto out;
			}
		}
	}
	for (size_t i = 0; i < x.ck->ntensors; i++)
		x.nbytes += x.ck->tensors[i]->nbytes;
	if ((rc = ms_state_digest(x.ck->tensors, x.ck->ntensors, x.digest, err)) != MS_OK)
		goto out;
	if ((rc = classify_ckpt(x.ck, &x.cls, err)) != MS_OK)
		goto out;
	if ((rc = reconcile(&x, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < x.ck->nfiles; i++)
		if ((rc = content_digest(x.af[i].f, x.af[i].content)) != MS_OK) {
			rc = ms_sha256_err(err, rc);
			goto out;
		}
	if (opts->tool || opts->argv) {
		argv_json = argv_to_json(opts->argv ? opts->argc : 0, opts->argv);
		saved_tool = inv->tool;
		saved_argv = inv->argv_json;
		inv->tool = ms_strdup(opts->tool ? opts->tool : saved_tool);
		inv->argv_json = argv_json;
		if (!argv_json || !inv->tool) {
			rc = oom(err);
			goto out;
		}
	}
	t0 = ms_now();
	rc = record(&x, err);
	x.st.seconds_db = ms_now() - t0;
	if (rc == MS_OK)
		memcpy(digest_out, x.digest, MS_STATE_DIGEST_LEN);
out:
	if (saved_tool) {
		ms_free(inv->tool);
		ms_free(inv->argv_json);
		inv->tool = saved_tool;
		inv->argv_json = saved_argv;
	} else {
		ms_free(argv_json);
	}
	if (opts->stats) {
		x.st.files = x.ck ? (uint32_t)x.ck->nfiles : 0;
		x.st.files_hashed = (uint32_t)m;
		x.st.tensors = x.ck ? x.ck->ntensors : 0;
		x.st.bytes = x.nbytes;
		x.st.kind = x.kind;
		snprintf(x.st.layout, sizeof(x.st.layout), "%s", x.cls.layout);
		*opts->stats = x.st;
	}
	for (size_t i = 0; x.af && i < x.ck->nfiles; i++)
		ms_free(x.af[i].real);
	ms_free(x.af);
	ms_free(tohash);
	ms_free(x.parents);
	ms_free(x.params);
	ms_free(x.cls.experts);
	ms_ckpt_close(x.ck);
	return rc;
}

/* ---- looking up ---------------------------------------------------------------------- */

/* The realpaths of the .safetensors files of a path: the file itself, or
 * those directly in a directory (links followed, as add records them). */
static int path_files(const char *path, const struct stat *sb, char ***out, size_t *n,
		      struct ms_err *err)
{
	DIR *d = NULL;
	struct dirent *de;
	char **v = NULL;
	size_t cap = 0;
	int rc = MS_OK;

	*out = NULL;
	*n = 0;
	if (!S_ISDIR(sb->st_mode)) {
		if (!(v = ms_calloc(1, sizeof(*v))))
			return oom(err);
		if (!(v[0] = realpath(path, NULL))) {
			ms_free(v);
			return ms_err_set(err, MS_EIO, "'%s': %s", path, strerror(errno));
		}
		*out = v;
		*n = 1;
		return MS_OK;
	}
	if (!(d = opendir(path)))
		return ms_err_set(err, MS_EIO, "'%s': cannot read the directory: %s", path,
				  strerror(errno));
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		char *p, *r;

		if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors") || de->d_name[0] == '.')
			continue;
		if (!(p = ms_path_join(path, de->d_name))) {
			rc = oom(err);
			goto out;
		}
		r = realpath(p, NULL);
		ms_free(p);
		if (!r)
			continue;
		if (*n == cap) {
			char **nv = ms_realloc(v, (cap ? cap * 2 : 8) * sizeof(*v));

			if (!nv) {
				free(r);
				rc = oom(err);
				goto out;
			}
			v = nv;
			cap = cap ? cap * 2 : 8;
		}
		v[(*n)++] = r;
	}
out:
	closedir(d);
	if (rc != MS_OK) {
		for (size_t i = 0; i < *n; i++)
			free(v[i]);
		ms_free(v);
		*n = 0;
		return rc;
	}
	*out = v;
	return MS_OK;
}

/*
 * A path names the state recorded with its files, as git's rev-parse turns
 * a path into an object: a directory, the state with a copy made of the
 * .safetensors files directly in it; a file, the state with a copy made of
 * that file alone, else the one state with a copy holding it. A path's
 * newest file record counts (an older one is bytes that were replaced).
 * *found is 0 when ref is not a path that exists.
 */
static int resolve_path(struct ms_inv *inv, const char *ref, char digest_out[MS_STATE_DIGEST_LEN],
			int *found, struct ms_err *err)
{
	static const char *const q =
		"SELECT s.digest, sf.copy, "
		"(SELECT count(*) FROM state_files x WHERE x.state_id = sf.state_id AND x.copy = sf.copy) "
		"FROM files f JOIN state_files sf ON sf.file_id = f.id JOIN states s ON s.id = sf.state_id "
		"WHERE f.path = ?1 AND f.id = (SELECT max(id) FROM files WHERE path = ?1) "
		"ORDER BY s.digest, sf.copy";
	sqlite3_stmt *st = NULL, *in = NULL;
	char **files = NULL, cand[6][MS_STATE_DIGEST_LEN], part[MS_STATE_DIGEST_LEN] = "";
	struct stat sb;
	size_t n = 0;
	int rc, k = 0, partial = 0;

	*found = 0;
	if (stat(ref, &sb) || !(S_ISDIR(sb.st_mode) || S_ISREG(sb.st_mode)))
		return MS_OK;
	*found = 1;
	if ((rc = path_files(ref, &sb, &files, &n, err)) != MS_OK)
		return rc;
	if (n == 0) {
		rc = ms_err_set(err, MS_ENOTFOUND, "'%s': no .safetensors files there", ref);
		goto out;
	}
	/* candidates: the copies holding the first file; a match holds every
	 * file of the path and nothing else */
	if ((rc = prep(inv, q, &st, err)) != MS_OK ||
	    (rc = prep(inv, "SELECT count(*) FROM state_files sf JOIN files f ON f.id = sf.file_id "
			    "JOIN states s ON s.id = sf.state_id WHERE s.digest = ? AND sf.copy = ? "
			    "AND f.path = ? AND f.id = (SELECT max(id) FROM files WHERE path = f.path)",
			    &in, err)) != MS_OK)
		goto out;
	bind_text(st, 1, files[0]);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *dg = col_str(st, 0);
		int64_t copy = sqlite3_column_int64(st, 1), nf = sqlite3_column_int64(st, 2);
		size_t have = 0;

		if (sqlite3_column_bytes(st, 0) != MS_STATE_DIGEST_LEN - 1)
			continue;
		for (size_t i = 0; i < n; i++) {
			sqlite3_reset(in);
			bind_text(in, 1, dg);
			sqlite3_bind_int64(in, 2, copy);
			bind_text(in, 3, files[i]);
			if (sqlite3_step(in) == SQLITE_ROW)
				have += sqlite3_column_int64(in, 0) > 0;
		}
		if (have == n && (uint64_t)nf == n) {
			if (k && !strcmp(cand[k - 1], dg))
				continue;  /* another copy of the same state */
			if (k < 6)
				memcpy(cand[k++], dg, MS_STATE_DIGEST_LEN);
		} else if (n == 1 && !S_ISDIR(sb.st_mode) && !partial) {
			/* a file that is part of a state's copy: the state, if
			 * no state is that file alone */
			partial = 1;
			memcpy(part, dg, MS_STATE_DIGEST_LEN);
		} else if (n == 1 && !S_ISDIR(sb.st_mode) && strcmp(part, dg)) {
			partial = 2;
		}
	}
	if (rc != SQLITE_DONE) {
		rc = db_fail(inv, err, "cannot look up a path");
		goto out;
	}
	if (k == 0 && partial == 1) {
		memcpy(digest_out, part, MS_STATE_DIGEST_LEN);
		rc = MS_OK;
	} else if (k == 1) {
		memcpy(digest_out, cand[0], MS_STATE_DIGEST_LEN);
		rc = MS_OK;
	} else if (k > 1) {
		rc = ms_err_set(err, MS_EINVAL, "'%s' holds several states: %.23s..., %.23s...%s", ref,
				cand[0], cand[1], k > 2 ? ", ..." : "");
	} else if (partial == 2) {
		rc = ms_err_set(err, MS_EINVAL, "'%s' is a file of several states; name the state", ref);
	} else if (S_ISDIR(sb.st_mode)) {
		/* no copy is the directory's files: the states that have
		 * files there (an EP shard set: one state per file) */
		for (size_t i = 0; i < n && k < 6; i++) {
			sqlite3_reset(st);
			bind_text(st, 1, files[i]);
			while (k < 6 && sqlite3_step(st) == SQLITE_ROW) {
				const char *dg = col_str(st, 0);
				int seen = 0;

				for (int j = 0; j < k; j++)
					seen |= !strcmp(cand[j], dg);
				if (!seen && sqlite3_column_bytes(st, 0) == MS_STATE_DIGEST_LEN - 1)
					memcpy(cand[k++], dg, MS_STATE_DIGEST_LEN);
			}
		}
		if (k > 1)
			rc = ms_err_set(err, MS_EINVAL, "'%s' holds several states: %.23s..., %.23s...%s; name one",
					ref, cand[0], cand[1], k > 2 ? ", ..." : "");
		else if (k == 1)
			rc = ms_err_set(err, MS_EINVAL,
					"'%s' holds the files of %.23s... and others; name the state", ref,
					cand[0]);
		else
			rc = ms_err_set(err, MS_ENOTFOUND,
					"'%s': no state in '%s' is stored there (add it with 'msinv add')",
					ref, inv->path);
	} else {
		rc = ms_err_set(err, MS_ENOTFOUND,
				"'%s': no state in '%s' is stored there (add it with 'msinv add')", ref,
				inv->path);
	}
out:
	sqlite3_finalize(st);
	sqlite3_finalize(in);
	for (size_t i = 0; i < n; i++)
		free(files[i]);
	ms_free(files);
	return rc;
}

int ms_inv_resolve(struct ms_inv *inv, const char *ref, char digest_out[MS_STATE_DIGEST_LEN],
		   struct ms_err *err)
{
	int found;

	sqlite3_stmt *st = NULL;
	char pat[7 + 64 + 2], cand[6][MS_STATE_DIGEST_LEN];
	const char *hex;
	size_t n;
	int rc, k = 0;

	if (!ref || !*ref)
		return ms_err_set(err, MS_EINVAL, "empty state reference");
	if ((rc = prep(inv, "SELECT s.digest FROM labels l JOIN states s ON s.id = l.state_id "
			    "WHERE l.name = ?", &st, err)) != MS_OK)
		return rc;
	bind_text(st, 1, ref);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW && sqlite3_column_bytes(st, 0) == MS_STATE_DIGEST_LEN - 1) {
		memcpy(digest_out, sqlite3_column_text(st, 0), MS_STATE_DIGEST_LEN);
		sqlite3_finalize(st);
		return MS_OK;
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE && rc != SQLITE_ROW)
		return db_fail(inv, err, "cannot look up a label");
	/* not a label: a path that exists names the state stored there */
	if (strncmp(ref, "sha256:", 7) &&
	    ((rc = resolve_path(inv, ref, digest_out, &found, err)) != MS_OK || found))
		return rc;
	hex = strncmp(ref, "sha256:", 7) ? ref : ref + 7;
	n = strlen(hex);
	if (!hex_ok(hex, n) || n > 64) {
		if (hex != ref)
			return ms_err_set(err, MS_EINVAL, "'%s': not a digest (sha256: and hex digits)", ref);
		return ms_err_set(err, MS_ENOTFOUND, "no state labelled '%s' in '%s'", ref, inv->path);
	}
	if (n < MS_INV_MIN_PREFIX)
		return ms_err_set(err, MS_EINVAL, "'%s': a digest prefix needs at least %d hex digits",
				  ref, MS_INV_MIN_PREFIX);
	memcpy(pat, "sha256:", 7);
	for (size_t i = 0; i < n; i++)
		pat[7 + i] = (char)tolower((unsigned char)hex[i]);
	pat[7 + n] = '*';
	pat[8 + n] = 0;
	if ((rc = prep(inv, "SELECT digest FROM states WHERE digest GLOB ? ORDER BY digest LIMIT 6",
		       &st, err)) != MS_OK)
		return rc;
	bind_text(st, 1, pat);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (sqlite3_column_bytes(st, 0) == MS_STATE_DIGEST_LEN - 1)
			memcpy(cand[k++], sqlite3_column_text(st, 0), MS_STATE_DIGEST_LEN);
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return db_fail(inv, err, "cannot look up a digest");
	if (k == 0)
		return ms_err_set(err, MS_ENOTFOUND, "no state '%s' in '%s'", ref, inv->path);
	if (k > 1) {
		char list[600];
		size_t l = 0;

		for (int i = 0; i < k && i < 5; i++)
			l += (size_t)snprintf(list + l, sizeof(list) - l, "%s%.23s...", i ? ", " : "",
					      cand[i]);
		return ms_err_set(err, MS_EINVAL, "'%s' is ambiguous: %s%s", ref, list,
				  k > 5 ? ", ..." : "");
	}
	memcpy(digest_out, cand[0], MS_STATE_DIGEST_LEN);
	return MS_OK;
}

int ms_inv_state_at_path(struct ms_inv *inv, const char *path,
			 char digest_out[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	char *real = realpath(path, NULL), *dir = NULL;
	int rc;

	if (!real)
		return ms_err_set(err, errno == ENOMEM ? MS_ENOMEM : MS_EIO,
				  "'%s': %s", path, strerror(errno));
	if (!(dir = ms_path_join(real, ""))) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	/* the file itself, or a file directly inside the directory; the
	 * newest registration wins (a replaced output registered again) */
	if ((rc = prep(inv,
		       "SELECT s.digest FROM states s JOIN state_files sf ON sf.state_id = s.id "
		       "JOIN files f ON f.id = sf.file_id WHERE f.path = ?1 OR "
		       "(substr(f.path, 1, length(?2)) = ?2 AND "
		       "instr(substr(f.path, length(?2) + 1), '/') = 0) "
		       "ORDER BY s.id DESC LIMIT 1", &st, err)) != MS_OK)
		goto out;
	bind_text(st, 1, real);
	bind_text(st, 2, dir);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW && sqlite3_column_bytes(st, 0) == MS_STATE_DIGEST_LEN - 1) {
		memcpy(digest_out, sqlite3_column_text(st, 0), MS_STATE_DIGEST_LEN);
		rc = MS_OK;
	} else if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
		rc = ms_err_set(err, MS_ENOTFOUND, "'%s': no state of '%s' is recorded there", path,
				inv->path);
	} else {
		rc = db_fail(inv, err, "cannot look up a path");
	}
out:
	sqlite3_finalize(st);
	ms_free(dir);
	free(real);
	return rc;
}

#define STATE_COLS                                                                   \
	"s.id, s.digest, s.kind, s.layout, s.label, s.ntensors, s.nbytes, s.ep_size, "    \
	"s.ep_rank, s.experts, s.tool, s.argv, s.user, s.host, s.created_at, "          \
	"(SELECT count(DISTINCT copy) FROM state_files WHERE state_id = s.id), s.cwd, " \
	"(SELECT group_concat(name, ' ') FROM (SELECT name FROM labels "               \
	"WHERE state_id = s.id ORDER BY created_at, name))"

static int state_row(struct ms_inv *inv, sqlite3_stmt *st, struct ms_inv_state *s,
		     struct ms_err *err)
{
	int bad = 0;

	memset(s, 0, sizeof(*s));
	s->id = sqlite3_column_int64(st, 0);
	if (sqlite3_column_bytes(st, 1) != MS_STATE_DIGEST_LEN - 1 ||
	    ms_inv_kind_parse(col_str(st, 2), &s->kind) != MS_OK)
		return ms_err_set(err, MS_EDB, "'%s': state row %lld is malformed", inv->path,
				  (long long)s->id);
	memcpy(s->digest, sqlite3_column_text(st, 1), MS_STATE_DIGEST_LEN);
	s->layout = col_dup(st, 3, &bad);
	s->label = col_dup(st, 4, &bad);
	s->ntensors = (uint64_t)sqlite3_column_int64(st, 5);
	s->nbytes = (uint64_t)sqlite3_column_int64(st, 6);
	s->ep_size = sqlite3_column_type(st, 7) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 7);
	s->ep_rank = sqlite3_column_type(st, 8) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 8);
	s->experts = col_dup(st, 9, &bad);
	s->tool = col_dup(st, 10, &bad);
	s->argv = col_dup(st, 11, &bad);
	s->user = col_dup(st, 12, &bad);
	s->host = col_dup(st, 13, &bad);
	s->created_at = col_dup(st, 14, &bad);
	s->ncopies = (uint32_t)sqlite3_column_int64(st, 15);
	s->cwd = col_dup(st, 16, &bad);
	s->labels = col_dup(st, 17, &bad);
	return bad ? oom(err) : MS_OK;
}

static void state_release(struct ms_inv_state *s)
{
	ms_free(s->layout);
	ms_free(s->label);
	ms_free(s->experts);
	ms_free(s->tool);
	ms_free(s->argv);
	ms_free(s->user);
	ms_free(s->host);
	ms_free(s->created_at);
	ms_free(s->cwd);
	ms_free(s->labels);
}

void ms_inv_state_free(struct ms_inv_state *s)
{
	if (!s)
		return;
	state_release(s);
	ms_free(s);
}

void ms_inv_states_free(struct ms_inv_state *s, size_t n)
{
	for (size_t i = 0; s && i < n; i++)
		state_release(&s[i]);
	ms_free(s);
}

int ms_inv_state_get(struct ms_inv *inv, const char *digest, struct ms_inv_state **out,
		     struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_state *s;
	int rc;

	*out = NULL;
	if ((rc = prep(inv, "SELECT " STATE_COLS " FROM states s WHERE s.digest = ?", &st, err)) != MS_OK)
		return rc;
	bind_text(st, 1, digest);
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		sqlite3_finalize(st);
		if (rc == SQLITE_DONE)
			return ms_err_set(err, MS_ENOTFOUND, "no state %s in '%s'", digest, inv->path);
		return db_fail(inv, err, "cannot read a state");
	}
	s = ms_malloc(sizeof(*s));
	if (!s) {
		sqlite3_finalize(st);
		return oom(err);
	}
	rc = state_row(inv, st, s, err);
	sqlite3_finalize(st);
	if (rc != MS_OK) {
		ms_inv_state_free(s);
		return rc;
	}
	*out = s;
	return MS_OK;
}

/* Grow an array of elements of size sz to hold n+1. */
static int grow(void **arr, size_t *cap, size_t n, size_t sz)
{
	void *p;
	size_t nc;

	if (n < *cap)
		return 0;
	nc = *cap ? *cap * 2 : 16;
	p = ms_realloc(*arr, nc * sz);
	if (!p)
		return -1;
	*arr = p;
	*cap = nc;
	return 0;
}

int ms_inv_states_list(struct ms_inv *inv, enum ms_inv_kind kind, struct ms_inv_state **out,
		       size_t *n, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_state *a = NULL;
	size_t k = 0, cap = 0;
	int rc;

	*out = NULL;
	*n = 0;
	if ((rc = prep(inv, "SELECT " STATE_COLS " FROM states s WHERE ?1 = 'any' OR s.kind = ?1 "
			    "ORDER BY s.id", &st, err)) != MS_OK)
		return rc;
	bind_text(st, 1, ms_inv_kind_name(kind));
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (grow((void **)&a, &cap, k, sizeof(*a))) {
			rc = oom(err);
			goto out;
		}
		if ((rc = state_row(inv, st, &a[k], err)) != MS_OK) {
			state_release(&a[k]);
			goto out;
		}
		k++;
	}
	rc = rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot list states");
out:
	sqlite3_finalize(st);
	if (rc != MS_OK) {
		ms_inv_states_free(a, k);
		return rc;
	}
	*out = a;
	*n = k;
	return MS_OK;
}

/* "[d0,d1,...]" as written by ms_shape_str. */
static int parse_shape(const char *s, uint32_t *ndim, uint64_t *shape)
{
	uint32_t n = 0;

	if (*s++ != '[')
		return -1;
	if (*s == ']')
		return s[1] ? -1 : (*ndim = 0, 0);
	for (;;) {
		char num[24];
		size_t l = strspn(s, "0123456789");

		if (l == 0 || l >= sizeof(num) || n >= MS_ST_MAX_RANK)
			return -1;
		memcpy(num, s, l);
		num[l] = 0;
		if (ms_parse_u64(num, UINT64_MAX, &shape[n++]))
			return -1;
		s += l;
		if (*s == ']')
			break;
		if (*s++ != ',')
			return -1;
	}
	if (s[1])
		return -1;
	*ndim = n;
	return 0;
}

static int load_tensors(struct ms_inv *inv, sqlite3_stmt *st, struct ms_inv_file *f,
			struct ms_err *err)
{
	size_t cap = 0;
	int rc;

	sqlite3_reset(st);
	sqlite3_bind_int64(st, 1, f->id);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct ms_inv_tensor *t;
		const char *dt = col_str(st, 1);
		int bad = 0;

		if (grow((void **)&f->tensors, &cap, f->ntensors, sizeof(*f->tensors)))
			return oom(err);
		t = &f->tensors[f->ntensors];
		memset(t, 0, sizeof(*t));
		t->name = col_dup(st, 0, &bad);
		if (bad)
			return oom(err);
		f->ntensors++;
		t->offset = (uint64_t)sqlite3_column_int64(st, 3);
		t->nbytes = (uint64_t)sqlite3_column_int64(st, 4);
		if (ms_dtype_parse(dt, strlen(dt), &t->dtype) != MS_OK ||
		    parse_shape(col_str(st, 2), &t->ndim, t->shape) ||
		    digest_from_hex(col_str(st, 5), t->digest) ||
		    (sqlite3_column_type(st, 6) != SQLITE_NULL &&
		     digest_from_hex(col_str(st, 6), t->tree)))
			return ms_err_set(err, MS_EDB, "'%s': the record of tensor '%s' in '%s' is malformed",
					  inv->path, t->name, f->path);
		t->has_tree = sqlite3_column_type(st, 6) != SQLITE_NULL;
	}
	return rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot read tensors");
}

void ms_inv_files_release(struct ms_inv_files *fl)
{
	if (!fl)
		return;
	for (size_t i = 0; i < fl->n; i++) {
		struct ms_inv_file *f = &fl->files[i];

		for (size_t t = 0; t < f->ntensors; t++)
			ms_free(f->tensors[t].name);
		ms_free(f->tensors);
		ms_free(f->name);
		ms_free(f->path);
	}
	ms_free(fl->files);
	fl->files = NULL;
	fl->n = 0;
}

int ms_inv_state_files(struct ms_inv *inv, const char *digest, uint32_t copy, int with_tensors,
		       struct ms_inv_files *out, struct ms_err *err)
{
	sqlite3_stmt *st = NULL, *tst = NULL;
	size_t cap = 0;
	int64_t sid;
	int rc;

	memset(out, 0, sizeof(*out));
	sid = state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		return rc;
	if ((rc = prep(inv,
		       "SELECT f.id, sf.copy, sf.name, f.path, f.size, f.dev, f.inode, f.header_len, "
		       "f.mtime_ns, f.ctime_ns, f.header_digest, f.file_digest FROM state_files sf "
		       "JOIN files f ON f.id = sf.file_id WHERE sf.state_id = ?1 AND (?2 = 0 OR sf.copy = ?2) "
		       "ORDER BY sf.copy, sf.name", &st, err)) != MS_OK)
		return rc;
	if (with_tensors &&
	    (rc = prep(inv, "SELECT t.name, t.dtype, t.shape, t.byte_offset, t.nbytes, t.digest, "
			    "td.tree FROM tensors t LEFT JOIN tree_digests td ON td.digest = t.digest "
			    "AND td.chunk_log2 = " TREE_LOG2_TEXT " AND td.nbytes = t.nbytes "
			    "WHERE t.file_id = ? ORDER BY t.byte_offset", &tst, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, copy);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct ms_inv_file *f;
		int bad = 0;

		if (grow((void **)&out->files, &cap, out->n, sizeof(*out->files))) {
			rc = oom(err);
			goto out;
		}
		f = &out->files[out->n++];
		memset(f, 0, sizeof(*f));
		f->id = sqlite3_column_int64(st, 0);
		f->copy = (uint32_t)sqlite3_column_int64(st, 1);
		f->name = col_dup(st, 2, &bad);
		f->path = col_dup(st, 3, &bad);
		f->size = (uint64_t)sqlite3_column_int64(st, 4);
		f->dev = (uint64_t)sqlite3_column_int64(st, 5);
		f->inode = (uint64_t)sqlite3_column_int64(st, 6);
		f->header_len = (uint64_t)sqlite3_column_int64(st, 7);
		f->mtime_ns = sqlite3_column_int64(st, 8);
		f->ctime_ns = sqlite3_column_int64(st, 9);
		if (bad) {
			rc = oom(err);
			goto out;
		}
		if (digest_from_hex(col_str(st, 10), f->header_digest)) {
			rc = ms_err_set(err, MS_EDB, "'%s': the record of file '%s' is malformed",
					inv->path, f->path);
			goto out;
		}
		if (sqlite3_column_type(st, 11) != SQLITE_NULL) {
			if (digest_from_hex(col_str(st, 11), f->file_digest)) {
				rc = ms_err_set(err, MS_EDB, "'%s': the record of file '%s' is malformed",
						inv->path, f->path);
				goto out;
			}
			f->has_file_digest = 1;
		}
		if (with_tensors && (rc = load_tensors(inv, tst, f, err)) != MS_OK)
			goto out;
	}
	rc = rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot read the files of a state");
out:
	sqlite3_finalize(st);
	sqlite3_finalize(tst);
	if (rc != MS_OK)
		ms_inv_files_release(out);
	return rc;
}

void ms_inv_configs_free(struct ms_inv_config *c, size_t n)
{
	for (size_t i = 0; c && i < n; i++) {
		ms_free(c[i].name);
		ms_free(c[i].path);
		ms_free(c[i].text);
	}
	ms_free(c);
}

int ms_inv_state_configs(struct ms_inv *inv, const char *digest, struct ms_inv_config **out,
			 size_t *n, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_config *a = NULL;
	size_t k = 0, cap = 0;
	int64_t sid;
	int rc;

	*out = NULL;
	*n = 0;
	sid = state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		return rc;
	if ((rc = prep(inv, "SELECT copy, name, path, digest, content FROM state_configs "
			    "WHERE state_id = ? ORDER BY copy, name", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		int bad = 0;

		if (grow((void **)&a, &cap, k, sizeof(*a))) {
			rc = oom(err);
			goto out;
		}
		memset(&a[k], 0, sizeof(a[k]));
		a[k].copy = (uint32_t)sqlite3_column_int64(st, 0);
		a[k].name = col_dup(st, 1, &bad);
		a[k].path = col_dup(st, 2, &bad);
		a[k].text = col_dup(st, 4, &bad);
		a[k].len = (size_t)sqlite3_column_bytes(st, 4);
		k++;
		if (bad) {
			rc = oom(err);
			goto out;
		}
		if (digest_from_hex(col_str(st, 3), a[k - 1].digest)) {
			rc = ms_err_set(err, MS_EDB, "'%s': the record of '%s' is malformed", inv->path,
					a[k - 1].name);
			goto out;
		}
	}
	rc = rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot read configurations");
out:
	sqlite3_finalize(st);
	if (rc != MS_OK) {
		ms_inv_configs_free(a, k);
		return rc;
	}
	*out = a;
	*n = k;
	return MS_OK;
}

/* ---- lineage --------------------------------------------------------------------------- */

void ms_inv_edges_free(struct ms_inv_edge *e, size_t n)
{
	for (size_t i = 0; e && i < n; i++) {
		ms_free(e[i].parent_label);
		ms_free(e[i].child_label);
		ms_free(e[i].parent_layout);
		ms_free(e[i].child_layout);
		ms_free(e[i].operation);
		ms_free(e[i].params);
		ms_free(e[i].created_at);
	}
	ms_free(e);
}

int ms_inv_edges(struct ms_inv *inv, const char *digest, enum ms_inv_edges_which which,
		 struct ms_inv_edge **out, size_t *n, struct ms_err *err)
{
	static const char *const sel =
		"SELECT p.digest, p.label, p.kind, p.layout, c.digest, c.label, c.kind, c.layout, "
		"d.operation, d.params, d.run_id, d.created_at FROM derivations d "
		"JOIN states p ON p.id = d.parent_id JOIN states c ON c.id = d.child_id ";
	const char *where;
	char *sql = NULL;
	sqlite3_stmt *st = NULL;
	struct ms_inv_edge *a = NULL;
	size_t k = 0, cap = 0;
	int64_t sid;
	int rc;

	*out = NULL;
	*n = 0;
	sid = state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		return rc;
	switch (which) {
	case MS_INV_EDGES_PARENTS:
		where = "WHERE d.child_id = ?1";
		break;
	case MS_INV_EDGES_CHILDREN:
		where = "WHERE d.parent_id = ?1";
		break;
	case MS_INV_EDGES_ANCESTORS:
		where = "WHERE d.child_id IN (WITH RECURSIVE a(id) AS (SELECT ?1 UNION "
			"SELECT x.parent_id FROM derivations x JOIN a ON x.child_id = a.id) SELECT id FROM a)";
		break;
	case MS_INV_EDGES_DESCENDANTS:
		where = "WHERE d.parent_id IN (WITH RECURSIVE a(id) AS (SELECT ?1 UNION "
			"SELECT x.child_id FROM derivations x JOIN a ON x.parent_id = a.id) SELECT id FROM a)";
		break;
	default:
		return ms_err_set(err, MS_EINVAL, "bad edge selection %d", (int)which);
	}
	sql = ms_asprintf("%s%s ORDER BY d.created_at, p.digest, c.digest", sel, where);
	if (!sql)
		return oom(err);
	rc = prep(inv, sql, &st, err);
	ms_free(sql);
	if (rc != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct ms_inv_edge *e;
		int bad = 0;

		if (grow((void **)&a, &cap, k, sizeof(*a))) {
			rc = oom(err);
			goto out;
		}
		e = &a[k++];
		memset(e, 0, sizeof(*e));
		snprintf(e->parent, sizeof(e->parent), "%s", col_str(st, 0));
		e->parent_label = col_dup(st, 1, &bad);
		ms_inv_kind_parse(col_str(st, 2), &e->parent_kind);
		e->parent_layout = col_dup(st, 3, &bad);
		snprintf(e->child, sizeof(e->child), "%s", col_str(st, 4));
		e->child_label = col_dup(st, 5, &bad);
		ms_inv_kind_parse(col_str(st, 6), &e->child_kind);
		e->child_layout = col_dup(st, 7, &bad);
		e->operation = col_dup(st, 8, &bad);
		e->params = col_dup(st, 9, &bad);
		e->run_id = sqlite3_column_int64(st, 10);
		e->created_at = col_dup(st, 11, &bad);
		if (bad) {
			rc = oom(err);
			goto out;
		}
	}
	rc = rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot read derivations");
out:
	sqlite3_finalize(st);
	if (rc != MS_OK) {
		ms_inv_edges_free(a, k);
		return rc;
	}
	*out = a;
	*n = k;
	return MS_OK;
}

/* ---- lineage carried between inventories ---------------------------------------- */

#define LINEAGE_MAX_STATES 100000u

static int cmp_cstr(const void *a, const void *b);

static int digest_ok(const cJSON *v)
{
	const char *s = cJSON_IsString(v) ? v->valuestring : NULL;

	return s && strlen(s) == MS_STATE_DIGEST_LEN - 1 && !strncmp(s, "sha256:", 7) &&
	       strspn(s + 7, "0123456789abcdef") == 64;
}

static int str_ok(const cJSON *v)
{
	return cJSON_IsString(v) && v->valuestring[0];
}

/* A JSON number that is an integer in [0, max]. */
static int int_in(const cJSON *v, double max)
{
	return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= max &&
	       v->valuedouble == (double)(int64_t)v->valuedouble;
}

/* The state record of one lineage entry, or why it is malformed. */
static const char *lineage_state_bad(const cJSON *s)
{
	const cJSON *ep = cJSON_GetObjectItemCaseSensitive(s, "ep_size");
	const cJSON *rk = cJSON_GetObjectItemCaseSensitive(s, "ep_rank");
	const cJSON *lb = cJSON_GetObjectItemCaseSensitive(s, "label");
	const cJSON *ex = cJSON_GetObjectItemCaseSensitive(s, "experts");
	enum ms_inv_kind kind;

	if (!cJSON_IsObject(s) || !digest_ok(cJSON_GetObjectItemCaseSensitive(s, "state")))
		return "a state without a \"state\" digest";
	if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s, "kind")) ||
	    ms_inv_kind_parse(cJSON_GetObjectItemCaseSensitive(s, "kind")->valuestring, &kind) != MS_OK ||
	    kind == MS_INV_KIND_ANY)
		return "a state of unknown kind";
	if (!str_ok(cJSON_GetObjectItemCaseSensitive(s, "layout")))
		return "a state without a layout";
	if (lb && !cJSON_IsNull(lb) && (!str_ok(lb) || label_check(lb->valuestring, NULL) != MS_OK))
		return "a label this inventory would refuse";
	if (!int_in(cJSON_GetObjectItemCaseSensitive(s, "tensors"), 9e15) ||
	    !int_in(cJSON_GetObjectItemCaseSensitive(s, "bytes"), 9e15))
		return "a state without tensor and byte counts";
	if ((kind == MS_INV_KIND_ADAPTER_SHARD) != (ep && !cJSON_IsNull(ep)) ||
	    (ep && !cJSON_IsNull(ep) &&
	     (!int_in(ep, 1 << 20) || ep->valuedouble < 1 || !int_in(rk, 1 << 20) ||
	      rk->valuedouble >= ep->valuedouble)))
		return "an EP placement that does not fit its kind";
	if (ex && !cJSON_IsNull(ex) && !cJSON_IsArray(ex))
		return "experts that are not an array";
	if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(s, "argv")))
		return "a state without its argv";
	if (!str_ok(cJSON_GetObjectItemCaseSensitive(s, "tool")) ||
	    !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s, "user")) ||
	    !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s, "host")) ||
	    !str_ok(cJSON_GetObjectItemCaseSensitive(s, "created_at")))
		return "a state without its origin (tool, user, host, created_at)";
	return NULL;
}

static int lineage_lists(const cJSON *o, const char *digest, struct ms_err *err)
{
	const cJSON *states = cJSON_GetObjectItemCaseSensitive(o, "states");
	const cJSON *edges = cJSON_GetObjectItemCaseSensitive(o, "edges");
	const cJSON *s, *e;
	const char *why, **sorted = NULL;
	size_t n = 0;
	int rc = MS_OK;

	if (!cJSON_IsObject(o) || !cJSON_IsArray(states) || !cJSON_IsArray(edges))
		return ms_err_set(err, MS_EINVAL, "lineage: not an object of \"states\" and \"edges\" arrays");
	if ((unsigned)cJSON_GetArraySize(states) > LINEAGE_MAX_STATES ||
	    (unsigned)cJSON_GetArraySize(edges) > 4 * LINEAGE_MAX_STATES)
		return ms_err_set(err, MS_EINVAL, "lineage: more than %u states", LINEAGE_MAX_STATES);
	/* sorted digests: every edge end is looked up, whatever the counts */
	if (!(sorted = ms_malloc(((size_t)cJSON_GetArraySize(states) + 1) * sizeof(*sorted))))
		return oom(err);
	cJSON_ArrayForEach(s, states) {
		if ((why = lineage_state_bad(s))) {
			rc = ms_err_set(err, MS_EINVAL, "lineage: %s", why);
			goto out;
		}
		sorted[n] = cJSON_GetObjectItemCaseSensitive(s, "state")->valuestring;
		if (!strcmp(sorted[n++], digest)) {
			rc = ms_err_set(err, MS_EINVAL, "lineage: lists the state itself as its ancestor");
			goto out;
		}
	}
	qsort(sorted, n, sizeof(*sorted), cmp_cstr);
	for (size_t i = 1; i < n; i++) {
		if (!strcmp(sorted[i - 1], sorted[i])) {
			rc = ms_err_set(err, MS_EINVAL, "lineage: lists a state twice");
			goto out;
		}
	}
	cJSON_ArrayForEach(e, edges) {
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "child");
		const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "parent");
		int have_c, have_p;

		if (!cJSON_IsObject(e) || !digest_ok(c) || !digest_ok(p) ||
		    !strcmp(c->valuestring, p->valuestring) ||
		    !str_ok(cJSON_GetObjectItemCaseSensitive(e, "operation")) ||
		    !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(e, "params")) ||
		    !str_ok(cJSON_GetObjectItemCaseSensitive(e, "created_at"))) {
			rc = ms_err_set(err, MS_EINVAL,
					"lineage: an edge without child, parent, operation, params and created_at");
			goto out;
		}
		if (!ms_inv_op_valid(cJSON_GetObjectItemCaseSensitive(e, "operation")->valuestring)) {
			rc = ms_err_set(err, MS_EINVAL, "lineage: an edge of unknown operation '%s'",
					cJSON_GetObjectItemCaseSensitive(e, "operation")->valuestring);
			goto out;
		}
		/* every end is the state itself or one the lineage lists */
		have_c = !strcmp(c->valuestring, digest) ||
			 bsearch(&c->valuestring, sorted, n, sizeof(*sorted), cmp_cstr);
		have_p = bsearch(&p->valuestring, sorted, n, sizeof(*sorted), cmp_cstr) != NULL;
		if (!have_c || !have_p) {
			rc = ms_err_set(err, MS_EINVAL, "lineage: an edge to a state it does not list");
			goto out;
		}
	}
out:
	ms_free(sorted);
	return rc;
}

int ms_inv_lineage_check(const char *json, size_t len, const char *digest, struct ms_err *err)
{
	int nomem, rc;
	cJSON *o = ms_json_parse(json, len, &nomem);

	if (!o)
		return nomem ? oom(err) : ms_err_set(err, MS_EINVAL, "lineage: not JSON");
	rc = lineage_lists(o, digest, err);
	cJSON_Delete(o);
	return rc;
}

/* The record of an ancestor, as lineage_state_bad reads it back. */
static cJSON *lineage_state_json(const struct ms_inv_state *s)
{
	cJSON *o = cJSON_CreateObject(), *v;

	cJSON_AddStringToObject(o, "state", s->digest);
	cJSON_AddStringToObject(o, "kind", ms_inv_kind_name(s->kind));
	cJSON_AddStringToObject(o, "layout", s->layout);
	json_put(o, "label", s->label ? cJSON_CreateString(s->label) : cJSON_CreateNull());
	cJSON_AddNumberToObject(o, "tensors", (double)s->ntensors);
	cJSON_AddNumberToObject(o, "bytes", (double)s->nbytes);
	if (s->ep_size > 0) {
		cJSON_AddNumberToObject(o, "ep_size", s->ep_size);
		cJSON_AddNumberToObject(o, "ep_rank", s->ep_rank);
	} else {
		cJSON_AddNullToObject(o, "ep_size");
		cJSON_AddNullToObject(o, "ep_rank");
	}
	v = s->experts ? ms_json_parse(s->experts, strlen(s->experts), NULL) : NULL;
	json_put(o, "experts", v ? v : cJSON_CreateNull());
	v = ms_json_parse(s->argv, strlen(s->argv), NULL);
	json_put(o, "argv", v ? v : cJSON_CreateArray());
	cJSON_AddStringToObject(o, "tool", s->tool);
	cJSON_AddStringToObject(o, "user", s->user);
	cJSON_AddStringToObject(o, "host", s->host);
	cJSON_AddStringToObject(o, "created_at", s->created_at);
	return o;
}

int ms_inv_lineage_export(struct ms_inv *inv, const char *digest, char **json,
			  struct ms_err *err)
{
	struct ms_inv_edge *e = NULL;
	struct ms_inv_state *s = NULL;
	char **seen = NULL;
	size_t n = 0, nseen = 0, cap = 0;
	uint64_t mark = ms_json_mark();
	cJSON *o = cJSON_CreateObject(), *states, *edges;
	int rc;

	*json = NULL;
	states = cJSON_AddArrayToObject(o, "states");
	edges = cJSON_AddArrayToObject(o, "edges");
	if ((rc = ms_inv_edges(inv, digest, MS_INV_EDGES_ANCESTORS, &e, &n, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < n; i++) {
		cJSON *x = cJSON_CreateObject(), *params;
		int known = 0;

		cJSON_AddStringToObject(x, "child", e[i].child);
		cJSON_AddStringToObject(x, "parent", e[i].parent);
		cJSON_AddStringToObject(x, "operation", e[i].operation);
		params = ms_json_parse(e[i].params, strlen(e[i].params), NULL);
		json_put(x, "params", params ? params : cJSON_CreateObject());
		cJSON_AddStringToObject(x, "created_at", e[i].created_at);
		json_push(edges, x);
		/* every parent once (a child is the state or some edge's parent) */
		for (size_t k = 0; k < nseen && !known; k++)
			known = !strcmp(seen[k], e[i].parent);
		if (known)
			continue;
		if (grow((void **)&seen, &cap, nseen, sizeof(*seen))) {
			rc = oom(err);
			goto out;
		}
		seen[nseen++] = e[i].parent;
		if ((rc = ms_inv_state_get(inv, e[i].parent, &s, err)) != MS_OK)
			goto out;
		json_push(states, lineage_state_json(s));
		ms_inv_state_free(s);
		s = NULL;
	}
	if (ms_json_failed(mark) || !(*json = json_take(o))) {
		o = NULL;
		rc = oom(err);
		goto out;
	}
	o = NULL;
	rc = MS_OK;
out:
	cJSON_Delete(o);
	ms_free(seen);
	ms_inv_edges_free(e, n);
	return rc;
}

/* Insert one ancestor that is not recorded here: a state with no copy.
 * Its label is kept unless it names another state here. *added: 1 when
 * inserted. */
static int lineage_insert_state(struct ms_inv *inv, const cJSON *s, int *added,
				cJSON *dropped_labels, struct ms_err *err)
{
	const char *digest = cJSON_GetObjectItemCaseSensitive(s, "state")->valuestring;
	const cJSON *lb = cJSON_GetObjectItemCaseSensitive(s, "label");
	const cJSON *ep = cJSON_GetObjectItemCaseSensitive(s, "ep_size");
	const cJSON *ex = cJSON_GetObjectItemCaseSensitive(s, "experts");
	const char *label = cJSON_IsString(lb) ? lb->valuestring : NULL;
	sqlite3_stmt *st = NULL;
	char *argv = NULL, *experts = NULL;
	int rc;

	*added = 0;
	state_id_of(inv, digest, err, &rc);
	if (rc == MS_OK)
		return MS_OK; /* recorded here already: ours stands */
	if (rc != MS_ENOTFOUND)
		return rc;
	if (label) {
		int64_t owner;
		char from[MS_STATE_DIGEST_LEN];

		/* the labels table is where names live (states.label follows it) */
		if ((rc = label_owner(inv, label, &owner, from, err)) != MS_OK)
			return rc;
		if (owner) {
			json_push(dropped_labels, cJSON_CreateString(label));
			label = NULL;
		}
	}
	argv = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(s, "argv"));
	experts = ex && !cJSON_IsNull(ex) ? cJSON_PrintUnformatted(ex) : NULL;
	if (!argv || (ex && !cJSON_IsNull(ex) && !experts)) {
		rc = oom(err);
		goto out;
	}
	if ((rc = prep(inv, "INSERT INTO states (digest, kind, layout, label, ntensors, nbytes, ep_size, "
			    "ep_rank, experts, tool, argv, user, host, created_at) "
			    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", &st, err)) != MS_OK)
		goto out;
	bind_text(st, 1, digest);
	bind_text(st, 2, cJSON_GetObjectItemCaseSensitive(s, "kind")->valuestring);
	bind_text(st, 3, cJSON_GetObjectItemCaseSensitive(s, "layout")->valuestring);
	sqlite3_bind_null(st, 4);
	sqlite3_bind_int64(st, 5, (int64_t)cJSON_GetObjectItemCaseSensitive(s, "tensors")->valuedouble);
	sqlite3_bind_int64(st, 6, (int64_t)cJSON_GetObjectItemCaseSensitive(s, "bytes")->valuedouble);
	if (ep && !cJSON_IsNull(ep)) {
		sqlite3_bind_int64(st, 7, (int64_t)ep->valuedouble);
		sqlite3_bind_int64(st, 8,
				   (int64_t)cJSON_GetObjectItemCaseSensitive(s, "ep_rank")->valuedouble);
	} else {
		sqlite3_bind_null(st, 7);
		sqlite3_bind_null(st, 8);
	}
	bind_text(st, 9, experts);
	bind_text(st, 10, cJSON_GetObjectItemCaseSensitive(s, "tool")->valuestring);
	bind_text(st, 11, argv);
	bind_text(st, 12, cJSON_GetObjectItemCaseSensitive(s, "user")->valuestring);
	bind_text(st, 13, cJSON_GetObjectItemCaseSensitive(s, "host")->valuestring);
	bind_text(st, 14, cJSON_GetObjectItemCaseSensitive(s, "created_at")->valuestring);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot record an ancestor");
	/* the label goes through the labels table, as every label does */
	if (rc == MS_OK && label)
		rc = label_put(inv, sqlite3_last_insert_rowid(inv->db), digest, label, 0, err);
	if (rc == MS_OK)
		*added = 1;
out:
	sqlite3_finalize(st);
	cJSON_free(argv);
	cJSON_free(experts);
	return rc;
}

/* Insert one edge unless recorded; refuse one that would close a cycle
 * with the edges recorded here. *added: 1 when inserted. */
static int lineage_insert_edge(struct ms_inv *inv, const cJSON *e, int *added, struct ms_err *err)
{
	const char *child = cJSON_GetObjectItemCaseSensitive(e, "child")->valuestring;
	const char *parent = cJSON_GetObjectItemCaseSensitive(e, "parent")->valuestring;
	const char *op = cJSON_GetObjectItemCaseSensitive(e, "operation")->valuestring;
	sqlite3_stmt *st = NULL;
	char *params = NULL;
	int64_t cid, pid;
	int rc;

	*added = 0;
	cid = state_id_of(inv, child, err, &rc);
	if (rc != MS_OK)
		return rc;
	pid = state_id_of(inv, parent, err, &rc);
	if (rc != MS_OK)
		return rc;
	if ((rc = prep(inv, "WITH RECURSIVE a(id) AS (SELECT ?1 UNION SELECT x.child_id FROM derivations x "
			    "JOIN a ON x.parent_id = a.id) SELECT 1 FROM a WHERE id = ?2", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, cid);
	sqlite3_bind_int64(st, 2, pid);
	rc = sqlite3_step(st);
	sqlite3_finalize(st);
	st = NULL;
	if (rc == SQLITE_ROW)
		return ms_err_set(err, MS_EINVAL, "lineage: %s derives from %s here: the edge would close a cycle",
				  parent, child);
	if (rc != SQLITE_DONE)
		return db_fail(inv, err, "cannot walk the derivations");
	if (!(params = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(e, "params"))))
		return oom(err);
	if ((rc = prep(inv, "INSERT OR IGNORE INTO derivations (child_id, parent_id, operation, params, "
			    "run_id, created_at) VALUES (?,?,?,?,NULL,?)", &st, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, cid);
	sqlite3_bind_int64(st, 2, pid);
	bind_text(st, 3, op);
	bind_text(st, 4, params);
	bind_text(st, 5, cJSON_GetObjectItemCaseSensitive(e, "created_at")->valuestring);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot record a derivation");
	if (rc == MS_OK)
		*added = sqlite3_changes(inv->db) == 1;
out:
	sqlite3_finalize(st);
	cJSON_free(params);
	return rc;
}

int ms_inv_lineage_record(struct ms_inv *inv, const char *digest, const char *json, size_t len,
			  const char *source, struct ms_err *err)
{
	cJSON *o = NULL, *s, *e, *d = NULL, *added, *dropped;
	int nomem, rc, one, nedges = 0;

	if (!(o = ms_json_parse(json, len, &nomem)))
		return nomem ? oom(err) : ms_err_set(err, MS_EINVAL, "lineage: not JSON");
	if ((rc = lineage_lists(o, digest, err)) != MS_OK) {
		cJSON_Delete(o);
		return rc;
	}
	if ((rc = tx_begin(inv, err)) != MS_OK) {
		cJSON_Delete(o);
		return rc;
	}
	state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		goto out;
	d = cJSON_CreateObject();
	added = cJSON_AddArrayToObject(d, "states");
	dropped = cJSON_AddArrayToObject(d, "labels_in_use");
	cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(o, "states")) {
		if ((rc = lineage_insert_state(inv, s, &one, dropped, err)) != MS_OK)
			goto out;
		if (one)
			json_push(added, cJSON_CreateString(
				cJSON_GetObjectItemCaseSensitive(s, "state")->valuestring));
	}
	cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "edges")) {
		if ((rc = lineage_insert_edge(inv, e, &one, err)) != MS_OK)
			goto out;
		nedges += one;
	}
	if (cJSON_GetArraySize(added) || nedges) {
		cJSON_AddNumberToObject(d, "edges", nedges);
		if (source)
			cJSON_AddStringToObject(d, "from", source);
		rc = log_json(inv, "lineage", digest, d, err);
		d = NULL;
		if (rc != MS_OK)
			goto out;
	}
	rc = tx_commit(inv, err);
	cJSON_Delete(d);
	cJSON_Delete(o);
	return rc;
out:
	tx_rollback(inv);
	cJSON_Delete(d);
	cJSON_Delete(o);
	return rc;
}

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
	if ((rc = tx_begin(inv, err)) != MS_OK)
		return rc;
	sid = state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		goto out;
	now_iso(at);
	if ((rc = prep(inv, "INSERT INTO verifications (state_id, at, host, user, tool, result, nbytes, "
			    "seconds, detail) VALUES (?,?,?,?,?,?,?,?,?)", &st, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, sid);
	bind_text(st, 2, at);
	bind_text(st, 3, inv->host);
	bind_text(st, 4, inv->user);
	bind_text(st, 5, inv->tool);
	bind_text(st, 6, ms_inv_result_name(result));
	sqlite3_bind_int64(st, 7, (int64_t)nbytes);
	sqlite3_bind_double(st, 8, seconds);
	bind_text(st, 9, detail);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot record a verification");
	sqlite3_finalize(st);
	if (rc == MS_OK) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddStringToObject(d, "result", ms_inv_result_name(result));
		cJSON_AddNumberToObject(d, "bytes", (double)nbytes);
		cJSON_AddNumberToObject(d, "seconds", seconds);
		if (detail)
			cJSON_AddStringToObject(d, "detail", detail);
		rc = log_json(inv, "verify", digest, d, err);
	}
	if (rc == MS_OK)
		return tx_commit(inv, err);
out:
	tx_rollback(inv);
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
	if ((rc = tx_begin(inv, err)) != MS_OK)
		return rc;
	now_iso(at);
	if ((rc = put_trees(inv, recs, n, source, at, &k, err)) != MS_OK)
		goto out;
	if (k && (rc = log_trees(inv, state, source, k, err)) != MS_OK)
		goto out;
	if ((rc = tx_commit(inv, err)) != MS_OK)
		return rc;
	if (added)
		*added = k;
	return MS_OK;
out:
	tx_rollback(inv);
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

int ms_inv_verifications(struct ms_inv *inv, const char *digest, struct ms_inv_verification **out,
			 size_t *n, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_verification *a = NULL;
	size_t k = 0, cap = 0;
	int64_t sid;
	int rc;

	*out = NULL;
	*n = 0;
	sid = state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		return rc;
	if ((rc = prep(inv, "SELECT at, host, user, tool, result, nbytes, seconds, detail FROM "
			    "verifications WHERE state_id = ? ORDER BY id DESC", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		int bad = 0;

		if (grow((void **)&a, &cap, k, sizeof(*a))) {
			rc = oom(err);
			goto out;
		}
		memset(&a[k], 0, sizeof(a[k]));
		a[k].at = col_dup(st, 0, &bad);
		a[k].host = col_dup(st, 1, &bad);
		a[k].user = col_dup(st, 2, &bad);
		a[k].tool = col_dup(st, 3, &bad);
		result_parse(col_str(st, 4), &a[k].result);
		a[k].nbytes = (uint64_t)sqlite3_column_int64(st, 5);
		a[k].seconds = sqlite3_column_double(st, 6);
		a[k].detail = col_dup(st, 7, &bad);
		k++;
		if (bad) {
			rc = oom(err);
			goto out;
		}
	}
	rc = rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot read verifications");
out:
	sqlite3_finalize(st);
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
	if ((rc = tx_begin(inv, err)) != MS_OK)
		return rc;
	now_iso(at);
	if ((rc = prep(inv, "INSERT INTO runs (plan_digest, status, started_at, tool, argv, user, host) "
			    "VALUES (?, 'running', ?, ?, ?, ?, ?)", &st, err)) != MS_OK)
		goto out;
	bind_text(st, 1, plan_digest);
	bind_text(st, 2, at);
	bind_text(st, 3, inv->tool);
	bind_text(st, 4, inv->argv_json);
	bind_text(st, 5, inv->user);
	bind_text(st, 6, inv->host);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot record a run");
	sqlite3_finalize(st);
	st = NULL;
	if (rc != MS_OK)
		goto out;
	rid = sqlite3_last_insert_rowid(inv->db);
	d = cJSON_CreateObject();
	cJSON_AddStringToObject(d, "plan", plan_digest);
	in = cJSON_AddArrayToObject(d, "inputs");
	if ((rc = prep(inv, "INSERT INTO run_inputs (run_id, digest, state_id, role) VALUES (?,?,?,?)",
		       &st, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < n; i++) {
		int64_t sid = state_id_of(inv, inputs[i].digest, err, &rc);
		cJSON *o;

		if (rc != MS_OK)
			goto out;
		sqlite3_reset(st);
		sqlite3_bind_int64(st, 1, rid);
		bind_text(st, 2, inputs[i].digest);
		sqlite3_bind_int64(st, 3, sid);
		bind_text(st, 4, inputs[i].role);
		if (sqlite3_step(st) != SQLITE_DONE) {
			rc = db_fail(inv, err, "cannot record a run input");
			goto out;
		}
		o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "state", inputs[i].digest);
		if (inputs[i].role)
			cJSON_AddStringToObject(o, "role", inputs[i].role);
		json_push(in, o);
	}
	sqlite3_finalize(st);
	st = NULL;
	{
		char subj[32];

		snprintf(subj, sizeof(subj), "run %lld", (long long)rid);
		rc = log_json(inv, "run_begin", subj, d, err);
		d = NULL;
		if (rc != MS_OK)
			goto out;
	}
	if ((rc = tx_commit(inv, err)) == MS_OK)
		*run_id = rid;
	return rc;
out:
	cJSON_Delete(d);
	sqlite3_finalize(st);
	tx_rollback(inv);
	return rc;
}

int ms_inv_run_end(struct ms_inv *inv, int64_t run_id, int exit_code, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	char at[ISO_LEN], subj[32];
	int running = 0, rc;

	if ((rc = tx_begin(inv, err)) != MS_OK)
		return rc;
	if ((rc = run_exists(inv, run_id, &running, err)) != MS_OK)
		goto out;
	if (!running) {
		rc = ms_err_set(err, MS_EINVAL, "run %lld has already ended", (long long)run_id);
		goto out;
	}
	now_iso(at);
	if ((rc = prep(inv, "UPDATE runs SET status = ?, exit_code = ?, ended_at = ? WHERE id = ?", &st,
		       err)) != MS_OK)
		goto out;
	bind_text(st, 1, exit_code == 0 ? "ok" : "failed");
	sqlite3_bind_int(st, 2, exit_code);
	bind_text(st, 3, at);
	sqlite3_bind_int64(st, 4, run_id);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot end a run");
	sqlite3_finalize(st);
	if (rc == MS_OK) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddStringToObject(d, "status", exit_code == 0 ? "ok" : "failed");
		cJSON_AddNumberToObject(d, "exit_code", exit_code);
		snprintf(subj, sizeof(subj), "run %lld", (long long)run_id);
		rc = log_json(inv, "run_end", subj, d, err);
	}
	if (rc == MS_OK)
		return tx_commit(inv, err);
out:
	tx_rollback(inv);
	return rc;
}

int ms_inv_run_output(struct ms_inv *inv, int64_t run_id, const char *digest, struct ms_err *err)
{
	int64_t sid;
	int rc;

	if ((rc = tx_begin(inv, err)) != MS_OK)
		return rc;
	sid = state_id_of(inv, digest, err, &rc);
	if (rc == MS_OK)
		rc = run_output_locked(inv, run_id, digest, sid, err);
	if (rc == MS_OK)
		return tx_commit(inv, err);
	tx_rollback(inv);
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
	if ((rc = prep(inv, "SELECT id, plan_digest, status, started_at, ended_at, exit_code, "
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
		rc = db_fail(inv, err, "cannot read runs");
		goto out;
	}
	if (!(a = ms_calloc(1, sizeof(*a)))) {
		rc = oom(err);
		goto out;
	}
	a->id = sqlite3_column_int64(st, 0);
	a->plan_digest = col_dup(st, 1, &bad);
	a->status = col_dup(st, 2, &bad);
	a->started_at = col_dup(st, 3, &bad);
	a->ended_at = col_dup(st, 4, &bad);
	a->has_exit_code = sqlite3_column_type(st, 5) != SQLITE_NULL;
	a->exit_code = sqlite3_column_int(st, 5);
	a->user = col_dup(st, 6, &bad);
	a->host = col_dup(st, 7, &bad);
	rc = bad ? oom(err) : MS_OK;
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

int ms_inv_run_events(struct ms_inv *inv, int64_t run_id, struct ms_inv_event **out, size_t *n,
		      struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_event *a = NULL;
	size_t k = 0, cap = 0;
	int rc;

	*out = NULL;
	*n = 0;
	if ((rc = prep(inv, "SELECT id, at, kind, data FROM events WHERE run_id = ? ORDER BY id",
		       &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, run_id);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		int bad = 0;

		if (grow((void **)&a, &cap, k, sizeof(*a))) {
			rc = oom(err);
			goto out;
		}
		memset(&a[k], 0, sizeof(a[k]));
		a[k].id = sqlite3_column_int64(st, 0);
		a[k].at = col_dup(st, 1, &bad);
		a[k].kind = col_dup(st, 2, &bad);
		a[k].data = col_dup(st, 3, &bad);
		k++;
		if (bad) {
			rc = oom(err);
			goto out;
		}
	}
	rc = rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot read events");
out:
	sqlite3_finalize(st);
	if (rc != MS_OK) {
		ms_inv_events_free(a, k);
		return rc;
	}
	*out = a;
	*n = k;
	return MS_OK;
}

int ms_inv_state_runs(struct ms_inv *inv, const char *digest, int consumed, struct ms_inv_run **out,
		      size_t *n, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_run *a = NULL;
	size_t k = 0, cap = 0;
	int rc;

	*out = NULL;
	*n = 0;
	rc = prep(inv, consumed ?
		  "SELECT r.id, r.plan_digest, r.status, r.started_at, r.ended_at, r.exit_code, i.role, "
		  "r.user, r.host FROM run_inputs i JOIN runs r ON r.id = i.run_id WHERE i.digest = ? "
		  "ORDER BY r.id DESC" :
		  "SELECT r.id, r.plan_digest, r.status, r.started_at, r.ended_at, r.exit_code, NULL, "
		  "r.user, r.host FROM run_outputs o JOIN runs r ON r.id = o.run_id WHERE o.digest = ? "
		  "ORDER BY r.id DESC", &st, err);
	if (rc != MS_OK)
		return rc;
	bind_text(st, 1, digest);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		int bad = 0;

		if (grow((void **)&a, &cap, k, sizeof(*a))) {
			rc = oom(err);
			goto out;
		}
		memset(&a[k], 0, sizeof(a[k]));
		a[k].id = sqlite3_column_int64(st, 0);
		a[k].plan_digest = col_dup(st, 1, &bad);
		a[k].status = col_dup(st, 2, &bad);
		a[k].started_at = col_dup(st, 3, &bad);
		a[k].ended_at = col_dup(st, 4, &bad);
		a[k].has_exit_code = sqlite3_column_type(st, 5) != SQLITE_NULL;
		a[k].exit_code = sqlite3_column_int(st, 5);
		a[k].role = col_dup(st, 6, &bad);
		a[k].user = col_dup(st, 7, &bad);
		a[k].host = col_dup(st, 8, &bad);
		k++;
		if (bad) {
			rc = oom(err);
			goto out;
		}
	}
	rc = rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot read runs");
out:
	sqlite3_finalize(st);
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
		return oom(err);
	if (!cJSON_IsObject(j)) {
		cJSON_Delete(j);
		return ms_err_set(err, MS_EINVAL, "event '%s': data is not a JSON object", kind);
	}
	canon = json_take(j);
	if (!canon)
		return oom(err);
	if ((rc = tx_begin(inv, err)) != MS_OK)
		goto out;
	if (run_id > 0 && (rc = run_exists(inv, run_id, NULL, err)) != MS_OK)
		goto out;
	now_iso(at);
	if ((rc = prep(inv, "INSERT INTO events (run_id, at, kind, data) VALUES (?,?,?,?)", &st,
		       err)) != MS_OK)
		goto out;
	if (run_id > 0)
		sqlite3_bind_int64(st, 1, run_id);
	else
		sqlite3_bind_null(st, 1);
	bind_text(st, 2, at);
	bind_text(st, 3, kind);
	bind_text(st, 4, canon);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot record an event");
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
	if ((rc = log_json(inv, "event", subj, d, err)) != MS_OK)
		goto out;
	if ((rc = tx_commit(inv, err)) == MS_OK && event_id)
		*event_id = eid;
	/* committed (or, in a batch, left for the batch's end): nothing to
	 * roll back, and a rollback here would take the batch with it */
	ms_free(canon);
	return rc;
out:
	tx_rollback(inv);
	ms_free(canon);
	return rc;
}

/* ---- the audit log --------------------------------------------------------------------------- */

static void log_row(sqlite3_stmt *st, struct ms_inv_log_entry *e)
{
	e->seq = sqlite3_column_int64(st, 0);
	e->at = col_str(st, 1);
	e->user = col_str(st, 2);
	e->host = col_str(st, 3);
	e->tool = col_str(st, 4);
	e->argv = col_str(st, 5);
	e->action = col_str(st, 6);
	e->subject = col_str(st, 7);
	e->detail = col_str(st, 8);
	e->prev_hash = col_str(st, 9);
	e->hash = col_str(st, 10);
	e->cwd = sqlite3_column_type(st, 11) == SQLITE_NULL ? NULL : col_str(st, 11);
}

#define LOG_SELECT                                                                         \
	"SELECT seq, at, user, host, tool, argv, action, subject, detail, prev_hash, hash, " \
	"cwd FROM log ORDER BY seq"

int ms_inv_log_each(struct ms_inv *inv, int (*fn)(const struct ms_inv_log_entry *e, void *ctx),
		    void *ctx, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = prep(inv, LOG_SELECT, &st, err)) != MS_OK)
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
	return rc == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot read the audit log");
}

int ms_inv_log_check(struct ms_inv *inv, int64_t *nout, char head[65], struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	char prev[65] = ZERO_HASH, hash[65];
	int64_t expect = 1, hseq;
	int rc;

	if ((rc = prep(inv, LOG_SELECT, &st, err)) != MS_OK)
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
		rc = db_fail(inv, err, "cannot read the audit log");
		goto out;
	}
	sqlite3_finalize(st);
	st = NULL;
	if ((rc = prep(inv, "SELECT seq, hash FROM log_head WHERE one = 1", &st, err)) != MS_OK)
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
	if (strcmp(col_str(st, 1), prev)) {
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

/* ---- the sprawl report ------------------------------------------------------------------------- */

void ms_inv_dup_release(struct ms_inv_dup_report *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n; i++) {
		struct ms_inv_dup *d = &r->dups[i];

		for (size_t p = 0; p < d->nplaces; p++) {
			struct ms_inv_dup_place *pl = &d->places[p];

			for (size_t s = 0; s < pl->nstates; s++)
				ms_free(pl->labels[s]);
			ms_free(pl->labels);
			ms_free(pl->states);
			ms_free(pl->path);
			ms_free(pl->tensor);
		}
		ms_free(d->places);
	}
	ms_free(r->dups);
	ms_free(r->pairs);
	memset(r, 0, sizeof(*r));
}

static int pair_add(struct ms_inv_dup_report *r, size_t *cap, const char *a, const char *b,
		    uint64_t nbytes)
{
	const char *lo = strcmp(a, b) <= 0 ? a : b, *hi = lo == a ? b : a;

	for (size_t i = 0; i < r->npairs; i++) {
		if (!strcmp(r->pairs[i].a, lo) && !strcmp(r->pairs[i].b, hi)) {
			r->pairs[i].ntensors++;
			r->pairs[i].nbytes += nbytes;
			return 0;
		}
	}
	if (grow((void **)&r->pairs, cap, r->npairs, sizeof(*r->pairs)))
		return -1;
	memset(&r->pairs[r->npairs], 0, sizeof(r->pairs[0]));
	snprintf(r->pairs[r->npairs].a, MS_STATE_DIGEST_LEN, "%s", lo);
	snprintf(r->pairs[r->npairs].b, MS_STATE_DIGEST_LEN, "%s", hi);
	r->pairs[r->npairs].ntensors = 1;
	r->pairs[r->npairs].nbytes = nbytes;
	r->npairs++;
	return 0;
}

/* Each pair of states holding the digest in two different places shares
 * its bytes once; a state holding it in two places pairs with itself. */
static int dup_pairs(struct ms_inv_dup_report *r, size_t *cap, const struct ms_inv_dup *d)
{
	const char *(*seen)[2] = NULL;
	size_t nseen = 0, scap = 0;
	int rc = 0;

	for (size_t p = 0; p < d->nplaces && !rc; p++)
		for (size_t q = p + 1; q < d->nplaces && !rc; q++)
			for (size_t i = 0; i < d->places[p].nstates && !rc; i++)
				for (size_t j = 0; j < d->places[q].nstates && !rc; j++) {
					const char *a = d->places[p].states[i], *b = d->places[q].states[j];
					size_t k;

					if (strcmp(a, b) > 0) {
						const char *t = a;

						a = b;
						b = t;
					}
					for (k = 0; k < nseen; k++)
						if (!strcmp(seen[k][0], a) && !strcmp(seen[k][1], b))
							break;
					if (k < nseen)
						continue;
					if (grow((void **)&seen, &scap, nseen, sizeof(*seen))) {
						rc = -1;
						break;
					}
					seen[nseen][0] = a;
					seen[nseen++][1] = b;
					rc = pair_add(r, cap, a, b, d->nbytes);
				}
	ms_free(seen);
	return rc;
}

static int cmp_dup(const void *a, const void *b)
{
	const struct ms_inv_dup *x = a, *y = b;
	uint64_t wx = x->nbytes * (x->nplaces - 1), wy = y->nbytes * (y->nplaces - 1);

	if (wx != wy)
		return wx < wy ? 1 : -1;
	return strcmp(x->digest, y->digest);
}

static int cmp_pair(const void *a, const void *b)
{
	const struct ms_inv_dup_pair *x = a, *y = b;

	if (x->nbytes != y->nbytes)
		return x->nbytes < y->nbytes ? 1 : -1;
	return strcmp(x->a, y->a) ? strcmp(x->a, y->a) : strcmp(x->b, y->b);
}

int ms_inv_dup(struct ms_inv *inv, struct ms_inv_dup_report *r, struct ms_err *err)
{
	/* A place is (device, inode, offset) of a file some state uses. */
	static const char *const totals =
		"WITH pl AS (SELECT t.digest AS digest, max(t.nbytes) AS nbytes FROM tensors t "
		"JOIN files f ON f.id = t.file_id WHERE t.nbytes > 0 AND t.file_id IN "
		"(SELECT file_id FROM state_files) GROUP BY t.digest, f.dev, f.inode, t.byte_offset) "
		"SELECT coalesce(sum(nbytes), 0), count(*), (SELECT coalesce(sum(n), 0) FROM "
		"(SELECT max(nbytes) AS n FROM pl GROUP BY digest)) FROM pl";
	static const char *const places =
		"WITH pl AS (SELECT t.digest AS digest FROM tensors t JOIN files f ON f.id = t.file_id "
		"WHERE t.nbytes > 0 AND t.file_id IN (SELECT file_id FROM state_files) "
		"GROUP BY t.digest, f.dev, f.inode, t.byte_offset), "
		"dd AS (SELECT digest FROM pl GROUP BY digest HAVING count(*) > 1) "
		"SELECT t.digest, t.nbytes, f.dev, f.inode, t.byte_offset, f.path, t.name, s.digest, s.label "
		"FROM dd JOIN tensors t ON t.digest = dd.digest JOIN files f ON f.id = t.file_id "
		"JOIN state_files sf ON sf.file_id = f.id JOIN states s ON s.id = sf.state_id "
		"WHERE t.nbytes > 0 ORDER BY t.digest, f.dev, f.inode, t.byte_offset, s.digest";
	sqlite3_stmt *st = NULL;
	size_t dcap = 0, pcap = 0, paircap = 0, scap = 0;
	int64_t ldev = 0, lino = 0, loff = -1;
	struct ms_inv_dup *d = NULL;
	struct ms_inv_dup_place *pl = NULL;
	int rc;

	memset(r, 0, sizeof(*r));
	if ((rc = prep(inv, totals, &st, err)) != MS_OK)
		return rc;
	if (sqlite3_step(st) != SQLITE_ROW) {
		rc = db_fail(inv, err, "cannot sum stored bytes");
		goto out;
	}
	r->stored_bytes = (uint64_t)sqlite3_column_int64(st, 0);
	r->stored_tensors = (uint64_t)sqlite3_column_int64(st, 1);
	r->unique_bytes = (uint64_t)sqlite3_column_int64(st, 2);
	r->redundant_bytes = r->stored_bytes - r->unique_bytes;
	sqlite3_finalize(st);
	if ((rc = prep(inv, places, &st, err)) != MS_OK)
		return rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *dg = col_str(st, 0), *sd = col_str(st, 7);
		int64_t dev = sqlite3_column_int64(st, 2), ino = sqlite3_column_int64(st, 3);
		int64_t off = sqlite3_column_int64(st, 4);
		int bad = 0;

		if (!d || strcmp(d->digest, dg)) {
			if (d && dup_pairs(r, &paircap, d)) {
				rc = oom(err);
				goto out;
			}
			if (grow((void **)&r->dups, &dcap, r->n, sizeof(*r->dups))) {
				rc = oom(err);
				goto out;
			}
			d = &r->dups[r->n++];
			memset(d, 0, sizeof(*d));
			snprintf(d->digest, sizeof(d->digest), "%s", dg);
			d->nbytes = (uint64_t)sqlite3_column_int64(st, 1);
			pcap = 0;
			pl = NULL;
			loff = -1;
		}
		if (!pl || dev != ldev || ino != lino || off != loff) {
			if (grow((void **)&d->places, &pcap, d->nplaces, sizeof(*d->places))) {
				rc = oom(err);
				goto out;
			}
			pl = &d->places[d->nplaces++];
			memset(pl, 0, sizeof(*pl));
			pl->path = col_dup(st, 5, &bad);
			pl->tensor = col_dup(st, 6, &bad);
			ldev = dev;
			lino = ino;
			loff = off;
			scap = 0;
		}
		if (!pl->nstates || strcmp(pl->states[pl->nstates - 1], sd)) {
			if (pl->nstates == scap) {
				size_t nc = scap ? scap * 2 : 4;
				void *a = ms_realloc(pl->states, nc * sizeof(*pl->states));

				if (a)
					pl->states = a;
				a = a ? ms_realloc(pl->labels, nc * sizeof(*pl->labels)) : NULL;
				if (!a) {
					rc = oom(err);
					goto out;
				}
				pl->labels = a;
				scap = nc;
			}
			snprintf(pl->states[pl->nstates], MS_STATE_DIGEST_LEN, "%s", sd);
			pl->labels[pl->nstates] = col_dup(st, 8, &bad);
			pl->nstates++;
		}
		if (bad) {
			rc = oom(err);
			goto out;
		}
	}
	if (rc != SQLITE_DONE) {
		rc = db_fail(inv, err, "cannot read duplicates");
		goto out;
	}
	if (d && dup_pairs(r, &paircap, d)) {
		rc = oom(err);
		goto out;
	}
	if (r->n)
		qsort(r->dups, r->n, sizeof(*r->dups), cmp_dup);
	if (r->npairs)
		qsort(r->pairs, r->npairs, sizeof(*r->pairs), cmp_pair);
	rc = MS_OK;
out:
	sqlite3_finalize(st);
	if (rc != MS_OK)
		ms_inv_dup_release(r);
	return rc;
}

/* ---- removing ------------------------------------------------------------------------------------ */

int ms_inv_rm(struct ms_inv *inv, const char *digest, int force, struct ms_err *err)
{
	struct ms_inv_edge *kids = NULL;
	struct ms_inv_state *s = NULL;
	sqlite3_stmt *st = NULL;
	size_t nkids = 0;
	cJSON *d;
	int rc;

	if ((rc = tx_begin(inv, err)) != MS_OK)
		return rc;
	if ((rc = ms_inv_state_get(inv, digest, &s, err)) != MS_OK ||
	    (rc = ms_inv_edges(inv, digest, MS_INV_EDGES_CHILDREN, &kids, &nkids, err)) != MS_OK)
		goto out;
	if (nkids && !force) {
		rc = ms_err_set(err, MS_EINVAL,
				"%s has %zu derived state%s (first %s); remove %s first or use --force",
				digest, nkids, nkids == 1 ? "" : "s", kids[0].child, nkids == 1 ? "it" : "them");
		goto out;
	}
	if ((rc = prep(inv, "DELETE FROM states WHERE id = ?", &st, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, s->id);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : db_fail(inv, err, "cannot remove a state");
	sqlite3_finalize(st);
	if (rc != MS_OK)
		goto out;
	d = cJSON_CreateObject();
	cJSON_AddStringToObject(d, "kind", ms_inv_kind_name(s->kind));
	cJSON_AddStringToObject(d, "layout", s->layout);
	if (s->label)
		cJSON_AddStringToObject(d, "label", s->label);
	if (nkids) {
		cJSON *a = cJSON_AddArrayToObject(d, "orphaned");

		for (size_t i = 0; i < nkids; i++)
			json_push(a, cJSON_CreateString(kids[i].child));
	}
	if ((rc = log_json(inv, "rm", digest, d, err)) != MS_OK)
		goto out;
	rc = tx_commit(inv, err);
	ms_inv_state_free(s);
	ms_inv_edges_free(kids, nkids);
	return rc;
out:
	tx_rollback(inv);
	ms_inv_state_free(s);
	ms_inv_edges_free(kids, nkids);
	return rc;
}

/* What interrupted writers leave is named by fsutil.h's one rule. */
int ms_inv_is_temp_name(const char *name, long *pid)
{
	return ms_temp_name_parse(name, pid);
}

static int pid_alive(long pid)
{
	return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

static int cmp_cstr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int gc_dir(const char *dir, int dry_run,
		  void (*fn)(enum ms_inv_gc_what, const char *, void *), void *ctx,
		  uint64_t *nitems, int *failed, struct ms_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *de;

	if (!d) {
		if (errno == ENOENT)
			return MS_OK;
		return ms_err_set(err, MS_EIO, "'%s': cannot read directory: %s", dir, strerror(errno));
	}
	while ((de = readdir(d))) {
		struct stat st;
		char *path;
		long pid;

		if (!ms_inv_is_temp_name(de->d_name, &pid) || pid_alive(pid))
			continue;
		path = ms_path_join(dir, de->d_name);
		if (!path) {
			closedir(d);
			return oom(err);
		}
		if (lstat(path, &st) || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) {
			ms_free(path);
			continue;
		}
		if (!dry_run && (S_ISDIR(st.st_mode)
					 ? ms_rmtree(path) != 0
					 : unlink(path) != 0) && errno != ENOENT) {
			if (!*failed)
				ms_err_set(err, MS_EIO, "'%s': cannot remove: %s", path, strerror(errno));
			*failed = 1;
			ms_free(path);
			continue;
		}
		(*nitems)++;
		if (fn)
			fn(MS_INV_GC_TEMP_FILE, path, ctx);
		ms_free(path);
	}
	closedir(d);
	return MS_OK;
}

/* The directory the inventory file is in, absolute where it resolves, as
 * recorded paths are (caller frees; NULL: no memory). */
static char *dir_of_db(const char *db)
{
	const char *slash = strrchr(db, '/');
	char *d = !slash ? ms_strdup(".") : ms_strndup(db, (size_t)(slash - db) + (slash == db));
	char *real = d ? realpath(d, NULL) : NULL;

	if (real) {
		ms_free(d);
		d = ms_strdup(real);
		free(real);
	}
	return d;
}

int ms_inv_gc(struct ms_inv *inv, const char *const *dirs, size_t ndirs, int dry_run,
	      void (*fn)(enum ms_inv_gc_what what, const char *path, void *ctx), void *ctx,
	      uint64_t *nitems, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	char **list = NULL;
	size_t n = 0, cap = 0;
	uint64_t count = 0;
	int failed = 0, rc, intx = 0;
	cJSON *paths = NULL;

	/* Where writers stage: beside a file (".NAME.tmp-"), and beside a
	 * directory output, in its parent. So every recorded file's directory
	 * and that directory's parent (outputs are written next to the states
	 * they were made from, and a --force rerun next to the output it
	 * replaces), the inventory's own directory, and dirs. */
	if ((rc = prep(inv, "SELECT DISTINCT path FROM files", &st, err)) != MS_OK)
		return rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *path = col_str(st, 0);

		for (int up = 1; up <= 2; up++) {
			char *p = ms_strdup(path);

			if (!p || grow((void **)&list, &cap, n, sizeof(*list))) {
				ms_free(p);
				rc = oom(err);
				goto out;
			}
			for (int k = 0; k < up; k++) {
				char *slash = strrchr(p, '/');

				if (slash)
					slash[slash == p ? 1 : 0] = 0;
			}
			list[n++] = p;
		}
	}
	if (rc != SQLITE_DONE) {
		rc = db_fail(inv, err, "cannot list files");
		goto out;
	}
	sqlite3_finalize(st);
	st = NULL;
	for (size_t i = 0; i <= ndirs; i++) {
		char *p = i < ndirs ? ms_strdup(dirs[i]) : dir_of_db(inv->path);

		if (!p || grow((void **)&list, &cap, n, sizeof(*list))) {
			ms_free(p);
			rc = oom(err);
			goto out;
		}
		list[n++] = p;
	}
	if (n)
		qsort(list, n, sizeof(*list), cmp_cstr);
	for (size_t i = 0; i < n; i++) {
		if (i && !strcmp(list[i], list[i - 1]))
			continue;
		if ((rc = gc_dir(list[i], dry_run, fn, ctx, &count, &failed, err)) != MS_OK)
			goto out;
	}
	/* file rows no state uses */
	if (!dry_run) {
		if ((rc = tx_begin(inv, err)) != MS_OK)
			goto out;
		intx = 1;
	}
	if ((rc = prep(inv, "SELECT id, path FROM files WHERE id NOT IN (SELECT file_id FROM state_files) "
			    "ORDER BY path, id", &st, err)) != MS_OK)
		goto out;
	paths = cJSON_CreateArray();
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		json_push(paths, cJSON_CreateString(col_str(st, 1)));
		count++;
		if (fn)
			fn(MS_INV_GC_FILE_ROW, col_str(st, 1), ctx);
	}
	sqlite3_finalize(st);
	st = NULL;
	if (rc != SQLITE_DONE) {
		rc = db_fail(inv, err, "cannot list unused files");
		goto out;
	}
	rc = MS_OK;
	if (intx && cJSON_GetArraySize(paths) > 0) {
		cJSON *d = cJSON_CreateObject();

		if ((rc = exec_sql(inv, "DELETE FROM files WHERE id NOT IN (SELECT file_id FROM state_files)",
				   err)) != MS_OK) {
			cJSON_Delete(d);
			goto out;
		}
		json_put(d, "files", paths);
		paths = NULL;
		if ((rc = log_json(inv, "gc", inv->path, d, err)) != MS_OK)
			goto out;
	}
	if (intx) {
		intx = 0;
		if ((rc = tx_commit(inv, err)) != MS_OK)
			goto out;
	}
	if (failed)
		rc = MS_EIO;
out:
	if (intx)
		tx_rollback(inv);
	sqlite3_finalize(st);
	cJSON_Delete(paths);
	for (size_t i = 0; i < n; i++)
		ms_free(list[i]);
	ms_free(list);
	if (nitems)
		*nitems = count;
	return rc;
}

/* ---- tensor owners (served-policy identity) ------------------------------------- */

int ms_inv_tensor_owners(struct ms_inv *inv, const uint8_t digest[MS_SHA256_LEN],
			 struct ms_inv_owner **out, size_t *n, struct ms_err *err)
{
	/* one row per (state, tensor name): copies of a state collapse */
	static const char *const sql =
		"SELECT DISTINCT s.digest, t.name FROM tensors t "
		"JOIN state_files sf ON sf.file_id = t.file_id JOIN states s ON s.id = sf.state_id "
		"WHERE t.digest = ? ORDER BY s.id, t.name";
	sqlite3_stmt *st = NULL;
	struct ms_inv_owner *o = NULL;
	size_t cap = 0;
	char hex[65];
	int rc, step;

	*out = NULL;
	*n = 0;
	ms_hex(digest, MS_SHA256_LEN, hex);
	if ((rc = prep(inv, sql, &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_text(st, 1, hex, 64, SQLITE_STATIC);
	while ((step = sqlite3_step(st)) == SQLITE_ROW) {
		const unsigned char *d = sqlite3_column_text(st, 0);
		int bad = 0;

		if (*n == cap) {
			size_t nc = cap ? cap * 2 : 8;
			struct ms_inv_owner *no = ms_realloc(o, nc * sizeof(*no));

			if (!no) {
				rc = oom(err);
				goto out;
			}
			o = no;
			cap = nc;
		}
		snprintf(o[*n].state, sizeof(o[*n].state), "%s", d ? (const char *)d : "");
		o[*n].name = col_dup(st, 1, &bad);
		if (bad) {
			rc = oom(err);
			goto out;
		}
		(*n)++;
	}
	if (step != SQLITE_DONE) {
		rc = db_fail(inv, err, "cannot look up a tensor digest");
		goto out;
	}
	*out = o;
	o = NULL;
	rc = MS_OK;
out:
	sqlite3_finalize(st);
	if (o) {
		ms_inv_owners_free(o, *n);
		*n = 0;
	}
	return rc;
}

void ms_inv_owners_free(struct ms_inv_owner *o, size_t n)
{
	for (size_t i = 0; o && i < n; i++)
		ms_free(o[i].name);
	ms_free(o);
}
