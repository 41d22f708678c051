/*
 * profile_quant.c: one launch of the GPU quantizer, for a profiler.
 *
 *   profile_quant [ROWS COLS]      (default 32768 x 32768 bf16)
 *
 * Quantizes a random normal bf16 matrix (Box-Muller on the host: finite
 * values, never all zeros) with the modelopt recipe, 1D blocks, into both
 * layouts in one pass, once after one warm-up, entirely in device memory:
 * the launch NVIDIA Nsight Compute should look at (tools/bench/NOTES.md
 * says which metrics and what they showed). Prints the time of the timed
 * call; exit 0, 3 on failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gpu.h"
#include "nvfp4.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

static double unit(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}

static uint16_t bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static int fail(const char *what, const struct ms_err *err)
{
	fprintf(stderr, "profile_quant: %s: %s\n", what, err ? err->msg : "failed");
	return 3;
}

int main(int argc, char **argv)
{
	uint64_t rows = 32768, cols = 32768, ps[2][2], ss[2][2];
	struct ms_err err = {0};
	struct ms_nvfp4_params p = {.recipe = MS_NVFP4_RECIPE_MODELOPT, .block = MS_NVFP4_BLOCK_1D};
	struct ms_nvfp4_src s;
	uint16_t *h;
	void *d = NULL, *pk[2] = {NULL, NULL}, *sc[2] = {NULL, NULL};
	float amax;
	double t0;

	if (argc == 3 && (ms_parse_u64(argv[1], 1u << 20, &rows) || ms_parse_u64(argv[2], 1u << 20, &cols)))
		return fail("usage", NULL);
	if (!ms_gpu_available())
		return fail("no GPU", NULL);
	if (!(h = malloc(rows * cols * 2)))
		return fail("host memory", NULL);
	for (uint64_t i = 0; i < rows * cols; i += 2) {
		double r = sqrt(-2.0 * log(unit())), a = 6.283185307179586 * unit();

		h[i] = bf16((float)(0.02 * r * cos(a)));
		if (i + 1 < rows * cols)
			h[i + 1] = bf16((float)(0.02 * r * sin(a)));
	}
	for (int l = 0; l < 2; l++)
		if (ms_nvfp4_shapes(rows, cols, (enum ms_nvfp4_layout)l, ps[l], ss[l], &err))
			return fail("shapes", &err);
	if (ms_gpu_malloc(&d, rows * cols * 2, &err) || ms_gpu_memcpy(d, h, rows * cols * 2, &err))
		return fail("device memory", &err);
	for (int l = 0; l < 2; l++)
		if (ms_gpu_malloc(&pk[l], ps[l][0] * ps[l][1], &err) ||
		    ms_gpu_malloc(&sc[l], ss[l][0] * ss[l][1], &err))
			return fail("device memory", &err);
	s = (struct ms_nvfp4_src){MS_DTYPE_BF16, d, rows, cols};
	if (ms_gpu_nvfp4_amax(&s, 0, &amax, &err))
		return fail("amax", &err);
	for (int k = 0; k < 2; k++) {
		t0 = ms_now();
		if (ms_gpu_nvfp4_quantize(&p, &s, amax, pk[0], sc[0], pk[1], sc[1], &err) ||
		    ms_gpu_sync(&err))
			return fail("quantize", &err);
	}
	printf("profile_quant: [%llu, %llu] bf16, modelopt 1D, both layouts: %.3f ms (host clock)\n",
	       (unsigned long long)rows, (unsigned long long)cols, (ms_now() - t0) * 1e3);
	for (int l = 0; l < 2; l++) {
		ms_gpu_free(pk[l]);
		ms_gpu_free(sc[l]);
	}
	ms_gpu_free(d);
	free(h);
	return 0;
}
