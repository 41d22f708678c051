/*
 * gpu_plan.c: what the GPU trainer (kernels/train.cu) allocates on its
 * device for a model, an adapter and a batch shape, without a GPU: the
 * footprint planner's prediction for `mstrain --device cuda`. Every line
 * here mirrors an allocation in train.cu (the build, acts_alloc, the RoPE
 * tables); t_train_gpu compares the two byte for byte on the fixture
 * families, so a change to one that misses the other fails the GPU tier.
 */
#include <stdlib.h>
#include <string.h>

#include "nvfp4.h"
#include "train/model.h"

/* train.cu's constants */
#define GP_MAXE 512u
#define GP_SQ_BLOCKS 512u
#define GP_BUCKET 128u

struct gp {
	struct ms_model_mem *m;
	int ondemand;
	uint64_t esz;
	uint64_t wo, cb, wmax, colmax, partmax;
};

static uint64_t u64max(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

static uint64_t pad16(uint64_t x)
{
	return (x + 15) / 16 * 16;
}

/* one frozen projection of nparts row blocks (rows[i] each) over in;
 * decoded: it has a place in the decode scratch (not an expert's under
 * --expert-gemm fused, which decodes inside the GEMM) */
static void lin_d(struct gp *p, int nparts, const uint32_t *rows, uint32_t in, int bias,
		  int decoded)
{
	uint64_t out = 0;
	for (int i = 0; i < nparts; i++)
		out += rows[i];
	if (bias)
		p->m->dense += out * 4;
	if (in % 16) {
		/* left in its dtype by msconvert: both orientations, GEMM type */
		p->m->dense += 2 * out * in * p->esz;
		return;
	}
	if (decoded)
		p->wo += out * in;
	for (int i = 0; i < nparts; i++) {
		uint64_t row = (uint64_t)rows[i] * (pad16(in) / 2 + pad16(in) / 16);
		uint64_t col = (uint64_t)in * (pad16(rows[i]) / 2 + pad16(rows[i]) / 16);
		p->m->nvfp4_rowwise += row;
		if (!p->ondemand)
			p->m->nvfp4_colwise += col;
		p->cb += col;
		p->partmax = u64max(p->partmax, col);
	}
}

static void lin(struct gp *p, int nparts, const uint32_t *rows, uint32_t in, int bias)
{
	lin_d(p, nparts, rows, in, bias, 1);
}

int ms_gmodel_decode_ahead(int *on, struct ms_err *err)
{
	static const char *const at[] = {"start", "attn-fwd", "attn-bwd", "attn"};
	const char *e = getenv("MS_DECODE_AHEAD");
	*on = 1;
	if (!e || !*e || !strcmp(e, "1"))
		return MS_OK;
	if (!strcmp(e, "0")) {
		*on = 0;
		return MS_OK;
	}
	for (int i = 0; i < 4; i++)
		if (!strcmp(e, at[i])) {
			*on = 2 + i;
			return MS_OK;
		}
	return ms_err_set(err, MS_EINVAL, "MS_DECODE_AHEAD '%.32s': 0 (decode in line), 1 "
			  "(decode ahead, the default), start, attn-fwd, attn-bwd or attn (where "
			  "a pass queues the next one's decode)", e);
}

int ms_gmodel_predict(const struct ms_model_cfg *c, const struct ms_lora_cfg *lora,
		      uint32_t B, uint32_t S, enum ms_colwise_mode colwise, int f32,
		      int expert_gemm, int attention, struct ms_model_mem *out)
{
	struct gp p;
	uint64_t H = c->hidden, V = c->vocab, E = c->n_experts, K = c->top_k;
	uint64_t F = c->moe_ffn, hd = c->head_dim, dq = (uint64_t)c->n_heads * hd;
	uint64_t dkv = (uint64_t)c->n_kv_heads * hd, r = lora->r, T = (uint64_t)B * S;
	uint64_t ntot = 0, TK = 0, Fs = 0, rows, wide, att, acts = 0, nmoe = 0;
	int anymoe = 0, eg = f32 ? MS_EXPERT_GEMM_PER_EXPERT : expert_gemm;
	int grouped = eg != MS_EXPERT_GEMM_PER_EXPERT;
	/* the expert LoRA folded into the frozen GEMMs (train.cu's fold_tails):
	 * bf16, per expert, no dropout, a rank its gradients' kernel covers,
	 * both expert products quantized; fr: the rank padded to 16 */
	uint64_t fr = (r + 15) / 16 * 16;
	int fold = !f32 && !grouped && lora->dropout <= 0 && r > 0 && r <= 64 &&
		   (lora->targets & MS_LORA_EXPERTS) && H % 16 == 0 && F % 16 == 0;
	int folded = 0;
	/* the q/k/v LoRA folded into those GEMMs (train.cu's afr): on the
	 * path the expert LoRA folds on, q, k and v quantized; afr: a
	 * fold_width(r) tail column block per adapted projection */
	uint64_t nqkv = !!(lora->targets & MS_LORA_Q) + !!(lora->targets & MS_LORA_K) +
			!!(lora->targets & MS_LORA_V);
	uint64_t afr = !f32 && !grouped && lora->dropout <= 0 && r > 0 && r <= 64 &&
			       H % 16 == 0 ? nqkv * fr : 0;
	/* fused attention on the bf16 path: cuDNN's where it is tried (its
	 * buffers held whether or not it loads), the flash kernels
	 * (kernels/flash.h) for the head dims they cover; either keeps a
	 * per-layer LSE instead of S x S scratch */
	int tried = ms_gmodel_sdpa_tried(f32, attention, (uint32_t)hd, S);
	int flash_k = !f32 && attention != MS_ATTENTION_CUDNN &&
		      (hd == 16 || hd == 32 || hd == 64 || hd == 128);
	int flash = tried || flash_k;

	memset(out, 0, sizeof *out);
	memset(&p, 0, sizeof p);
	p.m = out;
	p.ondemand = colwise != MS_COLWISE_RESIDENT;
	p.esz = f32 ? 4 : 2;
	/* the build: float weights, the parameter block, fixed scratch */
	out->dense += V * H * 4 + H * 4 + V * H * p.esz;
	out->scratch += (GP_SQ_BLOCKS + 1) * 8 + 3 * GP_MAXE * sizeof(void *);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		uint32_t rq[1] = {(uint32_t)dq}, rkv[1] = {(uint32_t)dkv}, rh[1] = {(uint32_t)H};
		int moe = !c->dense[l];
		p.wo = p.cb = 0;
		out->dense += 2 * H * 4;
		if (c->qk_norm)
			out->dense += 2 * hd * 4;
		lin(&p, 1, rq, (uint32_t)H, c->attention_bias);
		lin(&p, 1, rkv, (uint32_t)H, c->attention_bias);
		lin(&p, 1, rkv, (uint32_t)H, c->attention_bias);
		/* the fold's tail columns of W or W^T, whichever is wider */
		p.wo += afr * (u64max(dq, H) + 2 * u64max(dkv, H));
		lin(&p, 1, rh, (uint32_t)dq,
		    c->attention_bias && c->family == MS_MODEL_QWEN3_MOE);
		if (lora->targets & MS_LORA_Q)
			ntot += r * H + dq * r;
		if (lora->targets & MS_LORA_K)
			ntot += r * H + dkv * r;
		if (lora->targets & MS_LORA_V)
			ntot += r * H + dkv * r;
		if (lora->targets & MS_LORA_O)
			ntot += r * dq + H * r;
		if (moe) {
			uint32_t gu[2] = {(uint32_t)F, (uint32_t)F};
			anymoe = 1;
			nmoe++;
			out->dense += E * H * 4;
			if (c->router == MS_ROUTER_SIGMOID)
				out->dense += E * 4;
			for (uint64_t e = 0; e < E; e++) {
				lin_d(&p, 2, gu, (uint32_t)H, 0, eg != MS_EXPERT_GEMM_FUSED);
				lin_d(&p, 1, rh, (uint32_t)F, 0, eg != MS_EXPERT_GEMM_FUSED);
				/* a folded matrix's r more columns, W's or W^T's */
				if (fold)
					p.wo += fr * u64max(2 * F, H) + fr * u64max(H, F);
			}
			folded |= fold;
			if (lora->targets & MS_LORA_EXPERTS)
				ntot += E * r * H + 2 * F * r * E + E * r * F + H * r * E;
		}
		if (!moe || c->n_shared_experts) {
			uint64_t fs = moe ? F * c->n_shared_experts : c->dense_ffn;
			uint32_t gu[2] = {(uint32_t)fs, (uint32_t)fs};
			lin(&p, 2, gu, (uint32_t)H, 0);
			lin(&p, 1, rh, (uint32_t)fs, 0);
			Fs = u64max(Fs, fs);
		}
		p.wmax = u64max(p.wmax, p.wo);
		p.colmax = u64max(p.colmax, p.cb);
	}
	out->lora += 4 * ntot * 4;
	/* the decode ahead (train.cu's decode_unit): a second decode scratch,
	 * bf16, more than one layer, something decoded, not switched off (a
	 * value the trainer refuses counts as on: run_fp.c says it first) */
	{
		int on = 1;
		struct ms_err e = {0};
		ms_gmodel_decode_ahead(&on, &e);
		out->scratch += (!f32 && c->n_layers > 1 && p.wmax && on ? 2 : 1) * p.wmax * p.esz;
	}
	if (afr)
		out->scratch += (afr * H + u64max(dq, dkv) * fr) * 2;
	if (folded)
		out->scratch += E * fr * u64max(H, 2 * F) * 2 +
				MS_GMODEL_WGRAD_SPLIT * E * r * u64max(H, 2 * F) * 4;
	/* grouped expert GEMMs (bf16 only): four arrays of E weight pointers
	 * a MoE layer, or of E NVFP4 descriptors when fused (gg_pointers),
	 * and a layer's row and tile offsets (acts) */
	/* the per-expert bf16 path's expert GEMM streams' cuBLAS workspaces */
	if (!f32 && !grouped && nmoe && E)
		out->scratch += (uint64_t)MS_GMODEL_LANES * MS_GMODEL_LANE_WS + MS_GMODEL_XGEMM_WS;
	if (eg == MS_EXPERT_GEMM_GROUPED)
		out->scratch += nmoe * 4 * E * sizeof(void *);
	else if (eg == MS_EXPERT_GEMM_FUSED)
		out->scratch += nmoe * 4 * E * MS_GMODEL_Q4_DESC;
	if (p.ondemand)
		out->nvfp4_colwise += p.colmax / 4 > p.partmax + 512 ? p.colmax / 4 : p.partmax + 512;
	/* acts_alloc at the step's shape */
	if (anymoe)
		TK = T * K;
	rows = u64max(TK, T) + (anymoe ? GP_BUCKET : 0);
	wide = u64max(u64max(H, dq), u64max(u64max(2 * F, 2 * Fs), dkv));
	att = (uint64_t)c->n_heads * S * S;
	for (uint32_t l = 0; l < c->n_layers; l++) {
		int moe = !c->dense[l];
		acts += (4 * T * H + 2 * T + 3 * T * dq + 3 * T * dkv) * 4;
		if (flash)
			acts += T * c->n_heads * 4;
		if (c->qk_norm)
			acts += T * (c->n_heads + c->n_kv_heads) * 4;
		acts += T * r * 4 * (!!(lora->targets & MS_LORA_Q) + !!(lora->targets & MS_LORA_K) +
				     !!(lora->targets & MS_LORA_V) + !!(lora->targets & MS_LORA_O));
		if (moe) {
			acts += (T * E + 4 * TK) * 4;
			/* gate/up output, SwiGLU's, the experts' outputs: bf16
			 * where the LoRA folds (SwiGLU's then fr wider: U's
			 * columns, the down GEMM's operand) */
			/* (the experts' outputs, folded, in one scratch buffer
			 * for every layer: the combine reads them in the next
			 * norm and the backward never does) */
			acts += (TK + GP_BUCKET) * (2 * F + (fold ? 0 : H) + F + (fold ? fr : 0)) *
				(fold ? 2 : 4);
			/* and, folded, the ln2 norm's output in bf16 (h2b) */
			if (fold)
				acts += T * H * 2;
			if (lora->targets & MS_LORA_EXPERTS)
				acts += 2 * TK * r * 4;
			if (grouped)
				acts += 2 * (E + 1) * 4;
		}
		if (!moe || c->n_shared_experts) {
			uint64_t fs = moe ? F * c->n_shared_experts : c->dense_ffn;
			acts += T * 3 * fs * 4;
		}
	}
	acts += (2 * T * H + T + T * V) * 4;
	out->acts = acts;
	out->scratch += (7 * T * H + 3 * T * dq + 3 * T * dkv) * 4;
	out->scratch += rows * wide * 4 + rows * r * 4;
	if (lora->dropout > 0)
		out->scratch += rows * wide * 4 + rows * u64max(F, Fs) * 4;
	if (TK)
		out->scratch += 3 * (TK + GP_BUCKET) * H * 4 + T * E * 4 + TK * 4 + (E + 1) * 8 +
				E * ((TK + 255) / 256) * 4 + /* the sort's chunk counts */
				2 * (TK + E * GP_BUCKET) * r * 4 + 4 * E * 4 +
				/* the folded LoRA's dense [T, E fr] products, and
				 * the folded layers' expert outputs (yes) */
				(folded ? T * E * fr * 4 + (TK + GP_BUCKET) * H * 2 : 0);
	out->scratch += rows * u64max(F, Fs) * 4 + rows * 2 * u64max(F, Fs) * 4;
	if (tried)
		out->scratch += u64max(flash_k ? T * c->n_heads * 4 : 0,
				       ms_gmodel_sdpa_ws(B, c->n_heads, S)) +
				T * (2 * dq + 2 * dkv) * 2; /* bf16 O, dQ, dK, dV */
	else if (flash)
		out->scratch += T * c->n_heads * 4; /* ms_flash_workspace_bytes */
	else
		out->scratch += 2 * att * 4 + 2 * att * p.esz + (uint64_t)S * dq * 4;
	if (!f32)
		out->scratch += u64max(u64max(rows * (wide + (folded ? fr : 0)), T * V),
				       afr ? T * (u64max(H, dq + 2 * dkv) + afr) : 0) * p.esz +
				2 * T * u64max(dq, dkv) * p.esz;
	out->scratch += T * 8 + T * 4 + T + 1;
	/* the RoPE tables, allocated at the first step */
	out->dense += 2 * (uint64_t)S * (c->rotary_dim / 2) * 4;
	out->nvfp4_colwise_peak = out->nvfp4_colwise;
	out->peak = out->nvfp4_rowwise + out->nvfp4_colwise + out->dense + out->lora +
		    out->acts + out->scratch;
	return MS_OK;
}
