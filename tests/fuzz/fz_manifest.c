/*
 * fz_manifest.c: fuzz target for the state manifest parser
 * (ms_manifest_parse, verify.h). The input is the manifest's bytes; its
 * root is a scratch directory holding a small valid model.safetensors and
 * a config.json, so the paths a manifest names can exist.
 *
 * A manifest whose tensors do not give its "state" is refused with both
 * digests in the message; the fuzzer cannot compute a SHA-256, so such an
 * input is tried once more with the claimed digest replaced by the one the
 * message gives, and the parser is fuzzed past that check too. Whatever the
 * bytes:
 *   - a refusal is one line naming the manifest, with the code returned;
 *   - an accepted manifest has only plain relative paths, ranks within
 *     bounds and tensors that give its digest; written back out
 *     (ms_manifest_write) it parses to the same state; and verifying the
 *     scratch directory against it ends in a list of problems or a match,
 *     never a crash, whatever offsets and sizes it claims.
 */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "verify.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LABEL "fuzz-manifest.json"

static char root[400];

static void cleanup(void)
{
	char path[500];

	snprintf(path, sizeof(path), "%s/model.safetensors", root);
	unlink(path);
	snprintf(path, sizeof(path), "%s/config.json", root);
	unlink(path);
	rmdir(root);
}

/* Two BF16 tensors: an expert weight and a norm. */
static void write_model(const char *path)
{
	static const char hdr[] =
		"{\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"BF16\",\"shape\":[4],"
		"\"data_offsets\":[0,8]},"
		"\"model.layers.0.mlp.experts.0.up_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[2,4],"
		"\"data_offsets\":[8,24]}}";
	size_t n = sizeof(hdr) - 1, pad = (8 - n % 8) % 8;
	uint8_t len8[8], body[24];
	FILE *f;

	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)(n + pad) >> (8 * i));
	for (int i = 0; i < 24; i++)
		body[i] = (uint8_t)(i * 37 + 1);
	f = fopen(path, "wb");
	assert(f);
	assert(fwrite(len8, 1, 8, f) == 8);
	assert(fwrite(hdr, 1, n, f) == n);
	assert(fwrite("        ", 1, pad, f) == pad);
	assert(fwrite(body, 1, sizeof(body), f) == sizeof(body));
	assert(fclose(f) == 0);
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	char path[500];
	FILE *f;

	snprintf(root, sizeof(root), "%s/ms-fz-manifest-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
	assert(mkdtemp(root));
	atexit(cleanup);
	snprintf(path, sizeof(path), "%s/model.safetensors", root);
	write_model(path);
	snprintf(path, sizeof(path), "%s/config.json", root);
	f = fopen(path, "wb");
	assert(f && fputs("{\"num_local_experts\": 8}\n", f) >= 0 && fclose(f) == 0);
}

static int plain_relative(const char *p)
{
	size_t n = strlen(p);

	if (!n || p[0] == '/' || p[n - 1] == '/' || strstr(p, "//"))
		return 0;
	for (const char *c = p; c; c = strchr(c, '/') ? strchr(c, '/') + 1 : NULL)
		if ((c[0] == '.' && (c[1] == '/' || !c[1])) ||
		    (c[0] == '.' && c[1] == '.' && (c[2] == '/' || !c[2])))
			return 0;
	return 1;
}

static int eq_str(const char *a, const char *b)
{
	return a == b || (a && b && !strcmp(a, b));
}

static void check_same(const struct ms_vstate *a, const struct ms_vstate *b)
{
	assert(!strcmp(a->digest, b->digest));
	assert(eq_str(a->kind, b->kind) && eq_str(a->label, b->label) &&
	       eq_str(a->layout, b->layout));
	assert(a->ep_size == b->ep_size && a->ep_rank == b->ep_rank);
	assert(a->nfiles == b->nfiles && a->nconfigs == b->nconfigs);
	for (size_t i = 0; i < a->nfiles; i++) {
		const struct ms_vfile *x = &a->files[i], *y = &b->files[i];

		assert(!strcmp(x->path, y->path) && x->size == y->size);
		assert(x->has_file_digest == y->has_file_digest);
		assert(!memcmp(x->header_digest, y->header_digest, 32));
		assert(!x->has_file_digest || !memcmp(x->file_digest, y->file_digest, 32));
		assert(x->ntensors == y->ntensors);
		for (size_t t = 0; t < x->ntensors; t++) {
			const struct ms_vtensor *u = &x->tensors[t], *v = &y->tensors[t];

			assert(!strcmp(u->name, v->name) && u->dtype == v->dtype);
			assert(u->ndim == v->ndim && u->offset == v->offset && u->nbytes == v->nbytes);
			assert(!memcmp(u->shape, v->shape, u->ndim * sizeof(uint64_t)));
			assert(!memcmp(u->digest, v->digest, 32));
		}
	}
	for (size_t i = 0; i < a->nconfigs; i++) {
		assert(!strcmp(a->configs[i].path, b->configs[i].path));
		assert(!memcmp(a->configs[i].digest, b->configs[i].digest, 32));
	}
}

static void accepted(const struct ms_vstate *s)
{
	struct ms_vstate *again = NULL;
	struct ms_vreport rep;
	struct ms_err err = {0};
	char digest[MS_STATE_DIGEST_LEN], *json = NULL;
	int rc;

	assert(!strcmp(s->root, root));
	assert(s->nfiles >= 1);
	assert((s->ep_size == -1 && s->ep_rank == -1) ||
	       (s->ep_size > 0 && s->ep_rank >= 0 && s->ep_rank < s->ep_size));
	for (size_t i = 0; i < s->nfiles; i++) {
		assert(plain_relative(s->files[i].path));
		for (size_t t = 0; t < s->files[i].ntensors; t++)
			assert(*s->files[i].tensors[t].name &&
			       s->files[i].tensors[t].ndim <= MS_ST_MAX_RANK);
	}
	for (size_t i = 0; i < s->nconfigs; i++)
		assert(plain_relative(s->configs[i].path));
	assert(ms_vstate_digest(s, digest, &err) == MS_OK && !strcmp(digest, s->digest));

	/* written back out, the same state */
	assert(ms_manifest_write(s, NULL, &json, &err) == MS_OK);
	rc = ms_manifest_parse(json, strlen(json), LABEL, root, &again, &err);
	if (rc != MS_OK)
		fprintf(stderr, "fz_manifest: round trip: %s\n", err.msg);
	assert(rc == MS_OK);
	check_same(s, again);
	ms_vstate_free(again);
	ms_free(json);

	/* the scratch directory against whatever the manifest claims */
	rc = ms_verify_state(s, 1, &rep, &err);
	if (rc != MS_OK && rc != MS_ECHECK)
		fprintf(stderr, "fz_manifest: verify: rc %d: %s\n", rc, err.msg);
	assert(rc == MS_OK || rc == MS_ECHECK);
	assert((rc == MS_OK) == (rep.nproblems == 0));
	for (size_t i = 0; i < rep.nproblems; i++)
		assert(rep.problems[i].detail && !strchr(rep.problems[i].detail, '\n'));
	assert(rep.nfiles <= s->nfiles);
	ms_vreport_release(&rep);
}

/* Replace every copy of the claimed digest by the computed one (same
 * length); returns NULL when the message is not the digest mismatch. */
static char *fix_digest(const uint8_t *data, size_t size, const char *msg)
{
	const char *g = strstr(msg, "give state sha256:"), *m = strstr(msg, "manifest says sha256:");
	char got[MS_STATE_DIGEST_LEN], said[MS_STATE_DIGEST_LEN], *copy;
	size_t n = MS_STATE_DIGEST_LEN - 1, hits = 0;

	if (!g || !m || strlen(g + 11) < n || strlen(m + 14) < n)
		return NULL;
	memcpy(got, g + 11, n);
	memcpy(said, m + 14, n);
	got[n] = said[n] = 0;
	copy = malloc(size + 1);
	assert(copy);
	memcpy(copy, data, size);
	copy[size] = 0;
	for (size_t i = 0; i + n <= size; i++)
		if (!memcmp(copy + i, said, n)) {
			memcpy(copy + i, got, n);
			hits++;
		}
	if (!hits) {
		free(copy);
		return NULL;
	}
	return copy;
}

static void check_refusal(int rc, const struct ms_vstate *s, const struct ms_err *err)
{
	assert(s == NULL);
	assert(rc == MS_EINVAL || rc == MS_ECHECK);
	assert(err->code == rc);
	assert(strstr(err->msg, LABEL) != NULL);
	assert(strchr(err->msg, '\n') == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ms_vstate *s = NULL;
	struct ms_err err = {0};
	char *fixed;
	int rc;

	if (!root[0])
		setup();
	rc = ms_manifest_parse((const char *)data, size, LABEL, root, &s, &err);
	if (rc == MS_ECHECK && (fixed = fix_digest(data, size, err.msg))) {
		check_refusal(rc, s, &err);
		memset(&err, 0, sizeof(err));
		rc = ms_manifest_parse(fixed, size, LABEL, root, &s, &err);
		free(fixed);
	}
	/* triage: what the parser said */
	if (getenv("FZ_MANIFEST_VERBOSE"))
		fprintf(stderr, "fz_manifest: rc %d: %s\n", rc, rc ? err.msg : "accepted");
	if (rc != MS_OK) {
		check_refusal(rc, s, &err);
		return 0;
	}
	accepted(s);
	ms_vstate_free(s);
	return 0;
}
