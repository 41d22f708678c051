/*
 * bundle.h: a state as one file, for moving it between hosts and
 * inventories: `msinv export` writes it, `msinv import` reads it back.
 *
 * Byte layout: a POSIX tar stream (pax, only the extended headers the
 * names and sizes need) compressed as one zstd stream:
 *
 *   MANIFEST.json                 first member, at most MS_IMPORT_MAX_MANIFEST
 *   <file>.safetensors ...        every tensor file of the state
 *   config.json ...               every configuration file of the state
 *
 * Every member is a regular file, mode 0644, mtime 0 (the epoch), uid and
 * gid 0, owner and group "root", in manifest order, with no directory
 * entries; zstd level MS_EXPORT_LEVEL, multithreaded (zstd's output does not
 * depend on the number of workers): two exports of one state are the same
 * bytes on any host. Paths are relative to the deepest directory that holds
 * all the state's files. ASCII names need no pax header; when a name is not
 * ASCII every entry carries "hdrcharset=BINARY", so names are the bytes they
 * are whatever the locale. GNU tar and bsdtar read bundles as they are.
 *
 * MANIFEST.json is the state manifest (msinv-manifest-v1, verify.h) with
 * every file's whole-file "sha256", plus one top-level object:
 *
 *   "bundle": {"format": "msinv-bundle-v1",
 *              "members": [{"path": "model-00001-of-00002.safetensors",
 *                           "size": 193784, "sha256": "<hex>"}, ...],
 *              "total_bytes": N,              (sum of the member sizes)
 *              "kind": "base", "label": "...", "layout": "...",
 *              "ep_size": null, "ep_rank": null, "experts": null,
 *              "lineage": {"states": [...], "edges": [...]}}
 *
 * The members are exactly the manifest's "files" and "configs", each once.
 * kind, label, layout, ep_size and ep_rank repeat the manifest's (null when
 * the state has none) and must agree with them; experts is the state's
 * JSON array of expert ids or null. lineage (absent in bundles written
 * before it existed) is where the state came from: its ancestors' records
 * and every derivation edge above it (ms_inv_lineage_export, inventory.h);
 * import records them, as states with no copy here, in the batch that
 * registers the state.
 *
 * Import treats the archive as hostile. It refuses, naming the archive, the
 * member and the rule: an archive that is not one zstd stream of a tar
 * (no other compression or archive format is read); a member before
 * MANIFEST.json; an absolute path, a ".." component, an empty or "."
 * component, a control character, a path over MS_IMPORT_MAX_PATH bytes
 * or MS_IMPORT_MAX_DEPTH directories deep; a name
 * the manifest does not list; the same name twice; anything but a regular
 * file (symbolic and hard links, devices, FIFOs, sockets), except a
 * directory that some member's path implies; a member larger or smaller
 * than declared (reading stops one byte past the declared size); a member
 * whose bytes do not give its sha256; a member missing; a declared total
 * over opts->max_total; a tar stream longer than max(max_ratio x archive
 * size, declared total + tar framing): the stream is decompressed by this
 * module, so it stops there, whatever the tar layer asked for. The manifest
 * itself is checked before anything is extracted (its state digest is
 * recomputed from its tensor list), and after extraction every tensor and
 * header is re-hashed and every file and configuration the extracted
 * directory presents is compared with the manifest, before the directory is
 * moved into place and the state registered. Any failure removes the
 * temporary directory and registers nothing.
 */
#ifndef MS_BUNDLE_H
#define MS_BUNDLE_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "common.h"

#define MS_BUNDLE_FORMAT "msinv-bundle-v1"
#define MS_BUNDLE_MANIFEST "MANIFEST.json"

/* Import limits (defaults of struct ms_import_opts). */
#define MS_IMPORT_MAX_MANIFEST (64ull << 20)   /* bytes of MANIFEST.json */
#define MS_IMPORT_MAX_TOTAL (1ull << 40)       /* declared bytes: 1 TiB */
#define MS_IMPORT_MAX_RATIO 1000u              /* tar bytes per archive byte */
/* JSON values in a manifest: bounds the parser's memory (64 bytes each)
 * whatever the text looks like; a real manifest has ~12 per tensor. */
#define MS_IMPORT_MAX_JSON_VALUES (8u << 20)
#define MS_IMPORT_MAX_PATH 4096                /* bytes of a member path */
#define MS_IMPORT_MAX_DEPTH 8                  /* directories above a member */

/* zstd level of exported bundles (zstd's default). */
#define MS_EXPORT_LEVEL 3

struct ms_inv;

/*
 * Write the state digest (a full "sha256:..." digest, see ms_inv_resolve)
 * of inv to out_path as a bundle. The state's files (the first recorded
 * copy whose files all exist) are re-hashed first (nthreads hashing and
 * compression threads, 0: one per CPU; compression uses at most 32) and
 * must match the record: a
 * changed, missing or replaced file is MS_ECHECK naming the file (and the
 * tensor), and nothing is written. The bytes packed are hashed again while
 * they are packed, so a file changed meanwhile is refused too. The output
 * is written atomically; an existing out_path is MS_EEXIST unless force.
 */
int ms_export_state(struct ms_inv *inv, const char *digest,
		    const char *out_path, int force, int nthreads,
		    struct ms_err *err);

struct ms_import_stats {
	uint64_t members;        /* files extracted (MANIFEST.json excluded) */
	uint64_t bytes;          /* their bytes */
	uint64_t archive_bytes;  /* size of the archive file */
	uint64_t stream_bytes;   /* decompressed tar bytes read */
	double seconds;
	int new_state;           /* the state was not in the inventory before */
	int adopted;             /* into_dir was there already, from an earlier
				  * run of this import, and was registered */
};

struct ms_import_opts {
	const char *label;       /* NULL: the manifest's label, if any */
	int force;               /* replace into_dir if it holds a previous
				  * import (a MANIFEST.json) or is empty */
	int nthreads;            /* hashing threads, 0: one per CPU */
	uint64_t max_total;      /* 0: MS_IMPORT_MAX_TOTAL */
	uint64_t max_ratio;      /* 0: MS_IMPORT_MAX_RATIO */
	struct ms_import_stats *stats; /* filled when not NULL */
};

/* Defaults: the manifest's label, no force, every limit at its default. */
void ms_import_opts_init(struct ms_import_opts *o);

struct ms_import_member {
	char *path;              /* relative, validated */
	uint64_t size;
	uint8_t sha256[MS_SHA256_LEN];
	int is_config;           /* listed in "configs", not "files" */
};

/* What a bundle holds, read and checked from its manifest alone. */
struct ms_import_plan {
	char digest[MS_STATE_DIGEST_LEN];
	char *kind, *label, *layout;   /* NULL when the manifest has none */
	char *experts;                 /* JSON array text, NULL when none */
	char *lineage;                 /* "bundle"."lineage" as JSON text,
					* checked; NULL when none */
	int32_t ep_size, ep_rank;      /* -1 when not a shard */
	size_t nmembers;
	struct ms_import_member *members; /* in "bundle"."members" order */
	size_t nfiles, nconfigs, ntensors;
	uint64_t total_bytes;          /* sum of member sizes */
	uint64_t archive_bytes;
	uint64_t manifest_bytes;
};

/*
 * Read and check MANIFEST.json of archive_path (the plan of an import, for
 * a dry run): the member rules, the limits of opts (may be NULL) and the
 * manifest's own consistency. Nothing is written. *out is released with
 * ms_import_plan_free. MS_EINVAL for a malformed or hostile archive,
 * MS_ECHECK for a manifest whose digests contradict each other, MS_EIO.
 */
int ms_import_plan_read(const char *archive_path,
			const struct ms_import_opts *opts,
			struct ms_import_plan **out, struct ms_err *err);
void ms_import_plan_free(struct ms_import_plan *p);

/*
 * Import the bundle archive_path into the new directory into_dir (its
 * parent must exist) and register it in inv, writing the state digest to
 * digest_out. The members are extracted into a temporary directory beside
 * into_dir (stage.h, ".<name>.tmp-<pid>-<hex>": files created
 * O_EXCL|O_NOFOLLOW and fsynced), everything is verified against the manifest, then, in one
 * inventory batch (inventory.h), the directory is renamed to into_dir and
 * the state registered with ms_inv_add_paths (kind, label, EP placement
 * from the manifest; opts->label overrides the label) and the batch
 * committed. into_dir keeps MANIFEST.json, so the state can also be
 * verified without an inventory.
 *
 * An existing into_dir is MS_EEXIST, with two exceptions. With opts->force
 * an empty directory or a previous import is replaced (kept aside until
 * the commit). Without it, a directory whose MANIFEST.json is this
 * archive's, byte for byte, and where no copy of the state is recorded (an
 * import killed between the rename and the commit leaves exactly that) is
 * adopted: its files are verified against the manifest as extracted ones
 * are, and registered (opts->stats->adopted). A directory that does not
 * verify is MS_EEXIST, naming what differs.
 *
 * On any failure nothing is registered and the file system is left as it
 * was. Codes: MS_EINVAL (hostile or malformed archive, bad options),
 * MS_ECHECK (bytes that do not match the manifest), MS_EEXIST, MS_EIO,
 * MS_EDB, MS_ENOMEM.
 */
int ms_import_bundle(struct ms_inv *inv, const char *archive_path,
		     const char *into_dir, const struct ms_import_opts *opts,
		     char digest_out[MS_STATE_DIGEST_LEN], struct ms_err *err);

#endif
