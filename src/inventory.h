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

/*
 * Lineage carried from one inventory to another (msinv export / import).
 * ms_inv_lineage_export writes, as JSON text (caller frees with ms_free),
 * the record of where digest came from:
 *
 *   {"states": [{"state", "kind", "layout", "label", "tensors", "bytes",
 *                "ep_size", "ep_rank", "experts", "argv", "tool", "user",
 *                "host", "created_at"}, ...],       every ancestor, once
 *    "edges":  [{"child", "parent", "operation", "params", "created_at"},
 *               ...]}                               every edge above digest
 *
 * ms_inv_lineage_check: is text such a record for digest (well formed, every
 * edge between digest and states it lists, digest not among them)?
 * MS_EINVAL naming the rule when not. ms_inv_lineage_record (digest must be
 * recorded) records, in one transaction (or the open batch), every listed
 * state this inventory lacks as a state with no copy (what it was and where
 * it came from, its bytes elsewhere), keeping its label unless another
 * state here has it, and every edge not yet recorded; states recorded here
 * already are kept as they are. An edge that would close a cycle with the
 * recorded ones is MS_EINVAL. The audit log gets one "lineage" entry
 * naming source (may be NULL). Claims of another inventory: no byte of an
 * ancestor is checked here.
 */
int ms_inv_lineage_export(struct ms_inv *inv, const char *digest, char **json,
			  struct ms_err *err);
int ms_inv_lineage_check(const char *json, size_t len, const char *digest,
			 struct ms_err *err);
int ms_inv_lineage_record(struct ms_inv *inv, const char *digest, const char *json,
			  size_t len, const char *source, struct ms_err *err);

/* What the files of an opened, hashed checkpoint say about its kind and
 * layout (the rules add applies); kind is MS_INV_KIND_ANY when they say
 * nothing, ep_size/ep_rank -1 without shard metadata; *experts (caller
 * frees, NULL when none) is the JSON array of expert ids. layout holds at
 * least 32 bytes. */
int ms_inv_classify(const struct ms_ckpt *c, enum ms_inv_kind *kind,
		    char *layout, size_t layout_len, int32_t *ep_size,
		    int32_t *ep_rank, char **experts, struct ms_err *err);

/* Is name (a plain file name) such a temporary? *pid gets its pid. */
int ms_inv_is_temp_name(const char *name, long *pid);

#endif
