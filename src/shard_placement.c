/*
 * shard_placement.c: the expert -> rank placement of a shard set: the
 * built-in kinds, an explicit one in JSON, and comparing two (shard.h).
 */
#include "shard_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fsutil.h"
#include "hash.h"
#include "inventory.h"
#include "names.h"
#include "safetensors.h"
#include "stage.h"

/* ---- placement ----------------------------------------------------------- */

const char *ms_ep_placement_name(enum ms_ep_placement_kind kind)
{
	switch (kind) {
	case MS_EP_PLACEMENT_CONTIGUOUS: return "contiguous";
	case MS_EP_PLACEMENT_ROUND_ROBIN: return "round-robin";
	case MS_EP_PLACEMENT_MAP: return "map";
	}
	return "?";
}

void ms_ep_placement_free(struct ms_ep_placement *p)
{
	if (!p)
		return;
	ms_free(p->rank_of);
	ms_free(p->local_of);
	ms_free(p->first);
	ms_free(p->ids);
	ms_free(p);
}

static int placement_alloc(uint32_t e, uint32_t n, struct ms_ep_placement **out,
			   struct ms_err *err)
{
	struct ms_ep_placement *p = ms_calloc(1, sizeof(*p));

	*out = NULL;
	if (!p)
		return ms_err_nomem(err);
	p->num_experts = e;
	p->ep_size = n;
	p->rank_of = ms_calloc(e ? e : 1, sizeof(uint32_t));
	p->local_of = ms_calloc(e ? e : 1, sizeof(uint32_t));
	p->first = ms_calloc((size_t)n + 1, sizeof(uint32_t));
	p->ids = ms_calloc(e ? e : 1, sizeof(uint32_t));
	if (!p->rank_of || !p->local_of || !p->first || !p->ids) {
		ms_ep_placement_free(p);
		return ms_err_nomem(err);
	}
	*out = p;
	return MS_OK;
}

static void placement_index(struct ms_ep_placement *p)
{
	for (uint32_t r = 0; r < p->ep_size; r++)
		for (uint32_t i = p->first[r]; i < p->first[r + 1]; i++) {
			p->rank_of[p->ids[i]] = r;
			p->local_of[p->ids[i]] = i - p->first[r];
		}
}

int shard_placement_builtin(enum ms_ep_placement_kind kind, uint32_t e, uint32_t n,
			    struct ms_ep_placement **out, struct ms_err *err)
{
	struct ms_ep_placement *p;
	uint32_t l;
	int rc;

	*out = NULL;
	if (n == 0 || n > MS_EP_MAX_RANKS)
		return ms_err_set(err, MS_EINVAL, "ep size %u is not in 1..%u", n, MS_EP_MAX_RANKS);
	if (e == 0 || e > MS_EP_MAX_EXPERTS)
		return ms_err_set(err, MS_EINVAL, "number of experts %u is not in 1..%u", e,
				  MS_EP_MAX_EXPERTS);
	if (e % n)
		return ms_err_set(err, MS_EINVAL,
				  "%u experts do not divide evenly over %u ranks: the %s placement "
				  "needs a multiple; give an explicit placement map",
				  e, n, ms_ep_placement_name(kind));
	if ((rc = placement_alloc(e, n, &p, err)) != MS_OK)
		return rc;
	p->kind = kind;
	l = e / n;
	for (uint32_t r = 0; r <= n; r++)
		p->first[r] = r * l;
	for (uint32_t r = 0; r < n; r++)
		for (uint32_t i = 0; i < l; i++)
			p->ids[r * l + i] = kind == MS_EP_PLACEMENT_CONTIGUOUS ? r * l + i : i * n + r;
	placement_index(p);
	*out = p;
	return MS_OK;
}

/* An integral JSON number in [0, max]. */
int shard_json_u64(const cJSON *j, uint64_t max, uint64_t *out)
{
	double v;

	if (!cJSON_IsNumber(j))
		return -1;
	v = j->valuedouble;
	if (!(v >= 0) || v > (double)max || v != floor(v) || v > 9007199254740992.0)
		return -1;
	*out = (uint64_t)v;
	return 0;
}

int shard_placement_from_ranks(const cJSON *ranks, const char *label, uint32_t e,
				uint32_t n, struct ms_ep_placement **out,
				struct ms_err *err)
{
	struct ms_ep_placement *p = NULL;
	uint8_t *seen = NULL;
	uint64_t total = 0, nr;
	const cJSON *rank, *id;
	uint32_t r, k;
	int rc = MS_OK;

	*out = NULL;
	if (!cJSON_IsArray(ranks))
		return ms_err_set(err, MS_EINVAL, "'%s': \"ranks\" must be an array of arrays of expert ids",
				  label);
	nr = (uint64_t)cJSON_GetArraySize(ranks);
	if (nr == 0 || nr > MS_EP_MAX_RANKS)
		return ms_err_set(err, MS_EINVAL, "'%s': %llu ranks; want 1..%u", label,
				  (unsigned long long)nr, MS_EP_MAX_RANKS);
	if (n && nr != n)
		return ms_err_set(err, MS_EINVAL, "'%s': the map has %llu ranks, but the ep size is %u",
				  label, (unsigned long long)nr, n);
	cJSON_ArrayForEach(rank, ranks) {
		if (!cJSON_IsArray(rank))
			return ms_err_set(err, MS_EINVAL, "'%s': every rank must be an array of expert ids",
					  label);
		total += (uint64_t)cJSON_GetArraySize(rank);
	}
	if (total == 0 || total > MS_EP_MAX_EXPERTS)
		return ms_err_set(err, MS_EINVAL, "'%s': the map places %llu experts; want 1..%u", label,
				  (unsigned long long)total, MS_EP_MAX_EXPERTS);
	if (e && total != e)
		return ms_err_set(err, MS_EINVAL, "'%s': the map places %llu experts, but the model has %u",
				  label, (unsigned long long)total, e);
	if ((rc = placement_alloc((uint32_t)total, (uint32_t)nr, &p, err)) != MS_OK)
		return rc;
	p->kind = MS_EP_PLACEMENT_MAP;
	seen = ms_calloc((size_t)total, 1);
	if (!seen) {
		rc = ms_err_nomem(err);
		goto out;
	}
	r = 0;
	k = 0;
	cJSON_ArrayForEach(rank, ranks) {
		p->first[r] = k;
		cJSON_ArrayForEach(id, rank) {
			uint64_t v;

			if (shard_json_u64(id, total - 1, &v)) {
				rc = ms_err_set(err, MS_EINVAL,
						"'%s': rank %u: expert ids must be integers in 0..%llu",
						label, r, (unsigned long long)(total - 1));
				goto out;
			}
			if (seen[v]) {
				rc = ms_err_set(err, MS_EINVAL, "'%s': expert %llu is placed twice",
						label, (unsigned long long)v);
				goto out;
			}
			seen[v] = 1;
			p->ids[k++] = (uint32_t)v;
		}
		r++;
	}
	p->first[r] = k;
	placement_index(p);
	*out = p;
	p = NULL;
out:
	ms_free(seen);
	ms_ep_placement_free(p);
	return rc;
}

int ms_ep_placement_from_json(const char *text, size_t len, const char *label,
			      uint32_t num_experts, uint32_t ep_size,
			      struct ms_ep_placement **out, struct ms_err *err)
{
	cJSON *root;
	int rc, nomem;

	*out = NULL;
	root = ms_json_parse(text, len, &nomem);
	if (nomem)
		return ms_err_nomem(err);
	if (!root || !cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return ms_err_set(err, MS_EINVAL, "'%s': not a JSON object {\"ranks\": [[...], ...]}",
				  label);
	}
	rc = shard_placement_from_ranks(cJSON_GetObjectItemCaseSensitive(root, "ranks"), label,
				        num_experts, ep_size, out, err);
	cJSON_Delete(root);
	return rc;
}

int ms_ep_placement_new(const char *spec, uint32_t num_experts, uint32_t ep_size,
			struct ms_ep_placement **out, struct ms_err *err)
{
	char *text = NULL;
	size_t len;
	int rc;

	*out = NULL;
	if (!spec || !strcmp(spec, "contiguous"))
		return shard_placement_builtin(MS_EP_PLACEMENT_CONTIGUOUS, num_experts, ep_size, out, err);
	if (!strcmp(spec, "round-robin") || !strcmp(spec, "round_robin"))
		return shard_placement_builtin(MS_EP_PLACEMENT_ROUND_ROBIN, num_experts, ep_size, out,
					       err);
	if ((rc = ms_file_read(spec, MAX_MAP_FILE, &text, &len, err)) != MS_OK) {
		if (rc == MS_ENOTFOUND || rc == MS_EIO)
			ms_err_prefix(err, "placement '%s' is neither contiguous, round-robin nor a "
				      "readable map file", spec);
		return rc;
	}
	rc = ms_ep_placement_from_json(text, len, spec, num_experts, ep_size, out, err);
	ms_free(text);
	return rc;
}

int shard_placement_equal(const struct ms_ep_placement *a, const struct ms_ep_placement *b)
{
	return a->num_experts == b->num_experts && a->ep_size == b->ep_size &&
	       !memcmp(a->first, b->first, ((size_t)a->ep_size + 1) * sizeof(uint32_t)) &&
	       !memcmp(a->ids, b->ids, (size_t)a->num_experts * sizeof(uint32_t));
}

int shard_placement_copy(const struct ms_ep_placement *a, struct ms_ep_placement **out,
			 struct ms_err *err)
{
	int rc = placement_alloc(a->num_experts, a->ep_size, out, err);

	if (rc != MS_OK)
		return rc;
	(*out)->kind = a->kind;
	memcpy((*out)->first, a->first, ((size_t)a->ep_size + 1) * sizeof(uint32_t));
	memcpy((*out)->ids, a->ids, (size_t)a->num_experts * sizeof(uint32_t));
	placement_index(*out);
	return MS_OK;
}
