/*
 * t_tree_gpu.c: the GPU's chunk hashes of a tree digest
 * (kernels/sha256_tree.cu) against OpenSSL's SHA-256 of each chunk and
 * the CPU tree (hash.c) on seeded random bytes of odd lengths, aligned and
 * not; and msverify's device path (ms_verify_state_gpu) on an inventoried
 * state: clean, then with a flipped bit that the device check must find
 * and the CPU fallback must name.
 *
 * GPU tier (see t_nvfp4_gpu.c for the skip rule).
 */
#include <fcntl.h>

#include "test_gpu.h"
#include "verify.h"

static uint64_t rng = 0x7ee5eedc0ffee123ull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void fill(uint8_t *p, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		p[i] = (uint8_t)(next_rand() >> 24);
}

/* every chunk digest equals OpenSSL's; the folded tree equals the CPU's */
static int test_chunks_match_openssl(void)
{
	static const uint64_t sizes[] = {0, 1, 55, 56, 63, 64, 65, 119, 1000, 65535, 65536,
					 65537, 3 * 65536 + 77, (5u << 20) + 13};
	static const unsigned log2s[] = {16, 10, 12, 20};
	const uint64_t max = (5u << 20) + 13 + 16;
	uint8_t *h = ms_malloc(max), *d = NULL, *dch = NULL;
	struct ms_err err = {0};

	T_ASSERT(h);
	fill(h, max);
	T_ASSERT(ms_gpu_malloc((void **)&d, max, &err) == MS_OK);
	T_ASSERT(ms_gpu_memcpy(d, h, max, &err) == MS_OK);
	for (size_t li = 0; li < sizeof(log2s) / sizeof(log2s[0]); li++) {
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			for (int mis = 0; mis < 2; mis++) {
				uint64_t n = sizes[si], m = ms_tree_nchunks(n, log2s[li]);
				uint64_t off = mis ? 5 : 0; /* a start off the 16-byte grid */
				uint8_t *got = ms_malloc(m * 32 + 1), want[32], tg[32], tc[32];

				T_ASSERT(got);
				T_ASSERT(ms_gpu_malloc((void **)&dch, m * 32 + 1, &err) == MS_OK);
				T_ASSERT_MSG(ms_gpu_tree_chunks(d + off, n, log2s[li], dch, NULL, &err) ==
						     MS_OK, "%s", err.msg);
				T_ASSERT(ms_gpu_sync(&err) == MS_OK);
				T_ASSERT(ms_gpu_memcpy(got, dch, m * 32, &err) == MS_OK);
				for (uint64_t c = 0; c < m; c++) {
					uint64_t s = c << log2s[li];
					uint64_t len = n - s < (1ull << log2s[li]) ? n - s : 1ull << log2s[li];

					T_ASSERT(ms_sha256(h + off + s, len, want) == MS_OK);
					T_ASSERT_MSG(!memcmp(got + c * 32, want, 32),
						     "chunk %llu of %llu bytes, 2^%u, offset %llu",
						     (unsigned long long)c, (unsigned long long)n,
						     log2s[li], (unsigned long long)off);
				}
				T_ASSERT(ms_gpu_tree_digest(d + off, n, log2s[li], tg, &err) == MS_OK);
				T_ASSERT(ms_tree_digest(h + off, n, log2s[li], 3, tc, &err) == MS_OK);
				T_ASSERT(!memcmp(tg, tc, 32));
				ms_gpu_free(dch);
				dch = NULL;
				ms_free(got);
			}
		}
	}
	ms_gpu_free(d);
	ms_free(h);
	return 0;
}

/* the batched form: buffers of odd sizes (none, short, several chunks) at
 * odd places, each chunk digest equal to OpenSSL's */
static int test_batch_matches_openssl(void)
{
	static const uint64_t sizes[] = {0, 1, 65536, 70001, 3, 5 * 65536 + 9, 64};
	enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
	struct ms_gpu_tree_seg seg[NS];
	uint64_t at[NS], pos = 0, outat[NS], nout = 0;
	const uint64_t max = 1u << 20;
	uint8_t *h = ms_malloc(max), *d = NULL, *dout = NULL, *got;
	struct ms_err err = {0};

	T_ASSERT(h);
	fill(h, max);
	T_ASSERT(ms_gpu_malloc((void **)&d, max, &err) == MS_OK);
	T_ASSERT(ms_gpu_memcpy(d, h, max, &err) == MS_OK);
	for (int i = 0; i < NS; i++) {
		at[i] = pos + (uint64_t)(i % 3) * 7;
		pos = at[i] + sizes[i];
		outat[i] = nout;
		nout += ms_tree_nchunks(sizes[i], MS_TREE_LOG2);
	}
	T_ASSERT(pos <= max);
	T_ASSERT(ms_gpu_malloc((void **)&dout, nout * 32, &err) == MS_OK);
	for (int i = 0; i < NS; i++) {
		seg[i].data = d + at[i];
		seg[i].n = sizes[i];
		seg[i].out = dout + outat[i] * 32;
	}
	T_ASSERT_MSG(ms_gpu_tree_chunks_batch(seg, NS, MS_TREE_LOG2, &err) == MS_OK, "%s", err.msg);
	got = ms_malloc(nout * 32);
	T_ASSERT(got);
	T_ASSERT(ms_gpu_memcpy(got, dout, nout * 32, &err) == MS_OK);
	for (int i = 0; i < NS; i++) {
		for (uint64_t c = 0; c < ms_tree_nchunks(sizes[i], MS_TREE_LOG2); c++) {
			uint64_t s0 = c << MS_TREE_LOG2, len = sizes[i] - s0 < 65536 ? sizes[i] - s0 : 65536;
			uint8_t want[32];

			T_ASSERT(ms_sha256(h + at[i] + s0, len, want) == MS_OK);
			T_ASSERT_MSG(!memcmp(got + (outat[i] + c) * 32, want, 32), "buffer %d chunk %llu", i,
				     (unsigned long long)c);
		}
	}
	ms_free(got);
	ms_gpu_free(dout);
	ms_gpu_free(d);
	ms_free(h);
	return 0;
}

/* a large buffer: many blocks of threads, the shape of a real tensor */
static int test_large_tree(void)
{
	const uint64_t n = (256u << 20) + 4097;
	uint8_t *h = ms_malloc(n), *d = NULL, tg[32], tc[32];
	struct ms_err err = {0};

	T_ASSERT(h);
	fill(h, n);
	T_ASSERT(ms_gpu_malloc((void **)&d, n, &err) == MS_OK);
	T_ASSERT(ms_gpu_memcpy(d, h, n, &err) == MS_OK);
	T_ASSERT(ms_gpu_tree_digest(d, n, MS_TREE_LOG2, tg, &err) == MS_OK);
	T_ASSERT(ms_tree_digest(h, n, MS_TREE_LOG2, 0, tc, &err) == MS_OK);
	T_ASSERT(!memcmp(tg, tc, 32));
	/* one flipped bit anywhere changes it */
	h[n / 3] ^= 0x10;
	T_ASSERT(ms_gpu_memcpy(d + n / 3, h + n / 3, 1, &err) == MS_OK);
	T_ASSERT(ms_gpu_tree_digest(d, n, MS_TREE_LOG2, tg, &err) == MS_OK);
	T_ASSERT(memcmp(tg, tc, 32));
	ms_gpu_free(d);
	ms_free(h);
	return 0;
}

/* msverify's device path: an inventoried state (trees recorded at add) is
 * checked on the GPU; a flipped bit is found and named */
static int test_verify_state_on_device(void)
{
	char db[512], path[512], digest[MS_STATE_DIGEST_LEN];
	const char *paths[1] = {path};
	struct ms_inv *inv = NULL;
	struct ms_st_writer *w = NULL;
	struct ms_vstate *s = NULL;
	struct ms_vreport r;
	struct ms_err err = {0};
	uint64_t shp[3] = {(3u << 20) + 5, 70000, 12}, off;
	uint8_t *buf = ms_malloc(shp[0]);
	uint8_t b;
	int fd;

	T_ASSERT(buf);
	snprintf(db, sizeof(db), "%s/dev.db", T_TMP);
	snprintf(path, sizeof(path), "%s/dev.safetensors", T_TMP);
	T_ASSERT(ms_st_writer_new(path, 1, &w, &err) == MS_OK);
	for (int i = 0; i < 3; i++) {
		char name[32];

		fill(buf, shp[i]);
		snprintf(name, sizeof(name), "model.w%d", i);
		T_ASSERT(ms_st_writer_add(w, name, MS_DTYPE_U8, 1, &shp[i], buf, &err) == MS_OK);
	}
	T_ASSERT_MSG(ms_st_writer_commit(w, &err) == MS_OK, "%s", err.msg);
	ms_st_writer_free(w);
	T_ASSERT_MSG(ms_inv_open(db, MS_INV_CREATE, &inv, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_MSG(ms_inv_add_paths(inv, paths, 1, NULL, digest, &err) == MS_OK, "%s", err.msg);
	T_ASSERT(ms_vstate_from_inv(inv, digest, 0, &s, &err) == MS_OK);
	for (size_t t = 0; t < s->files[0].ntensors; t++)
		T_ASSERT(s->files[0].tensors[t].has_tree);
	T_ASSERT_MSG(ms_verify_state_gpu(s, 4, &r, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(r.device_bytes, shp[0] + shp[1] + shp[2]);
	ms_vreport_release(&r);
	/* flip one bit in the middle of model.w1 */
	off = 0;
	for (size_t t = 0; t < s->files[0].ntensors; t++)
		if (!strcmp(s->files[0].tensors[t].name, "model.w1"))
			off = s->files[0].tensors[t].offset + 40000;
	T_ASSERT(off);
	fd = open(path, O_RDWR);
	T_ASSERT(fd >= 0 && pread(fd, &b, 1, (off_t)off) == 1);
	b ^= 4;
	T_ASSERT(pwrite(fd, &b, 1, (off_t)off) == 1);
	close(fd);
	T_ASSERT_EQ_INT(ms_verify_state_gpu(s, 4, &r, &err), MS_ECHECK);
	T_ASSERT(r.nproblems == 1 && r.problems[0].kind == MS_VPROBLEM_TENSOR_DIGEST);
	T_ASSERT_STR(r.problems[0].tensor, "model.w1");
	ms_vreport_release(&r);
	ms_vstate_free(s);
	ms_inv_close(inv);
	ms_free(buf);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_chunks_match_openssl),
	T_CASE(test_batch_matches_openssl),
	T_CASE(test_large_tree),
	T_CASE(test_verify_state_on_device),
};

T_GPU_MAIN(cases)

