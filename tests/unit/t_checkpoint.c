/*
 * t_checkpoint.c: checkpoints as one set of tensors.
 *
 * - sharded (index) and unsharded fixtures give the same tensors, the same
 *   bytes and the same state digest;
 * - the state digest equals the SHA-256 of a manifest built here by hand;
 * - index rules (every case of tests/fixtures/bad/index is refused);
 * - a Hugging Face cache snapshot made of links into blobs/<sha256> is
 *   followed, and a blob whose name is not its digest is MS_ECHECK;
 * - configuration files, adapters, several paths at once.
 */
#include <dirent.h>
#include <sys/stat.h>

#include "test.h"

static char *fx(const char *rel)
{
	return ms_path_join(T_FIXTURES, rel);
}

static char *tmp(const char *rel)
{
	return ms_path_join(T_TMP, rel);
}

static int open_hashed(const char *rel, struct ms_ckpt **c)
{
	char *p = fx(rel);
	struct ms_err err = {0};

	T_ASSERT_MSG(ms_ckpt_open(p, c, &err) == MS_OK, "%s: %s", rel, err.msg);
	T_ASSERT_MSG(ms_ckpt_hash(*c, 2, 1, &err) == MS_OK, "%s: %s", rel, err.msg);
	ms_free(p);
	return 0;
}

/* The manifest of checkpoint.h, written out here from the tensors' own
 * bytes (hashed here, not by the pool). */
static int manual_state_digest(const struct ms_ckpt *c, char out[MS_STATE_DIGEST_LEN])
{
	struct ms_buf b;
	uint8_t d[MS_SHA256_LEN];

	ms_buf_init(&b);
	ms_buf_puts(&b, "msinv-state-v1\n");
	for (size_t i = 0; i < c->ntensors; i++) {
		const struct ms_tensor *t = c->tensors[i];
		char hex[65];

		if (i)
			T_ASSERT(strcmp(c->tensors[i - 1]->name, t->name) < 0);
		T_ASSERT_EQ_INT(ms_sha256(t->data, (size_t)t->nbytes, d), MS_OK);
		ms_hex(d, MS_SHA256_LEN, hex);
		ms_buf_printf(&b, "%s\t%s\t[", t->name, ms_dtype_name(t->dtype));
		for (uint32_t k = 0; k < t->ndim; k++)
			ms_buf_printf(&b, "%s%llu", k ? "," : "", (unsigned long long)t->shape[k]);
		ms_buf_printf(&b, "]\t%s\n", hex);
	}
	T_ASSERT(!b.oom);
	T_ASSERT_EQ_INT(ms_sha256(b.data, b.len, d), MS_OK);
	memcpy(out, "sha256:", 7);
	ms_hex(d, MS_SHA256_LEN, out + 7);
	ms_buf_release(&b);
	return 0;
}

static int test_sharded_equals_unsharded(void)
{
	static const char *const models[] = {"hf/qwen3moe", "hf/mixtral"};

	for (size_t m = 0; m < 2; m++) {
		struct ms_ckpt *one, *sh;
		char rel[64], a[MS_STATE_DIGEST_LEN], b[MS_STATE_DIGEST_LEN], want[MS_STATE_DIGEST_LEN];
		struct ms_err err = {0};

		T_ASSERT_EQ_INT(open_hashed(models[m], &one), 0);
		snprintf(rel, sizeof(rel), "%s-sharded", models[m]);
		T_ASSERT_EQ_INT(open_hashed(rel, &sh), 0);
		T_ASSERT_EQ_INT(one->nfiles, 1);
		T_ASSERT_EQ_INT(sh->nfiles, 2);
		T_ASSERT(one->index_path == NULL && sh->index_path != NULL);
		T_ASSERT(one->ntensors > 10);
		T_ASSERT_EQ_INT(one->ntensors, sh->ntensors);
		for (size_t i = 0; i < one->ntensors; i++) {
			const struct ms_tensor *x = one->tensors[i], *y = sh->tensors[i];

			T_ASSERT_STR(x->name, y->name);
			T_ASSERT(ms_ckpt_find(sh, x->name) == y);
			T_ASSERT(x->dtype == y->dtype && x->nbytes == y->nbytes);
			T_ASSERT(!memcmp(x->data, y->data, (size_t)x->nbytes));
			T_ASSERT(!memcmp(x->digest, y->digest, MS_SHA256_LEN));
		}
		T_ASSERT_EQ_INT(ms_state_digest(one->tensors, one->ntensors, a, &err), MS_OK);
		T_ASSERT_EQ_INT(ms_state_digest(sh->tensors, sh->ntensors, b, &err), MS_OK);
		T_ASSERT_STR(a, b);
		T_ASSERT_EQ_INT(manual_state_digest(one, want), 0);
		T_ASSERT_STR(a, want);
		T_ASSERT(ms_ckpt_find(one, "no.such.tensor") == NULL);
		ms_ckpt_close(one);
		ms_ckpt_close(sh);
	}
	ms_ckpt_close(NULL);
	return 0;
}

/* The state digest depends on names, dtypes, shapes and bytes, and on
 * nothing else (not the order given). */
static int test_state_digest_inputs(void)
{
	struct ms_ckpt *c;
	struct ms_tensor *rev[64], saved;
	char a[MS_STATE_DIGEST_LEN], b[MS_STATE_DIGEST_LEN];
	struct ms_err err = {0};
	size_t n;

	T_ASSERT_EQ_INT(open_hashed("dtypes/all.safetensors", &c), 0);
	n = c->ntensors;
	T_ASSERT(n <= 64);
	for (size_t i = 0; i < n; i++)
		rev[i] = c->tensors[n - 1 - i];
	T_ASSERT_EQ_INT(ms_state_digest(c->tensors, n, a, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_state_digest(rev, n, b, &err), MS_OK);
	T_ASSERT_STR(a, b);
	T_ASSERT(strlen(a) == MS_STATE_DIGEST_LEN - 1 && !strncmp(a, "sha256:", 7));
	saved = *c->tensors[0];
	c->tensors[0]->digest[5] ^= 1;
	T_ASSERT_EQ_INT(ms_state_digest(c->tensors, n, b, &err), MS_OK);
	T_ASSERT(strcmp(a, b));
	*c->tensors[0] = saved;
	c->tensors[0]->shape[0]++;
	T_ASSERT_EQ_INT(ms_state_digest(c->tensors, n, b, &err), MS_OK);
	T_ASSERT(strcmp(a, b));
	*c->tensors[0] = saved;
	c->tensors[0]->dtype = c->tensors[0]->dtype == MS_DTYPE_I16 ? MS_DTYPE_U16 : MS_DTYPE_I16;
	T_ASSERT_EQ_INT(ms_state_digest(c->tensors, n, b, &err), MS_OK);
	T_ASSERT(strcmp(a, b));
	*c->tensors[0] = saved;
	/* unhashed or duplicated tensors have no state digest */
	c->tensors[1]->has_digest = 0;
	T_ASSERT_EQ_INT(ms_state_digest(c->tensors, n, b, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "has not been hashed"));
	c->tensors[1]->has_digest = 1;
	rev[0] = rev[1];
	T_ASSERT_EQ_INT(ms_state_digest(rev, n, b, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "appears twice"));
	ms_ckpt_close(c);
	return 0;
}

static int test_index_file_given_directly(void)
{
	struct ms_ckpt *a, *b;
	struct ms_err err = {0};
	char *idx = fx("hf/qwen3moe-sharded/model.safetensors.index.json");

	T_ASSERT_MSG(ms_ckpt_open(idx, &a, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(open_hashed("hf/qwen3moe-sharded", &b), 0);
	T_ASSERT_EQ_INT(a->nfiles, 2);
	T_ASSERT_EQ_INT(a->ntensors, b->ntensors);
	T_ASSERT_STR(a->index_path, idx);
	for (size_t i = 0; i < a->nfiles; i++)
		T_ASSERT(ms_name_is_plain(a->file_names[i]));
	ms_ckpt_close(a);
	ms_ckpt_close(b);
	ms_free(idx);
	return 0;
}

/* Every index case of the malformed corpus is bad input, with a message
 * that names a file of the case. */
static int test_bad_index_corpus(void)
{
	char *root = fx("bad/index");
	DIR *d = opendir(root);
	struct dirent *de;
	int n = 0;

	T_ASSERT_MSG(d, "%s", root);
	while ((de = readdir(d))) {
		struct ms_ckpt *c = (struct ms_ckpt *)1;
		struct ms_err err = {0};
		char *p;
		int rc;

		if (de->d_name[0] == '.')
			continue;
		p = ms_path_join(root, de->d_name);
		rc = ms_ckpt_open(p, &c, &err);
		T_ASSERT_MSG(rc == MS_EINVAL, "%s: rc %d (%s)", de->d_name, rc, err.msg);
		T_ASSERT(c == NULL);
		T_ASSERT_MSG(strstr(err.msg, p), "%s: '%s'", de->d_name, err.msg);
		ms_free(p);
		n++;
	}
	closedir(d);
	T_ASSERT(n >= 10);
	ms_free(root);
	return 0;
}

/* ---- a Hugging Face cache snapshot ----------------------------------------- */

static int copy_file(const char *from, const char *to)
{
	char *text;
	size_t len;
	struct ms_err err = {0};

	T_ASSERT_EQ_INT(ms_file_read(from, 64u << 20, &text, &len, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_file_write_atomic(to, text, len, 1, &err), MS_OK);
	ms_free(text);
	return 0;
}

/* Build hub/models--t--<name>/{blobs,snapshots/<rev>} from the sharded
 * qwen3moe fixture: each file stored once as blobs/<sha256>, the snapshot
 * made of relative links. With wrong_blob, the second shard is stored
 * under the digest of the first. Returns the snapshot path. */
static char *make_hf_cache(const char *name, int wrong_blob)
{
	static const char *const files[] = {
		"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
		"model.safetensors.index.json", "config.json", "generation_config.json",
	};
	char rel[256], *repo, *snap, *blobs;
	char first_hex[65] = "";
	struct ms_err err = {0};

	snprintf(rel, sizeof(rel), "hub/models--t--%s", name);
	repo = tmp(rel);
	blobs = ms_path_join(repo, "blobs");
	snap = ms_path_join(repo, "snapshots/0123456789abcdef0123456789abcdef01234567");
	if (!repo || !blobs || !snap || ms_mkdir_p(blobs, &err) || ms_mkdir_p(snap, &err))
		return NULL;
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char src_rel[128], *src, *blob, *link, hex[65], target[128];
		uint8_t d[MS_SHA256_LEN];

		snprintf(src_rel, sizeof(src_rel), "hf/qwen3moe-sharded/%s", files[i]);
		src = fx(src_rel);
		if (ms_sha256_file(src, d, &err))
			return NULL;
		ms_hex(d, MS_SHA256_LEN, hex);
		if (i == 0)
			memcpy(first_hex, hex, sizeof(hex));
		if (wrong_blob && i == 1)
			memcpy(hex, first_hex, sizeof(hex));
		blob = ms_path_join(blobs, hex);
		if (wrong_blob && i == 1) {
			/* a blob name that another file owns: store beside it */
			ms_free(blob);
			memcpy(hex + 60, "0000", 4);
			blob = ms_path_join(blobs, hex);
		}
		if (copy_file(src, blob))
			return NULL;
		link = ms_path_join(snap, files[i]);
		snprintf(target, sizeof(target), "../../blobs/%s", hex);
		if (symlink(target, link))
			return NULL;
		ms_free(src);
		ms_free(blob);
		ms_free(link);
	}
	ms_free(repo);
	ms_free(blobs);
	return snap;
}

static int test_hf_cache_snapshot(void)
{
	char *snap = make_hf_cache("good", 0);
	struct ms_ckpt *c, *ref;
	struct ms_err err = {0};
	char a[MS_STATE_DIGEST_LEN], b[MS_STATE_DIGEST_LEN];

	T_ASSERT(snap);
	T_ASSERT_MSG(ms_ckpt_open(snap, &c, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(c->nfiles, 2);
	for (size_t i = 0; i < c->nfiles; i++) {
		struct stat st;

		T_ASSERT(lstat(c->files[i]->path, &st) == 0 && S_ISLNK(st.st_mode));
		T_ASSERT_MSG(c->files[i]->blob_digest && strlen(c->files[i]->blob_digest) == 64,
			     "%s has no blob name", c->files[i]->path);
	}
	T_ASSERT_MSG(ms_ckpt_hash(c, 0, 1, &err) == MS_OK, "%s", err.msg);
	for (size_t i = 0; i < c->nfiles; i++) {
		char hex[65];

		ms_hex(c->files[i]->file_digest, MS_SHA256_LEN, hex);
		T_ASSERT_STR(hex, c->files[i]->blob_digest);
	}
	/* the same state as the directory it was copied from */
	T_ASSERT_EQ_INT(open_hashed("hf/qwen3moe-sharded", &ref), 0);
	T_ASSERT_EQ_INT(ms_state_digest(c->tensors, c->ntensors, a, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_state_digest(ref->tensors, ref->ntensors, b, &err), MS_OK);
	T_ASSERT_STR(a, b);
	/* config.json recorded through its link, generation_config.json as a
	 * side file */
	T_ASSERT(ms_ckpt_config(c, "config.json") != NULL);
	T_ASSERT(!ms_ckpt_config(c, "config.json")->side);
	T_ASSERT(ms_ckpt_config(c, "generation_config.json") != NULL);
	T_ASSERT(ms_ckpt_config(c, "generation_config.json")->side);
	ms_ckpt_close(c);
	ms_ckpt_close(ref);
	ms_free(snap);
	return 0;
}

static int test_hf_cache_wrong_blob_name(void)
{
	char *snap = make_hf_cache("bad", 1);
	struct ms_ckpt *c;
	struct ms_err err = {0};

	T_ASSERT(snap);
	T_ASSERT_MSG(ms_ckpt_open(snap, &c, &err) == MS_OK, "%s", err.msg);
	/* tensor digests alone do not read the whole file: no verdict yet */
	T_ASSERT_EQ_INT(ms_ckpt_hash(c, 0, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_ckpt_hash(c, 0, 1, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, "model-00002-of-00002.safetensors") &&
		     strstr(err.msg, "does not match its blob name"), "%s", err.msg);
	T_ASSERT(!strchr(err.msg, '\n'));
	ms_ckpt_close(c);
	ms_free(snap);
	return 0;
}

/* ---- configs, adapters, several paths ------------------------------------- */

static int test_configs_recorded(void)
{
	struct ms_ckpt *c;
	const struct ms_ckpt_config *cfg;
	char *p = fx("hf/qwen3moe/config.json"), *text;
	size_t len;
	uint8_t d[MS_SHA256_LEN];
	struct ms_err err = {0};

	T_ASSERT_EQ_INT(open_hashed("hf/qwen3moe", &c), 0);
	T_ASSERT_EQ_INT(c->nconfigs, 2); /* and generation_config.json */
	cfg = ms_ckpt_config(c, "config.json");
	T_ASSERT(cfg);
	T_ASSERT_EQ_INT(ms_file_read(p, 1 << 20, &text, &len, &err), MS_OK);
	T_ASSERT_EQ_INT(cfg->len, len);
	T_ASSERT(!memcmp(cfg->text, text, len));
	T_ASSERT_EQ_INT(ms_sha256(text, len, d), MS_OK);
	T_ASSERT(!memcmp(cfg->digest, d, MS_SHA256_LEN));
	T_ASSERT(!c->is_adapter);
	ms_free(text);
	ms_free(p);
	ms_ckpt_close(c);
	T_ASSERT_EQ_INT(open_hashed("peft/qwen3moe-E8-r4/adapter", &c), 0);
	T_ASSERT(c->is_adapter);
	T_ASSERT(ms_ckpt_config(c, "adapter_config.json") != NULL);
	T_ASSERT_STR(c->file_names[0], "adapter_model.safetensors");
	ms_ckpt_close(c);
	/* a single file carries no configuration */
	T_ASSERT_EQ_INT(open_hashed("hf/qwen3moe/model.safetensors", &c), 0);
	T_ASSERT_EQ_INT(c->nconfigs, 0);
	ms_ckpt_close(c);
	return 0;
}

static int write_index(const char *dir, const char *text)
{
	char *p = ms_path_join(dir, "model.safetensors.index.json");
	struct ms_err err = {0};

	T_ASSERT_EQ_INT(ms_file_write_atomic(p, text, strlen(text), 1, &err), MS_OK);
	ms_free(p);
	return 0;
}

static int test_open_many(void)
{
	struct ms_ckpt *c = NULL;
	struct ms_err err = {0};
	char *base = fx("peft/qwen3moe-E8-r4/base"), *ad = fx("peft/qwen3moe-E8-r4/adapter");
	char *one = fx("hf/qwen3moe/model.safetensors"), *sh = fx("hf/qwen3moe-sharded");
	char *alias = tmp("alias.safetensors");
	const char *both[2] = {base, ad}, *twice[2] = {one, alias}, *dup[2] = {one, sh};
	char abs[4096];

	T_ASSERT_MSG(ms_ckpt_open_many(both, 2, &c, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(c->nfiles, 2);
	T_ASSERT(c->is_adapter);
	ms_ckpt_close(c);
	/* one file under two names */
	T_ASSERT(realpath(one, abs));
	T_ASSERT_EQ_INT(symlink(abs, alias), 0);
	T_ASSERT_EQ_INT(ms_ckpt_open_many(twice, 2, &c, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "are the same file"), "%s", err.msg);
	/* one tensor name in two files; a sharded directory after a file
	 * checks its index against its own shards only */
	T_ASSERT_EQ_INT(ms_ckpt_open_many(dup, 2, &c, &err), MS_EINVAL);
	T_ASSERT_MSG(strstr(err.msg, "appears in both"), "%s", err.msg);
	T_ASSERT(c == NULL);
	T_ASSERT_EQ_INT(ms_ckpt_open_many(both, 0, &c, &err), MS_EINVAL);
	/* two sharded directories with the same shard names: each index is
	 * checked against its own shards */
	{
		char *d[2] = {tmp("same1"), tmp("same2")};
		const char *two[2] = {d[0], d[1]};
		uint64_t shape[1] = {1};

		for (int i = 0; i < 2; i++) {
			struct ms_st_writer *w;
			char *p = ms_path_join(d[i], "model-00001-of-00001.safetensors");
			char idx[128];

			T_ASSERT_EQ_INT(ms_mkdir_p(d[i], &err), MS_OK);
			T_ASSERT_EQ_INT(ms_st_writer_new(p, 0, &w, &err), MS_OK);
			T_ASSERT_EQ_INT(ms_st_writer_add(w, i ? "x2" : "x1", MS_DTYPE_U8, 1, shape, "q", &err),
					MS_OK);
			T_ASSERT_EQ_INT(ms_st_writer_commit(w, &err), MS_OK);
			ms_st_writer_free(w);
			snprintf(idx, sizeof(idx),
				 "{\"weight_map\":{\"x%d\":\"model-00001-of-00001.safetensors\"}}", i + 1);
			T_ASSERT_EQ_INT(write_index(d[i], idx), 0);
			ms_free(p);
		}
		T_ASSERT_MSG(ms_ckpt_open_many(two, 2, &c, &err) == MS_OK, "%s", err.msg);
		T_ASSERT_EQ_INT(c->nfiles, 2);
		T_ASSERT_STR(c->file_names[0], c->file_names[1]);
		T_ASSERT(ms_ckpt_find(c, "x1") && ms_ckpt_find(c, "x2"));
		ms_ckpt_close(c);
		ms_free(d[0]);
		ms_free(d[1]);
	}
	ms_free(base);
	ms_free(ad);
	ms_free(one);
	ms_free(sh);
	ms_free(alias);
	return 0;
}

static int test_open_errors(void)
{
	struct ms_ckpt *c = NULL;
	struct ms_err err = {0};
	char *none = tmp("none"), *empty = tmp("emptydir"), *bad = fx("bad/hole.safetensors");

	T_ASSERT_EQ_INT(ms_ckpt_open(none, &c, &err), MS_ENOTFOUND);
	T_ASSERT(strstr(err.msg, none));
	T_ASSERT_EQ_INT(ms_mkdir_p(empty, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_ckpt_open(empty, &c, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "no .safetensors files"));
	T_ASSERT_EQ_INT(ms_ckpt_open(bad, &c, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "hole in the data buffer"));
	T_ASSERT(c == NULL);
	T_ASSERT_EQ_INT(ms_ckpt_open("/dev/null", &c, &err), MS_EINVAL);
	ms_free(none);
	ms_free(empty);
	ms_free(bad);
	return 0;
}

/* A sharded checkpoint whose shards are checked against the index in both
 * directions: built here from two good shards, then broken one way at a
 * time. */
static int test_index_rules(void)
{
	char *dir = tmp("idx"), *p;
	struct ms_ckpt *c;
	struct ms_err err = {0};
	struct ms_st_writer *w;
	uint64_t shape[1] = {2};
	static const char *const names[2] = {"s1.safetensors", "s2.safetensors"};

	T_ASSERT_EQ_INT(ms_mkdir_p(dir, &err), MS_OK);
	for (int i = 0; i < 2; i++) {
		p = ms_path_join(dir, names[i]);
		T_ASSERT_EQ_INT(ms_st_writer_new(p, 0, &w, &err), MS_OK);
		T_ASSERT_EQ_INT(ms_st_writer_add(w, i ? "b" : "a", MS_DTYPE_U8, 1, shape, "xy", &err), MS_OK);
		T_ASSERT_EQ_INT(ms_st_writer_commit(w, &err), MS_OK);
		ms_st_writer_free(w);
		ms_free(p);
	}
	T_ASSERT_EQ_INT(write_index(dir, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}"), 0);
	T_ASSERT_MSG(ms_ckpt_open(dir, &c, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(c->ntensors, 2);
	ms_ckpt_close(c);
	/* trailing whitespace after the object is fine, trailing text is not */
	T_ASSERT_EQ_INT(write_index(dir, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}\n\n "), 0);
	T_ASSERT_MSG(ms_ckpt_open(dir, &c, &err) == MS_OK, "%s", err.msg);
	ms_ckpt_close(c);
	T_ASSERT_EQ_INT(write_index(dir, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}} x"), 0);
	T_ASSERT_EQ_INT(ms_ckpt_open(dir, &c, &err), MS_EINVAL);
	/* each broken rule */
	{
		static const struct {
			const char *index, *frag;
		} bad[] = {
			{"{\"weight_map\":{\"a\":\"../idx/s1.safetensors\",\"b\":\"s2.safetensors\"}}", "not a plain"},
			{"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"..\"}}", "not a plain"},
			{"{\"weight_map\":{\"a\":\"\",\"b\":\"s2.safetensors\"}}", "not a plain"},
			{"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s3.safetensors\"}}", "does not exist"},
			{"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\",\"c\":\"s2.safetensors\"}}",
			 "tensor 'c' is mapped to 's2.safetensors' but not found there"},
			{"{\"weight_map\":{\"b\":\"s1.safetensors\",\"a\":\"s2.safetensors\"}}", "but not found there"},
			{"{\"weight_map\":{\"a\":\"s1.safetensors\",\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}",
			 "lists tensor 'a' twice"},
			{"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\",\"b\":\"s2.safetensors\"}}",
			 "lists tensor 'b' twice"},
			{"{\"weight_map\":[\"s1.safetensors\"]}", "no \"weight_map\" object"},
			{"{\"weight_map\":{\"a\":null}}", "is not a file name"},
			{"", "not a JSON object"},
			{"{\"weight_map\":{}}", "no safetensors files"},
		};

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			int rc;

			T_ASSERT_EQ_INT(write_index(dir, bad[i].index), 0);
			c = (struct ms_ckpt *)1;
			rc = ms_ckpt_open(dir, &c, &err);
			T_ASSERT_MSG(rc == MS_EINVAL && strstr(err.msg, bad[i].frag),
				     "index %s: rc %d, '%s', want '%s'", bad[i].index, rc, err.msg,
				     bad[i].frag);
			T_ASSERT(c == NULL);
		}
	}
	ms_free(dir);
	return 0;
}

/* Every other file a loader or server needs is carried as a side file,
 * with its digest; weights of other formats, hidden files, MANIFEST.json
 * and subdirectories are not. Failed before side files existed: only the
 * five configuration names were recorded. */
static int test_side_files(void)
{
	static const char *const side[] = {
		"chat_template.jinja", "generation_config.json", "special_tokens_map.json",
		"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
	};
	static const char *const not_side[] = {
		"pytorch_model.bin", "consolidated.pth", "model.gguf", ".hidden",
		"MANIFEST.json", ".model.safetensors.tmp-1-ab",
	};
	char *dir = tmp("side"), *p, cmd[1200];
	struct ms_ckpt *c;
	struct ms_err err = {0};
	uint8_t d[MS_SHA256_LEN];

	T_ASSERT(dir);
	T_ASSERT_EQ_INT(ms_mkdir_p(dir, &err), MS_OK);
	snprintf(cmd, sizeof(cmd), "cp '%s/hf/qwen3moe/model.safetensors' '%s/hf/qwen3moe/config.json' '%s/' && mkdir -p '%s/original' && echo x > '%s/original/params.json'",
		 T_FIXTURES, T_FIXTURES, dir, dir, dir);
	T_ASSERT(system(cmd) == 0);
	for (size_t i = 0; i < sizeof(side) / sizeof(side[0]); i++) {
		p = ms_path_join(dir, side[i]);
		/* tokenizer.model is binary (sentencepiece): bytes with NULs */
		T_ASSERT_EQ_INT(ms_file_write_atomic(p, i == 4 ? "\x00\x01\x02bin" : side[i],
						     i == 4 ? 6 : strlen(side[i]), 1, &err), MS_OK);
		ms_free(p);
	}
	for (size_t i = 0; i < sizeof(not_side) / sizeof(not_side[0]); i++) {
		p = ms_path_join(dir, not_side[i]);
		T_ASSERT_EQ_INT(ms_file_write_atomic(p, "zz", 2, 1, &err), MS_OK);
		ms_free(p);
	}
	T_ASSERT_MSG(ms_ckpt_open(dir, &c, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(c->nconfigs, 1 + sizeof(side) / sizeof(side[0]));
	T_ASSERT(ms_ckpt_config(c, "config.json") && !ms_ckpt_config(c, "config.json")->side);
	for (size_t i = 0; i < sizeof(side) / sizeof(side[0]); i++) {
		const struct ms_ckpt_config *cf = ms_ckpt_config(c, side[i]);

		T_ASSERT_MSG(cf && cf->side, "side file '%s' not recorded", side[i]);
		T_ASSERT_EQ_INT(ms_sha256(i == 4 ? "\x00\x01\x02bin" : side[i],
					  i == 4 ? 6 : strlen(side[i]), d), MS_OK);
		T_ASSERT(!memcmp(d, cf->digest, MS_SHA256_LEN));
	}
	for (size_t i = 0; i < sizeof(not_side) / sizeof(not_side[0]); i++)
		T_ASSERT_MSG(!ms_ckpt_config(c, not_side[i]), "'%s' recorded", not_side[i]);
	T_ASSERT(!ms_ckpt_config(c, "params.json") && !ms_ckpt_config(c, "original"));
	ms_ckpt_close(c);
	ms_free(dir);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_side_files),
	T_CASE(test_sharded_equals_unsharded),
	T_CASE(test_state_digest_inputs),
	T_CASE(test_index_file_given_directly),
	T_CASE(test_bad_index_corpus),
	T_CASE(test_hf_cache_snapshot),
	T_CASE(test_hf_cache_wrong_blob_name),
	T_CASE(test_configs_recorded),
	T_CASE(test_open_many),
	T_CASE(test_open_errors),
	T_CASE(test_index_rules),
};

T_MAIN(cases)
