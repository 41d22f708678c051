/*
 * shard_pool.c: the one pool of threads an operation's heavy work runs
 * on (prefaulting, hashing, writing), and the jobs that compute the
 * canonical digest of every expert slice.
 */
#include "shard_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fsutil.h"
#include "hash.h"
#include "inventory.h"
#include "names.h"
#include "pool.h"
#include "safetensors.h"
#include "stage.h"

/* ---- the work pool ---------------------------------------------------------- */

int shard_sha_fail(int rc, struct ms_err *err)
{
	return rc == MS_ENOMEM ? ms_err_nomem(err) : ms_err_set(err, rc, "sha256 failed");
}

/* Scatter rows [o0, o1) of a [out, r*n] B tensor (row bytes apart) into n
 * contiguous blocks of buf, one per position pos: block pos holds B_pos's
 * rows [o0, o1) as [o1 - o0, r]. One pass reading the tile in order. */
static void scatter_b(uint8_t *buf, const uint8_t *holder, uint64_t o0, uint64_t o1,
		      uint64_t r, uint32_t n, size_t es, uint64_t blk)
{
	uint64_t row = r * n * es;

	for (uint64_t o = o0; o < o1; o++) {
		const uint8_t *p = holder + o * row;
		uint8_t *d = buf + (o - o0) * r * es;

		for (uint64_t k = 0; k < r; k++, d += es) {
			uint8_t *q = d;

			switch (es) {
			case 2:
				for (uint32_t pos = 0; pos < n; pos++, p += 2, q += blk)
					memcpy(q, p, 2);
				break;
			case 4:
				for (uint32_t pos = 0; pos < n; pos++, p += 4, q += blk)
					memcpy(q, p, 4);
				break;
			default:
				for (uint32_t pos = 0; pos < n; pos++, p += es, q += blk)
					memcpy(q, p, es);
			}
		}
	}
}

/*
 * Canonical B slices of every expert that holder (a [out, r*n] tensor)
 * holds: dst[pos] (NULL: skip) receives the SHA-256 of B_e as [out, r]
 * contiguous, whose element (o, k) is column k*n + pos. A tile of rows
 * is regrouped per expert into buf in one pass and each expert's part
 * hashed from there, in cache: the tensor is never regrouped as a whole.
 * (When a tile's blocks do not fit in buf, each expert's columns are
 * picked out of it in turn.)
 */
static int hash_b(const struct stensor *t, const uint8_t *holder, uint32_t n,
		  uint8_t *const *dst, uint8_t *buf, struct ms_err *err)
{
	size_t es = ms_dtype_bits(t->dtype) / 8;
	uint64_t out = t->shape[0], r = t->r, row = r * n * es;
	uint64_t tile = row >= TILE ? 1 : TILE / row;
	struct ms_sha256_ctx **c = ms_calloc(n ? n : 1, sizeof(*c));
	int rc = MS_OK;

	if (!c)
		return ms_err_nomem(err);
	for (uint32_t pos = 0; pos < n; pos++)
		if (dst[pos] && !(c[pos] = ms_sha256_new())) {
			rc = ms_err_nomem(err);
			goto out;
		}
	for (uint64_t o0 = 0; o0 < out; o0 += tile) {
		uint64_t o1 = o0 + tile < out ? o0 + tile : out;

		/* blocks a cache line apart from a multiple of 4 KiB: stores
		 * 4 KiB apart would all fall in one set of the L1 cache */
		uint64_t blk = (o1 - o0) * r * es, stride = (blk + 63) / 64 * 64 + 64;

		if (stride * n <= CHUNK) {
			scatter_b(buf, holder, o0, o1, r, n, es, stride);
			for (uint32_t pos = 0; pos < n; pos++) {
				if (!c[pos])
					continue;
				if ((rc = ms_sha256_update(c[pos], buf + pos * stride, blk)) != MS_OK) {
					rc = shard_sha_fail(rc, err);
					goto out;
				}
			}
			continue;
		}
		for (uint32_t pos = 0; pos < n; pos++) {
			size_t used = 0;

			if (!c[pos])
				continue;
			for (uint64_t o = o0; o < o1; o++) {
				const uint8_t *p = holder + o * row + (uint64_t)pos * es;

				for (uint64_t k = 0; k < r;) {
					uint64_t m = (CHUNK - used) / es;

					if (m > r - k)
						m = r - k;
					if (!m) {
						if ((rc = ms_sha256_update(c[pos], buf, used)) != MS_OK) {
							rc = shard_sha_fail(rc, err);
							goto out;
						}
						used = 0;
						continue;
					}
					shard_gather(buf + used, p, m, (size_t)n * es, es);
					p += m * n * es;
					k += m;
					used += (size_t)(m * es);
				}
			}
			if (used && (rc = ms_sha256_update(c[pos], buf, used)) != MS_OK) {
				rc = shard_sha_fail(rc, err);
				goto out;
			}
		}
	}
	for (uint32_t pos = 0; pos < n; pos++)
		if (c[pos] && (rc = ms_sha256_final(c[pos], dst[pos])) != MS_OK) {
			rc = shard_sha_fail(rc, err);
			goto out;
		}
out:
	for (uint32_t pos = 0; pos < n; pos++)
		ms_sha256_free(c[pos]);
	ms_free(c);
	return rc;
}

static void prefault(const uint8_t *p, uint64_t n)
{
	/* advice only: a kernel without MADV_POPULATE_READ faults as it goes */
#ifdef MADV_POPULATE_READ
	if (madvise((void *)p, (size_t)n, MADV_POPULATE_READ) == 0)
		return;
#endif
	madvise((void *)p, (size_t)n, MADV_WILLNEED);
}

static int run_job(struct pool *p, const struct job *j, uint8_t *buf, struct ms_err *err)
{
	struct ms_st_writer *w = NULL;
	int rc;

	switch (j->kind) {
	case JOB_PREFAULT:
		prefault(j->data, j->n);
		return MS_OK;
	case JOB_HASH:
		if ((rc = ms_sha256(j->data, (size_t)j->n, j->digest)) != MS_OK)
			return shard_sha_fail(rc, err);
		return MS_OK;
	case JOB_HASH_B:
		return hash_b(j->t, j->data, j->en, j->dst, buf, err);
	case JOB_FILE:
		break;
	}
	rc = shard_out_stream(p->s, &p->os[j->file], buf, &w, err);
	if (rc == MS_OK)
		rc = shard_out_commit(p->s, &p->os[j->file], w, &p->files[j->file], err);
	ms_st_writer_free(w);
	if (rc == MS_OK && p->o && p->o->progress) {
		pthread_mutex_lock(&p->lock);
		p->o->progress(p->o->progress_ctx, p->files[j->file].path, ++p->done, p->nfiles);
		pthread_mutex_unlock(&p->lock);
	}
	return rc;
}

static int pool_job(struct ms_pool *mp, size_t i, uint8_t *buf, struct ms_err *err)
{
	struct pool *p = mp->ctx;

	return run_job(p, &p->jobs[i], buf, err);
}

/* Run p's jobs on nthreads threads (0: one per CPU, and one more when
 * there are files to write), the caller being one of them. The first
 * failure stops the rest and is returned. */
int shard_pool_run(struct pool *p, int nthreads, struct ms_err *err)
{
	struct ms_pool mp = { .njobs = p->njobs, .scratch = CHUNK, .run = pool_job, .ctx = p };
	int rc;

	mp.nthreads = nthreads > 0 ? nthreads : ms_ncpus() + (p->nfiles ? 1 : 0);
	if (mp.nthreads > 64)
		mp.nthreads = 64;
	p->done = 0;
	pthread_mutex_init(&p->lock, NULL);
	rc = ms_pool_run(&mp, err);
	pthread_mutex_destroy(&p->lock);
	return rc;
}

void shard_jobs_release(struct jobs *j)
{
	for (size_t i = 0; i < j->ndsts; i++)
		ms_free(j->dsts[i]);
	ms_free(j->dsts);
	ms_free(j->v);
	memset(j, 0, sizeof(*j));
}

struct job *shard_jobs_add(struct jobs *j, enum job_kind kind)
{
	if (j->n == j->cap) {
		size_t nc = j->cap ? 2 * j->cap : 64;
		struct job *nv = ms_realloc(j->v, nc * sizeof(*nv));

		if (!nv)
			return NULL;
		j->v = nv;
		j->cap = nc;
	}
	memset(&j->v[j->n], 0, sizeof(j->v[0]));
	j->v[j->n].kind = kind;
	return &j->v[j->n++];
}

/* Largest first among [from, n): one huge tensor must not start last. */
static int cmp_job_size(const void *a, const void *b)
{
	const struct job *x = a, *y = b;
	uint64_t nx = x->kind == JOB_HASH_B ? x->t->nbytes : x->n;
	uint64_t ny = y->kind == JOB_HASH_B ? y->t->nbytes : y->n;

	return nx < ny ? 1 : nx > ny ? -1 : 0;
}

void shard_jobs_sort(struct jobs *j, size_t from)
{
	if (j->n > from)
		qsort(j->v + from, j->n - from, sizeof(*j->v), cmp_job_size);
}

/* ---- canonical expert digests --------------------------------------------- */

struct holder {
	const uint8_t *data;
	size_t job;
};

static int cmp_holder(const void *a, const void *b)
{
	const struct holder *x = a, *y = b;

	return x->data < y->data ? -1 : x->data > y->data;
}

/*
 * Jobs computing the canonical digest (rec->got) of every expert slice
 * whose bytes are present: slices of A and of grouped tensors are hashed
 * in place, B's are regrouped tile by tile (hash_b), one job per tensor
 * holding experts. A per-expert tensor's canonical digest is its tensor
 * digest, taken from its file tensor by shard_rec_finish once that is hashed.
 * The records' has_got is set here: their digests are valid once the jobs
 * ran.
 */
int shard_rec_jobs(struct src *s, struct jobs *jl, struct ms_err *err)
{
	size_t *base = ms_calloc(s->n ? s->n : 1, sizeof(*base));
	struct srec **rec_of = ms_calloc(s->nrec ? s->nrec : 1, sizeof(*rec_of));
	struct holder *h = ms_calloc(s->E ? s->E : 1, sizeof(*h));
	size_t k = 0;
	int rc = MS_OK;

	if (!base || !rec_of || !h) {
		rc = ms_err_nomem(err);
		goto out;
	}
	/* record of (tensor i, expert e): rec_of[base[i] + e] */
	for (size_t i = 0; i < s->n; i++) {
		base[i] = k;
		k += s->t[i].kind == TK_EXPERT ? 1 : shard_is_sliced(s->t[i].kind) ? s->E : 0;
	}
	for (size_t i = 0; i < s->nrec; i++) {
		const struct stensor *t = &s->t[s->rec[i].tensor];

		rec_of[base[s->rec[i].tensor] + (t->kind == TK_EXPERT ? 0 : s->rec[i].expert)] =
			&s->rec[i];
	}
	for (size_t i = 0; i < s->n; i++) {
		const struct stensor *t = &s->t[i];
		size_t nh = 0;

		if (t->kind == TK_FUSED_A || t->kind == TK_GROUPED) {
			uint64_t sl = shard_slice_bytes(t, s->E);

			for (uint32_t e = 0; e < s->E; e++) {
				struct srec *r = rec_of[base[i] + e];
				struct job *j;

				if (!t->edata[e])
					continue;
				if (!(j = shard_jobs_add(jl, JOB_HASH))) {
					rc = ms_err_nomem(err);
					goto out;
				}
				j->data = t->edata[e] + (uint64_t)t->epos[e] * sl;
				j->n = sl;
				j->digest = r->got;
				r->has_got = 1;
			}
			continue;
		}
		if (t->kind != TK_FUSED_B)
			continue;
		/* one job per holder: the expert at its position 0 opens it */
		for (uint32_t e = 0; e < s->E; e++) {
			uint8_t ***nd;
			struct job *j;

			if (!t->edata[e] || t->epos[e] != 0)
				continue;
			nd = ms_realloc(jl->dsts, (jl->ndsts + 1) * sizeof(*nd));
			if (!nd) {
				rc = ms_err_nomem(err);
				goto out;
			}
			jl->dsts = nd;
			if (!(nd[jl->ndsts] = ms_calloc(t->en[e] ? t->en[e] : 1, sizeof(uint8_t *)))) {
				rc = ms_err_nomem(err);
				goto out;
			}
			jl->ndsts++;
			if (!(j = shard_jobs_add(jl, JOB_HASH_B))) {
				rc = ms_err_nomem(err);
				goto out;
			}
			j->t = t;
			j->data = t->edata[e];
			j->en = t->en[e];
			j->dst = nd[jl->ndsts - 1];
			h[nh].data = t->edata[e];
			h[nh++].job = jl->n - 1;
		}
		qsort(h, nh, sizeof(*h), cmp_holder);
		for (uint32_t g = 0; g < s->E; g++) {
			struct srec *r = rec_of[base[i] + g];
			size_t lo = 0, hi = nh;

			if (!t->edata[g])
				continue;
			while (lo < hi) {
				size_t mid = lo + (hi - lo) / 2;

				if (h[mid].data < t->edata[g])
					lo = mid + 1;
				else
					hi = mid;
			}
			/* a holder without an expert at position 0 (or a
			 * position past its count) is not one sset_point or
			 * shard_src_point_whole make */
			if (lo == nh || h[lo].data != t->edata[g] || t->epos[g] >= jl->v[h[lo].job].en) {
				rc = ms_err_set(err, MS_EINVAL, "tensor '%s': expert %u is not in the "
						"tensor that should hold it", t->name, g);
				goto out;
			}
			jl->v[h[lo].job].dst[t->epos[g]] = r->got;
			r->has_got = 1;
		}
	}
out:
	ms_free(base);
	ms_free(rec_of);
	ms_free(h);
	return rc;
}

/* After the jobs of shard_rec_jobs (and the hashing of the file tensors) ran:
 * per-expert records take their file tensor's digest. */
void shard_rec_finish(struct src *s)
{
	for (size_t i = 0; i < s->nrec; i++) {
		struct srec *r = &s->rec[i];
		const struct stensor *t = &s->t[r->tensor];

		if (t->kind == TK_EXPERT && t->st && t->st->has_digest) {
			memcpy(r->got, t->st->digest, MS_SHA256_LEN);
			r->has_got = 1;
		}
	}
}

/* Canonical digests of every expert slice whose bytes are present (the
 * file tensors already hashed). */
int shard_hash_records(struct src *s, int nthreads, struct ms_err *err)
{
	struct jobs jl = { 0 };
	struct pool p = { 0 };
	int rc;

	if ((rc = shard_rec_jobs(s, &jl, err)) == MS_OK) {
		shard_jobs_sort(&jl, 0);
		p.jobs = jl.v;
		p.njobs = jl.n;
		rc = shard_pool_run(&p, nthreads, err);
	}
	if (rc == MS_OK)
		shard_rec_finish(s);
	shard_jobs_release(&jl);
	return rc;
}
