/*
 * footprint.h: the per-GPU memory of a planned run, by state and layout,
 * computed from tensor shapes alone (safetensors headers or inventory
 * records; no tensor byte is read).
 *
 * The question it answers: what does every GPU of an expert-parallel run
 * hold resident, which weights does it hold twice (the NVFP4 base kept both
 * rowwise and columnwise doubled the frozen base on every GPU), what would
 * building the columnwise copy on demand save, and does it fit the budget.
 *
 * ---- The plan (a JSON file, outside input) ---------------------------------
 *
 * ms(5) documents the whole format for users ("Run plans"); this is the
 * parser's contract.
 *
 *   {"name": "grpo-run",
 *    "ep_size": 8,
 *    "placement": "contiguous",
 *    "budget_gib": 80,
 *    "num_experts": 256,
 *    "states": [
 *      {"role": "base",         "state": "sha256:<64 hex>"},
 *      {"role": "base_colwise", "state": "glm-base-nvfp4-colwise"},
 *      {"role": "adapter",      "path": "ckpt/adapter", "repr": "as-is"},
 *      {"role": "reference",    "path": "/ckpt/model", "repr": "nvfp4-both"}],
 *    "outputs": "/runs/x"}
 *
 * Top-level keys:
 *   ep_size      required integer, 1 <= ep_size <= MS_FP_MAX_EP: the
 *                expert-parallel size (ranks the routed experts divide over).
 *   states       required array of 1..MS_FP_MAX_ENTRIES entries (below).
 *   placement    optional "contiguous" (default: rank k owns experts
 *                [k*E/ep, (k+1)*E/ep)) or "round-robin" (expert e on rank
 *                e % ep).
 *   budget_gib   optional number, 0 < budget_gib <= MS_FP_MAX_BUDGET_GIB:
 *                the memory each GPU may hold, in GiB (2^30 bytes), rounded
 *                down to whole bytes. Without it no budget is checked.
 *   num_experts  optional integer, 1..MS_FP_MAX_EXPERTS: the routed expert
 *                count per MoE layer, for tensors whose shape does not say it
 *                (fused LoRA factors [E*r, in]); it must agree with what the
 *                tensors show.
 *   name         optional string: the run's name, shown in the report.
 *   outputs      optional string: where the run writes (used by launch).
 *   train        optional object, the training run (the trainer reads all of
 *                it; the count reads): "lora" {"r": 1..MS_FP_MAX_LORA_R,
 *                "targets": [1..MS_FP_MAX_TARGETS module names], "alpha"
 *                and "dropout" numbers}, "optimizer" {"name": a string;
 *                ms_fp_calc_finish counts "adamw" only}, "batch" and
 *                "seq_len" integers
 *                (named in the report; activations are not counted). Other
 *                keys in it are the trainer's.
 * Any other top-level key is left to the other consumers of the plan
 * (msinv launch, the trainer) and ignored here.
 *
 * Each entry of "states":
 *   role         required string, 1..MS_FP_MAX_ROLE bytes of [A-Za-z0-9_.-];
 *                unique within the plan (it names the entry in the report).
 *   state        an inventoried state: "sha256:<64 lowercase hex>" or a label
 *                (1..MS_FP_MAX_REF bytes, no control characters). The caller
 *                resolves it to its tensor list.
 *   path         a checkpoint (file or directory, see checkpoint.h) whose
 *                headers give the shapes: what-if planning before anything
 *                is converted. A relative path is relative to the directory
 *                of the plan file (ms_fp_plan_load resolves it).
 *                Exactly one of state and path.
 *   repr         optional representation, default "as-is":
 *                  "as-is"             every tensor as it is stored
 *                  "bf16"              quantizable weights at 2 bytes/element
 *                  "nvfp4-rowwise"     quantizable weights as NVFP4 W
 *                  "nvfp4-columnwise"  quantizable weights as NVFP4 W^T
 *                  "nvfp4-both"        both resident (flagged: duplicate)
 *                  "nvfp4-ondemand"    rowwise resident, columnwise built per
 *                                      layer when backward needs it: one
 *                                      layer's columnwise is transient
 *   experts      optional "per-expert" (default) or "fused": how a fused
 *                3-D expert tensor is counted when quantized, as msconvert
 *                --experts writes it (below)
 * Unknown keys inside an entry are ignored; known keys must have the right
 * type. A key given twice in one object is an error. Every error names the
 * plan (its label) and the key, e.g.
 *   plan 'run.json': key 'states[2].repr': unknown representation 'fp4'
 *
 * ---- Rules of the count ------------------------------------------------------
 *
 * Quantizable weight (ms_fp_quantizable; msconvert's default selection,
 * ms_quant_default_selected, which the tests hold it to): a floating tensor
 * (BF16, F16, F32) named "*.weight" with 2 dimensions whose module is an
 * attention, routed-expert, shared-expert or dense-MLP projection, or a
 * floating fused 3-D expert tensor "<m>.experts.gate_up_proj" [E, 2I, H] /
 * "<m>.experts.down_proj" [E, H, I] (ms_name_fused_experts). Embeddings,
 * norms, routers/gates, lm_head, biases and everything else keep their
 * dtype under every repr; so do tensors already quantized (packed U8/F4
 * weights and their scales).
 *
 * NVFP4 bytes of a matrix [R, C] (NVFP4.md): Cp = roundup(C, 16) (the codec
 * pads with zeros), packed R*Cp/2 + E4M3 scales R*Cp/16 + 4 (FP32 tensor
 * scale) = 0.5625 B/element when C % 16 == 0. Rowwise quantizes W [R, C];
 * columnwise W^T [C, R], so its padding is along R. A fused 3-D expert
 * tensor counts E matrices [R, C] ("experts": "fused": one tensor scale
 * per expert, [E]), or per expert (the default) its modules: a gate_up
 * slice is a gate and an up matrix [R/2, C], each with its tensor scale.
 *
 * Placement: routed-expert tensors (names.h, ms_name_is_routed_expert) are
 * divided over the EP ranks; the rest is replicated on every rank. A
 * per-expert tensor lives on the rank that owns its expert; a fused tensor
 * [E, ...] (or a fused LoRA factor) is split evenly along its expert axis.
 * E, per MoE layer, is the plan's num_experts, else the fused tensors' dim 0
 * or the largest expert id + 1 seen in that layer in any entry. E % ep_size
 * must be 0 (both placements), else MS_EINVAL naming the layer. A GPU's
 * bytes are computed for every rank; the per-GPU number is the largest.
 *
 * Layout of a tensor counted as stored: a columnwise name (names.h) is
 * nvfp4-columnwise; a packed weight (U8, F4, weight_packed, _blocks) is
 * nvfp4-rowwise (the rowwise quantized layout; MX formats included); scales,
 * tensor scales and input scales go with their weight (an FP8 weight's
 * scales are as-is); LoRA factors and the rest are as-is.
 *
 * Duplicates: a weight (the module of a .weight and its quantization
 * companions; any other tensor by its name) present in more than one
 * (entry, layout) copy is resident more than once: e.g. a base named twice,
 * as an NVFP4 rowwise and a columnwise state, or one entry with repr
 * nvfp4-both, or a bf16 and an NVFP4 copy of the same base. Every such
 * weight is counted and reported, grouped by the set of copies holding it.
 *
 * On demand: an nvfp4-ondemand entry holds its rowwise copy resident plus
 * the columnwise copy of one layer at a time: its transient cost per GPU is
 * the largest layer's columnwise bytes on a GPU. For every resident
 * columnwise copy whose rowwise twin is also resident, the report says what
 * building it on demand instead would save.
 *
 * Training state (a "train" object): trainable parameters are r*(a+b) for
 * every [a, b] weight of the 'base' entry a lora target names (leaf name as
 * PEFT matches it, "experts" for routed experts, "shared_experts"), per
 * expert of a fused [E, a, b] one; without "lora", the LoRA tensors of the
 * 'adapter' entry. They are placed as the tensor they come from. Bytes per
 * parameter: MS_FP_TRAIN_PARAM_BYTES (unless an 'adapter' entry holds the
 * weights), MS_FP_TRAIN_GRAD_BYTES, MS_FP_TRAIN_ADAMW_BYTES; added to each
 * rank's total. Not counted, and said so in the report: activations, the
 * CUDA context, workspaces, communication buffers, fragmentation.
 *
 * ---- Use ----------------------------------------------------------------------
 *
 *   ms_fp_plan_load(path, &plan, &err);
 *   ms_fp_calc_new(plan, &calc, &err);
 *   for each entry i:
 *     path entry:  ms_fp_calc_add_path(calc, i, &err)   (headers only)
 *     state entry: ms_fp_calc_add_state(calc, i, inv, ref, &err)
 *                  (or ms_fp_calc_add_tensors / ms_fp_calc_add_ckpt with
 *                  the state's tensors)
 *   ms_fp_calc_finish(calc, &report, &err);
 *   ms_fp_report_text(report, &buf, &err) or ms_fp_report_json(...);
 *   exit status: report->over_budget ? 1 : 0
 *   ms_fp_report_free(report); ms_fp_calc_free(calc); ms_fp_plan_free(plan);
 */
#ifndef MS_FOOTPRINT_H
#define MS_FOOTPRINT_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "safetensors.h"
#include "checkpoint.h"

#define MS_FP_MAX_PLAN (1u << 20)       /* plan file bytes */
#define MS_FP_MAX_ENTRIES 256u
#define MS_FP_MAX_ROLE 64u
#define MS_FP_MAX_REF 4096u             /* state label or path bytes */
#define MS_FP_MAX_EP 4096u
#define MS_FP_MAX_EXPERTS 65536u
#define MS_FP_MAX_BUDGET_GIB 1048576.0  /* 1 PiB per GPU: past any device */
#define MS_FP_MAX_LORA_R 65536u
#define MS_FP_MAX_TARGETS 64u

/* Bytes per trainable parameter (the "train" section): the LoRA weights
 * in bf16 (what forward and backward read), their gradients in fp32
 * (accumulated over grad_accum micro-batches), and AdamW's state: an fp32
 * master copy and two fp32 moments. */
#define MS_FP_TRAIN_PARAM_BYTES 2u
#define MS_FP_TRAIN_GRAD_BYTES 4u
#define MS_FP_TRAIN_ADAMW_BYTES 12u

enum ms_fp_repr {
	MS_FP_REPR_AS_IS,
	MS_FP_REPR_BF16,
	MS_FP_REPR_NVFP4_ROWWISE,
	MS_FP_REPR_NVFP4_COLUMNWISE,
	MS_FP_REPR_NVFP4_BOTH,
	MS_FP_REPR_NVFP4_ONDEMAND,
	MS_FP_REPR_COUNT
};

enum ms_fp_placement {
	MS_FP_PLACEMENT_CONTIGUOUS,
	MS_FP_PLACEMENT_ROUND_ROBIN,
};

/* How a report row's bytes are held. */
enum ms_fp_layout {
	MS_FP_LAYOUT_AS_IS,            /* at the stored dtype, not quantized */
	MS_FP_LAYOUT_BF16,             /* quantizable weights at 2 B/element */
	MS_FP_LAYOUT_NVFP4_ROWWISE,
	MS_FP_LAYOUT_NVFP4_COLUMNWISE,
	MS_FP_LAYOUT_NVFP4_COLUMNWISE_TRANSIENT, /* on demand: largest layer */
	MS_FP_LAYOUT_COUNT
};

/* Names as the plan and the report spell them: "as-is", "bf16",
 * "nvfp4-rowwise", "nvfp4-columnwise", "nvfp4-both", "nvfp4-ondemand";
 * "contiguous", "round-robin"; layouts "as-is", "bf16", "nvfp4-rowwise",
 * "nvfp4-columnwise", "nvfp4-columnwise-transient". Parsers return MS_OK or
 * MS_EINVAL. */
const char *ms_fp_repr_name(enum ms_fp_repr r);
int ms_fp_repr_parse(const char *s, enum ms_fp_repr *out);
const char *ms_fp_placement_name(enum ms_fp_placement p);
int ms_fp_placement_parse(const char *s, enum ms_fp_placement *out);
const char *ms_fp_layout_name(enum ms_fp_layout l);

/* ---- the plan ------------------------------------------------------------------ */

struct ms_fp_entry {
	char *role;
	char *state;          /* NULL for a path entry */
	char *path;           /* as written in the plan; NULL for a state entry */
	char *resolved;       /* path joined to the plan's directory when relative
			       * (ms_fp_plan_load), else a copy of path */
	enum ms_fp_repr repr;
	int experts_fused;    /* "experts": "fused" */
};

/* A parsed plan; every string is owned by it. Read-only for callers. */
struct ms_fp_plan {
	char *label;          /* the name errors use (the file's path) */
	char *name;           /* NULL when absent */
	char *outputs;        /* NULL when absent */
	uint32_t ep_size;
	enum ms_fp_placement placement;
	uint32_t num_experts; /* 0 when absent */
	int has_budget;
	uint64_t budget_bytes;
	double budget_gib;
	size_t nentries;
	struct ms_fp_entry *entries;
	struct ms_fp_train_plan {
		int present;           /* the plan has a "train" object */
		uint32_t lora_r;       /* 0: no "train"."lora" */
		size_t ntargets;
		char **targets;        /* "train"."lora"."targets" */
		char *optimizer;       /* "train"."optimizer"."name"; NULL:
					* absent (adamw) */
		uint64_t batch, seq_len; /* 0 when absent (activations: not
					  * counted, only named) */
	} train;
};

/* Parse len bytes of plan JSON (need not be NUL-terminated). label names the
 * plan in errors. Relative paths are kept as written (resolved = path).
 * Returns MS_OK, MS_EINVAL (the error names label and key) or MS_ENOMEM. */
int ms_fp_plan_parse(const char *json, size_t len, const char *label,
		     struct ms_fp_plan **out, struct ms_err *err);
/* Read (at most MS_FP_MAX_PLAN bytes) and parse the plan file at path;
 * relative entry paths resolve against its directory. MS_EIO when the file
 * cannot be read. */
int ms_fp_plan_load(const char *path, struct ms_fp_plan **out,
		    struct ms_err *err);
void ms_fp_plan_free(struct ms_fp_plan *p);

/* ---- the count ----------------------------------------------------------------- */

/* One tensor as the caller knows it (an inventory record or a header). */
struct ms_fp_tensor {
	const char *name;     /* borrowed for the duration of the call */
	enum ms_dtype dtype;
	uint32_t ndim;        /* <= MS_ST_MAX_RANK */
	uint64_t shape[MS_ST_MAX_RANK];
};

/* Is a tensor a quantizable weight (the selection rule above)? shape
 * tells a fused 3-D expert tensor; NULL: no tensor of 3 dimensions is. */
int ms_fp_quantizable(const char *name, enum ms_dtype dtype, uint32_t ndim,
		      const uint64_t *shape);

/* NVFP4 bytes of one [rows, cols] matrix in layout (rowwise: quantizes
 * [rows, cols]; columnwise: [cols, rows]); MS_EINVAL on overflow. */
int ms_fp_nvfp4_bytes(uint64_t rows, uint64_t cols, int columnwise,
		      uint64_t *out);

/* The accumulator: tensors of each plan entry, then one report. */
struct ms_fp_calc;

/* plan is borrowed and must outlive calc and its report. */
int ms_fp_calc_new(const struct ms_fp_plan *plan, struct ms_fp_calc **out,
		   struct ms_err *err);
/* Add n tensors to entry (an index into plan->entries), counted by the
 * entry's repr. May be called several times per entry (a tensor name given
 * twice for one entry is MS_EINVAL at ms_fp_calc_finish). Names and shapes
 * are copied. On error nothing of this call is kept; errors name the plan,
 * the entry's role and the tensor. */
int ms_fp_calc_add_tensors(struct ms_fp_calc *c, size_t entry,
			   const struct ms_fp_tensor *t, size_t n,
			   struct ms_err *err);
/* Add the tensors of an inventoried state (ref: a digest, prefix or label
 * as ms_inv_resolve takes it), as its first copy's record holds them: no
 * file is opened. MS_ENOTFOUND for an unknown state. */
struct ms_inv;
int ms_fp_calc_add_state(struct ms_fp_calc *c, size_t entry, struct ms_inv *inv,
			 const char *ref, struct ms_err *err);
/* Add every tensor of an opened checkpoint (headers only are used). */
int ms_fp_calc_add_ckpt(struct ms_fp_calc *c, size_t entry,
			const struct ms_ckpt *ck, struct ms_err *err);
/* Open the entry's resolved path with ms_ckpt_open, add its tensors, close.
 * Only headers and the index are read (a sparse file costs nothing).
 * MS_EINVAL for a state entry. */
int ms_fp_calc_add_path(struct ms_fp_calc *c, size_t entry,
			struct ms_err *err);
/* Place every tensor and compute the report (*out, caller frees with
 * ms_fp_report_free). An entry with no tensors added is MS_EINVAL (a plan
 * entry left unresolved). c may be freed before the report. */
struct ms_fp_report;
int ms_fp_calc_finish(struct ms_fp_calc *c, struct ms_fp_report **out,
		      struct ms_err *err);
void ms_fp_calc_free(struct ms_fp_calc *c);

/* ---- the report ---------------------------------------------------------------- */

/*
 * One (entry, layout) row. A row's per-GPU numbers are the maximum over
 * ranks of that row alone; rows can peak on different ranks, so their sum
 * may exceed the report's total, which is the maximum over ranks of the sum.
 */
struct ms_fp_row {
	size_t entry;                  /* index into plan->entries */
	const char *role;              /* borrowed from the plan */
	enum ms_fp_layout layout;
	uint64_t ntensors;             /* tensors (a fused one counts once;
					* transient row: of every layer) */
	uint64_t nweights;             /* quantizable weights among them */
	uint64_t nelem;                /* elements: of the source shape for
					* converted weights, else as stored */
	uint64_t model_bytes;          /* every tensor once (the state as a
					* whole in this layout, all ranks
					* together); transient row: the largest
					* layer */
	uint64_t replicated_bytes;     /* held by every GPU */
	uint64_t expert_bytes_per_gpu; /* routed-expert bytes, largest rank */
	uint64_t bytes_per_gpu;        /* replicated + expert, largest rank;
					* transient row: the largest layer */
	int32_t peak_layer;            /* transient row: that layer (-1: none) */
	uint64_t duplicate_bytes_per_gpu; /* bytes of weights also resident in
					   * another row, largest rank */
	uint64_t ondemand_saving_per_gpu; /* resident columnwise row with a
					   * resident rowwise twin: what on
					   * demand would save; transient row:
					   * what it saves against resident */
};

/* Weights resident in more than one row: one group per set of rows. */
struct ms_fp_dup {
	size_t nrows;
	size_t *rows;                  /* indices into report->rows, ascending */
	uint64_t nweights;
	uint64_t bytes_per_gpu;        /* all copies, largest rank */
	uint64_t excess_bytes_per_gpu; /* all copies but the smallest */
	char *example;                 /* one such weight (its module name) */
};

/* The training state of the plan's "train" section (present == 0 without
 * one). Parameters are placed as the weights they adapt (or the LoRA
 * tensors holding them): attention LoRA on every GPU, an expert's on the
 * rank that owns the expert. Per-GPU numbers are of the largest rank. */
struct ms_fp_train {
	int present;
	size_t entry;                  /* the entry the parameters come from */
	int from_lora;                 /* 1: train.lora over entry's weights;
					* 0: entry's LoRA tensors (a warm start) */
	int params_resident;           /* an 'adapter' entry holds the LoRA
					* weights (counted in its rows) */
	uint64_t modules;              /* weights given a LoRA pair, or LoRA
					* tensors */
	uint64_t params;               /* trainable parameters, all ranks */
	uint64_t params_per_gpu;
	uint32_t per_param_bytes;      /* MS_FP_TRAIN_*_BYTES that apply */
	uint64_t param_bytes_per_gpu;  /* bf16 weights (0 when resident) */
	uint64_t grad_bytes_per_gpu;   /* fp32 gradients */
	uint64_t optimizer_bytes_per_gpu; /* AdamW: fp32 master + 2 moments */
	uint64_t bytes_per_gpu;        /* the three together */
};

struct ms_fp_report {
	const struct ms_fp_plan *plan; /* borrowed */
	struct ms_fp_train train;      /* included in the totals below */
	size_t nrows;
	struct ms_fp_row *rows;        /* entry order, then layout order */
	size_t ndups;
	struct ms_fp_dup *dups;
	uint64_t duplicate_weights;    /* weights resident more than once */
	uint64_t total_bytes_per_gpu;  /* the largest rank's sum of all rows */
	uint32_t peak_rank;            /* that rank (the lowest on ties) */
	uint64_t replicated_bytes;     /* resident rows' replicated bytes */
	/* The total if every resident columnwise copy with a resident rowwise
	 * twin were built on demand (equal to the total when there is none). */
	uint64_t ondemand_total_bytes_per_gpu;
	uint64_t ondemand_saving_per_gpu;
	int has_budget;
	uint64_t budget_bytes;
	int over_budget;               /* total_bytes_per_gpu > budget_bytes */
};

/* The report as text (one line per row, duplicates, on-demand, total vs
 * budget) or as a JSON object (cJSON), appended to out. */
int ms_fp_report_text(const struct ms_fp_report *r, struct ms_buf *out,
		      struct ms_err *err);
int ms_fp_report_json(const struct ms_fp_report *r, struct ms_buf *out,
		      struct ms_err *err);
void ms_fp_report_free(struct ms_fp_report *r);

#endif
