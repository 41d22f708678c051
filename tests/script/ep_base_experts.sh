#!/bin/sh
# A fused LoRA's expert count is rows / r: a wrong "r" in
# adapter_config.json splits the 16 experts of qwen3moe-E16-r3-fused into
# "12" with every shape consistent. It is caught against the base's expert
# count (--base PATH or STATE, or the adapter's parent in the inventory):
# msshard split refuses it (exit 2, nothing written or registered),
# msverify ep fails the set it made (exit 1, a fault of kind experts). An
# adapter whose attention LoRA pins r is caught without a base.
. "$(dirname "$0")/lib.sh"
unset MSINV_DB

absent() { [ ! -e "$1" ] && ok || bad "$1 exists"; }

F="$FX/peft/qwen3moe-E16-r3-fused"
A=base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight
cp -r "$F/adapter" "$W/wrong"
sed 's/"r": 3/"r": 4/' "$F/adapter/adapter_config.json" >"$W/wrong/adapter_config.json"

# the right r: 16 experts, agreeing with the base
expect 0 "$B/msshard" split "$F/adapter" -o "$W/good" --ep-size 4 --base "$F/base"
has "16 experts" "$W/out" "right r gives 16 experts"
expect 0 "$B/msverify" ep --base "$F/base" "$W/good"

# msshard split: the base's 16 against the 12 the wrong r makes
expect 2 "$B/msshard" split "$W/wrong" -o "$W/s1" --ep-size 4 --base "$F/base"
one_line
has "tensor '$A' in '$W/wrong': 48 rows at r=4 (adapter_config.json) make 12 experts, but the base '$F/base' has 16" "$W/err" "split names tensor, rule and counts"
absent "$W/s1"
# the base as a state of the inventory, and as the adapter's parent there
"$B/msinv" init --db "$W/inv.db" >/dev/null
"$B/msinv" add --db "$W/inv.db" --label base16 "$F/base" >/dev/null
"$B/msinv" add --db "$W/inv.db" --label lora-wrong --parent base16 --op train "$W/wrong" >/dev/null
expect 2 "$B/msshard" split "$W/wrong" -o "$W/s2" --ep-size 4 --base base16 --no-register --db "$W/inv.db"
has "but the base 'base16' has 16" "$W/err" "split --base STATE"
expect 2 "$B/msshard" split "$W/wrong" -o "$W/s3" --ep-size 4 --db "$W/inv.db"
one_line
has "12 experts at r=4 (adapter_config.json), but the base 'base16' (an ancestor in the inventory) has 16" "$W/err" "split against the inventory parent"
absent "$W/s3"
"$B/msinv" ls --db "$W/inv.db" >"$W/ls"
if grep -q adapter_shard "$W/ls"; then bad "a refused split registered shards"; else ok; fi

# a set the wrong r made (no base given to split): msverify ep fails it
expect 0 "$B/msshard" split "$W/wrong" -o "$W/bad" --ep-size 4 --no-register
expect 1 "$B/msverify" ep --base "$F/base" "$W/bad"
one_line
has "48 rows at r=4 (adapter_config.json) make 12 experts, but the base '$F/base' has 16" "$W/err" "ep --base"
has "^FAIL" "$W/out" "ep says FAIL"
expect 1 "$B/msverify" ep --json --base "$F/base" "$W/bad"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["result"]=="fail" and [f["kind"] for f in d["faults"]]==["experts"]' "$W/out" && ok || bad "ep --json experts fault"
expect 1 "$B/msverify" ep --db "$W/inv.db" --base base16 "$W/bad"
has "but the base 'base16' has 16" "$W/err" "ep --base STATE"
expect 1 "$B/msverify" ep --db "$W/inv.db" "$W/bad"
has "12 experts at r=4 (adapter_config.json), but the base 'base16' (an ancestor of its source in the inventory) has 16" "$W/err" "ep against the inventory parent"

# a base that cannot say: no config.json, no such state
mkdir "$W/nocfg" && cp "$F/base/model.safetensors" "$W/nocfg/"
expect 2 "$B/msverify" ep --base "$W/nocfg" "$W/good"
one_line
has "no config.json" "$W/err" "base without config.json"
expect 2 "$B/msshard" split "$F/adapter" -o "$W/s4" --ep-size 4 --base nosuchstate
one_line

# attention LoRA pins r: a wrong r is refused without any base
cp -r "$FX/peft/qwen3moe-E8-r4/adapter" "$W/w8"
sed 's/"r": 4/"r": 2/' "$FX/peft/qwen3moe-E8-r4/adapter/adapter_config.json" >"$W/w8/adapter_config.json"
expect 2 "$B/msshard" split "$W/w8" -o "$W/s5" --ep-size 4
one_line
has "lora_A has rank 4, but adapter_config.json gives r=2" "$W/err" "attention LoRA shape against r"
absent "$W/s5"

echo "ep_base_experts: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
