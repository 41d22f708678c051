/*
 * safetensors.h: strict reader (mmap, zero-copy) and atomic streaming writer
 * for the safetensors format.
 *
 * Byte layout of a file:
 *
 *   offset 0       u64 little-endian N: length of the JSON header
 *   offset 8       N bytes of UTF-8 JSON (writers pad with spaces to 8)
 *   offset 8+N     the data buffer: every tensor's bytes, back to back
 *
 * The header is one JSON object. "__metadata__" (optional) maps strings to
 * strings. Every other key is a tensor name mapping to
 *   {"dtype": "<DTYPE>", "shape": [d0, ...], "data_offsets": [begin, end]}
 * with offsets relative to the data buffer. Rules enforced (each a distinct
 * error naming the file and the rule): 8 <= file, N <= MS_ST_MAX_HEADER and
 * 8+N <= file size; UTF-8; a JSON object; nesting <= MS_ST_MAX_DEPTH; no
 * duplicate keys; metadata values are strings; shape and offsets are
 * non-negative integers that fit u64 (no fraction, exponent or sign);
 * dtype known; element count and byte size do not overflow; sub-byte
 * dtypes (F4, F6_*) fill whole bytes; end - begin == byte size; sorted by
 * offset the tensors start at 0, are contiguous, never overlap and end at
 * the end of the file; caps on tensor count, rank and name length; names
 * are non-empty and contain no NUL.
 */
#ifndef MS_SAFETENSORS_H
#define MS_SAFETENSORS_H

#include "ms.h"
#include <stdint.h>
#include <sys/types.h>

#include "common.h"
#include "hash.h"

struct ms_st_file {
	char *path;           /* as given */
	char *blob_digest;    /* HF cache: the blob name a symlink points at */
	uint64_t size;
	uint64_t header_len;  /* N */
	const uint8_t *map;   /* whole file; NULL for an empty file set */
	int mapped;           /* 1 when map must be munmapped */
	/* identity of the bytes on disk, for "unchanged since" checks */
	uint64_t dev, ino;
	int64_t mtime_ns, ctime_ns;
	size_t ntensors;
	struct ms_tensor *tensors;      /* in offset order */
	struct ms_tensor **by_name;     /* sorted bytewise by name */
	size_t nmeta;
	struct ms_st_meta *meta;        /* in header order */
	uint8_t header_digest[MS_SHA256_LEN]; /* over bytes [0, 8+N) */
	int has_header_digest;
	uint8_t file_digest[MS_SHA256_LEN];   /* over the whole file */
	int has_file_digest;
};

/* Open and validate path (symbolic links are followed). On success *out
 * owns the mapping; close with ms_st_close. */
int ms_st_open(const char *path, struct ms_st_file **out, struct ms_err *err);
/* Validate an in-memory file image of size bytes (the fuzz entry point).
 * Tensor data pointers point into buf, which must outlive *out. label names
 * the file in error messages. */
int ms_st_parse(const uint8_t *buf, uint64_t size, const char *label,
		struct ms_st_file **out, struct ms_err *err);
void ms_st_close(struct ms_st_file *f);
/* Binary search by name; NULL when absent. */
const struct ms_tensor *ms_st_find(const struct ms_st_file *f, const char *name);
/* Metadata value for key, or NULL. */
const char *ms_st_meta_get(const struct ms_st_file *f, const char *key);

/*
 * Writer. Declare every tensor (in the order its bytes will follow), then
 * stream the bytes with ms_st_writer_data in that order (any chunking),
 * then commit. The header is written at the first data call (or commit),
 * padded with spaces to a multiple of 8. Output goes to a temporary file
 * beside path and is renamed into place at commit (see fsutil.h); freeing an
 * uncommitted writer removes the temporary. The writer hashes the bytes it
 * writes: after commit, ms_st_writer_digest gives each tensor's SHA-256.
 */
struct ms_st_writer;

int ms_st_writer_new(const char *path, int force, struct ms_st_writer **out,
		     struct ms_err *err);
int ms_st_writer_meta(struct ms_st_writer *w, const char *key,
		      const char *value, struct ms_err *err);
int ms_st_writer_declare(struct ms_st_writer *w, const char *name,
			 enum ms_dtype dt, uint32_t ndim, const uint64_t *shape,
			 struct ms_err *err);
int ms_st_writer_data(struct ms_st_writer *w, const void *p, size_t n,
		      struct ms_err *err);
/* Declare one tensor whose bytes are all in memory; data is borrowed and
 * must stay valid until commit. Such tensors are written by the writer when
 * their turn comes; ms_st_writer_data streams only the tensors declared
 * without data, in declaration order. */
int ms_st_writer_add(struct ms_st_writer *w, const char *name, enum ms_dtype dt,
		     uint32_t ndim, const uint64_t *shape, const void *data,
		     struct ms_err *err);
int ms_st_writer_commit(struct ms_st_writer *w, struct ms_err *err);
/* Digest of the i-th declared tensor (valid after its bytes were written). */
const uint8_t *ms_st_writer_digest(const struct ms_st_writer *w, size_t i);
void ms_st_writer_free(struct ms_st_writer *w);

/* Hash the header and every tensor of the given files in one pool;
 * with file_digests also the whole files (second pass). */
int ms_st_hash_files(struct ms_st_file **files, size_t nfiles, int nthreads,
		     int file_digests, struct ms_err *err);
/* The same, reporting progress (NULL: none). */
int ms_st_hash_files_progress(struct ms_st_file **files, size_t nfiles, int nthreads,
			      int file_digests, const struct ms_progress *progress,
			      struct ms_err *err);
/* The same; with trees, every tensor's tree digest (MS_TREE_LOG2) too, in
 * the same pass as its plain digest (tensor->tree, has_tree). */
int ms_st_hash_files_trees(struct ms_st_file **files, size_t nfiles,
			   int nthreads, int file_digests, int trees,
			   struct ms_err *err);
/* The general form: trees as ms_st_hash_files_trees, progress as
 * ms_st_hash_files_progress. */
int ms_st_hash_files_ex(struct ms_st_file **files, size_t nfiles, int nthreads,
			int file_digests, int trees, const struct ms_progress *progress,
			struct ms_err *err);

#endif
