/*
 * test_bf16.h: what the tensor-core kernel tests share: the random stream
 * of test_rng.h, bf16 bits and values, and the median of timed runs for
 * their --bench modes (t_bench, where the test includes CUDA's runtime
 * header first).
 */
#ifndef MS_TEST_BF16_H
#define MS_TEST_BF16_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_rng.h"

/* float to bf16, round to nearest even (finite inputs) */
static uint16_t to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static double from_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* n random bf16 values (N(0, sd)), their bits and their values */
static void fill(uint16_t *bits, double *val, size_t n, double sd)
{
	for (size_t i = 0; i < n; i++) {
		bits[i] = to_bf16((float)(sd * gauss()));
		val[i] = from_bf16(bits[i]);
	}
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return (x > y) - (x < y);
}

/* the median of n (even) times, sorted in place */
static inline float t_median(float *t, int n)
{
	qsort(t, (size_t)n, sizeof *t, cmp_float);
	return (t[n / 2 - 1] + t[n / 2]) / 2;
}

#ifdef CUDART_VERSION
#define BENCH_WARM 3
#define BENCH_RUNS 20

/* The median ms of BENCH_RUNS calls of run(ctx) after BENCH_WARM, CUDA
 * events around each call on the default stream (ev: 2 * BENCH_RUNS of
 * them); < 0 when run fails (it says why) or an event call does. */
static inline float t_bench(int (*run)(void *ctx), void *ctx, cudaEvent_t *ev)
{
	float ms[BENCH_RUNS];
	for (int i = 0; i < BENCH_WARM + BENCH_RUNS; i++) {
		int j = i - BENCH_WARM;
		if (j >= 0 && cudaEventRecord(ev[2 * j], NULL) != cudaSuccess)
			return -1;
		if (run(ctx))
			return -1;
		if (j >= 0 && cudaEventRecord(ev[2 * j + 1], NULL) != cudaSuccess)
			return -1;
	}
	if (cudaDeviceSynchronize() != cudaSuccess)
		return -1;
	for (int j = 0; j < BENCH_RUNS; j++)
		if (cudaEventElapsedTime(&ms[j], ev[2 * j], ev[2 * j + 1]) != cudaSuccess)
			return -1;
	return t_median(ms, BENCH_RUNS);
}
#endif

#endif
