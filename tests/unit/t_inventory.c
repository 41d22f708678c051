/*
 * t_inventory.c: the inventory store: schema and refusals, the identity rule
 * against an independent computation (OpenSSL and cJSON over the raw
 * bytes), idempotent adds, kind and layout inference, lineage, the audit
 * chain under tampering, runs, events, dup, rm and gc.
 */
#include "test.h"

#include <ctype.h>
#include <limits.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <sqlite3.h>

#include "fsutil.h"
#include "inventory.h"

static const char *QWEN = "hf/qwen3moe";
static const char *QWEN_SHARDED = "hf/qwen3moe-sharded";
#define FAKE_V1 "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static char *fx(const char *rel)
{
	return ms_asprintf("%s/%s", T_FIXTURES, rel);
}

static char *tmp(const char *name)
{
	return ms_path_join(T_TMP, name);
}

static struct ms_inv *fresh(const char *name)
{
	char *p = tmp(name);
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};

	unlink(p);
	if (ms_inv_open(p, MS_INV_CREATE, &inv, &err) != MS_OK)
		fprintf(stderr, "open: %s\n", err.msg);
	ms_free(p);
	return inv;
}

static int add1(struct ms_inv *inv, const char *path, const struct ms_inv_add_opts *o,
		char digest[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	return ms_inv_add_paths(inv, &path, 1, o, digest, err);
}

/* Run SQL directly on the database file (tampering, as an operator with the
 * sqlite3 shell would). */
static int raw_sql_q(const char *dbname, const char *sql, int quiet)
{
	char *p = tmp(dbname);
	sqlite3 *db = NULL;
	int rc;

	rc = sqlite3_open(p, &db);
	if (rc == SQLITE_OK)
		rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
	if (rc != SQLITE_OK && !quiet)
		fprintf(stderr, "raw_sql: %s\n", sqlite3_errmsg(db));
	sqlite3_close(db);
	ms_free(p);
	return rc;
}

static int raw_sql(const char *dbname, const char *sql)
{
	return raw_sql_q(dbname, sql, 0);
}

static int64_t raw_int(const char *dbname, const char *sql)
{
	char *p = tmp(dbname);
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	int64_t v = -1;

	if (sqlite3_open(p, &db) == SQLITE_OK &&
	    sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);
	ms_free(p);
	return v;
}

/* ---- the independent oracle of the identity rule ------------------------------------ */

static void sha256_hex(const void *p, size_t n, char out[65])
{
	unsigned char d[32];
	unsigned len = 0;
	static const char *hx = "0123456789abcdef";

	EVP_Digest(p, n, d, &len, EVP_sha256(), NULL);
	for (int i = 0; i < 32; i++) {
		out[2 * i] = hx[d[i] >> 4];
		out[2 * i + 1] = hx[d[i] & 15];
	}
	out[64] = 0;
}

struct oline {
	char *name;
	char *line;
};

static int cmp_oline(const void *a, const void *b)
{
	return strcmp(((const struct oline *)a)->name, ((const struct oline *)b)->name);
}

static int read_all(const char *path, unsigned char **buf, size_t *n)
{
	FILE *f = fopen(path, "rb");
	long sz;

	if (!f)
		return -1;
	fseek(f, 0, SEEK_END);
	sz = ftell(f);
	fseek(f, 0, SEEK_SET);
	*buf = malloc((size_t)sz + 1);
	*n = fread(*buf, 1, (size_t)sz, f);
	fclose(f);
	return *n == (size_t)sz ? 0 : -1;
}

/* State digest of the given safetensors files, computed from the raw bytes
 * with cJSON and OpenSSL only, per ms(5). */
static int oracle_digest(const char *const *files, size_t nfiles, char out[MS_STATE_DIGEST_LEN])
{
	struct oline *lines = NULL;
	size_t n = 0, cap = 0, total = 0;
	char *manifest, *p;

	for (size_t f = 0; f < nfiles; f++) {
		unsigned char *buf;
		size_t sz;
		uint64_t hl = 0;
		cJSON *h, *it;

		if (read_all(files[f], &buf, &sz) || sz < 8)
			return -1;
		for (int i = 7; i >= 0; i--)
			hl = hl << 8 | buf[i];
		h = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hl);
		if (!h)
			return -1;
		cJSON_ArrayForEach(it, h) {
			cJSON *o, *sh, *d;
			char shape[256] = "[", dg[65], *line;
			size_t k = 1;
			double b, e;

			if (!strcmp(it->string, "__metadata__"))
				continue;
			sh = cJSON_GetObjectItem(it, "shape");
			o = cJSON_GetObjectItem(it, "data_offsets");
			cJSON_ArrayForEach(d, sh)
				k += (size_t)snprintf(shape + k, sizeof(shape) - k, "%s%.0f",
						      k > 1 ? "," : "", d->valuedouble);
			snprintf(shape + k, sizeof(shape) - k, "]");
			b = cJSON_GetArrayItem(o, 0)->valuedouble;
			e = cJSON_GetArrayItem(o, 1)->valuedouble;
			sha256_hex(buf + 8 + hl + (size_t)b, (size_t)(e - b), dg);
			line = ms_asprintf("%s\t%s\t%s\t%s\n", it->string,
					   cJSON_GetObjectItem(it, "dtype")->valuestring, shape, dg);
			if (n == cap) {
				cap = cap ? 2 * cap : 64;
				lines = realloc(lines, cap * sizeof(*lines));
			}
			lines[n].name = strdup(it->string);
			lines[n++].line = line;
			total += strlen(line);
		}
		cJSON_Delete(h);
		free(buf);
	}
	qsort(lines, n, sizeof(*lines), cmp_oline);
	manifest = p = malloc(total + 32);
	p += sprintf(p, "msinv-state-v1\n");
	for (size_t i = 0; i < n; i++) {
		p += sprintf(p, "%s", lines[i].line);
		free(lines[i].name);
		ms_free(lines[i].line);
	}
	free(lines);
	memcpy(out, "sha256:", 7);
	sha256_hex(manifest, (size_t)(p - manifest), out + 7);
	free(manifest);
	return 0;
}

/* ---- fixtures written here ------------------------------------------------------------ */

struct wt {
	const char *name;
	enum ms_dtype dt;
	uint32_t ndim;
	uint64_t shape[2];
	size_t nbytes;
};

/* Write tensors filled with bytes derived from seed; meta: key, value, ... */
static int write_st(const char *path, const struct wt *t, size_t n, unsigned seed,
		    const char *const *meta, size_t nmeta)
{
	struct ms_st_writer *w = NULL;
	struct ms_err err = {0};
	unsigned char *bufs[16];
	int rc;

	rc = ms_st_writer_new(path, 1, &w, &err);
	for (size_t i = 0; rc == MS_OK && i + 1 < nmeta; i += 2)
		rc = ms_st_writer_meta(w, meta[i], meta[i + 1], &err);
	for (size_t i = 0; i < n; i++) {
		bufs[i] = malloc(t[i].nbytes ? t[i].nbytes : 1);
		for (size_t b = 0; b < t[i].nbytes; b++)
			bufs[i][b] = (unsigned char)(seed * 131 + i * 17 + b * 7);
		if (rc == MS_OK)
			rc = ms_st_writer_add(w, t[i].name, t[i].dt, t[i].ndim, t[i].shape, bufs[i], &err);
	}
	if (rc == MS_OK)
		rc = ms_st_writer_commit(w, &err);
	if (rc != MS_OK)
		fprintf(stderr, "write_st: %s\n", err.msg);
	ms_st_writer_free(w);
	for (size_t i = 0; i < n; i++)
		free(bufs[i]);
	return rc;
}

#define P "model.layers.0.mlp.experts.3.down_proj"
static const struct wt nvfp4_row[] = {
	{P ".weight", MS_DTYPE_U8, 2, {4, 16}, 64},
	{P ".weight_scale", MS_DTYPE_F8_E4M3, 2, {4, 2}, 8},
	{P ".weight_scale_2", MS_DTYPE_F32, 0, {0, 0}, 4},
};
static const struct wt nvfp4_col[] = {
	{P ".weight_colwise", MS_DTYPE_U8, 2, {32, 2}, 64},
	{P ".weight_colwise_scale", MS_DTYPE_F8_E4M3, 2, {32, 1}, 32},
};
static const struct wt lora[] = {
	{"base_model.model.model.layers.0.mlp.experts.lora_A.weight", MS_DTYPE_BF16, 2, {8, 16}, 256},
	{"base_model.model.model.layers.0.mlp.experts.lora_B.weight", MS_DTYPE_BF16, 2, {16, 8}, 256},
};

/* ---- schema, opening, refusals -------------------------------------------------------------- */

static int test_open_create_and_refusals(void)
{
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};
	char *p = tmp("open.db"), *junk = tmp("junk.db"), *other = tmp("other.db");
	int rc;

	T_ASSERT_EQ_INT(ms_inv_open(p, 0, &inv, &err), MS_ENOTFOUND);
	T_ASSERT(inv == NULL && strstr(err.msg, "msinv init"));
	T_ASSERT_EQ_INT(ms_inv_open(p, MS_INV_CREATE, &inv, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_schema_version(inv), ms_inv_schema_latest());
	T_ASSERT(ms_inv_schema_latest() >= 1);
	ms_inv_close(inv);
	inv = NULL;
	T_ASSERT_EQ_INT(raw_int("open.db", "PRAGMA application_id"), MS_INV_APPLICATION_ID);
	T_ASSERT_EQ_INT(raw_int("open.db", "PRAGMA user_version"), ms_inv_schema_latest());
	T_ASSERT_EQ_INT(raw_int("open.db", "SELECT count(*) FROM sqlite_master WHERE type = 'table' "
				"AND name <> 'sqlite_sequence' AND sql NOT LIKE '%STRICT%'"), 0);
	T_ASSERT_EQ_INT(ms_inv_open(p, 0, &inv, &err), MS_OK);
	ms_inv_close(inv);
	inv = NULL;

	/* a database from a newer build */
	{
		char sql[64];

		snprintf(sql, sizeof(sql), "PRAGMA user_version = %d", ms_inv_schema_latest() + 1);
		T_ASSERT_EQ_INT(raw_sql("open.db", sql), SQLITE_OK);
	}
	rc = ms_inv_open(p, 0, &inv, &err);
	T_ASSERT_EQ_INT(rc, MS_EDB);
	T_ASSERT(inv == NULL && strstr(err.msg, "newer"));

	/* not a database, and someone else's database */
	T_ASSERT_EQ_INT(ms_file_write_atomic(junk, "hello, world: not sqlite at all\n", 32, 1, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_open(junk, 0, &inv, &err), MS_EDB);
	T_ASSERT(strstr(err.msg, "not an inventory"));
	T_ASSERT_EQ_INT(raw_sql("other.db", "CREATE TABLE t (x)"), SQLITE_OK);
	T_ASSERT_EQ_INT(ms_inv_open(other, MS_INV_CREATE, &inv, &err), MS_EDB);
	T_ASSERT(strstr(err.msg, "not an inventory"));
	ms_free(p);
	ms_free(junk);
	ms_free(other);
	return 0;
}

/* ---- identity ---------------------------------------------------------------------------------- */

static int test_identity_matches_oracle_and_sharding(void)
{
	struct ms_inv *inv = fresh("id.db");
	struct ms_err err = {0};
	char d1[MS_STATE_DIGEST_LEN], d2[MS_STATE_DIGEST_LEN], want[MS_STATE_DIGEST_LEN];
	char *one = fx(QWEN), *sh = fx(QWEN_SHARDED);
	char *f1 = ms_asprintf("%s/model.safetensors", one);
	char *s1 = ms_asprintf("%s/model-00001-of-00002.safetensors", sh);
	char *s2 = ms_asprintf("%s/model-00002-of-00002.safetensors", sh);
	const char *shards[2] = { s1, s2 };
	struct ms_inv_state *s = NULL;

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(oracle_digest((const char *const *)&f1, 1, want), 0);
	T_ASSERT_EQ_INT(add1(inv, one, NULL, d1, &err), MS_OK);
	T_ASSERT_STR(d1, want);
	T_ASSERT_EQ_INT(oracle_digest(shards, 2, want), 0);
	T_ASSERT_EQ_INT(add1(inv, sh, NULL, d2, &err), MS_OK);
	T_ASSERT_STR(d2, want);
	/* the same tensors in other files: the same state, a second copy */
	T_ASSERT_STR(d1, d2);
	T_ASSERT_EQ_INT(ms_inv_state_get(inv, d1, &s, &err), MS_OK);
	T_ASSERT_EQ_INT(s->ncopies, 2);
	T_ASSERT_EQ_INT(s->kind, MS_INV_KIND_BASE);
	T_ASSERT_STR(s->layout, "bf16");
	ms_inv_state_free(s);
	/* another model: another state */
	{
		char *mx = fx("hf/mixtral"), d3[MS_STATE_DIGEST_LEN];

		T_ASSERT_EQ_INT(add1(inv, mx, NULL, d3, &err), MS_OK);
		T_ASSERT(strcmp(d3, d1));
		ms_free(mx);
	}
	ms_inv_close(inv);
	ms_free(one);
	ms_free(sh);
	ms_free(f1);
	ms_free(s1);
	ms_free(s2);
	return 0;
}

static int test_any_change_changes_the_digest(void)
{
	struct ms_inv *inv = fresh("change.db");
	struct ms_err err = {0};
	char *a = tmp("chg_a.safetensors"), *b = tmp("chg_b.safetensors");
	char da[MS_STATE_DIGEST_LEN], db[MS_STATE_DIGEST_LEN];
	struct wt t[2] = {
		{"x.weight", MS_DTYPE_BF16, 2, {4, 4}, 32},
		{"y.weight", MS_DTYPE_BF16, 2, {2, 8}, 32},
	};

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(write_st(a, t, 2, 1, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(add1(inv, a, NULL, da, &err), MS_OK);
	/* bytes */
	T_ASSERT_EQ_INT(write_st(b, t, 2, 2, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(add1(inv, b, NULL, db, &err), MS_OK);
	T_ASSERT(strcmp(da, db));
	/* shape: same bytes */
	t[0].shape[0] = 2;
	t[0].shape[1] = 8;
	T_ASSERT_EQ_INT(write_st(b, t, 2, 1, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(add1(inv, b, NULL, db, &err), MS_OK);
	T_ASSERT(strcmp(da, db));
	/* dtype: same bytes and shape */
	t[0].shape[0] = 4;
	t[0].shape[1] = 4;
	t[0].dt = MS_DTYPE_F16;
	T_ASSERT_EQ_INT(write_st(b, t, 2, 1, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(add1(inv, b, NULL, db, &err), MS_OK);
	T_ASSERT(strcmp(da, db));
	/* name */
	t[0].dt = MS_DTYPE_BF16;
	t[0].name = "z.weight";
	T_ASSERT_EQ_INT(write_st(b, t, 2, 1, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(add1(inv, b, NULL, db, &err), MS_OK);
	T_ASSERT(strcmp(da, db));
	/* and back: metadata is not part of the identity */
	{
		const char *meta[2] = { "note", "hello" };

		t[0].name = "x.weight";
		T_ASSERT_EQ_INT(write_st(b, t, 2, 1, meta, 2), MS_OK);
		T_ASSERT_EQ_INT(add1(inv, b, NULL, db, &err), MS_OK);
		T_ASSERT_STR(da, db);
	}
	ms_inv_close(inv);
	ms_free(a);
	ms_free(b);
	return 0;
}

/* ---- idempotence and the unchanged-file shortcut ------------------------------------------------ */

static int test_readd_is_idempotent_and_skips_hashing(void)
{
	struct ms_inv *inv = fresh("idem.db");
	struct ms_err err = {0};
	struct ms_inv_add_opts o;
	struct ms_inv_add_stats st;
	char *one = fx(QWEN), d1[MS_STATE_DIGEST_LEN], d2[MS_STATE_DIGEST_LEN];
	int64_t nlog;

	T_ASSERT(inv);
	ms_inv_add_opts_init(&o);
	o.stats = &st;
	o.label = "qwen-base";
	T_ASSERT_EQ_INT(add1(inv, one, &o, d1, &err), MS_OK);
	T_ASSERT(st.new_state && st.new_copy);
	T_ASSERT_EQ_INT(st.files_hashed, 1);
	T_ASSERT_EQ_INT(ms_inv_log_check(inv, &nlog, NULL, &err), MS_OK);
	/* again: nothing hashed, nothing written */
	T_ASSERT_EQ_INT(add1(inv, one, &o, d2, &err), MS_OK);
	T_ASSERT_STR(d1, d2);
	T_ASSERT(!st.new_state && !st.new_copy);
	T_ASSERT_EQ_INT(st.files_hashed, 0);
	T_ASSERT_EQ_INT(st.bytes_hashed, 0);
	{
		int64_t n2;

		T_ASSERT_EQ_INT(ms_inv_log_check(inv, &n2, NULL, &err), MS_OK);
		T_ASSERT_EQ_INT(n2, nlog);
	}
	/* another tool registering its output names itself in the record */
	{
		char *const argv[] = { "msconvert", "quantize", "in", "-o", "out" };
		char *mx = fx("hf/mixtral"), d3[MS_STATE_DIGEST_LEN];
		struct ms_inv_state *s = NULL;

		ms_inv_add_opts_init(&o);
		o.tool = "msconvert";
		o.argc = 5;
		o.argv = argv;
		T_ASSERT_EQ_INT(add1(inv, mx, &o, d3, &err), MS_OK);
		T_ASSERT_EQ_INT(ms_inv_state_get(inv, d3, &s, &err), MS_OK);
		T_ASSERT_STR(s->tool, "msconvert");
		T_ASSERT_STR(s->argv, "[\"msconvert\",\"quantize\",\"in\",\"-o\",\"out\"]");
		ms_inv_state_free(s);
		ms_free(mx);
		T_ASSERT_EQ_INT(ms_inv_rm(inv, d3, 0, &err), MS_OK);
		ms_inv_add_opts_init(&o);
		o.stats = &st;
		o.label = "qwen-base";
	}
	/* --rehash reads everything and still finds the same state */
	o.rehash = 1;
	T_ASSERT_EQ_INT(add1(inv, one, &o, d2, &err), MS_OK);
	T_ASSERT_EQ_INT(st.files_hashed, 1);
	T_ASSERT_STR(d1, d2);
	ms_inv_close(inv);
	T_ASSERT_EQ_INT(raw_int("idem.db", "SELECT count(*) FROM states"), 1);
	T_ASSERT_EQ_INT(raw_int("idem.db", "SELECT count(*) FROM log WHERE action = 'add' AND tool = 'msconvert' "
				"AND argv LIKE '[\"msconvert\",\"quantize\"%'"), 1);
	ms_free(one);
	return 0;
}

static int test_changed_file_is_rehashed_and_old_record_kept(void)
{
	struct ms_inv *inv = fresh("rewrite.db");
	struct ms_err err = {0};
	struct ms_inv_add_opts o;
	struct ms_inv_add_stats st;
	struct ms_inv_files files;
	char *f = tmp("rw.safetensors"), d1[MS_STATE_DIGEST_LEN], d2[MS_STATE_DIGEST_LEN];
	struct wt t[1] = { {"w.weight", MS_DTYPE_F32, 2, {4, 4}, 64} };
	struct stat sb;
	FILE *fp;

	T_ASSERT(inv);
	ms_inv_add_opts_init(&o);
	o.stats = &st;
	T_ASSERT_EQ_INT(write_st(f, t, 1, 3, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(add1(inv, f, &o, d1, &err), MS_OK);
	/* flip one byte in place and put the mtime back: ctime still moves */
	T_ASSERT_EQ_INT(stat(f, &sb), 0);
	usleep(20000);
	fp = fopen(f, "r+b");
	T_ASSERT(fp);
	fseek(fp, -1, SEEK_END);
	fputc(0x5a, fp);
	fclose(fp);
	{
		struct timespec ts[2] = { sb.st_atim, sb.st_mtim };

		T_ASSERT_EQ_INT(utimensat(AT_FDCWD, f, ts, 0), 0);
	}
	T_ASSERT_EQ_INT(add1(inv, f, &o, d2, &err), MS_OK);
	T_ASSERT_EQ_INT(st.files_hashed, 1);
	T_ASSERT(strcmp(d1, d2));
	/* the first state keeps the digests it was recorded with */
	T_ASSERT_EQ_INT(ms_inv_state_files(inv, d1, 0, 1, &files, &err), MS_OK);
	T_ASSERT_EQ_INT(files.n, 1);
	T_ASSERT_EQ_INT(files.files[0].ntensors, 1);
	{
		char want[MS_STATE_DIGEST_LEN];
		const char *fs = f;

		(void)fs;
		T_ASSERT(files.files[0].tensors[0].nbytes == 64);
		/* recompute the second state independently: it must be d2, not d1 */
		T_ASSERT_EQ_INT(oracle_digest((const char *const *)&f, 1, want), 0);
		T_ASSERT_STR(want, d2);
	}
	ms_inv_files_release(&files);
	ms_inv_close(inv);
	T_ASSERT_EQ_INT(raw_int("rewrite.db", "SELECT count(*) FROM files"), 2);
	ms_free(f);
	return 0;
}

/* ---- references and labels ---------------------------------------------------------------------- */

static int test_resolve_labels_and_prefixes(void)
{
	struct ms_inv *inv = fresh("resolve.db");
	struct ms_err err = {0};
	struct ms_inv_add_opts o;
	char *one = fx(QWEN), d[MS_STATE_DIGEST_LEN], r[MS_STATE_DIGEST_LEN], ref[80];

	T_ASSERT(inv);
	ms_inv_add_opts_init(&o);
	o.label = "qwen/base@v1";
	T_ASSERT_EQ_INT(add1(inv, one, &o, d, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "qwen/base@v1", r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, d, r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	snprintf(ref, sizeof(ref), "%.12s", d + 7);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, ref, r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	snprintf(ref, sizeof(ref), "%.15s", d);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, ref, r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	/* upper case hex is the same prefix */
	for (char *p = ref + 7; *p; p++)
		*p = (char)toupper((unsigned char)*p);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, ref, r, &err), MS_OK);
	snprintf(ref, sizeof(ref), "%.3s", d + 7);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, ref, r, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "nosuchlabel", r, &err), MS_ENOTFOUND);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "sha256:zz", r, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "", r, &err), MS_EINVAL);
	ms_inv_close(inv);

	/* two states sharing a prefix: ambiguous, with both candidates named */
#define FAKE "sha256:abcd00000000000000000000000000000000000000000000000000000000000"
	T_ASSERT_EQ_INT(strlen(FAKE "1"), MS_STATE_DIGEST_LEN - 1);
	T_ASSERT_EQ_INT(raw_sql("resolve.db",
		"INSERT INTO states (digest, kind, layout, ntensors, nbytes, tool, argv, user, host, created_at) VALUES "
		"('" FAKE "1', 'base', 'bf16', 0, 0, 't', '[]', 'u', 'h', 'x'),"
		"('" FAKE "2', 'base', 'bf16', 0, 0, 't', '[]', 'u', 'h', 'x')"),
		SQLITE_OK);
	{
		char *p = tmp("resolve.db");

		T_ASSERT_EQ_INT(ms_inv_open(p, 0, &inv, &err), MS_OK);
		ms_free(p);
	}
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "abcd", r, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "ambiguous") && strstr(err.msg, "sha256:abcd"));
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, FAKE "2", r, &err), MS_OK);
	T_ASSERT_STR(r, FAKE "2");
	ms_inv_close(inv);
	ms_free(one);
	return 0;
}

static int test_labels_refused(void)
{
	struct ms_inv *inv = fresh("labels.db");
	struct ms_err err = {0};
	struct ms_inv_add_opts o;
	char *one = fx(QWEN), *mx = fx("hf/mixtral"), d[MS_STATE_DIGEST_LEN];
	static const char *const bad[] = { "", "has space", "beef", "0123", "sha256:x", "a\nb" };

	T_ASSERT(inv);
	ms_inv_add_opts_init(&o);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		o.label = bad[i];
		T_ASSERT_EQ_INT(add1(inv, one, &o, d, &err), MS_EINVAL);
	}
	o.label = "first";
	T_ASSERT_EQ_INT(add1(inv, one, &o, d, &err), MS_OK);
	/* a label of another state */
	T_ASSERT_EQ_INT(add1(inv, mx, &o, d, &err), MS_EEXIST);
	T_ASSERT(strstr(err.msg, "already names"));
	/* nothing of the refused add was recorded */
	ms_inv_close(inv);
	T_ASSERT_EQ_INT(raw_int("labels.db", "SELECT count(*) FROM states"), 1);
	T_ASSERT_EQ_INT(raw_int("labels.db", "SELECT count(*) FROM files"), 1);
	ms_free(one);
	ms_free(mx);
	return 0;
}

/* A state may have several labels (a second copy may come with its own);
 * a label names one state, is moved only with force, and can be removed;
 * states.label is the oldest; every change is in the audit log. */
static int test_labels_several(void)
{
	struct ms_inv *inv = fresh("labels2.db");
	struct ms_err err = {0};
	struct ms_inv_add_opts o;
	struct ms_inv_state *s = NULL;
	char *one = fx(QWEN), *sh = fx(QWEN_SHARDED), *mx = fx("hf/mixtral");
	char d[MS_STATE_DIGEST_LEN], d2[MS_STATE_DIGEST_LEN], dm[MS_STATE_DIGEST_LEN];
	char r[MS_STATE_DIGEST_LEN];
	int64_t n;

	T_ASSERT(inv);
	ms_inv_add_opts_init(&o);
	o.label = "first";
	T_ASSERT_EQ_INT(add1(inv, one, &o, d, &err), MS_OK);
	/* the same state in other files, under another label: a second copy
	 * and a second name (refused before) */
	o.label = "second";
	T_ASSERT_EQ_INT(add1(inv, sh, &o, d2, &err), MS_OK);
	T_ASSERT_STR(d2, d);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "first", r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "second", r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	T_ASSERT_EQ_INT(ms_inv_state_get(inv, d, &s, &err), MS_OK);
	T_ASSERT_STR(s->label, "first");
	T_ASSERT_STR(s->labels, "first second");
	T_ASSERT_EQ_INT(s->ncopies, 2);
	ms_inv_state_free(s);
	s = NULL;

	/* a label of another state: refused, then moved with force */
	o.label = "mx";
	T_ASSERT_EQ_INT(add1(inv, mx, &o, dm, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_label_add(inv, dm, "first", 0, &err), MS_EEXIST);
	T_ASSERT(strstr(err.msg, "already names"));
	T_ASSERT_EQ_INT(ms_inv_label_add(inv, dm, "has space", 0, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_inv_label_add(inv, dm, "first", 1, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "first", r, &err), MS_OK);
	T_ASSERT_STR(r, dm);
	T_ASSERT_EQ_INT(ms_inv_state_get(inv, d, &s, &err), MS_OK);
	T_ASSERT_STR(s->label, "second");
	T_ASSERT_STR(s->labels, "second");
	ms_inv_state_free(s);
	s = NULL;
	/* again: nothing to do */
	T_ASSERT_EQ_INT(ms_inv_label_add(inv, dm, "first", 0, &err), MS_OK);

	/* a relabel: add and remove in one batch */
	T_ASSERT_EQ_INT(ms_inv_batch_begin(inv, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_label_add(inv, d, "renamed", 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_label_remove(inv, "second", &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_batch_end(inv, 1, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "second", r, &err), MS_ENOTFOUND);
	T_ASSERT_EQ_INT(ms_inv_state_get(inv, d, &s, &err), MS_OK);
	T_ASSERT_STR(s->label, "renamed");
	ms_inv_state_free(s);
	s = NULL;
	T_ASSERT_EQ_INT(ms_inv_label_remove(inv, "renamed", &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_state_get(inv, d, &s, &err), MS_OK);
	T_ASSERT(s->label == NULL && s->labels == NULL);
	ms_inv_state_free(s);
	T_ASSERT_EQ_INT(ms_inv_label_remove(inv, "renamed", &err), MS_ENOTFOUND);
	T_ASSERT_EQ_INT(ms_inv_log_check(inv, &n, NULL, &err), MS_OK);
	ms_inv_close(inv);
	T_ASSERT_EQ_INT(raw_int("labels2.db", "SELECT count(*) FROM log WHERE action = 'unlabel'"), 2);
	T_ASSERT_EQ_INT(raw_int("labels2.db", "SELECT count(*) FROM log WHERE action = 'label' AND "
				"json_extract(detail, '$.from') IS NOT NULL"), 1);
	/* left: "first" (moved) and "mx", both on the mixtral state */
	T_ASSERT_EQ_INT(raw_int("labels2.db", "SELECT count(*) FROM labels"), 2);
	ms_free(one);
	ms_free(sh);
	ms_free(mx);
	return 0;
}

/* A path resolves to the state stored there: a directory to the state
 * whose copy is its files, a file to the state it holds (alone or as part
 * of one copy); a label wins over a path; an unrecorded path is not found. */
static int test_resolve_paths(void)
{
	struct ms_inv *inv = fresh("paths.db");
	struct ms_err err = {0};
	struct ms_inv_add_opts o;
	char *one = fx(QWEN), *sh = fx(QWEN_SHARDED), *mx = fx("hf/mixtral");
	char *file = ms_path_join(one, "model.safetensors");
	char *shard = ms_path_join(sh, "model-00001-of-00002.safetensors");
	char *dots = ms_asprintf("%s/../qwen3moe/", one);
	char d[MS_STATE_DIGEST_LEN], r[MS_STATE_DIGEST_LEN];

	T_ASSERT(inv && file && shard && dots);
	ms_inv_add_opts_init(&o);
	T_ASSERT_EQ_INT(add1(inv, one, &o, d, &err), MS_OK);
	T_ASSERT_EQ_INT(add1(inv, sh, &o, r, &err), MS_OK);
	memset(r, 0, sizeof(r));
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, one, r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, dots, r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, file, r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, sh, r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	/* one file of a two-file copy */
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, shard, r, &err), MS_OK);
	T_ASSERT_STR(r, d);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, mx, r, &err), MS_ENOTFOUND);
	T_ASSERT(strstr(err.msg, "no state"));
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, T_TMP, r, &err), MS_ENOTFOUND);
	ms_inv_close(inv);
	ms_free(one);
	ms_free(sh);
	ms_free(mx);
	ms_free(file);
	ms_free(shard);
	ms_free(dots);
	return 0;
}

/* An inventory of schema version 1 (labels in states.label, no working
 * directories) is migrated: its labels resolve, its old log entries (no
 * cwd) still check, the new ones carry the cwd. */
static int test_migrate_from_v1(void)
{
	char *schema = ms_asprintf("%s/../../schema/0001-initial.sql", T_FIXTURES);
	char *sql = NULL, *p = tmp("v1.db"), hash[65], r[MS_STATE_DIGEST_LEN], ins[1024];
	struct ms_inv_log_entry e = {0};
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};
	size_t len;
	int64_t n;

	T_ASSERT_EQ_INT(ms_file_read(schema, 1 << 20, &sql, &len, &err), MS_OK);
	unlink(p);
	T_ASSERT_EQ_INT(raw_sql("v1.db", sql), SQLITE_OK);
	e.seq = 1;
	e.at = "2025-01-31T12:00:00.000000Z";
	e.user = "u";
	e.host = "h";
	e.tool = "msinv";
	e.argv = "[\"msinv\",\"init\"]";
	e.action = "init";
	e.subject = "v1.db";
	e.detail = "{}";
	e.prev_hash = "0000000000000000000000000000000000000000000000000000000000000000";
	T_ASSERT_EQ_INT(ms_inv_log_hash(&e, hash), MS_OK);
	snprintf(ins, sizeof(ins),
		 "INSERT INTO log VALUES (1, '%s', 'u', 'h', 'msinv', '%s', 'init', 'v1.db', '{}', '%s', '%s');"
		 "UPDATE log_head SET seq = 1, hash = '%s';"
		 "INSERT INTO states (digest, kind, layout, label, ntensors, nbytes, tool, argv, user, host, created_at) "
		 "VALUES ('" FAKE_V1 "', 'base', 'bf16', 'old-label', 0, 0, 't', '[]', 'u', 'h', 'x');"
		 "PRAGMA application_id = %d; PRAGMA user_version = 1;",
		 e.at, e.argv, e.prev_hash, hash, hash, MS_INV_APPLICATION_ID);
	T_ASSERT_EQ_INT(raw_sql("v1.db", ins), SQLITE_OK);

	T_ASSERT_EQ_INT(ms_inv_open(p, 0, &inv, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_schema_version(inv), ms_inv_schema_latest());
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "old-label", r, &err), MS_OK);
	T_ASSERT_STR(r, FAKE_V1);
	T_ASSERT_EQ_INT(ms_inv_log_check(inv, &n, NULL, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 2);  /* init, migrate */
	ms_inv_close(inv);
	T_ASSERT_EQ_INT(raw_int("v1.db", "SELECT count(*) FROM log WHERE seq = 1 AND cwd IS NULL"), 1);
	T_ASSERT_EQ_INT(raw_int("v1.db", "SELECT count(*) FROM log WHERE seq = 2 AND action = 'migrate' "
				"AND cwd IS NOT NULL"), 1);
	ms_free(sql);
	ms_free(schema);
	ms_free(p);
	return 0;
}

/* ---- kinds and layouts ---------------------------------------------------------------------------- */

static int add_kind(struct ms_inv *inv, const char *path, enum ms_inv_kind kind,
		    struct ms_inv_add_stats *st, struct ms_err *err)
{
	struct ms_inv_add_opts o;
	char d[MS_STATE_DIGEST_LEN];

	ms_inv_add_opts_init(&o);
	o.kind = kind;
	o.stats = st;
	return add1(inv, path, &o, d, err);
}

static int test_kind_and_layout_inference(void)
{
	struct ms_inv *inv = fresh("kinds.db");
	struct ms_err err = {0};
	struct ms_inv_add_stats st;
	char *row = tmp("k_row.safetensors"), *col = tmp("k_col.safetensors");
	char *both = tmp("k_both.safetensors"), *cmeta = tmp("k_cmeta.safetensors");
	char *ad = fx("peft/qwen3moe-E8-r4/adapter"), *base = fx(QWEN);
	struct wt all[5];
	const char *meta[2] = { "msinv.nvfp4", "{\"layout\":\"columnwise\",\"block\":\"2d\"}" };

	T_ASSERT(inv);
	memcpy(all, nvfp4_row, sizeof(nvfp4_row));
	memcpy(all + 3, nvfp4_col, sizeof(nvfp4_col));
	T_ASSERT_EQ_INT(write_st(row, nvfp4_row, 3, 1, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(write_st(col, nvfp4_col, 2, 1, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(write_st(both, all, 5, 1, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(write_st(cmeta, nvfp4_row, 3, 9, meta, 2), MS_OK);

	T_ASSERT_EQ_INT(add_kind(inv, base, MS_INV_KIND_ANY, &st, &err), MS_OK);
	T_ASSERT_EQ_INT(st.kind, MS_INV_KIND_BASE);
	T_ASSERT_STR(st.layout, "bf16");
	T_ASSERT_EQ_INT(add_kind(inv, ad, MS_INV_KIND_ANY, &st, &err), MS_OK);
	T_ASSERT_EQ_INT(st.kind, MS_INV_KIND_ADAPTER);
	T_ASSERT_EQ_INT(add_kind(inv, row, MS_INV_KIND_ANY, &st, &err), MS_OK);
	T_ASSERT_EQ_INT(st.kind, MS_INV_KIND_QUANTIZED);
	T_ASSERT_STR(st.layout, "nvfp4-rowwise");
	T_ASSERT_EQ_INT(add_kind(inv, col, MS_INV_KIND_ANY, &st, &err), MS_OK);
	T_ASSERT_STR(st.layout, "nvfp4-columnwise");
	T_ASSERT_EQ_INT(add_kind(inv, both, MS_INV_KIND_ANY, &st, &err), MS_OK);
	T_ASSERT_STR(st.layout, "nvfp4-both");
	T_ASSERT_EQ_INT(add_kind(inv, cmeta, MS_INV_KIND_ANY, &st, &err), MS_OK);
	T_ASSERT_STR(st.layout, "nvfp4-columnwise");
	/* msconvert's metadata object, with its "layouts" list */
	{
		const char *m2[2] = { "msinv.nvfp4",
			"{\"version\":1,\"recipe\":\"te\",\"block\":\"2d\",\"format\":\"modelopt\","
			"\"layouts\":[\"columnwise\"],\"tensors\":{}}" };
		char *cm2 = tmp("k_cmeta2.safetensors");

		T_ASSERT_EQ_INT(write_st(cm2, nvfp4_row, 3, 10, m2, 2), MS_OK);
		T_ASSERT_EQ_INT(add_kind(inv, cm2, MS_INV_KIND_ANY, &st, &err), MS_OK);
		T_ASSERT_STR(st.layout, "nvfp4-columnwise");
		ms_free(cm2);
	}

	/* contradictions name what the files say */
	T_ASSERT_EQ_INT(add_kind(inv, row, MS_INV_KIND_BASE, &st, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "NVFP4"));
	T_ASSERT_EQ_INT(add_kind(inv, ad, MS_INV_KIND_QUANTIZED, &st, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "adapter_config.json"));
	/* what the files do not contradict is allowed: a served policy */
	{
		char *mx = fx("hf/mixtral");

		T_ASSERT_EQ_INT(add_kind(inv, mx, MS_INV_KIND_POLICY, &st, &err), MS_OK);
		T_ASSERT_EQ_INT(st.kind, MS_INV_KIND_POLICY);
		ms_free(mx);
	}
	/* a recorded state keeps its kind */
	T_ASSERT_EQ_INT(add_kind(inv, base, MS_INV_KIND_POLICY, &st, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "recorded as base"));
	ms_inv_close(inv);
	ms_free(row);
	ms_free(col);
	ms_free(both);
	ms_free(cmeta);
	ms_free(ad);
	ms_free(base);
	return 0;
}

static int test_ep_shards(void)
{
	struct ms_inv *inv = fresh("ep.db");
	struct ms_err err = {0};
	struct ms_inv_add_opts o;
	struct ms_inv_add_stats st;
	struct ms_inv_state *s = NULL;
	char *a = tmp("ep_a.safetensors"), *b = tmp("ep_b.safetensors"), *c = tmp("ep_c.safetensors");
	char d[MS_STATE_DIGEST_LEN];
	const char *meta[6] = { "msinv.ep.rank", "1", "msinv.ep.size", "4", "msinv.ep.experts", "[2, 3]" };
	const char *bad[4] = { "msinv.ep.rank", "4", "msinv.ep.size", "4" };

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(write_st(a, lora, 2, 1, meta, 6), MS_OK);
	T_ASSERT_EQ_INT(write_st(b, lora, 2, 2, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(write_st(c, lora, 2, 3, bad, 4), MS_OK);
	ms_inv_add_opts_init(&o);
	o.stats = &st;
	T_ASSERT_EQ_INT(add1(inv, a, &o, d, &err), MS_OK);
	T_ASSERT_EQ_INT(st.kind, MS_INV_KIND_ADAPTER_SHARD);
	T_ASSERT_EQ_INT(ms_inv_state_get(inv, d, &s, &err), MS_OK);
	T_ASSERT_EQ_INT(s->ep_rank, 1);
	T_ASSERT_EQ_INT(s->ep_size, 4);
	T_ASSERT_STR(s->experts, "[2,3]");
	ms_inv_state_free(s);
	/* flags that contradict the metadata */
	o.ep_size = 4;
	o.ep_rank = 2;
	T_ASSERT_EQ_INT(add1(inv, a, &o, d, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "shard 1 of 4"));
	/* flags make a plain adapter a shard; a rank outside the size is bad */
	T_ASSERT_EQ_INT(add1(inv, b, &o, d, &err), MS_OK);
	T_ASSERT_EQ_INT(st.kind, MS_INV_KIND_ADAPTER_SHARD);
	o.ep_rank = 4;
	T_ASSERT_EQ_INT(add1(inv, b, &o, d, &err), MS_EINVAL);
	ms_inv_add_opts_init(&o);
	T_ASSERT_EQ_INT(add1(inv, c, &o, d, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "msinv.ep.rank"));
	/* a shard needs its placement */
	o.kind = MS_INV_KIND_ADAPTER_SHARD;
	{
		char *ad = fx("peft/qwen3moe-E8-r4/adapter");

		T_ASSERT_EQ_INT(add1(inv, ad, &o, d, &err), MS_EINVAL);
		T_ASSERT(strstr(err.msg, "--ep-size"));
		ms_free(ad);
	}
	/* expert lists: comma-separated or JSON, canonical JSON; malformed refused */
	{
		static const char *const good[][2] = { {"0,1,7", "[0,1,7]"}, {"[5]", "[5]"}, {"[]", "[]"} };
		static const char *const badl[] = { "1,,2", "1,", ",1", "x", "[1.5]", "[-1]", "{}", "[\"1\"]" };
		char *e = tmp("ep_e.safetensors");
		const char *m[6] = { "msinv.ep.rank", "0", "msinv.ep.size", "2", "msinv.ep.experts", NULL };
		enum ms_inv_kind kind;
		char layout[32], *experts = NULL;
		int32_t es, er;
		struct ms_ckpt *ck = NULL;

		for (size_t i = 0; i < 3; i++) {
			m[5] = good[i][0];
			T_ASSERT_EQ_INT(write_st(e, lora, 2, 20, m, 6), MS_OK);
			T_ASSERT_EQ_INT(ms_ckpt_open(e, &ck, &err), MS_OK);
			T_ASSERT_EQ_INT(ms_inv_classify(ck, &kind, layout, sizeof(layout), &es, &er, &experts,
							&err), MS_OK);
			T_ASSERT_EQ_INT(kind, MS_INV_KIND_ADAPTER_SHARD);
			T_ASSERT_STR(experts, good[i][1]);
			ms_free(experts);
			ms_ckpt_close(ck);
		}
		for (size_t i = 0; i < sizeof(badl) / sizeof(badl[0]); i++) {
			m[5] = badl[i];
			T_ASSERT_EQ_INT(write_st(e, lora, 2, 20, m, 6), MS_OK);
			T_ASSERT_EQ_INT(ms_ckpt_open(e, &ck, &err), MS_OK);
			T_ASSERT_MSG(ms_inv_classify(ck, &kind, layout, sizeof(layout), &es, &er, &experts,
						     &err) == MS_EINVAL, "experts '%s'", badl[i]);
			ms_ckpt_close(ck);
		}
		ms_free(e);
	}
	/* shard files of one state must agree */
	{
		const char *two[2] = { a, b };

		ms_inv_add_opts_init(&o);
		T_ASSERT_EQ_INT(ms_inv_add_paths(inv, two, 2, &o, d, &err), MS_EINVAL);
	}
	ms_inv_close(inv);
	ms_free(a);
	ms_free(b);
	ms_free(c);
	return 0;
}

/* ---- lineage -------------------------------------------------------------------------------------------- */

static int test_lineage_edges_and_cycles(void)
{
	struct ms_inv *inv = fresh("lineage.db");
	struct ms_err err = {0};
	struct ms_inv_add_opts o;
	struct ms_inv_edge *e = NULL;
	size_t n = 0;
	char *base = fx(QWEN), *row = tmp("l_row.safetensors"), *both = tmp("l_both.safetensors");
	char db[MS_STATE_DIGEST_LEN], dr[MS_STATE_DIGEST_LEN], dbo[MS_STATE_DIGEST_LEN];
	const char *parent[1];
	struct wt all[5];

	T_ASSERT(inv);
	memcpy(all, nvfp4_row, sizeof(nvfp4_row));
	memcpy(all + 3, nvfp4_col, sizeof(nvfp4_col));
	T_ASSERT_EQ_INT(write_st(row, nvfp4_row, 3, 4, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(write_st(both, all, 5, 4, NULL, 0), MS_OK);
	ms_inv_add_opts_init(&o);
	o.label = "base";
	T_ASSERT_EQ_INT(add1(inv, base, &o, db, &err), MS_OK);
	ms_inv_add_opts_init(&o);
	parent[0] = "base";
	o.parents = parent;
	o.nparents = 1;
	o.operation = "quantize";
	o.params_json = "{ \"recipe\": \"modelopt\",  \"block\": \"1d\" }";
	T_ASSERT_EQ_INT(add1(inv, row, &o, dr, &err), MS_OK);
	parent[0] = dr;
	o.operation = "transpose";
	o.params_json = NULL;
	T_ASSERT_EQ_INT(add1(inv, both, &o, dbo, &err), MS_OK);

	T_ASSERT_EQ_INT(ms_inv_edges(inv, dr, MS_INV_EDGES_PARENTS, &e, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 1);
	T_ASSERT_STR(e[0].parent, db);
	T_ASSERT_STR(e[0].operation, "quantize");
	T_ASSERT_STR(e[0].params, "{\"recipe\":\"modelopt\",\"block\":\"1d\"}");
	T_ASSERT_STR(e[0].parent_label, "base");
	ms_inv_edges_free(e, n);
	T_ASSERT_EQ_INT(ms_inv_edges(inv, dbo, MS_INV_EDGES_ANCESTORS, &e, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 2);
	ms_inv_edges_free(e, n);
	T_ASSERT_EQ_INT(ms_inv_edges(inv, db, MS_INV_EDGES_DESCENDANTS, &e, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 2);
	ms_inv_edges_free(e, n);
	T_ASSERT_EQ_INT(ms_inv_edges(inv, db, MS_INV_EDGES_ANCESTORS, &e, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 0);
	ms_inv_edges_free(e, n);

	/* the same edge again is idempotent; other params for it are refused */
	T_ASSERT_EQ_INT(add1(inv, both, &o, dbo, &err), MS_OK);
	o.params_json = "{\"x\":1}";
	T_ASSERT_EQ_INT(add1(inv, both, &o, dbo, &err), MS_EEXIST);
	/* a cycle, itself, an unknown operation, params that are not an object */
	parent[0] = dbo;
	o.params_json = NULL;
	T_ASSERT_EQ_INT(add1(inv, base, &o, db, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "cycle"));
	T_ASSERT_EQ_INT(add1(inv, both, &o, dbo, &err), MS_EINVAL);
	o.operation = "frobnicate";
	T_ASSERT_EQ_INT(add1(inv, row, &o, dr, &err), MS_EINVAL);
	o.operation = "train";
	o.params_json = "[1,2]";
	T_ASSERT_EQ_INT(add1(inv, row, &o, dr, &err), MS_EINVAL);
	parent[0] = "nosuchstate";
	o.params_json = NULL;
	T_ASSERT_EQ_INT(add1(inv, row, &o, dr, &err), MS_ENOTFOUND);

	/* rm refuses while states derive from it; --force unlinks them */
	T_ASSERT_EQ_INT(ms_inv_rm(inv, db, 0, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "--force"));
	T_ASSERT_EQ_INT(ms_inv_rm(inv, dbo, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_rm(inv, db, 1, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_edges(inv, dr, MS_INV_EDGES_PARENTS, &e, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 0);
	ms_inv_edges_free(e, n);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "base", dbo, &err), MS_ENOTFOUND);
	T_ASSERT_EQ_INT(ms_inv_log_check(inv, NULL, NULL, &err), MS_OK);
	ms_inv_close(inv);
	ms_free(base);
	ms_free(row);
	ms_free(both);
	return 0;
}

/* ---- the audit chain --------------------------------------------------------------------------------- */

static int build_log(const char *dbname, char digest[MS_STATE_DIGEST_LEN])
{
	struct ms_inv *inv = fresh(dbname);
	struct ms_err err = {0};
	char *one = fx(QWEN), *mx = fx("hf/mixtral"), d2[MS_STATE_DIGEST_LEN];
	int rc;

	if (!inv)
		return -1;
	rc = add1(inv, one, NULL, digest, &err);
	if (rc == MS_OK)
		rc = add1(inv, mx, NULL, d2, &err);
	if (rc == MS_OK)
		rc = ms_inv_record_verification(inv, digest, MS_INV_RESULT_OK, 100, 0.5, NULL, &err);
	if (rc == MS_OK)
		rc = ms_inv_event_add(inv, 0, "note", "{\"a\":1}", NULL, &err);
	ms_inv_close(inv);
	ms_free(one);
	ms_free(mx);
	return rc;
}

static int check_log(const char *dbname, int64_t *n, struct ms_err *err)
{
	char *p = tmp(dbname);
	struct ms_inv *inv = NULL;
	int rc = ms_inv_open(p, 0, &inv, err);

	ms_free(p);
	if (rc != MS_OK)
		return rc;
	rc = ms_inv_log_check(inv, n, NULL, err);
	ms_inv_close(inv);
	return rc;
}

static int test_log_chain_detects_tampering(void)
{
	struct ms_err err = {0};
	char d[MS_STATE_DIGEST_LEN];
	int64_t n = 0;

	T_ASSERT_EQ_INT(build_log("chain.db", d), MS_OK);
	T_ASSERT_EQ_INT(check_log("chain.db", &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 5); /* init, add, add, verify, event */

	/* the library refuses to touch it */
	T_ASSERT(raw_sql_q("chain.db", "UPDATE log SET user = 'x' WHERE seq = 2", 1) != SQLITE_OK);
	T_ASSERT(raw_sql_q("chain.db", "DELETE FROM log WHERE seq = 2", 1) != SQLITE_OK);

	/* an edited entry */
	T_ASSERT_EQ_INT(raw_sql("chain.db", "DROP TRIGGER log_no_update; DROP TRIGGER log_no_delete;"
				"UPDATE log SET user = 'mallory' WHERE seq = 3"), SQLITE_OK);
	T_ASSERT_EQ_INT(check_log("chain.db", &n, &err), MS_ECHECK);
	T_ASSERT(strstr(err.msg, "entry 3 was edited"));

	/* a removed entry */
	T_ASSERT_EQ_INT(build_log("chain2.db", d), MS_OK);
	T_ASSERT_EQ_INT(raw_sql("chain2.db", "DROP TRIGGER log_no_delete; DELETE FROM log WHERE seq = 2"),
			SQLITE_OK);
	T_ASSERT_EQ_INT(check_log("chain2.db", &n, &err), MS_ECHECK);
	T_ASSERT(strstr(err.msg, "entry 2 is missing"));

	/* removed and renumbered: the link breaks */
	T_ASSERT_EQ_INT(raw_sql("chain2.db", "DROP TRIGGER log_no_update; "
				"UPDATE log SET seq = seq - 1 WHERE seq > 2"), SQLITE_OK);
	T_ASSERT_EQ_INT(check_log("chain2.db", &n, &err), MS_ECHECK);
	T_ASSERT(strstr(err.msg, "entry 2 does not follow entry 1"));

	/* reordered: two entries swap places */
	T_ASSERT_EQ_INT(build_log("chain3.db", d), MS_OK);
	T_ASSERT_EQ_INT(raw_sql("chain3.db", "DROP TRIGGER log_no_update; "
				"UPDATE log SET seq = 100 WHERE seq = 3; UPDATE log SET seq = 3 WHERE seq = 4; "
				"UPDATE log SET seq = 4 WHERE seq = 100"), SQLITE_OK);
	T_ASSERT_EQ_INT(check_log("chain3.db", &n, &err), MS_ECHECK);
	T_ASSERT(strstr(err.msg, "entry 3 does not follow entry 2"));

	/* the newest entry removed */
	T_ASSERT_EQ_INT(build_log("chain4.db", d), MS_OK);
	T_ASSERT_EQ_INT(raw_sql("chain4.db", "DROP TRIGGER log_no_delete; DELETE FROM log WHERE seq = 5"),
			SQLITE_OK);
	T_ASSERT_EQ_INT(check_log("chain4.db", &n, &err), MS_ECHECK);
	T_ASSERT(strstr(err.msg, "newest entries were removed"));
	return 0;
}

/* The entry hash recomputed from ms(5)'s canonical encoding, with OpenSSL. */
static int oracle_entry(const struct ms_inv_log_entry *e, void *ctx)
{
	int *bad = ctx;
	char seq[32], hex[65], cwd[PATH_MAX];
	const char *f[11];
	size_t total = 16;
	char *buf, *p;
	int nf = e->cwd ? 11 : 10;

	/* every entry made by this build says where it ran */
	if (!e->cwd || !getcwd(cwd, sizeof(cwd)) || strcmp(e->cwd, cwd))
		(*bad)++;
	snprintf(seq, sizeof(seq), "%lld", (long long)e->seq);
	f[0] = e->prev_hash; f[1] = seq; f[2] = e->at; f[3] = e->user; f[4] = e->host;
	f[5] = e->tool; f[6] = e->argv; f[7] = e->action; f[8] = e->subject; f[9] = e->detail;
	f[10] = e->cwd;
	for (int i = 0; i < nf; i++)
		total += strlen(f[i]) + 24;
	p = buf = malloc(total);
	p += sprintf(p, "msinv-log-v1\n");
	for (int i = 0; i < nf; i++)
		p += sprintf(p, "%zu:%s\n", strlen(f[i]), f[i]);
	sha256_hex(buf, (size_t)(p - buf), hex);
	free(buf);
	if (strcmp(hex, e->hash))
		(*bad)++;
	return 0;
}

static int test_log_hash_is_the_documented_encoding(void)
{
	struct ms_err err = {0};
	struct ms_inv *inv = NULL;
	char d[MS_STATE_DIGEST_LEN], *p = tmp("enc.db");
	int bad = 0;

	T_ASSERT_EQ_INT(build_log("enc.db", d), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_open(p, 0, &inv, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_log_each(inv, oracle_entry, &bad, &err), MS_OK);
	T_ASSERT_EQ_INT(bad, 0);
	ms_inv_close(inv);
	T_ASSERT_EQ_INT(raw_int("enc.db", "SELECT count(*) FROM log WHERE seq = 1 AND prev_hash = "
				"'0000000000000000000000000000000000000000000000000000000000000000'"), 1);
	ms_free(p);
	return 0;
}

/* ---- verifications, runs, events ------------------------------------------------------------------------ */

static int test_runs_events_verifications(void)
{
	struct ms_inv *inv = fresh("runs.db");
	struct ms_err err = {0};
	char *one = fx(QWEN), *ad = fx("peft/qwen3moe-E8-r4/adapter");
	char db[MS_STATE_DIGEST_LEN], da[MS_STATE_DIGEST_LEN];
	struct ms_inv_run_input in[1];
	struct ms_inv_add_opts o;
	struct ms_inv_run *r = NULL;
	struct ms_inv_verification *v = NULL;
	size_t n = 0;
	int64_t run = 0, ev = 0;
	const char *parent[1];

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(add1(inv, one, NULL, db, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_record_verification(inv, db, MS_INV_RESULT_MISMATCH, 10, 0.25,
						   "tensor 'x': digest mismatch", &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_record_verification(inv, db, MS_INV_RESULT_OK, 321592, 0.5, NULL, &err),
			MS_OK);
	T_ASSERT_EQ_INT(ms_inv_verifications(inv, db, &v, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 2);
	T_ASSERT_EQ_INT(v[0].result, MS_INV_RESULT_OK); /* newest first */
	T_ASSERT_EQ_INT(v[1].result, MS_INV_RESULT_MISMATCH);
	T_ASSERT_STR(v[1].detail, "tensor 'x': digest mismatch");
	ms_inv_verifications_free(v, n);
	T_ASSERT_EQ_INT(ms_inv_record_verification(inv, "sha256:00", MS_INV_RESULT_OK, 1, 1, NULL, &err),
			MS_ENOTFOUND);

	in[0].digest = db;
	in[0].role = "base";
	T_ASSERT_EQ_INT(ms_inv_run_begin(inv, "sha256:plan", in, 1, &run, &err), MS_OK);
	T_ASSERT(run > 0);
	T_ASSERT_EQ_INT(ms_inv_event_add(inv, run, "reward_collapse", "{\"zero_var_groups\":0.75}", &ev,
					 &err), MS_OK);
	T_ASSERT(ev > 0);
	T_ASSERT_EQ_INT(ms_inv_event_add(inv, run, "Bad Kind", "{}", NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_inv_event_add(inv, run, "x", "not json", NULL, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_inv_event_add(inv, run + 100, "x", "{}", NULL, &err), MS_ENOTFOUND);
	/* the run produces an adapter derived from the base */
	ms_inv_add_opts_init(&o);
	parent[0] = db;
	o.parents = parent;
	o.nparents = 1;
	o.operation = "train";
	o.params_json = "{\"step\":100}";
	o.run_id = run;
	T_ASSERT_EQ_INT(add1(inv, ad, &o, da, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_run_end(inv, run, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_run_end(inv, run, 0, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_inv_state_runs(inv, db, 1, &r, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 1);
	T_ASSERT_EQ_INT(r[0].id, run);
	T_ASSERT_STR(r[0].status, "ok");
	T_ASSERT_STR(r[0].role, "base");
	T_ASSERT(r[0].has_exit_code && r[0].exit_code == 0);
	ms_inv_runs_free(r, n);
	T_ASSERT_EQ_INT(ms_inv_state_runs(inv, da, 0, &r, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 1);
	ms_inv_runs_free(r, n);
	/* a run input must be recorded */
	in[0].digest = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
	T_ASSERT_EQ_INT(ms_inv_run_begin(inv, "sha256:plan", in, 1, &run, &err), MS_ENOTFOUND);
	T_ASSERT_EQ_INT(ms_inv_log_check(inv, NULL, NULL, &err), MS_OK);
	ms_inv_close(inv);
	T_ASSERT_EQ_INT(raw_int("runs.db", "SELECT count(*) FROM runs"), 1);
	T_ASSERT_EQ_INT(raw_int("runs.db", "SELECT count(*) FROM derivations WHERE run_id IS NOT NULL"), 1);
	ms_free(one);
	ms_free(ad);
	return 0;
}

/* ---- dup, gc ------------------------------------------------------------------------------------------ */

static int copy_file(const char *from, const char *to)
{
	unsigned char *buf;
	size_t n;
	struct ms_err err = {0};
	int rc;

	if (read_all(from, &buf, &n))
		return -1;
	rc = ms_file_write_atomic(to, buf, n, 1, &err);
	free(buf);
	return rc;
}

static int test_dup_counts_physical_copies(void)
{
	struct ms_inv *inv = fresh("dup.db");
	struct ms_err err = {0};
	struct ms_inv_dup_report r0, r1;
	char *src = tmp("dup_a.safetensors"), *cp = tmp("dup_b.safetensors");
	char d[MS_STATE_DIGEST_LEN], d2[MS_STATE_DIGEST_LEN];
	struct wt t[2] = {
		{"a.weight", MS_DTYPE_F32, 2, {4, 4}, 64},
		{"b.weight", MS_DTYPE_F32, 2, {2, 4}, 32},
	};

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(write_st(src, t, 2, 5, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(add1(inv, src, NULL, d, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_dup(inv, &r0, &err), MS_OK);
	T_ASSERT_EQ_INT(r0.stored_bytes, 96);
	T_ASSERT_EQ_INT(r0.redundant_bytes, 0);
	T_ASSERT_EQ_INT(r0.n, 0);
	ms_inv_dup_release(&r0);
	/* the same state through the same file twice is not a duplicate */
	T_ASSERT_EQ_INT(add1(inv, src, NULL, d2, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_dup(inv, &r0, &err), MS_OK);
	T_ASSERT_EQ_INT(r0.redundant_bytes, 0);
	ms_inv_dup_release(&r0);
	/* a byte-for-byte copy elsewhere is */
	T_ASSERT_EQ_INT(copy_file(src, cp), 0);
	T_ASSERT_EQ_INT(add1(inv, cp, NULL, d2, &err), MS_OK);
	T_ASSERT_STR(d, d2);
	T_ASSERT_EQ_INT(ms_inv_dup(inv, &r1, &err), MS_OK);
	T_ASSERT_EQ_INT(r1.stored_bytes, 192);
	T_ASSERT_EQ_INT(r1.unique_bytes, 96);
	T_ASSERT_EQ_INT(r1.redundant_bytes, 96);
	T_ASSERT_EQ_INT(r1.n, 2);
	T_ASSERT_EQ_INT(r1.dups[0].nplaces, 2);
	T_ASSERT_EQ_INT(r1.dups[0].nbytes, 64); /* largest waste first */
	T_ASSERT_EQ_INT(r1.npairs, 1);
	T_ASSERT_STR(r1.pairs[0].a, d);
	T_ASSERT_STR(r1.pairs[0].b, d);
	T_ASSERT_EQ_INT(r1.pairs[0].nbytes, 96);
	ms_inv_dup_release(&r1);
	ms_inv_close(inv);
	ms_free(src);
	ms_free(cp);
	return 0;
}

static size_t count_states(struct ms_inv *inv)
{
	struct ms_inv_state *s = NULL;
	size_t n = 0;
	struct ms_err err = {0};

	if (ms_inv_states_list(inv, MS_INV_KIND_ANY, &s, &n, &err) != MS_OK)
		return (size_t)-1;
	ms_inv_states_free(s, n);
	return n;
}

/* A batch is one transaction: another connection sees none of it before the
 * commit and all of it after; an abandoned batch records nothing. */
static int test_batch_is_all_or_nothing(void)
{
	struct ms_inv *inv = fresh("batch.db"), *other = NULL;
	struct ms_err err = {0};
	struct ms_inv_add_opts o;
	char *base = fx(QWEN), *row = tmp("b_row.safetensors"), *dbp = tmp("batch.db");
	char db[MS_STATE_DIGEST_LEN], dr[MS_STATE_DIGEST_LEN];
	const char *parent[1];
	int64_t logn = 0;

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(ms_inv_open(dbp, 0, &other, &err), MS_OK);
	T_ASSERT_EQ_INT(write_st(row, nvfp4_row, 3, 4, NULL, 0), MS_OK);

	/* abandoned after a failure: nothing recorded, not even the first add */
	T_ASSERT_EQ_INT(ms_inv_batch_begin(inv, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_batch_begin(inv, &err), MS_EINVAL);
	ms_inv_add_opts_init(&o);
	T_ASSERT_EQ_INT(add1(inv, base, &o, db, &err), MS_OK);
	T_ASSERT_EQ_INT(count_states(inv), 1);  /* the batch reads its own writes */
	T_ASSERT_EQ_INT(count_states(other), 0);
	parent[0] = "no-such-state";
	o.parents = parent;
	o.nparents = 1;
	o.operation = "quantize";
	T_ASSERT(add1(inv, row, &o, dr, &err) != MS_OK);
	T_ASSERT_EQ_INT(ms_inv_batch_end(inv, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(count_states(inv), 0);
	T_ASSERT_EQ_INT(count_states(other), 0);

	/* committed: both states, the edge and their log entries at once */
	T_ASSERT_EQ_INT(ms_inv_batch_begin(inv, &err), MS_OK);
	ms_inv_add_opts_init(&o);
	T_ASSERT_EQ_INT(add1(inv, base, &o, db, &err), MS_OK);
	parent[0] = db;
	o.parents = parent;
	o.nparents = 1;
	o.operation = "quantize";
	T_ASSERT_EQ_INT(add1(inv, row, &o, dr, &err), MS_OK);
	T_ASSERT_EQ_INT(count_states(other), 0);
	T_ASSERT_EQ_INT(ms_inv_batch_end(inv, 1, &err), MS_OK);
	T_ASSERT_EQ_INT(count_states(other), 2);
	T_ASSERT_EQ_INT(ms_inv_log_check(other, &logn, NULL, &err), MS_OK);
	T_ASSERT(logn >= 3);  /* init and the two adds */
	T_ASSERT_EQ_INT(ms_inv_batch_end(inv, 1, &err), MS_EINVAL);

	/* closing with a batch open rolls it back */
	T_ASSERT_EQ_INT(ms_inv_batch_begin(other, &err), MS_OK);
	ms_inv_add_opts_init(&o);
	o.label = "late";
	T_ASSERT_EQ_INT(add1(other, base, &o, db, &err), MS_OK);
	ms_inv_close(other);
	T_ASSERT_EQ_INT(ms_inv_resolve(inv, "late", db, &err), MS_ENOTFOUND);
	ms_inv_close(inv);
	ms_free(base);
	ms_free(row);
	ms_free(dbp);
	return 0;
}

static int test_temp_names(void)
{
	long pid = 0;

	T_ASSERT(ms_inv_is_temp_name(".model.safetensors.tmp-1234-0abc12ef", &pid));
	T_ASSERT_EQ_INT(pid, 1234);
	T_ASSERT(ms_inv_is_temp_name(".a.tmp-1.tmp-77-ff", &pid));
	T_ASSERT_EQ_INT(pid, 77);
	T_ASSERT(!ms_inv_is_temp_name("model.safetensors.tmp-1234-0abc", &pid));
	T_ASSERT(!ms_inv_is_temp_name(".model.safetensors", &pid));
	T_ASSERT(!ms_inv_is_temp_name(".x.tmp--0abc", &pid));
	T_ASSERT(!ms_inv_is_temp_name(".x.tmp-12-", &pid));
	T_ASSERT(!ms_inv_is_temp_name(".x.tmp-12-xyz", &pid));
	T_ASSERT(!ms_inv_is_temp_name(".x.tmp-0-ab", &pid));
	T_ASSERT(!ms_inv_is_temp_name(".tmp-12-ab", &pid));
	return 0;
}

static void count_gc(enum ms_inv_gc_what what, const char *path, void *ctx)
{
	int *c = ctx;

	(void)path;
	c[what == MS_INV_GC_TEMP_FILE ? 0 : 1]++;
}

static int test_gc_removes_dead_temporaries_and_unused_rows(void)
{
	struct ms_inv *inv = fresh("gc.db");
	struct ms_err err = {0};
	char *dir = tmp("gcdir"), *f, *dead, *live, *other, d[MS_STATE_DIGEST_LEN];
	struct wt t[1] = { {"g.weight", MS_DTYPE_F32, 1, {4, 0}, 16} };
	int counts[2] = {0, 0};
	uint64_t n = 0;
	pid_t child;
	struct stat sb;

	T_ASSERT(inv);
	T_ASSERT_EQ_INT(mkdir(dir, 0755), 0);
	f = ms_asprintf("%s/g.safetensors", dir);
	T_ASSERT_EQ_INT(write_st(f, t, 1, 6, NULL, 0), MS_OK);
	T_ASSERT_EQ_INT(add1(inv, f, NULL, d, &err), MS_OK);
	/* a pid that is certainly dead: a reaped child's */
	child = fork();
	if (child == 0)
		_exit(0);
	waitpid(child, NULL, 0);
	dead = ms_asprintf("%s/.g.safetensors.tmp-%ld-deadbeef", dir, (long)child);
	live = ms_asprintf("%s/.g.safetensors.tmp-%ld-0000beef", dir, (long)getpid());
	other = ms_asprintf("%s/.hidden-but-not-ours", dir);
	T_ASSERT_EQ_INT(ms_file_write_atomic(dead, "x", 1, 1, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_file_write_atomic(live, "x", 1, 1, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_file_write_atomic(other, "x", 1, 1, &err), MS_OK);

	T_ASSERT_EQ_INT(ms_inv_gc(inv, NULL, 0, 1, count_gc, counts, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(counts[0], 1);
	T_ASSERT_EQ_INT(stat(dead, &sb), 0); /* dry run */
	T_ASSERT_EQ_INT(ms_inv_gc(inv, NULL, 0, 0, count_gc, counts, &n, &err), MS_OK);
	T_ASSERT(stat(dead, &sb) != 0);
	T_ASSERT_EQ_INT(stat(live, &sb), 0);
	T_ASSERT_EQ_INT(stat(other, &sb), 0);
	T_ASSERT_EQ_INT(counts[1], 0);
	/* a forgotten state leaves its file row until gc */
	T_ASSERT_EQ_INT(ms_inv_rm(inv, d, 0, &err), MS_OK);
	counts[0] = counts[1] = 0;
	T_ASSERT_EQ_INT(ms_inv_gc(inv, NULL, 0, 0, count_gc, counts, &n, &err), MS_OK);
	T_ASSERT_EQ_INT(counts[1], 1);
	T_ASSERT_EQ_INT(ms_inv_log_check(inv, NULL, NULL, &err), MS_OK);
	ms_inv_close(inv);
	T_ASSERT_EQ_INT(raw_int("gc.db", "SELECT count(*) FROM files"), 0);
	T_ASSERT_EQ_INT(raw_int("gc.db", "SELECT count(*) FROM tensors"), 0);
	ms_free(dir);
	ms_free(f);
	ms_free(dead);
	ms_free(live);
	ms_free(other);
	return 0;
}

/* ---- concurrent writers ---------------------------------------------------------------------------------- */

static int test_concurrent_writers(void)
{
	enum { N = 6 };
	struct ms_inv *inv = fresh("conc.db");
	struct ms_err err = {0};
	pid_t kids[N];
	char *db = tmp("conc.db");
	int64_t n = 0;

	T_ASSERT(inv);
	ms_inv_close(inv);
	for (int i = 0; i < N; i++) {
		char *f = ms_asprintf("%s/conc%d.safetensors", T_TMP, i);
		struct wt t[2] = {
			{"a.weight", MS_DTYPE_F32, 2, {16, 16}, 1024},
			{"b.weight", MS_DTYPE_F32, 1, {16, 0}, 64},
		};

		T_ASSERT_EQ_INT(write_st(f, t, 2, (unsigned)(10 + i), NULL, 0), MS_OK);
		ms_free(f);
	}
	for (int i = 0; i < N; i++) {
		kids[i] = fork();
		if (kids[i] == 0) {
			char *f = ms_asprintf("%s/conc%d.safetensors", T_TMP, i);
			char d[MS_STATE_DIGEST_LEN];
			struct ms_inv *c = NULL;
			int rc = ms_inv_open(db, 0, &c, &err);

			if (rc == MS_OK)
				rc = add1(c, f, NULL, d, &err);
			if (rc != MS_OK)
				fprintf(stderr, "child %d: %s\n", i, err.msg);
			ms_inv_close(c);
			_exit(rc == MS_OK ? 0 : 1);
		}
	}
	for (int i = 0; i < N; i++) {
		int status = 0;

		T_ASSERT_EQ_INT(waitpid(kids[i], &status, 0), kids[i]);
		T_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	T_ASSERT_EQ_INT(ms_inv_open(db, 0, &inv, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_log_check(inv, &n, NULL, &err), MS_OK);
	T_ASSERT_EQ_INT(n, 1 + N);
	ms_inv_close(inv);
	T_ASSERT_EQ_INT(raw_int("conc.db", "SELECT count(*) FROM states"), N);
	ms_free(db);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_open_create_and_refusals),
	T_CASE(test_identity_matches_oracle_and_sharding),
	T_CASE(test_any_change_changes_the_digest),
	T_CASE(test_readd_is_idempotent_and_skips_hashing),
	T_CASE(test_changed_file_is_rehashed_and_old_record_kept),
	T_CASE(test_resolve_labels_and_prefixes),
	T_CASE(test_labels_refused),
	T_CASE(test_labels_several),
	T_CASE(test_resolve_paths),
	T_CASE(test_migrate_from_v1),
	T_CASE(test_kind_and_layout_inference),
	T_CASE(test_ep_shards),
	T_CASE(test_lineage_edges_and_cycles),
	T_CASE(test_log_chain_detects_tampering),
	T_CASE(test_log_hash_is_the_documented_encoding),
	T_CASE(test_runs_events_verifications),
	T_CASE(test_batch_is_all_or_nothing),
	T_CASE(test_dup_counts_physical_copies),
	T_CASE(test_temp_names),
	T_CASE(test_gc_removes_dead_temporaries_and_unused_rows),
	T_CASE(test_concurrent_writers),
};

T_MAIN(cases)
