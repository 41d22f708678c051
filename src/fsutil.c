/*
 * fsutil.c: atomic file output (temp, fsync, rename, fsync dir) and bounded
 * whole-file input. See fsutil.h for the protocol.
 */
#include "fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

char *ms_temp_name(const char *dir, const char *base, const char *marker)
{
	static unsigned counter;
	/* getpid and a per-call counter keep names unique across threads and
	 * processes; the random part survives pid reuse after a crash */
	unsigned rnd = (unsigned)rand() ^ (unsigned)(uint64_t)(ms_now() * 1e9) ^
		       __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 2654435761u;

	return ms_asprintf("%s/.%s%s%ld-%08x", dir, base, marker, (long)getpid(), rnd);
}

static int temp_name_with(const char *name, const char *marker, long *pid)
{
	const char *m = NULL, *p, *dash;
	uint64_t v;
	char num[24];
	size_t l;

	/* the last marker: the file being written may itself contain one */
	for (p = name; (p = strstr(p, marker)); p++)
		m = p;
	/* "." + a non-empty name before the marker */
	if (!m || m < name + 2)
		return 0;
	p = m + strlen(marker);
	dash = strchr(p, '-');
	if (!dash)
		return 0;
	l = (size_t)(dash - p);
	if (l == 0 || l >= sizeof(num))
		return 0;
	memcpy(num, p, l);
	num[l] = 0;
	if (ms_parse_u64(num, (uint64_t)LONG_MAX, &v) || v == 0)
		return 0;
	l = strlen(dash + 1);
	if (l == 0 || l > 16 || strspn(dash + 1, "0123456789abcdefABCDEF") != l)
		return 0;
	if (pid)
		*pid = (long)v;
	return 1;
}

int ms_temp_name_parse(const char *name, long *pid)
{
	static const char *const markers[] = {MS_TMP_MARKER, MS_ASIDE_MARKER, ".import-"};

	if (name[0] != '.')
		return 0;
	for (size_t i = 0; i < sizeof(markers) / sizeof(markers[0]); i++)
		if (temp_name_with(name, markers[i], pid))
			return 1;
	return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	return (flag == FTW_DP ? rmdir(path) : unlink(path)) && errno != ENOENT ? -1 : 0;
}

int ms_rmtree(const char *path)
{
	return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) && errno != ENOENT ? -1 : 0;
}

int ms_write_all(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		size_t chunk = n > (1u << 30) ? (1u << 30) : n;
		ssize_t w;

		/* every output of the library is written here: an interrupted
		 * writer stops at its next write (errno EINTR), and its error
		 * path removes what it staged */
		if (ms_interrupted()) {
			errno = EINTR;
			return -1;
		}
		if (ms_fault("write")) {
			/* as a disk filling up does it: part of the chunk lands
			 * (a short write), then ENOSPC */
			if (chunk > 1 && write(fd, c, chunk / 2) < 0) {
				/* ENOSPC below either way */
			}
			errno = ENOSPC;
			return -1;
		}
		w = write(fd, c, chunk);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (w == 0) {
			errno = EIO;
			return -1;
		}
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

char *ms_path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir);

	if (n && dir[n - 1] == '/')
		return ms_asprintf("%s%s", dir, name);
	return ms_asprintf("%s/%s", dir, name);
}

const char *ms_path_base(const char *s)
{
	const char *p = strrchr(s, '/');

	return p ? p + 1 : s;
}

int ms_name_is_plain(const char *name)
{
	return name && *name && !strchr(name, '/') && strcmp(name, ".") &&
	       strcmp(name, "..");
}

/* fsync, or an injected failure that sets errno as a real one does (the
 * callers' messages quote strerror(errno)). */
static int fsync_fd(int fd)
{
	if (ms_fault("fsync")) {
		errno = EIO;
		return -1;
	}
	return fsync(fd);
}

static int rename2(const char *from, const char *to, unsigned flags)
{
	return (int)syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, flags);
}

int ms_rename_noreplace(const char *from, const char *to, int is_dir)
{
	struct stat st;
	int rc = rename2(from, to, RENAME_NOREPLACE);

	if (rc && (errno == EINVAL || errno == ENOSYS)) {
		if (!is_dir) {
			rc = link(from, to);
			if (rc == 0)
				unlink(from);
		} else if (lstat(to, &st) == 0) {
			errno = EEXIST;
			rc = -1;
		} else {
			rc = rename(from, to);
		}
	}
	return rc;
}

int ms_rename_exchange(const char *a, const char *b)
{
	return rename2(a, b, RENAME_EXCHANGE);
}

int ms_fsync_dir_of(const char *path)
{
	char *copy = ms_strdup(path);
	int fd, rc = 0;

	if (!copy) {
		errno = ENOMEM;
		return -1;
	}
	fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ms_free(copy);
	if (fd < 0)
		return -1;
	if (fsync_fd(fd))
		rc = -1;
	close(fd);
	return rc;
}

int ms_mkdir_p(const char *path, struct ms_err *err)
{
	char *p = ms_strdup(path);
	int rc = MS_OK;

	if (!p)
		return ms_err_nomem(err);
	for (char *s = p + 1;; s++) {
		if (*s == '/' || *s == 0) {
			char c = *s;

			*s = 0;
			if (mkdir(p, 0755) && errno != EEXIST) {
				rc = ms_err_set(err, MS_EIO, "'%s': cannot create directory: %s",
						p, strerror(errno));
				break;
			}
			*s = c;
			if (!c)
				break;
		}
	}
	ms_free(p);
	return rc;
}

int ms_afile_open(struct ms_afile *f, const char *path, int force,
		  struct ms_err *err)
{
	struct stat st;
	char *copy = NULL, *dir;

	memset(f, 0, sizeof(*f));
	f->fd = -1;
	if (!force && lstat(path, &st) == 0)
		return ms_err_set(err, MS_EEXIST,
				  "'%s': output exists (use --force to replace it)", path);
	f->path = ms_strdup(path);
	copy = ms_strdup(path);
	if (!f->path || !copy)
		goto oom;
	dir = dirname(copy);
	f->tmp = ms_temp_name(dir, ms_path_base(path), MS_TMP_MARKER);
	if (!f->tmp)
		goto oom;
	ms_free(copy);
	f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (f->fd < 0) {
		int e = errno;

		ms_free(f->tmp);
		f->tmp = NULL;
		return ms_err_set(err, MS_EIO, "'%s': cannot create temporary file: %s",
				  path, strerror(e));
	}
	return MS_OK;
oom:
	ms_free(copy);
	ms_free(f->path);
	ms_free(f->tmp);
	f->path = f->tmp = NULL;
	return ms_err_nomem(err);
}

int ms_afile_write(struct ms_afile *f, const void *p, size_t n,
		   struct ms_err *err)
{
	if (ms_write_all(f->fd, p, n))
		return ms_err_set(err, MS_EIO, "'%s': write failed: %s", f->path,
				  strerror(errno));
	f->written += n;
	return MS_OK;
}

int ms_afile_commit(struct ms_afile *f, int force, struct ms_err *err)
{
	int rc;

	if (fsync_fd(f->fd))
		return ms_err_set(err, MS_EIO, "'%s': fsync failed: %s", f->path,
				  strerror(errno));
	if (close(f->fd)) {
		f->fd = -1;
		return ms_err_set(err, MS_EIO, "'%s': close failed: %s", f->path,
				  strerror(errno));
	}
	f->fd = -1;
	if (ms_fault("rename")) {
		errno = EIO;
		rc = -1;
	} else if (force) {
		rc = rename(f->tmp, f->path);
	} else {
		rc = (int)syscall(SYS_renameat2, AT_FDCWD, f->tmp, AT_FDCWD, f->path,
				  RENAME_NOREPLACE);
		if (rc && (errno == EINVAL || errno == ENOSYS)) {
			/* file systems without RENAME_NOREPLACE: link fails on EEXIST */
			rc = link(f->tmp, f->path);
			if (rc == 0)
				unlink(f->tmp);
		}
	}
	if (rc) {
		if (errno == EEXIST)
			return ms_err_set(err, MS_EEXIST,
					  "'%s': output appeared while writing (another writer won)",
					  f->path);
		return ms_err_set(err, MS_EIO, "'%s': rename failed: %s", f->path,
				  strerror(errno));
	}
	ms_free(f->tmp);
	f->tmp = NULL;
	if (ms_fsync_dir_of(f->path)) {
		int e = errno ? errno : EIO;

		/* The caller reports a failure, so the output must not stay
		 * visible: without force the name was new and can go again
		 * (with force the old file is already replaced). */
		if (!force && unlink(f->path) == 0)
			(void)ms_fsync_dir_of(f->path);
		return ms_err_set(err, MS_EIO, "'%s': fsync of directory failed: %s",
				  f->path, strerror(e));
	}
	ms_free(f->path);
	f->path = NULL;
	return MS_OK;
}

void ms_afile_abort(struct ms_afile *f)
{
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
	if (f->tmp)
		unlink(f->tmp);
	ms_free(f->tmp);
	ms_free(f->path);
	f->tmp = f->path = NULL;
}

int ms_file_write_atomic(const char *path, const void *p, size_t n, int force,
			 struct ms_err *err)
{
	struct ms_afile f;
	int rc;

	if ((rc = ms_afile_open(&f, path, force, err)) != MS_OK)
		return rc;
	if ((rc = ms_afile_write(&f, p, n, err)) != MS_OK)
		goto out;
	rc = ms_afile_commit(&f, force, err);
out:
	ms_afile_abort(&f);
	return rc;
}

int ms_file_read(const char *path, uint64_t max, char **out, size_t *len,
		 struct ms_err *err)
{
	struct stat st;
	char *buf = NULL;
	size_t got = 0;
	int fd, rc = MS_OK;

	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ms_err_set(err, errno == ENOENT ? MS_ENOTFOUND : MS_EIO,
				  "'%s': cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': not a regular file", path);
		goto out;
	}
	if ((uint64_t)st.st_size > max) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': file too large (%lld bytes, limit %llu)",
				path, (long long)st.st_size, (unsigned long long)max);
		goto out;
	}
	buf = ms_malloc((size_t)st.st_size + 1);
	if (!buf) {
		rc = ms_err_nomem(err);
		goto out;
	}
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0 || ms_fault("read")) {
			rc = ms_err_set(err, MS_EIO, "'%s': read failed", path);
			goto out;
		}
		got += (size_t)r;
	}
	buf[got] = 0;
	*out = buf;
	buf = NULL;
	if (len)
		*len = got;
out:
	ms_free(buf);
	close(fd);
	return rc;
}
