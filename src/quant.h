/*
 * quant.h: checkpoint-level NVFP4 conversion, behind msconvert: which
 * tensors to quantize, fused tensor-scale groups, the on-disk names of the
 * two flavors (Model Optimizer and compressed-tensors), their configuration
 * files, and the plan -> execute split (a plan can be printed without
 * writing anything).
 *
 * On disk, for a linear module <p> whose weight is W [out, in]:
 *
 *   format modelopt                       format compressed-tensors
 *   <p>.weight            U8 [out, in/2]  <p>.weight_packed        U8
 *   <p>.weight_scale      F8_E4M3         <p>.weight_scale         F8_E4M3
 *                         [out, in/16]
 *   <p>.weight_scale_2    F32 []          <p>.weight_global_scale  F32 [1]
 *   <p>.weight_colwise    U8 [in, out/2]  <p>.weight_packed_colwise U8
 *   <p>.weight_colwise_scale F8_E4M3      <p>.weight_scale_colwise F8_E4M3
 *                         [in, out/16]
 *
 * (dimensions rounded up to 16 before halving, see nvfp4.h). The columnwise
 * copy is the quantized W^T and shares the tensor scale. Every output file
 * carries __metadata__ "msinv.nvfp4", a compact JSON object:
 *
 *   {"version":1,"recipe":"modelopt","block":"1d","format":"modelopt",
 *    "layouts":["rowwise","columnwise"],
 *    "tensors":{"<p>":{"shape":[out,in],"dtype":"BF16"},...}}
 *
 * giving the recipe, the block shape, the layouts and, per quantized module
 * in that file, the logical shape and source dtype. Quantized checkpoints
 * of either flavor without it (written by other producers) are read as 1D
 * blocks, logical shape from the packed shape, recipe from the flavor.
 *
 * Fused 3-D expert tensors (transformers 5's layout, names.h):
 * "<m>.experts.gate_up_proj" [E, 2I, H] (expert e's gate in rows [0, I),
 * its up in rows [I, 2I)) and "<m>.experts.down_proj" [E, H, I], each
 * expert slice a weight [out, in]. They are quantized slice by slice, blocks
 * along the last (input) dimension, one tensor scale per expert (gate and
 * up of one expert share it, as both producers do for a fused gate/up),
 * and written (enum ms_quant_experts) either
 *
 *   per expert (default): "<m>.experts.<e>.gate_proj", ".up_proj",
 *     ".down_proj" modules with the names above, what serving engines load
 *     for Hugging Face MoE checkpoints; or
 *   fused (modelopt format, rowwise only): the layout Model Optimizer
 *     exports for fused experts,
 *       <m>.experts.gate_up_proj                U8      [E, 2I, H/2]
 *       <m>.experts.gate_up_proj_weight_scale   F8_E4M3 [E, 2I, H/16]
 *       <m>.experts.gate_up_proj_weight_scale_2 F32     [E]
 *     (down_proj alike), the metadata giving the logical shape [E, rows,
 *     cols]. Reading such a tensor yields one ms_qweight per expert slice,
 *     named "<m>.experts.<e>.gate_up_proj" / ".down_proj"; dequantize
 *     writes it back as one [E, rows, cols] tensor, transpose refuses it.
 *
 * Directory outputs mirror the input's shards (same file names, each
 * holding what came from the same input file), write a new
 * model.safetensors.index.json when the input had one, and copy the other
 * regular files byte for byte, but config.json, of which only the
 * quantization_config member is added, replaced or removed (every other
 * byte is kept: ms_json_splice_member), and hf_quant_config.json, written
 * for the modelopt format. The configuration is what the producers write:
 * compressed-tensors' nvfp4-pack-quantized scheme as llm-compressor 0.14
 * writes NVFP4A16, Model Optimizer's weight-only W4A16_NVFP4. Selected
 * weights whose input dimension is not a multiple of 16 are left as they
 * are and listed in the ignore lists (ragged), unless opts.pad_ragged.
 */
#ifndef MS_QUANT_H
#define MS_QUANT_H

#include <stdint.h>

#include "checkpoint.h"
#include "common.h"
#include "nvfp4.h"
#include "safetensors.h"
#include "stage.h"

#define MS_QUANT_META_KEY "msinv.nvfp4"

enum ms_quant_format {
	MS_QUANT_FORMAT_MODELOPT,
	MS_QUANT_FORMAT_COMPRESSED_TENSORS,
};

/* How fused 3-D expert tensors are written (see above). */
enum ms_quant_experts {
	MS_QUANT_EXPERTS_PER_EXPERT,
	MS_QUANT_EXPERTS_FUSED,
};

enum ms_quant_device {
	MS_QUANT_DEVICE_AUTO,
	MS_QUANT_DEVICE_CPU,
	MS_QUANT_DEVICE_CUDA,
};

/* Layout sets (bit i = enum ms_nvfp4_layout i). */
#define MS_QUANT_ROWWISE (1u << MS_NVFP4_LAYOUT_ROWWISE)
#define MS_QUANT_COLUMNWISE (1u << MS_NVFP4_LAYOUT_COLUMNWISE)

enum ms_quant_op {
	MS_QUANT_OP_QUANTIZE,
	MS_QUANT_OP_DEQUANTIZE,
	MS_QUANT_OP_TRANSPOSE,
};

struct ms_quant_opts {
	enum ms_quant_op op;
	/* quantize */
	enum ms_nvfp4_recipe recipe;
	enum ms_nvfp4_block block;
	unsigned layouts;           /* MS_QUANT_ROWWISE | MS_QUANT_COLUMNWISE */
	enum ms_quant_format format;
	int format_set;             /* 0: the recipe's own (te -> modelopt) */
	const char *include;        /* POSIX extended regexes, or NULL */
	const char *exclude;
	int no_fuse;                /* one tensor scale per weight */
	int pad_ragged;             /* quantize weights whose input dimension
				       is not a multiple of 16, padded (not
				       loadable by engines); default: leave
				       them as they are, in the ignore lists */
	enum ms_quant_experts experts; /* fused 3-D expert tensors */
	int allow_nonfinite;
	enum ms_quant_device device;
	/* dequantize */
	enum ms_dtype dtype;        /* MS_DTYPE_BF16 or MS_DTYPE_F32 */
	/* transpose: the high-precision checkpoint (needed for 1D blocks) */
	const char *source;
	/* all */
	int jobs;                   /* codec threads; 0: one per CPU */
	int force;
};

const char *ms_quant_format_name(enum ms_quant_format f);
int ms_quant_format_parse(const char *s, enum ms_quant_format *out);
int ms_quant_device_parse(const char *s, enum ms_quant_device *out);
const char *ms_quant_experts_name(enum ms_quant_experts e);
int ms_quant_experts_parse(const char *s, enum ms_quant_experts *out);
/* The flavor a recipe writes by default (te: modelopt names). */
enum ms_quant_format ms_quant_default_format(enum ms_nvfp4_recipe r);

/* The default selection: a floating 2-D "*.weight" of an attention,
 * routed-expert, shared-expert or dense-MLP projection (names.h), or a
 * fused 3-D expert tensor (ms_name_fused_experts); not embeddings, norms,
 * routers/gates or lm_head. */
int ms_quant_default_selected(const struct ms_tensor *t);


/* The fused group a weight's tensor scale is shared with, as both
 * producers fuse: q/k/v of one attention block, gate/up of one MLP or
 * expert, Mixtral's w1/w3 of one expert, DeepSeek's multi-latent attention
 * pair. Writes the group key (the name with the projection replaced by
 * "{qkv}", "{gate_up}", "{w13}" or, for DeepSeek's q_a_proj and
 * kv_a_proj_with_mqa, "{mla_a}") into buf and returns 1, or returns 0
 * when the weight is in no group. */
int ms_quant_fuse_key(const char *name, char *buf, size_t n);

/* ---- reading quantized checkpoints -------------------------------------- */

/* One quantized module found in a checkpoint. Tensor pointers borrow from
 * the checkpoint. */
struct ms_qweight {
	char *prefix;                       /* "<p>" */
	enum ms_quant_format format;
	uint64_t rows, cols;                /* logical W [out, in] */
	enum ms_dtype src_dtype;            /* recorded, else BF16 */
	enum ms_nvfp4_block block;          /* recorded, else 1D */
	enum ms_nvfp4_recipe recipe;        /* recorded, else the flavor's */
	int recorded;                       /* metadata described it */
	const struct ms_tensor *packed[2];  /* [layout], NULL when absent */
	const struct ms_tensor *scales[2];
	const struct ms_tensor *tscale;     /* weight_scale_2 / global_scale */
	float tscale_value;
	enum ms_nvfp4_tscale_kind tscale_kind;
	size_t file;                        /* index of the file of packed[] */
	int64_t expert;                     /* a slice of a fused 3-D tensor:
					       its expert, else -1 */
};

struct ms_qview {
	struct ms_ckpt *ckpt;               /* borrowed */
	size_t nweights;
	struct ms_qweight *weights;         /* sorted by prefix */
	/* per tensor of ckpt (same order as ckpt->tensors): the index of the
	 * weight it belongs to, or -1 for a tensor that is not part of a
	 * quantized module (input scales count as part of it; a fused 3-D
	 * tensor belongs to the weight of its expert 0) */
	int64_t *owner;
	/* the slices of fused 3-D tensors that weights[] point at */
	size_t nviews;
	struct ms_tensor *views;
};

/* Find every quantized module of c (both flavors, both layouts), checking
 * dtypes and shapes against each other and the metadata. MS_EINVAL names
 * the tensor and the file. */
int ms_qview_open(struct ms_ckpt *c, struct ms_qview *v, struct ms_err *err);
void ms_qview_release(struct ms_qview *v);
/* Decode one layout of w to float32 [R, C] of that layout (rowwise [rows,
 * cols], columnwise [cols, rows]); out holds R*C floats. */
int ms_qweight_decode(const struct ms_qweight *w, enum ms_nvfp4_layout layout,
		      int nthreads, float *out, struct ms_err *err);

/* ---- plans ------------------------------------------------------------------ */

enum ms_qout_kind {
	MS_QOUT_COPY,       /* the bytes of a source tensor */
	MS_QOUT_PACKED,     /* packed E2M1 of a weight in a layout */
	MS_QOUT_SCALES,     /* its E4M3 block scales */
	MS_QOUT_TSCALE,     /* the F32 tensor scale */
	MS_QOUT_DECODED,    /* dequantized weight */
};

/* One tensor of the output. */
struct ms_qout {
	char *name;
	enum ms_dtype dtype;
	uint32_t ndim;
	uint64_t shape[MS_ST_MAX_RANK];
	uint64_t nbytes;
	enum ms_qout_kind kind;
	enum ms_nvfp4_layout layout;        /* PACKED, SCALES */
	size_t item;                        /* plan item it comes from */
	size_t file;                        /* output file index */
};

/* One input tensor and what happens to it. */
struct ms_qitem {
	const struct ms_tensor *src;        /* the high-precision weight, or
					       the tensor copied; NULL for a
					       weight read from a qview */
	int quantized;                      /* quantize: selected */
	int64_t qweight;                    /* qview index (dequantize,
					       transpose), else -1 */
	int64_t group;                      /* fused group, else -1 */
	float amax;                         /* its own */
	float tscale_amax;                  /* the group's (quantize) */
	uint64_t rows, cols;                /* of one expert slice when fused */
	uint64_t experts;                   /* a fused 3-D tensor quantized
					       whole (MS_QUANT_EXPERTS_FUSED):
					       E, else 0 */
	float *eamax;                       /* then each slice's amax */
};

struct ms_quant_plan {
	struct ms_quant_opts opts;
	enum ms_quant_device device;        /* resolved */
	char *in_path, *out_path;
	int out_is_dir;
	struct ms_ckpt *in;                 /* owned */
	struct ms_ckpt *source;             /* owned; transpose --source */
	struct ms_qview view;               /* dequantize, transpose */
	size_t nitems;
	struct ms_qitem *items;
	size_t nouts;
	struct ms_qout *outs;               /* in write order, file by file */
	size_t nfiles;
	char **files;                       /* output paths */
	char **file_names;                  /* names inside out_path */
	char **file_meta;                   /* MS_QUANT_META_KEY value, or NULL */
	size_t ncopies;                     /* other files of a directory */
	char **copy_names;
	uint64_t bytes_in, bytes_out;       /* tensor bytes read, written */
	size_t nquantized, ncopied, ngroups;
	char **excluded;                    /* 2-D weights left as they are */
	size_t nexcluded;
	char **embeds;                      /* embeddings left as they are */
	size_t nembeds;
	char **ragged;                      /* selected weights left as they
					       are for their input dimension
					       (also in excluded): tensor names */
	size_t nragged;
	size_t nviews;                      /* per-expert slices of fused */
	struct ms_tensor *views;            /* 3-D tensors, with own names */
	uint64_t hidden_size;               /* config.json's, else 0 */
	/* writing (ms_quant_stage, ms_quant_publish, ms_quant_finish) */
	char *dest;                         /* out_path without a trailing '/' */
	struct ms_stage *stage;             /* the staging name (owned;
					       opaque: ms_quant_staged_path)
					       while the output is written,
					       published or not, until
					       ms_quant_finish */
};

/*
 * Open in_path (file or directory) and plan opts.op into out_path; nothing
 * is written. Fails with MS_EEXIST when an output exists and !opts->force,
 * MS_EINVAL on bad input (the message names tensor and file), MS_ENODEV
 * for a device this build or machine lacks. Tensor bytes are not read
 * here: a plan is cheap, and non-finite values are found by execute before
 * any file is written.
 */
int ms_quant_plan_new(const char *in_path, const char *out_path,
		      const struct ms_quant_opts *opts,
		      struct ms_quant_plan **out, struct ms_err *err);
void ms_quant_plan_free(struct ms_quant_plan *p);

/*
 * Writing is three steps, so that a caller can make "output in place" and
 * "output recorded" one step (inventory.h, batches):
 *
 *   ms_quant_stage    writes every output file (each atomically, through
 *                     ms_st_writer or ms_afile), the index and the other
 *                     files under a staging name beside OUT,
 *                     ".<name>.tmp-<pid>-<hex>" (a file, or a directory for
 *                     a directory output; msinv gc removes it when its
 *                     writer died): ms_stage_path(&p->stage). Missing parent
 *                     directories of a directory output are created.
 *   ms_quant_publish  renames the staged output to OUT. It never replaces
 *                     anything unless opts.force: an OUT that appeared
 *                     since the plan is MS_EEXIST ("another writer won").
 *                     With force an existing OUT is exchanged with the
 *                     staged one (renameat2 RENAME_EXCHANGE, else moved to
 *                     ".<name>.replaced-<pid>-<hex>") and kept aside: OUT
 *                     always holds the old output or the whole new one.
 *   ms_quant_finish   keep != 0 after a successful publish: the output
 *                     stays and what it replaced is removed. Otherwise
 *                     everything is undone: the published output and the
 *                     staged files are removed, a replaced OUT is put back,
 *                     the parent directories the plan created are removed.
 *
 * A plan freed between the steps is undone as by ms_quant_finish(p, 0).
 * ms_quant_execute does the three in a row. When progress is not NULL it is
 * called after each tensor with the bytes done and the total. An existing
 * OUT is replaced (force) only when it is of the output's kind: a file (or
 * a symbolic link) for a file output, a directory holding nothing but
 * files (or a symbolic link) for a directory output; anything else is
 * MS_EEXIST, from ms_quant_plan_new already.
 */
int ms_quant_stage(struct ms_quant_plan *p,
		   void (*progress)(void *ctx, uint64_t done, uint64_t total),
		   void *progress_ctx, struct ms_err *err);
int ms_quant_publish(struct ms_quant_plan *p, struct ms_err *err);
/* Where ms_quant_stage wrote the output (the staging name), until
 * ms_quant_publish or ms_quant_finish; borrowed from p. */
const char *ms_quant_staged_path(const struct ms_quant_plan *p);
void ms_quant_finish(struct ms_quant_plan *p, int keep);
int ms_quant_execute(struct ms_quant_plan *p,
		     void (*progress)(void *ctx, uint64_t done, uint64_t total),
		     void *progress_ctx, struct ms_err *err);

/*
 * The registration hook: the state digest of what was written (opened
 * again from disk and hashed, ms_state_digest), for the inventory to
 * record. out must hold MS_STATE_DIGEST_LEN bytes.
 */
int ms_quant_output_digest(const char *out_path, int nthreads,
			   char out[MS_STATE_DIGEST_LEN], struct ms_err *err);

/* ---- stats ------------------------------------------------------------------ */

#define MS_QSTATS_BUCKETS 17 /* e4m3 exponent fields 0..15, then NaN */

struct ms_qstats_entry {
	const struct ms_qweight *w;
	enum ms_nvfp4_layout layout;
	uint64_t scale_hist[MS_QSTATS_BUCKETS];
	int has_source;
	double rel_err;        /* ||deq - src|| / ||src|| */
	double max_abs_err;
	uint64_t saturated;    /* elements with |x / block factor| > 6 */
	uint64_t nelem;
	double err2, src2;     /* sums of squares, for the totals */
};

struct ms_qstats {
	struct ms_ckpt *ckpt, *source;   /* owned */
	struct ms_qview view;
	size_t n;
	struct ms_qstats_entry *e;
	struct ms_qstats_entry total;    /* w NULL */
};

/* Statistics of every quantized module (each layout) of path, compared
 * with the high-precision source when source_path is not NULL. */
int ms_qstats_run(const char *path, const char *source_path, int nthreads,
		  struct ms_qstats **out, struct ms_err *err);
void ms_qstats_free(struct ms_qstats *s);

/* ---- checks without a source (qcheck.c) --------------------------------- */

/* How far apart the two layouts of w are (w must have both): with 2D
 * blocks the columnwise bytes must be the exact transpose of the rowwise
 * ones, and *diff is 0 when they are, 1 otherwise; with 1D blocks *diff is
 * the relative L2 distance of the two decodes (relative to the rowwise
 * one). Returns MS_OK with *diff set, MS_EINVAL for a weight with one
 * layout, MS_ENOMEM. */
int ms_qweight_layouts_agree(const struct ms_qweight *w, int nthreads, double *diff,
			     struct ms_err *err);
/* Does w hold what a "quantize" edge says was made? params is the edge's
 * parameters (JSON text, as ms_inv_edges gives it; "recipe", "block" and
 * "layouts" are compared when present). MS_OK when it does, MS_ECHECK with
 * the first difference in why (n bytes), MS_EINVAL when params is not
 * JSON, MS_ENOMEM. */
int ms_qweight_edge_check(const struct ms_qweight *w, const char *params, char *why,
			  size_t n, struct ms_err *err);

/* ---- the record (lineage.c) -------------------------------------------- */

/* "quantize", "dequantize" or "transpose". */
const char *ms_quant_op_name(enum ms_quant_op op);
/* Record a published conversion in inv: the input in (idempotent), then
 * the output out as a state derived from it by o->op, the edge's
 * parameters naming tool ("<tool> <version>") and the options that decide
 * the bytes (ms(5), "Edges"); label (may be NULL) is the output's. The
 * output's digest goes to digest. Run it inside the batch that publishes
 * the output (ms_inv_batch_begin), so that both are one step. */
struct ms_inv;
int ms_quant_register(struct ms_inv *inv, const char *in, const char *out,
		      const struct ms_quant_opts *o, const char *tool, const char *label,
		      char digest[MS_STATE_DIGEST_LEN], struct ms_err *err);

#endif
