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

#endif
