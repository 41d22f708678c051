#!/bin/sh
# msinv launch with an EP shard set as a plan entry ("path": the directory
# msshard wrote, or its ep_manifest.json): the whole set is verified (every
# shard, every expert, the manifest), it must be split for the plan's EP
# size and every shard must be recorded; the run records each shard as
# consumed. A set with a fault, of another EP size or not recorded refuses
# the run, and a refused run is recorded with the status the launcher
# exits with.
. "$(dirname "$0")/lib.sh"
export MSINV_DB="$W/inv.db"

q() { sqlite3 "$MSINV_DB" "$1"; }
last_run() { q "SELECT status || ' ' || exit_code FROM runs ORDER BY id DESC LIMIT 1"; }

cd "$W" || exit 3
cp -r "$FX/peft/qwen3moe-E8-r4/base" base
cp -r "$FX/peft/qwen3moe-E8-r4/adapter" adapter
expect 0 "$B/msinv" init
expect 0 "$B/msinv" add --label base base
expect 0 "$B/msinv" add --label lora --parent base --op train adapter
expect 0 "$B/msshard" split adapter -o lora-ep4 --ep-size 4
lora=$(q "SELECT digest FROM states WHERE label = 'lora'")
cat >plan.json <<'EOF'
{"ep_size": 4, "states": [{"role": "base", "state": "base"}, {"role": "adapter", "path": "lora-ep4"}]}
EOF

# ---- the set verifies: the run starts, with the set in its environment ----
expect 0 "$B/msinv" launch --plan plan.json -- sh -c 'env | grep ^MSINV_ | sort'
has "MSINV_STATE_ADAPTER=$lora" "$W/out" "the role's state is the set's source"
has "MSINV_PATH_ADAPTER=$W/lora-ep4" "$W/out" "the role's path is the set"
has "adapter $lora verified as an EP=4 shard set of 4 shards" "$W/err" "launch says what it verified"
[ "$(last_run)" = "ok 0" ] && ok || bad "run not recorded ok: $(last_run)"
[ "$(q "SELECT count(*) FROM run_inputs WHERE run_id = 1")" = 6 ] && ok || bad "run inputs: base, source and 4 shards"
[ "$(q "SELECT count(*) FROM run_inputs r JOIN states s ON s.id = r.state_id WHERE r.run_id = 1 AND s.kind = 'adapter_shard'")" = 4 ] && ok || bad "every shard recorded as consumed"
# the manifest itself names the set too
sed 's#"lora-ep4"#"lora-ep4/ep_manifest.json"#' plan.json >plan-m.json
expect 0 "$B/msinv" launch --plan plan-m.json -- true

# ---- a fault in the set refuses the run ----
cp -r lora-ep4 lora-bad
python3 "$ROOT/tools/scripts/plant_same_block.py" lora-bad >/dev/null
for r in 0 1 2 3; do "$B/msinv" add lora-bad/adapter_model-ep0000$r-of-00004.safetensors >/dev/null 2>&1; done
sed 's#"lora-ep4"#"lora-bad"#' plan.json >plan-bad.json
expect 1 "$B/msinv" launch --plan plan-bad.json -- touch ran
one_line
has "role 'adapter': shard set .*the same expert block appears under different global expert ids" "$W/err" "the refusal names the fault"
[ ! -e ran ] && ok || bad "the command ran on a faulty shard set"
[ "$(last_run)" = "failed 1" ] && ok || bad "refused run recorded as $(last_run), the launcher exited 1"

# ---- another EP size ----
cat >plan-ep2.json <<'EOF'
{"ep_size": 2, "states": [{"role": "adapter", "path": "lora-ep4"}]}
EOF
expect 1 "$B/msinv" launch --plan plan-ep2.json -- touch ran
has "is an EP=4 split, the plan runs EP=2: run 'msshard reshard" "$W/err" "wrong EP size says to reshard"
[ ! -e ran ] && ok || bad "the command ran with a set of another EP size"

# ---- shards nobody recorded (the same adapter, placed otherwise) ----
"$B/msshard" split --no-register adapter -o lora-unrec --ep-size 4 --placement round-robin >/dev/null
sed 's#"lora-ep4"#"lora-unrec"#' plan.json >plan-unrec.json
expect 1 "$B/msinv" launch --plan plan-unrec.json -- touch ran
has "rank 0 of shard set .*not in the inventory" "$W/err" "an unrecorded shard refuses the run"
[ ! -e ran ] && ok || bad "the command ran on unrecorded shards"

# ---- a shard set that is not whole: bad input, still a refusal ----
cp -r lora-ep4 lora-missing && rm lora-missing/adapter_model-ep00003-of-00004.safetensors
sed 's#"lora-ep4"#"lora-missing"#' plan.json >plan-missing.json
expect 1 "$B/msinv" launch --plan plan-missing.json -- touch ran
has "the shard of rank 3 is missing" "$W/err" "a missing shard named"
[ "$(last_run)" = "failed 1" ] && ok || bad "refused run recorded as $(last_run)"

echo "launch_shardset: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
