/*
 * train.cu: the trainer model on one NVIDIA GPU (model_int.h's ms_gmodel_*):
 * the function model.c computes on the CPU, with the device's arithmetic.
 *
 * What lives on the device: the NVFP4 base as stored (rowwise codes and
 * scales; the columnwise copy too in resident mode, built with the exact
 * transpose), the float weights (embedding, lm_head, norms, routers, any
 * projection not quantized), the LoRA parameters with their gradients and
 * AdamW moments in one block, the activations the backward needs, scratch.
 *
 * A layer's forward decodes its projections from the rowwise bytes into a
 * scratch of the GEMM type in one launch; its backward decodes W^T from the
 * columnwise bytes (resident: kept; on-demand: transposed from the rowwise
 * bytes a chunk at a time into a small scratch that never holds more than a
 * quarter of a layer), so dgrad reads the columnwise orientation as the CPU
 * path does. Both modes decode the same values (the transpose is exact),
 * so loss, gradients and the trained adapter are bit-identical.
 *
 * GEMMs go through cuBLAS: the frozen projections with bf16 operands on the
 * tensor cores and float32 accumulation and output (opts.gpu_f32: float32
 * operands, no TF32, the mode the tests compare with the CPU path), the
 * LoRA products on float32 operands (TF32 tensor cores, or pedantic float32
 * in the test mode). Activations are float32; an operand of a bf16 GEMM is
 * cast into scratch just before it. Experts: token rows sorted by expert
 * (a stable counting sort on the device, so the order does not depend on
 * timing), one GEMM per expert over its rows. Attention: with bf16
 * operands and a head dim of 16, 32, 64 or 128, the fused flash kernels
 * (flash.cu: no S x S matrix in memory, each row's log-sum-exp kept for
 * the backward); otherwise (the test mode, other head dims) per sequence,
 * strided-batched GEMMs for the scores and the context, a causal softmax
 * kernel, the probabilities recomputed in the backward (scores are never
 * kept). Routing (softmax or sigmoid with groups, top-k, renormalisation,
 * scaling) runs one thread per token with model.c's code path, its logits
 * summed in double in model.c's order. Reductions that decide a value
 * (RMSNorm, softmax, the loss) accumulate in double, but for the q/k norm +
 * RoPE whose output is a bf16 operand (norm_rope_f.cuh: float sums, under
 * the bf16 rounding that follows; half the kernels' time was the double
 * arithmetic).
 *
 * Dropout reproduces model.c's masks (the same counter-based generator of
 * seed, step, adapter and row key), so a run with dropout is the same
 * function on both devices.
 */
#include <cjson/cJSON.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "gpu_internal.h"
#include "flash.h"
#include "sdpa.h"
#include "fp4.h"
#include "ggemm.h"
#include "norm_rope_f.cuh"
#include "router.h"
#include "xgemm.h"
extern "C" {
#include "train/model_int.h"
#include "train/optim.h"
}

#define NTH 256
/* cuDNN attention plans kept, by shape */
#define SD_CACHE 4

/* ---- cuBLAS, opened when a GPU model is first built ------------------------------ */

/*
 * cuBLAS is opened with dlopen at the first GPU model, not linked: a
 * program that trains on the CPU, or never trains, neither needs it
 * installed nor pays for loading it (about a hundred megabytes, and a
 * start the interrupt tests time), and the loader's handling of its rpath
 * stays out of the valgrind runs of the fault sweep. The pointers have the
 * types of the functions in cublas_v2.h (decltype), so a call is checked
 * as a direct one would be; the library is the major version of those
 * headers.
 */
#define MS_STR2(x) #x
#define MS_STR(x) MS_STR2(x)
static const char blas_lib[] = "libcublas.so." MS_STR(CUBLAS_VER_MAJOR);
/* cuBLASLt ships with cuBLAS (which itself loads it) */
static const char lt_lib[] = "libcublasLt.so." MS_STR(CUBLAS_VER_MAJOR);

static struct {
	decltype(&cublasCreate_v2) create;
	decltype(&cublasDestroy_v2) destroy;
	decltype(&cublasSetStream_v2) set_stream;
	decltype(&cublasSetWorkspace_v2) set_workspace;
	/* (C++ sees a second, cudaDataType-compute overload of these two:
	 * the ones with cublasComputeType_t, which the calls use) */
	cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
			       int, const void *, const void *, cudaDataType, int, const void *,
			       cudaDataType, int, const void *, void *, cudaDataType, int,
			       cublasComputeType_t, cublasGemmAlgo_t);
	cublasStatus_t (*gemm_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
				       int, int, const void *, const void *const[], cudaDataType,
				       int, const void *const[], cudaDataType, int, const void *,
				       void *const[], cudaDataType, int, int, cublasComputeType_t,
				       cublasGemmAlgo_t);
	decltype(&cublasGemmGroupedBatchedEx) gemm_grouped;
	decltype(&cublasLtCreate) lt_create;
	decltype(&cublasLtDestroy) lt_destroy;
	decltype(&cublasLtMatmulDescCreate) lt_desc_create;
	decltype(&cublasLtMatmulDescDestroy) lt_desc_destroy;
	decltype(&cublasLtMatmulDescSetAttribute) lt_desc_set;
	decltype(&cublasLtMatrixLayoutCreate) lt_layout_create;
	decltype(&cublasLtMatrixLayoutDestroy) lt_layout_destroy;
	decltype(&cublasLtMatmulPreferenceCreate) lt_pref_create;
	decltype(&cublasLtMatmulPreferenceDestroy) lt_pref_destroy;
	decltype(&cublasLtMatmulPreferenceSetAttribute) lt_pref_set;
	decltype(&cublasLtMatmulAlgoGetHeuristic) lt_heuristic;
	decltype(&cublasLtMatmul) lt_matmul;
	int state;                   /* 0 not tried, 1 loaded, -1 failed */
	char why[200];
} blas;
static pthread_mutex_t blas_mu = PTHREAD_MUTEX_INITIALIZER;
/* the two spelled-out types are exactly those of the headers' functions:
 * initialising them from the overloaded names picks the overload of that
 * type, and fails to compile when none has it */
static_assert(sizeof(static_cast<decltype(blas.gemm)>(&cublasGemmEx)) > 0,
	      "blas.gemm is not cublasGemmEx's type");
static_assert(sizeof(static_cast<decltype(blas.gemm_batched)>(&cublasGemmBatchedEx)) > 0,
	      "blas.gemm_batched is not cublasGemmBatchedEx's type");

#define BLAS_SYM(field, name)                                                 \
	do {                                                                   \
		if (!(blas.field = (decltype(blas.field))dlsym(h, name))) {    \
			snprintf(blas.why, sizeof blas.why, "%s: no symbol %s",  \
				 lib, name);                                   \
			goto done;                                             \
		}                                                              \
	} while (0)

extern "C" int ms_gmodel_blas_load(struct ms_err *err)
{
	void *h;
	const char *lib = blas_lib;
	pthread_mutex_lock(&blas_mu);
	if (blas.state) {
		pthread_mutex_unlock(&blas_mu);
		goto out;
	}
	blas.state = -1;
	if (!(h = dlopen(blas_lib, RTLD_NOW | RTLD_LOCAL))) {
		snprintf(blas.why, sizeof blas.why, "%s", dlerror());
		goto done;
	}
	BLAS_SYM(create, "cublasCreate_v2");
	BLAS_SYM(destroy, "cublasDestroy_v2");
	BLAS_SYM(set_stream, "cublasSetStream_v2");
	BLAS_SYM(set_workspace, "cublasSetWorkspace_v2");
	BLAS_SYM(gemm, "cublasGemmEx");
	BLAS_SYM(gemm_batched, "cublasGemmBatchedEx");
	BLAS_SYM(gemm_grouped, "cublasGemmGroupedBatchedEx");
	lib = lt_lib;
	if (!(h = dlopen(lt_lib, RTLD_NOW | RTLD_LOCAL))) {
		snprintf(blas.why, sizeof blas.why, "%s", dlerror());
		goto done;
	}
	BLAS_SYM(lt_create, "cublasLtCreate");
	BLAS_SYM(lt_destroy, "cublasLtDestroy");
	BLAS_SYM(lt_desc_create, "cublasLtMatmulDescCreate");
	BLAS_SYM(lt_desc_destroy, "cublasLtMatmulDescDestroy");
	BLAS_SYM(lt_desc_set, "cublasLtMatmulDescSetAttribute");
	BLAS_SYM(lt_layout_create, "cublasLtMatrixLayoutCreate");
	BLAS_SYM(lt_layout_destroy, "cublasLtMatrixLayoutDestroy");
	BLAS_SYM(lt_pref_create, "cublasLtMatmulPreferenceCreate");
	BLAS_SYM(lt_pref_destroy, "cublasLtMatmulPreferenceDestroy");
	BLAS_SYM(lt_pref_set, "cublasLtMatmulPreferenceSetAttribute");
	BLAS_SYM(lt_heuristic, "cublasLtMatmulAlgoGetHeuristic");
	BLAS_SYM(lt_matmul, "cublasLtMatmul");
	blas.state = 1;
done:
	pthread_mutex_unlock(&blas_mu);
out:
	if (blas.state == 1)
		return MS_OK;
	return ms_err_set(err, MS_ENODEV, "--device cuda needs cuBLAS: %s", blas.why);
}

/* ---- errors ------------------------------------------------------------------ */

static int cb_err(struct ms_err *err, cublasStatus_t s, const char *what)
{
	return ms_err_set(err, MS_EIO, "cuBLAS: %s failed (status %d)", what, (int)s);
}

#define CB(call)                                                               \
	do {                                                                   \
		cublasStatus_t cb_s_ = (call);                                 \
		if (cb_s_ != CUBLAS_STATUS_SUCCESS) {                          \
			rc = cb_err(err, cb_s_, #call);                        \
			goto out;                                              \
		}                                                              \
	} while (0)

/* after a kernel launch */
#define LK()                                                                   \
	do {                                                                   \
		CK(cudaGetLastError());                                        \
		site(g, __LINE__);                                             \
	} while (0)

static unsigned nblk(uint64_t n, unsigned per = NTH)
{
	uint64_t b = (n + per - 1) / per;
	return (unsigned)(b < 65535u * 16 ? (b ? b : 1) : 65535u * 16);
}

/* k_cast<bf16>'s grid over n elements: a thread takes four (aligned); a
 * grid of nblk(n) left three blocks in four with nothing to do */
static unsigned cast_blocks(uint64_t n)
{
	return nblk((n + 3) / 4);
}

/* ---- the device model ---------------------------------------------------------- */

struct dpart {
	uint64_t rows;
	uint32_t pst, sst;           /* columnwise row strides */
	uint32_t rpst, rsst;         /* rowwise row strides (in padded to 16) */
	uint8_t *pk, *sc;            /* rowwise codes, scales */
	uint8_t *pkt, *sct;          /* columnwise (resident mode) */
	float tscale;
	int kind;
};

/* A frozen projection [out, in]; quantized parts decode into the layer's
 * scratch at woff (forward: W [out, in]; backward: W^T [in, out]); a float
 * one keeps both orientations in the GEMM type. */
struct dlin {
	uint32_t out, in;
	int nparts;
	struct dpart part[2];
	void *w, *wt;                /* not quantized */
	float *bias;
	uint64_t woff;               /* elements into the decode scratch */
	uint32_t lyr;                /* its layer (wbase: which scratch) */
	uint32_t pst, sst;           /* columnwise row strides (codes, scales) */
	uint32_t fr;                 /* the columns an expert's folded LoRA
					adds to its GEMMs' K (fold_width of the
					rank; fold_tails): W [out, in + fr]
					forward, W^T [in, out + fr] backward */
};

struct dlora {
	uint32_t r, in, out, E;
	float *A, *B, *gA, *gB;      /* A [E*r, in] (PEFT's); B [E, out, r]
					(per expert contiguous; PEFT's [out,
					r*E] on the host, permuted at sync) */
	uint32_t id;
	int pA, pB;
};

struct dlayer {
	float *ln1, *ln2, *qn, *kn, *router, *ecb;
	struct dlin q, k, v, o;
	struct dlora *lq, *lk, *lv, *lo, *lgu, *ldn;
	int moe;
	struct dlin *egu, *edn;      /* [E] */
	int sh;
	struct dlin sgu, sdn;
	uint64_t wtotal;             /* decode scratch elements */
	uint64_t colbytes;           /* columnwise NVFP4 bytes of the layer */
	/* decode descriptors (device arrays) */
	struct ddesc *fwd, *bwd;
	int nfwd, nbwd;
	struct ddesc *hbwd;          /* host copy of bwd */
	/* on-demand: the chunks of bwd's parts whose columnwise bytes fit
	 * colbuf together (col_chunks), chunk c ending before part cend [c] */
	int *cend, nchunk;
	/* q, k and v NVFP4, unfolded, their scratch adjacent: the backward
	 * decodes [W_q^T | W_k^T | W_v^T] as one [in, q+k+v out] matrix and
	 * their input gradient is one GEMM (build_descs) */
	int qkv3;
	/* the q/k/v LoRA folded into those GEMMs (afr: the tail's columns,
	 * 0 unfolded; acol: each of lq, lk, lv's fold_width(r) columns in
	 * it): forward W_i [out, in + afr] = [W_i | s B_j at acol j], X
	 * [T, in + afr] = [X | U_q U_k U_v]; backward [W_q^T W_k^T W_v^T |
	 * A_j^T at acol j] against [dq dk dv | dU_j] */
	uint32_t afr, acol[3];
	/* grouped expert GEMMs (device [4][E]): W_e of gate/up and of down,
	 * then their W_e^T; bf16 pointers into the decode scratch or at the
	 * float weights (gbp), or NVFP4 descriptors when fused (gbq) */
	const void *const *gbp;
	const struct ms_ggemm_nvfp4 *gbq;
};

/* One block-decode job: rows x cols codes (row stride cols/2) and scales
 * (row stride cols/16) to out (row stride ld) in the GEMM type. */
struct ddesc {
	const uint8_t *pk, *sc;
	void *out;
	uint32_t rows, cols, ld;
	uint32_t pst, sst;           /* row strides of codes (bytes), scales */
	uint32_t spst, ssst;         /* the same of the transpose's source */
	float tscale;
	int kind;
	/* on-demand: the rowwise source to transpose (pk/sc then point into
	 * the chunk scratch) */
	const uint8_t *spk, *ssc;
	uint64_t cbytes;             /* packed + scales of the transposed part */
};

struct dacts {
	float *x, *h1, *r1, *q0, *k0, *v, *rq, *rk, *q, *k, *ctx;
	float *uq, *uk, *uv, *uo, *x2, *h2, *r2;
	float *probs, *wts, *gu, *act, *ugu, *udn, *ye, *sgu, *sact;
	/* (gu and ye hold bf16 in a folded expert LoRA's layer: the expert
	 * GEMMs' outputs, acts_alloc; ugu and udn hold U in bf16 there) */
	int32_t *sel, *perm, *pos;
	uint32_t *cnt;               /* host (pinned): rows per expert */
	uint32_t *goff;              /* grouped GEMMs: device [E + 1] row
					offsets, then [E + 1] tile offsets */
	float *lse;                  /* flash attention: [B, nh, S] row
					log-normalisers for the backward */
	__nv_bfloat16 *actb;         /* a folded expert LoRA's layer: SwiGLU's
					output in bf16 (act NULL): all the
					backward reads of it (its LoRA's
					gradients), at half the bytes */
	__nv_bfloat16 *h2b;          /* ... and the ln2 norm's output in bf16,
					written by the norm: the experts' rows
					are gathered from it, and gate/up's
					LoRA gradients read it (no cast of h2
					in the backward) */
};

enum phase {
	PH_EMBED, PH_NORM, PH_ATT_PROJ, PH_ATT_CORE, PH_ROUTE, PH_EXPERTS,
	PH_COMBINE, PH_SHARED, PH_DECODE_ROW, PH_DECODE_COL, PH_TRANSPOSE,
	PH_HEAD, PH_LOSS, PH_B_HEAD, PH_B_EXPERTS, PH_B_ROUTE, PH_B_ATT_CORE,
	PH_B_ATT_PROJ, PH_B_SHARED, PH_B_NORM, PH_OPTIM, PH_COPY, PH_LORA, PH_B_LORA,
	PH_B_LORA_GRAD, PH_ATT_LORA, PH_B_ATT_LORA, PH_TOPK, PH_SORT, PH_B_ROUTER,
	PH_B_UNPERM, PH_WAIT_DEC, PH_S_DECODE_ROW, PH_S_DECODE_COL, PH_S_TRANSPOSE, PH_N
};
/* the phases after PH_WAIT_DEC run on the decode stream (decode_unit),
 * beside the main stream's */
#define PH_SIDE(p) ((p) > PH_WAIT_DEC)
static const char *phase_name[PH_N] = {
	"embed", "rmsnorm+rope", "attention projections (+LoRA)",
	"attention core (scores, softmax, context)", "router logits",
	"expert GEMMs (+LoRA)", "combine", "shared/dense MLP",
	"decode NVFP4 rowwise", "decode NVFP4 columnwise",
	"columnwise transpose (on demand)", "lm_head", "cross-entropy",
	"bwd lm_head", "bwd expert GEMMs (+LoRA)", "bwd combine",
	"bwd attention core", "bwd attention projections (+LoRA)",
	"bwd shared/dense MLP", "bwd rmsnorm+rope", "optimizer", "host copies",
	"expert LoRA (grouped)", "bwd expert LoRA",
	"bwd expert LoRA gradients (folded)", "attention LoRA", "bwd attention LoRA",
	"top-k", "sort + gather", "bwd router", "bwd unpermute",
	"wait for the decode stream", "decode NVFP4 rowwise (decode stream)",
	"decode NVFP4 columnwise (decode stream)",
	"columnwise transpose (on demand, decode stream)",
};

struct dreg {
	void *p;
	uint64_t n;
};

/*
 * A GEMM's shape (bf16, or float32 on TF32), its operands' alignment, and
 * what cuBLASLt chose for it (lt_get). cublasGemmEx looks its kernel up
 * again at every call: with a GEMM per expert the host's time set the pace
 * of the expert phases
 * (measured on the H200 at the bench shapes: the forward's 54 ms of host
 * time a step against 51 of GPU, some 25 us a call). Kept descriptors and
 * algorithm brought that to 32 ms (the step 182.8 -> 179.9 ms); the rest is
 * cuBLASLt's own work a call.
 */
struct ltkey {
	uint32_t M, N, K, lda, ldb, ldc;
	int ta, tb, ct, ty;          /* ty: the operands' type */
	int cty;                     /* C's type: float32 or bf16 */
	uint32_t al[3];              /* A's, B's, C's alignment, up to 16 */
};

struct ltent {
	struct ltkey k;
	int state;                   /* 0 empty, 1 kept, -1 cublasGemmEx's */
	cublasLtMatmulDesc_t op;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulAlgo_t algo;
};

#define LT_SLOTS 2048u

/* where a GEMM goes: a stream, the cuBLAS handles on it (lt NULL: no
 * kept plans) and the workspace both use */
struct gctx {
	cudaStream_t st;
	cublasHandle_t bl;
	cublasLtHandle_t lt;
	void *ws;
};

/* an expert's share of a product on the lanes (expert_gemms): its rows
 * from off, in one or two GEMMs of part rows */
struct lplan {
	uint32_t e, lane, part[2];
	uint64_t off;
};

/* the profile's sums over a run of steps (ph_fold) */
#define MAXSITE 1024
#define PROF_WARM 2
struct prof_acc {
	int nsite;
	int site_key[MAXSITE];
	double site_ms[MAXSITE];
	double site_idle_ms[MAXSITE];  /* of site_ms: the GPU idle, waiting
					  for the host to queue the launch */
	double site_host_ms[MAXSITE];  /* the host's time from the mark
					  before to the launch's */
	uint64_t site_calls[MAXSITE];
	double ph_ms[PH_N];
	double ph_host_ms[PH_N];     /* the host's time between the marks:
					near ph_ms, the GPU waited on it */
	double ph_idle_ms[PH_N];     /* of ph_ms: the GPU idle, the host not
					yet having queued the work */
	uint64_t ph_calls[PH_N];
	uint64_t steps;
	double step_ms;
};

struct ms_gmodel {
	cublasHandle_t blas;
	cudaStream_t st;
	/* the per-expert bf16 path's frozen expert GEMMs (expert_gemms): nlane
	 * lanes, each a stream with its handles and workspace; lev [0] forks
	 * them off st, lev [1 + i] joins lane i back. The main stream's bf16
	 * GEMMs use lane 0's handles and workspace too (st never runs beside
	 * lane 0). */
	uint32_t nlane;
	struct gctx lane[MS_GMODEL_LANES];
	cudaEvent_t lev[MS_GMODEL_LANES + 1];
	struct ltent *ltc;           /* [LT_SLOTS] */
	struct lplan *plan;          /* [E] */
	void *xsc;                   /* xgemm's scratch (MS_XGEMM_SCRATCH) */
	int f32;                     /* GEMM operands float32 */
	int grouped;                 /* expert GEMMs by ggemm.h (bf16 only) */
	int fused;                   /* ... decoding NVFP4 inside them */
	int v16;                     /* this layer's forward's v GEMM wrote V in
					bf16 for cuDNN (layer_fwd) */
	const float *pend_src;       /* the last layer's residual add, left to
					the next norm (rms_in): pend_dst =
					pend_src + y */
	float *pend_dst;
	const __nv_bfloat16 *pend_ye;  /* and y not written: the folded MoE
					layer's expert outputs, summed over
					each token's slots (pend_pos, weights
					pend_w) by that norm (k_rms's ss) */
	const int32_t *pend_pos;
	const float *pend_w;
	void *do16;                  /* this layer's backward's bf16 dO
					(layer_bwd), or NULL */
	int dv16;                    /* this layer's backward keeps cuDNN's dQ,
					dK, dV in bf16 (layer_bwd) */
	int fold;                    /* the expert LoRA may fold (fold_tails) */
	int cnt_wait;                /* a layer's counts on their way to the host */
	int folded;                  /* ... and some layer's does */
	__nv_bfloat16 *fab;          /* a LoRA factor of every expert, bf16 */
	uint32_t afrmax;             /* the widest layer's afr (0: none folds) */
	__nv_bfloat16 *aab;          /* the attention fold's factors in bf16:
					the stacked A [afr, H], one B [out, fw] */
	void *gbp;                   /* every MoE layer's gbp or gbq */
	cudaEvent_t cev;             /* a layer's expert counts reached the host */
	cudaDataType_t gt;           /* GEMM operand type */
	size_t esz;                  /* its size */
	cublasComputeType_t ct_base, ct_lora;
	uint32_t H, V, L, E, K, F, nh, nkv, hd, dq, dkv, r;
	float lscale;                /* alpha / r */
	double pdrop;                /* LoRA dropout */
	uint64_t seed, step;         /* dropout stream of this step */
	int train;                   /* dropout on */
	float *embed, *norm;
	void *lm;                    /* [V, H] GEMM type */
	struct dlayer *ly;
	struct dlora *loras;
	size_t nloras;
	/* parameters: one block each for w, g, m, v (params in order) */
	float *W, *G, *Mo, *Vo;
	uint64_t *poff;              /* host: element offset of param i */
	uint64_t ntot;
	int moments_valid;           /* Mo/Vo hold the optimizer's state */
	/* scratch */
	void *wbuf;                  /* decode scratch (GEMM type): two of
					wmax elements with the decode ahead */
	uint64_t wmax;
	/* the decode ahead: a layer pass's weights decoded on a stream of
	 * their own (dst) while the pass before runs (decode_unit) */
	int ahead;
	cudaStream_t dst;
	cudaEvent_t dev_main, dev_dec[2];
	int dnext;                   /* the pass already queued there, or -1 */
	int dec_at;                  /* where a pass queues the next one's
					decode: bit 0 a forward pass, bit 1 a
					backward, at its attention core; else
					at its start (ms_gmodel_decode_ahead,
					the colwise mode) */
	int dpend_l, dpend_b;        /* that pass, not yet queued (-1 none) */
	uint8_t *colbuf;             /* on-demand transpose chunk */
	uint64_t colcap;
	float *rope_c, *rope_s;
	uint32_t rope_len;
	/* shape-dependent */
	uint32_t B, S, T;
	struct dacts *a;
	float *xf, *hf, *rf, *logits, *y, *y2, *tmp, *dA, *dB, *dh1, *dx2, *dh2;
	float *dctx, *dqv, *dkk, *dvv, *dq0, *dk0, *xs, *xsd, *actd, *dye, *dact;
	float *dgu, *dxs, *dz, *du, *dw, *sc, *dp;
	uint64_t tmp_n, du_n;        /* tmp's and du's floats */
	uint64_t dgu_n;              /* dgu's floats */
	float *dctx2;                /* [S, nh*hd]: per-head dV / dK before the
					group sums */
	int flash;                   /* fused attention (flash.h's kernels or
					cuDNN's): no S x S scratch, a
					per-layer LSE */
	int cudnn;                   /* ... through cuDNN's SDPA (sdpa.h) */
	void *fws;                   /* their workspace */
	void *sdb;                   /* cuDNN: bf16 O | dQ | dK | dV */
	void *yes;                   /* the folded MoE layers' expert outputs
					(bf16 [TK + BUCKET, H]), one buffer
					for all of them: the combine (the next
					norm) reads a layer's before the next
					layer writes it, and the backward
					never does (k_swiglu_bwd_dw) */
	float *wpart;                /* the folded LoRA's gradients' partial
					sums (fold_wgrad) */
	struct ms_sdpa *sd;          /* cuDNN: the current shape's plans, one
					of sdc */
	struct ms_sdpa *sdc[SD_CACHE];  /* plans by shape (sdk): a run whose
					shapes alternate builds each once */
	struct ms_flash_shape sdk[SD_CACHE];
	uint32_t sdn;                /* plans made (sdc[sdn % SD_CACHE] next) */
	char att_why[240];           /* auto without cuDNN: why */
	int att_ran;                 /* the attention att_core last ran: 1
					cuDNN, 2 flash, 3 GEMM + softmax */
	uint64_t att_ws[2];          /* ... cuDNN's workspace: asked, held */
	float *up, *dup;             /* padded U, dU of the expert LoRA bwd */
	float *ud;                   /* the folded expert LoRA's products of
					every token with every expert's
					factor: [T, E fr] (fold_u_gu,
					fold_du_dn; bf16 in fold_ga_gu) */
	uint32_t *dpad;              /* 4 E words of device offsets: the
					unfolded LoRA backward's padding table
					(3 E), the folded one's row offsets
					(E + 1, fold_wgrad), the bf16
					per-expert routing's offsets and tiles
					(2 (E + 1), moe_route_dev) */
	double *lossrow, *dsum;
	double *dnorm;               /* the optimizer's sum of squares */
	void *cA, *cB, *cC, *pg, *dsg;
	uint64_t cap_a, cap_b, cap_c;
	float *hlog;                 /* host logits for a callback */
	double *hloss;               /* host: per-row losses [T] */
	int32_t *dids;
	uint8_t *dmask;
	/* memory: what each allocation asked for, and what the device lost */
	struct ms_model_mem mem;
	uint64_t cur;
	struct dreg *reg;
	size_t nreg, capreg;
	/* grouped GEMMs' pointer arrays: host staging, device copy */
	void **hparr, **parr;
#define PSLOTS 64
	cudaEvent_t pev[PSLOTS];
	int pslot;
	/* profile */
	cudaEvent_t ev[2 * PH_N + 8];
	int ph_cur;
	int nev;
	int noprof;                  /* a decode: not a step of the profile */
#define NEV 16384
	cudaEvent_t evs[NEV];
	int evph[NEV];
	double evt[NEV];             /* host clock at each event */
	float evgpu[NEV];            /* its GPU time from event 0 (ph_fold) */
	/* MS_PROFILE_SITES: an event after every launch too, evsite the
	 * launch's site (site_id: a source line, or a GEMM's shape), -1 for a
	 * phase's own mark, -2 for the mark before a library call (what ran
	 * since is no launch of this file's) */
	int evsite[NEV];
	int sites;
	/* the decode stream's phase marks (dec_issue: side), apart from the
	 * main stream's: -1 closes a pass's decode */
#define NSEV 2048
	cudaEvent_t sevs[NSEV];
	int sevph[NSEV];
	int nsev;
	int side;
	/* MS_PROFILE_TIMELINE: one step's events (the third step's, the
	 * first after the warm-up) as lines of host and GPU times into this
	 * file */
	char *timeline;
	int folds;
	/* the GEMM shapes a site key 100000 + i names */
#define MAXGSHAPE 256
	uint32_t gshape[MAXGSHAPE][4];
	int ngshape;
	/* the profile's sums: pa over the steps after the first two (the
	 * first builds cuBLASLt's plans and cuDNN's graphs), pw over those
	 * two, reported where no later step ran */
	struct prof_acc pa, pw;
	cudaEvent_t st0, st1;
};

/* ---- memory accounting ------------------------------------------------------------ */

enum mcat { MC_ROW, MC_COL, MC_DENSE, MC_LORA, MC_ACTS, MC_SCRATCH };

static uint64_t *mslot(struct ms_gmodel *g, int c)
{
	switch (c) {
	case MC_ROW: return &g->mem.nvfp4_rowwise;
	case MC_COL: return &g->mem.nvfp4_colwise;
	case MC_DENSE: return &g->mem.dense;
	case MC_LORA: return &g->mem.lora;
	case MC_ACTS: return &g->mem.acts;
	default: return &g->mem.scratch;
	}
}

/* cudaMalloc, counted in category c by what cudaMemGetInfo says the
 * device lost (the allocator's rounding included, as a user would see). */
static int dmalloc(struct ms_gmodel *g, void **p, uint64_t n, int c,
		   struct ms_err *err)
{
	size_t f0 = 0, f1 = 0, tot = 0;
	int rc = MS_OK;
	*p = NULL;
	CK(cudaMemGetInfo(&f0, &tot));
	CK(cudaMalloc(p, n ? n : 16));
	CK(cudaMemGetInfo(&f1, &tot));
	{
		uint64_t d = f0 > f1 ? f0 - f1 : 0;
		*mslot(g, c) += n;
		g->cur += n;
		if (g->cur > g->mem.peak)
			g->mem.peak = g->cur;
		if (c == MC_ROW)
			g->mem.nvfp4_rowwise_measured += d;
		if (c == MC_COL)
			g->mem.nvfp4_colwise_measured += d;
		g->mem.measured += d;
		g->mem.total = tot;
	}
	if (g->nreg == g->capreg) {
		size_t nc = g->capreg ? 2 * g->capreg : 256;
		struct dreg *nr = (struct dreg *)realloc(g->reg, nc * sizeof *nr);
		if (!nr) {
			cudaFree(*p);
			*p = NULL;
			rc = ms_err_nomem(err);
			goto out;
		}
		g->reg = nr;
		g->capreg = nc;
	}
	g->reg[g->nreg].p = *p;
	g->reg[g->nreg++].n = n;
out:
	return rc;
}

/* cudaFree, uncounted from category c (n: the bytes it was asked for) */
static void dfree_n(struct ms_gmodel *g, void *p, uint64_t n, int c)
{
	size_t f0 = 0, f1 = 0, tot = 0;
	uint64_t *s = mslot(g, c);
	if (!p)
		return;
	cudaMemGetInfo(&f0, &tot);
	cudaFree(p);
	cudaMemGetInfo(&f1, &tot);
	*s = *s > n ? *s - n : 0;
	g->cur = g->cur > n ? g->cur - n : 0;
	if (f1 > f0)
		g->mem.measured = g->mem.measured > f1 - f0 ? g->mem.measured - (f1 - f0) : 0;
}

/* the size an allocation was asked for (the registry dmalloc keeps) */
static uint64_t dsize(struct ms_gmodel *g, void *p)
{
	for (size_t i = g->nreg; i-- > 0;)
		if (g->reg[i].p == p) {
			uint64_t n = g->reg[i].n;
			g->reg[i] = g->reg[--g->nreg];
			return n;
		}
	return 0;
}

static void dfree(struct ms_gmodel *g, void *p, int c)
{
	if (p)
		dfree_n(g, p, dsize(g, p), c);
}

#define DM(p, n, c)                                                            \
	do {                                                                   \
		if ((rc = dmalloc(g, (void **)&(p), (n), (c), err)))           \
			goto out;                                              \
	} while (0)

/* ---- profile ---------------------------------------------------------------------- */

static void mark(struct ms_gmodel *g, int p, int site)
{
	if (g->noprof)
		return;
	if (g->side) {
		/* the decode stream: its phases, not its launches */
		if (site != -1 || g->nsev >= NSEV ||
		    (!g->sevs[g->nsev] && cudaEventCreate(&g->sevs[g->nsev]) != cudaSuccess))
			return;
		cudaEventRecord(g->sevs[g->nsev], g->st);
		g->sevph[g->nsev++] = p;
		return;
	}
	if (g->nev >= NEV)
		return;
	if (!g->evs[g->nev] && cudaEventCreate(&g->evs[g->nev]) != cudaSuccess)
		return;
	cudaEventRecord(g->evs[g->nev], g->st);
	g->evt[g->nev] = ms_now();
	g->evsite[g->nev] = site;
	g->evph[g->nev++] = p;
}

static void ph(struct ms_gmodel *g, int p)
{
	if (g->side) {
		mark(g, p == PH_DECODE_ROW ? PH_S_DECODE_ROW : p == PH_DECODE_COL ? PH_S_DECODE_COL
			: p == PH_TRANSPOSE ? PH_S_TRANSPOSE : p, -1);
		return;
	}
	g->ph_cur = p;
	mark(g, p, -1);
}

/* with MS_PROFILE_SITES: the mark after a launch at source line `line`
 * (LK) or a library call (site_key) */
static void site(struct ms_gmodel *g, int key)
{
	if (g->sites)
		mark(g, g->ph_cur, key);
}

/* a GEMM shape's site key (100000 + its index; 99999 past the table) */
static int gemm_key(struct ms_gmodel *g, uint32_t M, uint32_t N, uint32_t K, uint32_t tt)
{
	for (int i = 0; i < g->ngshape; i++)
		if (g->gshape[i][0] == M && g->gshape[i][1] == N && g->gshape[i][2] == K &&
		    g->gshape[i][3] == tt)
			return 100000 + i;
	if (g->ngshape >= MAXGSHAPE)
		return 99999;
	g->gshape[g->ngshape][0] = M;
	g->gshape[g->ngshape][1] = N;
	g->gshape[g->ngshape][2] = K;
	g->gshape[g->ngshape][3] = tt;
	return 100000 + g->ngshape++;
}

/* a GEMM's transposes and types in a shape key's fourth word */
static uint32_t gemm_tt(int ta, int tb, cudaDataType_t ty, cudaDataType_t cty)
{
	return (uint32_t)(ta ? 1 : 0) | (tb ? 2 : 0) | (ty == CUDA_R_16BF ? 4 : 0) |
	       (cty == CUDA_R_16BF ? 8 : 0);
}

/* the library calls' site keys (no source line of theirs to name) */
enum { SK_XGEMM = 90001, SK_SDPA_FWD, SK_SDPA_BWD, SK_WGRAD_BF16, SK_GEMM_BATCHED,
       SK_GEMM_GROUPED, SK_ROUTER, SK_ROUTER_DGRAD, SK_LOWRANK, SK_WGRAD_DU };

/* a site key's name in the profile: a GEMM's shape and types, a library
 * call, or the source line of a launch */
static void site_name(const struct ms_gmodel *g, int key, char *nm, size_t n)
{
	static const char *lib[] = {"CUTLASS grouped expert GEMM", "cuDNN SDPA forward",
				    "cuDNN SDPA backward", "grouped weight gradient (bf16)",
				    "batched GEMM (attention heads)",
				    "cuBLAS grouped GEMM (expert LoRA)", "router logits (router.cu)",
				    "router input gradient (router.cu)",
				    "grouped low-rank product (bf16, expert LoRA)",
				    "grouped weight gradient with dU (bf16)"};
	if (key >= 100000 && key - 100000 < g->ngshape) {
		const uint32_t *gs = g->gshape[key - 100000];
		snprintf(nm, n, "GEMM %ux%ux%u%s%s %s -> %s", gs[0], gs[1], gs[2],
			 gs[3] & 1 ? " A^T" : "", gs[3] & 2 ? " B^T" : "",
			 gs[3] & 4 ? "bf16" : "float32", gs[3] & 8 ? "bf16" : "float32");
	} else if (key >= SK_XGEMM && key <= SK_WGRAD_DU)
		snprintf(nm, n, "%s", lib[key - SK_XGEMM]);
	else if (key == -2)
		snprintf(nm, n, "before a library call");
	else if (key == -1)
		snprintf(nm, n, "up to a phase mark");
	else
		snprintf(nm, n, "launch at train.cu:%d", key);
}

static void site_add(struct ms_gmodel *g, int key, double ms, double idle, double host)
{
	int i = 0;
	while (i < g->pa.nsite && g->pa.site_key[i] != key)
		i++;
	if (i == g->pa.nsite) {
		if (g->pa.nsite >= MAXSITE)
			return;
		g->pa.site_key[g->pa.nsite++] = key;
	}
	g->pa.site_ms[i] += ms;
	g->pa.site_idle_ms[i] += idle;
	g->pa.site_host_ms[i] += host;
	g->pa.site_calls[i]++;
}

/* fold the step's events into the per-phase totals (after a sync): an
 * interval belongs to the phase marked at its start, and with sites to the
 * launch marked at its end */
/* MS_PROFILE_TIMELINE's file: a line an event, tab-separated: its
 * index, the host's time at its record and the GPU's at reaching it (ms
 * from the step's first event, the GPU's shifted as ph_fold does), the
 * phase, and the site the interval before it ends with */
static void timeline_write(struct ms_gmodel *g, double shift)
{
	FILE *f = fopen(g->timeline, "w");
	char nm[96];
	if (!f) {
		/* a diagnostic: said, and the run goes on */
		fprintf(stderr, "mstrain: MS_PROFILE_TIMELINE %s: %s\n", g->timeline,
			strerror(errno));
		return;
	}
	fprintf(f, "event\thost_ms\tgpu_ms\tphase\tsite\n");
	for (int i = 0; i < g->nev; i++) {
		site_name(g, g->evsite[i], nm, sizeof nm);
		fprintf(f, "%d\t%.4f\t%.4f\t%s\t%s\n", i, 1e3 * (g->evt[i] - g->evt[0]),
			g->evgpu[i] < 0 ? -1.0 : g->evgpu[i] + shift, phase_name[g->evph[i]],
			g->sites ? nm : "");
	}
	fclose(f);
}

static void ph_fold(struct ms_gmodel *g)
{
	/* The GPU's clock against the host's: gpu [i], event i's time on the
	 * GPU from event 0 (ms). Shifted by the least delay that keeps every
	 * event after its record on the host (a GPU cannot pass an event the
	 * host has not queued), the GPU's finishing time of the work up to
	 * event i-1 set against the host's time at event i tells how long the
	 * GPU sat idle before that interval's work had been queued: the
	 * interval's "idle" (a host-bound launch shows it; a slow kernel does
	 * not). */
	float *gpu = g->evgpu;
	double shift = 0;
	gpu[0] = 0;
	for (int i = 1; i < g->nev; i++) {
		float ms = 0;
		gpu[i] = cudaEventElapsedTime(&ms, g->evs[0], g->evs[i]) == cudaSuccess ? ms : -1;
	}
	for (int i = 0; i < g->nev; i++) {
		double h = 1e3 * (g->evt[i] - g->evt[0]);
		if (gpu[i] >= 0 && h - gpu[i] > shift)
			shift = h - gpu[i];
	}
	if (g->timeline && ++g->folds == 3)
		timeline_write(g, shift);
	for (int i = 0; i + 1 < g->nev; i++) {
		float ms = 0;
		if (cudaEventElapsedTime(&ms, g->evs[i], g->evs[i + 1]) == cudaSuccess) {
			double idle = 0;
			if (gpu[i] >= 0) {
				idle = 1e3 * (g->evt[i + 1] - g->evt[0]) - (gpu[i] + shift);
				idle = idle < 0 ? 0 : idle > ms ? ms : idle;
			}
			g->pa.ph_ms[g->evph[i]] += ms;
			g->pa.ph_idle_ms[g->evph[i]] += idle;
			g->pa.ph_host_ms[g->evph[i]] += 1e3 * (g->evt[i + 1] - g->evt[i]);
			if (g->evsite[i] == -1)
				g->pa.ph_calls[g->evph[i]]++;
			if (g->sites)
				site_add(g, g->evsite[i + 1], ms, idle,
					 1e3 * (g->evt[i + 1] - g->evt[i]));
		}
	}
	g->nev = 0;
	/* the decode stream's: an interval to the phase marked at its start */
	for (int i = 0; i + 1 < g->nsev; i++) {
		float ms = 0;
		if (g->sevph[i] >= 0 &&
		    cudaEventElapsedTime(&ms, g->sevs[i], g->sevs[i + 1]) == cudaSuccess) {
			g->pa.ph_ms[g->sevph[i]] += ms;
			g->pa.ph_calls[g->sevph[i]]++;
		}
	}
	g->nsev = 0;
}

/* ---- device helpers --------------------------------------------------------------- */

/* a / b by a 32-bit division where a allows (the 64-bit one is a long
 * software routine: in a kernel's per-element index arithmetic it costs
 * more than the element's work) */
__device__ __forceinline__ uint64_t udiv(uint64_t a, uint32_t b)
{
	return a >> 32 ? a / b : (uint64_t)((uint32_t)a / b);
}

template <typename T> __device__ __forceinline__ T tocv(float x);
template <> __device__ __forceinline__ float tocv<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 tocv<__nv_bfloat16>(float x)
{
	return __float2bfloat16_rn(x);
}

/* Decode a batch of NVFP4 jobs (ms_nvfp4_dequantize_ref's arithmetic:
 * e2m1 times the block factor, e4m3 * or / the tensor scale). One byte
 * (two codes) per thread step; blockIdx.y picks the job. */
template <typename T>
__global__ void k_decode(const struct ddesc *d, int nd)
{
	const struct ddesc j = d[blockIdx.y];
	uint32_t ng = j.cols / 16;
	/* bf16 with aligned rows: a thread a scale block (8 bytes of codes in,
	 * two 16-byte stores of 16 bf16 out), over the job's blocks as one
	 * range; the per-code path below wrote 2 bytes a store and left most
	 * of a block's threads idle on short rows (on the H200 at the bench
	 * shape: the decode phases 9.5 -> 4.5 ms a step each). The two stores
	 * write half sectors an instruction along the warp, and alone (nothing
	 * loaded) they run at half cudaMemset's rate; yet whole-sector stores
	 * (a lane a half block) were slower with the decode in them, with
	 * 4-byte loads or with a block's codes shuffled to its half blocks'
	 * lanes: tools/bench/decode_probe.cu, NOTES.md */
	if (sizeof(T) == 2 && j.cols % 16 == 0 && j.ld % 8 == 0 && j.pst % 8 == 0 &&
	    !((uintptr_t)j.out & 15) && !((uintptr_t)j.pk & 7) &&
	    (uint64_t)j.rows * ng + (uint64_t)gridDim.x * blockDim.x <= 0xffffffffull) {
		uint32_t n = j.rows * ng;
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
		     i += gridDim.x * blockDim.x) {
			uint32_t r = i / ng, q = i - r * ng;
			float s = e4m3v(j.sc[(uint64_t)r * j.sst + q]);
			float f = j.kind == MS_NVFP4_TSCALE_DIV ? s / j.tscale : s * j.tscale;
			uint2 v = *(const uint2 *)(j.pk + (uint64_t)r * j.pst + 8 * (uint64_t)q);
			uint32_t w[8];
#pragma unroll
			for (int k = 0; k < 8; k++) {
				uint32_t src = k < 4 ? v.x : v.y, sh = 8 * (k & 3);
				__nv_bfloat162 h = __floats2bfloat162_rn(e2m1v((src >> sh) & 15) * f,
									 e2m1v((src >> (sh + 4)) & 15) * f);
				w[k] = *(uint32_t *)&h;
			}
			uint4 *o = (uint4 *)((__nv_bfloat16 *)j.out + (uint64_t)r * j.ld + 16 * (uint64_t)q);
			o[0] = make_uint4(w[0], w[1], w[2], w[3]);
			o[1] = make_uint4(w[4], w[5], w[6], w[7]);
		}
		return;
	}
	/* a block a row at a time; a thread two bytes (four codes) of it */
	for (uint32_t r = blockIdx.x; r < j.rows; r += gridDim.x) {
		const uint8_t *pk = j.pk + (uint64_t)r * j.pst;
		const uint8_t *sc = j.sc + (uint64_t)r * j.sst;
		T *o = (T *)j.out + (uint64_t)r * j.ld;
		for (uint32_t b = 2 * threadIdx.x; b < j.pst; b += 2 * blockDim.x) {
			uint32_t c = 2 * b;
			if (c >= j.cols)
				break;  /* the padding of a ragged row */
			float s = e4m3v(sc[c / 16]);
			float f = j.kind == MS_NVFP4_TSCALE_DIV ? s / j.tscale : s * j.tscale;
			unsigned v = pk[b] | (b + 1 < j.pst ? (unsigned)pk[b + 1] << 8 : 0u);
			for (int q = 0; q < 4 && c + q < j.cols; q++)
				o[c + q] = tocv<T>(e2m1v((v >> (4 * q)) & 15) * f);
		}
	}
}

/* jobs [0, nd) of dv (device) into the decode scratch, DEC_BLOCKS blocks
 * a job: with 256 a block's threads took one or two scale blocks each
 * before the block ended (the bench's decode 8.2 -> 7.4 ms a step at 32,
 * on the H200; a thread a half block, with 16-byte stores side by side
 * along the warp, was slower: 8.2 -> 8.6); 64: a layer's experts 0.2151
 * -> 0.2072 ms in tools/bench/decode_probe.cu (the last wave shorter) */
#define DEC_BLOCKS 64
static int dec_launch(struct ms_gmodel *g, const struct ddesc *dv, int nd, struct ms_err *err)
{
	int rc = MS_OK;
	if (!nd)
		return MS_OK;
#ifdef MS_DIAG_NO_DECODE
	/* a measuring build only (never the product's): from the third step
	 * on the scratch keeps what earlier steps decoded, so the step's time
	 * without the decode's traffic shows what the decode costs it; the
	 * weights are then wrong and so are the losses (tools/bench/NOTES.md,
	 * "what the decode costs the step") */
	if (g->step >= 2)
		return MS_OK;
#endif
	if (g->f32)
		k_decode<float><<<dim3(DEC_BLOCKS, nd), NTH, 0, g->st>>>(dv, nd);
	else
		k_decode<__nv_bfloat16><<<dim3(DEC_BLOCKS, nd), NTH, 0, g->st>>>(dv, nd);
	LK();
out:
	return rc;
}

/* The exact 2D-block transpose (ms_nvfp4_transpose): codes moved, scales
 * of each 16x16 block moved; [rows, cols] -> [cols, rows]. A tile of
 * TT_R source rows by TT_C source columns through shared memory, so that
 * both the reads and the writes run along rows (a thread an output byte
 * straight from the source read two bytes TT_R apart each: on the H200 the
 * on-demand transpose took about 1.9 ms a layer for what moves 0.34 GB). */
#define TT_R 64
#define TT_C 64
#define TT_BLOCKS 64   /* blocks a part (blockIdx.y), over its tiles */

__global__ void k_transpose(const struct ddesc *d, int nd)
{
	__shared__ uint8_t t[TT_R][TT_C / 2 + 4];
	const struct ddesc j = d[blockIdx.y];
	/* j.rows x j.cols is the transposed (columnwise) logical shape, row
	 * strides j.pst / j.sst (columns padded to 16); the source is
	 * [R, C] = [j.cols, j.rows], row strides j.spst / j.ssst */
	uint32_t R = j.cols, C = j.rows, sp = j.spst, ssp = j.ssst;
	uint8_t *pkt = (uint8_t *)j.pk, *sct = (uint8_t *)j.sc;
	/* tiles down the output's bytes (and its scale columns, TT_R / 16 a
	 * tile) and along its rows */
	uint32_t tr = (j.pst + TT_R / 2 - 1) / (TT_R / 2);
	uint32_t ts = (j.sst + TT_R / 16 - 1) / (TT_R / 16);
	uint32_t tc = (C + TT_C - 1) / TT_C;
	tr = tr > ts ? tr : ts;
	for (uint32_t tile = blockIdx.x; tile < tr * tc; tile += gridDim.x) {
		uint32_t r0 = tile % tr * TT_R, c0 = tile / tr * TT_C;
		/* the previous tile's readers are done */
		__syncthreads();
		for (uint32_t k = threadIdx.x; k < TT_R * (TT_C / 2); k += blockDim.x) {
			uint32_t rr = k / (TT_C / 2), cb = k % (TT_C / 2), r = r0 + rr;
			uint32_t byte = c0 / 2 + cb;
			t[rr][cb] = r < R && byte < sp ? j.spk[(uint64_t)r * sp + byte] : 0;
		}
		__syncthreads();
		/* output row i = source column c0 + oi, byte jj: source rows 2 jj
		 * (low nibble) and 2 jj + 1, zeros past R */
		for (uint32_t k = threadIdx.x; k < TT_C * (TT_R / 2); k += blockDim.x) {
			uint32_t oi = k / (TT_R / 2), ob = k % (TT_R / 2);
			uint32_t i = c0 + oi, jj = r0 / 2 + ob, sh = 4 * (oi & 1);
			if (i >= C || jj >= j.pst)
				continue;
			unsigned lo = (t[2 * ob][oi / 2] >> sh) & 15;
			unsigned hi = (t[2 * ob + 1][oi / 2] >> sh) & 15;
			pkt[(uint64_t)i * j.pst + jj] = (uint8_t)(lo | (hi << 4));
		}
		for (uint32_t k = threadIdx.x; k < TT_C * (TT_R / 16); k += blockDim.x) {
			uint32_t oi = k / (TT_R / 16), jb = r0 / 16 + k % (TT_R / 16), i = c0 + oi;
			if (i < C && jb < j.sst)
				sct[(uint64_t)i * j.sst + jb] =
					j.ssc[(uint64_t)jb * 16 * ssp + i / 16];
		}
	}
}

template <typename T>
__global__ void k_cast(const float *x, T *y, uint64_t n)
{
	/* (launched on cast_blocks' grid: four elements a thread in bf16) */
	uint64_t i0 = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	uint64_t st = (uint64_t)gridDim.x * blockDim.x;
	if (sizeof(T) == 2 && !((uintptr_t)x & 15) && !((uintptr_t)y & 7)) {
		/* four a thread step: a 16-byte load, an 8-byte store */
		for (uint64_t i = i0; i < n / 4; i += st) {
			float4 v = ((const float4 *)x)[i];
			__nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
			__nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
			((uint2 *)y)[i] = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
		}
		for (uint64_t i = n / 4 * 4 + i0; i < n; i += st)
			y[i] = tocv<T>(x[i]);
		return;
	}
	for (uint64_t i = i0; i < n; i += st)
		y[i] = tocv<T>(x[i]);
}

/* y [n, a + b + c] (GEMM type) = [x0 | x1 | x2], rows of a, b and c floats:
 * the q, k and v gradients as one operand (dlayer.qkv3) */
template <typename T>
__global__ void k_cat3(const float *x0, const float *x1, const float *x2, T *y, uint64_t n,
		       uint32_t a, uint32_t b, uint32_t c, uint32_t ld)
{
	uint32_t w = a + b + c;
	/* a block a row at a time: no 64-bit division an element */
	for (uint64_t r = blockIdx.x; r < n; r += gridDim.x)
		for (uint32_t j = threadIdx.x; j < w; j += blockDim.x) {
			float v = j < a ? x0[r * a + j] : j < a + b ? x1[r * b + j - a]
								  : x2[r * c + j - a - b];
			y[r * ld + j] = tocv<T>(v);
		}
}
/* [rows, cols] float -> [cols, rows] in T */
template <typename T>
__global__ void k_tcast(const float *x, T *y, uint32_t rows, uint32_t cols)
{
	uint64_t n = (uint64_t)rows * cols;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t r = udiv(i, cols);
		uint32_t c = (uint32_t)(i - r * cols);
		y[(uint64_t)c * rows + r] = tocv<T>(x[i]);
	}
}

__global__ void k_embed(const int32_t *ids, const float *emb, float *x, uint32_t T,
			uint32_t H)
{
	uint64_t n = (uint64_t)T * H;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		x[i] = emb[(uint64_t)ids[i / H] * H + i % H];
}

__device__ double block_sum(double v, double *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_down_sync(0xffffffffu, v, o);
	int w = threadIdx.x / 32, l = threadIdx.x % 32;
	__syncthreads();
	if (!l)
		sh[w] = v;
	__syncthreads();
	double s = 0;
	if (threadIdx.x == 0) {
		for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++)
			s += sh[i];
		sh[32] = s;
	}
	__syncthreads();
	return sh[32];
}

__device__ float block_max(float v, float *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
	int w = threadIdx.x / 32, l = threadIdx.x % 32;
	__syncthreads();
	if (!l)
		sh[w] = v;
	__syncthreads();
	if (threadIdx.x == 0) {
		float m = sh[0];
		for (int i = 1; i < (int)(blockDim.x + 31) / 32; i++)
			m = fmaxf(m, sh[i]);
		sh[32] = m;
	}
	__syncthreads();
	return sh[32];
}

/* transformers' RMSNorm in float32 (model.c rms_rows): one block a row */
/* yb: NULL, or y's bf16 copy too (a GEMM's or the expert gather's
 * operand, without a cast pass reading y again) */
/* V: the float4s of a row a thread of k_rms / k_rms_bwd holds in
 * registers (rows of up to 4 * NTH * V floats), the fewest the row needs
 * (rms_v: with four at H 2048 the unused half still took registers, and
 * fewer blocks fit an SM); thread t holds elements 4 (t + k NTH), so the
 * sums keep their order whatever V */
template <int V>
__device__ __forceinline__ int rms_vec(uint32_t H, uintptr_t ptrs)
{
	return H % 4 == 0 && H <= 4u * blockDim.x * V && !(ptrs & 15);
}

static int rms_v(uint32_t H)
{
	return H <= 4u * NTH ? 1 : H <= 8u * NTH ? 2 : 4;
}

/* float32 of the bf16 bits in a 32-bit word's low and high halves */
__device__ __forceinline__ float bf_lo(uint32_t u)
{
	return __uint_as_float(u << 16);
}

__device__ __forceinline__ float bf_hi(uint32_t u)
{
	return __uint_as_float(u & 0xffff0000u);
}

/* columns i .. i + 3 of row t's combine, sum over its K slots of
 * ye [pos [t K + k]] * sw [t K + k]: float products summed in double in
 * slot order (k_slot_sum's arithmetic), then rounded to float */
__device__ __forceinline__ float4 slot_comb4(const __nv_bfloat16 *ye, const int32_t *pos,
					     const float *sw, uint32_t K, uint64_t t, uint32_t H,
					     uint32_t i)
{
	double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	for (uint32_t q = 0; q < K; q++) {
		uint2 u = *(const uint2 *)(ye + (uint64_t)pos[t * K + q] * H + i);
		float wk = sw[t * K + q];
		s0 += (double)(bf_lo(u.x) * wk);
		s1 += (double)(bf_hi(u.x) * wk);
		s2 += (double)(bf_lo(u.y) * wk);
		s3 += (double)(bf_hi(u.y) * wk);
	}
	return make_float4((float)s0, (float)s1, (float)s2, (float)s3);
}

template <int V>
__global__ void k_rms(const float *x, const float *w, float *y, float *rstd,
		      uint32_t H, float eps, __nv_bfloat16 *yb, uint32_t ybld, const float *xa,
		      float *xs, const __nv_bfloat16 *ss = NULL, const int32_t *pos = NULL,
		      const float *sw = NULL, uint32_t K = 0)
{
	/* xa: the residual add first, xs = x + xa (written), normalized (one
	 * pass less over the rows than k_add and then the norm); ss instead
	 * of xa: what is added is the MoE combine of the expert outputs ss
	 * (slot_comb4), which then is never written (k_slot_sum folded in:
	 * the same additions, T x H floats neither written nor read back) */
	__shared__ double sh[33];
	const float *xr = x + (uint64_t)blockIdx.x * H;
	float *yr = y + (uint64_t)blockIdx.x * H;
	double ss2 = 0;
	if (rms_vec<V>(H, (uintptr_t)x | (uintptr_t)w | (uintptr_t)y | ((uintptr_t)yb & 7) |
			      (uintptr_t)xa | (uintptr_t)xs | ((uintptr_t)ss & 7)) &&
	    ybld % 4 == 0) {
		/* the row read once, 16 bytes a load, and kept for the output
		 * (a scalar load an element, twice over the row, ran the norm
		 * phases at about half the H200's bandwidth) */
		float4 xv[V];
#pragma unroll
		for (int k = 0; k < V; k++) {
			uint32_t i = 4 * (threadIdx.x + k * blockDim.x);
			xv[k] = i < H ? *(const float4 *)(xr + i) : make_float4(0, 0, 0, 0);
			if ((xa || ss) && i < H) {
				uint64_t o = (uint64_t)blockIdx.x * H + i;
				float4 av = ss ? slot_comb4(ss, pos, sw, K, blockIdx.x, H, i)
					       : *(const float4 *)(xa + o);
				xv[k].x += av.x;
				xv[k].y += av.y;
				xv[k].z += av.z;
				xv[k].w += av.w;
				*(float4 *)(xs + o) = xv[k];
			}
			ss2 += (double)xv[k].x * xv[k].x + (double)xv[k].y * xv[k].y +
			       (double)xv[k].z * xv[k].z + (double)xv[k].w * xv[k].w;
		}
		ss2 = block_sum(ss2, sh);
		float r = (float)(1.0 / sqrt((double)((float)(ss2 / H) + eps)));
		if (threadIdx.x == 0)
			rstd[blockIdx.x] = r;
#pragma unroll
		for (int k = 0; k < V; k++) {
			uint32_t i = 4 * (threadIdx.x + k * blockDim.x);
			if (i >= H)
				break;
			float4 wv = *(const float4 *)(w + i), v;
			v.x = wv.x * (xv[k].x * r);
			v.y = wv.y * (xv[k].y * r);
			v.z = wv.z * (xv[k].z * r);
			v.w = wv.w * (xv[k].w * r);
			*(float4 *)(yr + i) = v;
			if (yb) {
				__nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
				__nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
				*(uint2 *)(yb + (uint64_t)blockIdx.x * ybld + i) =
					make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
			}
		}
		return;
	}
	if (xa || ss) {
		/* the sum first (each thread its own elements, read back
		 * below by the same thread) */
		float *sr = xs + (uint64_t)blockIdx.x * H;
		for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
			float a;
			if (ss) {
				double q = 0;
				for (uint32_t k = 0; k < K; k++)
					q += (double)(__bfloat162float(
							      ss[(uint64_t)pos[blockIdx.x * K + k] * H +
								 i]) *
						      sw[blockIdx.x * K + k]);
				a = (float)q;
			} else {
				a = xa[(uint64_t)blockIdx.x * H + i];
			}
			sr[i] = xr[i] + a;
		}
		xr = sr;
	}
	for (uint32_t i = threadIdx.x; i < H; i += blockDim.x)
		ss2 += (double)xr[i] * xr[i];
	ss2 = block_sum(ss2, sh);
	float var = (float)(ss2 / H);
	float r = (float)(1.0 / sqrt((double)(var + eps)));
	if (threadIdx.x == 0)
		rstd[blockIdx.x] = r;
	for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
		float v = w[i] * (xr[i] * r);
		yr[i] = v;
		if (yb)
			yb[(uint64_t)blockIdx.x * ybld + i] = __float2bfloat16_rn(v);
	}
}

/* dx = res + d rmsnorm / dx . dy (model.c rms_bwd_row); res NULL: dx +=
 * it. The residual's copy into dx folded in: one pass less over T x H
 * floats, the same float addition. With ss, dy is dy + the sum over the
 * row's K expert slots of ss [pos [row K + k]] (bf16 rows of H, in
 * double, in slot order): k_slot_sum's unpermute folded into the norm
 * that reads its output, the same additions, without writing dy and
 * reading it back (T x H floats each way) */
template <int V>
__global__ void k_rms_bwd(const float *x, const float *w, const float *rstd,
			  const float *dy, const float *res, float *dx, uint32_t H,
			  __nv_bfloat16 *db, const __nv_bfloat16 *ss = NULL,
			  const int32_t *pos = NULL, uint32_t K = 0)
{
	/* db: dx's bf16 copy as well (the next GEMM's operand, no cast pass) */
	__shared__ double sh[33];
	uint64_t o = (uint64_t)blockIdx.x * H;
	double dot = 0;
	if (rms_vec<V>(H, (uintptr_t)x | (uintptr_t)w | (uintptr_t)dy | (uintptr_t)res |
			   (uintptr_t)dx | ((uintptr_t)db & 7) | ((uintptr_t)ss & 7))) {
		/* k_rms's registers: x and dy read once */
		float4 xv[V], dv[V];
#pragma unroll
		for (int k = 0; k < V; k++) {
			uint32_t i = 4 * (threadIdx.x + k * blockDim.x);
			float4 z = make_float4(0, 0, 0, 0), wv = z;
			xv[k] = dv[k] = z;
			if (i < H) {
				xv[k] = *(const float4 *)(x + o + i);
				dv[k] = *(const float4 *)(dy + o + i);
				wv = *(const float4 *)(w + i);
			}
			if (ss && i < H) {
				double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
				for (uint32_t q = 0; q < K; q++) {
					uint2 u = *(const uint2 *)(ss + (uint64_t)pos[blockIdx.x * K + q] *
									   H + i);
					s0 += bf_lo(u.x);
					s1 += bf_hi(u.x);
					s2 += bf_lo(u.y);
					s3 += bf_hi(u.y);
				}
				dv[k].x = dv[k].x + (float)s0;
				dv[k].y = dv[k].y + (float)s1;
				dv[k].z = dv[k].z + (float)s2;
				dv[k].w = dv[k].w + (float)s3;
			}
			dot += (double)wv.x * dv[k].x * xv[k].x + (double)wv.y * dv[k].y * xv[k].y +
			       (double)wv.z * dv[k].z * xv[k].z + (double)wv.w * dv[k].w * xv[k].w;
		}
		dot = block_sum(dot, sh);
		double r = rstd[blockIdx.x];
		double c = r * r * r * dot / H;
#pragma unroll
		for (int k = 0; k < V; k++) {
			uint32_t i = 4 * (threadIdx.x + k * blockDim.x);
			if (i >= H)
				break;
			float4 wv = *(const float4 *)(w + i);
			float4 b = *(const float4 *)((res ? res : dx) + o + i), v;
			v.x = b.x + (float)(r * wv.x * dv[k].x - c * xv[k].x);
			v.y = b.y + (float)(r * wv.y * dv[k].y - c * xv[k].y);
			v.z = b.z + (float)(r * wv.z * dv[k].z - c * xv[k].z);
			v.w = b.w + (float)(r * wv.w * dv[k].w - c * xv[k].w);
			*(float4 *)(dx + o + i) = v;
			if (db) {
				__nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
				__nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
				*(uint2 *)(db + o + i) = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
			}
		}
		return;
	}
	/* the row's dy (with the slots' sum) at i */
	auto dyi = [&](uint32_t i) {
		if (!ss)
			return dy[o + i];
		double q = 0;
		for (uint32_t k = 0; k < K; k++)
			q += (double)__bfloat162float(ss[(uint64_t)pos[blockIdx.x * K + k] * H + i]);
		return dy[o + i] + (float)q;
	};
	for (uint32_t i = threadIdx.x; i < H; i += blockDim.x)
		dot += (double)w[i] * dyi(i) * x[o + i];
	dot = block_sum(dot, sh);
	double r = rstd[blockIdx.x];
	double c = r * r * r * dot / H;
	for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
		float v = (res ? res[o + i] : dx[o + i]) +
			  (float)(r * w[i] * dyi(i) - c * x[o + i]);
		dx[o + i] = v;
		if (db)
			db[o + i] = __float2bfloat16_rn(v);
	}
}

/* k_rms and k_rms_bwd over rows of H, on the V the row takes (rms_v) */
/* yb: a bf16 copy of y as well, row stride ybld (0: H); xa: normalize x +
 * xa, the sum written to xs (rms_in) */
static void rms_fwd(const struct ms_gmodel *g, uint64_t rows, const float *x, const float *w,
		    float *y, float *rstd, uint32_t H, float eps, __nv_bfloat16 *yb = NULL,
		    uint32_t ybld = 0, const float *xa = NULL, float *xs = NULL,
		    const __nv_bfloat16 *ss = NULL, const int32_t *pos = NULL,
		    const float *sw = NULL, uint32_t K = 0)
{
	int v = rms_v(H);
	uint32_t ld = ybld ? ybld : H;
	if (v == 1)
		k_rms<1><<<(unsigned)rows, NTH, 0, g->st>>>(x, w, y, rstd, H, eps, yb, ld, xa, xs,
							    ss, pos, sw, K);
	else if (v == 2)
		k_rms<2><<<(unsigned)rows, NTH, 0, g->st>>>(x, w, y, rstd, H, eps, yb, ld, xa, xs,
							    ss, pos, sw, K);
	else
		k_rms<4><<<(unsigned)rows, NTH, 0, g->st>>>(x, w, y, rstd, H, eps, yb, ld, xa, xs,
							    ss, pos, sw, K);
}

/* a norm of x, the residual stream: where the previous layer left its
 * last add to the norm that reads it (pend_dst == x), x = pend_src + y
 * written as the norm reads it */
static void rms_in(struct ms_gmodel *g, uint64_t rows, const float *x, const float *w, float *y,
		   float *rstd, uint32_t H, float eps, __nv_bfloat16 *yb = NULL,
		   uint32_t ybld = 0)
{
	if (g->pend_dst && g->pend_dst == x) {
		/* y, or the MoE combine it was left as (pend_ye) */
		rms_fwd(g, rows, g->pend_src, w, y, rstd, H, eps, yb, ybld,
			g->pend_ye ? NULL : g->y, g->pend_dst, g->pend_ye, g->pend_pos,
			g->pend_w, g->K);
		g->pend_dst = NULL;
		g->pend_ye = NULL;
		return;
	}
	rms_fwd(g, rows, x, w, y, rstd, H, eps, yb, ybld);
}

/* ss, pos, K: the expert slots' rows summed into dy (k_rms_bwd) */
static void rms_bwd(const struct ms_gmodel *g, uint64_t rows, const float *x, const float *w,
		    const float *rstd, const float *dy, const float *res, float *dx, uint32_t H,
		    __nv_bfloat16 *db = NULL, const __nv_bfloat16 *ss = NULL,
		    const int32_t *pos = NULL, uint32_t K = 0)
{
	int v = rms_v(H);
	if (v == 1)
		k_rms_bwd<1><<<(unsigned)rows, NTH, 0, g->st>>>(x, w, rstd, dy, res, dx, H, db, ss,
								pos, K);
	else if (v == 2)
		k_rms_bwd<2><<<(unsigned)rows, NTH, 0, g->st>>>(x, w, rstd, dy, res, dx, H, db, ss,
								pos, K);
	else
		k_rms_bwd<4><<<(unsigned)rows, NTH, 0, g->st>>>(x, w, rstd, dy, res, dx, H, db, ss,
								pos, K);
}

/* a warp's row of n floats: 1 / sqrt(mean of squares + eps), the squares
 * summed in double by lane then by shuffles (every lane gets it) */
__device__ __forceinline__ float warp_rstd(const float *xr, uint32_t n, float eps,
					   uint32_t lane)
{
	double ss = 0;
	for (uint32_t i = lane; i < n; i += 32)
		ss += (double)xr[i] * xr[i];
	for (int o = 16; o; o >>= 1)
		ss += __shfl_xor_sync(0xffffffffu, ss, o);
	float var = (float)(ss / n);
	return (float)(1.0 / sqrt((double)(var + eps)));
}

/* The q/k norms (a head's hd values a row) a warp a row, the sums by
 * shuffles, where a 64-thread block a row spent three barriers on a
 * block-wide sum (with the backward's written output below, the norm
 * phases 5.5 + 9.2 -> 4.7 + 7.2 ms a step on the H200) */
__global__ void k_rms_rows(const float *x, const float *w, float *y, float *rstd,
			   uint64_t rows, uint32_t n, float eps)
{
	uint32_t lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
	for (uint64_t row = (uint64_t)blockIdx.x * wpb + (threadIdx.x >> 5); row < rows;
	     row += (uint64_t)gridDim.x * wpb) {
		const float *xr = x + row * n;
		float *yr = y + row * n;
		float r = warp_rstd(xr, n, eps, lane);
		if (!lane)
			rstd[row] = r;
		for (uint32_t i = lane; i < n; i += 32)
			yr[i] = w[i] * (xr[i] * r);
	}
}

/* k_rms_bwd a warp a row, dx set (not accumulated) */
__global__ void k_rms_bwd_rows(const float *x, const float *w, const float *rstd,
			       const float *dy, float *dx, uint64_t rows, uint32_t n)
{
	uint32_t lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
	for (uint64_t row = (uint64_t)blockIdx.x * wpb + (threadIdx.x >> 5); row < rows;
	     row += (uint64_t)gridDim.x * wpb) {
		uint64_t o = row * n;
		double dot = 0;
		for (uint32_t i = lane; i < n; i += 32)
			dot += (double)w[i] * dy[o + i] * x[o + i];
		for (int k = 16; k; k >>= 1)
			dot += __shfl_xor_sync(0xffffffffu, dot, k);
		double r = rstd[row];
		double c = r * r * r * dot / n;
		for (uint32_t i = lane; i < n; i += 32)
			dx[o + i] = (float)(r * w[i] * dy[o + i] - c * x[o + i]);
	}
}

/* an element as float, whatever its type */
__device__ __forceinline__ float f32_of(float v)
{
	return v;
}
__device__ __forceinline__ float f32_of(__nv_bfloat16 v)
{
	return __bfloat162float(v);
}

/*
 * Eight consecutive elements as float (ld8) or from float (st8: bf16
 * rounded to nearest even, as __float2bfloat16_rn an element), by 16-byte
 * accesses at a 16-byte aligned p. The row kernels below (the gather, the
 * combine and its backward, the unpermute, SwiGLU) read and write a row a
 * thread an element at a time: 2- or 4-byte accesses, which left them at
 * a third of the memory's rate (measured on the H200 at the bench shapes:
 * the combine 0.19 ms a layer for 0.34 GB). al16 says whether a pointer
 * allows it; each kernel keeps its element form for what does not.
 */
__device__ __forceinline__ int al16(const void *p)
{
	return !((uintptr_t)p & 15);
}
__device__ __forceinline__ void ld8(const float *p, float *v)
{
	float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
	v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
	v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void ld8(const __nv_bfloat16 *p, float *v)
{
	uint4 u = *(const uint4 *)p;
	const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
	for (int j = 0; j < 4; j++) {
		float2 f = __bfloat1622float2(h[j]);
		v[2 * j] = f.x;
		v[2 * j + 1] = f.y;
	}
}
__device__ __forceinline__ void st8(float *p, const float *v)
{
	((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
	((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void st8(__nv_bfloat16 *p, const float *v)
{
	uint4 u;
	__nv_bfloat162 *h = (__nv_bfloat162 *)&u;
	for (int j = 0; j < 4; j++)
		h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
	*(uint4 *)p = u;
}

/* RoPE on [T, nhd heads of hd] rows (model.c rope_fwd / rope_bwd) */
/* I: the index type, 32-bit where the tensor allows it (a 64-bit division
 * an element costs as much as the rest of the kernel); X: the input's,
 * float, or bf16 (cuDNN's attention gradients, read as they are) */
template <typename I, typename X>
__global__ void k_rope(const X *x, float *y, uint32_t T, uint32_t nhead,
		       uint32_t hd, uint32_t half, uint32_t S, const float *cs,
		       const float *sn, int bwd)
{
	I n = (I)T * nhead * hd;
	for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
	     idx += (I)gridDim.x * blockDim.x) {
		uint32_t i = (uint32_t)(idx % hd);
		I row = idx / hd;
		uint32_t pos = (uint32_t)((row / nhead) % S);
		const X *xr = x + row * hd;
		float out;
		if (i >= 2 * half) {
			out = f32_of(xr[i]);
		} else {
			uint32_t f = i < half ? i : i - half;
			float c = cs[(uint64_t)pos * half + f], s = sn[(uint64_t)pos * half + f];
			if (!bwd) {
				if (i < half) {
					float a = f32_of(xr[i]) * c, b = -f32_of(xr[i + half]) * s;
					out = a + b;
				} else {
					float a2 = f32_of(xr[i]) * c, b2 = f32_of(xr[i - half]) * s;
					out = a2 + b2;
				}
			} else {
				if (i < half)
					out = f32_of(xr[i]) * c + f32_of(xr[i + half]) * s;
				else
					out = f32_of(xr[i]) * c - f32_of(xr[i - half]) * s;
			}
		}
		y[idx] = out;
	}
}

/*
 * The q/k norm and RoPE in one pass, a warp a head's row of n values
 * through the warp's row of shared memory. Forward: x normed as
 * k_rms_rows (rstd written), then rotated as k_rope into y; backward: the
 * RoPE backward of dy (k_rope, bwd), then k_rms_bwd_rows' input gradient
 * into dx. The values between the two are the floats the separate kernels
 * passed through dqv / dq0, so the results are theirs bit for bit, without
 * that buffer's write and read (a head's row: n <= NR_MAXN).
 */
#define NR_MAXN 256

__device__ __forceinline__ float rope_at(const float *v, uint32_t i, uint32_t half, float c,
					 float s, int bwd)
{
	if (!bwd) {
		if (i < half) {
			float a = v[i] * c, b = -v[i + half] * s;
			return a + b;
		}
		float a2 = v[i] * c, b2 = v[i - half] * s;
		return a2 + b2;
	}
	if (i < half)
		return v[i] * c + v[i + half] * s;
	return v[i] * c - v[i - half] * s;
}

/* Y: float, or bf16 where the output is cuDNN's operand only (att16) */
template <typename Y>
__global__ void k_norm_rope(const float *x, const float *w, Y *y, float *rstd,
			    uint64_t rows, uint32_t n, uint32_t nhead, uint32_t half, uint32_t S,
			    const float *cs, const float *sn, float eps)
{
	__shared__ float sb[NTH / 32][NR_MAXN];
	uint32_t lane = threadIdx.x & 31, wi = threadIdx.x >> 5, wpb = blockDim.x >> 5;
	float *sr = sb[wi];
	for (uint64_t row = (uint64_t)blockIdx.x * wpb + wi; row < rows;
	     row += (uint64_t)gridDim.x * wpb) {
		const float *xr = x + row * n;
		float r = warp_rstd(xr, n, eps, lane);
		if (!lane)
			rstd[row] = r;
		for (uint32_t i = lane; i < n; i += 32)
			sr[i] = w[i] * (xr[i] * r);
		__syncwarp();
		uint64_t pos = (row / nhead) % S;
		for (uint32_t i = lane; i < n; i += 32) {
			uint32_t f = i < half ? i : i - half;
			y[row * n + i] = tocv<Y>(i >= 2 * half
							 ? sr[i]
							 : rope_at(sr, i, half, cs[pos * half + f],
								   sn[pos * half + f], 0));
		}
		/* the row is read before the next one overwrites it */
		__syncwarp();
	}
}

template <typename X, typename Y>
__global__ void k_rope_norm_bwd(const X *dy, const float *x, const float *w, const float *rstd,
				Y *dx, uint64_t rows, uint32_t n, uint32_t nhead,
				uint32_t half, uint32_t S, const float *cs, const float *sn,
				uint32_t ldo, uint32_t c0)
{
	/* dx: head h of token t at t ldo + c0 + h n (ldo = nhead n, c0 = 0:
	 * [rows, n]; or straight into the input gradient GEMM's bf16
	 * operand [dq dk dv], no concatenating pass) */
	__shared__ float sb[NTH / 32][NR_MAXN];
	__shared__ float sd[NTH / 32][NR_MAXN];
	uint32_t lane = threadIdx.x & 31, wi = threadIdx.x >> 5, wpb = blockDim.x >> 5;
	float *sr = sb[wi], *sg = sd[wi];
	for (uint64_t row = (uint64_t)blockIdx.x * wpb + wi; row < rows;
	     row += (uint64_t)gridDim.x * wpb) {
		uint64_t o = row * n, pos = (row / nhead) % S;
		for (uint32_t i = lane; i < n; i += 32)
			sr[i] = f32_of(dy[o + i]);
		__syncwarp();
		for (uint32_t i = lane; i < n; i += 32) {
			uint32_t f = i < half ? i : i - half;
			sg[i] = i >= 2 * half ? sr[i]
					      : rope_at(sr, i, half, cs[pos * half + f],
							sn[pos * half + f], 1);
		}
		__syncwarp();
		double dot = 0;
		for (uint32_t i = lane; i < n; i += 32)
			dot += (double)w[i] * sg[i] * x[o + i];
		for (int k = 16; k; k >>= 1)
			dot += __shfl_xor_sync(0xffffffffu, dot, k);
		double r = rstd[row];
		double c = r * r * r * dot / n;
		Y *dr = dx + (row / nhead) * ldo + c0 + (row % nhead) * n;
		for (uint32_t i = lane; i < n; i += 32)
			dr[i] = tocv<Y>((float)(r * w[i] * sg[i] - c * x[o + i]));
		__syncwarp();
	}
}

/*
 * The same two kernels where a head's row is 32 NV values and RoPE's half
 * a multiple of 32 (the bench's and Qwen3's heads of 128, full rotary):
 * every value of a row in a register (lane l holds l + 32 j, the squares
 * and the dot product summed in the order above) and RoPE's partner of
 * element j at j +- half / 32 in the same lane, so no shared memory; the
 * forward two rows a warp step (both rows' loads before either's sums),
 * the backward one (two was slower). The same bits as the kernels above
 * (tools/bench/norm_rope_probe.cu at the bench shapes: q's forward
 * 0.075 -> 0.049 ms, its backward 0.109 -> 0.069). Rows are fewer than 2^32 (nr_fast).
 */
template <typename Y, int NV>
__global__ void k_norm_rope_v(const float *x, const float *w, Y *y, float *rstd, uint32_t rows,
			      uint32_t nhead, uint32_t half, uint32_t S, const float *cs,
			      const float *sn, float eps)
{
	const uint32_t n = 32 * NV, hj = half / 32;
	uint32_t lane = threadIdx.x & 31;
	uint32_t gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	uint32_t nw = (gridDim.x * blockDim.x) >> 5;
	float wv[NV];
#pragma unroll
	for (int j = 0; j < NV; j++)
		wv[j] = w[lane + 32 * j];
	for (uint32_t row0 = gw * 2; row0 < rows; row0 += nw * 2) {
		float v[2][NV];
#pragma unroll
		for (int q = 0; q < 2; q++)
#pragma unroll
			for (int j = 0; j < NV; j++)
				v[q][j] = row0 + q < rows
						  ? x[(uint64_t)(row0 + q) * n + lane + 32 * j]
						  : 0.0f;
#pragma unroll
		for (int q = 0; q < 2; q++) {
			uint32_t row = row0 + q;
			if (row >= rows)
				break;
			double ss = 0;
#pragma unroll
			for (int j = 0; j < NV; j++)
				ss += (double)v[q][j] * v[q][j];
			for (int o = 16; o; o >>= 1)
				ss += __shfl_xor_sync(0xffffffffu, ss, o);
			float var = (float)(ss / n);
			float r = (float)(1.0 / sqrt((double)(var + eps)));
			if (!lane)
				rstd[row] = r;
			float sr[NV];
#pragma unroll
			for (int j = 0; j < NV; j++)
				sr[j] = wv[j] * (v[q][j] * r);
			uint32_t pos = (row / nhead) % S;
#pragma unroll
			for (int j = 0; j < NV; j++) {
				uint32_t i = lane + 32 * j;
				float o;
				if (i >= 2 * half) {
					o = sr[j];
				} else {
					uint32_t f = i < half ? i : i - half;
					float c = cs[(uint64_t)pos * half + f];
					float s = sn[(uint64_t)pos * half + f];
					/* in range: i < half has j + hj < NV */
					if (i < half) {
						float a = sr[j] * c, b = -sr[j + hj] * s;
						o = a + b;
					} else {
						float a2 = sr[j] * c, b2 = sr[j - hj] * s;
						o = a2 + b2;
					}
				}
				y[(uint64_t)row * n + i] = tocv<Y>(o);
			}
		}
	}
}

template <typename X, typename Y, int NV>
__global__ void k_rope_norm_bwd_v(const X *dy, const float *x, const float *w, const float *rstd,
				  Y *dx, uint32_t rows, uint32_t nhead, uint32_t half, uint32_t S,
				  const float *cs, const float *sn, uint32_t ldo, uint32_t c0)
{
	const uint32_t n = 32 * NV, hj = half / 32;
	uint32_t lane = threadIdx.x & 31;
	uint32_t gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	uint32_t nw = (gridDim.x * blockDim.x) >> 5;
	float wv[NV];
#pragma unroll
	for (int j = 0; j < NV; j++)
		wv[j] = w[lane + 32 * j];
	for (uint32_t row = gw; row < rows; row += nw) {
		float dv[NV], xv[NV];
#pragma unroll
		for (int j = 0; j < NV; j++) {
			dv[j] = f32_of(dy[(uint64_t)row * n + lane + 32 * j]);
			xv[j] = x[(uint64_t)row * n + lane + 32 * j];
		}
		double r = rstd[row];
		uint32_t pos = (row / nhead) % S;
		float gv[NV];
		double dot = 0;
#pragma unroll
		for (int j = 0; j < NV; j++) {
			uint32_t i = lane + 32 * j;
			if (i >= 2 * half) {
				gv[j] = dv[j];
			} else {
				uint32_t f = i < half ? i : i - half;
				float c = cs[(uint64_t)pos * half + f], s = sn[(uint64_t)pos * half + f];
				gv[j] = i < half ? dv[j] * c + dv[j + hj] * s
						 : dv[j] * c - dv[j - hj] * s;
			}
			dot += (double)wv[j] * gv[j] * xv[j];
		}
		for (int k = 16; k; k >>= 1)
			dot += __shfl_xor_sync(0xffffffffu, dot, k);
		double c = r * r * r * dot / n;
		Y *dr = dx + (uint64_t)(row / nhead) * ldo + c0 + (row % nhead) * n;
#pragma unroll
		for (int j = 0; j < NV; j++)
			dr[lane + 32 * j] = tocv<Y>((float)(r * wv[j] * gv[j] - c * xv[j]));
	}
}

/* rows a warp step of the float kernels (tools/bench/norm_rope_probe.cu) */
#define NRF_RF 2
#define NRF_RB 2

/* the register kernels' NV for a head of n and RoPE's half, 0 where they
 * do not apply (k_norm_rope and k_rope_norm_bwd then) */
static int nr_fast(uint64_t rows, uint32_t n, uint32_t half)
{
	if (rows >> 32 || n % 32 || half % 32 || 2 * half > n)
		return 0;
	return n == 32 || n == 64 || n == 128 || n == 256 ? (int)(n / 32) : 0;
}

/* the q/k norm + RoPE forward over rows of a head of n <= NR_MAXN; 1
 * where the float kernels ran */
template <typename Y>
static int norm_rope(cudaStream_t st, const float *x, const float *w, Y *y, float *rstd,
		      uint64_t rows, uint32_t n, uint32_t nhead, uint32_t half, uint32_t S,
		      const float *cs, const float *sn, float eps)
{
	int nv = nr_fast(rows, n, half);
	unsigned gb = nblk((rows + 1) / 2, NTH / 32);
	uint32_t r32 = (uint32_t)rows;
	if constexpr (std::is_same<Y, __nv_bfloat16>::value) {
		/* the bf16 operand: the float kernels (norm_rope_f.cuh) */
		const float *fp[] = {x, w, cs, sn};
		const void *bp[] = {y};
		if (nv && nrf_aligned(nv, fp, 4, bp, 1, 0, 0)) {
			unsigned gf = nblk((rows + NRF_RF - 1) / NRF_RF, NTH / 32);
			if (nv == 1)
				k_norm_rope_f<1, NRF_RF><<<gf, NTH, 0, st>>>(x, w, y, rstd, r32, nhead,
									    half, S, cs, sn, eps);
			else if (nv == 2)
				k_norm_rope_f<2, NRF_RF><<<gf, NTH, 0, st>>>(x, w, y, rstd, r32, nhead,
									    half, S, cs, sn, eps);
			else if (nv == 4)
				k_norm_rope_f<4, NRF_RF><<<gf, NTH, 0, st>>>(x, w, y, rstd, r32, nhead,
									    half, S, cs, sn, eps);
			else
				k_norm_rope_f<8, NRF_RF><<<gf, NTH, 0, st>>>(x, w, y, rstd, r32, nhead,
									    half, S, cs, sn, eps);
			return 1;
		}
	}
	if (nv == 1)
		k_norm_rope_v<Y, 1><<<gb, NTH, 0, st>>>(x, w, y, rstd, r32, nhead, half, S, cs,
							       sn, eps);
	else if (nv == 2)
		k_norm_rope_v<Y, 2><<<gb, NTH, 0, st>>>(x, w, y, rstd, r32, nhead, half, S, cs,
							       sn, eps);
	else if (nv == 4)
		k_norm_rope_v<Y, 4><<<gb, NTH, 0, st>>>(x, w, y, rstd, r32, nhead, half, S, cs,
							       sn, eps);
	else if (nv == 8)
		k_norm_rope_v<Y, 8><<<gb, NTH, 0, st>>>(x, w, y, rstd, r32, nhead, half, S, cs,
							       sn, eps);
	else
		k_norm_rope<Y><<<nblk(rows, NTH / 32), NTH, 0, st>>>(x, w, y, rstd, rows, n, nhead,
								     half, S, cs, sn, eps);
	return 0;
}

/* its backward likewise */
template <typename X, typename Y>
static int rope_norm_bwd(cudaStream_t st, const X *dy, const float *x, const float *w,
			  const float *rstd, Y *dx, uint64_t rows, uint32_t n, uint32_t nhead,
			  uint32_t half, uint32_t S, const float *cs, const float *sn,
			  uint32_t ldo, uint32_t c0)
{
	int nv = nr_fast(rows, n, half);
	unsigned gb = nblk(rows, NTH / 32);
	uint32_t r32 = (uint32_t)rows;
	if constexpr (std::is_same<X, __nv_bfloat16>::value &&
		      std::is_same<Y, __nv_bfloat16>::value) {
		/* bf16 in and out: the float kernels (norm_rope_f.cuh) */
		const float *fp[] = {x, w, cs, sn};
		const void *bp[] = {dy, dx};
		if (nv && nrf_aligned(nv, fp, 4, bp, 2, ldo, c0)) {
			unsigned gf = nblk((rows + NRF_RB - 1) / NRF_RB, NTH / 32);
			if (nv == 1)
				k_rope_norm_bwd_f<1, NRF_RB><<<gf, NTH, 0, st>>>(
					dy, x, w, rstd, dx, r32, nhead, half, S, cs, sn, ldo, c0);
			else if (nv == 2)
				k_rope_norm_bwd_f<2, NRF_RB><<<gf, NTH, 0, st>>>(
					dy, x, w, rstd, dx, r32, nhead, half, S, cs, sn, ldo, c0);
			else if (nv == 4)
				k_rope_norm_bwd_f<4, NRF_RB><<<gf, NTH, 0, st>>>(
					dy, x, w, rstd, dx, r32, nhead, half, S, cs, sn, ldo, c0);
			else
				k_rope_norm_bwd_f<8, NRF_RB><<<gf, NTH, 0, st>>>(
					dy, x, w, rstd, dx, r32, nhead, half, S, cs, sn, ldo, c0);
			return 1;
		}
	}
	if (nv == 1)
		k_rope_norm_bwd_v<X, Y, 1><<<gb, NTH, 0, st>>>(dy, x, w, rstd, dx, r32, nhead, half,
							       S, cs, sn, ldo, c0);
	else if (nv == 2)
		k_rope_norm_bwd_v<X, Y, 2><<<gb, NTH, 0, st>>>(dy, x, w, rstd, dx, r32, nhead, half,
							       S, cs, sn, ldo, c0);
	else if (nv == 4)
		k_rope_norm_bwd_v<X, Y, 4><<<gb, NTH, 0, st>>>(dy, x, w, rstd, dx, r32, nhead, half,
							       S, cs, sn, ldo, c0);
	else if (nv == 8)
		k_rope_norm_bwd_v<X, Y, 8><<<gb, NTH, 0, st>>>(dy, x, w, rstd, dx, r32, nhead, half,
							       S, cs, sn, ldo, c0);
	else
		k_rope_norm_bwd<X, Y><<<nblk(rows, NTH / 32), NTH, 0, st>>>(
			dy, x, w, rstd, dx, rows, n, nhead, half, S, cs, sn, ldo, c0);
	return 0;
}

/* exp(s - mx): in double in the test mode (att_fwd_pairs' arithmetic), in
 * float (the fast exp) for the bf16 path, whose operands are rounded to 8
 * bits anyway */
template <bool EX> __device__ __forceinline__ double sexp(float s, float mx);
template <> __device__ __forceinline__ double sexp<true>(float s, float mx)
{
	return exp((double)s - mx);
}
template <> __device__ __forceinline__ double sexp<false>(float s, float mx)
{
	return (double)__expf(s - mx);
}

/* causal softmax of scale * scores, one block a row of S (row i of head h
 * in [nh*S]); P in the GEMM type, zeros above the diagonal (att_fwd_pairs) */
template <typename T, bool EX>
__global__ void k_softmax(const float *sc, T *P, uint32_t S, float scale)
{
	__shared__ double shd[33];
	__shared__ float shf[33];
	uint64_t row = blockIdx.x;
	uint32_t i = (uint32_t)(row % S);
	const float *s = sc + row * S;
	T *p = P + row * S;
	float mx = -INFINITY;
	for (uint32_t t = threadIdx.x; t <= i; t += blockDim.x)
		mx = fmaxf(mx, s[t] * scale);
	mx = block_max(mx, shf);
	double sum = 0;
	for (uint32_t t = threadIdx.x; t <= i; t += blockDim.x)
		sum += sexp<EX>(s[t] * scale, mx);
	sum = block_sum(sum, shd);
	for (uint32_t t = threadIdx.x; t < S; t += blockDim.x)
		p[t] = tocv<T>(t <= i ? (float)(sexp<EX>(s[t] * scale, mx) / sum) : 0.0f);
}

/* The softmax's backward from recomputed scores: P (GEMM type, for dV),
 * dS = P (dP - sum_t P dP) * scale (GEMM type, for dQ and dK). */
template <typename T, bool EX>
__global__ void k_softmax_bwd(const float *sc, const float *dP, T *P, T *dS,
			      uint32_t S, float scale)
{
	__shared__ double shd[33];
	__shared__ float shf[33];
	uint64_t row = blockIdx.x;
	uint32_t i = (uint32_t)(row % S);
	const float *s = sc + row * S, *dp = dP + row * S;
	float mx = -INFINITY;
	for (uint32_t t = threadIdx.x; t <= i; t += blockDim.x)
		mx = fmaxf(mx, s[t] * scale);
	mx = block_max(mx, shf);
	double sum = 0;
	for (uint32_t t = threadIdx.x; t <= i; t += blockDim.x)
		sum += sexp<EX>(s[t] * scale, mx);
	sum = block_sum(sum, shd);
	double dot = 0;
	for (uint32_t t = threadIdx.x; t <= i; t += blockDim.x)
		dot += (double)(float)(sexp<EX>(s[t] * scale, mx) / sum) * dp[t];
	dot = block_sum(dot, shd);
	for (uint32_t t = threadIdx.x; t < S; t += blockDim.x) {
		float p = t <= i ? (float)(sexp<EX>(s[t] * scale, mx) / sum) : 0.0f;
		P[row * S + t] = tocv<T>(p);
		dS[row * S + t] = tocv<T>((float)(p * ((double)dp[t] - dot)) * scale);
	}
}

__device__ __forceinline__ float silu_d(float g)
{
	return g / (1.0f + expf(-g));
}

/* vector unit i (eight columns) of [n, F] rows: its row r and column c,
 * and gate/up's eight values there (gu [n, 2F]: gate, then up) */
template <typename G>
__device__ __forceinline__ void gu_at(const G *gu, uint64_t i, uint32_t F, uint64_t *r,
				      uint32_t *c, float *g8, float *u8)
{
	uint32_t fv = F / 8;
	*r = udiv(i, fv);
	*c = (uint32_t)(i - *r * fv) * 8;
	ld8(gu + *r * 2 * F + *c, g8);
	ld8(gu + *r * 2 * F + F + *c, u8);
}

/* gu float32, or bf16 (a folded layer's expert GEMM output) */
template <typename G>
__global__ void k_swiglu(const G *gu, float *act, __nv_bfloat16 *actb,
			 __nv_bfloat16 *tw, uint64_t n, uint32_t F, uint32_t ldt)
{
	/* tw: the bf16 twin (k_gather's), row stride ldt; the kept output in
	 * float32 (act) or bf16 (actb), or neither (the twin kept). Eight elements a thread over the
	 * whole tensor (ld8) where F, ldt and the pointers allow: a row a
	 * block left most of a 256-thread block idle at F 768 */
	if (F % 8 == 0 && ldt % 8 == 0 && al16(gu) && al16(act ? (const void *)act : actb) &&
	    (!tw || al16(tw))) {
		for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * (F / 8);
		     i += (uint64_t)gridDim.x * blockDim.x) {
			uint64_t r;
			uint32_t c;
			float a[8], b[8], v[8];
			gu_at(gu, i, F, &r, &c, a, b);
			for (int j = 0; j < 8; j++)
				v[j] = silu_d(a[j]) * b[j];
			if (act)
				st8(act + r * F + c, v);
			else if (actb)
				st8(actb + r * F + c, v);
			if (tw)
				st8(tw + r * ldt + c, v);
		}
		return;
	}
	/* a block a row at a time */
	for (uint64_t r = blockIdx.x; r < n; r += gridDim.x)
		for (uint32_t c = threadIdx.x; c < F; c += blockDim.x) {
			float v = silu_d(f32_of(gu[r * 2 * F + c])) * f32_of(gu[r * 2 * F + F + c]);
			__nv_bfloat16 b = __float2bfloat16_rn(v);
			if (act)
				act[r * F + c] = v;
			else if (actb)
				actb[r * F + c] = b;
			if (tw)
				tw[r * ldt + c] = b;
		}
}

/* dact and gu float32, or both bf16 (a folded layer's) */
template <typename G>
__global__ void k_swiglu_bwd(const G *dact, const G *gu, float *dgu,
			     __nv_bfloat16 *tw, uint64_t n, uint32_t F, uint32_t ldt)
{
	/* tw: the bf16 twin (k_gather's), row stride ldt; dgu NULL: the twin
	 * only (the folded LoRA reads no float32 copy). Eight elements a
	 * thread where F, ldt and the pointers allow (as k_swiglu) */
	if (F % 8 == 0 && ldt % 8 == 0 && al16(dact) && al16(gu) && (!dgu || al16(dgu)) &&
	    (!tw || al16(tw))) {
		for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * (F / 8);
		     i += (uint64_t)gridDim.x * blockDim.x) {
			uint64_t r;
			uint32_t c;
			float gg[8], up[8], da[8], d0[8], d1[8];
			gu_at(gu, i, F, &r, &c, gg, up);
			ld8(dact + r * F + c, da);
			for (int j = 0; j < 8; j++) {
				float sg = 1.0f / (1.0f + expf(-gg[j])), sl = gg[j] * sg;
				d0[j] = da[j] * up[j] * (sg * (1.0f + gg[j] * (1.0f - sg)));
				d1[j] = da[j] * sl;
			}
			if (dgu) {
				st8(dgu + r * 2 * F + c, d0);
				st8(dgu + r * 2 * F + F + c, d1);
			}
			if (tw) {
				st8(tw + r * ldt + c, d0);
				st8(tw + r * ldt + F + c, d1);
			}
		}
		return;
	}
	/* a block a row at a time */
	for (uint64_t r = blockIdx.x; r < n; r += gridDim.x)
		for (uint32_t c = threadIdx.x; c < F; c += blockDim.x) {
			float gg = f32_of(gu[r * 2 * F + c]), sg = 1.0f / (1.0f + expf(-gg));
			float sl = gg * sg, da = f32_of(dact[r * F + c]);
			float d0 = da * f32_of(gu[r * 2 * F + F + c]) * (sg * (1.0f + gg * (1.0f - sg)));
			float d1 = da * sl;
			if (dgu) {
				dgu[r * 2 * F + c] = d0;
				dgu[r * 2 * F + F + c] = d1;
			}
			if (tw) {
				tw[r * ldt + c] = __float2bfloat16_rn(d0);
				tw[r * ldt + F + c] = __float2bfloat16_rn(d1);
			}
		}
}

/* A folded layer's SwiGLU backward from the down dgrad of the combine's
 * unweighted gradient: row p (slot sl = perm[p]) holds dact' = dy_t W_e
 * (+ its LoRA's), the true dact being w_sl dact'; and, since the expert's
 * output is ye = act W_e^T (+ s U B_e^T), the combine's weight gradient
 * dw_sl = dy_t . ye = dact' . act (the same sum through the transposed
 * product), act as k_swiglu kept it (its bf16 rounding recomputed from
 * gu). So the combine's backward reads no ye, and ye need not be kept:
 * a warp a row, dw in double over the row's lanes then by shuffles. */
__global__ void k_swiglu_bwd_dw(const __nv_bfloat16 *dact, const __nv_bfloat16 *gu,
				const int32_t *perm, const float *w, float *dw,
				__nv_bfloat16 *tw, uint64_t n, uint32_t F, uint32_t ldt)
{
	uint32_t lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
	for (uint64_t p = (uint64_t)blockIdx.x * wpb + (threadIdx.x >> 5); p < n;
	     p += (uint64_t)gridDim.x * wpb) {
		int32_t sl = perm[p];
		float wk = w[sl];
		double d = 0;
		/* eight elements a lane where F and ldt allow (ld8), else one */
		int vec = F % 8 == 0 && ldt % 8 == 0;
		for (uint32_t c = lane; !vec && c < F; c += 32) {
			float gg = __bfloat162float(gu[p * 2 * F + c]);
			float up = __bfloat162float(gu[p * 2 * F + F + c]);
			float da = __bfloat162float(dact[p * F + c]);
			float act = __bfloat162float(__float2bfloat16_rn(silu_d(gg) * up));
			d += (double)da * act;
			float dd = wk * da, sg = 1.0f / (1.0f + expf(-gg)), sw = gg * sg;
			tw[p * ldt + c] =
				__float2bfloat16_rn(dd * up * (sg * (1.0f + gg * (1.0f - sg))));
			tw[p * ldt + F + c] = __float2bfloat16_rn(dd * sw);
		}
		for (uint32_t c = lane * 8; vec && c < F; c += 256) {
			float gg[8], up[8], da[8], d0[8], d1[8];
			ld8(gu + p * 2 * F + c, gg);
			ld8(gu + p * 2 * F + F + c, up);
			ld8(dact + p * F + c, da);
			for (int j = 0; j < 8; j++) {
				float act = __bfloat162float(__float2bfloat16_rn(silu_d(gg[j]) * up[j]));
				d += (double)da[j] * act;
				float dd = wk * da[j];
				float sg = 1.0f / (1.0f + expf(-gg[j])), sw = gg[j] * sg;
				d0[j] = dd * up[j] * (sg * (1.0f + gg[j] * (1.0f - sg)));
				d1[j] = dd * sw;
			}
			st8(tw + p * ldt + c, d0);
			st8(tw + p * ldt + F + c, d1);
		}
		for (int o = 16; o; o >>= 1)
			d += __shfl_xor_sync(0xffffffffu, d, o);
		if (!lane)
			dw[sl] = (float)d;
	}
}

/* the grid of a row-per-block kernel over n rows */
static unsigned rows_grid(uint64_t n)
{
	return (unsigned)(n < (1u << 20) ? (n ? n : 1) : (1u << 20));
}

/* k_swiglu's and k_swiglu_bwd's grid over n rows of F: a thread an
 * 8-element group (their vectorized path; the row path strides over
 * whatever grid it gets). A block a row launched 2.7 times the blocks
 * that had work at F 768 */
static unsigned swiglu_grid(uint64_t n, uint32_t F)
{
	return nblk(n * ((F + 7) / 8));
}

/* Where a producer writes its output's bf16 twin (the GEMM operand
 * scratch cA: the next GEMM reads it there, no cast pass); NULL in the
 * float32 mode, whose GEMMs read the float32 output itself */
static __nv_bfloat16 *twin_buf(const struct ms_gmodel *g)
{
	return g->f32 ? NULL : (__nv_bfloat16 *)g->cA;
}

/* the GEMM operand of x, which a producer wrote with twin_buf */
static const void *twin_of(const struct ms_gmodel *g, const float *x)
{
	return g->f32 ? (const void *)x : g->cA;
}

__global__ void k_bias(float *y, const float *b, uint64_t n, uint32_t out)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * out;
	     i += (uint64_t)gridDim.x * blockDim.x)
		y[i] += b[i % out];
}

__global__ void k_add(float *y, const float *a, const float *b, uint64_t n)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		y[i] = a[i] + b[i];
}

/* model.c's dotf: four double lanes, summed (s0 + s1) + (s2 + s3) */
__device__ double dotf_d(const float *a, const float *b, uint32_t n)
{
	double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	uint32_t i = 0;
	for (; i + 4 <= n; i += 4) {
		s0 += (double)a[i] * b[i];
		s1 += (double)a[i + 1] * b[i + 1];
		s2 += (double)a[i + 2] * b[i + 2];
		s3 += (double)a[i + 3] * b[i + 3];
	}
	for (; i < n; i++)
		s0 += (double)a[i] * b[i];
	return (s0 + s1) + (s2 + s3);
}

/* router logits z [T, E] in model.c's order, one thread an element */
__global__ void k_router_logits(const float *h, const float *W, float *z, uint32_t T,
				uint32_t E, uint32_t H)
{
	uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= (uint64_t)T * E)
		return;
	uint64_t t = i / E;
	uint32_t e = (uint32_t)(i % E);
	z[i] = (float)dotf_d(W + (uint64_t)e * H, h + t * H, H);
}

#define MAXE 512

struct rcfg {
	uint32_t E, K, G, topk_group;
	int sigmoid, norm;
	float rsf;
};

/*
 * model.c route_row after the logits: a warp a token, RW tokens a block.
 * One thread a token kept a block of 64 threads on an SM with the scores
 * in local memory (measured on the H200 at the bench shapes: the routing's
 * top-k phase 0.5 ms a layer). The sums stay serial in model.c's order (lane
 * 0) and the arg-max takes the first of equal values as the serial scan
 * does, so the probabilities, picks and weights are the one-thread form's
 * bit for bit. Shared memory: RW * E * 16 bytes (exp terms, choice scores,
 * probabilities).
 */
#define RW 4

__global__ void k_route(const struct rcfg c, const float *z, const float *ecb,
			float *probs, int32_t *sel, float *wts, uint32_t T)
{
	extern __shared__ double rsh[];
	const uint32_t FULL = 0xffffffffu;
	uint32_t w = threadIdx.x >> 5, lane = threadIdx.x & 31, E = c.E, K = c.K;
	uint64_t t = (uint64_t)blockIdx.x * RW + w;
	if (t >= T)
		return;
	double *ex = rsh + (uint64_t)w * E;
	float *ch = (float *)(rsh + (uint64_t)RW * E) + (uint64_t)w * E;
	float *pp = (float *)(rsh + (uint64_t)RW * E) + (uint64_t)(RW + w) * E;
	const float *zr = z + t * E;
	float *p = probs + t * E;
	if (!c.sigmoid) {
		float mx = -INFINITY;
		for (uint32_t e = lane; e < E; e += 32)
			if (zr[e] > mx)
				mx = zr[e];
		for (uint32_t o = 16; o; o >>= 1) {
			float y = __shfl_xor_sync(FULL, mx, o);
			if (y > mx)
				mx = y;
		}
		for (uint32_t e = lane; e < E; e += 32)
			ex[e] = exp((double)zr[e] - mx);
		__syncwarp();
		double sum = 0;
		if (lane == 0)
			for (uint32_t e = 0; e < E; e++)
				sum += ex[e];
		sum = __shfl_sync(FULL, sum, 0);
		for (uint32_t e = lane; e < E; e += 32) {
			float v = (float)(ex[e] / sum);
			p[e] = pp[e] = ch[e] = v;
		}
		__syncwarp();
	} else {
		for (uint32_t e = lane; e < E; e += 32) {
			float v = 1.0f / (1.0f + expf(-zr[e]));
			p[e] = pp[e] = v;
			ch[e] = v + ecb[e];
		}
		__syncwarp();
		if (lane == 0) {
			uint32_t G = c.G, per = E / G;
			float gs[64];
			int keep[64];
			for (uint32_t gi = 0; gi < G; gi++) {
				float b1 = -INFINITY, b2 = -INFINITY;
				for (uint32_t e = gi * per; e < (gi + 1) * per; e++) {
					if (ch[e] > b1) {
						b2 = b1;
						b1 = ch[e];
					} else if (ch[e] > b2) {
						b2 = ch[e];
					}
				}
				gs[gi] = per >= 2 ? b1 + b2 : b1;
				keep[gi] = 0;
			}
			for (uint32_t k = 0; k < c.topk_group; k++) {
				int best = -1;
				for (uint32_t gi = 0; gi < G; gi++)
					if (!keep[gi] && (best < 0 || gs[gi] > gs[best]))
						best = (int)gi;
				keep[best] = 1;
			}
			for (uint32_t e = 0; e < E; e++)
				if (!keep[e / per])
					ch[e] = -INFINITY;
		}
		__syncwarp();
	}
	int32_t *s = sel + t * K;
	float *wk = wts + t * K;
	uint32_t used = 0;           /* bit j: expert lane + 32 j taken */
	for (uint32_t k = 0; k < K; k++) {
		float bv = 0;
		int bi = -1;
		for (uint32_t e = lane, j = 0; e < E; e += 32, j++)
			if (!(used >> j & 1) && (bi < 0 || ch[e] > bv)) {
				bv = ch[e];
				bi = (int)e;
			}
		for (uint32_t o = 16; o; o >>= 1) {
			float ov = __shfl_xor_sync(FULL, bv, o);
			int oi = __shfl_xor_sync(FULL, bi, o);
			if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
				bv = ov;
				bi = oi;
			}
		}
		if (bi >= 0 && (uint32_t)bi % 32 == lane)
			used |= 1u << (bi / 32);
		if (lane == 0) {
			s[k] = bi;
			wk[k] = bi >= 0 ? pp[bi] : 0.0f;
		}
	}
	if (lane)
		return;
	if (c.norm) {
		float sm = 0;
		for (uint32_t k = 0; k < K; k++)
			sm += wk[k];
		if (c.sigmoid)
			sm += 1e-20f;
		for (uint32_t k = 0; k < K; k++)
			wk[k] /= sm;
	}
	if (c.sigmoid)
		for (uint32_t k = 0; k < K; k++)
			wk[k] = wk[k] * c.rsf;
}

/* model.c route_bwd_row up to dz (the GEMM with the router follows) */
__global__ void k_route_bwd(const struct rcfg c, const float *probs, const int32_t *sel,
			    const float *wts, const float *dw, float *dz, uint32_t T)
{
	uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
	if (t >= T)
		return;
	uint32_t E = c.E, K = c.K;
	const float *p = probs + (uint64_t)t * E, *w = wts + (uint64_t)t * K;
	const int32_t *s = sel + (uint64_t)t * K;
	const float *dwr = dw + (uint64_t)t * K;
	double dp[MAXE];
	for (uint32_t e = 0; e < E; e++)
		dp[e] = 0;
	if (!c.sigmoid) {
		if (c.norm) {
			double Sm = 0, dot = 0;
			for (uint32_t k = 0; k < K; k++) {
				Sm += p[s[k]];
				dot += (double)dwr[k] * w[k];
			}
			for (uint32_t k = 0; k < K; k++)
				dp[s[k]] += (dwr[k] - dot) / Sm;
		} else {
			for (uint32_t k = 0; k < K; k++)
				dp[s[k]] += dwr[k];
		}
		double dot = 0;
		for (uint32_t e = 0; e < E; e++)
			dot += (double)p[e] * dp[e];
		for (uint32_t e = 0; e < E; e++)
			dz[(uint64_t)t * E + e] = (float)(p[e] * (dp[e] - dot));
	} else {
		double rsf = c.rsf;
		if (c.norm) {
			double D = 1e-20, dot = 0;
			for (uint32_t k = 0; k < K; k++)
				D += p[s[k]];
			for (uint32_t k = 0; k < K; k++)
				dot += (double)dwr[k] * p[s[k]];
			for (uint32_t k = 0; k < K; k++)
				dp[s[k]] += rsf * (dwr[k] / D - dot / (D * D));
		} else {
			for (uint32_t k = 0; k < K; k++)
				dp[s[k]] += rsf * dwr[k];
		}
		for (uint32_t e = 0; e < E; e++)
			dz[(uint64_t)t * E + e] = (float)(dp[e] * p[e] * (1.0 - p[e]));
	}
}

/*
 * The stable sort of the selections by expert, in chunks of SCH (a block
 * each): k_hist counts each chunk's picks of each expert, k_hscan turns
 * those into each chunk's first place inside its expert's block (and the
 * experts' totals), k_scatter places each selection: its chunk's place,
 * the earlier warps' picks of its expert in the chunk, the earlier lanes'
 * in its warp (__match_any_sync). Every expert's rows come out in
 * increasing selection index, as a serial pass would place them. One
 * block an expert scanning every selection (the form before) left most of
 * the H200 idle: 0.4 ms a layer at the bench shapes.
 */
#define SCH 256u

static uint32_t sort_chunks(uint64_t n)
{
	return (uint32_t)((n + SCH - 1) / SCH);
}

/* hc [e * nc + c]: chunk c's picks of expert e (shared memory: E words) */
__global__ void k_hist(const int32_t *sel, uint32_t n, uint32_t E, uint32_t nc, uint32_t *hc)
{
	extern __shared__ uint32_t hsh[];
	uint32_t i = blockIdx.x * SCH + threadIdx.x;
	for (uint32_t e = threadIdx.x; e < E; e += blockDim.x)
		hsh[e] = 0;
	__syncthreads();
	if (i < n)
		atomicAdd(&hsh[sel[i]], 1u);
	__syncthreads();
	for (uint32_t e = threadIdx.x; e < E; e += blockDim.x)
		hc[(uint64_t)e * nc + blockIdx.x] = hsh[e];
}

/* a block an expert: its chunks' counts to exclusive running sums in
 * place, the total to cnt [e] */
__global__ void k_hscan(uint32_t *hc, uint32_t nc, uint32_t *cnt)
{
	__shared__ uint32_t ws[32];
	uint32_t *h = hc + (uint64_t)blockIdx.x * nc;
	uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	uint32_t carry = 0;
	for (uint32_t c0 = 0; c0 < nc; c0 += blockDim.x) {
		uint32_t c = c0 + threadIdx.x, v = c < nc ? h[c] : 0, x = v;
		for (uint32_t o = 1; o < 32; o <<= 1) {
			uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
			if (lane >= o)
				x += y;
		}
		if (lane == 31)
			ws[w] = x;
		__syncthreads();
		if (w == 0) {
			uint32_t t = lane < nw ? ws[lane] : 0;
			for (uint32_t o = 1; o < 32; o <<= 1) {
				uint32_t y = __shfl_up_sync(0xffffffffu, t, o);
				if (lane >= o)
					t += y;
			}
			if (lane < nw)
				ws[lane] = t;  /* inclusive over warps */
		}
		__syncthreads();
		if (c < nc)
			h[c] = carry + (w ? ws[w - 1] : 0) + x - v;
		carry += ws[nw - 1];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		cnt[blockIdx.x] = carry;
}

/* selection i to its place q: perm [q] = i, pos [i] = q (blocks of SCH
 * threads; shared memory: SCH / 32 * E words) */
__global__ void k_scatter(const int32_t *sel, uint32_t n, uint32_t E, uint32_t nc,
			  const uint32_t *hc, const uint32_t *off, int32_t *perm, int32_t *pos)
{
	extern __shared__ uint32_t wc[];
	uint32_t i = blockIdx.x * SCH + threadIdx.x;
	uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	for (uint32_t j = threadIdx.x; j < SCH / 32 * E; j += blockDim.x)
		wc[j] = 0;
	__syncthreads();
	int e = i < n ? sel[i] : -1;
	uint32_t peers = __match_any_sync(0xffffffffu, e);
	uint32_t r = __popc(peers & ((1u << lane) - 1));
	if (e >= 0 && r == 0)
		wc[w * E + (uint32_t)e] = __popc(peers);
	__syncthreads();
	if (e < 0)
		return;
	uint32_t q = off[e] + hc[(uint64_t)e * nc + blockIdx.x] + r;
	for (uint32_t v = 0; v < w; v++)
		q += wc[v * E + (uint32_t)e];
	perm[q] = (int32_t)i;
	pos[i] = (int32_t)q;
}

/* dst[j] = src[perm[j] / K] (a row of H); src float32, or its bf16 copy
 * when only the twin is wanted: each token's row is read K times, in the
 * experts' order, and from float32 that reading cost about twice the
 * writing (0.2 ms a layer at the bench shapes) */
#define GATHER_ROWS 4
template <typename S>
__global__ void k_gather(const S *src, const int32_t *perm, uint32_t K, float *dst,
			 __nv_bfloat16 *tw, uint64_t n, uint32_t H, uint32_t ldt)
{
	/* a block a row at a time (no 64-bit division an element); with tw,
	 * the rows' bf16 twin too (row stride ldt): the expert GEMMs'
	 * operand, without a cast pass reading dst again; dst NULL: the twin
	 * only. Eight elements a thread where the shapes allow (ld8) */
	if (H % 8 == 0 && ldt % 8 == 0 && al16(src) && (!dst || al16(dst)) && (!tw || al16(tw))) {
		/* GATHER_ROWS rows a block step, every load issued before the
		 * stores: with one row (a 16-byte load and store a thread at H
		 * 2048) the blocks waited on one load each and the H200 moved
		 * about 2 TB/s */
		for (uint64_t j0 = (uint64_t)blockIdx.x * GATHER_ROWS; j0 < n;
		     j0 += (uint64_t)gridDim.x * GATHER_ROWS) {
			const S *s[GATHER_ROWS];
#pragma unroll
			for (int q = 0; q < GATHER_ROWS; q++)
				s[q] = j0 + q < n ? src + (uint64_t)(perm[j0 + q] / K) * H : NULL;
			for (uint32_t c = threadIdx.x * 8; c < H; c += blockDim.x * 8) {
				float v[GATHER_ROWS][8];
#pragma unroll
				for (int q = 0; q < GATHER_ROWS; q++)
					if (s[q])
						ld8(s[q] + c, v[q]);
#pragma unroll
				for (int q = 0; q < GATHER_ROWS; q++) {
					uint64_t j = j0 + q;
					if (!s[q])
						break;
					if (dst)
						st8(dst + j * H + c, v[q]);
					if (tw)
						st8(tw + j * ldt + c, v[q]);
				}
			}
		}
		return;
	}
	for (uint64_t j = blockIdx.x; j < n; j += gridDim.x) {
		const S *s = src + (uint64_t)(perm[j] / K) * H;
		for (uint32_t c = threadIdx.x; c < H; c += blockDim.x) {
			float v = f32_of(s[c]);
			if (dst)
				dst[j * H + c] = v;
			if (tw)
				tw[j * ldt + c] = __float2bfloat16_rn(v);
		}
	}
}

/* The dispatch as a scatter: token t's row of src (float32 or bf16) read
 * once and written, in bf16, to its K places pos[t K + k] of the twin tw
 * (row stride ldt), and to xb[t] where xb is given (the backward's bf16
 * copy of the gradient, k_cast's pass folded in). k_gather's copy the
 * other way round: it read each token's row K times, once for each
 * place, a dependent index load before each, and moved about 2 TB/s;
 * the same bits */
template <typename S>
__global__ void k_dispatch(const S *src, const int32_t *pos, uint32_t K,
			   __nv_bfloat16 *xb, __nv_bfloat16 *tw, uint64_t T, uint32_t H,
			   uint32_t ldt)
{
	if (H % 8 == 0 && ldt % 8 == 0 && al16(src) && al16(tw) && (!xb || al16(xb))) {
		for (uint64_t t = blockIdx.x; t < T; t += gridDim.x)
			for (uint32_t c = threadIdx.x * 8; c < H; c += blockDim.x * 8) {
				float v[8];
				ld8(src + t * H + c, v);
				if (xb)
					st8(xb + t * H + c, v);
				for (uint32_t k = 0; k < K; k++)
					st8(tw + (uint64_t)pos[t * K + k] * ldt + c, v);
			}
		return;
	}
	for (uint64_t t = blockIdx.x; t < T; t += gridDim.x)
		for (uint32_t c = threadIdx.x; c < H; c += blockDim.x) {
			__nv_bfloat16 b = __float2bfloat16_rn(f32_of(src[t * H + c]));
			if (xb)
				xb[t * H + c] = b;
			for (uint32_t k = 0; k < K; k++)
				tw[(uint64_t)pos[t * K + k] * ldt + c] = b;
		}
}

/* the sums of columns c .. c+7 over token t's K slots: sum_k src[pos[t,
 * k]], each times w[t, k] (a float product) where w is given, in double
 * and slot order (k_slot_sum) */
template <typename Y>
__device__ __forceinline__ void slot_sum8(const Y *src, const int32_t *pos, const float *w,
					  uint64_t t, uint32_t K, uint32_t H, uint32_t c, double *s)
{
	for (int j = 0; j < 8; j++)
		s[j] = 0;
	for (uint32_t k = 0; k < K; k++) {
		float v[8];
		ld8(src + (uint64_t)pos[t * K + k] * H + c, v);
		if (w) {
			float wk = w[t * K + k];
			for (int j = 0; j < 8; j++)
				s[j] += (double)(v[j] * wk);
		} else {
			for (int j = 0; j < 8; j++)
				s[j] += v[j];
		}
	}
}

/* The combine and the unpermute: out[t] = sum_k src[pos[t,k]] (times
 * w[t,k] where w is given: the combine, y[t] = sum_k ye[pos[t,k]] w[t,k]
 * in model.c's order, float products and a double sum), added to out[t]
 * with acc (the unpermute, dh[t] += sum_k dxs[pos[t,k]], in slot order);
 * src float32 or bf16 (a folded layer's) */
template <typename Y>
__global__ void k_slot_sum(const Y *src, const int32_t *pos, const float *w, float *out,
			   uint32_t T, uint32_t K, uint32_t H, int acc)
{
	/* a block a token at a time (no 64-bit division an element); eight
	 * elements a thread where the shapes allow (ld8), the same sums */
	int vec = H % 8 == 0 && al16(src) && al16(out);
	for (uint64_t t = blockIdx.x; t < T; t += gridDim.x) {
		if (vec) {
			for (uint32_t c = threadIdx.x * 8; c < H; c += blockDim.x * 8) {
				double s[8];
				float o[8] = {0, 0, 0, 0, 0, 0, 0, 0};
				slot_sum8(src, pos, w, t, K, H, c, s);
				if (acc)
					ld8(out + t * H + c, o);
				for (int j = 0; j < 8; j++)
					o[j] = acc ? o[j] + (float)s[j] : (float)s[j];
				st8(out + t * H + c, o);
			}
			continue;
		}
		for (uint32_t c = threadIdx.x; c < H; c += blockDim.x) {
			double s = 0;
			for (uint32_t k = 0; k < K; k++) {
				float v = f32_of(src[(uint64_t)pos[t * K + k] * H + c]);
				s += w ? (double)(v * w[t * K + k]) : (double)v;
			}
			out[t * H + c] = acc ? out[t * H + c] + (float)s : (float)s;
		}
	}
}

/* combine's backward: dye[pos[t,k]] = dxo[t] * w[t,k]; dw[t,k] = dxo[t].ye
 * (double); one block a token */
template <typename Y>
__global__ void k_combine_bwd(const float *dxo, const Y *ye, const int32_t *pos,
			      const float *w, float *dye, __nv_bfloat16 *tw, float *dw,
			      uint32_t K, uint32_t H, uint32_t ldt, __nv_bfloat16 *xb = NULL)
{
	/* dye NULL: the bf16 twin only (row stride ldt). A block a token, a
	 * warp a slot of it: the dot product's sum by shuffles, no barrier
	 * (with a block-wide sum a slot the phase took 11.0 ms a step on the
	 * H200, 10.6 with this: most of its time is elsewhere) */
	uint64_t t = blockIdx.x;
	uint32_t lane = threadIdx.x & 31;
	/* eight elements a lane where the shapes allow (ld8) */
	int vec = H % 8 == 0 && (!tw || ldt % 8 == 0) && al16(dxo) && al16(ye) &&
		  (!dye || al16(dye)) && (!tw || al16(tw)) && (!xb || al16(xb));
	/* xb: dxo's bf16 copy as well (the down LoRA's dense dU, fold_du_dn),
	 * by the first slot's warp */
	for (uint32_t k = threadIdx.x >> 5; k < K; k += blockDim.x >> 5) {
		uint64_t p = (uint64_t)pos[t * K + k], row = p * H;
		float wk = w[t * K + k];
		double d = 0;
		for (uint32_t i = lane * 8; vec && i < H; i += 256) {
			float gv[8], yv[8], o[8];
			ld8(dxo + t * H + i, gv);
			ld8(ye + row + i, yv);
			for (int j = 0; j < 8; j++) {
				d += (double)gv[j] * yv[j];
				o[j] = gv[j] * wk;
			}
			if (dye)
				st8(dye + row + i, o);
			if (tw)
				st8(tw + p * ldt + i, o);
			if (xb && !k)
				st8(xb + t * H + i, gv);
		}
#pragma unroll 4
		for (uint32_t i = lane; !vec && i < H; i += 32) {
			float g = dxo[t * H + i];
			d += (double)g * f32_of(ye[row + i]);
			if (dye)
				dye[row + i] = g * wk;
			if (tw)   /* the bf16 twin (k_gather's) */
				tw[p * ldt + i] = __float2bfloat16_rn(g * wk);
			if (xb && !k)
				xb[t * H + i] = __float2bfloat16_rn(g);
		}
		for (int o = 16; o; o >>= 1)
			d += __shfl_xor_sync(0xffffffffu, d, o);
		if (!lane)
			dw[t * K + k] = (float)d;
	}
}

/* model.c's mix64 / unif: the dropout generator */
__device__ __forceinline__ uint64_t mix64_d(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

__device__ __forceinline__ float drop_fd(uint64_t seed, uint64_t step, uint32_t id,
					 uint64_t key, uint32_t i, double p)
{
	uint64_t a = seed ^ (step * 0x9E3779B97F4A7C15ull), b = ((uint64_t)id << 40) ^ key;
	uint64_t z = mix64_d(mix64_d(mix64_d(a) ^ b) ^ i);
	double u = (double)(z >> 11) * (1.0 / 9007199254740992.0);
	return u < p ? 0.0f : (float)(1.0 / (1.0 - p));
}

/* y = x * mask (acc: y += x * mask); key of row j: keys[j] or j */
__global__ void k_drop(const float *x, float *y, uint64_t n, uint32_t in,
		       const int32_t *keys, uint64_t seed, uint64_t step, uint32_t id,
		       double p, int acc)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * in;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t j = i / in;
		uint64_t key = keys ? (uint64_t)keys[j] : j;
		float f = drop_fd(seed, step, id, key, (uint32_t)(i % in), p);
		if (acc)
			y[i] += x[i] * f;
		else
			y[i] = x[i] * f;
	}
}

/* next-token cross-entropy per row; the logits become the gradient */
__global__ void k_xent(float *lg, const int32_t *ids, const uint8_t *mask, uint32_t S,
		       uint32_t V, double scale, double *lossrow)
{
	__shared__ double shd[33];
	__shared__ float shf[33];
	uint64_t t = blockIdx.x;
	uint32_t s = (uint32_t)(t % S);
	float *l = lg + t * V;
	if (s + 1 >= S || (mask && !mask[t + 1])) {
		for (uint32_t v = threadIdx.x; v < V; v += blockDim.x)
			l[v] = 0;
		if (threadIdx.x == 0)
			lossrow[t] = 0;
		return;
	}
	int32_t lab = ids[t + 1];
	float mx = -INFINITY;
	for (uint32_t v = threadIdx.x; v < V; v += blockDim.x)
		mx = fmaxf(mx, l[v]);
	mx = block_max(mx, shf);
	double sum = 0;
	for (uint32_t v = threadIdx.x; v < V; v += blockDim.x)
		sum += exp((double)l[v] - mx);
	sum = block_sum(sum, shd);
	double lse = mx + log(sum);
	float ll = l[lab];
	__syncthreads();
	if (threadIdx.x == 0)
		lossrow[t] = lse - ll;
	for (uint32_t v = threadIdx.x; v < V; v += blockDim.x) {
		double pv = exp((double)l[v] - lse);
		l[v] = (float)(scale * (pv - (v == (uint32_t)lab)));
	}
}

/*
 * The bf16 path's cross-entropy: k_xent's loss and gradient with float
 * exponentials (their sum in double), the row read twice instead of three
 * times (the maximum and the sum together, online: a thread's running sum
 * rescaled when its maximum grows), and the gradient written once, in bf16,
 * as the lm_head's input-gradient GEMM reads it (k_xent wrote float32 that
 * a cast then read again: 2.5 GB a step at the bench shape instead of 5.5).
 * Rows of V floats 16-byte aligned (xent_bf_ok); dl [T, V] bf16.
 */
__global__ void k_xent_bf(const float *lg, const int32_t *ids, const uint8_t *mask,
			  uint32_t S, uint32_t V, double scale, double *lossrow,
			  __nv_bfloat16 *dl)
{
	__shared__ double shd[33];
	__shared__ float shf[33];
	uint64_t t = blockIdx.x;
	uint32_t s = (uint32_t)(t % S), n4 = V / 4;
	const float4 *l4 = (const float4 *)(lg + t * V);
	uint2 *d4 = (uint2 *)(dl + t * V);
	if (s + 1 >= S || (mask && !mask[t + 1])) {
		for (uint32_t v = threadIdx.x; v < n4; v += blockDim.x)
			d4[v] = make_uint2(0, 0);
		if (threadIdx.x == 0)
			lossrow[t] = 0;
		return;
	}
	int32_t lab = ids[t + 1];
	float m = -INFINITY;
	double sm = 0;
	for (uint32_t v = threadIdx.x; v < n4; v += blockDim.x) {
		float4 x = l4[v];
		float xm = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
		if (xm > m) {
			sm *= (double)__expf(m - xm);
			m = xm;
		}
		sm += (double)__expf(x.x - m) + (double)__expf(x.y - m) +
		      (double)__expf(x.z - m) + (double)__expf(x.w - m);
	}
	float mx = block_max(m, shf);
	double sum = block_sum(m == -INFINITY ? 0.0 : sm * (double)__expf(m - mx), shd);
	double lse = mx + log(sum);
	float ll = lg[t * V + lab];
	if (threadIdx.x == 0)
		lossrow[t] = lse - ll;
	float fl = (float)lse, sc = (float)scale;
	for (uint32_t v = threadIdx.x; v < n4; v += blockDim.x) {
		float4 x = l4[v];
		float p[4] = {__expf(x.x - fl), __expf(x.y - fl), __expf(x.z - fl),
			      __expf(x.w - fl)};
		for (int c = 0; c < 4; c++)
			p[c] = sc * (p[c] - (4 * v + c == (uint32_t)lab));
		__nv_bfloat162 lo = __floats2bfloat162_rn(p[0], p[1]);
		__nv_bfloat162 hi = __floats2bfloat162_rn(p[2], p[3]);
		d4[v] = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
	}
}

static int xent_bf_ok(const float *lg, const void *dl, uint32_t V)
{
	return V % 4 == 0 && !((uintptr_t)lg & 15) && !((uintptr_t)dl & 7);
}

/* sum of squares of n floats: each block's share into part[blockIdx.x]
 * (a fixed grid and order, so the norm is the same on every run) */
#define SQ_BLOCKS 512
__global__ void k_sumsq(const float *g, uint64_t n, double *part)
{
	__shared__ double sh[33];
	double s = 0;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		s += (double)g[i] * g[i];
	s = block_sum(s, sh);
	if (threadIdx.x == 0)
		part[blockIdx.x] = s;
}

__global__ void k_sum_parts(double *part, int n)
{
	__shared__ double sh[33];
	double s = 0;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s += part[i];
	s = block_sum(s, sh);
	if (threadIdx.x == 0)
		part[n] = s;
}

/* torch's lerp on the CPU (optim.c lerpf), without contraction */
__device__ __forceinline__ float lerp_d(float self, float end, float w)
{
	return fabsf(w) < 0.5f ? __fadd_rn(self, __fmul_rn(w, __fsub_rn(end, self)))
			       : __fsub_rn(end, __fmul_rn(__fsub_rn(end, self), __fsub_rn(1.0f, w)));
}

struct adam_s {
	float decay, w1, b2, w2, step_size, bc2_sqrt, eps, clip;
	int wd;
};

/* optim.c's ms_grad_clip scaling then ms_adamw_update, element by element
 * with its float32 operations in its order */
__global__ void k_adamw(float *w, float *g, float *m, float *v, uint64_t n,
			const struct adam_s a)
{
	for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n;
	     j += (uint64_t)gridDim.x * blockDim.x) {
		float gj = g[j];
		if (a.clip != 1.0f) {
			gj = __fmul_rn(gj, a.clip);
			g[j] = gj;
		}
		float wj = w[j];
		if (a.wd)
			wj = __fmul_rn(wj, a.decay);
		float mj = lerp_d(m[j], gj, a.w1);
		float vj = __fadd_rn(__fmul_rn(v[j], a.b2), __fmul_rn(__fmul_rn(a.w2, gj), gj));
		float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vj), a.bc2_sqrt), a.eps);
		wj = __fadd_rn(wj, __fdiv_rn(__fmul_rn(-a.step_size, mj), denom));
		m[j] = mj;
		v[j] = vj;
		w[j] = wj;
	}
}

/* element i of the device's B layout [E, out, r]: its expert, row and
 * rank index */
__device__ __forceinline__ void eok_of(uint64_t i, uint32_t out, uint32_t r, uint32_t *e,
				       uint32_t *o, uint32_t *k)
{
	uint64_t eo = udiv(i, r), e_ = udiv(eo, out);
	*k = (uint32_t)(i - eo * r);
	*o = (uint32_t)(eo - e_ * out);
	*e = (uint32_t)e_;
}

/* PEFT's B [out, r*E] (column k*E+e) <-> the device's [E, out, r] */
__global__ void k_bperm(const float *src, float *dst, uint32_t out, uint32_t r,
			uint32_t E, int to_dev)
{
	uint64_t n = (uint64_t)out * r * E;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		/* i indexes the device layout: e, o, k */
		uint32_t e, o, k;
		eok_of(i, out, r, &e, &o, &k);
		uint64_t h = (uint64_t)o * r * E + (uint64_t)k * E + e;
		if (to_dev)
			dst[i] = src[h];
		else
			dst[h] = src[i];
	}
}

/* ---- GEMMs ------------------------------------------------------------------------ */

/* Row-major C [M, N] = alpha op(A) op(B) + beta C: A [M, K] (ta 0) or
 * [K, M] (ta 1) with row stride lda, B [K, N] or [N, K]; cuBLAS is
 * column-major, so it computes C^T = op(B)^T op(A)^T. */
static void lt_drop(struct ltent *e)
{
	if (e->op)
		blas.lt_desc_destroy(e->op);
	if (e->la)
		blas.lt_layout_destroy(e->la);
	if (e->lb)
		blas.lt_layout_destroy(e->lb);
	if (e->lc)
		blas.lt_layout_destroy(e->lc);
	memset(e, 0, sizeof *e);
}

/* the largest power of two up to 16 that divides p's address */
static uint32_t align16(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	uint32_t b = 16;
	while (b > 1 && a % b)
		b /= 2;
	return b;
}

/* The kept cuBLASLt plan of gemm()'s C [M, N] (float) = op(A) op(B)^T
 * in its row-major terms (cuBLASLt's column-major A is our B and its B our
 * A), made at the shape's first call: NULL (and *rc MS_OK) where it is to
 * take cublasGemmEx (no algorithm, or the table full). */
static struct ltent *lt_get(struct ms_gmodel *g, cublasLtHandle_t lt, int ta, int tb, uint32_t M,
			    uint32_t N, uint32_t K, const void *A, uint32_t lda, const void *B,
			    uint32_t ldb, const void *C, uint32_t ldc, cudaDataType_t ty,
			    cublasComputeType_t ct, cudaDataType_t cty, int *rc, struct ms_err *err)
{
	struct ltkey k;
	uint64_t h = 1469598103934665603ull;
	memset(&k, 0, sizeof k);
	k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
	k.ta = ta, k.tb = tb, k.ct = (int)ct, k.ty = (int)ty, k.cty = (int)cty;
	k.al[0] = align16(B), k.al[1] = align16(A), k.al[2] = align16(C);
	for (size_t i = 0; i < sizeof k; i++)
		h = (h ^ ((const unsigned char *)&k)[i]) * 1099511628211ull;
	*rc = MS_OK;
	for (uint32_t p = 0; p < LT_SLOTS; p++) {
		struct ltent *e = &g->ltc[(h + p) % LT_SLOTS];
		if (e->state && memcmp(&e->k, &k, sizeof k))
			continue;
		if (e->state)
			return e->state > 0 ? e : NULL;
		/* a new shape */
		cublasOperation_t oa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
		cublasOperation_t ob = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
		cublasLtMatmulPreference_t pref = NULL;
		cublasLtMatmulHeuristicResult_t res;
		uint64_t ws = MS_GMODEL_LANE_WS;
		int nres = 0;
		e->k = k;
		e->state = -1;
		if (blas.lt_desc_create(&e->op, ct, CUDA_R_32F) ||
		    blas.lt_desc_set(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa) ||
		    blas.lt_desc_set(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob) ||
		    blas.lt_layout_create(&e->la, ty, tb ? K : N, tb ? N : K, ldb) ||
		    blas.lt_layout_create(&e->lb, ty, ta ? M : K, ta ? K : M, lda) ||
		    blas.lt_layout_create(&e->lc, cty, N, M, ldc) ||
		    blas.lt_pref_create(&pref) ||
		    blas.lt_pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ||
		    blas.lt_pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k.al[0],
				     sizeof k.al[0]) ||
		    blas.lt_pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k.al[1],
				     sizeof k.al[1]) ||
		    blas.lt_pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k.al[2],
				     sizeof k.al[2]) ||
		    blas.lt_pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k.al[2],
				     sizeof k.al[2])) {
			if (pref)
				blas.lt_pref_destroy(pref);
			lt_drop(e);
			*rc = ms_err_set(err, MS_EIO, "cuBLASLt: describing a %ux%ux%u GEMM failed",
					 M, N, K);
			return NULL;
		}
		if (blas.lt_heuristic(lt, e->op, e->la, e->lb, e->lc, e->lc, pref, 1, &res,
				      &nres) == CUBLAS_STATUS_SUCCESS &&
		    nres > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
			e->algo = res.algo;
			e->state = 1;
		}
		blas.lt_pref_destroy(pref);
		return e->state > 0 ? e : NULL;
	}
	return NULL;
}

/* the main stream's GEMM context */
static struct gctx main_ctx(const struct ms_gmodel *g)
{
	struct gctx c = {g->st, g->blas, NULL, NULL};
	if (g->nlane) {
		c.lt = g->lane[0].lt;
		c.ws = g->lane[0].ws;
	}
	return c;
}

/* C [M, N] (row stride ldc) of type cty: float32, or bf16 (the float32
 * sums rounded once, on the way out) */
static int gemm_on(struct ms_gmodel *g, const struct gctx *c, int ta, int tb, uint32_t M,
		   uint32_t N, uint32_t K, float alpha, const void *A, uint32_t lda, const void *B,
		   uint32_t ldb, float beta, void *C, uint32_t ldc, cudaDataType_t ty,
		   cublasComputeType_t ct, cudaDataType_t cty, struct ms_err *err)
{
	uint32_t csz = cty == CUDA_R_16BF ? 2 : 4;
	int rc = MS_OK;
	if (!M || !N)
		return MS_OK;
	if (!K) {
		if (beta == 0)
			for (uint32_t i = 0; i < M; i++)
				CK(cudaMemsetAsync((char *)C + (uint64_t)i * ldc * csz, 0, N * csz,
						   c->st));
		return MS_OK;
	}
	/* (the lanes' GEMMs run beside the main stream: not marked) */
	if (c->st == g->st)
		site(g, -2);
	/* kept plans for the bf16 GEMMs and the adapters' TF32 ones; the
	 * router's exact float32 GEMMs keep cublasGemmEx's kernels */
	if (c->lt && (ty == CUDA_R_16BF ||
		      (ty == CUDA_R_32F && ct == CUBLAS_COMPUTE_32F_FAST_TF32))) {
		struct ltent *e = lt_get(g, c->lt, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, ty, ct,
					 cty, &rc, err);
		if (rc)
			return rc;
		if (e && blas.lt_matmul(c->lt, e->op, &alpha, B, e->la, A, e->lb, &beta, C, e->lc,
					C, e->lc, &e->algo, c->ws, MS_GMODEL_LANE_WS,
					c->st) == CUBLAS_STATUS_SUCCESS) {
			if (c->st == g->st)
				site(g, gemm_key(g, M, N, K, gemm_tt(ta, tb, ty, cty)));
			return MS_OK;
		}
		/* refused: this shape takes cublasGemmEx from now on */
		if (e)
			e->state = -1;
	}
	CB(blas.gemm(c->bl, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
			(int)N, (int)M, (int)K, &alpha, B, ty, (int)ldb, A, ty, (int)lda, &beta, C,
			cty, (int)ldc, ct, CUBLAS_GEMM_DEFAULT));
	if (c->st == g->st)
		site(g, gemm_key(g, M, N, K, gemm_tt(ta, tb, ty, cty)));
out:
	return rc;
}

static int gemm(struct ms_gmodel *g, int ta, int tb, uint32_t M, uint32_t N, uint32_t K,
		float alpha, const void *A, uint32_t lda, const void *B, uint32_t ldb,
		float beta, float *C, uint32_t ldc, cudaDataType_t ty,
		cublasComputeType_t ct, struct ms_err *err)
{
	struct gctx c = main_ctx(g);
	return gemm_on(g, &c, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ty, ct,
		       CUDA_R_32F, err);
}

/* x (float, n elements) as a GEMM operand: itself in float32 mode, else cast
 * into buf */
static int opnd(struct ms_gmodel *g, const float *x, uint64_t n, void *buf,
		const void **out, struct ms_err *err)
{
	int rc = MS_OK;
	if (g->f32) {
		*out = x;
		return MS_OK;
	}
	k_cast<__nv_bfloat16><<<cast_blocks(n), NTH, 0, g->st>>>(x, (__nv_bfloat16 *)buf, n);
	LK();
	*out = buf;
out:
	return rc;
}

/* the decode scratch of layer l's forward pass (bwd 0) or backward: with
 * the decode ahead, one of two that alternate along the step's order of
 * passes (forward 0 .. L-1, backward L-1 .. 0), so that a pass's decode
 * writes the one the pass before it does not read */
static void *wbase(const struct ms_gmodel *g, uint32_t l, int bwd)
{
	return (char *)g->wbuf + (g->ahead ? ((l + (uint32_t)bwd) & 1) * g->wmax * g->esz : 0);
}

/* a frozen projection's weight in the GEMM type: W [out, in] (fwd) or
 * W^T [in, out] (bwd) */
static const void *lin_w(struct ms_gmodel *g, const struct dlin *l, int bwd)
{
	if (!l->nparts)
		return bwd ? l->wt : l->w;
	return (const char *)wbase(g, l->lyr, bwd) + l->woff * g->esz;
}

/* Y [n, out] = X [n, in] W^T (+ b); X already a GEMM operand. Folded
 * (fr): X [n, in + fr] = [X | U], W [out, in + fr] = [W | s B]: the LoRA's
 * s U B^T is the GEMM's last fr steps of K. */
static int lin_fwd_on(struct ms_gmodel *g, const struct gctx *c, const struct dlin *l,
		      const void *X, uint64_t n, void *Y, float beta, cudaDataType_t cty,
		      struct ms_err *err)
{
	int rc;
	uint32_t k = l->in + l->fr;
	if (l->bias && cty != CUDA_R_32F)
		return ms_err_set(err, MS_EINVAL, "a projection with a bias into a bf16 output");
	if ((rc = gemm_on(g, c, 0, 1, (uint32_t)n, l->out, k, 1.0f, X, k, lin_w(g, l, 0), k, beta,
			  Y, l->out, g->gt, g->ct_base, cty, err)))
		return rc;
	if (l->bias) {
		k_bias<<<nblk(n * l->out), NTH, 0, c->st>>>((float *)Y, l->bias, n, l->out);
		CK(cudaGetLastError());
	}
	return MS_OK;
out:
	return rc;
}

static int lin_fwd(struct ms_gmodel *g, const struct dlin *l, const void *X, uint64_t n,
		   float *Y, float beta, struct ms_err *err)
{
	struct gctx c = main_ctx(g);
	return lin_fwd_on(g, &c, l, X, n, Y, beta, CUDA_R_32F, err);
}

/* dX [n, in] (+)= dY [n, out] W, reading W^T [in, out]. Folded (fr):
 * [dY | dU] [n, out + fr] and W^T [in, out + fr] = [W^T | A^T]: dX gets the
 * LoRA's dU A in the same GEMM. */
static int lin_dgrad_on(struct ms_gmodel *g, const struct gctx *c, const struct dlin *l,
			const void *dY, uint64_t n, void *dX, float beta, cudaDataType_t cty,
			struct ms_err *err)
{
	uint32_t k = l->out + l->fr;
	return gemm_on(g, c, 0, 1, (uint32_t)n, l->in, k, 1.0f, dY, k, lin_w(g, l, 1), k, beta,
		       dX, l->in, g->gt, g->ct_base, cty, err);
}

static int lin_dgrad(struct ms_gmodel *g, const struct dlin *l, const void *dY, uint64_t n,
		     float *dX, float beta, struct ms_err *err)
{
	struct gctx c = main_ctx(g);
	return lin_dgrad_on(g, &c, l, dY, n, dX, beta, CUDA_R_32F, err);
}

/*
 * The rows an expert's frozen GEMM runs over: its row count rounded up to
 * a multiple of BUCKET. cuBLAS chooses a kernel per problem shape on the
 * host, and with every expert's count a new shape that choice cost about
 * 0.1 ms a call, more than the GEMM (measured on the H200: the expert
 * phases' host time equalled their GPU time); rounded, the shapes repeat.
 * The extra rows read past the expert's block (into the next expert's rows,
 * or the BUCKET rows of slack every expert-row buffer has) and write past
 * it: the experts run in order and each GEMM writes all of its own rows
 * (beta 0), so whatever the previous one wrote there is overwritten, and
 * the LoRA products, the activation and the combine read exact counts.
 */
#define BUCKET 128u

static uint32_t bucket(uint32_t n)
{
	return (n + BUCKET - 1) / BUCKET * BUCKET;
}

/*
 * The per-expert path's frozen GEMMs of one product on several streams.
 * One expert's GEMM is too small to fill the H200: at the bench shapes
 * (about 1024 rows, N 1536 or 2048) cuBLAS's tiles cover about half of
 * its 132 SMs, and one after another the experts' GEMMs ran at about a
 * quarter of the bf16 matrix rate. The experts are cut into nlane runs
 * of consecutive experts with about equal rows, one run a stream, each
 * with its own cuBLAS handles and workspace (two streams sharing a
 * workspace would race in it). Measured on the H200 (bench model, with
 * cublasGemmEx): 188.7 ms a step on one stream, 183.3 on two, 182.8 on
 * four. Less than hoped: what is left is mostly the host's time a call
 * (ltent), which a thread a lane launching did not shorten (a pool of
 * them measured no faster and is not kept). What bucket() relies on, an
 * expert's rows written
 * after the previous expert's overreach, holds inside a run; an expert
 * whose bucketed rows would reach into the next run's instead takes its
 * rows as a bucketed part and an exact rest, two GEMMs that write only
 * its own rows. Each expert's rows are written by exactly the GEMMs of
 * its run in the same order whatever the streams' timing: the result does
 * not depend on it.
 */
static int lanes_init(struct ms_gmodel *g, struct ms_err *err)
{
	int rc = MS_OK;
	if (!(g->ltc = (struct ltent *)calloc(LT_SLOTS, sizeof *g->ltc)) ||
	    !(g->plan = (struct lplan *)calloc(g->E, sizeof *g->plan)))
		return ms_err_nomem(err);
	for (uint32_t i = 0; i <= MS_GMODEL_LANES; i++)
		CK(cudaEventCreateWithFlags(&g->lev[i], cudaEventDisableTiming));
	for (uint32_t i = 0; i < MS_GMODEL_LANES; i++) {
		struct gctx *c = &g->lane[i];
		CK(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
		if (blas.create(&c->bl) != CUBLAS_STATUS_SUCCESS) {
			c->bl = NULL;
			rc = ms_err_set(err, MS_EIO, "cuBLAS: cublasCreate failed");
			goto out;
		}
		if (blas.lt_create(&c->lt) != CUBLAS_STATUS_SUCCESS) {
			c->lt = NULL;
			rc = ms_err_set(err, MS_EIO, "cuBLAS: cublasLtCreate failed");
			goto out;
		}
		DM(c->ws, MS_GMODEL_LANE_WS, MC_SCRATCH);
		CB(blas.set_stream(c->bl, c->st));
		CB(blas.set_workspace(c->bl, c->ws, MS_GMODEL_LANE_WS));
	}
	DM(g->xsc, MS_XGEMM_SCRATCH, MC_SCRATCH);
	g->nlane = MS_GMODEL_LANES;
out:
	return rc;
}

/* Product ls [e] of every expert with rows (cnt [E], in expert order) on
 * the lanes: forward (bwd 0) Y = X W_e^T, backward dX = dY W_e (lin_fwd,
 * lin_dgrad) over rows of ldx and ldy elements; X already a GEMM operand;
 * Y float32, or bf16 with ybf */
static int expert_gemms(struct ms_gmodel *g, const struct dlin *ls, int bwd, const uint32_t *cnt,
			const void *X, uint64_t ldx, void *Y, uint64_t ldy, int ybf,
			struct ms_err *err)
{
	cudaDataType_t cty = ybf ? CUDA_R_16BF : CUDA_R_32F;
	int rc = MS_OK;
	uint64_t tot = 0, off = 0;
	uint32_t lane = 0, nl = g->nlane, n = 0;
	for (uint32_t e = 0; e < g->E; e++)
		tot += cnt[e];
	for (uint32_t e = 0; e < g->E; e++) {
		uint32_t c = cnt[e];
		if (!c)
			continue;
		/* a run ends where its share of the rows does */
		while (lane + 1 < nl && off >= tot * (lane + 1) / nl)
			lane++;
		uint64_t end = lane + 1 < nl ? tot * (lane + 1) / nl : UINT64_MAX;
		if (end < off + c)
			end = off + c;
		struct lplan *p = &g->plan[n++];
		p->e = e;
		p->lane = lane;
		p->off = off;
		p->part[0] = bucket(c);
		p->part[1] = 0;
		if (lane + 1 < nl && off + bucket(c) > end) {
			p->part[0] = c / BUCKET * BUCKET;
			p->part[1] = c - p->part[0];
		}
		off += c;
	}
	CK(cudaEventRecord(g->lev[0], g->st));
	for (uint32_t i = 0; i < nl; i++)
		CK(cudaStreamWaitEvent(g->lane[i].st, g->lev[0], 0));
	for (uint32_t q = 0; q < n; q++) {
		const struct lplan *p = &g->plan[q];
		const struct gctx *c = &g->lane[p->lane];
		for (uint32_t k = 0, r0 = 0; k < 2; r0 += p->part[k], k++) {
			if (!p->part[k])
				continue;
			const void *x = (const char *)X + (p->off + r0) * ldx * g->esz;
			void *y = (char *)Y + (p->off + r0) * ldy * (ybf ? 2 : 4);
			if ((rc = bwd ? lin_dgrad_on(g, c, &ls[p->e], x, p->part[k], y, 0, cty, err)
				      : lin_fwd_on(g, c, &ls[p->e], x, p->part[k], y, 0, cty, err)))
				return rc;
		}
	}
	for (uint32_t i = 0; i < nl; i++) {
		CK(cudaEventRecord(g->lev[1 + i], g->lane[i].st));
		CK(cudaStreamWaitEvent(g->st, g->lev[1 + i], 0));
	}
out:
	return rc;
}

static_assert(MS_XGEMM_SCRATCH == MS_GMODEL_XGEMM_WS, "the planner's xgemm scratch");

/* the layer's expert row offsets from the host's counts into dpad [E + 1]
 * (pageable: the copy has read h when cudaMemcpyAsync returns) */
static int offsets_up(struct ms_gmodel *g, const uint32_t *cnt, struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t h[MAXE + 1];
	h[0] = 0;
	for (uint32_t e = 0; e < g->E; e++)
		h[e + 1] = h[e] + cnt[e];
	CK(cudaMemcpyAsync(g->dpad, h, (g->E + 1) * sizeof(uint32_t), cudaMemcpyHostToDevice,
			   g->st));
out:
	return rc;
}

/* the layer's expert row offsets and GG_BM-row tiles (ms_ggemm_index's
 * tables: the cumulative counts of each) from the host's counts into dpad
 * [2 (E + 1)], for the bf16 low-rank products */
static int tiles_up(struct ms_gmodel *g, const uint32_t *cnt, struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t h[2 * (MAXE + 1)], *t = h + g->E + 1;
	h[0] = t[0] = 0;
	for (uint32_t e = 0; e < g->E; e++) {
		h[e + 1] = h[e] + cnt[e];
		t[e + 1] = t[e] + (cnt[e] + MS_GGEMM_TILE_ROWS - 1) / MS_GGEMM_TILE_ROWS;
	}
	CK(cudaMemcpyAsync(g->dpad, h, 2 * (g->E + 1) * sizeof(uint32_t),
			   cudaMemcpyHostToDevice, g->st));
out:
	return rc;
}

/* Y [rows, R] = alpha X W_e^T over each expert's rows (ms_ggemm_lowrank_bf16,
 * the tensor cores, one pass over X) where its shapes allow: *ran 1 when
 * it ran, 0 when they do not (the caller's cuBLAS grouped product then).
 * On the H200 at the bench shapes (tools/bench/lowrank_probe.cu) it takes
 * 0.043 and 0.083 ms where cuBLAS's grouped GEMM took 0.063 and 0.097,
 * the same bits */
static int lowrank_bf(struct ms_gmodel *g, const uint32_t *cnt, uint32_t R, uint32_t D,
		      const void *X, uint64_t ldx, const void *W, int wt, void *Y, uint64_t ldy,
		      float alpha, uint64_t rows, int *ran, struct ms_err *err)
{
	int rc = MS_OK;
	*ran = 0;
	if (R % 8 || R > MS_GGEMM_WGRAD_MAX_R || D % 8 || ldx % 2 || ldy % 2 ||
	    ((uintptr_t)X & 3) || ((uintptr_t)Y & 3) || g->E > MAXE)
		return MS_OK;
	struct ms_ggemm_lowrank_bf16 p = {g->E, R, D, rows, g->dpad, g->dpad + g->E + 1, X, ldx,
					  W, (uint64_t)R * D, wt, Y, ldy, alpha};
	if ((rc = tiles_up(g, cnt, err)))
		return rc;
	site(g, -2);
	if ((rc = ms_ggemm_lowrank_bf16(&p, g->st, err)))
		return rc;
	site(g, SK_LOWRANK);
	*ran = 1;
	return MS_OK;
}

/*
 * Product ls [e] of every expert (as expert_gemms) in one launch of the
 * CUTLASS grouped GEMM (xgemm.h) where it runs (this build has CUTLASS,
 * an sm_90 GPU, K and N multiples of 8, packed rows, the experts' bf16
 * weights evenly spaced: the decode scratch's), over the row offsets of
 * cnt; else the lanes' GEMM an expert. Measured on the H200 at the bench shapes
 * the grouped launch runs at 470-600 TFLOP/s against the loop's 290-445,
 * for about 12 us of host time instead of 600-800, with the same sums
 * bit for bit (tools/bench/cutlass_grouped_probe.cu). Y float32, or
 * bf16 with ybf (a folded layer's expert activations).
 */
static int expert_product(struct ms_gmodel *g, const struct dlin *ls, int bwd,
			  const uint32_t *cnt, const void *X, uint64_t ldx, void *Y, uint64_t ldy,
			  int ybf, struct ms_err *err)
{
	uint32_t N = bwd ? ls[0].in : ls[0].out;
	uint32_t K = (bwd ? ls[0].out : ls[0].in) + ls[0].fr;
	const char *w0 = (const char *)lin_w(g, &ls[0], bwd);
	const char *w1 = g->E > 1 ? (const char *)lin_w(g, &ls[1], bwd) : w0;
	uint64_t ws = (uint64_t)(w1 - w0);
	int ok = g->xsc && ldx == K && ldy == N && w1 >= w0 && ws % g->esz == 0 &&
		 ms_xgemm_ok(N, K);
	for (uint32_t e = 1; e < g->E && ok; e++)
		ok = (const char *)lin_w(g, &ls[e], bwd) == w0 + e * ws && !ls[e].bias &&
		     (bwd ? ls[e].in : ls[e].out) == N &&
		     (bwd ? ls[e].out : ls[e].in) + ls[e].fr == K;
	if (!ok || ls[0].bias)
		return expert_gemms(g, ls, bwd, cnt, X, ldx, Y, ldy, ybf, err);
	/* dpad's offsets from cnt, here: between a layer's products other
	 * users put other tables there (lora_bwd_blas) */
	struct ms_xgemm p = {g->E, N, K, g->dpad, X, w0, ws / g->esz, Y, g->xsc, ybf};
	int rc = offsets_up(g, cnt, err);
	site(g, -2);
	if (rc || (rc = ms_xgemm_run(&p, g->st, err)))
		return rc;
	site(g, SK_XGEMM);
	return MS_OK;
}

/* the columns a folded LoRA of rank r adds to its GEMMs' K: r padded with
 * zeros to a multiple of 16 (16-byte aligned rows, whole mma steps) */
static uint32_t fold_width(uint32_t r)
{
	return (r + 15) / 16 * 16;
}


/* LoRA forward over n rows of expert e: U = X A_e^T, Y += s U B_e^T.
 * X is the (dropped) input in float32. */
static int lora_fwd(struct ms_gmodel *g, const struct dlora *L, uint32_t e, const float *X,
		    uint64_t n, float *U, float *Y, struct ms_err *err)
{
	int rc;
	const float *A = L->A + (uint64_t)e * L->r * L->in;
	const float *B = L->B + (uint64_t)e * L->out * L->r;
	if (!n)
		return MS_OK;
	if ((rc = gemm(g, 0, 1, (uint32_t)n, L->r, L->in, 1.0f, X, L->in, A, L->in, 0.0f, U,
		       L->r, CUDA_R_32F, g->ct_lora, err)))
		return rc;
	return gemm(g, 0, 1, (uint32_t)n, L->out, L->r, g->lscale, U, L->r, B, L->r, 1.0f, Y,
		    L->out, CUDA_R_32F, g->ct_lora, err);
}

/* LoRA backward over n rows of expert e: dU = s dY B_e, gB_e += s dY^T U,
 * gA_e += dU^T X, dX += drop(dU A_e) (dX NULL: not wanted). keys: the
 * rows' dropout keys (NULL: the row index). */
static int lora_bwd(struct ms_gmodel *g, const struct dlora *L, uint32_t e, const float *X,
		    const float *U, const float *dY, uint64_t n, float *dX,
		    const int32_t *keys, struct ms_err *err)
{
	int rc = MS_OK;
	float s = g->lscale;
	const float *A = L->A + (uint64_t)e * L->r * L->in;
	const float *B = L->B + (uint64_t)e * L->out * L->r;
	float *gA = L->gA + (uint64_t)e * L->r * L->in;
	float *gB = L->gB + (uint64_t)e * L->out * L->r;
	if (!n)
		return MS_OK;
	if ((rc = gemm(g, 0, 0, (uint32_t)n, L->r, L->out, s, dY, L->out, B, L->r, 0.0f, g->du,
		       L->r, CUDA_R_32F, g->ct_lora, err)) ||
	    (rc = gemm(g, 1, 0, L->out, L->r, (uint32_t)n, s, dY, L->out, U, L->r, 1.0f, gB,
		       L->r, CUDA_R_32F, g->ct_lora, err)) ||
	    (rc = gemm(g, 1, 0, L->r, L->in, (uint32_t)n, 1.0f, g->du, L->r, X, L->in, 1.0f, gA,
		       L->in, CUDA_R_32F, g->ct_lora, err)))
		return rc;
	if (!dX)
		return MS_OK;
	if (!g->train || g->pdrop <= 0)
		return gemm(g, 0, 0, (uint32_t)n, L->in, L->r, 1.0f, g->du, L->r, A, L->in, 1.0f,
			    dX, L->in, CUDA_R_32F, g->ct_lora, err);
	if ((rc = gemm(g, 0, 0, (uint32_t)n, L->in, L->r, 1.0f, g->du, L->r, A, L->in, 0.0f,
		       g->tmp, L->in, CUDA_R_32F, g->ct_lora, err)))
		return rc;
	k_drop<<<nblk(n * L->in), NTH, 0, g->st>>>(g->tmp, dX, n, L->in, keys, g->seed, g->step,
						   L->id, g->pdrop, 1);
	CK(cudaGetLastError());
out:
	return rc;
}

/* One cuBLAS grouped GEMM (column-major terms, float32, TF32 tensor cores;
 * bf: bf16 operands and result, float32 accumulation, the one bf16 form
 * cuBLAS groups) over the experts with rows: expert e's C_e = alpha
 * op(A_e) op(B_e) + beta C_e. One launch instead of one per expert: the
 * LoRA products are too small for a launch each to keep the GPU busy. */
struct gg {
	cublasOperation_t ta, tb;
	int lda, ldb, ldc;
	float alpha, beta;
	int bf;
};

static int ggemm(struct ms_gmodel *g, const struct gg *o, int cnt, const int *m,
		 const int *n, const int *k, const void **A, const void **B, void **C,
		 struct ms_err *err)
{
	int rc = MS_OK;
	cublasOperation_t ta[MAXE], tb[MAXE];
	int lda[MAXE], ldb[MAXE], ldc[MAXE], gs[MAXE];
	float al[MAXE], be[MAXE];
	cudaDataType_t ty = o->bf ? CUDA_R_16BF : CUDA_R_32F;
	if (!cnt)
		return MS_OK;
	for (int i = 0; i < cnt; i++) {
		ta[i] = o->ta;
		tb[i] = o->tb;
		lda[i] = o->lda;
		ldb[i] = o->ldb;
		ldc[i] = o->ldc;
		gs[i] = 1;
		al[i] = o->alpha;
		be[i] = o->beta;
	}
	/* the pointer arrays go to the device in stream order (after the
	 * previous grouped launch has read the device copy), staged through
	 * a ring of pinned slots, each reused once its copy has run */
	void **h = g->hparr + (size_t)g->pslot * 3 * MAXE;
	CK(cudaEventSynchronize(g->pev[g->pslot]));
	memcpy(h, A, cnt * sizeof(void *));
	memcpy(h + MAXE, B, cnt * sizeof(void *));
	memcpy(h + 2 * MAXE, C, cnt * sizeof(void *));
	CK(cudaMemcpyAsync(g->parr, h, 3 * MAXE * sizeof(void *), cudaMemcpyHostToDevice, g->st));
	CK(cudaEventRecord(g->pev[g->pslot], g->st));
	g->pslot = (g->pslot + 1) % PSLOTS;
	site(g, -2);
	CB(blas.gemm_grouped(g->blas, ta, tb, m, n, k, al, (const void *const *)g->parr, ty,
			     lda, (const void *const *)(g->parr + MAXE), ty, ldb, be,
			     g->parr + 2 * MAXE, ty, ldc, cnt, gs,
			     o->bf ? CUBLAS_COMPUTE_32F : g->ct_lora));
	site(g, SK_GEMM_GROUPED);
out:
	return rc;
}

/* Where an operand of expert e's problem starts: base + s * (e, the
 * expert's first row in the sorted rows, or its first row in the layout
 * where every expert's block is bucket()-rounded). */
enum gby { G_EXPERT, G_ROW, G_PADROW };
struct gop {
	const void *base;
	uint64_t s;                  /* elements (float, or bf16 under gg.bf) */
	enum gby by;
};

/* m, n, k of ggemm_experts: a number, or the expert's row count, or that
 * count bucket()-rounded */
#define G_ROWS (-1)
#define G_PADDED (-2)

/* One grouped GEMM over the experts that have rows (cnt [E] rows each, in
 * expert order): the per-expert problems ggemm runs, from one description */
static int ggemm_experts(struct ms_gmodel *g, const struct gg *o, uint32_t E,
			 const uint32_t *cnt, int m, int n, int k, struct gop a, struct gop b,
			 struct gop c, struct ms_err *err)
{
	int mm[MAXE], nn[MAXE], kk[MAXE], q = 0;
	const void *A[MAXE], *B[MAXE];
	void *C[MAXE];
	uint64_t off = 0, po = 0, es = o->bf ? 2 : 4;
	for (uint32_t e = 0; e < E; e++) {
		if (cnt[e]) {
			int rows = (int)cnt[e], pad = (int)bucket(cnt[e]);
			uint64_t at[3] = {e, off, po};
			mm[q] = m == G_ROWS ? rows : m == G_PADDED ? pad : m;
			nn[q] = n == G_ROWS ? rows : n == G_PADDED ? pad : n;
			kk[q] = k == G_ROWS ? rows : k == G_PADDED ? pad : k;
			A[q] = (const char *)a.base + es * a.s * at[a.by];
			B[q] = (const char *)b.base + es * b.s * at[b.by];
			C[q] = (void *)((const char *)c.base + es * c.s * at[c.by]);
			q++;
		}
		off += cnt[e];
		po += bucket(cnt[e]);
	}
	return ggemm(g, o, q, mm, nn, kk, A, B, C, err);
}

/*
 * One of a LoRA's two products over every expert's rows from the offsets
 * routing left on the device (ms_ggemm_lowrank, float32): up 0 takes a
 * row of the wide side (in or out) to the rank, up 1 a row of the rank to
 * the wide side; W is the factor (A [r, in] or B [out, r] per expert), wt
 * when the product reads it transposed (dU = dY B, dX = dU A). The wide
 * side is in for A, out for B.
 */
static int lowrank(struct ms_gmodel *g, const struct dlora *L, const uint32_t *doff, int up,
		   const float *X, const float *W, int wt, float *Y, float alpha, int acc,
		   struct ms_err *err)
{
	struct ms_ggemm_lowrank p;
	uint32_t D = W == L->A ? L->in : L->out;
	memset(&p, 0, sizeof p);
	p.E = L->E;
	p.R = L->r;
	p.D = D;
	p.up = up;
	p.rows = (uint64_t)g->T * g->K;
	p.off = doff;
	p.tiles = doff + L->E + 1;
	p.x = X;
	p.ldx = up ? L->r : D;
	p.w = W;
	p.wstride = (uint64_t)L->r * D;
	p.wt = wt;
	p.y = Y;
	p.ldy = up ? D : L->r;
	p.alpha = alpha;
	p.accumulate = acc;
	return ms_ggemm_lowrank(&p, g->st, err);
}

/* Expert LoRA forward over the sorted rows of every expert with rows:
 * U_e = X_e A_e^T, Y_e += s U_e B_e^T (lora_fwd, grouped) */
static int lora_fwd_grouped(struct ms_gmodel *g, const struct dlora *L, const uint32_t *cnt,
			    const uint32_t *doff, const float *X, float *U, float *Y,
			    struct ms_err *err)
{
	int rc;
	uint64_t r = L->r, in = L->in, out = L->out;
	if (doff && r <= MS_GGEMM_WGRAD_MAX_R)
		return (rc = lowrank(g, L, doff, 0, X, L->A, 0, U, 1.0f, 0, err)) ? rc
			: lowrank(g, L, doff, 1, U, L->B, 0, Y, g->lscale, 1, err);
	struct gg o1 = {CUBLAS_OP_T, CUBLAS_OP_N, (int)L->in, (int)L->in, (int)L->r, 1.0f, 0.0f};
	struct gg o2 = {CUBLAS_OP_T, CUBLAS_OP_N, (int)L->r, (int)L->r, (int)L->out, g->lscale,
			1.0f};
	if ((rc = ggemm_experts(g, &o1, L->E, cnt, (int)r, G_ROWS, (int)in,
				gop{L->A, r * in, G_EXPERT}, gop{X, in, G_ROW},
				gop{U, r, G_ROW}, err)))
		return rc;
	return ggemm_experts(g, &o2, L->E, cnt, (int)out, G_ROWS, (int)r,
			     gop{L->B, out * r, G_EXPERT}, gop{U, r, G_ROW},
			     gop{Y, out, G_ROW}, err);
}

/* rows of expert e: src [off_e + j] -> dst [poff_e + j], j < cnt_e (pad:
 * off [E], poff [E], cnt [E]) */
__global__ void k_pad_rows(const float *src, float *dst, const uint32_t *pad, uint32_t E,
			   uint32_t r)
{
	uint32_t e = blockIdx.x, off = pad[e], po = pad[E + e], n = pad[2 * E + e];
	for (uint32_t i = threadIdx.x; i < n * r; i += blockDim.x)
		dst[(uint64_t)po * r + i] = src[(uint64_t)off * r + i];
}

/* Expert LoRA backward over every expert with rows (lora_bwd's four
 * products) on cuBLAS: dU and dX, whose row count varies per expert, as
 * one grouped launch each; gB and gA, which reduce over the expert's rows,
 * one GEMM per expert over its bucketed rows (grouped, with every expert's
 * own length, those ran slower on the H200). dX goes to dst (+= unless
 * set). */
static int lora_bwd_blas(struct ms_gmodel *g, const struct dlora *L, const uint32_t *cnt,
			 const float *X, const float *U, const float *dY, float *dst, int set,
			 uint64_t TK, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t off = 0, r = L->r, in = L->in, out = L->out;
	struct gg odu = {CUBLAS_OP_N, CUBLAS_OP_N, (int)L->r, (int)L->out, (int)L->r, g->lscale,
			 0.0f};
	struct gg odx = {CUBLAS_OP_N, CUBLAS_OP_N, (int)L->in, (int)L->r, (int)L->in, 1.0f,
			 set ? 0.0f : 1.0f};
	/* gB_e += s dY_e^T U_e and gA_e += dU_e^T X_e over bucketed rows */
	struct gg ogb = {CUBLAS_OP_N, CUBLAS_OP_T, (int)L->r, (int)L->out, (int)L->r, g->lscale,
			 1.0f};
	struct gg oga = {CUBLAS_OP_N, CUBLAS_OP_T, (int)L->in, (int)L->r, (int)L->in, 1.0f, 1.0f};
	/* dU_e = s dY_e B_e */
	if ((rc = ggemm_experts(g, &odu, L->E, cnt, (int)r, G_ROWS, (int)out,
				gop{L->B, out * r, G_EXPERT}, gop{dY, out, G_ROW},
				gop{g->du, r, G_ROW}, err)))
		return rc;
	/* U and dU to a padded layout (each expert's block BUCKET-rounded,
	 * zeros after its rows), so the two reductions run over bucketed row
	 * counts whose shapes repeat (bucket()): the rows past an expert's
	 * own in dY and X are the next expert's or the zeroed slack, and they
	 * meet zeros here */
	{
		/* pageable: the copy has read it when cudaMemcpyAsync returns */
		uint32_t h[3 * MAXE];
		uint64_t po = 0;
		for (uint32_t e = 0; e < L->E; e++) {
			h[e] = (uint32_t)off;
			h[L->E + e] = (uint32_t)po;
			h[2 * L->E + e] = cnt[e];
			off += cnt[e];
			po += bucket(cnt[e]);
		}
		CK(cudaMemcpyAsync(g->dpad, h, 3 * L->E * sizeof(uint32_t), cudaMemcpyHostToDevice,
				   g->st));
		CK(cudaMemsetAsync(g->up, 0, (TK + (uint64_t)L->E * BUCKET) * L->r * 4, g->st));
		CK(cudaMemsetAsync(g->dup, 0, (TK + (uint64_t)L->E * BUCKET) * L->r * 4, g->st));
		k_pad_rows<<<L->E, NTH, 0, g->st>>>(U, g->up, g->dpad, L->E, L->r);
		LK();
		k_pad_rows<<<L->E, NTH, 0, g->st>>>(g->du, g->dup, g->dpad, L->E, L->r);
		LK();
	}
	if ((rc = ggemm_experts(g, &ogb, L->E, cnt, (int)r, (int)out, G_PADDED,
				gop{g->up, r, G_PADROW}, gop{dY, out, G_ROW},
				gop{L->gB, out * r, G_EXPERT}, err)) ||
	    (rc = ggemm_experts(g, &oga, L->E, cnt, (int)in, (int)r, G_PADDED,
				gop{X, in, G_ROW}, gop{g->dup, r, G_PADROW},
				gop{L->gA, r * in, G_EXPERT}, err)))
		return rc;
	/* dX_e (+)= dU_e A_e */
	return ggemm_experts(g, &odx, L->E, cnt, (int)in, G_ROWS, (int)r,
			     gop{L->A, r * in, G_EXPERT}, gop{g->du, r, G_ROW}, gop{dst, in, G_ROW},
			     err);
out:
	return rc;
}

/* The same where routing left the row offsets on the device (doff: the
 * grouped expert GEMMs): the four products by the grouped float32
 * kernels over each expert's own rows (ms_ggemm_lowrank for dU and dX,
 * ms_ggemm_wgrad for gB and gA), reading dY and X once, no padding. */
static int lora_bwd_dev(struct ms_gmodel *g, const struct dlora *L, const uint32_t *doff,
			const float *X, const float *U, const float *dY, float *dst, int set,
			struct ms_err *err)
{
	int rc;
	uint64_t r = L->r, in = L->in, out = L->out;
	struct ms_ggemm_wgrad wb = {L->E, L->r, L->out, doff, U, r, dY, out, L->gB, out * r, 1,
				    g->lscale, 1};
	struct ms_ggemm_wgrad wa = {L->E, L->r, L->in, doff, g->du, r, X, in, L->gA, r * in, 0,
				    1.0f, 1};
	if ((rc = lowrank(g, L, doff, 0, dY, L->B, 1, g->du, g->lscale, 0, err)) ||
	    (rc = ms_ggemm_wgrad(&wb, g->st, err)) || (rc = ms_ggemm_wgrad(&wa, g->st, err)))
		return rc;
	return lowrank(g, L, doff, 1, g->du, L->A, 1, dst, 1.0f, !set, err);
}

/* Expert LoRA backward over every expert with rows: on the device
 * offsets where there are some and the rank is one their kernels cover,
 * else on cuBLAS; then the dropout mask on dX's share. */
static int lora_bwd_experts(struct ms_gmodel *g, const struct dlora *L, const uint32_t *cnt,
			    const uint32_t *doff, const float *X, const float *U, const float *dY,
			    float *dX, const int32_t *keys, uint64_t TK, struct ms_err *err)
{
	int rc = MS_OK;
	int drop = g->train && g->pdrop > 0;
	float *dst = drop ? g->tmp : dX;
	if ((rc = doff && L->r <= MS_GGEMM_WGRAD_MAX_R
			  ? lora_bwd_dev(g, L, doff, X, U, dY, dst, drop, err)
			  : lora_bwd_blas(g, L, cnt, X, U, dY, dst, drop, TK, err)))
		return rc;
	if (drop) {
		k_drop<<<nblk(TK * L->in), NTH, 0, g->st>>>(g->tmp, dX, TK, L->in, keys, g->seed,
							    g->step, L->id, g->pdrop, 1);
		CK(cudaGetLastError());
	}
out:
	return rc;
}

/* the LoRA input of adapter L over n rows: x itself, or x with the
 * dropout mask into buf */
static int lora_in(struct ms_gmodel *g, const struct dlora *L, const float *x, uint64_t n,
		   const int32_t *keys, float *buf, const float **out, struct ms_err *err)
{
	int rc = MS_OK;
	*out = x;
	if (!L || !g->train || g->pdrop <= 0)
		return MS_OK;
	k_drop<<<nblk(n * L->in), NTH, 0, g->st>>>(x, buf, n, L->in, keys, g->seed, g->step,
						   L->id, g->pdrop, 0);
	LK();
	*out = buf;
out:
	return rc;
}

#define OFF(p, n) ((void *)((char *)(p) + (uint64_t)(n) * g->esz))

/* ---- build ------------------------------------------------------------------------ */

/* float host data (n) into a new device buffer of category c */
static int up_f(struct ms_gmodel *g, const float *h, uint64_t n, float **d, int c,
		struct ms_err *err)
{
	int rc;
	*d = NULL;
	if (!h)
		return MS_OK;
	DM(*d, n * sizeof(float), c);
	CK(cudaMemcpy(*d, h, n * sizeof(float), cudaMemcpyHostToDevice));
out:
	return rc;
}

/* float host [rows, cols] into the GEMM type, as is and transposed (wt
 * may be NULL) */
static int up_w(struct ms_gmodel *g, const float *h, uint32_t rows, uint32_t cols,
		void **w, void **wt, struct ms_err *err)
{
	int rc;
	float *tmp = NULL;
	uint64_t n = (uint64_t)rows * cols;
	DM(*w, n * g->esz, MC_DENSE);
	if (wt)
		DM(*wt, n * g->esz, MC_DENSE);
	CK(cudaMalloc(&tmp, n * sizeof(float)));
	CK(cudaMemcpy(tmp, h, n * sizeof(float), cudaMemcpyHostToDevice));
	if (g->f32) {
		CK(cudaMemcpy(*w, tmp, n * sizeof(float), cudaMemcpyDeviceToDevice));
		if (wt) {
			k_tcast<float><<<nblk(n), NTH>>>(tmp, (float *)*wt, rows, cols);
			LK();
		}
	} else {
		k_cast<__nv_bfloat16><<<cast_blocks(n), NTH>>>(tmp, (__nv_bfloat16 *)*w, n);
		LK();
		if (wt) {
			k_tcast<__nv_bfloat16><<<nblk(n), NTH>>>(tmp, (__nv_bfloat16 *)*wt, rows,
								cols);
			LK();
		}
	}
	CK(cudaDeviceSynchronize());
out:
	cudaFree(tmp);
	return rc;
}

/* the decode scratch a folded projection takes past out * in: fr columns
 * of its forward W [out, in + fr] or of its W^T [in, out + fr], whichever
 * is larger (the two share the place) */
static uint64_t fold_extra(const struct dlin *l)
{
	return (uint64_t)l->fr * (l->out > l->in ? l->out : l->in);
}

/* one frozen projection: its NVFP4 parts (rowwise, and columnwise through
 * the validating transpose: kept when resident, else only checked) or its
 * float weight in both orientations */
static int up_lin(struct ms_gmodel *g, const struct ms_model *m, uint32_t layer,
		  const struct lin *hl, struct dlin *dl, uint64_t *woff, uint64_t *colbytes,
		  struct ms_err *err)
{
	int rc = MS_OK;
	uint8_t *vp = NULL, *vs = NULL;
	memset(dl, 0, sizeof *dl);
	dl->out = hl->out;
	dl->in = hl->in;
	dl->nparts = hl->nparts;
	dl->lyr = layer;
	if (!hl->out)
		return MS_OK;
	if ((rc = up_f(g, hl->bias, hl->out, &dl->bias, MC_DENSE, err)))
		return rc;
	if (!hl->nparts)
		return up_w(g, hl->w, hl->out, hl->in, &dl->w, &dl->wt, err);
	dl->woff = *woff;
	*woff += (uint64_t)hl->out * hl->in;
	for (int p = 0; p < hl->nparts; p++) {
		const struct qpart *q = &hl->part[p];
		struct dpart *d = &dl->part[p];
		uint64_t ps[2], ss[2], pst[2], sst[2];
		if ((rc = ms_nvfp4_shapes(q->rows, hl->in, MS_NVFP4_LAYOUT_ROWWISE, ps, ss, err)) ||
		    (rc = ms_nvfp4_shapes(q->rows, hl->in, MS_NVFP4_LAYOUT_COLUMNWISE, pst, sst,
					  err)))
			goto out;
		d->rows = q->rows;
		d->pst = (uint32_t)pst[1];
		d->sst = (uint32_t)sst[1];
		d->rpst = (uint32_t)ps[1];
		d->rsst = (uint32_t)ss[1];
		d->tscale = q->tscale;
		d->kind = q->kind;
		DM(d->pk, ps[0] * ps[1], MC_ROW);
		DM(d->sc, ss[0] * ss[1], MC_ROW);
		CK(cudaMemcpy(d->pk, q->packed, ps[0] * ps[1], cudaMemcpyHostToDevice));
		CK(cudaMemcpy(d->sc, q->scales, ss[0] * ss[1], cudaMemcpyHostToDevice));
		*colbytes += pst[0] * pst[1] + sst[0] * sst[1];
		if (m->opts.colwise == MS_COLWISE_RESIDENT) {
			DM(d->pkt, pst[0] * pst[1], MC_COL);
			DM(d->sct, sst[0] * sst[1], MC_COL);
			vp = d->pkt;
			vs = d->sct;
		} else {
			CK(cudaMalloc(&vp, pst[0] * pst[1] + 1));
			CK(cudaMalloc(&vs, sst[0] * sst[1] + 1));
		}
		/* the library's transpose validates the 2D blocks (a 1D-block
		 * state is refused here, as on the CPU) */
		if ((rc = ms_gpu_nvfp4_transpose(MS_NVFP4_BLOCK_2D, q->rows, hl->in, d->pk, d->sc,
						 vp, vs, err)))
			goto out;
		if (m->opts.colwise != MS_COLWISE_RESIDENT) {
			cudaFree(vp);
			cudaFree(vs);
		}
		vp = vs = NULL;
	}
out:
	if (m->opts.colwise != MS_COLWISE_RESIDENT) {
		cudaFree(vp);
		cudaFree(vs);
	}
	return rc;
}

static struct dlora *dlora_of(struct ms_gmodel *g, const struct ms_model *m,
			      const struct lora *L)
{
	if (!L)
		return NULL;
	for (size_t i = 0; i < m->nloras; i++)
		if (m->loras[i] == L)
			return &g->loras[i];
	return NULL;
}

/* the layer's decode jobs: forward (rowwise -> W) and backward (columnwise
 * -> W^T), into the layer's scratch offsets */
static int build_descs(struct ms_gmodel *g, const struct ms_model *m, struct dlayer *dl,
		       struct ms_err *err)
{
	int rc = MS_OK, n = 0;
	struct dlin *ls[8 + 2 * MAXE];
	struct ddesc *hf = NULL, *hb = NULL;
	int nl = 0;
	ls[nl++] = &dl->q;
	ls[nl++] = &dl->k;
	ls[nl++] = &dl->v;
	ls[nl++] = &dl->o;
	if (dl->moe && !g->fused)
		for (uint32_t e = 0; e < g->E; e++) {
			ls[nl++] = &dl->egu[e];
			ls[nl++] = &dl->edn[e];
		}
	if (dl->sh) {
		ls[nl++] = &dl->sgu;
		ls[nl++] = &dl->sdn;
	}
	for (int i = 0; i < nl; i++)
		n += ls[i]->nparts;
	hf = (struct ddesc *)calloc(n + 1, sizeof *hf);
	hb = (struct ddesc *)calloc(n + 1, sizeof *hb);
	if (!hf || !hb) {
		rc = ms_err_nomem(err);
		goto out;
	}
	{
		const struct dlin *q = &dl->q, *k = &dl->k, *v = &dl->v;
		/* (the float32 test mode keeps three GEMMs: no bf16 operand
		 * scratch, and model.c's sums) */
		dl->qkv3 = !g->f32 && q->nparts && k->nparts && v->nparts && q->fr == dl->afr &&
			   k->fr == dl->afr && v->fr == dl->afr &&
			   k->in == q->in && v->in == q->in &&
			   k->woff == q->woff + (uint64_t)q->out * q->in + fold_extra(q) &&
			   v->woff == k->woff + (uint64_t)k->out * k->in + fold_extra(k);
		/* (afr is set only where this holds) */
		if (dl->afr && !dl->qkv3) {
			rc = ms_err_set(err, MS_EINVAL, "the q/k/v LoRA fold without qkv3");
			goto out;
		}
	}
	n = 0;
	for (int i = 0; i < nl; i++) {
		struct dlin *l = ls[i];
		uint64_t ro = 0;
		/* qkv3: q, k, v's W^T side by side (ls[0..2]) */
		uint64_t cw = 0, c0 = 0;
		if (dl->qkv3 && i < 3) {
			cw = dl->q.out + dl->k.out + dl->v.out + dl->afr;
			c0 = i == 0 ? 0 : i == 1 ? dl->q.out : dl->q.out + dl->k.out;
		}
		for (int p = 0; p < l->nparts; p++) {
			struct dpart *d = &l->part[p];
			struct ddesc *f = &hf[n], *b = &hb[n];
			f->pk = d->pk;
			f->sc = d->sc;
			f->out = OFF(wbase(g, (uint32_t)(dl - g->ly), 0),
				     l->woff + ro * (l->in + l->fr));
			f->rows = (uint32_t)d->rows;
			f->cols = l->in;
			f->ld = l->in + l->fr;
			f->pst = d->rpst;
			f->sst = d->rsst;
			f->tscale = d->tscale;
			f->kind = d->kind;
			b->pk = d->pkt;
			b->sc = d->sct;
			b->spk = d->pk;
			b->ssc = d->sc;
			b->out = OFF(wbase(g, (uint32_t)(dl - g->ly), 1),
				     cw ? dl->q.woff + c0 + ro : l->woff + ro);
			b->rows = l->in;
			b->cols = (uint32_t)d->rows;
			b->ld = cw ? (uint32_t)cw : l->out + l->fr;
			b->pst = d->pst;
			b->sst = d->sst;
			b->spst = d->rpst;
			b->ssst = d->rsst;
			b->tscale = d->tscale;
			b->kind = d->kind;
			b->cbytes = (uint64_t)l->in * (d->pst + d->sst);
			ro += d->rows;
			n++;
		}
	}
	dl->nfwd = dl->nbwd = n;
	if (n) {
		CK(cudaMalloc(&dl->fwd, n * sizeof *hf));
		CK(cudaMalloc(&dl->bwd, n * sizeof *hb));
		CK(cudaMemcpy(dl->fwd, hf, n * sizeof *hf, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dl->bwd, hb, n * sizeof *hb, cudaMemcpyHostToDevice));
	}
	dl->hbwd = hb;
	hb = NULL;
out:
	free(hf);
	free(hb);
	return rc;
}

static void gfree(struct ms_gmodel *g);

static_assert(sizeof(struct ms_ggemm_nvfp4) == MS_GMODEL_Q4_DESC,
	      "gpu_plan.c's size of an NVFP4 descriptor");

/* An expert projection's NVFP4 as the fused GEMM's B: W [out, in] from
 * the rowwise bytes (parts stacked along N), or W^T [in, out] from the
 * columnwise ones (the parts side by side along K) */
static int gg_q4(const struct dlin *l, int bwd, uint32_t N, uint32_t K,
		 struct ms_ggemm_nvfp4 *q, struct ms_err *err)
{
	memset(q, 0, sizeof *q);
	if (l->nparts < 1 || l->nparts > 2)
		return ms_err_set(err, MS_EINVAL, "--expert-gemm fused: an expert projection "
				  "of %d NVFP4 parts (1 or 2 are covered; none: not quantized)",
				  l->nparts);
	q->along_k = bwd;
	q->split = l->nparts == 2 ? (uint32_t)l->part[0].rows : bwd ? K : N;
	for (int i = 0; i < l->nparts; i++) {
		const struct dpart *d = &l->part[i];
		struct ms_ggemm_q4 *p = &q->part[i];
		p->codes = bwd ? d->pkt : d->pk;
		p->scales = bwd ? d->sct : d->sc;
		p->code_stride = bwd ? d->pst : d->rpst;
		p->scale_stride = bwd ? d->sst : d->rsst;
		p->tscale = d->tscale;
		p->divide = d->kind == MS_NVFP4_TSCALE_DIV;
	}
	return ms_ggemm_nvfp4_check(q, N, K, err);
}

/* Every MoE layer's weights for the grouped expert GEMMs, on the device:
 * pointers into the decode scratch (or at float weights), or NVFP4
 * descriptors when fused; neither moves, so they are written once here. */
static int gg_pointers(struct ms_gmodel *g, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t nmoe = 0, n, i = 0;
	size_t esz = g->fused ? sizeof(struct ms_ggemm_nvfp4) : sizeof(void *);
	char *h = NULL;
	for (uint32_t l = 0; l < g->L; l++)
		nmoe += g->ly[l].moe;
	if (!nmoe)
		return MS_OK;
	n = nmoe * 4 * g->E;
	if (!(h = (char *)calloc(n, esz)))
		return ms_err_nomem(err);
	DM(g->gbp, n * esz, MC_SCRATCH);
	for (uint32_t l = 0; l < g->L; l++) {
		struct dlayer *d = &g->ly[l];
		if (!d->moe)
			continue;
		d->gbp = (const void *const *)((char *)g->gbp + i * esz);
		d->gbq = (const struct ms_ggemm_nvfp4 *)d->gbp;
		/* the four products' B: gate/up and down forward (W [out,
		 * in]), then their input gradients (W^T [in, out]) */
		for (uint32_t w = 0; w < 4; w++)
			for (uint32_t e = 0; e < g->E; e++, i++) {
				const struct dlin *x = w % 2 ? &d->edn[e] : &d->egu[e];
				uint32_t N = w < 2 ? x->out : x->in, K = w < 2 ? x->in : x->out;
				const void *b;
				if (g->fused) {
					if ((rc = gg_q4(x, w >= 2, N, K,
							(struct ms_ggemm_nvfp4 *)h + i, err)))
						goto out;
					continue;
				}
				if ((uintptr_t)(b = lin_w(g, x, w >= 2)) % 16) {
					rc = ms_err_set(err, MS_EINVAL, "grouped expert GEMMs: an "
							"expert's weights are not 16-byte aligned");
					goto out;
				}
				((const void **)h)[i] = b;
			}
	}
	CK(cudaMemcpy(g->gbp, h, n * esz, cudaMemcpyHostToDevice));
out:
	free(h);
	return rc;
}

/* The grouped CUTLASS expert GEMM alone (t_train_gpu): Y [rows, N] = X_e
 * W_e^T over E groups of cnt [E] rows, bf16 bits in (x [rows, K], w [E, N,
 * K]), float32 out, all host arrays. MS_ENODEV on a GPU it is not for,
 * MS_EINVAL when this build or shape does not run it (ms_xgemm_ok). */
int ms_gmodel_xgemm_check(const uint16_t *x, const uint16_t *w, const uint32_t *cnt, uint32_t E,
			  uint32_t N, uint32_t K, float *y, uint16_t *yb, struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t off[MAXE + 1];
	void *dx = NULL, *dw = NULL, *sc = NULL;
	float *dy = NULL;
	uint32_t *doff = NULL;
	if (!ms_xgemm_device_ok())
		return ms_err_set(err, MS_ENODEV, "grouped CUTLASS GEMM: this GPU is not an sm_90");
	if (!E || E > MAXE || !ms_xgemm_ok(N, K))
		return ms_err_set(err, MS_EINVAL, "grouped CUTLASS GEMM: not in this build (no "
				  "CUTLASS headers at build time) or not for N %u, K %u", N, K);
	off[0] = 0;
	for (uint32_t e = 0; e < E; e++)
		off[e + 1] = off[e] + cnt[e];
	CK(cudaMalloc(&dx, (size_t)off[E] * K * 2 + 16));
	CK(cudaMalloc(&dw, (size_t)E * N * K * 2));
	CK(cudaMalloc(&dy, (size_t)off[E] * N * 4 + 16));
	CK(cudaMalloc(&doff, (E + 1) * 4));
	CK(cudaMalloc(&sc, MS_XGEMM_SCRATCH));
	CK(cudaMemcpy(dx, x, (size_t)off[E] * K * 2, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dw, w, (size_t)E * N * K * 2, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(doff, off, (E + 1) * 4, cudaMemcpyHostToDevice));
	CK(cudaMemset(dy, 0xff, (size_t)off[E] * N * 4 + 16));
	{
		struct ms_xgemm p = {E, N, K, doff, dx, dw, (uint64_t)N * K, dy, sc, 0};
		if ((rc = ms_xgemm_run(&p, 0, err)))
			goto out;
	}
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(y, dy, (size_t)off[E] * N * 4, cudaMemcpyDeviceToHost));
	if (yb) {
		/* the bf16 output's instantiation, over NaN bits again */
		struct ms_xgemm p = {E, N, K, doff, dx, dw, (uint64_t)N * K, dy, sc, 1};
		CK(cudaMemset(dy, 0xff, (size_t)off[E] * N * 4 + 16));
		if ((rc = ms_xgemm_run(&p, 0, err)))
			goto out;
		CK(cudaDeviceSynchronize());
		CK(cudaMemcpy(yb, dy, (size_t)off[E] * N * 2, cudaMemcpyDeviceToHost));
	}
out:
	cudaFree(dx);
	cudaFree(dw);
	cudaFree(dy);
	cudaFree(doff);
	cudaFree(sc);
	return rc;
}

/* The q/k norm + RoPE of the bf16 path alone (t_train_gpu): x [rows, n]
 * float normed and rotated into y [rows, n] bf16 bits and rstd [rows] as
 * the cuDNN forward calls it, then dy [rows, n] bf16 through the backward
 * into dx [tokens, ldo] bf16 bits at column c0 (head h of token t at t ldo
 * + c0 + h n, the input-gradient GEMM's operand; the rest of dx comes back
 * as it was given), with the forward's rstd; cs / sn [S, half]. The same
 * dispatch as the step: the float kernels where their shapes and alignment
 * allow (*fast: 1 the forward's ran, 2 the backward's), the double ones
 * otherwise. */
int ms_gmodel_norm_rope_check(const float *x, const float *w, const float *cs, const float *sn,
			      uint32_t rows, uint32_t n, uint32_t nhead, uint32_t half, uint32_t S,
			      float eps, const uint16_t *dy, uint32_t ldo, uint32_t c0, uint16_t *y,
			      float *rstd, uint16_t *dx, int *fast, struct ms_err *err)
{
	int rc = MS_OK;
	float *dxf = NULL, *dw = NULL, *dcs = NULL, *dsn = NULL, *drs = NULL;
	__nv_bfloat16 *dyv = NULL, *ddy = NULL, *ddx = NULL;
	uint64_t tok = nhead ? rows / nhead : 0, nd = tok * ldo;
	if (!rows || !n || n > NR_MAXN || !nhead || rows % nhead || 2 * half > n || !S ||
	    c0 + (uint64_t)nhead * n > ldo)
		return ms_err_set(err, MS_EINVAL, "norm + RoPE check: %u rows of %u, %u heads, "
				  "half %u, dx %u wide from %u", rows, n, nhead, half, ldo, c0);
	CK(cudaMalloc(&dxf, (size_t)rows * n * 4));
	CK(cudaMalloc(&dw, (size_t)n * 4));
	CK(cudaMalloc(&dcs, (size_t)S * half * 4 + 4));
	CK(cudaMalloc(&dsn, (size_t)S * half * 4 + 4));
	CK(cudaMalloc(&drs, (size_t)rows * 4));
	CK(cudaMalloc(&dyv, (size_t)rows * n * 2));
	CK(cudaMalloc(&ddy, (size_t)rows * n * 2));
	CK(cudaMalloc(&ddx, (size_t)nd * 2));
	CK(cudaMemcpy(dxf, x, (size_t)rows * n * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dw, w, (size_t)n * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dcs, cs, (size_t)S * half * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dsn, sn, (size_t)S * half * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(ddy, dy, (size_t)rows * n * 2, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(ddx, dx, (size_t)nd * 2, cudaMemcpyHostToDevice));
	*fast = norm_rope<__nv_bfloat16>(0, dxf, dw, dyv, drs, rows, n, nhead, half, S, dcs, dsn,
					 eps);
	CK(cudaGetLastError());
	*fast |= 2 * rope_norm_bwd<__nv_bfloat16, __nv_bfloat16>(0, ddy, dxf, dw, drs, ddx, rows,
								 n, nhead, half, S, dcs, dsn,
								 ldo, c0);
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
	CK(cudaMemcpy(y, dyv, (size_t)rows * n * 2, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(rstd, drs, (size_t)rows * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(dx, ddx, (size_t)nd * 2, cudaMemcpyDeviceToHost));
out:
	cudaFree(dxf);
	cudaFree(dw);
	cudaFree(dcs);
	cudaFree(dsn);
	cudaFree(drs);
	cudaFree(dyv);
	cudaFree(ddy);
	cudaFree(ddx);
	return rc;
}

/* The expert sort alone (t_train_gpu's check of its stability): n
 * selections sel [n] (host) of E experts to perm [n], pos [n] and cnt [E]
 * (host) as the routing computes them. */
int ms_gmodel_sort_check(const int32_t *sel, uint32_t n, uint32_t E, int32_t *perm, int32_t *pos,
			 uint32_t *cnt, struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t nc = sort_chunks(n);
	int32_t *ds = NULL, *dp = NULL, *dq = NULL;
	uint32_t *dh = NULL, *dc = NULL, *doff = NULL;
	if (!n || !E || E > MAXE)
		return ms_err_set(err, MS_EINVAL, "sort check: %u selections of %u experts", n, E);
	CK(cudaMalloc(&ds, (size_t)n * 4));
	CK(cudaMalloc(&dp, (size_t)n * 4));
	CK(cudaMalloc(&dq, (size_t)n * 4));
	CK(cudaMalloc(&dh, (size_t)E * nc * 4));
	CK(cudaMalloc(&dc, (size_t)E * 4));
	CK(cudaMalloc(&doff, 2 * ((size_t)E + 1) * 4));
	CK(cudaMemcpy(ds, sel, (size_t)n * 4, cudaMemcpyHostToDevice));
	k_hist<<<nc, SCH, E * 4>>>(ds, n, E, nc, dh);
	CK(cudaGetLastError());
	k_hscan<<<E, NTH>>>(dh, nc, dc);
	CK(cudaGetLastError());
	if ((rc = ms_ggemm_index(dc, E, doff, doff + E + 1, 0, err)))
		goto out;
	k_scatter<<<nc, SCH, SCH / 32 * E * 4>>>(ds, n, E, nc, dh, doff, dp, dq);
	CK(cudaGetLastError());
	CK(cudaMemcpy(perm, dp, (size_t)n * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(pos, dq, (size_t)n * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(cnt, dc, (size_t)E * 4, cudaMemcpyDeviceToHost));
out:
	cudaFree(ds);
	cudaFree(dp);
	cudaFree(dq);
	cudaFree(dh);
	cudaFree(dc);
	cudaFree(doff);
	return rc;
}

static int col_chunks(struct ms_gmodel *g, struct dlayer *d, struct ms_err *err);

int ms_gmodel_build(struct ms_model *m, struct ms_err *err)
{
	const struct ms_model_cfg *c = &m->cfg;
	struct ms_gmodel *g = NULL;
	int rc;
	uint64_t wmax = 0, colmax = 0, partmax = 0;

	if ((rc = ms_gpu_ready(err)))
		return rc;
	if (c->n_experts > MAXE || (c->router == MS_ROUTER_SIGMOID && c->n_group > 64))
		return ms_err_set(err, MS_EINVAL,
				  "--device cuda: at most %d experts and 64 groups", MAXE);
	if (!(g = (struct ms_gmodel *)calloc(1, sizeof *g)))
		return ms_err_nomem(err);
	g->f32 = m->opts.gpu_f32;
	/* a diagnostic: the profile's time by launch site too (mstrain(1)) */
	g->sites = getenv("MS_PROFILE_SITES") && *getenv("MS_PROFILE_SITES") &&
		   strcmp(getenv("MS_PROFILE_SITES"), "0") != 0;
	if (getenv("MS_PROFILE_TIMELINE") && *getenv("MS_PROFILE_TIMELINE") &&
	    !(g->timeline = strdup(getenv("MS_PROFILE_TIMELINE")))) {
		free(g);
		return ms_err_nomem(err);
	}
	g->grouped = m->opts.expert_gemm != MS_EXPERT_GEMM_PER_EXPERT && !g->f32;
	g->fused = m->opts.expert_gemm == MS_EXPERT_GEMM_FUSED && !g->f32;
	g->gt = g->f32 ? CUDA_R_32F : CUDA_R_16BF;
	g->esz = g->f32 ? 4 : 2;
	g->ct_base = g->f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
	g->ct_lora = g->f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F_FAST_TF32;
	g->H = c->hidden;
	g->V = c->vocab;
	g->L = c->n_layers;
	g->E = c->n_experts;
	g->K = c->top_k;
	g->F = c->moe_ffn;
	g->nh = c->n_heads;
	g->nkv = c->n_kv_heads;
	g->hd = c->head_dim;
	g->dq = g->nh * g->hd;
	g->dkv = g->nkv * g->hd;
	g->r = m->lora.r;
	g->lscale = (float)(m->lora.alpha / m->lora.r);
	g->pdrop = m->lora.dropout;
	g->seed = m->lora.seed;
	/* the bf16 per-expert path folds the expert LoRA into the frozen
	 * GEMMs (fold_tails); dropout masks the LoRA's share of dX alone, so
	 * it keeps the separate products, as does a rank the gradients'
	 * kernel does not cover (ms_ggemm_wgrad_bf16) */
	g->fold = !g->f32 && !g->grouped && g->pdrop <= 0 && g->r > 0 &&
		  g->r <= MS_GGEMM_WGRAD_BF16_MAX_R;
	if (g->grouped && (!ms_ggemm_supported(2 * g->F, g->H) || !ms_ggemm_supported(g->F, g->H))) {
		rc = ms_err_set(err, MS_EINVAL, "grouped expert GEMMs: the hidden size (%u) and "
				"the expert ffn (%u) must be multiples of 8", g->H, g->F);
		goto out;
	}
	if (g->fused && (g->H % 32 || g->F % 32 || g->H > MS_GGEMM_NVFP4_MAX_K ||
			 2 * g->F > MS_GGEMM_NVFP4_MAX_K)) {
		rc = ms_err_set(err, MS_EINVAL, "--expert-gemm fused: the hidden size (%u) and the "
				"expert ffn (%u) must be multiples of 32 (and their products' K at "
				"most %u)", g->H, g->F, MS_GGEMM_NVFP4_MAX_K);
		goto out;
	}
	if (g->fused && m->opts.colwise != MS_COLWISE_RESIDENT) {
		rc = ms_err_set(err, MS_EINVAL, "--expert-gemm fused decodes every expert's "
				"columnwise NVFP4 inside the backward's GEMMs: it needs "
				"--colwise resident");
		goto out;
	}
	/* the decode ahead (decode_unit), unless MS_DECODE_AHEAD=0: the main
	 * stream at the higher priority, so that the decode stream's blocks
	 * take what its kernels leave */
	{
		int on = 1;
		if ((rc = ms_gmodel_decode_ahead(&on, err)))
			goto out;
		g->ahead = !g->f32 && c->n_layers > 1 && on;
		/* unset: at the attention core where the columnwise copy is
		 * kept (A/B on the H200, two runs each: 99.53 / 100.00 ms
		 * queued at the pass's start, 98.48 / 99.02 at the attention
		 * core, the decode then running beside cuDNN's attention and
		 * the projections' GEMMs more than beside memory-bound
		 * kernels); on demand, at the start, the backward's decode
		 * with its transposes needing the whole pass before (queued
		 * at the attention core the main stream waited 5.5 ms a
		 * step: 107.4 ms) */
		g->dec_at = on > 1 ? on - 2
				   : m->opts.colwise == MS_COLWISE_RESIDENT ? 3 : 0;
		g->dnext = -1;
		g->dpend_l = -1;
	}
	if (g->ahead) {
		int lo = 0, hi = 0;
		CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
		CK(cudaStreamCreateWithPriority(&g->st, cudaStreamNonBlocking, hi));
		CK(cudaStreamCreateWithPriority(&g->dst, cudaStreamNonBlocking, lo));
		CK(cudaEventCreateWithFlags(&g->dev_main, cudaEventDisableTiming));
		CK(cudaEventCreateWithFlags(&g->dev_dec[0], cudaEventDisableTiming));
		CK(cudaEventCreateWithFlags(&g->dev_dec[1], cudaEventDisableTiming));
	} else {
		CK(cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking));
	}
	if ((rc = ms_gmodel_blas_load(err)))
		goto out;
	if (blas.create(&g->blas) != CUBLAS_STATUS_SUCCESS) {
		g->blas = NULL;
		rc = ms_err_set(err, MS_EIO, "cuBLAS: cublasCreate failed");
		goto out;
	}
	CB(blas.set_stream(g->blas, g->st));
	CK(cudaEventCreate(&g->st0));
	CK(cudaEventCreate(&g->st1));
	for (int i = 0; i < PSLOTS; i++)
		CK(cudaEventCreateWithFlags(&g->pev[i], cudaEventDisableTiming));
	CK(cudaEventCreateWithFlags(&g->cev, cudaEventDisableTiming));
	CK(cudaMallocHost(&g->hparr, (size_t)PSLOTS * 3 * MAXE * sizeof(void *)));
	DM(g->parr, 3 * MAXE * sizeof(void *), MC_SCRATCH);
	/* float weights */
	if ((rc = up_f(g, m->embed, (uint64_t)g->V * g->H, &g->embed, MC_DENSE, err)) ||
	    (rc = up_f(g, m->norm, g->H, &g->norm, MC_DENSE, err)) ||
	    (rc = up_w(g, m->lm_head, g->V, g->H, &g->lm, NULL, err)))
		goto out;
	/* parameters, one block each for w, g and the two moments */
	if (!(g->poff = (uint64_t *)calloc(m->nparams + 1, sizeof *g->poff))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < m->nparams; i++)
		g->poff[i + 1] = g->poff[i] + m->params[i].n;
	g->ntot = g->poff[m->nparams];
	DM(g->W, g->ntot * 4, MC_LORA);
	DM(g->G, g->ntot * 4, MC_LORA);
	DM(g->Mo, g->ntot * 4, MC_LORA);
	DM(g->Vo, g->ntot * 4, MC_LORA);
	DM(g->dnorm, (SQ_BLOCKS + 1) * 8, MC_SCRATCH);
	CK(cudaMemset(g->G, 0, g->ntot * 4));
	CK(cudaMemset(g->Mo, 0, g->ntot * 4));
	CK(cudaMemset(g->Vo, 0, g->ntot * 4));
	if (!(g->loras = (struct dlora *)calloc(m->nloras + 1, sizeof *g->loras))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	g->nloras = m->nloras;
	for (size_t i = 0; i < m->nloras; i++) {
		const struct lora *L = m->loras[i];
		struct dlora *d = &g->loras[i];
		d->r = L->r;
		d->in = L->in;
		d->out = L->out;
		d->E = L->E;
		d->id = L->id;
		d->pA = L->pA;
		d->pB = L->pB;
		d->A = g->W + g->poff[L->pA];
		d->B = g->W + g->poff[L->pB];
		d->gA = g->G + g->poff[L->pA];
		d->gB = g->G + g->poff[L->pB];
	}
	m->gpu = g;
	if ((rc = ms_gmodel_sync(m, NULL, MS_MODEL_TO_DEVICE, err)))
		goto out;
	/* layers */
	if (!(g->ly = (struct dlayer *)calloc(g->L, sizeof *g->ly))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (uint32_t l = 0; l < g->L; l++) {
		const struct layer *L = &m->layers[l];
		struct dlayer *d = &g->ly[l];
		uint64_t wo = 0, cb = 0;
		/* the q/k/v LoRA folds (afr) on the path the expert LoRA
		 * folds on, where q, k and v are all NVFP4 over one input
		 * (their input gradient then one GEMM, build_descs' qkv3) */
		const struct lora *aL[3] = {L->lq, L->lk, L->lv};
		uint32_t afr = 0;
		if (g->fold && L->q.nparts && L->k.nparts && L->v.nparts &&
		    L->k.in == L->q.in && L->v.in == L->q.in)
			for (int i = 0; i < 3; i++)
				if (aL[i]) {
					d->acol[i] = afr;
					afr += fold_width(g->r);
				}
		d->afr = afr;
		if (afr > g->afrmax)
			g->afrmax = afr;
		if ((rc = up_f(g, L->ln1, g->H, &d->ln1, MC_DENSE, err)) ||
		    (rc = up_f(g, L->ln2, g->H, &d->ln2, MC_DENSE, err)) ||
		    (rc = up_f(g, L->qn, g->hd, &d->qn, MC_DENSE, err)) ||
		    (rc = up_f(g, L->kn, g->hd, &d->kn, MC_DENSE, err)))
			goto out;
		{
			const struct lin *hl[3] = {&L->q, &L->k, &L->v};
			struct dlin *dl3[3] = {&d->q, &d->k, &d->v};
			for (int i = 0; i < 3; i++) {
				if ((rc = up_lin(g, m, l, hl[i], dl3[i], &wo, &cb, err)))
					goto out;
				dl3[i]->fr = afr;
				wo += fold_extra(dl3[i]);
			}
		}
		if ((rc = up_lin(g, m, l, &L->o, &d->o, &wo, &cb, err)))
			goto out;
		d->lq = dlora_of(g, m, L->lq);
		d->lk = dlora_of(g, m, L->lk);
		d->lv = dlora_of(g, m, L->lv);
		d->lo = dlora_of(g, m, L->lo);
		d->lgu = dlora_of(g, m, L->lgu);
		d->ldn = dlora_of(g, m, L->ldown);
		d->moe = L->moe;
		if (L->moe) {
			const struct expert *ex = m->ranks[0].ex[l];
			if ((rc = up_f(g, L->router, (uint64_t)g->E * g->H, &d->router, MC_DENSE,
				       err)) ||
			    (rc = up_f(g, L->ecb, g->E, &d->ecb, MC_DENSE, err)))
				goto out;
			d->egu = (struct dlin *)calloc(g->E, sizeof *d->egu);
			d->edn = (struct dlin *)calloc(g->E, sizeof *d->edn);
			if (!d->egu || !d->edn) {
				rc = ms_err_nomem(err);
				goto out;
			}
			/* fused: the experts decode inside their GEMMs and take
			 * no room in the decode scratch */
			uint64_t wox = 0, *wex = g->fused ? &wox : &wo;
			/* the expert LoRA folds where both products have it and
			 * every expert's weights decode (fold_tails): each
			 * decoded matrix then has fr more columns */
			uint32_t fr = g->fold && d->lgu && d->ldn ? fold_width(g->r) : 0;
			for (uint32_t e = 0; e < g->E; e++)
				if (!ex[e].gu.nparts || !ex[e].down.nparts)
					fr = 0;
			for (uint32_t e = 0; e < g->E; e++) {
				if ((rc = up_lin(g, m, l, &ex[e].gu, &d->egu[e], wex, &cb, err)))
					goto out;
				d->egu[e].fr = fr;
				*wex += fold_extra(&d->egu[e]);
				if ((rc = up_lin(g, m, l, &ex[e].down, &d->edn[e], wex, &cb, err)))
					goto out;
				d->edn[e].fr = fr;
				*wex += fold_extra(&d->edn[e]);
			}
			g->folded |= fr > 0;
		}
		if (L->sh.gu.out) {
			d->sh = 1;
			if ((rc = up_lin(g, m, l, &L->sh.gu, &d->sgu, &wo, &cb, err)) ||
			    (rc = up_lin(g, m, l, &L->sh.down, &d->sdn, &wo, &cb, err)))
				goto out;
		}
		d->wtotal = wo;
		d->colbytes = cb;
		if (wo > wmax)
			wmax = wo;
		if (cb > colmax)
			colmax = cb;
	}
	g->wmax = wmax;
	if (!wmax)
		g->ahead = 0;
	DM(g->wbuf, (g->ahead ? 2 : 1) * wmax * g->esz, MC_SCRATCH);
	if (g->afrmax)
		DM(g->aab, ((uint64_t)g->afrmax * g->H +
			    (uint64_t)(g->dq > g->dkv ? g->dq : g->dkv) * fold_width(g->r)) * 2,
		   MC_SCRATCH);
	if (g->folded) {
		uint64_t wide = g->H > 2 * g->F ? g->H : 2 * g->F;
		DM(g->fab, (uint64_t)g->E * fold_width(g->r) * wide * 2, MC_SCRATCH);
		DM(g->wpart, MS_GMODEL_WGRAD_SPLIT * (uint64_t)g->E * g->r * wide * 4, MC_SCRATCH);
	}
	for (uint32_t l = 0; l < g->L && !g->f32 && !g->grouped && g->E && !g->nlane; l++)
		if (g->ly[l].moe && (rc = lanes_init(g, err)))
			goto out;
	for (uint32_t l = 0; l < g->L; l++) {
		if ((rc = build_descs(g, m, &g->ly[l], err)))
			goto out;
		for (int i = 0; i < g->ly[l].nbwd; i++)
			if (g->ly[l].hbwd[i].cbytes > partmax)
				partmax = g->ly[l].hbwd[i].cbytes;
	}
	if (m->opts.colwise != MS_COLWISE_RESIDENT) {
		/* a quarter of the largest layer (or its largest part), 256-byte
		 * aligned pieces */
		g->colcap = colmax / 4 > partmax + 512 ? colmax / 4 : partmax + 512;
		DM(g->colbuf, g->colcap, MC_COL);
		for (uint32_t l = 0; l < g->L; l++)
			if ((rc = col_chunks(g, &g->ly[l], err)))
				goto out;
	}
	if (g->grouped && (rc = gg_pointers(g, err)))
		goto out;
	g->mem.nvfp4_colwise_peak = g->mem.nvfp4_colwise;
	/* the host copies of the NVFP4 bytes are no longer needed */
	for (uint32_t l = 0; l < g->L; l++) {
		struct layer *L = &m->layers[l];
		struct lin *ls[6] = {&L->q, &L->k, &L->v, &L->o, &L->sh.gu, &L->sh.down};
		for (int i = 0; i < 6; i++)
			for (int p = 0; p < ls[i]->nparts; p++) {
				ms_free(ls[i]->part[p].packed);
				ms_free(ls[i]->part[p].scales);
				ls[i]->part[p].packed = ls[i]->part[p].scales = NULL;
			}
		if (L->moe)
			for (uint32_t e = 0; e < g->E; e++) {
				struct expert *x = &m->ranks[0].ex[l][e];
				struct lin *xl[2] = {&x->gu, &x->down};
				for (int i = 0; i < 2; i++)
					for (int p = 0; p < xl[i]->nparts; p++) {
						ms_free(xl[i]->part[p].packed);
						ms_free(xl[i]->part[p].scales);
						xl[i]->part[p].packed = NULL;
						xl[i]->part[p].scales = NULL;
					}
			}
	}
	CK(cudaDeviceSynchronize());
out:
	if (rc) {
		m->gpu = NULL;
		gfree(g);
	}
	return rc;
}


/* ---- activations and scratch for a shape ---------------------------------------- */

static void acts_release(struct ms_gmodel *g)
{
	if (g->a) {
		for (uint32_t l = 0; l < g->L; l++) {
			struct dacts *a = &g->a[l];
			float *f[] = {a->x, a->h1, a->r1, a->q0, a->k0, a->v, a->rq, a->rk, a->q,
				      a->k, a->ctx, a->uq, a->uk, a->uv, a->uo, a->x2, a->h2,
				      a->r2, a->probs, a->wts, a->gu, a->act, a->ugu, a->udn,
				      a->ye == g->yes ? NULL : a->ye, a->sgu, a->sact};
			for (size_t i = 0; i < sizeof f / sizeof *f; i++)
				dfree(g, f[i], MC_ACTS);
			dfree(g, a->sel, MC_ACTS);
			dfree(g, a->perm, MC_ACTS);
			dfree(g, a->pos, MC_ACTS);
			dfree(g, a->lse, MC_ACTS);
			dfree(g, a->actb, MC_ACTS);
			dfree(g, a->h2b, MC_ACTS);
			dfree(g, a->goff, MC_ACTS);
			if (a->cnt)
				cudaFreeHost(a->cnt);
		}
		free(g->a);
		g->a = NULL;
	}
	float *s[] = {g->xf, g->hf, g->rf, g->logits, g->y, g->y2, g->tmp, g->dA, g->dB,
		      g->dh1, g->dx2, g->dh2, g->dctx, g->dqv, g->dkk, g->dvv, g->dq0, g->dk0,
		      g->xs, g->xsd, g->actd, g->dye, g->dact, g->dgu, g->dxs, g->dz, g->du,
		      g->dw, g->sc, g->dp, g->dctx2, g->up, g->dup, g->ud};
	for (size_t i = 0; i < sizeof s / sizeof *s; i++)
		dfree(g, s[i], MC_SCRATCH);
	dfree(g, g->lossrow, MC_SCRATCH);
	dfree(g, g->dsum, MC_SCRATCH);
	dfree(g, g->cA, MC_SCRATCH);
	dfree(g, g->cB, MC_SCRATCH);
	dfree(g, g->cC, MC_SCRATCH);
	dfree(g, g->pg, MC_SCRATCH);
	dfree(g, g->dsg, MC_SCRATCH);
	dfree(g, g->fws, MC_SCRATCH);
	dfree(g, g->sdb, MC_SCRATCH);
	dfree(g, g->dids, MC_SCRATCH);
	dfree(g, g->dmask, MC_SCRATCH);
	g->xf = g->hf = g->rf = g->logits = g->y = g->y2 = g->tmp = g->dA = g->dB = NULL;
	g->dh1 = g->dx2 = g->dh2 = g->dctx = g->dqv = g->dkk = g->dvv = g->dq0 = NULL;
	g->dk0 = g->xs = g->xsd = g->actd = g->dye = g->dact = g->dgu = g->dxs = NULL;
	g->dz = g->du = g->dw = g->sc = g->dp = g->dctx2 = g->up = g->dup = g->ud = NULL;
	dfree(g, g->dpad, MC_SCRATCH);
	g->dpad = NULL;
	dfree(g, g->yes, MC_SCRATCH);
	g->yes = NULL;
	g->lossrow = g->dsum = NULL;
	g->cA = g->cB = g->cC = g->pg = g->dsg = g->fws = g->sdb = NULL;
	g->sd = NULL;
	g->cudnn = 0;
	g->dids = NULL;
	g->dmask = NULL;
	free(g->hlog);
	g->hlog = NULL;
	free(g->hloss);
	g->hloss = NULL;
	g->T = 0;
}

static uint64_t u64max(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* g->sd and g->cudnn for shape fs: a kept plan of that shape, else a new
 * one (kept, the oldest of SD_CACHE dropped). Where cuDNN is not tried or
 * cannot serve the shape, --attention auto goes on without it (the reason
 * kept for the profile) and --attention cudnn fails. */
static int attention_plan(struct ms_gmodel *g, const struct ms_flash_shape *fs, int attn,
			  int tried, struct ms_err *err)
{
	struct ms_err e = {0};
	int rc;
	g->sd = NULL;
	g->cudnn = 0;
	g->att_why[0] = 0;
	if (!tried) {
		if (attn == MS_ATTENTION_CUDNN && fs->S > 1)
			return g->f32 ? ms_err_set(err, MS_EINVAL, "--attention cudnn: the float32 "
						   "path keeps its exact attention")
				      : ms_err_set(err, MS_EINVAL, "--attention cudnn: head dim %u (cuDNN's "
						   "attention takes multiples of 8 up to 256)", g->hd);
		return MS_OK;
	}
	for (uint32_t i = 0; i < SD_CACHE; i++)
		if (g->sdc[i] && !memcmp(&g->sdk[i], fs, sizeof *fs)) {
			g->sd = g->sdc[i];
			g->cudnn = 1;
			return MS_OK;
		}
	if ((rc = ms_sdpa_new(fs, &g->sd, &e))) {
		if (attn == MS_ATTENTION_CUDNN)
			return ms_err_set(err, rc, "--attention cudnn: %s", e.msg);
		snprintf(g->att_why, sizeof g->att_why, "%.200s", e.msg);
		return MS_OK;
	}
	uint32_t at = g->sdn++ % SD_CACHE;
	ms_sdpa_free(g->sdc[at]);
	g->sdc[at] = g->sd;
	g->sdk[at] = *fs;
	g->cudnn = 1;
	return MS_OK;
}

static int acts_alloc(struct ms_gmodel *g, const struct ms_model *m, uint32_t B, uint32_t S,
		      struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t T = (uint64_t)B * S, H = g->H, TK = 0, F = g->F, Fs = 0, r = g->r;
	uint64_t att = (uint64_t)g->nh * S * S, wide, rows;
	int anymoe = 0;
	struct ms_flash_shape fs = {B, S, g->nh, g->nkv, g->hd};
	int attn = m->opts.attention;
	/* the float32 test mode keeps the exact GEMM + softmax path; the bf16
	 * one tries cuDNN's attention (model.h), then the flash kernels */
	int tried = ms_gmodel_sdpa_tried(g->f32, attn, g->hd, S);
	int flash_k = !g->f32 && attn != MS_ATTENTION_CUDNN && ms_flash_supported(g->hd);
	uint64_t fws = flash_k ? ms_flash_workspace_bytes(&fs) : 0;
	if (g->a && g->B == B && g->S == S)
		return MS_OK;
	acts_release(g);
	if ((rc = attention_plan(g, &fs, attn, tried, err)))
		goto out;
	g->flash = g->cudnn || flash_k;
	if (tried)
		fws = u64max(fws, u64max(ms_gmodel_sdpa_ws(B, g->nh, S),
					 ms_sdpa_workspace_bytes(g->sd)));
	for (uint32_t l = 0; l < g->L; l++) {
		anymoe |= g->ly[l].moe;
		if (g->ly[l].sh)
			Fs = u64max(Fs, g->ly[l].sgu.out / 2);
	}
	if (anymoe)
		TK = T * g->K;
	/* expert-row buffers hold BUCKET rows of slack (bucket()) */
	rows = u64max(TK, T) + (anymoe ? BUCKET : 0);
	/* the widest row any scratch holds */
	wide = u64max(u64max(H, g->dq), u64max(u64max(2 * F, 2 * Fs), g->dkv));
	if (!(g->a = (struct dacts *)calloc(g->L, sizeof *g->a))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (g->folded && TK)
		DM(g->yes, (TK + BUCKET) * H * 2, MC_SCRATCH);
	for (uint32_t l = 0; l < g->L; l++) {
		struct dacts *a = &g->a[l];
		struct dlayer *d = &g->ly[l];
		DM(a->x, T * H * 4, MC_ACTS);
		DM(a->h1, T * H * 4, MC_ACTS);
		DM(a->r1, T * 4, MC_ACTS);
		DM(a->q0, T * g->dq * 4, MC_ACTS);
		DM(a->k0, T * g->dkv * 4, MC_ACTS);
		DM(a->v, T * g->dkv * 4, MC_ACTS);
		if (d->qn) {
			DM(a->rq, T * g->nh * 4, MC_ACTS);
			DM(a->rk, T * g->nkv * 4, MC_ACTS);
		}
		DM(a->q, T * g->dq * 4, MC_ACTS);
		DM(a->k, T * g->dkv * 4, MC_ACTS);
		DM(a->ctx, T * g->dq * 4, MC_ACTS);
		if (g->flash || tried)
			DM(a->lse, T * g->nh * 4, MC_ACTS);
		if (d->lq)
			DM(a->uq, T * r * 4, MC_ACTS);
		if (d->lk)
			DM(a->uk, T * r * 4, MC_ACTS);
		if (d->lv)
			DM(a->uv, T * r * 4, MC_ACTS);
		if (d->lo)
			DM(a->uo, T * r * 4, MC_ACTS);
		DM(a->x2, T * H * 4, MC_ACTS);
		DM(a->h2, T * H * 4, MC_ACTS);
		DM(a->r2, T * 4, MC_ACTS);
		if (d->moe) {
			DM(a->probs, T * g->E * 4, MC_ACTS);
			DM(a->sel, TK * 4, MC_ACTS);
			DM(a->wts, TK * 4, MC_ACTS);
			DM(a->perm, TK * 4, MC_ACTS);
			DM(a->pos, TK * 4, MC_ACTS);
			/* a folded layer's expert GEMMs write bf16 (gate/up here,
			 * the experts' outputs ye; the backward's dact and dxs
			 * in their float32-sized scratch): half the bytes
			 * through SwiGLU, the combine, the router's gradient
			 * and the unpermute, which those passes are bound by */
			uint64_t eb = g->E && d->egu[0].fr ? 2 : 4;
			DM(a->gu, (TK + BUCKET) * 2 * F * eb, MC_ACTS);
			/* the folded LoRA's layers keep it in bf16 (actb), as
			 * the down GEMM's twin operand itself: U's fr columns
			 * after each row's F */
			if (g->E && d->egu[0].fr) {
				DM(a->actb, (TK + BUCKET) * (F + d->egu[0].fr) * 2, MC_ACTS);
				DM(a->h2b, T * H * 2, MC_ACTS);
			} else
				DM(a->act, (TK + BUCKET) * F * 4, MC_ACTS);
			if (d->lgu)
				DM(a->ugu, TK * r * 4, MC_ACTS);
			if (d->ldn)
				DM(a->udn, TK * r * 4, MC_ACTS);
			if (g->E && d->egu[0].fr)
				a->ye = (float *)g->yes;
			else
				DM(a->ye, (TK + BUCKET) * H * eb, MC_ACTS);
			if (g->grouped)
				DM(a->goff, 2 * ((uint64_t)g->E + 1) * 4, MC_ACTS);
			/* pinned: the grouped path copies the counts while
			 * the GPU goes on (cudaEventSynchronize on cev) */
			CK(cudaMallocHost(&a->cnt, ((size_t)g->E + 1) * sizeof *a->cnt));
		}
		if (d->sh) {
			DM(a->sgu, T * d->sgu.out * 4, MC_ACTS);
			DM(a->sact, T * (d->sgu.out / 2) * 4, MC_ACTS);
		}
	}
	DM(g->xf, T * H * 4, MC_ACTS);
	DM(g->hf, T * H * 4, MC_ACTS);
	DM(g->rf, T * 4, MC_ACTS);
	DM(g->logits, T * g->V * 4, MC_ACTS);
	DM(g->y, T * H * 4, MC_SCRATCH);
	DM(g->y2, T * H * 4, MC_SCRATCH);
	DM(g->dA, T * H * 4, MC_SCRATCH);
	DM(g->dB, T * H * 4, MC_SCRATCH);
	DM(g->dh1, T * H * 4, MC_SCRATCH);
	DM(g->dx2, T * H * 4, MC_SCRATCH);
	DM(g->dh2, T * H * 4, MC_SCRATCH);
	DM(g->dctx, T * g->dq * 4, MC_SCRATCH);
	DM(g->dqv, T * g->dq * 4, MC_SCRATCH);
	DM(g->dq0, T * g->dq * 4, MC_SCRATCH);
	DM(g->dkk, T * g->dkv * 4, MC_SCRATCH);
	DM(g->dvv, T * g->dkv * 4, MC_SCRATCH);
	DM(g->dk0, T * g->dkv * 4, MC_SCRATCH);
	DM(g->tmp, rows * wide * 4, MC_SCRATCH);
	DM(g->du, rows * r * 4, MC_SCRATCH);
	g->tmp_n = rows * wide;
	g->du_n = rows * r;
	if (g->pdrop > 0) {
		DM(g->xsd, rows * wide * 4, MC_SCRATCH);
		DM(g->actd, rows * u64max(F, Fs) * 4, MC_SCRATCH);
	}
	if (TK) {
		DM(g->xs, (TK + BUCKET) * H * 4, MC_SCRATCH);
		DM(g->dye, (TK + BUCKET) * H * 4, MC_SCRATCH);
		DM(g->dxs, (TK + BUCKET) * H * 4, MC_SCRATCH);
		DM(g->dz, T * g->E * 4, MC_SCRATCH);
		DM(g->dw, TK * 4, MC_SCRATCH);
		DM(g->dsum, (g->E + 1) * 8 + (uint64_t)g->E * sort_chunks(TK) * 4, MC_SCRATCH);
	}
	DM(g->dact, rows * u64max(F, Fs) * 4, MC_SCRATCH);
	DM(g->dgu, rows * 2 * u64max(F, Fs) * 4, MC_SCRATCH);
	g->dgu_n = rows * 2 * u64max(F, Fs);
	if (!g->flash)
		DM(g->dctx2, (uint64_t)S * g->dq * 4, MC_SCRATCH);
	if (TK) {
		DM(g->up, (TK + (uint64_t)g->E * BUCKET) * r * 4, MC_SCRATCH);
		DM(g->dup, (TK + (uint64_t)g->E * BUCKET) * r * 4, MC_SCRATCH);
		DM(g->dpad, 4 * (uint64_t)g->E * 4, MC_SCRATCH);
		if (g->folded)
			DM(g->ud, T * g->E * fold_width(g->r) * 4, MC_SCRATCH);
	}
	if (fws)
		DM(g->fws, fws, MC_SCRATCH);
	if (tried)
		DM(g->sdb, T * (2 * g->dq + 2 * g->dkv) * 2, MC_SCRATCH);
	if (!g->flash) {
		DM(g->sc, att * 4, MC_SCRATCH);
		DM(g->dp, att * 4, MC_SCRATCH);
		DM(g->pg, att * g->esz, MC_SCRATCH);
		DM(g->dsg, att * g->esz, MC_SCRATCH);
	}
	if (!g->f32) {
		/* folded expert LoRA: the expert rows' twins are fold_width(r)
		 * wider */
		DM(g->cA, u64max(u64max(rows * (wide + (g->folded ? fold_width(g->r) : 0)), T * g->V),
				 g->afrmax ? T * (u64max(H, g->dq + 2 * g->dkv) + g->afrmax) : 0) *
				  g->esz,
		   MC_SCRATCH);
		DM(g->cB, T * u64max(g->dq, g->dkv) * g->esz, MC_SCRATCH);
		DM(g->cC, T * u64max(g->dq, g->dkv) * g->esz, MC_SCRATCH);
	}
	/* the expert-row inputs the bucketed reductions read past their rows
	 * (lora_bwd_experts) start as zeros: their slack is never written */
	if (TK) {
		CK(cudaMemset(g->xs, 0, (TK + BUCKET) * H * 4));
		CK(cudaMemset(g->dye, 0, (TK + BUCKET) * H * 4));
		for (uint32_t l = 0; l < g->L; l++)
			if (g->a[l].act)
				CK(cudaMemset(g->a[l].act, 0, (TK + BUCKET) * F * 4));
	}
	CK(cudaMemset(g->dgu, 0, rows * 2 * u64max(F, Fs) * 4));
	if (g->xsd) {
		CK(cudaMemset(g->xsd, 0, rows * wide * 4));
		CK(cudaMemset(g->actd, 0, rows * u64max(F, Fs) * 4));
	}
	DM(g->lossrow, T * 8, MC_SCRATCH);
	if (!(g->hloss = (double *)malloc(T * 8))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	DM(g->dids, T * 4, MC_SCRATCH);
	DM(g->dmask, T + 1, MC_SCRATCH);
	/* the zeroing above ran on the legacy stream, which the step's
	 * non-blocking stream does not follow: done before any step */
	CK(cudaDeviceSynchronize());
	g->B = B;
	g->S = S;
	g->T = (uint32_t)T;
out:
	if (rc)
		acts_release(g);
	return rc;
}

/* ---- forward --------------------------------------------------------------------- */

static struct rcfg rcfg_of(const struct ms_model *m)
{
	struct rcfg r;
	r.E = m->cfg.n_experts;
	r.K = m->cfg.top_k;
	r.G = m->cfg.n_group ? m->cfg.n_group : 1;
	r.topk_group = m->cfg.topk_group;
	r.sigmoid = m->cfg.router == MS_ROUTER_SIGMOID;
	r.norm = m->cfg.norm_topk_prob;
	r.rsf = (float)m->cfg.routed_scaling_factor;
	return r;
}

/* On demand: layer d's backward parts cut into chunks whose columnwise
 * bytes fit colbuf together (256-byte aligned pieces), each part's
 * descriptor pointed at its place there, once: the step then transposes
 * and decodes chunk after chunk with no descriptor upload and no wait for
 * one (rewritten and uploaded each time, a chunk cost a host
 * synchronisation: 80 a step at the bench shape) */
static int col_chunks(struct ms_gmodel *g, struct dlayer *d, struct ms_err *err)
{
	int rc = MS_OK;
	d->nchunk = 0;
	if (!d->nbwd)
		return MS_OK;
	if (!(d->cend = (int *)malloc((size_t)d->nbwd * sizeof *d->cend)))
		return ms_err_nomem(err);
	for (int i0 = 0; i0 < d->nbwd;) {
		uint64_t used = 0;
		int i1 = i0;
		while (i1 < d->nbwd) {
			struct ddesc *b = &d->hbwd[i1];
			uint64_t ps = (uint64_t)b->rows * b->pst, ss = (uint64_t)b->rows * b->sst;
			uint64_t need = ((ps + 255) & ~255ull) + ((ss + 255) & ~255ull);
			if (used + need > g->colcap && i1 > i0)
				break;
			b->pk = g->colbuf + used;
			b->sc = g->colbuf + used + ((ps + 255) & ~255ull);
			used += need;
			i1++;
		}
		d->cend[d->nchunk++] = i1;
		i0 = i1;
	}
	CK(cudaMemcpy(d->bwd, d->hbwd, (size_t)d->nbwd * sizeof *d->hbwd,
		      cudaMemcpyHostToDevice));
out:
	return rc;
}

/* decode a layer's projections: forward W from the rowwise bytes; backward
 * W^T from the columnwise bytes (on demand: transposed a chunk of parts at a
 * time into colbuf first) */
static int decode_parts(struct ms_gmodel *g, struct dlayer *d, int bwd, struct ms_err *err)
{
	int rc = MS_OK;
	if (!d->nfwd)
		return MS_OK;
	if (!bwd) {
		ph(g, PH_DECODE_ROW);
		return dec_launch(g, d->fwd, d->nfwd, err);
	}
	if (!g->colbuf) {
		ph(g, PH_DECODE_COL);
		return dec_launch(g, d->bwd, d->nbwd, err);
	}
	/* on demand: each chunk of parts (col_chunks: their descriptors point
	 * into colbuf) transposed, then decoded; the stream orders the next
	 * chunk's transpose after this one's decode */
	for (int c = 0, i0 = 0; c < d->nchunk; c++) {
		int i1 = d->cend[c];
		ph(g, PH_TRANSPOSE);
		k_transpose<<<dim3(TT_BLOCKS, i1 - i0), NTH, 0, g->st>>>(d->bwd + i0, i1 - i0);
		LK();
		ph(g, PH_DECODE_COL);
		if ((rc = dec_launch(g, d->bwd + i0, i1 - i0, err)))
			return rc;
		i0 = i1;
	}
out:
	return rc;
}

static int fold_tails(struct ms_gmodel *g, const struct dlayer *d, int bwd,
		      struct ms_err *err);

/* a layer's frozen weights for its forward (bwd 0) or backward, with the
 * folded expert LoRA's factors */
static int decode_layer(struct ms_gmodel *g, struct dlayer *d, int bwd, struct ms_err *err)
{
	int rc = decode_parts(g, d, bwd, err);
	return rc ? rc : fold_tails(g, d, bwd, err);
}

/* queue pass (l, bwd)'s decode on the decode stream, after what the main
 * stream holds now, and mark its end (dev_dec of its scratch). Its phases
 * go to the profile's marks of that stream (side). */
static int dec_issue(struct ms_gmodel *g, uint32_t l, int bwd, struct ms_err *err)
{
	int rc = MS_OK;
	cudaStream_t ms = g->st;
	CK(cudaEventRecord(g->dev_main, g->st));
	CK(cudaStreamWaitEvent(g->dst, g->dev_main, 0));
	g->st = g->dst;
	g->side = 1;
	rc = decode_layer(g, &g->ly[l], bwd, err);
	if (!rc)
		mark(g, -1, -1);
	g->st = ms;
	g->side = 0;
	if (rc)
		return rc;
	CK(cudaEventRecord(g->dev_dec[(l + (uint32_t)bwd) & 1], g->dst));
out:
	return rc;
}

/* the next pass's decode that decode_unit left to be queued later (at
 * the attention core, dec_at), queued now; nothing where none waits */
static int dec_kick(struct ms_gmodel *g, struct ms_err *err)
{
	int l = g->dpend_l;
	if (l < 0)
		return MS_OK;
	g->dpend_l = -1;
	return dec_issue(g, (uint32_t)l, g->dpend_b, err);
}

/* Layer l's weights for its forward pass (bwd 0) or backward. With the
 * decode ahead, the pass after this one is queued on the decode stream
 * now (or at this pass's attention core, dec_at: dec_kick), behind the
 * main stream's work so far (the pass before this one, the last to read
 * the scratch it writes), and runs while this pass does; the main stream
 * waits for this pass's own. */
static int decode_unit(struct ms_gmodel *g, uint32_t l, int bwd, struct ms_err *err)
{
	int rc = MS_OK, u = bwd ? (int)(2 * g->L - 1 - l) : (int)l, nb = 1;
	uint32_t nl;
	if (!g->ahead)
		return decode_layer(g, &g->ly[l], bwd, err);
	/* one the pass before left unqueued (no attention core ran) */
	if ((rc = dec_kick(g, err)))
		return rc;
	if (g->dnext != u && (rc = dec_issue(g, l, bwd, err)))
		return rc;
	g->dnext = -1;
	if (!bwd && l + 1 < g->L)
		nl = l + 1, nb = 0;
	else if (!bwd && g->train)
		nl = l;
	else if (bwd && l > 0)
		nl = l - 1;
	else
		nb = -1;
	if (nb >= 0) {
		g->dnext = u + 1;
		if (g->dec_at & (bwd ? 2 : 1))
			g->dpend_l = (int)nl, g->dpend_b = nb;
		else if ((rc = dec_issue(g, nl, nb, err)))
			return rc;
	}
	ph(g, PH_WAIT_DEC);
	CK(cudaStreamWaitEvent(g->st, g->dev_dec[(l + (uint32_t)bwd) & 1], 0));
out:
	return rc;
}

/* Row-major batched GEMM over explicit operand pointers (one per item of
 * the batch, staged to the device through ggemm's ring): C_i = alpha op(A_i)
 * op(B_i) + beta C_i, uniform shapes; float32 output. */
static int gemm_ptrs(struct ms_gmodel *g, int ta, int tb, uint32_t M, uint32_t N, uint32_t K,
		     float alpha, const void **A, uint32_t lda, const void **B, uint32_t ldb,
		     float beta, void **C, uint32_t ldc, int batch, cudaDataType_t ty,
		     struct ms_err *err)
{
	int rc = MS_OK;
	void **h = g->hparr + (size_t)g->pslot * 3 * MAXE;
	if (batch > (int)MAXE)
		return ms_err_set(err, MS_EINVAL, "attention: more than %u heads", MAXE);
	CK(cudaEventSynchronize(g->pev[g->pslot]));
	memcpy(h, B, batch * sizeof(void *));
	memcpy(h + MAXE, A, batch * sizeof(void *));
	memcpy(h + 2 * MAXE, C, batch * sizeof(void *));
	CK(cudaMemcpyAsync(g->parr, h, 3 * MAXE * sizeof(void *), cudaMemcpyHostToDevice, g->st));
	CK(cudaEventRecord(g->pev[g->pslot], g->st));
	g->pslot = (g->pslot + 1) % PSLOTS;
	CB(blas.gemm_batched(g->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
			       (int)N, (int)M, (int)K, &alpha, (const void *const *)g->parr, ty,
			       (int)ldb, (const void *const *)(g->parr + MAXE), ty, (int)lda, &beta,
			       g->parr + 2 * MAXE, CUDA_R_32F, (int)ldc, batch, g->ct_base,
			       CUBLAS_GEMM_DEFAULT));
	site(g, SK_GEMM_BATCHED);
out:
	return rc;
}

/* dst[t, g*hd + x] = sum over the group's heads r0 of src[t, (g*rep + r0)*hd + x]
 * (GQA: a KV head's gradient from its query heads, summed in head order) */
__global__ void k_group_sum(const float *src, float *dst, uint32_t S, uint32_t nkv,
			    uint32_t rep, uint32_t hd)
{
	uint64_t n = (uint64_t)S * nkv * hd;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t t = i / ((uint64_t)nkv * hd);
		uint32_t gx = (uint32_t)(i % ((uint64_t)nkv * hd)), gi = gx / hd, x = gx % hd;
		const float *r = src + t * (uint64_t)nkv * rep * hd + (uint64_t)gi * rep * hd + x;
		float s = 0;
		for (uint32_t q = 0; q < rep; q++)
			s += r[(uint64_t)q * hd];
		dst[i] = s;
	}
}

/* attention core, forward (ctx) or backward (dqv, dkk, dvv from dctx).
 * Flash (bf16, a head dim flash.h covers): the fused kernels, the layer's
 * LSE kept between the two. Otherwise per sequence, one batched GEMM over
 * the heads for each product (query head h reads KV head h / rep), the
 * softmax kernels between */
/* One batched GEMM over the heads: C_h = op(A_h) op(B_h) for h < nh, A_h at
 * A + h * as and B_h at B + (h / bdiv) * bs (elements of the GEMM type;
 * bdiv the GQA group, where query heads share a KV head, else 1), C_h at
 * C + h * cs (floats) */
static int heads_gemm(struct ms_gmodel *g, int ta, int tb, uint32_t M, uint32_t N, uint32_t K,
		      const void *A, uint64_t as, uint32_t lda, const void *B, uint64_t bs,
		      uint32_t bdiv, uint32_t ldb, float *C, uint64_t cs, uint32_t ldc,
		      struct ms_err *err)
{
	const void *pa[MAXE], *pb[MAXE];
	void *pc[MAXE];
	for (uint32_t h = 0; h < g->nh; h++) {
		pa[h] = OFF(A, h * as);
		pb[h] = OFF(B, (h / bdiv) * bs);
		pc[h] = C + h * cs;
	}
	return gemm_ptrs(g, ta, tb, M, N, K, 1.0f, pa, lda, pb, ldb, 0.0f, pc, ldc, (int)g->nh,
			 g->gt, err);
}

/* bf16 -> float, n elements (cuDNN's outputs into the trainer's float
 * activations and gradients; exact) */
__global__ void k_widen(const __nv_bfloat16 *x, float *y, uint64_t n)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		y[i] = __bfloat162float(x[i]);
}

/*
 * cuDNN's attention keeps its operands as the activations, in bf16: a->q's
 * floats hold Q then O, a->k's K then V (each buffer twice their bf16
 * bytes, so the memory and its plan stay as they were). The norm + RoPE
 * writes Q and K there, the forward's cast of v writes V, cuDNN writes O,
 * and the backward reads all four as they are. They were float32
 * activations cast again in each pass (q, k, v) and O widened into ctx
 * for the backward to round back: some 0.5 GB of passes a layer a step.
 * ctx is widened only where an o_proj LoRA reads it in float32. g->cudnn
 * holds only on the bf16 path at S > 1 (ms_gmodel_sdpa_tried), so never in
 * a decode.
 */
static __nv_bfloat16 *att16_q(const struct ms_gmodel *g, const struct dacts *a)
{
	(void)g;
	return (__nv_bfloat16 *)a->q;
}
static __nv_bfloat16 *att16_o(const struct ms_gmodel *g, const struct dacts *a)
{
	return (__nv_bfloat16 *)a->q + (uint64_t)g->T * g->dq;
}
static __nv_bfloat16 *att16_k(const struct ms_gmodel *g, const struct dacts *a)
{
	(void)g;
	return (__nv_bfloat16 *)a->k;
}
static __nv_bfloat16 *att16_v(const struct ms_gmodel *g, const struct dacts *a)
{
	return (__nv_bfloat16 *)a->k + (uint64_t)g->T * g->dkv;
}

/* cuDNN's SDPA for the layer (the layout above): the forward's O into
 * a->q's second half (widened into ctx where ctx32), the backward's dV
 * widened into dvv; dQ and dK stay in bf16 in sdb, where the RoPE
 * backward reads them (rope_bwd) */
static int att_cudnn(struct ms_gmodel *g, struct dacts *a, int bwd, int ctx32, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t nq = (uint64_t)g->T * g->dq, nk = (uint64_t)g->T * g->dkv;
	__nv_bfloat16 *gq = (__nv_bfloat16 *)g->sdb + nq, *gk = gq + nq, *gv = gk + nk;
	__nv_bfloat16 *Q = att16_q(g, a), *O = att16_o(g, a), *K = att16_k(g, a), *V = att16_v(g, a);
	const void *dO = NULL;
	if (!bwd) {
		if (!g->v16) {
			k_cast<__nv_bfloat16><<<cast_blocks(nk), NTH, 0, g->st>>>(a->v, V, nk);
			LK();
		}
		site(g, -2);
		if ((rc = ms_sdpa_fwd(g->sd, Q, K, V, O, a->lse, g->fws, g->st, err)))
			return rc;
		site(g, SK_SDPA_FWD);
		if (ctx32) {
			k_widen<<<nblk(nq), NTH, 0, g->st>>>(O, a->ctx, nq);
			LK();
		}
		return MS_OK;
	}
	if (g->do16)
		dO = g->do16;
	else if ((rc = opnd(g, g->dctx, nq, g->cA, &dO, err)))
		return rc;
	site(g, -2);
	if ((rc = ms_sdpa_bwd(g->sd, Q, K, V, O, dO, a->lse, gq, gk, gv, g->fws, g->st, err)))
		return rc;
	site(g, SK_SDPA_BWD);
	if (!g->dv16) {
		k_widen<<<nblk(nk), NTH, 0, g->st>>>(gv, g->dvv, nk);
		LK();
	}
out:
	return rc;
}

static int att_core(struct ms_gmodel *g, struct dacts *a, int bwd, int ctx32, struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t S = g->S, nh = g->nh, nkv = g->nkv, hd = g->hd, dq = g->dq, dkv = g->dkv;
	uint32_t rep = nh / nkv;
	float scale = (float)(1.0 / sqrt((double)hd));
	const void *Q = NULL, *Kk = NULL, *Vv = NULL, *dO = NULL;
	void *vbuf = g->f32 ? NULL : g->tmp;
	uint64_t SS = (uint64_t)S * S;
	if (nh > MAXE)
		return ms_err_set(err, MS_EINVAL, "attention: more than %u heads", MAXE);
	if (g->cudnn) {
		g->att_ran = 1;
		g->att_ws[0] = ms_sdpa_workspace_bytes(g->sd);
		g->att_ws[1] = u64max(ms_gmodel_sdpa_ws(g->B, nh, S), g->att_ws[0]);
		return att_cudnn(g, a, bwd, ctx32, err);
	}
	if ((rc = opnd(g, a->q, (uint64_t)g->T * dq, g->cB, &Q, err)) ||
	    (rc = opnd(g, a->k, (uint64_t)g->T * dkv, g->cC, &Kk, err)) ||
	    (rc = opnd(g, a->v, (uint64_t)g->T * dkv, vbuf, &Vv, err)))
		return rc;
	if (bwd && (rc = opnd(g, g->dctx, (uint64_t)g->T * dq, g->cA, &dO, err)))
		return rc;
	g->att_ran = g->flash ? 2 : 3;
	if (g->flash) {
		struct ms_flash_shape fs = {g->B, S, nh, nkv, hd};
		if (!bwd)
			return ms_flash_fwd(&fs, Q, Kk, Vv, a->ctx, a->lse, g->st, err);
		return ms_flash_bwd(&fs, Q, Kk, Vv, a->ctx, dO, a->lse, g->dqv, g->dkk, g->dvv,
				    g->fws, g->st, err);
	}
	for (uint32_t b = 0; b < g->B; b++) {
		const void *Qb = OFF(Q, (uint64_t)b * S * dq), *Kb = OFF(Kk, (uint64_t)b * S * dkv);
		const void *Vb = OFF(Vv, (uint64_t)b * S * dkv);
		const void *dOb = bwd ? OFF(dO, (uint64_t)b * S * dq) : NULL;
		/* scores S_h = Q_h K_g^T */
		if ((rc = heads_gemm(g, 0, 1, S, S, hd, Qb, hd, dq, Kb, hd, rep, dkv, g->sc, SS, S,
				     err)))
			return rc;
		if (!bwd) {
			if (g->f32)
				k_softmax<float, true><<<nh * S, NTH, 0, g->st>>>(
					g->sc, (float *)g->pg, S, scale);
			else
				k_softmax<__nv_bfloat16, false><<<nh * S, NTH, 0, g->st>>>(
					g->sc, (__nv_bfloat16 *)g->pg, S, scale);
			LK();
			/* context O_h = P_h V_g */
			if ((rc = heads_gemm(g, 0, 0, S, hd, S, g->pg, SS, S, Vb, hd, rep, dkv,
					     a->ctx + (uint64_t)b * S * dq, hd, dq, err)))
				return rc;
			continue;
		}
		/* dP_h = dO_h V_g^T */
		if ((rc = heads_gemm(g, 0, 1, S, S, hd, dOb, hd, dq, Vb, hd, rep, dkv, g->dp, SS, S,
				     err)))
			return rc;
		if (g->f32)
			k_softmax_bwd<float, true><<<nh * S, NTH, 0, g->st>>>(
				g->sc, g->dp, (float *)g->pg, (float *)g->dsg, S, scale);
		else
			k_softmax_bwd<__nv_bfloat16, false><<<nh * S, NTH, 0, g->st>>>(
				g->sc, g->dp, (__nv_bfloat16 *)g->pg, (__nv_bfloat16 *)g->dsg, S,
				scale);
		LK();
		/* per query head: dV_h = P_h^T dO_h and dK_h = dS_h^T Q_h into
		 * [S, nh*hd] scratch (summed over each KV head's group after),
		 * dQ_h = dS_h K_g straight into dqv */
		if ((rc = heads_gemm(g, 1, 0, S, hd, S, g->pg, SS, S, dOb, hd, 1, dq, g->dctx2, hd,
				     dq, err)))
			return rc;
		k_group_sum<<<nblk((uint64_t)S * dkv), NTH, 0, g->st>>>(
			g->dctx2, g->dvv + (uint64_t)b * S * dkv, S, nkv, rep, hd);
		LK();
		if ((rc = heads_gemm(g, 0, 0, S, hd, S, g->dsg, SS, S, Kb, hd, rep, dkv,
				     g->dqv + (uint64_t)b * S * dq, hd, dq, err)) ||
		    (rc = heads_gemm(g, 1, 0, S, hd, S, g->dsg, SS, S, Qb, hd, 1, dq, g->dctx2, hd,
				     dq, err)))
			return rc;
		k_group_sum<<<nblk((uint64_t)S * dkv), NTH, 0, g->st>>>(
			g->dctx2, g->dkk + (uint64_t)b * S * dkv, S, nkv, rep, hd);
		LK();
	}
out:
	return rc;
}

/* ---- KV-cache decode ------------------------------------------------------------ */

/* A KV-cache decode's place in layer_fwd: one new token per sequence at
 * position pos of the cache (this layer's rows) */
struct kvdec {
	float *k, *v;                /* [B, cap, dkv], after norm + RoPE */
	float *sc;                   /* scores / probabilities [B, nh, cap] */
	uint32_t pos, cap;
};

/* this step's keys and values [B, dkv] into the cache rows at pos */
__global__ void k_kv_put(const float *k, const float *v, float *K, float *V, uint32_t B,
			 uint32_t dkv, uint32_t cap, uint32_t pos)
{
	uint64_t n = (uint64_t)B * dkv;
	for (uint64_t idx = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
	     idx += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t b = idx / dkv, i = idx % dkv, at = (b * cap + pos) * dkv + i;
		K[at] = k[idx];
		V[at] = v[idx];
	}
}

/*
 * One (sequence, head) a block: the new query against the cache's n
 * positions, model.c's att_decode_pairs in the same precision (dot
 * products and the normaliser in double, the scaled score and the
 * probability rounded to float), only the sums' order differs (a tree
 * over the block instead of a loop). Every mode decodes in float32: the
 * rollouts' behaviour log-probs are as close to the CPU's as the model
 * allows, and the attention of one position is a matrix-vector product,
 * which tensor cores would not speed up.
 */
__global__ void k_dec_att(const float *q, const float *K, const float *V, float *sc,
			  float *ctx, uint32_t nh, uint32_t nkv, uint32_t hd, uint32_t cap,
			  uint32_t n, float scale)
{
	__shared__ double shd[33];
	__shared__ float shf[33];
	uint32_t b = blockIdx.x / nh, h = blockIdx.x % nh, kh = h / (nh / nkv);
	uint32_t dq = nh * hd, dkv = nkv * hd;
	const float *qr = q + (uint64_t)b * dq + (uint64_t)h * hd;
	const float *Kb = K + (uint64_t)b * cap * dkv + (uint64_t)kh * hd;
	const float *Vb = V + (uint64_t)b * cap * dkv + (uint64_t)kh * hd;
	float *s = sc + (uint64_t)blockIdx.x * cap;
	float mx = -INFINITY;
	for (uint32_t t = threadIdx.x; t < n; t += blockDim.x) {
		double d = 0;
		for (uint32_t x = 0; x < hd; x++)
			d += (double)qr[x] * Kb[(uint64_t)t * dkv + x];
		s[t] = (float)d * scale;
		mx = fmaxf(mx, s[t]);
	}
	mx = block_max(mx, shf);
	double sum = 0;
	for (uint32_t t = threadIdx.x; t < n; t += blockDim.x)
		sum += exp((double)s[t] - mx);
	sum = block_sum(sum, shd);
	for (uint32_t t = threadIdx.x; t < n; t += blockDim.x)
		s[t] = (float)(exp((double)s[t] - mx) / sum);
	/* the block's own global writes are visible to it after the barrier */
	__syncthreads();
	for (uint32_t x = threadIdx.x; x < hd; x += blockDim.x) {
		double acc = 0;
		for (uint32_t t = 0; t < n; t++)
			acc += (double)s[t] * Vb[(uint64_t)t * dkv + x];
		ctx[(uint64_t)b * dq + (uint64_t)h * hd + x] = (float)acc;
	}
}

static int att_decode(struct ms_gmodel *g, struct dacts *a, const struct kvdec *dc,
		      struct ms_err *err)
{
	int rc = MS_OK;
	float scale = (float)(1.0 / sqrt((double)g->hd));
	k_kv_put<<<nblk((uint64_t)g->B * g->dkv), NTH, 0, g->st>>>(a->k, a->v, dc->k, dc->v,
								    g->B, g->dkv, dc->cap,
								    dc->pos);
	LK();
	k_dec_att<<<g->B * g->nh, 128, 0, g->st>>>(a->q, dc->k, dc->v, dc->sc, a->ctx, g->nh,
						   g->nkv, g->hd, dc->cap, dc->pos + 1, scale);
	LK();
out:
	return rc;
}

/* the sort's chunk counts: after dsum's E + 1 doubles (E sort_chunks
 * words) */
static uint32_t *sort_hist(struct ms_gmodel *g)
{
	return (uint32_t *)((char *)g->dsum + (g->E + 1) * 8);
}

/* the layer's rows per expert to cnt [E] (device), the chunks' places kept */
static int sort_counts(struct ms_gmodel *g, struct dacts *a, uint32_t *cnt, struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t TK = g->T * g->K, nc = sort_chunks(TK);
	k_hist<<<nc, SCH, g->E * 4, g->st>>>(a->sel, TK, g->E, nc, sort_hist(g));
	LK();
	k_hscan<<<g->E, NTH, 0, g->st>>>(sort_hist(g), nc, cnt);
	LK();
out:
	return rc;
}

/* the stable placement from the experts' offsets off [E] (device) */
static int sort_place(struct ms_gmodel *g, struct dacts *a, const uint32_t *off,
		      struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t TK = g->T * g->K, nc = sort_chunks(TK);
	k_scatter<<<nc, SCH, SCH / 32 * g->E * 4, g->st>>>(a->sel, TK, g->E, nc, sort_hist(g), off,
							   a->perm, a->pos);
	LK();
out:
	return rc;
}

/* rows per expert to the host, offsets back, then the stable sort */
static int moe_sort(struct ms_gmodel *g, struct dacts *a, struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t off[MAXE + 1];
	uint32_t *dc = (uint32_t *)g->dsum;
	if ((rc = sort_counts(g, a, dc, err)))
		return rc;
	CK(cudaMemcpyAsync(a->cnt, dc, g->E * sizeof(uint32_t), cudaMemcpyDeviceToHost, g->st));
	CK(cudaStreamSynchronize(g->st));
	off[0] = 0;
	for (uint32_t e = 0; e < g->E; e++)
		off[e + 1] = off[e] + a->cnt[e];
	CK(cudaMemcpyAsync(dc, off, (g->E + 1) * sizeof(uint32_t), cudaMemcpyHostToDevice, g->st));
	if ((rc = sort_place(g, a, dc, err)))
		return rc;
	/* the upload reads off before this function's frame is gone */
	CK(cudaStreamSynchronize(g->st));
out:
	return rc;
}

/*
 * The grouped path's routing: the counts, their running sums and the
 * stable sort all stay on the device (ms_ggemm_index writes the offsets
 * k_perm, the grouped GEMMs and the expert LoRA's kernels read). Only a
 * rank past what those LoRA kernels cover takes the cuBLAS calls that need
 * the counts on the host: then they are copied too, cev marks their
 * arrival, and the host waits for them only where it needs them
 * (egemm_counts), with the gate/up GEMM already queued behind the copy.
 */
static int host_counts(const struct ms_gmodel *g)
{
	return !g->grouped || g->r > MS_GGEMM_WGRAD_MAX_R;
}

/* off: 2 (E + 1) words of device memory for the offsets (the grouped
 * path keeps a layer's, a->goff; the per-expert path's are transient).
 * The bf16 per-expert path routes here too: the host then waits for the
 * counts only before its first expert GEMM (egemm_counts), with the sort
 * and the gather already queued, where moe_sort's two synchronizations
 * left the GPU idle for the host's round trip each layer. */
static int moe_route_dev(struct ms_gmodel *g, struct dacts *a, uint32_t *off,
			 struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t *dc = (uint32_t *)g->dsum;
	if ((rc = sort_counts(g, a, dc, err)))
		return rc;
	if (host_counts(g)) {
		CK(cudaMemcpyAsync(a->cnt, dc, g->E * sizeof(uint32_t), cudaMemcpyDeviceToHost,
				   g->st));
		CK(cudaEventRecord(g->cev, g->st));
		g->cnt_wait = 1;
	}
	if ((rc = ms_ggemm_index(dc, g->E, off, off + g->E + 1, g->st, err)))
		return rc;
	if ((rc = sort_place(g, a, off, err)))
		return rc;
out:
	return rc;
}

/* the host's copy of the layer's counts, once moe_route_dev's copy landed */
static int egemm_counts(struct ms_gmodel *g, struct ms_err *err)
{
	int rc = MS_OK;
	if (g->cnt_wait)
		CK(cudaEventSynchronize(g->cev));
	g->cnt_wait = 0;
out:
	return rc;
}

/* Expert product w of layer d (0: gate/up, 1: down, 2: gate/up's W^T, 3:
 * down's W^T) over every expert's rows in one grouped launch:
 * C [TK, N] = X [TK, K] B_e^T per expert's rows, B_e [N, K] */
static int egemm(struct ms_gmodel *g, const struct dlayer *d, const struct dacts *a, int w,
		 const void *X, uint32_t N, uint32_t K, float *C, struct ms_err *err)
{
	struct ms_ggemm p;
	memset(&p, 0, sizeof p);
	p.E = g->E;
	p.N = N;
	p.K = K;
	p.rows = (uint64_t)g->T * g->K;
	p.off = a->goff;
	p.tiles = a->goff + g->E + 1;
	p.a = X;
	p.lda = K;
	if (g->fused)
		p.bq = d->gbq + (uint64_t)w * g->E;
	else
		p.b = d->gbp + (uint64_t)w * g->E;
	p.ldb = K;
	p.c = C;
	p.ldc = N;
	return ms_ggemm_run(&p, g->st, err);
}

/* RoPE over T rows of nhead heads (k_rope), its index 32-bit where the
 * tensor and the grid's stride fit */
template <typename X>
static int rope(struct ms_gmodel *g, const X *x, float *y, uint32_t T, uint32_t nhead,
		uint32_t half, const float *cs, const float *sn, int bwd, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t n = (uint64_t)T * nhead * g->hd;
	unsigned grid = nblk(n);
	if (n + (uint64_t)grid * NTH <= 0xffffffffull)
		k_rope<uint32_t, X><<<grid, NTH, 0, g->st>>>(x, y, T, nhead, g->hd, half, g->S, cs,
							      sn, bwd);
	else
		k_rope<uint64_t, X><<<grid, NTH, 0, g->st>>>(x, y, T, nhead, g->hd, half, g->S, cs,
							      sn, bwd);
	LK();
out:
	return rc;
}

/* the attention core's dQ (i 0) or dK (1) for the RoPE backward: cuDNN's
 * bf16 in sdb, else dqv / dkk */
static int rope_bwd(struct ms_gmodel *g, int i, float *y, uint32_t half, struct ms_err *err)
{
	uint32_t T = g->T, nhead = i ? g->nkv : g->nh;
	if (g->cudnn) {
		const __nv_bfloat16 *o = (const __nv_bfloat16 *)g->sdb;
		const __nv_bfloat16 *d = o + (uint64_t)T * g->dq * (i ? 2 : 1);
		return rope(g, d, y, T, nhead, half, g->rope_c, g->rope_s, 1, err);
	}
	return rope(g, (const float *)(i ? g->dkk : g->dqv), y, T, nhead, half, g->rope_c,
		    g->rope_s, 1, err);
}

/*
 * The folded expert LoRA (g->fold: bf16, per-expert GEMMs, no dropout).
 * Y = X W^T + s (X A^T) B^T is one GEMM over a K fr columns longer (fr:
 * the rank padded with zeros to a multiple of 16, fold_width): the
 * operand's twin carries U = X A^T in its last fr columns and the decoded
 * W carries s B in its (k_fold_tail); backward, dX = dY W + dU A the same
 * way with [dY | dU] and [W^T | A^T]. What stays apart is U and dU (one
 * grouped bf16 launch each) and the adapter's gradients (fold_wgrad, on
 * the tensor cores): no float32 pass over the expert rows' outputs, which
 * the separate products' accumulation into Y and dX cost (measured on the
 * H200 at the bench shapes: 0.28-0.38 ms a product a layer, against a K
 * 16 longer costing the frozen GEMM 0.02-0.07 ms). Its rounding is no
 * coarser than PyTorch's under bf16 autocast: U and dU in bf16 as there,
 * the sums and the factors' gradients in float32.
 */
/* every expert's (blockIdx.y) matrix at base + e * es, row stride ld: row
 * i, column c0 + k <- s * src [e * ss + i * rs + k * ks], i < rows, k < r;
 * zeros for k in [r, fr) */
__global__ void k_fold_tail(__nv_bfloat16 *base, uint64_t es, uint32_t ld, uint32_t c0,
			    uint32_t rows, uint32_t r, uint32_t fr, const float *src, uint64_t ss,
			    uint32_t rs, uint32_t ks, float s, uint32_t kb = 0)
{
	/* columns [c0, c0 + fr): the factor's r in [kb, kb + r), zeros
	 * elsewhere */
	uint64_t e = blockIdx.y;
	uint32_t n = rows * fr;
	if (fr % 8 == 0 && ld % 8 == 0 && c0 % 8 == 0 && es % 8 == 0 && al16(base)) {
		/* eight columns a thread, one 16-byte store (an element a
		 * thread, 2-byte stores, took 0.82 ms a step on the H200 bench
		 * for its 64 launches; with this the two decode phases that
		 * hold them, 8.93 -> 8.74 ms) */
		uint32_t ng = fr / 8;
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < rows * ng;
		     i += gridDim.x * blockDim.x) {
			uint32_t row = i / ng, k0 = 8 * (i - row * ng);
			float v[8];
			for (uint32_t j = 0; j < 8; j++) {
				uint32_t k = k0 + j;
				v[j] = k >= kb && k - kb < r
					       ? s * src[e * ss + (uint64_t)row * rs +
							 (uint64_t)(k - kb) * ks]
					       : 0.0f;
			}
			st8(base + e * es + (uint64_t)row * ld + c0 + k0, v);
		}
		return;
	}
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
		uint32_t row = i / fr, k = i - row * fr;
		base[e * es + (uint64_t)row * ld + c0 + k] = __float2bfloat16_rn(
			k >= kb && k - kb < r
				? s * src[e * ss + (uint64_t)row * rs + (uint64_t)(k - kb) * ks]
				: 0.0f);
	}
}

/* k_fold_tail's threads a row for a tail fr wide: eight columns each on
 * its vector path (a multiple of 8; its grid-stride loop covers the rest
 * whichever path runs) */
static uint32_t tail_groups(uint32_t fr)
{
	return fr % 8 ? fr : fr / 8;
}

/* a LoRA factor of every expert as bf16 with zero rows and columns to
 * [rd, cd] (from [rs_, cs]): fold_u's A [E, fr, in], fold_du's B [E, out, fr] */
__global__ void k_pad_factor(const float *src, __nv_bfloat16 *dst, uint32_t E, uint32_t rs_,
			     uint32_t cs, uint32_t rd, uint32_t cd)
{
	uint64_t n = (uint64_t)E * rd * cd;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t er = udiv(i, cd), e_ = udiv(er, rd);
		uint32_t c = (uint32_t)(i - er * cd);
		uint32_t r = (uint32_t)(er - e_ * rd), e = (uint32_t)e_;
		dst[i] = __float2bfloat16_rn(r < rs_ && c < cs ? src[((uint64_t)e * rs_ + r) * cs + c]
							     : 0.0f);
	}
}

/* the q/k/v LoRA's tails (afr): forward, each of W_q, W_k, W_v's whole tail
 * (its own adapter's s B at its columns, zeros in the others'); backward,
 * each adapter's A^T right of [W_q^T W_k^T W_v^T] */
static int fold_tails_att(struct ms_gmodel *g, const struct dlayer *d, int bwd,
			  struct ms_err *err)
{
	int rc = MS_OK;
	const struct dlin *ls[3] = {&d->q, &d->k, &d->v};
	const struct dlora *Ls[3] = {d->lq, d->lk, d->lv};
	uint32_t fw = fold_width(g->r), w0 = d->q.out + d->k.out + d->v.out;
	for (int i = 0; i < 3; i++) {
		const struct dlin *l = ls[i];
		const struct dlora *L = Ls[i];
		if (!bwd)
			k_fold_tail<<<nblk((uint64_t)l->out * tail_groups(d->afr)), NTH, 0, g->st>>>(
				(__nv_bfloat16 *)wbase(g, l->lyr, 0) + l->woff, 0, l->in + d->afr,
				l->in, l->out,
				L ? L->r : 0, d->afr, L ? L->B : NULL, 0, L ? L->r : 0, 1, g->lscale,
				L ? d->acol[i] : 0);
		else if (L)
			k_fold_tail<<<nblk((uint64_t)l->in * tail_groups(fw)), NTH, 0, g->st>>>(
				(__nv_bfloat16 *)wbase(g, l->lyr, 1) + d->q.woff, 0, w0 + d->afr,
				w0 + d->acol[i],
				l->in, L->r, fw, L->A, 0, 1, l->in, 1.0f);
		else
			continue;
		LK();
	}
out:
	return rc;
}

/* The folded factors of a layer's experts (and its q/k/v adapters) into
 * the decode scratch, after the decode: forward s B [out, r] right of W
 * [out, in]; backward A^T [in, r] right of W^T [in, out]. The adapter
 * changes every step; the frozen part is decoded every layer anyway. */
static int fold_tails(struct ms_gmodel *g, const struct dlayer *d, int bwd, struct ms_err *err)
{
	int rc = MS_OK;
	if (d->afr && (rc = fold_tails_att(g, d, bwd, err)))
		return rc;
	if (!d->moe || !g->E || !d->egu[0].fr)
		return MS_OK;
	const struct dlin *ls[2] = {d->egu, d->edn};
	const struct dlora *Ls[2] = {d->lgu, d->ldn};
	for (int i = 0; i < 2; i++) {
		const struct dlin *l = ls[i];
		const struct dlora *L = Ls[i];
		/* the experts' places are evenly spaced: the same shapes in order */
		uint64_t es = g->E > 1 ? l[1].woff - l[0].woff : 0;
		uint32_t rows = bwd ? l->in : l->out, c0 = bwd ? l->out : l->in;
		k_fold_tail<<<dim3(nblk((uint64_t)rows * tail_groups(l->fr)), g->E), NTH, 0,
			      g->st>>>(
			(__nv_bfloat16 *)wbase(g, l->lyr, bwd) + l->woff, es, c0 + l->fr, c0,
			rows, L->r, l->fr,
			bwd ? L->A : L->B, (uint64_t)L->r * (bwd ? L->in : L->out), bwd ? 1 : L->r,
			bwd ? L->in : 1, bwd ? 1.0f : g->lscale);
		LK();
	}
out:
	return rc;
}

/* the attention fold's forward: U = X [A_q; A_k; A_v]^T (each A padded
 * with zero rows to fold_width(r)) in one GEMM from the norm's bf16 X into
 * the X twin's tail, and each U's r columns compact (bf16 [T, r], in the
 * adapter's float U buffer) for the backward's gB */
static int att_fold_u(struct ms_gmodel *g, const struct dlayer *d, const struct dacts *a,
		      struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t H = g->H, r = g->r, fw = fold_width(g->r), ld = H + d->afr;
	const struct dlora *Ls[3] = {d->lq, d->lk, d->lv};
	float *us[3] = {a->uq, a->uk, a->uv};
	__nv_bfloat16 *X = (__nv_bfloat16 *)g->cA;
	struct gctx c = main_ctx(g);
	for (int i = 0; i < 3; i++)
		if (Ls[i]) {
			k_pad_factor<<<nblk((uint64_t)fw * H), NTH, 0, g->st>>>(
				Ls[i]->A, g->aab + (uint64_t)d->acol[i] * H, 1, r, H, fw, H);
			LK();
		}
	if ((rc = gemm_on(g, &c, 0, 1, (uint32_t)g->T, d->afr, H, 1.0f, X, ld, g->aab, H, 0.0f,
			  X + H, ld, g->gt, g->ct_base, CUDA_R_16BF, err)))
		return rc;
	for (int i = 0; i < 3; i++)
		if (Ls[i])
			CK(cudaMemcpy2DAsync(us[i], (uint64_t)r * 2, X + H + d->acol[i],
					     (uint64_t)ld * 2, (uint64_t)r * 2, g->T,
					     cudaMemcpyDeviceToDevice, g->st));
out:
	return rc;
}

/* float [rows, r] into bf16 columns [0, fw) of rows of stride ld, zeros
 * past r */
__global__ void k_tail_put(const float *src, uint32_t lds, __nv_bfloat16 *dst, uint64_t rows,
			   uint32_t r, uint32_t fw, uint32_t ld)
{
	uint64_t n = rows * fw;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t row = udiv(i, fw);
		uint32_t k = (uint32_t)(i - row * fw);
		dst[row * ld + k] = __float2bfloat16_rn(k < r ? src[row * lds + k] : 0.0f);
	}
}

/* the attention fold's backward, each adapted projection from its bf16 dY
 * in the twin [dq dk dv | tail] (row stride w, w0 its columns before the
 * tail): dU = s dY B (float, in du) into the tail's columns (the input
 * gradient's extra K), gB += s dY^T U, gA += dU^T X (X the norm's float
 * output, as the unfolded path reads it). With more than one adapter and
 * room in du and tmp, the dUs side by side in du ([T, n r]) and every gA
 * from one GEMM into tmp ([n r, H], then added to each): X read once,
 * where a GEMM an adapter read it each time at M = r (on the H200 bench,
 * q and v: 0.94 ms a step for the two) */
static int att_fold_bwd(struct ms_gmodel *g, const struct dlayer *d, const struct dacts *a,
			uint32_t w0, uint32_t w, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t T = g->T;
	uint32_t H = g->H, r = g->r, fw = fold_width(g->r);
	const struct dlora *Ls[3] = {d->lq, d->lk, d->lv};
	const float *us[3] = {a->uq, a->uk, a->uv};
	uint32_t outs[3] = {g->dq, g->dkv, g->dkv}, offs[3] = {0, g->dq, g->dq + g->dkv};
	__nv_bfloat16 *Y = (__nv_bfloat16 *)g->cA, *Bp = g->aab + (uint64_t)g->afrmax * H;
	uint32_t n = !!Ls[0] + !!Ls[1] + !!Ls[2], j = 0;
	int one = n > 1 && T * n * r <= g->du_n && (uint64_t)n * r * H <= g->tmp_n;
	uint32_t ld = one ? n * r : r;
	for (int i = 0; i < 3; i++) {
		const struct dlora *L = Ls[i];
		if (!L)
			continue;
		float *du = g->du + (one ? j++ * r : 0);
		k_pad_factor<<<nblk((uint64_t)outs[i] * fw), NTH, 0, g->st>>>(L->B, Bp, 1, outs[i],
									       r, outs[i], fw);
		LK();
		if ((rc = gemm(g, 0, 0, (uint32_t)T, r, outs[i], g->lscale, Y + offs[i], w, Bp, fw,
			       0.0f, du, ld, g->gt, g->ct_base, err)))
			return rc;
		k_tail_put<<<nblk(T * fw), NTH, 0, g->st>>>(du, ld, Y + w0 + d->acol[i], T, r, fw,
							     w);
		LK();
		if ((rc = gemm(g, 1, 0, outs[i], r, (uint32_t)T, g->lscale, Y + offs[i], w, us[i], r,
			       1.0f, L->gB, r, g->gt, g->ct_base, err)) ||
		    (!one && (rc = gemm(g, 1, 0, r, H, (uint32_t)T, 1.0f, du, r, a->h1, H, 1.0f,
					L->gA, H, CUDA_R_32F, g->ct_lora, err))))
			return rc;
	}
	if (!one)
		return MS_OK;
	if ((rc = gemm(g, 1, 0, n * r, H, (uint32_t)T, 1.0f, g->du, ld, a->h1, H, 0.0f, g->tmp, H,
		       CUDA_R_32F, g->ct_lora, err)))
		return rc;
	j = 0;
	for (int i = 0; i < 3; i++) {
		if (!Ls[i])
			continue;
		k_add<<<nblk((uint64_t)r * H), NTH, 0, g->st>>>(
			Ls[i]->gA, Ls[i]->gA, g->tmp + (uint64_t)j++ * r * H, (uint64_t)r * H);
		LK();
	}
out:
	return rc;
}

/*
 * The folded expert LoRA's products that read a whole token row (gate/up's
 * U = x A_e^T, the down adapter's dU = s dy B_e, gate/up's gA_e += dU^T x)
 * as one dense GEMM of every token against every expert's factor, [T, H]
 * by [H, E fr]: eight times the FLOPs a token's K experts need, but the
 * tokens read once ([T, H]), where the grouped products read each
 * token's row again for each of its experts' rows ([T K, H]) and ran far
 * from the memory's rate (cuBLAS's grouped GEMM at N = 16). A row p of the
 * experts (slot perm[p] = t K + k, expert sel[perm[p]]) then takes its
 * fr values of token t's row, or gives them back (k_tail_scatter).
 */
/* element i of the expert rows' [n, fr] tails: its row p and column k,
 * the row's slot sl = perm[p] (token t = sl / K, expert sel[sl]), and the
 * index of the same value in the dense [T, E fr] (returned) */
__device__ __forceinline__ uint64_t tail_at(uint64_t i, uint32_t fr, const int32_t *perm,
					    const int32_t *sel, uint32_t K, uint32_t E,
					    uint64_t *p, uint32_t *k, int32_t *sl)
{
	*p = udiv(i, fr);
	*k = (uint32_t)(i - *p * fr);
	*sl = perm[*p];
	return ((uint64_t)((uint32_t)*sl / K) * E + (uint32_t)sel[*sl]) * fr + *k;
}

__global__ void k_tail_gather(const float *D, const int32_t *perm, const int32_t *sel,
			      const float *w, uint32_t K, uint32_t E, uint32_t fr, uint32_t r,
			      __nv_bfloat16 *tw, uint32_t ldt, uint32_t c0, __nv_bfloat16 *us,
			      uint64_t n, const float *wu = NULL)
{
	/* tail [p, c0 + k] = D [t, e fr + k] (times the slot's weight w when
	 * given, once rounded); us: its r first compact ([n, r]), times wu
	 * instead where wu is given */
	uint64_t m = n * fr;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t p;
		uint32_t k;
		int32_t sl;
		float v = D[tail_at(i, fr, perm, sel, K, E, &p, &k, &sl)];
		__nv_bfloat16 b = __float2bfloat16_rn(w ? w[sl] * v : v);
		tw[p * ldt + c0 + k] = b;
		if (us && k < r)
			us[p * r + k] = wu ? __float2bfloat16_rn(wu[sl] * v) : b;
	}
}

/* the reverse: Db [t, e fr + k] = tail [p, c0 + k], times the slot's
 * weight w (once rounded) where given (Db zeroed first: the experts a
 * token did not choose stay zero) */
__global__ void k_tail_scatter(const __nv_bfloat16 *tw, uint32_t ldt, uint32_t c0,
			       const int32_t *perm, const int32_t *sel, const float *w,
			       uint32_t K, uint32_t E, uint32_t fr, __nv_bfloat16 *Db, uint64_t n)
{
	uint64_t m = n * fr;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t p;
		uint32_t k;
		int32_t sl;
		uint64_t d = tail_at(i, fr, perm, sel, K, E, &p, &k, &sl);
		__nv_bfloat16 v = tw[p * ldt + c0 + k];
		Db[d] = w ? __float2bfloat16_rn(w[sl] * __bfloat162float(v)) : v;
	}
}

/* o [p, k] = w [perm [p]] u [p, k] (once rounded): each expert row's U
 * times its slot's routing weight */
__global__ void k_wrows(const __nv_bfloat16 *u, const int32_t *perm, const float *w,
			__nv_bfloat16 *o, uint64_t n, uint32_t r)
{
	uint64_t m = n * r;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m;
	     i += (uint64_t)gridDim.x * blockDim.x)
		o[i] = __float2bfloat16_rn(w[perm[udiv(i, r)]] * __bfloat162float(u[i]));
}

/* gB_e [out, r] += C [e fr + k, o] for k < r: the dense product's rows
 * (one an expert's rank index) into the experts' B gradients */
__global__ void k_gb_put(const float *C, float *gB, uint32_t E, uint32_t out, uint32_t r,
			 uint32_t fr)
{
	uint64_t n = (uint64_t)E * out * r;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint32_t e, o, k;
		eok_of(i, out, r, &e, &o, &k);
		gB[i] += C[((uint64_t)e * fr + k) * out + o];
	}
}

/* B [E, out, r] as bf16 [E fr, out]: row e fr + k is B_e's column k
 * (zeros for k >= r) */
__global__ void k_bt_pad(const float *B, __nv_bfloat16 *dst, uint32_t E, uint32_t out,
			 uint32_t r, uint32_t fr)
{
	uint64_t n = (uint64_t)E * fr * out;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t ek = udiv(i, out), e_ = udiv(ek, fr);
		uint32_t h = (uint32_t)(i - ek * out);
		uint32_t k = (uint32_t)(ek - e_ * fr), e = (uint32_t)e_;
		dst[i] = __float2bfloat16_rn(k < r ? B[((uint64_t)e * out + h) * r + k] : 0.0f);
	}
}

/* forward, gate/up: U = h2 A_e^T for every token and expert (xb: h2 in
 * bf16, [T, H]), each expert row's into the twin X's tail (row stride ld)
 * and compact into Us (bf16 [TK, r]) */
static int fold_u_gu(struct ms_gmodel *g, const struct dlora *L, const struct dacts *a,
		     const __nv_bfloat16 *xb, void *X, uint32_t ld, void *Us,
		     struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t T = g->T, TK = T * g->K, fr = fold_width(L->r), in = L->in;
	struct gctx c = main_ctx(g);
	k_pad_factor<<<nblk((uint64_t)L->E * fr * in), NTH, 0, g->st>>>(
		L->A, g->fab, L->E, L->r, L->in, (uint32_t)fr, L->in);
	LK();
	if ((rc = gemm_on(g, &c, 0, 1, (uint32_t)T, L->E * (uint32_t)fr, (uint32_t)in, 1.0f, xb,
			  (uint32_t)in, g->fab, (uint32_t)in, 0.0f, g->ud, L->E * (uint32_t)fr,
			  g->gt, g->ct_base, CUDA_R_32F, err)))
		return rc;
	k_tail_gather<<<nblk(TK * fr), NTH, 0, g->st>>>(
		g->ud, a->perm, a->sel, NULL, g->K, L->E, (uint32_t)fr, L->r,
		(__nv_bfloat16 *)X, ld, (uint32_t)in, (__nv_bfloat16 *)Us, TK);
	LK();
out:
	return rc;
}

/* backward, down: dU = s dy B_e for every token and expert (xb: the
 * combine's input gradient dy in bf16, [T, H]), each expert row's into the
 * twin dY's tail as it is (the twin's rows are dy's own, unweighted: the
 * routing weight is applied after the down dgrad, k_swiglu_bwd_dw) and,
 * times its slot's weight (the row's true dU), compact into dUw (bf16 [TK,
 * r], the down adapter's gA operand) */
static int fold_du_dn(struct ms_gmodel *g, const struct dlora *L, const struct dacts *a,
		      const __nv_bfloat16 *xb, void *dY, uint32_t ld, __nv_bfloat16 *dUw,
		      struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t T = g->T, TK = T * g->K, fr = fold_width(L->r), out = L->out;
	struct gctx c = main_ctx(g);
	k_bt_pad<<<nblk((uint64_t)L->E * fr * out), NTH, 0, g->st>>>(L->B, g->fab, L->E, L->out,
								      L->r, (uint32_t)fr);
	LK();
	if ((rc = gemm_on(g, &c, 0, 1, (uint32_t)T, L->E * (uint32_t)fr, (uint32_t)out,
			  g->lscale, xb, (uint32_t)out, g->fab, (uint32_t)out, 0.0f, g->ud,
			  L->E * (uint32_t)fr, g->gt, g->ct_base, CUDA_R_32F, err)))
		return rc;
	k_tail_gather<<<nblk(TK * fr), NTH, 0, g->st>>>(
		g->ud, a->perm, a->sel, NULL, g->K, L->E, (uint32_t)fr, L->r,
		(__nv_bfloat16 *)dY, ld, (uint32_t)out, dUw, TK, a->wts);
	LK();
out:
	return rc;
}

/* backward, gate/up: gA_e += dU^T h2 over every token (xb: h2 in bf16),
 * the expert rows' dU (the twin dY's tail) scattered into a zeroed [T, E
 * fr]; gA [E r, in] is that GEMM's output where r = fr */
static int fold_ga_gu(struct ms_gmodel *g, const struct dlora *L, const struct dacts *a,
		      const void *dY, uint32_t ld, const __nv_bfloat16 *xb, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t T = g->T, TK = T * g->K, fr = fold_width(L->r), out = L->out;
	__nv_bfloat16 *Db = (__nv_bfloat16 *)g->ud;
	CK(cudaMemsetAsync(Db, 0, T * L->E * fr * 2, g->st));
	k_tail_scatter<<<nblk(TK * fr), NTH, 0, g->st>>>((const __nv_bfloat16 *)dY, ld,
							  (uint32_t)out, a->perm, a->sel, NULL,
							  g->K, L->E, (uint32_t)fr, Db, TK);
	LK();
	return gemm(g, 1, 0, L->E * (uint32_t)fr, L->in, (uint32_t)T, 1.0f, Db,
		    L->E * (uint32_t)fr, xb, L->in, 1.0f, L->gA, L->in, g->gt, g->ct_base, err);
out:
	return rc;
}

/* backward, down: gB_e += s dY_e^T U_e over every token at once. dY_e's
 * row of slot (t, k) is w_tk dy_t (the combine's backward), so with Uw [T,
 * E fr] holding w_tk U of that slot at token t's expert-e columns (zeros
 * elsewhere), [E fr, out] = s Uw^T dy is every expert's gB^T: one dense
 * GEMM that reads dy once ([T, out], xb: dy in bf16, k_combine_bwd's),
 * where the grouped product read the twin dY's [T K, out] rows. The rank
 * fills the folded width (r = fr; C, in the split partials' scratch, is
 * [E r, out]). */
static int fold_gb_dn(struct ms_gmodel *g, const struct dlora *L, const struct dacts *a,
		      const __nv_bfloat16 *xb, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t T = g->T, TK = T * g->K, r = L->r, out = L->out;
	__nv_bfloat16 *Uw = (__nv_bfloat16 *)g->ud;
	CK(cudaMemsetAsync(Uw, 0, T * L->E * r * 2, g->st));
	k_tail_scatter<<<nblk(TK * r), NTH, 0, g->st>>>((const __nv_bfloat16 *)a->udn,
							 (uint32_t)r, 0, a->perm, a->sel, a->wts,
							 g->K, L->E, (uint32_t)r, Uw, TK);
	LK();
	if ((rc = gemm(g, 1, 0, L->E * (uint32_t)r, (uint32_t)out, (uint32_t)T, g->lscale, Uw,
		       L->E * (uint32_t)r, xb, (uint32_t)out, 0.0f, g->wpart, (uint32_t)out,
		       g->gt, g->ct_base, err)))
		return rc;
	k_gb_put<<<nblk((uint64_t)L->E * out * r), NTH, 0, g->st>>>(g->wpart, L->gB, L->E,
								     (uint32_t)out, (uint32_t)r,
								     (uint32_t)r);
	LK();
out:
	return rc;
}

/* forward: U_e = X_e A_e^T over each expert's rows of the twin X (row
 * stride ld), into its last fr columns (A padded with zero rows to fr, so
 * those past r are zeros), and U's r columns compact into Us (bf16 [TK,
 * r]) for the backward */
static int fold_u(struct ms_gmodel *g, const struct dlora *L, const uint32_t *cnt,
		  const void *X, uint32_t ld, void *Us, uint64_t TK, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t r = L->r, fr = fold_width(L->r), in = L->in, n = (uint64_t)L->E * fr * in;
	const char *tail = (const char *)X + in * 2;
	struct gg o = {CUBLAS_OP_T, CUBLAS_OP_N, (int)in, (int)ld, (int)ld, 1.0f, 0.0f, 1};
	int ran;
	k_pad_factor<<<nblk(n), NTH, 0, g->st>>>(L->A, g->fab, L->E, L->r, L->in, (uint32_t)fr,
						  L->in);
	LK();
	if ((rc = lowrank_bf(g, cnt, (uint32_t)fr, (uint32_t)in, X, ld, g->fab, 0, (void *)tail,
			     ld, 1.0f, TK, &ran, err)) ||
	    (!ran && (rc = ggemm_experts(g, &o, L->E, cnt, (int)fr, G_ROWS, (int)in,
					 gop{g->fab, fr * in, G_EXPERT}, gop{X, ld, G_ROW},
					 gop{tail, ld, G_ROW}, err))))
		return rc;
	CK(cudaMemcpy2DAsync(Us, r * 2, tail, (uint64_t)ld * 2, r * 2, TK,
			     cudaMemcpyDeviceToDevice, g->st));
out:
	return rc;
}

/* backward: dU_e = s dY_e B_e over each expert's rows of the twin dY (row
 * stride ld), into its last fr columns (the dgrad's extra K; B padded
 * with zero columns to fr) */
static int fold_du(struct ms_gmodel *g, const struct dlora *L, const uint32_t *cnt,
		   const void *dY, uint32_t ld, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t fr = fold_width(L->r), out = L->out, n = (uint64_t)L->E * out * fr;
	struct gg o = {CUBLAS_OP_N, CUBLAS_OP_N, (int)fr, (int)ld, (int)ld, g->lscale, 0.0f, 1};
	int ran;
	k_pad_factor<<<nblk(n), NTH, 0, g->st>>>(L->B, g->fab, L->E, L->out, L->r, L->out,
						  (uint32_t)fr);
	LK();
	if ((rc = lowrank_bf(g, cnt, (uint32_t)fr, (uint32_t)out, dY, ld, g->fab, 1,
			     (char *)dY + out * 2, ld, g->lscale, (uint64_t)g->T * g->K, &ran,
			     err)) || ran)
		return rc;
	return ggemm_experts(g, &o, L->E, cnt, (int)fr, G_ROWS, (int)out,
			     gop{g->fab, out * fr, G_EXPERT}, gop{dY, ld, G_ROW},
			     gop{(const char *)dY + out * 2, ld, G_ROW}, err);
out:
	return rc;
}

#define WG_B 1
#define WG_A 2

/* fold_wgrad's rows a run (ms_ggemm_wgrad_bf16's run_rows): a quarter
 * above the experts' mean, so that an expert near the mean is one run,
 * one block summing its whole rows (no partials, no second kernel), and
 * only one far above it is cut, into runs near the mean, up to
 * MS_GMODEL_WGRAD_SPLIT (tools/bench/wgrad_probe.cu on the H200, 64
 * experts of 956 .. 1114 rows: gate/up's gB took 0.112 ms with every
 * expert cut in four, 0.071 whole; the down input's gA 0.062 and 0.041) */
static uint32_t wgrad_run_rows(const uint32_t *cnt, uint32_t E)
{
	uint64_t sum = 0;
	for (uint32_t e = 0; e < E; e++)
		sum += cnt[e];
	uint64_t r = (5 * sum + 4 * (uint64_t)E - 1) / (4 * (uint64_t)E);
	return r < 32 ? 32 : r > 0xffffffffull ? 0xffffffffu : (uint32_t)r;
}

/* the launch of gB_e += s dY_e^T U_e (dY: the twin, row stride ld; Us:
 * fold_u's U) that fold_wgrad and fold_du_gb both make */
static struct ms_ggemm_wgrad_bf16 wgrad_b(const struct ms_gmodel *g, const struct dlora *L,
					   const uint32_t *cnt, const __nv_bfloat16 *dY,
					   uint32_t ld, const __nv_bfloat16 *Us)
{
	struct ms_ggemm_wgrad_bf16 wb = {L->E, L->r, L->out, g->dpad, Us, L->r, dY, ld, L->gB,
					 (uint64_t)L->out * L->r, 1, g->lscale, 1, NULL, 1,
					 MS_GMODEL_WGRAD_SPLIT, g->wpart, wgrad_run_rows(cnt, L->E)};
	return wb;
}

/*
 * backward: gB_e += s dY_e^T U_e and gA_e += dU_e^T X_e, bf16 operands and
 * float32 gradients, each one launch over every expert's own rows
 * (ms_ggemm_wgrad_bf16, tensor cores); an expert well above the mean's
 * rows cut into up to MS_GMODEL_WGRAD_SPLIT runs (wgrad_run_rows) whose
 * partials a second kernel sums in order (with one block an expert's
 * whole rows, the most loaded expert set the time: 17.0 -> 9.8 ms a step
 * on the H200 bench with an earlier kernel and every expert cut in
 * four). cuBLAS offered neither in one launch: it groups bf16 products
 * only into a bf16 result, and its batched form wants one shape, which
 * took either a launch per distinct row count (host-bound: the bench
 * model's experts have many) or the rows cut into equal chunks with
 * partial sums (23.6 ms a step on the H200 for what reads 1.2 GB a
 * layer). dY: the twin (row stride ld, dU in its last
 * r columns); Us: fold_u's U; Xb: the input, row stride xld, its row i
 * xperm[i] / K where xperm is given (the tokens, not gathered); dUs (row
 * stride ldus): gA's dU where it is not dY's tail; which:
 * WG_B, WG_A or both (fold_ga_gu gives gate/up's gA, fold_gb_dn the down
 * adapter's gB, where the rank fills the folded width).
 */
static int fold_wgrad(struct ms_gmodel *g, const struct dlora *L, const uint32_t *cnt,
		      const __nv_bfloat16 *dY, uint32_t ld, const __nv_bfloat16 *Us,
		      const __nv_bfloat16 *Xb, uint32_t xld, const int32_t *xperm, int which,
		      struct ms_err *err, const __nv_bfloat16 *dUs = NULL, uint32_t ldus = 0)
{
	int rc;
	uint32_t E = L->E, r = L->r, in = L->in, rr = wgrad_run_rows(cnt, E);
	struct ms_ggemm_wgrad_bf16 wb = wgrad_b(g, L, cnt, dY, ld, Us);
	struct ms_ggemm_wgrad_bf16 wa = {E, r, in, g->dpad, dUs ? dUs : dY + L->out,
					 dUs ? ldus : ld, Xb, xld, L->gA,
					 (uint64_t)r * in, 0, 1.0f, 1, xperm, g->K,
					 MS_GMODEL_WGRAD_SPLIT, g->wpart, rr};
	if ((rc = offsets_up(g, cnt, err)))
		return rc;
	site(g, -2);
	if ((which & WG_B) && (rc = ms_ggemm_wgrad_bf16(&wb, g->st, err)))
		return rc;
	if (which & WG_B)
		site(g, SK_WGRAD_BF16);
	if ((which & WG_A) && (rc = ms_ggemm_wgrad_bf16(&wa, g->st, err)))
		return rc;
	if (which & WG_A)
		site(g, SK_WGRAD_BF16);
	return MS_OK;
}

/*
 * backward, gate/up: fold_du's dU = s dY B and fold_wgrad's gB += s dY^T
 * U in one pass over the twin dY (ms_ggemm_wgrad_bf16 with its DU), where
 * each read dY's [T K, out] rows on its own (201 MB a layer on the bench
 * model); the column slices' partial dU in dgu, unused by the folded path
 * until the shared experts' backward. *done 0 (nothing launched): a
 * shape it does not cover, fold_du and fold_wgrad's WG_B then as before.
 */
static int fold_du_gb(struct ms_gmodel *g, const struct dlora *L, const uint32_t *cnt,
		      const void *dY, uint32_t ld, const __nv_bfloat16 *Us, int *done,
		      struct ms_err *err)
{
	int rc = MS_OK;
	uint32_t E = L->E, r = L->r, out = L->out, fr = fold_width(r);
	uint64_t TK = (uint64_t)g->T * g->K, n = (uint64_t)E * out * fr;
	*done = 0;
	if (g->f32 || !out || out % 8 || ld % 8 || (uintptr_t)dY % 16 ||
	    r > MS_GGEMM_WGRAD_BF16_MAX_R || ms_ggemm_wgrad_bf16_dpart(out, r, TK) > g->dgu_n)
		return MS_OK;
	struct ms_ggemm_wgrad_bf16 wb =
		wgrad_b(g, L, cnt, (const __nv_bfloat16 *)dY, ld, Us);
	wb.w = g->fab, wb.ldw = fr, wb.wstride = (uint64_t)out * fr;
	wb.du = (char *)dY + (uint64_t)out * 2, wb.lddu = ld, wb.dalpha = g->lscale;
	wb.dpart = g->dgu, wb.drows = TK;
	k_pad_factor<<<nblk(n), NTH, 0, g->st>>>(L->B, g->fab, E, out, r, out, fr);
	LK();
	if ((rc = offsets_up(g, cnt, err)))
		return rc;
	site(g, -2);
	if ((rc = ms_ggemm_wgrad_bf16(&wb, g->st, err)))
		return rc;
	site(g, SK_WGRAD_DU);
	*done = 1;
out:
	return rc;
}

static int layer_fwd(struct ms_gmodel *g, const struct ms_model *m, uint32_t l, float *xout,
		     const struct kvdec *dc, struct ms_err *err)
{
	struct dlayer *d = &g->ly[l];
	struct dacts *a = &g->a[l];
	uint64_t T = g->T, H = g->H, F = g->F, r = g->r;
	const void *X = NULL;
	const float *xl;
	__nv_bfloat16 *h2b;
	int rc;

	if ((rc = decode_unit(g, l, 0, err)))
		return rc;
	ph(g, PH_NORM);
	/* the projections' bf16 operand written by the norm (twin_buf) */
	rms_in(g, T, a->x, d->ln1, a->h1, a->r1, (uint32_t)H, (float)m->cfg.rms_eps,
	       twin_buf(g), (uint32_t)(H + d->afr));
	LK();
	if (d->afr) {
		ph(g, PH_ATT_LORA);
		if ((rc = att_fold_u(g, d, a, err)))
			return rc;
	}
	ph(g, PH_ATT_PROJ);
	X = twin_of(g, a->h1);
	/* v16: cuDNN reads V in bf16 and nothing reads the float32 one (no
	 * separate v LoRA adds to it): the GEMM writes bf16 there, no cast */
	g->v16 = g->cudnn && !dc && !(d->lv && !d->afr) && !d->v.bias;
	if ((rc = lin_fwd(g, &d->q, X, T, a->q0, 0, err)) ||
	    (rc = lin_fwd(g, &d->k, X, T, a->k0, 0, err)))
		return rc;
	if (g->v16) {
		struct gctx c = main_ctx(g);
		if ((rc = lin_fwd_on(g, &c, &d->v, X, T, att16_v(g, a), 0, CUDA_R_16BF, err)))
			return rc;
	} else if ((rc = lin_fwd(g, &d->v, X, T, a->v, 0, err))) {
		return rc;
	}
	ph(g, PH_ATT_LORA);
	{
		struct dlora *ls[3] = {d->lq, d->lk, d->lv};
		float *us[3] = {a->uq, a->uk, a->uv}, *ys[3] = {a->q0, a->k0, a->v};
		for (int i = 0; i < 3 && !d->afr; i++) {
			if (!ls[i])
				continue;
			if ((rc = lora_in(g, ls[i], a->h1, T, NULL, g->xsd, &xl, err)) ||
			    (rc = lora_fwd(g, ls[i], 0, xl, T, us[i], ys[i], err)))
				return rc;
		}
	}
	ph(g, PH_NORM);
	{
		const float *qs = a->q0, *ks = a->k0;
		uint32_t half = m->cfg.rotary_dim / 2;
		/* a decode (S = 1) reads the tables' row of its position */
		const float *rcs = g->rope_c + (dc ? (uint64_t)dc->pos * half : 0);
		const float *rsn = g->rope_s + (dc ? (uint64_t)dc->pos * half : 0);
		int nr = d->qn && g->hd <= NR_MAXN, a16 = g->cudnn && !dc;
		/* cuDNN's operands: Q and K in bf16 (att16_q), or, past the
		 * fused kernel, RoPE's float32 output in dq0 / dk0 (backward
		 * scratch, free here) cast there */
		float *yq = a16 ? g->dq0 : a->q, *yk = a16 ? g->dk0 : a->k;
		if (nr && a16) {
			norm_rope(g->st, a->q0, d->qn, att16_q(g, a), a->rq, T * g->nh, g->hd,
				  g->nh, half, g->S, rcs, rsn, (float)m->cfg.rms_eps);
			LK();
			norm_rope(g->st, a->k0, d->kn, att16_k(g, a), a->rk, T * g->nkv, g->hd,
				  g->nkv, half, g->S, rcs, rsn, (float)m->cfg.rms_eps);
			LK();
		} else if (nr) {
			norm_rope(g->st, a->q0, d->qn, a->q, a->rq, T * g->nh, g->hd, g->nh, half,
				  g->S, rcs, rsn, (float)m->cfg.rms_eps);
			LK();
			norm_rope(g->st, a->k0, d->kn, a->k, a->rk, T * g->nkv, g->hd, g->nkv, half,
				  g->S, rcs, rsn, (float)m->cfg.rms_eps);
			LK();
		} else if (d->qn) {
			k_rms_rows<<<nblk(T * g->nh, NTH / 32), NTH, 0, g->st>>>(
				a->q0, d->qn, g->dqv, a->rq, T * g->nh, g->hd, (float)m->cfg.rms_eps);
			LK();
			k_rms_rows<<<nblk(T * g->nkv, NTH / 32), NTH, 0, g->st>>>(
				a->k0, d->kn, g->dkk, a->rk, T * g->nkv, g->hd, (float)m->cfg.rms_eps);
			LK();
			qs = g->dqv;
			ks = g->dkk;
		}
		if (!nr && ((rc = rope(g, qs, yq, (uint32_t)T, g->nh, half, rcs, rsn, 0, err)) ||
			    (rc = rope(g, ks, yk, (uint32_t)T, g->nkv, half, rcs, rsn, 0, err))))
			return rc;
		if (!nr && a16) {
			k_cast<__nv_bfloat16><<<cast_blocks(T * g->dq), NTH, 0, g->st>>>(
				yq, att16_q(g, a), T * g->dq);
			LK();
			k_cast<__nv_bfloat16><<<cast_blocks(T * g->dkv), NTH, 0, g->st>>>(
				yk, att16_k(g, a), T * g->dkv);
			LK();
		}
	}
	if ((rc = dec_kick(g, err)))
		return rc;
	ph(g, PH_ATT_CORE);
	if ((rc = dc ? att_decode(g, a, dc, err) : att_core(g, a, 0, !!d->lo, err)))
		return rc;
	ph(g, PH_ATT_PROJ);
	/* cuDNN's bf16 context: O, kept for the backward */
	if (g->cudnn && !dc)
		X = att16_o(g, a);
	else if ((rc = opnd(g, a->ctx, T * g->dq, g->cA, &X, err)))
		return rc;
	if ((rc = lin_fwd(g, &d->o, X, T, g->y, 0, err)))
		return rc;
	ph(g, PH_ATT_LORA);
	if (d->lo && ((rc = lora_in(g, d->lo, a->ctx, T, NULL, g->xsd, &xl, err)) ||
		      (rc = lora_fwd(g, d->lo, 0, xl, T, a->uo, g->y, err))))
		return rc;
	ph(g, PH_ATT_PROJ);
	ph(g, PH_NORM);
	/* a folded MoE layer gathers its experts' rows from h2's bf16 copy,
	 * which it keeps for the backward (h2b); the residual x2 = x + y
	 * summed by the norm */
	h2b = d->moe && g->E && d->egu[0].fr ? a->h2b : NULL;
	rms_fwd(g, T, a->x, d->ln2, a->h2, a->r2, (uint32_t)H, (float)m->cfg.rms_eps, h2b, 0,
		g->y, a->x2);
	LK();
	if (d->moe) {
		uint64_t TK = T * g->K;
		struct rcfg rc_ = rcfg_of(m);
		uint32_t off = 0;
		const float *al;
		ph(g, PH_ROUTE);
		if (g->f32) {
			/* model.c's order, so the test mode routes as the CPU */
			k_router_logits<<<nblk(T * g->E), NTH, 0, g->st>>>(a->h2, d->router, g->dz,
									    (uint32_t)T, g->E,
									    (uint32_t)H);
			LK();
		} else if (ms_router_ok(a->h2, d->router, (uint32_t)H)) {
			/* router.h: cuBLAS's float32 GEMM at N = E far slower */
			if ((rc = ms_router_logits(a->h2, d->router, g->dz, (uint32_t)T, g->E,
						   (uint32_t)H, g->st, err)))
				return rc;
			site(g, SK_ROUTER);
		} else if ((rc = gemm(g, 0, 1, (uint32_t)T, g->E, (uint32_t)H, 1.0f, a->h2,
				      (uint32_t)H, d->router, (uint32_t)H, 0.0f, g->dz, g->E,
				      CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC, err))) {
			return rc;
		}
		ph(g, PH_TOPK);
		k_route<<<(unsigned)((T + RW - 1) / RW), 32 * RW, RW * g->E * 16, g->st>>>(
			rc_, g->dz, d->ecb, a->probs, a->sel, a->wts, (uint32_t)T);
		LK();
		ph(g, PH_SORT);
		/* the float32 test mode keeps the host's running sum */
		if ((rc = g->f32 ? moe_sort(g, a, err)
				 : moe_route_dev(g, a, g->grouped ? a->goff : (uint32_t *)g->dpad,
						 err)))
			return rc;
		/* folded (fr): the twins have fr more columns, U's; the
		 * float32 copy only the separate LoRA reads is not made */
		uint32_t fr = g->E ? d->egu[0].fr : 0;
		uint64_t ldx = H + fr, lda = F + fr;
		if (h2b) {
			k_dispatch<<<rows_grid(T), NTH, 0, g->st>>>(
				h2b, a->pos, g->K, (__nv_bfloat16 *)NULL, twin_buf(g), T,
				(uint32_t)H, (uint32_t)ldx);
			LK();
		} else {
			k_gather<<<rows_grid((TK + GATHER_ROWS - 1) / GATHER_ROWS), NTH, 0,
				   g->st>>>(a->h2, a->perm, g->K, fr ? NULL : g->xs, twin_buf(g),
					    TK, (uint32_t)H, (uint32_t)ldx);
			LK();
		}
		ph(g, PH_EXPERTS);
		X = twin_of(g, g->xs);
		if ((rc = lora_in(g, d->lgu, g->xs, TK, a->perm, g->xsd, &xl, err)))
			return rc;
		if (fr) {
			ph(g, PH_LORA);
			if ((rc = egemm_counts(g, err)) ||
			    (rc = fold_u_gu(g, d->lgu, a, h2b, (void *)X, (uint32_t)ldx, a->ugu,
					    err)))
				return rc;
			ph(g, PH_EXPERTS);
		}
		if (g->grouped && (rc = egemm(g, d, a, 0, X, 2 * g->F, g->H, a->gu, err)))
			return rc;
		if (!g->grouped && (rc = egemm_counts(g, err)))
			return rc;
		if (!g->grouped && !g->f32 &&
		    (rc = expert_product(g, d->egu, 0, a->cnt, X, ldx, a->gu, 2 * F, fr > 0, err)))
			return rc;
		for (uint32_t e = 0; e < g->E && !g->grouped && g->f32; e++) {
			uint32_t n = a->cnt[e];
			if (n && ((rc = lin_fwd(g, &d->egu[e], OFF(X, (uint64_t)off * ldx), bucket(n),
						a->gu + (uint64_t)off * 2 * F, 0, err)) ||
				  (d->lgu && g->f32 &&
				   (rc = lora_fwd(g, d->lgu, e, xl + (uint64_t)off * H, n,
							    a->ugu + (uint64_t)off * r,
							    a->gu + (uint64_t)off * 2 * F, err)))))
				return rc;
			off += n;
		}
		/* the bf16 path adds every expert's LoRA in two grouped launches */
		ph(g, PH_LORA);
		if ((rc = egemm_counts(g, err)) ||
		    (d->lgu && !g->f32 && !fr &&
		     (rc = lora_fwd_grouped(g, d->lgu, a->cnt, g->grouped ? a->goff : NULL, xl,
					     a->ugu, a->gu, err))))
			return rc;
		ph(g, PH_EXPERTS);
		if (fr)
			/* written once, into actb: the backward's kept copy and
			 * the down GEMM's operand (row stride lda) */
			k_swiglu<<<swiglu_grid(TK, F), NTH, 0, g->st>>>((const __nv_bfloat16 *)a->gu,
								    (float *)NULL,
								    (__nv_bfloat16 *)NULL, a->actb,
								    TK, (uint32_t)F, (uint32_t)lda);
		else
			k_swiglu<<<swiglu_grid(TK, F), NTH, 0, g->st>>>(a->gu, a->act, a->actb,
								    twin_buf(g), TK, (uint32_t)F,
								    (uint32_t)lda);
		LK();
		X = fr ? (const void *)a->actb : a->act ? twin_of(g, a->act) : twin_buf(g);
		if ((rc = lora_in(g, d->ldn, a->act, TK, a->perm, g->actd, &al, err)))
			return rc;
		if (fr) {
			ph(g, PH_LORA);
			if ((rc = fold_u(g, d->ldn, a->cnt, X, (uint32_t)lda, a->udn, TK, err)))
				return rc;
			ph(g, PH_EXPERTS);
		}
		if (g->grouped && (rc = egemm(g, d, a, 1, X, g->H, g->F, a->ye, err)))
			return rc;
		if (!g->grouped && !g->f32 &&
		    (rc = expert_product(g, d->edn, 0, a->cnt, X, lda, a->ye, H, fr > 0, err)))
			return rc;
		off = 0;
		for (uint32_t e = 0; e < g->E && !g->grouped && g->f32; e++) {
			uint32_t n = a->cnt[e];
			if (n && ((rc = lin_fwd(g, &d->edn[e], OFF(X, (uint64_t)off * lda), bucket(n),
						a->ye + (uint64_t)off * H, 0, err)) ||
				  (d->ldn && g->f32 &&
				   (rc = lora_fwd(g, d->ldn, e, al + (uint64_t)off * F, n,
							    a->udn + (uint64_t)off * r,
							    a->ye + (uint64_t)off * H, err)))))
				return rc;
			off += n;
		}
		ph(g, PH_LORA);
		if (d->ldn && !g->f32 && !fr &&
		    (rc = lora_fwd_grouped(g, d->ldn, a->cnt, g->grouped ? a->goff : NULL, al,
					    a->udn, a->ye, err)))
			return rc;
		ph(g, PH_COMBINE);
		/* folded without shared experts: the combine is left to the
		 * next norm (pend_ye, below) */
		if (fr && d->sh)
			k_slot_sum<<<rows_grid(T), NTH, 0, g->st>>>((const __nv_bfloat16 *)a->ye,
								   a->pos, a->wts, g->y, (uint32_t)T,
								   g->K, (uint32_t)H, 0);
		else if (!fr)
			k_slot_sum<<<rows_grid(T), NTH, 0, g->st>>>(a->ye, a->pos, a->wts, g->y,
								   (uint32_t)T, g->K, (uint32_t)H, 0);
		LK();
	}
	if (d->sh) {
		uint32_t Fs = d->sgu.out / 2;
		ph(g, PH_SHARED);
		if ((rc = opnd(g, a->h2, T * H, g->cA, &X, err)) ||
		    (rc = lin_fwd(g, &d->sgu, X, T, a->sgu, 0, err)))
			return rc;
		k_swiglu<<<swiglu_grid(T, Fs), NTH, 0, g->st>>>(a->sgu, a->sact, NULL, twin_buf(g),
								T, Fs, Fs);
		LK();
		if ((rc = lin_fwd(g, &d->sdn, twin_of(g, a->sact), T, d->moe ? g->y2 : g->y, 0,
				  err)))
			return rc;
		if (d->moe) {
			k_add<<<nblk(T * H), NTH, 0, g->st>>>(g->y, g->y, g->y2, T * H);
			LK();
		}
	} else if (!d->moe) {
		CK(cudaMemsetAsync(g->y, 0, T * H * 4, g->st));
	}
	/* xout = x2 + y: done by the next norm (rms_in), which reads both
	 * anyway, where it would read xout (one pass less over the rows) */
	g->pend_src = a->x2;
	g->pend_dst = xout;
	g->pend_ye = NULL;
	if (d->moe && g->E && d->egu[0].fr && !d->sh) {
		g->pend_ye = (const __nv_bfloat16 *)a->ye;
		g->pend_pos = a->pos;
		g->pend_w = a->wts;
	}
out:
	return rc;
}

/* a MoE layer's router backward from the combine weights' gradient dw:
 * dz, then its input gradient into dh2 (set) */
static int route_bwd(struct ms_gmodel *g, const struct dlayer *d, const struct dacts *a,
		     struct rcfg rc_, struct ms_err *err)
{
	int rc = MS_OK;
	uint64_t T = g->T, H = g->H;
	ph(g, PH_B_ROUTER);
	k_route_bwd<<<nblk(T, 64), 64, 0, g->st>>>(rc_, a->probs, a->sel, a->wts, g->dw, g->dz,
						   (uint32_t)T);
	LK();
	if (!g->f32 && ms_router_dgrad_ok(d->router, g->dh2, (uint32_t)H)) {
		/* router.h: cuBLAS's float32 GEMM of K = E host-bound */
		site(g, -2);
		if ((rc = ms_router_dgrad(g->dz, d->router, g->dh2, (uint32_t)T, g->E,
					  (uint32_t)H, g->st, err)))
			return rc;
		site(g, SK_ROUTER_DGRAD);
	} else if ((rc = gemm(g, 0, 0, (uint32_t)T, (uint32_t)H, g->E, 1.0f, g->dz, g->E,
			      d->router, (uint32_t)H, 0.0f, g->dh2, (uint32_t)H, CUDA_R_32F,
			      CUBLAS_COMPUTE_32F_PEDANTIC, err))) {
		return rc;
	}
out:
	return rc;
}

static int layer_bwd(struct ms_gmodel *g, const struct ms_model *m, uint32_t l,
		     const float *dxo, float *dxi, struct ms_err *err)
{
	struct dlayer *d = &g->ly[l];
	struct dacts *a = &g->a[l];
	uint64_t T = g->T, H = g->H, F = g->F, r = g->r;
	const void *X = NULL;
	const float *xl;
	int rc;

	if ((rc = decode_unit(g, l, 1, err)))
		return rc;
	if (d->moe) {
		uint64_t TK = T * g->K;
		struct rcfg rc_ = rcfg_of(m);
		uint32_t off = 0;
		const float *al;
		ph(g, PH_B_ROUTE);
		/* dye's bf16 twin in cA: the expert dgrad's operand (nothing
		 * writes cA before it reads it); folded (fr), fr columns
		 * wider (dU's) and no float32 copy */
		uint32_t fr = g->E ? d->egu[0].fr : 0;
		uint64_t ldy = H + fr, ldg = 2 * F + fr;
		__nv_bfloat16 *xb = (__nv_bfloat16 *)g->xs;
		if (fr) {
			/* folded: dxo in bf16 (the down LoRA's dU and gB read
			 * it) and its rows gathered into the twin as they are,
			 * unweighted: the routing weights and their gradient
			 * come after the down dgrad (k_swiglu_bwd_dw), so no
			 * pass reads the experts' outputs ye */
			k_dispatch<<<rows_grid(T), NTH, 0, g->st>>>(dxo, a->pos, g->K, xb,
								    twin_buf(g), T, (uint32_t)H,
								    (uint32_t)ldy);
			LK();
		} else {
			k_combine_bwd<<<(unsigned)T, NTH, 0, g->st>>>(dxo, a->ye, a->pos, a->wts,
								      g->dye, twin_buf(g), g->dw,
								      g->K, (uint32_t)H,
								      (uint32_t)ldy);
			LK();
		}
		if (!fr && (rc = route_bwd(g, d, a, rc_, err)))
			return rc;
		ph(g, PH_B_EXPERTS);
		if (!fr) {
			k_gather<<<rows_grid((TK + GATHER_ROWS - 1) / GATHER_ROWS), NTH, 0,
				   g->st>>>(a->h2, a->perm, g->K, g->xs, NULL, TK, (uint32_t)H,
					    (uint32_t)H);
			LK();
		}
		X = twin_of(g, g->dye);
		if ((rc = lora_in(g, d->lgu, g->xs, TK, a->perm, g->xsd, &xl, err)) ||
		    (rc = lora_in(g, d->ldn, a->act, TK, a->perm, g->actd, &al, err)))
			return rc;
		if (fr) {
			ph(g, PH_B_LORA);
			if ((rc = fold_du_dn(g, d->ldn, a, xb, (void *)X, (uint32_t)ldy,
					     (__nv_bfloat16 *)g->up, err)))
				return rc;
			ph(g, PH_B_EXPERTS);
		}
		if (g->grouped && (rc = egemm(g, d, a, 3, X, g->F, g->H, g->dact, err)))
			return rc;
		if (!g->grouped && !g->f32 &&
		    (rc = expert_product(g, d->edn, 1, a->cnt, X, ldy, g->dact, F, fr > 0, err)))
			return rc;
		for (uint32_t e = 0; e < g->E && !g->grouped && g->f32; e++) {
			uint32_t n = a->cnt[e];
			if (n && ((rc = lin_dgrad(g, &d->edn[e], OFF(X, (uint64_t)off * ldy), bucket(n),
						  g->dact + (uint64_t)off * F, 0, err)) ||
				  (d->ldn && g->f32 &&
				   (rc = lora_bwd(g, d->ldn, e, al + (uint64_t)off * F,
						  a->udn + (uint64_t)off * r, g->dye + (uint64_t)off * H,
						  n, g->dact + (uint64_t)off * F, a->perm + off,
						  err)))))
				return rc;
			off += n;
		}

		ph(g, fr ? PH_B_LORA_GRAD : PH_B_LORA);
		if (fr) {
			/* the adapter's gradients read act in bf16, as the
			 * forward kept it; gB over every token at once where
			 * the rank fills the folded width (fold_gb_dn: dy in
			 * bf16 is still in xb), else by expert rows */
			int dense = g->r == fr;
			/* the twin's rows are dy's unweighted: gB from U
			 * times each row's weight (Uw), gA from the weighted
			 * compact dU fold_du_dn left in up */
			__nv_bfloat16 *Uw = (__nv_bfloat16 *)g->dup;
			if (!dense) {
				k_wrows<<<nblk(TK * r), NTH, 0, g->st>>>(
					(const __nv_bfloat16 *)a->udn, a->perm, a->wts, Uw, TK,
					(uint32_t)r);
				LK();
			}
			if ((rc = fold_wgrad(g, d->ldn, a->cnt, (const __nv_bfloat16 *)g->cA,
					     (uint32_t)ldy, Uw, a->actb, (uint32_t)(F + fr), NULL,
					     dense ? WG_A : WG_A | WG_B, err,
					     (const __nv_bfloat16 *)g->up, (uint32_t)r)) ||
			    (dense && (rc = fold_gb_dn(g, d->ldn, a, xb, err))))
				return rc;
		} else if (d->ldn && !g->f32 &&
			   (rc = lora_bwd_experts(g, d->ldn, a->cnt, g->grouped ? a->goff : NULL,
						  al, a->udn, g->dye, g->dact, a->perm, TK, err))) {
			return rc;
		}
		ph(g, PH_B_EXPERTS);
		/* a check each: the profile's sites tell the two kernels apart */
		if (fr) {
			k_swiglu_bwd_dw<<<nblk(TK, NTH / 32), NTH, 0, g->st>>>(
				(const __nv_bfloat16 *)g->dact, (const __nv_bfloat16 *)a->gu, a->perm,
				a->wts, g->dw, twin_buf(g), TK, (uint32_t)F, (uint32_t)ldg);
			LK();
		} else {
			k_swiglu_bwd<<<swiglu_grid(TK, F), NTH, 0, g->st>>>(g->dact, a->gu, g->dgu,
									twin_buf(g), TK, (uint32_t)F,
									(uint32_t)ldg);
			LK();
		}
		if (fr && (rc = route_bwd(g, d, a, rc_, err)))
			return rc;
		X = twin_of(g, g->dgu);
		int gbdone = 0;
		if (fr) {
			/* gB with dU where the shape allows (fold_du_gb) */
			ph(g, PH_B_LORA_GRAD);
			if ((rc = fold_du_gb(g, d->lgu, a->cnt, X, (uint32_t)ldg,
					     (const __nv_bfloat16 *)a->ugu, &gbdone, err)))
				return rc;
			if (!gbdone) {
				ph(g, PH_B_LORA);
				if ((rc = fold_du(g, d->lgu, a->cnt, X, (uint32_t)ldg, err)))
					return rc;
			}
			ph(g, PH_B_EXPERTS);
		}
		if (g->grouped && (rc = egemm(g, d, a, 2, X, g->H, 2 * g->F, g->dxs, err)))
			return rc;
		if (!g->grouped && !g->f32 &&
		    (rc = expert_product(g, d->egu, 1, a->cnt, X, ldg, g->dxs, H, fr > 0, err)))
			return rc;
		off = 0;
		for (uint32_t e = 0; e < g->E && !g->grouped && g->f32; e++) {
			uint32_t n = a->cnt[e];
			if (n && ((rc = lin_dgrad(g, &d->egu[e], OFF(X, (uint64_t)off * ldg), bucket(n),
						  g->dxs + (uint64_t)off * H, 0, err)) ||
				  (d->lgu && g->f32 &&
				   (rc = lora_bwd(g, d->lgu, e, xl + (uint64_t)off * H,
						  a->ugu + (uint64_t)off * r,
						  g->dgu + (uint64_t)off * 2 * F, n,
						  g->dxs + (uint64_t)off * H, a->perm + off, err)))))
				return rc;
			off += n;
		}

		ph(g, fr ? PH_B_LORA_GRAD : PH_B_LORA);
		if (fr) {
			/* the input's tokens in bf16 (the forward's h2b), read
			 * by the expert rows through the permutation (no
			 * gathered copy); gA over every token at once where
			 * the rank fills the folded width (fold_ga_gu), else
			 * by expert rows */
			int dense = g->r == fr;
			int which = (dense ? 0 : WG_A) | (gbdone ? 0 : WG_B);
			if ((which &&
			     (rc = fold_wgrad(g, d->lgu, a->cnt, (const __nv_bfloat16 *)g->cA,
					      (uint32_t)ldg, (const __nv_bfloat16 *)a->ugu, a->h2b,
					      (uint32_t)H, a->perm, which, err))) ||
			    (dense &&
			     (rc = fold_ga_gu(g, d->lgu, a, g->cA, (uint32_t)ldg, a->h2b, err))))
				return rc;
		} else if (d->lgu && !g->f32 &&
			   (rc = lora_bwd_experts(g, d->lgu, a->cnt, g->grouped ? a->goff : NULL,
						  xl, a->ugu, g->dgu, g->dxs, a->perm, TK, err))) {
			return rc;
		}
		ph(g, PH_B_UNPERM);
		/* folded without shared experts: the ln2 norm's backward sums
		 * the slots itself (rms_bwd's ss, below) */
		if (fr && d->sh)
			k_slot_sum<<<rows_grid(T), NTH, 0, g->st>>>((const __nv_bfloat16 *)g->dxs,
								   a->pos, (const float *)NULL, g->dh2,
								   (uint32_t)T, g->K, (uint32_t)H, 1);
		else if (!fr)
			k_slot_sum<<<rows_grid(T), NTH, 0, g->st>>>(g->dxs, a->pos,
								   (const float *)NULL, g->dh2,
								   (uint32_t)T, g->K, (uint32_t)H, 1);
		LK();
	} else {
		CK(cudaMemsetAsync(g->dh2, 0, T * H * 4, g->st));
	}
	if (d->sh) {
		uint32_t Fs = d->sgu.out / 2;
		ph(g, PH_B_SHARED);
		if ((rc = opnd(g, dxo, T * H, g->cA, &X, err)) ||
		    (rc = lin_dgrad(g, &d->sdn, X, T, g->dact, 0, err)))
			return rc;
		k_swiglu_bwd<<<swiglu_grid(T, Fs), NTH, 0, g->st>>>(g->dact, a->sgu, g->dgu,
								    twin_buf(g), T, Fs, 2 * Fs);
		LK();
		if ((rc = lin_dgrad(g, &d->sgu, twin_of(g, g->dgu), T, g->dh2, 1.0f, err)))
			return rc;
	}
	ph(g, PH_B_NORM);
	/* and dx2's bf16 copy, the o projection's dgrad operand; a folded
	 * MoE layer's unpermute (without shared experts, whose gradient dh2
	 * has by now) summed here */
	{
		int us = d->moe && g->E && d->egu[0].fr && !d->sh;
		rms_bwd(g, T, a->x2, d->ln2, a->r2, g->dh2, dxo, g->dx2, (uint32_t)H, twin_buf(g),
			us ? (const __nv_bfloat16 *)g->dxs : NULL, us ? a->pos : NULL,
			us ? g->K : 0);
	}
	LK();
	ph(g, PH_B_ATT_PROJ);
	/* where only cuDNN reads dctx (no o LoRA), its GEMM writes it in
	 * bf16, cuDNN's dO (in cB, free on that path): no float32 copy and
	 * no cast pass */
	g->do16 = g->cudnn && !d->lo ? g->cB : NULL;
	X = twin_of(g, g->dx2);
	if (g->do16) {
		struct gctx c = main_ctx(g);
		if ((rc = lin_dgrad_on(g, &c, &d->o, X, T, g->do16, 0, CUDA_R_16BF, err)))
			return rc;
	} else if ((rc = lin_dgrad(g, &d->o, X, T, g->dctx, 0, err))) {
		return rc;
	}
	ph(g, PH_B_ATT_LORA);
	if (d->lo && ((rc = lora_in(g, d->lo, a->ctx, T, NULL, g->xsd, &xl, err)) ||
		      (rc = lora_bwd(g, d->lo, 0, xl, a->uo, g->dx2, T, g->dctx, NULL, err))))
		return rc;
	if ((rc = dec_kick(g, err)))
		return rc;
	ph(g, PH_B_ATT_CORE);
	/* dv16: cuDNN's bf16 dQ, dK (through the fused RoPE and norm
	 * backward) and dV go straight into the qkv3 GEMM's bf16 operand,
	 * where no float32 copy is read after (the q/k/v LoRA folded or
	 * absent): no widening of dV and no concatenating pass, the same
	 * bf16 values */
	g->dv16 = d->qkv3 && g->cudnn && d->qn && g->hd <= NR_MAXN &&
		  (d->afr || (!d->lq && !d->lk && !d->lv));
	if ((rc = att_core(g, a, 1, !!d->lo, err)))
		return rc;
	ph(g, PH_B_NORM);
	{
		uint32_t half = m->cfg.rotary_dim / 2;
		if (d->qn && g->hd <= NR_MAXN) {
			/* k_rope_norm_bwd: the RoPE backward of the attention's dQ /
			 * dK (rope_bwd's sources) and the norm's, into dq0 / dk0 */
			uint64_t rq = T * g->nh, rk = T * g->nkv;
			if (g->dv16) {
				/* bf16, straight into the qkv3 GEMM's operand */
				const __nv_bfloat16 *o = (const __nv_bfloat16 *)g->sdb;
				__nv_bfloat16 *c = (__nv_bfloat16 *)g->cA;
				uint32_t w = g->dq + 2 * g->dkv + d->afr;
				rope_norm_bwd(g->st, o + T * g->dq, a->q0, d->qn, a->rq, c, rq, g->hd,
					      g->nh, half, g->S, g->rope_c, g->rope_s, w, 0);
				LK();
				rope_norm_bwd(g->st, o + 2 * T * g->dq, a->k0, d->kn, a->rk, c, rk,
					      g->hd, g->nkv, half, g->S, g->rope_c, g->rope_s, w,
					      g->dq);
				LK();
			} else if (g->cudnn) {
				const __nv_bfloat16 *o = (const __nv_bfloat16 *)g->sdb;
				rope_norm_bwd(g->st, o + T * g->dq, a->q0, d->qn, a->rq, g->dq0, rq,
					      g->hd, g->nh, half, g->S, g->rope_c, g->rope_s, g->dq, 0);
				LK();
				rope_norm_bwd(g->st, o + 2 * T * g->dq, a->k0, d->kn, a->rk, g->dk0, rk,
					      g->hd, g->nkv, half, g->S, g->rope_c, g->rope_s, g->dkv, 0);
				LK();
			} else {
				rope_norm_bwd(g->st, (const float *)g->dqv, a->q0, d->qn, a->rq, g->dq0,
					      rq, g->hd, g->nh, half, g->S, g->rope_c, g->rope_s, g->dq,
					      0);
				LK();
				rope_norm_bwd(g->st, (const float *)g->dkk, a->k0, d->kn, a->rk, g->dk0,
					      rk, g->hd, g->nkv, half, g->S, g->rope_c, g->rope_s,
					      g->dkv, 0);
				LK();
			}
		} else if ((rc = rope_bwd(g, 0, g->dq0, half, err)) ||
			   (rc = rope_bwd(g, 1, g->dk0, half, err))) {
			return rc;
		} else if (d->qn) {
			/* dq0 holds d(normed q); the norm's input gradient goes to
			 * dqv (set, not accumulated), and the two scratch buffers
			 * (the same size) trade names, so dq0 holds it after */
			float *t;
			k_rms_bwd_rows<<<nblk(T * g->nh, NTH / 32), NTH, 0, g->st>>>(
				a->q0, d->qn, a->rq, g->dq0, g->dqv, T * g->nh, g->hd);
			LK();
			k_rms_bwd_rows<<<nblk(T * g->nkv, NTH / 32), NTH, 0, g->st>>>(
				a->k0, d->kn, a->rk, g->dk0, g->dkk, T * g->nkv, g->hd);
			LK();
			t = g->dq0;
			g->dq0 = g->dqv;
			g->dqv = t;
			t = g->dk0;
			g->dk0 = g->dkk;
			g->dkk = t;
		}
	}
	ph(g, PH_B_ATT_PROJ);
	if (d->qkv3) {
		/* dh1 = [dq | dk | dv] [W_q^T | W_k^T | W_v^T]^T: one GEMM of
		 * K = q+k+v out, where three (two of K = kv out) each read
		 * and wrote dh1's floats again */
		uint32_t w0 = g->dq + 2 * g->dkv, w = w0 + d->afr;
		if (g->dv16) {
			/* dq and dk are there (k_rope_norm_bwd); dV from sdb */
			const __nv_bfloat16 *gv = (const __nv_bfloat16 *)g->sdb + 2 * T * g->dq +
						  T * g->dkv;
			CK(cudaMemcpy2DAsync((__nv_bfloat16 *)g->cA + g->dq + g->dkv,
					     (uint64_t)w * 2, gv, (uint64_t)g->dkv * 2,
					     (uint64_t)g->dkv * 2, T, cudaMemcpyDeviceToDevice,
					     g->st));
		} else {
			k_cat3<__nv_bfloat16><<<rows_grid(T), NTH, 0, g->st>>>(
				g->dq0, g->dk0, g->dvv, (__nv_bfloat16 *)g->cA, T, g->dq, g->dkv,
				g->dkv, w);
			LK();
		}
		if (d->afr) {
			/* the folded q/k/v LoRA's dU in the tail, its
			 * gradients; its dX in the GEMM below */
			ph(g, PH_B_ATT_LORA);
			if ((rc = att_fold_bwd(g, d, a, w0, w, err)))
				return rc;
			ph(g, PH_B_ATT_PROJ);
		}
		if ((rc = gemm(g, 0, 1, (uint32_t)T, d->q.in, w, 1.0f, g->cA, w, lin_w(g, &d->q, 1),
			       w, 0.0f, g->dh1, d->q.in, g->gt, g->ct_base, err)))
			return rc;
	} else if ((rc = opnd(g, g->dq0, T * g->dq, g->cA, &X, err)) ||
	    (rc = lin_dgrad(g, &d->q, X, T, g->dh1, 0, err)) ||
	    (rc = opnd(g, g->dk0, T * g->dkv, g->cA, &X, err)) ||
	    (rc = lin_dgrad(g, &d->k, X, T, g->dh1, 1.0f, err)) ||
	    (rc = opnd(g, g->dvv, T * g->dkv, g->cA, &X, err)) ||
	    (rc = lin_dgrad(g, &d->v, X, T, g->dh1, 1.0f, err)))
		return rc;
	ph(g, PH_B_ATT_LORA);
	{
		struct dlora *ls[3] = {d->lq, d->lk, d->lv};
		float *us[3] = {a->uq, a->uk, a->uv}, *dys[3] = {g->dq0, g->dk0, g->dvv};
		for (int i = 0; i < 3 && !d->afr; i++) {
			if (!ls[i])
				continue;
			if ((rc = lora_in(g, ls[i], a->h1, T, NULL, g->xsd, &xl, err)) ||
			    (rc = lora_bwd(g, ls[i], 0, xl, us[i], dys[i], T, g->dh1, NULL, err)))
				return rc;
		}
	}
	ph(g, PH_B_NORM);
	rms_bwd(g, T, a->x, d->ln1, a->r1, g->dh1, g->dx2, dxi, (uint32_t)H);
	LK();
out:
	return rc;
}

/* ---- the step ------------------------------------------------------------------- */

/* the RoPE tables on the device for n positions (model.c's, grown first) */
static int rope_ensure(struct ms_gmodel *g, struct ms_model *m, uint32_t n, struct ms_err *err)
{
	uint64_t k = (uint64_t)n * (m->cfg.rotary_dim / 2);
	int rc;
	if (m->rope_len >= n && g->rope_len >= n)
		return MS_OK;
	if ((rc = ms_model_rope(m, n, err)))
		return rc;
	dfree(g, g->rope_c, MC_DENSE);
	dfree(g, g->rope_s, MC_DENSE);
	g->rope_c = g->rope_s = NULL;
	g->rope_len = 0;
	if ((rc = up_f(g, m->rope_cos, k ? k : 1, &g->rope_c, MC_DENSE, err)) ||
	    (rc = up_f(g, m->rope_sin, k ? k : 1, &g->rope_s, MC_DENSE, err)))
		return rc;
	g->rope_len = n;
	return MS_OK;
}

int ms_gmodel_step(struct ms_model *m, const int32_t *ids, const uint8_t *loss_mask,
		   uint32_t batch, uint32_t seq, double grad_scale, uint64_t step,
		   ms_model_dlogits_fn fn, void *ctx, float *logits_out,
		   int backward, double *loss_sum, uint64_t *n_tokens,
		   struct ms_err *err)
{
	struct ms_gmodel *g = m->gpu;
	uint64_t T, H = g->H, V = g->V;
	const void *X = NULL;
	float *d, *d2;
	int rc, xbf = 0;

	if ((rc = ms_model_check_ids(m, ids, batch, seq, err)) ||
	    (rc = acts_alloc(g, m, batch, seq, err)))
		return rc;
	if ((rc = rope_ensure(g, m, seq, err)))
		return rc;
	T = g->T;
	g->train = backward;
	g->step = step;
	g->nev = 0;
	g->dnext = -1;
	g->dpend_l = -1;
	CK(cudaEventRecord(g->st0, g->st));
	g->pend_dst = NULL;
	g->pend_ye = NULL;
	ph(g, PH_COPY);
	CK(cudaMemcpyAsync(g->dids, ids, T * 4, cudaMemcpyHostToDevice, g->st));
	if (loss_mask)
		CK(cudaMemcpyAsync(g->dmask, loss_mask, T, cudaMemcpyHostToDevice, g->st));
	ph(g, PH_EMBED);
	k_embed<<<nblk(T * H), NTH, 0, g->st>>>(g->dids, g->embed, g->a[0].x, (uint32_t)T,
						(uint32_t)H);
	LK();
	for (uint32_t l = 0; l < g->L; l++)
		if ((rc = layer_fwd(g, m, l, l + 1 < g->L ? g->a[l + 1].x : g->xf, NULL, err)))
			goto out;
	ph(g, PH_NORM);
	rms_in(g, T, g->xf, g->norm, g->hf, g->rf, (uint32_t)H, (float)m->cfg.rms_eps);
	LK();
	ph(g, PH_HEAD);
	if ((rc = opnd(g, g->hf, T * H, g->cA, &X, err)) ||
	    (rc = gemm(g, 0, 1, (uint32_t)T, (uint32_t)V, (uint32_t)H, 1.0f, X, (uint32_t)H, g->lm,
		       (uint32_t)H, 0.0f, g->logits, (uint32_t)V, g->gt, g->ct_base, err)))
		goto out;
	if (!backward) {
		ph(g, PH_COPY);
		if (logits_out)
			CK(cudaMemcpyAsync(logits_out, g->logits, T * V * 4, cudaMemcpyDeviceToHost,
					   g->st));
		goto done;
	}
	if (fn) {
		/* a loss the caller defines over the logits (rl.h) */
		ph(g, PH_COPY);
		if (!g->hlog && !(g->hlog = (float *)malloc(T * V * 4))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		CK(cudaMemcpyAsync(g->hlog, g->logits, T * V * 4, cudaMemcpyDeviceToHost, g->st));
		CK(cudaStreamSynchronize(g->st));
		if ((rc = fn(ctx, g->hlog, T, (uint32_t)V, err)))
			goto out;
		CK(cudaMemcpyAsync(g->logits, g->hlog, T * V * 4, cudaMemcpyHostToDevice, g->st));
	} else if (!g->f32 && xent_bf_ok(g->logits, g->cA, (uint32_t)V)) {
		ph(g, PH_LOSS);
		k_xent_bf<<<(unsigned)T, NTH, 0, g->st>>>(g->logits, g->dids,
							  loss_mask ? g->dmask : NULL, seq,
							  (uint32_t)V, grad_scale, g->lossrow,
							  (__nv_bfloat16 *)g->cA);
		LK();
		/* the gradient is the GEMM's operand already */
		xbf = 1;
	} else {
		ph(g, PH_LOSS);
		k_xent<<<(unsigned)T, NTH, 0, g->st>>>(g->logits, g->dids,
						       loss_mask ? g->dmask : NULL, seq,
						       (uint32_t)V, grad_scale, g->lossrow);
		LK();
	}
	ph(g, PH_B_HEAD);
	if (xbf)
		X = g->cA;
	if ((!xbf && (rc = opnd(g, g->logits, T * V, g->cA, &X, err))) ||
	    (rc = gemm(g, 0, 0, (uint32_t)T, (uint32_t)H, (uint32_t)V, 1.0f, X, (uint32_t)V, g->lm,
		       (uint32_t)H, 0.0f, g->y, (uint32_t)H, g->gt, g->ct_base, err)))
		goto out;
	d = g->dA;
	d2 = g->dB;
	CK(cudaMemsetAsync(d, 0, T * H * 4, g->st));
	rms_bwd(g, T, g->xf, g->norm, g->rf, g->y, NULL, d, (uint32_t)H);
	LK();
	for (uint32_t l = g->L; l-- > 0;) {
		float *t;
		if ((rc = layer_bwd(g, m, l, d, d2, err)))
			goto out;
		t = d;
		d = d2;
		d2 = t;
	}
	if (!fn) {
		double sum = 0;
		uint64_t nt = 0;
		ph(g, PH_COPY);
		CK(cudaMemcpyAsync(g->hloss, g->lossrow, T * 8, cudaMemcpyDeviceToHost, g->st));
		CK(cudaStreamSynchronize(g->st));
		/* summed here in token order, as model.c does */
		for (uint64_t t = 0; t < T; t++) {
			uint32_t sp = (uint32_t)(t % seq);
			if (sp + 1 >= seq || (loss_mask && !loss_mask[t + 1]))
				continue;
			sum += g->hloss[t];
			nt++;
		}
		*loss_sum = sum;
		*n_tokens = nt;
	}
done:
	ph(g, PH_COPY);  /* the end mark */
	CK(cudaEventRecord(g->st1, g->st));
	CK(cudaStreamSynchronize(g->st));
	{
		float ms = 0;
		cudaEventElapsedTime(&ms, g->st0, g->st1);
		g->pa.step_ms += ms;
		g->pa.steps++;
	}
	ph_fold(g);
	if (!g->pw.steps && g->pa.steps == PROF_WARM) {
		g->pw = g->pa;
		memset(&g->pa, 0, sizeof g->pa);
	}
out:
	if (rc) {
		cudaStreamSynchronize(g->st);
		g->nev = 0;
	}
	g->train = 0;
	return rc;
}

/* ---- KV-cache decode: the cache and one step ------------------------------------ */

int ms_gmodel_kv_alloc(struct ms_model *m, struct ms_kv_cache *kv, struct ms_err *err)
{
	struct ms_gmodel *g = m->gpu;
	uint64_t n = (uint64_t)kv->nl * kv->B * kv->cap * kv->dkv;
	int rc = MS_OK;
	/* outside the model's registry: ms_model_mem reports what training
	 * holds, which the footprint predicts; the cache lives with the run's
	 * rollouts */
	CK(cudaMalloc(&kv->k, n * 4));
	CK(cudaMalloc(&kv->v, n * 4));
	CK(cudaMalloc(&kv->sc, (uint64_t)kv->B * g->nh * kv->cap * 4));
	kv->gpu = 1;
out:
	if (rc)
		ms_gmodel_kv_free(kv);
	return rc;
}

void ms_gmodel_kv_free(struct ms_kv_cache *kv)
{
	cudaFree(kv->k);
	cudaFree(kv->v);
	cudaFree(kv->sc);
	kv->k = kv->v = kv->sc = NULL;
}

int ms_gmodel_decode(struct ms_model *m, struct ms_kv_cache *kv, const int32_t *ids,
		     float *logits, struct ms_err *err)
{
	struct ms_gmodel *g = m->gpu;
	uint64_t T, H = g->H, V = g->V, per = (uint64_t)kv->B * kv->cap * kv->dkv;
	const void *X = NULL;
	int rc;

	if ((rc = ms_model_check_ids(m, ids, kv->B, 1, err)) ||
	    (rc = acts_alloc(g, m, kv->B, 1, err)) || (rc = rope_ensure(g, m, kv->cap, err)))
		return rc;
	T = g->T;
	g->train = 0;
	g->noprof = 1;
	g->pend_dst = NULL;
	g->pend_ye = NULL;
	CK(cudaMemcpyAsync(g->dids, ids, T * 4, cudaMemcpyHostToDevice, g->st));
	k_embed<<<nblk(T * H), NTH, 0, g->st>>>(g->dids, g->embed, g->a[0].x, (uint32_t)T,
						(uint32_t)H);
	LK();
	for (uint32_t l = 0; l < g->L; l++) {
		struct kvdec dc = {kv->k + l * per, kv->v + l * per, kv->sc, kv->len, kv->cap};
		if ((rc = layer_fwd(g, m, l, l + 1 < g->L ? g->a[l + 1].x : g->xf, &dc, err)))
			goto out;
	}
	rms_in(g, T, g->xf, g->norm, g->hf, g->rf, (uint32_t)H, (float)m->cfg.rms_eps);
	LK();
	if ((rc = opnd(g, g->hf, T * H, g->cA, &X, err)) ||
	    (rc = gemm(g, 0, 1, (uint32_t)T, (uint32_t)V, (uint32_t)H, 1.0f, X, (uint32_t)H, g->lm,
		       (uint32_t)H, 0.0f, g->logits, (uint32_t)V, g->gt, g->ct_base, err)))
		goto out;
	if (logits)
		CK(cudaMemcpyAsync(logits, g->logits, T * V * 4, cudaMemcpyDeviceToHost, g->st));
	CK(cudaStreamSynchronize(g->st));
out:
	if (rc)
		cudaStreamSynchronize(g->st);
	g->noprof = 0;
	return rc;
}

/* ---- parameters, optimizer ---------------------------------------------------------- */

/* the lora whose B is parameter i with more than one expert, or NULL */
static const struct dlora *bperm_of(const struct ms_gmodel *g, size_t i)
{
	for (size_t j = 0; j < g->nloras; j++)
		if (g->loras[j].pB == (int)i && g->loras[j].E > 1)
			return &g->loras[j];
	return NULL;
}

/* one block of device values (W, G, Mo or Vo) <-> the host arrays, per
 * parameter (PEFT's layout on the host) */
static int xfer(struct ms_gmodel *g, const struct ms_model *m, float *dev, float **host,
		int dir, struct ms_err *err)
{
	int rc = MS_OK;
	float *tmp = NULL;
	for (size_t i = 0; i < m->nparams; i++) {
		const struct dlora *L = bperm_of(g, i);
		uint64_t n = m->params[i].n;
		float *dp = dev + g->poff[i];
		if (!L) {
			if (dir == MS_MODEL_TO_HOST)
				CK(cudaMemcpy(host[i], dp, n * 4, cudaMemcpyDeviceToHost));
			else
				CK(cudaMemcpy(dp, host[i], n * 4, cudaMemcpyHostToDevice));
			continue;
		}
		if (!tmp)
			CK(cudaMalloc(&tmp, g->ntot * 4 + 4));
		if (dir == MS_MODEL_TO_HOST) {
			k_bperm<<<nblk(n), NTH>>>(dp, tmp, L->out, L->r, L->E, 0);
			LK();
			CK(cudaMemcpy(host[i], tmp, n * 4, cudaMemcpyDeviceToHost));
		} else {
			CK(cudaMemcpy(tmp, host[i], n * 4, cudaMemcpyHostToDevice));
			k_bperm<<<nblk(n), NTH>>>(tmp, dp, L->out, L->r, L->E, 1);
			LK();
			CK(cudaDeviceSynchronize());
		}
	}
out:
	cudaFree(tmp);
	return rc;
}

int ms_gmodel_sync(struct ms_model *m, struct ms_adamw *o, int dir, struct ms_err *err)
{
	struct ms_gmodel *g = m->gpu;
	float **w = NULL, **gr = NULL;
	int rc = MS_OK;

	if (o && o->np != m->nparams)
		return ms_err_set(err, MS_EINVAL,
				  "optimizer made over %zu tensors, the model has %zu", o->np,
				  m->nparams);
	w = (float **)calloc(m->nparams + 1, sizeof *w);
	gr = (float **)calloc(m->nparams + 1, sizeof *gr);
	if (!w || !gr) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < m->nparams; i++) {
		w[i] = m->params[i].w;
		gr[i] = m->params[i].g;
	}
	CK(cudaStreamSynchronize(g->st));
	if ((rc = xfer(g, m, g->W, w, dir, err)))
		goto out;
	if (dir == MS_MODEL_TO_HOST && (rc = xfer(g, m, g->G, gr, dir, err)))
		goto out;
	if (o && ((rc = xfer(g, m, g->Mo, o->m, dir, err)) ||
		  (rc = xfer(g, m, g->Vo, o->v, dir, err))))
		goto out;
out:
	free(w);
	free(gr);
	return rc;
}

int ms_gmodel_zero_grad(struct ms_model *m, struct ms_err *err)
{
	struct ms_gmodel *g = m->gpu;
	int rc = MS_OK;
	CK(cudaMemsetAsync(g->G, 0, g->ntot * 4, g->st));
out:
	return rc;
}

int ms_gmodel_optim(struct ms_model *m, struct ms_adamw *o, double lr, double *grad_norm,
		    struct ms_err *err)
{
	struct ms_gmodel *g = m->gpu;
	const struct ms_adamw_cfg *c = &o->cfg;
	struct adam_s a;
	double ss = 0, norm, bc1, bc2;
	int rc = MS_OK;

	if (o->np != m->nparams)
		return ms_err_set(err, MS_EINVAL,
				  "optimizer made over %zu tensors, the model has %zu", o->np,
				  m->nparams);
	g->nev = 0;
	ph(g, PH_OPTIM);
	k_sumsq<<<SQ_BLOCKS, NTH, 0, g->st>>>(g->G, g->ntot, g->dnorm);
	LK();
	k_sum_parts<<<1, NTH, 0, g->st>>>(g->dnorm, SQ_BLOCKS);
	LK();
	CK(cudaMemcpyAsync(&ss, g->dnorm + SQ_BLOCKS, 8, cudaMemcpyDeviceToHost, g->st));
	CK(cudaStreamSynchronize(g->st));
	norm = sqrt(ss);
	*grad_norm = norm;
	a.clip = 1.0f;
	if (c->clip > 0) {
		double coef = c->clip / (norm + 1e-6);
		if (coef < 1.0)
			a.clip = (float)coef;
	}
	/* optim.c's scalars, in double, then rounded as there */
	o->step++;
	bc1 = 1.0 - pow(c->beta1, (double)o->step);
	bc2 = 1.0 - pow(c->beta2, (double)o->step);
	a.decay = (float)(1.0 - lr * c->weight_decay);
	a.w1 = (float)(1.0 - c->beta1);
	a.b2 = (float)c->beta2;
	a.w2 = (float)(1.0 - c->beta2);
	a.step_size = (float)(lr / bc1);
	a.bc2_sqrt = (float)sqrt(bc2);
	a.eps = (float)c->eps;
	a.wd = c->weight_decay != 0;
	k_adamw<<<nblk(g->ntot), NTH, 0, g->st>>>(g->W, g->G, g->Mo, g->Vo, g->ntot, a);
	LK();
	ph(g, PH_COPY);
	CK(cudaStreamSynchronize(g->st));
	ph_fold(g);
out:
	return rc;
}

/* ---- memory, profile, free ----------------------------------------------------------- */

int ms_gmodel_mem(const struct ms_model *m, struct ms_model_mem *out)
{
	const struct ms_gmodel *g = m->gpu;
	*out = g->mem;
	out->nvfp4_colwise_peak = g->mem.nvfp4_colwise;
	return MS_OK;
}

int ms_gmodel_routing(const struct ms_model *m, uint32_t l, int32_t *sel, float *probs,
		      struct ms_err *err)
{
	const struct ms_gmodel *g = m->gpu;
	int rc = MS_OK;
	if (!g->T || !g->a[l].sel || !g->a[l].probs)
		return ms_err_set(err, MS_EINVAL, "routing: the model has run no forward");
	CK(cudaStreamSynchronize(g->st));
	CK(cudaMemcpy(sel, g->a[l].sel, (uint64_t)g->T * g->K * sizeof *sel,
		      cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(probs, g->a[l].probs, (uint64_t)g->T * g->E * sizeof *probs,
		      cudaMemcpyDeviceToHost));
out:
	return rc;
}

int ms_gmodel_profile(const struct ms_model *m, char **json, struct ms_err *err)
{
	const struct ms_gmodel *g = m->gpu;
	cJSON *o = cJSON_CreateObject(), *ks = cJSON_CreateArray(), *mem = cJSON_CreateObject();
	/* the steps after the warm-up, or the warm-up where none followed */
	const struct prof_acc *A = g->pa.steps || !g->pw.steps ? &g->pa : &g->pw;
	double st = A->steps ? (double)A->steps : 1;
	char *s = NULL;
	int rc = MS_OK;
	if (!o || !ks || !mem) {
		cJSON_Delete(o);
		cJSON_Delete(ks);
		cJSON_Delete(mem);
		return ms_err_nomem(err);
	}
	cJSON_AddNumberToObject(o, "steps", (double)A->steps);
	cJSON_AddNumberToObject(o, "warmup_steps_left_out", A == &g->pa ? (double)g->pw.steps : 0);
	cJSON_AddNumberToObject(o, "step_ms", A->step_ms / st);
	/* the transpose on the decode stream (the decode ahead) runs beside
	 * the step: colwise_stream says which */
	cJSON_AddNumberToObject(o, "colwise_ms",
				(A->ph_ms[PH_TRANSPOSE] + A->ph_ms[PH_S_TRANSPOSE]) / st);
	cJSON_AddStringToObject(o, "colwise_stream", A->ph_calls[PH_S_TRANSPOSE] ? "decode"
										   : "main");
	cJSON_AddNumberToObject(o, "decode_wait_ms", A->ph_ms[PH_WAIT_DEC] / st);
	cJSON_AddStringToObject(o, "gemm", g->f32 ? "f32" : "bf16");
	cJSON_AddStringToObject(o, "expert_gemm",
				g->fused ? "fused" : g->grouped ? "grouped" : "per-expert");
	{
		/* the attention the last step ran, and what cuDNN's took */
		static const char *ran[] = {"none", "cudnn", "flash", "gemm+softmax"};
		char an[64];
		struct ms_err e = {0};
		uint64_t v = g->att_ran == 1 ? ms_sdpa_version(&e) : 0;
		snprintf(an, sizeof an, "%s", ran[g->att_ran]);
		if (v)
			snprintf(an, sizeof an, "cudnn %llu.%llu.%llu",
				 (unsigned long long)(v / 10000), (unsigned long long)(v / 100 % 100),
				 (unsigned long long)(v % 100));
		cJSON_AddStringToObject(o, "attention", an);
		if (g->att_why[0])
			cJSON_AddStringToObject(o, "attention_no_cudnn", g->att_why);
		if (g->att_ran == 1) {
			cJSON_AddNumberToObject(o, "attention_ws_asked", (double)g->att_ws[0]);
			cJSON_AddNumberToObject(o, "attention_ws_held", (double)g->att_ws[1]);
		}
	}
	for (int p = 0; p < PH_N; p++) {
		cJSON *k;
		if (!A->ph_calls[p])
			continue;
		k = cJSON_CreateObject();
		if (!k)
			continue;
		cJSON_AddStringToObject(k, "name", phase_name[p]);
		cJSON_AddNumberToObject(k, "ms", A->ph_ms[p] / st);
		cJSON_AddNumberToObject(k, "host_ms", A->ph_host_ms[p] / st);
		cJSON_AddNumberToObject(k, "idle_ms", A->ph_idle_ms[p] / st);
		cJSON_AddNumberToObject(k, "calls", (double)A->ph_calls[p]);
		cJSON_AddStringToObject(k, "stream", PH_SIDE(p) ? "decode" : "main");
		cJSON_AddItemToArray(ks, k);
	}
	cJSON_AddItemToObject(o, "kernels", ks);
	if (g->sites) {
		cJSON *ss = cJSON_CreateArray();
		for (int i = 0; ss && i < A->nsite; i++) {
			cJSON *k = cJSON_CreateObject();
			char nm[96];
			int key = A->site_key[i];
			if (!k)
				continue;
			site_name(g, key, nm, sizeof nm);
			cJSON_AddStringToObject(k, "site", nm);
			cJSON_AddNumberToObject(k, "ms", A->site_ms[i] / st);
			cJSON_AddNumberToObject(k, "idle_ms", A->site_idle_ms[i] / st);
			cJSON_AddNumberToObject(k, "host_ms", A->site_host_ms[i] / st);
			cJSON_AddNumberToObject(k, "calls", (double)A->site_calls[i]);
			cJSON_AddItemToArray(ss, k);
		}
		cJSON_AddItemToObject(o, "sites", ss);
	}
	cJSON_AddNumberToObject(mem, "nvfp4_rowwise", (double)g->mem.nvfp4_rowwise);
	cJSON_AddNumberToObject(mem, "nvfp4_colwise", (double)g->mem.nvfp4_colwise);
	cJSON_AddNumberToObject(mem, "dense", (double)g->mem.dense);
	cJSON_AddNumberToObject(mem, "lora", (double)g->mem.lora);
	cJSON_AddNumberToObject(mem, "acts", (double)g->mem.acts);
	cJSON_AddNumberToObject(mem, "scratch", (double)g->mem.scratch);
	cJSON_AddNumberToObject(mem, "peak", (double)g->mem.peak);
	cJSON_AddNumberToObject(mem, "nvfp4_rowwise_measured",
				(double)g->mem.nvfp4_rowwise_measured);
	cJSON_AddNumberToObject(mem, "nvfp4_colwise_measured",
				(double)g->mem.nvfp4_colwise_measured);
	cJSON_AddNumberToObject(mem, "measured", (double)g->mem.measured);
	cJSON_AddItemToObject(o, "mem", mem);
	cJSON_AddNumberToObject(o, "base_bytes",
				(double)(g->mem.nvfp4_rowwise + g->mem.nvfp4_colwise));
	cJSON_AddNumberToObject(o, "peak_bytes", (double)g->mem.peak);
	s = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	if (!s)
		return ms_err_nomem(err);
	*json = (char *)ms_malloc(strlen(s) + 1);
	if (!*json)
		rc = ms_err_nomem(err);
	else
		memcpy(*json, s, strlen(s) + 1);
	cJSON_free(s);
	return rc;
}

static void dlin_free(struct ms_gmodel *g, struct dlin *l)
{
	for (int p = 0; p < 2; p++) {
		dfree(g, l->part[p].pk, MC_ROW);
		dfree(g, l->part[p].sc, MC_ROW);
		dfree(g, l->part[p].pkt, MC_COL);
		dfree(g, l->part[p].sct, MC_COL);
	}
	dfree(g, l->w, MC_DENSE);
	dfree(g, l->wt, MC_DENSE);
	dfree(g, l->bias, MC_DENSE);
}

static void gfree(struct ms_gmodel *g)
{
	if (!g)
		return;
	if (g->st)
		cudaStreamSynchronize(g->st);
	if (g->dst) {
		cudaStreamSynchronize(g->dst);
		cudaStreamDestroy(g->dst);
	}
	for (int i = 0; i < 3; i++) {
		cudaEvent_t e = i < 2 ? g->dev_dec[i] : g->dev_main;
		if (e)
			cudaEventDestroy(e);
	}
	acts_release(g);
	if (g->ly) {
		for (uint32_t l = 0; l < g->L; l++) {
			struct dlayer *d = &g->ly[l];
			float *f[] = {d->ln1, d->ln2, d->qn, d->kn, d->router, d->ecb};
			for (int i = 0; i < 6; i++)
				dfree(g, f[i], MC_DENSE);
			dlin_free(g, &d->q);
			dlin_free(g, &d->k);
			dlin_free(g, &d->v);
			dlin_free(g, &d->o);
			if (d->egu)
				for (uint32_t e = 0; e < g->E; e++)
					dlin_free(g, &d->egu[e]);
			if (d->edn)
				for (uint32_t e = 0; e < g->E; e++)
					dlin_free(g, &d->edn[e]);
			free(d->egu);
			free(d->edn);
			dlin_free(g, &d->sgu);
			dlin_free(g, &d->sdn);
			cudaFree(d->fwd);
			cudaFree(d->bwd);
			free(d->hbwd);
			free(d->cend);
		}
		free(g->ly);
	}
	dfree(g, g->embed, MC_DENSE);
	dfree(g, g->norm, MC_DENSE);
	dfree(g, g->lm, MC_DENSE);
	dfree(g, g->rope_c, MC_DENSE);
	dfree(g, g->rope_s, MC_DENSE);
	dfree(g, g->W, MC_LORA);
	dfree(g, g->G, MC_LORA);
	dfree(g, g->Mo, MC_LORA);
	dfree(g, g->Vo, MC_LORA);
	dfree(g, g->dnorm, MC_SCRATCH);
	dfree(g, g->wbuf, MC_SCRATCH);
	dfree(g, g->fab, MC_SCRATCH);
	dfree(g, g->aab, MC_SCRATCH);
	dfree(g, g->wpart, MC_SCRATCH);
	dfree(g, g->colbuf, MC_COL);
	for (int i = 0; i < NEV; i++)
		if (g->evs[i])
			cudaEventDestroy(g->evs[i]);
	for (int i = 0; i < NSEV; i++)
		if (g->sevs[i])
			cudaEventDestroy(g->sevs[i]);
	for (int i = 0; i < PSLOTS; i++)
		if (g->pev[i])
			cudaEventDestroy(g->pev[i]);
	cudaFreeHost(g->hparr);
	dfree(g, g->parr, MC_SCRATCH);
	dfree(g, g->gbp, MC_SCRATCH);
	if (g->cev)
		cudaEventDestroy(g->cev);
	if (g->st0)
		cudaEventDestroy(g->st0);
	if (g->st1)
		cudaEventDestroy(g->st1);
	for (uint32_t i = 0; g->ltc && i < LT_SLOTS; i++)
		lt_drop(&g->ltc[i]);
	free(g->ltc);
	free(g->plan);
	for (uint32_t i = 0; i < MS_GMODEL_LANES; i++) {
		struct gctx *c = &g->lane[i];
		if (c->lt)
			blas.lt_destroy(c->lt);
		if (c->bl)
			blas.destroy(c->bl);
		if (c->st)
			cudaStreamDestroy(c->st);
		dfree(g, c->ws, MC_SCRATCH);
	}
	dfree(g, g->xsc, MC_SCRATCH);
	for (uint32_t i = 0; i < SD_CACHE; i++)
		ms_sdpa_free(g->sdc[i]);
	for (uint32_t i = 0; i <= MS_GMODEL_LANES; i++)
		if (g->lev[i])
			cudaEventDestroy(g->lev[i]);
	if (g->blas)
		blas.destroy(g->blas);
	if (g->st)
		cudaStreamDestroy(g->st);
	free(g->loras);
	free(g->poff);
	free(g->reg);
	free(g->timeline);
	free(g);
}

void ms_gmodel_free(struct ms_gmodel *g)
{
	gfree(g);
}
