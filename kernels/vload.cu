/*
 * vload.cu: ms_load_verified_gpu (vload.h): the verified-load engine of
 * vload.c with a sink that stages chunks through pinned memory to the GPU.
 *
 * Each worker owns one stream, two pinned chunk buffers and an event per
 * buffer. For chunk i it waits until the copy that last read buffer i % 2
 * is done, reads the file bytes into it, hashes them there, and queues the
 * copy to the device: the CPU hashes chunk i while the DMA engine moves
 * chunk i - 1. The buffer is not written again until its copy completed,
 * so the device receives exactly the bytes that were hashed. The device
 * memory is handed to the caller only after every digest matched.
 */
#include "gpu_internal.h"

#include <string.h>

/* per worker: small enough that a chunk is still in the core's cache when it
 * is hashed, large enough for the DMA engine */
#define GPU_CHUNK (1u << 20)
#define MAX_WORKERS 16

struct gpu_worker {
	cudaStream_t stream;
	cudaEvent_t ev[2];
	uint8_t *pin[2];
	unsigned slot;
};

struct gpu_sink {
	struct gpu_worker *w;
	struct ms_vload_item *items;
	uint8_t *base;
	uint64_t *offs;
};

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

static int gpu_finish(void *ctx, int worker, struct ms_err *err)
{
	struct gpu_worker *w = &((struct gpu_sink *)ctx)->w[worker];
	int rc = MS_OK;

	if (w->stream)
		CK(cudaStreamSynchronize(w->stream));
out:
	return rc;
}

extern "C" int ms_load_verified_gpu(struct ms_vload_item *items, size_t n,
				    int nthreads, void **arena, struct ms_err *err)
{
	static const struct ms_vload_ops ops = {gpu_buffer, gpu_done, gpu_finish};
	struct gpu_sink g;
	uint64_t total = 0;
	int nt = 0, rc = MS_OK;

	memset(&g, 0, sizeof(g));
	*arena = NULL;
	for (size_t i = 0; i < n; i++)
		items[i].dst = NULL;
	if ((rc = ms_gpu_ready(err)) != MS_OK)
		return rc;
	nt = ms_vload_threads(n, nthreads, MAX_WORKERS);
	g.items = items;
	g.offs = (uint64_t *)ms_calloc(n ? n : 1, sizeof(*g.offs));
	g.w = (struct gpu_worker *)ms_calloc((size_t)nt, sizeof(*g.w));
	if (!g.offs || !g.w) {
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
	}
	CK(cudaMalloc((void **)&g.base, total ? total : 1));
	for (int i = 0; i < nt; i++) {
		struct gpu_worker *w = &g.w[i];

		CK(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
		for (int b = 0; b < 2; b++) {
			CK(cudaEventCreateWithFlags(&w->ev[b], cudaEventDisableTiming));
			CK(cudaHostAlloc((void **)&w->pin[b], GPU_CHUNK, cudaHostAllocDefault));
		}
	}
	rc = ms_vload_run(items, n, nt, GPU_CHUNK, &ops, &g, err);
	if (rc != MS_OK)
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
		for (int b = 0; b < 2; b++) {
			if (w->ev[b])
				cudaEventDestroy(w->ev[b]);
			cudaFreeHost(w->pin[b]);
		}
	}
	/* on any failure the device copy is dropped before anyone sees it */
	cudaFree(g.base);
	ms_free(g.offs);
	ms_free(g.w);
	return rc;
}
