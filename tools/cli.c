/*
 * cli.c: the shared command-line frame of the tools (see cli.h).
 */
#include "cli.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *cli_prog = "ms";
int cli_argc;
char **cli_argv;
static const struct cli_tool *cur_tool;
static const struct cli_cmd *cur_cmd;

void cli_errorf(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fprintf(stderr, "%s: ", cli_prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static const char *sig_name(int sig)
{
	switch (sig) {
	case SIGINT: return "SIGINT";
	case SIGTERM: return "SIGTERM";
	case SIGHUP: return "SIGHUP";
	}
	return "a signal";
}

/* Only records the signal (async-signal-safe); the library polls it. */
static void on_interrupt(int sig)
{
	ms_interrupt(sig);
}

void cli_catch_interrupts(void)
{
	static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_interrupt;
	sigemptyset(&sa.sa_mask);
	/* no SA_RESTART: a blocked read or write returns EINTR and the loop
	 * around it looks at the flag; SA_RESETHAND: a second signal is not
	 * caught, and ends the process at once, as the user asked twice */
	sa.sa_flags = SA_RESETHAND;
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		struct sigaction old;

		/* a signal ignored by whoever started us (nohup) stays ignored */
		if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
			continue;
		sigaction(sigs[i], &sa, NULL);
	}
}

int cli_fail(int rc, const struct ms_err *err)
{
	int sig = ms_interrupted();

	if (rc == MS_OK)
		return CLI_OK;
	if (sig) {
		/* whatever the library's last error was, it was the signal's
		 * doing; the command's error path has run by now */
		cli_errorf("interrupted by %s: partial output removed, nothing registered",
			   sig_name(sig));
		return 128 + sig;
	}
	if (err && err->msg[0])
		cli_errorf("%s", err->msg);
	else
		cli_errorf("%s", ms_rc_str(rc));
	return ms_exit_code(rc);
}

int cli_usage(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	if (fmt) {
		fprintf(stderr, "%s: ", cli_prog);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fputc('\n', stderr);
	}
	if (cur_cmd)
		fprintf(stderr, "usage: %s %s\n", cli_prog, cur_cmd->synopsis);
	return CLI_USAGE;
}

/* Descriptions of the options many commands share; a command's own
 * options text overrides them. */
static const char *const common_options =
	"--db PATH\tthe inventory (default: $MSINV_DB, else ./msinv.db)\n"
	"--json\tprint JSON\n"
	"--jobs N\tworker threads (default: one per CPU)\n"
	"--force\treplace an existing output\n"
	"--dry-run\tprint the plan and write nothing\n"
	"--no-register\twrite the files only, even with $MSINV_DB set\n"
	"--label LABEL\tthe label of the registered output\n";

/* The line of text describing option name (its length n) in text: the
 * line's start, NULL when absent. */
static const char *option_line(const char *text, const char *name, size_t n)
{
	for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
		if (!strncmp(l, name, n) && (l[n] == ' ' || l[n] == '\t'))
			return l;
	return NULL;
}

/* One option of the synopsis: "  --opt ARG    what it does". */
static void print_option(const char *name, size_t n, const char *arg, size_t an)
{
	const char *l = cur_cmd->options ? option_line(cur_cmd->options, name, n) : NULL;
	const char *tab, *end;
	int w;

	if (!l)
		l = option_line(common_options, name, n);
	if (l && (tab = strchr(l, '\t')) && (!(end = strchr(l, '\n')) || tab < end)) {
		end = strchr(tab, '\n');
		w = printf("  %.*s", (int)(tab - l), l);
		printf("%*s%.*s\n", w < 26 ? 26 - w : 2, "",
		       (int)(end ? end - tab - 1 : (ptrdiff_t)strlen(tab + 1)), tab + 1);
		return;
	}
	/* undocumented: listed bare (tests/script/man_help.sh fails on it) */
	printf("  %.*s%s%.*s\n", (int)n, name, an ? " " : "", (int)an, arg);
}

/* Every option the synopsis names, once, in its order: a token starting
 * with '-' (brackets, '|' and "..." stripped; "--" alone separates a
 * command line), with its argument when the next token is not an option. */
static void print_options(const char *syn)
{
	const char *seen[64];
	size_t seen_n[64], nseen = 0;
	int header = 0;

	for (const char *p = syn; *p;) {
		const char *t, *a = NULL;
		size_t n, an = 0;
		int closed, dup = 0;

		while (*p == ' ' || *p == '[' || *p == '|')
			p++;
		t = p;
		while (*p && *p != ' ')
			p++;
		if (*t != '-' || (p - t == 2 && t[1] == '-'))
			continue;
		n = strcspn(t, " ]|");
		if (n > (size_t)(p - t))
			n = (size_t)(p - t);
		closed = t[n] == ']';
		if (!closed && *p == ' ' && p[1] != '-' && p[1] != '[' && p[1] != '|') {
			a = p + 1;
			an = strcspn(a, " ]");
			if (an >= 3 && !strncmp(a + an - 3, "...", 3))
				an -= 3;
		}
		for (size_t i = 0; i < nseen; i++)
			dup |= seen_n[i] == n && !strncmp(seen[i], t, n);
		if (dup || nseen == 64)
			continue;
		seen[nseen] = t;
		seen_n[nseen++] = n;
		if (!header++)
			printf("\noptions:\n");
		print_option(t, n, a, an);
	}
}

int cli_help(void)
{
	if (!cur_cmd)
		return CLI_OK;
	printf("usage: %s %s\n\n%s\n", cli_prog, cur_cmd->synopsis, cur_cmd->summary);
	print_options(cur_cmd->synopsis);
	printf("\nSee %s(1).\n", cli_prog);
	return CLI_OK;
}

int cli_u64(const char *opt, const char *val, uint64_t max, uint64_t *out)
{
	if (ms_parse_u64(val, max, out)) {
		cli_usage("option '%s': '%s' is not an integer in 0..%llu", opt, val,
			  (unsigned long long)max);
		return -1;
	}
	return 0;
}

int cli_int(const char *opt, const char *val, int max, int *out)
{
	uint64_t v;

	if (cli_u64(opt, val, (uint64_t)max, &v))
		return -1;
	*out = (int)v;
	return 0;
}

const char *cli_db_path(const char *opt_db)
{
	const char *e;

	if (opt_db)
		return opt_db;
	e = getenv("MSINV_DB");
	if (e && *e)
		return e;
	return "msinv.db";
}

int cli_progress_enabled(void)
{
	return isatty(2);
}

void cli_progress_cb(void *arg, uint64_t done, uint64_t total)
{
	struct cli_progress *p = arg;
	char d[MS_BYTES_STR_LEN], t[MS_BYTES_STR_LEN], r[MS_BYTES_STR_LEN];
	char rs[MS_BYTES_STR_LEN + 8] = "";
	double now = ms_now(), rate;

	if (!p->shown || done < p->prev) {
		if (p->shown)
			fputc('\n', stderr);
		p->t0 = now;
	} else if (done < total && now - p->last < 0.1) {
		return;
	}
	/* the rate once there is time to measure it over */
	rate = now - p->t0 > 0.05 ? (double)done / (now - p->t0) : -1;
	if (rate >= 0)
		snprintf(rs, sizeof(rs), ", %s/s", ms_bytes_str((uint64_t)rate, r));
	/* \033[K: a shorter line leaves nothing of the longer one before it */
	fprintf(stderr, "\r%s: %s %s / %s (%3.0f%%)%s\033[K", cli_prog, p->what,
		ms_bytes_str(done, d), ms_bytes_str(total, t),
		total ? 100.0 * (double)done / (double)total : 100.0, rs);
	fflush(stderr);
	p->shown = 1;
	p->last = now;
	p->prev = done;
}

void cli_progress_inv(struct ms_inv *inv, struct cli_progress *p)
{
	struct ms_progress pr = { cli_progress_cb, p };

	if (inv && cli_progress_enabled())
		ms_inv_set_progress(inv, &pr);
}

void cli_progress_end(struct cli_progress *p)
{
	if (p->shown)
		fputc('\n', stderr);
}

void cli_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		switch (*p) {
		case '"': fputs("\\\"", f); break;
		case '\\': fputs("\\\\", f); break;
		case '\n': fputs("\\n", f); break;
		case '\t': fputs("\\t", f); break;
		case '\r': fputs("\\r", f); break;
		default:
			if (*p < 0x20)
				fprintf(f, "\\u%04x", *p);
			else
				fputc(*p, f);
		}
	}
	fputc('"', f);
}

static void print_tool_help(FILE *f, const struct cli_tool *t)
{
	fprintf(f, "usage: %s COMMAND [OPTIONS] [ARGS]\n\n%s\n\ncommands:\n", t->name,
		t->summary);
	for (size_t i = 0; i < t->ncmds; i++)
		fprintf(f, "  %s %s\n        %s\n", t->name, t->cmds[i].synopsis,
			t->cmds[i].summary);
	fprintf(f, "\nRun '%s COMMAND --help' for one command and its options; see %s(1).\n",
		t->name, t->name);
}

/* git's rule: a full disk or closed pipe on stdout is an error, not silence. */
static int finish_stdout(int status)
{
	if (fflush(stdout) || ferror(stdout)) {
		if (errno != EPIPE)
			fprintf(stderr, "%s: write error on standard output: %s\n",
				cli_prog, strerror(errno));
		return status ? status : CLI_IO;
	}
	if (fclose(stdout)) {
		fprintf(stderr, "%s: write error on standard output: %s\n", cli_prog,
			strerror(errno));
		return status ? status : CLI_IO;
	}
	return status;
}

int cli_main(const struct cli_tool *tool, int argc, char **argv)
{
	const char *name;
	char **args;
	int status;

	cli_prog = tool->name;
	cur_tool = tool;
	cli_argc = argc;
	cli_argv = argv;
	if (argc < 2) {
		print_tool_help(stderr, tool);
		return CLI_USAGE;
	}
	name = argv[1];
	if (!strcmp(name, "--help") || !strcmp(name, "-h")) {
		print_tool_help(stdout, tool);
		return finish_stdout(CLI_OK);
	}
	if (!strcmp(name, "--version")) {
		printf("%s %s\n", tool->name, MS_VERSION);
		return finish_stdout(CLI_OK);
	}
	if (!strcmp(name, "help") && argc == 3)
		name = argv[2];
	for (size_t i = 0; i < tool->ncmds; i++) {
		if (strcmp(name, tool->cmds[i].name))
			continue;
		cur_cmd = &tool->cmds[i];
		if (!strcmp(argv[1], "help")) {
			cli_help();
			return finish_stdout(CLI_OK);
		}
		optind = 1;
		opterr = 0;
		/* getopt_long moves options before operands in the array it is
		 * given: give it a copy, so argv stays as it was typed */
		if (!(args = malloc((size_t)argc * sizeof(*args)))) {
			cli_errorf("out of memory");
			return CLI_IO;
		}
		memcpy(args, argv + 1, (size_t)(argc - 1) * sizeof(*args));
		args[argc - 1] = NULL;
		status = cur_cmd->run(argc - 1, args);
		free(args);
		return finish_stdout(status);
	}
	cli_errorf("unknown command '%s' (see '%s --help')", name, tool->name);
	return CLI_USAGE;
}
