/*
 * inventory_add.c: adding weight states, their files, tensors, trees and
 * labels to the inventory, hashed first with no lock held and recorded in
 * one transaction.
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

/* ---- adding ------------------------------------------------------------------------ */

void ms_inv_add_opts_init(struct ms_inv_add_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->kind = MS_INV_KIND_ANY;
	o->ep_size = o->ep_rank = -1;
}

int inv_label_check(const char *l, struct ms_err *err)
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
	if ((rc = inv_prep(inv,
		           "SELECT id, header_len, header_digest, file_digest, ntensors FROM files "
		           "WHERE path = ?1 AND size = ?2 AND mtime_ns = ?3 AND ctime_ns = ?4 AND dev = ?5 "
		           "AND inode = ?6 ORDER BY id DESC LIMIT 1", &st, err)) != MS_OK)
		return rc;
	inv_bind_text(st, 1, a->real);
	sqlite3_bind_int64(st, 2, (int64_t)f->size);
	sqlite3_bind_int64(st, 3, f->mtime_ns);
	sqlite3_bind_int64(st, 4, f->ctime_ns);
	sqlite3_bind_int64(st, 5, (int64_t)f->dev);
	sqlite3_bind_int64(st, 6, (int64_t)f->ino);
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		sqlite3_finalize(st);
		return rc == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot look up a file");
	}
	id = sqlite3_column_int64(st, 0);
	if ((uint64_t)sqlite3_column_int64(st, 1) != f->header_len ||
	    (uint64_t)sqlite3_column_int64(st, 4) != f->ntensors ||
	    inv_digest_from_hex(inv_col_str(st, 2), rec)) {
		sqlite3_finalize(st);
		return MS_OK;
	}
	if (sqlite3_column_type(st, 3) != SQLITE_NULL) {
		if (inv_digest_from_hex(inv_col_str(st, 3), fd)) {
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
	if ((rc = inv_prep(inv, "SELECT name, digest FROM tensors WHERE file_id = ?", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, id);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct ms_tensor *t = (struct ms_tensor *)ms_st_find(f, inv_col_str(st, 0));

		if (!t || inv_digest_from_hex(inv_col_str(st, 1), t->digest)) {
			sqlite3_finalize(st);
			return MS_OK;
		}
		count++;
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return inv_db_fail(inv, err, "cannot read recorded tensors");
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

	if ((rc = inv_prep(inv,
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
			rc = inv_db_fail(inv, err, "cannot record a tensor");
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
	if ((rc = inv_prep(inv, "SELECT id FROM files WHERE path = ? AND content_digest = ?", &st,
		           err)) != MS_OK)
		return rc;
	inv_bind_text(st, 1, a->real);
	inv_bind_text(st, 2, a->content);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		a->row = sqlite3_column_int64(st, 0);
		sqlite3_finalize(st);
		if ((rc = inv_prep(inv,
			           "UPDATE files SET size = ?2, mtime_ns = ?3, ctime_ns = ?4, dev = ?5, inode = ?6, "
			           "file_digest = coalesce(file_digest, ?7) WHERE id = ?1 AND (size <> ?2 OR "
			           "mtime_ns <> ?3 OR ctime_ns <> ?4 OR dev <> ?5 OR inode <> ?6 OR "
			           "(file_digest IS NULL AND ?7 IS NOT NULL))", &st, err)) != MS_OK)
			return rc;
	} else if (rc == SQLITE_DONE) {
		sqlite3_finalize(st);
		if ((rc = inv_prep(inv,
			           "INSERT INTO files (path, size, mtime_ns, ctime_ns, dev, inode, header_len, "
			           "header_digest, content_digest, file_digest, ntensors, added_at) "
			           "VALUES (?8, ?2, ?3, ?4, ?5, ?6, ?9, ?10, ?11, ?7, ?12, ?13)", &st, err)) != MS_OK)
			return rc;
		a->row = 0;
	} else {
		sqlite3_finalize(st);
		return inv_db_fail(inv, err, "cannot look up a file");
	}
	sqlite3_bind_int64(st, 1, a->row);
	sqlite3_bind_int64(st, 2, (int64_t)f->size);
	sqlite3_bind_int64(st, 3, f->mtime_ns);
	sqlite3_bind_int64(st, 4, f->ctime_ns);
	sqlite3_bind_int64(st, 5, (int64_t)f->dev);
	sqlite3_bind_int64(st, 6, (int64_t)f->ino);
	inv_bind_text(st, 7, f->has_file_digest ? fd : NULL);
	if (!a->row) {
		inv_bind_text(st, 8, a->real);
		sqlite3_bind_int64(st, 9, (int64_t)f->header_len);
		inv_bind_text(st, 10, hd);
		inv_bind_text(st, 11, a->content);
		sqlite3_bind_int64(st, 12, (int64_t)f->ntensors);
		inv_bind_text(st, 13, x->now);
	}
	if (sqlite3_step(st) != SQLITE_DONE) {
		rc = inv_db_fail(inv, err, "cannot record a file");
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
	if ((rc = inv_prep(inv, "SELECT copy, file_id FROM state_files WHERE state_id = ? "
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
	return rc == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot read the copies of a state");
}

static int insert_configs(struct ms_inv *inv, int64_t sid, uint32_t copy,
			  const struct ms_ckpt *ck, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = inv_prep(inv, "INSERT INTO state_configs (state_id, copy, name, path, digest, content) "
			        "VALUES (?,?,?,?,?,?)", &st, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < ck->nconfigs; i++) {
		const struct ms_ckpt_config *c = &ck->configs[i];
		char hex[65], *real = realpath(c->path, NULL);

		ms_hex(c->digest, MS_SHA256_LEN, hex);
		sqlite3_bind_int64(st, 1, sid);
		sqlite3_bind_int64(st, 2, copy);
		inv_bind_text(st, 3, c->name);
		inv_bind_text(st, 4, real ? real : c->path);
		inv_bind_text(st, 5, hex);
		/* a side file (a tokenizer of tens of megabytes, a model card) is
		 * recorded by digest; only configuration files keep their text */
		sqlite3_bind_text(st, 6, c->side ? "" : c->text, c->side ? 0 : (int)c->len,
				  SQLITE_STATIC);
		rc = sqlite3_step(st);
		free(real);
		if (rc != SQLITE_DONE) {
			sqlite3_finalize(st);
			return inv_db_fail(inv, err, "cannot record a configuration file");
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

	if ((rc = inv_prep(inv, "SELECT name, digest FROM state_configs WHERE state_id = ? AND copy = ? "
			        "ORDER BY name", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, copy);
	/* ck->configs is not sorted: compare by lookup */
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const struct ms_ckpt_config *c = ms_ckpt_config(x->ck, inv_col_str(st, 0));
		char hex[65];

		k++;
		if (!c) {
			same = 0;
			continue;
		}
		ms_hex(c->digest, MS_SHA256_LEN, hex);
		if (strcmp(hex, inv_col_str(st, 1)))
			same = 0;
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return inv_db_fail(inv, err, "cannot read recorded configurations");
	if (same && k == x->ck->nconfigs)
		return MS_OK;
	if ((rc = inv_prep(inv, "DELETE FROM state_configs WHERE state_id = ? AND copy = ?", &st,
		           err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, copy);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot replace configurations");
	sqlite3_finalize(st);
	if (rc == MS_OK)
		rc = insert_configs(inv, sid, copy, x->ck, err);
	if (rc == MS_OK) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddNumberToObject(d, "copy", copy);
		inv_json_put(d, "configs", configs_json(x->ck));
		rc = inv_log_json(inv, "configs", x->digest, d, err);
	}
	return rc;
}

int64_t inv_state_id_of(struct ms_inv *inv, const char *digest, struct ms_err *err, int *rcp)
{
	sqlite3_stmt *st = NULL;
	int64_t id = 0;
	int rc;

	*rcp = inv_prep(inv, "SELECT id FROM states WHERE digest = ?", &st, err);
	if (*rcp != MS_OK)
		return 0;
	inv_bind_text(st, 1, digest);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		id = sqlite3_column_int64(st, 0);
	else if (rc == SQLITE_DONE)
		*rcp = ms_err_set(err, MS_ENOTFOUND, "no state %s in '%s'", digest, inv->path);
	else
		*rcp = inv_db_fail(inv, err, "cannot look up a state");
	sqlite3_finalize(st);
	return id;
}

int inv_run_exists(struct ms_inv *inv, int64_t run_id, int *running, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = inv_prep(inv, "SELECT status FROM runs WHERE id = ?", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, run_id);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		if (running)
			*running = !strcmp(inv_col_str(st, 0), "running");
		rc = MS_OK;
	} else if (rc == SQLITE_DONE) {
		rc = ms_err_set(err, MS_ENOTFOUND, "no run %lld in '%s'", (long long)run_id, inv->path);
	} else {
		rc = inv_db_fail(inv, err, "cannot look up a run");
	}
	sqlite3_finalize(st);
	return rc;
}

/* Under the write lock. */
int inv_run_output_locked(struct ms_inv *inv, int64_t run_id, const char *digest, int64_t sid,
			    struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = inv_run_exists(inv, run_id, NULL, err)) != MS_OK)
		return rc;
	if ((rc = inv_prep(inv, "INSERT OR IGNORE INTO run_outputs (run_id, digest, state_id) VALUES (?,?,?)",
		           &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, run_id);
	inv_bind_text(st, 2, digest);
	sqlite3_bind_int64(st, 3, sid);
	if (sqlite3_step(st) != SQLITE_DONE) {
		rc = inv_db_fail(inv, err, "cannot record a run output");
		sqlite3_finalize(st);
		return rc;
	}
	sqlite3_finalize(st);
	if (sqlite3_changes(inv->db) == 1) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddNumberToObject(d, "run", (double)run_id);
		rc = inv_log_json(inv, "run_output", digest, d, err);
	}
	return rc;
}

static int add_edge(struct addctx *x, int64_t sid, const char *parent, struct ms_err *err)
{
	struct ms_inv *inv = x->inv;
	sqlite3_stmt *st = NULL;
	int64_t pid;
	int rc;

	pid = inv_state_id_of(inv, parent, err, &rc);
	if (rc != MS_OK)
		return rc;
	if (pid == sid)
		return ms_err_set(err, MS_EINVAL, "state %s cannot derive from itself", x->digest);
	/* a parent that descends from the child would close a cycle */
	if ((rc = inv_prep(inv,
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
		return inv_db_fail(inv, err, "cannot walk the derivations");
	if ((rc = inv_prep(inv, "SELECT params FROM derivations WHERE child_id = ? AND parent_id = ? "
			        "AND operation = ?", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, pid);
	inv_bind_text(st, 3, x->o->operation);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		if (strcmp(inv_col_str(st, 0), x->params))
			rc = ms_err_set(err, MS_EEXIST,
					"%s is already recorded as '%s' of %s with parameters %s",
					x->digest, x->o->operation, parent, inv_col_str(st, 0));
		else
			rc = MS_OK;
		sqlite3_finalize(st);
		return rc;
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return inv_db_fail(inv, err, "cannot look up a derivation");
	if ((rc = inv_prep(inv, "INSERT INTO derivations (child_id, parent_id, operation, params, run_id, "
			        "created_at) VALUES (?,?,?,?,?,?)", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, pid);
	inv_bind_text(st, 3, x->o->operation);
	inv_bind_text(st, 4, x->params);
	if (x->o->run_id > 0)
		sqlite3_bind_int64(st, 5, x->o->run_id);
	else
		sqlite3_bind_null(st, 5);
	inv_bind_text(st, 6, x->now);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot record a derivation");
	sqlite3_finalize(st);
	if (rc == MS_OK) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddStringToObject(d, "parent", parent);
		cJSON_AddStringToObject(d, "operation", x->o->operation);
		cJSON_AddRawToObject(d, "params", x->params);
		if (x->o->run_id > 0)
			cJSON_AddNumberToObject(d, "run", (double)x->o->run_id);
		rc = inv_log_json(inv, "derive", x->digest, d, err);
	}
	return rc;
}

/* The state (id and digest) a label names; *sid 0 when none. */
int inv_label_owner(struct ms_inv *inv, const char *l, int64_t *sid,
		      char digest[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	*sid = 0;
	if ((rc = inv_prep(inv, "SELECT s.id, s.digest FROM labels l JOIN states s ON s.id = l.state_id "
			        "WHERE l.name = ?", &st, err)) != MS_OK)
		return rc;
	inv_bind_text(st, 1, l);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW && sqlite3_column_bytes(st, 1) == MS_STATE_DIGEST_LEN - 1) {
		*sid = sqlite3_column_int64(st, 0);
		if (digest)
			memcpy(digest, sqlite3_column_text(st, 1), MS_STATE_DIGEST_LEN);
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		return inv_db_fail(inv, err, "cannot look up a label");
	return MS_OK;
}

/* states.label is the state's oldest label (what ls, show and lineage
 * print first); the labels table is the truth it is kept in step with. */
static int label_sync(struct ms_inv *inv, int64_t sid, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = inv_prep(inv, "UPDATE states SET label = (SELECT name FROM labels WHERE state_id = ?1 "
			        "ORDER BY created_at, name LIMIT 1) WHERE id = ?1", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot set a label");
	sqlite3_finalize(st);
	return rc;
}

/* Give state sid (digest) the label l, in the caller's transaction. A label
 * of another state is MS_EEXIST, unless force, which moves it (logged with
 * the state it came from). Nothing is written when it is already there. */
int inv_label_put(struct ms_inv *inv, int64_t sid, const char *digest, const char *l,
		    int force, struct ms_err *err)
{
	char from[MS_STATE_DIGEST_LEN], at[ISO_LEN];
	sqlite3_stmt *st = NULL;
	int64_t owner;
	cJSON *d;
	int rc;

	if ((rc = inv_label_owner(inv, l, &owner, from, err)) != MS_OK)
		return rc;
	if (owner == sid)
		return MS_OK;
	if (owner && !force)
		return ms_err_set(err, MS_EEXIST,
				  "label '%s' already names %s (move it with 'msinv label --force')",
				  l, from);
	if (owner) {
		if ((rc = inv_prep(inv, "DELETE FROM labels WHERE name = ?", &st, err)) != MS_OK)
			return rc;
		inv_bind_text(st, 1, l);
		rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot move a label");
		sqlite3_finalize(st);
		if (rc != MS_OK || (rc = label_sync(inv, owner, err)) != MS_OK)
			return rc;
	}
	inv_now_iso(at);
	if ((rc = inv_prep(inv, "INSERT INTO labels (name, state_id, created_at) VALUES (?,?,?)", &st,
		           err)) != MS_OK)
		return rc;
	inv_bind_text(st, 1, l);
	sqlite3_bind_int64(st, 2, sid);
	inv_bind_text(st, 3, at);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot set a label");
	sqlite3_finalize(st);
	if (rc != MS_OK || (rc = label_sync(inv, sid, err)) != MS_OK)
		return rc;
	d = cJSON_CreateObject();
	cJSON_AddStringToObject(d, "label", l);
	if (owner)
		cJSON_AddStringToObject(d, "from", from);
	return inv_log_json(inv, "label", digest, d, err);
}

/* add's --label: one more name for the state (a second copy may bring
 * its own) */
static int set_label(struct addctx *x, int64_t sid, struct ms_err *err)
{
	if (!x->o->label)
		return MS_OK;
	return inv_label_put(x->inv, sid, x->digest, x->o->label, 0, err);
}

int ms_inv_label_check(const char *label, struct ms_err *err)
{
	return inv_label_check(label, err);
}

int ms_inv_label_add(struct ms_inv *inv, const char *digest, const char *label, int force,
		     struct ms_err *err)
{
	struct ms_inv_state *s = NULL;
	int rc;

	if ((rc = inv_label_check(label, err)) != MS_OK)
		return rc;
	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
		return rc;
	if ((rc = ms_inv_state_get(inv, digest, &s, err)) != MS_OK ||
	    (rc = inv_label_put(inv, s->id, s->digest, label, force, err)) != MS_OK)
		goto out;
	rc = inv_tx_commit(inv, err);
	ms_inv_state_free(s);
	return rc;
out:
	inv_tx_rollback(inv);
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

	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
		return rc;
	if ((rc = inv_label_owner(inv, label, &owner, digest, err)) != MS_OK)
		goto out;
	if (!owner) {
		rc = ms_err_set(err, MS_ENOTFOUND, "no state labelled '%s' in '%s'", label, inv->path);
		goto out;
	}
	if ((rc = inv_prep(inv, "DELETE FROM labels WHERE name = ?", &st, err)) != MS_OK)
		goto out;
	inv_bind_text(st, 1, label);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot remove a label");
	sqlite3_finalize(st);
	if (rc != MS_OK || (rc = label_sync(inv, owner, err)) != MS_OK)
		goto out;
	d = cJSON_CreateObject();
	cJSON_AddStringToObject(d, "label", label);
	if ((rc = inv_log_json(inv, "unlabel", digest, d, err)) != MS_OK)
		goto out;
	return inv_tx_commit(inv, err);
out:
	inv_tx_rollback(inv);
	return rc;
}

static int insert_state(struct addctx *x, int64_t *sid, struct ms_err *err)
{
	struct ms_inv *inv = x->inv;
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = inv_prep(inv, "INSERT INTO states (digest, kind, layout, label, ntensors, nbytes, ep_size, "
			        "ep_rank, experts, tool, argv, user, host, created_at, cwd) "
			        "VALUES (?,?,?,NULL,?,?,?,?,?,?,?,?,?,?,?)", &st, err)) != MS_OK)
		return rc;
	inv_bind_text(st, 1, x->digest);
	inv_bind_text(st, 2, ms_inv_kind_name(x->kind));
	inv_bind_text(st, 3, x->cls.layout);
	sqlite3_bind_int64(st, 4, (int64_t)x->ck->ntensors);
	sqlite3_bind_int64(st, 5, (int64_t)x->nbytes);
	if (x->ep_size > 0) {
		sqlite3_bind_int64(st, 6, x->ep_size);
		sqlite3_bind_int64(st, 7, x->ep_rank);
	} else {
		sqlite3_bind_null(st, 6);
		sqlite3_bind_null(st, 7);
	}
	inv_bind_text(st, 8, x->cls.experts);
	inv_bind_text(st, 9, inv->tool);
	inv_bind_text(st, 10, inv->argv_json);
	inv_bind_text(st, 11, inv->user);
	inv_bind_text(st, 12, inv->host);
	inv_bind_text(st, 13, x->now);
	inv_bind_text(st, 14, inv->cwd);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot record the state");
	sqlite3_finalize(st);
	*sid = sqlite3_last_insert_rowid(inv->db);
	return rc;
}

static int insert_copy(struct addctx *x, int64_t sid, uint32_t copy, struct ms_err *err)
{
	struct ms_inv *inv = x->inv;
	sqlite3_stmt *st = NULL;
	int rc;

	if ((rc = inv_prep(inv, "INSERT INTO state_files (state_id, copy, file_id, name) VALUES (?,?,?,?)",
		           &st, err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < x->ck->nfiles; i++) {
		sqlite3_bind_int64(st, 1, sid);
		sqlite3_bind_int64(st, 2, copy);
		sqlite3_bind_int64(st, 3, x->af[i].row);
		inv_bind_text(st, 4, x->af[i].name);
		if (sqlite3_step(st) != SQLITE_DONE) {
			sqlite3_finalize(st);
			return inv_db_fail(inv, err, "cannot record the files of a state");
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
		inv_json_push(a, cJSON_CreateString(x->af[i].real));
	return a;
}

/* Insert tree digests inside the caller's transaction (see
 * ms_inv_record_trees); *added counts the new rows. */
int inv_put_trees(struct ms_inv *inv, const struct ms_tree_rec *r, size_t n,
		    const char *source, const char *at, size_t *added, struct ms_err *err)
{
	sqlite3_stmt *sel = NULL, *ins = NULL;
	int rc;

	*added = 0;
	if ((rc = inv_prep(inv, "SELECT tree FROM tree_digests WHERE digest = ?1 AND chunk_log2 = ?2",
		           &sel, err)) != MS_OK ||
	    (rc = inv_prep(inv, "INSERT INTO tree_digests (digest, chunk_log2, nbytes, tree, source, "
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
			if (strcmp(inv_col_str(sel, 0), ht)) {
				rc = ms_err_set(err, MS_ECHECK,
						"'%s': tree digest %.16s... of bytes %.16s... differs from "
						"the recorded %.16s...; nothing recorded",
						inv->path, ht, hd, inv_col_str(sel, 0));
				goto out;
			}
			continue;
		}
		if (rc != SQLITE_DONE) {
			rc = inv_db_fail(inv, err, "cannot look up a tree digest");
			goto out;
		}
		sqlite3_reset(ins);
		sqlite3_bind_text(ins, 1, hd, 64, SQLITE_STATIC);
		sqlite3_bind_int(ins, 2, (int)r[i].log2);
		sqlite3_bind_int64(ins, 3, (int64_t)r[i].nbytes);
		sqlite3_bind_text(ins, 4, ht, 64, SQLITE_STATIC);
		inv_bind_text(ins, 5, source);
		inv_bind_text(ins, 6, at);
		if (sqlite3_step(ins) != SQLITE_DONE) {
			rc = inv_db_fail(inv, err, "cannot record a tree digest");
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

int inv_log_trees(struct ms_inv *inv, const char *state, const char *source, size_t added,
		    struct ms_err *err)
{
	cJSON *d = cJSON_CreateObject();

	cJSON_AddStringToObject(d, "source", source);
	cJSON_AddNumberToObject(d, "trees", (double)added);
	cJSON_AddNumberToObject(d, "chunk_log2", MS_TREE_LOG2);
	return inv_log_json(inv, "trees", state ? state : "-", d, err);
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
		return inv_oom(err);
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
		rc = inv_put_trees(x->inv, r, n, "add", x->now, &added, err);
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

	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
		return rc;
	inv_now_iso(x->now);
	for (size_t i = 0; i < nf; i++)
		if ((rc = upsert_file(x, &x->af[i], err)) != MS_OK)
			goto out;
	if ((rc = add_trees(x, err)) != MS_OK)
		goto out;
	ids = ms_malloc(nf * sizeof(*ids));
	if (!ids) {
		rc = inv_oom(err);
		goto out;
	}
	for (size_t i = 0; i < nf; i++)
		ids[i] = x->af[i].row;
	qsort(ids, nf, sizeof(*ids), cmp_i64);

	if ((rc = inv_prep(inv, "SELECT id, kind, ep_size, ep_rank, layout FROM states WHERE digest = ?",
		           &st, err)) != MS_OK)
		goto out;
	inv_bind_text(st, 1, x->digest);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		enum ms_inv_kind k = MS_INV_KIND_ANY;
		int32_t es = sqlite3_column_type(st, 2) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 2);
		int32_t er = sqlite3_column_type(st, 3) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 3);

		sid = sqlite3_column_int64(st, 0);
		ms_inv_kind_parse(inv_col_str(st, 1), &k);
		if (strcmp(inv_col_str(st, 4), x->cls.layout)) {
			/* same tensors, other metadata: the record is what the digest names */
			rc = ms_err_set(err, MS_EINVAL,
					"%s is recorded with layout %s, but these files say %s (their msinv.nvfp4 metadata differs)",
					x->digest, inv_col_str(st, 4), x->cls.layout);
			goto out;
		}
		sqlite3_finalize(st);
		st = NULL;
		if (x->o->kind != MS_INV_KIND_ANY && x->o->kind != k) {
			rc = ms_err_set(err, MS_EINVAL, "%s is recorded as %s, not %s", x->digest,
					ms_inv_kind_name(k), ms_inv_kind_name(x->o->kind));
			goto out;
		}
		if (!inv_kind_compatible(x->cls.kind, k)) {
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
			inv_json_put(d, "files", files_json(x));
			inv_json_put(d, "configs", configs_json(x->ck));
			if (x->trees_added)
				cJSON_AddNumberToObject(d, "trees", (double)x->trees_added);
			if ((rc = inv_log_json(inv, "copy", x->digest, d, err)) != MS_OK)
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
		inv_json_put(d, "files", files_json(x));
		inv_json_put(d, "configs", configs_json(x->ck));
		if (x->trees_added)
			cJSON_AddNumberToObject(d, "trees", (double)x->trees_added);
		if ((rc = inv_log_json(inv, "add", x->digest, d, err)) != MS_OK)
			goto out;
	} else {
		rc = inv_db_fail(inv, err, "cannot look up a state");
		goto out;
	}
	x->st.copy = copy;
	if ((rc = set_label(x, sid, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < x->o->nparents; i++)
		if ((rc = add_edge(x, sid, x->parents[i], err)) != MS_OK)
			goto out;
	if (x->o->run_id > 0 && (rc = inv_run_output_locked(inv, x->o->run_id, x->digest, sid, err)) != MS_OK)
		goto out;
	/* trees of files already recorded (no add or copy entry above says so) */
	if (x->trees_added && !x->st.new_copy &&
	    (rc = inv_log_trees(inv, x->digest, "add", x->trees_added, err)) != MS_OK)
		goto out;
	rc = inv_tx_commit(inv, err);
	ms_free(ids);
	return rc;
out:
	sqlite3_finalize(st);
	inv_tx_rollback(inv);
	ms_free(ids);
	return rc;
}

/* Reconcile the kind and EP placement asked for with what the files say. */
static int reconcile(struct addctx *x, struct ms_err *err)
{
	const struct ms_inv_add_opts *o = x->o;
	enum ms_inv_kind kind = o->kind;

	if (kind != MS_INV_KIND_ANY && !inv_kind_compatible(x->cls.kind, kind))
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
						inv_kind_compatible(x->cls.kind, MS_INV_KIND_ADAPTER_SHARD)))
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
	if (o->label && (rc = inv_label_check(o->label, err)) != MS_OK)
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
			return inv_oom(err);
		if (!cJSON_IsObject(j)) {
			cJSON_Delete(j);
			return ms_err_set(err, MS_EINVAL, "parameters '%s' are not a JSON object", p);
		}
		x->params = inv_json_take(j);
		if (!x->params)
			return inv_oom(err);
	}
	if (o->nparents) {
		x->parents = ms_calloc(o->nparents, sizeof(*x->parents));
		if (!x->parents)
			return inv_oom(err);
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
		rc = inv_oom(err);
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
			rc = inv_oom(err);
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
	if ((rc = inv_classify_ckpt(x.ck, &x.cls, err)) != MS_OK)
		goto out;
	if ((rc = reconcile(&x, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < x.ck->nfiles; i++)
		if ((rc = content_digest(x.af[i].f, x.af[i].content)) != MS_OK) {
			rc = ms_sha256_err(err, rc);
			goto out;
		}
	if (opts->tool || opts->argv) {
		argv_json = inv_argv_to_json(opts->argv ? opts->argc : 0, opts->argv);
		saved_tool = inv->tool;
		saved_argv = inv->argv_json;
		inv->tool = ms_strdup(opts->tool ? opts->tool : saved_tool);
		inv->argv_json = argv_json;
		if (!argv_json || !inv->tool) {
			rc = inv_oom(err);
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
