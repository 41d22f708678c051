/*
 * attest.h: the internal side of attest.c; the public declarations are in
 * ms.h (section "attest").
 */
#ifndef MS_ATTEST_H
#define MS_ATTEST_H

#include "ms.h"
#include <stddef.h>
#include <stdint.h>
#include "common.h"

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

/* Hash every file of m (in parallel, largest first) and the root digest.
 * A file whose size changed since the scan is MS_EIO. */
int ms_oms_manifest_hash(struct ms_oms_manifest *m, const char *model_dir,
			 const struct ms_oms_opts *opts, struct ms_err *err);
/* The in-toto statement of a hashed manifest (the payload that is signed),
 * indented like the reference's. Caller frees *json. */
int ms_oms_statement(const struct ms_oms_manifest *m, char **json, size_t *len,
		     struct ms_err *err);
void ms_oms_manifest_free(struct ms_oms_manifest *m);

/* PAE(type, body) into a new buffer (*out, *outlen; caller frees). */
int ms_dsse_pae(const char *type, const void *body, size_t n, uint8_t **out,
		size_t *outlen);

#endif
