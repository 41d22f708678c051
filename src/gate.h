/*
 * gate.h: the internal side of gate.c; the public declarations are in
 * ms.h (section "gate").
 */
#ifndef MS_GATE_H
#define MS_GATE_H

#include "ms.h"
#include <stdint.h>
#include "checkpoint.h"
#include "common.h"
#include "footprint.h"
#include "inventory.h"

#endif
