/*
 * ms.h: the public interface of libms, the library behind msinv, msconvert,
 * msshard, msverify and mstrain. Each concern has its own header, which is
 * its contract; this header includes them all.
 */
#ifndef MS_H
#define MS_H

#include "common.h"
#include "fsutil.h"
#include "safetensors.h"
#include "hash.h"
#include "checkpoint.h"
#include "inventory.h"
#include "footprint.h"
#include "names.h"
#include "nvfp4.h"
#include "quant.h"
#include "verify.h"
#include "attest.h"
#include "bundle.h"
#include "gate.h"
#include "gpu.h"
#include "policy.h"
#include "shard.h"
#include "vload.h"
#include "pyapi.h"

#endif
