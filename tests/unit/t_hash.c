/*
 * t_hash.c: SHA-256 against the FIPS 180-2 test vectors and sha256sum,
 * streaming against one-shot, the parallel pool against serial hashing,
 * and the per-file digests (header, tensors, whole file) against
 * digests of the byte ranges computed here.
 */

#include "test.h"

static int hex_is(const uint8_t d[MS_SHA256_LEN], const char *want)
{
	char hex[65];

	ms_hex(d, MS_SHA256_LEN, hex);
	if (strcmp(hex, want)) {
		fprintf(stderr, "digest %s, want %s\n", hex, want);
		return 0;
	}
	return 1;
}

/* xorshift: deterministic, never all zeros */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void fill(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(rnd() >> 32);
}

static int test_fips_vectors(void)
{
	uint8_t d[MS_SHA256_LEN];
	static const char msg448[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";

	T_ASSERT_EQ_INT(ms_sha256("", 0, d), MS_OK);
	T_ASSERT(hex_is(d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
	T_ASSERT_EQ_INT(ms_sha256("abc", 3, d), MS_OK);
	T_ASSERT(hex_is(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
	T_ASSERT_EQ_INT(ms_sha256(msg448, strlen(msg448), d), MS_OK);
	T_ASSERT(hex_is(d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
	return 0;
}

/* One million 'a', streamed in odd-sized pieces. */
static int test_million_a_streamed(void)
{
	struct ms_sha256_ctx *c = ms_sha256_new();
	uint8_t d[MS_SHA256_LEN];
	char chunk[997];
	size_t left = 1000000;

	T_ASSERT(c);
	memset(chunk, 'a', sizeof(chunk));
	while (left) {
		size_t k = left < sizeof(chunk) ? left : sizeof(chunk);

		T_ASSERT_EQ_INT(ms_sha256_update(c, chunk, k), MS_OK);
		left -= k;
	}
	T_ASSERT_EQ_INT(ms_sha256_final(c, d), MS_OK);
	ms_sha256_free(c);
	ms_sha256_free(NULL);
	T_ASSERT(hex_is(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
	return 0;
}

static int test_stream_equals_oneshot(void)
{
	size_t n = 300000;
	uint8_t *buf = malloc(n), a[MS_SHA256_LEN], b[MS_SHA256_LEN];

	T_ASSERT(buf);
	fill(buf, n);
	for (int round = 0; round < 8; round++) {
		struct ms_sha256_ctx *c = ms_sha256_new();
		size_t pos = 0;

		T_ASSERT(c);
		while (pos < n) {
			size_t k = (size_t)(rnd() % 70000);

			if (k > n - pos)
				k = n - pos;
			T_ASSERT_EQ_INT(ms_sha256_update(c, buf + pos, k), MS_OK);
			pos += k;
		}
		T_ASSERT_EQ_INT(ms_sha256_final(c, a), MS_OK);
		ms_sha256_free(c);
		T_ASSERT_EQ_INT(ms_sha256(buf, n, b), MS_OK);
		T_ASSERT(!memcmp(a, b, MS_SHA256_LEN));
	}
	free(buf);
	return 0;
}

/* Digests that sha256sum printed for two bundled fixtures. */
static int test_file_sha256_fixtures(void)
{
	static const struct {
		const char *rel, *hex;
	} want[] = {
		{"dtypes/one_f32.safetensors",
		 "6b30d075d7d2b601f63ab9794f629c77c24542b39c951e5159f59a44bc1c37fd"},
		{"hf/qwen3moe/model.safetensors",
		 "b7a4a9b0aae6f42f636748b33de45a17f6b4eb3d8a37d68ac014a91d1bafbb2b"},
	};
	uint8_t d[MS_SHA256_LEN];
	struct ms_err err = {0};

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		char *path = ms_path_join(T_FIXTURES, want[i].rel);

		T_ASSERT(path);
		T_ASSERT_EQ_INT(ms_sha256_file(path, d, &err), MS_OK);
		T_ASSERT(hex_is(d, want[i].hex));
		ms_free(path);
	}
	return 0;
}

static int test_file_sha256_errors(void)
{
	uint8_t d[MS_SHA256_LEN];
	struct ms_err err = {0};
	char *path = ms_path_join(T_TMP, "does-not-exist");

	T_ASSERT_EQ_INT(ms_sha256_file(path, d, &err), MS_ENOTFOUND);
	T_ASSERT(strstr(err.msg, "does-not-exist"));
	ms_free(path);
	/* an empty file hashes to the empty digest */
	path = ms_path_join(T_TMP, "empty");
	T_ASSERT_EQ_INT(ms_file_write_atomic(path, "", 0, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_sha256_file(path, d, &err), MS_OK);
	T_ASSERT(hex_is(d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
	ms_free(path);
	return 0;
}

/* A file larger than the 1 MiB read buffer, hashed in pieces, against the
 * one-shot digest of the same bytes. */
static int test_file_sha256_large(void)
{
	size_t n = (3u << 20) + 12345;
	uint8_t *buf = malloc(n), a[MS_SHA256_LEN], b[MS_SHA256_LEN];
	struct ms_err err = {0};
	char *path = ms_path_join(T_TMP, "large.bin");

	T_ASSERT(buf && path);
	fill(buf, n);
	T_ASSERT_EQ_INT(ms_file_write_atomic(path, buf, n, 0, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_sha256_file(path, a, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_sha256(buf, n, b), MS_OK);
	T_ASSERT(!memcmp(a, b, MS_SHA256_LEN));
	free(buf);
	ms_free(path);
	return 0;
}

/* The pool: any thread count, empty jobs, jobs of mixed sizes; each digest
 * equals the serial one. */
static int test_pool_matches_serial(void)
{
	enum { NJOBS = 57 };
	struct ms_hash_job jobs[NJOBS] = {{0}};
	uint8_t digests[NJOBS][MS_SHA256_LEN], want[NJOBS][MS_SHA256_LEN];
	size_t total = 4u << 20, pos = 0;
	uint8_t *buf = malloc(total);
	static const int threads[] = {0, 1, 2, 3, 8, 100};
	struct ms_err err = {0};

	T_ASSERT(buf);
	fill(buf, total);
	for (int i = 0; i < NJOBS; i++) {
		uint64_t n = i % 7 == 0 ? 0 : rnd() % (total / NJOBS * 2);

		if (pos + n > total)
			n = total - pos;
		jobs[i].data = buf + pos;
		jobs[i].n = n;
		jobs[i].digest = digests[i];
		T_ASSERT_EQ_INT(ms_sha256(buf + pos, (size_t)n, want[i]), MS_OK);
		pos += n;
	}
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
		memset(digests, 0, sizeof(digests));
		T_ASSERT_EQ_INT(ms_hash_run(jobs, NJOBS, threads[t], &err), MS_OK);
		for (int i = 0; i < NJOBS; i++)
			T_ASSERT_MSG(!memcmp(digests[i], want[i], MS_SHA256_LEN), "job %d, %d threads",
				     i, threads[t]);
	}
	/* no jobs at all is fine */
	T_ASSERT_EQ_INT(ms_hash_run(jobs, 0, 4, &err), MS_OK);
	free(buf);
	return 0;
}

/* Header, tensor and whole-file digests of an opened file against digests
 * of the byte ranges read here with plain I/O; header and tensors together
 * cover every byte. */
static int test_st_hash_files_ranges(void)
{
	static const char *const rel[] = {
		"dtypes/all.safetensors", "hf/qwen3moe/model.safetensors",
		"hf/mixtral-sharded/model-00001-of-00002.safetensors",
		"dtypes/one_empty.safetensors",
	};
	struct ms_st_file *files[4];
	struct ms_err err = {0};

	for (int i = 0; i < 4; i++) {
		char *path = ms_path_join(T_FIXTURES, rel[i]);

		T_ASSERT(path);
		T_ASSERT_MSG(ms_st_open(path, &files[i], &err) == MS_OK, "%s", err.msg);
		ms_free(path);
	}
	T_ASSERT_EQ_INT(ms_st_hash_files(files, 4, 2, 1, &err), MS_OK);
	for (int i = 0; i < 4; i++) {
		struct ms_st_file *f = files[i];
		uint8_t *bytes, d[MS_SHA256_LEN];
		uint64_t covered = 8 + f->header_len, n;
		FILE *fp = fopen(f->path, "rb");

		T_ASSERT(fp);
		bytes = malloc(f->size + 1);
		T_ASSERT(bytes);
		T_ASSERT_EQ_INT(fread(bytes, 1, f->size, fp), f->size);
		fclose(fp);
		/* the length field, read here independently */
		n = 0;
		for (int k = 7; k >= 0; k--)
			n = n << 8 | bytes[k];
		T_ASSERT_EQ_INT(n, f->header_len);
		T_ASSERT(f->has_header_digest && f->has_file_digest);
		T_ASSERT_EQ_INT(ms_sha256(bytes, (size_t)(8 + n), d), MS_OK);
		T_ASSERT(!memcmp(d, f->header_digest, MS_SHA256_LEN));
		T_ASSERT_EQ_INT(ms_sha256(bytes, (size_t)f->size, d), MS_OK);
		T_ASSERT(!memcmp(d, f->file_digest, MS_SHA256_LEN));
		for (size_t t = 0; t < f->ntensors; t++) {
			const struct ms_tensor *x = &f->tensors[t];

			T_ASSERT(x->has_digest);
			T_ASSERT_EQ_INT(ms_sha256(bytes + x->offset, (size_t)x->nbytes, d), MS_OK);
			T_ASSERT_MSG(!memcmp(d, x->digest, MS_SHA256_LEN), "%s in %s", x->name, f->path);
			covered += x->nbytes;
		}
		T_ASSERT_EQ_INT(covered, f->size);
		free(bytes);
	}
	for (int i = 0; i < 4; i++)
		ms_st_close(files[i]);
	return 0;
}

/* Without file digests the whole-file digest is not claimed. */
static int test_st_hash_without_file_digest(void)
{
	struct ms_st_file *f;
	struct ms_err err = {0};
	char *path = ms_path_join(T_FIXTURES, "dtypes/one_bf16.safetensors");

	T_ASSERT_EQ_INT(ms_st_open(path, &f, &err), MS_OK);
	T_ASSERT_EQ_INT(ms_st_hash_files(&f, 1, 1, 0, &err), MS_OK);
	T_ASSERT(f->has_header_digest);
	T_ASSERT(!f->has_file_digest);
	ms_st_close(f);
	ms_free(path);
	return 0;
}


/* The tree digest as ms(5) defines it, assembled here byte by byte from
 * one-shot SHA-256: the tag, the chunk size exponent, the length (little
 * endian) and each chunk's digest, the last chunk short. */
static int tree_by_hand(const uint8_t *p, uint64_t n, unsigned log2, uint8_t out[32])
{
	uint64_t m = n ? (n - 1) / (1ull << log2) + 1 : 0;
	uint8_t *msg = malloc(23 + m * 32);

	T_ASSERT(msg);
	memcpy(msg, "msinv-tree-v1\n", 14);
	msg[14] = (uint8_t)log2;
	for (int i = 0; i < 8; i++)
		msg[15 + i] = (uint8_t)(n >> (8 * i));
	for (uint64_t c = 0; c < m; c++) {
		uint64_t s = c << log2, len = n - s < (1ull << log2) ? n - s : 1ull << log2;

		T_ASSERT(ms_sha256(p + s, len, msg + 23 + c * 32) == MS_OK);
	}
	T_ASSERT(ms_sha256(msg, 23 + m * 32, out) == MS_OK);
	free(msg);
	return 0;
}

/* Known answers (computed with Python's hashlib), then the parallel tree
 * and the same-pass job against the definition on random sizes around the
 * chunk and span boundaries, for several thread counts. */
static int test_tree_digest(void)
{
	static const char *const kat[3] = {
		"7dfcaad7cb5f39aac86c6086efbb8a5614a700022c883a8646c4954a72de4881",
		"9eae809f1a3e0e3d5f7cf0d571385749db75fce44035db59c1c7bc73920c1b83",
		"a2993347e8d3b3a9a7d5acc198f3352d5d484b2f0b3a6f5bf589e901b316ac04",
	};
	static const uint64_t sizes[] = {0, 1, 65535, 65536, 65537, 4u << 20, (4u << 20) + 1,
					 (9u << 20) + 12345};
	static const int threads[] = {1, 2, 7, 0};
	const uint64_t max = (9u << 20) + 12345;
	uint8_t *buf = malloc(max), d[32], want[32], plain[32], tree[32];
	char hex[65];
	struct ms_err err = {0};

	T_ASSERT(buf);
	for (uint64_t i = 0; i < 200000; i++)
		buf[i] = (uint8_t)(i % 251);
	T_ASSERT(ms_tree_digest(buf, 0, 16, 1, d, &err) == MS_OK);
	ms_hex(d, 32, hex);
	T_ASSERT_STR(hex, kat[0]);
	T_ASSERT(ms_tree_digest(buf, 200000, 16, 3, d, &err) == MS_OK);
	ms_hex(d, 32, hex);
	T_ASSERT_STR(hex, kat[1]);
	T_ASSERT(ms_tree_digest(buf, 200000, 10, 3, d, &err) == MS_OK);
	ms_hex(d, 32, hex);
	T_ASSERT_STR(hex, kat[2]);
	fill(buf, max);
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		struct ms_hash_job job = {0};

		T_ASSERT(tree_by_hand(buf, sizes[si], MS_TREE_LOG2, want) == 0);
		for (size_t ti = 0; ti < sizeof(threads) / sizeof(threads[0]); ti++) {
			T_ASSERT(ms_tree_digest(buf, sizes[si], MS_TREE_LOG2, threads[ti], d, &err) ==
				 MS_OK);
			T_ASSERT_MSG(!memcmp(d, want, 32), "%llu bytes, %d threads",
				     (unsigned long long)sizes[si], threads[ti]);
		}
		/* the same pass: plain and tree of the same bytes */
		job.data = buf;
		job.n = sizes[si];
		job.digest = plain;
		job.tree = tree;
		T_ASSERT(ms_hash_run(&job, 1, 1, &err) == MS_OK);
		T_ASSERT(!memcmp(tree, want, 32));
		T_ASSERT(ms_sha256(buf, sizes[si], d) == MS_OK);
		T_ASSERT(!memcmp(plain, d, 32));
	}
	/* another chunk size, and the range */
	T_ASSERT(tree_by_hand(buf, max, 12, want) == 0);
	T_ASSERT(ms_tree_digest(buf, max, 12, 4, d, &err) == MS_OK);
	T_ASSERT(!memcmp(d, want, 32));
	T_ASSERT_EQ_INT(ms_tree_digest(buf, 10, 9, 1, d, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_tree_digest(buf, 10, 31, 1, d, &err), MS_EINVAL);
	free(buf);
	return 0;
}

/* ms_st_hash_files_trees: every tensor gets a tree equal to the
 * definition's, beside its plain digest */
static int test_st_hash_files_trees(void)
{
	char *path = ms_path_join(T_FIXTURES, "hf/qwen3moe/model.safetensors");
	struct ms_st_file *f = NULL;
	struct ms_err err = {0};

	T_ASSERT(path);
	T_ASSERT_MSG(ms_st_open(path, &f, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(ms_st_hash_files_trees(&f, 1, 3, 0, 1, &err), MS_OK);
	for (size_t t = 0; t < f->ntensors; t++) {
		uint8_t want[32];

		T_ASSERT(f->tensors[t].has_tree && f->tensors[t].has_digest);
		T_ASSERT(tree_by_hand(f->tensors[t].data, f->tensors[t].nbytes, MS_TREE_LOG2,
				      want) == 0);
		T_ASSERT(!memcmp(want, f->tensors[t].tree, 32));
	}
	ms_st_close(f);
	ms_free(path);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_fips_vectors),
	T_CASE(test_million_a_streamed),
	T_CASE(test_stream_equals_oneshot),
	T_CASE(test_file_sha256_fixtures),
	T_CASE(test_file_sha256_errors),
	T_CASE(test_file_sha256_large),
	T_CASE(test_pool_matches_serial),
	T_CASE(test_st_hash_files_ranges),
	T_CASE(test_st_hash_without_file_digest),
	T_CASE(test_tree_digest),
	T_CASE(test_st_hash_files_trees),
};

T_MAIN(cases)
