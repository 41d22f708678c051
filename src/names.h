/*
 * names.h: the internal side of names.c; the public declarations are in
 * ms.h (section "names").
 */
#ifndef MS_NAMES_H
#define MS_NAMES_H

#include "ms.h"
#include <stddef.h>
#include <stdint.h>
#include "common.h"
#include "safetensors.h"

/* The tensor-name suffix (".weight_packed", ...) that NVFP4 format
 * `format` (enum ms_quant_format's values: 0 ModelOpt, 1
 * compressed-tensors) gives the companion of a quantized weight with this
 * role: MS_NAME_ROLE_WEIGHT, _SCALE, _SCALE2 (ModelOpt) or _GLOBAL_SCALE
 * (compressed-tensors), _INPUT_SCALE, _COLWISE, _COLWISE_SCALE. It comes
 * from the table ms_name_parse reads names with, so a name written with it
 * parses back to that role. NULL: the format writes no such tensor. */
const char *ms_name_nvfp4_suffix(enum ms_name_role role, unsigned format);

#endif
