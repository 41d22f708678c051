/*
 * pyapi.h: flat entry points for foreign-function bindings (the Python
 * package in python/ loads libms.so with ctypes).
 *
 * Why a separate surface: a binding that mirrors the library's structures
 * (struct ms_tensor, struct ms_vstate, struct ms_ep_rank) breaks silently
 * whenever one of them gains a field. Here every structure a binding
 * touches is either opaque (a load set, an arena) and read through
 * accessors, or small and frozen (struct ms_err, struct ms_hash_job, the
 * DLPack ABI); lists the binding only reads (inventory states) come as
 * JSON text. Nothing here prints, exits or holds a global lock: the
 * functions are safe to call with the interpreter's lock released.
 *
 * A load set is the list of tensors one call loads, each with the digest
 * it must have, taken from a trusted record: the inventory, a state
 * manifest, a caller's digest map, or an EP shard set's manifest. Loading
 * it is ms_load_verified (or ms_load_verified_gpu): the bytes handed over
 * are the bytes that were checked.
 */
#ifndef MS_PYAPI_H
#define MS_PYAPI_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "common.h"
#include "inventory.h"

/* Bumped whenever a signature below changes; the binding refuses a
 * library whose number differs from the one it was written for. */
#define MS_PY_ABI 1

int ms_py_abi(void);
/* MS_VERSION, and sizeof(struct ms_err) (the binding checks its mirror). */
const char *ms_py_version(void);
size_t ms_py_err_size(void);

/* ---- load sets ------------------------------------------------------------- */

struct ms_py_set;

/* The state ref (digest, prefix or label) of inv: the first recorded copy
 * whose files all exist, each file opened with the strict reader, and
 * each recorded tensor matched by name, dtype, shape, offset and size
 * (a difference, a tensor missing or one the record does not list is
 * MS_ECHECK naming it). The recorded tensors must give the state digest
 * (an edited record is MS_ECHECK). */
int ms_py_set_from_inv(struct ms_inv *inv, const char *ref,
		       struct ms_py_set **out, struct ms_err *err);
/* One file of an inventoried state: the state whose recorded copy holds
 * the file at path (compared by real path), the file's tensors matched and
 * expected as above. The record must give its state digest (MS_ECHECK);
 * a file no state records is MS_ENOTFOUND. ms_py_set_state then names the
 * recorded state the file belongs to. */
int ms_py_set_from_inv_file(struct ms_inv *inv, const char *path,
			    struct ms_py_set **out, struct ms_err *err);
/* The same from a state manifest (verify.h), paths relative to its
 * directory. */
int ms_py_set_from_manifest(const char *path, struct ms_py_set **out,
			    struct ms_err *err);
/* The safetensors file at path with the caller's expected digests: names[i]
 * must have digests[32*i .. 32*i+32). Every tensor of the file needs one,
 * and every name must be in the file (MS_EINVAL naming it). */
int ms_py_set_from_file(const char *path, size_t n, const char *const *names,
			const uint8_t *digests, struct ms_py_set **out,
			struct ms_err *err);
/* One EP rank's shard (shard.h, ms_ep_load_rank: wrong EP size, placement,
 * a duplicated block are refused there); the expected digests are the
 * ones the check established. */
int ms_py_set_from_ep(const char *manifest_or_dir, uint32_t ep_size,
		      uint32_t rank, struct ms_py_set **out, struct ms_err *err);
/* An unsharded adapter (or checkpoint) at src, split for ep_size ranks with
 * placement (NULL: contiguous) into the new directory tmpdir (what msshard
 * split writes), then rank loaded from there as ms_py_set_from_ep. The
 * caller removes tmpdir. */
int ms_py_set_from_unsharded(const char *src, const char *tmpdir,
			     uint32_t ep_size, uint32_t rank,
			     const char *placement, struct ms_py_set **out,
			     struct ms_err *err);
void ms_py_set_free(struct ms_py_set *s);

size_t ms_py_set_count(const struct ms_py_set *s);
/* Tensor i (sorted by name): name (valid while s lives), dtype (enum
 * ms_dtype), rank and shape (MS_ST_MAX_RANK entries), bytes, expected
 * digest (32 bytes). Any output may be NULL. MS_EINVAL past the end. */
int ms_py_set_tensor(const struct ms_py_set *s, size_t i, const char **name,
		     int32_t *dtype, uint32_t *ndim, uint64_t *shape,
		     uint64_t *nbytes, uint8_t *expected);
/* The state digest the expected digests make ("sha256:..."); for one file
 * of a recorded state (ms_py_set_from_inv_file), that state's. */
const char *ms_py_set_state(const struct ms_py_set *s);
/* The files the tensors are read from (absolute or as given). */
size_t ms_py_set_nfiles(const struct ms_py_set *s);
const char *ms_py_set_file(const struct ms_py_set *s, size_t i);
/* EP sets: the rank's numbers and its global expert ids (local order),
 * the unsharded source's state digest. MS_EINVAL for another set. */
int ms_py_set_ep(const struct ms_py_set *s, uint32_t *rank, uint32_t *ep_size,
		 uint32_t *num_experts, uint32_t *nexperts,
		 const uint32_t **experts, const char **source_digest);

/* Load every tensor into dsts[i] (host memory, nbytes each) with nthreads
 * (0: one per CPU). ms_load_verified's contract: MS_ECHECK on a mismatch
 * with every destination zeroed. */
int ms_py_set_load(const struct ms_py_set *s, void *const *dsts, int nthreads,
		   struct ms_err *err);

/* ---- arenas: one allocation holding every tensor of a load ------------------ */

/*
 * A reference-counted block of host (ms_malloc) or device (ms_gpu_malloc)
 * memory. Each DLPack tensor made from it holds a reference; the block is
 * freed when the last reference goes, exactly once.
 */
struct ms_py_arena;

#define MS_PY_HOST 0
#define MS_PY_CUDA 1

/* Load s into a new arena on device (MS_PY_HOST, or MS_PY_CUDA through
 * ms_load_verified_gpu: MS_ENODEV without a GPU); offsets[i] (count
 * entries) gets tensor i's offset in it. *out holds one reference. On
 * failure nothing is allocated. */
int ms_py_set_load_arena(const struct ms_py_set *s, int device, int nthreads,
			 uint64_t *offsets, struct ms_py_arena **out,
			 struct ms_err *err);
void *ms_py_arena_base(const struct ms_py_arena *a);
void ms_py_arena_retain(struct ms_py_arena *a);
void ms_py_arena_release(struct ms_py_arena *a); /* NULL is a no-op */
/* Arenas made and not yet freed, process-wide (what tests count). */
uint64_t ms_py_arenas_live(void);

/*
 * DLPack (dlpack.h, version 0.8 ABI: DLManagedTensor): a tensor of ndim
 * dimensions (shape copied, C-contiguous) at offset in a, with the DLPack
 * dtype (code, bits, lanes 1). Takes a reference on a; the tensor's
 * deleter drops it and frees the structure. The device is the arena's
 * (kDLCPU, or kDLCUDA with device_id). NULL when out of memory.
 * ms_py_dlpack_delete calls the deleter (for a capsule never consumed).
 */
void *ms_py_dlpack_new(struct ms_py_arena *a, uint64_t offset, uint32_t ndim,
		       const int64_t *shape, uint8_t code, uint8_t bits,
		       int32_t device_id);
void ms_py_dlpack_delete(void *managed);

/* ---- digests of tensors held in memory ---------------------------------------- */

/* The SHA-256 of each of n buffers (ptrs[i], lens[i] bytes) into
 * out + 32*i, hashed in parallel by nthreads threads (0: one per CPU),
 * largest first. A flat call, so a binding never mirrors the hashing
 * pool's job record (hash.h), whose fields are not a contract. */
int ms_py_sha256_many(size_t n, const void *const *ptrs, const uint64_t *lens,
		      uint8_t *out, int nthreads, struct ms_err *err);

/* The state digest (checkpoint.h) of n tensors described by name, dtype,
 * rank, shape (n * MS_ST_MAX_RANK entries) and SHA-256 (n * 32 bytes),
 * in any order; duplicate names are MS_EINVAL. */
int ms_py_state_digest(size_t n, const char *const *names, const int32_t *dtypes,
		       const uint32_t *ndims, const uint64_t *shapes,
		       const uint8_t *digests, char out[MS_STATE_DIGEST_LEN],
		       struct ms_err *err);

/* ---- the inventory as JSON ------------------------------------------------------ */

/* Every state of kind (NULL or "any": all), oldest first, as a JSON array
 * of objects (digest, kind, layout, label, tensors, bytes, ep_size,
 * ep_rank, experts, copies, tool, created_at). *json is freed with
 * ms_free. */
int ms_py_inv_states_json(struct ms_inv *inv, const char *kind, char **json,
			  struct ms_err *err);
/* One state (by reference) as above plus "files": [{copy, name, path,
 * size, tensors}] and "configs": [{copy, name, path, sha256}]. */
int ms_py_inv_state_json(struct ms_inv *inv, const char *ref, char **json,
			 struct ms_err *err);

#endif
