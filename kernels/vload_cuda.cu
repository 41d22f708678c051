/*
 * vload_cuda.cu: ms_load_verified_gpu (vload.h): the verified-load engine of
 * vload.c with a sink that stages chunks through pinned memory to the GPU.
 *
 * Each worker owns a copy stream, a hash stream, two pinned chunk buffers
 * and an event per buffer. For chunk i it waits until the copy that last
 * read buffer i % 2 is done, reads the file bytes into it, and queues the
 * copy to the device. The buffer is not written again until its copy
 * completed.
 *
 * Plain items (no recorded tree): the CPU hashes chunk i in the pinned
 * buffer while the DMA engine moves chunk i - 1, so the device receives
 * exactly the bytes that were hashed. With want_tree the CPU also takes the
 * tree of those bytes, and the device copy is hashed by the GPU too: the
 * two trees must agree, so a tree handed out for recording is one of the
 * bytes in HBM and of the bytes whose plain digest matched.
 *
 * Tree items (use_tree): the CPU does not hash. When a span (MS_VLOAD_SPAN)
 * of one is in device memory, the worker's hash stream waits for its copy
 * and runs the chunk kernel (kernels/sha256_tree.cu) on it, while the copy
 * stream goes on with the next span. Shorter spans (small tensors, the end
 * of a large one) are hashed in one batched launch after the last copy:
 * one thread per chunk takes as long on a 64 KiB tensor as on a full span,
 * so a kernel each would queue up behind a worker's fast small copies. At
 * the end the chunk digests come back (32 bytes per 64 KiB) and are folded
 * into each tensor's tree and compared with the recorded one. The device
 * memory is handed to the caller only after every digest matched.
 */
#include "gpu_internal.h"

#include <string.h>

/* per worker: small enough that a chunk is still in the core's cache when it
 * is hashed, large enough for the DMA engine */
#define GPU_CHUNK (1u << 20)
#define MAX_WORKERS 16

struct gpu_worker {
	cudaStream_t stream;       /* copies */
	cudaStream_t hstream;      /* chunk kernels */
	cudaEvent_t ev[2];
	cudaEvent_t span_ev;       /* a span's copies are done */
	uint8_t *pin[2];
	unsigned slot;
};

struct gpu_sink {
	struct gpu_worker *w;
	struct ms_vload_item *items;
	uint8_t *base;
	uint64_t *offs;
	uint64_t *coff;            /* item -> first chunk digest; UINT64_MAX: none */
	uint8_t *dchunks;          /* device chunk digests */
};

static int hashed_on_device(const struct ms_vload_item *it)
{
	return it->use_tree || it->want_tree;
}

static int gpu_buffer(void *ctx, int worker, size_t item, uint64_t off,
		      uint64_t len, uint8_t **buf, struct ms_err *err)
{
	struct gpu_worker *w = &((struct gpu_sink *)ctx)->w[worker];
	int rc = MS_OK;

	CK(cudaEventSynchronize(w->ev[w->slot]));
	*buf = w->pin[w->slot];
out:
	return rc;
}

static int gpu_done(void *ctx, int worker, size_t item, uint64_t off,
		    uint64_t len, uint8_t *buf, struct ms_err *err)
{
	struct gpu_sink *g = (struct gpu_sink *)ctx;
	struct gpu_worker *w = &g->w[worker];
	int rc = MS_OK;

	CK(cudaMemcpyAsync(g->base + g->offs[item] + off, buf, len,
			   cudaMemcpyHostToDevice, w->stream));
	CK(cudaEventRecord(w->ev[w->slot], w->stream));
	w->slot ^= 1;
out:
	return rc;
}

static int gpu_span_done(void *ctx, int worker, size_t item, uint64_t off, uint64_t len,
			 struct ms_err *err)
{
	struct gpu_sink *g = (struct gpu_sink *)ctx;
	struct gpu_worker *w = &g->w[worker];
	uint8_t *dev = g->base + g->offs[item] + off;
	int rc = MS_OK;

	if (!hashed_on_device(&g->items[item]))
		return MS_OK;
	if (ms_vload_test_hook) {
		CK(cudaStreamSynchronize(w->stream));
		ms_vload_test_hook(MS_VLOAD_HOOK_DEVICE, dev, len, item);
	}
	/* a short span (a small tensor, the end of a large one) waits for the
	 * batch after the last copy: its kernel would take as long as a full
	 * span's, and one stream's kernels run one after another */
	if (len < MS_VLOAD_SPAN)
		return MS_OK;
	/* the kernel waits for this span's copies only; the copy stream
	 * goes on with the next span meanwhile */
	CK(cudaEventRecord(w->span_ev, w->stream));
	CK(cudaStreamWaitEvent(w->hstream, w->span_ev, 0));
	rc = ms_gpu_tree_chunks(dev, len, MS_TREE_LOG2,
				g->dchunks + (g->coff[item] + (off >> MS_TREE_LOG2)) * MS_SHA256_LEN,
				w->hstream, err);
out:
	return rc;
}

static int gpu_finish(void *ctx, int worker, struct ms_err *err)
{
	struct gpu_worker *w = &((struct gpu_sink *)ctx)->w[worker];
	int rc = MS_OK;

	if (w->stream)
		CK(cudaStreamSynchronize(w->stream));
	if (w->hstream)
		CK(cudaStreamSynchronize(w->hstream));
out:
	return rc;
}

/* After every copy and kernel: fold the device's chunk digests of each
 * hashed item and compare (use_tree: with the recorded tree; want_tree:
 * with the CPU's tree of the bytes it sent). The first mismatch in list
 * order is the error. */
static int check_trees(struct gpu_sink *g, size_t n, uint64_t nchunks, struct ms_err *err)
{
	struct ms_gpu_tree_seg *segs = NULL;
	size_t nseg = 0;
	uint8_t *h = NULL;
	int rc = MS_OK;

	if (!nchunks)
		goto fold;
	/* the short spans gpu_span_done left, by the same rule, in one launch */
	segs = (struct ms_gpu_tree_seg *)ms_calloc(n ? n : 1, sizeof(*segs));
	if (!segs) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		const struct ms_vload_item *it = &g->items[i];
		uint64_t nb = it->tensor->nbytes;
		uint64_t off = it->use_tree ? nb - nb % MS_VLOAD_SPAN : 0;

		if (!hashed_on_device(it) || nb == off || nb - off >= MS_VLOAD_SPAN)
			continue;
		segs[nseg].data = g->base + g->offs[i] + off;
		segs[nseg].n = nb - off;
		segs[nseg++].out = g->dchunks + (g->coff[i] + (off >> MS_TREE_LOG2)) * MS_SHA256_LEN;
	}
	if ((rc = ms_gpu_tree_chunks_batch(segs, nseg, MS_TREE_LOG2, err)) != MS_OK)
		goto out;
	CK(cudaMallocHost((void **)&h, nchunks * MS_SHA256_LEN));
	CK(cudaMemcpy(h, g->dchunks, nchunks * MS_SHA256_LEN, cudaMemcpyDeviceToHost));
fold:
	for (size_t i = 0; i < n; i++) {
		struct ms_vload_item *it = &g->items[i];
		uint8_t tree[MS_SHA256_LEN];
		int frc;

		if (!hashed_on_device(it))
			continue;
		frc = ms_tree_fold(MS_TREE_LOG2, it->tensor->nbytes,
				   h ? h + g->coff[i] * MS_SHA256_LEN : NULL, tree);
		if (frc != MS_OK) {
			rc = ms_sha256_err(err, frc);
			goto out;
		}
		if (it->use_tree && memcmp(tree, it->expected_tree, MS_SHA256_LEN)) {
			rc = ms_vload_mismatch(it->tensor, "digest (tree, device copy)",
					       it->expected_tree, tree, err);
			goto out;
		}
		if (!it->use_tree && (!it->has_got_tree || memcmp(tree, it->got_tree, MS_SHA256_LEN))) {
			rc = ms_vload_mismatch(it->tensor, "digest (tree of the device copy against the bytes hashed)",
					       it->got_tree, tree, err);
			goto out;
		}
	}
out:
	cudaFreeHost(h);
	ms_free(segs);
	return rc;
}

extern "C" int ms_load_verified_gpu(struct ms_vload_item *items, size_t n,
				    int nthreads, void **arena, struct ms_err *err)
{
	static const struct ms_vload_ops ops = {gpu_buffer, gpu_done, gpu_finish, gpu_span_done, 1};
	struct gpu_sink g;
	uint64_t total = 0, nchunks = 0;
	int nt = 0, rc = MS_OK;

	memset(&g, 0, sizeof(g));
	*arena = NULL;
	for (size_t i = 0; i < n; i++) {
		items[i].dst = NULL;
		items[i].has_got_tree = 0;
	}
	if ((rc = ms_gpu_ready(err)) != MS_OK)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (!items[i].tensor)
			return ms_err_set(err, MS_EINVAL, "item %zu has no tensor", i);
	}
	nt = ms_vload_threads(ms_vload_units(items, n), nthreads, MAX_WORKERS);
	g.items = items;
	g.offs = (uint64_t *)ms_calloc(n ? n : 1, sizeof(*g.offs));
	g.coff = (uint64_t *)ms_calloc(n ? n : 1, sizeof(*g.coff));
	g.w = (struct gpu_worker *)ms_calloc((size_t)nt, sizeof(*g.w));
	if (!g.offs || !g.coff || !g.w) {
		rc = ms_err_set(err, MS_ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if (!items[i].tensor) {
			rc = ms_err_set(err, MS_EINVAL, "item %zu has no tensor", i);
			goto out;
		}
		g.offs[i] = total;
		if (ms_add_u64(total, (items[i].tensor->nbytes + 255) & ~(uint64_t)255, &total)) {
			rc = ms_err_set(err, MS_EINVAL, "tensors too large to load together");
			goto out;
		}
		g.coff[i] = UINT64_MAX;
		if (hashed_on_device(&items[i])) {
			g.coff[i] = nchunks;
			nchunks += ms_tree_nchunks(items[i].tensor->nbytes, MS_TREE_LOG2);
		}
	}
	CK(cudaMalloc((void **)&g.base, total ? total : 1));
	CK(cudaMalloc((void **)&g.dchunks, nchunks ? nchunks * MS_SHA256_LEN : 1));
	for (int i = 0; i < nt; i++) {
		struct gpu_worker *w = &g.w[i];

		CK(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
		CK(cudaStreamCreateWithFlags(&w->hstream, cudaStreamNonBlocking));
		CK(cudaEventCreateWithFlags(&w->span_ev, cudaEventDisableTiming));
		for (int b = 0; b < 2; b++) {
			CK(cudaEventCreateWithFlags(&w->ev[b], cudaEventDisableTiming));
			CK(cudaHostAlloc((void **)&w->pin[b], GPU_CHUNK, cudaHostAllocDefault));
		}
	}
	rc = ms_vload_run(items, n, nt, GPU_CHUNK, &ops, &g, err);
	if (rc != MS_OK)
		goto out;
	if ((rc = check_trees(&g, n, nchunks, err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < n; i++)
		items[i].dst = g.base + g.offs[i];
	*arena = g.base;
	g.base = NULL;
out:
	for (int i = 0; g.w && i < nt; i++) {
		struct gpu_worker *w = &g.w[i];

		if (w->stream) {
			cudaStreamSynchronize(w->stream);
			cudaStreamDestroy(w->stream);
		}
		if (w->hstream) {
			cudaStreamSynchronize(w->hstream);
			cudaStreamDestroy(w->hstream);
		}
		if (w->span_ev)
			cudaEventDestroy(w->span_ev);
		for (int b = 0; b < 2; b++) {
			if (w->ev[b])
				cudaEventDestroy(w->ev[b]);
			cudaFreeHost(w->pin[b]);
		}
	}
	/* on any failure the device copy is dropped before anyone sees it */
	cudaFree(g.base);
	cudaFree(g.dchunks);
	if (rc != MS_OK) {
		for (size_t i = 0; i < n; i++)
			items[i].has_got_tree = 0;
	}
	ms_free(g.offs);
	ms_free(g.coff);
	ms_free(g.w);
	return rc;
}
