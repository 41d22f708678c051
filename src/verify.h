/*
 * verify.h: re-hash a state's files against what was recorded, and the
 * state manifest (the JSON a state is exported as, so ranks on other hosts
 * verify locally without the inventory database).
 *
 * The expected side is a struct ms_vstate, filled from the inventory
 * (inventory.h) or from a manifest (ms_manifest_parse). Verification opens
 * each file with the strict reader, hashes the header and every tensor in
 * one parallel pass, and lists every difference: a missing or unreadable
 * file, a file whose header no longer parses, a size change, a changed
 * header, a tensor missing, extra, moved, re-typed or with other bytes, and
 * a configuration file that changed. One flipped bit anywhere is found: the
 * header digest and the tensor digests cover every byte of a valid file.
 *
 * Manifest format (UTF-8 JSON object, "format": "msinv-manifest-v1"):
 *   {"format": "msinv-manifest-v1",
 *    "state": "sha256:...", "kind": "base", "label": "...", "layout": "...",
 *    "ep_size": N, "ep_rank": R,                         (optional)
 *    "files": [{"path": "model-00001-of-00002.safetensors",
 *               "size": 193784, "header_sha256": "<hex>",
 *               "sha256": "<hex>",                        (optional)
 *               "tensors": [{"name": "...", "dtype": "BF16", "shape": [..],
 *                            "offset": 1234, "bytes": 4096,
 *                            "sha256": "<hex>"}, ...]}, ...],
 *    "configs": [{"path": "config.json", "sha256": "<hex>"}, ...]}
 * Paths are relative to the manifest's root (by default the directory the
 * manifest is in): plain relative POSIX paths without "." or ".."
 * components. The state digest is recomputed from the tensors and must
 * match "state".
 */
#ifndef MS_VERIFY_H
#define MS_VERIFY_H

#include <stdint.h>

#include "checkpoint.h"
#include "common.h"
#include "hash.h"
#include "safetensors.h"

struct ms_vtensor {
	char *name;
	enum ms_dtype dtype;
	uint32_t ndim;
	uint64_t shape[MS_ST_MAX_RANK];
	uint64_t offset;     /* absolute offset in the file */
	uint64_t nbytes;
	uint8_t digest[MS_SHA256_LEN];
	int has_tree;        /* tree digest (hash.h, MS_TREE_LOG2) recorded */
	uint8_t tree[MS_SHA256_LEN];
};

struct ms_vfile {
	char *path;          /* as stored: absolute, or relative to the root */
	uint64_t size;
	uint8_t header_digest[MS_SHA256_LEN];
	int has_header_digest;
	uint8_t file_digest[MS_SHA256_LEN];
	int has_file_digest;
	size_t ntensors;
	struct ms_vtensor *tensors;
};

struct ms_vconfig {
	char *path;
	uint8_t digest[MS_SHA256_LEN];
};

struct ms_vstate {
	char digest[MS_STATE_DIGEST_LEN];
	char *kind, *label, *layout;   /* may be NULL */
	int32_t ep_size, ep_rank;      /* -1 when not a shard */
	char *root;                    /* relative paths resolve here; may be NULL */
	size_t nfiles;
	struct ms_vfile *files;
	size_t nconfigs;
	struct ms_vconfig *configs;
};

enum ms_vproblem_kind {
	MS_VPROBLEM_FILE_MISSING,
	MS_VPROBLEM_FILE_UNREADABLE,   /* no longer a valid safetensors file */
	MS_VPROBLEM_FILE_SIZE,
	MS_VPROBLEM_FILE_DIGEST,       /* whole-file digest differs */
	MS_VPROBLEM_HEADER,            /* header bytes differ */
	MS_VPROBLEM_TENSOR_MISSING,
	MS_VPROBLEM_TENSOR_EXTRA,
	MS_VPROBLEM_TENSOR_LAYOUT,     /* dtype, shape or offset differ */
	MS_VPROBLEM_TENSOR_DIGEST,     /* the bytes differ */
	MS_VPROBLEM_CONFIG,
	MS_VPROBLEM_STATE_DIGEST,      /* recorded tensors do not give the state */
};

struct ms_vproblem {
	enum ms_vproblem_kind kind;
	char *file;          /* may be NULL */
	char *tensor;        /* may be NULL */
	char *detail;        /* one lowercase line */
};

struct ms_vreport {
	size_t nproblems;
	struct ms_vproblem *problems;
	size_t nfiles, ntensors;
	uint64_t bytes;      /* bytes hashed */
	double seconds;
	/* tree digests computed in the same pass as plain digests that
	 * matched, for tensors that had none recorded (ms_inv_record_trees
	 * with source "verify" takes them) */
	size_t ntrees;
	struct ms_tree_rec *trees;
	uint64_t device_bytes; /* tensor bytes checked by tree on the GPU */
};

/* A human word for a problem kind ("digest mismatch", "missing", ...). */
const char *ms_vproblem_str(enum ms_vproblem_kind k);

/* Re-hash every file of s (nthreads 0: one per CPU) and fill r (owned by
 * the caller; release with ms_vreport_release). Returns MS_OK when nothing
 * differs, MS_ECHECK when r lists problems, another code on failure of the
 * check itself (memory, a file that cannot be mapped). */
int ms_verify_state(const struct ms_vstate *s, int nthreads,
		    struct ms_vreport *r, struct ms_err *err);
/* The same with the tensors that have a recorded tree digest checked on
 * the GPU (ms_load_verified_gpu: copied to device memory and their chunk
 * trees hashed there); the rest, headers and configurations on the CPU as
 * above. A tensor whose bytes differ is reported as a digest mismatch; on
 * the GPU path only the first such tensor of each file is named (the load
 * of a file stops there). MS_ENODEV without a GPU. */
int ms_verify_state_gpu(const struct ms_vstate *s, int nthreads,
			struct ms_vreport *r, struct ms_err *err);
void ms_vreport_release(struct ms_vreport *r);

/* The expected state of an open, hashed checkpoint (paths absolute when
 * absolute is set, else as the checkpoint holds them). */
int ms_vstate_from_ckpt(const struct ms_ckpt *c, struct ms_vstate **out,
			struct ms_err *err);
void ms_vstate_free(struct ms_vstate *s);
/* The recorded expectation of an inventoried state (inventory.h): copy
 * `copy` of its files, or with copy 0 the first copy whose files all still
 * exist (the first copy when none does, so that the check names them). */
struct ms_inv;
int ms_vstate_from_inv(struct ms_inv *inv, const char *digest, uint32_t copy,
		       struct ms_vstate **out, struct ms_err *err);
/* Where the state lives: the directory holding all its files (the file
 * itself for a one-file state without configs). Caller frees. */
char *ms_vstate_location(const struct ms_vstate *s);
/* Recompute the state digest from the tensors of s into out. */
int ms_vstate_digest(const struct ms_vstate *s, char out[MS_STATE_DIGEST_LEN],
		     struct ms_err *err);

/* Manifest text of s with paths made relative to root (every file must lie
 * under root). Caller frees *json. */
int ms_manifest_write(const struct ms_vstate *s, const char *root, char **json,
		      struct ms_err *err);
/* Parse a manifest (strict: types, hex digests, plain relative paths, the
 * state digest recomputed). root (may be NULL) becomes s->root. */
int ms_manifest_parse(const char *json, size_t len, const char *label,
		      const char *root, struct ms_vstate **out,
		      struct ms_err *err);

/*
 * Verify an inventoried state and record the verdict, the one sequence of
 * every front end that checks states against the inventory (msverify
 * files, the launch gate). s is the expectation of state digest (from
 * ms_vstate_from_inv); r is filled as by ms_verify_state (release it with
 * ms_vreport_release, whatever the return). The result recorded is ok,
 * missing (the first problem is a missing file) or mismatch, with the
 * first problem's detail. Flags:
 *   MS_VERIFY_GPU        the tensors with a recorded tree digest checked on
 *                        the GPU (ms_verify_state_gpu)
 *   MS_VERIFY_TREES      tree digests computed in the same pass for tensors
 *                        that had none are recorded (*trees_added counts
 *                        them; trees_added may be NULL)
 *   MS_VERIFY_NO_RECORD  check only (a dry run): nothing is recorded
 * Returns MS_OK (verified and recorded), MS_ECHECK (r lists the problems,
 * the mismatch is recorded), or the code of the check or of the record that
 * failed. r lists problems only when the check gave a verdict of mismatch
 * (then also when recording it failed); a check that could not be made
 * leaves r empty.
 */
#define MS_VERIFY_GPU 1u
#define MS_VERIFY_TREES 2u
#define MS_VERIFY_NO_RECORD 4u
int ms_verify_record(struct ms_inv *inv, const char *digest, const struct ms_vstate *s,
		     unsigned flags, int nthreads, struct ms_vreport *r, size_t *trees_added,
		     struct ms_err *err);

/* The inventoried states with a copy at path or under it (a file, or a
 * directory holding files of the state), in the inventory's listing
 * order. *out (free with ms_free) gets *nout digests. MS_ENOTFOUND when
 * path does not exist or no state has files there. */
int ms_verify_states_under(struct ms_inv *inv, const char *path,
			   char (**out)[MS_STATE_DIGEST_LEN], size_t *nout, struct ms_err *err);

#endif
