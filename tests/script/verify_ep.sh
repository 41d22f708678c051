#!/bin/sh
# msverify ep: a good shard set passes for fused, per-expert and base
# layouts; the planted "every rank loaded the same block" fault is named in
# those words on every slice it touched; a missing shard, a shard of another set, a replica that
# differs, a lying manifest and a wrong EP size each fail with one line.
. "$(dirname "$0")/lib.sh"
unset MSINV_DB

flip() { python3 - "$1" "$2" <<'EOF'
import json, struct, sys
path, name = sys.argv[1], sys.argv[2]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    off = 8 + n + h[name]["data_offsets"][0]
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 1]))
EOF
}

# fused LoRA on the experts (PEFT target_parameters), per-expert LoRA
# (Mixtral w1/w2/w3), and a base checkpoint's expert weights
for case in "peft/qwen3moe-E8-r4/adapter 4" "peft/qwen3moe-E6-r3/adapter 3" \
	    "peft/mixtral-perexpert-E6-r3/adapter 2" "hf/qwen3moe 4"; do
	set -- $case
	name=$(echo "$1" | tr '/' '_')
	expect 0 "$B/msshard" split "$FX/$1" -o "$W/$name" --ep-size "$2"
	expect 0 "$B/msverify" ep "$W/$name"
	has "^ok" "$W/out" "$1 verifies"
	expect 0 "$B/msverify" ep --ep-size "$2" "$W/$name/ep_manifest.json"
	cp -r "$W/$name" "$W/$name-bad"
	python3 "$ROOT/tools/scripts/plant_same_block.py" "$W/$name-bad" >/dev/null
	expect 1 "$B/msverify" ep "$W/$name-bad"
	# one line per expert slice of rank 1, each named for what it is
	[ "$(grep -vc 'the same expert block appears under different global expert ids' "$W/err")" -eq 0 ] &&
		[ "$(wc -l <"$W/err")" -gt 1 ] && ok || { bad "$1: a line that is not the planted fault"; cat "$W/err"; }
	has "every rank loaded the same block" "$W/err" "$1: planted fault explained"
done

S="$W/peft_qwen3moe-E8-r4_adapter"
# the wrong EP size for the run
expect 1 "$B/msverify" ep --ep-size 8 "$S"
has "msshard reshard --ep-size 8" "$W/err" "wrong EP size says to reshard"
# a missing shard
cp -r "$S" "$W/missing" && rm "$W/missing/adapter_model-ep00002-of-00004.safetensors"
expect 2 "$B/msverify" ep "$W/missing"
one_line
# a shard of another set beside them
"$B/msshard" split "$FX/peft/qwen3moe-E8-r4/adapter" -o "$W/ep2" --ep-size 2 >/dev/null
cp -r "$S" "$W/mixed" && cp "$W/ep2/adapter_model-ep00000-of-00002.safetensors" "$W/mixed/"
expect 2 "$B/msverify" ep "$W/mixed"
one_line
# a replica (attention LoRA) that differs on one rank
cp -r "$S" "$W/replica"
flip "$W/replica/adapter_model-ep00003-of-00004.safetensors" \
	base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight
expect 1 "$B/msverify" ep "$W/replica"
one_line
has "replicas differ" "$W/err" "differing replica named"
# an expert's bytes changed (no other expert's): a plain digest mismatch
cp -r "$S" "$W/bits"
flip "$W/bits/adapter_model-ep00001-of-00004.safetensors" \
	base_model.model.model.layers.0.mlp.experts.lora_B.weight
expect 1 "$B/msverify" ep "$W/bits"
one_line
has "digest" "$W/err" "changed expert bytes named"
# a manifest that lies about a shard's state digest
cp -r "$S" "$W/lie"
python3 - "$W/lie/ep_manifest.json" <<'EOF'
import json, sys
p = sys.argv[1]
m = json.load(open(p))
d = m["shards"][2]["state_digest"]
m["shards"][2]["state_digest"] = d[:7] + ("1" if d[7] == "0" else "0") + d[8:]
json.dump(m, open(p, "w"), indent=1)
EOF
expect 1 "$B/msverify" ep "$W/lie"
one_line
# with an inventory, the shards must be the states recorded for them
"$B/msinv" init --db "$W/inv.db" >/dev/null
expect 1 "$B/msverify" ep --db "$W/inv.db" "$S"
has "not in the inventory" "$W/err" "unrecorded shard named"
for r in 0 1 2 3; do
	"$B/msinv" add --db "$W/inv.db" "$S/adapter_model-ep0000$r-of-00004.safetensors" >/dev/null
done
expect 0 "$B/msverify" ep --db "$W/inv.db" "$S"
expect 0 "$B/msverify" ep --json "$S"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["result"]=="ok" and len(d["ranks"])==4' "$W/out" && ok || bad "ep --json"
expect 2 "$B/msverify" ep
expect 2 "$B/msverify" ep "$W/nowhere"
one_line

echo "verify_ep: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
