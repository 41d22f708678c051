/*
 * fz_index.c: fuzz target for the sharded-checkpoint index parser. The
 * checkpoint layer reads model.safetensors.index.json from disk (there is no
 * in-memory entry point), so each input is written as the index of a
 * scratch directory that also holds two small valid shards, and the
 * directory is opened with ms_ckpt_open. Index names that escape the
 * directory ("../x", "/abs", "a/b") must be refused before anything is
 * opened, so the scratch directory's parent holds a bait file that a
 * successful open must never reach.
 */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "fsutil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char root[400], dir[512], index_path[600];

/* The scratch tree, removed at exit (children first). */
static const char *const tree[] = {
	"ckpt/model.safetensors.index.json", "ckpt/model-00001-of-00002.safetensors",
	"ckpt/model-00002-of-00002.safetensors", "ckpt/a/b.safetensors",
	"ckpt/a", "ckpt", "x.safetensors",
};

static void cleanup(void)
{
	char path[700];

	for (size_t i = 0; i < sizeof(tree) / sizeof(tree[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", root, tree[i]);
		if (unlink(path))
			rmdir(path);
	}
	rmdir(root);
}

/* A shard with one F32 tensor of two elements named name. */
static void write_shard(const char *path, const char *name)
{
	char hdr[256];
	uint8_t len8[8];
	int n;
	FILE *f;
	static const float v[2] = {1.5f, -2.0f};

	n = snprintf(hdr, sizeof(hdr),
		     "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", name);
	while (n % 8)
		hdr[n++] = ' ';
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)n >> (8 * i));
	f = fopen(path, "wb");
	assert(f);
	assert(fwrite(len8, 1, 8, f) == 8);
	assert(fwrite(hdr, 1, (size_t)n, f) == (size_t)n);
	assert(fwrite(v, 1, sizeof(v), f) == sizeof(v));
	assert(fclose(f) == 0);
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	char path[700];

	snprintf(root, sizeof(root), "%s/ms-fz-index-XXXXXX", tmp && *tmp ? tmp : P_tmpdir);
	assert(mkdtemp(root));
	atexit(cleanup);
	/* bait outside the checkpoint directory, and a subdirectory shard */
	snprintf(path, sizeof(path), "%s/x.safetensors", root);
	write_shard(path, "outside");
	snprintf(dir, sizeof(dir), "%s/ckpt", root);
	assert(mkdir(dir, 0755) == 0);
	snprintf(path, sizeof(path), "%s/a", dir);
	assert(mkdir(path, 0755) == 0);
	snprintf(path, sizeof(path), "%s/a/b.safetensors", dir);
	write_shard(path, "nested");
	snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", dir);
	write_shard(path, "model.layers.0.mlp.experts.0.up_proj.weight");
	snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", dir);
	write_shard(path, "model.layers.0.mlp.experts.1.up_proj.weight");
	snprintf(index_path, sizeof(index_path), "%s/model.safetensors.index.json", dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ms_ckpt *c = NULL;
	struct ms_err err = {0};
	FILE *f;
	int rc;

	if (!dir[0])
		setup();
	f = fopen(index_path, "wb");
	assert(f);
	assert(fwrite(data, 1, size, f) == size);
	assert(fclose(f) == 0);
	rc = ms_ckpt_open(dir, &c, &err);
	if (rc != MS_OK) {
		assert(c == NULL);
		assert(err.code == rc);
		assert(strchr(err.msg, '\n') == NULL);
		return 0;
	}
	/* accepted: only the two shards inside the directory, each tensor once */
	assert(c->index_path != NULL);
	assert(c->nfiles >= 1 && c->nfiles <= 2);
	for (size_t i = 0; i < c->nfiles; i++)
		assert(ms_name_is_plain(c->file_names[i]));
	for (size_t i = 0; i < c->ntensors; i++) {
		assert(strcmp(c->tensors[i]->name, "outside") != 0);
		assert(strcmp(c->tensors[i]->name, "nested") != 0);
		assert(ms_ckpt_find(c, c->tensors[i]->name) == c->tensors[i]);
	}
	ms_ckpt_close(c);
	return 0;
}
