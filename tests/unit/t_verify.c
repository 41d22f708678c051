/*
 * t_verify.c: re-hashing a state against its record, and manifests.
 */
#include <fcntl.h>
#include <sys/stat.h>

#include "test.h"
#include "verify.h"

static char *copy_fixture(const char *rel, const char *name)
{
	char cmd[1024], *dst = ms_asprintf("%s/%s", T_TMP, name);

	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s/%s' '%s' && chmod -R u+w '%s'", dst,
		 T_FIXTURES, rel, dst, dst);
	if (system(cmd) != 0) {
		ms_free(dst);
		return NULL;
	}
	return dst;
}

static struct ms_vstate *record(const char *path)
{
	struct ms_ckpt *c;
	struct ms_vstate *s = NULL;
	struct ms_err err = {0};

	if (ms_ckpt_open(path, &c, &err) || ms_ckpt_hash(c, 2, 0, &err) ||
	    ms_vstate_from_ckpt(c, &s, &err))
		fprintf(stderr, "record: %s\n", err.msg);
	ms_ckpt_close(c);
	return s;
}

static int flip(const char *path, uint64_t off, uint8_t mask)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	if (fd < 0 || pread(fd, &b, 1, (off_t)off) != 1)
		return -1;
	b ^= mask;
	if (pwrite(fd, &b, 1, (off_t)off) != 1)
		return -1;
	return close(fd);
}

static int has_problem(const struct ms_vreport *r, enum ms_vproblem_kind k, const char *tensor)
{
	for (size_t i = 0; i < r->nproblems; i++)
		if (r->problems[i].kind == k &&
		    (!tensor || (r->problems[i].tensor && !strcmp(r->problems[i].tensor, tensor))))
			return 1;
	return 0;
}

static int test_clean_state_verifies(void)
{
	char *dir = copy_fixture("hf/qwen3moe-sharded", "clean");
	struct ms_vstate *s = record(dir);
	struct ms_vreport r;
	struct ms_err err = {0};

	T_ASSERT(s);
	T_ASSERT_EQ_INT(ms_verify_state(s, 2, &r, &err), MS_OK);
	T_ASSERT_EQ_INT(r.nproblems, 0);
	T_ASSERT_EQ_INT(r.nfiles, 2);
	T_ASSERT(r.bytes > 300000);
	ms_vreport_release(&r);
	ms_vstate_free(s);
	ms_free(dir);
	return 0;
}

/* One flipped bit in every tensor of a file is found, and named. */
static int test_bit_flip_in_each_tensor(void)
{
	char *dir = copy_fixture("hf/qwen3moe", "flip");
	struct ms_vstate *s = record(dir);
	struct ms_err err = {0};
	size_t n;

	T_ASSERT(s);
	n = s->files[0].ntensors;
	for (size_t i = 0; i < n; i++) {
		const struct ms_vtensor *t = &s->files[0].tensors[i];
		struct ms_vreport r;
		uint64_t off = t->offset + (t->nbytes ? (i * 7919) % t->nbytes : 0);

		if (!t->nbytes)
			continue;
		T_ASSERT(flip(s->files[0].path, off, (uint8_t)(1u << (i % 8))) == 0);
		T_ASSERT_EQ_INT(ms_verify_state(s, 2, &r, &err), MS_ECHECK);
		T_ASSERT_EQ_INT(r.nproblems, 1);
		T_ASSERT(has_problem(&r, MS_VPROBLEM_TENSOR_DIGEST, t->name));
		ms_vreport_release(&r);
		T_ASSERT(flip(s->files[0].path, off, (uint8_t)(1u << (i % 8))) == 0);
	}
	ms_vstate_free(s);
	ms_free(dir);
	return 0;
}

static int test_header_and_truncation(void)
{
	char *dir = copy_fixture("hf/qwen3moe", "hdr");
	char *file = ms_asprintf("%s/model.safetensors", dir);
	struct ms_vstate *s = record(dir);
	struct ms_vreport r;
	struct ms_err err = {0};

	T_ASSERT(s);
	/* "format":"pt" -> "format":"pu": still a valid header, other bytes */
	{
		char buf[200];
		int fd = open(file, O_RDWR);
		char *p;

		T_ASSERT(fd >= 0 && pread(fd, buf, sizeof(buf) - 1, 0) > 0);
		buf[sizeof(buf) - 1] = 0;
		p = strstr(buf + 8, "\"pt\"");
		T_ASSERT(p);
		p[2] = 'u';
		T_ASSERT(pwrite(fd, p + 2, 1, p + 2 - buf) == 1);
		close(fd);
	}
	T_ASSERT_EQ_INT(ms_verify_state(s, 1, &r, &err), MS_ECHECK);
	T_ASSERT(has_problem(&r, MS_VPROBLEM_HEADER, NULL));
	ms_vreport_release(&r);
	T_ASSERT(truncate(file, 1000) == 0);
	T_ASSERT_EQ_INT(ms_verify_state(s, 1, &r, &err), MS_ECHECK);
	T_ASSERT(has_problem(&r, MS_VPROBLEM_FILE_SIZE, NULL));
	T_ASSERT(has_problem(&r, MS_VPROBLEM_FILE_UNREADABLE, NULL));
	ms_vreport_release(&r);
	T_ASSERT(unlink(file) == 0);
	T_ASSERT_EQ_INT(ms_verify_state(s, 1, &r, &err), MS_ECHECK);
	T_ASSERT(has_problem(&r, MS_VPROBLEM_FILE_MISSING, NULL));
	ms_vreport_release(&r);
	ms_vstate_free(s);
	ms_free(file);
	ms_free(dir);
	return 0;
}

static int test_config_change(void)
{
	char *dir = copy_fixture("peft/qwen3moe-E8-r4/adapter", "cfg");
	char *cfg = ms_asprintf("%s/adapter_config.json", dir), cmd[600];
	struct ms_vstate *s = record(dir);
	struct ms_vreport r;
	struct ms_err err = {0};

	T_ASSERT(s && s->nconfigs == 1);
	snprintf(cmd, sizeof(cmd), "sed -i 's/\"lora_alpha\": 8/\"lora_alpha\": 16/' '%s'", cfg);
	T_ASSERT(system(cmd) == 0);
	T_ASSERT_EQ_INT(ms_verify_state(s, 1, &r, &err), MS_ECHECK);
	T_ASSERT(has_problem(&r, MS_VPROBLEM_CONFIG, NULL));
	ms_vreport_release(&r);
	ms_vstate_free(s);
	ms_free(cfg);
	ms_free(dir);
	return 0;
}

static int test_manifest_round_trip(void)
{
	char *dir = copy_fixture("hf/mixtral-sharded", "man");
	struct ms_vstate *s = record(dir), *p = NULL;
	struct ms_vreport r;
	struct ms_err err = {0};
	char *json = NULL;

	T_ASSERT(s);
	T_ASSERT_EQ_INT(ms_manifest_write(s, dir, &json, &err), MS_OK);
	T_ASSERT(strstr(json, "\"path\":\t\"model-00001-of-00002.safetensors\""));
	T_ASSERT_EQ_INT(ms_manifest_parse(json, strlen(json), "m.json", dir, &p, &err), MS_OK);
	T_ASSERT_STR(p->digest, s->digest);
	T_ASSERT_EQ_INT(ms_verify_state(p, 2, &r, &err), MS_OK);
	ms_vreport_release(&r);
	ms_vstate_free(p);
	/* a tensor digest edited in the manifest: the state digest no longer
	 * follows from the tensors, so parsing refuses it */
	{
		char *q = strstr(json, "\"sha256\":\t\"");

		T_ASSERT(q);
		q += 11;
		*q = *q == '0' ? '1' : '0';
		T_ASSERT_EQ_INT(ms_manifest_parse(json, strlen(json), "m.json", dir, &p, &err),
				MS_ECHECK);
		T_ASSERT(strstr(err.msg, "the manifest says"));
	}
	ms_free(json);
	/* a file outside the root cannot be written as a relative path */
	T_ASSERT_EQ_INT(ms_manifest_write(s, T_FIXTURES, &json, &err), MS_EINVAL);
	ms_vstate_free(s);
	ms_free(dir);
	return 0;
}

static int test_manifest_rejects_paths(void)
{
	static const char *const bad[] = {"../x.safetensors", "/abs.safetensors", "a/../b",
					  "./a", "a//b", ""};
	struct ms_err err = {0};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *json = ms_asprintf(
			"{\"format\":\"msinv-manifest-v1\",\"state\":\"sha256:%064d\","
			"\"files\":[{\"path\":\"%s\",\"size\":8,\"header_sha256\":\"%064d\",\"tensors\":[]}]}",
			0, bad[i], 0);
		struct ms_vstate *s = NULL;

		T_ASSERT_EQ_INT(ms_manifest_parse(json, strlen(json), "m.json", NULL, &s, &err),
				MS_EINVAL);
		T_ASSERT_MSG(strstr(err.msg, "plain relative path"), "%s", err.msg);
		ms_free(json);
	}
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_clean_state_verifies),
	T_CASE(test_bit_flip_in_each_tensor),
	T_CASE(test_header_and_truncation),
	T_CASE(test_config_change),
	T_CASE(test_manifest_round_trip),
	T_CASE(test_manifest_rejects_paths),
};

T_MAIN(cases)
