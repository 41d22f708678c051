/*
 * shard_int.h: what the files of expert-parallel sharding share (shard.h is
 * the contract and on-disk layout; shard*.c the code).
 *
 * Every operation works on one model: the source state as a list of tensors
 * (struct src), each classified as replicated, per-expert, fused LoRA A/B or
 * grouped, with a pointer to where each expert's bytes live. For a split
 * the bytes come from the checkpoint being split; for merge, reshard, check
 * and the rank load they come from the shards of a set, described by its
 * manifest. Writers then only ask for "tensor t laid out for experts
 * ids[0..L)", so split, reshard and merge share one code path and reshard
 * gives the bytes split gives.
 */
#ifndef MS_SHARD_INT_H
#define MS_SHARD_INT_H

#include <pthread.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "shard.h"
#include "stage.h"

#define META_PREFIX "msinv.ep."
#define MAX_MAP_FILE (64u * 1024u * 1024u)
#define MAX_LORA_RANK (1u << 20)

enum tkind { TK_REPLICATED, TK_EXPERT, TK_FUSED_A, TK_FUSED_B, TK_GROUPED, TK_COUNT };

#define PACK_PER_EXPERT 1u
#define PACK_FUSED 2u
#define PACK_GROUPED 4u

struct stensor {
	char *name;
	enum ms_dtype dtype;
	uint32_t ndim;
	uint64_t shape[MS_ST_MAX_RANK];
	uint64_t nbytes;
	uint32_t file;                 /* index of the source file */
	uint8_t digest[MS_SHA256_LEN]; /* of the whole source tensor */
	int has_digest;
	enum tkind kind;
	int32_t layer, expert;         /* expert: TK_EXPERT only */
	uint32_t r;                    /* fused LoRA rank */
	char *param, *part;            /* routed kinds: canonical identity */
	/* where the bytes are: data for a tensor one file holds whole; for
	 * sliced kinds, per global expert e the tensor holding it (edata),
	 * e's position there (epos) and how many experts it holds (en) */
	const uint8_t *data;
	const uint8_t **edata;
	uint32_t *epos, *en;
	/* the file tensor behind data (hashed by the caller), if any: its
	 * digest is the one of the bytes actually present */
	const struct ms_tensor *st;
};

/* The canonical slice of one expert of one tensor. */
struct srec {
	uint32_t tensor, expert;
	uint8_t want[MS_SHA256_LEN]; /* from a manifest */
	uint8_t got[MS_SHA256_LEN];  /* computed */
	int has_want, has_got;
};

struct sfile {
	char *name;
	size_t nmeta;
	struct ms_st_meta *meta;
};

struct sconfig {
	char *name;
	char *text;
	size_t len;
	uint8_t digest[MS_SHA256_LEN];
};

struct src {
	const char *label;      /* the input, for messages */
	int is_adapter;
	uint32_t E, r;
	unsigned packing;
	char *index_name;       /* NULL without an index */
	cJSON *index_meta;      /* the index's "metadata", may be NULL */
	size_t nfiles;
	struct sfile *files;
	size_t nconfigs;
	struct sconfig *configs;
	size_t n;
	struct stensor *t;      /* source order: file by file, offset order */
	size_t nrec;
	struct srec *rec;       /* sorted by layer, expert, param, part */
	char digest[MS_STATE_DIGEST_LEN];
	const struct stensor *e_from; /* the fused LoRA A that gave E, if one did */
	int rank_code;          /* the code of a LoRA shape that contradicts r:
				 * MS_EINVAL (0 means it) for an input, MS_ECHECK
				 * for a shard set being verified */
};

/* Bytes handed to a sink at a time, and each pool thread's buffer: small
 * enough that the writer's hash reads them back from cache after write(2)
 * copied them, large enough that the calls cost nothing. */
#define CHUNK (1u << 20)
/* B rows regrouped per tile: the tile stays in cache while every expert's
 * columns are picked out of it. */
#define TILE (256u << 10)

typedef int (*sink_fn)(void *ctx, const void *p, size_t n, struct ms_err *err);

struct outspec {
	const char *path;           /* where it is written (in the staging directory) */
	int64_t file;               /* only this source file's tensors; -1: all */
	const uint32_t *ids;        /* experts, local order */
	uint32_t l;
	const int32_t *lpos;        /* [E] local position, -1 when absent */
	size_t nmeta;
	const struct ms_st_meta *meta;
};

/*
 * One pool of threads does all the heavy work of an operation, taking jobs
 * in the order given: faulting in the input mappings, hashing input bytes
 * for their checks, and writing and committing each output file. Each
 * thread has its own CHUNK-byte buffer. Writers wait in write(2) and
 * fsync(2), so the pool has a thread more than there are CPUs: the disk
 * works while the others hash, and no fsync waits for another.
 */
enum job_kind { JOB_PREFAULT, JOB_HASH, JOB_HASH_B, JOB_FILE };

struct job {
	enum job_kind kind;
	const uint8_t *data;      /* PREFAULT, HASH; HASH_B: the tensor holding experts */
	uint64_t n;               /* PREFAULT, HASH: bytes */
	uint8_t *digest;          /* HASH: its SHA-256 */
	const struct stensor *t;  /* HASH_B: the B tensor */
	uint32_t en;              /* HASH_B: experts the holder holds */
	uint8_t **dst;            /* HASH_B: [en] digest of the expert at each position
				   * (NULL: not wanted) */
	uint32_t file;            /* FILE: index into the pool's outputs */
};

struct pool {
	const struct job *jobs;
	size_t njobs;
	const struct src *s;             /* FILE jobs: the model, */
	const struct outspec *os;        /* what each output holds */
	struct ms_shard_out_file *files; /* and where to say what was written */
	size_t nfiles;
	const struct ms_shard_opts *o;   /* progress (may be NULL) */
	pthread_mutex_t lock;            /* progress: done and the callback */
	size_t done;                     /* files written */
};

/* A growable job list. */
struct jobs {
	struct job *v;
	size_t n, cap;
	uint8_t ***dsts;   /* HASH_B pointer arrays, freed with the list */
	size_t ndsts;
};

/*
 * An output directory is written whole into a staging directory beside it,
 * ".<name>.tmp-<pid>-<hex>" (the name of every writer's temporary, so that
 * `msinv gc` removes a killed writer's staging with what it holds), every
 * file fsynced, then renamed into place in one step and the parent
 * fsynced: readers, a crash and the inventory see no output or all of it.
 *
 * An existing output is replaced (--force) only once the new one is
 * complete: the two are exchanged (renameat2 RENAME_EXCHANGE; where the
 * file system cannot, the old one is first moved aside to
 * ".<name>.replaced-<pid>-<hex>"), and the old one is removed only once
 * the caller accepted the publication (ms_shard_opts.publish); until then
 * it can be put back. --force replaces only what these commands write: a
 * directory of safetensors and JSON files (an empty directory needs no
 * --force). The parent is locked (flock, released when the process dies)
 * from the start to the end, so that two writers of one output cannot
 * interleave: the second is refused at once. The mechanism is stage.h's;
 * what may be replaced is this file's rule.
 */
struct stage {
	struct ms_stage s;
	int force;
	int existed;     /* the output existed: empty, or replaced under --force */
};

/* Checks of the inputs that run on the pool beside the writing (reshard):
 * jobs[0, npre) before the output files, the rest after them; then check
 * must pass before anything is published. */
struct vplan {
	const struct job *jobs;
	size_t npre, njobs;
	int (*check)(void *ctx, struct ms_err *err);
	void *ctx;
};

struct sset {
	char *dir;
	char *mpath;
	cJSON *m;
	struct src s;
	struct ms_ep_placement *pl;
	char stem[16];
	struct ms_ckpt **ck;               /* [N], NULL where not opened */
	char **names;                      /* [N] shard file names */
	char (*sdig)[MS_STATE_DIGEST_LEN]; /* [N] the manifest's shard digests */
	struct stensor **by_name;          /* src tensors sorted by name */
	/* every fault found (a check goes on after the first) */
	struct ms_ep_fault *faults;
	size_t nfaults, capfaults;
	uint64_t nfaults_more;
	uint8_t *tbad;                     /* [src n] a fault names the tensor */
	uint8_t *missing;                  /* [src n] an expert tensor absent
					    * from its own rank */
	uint32_t *rbad;                    /* [N] faults on each rank */
	uint64_t *stray;                   /* (tensor << 32 | rank) of expert
					    * tensors on another rank */
	size_t nstray;
};

/* What a verification covers beyond every byte of the opened shards. */
#define V_SHARDS 1u     /* each shard's state digest: whole sliced tensors hashed */
#define V_REASSEMBLE 2u /* sliced tensors put back together: the source's digests */

extern const char *const shard_tkind_names[TK_COUNT];

int shard_placement_builtin(enum ms_ep_placement_kind kind, uint32_t e, uint32_t n,
			    struct ms_ep_placement **out, struct ms_err *err);

int shard_json_u64(const cJSON *j, uint64_t max, uint64_t *out);

int shard_placement_from_ranks(const cJSON *ranks, const char *label, uint32_t e,
				uint32_t n, struct ms_ep_placement **out,
				struct ms_err *err);

int shard_placement_equal(const struct ms_ep_placement *a, const struct ms_ep_placement *b);

int shard_placement_copy(const struct ms_ep_placement *a, struct ms_ep_placement **out,
			 struct ms_err *err);

void shard_src_release(struct src *s);

const struct sconfig *shard_src_config(const struct src *s, const char *name);

int shard_is_sliced(enum tkind k);

uint64_t shard_slice_bytes(const struct stensor *t, uint32_t e_total);

void shard_local_shape(const struct stensor *t, uint32_t l, uint64_t *shape);

int shard_shape_nbytes(enum ms_dtype dt, uint32_t ndim, const uint64_t *shape,
			uint64_t *out);

void shard_shape_text(uint32_t ndim, const uint64_t *shape, char *buf, size_t n);

int shard_analyze(struct src *s, uint32_t e_given, const char *given_from,
		  struct ms_err *err);

void shard_packing_str(unsigned packing, char *buf, size_t n);

int shard_src_add_config(struct src *s, const char *name, const char *text, size_t len,
			 const uint8_t *digest, struct ms_err *err);

int shard_src_from_ckpt(struct src *s, const struct ms_ckpt *c, struct ms_err *err);

int shard_src_point_whole(struct src *s, struct ms_err *err);

int shard_src_state_digest(const struct src *s, char out[MS_STATE_DIGEST_LEN],
			   struct ms_err *err);

int shard_sink_sha(void *ctx, const void *p, size_t n, struct ms_err *err);

void shard_gather(uint8_t *d, const uint8_t *p, uint64_t m, size_t stride, size_t es);

int shard_emit(const struct src *s, const struct stensor *t, const uint32_t *ids,
		uint32_t l, uint8_t *buf, sink_fn sink, void *ctx, struct ms_err *err);

int shard_out_plan(const struct src *s, const struct outspec *o,
		   struct ms_shard_out_file *res, struct ms_err *err);

int shard_out_stream(const struct src *s, const struct outspec *o, uint8_t *buf,
		     struct ms_st_writer **out, struct ms_err *err);

int shard_out_commit(const struct src *s, const struct outspec *o, struct ms_st_writer *w,
		     struct ms_shard_out_file *res, struct ms_err *err);

int shard_sha_fail(int rc, struct ms_err *err);

int shard_pool_run(struct pool *p, int nthreads, struct ms_err *err);

void shard_jobs_release(struct jobs *j);

struct job *shard_jobs_add(struct jobs *j, enum job_kind kind);

void shard_jobs_sort(struct jobs *j, size_t from);

int shard_rec_jobs(struct src *s, struct jobs *jl, struct ms_err *err);

void shard_rec_finish(struct src *s);

int shard_hash_records(struct src *s, int nthreads, struct ms_err *err);

const char *shard_stem_of(const struct src *s);

char *shard_name(const char *stem, uint32_t rank, uint32_t n);

int shard_manifest_text(const struct src *s, const struct ms_ep_placement *pl,
			const struct ms_shard_out_file *files, char **text, size_t *len,
			struct ms_err *err);

int shard_result_new(const struct src *s, const struct ms_ep_placement *pl, size_t nfiles,
		     struct ms_shard_result **out, struct ms_err *err);

int shard_foreign_shard(const char *dir, const char *stem, uint32_t n, char **found,
			uint32_t *found_n, struct ms_err *err);

int shard_check_base(const struct src *s, const struct ms_shard_opts *o, int code,
		     struct ms_err *err);

void shard_sset_release(struct sset *ss);

int shard_sset_check(struct sset *ss, unsigned what, struct ms_err *err);

int shard_sset_jobs(struct sset *ss, unsigned what, struct jobs *jl, size_t *npre,
		    struct ms_err *err);

void shard_sset_jobs_done(struct sset *ss, unsigned what);

int shard_sset_hash_verify(struct sset *ss, int nthreads, unsigned what, struct ms_err *err);

int shard_sset_open(const char *path, int64_t only, uint32_t expect_n, int hash,
		    unsigned what, int nthreads, const struct ms_shard_opts *o, struct sset *ss,
		    struct ms_err *err);

#endif
