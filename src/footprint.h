/*
 * footprint.h: the internal side of footprint.c; the public declarations are in
 * ms.h (section "footprint").
 */
#ifndef MS_FOOTPRINT_H
#define MS_FOOTPRINT_H

#include "ms.h"
#include <stddef.h>
#include <stdint.h>
#include "common.h"
#include "safetensors.h"
#include "checkpoint.h"

#endif
