/*
 * stage.c: staging, publication by rename, and undo (stage.h). Every
 * writer of a whole output (split, merge, reshard, convert, import, a
 * training checkpoint) goes through here, so the crash-safety argument is
 * made once.
 */
#include "stage.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"

void ms_stage_init(struct ms_stage *st)
{
	memset(st, 0, sizeof(*st));
	st->lockfd = -1;
}

/* Remove the parent directories open created, deepest first, those left
 * empty only (no allocation). */
static void remove_parents(struct ms_stage *st)
{
	char buf[4096];
	char *slash;
	size_t top;

	if (!st->made_parent || strlen(st->dest) >= sizeof(buf))
		return;
	top = strlen(st->made_parent);
	snprintf(buf, sizeof(buf), "%s", st->dest);
	while ((slash = strrchr(buf, '/')) && slash != buf) {
		*slash = 0;
		if (strlen(buf) < top || rmdir(buf))
			break;
	}
}

/* Create the missing parents of the output, recording the topmost one
 * when abort is to remove them. */
static int make_parents(struct ms_stage *st, struct ms_err *err)
{
	struct stat sb;
	char *d, *top = NULL;
	int rc = MS_OK;

	if (!(st->flags & MS_STAGE_PARENTS))
		return ms_mkdir_p(st->parent, err);
	if (!(d = ms_strdup(st->parent)))
		return ms_err_nomem(err);
	while (stat(d, &sb) && errno == ENOENT) {
		char *slash = strrchr(d, '/');

		ms_free(top);
		if (!(top = ms_strdup(d))) {
			rc = ms_err_nomem(err);
			break;
		}
		if (!slash || slash == d)
			break;
		*slash = 0;
	}
	ms_free(d);
	if (rc != MS_OK || !top) {
		ms_free(top);
		return rc;
	}
	st->made_parent = top;
	return ms_mkdir_p(st->parent, err);
}

static int lock_parent(struct ms_stage *st, struct ms_err *err)
{
	int e;

	st->lockfd = open(st->parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (st->lockfd < 0)
		return ms_err_set(err, MS_EIO, "'%s': cannot open: %s", st->parent, strerror(errno));
	if (flock(st->lockfd, LOCK_EX | LOCK_NB) == 0)
		return MS_OK;
	e = errno;
	close(st->lockfd);
	st->lockfd = -1;
	if (e == EWOULDBLOCK)
		return ms_err_set(err, MS_EEXIST, "'%s': another writer is writing beside it "
				  "(another writer won)", st->dest);
	return ms_err_set(err, MS_EIO, "'%s': cannot lock: %s", st->dest, strerror(e));
}

static int stage_open(struct ms_stage *st, const char *dest, struct ms_err *err)
{
	const char *base;
	size_t n;
	int rc;

	if (!(st->dest = ms_strdup(dest)))
		return ms_err_nomem(err);
	for (n = strlen(st->dest); n > 1 && st->dest[n - 1] == '/'; n--)
		st->dest[n - 1] = '\0';
	base = ms_path_base(st->dest);
	if (!ms_name_is_plain(base))
		return ms_err_set(err, MS_EINVAL, "'%s': not a name of a %s to create", dest,
				  st->flags & MS_STAGE_DIR ? "directory" : "file");
	if (base == st->dest)
		st->parent = ms_strdup(".");
	else
		st->parent = ms_strndup(st->dest, base - st->dest > 1 ? (size_t)(base - st->dest) - 1
								: 1);
	if (!st->parent)
		return ms_err_nomem(err);
	if ((st->flags & (MS_STAGE_MKDIR | MS_STAGE_PARENTS)) &&
	    (rc = make_parents(st, err)) != MS_OK)
		return rc;
	if ((st->flags & MS_STAGE_LOCK) && (rc = lock_parent(st, err)) != MS_OK)
		return rc;
	for (int tries = 0;; tries++) {
		ms_free(st->tmp);
		if (!(st->tmp = ms_temp_name(st->parent, base, MS_TMP_MARKER)))
			return ms_err_nomem(err);
		/* a file is created by its writer (O_EXCL) */
		if (!(st->flags & MS_STAGE_DIR) || mkdir(st->tmp, 0755) == 0)
			break;
		if (errno != EEXIST || tries > 8)
			return ms_err_set(err, MS_EIO, "'%s': cannot create a staging directory beside "
					  "it: %s", st->dest, strerror(errno));
	}
	st->have_tmp = 1;
	return MS_OK;
}

int ms_stage_open(struct ms_stage *st, const char *dest, const char *what, unsigned flags,
		  struct ms_err *err)
{
	int rc;

	ms_stage_init(st);
	st->what = what;
	st->flags = flags;
	if ((rc = stage_open(st, dest, err)) != MS_OK)
		ms_stage_abort(st);
	return rc;
}

const char *ms_stage_path(const struct ms_stage *st)
{
	return st->tmp;
}

/* Take a published output away again and put back what it replaced. */
static void unpublish(struct ms_stage *st)
{
	if (!st->published)
		return;
	if (st->exchanged) {
		/* nothing is removed when the old output cannot come back */
		if (ms_rename_exchange(st->tmp, st->dest)) {
			st->have_tmp = 0;
			st->published = 0;
			return;
		}
		st->exchanged = 0;
		st->have_tmp = 1;
	} else {
		if (rename(st->dest, st->tmp) == 0)
			st->have_tmp = 1;
		else
			(void)ms_rmtree(st->dest);
		if (st->aside && rename(st->aside, st->dest) == 0) {
			ms_free(st->aside);
			st->aside = NULL;
		} else if (st->over_empty) {
			(void)mkdir(st->dest, 0755);
		}
	}
	st->published = 0;
	(void)ms_fsync_dir_of(st->dest);
}

/* No exchange on this file system: move the old output aside, then the
 * new one into place; on failure the old one goes back. */
static int publish_aside(struct ms_stage *st)
{
	int r, e;

	if (!(st->aside = ms_temp_name(st->parent, ms_path_base(st->dest), MS_ASIDE_MARKER))) {
		errno = ENOMEM;
		return -1;
	}
	if ((r = rename(st->dest, st->aside)) != 0) {
		e = errno;
		ms_free(st->aside);
		st->aside = NULL;
		errno = e;
	} else if ((r = ms_rename_noreplace(st->tmp, st->dest, st->flags & MS_STAGE_DIR)) != 0) {
		e = errno;
		if (rename(st->aside, st->dest) == 0) {
			ms_free(st->aside);
			st->aside = NULL;
		}
		errno = e;
	}
	return r;
}

int ms_stage_publish(struct ms_stage *st, enum ms_stage_how how, struct ms_err *err)
{
	int r, e;

	if (!st->tmp || st->published)
		return ms_err_set(err, MS_EINVAL, "'%s': nothing staged to publish",
				  st->dest ? st->dest : "");
	if (ms_fault("rename")) {
		errno = EIO;
		r = -1;
	} else if (how == MS_STAGE_NEW) {
		r = ms_rename_noreplace(st->tmp, st->dest, st->flags & MS_STAGE_DIR);
	} else if (how == MS_STAGE_OVER_EMPTY) {
		/* rename replaces an empty directory only, so one that filled
		 * up meanwhile wins */
		r = rename(st->tmp, st->dest);
	} else if ((r = ms_rename_exchange(st->tmp, st->dest)) == 0) {
		st->exchanged = 1;
	} else if (errno == EINVAL || errno == ENOSYS) {
		r = publish_aside(st);
	}
	if (r) {
		e = errno;
		if (e == ENOMEM)
			return ms_err_nomem(err);
		if (e == EEXIST || e == ENOTEMPTY)
			return ms_err_set(err, MS_EEXIST, "'%s': %s appeared while writing (another "
					  "writer won)", st->dest, st->what);
		return ms_err_set(err, MS_EIO, "'%s': cannot move the %s into place: %s", st->dest,
				  st->what, strerror(e));
	}
	st->published = 1;
	st->have_tmp = st->exchanged;
	st->over_empty = how == MS_STAGE_OVER_EMPTY;
	if (ms_fsync_dir_of(st->dest)) {
		e = errno ? errno : EIO;
		unpublish(st);
		return ms_err_set(err, MS_EIO, "'%s': fsync of directory failed: %s", st->dest,
				  strerror(e));
	}
	return MS_OK;
}

void ms_stage_commit(struct ms_stage *st)
{
	if (st->published) {
		if (st->exchanged)
			(void)ms_rmtree(st->tmp);
		if (st->aside)
			(void)ms_rmtree(st->aside);
		st->published = st->exchanged = st->have_tmp = 0;
		ms_free(st->aside);
		st->aside = NULL;
		/* the parents hold the output now */
		ms_free(st->made_parent);
		st->made_parent = NULL;
		(void)ms_fsync_dir_of(st->dest);
	}
	ms_stage_abort(st);
}

void ms_stage_abort(struct ms_stage *st)
{
	unpublish(st);
	if (st->have_tmp && st->tmp)
		(void)ms_rmtree(st->tmp);
	remove_parents(st);
	if (st->lockfd >= 0)
		close(st->lockfd);
	ms_free(st->dest);
	ms_free(st->parent);
	ms_free(st->tmp);
	ms_free(st->aside);
	ms_free(st->made_parent);
	ms_stage_init(st);
}

void ms_stage_fix_msg(const struct ms_stage *st, struct ms_err *err)
{
	char *at, msg[sizeof(err->msg)];

	if (!err || !st->tmp || !st->dest || !(at = strstr(err->msg, st->tmp)))
		return;
	snprintf(msg, sizeof(msg), "%.*s%s%s", (int)(at - err->msg), err->msg, st->dest,
		 at + strlen(st->tmp));
	memcpy(err->msg, msg, sizeof(msg));
}
