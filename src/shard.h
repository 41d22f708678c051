/*
 * shard.h: expert-parallel (EP) sharding of LoRA adapters and checkpoints:
 * placement, split, merge, reshard, and the EP-aware load of one rank.
 *
 * Why: a warm start that ignored expert parallelism once made every EP rank
 * load the same adapter block; the run started, reported success and
 * trained the wrong experts. Here the expert -> rank placement is always
 * written down (never inferred from file order), every shard says which
 * rank and which global experts it holds, and every expert's bytes have a
 * layout-independent digest, so a wrong placement cannot load silently.
 *
 * What is sharded (tensor names are classified by names.h):
 *
 *   per-expert     one tensor per expert: "...experts.<e>.<proj>.lora_A.weight"
 *                  [r, in], "lora_B.weight" [out, r], Mixtral w1/w2/w3, base
 *                  weights and their NVFP4 companions (.weight_scale,
 *                  .weight_scale_2, ...). Kept whole, under their global
 *                  names, on the rank that owns expert e.
 *   fused LoRA     PEFT target_parameters on fused experts: A [E*r, in] with
 *                  row e*r+k, B [out, r*E] with column k*E+e (the expert
 *                  index is the FASTEST in B). A shard holds A rows le*r+k
 *                  and B columns k*E_local+le for its local experts le, so it
 *                  is itself a valid fused adapter an EP rank's local module
 *                  loads as is. (Cutting B into contiguous column blocks per
 *                  expert is the classic bug: it scrambles experts.)
 *                  E = rows(A) / r, r from adapter_config.json ("r", honouring
 *                  "rank_pattern" with PEFT's key "<module>.<parameter>").
 *                  Nested wrappers ("experts.lora_A", "experts.base_layer.
 *                  lora_A") are resolved to parameters as PEFT builds them:
 *                  innermost is the first parameter the module declares
 *                  (gate_up_proj, gate_proj, up_proj, down_proj), and for
 *                  unknown names the order of target_parameters; an order
 *                  whose shapes contradict it (gate_up_proj is [2I, H] where
 *                  down_proj is [H, I]) is rejected in favour of one that fits.
 *   grouped        every expert in one tensor, expert dimension first
 *                  [E, ...]: fused 3-D experts (experts.gate_up_proj),
 *                  Megatron grouped experts.weight1/weight2, their scales.
 *                  A shard holds [E_local, ...] in local order.
 *   replicated     everything else (attention and its LoRA, shared experts,
 *                  routers, norms, embeddings, lm_head): the same bytes on
 *                  every rank, marked replicated in the manifest.
 *
 * Placement of E experts on N ranks: contiguous (global = rank * E/N +
 * local), round-robin (global = local * N + rank), or an explicit map file
 * {"ranks": [[global ids of rank 0], [.. of rank 1], ...]} (local order is
 * the listed order). The built-ins refuse E not divisible by N; a map may
 * place any number of experts on each rank, every expert exactly once.
 *
 * On disk, a shard set is a directory of:
 *   <stem>-ep<rank:05d>-of-<N:05d>.safetensors   one per rank (stem
 *       "adapter_model" for adapters, "model" for checkpoints); its
 *       __metadata__ keeps the source's keys and adds msinv.ep.version,
 *       msinv.ep.rank, msinv.ep.size, msinv.ep.num_experts,
 *       msinv.ep.placement, msinv.ep.experts (global ids, local order,
 *       comma-separated) and msinv.ep.source (the source state digest);
 *   the source's config files (adapter_config.json, config.json, ...);
 *   ep_manifest.json (MS_EP_MANIFEST): format and version, E, N, the
 *       placement name and table, r and packing, the source state digest,
 *       its files (names, __metadata__, index metadata), every source tensor
 *       (name, dtype, shape, SHA-256, kind, expert / parameter / r), each
 *       shard's file, experts and state digest, and for every (layer,
 *       expert, parameter, part) the SHA-256 of the expert's canonical slice
 *       (A_e as [r, in] contiguous, B_e as [out, r] contiguous, a per-expert
 *       tensor's bytes, row e of a grouped tensor): the identity of each
 *       expert's weights whatever the layout: at every N and placement,
 *       and parameter by parameter between per-expert and fused forms.
 *
 * Output is all or nothing. Split, merge and reshard write their whole
 * output directory (every file fsynced, the manifest last) into a staging
 * directory beside it, ".<name>.tmp-<pid>-<hex>" (which `msinv gc`
 * removes when its writer died), and publish it by renaming it into place
 * in one step (renameat2 RENAME_NOREPLACE; the parent is fsynced). A
 * failure at any point, or a crash, leaves no output and nothing staged
 * that gc does not remove; the parent directory is locked (flock) for the
 * whole operation, so two writers of one output cannot interleave. An
 * existing output is replaced only with force, only if it holds nothing
 * but safetensors and JSON files (what these commands write), and only
 * once the new one is complete: the two are exchanged in one step
 * (RENAME_EXCHANGE) and the old one removed after the caller accepted the
 * publication (see ms_shard_opts.publish), so that a failure puts it
 * back. An existing empty directory is replaced without force.
 *
 * Guarantees, checked by the tests: merge(split(A, N)) has the state digest
 * of A (and restores A's files, __metadata__ and index) for every N and
 * placement; reshard(split(A, N), M) writes the same bytes as split(A, M).
 */
#ifndef MS_SHARD_H
#define MS_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "common.h"

#define MS_EP_MANIFEST "ep_manifest.json"
#define MS_EP_MANIFEST_FORMAT "msinv-ep-manifest"
#define MS_EP_MANIFEST_VERSION 1
#define MS_EP_MAX_RANKS 65536u
#define MS_EP_MAX_EXPERTS 65536u
#define MS_EP_MAX_MANIFEST (512u * 1024u * 1024u)

enum ms_ep_placement_kind {
	MS_EP_PLACEMENT_CONTIGUOUS,
	MS_EP_PLACEMENT_ROUND_ROBIN,
	MS_EP_PLACEMENT_MAP,
};

struct ms_ep_placement {
	enum ms_ep_placement_kind kind;
	uint32_t num_experts;  /* E */
	uint32_t ep_size;      /* N */
	uint32_t *rank_of;     /* [E] rank holding global expert e */
	uint32_t *local_of;    /* [E] its index on that rank */
	uint32_t *first;       /* [N + 1] rank r holds ids[first[r] .. first[r+1]) */
	uint32_t *ids;         /* [E] global ids, rank by rank, local order */
};

/* "contiguous", "round-robin", "map". */
const char *ms_ep_placement_name(enum ms_ep_placement_kind kind);

/* Build a placement. spec is "contiguous" (also NULL), "round-robin" or the
 * path of a map file. For the built-ins num_experts and ep_size must be
 * given and E a multiple of N; for a map either may be 0 (taken from the
 * map) or must agree with it. MS_EINVAL names the rule broken. */
int ms_ep_placement_new(const char *spec, uint32_t num_experts, uint32_t ep_size,
			struct ms_ep_placement **out, struct ms_err *err);
/* A map from JSON text {"ranks": [[...], ...]}; label names it in errors. */
int ms_ep_placement_from_json(const char *text, size_t len, const char *label,
			      uint32_t num_experts, uint32_t ep_size,
			      struct ms_ep_placement **out, struct ms_err *err);
void ms_ep_placement_free(struct ms_ep_placement *p);

struct ms_shard_result;

/* Options of split, merge, reshard and check (zero-initialise). */
struct ms_shard_opts {
	uint32_t ep_size;       /* split, reshard: N (required) */
	const char *placement;  /* split, reshard: spec as above; NULL contiguous */
	uint32_t num_experts;   /* split: E; 0 infers it from the tensors and
				 * config.json (an adapter that adapts only
				 * some experts needs it) */
	/* split, check: the routed expert count of the base model the
	 * adapter was trained on (0: unknown), and what names it in messages
	 * (ms_ep_base_experts finds both). A fused LoRA's E is rows / r, so a
	 * wrong r in adapter_config.json gives another E with every shape
	 * consistent: split refuses a difference (MS_EINVAL), check reports
	 * it as a fault (MS_ECHECK). */
	uint32_t base_experts;
	const char *base_label;
	int force;              /* overwrite existing outputs */
	int dry_run;            /* plan only: classify and place, write nothing
				 * (no hashing; a reshard still opens and checks
				 * the structure of its input shards) */
	int nthreads;           /* threads, 0: one per CPU (and one more
				 * while files are written) */
	/* Called after each output file is written (may be NULL); path is
	 * the file's final path. */
	void (*progress)(void *ctx, const char *path, size_t done, size_t total);
	void *progress_ctx;
	/* Called once the output is in place, before an output it replaced
	 * is removed (may be NULL; never on a dry run): res is the result
	 * the operation returns, its paths the final ones. A caller that
	 * records the outputs elsewhere (an inventory) does it here and
	 * commits. When it fails, the output is taken away again, what it
	 * replaced is put back, and the operation fails with its error (the
	 * directory is as it was before the call). */
	int (*publish)(void *ctx, const struct ms_shard_result *res, struct ms_err *err);
	void *publish_ctx;
};

/* One written (or, on a dry run, planned) file. */
struct ms_shard_out_file {
	char *path;
	uint32_t rank;          /* EP rank; UINT32_MAX for a merged file */
	uint32_t nexperts;
	uint32_t *experts;      /* global expert ids, local order */
	uint64_t ntensors;
	uint64_t nbytes;        /* tensor bytes */
	char state_digest[MS_STATE_DIGEST_LEN]; /* its tensors; "" on a dry run */
};

/*
 * One fault a check of a shard set found (ms_shard_check reports them all).
 * Kinds, from the most telling:
 *   SAME_BLOCK  an expert holds the bytes of an expert placed on another
 *               rank: a warm start that ignored EP loaded one block everywhere
 *   SWAP        two experts of one rank hold each other's bytes
 *   WRONG_EXPERT an expert holds the bytes of another expert of its own rank
 *               (not a swap: a shift or a copy within the rank)
 *   MISSING     a tensor the rank should hold is not there
 *   DUPLICATE   an expert's tensor is on its own rank and on another one:
 *               it would be loaded twice
 *   MISPLACED   an expert's tensor is on another rank than the placement's,
 *               and not on its own
 *   SHAPE       a tensor with another dtype or shape than the rank's
 *   UNKNOWN     a tensor that is not part of the source
 *   REPLICA     a replicated tensor differs between ranks
 *   DIGEST      bytes that match neither the manifest nor any other expert
 *   STATE       a shard's state digest is not the manifest's
 *   SOURCE      the manifest's tensors are not its source state, or the
 *               shards put back together are not the source's tensors
 *   EXPERTS     the set's expert count is not the base model's
 *               (ms_shard_opts.base_experts): a fused LoRA read with a
 *               wrong r in adapter_config.json
 */
enum ms_ep_fault_kind {
	MS_EP_FAULT_SAME_BLOCK,
	MS_EP_FAULT_SWAP,
	MS_EP_FAULT_WRONG_EXPERT,
	MS_EP_FAULT_MISSING,
	MS_EP_FAULT_DUPLICATE,
	MS_EP_FAULT_MISPLACED,
	MS_EP_FAULT_SHAPE,
	MS_EP_FAULT_UNKNOWN,
	MS_EP_FAULT_REPLICA,
	MS_EP_FAULT_DIGEST,
	MS_EP_FAULT_STATE,
	MS_EP_FAULT_SOURCE,
	MS_EP_FAULT_EXPERTS,
};

/* "same-block", "swap", "wrong-expert", "missing", "duplicate", "misplaced",
 * "shape", "unknown", "replica", "digest", "state", "source", "experts". */
const char *ms_ep_fault_name(enum ms_ep_fault_kind kind);

struct ms_ep_fault {
	enum ms_ep_fault_kind kind;
	char *tensor;           /* NULL for a fault of a whole shard or set */
	char *file;             /* the shard (or manifest) it is in */
	int64_t rank;           /* the rank it is on; -1 when not one rank */
	int64_t expert;         /* the global expert concerned; -1 if none */
	int64_t other_expert;   /* the expert whose bytes it holds, the swap
				 * partner; -1 if none */
	int64_t other_rank;     /* the rank of other_expert, or where the
				 * placement puts a misplaced expert; -1 */
	char *msg;              /* the one-line description */
};

/* At most this many faults are kept; nfaults_more counts the rest. */
#define MS_EP_MAX_FAULTS 100000u

/*
 * What an operation produced: everything an inventory needs to register
 * the outputs (kind, source digest, placement, one entry per shard with
 * its rank, experts and state digest), in one place.
 */
struct ms_shard_result {
	int is_adapter;
	char source_digest[MS_STATE_DIGEST_LEN]; /* the unsharded state ("" dry run) */
	uint32_t num_experts, ep_size;
	struct ms_ep_placement *placement;      /* owned */
	char packing[48];     /* "per-expert", "fused", "grouped", joined by '+' */
	uint32_t r;           /* the adapter's default rank; 0 for checkpoints */
	uint64_t nreplicated; /* source tensors replicated on every rank */
	uint64_t nrouted;     /* source tensors holding routed experts */
	char *manifest_path;  /* written manifest; NULL for merge and dry runs */
	size_t nfiles;
	struct ms_shard_out_file *files;
	/* ms_shard_check that failed a check (MS_ECHECK): every fault, in
	 * the order found (the first is also the error's message) */
	size_t nfaults;
	struct ms_ep_fault *faults;
	uint64_t nfaults_more;
};

void ms_shard_result_free(struct ms_shard_result *r);

/* Split the adapter or checkpoint at src (a file, a directory, a sharded
 * checkpoint with its index) into o->ep_size shards in the new directory
 * dir (its parent is created if missing; see above for an existing one).
 * Refuses an input that already is an EP shard or shard set. On failure
 * dir is as it was. */
int ms_shard_split(const char *src, const char *dir, const struct ms_shard_opts *o,
		   struct ms_shard_result **out, struct ms_err *err);

/* Verify the shard set in dir (see ms_shard_check) and write the original
 * layout back to the new directory out_dir: the source's files,
 * __metadata__, index and config files. The result's files are the
 * restored safetensors files. */
int ms_shard_merge(const char *dir, const char *out_dir, const struct ms_shard_opts *o,
		   struct ms_shard_result **out, struct ms_err *err);

/* Verify the shard set in dir and write it re-split for o->ep_size ranks
 * (and o->placement) to out_dir: the same bytes split(source, M) writes.
 * Checked: what ms_shard_check checks, except the input shards' own state
 * digests and the reassembly of the sliced tensors (every byte the shards
 * hold is still checked, through the replica, per-expert and canonical
 * expert digests, and the manifest's source digest against its tensors).
 * The check runs on the same threads as the writing of the outputs into
 * the staging directory, which is published only once it passed. Every
 * input byte is hashed once (for the check), every output byte once (for
 * the new shards' digests). */
int ms_shard_reshard(const char *dir, const char *out_dir, const struct ms_shard_opts *o,
		     struct ms_shard_result **out, struct ms_err *err);

/*
 * Verify a shard set without writing: the manifest is well formed and
 * agrees with the tensor names and config files (classification, r, E,
 * config digests); one shard per rank, no shard of another set in the
 * directory, each shard's metadata states its rank, size, placement and
 * experts as the manifest does; each shard holds exactly the tensors its
 * rank should, with the right dtypes and shapes; replicated tensors are
 * byte-identical on every rank; every expert's canonical slices match the
 * manifest; each shard's state digest matches; the shards reassemble to
 * tensors with the manifest's digests, whose state digest is the source's.
 * Returns MS_EINVAL for a malformed or incomplete set (missing shard, one
 * from another EP size, a rank given twice), MS_ECHECK when bytes differ
 * (a replica that differs, a digest the manifest gets wrong) or a shard
 * holds the wrong tensors. A check does not stop at the first fault: every
 * rank and every tensor is checked, and on MS_ECHECK *out (when out is
 * given) describes the set with every fault found (faults above; err holds
 * the first). o may be NULL; out (may be NULL) describes the set.
 */
int ms_shard_check(const char *dir, const struct ms_shard_opts *o,
		   struct ms_shard_result **out, struct ms_err *err);

/*
 * EP-aware loading: the tensors one rank of a run must load.
 *
 * manifest_or_dir is a shard set directory or its ep_manifest.json;
 * ep_size and rank are the run's. A set made for another EP size is
 * refused (MS_EINVAL) with a message saying to run
 * `msshard reshard --ep-size <ep_size>`. Otherwise the rank's shard is
 * opened and hashed, and before returning the placement, the shard's
 * metadata (rank, size, placement, experts), its tensor set, its state
 * digest, the replicated tensors' digests and every local expert's
 * canonical digests are checked against the manifest (MS_ECHECK on a
 * difference). *out owns an open checkpoint of exactly that shard file,
 * whose tensors the caller loads (per-expert tensors keep their global
 * names; fused and grouped tensors hold the local experts in local order).
 */
struct ms_ep_rank {
	uint32_t rank, ep_size, num_experts;
	enum ms_ep_placement_kind placement;
	uint32_t nexperts;
	uint32_t *experts;      /* global ids, local order */
	char *shard_path;
	char state_digest[MS_STATE_DIGEST_LEN];  /* of the shard */
	char source_digest[MS_STATE_DIGEST_LEN]; /* of the unsharded state */
	int is_adapter;
	struct ms_ckpt *ckpt;   /* the shard, hashed; owned */
};

/* The routed expert count a config.json text declares ("num_experts",
 * "num_local_experts", "n_routed_experts", "moe_num_experts"); 0 when it
 * declares none. label names it in errors. */
int ms_ep_config_experts(const char *text, size_t len, const char *label, uint32_t *e,
			 struct ms_err *err);

struct ms_inv;

/*
 * The routed expert count of the base model of an adapter, for
 * ms_shard_opts.base_experts. base (may be NULL) is a checkpoint directory,
 * or a file in one, whose config.json is read, or else a state reference
 * (label, digest) whose recorded config.json is read (inv needed). With
 * base NULL and inv given: the nearest ancestor of the state source_digest
 * whose recorded config.json declares an expert count; *e = 0 when there
 * is none (or the state is not recorded). *label (owned, NULL when *e is
 * 0) names where the count came from. A base that declares no count is
 * MS_EINVAL.
 */
int ms_ep_base_experts(struct ms_inv *inv, const char *base, const char *source_digest,
		       uint32_t *e, char **label, struct ms_err *err);

int ms_ep_load_rank(const char *manifest_or_dir, uint32_t ep_size, uint32_t rank,
		    struct ms_ep_rank **out, struct ms_err *err);
void ms_ep_rank_free(struct ms_ep_rank *r);

/* ---- the record (lineage.c) -------------------------------------------- */

enum ms_shard_op {
	MS_SHARD_OP_SPLIT,
	MS_SHARD_OP_MERGE,
	MS_SHARD_OP_RESHARD,
};
/* "split", "merge" or "reshard". */
const char *ms_shard_op_name(enum ms_shard_op op);
/* Record what an operation wrote (r, its result) in inv: each shard as a
 * state derived from the unsharded source by the operation (a split
 * records its input first; a reshard derives from the source when the
 * inventory knows it), with the EP size, placement, and the rank's experts
 * on the edge; a shard of rank R gets the label "LABEL/rankR" when label
 * is given. A merge writes the source's own state again: the output
 * directory input is recorded as another copy of it, labelled label. Run
 * it inside the batch that publishes the output. */
struct ms_inv;
int ms_shard_register(struct ms_inv *inv, enum ms_shard_op op, const char *input,
		      const struct ms_shard_result *r, const char *label, struct ms_err *err);

#endif
