/*
 * attest.h: the internal side of attest.c; the public declarations are in
 * ms.h (section "attest").
 */
#ifndef MS_ATTEST_H
#define MS_ATTEST_H

#include "ms.h"
#include <stddef.h>
#include <stdint.h>
#include "common.h"

#endif
