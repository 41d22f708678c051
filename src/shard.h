/*
 * shard.h: the internal side of shard.c; the public declarations are in
 * ms.h (section "shard").
 */
#ifndef MS_SHARD_H
#define MS_SHARD_H

#include "ms.h"
#include <stddef.h>
#include <stdint.h>
#include "checkpoint.h"
#include "common.h"

#endif
