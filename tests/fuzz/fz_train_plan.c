/*
 * fz_train_plan.c: fuzz target for the parser of the run plan's "train"
 * section (ms_train_plan_parse, src/train/run.h). The input is the plan
 * file's bytes. A rejection must be one line naming the plan, MS_EINVAL
 * (or MS_ENOMEM), with nothing left allocated; an accepted section must
 * hold what the header promises: every field in its range, the optimizer
 * configuration one AdamW accepts, a data source that is exactly a task or
 * a file (resolved against the plan's directory), a label the inventory
 * accepts with "-step<N>" appended. The accepted hyper-parameters then
 * drive the schedule over the whole run, which must stay finite and within
 * [0, lr].
 */
#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "train/run.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define LABEL "fuzz-train.json"
#define DIR "/plans"

static void check(const struct ms_train_plan *p)
{
	struct ms_err err = {0};
	const uint32_t all = MS_LORA_EXPERTS | MS_LORA_Q | MS_LORA_K | MS_LORA_V | MS_LORA_O;
	uint64_t probe[] = {0, 1, p->optim.warmup, p->optim.warmup + 1, p->steps / 2,
			    p->steps - 1, p->steps, p->steps + 7};

	assert(p->lora.r >= 1 && p->lora.r <= 65536);
	assert(p->lora.alpha > 0 && isfinite(p->lora.alpha));
	assert(p->lora.dropout >= 0 && p->lora.dropout < 1);
	assert(p->lora.targets && !(p->lora.targets & ~all));
	assert(p->lora.seed == p->seed);
	assert(ms_adamw_cfg_check(&p->optim, &err) == MS_OK);
	assert(p->optim.total_steps == p->steps);
	assert(p->steps >= 1 && p->steps <= MS_TRAIN_MAX_STEPS);
	assert(p->batch >= 1 && p->batch <= MS_TRAIN_MAX_BATCH);
	assert(p->seq_len >= 2 && p->seq_len <= MS_DATA_MAX_SEQ);
	assert(p->grad_accum >= 1);
	assert(p->checkpoint_every <= MS_TRAIN_MAX_STEPS);
	assert(p->colwise == MS_COLWISE_RESIDENT || p->colwise == MS_COLWISE_ON_DEMAND);
	if (p->task == MS_TASK_JSONL)
		assert(p->jsonl && (p->jsonl[0] == '/'));
	else
		assert(!p->jsonl && p->task >= MS_TASK_COPY && p->task <= MS_TASK_MODSUM);
	assert(p->label && *p->label && strlen(p->label) + 16 <= MS_INV_MAX_LABEL);
	assert(strncmp(p->label, "sha256:", 7) != 0);
	for (size_t i = 0; i < sizeof(probe) / sizeof(probe[0]); i++) {
		double lr = ms_sched_lr(&p->optim, probe[i]);

		assert(isfinite(lr) && lr >= 0 && lr <= p->optim.lr * (1 + 1e-12));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ms_train_plan p;
	struct ms_err err = {0};
	int rc;

	rc = ms_train_plan_parse((const char *)data, size, LABEL, DIR, &p, &err);
	if (rc != MS_OK) {
		assert(rc == MS_EINVAL || rc == MS_ENOMEM);
		assert(err.code == rc && err.msg[0] && strchr(err.msg, '\n') == NULL);
		if (rc == MS_EINVAL)
			assert(strstr(err.msg, LABEL) != NULL);
		assert(p.jsonl == NULL && p.label == NULL);
		assert(ms_train_plan_parse((const char *)data, size, LABEL, DIR, &p, NULL) == rc);
		return 0;
	}
	check(&p);
	ms_train_plan_release(&p);
	return 0;
}
