/*
 * hash.c: SHA-256 through OpenSSL EVP, a pool that hashes many tensors
 * in parallel, largest first, and the chunk-tree digest (hash.h) computed
 * by that pool: the chunks of one tensor spread over every core.
 *
 * Only the EVP interface is used: the deprecated SHA256_* calls bypass the
 * provider dispatch that selects the CPU's SHA extensions.
 */
#include "hash.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "pool.h"

struct ms_sha256_ctx {
	EVP_MD_CTX *md;
};

/* Fetch the implementation once; EVP_sha256() would look it up per call. */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void)
{
	sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *md(void)
{
	pthread_once(&sha256_once, sha256_fetch);
	return sha256_md ? sha256_md : EVP_sha256();
}

struct ms_sha256_ctx *ms_sha256_new(void)
{
	struct ms_sha256_ctx *c = ms_malloc(sizeof(*c));

	if (!c)
		return NULL;
	c->md = EVP_MD_CTX_new();
	if (!c->md || EVP_DigestInit_ex(c->md, md(), NULL) != 1) {
		EVP_MD_CTX_free(c->md);
		ms_free(c);
		return NULL;
	}
	return c;
}

int ms_sha256_update(struct ms_sha256_ctx *c, const void *p, size_t n)
{
	return EVP_DigestUpdate(c->md, p, n) == 1 ? MS_OK : MS_EIO;
}

int ms_sha256_final(struct ms_sha256_ctx *c, uint8_t out[MS_SHA256_LEN])
{
	unsigned len = 0;

	return EVP_DigestFinal_ex(c->md, out, &len) == 1 && len == MS_SHA256_LEN ? MS_OK
										  : MS_EIO;
}

int ms_sha256_reset(struct ms_sha256_ctx *c)
{
	return EVP_DigestInit_ex(c->md, md(), NULL) == 1 ? MS_OK : MS_EIO;
}

void ms_sha256_free(struct ms_sha256_ctx *c)
{
	if (!c)
		return;
	EVP_MD_CTX_free(c->md);
	ms_free(c);
}

int ms_sha256(const void *p, size_t n, uint8_t out[MS_SHA256_LEN])
{
	struct ms_sha256_ctx *c = ms_sha256_new();
	int rc;

	if (!c)
		return MS_ENOMEM;
	rc = ms_sha256_update(c, p, n);
	if (rc == MS_OK)
		rc = ms_sha256_final(c, out);
	ms_sha256_free(c);
	return rc;
}

int ms_sha256_err(struct ms_err *err, int rc)
{
	return ms_err_set(err, rc, rc == MS_ENOMEM ? "out of memory" : "sha256 failed");
}

int ms_sha256_file(const char *path, uint8_t out[MS_SHA256_LEN], struct ms_err *err)
{
	struct ms_sha256_ctx *c = NULL;
	size_t bufsz = 1 << 20;
	uint8_t *buf = NULL;
	int fd, rc = MS_OK;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ms_err_set(err, errno == ENOENT ? MS_ENOTFOUND : MS_EIO,
				  "'%s': cannot open: %s", path, strerror(errno));
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	buf = ms_malloc(bufsz);
	c = ms_sha256_new();
	if (!buf || !c) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (;;) {
		ssize_t r = read(fd, buf, bufsz);

		if ((rc = ms_interrupt_check(err)) != MS_OK)
			goto out;
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 || ms_fault("read")) {
			rc = ms_err_set(err, MS_EIO, "'%s': read failed: %s", path,
					strerror(r < 0 ? errno : EIO));
			goto out;
		}
		if (r == 0)
			break;
		if ((rc = ms_sha256_update(c, buf, (size_t)r)) != MS_OK) {
			ms_err_set(err, rc, "'%s': sha256 failed", path);
			goto out;
		}
	}
	if ((rc = ms_sha256_final(c, out)) != MS_OK)
		ms_err_set(err, rc, "'%s': sha256 failed", path);
out:
	ms_sha256_free(c);
	ms_free(buf);
	close(fd);
	return rc;
}

/* ---- chunk-tree digests ------------------------------------------------ */

uint64_t ms_tree_nchunks(uint64_t n, unsigned log2)
{
	return n ? ((n - 1) >> log2) + 1 : 0;
}

void ms_tree_prefix(unsigned log2, uint64_t n, uint8_t out[MS_TREE_PREFIX_LEN])
{
	memcpy(out, MS_TREE_TAG, MS_TREE_TAG_LEN);
	out[MS_TREE_TAG_LEN] = (uint8_t)log2;
	for (int i = 0; i < 8; i++)
		out[MS_TREE_TAG_LEN + 1 + i] = (uint8_t)(n >> (8 * i));
}

int ms_tree_fold(unsigned log2, uint64_t n, const uint8_t *chunks, uint8_t out[MS_SHA256_LEN])
{
	uint8_t pre[MS_TREE_PREFIX_LEN];
	struct ms_sha256_ctx *c = ms_sha256_new();
	int rc;

	if (!c)
		return MS_ENOMEM;
	ms_tree_prefix(log2, n, pre);
	rc = ms_sha256_update(c, pre, sizeof(pre));
	if (rc == MS_OK && n)
		rc = ms_sha256_update(c, chunks, (size_t)ms_tree_nchunks(n, log2) * MS_SHA256_LEN);
	if (rc == MS_OK)
		rc = ms_sha256_final(c, out);
	ms_sha256_free(c);
	return rc;
}

/* The SHA-256 of each 2^log2 chunk of p[0, n) into out, one context reused. */
static int hash_chunks(const uint8_t *p, uint64_t n, unsigned log2, uint8_t *out)
{
	struct ms_sha256_ctx *c = ms_sha256_new();
	uint64_t size = (uint64_t)1 << log2;
	int rc = MS_OK;

	if (!c)
		return MS_ENOMEM;
	for (uint64_t off = 0; rc == MS_OK && off < n; off += size) {
		uint64_t len = n - off < size ? n - off : size;

		if (off)
			rc = ms_sha256_reset(c);
		if (rc == MS_OK)
			rc = ms_sha256_update(c, p + off, (size_t)len);
		if (rc == MS_OK)
			rc = ms_sha256_final(c, out + (off >> log2) * MS_SHA256_LEN);
	}
	ms_sha256_free(c);
	return rc;
}

int ms_tree_chunks(const void *p, uint64_t n, unsigned log2, uint8_t *out)
{
	return hash_chunks(p, n, log2, out);
}

/* Bytes copied at a time in a same-pass job: a piece stays in the core's
 * cache while both digests read it. */
#define PIECE (64u << 10)

/* Plain digest (when wanted) and tree digest of one buffer in one pass.
 * Each piece is copied once into a private buffer and both digests read
 * that copy: the source may be a shared mapping another process writes, and
 * the two digests must be of the same bytes for the tree to stand in for
 * the plain digest later. The fold streams, so no chunk list is kept. */
static int hash_same_pass(const struct ms_hash_job *j, unsigned log2)
{
	struct ms_sha256_ctx *plain = NULL, *chunk = NULL, *fold = NULL;
	uint64_t size = (uint64_t)1 << log2;
	uint8_t pre[MS_TREE_PREFIX_LEN], d[MS_SHA256_LEN];
	uint8_t *buf = ms_malloc(PIECE);
	int rc = MS_OK;

	plain = j->digest ? ms_sha256_new() : NULL;
	chunk = ms_sha256_new();
	fold = ms_sha256_new();
	if (!buf || (j->digest && !plain) || !chunk || !fold) {
		rc = MS_ENOMEM;
		goto out;
	}
	ms_tree_prefix(log2, j->n, pre);
	rc = ms_sha256_update(fold, pre, sizeof(pre));
	for (uint64_t off = 0; rc == MS_OK && off < j->n;) {
		uint64_t end = j->n - off < size ? j->n : off + size;

		/* one chunk, in pieces */
		while (rc == MS_OK && off < end) {
			size_t len = end - off < PIECE ? (size_t)(end - off) : PIECE;

			memcpy(buf, j->data + off, len);
			if (plain)
				rc = ms_sha256_update(plain, buf, len);
			if (rc == MS_OK)
				rc = ms_sha256_update(chunk, buf, len);
			off += len;
		}
		if (rc == MS_OK)
			rc = ms_sha256_final(chunk, d);
		if (rc == MS_OK)
			rc = ms_sha256_update(fold, d, sizeof(d));
		if (rc == MS_OK)
			rc = ms_sha256_reset(chunk);
	}
	if (rc == MS_OK && plain)
		rc = ms_sha256_final(plain, j->digest);
	if (rc == MS_OK)
		rc = ms_sha256_final(fold, j->tree);
out:
	ms_sha256_free(plain);
	ms_sha256_free(chunk);
	ms_sha256_free(fold);
	ms_free(buf);
	return rc;
}

/* What the pool's jobs share (ms_pool.ctx). */
struct hashing {
	struct ms_hash_job **order;   /* largest first */
	uint64_t done;                /* bytes hashed (atomic) */
	uint64_t total;
	const struct ms_progress *progress;
};

/* A plain digest, in pieces, so that a multi-GB tensor shows progress
 * and an interrupted hash stops within one piece (MS_EINTR). */
#define HASH_PIECE (64u << 20)

static int hash_plain(struct hashing *p, struct ms_hash_job *j)
{
	struct ms_sha256_ctx *c;
	uint64_t off = 0;
	int rc = MS_OK;

	if (!(c = ms_sha256_new()))
		return MS_ENOMEM;
	while (rc == MS_OK && off < j->n) {
		uint64_t k = j->n - off < HASH_PIECE ? j->n - off : HASH_PIECE;

		if (ms_interrupted())
			rc = MS_EINTR;
		else
			rc = ms_sha256_update(c, j->data + off, (size_t)k);
		off += k;
		__atomic_add_fetch(&p->done, k, __ATOMIC_RELAXED);
	}
	if (rc == MS_OK)
		rc = ms_sha256_final(c, j->digest);
	ms_sha256_free(c);
	return rc;
}

/* One job: plain and tree digests in the same pass, or the plain digest
 * and/or the chunk digests of a span. */
static int hash_job(struct hashing *p, struct ms_hash_job *j)
{
	unsigned log2 = j->log2 ? j->log2 : MS_TREE_LOG2;
	int rc = MS_OK;

	if (ms_interrupted())
		return MS_EINTR;
	if (j->tree) {
		rc = hash_same_pass(j, log2);
		__atomic_add_fetch(&p->done, j->n, __ATOMIC_RELAXED);
		return rc;
	}
	if (j->digest)
		rc = hash_plain(p, j);
	if (rc == MS_OK && j->chunks)
		rc = hash_chunks(j->data, j->n, log2, j->chunks);
	if (!j->digest)
		__atomic_add_fetch(&p->done, j->n, __ATOMIC_RELAXED);
	return rc;
}

static int pool_job(struct ms_pool *pool, size_t i, uint8_t *scratch, struct ms_err *err)
{
	struct hashing *h = pool->ctx;

	return hash_job(h, h->order[i]);
}

static void pool_report(struct ms_pool *pool)
{
	struct hashing *h = pool->ctx;

	h->progress->fn(h->progress->arg, __atomic_load_n(&h->done, __ATOMIC_RELAXED), h->total);
}

static int by_size_desc(const void *a, const void *b)
{
	const struct ms_hash_job *x = *(const struct ms_hash_job *const *)a;
	const struct ms_hash_job *y = *(const struct ms_hash_job *const *)b;

	return x->n < y->n ? 1 : x->n > y->n ? -1 : 0;
}

int ms_hash_run(struct ms_hash_job *jobs, size_t n, int nthreads, struct ms_err *err)
{
	return ms_hash_run_progress(jobs, n, nthreads, NULL, err);
}

int ms_hash_run_progress(struct ms_hash_job *jobs, size_t n, int nthreads,
			 const struct ms_progress *progress, struct ms_err *err)
{
	struct hashing h = { .progress = progress };
	struct ms_pool pool = { .njobs = n, .nthreads = nthreads, .run = pool_job, .ctx = &h };
	int rc = MS_OK;

	if (progress && progress->fn)
		pool.report = pool_report;
	h.order = ms_malloc((n ? n : 1) * sizeof(*h.order));
	if (!h.order) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		h.order[i] = &jobs[i];
		h.total += jobs[i].n;
	}
	qsort(h.order, n, sizeof(*h.order), by_size_desc);
	rc = ms_pool_run(&pool, err);
	/* the jobs set no message: a context that could not be made is (in
	 * practice) memory */
	if (rc == MS_EINTR)
		rc = ms_interrupt_check(err);
	else if (rc != MS_OK)
		rc = ms_sha256_err(err, rc);
out:
	ms_free(h.order);
	return rc;
}

/* Bytes of one pool job of a parallel tree: many chunks, so the pool's
 * per-job lock is noise, and enough jobs to keep 16 cores busy on a 64 MiB
 * tensor. */
#define TREE_SPAN (4u << 20)

int ms_tree_digest(const void *p, uint64_t n, unsigned log2, int nthreads,
		   uint8_t out[MS_SHA256_LEN], struct ms_err *err)
{
	struct ms_hash_job *jobs = NULL;
	uint8_t *chunks = NULL;
	uint64_t span, nchunks, njobs;
	int rc;

	if (log2 < MS_TREE_LOG2_MIN || log2 > MS_TREE_LOG2_MAX)
		return ms_err_set(err, MS_EINVAL, "tree chunk size 2^%u out of range (2^%d..2^%d)",
				  log2, MS_TREE_LOG2_MIN, MS_TREE_LOG2_MAX);
	span = TREE_SPAN > ((uint64_t)1 << log2) ? TREE_SPAN : (uint64_t)1 << log2;
	nchunks = ms_tree_nchunks(n, log2);
	njobs = n ? (n - 1) / span + 1 : 0;
	if (nchunks > SIZE_MAX / MS_SHA256_LEN)
		return ms_err_set(err, MS_EINVAL, "tensor too large for a tree digest");
	chunks = ms_malloc(nchunks ? (size_t)nchunks * MS_SHA256_LEN : 1);
	jobs = ms_calloc(njobs ? (size_t)njobs : 1, sizeof(*jobs));
	if (!chunks || !jobs) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (uint64_t i = 0; i < njobs; i++) {
		uint64_t off = i * span;

		jobs[i].data = (const uint8_t *)p + off;
		jobs[i].n = n - off < span ? n - off : span;
		jobs[i].chunks = chunks + (off >> log2) * MS_SHA256_LEN;
		jobs[i].log2 = log2;
	}
	if ((rc = ms_hash_run(jobs, (size_t)njobs, nthreads, err)) != MS_OK)
		goto out;
	if ((rc = ms_tree_fold(log2, n, chunks, out)) != MS_OK)
		ms_sha256_err(err, rc);
out:
	ms_free(chunks);
	ms_free(jobs);
	return rc;
}
