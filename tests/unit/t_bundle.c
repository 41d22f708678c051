/*
 * t_bundle.c: state bundles. A real state (the sharded Qwen3-MoE fixture)
 * goes out as a .tar.zst and comes back into another inventory with the
 * same digest and bytes; the bundle's layout is read back with libarchive
 * and its digests recomputed with OpenSSL directly. Then every hostile
 * archive the import must refuse, each built here with libarchive's writer
 * (no external tool): each is refused with its rule named, leaves the file
 * system as it was (a listing of a sentinel tree around the target, before
 * and after) and registers nothing.
 */
#include "test.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <archive.h>
#include <archive_entry.h>
#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "bundle.h"
#include "inventory.h"

static const char *FIXTURE = "hf/qwen3moe-sharded";
static const char *const MEMBERS[] = {
	"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json",
	"generation_config.json", "model.safetensors.index.json",
};
#define NMEMBERS 5
#define NCONFIGS 3 /* config.json and the side files: index, generation_config.json */

/* ---- helpers ------------------------------------------------------------- */

/* Run a shell command made of fmt (a literal, with two %s) and a, b. */
#define sh(fmt, a, b) sh_run(ms_asprintf(fmt, a, b))
static int sh_run(char *cmd)
{
	int rc = cmd ? system(cmd) : -1;

	ms_free(cmd);
	return rc;
}

static uint8_t *slurp(const char *path, size_t *len)
{
	struct stat st;
	uint8_t *buf;
	int fd = open(path, O_RDONLY);

	if (fd < 0 || fstat(fd, &st)) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (buf && read(fd, buf, (size_t)st.st_size) != st.st_size) {
		free(buf);
		buf = NULL;
	}
	close(fd);
	if (buf) {
		buf[st.st_size] = 0;
		*len = (size_t)st.st_size;
	}
	return buf;
}

/* SHA-256 through OpenSSL's EVP directly, not through the library. */
static void sha_hex(const void *p, size_t n, char hex[65])
{
	unsigned char d[32];
	unsigned int dl = 0;

	EVP_Digest(p, n, d, &dl, EVP_sha256(), NULL);
	for (int i = 0; i < 32; i++)
		sprintf(hex + 2 * i, "%02x", d[i]);
}

static size_t nstates(struct ms_inv *inv)
{
	struct ms_inv_state *s = NULL;
	size_t n = 0;
	struct ms_err err = {0};

	if (ms_inv_states_list(inv, MS_INV_KIND_ANY, &s, &n, &err) != MS_OK)
		return (size_t)-1;
	ms_inv_states_free(s, n);
	return n;
}

/* A listing of a tree: every path, its type, and a regular file's size and
 * content digest, sorted. */
static struct {
	char **lines;
	size_t n;
	size_t root;
} walk;

static int walk_one(const char *p, const struct stat *sb, int type, struct FTW *f)
{
	char line[1200], hex[65] = "-";
	(void)f;
	(void)type;
	if (S_ISREG(sb->st_mode)) {
		size_t len;
		uint8_t *b = slurp(p, &len);

		if (b)
			sha_hex(b, len, hex);
		free(b);
	}
	snprintf(line, sizeof(line), "%s %o %lld %s", p + walk.root, (unsigned)(sb->st_mode & S_IFMT),
		 S_ISREG(sb->st_mode) ? (long long)sb->st_size : 0LL, hex);
	walk.lines = realloc(walk.lines, (walk.n + 1) * sizeof(*walk.lines));
	walk.lines[walk.n++] = strdup(line);
	return 0;
}

static int cmp_line(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *listing(const char *dir)
{
	size_t total = 1;
	char *out;

	walk.lines = NULL;
	walk.n = 0;
	walk.root = strlen(dir);
	nftw(dir, walk_one, 16, FTW_PHYS);
	qsort(walk.lines, walk.n, sizeof(*walk.lines), cmp_line);
	for (size_t i = 0; i < walk.n; i++)
		total += strlen(walk.lines[i]) + 1;
	out = malloc(total);
	out[0] = 0;
	for (size_t i = 0; i < walk.n; i++) {
		strcat(out, walk.lines[i]);
		strcat(out, "\n");
		free(walk.lines[i]);
	}
	free(walk.lines);
	return out;
}

/* ---- the environment: a source inventory holding the fixture state, its
 * bundle, and an empty destination inventory beside a sentinel tree ----- */

struct env {
	char dir[400];
	char src[512], bundle[512], box[512], into[600], arch[512];
	struct ms_inv *inv, *dst;
	char digest[MS_STATE_DIGEST_LEN];
	/* the genuine bundle's members */
	size_t n;
	char *name[8];
	uint8_t *data[8];
	size_t len[8];
};

static int read_members(const char *path, struct env *v)
{
	struct archive *a = archive_read_new();
	struct archive_entry *e;

	archive_read_support_filter_zstd(a);
	archive_read_support_format_tar(a);
	if (archive_read_open_filename(a, path, 1 << 16) != ARCHIVE_OK)
		return -1;
	v->n = 0;
	while (archive_read_next_header(a, &e) == ARCHIVE_OK && v->n < 8) {
		size_t len = (size_t)archive_entry_size(e);

		v->name[v->n] = strdup(archive_entry_pathname(e));
		v->data[v->n] = malloc(len + 1);
		v->len[v->n] = len;
		if (archive_read_data(a, v->data[v->n], len) != (la_ssize_t)len)
			return -1;
		v->data[v->n][len] = 0;
		v->n++;
	}
	archive_read_free(a);
	return 0;
}

static int env_setup(struct env *v, const char *name)
{
	struct ms_inv_add_opts o;
	struct ms_err err = {0};
	char path[700];
	const char *p;

	memset(v, 0, sizeof(*v));
	snprintf(v->dir, sizeof(v->dir), "%s/%s", T_TMP, name);
	snprintf(v->src, sizeof(v->src), "%s/src", v->dir);
	snprintf(v->bundle, sizeof(v->bundle), "%s/state.tar.zst", v->dir);
	snprintf(v->box, sizeof(v->box), "%s/box", v->dir);
	snprintf(v->arch, sizeof(v->arch), "%s/arch", v->dir);
	snprintf(v->into, sizeof(v->into), "%s/sandbox/out", v->box);
	snprintf(path, sizeof(path), "%s/%s", T_FIXTURES, FIXTURE);
	if (sh("mkdir -p '%s'%s", v->dir, "") != 0 || sh("cp -r '%s' '%s'", path, v->src) != 0 ||
	    sh("chmod -R u+w '%s'%s", v->src, "") != 0)
		return -1;
	if (sh("mkdir -p '%s/sandbox' '%s/sentinel/sub'", v->box, v->box) != 0 ||
	    sh("mkdir -p '%s'%s", v->arch, "") != 0 ||
	    sh("echo keep > '%s/sentinel/a.txt' && echo keep > '%s/sentinel/sub/b.txt'", v->box, v->box) != 0)
		return -1;
	snprintf(path, sizeof(path), "%s/src.db", v->dir);
	if (ms_inv_open(path, MS_INV_CREATE, &v->inv, &err) != MS_OK)
		goto fail;
	snprintf(path, sizeof(path), "%s/dst.db", v->dir);
	if (ms_inv_open(path, MS_INV_CREATE, &v->dst, &err) != MS_OK)
		goto fail;
	ms_inv_add_opts_init(&o);
	o.label = "qwen-base";
	o.jobs = 2;
	p = v->src;
	if (ms_inv_add_paths(v->inv, &p, 1, &o, v->digest, &err) != MS_OK)
		goto fail;
	if (ms_bundle_export(v->inv, v->digest, v->bundle, 0, 2, &err) != MS_OK)
		goto fail;
	if (read_members(v->bundle, v) || v->n != 1 + NMEMBERS)
		return -1;
	return 0;
fail:
	fprintf(stderr, "env_setup: %s\n", err.msg);
	return -1;
}

static void env_free(struct env *v)
{
	ms_inv_close(v->inv);
	ms_inv_close(v->dst);
	for (size_t i = 0; i < v->n; i++) {
		free(v->name[i]);
		free(v->data[i]);
	}
}

/* Index of a genuine member by name. */
static size_t gm(const struct env *v, const char *name)
{
	for (size_t i = 0; i < v->n; i++)
		if (!strcmp(v->name[i], name))
			return i;
	return 0;
}

/* ---- building archives ------------------------------------------------------- */

struct hent {
	const char *name;
	char type;              /* f file, l symlink, h hard link, c/b devices, p FIFO, d dir */
	const void *data;
	size_t len;
	const char *link;
	uint64_t zeros;         /* f: this many zero bytes instead of data */
};

static int write_archive(const char *path, const struct hent *h, size_t n, int zstd)
{
	struct archive *a = archive_write_new();
	static uint8_t zero[1 << 20];
	int rc = -1;

	if (zstd && archive_write_add_filter_zstd(a) != ARCHIVE_OK)
		goto out;
	if (archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
	    archive_write_open_filename(a, path) != ARCHIVE_OK)
		goto out;
	for (size_t i = 0; i < n; i++) {
		struct archive_entry *e = archive_entry_new();
		uint64_t size = h[i].type == 'f' ? (h[i].zeros ? h[i].zeros : h[i].len) : 0;

		archive_entry_set_pathname(e, h[i].name);
		archive_entry_set_perm(e, 0644);
		switch (h[i].type) {
		case 'f': archive_entry_set_filetype(e, AE_IFREG); break;
		case 'd': archive_entry_set_filetype(e, AE_IFDIR); break;
		case 'l': archive_entry_set_filetype(e, AE_IFLNK); archive_entry_set_symlink(e, h[i].link); break;
		case 'h': archive_entry_set_filetype(e, AE_IFREG); archive_entry_set_hardlink(e, h[i].link); break;
		case 'c': archive_entry_set_filetype(e, AE_IFCHR); archive_entry_set_rdev(e, makedev(1, 3)); break;
		case 'b': archive_entry_set_filetype(e, AE_IFBLK); archive_entry_set_rdev(e, makedev(7, 0)); break;
		case 'p': archive_entry_set_filetype(e, AE_IFIFO); break;
		}
		archive_entry_set_size(e, (la_int64_t)size);
		if (archive_write_header(a, e) != ARCHIVE_OK) {
			fprintf(stderr, "write_archive: %s\n", archive_error_string(a));
			archive_entry_free(e);
			goto out;
		}
		archive_entry_free(e);
		if (h[i].type == 'f' && h[i].zeros) {
			for (uint64_t left = h[i].zeros; left;) {
				size_t k = left < sizeof(zero) ? (size_t)left : sizeof(zero);

				if (archive_write_data(a, zero, k) != (la_ssize_t)k)
					goto out;
				left -= k;
			}
		} else if (h[i].type == 'f' && h[i].len &&
			   archive_write_data(a, h[i].data, h[i].len) != (la_ssize_t)h[i].len) {
			goto out;
		}
	}
	rc = archive_write_close(a) == ARCHIVE_OK ? 0 : -1;
out:
	archive_write_free(a);
	return rc;
}

/* The genuine entries (manifest first), with entry `drop` left out (-1:
 * none) and extra entries appended. */
static int genuine_plus(const struct env *v, const char *path, long drop, const struct hent *extra,
			size_t nextra, const char *manifest)
{
	struct hent h[16];
	size_t k = 0;

	for (size_t i = 0; i < v->n; i++) {
		if ((long)i == drop)
			continue;
		h[k].name = v->name[i];
		h[k].type = 'f';
		h[k].data = i == 0 && manifest ? manifest : (const char *)v->data[i];
		h[k].len = i == 0 && manifest ? strlen(manifest) : v->len[i];
		h[k].link = NULL;
		h[k].zeros = 0;
		k++;
	}
	for (size_t i = 0; i < nextra; i++)
		h[k++] = extra[i];
	return write_archive(path, h, k, 1);
}

/* The genuine manifest, edited by fn. */
static char *edit_manifest(const struct env *v, void (*fn)(cJSON *o, void *ctx), void *ctx)
{
	cJSON *o = cJSON_Parse((const char *)v->data[0]);
	char *s;

	fn(o, ctx);
	s = cJSON_Print(o);
	cJSON_Delete(o);
	return s;
}

static cJSON *bundle_member(cJSON *o, const char *path)
{
	cJSON *m;

	cJSON_ArrayForEach(m, cJSON_GetObjectItem(cJSON_GetObjectItem(o, "bundle"), "members"))
		if (!strcmp(cJSON_GetObjectItem(m, "path")->valuestring, path))
			return m;
	return NULL;
}

static cJSON *manifest_file(cJSON *o, const char *path)
{
	cJSON *f;

	cJSON_ArrayForEach(f, cJSON_GetObjectItem(o, "files"))
		if (!strcmp(cJSON_GetObjectItem(f, "path")->valuestring, path))
			return f;
	return NULL;
}

static void set_str(cJSON *o, const char *key, const char *val)
{
	cJSON_ReplaceItemInObject(o, key, cJSON_CreateString(val));
}

static void set_num(cJSON *o, const char *key, double val)
{
	cJSON_ReplaceItemInObject(o, key, cJSON_CreateNumber(val));
}

/* ---- the refusal check ----------------------------------------------------- */

/* Import path into the sandbox; it must fail with code and an error line
 * holding the archive's name and every needle, leave the sentinel tree as
 * it was, and register nothing. */
static int refused_as(struct env *v, const char *path, const struct ms_bundle_import_opts *o, int code,
		      int named, const char *n1, const char *n2)
{
	char *before = listing(v->box), *after;
	char digest[MS_STATE_DIGEST_LEN] = "";
	struct ms_err err = {0};
	size_t states = nstates(v->dst);
	int rc = ms_bundle_import(v->dst, path, v->into, o, digest, &err);

	after = listing(v->box);
	if (getenv("T_VERBOSE"))
		fprintf(stderr, "refused: %s\n", err.msg);
	T_ASSERT_MSG(rc == code, "rc %d (want %d): %s", rc, code, err.msg);
	T_ASSERT_EQ_INT(err.code, code);
	T_ASSERT_MSG(!named || strstr(err.msg, path) != NULL, "archive not named: %s", err.msg);
	T_ASSERT_MSG(!n1 || strstr(err.msg, n1), "'%s' not in: %s", n1, err.msg);
	T_ASSERT_MSG(!n2 || strstr(err.msg, n2), "'%s' not in: %s", n2, err.msg);
	T_ASSERT(strchr(err.msg, '\n') == NULL);
	T_ASSERT_MSG(!strcmp(before, after), "the file system changed:\n--- before\n%s--- after\n%s",
		     before, after);
	T_ASSERT_EQ_INT(nstates(v->dst), states);
	free(before);
	free(after);
	return 0;
}

/* A refusal of the archive itself: the line names it. */
static int refused(struct env *v, const char *path, const struct ms_bundle_import_opts *o, int code,
		   const char *n1, const char *n2)
{
	return refused_as(v, path, o, code, 1, n1, n2);
}

static char *arch_path(const struct env *v, const char *name)
{
	return ms_asprintf("%s/%s.tar.zst", v->arch, name);
}

/* ==== export ================================================================ */

/* The bundle read back independently: MANIFEST.json first, then the
 * fixture's files byte for byte, fixed metadata, and a manifest whose
 * member digests and total are those of the files (OpenSSL over the
 * fixture's own bytes). */
static int test_export_layout(void)
{
	struct env v;
	struct archive *a = archive_read_new();
	struct archive_entry *e;
	cJSON *o, *b, *m;
	size_t i = 0, len, total = 0;
	uint8_t magic[4];
	char hex[65];
	int fd;

	T_ASSERT(env_setup(&v, "layout") == 0);
	fd = open(v.bundle, O_RDONLY);
	T_ASSERT(fd >= 0 && read(fd, magic, 4) == 4);
	close(fd);
	T_ASSERT(magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd);
	archive_read_support_filter_zstd(a);
	archive_read_support_format_tar(a);
	T_ASSERT(archive_read_open_filename(a, v.bundle, 1 << 16) == ARCHIVE_OK);
	while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
		T_ASSERT_EQ_INT(archive_entry_filetype(e), AE_IFREG);
		T_ASSERT_EQ_INT(archive_entry_perm(e), 0644);
		T_ASSERT_EQ_INT(archive_entry_mtime(e), 0);
		T_ASSERT_EQ_INT(archive_entry_uid(e), 0);
		T_ASSERT_EQ_INT(archive_entry_gid(e), 0);
		T_ASSERT_STR(archive_entry_uname(e), "root");
		if (i == 0)
			T_ASSERT_STR(archive_entry_pathname(e), "MANIFEST.json");
		else
			T_ASSERT_STR(archive_entry_pathname(e), MEMBERS[i - 1]);
		i++;
	}
	archive_read_free(a);
	T_ASSERT_EQ_INT(i, 1 + NMEMBERS);

	o = cJSON_Parse((const char *)v.data[0]);
	T_ASSERT(o);
	T_ASSERT_STR(cJSON_GetObjectItem(o, "state")->valuestring, v.digest);
	T_ASSERT_STR(cJSON_GetObjectItem(o, "format")->valuestring, "msinv-manifest-v1");
	b = cJSON_GetObjectItem(o, "bundle");
	T_ASSERT_STR(cJSON_GetObjectItem(b, "format")->valuestring, "msinv-bundle-v1");
	T_ASSERT_STR(cJSON_GetObjectItem(b, "label")->valuestring, "qwen-base");
	T_ASSERT_STR(cJSON_GetObjectItem(b, "kind")->valuestring, "base");
	T_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(b, "ep_size")));
	T_ASSERT_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(b, "members")), NMEMBERS);
	for (i = 0; i < NMEMBERS; i++) {
		char *p = ms_asprintf("%s/%s", v.src, MEMBERS[i]);
		uint8_t *bytes = slurp(p, &len);
		size_t k = gm(&v, MEMBERS[i]);

		T_ASSERT(bytes && k > 0);
		/* the packed bytes are the file's */
		T_ASSERT_EQ_INT(v.len[k], len);
		T_ASSERT(memcmp(v.data[k], bytes, len) == 0);
		m = bundle_member(o, MEMBERS[i]);
		T_ASSERT(m);
		sha_hex(bytes, len, hex);
		T_ASSERT_STR(cJSON_GetObjectItem(m, "sha256")->valuestring, hex);
		T_ASSERT_EQ_INT(cJSON_GetObjectItem(m, "size")->valuedouble, len);
		total += len;
		free(bytes);
		ms_free(p);
	}
	T_ASSERT_EQ_INT(cJSON_GetObjectItem(b, "total_bytes")->valuedouble, total);
	cJSON_Delete(o);
	env_free(&v);
	return 0;
}

/* Two exports of one state are the same bytes, whatever the thread count;
 * an existing output is kept unless forced. */
static int test_export_deterministic(void)
{
	struct env v;
	struct ms_err err = {0};
	char *a, *b;
	uint8_t *x, *y;
	size_t nx, ny;

	T_ASSERT(env_setup(&v, "determ") == 0);
	a = ms_asprintf("%s/a.tar.zst", v.dir);
	b = ms_asprintf("%s/b.tar.zst", v.dir);
	T_ASSERT_EQ_INT(ms_bundle_export(v.inv, v.digest, a, 0, 1, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_bundle_export(v.inv, v.digest, b, 0, 2, &err), MS_OK);
	x = slurp(a, &nx);
	y = slurp(b, &ny);
	T_ASSERT(x && y);
	T_ASSERT_EQ_INT(nx, ny);
	T_ASSERT(memcmp(x, y, nx) == 0);
	free(y);
	T_ASSERT_EQ_INT(ms_bundle_export(v.inv, v.digest, a, 0, 2, &err), MS_EEXIST);
	T_ASSERT(strstr(err.msg, a) != NULL);
	T_ASSERT_EQ_INT(ms_bundle_export(v.inv, v.digest, a, 1, 3, &err), MS_OK);
	y = slurp(a, &ny);
	T_ASSERT(y && ny == nx && memcmp(x, y, nx) == 0);
	free(x);
	free(y);
	ms_free(a);
	ms_free(b);
	env_free(&v);
	return 0;
}

/* A recorded file whose bytes changed, or that is gone, is not exported,
 * and no output (nor temporary) is left. */
static int test_export_refuses_changed_files(void)
{
	struct env v;
	struct ms_err err = {0};
	char *f2, *out, *outdir, *before, *after;
	int fd;
	uint8_t byte;

	T_ASSERT(env_setup(&v, "changed") == 0);
	f2 = ms_asprintf("%s/%s", v.src, MEMBERS[1]);
	outdir = ms_asprintf("%s/outdir", v.dir);
	out = ms_asprintf("%s/x.tar.zst", outdir);
	T_ASSERT(mkdir(outdir, 0755) == 0);
	before = listing(outdir);
	/* the last byte of the file is the last byte of a tensor */
	fd = open(f2, O_RDWR);
	T_ASSERT(fd >= 0);
	T_ASSERT(pread(fd, &byte, 1, (off_t)v.len[gm(&v, MEMBERS[1])] - 1) == 1);
	byte ^= 0x10;
	T_ASSERT(pwrite(fd, &byte, 1, (off_t)v.len[gm(&v, MEMBERS[1])] - 1) == 1);
	close(fd);
	T_ASSERT_EQ_INT(ms_bundle_export(v.inv, v.digest, out, 0, 2, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, MEMBERS[1]) && strstr(err.msg, "tensor '") &&
		     strstr(err.msg, "digest mismatch"), "%s", err.msg);
	after = listing(outdir);
	T_ASSERT_STR(after, before);
	free(after);
	T_ASSERT(unlink(f2) == 0);
	T_ASSERT_EQ_INT(ms_bundle_export(v.inv, v.digest, out, 0, 2, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, MEMBERS[1]) && strstr(err.msg, "missing"), "%s", err.msg);
	after = listing(outdir);
	T_ASSERT_STR(after, before);
	free(after);
	free(before);
	ms_free(f2);
	ms_free(out);
	ms_free(outdir);
	env_free(&v);
	return 0;
}

/* ==== import: the good path ================================================= */

/* Into another inventory: the same state digest, kind, layout and label,
 * the same bytes as the fixture, verifying against the new record. */
static int test_round_trip(void)
{
	struct env v;
	struct ms_bundle_import_opts o;
	struct ms_bundle_import_stats st;
	struct ms_inv_state *s1 = NULL, *s2 = NULL;
	struct ms_vstate *vs = NULL;
	struct ms_vreport r;
	struct ms_err err = {0};
	char digest[MS_STATE_DIGEST_LEN];

	T_ASSERT(env_setup(&v, "round") == 0);
	ms_bundle_import_opts_init(&o);
	o.nthreads = 2;
	o.stats = &st;
	T_ASSERT_MSG(ms_bundle_import(v.dst, v.bundle, v.into, &o, digest, &err) == MS_OK, "%s",
		     err.msg);
	T_ASSERT_STR(digest, v.digest);
	T_ASSERT_EQ_INT(st.members, NMEMBERS);
	T_ASSERT(st.new_state);
	T_ASSERT_EQ_INT(nstates(v.dst), 1);
	for (size_t i = 0; i < NMEMBERS; i++) {
		char *p = ms_asprintf("%s/%s", v.into, MEMBERS[i]);
		char *q = ms_asprintf("%s/%s/%s", T_FIXTURES, FIXTURE, MEMBERS[i]);
		size_t n1, n2;
		uint8_t *b1 = slurp(p, &n1), *b2 = slurp(q, &n2);

		T_ASSERT(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0);
		free(b1);
		free(b2);
		ms_free(p);
		ms_free(q);
	}
	{
		char *p = ms_asprintf("%s/MANIFEST.json", v.into);
		size_t n;
		uint8_t *b = slurp(p, &n);

		T_ASSERT(b && n == v.len[0] && memcmp(b, v.data[0], n) == 0);
		free(b);
		ms_free(p);
	}
	T_ASSERT_EQ_INT(ms_inv_state_get(v.inv, v.digest, &s1, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_inv_state_get(v.dst, v.digest, &s2, &err), MS_OK);
	T_ASSERT_EQ_INT(s1->kind, s2->kind);
	T_ASSERT_STR(s1->layout, s2->layout);
	T_ASSERT_STR(s2->label, "qwen-base");
	T_ASSERT_EQ_INT(s1->ntensors, s2->ntensors);
	ms_inv_state_free(s1);
	ms_inv_state_free(s2);
	T_ASSERT_EQ_INT(ms_vstate_from_inv(v.dst, v.digest, 0, &vs, &err), MS_OK);
	T_ASSERT_EQ_INT(vs->nconfigs, NCONFIGS);
	T_ASSERT_EQ_INT(ms_verify_state(vs, 2, &r, &err), MS_OK);
	T_ASSERT_EQ_INT(r.nfiles, 2);
	ms_vreport_release(&r);
	ms_vstate_free(vs);
	/* no temporary left beside it */
	{
		char *parent = ms_asprintf("%s/sandbox", v.box);
		char *l = listing(parent);

		T_ASSERT_MSG(!strstr(l, ".tmp-") && !strstr(l, ".import-") && !strstr(l, ".replaced-"), "%s", l);
		free(l);
		ms_free(parent);
	}
	env_free(&v);
	return 0;
}

/* A file name that is not ASCII goes out and comes back as the same bytes,
 * whatever the locale (the library never calls setlocale). */
static int test_non_ascii_name(void)
{
	struct env v;
	struct ms_err err = {0};
	char *dir, *file, *bundle, *into, digest[MS_STATE_DIGEST_LEN], d2[MS_STATE_DIGEST_LEN];
	const char *p;
	struct stat st;

	T_ASSERT(env_setup(&v, "utf8") == 0);
	dir = ms_asprintf("%s/single", v.dir);
	file = ms_asprintf("%s/mod\xc3\xa8le.safetensors", dir);
	bundle = ms_asprintf("%s/single.tar.zst", v.dir);
	into = ms_asprintf("%s/sandbox/single", v.box);
	T_ASSERT(mkdir(dir, 0755) == 0);
	T_ASSERT(sh("cp '%s/hf/mixtral/config.json' '%s/'", T_FIXTURES, dir) == 0);
	T_ASSERT(sh("cp '%s/hf/mixtral/model.safetensors' '%s'", T_FIXTURES, file) == 0);
	p = dir;
	T_ASSERT_EQ_INT(ms_inv_add_paths(v.inv, &p, 1, NULL, digest, &err), MS_OK);
	T_ASSERT_MSG(ms_bundle_export(v.inv, digest, bundle, 0, 2, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_MSG(ms_bundle_import(v.dst, bundle, into, NULL, d2, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_STR(d2, digest);
	ms_free(file);
	file = ms_asprintf("%s/mod\xc3\xa8le.safetensors", into);
	T_ASSERT(stat(file, &st) == 0 && S_ISREG(st.st_mode));
	ms_free(dir);
	ms_free(file);
	ms_free(bundle);
	ms_free(into);
	env_free(&v);
	return 0;
}

/* The plan of a dry run comes from the manifest alone. */
static int test_plan(void)
{
	struct env v;
	struct ms_bundle_import_plan *p = NULL;
	struct ms_err err = {0};
	uint64_t total = 0;

	T_ASSERT(env_setup(&v, "plan") == 0);
	T_ASSERT_EQ_INT(ms_bundle_import_plan_read(v.bundle, NULL, &p, &err), MS_OK);
	T_ASSERT_STR(p->digest, v.digest);
	T_ASSERT_STR(p->kind, "base");
	T_ASSERT_STR(p->label, "qwen-base");
	T_ASSERT_EQ_INT(p->nmembers, NMEMBERS);
	T_ASSERT_EQ_INT(p->nfiles, 2);
	T_ASSERT_EQ_INT(p->nconfigs, NCONFIGS);
	T_ASSERT_EQ_INT(p->ep_size, -1);
	for (size_t i = 1; i < v.n; i++)
		total += v.len[i];
	T_ASSERT_EQ_INT(p->total_bytes, total);
	T_ASSERT_EQ_INT(p->manifest_bytes, v.len[0]);
	T_ASSERT(p->ntensors > 10);
	ms_bundle_import_plan_free(p);
	env_free(&v);
	return 0;
}

/* An existing target is kept without force; with force a previous import is
 * replaced (nothing of it left aside), anything else is not. A label that
 * names another state is refused before any work; --label overrides. */
static int test_target_and_label(void)
{
	struct env v;
	struct ms_bundle_import_opts o;
	struct ms_inv_add_opts ao;
	struct ms_inv_state *s = NULL;
	struct ms_err err = {0};
	char digest[MS_STATE_DIGEST_LEN], other[MS_STATE_DIGEST_LEN], *mix, *plain, *l;
	const char *p;

	T_ASSERT(env_setup(&v, "target") == 0);
	ms_bundle_import_opts_init(&o);
	T_ASSERT_EQ_INT(ms_bundle_import(v.dst, v.bundle, v.into, &o, digest, &err), MS_OK);
	T_ASSERT(refused_as(&v, v.bundle, &o, MS_EEXIST, 0, v.into, "exists") == 0);
	o.force = 1;
	T_ASSERT_MSG(ms_bundle_import(v.dst, v.bundle, v.into, &o, digest, &err) == MS_OK, "%s",
		     err.msg);
	l = listing(v.box);
	T_ASSERT_MSG(!strstr(l, ".replaced-") && !strstr(l, ".import-") && !strstr(l, ".tmp-") &&
			     strstr(l, "/sandbox/out/config.json"),
		     "%s", l);
	free(l);
	/* force does not replace a directory that is not an import */
	plain = ms_asprintf("%s/sandbox/plain", v.box);
	T_ASSERT(mkdir(plain, 0755) == 0);
	T_ASSERT(sh("echo mine > '%s/notes.txt'%s", plain, "") == 0);
	{
		char *before = listing(v.box);

		T_ASSERT_EQ_INT(ms_bundle_import(v.dst, v.bundle, plain, &o, digest, &err), MS_EEXIST);
		T_ASSERT(strstr(err.msg, "not replacing") != NULL);
		l = listing(v.box);
		T_ASSERT_STR(l, before);
		free(l);
		free(before);
	}
	ms_free(plain);

	/* a label in use by another state of the destination */
	mix = ms_asprintf("%s/hf/mixtral", T_FIXTURES);
	ms_inv_add_opts_init(&ao);
	ao.label = "qwen-base";
	p = mix;
	{
		struct ms_inv *fresh;
		char *db = ms_asprintf("%s/fresh.db", v.dir);

		T_ASSERT_EQ_INT(ms_inv_open(db, MS_INV_CREATE, &fresh, &err), MS_OK);
		T_ASSERT_EQ_INT(ms_inv_add_paths(fresh, &p, 1, &ao, other, &err), MS_OK);
		ms_inv_close(v.dst);
		v.dst = fresh;
		ms_free(db);
	}
	ms_bundle_import_opts_init(&o);
	snprintf(v.into, sizeof(v.into), "%s/sandbox/second", v.box);
	T_ASSERT(refused_as(&v, v.bundle, &o, MS_EEXIST, 0, "label 'qwen-base' already names state",
			    other) == 0);
	o.label = "qwen-imported";
	T_ASSERT_MSG(ms_bundle_import(v.dst, v.bundle, v.into, &o, digest, &err) == MS_OK, "%s",
		     err.msg);
	T_ASSERT_EQ_INT(ms_inv_state_get(v.dst, digest, &s, &err), MS_OK);
	T_ASSERT_STR(s->label, "qwen-imported");
	ms_inv_state_free(s);
	o.label = "cafe";   /* reads as a digest prefix */
	snprintf(v.into, sizeof(v.into), "%s/sandbox/third", v.box);
	T_ASSERT(refused_as(&v, v.bundle, &o, MS_EINVAL, 0, "label 'cafe'", NULL) == 0);
	ms_free(mix);
	env_free(&v);
	return 0;
}

/* ==== import: hostile archives ================================================ */

static int hostile_entry(struct env *v, const char *tag, struct hent extra, int code,
			 const char *n1, const char *n2)
{
	char *path = arch_path(v, tag);
	int rc;

	if (genuine_plus(v, path, -1, &extra, 1, NULL)) {
		fprintf(stderr, "cannot build %s\n", path);
		return 1;
	}
	rc = refused(v, path, NULL, code, n1, n2);
	ms_free(path);
	return rc;
}

/* Names that would land outside the target, or that are not plain. */
static int test_hostile_paths(void)
{
	struct env v;
	struct hent e = {NULL, 'f', "evil\n", 5, NULL, 0};
	char abs[700], msg[1200];
	char *path;

	T_ASSERT(env_setup(&v, "paths") == 0);
	snprintf(abs, sizeof(abs), "%s/sentinel/abs-evil", v.box);
	e.name = abs;
	T_ASSERT(hostile_entry(&v, "absolute", e, MS_EINVAL, "absolute path", abs) == 0);
	e.name = "../evil";
	T_ASSERT(hostile_entry(&v, "dotdot", e, MS_EINVAL, NULL, NULL) == 0);
	/* the whole line, as the tools print it */
	path = arch_path(&v, "dotdot");
	{
		struct ms_err err = {0};
		char d[MS_STATE_DIGEST_LEN];

		T_ASSERT(ms_bundle_import(v.dst, path, v.into, NULL, d, &err) == MS_EINVAL);
		snprintf(msg, sizeof(msg), "'%s': member '../evil': path escapes the target directory",
			 path);
		T_ASSERT_STR(err.msg, msg);
	}
	ms_free(path);
	e.name = "sub/../../../sentinel/x";
	T_ASSERT(hostile_entry(&v, "dotdot-deep", e, MS_EINVAL, "path escapes the target directory",
			       "member 'sub/../../../sentinel/x'") == 0);
	e.name = "a/b/c/d/e/f/g/h/i/config.json";
	T_ASSERT(hostile_entry(&v, "deep", e, MS_EINVAL, "deeper than 8 directories", NULL) == 0);
	e.name = "./config.json";
	T_ASSERT(hostile_entry(&v, "dot", e, MS_EINVAL, "empty or '.' component", NULL) == 0);
	e.name = "a//config.json";
	T_ASSERT(hostile_entry(&v, "empty", e, MS_EINVAL, "empty or '.' component", NULL) == 0);
	e.name = "evil\x1b[2Jname";
	T_ASSERT(hostile_entry(&v, "control", e, MS_EINVAL, "control character",
			       "member 'evil?[2Jname'") == 0);
	env_free(&v);
	return 0;
}

/* Anything but a regular file, even under a member's own name. */
static int test_hostile_types(void)
{
	struct env v;
	struct hent e = {NULL, 0, NULL, 0, NULL, 0};

	T_ASSERT(env_setup(&v, "types") == 0);
	e.type = 'l';
	e.name = "evil-link";
	e.link = "../../sentinel";
	T_ASSERT(hostile_entry(&v, "symlink", e, MS_EINVAL, "symbolic link", "member 'evil-link'") == 0);
	e.name = "model-00001-of-00002.safetensors";
	e.link = "/etc/passwd";
	{
		/* the link comes instead of the genuine file */
		char *path = arch_path(&v, "symlink-member");

		T_ASSERT(genuine_plus(&v, path, (long)gm(&v, e.name), &e, 1, NULL) == 0);
		T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "symbolic link", e.name) == 0);
		ms_free(path);
	}
	e.type = 'h';
	e.name = "hard";
	e.link = "model-00001-of-00002.safetensors";
	T_ASSERT(hostile_entry(&v, "hardlink", e, MS_EINVAL, "hard link", "member 'hard'") == 0);
	e.type = 'c';
	e.name = "null";
	e.link = NULL;
	T_ASSERT(hostile_entry(&v, "chardev", e, MS_EINVAL, "character device", "member 'null'") == 0);
	e.type = 'b';
	T_ASSERT(hostile_entry(&v, "blockdev", e, MS_EINVAL, "block device", NULL) == 0);
	e.type = 'p';
	e.name = "fifo";
	T_ASSERT(hostile_entry(&v, "fifo", e, MS_EINVAL, "FIFO", "member 'fifo'") == 0);
	e.type = 'd';
	e.name = "zzz/";
	T_ASSERT(hostile_entry(&v, "dir", e, MS_EINVAL, "directory not implied by any member", NULL) == 0);
	env_free(&v);
	return 0;
}

/* Names against the manifest: unlisted, twice, missing, too large. */
static int test_hostile_members(void)
{
	struct env v;
	struct hent e = {"extra.safetensors", 'f', "x", 1, NULL, 0};
	char *path;
	size_t k;
	uint8_t *big;

	T_ASSERT(env_setup(&v, "members") == 0);
	T_ASSERT(hostile_entry(&v, "unlisted", e, MS_EINVAL, "not listed in the manifest",
			       "member 'extra.safetensors'") == 0);
	k = gm(&v, "config.json");
	e.name = "config.json";
	e.data = v.data[k];
	e.len = v.len[k];
	T_ASSERT(hostile_entry(&v, "duplicate", e, MS_EINVAL, "duplicate entry", "member 'config.json'") == 0);
	e.name = "MANIFEST.json";
	e.data = v.data[0];
	e.len = v.len[0];
	T_ASSERT(hostile_entry(&v, "duplicate-manifest", e, MS_EINVAL, "duplicate entry", NULL) == 0);

	path = arch_path(&v, "missing");
	T_ASSERT(genuine_plus(&v, path, (long)k, NULL, 0, NULL) == 0);
	T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "member 'config.json': missing from the archive",
			 NULL) == 0);
	ms_free(path);

	/* the genuine bytes and more, under the genuine name */
	k = gm(&v, MEMBERS[0]);
	big = malloc(v.len[k] + 4096);
	memcpy(big, v.data[k], v.len[k]);
	memset(big + v.len[k], 0x41, 4096);
	e.name = MEMBERS[0];
	e.data = big;
	e.len = v.len[k] + 4096;
	path = arch_path(&v, "larger");
	T_ASSERT(genuine_plus(&v, path, (long)k, &e, 1, NULL) == 0);
	T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "larger than declared", MEMBERS[0]) == 0);
	ms_free(path);
	/* and fewer */
	e.len = v.len[k] - 100;
	path = arch_path(&v, "shorter");
	T_ASSERT(genuine_plus(&v, path, (long)k, &e, 1, NULL) == 0);
	T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "shorter than declared", MEMBERS[0]) == 0);
	ms_free(path);
	free(big);
	env_free(&v);
	return 0;
}

/* The manifest's place and size. */
static int test_hostile_manifest_framing(void)
{
	struct env v;
	struct hent h[4];
	char *path;

	T_ASSERT(env_setup(&v, "mframe") == 0);
	/* not first */
	h[0] = (struct hent){"config.json", 'f', v.data[gm(&v, "config.json")],
			     v.len[gm(&v, "config.json")], NULL, 0};
	h[1] = (struct hent){"MANIFEST.json", 'f', v.data[0], v.len[0], NULL, 0};
	path = arch_path(&v, "manifest-second");
	T_ASSERT(write_archive(path, h, 2, 1) == 0);
	T_ASSERT(refused(&v, path, NULL, MS_EINVAL,
			 "member 'config.json': comes before MANIFEST.json", NULL) == 0);
	ms_free(path);
	/* huge: 65 MiB, refused from its header */
	h[0] = (struct hent){"MANIFEST.json", 'f', NULL, 0, NULL, 65ull << 20};
	path = arch_path(&v, "manifest-huge");
	T_ASSERT(write_archive(path, h, 1, 1) == 0);
	T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "member 'MANIFEST.json'", "over the limit of 67108864") == 0);
	ms_free(path);
	/* small enough, but so many JSON values the parser's memory would
	 * be a bomb of its own */
	{
		size_t n = 2 * (8u << 20) + 16;
		char *j = malloc(n + 1);

		memset(j, ',', n);
		j[0] = '[';
		for (size_t i = 1; i + 1 < n; i += 2)
			j[i] = '0';
		j[n - 1] = ']';
		j[n] = 0;
		h[0] = (struct hent){"MANIFEST.json", 'f', j, n, NULL, 0};
		path = arch_path(&v, "manifest-values");
		T_ASSERT(write_archive(path, h, 1, 1) == 0);
		T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "member 'MANIFEST.json'",
				 "more than 8388608 JSON values") == 0);
		ms_free(path);
		free(j);
	}
	/* a link in its place */
	h[0] = (struct hent){"MANIFEST.json", 'l', NULL, 0, "/etc/passwd", 0};
	path = arch_path(&v, "manifest-link");
	T_ASSERT(write_archive(path, h, 1, 1) == 0);
	T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "symbolic link", NULL) == 0);
	ms_free(path);
	/* not JSON */
	h[0] = (struct hent){"MANIFEST.json", 'f', "{\"format\":", 10, NULL, 0};
	path = arch_path(&v, "manifest-garbage");
	T_ASSERT(write_archive(path, h, 1, 1) == 0);
	T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "member 'MANIFEST.json'", "not a JSON object") == 0);
	ms_free(path);
	/* no manifest at all */
	path = arch_path(&v, "empty");
	T_ASSERT(write_archive(path, h, 0, 1) == 0);
	T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "empty archive", NULL) == 0);
	ms_free(path);
	/* not compressed, truncated, not an archive */
	path = arch_path(&v, "plain-tar");
	h[0] = (struct hent){"MANIFEST.json", 'f', v.data[0], v.len[0], NULL, 0};
	T_ASSERT(write_archive(path, h, 1, 0) == 0);
	T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "not a valid zstd stream", NULL) == 0);
	ms_free(path);
	{
		size_t n;
		uint8_t *b = slurp(v.bundle, &n);
		int fd;

		path = arch_path(&v, "truncated");
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		T_ASSERT(fd >= 0 && write(fd, b, n / 2) == (ssize_t)(n / 2));
		close(fd);
		T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "truncated zstd stream", NULL) == 0);
		ms_free(path);
		free(b);
	}
	env_free(&v);
	return 0;
}

/* ---- manifests that lie ---- */

struct lie {
	const char *member;
	const char *sha;
	double size;
	const char *state;
	double total;
};

static void apply_lie(cJSON *o, void *ctx)
{
	const struct lie *l = ctx;

	if (l->member) {
		cJSON *m = bundle_member(o, l->member), *f = manifest_file(o, l->member);

		if (l->sha) {
			set_str(m, "sha256", l->sha);
			if (f)
				set_str(f, "sha256", l->sha);
		}
		if (l->size > 0) {
			set_num(m, "size", l->size);
			if (f)
				set_num(f, "size", l->size);
		}
	}
	if (l->state)
		set_str(o, "state", l->state);
	if (l->total > 0)
		set_num(cJSON_GetObjectItem(o, "bundle"), "total_bytes", l->total);
}

static void set_ep(cJSON *o, void *ctx)
{
	cJSON *b = cJSON_GetObjectItem(o, "bundle");

	(void)ctx;
	cJSON_AddNumberToObject(o, "ep_size", 2);
	cJSON_AddNumberToObject(o, "ep_rank", 0);
	set_num(b, "ep_size", 2);
	set_num(b, "ep_rank", 0);
}

static int lying(struct env *v, const char *tag, struct lie *l, const struct hent *replace,
		 const struct ms_bundle_import_opts *o, int code, const char *n1, const char *n2)
{
	char *man = edit_manifest(v, apply_lie, l), *path = arch_path(v, tag);
	int rc;

	if (genuine_plus(v, path, replace ? (long)gm(v, replace->name) : -1, replace, replace ? 1 : 0,
			 man)) {
		fprintf(stderr, "cannot build %s\n", path);
		return 1;
	}
	rc = refused(v, path, o, code, n1, n2);
	free(man);
	ms_free(path);
	return rc;
}

static int test_hostile_lies(void)
{
	struct env v;
	struct lie l;
	struct hent e;
	char hex[65];
	uint8_t *flipped;
	size_t k;
	uint64_t total = 0;

	T_ASSERT(env_setup(&v, "lies") == 0);
	for (size_t i = 1; i < v.n; i++)
		total += v.len[i];
	/* a member digest that is not its bytes' */
	memset(&l, 0, sizeof(l));
	l.member = MEMBERS[1];
	l.sha = "00000000000000000000000000000000000000000000000000000000000000ff";
	T_ASSERT(lying(&v, "member-sha", &l, NULL, NULL, MS_ECHECK, "sha256 differs from the manifest",
		       MEMBERS[1]) == 0);
	/* a state digest the tensors do not give */
	memset(&l, 0, sizeof(l));
	l.state = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
	T_ASSERT(lying(&v, "state", &l, NULL, NULL, MS_ECHECK, "member 'MANIFEST.json'",
		       "the manifest says sha256:1111") == 0);
	/* tensor bytes changed, the whole-file digest made to match them: only
	 * the tensor digests (and the state they make) tell */
	k = gm(&v, MEMBERS[0]);
	flipped = malloc(v.len[k]);
	memcpy(flipped, v.data[k], v.len[k]);
	flipped[v.len[k] - 3] ^= 0x01;
	sha_hex(flipped, v.len[k], hex);
	memset(&l, 0, sizeof(l));
	l.member = MEMBERS[0];
	l.sha = hex;
	e = (struct hent){MEMBERS[0], 'f', flipped, v.len[k], NULL, 0};
	T_ASSERT(lying(&v, "tensor-bytes", &l, &e, NULL, MS_ECHECK, "bytes do not match the manifest's sha256",
		       "tensor '") == 0);
	free(flipped);
	/* an EP placement for a base state: refused by the registration itself,
	 * after the directory was moved into place, which is then taken back */
	{
		char *man, *path = arch_path(&v, "ep");

		man = edit_manifest(&v, set_ep, NULL);
		T_ASSERT(genuine_plus(&v, path, -1, NULL, 0, man) == 0);
		T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "cannot register the state", "EP placement") == 0);
		free(man);
		ms_free(path);
	}
	/* a total that is not the sum */
	memset(&l, 0, sizeof(l));
	l.total = (double)(total - 1);
	T_ASSERT(lying(&v, "total", &l, NULL, NULL, MS_EINVAL, "\"total_bytes\"", NULL) == 0);
	env_free(&v);
	return 0;
}

/* A tar stream far larger than its archive. First 200 MB of zeros honestly
 * declared, with a small cap: refused from the manifest, before any of it is
 * written. Then undeclared framing (a chain of pax headers, 1 MiB each, made
 * by hand and compressed by libarchive's raw writer) that passes the ratio:
 * stopped by the decompressor, whatever the tar layer wanted. */
static void tar_header(uint8_t h[512], const char *name, char type, uint64_t size)
{
	unsigned sum = 0;

	memset(h, 0, 512);
	snprintf((char *)h, 100, "%s", name);
	memcpy(h + 100, "0000644", 8);
	memcpy(h + 108, "0000000", 8);
	memcpy(h + 116, "0000000", 8);
	snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
	memcpy(h + 136, "00000000000", 12);
	memset(h + 148, ' ', 8);
	h[156] = (uint8_t)type;
	memcpy(h + 257, "ustar", 6);
	memcpy(h + 263, "00", 2);
	for (int i = 0; i < 512; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	h[155] = ' ';
}

static int write_raw(struct archive *a, const void *p, size_t n)
{
	return archive_write_data(a, p, n) == (la_ssize_t)n ? 0 : -1;
}

static int test_hostile_bombs(void)
{
	struct env v;
	struct lie l;
	struct hent e;
	struct ms_bundle_import_opts o;
	char *path;
	double t0;

	T_ASSERT(env_setup(&v, "bombs") == 0);
	memset(&l, 0, sizeof(l));
	l.member = MEMBERS[0];
	l.size = 200e6;
	l.total = 200e6;
	for (size_t i = 2; i < v.n; i++)
		l.total += (double)v.len[i];
	e = (struct hent){MEMBERS[0], 'f', NULL, 0, NULL, 200000000};
	ms_bundle_import_opts_init(&o);
	o.max_total = 16u << 20;
	t0 = ms_now();
	T_ASSERT(lying(&v, "zeros", &l, &e, &o, MS_EINVAL, "member 'MANIFEST.json'",
		       "over the limit of 16777216") == 0);
	/* the default cap (1 TiB) takes it; the declared size still binds */
	{
		char *p = arch_path(&v, "zeros");
		struct ms_bundle_import_plan *plan = NULL;
		struct ms_err err = {0};

		T_ASSERT_EQ_INT(ms_bundle_import_plan_read(p, NULL, &plan, &err), MS_OK);
		T_ASSERT_EQ_INT(plan->total_bytes, (uint64_t)l.total);
		ms_bundle_import_plan_free(plan);
		ms_free(p);
	}

	/* the ratio */
	path = arch_path(&v, "pax-chain");
	{
		struct archive *a = archive_write_new();
		struct archive_entry *en = archive_entry_new();
		static uint8_t zero[1 << 20];
		uint8_t h[512];
		size_t pad = (512 - v.len[0] % 512) % 512;

		T_ASSERT(archive_write_add_filter_zstd(a) == ARCHIVE_OK);
		T_ASSERT(archive_write_set_format_raw(a) == ARCHIVE_OK);
		T_ASSERT(archive_write_open_filename(a, path) == ARCHIVE_OK);
		archive_entry_set_pathname(en, "raw");
		archive_entry_set_filetype(en, AE_IFREG);
		T_ASSERT(archive_write_header(a, en) == ARCHIVE_OK);
		archive_entry_free(en);
		tar_header(h, "MANIFEST.json", '0', v.len[0]);
		T_ASSERT(write_raw(a, h, 512) == 0 && write_raw(a, v.data[0], v.len[0]) == 0 &&
			 write_raw(a, zero, pad) == 0);
		for (int i = 0; i < 30; i++) {
			tar_header(h, "PaxHeader/x", 'x', sizeof(zero));
			T_ASSERT(write_raw(a, h, 512) == 0 && write_raw(a, zero, sizeof(zero)) == 0);
		}
		T_ASSERT(archive_write_close(a) == ARCHIVE_OK);
		archive_write_free(a);
	}
	T_ASSERT(refused(&v, path, NULL, MS_EINVAL, "decompression bomb", "times the archive") == 0);
	ms_free(path);
	T_ASSERT_MSG(ms_now() - t0 < 20, "bombs took %.1f s", ms_now() - t0);
	env_free(&v);
	return 0;
}

/* Manifest paths the members must not have, and files the directory would
 * not present as the state. */
static void rename_member(cJSON *o, void *ctx)
{
	const char *const *names = ctx;
	cJSON *m = bundle_member(o, names[0]), *f = manifest_file(o, names[0]);

	set_str(m, "path", names[1]);
	if (f) {
		set_str(f, "path", names[1]);
	} else {
		cJSON *c;

		cJSON_ArrayForEach(c, cJSON_GetObjectItem(o, "configs"))
			if (!strcmp(cJSON_GetObjectItem(c, "path")->valuestring, names[0]))
				set_str(c, "path", names[1]);
	}
}

static int renamed(struct env *v, const char *tag, const char *from, const char *to, int code,
		   const char *n1, const char *n2)
{
	const char *names[2] = {from, to};
	char *man = edit_manifest(v, rename_member, (void *)names), *path = arch_path(v, tag);
	struct hent e = {to, 'f', v->data[gm(v, from)], v->len[gm(v, from)], NULL, 0};
	int rc;

	if (genuine_plus(v, path, (long)gm(v, from), &e, 1, man))
		return 1;
	rc = refused(v, path, NULL, code, n1, n2);
	free(man);
	ms_free(path);
	return rc;
}

static int test_hostile_manifest_paths(void)
{
	struct env v;

	T_ASSERT(env_setup(&v, "mpaths") == 0);
	/* the manifest itself lists an escaping path */
	T_ASSERT(renamed(&v, "m-dotdot", MEMBERS[0], "../model.safetensors", MS_EINVAL,
			 "member 'MANIFEST.json'", "not a plain relative path") == 0);
	T_ASSERT(renamed(&v, "m-reserved", "config.json", "MANIFEST.json", MS_EINVAL,
			 "reserved for the manifest", NULL) == 0);
	/* a tensor file the checkpoint reader does not see (hidden name): the
	 * index, carried with the checkpoint, names the file it replaced */
	T_ASSERT(renamed(&v, "m-hidden", MEMBERS[1], ".hidden.safetensors", MS_EINVAL,
			 "member 'model.safetensors.index.json'", "which does not exist") == 0);
	/* a configuration away from the tensor files */
	T_ASSERT(renamed(&v, "m-config-away", "config.json", "elsewhere/config.json", MS_EINVAL,
			 "member 'elsewhere/config.json'", "not read as a configuration") == 0);
	env_free(&v);
	return 0;
}

/* A manifest of many members, each in its own directories: checking it
 * stays linear-ish (sorting), not quadratic in the members. */
static int test_many_members_plan(void)
{
	struct env v;
	struct ms_bundle_import_plan *p = NULL;
	struct ms_err err = {0};
	struct ms_buf b;
	struct hent h;
	char *path, hex[65];
	double t0;
	const int n = 50000;

	T_ASSERT(env_setup(&v, "many") == 0);
	/* the state of no tensors: the canonical manifest's first line alone */
	sha_hex("msinv-state-v1\n", 15, hex);
	ms_buf_init(&b);
	ms_buf_printf(&b, "{\"format\":\"msinv-manifest-v1\",\"state\":\"sha256:%s\",\"files\":[",
		      hex);
	for (int i = 0; i < n; i++)
		ms_buf_printf(&b, "%s{\"path\":\"d%d/a/b/x.safetensors\",\"size\":0,\"header_sha256\":\"%064d\",\"tensors\":[]}",
			      i ? "," : "", i, 0);
	ms_buf_puts(&b, "],\"bundle\":{\"format\":\"msinv-bundle-v1\",\"total_bytes\":0,\"members\":[");
	for (int i = 0; i < n; i++)
		ms_buf_printf(&b, "%s{\"path\":\"d%d/a/b/x.safetensors\",\"size\":0,\"sha256\":\"%064d\"}",
			      i ? "," : "", i, 0);
	ms_buf_puts(&b, "]}}");
	T_ASSERT(!b.oom);
	h = (struct hent){"MANIFEST.json", 'f', b.data, b.len, NULL, 0};
	path = arch_path(&v, "many");
	T_ASSERT(write_archive(path, &h, 1, 1) == 0);
	t0 = ms_now();
	T_ASSERT_MSG(ms_bundle_import_plan_read(path, NULL, &p, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_MSG(ms_now() - t0 < 5, "%.1f s", ms_now() - t0);
	T_ASSERT_EQ_INT(p->nmembers, n);
	T_ASSERT_EQ_INT(p->total_bytes, 0);
	ms_bundle_import_plan_free(p);
	ms_buf_release(&b);
	ms_free(path);
	env_free(&v);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_export_layout),
	T_CASE(test_export_deterministic),
	T_CASE(test_export_refuses_changed_files),
	T_CASE(test_round_trip),
	T_CASE(test_non_ascii_name),
	T_CASE(test_plan),
	T_CASE(test_target_and_label),
	T_CASE(test_hostile_paths),
	T_CASE(test_hostile_types),
	T_CASE(test_hostile_members),
	T_CASE(test_hostile_manifest_framing),
	T_CASE(test_hostile_lies),
	T_CASE(test_hostile_bombs),
	T_CASE(test_hostile_manifest_paths),
	T_CASE(test_many_members_plan),
};

T_MAIN(cases)
