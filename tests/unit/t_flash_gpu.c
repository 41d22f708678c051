/*
 * t_flash_gpu.c: the fused causal attention kernels (kernels/flash.h) and
 * cuDNN's fused SDPA through kernels/sdpa.h (bf16 outputs; a shape it has
 * no plan for is said and left out (cuDNN refuses S = 1), except head dims
 * 64 and 128 with S > 1; on an sm_90 cuDNN must load) against a host reference in double computed from the same bf16 inputs:
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
 *
 * t_flash_gpu --bench: no reference, the time of each direction at the
 * trainer's shapes (B 4, S 2048, 16/4 heads, head dims
 * 128 and 64): CUDA events around each launch, the median of 20 after 3
 * warm-up runs, with the TFLOP/s of the causal product (forward
 * 4 B nh S^2 hd / 2, backward 2.5 times that).
 */
#include <math.h>

#include "test_gpu.h"
#ifdef MS_HAVE_CUDA
#include <cuda_runtime.h>

#include "flash.h"
#include "sdpa.h"
#include "test_bf16.h"
#include "train/model.h"
#include "xgemm.h"

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
static int close_to(const char *what, const struct shape *sh, const float *got,
		    const double *want, const double *mag, double k, uint64_t n)
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
		fprintf(stderr, "%s: element %llu: gpu %.9g ref %.9g mag %.3g\n",
			what, (unsigned long long)at, (double)got[at], want[at], mag[at]);
	return bad;
}

/* the two implementations of flash.h's contract: the project's kernels
 * (float outputs) and cuDNN's fused SDPA through sdpa.h (bf16 outputs) */
enum { BK_FLASH, BK_CUDNN, BK_N };
static const char *bk_name[BK_N] = {"flash", "cuDNN"};

/* one shape's inputs on the device, its outputs there and on the host */
struct run {
	const struct shape *sh;
	struct ms_flash_shape fs;
	int bk;
	struct ms_sdpa *sd;          /* BK_CUDNN: the shape's plans */
	uint64_t nq, nkv, nl;
	void *gq, *gk, *gv, *gdo, *go, *gl, *gdq, *gdk, *gdv, *gws;
	float *o, *lse, *dq, *dk, *dv, *dq2, *dk2, *dv2;
	uint16_t *h16;               /* bf16 outputs on their way to float */
	double *lmag;
};

static int k_fwd(struct run *u, struct ms_err *err)
{
	if (u->bk == BK_FLASH)
		return ms_flash_fwd(&u->fs, u->gq, u->gk, u->gv, u->go, u->gl, NULL, err);
	return ms_sdpa_fwd(u->sd, u->gq, u->gk, u->gv, u->go, u->gl, u->gws, NULL, err);
}

static int k_bwd(struct run *u, struct ms_err *err)
{
	if (u->bk == BK_FLASH)
		return ms_flash_bwd(&u->fs, u->gq, u->gk, u->gv, u->go, u->gdo, u->gl, u->gdq,
				    u->gdk, u->gdv, u->gws, NULL, err);
	return ms_sdpa_bwd(u->sd, u->gq, u->gk, u->gv, u->go, u->gdo, u->gl, u->gdq, u->gdk,
			   u->gdv, u->gws, NULL, err);
}

/* n outputs of the backend's type from the device into float h */
static int fetch(struct run *u, float *h, const void *g, uint64_t n, struct ms_err *err)
{
	if (u->bk == BK_FLASH)
		return ms_gpu_memcpy(h, g, n * 4, err);
	if (ms_gpu_memcpy(u->h16, g, n * 2, err))
		return 1;
	for (uint64_t i = 0; i < n; i++)
		h[i] = from_bf16(u->h16[i]);
	return 0;
}

/* every output byte 0xff before a launch: NaN as float and as bf16, so an
 * element the kernels do not write fails */
static int poison(void *g, uint64_t n, struct ms_err *err)
{
	return ms_gpu_memset(g, 0xff, n * 4, err);
}

/* the forward and (twice) the backward against the reference; 0 when
 * every element is within tolerance and the two backward runs are
 * bit-identical */
static int check_kernels(struct run *u, const struct ref *r)
{
	const struct shape *sh = u->sh;
	struct ms_err err = {0};
	uint64_t nq = u->nq, nkv = u->nkv, nl = u->nl;

	printf("  %s:\n", bk_name[u->bk]);
	/* forward, over poisoned outputs */
	if (poison(u->go, nq, &err) || poison(u->gl, nl, &err) || k_fwd(u, &err) ||
	    ms_gpu_sync(&err) || fetch(u, u->o, u->go, nq, &err) ||
	    ms_gpu_memcpy(u->lse, u->gl, nl * 4, &err))
		goto cuda;
	if (close_to("O", sh, u->o, r->o, r->omag, 0x1p-6, nq))
		return 1;
	for (uint64_t i = 0; i < nl; i++)
		u->lmag[i] = 1 + fabs(r->lse[i]);
	if (close_to("LSE", sh, u->lse, r->lse, u->lmag, 2e-4, nl))
		return 1;
	/* backward twice, over poison; the second must equal the first bit
	 * for bit */
	for (int run = 0; run < 2; run++) {
		float *a = run ? u->dq2 : u->dq, *b = run ? u->dk2 : u->dk, *c = run ? u->dv2 : u->dv;
		if (poison(u->gdq, nq, &err) || poison(u->gdk, nkv, &err) ||
		    poison(u->gdv, nkv, &err) || k_bwd(u, &err) || ms_gpu_sync(&err) ||
		    fetch(u, a, u->gdq, nq, &err) || fetch(u, b, u->gdk, nkv, &err) ||
		    fetch(u, c, u->gdv, nkv, &err))
			goto cuda;
	}
	if (close_to("dQ", sh, u->dq, r->dq, r->dqmag, 0x1p-6, nq) ||
	    close_to("dK", sh, u->dk, r->dk, r->dkmag, 0x1p-6, nkv) ||
	    close_to("dV", sh, u->dv, r->dv, r->dvmag, 0x1p-6, nkv))
		return 1;
	if (memcmp(u->dq, u->dq2, nq * 4) || memcmp(u->dk, u->dk2, nkv * 4) ||
	    memcmp(u->dv, u->dv2, nkv * 4)) {
		fprintf(stderr, "%s S %u hd %u: two backward runs differ\n", bk_name[u->bk], sh->S,
			sh->hd);
		return 1;
	}
	return 0;
cuda:
	fprintf(stderr, "%s S %u hd %u: %s\n", bk_name[u->bk], sh->S, sh->hd, err.msg);
	return 1;
}

/* 1 when cuDNN is loaded (test_flash_shapes decides once) */
static int cudnn_on;

/* cuDNN's side of a shape: its plans, a workspace for them (u->gws is
 * flash's, which it then replaces), the check. A shape cuDNN has no plan
 * for is said and left out (the trainer keeps flash there), except the
 * trainer's head dims (64 and 128) with more than one token, where it must
 * have one; 0 when passed or left out */
static int check_cudnn(struct run *u, const struct ref *r)
{
	struct ms_err err = {0};
	int rc;
	if (!cudnn_on)
		return 0;
	u->bk = BK_CUDNN;
	if ((rc = ms_sdpa_new(&u->fs, &u->sd, &err))) {
		int must = rc != MS_EINVAL ||
			   ((u->sh->hd == 64 || u->sh->hd == 128) && u->sh->S > 1);
		printf("  cuDNN: no plan%s (%s)\n", must ? "" : ", not checked", err.msg);
		if (must)
			fprintf(stderr, "cuDNN S %u hd %u: %s\n", u->sh->S, u->sh->hd, err.msg);
		return must;
	}
	ms_gpu_free(u->gws);
	u->gws = NULL;
	if (ms_gpu_malloc(&u->gws, ms_sdpa_workspace_bytes(u->sd) + 16, &err)) {
		fprintf(stderr, "cuDNN workspace: %s\n", err.msg);
		return 1;
	}
	/* the trainer holds ms_gmodel_sdpa_ws for it, which the footprint
	 * planner counts: cuDNN asking for more would make the planner short */
	uint64_t held = ms_gmodel_sdpa_ws(u->sh->B, u->sh->nh, u->sh->S);
	printf("  cuDNN workspace %llu bytes (the trainer holds %llu)\n",
	       (unsigned long long)ms_sdpa_workspace_bytes(u->sd), (unsigned long long)held);
	if (ms_sdpa_workspace_bytes(u->sd) > held) {
		fprintf(stderr, "cuDNN S %u hd %u: asks for more workspace than the trainer "
			"holds\n", u->sh->S, u->sh->hd);
		return 1;
	}
	return check_kernels(u, r);
}

static int run_shape(const struct shape *sh)
{
	struct ms_err err = {0};
	struct ref r = {0};
	struct run u = {0};
	uint64_t T = (uint64_t)sh->B * sh->S, nq = T * sh->nh * sh->hd, nkv = T * sh->nkv * sh->hd;
	uint64_t nl = T * sh->nh, ws;
	uint16_t *hq = malloc(nq * 2), *hk = malloc(nkv * 2), *hv = malloc(nkv * 2);
	uint16_t *hdo = malloc(nq * 2);
	double *q = malloc(nq * 8), *k = malloc(nkv * 8), *v = malloc(nkv * 8), *dout = malloc(nq * 8);
	int rc = 1;

	u.sh = sh;
	u.fs = (struct ms_flash_shape){sh->B, sh->S, sh->nh, sh->nkv, sh->hd};
	ws = ms_flash_workspace_bytes(&u.fs);
	u.nq = nq;
	u.nkv = nkv;
	u.nl = nl;
	u.o = malloc(nq * 4);
	u.lse = malloc(nl * 4);
	u.dq = malloc(nq * 4);
	u.dk = malloc(nkv * 4);
	u.dv = malloc(nkv * 4);
	u.dq2 = malloc(nq * 4);
	u.dk2 = malloc(nkv * 4);
	u.dv2 = malloc(nkv * 4);
	u.lmag = malloc(nl * 8);
	u.h16 = malloc(nq * 2);
	if (!hq || !hk || !hv || !hdo || !q || !k || !v || !dout || !u.o || !u.lse || !u.dq ||
	    !u.dk || !u.dv || !u.dq2 || !u.dk2 || !u.dv2 || !u.lmag || !u.h16)
		goto out;
	fill(hq, q, nq, 1.0);
	fill(hk, k, nkv, 1.0);
	fill(hv, v, nkv, 1.0);
	fill(hdo, dout, nq, 1.0);
	if (reference(sh, q, k, v, dout, &r))
		goto out;
	if (ms_gpu_malloc(&u.gq, nq * 2, &err) || ms_gpu_malloc(&u.gk, nkv * 2, &err) ||
	    ms_gpu_malloc(&u.gv, nkv * 2, &err) || ms_gpu_malloc(&u.gdo, nq * 2, &err) ||
	    ms_gpu_malloc(&u.go, nq * 4, &err) || ms_gpu_malloc(&u.gl, nl * 4, &err) ||
	    ms_gpu_malloc(&u.gdq, nq * 4, &err) || ms_gpu_malloc(&u.gdk, nkv * 4, &err) ||
	    ms_gpu_malloc(&u.gdv, nkv * 4, &err) || ms_gpu_malloc(&u.gws, ws, &err) ||
	    ms_gpu_memcpy(u.gq, hq, nq * 2, &err) || ms_gpu_memcpy(u.gk, hk, nkv * 2, &err) ||
	    ms_gpu_memcpy(u.gv, hv, nkv * 2, &err) || ms_gpu_memcpy(u.gdo, hdo, nq * 2, &err)) {
		fprintf(stderr, "S %u hd %u: %s\n", sh->S, sh->hd, err.msg);
		goto out;
	}
	if (check_kernels(&u, &r))
		goto out;
	if (check_cudnn(&u, &r))
		goto out;
	rc = 0;
out:
	ms_sdpa_free(u.sd);
	ms_gpu_free(u.gq);
	ms_gpu_free(u.gk);
	ms_gpu_free(u.gv);
	ms_gpu_free(u.gdo);
	ms_gpu_free(u.go);
	ms_gpu_free(u.gl);
	ms_gpu_free(u.gdq);
	ms_gpu_free(u.gdk);
	ms_gpu_free(u.gdv);
	ms_gpu_free(u.gws);
	ref_free(&r);
	free(hq);
	free(hk);
	free(hv);
	free(hdo);
	free(q);
	free(k);
	free(v);
	free(dout);
	free(u.o);
	free(u.lse);
	free(u.dq);
	free(u.dk);
	free(u.dv);
	free(u.dq2);
	free(u.dk2);
	free(u.dv2);
	free(u.lmag);
	free(u.h16);
	return rc;
}

/* every S, head dim, head grouping and batch size of the brief, without
 * the full cross product (the double reference of S = 1024 is the cost) */
static int test_flash_shapes(void)
{
	struct ms_err err = {0};
	uint64_t ver = ms_sdpa_version(&err);
	/* on the GPU the trainer is for, cuDNN's attention is its default:
	 * it must load (else that path would go untested); elsewhere its
	 * absence is said */
	if (!ver && ms_xgemm_device_ok()) {
		fprintf(stderr, "cuDNN does not load on this sm_90: %s\n", err.msg);
		return 1;
	}
	cudnn_on = ver != 0;
	if (!ver)
		printf("  cuDNN: NOT CHECKED (%s)\n", err.msg);
	else
		printf("  cuDNN %llu\n", (unsigned long long)ver);
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

/* one launch of one direction of one backend over the buffers g */
struct fl_run {
	int bwd, bk;
	const struct ms_flash_shape *fs;
	struct ms_sdpa *sd;
	void **g;
};

static int fl_once(void *ctx)
{
	const struct fl_run *r = ctx;
	void **g = r->g;
	struct ms_err err = {0};
	int rc;
	if (r->bk == BK_FLASH)
		rc = r->bwd ? ms_flash_bwd(r->fs, g[0], g[1], g[2], g[4], g[3], g[5], g[6], g[7],
					   g[8], g[9], NULL, &err)
			    : ms_flash_fwd(r->fs, g[0], g[1], g[2], g[4], g[5], NULL, &err);
	else
		rc = r->bwd ? ms_sdpa_bwd(r->sd, g[0], g[1], g[2], g[4], g[3], g[5], g[6], g[7],
					  g[8], g[9], NULL, &err)
			    : ms_sdpa_fwd(r->sd, g[0], g[1], g[2], g[4], g[5], g[9], NULL, &err);
	if (rc)
		fprintf(stderr, "bench: %s\n", err.msg);
	return rc;
}

/* --bench: both directions of both backends at the trainer's shapes (cuDNN
 * where it loads) */
static int bench(void)
{
	static const struct ms_flash_shape shapes[] = {{4, 2048, 16, 4, 128}, {4, 2048, 16, 4, 64}};
	cudaEvent_t ev[2 * BENCH_RUNS];
	int rc = 1, nev = 0;
	struct ms_err verr = {0};
	uint64_t ver = ms_sdpa_version(&verr);

	if (!ver)
		printf("bench: cuDNN not measured (%s)\n", verr.msg);
	for (; nev < 2 * BENCH_RUNS; nev++)
		if (cudaEventCreate(&ev[nev]) != cudaSuccess)
			goto out;
	for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
		const struct ms_flash_shape *fs = &shapes[si];
		uint64_t T = (uint64_t)fs->B * fs->S, nq = T * fs->nh * fs->hd;
		uint64_t nkv = T * fs->nkv * fs->hd, nl = T * fs->nh;
		struct ms_sdpa *sd = NULL;
		struct ms_err err = {0};
		uint64_t ws = ms_flash_workspace_bytes(fs);
		if (ver && ms_sdpa_new(fs, &sd, &err) == MS_OK) {
			if (ms_sdpa_workspace_bytes(sd) > ws)
				ws = ms_sdpa_workspace_bytes(sd);
		} else if (ver) {
			printf("bench hd %u: cuDNN has no plan (%s)\n", fs->hd, err.msg);
		}
		/* q k v dO o lse dq dk dv ws (outputs float-sized: either type) */
		uint64_t sz[10] = {nq * 2, nkv * 2, nkv * 2, nq * 2, nq * 4, nl * 4,
				   nq * 4, nkv * 4, nkv * 4, ws + 16};
		void *g[10] = {0};
		uint16_t *h = malloc(nq * 2);
		double flop = 4.0 * fs->B * fs->nh * (double)fs->S * fs->S * fs->hd / 2;
		float t[2];
		int bad = !h;

		for (int i = 0; i < 10 && !bad; i++)
			bad = ms_gpu_malloc(&g[i], sz[i], &err) != MS_OK;
		for (int i = 0; i < 4 && !bad; i++) {
			for (uint64_t x = 0; x < sz[i] / 2; x++)
				h[x] = to_bf16((float)gauss());
			bad = ms_gpu_memcpy(g[i], h, sz[i], &err) != MS_OK;
		}
		for (int bk = 0; bk < BK_N && !bad; bk++) {
			if (bk == BK_CUDNN && !sd)
				continue;
			/* the backward's O and LSE: this backend's forward's */
			struct fl_run fr = {0, bk, fs, sd, g};
			bad = fl_once(&fr) || ms_gpu_sync(&err);
			for (int d = 0; d < 2 && !bad; d++) {
				fr.bwd = d;
				bad = (t[d] = t_bench(fl_once, &fr, ev)) < 0;
			}
			for (int d = 0; d < 2 && !bad; d++)
				printf("bench %s B %u S %u heads %u/%u hd %u %s: %.3f ms %.1f "
				       "TFLOP/s\n",
				       bk_name[bk], fs->B, fs->S, fs->nh, fs->nkv, fs->hd,
				       d ? "bwd" : "fwd", t[d],
				       (d ? 2.5 * flop : flop) / (t[d] * 1e-3) / 1e12);
		}
		if (bad)
			fprintf(stderr, "bench hd %u: %s\n", fs->hd,
				err.msg[0] ? err.msg : "a CUDA event or launch failed");
		for (int i = 0; i < 10; i++)
			ms_gpu_free(g[i]);
		ms_sdpa_free(sd);
		free(h);
		if (bad)
			goto out;
	}
	rc = 0;
out:
	for (int i = 0; i < nev; i++)
		cudaEventDestroy(ev[i]);
	return rc;
}

static const struct t_case cases[] = {
	T_CASE(test_flash_shapes),
	T_CASE(test_flash_refuses),
};
#endif

T_GPU_MAIN_BENCH(cases, bench)
