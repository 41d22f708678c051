/*
 * pyapi.h: the internal side of pyapi.c; the public declarations are in
 * ms.h (section "pyapi").
 */
#ifndef MS_PYAPI_H
#define MS_PYAPI_H

#include "ms.h"
#include <stddef.h>
#include <stdint.h>
#include "checkpoint.h"
#include "common.h"
#include "inventory.h"

#endif
