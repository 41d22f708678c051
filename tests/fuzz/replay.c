/*
 * replay.c: runs a fuzz target's LLVMFuzzerTestOneInput over every file of
 * a corpus directory, so the corpus is part of the ordinary test suite
 * (built without libFuzzer, under ASan in `make check-asan`). A target
 * signals a bug by crashing or failing an assert; a file that runs to
 * completion passes. Prints "replay_<target>: N passed, N failed".
 *
 *   replay_fz_safetensors tests/fuzz/corpus/safetensors
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
	const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
	char **names = NULL;
	size_t n = 0, cap = 0;
	int pass = 0, fail = 0;
	struct dirent *de;
	DIR *d;

	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", prog);
		return 2;
	}
	d = opendir(argv[1]);
	if (!d) {
		fprintf(stderr, "%s: cannot open '%s'\n", prog, argv[1]);
		printf("%s: 0 passed, 1 failed\n", prog);
		return 1;
	}
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			names = realloc(names, cap * sizeof(*names));
			if (!names)
				abort();
		}
		names[n] = strdup(de->d_name);
		if (!names[n])
			abort();
		n++;
	}
	closedir(d);
	/* a fixed order makes a failure reproducible */
	qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++) {
		char path[4096];
		struct stat st;
		uint8_t *buf;
		FILE *f;

		snprintf(path, sizeof(path), "%s/%s", argv[1], names[i]);
		if (stat(path, &st) || !S_ISREG(st.st_mode))
			continue;
		f = fopen(path, "rb");
		buf = malloc((size_t)st.st_size ? (size_t)st.st_size : 1);
		if (!f || !buf || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
			fprintf(stderr, "%s: cannot read '%s'\n", prog, path);
			fail++;
		} else {
			/* an exact-size copy, so any overread is past the allocation */
			LLVMFuzzerTestOneInput(buf, (size_t)st.st_size);
			pass++;
		}
		if (f)
			fclose(f);
		free(buf);
		free(names[i]);
	}
	free(names);
	if (pass + fail == 0) {
		fprintf(stderr, "%s: no corpus files in '%s'\n", prog, argv[1]);
		fail = 1;
	}
	printf("%s: %d passed, %d failed\n", prog, pass, fail);
	return fail ? 1 : 0;
}
