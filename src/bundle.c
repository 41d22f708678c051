/*
 * bundle.c: export an inventoried state as one .tar.zst and import such a
 * bundle safely. Layout, rules and limits in bundle.h.
 *
 * Export verifies before it packs: every file is re-hashed (headers,
 * tensors and the whole file, in parallel) against the record, and the
 * whole-file digest is computed again over the very bytes handed to the
 * archive, so the bundle never holds bytes the inventory did not vouch for.
 *
 * Import does its own zstd decompression (libzstd streaming) and feeds the
 * tar reader of libarchive through a read callback; the callback counts
 * every decompressed byte and fails once the limit is passed, so a bomb is
 * stopped inside the tar layer's read-ahead too. Nothing is created from
 * the archive's metadata: names are checked against the manifest, files
 * are created O_EXCL|O_NOFOLLOW below a directory this module made, with
 * mode 0644, and only regular files are ever written.
 */
#include "bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>
#include <cjson/cJSON.h>
#include <zstd.h>

#include "fsutil.h"
#include "hash.h"
#include "inventory.h"
#include "stage.h"
#include "verify.h"

#define IO_BUF (1u << 20)
/* Tar framing allowed per entry on import: a 512-byte header, a pax header
 * for a long path (header + body up to MS_IMPORT_MAX_PATH), data padding. */
#define FRAME_PER_ENTRY (8u << 10)
/* Framing outside entries: end-of-archive blocks, record padding, and one
 * decompressed chunk of read-ahead past them. */
#define FRAME_SLACK (1u << 20)
#define EXPORT_MAX_THREADS 32
#define STR_(x) #x
#define STR(x) STR_(x)

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
	uint64_t r;

	return ms_mul_u64(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	uint64_t r;

	return ms_add_u64(a, b, &r) ? UINT64_MAX : r;
}

/* A name from a hostile archive, fit for a one-line message: control
 * characters become '?', long names are cut. */
static void printable(const char *s, char *out, size_t n)
{
	size_t k = 0;

	for (; *s && k + 4 < n; s++)
		out[k++] = ((unsigned char)*s < 0x20 || *s == 0x7f) ? '?' : *s;
	if (*s && n >= 4) {
		memcpy(out + k, "...", 3);
		k += 3;
	}
	out[k] = 0;
}

/* The rule a member path breaks, or NULL. Paths are relative POSIX paths
 * of plain components; ".." is looked for first so that "a/./../b" is
 * reported as the escape it is. */
static const char *path_rule(const char *p)
{
	size_t n = strlen(p);
	const char *c;

	if (n == 0)
		return "empty path";
	if (p[0] == '/')
		return "absolute path";
	for (c = p;;) {
		const char *e = strchr(c, '/');
		size_t l = e ? (size_t)(e - c) : strlen(c);

		if (l == 2 && c[0] == '.' && c[1] == '.')
			return "path escapes the target directory";
		if (!e)
			break;
		c = e + 1;
	}
	if (n > MS_IMPORT_MAX_PATH)
		return "path longer than 4096 bytes";
	for (c = p, n = 0; (c = strchr(c, '/')); c++)
		if (++n > MS_IMPORT_MAX_DEPTH)
			return "path deeper than 8 directories";
	for (c = p;;) {
		const char *e = strchr(c, '/');
		size_t l = e ? (size_t)(e - c) : strlen(c);

		if (l == 0 || (l == 1 && c[0] == '.'))
			return "path has an empty or '.' component";
		if (l > NAME_MAX)
			return "path component longer than 255 bytes";
		if (!e)
			break;
		c = e + 1;
	}
	for (c = p; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			return "control character in the path";
	return NULL;
}

/* fsync that reports an injected failure like a real one (errno set). */
static int sync_fd(int fd)
{
	if (ms_fault("fsync")) {
		errno = EIO;
		return -1;
	}
	return fsync(fd);
}

/* ==== export ============================================================== */

/* The deepest directory holding every path (absolute paths). */
static char *common_dir(const struct ms_vstate *s)
{
	const char *first = s->nfiles ? s->files[0].path : NULL;
	char *d, *slash;
	size_t n;

	if (!first)
		return NULL;
	d = ms_strdup(first);
	if (!d)
		return NULL;
	slash = strrchr(d, '/');
	if (slash)
		*slash = 0;
	for (size_t i = 0; i < s->nfiles + s->nconfigs; i++) {
		const char *p = i < s->nfiles ? s->files[i].path : s->configs[i - s->nfiles].path;

		for (;;) {
			n = strlen(d);
			if (!strncmp(p, d, n) && p[n] == '/')
				break;
			slash = strrchr(d, '/');
			if (!slash) {
				d[0] = 0;
				break;
			}
			*slash = 0;
		}
	}
	if (!d[0]) {
		ms_free(d);
		return ms_strdup("/");
	}
	return d;
}

/* The opened, hashed file f against its record vf. */
static int export_check_file(const struct ms_vfile *vf, const struct ms_st_file *f,
			     struct ms_err *err)
{
	char a[17], b[17];

	if (f->size != vf->size)
		return ms_err_set(err, MS_ECHECK,
				  "'%s': %llu bytes, the inventory records %llu; not exporting it",
				  vf->path, (unsigned long long)f->size, (unsigned long long)vf->size);
	if (vf->has_header_digest && memcmp(f->header_digest, vf->header_digest, 32))
		return ms_err_set(err, MS_ECHECK,
				  "'%s': header differs from the inventory record; not exporting it",
				  vf->path);
	if (f->ntensors != vf->ntensors)
		return ms_err_set(err, MS_ECHECK,
				  "'%s': %zu tensors, the inventory records %zu; not exporting it",
				  vf->path, f->ntensors, vf->ntensors);
	for (size_t i = 0; i < vf->ntensors; i++) {
		const struct ms_vtensor *vt = &vf->tensors[i];
		const struct ms_tensor *t = ms_st_find(f, vt->name);

		if (!t)
			return ms_err_set(err, MS_ECHECK,
					  "'%s': tensor '%s' missing; not exporting the file",
					  vf->path, vt->name);
		if (t->dtype != vt->dtype || t->ndim != vt->ndim || t->offset != vt->offset ||
		    t->nbytes != vt->nbytes ||
		    memcmp(t->shape, vt->shape, sizeof(uint64_t) * vt->ndim))
			return ms_err_set(err, MS_ECHECK,
					  "'%s': tensor '%s': dtype, shape or offset differ from the inventory record; not exporting the file",
					  vf->path, vt->name);
		if (memcmp(t->digest, vt->digest, 32)) {
			ms_hex(t->digest, 8, a);
			ms_hex(vt->digest, 8, b);
			return ms_err_set(err, MS_ECHECK,
					  "'%s': tensor '%s': digest mismatch (%s..., recorded %s...); not exporting the file",
					  vf->path, vt->name, a, b);
		}
	}
	if (vf->has_file_digest && memcmp(f->file_digest, vf->file_digest, 32))
		return ms_err_set(err, MS_ECHECK,
				  "'%s': whole-file sha256 differs from the inventory record; not exporting it",
				  vf->path);
	return MS_OK;
}

struct exporter {
	const char *out;
	struct archive *a;
	struct ms_afile af;
	int write_errno;
	uint8_t *buf;
	/* progress (the inventory handle's, NULL: none) of the two passes, the
	 * verification [0, size] then the packing [size, 2 size], size being
	 * the bytes of the state's files */
	const struct ms_progress *pr;
	uint64_t size, done;
};

/* The verification pass hashes the tensors and the whole files: its bytes
 * are scaled to the first half of the export's progress. */
static void export_hash_progress(void *arg, uint64_t done, uint64_t total)
{
	struct exporter *x = arg;

	x->pr->fn(x->pr->arg, total ? (uint64_t)((double)done / (double)total * (double)x->size) : 0,
		  2 * x->size);
}

static la_ssize_t export_write(struct archive *a, void *ctx, const void *p, size_t n)
{
	struct exporter *x = ctx;

	if (ms_write_all(x->af.fd, p, n)) {
		x->write_errno = errno ? errno : EIO;
		archive_set_error(a, x->write_errno, "%s", strerror(x->write_errno));
		return -1;
	}
	x->af.written += n;
	return (la_ssize_t)n;
}

static int export_fail(struct exporter *x, struct ms_err *err)
{
	if (x->write_errno)
		return ms_err_set(err, MS_EIO, "'%s': write failed: %s", x->out,
				  strerror(x->write_errno));
	return ms_err_set(err, MS_EIO, "'%s': cannot write the archive: %s", x->out,
			  archive_error_string(x->a) ? archive_error_string(x->a) : "unknown error");
}

static int export_header(struct exporter *x, const char *name, uint64_t size,
			 struct ms_err *err)
{
	struct archive_entry *e = archive_entry_new();
	int r;

	if (!e)
		return ms_err_nomem(err);
	/* fixed metadata: the bytes depend on the state alone */
	archive_entry_set_pathname(e, name);
	archive_entry_set_filetype(e, AE_IFREG);
	archive_entry_set_perm(e, 0644);
	archive_entry_set_size(e, (la_int64_t)size);
	archive_entry_set_mtime(e, 0, 0);
	archive_entry_set_uid(e, 0);
	archive_entry_set_gid(e, 0);
	archive_entry_set_uname(e, "root");
	archive_entry_set_gname(e, "root");
	r = archive_write_header(x->a, e);
	archive_entry_free(e);
	return r == ARCHIVE_OK ? MS_OK : export_fail(x, err);
}

static int export_data(struct exporter *x, const void *p, size_t n, struct ms_err *err)
{
	const char *c = p;

	while (n) {
		la_ssize_t w = archive_write_data(x->a, c, n);

		if (w <= 0)
			return export_fail(x, err);
		c += w;
		n -= (size_t)w;
	}
	return MS_OK;
}

/* Pack the file at src (recorded as vf) under name, hashing what is packed:
 * it must be the verified file, byte for byte. */
static int export_file(struct exporter *x, const struct ms_vfile *vf, const char *name,
		       struct ms_err *err)
{
	struct ms_sha256_ctx *h = NULL;
	uint8_t d[MS_SHA256_LEN];
	uint64_t left = vf->size;
	struct stat st;
	int fd, rc;

	fd = open(vf->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ms_err_set(err, MS_ECHECK, "'%s': cannot open: %s; not exporting it",
				  vf->path, strerror(errno));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != vf->size) {
		rc = ms_err_set(err, MS_ECHECK,
				"'%s': changed while being exported (no longer a regular file of %llu bytes)",
				vf->path, (unsigned long long)vf->size);
		goto out;
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	if (!(h = ms_sha256_new())) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = export_header(x, name, vf->size, err)) != MS_OK)
		goto out;
	while (left) {
		ssize_t r;

		if ((rc = ms_interrupt_check(err)) != MS_OK)
			goto out;
		r = read(fd, x->buf, left < IO_BUF ? (size_t)left : IO_BUF);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = ms_err_set(err, MS_EIO, "'%s': read failed: %s", vf->path,
					strerror(errno));
			goto out;
		}
		if (r == 0) {
			rc = ms_err_set(err, MS_ECHECK, "'%s': shrank while being exported",
					vf->path);
			goto out;
		}
		if (ms_sha256_update(h, x->buf, (size_t)r) != MS_OK) {
			rc = ms_err_set(err, MS_EIO, "sha256 failed");
			goto out;
		}
		if ((rc = export_data(x, x->buf, (size_t)r, err)) != MS_OK)
			goto out;
		left -= (uint64_t)r;
		x->done += (uint64_t)r;
		if (x->pr)
			x->pr->fn(x->pr->arg, x->size + x->done, 2 * x->size);
	}
	if (ms_sha256_final(h, d) != MS_OK) {
		rc = ms_err_set(err, MS_EIO, "sha256 failed");
		goto out;
	}
	if (memcmp(d, vf->file_digest, 32)) {
		rc = ms_err_set(err, MS_ECHECK,
				"'%s': changed while being exported (the bytes packed are not the bytes verified)",
				vf->path);
		goto out;
	}
	rc = MS_OK;
out:
	ms_sha256_free(h);
	close(fd);
	return rc;
}

static int ascii(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s >= 0x80)
			return 0;
	return 1;
}

static cJSON *json_str_or_null(const char *s)
{
	return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

/* The manifest of s with the "bundle" object; member paths are taken from
 * the manifest itself so the two cannot disagree. */
static int export_manifest(const struct ms_vstate *s, const struct ms_inv_state *st,
			   const char *root, const size_t *clen, cJSON **out,
			   struct ms_err *err)
{
	cJSON *o = NULL, *b, *members, *files, *configs, *it, *experts = NULL;
	char *json = NULL, hex[65];
	uint64_t total = 0;
	size_t i;
	int rc, nomem;

	*out = NULL;
	if ((rc = ms_manifest_write(s, root, &json, err)) != MS_OK)
		return rc;
	/* our own text: a failed parse is a failed allocation */
	o = ms_json_parse(json, strlen(json), NULL);
	ms_free(json);
	files = cJSON_GetObjectItemCaseSensitive(o, "files");
	configs = cJSON_GetObjectItemCaseSensitive(o, "configs");
	if (!o || cJSON_GetArraySize(files) != (int)s->nfiles ||
	    cJSON_GetArraySize(configs) != (int)s->nconfigs)
		goto oom;
	b = cJSON_AddObjectToObject(o, "bundle");
	if (!b || !cJSON_AddStringToObject(b, "format", MS_BUNDLE_FORMAT) ||
	    !(members = cJSON_AddArrayToObject(b, "members")))
		goto oom;
	i = 0;
	cJSON_ArrayForEach(it, files) {
		const cJSON *p = cJSON_GetObjectItemCaseSensitive(it, "path");
		cJSON *m = cJSON_CreateObject();

		if (!m || !cJSON_IsString(p)) {
			cJSON_Delete(m);
			goto oom;
		}
		cJSON_AddItemToArray(members, m);
		ms_hex(s->files[i].file_digest, 32, hex);
		if (!cJSON_AddStringToObject(m, "path", p->valuestring) ||
		    !cJSON_AddNumberToObject(m, "size", (double)s->files[i].size) ||
		    !cJSON_AddStringToObject(m, "sha256", hex))
			goto oom;
		total += s->files[i].size;
		i++;
	}
	i = 0;
	cJSON_ArrayForEach(it, configs) {
		const cJSON *p = cJSON_GetObjectItemCaseSensitive(it, "path");
		cJSON *m = cJSON_CreateObject();

		if (!m || !cJSON_IsString(p)) {
			cJSON_Delete(m);
			goto oom;
		}
		cJSON_AddItemToArray(members, m);
		ms_hex(s->configs[i].digest, 32, hex);
		if (!cJSON_AddStringToObject(m, "path", p->valuestring) ||
		    !cJSON_AddNumberToObject(m, "size", (double)clen[i]) ||
		    !cJSON_AddStringToObject(m, "sha256", hex))
			goto oom;
		total += clen[i];
		i++;
	}
	if (!cJSON_AddNumberToObject(b, "total_bytes", (double)total) ||
	    !ms_json_put(b, "kind", json_str_or_null(s->kind)) ||
	    !ms_json_put(b, "label", json_str_or_null(s->label)) ||
	    !ms_json_put(b, "layout", json_str_or_null(s->layout)))
		goto oom;
	if (s->ep_size > 0) {
		if (!cJSON_AddNumberToObject(b, "ep_size", s->ep_size) ||
		    !cJSON_AddNumberToObject(b, "ep_rank", s->ep_rank))
			goto oom;
	} else if (!cJSON_AddNullToObject(b, "ep_size") || !cJSON_AddNullToObject(b, "ep_rank")) {
		goto oom;
	}
	if (st->experts && !(experts = ms_json_parse(st->experts, strlen(st->experts), &nomem))) {
		if (nomem)
			goto oom;
		cJSON_Delete(o);
		return ms_err_set(err, MS_EDB, "state %s: recorded experts are not JSON", s->digest);
	}
	if (!experts && !(experts = cJSON_CreateNull()))
		goto oom;
	if (!ms_json_put(b, "experts", experts))
		goto oom;
	*out = o;
	return MS_OK;
oom:
	cJSON_Delete(o);
	return ms_err_nomem(err);
}

int ms_bundle_export(struct ms_inv *inv, const char *digest, const char *out_path, int force,
		    int nthreads, struct ms_err *err)
{
	struct ms_inv_state *st = NULL;
	struct ms_vstate *vs = NULL;
	struct ms_st_file **files = NULL;
	struct exporter x;
	char **ctext = NULL, *root = NULL, *mtext = NULL, threads[16];
	size_t *clen = NULL, nopen = 0;
	cJSON *mo = NULL, *mfiles, *mconfigs, *it;
	struct stat sb;
	size_t i;
	int rc, aopen = 0, nonascii = 0;

	memset(&x, 0, sizeof(x));
	x.out = out_path;
	x.af.fd = -1;
	if (!force && lstat(out_path, &sb) == 0)
		return ms_err_set(err, MS_EEXIST, "'%s': output exists (use --force to replace it)",
				  out_path);
	if (nthreads <= 0)
		nthreads = ms_ncpus();
	if ((rc = ms_inv_state_get(inv, digest, &st, err)) != MS_OK)
		goto out;
	if ((rc = ms_vstate_from_inv(inv, digest, 0, &vs, err)) != MS_OK)
		goto out;
	files = ms_calloc(vs->nfiles + 1, sizeof(*files));
	ctext = ms_calloc(vs->nconfigs + 1, sizeof(*ctext));
	clen = ms_calloc(vs->nconfigs + 1, sizeof(*clen));
	x.buf = ms_malloc(IO_BUF);
	if (!files || !ctext || !clen || !x.buf)
		goto oom;
	/* verify everything first, in parallel: nothing is written for a state
	 * whose files no longer match the record */
	for (i = 0; i < vs->nfiles; i++) {
		struct ms_err e = {0};
		int orc = ms_st_open(vs->files[i].path, &files[nopen], &e);

		if (orc == MS_ENOMEM)
			goto oom;
		if (orc == MS_ENOTFOUND || (orc == MS_EIO && stat(vs->files[i].path, &sb))) {
			rc = ms_err_set(err, MS_ECHECK, "'%s': missing (the inventory records it); not exporting",
					vs->files[i].path);
			goto out;
		}
		if (orc != MS_OK) {
			rc = ms_err_set(err, MS_ECHECK, "%s; not exporting it", e.msg);
			goto out;
		}
		nopen++;
	}
	x.pr = ms_inv_progress(inv);
	for (i = 0; i < vs->nfiles; i++)
		x.size += vs->files[i].size;
	if (x.pr) {
		struct ms_progress hp = { export_hash_progress, &x };

		rc = ms_st_hash_files_progress(files, nopen, nthreads, 1, &hp, err);
	} else {
		rc = ms_st_hash_files(files, nopen, nthreads, 1, err);
	}
	if (rc != MS_OK)
		goto out;
	for (i = 0; i < vs->nfiles; i++) {
		if ((rc = export_check_file(&vs->files[i], files[i], err)) != MS_OK)
			goto out;
		memcpy(vs->files[i].file_digest, files[i]->file_digest, 32);
		vs->files[i].has_file_digest = 1;
	}
	for (i = 0; i < nopen; i++)
		ms_st_close(files[i]);
	nopen = 0;
	/* configurations are small: packed from the very buffer verified */
	for (i = 0; i < vs->nconfigs; i++) {
		struct ms_err e = {0};
		uint8_t d[MS_SHA256_LEN];
		int crc = ms_file_read(vs->configs[i].path, MS_CKPT_MAX_SIDE, &ctext[i], &clen[i], &e);

		if (crc == MS_ENOMEM)
			goto oom;
		if (crc != MS_OK) {
			rc = ms_err_set(err, MS_ECHECK, "%s; not exporting the state", e.msg);
			goto out;
		}
		if ((rc = ms_sha256(ctext[i], clen[i], d)) != MS_OK) {
			rc = ms_sha256_err(err, rc);
			goto out;
		}
		if (memcmp(d, vs->configs[i].digest, 32)) {
			rc = ms_err_set(err, MS_ECHECK,
					"'%s': configuration file differs from the inventory record; not exporting it",
					vs->configs[i].path);
			goto out;
		}
	}
	if (!(root = common_dir(vs)))
		goto oom;
	if ((rc = export_manifest(vs, st, root, clen, &mo, err)) != MS_OK)
		goto out;
	/* where the state came from travels with it */
	{
		char *lin = NULL;
		cJSON *lo;
		int nomem;

		if ((rc = ms_inv_lineage_export(inv, digest, &lin, err)) != MS_OK)
			goto out;
		lo = ms_json_parse(lin, strlen(lin), &nomem);
		ms_free(lin);
		if (!lo || !ms_json_put(cJSON_GetObjectItemCaseSensitive(mo, "bundle"), "lineage", lo))
			goto oom;
	}
	if (!(mtext = cJSON_Print(mo)))
		goto oom;
	mfiles = cJSON_GetObjectItemCaseSensitive(mo, "files");
	mconfigs = cJSON_GetObjectItemCaseSensitive(mo, "configs");

	cJSON_ArrayForEach(it, mfiles)
		nonascii |= !ascii(cJSON_GetObjectItemCaseSensitive(it, "path")->valuestring);
	cJSON_ArrayForEach(it, mconfigs)
		nonascii |= !ascii(cJSON_GetObjectItemCaseSensitive(it, "path")->valuestring);

	if ((rc = ms_afile_open(&x.af, out_path, force, err)) != MS_OK)
		goto out;
	aopen = 1;
	if (!(x.a = archive_write_new()))
		goto oom;
	/* more workers than this only add buffers: the disk is the limit */
	snprintf(threads, sizeof(threads), "%d", nthreads < EXPORT_MAX_THREADS ? nthreads : EXPORT_MAX_THREADS);
	/* zstd's multithreaded output does not depend on the number of workers
	 * (at least one): the bundle is the same on every host */
	if (archive_write_add_filter_zstd(x.a) != ARCHIVE_OK ||
	    archive_write_set_filter_option(x.a, "zstd", "compression-level",
					    STR(MS_EXPORT_LEVEL)) != ARCHIVE_OK ||
	    archive_write_set_filter_option(x.a, "zstd", "threads", threads) != ARCHIVE_OK ||
	    archive_write_set_format_pax_restricted(x.a) != ARCHIVE_OK ||
	    /* a name that is not ASCII is stored as the bytes it is, whatever
	     * the locale (pax "hdrcharset=BINARY" headers); ASCII names need
	     * no pax header at all */
	    (nonascii && archive_write_set_format_option(x.a, "pax", "hdrcharset", "BINARY") != ARCHIVE_OK) ||
	    archive_write_set_bytes_per_block(x.a, (int)IO_BUF) != ARCHIVE_OK ||
	    archive_write_set_bytes_in_last_block(x.a, 1) != ARCHIVE_OK) {
		rc = ms_err_set(err, MS_EIO, "'%s': libarchive cannot write zstd-compressed tar: %s",
				out_path, archive_error_string(x.a) ? archive_error_string(x.a) : "?");
		goto out;
	}
	if (archive_write_open(x.a, &x, NULL, export_write, NULL) != ARCHIVE_OK) {
		rc = export_fail(&x, err);
		goto out;
	}
	if ((rc = export_header(&x, MS_BUNDLE_MANIFEST, strlen(mtext), err)) != MS_OK ||
	    (rc = export_data(&x, mtext, strlen(mtext), err)) != MS_OK)
		goto out;
	i = 0;
	cJSON_ArrayForEach(it, mfiles) {
		const char *rel = cJSON_GetObjectItemCaseSensitive(it, "path")->valuestring;

		if ((rc = export_file(&x, &vs->files[i++], rel, err)) != MS_OK)
			goto out;
	}
	i = 0;
	cJSON_ArrayForEach(it, mconfigs) {
		const char *rel = cJSON_GetObjectItemCaseSensitive(it, "path")->valuestring;

		if ((rc = export_header(&x, rel, clen[i], err)) != MS_OK ||
		    (rc = export_data(&x, ctext[i], clen[i], err)) != MS_OK)
			goto out;
		i++;
	}
	if (archive_write_close(x.a) != ARCHIVE_OK) {
		rc = export_fail(&x, err);
		goto out;
	}
	rc = ms_afile_commit(&x.af, force, err);
	goto out;
oom:
	rc = ms_err_nomem(err);
out:
	if (x.a)
		archive_write_free(x.a);
	if (aopen)
		ms_afile_abort(&x.af);
	for (i = 0; i < nopen; i++)
		ms_st_close(files[i]);
	ms_free(files);
	for (i = 0; vs && ctext && i < vs->nconfigs; i++)
		ms_free(ctext[i]);
	ms_free(ctext);
	ms_free(clen);
	ms_free(x.buf);
	ms_free(root);
	cJSON_free(mtext);
	cJSON_Delete(mo);
	ms_vstate_free(vs);
	ms_inv_state_free(st);
	return rc;
}

/* ==== import: the decompressing reader ===================================== */

enum zin_why { ZIN_OK, ZIN_BOMB, ZIN_ZSTD, ZIN_TRUNCATED, ZIN_EMPTY, ZIN_IO };

struct zin {
	int fd;
	ZSTD_DCtx *z;
	uint8_t *in, *out;
	size_t in_cap, out_cap;
	ZSTD_inBuffer ib;
	uint64_t in_bytes, out_bytes, limit;
	size_t hint;          /* last ZSTD_decompressStream result: 0 at a frame end */
	int eof;
	enum zin_why why;
	const char *zmsg;
	int err_no;
};

static la_ssize_t zin_read(struct archive *a, void *ctx, const void **buf)
{
	struct zin *z = ctx;

	for (;;) {
		ZSTD_outBuffer ob = {z->out, z->out_cap, 0};
		size_t ret;

		if (z->ib.pos == z->ib.size && !z->eof) {
			ssize_t r = read(z->fd, z->in, z->in_cap);

			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				z->why = ZIN_IO;
				z->err_no = errno;
				archive_set_error(a, errno, "read failed");
				return -1;
			}
			if (r == 0)
				z->eof = 1;
			z->ib.src = z->in;
			z->ib.size = (size_t)r;
			z->ib.pos = 0;
			z->in_bytes += (uint64_t)r;
		}
		if (z->ib.pos == z->ib.size && z->eof) {
			if (z->in_bytes == 0) {
				z->why = ZIN_EMPTY;
				archive_set_error(a, EINVAL, "empty file");
				return -1;
			}
			if (z->hint != 0) {
				z->why = ZIN_TRUNCATED;
				archive_set_error(a, EINVAL, "truncated zstd stream");
				return -1;
			}
			return 0;
		}
		ret = ZSTD_decompressStream(z->z, &ob, &z->ib);
		if (ZSTD_isError(ret)) {
			z->why = ZIN_ZSTD;
			z->zmsg = ZSTD_getErrorName(ret);
			archive_set_error(a, EINVAL, "zstd: %s", z->zmsg);
			return -1;
		}
		z->hint = ret;
		if (ob.pos) {
			z->out_bytes += ob.pos;
			if (z->out_bytes > z->limit) {
				z->why = ZIN_BOMB;
				archive_set_error(a, EINVAL, "decompression bomb");
				return -1;
			}
			*buf = z->out;
			return (la_ssize_t)ob.pos;
		}
	}
}

/* ==== import: the manifest ================================================= */

struct importer {
	const char *apath;
	int fd;
	struct zin z;
	struct archive *a;
	uint64_t max_total, max_ratio;
	struct ms_bundle_import_plan *plan;
	struct ms_vstate *vs;
	char *manifest;
	size_t manifest_len;
	size_t *order;           /* member indexes sorted by path */
	int *vidx;               /* member -> index in vs->files or vs->configs */
	char **dirs;             /* directories the member paths imply, sorted */
	size_t ndirs;
	uint8_t *seen, *dir_seen;
	uint8_t *buf;
	const struct ms_progress *pr;   /* extraction progress, NULL: none */
	uint64_t done;                  /* member bytes extracted */
};

static int fail_archive(struct importer *x, struct ms_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail_archive(struct importer *x, struct ms_err *err, int code, const char *fmt, ...)
{
	char what[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return ms_err_set(err, code, "'%s': %s", x->apath, what);
}

static int fail_member(struct importer *x, struct ms_err *err, int code, const char *member,
		       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int fail_member(struct importer *x, struct ms_err *err, int code, const char *member,
		       const char *fmt, ...)
{
	char what[768], name[300];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	printable(member, name, sizeof(name));
	return ms_err_set(err, code, "'%s': member '%s': %s", x->apath, name, what);
}

/* A failure reported by libarchive, explained by what the reader saw. */
static int fail_read(struct importer *x, struct ms_err *err, const char *member)
{
	char what[700];
	int code = MS_EINVAL;

	switch (x->z.why) {
	case ZIN_BOMB:
		snprintf(what, sizeof(what),
			 "decompression bomb: the tar stream passed %llu bytes from a %llu-byte archive (limit: %llu times the archive, or the declared total plus framing)",
			 (unsigned long long)x->z.limit, (unsigned long long)x->plan->archive_bytes,
			 (unsigned long long)x->max_ratio);
		break;
	case ZIN_ZSTD:
		snprintf(what, sizeof(what), "not a valid zstd stream (%s)", x->z.zmsg);
		break;
	case ZIN_TRUNCATED:
		snprintf(what, sizeof(what), "truncated zstd stream");
		break;
	case ZIN_EMPTY:
		snprintf(what, sizeof(what), "empty file, not a zstd-compressed tar archive");
		break;
	case ZIN_IO:
		code = MS_EIO;
		snprintf(what, sizeof(what), "read failed: %s", strerror(x->z.err_no));
		break;
	default:
		snprintf(what, sizeof(what), "damaged tar stream (%s)",
			 archive_error_string(x->a) ? archive_error_string(x->a) : "unknown error");
	}
	if (member)
		return fail_member(x, err, code, member, "%s", what);
	return fail_archive(x, err, code, "%s", what);
}

/* Why an entry is not a regular file we may write, or NULL. */
static const char *type_rule(struct archive_entry *e)
{
	if (archive_entry_hardlink(e))
		return "hard link (only regular files are extracted)";
	switch (archive_entry_filetype(e)) {
	case AE_IFREG:
		return archive_entry_sparse_count(e) > 0 ?
			"sparse file (only plain regular files are extracted)" : NULL;
	case AE_IFDIR: return NULL;
	case AE_IFLNK: return "symbolic link (only regular files are extracted)";
	case AE_IFCHR: return "character device (only regular files are extracted)";
	case AE_IFBLK: return "block device (only regular files are extracted)";
	case AE_IFIFO: return "FIFO (only regular files are extracted)";
	case AE_IFSOCK: return "socket (only regular files are extracted)";
	}
	return "unknown file type (only regular files are extracted)";
}

/* Values a JSON text would make (an upper bound): containers, members and
 * elements, counted on the text without parsing it. */
static size_t json_values(const char *s, size_t n)
{
	size_t k = 1;
	int in = 0;

	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (in) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in = 0;
		} else if (c == '"') {
			in = 1;
		} else if (c == ',' || c == '[' || c == '{' || c == ':') {
			k++;
		}
	}
	return k;
}

static int cmp_member(const void *a, const void *b, void *ctx)
{
	const struct ms_bundle_import_member *m = ctx;

	return strcmp(m[*(const size_t *)a].path, m[*(const size_t *)b].path);
}

/* Index of the member named path, or -1. */
static long find_member(const struct importer *x, const char *path)
{
	size_t lo = 0, hi = x->plan->nmembers;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(path, x->plan->members[x->order[mid]].path);

		if (c == 0)
			return (long)x->order[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return -1;
}

static long find_dir(const struct importer *x, const char *path)
{
	char *const *p;

	if (!x->ndirs)
		return -1;
	p = bsearch(&path, x->dirs, x->ndirs, sizeof(*x->dirs), ms_cmp_str);

	return p ? (long)(p - x->dirs) : -1;
}

static int json_u64(const cJSON *v, uint64_t *out)
{
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
	    floor(v->valuedouble) != v->valuedouble)
		return -1;
	*out = (uint64_t)v->valuedouble;
	return 0;
}

/* "bundle".key must be null/absent or equal the manifest's top-level s. */
static int agree_str(struct importer *x, const cJSON *b, const char *key, const char *s,
		     struct ms_err *err)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, key);

	if (!v || cJSON_IsNull(v)) {
		if (!s)
			return MS_OK;
	} else if (cJSON_IsString(v) && s && !strcmp(v->valuestring, s)) {
		return MS_OK;
	}
	return fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
			   "\"bundle\".\"%s\" contradicts the manifest's \"%s\"", key, key);
}

static int agree_int(struct importer *x, const cJSON *b, const char *key, int32_t v32,
		     struct ms_err *err)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, key);
	uint64_t u;

	if (!v || cJSON_IsNull(v)) {
		if (v32 < 0)
			return MS_OK;
	} else if (!json_u64(v, &u) && v32 >= 0 && u == (uint64_t)v32) {
		return MS_OK;
	}
	return fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
			   "\"bundle\".\"%s\" contradicts the manifest's \"%s\"", key, key);
}

/* The state the manifest describes (verify.h's parser, which recomputes
 * the state digest), copied into the plan. */
static int plan_state(struct importer *x, struct ms_err *err)
{
	struct ms_bundle_import_plan *p = x->plan;
	struct ms_err e = {0};
	int rc;

	if (json_values(x->manifest, x->manifest_len) > MS_IMPORT_MAX_JSON_VALUES)
		return fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
				   "more than %u JSON values", MS_IMPORT_MAX_JSON_VALUES);
	rc = ms_manifest_parse(x->manifest, x->manifest_len, MS_BUNDLE_MANIFEST, NULL, &x->vs, &e);
	if (rc == MS_ENOMEM)
		return ms_err_set(err, rc, "out of memory");
	if (rc != MS_OK)
		return ms_err_set(err, rc, "'%s': member %s", x->apath, e.msg);
	memcpy(p->digest, x->vs->digest, MS_STATE_DIGEST_LEN);
	p->ep_size = x->vs->ep_size;
	p->ep_rank = x->vs->ep_rank;
	p->nfiles = x->vs->nfiles;
	p->nconfigs = x->vs->nconfigs;
	for (size_t i = 0; i < x->vs->nfiles; i++)
		p->ntensors += x->vs->files[i].ntensors;
	if ((x->vs->kind && !(p->kind = ms_strdup(x->vs->kind))) ||
	    (x->vs->label && !(p->label = ms_strdup(x->vs->label))) ||
	    (x->vs->layout && !(p->layout = ms_strdup(x->vs->layout))))
		return ms_err_nomem(err);
	if (p->kind) {
		enum ms_inv_kind kind;

		if (ms_inv_kind_parse(p->kind, &kind) != MS_OK)
			return fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST, "unknown kind");
	}
	return MS_OK;
}

/* The "bundle" object's own fields: its format, what it repeats of the
 * state (which must agree), its experts and its lineage. */
static int plan_bundle_fields(struct importer *x, const cJSON *b, struct ms_err *err)
{
	struct ms_bundle_import_plan *p = x->plan;
	const cJSON *v, *ex, *m;
	int rc;

	v = cJSON_GetObjectItemCaseSensitive(b, "format");
	if (!cJSON_IsString(v) || strcmp(v->valuestring, MS_BUNDLE_FORMAT)) {
		rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
				 "\"bundle\".\"format\" is not \"" MS_BUNDLE_FORMAT "\"");
		goto out;
	}
	if ((rc = agree_str(x, b, "kind", p->kind, err)) != MS_OK ||
	    (rc = agree_str(x, b, "label", p->label, err)) != MS_OK ||
	    (rc = agree_str(x, b, "layout", p->layout, err)) != MS_OK ||
	    (rc = agree_int(x, b, "ep_size", p->ep_size, err)) != MS_OK ||
	    (rc = agree_int(x, b, "ep_rank", p->ep_rank, err)) != MS_OK)
		goto out;
	ex = cJSON_GetObjectItemCaseSensitive(b, "experts");
	if (ex && !cJSON_IsNull(ex)) {
		if (!cJSON_IsArray(ex)) {
			rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
					 "\"bundle\".\"experts\" is not an array of expert ids");
			goto out;
		}
		cJSON_ArrayForEach(m, ex) {
			uint64_t id;

			if (json_u64(m, &id)) {
				rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
						 "\"bundle\".\"experts\" is not an array of expert ids");
				goto out;
			}
		}
		if (!(p->experts = cJSON_PrintUnformatted(ex))) {
			rc = ms_err_nomem(err);
			goto out;
		}
	}

	/* optional (bundles of earlier versions have none); checked now, so
	 * a malformed one is refused before anything is extracted */
	v = cJSON_GetObjectItemCaseSensitive(b, "lineage");
	if (v && !cJSON_IsNull(v)) {
		struct ms_err le = {0};

		if (!(p->lineage = cJSON_PrintUnformatted(v))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		if ((rc = ms_inv_lineage_check(p->lineage, strlen(p->lineage), p->digest, &le)) != MS_OK) {
			rc = rc == MS_ENOMEM ? ms_err_set(err, rc, "out of memory")
					     : fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
							   "\"bundle\".%s", le.msg);
			goto out;
		}
	}
	rc = MS_OK;
out:
	return rc;
}

/* "bundle"."members": one entry per file and configuration, each with a
 * path that obeys the path rules, a size and a sha256; none listed twice;
 * *sum: their sizes added up. */
static int plan_members(struct importer *x, const cJSON *b, uint64_t *sum, struct ms_err *err)
{
	struct ms_bundle_import_plan *p = x->plan;
	const cJSON *members = cJSON_GetObjectItemCaseSensitive(b, "members"), *m;
	size_t nm = cJSON_IsArray(members) ? (size_t)cJSON_GetArraySize(members) : 0;
	int rc;

	*sum = 0;
	if (nm == 0 || nm != x->vs->nfiles + x->vs->nconfigs) {
		rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
				 "\"bundle\".\"members\" must list the %zu files and configurations once each",
				 x->vs->nfiles + x->vs->nconfigs);
		goto out;
	}
	p->members = ms_calloc(nm, sizeof(*p->members));
	x->order = ms_calloc(nm, sizeof(*x->order));
	x->vidx = ms_calloc(nm, sizeof(*x->vidx));
	x->seen = ms_calloc(nm, 1);
	if (!p->members || !x->order || !x->vidx || !x->seen) {
		rc = ms_err_nomem(err);
		goto out;
	}
	cJSON_ArrayForEach(m, members) {
		struct ms_bundle_import_member *mm = &p->members[p->nmembers];
		const cJSON *path = cJSON_GetObjectItemCaseSensitive(m, "path");
		const cJSON *sha = cJSON_GetObjectItemCaseSensitive(m, "sha256");
		const char *rule;

		if (!cJSON_IsString(path) || json_u64(cJSON_GetObjectItemCaseSensitive(m, "size"), &mm->size) ||
		    !cJSON_IsString(sha) || strlen(sha->valuestring) != 64 ||
		    ms_unhex(sha->valuestring, mm->sha256, 32)) {
			rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
					 "\"bundle\".\"members\"[%zu] needs \"path\", \"size\" and \"sha256\"",
					 p->nmembers);
			goto out;
		}
		if ((rule = path_rule(path->valuestring)) != NULL) {
			rc = fail_member(x, err, MS_EINVAL, path->valuestring, "%s", rule);
			goto out;
		}
		if (!strcmp(path->valuestring, MS_BUNDLE_MANIFEST)) {
			rc = fail_member(x, err, MS_EINVAL, path->valuestring,
					 "the name is reserved for the manifest");
			goto out;
		}
		if (!(mm->path = ms_strdup(path->valuestring))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		x->vidx[p->nmembers] = -1;
		x->order[p->nmembers] = p->nmembers;
		p->nmembers++;
		if (ms_add_u64(*sum, mm->size, sum)) {
			rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST, "member sizes overflow");
			goto out;
		}
	}
	qsort_r(x->order, nm, sizeof(*x->order), cmp_member, p->members);
	for (size_t i = 1; i < nm; i++)
		if (!strcmp(p->members[x->order[i]].path, p->members[x->order[i - 1]].path)) {
			rc = fail_member(x, err, MS_EINVAL, p->members[x->order[i]].path,
					 "listed twice in the manifest");
			goto out;
		}
	rc = MS_OK;
out:
	return rc;
}

/* Every file and configuration of the state is exactly one member, with
 * the size and sha256 the state gives it. */
static int plan_match_state(struct importer *x, struct ms_err *err)
{
	struct ms_bundle_import_plan *p = x->plan;

	for (size_t i = 0; i < x->vs->nfiles + x->vs->nconfigs; i++) {
		int is_cfg = i >= x->vs->nfiles;
		const char *path = is_cfg ? x->vs->configs[i - x->vs->nfiles].path : x->vs->files[i].path;
		long j = find_member(x, path);

		if (j < 0)
			return fail_member(x, err, MS_EINVAL, path,
					   "in the manifest's %s but not in \"bundle\".\"members\"",
					   is_cfg ? "configs" : "files");
		if (x->vidx[j] >= 0)
			return fail_member(x, err, MS_EINVAL, path, "listed twice in the manifest");
		x->vidx[j] = (int)(is_cfg ? i - x->vs->nfiles : i);
		p->members[j].is_config = is_cfg;
		if (is_cfg) {
			if (memcmp(p->members[j].sha256, x->vs->configs[i - x->vs->nfiles].digest, 32))
				return fail_member(x, err, MS_ECHECK, path,
						   "the manifest gives it two different sha256");
		} else {
			const struct ms_vfile *vf = &x->vs->files[i];

			if (vf->size != p->members[j].size ||
			    (vf->has_file_digest && memcmp(vf->file_digest, p->members[j].sha256, 32)))
				return fail_member(x, err, MS_ECHECK, path,
						   "the manifest gives it two different sizes or sha256");
		}
	}
	return MS_OK;
}

/* The directories the member paths imply, sorted; none may also be a
 * member. In path order the paths under one directory are adjacent, so a
 * directory is new unless the previous path is under it: linear in the
 * paths even when a hostile manifest makes them many. */
static int plan_dirs(struct importer *x, struct ms_err *err)
{
	struct ms_bundle_import_plan *p = x->plan;
	size_t cap = 0;
	const char *prev = NULL;

	for (size_t k = 0; k < p->nmembers; k++) {
		const char *path = p->members[x->order[k]].path;

		for (const char *s = strchr(path, '/'); s; s = strchr(s + 1, '/')) {
			size_t l = (size_t)(s - path);

			if (prev && !strncmp(prev, path, l + 1))
				continue;
			if (x->ndirs == cap) {
				size_t nc = cap ? 2 * cap : 16;
				char **nd = ms_realloc(x->dirs, nc * sizeof(*nd));

				if (!nd)
					return ms_err_nomem(err);
				x->dirs = nd;
				cap = nc;
			}
			if (!(x->dirs[x->ndirs] = ms_strndup(path, l)))
				return ms_err_nomem(err);
			x->ndirs++;
		}
		prev = path;
	}
	if (x->ndirs)
		qsort(x->dirs, x->ndirs, sizeof(*x->dirs), ms_cmp_str);
	for (size_t i = 0; i < x->ndirs; i++)
		if (find_member(x, x->dirs[i]) >= 0 || !strcmp(x->dirs[i], MS_BUNDLE_MANIFEST))
			return fail_member(x, err, MS_EINVAL, x->dirs[i],
					   "is both a file and the directory of another member");
	if (!(x->dir_seen = ms_calloc(x->ndirs + 1, 1)))
		return ms_err_nomem(err);
	return MS_OK;
}

/* Parse and cross-check the manifest: the state, then the bundle object
 * against it: its fields, its members, their total and their directories. */
static int plan_build(struct importer *x, struct ms_err *err)
{
	struct ms_bundle_import_plan *p = x->plan;
	cJSON *o = NULL;
	const cJSON *b;
	uint64_t sum, total;
	int rc, nomem;

	if ((rc = plan_state(x, err)) != MS_OK)
		return rc;
	o = ms_json_parse(x->manifest, x->manifest_len, &nomem);
	if (!o && nomem) {
		rc = ms_err_nomem(err);
		goto out;
	}
	b = cJSON_GetObjectItemCaseSensitive(o, "bundle");
	if (!cJSON_IsObject(b)) {
		rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST, "no \"bundle\" object");
		goto out;
	}
	if ((rc = plan_bundle_fields(x, b, err)) != MS_OK ||
	    (rc = plan_members(x, b, &sum, err)) != MS_OK ||
	    (rc = plan_match_state(x, err)) != MS_OK)
		goto out;
	if (json_u64(cJSON_GetObjectItemCaseSensitive(b, "total_bytes"), &total)) {
		rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
				 "\"bundle\".\"total_bytes\" is not a byte count");
		goto out;
	}
	if (total != sum) {
		rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
				 "the members add up to %llu bytes, \"bundle\".\"total_bytes\" says %llu",
				 (unsigned long long)sum, (unsigned long long)total);
		goto out;
	}
	p->total_bytes = sum;
	if (sum > x->max_total) {
		rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
				 "the bundle declares %llu bytes, over the limit of %llu",
				 (unsigned long long)sum, (unsigned long long)x->max_total);
		goto out;
	}
	rc = plan_dirs(x, err);
out:
	cJSON_Delete(o);
	return rc;
}

static void importer_init(struct importer *x)
{
	memset(x, 0, sizeof(*x));
	x->fd = -1;
}

static void importer_release(struct importer *x)
{
	if (x->a)
		archive_read_free(x->a);
	if (x->z.z)
		ZSTD_freeDCtx(x->z.z);
	ms_free(x->z.in);
	ms_free(x->z.out);
	if (x->fd >= 0)
		close(x->fd);
	ms_vstate_free(x->vs);
	ms_free(x->manifest);
	ms_free(x->order);
	ms_free(x->vidx);
	for (size_t i = 0; i < x->ndirs; i++)
		ms_free(x->dirs[i]);
	ms_free(x->dirs);
	ms_free(x->seen);
	ms_free(x->dir_seen);
	ms_free(x->buf);
	ms_bundle_import_plan_free(x->plan);
	x->plan = NULL;
}

void ms_bundle_import_opts_init(struct ms_bundle_import_opts *o)
{
	memset(o, 0, sizeof(*o));
}

void ms_bundle_import_plan_free(struct ms_bundle_import_plan *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->nmembers; i++)
		ms_free(p->members[i].path);
	ms_free(p->members);
	ms_free(p->kind);
	ms_free(p->label);
	ms_free(p->layout);
	cJSON_free(p->experts);
	cJSON_free(p->lineage);
	ms_free(p);
}

/* Open the archive and read, parse and check its manifest; the reader is
 * left at the first member after it. */
static int importer_open(struct importer *x, const char *path, const struct ms_bundle_import_opts *o,
			 struct ms_err *err)
{
	struct archive_entry *e;
	struct stat st;
	const char *name, *rule;
	uint64_t size, got = 0;
	int r;

	importer_init(x);
	x->apath = path;
	x->max_total = o && o->max_total ? o->max_total : MS_IMPORT_MAX_TOTAL;
	x->max_ratio = o && o->max_ratio ? o->max_ratio : MS_IMPORT_MAX_RATIO;
	if (!(x->plan = ms_calloc(1, sizeof(*x->plan))))
		return ms_err_nomem(err);
	x->plan->ep_size = x->plan->ep_rank = -1;
	/* O_NONBLOCK: a FIFO given as the archive is refused, not waited on */
	x->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (x->fd < 0)
		return ms_err_set(err, errno == ENOENT ? MS_ENOTFOUND : MS_EIO, "'%s': cannot open: %s",
				  path, strerror(errno));
	if (fstat(x->fd, &st) || !S_ISREG(st.st_mode))
		return fail_archive(x, err, MS_EINVAL, "not a regular file");
	x->plan->archive_bytes = (uint64_t)st.st_size;
	x->z.fd = x->fd;
	x->z.in_cap = ZSTD_DStreamInSize();
	x->z.out_cap = ZSTD_DStreamOutSize();
	x->z.in = ms_malloc(x->z.in_cap);
	x->z.out = ms_malloc(x->z.out_cap);
	x->z.z = ZSTD_createDCtx();
	x->buf = ms_malloc(IO_BUF);
	if (!x->z.in || !x->z.out || !x->z.z || !x->buf)
		return ms_err_nomem(err);
	/* zstd's default window limit (128 MiB), pinned: a frame that asks for
	 * more memory is refused, not honoured */
	ZSTD_DCtx_setParameter(x->z.z, ZSTD_d_windowLogMax, 27);
	/* until the manifest is known: the manifest and its framing */
	x->z.limit = sat_mul(x->max_ratio, x->plan->archive_bytes);
	if (x->z.limit < MS_IMPORT_MAX_MANIFEST + 2 * FRAME_SLACK)
		x->z.limit = MS_IMPORT_MAX_MANIFEST + 2 * FRAME_SLACK;
	if (!(x->a = archive_read_new()))
		return ms_err_nomem(err);
	/* tar alone: no other format, and no filter but ours */
	if (archive_read_support_format_tar(x->a) != ARCHIVE_OK)
		return fail_archive(x, err, MS_EIO, "libarchive: %s", archive_error_string(x->a));
	if (archive_read_open(x->a, &x->z, NULL, zin_read, NULL) != ARCHIVE_OK)
		return fail_read(x, err, NULL);
	r = archive_read_next_header(x->a, &e);
	if (r == ARCHIVE_EOF)
		return fail_archive(x, err, MS_EINVAL, "empty archive (no " MS_BUNDLE_MANIFEST ")");
	if (r != ARCHIVE_OK)
		return fail_read(x, err, NULL);
	name = archive_entry_pathname(e);
	if (!name)
		return fail_archive(x, err, MS_EINVAL, "first member has no readable name");
	if (strcmp(name, MS_BUNDLE_MANIFEST))
		return fail_member(x, err, MS_EINVAL, name,
				   "comes before " MS_BUNDLE_MANIFEST " (the manifest must be the first member)");
	if ((rule = type_rule(e)) || archive_entry_filetype(e) != AE_IFREG)
		return fail_member(x, err, MS_EINVAL, name, "%s", rule ? rule : "not a regular file");
	size = (uint64_t)archive_entry_size(e);
	if (archive_entry_size(e) < 0 || size > MS_IMPORT_MAX_MANIFEST)
		return fail_member(x, err, MS_EINVAL, name, "%llu bytes, over the limit of %llu",
				   (unsigned long long)size, (unsigned long long)MS_IMPORT_MAX_MANIFEST);
	if (!(x->manifest = ms_malloc((size_t)size + 1)))
		return ms_err_nomem(err);
	for (;;) {
		la_ssize_t n = archive_read_data(x->a, x->manifest + got, (size_t)(size + 1 - got));

		if (n < 0)
			return fail_read(x, err, name);
		if (n == 0)
			break;
		got += (uint64_t)n;
		if (got > size)
			return fail_member(x, err, MS_EINVAL, name, "larger than declared");
	}
	if (got != size)
		return fail_member(x, err, MS_EINVAL, name, "shorter than declared (%llu of %llu bytes)",
				   (unsigned long long)got, (unsigned long long)size);
	x->manifest[got] = 0;
	x->manifest_len = (size_t)got;
	x->plan->manifest_bytes = got;
	return plan_build(x, err);
}

int ms_bundle_import_plan_read(const char *archive_path, const struct ms_bundle_import_opts *opts,
			struct ms_bundle_import_plan **out, struct ms_err *err)
{
	struct importer x;
	int rc;

	*out = NULL;
	rc = importer_open(&x, archive_path, opts, err);
	if (rc == MS_OK) {
		*out = x.plan;
		x.plan = NULL;
	}
	importer_release(&x);
	return rc;
}

/* ==== import: extraction ==================================================== */

/* The directory that will hold rel below rootfd, made as needed; *leaf is
 * the last component. Components are never links: this module made them. */
static int open_parent(int rootfd, const char *rel, int *out, const char **leaf)
{
	int cur = rootfd;
	const char *p = rel, *slash;
	char comp[NAME_MAX + 1];

	while ((slash = strchr(p, '/'))) {
		size_t n = (size_t)(slash - p);
		int nfd;

		memcpy(comp, p, n);
		comp[n] = 0;
		if (mkdirat(cur, comp, 0755) && errno != EEXIST) {
			if (cur != rootfd)
				close(cur);
			return -1;
		}
		nfd = openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (cur != rootfd)
			close(cur);
		if (nfd < 0)
			return -1;
		cur = nfd;
		p = slash + 1;
	}
	*out = cur;
	*leaf = p;
	return 0;
}

/* Write the current entry as member j, reading at most one byte past its
 * declared size; its bytes must give the manifest's sha256. */
static int extract_member(struct importer *x, int rootfd, size_t j, struct ms_err *err)
{
	const struct ms_bundle_import_member *m = &x->plan->members[j];
	struct ms_sha256_ctx *h = NULL;
	uint8_t d[MS_SHA256_LEN];
	uint64_t got = 0;
	const char *leaf;
	int dfd = -1, fd = -1, rc;

	if (open_parent(rootfd, m->path, &dfd, &leaf)) {
		rc = fail_member(x, err, MS_EIO, m->path, "cannot create its directory: %s",
				 strerror(errno));
		goto out;
	}
	fd = openat(dfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = fail_member(x, err, MS_EIO, m->path, "cannot create: %s", strerror(errno));
		goto out;
	}
	if (!(h = ms_sha256_new())) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (;;) {
		uint64_t want = m->size + 1 - got;
		la_ssize_t n = archive_read_data(x->a, x->buf, want < IO_BUF ? (size_t)want : IO_BUF);

		if (n < 0) {
			rc = fail_read(x, err, m->path);
			goto out;
		}
		if (n == 0)
			break;
		got += (uint64_t)n;
		if (got > m->size) {
			rc = fail_member(x, err, MS_EINVAL, m->path,
					 "larger than declared (more than the %llu bytes the manifest gives)",
					 (unsigned long long)m->size);
			goto out;
		}
		if (ms_sha256_update(h, x->buf, (size_t)n) != MS_OK) {
			rc = ms_err_set(err, MS_EIO, "sha256 failed");
			goto out;
		}
		if (ms_write_all(fd, x->buf, (size_t)n)) {
			rc = fail_member(x, err, MS_EIO, m->path, "write failed: %s", strerror(errno));
			goto out;
		}
		x->done += (uint64_t)n;
		if (x->pr)
			x->pr->fn(x->pr->arg, x->done, x->plan->total_bytes);
	}
	if (got != m->size) {
		rc = fail_member(x, err, MS_EINVAL, m->path, "shorter than declared (%llu of %llu bytes)",
				 (unsigned long long)got, (unsigned long long)m->size);
		goto out;
	}
	if (ms_sha256_final(h, d) != MS_OK) {
		rc = ms_err_set(err, MS_EIO, "sha256 failed");
		goto out;
	}
	if (memcmp(d, m->sha256, 32)) {
		rc = fail_member(x, err, MS_ECHECK, m->path, "sha256 differs from the manifest");
		goto out;
	}
	if (sync_fd(fd)) {
		rc = fail_member(x, err, MS_EIO, m->path, "fsync failed: %s", strerror(errno));
		goto out;
	}
	rc = MS_OK;
out:
	ms_sha256_free(h);
	if (fd >= 0)
		close(fd);
	if (dfd >= 0 && dfd != rootfd)
		close(dfd);
	return rc;
}

/* Every entry after the manifest: checked, then extracted below rootfd. */
static int extract_all(struct importer *x, int rootfd, struct ms_err *err)
{
	struct archive_entry *e;
	char name[MS_IMPORT_MAX_PATH + 2];
	uint64_t written = 0;
	int rc;

	for (;;) {
		const char *raw, *rule;
		size_t n;
		long j;
		int r = archive_read_next_header(x->a, &e);

		if (r == ARCHIVE_EOF)
			break;
		if (r != ARCHIVE_OK)
			return fail_read(x, err, NULL);
		raw = archive_entry_pathname(e);
		if (!raw)
			return fail_archive(x, err, MS_EINVAL, "a member has no readable name");
		n = strlen(raw);
		if (n > MS_IMPORT_MAX_PATH + 1)
			return fail_member(x, err, MS_EINVAL, raw, "path longer than 4096 bytes");
		memcpy(name, raw, n + 1);
		if (archive_entry_filetype(e) == AE_IFDIR && n > 1 && name[n - 1] == '/')
			name[n - 1] = 0;
		if ((rule = path_rule(name)) != NULL)
			return fail_member(x, err, MS_EINVAL, raw, "%s", rule);
		if ((rule = type_rule(e)) != NULL)
			return fail_member(x, err, MS_EINVAL, raw, "%s", rule);
		if (archive_entry_filetype(e) == AE_IFDIR) {
			/* a directory entry creates nothing; the paths do */
			j = find_dir(x, name);
			if (j < 0)
				return fail_member(x, err, MS_EINVAL, raw, "directory not implied by any member");
			if (x->dir_seen[j])
				return fail_member(x, err, MS_EINVAL, raw, "duplicate entry");
			x->dir_seen[j] = 1;
			continue;
		}
		if (!strcmp(name, MS_BUNDLE_MANIFEST))
			return fail_member(x, err, MS_EINVAL, raw, "duplicate entry");
		j = find_member(x, name);
		if (j < 0)
			return fail_member(x, err, MS_EINVAL, raw, "not listed in the manifest");
		if (x->seen[j])
			return fail_member(x, err, MS_EINVAL, raw, "duplicate entry");
		x->seen[j] = 1;
		if (archive_entry_size_is_set(e) && archive_entry_size(e) >= 0 &&
		    (uint64_t)archive_entry_size(e) > x->plan->members[j].size)
			return fail_member(x, err, MS_EINVAL, raw,
					   "larger than declared (%lld bytes in the archive, %llu in the manifest)",
					   (long long)archive_entry_size(e),
					   (unsigned long long)x->plan->members[j].size);
		if ((rc = extract_member(x, rootfd, (size_t)j, err)) != MS_OK)
			return rc;
		written += x->plan->members[j].size;
		if (written > x->plan->total_bytes)
			return fail_member(x, err, MS_EINVAL, raw, "members exceed the declared total");
	}
	for (size_t i = 0; i < x->plan->nmembers; i++)
		if (!x->seen[i])
			return fail_member(x, err, MS_EINVAL, x->plan->members[i].path,
					   "missing from the archive");
	return MS_OK;
}

/* ==== import: verification, commit =========================================== */

/* The directories to register, relative ("" for the top): those holding a
 * tensor file; the checkpoint reader finds the configurations beside them. */
static int state_dirs(const struct importer *x, char ***out, size_t *n)
{
	char **d = ms_calloc(x->plan->nmembers + 1, sizeof(*d));
	size_t k = 0, w = 0;

	*out = NULL;
	*n = 0;
	if (!d)
		return -1;
	for (size_t i = 0; i < x->plan->nmembers; i++) {
		const char *p = x->plan->members[i].path, *s = strrchr(p, '/');

		if (x->plan->members[i].is_config)
			continue;
		if (!(d[k] = s ? ms_strndup(p, (size_t)(s - p)) : ms_strdup("")))
			goto fail;
		k++;
	}
	qsort(d, k, sizeof(*d), ms_cmp_str);
	for (size_t i = 0; i < k; i++) {
		if (w && !strcmp(d[i], d[w - 1]))
			ms_free(d[i]);
		else
			d[w++] = d[i];
	}
	*out = d;
	*n = w;
	return 0;
fail:
	for (size_t i = 0; i < k; i++)
		ms_free(d[i]);
	ms_free(d);
	return -1;
}

static char **join_all(const char *root, char *const *rel, size_t n)
{
	char **p = ms_calloc(n + 1, sizeof(*p));

	for (size_t i = 0; p && i < n; i++) {
		p[i] = rel[i][0] ? ms_path_join(root, rel[i]) : ms_strdup(root);
		if (!p[i]) {
			for (size_t k = 0; k < i; k++)
				ms_free(p[k]);
			ms_free(p);
			return NULL;
		}
	}
	return p;
}

static void free_all(char **p, size_t n)
{
	for (size_t i = 0; p && i < n; i++)
		ms_free(p[i]);
	ms_free(p);
}

/* A message of the checkpoint reader, with the temporary directory taken
 * out of the paths it names, under the archive's name. */
static int fail_ckpt(struct importer *x, const char *tmp, const struct ms_err *e,
		     struct ms_err *err)
{
	char msg[sizeof(e->msg)];
	const char *s = e->msg;
	size_t tl = strlen(tmp), k = 0;

	while (*s && k + 1 < sizeof(msg)) {
		if (!strncmp(s, tmp, tl) && s[tl] == '/') {
			s += tl + 1;
			continue;
		}
		msg[k++] = *s++;
	}
	msg[k] = 0;
	if (msg[0] == '\'')
		return ms_err_set(err, e->code, "'%s': member %s", x->apath, msg);
	return ms_err_set(err, e->code, "'%s': %s", x->apath, msg);
}

/* Open the extracted directory as the inventory will, hash it, and compare
 * every file, tensor and configuration with the manifest. */
static int verify_extracted(struct importer *x, const char *tmp, char *const *dirs, size_t ndirs,
			    int nthreads, struct ms_err *err)
{
	struct ms_ckpt *ck = NULL;
	struct ms_err e = {0};
	char **paths = join_all(tmp, dirs, ndirs), layout[64], digest[MS_STATE_DIGEST_LEN];
	char *experts = NULL;
	uint8_t *matched = ms_calloc(x->plan->nmembers + 1, 1);
	size_t tl = strlen(tmp);
	enum ms_inv_kind kind;
	int32_t eps, epr;
	int rc;

	if (!paths || !matched) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = ms_ckpt_open_many((const char *const *)paths, ndirs, &ck, &e)) != MS_OK ||
	    (rc = ms_ckpt_hash(ck, nthreads, 0, &e)) != MS_OK) {
		rc = fail_ckpt(x, tmp, &e, err);
		goto out;
	}
	for (size_t i = 0; i < ck->nfiles; i++) {
		const struct ms_st_file *f = ck->files[i];
		const char *rel = f->path + tl + 1;
		long j = find_member(x, rel);
		const struct ms_vfile *vf;

		if (j < 0 || x->plan->members[j].is_config) {
			rc = fail_member(x, err, MS_EINVAL, rel,
					 "read as a tensor file, but the manifest does not list it as one");
			goto out;
		}
		matched[j] = 1;
		vf = &x->vs->files[x->vidx[j]];
		if (memcmp(f->header_digest, vf->header_digest, 32)) {
			rc = fail_member(x, err, MS_ECHECK, rel,
					 "header does not match the manifest's header_sha256");
			goto out;
		}
		if (f->ntensors != vf->ntensors) {
			rc = fail_member(x, err, MS_ECHECK, rel, "holds %zu tensors, the manifest lists %zu",
					 f->ntensors, vf->ntensors);
			goto out;
		}
		for (size_t t = 0; t < vf->ntensors; t++) {
			const struct ms_vtensor *vt = &vf->tensors[t];
			const struct ms_tensor *ft = ms_st_find(f, vt->name);
			char name[300];

			printable(vt->name, name, sizeof(name));
			if (!ft) {
				rc = fail_member(x, err, MS_ECHECK, rel,
						 "tensor '%s' is in the manifest, not in the file", name);
				goto out;
			}
			if (ft->dtype != vt->dtype || ft->ndim != vt->ndim || ft->offset != vt->offset ||
			    ft->nbytes != vt->nbytes ||
			    memcmp(ft->shape, vt->shape, sizeof(uint64_t) * vt->ndim)) {
				rc = fail_member(x, err, MS_ECHECK, rel,
						 "tensor '%s': dtype, shape or offset differ from the manifest",
						 name);
				goto out;
			}
			if (memcmp(ft->digest, vt->digest, 32)) {
				rc = fail_member(x, err, MS_ECHECK, rel,
						 "tensor '%s': bytes do not match the manifest's sha256", name);
				goto out;
			}
		}
	}
	for (size_t i = 0; i < ck->nconfigs; i++) {
		const char *rel = ck->configs[i].path + tl + 1;
		long j = find_member(x, rel);

		if (j < 0 || !x->plan->members[j].is_config) {
			rc = fail_member(x, err, MS_EINVAL, rel,
					 "read as a configuration, but the manifest does not list it as one");
			goto out;
		}
		matched[j] = 1;
		if (memcmp(ck->configs[i].digest, x->plan->members[j].sha256, 32)) {
			rc = fail_member(x, err, MS_ECHECK, rel, "sha256 differs from the manifest");
			goto out;
		}
	}
	for (size_t j = 0; j < x->plan->nmembers; j++)
		if (!matched[j]) {
			rc = fail_member(x, err, MS_EINVAL, x->plan->members[j].path,
					 x->plan->members[j].is_config ?
					 "not read as a configuration of the state (configurations sit beside the tensor files, under the names the reader knows)" :
					 "not read as a tensor file of the state (tensor files end in .safetensors and do not start with '.')");
			goto out;
		}
	if ((rc = ms_state_digest(ck->tensors, ck->ntensors, digest, err)) != MS_OK)
		goto out;
	if (strcmp(digest, x->plan->digest)) {
		rc = fail_archive(x, err, MS_ECHECK, "the files form state %s, the manifest says %s",
				  digest, x->plan->digest);
		goto out;
	}
	if ((rc = ms_inv_classify(ck, &kind, layout, sizeof(layout), &eps, &epr, &experts, &e)) != MS_OK) {
		rc = fail_ckpt(x, tmp, &e, err);
		goto out;
	}
	if (x->plan->layout && strcmp(layout, x->plan->layout)) {
		rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
				 "layout '%s' contradicts the files, which are '%s'", x->plan->layout,
				 layout);
		goto out;
	}
	if (x->plan->ep_size > 0 && eps > 0 && (eps != x->plan->ep_size || epr != x->plan->ep_rank)) {
		rc = fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
				 "EP rank %d of %d contradicts the files (rank %d of %d)", x->plan->ep_rank,
				 x->plan->ep_size, epr, eps);
		goto out;
	}
	rc = MS_OK;
out:
	ms_free(experts);
	ms_ckpt_close(ck);
	free_all(paths, ndirs);
	ms_free(matched);
	return rc;
}

/* The inventory's label rule (inventory.h), checked before any work. */
static int label_ok(const char *l)
{
	size_t n = strlen(l);
	int nonhex = 0;

	if (n == 0 || n > MS_INV_MAX_LABEL || !strncmp(l, "sha256:", 7))
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = l[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      strchr("._:@+/-", c)))
			return 0;
		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
			nonhex = 1;
	}
	return nonhex;
}

/* A directory a previous import made: it holds MANIFEST.json. */
static int holds_manifest(const char *dir)
{
	struct stat st;
	char *m = ms_path_join(dir, MS_BUNDLE_MANIFEST);
	int ok;

	if (!m)
		return 0;
	ok = lstat(m, &st) == 0 && S_ISREG(st.st_mode);
	ms_free(m);
	return ok;
}

/* An existing target --force may replace: an empty directory, or one a
 * previous import made. */
static int replaceable(const char *dir)
{
	struct stat st;
	DIR *d;
	struct dirent *de;
	int empty = 1;

	if (lstat(dir, &st) || !S_ISDIR(st.st_mode) || !(d = opendir(dir)))
		return 0;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = 0;
	closedir(d);
	return empty || holds_manifest(dir);
}

static int fsync_path(int rootfd, const char *rel)
{
	int fd = rel ? openat(rootfd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
		     : dup(rootfd);
	int rc;

	if (fd < 0)
		return -1;
	rc = sync_fd(fd);
	close(fd);
	return rc;
}

/* May a rerun adopt the existing into_dir (target: the same without a
 * trailing '/')? Yes when its MANIFEST.json is the archive's, byte for
 * byte, and no copy of the state is recorded there: what an import killed
 * between moving the directory into place and registering it leaves. Its
 * files are verified afterwards like extracted ones. MS_OK to adopt,
 * MS_EEXIST (the refusal of an existing target) otherwise. */
static int adoptable(struct ms_inv *inv, struct importer *x, const char *target,
		     const char *into_dir, struct ms_err *err)
{
	struct ms_inv_files files = {0};
	struct ms_err e = {0};
	char *m = ms_path_join(target, MS_BUNDLE_MANIFEST), *text = NULL, *real = NULL;
	size_t len = 0, n;
	int rc;

	if (!m)
		return ms_err_nomem(err);
	rc = ms_file_read(m, MS_IMPORT_MAX_MANIFEST, &text, &len, &e);
	ms_free(m);
	if (rc == MS_ENOMEM || rc == MS_EIO) {
		rc = ms_err_set(err, rc, "%s", e.msg);
		goto out;
	}
	if (rc != MS_OK || len != x->manifest_len || memcmp(text, x->manifest, len)) {
		rc = ms_err_set(err, MS_EEXIST,
				"'%s': exists (use --force to replace a previous import)", into_dir);
		goto out;
	}
	rc = ms_inv_state_files(inv, x->plan->digest, 0, 0, &files, &e);
	if (rc == MS_ENOTFOUND) {
		rc = MS_OK;
		goto out;
	}
	if (rc != MS_OK) {
		rc = ms_err_set(err, rc, "%s", e.msg);
		goto out;
	}
	if (!(real = realpath(target, NULL))) {
		rc = ms_err_set(err, MS_EIO, "'%s': %s", into_dir, strerror(errno));
		goto out;
	}
	n = strlen(real);
	for (size_t i = 0; i < files.n; i++)
		if (!strncmp(files.files[i].path, real, n) && files.files[i].path[n] == '/') {
			rc = ms_err_set(err, MS_EEXIST,
					"'%s': exists, and the state is already imported there (use --force to replace it)",
					into_dir);
			break;
		}
out:
	free(real);
	ms_free(text);
	ms_inv_files_release(&files);
	return rc;
}

/* The target of an import: a new name in an existing directory (*target,
 * into_dir without trailing slashes). *exists: something is there; *adopt:
 * what is there is an earlier run of this import, left unregistered (to be
 * decided once the archive's manifest is read); anything else there is
 * replaced only under --force, and only if it is empty or an import. */
static int import_target(const char *into_dir, const struct ms_bundle_import_opts *opts,
			 char **target, int *exists, int *adopt, struct ms_err *err)
{
	char *parent = NULL;
	const char *base;
	struct stat st;
	int rc;

	*exists = *adopt = 0;
	if (!into_dir || !*into_dir) {
		rc = ms_err_set(err, MS_EINVAL, "no target directory given");
		goto out;
	}
	if (!(*target = ms_strdup(into_dir))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t n = strlen(*target); n > 1 && (*target)[n - 1] == '/'; n--)
		(*target)[n - 1] = 0;
	base = ms_path_base(*target);
	if (!ms_name_is_plain(base)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': not a directory name to create", into_dir);
		goto out;
	}
	if (base == *target) {
		parent = ms_strdup(".");
	} else {
		size_t n = (size_t)(base - *target);

		while (n > 1 && (*target)[n - 1] == '/')
			n--;
		parent = ms_strndup(*target, n);
	}
	if (!parent) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (stat(parent, &st) || !S_ISDIR(st.st_mode)) {
		rc = ms_err_set(err, MS_ENOTFOUND, "'%s': the directory to import into does not exist",
				parent);
		goto out;
	}
	*exists = lstat(*target, &st) == 0;
	if (*exists && !opts->force) {
		if (!S_ISDIR(st.st_mode) || !holds_manifest(*target)) {
			rc = ms_err_set(err, MS_EEXIST,
					"'%s': exists (use --force to replace a previous import)", into_dir);
			goto out;
		}
		*adopt = 1;
	}
	if (*exists && !*adopt && !replaceable(*target)) {
		rc = ms_err_set(err, MS_EEXIST,
				"'%s': exists and is neither empty nor a previous import; not replacing it",
				into_dir);
		goto out;
	}
	rc = MS_OK;
out:
	ms_free(parent);
	return rc;
}

/* The label the state will have (label: the caller's, else the
 * manifest's; NULL: none) must be valid and not name another state. */
static int import_label_check(struct ms_inv *inv, struct importer *x, const char *label,
			      struct ms_err *err)
{
	char other[MS_STATE_DIGEST_LEN];
	struct ms_err e = {0};

	if (!label)
		return MS_OK;
	if (!label_ok(label))
		return fail_member(x, err, MS_EINVAL, MS_BUNDLE_MANIFEST,
				   "label is not a valid inventory label (give another with --label)");
	if (ms_inv_resolve(inv, label, other, &e) == MS_OK && strcmp(other, x->plan->digest))
		return ms_err_set(err, MS_EEXIST,
				  "label '%s' already names state %s in the inventory (give another with --label)",
				  label, other);
	return MS_OK;
}

/* What an earlier run of this import left at target must be what the
 * archive holds, every byte, to be registered as it is. */
static int import_adopt(struct ms_inv *inv, struct importer *x, const char *target,
			const char *into_dir, char *const *dirs, size_t ndirs, int nthreads,
			struct ms_err *err)
{
	struct ms_err e = {0};
	int rc;

	if ((rc = adoptable(inv, x, target, into_dir, err)) != MS_OK)
		return rc;
	rc = verify_extracted(x, target, dirs, ndirs, nthreads, &e);
	if (rc == MS_ECHECK || rc == MS_EINVAL)
		return ms_err_set(err, MS_EEXIST,
				  "'%s': exists, and does not hold what the archive holds (%s); use --force to replace it",
				  into_dir, e.msg);
	if (rc != MS_OK)
		return ms_err_set(err, rc, "%s", e.msg);
	return MS_OK;
}

/* Extract the archive into the staging directory stg (opened here, beside
 * target; messages name into_dir, where the files are going), the
 * manifest first, fsync every directory and verify every byte. */
static int import_extract(struct ms_inv *inv, struct importer *x, struct ms_stage *stg,
			  const char *target, const char *into_dir, char *const *dirs,
			  size_t ndirs, int nthreads, struct ms_err *err)
{
	int rc, fd = -1, rootfd = -1;

	/* from here the stream may hold the declared bytes and their framing,
	 * or max_ratio times the archive, whichever is larger */
	{
		uint64_t lim = sat_add(sat_add(x->plan->total_bytes, x->manifest_len),
				       sat_add(sat_mul(x->plan->nmembers + x->ndirs + 2, FRAME_PER_ENTRY),
					       FRAME_SLACK));
		uint64_t byratio = sat_mul(x->max_ratio, x->plan->archive_bytes);

		x->z.limit = lim > byratio ? lim : byratio;
	}
	if ((rc = ms_stage_open(stg, target, "import", MS_STAGE_DIR, err)) != MS_OK)
		goto out;
	rootfd = open(ms_stage_path(stg), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (rootfd < 0) {
		rc = ms_err_set(err, MS_EIO, "'%s': %s", into_dir, strerror(errno));
		goto out;
	}
	fd = openat(rootfd, MS_BUNDLE_MANIFEST, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		    0644);
	if (fd < 0 || ms_write_all(fd, x->manifest, x->manifest_len) || sync_fd(fd)) {
		rc = ms_err_set(err, MS_EIO, "'%s': cannot write " MS_BUNDLE_MANIFEST ": %s",
				into_dir, strerror(errno));
		goto out;
	}
	close(fd);
	fd = -1;
	x->pr = ms_inv_progress(inv);
	if ((rc = extract_all(x, rootfd, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < x->ndirs; i++)
		if (fsync_path(rootfd, x->dirs[i])) {
			rc = ms_err_set(err, MS_EIO, "'%s/%s': fsync failed: %s", into_dir, x->dirs[i],
					strerror(errno));
			goto out;
		}
	if (fsync_path(rootfd, NULL)) {
		rc = ms_err_set(err, MS_EIO, "'%s': fsync failed: %s", into_dir, strerror(errno));
		goto out;
	}
	rc = verify_extracted(x, ms_stage_path(stg), dirs, ndirs, nthreads, err);
out:
	if (fd >= 0)
		close(fd);
	if (rootfd >= 0)
		close(rootfd);
	return rc;
}

/* Register the files now at target (in the caller's batch) as the state
 * of the manifest, with the lineage the bundle carries; got: its digest. */
static int import_register(struct ms_inv *inv, struct importer *x, const char *archive_path,
			   const char *target, char *const *dirs, size_t ndirs,
			   const char *label, int nthreads, struct ms_inv_add_stats *as,
			   char got[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	struct ms_inv_add_opts ao;
	struct ms_err e = {0};
	char **final = NULL;
	int rc;

	if (!(final = join_all(target, dirs, ndirs))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	ms_inv_add_opts_init(&ao);
	if (x->plan->kind)
		ms_inv_kind_parse(x->plan->kind, &ao.kind);
	ao.label = label;
	ao.ep_size = x->plan->ep_size > 0 ? x->plan->ep_size : -1;
	ao.ep_rank = x->plan->ep_size > 0 ? x->plan->ep_rank : -1;
	ao.jobs = nthreads;
	ao.stats = as;
	rc = ms_inv_add_paths(inv, (const char *const *)final, ndirs, &ao, got, &e);
	if (rc != MS_OK) {
		rc = rc == MS_ENOMEM ? ms_err_set(err, rc, "out of memory")
				     : ms_err_set(err, rc, "'%s': cannot register the state: %s",
						  archive_path, e.msg);
		goto out;
	}
	if (strcmp(got, x->plan->digest)) {
		/* the files changed between the check and the registration:
		 * the caller's rollback records nothing */
		rc = fail_archive(x, err, MS_ECHECK,
				  "registered as %s, not the manifest's %s (files changed during the import)",
				  got, x->plan->digest);
		goto out;
	}
	/* the ancestors and edges the bundle carries, in the same batch */
	if (x->plan->lineage) {
		rc = ms_inv_lineage_record(inv, got, x->plan->lineage, strlen(x->plan->lineage),
					   archive_path, &e);
		if (rc != MS_OK) {
			rc = rc == MS_ENOMEM ? ms_err_set(err, rc, "out of memory")
					     : ms_err_set(err, rc, "'%s': cannot record its lineage: %s",
							  archive_path, e.msg);
			goto out;
		}
	}
	rc = MS_OK;
out:
	free_all(final, ndirs);
	return rc;
}

int ms_bundle_import(struct ms_inv *inv, const char *archive_path, const char *into_dir,
		     const struct ms_bundle_import_opts *opts, char digest_out[MS_STATE_DIGEST_LEN],
		     struct ms_err *err)
{
	struct ms_bundle_import_opts defaults;
	struct importer x;
	struct ms_inv_add_stats as;
	char *target = NULL, **dirs = NULL, got[MS_STATE_DIGEST_LEN];
	const char *label;
	size_t ndirs = 0;
	double t0 = ms_now();
	struct ms_stage stg;
	int rc, exists, adopt, batch = 0;

	ms_stage_init(&stg);
	importer_init(&x);
	if (!opts) {
		ms_bundle_import_opts_init(&defaults);
		opts = &defaults;
	}
	if (opts->stats)
		memset(opts->stats, 0, sizeof(*opts->stats));
	if ((rc = import_target(into_dir, opts, &target, &exists, &adopt, err)) != MS_OK)
		goto out;
	label = opts->label;
	if (label && !label_ok(label)) {
		rc = ms_err_set(err, MS_EINVAL,
				"label '%s': 1 to %d bytes of letters, digits and ._:@+/-, not only hex digits, not starting with sha256:",
				label, MS_INV_MAX_LABEL);
		goto out;
	}
	if ((rc = importer_open(&x, archive_path, opts, err)) != MS_OK)
		goto out;
	if (!label)
		label = x.plan->label;
	if ((rc = import_label_check(inv, &x, label, err)) != MS_OK)
		goto out;
	if (state_dirs(&x, &dirs, &ndirs)) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (adopt) {
		if ((rc = import_adopt(inv, &x, target, into_dir, dirs, ndirs, opts->nthreads,
				       err)) != MS_OK)
			goto out;
	} else {
		if ((rc = import_extract(inv, &x, &stg, target, into_dir, dirs, ndirs,
					 opts->nthreads, err)) != MS_OK)
			goto out;
	}
	/* every byte verified: move into place and register as one step (a
	 * batch: a failure rolls the registration back and the files out) */
	if ((rc = ms_inv_batch_begin(inv, err)) != MS_OK)
		goto out;
	batch = 1;
	/* under --force the previous import waits beside it until the batch
	 * is committed */
	if (!adopt &&
	    (rc = ms_stage_publish(&stg, exists ? MS_STAGE_REPLACE : MS_STAGE_NEW, err)) != MS_OK)
		goto out;
	if ((rc = import_register(inv, &x, archive_path, target, dirs, ndirs, label,
				  opts->nthreads, &as, got, err)) != MS_OK)
		goto out;
	batch = 0;
	if ((rc = ms_inv_batch_end(inv, 1, err)) != MS_OK)
		goto out;
	memcpy(digest_out, got, MS_STATE_DIGEST_LEN);
	if (opts->stats) {
		opts->stats->members = x.plan->nmembers;
		opts->stats->bytes = x.plan->total_bytes;
		opts->stats->archive_bytes = x.plan->archive_bytes;
		opts->stats->stream_bytes = x.z.out_bytes;
		opts->stats->new_state = as.new_state;
		opts->stats->adopted = adopt;
		opts->stats->seconds = ms_now() - t0;
	}
	ms_stage_commit(&stg);
	rc = MS_OK;
out:
	if (batch)
		(void)ms_inv_batch_end(inv, 0, NULL);
	if (rc != MS_OK)
		ms_stage_fix_msg(&stg, err);
	/* a failure takes the import away again and puts back what it replaced */
	ms_stage_abort(&stg);
	importer_release(&x);
	free_all(dirs, ndirs);
	ms_free(target);
	return rc;
}
