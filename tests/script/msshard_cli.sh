#!/bin/sh
# msshard from the command line: output, exit codes (0 ok, 1 a check found
# a difference, 2 usage or bad input), one-line errors that name the file
# and tensor, round trips compared with cmp, all-or-nothing output (--force
# and what it may replace; with a fault-injection build, a failure at every
# write, fsync and rename and at a sample of allocations leaves nothing),
# and the man page's EXAMPLES run as written.
. "$(dirname "$0")/lib.sh"
tmp=$W
M="$B/msshard"


# run EXPECTED_RC NAME CMD...: stdout in $tmp/out, stderr in $tmp/err
run() {
	want=$1; name=$2; shift 2
	"$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" -eq "$want" ]; then ok; else bad "$name: exit $rc, want $want: $(cat "$tmp/err")"; fi
}
has() { # FILE NAME PATTERN: a fixed string in the file
	if grep -qF -- "$3" "$1"; then ok; else bad "$2: no '$3' in: $(cat "$1")"; fi
}
one_line() { # stderr is exactly one line starting with "msshard: "
	if [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q '^msshard: ' "$tmp/err"; then ok; else
		bad "$1: stderr is not one 'msshard:' line: $(cat "$tmp/err")"; fi
}
same() { # A B NAME
	if cmp -s "$1" "$2"; then ok; else bad "$3: $1 and $2 differ"; fi
}
# flip the last byte of a file (in the shards, the last tensor's)
flip_last() {
	size=$(wc -c <"$1")
	b=$(od -An -tu1 -j $((size - 1)) -N1 "$1" | tr -d ' ')
	printf "$(printf '\\%03o' $(((b + 1) % 256)))" |
		dd of="$1" bs=1 seek=$((size - 1)) conv=notrunc 2>/dev/null
}

if [ ! -x "$M" ]; then
	echo "msshard_cli: $M not built"; echo "msshard_cli: 0 passed, 1 failed"; exit 1
fi
A="$FX/peft/qwen3moe-E8-r4/adapter"

# ---- plan ------------------------------------------------------------------
run 0 plan "$M" plan --experts 8 --ep-size 4 --placement round-robin
printf 'placement round-robin: 8 experts on 4 ranks\nrank 0: 0 4\nrank 1: 1 5\nrank 2: 2 6\nrank 3: 3 7\n' >"$tmp/want"
same "$tmp/out" "$tmp/want" "plan text"
run 0 "plan json" "$M" plan --experts 6 --ep-size 3 --json
tr -d ' \t\n' <"$tmp/out" >"$tmp/flat"
has "$tmp/flat" "plan json" '"ranks":[[0,1],[2,3],[4,5]]'
run 2 "plan uneven" "$M" plan --experts 6 --ep-size 4
one_line "plan uneven"; has "$tmp/err" "plan uneven" "divide"
run 2 "plan missing option" "$M" plan --experts 8
has "$tmp/err" "plan usage" "usage: msshard plan"
run 2 "unknown option" "$M" split "$A" -o "$tmp/x" --ep-size 2 --bogus
has "$tmp/err" "unknown option" "unknown option '--bogus'"
run 2 "bad number" "$M" split "$A" -o "$tmp/x" --ep-size two
run 2 "no output" "$M" split "$A" --ep-size 2
run 2 "bad placement" "$M" split "$A" -o "$tmp/x" --ep-size 2 --placement nowhere.json
one_line "bad placement"
run 0 "help" "$M" split --help
has "$tmp/out" "help" "usage: msshard split ADAPTER_OR_CHECKPOINT -o DIR --ep-size N"

# ---- split, merge, reshard -------------------------------------------------
run 0 "dry run" "$M" split "$A" -o "$tmp/dry" --ep-size 2 --dry-run
has "$tmp/out" "dry run" "would split"
if [ -e "$tmp/dry" ]; then bad "dry run wrote $tmp/dry"; else ok; fi
run 0 split "$M" split "$A" -o "$tmp/ep2" --ep-size 2
has "$tmp/out" split "rank 1: experts 4-7"
for f in adapter_model-ep00000-of-00002.safetensors adapter_model-ep00001-of-00002.safetensors \
	ep_manifest.json adapter_config.json; do
	if [ -f "$tmp/ep2/$f" ]; then ok; else bad "split did not write $f"; fi
done
run 2 "split again" "$M" split "$A" -o "$tmp/ep2" --ep-size 2
one_line "split again"; has "$tmp/err" "split again" "--force"
run 0 "split --force" "$M" split "$A" -o "$tmp/ep2" --ep-size 2 --force
run 2 "split a shard" "$M" split "$tmp/ep2/adapter_model-ep00000-of-00002.safetensors" -o "$tmp/y" --ep-size 2
has "$tmp/err" "split a shard" "already an EP shard"
run 0 merge "$M" merge "$tmp/ep2" -o "$tmp/merged"
same "$tmp/merged/adapter_model.safetensors" "$A/adapter_model.safetensors" "merge"
same "$tmp/merged/adapter_config.json" "$A/adapter_config.json" "merge config"
run 0 reshard "$M" reshard "$tmp/ep2" -o "$tmp/ep4" --ep-size 4 --placement round-robin --json
has "$tmp/out" reshard '"operation":'
run 0 "direct split" "$M" split "$A" -o "$tmp/ep4d" --ep-size 4 --placement round-robin
for f in "$tmp/ep4d"/*; do same "$f" "$tmp/ep4/$(basename "$f")" "reshard = split"; done
run 0 "split checkpoint" "$M" split "$FX/hf/mixtral-sharded" -o "$tmp/mx" --ep-size 8
run 0 "merge checkpoint" "$M" merge "$tmp/mx" -o "$tmp/mxm"
for f in model-00001-of-00002.safetensors model-00002-of-00002.safetensors; do
	same "$tmp/mxm/$f" "$FX/hf/mixtral-sharded/$f" "checkpoint merge"
done

# ---- hostile shard sets ----------------------------------------------------
broken() { rm -rf "$tmp/b"; cp -r "$tmp/ep2" "$tmp/b"; }
S0="$tmp/b/adapter_model-ep00000-of-00002.safetensors"
S1="$tmp/b/adapter_model-ep00001-of-00002.safetensors"

broken; rm "$S1"
run 2 "missing shard" "$M" merge "$tmp/b" -o "$tmp/bo"
one_line "missing shard"; has "$tmp/err" "missing shard" "rank 1 is missing"
broken; cp "$S0" "$S1"
run 2 "duplicated shard" "$M" reshard "$tmp/b" -o "$tmp/bo" --ep-size 4
one_line "duplicated shard"; has "$tmp/err" "duplicated shard" "says rank 0"
broken; cp "$tmp/ep4/adapter_model-ep00003-of-00004.safetensors" "$tmp/b/"
run 2 "other N" "$M" merge "$tmp/b" -o "$tmp/bo"
one_line "other N"; has "$tmp/err" "other N" "EP size 4"
broken; flip_last "$S1"
run 1 "replica differs" "$M" merge "$tmp/b" -o "$tmp/bo"
one_line "replica differs"
has "$tmp/err" "replica differs" "tensor 'base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight'"
has "$tmp/err" "replica differs" "rank 0"
has "$tmp/err" "replica differs" "rank 1"
if [ -e "$tmp/bo" ]; then bad "a failed merge wrote $tmp/bo"; else ok; fi
broken
d=$(sed -n 's/.*"state_digest":[[:space:]]*"sha256:\([0-9a-f]*\)".*/\1/p' "$tmp/b/ep_manifest.json" | sed -n 2p)
lie=$(echo "$d" | sed 's/^./0/;t'); [ "$lie" = "$d" ] && lie=$(echo "$d" | sed 's/^./1/')
sed "s/$d/$lie/" "$tmp/b/ep_manifest.json" >"$tmp/m" && cp "$tmp/m" "$tmp/b/ep_manifest.json"
run 1 "lying manifest" "$M" merge "$tmp/b" -o "$tmp/bo"
one_line "lying manifest"; has "$tmp/err" "lying manifest" "but the manifest says"
broken
d=$(sed -n '/"experts":[[:space:]]*\[{/,$p' "$tmp/b/ep_manifest.json" | sed -n 's/.*"sha256":[[:space:]]*"\([0-9a-f]*\)".*/\1/p' | sed -n 3p)
lie=$(echo "$d" | sed 's/^./0/;t'); [ "$lie" = "$d" ] && lie=$(echo "$d" | sed 's/^./1/')
sed "s/$d/$lie/" "$tmp/b/ep_manifest.json" >"$tmp/m" && cp "$tmp/m" "$tmp/b/ep_manifest.json"
run 1 "lying expert digest" "$M" reshard "$tmp/b" -o "$tmp/bo" --ep-size 4
one_line "lying expert digest"; has "$tmp/err" "lying expert digest" "does not match the manifest"
if [ -e "$tmp/bo/ep_manifest.json" ] || ls "$tmp/bo"/*.safetensors >/dev/null 2>&1; then
	bad "a failed reshard left outputs in $tmp/bo"; else ok; fi
broken; rm "$tmp/b/ep_manifest.json"
run 2 "no manifest" "$M" merge "$tmp/b" -o "$tmp/bo"
has "$tmp/err" "no manifest" "ep_manifest.json"

# ---- registration in an inventory -------------------------------------------
I="$B/msinv"
"$I" init --db "$tmp/reg.db" >/dev/null
run 0 "split registers" "$M" split "$FX/peft/qwen3moe-E8-r4/adapter" -o "$tmp/reg4" --ep-size 4 --db "$tmp/reg.db"
n=$("$I" ls --db "$tmp/reg.db" --kind adapter_shard | wc -l)
[ "$n" -eq 4 ] && ok || bad "split registered $n shards, want 4"
"$I" lineage --db "$tmp/reg.db" "$("$I" ls --db "$tmp/reg.db" --kind adapter | cut -f 1)" >"$tmp/lin"
[ "$(grep -c ' split ' "$tmp/lin")" -eq 4 ] && ok || bad "split edges: $(cat "$tmp/lin")"
run 0 "reshard registers" env MSINV_DB="$tmp/reg.db" "$M" reshard "$tmp/reg4" -o "$tmp/reg2" --ep-size 2
n=$("$I" ls --db "$tmp/reg.db" --kind adapter_shard | wc -l)
[ "$n" -eq 6 ] && ok || bad "reshard registered $((n - 4)) shards, want 2"
run 0 "merge --no-register" env MSINV_DB="$tmp/reg.db" "$M" merge "$tmp/reg2" -o "$tmp/regm" --no-register
n=$("$I" ls --db "$tmp/reg.db" | wc -l)
[ "$n" -eq 7 ] && ok || bad "--no-register recorded something ($n states)"
run 2 "missing inventory" "$M" split "$FX/peft/qwen3moe-E8-r4/adapter" -o "$tmp/regx" --ep-size 4 --db "$tmp/none.db"
[ ! -e "$tmp/regx" ] && ok || bad "split wrote although the inventory was missing"
"$I" log --db "$tmp/reg.db" --check >/dev/null && ok || bad "log chain after registrations"

# ---- all or nothing: --force, refused replacements ---------------------------
mkdir -p "$tmp/own/notes" && echo mine >"$tmp/own/README.md"
run 2 "not ours" "$M" split "$A" -o "$tmp/own" --ep-size 2 --force
one_line "not ours"; has "$tmp/err" "not ours" "not replacing"
[ "$(ls -A "$tmp/own" | tr '\n' ' ')" = "README.md notes " ] && ok || bad "refused --force touched $tmp/own"
cp "$tmp/ep2/ep_manifest.json" "$tmp/m2"
run 0 "force replaces the set" "$M" split "$A" -o "$tmp/ep2" --ep-size 4 --force
[ -f "$tmp/ep2/adapter_model-ep00003-of-00004.safetensors" ] &&
	[ ! -e "$tmp/ep2/adapter_model-ep00000-of-00002.safetensors" ] && ok ||
	bad "--force left a mixed set: $(ls "$tmp/ep2")"
run 0 "force back" "$M" split "$A" -o "$tmp/ep2" --ep-size 2 --force
same "$tmp/ep2/ep_manifest.json" "$tmp/m2" "force back"
if ls -A "$tmp" | grep -q -e '\.tmp-' -e '\.replaced-'; then bad "staging left in $tmp: $(ls -A "$tmp")"; else ok; fi

# ---- a failure part way leaves nothing (fault-injection build) -------------
# The Nth allocation, write, fsync or rename fails (MS_FAULT_<KIND>=N, in a
# build made with -DMS_FAULT_INJECTION: MS_BUILD itself, or build-fault when
# it is newer than the code these commands run through). Every failed run
# must end with one line on stderr, leave no output and no staging
# directory, register nothing, and leave an inventory whose files and log
# verify.
fault_build() { # DIR: a fault build? (it logs the failures it injects)
	[ -x "$1/msshard" ] || return 1
	MS_FAULT_ALLOC=1 MS_FAULT_LOG="$tmp/probe.log" "$1/msshard" plan --experts 2 --ep-size 1 >/dev/null 2>&1
	[ -s "$tmp/probe.log" ]
}
FB=""; why="no fault-injection build (make fault)"
if fault_build "$B"; then FB=$B
elif fault_build "$ROOT/build-fault"; then
	newer=$(cd "$ROOT" && find src/shard*.c src/shard*.h src/pool.c src/fsutil.c src/safetensors.c \
		src/inventory*.c src/inventory*.h tools/msshard.c -newer build-fault/msshard 2>/dev/null | head -n 1)
	if [ -z "$newer" ]; then FB=$(cd "$ROOT/build-fault" && pwd); else
		why="build-fault is older than $newer (make fault)"; fi
fi
W="$tmp/fault"; P="$tmp/fault.pristine"; OUT=out
# trial KIND N LABEL CMD...: in a fresh copy of $P at $W (with an
# inventory); the output is $W/$OUT; $hit says whether the fault was injected
trial() {
	fk="$1=$2"; tl="$3 $fk"; shift 3
	rm -rf "$W" && cp -a "$P" "$W"
	rm -f "$tmp/fault.log"
	(cd "$W" && env "MS_FAULT_$fk" MS_FAULT_LOG="$tmp/fault.log" "$@") >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ -s "$tmp/fault.log" ]; then hit=1; else hit=0; fi
	if [ "$rc" -eq 0 ]; then
		# the fault was survived or not reached: the whole output, registered
		if "$FB/msverify" ep "$W/$OUT" >/dev/null 2>&1 &&
			[ "$("$FB/msinv" ls --db "$W/inv.db" | wc -l)" -gt "$(wc -l <"$tmp/states.before")" ]; then
			ok; else bad "$tl: exit 0 without a complete, registered output"; fi
		return
	fi
	if [ "$rc" -ge 128 ]; then bad "$tl: crashed (exit $rc)"; return; fi
	one_line "$tl"
	if [ "$OUT" = out ] && [ -e "$W/out" ]; then bad "$tl: exit $rc, but left $W/out: $(ls "$W/out" | tr '\n' ' ')"; else ok; fi
	# the directory exactly as before: no output, nothing staged, the
	# inputs (and an output --force would replace) unchanged
	(cd "$P" && find . -path ./inv.db -prune -o -type f -print | sort | xargs cksum) >"$tmp/sum.before"
	(cd "$W" && find . -path ./inv.db -prune -o -type f -print | sort | xargs cksum) >"$tmp/sum.after"
	ls -A "$W" >"$tmp/dir.after"
	if cmp -s "$tmp/sum.before" "$tmp/sum.after" && cmp -s "$tmp/dir.before" "$tmp/dir.after"; then ok; else
		bad "$tl: the directory changed: $(diff "$tmp/sum.before" "$tmp/sum.after" | tr '\n' ' ' | cut -c 1-300) $(ls -A "$W" | tr '\n' ' ')"; fi
	"$FB/msinv" ls --db "$W/inv.db" >"$tmp/states.after"
	if cmp -s "$tmp/states.before" "$tmp/states.after"; then ok; else
		bad "$tl: exit $rc, yet registered: $(cut -f 1,2,4 "$tmp/states.after" | tr '\n' ' ')"; fi
	"$FB/msinv" log --db "$W/inv.db" --check >/dev/null 2>&1 && ok || bad "$tl: log chain broken"
	"$FB/msverify" files --db "$W/inv.db" >/dev/null 2>&1 && ok || bad "$tl: msverify files failed"
}
# sweep KIND LABEL CMD...: N = 1, 2, ... (writes and allocations: a sample
# spread over the run) until a run no longer reaches the Nth call
sweep() {
	kind=$1; label=$2; shift 2
	case $kind in
	ALLOC) ns="1 2 3 5 8 13 40 150 300 500 700 900 1100 1300";;
	WRITE) ns="1 2 3 5 8 13 21 34 55 89";;
	*) ns=$(seq 1 40);;
	esac
	reached=0
	for n in $ns; do
		trial "$kind" "$n" "$label" "$@"
		[ "$hit" -eq 1 ] || break
		reached=$n
	done
	[ "$reached" -ge 1 ] && ok || bad "$label: MS_FAULT_$kind never reached"
}
if [ -n "$FB" ]; then
	mkdir -p "$P" && cp -r "$FX/peft/qwen3moe-E6-r3/adapter" "$P/adapter"
	"$FB/msinv" init --db "$P/inv.db" >/dev/null
	"$FB/msshard" split "$P/adapter" -o "$P/ep2" --ep-size 2 --db "$P/inv.db" >/dev/null ||
		bad "fault setup: split failed"
	"$FB/msinv" ls --db "$P/inv.db" >"$tmp/states.before"
	ls -A "$P" >"$tmp/dir.before"
	for kind in WRITE FSYNC RENAME ALLOC; do
		sweep "$kind" "split" "$FB/msshard" split adapter -o out --ep-size 3 --db inv.db
		sweep "$kind" "reshard" "$FB/msshard" reshard ep2 -o out --ep-size 3 --db inv.db
	done
	# --force over an existing set: whatever fails, up to the publication
	# itself (the last rename), the old set stays as it was
	OUT=ep2
	for kind in RENAME FSYNC; do
		sweep "$kind" "split --force" "$FB/msshard" split adapter -o ep2 --ep-size 3 --force --db inv.db
	done
	[ "$reached" -ge 6 ] && ok || bad "split --force: only $reached fsyncs reached"
else
	echo "msshard_cli: $why: the failure cases were skipped"
fi

# ---- the man page's examples, as written -----------------------------------
mkdir -p "$tmp/ex/tests" && ln -s "$(cd "$FX" && pwd)" "$tmp/ex/tests/fixtures"
sed -n '/^\.Sh EXAMPLES/,/^\.Sh /p' "$ROOT/man/msshard.1" |
	sed -n 's/^\$ //p; s/^    \(.*\)/\1/p' | sed 's/\\e$/\\/' |
	awk '{ if (sub(/\\$/, "")) { cur = cur $0; next } print cur $0; cur = "" }' >"$tmp/examples"
n=0
while IFS= read -r line; do
	n=$((n + 1))
	if (cd "$tmp/ex" && PATH="$B:$PATH" sh -c "$line") >"$tmp/exout" 2>&1; then ok; else
		bad "man example '$line': $(cat "$tmp/exout")"
	fi
done <"$tmp/examples"
if [ "$n" -ge 7 ]; then ok; else bad "found only $n examples in man/msshard.1"; fi

echo "msshard_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
