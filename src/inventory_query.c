/*
 * inventory_query.c: looking states up (by digest, prefix, label or path),
 * listing them, and the owners of a tensor digest.
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
			return inv_oom(err);
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
			rc = inv_oom(err);
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
				rc = inv_oom(err);
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
	if ((rc = inv_prep(inv, q, &st, err)) != MS_OK ||
	    (rc = inv_prep(inv, "SELECT count(*) FROM state_files sf JOIN files f ON f.id = sf.file_id "
			        "JOIN states s ON s.id = sf.state_id WHERE s.digest = ? AND sf.copy = ? "
			        "AND f.path = ? AND f.id = (SELECT max(id) FROM files WHERE path = f.path)",
			        &in, err)) != MS_OK)
		goto out;
	inv_bind_text(st, 1, files[0]);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *dg = inv_col_str(st, 0);
		int64_t copy = sqlite3_column_int64(st, 1), nf = sqlite3_column_int64(st, 2);
		size_t have = 0;

		if (sqlite3_column_bytes(st, 0) != MS_STATE_DIGEST_LEN - 1)
			continue;
		for (size_t i = 0; i < n; i++) {
			sqlite3_reset(in);
			inv_bind_text(in, 1, dg);
			sqlite3_bind_int64(in, 2, copy);
			inv_bind_text(in, 3, files[i]);
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
		rc = inv_db_fail(inv, err, "cannot look up a path");
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
			inv_bind_text(st, 1, files[i]);
			while (k < 6 && sqlite3_step(st) == SQLITE_ROW) {
				const char *dg = inv_col_str(st, 0);
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
	if ((rc = inv_prep(inv, "SELECT s.digest FROM labels l JOIN states s ON s.id = l.state_id "
			        "WHERE l.name = ?", &st, err)) != MS_OK)
		return rc;
	inv_bind_text(st, 1, ref);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW && sqlite3_column_bytes(st, 0) == MS_STATE_DIGEST_LEN - 1) {
		memcpy(digest_out, sqlite3_column_text(st, 0), MS_STATE_DIGEST_LEN);
		sqlite3_finalize(st);
		return MS_OK;
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE && rc != SQLITE_ROW)
		return inv_db_fail(inv, err, "cannot look up a label");
	/* not a label: a path that exists names the state stored there */
	if (strncmp(ref, "sha256:", 7) &&
	    ((rc = resolve_path(inv, ref, digest_out, &found, err)) != MS_OK || found))
		return rc;
	hex = strncmp(ref, "sha256:", 7) ? ref : ref + 7;
	n = strlen(hex);
	if (!inv_hex_ok(hex, n) || n > 64) {
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
	if ((rc = inv_prep(inv, "SELECT digest FROM states WHERE digest GLOB ? ORDER BY digest LIMIT 6",
		           &st, err)) != MS_OK)
		return rc;
	inv_bind_text(st, 1, pat);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (sqlite3_column_bytes(st, 0) == MS_STATE_DIGEST_LEN - 1)
			memcpy(cand[k++], sqlite3_column_text(st, 0), MS_STATE_DIGEST_LEN);
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return inv_db_fail(inv, err, "cannot look up a digest");
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
	if ((rc = inv_prep(inv,
		           "SELECT s.digest FROM states s JOIN state_files sf ON sf.state_id = s.id "
		           "JOIN files f ON f.id = sf.file_id WHERE f.path = ?1 OR "
		           "(substr(f.path, 1, length(?2)) = ?2 AND "
		           "instr(substr(f.path, length(?2) + 1), '/') = 0) "
		           "ORDER BY s.id DESC LIMIT 1", &st, err)) != MS_OK)
		goto out;
	inv_bind_text(st, 1, real);
	inv_bind_text(st, 2, dir);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW && sqlite3_column_bytes(st, 0) == MS_STATE_DIGEST_LEN - 1) {
		memcpy(digest_out, sqlite3_column_text(st, 0), MS_STATE_DIGEST_LEN);
		rc = MS_OK;
	} else if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
		rc = ms_err_set(err, MS_ENOTFOUND, "'%s': no state of '%s' is recorded there", path,
				inv->path);
	} else {
		rc = inv_db_fail(inv, err, "cannot look up a path");
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
	    ms_inv_kind_parse(inv_col_str(st, 2), &s->kind) != MS_OK)
		return ms_err_set(err, MS_EDB, "'%s': state row %lld is malformed", inv->path,
				  (long long)s->id);
	memcpy(s->digest, sqlite3_column_text(st, 1), MS_STATE_DIGEST_LEN);
	s->layout = inv_col_dup(st, 3, &bad);
	s->label = inv_col_dup(st, 4, &bad);
	s->ntensors = (uint64_t)sqlite3_column_int64(st, 5);
	s->nbytes = (uint64_t)sqlite3_column_int64(st, 6);
	s->ep_size = sqlite3_column_type(st, 7) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 7);
	s->ep_rank = sqlite3_column_type(st, 8) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 8);
	s->experts = inv_col_dup(st, 9, &bad);
	s->tool = inv_col_dup(st, 10, &bad);
	s->argv = inv_col_dup(st, 11, &bad);
	s->user = inv_col_dup(st, 12, &bad);
	s->host = inv_col_dup(st, 13, &bad);
	s->created_at = inv_col_dup(st, 14, &bad);
	s->ncopies = (uint32_t)sqlite3_column_int64(st, 15);
	s->cwd = inv_col_dup(st, 16, &bad);
	s->labels = inv_col_dup(st, 17, &bad);
	return bad ? inv_oom(err) : MS_OK;
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
	if ((rc = inv_prep(inv, "SELECT " STATE_COLS " FROM states s WHERE s.digest = ?", &st, err)) != MS_OK)
		return rc;
	inv_bind_text(st, 1, digest);
	rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		sqlite3_finalize(st);
		if (rc == SQLITE_DONE)
			return ms_err_set(err, MS_ENOTFOUND, "no state %s in '%s'", digest, inv->path);
		return inv_db_fail(inv, err, "cannot read a state");
	}
	s = ms_malloc(sizeof(*s));
	if (!s) {
		sqlite3_finalize(st);
		return inv_oom(err);
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
int inv_grow(void **arr, size_t *cap, size_t n, size_t sz)
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

int inv_rows(struct ms_inv *inv, sqlite3_stmt *st, size_t sz, inv_row_fn row, const char *what,
	     void **arr, size_t *k, struct ms_err *err)
{
	size_t cap = 0;
	int rc;

	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		void *e;

		if (inv_grow(arr, &cap, *k, sz)) {
			rc = inv_oom(err);
			goto out;
		}
		e = (char *)*arr + *k * sz;
		memset(e, 0, sz);
		/* counted before it is filled: the caller's release frees
		 * what a failed row left */
		(*k)++;
		if ((rc = row(inv, st, e, err)) != MS_OK)
			goto out;
	}
	rc = rc == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, what);
out:
	sqlite3_finalize(st);
	return rc;
}

static int state_row_any(struct ms_inv *inv, sqlite3_stmt *st, void *e, struct ms_err *err)
{
	return state_row(inv, st, e, err);
}

int ms_inv_states_list(struct ms_inv *inv, enum ms_inv_kind kind, struct ms_inv_state **out,
		       size_t *n, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_state *a = NULL;
	size_t k = 0;
	int rc;

	*out = NULL;
	*n = 0;
	if ((rc = inv_prep(inv, "SELECT " STATE_COLS " FROM states s WHERE ?1 = 'any' OR s.kind = ?1 "
			        "ORDER BY s.id", &st, err)) != MS_OK)
		return rc;
	inv_bind_text(st, 1, ms_inv_kind_name(kind));
	rc = inv_rows(inv, st, sizeof(*a), state_row_any, "cannot list states", (void **)&a, &k, err);
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
		struct ms_vtensor *t;
		const char *dt = inv_col_str(st, 1);
		int bad = 0;

		if (inv_grow((void **)&f->tensors, &cap, f->ntensors, sizeof(*f->tensors)))
			return inv_oom(err);
		t = &f->tensors[f->ntensors];
		memset(t, 0, sizeof(*t));
		t->name = inv_col_dup(st, 0, &bad);
		if (bad)
			return inv_oom(err);
		f->ntensors++;
		t->offset = (uint64_t)sqlite3_column_int64(st, 3);
		t->nbytes = (uint64_t)sqlite3_column_int64(st, 4);
		if (ms_dtype_parse(dt, strlen(dt), &t->dtype) != MS_OK ||
		    parse_shape(inv_col_str(st, 2), &t->ndim, t->shape) ||
		    inv_digest_from_hex(inv_col_str(st, 5), t->digest) ||
		    (sqlite3_column_type(st, 6) != SQLITE_NULL &&
		     inv_digest_from_hex(inv_col_str(st, 6), t->tree)))
			return ms_err_set(err, MS_EDB, "'%s': the record of tensor '%s' in '%s' is malformed",
					  inv->path, t->name, f->path);
		t->has_tree = sqlite3_column_type(st, 6) != SQLITE_NULL;
	}
	return rc == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot read tensors");
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
	sid = inv_state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		return rc;
	if ((rc = inv_prep(inv,
		           "SELECT f.id, sf.copy, sf.name, f.path, f.size, f.dev, f.inode, f.header_len, "
		           "f.mtime_ns, f.ctime_ns, f.header_digest, f.file_digest FROM state_files sf "
		           "JOIN files f ON f.id = sf.file_id WHERE sf.state_id = ?1 AND (?2 = 0 OR sf.copy = ?2) "
		           "ORDER BY sf.copy, sf.name", &st, err)) != MS_OK)
		return rc;
	if (with_tensors &&
	    (rc = inv_prep(inv, "SELECT t.name, t.dtype, t.shape, t.byte_offset, t.nbytes, t.digest, "
			        "td.tree FROM tensors t LEFT JOIN tree_digests td ON td.digest = t.digest "
			        "AND td.chunk_log2 = " TREE_LOG2_TEXT " AND td.nbytes = t.nbytes "
			        "WHERE t.file_id = ? ORDER BY t.byte_offset", &tst, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, sid);
	sqlite3_bind_int64(st, 2, copy);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct ms_inv_file *f;
		int bad = 0;

		if (inv_grow((void **)&out->files, &cap, out->n, sizeof(*out->files))) {
			rc = inv_oom(err);
			goto out;
		}
		f = &out->files[out->n++];
		memset(f, 0, sizeof(*f));
		f->id = sqlite3_column_int64(st, 0);
		f->copy = (uint32_t)sqlite3_column_int64(st, 1);
		f->name = inv_col_dup(st, 2, &bad);
		f->path = inv_col_dup(st, 3, &bad);
		f->size = (uint64_t)sqlite3_column_int64(st, 4);
		f->dev = (uint64_t)sqlite3_column_int64(st, 5);
		f->inode = (uint64_t)sqlite3_column_int64(st, 6);
		f->header_len = (uint64_t)sqlite3_column_int64(st, 7);
		f->mtime_ns = sqlite3_column_int64(st, 8);
		f->ctime_ns = sqlite3_column_int64(st, 9);
		if (bad) {
			rc = inv_oom(err);
			goto out;
		}
		if (inv_digest_from_hex(inv_col_str(st, 10), f->header_digest)) {
			rc = ms_err_set(err, MS_EDB, "'%s': the record of file '%s' is malformed",
					inv->path, f->path);
			goto out;
		}
		if (sqlite3_column_type(st, 11) != SQLITE_NULL) {
			if (inv_digest_from_hex(inv_col_str(st, 11), f->file_digest)) {
				rc = ms_err_set(err, MS_EDB, "'%s': the record of file '%s' is malformed",
						inv->path, f->path);
				goto out;
			}
			f->has_file_digest = 1;
		}
		if (with_tensors && (rc = load_tensors(inv, tst, f, err)) != MS_OK)
			goto out;
	}
	rc = rc == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot read the files of a state");
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

static int config_row(struct ms_inv *inv, sqlite3_stmt *st, void *e, struct ms_err *err)
{
	struct ms_inv_config *c = e;
	int bad = 0;

	c->copy = (uint32_t)sqlite3_column_int64(st, 0);
	c->name = inv_col_dup(st, 1, &bad);
	c->path = inv_col_dup(st, 2, &bad);
	c->text = inv_col_dup(st, 4, &bad);
	c->len = (size_t)sqlite3_column_bytes(st, 4);
	if (bad)
		return inv_oom(err);
	if (inv_digest_from_hex(inv_col_str(st, 3), c->digest))
		return ms_err_set(err, MS_EDB, "'%s': the record of '%s' is malformed", inv->path,
				  c->name);
	return MS_OK;
}

int ms_inv_state_configs(struct ms_inv *inv, const char *digest, struct ms_inv_config **out,
			 size_t *n, struct ms_err *err)
{
	sqlite3_stmt *st = NULL;
	struct ms_inv_config *a = NULL;
	size_t k = 0;
	int64_t sid;
	int rc;

	*out = NULL;
	*n = 0;
	sid = inv_state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		return rc;
	if ((rc = inv_prep(inv, "SELECT copy, name, path, digest, content FROM state_configs "
			        "WHERE state_id = ? ORDER BY copy, name", &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	rc = inv_rows(inv, st, sizeof(*a), config_row, "cannot read configurations", (void **)&a, &k, err);
	if (rc != MS_OK) {
		ms_inv_configs_free(a, k);
		return rc;
	}
	*out = a;
	*n = k;
	return MS_OK;
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
	if ((rc = inv_prep(inv, sql, &st, err)) != MS_OK)
		return rc;
	sqlite3_bind_text(st, 1, hex, 64, SQLITE_STATIC);
	while ((step = sqlite3_step(st)) == SQLITE_ROW) {
		const unsigned char *d = sqlite3_column_text(st, 0);
		int bad = 0;

		if (*n == cap) {
			size_t nc = cap ? cap * 2 : 8;
			struct ms_inv_owner *no = ms_realloc(o, nc * sizeof(*no));

			if (!no) {
				rc = inv_oom(err);
				goto out;
			}
			o = no;
			cap = nc;
		}
		snprintf(o[*n].state, sizeof(o[*n].state), "%s", d ? (const char *)d : "");
		o[*n].name = inv_col_dup(st, 1, &bad);
		if (bad) {
			rc = inv_oom(err);
			goto out;
		}
		(*n)++;
	}
	if (step != SQLITE_DONE) {
		rc = inv_db_fail(inv, err, "cannot look up a tensor digest");
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
