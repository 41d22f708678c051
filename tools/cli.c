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

int cli_help(void)
{
	if (cur_cmd)
		printf("usage: %s %s\n", cli_prog, cur_cmd->synopsis);
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

	fprintf(stderr, "\r%s: %s %.2f / %.2f GB (%3.0f%%)", cli_prog, p->what,
		(double)done / 1e9, (double)total / 1e9,
		total ? 100.0 * (double)done / (double)total : 100.0);
	p->shown = 1;
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
		fprintf(f, "  %s %s\n", t->name, t->cmds[i].synopsis);
	fprintf(f, "\nRun '%s COMMAND --help' for one command; see %s(1).\n", t->name,
		t->name);
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

	cli_prog = tool->name;
	cur_tool = tool;
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
		return finish_stdout(cur_cmd->run(argc - 1, argv + 1));
	}
	cli_errorf("unknown command '%s' (see '%s --help')", name, tool->name);
	return CLI_USAGE;
}
