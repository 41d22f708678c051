/*
 * inventory_gc.c: the sprawl (duplicate) report, removing states and
 * collecting what nothing refers to any more.
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
	if (inv_grow((void **)&r->pairs, cap, r->npairs, sizeof(*r->pairs)))
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
					if (inv_grow((void **)&seen, &scap, nseen, sizeof(*seen))) {
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
	if ((rc = inv_prep(inv, totals, &st, err)) != MS_OK)
		return rc;
	if (sqlite3_step(st) != SQLITE_ROW) {
		rc = inv_db_fail(inv, err, "cannot sum stored bytes");
		goto out;
	}
	r->stored_bytes = (uint64_t)sqlite3_column_int64(st, 0);
	r->stored_tensors = (uint64_t)sqlite3_column_int64(st, 1);
	r->unique_bytes = (uint64_t)sqlite3_column_int64(st, 2);
	r->redundant_bytes = r->stored_bytes - r->unique_bytes;
	sqlite3_finalize(st);
	if ((rc = inv_prep(inv, places, &st, err)) != MS_OK)
		return rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *dg = inv_col_str(st, 0), *sd = inv_col_str(st, 7);
		int64_t dev = sqlite3_column_int64(st, 2), ino = sqlite3_column_int64(st, 3);
		int64_t off = sqlite3_column_int64(st, 4);
		int bad = 0;

		if (!d || strcmp(d->digest, dg)) {
			if (d && dup_pairs(r, &paircap, d)) {
				rc = inv_oom(err);
				goto out;
			}
			if (inv_grow((void **)&r->dups, &dcap, r->n, sizeof(*r->dups))) {
				rc = inv_oom(err);
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
			if (inv_grow((void **)&d->places, &pcap, d->nplaces, sizeof(*d->places))) {
				rc = inv_oom(err);
				goto out;
			}
			pl = &d->places[d->nplaces++];
			memset(pl, 0, sizeof(*pl));
			pl->path = inv_col_dup(st, 5, &bad);
			pl->tensor = inv_col_dup(st, 6, &bad);
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
					rc = inv_oom(err);
					goto out;
				}
				pl->labels = a;
				scap = nc;
			}
			snprintf(pl->states[pl->nstates], MS_STATE_DIGEST_LEN, "%s", sd);
			pl->labels[pl->nstates] = inv_col_dup(st, 8, &bad);
			pl->nstates++;
		}
		if (bad) {
			rc = inv_oom(err);
			goto out;
		}
	}
	if (rc != SQLITE_DONE) {
		rc = inv_db_fail(inv, err, "cannot read duplicates");
		goto out;
	}
	if (d && dup_pairs(r, &paircap, d)) {
		rc = inv_oom(err);
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

	if ((rc = inv_tx_begin(inv, err)) != MS_OK)
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
	if ((rc = inv_prep(inv, "DELETE FROM states WHERE id = ?", &st, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, s->id);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot remove a state");
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
			inv_json_push(a, cJSON_CreateString(kids[i].child));
	}
	if ((rc = inv_log_json(inv, "rm", digest, d, err)) != MS_OK)
		goto out;
	rc = inv_tx_commit(inv, err);
	ms_inv_state_free(s);
	ms_inv_edges_free(kids, nkids);
	return rc;
out:
	inv_tx_rollback(inv);
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

int inv_cmp_cstr(const void *a, const void *b)
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
			return inv_oom(err);
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
	if ((rc = inv_prep(inv, "SELECT DISTINCT path FROM files", &st, err)) != MS_OK)
		return rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *path = inv_col_str(st, 0);

		for (int up = 1; up <= 2; up++) {
			char *p = ms_strdup(path);

			if (!p || inv_grow((void **)&list, &cap, n, sizeof(*list))) {
				ms_free(p);
				rc = inv_oom(err);
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
		rc = inv_db_fail(inv, err, "cannot list files");
		goto out;
	}
	sqlite3_finalize(st);
	st = NULL;
	for (size_t i = 0; i <= ndirs; i++) {
		char *p = i < ndirs ? ms_strdup(dirs[i]) : dir_of_db(inv->path);

		if (!p || inv_grow((void **)&list, &cap, n, sizeof(*list))) {
			ms_free(p);
			rc = inv_oom(err);
			goto out;
		}
		list[n++] = p;
	}
	if (n)
		qsort(list, n, sizeof(*list), inv_cmp_cstr);
	for (size_t i = 0; i < n; i++) {
		if (i && !strcmp(list[i], list[i - 1]))
			continue;
		if ((rc = gc_dir(list[i], dry_run, fn, ctx, &count, &failed, err)) != MS_OK)
			goto out;
	}
	/* file rows no state uses */
	if (!dry_run) {
		if ((rc = inv_tx_begin(inv, err)) != MS_OK)
			goto out;
		intx = 1;
	}
	if ((rc = inv_prep(inv, "SELECT id, path FROM files WHERE id NOT IN (SELECT file_id FROM state_files) "
			        "ORDER BY path, id", &st, err)) != MS_OK)
		goto out;
	paths = cJSON_CreateArray();
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		inv_json_push(paths, cJSON_CreateString(inv_col_str(st, 1)));
		count++;
		if (fn)
			fn(MS_INV_GC_FILE_ROW, inv_col_str(st, 1), ctx);
	}
	sqlite3_finalize(st);
	st = NULL;
	if (rc != SQLITE_DONE) {
		rc = inv_db_fail(inv, err, "cannot list unused files");
		goto out;
	}
	rc = MS_OK;
	if (intx && cJSON_GetArraySize(paths) > 0) {
		cJSON *d = cJSON_CreateObject();

		if ((rc = inv_exec_sql(inv, "DELETE FROM files WHERE id NOT IN (SELECT file_id FROM state_files)",
				       err)) != MS_OK) {
			cJSON_Delete(d);
			goto out;
		}
		inv_json_put(d, "files", paths);
		paths = NULL;
		if ((rc = inv_log_json(inv, "gc", inv->path, d, err)) != MS_OK)
			goto out;
	}
	if (intx) {
		intx = 0;
		if ((rc = inv_tx_commit(inv, err)) != MS_OK)
			goto out;
	}
	if (failed)
		rc = MS_EIO;
out:
	if (intx)
		inv_tx_rollback(inv);
	sqlite3_finalize(st);
	cJSON_Delete(paths);
	for (size_t i = 0; i < n; i++)
		ms_free(list[i]);
	ms_free(list);
	if (nitems)
		*nitems = count;
	return rc;
}
