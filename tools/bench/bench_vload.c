/*
 * bench_vload.c: the C side of tools/bench/bench_python.sh. Times the
 * verified load of one safetensors file into host memory as a C program
 * does it: open the file with the strict reader, give each tensor a fresh
 * destination (malloc, as the Python package gives each a fresh numpy
 * buffer) and call ms_load_verified. The expected digests are computed
 * once beforehand (untimed).
 *
 *   bench_vload FILE [RUNS [THREADS]]
 *
 * Prints "RESULT c <best wall seconds> <bytes> <CPU seconds of that run>"
 * (CPU seconds of every thread of the process: the cost, robust on a
 * machine shared with other work).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msint.h"

static double cpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int load_once(const char *path, struct ms_st_file *ref, int nthreads,
		     double *seconds, double *cpu, struct ms_err *err)
{
	struct ms_st_file *f = NULL;
	struct ms_vload_item *it = NULL;
	double t0 = ms_now(), c0 = cpu_now();
	int rc;

	if ((rc = ms_st_open(path, &f, err)) != MS_OK)
		return rc;
	if (!(it = calloc(f->ntensors ? f->ntensors : 1, sizeof(*it)))) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < f->ntensors; i++) {
		it[i].tensor = &f->tensors[i];
		memcpy(it[i].expected, ref->tensors[i].digest, MS_SHA256_LEN);
		if (!(it[i].dst = malloc(f->tensors[i].nbytes ? f->tensors[i].nbytes : 1))) {
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto out;
		}
	}
	rc = ms_load_verified(it, f->ntensors, nthreads, err);
	*seconds = ms_now() - t0;
	*cpu = cpu_now() - c0;
out:
	for (size_t i = 0; it && i < f->ntensors; i++)
		free(it[i].dst);
	free(it);
	ms_st_close(f);
	return rc;
}

int main(int argc, char **argv)
{
	struct ms_st_file *ref = NULL;
	struct ms_err err = {0};
	uint64_t runs = 3, threads = 0, bytes = 0;
	double best = -1, best_cpu = 0;
	int rc;

	if (argc < 2 || argc > 4 || (argc > 2 && ms_parse_u64(argv[2], 1000, &runs)) ||
	    (argc > 3 && ms_parse_u64(argv[3], 4096, &threads)) || runs == 0) {
		fprintf(stderr, "usage: bench_vload FILE [RUNS [THREADS]]\n");
		return 2;
	}
	if ((rc = ms_st_open(argv[1], &ref, &err)) != MS_OK ||
	    (rc = ms_st_hash_files(&ref, 1, (int)threads, 0, &err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < ref->ntensors; i++)
		bytes += ref->tensors[i].nbytes;
	for (uint64_t r = 0; r < runs; r++) {
		double s = 0, c = 0;

		if ((rc = load_once(argv[1], ref, (int)threads, &s, &c, &err)) != MS_OK)
			goto out;
		if (best < 0 || s < best) {
			best = s;
			best_cpu = c;
		}
	}
	printf("RESULT c %.6f %llu %.6f\n", best, (unsigned long long)bytes, best_cpu);
out:
	if (rc != MS_OK)
		fprintf(stderr, "bench_vload: %s\n", err.msg);
	ms_st_close(ref);
	return ms_exit_code(rc);
}
