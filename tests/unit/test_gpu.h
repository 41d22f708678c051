/*
 * test_gpu.h: the start of a GPU-tier test binary. Without a usable GPU it
 * says it skipped and why (0 passed, 0 failed), unless MS_TEST_GPU says
 * the tier needs one, which makes the missing GPU a failure.
 */
#ifndef MS_TEST_GPU_H
#define MS_TEST_GPU_H

#include "test.h"
#include "gpu.h"

/* -1 when there is a GPU (go on), else the exit code to return */
static inline int t_gpu_skip(const char *file)
{
	struct ms_err err = {0};

	if (ms_gpu_available())
		return -1;
	ms_gpu_describe(NULL, 0, &err);
	if (getenv("MS_TEST_GPU")) {
		fprintf(stderr, "%s: the gpu tier needs a gpu: %s\n", file, err.msg);
		printf("%s: 0 passed, 1 failed\n", file);
		return 1;
	}
	printf("%s: skipped (%s)\n%s: 0 passed, 0 failed\n", file, err.msg, file);
	return 0;
}

#define T_GPU_MAIN(cases)                                                      \
	int main(int argc, char **argv)                                        \
	{                                                                      \
		int rc_ = t_gpu_skip(__FILE__);                                \
		return rc_ >= 0 ? rc_                                          \
				: t_main(__FILE__, cases,                      \
					 sizeof(cases) / sizeof(cases[0]), argc, argv); \
	}

/* The same with a --bench mode: `binary --bench` runs bench() (0: done)
 * instead of the cases. A build without CUDA has neither: it only says it
 * skipped. */
#ifdef MS_HAVE_CUDA
#define T_GPU_MAIN_BENCH(cases, bench)                                         \
	int main(int argc, char **argv)                                        \
	{                                                                      \
		int rc_ = t_gpu_skip(__FILE__);                                \
		if (rc_ >= 0)                                                  \
			return rc_;                                            \
		if (argc > 1 && !strcmp(argv[1], "--bench"))                   \
			return bench() ? 1 : 0;                                \
		return t_main(__FILE__, cases, sizeof(cases) / sizeof(cases[0]), \
			      argc, argv);                                     \
	}
#else
#define T_GPU_MAIN_BENCH(cases, bench)                                         \
	int main(void)                                                         \
	{                                                                      \
		return t_gpu_skip(__FILE__);                                   \
	}
#endif

#endif
