/*
 * verify.h: the internal side of verify.c; the public declarations are in
 * ms.h (section "verify").
 */
#ifndef MS_VERIFY_H
#define MS_VERIFY_H

#include "ms.h"
#include <stdint.h>
#include "checkpoint.h"
#include "common.h"
#include "hash.h"
#include "safetensors.h"

#endif
