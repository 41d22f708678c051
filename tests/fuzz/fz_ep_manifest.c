/*
 * fz_ep_manifest.c: fuzz target for the EP shard set manifest
 * (ep_manifest.json, shard.h) and the placement map format it embeds.
 *
 * At start the qwen3moe-E8-r4 adapter (fused expert LoRA, 8 experts) is
 * split once for EP size 2 into a scratch directory. Each input is then
 *   - parsed as a placement map (ms_ep_placement_from_json): an accepted
 *     map places every expert exactly once, and is accepted again, equal,
 *     when its own sizes are given, refused with another expert count;
 *   - written as the set's ep_manifest.json, beside the two valid shards
 *     and the adapter_config.json, and the set is checked (ms_shard_check)
 *     and one rank loaded (ms_ep_load_rank, the rank the input's length
 *     picks). Whatever the manifest claims, the result is an answer with
 *     one error line, never a read outside a shard; an accepted set is
 *     the two shards with a placement that is a permutation.
 * The original manifest is in the corpus, so the fuzzer starts from a set
 * that checks.
 */
#include <assert.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LABEL "fuzz-map.json"
#define EP 2u

static char root[400], set[500], manifest[600];

static void cleanup(void)
{
	char path[900];
	struct dirent *de;
	DIR *d = opendir(set);

	while (d && (de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", set, de->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(set);
	rmdir(root);
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR"), *fx = getenv("MS_FIXTURES");
	struct ms_shard_opts o = {0};
	struct ms_shard_result *res = NULL;
	struct ms_err err = {0};
	char src[4096];

	snprintf(root, sizeof(root), "%s/ms-fz-ep-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
	assert(mkdtemp(root));
	atexit(cleanup);
	snprintf(set, sizeof(set), "%s/set", root);
	snprintf(manifest, sizeof(manifest), "%s/%s", set, MS_EP_MANIFEST);
	snprintf(src, sizeof(src), "%s/peft/qwen3moe-E8-r4/adapter",
		 fx && *fx ? fx : "tests/fixtures");
	o.ep_size = EP;
	o.nthreads = 1;
	if (ms_shard_split(src, set, &o, &res, &err) != MS_OK) {
		fprintf(stderr, "fz_ep_manifest: %s (run from the repository root or set "
			"MS_FIXTURES)\n", err.msg);
		abort();
	}
	ms_shard_result_free(res);
}

static void check_placement(const struct ms_ep_placement *p)
{
	uint8_t *seen = calloc(p->num_experts ? p->num_experts : 1, 1);

	assert(seen);
	assert(p->num_experts >= 1 && p->num_experts <= MS_EP_MAX_EXPERTS);
	assert(p->ep_size >= 1 && p->ep_size <= MS_EP_MAX_RANKS);
	assert(p->first[0] == 0 && p->first[p->ep_size] == p->num_experts);
	for (uint32_t r = 0; r < p->ep_size; r++) {
		assert(p->first[r] <= p->first[r + 1]);
		for (uint32_t i = p->first[r]; i < p->first[r + 1]; i++) {
			uint32_t e = p->ids[i];

			assert(e < p->num_experts && !seen[e]);
			seen[e] = 1;
			assert(p->rank_of[e] == r && p->local_of[e] == i - p->first[r]);
		}
	}
	free(seen);
}

static void placement_map(const uint8_t *data, size_t size)
{
	struct ms_ep_placement *p = NULL, *q = NULL;
	struct ms_err err = {0};
	int rc;

	rc = ms_ep_placement_from_json((const char *)data, size, LABEL, 0, 0, &p, &err);
	if (rc != MS_OK) {
		assert(p == NULL && rc == MS_EINVAL && err.code == rc);
		assert(strstr(err.msg, LABEL) && !strchr(err.msg, '\n'));
		return;
	}
	check_placement(p);
	assert(p->kind == MS_EP_PLACEMENT_MAP);
	assert(ms_ep_placement_from_json((const char *)data, size, LABEL, p->num_experts,
					 p->ep_size, &q, &err) == MS_OK);
	assert(q->num_experts == p->num_experts && q->ep_size == p->ep_size);
	assert(!memcmp(q->ids, p->ids, p->num_experts * sizeof(uint32_t)));
	assert(!memcmp(q->first, p->first, (p->ep_size + 1) * sizeof(uint32_t)));
	ms_ep_placement_free(q);
	q = NULL;
	assert(ms_ep_placement_from_json((const char *)data, size, LABEL, p->num_experts + 1,
					 0, &q, &err) == MS_EINVAL && q == NULL);
	ms_ep_placement_free(p);
}

static void check_set(void)
{
	struct ms_shard_opts o = {0};
	struct ms_shard_result *res = NULL;
	struct ms_err err = {0};
	int rc;

	o.nthreads = 1;
	rc = ms_shard_check(set, &o, &res, &err);
	if (getenv("FZ_EP_VERBOSE"))
		fprintf(stderr, "fz_ep_manifest: check: rc %d: %s\n", rc, rc ? err.msg : "ok");
	if (rc != MS_OK) {
		/* a failed check describes the set with every fault found */
		assert(rc != MS_ENOMEM && (res == NULL || (rc == MS_ECHECK && res->nfaults > 0)));
		assert(err.code == rc && err.msg[0] && !strchr(err.msg, '\n'));
		for (size_t i = 0; res && i < res->nfaults; i++)
			assert(res->faults[i].msg[0] && !strchr(res->faults[i].msg, '\n') &&
			       res->faults[i].file);
		if (res)
			assert(strstr(err.msg, res->faults[0].msg) == err.msg);
		ms_shard_result_free(res);
		return;
	}
	assert(res && res->ep_size == EP && res->nfiles == EP && res->is_adapter);
	assert(res->placement && res->placement->ep_size == EP);
	check_placement(res->placement);
	for (size_t i = 0; i < res->nfiles; i++)
		assert(res->files[i].rank == i && !strncmp(res->files[i].state_digest, "sha256:", 7));
	ms_shard_result_free(res);
}

static void load_rank(uint32_t rank)
{
	struct ms_ep_rank *r = NULL;
	struct ms_err err = {0};
	int rc;

	rc = ms_ep_load_rank(set, EP, rank, &r, &err);
	if (rc != MS_OK) {
		assert(r == NULL && rc != MS_ENOMEM);
		assert(err.code == rc && err.msg[0] && !strchr(err.msg, '\n'));
		return;
	}
	assert(r->rank == rank && r->ep_size == EP && r->ckpt && r->ckpt->nfiles == 1);
	assert(r->nexperts <= r->num_experts);
	for (uint32_t i = 0; i < r->nexperts; i++)
		assert(r->experts[i] < r->num_experts);
	ms_ep_rank_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FILE *f;

	if (!set[0])
		setup();
	placement_map(data, size);
	f = fopen(manifest, "wb");
	assert(f);
	assert(size == 0 || fwrite(data, 1, size, f) == size);
	assert(fclose(f) == 0);
	check_set();
	load_rank((uint32_t)(size % EP));
	return 0;
}
