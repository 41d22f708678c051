/*
 * model_int.h: the trainer model's internals, shared by the CPU path
 * (model.c) and the CUDA path (kernels/train.cu), which builds its device
 * copy from the same host structures, so the two read one description of
 * the weights, the adapters and their PEFT layout. Not installed.
 */
#ifndef MS_TRAIN_MODEL_INT_H
#define MS_TRAIN_MODEL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "nvfp4.h"
#include "train/model.h"

/* Bounds that let per-row scratch live on the stack (and
 * MS_MODEL_MAX_HEAD_DIM, model.h, which the config parser enforces). */
#define MS_MODEL_MAX_LORA_R 256

struct ms_gmodel;

/* ---- weights ---------------------------------------------------------------- */

/* One NVFP4 block of rows of a frozen projection (a projection fused from
 * two quantized modules, gate and up, has two parts stacked by rows). */
struct qpart {
	uint64_t rows;
	uint8_t *packed, *scales;    /* rowwise bytes (owned) */
	float tscale;
	enum ms_nvfp4_tscale_kind kind;
};

/* A frozen projection y = x W^T + b, W [out, in]. */
struct lin {
	uint32_t out, in;
	float *w;                    /* [out, in] rowwise, decoded */
	float *wt;                   /* [in, out] columnwise: resident, or
					built for one layer's backward */
	float *bias;                 /* [out] or NULL */
	int nparts;                  /* quantized parts; 0: from the base */
	struct qpart part[2];
};

/* A LoRA adapter over E experts (E = 1 for attention):
 * A [E*r, in], B [out, r*E]; expert e: A rows e*r+k, B columns k*E+e. */
struct lora {
	uint32_t r, in, out, E;
	float *A, *B, *gA, *gB;      /* parameters and their gradients */
	int pA, pB;                  /* index of each in m->params */
	uint32_t id;                 /* dropout stream */
};

struct expert {
	struct lin gu;               /* [2F, H]: gate rows then up rows */
	struct lin down;             /* [H, F] */
};

/* One EP rank: the experts [e0, e1) of every MoE layer (held by this rank
 * only) and its gradient accumulators (its own tokens' contributions to
 * the replicated parameters, and its experts' slices of the fused expert
 * adapters), reduced over ranks at the end of a step. */
struct ms_rank {
	uint32_t e0, e1;
	struct expert **ex;          /* [L] -> [e1 - e0], NULL: dense layer */
	double **gacc;               /* [nparams] -> n doubles */
};

struct layer {
	float *ln1, *ln2;            /* [H] */
	struct lin q, k, v, o;
	float *qn, *kn;              /* [head_dim] or NULL */
	struct lora *lq, *lk, *lv, *lo;
	int moe;
	float *router;               /* [E, H] */
	float *ecb;                  /* [E] sigmoid routers' correction bias */
	struct lora *lgu, *ldown;    /* fused expert adapters */
	int shared;                  /* shared experts (glm4_moe) */
	struct expert sh;            /* shared experts, or the dense MLP */
};

/* Per-layer activations kept for the backward. */
struct acts {
	float *x;                    /* [T, H] layer input */
	float *h1, *r1;              /* normed input [T, H], rstd [T] */
	float *q0, *k0, *v;          /* projections before norm [T, D] */
	float *qr, *kr;              /* after norm, before RoPE: for norm bwd
					the rstd is kept: */
	float *rq, *rk;              /* [T, nh] / [T, nkv] */
	float *q, *k;                /* after norm + RoPE */
	float *p;                    /* [B, nh, S, S] attention probs */
	float *ctx;                  /* [T, nh*hd] */
	float *uq, *uk, *uv, *uo;    /* LoRA u = A x [T, r] */
	float *x2;                   /* [T, H] after attention */
	float *h2, *r2;
	/* MoE */
	float *probs;                /* [T, E] router probabilities/scores */
	int32_t *sel;                /* [T, K] */
	float *wts;                  /* [T, K] */
	float *gu;                   /* [T*K, 2F] pre-activation */
	float *act;                  /* [T*K, F] */
	float *ugu, *udn;            /* [T*K, r] */
	float *ye;                   /* [T*K, H] expert output before weight */
	float *xin;                  /* [T*K, H] expert input as received */
	/* shared / dense MLP */
	float *sgu, *sact;           /* [T, 2Fs], [T, Fs] */
};

struct ms_model {
	struct ms_model_cfg cfg;
	struct ms_lora_cfg lora;
	struct ms_model_opts opts;
	uint32_t ep;                 /* ranks */
	float *embed;                /* [V, H] */
	float *norm;                 /* [H] */
	float *lm_head;              /* [V, H] (the embedding when tied) */
	struct layer *layers;
	float *rope_cos, *rope_sin;  /* [S_max, rotary_dim/2], grown on use */
	uint32_t rope_len;
	size_t nparams;
	struct ms_param *params;
	char **pnames;
	struct lora **loras;
	size_t nloras;
	int nthreads;
	/* the last forward's activations */
	uint32_t T, B, S;
	struct acts *acts;           /* [L] */
	float *xf, *hf, *rf;         /* final norm input, output, rstd */
	float *logits;               /* [T, V] */
	/* per-step gradient accumulators (double), one set per rank */
	struct ms_rank *ranks;       /* [ep] */
	int train;                   /* dropout on */
	uint64_t step;
	struct ms_kv_cache *kv;      /* set during ms_model_decode */
	struct ms_gmodel *gpu;       /* the device copy (opts.device cuda) */
};

struct ms_kv_cache {
	uint32_t B, cap, len;        /* sequences, positions held, filled */
	uint32_t nl, dkv;
	float *k, *v;                /* [L, B, cap, dkv], after norm + RoPE */
	int gpu;                     /* k, v (and sc) in device memory */
	float *sc;                   /* the GPU decode's scores [B, nh, cap] */
};

/* The CUDA path (kernels/train.cu; src/train/model_nogpu.c without nvcc):
 * every function MS_ENODEV when this build or machine has no GPU. */
struct ms_adamw;
/* ids in range, batch a multiple of the EP size (both paths check alike) */
int ms_model_check_ids(const struct ms_model *m, const int32_t *ids,
		       uint32_t batch, uint32_t seq, struct ms_err *err);
/* Grow m->rope_cos / rope_sin to S positions (the tables both paths use). */
int ms_model_rope(struct ms_model *m, uint32_t S, struct ms_err *err);
/* Upload the host model built for the device (quantized projections kept
 * as bytes, not decoded) and set m->gpu. */
int ms_gmodel_build(struct ms_model *m, struct ms_err *err);
/* Open cuBLAS and find every function the GPU model calls (no GPU needed:
 * the library and its symbols only). MS_ENODEV saying what is missing. */
int ms_gmodel_blas_load(struct ms_err *err);
/* the grouped CUTLASS expert GEMM alone (train.cu, kernels/xgemm.h;
 * t_train_gpu): MS_ENODEV on a GPU that is not an sm_90, MS_EINVAL where
 * this build does not have it; yb non-NULL: the bf16 output's form too */
int ms_gmodel_xgemm_check(const uint16_t *x, const uint16_t *w, const uint32_t *cnt, uint32_t E,
			  uint32_t N, uint32_t K, float *y, uint16_t *yb, struct ms_err *err);
/* the bf16 path's q/k norm + RoPE alone, forward then backward (train.cu;
 * t_train_gpu): y, rstd, and dx [rows / nhead, ldo] at column c0 (dx in:
 * what the columns outside the heads keep); *fast: 1 where the forward ran
 * the float kernels, 2 the backward */
int ms_gmodel_norm_rope_check(const float *x, const float *w, const float *cs, const float *sn,
			      uint32_t rows, uint32_t n, uint32_t nhead, uint32_t half, uint32_t S,
			      float eps, const uint16_t *dy, uint32_t ldo, uint32_t c0, uint16_t *y,
			      float *rstd, uint16_t *dx, int *fast, struct ms_err *err);
/* the GPU routing's expert sort alone (train.cu; t_train_gpu): perm, pos,
 * cnt as a layer's routing computes them from sel [n] */
int ms_gmodel_sort_check(const int32_t *sel, uint32_t n, uint32_t E, int32_t *perm, int32_t *pos,
			 uint32_t *cnt, struct ms_err *err);
void ms_gmodel_free(struct ms_gmodel *g);
int ms_gmodel_step(struct ms_model *m, const int32_t *ids, const uint8_t *loss_mask,
		   uint32_t batch, uint32_t seq, double grad_scale, uint64_t step,
		   ms_model_dlogits_fn fn, void *ctx, float *logits_out,
		   int backward, double *loss_sum, uint64_t *n_tokens,
		   struct ms_err *err);
int ms_gmodel_sync(struct ms_model *m, struct ms_adamw *o, int dir,
		   struct ms_err *err);
int ms_gmodel_zero_grad(struct ms_model *m, struct ms_err *err);
int ms_gmodel_optim(struct ms_model *m, struct ms_adamw *o, double lr,
		    double *grad_norm, struct ms_err *err);
int ms_gmodel_mem(const struct ms_model *m, struct ms_model_mem *out);
/* A cache for the GPU model: k, v and sc in device memory (kv's sizes set
 * by the caller), kv->gpu set; freed by ms_gmodel_kv_free. */
int ms_gmodel_kv_alloc(struct ms_model *m, struct ms_kv_cache *kv, struct ms_err *err);
void ms_gmodel_kv_free(struct ms_kv_cache *kv);
/* ms_model_decode on the device (the caller checked the cache and moves
 * its length): the same layers as a step's forward at S = 1, RoPE at the
 * cache's length, attention over the cache (float32 in every mode). */
int ms_gmodel_decode(struct ms_model *m, struct ms_kv_cache *kv, const int32_t *ids,
		     float *logits, struct ms_err *err);
int ms_gmodel_profile(const struct ms_model *m, char **json, struct ms_err *err);
/* ms_model_routing of a GPU model (its layer checked by the caller) */
int ms_gmodel_routing(const struct ms_model *m, uint32_t l, int32_t *sel, float *probs,
		      struct ms_err *err);

#endif
