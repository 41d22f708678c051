#!/bin/sh
# tools/bench/train_report.py (the trainer bench's table, make
# bench-train-gpu) on a run directory made up here: our step time is the
# median of the steps after the warm-up and every ratio follows from it; a
# mode asked for without metrics is "left out", one not asked for "not
# run", PyTorch's rows come from torch.txt; the per-phase and the
# launch-by-launch tables sort by time, and a launch site is named by the
# kernel launched above its line in kernels/train.cu. A directory without
# config.json is exit 3.
. "$(dirname "$0")/lib.sh"
R=$ROOT/tools/bench/train_report.py
cfg=$FX/train/qwen3moe/base/config.json
[ -f "$cfg" ] || cfg=$FX/hf/qwen3moe/config.json
# a run directory DIR with the model's config and MODE's metrics, a
# step each of SECONDS: rundir DIR MODE SECONDS...
rundir() {
	d=$1 m=$2
	shift 2
	mkdir -p "$d" && cp "$cfg" "$d/config.json" || exit 3
	i=0
	for s in "$@"; do
		i=$((i + 1))
		echo "{\"step\": $i, \"seconds\": $s, \"loss\": 2.5}" >>"$d/m-$m.jsonl"
	done
}
D=$W/run
# resident: steps of 0.5, 0.1, 0.2, 0.3, 0.4 s: after 2 warm-up steps the
# median of 0.2, 0.3, 0.4 is 0.3 s
rundir "$D" resident 0.5 0.1 0.2 0.3 0.4
# launch sites of the tree to resolve: the check (LK) after the first
# k_gather launch, after the first call of rms_bwd (a host function
# that launches k_rms_bwd), and after the first call of rope_norm_bwd
# (one that launches either form of k_rope_norm_bwd)
lk_after() { awk -v p="$1" 'index($0, p) { f = 1 } f && /LK\(\);/ { print NR; exit }' \
	"$ROOT/kernels/train.cu"; }
line=$(lk_after 'k_gather<<<')
line2=$(lk_after 'rms_bwd(g, ')
line3=$(lk_after 'rope_norm_bwd(g->st, ')
python3 - "$D" "$line" "$line2" "$line3" <<'PY'
import json, os, sys
d, line, line2, line3 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
json.dump({"step_ms": 310.0, "steps": 4, "peak_bytes": 2 * 2**30,
           "kernels": [{"name": "small", "ms": 10.0, "calls": 4},
                       {"name": "big", "ms": 200.0, "calls": 40}]},
          open(os.path.join(d, "prof-resident.json"), "w"))
json.dump({"step_ms": 320.0, "steps": 4,
           "sites": [{"site": "launch at train.cu:%d" % line, "ms": 5.0, "calls": 8},
                     {"site": "launch at train.cu:%d" % line2, "ms": 0.5, "calls": 4},
                     {"site": "launch at train.cu:%d" % line3, "ms": 0.25, "calls": 4},
                     {"site": "cuDNN SDPA backward", "ms": 50.0, "idle_ms": 1.5,
                      "calls": 64}]},
          open(os.path.join(d, "prof-sites.json"), "w"))
PY
cat >"$D/torch.txt" <<'T'
TORCH_EAGER ms=600.0 steps=10 loss=2.6 peak_alloc=4294967296 peak_reserved=5368709120
TORCH_COMPILE failed: no compiler here
VERSIONS torch=2.11 transformers=5.17 peft=0.21 cuda=13.0
T
# nvidia-smi's samples: an idle one (under 40% of the limit) and a line
# without numbers are left out; the power cap and a thermal slowdown are
# counted from the bit mask; on-demand's has no row to go with (no metrics)
cat >"$D/smi-resident.csv" <<'C'
1980, 1980, 90.5, 700.00, 0x0000000000000000
1845, 1980, 620.1, 700.00, 0x0000000000000004
[N/A], 1980, 612.0, 700.00, 0x0000000000000004
1530, 1980, 699.0, 700.00, 0x0000000000000004
1980, 1980, 450.0, 700.00, 0x0000000000000000
1700, 1980, 500.0, 700.00, 0x0000000000000024
C
echo "1980, 1980, 650.0, 700.00, 0x0000000000000004" >"$D/smi-on-demand.csv"
echo "1980, 1980, 400.0, 700.00, 0x0000000000000000" >"$D/smi-torch.csv"
expect 0 python3 "$R" "$D" --batch 2 --seq 16 --steps 5 --device test --date today \
	--modes "resident on-demand" --out "$W/r.md"
has '| ours, resident | 4 | 1845 (1530-1980) | 1980 | 620 (699) | 700 | 3 of 4 | 1 of 4 |' \
	"$W/r.md" "the clock and power under load"
has '| PyTorch (its eager and compiled runs together) | 1 | 1980 (1980-1980) | 1980 | 400 (400) | 700 | 0 of 1 | 0 of 1 |' \
	"$W/r.md" "PyTorch's clock"
hasnt '| ours, on-demand |' "$W/r.md" "a clock row for a run without a row"
has '| ours, colwise resident (mstrain --device cuda) | 300.0 |' "$W/r.md" "our median step"
has '| 2.00x |' "$W/r.md" "the ratio to eager"
has 'ours, on-demand: no timed step' "$W/r.md" "a mode asked for without metrics"
has 'ours, grouped: not run' "$W/r.md" "a mode not asked for"
has 'torch.compile of the same (mode default): failed: no compiler here' "$W/r.md" "a failed PyTorch row"
has "| \`k_gather (train.cu:$line)\` | 5.000 | 0.000 | 2 |" "$W/r.md" "a launch site by its kernel"
has "| \`k_rms_bwd (train.cu:$line2)\` | 0.500 | 0.000 | 1 |" "$W/r.md" "a launch through a host function"
has "| \`k_rope_norm_bwd (train.cu:$line3)\` | 0.250 | 0.000 | 1 |" "$W/r.md" "a launch through a host function of a kernel family"
has '| `cuDNN SDPA backward` | 50.000 | 1.500 | 16 | 89.7% |' "$W/r.md" "a library call's site, its GPU idle"
# the tables sort by time
[ "$(grep -n '`big`' "$W/r.md" | cut -d: -f1)" -lt "$(grep -n '`small`' "$W/r.md" | cut -d: -f1)" ] &&
	ok || bad "the phase table is not sorted by time"
[ "$(grep -n 'SDPA backward' "$W/r.md" | cut -d: -f1)" -lt "$(grep -n 'k_gather (' "$W/r.md" | cut -d: -f1)" ] &&
	ok || bad "the launch table is not sorted by time"
# no sites file: no launch table
rm "$D/prof-sites.json"
expect 0 python3 "$R" "$D" --batch 2 --seq 16 --steps 5 --device test --date today \
	--modes resident --out "$W/r2.md"
hasnt 'launch by launch' "$W/r2.md" "a launch table without its profile"
# samples none of which is under load: no clock table
for f in resident torch; do echo "210, 1980, 80.0, 700.00, 0x0000000000000000" >"$D/smi-$f.csv"; done
expect 0 python3 "$R" "$D" --batch 2 --seq 16 --steps 5 --device test --date today \
	--modes resident --out "$W/r5.md"
hasnt 'clock and power' "$W/r5.md" "a clock table without a sample under load"
# the decode ahead: the on-demand transpose ran on the decode stream (its
# time and the main stream's wait for it said apart), and that stream's
# phases are summed apart from the main stream's
D2=$W/run2
rundir "$D2" on-demand 0.5 0.1 0.2 0.2 0.2
python3 - "$D2" <<'PY'
import json, os, sys
json.dump({"step_ms": 200.0, "steps": 3, "colwise_ms": 8.0, "colwise_stream": "decode",
           "decode_wait_ms": 1.0,
           "kernels": [{"name": "big", "ms": 150.0, "calls": 40, "stream": "main"},
                       {"name": "wait for the decode stream", "ms": 1.0, "calls": 32,
                        "stream": "main"},
                       {"name": "columnwise transpose (on demand, decode stream)",
                        "ms": 8.0, "calls": 16, "stream": "decode"}]},
          open(os.path.join(sys.argv[1], "prof-on-demand.json"), "w"))
PY
expect 0 python3 "$R" "$D2" --batch 2 --seq 16 --steps 5 --device test --date today \
	--modes on-demand --out "$W/r4.md"
has 'took 8.00 ms a step on the decode stream' "$W/r4.md" "the transpose on the decode stream"
has 'waited 1.00 ms a step in all' "$W/r4.md" "the main stream's wait for it"
has "the main stream's kernels: 151.0 ms (75.5%); beside them, the decode stream's" \
	"$W/r4.md" "the decode stream's phases summed apart"
rm "$D/config.json"
expect 3 python3 "$R" "$D" --batch 2 --seq 16 --steps 5 --device test --date today --out "$W/r3.md"

echo "$t_name: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
