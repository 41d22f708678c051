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

#endif
