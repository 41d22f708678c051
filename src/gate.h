/*
 * gate.h: the launch gate. Before a run consumes any state, every state the
 * plan names is resolved in the inventory, its files are re-hashed against
 * the recorded digests (or a verification newer than every file's change
 * time is accepted, on request), expert-parallel shards are checked against
 * the plan's EP size, and the run is recorded. Only then is the command
 * started, with the verified paths and digests in its environment. Anything
 * missing, unverified or of the wrong EP size refuses the run: the command
 * is not started and the run record says why.
 *
 * The plan is the JSON of footprint.h (keys "states" with role and state or
 * path, "ep_size", "outputs"). A "path" entry is hashed and must be an
 * inventoried state; a "state" entry is a digest, prefix or label. A "path"
 * entry may also be an EP shard set (a directory holding ep_manifest.json,
 * or that file): the whole set is checked (ms_shard_check: every shard,
 * every expert, the manifest), it must be split for the plan's EP size, and
 * every shard must be an inventoried state recorded with its rank; the
 * role's state is then the set's source (the unsharded state), and every
 * shard is recorded as consumed by the run.
 *
 * Environment given to the command (ROLE upper-cased, every character not
 * in [A-Z0-9] turned into '_'):
 *   MSINV_DB           the inventory path
 *   MSINV_RUN          the run number
 *   MSINV_PLAN         the plan file, MSINV_PLAN_DIGEST its sha256:<hex>
 *   MSINV_EP_SIZE      the plan's EP size
 *   MSINV_OUTPUTS      the plan's "outputs" (when given)
 *   MSINV_STATE_<ROLE> the verified state digest
 *   MSINV_PATH_<ROLE>  the directory (or file) holding that state's files
 *                      (for a shard set: the set's directory)
 *
 * A run that is refused or cannot be checked never starts its command: it
 * is recorded as failed with the exit status the launcher itself exits with
 * (ms_exit_code of the verdict: 1 refused, 2 or 3 for a check that could
 * not be made), so the record and the shell agree.
 */
#ifndef MS_GATE_H
#define MS_GATE_H

#include <stdint.h>

#include "checkpoint.h"
#include "common.h"
#include "footprint.h"
#include "inventory.h"

#define MS_GATE_TRUST_RECENT 1u /* accept a newer ok verification */
#define MS_GATE_DRY_RUN 2u      /* check, but record no run */

struct ms_gate_input {
	char *role;
	char digest[MS_STATE_DIGEST_LEN];
	char *label;           /* NULL when none */
	char *path;            /* directory or file of the verified copy */
	enum ms_inv_kind kind;
	int32_t ep_size, ep_rank;
	int trusted;           /* accepted through a recent verification */
	uint64_t bytes;        /* bytes re-hashed */
	double seconds;
	/* a shard set entry: the state digest of every shard, rank order
	 * (digest is then the set's source state); 0 and NULL otherwise */
	size_t nshards;
	char (*shards)[MS_STATE_DIGEST_LEN];
};

struct ms_gate {
	struct ms_fp_plan *plan;
	char plan_path[4096];
	char plan_digest[MS_STATE_DIGEST_LEN];
	size_t ninputs;
	struct ms_gate_input *inputs;
	int refused;           /* MS_ECHECK was returned: why says why */
	char why[1024];
	int64_t run_id;        /* 0 with MS_GATE_DRY_RUN */
	size_t nenv;
	char **env;            /* "NAME=value" strings for the command */
};

/*
 * Check the plan at plan_path against inv. Returns MS_OK when every state
 * verified (the run is recorded as running: finish it with ms_gate_end),
 * MS_ECHECK when the run is refused: a state is missing, unknown, of the
 * wrong EP size, or its files differ from the record (g->why says why; the
 * refusal is recorded as a failed run with a "launch_refused" event, unless
 * dry run). MS_EINVAL for a malformed plan; other codes (MS_EIO, MS_ENOMEM,
 * MS_EDB) when the check itself could not be made (a file that cannot be
 * read, memory): no verdict, so not a refusal. Such a failure met while
 * verifying is recorded, when the inventory can still be written, as a
 * failed run with a "launch_failed" event giving the reason. *out is set in
 * the first two cases; free it with ms_gate_free.
 */
int ms_gate_check(struct ms_inv *inv, const char *plan_path, unsigned flags,
		  int nthreads, struct ms_gate **out, struct ms_err *err);
/* Record the command's exit status (0 ok, else failed). */
int ms_gate_end(struct ms_inv *inv, struct ms_gate *g, int exit_code,
		struct ms_err *err);
void ms_gate_free(struct ms_gate *g);

#endif
