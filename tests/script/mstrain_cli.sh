#!/bin/sh
# mstrain from the command line, on the bundled Qwen3-MoE checkpoint and
# its NVFP4 (2D blocks) copy: a LoRA trained on a synthetic task reaches a
# loss it could not reach untrained; the checkpoint adapter has PEFT's keys
# and shapes (those of the PEFT-made fixture adapter of the same targets);
# a run stopped and resumed gives the same losses and the same adapter,
# bit for bit; the gate refuses a state missing from the inventory, one
# whose bytes changed, one left unverified, a plan or state other than the
# launch verified, and an optimizer state that changed; under msinv launch
# the checkpoints are the run's outputs and show in msinv lineage.
. "$(dirname "$0")/lib.sh"
export MSINV_DB="$W/inv.db"

q() { sqlite3 "$MSINV_DB" "$1"; }
# the metrics of steps FROM..TO without the timings
curve() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    if int(sys.argv[2]) <= m["step"] <= int(sys.argv[3]):
        print(m["step"], repr(m["loss"]), repr(m["lr"]), repr(m["grad_norm"]), m["tokens"])
' "$@"; }
# a plan: FILE OUTPUTS STEPS EVERY [DATA]; its label is FILE's name
plan() {
	data=${5:-'{"task": "copy"}'}
	cat >"$1" <<EOF
{"ep_size": 1, "outputs": "$2",
 "states": [{"role": "base", "state": "base"}, {"role": "quantized", "state": "base-nvfp4"}],
 "train": {"lora": {"r": 4, "alpha": 8, "targets": ["experts", "q_proj", "v_proj"]},
           "optimizer": {"lr": 1e-2, "weight_decay": 0.01, "clip": 1.0, "warmup": 5},
           "batch": 4, "seq_len": 16, "grad_accum": 2, "steps": $3, "seed": 1,
           "data": $data, "checkpoint_every": $4, "label": "$(basename "$1" .json)"}}
EOF
}
flip() { # FILE OFFSET_FROM_END BIT
	python3 -c "
import sys
f = open(sys.argv[1], 'r+b'); f.seek(-int(sys.argv[2]), 2); b = f.read(1)
f.seek(-int(sys.argv[2]), 2); f.write(bytes([b[0] ^ int(sys.argv[3])]))" "$@"
}

cd "$W" || exit 3
cp -r "$FX/peft/qwen3moe-E8-r4/base" base
expect 0 "$B/msinv" init
expect 0 "$B/msinv" add --label base base
expect 0 "$B/msconvert" quantize base -o base-nvfp4 --block 2d --layout both
expect 0 "$B/msinv" add --label base-nvfp4 base-nvfp4

# ---- usage ----
expect 2 "$B/mstrain" train
has "--plan is required" "$W/err" "no plan"
expect 2 "$B/mstrain" train --plan x.json --steps 0
expect 2 "$B/mstrain" train --plan x.json --device tpu
has "is not cpu or cuda" "$W/err" "unknown device"
expect 2 "$B/mstrain" train --plan x.json --profile p.json
has "need --device cuda" "$W/err" "--profile on the CPU"
expect 2 "$B/mstrain" train --plan x.json --expert-gemm grouped
has "need --device cuda" "$W/err" "--expert-gemm on the CPU"
expect 2 "$B/mstrain" train --plan x.json --device cuda --expert-gemm cutlass
has "is not per-expert, grouped or fused" "$W/err" "unknown --expert-gemm"
expect 2 "$B/mstrain" train --plan x.json --device cuda --gpu-f32 --expert-gemm grouped
has "is a bf16 path" "$W/err" "--expert-gemm grouped with --gpu-f32"
expect 2 "$B/mstrain" train --plan x.json --attention cudnn
has "need --device cuda" "$W/err" "--attention on the CPU"
expect 2 "$B/mstrain" train --plan x.json --device cuda --attention fa3
has "is not auto, cudnn or flash" "$W/err" "unknown --attention"
expect 2 "$B/mstrain" train --plan x.json --device cuda --gpu-f32 --attention flash
has "is a bf16 path" "$W/err" "--attention flash with --gpu-f32"
expect 2 "$B/mstrain" train --plan x.json --colwise both
plan typo.json runs/typo 3 0
sed 's/"seq_len"/"seqlen"/' typo.json >typo2.json
expect 2 "$B/mstrain" train --plan typo2.json
has "key 'train.seqlen': unknown key" "$W/err" "misspelt key"
one_line "misspelt key"

# --device cuda on a machine without a GPU (or a build without nvcc): one
# line, exit 3, nothing registered (the GPU tier runs it for real)
if ! nvidia-smi -L >/dev/null 2>&1; then
	plan nogpu.json runs/nogpu 3 0
	expect 3 "$B/mstrain" train --plan nogpu.json --device cuda
	has "gpu" "$W/err" "--device cuda without a GPU"
	one_line "--device cuda without a GPU"
	[ ! -e runs/nogpu ] && ok || bad "--device cuda without a GPU left runs/nogpu"
fi

# a metrics file that cannot be written stops the run at once (exit 3)
if [ -w /dev/full ]; then
	plan full-disk.json runs/full-disk 3 0
	expect 3 "$B/mstrain" train --plan full-disk.json --metrics /dev/full
	has "'/dev/full': write failed" "$W/err" "metrics on a full disk"
	[ "$(grep -c 'step [0-9]*/3' "$W/err")" -eq 1 ] && [ ! -e runs/full-disk/step-000003 ] && ok ||
		bad "the run went on after its metrics failed"
fi

# ---- training learns the task ----
# The fixture's random lm_head (std 0.02) after a unit-RMS final norm caps
# every logit near +-1.3, so no adapter could make a prediction confident
# (the loss stays above ~3.6 whatever is learnt). The learning test uses
# the same checkpoint with its final norm weight times 16 (exact in bf16:
# the exponent plus 4), registered and quantized as a state of its own.
cp -r base loud
python3 - loud/model.safetensors <<'PY' || bad "could not scale the final norm"
import json, struct, sys
f = open(sys.argv[1], "r+b"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
t = h["model.norm.weight"]; assert t["dtype"] == "BF16"
a, b = t["data_offsets"]; f.seek(8 + n + a); raw = bytearray(f.read(b - a))
for i in range(0, len(raw), 2):
    u = raw[i] | raw[i + 1] << 8
    if u & 0x7f80: u += 4 << 7
    raw[i], raw[i + 1] = u & 0xff, u >> 8
f.seek(8 + n + a); f.write(raw)
PY
expect 0 "$B/msinv" add --label loud loud
expect 0 "$B/msconvert" quantize loud -o loud-nvfp4 --block 2d --layout both
expect 0 "$B/msinv" add --label loud-nvfp4 loud-nvfp4
plan learn.json runs/learn 300 0
sed -i 's/"state": "base"}/"state": "loud"}/; s/"state": "base-nvfp4"}/"state": "loud-nvfp4"}/' learn.json
expect 0 "$B/mstrain" train --plan learn.json --metrics learn.jsonl --json
# untrained: about ln(128) or worse; a model that only learnt which tokens
# answer would stay near 7/8 ln(10) = 2.0; one that copies goes to ~0
first=$(curve learn.jsonl 1 1 | cut -d' ' -f2)
last10=$(curve learn.jsonl 291 300 | awk '{s += $2} END {printf "%.6f", s / NR}')
python3 -c "import sys; f, l = float('$first'), float('$last10'); sys.exit(0 if f > 4.5 and l < 0.5 else 1)" &&
	ok || bad "copy task: loss $first -> $last10 (want from > 4.5 to < 0.5)"
has '"last_step":300' "$W/out" "json summary"
[ "$(wc -l <learn.jsonl)" -eq 300 ] && ok || bad "metrics: not one line per step"
has "step 300/300 loss" "$W/err" "progress line"

# ---- the checkpoint adapter: PEFT's keys, shapes and config ----
ad=runs/learn/step-000300/adapter
python3 - "$ad" "$FX/peft/qwen3moe-E8-r4/adapter" <<'PY' && ok || bad "adapter keys/shapes differ from PEFT's"
import json, struct, sys
def header(d):
    f = open(d + "/adapter_model.safetensors", "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n)); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"]) for k, v in h.items()}
ours, peft = header(sys.argv[1]), header(sys.argv[2])
if {k: s for k, (_, s) in ours.items()} != {k: s for k, (_, s) in peft.items()}:
    print("ours:", sorted(ours.items())); print("peft:", sorted(peft.items())); sys.exit(1)
if {t for t, _ in ours.values()} != {"F32"}: sys.exit(1)
c, p = json.load(open(sys.argv[1] + "/adapter_config.json")), json.load(open(sys.argv[2] + "/adapter_config.json"))
for k in ("peft_type", "r", "lora_alpha"):
    if c.get(k) != p.get(k): print("config", k, c.get(k), p.get(k)); sys.exit(1)
if sorted(c["target_modules"]) != sorted(p["target_modules"]) or \
   sorted(c["target_parameters"]) != sorted(p["target_parameters"]):
    print("targets", c["target_modules"], c["target_parameters"]); sys.exit(1)
PY
expect 0 "$B/msinv" show learn-step300
has "adapter" "$W/out" "registered as an adapter"
[ "$(q "SELECT count(*) FROM derivations d JOIN states c ON c.id = d.child_id
        WHERE c.label = 'learn-step300' AND d.operation = 'train'
        AND d.params LIKE '%\"optimizer_sha256\":\"%'")" = 2 ] && ok || bad "train edges to base and quantized"

# ---- resume: the same losses and the same adapter, bit for bit ----
plan full.json runs/full 24 12
plan half.json runs/half 24 12
expect 0 "$B/mstrain" train --plan full.json --metrics full.jsonl
expect 0 "$B/mstrain" train --plan half.json --steps 12 --metrics a.jsonl
[ ! -e runs/half/step-000024 ] && ok || bad "--steps 12 ran past step 12"
expect 0 "$B/mstrain" train --plan half.json --resume runs/half/step-000012 --metrics b.jsonl --json
cp "$W/out" resumed.json
curve full.jsonl 13 24 >want
curve b.jsonl 1 24 >got
[ -s want ] && cmp -s want got && ok || { bad "resumed losses differ"; diff want got | head -n 4; }
curve full.jsonl 1 12 >want
curve a.jsonl 1 12 >got
cmp -s want got && ok || bad "the first half differs"
# the same bytes: one state, with two copies, that keeps its first label
d1=$(q "SELECT digest FROM states WHERE label = 'full-step24'")
d2=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["checkpoints"][-1]["state"])' resumed.json)
[ -n "$d1" ] && [ "$d1" = "$d2" ] && ok || bad "resumed adapter $d2 differs from $d1"
has '"label":"full-step24"' resumed.json "label of the resumed checkpoint"
# the resumed checkpoint derives from the one it resumed
[ "$(q "SELECT p.label FROM derivations d JOIN states c ON c.id = d.child_id
        JOIN states p ON p.id = d.parent_id WHERE c.label = 'full-step24' AND p.kind = 'adapter'")" = full-step12 ] &&
	ok || bad "resumed checkpoint's parent"
# with LoRA dropout too: its masks are drawn from (seed, step), which the
# checkpoint carries
plan dfull.json runs/dfull 8 4
plan dhalf.json runs/dhalf 8 4
sed -i 's/"alpha": 8,/"alpha": 8, "dropout": 0.2,/; s/"seed": 1/"seed": 5/' dfull.json dhalf.json
expect 0 "$B/mstrain" train --plan dfull.json --metrics dfull.jsonl
expect 0 "$B/mstrain" train --plan dhalf.json --steps 4
expect 0 "$B/mstrain" train --plan dhalf.json --resume runs/dhalf/step-000004 --metrics dhalf.jsonl
curve dfull.jsonl 5 8 >want
curve dhalf.jsonl 1 8 >got
[ -s want ] && cmp -s want got && ok || { bad "resumed losses with dropout differ"; diff want got | head -n 4; }
sed 's/"seed": 1/"seed": 2/' full.json >seed2.json
expect 2 "$B/mstrain" train --plan seed2.json --resume runs/half/step-000012
has "written by a run of seed 1, the plan's seed is 2" "$W/err" "resume under another seed"
expect 2 "$B/mstrain" train --plan half.json
has "step-000012': checkpoint exists" "$W/err" "existing checkpoint"
# an optimizer state that changed is refused
cp -r runs/half/step-000012 opt-bad
flip opt-bad/optimizer.safetensors 5 1
expect 1 "$B/mstrain" train --plan half.json --resume opt-bad
has "optimizer.safetensors': optimizer state differs" "$W/err" "tampered optimizer"
one_line "tampered optimizer"

# ---- the columnwise mode and the EP ranks, at the trainer's level ----
# on demand decodes the same bytes as resident: the same adapter, bit for
# bit; EP 2 and 4 split tokens and experts over virtual ranks: the same
# training within float32 rounding
state_of() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["checkpoints"][-1]["state"])' "$1"; }
plan cw1.json runs/cw1 6 0
plan cw2.json runs/cw2 6 0
expect 0 "$B/mstrain" train --plan cw1.json --colwise resident --json
cp "$W/out" cw1.out
expect 0 "$B/mstrain" train --plan cw2.json --colwise on-demand --json
cp "$W/out" cw2.out
[ "$(state_of cw1.out)" = "$(state_of cw2.out)" ] && ok || bad "on-demand adapter differs from resident"
for ep in 2 4; do
	plan ep$ep.json runs/ep$ep 6 0
	expect 0 "$B/mstrain" train --plan ep$ep.json --ep $ep --metrics ep$ep.jsonl
done
plan ep1.json runs/ep1 6 0
expect 0 "$B/mstrain" train --plan ep1.json --metrics ep1.jsonl
python3 - ep1.jsonl ep2.jsonl ep4.jsonl <<'PY' && ok || bad "EP 2/4 losses differ from EP 1"
import json, sys
curves = [[json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:]]
ref = curves[0]
for c in curves[1:]:
    assert len(c) == len(ref) == 6
    for a, b in zip(ref, c):
        assert abs(a - b) <= 1e-4 * abs(a), (a, b)
PY
sed 's/"ep_size": 1/"ep_size": 3/' ep1.json >ep3.json
expect 2 "$B/mstrain" train --plan ep3.json
has "do not divide over 3 EP ranks" "$W/err" "batch not divisible"

# ---- a warm start from a PEFT adapter ----
cp -r "$FX/peft/qwen3moe-E8-r4/adapter" adapter
expect 0 "$B/msinv" add --label peft-lora --parent base --op train adapter
plan warm.json runs/warm 2 0
sed 's/{"role": "quantized", "state": "base-nvfp4"}/&, {"role": "adapter", "state": "peft-lora"}/' warm.json >warm2.json
mv warm2.json warm.json
expect 0 "$B/mstrain" train --plan warm.json --metrics warm.jsonl
[ "$(q "SELECT p.label FROM derivations d JOIN states c ON c.id = d.child_id
        JOIN states p ON p.id = d.parent_id WHERE c.label = 'warm-step2' AND p.kind = 'adapter'")" = peft-lora ] &&
	ok || bad "warm start not a parent of the checkpoint"
# the warm start changes what the model predicts from the first step
[ "$(curve warm.jsonl 1 1 | cut -d' ' -f2)" != "$(curve ep1.jsonl 1 1 | cut -d' ' -f2)" ] &&
	ok || bad "the warm-start adapter made no difference"

# the run's alpha may differ from the adapter's (its adapter_config.json):
# the model starts from the adapter's delta all the same, so the first
# loss (before any update) is the one of a run with the adapter's alpha
sed 's/"alpha": 8,/"alpha": 16,/; s#runs/warm#runs/warm16#; s/"label": "warm"/"label": "warm16"/' warm.json >warm16.json
expect 0 "$B/mstrain" train --plan warm16.json --metrics warm16.jsonl
python3 -c "
import json, sys
a, b = (json.loads(open(f).readline())['loss'] for f in sys.argv[1:])
sys.exit(0 if abs(a - b) <= 1e-6 * abs(a) else 1)" warm.jsonl warm16.jsonl && ok ||
	bad "warm start under another alpha: first loss $(curve warm16.jsonl 1 1) differs from $(curve warm.jsonl 1 1)"
# a warm start from one EP shard of the adapter: refused (wrong EP size:
# exit 1 with the reshard command; the right size: exit 2, merge it first)
expect 0 "$B/msshard" split adapter -o lora-ep2 --ep-size 2
shard=$(q "SELECT digest FROM states WHERE kind = 'adapter_shard' AND ep_rank = 0 LIMIT 1")
sed "s/\"state\": \"peft-lora\"/\"state\": \"$shard\"/" warm.json >shard.json
expect 1 "$B/mstrain" train --plan shard.json
has "is a shard of an EP=2 split, this run is EP=1: run 'msshard reshard --ep-size 1'" "$W/err" "shard of another EP size"
one_line "shard of another EP size"
expect 2 "$B/mstrain" train --plan shard.json --ep 2
has "is the shard of rank 0 of an EP set" "$W/err" "shard of this EP size"

# a warm start from the whole shard set (a directory with ep_manifest.json):
# each rank's shard through the EP-aware loader and the verified load, put
# back together: the same training as from the unsharded adapter, bit for
# bit, whatever the placement
sed 's#"state": "peft-lora"#"path": "lora-ep2"#; s/"ep_size": 1/"ep_size": 2/; s#runs/warm#runs/set#; s/"label": "warm"/"label": "set"/' warm.json >set.json
sed 's/"ep_size": 1/"ep_size": 2/; s#runs/warm#runs/warm2#; s/"label": "warm"/"label": "warm2"/' warm.json >warm2.json
expect 0 "$B/mstrain" train --plan warm2.json --metrics warm2.jsonl
expect 0 "$B/mstrain" train --plan set.json --metrics set.jsonl --json
curve warm2.jsonl 1 2 >want
curve set.jsonl 1 2 >got
cmp -s want got && ok || { bad "warm start from the shard set differs from the adapter"; diff want got; }
has "\"role\":\"adapter\",\"state\":\"$(q "SELECT digest FROM states WHERE label = 'peft-lora'")\"" "$W/out" "set names the unsharded adapter"
expect 0 "$B/msshard" split adapter -o lora-rr2 --ep-size 2 --placement round-robin
sed 's#"lora-ep2"#"lora-rr2"#; s#runs/set#runs/setrr#; s/"label": "set"/"label": "setrr"/' set.json >setrr.json
expect 0 "$B/mstrain" train --plan setrr.json --metrics setrr.jsonl
curve setrr.jsonl 1 2 >got
cmp -s want got && ok || { bad "warm start from a round-robin set differs"; diff want got; }
# the set of another EP size, every rank holding rank 0's block, a set
# that is not in the inventory: refused
expect 1 "$B/mstrain" train --plan set.json --ep 1
has "msshard reshard" "$W/err" "set of another EP size"
one_line "set of another EP size"
cp -r lora-ep2 lora-same
python3 "${MS_ROOT:-.}/tools/scripts/plant_same_block.py" lora-same >/dev/null
sed 's#"lora-ep2"#"lora-same"#' set.json >same.json
expect 1 "$B/mstrain" train --plan same.json
one_line "same block on every rank"
cp -r adapter adapter-other
flip adapter-other/adapter_model.safetensors 9 2
expect 0 "$B/msshard" split adapter-other -o lora-unreg --ep-size 2 --no-register
sed 's#"lora-ep2"#"lora-unreg"#' set.json >unreg.json
expect 1 "$B/mstrain" train --plan unreg.json
has "not in the inventory" "$W/err" "unregistered shard set"

# ---- JSONL data ----
printf '{"input_ids": [3, 4, 1, 3, 4, 2]}\n{"input_ids": [5, 6, 1, 5, 6, 2], "loss_mask": [0, 0, 0, 1, 1, 1]}\n' >d.jsonl
plan js.json runs/js 4 0 '{"jsonl": "d.jsonl"}'
expect 0 "$B/mstrain" train --plan js.json
printf '\n{"input_ids": [3, 4, 128]}\n' >>d.jsonl
plan js2.json runs/js2 4 0 '{"jsonl": "d.jsonl"}'
expect 2 "$B/mstrain" train --plan js2.json
has "d.jsonl:4': 'input_ids\[2\]' is not a token id in 0..127" "$W/err" "bad JSONL line"
one_line "bad JSONL line"

# ---- the gate: missing, not inventoried, tampered, unverified ----
sed 's/"state": "base-nvfp4"/"state": "no-such-state"/' full.json >missing.json
expect 1 "$B/mstrain" train --plan missing.json
has "role 'quantized'" "$W/err" "missing state"
has "no-such-state" "$W/err" "missing state"
one_line "missing state"
cp -r base base-copy
flip base-copy/model.safetensors 7 4
sed 's#"state": "base"}#"path": "base-copy"}#' full.json >notinv.json
expect 1 "$B/mstrain" train --plan notinv.json
has "not in the inventory" "$W/err" "path not inventoried"
one_line "path not inventoried"
# one bit of a quantized tensor changed after registration
cp base-nvfp4/model.safetensors orig.safetensors
flip base-nvfp4/model.safetensors 100 1
plan t.json runs/t 2 0
expect 1 "$B/mstrain" train --plan t.json
has "role 'quantized': state 'base-nvfp4'" "$W/err" "tampered state"
has "base-nvfp4/model.safetensors': digest mismatch" "$W/err" "tampered file named"
one_line "tampered state"
[ ! -e runs/t ] && ok || bad "a refused run wrote a checkpoint"
# msverify records the change; restored, the state stays refused until a
# check passes again
expect 1 "$B/msverify" files base-nvfp4
cp orig.safetensors base-nvfp4/model.safetensors
expect 1 "$B/mstrain" train --plan t.json
has "unverified: its last verification" "$W/err" "unverified state"
one_line "unverified state"
expect 0 "$B/msverify" files base-nvfp4
expect 0 "$B/mstrain" train --plan t.json
# a configuration file changed after registration (it decides how the
# tensors are read): refused like a tensor
cp base/config.json config.orig
sed 's/"rms_norm_eps": 1e-06/"rms_norm_eps": 1e-05/' config.orig >base/config.json
plan c.json runs/c 2 0
expect 1 "$B/mstrain" train --plan c.json
has "role 'base': state 'base'.*config.json': changed since it was recorded" "$W/err" "changed config"
one_line "changed config"
cp config.orig base/config.json
# what a killed trainer leaves (its staging directory) msinv gc removes
mkdir -p runs/t/.step-000009.tmp-999999-0badcafe/adapter
: >runs/t/.step-000009.tmp-999999-0badcafe/adapter/adapter_config.json
expect 0 "$B/msinv" gc runs/t
[ ! -e runs/t/.step-000009.tmp-999999-0badcafe ] && [ -d runs/t/step-000002 ] && ok ||
	bad "msinv gc and a trainer's staging directory"

# ---- under msinv launch ----
plan l.json runs/l 6 3
sed -i 's/"seed": 1/"seed": 7/' l.json  # states no other run of this script reached
expect 0 "$B/msinv" launch --plan l.json -- "$B/mstrain" train --plan l.json --json
run=$(q "SELECT max(id) FROM runs")
[ "$(q "SELECT status FROM runs WHERE id = $run")" = ok ] && ok || bad "launch run not ok"
[ "$(q "SELECT count(*) FROM run_outputs o JOIN states s ON s.id = o.state_id
        WHERE o.run_id = $run AND s.label IN ('l-step3', 'l-step6')")" = 2 ] && ok || bad "checkpoints not the run's outputs"
has "\"run\":$run" "$W/out" "json names the run"
[ "$(q "SELECT count(*) FROM derivations d JOIN states c ON c.id = d.child_id
        WHERE c.label = 'l-step6' AND d.operation = 'train' AND d.run_id = $run
        AND d.params LIKE '{\"step\":6,%'")" = 2 ] && ok || bad "train edges carry the run and the step"
q "SELECT data FROM events WHERE run_id = $run AND kind = 'train_summary'" >ev
has '"last_step":6,' ev "the run's train_summary event"
has "\"state\":\"$(q "SELECT digest FROM states WHERE label = 'l-step6'")\"" ev "summary names the checkpoint"
# the same plan drives the footprint
expect 0 "$B/msinv" footprint l.json
expect 0 "$B/msinv" lineage l-step6
has "train" "$W/out" "lineage edge"
has "base-nvfp4" "$W/out" "lineage parent"
# the plan changed between the launch's check and the trainer's load
plan l2.json runs/l2 2 0
expect 1 "$B/msinv" launch --plan l2.json -- sh -c "echo ' ' >>l2.json; exec '$B/mstrain' train --plan l2.json"
has "not the plan run" "$W/err" "plan mismatch"
# a state other than the launch verified, and a role it did not verify
digest=$(sha256sum l2.json | cut -d' ' -f1)
expect 1 env MSINV_RUN=1 MSINV_PLAN_DIGEST="sha256:$digest" \
	MSINV_STATE_BASE="sha256:$(printf '%064d' 0)" MSINV_STATE_QUANTIZED=x "$B/mstrain" train --plan l2.json
has "role 'base': state 'base'.* is not the state run 1 verified" "$W/err" "state mismatch"
one_line "state mismatch"
base=$(q "SELECT digest FROM states WHERE label = 'base'")
expect 1 env MSINV_RUN=1 MSINV_PLAN_DIGEST="sha256:$digest" MSINV_STATE_BASE="$base" \
	"$B/mstrain" train --plan l2.json
has "role 'quantized'.* was not verified by the launch" "$W/err" "role not verified"

# ---- the man page's EXAMPLES, as written ----
# "$ cat FILE" followed by text is the file's content; every other "$ "
# line (with its "\" continuations) runs, in order, in a directory holding
# the fixture checkpoint as base/, with an inventory of its own
mkdir ex && cp -r "$FX/peft/qwen3moe-E8-r4/base" ex/base
python3 - "$ROOT/man/mstrain.1" ex <<'PY' >ex/run.sh || bad "could not read the EXAMPLES"
import re, sys
text = open(sys.argv[1]).read()
ex = text[text.index(".Sh EXAMPLES"):text.index(".Sh SEE ALSO")]
lines, out, cur, cat = [], [], None, None
for blk in re.findall(r"\.Bd -literal[^\n]*\n(.*?)\.Ed", ex, re.S):
    lines += blk.replace("\\e", "\\").splitlines()
for l in lines:
    if l.startswith("$ "):
        if cat:
            out.append("cat >%s <<'JSON'\n%s\nJSON" % (cat[0], "\n".join(cat[1])))
            cat = None
        m = re.match(r"\$ cat (\S+)$", l)
        if m:
            cat = (m.group(1), [])
            continue
        cur = l[2:]
    elif cat:
        cat[1].append(l)
        continue
    else:
        cur = out.pop() + "\n" + l
    out.append(cur)
print("set -e")
print("\n".join(out))
PY
n=$(grep -c 'mstrain train' ex/run.sh)
[ "$n" -ge 3 ] && ok || bad "found $n mstrain commands in the EXAMPLES"
(cd ex && MSINV_DB="$PWD/msinv.db" PATH="$B:$PATH" sh run.sh) >ex.out 2>&1 && ok ||
	{ bad "man page EXAMPLES failed"; tail -n 5 ex.out; }
has "copy-lora-step40" ex.out "EXAMPLES: lineage of the trained adapter"
# as the page says: the resumed run ends on the state the first run labelled
has "^checkpoint step 40 runs/copy2/step-000040 sha256:.* (copy-lora-step40)$" ex.out "EXAMPLES: resumed = uninterrupted"
curve ex/a.jsonl 1 20 >/dev/null && curve ex/b.jsonl 21 40 >got && [ "$(wc -l <got)" -eq 20 ] && ok ||
	bad "EXAMPLES: the resumed run's metrics"

echo "mstrain_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
