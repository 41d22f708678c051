/*
 * t_gate.c: the launch gate verifies every state of a plan before a run.
 */
#include <fcntl.h>

#include "gate.h"
#include "inventory.h"
#include "test.h"

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

static int write_text(const char *path, const char *text)
{
	struct ms_err err = {0};

	return ms_file_write_atomic(path, text, strlen(text), 1, &err);
}

static const char *env_get(const struct ms_gate *g, const char *name)
{
	size_t n = strlen(name);

	for (size_t i = 0; i < g->nenv; i++)
		if (!strncmp(g->env[i], name, n) && g->env[i][n] == '=')
			return g->env[i] + n + 1;
	return NULL;
}

static int add(struct ms_inv *inv, const char *path, const char *label, char *digest)
{
	struct ms_inv_add_opts o;
	struct ms_err err = {0};
	int rc;

	ms_inv_add_opts_init(&o);
	o.label = label;
	rc = ms_inv_add_paths(inv, &path, 1, &o, digest, &err);
	if (rc)
		fprintf(stderr, "add: %s\n", err.msg);
	return rc;
}

static int test_gate_allows_and_refuses(void)
{
	char *base = copy_fixture("hf/qwen3moe-sharded", "base");
	char *adapter = copy_fixture("peft/qwen3moe-E8-r4/adapter", "adapter");
	char *db = ms_asprintf("%s/inv.db", T_TMP), *plan = ms_asprintf("%s/plan.json", T_TMP);
	char *text, d1[MS_STATE_DIGEST_LEN], d2[MS_STATE_DIGEST_LEN];
	struct ms_inv *inv;
	struct ms_gate *g = NULL;
	struct ms_err err = {0};

	T_ASSERT(base && adapter);
	T_ASSERT_EQ_INT(ms_inv_open(db, MS_INV_CREATE, &inv, &err), MS_OK);
	T_ASSERT_EQ_INT(add(inv, base, "base", d1), MS_OK);
	T_ASSERT_EQ_INT(add(inv, adapter, NULL, d2), MS_OK);
	text = ms_asprintf("{\"ep_size\": 1, \"outputs\": \"out\", \"states\": ["
			   "{\"role\": \"base\", \"state\": \"base\"},"
			   "{\"role\": \"lora-adapter\", \"path\": \"adapter\"}]}");
	T_ASSERT(write_text(plan, text) == MS_OK);
	ms_free(text);
	/* --trust-recent trusts only a verification that started over 2 s
	 * after the files' last change (gate.c, RECENT_SLACK_NS) */
	usleep(2300000);

	T_ASSERT_EQ_INT(ms_gate_check(inv, plan, 0, 2, &g, &err), MS_OK);
	T_ASSERT(g->run_id > 0);
	T_ASSERT_STR(env_get(g, "MSINV_STATE_BASE"), d1);
	T_ASSERT_STR(env_get(g, "MSINV_STATE_LORA_ADAPTER"), d2);
	T_ASSERT(strstr(env_get(g, "MSINV_PATH_BASE"), "/base"));
	T_ASSERT_STR(env_get(g, "MSINV_OUTPUTS"), "out");
	T_ASSERT_EQ_INT(ms_gate_end(inv, g, 0, &err), MS_OK);
	ms_gate_free(g);

	/* a recent verification is trusted when asked, and nothing is re-hashed */
	T_ASSERT_EQ_INT(ms_gate_check(inv, plan, MS_GATE_TRUST_RECENT, 2, &g, &err), MS_OK);
	T_ASSERT(g->inputs[0].trusted);
	T_ASSERT_EQ_INT(g->inputs[0].bytes, 0);
	ms_gate_end(inv, g, 0, &err);
	ms_gate_free(g);

	/* one flipped byte in the base: refused, naming the tensor */
	{
		char *f = ms_asprintf("%s/model-00002-of-00002.safetensors", base);
		int fd = open(f, O_RDWR);
		uint8_t b;

		T_ASSERT(fd >= 0 && pread(fd, &b, 1, 100000) == 1);
		b ^= 0x10;
		T_ASSERT(pwrite(fd, &b, 1, 100000) == 1);
		close(fd);
		ms_free(f);
	}
	T_ASSERT_EQ_INT(ms_gate_check(inv, plan, MS_GATE_TRUST_RECENT, 2, &g, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(g->why, "role 'base'") && strstr(g->why, "digest mismatch"), "%s",
		     g->why);
	T_ASSERT(g->run_id > 0);
	ms_gate_free(g);

	/* a path that is no inventoried state */
	{
		char *fx = realpath(T_FIXTURES, NULL);

		text = ms_asprintf("{\"ep_size\": 1, \"states\": [{\"role\": \"x\", \"path\": \"%s/hf/mixtral\"}]}",
				   fx);
		free(fx);
	}
	T_ASSERT(write_text(plan, text) == MS_OK);
	ms_free(text);
	T_ASSERT_EQ_INT(ms_gate_check(inv, plan, 0, 2, &g, &err), MS_ECHECK);
	T_ASSERT_MSG(strstr(g->why, "not in the inventory"), "%s", g->why);
	ms_gate_free(g);

	/* an unknown label */
	T_ASSERT(write_text(plan, "{\"ep_size\": 1, \"states\": [{\"role\": \"x\", \"state\": \"nope\"}]}") == MS_OK);
	T_ASSERT_EQ_INT(ms_gate_check(inv, plan, 0, 2, &g, &err), MS_ECHECK);
	ms_gate_free(g);

	/* a malformed plan is bad input, not a refusal */
	T_ASSERT(write_text(plan, "{\"states\": []}") == MS_OK);
	T_ASSERT_EQ_INT(ms_gate_check(inv, plan, 0, 2, &g, &err), MS_EINVAL);
	T_ASSERT(g == NULL);

	ms_inv_close(inv);
	ms_free(db);
	ms_free(plan);
	ms_free(base);
	ms_free(adapter);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_gate_allows_and_refuses),
};

T_MAIN(cases)
