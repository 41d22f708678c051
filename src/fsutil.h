/*
 * fsutil.h: durable file output and bounded file input.
 *
 * Every file libms writes goes through struct ms_afile: the bytes go to a
 * temporary file in the destination directory (".<name>.tmp-<pid>-<rand>"),
 * are fsynced, renamed over the destination, and the directory is fsynced,
 * so a reader (or a crash) sees either the old file or the whole new one.
 * `msinv gc` removes temporaries left by killed writers; their names all
 * match MS_TMP_MARKER.
 */
#ifndef MS_FSUTIL_H
#define MS_FSUTIL_H

#include "ms.h"
#include <stdint.h>
#include <stdio.h>

#include "common.h"

#define MS_TMP_MARKER ".tmp-"
/* An output --force replaced, where it waits until the replacement is
 * recorded (stage.h) when the file system cannot exchange two paths. */
#define MS_ASIDE_MARKER ".replaced-"

/* A temporary name beside an output: "<dir>/.<base><marker><pid>-<hex>",
 * the one naming rule of every writer's temporaries, so that `msinv gc`
 * finds what a killed writer left (caller frees; NULL: no memory). */
char *ms_temp_name(const char *dir, const char *base, const char *marker);
/* Is name (a directory entry) such a temporary? Sets *pid (may be NULL)
 * to its writer's process id. Recognises MS_TMP_MARKER, MS_ASIDE_MARKER
 * and ".import-", the staging name imports used before they staged as
 * every other writer does. */
int ms_temp_name_parse(const char *name, long *pid);

struct ms_afile {
	char *path;     /* final destination */
	char *tmp;      /* temporary path, NULL once committed or aborted */
	int fd;
	uint64_t written;
};

/* Open a temporary file beside path. With force == 0 an existing path is
 * MS_EEXIST (checked again, atomically, at commit via link/rename rules). */
int ms_afile_open(struct ms_afile *f, const char *path, int force,
		  struct ms_err *err);
/* Write all n bytes (retrying short writes). */
int ms_afile_write(struct ms_afile *f, const void *p, size_t n,
		   struct ms_err *err);
/* fsync, rename into place, fsync the directory. With force == 0 the rename
 * does not replace a file that appeared meanwhile (renameat2 NOREPLACE,
 * falling back to link+unlink): two writers of one output, one wins. */
int ms_afile_commit(struct ms_afile *f, int force, struct ms_err *err);
/* Remove the temporary file (no-op after commit). Always safe to call. */
void ms_afile_abort(struct ms_afile *f);

/* Write all bytes to fd (retrying short writes; fault-injectable). */
int ms_write_all(int fd, const void *p, size_t n);

/* fsync a directory (the parent of path when path is a file). */
int ms_fsync_dir_of(const char *path);

/* Publishing a staged output. ms_rename_noreplace: rename from to to unless
 * to exists (renameat2 RENAME_NOREPLACE; where the file system lacks it,
 * link + unlink for a file, and a check before the rename for a directory,
 * which leaves a small window). ms_rename_exchange: swap two existing paths
 * atomically (renameat2 RENAME_EXCHANGE; errno EINVAL or ENOSYS where the
 * file system cannot). Both return 0 or -1 with errno set. */
int ms_rename_noreplace(const char *from, const char *to, int is_dir);
int ms_rename_exchange(const char *a, const char *b);

/* Remove path and, for a directory, what it holds, deepest first, links
 * as links. Best effort (what cannot be removed stays); no allocation
 * through ms_malloc, so it also runs on the way out of an allocation
 * failure. Returns 0, or -1 with errno set when something stayed. */
int ms_rmtree(const char *path);

/* mkdir -p (mode 0755). */
int ms_mkdir_p(const char *path, struct ms_err *err);

/* Is name a plain file name (no '/', not "." or "..", not empty, no NUL)? */
int ms_name_is_plain(const char *name);

#endif
