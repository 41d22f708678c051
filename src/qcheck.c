/*
 * qcheck.c: the checks of a quantized state against itself and its record
 * that need no high-precision source (msverify quant): the two layouts of a
 * weight agree, and the weights hold what the "quantize" edge of the
 * inventory says was made. The statistics against a source are ms_qstats
 * (quant.c).
 */
#include "quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

int ms_qweight_layouts_agree(const struct ms_qweight *w, int nthreads, double *diff,
			     struct ms_err *err)
{
	uint64_t R = w->rows, C = w->cols;
	uint8_t *pt = NULL, *st = NULL;
	float *a = NULL, *b = NULL;
	int rc = MS_OK;

	*diff = 0;
	if (!w->packed[MS_NVFP4_LAYOUT_ROWWISE] || !w->packed[MS_NVFP4_LAYOUT_COLUMNWISE])
		return ms_err_set(err, MS_EINVAL, "'%s': not quantized in both layouts", w->prefix);
	if (w->block == MS_NVFP4_BLOCK_2D) {
		const struct ms_tensor *p = w->packed[MS_NVFP4_LAYOUT_ROWWISE];
		const struct ms_tensor *sc = w->scales[MS_NVFP4_LAYOUT_ROWWISE];
		const struct ms_tensor *pc = w->packed[MS_NVFP4_LAYOUT_COLUMNWISE];
		const struct ms_tensor *sct = w->scales[MS_NVFP4_LAYOUT_COLUMNWISE];

		pt = ms_malloc(pc->nbytes);
		st = ms_malloc(sct->nbytes);
		if (!pt || !st) {
			rc = ms_err_nomem(err);
			goto out;
		}
		rc = ms_nvfp4_transpose(MS_NVFP4_BLOCK_2D, R, C, p->data, sc->data, pt, st, err);
		if (rc == MS_OK)
			*diff = memcmp(pt, pc->data, pc->nbytes) || memcmp(st, sct->data, sct->nbytes);
		goto out;
	}
	{
		double num = 0, den = 0;

		a = ms_malloc(R * C * sizeof(float));
		b = ms_malloc(R * C * sizeof(float));
		if (!a || !b) {
			rc = ms_err_nomem(err);
			goto out;
		}
		if ((rc = ms_qweight_decode(w, MS_NVFP4_LAYOUT_ROWWISE, nthreads, a, err)) != MS_OK ||
		    (rc = ms_qweight_decode(w, MS_NVFP4_LAYOUT_COLUMNWISE, nthreads, b, err)) != MS_OK)
			goto out;
		for (uint64_t r = 0; r < R; r++)
			for (uint64_t c = 0; c < C; c++) {
				double x = a[r * C + c], y = b[c * R + r];

				num += (x - y) * (x - y);
				den += x * x;
			}
		*diff = den > 0 ? sqrt(num / den) : sqrt(num);
	}
out:
	ms_free(pt);
	ms_free(st);
	ms_free(a);
	ms_free(b);
	return rc;
}

int ms_qweight_edge_check(const struct ms_qweight *w, const char *params, char *why,
			  size_t n, struct ms_err *err)
{
	const cJSON *r, *b, *l, *it;
	cJSON *j;
	int nomem, rc = MS_OK;

	why[0] = 0;
	if (!(j = ms_json_parse(params, strlen(params), &nomem)))
		return nomem ? ms_err_nomem(err)
			     : ms_err_set(err, MS_EINVAL, "'%s': the quantize edge's parameters are not JSON",
					  w->prefix);
	r = cJSON_GetObjectItemCaseSensitive(j, "recipe");
	b = cJSON_GetObjectItemCaseSensitive(j, "block");
	l = cJSON_GetObjectItemCaseSensitive(j, "layouts");
	if (cJSON_IsString(r) && strcmp(r->valuestring, ms_nvfp4_recipe_name(w->recipe))) {
		snprintf(why, n, "recipe %s, the quantize edge records %s",
			 ms_nvfp4_recipe_name(w->recipe), r->valuestring);
		rc = MS_ECHECK;
		goto out;
	}
	if (cJSON_IsString(b) && strcmp(b->valuestring, ms_nvfp4_block_name(w->block))) {
		snprintf(why, n, "%s blocks, the quantize edge records %s",
			 ms_nvfp4_block_name(w->block), b->valuestring);
		rc = MS_ECHECK;
		goto out;
	}
	cJSON_ArrayForEach(it, l) {
		enum ms_nvfp4_layout lay;

		if (!cJSON_IsString(it))
			continue;
		lay = !strcmp(it->valuestring, "columnwise") ? MS_NVFP4_LAYOUT_COLUMNWISE
							      : MS_NVFP4_LAYOUT_ROWWISE;
		if (!w->packed[lay]) {
			snprintf(why, n, "no %s copy, the quantize edge records one", it->valuestring);
			rc = MS_ECHECK;
			goto out;
		}
	}
out:
	cJSON_Delete(j);
	return rc;
}
