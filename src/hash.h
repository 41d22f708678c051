/*
 * hash.h: SHA-256 through OpenSSL's EVP interface (which uses the CPU's SHA
 * instructions), and the parallel tensor hasher.
 *
 * A tensor's digest is the plain SHA-256 of its bytes, so it compares with
 * the per-tensor SHA-256 serving engines and trainers compute after a weight
 * sync. A file's header digest covers bytes [0, 8+N); header and tensor
 * digests together cover every byte of a valid file in one pass. The
 * whole-file digest (the Hugging Face LFS oid) is a second pass, on demand.
 */
#ifndef MS_HASH_H
#define MS_HASH_H

#include "ms.h"
#include <stdint.h>

#include "common.h"

/* Number of chunks of n bytes (0 for n == 0). */
uint64_t ms_tree_nchunks(uint64_t n, unsigned log2);
/* The bytes hashed before the chunk digests. */
void ms_tree_prefix(unsigned log2, uint64_t n, uint8_t out[MS_TREE_PREFIX_LEN]);
/* Fold the ms_tree_nchunks(n, log2) chunk digests at chunks (32 bytes
 * each, in order) into the tree digest. */
int ms_tree_fold(unsigned log2, uint64_t n, const uint8_t *chunks,
		 uint8_t out[MS_SHA256_LEN]);
/* The SHA-256 of each 2^log2 chunk of n bytes at p (the last may be
 * short) into out, 32 bytes each: a span of a tree whose offset is a
 * multiple of the chunk size. */
int ms_tree_chunks(const void *p, uint64_t n, unsigned log2, uint8_t *out);
/* The tree digest of n bytes at p, its chunks hashed by nthreads threads
 * of the hashing pool (0: one per CPU): one large tensor uses every core.
 * MS_EINVAL for a log2 out of range, MS_ENOMEM. */
int ms_tree_digest(const void *p, uint64_t n, unsigned log2, int nthreads,
		   uint8_t out[MS_SHA256_LEN], struct ms_err *err);

/*
 * A unit of parallel hashing over n bytes at data, any of:
 *   digest: the plain SHA-256 of the bytes;
 *   tree:   their tree digest with chunks of 2^log2 bytes (0: MS_TREE_LOG2),
 *           in the same pass as digest: each piece is copied once into a
 *           private buffer and both digests are taken from that copy, so
 *           they are of the same bytes even if the source (a mapping of a
 *           file) changes meanwhile;
 *   chunks: the SHA-256 of each 2^log2 chunk (the last may be short),
 *           consecutively, 32 bytes each (a span of one tree).
 * Unused outputs are NULL; a zeroed job with data, n and digest set is a
 * plain one.
 */
struct ms_hash_job {
	const uint8_t *data;
	uint64_t n;
	uint8_t *digest;   /* MS_SHA256_LEN bytes, caller-owned */
	uint8_t *tree;     /* MS_SHA256_LEN bytes, caller-owned */
	uint8_t *chunks;   /* ms_tree_nchunks(n, log2) * MS_SHA256_LEN bytes */
	unsigned log2;
};

/* Hash every job with a pool of jobs threads (0: one per CPU), largest
 * first, so one huge tensor does not start last. Reading the bytes may
 * fault in pages from disk; I/O errors on a mapping surface as SIGBUS, so
 * callers hash only files they opened and validated. */
int ms_hash_run(struct ms_hash_job *jobs, size_t n, int nthreads,
		struct ms_err *err);

/* ms_hash_run reporting progress (the bytes of jobs hashed so far) through
 * progress (NULL: none, as ms_hash_run). With progress the calling thread
 * reports instead of hashing. */
int ms_hash_run_progress(struct ms_hash_job *jobs, size_t n, int nthreads,
			 const struct ms_progress *progress, struct ms_err *err);

/* The error of a failed ms_sha256* call: "out of memory" for MS_ENOMEM
 * (a context could not be made), else "sha256 failed". Returns rc. */
int ms_sha256_err(struct ms_err *err, int rc);

#endif
