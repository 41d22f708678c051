/*
 * checkpoint.h: the internal side of checkpoint.c; the public declarations are in
 * ms.h (section "checkpoint").
 */
#ifndef MS_CHECKPOINT_H
#define MS_CHECKPOINT_H

#include "ms.h"
#include "common.h"
#include "safetensors.h"

#endif
