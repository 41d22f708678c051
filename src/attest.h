/*
 * attest.h: signing and verifying models in the OpenSSF Model Signing (OMS)
 * v1.0 format, the format of the reference `model_signing` tool (its `sign
 * key` / `verify key` methods), so each side checks the other's signatures.
 *
 * A signature file is a Sigstore bundle v0.3, one line of JSON:
 *
 *   {"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json",
 *    "verificationMaterial":{"publicKey":{"hint":"<H>"},"tlogEntries":[]},
 *    "dsseEnvelope":{"payload":"<base64 P>",
 *                    "payloadType":"application/vnd.in-toto+json",
 *                    "signatures":[{"sig":"<base64 S>","keyid":""}]}}
 *
 *   H  lowercase hex SHA-256 of the signer's public key as PEM
 *      SubjectPublicKeyInfo ("-----BEGIN PUBLIC KEY-----\n...", 64-column
 *      base64, final newline): names the key without carrying it.
 *   S  DER ECDSA signature over PAE(payloadType, P), hashed with SHA-256 on
 *      P-256, SHA-384 on P-384, SHA-512 on P-521 (the curves OMS accepts).
 *   PAE(t, b) = "DSSEv1" SP len(t) SP t SP len(b) SP b, lengths in decimal
 *      bytes (DSSE v1.0 pre-authentication encoding).
 *   P  an in-toto Statement v1:
 *
 *   {"_type": "https://in-toto.io/Statement/v1",
 *    "subject": [{"name": "<model directory name>",
 *                 "digest": {"sha256": "<R>"}}],
 *    "predicateType": "https://model_signing/signature/v1.0",
 *    "predicate": {
 *      "serialization": {"method": "files", "hash_type": "sha256",
 *                        "allow_symlinks": false,
 *                        "ignore_paths": [".git", ...]},
 *      "resources": [{"name": "<path>", "algorithm": "sha256",
 *                     "digest": "<hex SHA-256 of the file>"}, ...]}}
 *
 *   One resource per regular file under the model directory, named by its
 *   POSIX path relative to it, sorted component by component (Python's
 *   PurePosixPath order: "a/b" < "a/b/c" < "a-b" < "a.b"). R is the SHA-256
 *   of the raw 32-byte file digests concatenated in resource order.
 *
 * What is covered: every regular file, hidden ones included, except the
 * ignored paths (each ignores itself and everything below it): ".git",
 * ".gitattributes", ".github", ".gitignore", and the signature file itself
 * when it lies inside the model. A symbolic link or special file anywhere
 * in the tree, ignored parts included, is refused, as the reference does
 * by default. Verification ignores what the signed ignore_paths list, the
 * git paths (unless the signature covers files under them) and the
 * signature file, then requires the same set of files with the same
 * digests.
 */
#ifndef MS_ATTEST_H
#define MS_ATTEST_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define MS_OMS_BUNDLE_MEDIA_TYPE "application/vnd.dev.sigstore.bundle.v0.3+json"
#define MS_OMS_PAYLOAD_TYPE "application/vnd.in-toto+json"
#define MS_OMS_STATEMENT_TYPE "https://in-toto.io/Statement/v1"
#define MS_OMS_PREDICATE_TYPE "https://model_signing/signature/v1.0"

#define MS_OMS_MAX_SIG (64u << 20)     /* signature or envelope file bytes */
#define MS_OMS_MAX_FILES 4000000u      /* files in one model */
#define MS_OMS_MAX_DEPTH 512           /* directory nesting */
#define MS_OMS_HEX_LEN 65              /* 64 hex digits and a NUL */

/* ---- keys ------------------------------------------------------------- */

/* An elliptic curve key on P-256, P-384 or P-521, private or public. */
struct ms_key;

/* Load a PEM private key (SEC1 "EC PRIVATE KEY" or PKCS#8 "PRIVATE KEY";
 * encrypted keys are refused, never prompted for). MS_EINVAL for a file
 * that is not such a key or a curve OMS does not accept. */
int ms_key_load_private(const char *path, struct ms_key **out,
			struct ms_err *err);
/* Load a PEM public key ("PUBLIC KEY", SubjectPublicKeyInfo). */
int ms_key_load_public(const char *path, struct ms_key **out,
		       struct ms_err *err);
void ms_key_free(struct ms_key *k);
/* The curve's OpenSSL name: "prime256v1", "secp384r1" or "secp521r1". */
const char *ms_key_curve(const struct ms_key *k);
/* The bundle's public key hint of k (see above) into hint. */
int ms_key_hint(const struct ms_key *k, char hint[MS_OMS_HEX_LEN],
		struct ms_err *err);

/* ---- DSSE and the Sigstore bundle ------------------------------------- */

/* PAE(type, body) into a new buffer (*out, *outlen; caller frees). */
int ms_dsse_pae(const char *type, const void *body, size_t n, uint8_t **out,
		size_t *outlen);

/* Sign payload (n bytes) as a bare DSSE envelope, compact JSON
 * {"payload":..,"payloadType":..,"signatures":[{"sig":..,"keyid":""}]}.
 * *envelope is NUL-terminated, owned by the caller. */
int ms_dsse_sign(const void *payload, size_t n, const char *payload_type,
		 const struct ms_key *key, char **envelope, size_t *len,
		 struct ms_err *err);
/* Check a bare DSSE envelope (n bytes of JSON; label names it in errors)
 * with pub: MS_OK when a signature verifies, then *payload (n bytes, NUL
 * added) and *payload_type are the caller's. MS_ECHECK when no signature
 * verifies, MS_EINVAL when the JSON is malformed. */
int ms_dsse_verify(const char *envelope, size_t n, const char *label,
		   const struct ms_key *pub, uint8_t **payload,
		   size_t *payload_len, char **payload_type, struct ms_err *err);

/* The same wrapped in a Sigstore bundle v0.3 with the public key hint, as
 * OMS writes it. ms_bundle_verify also checks the media type and, when the
 * bundle has a hint, that it names pub (MS_ECHECK otherwise). */
int ms_bundle_sign(const void *payload, size_t n, const char *payload_type,
		   const struct ms_key *key, char **bundle, size_t *len,
		   struct ms_err *err);
int ms_bundle_verify(const char *bundle, size_t n, const char *label,
		     const struct ms_key *pub, uint8_t **payload,
		     size_t *payload_len, char **payload_type,
		     struct ms_err *err);

/* ---- the model manifest ----------------------------------------------- */

struct ms_oms_file {
	char *name;                 /* POSIX path relative to the model */
	uint64_t size;              /* as scanned */
	uint8_t digest[32];         /* SHA-256 of the bytes, once hashed */
};

struct ms_oms_manifest {
	char *model_name;           /* the subject name */
	size_t nfiles;
	struct ms_oms_file *files;  /* sorted with ms_oms_path_cmp */
	size_t nignore;
	char **ignore;              /* the ignore_paths written when signing */
	uint64_t total_bytes;
	uint8_t root[32];           /* valid after ms_oms_manifest_hash */
};

/* PurePosixPath order of two relative paths: component by component,
 * bytewise within a component (UTF-8 bytes order as code points do). */
int ms_oms_path_cmp(const char *a, const char *b);

/* The subject name of a model path: its last component, or the last
 * component of its real path when that is "", "." or "..". Caller frees. */
char *ms_oms_model_name(const char *model_dir);

/* List the files of model_dir that the signature covers, skipping the
 * nignore relative paths in ignore (and what is below them); they are
 * recorded in the manifest's ignore list. Refuses links, special files,
 * names that are not UTF-8 and trees deeper than MS_OMS_MAX_DEPTH. */
int ms_oms_manifest_scan(const char *model_dir, const char *const *ignore,
			 size_t nignore, struct ms_oms_manifest **out,
			 struct ms_err *err);

struct ms_oms_opts {
	int nthreads;   /* hashing threads; 0: one per CPU */
	int force;      /* sign: replace an existing signature file */
	/* Called from the calling thread a few times a second while files
	 * are hashed (bytes done, bytes in all); NULL for none. */
	void (*progress)(void *arg, uint64_t done, uint64_t total);
	void *progress_arg;
};

/* Hash every file of m (in parallel, largest first) and the root digest.
 * A file whose size changed since the scan is MS_EIO. */
int ms_oms_manifest_hash(struct ms_oms_manifest *m, const char *model_dir,
			 const struct ms_oms_opts *opts, struct ms_err *err);
/* The in-toto statement of a hashed manifest (the payload that is signed),
 * indented like the reference's. Caller frees *json. */
int ms_oms_statement(const struct ms_oms_manifest *m, char **json, size_t *len,
		     struct ms_err *err);
void ms_oms_manifest_free(struct ms_oms_manifest *m);

/* ---- sign and verify a model directory -------------------------------- */

enum ms_oms_fail {
	MS_OMS_FAIL_NONE,
	MS_OMS_FAIL_KEY,        /* the bundle names another public key */
	MS_OMS_FAIL_SIGNATURE,  /* no signature verifies with the key */
	MS_OMS_FAIL_MISSING,    /* a signed file is not in the model */
	MS_OMS_FAIL_EXTRA,      /* a file the signature does not cover */
	MS_OMS_FAIL_DIGEST,     /* a file's bytes differ from the signed digest */
};

struct ms_oms_result {
	char *model_name;        /* the signed subject name */
	char root_digest[MS_OMS_HEX_LEN]; /* the signed root digest */
	char key_hint[MS_OMS_HEX_LEN];    /* hint of the key that verified */
	uint64_t nfiles;         /* files the signature covers */
	uint64_t nbytes;         /* bytes hashed */
	double seconds;          /* wall time of hashing */
	enum ms_oms_fail fail;   /* first kind of difference found */
	char *path;              /* the file it concerns, when it is a file */
	uint64_t nmissing, nextra, ndigest; /* differences of each kind */
};

/* Sign model_dir with the private key at key_pem_path into sig_path
 * (written atomically; an existing file is MS_EEXIST). nthreads hashing
 * threads, 0 for one per CPU. */
int ms_oms_sign(const char *model_dir, const char *key_pem_path,
		const char *sig_path, int nthreads, struct ms_err *err);
/* The same with options (opts may be NULL); res (may be NULL) receives
 * what was signed: model name, root digest, key hint, files, bytes, time.
 * Release it with ms_oms_result_release. */
int ms_oms_sign_opts(const char *model_dir, const char *key_pem_path,
		     const char *sig_path, const struct ms_oms_opts *opts,
		     struct ms_oms_result *res, struct ms_err *err);

/* Verify model_dir against the signature at sig_path with the public key
 * at pub_pem_path. MS_OK: the signature verifies and every covered file is
 * there with its signed digest, and no other file is. MS_ECHECK: a check
 * failed, res says which (res->fail, res->path) and err names it. MS_EINVAL:
 * malformed signature file or key, unsupported serialization, a link in
 * the model. MS_EIO: a file could not be read. res is filled as far as
 * verification went; release it with ms_oms_result_release. */
int ms_oms_verify(const char *model_dir, const char *sig_path,
		  const char *pub_pem_path, struct ms_oms_result *res,
		  struct ms_err *err);
int ms_oms_verify_opts(const char *model_dir, const char *sig_path,
		       const char *pub_pem_path, const struct ms_oms_opts *opts,
		       struct ms_oms_result *res, struct ms_err *err);
void ms_oms_result_release(struct ms_oms_result *res);

#endif
