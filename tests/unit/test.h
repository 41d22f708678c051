/*
 * test.h: the unit test harness. A test file defines functions
 * `static int test_<name>(void)` that return 0 or fail through T_ASSERT
 * (which prints file:line and the failed expression), lists them with
 * T_CASE, and ends with T_MAIN. The binary prints one line per failure and
 * a last line "<file>: N passed, N failed"; tests/run.sh adds them up.
 *
 * T_FIXTURES is the bundled fixture directory (tests/fixtures), T_TMP a
 * scratch directory created per binary run.
 */
#ifndef MS_TEST_H
#define MS_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "msint.h"

#define T_ASSERT(cond)                                                         \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "%s:%d: assertion failed: %s\n",       \
				__FILE__, __LINE__, #cond);                    \
			return 1;                                              \
		}                                                              \
	} while (0)

#define T_ASSERT_MSG(cond, ...)                                                \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "%s:%d: assertion failed: %s: ",       \
				__FILE__, __LINE__, #cond);                    \
			fprintf(stderr, __VA_ARGS__);                          \
			fputc('\n', stderr);                                   \
			return 1;                                              \
		}                                                              \
	} while (0)

#define T_ASSERT_EQ_INT(a, b)                                                  \
	do {                                                                   \
		long long _a = (long long)(a), _b = (long long)(b);            \
		if (_a != _b) {                                                \
			fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", \
				__FILE__, __LINE__, #a, #b, _a, _b);           \
			return 1;                                              \
		}                                                              \
	} while (0)

#define T_ASSERT_STR(a, b)                                                     \
	do {                                                                   \
		const char *_a = (a), *_b = (b);                               \
		if (!_a || !_b || strcmp(_a, _b)) {                            \
			fprintf(stderr, "%s:%d: %s == %s failed: '%s' != '%s'\n", \
				__FILE__, __LINE__, #a, #b, _a ? _a : "(null)", \
				_b ? _b : "(null)");                           \
			return 1;                                              \
		}                                                              \
	} while (0)

struct t_case {
	const char *name;
	int (*fn)(void);
};

#define T_CASE(fn) { #fn, fn }

static const char *T_FIXTURES = "tests/fixtures";
static char T_TMP[256];

static inline int t_main(const char *file, const struct t_case *cases, size_t n,
			 int argc, char **argv)
{
	int pass = 0, fail = 0;
	const char *fx = getenv("MS_FIXTURES");

	if (fx)
		T_FIXTURES = fx;
	snprintf(T_TMP, sizeof(T_TMP), "%s/ms-unit-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(T_TMP)) {
		perror("mkdtemp");
		return 2;
	}
	for (size_t i = 0; i < n; i++) {
		if (argc > 1 && !strstr(cases[i].name, argv[1]))
			continue;
		if (cases[i].fn() == 0) {
			pass++;
		} else {
			fprintf(stderr, "FAIL %s: %s\n", file, cases[i].name);
			fail++;
		}
	}
	if (!getenv("MS_KEEP_TMP")) {
		char cmd[300];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", T_TMP);
		if (system(cmd) != 0)
			fprintf(stderr, "%s: could not remove %s\n", file, T_TMP);
	}
	printf("%s: %d passed, %d failed\n", file, pass, fail);
	return fail ? 1 : 0;
}

#define T_MAIN(cases)                                                          \
	int main(int argc, char **argv)                                        \
	{                                                                      \
		return t_main(__FILE__, cases, sizeof(cases) / sizeof(cases[0]), \
			      argc, argv);                                     \
	}

#endif
