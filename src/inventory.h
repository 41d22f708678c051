/*
 * inventory.h: the internal side of inventory.c; the public declarations are in
 * ms.h (section "inventory").
 */
#ifndef MS_INVENTORY_H
#define MS_INVENTORY_H

#include "ms.h"
#include <stddef.h>
#include <stdint.h>
#include "checkpoint.h"
#include "common.h"
#include "hash.h"
#include "safetensors.h"

#endif
