/*
 * inventory_lineage.c: the lineage edges between states, and lineage
 * carried from one inventory into another.
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

static int edge_row(struct ms_inv *inv, sqlite3_stmt *st, void *p, struct ms_err *err)
{
	struct ms_inv_edge *e = p;
	int bad = 0;

	(void)inv;
	snprintf(e->parent, sizeof(e->parent), "%s", inv_col_str(st, 0));
	e->parent_label = inv_col_dup(st, 1, &bad);
	ms_inv_kind_parse(inv_col_str(st, 2), &e->parent_kind);
	e->parent_layout = inv_col_dup(st, 3, &bad);
	snprintf(e->child, sizeof(e->child), "%s", inv_col_str(st, 4));
	e->child_label = inv_col_dup(st, 5, &bad);
	ms_inv_kind_parse(inv_col_str(st, 6), &e->child_kind);
	e->child_layout = inv_col_dup(st, 7, &bad);
	e->operation = inv_col_dup(st, 8, &bad);
	e->params = inv_col_dup(st, 9, &bad);
	e->run_id = sqlite3_column_int64(st, 10);
	e->created_at = inv_col_dup(st, 11, &bad);
	return bad ? inv_oom(err) : MS_OK;
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
	size_t k = 0;
	int64_t sid;
	int rc;

	*out = NULL;
	*n = 0;
	sid = inv_state_id_of(inv, digest, err, &rc);
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
		return inv_oom(err);
	rc = inv_prep(inv, sql, &st, err);
	ms_free(sql);
	if (rc != MS_OK)
		return rc;
	sqlite3_bind_int64(st, 1, sid);
	rc = inv_rows(inv, st, sizeof(*a), edge_row, "cannot read derivations", (void **)&a, &k, err);
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

int inv_cmp_cstr(const void *a, const void *b);

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
	if (lb && !cJSON_IsNull(lb) && (!str_ok(lb) || inv_label_check(lb->valuestring, NULL) != MS_OK))
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
		return inv_oom(err);
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
	qsort(sorted, n, sizeof(*sorted), inv_cmp_cstr);
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
			 bsearch(&c->valuestring, sorted, n, sizeof(*sorted), inv_cmp_cstr);
		have_p = bsearch(&p->valuestring, sorted, n, sizeof(*sorted), inv_cmp_cstr) != NULL;
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
		return nomem ? inv_oom(err) : ms_err_set(err, MS_EINVAL, "lineage: not JSON");
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
	inv_json_put(o, "label", s->label ? cJSON_CreateString(s->label) : cJSON_CreateNull());
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
	inv_json_put(o, "experts", v ? v : cJSON_CreateNull());
	v = ms_json_parse(s->argv, strlen(s->argv), NULL);
	inv_json_put(o, "argv", v ? v : cJSON_CreateArray());
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
		inv_json_put(x, "params", params ? params : cJSON_CreateObject());
		cJSON_AddStringToObject(x, "created_at", e[i].created_at);
		inv_json_push(edges, x);
		/* every parent once (a child is the state or some edge's parent) */
		for (size_t k = 0; k < nseen && !known; k++)
			known = !strcmp(seen[k], e[i].parent);
		if (known)
			continue;
		if (inv_grow((void **)&seen, &cap, nseen, sizeof(*seen))) {
			rc = inv_oom(err);
			goto out;
		}
		seen[nseen++] = e[i].parent;
		if ((rc = ms_inv_state_get(inv, e[i].parent, &s, err)) != MS_OK)
			goto out;
		inv_json_push(states, lineage_state_json(s));
		ms_inv_state_free(s);
		s = NULL;
	}
	if (ms_json_failed(mark) || !(*json = inv_json_take(o))) {
		o = NULL;
		rc = inv_oom(err);
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
	inv_state_id_of(inv, digest, err, &rc);
	if (rc == MS_OK)
		return MS_OK; /* recorded here already: ours stands */
	if (rc != MS_ENOTFOUND)
		return rc;
	if (label) {
		int64_t owner;
		char from[MS_STATE_DIGEST_LEN];

		/* the labels table is where names live (states.label follows it) */
		if ((rc = inv_label_owner(inv, label, &owner, from, err)) != MS_OK)
			return rc;
		if (owner) {
			inv_json_push(dropped_labels, cJSON_CreateString(label));
			label = NULL;
		}
	}
	argv = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(s, "argv"));
	experts = ex && !cJSON_IsNull(ex) ? cJSON_PrintUnformatted(ex) : NULL;
	if (!argv || (ex && !cJSON_IsNull(ex) && !experts)) {
		rc = inv_oom(err);
		goto out;
	}
	if ((rc = inv_prep(inv, "INSERT INTO states (digest, kind, layout, label, ntensors, nbytes, ep_size, "
			        "ep_rank, experts, tool, argv, user, host, created_at) "
			        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", &st, err)) != MS_OK)
		goto out;
	inv_bind_text(st, 1, digest);
	inv_bind_text(st, 2, cJSON_GetObjectItemCaseSensitive(s, "kind")->valuestring);
	inv_bind_text(st, 3, cJSON_GetObjectItemCaseSensitive(s, "layout")->valuestring);
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
	inv_bind_text(st, 9, experts);
	inv_bind_text(st, 10, cJSON_GetObjectItemCaseSensitive(s, "tool")->valuestring);
	inv_bind_text(st, 11, argv);
	inv_bind_text(st, 12, cJSON_GetObjectItemCaseSensitive(s, "user")->valuestring);
	inv_bind_text(st, 13, cJSON_GetObjectItemCaseSensitive(s, "host")->valuestring);
	inv_bind_text(st, 14, cJSON_GetObjectItemCaseSensitive(s, "created_at")->valuestring);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot record an ancestor");
	/* the label goes through the labels table, as every label does */
	if (rc == MS_OK && label)
		rc = inv_label_put(inv, sqlite3_last_insert_rowid(inv->db), digest, label, 0, err);
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
	cid = inv_state_id_of(inv, child, err, &rc);
	if (rc != MS_OK)
		return rc;
	pid = inv_state_id_of(inv, parent, err, &rc);
	if (rc != MS_OK)
		return rc;
	if ((rc = inv_prep(inv, "WITH RECURSIVE a(id) AS (SELECT ?1 UNION SELECT x.child_id FROM derivations x "
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
		return inv_db_fail(inv, err, "cannot walk the derivations");
	if (!(params = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(e, "params"))))
		return inv_oom(err);
	if ((rc = inv_prep(inv, "INSERT OR IGNORE INTO derivations (child_id, parent_id, operation, params, "
			        "run_id, created_at) VALUES (?,?,?,?,NULL,?)", &st, err)) != MS_OK)
		goto out;
	sqlite3_bind_int64(st, 1, cid);
	sqlite3_bind_int64(st, 2, pid);
	inv_bind_text(st, 3, op);
	inv_bind_text(st, 4, params);
	inv_bind_text(st, 5, cJSON_GetObjectItemCaseSensitive(e, "created_at")->valuestring);
	rc = sqlite3_step(st) == SQLITE_DONE ? MS_OK : inv_db_fail(inv, err, "cannot record a derivation");
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
		return nomem ? inv_oom(err) : ms_err_set(err, MS_EINVAL, "lineage: not JSON");
	if ((rc = lineage_lists(o, digest, err)) != MS_OK) {
		cJSON_Delete(o);
		return rc;
	}
	if ((rc = inv_tx_begin(inv, err)) != MS_OK) {
		cJSON_Delete(o);
		return rc;
	}
	inv_state_id_of(inv, digest, err, &rc);
	if (rc != MS_OK)
		goto out;
	d = cJSON_CreateObject();
	added = cJSON_AddArrayToObject(d, "states");
	dropped = cJSON_AddArrayToObject(d, "labels_in_use");
	cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(o, "states")) {
		if ((rc = lineage_insert_state(inv, s, &one, dropped, err)) != MS_OK)
			goto out;
		if (one)
			inv_json_push(added, cJSON_CreateString(
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
		rc = inv_log_json(inv, "lineage", digest, d, err);
		d = NULL;
		if (rc != MS_OK)
			goto out;
	}
	rc = inv_tx_commit(inv, err);
	cJSON_Delete(d);
	cJSON_Delete(o);
	return rc;
out:
	inv_tx_rollback(inv);
	cJSON_Delete(d);
	cJSON_Delete(o);
	return rc;
}
