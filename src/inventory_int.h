/*
 * inventory_int.h: what the files of the inventory store share
 * (inventory.h is the contract; inventory*.c the code).
 */
#ifndef MS_INVENTORY_INT_H
#define MS_INVENTORY_INT_H

#include <cjson/cJSON.h>
#include <sqlite3.h>

#include "inventory.h"

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
	 * (inv_log_json) */
	uint64_t json_mark;
};

struct classify {
	enum ms_inv_kind kind;     /* ANY: the files say nothing */
	char why[512];             /* what in the files says it */
	char layout[32];
	int32_t ep_size, ep_rank;
	char *experts;             /* JSON array or NULL */
};

int inv_result_parse(const char *s, enum ms_inv_result *out);

int inv_db_fail(struct ms_inv *inv, struct ms_err *err, const char *what);

int inv_oom(struct ms_err *err);

int inv_prep(struct ms_inv *inv, const char *sql, sqlite3_stmt **st, struct ms_err *err);

int inv_exec_sql(struct ms_inv *inv, const char *sql, struct ms_err *err);

char *inv_col_dup(sqlite3_stmt *st, int i, int *bad);

const char *inv_col_str(sqlite3_stmt *st, int i);

void inv_bind_text(sqlite3_stmt *st, int i, const char *s);

void inv_now_iso(char out[ISO_LEN]);

int inv_hex_ok(const char *s, size_t n);

int inv_digest_from_hex(const char *hex, uint8_t out[MS_SHA256_LEN]);

char *inv_argv_to_json(int argc, char *const *argv);

void inv_json_put(cJSON *o, const char *key, cJSON *item);

void inv_json_push(cJSON *a, cJSON *item);

char *inv_json_take(cJSON *o);

int inv_tx_begin(struct ms_inv *inv, struct ms_err *err);

void inv_tx_rollback(struct ms_inv *inv);

int inv_tx_commit(struct ms_inv *inv, struct ms_err *err);

int inv_log_json(struct ms_inv *inv, const char *action, const char *subject, cJSON *detail,
		   struct ms_err *err);

int inv_classify_ckpt(const struct ms_ckpt *c, struct classify *k, struct ms_err *err);

int inv_kind_compatible(enum ms_inv_kind said, enum ms_inv_kind wanted);

int inv_label_check(const char *l, struct ms_err *err);

int64_t inv_state_id_of(struct ms_inv *inv, const char *digest, struct ms_err *err, int *rcp);

int inv_run_exists(struct ms_inv *inv, int64_t run_id, int *running, struct ms_err *err);

int inv_run_output_locked(struct ms_inv *inv, int64_t run_id, const char *digest, int64_t sid,
			    struct ms_err *err);

int inv_label_owner(struct ms_inv *inv, const char *l, int64_t *sid,
		      char digest[MS_STATE_DIGEST_LEN], struct ms_err *err);

int inv_label_put(struct ms_inv *inv, int64_t sid, const char *digest, const char *l,
		    int force, struct ms_err *err);

int inv_put_trees(struct ms_inv *inv, const struct ms_tree_rec *r, size_t n,
		    const char *source, const char *at, size_t *added, struct ms_err *err);

int inv_log_trees(struct ms_inv *inv, const char *state, const char *source, size_t added,
		    struct ms_err *err);

int inv_grow(void **arr, size_t *cap, size_t n, size_t sz);

/* Fill one element (zeroed) from the statement's current row: MS_OK, or an
 * error (what the row had allocated stays in the element). */
typedef int (*inv_row_fn)(struct ms_inv *inv, sqlite3_stmt *st, void *e, struct ms_err *err);
/* Every row of st into *arr (elements of sz bytes, *k of them, grown as
 * needed), st finalized; what: the message of a failed step. On an error
 * *arr and *k hold what was read, for the caller's release. */
int inv_rows(struct ms_inv *inv, sqlite3_stmt *st, size_t sz, inv_row_fn row, const char *what,
	     void **arr, size_t *k, struct ms_err *err);

int inv_cmp_cstr(const void *a, const void *b);

#endif
