#!/bin/sh
# The gate and its neighbours from the command line: msinv launch (allowed,
# refused on a flipped bit, on a missing state, on a shard of the wrong EP
# size; a check that cannot be made is exit 3, not a refusal; exit status
# and signals passed through; every run recorded), msinv export-manifest
# (plain and signed) with msverify files --manifest on a copy elsewhere,
# msinv export / import (all or nothing; a rerun adopts what a killed import
# left), and msverify policy.
. "$(dirname "$0")/lib.sh"
export MSINV_DB="$W/inv.db"

q() { sqlite3 "$MSINV_DB" "$1"; }

cd "$W" || exit 3
cp -r "$FX/peft/qwen3moe-E8-r4/base" base
cp -r "$FX/peft/qwen3moe-E8-r4/adapter" adapter
expect 0 "$B/msinv" init
expect 0 "$B/msinv" add --label base base
expect 0 "$B/msinv" add --label lora --parent base --op train adapter
cat >plan.json <<'EOF'
{"ep_size": 1, "outputs": "runs/x",
 "states": [{"role": "base", "state": "base"}, {"role": "lora-adapter", "state": "lora"}]}
EOF

# ---- allowed: the environment, the exit status, the run record ----
base=$("$B/msinv" show --json base | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
expect 0 "$B/msinv" launch --plan plan.json -- sh -c 'env | grep ^MSINV_ | sort'
case "$base" in sha256:*) ok;; *) bad "show --json gave no state digest";; esac
has "MSINV_STATE_BASE=$base" "$W/out" "base digest in the environment"
has "MSINV_PATH_BASE=$W/base" "$W/out" "base path in the environment"
has "MSINV_STATE_LORA_ADAPTER=sha256:" "$W/out" "role with a dash"
has "MSINV_OUTPUTS=runs/x" "$W/out" "outputs"
has "MSINV_RUN=1" "$W/out" "run number"
expect 7 "$B/msinv" launch --plan plan.json -- sh -c 'exit 7'
[ "$(q "SELECT status || ' ' || exit_code FROM runs WHERE id = 2")" = "failed 7" ] && ok || bad "run 2 not recorded as failed 7"
[ "$(q "SELECT status || ' ' || exit_code FROM runs WHERE id = 1")" = "ok 0" ] && ok || bad "run 1 not recorded as ok"
[ "$(q "SELECT count(*) FROM run_inputs WHERE run_id = 1")" = 2 ] && ok || bad "run 1 inputs"

# signals reach the command; the launcher records how it ended
"$B/msinv" launch --plan plan.json -- sh -c 'trap "exit 42" TERM; while :; do sleep 0.1; done' \
	>"$W/out" 2>"$W/err" &
lpid=$!
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
	grep -q starting "$W/err" 2>/dev/null && break
	sleep 0.2
done
sleep 0.3
kill -TERM "$lpid"
wait "$lpid"
[ $? -eq 42 ] && ok || bad "TERM not forwarded to the command"
[ "$(q "SELECT exit_code FROM runs WHERE id = 3")" = 42 ] && ok || bad "run 3 exit not recorded"

# --trust-recent takes the last verification, when it started over 2 s
# after the files' last change; --dry-run records nothing
sleep 2.2
expect 0 "$B/msinv" launch --plan plan.json -- true
expect 0 "$B/msinv" launch --trust-recent --plan plan.json -- true
has "trusted" "$W/err" "--trust-recent says it trusted"
n=$(q "SELECT count(*) FROM runs")
expect 0 "$B/msinv" launch --dry-run --plan plan.json
[ "$(q "SELECT count(*) FROM runs")" = "$n" ] && ok || bad "--dry-run recorded a run"

# ---- refused: a flipped bit, a missing state, the wrong EP size ----
cp base/model.safetensors model.orig
python3 - <<'EOF'
with open("base/model.safetensors", "r+b") as f:
    f.seek(150000); b = f.read(1); f.seek(150000); f.write(bytes([b[0] ^ 4]))
EOF
expect 1 "$B/msinv" launch --trust-recent --plan plan.json -- touch ran
one_line
has "role 'base'" "$W/err" "refusal names the role"
has "digest mismatch" "$W/err" "refusal says what"
[ ! -e ran ] && ok || bad "the command ran on a tampered state"
# recorded with the status the launcher exits with (1), not a status of
# the command, which never ran
[ "$(q "SELECT status || ' ' || exit_code FROM runs ORDER BY id DESC LIMIT 1")" = "failed 1" ] && ok || bad "refused run not recorded with exit 1"
[ "$(q "SELECT count(*) FROM events WHERE kind = 'launch_refused'")" = 1 ] && ok || bad "launch_refused event"
expect 1 "$B/msverify" files base
cp model.orig base/model.safetensors
expect 0 "$B/msinv" launch --plan plan.json -- true

cat >plan-missing.json <<'EOF'
{"ep_size": 1, "states": [{"role": "base", "state": "nosuchlabel"}]}
EOF
expect 1 "$B/msinv" launch --plan plan-missing.json -- touch ran
has "nosuchlabel" "$W/err" "missing state named"
[ ! -e ran ] && ok || bad "the command ran without its state"

expect 0 "$B/msshard" split adapter -o ep4 --ep-size 4
expect 0 "$B/msinv" add --label shard0 ep4/adapter_model-ep00000-of-00004.safetensors
cat >plan-ep.json <<'EOF'
{"ep_size": 2, "states": [{"role": "base", "state": "base"}, {"role": "adapter", "state": "shard0"}]}
EOF
expect 1 "$B/msinv" launch --plan plan-ep.json -- touch ran
has "msshard reshard --ep-size 2" "$W/err" "wrong EP size says to reshard"
[ ! -e ran ] && ok || bad "the command ran with shards of another EP size"
expect 2 "$B/msinv" launch --plan plan.json
expect 2 "$B/msinv" launch -- true
printf '{"states": []}' >plan-bad.json
expect 2 "$B/msinv" launch --plan plan-bad.json -- true
one_line

# ---- a file that cannot be read is no verdict: exit 3, recorded as failed ----
# (a symbolic link to itself: opening it fails with ELOOP, as a dead disk or
# a permission would; the bytes were not compared, so this is not exit 1)
mv base/config.json config.orig
ln -s config.json base/config.json
nref=$(q "SELECT count(*) FROM events WHERE kind = 'launch_refused'")
expect 3 "$B/msinv" launch --plan plan.json -- touch ran
one_line
has "role 'base'" "$W/err" "the failure names the role"
has "config.json" "$W/err" "the failure names the file"
[ ! -e ran ] && ok || bad "the command ran on a state that was not checked"
[ "$(q "SELECT status || ' ' || exit_code FROM runs ORDER BY id DESC LIMIT 1")" = "failed 3" ] && ok || bad "failed launch not recorded with exit 3"
[ "$(q "SELECT count(*) FROM events WHERE kind = 'launch_failed'")" = 1 ] && ok || bad "launch_failed event"
[ "$(q "SELECT count(*) FROM events WHERE kind = 'launch_refused'")" = "$nref" ] && ok || bad "a failed check recorded as a refusal"
rm base/config.json
mv config.orig base/config.json
expect 0 "$B/msinv" launch --plan plan.json -- true

# ---- manifests for hosts without the database ----
openssl ecparam -name prime256v1 -genkey -noout -out key.pem 2>/dev/null
openssl ec -in key.pem -pubout -out key.pub 2>/dev/null
expect 0 "$B/msinv" export-manifest --sign key.pem -o lora.json lora
mkdir host2 && cp -r adapter host2/adapter && cp lora.json lora.json.sig host2/adapter/
expect 0 "$B/msverify" files --manifest host2/adapter/lora.json --sig host2/adapter/lora.json.sig --pub key.pub
expect 2 "$B/msinv" export-manifest -o lora.json lora
python3 - <<'EOF'
with open("host2/adapter/adapter_model.safetensors", "r+b") as f:
    f.seek(5000); b = f.read(1); f.seek(5000); f.write(bytes([b[0] ^ 1]))
EOF
expect 1 "$B/msverify" files --manifest host2/adapter/lora.json
has "digest mismatch" "$W/out" "manifest check names the tensor"
sed -i 's/"lora"/"lorb"/' host2/adapter/lora.json
expect 1 "$B/msverify" files --manifest host2/adapter/lora.json --sig host2/adapter/lora.json.sig --pub key.pub
has "signs" "$W/err" "edited manifest refused by its signature"

# ---- export / import: all or nothing; a rerun adopts a complete DIR ----
notemp() { [ -z "$(ls -a | grep -e '\.tmp-' -e '\.import-' -e '\.replaced-')" ] && ok || bad "$1 left a temporary: $(ls -a | tr '\n' ' ')"; }
refuse_states() {
	sqlite3 "$1" "CREATE TRIGGER no_states BEFORE INSERT ON states BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END;"
}
expect 0 "$B/msinv" export -o base.tar.zst base
# a registration that fails (a trigger refuses the state) leaves no DIR
expect 0 "$B/msinv" init --db imp.db
refuse_states imp.db
expect 3 "$B/msinv" import --db imp.db base.tar.zst imported
one_line
[ ! -e imported ] && ok || bad "failed import left its directory"
notemp "failed import"
[ "$(sqlite3 imp.db "SELECT count(*) FROM states")" = 0 ] && ok || bad "failed import registered a state"
sqlite3 imp.db "DROP TRIGGER no_states"
expect 0 "$B/msinv" import --db imp.db base.tar.zst imported
has "^imported	$base	imported	" "$W/out" "import prints the state"
# the same import again: DIR exists and is registered: refused
expect 2 "$B/msinv" import --db imp.db base.tar.zst imported
has "exists" "$W/err" "a second import into a registered DIR is refused"
# DIR complete but registered nowhere (an import killed between the rename
# and the commit leaves that): the rerun verifies it and adopts it
expect 0 "$B/msinv" init --db adopt.db
expect 0 "$B/msinv" import --db adopt.db base.tar.zst imported
has "^adopted	$base	imported	" "$W/out" "the rerun adopts DIR"
[ "$(sqlite3 adopt.db "SELECT count(*) FROM states")" = 1 ] && ok || bad "adopted DIR not registered"
expect 0 "$B/msverify" files --db adopt.db
# a DIR whose files differ from the archive is not adopted
expect 0 "$B/msinv" init --db adopt2.db
python3 - <<'EOF'
with open("imported/model.safetensors", "r+b") as f:
    f.seek(150000); b = f.read(1); f.seek(150000); f.write(bytes([b[0] ^ 4]))
EOF
expect 2 "$B/msinv" import --db adopt2.db base.tar.zst imported
one_line
has "does not hold what the archive holds" "$W/err" "a changed DIR is refused, saying why"
[ "$(sqlite3 adopt2.db "SELECT count(*) FROM states")" = 0 ] && ok || bad "a changed DIR was registered"
# --force replaces it; a failure on the way puts the old one back
cp imported/model.safetensors model.changed
refuse_states adopt2.db
expect 3 "$B/msinv" import --db adopt2.db --force base.tar.zst imported
cmp -s imported/model.safetensors model.changed && ok || bad "a failed --force import did not put the old DIR back"
notemp "failed --force import"
sqlite3 adopt2.db "DROP TRIGGER no_states"
expect 0 "$B/msinv" import --db adopt2.db --force base.tar.zst imported
expect 0 "$B/msverify" files --db adopt2.db
notemp "import --force"

# ---- served policy ----

mkdir served && cp -r base served/base && cp -r adapter served/adapter
expect 0 "$B/msverify" policy served/base served/adapter
has "identified" "$W/out" "policy identified"
has "lora" "$W/out" "policy names the adapter"
expect 0 "$B/msverify" policy --register --label served-v1 served/base served/adapter
expect 0 "$B/msinv" lineage served-v1
has "compose" "$W/out" "policy derived by compose"
python3 - <<'EOF'
with open("served/adapter/adapter_model.safetensors", "r+b") as f:
    f.seek(5000); b = f.read(1); f.seek(5000); f.write(bytes([b[0] ^ 1]))
EOF
expect 1 "$B/msverify" policy served/base served/adapter
has "mismatch" "$W/out" "a changed served tensor is a mismatch"
expect 0 "$B/msinv" log --check

echo "gate_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
