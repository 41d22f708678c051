/*
 * t_train_ckpt.c: the trainer's checkpoints (published whole, registered
 * with train edges carrying the optimizer digest, refused over an existing
 * one, taken away when registration fails), the optimizer state read back
 * only when it hashes to the record, and the plan's train section.
 */
#include <sys/stat.h>

#include "test.h"
#include "train/ckpt.h"
#include "train/run.h"

static float w1[6], g1[6], w2[4], g2[4];
static const struct ms_param params[2] = {
	{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", 2, {2, 3}, 6, w1, g1},
	{"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", 2, {2, 2}, 4, w2, g2},
};

static struct ms_inv *open_inv(const char *name)
{
	char p[512];
	struct ms_inv *inv = NULL;
	struct ms_err err = {0};

	snprintf(p, sizeof(p), "%s/%s", T_TMP, name);
	if (ms_inv_open(p, MS_INV_CREATE, &inv, &err) != MS_OK)
		fprintf(stderr, "%s\n", err.msg);
	return inv;
}

/* A registered parent: a one-tensor base. */
static int add_base(struct ms_inv *inv, char digest[MS_STATE_DIGEST_LEN])
{
	char p[512];
	float x[4] = {1, 2, 3, 4};
	uint64_t shape[1] = {4};
	struct ms_st_writer *w = NULL;
	struct ms_inv_add_opts o;
	struct ms_err err = {0};
	const char *paths[1] = {p};

	snprintf(p, sizeof(p), "%s/base.safetensors", T_TMP);
	if (ms_st_writer_new(p, 1, &w, &err) || ms_st_writer_add(w, "x", MS_DTYPE_F32, 1, shape, x, &err) ||
	    ms_st_writer_commit(w, &err))
		return -1;
	ms_st_writer_free(w);
	ms_inv_add_opts_init(&o);
	o.kind = MS_INV_KIND_BASE;
	return ms_inv_add_paths(inv, paths, 1, &o, digest, &err);
}

static int setup_opt(struct ms_adamw **o)
{
	struct ms_optim_param op[2];
	struct ms_adamw_cfg c;
	struct ms_err err = {0};

	for (int i = 0; i < 6; i++)
		w1[i] = 0.1f * i, g1[i] = 0.01f * (i + 1);
	for (int i = 0; i < 4; i++)
		w2[i] = -0.2f * i, g2[i] = 0.03f * (i - 2);
	for (int i = 0; i < 2; i++)
		op[i] = (struct ms_optim_param){params[i].name, params[i].w, params[i].g,
						params[i].n};
	ms_adamw_cfg_init(&c);
	if (ms_adamw_new(&c, op, 2, o, &err))
		return -1;
	for (int t = 0; t < 3; t++)
		ms_adamw_update(*o, 1e-2);
	return 0;
}

static void fill_save(struct ms_train_ckpt_save *s, const char *outputs, struct ms_adamw *o,
		      const char *const *parents, const char *label)
{
	memset(s, 0, sizeof(*s));
	s->outputs = outputs;
	s->params = params;
	s->nparams = 2;
	s->opt = o;
	s->adapter_config = "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, "
			    "\"target_modules\": [\"q_proj\"], \"target_parameters\": null}";
	s->meta.step = 3;
	s->meta.data_cursor = 12;
	s->meta.data_seed = s->meta.lora_seed = 7;
	s->label = label;
	s->parents = parents;
	s->nparents = 1;
}

static int count_entries(const char *dir)
{
	char cmd[600];
	FILE *p;
	int n = -1;

	snprintf(cmd, sizeof(cmd), "ls -A '%s' 2>/dev/null | wc -l", dir);
	if (!(p = popen(cmd, "r")))
		return -1;
	if (fscanf(p, "%d", &n) != 1)
		n = -1;
	pclose(p);
	return n;
}

static int test_write_register_read(void)
{
	struct ms_inv *inv = open_inv("a.db");
	struct ms_adamw *o = NULL, *o2 = NULL;
	struct ms_train_ckpt_save s;
	struct ms_train_ckpt_meta meta;
	struct ms_err err = {0};
	struct ms_inv_state *st = NULL;
	struct ms_inv_edge *e = NULL;
	char base[MS_STATE_DIGEST_LEN], digest[MS_STATE_DIGEST_LEN], out[512], p[600], *dir = NULL;
	char *lab = NULL;
	const char *parents[1] = {base};
	uint8_t sha[32];
	size_t ne = 0;
	struct stat sb;

	T_ASSERT(inv && add_base(inv, base) == MS_OK);
	T_ASSERT(setup_opt(&o) == 0);
	snprintf(out, sizeof(out), "%s/out", T_TMP);
	fill_save(&s, out, o, parents, "run1-step3");
	T_ASSERT_MSG(ms_train_ckpt_write(inv, &s, &dir, digest, &lab, &err) == MS_OK, "%s", err.msg);
	snprintf(p, sizeof(p), "%s/step-000003", out);
	T_ASSERT_STR(dir, p);
	T_ASSERT_STR(lab, "run1-step3");
	ms_free(lab);
	/* the published directory, and nothing staged left beside it */
	T_ASSERT_EQ_INT(count_entries(out), 1);
	T_ASSERT_EQ_INT(count_entries(dir), 2);
	snprintf(p, sizeof(p), "%s/adapter/adapter_config.json", dir);
	T_ASSERT(stat(p, &sb) == 0);
	/* the adapter holds PEFT's keys and shapes, nothing else */
	{
		struct ms_st_file *f = NULL;

		snprintf(p, sizeof(p), "%s/adapter/adapter_model.safetensors", dir);
		T_ASSERT(ms_st_open(p, &f, &err) == MS_OK);
		T_ASSERT_EQ_INT(f->ntensors, 2);
		for (int i = 0; i < 2; i++) {
			const struct ms_tensor *t = ms_st_find(f, params[i].name);

			T_ASSERT(t && t->dtype == MS_DTYPE_F32 && t->ndim == 2);
			T_ASSERT(t->shape[0] == params[i].shape[0] && t->shape[1] == params[i].shape[1]);
			T_ASSERT(!memcmp(t->data, params[i].w, params[i].n * 4));
		}
		T_ASSERT_STR(ms_st_meta_get(f, "format"), "pt");
		ms_st_close(f);
	}
	/* registered: an adapter with its label and a train edge to the base */
	T_ASSERT(ms_inv_state_get(inv, digest, &st, &err) == MS_OK);
	T_ASSERT(st->kind == MS_INV_KIND_ADAPTER);
	T_ASSERT_STR(st->label, "run1-step3");
	ms_inv_state_free(st);
	T_ASSERT(ms_inv_edges(inv, digest, MS_INV_EDGES_PARENTS, &e, &ne, &err) == MS_OK);
	T_ASSERT_EQ_INT(ne, 1);
	T_ASSERT_STR(e[0].parent, base);
	T_ASSERT_STR(e[0].operation, "train");
	T_ASSERT(strstr(e[0].params, "\"step\":3"));
	{
		char hex[65], *h = strstr(e[0].params, "\"optimizer_sha256\":\"");

		snprintf(p, sizeof(p), "%s/optimizer.safetensors", dir);
		T_ASSERT(ms_sha256_file(p, sha, &err) == MS_OK);
		ms_hex(sha, 32, hex);
		T_ASSERT(h && !strncmp(h + 20, hex, 64));
	}
	ms_inv_edges_free(e, ne);
	/* read back: moments and step */
	{
		struct ms_optim_param op[2];
		struct ms_adamw_cfg c;

		for (int i = 0; i < 2; i++)
			op[i] = (struct ms_optim_param){params[i].name, params[i].w, params[i].g,
							params[i].n};
		ms_adamw_cfg_init(&c);
		T_ASSERT(ms_adamw_new(&c, op, 2, &o2, &err) == MS_OK);
	}
	T_ASSERT_MSG(ms_train_ckpt_read_optim(dir, sha, o2, &meta, &err) == MS_OK, "%s", err.msg);
	T_ASSERT_EQ_INT(o2->step, 3);
	T_ASSERT_EQ_INT(meta.data_cursor, 12);
	T_ASSERT_EQ_INT(meta.lora_seed, 7);
	for (int i = 0; i < 2; i++) {
		T_ASSERT(!memcmp(o->m[i], o2->m[i], params[i].n * 4));
		T_ASSERT(!memcmp(o->v[i], o2->v[i], params[i].n * 4));
	}
	/* one bit changed in the optimizer file: refused, naming it */
	{
		FILE *f;
		int ch;

		snprintf(p, sizeof(p), "%s/optimizer.safetensors", dir);
		T_ASSERT((f = fopen(p, "r+b")));
		fseek(f, -3, SEEK_END);
		ch = fgetc(f);
		fseek(f, -3, SEEK_END);
		fputc(ch ^ 1, f);
		fclose(f);
		T_ASSERT_EQ_INT(ms_train_ckpt_read_optim(dir, sha, o2, &meta, &err), MS_ECHECK);
		T_ASSERT(strstr(err.msg, "optimizer.safetensors") && strstr(err.msg, "differs"));
	}
	/* the same step again: refused, nothing staged left */
	ms_free(dir);
	dir = NULL;
	T_ASSERT_EQ_INT(ms_train_ckpt_write(inv, &s, &dir, digest, &lab, &err), MS_EEXIST);
	T_ASSERT(strstr(err.msg, "step-000003") && strstr(err.msg, "exists"));
	T_ASSERT_EQ_INT(count_entries(out), 1);
	/* the same bytes from another run: a new copy, the state keeps its
	 * label (a state has one) */
	{
		char out2[600], d2[MS_STATE_DIGEST_LEN];

		snprintf(out2, sizeof(out2), "%s/out2", T_TMP);
		s.outputs = out2;
		s.label = "run2-step3";
		T_ASSERT_MSG(ms_train_ckpt_write(inv, &s, &dir, d2, &lab, &err) == MS_OK, "%s",
			     err.msg);
		T_ASSERT_STR(d2, digest);
		T_ASSERT_STR(lab, "run1-step3");
		ms_free(lab);
		ms_free(dir);
	}
	ms_adamw_free(o);
	ms_adamw_free(o2);
	ms_inv_close(inv);
	return 0;
}

/* A registration that fails (the label names another state) leaves no
 * checkpoint directory and no staging directory behind. */
static int test_failed_registration_unpublishes(void)
{
	struct ms_inv *inv = open_inv("b.db");
	struct ms_adamw *o = NULL;
	struct ms_train_ckpt_save s;
	struct ms_err err = {0};
	char base[MS_STATE_DIGEST_LEN], digest[MS_STATE_DIGEST_LEN], out[512], *dir = NULL;
	char *lab = NULL;
	const char *parents[1] = {base};
	struct ms_inv_add_opts ao;
	char bp[512];
	const char *paths[1] = {bp};

	T_ASSERT(inv && add_base(inv, base) == MS_OK);
	/* the label is taken by the base */
	snprintf(bp, sizeof(bp), "%s/base.safetensors", T_TMP);
	ms_inv_add_opts_init(&ao);
	ao.kind = MS_INV_KIND_BASE;
	ao.label = "taken";
	T_ASSERT(ms_inv_add_paths(inv, paths, 1, &ao, digest, &err) == MS_OK);
	T_ASSERT(setup_opt(&o) == 0);
	snprintf(out, sizeof(out), "%s/out-b", T_TMP);
	fill_save(&s, out, o, parents, "taken");
	T_ASSERT_EQ_INT(ms_train_ckpt_write(inv, &s, &dir, digest, &lab, &err), MS_EEXIST);
	T_ASSERT_MSG(strstr(err.msg, "taken"), "%s", err.msg);
	T_ASSERT(dir == NULL);
	T_ASSERT_EQ_INT(count_entries(out), 0);
	/* and nothing of it was recorded */
	{
		struct ms_inv_state *st = NULL;
		size_t n = 0;

		T_ASSERT(ms_inv_states_list(inv, MS_INV_KIND_ADAPTER, &st, &n, &err) == MS_OK);
		T_ASSERT_EQ_INT(n, 0);
		ms_inv_states_free(st, n);
	}
	ms_adamw_free(o);
	ms_inv_close(inv);
	return 0;
}

static const char *plan_ok =
	"{\"ep_size\": 1, \"states\": [{\"role\": \"base\", \"path\": \"b\"}],"
	" \"outputs\": \"o\", \"train\": {"
	"  \"lora\": {\"r\": 4, \"alpha\": 8, \"dropout\": 0.1, \"targets\": [\"experts\", \"q_proj\"]},"
	"  \"optimizer\": {\"name\": \"adamw\", \"lr\": 2e-3, \"betas\": [0.8, 0.99], \"eps\": 1e-6,"
	"                \"weight_decay\": 0.0, \"clip\": 1.0, \"warmup\": 10, \"schedule\": \"constant\"},"
	"  \"batch\": 4, \"seq_len\": 32, \"grad_accum\": 2, \"steps\": 200, \"seed\": 5,"
	"  \"data\": {\"jsonl\": \"d.jsonl\"}, \"checkpoint_every\": 50, \"colwise\": \"on-demand\","
	"  \"label\": \"lora-run1\"}}";

static int test_plan_parse(void)
{
	struct ms_train_plan p;
	struct ms_err err = {0};

	T_ASSERT_MSG(ms_train_plan_parse(plan_ok, strlen(plan_ok), "p.json", "/plans", &p, &err) ==
		     MS_OK, "%s", err.msg);
	T_ASSERT(p.lora.r == 4 && p.lora.alpha == 8 && p.lora.dropout == 0.1);
	T_ASSERT_EQ_INT(p.lora.targets, MS_LORA_EXPERTS | MS_LORA_Q);
	T_ASSERT(p.optim.lr == 2e-3 && p.optim.beta1 == 0.8 && p.optim.beta2 == 0.99);
	T_ASSERT(p.optim.eps == 1e-6 && p.optim.weight_decay == 0 && p.optim.clip == 1.0);
	T_ASSERT(p.optim.warmup == 10 && p.optim.schedule == MS_SCHED_CONSTANT);
	T_ASSERT_EQ_INT(p.optim.total_steps, 200);
	T_ASSERT(p.batch == 4 && p.seq_len == 32 && p.grad_accum == 2 && p.steps == 200);
	T_ASSERT(p.seed == 5 && p.lora.seed == 5 && p.checkpoint_every == 50);
	T_ASSERT(p.task == MS_TASK_JSONL);
	T_ASSERT_STR(p.jsonl, "/plans/d.jsonl");
	T_ASSERT(p.colwise == MS_COLWISE_ON_DEMAND);
	T_ASSERT_STR(p.label, "lora-run1");
	ms_train_plan_release(&p);
	/* defaults */
	{
		const char *m = "{\"train\": {\"lora\": {\"r\": 2}, \"steps\": 3}}";

		T_ASSERT(ms_train_plan_parse(m, strlen(m), "m.json", NULL, &p, &err) == MS_OK);
		T_ASSERT(p.lora.alpha == 2 && p.lora.targets == MS_LORA_EXPERTS);
		T_ASSERT(p.optim.lr == 1e-3 && p.optim.weight_decay == 0.01 && p.optim.clip == 0);
		T_ASSERT(p.task == MS_TASK_COPY && p.batch == 1 && p.seq_len == 64);
		T_ASSERT_STR(p.label, "lora");
		ms_train_plan_release(&p);
	}
	return 0;
}

static int plan_bad(const char *train, const char *want)
{
	char buf[2048];
	struct ms_train_plan p;
	struct ms_err err = {0};
	int rc;

	snprintf(buf, sizeof(buf), "{\"ep_size\": 1, \"train\": %s}", train);
	rc = ms_train_plan_parse(buf, strlen(buf), "p.json", NULL, &p, &err);
	if (rc != MS_EINVAL || !strstr(err.msg, want) || !strstr(err.msg, "plan 'p.json'")) {
		fprintf(stderr, "%s: got %d '%s', want '%s'\n", train, rc, err.msg, want);
		if (rc == MS_OK)
			ms_train_plan_release(&p);
		return 1;
	}
	return 0;
}

static int test_plan_refusals(void)
{
	const char *m = "{\"ep_size\": 1}";
	struct ms_train_plan p;
	struct ms_err err = {0};

	T_ASSERT_EQ_INT(ms_train_plan_parse(m, strlen(m), "p.json", NULL, &p, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "key 'train': missing"));
	T_ASSERT(!plan_bad("{\"steps\": 3}", "key 'train.lora': missing"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}}", "key 'train.steps': missing"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 0}, \"steps\": 3}", "key 'train.lora.r'"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2.5}, \"steps\": 3}", "key 'train.lora.r'"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2, \"rank\": 3}, \"steps\": 3}",
			   "key 'train.lora.rank': unknown key"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"lr\": 1}",
			   "key 'train.lr': unknown key"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"steps\": 4}",
			   "key 'train.steps': given twice"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2, \"targets\": [\"gate\"]}, \"steps\": 3}",
			   "key 'train.lora.targets[0]'"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2, \"targets\": [\"q_proj\", \"q_proj\"]}, \"steps\": 3}",
			   "given twice"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"optimizer\": {\"name\": \"sgd\"}}",
			   "key 'train.optimizer.name'"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"optimizer\": {\"betas\": [0.9, 1.0]}}",
			   "key 'train.optimizer.betas'"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"optimizer\": {\"lr\": -1}}",
			   "key 'train.optimizer.lr'"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"optimizer\": {\"schedule\": \"linear\"}}",
			   "key 'train.optimizer.schedule'"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"data\": {\"task\": \"copy\", "
			   "\"jsonl\": \"x\"}}", "key 'train.data': give exactly one"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"data\": {\"task\": \"add\"}}",
			   "key 'train.data.task'"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"colwise\": \"both\"}",
			   "key 'train.colwise'"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"label\": \"a b\"}",
			   "key 'train.label'"));
	T_ASSERT(!plan_bad("{\"lora\": {\"r\": 2}, \"steps\": 3, \"batch\": 0}", "key 'train.batch'"));
	return 0;
}

static int test_launch_env(void)
{
	char *env[] = {"PATH=/bin", "MSINV_RUN=12", "MSINV_PLAN_DIGEST=sha256:"
		       "0000000000000000000000000000000000000000000000000000000000000001",
		       "MSINV_STATE_BASE=sha256:ab", "MSINV_STATE_QUANTIZED=sha256:cd", NULL};
	char *none[] = {"PATH=/bin", "MSINV_STATE_BASE=x", NULL};
	char *bad[] = {"MSINV_RUN=x1", NULL};
	char *noplan[] = {"MSINV_RUN=3", NULL};
	struct ms_train_launch l;
	struct ms_err err = {0};

	T_ASSERT(ms_train_launch_parse(env, &l, &err) == MS_OK);
	T_ASSERT(l.active && l.run_id == 12 && l.nroles == 2);
	T_ASSERT_STR(l.roles[1], "QUANTIZED");
	T_ASSERT_STR(l.digests[0], "sha256:ab");
	ms_train_launch_release(&l);
	T_ASSERT(ms_train_launch_parse(none, &l, &err) == MS_OK && !l.active);
	ms_train_launch_release(&l);
	T_ASSERT_EQ_INT(ms_train_launch_parse(bad, &l, &err), MS_EINVAL);
	T_ASSERT_EQ_INT(ms_train_launch_parse(noplan, &l, &err), MS_EINVAL);
	T_ASSERT(strstr(err.msg, "MSINV_PLAN_DIGEST"));
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_write_register_read),
	T_CASE(test_failed_registration_unpublishes),
	T_CASE(test_plan_parse),
	T_CASE(test_plan_refusals),
	T_CASE(test_launch_env),
};

T_MAIN(cases)
