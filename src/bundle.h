/*
 * bundle.h: the internal side of bundle.c; the public declarations are in
 * ms.h (section "bundle").
 */
#ifndef MS_BUNDLE_H
#define MS_BUNDLE_H

#include "ms.h"
#include <stddef.h>
#include <stdint.h>
#include "checkpoint.h"
#include "common.h"

#endif
