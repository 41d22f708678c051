/*
 * stage.h: the one way libms publishes an output (a file or a directory)
 * that must appear whole or not at all, and be recorded in the same step.
 *
 *   ms_stage_open     locks the parent (MS_STAGE_LOCK) and names the
 *                     staging path beside the output,
 *                     ".<name>.tmp-<pid>-<hex>" (fsutil.h's rule for every
 *                     temporary, so `msinv gc` removes what a killed writer
 *                     left); for a directory output it is created.
 *   ms_stage_path     where the writer writes (and fsyncs) the output.
 *   ms_stage_publish  renames it into place in one step and fsyncs the
 *                     parent. An existing output is replaced only when the
 *                     caller says so (MS_STAGE_REPLACE, after its own check
 *                     of what may be replaced): the two are exchanged
 *                     (renameat2 RENAME_EXCHANGE; where the file system
 *                     cannot, the old one is first moved aside to
 *                     ".<name>.replaced-<pid>-<hex>"), so the output path
 *                     always holds the old output or the whole new one.
 *   ms_stage_commit   after the caller recorded the output (its inventory
 *                     batch committed): removes what it replaced.
 *   ms_stage_abort    anything else: a published output is taken away and
 *                     what it replaced put back, the staging removed, the
 *                     parents open created removed (MS_STAGE_PARENTS).
 *
 * Commit and abort unlock and free; either may be called again, and abort
 * on a stage never opened (ms_stage_init'ed) does nothing. No step
 * allocates on the way out, so an allocation failure is undone too.
 */
#ifndef MS_STAGE_H
#define MS_STAGE_H

#include "common.h"

#define MS_STAGE_DIR 1u      /* the output is a directory (staging made by open) */
#define MS_STAGE_LOCK 2u     /* lock the parent (flock): a second writer beside
				the output is refused at once */
#define MS_STAGE_MKDIR 4u    /* create missing parent directories */
#define MS_STAGE_PARENTS 8u  /* ... and remove them again on abort */

enum ms_stage_how {
	MS_STAGE_NEW,        /* the output must not exist */
	MS_STAGE_OVER_EMPTY, /* an empty directory is replaced (rename's rule) */
	MS_STAGE_REPLACE,    /* an existing output is exchanged */
};

struct ms_stage {
	char *dest;          /* the output, without trailing '/' */
	char *parent;        /* its parent directory */
	char *tmp;           /* the staging path */
	char *aside;         /* the replaced output, when moved aside */
	char *made_parent;   /* the topmost parent open created (MS_STAGE_PARENTS) */
	const char *what;    /* "output", "checkpoint", "import": in messages */
	unsigned flags;
	int lockfd;
	int have_tmp;        /* tmp is ours to remove */
	int published;       /* dest holds the new output */
	int exchanged;       /* ... and tmp the one it replaced */
	int over_empty;      /* ... which was an empty directory */
};

void ms_stage_init(struct ms_stage *st);
/* what names the output in messages (a static string). On failure the
 * stage is released as by ms_stage_abort. */
int ms_stage_open(struct ms_stage *st, const char *dest, const char *what, unsigned flags,
		  struct ms_err *err);
const char *ms_stage_path(const struct ms_stage *st);
/* MS_EEXIST when the output appeared (another writer won), MS_EIO. A
 * failure leaves everything as before the call. */
int ms_stage_publish(struct ms_stage *st, enum ms_stage_how how, struct ms_err *err);
void ms_stage_commit(struct ms_stage *st);
void ms_stage_abort(struct ms_stage *st);
/* Messages name the output, not its staging path. */
void ms_stage_fix_msg(const struct ms_stage *st, struct ms_err *err);

#endif
