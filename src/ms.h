/*
 * ms.h: the public interface of libms, the library behind msinv, msconvert,
 * msshard, msverify and mstrain, and the one header `make install` ships.
 * A tool or the Python package calls what is declared here and nothing
 * else (the tools' sources are built against this header alone: a build check
 * fails when a tool reaches for an internal one). The internal headers
 * beside it (common.h, inventory.h, stage.h, vload.h, ...) include it and
 * add what only the library's own files share: the staging and rename
 * helpers, the hashing pool, the vload engine, fault injection, the JSON
 * helpers that take cJSON types, the codec's building blocks.
 *
 * One section per concern, in dependency order; each opens with the
 * concern's contract. Types whose fields are not a contract are opaque
 * (struct ms_inv, struct ms_key, struct ms_ckpt's files, ...) and are
 * reached through functions.
 */
#ifndef MS_H
#define MS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- common (common.c) -------------------------------------------------- */

/*
 * Errors, allocation and small helpers. Library functions never print and
 * never exit. They return MS_OK or an MS_E* code and, when given a struct
 * ms_err, leave one lowercase line there naming the file, tensor and rule
 * broken (like sqlite3_errmsg). Tools map codes to the pinned exit
 * statuses with ms_exit_code(). All allocation goes through ms_malloc()
 * and friends, so that the fault injection build can fail the Nth
 * allocation; memory the library hands out is freed with ms_free.
 */

#define MS_VERSION "0.1.0"

enum ms_rc {
	MS_OK = 0,
	MS_ECHECK = 1,    /* a check ran and found a difference (exit 1) */
	MS_EINVAL = 2,    /* bad input: malformed file, bad argument (exit 2) */
	MS_EIO = 3,       /* I/O or environment failure (exit 3) */
	MS_ENOMEM = 4,    /* allocation failed (exit 3) */
	MS_ENOTFOUND = 5, /* named object does not exist (exit 2) */
	MS_EEXIST = 6,    /* output exists and --force was not given (exit 2) */
	MS_EDB = 7,       /* database error (exit 3) */
	MS_ENODEV = 8,    /* no GPU when one was demanded (exit 3) */
	MS_EINTR = 9,     /* interrupted by a signal (exit 128 + the signal) */
};

/* One error line, filled by the function that failed first. */
struct ms_err {
	int code;
	char msg[1024];
};

/* Set err (may be NULL) to code and a printf-style message; returns code. */
int ms_err_set(struct ms_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Set err to MS_ENOMEM, "out of memory" (the one wording of an allocation
 * failure); returns MS_ENOMEM. */
int ms_err_nomem(struct ms_err *err);
/* Prefix an existing message: "<prefix>: <old message>". Returns err->code. */
int ms_err_prefix(struct ms_err *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Map a return code to the pinned tool exit status (0, 1, 2 or 3; for
 * MS_EINTR 128 + the signal, as a shell reports a process it killed). */
int ms_exit_code(int rc);
/* Short name of a code, e.g. "bad input". */
const char *ms_rc_str(int rc);

/* Allocation. ms_malloc(0) returns a valid unique pointer. ms_free(NULL) is
 * a no-op. All return NULL on failure (or an injected failure). */
void *ms_malloc(size_t n);
void *ms_calloc(size_t n, size_t size);
void *ms_realloc(void *p, size_t n);
char *ms_strdup(const char *s);
char *ms_strndup(const char *s, size_t n);
char *ms_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ms_free(void *p);

/* qsort comparator of an array of C strings (char *), by strcmp. */
int ms_cmp_str(const void *a, const void *b);
/* Does s end with suffix? */
int ms_str_ends_with(const char *s, const char *suffix);

/* Checked arithmetic: return 0 on success, -1 on overflow. */
static inline int ms_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_add_overflow(a, b, out) ? -1 : 0;
}
static inline int ms_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

/* Range-checked integer parsing for command lines and text formats (no atoi).
 * Accepts decimal digits only (no sign, no spaces). */
int ms_parse_u64(const char *s, uint64_t max, uint64_t *out);
/* Parse a double; rejects trailing garbage, NaN and Inf. */
int ms_parse_double(const char *s, double *out);

/* Progress of long work (hashing, packing, extracting): fn(arg, done,
 * total) in bytes, called from the thread that started the work, a few
 * times a second at most and once at the end. The library reports; the
 * tools decide whether and how to show it (on a terminal only). */
struct ms_progress {
	void (*fn)(void *arg, uint64_t done, uint64_t total);
	void *arg;
};

/* A byte count for people, the one size format of every tool's text output:
 * exact below 1 KiB ("512 B"), else binary units with two decimals
 * ("1.50 GiB"; KiB, MiB, GiB, TiB, PiB, EiB). --json output gives exact
 * byte counts instead. Writes at most MS_BYTES_STR_LEN bytes to buf and
 * returns buf. */
#define MS_BYTES_STR_LEN 24
const char *ms_bytes_str(uint64_t n, char *buf);

/* Lowercase hex of n bytes into out (2n+1 bytes). */
void ms_hex(const uint8_t *in, size_t n, char *out);
/* Parse 2n lowercase/uppercase hex digits into n bytes; -1 if malformed. */
int ms_unhex(const char *in, uint8_t *out, size_t n);

/* A growable byte buffer (git's strbuf). Embedded: ms_buf_init/release. */
struct ms_buf {
	char *data;
	size_t len;
	size_t cap;
	int oom; /* set when an append failed; the buffer stays valid */
};
void ms_buf_init(struct ms_buf *b);
void ms_buf_release(struct ms_buf *b);
int ms_buf_append(struct ms_buf *b, const void *p, size_t n);
int ms_buf_puts(struct ms_buf *b, const char *s);
int ms_buf_printf(struct ms_buf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Take ownership of the NUL-terminated contents; b is reset. */
char *ms_buf_detach(struct ms_buf *b, size_t *len);

/*
 * Interruption. A tool that writes installs a handler for SIGINT, SIGTERM
 * and SIGHUP that calls ms_interrupt(sig), which only stores the number
 * (async-signal-safe). The library's long loops (every write, every block
 * hashed, every tensor converted or packed) poll ms_interrupted() and fail
 * with MS_EINTR, so the ordinary error path runs: staging removed, the
 * inventory batch rolled back, nothing published. The library installs no
 * handler itself: signal disposition belongs to the program.
 */
void ms_interrupt(int sig);
/* The signal that interrupted the process, or 0. */
int ms_interrupted(void);
/* MS_EINTR with "interrupted by signal N" in err when interrupted, else
 * MS_OK. */
int ms_interrupt_check(struct ms_err *err);

/* Number of online CPUs (at least 1). */
int ms_ncpus(void);
/* Wall clock in seconds (monotonic). */
double ms_now(void);

/* ---- hash (hash.c) ------------------------------------------------------ */

#define MS_SHA256_LEN 32

/* One-shot SHA-256. Returns MS_OK or MS_ENOMEM/MS_EIO (OpenSSL failure). */
int ms_sha256(const void *p, size_t n, uint8_t out[MS_SHA256_LEN]);

/* Streaming SHA-256 (wraps an EVP_MD_CTX). */
struct ms_sha256_ctx;
struct ms_sha256_ctx *ms_sha256_new(void);
int ms_sha256_update(struct ms_sha256_ctx *c, const void *p, size_t n);
int ms_sha256_final(struct ms_sha256_ctx *c, uint8_t out[MS_SHA256_LEN]);
void ms_sha256_free(struct ms_sha256_ctx *c);

/* SHA-256 of a whole file, streamed. */
int ms_sha256_file(const char *path, uint8_t out[MS_SHA256_LEN],
		   struct ms_err *err);

/* Start c over, as if new (one context hashes many chunks). */
int ms_sha256_reset(struct ms_sha256_ctx *c);

/*
 * Chunk-tree digests (ms(5), "Tree digests"). A tensor's plain SHA-256 is
 * one sequential stream; its tree digest hashes fixed-size chunks
 * independently, so one tensor can be checked by many cores or by a GPU:
 *
 *   tree = SHA-256( "msinv-tree-v1\n"            14 bytes
 *                   || k                         1 byte, chunk size 2^k
 *                   || n                         8 bytes, little-endian
 *                   || SHA-256(chunk 0) || ... || SHA-256(chunk m-1) )
 *
 * with m = ceil(n / 2^k) chunks of 2^k bytes, the last one short (none
 * when n is 0). The library records trees with k = MS_TREE_LOG2 (64 KiB:
 * a GPU hashes such chunks at over 700 GB/s, the CPU's per-chunk cost is
 * noise, and the chunk digests are 1/2048 of the bytes).
 */
#define MS_TREE_LOG2 16
#define MS_TREE_LOG2_MIN 10
#define MS_TREE_LOG2_MAX 30
#define MS_TREE_TAG "msinv-tree-v1\n"
#define MS_TREE_TAG_LEN 14
#define MS_TREE_PREFIX_LEN (MS_TREE_TAG_LEN + 1 + 8)

/* A tree digest as recorded: of the bytes whose plain SHA-256 is digest. */
struct ms_tree_rec {
	uint8_t digest[MS_SHA256_LEN];   /* the plain SHA-256 of the bytes */
	uint64_t nbytes;
	unsigned log2;                   /* chunk size 2^log2 */
	uint8_t tree[MS_SHA256_LEN];
};

/* ---- safetensors (safetensors.c) ---------------------------------------- */

#define MS_ST_MAX_HEADER (100u * 1000u * 1000u) /* 100 MB, as the Rust crate */
#define MS_ST_MAX_RANK 8
#define MS_ST_MAX_TENSORS 1000000u
#define MS_ST_MAX_NAME 1024
#define MS_ST_MAX_DEPTH 16

enum ms_dtype {
	MS_DTYPE_BOOL,
	MS_DTYPE_F4,
	MS_DTYPE_F6_E2M3,
	MS_DTYPE_F6_E3M2,
	MS_DTYPE_U8,
	MS_DTYPE_I8,
	MS_DTYPE_F8_E5M2,
	MS_DTYPE_F8_E4M3,
	MS_DTYPE_F8_E8M0,
	MS_DTYPE_F8_E4M3FNUZ,
	MS_DTYPE_F8_E5M2FNUZ,
	MS_DTYPE_I16,
	MS_DTYPE_U16,
	MS_DTYPE_F16,
	MS_DTYPE_BF16,
	MS_DTYPE_I32,
	MS_DTYPE_U32,
	MS_DTYPE_F32,
	MS_DTYPE_C64,
	MS_DTYPE_F64,
	MS_DTYPE_I64,
	MS_DTYPE_U64,
	MS_DTYPE_COUNT
};

/* The format's dtype string ("BF16"), or NULL for an invalid value. */
const char *ms_dtype_name(enum ms_dtype dt);
/* Parse a dtype string of n bytes; MS_OK or MS_EINVAL. */
int ms_dtype_parse(const char *s, size_t n, enum ms_dtype *out);
/* Bits per element: 4 (F4), 6 (F6_*), 1 byte = 8 for BOOL, ... 64 (C64). */
unsigned ms_dtype_bits(enum ms_dtype dt);
/* Bytes for nelem elements; MS_EINVAL on overflow or a partial byte. */
int ms_dtype_nbytes(enum ms_dtype dt, uint64_t nelem, uint64_t *out);
/* Decode element i of a tensor's bytes to double (every dtype but C64,
 * which is MS_EINVAL; F4 is E2M1, F6 and F8 per OCP MX / fnuz rules). */
int ms_dtype_get_f64(enum ms_dtype dt, const uint8_t *data, uint64_t i,
		     double *out);

/* Scalar conversions used across the library (bit patterns as integers). */
float ms_bf16_to_f32(uint16_t h);
uint16_t ms_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float ms_f16_to_f32(uint16_t h);
uint16_t ms_f32_to_f16(float f);

struct ms_tensor {
	const char *name;     /* NUL-terminated; owned by the file */
	enum ms_dtype dtype;
	uint32_t ndim;
	uint64_t shape[MS_ST_MAX_RANK];
	uint64_t nelem;
	uint64_t offset;      /* absolute offset of the first byte in the file */
	uint64_t nbytes;
	const uint8_t *data;  /* into the mapping; valid until the file closes */
	struct ms_st_file *file;
	uint8_t digest[MS_SHA256_LEN]; /* SHA-256 of the bytes, once hashed */
	int has_digest;
	uint8_t tree[MS_SHA256_LEN];   /* their tree digest (hash.h), when */
	int has_tree;                  /* hashed with trees */
};

/* A file's metadata entry ("__metadata__", header order). */
struct ms_st_meta {
	char *key;
	char *value;
};

/* What a front end may read of an open file (struct ms_st_file is
 * opaque to it): pointers borrowed from f, valid until it closes. The
 * digests are set once the file was hashed (ms_ckpt_hash; the whole-file
 * digest on request), else all zero. */
struct ms_st_file_info {
	const char *path;               /* as given */
	uint64_t size;
	uint64_t header_len;            /* N: the header is 8 + N bytes */
	size_t ntensors;
	size_t nmeta;
	const struct ms_st_meta *meta;
	const uint8_t *header_digest;   /* MS_SHA256_LEN bytes */
	const uint8_t *file_digest;     /* MS_SHA256_LEN bytes */
};
void ms_st_file_info(const struct ms_st_file *f, struct ms_st_file_info *out);

/* ---- checkpoint (checkpoint.c) ------------------------------------------ */

/*
 * A set of safetensors files read as one model state.
 *
 * Accepted inputs: a .safetensors file; a directory holding
 * model.safetensors.index.json (sharded), or exactly the safetensors files
 * it holds (model.safetensors, adapter_model.safetensors, or any other set
 * with no index); several such paths at once (ms_ckpt_open_many). Files may
 * be symbolic links, as in a Hugging Face cache snapshot whose links point
 * into blobs/<sha256>; the blob name is kept and checked when whole-file
 * digests are computed.
 *
 * Index rules: JSON object with "weight_map" (name -> file); file names are
 * plain names inside the directory (no '/', no '..'); every listed file
 * exists; every tensor in the map is found exactly once, in the file the
 * map names, and no file holds a tensor the map does not list.
 *
 * Configuration files that change how tensors are read (config.json,
 * hf_quant_config.json, adapter_config.json, quantization_config.json,
 * ep_manifest.json) are recorded with their SHA-256. So is every other
 * file a directory holds that a loader or server needs beside the weights
 * (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
 * generation_config.json, chat templates, README.md, ...): every regular
 * file (or link to one) directly in the directory except hidden names, the
 * safetensors files and their index, MANIFEST.json (an import's own), and
 * weights of other formats (MS_CKPT_WEIGHT_SUFFIXES). Those are the "side
 * files" (side = 1): copied by split, merge and reshard, packed by export,
 * checked by verify, as configuration files are. Two paths of one state
 * may hold the same side file (same name, same bytes); different bytes
 * under one name are refused.
 */
#define MS_CKPT_MAX_INDEX (256u * 1024u * 1024u)
#define MS_CKPT_MAX_CONFIG (16u * 1024u * 1024u)
/* A side file is read whole too (tokenizer.json of a 256k vocabulary is
 * tens of megabytes). */
#define MS_CKPT_MAX_SIDE (256u * 1024u * 1024u)
/* Weights in formats other than safetensors, never side files. */
#define MS_CKPT_WEIGHT_SUFFIXES \
	".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", \
	".npz", ".npy", ".pkl", ".safetensors.index.json", ".bin.index.json"

struct ms_ckpt_config {
	char *name;   /* file name, e.g. "adapter_config.json" */
	char *path;
	char *text;   /* whole file, NUL-terminated */
	size_t len;
	uint8_t digest[MS_SHA256_LEN];
	int side;     /* a side file, not a configuration file (see above) */
};

struct ms_ckpt {
	size_t nfiles;
	struct ms_st_file **files;
	char **file_names;            /* relative to the directory; parallel */
	size_t ntensors;
	struct ms_tensor **tensors;   /* every tensor, sorted bytewise by name */
	size_t nconfigs;
	struct ms_ckpt_config *configs;
	char *index_path;             /* NULL without an index */
	int is_adapter;               /* adapter_config.json present */
};

int ms_ckpt_open(const char *path, struct ms_ckpt **out, struct ms_err *err);
int ms_ckpt_open_many(const char *const *paths, size_t n, struct ms_ckpt **out,
		      struct ms_err *err);
void ms_ckpt_close(struct ms_ckpt *c);
const struct ms_tensor *ms_ckpt_find(const struct ms_ckpt *c, const char *name);
const struct ms_ckpt_config *ms_ckpt_config(const struct ms_ckpt *c,
					    const char *name);
/* Hash all tensors and headers (and files, with file_digests); files that
 * are links into a blob store must match their blob names (MS_ECHECK). */
int ms_ckpt_hash(struct ms_ckpt *c, int nthreads, int file_digests,
		 struct ms_err *err);

/*
 * State identity: "sha256:" + hex SHA-256 of the canonical manifest
 *   msinv-state-v1\n
 *   <name>\t<DTYPE>\t[<d0>,<d1>,...]\t<hex tensor digest>\n   (sorted by name)
 * Requires every tensor hashed. out must hold MS_STATE_DIGEST_LEN bytes.
 */
#define MS_STATE_DIGEST_LEN (7 + 64 + 1)
int ms_state_digest(struct ms_tensor *const *tensors, size_t n,
		    char out[MS_STATE_DIGEST_LEN], struct ms_err *err);
/* The canonical manifest text itself (caller frees). */
int ms_state_manifest(struct ms_tensor *const *tensors, size_t n, char **text,
		      size_t *len, struct ms_err *err);
/* "[d0,d1]" shape text into buf (at least 24*MS_ST_MAX_RANK bytes). */
void ms_shape_str(const struct ms_tensor *t, char *buf, size_t n);

/* ---- nvfp4 (nvfp4.c) ---------------------------------------------------- */

/* Whose float arithmetic to reproduce (NVFP4.md, "Flavors"). */
enum ms_nvfp4_recipe {
	MS_NVFP4_RECIPE_MODELOPT,
	MS_NVFP4_RECIPE_COMPRESSED_TENSORS,
	MS_NVFP4_RECIPE_TE,
	MS_NVFP4_RECIPE_COUNT
};

/* 1x16 blocks along a row, or 16x16 tiles (transposable without loss). */
enum ms_nvfp4_block {
	MS_NVFP4_BLOCK_1D,
	MS_NVFP4_BLOCK_2D,
};

/* Rowwise: the quantized W [out, in]. Columnwise: the quantized W^T
 * [in, out], blocks along the original out dimension. */
enum ms_nvfp4_layout {
	MS_NVFP4_LAYOUT_ROWWISE,
	MS_NVFP4_LAYOUT_COLUMNWISE,
};

/* How the stored tensor scale decodes: multiply (weight_scale_2) or divide
 * (compressed-tensors' weight_global_scale). */
enum ms_nvfp4_tscale_kind {
	MS_NVFP4_TSCALE_MUL,
	MS_NVFP4_TSCALE_DIV,
};

/* Names: "modelopt", "compressed-tensors", "te"; "1d", "2d"; "rowwise",
 * "columnwise". Parsers return MS_OK or MS_EINVAL. */
const char *ms_nvfp4_recipe_name(enum ms_nvfp4_recipe r);
int ms_nvfp4_recipe_parse(const char *s, enum ms_nvfp4_recipe *out);
const char *ms_nvfp4_block_name(enum ms_nvfp4_block b);
int ms_nvfp4_block_parse(const char *s, enum ms_nvfp4_block *out);
const char *ms_nvfp4_layout_name(enum ms_nvfp4_layout l);
int ms_nvfp4_layout_parse(const char *s, enum ms_nvfp4_layout *out);

/* ---- names (names.c) ---------------------------------------------------- */

/*
 * What a tensor name says about the tensor: which layer, which
 * expert, which projection, and what role the bytes play (weight, LoRA
 * factor, NVFP4 scale, ...).
 *
 * Families recognised (a name is a '.'-separated path):
 *
 *   Hugging Face per-expert   model.layers.3.mlp.experts.7.down_proj.weight
 *   Mixtral                   model.layers.0.block_sparse_moe.experts.7.w1.weight
 *   shared experts            mlp.shared_expert.*, mlp.shared_experts.*
 *   routers / gates           mlp.gate.weight, block_sparse_moe.gate.weight,
 *                             mlp.router.weight, mlp.shared_expert_gate.weight,
 *                             mlp.gate.e_score_correction_bias
 *   fused 3-D experts         mlp.experts.gate_up_proj [E, ...],
 *                             mlp.experts.down_proj, *_bias, *_blocks, *_scales
 *   Megatron experts          decoder.layers.0.mlp.experts.linear_fc1.weight7
 *                             (per-expert suffix), ...experts.local_experts.7.
 *                             linear_fc1.weight, grouped experts.weight1/weight2
 *   PEFT LoRA                 base_model.model.<module>.lora_A.weight,
 *                             lora_B, lora_embedding_A/B, an optional adapter
 *                             name before ".weight"
 *   PEFT target_parameters    base_model.model....mlp.experts.lora_A.weight,
 *                             ....experts.base_layer.lora_A.weight: LoRA on
 *                             fused expert parameters, A [E*r, in] (row e*r+k),
 *                             B [out, r*E] (column k*E+e)
 *   NVFP4 companions          .weight_scale, .weight_scale_2, .input_scale,
 *                             .weight_packed, .weight_global_scale,
 *                             .input_global_scale, .weight_colwise,
 *                             .weight_colwise_scale, .weight_packed_colwise,
 *                             .weight_scale_colwise, .weight_colwise_scale_2
 *   attention, norms, embeddings, lm_head, dense MLP
 *
 * PEFT wraps one module once per entry of target_parameters that matches it,
 * each wrapper nesting the previous one as ".base_layer": the FIRST matching
 * entry is the innermost wrapper, the deepest "base_layer" chain. The name
 * alone therefore cannot say which parameter a fused LoRA pair adapts; the
 * parser reports the nesting depth (number of "base_layer" components between
 * the module and lora_A/lora_B) and leaves the resolution to the caller,
 * which has adapter_config.json and the shapes (see shard.h).
 */
#define MS_NAME_MAX 1024
#define MS_NAME_PROJ_MAX 32

enum ms_name_part {
	MS_NAME_PART_OTHER,
	MS_NAME_PART_ATTN,           /* attention projections */
	MS_NAME_PART_EXPERT,         /* one routed expert (expert >= 0) */
	MS_NAME_PART_EXPERTS_FUSED,  /* every routed expert in one tensor */
	MS_NAME_PART_SHARED_EXPERT,  /* always-on shared expert(s) */
	MS_NAME_PART_ROUTER,         /* router / gate of the MoE block */
	MS_NAME_PART_NORM,
	MS_NAME_PART_EMBED,
	MS_NAME_PART_LM_HEAD,
	MS_NAME_PART_MLP,            /* dense (non-MoE) MLP */
	MS_NAME_PART_COUNT
};

enum ms_name_role {
	MS_NAME_ROLE_OTHER,
	MS_NAME_ROLE_WEIGHT,         /* .weight, .weight_packed, fused params */
	MS_NAME_ROLE_BIAS,
	MS_NAME_ROLE_LORA_A,
	MS_NAME_ROLE_LORA_B,
	MS_NAME_ROLE_SCALE,          /* NVFP4 / MX block scales */
	MS_NAME_ROLE_SCALE2,         /* NVFP4 per-tensor scale (weight_scale_2) */
	MS_NAME_ROLE_GLOBAL_SCALE,   /* compressed-tensors weight_global_scale */
	MS_NAME_ROLE_INPUT_SCALE,    /* input_scale, input_global_scale */
	MS_NAME_ROLE_COLWISE,        /* columnwise packed copy */
	MS_NAME_ROLE_COLWISE_SCALE,  /* its block scales */
	MS_NAME_ROLE_COUNT
};

struct ms_name_info {
	int32_t layer;        /* decoder layer, -1 when none */
	int32_t expert;       /* routed expert id, -1 when none or fused */
	enum ms_name_part part;
	enum ms_name_role role;
	/* Projection or module leaf: "down_proj", "w1", "gate_up_proj",
	 * "linear_fc1", "q_proj", "input_layernorm", "gate"; "" for fused LoRA,
	 * whose parameter the name does not say. Truncated to fit. */
	char proj[MS_NAME_PROJ_MAX];
	/* LoRA tensors: the number of "base_layer" wrappers between the module
	 * and lora_A/lora_B (0 for an ordinary per-module adapter); -1 for
	 * tensors that are not LoRA factors. */
	int32_t lora_nesting;
	/* name[0, module_len) names the module (or fused parameter) the tensor
	 * belongs to, without the role suffix: every companion of one weight
	 * (.weight, .weight_scale, .weight_scale_2, ...) shares it. For LoRA it
	 * is the path PEFT uses for the wrapper, "base_layer"s included. */
	uint32_t module_len;
	uint8_t peft;         /* the name carries PEFT's "base_model.model." */
	uint8_t colwise;      /* a columnwise (transposed) quantized copy */
	uint8_t packed;       /* packed 4-bit data (weight_packed, _blocks) */
};

/* Parse name into *out. Names of no known family parse as
 * MS_NAME_PART_OTHER with the role of their suffix, so every valid tensor
 * name parses. Returns MS_OK, or MS_EINVAL for NULL, empty or longer than
 * MS_NAME_MAX bytes. Never allocates. */
int ms_name_parse(const char *name, struct ms_name_info *out);

/* Compact description, e.g. "layer 3 expert 7 down_proj weight",
 * "layer 0 experts lora_A nesting 1", "embed embed_tokens weight".
 * Writes at most n bytes (NUL included); returns the length it needed,
 * as snprintf does. */
int ms_name_info_str(const struct ms_name_info *info, char *buf, size_t n);

/* Short names: "expert", "experts", "shared_expert", ...; "weight",
 * "lora_A", "scale_2", ... (static strings). */
const char *ms_name_part_str(enum ms_name_part part);
const char *ms_name_role_str(enum ms_name_role role);

/* Does the tensor hold weights of routed experts (one or all of them)? */
int ms_name_is_routed_expert(const struct ms_name_info *info);

/* A floating fused 3-D expert weight, transformers 5's layout:
 * "<m>.experts.gate_up_proj" [E, 2I, H] (2I even; expert e's gate in rows
 * [0, I), its up in rows [I, 2I)) or "<m>.experts.down_proj" [E, H, I],
 * each slice [out, in]. Returns 1 for gate_up, 2 for down, else 0. */
int ms_name_fused_experts(const char *name, enum ms_dtype dt, uint32_t ndim,
			  const uint64_t *shape);

/* Is the tensor a quantizable weight: a floating fused 3-D expert weight
 * (above; not tested when shape is NULL), or a floating 2-D "<m>.weight"
 * of attention, an expert, the shared expert or a dense MLP (info is the
 * name parsed by ms_name_parse)? The one rule behind msconvert's default
 * selection (ms_quant_default_selected) and the footprint planner's
 * (ms_fp_quantizable): what the planner sizes is what msconvert writes. */
int ms_name_quantizable(const char *name, const struct ms_name_info *info, enum ms_dtype dt,
			uint32_t ndim, const uint64_t *shape);

/* ---- fsutil (fsutil.c) -------------------------------------------------- */

/* Write a whole buffer to path atomically. */
int ms_file_write_atomic(const char *path, const void *p, size_t n, int force,
			 struct ms_err *err);

/* Read a whole regular file of at most max bytes; the buffer is
 * NUL-terminated (not counted in *len). Caller frees with ms_free. */
int ms_file_read(const char *path, uint64_t max, char **out, size_t *len,
		 struct ms_err *err);

/* Join a directory and a name into a new string. */
char *ms_path_join(const char *dir, const char *name);
/* Basename without copying (pointer into s). */
const char *ms_path_base(const char *s);

/* ---- inventory (inventory.c) -------------------------------------------- */

/*
 * The inventory, a SQLite database in which every materialised
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
 * ms_inv_add_paths, packing in ms_bundle_export, extracting in
 * ms_bundle_import); progress is copied, NULL turns it off (the default).
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
	struct ms_vtensor *tensors;    /* offset order; NULL without tensors
					* (the record verify.h's manifests use) */
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

/* ---- verify (verify.c) -------------------------------------------------- */

/*
 * Re-hash a state's files against what was recorded, and the
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

/* ---- footprint (footprint.c) -------------------------------------------- */

/*
 * The per-GPU memory of a planned run, by state and layout,
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
 * expert of a fused [E, a, b] one (under "experts" a per-expert up_proj /
 * w3 adds only r*a: PEFT adapts gate and up as one fused parameter, one A
 * for both, as mstrain does); without "lora", the LoRA tensors of the
 * 'adapter' entry. They are placed as the tensor they come from. Bytes per
 * parameter: MS_FP_TRAIN_PARAM_BYTES (unless an 'adapter' entry holds the
 * weights), MS_FP_TRAIN_GRAD_BYTES, MS_FP_TRAIN_ADAMW_BYTES; added to each
 * rank's total. Not counted, and said so in the report: activations, the
 * CUDA context, workspaces, communication buffers, fragmentation. The
 * GPU trainer's own holding for the plan (its activations and scratch
 * included) is the separate "trainer" part (struct ms_fp_trainer,
 * ms_fp_report_add_trainer).
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

/* What the GPU trainer (mstrain --device cuda) holds on its device for
 * the plan's train section (ms_fp_report_add_trainer): by colwise mode [0]
 * resident, [1] on-demand. Reported beside the rows, not added to their
 * totals (the trainer holds its own copies: NVFP4 codes as stored, the
 * float weights it needs, never the bf16 base whole). */
struct ms_fp_trainer {
	int present;
	char why[1100];                /* not present: why not ("" when the
					* plan has no train section) */
	uint64_t batch, seq_len;
	int colwise_ondemand;          /* the plan's mode */
	struct {
		uint64_t nvfp4_rowwise, nvfp4_colwise, dense, lora, acts, scratch;
		uint64_t total;
	} mode[2];
};

struct ms_fp_report {
	const struct ms_fp_plan *plan; /* borrowed */
	struct ms_fp_train train;      /* included in the totals below */
	struct ms_fp_trainer trainer;  /* not included */
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

/* For a plan with a train section (plan_path, the file the report's plan
 * was loaded from): fill r->trainer with what `mstrain --device cuda` will
 * hold on its GPU, from the train section and the 'base' state's
 * config.json (recorded in inv, or beside a path entry), in both colwise
 * modes; it assumes the quantized state holds every projection whose
 * input dimension is a multiple of 16 (msconvert's selection). A plan or
 * config the trainer refuses leaves r->trainer.present 0 and says why in
 * r->trainer.why (the report stands without it). MS_OK, or MS_ENOMEM. */
int ms_fp_report_add_trainer(struct ms_inv *inv, struct ms_fp_report *r,
			     const char *plan_path, struct ms_err *err);

/* The report as text (one line per row, duplicates, on-demand, total vs
 * budget) or as a JSON object (cJSON), appended to out. */
int ms_fp_report_text(const struct ms_fp_report *r, struct ms_buf *out,
		      struct ms_err *err);
int ms_fp_report_json(const struct ms_fp_report *r, struct ms_buf *out,
		      struct ms_err *err);
void ms_fp_report_free(struct ms_fp_report *r);

/* ---- gate (gate.c) ------------------------------------------------------ */

/*
 * The launch gate. Before a run consumes any state, every state the
 * plan names is resolved in the inventory, its files are re-hashed against
 * the recorded digests (or a verification newer than every file's change
 * time is accepted, on request), expert-parallel shards are checked against
 * the plan's EP size, and the run is recorded. Only then is the command
 * started, with the verified paths and digests in its environment. Anything
 * missing, unverified or of the wrong EP size refuses the run: the command
 * is not started and the run record says why.
 *
 * The plan is the JSON of footprint.h (keys "states" with role and state or
 * path, "ep_size", "outputs"). A "path" entry is hashed and must be an
 * inventoried state; a "state" entry is a digest, prefix or label. A "path"
 * entry may also be an EP shard set (a directory holding ep_manifest.json,
 * or that file): the whole set is checked (ms_shard_check: every shard,
 * every expert, the manifest), it must be split for the plan's EP size, and
 * every shard must be an inventoried state recorded with its rank; the
 * role's state is then the set's source (the unsharded state), and every
 * shard is recorded as consumed by the run.
 *
 * Environment given to the command (ROLE upper-cased, every character not
 * in [A-Z0-9] turned into '_'):
 *   MSINV_DB           the inventory path
 *   MSINV_RUN          the run number
 *   MSINV_PLAN         the plan file, MSINV_PLAN_DIGEST its sha256:<hex>
 *   MSINV_EP_SIZE      the plan's EP size
 *   MSINV_OUTPUTS      the plan's "outputs" (when given)
 *   MSINV_STATE_<ROLE> the verified state digest
 *   MSINV_PATH_<ROLE>  the directory (or file) holding that state's files
 *                      (for a shard set: the set's directory)
 *
 * A run that is refused or cannot be checked never starts its command: it
 * is recorded as failed with the exit status the launcher itself exits with
 * (ms_exit_code of the verdict: 1 refused, 2 or 3 for a check that could
 * not be made), so the record and the shell agree.
 */
#define MS_GATE_TRUST_RECENT 1u /* accept a newer ok verification */
#define MS_GATE_DRY_RUN 2u      /* check, but record no run */

struct ms_gate_input {
	char *role;
	char digest[MS_STATE_DIGEST_LEN];
	char *label;           /* NULL when none */
	char *path;            /* directory or file of the verified copy */
	enum ms_inv_kind kind;
	int32_t ep_size, ep_rank;
	int trusted;           /* accepted through a recent verification */
	uint64_t bytes;        /* bytes re-hashed */
	double seconds;
	/* a shard set entry: the state digest of every shard, rank order
	 * (digest is then the set's source state); 0 and NULL otherwise */
	size_t nshards;
	char (*shards)[MS_STATE_DIGEST_LEN];
};

struct ms_gate {
	struct ms_fp_plan *plan;
	char plan_path[4096];
	char plan_digest[MS_STATE_DIGEST_LEN];
	size_t ninputs;
	struct ms_gate_input *inputs;
	int refused;           /* MS_ECHECK was returned: why says why */
	char why[1024];
	int64_t run_id;        /* 0 with MS_GATE_DRY_RUN */
	size_t nenv;
	char **env;            /* "NAME=value" strings for the command */
};

/*
 * Check the plan at plan_path against inv. Returns MS_OK when every state
 * verified (the run is recorded as running: finish it with ms_gate_end),
 * MS_ECHECK when the run is refused: a state is missing, unknown, of the
 * wrong EP size, or its files differ from the record (g->why says why; the
 * refusal is recorded as a failed run with a "launch_refused" event, unless
 * dry run). MS_EINVAL for a malformed plan; other codes (MS_EIO, MS_ENOMEM,
 * MS_EDB) when the check itself could not be made (a file that cannot be
 * read, memory): no verdict, so not a refusal. Such a failure met while
 * verifying is recorded, when the inventory can still be written, as a
 * failed run with a "launch_failed" event giving the reason. *out is set in
 * the first two cases; free it with ms_gate_free.
 */
int ms_gate_check(struct ms_inv *inv, const char *plan_path, unsigned flags,
		  int nthreads, struct ms_gate **out, struct ms_err *err);
/* Record the command's exit status (0 ok, else failed). */
int ms_gate_end(struct ms_inv *inv, struct ms_gate *g, int exit_code,
		struct ms_err *err);
void ms_gate_free(struct ms_gate *g);

/* ---- policy (policy.c) -------------------------------------------------- */

/*
 * Which inventoried states a served policy is made of.
 *
 * A serving engine loaded some tensors: a directory (base + adapter, a
 * merged checkpoint, a quantized one) or a JSON map of tensor name to
 * SHA-256 such as an engine's weight checker emits. Every tensor is looked
 * up by its digest in the inventory; the states that hold the served
 * tensors under the same names are the policy's parts. Each served tensor
 * ends up:
 *   matched    a part holds these bytes under this name;
 *   renamed    some state holds these bytes, under another name;
 *   mismatch   a part has a tensor of this name with other bytes;
 *   unknown    no recorded state holds these bytes.
 * Only an all-matched policy identifies; the rest are listed.
 *
 * Tensor map format (JSON object, outside input, strict):
 *   {"name": "<64 hex sha256>", ...}   or   {"tensors": {"name": "<hex>", ...}}
 */
#define MS_POLICY_MAX_MAP (256u << 20)

enum ms_policy_status {
	MS_POLICY_MATCHED,
	MS_POLICY_RENAMED,
	MS_POLICY_MISMATCH,
	MS_POLICY_UNKNOWN,
};

struct ms_policy_tensor {
	char *name;
	uint8_t digest[MS_SHA256_LEN];
	enum ms_policy_status status;
	int part;              /* index into parts, or -1 */
	char *other;           /* renamed: the recorded name; NULL otherwise */
	char other_state[MS_STATE_DIGEST_LEN]; /* renamed: the state */
	int src;               /* a slice of the served fused tensor
				* sources[src] (ms_policy_unfuse), or -1 */
};

struct ms_policy_part {
	char state[MS_STATE_DIGEST_LEN];
	char *label;           /* NULL when none */
	enum ms_inv_kind kind;
	char *layout;
	uint64_t state_tensors; /* tensors the state records */
	uint64_t served;        /* of them, served under their names */
};

struct ms_policy_report {
	size_t ntensors;
	struct ms_policy_tensor *tensors;   /* sorted by name */
	size_t nparts;
	struct ms_policy_part *parts;       /* constituents first (base,
					     * adapter, quantized: not policy
					     * states), most tensors first */
	/* policy states that hold some of the served tensors under their
	 * names but are not parts (served: how many): what a served copy
	 * of a registered policy resembles, beside what it is made of */
	size_t npolicies;
	struct ms_policy_part *policies;
	size_t nmatched, nrenamed, nmismatch, nunknown;
	/* for tensors unfused by ms_policy_unfuse: the served fused names
	 * (sources[src] of struct ms_policy_tensor) */
	size_t nsources;
	char **sources;
};

/* The served tensors: from checkpoints at paths (hashed with nthreads) or
 * from a tensor map. Names must be unique across all of them. */
int ms_policy_from_ckpt(const struct ms_ckpt *c, struct ms_policy_report **out,
			struct ms_err *err);
int ms_policy_from_map(const char *json, size_t len, const char *label,
		       struct ms_policy_report **out, struct ms_err *err);

/*
 * Serving engines hold some parameters fused, under names no checkpoint
 * has. vLLM's FusedMoE keeps every expert of a layer in
 * "...experts.w13_weight" [E, 2I, H] (expert e's rows [0, I) are w1, the
 * gate_proj, and [I, 2I) w3, the up_proj) and "...experts.w2_weight"
 * [E, H, I] (down_proj); its merged linears stack their inputs along the
 * first dimension: "qkv_proj.weight" = q_proj, k_proj, v_proj (sizes from
 * config.json: num_attention_heads, num_key_value_heads, head_dim or
 * hidden_size / heads) and "gate_up_proj.weight" = gate_proj, up_proj.
 * Every served tensor of c with such a name whose bytes no recorded state
 * holds is replaced in r by its slices, each hashed and named as
 * checkpoints name it ("experts.<e>.gate_proj.weight"; Mixtral's
 * "experts.<e>.w1.weight" / w3 / w2 under "block_sparse_moe"), so that
 * ms_policy_identify matches them against the inventoried tensors. Call
 * between ms_policy_from_ckpt and ms_policy_identify. A tensor map (digests
 * only) cannot be sliced.
 */
int ms_policy_unfuse(struct ms_inv *inv, const struct ms_ckpt *c, struct ms_policy_report *r,
		     struct ms_err *err);

/* Look every tensor up in inv and choose the parts. Returns MS_OK when
 * every tensor matched, MS_ECHECK when some did not (the report says which),
 * other codes on failure. */
int ms_policy_identify(struct ms_inv *inv, struct ms_policy_report *r,
		       struct ms_err *err);
/* Record the served files at paths as a policy state composed of r's parts
 * (an identified report: ms_policy_identify returned MS_OK): its parents
 * are the parts, and the "compose" edge lists each part's state, kind,
 * layout and served tensors. label may be NULL; jobs hashing threads. The
 * policy state's digest goes to digest. */
int ms_policy_register(struct ms_inv *inv, const struct ms_policy_report *r,
		       const char *const *paths, size_t npaths, const char *label, int jobs,
		       char digest[MS_STATE_DIGEST_LEN], struct ms_err *err);
void ms_policy_report_free(struct ms_policy_report *r);
const char *ms_policy_status_str(enum ms_policy_status s);

/* ---- quant (quant.c, qcheck.c, lineage.c) ------------------------------- */

/*
 * Checkpoint-level NVFP4 conversion, behind msconvert: which
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

/* ---- shard (shard.c, lineage.c) ----------------------------------------- */

/*
 * Expert-parallel (EP) sharding of LoRA adapters and checkpoints:
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

/* ---- attest (attest.c) -------------------------------------------------- */

/*
 * Signing and verifying models in the OpenSSF Model Signing (OMS)
 * v1.0 format, the format of the reference `model_signing` tool (its `sign
 * key` / `verify key` methods), so each side checks the other's signatures.
 *
 * A signature file is a Sigstore bundle v0.3, one line of JSON:
 *
 *   {"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json",
 *    "verificationMaterial":{"publicKey":{"hint":"<H>"},"tlogEntries":[]},
 *    "dsseEnvelope":{"payload":"<base64 P>",
 *                    "payloadType":"application/vnd.in-toto+json",
 *                    "signatures":[{"sig":"<base64 S>","keyid":""}]}}
 *
 *   H  lowercase hex SHA-256 of the signer's public key as PEM
 *      SubjectPublicKeyInfo ("-----BEGIN PUBLIC KEY-----\n...", 64-column
 *      base64, final newline): names the key without carrying it.
 *   S  DER ECDSA signature over PAE(payloadType, P), hashed with SHA-256 on
 *      P-256, SHA-384 on P-384, SHA-512 on P-521 (the curves OMS accepts).
 *   PAE(t, b) = "DSSEv1" SP len(t) SP t SP len(b) SP b, lengths in decimal
 *      bytes (DSSE v1.0 pre-authentication encoding).
 *   P  an in-toto Statement v1:
 *
 *   {"_type": "https://in-toto.io/Statement/v1",
 *    "subject": [{"name": "<model directory name>",
 *                 "digest": {"sha256": "<R>"}}],
 *    "predicateType": "https://model_signing/signature/v1.0",
 *    "predicate": {
 *      "serialization": {"method": "files", "hash_type": "sha256",
 *                        "allow_symlinks": false,
 *                        "ignore_paths": [".git", ...]},
 *      "resources": [{"name": "<path>", "algorithm": "sha256",
 *                     "digest": "<hex SHA-256 of the file>"}, ...]}}
 *
 *   One resource per regular file under the model directory, named by its
 *   POSIX path relative to it, sorted component by component (Python's
 *   PurePosixPath order: "a/b" < "a/b/c" < "a-b" < "a.b"). R is the SHA-256
 *   of the raw 32-byte file digests concatenated in resource order.
 *
 * What is covered: every regular file, hidden ones included, except the
 * ignored paths (each ignores itself and everything below it): ".git",
 * ".gitattributes", ".github", ".gitignore", and the signature file itself
 * when it lies inside the model. A symbolic link or special file anywhere
 * in the tree, ignored parts included, is refused, as the reference does
 * by default. Verification ignores what the signed ignore_paths list, the
 * git paths (unless the signature covers files under them) and the
 * signature file, then requires the same set of files with the same
 * digests.
 */
#define MS_OMS_BUNDLE_MEDIA_TYPE "application/vnd.dev.sigstore.bundle.v0.3+json"
#define MS_OMS_PAYLOAD_TYPE "application/vnd.in-toto+json"
#define MS_OMS_STATEMENT_TYPE "https://in-toto.io/Statement/v1"
#define MS_OMS_PREDICATE_TYPE "https://model_signing/signature/v1.0"

#define MS_OMS_MAX_SIG (64u << 20)     /* signature or envelope file bytes */
#define MS_OMS_MAX_FILES 4000000u      /* files in one model */
#define MS_OMS_MAX_DEPTH 512           /* directory nesting */
#define MS_OMS_HEX_LEN 65              /* 64 hex digits and a NUL */

/* ---- keys ------------------------------------------------------------- */

/* An elliptic curve key on P-256, P-384 or P-521, private or public. */
struct ms_key;

/* Load a PEM private key (SEC1 "EC PRIVATE KEY" or PKCS#8 "PRIVATE KEY";
 * encrypted keys are refused, never prompted for). MS_EINVAL for a file
 * that is not such a key or a curve OMS does not accept. */
int ms_key_load_private(const char *path, struct ms_key **out,
			struct ms_err *err);
/* Load a PEM public key ("PUBLIC KEY", SubjectPublicKeyInfo). */
int ms_key_load_public(const char *path, struct ms_key **out,
		       struct ms_err *err);
void ms_key_free(struct ms_key *k);
/* The curve's OpenSSL name: "prime256v1", "secp384r1" or "secp521r1". */
const char *ms_key_curve(const struct ms_key *k);
/* The bundle's public key hint of k (see above) into hint. */
int ms_key_hint(const struct ms_key *k, char hint[MS_OMS_HEX_LEN],
		struct ms_err *err);

/* ---- DSSE and the Sigstore bundle ------------------------------------- */

/* Sign payload (n bytes) as a bare DSSE envelope, compact JSON
 * {"payload":..,"payloadType":..,"signatures":[{"sig":..,"keyid":""}]}.
 * *envelope is NUL-terminated, owned by the caller. */
int ms_dsse_sign(const void *payload, size_t n, const char *payload_type,
		 const struct ms_key *key, char **envelope, size_t *len,
		 struct ms_err *err);
/* Check a bare DSSE envelope (n bytes of JSON; label names it in errors)
 * with pub: MS_OK when a signature verifies, then *payload (n bytes, NUL
 * added) and *payload_type are the caller's. MS_ECHECK when no signature
 * verifies, MS_EINVAL when the JSON is malformed. */
int ms_dsse_verify(const char *envelope, size_t n, const char *label,
		   const struct ms_key *pub, uint8_t **payload,
		   size_t *payload_len, char **payload_type, struct ms_err *err);

/* The same wrapped in a Sigstore bundle v0.3 with the public key hint, as
 * OMS writes it. ms_sigstore_verify also checks the media type and, when the
 * bundle has a hint, that it names pub (MS_ECHECK otherwise). */
int ms_sigstore_sign(const void *payload, size_t n, const char *payload_type,
		   const struct ms_key *key, char **bundle, size_t *len,
		   struct ms_err *err);
int ms_sigstore_verify(const char *bundle, size_t n, const char *label,
		     const struct ms_key *pub, uint8_t **payload,
		     size_t *payload_len, char **payload_type,
		     struct ms_err *err);

struct ms_oms_opts {
	int nthreads;   /* hashing threads; 0: one per CPU */
	int force;      /* sign: replace an existing signature file */
	/* Called from the calling thread a few times a second while files
	 * are hashed (bytes done, bytes in all); NULL for none. */
	void (*progress)(void *arg, uint64_t done, uint64_t total);
	void *progress_arg;
};

/* ---- sign and verify a model directory -------------------------------- */

enum ms_oms_fail {
	MS_OMS_FAIL_NONE,
	MS_OMS_FAIL_KEY,        /* the bundle names another public key */
	MS_OMS_FAIL_SIGNATURE,  /* no signature verifies with the key */
	MS_OMS_FAIL_MISSING,    /* a signed file is not in the model */
	MS_OMS_FAIL_EXTRA,      /* a file the signature does not cover */
	MS_OMS_FAIL_DIGEST,     /* a file's bytes differ from the signed digest */
};

struct ms_oms_result {
	char *model_name;        /* the signed subject name */
	char root_digest[MS_OMS_HEX_LEN]; /* the signed root digest */
	char key_hint[MS_OMS_HEX_LEN];    /* hint of the key that verified */
	uint64_t nfiles;         /* files the signature covers */
	uint64_t nbytes;         /* bytes hashed */
	double seconds;          /* wall time of hashing */
	enum ms_oms_fail fail;   /* first kind of difference found */
	char *path;              /* the file it concerns, when it is a file */
	uint64_t nmissing, nextra, ndigest; /* differences of each kind */
};

/* Sign model_dir with the private key at key_pem_path into sig_path
 * (written atomically; an existing file is MS_EEXIST). nthreads hashing
 * threads, 0 for one per CPU. */
int ms_oms_sign(const char *model_dir, const char *key_pem_path,
		const char *sig_path, int nthreads, struct ms_err *err);
/* The same with options (opts may be NULL); res (may be NULL) receives
 * what was signed: model name, root digest, key hint, files, bytes, time.
 * Release it with ms_oms_result_release. */
int ms_oms_sign_opts(const char *model_dir, const char *key_pem_path,
		     const char *sig_path, const struct ms_oms_opts *opts,
		     struct ms_oms_result *res, struct ms_err *err);

/* Verify model_dir against the signature at sig_path with the public key
 * at pub_pem_path. MS_OK: the signature verifies and every covered file is
 * there with its signed digest, and no other file is. MS_ECHECK: a check
 * failed, res says which (res->fail, res->path) and err names it. MS_EINVAL:
 * malformed signature file or key, unsupported serialization, a link in
 * the model. MS_EIO: a file could not be read. res is filled as far as
 * verification went; release it with ms_oms_result_release. */
int ms_oms_verify(const char *model_dir, const char *sig_path,
		  const char *pub_pem_path, struct ms_oms_result *res,
		  struct ms_err *err);
int ms_oms_verify_opts(const char *model_dir, const char *sig_path,
		       const char *pub_pem_path, const struct ms_oms_opts *opts,
		       struct ms_oms_result *res, struct ms_err *err);
void ms_oms_result_release(struct ms_oms_result *res);

/* ---- bundle (bundle.c) -------------------------------------------------- */

/*
 * A state as one file, for moving it between hosts and
 * inventories: `msinv export` writes it, `msinv import` reads it back.
 *
 * Byte layout: a POSIX tar stream (pax, only the extended headers the
 * names and sizes need) compressed as one zstd stream:
 *
 *   MANIFEST.json                 first member, at most MS_IMPORT_MAX_MANIFEST
 *   <file>.safetensors ...        every tensor file of the state
 *   config.json ...               every configuration file of the state
 *
 * Every member is a regular file, mode 0644, mtime 0 (the epoch), uid and
 * gid 0, owner and group "root", in manifest order, with no directory
 * entries; zstd level MS_EXPORT_LEVEL, multithreaded (zstd's output does not
 * depend on the number of workers): two exports of one state are the same
 * bytes on any host. Paths are relative to the deepest directory that holds
 * all the state's files. ASCII names need no pax header; when a name is not
 * ASCII every entry carries "hdrcharset=BINARY", so names are the bytes they
 * are whatever the locale. GNU tar and bsdtar read bundles as they are.
 *
 * MANIFEST.json is the state manifest (msinv-manifest-v1, verify.h) with
 * every file's whole-file "sha256", plus one top-level object:
 *
 *   "bundle": {"format": "msinv-bundle-v1",
 *              "members": [{"path": "model-00001-of-00002.safetensors",
 *                           "size": 193784, "sha256": "<hex>"}, ...],
 *              "total_bytes": N,              (sum of the member sizes)
 *              "kind": "base", "label": "...", "layout": "...",
 *              "ep_size": null, "ep_rank": null, "experts": null,
 *              "lineage": {"states": [...], "edges": [...]}}
 *
 * The members are exactly the manifest's "files" and "configs", each once.
 * kind, label, layout, ep_size and ep_rank repeat the manifest's (null when
 * the state has none) and must agree with them; experts is the state's
 * JSON array of expert ids or null. lineage (absent in bundles written
 * before it existed) is where the state came from: its ancestors' records
 * and every derivation edge above it (ms_inv_lineage_export, inventory.h);
 * import records them, as states with no copy here, in the batch that
 * registers the state.
 *
 * Import treats the archive as hostile. It refuses, naming the archive, the
 * member and the rule: an archive that is not one zstd stream of a tar
 * (no other compression or archive format is read); a member before
 * MANIFEST.json; an absolute path, a ".." component, an empty or "."
 * component, a control character, a path over MS_IMPORT_MAX_PATH bytes
 * or MS_IMPORT_MAX_DEPTH directories deep; a name
 * the manifest does not list; the same name twice; anything but a regular
 * file (symbolic and hard links, devices, FIFOs, sockets), except a
 * directory that some member's path implies; a member larger or smaller
 * than declared (reading stops one byte past the declared size); a member
 * whose bytes do not give its sha256; a member missing; a declared total
 * over opts->max_total; a tar stream longer than max(max_ratio x archive
 * size, declared total + tar framing): the stream is decompressed by this
 * module, so it stops there, whatever the tar layer asked for. The manifest
 * itself is checked before anything is extracted (its state digest is
 * recomputed from its tensor list), and after extraction every tensor and
 * header is re-hashed and every file and configuration the extracted
 * directory presents is compared with the manifest, before the directory is
 * moved into place and the state registered. Any failure removes the
 * temporary directory and registers nothing.
 */
#define MS_BUNDLE_FORMAT "msinv-bundle-v1"
#define MS_BUNDLE_MANIFEST "MANIFEST.json"

/* Import limits (defaults of struct ms_bundle_import_opts). */
#define MS_IMPORT_MAX_MANIFEST (64ull << 20)   /* bytes of MANIFEST.json */
#define MS_IMPORT_MAX_TOTAL (1ull << 40)       /* declared bytes: 1 TiB */
#define MS_IMPORT_MAX_RATIO 1000u              /* tar bytes per archive byte */
/* JSON values in a manifest: bounds the parser's memory (64 bytes each)
 * whatever the text looks like; a real manifest has ~12 per tensor. */
#define MS_IMPORT_MAX_JSON_VALUES (8u << 20)
#define MS_IMPORT_MAX_PATH 4096                /* bytes of a member path */
#define MS_IMPORT_MAX_DEPTH 8                  /* directories above a member */

/* zstd level of exported bundles (zstd's default). */
#define MS_EXPORT_LEVEL 3

struct ms_inv;

/*
 * Write the state digest (a full "sha256:..." digest, see ms_inv_resolve)
 * of inv to out_path as a bundle. The state's files (the first recorded
 * copy whose files all exist) are re-hashed first (nthreads hashing and
 * compression threads, 0: one per CPU; compression uses at most 32) and
 * must match the record: a
 * changed, missing or replaced file is MS_ECHECK naming the file (and the
 * tensor), and nothing is written. The bytes packed are hashed again while
 * they are packed, so a file changed meanwhile is refused too. The output
 * is written atomically; an existing out_path is MS_EEXIST unless force.
 */
int ms_bundle_export(struct ms_inv *inv, const char *digest,
		    const char *out_path, int force, int nthreads,
		    struct ms_err *err);

struct ms_bundle_import_stats {
	uint64_t members;        /* files extracted (MANIFEST.json excluded) */
	uint64_t bytes;          /* their bytes */
	uint64_t archive_bytes;  /* size of the archive file */
	uint64_t stream_bytes;   /* decompressed tar bytes read */
	double seconds;
	int new_state;           /* the state was not in the inventory before */
	int adopted;             /* into_dir was there already, from an earlier
				  * run of this import, and was registered */
};

struct ms_bundle_import_opts {
	const char *label;       /* NULL: the manifest's label, if any */
	int force;               /* replace into_dir if it holds a previous
				  * import (a MANIFEST.json) or is empty */
	int nthreads;            /* hashing threads, 0: one per CPU */
	uint64_t max_total;      /* 0: MS_IMPORT_MAX_TOTAL */
	uint64_t max_ratio;      /* 0: MS_IMPORT_MAX_RATIO */
	struct ms_bundle_import_stats *stats; /* filled when not NULL */
};

/* Defaults: the manifest's label, no force, every limit at its default. */
void ms_bundle_import_opts_init(struct ms_bundle_import_opts *o);

struct ms_bundle_import_member {
	char *path;              /* relative, validated */
	uint64_t size;
	uint8_t sha256[MS_SHA256_LEN];
	int is_config;           /* listed in "configs", not "files" */
};

/* What a bundle holds, read and checked from its manifest alone. */
struct ms_bundle_import_plan {
	char digest[MS_STATE_DIGEST_LEN];
	char *kind, *label, *layout;   /* NULL when the manifest has none */
	char *experts;                 /* JSON array text, NULL when none */
	char *lineage;                 /* "bundle"."lineage" as JSON text,
					* checked; NULL when none */
	int32_t ep_size, ep_rank;      /* -1 when not a shard */
	size_t nmembers;
	struct ms_bundle_import_member *members; /* in "bundle"."members" order */
	size_t nfiles, nconfigs, ntensors;
	uint64_t total_bytes;          /* sum of member sizes */
	uint64_t archive_bytes;
	uint64_t manifest_bytes;
};

/*
 * Read and check MANIFEST.json of archive_path (the plan of an import, for
 * a dry run): the member rules, the limits of opts (may be NULL) and the
 * manifest's own consistency. Nothing is written. *out is released with
 * ms_bundle_import_plan_free. MS_EINVAL for a malformed or hostile archive,
 * MS_ECHECK for a manifest whose digests contradict each other, MS_EIO.
 */
int ms_bundle_import_plan_read(const char *archive_path,
			const struct ms_bundle_import_opts *opts,
			struct ms_bundle_import_plan **out, struct ms_err *err);
void ms_bundle_import_plan_free(struct ms_bundle_import_plan *p);

/*
 * Import the bundle archive_path into the new directory into_dir (its
 * parent must exist) and register it in inv, writing the state digest to
 * digest_out. The members are extracted into a temporary directory beside
 * into_dir (stage.h, ".<name>.tmp-<pid>-<hex>": files created
 * O_EXCL|O_NOFOLLOW and fsynced), everything is verified against the manifest, then, in one
 * inventory batch (inventory.h), the directory is renamed to into_dir and
 * the state registered with ms_inv_add_paths (kind, label, EP placement
 * from the manifest; opts->label overrides the label) and the batch
 * committed. into_dir keeps MANIFEST.json, so the state can also be
 * verified without an inventory.
 *
 * An existing into_dir is MS_EEXIST, with two exceptions. With opts->force
 * an empty directory or a previous import is replaced (kept aside until
 * the commit). Without it, a directory whose MANIFEST.json is this
 * archive's, byte for byte, and where no copy of the state is recorded (an
 * import killed between the rename and the commit leaves exactly that) is
 * adopted: its files are verified against the manifest as extracted ones
 * are, and registered (opts->stats->adopted). A directory that does not
 * verify is MS_EEXIST, naming what differs.
 *
 * On any failure nothing is registered and the file system is left as it
 * was. Codes: MS_EINVAL (hostile or malformed archive, bad options),
 * MS_ECHECK (bytes that do not match the manifest), MS_EEXIST, MS_EIO,
 * MS_EDB, MS_ENOMEM.
 */
int ms_bundle_import(struct ms_inv *inv, const char *archive_path,
		     const char *into_dir, const struct ms_bundle_import_opts *opts,
		     char digest_out[MS_STATE_DIGEST_LEN], struct ms_err *err);

/* ---- gpu (gpu.h) -------------------------------------------------------- */

/* 1 when this build has CUDA and a device answers (cached after the first
 * call), else 0. Never fails. */
int ms_gpu_available(void);

/* ---- pyapi (pyapi.c) ---------------------------------------------------- */

/*
 * Flat entry points for foreign-function bindings (the Python
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

/* ---- the trainer (mstrain): what a front end runs it with ------------------------ */

#define MS_TRAIN_MAX_STEPS 100000000ull
#define MS_TRAIN_MAX_BATCH 65536u

/* How the CUDA trainer runs the routed experts' frozen products on its
 * bf16 path (mstrain --expert-gemm). */
enum ms_expert_gemm {
	MS_EXPERT_GEMM_PER_EXPERT,   /* the experts' weights decoded to bf16
					first, then one CUTLASS grouped GEMM
					a product on an sm_90 (where built),
					else one cuBLAS GEMM per expert
					(default) */
	MS_EXPERT_GEMM_GROUPED,      /* one grouped launch a product over the
					routing counts on the device */
	MS_EXPERT_GEMM_FUSED,        /* grouped, decoding the NVFP4 weights
					inside the GEMM (no bf16 copy) */
};

/* How the CUDA trainer runs causal attention on its bf16 path (mstrain
 * --attention). Both are fused (no S x S matrix in memory) and their
 * backward deterministic. */
enum ms_attention {
	MS_ATTENTION_AUTO,           /* cuDNN's where it loads and has a plan
					for the shape, else the project's
					flash kernels (default) */
	MS_ATTENTION_CUDNN,          /* cuDNN's fused SDPA (libcudnn.so.9
					opened at run time); a model it cannot
					serve is refused (MS_ENODEV, MS_EINVAL) */
	MS_ATTENTION_FLASH,          /* the project's flash kernels
					(kernels/flash.cu, mma.sync) */
};

enum ms_colwise_mode {
	MS_COLWISE_RESIDENT,         /* every layer's W^T built at build time */
	MS_COLWISE_ON_DEMAND,        /* one layer's, during its backward */
};

/* Where the model computes. */
enum ms_device {
	MS_DEVICE_CPU,
	MS_DEVICE_CUDA,              /* kernels/train.cu: one GPU, EP 1 */
};

/* "cpu", "cuda" -> enum; MS_EINVAL. */
int ms_device_parse(const char *s, enum ms_device *out);

/*
 * What a CUDA model holds on its device, in bytes (0 on the CPU): the NVFP4 base
 * (rowwise codes and scales; the columnwise copy: resident for every layer,
 * or the on-demand scratch at its peak), the float weights (embedding,
 * lm_head, norms, routers, projections not quantized), the LoRA parameters
 * with gradients and moments, the activations kept for the backward at the
 * last step's shape, and the working scratch; peak is the largest total
 * held at once. The _measured fields are what cudaMemGetInfo reported
 * around each allocation.
 */
struct ms_model_mem {
	/* bytes allocated, by what they hold */
	uint64_t nvfp4_rowwise, nvfp4_colwise, nvfp4_colwise_peak;
	uint64_t dense, lora, acts, scratch, peak;
	/* what cudaMemGetInfo saw the device lose to those allocations (the
	 * driver's rounding included; 0 for allocations it sub-allocated) */
	uint64_t nvfp4_rowwise_measured, nvfp4_colwise_measured, measured;
	uint64_t total;              /* the device's memory */
};

/* One step's numbers (the JSONL metrics line). */
struct ms_rl_metrics {
	uint64_t step;
	double reward_mean, reward_std;   /* over every completion */
	double group_std;                 /* mean within-group std */
	double zero_var_share;            /* groups with zero variance */
	double kl, entropy;               /* token means, first update */
	double clip_frac;                 /* tokens clipped, last update */
	double grad_norm;                 /* before clipping, last update */
	double pg_norm, reg_norm;         /* ||dL/dlogits|| of each part */
	double reg_share;                 /* reg_norm / pg_norm */
	double resp_len;                  /* mean completion tokens */
	double tokens_per_s;              /* rollout + update tokens / s */
	double seconds;
};

/* The step's JSONL metrics line (no newline), ms_free'd by the caller:
 * {"step", "reward_mean", "reward_std", "group_std", "zero_var_share",
 *  "kl", "entropy", "clip_frac", "grad_norm", "pg_norm", "reg_norm",
 *  "reg_share", "resp_len", "tokens_per_s", "seconds"}. MS_ENOMEM. */
int ms_rl_metrics_json(const struct ms_rl_metrics *s, char **json, struct ms_err *err);

#define MS_RL_NRULES 4
enum ms_rl_rule { MS_RL_ZERO_VAR, MS_RL_REWARD_STD, MS_RL_ENTROPY, MS_RL_REG_SHARE };
const char *ms_rl_rule_name(enum ms_rl_rule r);

struct ms_rl_event {
	enum ms_rl_rule rule;
	uint64_t step;                    /* step the window filled */
	uint32_t window;
	double value, threshold;          /* the step's number and the rule's */
};

/* The event's JSON ({"rule", "step", "window", "value", "threshold"}),
 * ms_free'd by the caller. MS_ENOMEM. */
int ms_rl_event_json(const struct ms_rl_event *e, char **json, struct ms_err *err);

/* What `msinv launch` verified (gate.h's environment), when it started us. */
struct ms_train_launch {
	int active;            /* MSINV_RUN was set */
	int64_t run_id;
	char plan_digest[MS_STATE_DIGEST_LEN];
	size_t nroles;
	char **roles;          /* upper-cased as in the environment */
	char **digests;
};

/* Read MSINV_RUN, MSINV_PLAN_DIGEST and MSINV_STATE_* from envp (a
 * NULL-terminated "NAME=value" array, e.g. environ). MS_EINVAL for a
 * malformed value. */
int ms_train_launch_parse(char *const *envp, struct ms_train_launch *out,
			  struct ms_err *err);
void ms_train_launch_release(struct ms_train_launch *l);

/* One state of the run, loaded through the verified load. */
struct ms_train_state {
	char *role;
	char digest[MS_STATE_DIGEST_LEN];
	char *label;           /* NULL when none */
	enum ms_inv_kind kind;
	int32_t ep_size, ep_rank; /* -1 unless an adapter shard */
	char *where;           /* the directory or file it was loaded from */
	size_t n;
	struct ms_wtensor *t;  /* names and bytes owned here (the model's
				* input records; internal) */
	char *config;          /* config.json (base) text, NUL-terminated */
	size_t config_len;
	char *adapter_config;  /* adapter_config.json (adapter), or NULL */
	uint64_t bytes;        /* tensor bytes loaded (and hashed) */
};

void ms_train_state_release(struct ms_train_state *s);

/* One optimizer step, as reported to the caller. */
struct ms_train_step {
	uint64_t step;         /* 1-based optimizer step just taken */
	uint64_t total;        /* the plan's steps */
	double loss;           /* mean over the step's target tokens */
	double lr;
	double grad_norm;      /* before clipping */
	uint64_t tokens;       /* target tokens of the step */
	double seconds;
	double tokens_per_s;   /* input tokens (batch * seq_len * accum) / s */
};

struct ms_train_ckpt {
	uint64_t step;
	char *path;            /* the checkpoint directory */
	char digest[MS_STATE_DIGEST_LEN]; /* its adapter state */
	char *label;
};

struct ms_train_opts {
	const char *plan_path;
	int colwise;           /* -1: the plan's; else enum ms_colwise_mode */
	uint32_t ep_size;      /* 0: the plan's ep_size */
	uint64_t stop_step;    /* 0: the plan's steps; else stop after this step
				* (the schedule still spans the plan's steps) */
	const char *resume;    /* a checkpoint directory, or NULL */
	int nthreads;          /* 0: one per CPU */
	enum ms_device device; /* where the model computes */
	int gpu_f32;           /* cuda: float32 GEMMs (model.h) */
	int expert_gemm;       /* cuda: enum ms_expert_gemm */
	int attention;         /* cuda: enum ms_attention */
	const struct ms_train_launch *launch; /* NULL: not launched */
	/* Told of every step and every checkpoint (may be NULL). on_step
	 * returning other than MS_OK (err filled) stops the run with that
	 * code after the step (a metrics file that cannot be written). */
	int (*on_step)(void *ctx, const struct ms_train_step *s, struct ms_err *err);
	void (*on_ckpt)(void *ctx, const struct ms_train_ckpt *c);
	/* GRPO runs (train.rl): told of every step's metrics and the monitor's
	 * events of that step; an error stops the run as on_step's does. */
	int (*on_rl_step)(void *ctx, const struct ms_rl_metrics *s,
			  const struct ms_rl_event *ev, size_t nev, struct ms_err *err);
	void *ctx;
};

struct ms_train_result {
	char plan_digest[MS_STATE_DIGEST_LEN];
	int64_t run_id;        /* the launch's run, 0 when none */
	uint64_t first_step;   /* first step taken (resume: checkpoint + 1) */
	uint64_t last_step;
	double first_loss, last_loss;
	uint64_t tokens;       /* target tokens trained on */
	double seconds;
	uint64_t nparams;      /* trainable elements */
	int rl;                /* a GRPO run: first_loss/last_loss hold the
				* mean reward of the first and last steps */
	uint64_t rl_events;    /* GRPO: monitor events recorded */
	int rl_stopped;        /* GRPO: a rule fired with monitor.stop; the
				* run ended after that step's checkpoint */
	size_t nckpts;
	struct ms_train_ckpt *ckpts;
	size_t nstates;
	struct ms_train_state *states; /* the loaded states (tensors freed) */
	struct ms_model_mem mem;       /* cuda: what the device held */
	char *profile;                 /* cuda: ms_model_profile's JSON */
};

void ms_train_result_release(struct ms_train_result *r);

/* Run the plan. inv is the inventory every state is resolved in and every
 * checkpoint registered in. MS_OK; MS_ECHECK when the gate refused;
 * MS_EINVAL for a bad plan, config or data; MS_EEXIST when a checkpoint
 * directory exists; MS_EIO, MS_EDB, MS_ENOMEM. */
int ms_train_run(struct ms_inv *inv, const struct ms_train_opts *opts,
		 struct ms_train_result *res, struct ms_err *err);


#ifdef __cplusplus
}
#endif

#endif
