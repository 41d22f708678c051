/*
 * model.h: the trainer's model on the CPU: a frozen MoE transformer (the
 * attention and expert projections dequantized exactly from NVFP4, the rest
 * from the base state in its dtype) with trainable LoRA adapters, forward
 * and backward written out in C.
 *
 * Families, each with the semantics of its transformers implementation
 * (the version pinned in tests/oracle/train_requirements.txt):
 *   qwen3_moe  q/k RMSNorm per head, GQA, RoPE, softmax router over all
 *              experts then top-k (renormalised when norm_topk_prob),
 *              SwiGLU experts, dense MLP layers (mlp_only_layers,
 *              decoder_sparse_step)
 *   mixtral    softmax router, top-k renormalised, SwiGLU experts w1/w3/w2
 *   glm4_moe   partial rotary, optional q/k norm, q/k/v bias, sigmoid router
 *              with e_score_correction_bias, n_group/topk_group group
 *              selection, routed_scaling_factor, shared experts, the first
 *              first_k_dense_replace layers dense
 * Embedding -> L x (RMSNorm, attention, RMSNorm, MoE or dense MLP) -> final
 * RMSNorm -> lm_head (or the tied embedding), causal, positions 0..seq-1 of
 * each sequence, no padding.
 *
 * Arithmetic: float32 storage, float32 or float64 accumulation where a sum
 * runs long (dot products of the hidden size and longer accumulate in
 * double); the result of every operation is independent of the thread
 * count (each output element is owned by one thread and summed in a fixed
 * order), so runs are bit-reproducible.
 *
 * Frozen projections: y = x W^T with W [out, in]. The forward reads the
 * rowwise orientation; the input gradient (dgrad) dx = dy W reads the
 * columnwise one, W^T [in, out], obtained by ms_nvfp4_transpose of the 2D
 * blocks (exact: same codes, same scales) and decoded. Resident mode builds
 * every layer's columnwise copy at build time; on-demand mode builds one
 * layer's during that layer's backward and frees it after. Both decode the
 * same bytes, so gradients are bit-identical (tested).
 *
 * LoRA (PEFT semantics, scaling s = alpha / r):
 *   attention (target_modules q_proj k_proj v_proj o_proj):
 *     y += s * B (A x),  lora_A [r, in], lora_B [out, r]
 *   experts (target_parameters mlp.experts.gate_up_proj, down_proj, fused
 *   [E, out, in] parameters; PEFT's layout for expert e):
 *     A_e = rows e*r .. e*r+r-1 of lora_A [E*r, in]
 *     B_e = columns k*E + e (k = 0..r-1) of lora_B [out, r*E]
 *     W_e += s * B_e A_e
 *   gate_up_proj's out is [gate; up] (2 * ffn rows, gate first).
 *   A is initialised as PEFT does (kaiming-uniform, a = sqrt(5): uniform in
 *   +-1/sqrt(in) for attention, and per the fused parameter's fan-in for
 *   experts) from a generator seeded by lora.seed, B to zero; a warm-start
 *   adapter (PEFT names, F32/BF16/F16) replaces both.
 *   Dropout (lora.dropout > 0) drops the LoRA branch's input elements with
 *   a counter-based generator of (seed, step, module, element) and scales
 *   the kept ones by 1/(1-p), as nn.Dropout in training mode.
 *
 * Expert parallelism (opts.ep_size = N > 1): N virtual ranks in this
 * process. Rank k holds only the experts [k*E/N, (k+1)*E/N) (their frozen
 * weights and their slices of the expert LoRA parameters) and a replica of
 * everything else; the batch is split into N equal parts (batch % N == 0),
 * rank k runs attention on part k; each MoE layer dispatches token rows to
 * the ranks owning their experts through explicit per-(src, dst) buffers
 * (send buffers grouped by destination, receive buffers by source: the
 * layout of an all-to-all-v, done by one exchange function that NCCL
 * replaces later) and combines the results back the same way; each token
 * sums its experts' outputs in slot order whichever rank computed them.
 * Each rank accumulates its own gradients (its tokens' share of the
 * replicated attention adapters, its experts' slices of the fused expert
 * adapters), reduced in rank order at the end of ms_model_step. Loss and
 * logits are bit-identical to EP 1; gradients equal it up to the order of
 * that reduction (bit-identical on the test models, accumulated in double).
 *
 * The model never opens a file: every tensor comes in as host bytes the
 * caller loaded through the verified load (vload.h).
 */
#ifndef MS_TRAIN_MODEL_H
#define MS_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "safetensors.h"

enum ms_model_family {
	MS_MODEL_QWEN3_MOE,
	MS_MODEL_MIXTRAL,
	MS_MODEL_GLM4_MOE,
};

enum ms_router_kind {
	MS_ROUTER_SOFTMAX,   /* softmax over every expert, then top-k */
	MS_ROUTER_SIGMOID,   /* sigmoid, + correction bias for the choice */
};

#define MS_MODEL_MAX_LAYERS 512
#define MS_MODEL_MAX_HEAD_DIM 512

/* config.json, parsed. */
struct ms_model_cfg {
	enum ms_model_family family;
	char model_type[32];         /* "qwen3_moe", "mixtral", "glm4_moe" */
	char arch[64];               /* architectures[0], for adapter_config */
	uint32_t vocab, hidden, n_layers;
	uint32_t n_heads, n_kv_heads, head_dim;
	uint32_t rotary_dim;         /* head_dim * partial_rotary_factor */
	double rope_theta;
	double rms_eps;
	int attention_bias;          /* q/k/v carry a bias (glm4_moe) */
	int qk_norm;                 /* per-head RMSNorm of q and k */
	uint32_t moe_ffn;            /* expert intermediate size */
	uint32_t dense_ffn;          /* dense MLP intermediate size */
	uint32_t n_experts, top_k;
	uint32_t n_shared_experts;   /* shared expert ffn = n * moe_ffn */
	enum ms_router_kind router;
	int norm_topk_prob;
	uint32_t n_group, topk_group;
	double routed_scaling_factor;
	uint8_t dense[MS_MODEL_MAX_LAYERS]; /* layer i has a dense MLP */
	int tie_word_embeddings;
};

/* Parse config.json text (len bytes). A config that asks for something not
 * implemented (another model_type or activation, rope scaling, sliding
 * window, a bias we do not model, ...) is MS_EINVAL with one line naming
 * the field; MS_ENOMEM. */
int ms_model_cfg_parse(const char *json, size_t len, struct ms_model_cfg *cfg,
		       struct ms_err *err);

/* LoRA targets (bits of ms_lora_cfg.targets). */
#define MS_LORA_EXPERTS 0x01u  /* mlp.experts.gate_up_proj and down_proj */
#define MS_LORA_Q       0x02u
#define MS_LORA_K       0x04u
#define MS_LORA_V       0x08u
#define MS_LORA_O       0x10u

/* "experts", "q_proj", "k_proj", "v_proj", "o_proj" -> bit; MS_EINVAL. */
int ms_lora_target_parse(const char *name, uint32_t *bit);

struct ms_lora_cfg {
	uint32_t r;                  /* >= 1 */
	double alpha;
	double dropout;              /* [0, 1) */
	uint32_t targets;            /* MS_LORA_* bits, not 0 */
	uint64_t seed;               /* A's initialisation and dropout */
};

/* One tensor as host bytes (little-endian, row-major), borrowed for the
 * duration of ms_model_build. */
struct ms_wtensor {
	const char *name;
	enum ms_dtype dtype;
	uint32_t ndim;
	uint64_t shape[MS_ST_MAX_RANK];
	const void *data;
	uint64_t nbytes;
};



struct ms_model_opts {
	enum ms_colwise_mode colwise;
	uint32_t ep_size;            /* virtual EP ranks; 0 or 1: none */
	int nthreads;                /* 0: one per CPU */
	double warm_alpha;           /* the warm-start adapter's lora_alpha
					(adapter_config.json); 0: the run's */
	enum ms_device device;
	int gpu_f32;                 /* cuda: float32 GEMMs (no tensor-core
					rounding), the mode the tests compare
					with the CPU; 0: bf16 tensor-core
					GEMMs, float32 everywhere else */
	int expert_gemm;             /* cuda, bf16: enum ms_expert_gemm
					(kernels/ggemm.h for the grouped
					and fused ones) */
	int attention;               /* cuda, bf16: enum ms_attention */
};

struct ms_model;

/*
 * Build the model.
 *   base:   the base state (embedding, norms, routers, correction biases,
 *           lm_head; and every projection not found in quant). Experts as
 *           per-expert 2D tensors (model.layers.N.mlp.experts.E.gate_proj
 *           .weight, Mixtral's block_sparse_moe.experts.E.w1/w2/w3) or
 *           fused 3D ones (mlp.experts.gate_up_proj [E, 2F, H], down_proj
 *           [E, H, F]). BF16, F16 or F32.
 *   quant:  the NVFP4 state (either msconvert format; names per quant.h;
 *           any recipe) with 2D blocks, or NULL/0: projections then come
 *           from base as they are. A projection found here is taken from
 *           here; a 1D-block tensor is refused (MS_EINVAL naming it).
 *   lora:   the adapter configuration.
 *   adapter: a warm-start PEFT adapter's tensors (adapter_model.safetensors
 *           names) or NULL/0. It must adapt every module the run targets
 *           and nothing else. A module's rank rt (from its shapes, so
 *           PEFT's rank_pattern works) may be below lora->r: ranks rt..r-1
 *           start fresh (A initialised, B zero) and B is rescaled by
 *           (warm_alpha / rt) / (alpha / r), so the model starts with the
 *           adapter's delta exactly. Mixtral adapters with one LoRA per
 *           expert module (block_sparse_moe.experts.E.w1/w2/w3) load into
 *           the fused layout; w1 and w3 need 2 * rt <= lora->r there.
 *   opts:   NULL for defaults (resident, EP 1, one thread per CPU).
 * MS_EINVAL (missing tensor, shape or dtype wrong: one line naming the
 * tensor), MS_ENOMEM.
 */
int ms_model_build(struct ms_model **out, const struct ms_model_cfg *cfg,
		   const struct ms_wtensor *base, size_t nbase,
		   const struct ms_wtensor *quant, size_t nquant,
		   const struct ms_lora_cfg *lora,
		   const struct ms_wtensor *adapter, size_t nadapter,
		   const struct ms_model_opts *opts, struct ms_err *err);
void ms_model_free(struct ms_model *m);

const struct ms_model_cfg *ms_model_config(const struct ms_model *m);

/*
 * Forward only (LoRA applied, dropout off). ids [batch, seq] in [0, vocab);
 * logits (may be NULL) gets [batch, seq, vocab] float32. MS_EINVAL on an id
 * out of range or batch % ep_size != 0; MS_ENOMEM.
 */
int ms_model_forward(struct ms_model *m, const int32_t *ids, uint32_t batch,
		     uint32_t seq, float *logits, struct ms_err *err);

/*
 * The last forward's routing of MoE layer l (after ms_model_forward, or the
 * forward of a step): sel [T * top_k], each token's experts in the order
 * chosen, and probs [T * n_experts], the router's scores (softmax
 * probabilities, or sigmoid scores before any correction bias), T the
 * batch x seq of that call; from the device for a GPU model. For tests
 * telling a routing near-tie from a wrong result. MS_EINVAL for a layer
 * that is not MoE or a model that has not run a forward.
 */
int ms_model_routing(const struct ms_model *m, uint32_t l, int32_t *sel, float *probs,
		     struct ms_err *err);

/*
 * Forward + backward of the next-token cross-entropy (transformers'
 * ForCausalLMLoss: position t predicts ids[t+1]). loss_mask [batch, seq]
 * (NULL: every position) masks LABELS: the prediction of ids[b, t] counts
 * when loss_mask[b, t] != 0 (t >= 1; position 0 is never a label).
 * *loss_sum gets the sum of -log p over counted labels (double), *n_tokens
 * their number. Gradients ACCUMULATE (+=) grad_scale * d(loss_sum)/d(param)
 * into each parameter's g, so gradient accumulation is repeated calls and
 * the mean loss over N tokens is grad_scale = 1/N. step (the optimizer
 * step, used only by dropout) makes the dropout masks differ per step.
 */
int ms_model_step(struct ms_model *m, const int32_t *ids,
		  const uint8_t *loss_mask, uint32_t batch, uint32_t seq,
		  double grad_scale, uint64_t step, double *loss_sum,
		  uint64_t *n_tokens, struct ms_err *err);

/*
 * Incremental decoding with a KV cache: batch sequences, up to cap
 * positions each. ms_model_decode takes one new token per sequence (ids
 * [batch]) at position ms_kv_cache_len, keeps its keys and values (after
 * q/k norm and RoPE) in the cache and writes the next-token logits
 * [batch, vocab]: the same arithmetic, in the same order, as the row of
 * that position in a full ms_model_forward of the prefix (tested equal).
 * On a CUDA model the cache lives in device memory and the step runs there
 * (the attention over the cache in float32 in every mode): equal to the
 * CPU's within its GEMMs' rounding. LoRA applied, dropout off. MS_EINVAL when the cache is full, made for
 * another model, or batch % ep_size != 0; MS_ENOMEM.
 */
struct ms_kv_cache;
int ms_kv_cache_new(const struct ms_model *m, uint32_t batch, uint32_t cap,
		    struct ms_kv_cache **out, struct ms_err *err);
void ms_kv_cache_free(struct ms_kv_cache *kv);
void ms_kv_cache_reset(struct ms_kv_cache *kv);
uint32_t ms_kv_cache_len(const struct ms_kv_cache *kv);
int ms_model_decode(struct ms_model *m, struct ms_kv_cache *kv, const int32_t *ids,
		    float *logits, struct ms_err *err);

/*
 * Forward + backward of a loss the caller defines over the logits (the RL
 * objectives of rl.h): fn gets the logits [batch * seq, vocab] of this
 * forward (LoRA applied, dropout as in ms_model_step at step) and overwrites
 * them in place with d loss / d logits, already scaled; the backward then
 * ACCUMULATES (+=) d loss / d param into each parameter's g. fn's error
 * stops the step with nothing accumulated.
 */
typedef int (*ms_model_dlogits_fn)(void *ctx, float *logits, size_t T,
				   uint32_t V, struct ms_err *err);
int ms_model_step_fn(struct ms_model *m, const int32_t *ids, uint32_t batch,
		     uint32_t seq, uint64_t step, ms_model_dlogits_fn fn, void *ctx,
		     struct ms_err *err);

/* One trainable tensor: its key exactly as PEFT saves it in
 * adapter_model.safetensors (e.g. "base_model.model.model.layers.0.
 * self_attn.q_proj.lora_A.weight"), its shape, float32 values w and
 * gradient g of n elements (owned by the model; stable for its lifetime). */
struct ms_param {
	const char *name;
	uint32_t ndim;
	uint64_t shape[2];
	uint64_t n;
	float *w;
	float *g;
};

/* The trainable tensors in a fixed order (sorted by name). */
size_t ms_model_params(struct ms_model *m, const struct ms_param **out);
void ms_model_zero_grad(struct ms_model *m);

/*
 * CUDA models (opts.device MS_DEVICE_CUDA) keep the parameters, their
 * gradients and the optimizer's moments on the GPU; the ms_param arrays are
 * host copies, current only after ms_model_sync(MS_MODEL_TO_HOST) (w and
 * g, and o's moments when o is given); MS_MODEL_TO_DEVICE uploads w (and
 * o's moments) after the caller changed them (a resumed checkpoint). A CPU
 * model has nothing to move: MS_OK.
 */
#define MS_MODEL_TO_HOST   1
#define MS_MODEL_TO_DEVICE 2
struct ms_adamw;
int ms_model_sync(struct ms_model *m, struct ms_adamw *o, int dir,
		  struct ms_err *err);

/*
 * One optimizer step where the parameters live: the global gradient norm
 * (into *grad_norm, before clipping), clipping to o->cfg.clip, then AdamW
 * with learning rate lr (o->step += 1): optim.h's formulas, on the CPU
 * through ms_grad_clip / ms_adamw_update over the model's parameters (o made
 * over ms_model_params in order), on the GPU by kernels with the same
 * per-element float32 arithmetic.
 */
int ms_model_optim_step(struct ms_model *m, struct ms_adamw *o, double lr,
			double *grad_norm, struct ms_err *err);

int ms_model_mem(const struct ms_model *m, struct ms_model_mem *out);

/* What ms_model_mem will report for a CUDA model of cfg with adapter lora
 * after a step of batch x seq (gpu_plan.c; no GPU needed): the footprint
 * planner's prediction. It assumes the quantized state holds every
 * attention, expert and shared projection whose input dimension is a
 * multiple of 16 and no other (msconvert's default selection). MS_OK. */
/* the size of an expert's NVFP4 descriptor for the fused expert GEMMs
 * (struct ms_ggemm_nvfp4, kernels/ggemm.h; train.cu asserts it) */
#define MS_GMODEL_Q4_DESC 72u
/* the per-expert bf16 path's frozen expert GEMMs, where they are not the
 * grouped CUTLASS GEMM, run on this many streams, each with its own cuBLAS
 * handles and a workspace of MS_GMODEL_LANE_WS bytes (train.cu's
 * expert_gemms; the main stream's bf16 GEMMs share the first) */
#define MS_GMODEL_LANES 4u
#define MS_GMODEL_LANE_WS (32u << 20)
/* ... and the scratch of its grouped CUTLASS form (kernels/xgemm.h's
 * MS_XGEMM_SCRATCH; allocated whether or not the build and device run it) */
#define MS_GMODEL_XGEMM_WS (1u << 20)
/* The folded expert LoRA's gradients cut each expert's rows into this many
 * runs, a block each, with float32 partial sums (kernels/ggemm.h,
 * ms_ggemm_wgrad_bf16's nsplit) held in scratch: E * r * max(H, 2 F)
 * floats a run. One block an expert's whole rows left the bench model's
 * most loaded expert setting the time. */
#define MS_GMODEL_WGRAD_SPLIT 4u
/* cuDNN's fused attention (kernels/sdpa.h): the bf16 path tries it, unless
 * --attention flash, for head dims that are multiples of 8 up to 256 and
 * more than one token a sequence (cuDNN refuses S = 1). Where it is tried
 * its buffers are held whether or not cuDNN then loads (bf16 O, dQ, dK, dV
 * and a workspace of at least ms_gmodel_sdpa_ws), so the planner need not
 * know the machine's cuDNN. */
static inline int ms_gmodel_sdpa_tried(int f32, int attention, uint32_t hd, uint32_t S)
{
	return !f32 && attention != MS_ATTENTION_FLASH && hd && hd % 8 == 0 && hd <= 256 &&
	       S > 1;
}
/* The workspace held for it. cuDNN's deterministic backward keeps partial
 * dQ sums (one per block of keys, reduced in a fixed order), so its
 * workspace grows as S^2: cuDNN 9.14 on the H200 asked for about 2 S
 * bytes a (sequence, head, query row) plus up to 520 (and 130 KiB at the
 * smallest shapes): 604504320 bytes at the trainer bench's B 4, 16 heads,
 * S 2048 (t_flash_gpu and the bench's profile measure it). Held: 2 Sp +
 * 640 bytes a row over Sp = S rounded up to 128, and 1 MiB. A cuDNN asking
 * for more gets more (the profile says how much it asked), and the
 * planner is then short by the difference. */
static inline uint64_t ms_gmodel_sdpa_ws(uint32_t B, uint32_t nh, uint32_t S)
{
	uint64_t sp = (uint64_t)(S + 127) / 128 * 128;
	return (uint64_t)B * nh * sp * (2 * sp + 640) + (1u << 20);
}

/* MS_DECODE_AHEAD as the GPU trainer reads it (its bf16 path decodes each
 * layer pass's weights on a stream of its own while the pass before runs,
 * into a second decode scratch, unless it is 0): *on 1 where it is unset,
 * empty or 1 (the trainer's choice of where a pass queues the next one's
 * decode), 2 for start (at the pass's start), 3, 4 or 5 for attn-fwd,
 * attn-bwd or attn (at the attention core of a forward pass, a backward
 * one or both), 0 where it is 0; MS_EINVAL for anything else. gpu_plan.c;
 * the trainer refuses what it refuses, and the planner predicts with it. */
int ms_gmodel_decode_ahead(int *on, struct ms_err *err);

int ms_gmodel_predict(const struct ms_model_cfg *cfg, const struct ms_lora_cfg *lora,
		      uint32_t batch, uint32_t seq, enum ms_colwise_mode colwise,
		      int gpu_f32, int expert_gemm, int attention, struct ms_model_mem *out);

/* A CUDA model's time per phase over the steps so far (CUDA events), as
 * JSON {"steps": n, "step_ms": mean, "colwise_ms": ..., "kernels": [{"name",
 * "ms", "calls"}]} (ms_free'd by the caller); MS_EINVAL on a CPU model. */
int ms_model_profile(const struct ms_model *m, char **json, struct ms_err *err);

/* adapter_config.json for the adapter these parameters form (PEFT 0.21
 * keys: r, lora_alpha, lora_dropout, target_modules, target_parameters,
 * peft_type, base_model class, ...), NUL-terminated, ms_free'd by the
 * caller. MS_ENOMEM. */
int ms_model_adapter_config(const struct ms_model *m, char **json,
			    struct ms_err *err);

#endif
