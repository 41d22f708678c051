/*
 * vload.c: verified load (see vload.h): the chunked read + hash engine both
 * variants share, and the host variant.
 *
 * Why the destination is hashed and not the source: the digest must cover
 * the bytes the caller will use. Each chunk is read into its destination
 * (or the staging buffer the GPU copy reads from) and hashed there, while
 * it is still in the CPU's cache; nothing writes that memory between the
 * hash and its use. A file changed or truncated under us then shows as a
 * digest mismatch or an I/O error, never as unchecked bytes in use.
 */
#include "vload.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hash.h"

/* Big enough that the per-chunk overhead vanishes, small enough that a
 * chunk is still in the core's cache when it is hashed. */
#define HOST_CHUNK (1u << 20)

void (*ms_vload_test_hook)(enum ms_vload_hook_where where, void *p, uint64_t len,
			   size_t item);

/* A piece of work: a whole item, or one span of a use_tree item. */
struct unit {
	size_t item;
	uint64_t off, len;
};

struct engine {
	struct ms_vload_item *items;
	size_t n;
	size_t *order;             /* item indices, largest first */
	struct unit *units;        /* in order: spans of an item together */
	size_t nunits;
	size_t next;               /* next position in units */
	uint8_t *chunks;           /* CPU chunk digests of tree items */
	uint64_t *coff;            /* item -> first chunk in chunks */
	int *left;                 /* item -> units not finished (atomic) */
	uint64_t chunk;
	const struct ms_vload_ops *ops;
	void *ctx;
	pthread_mutex_t lock;
	int failed;                /* under lock */
	int rc;
	struct ms_err err;
};

struct worker {
	struct engine *e;
	int id;
};

size_t ms_vload_units(const struct ms_vload_item *items, size_t n)
{
	size_t u = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t nb = items[i].tensor ? items[i].tensor->nbytes : 0;

		u += items[i].use_tree && nb ? (size_t)((nb - 1) / MS_VLOAD_SPAN + 1) : 1;
	}
	return u;
}

int ms_vload_threads(size_t n, int nthreads, int max)
{
	int t = nthreads > 0 ? nthreads : ms_ncpus();

	if (max > 0 && t > max)
		t = max;
	if ((size_t)t > n)
		t = (int)n;
	return t < 1 ? 1 : t;
}

static void fail(struct engine *e, int rc, const struct ms_err *err)
{
	pthread_mutex_lock(&e->lock);
	if (!e->failed) {
		e->failed = 1;
		e->rc = rc;
		e->err = *err;
	}
	pthread_mutex_unlock(&e->lock);
}

static int stopped(struct engine *e)
{
	int f;

	pthread_mutex_lock(&e->lock);
	f = e->failed;
	pthread_mutex_unlock(&e->lock);
	return f;
}

static int read_at(int fd, uint8_t *buf, uint64_t len, uint64_t off,
		   const struct ms_tensor *t, struct ms_err *err)
{
	while (len) {
		ssize_t r = pread(fd, buf, len > (1u << 30) ? (1u << 30) : len,
				  (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return ms_err_set(err, MS_EIO,
					  "tensor '%s' in '%s': read failed: %s",
					  t->name, t->file->path, strerror(errno));
		if (r == 0)
			return ms_err_set(err, MS_EIO,
					  "tensor '%s' in '%s': file ends at byte %llu, "
					  "before the tensor does (truncated?)",
					  t->name, t->file->path,
					  (unsigned long long)off);
		buf += r;
		off += (uint64_t)r;
		len -= (uint64_t)r;
	}
	return MS_OK;
}

static int mismatch(const struct ms_tensor *t, const char *what, const uint8_t *want,
		    const uint8_t *got, struct ms_err *err)
{
	char hexp[2 * MS_SHA256_LEN + 1], hgot[2 * MS_SHA256_LEN + 1];

	ms_hex(want, MS_SHA256_LEN, hexp);
	ms_hex(got, MS_SHA256_LEN, hgot);
	return ms_err_set(err, MS_ECHECK, "tensor '%s' in '%s': %s mismatch (expected %s, got %s)",
			  t->name, t->file ? t->file->path : "?", what, hexp, hgot);
}

int ms_vload_mismatch(const struct ms_tensor *t, const char *what, const uint8_t *want,
		      const uint8_t *got, struct ms_err *err)
{
	return mismatch(t, what, want, got, err);
}

/* The CPU's part of a tree item after its last span: fold the chunk
 * digests; check them (use_tree) or hand the tree out (want_tree). */
static int tree_done(struct engine *e, size_t idx, struct ms_err *err)
{
	struct ms_vload_item *it = &e->items[idx];
	uint8_t tree[MS_SHA256_LEN];
	int rc;

	if ((rc = ms_tree_fold(MS_TREE_LOG2, it->tensor->nbytes,
			       e->chunks + e->coff[idx] * MS_SHA256_LEN, tree)) != MS_OK)
		return ms_sha256_err(err, rc);
	if (it->use_tree)
		return memcmp(tree, it->expected_tree, MS_SHA256_LEN)
			       ? mismatch(it->tensor, "digest (tree)", it->expected_tree, tree, err)
			       : MS_OK;
	memcpy(it->got_tree, tree, MS_SHA256_LEN);
	it->has_got_tree = 1;
	return MS_OK;
}

static int load_one(struct engine *e, int w, const struct unit *u, struct ms_err *err)
{
	struct ms_vload_item *it = &e->items[u->item];
	const struct ms_tensor *t = it->tensor;
	struct ms_sha256_ctx *sha = NULL;
	uint8_t got[MS_SHA256_LEN];
	int plain = !it->use_tree;
	int cpu_tree = it->use_tree ? !e->ops->device_trees : it->want_tree;
	int fd = -1, rc = MS_OK;

	if (t->file && t->file->mapped) {
		fd = open(t->file->path, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			rc = ms_err_set(err, MS_EIO, "'%s': cannot open: %s",
					t->file->path, strerror(errno));
			goto out;
		}
	}
	if (plain && !(sha = ms_sha256_new())) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (uint64_t off = u->off; off < u->off + u->len; off += e->chunk) {
		uint64_t end = u->off + u->len, len = end - off < e->chunk ? end - off : e->chunk;
		uint8_t *buf = NULL;

		if (stopped(e))
			goto out; /* someone else failed: the result is theirs */
		if ((rc = e->ops->buffer(e->ctx, w, u->item, off, len, &buf, err)) != MS_OK)
			goto out;
		if (fd >= 0)
			rc = read_at(fd, buf, len, t->offset + off, t, err);
		else
			memcpy(buf, t->data + off, len);
		if (rc != MS_OK)
			goto out;
		if (ms_vload_test_hook)
			ms_vload_test_hook(MS_VLOAD_HOOK_STAGED, buf, len, u->item);
		if (plain && ms_sha256_update(sha, buf, len) != MS_OK) {
			rc = ms_err_set(err, MS_EIO, "sha256 failed");
			goto out;
		}
		/* the same buffer the plain digest read: one pass, same bytes */
		if (cpu_tree && (rc = ms_tree_chunks(buf, len, MS_TREE_LOG2,
						     e->chunks + (e->coff[u->item] +
								  (off >> MS_TREE_LOG2)) *
									 MS_SHA256_LEN)) != MS_OK) {
			ms_sha256_err(err, rc);
			goto out;
		}
		if ((rc = e->ops->done(e->ctx, w, u->item, off, len, buf, err)) != MS_OK)
			goto out;
	}
	if (e->ops->span_done &&
	    (rc = e->ops->span_done(e->ctx, w, u->item, u->off, u->len, err)) != MS_OK)
		goto out;
	if (plain) {
		if (ms_sha256_final(sha, got) != MS_OK) {
			rc = ms_err_set(err, MS_EIO, "sha256 failed");
			goto out;
		}
		if (memcmp(got, it->expected, MS_SHA256_LEN)) {
			rc = mismatch(t, "digest", it->expected, got, err);
			goto out;
		}
	}
	/* the worker that finishes an item's last span folds its tree */
	if (cpu_tree && __atomic_sub_fetch(&e->left[u->item], 1, __ATOMIC_ACQ_REL) == 0)
		rc = tree_done(e, u->item, err);
out:
	ms_sha256_free(sha);
	if (fd >= 0)
		close(fd);
	return rc;
}

static void *worker_main(void *arg)
{
	struct worker *wk = arg;
	struct engine *e = wk->e;
	struct ms_err err = {0};
	int rc;

	for (;;) {
		const struct unit *u;

		pthread_mutex_lock(&e->lock);
		if (e->failed || e->next == e->nunits) {
			pthread_mutex_unlock(&e->lock);
			break;
		}
		u = &e->units[e->next++];
		pthread_mutex_unlock(&e->lock);
		if ((rc = load_one(e, wk->id, u, &err)) != MS_OK) {
			fail(e, rc, &err);
			break;
		}
	}
	if (e->ops->finish && (rc = e->ops->finish(e->ctx, wk->id, &err)) != MS_OK)
		fail(e, rc, &err);
	return NULL;
}

static struct ms_vload_item *sort_base;

static int by_size_desc(const void *a, const void *b)
{
	uint64_t x = sort_base[*(const size_t *)a].tensor->nbytes;
	uint64_t y = sort_base[*(const size_t *)b].tensor->nbytes;

	if (x != y)
		return x < y ? 1 : -1;
	return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

int ms_vload_run(struct ms_vload_item *items, size_t n, int nthreads,
		 uint64_t chunk, const struct ms_vload_ops *ops, void *ctx,
		 struct ms_err *err)
{
	static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;
	struct engine e = {0};
	struct worker *wk = NULL;
	pthread_t *th = NULL;
	/* one tree item of many spans keeps every thread busy */
	int nt = ms_vload_threads(ms_vload_units(items, n), nthreads, 0), started = 0, rc;

	if (!n)
		return MS_OK;
	for (size_t i = 0; i < n; i++) {
		if (!items[i].tensor)
			return ms_err_set(err, MS_EINVAL, "item %zu has no tensor", i);
	}
	e.items = items;
	e.n = n;
	e.chunk = chunk ? chunk : HOST_CHUNK;
	e.ops = ops;
	e.ctx = ctx;
	if (e.chunk % ((uint64_t)1 << MS_TREE_LOG2) || MS_VLOAD_SPAN % e.chunk)
		return ms_err_set(err, MS_EINVAL, "chunk size %llu does not divide the span",
				  (unsigned long long)e.chunk);
	e.order = ms_malloc(n * sizeof(*e.order));
	e.coff = ms_calloc(n, sizeof(*e.coff));
	e.left = ms_calloc(n, sizeof(*e.left));
	wk = ms_calloc((size_t)nt, sizeof(*wk));
	th = ms_calloc((size_t)nt, sizeof(*th));
	if (!e.order || !e.coff || !e.left || !wk || !th) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		e.order[i] = i;
	/* qsort has no context argument; the sort itself is cheap */
	pthread_mutex_lock(&sort_lock);
	sort_base = items;
	qsort(e.order, n, sizeof(*e.order), by_size_desc);
	pthread_mutex_unlock(&sort_lock);
	/* units: a use_tree item in spans every worker shares, others whole;
	 * CPU chunk digests for the trees the CPU computes */
	{
		uint64_t nunits = 0, nchunks = 0;

		for (size_t i = 0; i < n; i++) {
			const struct ms_vload_item *it = &items[i];
			uint64_t nb = it->tensor->nbytes;
			uint64_t k = it->use_tree && nb ? (nb - 1) / MS_VLOAD_SPAN + 1 : 1;

			nunits += k;
			if (it->use_tree ? !ops->device_trees : it->want_tree) {
				e.coff[i] = nchunks;
				nchunks += ms_tree_nchunks(nb, MS_TREE_LOG2);
				e.left[i] = (int)k;
			}
		}
		if (nchunks > SIZE_MAX / MS_SHA256_LEN || nunits > SIZE_MAX / sizeof(*e.units)) {
			rc = ms_err_set(err, MS_EINVAL, "tensors too large to load together");
			goto out;
		}
		e.units = ms_malloc((size_t)nunits * sizeof(*e.units));
		e.chunks = ms_malloc(nchunks ? (size_t)nchunks * MS_SHA256_LEN : 1);
		if (!e.units || !e.chunks) {
			rc = ms_err_nomem(err);
			goto out;
		}
		for (size_t k = 0; k < n; k++) {
			size_t i = e.order[k];
			uint64_t nb = items[i].tensor->nbytes, off = 0;

			do {
				uint64_t len = items[i].use_tree && nb - off > MS_VLOAD_SPAN
						       ? MS_VLOAD_SPAN : nb - off;

				e.units[e.nunits].item = i;
				e.units[e.nunits].off = off;
				e.units[e.nunits++].len = len;
				off += len;
			} while (off < nb);
		}
	}
	pthread_mutex_init(&e.lock, NULL);
	for (int i = 0; i < nt; i++) {
		wk[i].e = &e;
		wk[i].id = i;
	}
	/* the calling thread is worker 0 */
	for (int i = 1; i < nt; i++) {
		if (pthread_create(&th[i], NULL, worker_main, &wk[i])) {
			struct ms_err ce = {0};

			ms_err_set(&ce, MS_EIO, "cannot start a thread");
			fail(&e, MS_EIO, &ce);
			break;
		}
		started = i;
	}
	worker_main(&wk[0]);
	for (int i = 1; i <= started; i++)
		pthread_join(th[i], NULL);
	/* workers that never started still own state the caller set up */
	for (int i = started + 1; i < nt; i++) {
		struct ms_err fe = {0};

		if (ops->finish)
			ops->finish(ctx, i, &fe);
	}
	pthread_mutex_destroy(&e.lock);
	rc = e.failed ? e.rc : MS_OK;
	if (rc != MS_OK && err)
		*err = e.err;
out:
	ms_free(e.order);
	ms_free(e.units);
	ms_free(e.chunks);
	ms_free(e.coff);
	ms_free(e.left);
	ms_free(wk);
	ms_free(th);
	return rc;
}

int ms_vload_tree_recs(const struct ms_vload_item *items, size_t n, struct ms_tree_rec **out,
		       size_t *nout, struct ms_err *err)
{
	size_t k = 0;

	*out = NULL;
	*nout = 0;
	for (size_t i = 0; i < n; i++)
		k += items[i].has_got_tree && items[i].tensor;
	if (!k)
		return MS_OK;
	if (!(*out = ms_calloc(k, sizeof(**out))))
		return ms_err_nomem(err);
	for (size_t i = 0; i < n; i++) {
		struct ms_tree_rec *r = &(*out)[*nout];

		if (!items[i].has_got_tree || !items[i].tensor)
			continue;
		memcpy(r->digest, items[i].expected, MS_SHA256_LEN);
		memcpy(r->tree, items[i].got_tree, MS_SHA256_LEN);
		r->nbytes = items[i].tensor->nbytes;
		r->log2 = MS_TREE_LOG2;
		(*nout)++;
	}
	return MS_OK;
}

/* ---- host variant --------------------------------------------------------- */

static int host_buffer(void *ctx, int worker, size_t item, uint64_t off,
		       uint64_t len, uint8_t **buf, struct ms_err *err)
{
	struct ms_vload_item *items = ctx;

	*buf = (uint8_t *)items[item].dst + off;
	return MS_OK;
}

static int host_done(void *ctx, int worker, size_t item, uint64_t off,
		     uint64_t len, uint8_t *buf, struct ms_err *err)
{
	return MS_OK;
}

int ms_load_verified(struct ms_vload_item *items, size_t n, int nthreads,
		     struct ms_err *err)
{
	static const struct ms_vload_ops ops = {host_buffer, host_done, NULL, NULL, 0};
	int rc;

	for (size_t i = 0; i < n; i++) {
		items[i].has_got_tree = 0;
		if (items[i].tensor && items[i].tensor->nbytes && !items[i].dst)
			return ms_err_set(err, MS_EINVAL,
					  "tensor '%s': no destination",
					  items[i].tensor->name);
	}
	rc = ms_vload_run(items, n, nthreads, HOST_CHUNK, &ops, items, err);
	if (rc != MS_OK) {
		for (size_t i = 0; i < n; i++) {
			if (items[i].tensor && items[i].dst)
				memset(items[i].dst, 0, items[i].tensor->nbytes);
			items[i].has_got_tree = 0;
		}
	}
	return rc;
}
