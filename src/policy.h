/*
 * policy.h: the internal side of policy.c; the public declarations are in
 * ms.h (section "policy").
 */
#ifndef MS_POLICY_H
#define MS_POLICY_H

#include "ms.h"
#include <stdint.h>
#include "checkpoint.h"
#include "common.h"
#include "inventory.h"

#endif
