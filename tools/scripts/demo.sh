#!/bin/sh
# make demo: the whole story on the bundled checkpoints (tests/fixtures),
# in a scratch directory demo-out/ that each run starts afresh.
#
#   1. inventory the frozen base and a LoRA adapter trained on it
#   2. quantize the base to NVFP4, rowwise + columnwise, 2D blocks
#   3. the footprint: both layouts double the frozen base; on-demand saves it
#   4. split the adapter for expert parallelism, reshard, merge back
#   5. plant "every rank loaded the same block" and watch msverify catch it
#   6. identify, sign and verify the served policy
#   7. a gated launch refused on a tampered state, allowed on a good one
#   8. mstrain trains a LoRA on the NVFP4 base under the gate; the new
#      adapter shows in the lineage
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B="$ROOT/${BUILD:-build}"
FX="$ROOT/tests/fixtures/peft/qwen3moe-E8-r4"
D="$ROOT/demo-out"
export PATH="$B:$PATH" MSINV_DB="$D/msinv.db"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
# a command that must fail with status $1
fails() { want=$1; shift; printf '$ %s\n' "$*"; set +e; "$@"; got=$?; set -e
	[ "$got" -eq "$want" ] || { echo "demo: expected exit $want, got $got" >&2; exit 1; }
	echo "(exit $got, as expected)"; }

rm -rf "$D"
mkdir -p "$D"
cp -r "$FX/base" "$D/base"
cp -r "$FX/adapter" "$D/adapter"
cd "$D"

step "1. inventory the base and the adapter"
run msinv init
run msinv add --label base base
run msinv add --label lora --parent base --op train --params '{"steps": 100}' adapter
run msinv inspect adapter | head -n 6

step "2. quantize the base to NVFP4 (rowwise + columnwise, 2D blocks) and check it"
run msconvert quantize base -o base-nvfp4 --recipe modelopt --block 2d --layout both --label base-nvfp4
run msconvert stats base-nvfp4 --source base | tail -n 3
run msverify quant base-nvfp4 --source base

step "3. footprint: both NVFP4 layouts resident double the frozen base"
cat >plan-both.json <<'EOF'
{"name": "grpo-both", "ep_size": 4, "budget_gib": 80,
 "states": [{"role": "base", "state": "base-nvfp4"},
            {"role": "adapter", "state": "lora"}]}
EOF
cat >plan-ondemand.json <<'EOF'
{"name": "grpo-ondemand", "ep_size": 4, "budget_gib": 80,
 "states": [{"role": "base", "path": "base", "repr": "nvfp4-ondemand"},
            {"role": "adapter", "state": "lora"}]}
EOF
run msinv footprint plan-both.json
run msinv footprint plan-ondemand.json

step "4. split the adapter for EP=4, reshard to EP=2, merge back"
run msshard plan --experts 8 --ep-size 4
run msshard split adapter -o lora-ep4 --ep-size 4 --label lora-ep4
run msshard reshard lora-ep4 -o lora-ep2 --ep-size 2 --label lora-ep2
run msshard merge lora-ep2 -o lora-merged --label lora-merged
run msverify ep lora-ep4
orig=$(msinv inspect --digests adapter | tail -n 1)
back=$(msinv inspect --digests lora-merged | tail -n 1)
echo "adapter:         $orig"
echo "merged from EP2: $back"
[ "$orig" = "$back" ] || { echo "demo: merge changed the adapter" >&2; exit 1; }
run msinv lineage lora

step "5. the silent failure: every EP rank loaded the same expert block"
cp -r lora-ep4 lora-ep4-bad
python3 "$ROOT/tools/scripts/plant_same_block.py" lora-ep4-bad
fails 1 msverify ep lora-ep4-bad

step "6. the served policy: which states is it, signed and verified"
mkdir -p served
cp -r base served/base
cp -r adapter served/adapter
run msverify policy --register --label served-v1 served/base served/adapter
openssl ecparam -name prime256v1 -genkey -noout -out key.pem 2>/dev/null
openssl ec -in key.pem -pubout -out key.pub 2>/dev/null
run msverify sign served --key key.pem -o served.sig
run msverify verify served --sig served.sig --pub key.pub

step "7. the gate: a tampered state is refused, a good one runs"
cat >plan-run.json <<'EOF'
{"name": "grpo", "ep_size": 1, "outputs": "runs/grpo",
 "states": [{"role": "base", "state": "base"},
            {"role": "adapter", "state": "lora"}]}
EOF
cp base/model.safetensors model.safetensors.orig
python3 - <<'EOF'
# flip one bit in the middle of the base's data
with open("base/model.safetensors", "r+b") as f:
    f.seek(200000)
    b = f.read(1)
    f.seek(200000)
    f.write(bytes([b[0] ^ 0x01]))
EOF
fails 1 msinv launch --plan plan-run.json -- sh -c 'echo training on $MSINV_STATE_BASE'
cp model.safetensors.orig base/model.safetensors
run msinv launch --plan plan-run.json -- sh -c 'echo training on $MSINV_STATE_BASE'
run msinv log --check

step "8. train a LoRA under the gate: mstrain loads only what the launch verified"
# LoRA on the experts and q/v of the NVFP4 base (2D blocks: the backward's
# columnwise weights are an exact transpose), warm-started from the
# adapter, 2 virtual EP ranks, the copy task; the checkpoints every 15
# steps are adapter states derived from the three inputs, outputs of the run
cat >plan-train.json <<'EOF'
{"name": "sft-copy", "ep_size": 2, "outputs": "runs/sft",
 "states": [{"role": "base", "state": "base"},
            {"role": "quantized", "state": "base-nvfp4"},
            {"role": "adapter", "state": "lora"}],
 "train": {"lora": {"r": 4, "alpha": 8, "targets": ["experts", "q_proj", "v_proj"]},
           "optimizer": {"lr": 1e-2, "weight_decay": 0.0, "clip": 1.0, "warmup": 5},
           "batch": 4, "seq_len": 16, "steps": 30, "seed": 1,
           "data": {"task": "copy"}, "checkpoint_every": 15, "label": "sft-copy"}}
EOF
run msinv launch --plan plan-train.json -- mstrain train --plan plan-train.json --metrics train.jsonl
run msinv lineage sft-copy-step30
# one flipped bit in the quantized base: the launch refuses, mstrain never runs
cp base-nvfp4/model.safetensors nvfp4.orig
python3 - <<'EOF'
with open("base-nvfp4/model.safetensors", "r+b") as f:
    f.seek(-64, 2)
    b = f.read(1)
    f.seek(-64, 2)
    f.write(bytes([b[0] ^ 0x01]))
EOF
fails 1 msinv launch --plan plan-train.json -- mstrain train --plan plan-train.json
cp nvfp4.orig base-nvfp4/model.safetensors

printf '\nThe demo ran to the end; its files are in %s\n' "$D"
