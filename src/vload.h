/*
 * vload.h: verified load. The bytes a caller uses are the bytes that were
 * checked: each tensor is copied to its destination and hashed in the same
 * pass, chunk by chunk (read a chunk, hash it, hand it on), and the call
 * fails before the caller may use anything if one digest differs from the
 * expected one.
 *
 * Expected digests come from the caller, one per tensor (the inventory's
 * record or a manifest's line), so the same call serves both. A digest is
 * the plain SHA-256 of the tensor's bytes (hash.h).
 *
 * Source bytes are read with pread(2) from the tensor's file (reopened by
 * its path), not through the mapping, so a file truncated meanwhile is an
 * I/O error rather than a SIGBUS; tensors of an in-memory image
 * (ms_st_parse) are copied from memory.
 */
#ifndef MS_VLOAD_H
#define MS_VLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ms_vload_item {
	const struct ms_tensor *tensor;   /* source; borrowed for the call */
	uint8_t expected[MS_SHA256_LEN];  /* the digest it must have */
	void *dst;  /* host: the caller's tensor->nbytes bytes;
		     * gpu: set by the call (inside *arena), NULL on failure */
};

/*
 * Copy every item's tensor into item->dst (host memory) with nthreads
 * threads (0: one per CPU), largest tensors first. MS_OK when every digest
 * matched. MS_ECHECK when one did not ("tensor 'x' in 'f': digest mismatch
 * (expected ..., got ...)", the first such item in list order): every
 * destination is then zeroed, so that a caller who ignores the return code
 * still never uses unchecked bytes. MS_EIO on a read error or short file,
 * MS_ENOMEM.
 */
int ms_load_verified(struct ms_vload_item *items, size_t n, int nthreads,
		     struct ms_err *err);

/*
 * The same into GPU memory: one device allocation holds every tensor (each
 * at a 256-byte aligned offset), returned in *arena with item->dst pointing
 * into it; free it with ms_gpu_free(*arena). Each worker thread stages file
 * bytes through two pinned buffers: it hashes one chunk on the CPU while
 * the previous chunk is copied to the GPU (cudaMemcpyAsync on its own
 * stream, an event per buffer). On a digest mismatch the device memory is
 * freed, *arena and every dst are NULL, and the call returns MS_ECHECK
 * naming the tensor. MS_ENODEV without a GPU (or without CUDA in the build).
 */
int ms_load_verified_gpu(struct ms_vload_item *items, size_t n, int nthreads,
			 void **arena, struct ms_err *err);

/*
 * The engine both variants share (the GPU one lives in kernels/vload.cu).
 * Workers take items largest first; for each chunk of an item they ask
 * ops->buffer for memory to read into, read the chunk there, hash it, and
 * give it to ops->done; after an item's last chunk its digest is compared.
 * ops->finish runs once per worker at the end (even after a failure).
 * Worker ids are 0..nthreads-1. Callbacks return MS_OK or an MS_E* code
 * with err filled; the first failure stops every worker.
 */
struct ms_vload_ops {
	int (*buffer)(void *ctx, int worker, size_t item, uint64_t off,
		      uint64_t len, uint8_t **buf, struct ms_err *err);
	int (*done)(void *ctx, int worker, size_t item, uint64_t off,
		    uint64_t len, uint8_t *buf, struct ms_err *err);
	int (*finish)(void *ctx, int worker, struct ms_err *err);
};

/* Run the engine with chunks of chunk bytes and exactly
 * ms_vload_threads(n, nthreads, 0) workers (size per-worker state with it).
 * Returns MS_OK, or the first failure: MS_ECHECK for a digest mismatch,
 * MS_EIO, MS_ENOMEM, or a callback's code. */
int ms_vload_run(struct ms_vload_item *items, size_t n, int nthreads,
		 uint64_t chunk, const struct ms_vload_ops *ops, void *ctx,
		 struct ms_err *err);
/* The worker count ms_vload_run will use for n items and nthreads asked
 * (0: one per CPU), at most max (0: no cap). */
int ms_vload_threads(size_t n, int nthreads, int max);

#ifdef __cplusplus
}
#endif

#endif
