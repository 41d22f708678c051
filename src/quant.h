/*
 * quant.h: the internal side of quant.c; the public declarations are in
 * ms.h (section "quant").
 */
#ifndef MS_QUANT_H
#define MS_QUANT_H

#include "ms.h"
#include <stdint.h>
#include "checkpoint.h"
#include "common.h"
#include "nvfp4.h"
#include "safetensors.h"
#include "stage.h"

/* The fused group a weight's tensor scale is shared with, as both
 * producers fuse: q/k/v of one attention block, gate/up of one MLP or
 * expert, Mixtral's w1/w3 of one expert, DeepSeek's multi-latent attention
 * pair. Writes the group key (the name with the projection replaced by
 * "{qkv}", "{gate_up}", "{w13}" or, for DeepSeek's q_a_proj and
 * kv_a_proj_with_mqa, "{mla_a}") into buf and returns 1, or returns 0
 * when the weight is in no group. */
int ms_quant_fuse_key(const char *name, char *buf, size_t n);

#endif
