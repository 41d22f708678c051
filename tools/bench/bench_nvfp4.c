/*
 * bench_nvfp4.c: NVFP4 codec throughput on the CPU, in GB/s of bf16 input:
 * the reference (nvfp4.c) against the fast path (nvfp4_fast.c) on every
 * instruction set the CPU has, one thread and all threads, for quantize
 * (modelopt recipe, 1D and 2D blocks, rowwise and columnwise) and
 * dequantize. The fast path must give the reference's bytes here too.
 * One-thread runs are timed in CPU seconds (the per-core speed, robust on
 * a shared machine), runs on several threads in wall seconds.
 *
 *   bench_nvfp4 OUT.safetensors [MB]
 *
 * writes the random bf16 tensors it times to OUT.safetensors, so that
 * bench_nvfp4.sh can time the numpy oracle on the same tensors, and ends
 * with a line "RESULT fast1 <seconds> <bytes>" (modelopt 1D rowwise, one
 * thread) for the script's ratio.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "nvfp4.h"
#include "safetensors.h"

#define ROWS 2048
#define COLS 4096

struct set {
	size_t n;
	uint16_t **w;
	float *amax;
};

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Weights like a trained layer's: roughly normal, scale 0.02, bf16. */
static void fill(uint16_t *w, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		/* sum of four uniforms: close enough to a normal for timing */
		double v = 0;
		float f;

		for (int k = 0; k < 4; k++)
			v += (double)(next() >> 11) * 0x1p-53 - 0.5;
		f = (float)(v * 0.035);
		w[i] = ms_f32_to_bf16(f == 0.0f ? 1e-4f : f);
	}
}

/* Seconds of CPU time of this process: a one-thread run measured this way
 * is the per-core speed even on a machine other jobs are using. */
static double cpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best of runs; CPU time for one thread, wall time for several. */
static double best_of(int runs, int threads, int (*fn)(const struct set *, void *),
		      const struct set *s, void *ctx)
{
	double best = 1e30;

	for (int r = 0; r < runs; r++) {
		double t0 = threads > 1 ? ms_now() : cpu_now(), t;

		if (fn(s, ctx) != MS_OK) {
			fprintf(stderr, "bench_nvfp4: run failed\n");
			exit(3);
		}
		t = (threads > 1 ? ms_now() : cpu_now()) - t0;
		if (t < best)
			best = t;
	}
	return best;
}

struct qctx {
	struct ms_nvfp4_params p;
	int ref;
	uint8_t **packed, **scales;
};

static int run_quantize(const struct set *s, void *arg)
{
	struct qctx *c = arg;

	for (size_t i = 0; i < s->n; i++) {
		struct ms_nvfp4_src src = {MS_DTYPE_BF16, s->w[i], ROWS, COLS};
		int rc = c->ref ? ms_nvfp4_quantize_ref(&c->p, &src, s->amax[i], c->packed[i],
							c->scales[i], NULL)
				: ms_nvfp4_quantize(&c->p, &src, s->amax[i], c->packed[i],
						    c->scales[i], NULL);

		if (rc != MS_OK)
			return rc;
	}
	return MS_OK;
}

struct dqctx {
	int ref, nthreads;
	uint8_t **packed, **scales;
	float *tscale;
	uint16_t *out;
};

static int run_dequantize(const struct set *s, void *arg)
{
	struct dqctx *c = arg;

	for (size_t i = 0; i < s->n; i++) {
		int rc = c->ref ? ms_nvfp4_dequantize_ref(c->packed[i], c->scales[i], ROWS, COLS,
							  c->tscale[i], MS_NVFP4_TSCALE_MUL,
							  MS_DTYPE_BF16, c->out, NULL)
				: ms_nvfp4_dequantize(c->packed[i], c->scales[i], ROWS, COLS,
						      c->tscale[i], MS_NVFP4_TSCALE_MUL,
						      MS_DTYPE_BF16, c->out, c->nthreads, NULL);

		if (rc != MS_OK)
			return rc;
	}
	return MS_OK;
}

static int write_set(const char *path, const struct set *s)
{
	struct ms_st_writer *w = NULL;
	struct ms_err err = {0};
	uint64_t shape[2] = {ROWS, COLS};
	int rc;

	if ((rc = ms_st_writer_new(path, 1, &w, &err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < s->n && rc == MS_OK; i++) {
		char name[96];

		snprintf(name, sizeof(name), "model.layers.%zu.mlp.experts.%zu.down_proj.weight",
			 i / 8, i % 8);
		rc = ms_st_writer_add(w, name, MS_DTYPE_BF16, 2, shape, s->w[i], &err);
	}
	if (rc == MS_OK)
		rc = ms_st_writer_commit(w, &err);
out:
	if (rc != MS_OK)
		fprintf(stderr, "bench_nvfp4: %s\n", err.msg);
	ms_st_writer_free(w);
	return rc;
}

int main(int argc, char **argv)
{
	static const enum ms_nvfp4_isa isas[] = {MS_NVFP4_ISA_SCALAR, MS_NVFP4_ISA_AVX2,
						 MS_NVFP4_ISA_AVX512};
	uint64_t mb = 256, bytes;
	struct set s = {0};
	struct qctx ref, fast;
	struct dqctx dq = {0};
	double t_ref, t, t_fast1 = 0, t_dq_ref;
	int ncpu = ms_ncpus(), bad = 0;

	memset(&ref, 0, sizeof(ref));
	memset(&fast, 0, sizeof(fast));

	if (argc < 2 || (argc > 2 && ms_parse_u64(argv[2], 1 << 20, &mb))) {
		fprintf(stderr, "usage: bench_nvfp4 OUT.safetensors [MB]\n");
		return 2;
	}
	s.n = (size_t)(mb * 1000000 / (ROWS * COLS * 2));
	if (s.n == 0)
		s.n = 1;
	bytes = (uint64_t)s.n * ROWS * COLS * 2;
	s.w = calloc(s.n, sizeof(*s.w));
	s.amax = calloc(s.n, sizeof(*s.amax));
	ref.packed = calloc(s.n, sizeof(uint8_t *));
	ref.scales = calloc(s.n, sizeof(uint8_t *));
	fast.packed = calloc(s.n, sizeof(uint8_t *));
	fast.scales = calloc(s.n, sizeof(uint8_t *));
	dq.tscale = calloc(s.n, sizeof(float));
	dq.out = malloc((size_t)ROWS * COLS * 2);
	for (size_t i = 0; i < s.n; i++) {
		struct ms_nvfp4_src src;
		struct ms_nvfp4_tscale ts;

		s.w[i] = malloc((size_t)ROWS * COLS * 2);
		ref.packed[i] = malloc((size_t)ROWS * COLS / 2);
		ref.scales[i] = malloc((size_t)ROWS * COLS / 16);
		fast.packed[i] = malloc((size_t)ROWS * COLS / 2);
		fast.scales[i] = malloc((size_t)ROWS * COLS / 16);
		fill(s.w[i], (uint64_t)ROWS * COLS);
		src = (struct ms_nvfp4_src){MS_DTYPE_BF16, s.w[i], ROWS, COLS};
		ms_nvfp4_amax(&src, 0, 0, MS_NVFP4_ISA_AUTO, &s.amax[i], NULL);
		ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_MODELOPT, s.amax[i], &ts, NULL);
		dq.tscale[i] = ts.scale_2;
	}
	if (write_set(argv[1], &s) != MS_OK)
		return 3;
	printf("nvfp4: %zu tensors [%d,%d] bf16, %.0f MB; best isa %s, %d cpus\n", s.n, ROWS,
	       COLS, (double)bytes / 1e6, ms_nvfp4_isa_name(ms_nvfp4_isa_best()), ncpu);
	printf("%-34s %10s %8s\n", "quantize (modelopt)", "GB/s", "vs ref");
	for (int blk = 0; blk < 2; blk++) {
		for (int lay = 0; lay < 2; lay++) {
			char label[64];

			ref.ref = 1;
			ref.p = (struct ms_nvfp4_params){.block = blk, .layout = lay};
			t_ref = best_of(1, 1, run_quantize, &s, &ref);
			snprintf(label, sizeof(label), "  %s %s reference", blk ? "2d" : "1d",
				 lay ? "columnwise" : "rowwise");
			printf("%-34s %10.3f %7.1fx\n", label, (double)bytes / t_ref / 1e9, 1.0);
			for (int k = 0; k <= 3; k++) {
				enum ms_nvfp4_isa isa = k < 3 ? isas[k] : MS_NVFP4_ISA_AUTO;
				int nt = k < 3 ? 1 : ncpu;

				if (!ms_nvfp4_isa_supported(isa))
					continue;
				fast.p = (struct ms_nvfp4_params){.block = blk, .layout = lay,
								  .isa = isa, .nthreads = nt};
				t = best_of(k == 0 ? 1 : 3, nt, run_quantize, &s, &fast);
				for (size_t i = 0; i < s.n; i++)
					if (memcmp(ref.packed[i], fast.packed[i], (size_t)ROWS * COLS / 2) ||
					    memcmp(ref.scales[i], fast.scales[i], (size_t)ROWS * COLS / 16))
						bad = 1;
				snprintf(label, sizeof(label), "  %s %s %s, %d thread%s",
					 blk ? "2d" : "1d", lay ? "columnwise" : "rowwise",
					 ms_nvfp4_isa_name(k < 3 ? isa : ms_nvfp4_isa_best()), nt,
					 nt > 1 ? "s" : "");
				printf("%-34s %10.3f %7.1fx\n", label, (double)bytes / t / 1e9, t_ref / t);
				if (blk == 0 && lay == 0 && k < 3 && isa == ms_nvfp4_isa_best())
					t_fast1 = t;
			}
		}
	}
	/* dequantize the last 1D rowwise result: packed bytes in, bf16 out */
	printf("%-34s %10s %8s\n", "dequantize to bf16 (GB/s of bf16 out)", "", "");
	fast.p = (struct ms_nvfp4_params){0};
	run_quantize(&s, &fast);
	dq.packed = fast.packed;
	dq.scales = fast.scales;
	dq.ref = 1;
	t_dq_ref = best_of(1, 1, run_dequantize, &s, &dq);
	printf("%-34s %10.3f %7.1fx\n", "  reference", (double)bytes / t_dq_ref / 1e9, 1.0);
	dq.ref = 0;
	for (int nt = 1; nt <= ncpu; nt = nt == 1 && ncpu > 1 ? ncpu : ncpu + 1) {
		char label[64];

		dq.nthreads = nt;
		t = best_of(3, nt, run_dequantize, &s, &dq);
		snprintf(label, sizeof(label), "  fast, %d thread%s", nt, nt > 1 ? "s" : "");
		printf("%-34s %10.3f %7.1fx\n", label, (double)bytes / t / 1e9, t_dq_ref / t);
	}
	if (bad) {
		printf("bench_nvfp4: the fast path differs from the reference\n");
		return 1;
	}
	printf("RESULT fast1 %.6f %llu\n", t_fast1, (unsigned long long)bytes);
	return 0;
}
