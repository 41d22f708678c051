#!/bin/sh
# mstrain GRPO runs (train.rl) from the command line on the bundled
# Qwen3-MoE checkpoint: under msinv launch, a KL weight that drowns the
# policy signal fires the reg_share rule, recorded as an rl_collapse event
# of the run (in the inventory and its audit log), written to the metrics
# file and, with monitor.stop, ends the run with exit code 4 after a
# checkpoint; the same plan without the KL term raises the reward with no
# event; msinv run shows a run's events with the collapse spelt out; bad
# rl keys are one line and exit 2.
. "$(dirname "$0")/lib.sh"
export MSINV_DB="$W/inv.db"

q() { sqlite3 "$MSINV_DB" "$1"; }
# a plan: FILE STEPS KL STOP [EXTRA rl keys]
plan() {
	cat >"$1" <<EOF
{"ep_size": 1, "outputs": "runs/$(basename "$1" .json)",
 "states": [{"role": "base", "state": "base"}],
 "train": {"lora": {"r": 4, "alpha": 8, "targets": ["experts", "q_proj", "k_proj", "v_proj", "o_proj"]},
           "optimizer": {"lr": 3e-2, "weight_decay": 0, "clip": 1.0, "schedule": "constant"},
           "steps": $2, "seed": 0, "data": {"task": "copy"}, "label": "$(basename "$1" .json)",
           "rl": {"prompts": 4, "group": 4, "prompt_len": 2, "max_new": 3,
                  "temperature": 0.25, "format_bonus": 1, "kl_coef": $3 $5,
                  "monitor": {"window": 5, "reg_share_max": 1, "stop": $4}}}}
EOF
}
mean() { # FILE FROM TO: mean reward of those steps
	python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
r = [x["reward_mean"] for x in r if "step" in x and int(sys.argv[2]) <= x["step"] <= int(sys.argv[3])]
print(sum(r) / len(r))' "$@"
}

cd "$W" || exit 3
cp -r "$FX/hf/qwen3moe" base
expect 0 "$B/msinv" init
expect 0 "$B/msinv" add --label base base

# healthy: reward goes up, no event
plan h.json 40 0 false
expect 0 "$B/msinv" launch --plan h.json -- "$B/mstrain" train --plan h.json --metrics h.jsonl
run=$(q "SELECT max(id) FROM runs")
first=$(mean h.jsonl 1 10); last=$(mean h.jsonl 31 40)
python3 -c "import sys; sys.exit(0 if $last > $first + 0.1 else 1)" && ok ||
	bad "healthy GRPO run did not learn: mean reward $first -> $last"
[ "$(q "SELECT count(*) FROM events WHERE run_id = $run AND kind = 'rl_collapse'")" = 0 ] && ok ||
	bad "an event on the healthy run"
[ "$(q "SELECT status FROM runs WHERE id = $run")" = ok ] && ok || bad "healthy run not ok"
q "SELECT data FROM events WHERE run_id = $run AND kind = 'train_summary'" >ev
has '"rl_events":0,"rl_stopped":false' ev "healthy summary"
grep -q '"event"' h.jsonl && bad "event line in the healthy metrics" || ok

# KL 5: the rule fires; recorded on the run; the run goes on (stop false)
plan k.json 20 5 false
expect 0 "$B/msinv" launch --plan k.json -- "$B/mstrain" train --plan k.json --metrics k.jsonl
run=$(q "SELECT max(id) FROM runs")
q "SELECT data FROM events WHERE run_id = $run AND kind = 'rl_collapse'" >ev
has '"rule":"reg_share"' ev "rl_collapse event of the run"
has '"window":5' ev "event window"
has '{"event":{"rule":"reg_share"' k.jsonl "event in the metrics file"
has "collapse rule reg_share fired" "$W/err" "progress line names the rule"
[ "$(python3 -c 'import json,sys; print(sum(1 for l in open("k.jsonl") if "\"step\"" in l and "event" not in l))')" = 20 ] && ok ||
	bad "KL run without stop did not run its 20 steps"
expect 0 "$B/msinv" log
has "rl_collapse" "$W/out" "msinv log shows the event"
expect 0 "$B/msinv" run "$run"
has "^status   ok (exit 0)" "$W/out" "msinv run: status"
has "rl_collapse" "$W/out" "msinv run: the event"
has "train_summary" "$W/out" "msinv run: the summary event"
has "^  reg_share  step [0-9]*: .* against 1 for 5 steps" "$W/out" "msinv run: the collapse spelt out"
expect 0 "$B/msinv" run --json "$run"
python3 -c '
import json, sys
o = json.load(open(sys.argv[1]))
k = [e["kind"] for e in o["events"]]
assert o["run"] == int(sys.argv[2]) and "rl_collapse" in k and "train_summary" in k, o
assert [e for e in o["events"] if e["kind"] == "rl_collapse"][0]["data"]["rule"] == "reg_share"
' "$W/out" "$run" && ok || bad "msinv run --json"
expect 2 "$B/msinv" run 99999
has "no run 99999" "$W/err" "msinv run: unknown run"
expect 2 "$B/msinv" run x

# GRPO with --device cuda on a machine without a GPU (or a build without
# nvcc): one line, exit 3, nothing left (the GPU tier runs GRPO for real)
if ! nvidia-smi -L >/dev/null 2>&1; then
	plan g.json 3 0 false
	expect 3 "$B/mstrain" train --plan g.json --device cuda
	has "gpu" "$W/err" "GRPO on a machine without a GPU"
	one_line "GRPO on a machine without a GPU"
	[ ! -e runs/g ] && ok || bad "a refused GPU GRPO run left runs/g"
fi

# with monitor.stop: exit 4 after a checkpoint of the step that fired
plan s.json 20 5 true
expect 4 "$B/mstrain" train --plan s.json --metrics s.jsonl
step=$(python3 -c 'import json; print([json.loads(l)["event"]["step"] for l in open("s.jsonl") if "event" in l][0])')
[ -d "runs/s/step-$(printf %06d "$step")" ] && ok || bad "no checkpoint at the stopping step $step"
[ "$(q "SELECT count(*) FROM states WHERE label = 's-step$step'")" = 1 ] && ok || bad "stop checkpoint not registered"
plan s2.json 20 5 true
expect 4 "$B/msinv" launch --plan s2.json -- "$B/mstrain" train --plan s2.json
run=$(q "SELECT max(id) FROM runs")
[ "$(q "SELECT exit_code FROM runs WHERE id = $run")" = 4 ] && ok || bad "launch did not record exit 4"

# an external reward: the first answer symbol right; run in the plan's
# directory; bad output is one line naming the command, exit 2
cat >first.py <<'PY'
import json, sys
for line in sys.stdin:
    o = json.loads(line)
    c, a = o["completion"], o["answer"]
    assert o["task"] == "copy" and len(o["prompt"]) == 3 and len(a) == 2
    print(1.0 if c and c[0] == a[0] else 0.0)
PY
plan x.json 3 0 false ', "reward_command": "python3 first.py"'
mkdir -p elsewhere
(cd elsewhere && expect 0 "$B/mstrain" train --plan ../x.json --metrics ../x.jsonl)
[ "$(grep -c '"reward_mean"' x.jsonl)" = 3 ] && ok || bad "external reward run"
for bad_cmd in "echo abc:line 1: 'abc' is not a finite number" \
	"echo 1:1 rewards for 16 completions" \
	"exit 3:exited with status 3" \
	"yes 1 | head -n 17:more than 16 lines"; do
	c=${bad_cmd%%:*}; msg=${bad_cmd#*:}
	plan xb.json 3 0 false ", \"reward_command\": \"$c\""
	rm -rf runs/xb
	expect 2 "$B/mstrain" train --plan xb.json
	has "reward command '$c': $msg" "$W/err" "bad reward command output"
	[ "$(wc -l <"$W/err")" -eq 1 ] && ok || { bad "reward command '$c': not one line"; cat "$W/err"; }
	[ ! -d runs/xb ] && ok || bad "reward command '$c': a checkpoint was written"
done

# bad rl keys: one line, exit 2
plan b1.json 5 0 false ', "kl_estimator": "k2"'
expect 2 "$B/mstrain" train --plan b1.json
has "train.rl.kl_estimator" "$W/err" "bad estimator named"
[ "$(wc -l <"$W/err")" -eq 1 ] && ok || bad "bad estimator: not one line"
plan b2.json 5 0 false ', "groups": 4'
expect 2 "$B/mstrain" train --plan b2.json
has "train.rl.groups': unknown key" "$W/err" "unknown rl key"
plan b3.json 5 0 false ', "group": 1'
expect 2 "$B/mstrain" train --plan b3.json
has "train.rl.group" "$W/err" "group of 1 refused"

echo "mstrain_rl: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
