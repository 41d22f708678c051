/*
 * fz_policy_map.c: fuzz target for the served-policy tensor map
 * (ms_policy_from_map, policy.h): {"name": "<hex sha256>", ...} or the same
 * under "tensors". The input is the map's bytes. A refusal is one line
 * naming the map, with the code returned. An accepted map is a list of
 * unique, non-empty names sorted bytewise, each with its digest; it is then
 * identified against an inventory made once at start (the qwen3moe-E8-r4
 * base and adapter registered in a scratch database), so names and digests
 * the fuzzer borrows from the corpus come out matched, renamed, mismatched
 * or unknown, and the report must account for every tensor exactly once.
 */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LABEL "fuzz-map.json"

static char root[400], db[500];
static struct ms_inv *inv;

static void cleanup(void)
{
	char path[600];

	ms_inv_close(inv);
	inv = NULL;
	unlink(db);
	snprintf(path, sizeof(path), "%s-wal", db);
	unlink(path);
	snprintf(path, sizeof(path), "%s-shm", db);
	unlink(path);
	rmdir(root);
}

static void setup(void)
{
	static const char *const rel[] = {
		"peft/qwen3moe-E8-r4/base", "peft/qwen3moe-E8-r4/adapter",
	};
	const char *tmp = getenv("TMPDIR"), *fx = getenv("MS_FIXTURES");
	struct ms_inv_add_opts o;
	struct ms_err err = {0};
	char digest[MS_STATE_DIGEST_LEN], path[4096];
	const char *paths[1];

	snprintf(root, sizeof(root), "%s/ms-fz-policy-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
	assert(mkdtemp(root));
	atexit(cleanup);
	snprintf(db, sizeof(db), "%s/inv.db", root);
	assert(ms_inv_open(db, MS_INV_CREATE, &inv, &err) == MS_OK);
	for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", fx && *fx ? fx : "tests/fixtures", rel[i]);
		paths[0] = path;
		ms_inv_add_opts_init(&o);
		o.jobs = 1;
		if (ms_inv_add_paths(inv, paths, 1, &o, digest, &err) != MS_OK) {
			fprintf(stderr, "fz_policy_map: %s (run from the repository root or set "
				"MS_FIXTURES)\n", err.msg);
			abort();
		}
	}
}

static void identify(struct ms_policy_report *r)
{
	struct ms_err err = {0};
	size_t n[4] = {0};
	int rc;

	rc = ms_policy_identify(inv, r, &err);
	assert(rc == MS_OK || rc == MS_ECHECK);
	for (size_t i = 0; i < r->ntensors; i++) {
		const struct ms_policy_tensor *t = &r->tensors[i];

		assert((unsigned)t->status <= MS_POLICY_UNKNOWN);
		n[t->status]++;
		switch (t->status) {
		case MS_POLICY_MATCHED:
		case MS_POLICY_MISMATCH:
			assert(t->part >= 0 && (size_t)t->part < r->nparts);
			break;
		case MS_POLICY_RENAMED:
			assert(t->part == -1 && t->other && t->other_state[0]);
			break;
		case MS_POLICY_UNKNOWN:
			assert(t->part == -1 && !t->other);
			break;
		}
	}
	assert(n[MS_POLICY_MATCHED] == r->nmatched && n[MS_POLICY_RENAMED] == r->nrenamed &&
	       n[MS_POLICY_MISMATCH] == r->nmismatch && n[MS_POLICY_UNKNOWN] == r->nunknown);
	assert((rc == MS_OK) == (r->nmatched == r->ntensors));
	for (size_t p = 0; p < r->nparts; p++) {
		assert(!strncmp(r->parts[p].state, "sha256:", 7));
		assert(r->parts[p].served >= 1 && r->parts[p].served <= r->parts[p].state_tensors);
		assert(p == 0 || r->parts[p].served <= r->parts[p - 1].served);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ms_policy_report *r = NULL;
	struct ms_err err = {0};
	int rc;

	if (!inv)
		setup();
	rc = ms_policy_from_map((const char *)data, size, LABEL, &r, &err);
	if (rc != MS_OK) {
		assert(r == NULL);
		assert(rc == MS_EINVAL && err.code == rc);
		assert(strstr(err.msg, LABEL) != NULL);
		assert(strchr(err.msg, '\n') == NULL);
		assert(ms_policy_from_map((const char *)data, size, LABEL, &r, NULL) == rc);
		assert(r == NULL);
		return 0;
	}
	assert(r->ntensors >= 1 && r->nparts == 0);
	for (size_t i = 0; i < r->ntensors; i++) {
		assert(r->tensors[i].name && *r->tensors[i].name);
		assert(r->tensors[i].part == -1);
		assert(i == 0 || strcmp(r->tensors[i - 1].name, r->tensors[i].name) < 0);
	}
	identify(r);
	ms_policy_report_free(r);
	return 0;
}
