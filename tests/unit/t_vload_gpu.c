/*
 * t_vload_gpu.c: verified load into GPU memory (ms_load_verified_gpu).
 * The bytes that arrive on the device are copied back and compared with
 * the bytes the test wrote; expected digests are one-shot SHA-256 of those
 * bytes. A mismatch must leave no device memory and no pointers behind.
 *
 * GPU tier (see t_nvfp4_gpu.c for the skip rule).
 */
#include <fcntl.h>

#include "test_gpu.h"
#include "hash.h"
#include "vload.h"

static uint64_t rng = 0x0ddba11cafef00dull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

#define NT 24

struct fixture {
	char path[512];
	uint64_t size[NT];
	uint8_t *src[NT];
	uint8_t digest[NT][MS_SHA256_LEN];
	struct ms_st_file *f;
	struct ms_vload_item it[NT];
};

static void fixture_free(struct fixture *fx)
{
	for (int i = 0; i < NT; i++)
		ms_free(fx->src[i]);
	ms_st_close(fx->f);
}

/* tensors from empty to several 4 MiB staging chunks, odd sizes */
static int fixture_make(struct fixture *fx, const char *name)
{
	struct ms_st_writer *w = NULL;
	struct ms_err err = {0};

	memset(fx, 0, sizeof(*fx));
	snprintf(fx->path, sizeof(fx->path), "%s/%s", T_TMP, name);
	T_ASSERT(ms_st_writer_new(fx->path, 1, &w, &err) == MS_OK);
	for (int i = 0; i < NT; i++) {
		char tn[16];

		fx->size[i] = i == 0 ? 0 : i == 1 ? (9u << 20) + 3 : next_rand() % (3u << 20);
		fx->src[i] = ms_malloc(fx->size[i] + 1);
		T_ASSERT(fx->src[i]);
		for (uint64_t k = 0; k < fx->size[i]; k++)
			fx->src[i][k] = (uint8_t)(next_rand() >> 32);
		T_ASSERT(ms_sha256(fx->src[i], fx->size[i], fx->digest[i]) == MS_OK);
		snprintf(tn, sizeof(tn), "w%02d", i);
		T_ASSERT(ms_st_writer_add(w, tn, MS_DTYPE_U8, 1, &fx->size[i], fx->src[i], &err) ==
			 MS_OK);
	}
	T_ASSERT_MSG(ms_st_writer_commit(w, &err) == MS_OK, "%s", err.msg);
	ms_st_writer_free(w);
	T_ASSERT_MSG(ms_st_open(fx->path, &fx->f, &err) == MS_OK, "%s", err.msg);
	for (int i = 0; i < NT; i++) {
		char tn[16];

		snprintf(tn, sizeof(tn), "w%02d", i);
		fx->it[i].tensor = ms_st_find(fx->f, tn);
		T_ASSERT(fx->it[i].tensor);
		memcpy(fx->it[i].expected, fx->digest[i], MS_SHA256_LEN);
	}
	return 0;
}

static int test_loads_to_device(void)
{
	struct fixture fx;
	struct ms_err err = {0};

	T_ASSERT(fixture_make(&fx, "gpu.safetensors") == 0);
	for (int threads = 1; threads <= 5; threads += 4) {
		void *arena = NULL;

		T_ASSERT_MSG(ms_load_verified_gpu(fx.it, NT, threads, &arena, &err) == MS_OK, "%s",
			     err.msg);
		T_ASSERT(arena);
		for (int i = 0; i < NT; i++) {
			uint8_t *back = ms_malloc(fx.size[i] + 1);

			T_ASSERT(back && fx.it[i].dst);
			T_ASSERT(ms_gpu_is_device_ptr(fx.it[i].dst));
			T_ASSERT(((uintptr_t)fx.it[i].dst & 255) == 0);
			T_ASSERT(ms_gpu_memcpy(back, fx.it[i].dst, fx.size[i], &err) == MS_OK);
			T_ASSERT_MSG(!memcmp(back, fx.src[i], fx.size[i]), "w%02d differs", i);
			ms_free(back);
		}
		ms_gpu_free(arena);
	}
	fixture_free(&fx);
	return 0;
}

static int test_mismatch_frees_everything(void)
{
	struct fixture fx;
	struct ms_err err = {0};
	void *arena = (void *)1;

	T_ASSERT(fixture_make(&fx, "gpubad.safetensors") == 0);
	fx.it[1].expected[7] ^= 2;
	T_ASSERT_EQ_INT(ms_load_verified_gpu(fx.it, NT, 4, &arena, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, "tensor 'w01'") && strstr(err.msg, "digest mismatch"), "%s",
		     err.msg);
	T_ASSERT(arena == NULL);
	for (int i = 0; i < NT; i++)
		T_ASSERT(fx.it[i].dst == NULL);
	fixture_free(&fx);
	return 0;
}

/* the file changes on disk after it was opened: caught on the device path */
static int test_changed_file(void)
{
	struct fixture fx;
	struct ms_err err = {0};
	void *arena = (void *)1;
	uint8_t b = 0;
	int fd;

	T_ASSERT(fixture_make(&fx, "gpuchanged.safetensors") == 0);
	fd = open(fx.path, O_RDWR);
	T_ASSERT(fd >= 0);
	T_ASSERT(pread(fd, &b, 1, (off_t)(fx.it[1].tensor->offset + (9u << 20))) == 1);
	b ^= 1;
	T_ASSERT(pwrite(fd, &b, 1, (off_t)(fx.it[1].tensor->offset + (9u << 20))) == 1);
	close(fd);
	T_ASSERT_EQ_INT(ms_load_verified_gpu(fx.it, NT, 3, &arena, &err), MS_ECHECK);
	T_ASSERT(strstr(err.msg, "tensor 'w01'"));
	T_ASSERT(arena == NULL);
	fixture_free(&fx);
	return 0;
}


/* ---- tree digests: the bytes checked are the bytes in device memory ------ */

#define TN 6
static const uint64_t tsizes[TN] = {(37u << 20) + 5, 0, 1, 65536, 65537, (3u << 20) + 17};

struct tfixture {
	char path[512];
	uint8_t *src[TN];
	uint8_t tree[TN][MS_SHA256_LEN], digest[TN][MS_SHA256_LEN];
	struct ms_st_file *f;
	struct ms_vload_item it[TN];
};

static void tfixture_free(struct tfixture *fx)
{
	for (int i = 0; i < TN; i++)
		ms_free(fx->src[i]);
	ms_st_close(fx->f);
}

/* use_tree items with the CPU's trees (hash.c) of the bytes written */
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
		memset(fx->it[i].expected, 0xee, MS_SHA256_LEN); /* unused with use_tree */
		memcpy(fx->it[i].expected_tree, fx->tree[i], MS_SHA256_LEN);
		fx->it[i].use_tree = 1;
	}
	return 0;
}

static int back_equal(struct tfixture *fx)
{
	struct ms_err err = {0};

	for (int i = 0; i < TN; i++) {
		uint8_t *back = ms_malloc(tsizes[i] + 1);

		T_ASSERT(back && fx->it[i].dst && ms_gpu_is_device_ptr(fx->it[i].dst));
		T_ASSERT(ms_gpu_memcpy(back, fx->it[i].dst, tsizes[i], &err) == MS_OK);
		T_ASSERT_MSG(!memcmp(back, fx->src[i], tsizes[i]), "t%d differs", i);
		ms_free(back);
	}
	return 0;
}

static int hook_item = -1, hook_fired;
static enum ms_vload_hook_where hook_where;

/* flips one bit of item hook_item's bytes, once: in host memory with a
 * plain store, in device memory through a copy */
static void tamper(enum ms_vload_hook_where where, void *p, uint64_t len, size_t item)
{
	struct ms_err err = {0};
	uint8_t b;

	if (hook_fired || where != hook_where || (int)item != hook_item || !len)
		return;
	if (where == MS_VLOAD_HOOK_STAGED) {
		((uint8_t *)p)[len / 2] ^= 0x20;
	} else {
		if (ms_gpu_memcpy(&b, (uint8_t *)p + len / 2, 1, &err) != MS_OK)
			return;
		b ^= 0x20;
		if (ms_gpu_memcpy((uint8_t *)p + len / 2, &b, 1, &err) != MS_OK)
			return;
	}
	hook_fired = 1;
}

static int tampered_load(struct tfixture *fx, enum ms_vload_hook_where where, int item,
			 struct ms_err *err)
{
	void *arena = (void *)1;
	int rc;

	hook_item = item;
	hook_where = where;
	hook_fired = 0;
	ms_vload_test_hook = tamper;
	rc = ms_load_verified_gpu(fx->it, TN, 4, &arena, err);
	ms_vload_test_hook = NULL;
	T_ASSERT(hook_fired);
	T_ASSERT_EQ_INT(rc, MS_ECHECK);
	T_ASSERT(arena == NULL);
	for (int i = 0; i < TN; i++)
		T_ASSERT(fx->it[i].dst == NULL && !fx->it[i].has_got_tree);
	return 0;
}

static int test_tree_load_to_device(void)
{
	struct tfixture fx;
	struct ms_err err = {0};

	T_ASSERT(tfixture_make(&fx, "gputree.safetensors") == 0);
	for (int threads = 1; threads <= 9; threads += 8) {
		void *arena = NULL;

		T_ASSERT_MSG(ms_load_verified_gpu(fx.it, TN, threads, &arena, &err) == MS_OK, "%s",
			     err.msg);
		T_ASSERT(back_equal(&fx) == 0);
		ms_gpu_free(arena);
	}
	tfixture_free(&fx);
	return 0;
}

static int test_tree_wrong_expected(void)
{
	struct tfixture fx;
	struct ms_err err = {0};
	void *arena = (void *)1;

	T_ASSERT(tfixture_make(&fx, "gputreebad.safetensors") == 0);
	fx.it[4].expected_tree[31] ^= 1;
	T_ASSERT_EQ_INT(ms_load_verified_gpu(fx.it, TN, 4, &arena, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't4'") && strstr(err.msg, "mismatch"), "%s", err.msg);
	T_ASSERT(arena == NULL);
	tfixture_free(&fx);
	return 0;
}

/* a bit flipped in HBM after the copy, before the kernel: only a check of
 * the device bytes can see it */
static int test_tree_device_copy_tampered(void)
{
	struct tfixture fx;
	struct ms_err err = {0};

	T_ASSERT(tfixture_make(&fx, "gputreedev.safetensors") == 0);
	T_ASSERT(tampered_load(&fx, MS_VLOAD_HOOK_DEVICE, 0, &err) == 0);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't0'"), "%s", err.msg);
	T_ASSERT(tampered_load(&fx, MS_VLOAD_HOOK_DEVICE, 5, &err) == 0);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't5'"), "%s", err.msg);
	tfixture_free(&fx);
	return 0;
}

/* the pinned staging buffer changed after the read */
static int test_tree_host_buffer_tampered(void)
{
	struct tfixture fx;
	struct ms_err err = {0};

	T_ASSERT(tfixture_make(&fx, "gputreehost.safetensors") == 0);
	T_ASSERT(tampered_load(&fx, MS_VLOAD_HOOK_STAGED, 0, &err) == 0);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't0'"), "%s", err.msg);
	tfixture_free(&fx);
	return 0;
}

static int test_tree_file_changed(void)
{
	struct tfixture fx;
	struct ms_err err = {0};
	void *arena = (void *)1;
	off_t at;
	uint8_t b;
	int fd;

	T_ASSERT(tfixture_make(&fx, "gputreechg.safetensors") == 0);
	at = (off_t)(fx.it[0].tensor->offset + (20u << 20) + 3);
	fd = open(fx.path, O_RDWR);
	T_ASSERT(fd >= 0 && pread(fd, &b, 1, at) == 1);
	b ^= 1;
	T_ASSERT(pwrite(fd, &b, 1, at) == 1);
	close(fd);
	T_ASSERT_EQ_INT(ms_load_verified_gpu(fx.it, TN, 4, &arena, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't0'"), "%s", err.msg);
	T_ASSERT(arena == NULL);
	tfixture_free(&fx);
	return 0;
}

/* The first load (no tree recorded): the plain digest on the CPU, and the
 * tree the GPU took of the device copy, which must equal the CPU's tree of
 * the bytes sent; that tree is handed out. A copy corrupted on the way
 * passes the plain digest (the CPU hashed good bytes) but not this. */
static int test_first_load_gives_device_tree(void)
{
	struct tfixture fx;
	struct ms_err err = {0};
	void *arena = NULL;

	T_ASSERT(tfixture_make(&fx, "gpuwant.safetensors") == 0);
	for (int i = 0; i < TN; i++) {
		fx.it[i].use_tree = 0;
		fx.it[i].want_tree = 1;
		memcpy(fx.it[i].expected, fx.digest[i], MS_SHA256_LEN);
	}
	T_ASSERT_MSG(ms_load_verified_gpu(fx.it, TN, 4, &arena, &err) == MS_OK, "%s", err.msg);
	T_ASSERT(back_equal(&fx) == 0);
	for (int i = 0; i < TN; i++) {
		T_ASSERT(fx.it[i].has_got_tree);
		T_ASSERT(!memcmp(fx.it[i].got_tree, fx.tree[i], MS_SHA256_LEN));
	}
	ms_gpu_free(arena);
	T_ASSERT(tampered_load(&fx, MS_VLOAD_HOOK_DEVICE, 3, &err) == 0);
	T_ASSERT_MSG(strstr(err.msg, "tensor 't3'") && strstr(err.msg, "device copy"), "%s",
		     err.msg);
	tfixture_free(&fx);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_loads_to_device),
	T_CASE(test_mismatch_frees_everything),
	T_CASE(test_changed_file),
	T_CASE(test_tree_load_to_device),
	T_CASE(test_tree_wrong_expected),
	T_CASE(test_tree_device_copy_tampered),
	T_CASE(test_tree_host_buffer_tampered),
	T_CASE(test_tree_file_changed),
	T_CASE(test_first_load_gives_device_tree),
};

T_GPU_MAIN(cases)

