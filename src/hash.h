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

#include <stdint.h>

#include "common.h"
#include "safetensors.h"

/* One-shot SHA-256. Returns MS_OK or MS_ENOMEM/MS_EIO (OpenSSL failure). */
int ms_sha256(const void *p, size_t n, uint8_t out[MS_SHA256_LEN]);

/* Streaming SHA-256 (wraps an EVP_MD_CTX). */
struct ms_sha256_ctx;
struct ms_sha256_ctx *ms_sha256_new(void);
int ms_sha256_update(struct ms_sha256_ctx *c, const void *p, size_t n);
int ms_sha256_final(struct ms_sha256_ctx *c, uint8_t out[MS_SHA256_LEN]);
void ms_sha256_free(struct ms_sha256_ctx *c);

/* SHA-256 of a whole file, streamed. */
int ms_file_sha256(const char *path, uint8_t out[MS_SHA256_LEN],
		   struct ms_err *err);

/* A unit of parallel hashing: hash n bytes at data into digest. */
struct ms_hash_job {
	const uint8_t *data;
	uint64_t n;
	uint8_t *digest;   /* MS_SHA256_LEN bytes, caller-owned */
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

/* Hash the header and every tensor of the given files in one pool;
 * with file_digests also the whole files (second pass). */
int ms_st_hash_files(struct ms_st_file **files, size_t nfiles, int nthreads,
		     int file_digests, struct ms_err *err);
/* The same, reporting progress (NULL: none). */
int ms_st_hash_files_progress(struct ms_st_file **files, size_t nfiles, int nthreads,
			      int file_digests, const struct ms_progress *progress,
			      struct ms_err *err);

#endif
