#!/bin/sh
# bench_train_gpu.sh (make bench-train-gpu): the LoRA training step of
# mstrain on the GPU against the fastest stock PyTorch path on the same GPU,
# on a generated Qwen3-MoE-shaped model, and tools/bench/RESULTS-train-gpu.md.
#
#   BUILD=dir sh tools/bench/bench_train_gpu.sh [--device cuda|cpu]
#
# In a temporary directory: the model (gen_train_model.py, bf16, built by
# transformers), its NVFP4 copy (msconvert, 2D blocks, rowwise), both
# registered in an inventory of their own and verified; a JSONL of random
# token ids (gen_train_data.py) both sides train on; then for each
# columnwise mode (resident, on-demand) one mstrain run under msinv launch,
# with --metrics and, when this mstrain has it, --profile; then
# train_torch.py (transformers + PEFT, grouped_mm experts, and
# torch.compile) on the same bf16 checkpoint. Our step time is the median of
# the steps after the first two (warm-up). train_report.py writes the table.
#
# --device: mstrain's (default cuda); with cpu the PyTorch reference and the
# quantizer run on the CPU too, which only makes sense at MS_BENCH_TINY=1.
# MS_BENCH_TINY=1: a tiny model (hidden 64, 2 layers, 8 experts top-2,
# vocab 128), batch 2 x 32, 3 steps: checks the orchestration, not the speed.
# MS_BENCH_TRAIN_STEPS (default 12): mstrain's steps; MS_BENCH_TORCH_STEPS
# (default 10): train_torch.py's timed steps; MS_BENCH_TORCH_COMPILE=0
# skips torch.compile; MS_BENCH_PEAK (default 782): the bf16 matrix peak in
# TFLOP/s. PYTHON: the interpreter with torch, transformers and peft (default
# python3): needed for the model, so without it nothing runs.
# MS_BENCH_OUT: where the table goes; by default tools/bench/RESULTS-train-gpu.md
# for the full-size cuda run, and for any other run only the standard output
# (a CPU or tiny table is no record).
# MS_BENCH_DIR: work there and keep it (default: a temporary directory,
# removed): what is done there (the preparation, each mstrain mode, the
# PyTorch runs) is not done again, so a run cut short continues, and the
# parts can run in separate calls: MS_BENCH_PARTS (default "ours torch")
# names those to run this time ("" prepares only); the table is written
# from everything the directory holds. MS_BENCH_MODES: which of our runs
# (resident on-demand flash grouped fused; default all this mstrain has).
# With the resident run, a short one more under MS_PROFILE_SITES gives the
# time of each launch (prof-sites.json; MS_BENCH_SITES=0: not run).
# Where nvidia-smi is, the SM clock, power and throttle reasons are sampled
# every 100 ms through each timed run (smi-<run>.csv): the H200 runs a
# training step at its power limit, so the clock a run was given is part
# of its result.
# Exit 0; 1 when a run failed (its row left out); 2 on bad usage; 3 when
# something needed is missing.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 3
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD;; esac
DEV=cuda
while [ $# -gt 0 ]; do
	case $1 in
	--device) [ $# -ge 2 ] || { echo "bench-train-gpu: --device needs cuda or cpu" >&2; exit 2; }
		DEV=$2; shift 2;;
	--device=*) DEV=${1#--device=}; shift;;
	*) echo "bench-train-gpu: unknown argument '$1' (usage: bench_train_gpu.sh [--device cuda|cpu])" >&2
		exit 2;;
	esac
done
case $DEV in cuda|cpu) ;; *) echo "bench-train-gpu: --device '$DEV': cuda or cpu" >&2; exit 2;; esac
PY=${PYTHON:-python3}
B=tools/bench
TINY=${MS_BENCH_TINY:-0}
PEAK=${MS_BENCH_PEAK:-782}
WARM=2
if [ "$TINY" = 1 ]; then
	GEN="--hidden 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 16 --experts 8 --top-k 2 --moe-inter 32 --vocab 128 --max-pos 64"
	BATCH=2 SEQ=32
	STEPS=${MS_BENCH_TRAIN_STEPS:-3}
	TSTEPS=${MS_BENCH_TORCH_STEPS:-3}
	TWARM=1
else
	GEN=""
	BATCH=4 SEQ=2048
	STEPS=${MS_BENCH_TRAIN_STEPS:-12}
	TSTEPS=${MS_BENCH_TORCH_STEPS:-10}
	TWARM=3
fi
OUT=${MS_BENCH_OUT:-}
if [ -z "$OUT" ] && [ "$DEV" = cuda ] && [ "$TINY" != 1 ]; then
	OUT=$ROOT/$B/RESULTS-train-gpu.md
fi

for p in msinv msconvert mstrain msverify; do
	[ -x "$BUILD/$p" ] || { echo "bench-train-gpu: no $BUILD/$p (make first)" >&2; exit 3; }
done
if ! "$PY" -c 'import torch, transformers, peft' 2>/dev/null; then
	echo "bench-train-gpu: $PY cannot import torch, transformers and peft (PYTHON=...): no model can be generated" >&2
	exit 3
fi
if [ "$DEV" = cuda ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	echo "bench-train-gpu: torch sees no CUDA device (--device cpu with MS_BENCH_TINY=1 checks the script without one)" >&2
	exit 3
fi
PARTS=${MS_BENCH_PARTS-ours torch}
for p in $PARTS; do
	case $p in ours|torch) ;; *) echo "bench-train-gpu: MS_BENCH_PARTS: '$p' is not ours or torch" >&2; exit 2;; esac
done
if [ -n "${MS_BENCH_DIR:-}" ]; then
	case $MS_BENCH_DIR in /*) W=$MS_BENCH_DIR;; *) W=$ROOT/$MS_BENCH_DIR;; esac
	mkdir -p "$W" || exit 3
	# a directory prepared for another shape is not reused
	SHAPE="device=$DEV tiny=$TINY batch=$BATCH seq=$SEQ steps=$STEPS"
	if [ -f "$W/shape" ] && [ "$(cat "$W/shape")" != "$SHAPE" ]; then
		echo "bench-train-gpu: $W was prepared for $(cat "$W/shape"), not $SHAPE: use another MS_BENCH_DIR" >&2
		exit 2
	fi
	echo "$SHAPE" >"$W/shape" || exit 3
else
	W=$(mktemp -d "${TMPDIR:-/tmp}/bench-train.XXXXXX") || exit 3
	trap 'rm -rf "$W"' EXIT INT TERM
fi
export MSINV_DB="$W/inv.db"
status=0
# step NAME CMD...: run CMD, its output in $W/NAME.log; on failure the
# log's tail and exit 3 (nothing after it can run)
step() {
	_n=$1; shift
	if ! "$@" >"$W/$_n.log" 2>&1; then
		echo "bench-train-gpu: $_n failed: $*" >&2
		tail -n 20 "$W/$_n.log" | sed 's/^/  /' >&2
		exit 3
	fi
}

cd "$W" || exit 3
# the preparation, once per directory (prepared.done)
if [ ! -f prepared.done ]; then
	rm -rf base base-nvfp4 inv.db inv.db-* runs
	echo "bench-train-gpu: generating the model ($W/base)" >&2
	# shellcheck disable=SC2086 # GEN is a list of options
	step gen "$PY" "$ROOT/$B/gen_train_model.py" base $GEN --device "$DEV"
	sed -n 's/^PARAMS /parameters: /p' gen.log >&2
	cp base/config.json config.json || exit 3
	step init "$BUILD/msinv" init
	step add-base "$BUILD/msinv" add --label base base
	echo "bench-train-gpu: quantizing (msconvert, --device $DEV)" >&2
	step quantize "$BUILD/msconvert" quantize base -o base-nvfp4 --block 2d --layout rowwise --device "$DEV"
	step add-nvfp4 "$BUILD/msinv" add --label base-nvfp4 base-nvfp4
	step verify "$BUILD/msverify" files base base-nvfp4
	# the ids both sides train on: uniform over the vocabulary, so that the
	# routing spreads tokens as a real batch does (the synthetic tasks use
	# ten symbols); one sequence per example of the run (mstrain takes them
	# in an order of its own, train_torch.py in file order)
	VOCAB=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' config.json) || exit 3
	step data python3 "$ROOT/$B/gen_train_data.py" data.jsonl --vocab "$VOCAB" --seq "$SEQ" \
		--examples "$((BATCH * STEPS))" --seed 1
	: >prepared.done
fi
# a plan per columnwise mode: each run registers its own adapter under its
# own label and output directory
plan() { # RUN COLWISE
	cat >"plan-$1.json" <<EOF
{"ep_size": 1, "outputs": "runs/$1",
 "states": [{"role": "base", "state": "base"}, {"role": "quantized", "state": "base-nvfp4"}],
 "train": {"lora": {"r": 16, "alpha": 32, "dropout": 0.0, "targets": ["experts", "q_proj", "v_proj"]},
           "optimizer": {"lr": 1e-4, "weight_decay": 0.0, "clip": 1.0, "warmup": 0},
           "batch": $BATCH, "seq_len": $SEQ, "grad_accum": 1, "steps": $STEPS, "seed": 1,
           "data": {"jsonl": "data.jsonl"}, "checkpoint_every": 0, "colwise": "$2",
           "label": "bench-$1"}}
EOF
}
PROF=0
if "$BUILD/mstrain" train --help 2>&1 | grep -q -e '--profile'; then
	PROF=1
else
	echo "bench-train-gpu: this mstrain has no --profile: no peak memory, kernel table or base bytes for our rows" >&2
fi
# the runs: each colwise mode with the default expert GEMMs and attention,
# and the resident one with the project's flash attention instead of
# cuDNN's, and with the grouped expert GEMMs (bf16 weights decoded first,
# and fused: decoded inside), where this mstrain has them
case " $PARTS " in *" ours "*) MODES="resident on-demand";; *) MODES="";; esac
if [ -n "$MODES" ] && [ "$DEV" = cuda ] &&
	"$BUILD/mstrain" train --help 2>&1 | grep -q -e '--attention'; then
	MODES="$MODES flash"
fi
if [ -n "$MODES" ] && [ "$DEV" = cuda ] &&
	"$BUILD/mstrain" train --help 2>&1 | grep -q -e '--expert-gemm'; then
	MODES="$MODES grouped"
	"$BUILD/mstrain" train --help 2>&1 | grep -q -e 'grouped|fused' && MODES="$MODES fused"
fi
# MS_BENCH_MODES: only these of them (a quicker look at one change)
if [ -n "${MS_BENCH_MODES:-}" ] && [ -n "$MODES" ]; then
	sel=
	for c in $MS_BENCH_MODES; do
		case " $MODES " in
		*" $c "*) sel="$sel $c";;
		*) echo "bench-train-gpu: MS_BENCH_MODES: '$c' is none of:$MODES" >&2; exit 2;;
		esac
	done
	MODES=$sel
fi
# smi_start RUN / smi_stop: nvidia-smi's sampling around one run, where
# there is a GPU and nvidia-smi (none: no file, and the report has no
# clock table)
SMI_PID=
smi_start() {
	[ "$DEV" = cuda ] && command -v nvidia-smi >/dev/null 2>&1 || return 0
	# newer drivers name the throttle reasons clock event reasons; the
	# older name is what this driver answers to if it does not know the new
	why=clocks_event_reasons.active
	nvidia-smi --query-gpu=$why --format=csv,noheader >/dev/null 2>&1 ||
		why=clocks_throttle_reasons.active
	nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,$why \
		--format=csv,noheader,nounits -lms 100 >"smi-$1.csv" 2>/dev/null &
	SMI_PID=$!
}
smi_stop() {
	[ -n "$SMI_PID" ] || return 0
	kill "$SMI_PID" 2>/dev/null
	wait "$SMI_PID" 2>/dev/null
	SMI_PID=
}
for c in $MODES; do
	if [ -f "done-$c" ]; then
		echo "bench-train-gpu: mstrain, $c: done before in $W" >&2
		continue
	fi
	col=$c
	case $c in grouped|fused|flash) col=resident;; esac
	plan "$c" "$col"
	"$BUILD/msinv" footprint --json "plan-$c.json" >"footprint-$c.json" 2>"footprint-$c.err" ||
		rm -f "footprint-$c.json"
	set -- "$BUILD/mstrain" train --plan "plan-$c.json" --device "$DEV" --colwise "$col" --metrics "m-$c.jsonl"
	case $c in grouped|fused) set -- "$@" --expert-gemm "$c";; esac
	case $c in flash) set -- "$@" --attention flash;; esac
	[ $PROF = 1 ] && set -- "$@" --profile "prof-$c.json"
	echo "bench-train-gpu: mstrain, $c, $STEPS steps of $BATCH x $SEQ" >&2
	smi_start "$c"
	"$BUILD/msinv" launch --plan "plan-$c.json" -- "$@" >"train-$c.log" 2>&1
	rc=$?
	smi_stop
	if [ $rc != 0 ]; then
		echo "bench-train-gpu: mstrain, $c, failed: its row is left out" >&2
		tail -n 10 "train-$c.log" | sed 's/^/  /' >&2
		rm -f "m-$c.jsonl" "prof-$c.json" "smi-$c.csv"
		status=1
	else
		: >"done-$c"
	fi
done
# the per-launch table: a short resident run more with MS_PROFILE_SITES
# (an event after every launch slows it a little, so it is no row of the
# table), where this mstrain profiles and the resident run is asked for;
# MS_BENCH_SITES=0 leaves it out
if [ $PROF = 1 ] && [ "${MS_BENCH_SITES:-1}" != 0 ] && [ ! -f done-sites ] &&
	case " $MODES " in *" resident "*) true;; *) false;; esac; then
	plan sites resident
	sed 's/"steps": [0-9]*/"steps": 6/' plan-sites.json >plan-sites.tmp && mv plan-sites.tmp plan-sites.json
	echo "bench-train-gpu: mstrain, resident with MS_PROFILE_SITES, 6 steps (the profile: the last 4)" >&2
	if MS_PROFILE_SITES=1 "$BUILD/msinv" launch --plan plan-sites.json -- "$BUILD/mstrain" train \
		--plan plan-sites.json --device "$DEV" --colwise resident --profile prof-sites.json \
		>train-sites.log 2>&1; then
		: >done-sites
	else
		echo "bench-train-gpu: the per-launch profile run failed: its table is left out" >&2
		tail -n 5 train-sites.log | sed 's/^/  /' >&2
		rm -f prof-sites.json
	fi
fi
# the two modes must train the same: the issue asks for bit-identical
# losses (the metrics without the timings)
if [ -s m-resident.jsonl ] && [ -s m-on-demand.jsonl ]; then
	for c in resident on-demand; do
		sed 's/,"seconds":[^,]*,"tokens_per_s":[^}]*//' "m-$c.jsonl" >"losses-$c"
	done
	if cmp -s losses-resident losses-on-demand; then
		echo "bench-train-gpu: resident and on-demand: the same losses, bit for bit" >&2
		SAME="resident and on-demand: the same losses, learning rates and gradient norms at every step, bit for bit"
	else
		echo "bench-train-gpu: resident and on-demand trained differently (losses differ)" >&2
		SAME="resident and on-demand: the losses DIFFER"
		status=1
	fi
else
	SAME=""
fi
# the grouped expert GEMMs sum in another order: the same training to
# float rounding, reported as the largest relative loss difference
GROUPED=""
if [ -s m-resident.jsonl ] && [ -s m-grouped.jsonl ]; then
	GROUPED=$(python3 -c '
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l)["loss"] for l in open(sys.argv[2]) if l.strip()]
d = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) and a else None
print("grouped and per-expert expert GEMMs (colwise resident): %s" % (
    "the losses differ by at most %.3g relative over %d steps" % (d, len(a)) if d is not None
    else "the runs have different step counts"))' m-resident.jsonl m-grouped.jsonl)
fi
# decoding inside the GEMM makes the same bf16 weights: the same training
# as grouped, bit for bit
FUSED=""
if [ -s m-grouped.jsonl ] && [ -s m-fused.jsonl ]; then
	for c in grouped fused; do
		sed 's/,"seconds":[^,]*,"tokens_per_s":[^}]*//' "m-$c.jsonl" >"losses-$c"
	done
	if cmp -s losses-grouped losses-fused; then
		FUSED="fused and grouped expert GEMMs: the same losses, learning rates and gradient norms at every step, bit for bit"
	else
		echo "bench-train-gpu: fused and grouped trained differently (losses differ)" >&2
		FUSED="fused and grouped expert GEMMs: the losses DIFFER"
		status=1
	fi
fi

case " $PARTS " in *" torch "*) RUN_TORCH=1;; *) RUN_TORCH=0;; esac
[ -f done-torch ] && RUN_TORCH=0 && echo "bench-train-gpu: PyTorch reference: done before in $W" >&2
TARGS="--device $DEV --batch $BATCH --seq $SEQ --steps $TSTEPS --warmup $TWARM --peak $PEAK"
[ "${MS_BENCH_TORCH_COMPILE:-1}" = 0 ] && TARGS="$TARGS --no-compile"
if [ $RUN_TORCH = 1 ]; then
	echo "bench-train-gpu: PyTorch reference (train_torch.py $TARGS)" >&2
	# shellcheck disable=SC2086 # TARGS is a list of options
	smi_start torch
	"$PY" "$ROOT/$B/train_torch.py" base $TARGS --data data.jsonl >torch.txt 2>torch.err
	rc=$?
	smi_stop
	if [ $rc = 0 ]; then
		: >done-torch
	else
		echo "bench-train-gpu: train_torch.py failed: $(tail -n 1 torch.err)" >&2
		status=1
	fi
	grep '^TORCH_COMPILE failed' torch.txt >&2
fi

if [ "$DEV" = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then
	NAME=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)
else
	NAME="$(uname -m) CPU, $(nproc) cores (no GPU: mstrain --device $DEV)"
fi
# the commit the binaries were built from (make writes $BUILD/commit),
# and this tree's where it differs: the launch sites are named from this
# tree's kernels/train.cu
TREE=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')
if [ -s "$BUILD/commit" ]; then
	VERS="mstrain built from $(cat "$BUILD/commit")"
	[ "$(cat "$BUILD/commit")" = "$TREE" ] ||
		VERS="$VERS (this tree: $TREE, whose kernels/train.cu names the launch sites)"
else
	VERS="mstrain $TREE"
fi
command -v nvcc >/dev/null 2>&1 && VERS="$VERS, $(nvcc --version | sed -n 's/.*release \([^,]*\).*/CUDA \1/p')"
REP=$W/RESULTS.md
if ! python3 "$ROOT/$B/train_report.py" "$W" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" \
	--skip "$WARM" --peak "$PEAK" --device "$NAME" --mstrain-device "$DEV" \
	--date "$(date -u +%Y-%m-%d)" --versions "$VERS" --out "$REP" \
	${MS_BENCH_MODES:+--modes "$MS_BENCH_MODES"}; then
	echo "bench-train-gpu: the report could not be written" >&2
	exit 3
fi
if [ -n "$SAME" ]; then
	printf '\n%s.\n' "$SAME" >>"$REP"
fi
if [ -n "$GROUPED" ]; then
	printf '\n%s.\n' "$GROUPED" >>"$REP"
fi
if [ -n "$FUSED" ]; then
	printf '\n%s.\n' "$FUSED" >>"$REP"
fi
echo
cat "$REP"
if [ -n "$OUT" ]; then
	cp "$REP" "$OUT" || exit 3
	echo "bench-train-gpu: wrote $OUT" >&2
fi
exit $status
