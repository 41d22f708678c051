/*
 * t_vload.c: verified load into host memory (vload.h). Expected digests
 * are computed here from the bytes the test wrote, with one-shot SHA-256,
 * not by the code under test. The device variant is in t_vload_gpu.c; here
 * it must refuse cleanly when there is no GPU.
 */
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>

#include <sqlite3.h>

#include "test.h"
#include "gpu.h"
#include "vload.h"

#define NT 7

static uint64_t rng = 0x1234567887654321ull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* sizes: one above the engine's 1 MiB chunk and not a multiple of it, an
 * empty tensor, and small odd ones */
static const uint64_t sizes[NT] = {3 * 1048576 + 17, 0, 1, 4096, 77, 1048576, 300001};

struct fixture {
	char path[512];
	uint8_t *src[NT];
	uint8_t digest[NT][MS_SHA256_LEN];
	struct ms_st_file *f;
};

static void fixture_free(struct fixture *fx)
{
	for (int i = 0; i < NT; i++)
		ms_free(fx->src[i]);
	ms_st_close(fx->f);
	memset(fx, 0, sizeof(*fx));
}

/* t0..t6 as U8 vectors of random bytes, written and reopened */
static int fixture_make(struct fixture *fx, const char *name)
{
	struct ms_st_writer *w = NULL;
	struct ms_err err = {0};

	memset(fx, 0, sizeof(*fx));
	snprintf(fx->path, sizeof(fx->path), "%s/%s", T_TMP, name);
	T_ASSERT(ms_st_writer_new(fx->path, 1, &w, &err) == MS_OK);
	for (int i = 0; i < NT; i++) {
		char tn[16];

		snprintf(tn, sizeof(tn), "t%d", i);
		fx->src[i] = ms_malloc(sizes[i] ? sizes[i] : 1);
		T_ASSERT(fx->src[i]);
		for (uint64_t k = 0; k < sizes[i]; k++)
			fx->src[i][k] = (uint8_t)(next_rand() >> 24);
		T_ASSERT(ms_sha256(fx->src[i], sizes[i], fx->digest[i]) == MS_OK);
		T_ASSERT(ms_st_writer_add(w, tn, MS_DTYPE_U8, 1, &sizes[i], fx->src[i],
					  &err) == MS_OK);
	}
	T_ASSERT_MSG(ms_st_writer_commit(w, &err) == MS_OK, "%s", err.msg);
	ms_st_writer_free(w);
	T_ASSERT_MSG(ms_st_open(fx->path, &fx->f, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(fx->f->ntensors, NT);
	return 0;
}

/* items in name order t0..t6 with fresh destinations */
static int items_make(struct fixture *fx, struct ms_vload_item *it)
{
	for (int i = 0; i < NT; i++) {
		char tn[16];

		snprintf(tn, sizeof(tn), "t%d", i);
		it[i].tensor = ms_st_find(fx->f, tn);
		T_ASSERT(it[i].tensor && it[i].tensor->nbytes == sizes[i]);
		memcpy(it[i].expected, fx->digest[i], MS_SHA256_LEN);
		it[i].dst = ms_malloc(sizes[i] ? sizes[i] : 1);
		T_ASSERT(it[i].dst);
		memset(it[i].dst, 0xa5, sizes[i]);
	}
	return 0;
}

static void items_free(struct ms_vload_item *it)
{
	for (int i = 0; i < NT; i++)
		ms_free(it[i].dst);
}

static int all_zero(const uint8_t *p, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

static int test_loads_and_checks(void)
{
	struct fixture fx;
	struct ms_vload_item it[NT] = {{0}};
	struct ms_err err = {0};

	T_ASSERT(fixture_make(&fx, "ok.safetensors") == 0);
	for (int threads = 1; threads <= 4; threads += 3) {
		T_ASSERT(items_make(&fx, it) == 0);
		T_ASSERT_MSG(ms_load_verified(it, NT, threads, &err) == MS_OK, "%s", err.msg);
		for (int i = 0; i < NT; i++)
			T_ASSERT_MSG(!memcmp(it[i].dst, fx.src[i], sizes[i]),
				     "tensor t%d differs (threads %d)", i, threads);
		items_free(it);
	}
	fixture_free(&fx);
	return 0;
}

static int test_mismatch_names_tensor_and_clears(void)
{
	struct fixture fx;
	struct ms_vload_item it[NT] = {{0}};
	struct ms_err err = {0};

	T_ASSERT(fixture_make(&fx, "bad.safetensors") == 0);
	T_ASSERT(items_make(&fx, it) == 0);
	it[4].expected[31] ^= 1;
	T_ASSERT_EQ_INT(ms_load_verified(it, NT, 2, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't4'") && strstr(err.msg, "digest mismatch") &&
		     strstr(err.msg, "bad.safetensors"), "%s", err.msg);
	for (int i = 0; i < NT; i++)
		T_ASSERT_MSG(all_zero(it[i].dst, sizes[i]), "t%d not cleared", i);
	items_free(it);
	/* the empty tensor is checked too */
	T_ASSERT(items_make(&fx, it) == 0);
	it[1].expected[0] ^= 0x80;
	T_ASSERT_EQ_INT(ms_load_verified(it, NT, 1, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't1'"), "%s", err.msg);
	items_free(it);
	fixture_free(&fx);
	return 0;
}

/* bytes that change on disk after the file was opened and validated are
 * the bytes that get hashed: the change is caught */
static int test_file_changed_after_open(void)
{
	struct fixture fx;
	struct ms_vload_item it[NT] = {{0}};
	struct ms_err err = {0};
	uint8_t b;
	int fd;

	T_ASSERT(fixture_make(&fx, "changed.safetensors") == 0);
	T_ASSERT(items_make(&fx, it) == 0);
	fd = open(fx.path, O_RDWR);
	T_ASSERT(fd >= 0);
	T_ASSERT(pread(fd, &b, 1, (off_t)(it[0].tensor->offset + 2 * 1048576 + 5)) == 1);
	b ^= 0x40;
	T_ASSERT(pwrite(fd, &b, 1, (off_t)(it[0].tensor->offset + 2 * 1048576 + 5)) == 1);
	close(fd);
	T_ASSERT_EQ_INT(ms_load_verified(it, NT, 3, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't0'"), "%s", err.msg);
	items_free(it);
	fixture_free(&fx);
	return 0;
}

static int test_truncated_file_is_io_error(void)
{
	struct fixture fx;
	struct ms_vload_item it[NT] = {{0}};
	struct ms_err err = {0};

	T_ASSERT(fixture_make(&fx, "short.safetensors") == 0);
	T_ASSERT(items_make(&fx, it) == 0);
	T_ASSERT(truncate(fx.path, (off_t)(fx.f->size - 10)) == 0);
	T_ASSERT_EQ_INT(ms_load_verified(it, NT, 2, &err), MS_EIO);
	T_ASSERT_MSG(strstr(err.msg, "truncated"), "%s", err.msg);
	for (int i = 0; i < NT; i++)
		T_ASSERT(all_zero(it[i].dst, sizes[i]));
	items_free(it);
	fixture_free(&fx);
	return 0;
}

/* an in-memory image (ms_st_parse) is copied from memory */
static int test_memory_image(void)
{
	struct fixture fx;
	struct ms_st_file *mf = NULL;
	struct ms_vload_item it[NT] = {{0}};
	struct ms_err err = {0};
	char *img = NULL;
	size_t len = 0;

	T_ASSERT(fixture_make(&fx, "image.safetensors") == 0);
	T_ASSERT(ms_file_read(fx.path, 1u << 26, &img, &len, &err) == MS_OK);
	T_ASSERT(ms_st_parse((const uint8_t *)img, len, "image", &mf, &err) == MS_OK);
	T_ASSERT(items_make(&fx, it) == 0);
	for (int i = 0; i < NT; i++) {
		char tn[16];

		snprintf(tn, sizeof(tn), "t%d", i);
		it[i].tensor = ms_st_find(mf, tn);
		T_ASSERT(it[i].tensor);
	}
	T_ASSERT_MSG(ms_load_verified(it, NT, 2, &err) == MS_OK, "%s", err.msg);
	for (int i = 0; i < NT; i++)
		T_ASSERT(!memcmp(it[i].dst, fx.src[i], sizes[i]));
	items_free(it);
	ms_st_close(mf);
	ms_free(img);
	fixture_free(&fx);
	return 0;
}

static int test_no_destination_is_bad_input(void)
{
	struct fixture fx;
	struct ms_vload_item it[NT] = {{0}};
	struct ms_err err = {0};
	void *keep;

	T_ASSERT(fixture_make(&fx, "nodst.safetensors") == 0);
	T_ASSERT(items_make(&fx, it) == 0);
	keep = it[3].dst;
	it[3].dst = NULL;
	T_ASSERT_EQ_INT(ms_load_verified(it, NT, 1, &err), MS_EINVAL);
	it[3].dst = keep;
	items_free(it);
	fixture_free(&fx);
	return 0;
}

/* without a GPU (or CUDA) the device variant refuses and leaves nothing */
static int test_gpu_variant_without_gpu(void)
{
	struct fixture fx;
	struct ms_vload_item it[NT] = {{0}};
	struct ms_err err = {0};
	void *arena = (void *)1;

	if (ms_gpu_available())
		return 0; /* t_vload_gpu covers it */
	T_ASSERT(fixture_make(&fx, "nogpu.safetensors") == 0);
	T_ASSERT(items_make(&fx, it) == 0);
	for (int i = 0; i < NT; i++)
		ms_free(it[i].dst);
	T_ASSERT_EQ_INT(ms_load_verified_gpu(it, NT, 2, &arena, &err), MS_ENODEV);
	T_ASSERT(arena == NULL);
	for (int i = 0; i < NT; i++)
		T_ASSERT(it[i].dst == NULL);
	T_ASSERT(strlen(err.msg) > 0);
	fixture_free(&fx);
	return 0;
}


/* ---- tree digests ------------------------------------------------------- */

#define TN 6
/* one tensor of several spans (MS_VLOAD_SPAN) that every worker shares,
 * chunk boundaries, empty */
static const uint64_t tsizes[TN] = {(37u << 20) + 5, 0, 1, 65536, 65537, 3 * 1048576 + 17};

struct tfixture {
	char path[512];
	uint8_t *src[TN];
	uint8_t tree[TN][MS_SHA256_LEN], digest[TN][MS_SHA256_LEN];
	struct ms_st_file *f;
	struct ms_vload_item it[TN];
};

static void tfixture_free(struct tfixture *fx)
{
	for (int i = 0; i < TN; i++) {
		ms_free(fx->src[i]);
		ms_free(fx->it[i].dst);
	}
	ms_st_close(fx->f);
}

/* expected trees from hash.c's parallel tree (checked against the
 * definition and Python's hashlib in t_hash and tree_oracle) */
static int tfixture_make(struct tfixture *fx, const char *name)
{
	struct ms_st_writer *w = NULL;
	struct ms_err err = {0};

	memset(fx, 0, sizeof(*fx));
	snprintf(fx->path, sizeof(fx->path), "%s/%s", T_TMP, name);
	T_ASSERT(ms_st_writer_new(fx->path, 1, &w, &err) == MS_OK);
	for (int i = 0; i < TN; i++) {
		char tn[16];

		snprintf(tn, sizeof(tn), "t%d", i);
		fx->src[i] = ms_malloc(tsizes[i] + 1);
		T_ASSERT(fx->src[i]);
		for (uint64_t k = 0; k < tsizes[i]; k++)
			fx->src[i][k] = (uint8_t)(next_rand() >> 24);
		T_ASSERT(ms_tree_digest(fx->src[i], tsizes[i], MS_TREE_LOG2, 0, fx->tree[i], &err) ==
			 MS_OK);
		T_ASSERT(ms_sha256(fx->src[i], tsizes[i], fx->digest[i]) == MS_OK);
		T_ASSERT(ms_st_writer_add(w, tn, MS_DTYPE_U8, 1, &tsizes[i], fx->src[i], &err) ==
			 MS_OK);
	}
	T_ASSERT_MSG(ms_st_writer_commit(w, &err) == MS_OK, "%s", err.msg);
	ms_st_writer_free(w);
	T_ASSERT_MSG(ms_st_open(fx->path, &fx->f, &err) == MS_OK, "%s", err.msg);
	for (int i = 0; i < TN; i++) {
		char tn[16];

		snprintf(tn, sizeof(tn), "t%d", i);
		fx->it[i].tensor = ms_st_find(fx->f, tn);
		T_ASSERT(fx->it[i].tensor);
		/* a wrong plain digest: with use_tree only the tree is used */
		memset(fx->it[i].expected, 0xee, MS_SHA256_LEN);
		memcpy(fx->it[i].expected_tree, fx->tree[i], MS_SHA256_LEN);
		fx->it[i].use_tree = 1;
		fx->it[i].dst = ms_malloc(tsizes[i] + 1);
		T_ASSERT(fx->it[i].dst);
	}
	return 0;
}

static int hook_item = -1, hook_fired;
static enum ms_vload_hook_where hook_where;

/* flips one bit of item hook_item's bytes, once, where asked */
static void tamper(enum ms_vload_hook_where where, void *p, uint64_t len, size_t item)
{
	if (hook_fired || where != hook_where || (int)item != hook_item || !len)
		return;
	((uint8_t *)p)[len / 2] ^= 0x20;
	hook_fired = 1;
}

static int test_tree_load_host(void)
{
	struct tfixture fx;
	struct ms_err err = {0};

	T_ASSERT(tfixture_make(&fx, "tree.safetensors") == 0);
	for (int threads = 1; threads <= 8; threads += 7) {
		for (int i = 0; i < TN; i++)
			memset(fx.it[i].dst, 0xa5, tsizes[i]);
		T_ASSERT_MSG(ms_load_verified(fx.it, TN, threads, &err) == MS_OK, "%s", err.msg);
		for (int i = 0; i < TN; i++)
			T_ASSERT_MSG(!memcmp(fx.it[i].dst, fx.src[i], tsizes[i]), "t%d, %d threads", i,
				     threads);
	}
	/* a wrong tree is a mismatch naming the tensor; nothing is left */
	fx.it[3].expected_tree[0] ^= 1;
	T_ASSERT_EQ_INT(ms_load_verified(fx.it, TN, 4, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't3'") && strstr(err.msg, "mismatch"), "%s", err.msg);
	for (int i = 0; i < TN; i++)
		T_ASSERT(all_zero(fx.it[i].dst, tsizes[i]));
	tfixture_free(&fx);
	return 0;
}

/* the host buffer changed after the read (a stray write, a bad DIMM): the
 * tree is taken over the buffer the caller gets, so it is refused */
static int test_tree_host_buffer_tampered(void)
{
	struct tfixture fx;
	struct ms_err err = {0};

	T_ASSERT(tfixture_make(&fx, "treehook.safetensors") == 0);
	hook_item = 0;
	hook_where = MS_VLOAD_HOOK_STAGED;
	hook_fired = 0;
	ms_vload_test_hook = tamper;
	T_ASSERT_EQ_INT(ms_load_verified(fx.it, TN, 4, &err), MS_ECHECK);
	ms_vload_test_hook = NULL;
	T_ASSERT(hook_fired);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't0'"), "%s", err.msg);
	T_ASSERT(all_zero(fx.it[0].dst, tsizes[0]));
	tfixture_free(&fx);
	return 0;
}

/* the file changed after it was opened: a span's chunk differs */
static int test_tree_file_changed(void)
{
	struct tfixture fx;
	struct ms_err err = {0};
	uint8_t b;
	int fd;
	off_t at;

	T_ASSERT(tfixture_make(&fx, "treechg.safetensors") == 0);
	at = (off_t)(fx.it[0].tensor->offset + (33u << 20) + 7);
	fd = open(fx.path, O_RDWR);
	T_ASSERT(fd >= 0 && pread(fd, &b, 1, at) == 1);
	b ^= 0x80;
	T_ASSERT(pwrite(fd, &b, 1, at) == 1);
	close(fd);
	T_ASSERT_EQ_INT(ms_load_verified(fx.it, TN, 3, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't0'"), "%s", err.msg);
	tfixture_free(&fx);
	return 0;
}

static pthread_t seen[64];
static int nseen;
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

static void note_thread(enum ms_vload_hook_where where, void *p, uint64_t len, size_t item)
{
	pthread_t me = pthread_self();
	int known = 0;

	pthread_mutex_lock(&seen_lock);
	for (int i = 0; i < nseen; i++)
		known |= pthread_equal(seen[i], me);
	if (!known && nseen < 64)
		seen[nseen++] = me;
	pthread_mutex_unlock(&seen_lock);
}

/* one large tensor alone is read and hashed by several threads (its tree
 * spans), not bound to one as its sequential digest is */
static int test_tree_one_tensor_many_threads(void)
{
	struct tfixture fx;
	struct ms_err err = {0};

	T_ASSERT(tfixture_make(&fx, "treeone.safetensors") == 0);
	nseen = 0;
	ms_vload_test_hook = note_thread;
	T_ASSERT_MSG(ms_load_verified(fx.it, 1, 4, &err) == MS_OK, "%s", err.msg);
	ms_vload_test_hook = NULL;
	T_ASSERT_MSG(nseen > 1, "one 37 MiB tensor, 4 threads asked: %d used", nseen);
	T_ASSERT(!memcmp(fx.it[0].dst, fx.src[0], tsizes[0]));
	tfixture_free(&fx);
	return 0;
}

/* without a recorded tree: the plain digest is checked and the tree of
 * the same pass handed out (what a caller records) */
static int test_want_tree_host(void)
{
	struct tfixture fx;
	struct ms_err err = {0};

	T_ASSERT(tfixture_make(&fx, "treewant.safetensors") == 0);
	for (int i = 0; i < TN; i++) {
		fx.it[i].use_tree = 0;
		fx.it[i].want_tree = 1;
		memcpy(fx.it[i].expected, fx.digest[i], MS_SHA256_LEN);
	}
	T_ASSERT_MSG(ms_load_verified(fx.it, TN, 4, &err) == MS_OK, "%s", err.msg);
	for (int i = 0; i < TN; i++) {
		T_ASSERT(fx.it[i].has_got_tree);
		T_ASSERT(!memcmp(fx.it[i].got_tree, fx.tree[i], MS_SHA256_LEN));
	}
	/* a plain mismatch hands out no tree */
	fx.it[5].expected[3] ^= 1;
	T_ASSERT_EQ_INT(ms_load_verified(fx.it, TN, 4, &err), MS_ECHECK);
	for (int i = 0; i < TN; i++)
		T_ASSERT(!fx.it[i].has_got_tree);
	tfixture_free(&fx);
	return 0;
}

/* An inventory without tree digests (made before them) gains them at the
 * first verified load: the load checks the recorded plain digests, hands
 * out the trees of the same pass, and the inventory records them; a
 * tensor whose bytes changed gains none. */
static int test_first_load_records_trees(void)
{
	struct tfixture fx;
	struct ms_inv *inv = NULL;
	struct ms_vstate *s = NULL;
	struct ms_tree_rec *recs = NULL;
	struct ms_err err = {0};
	char db[512], digest[MS_STATE_DIGEST_LEN];
	const char *paths[1];
	size_t nrecs = 0, added = 0;
	sqlite3 *raw = NULL;

	T_ASSERT(tfixture_make(&fx, "treeinv.safetensors") == 0);
	snprintf(db, sizeof(db), "%s/treeinv.db", T_TMP);
	paths[0] = fx.path;
	T_ASSERT_MSG(ms_inv_open(db, MS_INV_CREATE, &inv, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_MSG(ms_inv_add_paths(inv, paths, 1, NULL, digest, &err) == MS_OK, "%s", err.msg);
	ms_inv_close(inv);
	/* as if recorded before tree digests existed */
	T_ASSERT(sqlite3_open(db, &raw) == SQLITE_OK);
	T_ASSERT(sqlite3_exec(raw, "DELETE FROM tree_digests", NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(raw);
	T_ASSERT(ms_inv_open(db, 0, &inv, &err) == MS_OK);
	T_ASSERT(ms_vstate_from_inv(inv, digest, 0, &s, &err) == MS_OK);
	for (int i = 0; i < TN; i++) {
		const struct ms_vtensor *vt = NULL;

		for (size_t k = 0; k < s->files[0].ntensors; k++)
			if (!strcmp(s->files[0].tensors[k].name, fx.it[i].tensor->name))
				vt = &s->files[0].tensors[k];
		T_ASSERT(vt && !vt->has_tree);
		fx.it[i].use_tree = 0;
		fx.it[i].want_tree = 1;
		memcpy(fx.it[i].expected, vt->digest, MS_SHA256_LEN);
	}
	ms_vstate_free(s);
	s = NULL;
	T_ASSERT_MSG(ms_load_verified(fx.it, TN, 4, &err) == MS_OK, "%s", err.msg);
	T_ASSERT(ms_vload_tree_recs(fx.it, TN, &recs, &nrecs, &err) == MS_OK);
	T_ASSERT_EQ_INT(nrecs, TN);
	T_ASSERT(ms_inv_record_trees(inv, digest, recs, nrecs, "load", &added, &err) == MS_OK);
	/* t1 is empty and shares no bytes with another; every tensor is new */
	T_ASSERT_EQ_INT(added, TN);
	ms_free(recs);
	T_ASSERT(ms_vstate_from_inv(inv, digest, 0, &s, &err) == MS_OK);
	for (size_t k = 0; k < s->files[0].ntensors; k++) {
		const struct ms_vtensor *vt = &s->files[0].tensors[k];
		int i = vt->name[1] - '0';

		T_ASSERT(vt->has_tree);
		T_ASSERT(!memcmp(vt->tree, fx.tree[i], MS_SHA256_LEN));
	}
	ms_vstate_free(s);
	/* a different tree for the same bytes is refused, nothing recorded */
	{
		struct ms_tree_rec bad = {{0}, 0, MS_TREE_LOG2, {0}};

		memcpy(bad.digest, fx.digest[3], MS_SHA256_LEN);
		bad.nbytes = tsizes[3];
		memcpy(bad.tree, fx.tree[3], MS_SHA256_LEN);
		bad.tree[0] ^= 1;
		T_ASSERT_EQ_INT(ms_inv_record_trees(inv, digest, &bad, 1, "load", NULL, &err),
				MS_ECHECK);
	}
	ms_inv_close(inv);
	tfixture_free(&fx);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_loads_and_checks),
	T_CASE(test_mismatch_names_tensor_and_clears),
	T_CASE(test_file_changed_after_open),
	T_CASE(test_truncated_file_is_io_error),
	T_CASE(test_memory_image),
	T_CASE(test_no_destination_is_bad_input),
	T_CASE(test_gpu_variant_without_gpu),
	T_CASE(test_tree_load_host),
	T_CASE(test_tree_host_buffer_tampered),
	T_CASE(test_tree_file_changed),
	T_CASE(test_tree_one_tensor_many_threads),
	T_CASE(test_want_tree_host),
	T_CASE(test_first_load_records_trees),
};

T_MAIN(cases)
