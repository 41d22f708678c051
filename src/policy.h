/*
 * policy.h: which inventoried states a served policy is made of.
 *
 * A serving engine loaded some tensors: a directory (base + adapter, a
 * merged checkpoint, a quantized one) or a JSON map of tensor name to
 * SHA-256 such as an engine's weight checker emits. Every tensor is looked
 * up by its digest in the inventory; the states that hold the served
 * tensors under the same names are the policy's parts. Each served tensor
 * ends up:
 *   matched    a part holds these bytes under this name;
 *   renamed    some state holds these bytes, under another name;
 *   mismatch   a part has a tensor of this name with other bytes;
 *   unknown    no recorded state holds these bytes.
 * Only an all-matched policy identifies; the rest are listed.
 *
 * Tensor map format (JSON object, outside input, strict):
 *   {"name": "<64 hex sha256>", ...}   or   {"tensors": {"name": "<hex>", ...}}
 */
#ifndef MS_POLICY_H
#define MS_POLICY_H

#include <stdint.h>

#include "checkpoint.h"
#include "common.h"
#include "inventory.h"

#define MS_POLICY_MAX_MAP (256u << 20)

enum ms_policy_status {
	MS_POLICY_MATCHED,
	MS_POLICY_RENAMED,
	MS_POLICY_MISMATCH,
	MS_POLICY_UNKNOWN,
};

struct ms_policy_tensor {
	char *name;
	uint8_t digest[MS_SHA256_LEN];
	enum ms_policy_status status;
	int part;              /* index into parts, or -1 */
	char *other;           /* renamed: the recorded name; NULL otherwise */
	char other_state[MS_STATE_DIGEST_LEN]; /* renamed: the state */
	int src;               /* a slice of the served fused tensor
				* sources[src] (ms_policy_unfuse), or -1 */
};

struct ms_policy_part {
	char state[MS_STATE_DIGEST_LEN];
	char *label;           /* NULL when none */
	enum ms_inv_kind kind;
	char *layout;
	uint64_t state_tensors; /* tensors the state records */
	uint64_t served;        /* of them, served under their names */
};

struct ms_policy_report {
	size_t ntensors;
	struct ms_policy_tensor *tensors;   /* sorted by name */
	size_t nparts;
	struct ms_policy_part *parts;       /* constituents first (base,
					     * adapter, quantized: not policy
					     * states), most tensors first */
	/* policy states that hold some of the served tensors under their
	 * names but are not parts (served: how many): what a served copy
	 * of a registered policy resembles, beside what it is made of */
	size_t npolicies;
	struct ms_policy_part *policies;
	size_t nmatched, nrenamed, nmismatch, nunknown;
	/* for tensors unfused by ms_policy_unfuse: the served fused names
	 * (sources[src] of struct ms_policy_tensor) */
	size_t nsources;
	char **sources;
};

/* The served tensors: from checkpoints at paths (hashed with nthreads) or
 * from a tensor map. Names must be unique across all of them. */
int ms_policy_from_ckpt(const struct ms_ckpt *c, struct ms_policy_report **out,
			struct ms_err *err);
int ms_policy_from_map(const char *json, size_t len, const char *label,
		       struct ms_policy_report **out, struct ms_err *err);

/*
 * Serving engines hold some parameters fused, under names no checkpoint
 * has. vLLM's FusedMoE keeps every expert of a layer in
 * "...experts.w13_weight" [E, 2I, H] (expert e's rows [0, I) are w1, the
 * gate_proj, and [I, 2I) w3, the up_proj) and "...experts.w2_weight"
 * [E, H, I] (down_proj); its merged linears stack their inputs along the
 * first dimension: "qkv_proj.weight" = q_proj, k_proj, v_proj (sizes from
 * config.json: num_attention_heads, num_key_value_heads, head_dim or
 * hidden_size / heads) and "gate_up_proj.weight" = gate_proj, up_proj.
 * Every served tensor of c with such a name whose bytes no recorded state
 * holds is replaced in r by its slices, each hashed and named as
 * checkpoints name it ("experts.<e>.gate_proj.weight"; Mixtral's
 * "experts.<e>.w1.weight" / w3 / w2 under "block_sparse_moe"), so that
 * ms_policy_identify matches them against the inventoried tensors. Call
 * between ms_policy_from_ckpt and ms_policy_identify. A tensor map (digests
 * only) cannot be sliced.
 */
int ms_policy_unfuse(struct ms_inv *inv, const struct ms_ckpt *c, struct ms_policy_report *r,
		     struct ms_err *err);

/* Look every tensor up in inv and choose the parts. Returns MS_OK when
 * every tensor matched, MS_ECHECK when some did not (the report says which),
 * other codes on failure. */
int ms_policy_identify(struct ms_inv *inv, struct ms_policy_report *r,
		       struct ms_err *err);
/* Record the served files at paths as a policy state composed of r's parts
 * (an identified report: ms_policy_identify returned MS_OK): its parents
 * are the parts, and the "compose" edge lists each part's state, kind,
 * layout and served tensors. label may be NULL; jobs hashing threads. The
 * policy state's digest goes to digest. */
int ms_policy_register(struct ms_inv *inv, const struct ms_policy_report *r,
		       const char *const *paths, size_t npaths, const char *label, int jobs,
		       char digest[MS_STATE_DIGEST_LEN], struct ms_err *err);
void ms_policy_report_free(struct ms_policy_report *r);
const char *ms_policy_status_str(enum ms_policy_status s);

#endif
