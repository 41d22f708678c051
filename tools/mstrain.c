/*
 * mstrain: the trainer core's front end: LoRA on a frozen NVFP4 MoE base,
 * on the CPU, from a run plan, loading only inventory-verified states
 * (src/train/run.h has the plan, the gate and the checkpoints).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

extern char **environ;

/* A GRPO run the collapse monitor stopped (train.rl.monitor.stop), after
 * its checkpoint: not 1 (a check failed) nor 3, so a launcher tells it
 * apart. */
#define MSTRAIN_RL_STOPPED 4

struct train_ctx {
	FILE *metrics;
	const char *metrics_path;
	int json;
};

static int on_step(void *arg, const struct ms_train_step *s, struct ms_err *err)
{
	struct train_ctx *c = arg;

	/* the trainer's log: one line per step, stderr, always */
	fprintf(stderr, "%s: step %" PRIu64 "/%" PRIu64 " loss %.6f lr %.3e grad_norm %.4f "
		"tokens/s %.0f\n", cli_prog, s->step, s->total, s->loss, s->lr, s->grad_norm,
		s->tokens_per_s);
	/* %.17g: the losses of two runs compare bit for bit. A metrics file
	 * that cannot be written stops the run: training on without the
	 * record asked for would be silent data loss. */
	if (c->metrics &&
	    (fprintf(c->metrics, "{\"step\":%" PRIu64 ",\"loss\":%.17g,\"lr\":%.17g,"
		     "\"grad_norm\":%.17g,\"tokens\":%" PRIu64 ",\"seconds\":%.6f,"
		     "\"tokens_per_s\":%.1f}\n", s->step, s->loss, s->lr, s->grad_norm,
		     s->tokens, s->seconds, s->tokens_per_s) < 0 || fflush(c->metrics))) {
		return ms_err_set(err, MS_EIO, "'%s': write failed: %s", c->metrics_path,
				  strerror(errno));
	}
	return MS_OK;
}

/* GRPO steps: the monitor's numbers on the progress line, every metric in
 * the metrics file, and each event of the step as its own line there
 * ({"event": {...}}, what tools/scripts/rl_curves.py marks). */
static int on_rl_step(void *arg, const struct ms_rl_metrics *s, const struct ms_rl_event *ev,
		      size_t nev, struct ms_err *err)
{
	struct train_ctx *c = arg;
	char *js = NULL;
	int rc = MS_OK;

	fprintf(stderr, "%s: step %" PRIu64 " reward %.4f std %.4f zero_var %.2f kl %.4f "
		"entropy %.3f clip %.3f grad_norm %.4f reg_share %.3g len %.2f tokens/s %.0f\n",
		cli_prog, s->step, s->reward_mean, s->reward_std, s->zero_var_share, s->kl,
		s->entropy, s->clip_frac, s->grad_norm, s->reg_share, s->resp_len,
		s->tokens_per_s);
	for (size_t i = 0; i < nev; i++)
		fprintf(stderr, "%s: step %" PRIu64 ": collapse rule %s fired (%.4g against "
			"%.4g for %u steps)\n", cli_prog, ev[i].step, ms_rl_rule_name(ev[i].rule),
			ev[i].value, ev[i].threshold, ev[i].window);
	if (!c->metrics)
		return MS_OK;
	if ((rc = ms_rl_metrics_json(s, &js, err)) != MS_OK)
		return rc;
	if (fprintf(c->metrics, "%s\n", js) < 0)
		rc = ms_err_set(err, MS_EIO, "'%s': write failed: %s", c->metrics_path,
				strerror(errno));
	ms_free(js);
	for (size_t i = 0; rc == MS_OK && i < nev; i++) {
		if ((rc = ms_rl_event_json(&ev[i], &js, err)) != MS_OK)
			break;
		if (fprintf(c->metrics, "{\"event\":%s}\n", js) < 0)
			rc = ms_err_set(err, MS_EIO, "'%s': write failed: %s", c->metrics_path,
					strerror(errno));
		ms_free(js);
	}
	if (rc == MS_OK && fflush(c->metrics))
		rc = ms_err_set(err, MS_EIO, "'%s': write failed: %s", c->metrics_path,
				strerror(errno));
	return rc;
}

static void on_ckpt(void *arg, const struct ms_train_ckpt *k)
{
	(void)arg;
	fprintf(stderr, "%s: checkpoint step %" PRIu64 ": '%s' registered as %.23s... (%s)\n",
		cli_prog, k->step, k->path, k->digest, k->label);
}

static void print_json(const struct ms_train_result *r)
{
	printf("{\"plan\":\"%s\",\"run\":%" PRId64 ",\"first_step\":%" PRIu64
	       ",\"last_step\":%" PRIu64 ",\"first_loss\":%.17g,\"last_loss\":%.17g,"
	       "\"tokens\":%" PRIu64 ",\"seconds\":%.3f,\"trainable_params\":%" PRIu64
	       ",\"states\":[", r->plan_digest, r->run_id, r->first_step, r->last_step,
	       r->first_loss, r->last_loss, r->tokens, r->seconds, r->nparams);
	for (size_t i = 0; i < r->nstates; i++) {
		const struct ms_train_state *s = &r->states[i];

		printf("%s{\"role\":", i ? "," : "");
		cli_json_str(stdout, s->role);
		/* a shard set whose unsharded adapter is not recorded has none */
		if (s->digest[0])
			printf(",\"state\":\"%s\",\"label\":", s->digest);
		else
			printf(",\"state\":null,\"label\":");
		if (s->label)
			cli_json_str(stdout, s->label);
		else
			printf("null");
		printf(",\"bytes\":%" PRIu64 "}", s->bytes);
	}
	printf("],\"checkpoints\":[");
	for (size_t i = 0; i < r->nckpts; i++) {
		const struct ms_train_ckpt *k = &r->ckpts[i];

		printf("%s{\"step\":%" PRIu64 ",\"path\":", i ? "," : "", k->step);
		cli_json_str(stdout, k->path);
		printf(",\"state\":\"%s\",\"label\":", k->digest);
		cli_json_str(stdout, k->label);
		printf("}");
	}
	printf("]}\n");
}

static void print_text(const struct ms_train_result *r)
{
	printf("plan %s%s", r->plan_digest, r->run_id ? "" : "\n");
	if (r->run_id)
		printf(" (run %" PRId64 ")\n", r->run_id);
	for (size_t i = 0; i < r->nstates; i++)
		printf("%-10s %s%s%s%s\n", r->states[i].role,
		       r->states[i].digest[0] ? r->states[i].digest : r->states[i].where,
		       r->states[i].label ? " (" : "", r->states[i].label ? r->states[i].label : "",
		       r->states[i].label ? ")" : "");
	if (r->rl)
		printf("GRPO steps %" PRIu64 "..%" PRIu64 ": mean reward %.4f -> %.4f, %" PRIu64
		       " monitor event(s)%s, %" PRIu64 " trainable parameters, %.1f s\n",
		       r->first_step, r->last_step, r->first_loss, r->last_loss, r->rl_events,
		       r->rl_stopped ? ", stopped by the monitor" : "", r->nparams, r->seconds);
	else
		printf("trained steps %" PRIu64 "..%" PRIu64 ": loss %.6f -> %.6f, %" PRIu64
		       " target tokens, %" PRIu64 " trainable parameters, %.1f s\n",
		       r->first_step, r->last_step, r->first_loss, r->last_loss, r->tokens,
		       r->nparams, r->seconds);
	for (size_t i = 0; i < r->nckpts; i++)
		printf("checkpoint step %" PRIu64 " %s %s (%s)\n", r->ckpts[i].step, r->ckpts[i].path,
		       r->ckpts[i].digest, r->ckpts[i].label);
}

/* --profile FILE: the device's time per phase and what it held (JSON) */
static int write_profile(const char *path, const struct ms_train_result *r,
			 struct ms_err *err)
{
	FILE *f;
	int bad;

	if (!r->profile)
		return ms_err_set(err, MS_EIO, "'%s': the run kept no profile", path);
	if (!(f = fopen(path, "w")))
		return ms_err_set(err, MS_EIO, "'%s': cannot create: %s", path, strerror(errno));
	bad = fputs(r->profile, f) < 0 || fputc('\n', f) < 0;
	if (fclose(f) || bad)
		return ms_err_set(err, MS_EIO, "'%s': write failed", path);
	return MS_OK;
}

static int cmd_train(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "plan", required_argument, NULL, 'p' },
		{ "db", required_argument, NULL, 'D' },
		{ "device", required_argument, NULL, 'd' },
		{ "colwise", required_argument, NULL, 'c' },
		{ "ep", required_argument, NULL, 'e' },
		{ "steps", required_argument, NULL, 's' },
		{ "resume", required_argument, NULL, 'r' },
		{ "metrics", required_argument, NULL, 'm' },
		{ "profile", required_argument, NULL, 'P' },
		{ "gpu-f32", no_argument, NULL, 'F' },
		{ "expert-gemm", required_argument, NULL, 'G' },
		{ "attention", required_argument, NULL, 'A' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct ms_train_opts o;
	struct ms_train_result res;
	struct ms_train_launch launch;
	struct train_ctx ctx = { 0 };
	struct ms_err err = { 0 };
	struct ms_inv *inv = NULL;
	const char *db = NULL, *profile = NULL;
	uint64_t v;
	int c, rc, stopped = 0, expert_gemm = 0, attention = 0;

	memset(&o, 0, sizeof(o));
	o.colwise = -1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			o.plan_path = optarg;
			break;
		case 'D':
			db = optarg;
			break;
		case 'd':
			if (ms_device_parse(optarg, &o.device) != MS_OK)
				return cli_usage("--device: '%s' is not cpu or cuda", optarg);
			break;
		case 'P':
			profile = optarg;
			break;
		case 'F':
			o.gpu_f32 = 1;
			break;
		case 'G':
			if (!strcmp(optarg, "grouped"))
				o.expert_gemm = MS_EXPERT_GEMM_GROUPED;
			else if (!strcmp(optarg, "fused"))
				o.expert_gemm = MS_EXPERT_GEMM_FUSED;
			else if (!strcmp(optarg, "per-expert"))
				o.expert_gemm = MS_EXPERT_GEMM_PER_EXPERT;
			else
				return cli_usage("--expert-gemm: '%s' is not per-expert, grouped or "
						 "fused", optarg);
			expert_gemm = 1;
			break;
		case 'A':
			if (!strcmp(optarg, "auto"))
				o.attention = MS_ATTENTION_AUTO;
			else if (!strcmp(optarg, "cudnn"))
				o.attention = MS_ATTENTION_CUDNN;
			else if (!strcmp(optarg, "flash"))
				o.attention = MS_ATTENTION_FLASH;
			else
				return cli_usage("--attention: '%s' is not auto, cudnn or flash", optarg);
			attention = 1;
			break;
		case 'c':
			if (!strcmp(optarg, "resident"))
				o.colwise = MS_COLWISE_RESIDENT;
			else if (!strcmp(optarg, "on-demand"))
				o.colwise = MS_COLWISE_ON_DEMAND;
			else
				return cli_usage("--colwise: '%s' is not resident or on-demand", optarg);
			break;
		case 'e':
			if (cli_u64("--ep", optarg, MS_FP_MAX_EP, &v))
				return CLI_USAGE;
			if (v == 0)
				return cli_usage("--ep: must be at least 1");
			o.ep_size = (uint32_t)v;
			break;
		case 's':
			if (cli_u64("--steps", optarg, MS_TRAIN_MAX_STEPS, &v))
				return CLI_USAGE;
			if (v == 0)
				return cli_usage("--steps: must be at least 1");
			o.stop_step = v;
			break;
		case 'r':
			o.resume = optarg;
			break;
		case 'm':
			ctx.metrics_path = optarg;
			break;
		case 'j':
			ctx.json = 1;
			break;
		case 'h':
			return cli_help();
		default:
			return cli_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc)
		return cli_usage("unexpected argument '%s'", argv[optind]);
	if (!o.plan_path)
		return cli_usage("--plan is required");
	if ((profile || o.gpu_f32 || expert_gemm || attention) && o.device != MS_DEVICE_CUDA)
		return cli_usage("--profile, --gpu-f32, --expert-gemm and --attention need --device "
				 "cuda");
	if (o.gpu_f32 && o.attention != MS_ATTENTION_AUTO)
		return cli_usage("--attention is a bf16 path; --gpu-f32 keeps the exact float32 "
				 "attention");
	if (o.gpu_f32 && o.expert_gemm != MS_EXPERT_GEMM_PER_EXPERT)
		return cli_usage("--expert-gemm %s is a bf16 path; --gpu-f32 takes float32 GEMMs",
				 o.expert_gemm == MS_EXPERT_GEMM_FUSED ? "fused" : "grouped");
	if ((rc = ms_train_launch_parse(environ, &launch, &err)) != MS_OK)
		return cli_fail(rc, &err);
	if ((rc = ms_inv_open(cli_db_path(db), 0, &inv, &err)) != MS_OK)
		goto out;
	if ((rc = ms_inv_set_origin(inv, "mstrain", argc, argv, &err)) != MS_OK)
		goto out;
	if (ctx.metrics_path && !(ctx.metrics = fopen(ctx.metrics_path, "w"))) {
		cli_errorf("'%s': cannot create: %s", ctx.metrics_path, strerror(errno));
		ms_inv_close(inv);
		ms_train_launch_release(&launch);
		return CLI_IO;
	}
	o.launch = &launch;
	o.on_step = on_step;
	o.on_ckpt = on_ckpt;
	o.on_rl_step = on_rl_step;
	o.ctx = &ctx;
	rc = ms_train_run(inv, &o, &res, &err);
	if (rc == MS_OK) {
		if (ctx.json)
			print_json(&res);
		else
			print_text(&res);
		stopped = res.rl_stopped;
		if (profile && (rc = write_profile(profile, &res, &err)) != MS_OK) {
			ms_train_result_release(&res);
			goto out;
		}
	}
	ms_train_result_release(&res);
out:
	ms_inv_close(inv);
	ms_train_launch_release(&launch);
	if (ctx.metrics && fclose(ctx.metrics) && rc == MS_OK) {
		cli_errorf("'%s': write failed", ctx.metrics_path);
		return CLI_IO;
	}
	if (rc == MS_OK && stopped)
		return MSTRAIN_RL_STOPPED;
	return cli_fail(rc, &err);
}

static const struct cli_cmd cmds[] = {
	{ "train", cmd_train,
	  "train --plan PLAN [--db PATH] [--device cpu|cuda] [--colwise resident|on-demand] [--ep N] "
	  "[--steps N] [--resume CKPT] [--metrics FILE] [--profile FILE] [--gpu-f32] "
	  "[--expert-gemm per-expert|grouped|fused] [--attention auto|cudnn|flash] [--json]",
	  "train a LoRA adapter on the plan's verified states",
	  "--plan PLAN\tthe run plan (states, train section, outputs)\n"
	  "--device cpu|cuda\twhere to train: the CPU reference path, or one GPU (default cpu)\n"
	  "--colwise resident|on-demand\tcolumnwise NVFP4 kept resident or built per layer (default: the plan's)\n"
	  "--ep N\texpert-parallel virtual ranks in this process (default: the plan's ep_size)\n"
	  "--steps N\tstop after optimizer step N, with a checkpoint (the schedule spans the plan's steps)\n"
	  "--resume CKPT\tcontinue exactly from a checkpoint directory\n"
	  "--metrics FILE\tone JSON line of metrics per step\n"
	  "--profile FILE\tcuda: time per phase and device memory held, as JSON\n"
	  "--gpu-f32\tcuda: float32 GEMMs instead of bf16 tensor cores (the tests' mode)\n"
	  "--expert-gemm per-expert|grouped|fused\tcuda, bf16: the experts' weights decoded per "
	  "layer, then a CUTLASS grouped GEMM a product on sm_90 or one cuBLAS GEMM per expert "
	  "(per-expert, the default), or the project's grouped launch over the routing counts on "
	  "the device, its NVFP4 weights decoded per layer (grouped) or inside the GEMM (fused)\n"
	  "--attention auto|cudnn|flash\tcuda, bf16: causal attention through cuDNN's fused SDPA "
	  "(libcudnn.so.9, deterministic backward) or the project's flash kernels; auto (the "
	  "default) takes cuDNN's where it loads and has a plan for the shape\n" },
};

int main(int argc, char **argv)
{
	static const struct cli_tool tool = {
		"mstrain", "LoRA training on a frozen NVFP4 MoE base, from inventory-verified states.",
		cmds, sizeof(cmds) / sizeof(cmds[0]),
	};

	return cli_main(&tool, argc, argv);
}
