#!/bin/sh
# msinv footprint with a "train" section: LoRA parameters, gradients and
# AdamW state per GPU, checked against an independent count made here from
# the safetensors headers (Python, standard library only): per-expert and
# fused 3-D expert bases, a warm-start adapter, both placements. The
# report says what it counts and what it does not; a budget that the
# weights fit but the training state does not is exit 1; a bad "train"
# section is one line and exit 2.
. "$(dirname "$0")/lib.sh"
tmp=$W

run() { # EXPECTED_RC NAME CMD...: stdout in $tmp/out, stderr in $tmp/err
	want=$1; name=$2; shift 2
	"$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" -eq "$want" ]; then ok; else bad "$name: exit $rc, want $want: $(cat "$tmp/err")"; fi
}
has() { # FILE NAME PATTERN: a fixed string in the file
	if grep -qF -- "$3" "$1"; then ok; else bad "$2: no '$3' in: $(cat "$1")"; fi
}
one_line() {
	if [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q '^msinv: ' "$tmp/err"; then ok; else
		bad "$1: stderr is not one 'msinv:' line: $(cat "$tmp/err")"; fi
}
if ! command -v python3 >/dev/null 2>&1; then
	echo "footprint_train: skipped: python3 not found"; echo "footprint_train: 0 passed, 0 failed"; exit 0
fi
FX=$(cd "$FX" && pwd)

# The independent count: PLAN JSON REPORT -> one line per mismatch, or
# nothing. Parameters: r * (rows + cols) per target matrix, per expert of a
# fused [E, a, b] parameter; a warm start: the adapter's LoRA tensors as
# they are. Expert parameters go to the rank owning the expert (fused:
# an equal share each); the rest is on every rank. Bytes per parameter:
# 2 (bf16 weights, unless an adapter entry holds them) + 4 (fp32 gradient)
# + 12 (AdamW: fp32 master and two moments).
cat >"$tmp/count.py" <<'EOF'
import json, os, re, struct, sys

plan_path, with_path, without_path = sys.argv[1:4]
plan = json.load(open(plan_path))
pdir = os.path.dirname(os.path.abspath(plan_path))
ep = plan["ep_size"]
rr = plan.get("placement") == "round-robin"

def headers(path):
    files = [path] if path.endswith(".safetensors") else [
        os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".safetensors")]
    out = {}
    for f in files:
        with open(f, "rb") as h:
            n = struct.unpack("<Q", h.read(8))[0]
            out.update({k: v for k, v in json.loads(h.read(n)).items() if k != "__metadata__"})
    return out

def entry(role):
    for e in plan["states"]:
        if e["role"] == role:
            return headers(os.path.join(pdir, e["path"]))
    return None

per_rank = [0] * ep
total = 0
train = plan["train"]
lora = train.get("lora")
adapter = entry("adapter")
if lora:
    r, targets = lora["r"], lora["targets"]
    base = entry("base")
    nexp = max([int(m.group(1)) + 1 for k in base
                for m in [re.search(r"\.experts\.(\d+)\.", k)] if m] +
               [v["shape"][0] for k, v in base.items() if re.search(r"\.experts\.[a-z_]+$", k)])
    for k, v in base.items():
        s = v["shape"]
        leaf = re.sub(r"\.weight$", "", k).split(".")[-1]
        per = re.search(r"\.mlp\.experts\.(\d+)\.", k)
        fused = re.search(r"\.mlp\.experts\.[a-z_]+$", k) and len(s) == 3
        is_weight = (k.endswith(".weight") and len(s) == 2 and leaf.endswith("proj")) or fused
        if not is_weight:
            continue
        if not (("experts" in targets and (per or fused)) or leaf in targets):
            continue
        # PEFT's fused gate_up (target_parameters): one A for gate and up,
        # so a per-expert up (w3) adds only its B [out, r]
        shared_a = per and "experts" in targets and leaf in ("up_proj", "w3")
        n = r * (s[-2] + (0 if shared_a else s[-1])) * (s[0] if fused else 1)
        total += n
        if per:
            e = int(per.group(1))
            per_rank[e % ep if rr else e // (nexp // ep)] += n
        elif fused:
            for q in range(ep):
                per_rank[q] += n // ep
        else:
            for q in range(ep):
                per_rank[q] += n
else:
    for k, v in adapter.items():
        if not re.search(r"\.lora_[AB]\.weight$", k):
            continue
        n = 1
        for d in v["shape"]:
            n *= d
        total += n
        for q in range(ep):  # fused expert LoRA: an equal share; else everywhere
            per_rank[q] += n // ep if ".mlp.experts." in k else n
bpp = (0 if adapter is not None else 2) + 4 + 12
got = json.load(open(with_path))
t = got["train"]
want = {"params": total, "params_per_gpu": max(per_rank), "bytes_per_param": bpp,
        "bytes_per_gpu": max(per_rank) * bpp, "grad_bytes_per_gpu": max(per_rank) * 4,
        "optimizer_bytes_per_gpu": max(per_rank) * 12,
        "param_bytes_per_gpu": 0 if adapter is not None else max(per_rank) * 2}
for k, v in want.items():
    if t.get(k) != v:
        print("%s: train.%s is %s, the independent count %s" % (plan_path, k, t.get(k), v))
# every rank holds the same weights here: the training state adds on top
base_total = json.load(open(without_path))["total_bytes_per_gpu"]
if got["total_bytes_per_gpu"] != base_total + max(per_rank) * bpp:
    print("%s: total %d, want weights %d + training state %d" % (
        plan_path, got["total_bytes_per_gpu"], base_total, max(per_rank) * bpp))
print("ok %d params, %d per gpu, %d bytes per gpu" % (total, max(per_rank), max(per_rank) * bpp),
      file=sys.stderr)
EOF

# check PLAN NAME: report with and without "train", compare
check() {
	python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); p.pop("train"); p.pop("budget_gib", None); json.dump(p, open(sys.argv[2], "w"))' \
		"$1" "$(dirname "$1")/notrain-$(basename "$1")"
	run 0 "$2 json" "$B/msinv" footprint --json "$1"
	cp "$tmp/out" "$tmp/with.json"
	run 0 "$2 json without train" "$B/msinv" footprint --json "$(dirname "$1")/notrain-$(basename "$1")"
	cp "$tmp/out" "$tmp/without.json"
	python3 "$tmp/count.py" "$1" "$tmp/with.json" "$tmp/without.json" >"$tmp/diff" 2>"$tmp/note"
	if [ ! -s "$tmp/diff" ] && grep -q '^ok ' "$tmp/note"; then ok; else
		bad "$2: $(cat "$tmp/diff" "$tmp/note")"; fi
}

# 1. the agreed trainer plan on the per-expert fixture, EP 4 contiguous
mkdir "$tmp/plans"
cp "$FX/plans/train-lora.json" "$tmp/plans/"
sed -i "s|\"\.\./|\"$FX/|g" "$tmp/plans/train-lora.json"
check "$tmp/plans/train-lora.json" "per-expert lora"
run 0 "text" "$B/msinv" footprint "$tmp/plans/train-lora.json"
has "$tmp/out" "text names lora" "train: LoRA r=4 on 56 weights of 'base'"
has "$tmp/out" "text names the three parts" "LoRA weights 14.00 KiB (bf16), gradients 28.00 KiB (fp32), AdamW 84.00 KiB"
has "$tmp/out" "counted line" "counted: the weights each gpu holds (rows above), LoRA weights, gradients and AdamW state"
has "$tmp/out" "not counted line" "not counted: activations (batch 4 x seq_len 64)"
has "$tmp/out" "budget says what it covers" "the counted bytes fit"
if grep -q "to spare" "$tmp/out"; then bad "text still says 'to spare'"; else ok; fi
has "$tmp/out" "the trainer's part" "trainer on one gpu (mstrain --device cuda, bf16 GEMMs, batch 4 x seq_len 64)"

# the GPU trainer's part (gpu_plan.c; the GPU tier checks it against the
# trainer's allocations byte for byte): its parts add up, on-demand holds a
# fraction of the columnwise bytes and the same rowwise ones, activations
# grow with the sequence; a base without config.json says why in the
# report and the count still stands
run 0 "trainer json" "$B/msinv" footprint --json "$tmp/plans/train-lora.json"
cp "$tmp/out" "$tmp/fp64.json"
sed 's/"seq_len": 64/"seq_len": 128/' "$tmp/plans/train-lora.json" >"$tmp/plans/long.json"
run 0 "trainer json, longer sequences" "$B/msinv" footprint --json "$tmp/plans/long.json"
if python3 - "$tmp/fp64.json" "$tmp/out" <<'PY'
import json, sys
a, b = (json.load(open(p))["trainer"] for p in sys.argv[1:3])
r, d = a["resident"], a["on-demand"]
parts = ("nvfp4_rowwise", "nvfp4_colwise", "dense", "lora", "acts", "scratch")
assert a["colwise"] == "resident" and a["total"] == r["total"], a
for m in (r, d):
    assert m["total"] == sum(m[k] for k in parts), m
assert r["nvfp4_rowwise"] == d["nvfp4_rowwise"] > 0
assert 0 < d["nvfp4_colwise"] < r["nvfp4_colwise"] / 2, (d, r)
assert b["resident"]["acts"] > r["acts"] > 0 and b["resident"]["lora"] == r["lora"]
PY
then ok; else bad "the trainer part does not add up"; fi
# MS_DECODE_AHEAD, read as the trainer reads it: 0 holds one decode
# scratch fewer (the largest layer's decoded weights) and nothing else; a
# value the trainer refuses is said in the trainer's part
export MS_DECODE_AHEAD=0
run 0 "trainer json, the decode in line" "$B/msinv" footprint --json "$tmp/plans/train-lora.json"
cp "$tmp/out" "$tmp/fp-inline.json"
export MS_DECODE_AHEAD=sometimes
run 0 "MS_DECODE_AHEAD refused" "$B/msinv" footprint "$tmp/plans/train-lora.json"
has "$tmp/out" "MS_DECODE_AHEAD refused: said" "trainer on one gpu: no prediction: MS_DECODE_AHEAD 'sometimes': 0 (decode in line), 1"
# where a pass queues the next decode does not change what is held
export MS_DECODE_AHEAD=attn
run 0 "trainer json, the decode queued at the attention core" "$B/msinv" footprint --json "$tmp/plans/train-lora.json"
if cmp -s "$tmp/out" "$tmp/fp64.json"; then ok; else bad "MS_DECODE_AHEAD=attn: not the default's prediction"; fi
unset MS_DECODE_AHEAD
if python3 - "$tmp/fp64.json" "$tmp/fp-inline.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["trainer"] for p in sys.argv[1:3])
for m in ("resident", "on-demand"):
    x, y = a[m], b[m]
    assert 0 < y["scratch"] < x["scratch"], (x, y)
    assert all(x[k] == y[k] for k in ("nvfp4_rowwise", "nvfp4_colwise", "dense", "lora", "acts"))
PY
then ok; else bad "MS_DECODE_AHEAD=0 did not predict one decode scratch fewer"; fi
mkdir "$tmp/noconfig" && cp "$FX"/peft/qwen3moe-E8-r4/base/*.safetensors "$tmp/noconfig/"
sed "s|\"path\": \"[^\"]*\"|\"path\": \"$tmp/noconfig\"|" "$tmp/plans/train-lora.json" >"$tmp/plans/noconfig.json"
run 0 "no config.json" "$B/msinv" footprint "$tmp/plans/noconfig.json"
has "$tmp/out" "no config.json: said" "trainer on one gpu: no prediction: "

# 2. round-robin, EP 2, attention only
python3 - "$tmp/plans/train-lora.json" "$tmp/plans/rr.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
p.update(ep_size=2, placement="round-robin")
p["train"]["lora"].update(r=8, targets=["q_proj", "o_proj", "down_proj"])
json.dump(p, open(sys.argv[2], "w"))
EOF
check "$tmp/plans/rr.json" "round-robin"

# 3. fused 3-D experts (transformers 5 layout), written here
mkdir "$tmp/fused"
python3 - "$tmp/fused/model.safetensors" <<'EOF'
import json, struct, sys
ts = [("model.layers.%d.mlp.experts.gate_up_proj" % l, [8, 64, 64]) for l in range(2)] + \
     [("model.layers.%d.mlp.experts.down_proj" % l, [8, 64, 32]) for l in range(2)] + \
     [("model.layers.%d.self_attn.%s.weight" % (l, p), [64, 64]) for l in range(2)
      for p in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
     [("model.layers.%d.mlp.gate.weight" % l, [8, 64]) for l in range(2)]
hdr, off = {}, 0
for n, s in ts:
    b = 2
    for d in s:
        b *= d
    hdr[n] = {"dtype": "BF16", "shape": s, "data_offsets": [off, off + b]}
    off += b
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + off)
EOF
printf '{"ep_size": 4, "states": [{"role": "base", "path": "%s/fused"}], "train": {"lora": {"r": 2, "targets": ["experts", "q_proj", "v_proj"]}, "optimizer": {"name": "adamw"}}}\n' "$tmp" >"$tmp/plans/fused.json"
check "$tmp/plans/fused.json" "fused experts"

# 4. warm start: the adapter's own tensors, held resident in its rows
printf '{"ep_size": 4, "states": [{"role": "base", "path": "%s/peft/qwen3moe-E8-r4/base", "repr": "nvfp4-rowwise"}, {"role": "adapter", "path": "%s/peft/qwen3moe-E8-r4/adapter"}], "train": {"optimizer": {"name": "adamw"}}}\n' "$FX" "$FX" >"$tmp/plans/warm.json"
check "$tmp/plans/warm.json" "warm start"
run 0 "warm text" "$B/msinv" footprint "$tmp/plans/warm.json"
has "$tmp/out" "warm text" "the LoRA weights are the 'adapter' rows"

# 5. the budget: fits the weights alone, not with the training state
run 0 "train-lora json again" "$B/msinv" footprint --json "$tmp/plans/train-lora.json"
t=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["total_bytes_per_gpu"])' "$tmp/out")
python3 - "$tmp/plans/train-lora.json" "$tmp/plans/notrain-train-lora.json" "$tmp/plans" "$t" <<'EOF'
import json, sys
with_t, without_t, d, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
budget = (total - 1) / 2**30  # one byte short of weights + training state
for src, dst in ((with_t, "tight.json"), (without_t, "tight-notrain.json")):
    p = json.load(open(src)); p["budget_gib"] = budget
    json.dump(p, open(d + "/" + dst, "w"))
EOF
run 1 "over budget with the training state" "$B/msinv" footprint "$tmp/plans/tight.json"
has "$tmp/out" "over by" "over by 1 B"
run 0 "weights alone fit" "$B/msinv" footprint "$tmp/plans/tight-notrain.json"
has "$tmp/out" "no train section named" 'gradients and optimizer state (the plan has no "train" section)'

# 6. a bad "train" section: one line naming the key, exit 2
bad_plan() { # NAME TRAIN-JSON EXPECTED-FRAGMENT
	printf '{"ep_size": 4, "states": [{"role": "%s", "path": "%s/peft/qwen3moe-E8-r4/base"}], "train": %s}\n' \
		"${4:-base}" "$FX" "$2" >"$tmp/plans/bad.json"
	run 2 "$1" "$B/msinv" footprint "$tmp/plans/bad.json"
	one_line "$1"; has "$tmp/err" "$1" "$3"
}
bad_plan "sgd" '{"lora": {"r": 4, "targets": ["q_proj"]}, "optimizer": {"name": "sgd"}}' "key 'train.optimizer.name'"
bad_plan "optimizer name not a string" '{"lora": {"r": 4, "targets": ["q_proj"]}, "optimizer": {"name": 1}}' "key 'train.optimizer.name': expected a string"
bad_plan "r 0" '{"lora": {"r": 0, "targets": ["q_proj"]}}' "key 'train.lora.r'"
bad_plan "no targets" '{"lora": {"r": 4}}' "key 'train.lora.targets': missing"
bad_plan "target matches nothing" '{"lora": {"r": 4, "targets": ["nonesuch"]}}' "no weight of entry 'base' is a target"
bad_plan "nothing to train" '{"optimizer": {"name": "adamw"}}' "nothing to train"
bad_plan "lora without base" '{"lora": {"r": 4, "targets": ["q_proj"]}}' "needs an entry with role 'base'" quantized
bad_plan "train not an object" '[1]' "key 'train': expected an object"
bad_plan "batch" '{"lora": {"r": 4, "targets": ["q_proj"]}, "batch": -1}' "key 'train.batch'"

# 7. msinv launch reads the same plan: a train section footprint cannot
# count (another optimizer) is the trainer's business, not a bad plan
export MSINV_DB="$tmp/inv.db"
run 0 "init" "$B/msinv" init
run 0 "add base" "$B/msinv" add --label base "$FX/peft/qwen3moe-E8-r4/base"
printf '{"ep_size": 1, "states": [{"role": "base", "state": "base"}], "train": {"lora": {"r": 4, "targets": ["q_proj"]}, "optimizer": {"name": "lion", "lr": 1e-4}}}\n' >"$tmp/plans/lion.json"
run 0 "launch accepts another optimizer" "$B/msinv" launch --plan "$tmp/plans/lion.json" -- true
run 2 "footprint cannot count it" "$B/msinv" footprint "$tmp/plans/lion.json"
one_line "footprint cannot count it"; has "$tmp/err" "lion named" "key 'train.optimizer.name': 'lion'"

echo "footprint_train: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
