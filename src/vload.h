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
	/*
	 * Tree digests (hash.h, chunks of 2^MS_TREE_LOG2 bytes). With
	 * use_tree the bytes are checked against expected_tree instead of
	 * expected: the tensor is cut into spans that every worker shares,
	 * and its chunks are hashed in parallel (host: by the workers; gpu:
	 * by a kernel over the device copy). Give it only a tree recorded for
	 * the bytes whose plain digest is the tensor's (the inventory's rule).
	 */
	int use_tree;
	uint8_t expected_tree[MS_SHA256_LEN];
	/* Without use_tree: also compute the tree in the same pass as the
	 * plain digest, over the same buffer. On success got_tree holds it
	 * (gpu: the device copy's tree, which had to equal the one the CPU
	 * computed from the bytes it sent; a difference is a mismatch), fit
	 * to be recorded as the tree of expected. */
	int want_tree;
	int has_got_tree;
	uint8_t got_tree[MS_SHA256_LEN];
};

/*
 * The trees a load handed out (items with has_got_tree), as records for
 * ms_inv_record_trees with source "load": the tree of the bytes whose
 * plain digest is item->expected. *out (caller frees with ms_free) has
 * *nout records; NULL and 0 when there are none. MS_ENOMEM.
 */
struct ms_tree_rec;
int ms_vload_tree_recs(const struct ms_vload_item *items, size_t n,
		       struct ms_tree_rec **out, size_t *nout,
		       struct ms_err *err);

/*
 * Tests only: when set, called during a load with bytes of item at p (len
 * bytes): where MS_VLOAD_HOOK_STAGED after they were read from the file
 * into host memory, before anything hashed or copied them;
 * MS_VLOAD_HOOK_DEVICE (gpu) after a span arrived in device memory, before
 * the device hashed it. A test flips a byte there to show that the check
 * covers the bytes that are used. NULL in every program.
 */
enum ms_vload_hook_where { MS_VLOAD_HOOK_STAGED, MS_VLOAD_HOOK_DEVICE };
extern void (*ms_vload_test_hook)(enum ms_vload_hook_where where, void *p,
				  uint64_t len, size_t item);

/*
 * Copy every item's tensor into item->dst (host memory) with nthreads
 * threads (0: one per CPU), largest tensors first; items with use_tree are
 * shared by every thread, so one large tensor is no longer bound to one
 * core. MS_OK when every digest matched. MS_ECHECK when one did not ("tensor 'x' in 'f': digest mismatch
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
 * bytes through two pinned buffers (cudaMemcpyAsync on its own stream, an
 * event per buffer). Items with use_tree are not hashed by the CPU at all:
 * once a span of one is in device memory, a kernel on the worker's second
 * stream hashes its chunks there while the next spans are copied (spans
 * under MS_VLOAD_SPAN in one batched launch after the last copy), and at
 * the end the chunk digests (1/2048 of the bytes) are folded into each
 * tensor's tree and compared: the bytes checked are the bytes in HBM.
 * Other items are hashed on the CPU while the previous chunk is copied
 * (with want_tree the device copy is hashed too and must give the CPU's
 * tree). On any mismatch the device memory is freed, *arena and every dst
 * are NULL, and the call returns MS_ECHECK naming the tensor. MS_ENODEV
 * without a GPU (or without CUDA in the build).
 */
int ms_load_verified_gpu(struct ms_vload_item *items, size_t n, int nthreads,
			 void **arena, struct ms_err *err);

/*
 * The engine both variants share (the GPU one lives in kernels/vload_cuda.cu).
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
	/* may be NULL: after the last chunk of a span [off, off + len) of
	 * item (a whole item unless it has use_tree) */
	int (*span_done)(void *ctx, int worker, size_t item, uint64_t off,
			 uint64_t len, struct ms_err *err);
	/* set: the sink hashes and checks the trees of use_tree items itself
	 * (the engine only moves their bytes) */
	int device_trees;
};

/* Bytes of one span of a use_tree item: a multiple of every chunk size
 * the engine is run with and of the tree chunk. */
#define MS_VLOAD_SPAN (16u << 20)

/* Run the engine with chunks of chunk bytes (a multiple of the tree chunk,
 * dividing MS_VLOAD_SPAN) and exactly
 * ms_vload_threads(ms_vload_units(items, n), nthreads, 0) workers (size
 * per-worker state with it).
 * Returns MS_OK, or the first failure: MS_ECHECK for a digest mismatch,
 * MS_EIO, MS_ENOMEM, or a callback's code. */
int ms_vload_run(struct ms_vload_item *items, size_t n, int nthreads,
		 uint64_t chunk, const struct ms_vload_ops *ops, void *ctx,
		 struct ms_err *err);
/* The MS_ECHECK of a tensor whose what ("digest", "digest (tree)") is got
 * where want was expected; returns MS_ECHECK. */
int ms_vload_mismatch(const struct ms_tensor *t, const char *what,
		      const uint8_t *want, const uint8_t *got,
		      struct ms_err *err);
/* The pieces of work in items: one per item, or per span of a use_tree
 * item (all items need a tensor). */
size_t ms_vload_units(const struct ms_vload_item *items, size_t n);
/* The worker count ms_vload_run will use for n units and nthreads asked
 * (0: one per CPU), at most max (0: no cap). */
int ms_vload_threads(size_t n, int nthreads, int max);

#ifdef __cplusplus
}
#endif

#endif
