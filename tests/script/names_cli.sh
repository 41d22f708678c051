#!/bin/sh
# Naming states from the command line: several labels per state, relabel
# and moves (msinv label), --label on msconvert and msshard outputs, a path
# wherever a STATE is, and the audit log recording the command line as it
# was typed with its working directory.
. "$(dirname "$0")/lib.sh"
BDIR=$(cd "$B" && pwd)
FX=$(cd "${MS_FIXTURES:-tests/fixtures}" && pwd)
W=$(cd "$W" && pwd -P)
export MSINV_DB="$W/inv.db"
I="$BDIR/msinv"

if ! command -v python3 >/dev/null 2>&1; then
	echo "names_cli: skipped (needs python3)"
	echo "names_cli: 0 passed, 0 failed"
	exit 0
fi


# expect RC DESCRIPTION COMMAND...: exit status RC; stdout in $W/out,
# stderr in $W/err; a failure is one line on stderr
expect() {
	_rc=$1; _d=$2; shift 2
	"$@" >"$W/out" 2>"$W/err"
	_got=$?
	if [ "$_got" -ne "$_rc" ]; then
		bad "$_d: exit $_got, expected $_rc"; sed 's/^/  /' "$W/err" | head -n 5; return 1
	fi
	if [ "$_rc" -ne 0 ] && [ "$(grep -c . "$W/err")" -lt 1 ]; then
		bad "$_d: no message on stderr"; return 1
	fi
	ok
}

# field JSONFILE EXPR: a python expression over the parsed document d
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

"$I" init >/dev/null

# ---- the command line as typed, with its working directory --------------
mkdir -p "$W/work"
cp -r "$FX/hf/qwen3moe" "$W/work/base"
(cd "$W/work" && "$I" add base --label base >/dev/null) || bad "add from a subdirectory"
"$I" log --json >"$W/log.json"
want='["'"$I"'", "add", "base", "--label", "base"]'
got=$(field "$W/log.json" '[e["argv"] for e in d if e["action"] == "add"][0]')
[ "$got" = "$(python3 -c "print($want)")" ] && ok || bad "log argv is not as typed: $got"
[ "$(field "$W/log.json" '[e["cwd"] for e in d if e["action"] == "add"][0]')" = "$W/work" ] && ok ||
	bad "log has no working directory"
[ "$(field "$W/log.json" '[e["detail"]["files"][0] for e in d if e["action"] == "add"][0]')" = \
  "$W/work/base/model.safetensors" ] && ok || bad "add detail: files not absolute"
"$I" log --check >/dev/null && ok || bad "log chain with working directories"
if expect 0 "show" "$I" show base && grep -q "add base --label base (in $W/work)\$" "$W/out"; then ok; else
	bad "show: command line and directory"; grep created "$W/out"
fi

# msconvert: its options after the operands, recorded where they were typed
(cd "$W/work" && "$BDIR/msconvert" quantize base -o base-nvfp4 --block 2d --label nvfp4 \
	>/dev/null 2>&1) || bad "msconvert quantize --label"
"$I" log --json >"$W/log.json"
got=$(field "$W/log.json" '" ".join([e["argv"] for e in d if e["tool"] == "msconvert"][-1][1:])')
[ "$got" = "quantize base -o base-nvfp4 --block 2d --label nvfp4" ] && ok ||
	bad "msconvert argv permuted: $got"

# ---- --label on msconvert and msshard outputs ----------------------------
expect 0 "ls" "$I" ls
grep -q "	nvfp4	" "$W/out" && ok || bad "msconvert --label: output not labelled"; 
expect 0 "lineage by label" "$I" lineage nvfp4 && grep -q "(nvfp4)" "$W/out" && grep -q "(base)" "$W/out" &&
	ok || bad "lineage does not name both states"
expect 2 "msconvert --label malformed" "$BDIR/msconvert" quantize "$W/work/base" -o "$W/q2" --label beef
[ ! -e "$W/q2" ] && ok || bad "a malformed label left an output"
expect 2 "msconvert --label without an inventory" env -u MSINV_DB "$BDIR/msconvert" quantize \
	"$W/work/base" -o "$W/q3" --label x-y
expect 2 "msconvert --label of another state" "$BDIR/msconvert" dequantize "$W/work/base-nvfp4" \
	-o "$W/dq" --label base
[ ! -e "$W/dq" ] && ok || bad "a refused label left the output in place"

A="$FX/peft/qwen3moe-E8-r4"
expect 0 "msshard split --label" "$BDIR/msshard" split "$A" -o "$W/ep4" --ep-size 4 --label lora-ep4
for r in 0 1 2 3; do
	"$I" show "lora-ep4/rank$r" >"$W/out" 2>&1 && grep -q "rank $r of 4" "$W/out" && ok ||
		bad "shard $r not labelled lora-ep4/rank$r"
done
expect 0 "msshard merge --label" "$BDIR/msshard" merge "$W/ep4" -o "$W/merged" --label lora-merged
expect 0 "merged = adapter" "$I" show lora-merged
grep -q '^copy 2' "$W/out" && ok || bad "merge: not another copy of the adapter"

# ---- several labels; msinv label ------------------------------------------
cp -r "$FX/hf/qwen3moe-sharded" "$W/work/sharded"
expect 0 "second copy under another label" "$I" add --label base-sharded "$W/work/sharded"
expect 0 "ls --json" "$I" ls --json
[ "$(field "$W/out" '[",".join(s["labels"]) for s in d if s["label"] == "base"][0]')" = "base,base-sharded" ] &&
	ok || bad "a state does not keep both labels"
expect 0 "label" "$I" label base v1
expect 0 "by the new label" "$I" show v1
expect 2 "label of another state" "$I" label nvfp4 v1
grep -q "already names" "$W/err" && ok || bad "refusal does not say why"
expect 0 "label --force moves it" "$I" label --force nvfp4 v1
expect 0 "show" "$I" show v1 && grep -q "^label     nvfp4 v1$" "$W/out" && ok || bad "moved label"
expect 0 "label --rename" "$I" label --rename base-sharded main
expect 2 "old name gone" "$I" show base-sharded
expect 0 "label --delete" "$I" label --delete main
expect 2 "label --delete unknown" "$I" label --delete main
expect 2 "label --rename of a digest" "$I" label --rename "$(printf %.20s "$("$I" show nvfp4 | sed -n 's/^state  *//p')")" x-1
expect 0 "show v1 still" "$I" show v1
expect 2 "usage" "$I" label onlyone
"$I" log --json >"$W/log.json"
[ "$(field "$W/log.json" 'sum(1 for e in d if e["action"] == "unlabel")')" = 2 ] && ok ||
	bad "unlabel entries missing from the log"
[ "$(field "$W/log.json" 'sum(1 for e in d if e["action"] == "label" and "from" in e["detail"])')" = 1 ] &&
	ok || bad "the move is not in the log"
expect 0 "log --check" "$I" log --check

# ---- a path wherever a STATE is ----------------------------------------
base=$("$I" show base | sed -n 's/^state  *//p')
expect 0 "show DIR" "$I" show "$W/work/base" && grep -q "^state     $base\$" "$W/out" && ok ||
	bad "show DIR: not the state stored there"
(cd "$W/work" && "$I" show base/model.safetensors) >"$W/out" 2>&1 &&
	grep -q "^state     $base\$" "$W/out" && ok || bad "show FILE (relative)"
expect 0 "show the sharded copy's directory" "$I" show "$W/work/sharded"
grep -q "^state     $base\$" "$W/out" && ok || bad "the second copy's directory"
expect 0 "verify files DIR" "$BDIR/msverify" files "$W/work/base"
expect 0 "export DIR" "$I" export -o "$W/b.tar.zst" "$W/work/base"
expect 2 "a directory with nothing recorded" "$I" show "$FX/hf/mixtral"
grep -q "no state" "$W/err" && ok || bad "unrecorded path: message"
expect 2 "a directory holding several states" "$I" show "$W/ep4"
grep -q "several states" "$W/err" && ok || bad "several states: message"
expect 0 "a shard file" "$I" show "$(ls "$W"/ep4/*.safetensors | head -n 1)"
expect 0 "label DIR NAME" "$I" label "$W/work/base" by-path
expect 0 "lineage DIR" "$I" lineage "$W/work/base-nvfp4"

echo "names_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
