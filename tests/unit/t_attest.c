/*
 * t_attest.c: OpenSSF Model Signing. Expected values come from outside the
 * code under test: the DSSE specification's PAE example, Python's
 * PurePosixPath order written out by hand, SHA-256 known answers and a root
 * digest computed with Python's hashlib, signatures checked with OpenSSL
 * directly and base64 through OpenSSL's own codec.
 */
#include <sys/stat.h>

#include <openssl/evp.h>
#include <openssl/pem.h>

#include "attest.h"
#include "test.h"

/* ---- helpers ------------------------------------------------------------ */

static char *tpath(const char *name)
{
	return ms_path_join(T_TMP, name);
}

static int put_file(const char *dir, const char *rel, const char *content)
{
	char *p = ms_path_join(dir, rel), *slash;
	FILE *f;
	int rc = 0;

	for (slash = strchr(p + strlen(dir) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = 0;
		mkdir(p, 0755);
		*slash = '/';
	}
	f = fopen(p, "wb");
	if (!f || fwrite(content, 1, strlen(content), f) != strlen(content))
		rc = -1;
	if (f && fclose(f))
		rc = -1;
	ms_free(p);
	return rc;
}

/* A fresh EC key pair: name.pem (private), name.pub (public). */
static int make_key(const char *name, const char *curve)
{
	EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "EC", curve);
	char *priv = ms_asprintf("%s/%s.pem", T_TMP, name);
	char *pub = ms_asprintf("%s/%s.pub", T_TMP, name);
	FILE *f1 = fopen(priv, "w"), *f2 = fopen(pub, "w");
	int ok = k && f1 && f2 && PEM_write_PrivateKey(f1, k, NULL, NULL, 0, NULL, NULL) &&
		 PEM_write_PUBKEY(f2, k);

	if (f1)
		fclose(f1);
	if (f2)
		fclose(f2);
	EVP_PKEY_free(k);
	ms_free(priv);
	ms_free(pub);
	return ok ? 0 : -1;
}

/* Every case may run alone (t_attest NAME): keys are made on first use. */
static char *key_path(const char *name, const char *ext)
{
	static int ready;

	if (!ready) {
		if (make_key("k256", "P-256") || make_key("k384", "P-384"))
			return NULL;
		ready = 1;
	}
	return ms_asprintf("%s/%s.%s", T_TMP, name, ext);
}

/* The model of the root digest test: four files plus ignored git files. */
static char *make_model(const char *name)
{
	char *dir = tpath(name);

	mkdir(dir, 0755);
	if (put_file(dir, ".hidden", "x") || put_file(dir, "a/b/c", "") ||
	    put_file(dir, "a-b", "hello\n") || put_file(dir, "a.b", "abc") ||
	    put_file(dir, ".git/HEAD", "ref: refs/heads/main\n") ||
	    put_file(dir, ".gitattributes", "*.bin filter=lfs\n")) {
		ms_free(dir);
		return NULL;
	}
	return dir;
}

static int sign_model(const char *dir, const char *key, const char *sig)
{
	char *k = key_path(key, "pem");
	struct ms_err err = {0};
	int rc = ms_oms_sign(dir, k, sig, 2, &err);

	if (rc != MS_OK)
		fprintf(stderr, "sign: %s\n", err.msg);
	ms_free(k);
	return rc;
}

static int verify_model(const char *dir, const char *key, const char *sig,
			struct ms_oms_result *res, struct ms_err *err)
{
	char *p = key_path(key, "pub");
	int rc = ms_oms_verify(dir, sig, p, res, err);

	ms_free(p);
	return rc;
}

static char *slurp(const char *path, size_t *n)
{
	char *s = NULL;
	struct ms_err err = {0};

	if (ms_file_read(path, 1u << 26, &s, n, &err) != MS_OK)
		return NULL;
	return s;
}

static int spit(const char *path, const char *s, size_t n)
{
	FILE *f = fopen(path, "wb");
	int ok = f && fwrite(s, 1, n, f) == n;

	if (f && fclose(f))
		ok = 0;
	return ok ? 0 : -1;
}

/* The value of "name":"..." in compact JSON (a new string), or NULL. */
static char *json_field(const char *json, const char *name)
{
	char *pat = ms_asprintf("\"%s\":\"", name);
	const char *p = strstr(json, pat), *e;
	char *v = NULL;

	if (p) {
		p += strlen(pat);
		e = strchr(p, '"');
		if (e)
			v = ms_strndup(p, (size_t)(e - p));
	}
	ms_free(pat);
	return v;
}

/* Replace the value of a "name":"..." field. */
static char *json_replace(const char *json, const char *name, const char *value)
{
	char *pat = ms_asprintf("\"%s\":\"", name);
	const char *p = strstr(json, pat), *e;
	char *out = NULL;

	if (p) {
		p += strlen(pat);
		e = strchr(p, '"');
		out = ms_asprintf("%.*s%s%s", (int)(p - json), json, value, e);
	}
	ms_free(pat);
	return out;
}

static uint8_t *b64d(const char *s, size_t *n)
{
	size_t len = strlen(s);
	uint8_t *out = ms_malloc(len + 1);
	int k = EVP_DecodeBlock(out, (const unsigned char *)s, (int)len);
	size_t pad = (len && s[len - 1] == '=') + (len > 1 && s[len - 2] == '=');

	if (k < 0) {
		ms_free(out);
		return NULL;
	}
	*n = (size_t)k - pad;
	out[*n] = 0;
	return out;
}

static char *b64e(const uint8_t *p, size_t n)
{
	char *out = ms_malloc(4 * (n / 3 + 1) + 1);

	EVP_EncodeBlock((unsigned char *)out, p, (int)n);
	return out;
}

/* ---- cases -------------------------------------------------------------- */

/* The example of the DSSE v1.0 protocol document. */
static int test_pae_spec_example(void)
{
	static const char want[] =
		"DSSEv1 29 http://example.com/HelloWorld 11 hello world";
	uint8_t *p = NULL;
	size_t n = 0;

	T_ASSERT_EQ_INT(ms_dsse_pae("http://example.com/HelloWorld", "hello world", 11, &p, &n),
			MS_OK);
	T_ASSERT_EQ_INT(n, sizeof(want) - 1);
	T_ASSERT(!memcmp(p, want, n));
	ms_free(p);
	T_ASSERT_EQ_INT(ms_dsse_pae("t", "", 0, &p, &n), MS_OK);
	T_ASSERT_EQ_INT(n, 13);
	T_ASSERT(!memcmp(p, "DSSEv1 1 t 0 ", 13));
	ms_free(p);
	return 0;
}

static int cmp_names(const void *a, const void *b)
{
	return ms_oms_path_cmp(*(const char *const *)a, *(const char *const *)b);
}

/* PurePosixPath compares lists of components: "a/b" < "a/b/c" < "a-b" <
 * "a.b" although '-' and '.' sort before '/' as bytes. */
static int test_path_order(void)
{
	const char *names[] = {"a.b", "b", "a/b.x", "a0", "a-b", "a/b/c", "a",
			       "a/b0", "a/b", ".hidden", "A", "a/b/c/d", "\xc3\xa9"};
	const char *want[] = {".hidden", "A", "a", "a/b", "a/b/c", "a/b/c/d", "a/b.x",
			      "a/b0", "a-b", "a.b", "a0", "b", "\xc3\xa9"};
	size_t n = sizeof(names) / sizeof(names[0]);

	qsort(names, n, sizeof(names[0]), cmp_names);
	for (size_t i = 0; i < n; i++)
		T_ASSERT_STR(names[i], want[i]);
	T_ASSERT_EQ_INT(ms_oms_path_cmp("a/b", "a/b"), 0);
	T_ASSERT(ms_oms_path_cmp("a/b", "a.b") < 0);
	T_ASSERT(ms_oms_path_cmp("a.b", "a/b") > 0);
	T_ASSERT(ms_oms_path_cmp("a/b", "a/b/c") < 0);
	return 0;
}

static int test_model_name(void)
{
	char *n;

	n = ms_oms_model_name("models/qwen/");
	T_ASSERT_STR(n, "qwen");
	ms_free(n);
	n = ms_oms_model_name("models/qwen/.");
	T_ASSERT_STR(n, "qwen");
	ms_free(n);
	n = ms_oms_model_name(T_TMP);
	T_ASSERT_STR(n, ms_path_base(T_TMP));
	ms_free(n);
	return 0;
}

/* Root digest: SHA-256 over the raw file digests in path order, the value
 * computed with Python's hashlib for these contents in this order:
 * .hidden "x", a/b/c "", a-b "hello\n", a.b "abc". */
static int test_root_digest(void)
{
	static const char root[] =
		"ec560b0ce718bd55fbf3961cc64f30bbff7fe39cd5d48a39e0a1ad8a0d6fa1e9";
	char *dir = make_model("root"), *sig = tpath("root.sig"), *pub = key_path("k256", "pub");
	char *text = NULL, *pt = NULL, *a, *b, *c, *d;
	struct ms_oms_result res = {0};
	struct ms_key *k = NULL;
	struct ms_err err = {0};
	uint8_t *payload = NULL;
	size_t n = 0, pn = 0;

	T_ASSERT(dir);
	T_ASSERT_EQ_INT(sign_model(dir, "k256", sig), MS_OK);
	T_ASSERT_EQ_INT(verify_model(dir, "k256", sig, &res, &err), MS_OK);
	T_ASSERT_STR(res.root_digest, root);
	T_ASSERT_EQ_INT(res.nfiles, 4);
	T_ASSERT_STR(res.model_name, "root");
	ms_oms_result_release(&res);

	text = slurp(sig, &n);
	T_ASSERT(text);
	{
		static const char head[] =
			"{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\","
			"\"verificationMaterial\":{\"publicKey\":{\"hint\":\"";

		T_ASSERT(!strncmp(text, head, sizeof(head) - 1));
	}
	T_ASSERT_EQ_INT(ms_key_load_public(pub, &k, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_sigstore_verify(text, n, "root.sig", k, &payload, &pn, &pt, &err), MS_OK);
	T_ASSERT_STR(pt, "application/vnd.in-toto+json");
	T_ASSERT(strstr((char *)payload, root));
	T_ASSERT(strstr((char *)payload, "\"predicateType\": \"https://model_signing/signature/v1.0\""));
	T_ASSERT(strstr((char *)payload, "\"_type\": \"https://in-toto.io/Statement/v1\""));
	/* known answers of SHA-256 ("abc", "") and the order of resources */
	a = strstr((char *)payload, "\"name\": \".hidden\"");
	b = strstr((char *)payload, "\"name\": \"a/b/c\"");
	c = strstr((char *)payload, "\"name\": \"a-b\"");
	d = strstr((char *)payload, "\"name\": \"a.b\"");
	T_ASSERT(a && b && c && d && a < b && b < c && c < d);
	T_ASSERT(strstr(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
	T_ASSERT(strstr(b, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
	T_ASSERT(!strstr((char *)payload, "HEAD"));
	T_ASSERT(strstr((char *)payload, "\"ignore_paths\""));
	ms_free(payload);
	ms_free(pt);
	ms_key_free(k);
	ms_free(text);
	ms_free(pub);
	ms_free(sig);
	ms_free(dir);
	return 0;
}

/* The signature is ECDSA over PAE with the curve's hash, DER encoded:
 * checked with OpenSSL directly, for P-256 and P-384. */
static int check_raw_signature(const char *keyname, const EVP_MD *md)
{
	char *dir = make_model(keyname), *sig = ms_asprintf("%s/%s.sig", T_TMP, keyname);
	char *pubp = key_path(keyname, "pub"), *text, *p64, *s64, *pae;
	uint8_t *payload, *der;
	size_t n, pn, dn;
	EVP_PKEY *pk;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	FILE *f;
	int ok;

	T_ASSERT(dir && ctx);
	T_ASSERT_EQ_INT(sign_model(dir, keyname, sig), MS_OK);
	text = slurp(sig, &n);
	T_ASSERT(text);
	p64 = json_field(text, "payload");
	s64 = json_field(text, "sig");
	T_ASSERT(p64 && s64);
	payload = b64d(p64, &pn);
	der = b64d(s64, &dn);
	T_ASSERT(payload && der && der[0] == 0x30);
	pae = ms_asprintf("DSSEv1 28 application/vnd.in-toto+json %zu %s", pn, (char *)payload);
	f = fopen(pubp, "r");
	T_ASSERT(f);
	pk = PEM_read_PUBKEY(f, NULL, NULL, NULL);
	fclose(f);
	T_ASSERT(pk);
	ok = EVP_DigestVerifyInit(ctx, NULL, md, NULL, pk) == 1 &&
	     EVP_DigestVerify(ctx, der, dn, (uint8_t *)pae, strlen(pae)) == 1;
	T_ASSERT(ok);
	EVP_MD_CTX_free(ctx);
	EVP_PKEY_free(pk);
	ms_free(pae);
	ms_free(der);
	ms_free(payload);
	ms_free(p64);
	ms_free(s64);
	ms_free(text);
	ms_free(pubp);
	ms_free(sig);
	ms_free(dir);
	return 0;
}

static int test_ecdsa_p256_sha256(void)
{
	return check_raw_signature("k256", EVP_sha256());
}

static int test_ecdsa_p384_sha384(void)
{
	return check_raw_signature("k384", EVP_sha384());
}

static int test_tampered_file(void)
{
	char *dir = make_model("tf"), *sig = tpath("tf.sig");
	struct ms_oms_result res = {0};
	struct ms_err err = {0};

	T_ASSERT(dir);
	T_ASSERT_EQ_INT(sign_model(dir, "k256", sig), MS_OK);
	T_ASSERT_EQ_INT(put_file(dir, "a-b", "hellO\n"), 0);
	T_ASSERT_EQ_INT(verify_model(dir, "k256", sig, &res, &err), MS_ECHECK);
	T_ASSERT_EQ_INT(res.fail, MS_OMS_FAIL_DIGEST);
	T_ASSERT_STR(res.path, "a-b");
	T_ASSERT_EQ_INT(res.ndigest, 1);
	T_ASSERT_MSG(strstr(err.msg, "'a-b'") && strstr(err.msg, "digest mismatch"), "%s", err.msg);
	ms_oms_result_release(&res);
	/* same size, one byte changed deep in the tree */
	T_ASSERT_EQ_INT(put_file(dir, "a/b/c", "z"), 0);
	T_ASSERT_EQ_INT(verify_model(dir, "k256", sig, &res, &err), MS_ECHECK);
	T_ASSERT_STR(res.path, "a/b/c");
	T_ASSERT_EQ_INT(res.ndigest, 2);
	ms_oms_result_release(&res);
	ms_free(sig);
	ms_free(dir);
	return 0;
}

static int test_missing_and_extra(void)
{
	char *dir = make_model("me"), *sig = tpath("me.sig"), *p;
	struct ms_oms_result res = {0};
	struct ms_err err = {0};

	T_ASSERT(dir);
	T_ASSERT_EQ_INT(sign_model(dir, "k256", sig), MS_OK);
	T_ASSERT_EQ_INT(put_file(dir, "a/new", "n"), 0);
	T_ASSERT_EQ_INT(verify_model(dir, "k256", sig, &res, &err), MS_ECHECK);
	T_ASSERT_EQ_INT(res.fail, MS_OMS_FAIL_EXTRA);
	T_ASSERT_STR(res.path, "a/new");
	T_ASSERT_MSG(strstr(err.msg, "'a/new'"), "%s", err.msg);
	ms_oms_result_release(&res);
	p = ms_path_join(dir, "a/new");
	unlink(p);
	ms_free(p);
	/* changes under ignored git paths do not matter */
	T_ASSERT_EQ_INT(put_file(dir, ".git/ORIG_HEAD", "x"), 0);
	T_ASSERT_EQ_INT(put_file(dir, ".gitignore", "*.tmp\n"), 0);
	T_ASSERT_EQ_INT(verify_model(dir, "k256", sig, &res, &err), MS_OK);
	ms_oms_result_release(&res);
	p = ms_path_join(dir, "a.b");
	unlink(p);
	ms_free(p);
	T_ASSERT_EQ_INT(verify_model(dir, "k256", sig, &res, &err), MS_ECHECK);
	T_ASSERT_EQ_INT(res.fail, MS_OMS_FAIL_MISSING);
	T_ASSERT_STR(res.path, "a.b");
	T_ASSERT_MSG(strstr(err.msg, "'a.b'") && strstr(err.msg, "missing"), "%s", err.msg);
	ms_oms_result_release(&res);
	ms_free(sig);
	ms_free(dir);
	return 0;
}

static int test_tampered_signature(void)
{
	char *dir = make_model("ts"), *sig = tpath("ts.sig"), *bad = tpath("ts-bad.sig");
	char *text, *s64, *p64, *t2, *pay2, *at;
	struct ms_oms_result res = {0};
	struct ms_err err = {0};
	uint8_t *der, *payload;
	size_t n, dn, pn;

	T_ASSERT(dir);
	T_ASSERT_EQ_INT(sign_model(dir, "k256", sig), MS_OK);
	text = slurp(sig, &n);
	T_ASSERT(text);

	/* a flipped bit in the DER signature */
	s64 = json_field(text, "sig");
	der = b64d(s64, &dn);
	T_ASSERT(der && dn > 20);
	der[dn - 3] ^= 1;
	ms_free(s64);
	s64 = b64e(der, dn);
	t2 = json_replace(text, "sig", s64);
	T_ASSERT(t2 && !spit(bad, t2, strlen(t2)));
	T_ASSERT_EQ_INT(verify_model(dir, "k256", bad, &res, &err), MS_ECHECK);
	T_ASSERT_EQ_INT(res.fail, MS_OMS_FAIL_SIGNATURE);
	T_ASSERT_MSG(strstr(err.msg, "bad signature"), "%s", err.msg);
	ms_oms_result_release(&res);
	ms_free(t2);

	/* a digest changed inside the signed payload */
	p64 = json_field(text, "payload");
	payload = b64d(p64, &pn);
	at = strstr((char *)payload, "ba7816bf");
	T_ASSERT(at);
	at[0] = 'c';
	pay2 = b64e(payload, pn);
	t2 = json_replace(text, "payload", pay2);
	T_ASSERT(t2 && !spit(bad, t2, strlen(t2)));
	T_ASSERT_EQ_INT(verify_model(dir, "k256", bad, &res, &err), MS_ECHECK);
	T_ASSERT_EQ_INT(res.fail, MS_OMS_FAIL_SIGNATURE);
	ms_oms_result_release(&res);

	/* the wrong public key: the hint says so; without a hint, the
	 * signature does */
	T_ASSERT_EQ_INT(verify_model(dir, "k384", sig, &res, &err), MS_ECHECK);
	T_ASSERT_EQ_INT(res.fail, MS_OMS_FAIL_KEY);
	ms_oms_result_release(&res);
	ms_free(t2);
	t2 = json_replace(text, "hint", "");
	T_ASSERT(t2 && !spit(bad, t2, strlen(t2)));
	T_ASSERT_EQ_INT(verify_model(dir, "k256", bad, &res, &err), MS_OK);
	ms_oms_result_release(&res);
	T_ASSERT_EQ_INT(verify_model(dir, "k384", bad, &res, &err), MS_ECHECK);
	T_ASSERT_EQ_INT(res.fail, MS_OMS_FAIL_SIGNATURE);
	ms_oms_result_release(&res);

	ms_free(t2);
	ms_free(pay2);
	ms_free(payload);
	ms_free(p64);
	ms_free(s64);
	ms_free(der);
	ms_free(text);
	ms_free(bad);
	ms_free(sig);
	ms_free(dir);
	return 0;
}

/* The signature reader takes outside input: each of these is bad input,
 * never a crash and never a pass. */
static int test_malformed_bundles(void)
{
	static const char *bad[] = {
		"",
		"{",
		"[]",
		"{\"mediaType\":1}",
		"{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\"}",
		"{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.1+json\","
		"\"verificationMaterial\":{\"publicKey\":{}},\"dsseEnvelope\":{}}",
		"{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\","
		"\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\"}",
		"{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\","
		"\"verificationMaterial\":{\"publicKey\":{}},\"dsseEnvelope\":"
		"{\"payload\":\"e30=\",\"payloadType\":\"x\",\"signatures\":[]}}",
		"{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\","
		"\"verificationMaterial\":{\"publicKey\":{}},\"dsseEnvelope\":"
		"{\"payload\":\"e30\",\"payloadType\":\"x\",\"signatures\":[{\"sig\":\"MEUC=\"}]}}",
		"{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\","
		"\"verificationMaterial\":{\"publicKey\":{}},\"dsseEnvelope\":"
		"{\"payload\":\"e3 0=\",\"payloadType\":\"x\",\"signatures\":[{\"sig\":\"MEUC\"}]}}",
		"{\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\","
		"\"verificationMaterial\":{\"certificate\":{}},\"dsseEnvelope\":{}}",
		"{\"a\":\"\xff\"}",
		"{\"a\":\"\\ud800\"}",
		"{\"a\":\"\\u0000\"}",
		"{\"a\":\"\xc0\xaf\"}",
		"{\"a\":01}",
		"{\"a\":1.}",
		"{\"a\":tru}",
		"{\"a\":\"x\"} x",
		"{\"a\":\"x\",}",
		"{'a':1}",
		"{\"a\":\"tab\there\"}",
	};
	char deep[200];
	struct ms_key *k = NULL;
	struct ms_err err = {0};
	char *pub = key_path("k256", "pub"), *pt = NULL;
	uint8_t *payload = NULL;
	size_t pn;

	T_ASSERT_EQ_INT(ms_key_load_public(pub, &k, &err), MS_OK);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = ms_sigstore_verify(bad[i], strlen(bad[i]), "bad.sig", k, &payload, &pn,
					  &pt, &err);

		T_ASSERT_MSG(rc == MS_EINVAL, "case %zu: rc %d (%s)", i, rc, err.msg);
		T_ASSERT(!payload && !pt);
	}
	memset(deep, '[', 100);
	memset(deep + 100, ']', 100);
	T_ASSERT_EQ_INT(ms_sigstore_verify(deep, sizeof(deep), "deep.sig", k, &payload, &pn, &pt,
					 &err),
			MS_EINVAL);
	T_ASSERT(strstr(err.msg, "deep"));
	ms_key_free(k);
	ms_free(pub);
	return 0;
}

/* A truncated signature file is bad input for the whole verification. */
static int test_truncated_signature(void)
{
	char *dir = make_model("tr"), *sig = tpath("tr.sig"), *text;
	struct ms_oms_result res = {0};
	struct ms_err err = {0};
	size_t n;

	T_ASSERT(dir);
	T_ASSERT_EQ_INT(sign_model(dir, "k256", sig), MS_OK);
	text = slurp(sig, &n);
	T_ASSERT(text);
	for (size_t cut = 0; cut < n; cut += n / 7 + 1) {
		T_ASSERT(!spit(sig, text, cut));
		T_ASSERT_EQ_INT(verify_model(dir, "k256", sig, &res, &err), MS_EINVAL);
		ms_oms_result_release(&res);
	}
	ms_free(text);
	ms_free(sig);
	ms_free(dir);
	return 0;
}

/* Sign a hand-made statement and verify the model against it. */
static int verify_statement(const char *dir, const char *stmt, struct ms_err *err)
{
	char *priv = key_path("k256", "pem"), *sig = tpath("stmt.sig"), *bundle = NULL;
	struct ms_oms_result res = {0};
	struct ms_key *k = NULL;
	size_t n = 0;
	int rc;

	rc = ms_key_load_private(priv, &k, err);
	if (rc == MS_OK)
		rc = ms_sigstore_sign(stmt, strlen(stmt), MS_OMS_PAYLOAD_TYPE, k, &bundle, &n, err);
	unlink(sig);
	if (rc == MS_OK)
		rc = ms_file_write_atomic(sig, bundle, n, 0, err);
	if (rc == MS_OK)
		rc = verify_model(dir, "k256", sig, &res, err);
	ms_oms_result_release(&res);
	ms_free(bundle);
	ms_key_free(k);
	ms_free(sig);
	ms_free(priv);
	return rc;
}

#define STMT_HEAD                                                               \
	"{\"_type\":\"https://in-toto.io/Statement/v1\",\"subject\":[{\"name\":\"m\"," \
	"\"digest\":{\"sha256\":\"%s\"}}],\"predicateType\":\"%s\",\"predicate\":"  \
	"{\"serialization\":{\"method\":\"%s\",\"hash_type\":\"sha256\","           \
	"\"allow_symlinks\":false%s},\"resources\":[%s]}}"
#define RES_ABC "{\"name\":\"%s\",\"algorithm\":\"sha256\",\"digest\":"         \
	"\"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\"}"
/* sha256 of the digest of "abc": the root of a one-file model */
#define ROOT_ABC "4f8b42c22dd3729b519ba6f68d2da7cc5b2d606d05daed5ad5128cc03e6c6358"

static int test_signed_statement_rules(void)
{
	char *dir = tpath("st"), *s, *res;
	struct ms_err err = {0};

	mkdir(dir, 0755);
	T_ASSERT_EQ_INT(put_file(dir, "w.bin", "abc"), 0);
	T_ASSERT_EQ_INT(put_file(dir, "README.md", "free text"), 0);
	res = ms_asprintf(RES_ABC, "w.bin");

	/* a statement as the reference writes it, README.md left out by
	 * the signer through ignore_paths */
	s = ms_asprintf(STMT_HEAD, ROOT_ABC, MS_OMS_PREDICATE_TYPE, "files",
			",\"ignore_paths\":[\"README.md\",\".git\"]", res);
	T_ASSERT_MSG(verify_statement(dir, s, &err) == MS_OK, "%s", err.msg);
	ms_free(s);
	/* without the ignore entry README.md is an extra file */
	s = ms_asprintf(STMT_HEAD, ROOT_ABC, MS_OMS_PREDICATE_TYPE, "files", "", res);
	T_ASSERT_EQ_INT(verify_statement(dir, s, &err), MS_ECHECK);
	T_ASSERT(strstr(err.msg, "README.md"));
	ms_free(s);
	/* a root that does not cover the resources */
	s = ms_asprintf(STMT_HEAD, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
			MS_OMS_PREDICATE_TYPE, "files", ",\"ignore_paths\":[\"README.md\"]", res);
	T_ASSERT_EQ_INT(verify_statement(dir, s, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "inconsistent"));
	ms_free(s);
	/* other serializations and predicates are refused as bad input */
	s = ms_asprintf(STMT_HEAD, ROOT_ABC, MS_OMS_PREDICATE_TYPE, "shards",
			",\"ignore_paths\":[\"README.md\"]", res);
	T_ASSERT_EQ_INT(verify_statement(dir, s, &err), MS_EINVAL);
	ms_free(s);
	s = ms_asprintf(STMT_HEAD, ROOT_ABC, "https://model_signing/Digests/v0.1", "files",
			",\"ignore_paths\":[\"README.md\"]", res);
	T_ASSERT_EQ_INT(verify_statement(dir, s, &err), MS_EINVAL);
	ms_free(s);
	/* ignoring everything is refused */
	s = ms_asprintf(STMT_HEAD, ROOT_ABC, MS_OMS_PREDICATE_TYPE, "files",
			",\"ignore_paths\":[\"./\"]", res);
	T_ASSERT_EQ_INT(verify_statement(dir, s, &err), MS_EINVAL);
	ms_free(s);
	ms_free(res);
	/* names that escape the model or are not canonical */
	{
		static const char *names[] = {"../w.bin", "/w.bin", "./w.bin", "a//w.bin", "w.bin/"};

		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			res = ms_asprintf(RES_ABC, names[i]);
			s = ms_asprintf(STMT_HEAD, ROOT_ABC, MS_OMS_PREDICATE_TYPE, "files",
					",\"ignore_paths\":[\"README.md\"]", res);
			T_ASSERT_MSG(verify_statement(dir, s, &err) == MS_EINVAL, "%s", names[i]);
			T_ASSERT(strstr(err.msg, "canonical"));
			ms_free(s);
			ms_free(res);
		}
	}
	ms_free(dir);
	return 0;
}

static int test_links_refused(void)
{
	char *dir = make_model("ln"), *sig = tpath("ln.sig"), *link, *model_link;
	char *key = key_path("k256", "pem");
	struct ms_err err = {0};
	struct stat st;

	T_ASSERT(dir);
	link = ms_path_join(dir, ".git/lnk");
	T_ASSERT_EQ_INT(symlink("../a.b", link), 0);
	/* refused even under an ignored path, as the reference does */
	T_ASSERT_EQ_INT(ms_oms_sign(dir, key, sig, 1, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, ".git/lnk") && strstr(err.msg, "symbolic link"), "%s",
		     err.msg);
	T_ASSERT(lstat(sig, &st) != 0);
	unlink(link);
	model_link = tpath("ln-link");
	T_ASSERT_EQ_INT(symlink(dir, model_link), 0);
	T_ASSERT_EQ_INT(ms_oms_sign(model_link, key, sig, 1, &err), MS_EINVAL);
	ms_free(model_link);
	ms_free(key);
	ms_free(link);
	ms_free(sig);
	ms_free(dir);
	return 0;
}

static int test_no_overwrite(void)
{
	char *dir = make_model("ow"), *sig = tpath("ow.sig"), *key = key_path("k256", "pem");
	struct ms_oms_opts o = {0};
	struct ms_err err = {0};

	T_ASSERT(dir);
	T_ASSERT_EQ_INT(ms_oms_sign(dir, key, sig, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_oms_sign(dir, key, sig, 0, &err), MS_EEXIST);
	o.force = 1;
	T_ASSERT_EQ_INT(ms_oms_sign_opts(dir, key, sig, &o, NULL, &err), MS_OK);
	ms_free(key);
	ms_free(sig);
	ms_free(dir);
	return 0;
}

/* A signature inside the model is not signed and is ignored when checked. */
static int test_signature_inside_model(void)
{
	char *dir = make_model("in"), *sig = ms_asprintf("%s/in/model.sig", T_TMP);
	struct ms_oms_result res = {0};
	struct ms_err err = {0};

	T_ASSERT(dir);
	T_ASSERT_EQ_INT(sign_model(dir, "k256", sig), MS_OK);
	T_ASSERT_MSG(verify_model(dir, "k256", sig, &res, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(res.nfiles, 4);
	T_ASSERT_STR(res.root_digest,
		     "ec560b0ce718bd55fbf3961cc64f30bbff7fe39cd5d48a39e0a1ad8a0d6fa1e9");
	ms_oms_result_release(&res);
	ms_free(sig);
	ms_free(dir);
	return 0;
}

/* Names that need escaping in JSON survive the round trip. */
static int test_unusual_names(void)
{
	char *dir = tpath("un"), *sig = tpath("un.sig"), *key = key_path("k256", "pem");
	struct ms_oms_result res = {0};
	struct ms_err err = {0};

	mkdir(dir, 0755);
	T_ASSERT_EQ_INT(put_file(dir, "q\"uote\\back", "1"), 0);
	T_ASSERT_EQ_INT(put_file(dir, "caf\xc3\xa9/\xe6\xa8\xa1\xe5\x9e\x8b.bin", "2"), 0);
	T_ASSERT_EQ_INT(put_file(dir, "tab\there", "3"), 0);
	T_ASSERT_EQ_INT(sign_model(dir, "k256", sig), MS_OK);
	T_ASSERT_MSG(verify_model(dir, "k256", sig, &res, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(res.nfiles, 3);
	ms_oms_result_release(&res);
	/* a name that is not UTF-8 cannot be written in the statement */
	T_ASSERT_EQ_INT(put_file(dir, "bad\xff", "4"), 0);
	unlink(sig);
	T_ASSERT_EQ_INT(ms_oms_sign(dir, key, sig, 1, &err), MS_EINVAL);
	ms_free(key);
	ms_free(sig);
	ms_free(dir);
	return 0;
}

static int test_dsse_envelope(void)
{
	static const char stmt[] = "{\"_type\":\"https://in-toto.io/Statement/v1\"}";
	char *priv = key_path("k384", "pem"), *pub = key_path("k384", "pub");
	char *env = NULL, *pt = NULL, *bad;
	struct ms_key *sk = NULL, *pk = NULL;
	struct ms_err err = {0};
	uint8_t *payload = NULL;
	size_t n = 0, pn = 0;

	T_ASSERT_EQ_INT(ms_key_load_private(priv, &sk, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_key_load_public(pub, &pk, &err), MS_OK);
	T_ASSERT_STR(ms_key_curve(pk), "secp384r1");
	T_ASSERT_EQ_INT(ms_dsse_sign(stmt, sizeof(stmt) - 1, MS_OMS_PAYLOAD_TYPE, sk, &env, &n,
				     &err),
			MS_OK);
	T_ASSERT(!strncmp(env, "{\"payload\":\"", 12));
	T_ASSERT_EQ_INT(ms_dsse_verify(env, n, "env", pk, &payload, &pn, &pt, &err), MS_OK);
	T_ASSERT_EQ_INT(pn, sizeof(stmt) - 1);
	T_ASSERT(!memcmp(payload, stmt, pn));
	T_ASSERT_STR(pt, MS_OMS_PAYLOAD_TYPE);
	ms_free(payload);
	ms_free(pt);
	/* the payload type is signed too */
	bad = json_replace(env, "payloadType", "text/plain");
	T_ASSERT(bad);
	T_ASSERT_EQ_INT(ms_dsse_verify(bad, strlen(bad), "env", pk, &payload, &pn, &pt, &err),
			MS_ECHECK);
	T_ASSERT(!payload && !pt);
	ms_free(bad);
	ms_free(env);
	ms_key_free(sk);
	ms_key_free(pk);
	ms_free(priv);
	ms_free(pub);
	return 0;
}

static int test_bad_keys(void)
{
	char *p = tpath("notakey.pem"), *rsa = tpath("rsa.pem"), *pub = key_path("k256", "pub");
	struct ms_key *k = NULL;
	struct ms_err err = {0};
	EVP_PKEY *r = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
	FILE *f;

	T_ASSERT_EQ_INT(spit(p, "hello\n", 6), 0);
	T_ASSERT_EQ_INT(ms_key_load_private(p, &k, &err), MS_EINVAL);
	/* a public key is not a signing key */
	T_ASSERT_EQ_INT(ms_key_load_private(pub, &k, &err), MS_EINVAL);
	T_ASSERT(r);
	f = fopen(rsa, "w");
	T_ASSERT(f && PEM_write_PrivateKey(f, r, NULL, NULL, 0, NULL, NULL));
	fclose(f);
	EVP_PKEY_free(r);
	T_ASSERT_EQ_INT(ms_key_load_private(rsa, &k, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "unsupported key type"));
	T_ASSERT(!k);
	ms_free(p);
	ms_free(rsa);
	ms_free(pub);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_pae_spec_example),
	T_CASE(test_path_order),
	T_CASE(test_model_name),
	T_CASE(test_root_digest),
	T_CASE(test_ecdsa_p256_sha256),
	T_CASE(test_ecdsa_p384_sha384),
	T_CASE(test_tampered_file),
	T_CASE(test_missing_and_extra),
	T_CASE(test_tampered_signature),
	T_CASE(test_malformed_bundles),
	T_CASE(test_truncated_signature),
	T_CASE(test_signed_statement_rules),
	T_CASE(test_links_refused),
	T_CASE(test_no_overwrite),
	T_CASE(test_signature_inside_model),
	T_CASE(test_unusual_names),
	T_CASE(test_dsse_envelope),
	T_CASE(test_bad_keys),
};

T_MAIN(cases)
