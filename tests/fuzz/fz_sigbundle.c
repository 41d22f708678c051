/*
 * fz_sigbundle.c: fuzz target for the signature files of attest.h: the
 * Sigstore bundle (ms_sigstore_verify), the bare DSSE envelope
 * (ms_dsse_verify) and the in-toto statement an OMS signature carries
 * (read by ms_oms_verify). The first byte picks what the rest is:
 *   'D'   a DSSE envelope, checked with the test key;
 *   'S'   a statement: signed here with the test key (the fuzzer cannot
 *         forge a signature, so this is how its bytes reach the statement
 *         reader) and verified through ms_oms_verify against a small model
 *         directory. A statement whose resources do not hash to its subject
 *         digest is refused with both digests in the message; it is tried
 *         once more with the subject digest replaced by the computed one;
 *   other the whole input is a bundle, checked in memory and, when its
 *         signature holds, as a signature file against the model.
 * The key is a fixed P-256 test key (below), so the committed bundles stay
 * valid; its public half is derived at start. Whatever the bytes, a refusal
 * is one line with the code returned (and what gets past the JSON reader
 * is JSON, cJSON agreeing), a verified envelope hands back its
 * payload (NUL added) and payload type, and a model check ends in OK, a
 * difference (MS_ECHECK, with what differs) or malformed input.
 */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "attest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LABEL "fuzz.sig"

/* A test key, used by nothing else: committed so that the corpus holds
 * bundles that verify. */
static const char test_key_pem[] =
	"-----BEGIN EC PRIVATE KEY-----\n"
	"MHcCAQEEIA0p0/+57LdGh7vAjS8UYFFlyPkM3BRG80bKVmlquIg2oAoGCCqGSM49\n"
	"AwEHoUQDQgAEVWPjdXTV0Jb6dfknaM4pAAePDMaP7L44HEjd9SSSiIwu5N5LJnd8\n"
	"h0WFd3yUC57UFjDm6HIWbKs5CnKArFpSWw==\n"
	"-----END EC PRIVATE KEY-----\n";

static char root[400], model[500], sig[500], priv_pem[500], pub_pem[500];
static struct ms_key *priv, *pub;

/* The model directory, relative to it. */
static const struct {
	const char *path, *text;
} model_files[] = {
	{"config.json", "{\"num_local_experts\": 8}\n"},
	{"model.safetensors", "not really tensors\n"},
	{"sub/notes.txt", "notes\n"},
	{".git/HEAD", "ref: refs/heads/main\n"},
};
static const char *const model_dirs[] = {"sub", ".git"};

static void cleanup(void)
{
	char path[700];

	ms_key_free(priv);
	ms_key_free(pub);
	priv = pub = NULL;
	for (size_t i = 0; i < sizeof(model_files) / sizeof(model_files[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", model, model_files[i].path);
		unlink(path);
	}
	for (size_t i = 0; i < sizeof(model_dirs) / sizeof(model_dirs[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", model, model_dirs[i]);
		rmdir(path);
	}
	rmdir(model);
	unlink(sig);
	unlink(priv_pem);
	unlink(pub_pem);
	rmdir(root);
}

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "wb");

	assert(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	struct ms_err err = {0};
	char path[700];
	EVP_PKEY *k;
	BIO *in, *out;

	snprintf(root, sizeof(root), "%s/ms-fz-sigbundle-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
	assert(mkdtemp(root));
	atexit(cleanup);
	snprintf(model, sizeof(model), "%s/model", root);
	snprintf(sig, sizeof(sig), "%s/model.sig", root);
	snprintf(priv_pem, sizeof(priv_pem), "%s/key.pem", root);
	snprintf(pub_pem, sizeof(pub_pem), "%s/key.pub", root);
	assert(mkdir(model, 0755) == 0);
	for (size_t i = 0; i < sizeof(model_dirs) / sizeof(model_dirs[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", model, model_dirs[i]);
		assert(mkdir(path, 0755) == 0);
	}
	for (size_t i = 0; i < sizeof(model_files) / sizeof(model_files[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", model, model_files[i].path);
		write_text(path, model_files[i].text);
	}
	write_text(priv_pem, test_key_pem);
	in = BIO_new_mem_buf(test_key_pem, -1);
	k = in ? PEM_read_bio_PrivateKey(in, NULL, NULL, NULL) : NULL;
	out = BIO_new_file(pub_pem, "w");
	assert(k && out && PEM_write_bio_PUBKEY(out, k) == 1);
	BIO_free(out);
	BIO_free(in);
	EVP_PKEY_free(k);
	if (ms_key_load_private(priv_pem, &priv, &err) != MS_OK ||
	    ms_key_load_public(pub_pem, &pub, &err) != MS_OK) {
		fprintf(stderr, "fz_sigbundle: %s\n", err.msg);
		abort();
	}
}

static void one_line(int rc, const struct ms_err *err)
{
	assert(err->code == rc);
	assert(err->msg[0] && strchr(err->msg, '\n') == NULL);
}

static void write_sig(const void *p, size_t n)
{
	FILE *f = fopen(sig, "wb");

	assert(f);
	assert(n == 0 || fwrite(p, 1, n, f) == n);
	assert(fclose(f) == 0);
}

static int is_hex64(const char *s)
{
	if (strlen(s) != 64)
		return 0;
	for (; *s; s++)
		if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
			return 0;
	return 1;
}

/* The model against the signature file; err gets the reason. */
static int check_model(struct ms_err *err)
{
	struct ms_oms_opts o = {0};
	struct ms_oms_result res;
	int rc;

	o.nthreads = 1;
	rc = ms_oms_verify_opts(model, sig, pub_pem, &o, &res, err);
	/* triage: what the model check said */
	if (getenv("FZ_SIGBUNDLE_VERBOSE"))
		fprintf(stderr, "fz_sigbundle: model: rc %d: %s\n", rc, rc ? err->msg : "verified");
	assert(rc == MS_OK || rc == MS_ECHECK || rc == MS_EINVAL);
	if (rc != MS_OK)
		one_line(rc, err);
	if (rc == MS_OK) {
		assert(res.fail == MS_OMS_FAIL_NONE);
		assert(res.model_name && is_hex64(res.root_digest) && is_hex64(res.key_hint));
		assert(res.nmissing == 0 && res.nextra == 0 && res.ndigest == 0);
	} else if (rc == MS_ECHECK) {
		assert(res.fail != MS_OMS_FAIL_NONE);
		if (res.fail == MS_OMS_FAIL_MISSING || res.fail == MS_OMS_FAIL_EXTRA ||
		    res.fail == MS_OMS_FAIL_DIGEST)
			assert(res.path && res.nmissing + res.nextra + res.ndigest >= 1);
	}
	ms_oms_result_release(&res);
	return rc;
}

/* Whatever the strict reader takes for JSON is JSON: a refusal for any
 * reason but malformed JSON means cJSON parses the same bytes. */
static void json_too(const uint8_t *data, size_t size, const char *msg)
{
	const char *end = NULL;
	char *text;
	cJSON *j;

	if (strstr(msg, "malformed json") || strstr(msg, "larger than"))
		return;
	text = malloc(size + 1);
	assert(text);
	memcpy(text, data, size);
	text[size] = 0;
	j = cJSON_ParseWithOpts(text, &end, 1);
	if (!j)
		fprintf(stderr, "fz_sigbundle: taken for json: %s\n", msg);
	assert(j != NULL);
	cJSON_Delete(j);
	free(text);
}

static void envelope(const uint8_t *data, size_t size, int bundle)
{
	struct ms_err err = {0};
	uint8_t *payload = NULL;
	char *ptype = NULL;
	size_t plen = 0;
	int rc;

	rc = bundle ? ms_sigstore_verify((const char *)data, size, LABEL, pub, &payload, &plen,
				       &ptype, &err)
		    : ms_dsse_verify((const char *)data, size, LABEL, pub, &payload, &plen, &ptype,
				     &err);
	if (getenv("FZ_SIGBUNDLE_VERBOSE"))
		fprintf(stderr, "fz_sigbundle: %s: rc %d: %s\n", bundle ? "bundle" : "dsse", rc,
			rc ? err.msg : "verified");
	if (rc != MS_OK) {
		assert(rc == MS_EINVAL || rc == MS_ECHECK);
		assert(payload == NULL && ptype == NULL);
		one_line(rc, &err);
		assert(strstr(err.msg, LABEL) != NULL);
		json_too(data, size, err.msg);
		return;
	}
	assert(payload && ptype && payload[plen] == 0);
	ms_free(payload);
	ms_free(ptype);
	if (bundle) {
		write_sig(data, size);
		memset(&err, 0, sizeof(err));
		check_model(&err);
	}
}

/* Replace every copy of the subject digest by the one the resources hash
 * to; NULL when the message is not that refusal. */
static uint8_t *fix_subject(const uint8_t *p, size_t n, const char *msg)
{
	const char *h = strstr(msg, "resources hash to "), *s = strstr(msg, "subject says ");
	uint8_t *copy;
	size_t hits = 0;

	if (!h || !s || strlen(h + 18) < 64 || strlen(s + 13) < 64)
		return NULL;
	copy = malloc(n ? n : 1);
	assert(copy);
	memcpy(copy, p, n);
	for (size_t i = 0; i + 64 <= n; i++)
		if (!memcmp(copy + i, s + 13, 64)) {
			memcpy(copy + i, h + 18, 64);
			hits++;
		}
	if (!hits) {
		free(copy);
		return NULL;
	}
	return copy;
}

static int sign_and_check(const uint8_t *p, size_t n, struct ms_err *err)
{
	char *b = NULL;
	size_t blen = 0;

	assert(ms_sigstore_sign(p, n, MS_OMS_PAYLOAD_TYPE, priv, &b, &blen, err) == MS_OK);
	write_sig(b, blen);
	ms_free(b);
	return check_model(err);
}

static void statement(const uint8_t *data, size_t size)
{
	struct ms_err err = {0};
	uint8_t *fixed;

	if (sign_and_check(data, size, &err) == MS_EINVAL &&
	    (fixed = fix_subject(data, size, err.msg))) {
		memset(&err, 0, sizeof(err));
		sign_and_check(fixed, size, &err);
		free(fixed);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!priv)
		setup();
	if (size && data[0] == 'D')
		envelope(data + 1, size - 1, 0);
	else if (size && data[0] == 'S')
		statement(data + 1, size - 1);
	else
		envelope(data, size, 1);
	return 0;
}
