/*
 * cli.h: what every tool shares: the subcommand table, the one-line error
 * report, exit codes, the database path rule, and stdout checks.
 *
 * A tool's main is `return cli_main(&tool, argc, argv);` with a table of
 * subcommands; each subcommand parses its own options with getopt_long
 * (argv[0] is the subcommand name) and returns an exit status.
 */
#ifndef MS_CLI_H
#define MS_CLI_H

#include <getopt.h>
#include <stdio.h>

#include "ms.h"

/* Exit statuses, pinned in every man page. */
enum {
	CLI_OK = 0,
	CLI_CHECK = 1,   /* a check found a difference */
	CLI_USAGE = 2,   /* bad usage or bad input */
	CLI_IO = 3,      /* I/O or environment */
};

struct cli_cmd {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *synopsis;  /* "inspect [--digests] [--json] PATH..." */
	const char *summary;   /* one line */
	/* What the command's own options do, one per line, "--opt ARG\twhat"
	 * (the part before the tab is printed as it is). --help lists every
	 * option of the synopsis, described from here, else from the common
	 * descriptions of cli.c (--db, --json, --jobs, ...). */
	const char *options;
};

struct cli_tool {
	const char *name;      /* "msinv" */
	const char *summary;
	const struct cli_cmd *cmds;
	size_t ncmds;
};

/* The program name for messages ("msinv"). */
extern const char *cli_prog;
/* main's arguments as typed: a subcommand's getopt_long permutes its own
 * copy, so this is what the audit log records. */
extern int cli_argc;
extern char **cli_argv;

/* Dispatch: handles --help/-h, --version and "help CMD"; unknown command is
 * exit 2. Checks stdout (fflush/ferror/fclose) before returning. */
int cli_main(const struct cli_tool *tool, int argc, char **argv);

/* Print "<prog>: <message>" on stderr (one line). */
void cli_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print the error buffer's line and return the exit status for rc. After
 * an interruption (cli_catch_interrupts) any failure is reported as the
 * signal, with exit status 128 + the signal. */
int cli_fail(int rc, const struct ms_err *err);
/* For commands that write: catch SIGINT, SIGTERM and SIGHUP (once each) so
 * that the library stops at its next poll and its error path removes
 * staging and rolls back the inventory (see ms_interrupt in common.h). Call
 * it after argument parsing, before the work. */
void cli_catch_interrupts(void);
/* Usage error for the current subcommand: prints the message and
 * "usage: <prog> <synopsis>"; returns CLI_USAGE. */
int cli_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print the synopsis of the current subcommand to stdout, for --help. */
int cli_help(void);

/* Parse a non-negative integer option value <= max; on error prints a usage
 * line naming the option and returns -1. */
int cli_u64(const char *opt, const char *val, uint64_t max, uint64_t *out);
int cli_int(const char *opt, const char *val, int max, int *out);

/* The inventory path: --db if given, else $MSINV_DB, else ./msinv.db. */
const char *cli_db_path(const char *opt_db);

/* Progress on stderr, only when it is a terminal. */
int cli_progress_enabled(void);
/* A byte-count progress line, rewritten in place,
 *   "msinv: exporting 1.25 GiB / 4.00 GiB (31%), 812.40 MiB/s":
 * pass cli_progress_cb and a struct cli_progress ({"what"}, the rest zero)
 * as the library's progress callback, then call cli_progress_end to finish
 * the line. Redrawn at most ten times a second; a count that starts again
 * from below (the next pass of the work) starts a new line. */
struct cli_progress {
	const char *what;
	int shown;
	double t0, last;     /* when the pass began, when last drawn */
	uint64_t prev;       /* the last count drawn */
};
void cli_progress_cb(void *arg, uint64_t done, uint64_t total);
void cli_progress_end(struct cli_progress *p);
/* Report the long work done through inv (hashing, packing, extracting) as
 * progress under p when stderr is a terminal; p must outlive inv's use. */
void cli_progress_inv(struct ms_inv *inv, struct cli_progress *p);

/* Print a string as a JSON string literal (with quotes) to f. */
void cli_json_str(FILE *f, const char *s);

#endif
