/*
 * msint.h: every header of libms, public (ms.h) and internal, for the
 * library's own test and benchmark programs, which exercise internals a
 * tool may not reach (as SQLite's tests include sqliteInt.h). Tools
 * include ms.h only.
 */
#ifndef MS_MSINT_H
#define MS_MSINT_H

#include "ms.h"

#include "attest.h"
#include "bundle.h"
#include "checkpoint.h"
#include "common.h"
#include "footprint.h"
#include "fsutil.h"
#include "gate.h"
#include "gpu.h"
#include "hash.h"
#include "inventory.h"
#include "names.h"
#include "nvfp4.h"
#include "policy.h"
#include "pyapi.h"
#include "quant.h"
#include "safetensors.h"
#include "shard.h"
#include "stage.h"
#include "verify.h"
#include "vload.h"

#endif
