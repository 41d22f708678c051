/*
 * fz_bundle.c: fuzz target for bundle import (bundle.h). Each input is
 * written as an archive file and imported into a scratch directory and an
 * empty inventory. Whatever the bytes:
 *   - a refusal is one error line with the code returned, nothing is
 *     registered, and the directory the target would go in is still empty
 *     (no target, no temporary left), the bait file beside it untouched;
 *   - an acceptance leaves the target with its MANIFEST.json and one state;
 *     it is then removed and the inventory made anew, so every input meets
 *     an empty one.
 * An input that does not start with a zstd frame is taken as the tar
 * stream and compressed here (level 1), so the fuzzer mutates tar headers
 * and the manifest rather than compressed bytes it cannot get past; inputs
 * that are zstd frames go in as they are, for the decompressor's own
 * checks. Limits are lowered (64 MiB declared) so no input costs much.
 */
#include <assert.h>
#include <dirent.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#include "bundle.h"
#include "inventory.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char root[256], db[300], input[300], box[300], target[320], bait[300], manifest[400];
static struct ms_inv *inv;

static int rm_one(const char *p, const struct stat *sb, int type, struct FTW *f)
{
	(void)sb;
	(void)f;
	if (type == FTW_DP || type == FTW_DNR)
		rmdir(p);
	else
		unlink(p);
	return 0;
}

static void rm_tree(const char *p)
{
	nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void open_inv(void)
{
	struct ms_err err = {0};
	char path[320];

	ms_inv_close(inv);
	inv = NULL;
	unlink(db);
	snprintf(path, sizeof(path), "%s-wal", db);
	unlink(path);
	snprintf(path, sizeof(path), "%s-shm", db);
	unlink(path);
	if (ms_inv_open(db, MS_INV_CREATE, &inv, &err) != MS_OK) {
		fprintf(stderr, "fz_bundle: %s\n", err.msg);
		abort();
	}
}

static void cleanup(void)
{
	ms_inv_close(inv);
	inv = NULL;
	rm_tree(root);
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	FILE *f;

	snprintf(root, sizeof(root), "%s/ms-fz-bundle-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
	assert(mkdtemp(root));
	atexit(cleanup);
	snprintf(db, sizeof(db), "%s/inv.db", root);
	snprintf(input, sizeof(input), "%s/in.tar.zst", root);
	snprintf(box, sizeof(box), "%s/box", root);
	snprintf(target, sizeof(target), "%s/out", box);
	snprintf(bait, sizeof(bait), "%s/bait", root);
	assert(mkdir(box, 0755) == 0);
	f = fopen(bait, "wb");
	assert(f && fputs("bait\n", f) >= 0 && fclose(f) == 0);
	open_inv();
}

static size_t entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t n = 0;

	assert(d);
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static size_t nstates(void)
{
	struct ms_inv_state *s = NULL;
	struct ms_err err = {0};
	size_t n = 0;

	assert(ms_inv_states_list(inv, MS_INV_KIND_ANY, &s, &n, &err) == MS_OK);
	ms_inv_states_free(s, n);
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ms_bundle_import_opts o;
	struct ms_err err = {0};
	char digest[MS_STATE_DIGEST_LEN];
	struct stat st;
	FILE *f;
	int rc;

	if (!root[0])
		setup();
	f = fopen(input, "wb");
	assert(f);
	if (size >= 4 && data[0] == 0x28 && data[1] == 0xb5 && data[2] == 0x2f && data[3] == 0xfd) {
		assert(fwrite(data, 1, size, f) == size);
	} else {
		size_t cap = ZSTD_compressBound(size), n;
		void *z = malloc(cap);

		assert(z);
		n = ZSTD_compress(z, cap, data, size, 1);
		assert(!ZSTD_isError(n));
		assert(fwrite(z, 1, n, f) == n);
		free(z);
	}
	assert(fclose(f) == 0);
	ms_bundle_import_opts_init(&o);
	o.nthreads = 1;
	o.max_total = 64u << 20;
	rc = ms_bundle_import(inv, input, target, &o, digest, &err);
	/* triage: what the import said */
	if (getenv("FZ_BUNDLE_VERBOSE"))
		fprintf(stderr, "fz_bundle: rc %d: %s\n", rc, rc ? err.msg : digest);
	assert(stat(bait, &st) == 0 && st.st_size == 5);
	if (rc != MS_OK) {
		assert(err.code == rc);
		assert(err.msg[0] && strchr(err.msg, '\n') == NULL);
		assert(entries(box) == 0);
		assert(nstates() == 0);
		return 0;
	}
	assert(entries(box) == 1);
	snprintf(manifest, sizeof(manifest), "%s/MANIFEST.json", target);
	assert(stat(manifest, &st) == 0 && S_ISREG(st.st_mode));
	assert(nstates() == 1);
	rm_tree(target);
	open_inv();
	return 0;
}
