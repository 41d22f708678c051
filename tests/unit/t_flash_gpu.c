/*
 * t_flash_gpu.c: the fused causal attention kernels (kernels/flash.h)
 * against a host reference in double computed from the same bf16 inputs:
 * forward O and LSE, backward dQ, dK, dV, on sequence lengths 1, 7, 64,
 * 130 and 1024 (single rows, tails of a tile, exact tiles, many tiles),
 * head dims 16, 32, 64, 128, GQA groups of 2 and 4 and plain multi-head,
 * one and two sequences. Outputs are poisoned with NaN before each launch,
 * so an element the kernels do not write fails. The backward runs twice
 * and must be bit-identical (no atomics). Shapes the kernels do not cover
 * are refused with MS_EINVAL.
 *
 * Tolerance, per element: |gpu - ref| <= 2^-6 * mag + 1e-6, where mag is
 * the element's sum of absolute terms computed alongside the reference
 * (for O_i: sum_j P_ij |V_j|; dV_j: sum_i P_ij |dO_i|; dQ_i, dK_j: scale *
 * sum |dS_ij| |K_j| (|Q_i|), dS's magnitude including the error that O's
 * rounding carries into D = dO . O). The kernels round exactly one operand
 * of each product to bf16 (P or dS; the inputs are bf16 already, the
 * products of two bf16 are exact in float), so each term is off by at most
 * u = 2^-8 (bf16's unit roundoff) relative and |err| <= u * mag plus float
 * accumulation; 2^-6 = 4u leaves room for exp2f's few ulps and the float
 * sums (a CPU emulation of the kernels measured up to 0.8u) while a wrong
 * index, mask or rescale (an error the size of the value) still fails.
 * LSE is float all the way: |err| <= 2e-4 * (1 + |lse|).
 *
 * GPU tier: without a GPU the binary says it skipped (with MS_TEST_GPU
 * set, a missing GPU is a failure).
 */
#include <math.h>

#include "test.h"
#include "gpu.h"
#ifdef MS_HAVE_CUDA
#include "flash.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static double gauss(void)
{
	double u = (double)(rnd() >> 11) * 0x1p-53 + 1e-12;
	double v = (double)(rnd() >> 11) * 0x1p-53;

	return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

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

struct shape {
	uint32_t S, hd, nh, nkv, B;
};

struct ref {
	double *o, *omag, *lse, *dq, *dqmag, *dk, *dkmag, *dv, *dvmag;
};

static void ref_free(struct ref *r)
{
	free(r->o);
	free(r->omag);
	free(r->lse);
	free(r->dq);
	free(r->dqmag);
	free(r->dk);
	free(r->dkmag);
	free(r->dv);
	free(r->dvmag);
}

/* The reference: O, LSE, dQ, dK, dV and the error magnitudes, in double. */
static int reference(const struct shape *sh, const double *q, const double *k, const double *v,
		     const double *dout, struct ref *r)
{
	uint32_t S = sh->S, hd = sh->hd, nh = sh->nh, nkv = sh->nkv, rep = nh / nkv;
	uint64_t T = (uint64_t)sh->B * S, dq = (uint64_t)nh * hd, dkv = (uint64_t)nkv * hd;
	double scale = 1.0 / sqrt((double)hd);
	double *P = malloc((size_t)S * S * sizeof *P), *dS = malloc((size_t)S * S * sizeof *dS);
	double *dSm = malloc((size_t)S * S * sizeof *dSm);
	int rc = 0;

	r->o = calloc(T * dq, sizeof(double));
	r->omag = calloc(T * dq, sizeof(double));
	r->lse = calloc(T * nh, sizeof(double));
	r->dq = calloc(T * dq, sizeof(double));
	r->dqmag = calloc(T * dq, sizeof(double));
	r->dk = calloc(T * dkv, sizeof(double));
	r->dkmag = calloc(T * dkv, sizeof(double));
	r->dv = calloc(T * dkv, sizeof(double));
	r->dvmag = calloc(T * dkv, sizeof(double));
	if (!P || !dS || !dSm || !r->o || !r->omag || !r->lse || !r->dq || !r->dqmag || !r->dk ||
	    !r->dkmag || !r->dv || !r->dvmag) {
		rc = 1;
		goto out;
	}
	for (uint32_t b = 0; b < sh->B; b++) {
		for (uint32_t h = 0; h < nh; h++) {
			uint32_t kh = h / rep;
#define QV(i) (q + ((uint64_t)b * S + (i)) * dq + (uint64_t)h * hd)
#define DO(i) (dout + ((uint64_t)b * S + (i)) * dq + (uint64_t)h * hd)
#define KV(a, j) ((a) + ((uint64_t)b * S + (j)) * dkv + (uint64_t)kh * hd)
#define OUTQ(a, i) ((a) + ((uint64_t)b * S + (i)) * dq + (uint64_t)h * hd)
			for (uint32_t i = 0; i < S; i++) {
				double m = -INFINITY, l = 0, *o = OUTQ(r->o, i), *om = OUTQ(r->omag, i);
				double *p = P + (uint64_t)i * S;
				for (uint32_t j = 0; j <= i; j++) {
					double s = 0;
					for (uint32_t x = 0; x < hd; x++)
						s += QV(i)[x] * KV(k, j)[x];
					p[j] = s * scale;
					if (p[j] > m)
						m = p[j];
				}
				for (uint32_t j = 0; j <= i; j++)
					l += exp(p[j] - m);
				for (uint32_t j = 0; j <= i; j++) {
					p[j] = exp(p[j] - m) / l;
					for (uint32_t x = 0; x < hd; x++) {
						o[x] += p[j] * KV(v, j)[x];
						om[x] += p[j] * fabs(KV(v, j)[x]);
					}
				}
				r->lse[((uint64_t)b * nh + h) * S + i] = m + log(l);
			}
			for (uint32_t i = 0; i < S; i++) {
				double D = 0, Dm = 0, *p = P + (uint64_t)i * S;
				for (uint32_t x = 0; x < hd; x++) {
					D += DO(i)[x] * OUTQ(r->o, i)[x];
					Dm += fabs(DO(i)[x]) * OUTQ(r->omag, i)[x];
				}
				for (uint32_t j = 0; j <= i; j++) {
					double dp = 0;
					for (uint32_t x = 0; x < hd; x++)
						dp += DO(i)[x] * KV(v, j)[x];
					dS[(uint64_t)i * S + j] = p[j] * (dp - D);
					dSm[(uint64_t)i * S + j] =
						fabs(p[j] * (dp - D)) + p[j] * Dm;
				}
			}
			for (uint32_t i = 0; i < S; i++) {
				for (uint32_t j = 0; j <= i; j++) {
					double ds = dS[(uint64_t)i * S + j] * scale;
					double dsm = dSm[(uint64_t)i * S + j] * scale;
					double pij = P[(uint64_t)i * S + j];
					for (uint32_t x = 0; x < hd; x++) {
						OUTQ(r->dq, i)[x] += ds * KV(k, j)[x];
						OUTQ(r->dqmag, i)[x] += dsm * fabs(KV(k, j)[x]);
						KV(r->dk, j)[x] += ds * QV(i)[x];
						KV(r->dkmag, j)[x] += dsm * fabs(QV(i)[x]);
						KV(r->dv, j)[x] += pij * DO(i)[x];
						KV(r->dvmag, j)[x] += pij * fabs(DO(i)[x]);
					}
				}
			}
#undef QV
#undef DO
#undef KV
#undef OUTQ
		}
	}
out:
	free(P);
	free(dS);
	free(dSm);
	return rc;
}

/* every element within k * mag + 1e-6; prints the worst */
static int close_to(const char *what, const struct shape *sh, const float *got, const double *want,
		    const double *mag, double k, uint64_t n)
{
	double wabs = 0, wrel = 0, maxref = 0;
	uint64_t at = 0;
	int bad = 0;

	for (uint64_t i = 0; i < n; i++) {
		double e = fabs((double)got[i] - want[i]);
		if (fabs(want[i]) > maxref)
			maxref = fabs(want[i]);
		if (!(e <= k * mag[i] + 1e-6) && !bad) {
			at = i;
			bad = 1;
		}
		if (e > wabs || e != e)
			wabs = e;
		if (mag[i] > 0 && (e / mag[i] > wrel || e != e))
			wrel = e / mag[i];
	}
	printf("  S %u hd %u heads %u/%u B %u %s: max abs err %.3g (max |ref| %.3g), "
	       "max err/mag %.3g (limit %.3g)\n",
	       sh->S, sh->hd, sh->nh, sh->nkv, sh->B, what, wabs, maxref, wrel, k);
	if (bad)
		fprintf(stderr, "%s: element %llu: gpu %.9g ref %.9g mag %.3g\n", what,
			(unsigned long long)at, (double)got[at], want[at], mag[at]);
	return bad;
}

static void poison(float *h, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		h[i] = NAN;
}

static int run_shape(const struct shape *sh)
{
	struct ms_flash_shape fs = {sh->B, sh->S, sh->nh, sh->nkv, sh->hd};
	struct ms_err err = {0};
	struct ref r = {0};
	uint64_t T = (uint64_t)sh->B * sh->S, nq = T * sh->nh * sh->hd, nkv = T * sh->nkv * sh->hd;
	uint64_t nl = T * sh->nh, ws = ms_flash_workspace_bytes(&fs);
	uint16_t *hq = malloc(nq * 2), *hk = malloc(nkv * 2), *hv = malloc(nkv * 2);
	uint16_t *hdo = malloc(nq * 2);
	double *q = malloc(nq * 8), *k = malloc(nkv * 8), *v = malloc(nkv * 8), *dout = malloc(nq * 8);
	float *o = malloc(nq * 4), *lse = malloc(nl * 4), *dq = malloc(nq * 4);
	float *dk = malloc(nkv * 4), *dv = malloc(nkv * 4), *dq2 = malloc(nq * 4);
	float *dk2 = malloc(nkv * 4), *dv2 = malloc(nkv * 4);
	void *gq = NULL, *gk = NULL, *gv = NULL, *gdo = NULL, *go = NULL, *gl = NULL, *gdq = NULL;
	void *gdk = NULL, *gdv = NULL, *gws = NULL;
	double *lmag = malloc(nl * 8);
	int rc = 1;

	if (!hq || !hk || !hv || !hdo || !q || !k || !v || !dout || !o || !lse || !dq || !dk ||
	    !dv || !dq2 || !dk2 || !dv2 || !lmag)
		goto out;
	fill(hq, q, nq, 1.0);
	fill(hk, k, nkv, 1.0);
	fill(hv, v, nkv, 1.0);
	fill(hdo, dout, nq, 1.0);
	if (reference(sh, q, k, v, dout, &r))
		goto out;
	if (ms_gpu_malloc(&gq, nq * 2, &err) || ms_gpu_malloc(&gk, nkv * 2, &err) ||
	    ms_gpu_malloc(&gv, nkv * 2, &err) || ms_gpu_malloc(&gdo, nq * 2, &err) ||
	    ms_gpu_malloc(&go, nq * 4, &err) || ms_gpu_malloc(&gl, nl * 4, &err) ||
	    ms_gpu_malloc(&gdq, nq * 4, &err) || ms_gpu_malloc(&gdk, nkv * 4, &err) ||
	    ms_gpu_malloc(&gdv, nkv * 4, &err) || ms_gpu_malloc(&gws, ws, &err) ||
	    ms_gpu_memcpy(gq, hq, nq * 2, &err) || ms_gpu_memcpy(gk, hk, nkv * 2, &err) ||
	    ms_gpu_memcpy(gv, hv, nkv * 2, &err) || ms_gpu_memcpy(gdo, hdo, nq * 2, &err))
		goto cuda;
	/* forward, over poisoned outputs */
	poison(o, nq);
	poison(lse, nl);
	if (ms_gpu_memcpy(go, o, nq * 4, &err) || ms_gpu_memcpy(gl, lse, nl * 4, &err) ||
	    ms_flash_fwd(&fs, gq, gk, gv, go, gl, NULL, &err) || ms_gpu_sync(&err) ||
	    ms_gpu_memcpy(o, go, nq * 4, &err) || ms_gpu_memcpy(lse, gl, nl * 4, &err))
		goto cuda;
	if (close_to("O", sh, o, r.o, r.omag, 0x1p-6, nq))
		goto out;
	for (uint64_t i = 0; i < nl; i++)
		lmag[i] = 1 + fabs(r.lse[i]);
	if (close_to("LSE", sh, lse, r.lse, lmag, 2e-4, nl))
		goto out;
	/* backward twice, over poison; the second must equal the first bit
	 * for bit */
	for (int run = 0; run < 2; run++) {
		float *a = run ? dq2 : dq, *b = run ? dk2 : dk, *c = run ? dv2 : dv;
		poison(a, nq);
		poison(b, nkv);
		poison(c, nkv);
		if (ms_gpu_memcpy(gdq, a, nq * 4, &err) || ms_gpu_memcpy(gdk, b, nkv * 4, &err) ||
		    ms_gpu_memcpy(gdv, c, nkv * 4, &err) ||
		    ms_flash_bwd(&fs, gq, gk, gv, go, gdo, gl, gdq, gdk, gdv, gws, NULL, &err) ||
		    ms_gpu_sync(&err) || ms_gpu_memcpy(a, gdq, nq * 4, &err) ||
		    ms_gpu_memcpy(b, gdk, nkv * 4, &err) || ms_gpu_memcpy(c, gdv, nkv * 4, &err))
			goto cuda;
	}
	if (close_to("dQ", sh, dq, r.dq, r.dqmag, 0x1p-6, nq) ||
	    close_to("dK", sh, dk, r.dk, r.dkmag, 0x1p-6, nkv) ||
	    close_to("dV", sh, dv, r.dv, r.dvmag, 0x1p-6, nkv))
		goto out;
	if (memcmp(dq, dq2, nq * 4) || memcmp(dk, dk2, nkv * 4) || memcmp(dv, dv2, nkv * 4)) {
		fprintf(stderr, "S %u hd %u: two backward runs differ\n", sh->S, sh->hd);
		goto out;
	}
	rc = 0;
	goto out;
cuda:
	fprintf(stderr, "S %u hd %u: %s\n", sh->S, sh->hd, err.msg);
out:
	ms_gpu_free(gq);
	ms_gpu_free(gk);
	ms_gpu_free(gv);
	ms_gpu_free(gdo);
	ms_gpu_free(go);
	ms_gpu_free(gl);
	ms_gpu_free(gdq);
	ms_gpu_free(gdk);
	ms_gpu_free(gdv);
	ms_gpu_free(gws);
	ref_free(&r);
	free(hq);
	free(hk);
	free(hv);
	free(hdo);
	free(q);
	free(k);
	free(v);
	free(dout);
	free(o);
	free(lse);
	free(dq);
	free(dk);
	free(dv);
	free(dq2);
	free(dk2);
	free(dv2);
	free(lmag);
	return rc;
}

/* every S, head dim, head grouping and batch size of the brief, without
 * the full cross product (the double reference of S = 1024 is the cost) */
static int test_flash_shapes(void)
{
	static const struct shape sh[] = {
		{1, 16, 4, 2, 1},     {1, 128, 16, 4, 2},  {7, 64, 4, 4, 2},
		{7, 16, 16, 4, 1},    {64, 128, 16, 4, 1}, {64, 32, 4, 2, 2},
		{64, 16, 4, 4, 2},    {130, 16, 16, 4, 2}, {130, 64, 4, 2, 1},
		{130, 128, 4, 2, 2},  {1024, 64, 4, 2, 1}, {1024, 128, 4, 4, 1},
		{1024, 16, 16, 4, 2},
	};
	for (size_t i = 0; i < sizeof sh / sizeof *sh; i++)
		T_ASSERT_MSG(!run_shape(&sh[i]), "S %u hd %u heads %u/%u B %u", sh[i].S, sh[i].hd,
			     sh[i].nh, sh[i].nkv, sh[i].B);
	return 0;
}

/* shapes outside the kernels: refused before any launch */
static int test_flash_refuses(void)
{
	static const struct ms_flash_shape bad[] = {
		{1, 8, 4, 2, 48}, {1, 8, 4, 2, 256}, {1, 8, 4, 2, 8},
		{1, 8, 6, 4, 16}, {0, 8, 4, 2, 16},  {1, 0, 4, 2, 16},
	};
	void *p = NULL;
	float *f;
	struct ms_err err = {0};

	T_ASSERT(!ms_flash_supported(48) && !ms_flash_supported(0) && ms_flash_supported(16) &&
		 ms_flash_supported(32) && ms_flash_supported(64) && ms_flash_supported(128));
	T_ASSERT(ms_gpu_malloc(&p, 1 << 20, &err) == MS_OK);
	f = p;
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		T_ASSERT_EQ_INT(ms_flash_fwd(&bad[i], p, p, p, f, f, NULL, &err), MS_EINVAL);
		T_ASSERT_EQ_INT(ms_flash_bwd(&bad[i], p, p, p, f, p, f, f, f, f, p, NULL, &err),
				MS_EINVAL);
	}
	{
		struct ms_flash_shape ok = {1, 8, 4, 2, 16};
		/* a misaligned operand */
		T_ASSERT_EQ_INT(ms_flash_fwd(&ok, (char *)p + 2, p, p, f, f, NULL, &err), MS_EINVAL);
		T_ASSERT(strstr(err.msg, "aligned"));
	}
	ms_gpu_free(p);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_flash_shapes),
	T_CASE(test_flash_refuses),
};
#endif

int main(int argc, char **argv)
{
	if (!ms_gpu_available()) {
		struct ms_err err = {0};

		ms_gpu_describe(NULL, 0, &err);
		if (getenv("MS_TEST_GPU")) {
			fprintf(stderr, "%s: the gpu tier needs a gpu: %s\n", __FILE__, err.msg);
			printf("%s: 0 passed, 1 failed\n", __FILE__);
			return 1;
		}
		printf("%s: skipped (%s)\n%s: 0 passed, 0 failed\n", __FILE__, err.msg, __FILE__);
		return 0;
	}
#ifdef MS_HAVE_CUDA
	return t_main(__FILE__, cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
#else
	(void)argc;
	(void)argv;
	return 0;
#endif
}
