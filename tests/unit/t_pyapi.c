/*
 * t_pyapi.c: the flat entry points for bindings (pyapi.h). Here, and not
 * only through the Python suite, so that the sanitizer build (whose
 * library cannot be loaded into an interpreter) checks them too: load
 * sets from a file with a digest map and from the inventory, the matching
 * of a record against the files, the host arena and the DLPack deleter's
 * reference counting, the state digest of described tensors, and the
 * inventory's JSON. Expected digests are computed here with one-shot
 * SHA-256 of the bytes the test wrote.
 */
#include <cjson/cJSON.h>

#include "test.h"
#include "gpu.h"
#include "pyapi.h"

#define NT 3

static const char *names[NT] = {"b.weight", "a.weight", "c.bias"};
static const uint64_t sizes[NT] = {1048576 * 2 + 5, 64, 0};

struct fixture {
	char path[512];
	uint8_t *src[NT];
	uint8_t digests[NT * MS_SHA256_LEN];
};

static void fixture_free(struct fixture *fx)
{
	for (int i = 0; i < NT; i++)
		ms_free(fx->src[i]);
}

static int fixture_make(struct fixture *fx, const char *name)
{
	struct ms_st_writer *w = NULL;
	struct ms_err err = {0};
	uint32_t x = 12345;

	memset(fx, 0, sizeof(*fx));
	snprintf(fx->path, sizeof(fx->path), "%s/%s", T_TMP, name);
	T_ASSERT(ms_st_writer_new(fx->path, 1, &w, &err) == MS_OK);
	for (int i = 0; i < NT; i++) {
		T_ASSERT((fx->src[i] = ms_malloc(sizes[i] ? sizes[i] : 1)));
		for (uint64_t k = 0; k < sizes[i]; k++) {
			x = x * 1103515245u + 12345u;
			fx->src[i][k] = (uint8_t)(x >> 16);
		}
		T_ASSERT(ms_sha256(fx->src[i], sizes[i], fx->digests + 32 * i) == MS_OK);
		T_ASSERT(ms_st_writer_add(w, names[i], MS_DTYPE_U8, 1, &sizes[i], fx->src[i],
					  &err) == MS_OK);
	}
	T_ASSERT_MSG(ms_st_writer_commit(w, &err) == MS_OK, "%s", err.msg);
	ms_st_writer_free(w);
	return 0;
}

/* the state digest of the file as the library computes it for any state */
static int file_state(const char *path, char out[MS_STATE_DIGEST_LEN])
{
	struct ms_ckpt *c = NULL;
	struct ms_err err = {0};

	T_ASSERT_MSG(ms_ckpt_open(path, &c, &err) == MS_OK, "%s", err.msg);
	T_ASSERT(ms_ckpt_hash(c, 1, 0, &err) == MS_OK);
	T_ASSERT(ms_state_digest(c->tensors, c->ntensors, out, &err) == MS_OK);
	ms_ckpt_close(c);
	return 0;
}

static int test_from_file_and_load(void)
{
	struct fixture fx;
	struct ms_py_set *s = NULL;
	struct ms_err err = {0};
	char want[MS_STATE_DIGEST_LEN];
	void *dst[NT];
	const char *name;
	uint64_t nbytes;

	T_ASSERT(fixture_make(&fx, "f.safetensors") == 0);
	T_ASSERT_MSG(ms_py_set_from_file(fx.path, NT, names, fx.digests, &s, &err) == MS_OK,
		     "%s", err.msg);
	T_ASSERT_EQ_INT(ms_py_set_count(s), NT);
	T_ASSERT(file_state(fx.path, want) == 0);
	T_ASSERT_STR(ms_py_set_state(s), want);
	/* sorted by name: a.weight, b.weight, c.bias */
	T_ASSERT(ms_py_set_tensor(s, 0, &name, NULL, NULL, NULL, &nbytes, NULL) == MS_OK);
	T_ASSERT_STR(name, "a.weight");
	T_ASSERT_EQ_INT(nbytes, 64);
	T_ASSERT_EQ_INT(ms_py_set_tensor(s, NT, NULL, NULL, NULL, NULL, NULL, NULL), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_py_set_nfiles(s), 1);
	static const int order[NT] = {1, 0, 2};
	for (int i = 0; i < NT; i++)
		T_ASSERT((dst[i] = ms_malloc(sizes[order[i]] + 1)));
	T_ASSERT_MSG(ms_py_set_load(s, dst, 2, &err) == MS_OK, "%s", err.msg);
	for (int i = 0; i < NT; i++) {
		T_ASSERT(!memcmp(dst[i], fx.src[order[i]], sizes[order[i]]));
		ms_free(dst[i]);
	}
	ms_py_set_free(s);
	fixture_free(&fx);
	return 0;
}

static int test_from_file_refusals(void)
{
	struct fixture fx;
	struct ms_py_set *s = NULL;
	struct ms_err err = {0};
	const char *more[NT + 1] = {names[0], names[1], names[2], "d"};
	uint8_t dg[(NT + 1) * 32];
	void *dst[NT];
	uint64_t nb;

	T_ASSERT(fixture_make(&fx, "r.safetensors") == 0);
	/* a tensor of the file without a digest */
	T_ASSERT_EQ_INT(ms_py_set_from_file(fx.path, NT - 1, names, fx.digests, &s, &err),
			MS_EINVAL);
	T_ASSERT(strstr(err.msg, "'c.bias'") && strstr(err.msg, "no expected digest"));
	T_ASSERT(s == NULL);
	/* a digest for a tensor the file lacks */
	memcpy(dg, fx.digests, sizeof(fx.digests));
	memset(dg + NT * 32, 0, 32);
	T_ASSERT_EQ_INT(ms_py_set_from_file(fx.path, NT + 1, more, dg, &s, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "'d'"));
	/* a wrong digest: the load fails and every destination is zeroed */
	dg[0] ^= 1; /* b.weight */
	T_ASSERT(ms_py_set_from_file(fx.path, NT, names, dg, &s, &err) == MS_OK);
	for (int i = 0; i < NT; i++) {
		T_ASSERT(ms_py_set_tensor(s, (size_t)i, NULL, NULL, NULL, NULL, &nb, NULL) == MS_OK);
		T_ASSERT((dst[i] = ms_malloc(nb + 1)));
		memset(dst[i], 0xff, nb + 1);
	}
	T_ASSERT_EQ_INT(ms_py_set_load(s, dst, 1, &err), MS_ECHECK);
	T_ASSERT(strstr(err.msg, "'b.weight'") && strstr(err.msg, "digest mismatch"));
	T_ASSERT(((uint8_t *)dst[0])[0] == 0 && ((uint8_t *)dst[1])[5] == 0);
	for (int i = 0; i < NT; i++)
		ms_free(dst[i]);
	ms_py_set_free(s);
	/* a file that is not there */
	T_ASSERT_EQ_INT(ms_py_set_from_file("/nonexistent/x.safetensors", 0, NULL, NULL, &s, &err),
			MS_ENOTFOUND);
	T_ASSERT(s == NULL);
	fixture_free(&fx);
	return 0;
}

/* the DLPack structure as dlpack.h lays it out (what consumers read) */
struct dl_mirror {
	void *data;
	int32_t device_type, device_id;
	int32_t ndim;
	uint8_t code, bits;
	uint16_t lanes;
	int64_t *shape, *strides;
	uint64_t byte_offset;
	void *ctx;
	void (*deleter)(void *);
};

static int test_arena_and_dlpack(void)
{
	struct fixture fx;
	struct ms_py_set *s = NULL;
	struct ms_py_arena *a = NULL;
	struct ms_err err = {0};
	uint64_t off[NT], live = ms_py_arenas_live();
	int64_t shape = (int64_t)sizes[0];
	struct dl_mirror *m1, *m2;

	T_ASSERT(fixture_make(&fx, "a.safetensors") == 0);
	T_ASSERT(ms_py_set_from_file(fx.path, NT, names, fx.digests, &s, &err) == MS_OK);
	T_ASSERT_MSG(ms_py_set_load_arena(s, MS_PY_HOST, 2, off, &a, &err) == MS_OK, "%s",
		     err.msg);
	T_ASSERT_EQ_INT(ms_py_arenas_live(), live + 1);
	/* set order a, b, c; offsets 256-aligned */
	T_ASSERT(off[1] % 256 == 0 && off[1] >= 64);
	T_ASSERT(!memcmp((uint8_t *)ms_py_arena_base(a) + off[1], fx.src[0], sizes[0]));
	T_ASSERT(!memcmp((uint8_t *)ms_py_arena_base(a) + off[0], fx.src[1], sizes[1]));
	m1 = ms_py_dlpack_new(a, off[1], 1, &shape, 1, 8, 0);
	m2 = ms_py_dlpack_new(a, off[0], 1, &shape, 1, 8, 0);
	T_ASSERT(m1 && m2);
	T_ASSERT(m1->data == (uint8_t *)ms_py_arena_base(a) + off[1]);
	T_ASSERT(m1->device_type == 1 && m1->ndim == 1 && m1->shape[0] == shape);
	T_ASSERT(m1->code == 1 && m1->bits == 8 && m1->lanes == 1 && !m1->strides);
	T_ASSERT(m1->deleter != NULL);
	/* the loader's reference goes; the tensors keep the arena alive */
	ms_py_arena_release(a);
	T_ASSERT_EQ_INT(ms_py_arenas_live(), live + 1);
	m1->deleter(m1);
	T_ASSERT_EQ_INT(ms_py_arenas_live(), live + 1);
	ms_py_dlpack_delete(m2);
	T_ASSERT_EQ_INT(ms_py_arenas_live(), live);
	ms_py_dlpack_delete(NULL);
	ms_py_arena_release(NULL);
	/* a failed load allocates nothing */
	ms_py_set_free(s);
	fx.digests[40] ^= 1;
	T_ASSERT(ms_py_set_from_file(fx.path, NT, names, fx.digests, &s, &err) == MS_OK);
	T_ASSERT_EQ_INT(ms_py_set_load_arena(s, MS_PY_HOST, 1, off, &a, &err), MS_ECHECK);
	T_ASSERT(a == NULL);
	T_ASSERT_EQ_INT(ms_py_arenas_live(), live);
	if (!ms_gpu_available()) {
		T_ASSERT_EQ_INT(ms_py_set_load_arena(s, MS_PY_CUDA, 1, off, &a, &err), MS_ENODEV);
		T_ASSERT(a == NULL);
	}
	T_ASSERT_EQ_INT(ms_py_set_load_arena(s, 7, 1, off, &a, &err), MS_EINVAL);
	ms_py_set_free(s);
	fixture_free(&fx);
	return 0;
}

static int test_state_digest(void)
{
	struct fixture fx;
	struct ms_err err = {0};
	char want[MS_STATE_DIGEST_LEN], got[MS_STATE_DIGEST_LEN];
	int32_t dt[NT] = {MS_DTYPE_U8, MS_DTYPE_U8, MS_DTYPE_U8};
	uint32_t nd[NT] = {1, 1, 1};
	uint64_t sh[NT * MS_ST_MAX_RANK] = {0};
	const char *dup[NT] = {"x", "y", "x"};

	T_ASSERT(fixture_make(&fx, "s.safetensors") == 0);
	for (int i = 0; i < NT; i++)
		sh[i * MS_ST_MAX_RANK] = sizes[i];
	T_ASSERT(file_state(fx.path, want) == 0);
	T_ASSERT_MSG(ms_py_state_digest(NT, names, dt, nd, sh, fx.digests, got, &err) == MS_OK,
		     "%s", err.msg);
	T_ASSERT_STR(got, want);
	/* the dtype is part of the identity */
	dt[1] = MS_DTYPE_I8;
	T_ASSERT(ms_py_state_digest(NT, names, dt, nd, sh, fx.digests, got, &err) == MS_OK);
	T_ASSERT(strcmp(got, want));
	T_ASSERT_EQ_INT(ms_py_state_digest(NT, dup, dt, nd, sh, fx.digests, got, &err), MS_EINVAL);
	dt[1] = 99;
	T_ASSERT_EQ_INT(ms_py_state_digest(NT, names, dt, nd, sh, fx.digests, got, &err), MS_EINVAL);
	fixture_free(&fx);
	return 0;
}

static int test_inventory(void)
{
	struct fixture fx;
	struct ms_inv *inv = NULL;
	struct ms_inv_add_opts o;
	struct ms_py_set *s = NULL;
	struct ms_err err = {0};
	char db[600], digest[MS_STATE_DIGEST_LEN], *json = NULL;
	const char *p;
	cJSON *arr;
	void *dst[NT];
	uint64_t nb;

	T_ASSERT(fixture_make(&fx, "inv.safetensors") == 0);
	snprintf(db, sizeof(db), "%s/inv.db", T_TMP);
	T_ASSERT(ms_inv_open(db, MS_INV_CREATE, &inv, &err) == MS_OK);
	ms_inv_add_opts_init(&o);
	o.label = "thing";
	p = fx.path;
	T_ASSERT_MSG(ms_inv_add_paths(inv, &p, 1, &o, digest, &err) == MS_OK, "%s", err.msg);

	T_ASSERT_MSG(ms_py_set_from_inv(inv, "thing", &s, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_STR(ms_py_set_state(s), digest);
	ms_py_set_free(s);
	T_ASSERT_MSG(ms_py_set_from_inv_file(inv, fx.path, &s, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_STR(ms_py_set_state(s), digest);
	T_ASSERT_EQ_INT(ms_py_set_count(s), NT);
	ms_py_set_free(s);
	T_ASSERT_EQ_INT(ms_py_set_from_inv(inv, "nothing", &s, &err), MS_ENOTFOUND);

	T_ASSERT(ms_py_inv_states_json(inv, NULL, &json, &err) == MS_OK);
	T_ASSERT((arr = cJSON_Parse(json)));
	T_ASSERT_EQ_INT(cJSON_GetArraySize(arr), 1);
	T_ASSERT_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 0), "label")->valuestring, "thing");
	cJSON_Delete(arr);
	ms_free(json);
	T_ASSERT(ms_py_inv_states_json(inv, "adapter", &json, &err) == MS_OK);
	T_ASSERT_STR(json, "[]");
	ms_free(json);
	T_ASSERT_EQ_INT(ms_py_inv_states_json(inv, "bogus", &json, &err), MS_EINVAL);
	T_ASSERT(ms_py_inv_state_json(inv, "thing", &json, &err) == MS_OK);
	T_ASSERT(strstr(json, "\"files\"") && strstr(json, "inv.safetensors"));
	ms_free(json);

	/* one flipped byte on disk (inside b.weight's bytes, past the
	 * header): refused by the load */
	{
		FILE *f = fopen(fx.path, "r+b");
		int c;

		T_ASSERT(f);
		fseek(f, 4096, SEEK_SET);
		c = fgetc(f);
		fseek(f, 4096, SEEK_SET);
		fputc(c ^ 1, f);
		fclose(f);
	}
	T_ASSERT(ms_py_set_from_inv(inv, "thing", &s, &err) == MS_OK);
	for (int i = 0; i < NT; i++) {
		T_ASSERT(ms_py_set_tensor(s, (size_t)i, NULL, NULL, NULL, NULL, &nb, NULL) == MS_OK);
		T_ASSERT((dst[i] = ms_malloc(nb + 1)));
	}
	T_ASSERT_EQ_INT(ms_py_set_load(s, dst, 1, &err), MS_ECHECK);
	for (int i = 0; i < NT; i++)
		ms_free(dst[i]);
	ms_py_set_free(s);
	ms_inv_close(inv);
	fixture_free(&fx);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_from_file_and_load),
	T_CASE(test_from_file_refusals),
	T_CASE(test_arena_and_dlpack),
	T_CASE(test_state_digest),
	T_CASE(test_inventory),
};

T_MAIN(cases)
