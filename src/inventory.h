/*
 * inventory.h: the inventory, a SQLite database in which every materialised
 * weight state (a base, an NVFP4 copy, an adapter, an EP shard of it, a
 * served policy) is a row that can be named, verified and traced.
 *
 * The store (ms(5) has the tables):
 *   - the schema is schema/NNNN-*.sql, embedded in the library and applied in
 *     order inside BEGIN IMMEDIATE transactions; PRAGMA user_version counts
 *     the migrations applied, and a database newer than the library is
 *     refused (MS_EDB); PRAGMA application_id marks the file as ours;
 *   - WAL journal, synchronous=FULL, foreign keys on, a busy timeout; every
 *     write is one BEGIN IMMEDIATE transaction, retried on SQLITE_BUSY, so
 *     many processes (one per EP rank) can register at once;
 *   - every change appends an audit log entry in the same transaction; each
 *     entry's hash covers the previous entry's hash (ms_inv_log_check).
 *
 * Identity: a state is named by ms_state_digest (checkpoint.h) of its
 * tensors. A state may be stored in several places: each "copy" is a set of
 * files that together hold every tensor once.
 *
 * A state reference (ms_inv_resolve) is a full digest, a unique prefix of at
 * least MS_INV_MIN_PREFIX hex digits with or without "sha256:", or a label.
 * Labels are 1..MS_INV_MAX_LABEL bytes of [A-Za-z0-9._:@+/-], do not start
 * with "sha256:" and are not made of hex digits alone, so no label can be
 * read as a prefix.
 *
 * Every function returns MS_OK or an MS_E* code with err filled; database
 * failures are MS_EDB. Structures returned to the caller are owned by it and
 * released by the matching _free/_release function.
 */
#ifndef MS_INVENTORY_H
#define MS_INVENTORY_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "common.h"
#include "hash.h"
#include "safetensors.h"

#define MS_INV_APPLICATION_ID 0x4d53494e /* "MSIN" */
#define MS_INV_MIN_PREFIX 4
#define MS_INV_MAX_LABEL 128
#define MS_INV_MAX_PARAMS (1u << 20)     /* bytes of a parameters/event JSON */
#define MS_INV_MAX_PARENTS 64

struct ms_inv;

/* ms_inv_open flags. */
#define MS_INV_CREATE 1u  /* create the database file when it does not exist */

enum ms_inv_kind {
	MS_INV_KIND_ANY = 0,   /* add: infer from the files; lists: every kind */
	MS_INV_KIND_BASE,
	MS_INV_KIND_QUANTIZED,
	MS_INV_KIND_ADAPTER,
	MS_INV_KIND_ADAPTER_SHARD,
	MS_INV_KIND_POLICY,
	MS_INV_KIND_COUNT
};

/* "base", "quantized", "adapter", "adapter_shard", "policy" ("any" for
 * MS_INV_KIND_ANY). The parser accepts the five kinds only. */
const char *ms_inv_kind_name(enum ms_inv_kind k);
int ms_inv_kind_parse(const char *s, enum ms_inv_kind *out);

/* Derivation operations an edge may carry: quantize, dequantize,
 * transpose, split, reshard, merge, train, compose (a policy made of a base
 * and an adapter). 1 when op is one of them. */
int ms_inv_op_valid(const char *op);

/* ---- opening ------------------------------------------------------------ */

/* Open the inventory at path, migrating it to the library's schema. Without
 * MS_INV_CREATE a missing file is MS_ENOTFOUND ("no inventory ..."). A file
 * that is not an inventory, or one whose schema is newer than the library,
 * is MS_EDB. */
int ms_inv_open(const char *path, unsigned flags, struct ms_inv **out,
		struct ms_err *err);
void ms_inv_close(struct ms_inv *inv);
/* Provenance of everything this handle writes: the tool name and its argv
 * (copied). Without it, records name the running program and its command
 * line (/proc/self/cmdline). */
int ms_inv_set_origin(struct ms_inv *inv, const char *tool, int argc,
		      char *const *argv, struct ms_err *err);
/* Progress of the long work done through this handle (hashing in
 * ms_inv_add_paths, packing in ms_export_state, extracting in
 * ms_import_bundle); progress is copied, NULL turns it off (the default).
 * ms_inv_progress is the handle's, NULL when none. */
void ms_inv_set_progress(struct ms_inv *inv, const struct ms_progress *progress);
const struct ms_progress *ms_inv_progress(const struct ms_inv *inv);
/* PRAGMA user_version of the open database, and the number of migrations
 * the library carries. */
int ms_inv_schema_version(const struct ms_inv *inv);
int ms_inv_schema_latest(void);
/* The database path as opened. */
const char *ms_inv_path(const struct ms_inv *inv);

/*
 * Batches: every write between ms_inv_batch_begin and ms_inv_batch_end
 * (ms_inv_add_paths, edges, verifications, ...) goes into one transaction,
 * begun by the first write (so work done before it, such as hashing, holds
 * no lock) and committed by ms_inv_batch_end(inv, 1, err): all of it is
 * recorded, or none. A failed write inside the batch rolls all of it back,
 * and every later write and the final commit then fail. A tool publishing
 * outputs uses it to make "files in place" and "files registered" one step:
 * rename the outputs into place, register them (and their inputs and
 * edges), commit; on any failure roll back and remove what it renamed. ms_inv_batch_end(inv, 0, err) (or ms_inv_close)
 * rolls back. Reads inside a batch see its writes.
 */
int ms_inv_batch_begin(struct ms_inv *inv, struct ms_err *err);
int ms_inv_batch_end(struct ms_inv *inv, int commit, struct ms_err *err);

/* ---- adding a state --------------------------------------------------------- */

struct ms_inv_add_stats {
	uint32_t files;          /* safetensors files in the state */
	uint32_t files_hashed;   /* files read in full (the rest were unchanged) */
	uint64_t tensors;
	uint64_t bytes;          /* tensor bytes of the state */
	uint64_t bytes_hashed;
	double seconds_hash;
	double seconds_db;
	int new_state;           /* the state was not recorded before */
	int new_copy;            /* these files were a new location of it */
	uint32_t copy;           /* the copy number the files are recorded as */
	enum ms_inv_kind kind;   /* the kind recorded */
	char layout[32];
};

struct ms_inv_add_opts {
	enum ms_inv_kind kind;          /* ANY: what the files say, else base */
	const char *label;              /* NULL: none */
	const char *const *parents;     /* state references (resolved) */
	size_t nparents;
	const char *operation;          /* required with parents */
	const char *params_json;        /* a JSON object; NULL: {} */
	int32_t ep_size, ep_rank;       /* -1: not given */
	int jobs;                       /* hashing threads, 0: one per CPU */
	int rehash;                     /* hash even files recorded unchanged */
	int file_digests;               /* also the whole-file SHA-256 */
	const char *tool;               /* provenance; NULL: the handle's */
	int argc;
	char *const *argv;
	int64_t run_id;                 /* produced by this run (0: none) */
	struct ms_inv_add_stats *stats; /* filled when not NULL */
};

/* Defaults: infer the kind, no label, no parents, ep -1, everything 0. */
void ms_inv_add_opts_init(struct ms_inv_add_opts *o);

/*
 * Register the state held by paths (files, checkpoint directories, adapter
 * directories; see checkpoint.h), writing its digest to digest_out.
 *
 * Files whose size, mtime, ctime, device and inode match a recorded file
 * (and whose header still hashes the same) reuse the recorded tensor
 * digests; the rest are hashed in parallel. Then one BEGIN IMMEDIATE
 * transaction records the files, tensors, state, copy, configurations,
 * label, derivation edges, run output and the log entries: a killed process
 * leaves all of it or none. Adding a recorded state is idempotent: nothing
 * new is written unless the files are a new location, the label is new, or
 * an edge is new.
 *
 * The kind and layout come from the files (ms(5), "Kinds and layouts");
 * opts->kind or EP numbers that contradict them are MS_EINVAL naming what
 * the files say. A label naming another state is MS_EEXIST.
 */
int ms_inv_add_paths(struct ms_inv *inv, const char *const *paths, size_t n,
		     const struct ms_inv_add_opts *opts,
		     char digest_out[MS_STATE_DIGEST_LEN], struct ms_err *err);

/* What the files of an opened, hashed checkpoint say about its kind and
 * layout (the rules add applies); kind is MS_INV_KIND_ANY when they say
 * nothing, ep_size/ep_rank -1 without shard metadata; *experts (caller
 * frees, NULL when none) is the JSON array of expert ids. layout holds at
 * least 32 bytes. */
int ms_inv_classify(const struct ms_ckpt *c, enum ms_inv_kind *kind,
		    char *layout, size_t layout_len, int32_t *ep_size,
		    int32_t *ep_rank, char **experts, struct ms_err *err);

/* ---- looking up ---------------------------------------------------------------- */

/*
 * Labels are names for states, as tags are for commits: a state may have
 * several, a label names one state. ms_inv_label_add gives the state digest
 * the label (its others stay); a label that names another state is
 * MS_EEXIST unless force, which moves it. ms_inv_label_remove forgets a
 * label (MS_ENOTFOUND when no state has it). Each is one transaction (or
 * part of the caller's batch) with its log entry, "label" (detail: label,
 * and "from", the state it was moved from) or "unlabel". A relabel is an
 * add and a remove in one batch.
 */
/* MS_OK when label is a valid label (the rule above), else MS_EINVAL
 * saying which part of the rule it breaks: to refuse a bad label before
 * the work whose output it would name. */
int ms_inv_label_check(const char *label, struct ms_err *err);
int ms_inv_label_add(struct ms_inv *inv, const char *digest, const char *label,
		     int force, struct ms_err *err);
int ms_inv_label_remove(struct ms_inv *inv, const char *label,
			struct ms_err *err);

/* Resolve a reference to the full digest. Unknown: MS_ENOTFOUND; a prefix
 * of several states: MS_EINVAL listing candidates; a malformed reference:
 * MS_EINVAL. */
int ms_inv_resolve(struct ms_inv *inv, const char *ref,
		   char digest_out[MS_STATE_DIGEST_LEN], struct ms_err *err);

/* The newest state with a recorded file at path (a file), or directly
 * inside it (a directory), by the path's realpath: what was registered
 * there, whatever the bytes are now. None: MS_ENOTFOUND. */
int ms_inv_state_at_path(struct ms_inv *inv, const char *path,
			 char digest_out[MS_STATE_DIGEST_LEN], struct ms_err *err);

struct ms_inv_state {
	int64_t id;
	char digest[MS_STATE_DIGEST_LEN];
	enum ms_inv_kind kind;
	char *layout;
	char *label;            /* NULL when none */
	uint64_t ntensors, nbytes;
	int32_t ep_size, ep_rank; /* -1 unless an adapter shard */
	char *experts;          /* JSON array of expert ids, NULL when none */
	char *tool, *argv, *user, *host, *created_at; /* argv: a JSON array */
	uint32_t ncopies;
	char *cwd;              /* where argv ran; NULL when not recorded */
	char *labels;           /* every label, oldest first, separated by one
				 * space; NULL when none (label is the first) */
};

/* One state by full digest (MS_ENOTFOUND when absent). */
int ms_inv_state_get(struct ms_inv *inv, const char *digest,
		     struct ms_inv_state **out, struct ms_err *err);
void ms_inv_state_free(struct ms_inv_state *s);
/* Every state of kind (ANY: all), oldest first. *out is an array of *n
 * states, released with ms_inv_states_free. */
int ms_inv_states_list(struct ms_inv *inv, enum ms_inv_kind kind,
		       struct ms_inv_state **out, size_t *n, struct ms_err *err);
void ms_inv_states_free(struct ms_inv_state *s, size_t n);

struct ms_inv_tensor {
	char *name;
	enum ms_dtype dtype;
	uint32_t ndim;
	uint64_t shape[MS_ST_MAX_RANK];
	uint64_t offset;         /* absolute offset in the file */
	uint64_t nbytes;
	uint8_t digest[MS_SHA256_LEN];
	int has_tree;            /* a tree digest (MS_TREE_LOG2) is recorded */
	uint8_t tree[MS_SHA256_LEN];
};

struct ms_inv_file {
	int64_t id;
	uint32_t copy;           /* which copy of the state it belongs to */
	char *name;              /* file name inside the checkpoint */
	char *path;              /* absolute (realpath when recorded) */
	uint64_t size, dev, inode, header_len;
	int64_t mtime_ns, ctime_ns;
	uint8_t header_digest[MS_SHA256_LEN];
	int has_file_digest;
	uint8_t file_digest[MS_SHA256_LEN];
	size_t ntensors;
	struct ms_inv_tensor *tensors; /* offset order; NULL without tensors */
};

struct ms_inv_files {
	size_t n;
	struct ms_inv_file *files;     /* by copy, then name */
};

/* The recorded files of a state (copy 0: every copy), with their tensors
 * when with_tensors: what msverify re-hashes. Release with
 * ms_inv_files_release. */
int ms_inv_state_files(struct ms_inv *inv, const char *digest, uint32_t copy,
		       int with_tensors, struct ms_inv_files *out,
		       struct ms_err *err);
void ms_inv_files_release(struct ms_inv_files *f);

struct ms_inv_config {
	uint32_t copy;
	char *name, *path, *text;
	size_t len;
	uint8_t digest[MS_SHA256_LEN];
};
/* The fields of a recorded config.json that change how tensors are read
 * (its "quantization_config" member) as compact JSON text in *json
 * (ms_free; NULL for another file, a config without the member, or text
 * that is not JSON). MS_OK or MS_ENOMEM. */
int ms_inv_config_quant(const struct ms_inv_config *c, char **json, struct ms_err *err);
/* A recorded command line (the JSON array of its words, as in struct
 * ms_inv_state's argv) as one line, the words separated by spaces, in
 * *text (ms_free; NULL when argv_json is NULL). MS_OK or MS_ENOMEM. */
int ms_inv_argv_text(const char *argv_json, char **text, struct ms_err *err);

int ms_inv_state_configs(struct ms_inv *inv, const char *digest,
			 struct ms_inv_config **out, size_t *n,
			 struct ms_err *err);
void ms_inv_configs_free(struct ms_inv_config *c, size_t n);

/* ---- lineage ------------------------------------------------------------------ */

enum ms_inv_edges_which {
	MS_INV_EDGES_PARENTS,      /* edges into the state */
	MS_INV_EDGES_CHILDREN,     /* edges out of it */
	MS_INV_EDGES_ANCESTORS,    /* every edge above it, transitively */
	MS_INV_EDGES_DESCENDANTS,  /* every edge below it */
};

struct ms_inv_edge {
	char parent[MS_STATE_DIGEST_LEN], child[MS_STATE_DIGEST_LEN];
	char *parent_label, *child_label;     /* NULL when none */
	enum ms_inv_kind parent_kind, child_kind;
	char *parent_layout, *child_layout;
	char *operation, *params;             /* params: a JSON object */
	int64_t run_id;                       /* 0: none */
	char *created_at;
};

int ms_inv_edges(struct ms_inv *inv, const char *digest,
		 enum ms_inv_edges_which which, struct ms_inv_edge **out,
		 size_t *n, struct ms_err *err);
void ms_inv_edges_free(struct ms_inv_edge *e, size_t n);

/*
 * Lineage carried from one inventory to another (msinv export / import).
 * ms_inv_lineage_export writes, as JSON text (caller frees with ms_free),
 * the record of where digest came from:
 *
 *   {"states": [{"state", "kind", "layout", "label", "tensors", "bytes",
 *                "ep_size", "ep_rank", "experts", "argv", "tool", "user",
 *                "host", "created_at"}, ...],       every ancestor, once
 *    "edges":  [{"child", "parent", "operation", "params", "created_at"},
 *               ...]}                               every edge above digest
 *
 * ms_inv_lineage_check: is text such a record for digest (well formed, every
 * edge between digest and states it lists, digest not among them)?
 * MS_EINVAL naming the rule when not. ms_inv_lineage_record (digest must be
 * recorded) records, in one transaction (or the open batch), every listed
 * state this inventory lacks as a state with no copy (what it was and where
 * it came from, its bytes elsewhere), keeping its label unless another
 * state here has it, and every edge not yet recorded; states recorded here
 * already are kept as they are. An edge that would close a cycle with the
 * recorded ones is MS_EINVAL. The audit log gets one "lineage" entry
 * naming source (may be NULL). Claims of another inventory: no byte of an
 * ancestor is checked here.
 */
int ms_inv_lineage_export(struct ms_inv *inv, const char *digest, char **json,
			  struct ms_err *err);
int ms_inv_lineage_check(const char *json, size_t len, const char *digest,
			 struct ms_err *err);
int ms_inv_lineage_record(struct ms_inv *inv, const char *digest, const char *json,
			  size_t len, const char *source, struct ms_err *err);

/* ---- verifications, runs, events ------------------------------------------------- */

enum ms_inv_result {
	MS_INV_RESULT_OK,
	MS_INV_RESULT_MISMATCH,  /* bytes differ from the record */
	MS_INV_RESULT_MISSING,   /* files gone */
	MS_INV_RESULT_ERROR,     /* the check itself failed */
};
const char *ms_inv_result_name(enum ms_inv_result r);

/* Record that the state was checked (by whom: the handle's origin). detail
 * (may be NULL) is one line. */
int ms_inv_record_verification(struct ms_inv *inv, const char *digest,
			       enum ms_inv_result result, uint64_t nbytes,
			       double seconds, const char *detail,
			       struct ms_err *err);

/*
 * Record tree digests (hash.h) of tensor bytes, keyed by their plain
 * digest: every tensor with those bytes gains them. source is "verify"
 * (computed in the pass that matched the plain digest) or "load" (a device
 * copy's tree that agreed with the CPU's); the caller vouches for that
 * rule, which is what makes a tree digest stand in for the plain one. A
 * record for bytes no recorded tensor has is skipped; one already there is
 * kept; a different tree for the same bytes and chunk size is MS_ECHECK
 * (one of the two was not of these bytes) and nothing is recorded. One
 * audit log entry ("trees", subject state, which may be NULL) when rows
 * were added; *added (may be NULL) gets their number.
 */
int ms_inv_record_trees(struct ms_inv *inv, const char *state,
			const struct ms_tree_rec *recs, size_t n,
			const char *source, size_t *added, struct ms_err *err);

struct ms_inv_verification {
	char *at, *host, *user, *tool, *detail; /* detail may be NULL */
	enum ms_inv_result result;
	uint64_t nbytes;
	double seconds;
};
/* Newest first. */
int ms_inv_verifications(struct ms_inv *inv, const char *digest,
			 struct ms_inv_verification **out, size_t *n,
			 struct ms_err *err);
void ms_inv_verifications_free(struct ms_inv_verification *v, size_t n);

/* A state a run consumes: its full digest (the one verified before the
 * run), and the role the plan gives it (may be NULL). */
struct ms_inv_run_input {
	const char *digest;
	const char *role;
};

/* Record the start of a run of the plan whose digest is plan_digest (any
 * non-empty text, by convention "sha256:<hex>" of the plan file), with the
 * states it consumes (each must be recorded). *run_id gets its number. */
int ms_inv_run_begin(struct ms_inv *inv, const char *plan_digest,
		     const struct ms_inv_run_input *inputs, size_t n,
		     int64_t *run_id, struct ms_err *err);
/* Record the end: status ok when exit_code is 0, else failed. Ending a run
 * twice is MS_EINVAL. */
int ms_inv_run_end(struct ms_inv *inv, int64_t run_id, int exit_code,
		   struct ms_err *err);
/* Record that a run produced a (recorded) state. ms_inv_add_paths does it
 * when given opts->run_id. */
int ms_inv_run_output(struct ms_inv *inv, int64_t run_id, const char *digest,
		      struct ms_err *err);

struct ms_inv_run {
	int64_t id;
	char *plan_digest, *status, *started_at, *ended_at; /* ended_at: NULL */
	int has_exit_code;
	int exit_code;
	char *role;      /* the state's role in the run (NULL when none) */
	char *user, *host;
};
/* Runs that consumed the state (consumed = 1) or produced it (0), newest
 * first. */
int ms_inv_state_runs(struct ms_inv *inv, const char *digest, int consumed,
		      struct ms_inv_run **out, size_t *n, struct ms_err *err);
void ms_inv_runs_free(struct ms_inv_run *r, size_t n);

/* Run run_id alone (role NULL), into *out (one element, freed with
 * ms_inv_runs_free(*out, 1)). MS_ENOTFOUND when there is none. */
int ms_inv_run_get(struct ms_inv *inv, int64_t run_id, struct ms_inv_run **out,
		   struct ms_err *err);

struct ms_inv_event {
	int64_t id;
	char *at, *kind, *data;  /* data: the JSON object as recorded */
};
/* The events of run run_id, oldest first. */
int ms_inv_run_events(struct ms_inv *inv, int64_t run_id, struct ms_inv_event **out,
		      size_t *n, struct ms_err *err);
void ms_inv_events_free(struct ms_inv_event *e, size_t n);

/* Record an event (kind: [a-z0-9_]+, e.g. "reward_collapse"; json: a JSON
 * object) of a run (0: none). *event_id may be NULL. */
int ms_inv_event_add(struct ms_inv *inv, int64_t run_id, const char *kind,
		     const char *json, int64_t *event_id, struct ms_err *err);

/* ---- the audit log ------------------------------------------------------------- */

/* An entry as stored; strings are borrowed for the duration of the
 * callback. argv and detail are JSON. */
struct ms_inv_log_entry {
	int64_t seq;
	const char *at, *user, *host, *tool, *argv;
	const char *action, *subject, *detail;
	const char *prev_hash, *hash;
	const char *cwd;   /* working directory; NULL in entries made before
			    * the inventory recorded it */
};

/* Call fn for every entry, oldest first; a non-zero return from fn stops
 * the walk and is returned. */
int ms_inv_log_each(struct ms_inv *inv,
		    int (*fn)(const struct ms_inv_log_entry *e, void *ctx),
		    void *ctx, struct ms_err *err);
/* The hash of an entry (hex into out[65]) from its fields and prev_hash:
 * the canonical encoding of ms(5). */
int ms_inv_log_hash(const struct ms_inv_log_entry *e, char out[65]);
/* Walk the chain: every entry's hash recomputed, every prev_hash equal to
 * the hash before, sequence numbers 1..N without a gap, and the head row
 * naming entry N. MS_OK (with *n entries and the head hash, either may be
 * NULL), or MS_ECHECK naming the first entry edited, removed or reordered. */
int ms_inv_log_check(struct ms_inv *inv, int64_t *n, char head[65],
		     struct ms_err *err);

/* ---- the sprawl report ---------------------------------------------------------- */

/* One physical copy of a tensor's bytes (files with the same device and
 * inode are one copy), with the states whose copies use it. */
struct ms_inv_dup_place {
	char *path;
	char *tensor;
	size_t nstates;
	char (*states)[MS_STATE_DIGEST_LEN];
	char **labels;          /* parallel to states; entries may be NULL */
};

struct ms_inv_dup {
	char digest[65];        /* the tensor digest */
	uint64_t nbytes;        /* one copy */
	size_t nplaces;
	struct ms_inv_dup_place *places;
};

/* Bytes shared by two states (through stored duplicates). */
struct ms_inv_dup_pair {
	char a[MS_STATE_DIGEST_LEN], b[MS_STATE_DIGEST_LEN];
	uint64_t ntensors, nbytes;
};

struct ms_inv_dup_report {
	uint64_t stored_bytes;     /* every physical tensor copy */
	uint64_t unique_bytes;     /* one copy of each distinct digest */
	uint64_t redundant_bytes;  /* stored - unique */
	uint64_t stored_tensors;
	size_t n;
	struct ms_inv_dup *dups;   /* digests stored more than once, largest
				    * waste first */
	size_t npairs;
	struct ms_inv_dup_pair *pairs; /* most bytes first */
};

/* Tensors (of more than 0 bytes) of recorded states stored in more than one
 * place. */
int ms_inv_dup(struct ms_inv *inv, struct ms_inv_dup_report *out,
	       struct ms_err *err);
void ms_inv_dup_release(struct ms_inv_dup_report *r);

/* ---- removing -------------------------------------------------------------------- */

/* Forget a state (its copies, configurations, edges, verifications; runs
 * keep the digest). States derived from it make this MS_EINVAL unless
 * force, which also removes their edges to it. Files on disk are not
 * touched; file rows no state uses stay until ms_inv_gc. */
int ms_inv_rm(struct ms_inv *inv, const char *digest, int force,
	      struct ms_err *err);

enum ms_inv_gc_what {
	MS_INV_GC_TEMP_FILE,   /* a temporary file of an interrupted write */
	MS_INV_GC_FILE_ROW,    /* a file record no state uses */
};

/* Remove temporaries whose pid is not a live process of this host, as
 * ms_temp_name_parse (fsutil.h) recognises them: files and staging
 * directories ".<name>.tmp-<pid>-<hex>", outputs set aside under --force
 * ".<name>.replaced-<pid>-<hex>" and earlier imports' staging
 * ".<name>.import-<pid>-<hex>" (directories with what they hold), from the directories of recorded
 * files, their parents (where a directory output beside a recorded state
 * is staged), the inventory's own directory and dirs; and file rows no
 * state uses. With dry_run nothing
 * is removed. fn (may be NULL) is told each item; a temporary that cannot
 * be removed is reported and makes the result MS_EIO after the walk. */
int ms_inv_gc(struct ms_inv *inv, const char *const *dirs, size_t ndirs,
	      int dry_run,
	      void (*fn)(enum ms_inv_gc_what what, const char *path, void *ctx),
	      void *ctx, uint64_t *nitems, struct ms_err *err);
/* Is name (a plain file name) such a temporary? *pid gets its pid. */
int ms_inv_is_temp_name(const char *name, long *pid);

/* ---- tensor owners ------------------------------------------------------------ */

/* A recorded tensor with given bytes: the state holding it and its name
 * there. */
struct ms_inv_owner {
	char state[MS_STATE_DIGEST_LEN];
	char *name;
};

/* Every (state, tensor name) whose tensor has this SHA-256, oldest state
 * first; the answer to "which recorded states hold these bytes". Release
 * with ms_inv_owners_free. */
int ms_inv_tensor_owners(struct ms_inv *inv, const uint8_t digest[MS_SHA256_LEN],
			 struct ms_inv_owner **out, size_t *n, struct ms_err *err);
void ms_inv_owners_free(struct ms_inv_owner *o, size_t n);

#endif
