/*
 * names.h: what a tensor name says about the tensor: which layer, which
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
#ifndef MS_NAMES_H
#define MS_NAMES_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "safetensors.h"

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

/* The tensor-name suffix (".weight_packed", ...) that NVFP4 format
 * `format` (enum ms_quant_format's values: 0 ModelOpt, 1
 * compressed-tensors) gives the companion of a quantized weight with this
 * role: MS_NAME_ROLE_WEIGHT, _SCALE, _SCALE2 (ModelOpt) or _GLOBAL_SCALE
 * (compressed-tensors), _INPUT_SCALE, _COLWISE, _COLWISE_SCALE. It comes
 * from the table ms_name_parse reads names with, so a name written with it
 * parses back to that role. NULL: the format writes no such tensor. */
const char *ms_name_nvfp4_suffix(enum ms_name_role role, unsigned format);

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

#endif
