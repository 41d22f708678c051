#!/bin/sh
# mstrain_rl_gpu.sh (make test-gpu): GRPO runs on the GPU model
# (--device cuda, bf16 GEMMs over the bundled Qwen3-MoE's NVFP4 copy),
# rollouts decoded on the device, under msinv launch: without a KL term
# the reward goes up with no monitor event; with a KL weight that drowns
# the policy signal the reg_share rule fires and is recorded on the run,
# and with monitor.stop the run ends with exit 4 after a checkpoint. The
# CPU's counterpart is mstrain_rl.sh. Skipped without a GPU.
. "$(dirname "$0")/lib.sh"
nvidia-smi -L >/dev/null 2>&1 || skip "no GPU"
export MSINV_DB="$W/inv.db"

# a plan: FILE STEPS KL STOP
plan() {
	cat >"$1" <<P
{"ep_size": 1, "outputs": "runs/$(basename "$1" .json)",
 "states": [{"role": "base", "state": "base"}, {"role": "quantized", "state": "quant"}],
 "train": {"lora": {"r": 4, "alpha": 8, "targets": ["experts", "q_proj", "k_proj", "v_proj", "o_proj"]},
           "optimizer": {"lr": 3e-2, "weight_decay": 0, "clip": 1.0, "schedule": "constant"},
           "steps": $2, "seed": 0, "data": {"task": "copy"}, "label": "$(basename "$1" .json)",
           "rl": {"prompts": 4, "group": 4, "prompt_len": 2, "max_new": 3,
                  "temperature": 0.25, "format_bonus": 1, "kl_coef": $3,
                  "monitor": {"window": 5, "reg_share_max": 1, "stop": $4}}}}
P
}
mean() { # FILE FROM TO: mean reward of those steps
	python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
r = [x["reward_mean"] for x in r if "step" in x and int(sys.argv[2]) <= x["step"] <= int(sys.argv[3])]
print(sum(r) / len(r))' "$@"
}

FXA=$(cd "$FX" && pwd)
cd "$W" || exit 3
base=$FXA/train/qwen3moe/base
[ -d "$base" ] || base=$FXA/hf/qwen3moe
cp -r "$base" base && cp -r "$FXA/train/qwen3moe/quant" quant || exit 3
expect 0 "$B/msinv" init
expect 0 "$B/msinv" add --label base base
expect 0 "$B/msinv" add --label quant quant

# healthy: reward goes up, no event
plan h.json 40 0 false
expect 0 "$B/msinv" launch --plan h.json -- "$B/mstrain" train --plan h.json --device cuda \
	--metrics h.jsonl
run=$(inv_query "SELECT max(id) FROM runs")
first=$(mean h.jsonl 1 10); last=$(mean h.jsonl 31 40)
echo "  GPU GRPO, no KL: mean reward $first (steps 1-10) -> $last (31-40)"
python3 -c "import sys; sys.exit(0 if $last > $first + 0.1 else 1)" && ok ||
	bad "healthy GPU GRPO run did not learn: mean reward $first -> $last"
[ "$(inv_query "SELECT count(*) FROM events WHERE run_id = $run AND kind = 'rl_collapse'")" = 0 ] && ok ||
	bad "an event on the healthy GPU run"
[ "$(inv_query "SELECT status FROM runs WHERE id = $run")" = ok ] && ok || bad "healthy GPU run not ok"

# KL 5 with monitor.stop: the rule fires, exit 4 after a checkpoint
plan s.json 20 5 true
expect 4 "$B/msinv" launch --plan s.json -- "$B/mstrain" train --plan s.json --device cuda \
	--metrics s.jsonl
run=$(inv_query "SELECT max(id) FROM runs")
has '{"event":{"rule":"reg_share"' s.jsonl "GPU event in the metrics file"
step=$(python3 -c 'import json; print([json.loads(l)["event"]["step"] for l in open("s.jsonl") if "event" in l][0])')
echo "  GPU GRPO, KL 5: reg_share fired at step $step"
[ -d "runs/s/step-$(printf %06d "$step")" ] && ok || bad "no checkpoint at the stopping step $step"
[ "$(inv_query "SELECT count(*) FROM events WHERE run_id = $run AND kind = 'rl_collapse'")" -ge 1 ] && ok ||
	bad "no rl_collapse event on the GPU run"
echo "mstrain_rl_gpu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
