/*
 * model.c: the trainer's MoE transformer on the CPU (model.h): weights,
 * forward, backward for the LoRA parameters, expert-parallel virtual ranks.
 *
 * Layout of activations: token-major, T = batch * seq rows, row t = b*seq+s.
 * Everything the backward needs is kept from the forward (the models the
 * CPU path trains are small; the GPU path makes its own trade-offs).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "nvfp4.h"
#include "train/model.h"
#include "train/model_int.h"
#include "train/optim.h"

/* ---- threads ---------------------------------------------------------------- */

/* A parallel loop over [0, n): contiguous ranges, one per thread. Each
 * index is computed by exactly one thread with the same arithmetic as in a
 * serial run, so results never depend on the thread count. When a thread
 * cannot be started its range runs on the caller's thread. */
typedef void (*par_fn)(void *ctx, size_t lo, size_t hi);

struct par_job {
	par_fn fn;
	void *ctx;
	size_t lo, hi;
};

static void *par_main(void *p)
{
	struct par_job *j = p;
	j->fn(j->ctx, j->lo, j->hi);
	return NULL;
}

#define PAR_MAX 64

static void par_for(int nthreads, size_t n, size_t min_chunk, par_fn fn,
		    void *ctx)
{
	struct par_job jobs[PAR_MAX];
	pthread_t th[PAR_MAX];
	int started[PAR_MAX];
	size_t nt = nthreads > 0 ? (size_t)nthreads : 1, i;

	if (nt > PAR_MAX)
		nt = PAR_MAX;
	if (min_chunk < 1)
		min_chunk = 1;
	if (nt > n / min_chunk)
		nt = n / min_chunk;
	if (nt <= 1) {
		if (n)
			fn(ctx, 0, n);
		return;
	}
	for (i = 0; i < nt; i++) {
		jobs[i].fn = fn;
		jobs[i].ctx = ctx;
		jobs[i].lo = n * i / nt;
		jobs[i].hi = n * (i + 1) / nt;
		started[i] = 0;
	}
	for (i = 1; i < nt; i++)
		started[i] = pthread_create(&th[i], NULL, par_main, &jobs[i]) == 0;
	par_main(&jobs[0]);
	for (i = 1; i < nt; i++) {
		if (started[i])
			pthread_join(th[i], NULL);
		else
			par_main(&jobs[i]);
	}
}

static float half_to_f32(enum ms_dtype dt, const uint8_t *p, uint64_t i)
{
	switch (dt) {
	case MS_DTYPE_F32: {
		float f;
		memcpy(&f, p + 4 * i, 4);
		return f;
	}
	case MS_DTYPE_BF16: {
		uint16_t h;
		memcpy(&h, p + 2 * i, 2);
		return ms_bf16_to_f32(h);
	}
	default: {
		uint16_t h;
		memcpy(&h, p + 2 * i, 2);
		return ms_f16_to_f32(h);
	}
	}
}

/* Name index: bsearch over tensors sorted by name. */
struct tindex {
	const struct ms_wtensor *t;
	size_t n;
	size_t *ord;
};

static const struct ms_wtensor *g_sort_base;

static int cmp_ord(const void *a, const void *b)
{
	return strcmp(g_sort_base[*(const size_t *)a].name,
		      g_sort_base[*(const size_t *)b].name);
}

static int tindex_init(struct tindex *ix, const struct ms_wtensor *t, size_t n,
		       struct ms_err *err)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	ix->t = t;
	ix->n = n;
	ix->ord = ms_malloc((n ? n : 1) * sizeof *ix->ord);
	if (!ix->ord)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		ix->ord[i] = i;
	pthread_mutex_lock(&mu);
	g_sort_base = t;
	qsort(ix->ord, n, sizeof *ix->ord, cmp_ord);
	pthread_mutex_unlock(&mu);
	return MS_OK;
}

static const struct ms_wtensor *tfind(const struct tindex *ix, const char *name)
{
	size_t lo = 0, hi = ix->n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(ix->t[ix->ord[mid]].name, name);
		if (!c)
			return &ix->t[ix->ord[mid]];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int is_float_dt(enum ms_dtype dt)
{
	return dt == MS_DTYPE_F32 || dt == MS_DTYPE_BF16 || dt == MS_DTYPE_F16;
}

/* Check t against an expected shape and dtype class; bytes too. */
static int check_float(const struct ms_wtensor *t, uint32_t ndim,
		       const uint64_t *shape, struct ms_err *err)
{
	uint64_t n = 1;
	if (!is_float_dt(t->dtype))
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s': dtype %s, expected BF16, F16 or F32",
				  t->name, ms_dtype_name(t->dtype));
	if (t->ndim != ndim)
		goto bad;
	for (uint32_t i = 0; i < ndim; i++) {
		if (t->shape[i] != shape[i])
			goto bad;
		n *= shape[i];
	}
	if (t->nbytes != n * (ms_dtype_bits(t->dtype) / 8) || !t->data)
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s': %llu bytes for its shape",
				  t->name, (unsigned long long)t->nbytes);
	return MS_OK;
bad:
	if (ndim == 1)
		return ms_err_set(err, MS_EINVAL, "tensor '%s': shape wrong, expected [%llu]",
				  t->name, (unsigned long long)shape[0]);
	if (ndim == 2)
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s': shape wrong, expected [%llu, %llu]", t->name,
				  (unsigned long long)shape[0], (unsigned long long)shape[1]);
	return ms_err_set(err, MS_EINVAL,
			  "tensor '%s': shape wrong, expected [%llu, %llu, %llu]", t->name,
			  (unsigned long long)shape[0], (unsigned long long)shape[1],
			  (unsigned long long)shape[2]);
}

/* A float tensor of the base by name, converted to float32 (elements
 * [off, off + n) of it into out). */
static int load_float(const struct tindex *ix, const char *name, uint32_t ndim,
		      const uint64_t *shape, uint64_t off, uint64_t n, float *out,
		      struct ms_err *err)
{
	const struct ms_wtensor *t = tfind(ix, name);
	int rc;
	if (!t)
		return ms_err_set(err, MS_EINVAL, "tensor '%s' is missing", name);
	if ((rc = check_float(t, ndim, shape, err)))
		return rc;
	for (uint64_t i = 0; i < n; i++)
		out[i] = half_to_f32(t->dtype, t->data, off + i);
	return MS_OK;
}

static float *alloc_f(uint64_t n)
{
	return ms_calloc(n ? n : 1, sizeof(float));
}

static int vec_load(const struct tindex *ix, const char *name, uint64_t n,
		    float **out, struct ms_err *err)
{
	uint64_t shape[1] = {n};
	if (!(*out = alloc_f(n)))
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	return load_float(ix, name, 1, shape, 0, n, *out, err);
}

/* Find the NVFP4 tensors of module prefix p (either msconvert format). */
static int quant_find(const struct tindex *qx, const char *p, uint64_t rows,
		      uint64_t cols, struct qpart *qp, int *found,
		      struct ms_err *err)
{
	char nm[512];
	const struct ms_wtensor *pk, *sc, *ts;
	uint64_t pshape[2], sshape[2];
	enum ms_nvfp4_tscale_kind kind = MS_NVFP4_TSCALE_MUL;
	float tsv;
	int rc;

	*found = 0;
	if (!qx || !qx->n)
		return MS_OK;
	snprintf(nm, sizeof nm, "%s.weight_packed", p);
	pk = tfind(qx, nm);
	if (pk) {
		kind = MS_NVFP4_TSCALE_DIV;
		snprintf(nm, sizeof nm, "%s.weight_global_scale", p);
	} else {
		snprintf(nm, sizeof nm, "%s.weight", p);
		pk = tfind(qx, nm);
		/* a module left in high precision by the conversion comes from
		 * the base */
		if (!pk || is_float_dt(pk->dtype))
			return MS_OK;
		snprintf(nm, sizeof nm, "%s.weight_scale_2", p);
	}
	ts = tfind(qx, nm);
	if (!ts || ts->dtype != MS_DTYPE_F32 || ts->nbytes != 4 || !ts->data)
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s' (the NVFP4 tensor scale) is missing or "
				  "not one F32", nm);
	memcpy(&tsv, ts->data, 4);
	snprintf(nm, sizeof nm, "%s.weight_scale", p);
	sc = tfind(qx, nm);
	if ((rc = ms_nvfp4_shapes(rows, cols, MS_NVFP4_LAYOUT_ROWWISE, pshape,
				  sshape, err)))
		return rc;
	if (pk->dtype != MS_DTYPE_U8 || pk->ndim != 2 || pk->shape[0] != pshape[0] ||
	    pk->shape[1] != pshape[1] || pk->nbytes != pshape[0] * pshape[1] ||
	    !pk->data)
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s': NVFP4 packed shape wrong for [%llu, %llu]",
				  pk->name, (unsigned long long)rows,
				  (unsigned long long)cols);
	if (!sc || sc->dtype != MS_DTYPE_F8_E4M3 || sc->ndim != 2 ||
	    sc->shape[0] != sshape[0] || sc->shape[1] != sshape[1] ||
	    sc->nbytes != sshape[0] * sshape[1] || !sc->data)
		return ms_err_set(err, MS_EINVAL,
				  "tensor '%s': missing, or not F8_E4M3 [%llu, %llu]", nm,
				  (unsigned long long)sshape[0],
				  (unsigned long long)sshape[1]);
	qp->rows = rows;
	qp->tscale = tsv;
	qp->kind = kind;
	qp->packed = ms_malloc(pk->nbytes ? pk->nbytes : 1);
	qp->scales = ms_malloc(sc->nbytes ? sc->nbytes : 1);
	if (!qp->packed || !qp->scales)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	memcpy(qp->packed, pk->data, pk->nbytes);
	memcpy(qp->scales, sc->data, sc->nbytes);
	*found = 1;
	return MS_OK;
}

/* Build lin->wt (columnwise, [in, out]): from the NVFP4 bytes by the exact
 * 2D transpose then decode, or by transposing the float weight. */
static int lin_colwise(struct lin *l, struct ms_err *err)
{
	uint64_t off = 0;
	int rc = MS_OK;
	uint8_t *pt = NULL, *st = NULL;
	float *tmp = NULL;

	if (l->wt)
		return MS_OK;
	if (!(l->wt = alloc_f((uint64_t)l->in * l->out)))
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	if (!l->nparts) {
		for (uint32_t o = 0; o < l->out; o++)
			for (uint32_t i = 0; i < l->in; i++)
				l->wt[(size_t)i * l->out + o] = l->w[(size_t)o * l->in + i];
		return MS_OK;
	}
	for (int p = 0; p < l->nparts; p++) {
		const struct qpart *q = &l->part[p];
		uint64_t ps[2], ss[2];
		if ((rc = ms_nvfp4_shapes(q->rows, l->in, MS_NVFP4_LAYOUT_COLUMNWISE,
					  ps, ss, err)))
			goto out;
		pt = ms_malloc(ps[0] * ps[1] + 1);
		st = ms_malloc(ss[0] * ss[1] + 1);
		tmp = alloc_f(q->rows * l->in);
		if (!pt || !st || !tmp) {
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto out;
		}
		if ((rc = ms_nvfp4_transpose(MS_NVFP4_BLOCK_2D, q->rows, l->in,
					     q->packed, q->scales, pt, st, err)))
			goto out;
		if ((rc = ms_nvfp4_dequantize_ref(pt, st, l->in, q->rows, q->tscale,
						  q->kind, MS_DTYPE_F32, tmp, err)))
			goto out;
		for (uint32_t i = 0; i < l->in; i++)
			memcpy(l->wt + (size_t)i * l->out + off, tmp + (size_t)i * q->rows,
			       q->rows * sizeof(float));
		off += q->rows;
		ms_free(pt);
		ms_free(st);
		ms_free(tmp);
		pt = st = NULL;
		tmp = NULL;
	}
out:
	ms_free(pt);
	ms_free(st);
	ms_free(tmp);
	if (rc) {
		ms_free(l->wt);
		l->wt = NULL;
	}
	return rc;
}

static void lin_release(struct lin *l)
{
	ms_free(l->w);
	ms_free(l->wt);
	ms_free(l->bias);
	for (int p = 0; p < 2; p++) {
		ms_free(l->part[p].packed);
		ms_free(l->part[p].scales);
	}
	memset(l, 0, sizeof *l);
}

/*
 * Load a frozen projection [out, in] made of nsrc row blocks (the fused
 * gate/up of an expert: two modules, or one fused 3D slice). srcs[i] is the
 * module prefix of block i (rows rows[i]); fused3d, when not NULL, names a
 * 3D base tensor [E, out, in] and e its expert (used when the modules are
 * not found).
 */
static int lin_load(struct ms_model *m, struct lin *l, const struct tindex *bx,
		    const struct tindex *qx, int nsrc, char srcs[][256],
		    const uint32_t *rows, uint32_t in, const char *fused3d,
		    uint32_t fe, uint32_t fE, int want_bias, struct ms_err *err)
{
	uint64_t off = 0;
	int rc, nq = 0;

	l->in = in;
	l->out = 0;
	for (int i = 0; i < nsrc; i++)
		l->out += rows[i];
	if (!(l->w = alloc_f((uint64_t)l->out * in)))
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	for (int i = 0; i < nsrc; i++) {
		int found;
		char nm[300];
		if ((rc = quant_find(qx, srcs[i], rows[i], in, &l->part[i], &found, err)))
			return rc;
		if (found) {
			nq++;
			/* the GPU decodes on the device from these bytes */
			if (m->opts.device == MS_DEVICE_CPU &&
			    (rc = ms_nvfp4_dequantize_ref(l->part[i].packed,
							  l->part[i].scales, rows[i],
							  in, l->part[i].tscale,
							  l->part[i].kind, MS_DTYPE_F32,
							  l->w + off * in, err)))
				return rc == MS_ENOMEM ? rc
						       : ms_err_prefix(err, "module '%s'", srcs[i]);
		} else {
			uint64_t shape[2] = {rows[i], in};
			snprintf(nm, sizeof nm, "%s.weight", srcs[i]);
			if (tfind(bx, nm) || !fused3d) {
				if ((rc = load_float(bx, nm, 2, shape, 0,
						     (uint64_t)rows[i] * in,
						     l->w + off * in, err)))
					return rc;
			} else {
				uint64_t s3[3] = {fE, l->out, in};
				if ((rc = load_float(bx, fused3d, 3, s3,
						     (uint64_t)fe * l->out * in +
						     off * in,
						     (uint64_t)rows[i] * in,
						     l->w + off * in, err)))
					return rc;
			}
		}
		off += rows[i];
	}
	if (nq && nq != nsrc)
		return ms_err_set(err, MS_EINVAL,
				  "module '%s': fused with a module that is not "
				  "quantized", srcs[0]);
	l->nparts = nq;
	if (want_bias) {
		char nm[300];
		snprintf(nm, sizeof nm, "%s.bias", srcs[0]);
		if ((rc = vec_load(bx, nm, l->out, &l->bias, err)))
			return rc;
	}
	if (m->opts.device != MS_DEVICE_CPU) {
		/* the device holds its own copies (kernels/train.cu), and its
		 * transpose validates the 2D blocks */
		if (nq) {
			ms_free(l->w);
			l->w = NULL;
		}
		return MS_OK;
	}
	/* Validate the 2D blocks now (the transpose refuses 1D ones), and keep
	 * the columnwise copy in resident mode. */
	if (nq || m->opts.colwise == MS_COLWISE_RESIDENT) {
		if ((rc = lin_colwise(l, err)))
			return rc == MS_ENOMEM ? rc
					       : ms_err_prefix(err, "module '%s'", srcs[0]);
		if (m->opts.colwise != MS_COLWISE_RESIDENT) {
			ms_free(l->wt);
			l->wt = NULL;
		}
	}
	if (nq && m->opts.colwise == MS_COLWISE_RESIDENT) {
		/* the rowwise bytes are needed only to build W^T on demand */
		for (int p = 0; p < nq; p++) {
			ms_free(l->part[p].packed);
			ms_free(l->part[p].scales);
			l->part[p].packed = l->part[p].scales = NULL;
		}
	}
	return MS_OK;
}

/* ---- LoRA -------------------------------------------------------------------- */

/* splitmix64: the generator for A's initialisation and dropout masks. */
static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double unif(uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t z = mix64(mix64(mix64(a) ^ b) ^ c);
	return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static int add_param(struct ms_model *m, const char *name, uint32_t d0,
		     uint32_t d1, float **w, float **g, struct ms_err *err)
{
	struct ms_param *np = ms_realloc(m->params, (m->nparams + 1) * sizeof *np);
	char *nm;
	if (!np)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	m->params = np;
	nm = ms_strdup(name);
	*w = alloc_f((uint64_t)d0 * d1);
	*g = alloc_f((uint64_t)d0 * d1);
	if (!nm || !*w || !*g) {
		ms_free(nm);
		ms_free(*w);
		ms_free(*g);
		*w = *g = NULL;
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	}
	np[m->nparams].name = nm;
	np[m->nparams].ndim = 2;
	np[m->nparams].shape[0] = d0;
	np[m->nparams].shape[1] = d1;
	np[m->nparams].n = (uint64_t)d0 * d1;
	np[m->nparams].w = *w;
	np[m->nparams].g = *g;
	m->nparams++;
	return MS_OK;
}

/* Create an adapter named by its PEFT module key (without .lora_A.weight),
 * initialised as PEFT does, or from the warm-start adapter. */
/* A warm-start tensor of the adapter, marked used. */
static const struct ms_wtensor *warm_find(const struct tindex *ax, uint8_t *used,
					  const char *name)
{
	const struct ms_wtensor *t = tfind(ax, name);
	if (t)
		used[t - ax->t] = 1;
	return t;
}

/* Check a warm-start tensor is float [d0, d1]. */
static int warm_check(const struct ms_wtensor *t, uint64_t d0, uint64_t d1,
		      struct ms_err *err)
{
	uint64_t shape[2] = {d0, d1};
	int rc = check_float(t, 2, shape, err);
	return rc ? ms_err_prefix(err, "warm-start adapter") : MS_OK;
}

/*
 * Warm start of L from a PEFT adapter of rank rt <= r (PEFT's rank_pattern
 * may give each module its own): rank k < rt of every expert from the
 * adapter, the rest as a fresh adapter (A initialised, B zero), and B
 * scaled by (alpha_a / rt) / (alpha / r) so that the delta s B A is the
 * adapter's exactly.
 */
static int lora_warm_fused(struct ms_model *m, struct lora *L, const char *key,
			   const struct tindex *ax, uint8_t *used, int *found,
			   struct ms_err *err)
{
	char na[400], nb[400];
	const struct ms_wtensor *ta, *tb;
	uint32_t E = L->E, r = L->r, rt;
	double f;
	int rc;

	snprintf(na, sizeof na, "%s.lora_A.weight", key);
	snprintf(nb, sizeof nb, "%s.lora_B.weight", key);
	ta = warm_find(ax, used, na);
	tb = warm_find(ax, used, nb);
	*found = ta || tb;
	if (!ta || !tb)
		return ta || tb ? ms_err_set(err, MS_EINVAL,
					     "warm-start adapter: tensor '%s' is missing",
					     ta ? nb : na)
				: MS_OK;
	if (ta->ndim != 2 || ta->shape[0] % E || !ta->shape[0] ||
	    ta->shape[0] / E > r)
		return ms_err_set(err, MS_EINVAL,
				  "warm-start adapter: tensor '%s': %llu rows, not %u "
				  "experts x a rank of at most %u (lora_A)", na,
				  (unsigned long long)(ta->ndim ? ta->shape[0] : 0), E, r);
	rt = (uint32_t)(ta->shape[0] / E);
	if ((rc = warm_check(ta, (uint64_t)E * rt, L->in, err)) ||
	    (rc = warm_check(tb, L->out, (uint64_t)rt * E, err)))
		return rc;
	f = (m->opts.warm_alpha > 0 ? m->opts.warm_alpha : m->lora.alpha) / rt /
	    (m->lora.alpha / r);
	for (uint32_t e = 0; e < E; e++)
		for (uint32_t k = 0; k < rt; k++)
			for (uint32_t i = 0; i < L->in; i++)
				L->A[(size_t)(e * r + k) * L->in + i] =
					half_to_f32(ta->dtype, ta->data,
						    (uint64_t)(e * rt + k) * L->in + i);
	for (uint32_t o = 0; o < L->out; o++)
		for (uint32_t c = 0; c < rt * E; c++)
			L->B[(size_t)o * r * E + c] =
				(float)(f * half_to_f32(tb->dtype, tb->data,
							(uint64_t)o * rt * E + c));
	return MS_OK;
}

/*
 * Mixtral adapters made before transformers fused the experts: one LoRA
 * per expert module (block_sparse_moe.experts.E.w1 / w3 / w2, PEFT
 * target_modules). w2 maps onto the fused down_proj rank for rank; w1 and
 * w3 have separate A matrices, so gate_up_proj holds them exactly only at
 * twice their rank: A_e = [A1; A3], B_e = [[B1, 0], [0, B3]].
 */
static int lora_warm_perexpert(struct ms_model *m, struct lora *L, uint32_t l,
			       int gate_up, const struct tindex *ax,
			       uint8_t *used, int *found, struct ms_err *err)
{
	uint32_t E = L->E, r = L->r, F = m->cfg.moe_ffn, H = m->cfg.hidden;
	double alpha_a = m->opts.warm_alpha > 0 ? m->opts.warm_alpha : m->lora.alpha;
	static const char *wn[2] = {"w1", "w3"};
	int rc, nparts = gate_up ? 2 : 1;

	*found = 0;
	for (uint32_t e = 0; e < E; e++) {
		uint32_t col = 0;
		for (int p = 0; p < nparts; p++) {
			char na[400], nb[400];
			const struct ms_wtensor *ta, *tb;
			uint32_t rt, in = gate_up ? H : F, out = gate_up ? F : H;
			uint32_t orow = gate_up ? (uint32_t)p * F : 0;
			double f;
			snprintf(na, sizeof na,
				 "base_model.model.model.layers.%u.block_sparse_moe.experts."
				 "%u.%s.lora_A.weight", l, e, gate_up ? wn[p] : "w2");
			snprintf(nb, sizeof nb,
				 "base_model.model.model.layers.%u.block_sparse_moe.experts."
				 "%u.%s.lora_B.weight", l, e, gate_up ? wn[p] : "w2");
			ta = warm_find(ax, used, na);
			tb = warm_find(ax, used, nb);
			if (!ta && !tb && !*found && e == 0 && p == 0)
				return MS_OK; /* no per-expert adapter either */
			*found = 1;
			if (!ta || !tb)
				return ms_err_set(err, MS_EINVAL,
						  "warm-start adapter: tensor '%s' is missing",
						  ta ? nb : na);
			rt = ta->ndim == 2 ? (uint32_t)ta->shape[0] : 0;
			if (!rt || col + rt > r)
				return ms_err_set(err, MS_EINVAL,
						  "warm-start adapter: tensor '%s': per-expert "
						  "w1/w3 adapters of rank %u need a LoRA rank of "
						  "at least %u for the fused gate_up_proj (run "
						  "rank %u)", na, rt, gate_up ? 2 * rt : rt, r);
			if ((rc = warm_check(ta, rt, in, err)) ||
			    (rc = warm_check(tb, out, rt, err)))
				return rc;
			f = alpha_a / rt / (m->lora.alpha / r);
			for (uint32_t k = 0; k < rt; k++)
				for (uint32_t i = 0; i < in; i++)
					L->A[(size_t)(e * r + col + k) * in + i] =
						half_to_f32(ta->dtype, ta->data,
							    (uint64_t)k * in + i);
			for (uint32_t o = 0; o < out; o++)
				for (uint32_t k = 0; k < rt; k++)
					L->B[(size_t)(orow + o) * r * E + (col + k) * E + e] =
						(float)(f * half_to_f32(tb->dtype, tb->data,
									(uint64_t)o * rt + k));
			col += rt;
		}
	}
	return MS_OK;
}

/* What an adapter adapts: an attention projection, or the fused experts'
 * gate_up_proj / down_proj of layer l. */
enum lora_kind { LORA_ATTN, LORA_GATE_UP, LORA_DOWN };

/* Create an adapter named by its PEFT module key (without .lora_A.weight),
 * initialised as PEFT does, then overwritten from the warm-start adapter
 * when it has one for the module. */
static int lora_new(struct ms_model *m, const char *key, uint32_t in,
		    uint32_t out, uint32_t E, enum lora_kind kind, uint32_t l,
		    const struct tindex *ax, uint8_t *used, struct lora **res,
		    struct ms_err *err)
{
	struct lora *L = ms_calloc(1, sizeof *L);
	char nm[400];
	uint32_t r = m->lora.r;
	int rc, found = 0;
	double bound = 1.0 / sqrt((double)in);

	if (!L)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	{
		struct lora **nl = ms_realloc(m->loras, (m->nloras + 1) * sizeof *nl);
		if (!nl) {
			ms_free(L);
			return ms_err_set(err, MS_ENOMEM, "out of memory");
		}
		m->loras = nl;
		m->loras[m->nloras++] = L;
	}
	*res = L;
	L->r = r;
	L->in = in;
	L->out = out;
	L->E = E;
	L->id = (uint32_t)m->nloras;
	snprintf(nm, sizeof nm, "%s.lora_A.weight", key);
	L->pA = (int)m->nparams;
	if ((rc = add_param(m, nm, E * r, in, &L->A, &L->gA, err)))
		return rc;
	snprintf(nm, sizeof nm, "%s.lora_B.weight", key);
	L->pB = (int)m->nparams;
	if ((rc = add_param(m, nm, out, r * E, &L->B, &L->gB, err)))
		return rc;
	/* kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
	for (uint64_t i = 0; i < (uint64_t)E * r * in; i++)
		L->A[i] = (float)((2.0 * unif(m->lora.seed, L->id, i) - 1.0) * bound);
	if (!ax || !ax->n)
		return MS_OK;
	if ((rc = lora_warm_fused(m, L, key, ax, used, &found, err)))
		return rc;
	if (!found && kind != LORA_ATTN && m->cfg.family == MS_MODEL_MIXTRAL &&
	    (rc = lora_warm_perexpert(m, L, l, kind == LORA_GATE_UP, ax, used, &found,
				      err)))
		return rc;
	if (!found)
		return ms_err_set(err, MS_EINVAL,
				  "warm-start adapter: tensor '%s.lora_A.weight' is "
				  "missing (the run adapts this module)", key);
	return MS_OK;
}

/* ---- build ------------------------------------------------------------------- */

static const char *moe_path(const struct ms_model *m)
{
	return m->cfg.family == MS_MODEL_MIXTRAL ? "block_sparse_moe" : "mlp";
}

static uint32_t rank_of(const struct ms_model *m, uint32_t e)
{
	return (uint32_t)((uint64_t)e * m->ep / m->cfg.n_experts);
}

static int load_expert(struct ms_model *m, struct expert *x,
		       const struct tindex *bx, const struct tindex *qx,
		       uint32_t l, uint32_t e, struct ms_err *err)
{
	const struct ms_model_cfg *c = &m->cfg;
	char src[2][256], f3[256];
	uint32_t rows[2] = {c->moe_ffn, c->moe_ffn}, hrow[1] = {c->hidden};
	int rc;

	if (c->family == MS_MODEL_MIXTRAL) {
		snprintf(src[0], 256, "model.layers.%u.block_sparse_moe.experts.%u.w1", l, e);
		snprintf(src[1], 256, "model.layers.%u.block_sparse_moe.experts.%u.w3", l, e);
	} else {
		snprintf(src[0], 256, "model.layers.%u.mlp.experts.%u.gate_proj", l, e);
		snprintf(src[1], 256, "model.layers.%u.mlp.experts.%u.up_proj", l, e);
	}
	/* fused 3D experts carry transformers' own module names */
	snprintf(f3, sizeof f3, "model.layers.%u.mlp.experts.gate_up_proj", l);
	if ((rc = lin_load(m, &x->gu, bx, qx, 2, src, rows, c->hidden, f3, e,
			   c->n_experts, 0, err)))
		return rc;
	if (c->family == MS_MODEL_MIXTRAL)
		snprintf(src[0], 256, "model.layers.%u.block_sparse_moe.experts.%u.w2", l, e);
	else
		snprintf(src[0], 256, "model.layers.%u.mlp.experts.%u.down_proj", l, e);
	snprintf(f3, sizeof f3, "model.layers.%u.mlp.experts.down_proj", l);
	return lin_load(m, &x->down, bx, qx, 1, src, hrow, c->moe_ffn, f3, e,
			c->n_experts, 0, err);
}

static int load_mlp(struct ms_model *m, struct expert *x, const struct tindex *bx,
		    const struct tindex *qx, const char *p, uint32_t ffn,
		    struct ms_err *err)
{
	char src[2][256];
	uint32_t rows[2] = {ffn, ffn}, hrow[1] = {m->cfg.hidden};
	int rc;
	snprintf(src[0], 256, "%s.gate_proj", p);
	snprintf(src[1], 256, "%s.up_proj", p);
	if ((rc = lin_load(m, &x->gu, bx, qx, 2, src, rows, m->cfg.hidden, NULL, 0,
			   0, 0, err)))
		return rc;
	snprintf(src[0], 256, "%s.down_proj", p);
	return lin_load(m, &x->down, bx, qx, 1, src, hrow, ffn, NULL, 0, 0, 0, err);
}

static int load_layer(struct ms_model *m, uint32_t l, const struct tindex *bx,
		      const struct tindex *qx, const struct tindex *ax,
		      uint8_t *used, struct ms_err *err)
{
	const struct ms_model_cfg *c = &m->cfg;
	struct layer *L = &m->layers[l];
	char nm[300], src[1][256], key[300];
	uint32_t H = c->hidden, hd = c->head_dim;
	uint32_t dq = c->n_heads * hd, dkv = c->n_kv_heads * hd;
	uint32_t rq[1] = {dq}, rkv[1] = {dkv}, rh[1] = {H};
	int rc, bias = c->attention_bias;
	static const char *pn[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
	struct lin *lins[4] = {&L->q, &L->k, &L->v, &L->o};
	struct lora **lls[4] = {&L->lq, &L->lk, &L->lv, &L->lo};
	const uint32_t *rws[4] = {rq, rkv, rkv, rh};
	uint32_t ins[4] = {H, H, H, dq};
	uint32_t bits[4] = {MS_LORA_Q, MS_LORA_K, MS_LORA_V, MS_LORA_O};

	snprintf(nm, sizeof nm, "model.layers.%u.input_layernorm.weight", l);
	if ((rc = vec_load(bx, nm, H, &L->ln1, err)))
		return rc;
	snprintf(nm, sizeof nm, "model.layers.%u.post_attention_layernorm.weight", l);
	if ((rc = vec_load(bx, nm, H, &L->ln2, err)))
		return rc;
	for (int i = 0; i < 4; i++) {
		/* o_proj has a bias in qwen3_moe only (glm4_moe: q/k/v) */
		int b = bias && (i < 3 || c->family == MS_MODEL_QWEN3_MOE);
		snprintf(src[0], 256, "model.layers.%u.self_attn.%s", l, pn[i]);
		if ((rc = lin_load(m, lins[i], bx, qx, 1, src, rws[i], ins[i], NULL, 0,
				   0, b, err)))
			return rc;
		if (m->lora.targets & bits[i]) {
			snprintf(key, sizeof key,
				 "base_model.model.model.layers.%u.self_attn.%s", l, pn[i]);
			if ((rc = lora_new(m, key, ins[i], rws[i][0], 1, LORA_ATTN, l, ax, used,
					    lls[i], err)))
				return rc;
		}
	}
	if (c->qk_norm) {
		snprintf(nm, sizeof nm, "model.layers.%u.self_attn.q_norm.weight", l);
		if ((rc = vec_load(bx, nm, hd, &L->qn, err)))
			return rc;
		snprintf(nm, sizeof nm, "model.layers.%u.self_attn.k_norm.weight", l);
		if ((rc = vec_load(bx, nm, hd, &L->kn, err)))
			return rc;
	}
	L->moe = !c->dense[l];
	if (!L->moe) {
		snprintf(nm, sizeof nm, "model.layers.%u.mlp", l);
		return load_mlp(m, &L->sh, bx, qx, nm, c->dense_ffn, err);
	}
	{
		uint64_t rs[2] = {c->n_experts, H};
		const char *mp = moe_path(m);
		snprintf(nm, sizeof nm, "model.layers.%u.%s.gate.weight", l, mp);
		if (!tfind(bx, nm))
			snprintf(nm, sizeof nm, "model.layers.%u.mlp.gate.weight", l);
		if (!(L->router = alloc_f((uint64_t)c->n_experts * H)))
			return ms_err_set(err, MS_ENOMEM, "out of memory");
		if ((rc = load_float(bx, nm, 2, rs, 0, rs[0] * rs[1], L->router, err)))
			return rc;
	}
	if (c->router == MS_ROUTER_SIGMOID) {
		snprintf(nm, sizeof nm, "model.layers.%u.mlp.gate.e_score_correction_bias", l);
		if ((rc = vec_load(bx, nm, c->n_experts, &L->ecb, err)))
			return rc;
	}
	for (uint32_t k = 0; k < m->ep; k++) {
		struct ms_rank *rk = &m->ranks[k];
		if (!(rk->ex[l] = ms_calloc(rk->e1 - rk->e0, sizeof *rk->ex[l])))
			return ms_err_set(err, MS_ENOMEM, "out of memory");
		for (uint32_t e = rk->e0; e < rk->e1; e++)
			if ((rc = load_expert(m, &rk->ex[l][e - rk->e0], bx, qx, l, e,
					      err)))
				return rc;
	}
	if (c->n_shared_experts) {
		L->shared = 1;
		snprintf(nm, sizeof nm, "model.layers.%u.mlp.shared_experts", l);
		if ((rc = load_mlp(m, &L->sh, bx, qx, nm,
				   c->moe_ffn * c->n_shared_experts, err)))
			return rc;
	}
	if (m->lora.targets & MS_LORA_EXPERTS) {
		/* PEFT wraps target_parameters in order: gate_up_proj first (the
		 * inner "base_layer"), then down_proj (the outer wrapper) */
		snprintf(key, sizeof key,
			 "base_model.model.model.layers.%u.mlp.experts.base_layer", l);
		if ((rc = lora_new(m, key, H, 2 * c->moe_ffn, c->n_experts,
				   LORA_GATE_UP, l, ax, used, &L->lgu, err)))
			return rc;
		snprintf(key, sizeof key, "base_model.model.model.layers.%u.mlp.experts", l);
		if ((rc = lora_new(m, key, c->moe_ffn, H, c->n_experts, LORA_DOWN, l,
				   ax, used, &L->ldown, err)))
			return rc;
	}
	return MS_OK;
}

static int cmp_param(const void *a, const void *b)
{
	return strcmp(((const struct ms_param *)a)->name,
		      ((const struct ms_param *)b)->name);
}

static void acts_free(struct ms_model *m);

void ms_model_free(struct ms_model *m)
{
	if (!m)
		return;
	ms_gmodel_free(m->gpu);
	acts_free(m);
	if (m->layers) {
		for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
			struct layer *L = &m->layers[l];
			ms_free(L->ln1);
			ms_free(L->ln2);
			lin_release(&L->q);
			lin_release(&L->k);
			lin_release(&L->v);
			lin_release(&L->o);
			ms_free(L->qn);
			ms_free(L->kn);
			ms_free(L->router);
			ms_free(L->ecb);
			lin_release(&L->sh.gu);
			lin_release(&L->sh.down);
		}
		ms_free(m->layers);
	}
	for (size_t i = 0; i < m->nparams; i++) {
		ms_free((char *)m->params[i].name);
		ms_free(m->params[i].w);
		ms_free(m->params[i].g);
	}
	ms_free(m->params);
	for (size_t i = 0; i < m->nloras; i++)
		ms_free(m->loras[i]);
	ms_free(m->loras);
	for (uint32_t r = 0; m->ranks && r < m->ep; r++) {
		struct ms_rank *rk = &m->ranks[r];
		for (uint32_t l = 0; rk->ex && l < m->cfg.n_layers; l++) {
			for (uint32_t e = 0; rk->ex[l] && e < rk->e1 - rk->e0; e++) {
				lin_release(&rk->ex[l][e].gu);
				lin_release(&rk->ex[l][e].down);
			}
			ms_free(rk->ex[l]);
		}
		ms_free(rk->ex);
		for (size_t i = 0; rk->gacc && i < m->nparams; i++)
			ms_free(rk->gacc[i]);
		ms_free(rk->gacc);
	}
	ms_free(m->ranks);
	ms_free(m->embed);
	ms_free(m->norm);
	if (m->lm_head != m->embed)
		ms_free(m->lm_head);
	ms_free(m->rope_cos);
	ms_free(m->rope_sin);
	ms_free(m);
}

int ms_model_build(struct ms_model **out, const struct ms_model_cfg *cfg,
		   const struct ms_wtensor *base, size_t nbase,
		   const struct ms_wtensor *quant, size_t nquant,
		   const struct ms_lora_cfg *lora,
		   const struct ms_wtensor *adapter, size_t nadapter,
		   const struct ms_model_opts *opts, struct ms_err *err)
{
	struct ms_model *m = NULL;
	struct tindex bx = {0}, qx = {0}, ax = {0};
	uint8_t *used = NULL;
	int rc = MS_OK;
	uint64_t es[2];

	*out = NULL;
	if (!lora || lora->r < 1 || lora->r > MS_MODEL_MAX_LORA_R || !lora->targets ||
	    (lora->targets & ~0x1fu) || !(lora->dropout >= 0 && lora->dropout < 1) ||
	    !isfinite(lora->alpha))
		return ms_err_set(err, MS_EINVAL,
				  "lora: r must be in [1, %d], targets not empty, dropout "
				  "in [0, 1)", MS_MODEL_MAX_LORA_R);
	if (!(m = ms_calloc(1, sizeof *m)))
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	m->cfg = *cfg;
	m->lora = *lora;
	if (opts)
		m->opts = *opts;
	m->ep = m->opts.ep_size ? m->opts.ep_size : 1;
	if (cfg->head_dim > MS_MODEL_MAX_HEAD_DIM) {
		rc = ms_err_set(err, MS_EINVAL, "config.json: 'head_dim' %u is over %d",
				cfg->head_dim, MS_MODEL_MAX_HEAD_DIM);
		goto out;
	}
	m->nthreads = m->opts.nthreads > 0 ? m->opts.nthreads
					   : (int)sysconf(_SC_NPROCESSORS_ONLN);
	if (m->nthreads < 1)
		m->nthreads = 1;
	if (m->opts.device != MS_DEVICE_CPU && m->ep != 1) {
		rc = ms_err_set(err, MS_EINVAL,
				"--device cuda trains on one GPU: EP size %u needs the "
				"CPU path's virtual ranks", m->ep);
		goto out;
	}
	if (m->ep > cfg->n_experts || cfg->n_experts % m->ep) {
		rc = ms_err_set(err, MS_EINVAL,
				"EP size %u does not divide the %u experts", m->ep,
				cfg->n_experts);
		goto out;
	}
	if ((rc = tindex_init(&bx, base, nbase, err)) ||
	    (rc = tindex_init(&qx, quant, quant ? nquant : 0, err)) ||
	    (rc = tindex_init(&ax, adapter, adapter ? nadapter : 0, err)))
		goto out;
	if (!(used = ms_calloc(ax.n + 1, 1))) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	es[0] = cfg->vocab;
	es[1] = cfg->hidden;
	if (!(m->embed = alloc_f(es[0] * es[1]))) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = load_float(&bx, "model.embed_tokens.weight", 2, es, 0,
			     es[0] * es[1], m->embed, err)))
		goto out;
	if ((rc = vec_load(&bx, "model.norm.weight", cfg->hidden, &m->norm, err)))
		goto out;
	if (cfg->tie_word_embeddings && !tfind(&bx, "lm_head.weight")) {
		m->lm_head = m->embed;
	} else {
		if (!(m->lm_head = alloc_f(es[0] * es[1]))) {
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto out;
		}
		if ((rc = load_float(&bx, "lm_head.weight", 2, es, 0, es[0] * es[1],
				     m->lm_head, err)))
			goto out;
	}
	if (!(m->layers = ms_calloc(cfg->n_layers, sizeof *m->layers)) ||
	    !(m->ranks = ms_calloc(m->ep, sizeof *m->ranks))) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	for (uint32_t k = 0; k < m->ep; k++) {
		m->ranks[k].e0 = k * (cfg->n_experts / m->ep);
		m->ranks[k].e1 = (k + 1) * (cfg->n_experts / m->ep);
		if (!(m->ranks[k].ex = ms_calloc(cfg->n_layers, sizeof(struct expert *)))) {
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto out;
		}
	}
	for (uint32_t l = 0; l < cfg->n_layers; l++)
		if ((rc = load_layer(m, l, &bx, &qx, &ax, used, err)))
			goto out;
	/* every warm-start tensor must be one we use */
	for (size_t i = 0; i < ax.n; i++)
		if (!used[i]) {
			rc = ms_err_set(err, MS_EINVAL,
					"warm-start adapter: tensor '%s' matches no "
					"LoRA target of the run", adapter[i].name);
			goto out;
		}
	/* params sorted by name; the loras keep their indices by name */
	{
		struct ms_param *sorted = m->params;
		qsort(sorted, m->nparams, sizeof *sorted, cmp_param);
		for (size_t i = 0; i < m->nloras; i++) {
			struct lora *L = m->loras[i];
			for (size_t j = 0; j < m->nparams; j++) {
				if (sorted[j].w == L->A)
					L->pA = (int)j;
				if (sorted[j].w == L->B)
					L->pB = (int)j;
			}
		}
	}
	if (m->opts.device != MS_DEVICE_CPU) {
		/* gradients accumulate on the device */
		rc = ms_gmodel_build(m, err);
		goto out;
	}
	for (uint32_t r = 0; r < m->ep; r++) {
		double **g = ms_calloc(m->nparams ? m->nparams : 1, sizeof *g);
		m->ranks[r].gacc = g;
		if (!g) {
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto out;
		}
		for (size_t i = 0; i < m->nparams; i++)
			if (!(g[i] = ms_calloc(m->params[i].n ? m->params[i].n : 1,
					       sizeof(double)))) {
				rc = ms_err_set(err, MS_ENOMEM, "out of memory");
				goto out;
			}
	}
out:
	ms_free(bx.ord);
	ms_free(qx.ord);
	ms_free(ax.ord);
	ms_free(used);
	if (rc) {
		ms_model_free(m);
		return rc;
	}
	*out = m;
	return MS_OK;
}

const struct ms_model_cfg *ms_model_config(const struct ms_model *m)
{
	return &m->cfg;
}

size_t ms_model_params(struct ms_model *m, const struct ms_param **out)
{
	*out = m->params;
	return m->nparams;
}

void ms_model_zero_grad(struct ms_model *m)
{
	if (m->gpu) {
		/* a failure here shows at the next step's first CUDA call */
		ms_gmodel_zero_grad(m, NULL);
		return;
	}
	for (size_t i = 0; i < m->nparams; i++)
		memset(m->params[i].g, 0, m->params[i].n * sizeof(float));
}

/* ---- kernels ------------------------------------------------------------------ */

/* Dot product of float32 vectors in double: four independent accumulators
 * (lanes i mod 4) summed in a fixed order, so the result is the same on
 * every run and thread; the lanes let the CPU overlap the additions. */
static double dotf(const float *a, const float *b, size_t n)
{
	double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	size_t i = 0;
	for (; i + 4 <= n; i += 4) {
		s0 += (double)a[i] * b[i];
		s1 += (double)a[i + 1] * b[i + 1];
		s2 += (double)a[i + 2] * b[i + 2];
		s3 += (double)a[i + 3] * b[i + 3];
	}
	for (; i < n; i++)
		s0 += (double)a[i] * b[i];
	return (s0 + s1) + (s2 + s3);
}

struct rms_job {
	const float *x, *w;
	float *y, *rstd;
	uint32_t H;
	double eps;
};

/* transformers' RMSNorm in float32: x * rsqrt(mean(x^2) + eps), times w
 * (the mean accumulates in double, then rounds to float as torch's does). */
static void rms_rows(void *p, size_t lo, size_t hi)
{
	struct rms_job *j = p;
	for (size_t t = lo; t < hi; t++) {
		const float *x = j->x + t * j->H;
		float *y = j->y + t * j->H;
		double ss = 0;
		for (uint32_t i = 0; i < j->H; i++)
			ss += (double)x[i] * x[i];
		float var = (float)(ss / j->H);
		float r = (float)(1.0 / sqrt((double)(var + (float)j->eps)));
		j->rstd[t] = r;
		for (uint32_t i = 0; i < j->H; i++)
			y[i] = j->w[i] * (x[i] * r);
	}
}

static void rms_fwd(struct ms_model *m, const float *x, const float *w,
		    size_t T, uint32_t H, float *y, float *rstd)
{
	struct rms_job j = {x, w, y, rstd, H, m->cfg.rms_eps};
	par_for(m->nthreads, T, 64, rms_rows, &j);
}

/* dx += d(rmsnorm)/dx . dy:  dx_i = r w_i dy_i - r^3 x_i sum_j(w_j dy_j x_j)/H */
static void rms_bwd_row(const float *x, const float *w, float r, const float *dy,
			uint32_t H, float *dx)
{
	double dot = 0;
	for (uint32_t i = 0; i < H; i++)
		dot += (double)w[i] * dy[i] * x[i];
	double c = (double)r * r * r * dot / H;
	for (uint32_t i = 0; i < H; i++)
		dx[i] += (float)((double)r * w[i] * dy[i] - c * x[i]);
}

struct lin_job {
	const struct lin *l;
	const float *x;
	float *y;
	const float *wt;
	int acc;
};

static void lin_rows(void *p, size_t lo, size_t hi)
{
	struct lin_job *j = p;
	const struct lin *l = j->l;
	for (size_t t = lo; t < hi; t++) {
		const float *x = j->x + t * l->in;
		float *y = j->y + t * l->out;
		for (uint32_t o = 0; o < l->out; o++) {
			double s = dotf(l->w + (size_t)o * l->in, x, l->in);
			if (l->bias)
				s += l->bias[o];
			y[o] = (float)s;
		}
	}
}

/* y [n, out] = x [n, in] W^T + b */
static void lin_fwd(struct ms_model *m, const struct lin *l, const float *x,
		    size_t n, float *y)
{
	struct lin_job j = {l, x, y, NULL, 0};
	par_for(m->nthreads, n, 4, lin_rows, &j);
}

/* dx [in] (+)= W^T-orientation . dy [out], reading the columnwise W^T */
static void dgrad_row(const struct lin *l, const float *dy, float *dx, int acc)
{
	for (uint32_t i = 0; i < l->in; i++) {
		double s = dotf(l->wt + (size_t)i * l->out, dy, l->out);
		dx[i] = acc ? dx[i] + (float)s : (float)s;
	}
}

static void dgrad_rows(void *p, size_t lo, size_t hi)
{
	struct lin_job *j = p;
	for (size_t t = lo; t < hi; t++)
		dgrad_row(j->l, j->x + t * j->l->out, j->y + t * j->l->in, j->acc);
}

static void lin_dgrad(struct ms_model *m, const struct lin *l, const float *dy,
		      size_t n, float *dx, int acc)
{
	struct lin_job j = {l, dy, dx, NULL, acc};
	par_for(m->nthreads, n, 4, dgrad_rows, &j);
}

static float lora_scale(const struct ms_model *m)
{
	return (float)(m->lora.alpha / m->lora.r);
}

/* Dropout keep factor of element i of row key of adapter L: 0 or 1/(1-p). */
static float drop_f(const struct ms_model *m, const struct lora *L,
		    uint64_t key, uint32_t i)
{
	double p = m->lora.dropout;
	if (!m->train || p <= 0)
		return 1.0f;
	if (unif(m->lora.seed ^ (m->step * 0x9E3779B97F4A7C15ull),
		 ((uint64_t)L->id << 40) ^ key, i) < p)
		return 0.0f;
	return (float)(1.0 / (1.0 - p));
}

/* LoRA forward of one row: u = A_e (drop x), y += s B_e u. */
static void lora_fwd_row(const struct ms_model *m, const struct lora *L,
			 uint32_t e, uint64_t key, const float *x, float *u,
			 float *y)
{
	uint32_t r = L->r, E = L->E;
	float s = lora_scale(m);
	for (uint32_t k = 0; k < r; k++) {
		const float *a = L->A + (size_t)(e * r + k) * L->in;
		double acc = 0;
		for (uint32_t i = 0; i < L->in; i++)
			acc += (double)a[i] * (x[i] * drop_f(m, L, key, i));
		u[k] = (float)acc;
	}
	for (uint32_t o = 0; o < L->out; o++) {
		const float *b = L->B + (size_t)o * r * E;
		double acc = 0;
		for (uint32_t k = 0; k < r; k++)
			acc += (double)b[k * E + e] * u[k];
		y[o] += (float)acc * s;
	}
}

/* LoRA backward of one row: gradients into gA/gB (double accumulators of
 * this rank), dx += drop(A_e^T du). */
static void lora_bwd_row(const struct ms_model *m, const struct lora *L,
			 uint32_t e, uint64_t key, const float *x,
			 const float *u, const float *dy, double *gA, double *gB,
			 float *dx)
{
	uint32_t r = L->r, E = L->E;
	double s = lora_scale(m), dub[MS_MODEL_MAX_LORA_R];
	for (uint32_t k = 0; k < r; k++)
		dub[k] = 0;
	for (uint32_t o = 0; o < L->out; o++) {
		const float *b = L->B + (size_t)o * r * E;
		double *gb = gB + (size_t)o * r * E;
		double d = dy[o];
		if (d == 0)
			continue;
		for (uint32_t k = 0; k < r; k++) {
			gb[k * E + e] += s * d * u[k];
			dub[k] += s * d * b[k * E + e];
		}
	}
	for (uint32_t k = 0; k < r; k++) {
		const float *a = L->A + (size_t)(e * r + k) * L->in;
		double *ga = gA + (size_t)(e * r + k) * L->in;
		for (uint32_t i = 0; i < L->in; i++) {
			float f = drop_f(m, L, key, i);
			ga[i] += dub[k] * (x[i] * f);
			if (dx)
				dx[i] += (float)(dub[k] * a[i] * f);
		}
	}
}

/* ---- activations ---------------------------------------------------------- */

static void acts_free(struct ms_model *m)
{
	if (m->acts) {
		for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
			struct acts *a = &m->acts[l];
			float **f[] = {&a->x, &a->h1, &a->r1, &a->q0, &a->k0, &a->v,
				       &a->qr, &a->kr, &a->rq, &a->rk, &a->q, &a->k,
				       &a->p, &a->ctx, &a->uq, &a->uk, &a->uv, &a->uo,
				       &a->x2, &a->h2, &a->r2, &a->probs, &a->wts,
				       &a->gu, &a->act, &a->ugu, &a->udn, &a->ye, &a->xin,
				       &a->sgu, &a->sact};
			for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
				ms_free(*f[i]);
			ms_free(a->sel);
		}
		ms_free(m->acts);
	}
	m->acts = NULL;
	ms_free(m->xf);
	ms_free(m->hf);
	ms_free(m->rf);
	ms_free(m->logits);
	m->xf = m->hf = m->rf = m->logits = NULL;
	m->T = 0;
}

static int acts_alloc(struct ms_model *m, uint32_t B, uint32_t S,
		      struct ms_err *err)
{
	const struct ms_model_cfg *c = &m->cfg;
	size_t T = (size_t)B * S, H = c->hidden, hd = c->head_dim;
	size_t dq = c->n_heads * hd, dkv = c->n_kv_heads * hd, r = m->lora.r;
	size_t K = c->top_k, F = c->moe_ffn;
	size_t Fs = c->n_shared_experts ? c->moe_ffn * c->n_shared_experts
					: c->dense_ffn;

	if (m->acts && m->B == B && m->S == S)
		return MS_OK;
	acts_free(m);
	if (!(m->acts = ms_calloc(c->n_layers, sizeof *m->acts)))
		goto oom;
	for (uint32_t l = 0; l < c->n_layers; l++) {
		struct acts *a = &m->acts[l];
		int moe = !c->dense[l];
		size_t fs = moe ? (c->n_shared_experts ? Fs : 0) : c->dense_ffn;
		if (!(a->x = alloc_f(T * H)) || !(a->h1 = alloc_f(T * H)) ||
		    !(a->r1 = alloc_f(T)) || !(a->q0 = alloc_f(T * dq)) ||
		    !(a->k0 = alloc_f(T * dkv)) || !(a->v = alloc_f(T * dkv)) ||
		    !(a->qr = alloc_f(T * dq)) || !(a->kr = alloc_f(T * dkv)) ||
		    !(a->rq = alloc_f(T * c->n_heads)) ||
		    !(a->rk = alloc_f(T * c->n_kv_heads)) ||
		    !(a->q = alloc_f(T * dq)) || !(a->k = alloc_f(T * dkv)) ||
		    !(a->p = alloc_f((size_t)B * c->n_heads * S * S)) ||
		    !(a->ctx = alloc_f(T * dq)) || !(a->uq = alloc_f(T * r)) ||
		    !(a->uk = alloc_f(T * r)) || !(a->uv = alloc_f(T * r)) ||
		    !(a->uo = alloc_f(T * r)) || !(a->x2 = alloc_f(T * H)) ||
		    !(a->h2 = alloc_f(T * H)) || !(a->r2 = alloc_f(T)) ||
		    !(a->sgu = alloc_f(T * 2 * fs)) || !(a->sact = alloc_f(T * fs)))
			goto oom;
		if (moe &&
		    (!(a->probs = alloc_f(T * c->n_experts)) ||
		     !(a->sel = ms_calloc(T * K, sizeof *a->sel)) ||
		     !(a->wts = alloc_f(T * K)) || !(a->gu = alloc_f(T * K * 2 * F)) ||
		     !(a->act = alloc_f(T * K * F)) || !(a->ugu = alloc_f(T * K * r)) ||
		     !(a->udn = alloc_f(T * K * r)) || !(a->ye = alloc_f(T * K * H)) ||
		     !(a->xin = alloc_f(T * K * H))))
			goto oom;
	}
	if (!(m->xf = alloc_f(T * H)) || !(m->hf = alloc_f(T * H)) ||
	    !(m->rf = alloc_f(T)) || !(m->logits = alloc_f(T * c->vocab)))
		goto oom;
	m->B = B;
	m->S = S;
	m->T = (uint32_t)T;
	return MS_OK;
oom:
	acts_free(m);
	return ms_err_set(err, MS_ENOMEM, "out of memory");
}

/* RoPE tables, float32 as transformers computes them: inv_freq = 1 /
 * theta^(2f/rd), freq = pos * inv_freq, cos/sin of it. */
int ms_model_rope(struct ms_model *m, uint32_t S, struct ms_err *err)
{
	uint32_t h = m->cfg.rotary_dim / 2;
	float *c, *s;
	if (S <= m->rope_len)
		return MS_OK;
	c = alloc_f((uint64_t)S * h);
	s = alloc_f((uint64_t)S * h);
	if (!c || !s) {
		ms_free(c);
		ms_free(s);
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	}
	for (uint32_t f = 0; f < h; f++) {
		float ex = (float)(2 * f) / (float)m->cfg.rotary_dim;
		float inv = 1.0f / powf((float)m->cfg.rope_theta, ex);
		for (uint32_t p = 0; p < S; p++) {
			float fr = (float)p * inv;
			c[(size_t)p * h + f] = cosf(fr);
			s[(size_t)p * h + f] = sinf(fr);
		}
	}
	ms_free(m->rope_cos);
	ms_free(m->rope_sin);
	m->rope_cos = c;
	m->rope_sin = s;
	m->rope_len = S;
	return MS_OK;
}

/* q_embed = q * cos + rotate_half(q) * sin on the first rotary_dim dims */
static void rope_fwd(const struct ms_model *m, uint32_t pos, const float *x,
		     float *y)
{
	uint32_t h = m->cfg.rotary_dim / 2, hd = m->cfg.head_dim;
	const float *c = m->rope_cos + (size_t)pos * h, *s = m->rope_sin + (size_t)pos * h;
	for (uint32_t i = 0; i < h; i++) {
		float a = x[i] * c[i], b = -x[i + h] * s[i];
		float a2 = x[i + h] * c[i], b2 = x[i] * s[i];
		y[i] = a + b;
		y[i + h] = a2 + b2;
	}
	for (uint32_t i = 2 * h; i < hd; i++)
		y[i] = x[i];
}

/* transpose: dx = cos * dy + R^T (sin * dy), R^T y = [y2, -y1] */
static void rope_bwd(const struct ms_model *m, uint32_t pos, const float *dy,
		     float *dx)
{
	uint32_t h = m->cfg.rotary_dim / 2, hd = m->cfg.head_dim;
	const float *c = m->rope_cos + (size_t)pos * h, *s = m->rope_sin + (size_t)pos * h;
	for (uint32_t i = 0; i < h; i++) {
		float d1 = dy[i], d2 = dy[i + h];
		dx[i] = d1 * c[i] + d2 * s[i];
		dx[i + h] = d2 * c[i] - d1 * s[i];
	}
	for (uint32_t i = 2 * h; i < hd; i++)
		dx[i] = dy[i];
}

/* ---- attention ------------------------------------------------------------ */

struct att_job {
	struct ms_model *m;
	struct acts *a;
	const float *dctx;
	float *dq, *dk, *dv;
	int oom;                     /* a worker's scratch allocation failed */
};

/* forward of (b, head) pairs */
static void att_fwd_pairs(void *p, size_t lo, size_t hi)
{
	struct att_job *j = p;
	const struct ms_model_cfg *c = &j->m->cfg;
	uint32_t S = j->m->S, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
	uint32_t dq = nh * hd, dkv = nkv * hd;
	double scale = 1.0 / sqrt((double)hd);
	float sc = (float)scale;
	double *sbuf = ms_malloc(S * sizeof *sbuf);
	if (!sbuf) {
		__atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
		return;
	}
	for (size_t bh = lo; bh < hi; bh++) {
		uint32_t b = (uint32_t)(bh / nh), h = (uint32_t)(bh % nh);
		uint32_t g = h / (nh / nkv);
		for (uint32_t i = 0; i < S; i++) {
			const float *q = j->a->q + ((size_t)b * S + i) * dq + h * hd;
			float *pr = j->a->p + (((size_t)b * nh + h) * S + i) * S;
			double mx = -INFINITY, sum = 0;
			for (uint32_t t = 0; t <= i; t++) {
				const float *k = j->a->k + ((size_t)b * S + t) * dkv + g * hd;
				double d = 0;
				for (uint32_t x = 0; x < hd; x++)
					d += (double)q[x] * k[x];
				sbuf[t] = (double)((float)d * sc);
				if (sbuf[t] > mx)
					mx = sbuf[t];
			}
			for (uint32_t t = 0; t <= i; t++) {
				sbuf[t] = exp(sbuf[t] - mx);
				sum += sbuf[t];
			}
			for (uint32_t t = 0; t < S; t++)
				pr[t] = t <= i ? (float)(sbuf[t] / sum) : 0.0f;
			float *o = j->a->ctx + ((size_t)b * S + i) * dq + h * hd;
			for (uint32_t x = 0; x < hd; x++) {
				double acc = 0;
				for (uint32_t t = 0; t <= i; t++)
					acc += (double)pr[t] *
					       j->a->v[((size_t)b * S + t) * dkv + g * hd + x];
				o[x] = (float)acc;
			}
		}
	}
	ms_free(sbuf);
}

/* forward of (b, head) pairs for one new position per sequence against the
 * cache (this layer's rows, [B, cap, dkv], in dk and dv): the same
 * arithmetic, in
 * the same order, as att_fwd_pairs's row i = len, so a decode reproduces a
 * full forward's numbers */
static void att_decode_pairs(void *p, size_t lo, size_t hi)
{
	struct att_job *j = p;
	const struct ms_model_cfg *c = &j->m->cfg;
	const struct ms_kv_cache *kv = j->m->kv;
	uint32_t nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
	uint32_t dq = nh * hd, dkv = nkv * hd, n = kv->len + 1;
	double scale = 1.0 / sqrt((double)hd);
	float sc = (float)scale;
	double *sbuf = ms_malloc(n * sizeof *sbuf);
	float *pr = ms_malloc(n * sizeof *pr);
	if (!sbuf || !pr) {
		ms_free(sbuf);
		ms_free(pr);
		__atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
		return;
	}
	for (size_t bh = lo; bh < hi; bh++) {
		uint32_t b = (uint32_t)(bh / nh), h = (uint32_t)(bh % nh);
		uint32_t g = h / (nh / nkv);
		const float *q = j->a->q + (size_t)b * dq + h * hd;
		const float *K = j->dk + (size_t)b * kv->cap * dkv;
		const float *Vc = j->dv + (size_t)b * kv->cap * dkv;
		double mx = -INFINITY, sum = 0;
		for (uint32_t t = 0; t < n; t++) {
			const float *k = K + (size_t)t * dkv + g * hd;
			double d = 0;
			for (uint32_t x = 0; x < hd; x++)
				d += (double)q[x] * k[x];
			sbuf[t] = (double)((float)d * sc);
			if (sbuf[t] > mx)
				mx = sbuf[t];
		}
		for (uint32_t t = 0; t < n; t++) {
			sbuf[t] = exp(sbuf[t] - mx);
			sum += sbuf[t];
		}
		for (uint32_t t = 0; t < n; t++)
			pr[t] = (float)(sbuf[t] / sum);
		float *o = j->a->ctx + (size_t)b * dq + h * hd;
		for (uint32_t x = 0; x < hd; x++) {
			double acc = 0;
			for (uint32_t t = 0; t < n; t++)
				acc += (double)pr[t] * Vc[(size_t)t * dkv + g * hd + x];
			o[x] = (float)acc;
		}
	}
	ms_free(sbuf);
	ms_free(pr);
}

/* backward of (b, kv head) groups: each owns its dk, dv and its heads' dq */
static void att_bwd_groups(void *p, size_t lo, size_t hi)
{
	struct att_job *j = p;
	const struct ms_model_cfg *c = &j->m->cfg;
	uint32_t S = j->m->S, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
	uint32_t dq = nh * hd, dkv = nkv * hd, rep = nh / nkv;
	double scale = 1.0 / sqrt((double)hd);
	double *dk = ms_malloc((size_t)S * hd * sizeof *dk);
	double *dv = ms_malloc((size_t)S * hd * sizeof *dv);
	double *dp = ms_malloc(S * sizeof *dp);
	double gqd[MS_MODEL_MAX_HEAD_DIM];
	if (!dk || !dv || !dp) {
		__atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
		goto out;
	}
	for (size_t bg = lo; bg < hi; bg++) {
		uint32_t b = (uint32_t)(bg / nkv), g = (uint32_t)(bg % nkv);
		memset(dk, 0, (size_t)S * hd * sizeof *dk);
		memset(dv, 0, (size_t)S * hd * sizeof *dv);
		for (uint32_t h = g * rep; h < (g + 1) * rep; h++) {
			for (uint32_t i = 0; i < S; i++) {
				const float *pr = j->a->p + (((size_t)b * nh + h) * S + i) * S;
				const float *go = j->dctx + ((size_t)b * S + i) * dq + h * hd;
				const float *q = j->a->q + ((size_t)b * S + i) * dq + h * hd;
				float *gq = j->dq + ((size_t)b * S + i) * dq + h * hd;
				double dot = 0;
				for (uint32_t t = 0; t <= i; t++) {
					const float *v = j->a->v + ((size_t)b * S + t) * dkv + g * hd;
					double d = 0;
					for (uint32_t x = 0; x < hd; x++) {
						d += (double)go[x] * v[x];
						dv[(size_t)t * hd + x] += (double)pr[t] * go[x];
					}
					dp[t] = d;
					dot += d * pr[t];
				}
				for (uint32_t x = 0; x < hd; x++)
					gqd[x] = 0;
				for (uint32_t t = 0; t <= i; t++) {
					const float *k = j->a->k + ((size_t)b * S + t) * dkv + g * hd;
					double ds = pr[t] * (dp[t] - dot) * scale;
					for (uint32_t x = 0; x < hd; x++) {
						gqd[x] += ds * k[x];
						dk[(size_t)t * hd + x] += ds * q[x];
					}
				}
				for (uint32_t x = 0; x < hd; x++)
					gq[x] = (float)gqd[x];
			}
		}
		for (uint32_t t = 0; t < S; t++)
			for (uint32_t x = 0; x < hd; x++) {
				j->dk[((size_t)b * S + t) * dkv + g * hd + x] =
					(float)dk[(size_t)t * hd + x];
				j->dv[((size_t)b * S + t) * dkv + g * hd + x] =
					(float)dv[(size_t)t * hd + x];
			}
	}
out:
	ms_free(dk);
	ms_free(dv);
	ms_free(dp);
}

/* ---- MoE ---------------------------------------------------------------------- */

static float silu(float g)
{
	return g / (1.0f + expf(-g));
}

/* SwiGLU MLP forward of one row: gu [2F] = Wgu h (+ LoRA), a = silu(g) u,
 * y [H] = Wd a (+ LoRA). la/ld NULL: no adapter. */
static void mlp_fwd_row(const struct ms_model *m, const struct expert *x,
			const struct lora *la, const struct lora *ld, uint32_t e,
			uint64_t key, const float *h, float *gu, float *act,
			float *ua, float *ud, float *y)
{
	uint32_t F = x->gu.out / 2;
	struct lin_job j1 = {&x->gu, h, gu, NULL, 0}, j2 = {&x->down, act, y, NULL, 0};
	lin_rows(&j1, 0, 1);
	if (la)
		lora_fwd_row(m, la, e, key, h, ua, gu);
	for (uint32_t i = 0; i < F; i++)
		act[i] = silu(gu[i]) * gu[F + i];
	lin_rows(&j2, 0, 1);
	if (ld)
		lora_fwd_row(m, ld, e, key, act, ud, y);
}

/* Its backward: dh [H] = d/dh of dy . y; LoRA gradients into gA/gB of the
 * rank that owns the expert. */
static void mlp_bwd_row(const struct ms_model *m, const struct expert *x,
			const struct lora *la, const struct lora *ld, uint32_t e,
			uint64_t key, double **g, const float *h, const float *gu,
			const float *act, const float *ua, const float *ud,
			const float *dy, float *dact, float *dgu, float *dh)
{
	uint32_t F = x->gu.out / 2;
	dgrad_row(&x->down, dy, dact, 0);
	if (ld)
		lora_bwd_row(m, ld, e, key, act, ud, dy, g[ld->pA], g[ld->pB], dact);
	for (uint32_t i = 0; i < F; i++) {
		float gg = gu[i], sg = 1.0f / (1.0f + expf(-gg));
		float sl = gg * sg;
		dgu[i] = dact[i] * gu[F + i] * (sg * (1.0f + gg * (1.0f - sg)));
		dgu[F + i] = dact[i] * sl;
	}
	dgrad_row(&x->gu, dgu, dh, 0);
	if (la)
		lora_bwd_row(m, la, e, key, h, ua, dgu, g[la->pA], g[la->pB], dh);
}

/* Router of one token: probabilities/scores p [E], selection and weights. */
static void route_row(const struct ms_model *m, const struct layer *L,
		      const float *h, float *p, int32_t *sel, float *w)
{
	const struct ms_model_cfg *c = &m->cfg;
	uint32_t E = c->n_experts, K = c->top_k;
	float z[E], choice[E];
	for (uint32_t e = 0; e < E; e++) {
		z[e] = (float)dotf(L->router + (size_t)e * c->hidden, h, c->hidden);
	}
	if (c->router == MS_ROUTER_SOFTMAX) {
		float mx = z[0];
		double sum = 0;
		for (uint32_t e = 1; e < E; e++)
			if (z[e] > mx)
				mx = z[e];
		for (uint32_t e = 0; e < E; e++)
			sum += exp((double)z[e] - mx);
		for (uint32_t e = 0; e < E; e++) {
			p[e] = (float)(exp((double)z[e] - mx) / sum);
			choice[e] = p[e];
		}
	} else {
		uint32_t G = c->n_group, per = E / G;
		float gs[G];
		int keep[G];
		for (uint32_t e = 0; e < E; e++) {
			p[e] = 1.0f / (1.0f + expf(-z[e]));
			choice[e] = p[e] + L->ecb[e];
		}
		/* group score: sum of its two best choices; keep topk_group */
		for (uint32_t gi = 0; gi < G; gi++) {
			float b1 = -INFINITY, b2 = -INFINITY;
			for (uint32_t e = gi * per; e < (gi + 1) * per; e++) {
				if (choice[e] > b1) {
					b2 = b1;
					b1 = choice[e];
				} else if (choice[e] > b2) {
					b2 = choice[e];
				}
			}
			gs[gi] = per >= 2 ? b1 + b2 : b1;
			keep[gi] = 0;
		}
		for (uint32_t k = 0; k < c->topk_group; k++) {
			int best = -1;
			for (uint32_t gi = 0; gi < G; gi++)
				if (!keep[gi] && (best < 0 || gs[gi] > gs[best]))
					best = (int)gi;
			keep[best] = 1;
		}
		for (uint32_t e = 0; e < E; e++)
			if (!keep[e / per])
				choice[e] = -INFINITY;
	}
	/* top-k, largest first, ties to the lower index */
	{
		uint8_t used[E];
		memset(used, 0, E);
		for (uint32_t k = 0; k < K; k++) {
			int best = -1;
			for (uint32_t e = 0; e < E; e++)
				if (!used[e] && (best < 0 || choice[e] > choice[best]))
					best = (int)e;
			used[best] = 1;
			sel[k] = best;
			w[k] = p[best];
		}
	}
	if (c->norm_topk_prob) {
		float s = 0;
		for (uint32_t k = 0; k < K; k++)
			s += w[k];
		if (c->router == MS_ROUTER_SIGMOID)
			s += 1e-20f;
		for (uint32_t k = 0; k < K; k++)
			w[k] /= s;
	}
	if (c->router == MS_ROUTER_SIGMOID)
		for (uint32_t k = 0; k < K; k++)
			w[k] = w[k] * (float)c->routed_scaling_factor;
}

/* d(router logits) of one token from dw [K]; dh += router^T dz. */
static void route_bwd_row(const struct ms_model *m, const struct layer *L,
			  const float *p, const int32_t *sel, const float *w,
			  const double *dw, float *dh)
{
	const struct ms_model_cfg *c = &m->cfg;
	uint32_t E = c->n_experts, K = c->top_k;
	double dp[E], dz[E];
	memset(dp, 0, sizeof dp);
	if (c->router == MS_ROUTER_SOFTMAX) {
		if (c->norm_topk_prob) {
			double S = 0, dot = 0;
			for (uint32_t k = 0; k < K; k++) {
				S += p[sel[k]];
				dot += dw[k] * w[k];
			}
			for (uint32_t k = 0; k < K; k++)
				dp[sel[k]] += (dw[k] - dot) / S;
		} else {
			for (uint32_t k = 0; k < K; k++)
				dp[sel[k]] += dw[k];
		}
		double dot = 0;
		for (uint32_t e = 0; e < E; e++)
			dot += (double)p[e] * dp[e];
		for (uint32_t e = 0; e < E; e++)
			dz[e] = p[e] * (dp[e] - dot);
	} else {
		double rsf = c->routed_scaling_factor;
		if (c->norm_topk_prob) {
			double D = 1e-20, dot = 0;
			for (uint32_t k = 0; k < K; k++)
				D += p[sel[k]];
			for (uint32_t k = 0; k < K; k++)
				dot += dw[k] * p[sel[k]];
			for (uint32_t k = 0; k < K; k++)
				dp[sel[k]] += rsf * (dw[k] / D - dot / (D * D));
		} else {
			for (uint32_t k = 0; k < K; k++)
				dp[sel[k]] += rsf * dw[k];
		}
		for (uint32_t e = 0; e < E; e++)
			dz[e] = dp[e] * p[e] * (1.0 - p[e]);
	}
	for (uint32_t i = 0; i < c->hidden; i++) {
		double s = 0;
		for (uint32_t e = 0; e < E; e++)
			s += dz[e] * L->router[(size_t)e * c->hidden + i];
		dh[i] += (float)s;
	}
}

/* the rank owning token row t */
static uint32_t token_rank(const struct ms_model *m, size_t t)
{
	return (uint32_t)((uint64_t)(t / m->S) * m->ep / m->B);
}

/*
 * The all-to-all of one MoE layer, laid out as NCCL's all-to-all-v would
 * carry it between processes. A row is (token t, slot k), id t*K+k; rank s
 * owns the tokens of its part of the batch. Rank s's send buffer holds its
 * rows grouped by destination rank d = owner of the row's expert, tokens in
 * order within a group; rank d's receive buffer is the concatenation of
 * what every source sent it, in source-rank order. a2a_exchange moves the
 * (s, d) blocks forward (dispatch) or back (combine) and is the one place
 * a collective replaces when the ranks are processes.
 */
struct a2a {
	uint32_t ep, n;              /* ranks; rows in all (T*K) */
	uint32_t *cnt;               /* [s*ep+d] rows s sends d */
	uint32_t *soff, *roff;       /* [s*ep+d] block start in s's send /
					d's receive buffer (global index) */
	uint32_t *sbase, *rbase;     /* [ep+1] each rank's buffer start */
	uint32_t *srow;              /* [n] send order: row id */
	uint32_t *rrow;              /* [n] receive order: row id */
	uint32_t *eoff, *erows;      /* per expert: receive positions, in
					receive order (the owning rank's) */
	float *sbuf, *rbuf;          /* [n, H] */
};

static void a2a_free(struct a2a *x)
{
	ms_free(x->cnt);
	ms_free(x->soff);
	ms_free(x->roff);
	ms_free(x->sbase);
	ms_free(x->rbase);
	ms_free(x->srow);
	ms_free(x->rrow);
	ms_free(x->eoff);
	ms_free(x->erows);
	ms_free(x->sbuf);
	ms_free(x->rbuf);
	memset(x, 0, sizeof *x);
}

static int a2a_plan(const struct ms_model *m, const struct acts *a,
		    struct a2a *x, struct ms_err *err)
{
	uint32_t E = m->cfg.n_experts, K = m->cfg.top_k, P = m->ep;
	uint32_t *fill = NULL;
	size_t H = m->cfg.hidden;

	memset(x, 0, sizeof *x);
	x->ep = P;
	x->n = m->T * K;
	x->cnt = ms_calloc((size_t)P * P, sizeof *x->cnt);
	x->soff = ms_calloc((size_t)P * P, sizeof *x->soff);
	x->roff = ms_calloc((size_t)P * P, sizeof *x->roff);
	x->sbase = ms_calloc(P + 1, sizeof *x->sbase);
	x->rbase = ms_calloc(P + 1, sizeof *x->rbase);
	x->srow = ms_calloc(x->n + 1, sizeof *x->srow);
	x->rrow = ms_calloc(x->n + 1, sizeof *x->rrow);
	x->eoff = ms_calloc(E + 1, sizeof *x->eoff);
	x->erows = ms_calloc(x->n + 1, sizeof *x->erows);
	x->sbuf = alloc_f(x->n * H);
	x->rbuf = alloc_f(x->n * H);
	fill = ms_calloc((size_t)P * P + E + 1, sizeof *fill);
	if (!x->cnt || !x->soff || !x->roff || !x->sbase || !x->rbase || !x->srow ||
	    !x->rrow || !x->eoff || !x->erows || !x->sbuf || !x->rbuf || !fill) {
		ms_free(fill);
		a2a_free(x);
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	}
	/* counts, then block offsets of both layouts */
	for (uint32_t i = 0; i < x->n; i++) {
		uint32_t s = token_rank(m, i / K), d = rank_of(m, (uint32_t)a->sel[i]);
		x->cnt[s * P + d]++;
	}
	for (uint32_t s = 0; s < P; s++) {
		uint32_t o = x->sbase[s];
		for (uint32_t d = 0; d < P; d++) {
			x->soff[s * P + d] = o;
			o += x->cnt[s * P + d];
		}
		x->sbase[s + 1] = o;
	}
	for (uint32_t d = 0; d < P; d++) {
		uint32_t o = x->rbase[d];
		for (uint32_t s = 0; s < P; s++) {
			x->roff[s * P + d] = o;
			o += x->cnt[s * P + d];
		}
		x->rbase[d + 1] = o;
	}
	/* send order; the metadata travels like the rows */
	memcpy(fill, x->soff, (size_t)P * P * sizeof *fill);
	for (uint32_t i = 0; i < x->n; i++) {
		uint32_t s = token_rank(m, i / K), d = rank_of(m, (uint32_t)a->sel[i]);
		x->srow[fill[s * P + d]++] = i;
	}
	for (uint32_t s = 0; s < P; s++)
		for (uint32_t d = 0; d < P; d++)
			memcpy(x->rrow + x->roff[s * P + d], x->srow + x->soff[s * P + d],
			       x->cnt[s * P + d] * sizeof *x->rrow);
	/* each destination groups what it received by expert, stably */
	for (uint32_t q = 0; q < x->n; q++)
		x->eoff[a->sel[x->rrow[q]] + 1]++;
	for (uint32_t e = 0; e < E; e++)
		x->eoff[e + 1] += x->eoff[e];
	{
		uint32_t *ef = fill + (size_t)P * P;
		memcpy(ef, x->eoff, (E + 1) * sizeof *ef);
		for (uint32_t q = 0; q < x->n; q++)
			x->erows[ef[a->sel[x->rrow[q]]]++] = q;
	}
	ms_free(fill);
	return MS_OK;
}

/* Move every (s, d) block of width floats per row: forward from the send
 * buffers to the receive buffers, or back. */
static void a2a_exchange(struct a2a *x, size_t width, int back)
{
	for (uint32_t s = 0; s < x->ep; s++)
		for (uint32_t d = 0; d < x->ep; d++) {
			size_t c = x->cnt[s * x->ep + d];
			float *sb = x->sbuf + (size_t)x->soff[s * x->ep + d] * width;
			float *rb = x->rbuf + (size_t)x->roff[s * x->ep + d] * width;
			if (back)
				memcpy(sb, rb, c * width * sizeof(float));
			else
				memcpy(rb, sb, c * width * sizeof(float));
		}
}

/* Each source packs its rows: src row of token (per_token) or of row id. */
static void a2a_pack(const struct ms_model *m, struct a2a *x, const float *src,
		     int per_token)
{
	size_t H = m->cfg.hidden, K = m->cfg.top_k;
	for (uint32_t j = 0; j < x->n; j++) {
		uint32_t id = x->srow[j];
		memcpy(x->sbuf + j * H, src + (per_token ? id / K : id) * H,
		       H * sizeof(float));
	}
}

/* ... and unpacks what came back: dst[row id] */
static void a2a_unpack(const struct ms_model *m, const struct a2a *x, float *dst)
{
	size_t H = m->cfg.hidden;
	for (uint32_t j = 0; j < x->n; j++)
		memcpy(dst + (size_t)x->srow[j] * H, x->sbuf + j * H, H * sizeof(float));
}

struct moe_job {
	struct ms_model *m;
	uint32_t l;
	struct layer *L;
	struct acts *a;
	struct a2a *x;
	int oom;
};

/* The experts' forward on the ranks that own them: every row an expert
 * received (rbuf: inputs in, outputs before the routing weight out). The
 * inputs are kept for the backward, as the owning rank would keep them. */
static void moe_fwd_experts(void *p, size_t lo, size_t hi)
{
	struct moe_job *j = p;
	struct ms_model *m = j->m;
	uint32_t H = m->cfg.hidden, F = m->cfg.moe_ffn, r = m->lora.r;
	float *y = ms_malloc(H * sizeof *y);
	if (!y) {
		__atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
		return;
	}
	for (size_t e = lo; e < hi; e++) {
		const struct ms_rank *rk = &m->ranks[rank_of(m, (uint32_t)e)];
		const struct expert *ex = &rk->ex[j->l][e - rk->e0];
		for (uint32_t q = j->x->eoff[e]; q < j->x->eoff[e + 1]; q++) {
			uint32_t pos = j->x->erows[q], id = j->x->rrow[pos];
			float *io = j->x->rbuf + (size_t)pos * H;
			memcpy(j->a->xin + (size_t)id * H, io, H * sizeof *io);
			mlp_fwd_row(m, ex, j->L->lgu, j->L->ldown, (uint32_t)e, id, io,
				    j->a->gu + (size_t)id * 2 * F,
				    j->a->act + (size_t)id * F,
				    j->a->ugu + (size_t)id * r,
				    j->a->udn + (size_t)id * r, y);
			memcpy(io, y, H * sizeof *y);
		}
	}
	ms_free(y);
}

/* Backward on the owning ranks: rbuf holds each row's d(expert output),
 * replaced by d(expert input); the expert LoRA gradients go to the owning
 * rank's accumulators (its slice of the fused tensors). */
static void moe_bwd_experts(void *p, size_t lo, size_t hi)
{
	struct moe_job *j = p;
	struct ms_model *m = j->m;
	uint32_t H = m->cfg.hidden, F = m->cfg.moe_ffn, r = m->lora.r;
	float *dact = ms_malloc(F * sizeof(float));
	float *dgu = ms_malloc(2 * F * sizeof(float));
	float *dh = ms_malloc(H * sizeof(float));
	if (!dact || !dgu || !dh) {
		__atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
		goto out;
	}
	for (size_t e = lo; e < hi; e++) {
		const struct ms_rank *rk = &m->ranks[rank_of(m, (uint32_t)e)];
		const struct expert *ex = &rk->ex[j->l][e - rk->e0];
		for (uint32_t q = j->x->eoff[e]; q < j->x->eoff[e + 1]; q++) {
			uint32_t pos = j->x->erows[q], id = j->x->rrow[pos];
			float *io = j->x->rbuf + (size_t)pos * H;
			mlp_bwd_row(m, ex, j->L->lgu, j->L->ldown, (uint32_t)e, id,
				    rk->gacc, j->a->xin + (size_t)id * H,
				    j->a->gu + (size_t)id * 2 * F,
				    j->a->act + (size_t)id * F,
				    j->a->ugu + (size_t)id * r,
				    j->a->udn + (size_t)id * r, io, dact, dgu, dh);
			memcpy(io, dh, H * sizeof *dh);
		}
	}
out:
	ms_free(dact);
	ms_free(dgu);
	ms_free(dh);
}

/* ---- layers --------------------------------------------------------------- */

static int colwise_layer(struct ms_model *m, uint32_t l, int build,
			 struct ms_err *err)
{
	struct layer *L = &m->layers[l];
	struct lin *ls[6] = {&L->q, &L->k, &L->v, &L->o, &L->sh.gu, &L->sh.down};
	int rc;
	if (m->opts.colwise == MS_COLWISE_RESIDENT)
		return MS_OK;
	for (int i = 0; i < 6; i++) {
		if (!ls[i]->w)
			continue;
		if (build) {
			if ((rc = lin_colwise(ls[i], err)))
				return rc;
		} else {
			ms_free(ls[i]->wt);
			ls[i]->wt = NULL;
		}
	}
	for (uint32_t k = 0; k < m->ep; k++) {
		struct ms_rank *rk = &m->ranks[k];
		if (!rk->ex[l])
			continue;
		for (uint32_t e = 0; e < rk->e1 - rk->e0; e++) {
			struct lin *xl[2] = {&rk->ex[l][e].gu, &rk->ex[l][e].down};
			for (int i = 0; i < 2; i++) {
				if (build) {
					if ((rc = lin_colwise(xl[i], err)))
						return rc;
				} else {
					ms_free(xl[i]->wt);
					xl[i]->wt = NULL;
				}
			}
		}
	}
	return MS_OK;
}

static int layer_fwd(struct ms_model *m, uint32_t l, const float *xin,
		     float *xout, struct ms_err *err)
{
	const struct ms_model_cfg *c = &m->cfg;
	struct layer *L = &m->layers[l];
	struct acts *a = &m->acts[l];
	size_t T = m->T, H = c->hidden, hd = c->head_dim;
	size_t nh = c->n_heads, nkv = c->n_kv_heads, dq = nh * hd, dkv = nkv * hd;
	size_t r = m->lora.r;
	float *y = alloc_f(T * H);
	int rc = MS_OK;
	struct att_job aj = {m, a, NULL, NULL, NULL, NULL, 0};

	if (!y)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	memcpy(a->x, xin, T * H * sizeof(float));
	rms_fwd(m, a->x, L->ln1, T, (uint32_t)H, a->h1, a->r1);
	lin_fwd(m, &L->q, a->h1, T, a->q0);
	lin_fwd(m, &L->k, a->h1, T, a->k0);
	lin_fwd(m, &L->v, a->h1, T, a->v);
	for (size_t t = 0; t < T; t++) {
		if (L->lq)
			lora_fwd_row(m, L->lq, 0, t, a->h1 + t * H, a->uq + t * r,
				     a->q0 + t * dq);
		if (L->lk)
			lora_fwd_row(m, L->lk, 0, t, a->h1 + t * H, a->uk + t * r,
				     a->k0 + t * dkv);
		if (L->lv)
			lora_fwd_row(m, L->lv, 0, t, a->h1 + t * H, a->uv + t * r,
				     a->v + t * dkv);
	}
	if (L->qn) {
		struct rms_job jq = {a->q0, L->qn, a->qr, a->rq, (uint32_t)hd, c->rms_eps};
		struct rms_job jk = {a->k0, L->kn, a->kr, a->rk, (uint32_t)hd, c->rms_eps};
		rms_rows(&jq, 0, T * nh);
		rms_rows(&jk, 0, T * nkv);
	} else {
		memcpy(a->qr, a->q0, T * dq * sizeof(float));
		memcpy(a->kr, a->k0, T * dkv * sizeof(float));
	}
	for (size_t t = 0; t < T; t++) {
		/* a decode's one token per sequence sits at the cache's length */
		uint32_t pos = m->kv ? m->kv->len : (uint32_t)(t % m->S);
		for (size_t h = 0; h < nh; h++)
			rope_fwd(m, pos, a->qr + t * dq + h * hd, a->q + t * dq + h * hd);
		for (size_t h = 0; h < nkv; h++)
			rope_fwd(m, pos, a->kr + t * dkv + h * hd, a->k + t * dkv + h * hd);
	}
	if (m->kv) {
		struct ms_kv_cache *kv = m->kv;
		float *K = kv->k + (size_t)l * kv->B * kv->cap * dkv;
		float *Vc = kv->v + (size_t)l * kv->B * kv->cap * dkv;
		for (uint32_t b = 0; b < kv->B; b++) {
			memcpy(K + ((size_t)b * kv->cap + kv->len) * dkv, a->k + b * dkv,
			       dkv * sizeof(float));
			memcpy(Vc + ((size_t)b * kv->cap + kv->len) * dkv, a->v + b * dkv,
			       dkv * sizeof(float));
		}
		aj.dk = K;
		aj.dv = Vc;
		par_for(m->nthreads, (size_t)m->B * nh, 1, att_decode_pairs, &aj);
	} else {
		par_for(m->nthreads, (size_t)m->B * nh, 1, att_fwd_pairs, &aj);
	}
	if (aj.oom) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	lin_fwd(m, &L->o, a->ctx, T, y);
	for (size_t t = 0; t < T; t++) {
		if (L->lo)
			lora_fwd_row(m, L->lo, 0, t, a->ctx + t * dq, a->uo + t * r,
				     y + t * H);
		for (size_t i = 0; i < H; i++)
			a->x2[t * H + i] = a->x[t * H + i] + y[t * H + i];
	}
	rms_fwd(m, a->x2, L->ln2, T, (uint32_t)H, a->h2, a->r2);
	memset(y, 0, T * H * sizeof(float));
	if (L->moe) {
		uint32_t K = c->top_k;
		struct a2a x = {0};
		struct moe_job mj = {m, l, L, a, &x, 0};
		for (size_t t = 0; t < T; t++)
			route_row(m, L, a->h2 + t * H, a->probs + t * c->n_experts,
				  a->sel + t * K, a->wts + t * K);
		if ((rc = a2a_plan(m, a, &x, err)))
			goto out;
		a2a_pack(m, &x, a->h2, 1);
		a2a_exchange(&x, H, 0);
		par_for(m->nthreads, c->n_experts, 1, moe_fwd_experts, &mj);
		if (mj.oom) {
			a2a_free(&x);
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto out;
		}
		a2a_exchange(&x, H, 1);
		a2a_unpack(m, &x, a->ye);
		a2a_free(&x);
		for (size_t t = 0; t < T; t++)
			for (size_t i = 0; i < H; i++) {
				double s = 0;
				for (uint32_t k = 0; k < K; k++)
					s += (double)(a->ye[(t * K + k) * H + i] *
						      a->wts[t * K + k]);
				y[t * H + i] = (float)s;
			}
	}
	if (L->sh.gu.w) {
		size_t fs = L->sh.gu.out / 2;
		float *ys = alloc_f(H);
		if (!ys) {
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto out;
		}
		for (size_t t = 0; t < T; t++) {
			mlp_fwd_row(m, &L->sh, NULL, NULL, 0, t, a->h2 + t * H,
				    a->sgu + t * 2 * fs, a->sact + t * fs, NULL, NULL,
				    ys);
			for (size_t i = 0; i < H; i++)
				y[t * H + i] += ys[i];
		}
		ms_free(ys);
	}
	for (size_t i = 0; i < T * H; i++)
		xout[i] = a->x2[i] + y[i];
out:
	ms_free(y);
	return rc;
}

/* attention LoRA backward over the tokens of each rank, into its own
 * accumulators (the replicated parameters' gradients are reduced later) */
static void lora_bwd_tokens(struct ms_model *m, const struct lora *L,
			    const float *x, const float *u, const float *dy,
			    float *dx)
{
	for (size_t t = 0; t < m->T; t++) {
		double **g = m->ranks[token_rank(m, t)].gacc;
		lora_bwd_row(m, L, 0, t, x + t * L->in, u + t * L->r,
			     dy + t * L->out, g[L->pA], g[L->pB], dx + t * L->in);
	}
}

static int layer_bwd(struct ms_model *m, uint32_t l, const float *dxo,
		     float *dxi, struct ms_err *err)
{
	const struct ms_model_cfg *c = &m->cfg;
	struct layer *L = &m->layers[l];
	struct acts *a = &m->acts[l];
	size_t T = m->T, H = c->hidden, hd = c->head_dim;
	size_t nh = c->n_heads, nkv = c->n_kv_heads, dq = nh * hd, dkv = nkv * hd;
	float *dh2 = alloc_f(T * H), *dx2 = alloc_f(T * H);
	float *dctx = alloc_f(T * dq), *dqv = alloc_f(T * dq);
	float *dkk = alloc_f(T * dkv), *dvv = alloc_f(T * dkv);
	float *dq0 = alloc_f(T * dq), *dk0 = alloc_f(T * dkv), *dh1 = alloc_f(T * H);
	int rc;
	struct att_job aj = {m, a, dctx, dqv, dkk, dvv, 0};

	if (!dh2 || !dx2 || !dctx || !dqv || !dkk || !dvv || !dq0 || !dk0 || !dh1) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = colwise_layer(m, l, 1, err)))
		goto out;
	/* MLP: dY = dxo */
	if (L->moe) {
		uint32_t K = c->top_k;
		struct a2a x = {0};
		struct moe_job mj = {m, l, L, a, &x, 0};
		float *dye = alloc_f(T * K * H);
		if (!dye || (rc = a2a_plan(m, a, &x, err))) {
			ms_free(dye);
			if (!rc)
				rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto out;
		}
		for (size_t t = 0; t < T; t++) {
			double dw[K];
			for (uint32_t k = 0; k < K; k++) {
				const float *ye = a->ye + (t * K + k) * H;
				float w = a->wts[t * K + k];
				double d = 0;
				for (size_t i = 0; i < H; i++) {
					d += (double)dxo[t * H + i] * ye[i];
					dye[(t * K + k) * H + i] = dxo[t * H + i] * w;
				}
				dw[k] = d;
			}
			route_bwd_row(m, L, a->probs + t * c->n_experts, a->sel + t * K,
				      a->wts + t * K, dw, dh2 + t * H);
		}
		a2a_pack(m, &x, dye, 0);
		a2a_exchange(&x, H, 0);
		par_for(m->nthreads, c->n_experts, 1, moe_bwd_experts, &mj);
		if (mj.oom) {
			ms_free(dye);
			a2a_free(&x);
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto out;
		}
		a2a_exchange(&x, H, 1);
		a2a_unpack(m, &x, dye);
		a2a_free(&x);
		for (size_t t = 0; t < T; t++)
			for (size_t i = 0; i < H; i++) {
				double s = 0;
				for (uint32_t k = 0; k < K; k++)
					s += dye[(t * K + k) * H + i];
				dh2[t * H + i] += (float)s;
			}
		ms_free(dye);
	}
	if (L->sh.gu.w) {
		size_t fs = L->sh.gu.out / 2;
		float *da = alloc_f(fs), *dg = alloc_f(2 * fs), *dh = alloc_f(H);
		if (!da || !dg || !dh) {
			ms_free(da);
			ms_free(dg);
			ms_free(dh);
			rc = ms_err_set(err, MS_ENOMEM, "out of memory");
			goto out;
		}
		for (size_t t = 0; t < T; t++) {
			mlp_bwd_row(m, &L->sh, NULL, NULL, 0, t, NULL, a->h2 + t * H,
				    a->sgu + t * 2 * fs, a->sact + t * fs, NULL, NULL,
				    dxo + t * H, da, dg, dh);
			for (size_t i = 0; i < H; i++)
				dh2[t * H + i] += dh[i];
		}
		ms_free(da);
		ms_free(dg);
		ms_free(dh);
	}
	memcpy(dx2, dxo, T * H * sizeof(float));
	for (size_t t = 0; t < T; t++)
		rms_bwd_row(a->x2 + t * H, L->ln2, a->r2[t], dh2 + t * H,
			    (uint32_t)H, dx2 + t * H);
	/* attention */
	lin_dgrad(m, &L->o, dx2, T, dctx, 0);
	if (L->lo)
		lora_bwd_tokens(m, L->lo, a->ctx, a->uo, dx2, dctx);
	par_for(m->nthreads, (size_t)m->B * nkv, 1, att_bwd_groups, &aj);
	if (aj.oom) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	for (size_t t = 0; t < T; t++) {
		uint32_t pos = (uint32_t)(t % m->S);
		for (size_t h = 0; h < nh; h++)
			rope_bwd(m, pos, dqv + t * dq + h * hd, dq0 + t * dq + h * hd);
		for (size_t h = 0; h < nkv; h++)
			rope_bwd(m, pos, dkk + t * dkv + h * hd, dk0 + t * dkv + h * hd);
	}
	if (L->qn) {
		/* dq0 holds d(normed q); the norm's input gradient replaces it */
		memcpy(dqv, dq0, T * dq * sizeof(float));
		memcpy(dkk, dk0, T * dkv * sizeof(float));
		memset(dq0, 0, T * dq * sizeof(float));
		memset(dk0, 0, T * dkv * sizeof(float));
		for (size_t i = 0; i < T * nh; i++)
			rms_bwd_row(a->q0 + i * hd, L->qn, a->rq[i], dqv + i * hd,
				    (uint32_t)hd, dq0 + i * hd);
		for (size_t i = 0; i < T * nkv; i++)
			rms_bwd_row(a->k0 + i * hd, L->kn, a->rk[i], dkk + i * hd,
				    (uint32_t)hd, dk0 + i * hd);
	}
	lin_dgrad(m, &L->q, dq0, T, dh1, 0);
	lin_dgrad(m, &L->k, dk0, T, dh1, 1);
	lin_dgrad(m, &L->v, dvv, T, dh1, 1);
	if (L->lq)
		lora_bwd_tokens(m, L->lq, a->h1, a->uq, dq0, dh1);
	if (L->lk)
		lora_bwd_tokens(m, L->lk, a->h1, a->uk, dk0, dh1);
	if (L->lv)
		lora_bwd_tokens(m, L->lv, a->h1, a->uv, dvv, dh1);
	memcpy(dxi, dx2, T * H * sizeof(float));
	for (size_t t = 0; t < T; t++)
		rms_bwd_row(a->x + t * H, L->ln1, a->r1[t], dh1 + t * H, (uint32_t)H,
			    dxi + t * H);
out:
	colwise_layer(m, l, 0, NULL);
	ms_free(dh2);
	ms_free(dx2);
	ms_free(dctx);
	ms_free(dqv);
	ms_free(dkk);
	ms_free(dvv);
	ms_free(dq0);
	ms_free(dk0);
	ms_free(dh1);
	return rc;
}

/* ---- whole model ----------------------------------------------------------------- */

struct head_job {
	struct ms_model *m;
	float *dl;                   /* [T, V] d logits */
	float *dhf;                  /* [T, H] */
};

static void logits_rows(void *p, size_t lo, size_t hi)
{
	struct head_job *j = p;
	const struct ms_model_cfg *c = &j->m->cfg;
	for (size_t t = lo; t < hi; t++) {
		const float *h = j->m->hf + t * c->hidden;
		for (uint32_t v = 0; v < c->vocab; v++)
			j->m->logits[t * c->vocab + v] =
				(float)dotf(j->m->lm_head + (size_t)v * c->hidden, h,
					    c->hidden);
	}
}

static void head_bwd_rows(void *p, size_t lo, size_t hi)
{
	struct head_job *j = p;
	const struct ms_model_cfg *c = &j->m->cfg;
	for (size_t t = lo; t < hi; t++) {
		const float *d = j->dl + t * c->vocab;
		float *o = j->dhf + t * c->hidden;
		double acc[c->hidden];
		memset(acc, 0, sizeof acc);
		for (uint32_t v = 0; v < c->vocab; v++) {
			const float *w = j->m->lm_head + (size_t)v * c->hidden;
			if (d[v] == 0)
				continue;
			for (uint32_t i = 0; i < c->hidden; i++)
				acc[i] += (double)d[v] * w[i];
		}
		for (uint32_t i = 0; i < c->hidden; i++)
			o[i] = (float)acc[i];
	}
}

int ms_model_check_ids(const struct ms_model *m, const int32_t *ids,
		       uint32_t batch, uint32_t seq, struct ms_err *err)
{
	size_t T = (size_t)batch * seq;

	if (!batch || !seq)
		return ms_err_set(err, MS_EINVAL, "batch and sequence length must be > 0");
	if (batch % m->ep)
		return ms_err_set(err, MS_EINVAL,
				  "batch %u is not a multiple of the EP size %u", batch,
				  m->ep);
	for (size_t t = 0; t < T; t++)
		if (ids[t] < 0 || (uint32_t)ids[t] >= m->cfg.vocab)
			return ms_err_set(err, MS_EINVAL,
					  "token id %d at position %zu is outside the "
					  "vocabulary (%u)", ids[t], t, m->cfg.vocab);
	return MS_OK;
}

static int model_fwd(struct ms_model *m, const int32_t *ids, uint32_t batch,
		     uint32_t seq, struct ms_err *err)
{
	const struct ms_model_cfg *c = &m->cfg;
	size_t T, H = c->hidden;
	float *x = NULL, *x2 = NULL;
	int rc;

	if ((rc = ms_model_check_ids(m, ids, batch, seq, err)))
		return rc;
	T = (size_t)batch * seq;
	if ((rc = acts_alloc(m, batch, seq, err)) || (rc = ms_model_rope(m, seq, err)))
		return rc;
	x = alloc_f(T * H);
	x2 = alloc_f(T * H);
	if (!x || !x2) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	for (size_t t = 0; t < T; t++)
		memcpy(x + t * H, m->embed + (size_t)ids[t] * H, H * sizeof(float));
	for (uint32_t l = 0; l < c->n_layers; l++) {
		float *tmp;
		if ((rc = layer_fwd(m, l, x, x2, err)))
			goto out;
		tmp = x;
		x = x2;
		x2 = tmp;
	}
	memcpy(m->xf, x, T * H * sizeof(float));
	rms_fwd(m, m->xf, m->norm, T, (uint32_t)H, m->hf, m->rf);
	{
		struct head_job hj = {m, NULL, NULL};
		par_for(m->nthreads, T, 1, logits_rows, &hj);
	}
out:
	ms_free(x);
	ms_free(x2);
	return rc;
}

int ms_model_forward(struct ms_model *m, const int32_t *ids, uint32_t batch,
		     uint32_t seq, float *logits, struct ms_err *err)
{
	int rc;
	if (m->gpu)
		return ms_gmodel_step(m, ids, NULL, batch, seq, 0, 0, NULL, NULL, logits,
				      0, NULL, NULL, err);
	m->train = 0;
	if ((rc = model_fwd(m, ids, batch, seq, err)))
		return rc;
	if (logits)
		memcpy(logits, m->logits,
		       (size_t)m->T * m->cfg.vocab * sizeof(float));
	return MS_OK;
}

/* Backward from m->logits, which hold d loss / d logits [T, V] (already
 * scaled), into every parameter's g (+=). */
static int model_bwd(struct ms_model *m, struct ms_err *err)
{
	const struct ms_model_cfg *c = &m->cfg;
	size_t T = m->T, H = c->hidden;
	float *d = NULL, *d2 = NULL;
	int rc = MS_OK;

	d = alloc_f(T * H);
	d2 = alloc_f(T * H);
	if (!d || !d2) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	{
		struct head_job hj = {m, m->logits, d2};
		par_for(m->nthreads, T, 1, head_bwd_rows, &hj);
	}
	for (size_t t = 0; t < T; t++)
		rms_bwd_row(m->xf + t * H, m->norm, m->rf[t], d2 + t * H, (uint32_t)H,
			    d + t * H);
	for (uint32_t l = c->n_layers; l-- > 0;) {
		float *tmp;
		if ((rc = layer_bwd(m, l, d, d2, err)))
			goto out;
		tmp = d;
		d = d2;
		d2 = tmp;
	}
	/* reduce: every rank's accumulators, in rank order, into g */
	for (size_t i = 0; i < m->nparams; i++) {
		struct ms_param *p = &m->params[i];
		for (uint64_t e = 0; e < p->n; e++) {
			double s = 0;
			for (uint32_t r = 0; r < m->ep; r++) {
				s += m->ranks[r].gacc[i][e];
				m->ranks[r].gacc[i][e] = 0;
			}
			p->g[e] += (float)s;
		}
	}
out:
	if (rc)
		for (uint32_t r = 0; r < m->ep; r++)
			for (size_t i = 0; i < m->nparams; i++)
				memset(m->ranks[r].gacc[i], 0,
				       m->params[i].n * sizeof(double));
	ms_free(d);
	ms_free(d2);
	return rc;
}

int ms_kv_cache_new(const struct ms_model *m, uint32_t batch, uint32_t cap,
		    struct ms_kv_cache **out, struct ms_err *err)
{
	const struct ms_model_cfg *c = &m->cfg;
	struct ms_kv_cache *kv;
	size_t n;
	int rc;

	*out = NULL;
	if (!batch || !cap)
		return ms_err_set(err, MS_EINVAL, "KV cache: batch and length must be > 0");
	if (!(kv = ms_calloc(1, sizeof(*kv))))
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	kv->B = batch;
	kv->cap = cap;
	kv->nl = c->n_layers;
	kv->dkv = c->n_kv_heads * c->head_dim;
	n = (size_t)kv->nl * batch * cap * kv->dkv;
	if (m->gpu) {
		/* the model is const to its readers; the device copy's
		 * registry and stream are not part of that */
		if ((rc = ms_gmodel_kv_alloc((struct ms_model *)m, kv, err)) != MS_OK) {
			ms_free(kv);
			return rc;
		}
	} else if (!(kv->k = alloc_f(n)) || !(kv->v = alloc_f(n))) {
		ms_kv_cache_free(kv);
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	}
	*out = kv;
	return MS_OK;
}

void ms_kv_cache_free(struct ms_kv_cache *kv)
{
	if (!kv)
		return;
	if (kv->gpu) {
		ms_gmodel_kv_free(kv);
	} else {
		ms_free(kv->k);
		ms_free(kv->v);
	}
	ms_free(kv);
}

void ms_kv_cache_reset(struct ms_kv_cache *kv)
{
	kv->len = 0;
}

uint32_t ms_kv_cache_len(const struct ms_kv_cache *kv)
{
	return kv->len;
}

int ms_model_decode(struct ms_model *m, struct ms_kv_cache *kv, const int32_t *ids,
		    float *logits, struct ms_err *err)
{
	int rc;

	if (kv->nl != m->cfg.n_layers || kv->dkv != m->cfg.n_kv_heads * m->cfg.head_dim ||
	    kv->gpu != (m->gpu != NULL))
		return ms_err_set(err, MS_EINVAL, "KV cache: made for another model");
	if (kv->len >= kv->cap)
		return ms_err_set(err, MS_EINVAL, "KV cache: full (%u positions)", kv->cap);
	if (m->gpu) {
		if ((rc = ms_gmodel_decode(m, kv, ids, logits, err)) != MS_OK)
			return rc;
		kv->len++;
		return MS_OK;
	}
	if ((rc = ms_model_rope(m, kv->len + 1, err)))
		return rc;
	m->train = 0;
	m->kv = kv;
	rc = model_fwd(m, ids, kv->B, 1, err);
	m->kv = NULL;
	if (rc)
		return rc;
	kv->len++;
	if (logits)
		memcpy(logits, m->logits, (size_t)kv->B * m->cfg.vocab * sizeof(float));
	return MS_OK;
}

int ms_model_step(struct ms_model *m, const int32_t *ids,
		  const uint8_t *loss_mask, uint32_t batch, uint32_t seq,
		  double grad_scale, uint64_t step, double *loss_sum,
		  uint64_t *n_tokens, struct ms_err *err)
{
	size_t T, V = m->cfg.vocab;
	double loss = 0;
	uint64_t nt = 0;
	int rc;

	if (m->gpu)
		return ms_gmodel_step(m, ids, loss_mask, batch, seq, grad_scale, step,
				      NULL, NULL, NULL, 1, loss_sum, n_tokens, err);
	m->train = 1;
	m->step = step;
	if ((rc = model_fwd(m, ids, batch, seq, err)))
		goto out;
	T = m->T;
	/* cross-entropy; the logits become their gradient in place */
	for (size_t t = 0; t < T; t++) {
		size_t s = t % seq;
		float *lg = m->logits + t * V;
		if (s + 1 >= seq || (loss_mask && !loss_mask[t + 1])) {
			memset(lg, 0, V * sizeof(float));
			continue;
		}
		int32_t lab = ids[t + 1];
		double mx = lg[0], sum = 0;
		for (size_t v = 1; v < V; v++)
			if (lg[v] > mx)
				mx = lg[v];
		for (size_t v = 0; v < V; v++)
			sum += exp((double)lg[v] - mx);
		double lse = mx + log(sum);
		loss += lse - lg[lab];
		nt++;
		for (size_t v = 0; v < V; v++) {
			double pv = exp((double)lg[v] - lse);
			lg[v] = (float)(grad_scale * (pv - (v == (size_t)lab)));
		}
	}
	if ((rc = model_bwd(m, err)))
		goto out;
	*loss_sum = loss;
	*n_tokens = nt;
out:
	m->train = 0;
	return rc;
}

int ms_model_step_fn(struct ms_model *m, const int32_t *ids, uint32_t batch,
		     uint32_t seq, uint64_t step, ms_model_dlogits_fn fn, void *ctx,
		     struct ms_err *err)
{
	int rc;

	if (m->gpu)
		return ms_gmodel_step(m, ids, NULL, batch, seq, 0, step, fn, ctx, NULL,
				      1, NULL, NULL, err);
	m->train = 1;
	m->step = step;
	if ((rc = model_fwd(m, ids, batch, seq, err)))
		goto out;
	if ((rc = fn(ctx, m->logits, m->T, m->cfg.vocab, err)))
		goto out;
	rc = model_bwd(m, err);
out:
	m->train = 0;
	return rc;
}

/* ---- where the parameters live ----------------------------------------------- */

int ms_device_parse(const char *s, enum ms_device *out)
{
	if (!strcmp(s, "cpu"))
		*out = MS_DEVICE_CPU;
	else if (!strcmp(s, "cuda"))
		*out = MS_DEVICE_CUDA;
	else
		return MS_EINVAL;
	return MS_OK;
}

int ms_model_sync(struct ms_model *m, struct ms_adamw *o, int dir,
		  struct ms_err *err)
{
	(void)o;
	if (!m->gpu)
		return MS_OK;
	return ms_gmodel_sync(m, o, dir, err);
}

int ms_model_optim_step(struct ms_model *m, struct ms_adamw *o, double lr,
			double *grad_norm, struct ms_err *err)
{
	if (m->gpu)
		return ms_gmodel_optim(m, o, lr, grad_norm, err);
	if (o->np != m->nparams)
		return ms_err_set(err, MS_EINVAL,
				  "optimizer made over %zu tensors, the model has %zu",
				  o->np, m->nparams);
	*grad_norm = ms_grad_clip(o->p, o->np, o->cfg.clip);
	ms_adamw_update(o, lr);
	return MS_OK;
}

int ms_model_mem(const struct ms_model *m, struct ms_model_mem *out)
{
	memset(out, 0, sizeof *out);
	return m->gpu ? ms_gmodel_mem(m, out) : MS_OK;
}

int ms_model_routing(const struct ms_model *m, uint32_t l, int32_t *sel, float *probs,
		     struct ms_err *err)
{
	const struct ms_model_cfg *c = &m->cfg;
	if (l >= c->n_layers || !m->layers[l].moe)
		return ms_err_set(err, MS_EINVAL, "routing: layer %u is not a MoE layer", l);
	if (m->gpu)
		return ms_gmodel_routing(m, l, sel, probs, err);
	if (!m->T || !m->acts || !m->acts[l].sel)
		return ms_err_set(err, MS_EINVAL, "routing: the model has run no forward");
	memcpy(sel, m->acts[l].sel, (size_t)m->T * c->top_k * sizeof *sel);
	memcpy(probs, m->acts[l].probs, (size_t)m->T * c->n_experts * sizeof *probs);
	return MS_OK;
}

int ms_model_profile(const struct ms_model *m, char **json, struct ms_err *err)
{
	*json = NULL;
	if (!m->gpu)
		return ms_err_set(err, MS_EINVAL, "the CPU model keeps no profile");
	return ms_gmodel_profile(m, json, err);
}

/* ---- adapter_config.json ------------------------------------------------------ */

/* Attach item (which may be NULL after a failed allocation) or free it:
 * a failed attach would otherwise leak it; ms_json_failed reports both. */
static void json_put(cJSON *o, const char *key, cJSON *item)
{
	if (item && !(key ? cJSON_AddItemToObject(o, key, item)
			  : cJSON_AddItemToArray(o, item)))
		cJSON_Delete(item);
}

int ms_model_adapter_config(const struct ms_model *m, char **json,
			    struct ms_err *err)
{
	static const char *mods[4] = {"k_proj", "o_proj", "q_proj", "v_proj"};
	static const uint32_t bits[4] = {MS_LORA_K, MS_LORA_O, MS_LORA_Q, MS_LORA_V};
	uint64_t mark = ms_json_mark();
	cJSON *o, *am, *tm, *tp;
	char lib[160];
	char *s = NULL;

	*json = NULL;
	ms_json_init();
	o = cJSON_CreateObject();
	if (!o)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	json_put(o, "alpha_pattern", cJSON_CreateObject());
	am = cJSON_CreateObject();
	snprintf(lib, sizeof lib, "transformers.models.%s.modeling_%s",
		 m->cfg.model_type, m->cfg.model_type);
	if (am) {
		cJSON_AddStringToObject(am, "base_model_class", m->cfg.arch);
		cJSON_AddStringToObject(am, "parent_library", lib);
	}
	json_put(o, "auto_mapping", am);
	cJSON_AddNullToObject(o, "base_model_name_or_path");
	cJSON_AddStringToObject(o, "bias", "none");
	cJSON_AddFalseToObject(o, "fan_in_fan_out");
	cJSON_AddTrueToObject(o, "inference_mode");
	cJSON_AddTrueToObject(o, "init_lora_weights");
	cJSON_AddNullToObject(o, "layers_pattern");
	cJSON_AddNullToObject(o, "layers_to_transform");
	cJSON_AddNumberToObject(o, "lora_alpha", m->lora.alpha);
	cJSON_AddFalseToObject(o, "lora_bias");
	cJSON_AddNumberToObject(o, "lora_dropout", m->lora.dropout);
	cJSON_AddNullToObject(o, "modules_to_save");
	cJSON_AddStringToObject(o, "peft_type", "LORA");
	cJSON_AddNumberToObject(o, "r", m->lora.r);
	json_put(o, "rank_pattern", cJSON_CreateObject());
	cJSON_AddNullToObject(o, "revision");
	if (m->lora.targets & (MS_LORA_Q | MS_LORA_K | MS_LORA_V | MS_LORA_O)) {
		tm = cJSON_CreateArray();
		for (int i = 0; tm && i < 4; i++)
			if (m->lora.targets & bits[i])
				json_put(tm, NULL, cJSON_CreateString(mods[i]));
		json_put(o, "target_modules", tm);
	} else {
		cJSON_AddNullToObject(o, "target_modules");
	}
	if (m->lora.targets & MS_LORA_EXPERTS) {
		/* as PEFT writes it; it wraps gate_up_proj first (the inner
		 * "base_layer" of the saved keys) */
		tp = cJSON_CreateArray();
		if (tp) {
			json_put(tp, NULL, cJSON_CreateString("mlp.experts.down_proj"));
			json_put(tp, NULL, cJSON_CreateString("mlp.experts.gate_up_proj"));
		}
		json_put(o, "target_parameters", tp);
	} else {
		cJSON_AddNullToObject(o, "target_parameters");
	}
	cJSON_AddNullToObject(o, "task_type");
	cJSON_AddFalseToObject(o, "use_dora");
	cJSON_AddFalseToObject(o, "use_rslora");
	if (!ms_json_failed(mark))
		s = cJSON_Print(o);
	cJSON_Delete(o);
	if (!s || ms_json_failed(mark)) {
		ms_free(s);
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	}
	*json = s;
	return MS_OK;
}
