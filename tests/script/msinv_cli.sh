#!/bin/sh
# msinv's inventory commands from the outside: every command, the identity
# rule against python's hashlib over the byte ranges of the headers,
# idempotence, refusals (exit status and a one-line message), the audit
# chain tampered with the sqlite3 shell, a database from a newer build, and
# the EXAMPLES of msinv(1) and ms(5) run as written.
. "$(dirname "$0")/lib.sh"
B=${MS_BUILD:-build}/msinv
BDIR=$(cd "$(dirname "$B")" && pwd)
ROOT=${MS_ROOT:-$(pwd)}
export MSINV_DB="$W/inv.db"

if ! command -v sqlite3 >/dev/null 2>&1 || ! command -v python3 >/dev/null 2>&1; then
	echo "msinv_cli: skipped (needs sqlite3 and python3)"
	echo "msinv_cli: 0 passed, 0 failed"
	exit 0
fi


# expect RC DESCRIPTION COMMAND...: the exit status is RC; on success stderr
# is empty, on failure its first line is "msinv: ..." and (usage errors
# aside) it is the only line. Output in $W/out and $W/err. (sh has no local
# variables: the function's own are prefixed with _.)
expect() {
	_rc=$1; _d=$2; shift 2
	"$@" >"$W/out" 2>"$W/err"
	_got=$?
	if [ "$_got" -ne "$_rc" ]; then
		bad "$_d: exit $_got, expected $_rc"; sed 's/^/  /' "$W/err" | head -n 5; return 1
	fi
	if [ "$_rc" -eq 0 ] && [ -s "$W/err" ]; then
		bad "$_d: stderr not empty"; sed 's/^/  /' "$W/err" | head -n 5; return 1
	fi
	# a check that found a difference may say so on stdout alone
	if [ "$_rc" -ge 2 ] || [ -s "$W/err" ]; then
		if ! head -n 1 "$W/err" | grep -q '^msinv: '; then
			bad "$_d: stderr does not start with 'msinv: '"; cat "$W/err"; return 1
		fi
		if [ "$(grep -vc '^usage: ' "$W/err")" -ne 1 ]; then
			bad "$_d: error is not one line"; cat "$W/err"; return 1
		fi
	fi
	ok
}
# has PATTERN FILE DESCRIPTION
has() { if grep -q -- "$1" "$2"; then ok; else bad "$3: no '$1' in:"; head -n 5 "$2" | sed 's/^/  /'; fi; }
eq() { if [ "$1" = "$2" ]; then ok; else bad "$3: '$1' != '$2'"; fi; }
q() { sqlite3 "${DB:-$MSINV_DB}" "$1"; }

# The identity rule, independently: tensors from the raw headers, hashlib.
cat >"$W/oracle.py" <<'EOF'
import hashlib, json, struct, sys

def tensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        yield name, t["dtype"], t["shape"], data[8 + n + b:8 + n + e]

def state(paths):
    lines = sorted((n.encode(), "%s\t%s\t[%s]\t%s\n" % (n, dt, ",".join(map(str, sh)),
                   hashlib.sha256(b).hexdigest())) for p in paths for n, dt, sh, b in tensors(p))
    m = "msinv-state-v1\n" + "".join(l for _, l in lines)
    return "sha256:" + hashlib.sha256(m.encode()).hexdigest()

cmd = sys.argv[1]
if cmd == "state":
    print(state(sys.argv[2:]))
elif cmd == "tensors":  # name TAB sha256, sorted
    for name, _, _, b in sorted(t for p in sys.argv[2:] for t in tensors(p)):
        print("%s\t%s" % (name, hashlib.sha256(b).hexdigest()))
elif cmd == "nonzero-bytes":
    print(sum(len(b) for p in sys.argv[2:] for _, _, _, b in tensors(p) if len(b)))
elif cmd == "json":  # print one member of a JSON document on stdin
    v = json.load(sys.stdin)
    for k in sys.argv[2:]:
        v = v[int(k)] if isinstance(v, list) else v[k]
    print(len(v) if isinstance(v, (list, dict)) else v)
EOF
py() { python3 "$W/oracle.py" "$@"; }

# ---- init ------------------------------------------------------------------------
expect 2 "ls without an inventory" "$B" ls
has "msinv init" "$W/err" "ls without an inventory"
expect 0 "init" "$B" init
has "^created" "$W/out" "init"
expect 0 "init again" "$B" init
has "^inventory" "$W/out" "init again"
eq "$(q 'PRAGMA application_id')" 1297303886 "application_id"
eq "$(q 'PRAGMA journal_mode')" wal "journal_mode"

# ---- add: identity, idempotence -----------------------------------------------------------
want=$(py state "$FX/hf/qwen3moe/model.safetensors")
expect 0 "add" "$B" add --label qwen-base "$FX/hf/qwen3moe"
eq "$(cat "$W/out")" "$want" "state digest of qwen3moe (python oracle)"
base=$want
want2=$(py state "$FX"/hf/qwen3moe-sharded/model-0000*-of-00002.safetensors)
eq "$want2" "$want" "sharded and unsharded fixtures have one digest (python oracle)"
expect 0 "add sharded" "$B" add "$FX/hf/qwen3moe-sharded"
eq "$(cat "$W/out")" "$want" "sharded fixture recorded as the same state"
eq "$(q 'SELECT count(*) FROM states')" 1 "one state"
eq "$(q 'SELECT count(DISTINCT copy) FROM state_files')" 2 "two copies"
nlog=$(q 'SELECT count(*) FROM log')
expect 0 "re-add" "$B" add --json --label qwen-base "$FX/hf/qwen3moe"
eq "$(py json new_state <"$W/out")" False "re-add: not a new state"
eq "$(py json files_hashed <"$W/out")" 0 "re-add: nothing hashed"
eq "$(q 'SELECT count(*) FROM log')" "$nlog" "re-add: nothing logged"
expect 0 "add --rehash" "$B" add --rehash --json "$FX/hf/qwen3moe"
eq "$(py json files_hashed <"$W/out")" 1 "--rehash hashes"
eq "$(py json state <"$W/out")" "$base" "--rehash: same state"
mx=$(py state "$FX/hf/mixtral/model.safetensors")
expect 0 "add mixtral" "$B" add --kind policy "$FX/hf/mixtral"
eq "$(cat "$W/out")" "$mx" "state digest of mixtral (python oracle)"

# ---- add: kinds, lineage, refusals ---------------------------------------------------------
expect 0 "add peft base" "$B" add --label peft-base "$FX/peft/qwen3moe-E8-r4/base"
expect 0 "add adapter" "$B" add --json --label peft-lora --parent peft-base --op train \
	--params '{"steps": 100}' "$FX/peft/qwen3moe-E8-r4/adapter"
eq "$(py json kind <"$W/out")" adapter "adapter inferred"
lora=$(py json state <"$W/out")
eq "$lora" "$(py state "$FX/peft/qwen3moe-E8-r4/adapter/adapter_model.safetensors")" "adapter digest (python oracle)"
expect 2 "--kind contradicting the files" "$B" add --kind quantized "$FX/peft/qwen3moe-E8-r4/adapter"
has "adapter_config.json" "$W/err" "contradiction names what the files say"
expect 2 "label in use" "$B" add --label qwen-base "$FX/hf/mixtral"
has "already names" "$W/err" "label in use"
expect 2 "hex label" "$B" add --label cafe "$FX/hf/mixtral"
expect 2 "unknown option" "$B" add --frobnicate "$FX/hf/mixtral"
has "^usage: msinv add" "$W/err" "usage line"
expect 2 "missing path" "$B" add
expect 2 "--parent without --op" "$B" add --parent qwen-base "$FX/hf/mixtral"
expect 2 "unknown operation" "$B" add --parent qwen-base --op frob "$FX/hf/mixtral"
expect 2 "unknown parent" "$B" add --parent nosuch --op train "$FX/hf/mixtral"
expect 2 "--ep-rank without --ep-size" "$B" add --ep-rank 1 "$FX/hf/mixtral"
expect 2 "no such path" "$B" add "$W/nonexistent"
expect 2 "unknown kind" "$B" add --kind fp4 "$FX/hf/mixtral"
eq "$(q 'SELECT count(*) FROM states')" 4 "refused adds recorded nothing"
mkdir "$W/bad"
printf 'not a safetensors file' >"$W/bad/model.safetensors"
expect 2 "malformed file" "$B" add "$W/bad"

# ---- ls, show ---------------------------------------------------------------------------
expect 0 "ls" "$B" ls
eq "$(wc -l <"$W/out")" 4 "ls: one line per state"
eq "$(grep -c "^$base	base	bf16	-	" "$W/out")" 1 "ls: base line"
expect 0 "ls --kind adapter" "$B" ls --kind adapter
eq "$(cut -f1 "$W/out")" "$lora" "ls --kind"
expect 0 "ls --json" "$B" ls --json
eq "$(py json <"$W/out")" 4 "ls --json"
expect 0 "show" "$B" show qwen-base
has "^state     $base" "$W/out" "show: digest"
has "^copy 2" "$W/out" "show: second copy"
has "config .*config.json  sha256 " "$W/out" "show: configuration digest"
expect 0 "show --tensors" "$B" show --tensors "$(echo "$base" | cut -c8-19)"
grep '	' "$W/out" | cut -f1,5 | LC_ALL=C sort >"$W/got"
py tensors "$FX/hf/qwen3moe/model.safetensors" | LC_ALL=C sort >"$W/want"
if cmp -s "$W/got" "$W/want"; then ok; else bad "show --tensors: digests differ from hashlib"; diff "$W/got" "$W/want" | head; fi
expect 0 "show --json" "$B" show --json --tensors "sha256:$(echo "$base" | cut -c8-20)"
eq "$(py json files <"$W/out")" 3 "show --json: three files in two copies"
eq "$(py json files 0 tensors <"$W/out")" 69 "show --json: tensors"
expect 2 "show unknown" "$B" show nosuchlabel
expect 2 "show short prefix" "$B" show abc
# an ambiguous prefix lists the candidates
sqlite3 "$MSINV_DB" ".backup '$W/amb.db'"
DB="$W/amb.db" q "INSERT INTO states (digest, kind, layout, ntensors, nbytes, tool, argv, user, host, created_at) VALUES
 ('sha256:abcd000000000000000000000000000000000000000000000000000000000001', 'base', 'bf16', 0, 0, 't', '[]', 'u', 'h', 'x'),
 ('sha256:abcd000000000000000000000000000000000000000000000000000000000002', 'base', 'bf16', 0, 0, 't', '[]', 'u', 'h', 'x')"
expect 2 "ambiguous prefix" "$B" show --db "$W/amb.db" abcd
has "ambiguous: sha256:abcd" "$W/err" "ambiguous prefix lists candidates"

# ---- lineage --------------------------------------------------------------------------------
expect 0 "lineage" "$B" lineage peft-base
has "(peft-base) -> .* (peft-lora)  train {\"steps\":100}" "$W/out" "lineage edge"
expect 0 "lineage --dot" "$B" lineage --dot peft-lora
has "^digraph lineage {" "$W/out" "dot header"
has "\"$(q "SELECT digest FROM states WHERE label = 'peft-base'")\" -> \"$lora\"" "$W/out" "dot edge"
expect 0 "lineage --json" "$B" lineage --json peft-lora
eq "$(py json ancestors <"$W/out")" 1 "lineage --json ancestors"
eq "$(py json ancestors 0 operation <"$W/out")" train "lineage --json operation"
expect 2 "lineage --dot --json" "$B" lineage --dot --json peft-lora

# ---- dup --------------------------------------------------------------------------------------
expect 0 "dup" "$B" dup --json
r0=$(py json redundant_bytes <"$W/out")
cp -r "$FX/hf/qwen3moe" "$W/copy"
expect 0 "add a copy" "$B" add "$W/copy"
expect 0 "dup after a copy" "$B" dup --json
r1=$(py json redundant_bytes <"$W/out")
eq "$((r1 - r0))" "$(py nonzero-bytes "$FX/hf/qwen3moe/model.safetensors")" "dup: a copy's bytes are redundant"
expect 0 "dup text" "$B" dup
has "^pair	$base	$base	" "$W/out" "dup: the state pairs with itself"

# ---- log ------------------------------------------------------------------------------------------
expect 0 "log" "$B" log
has "	add	$base	" "$W/out" "log: add entry"
has "msinv add --json --label peft-lora --parent peft-base --op train" "$W/out" "log: command line"
expect 0 "log --json" "$B" log --json
eq "$(py json 1 action <"$W/out")" add "log --json action"
eq "$(py json 0 prev_hash <"$W/out")" 0000000000000000000000000000000000000000000000000000000000000000 "first prev_hash"
expect 0 "log --check" "$B" log --check
has "chain intact" "$W/out" "log --check"
# tampering, with the sqlite3 shell, on copies
tamper() { # name, SQL
	sqlite3 "$MSINV_DB" ".backup '$W/$1.db'"
	DB="$W/$1.db" q "DROP TRIGGER log_no_update; DROP TRIGGER log_no_delete; $2"
}
tamper edit "UPDATE log SET detail = '{}' WHERE seq = 3"
expect 1 "log --check: edited" "$B" log --check --db "$W/edit.db"
has "entry 3 was edited" "$W/err" "edited entry named"
tamper del "DELETE FROM log WHERE seq = 4"
expect 1 "log --check: deleted" "$B" log --check --db "$W/del.db"
has "entry 4 is missing" "$W/err" "deleted entry named"
tamper order "UPDATE log SET seq = 1000 WHERE seq = 5; UPDATE log SET seq = 5 WHERE seq = 6; UPDATE log SET seq = 6 WHERE seq = 1000"
expect 1 "log --check: reordered" "$B" log --check --db "$W/order.db"
has "entry 5 does not follow entry 4" "$W/err" "reordered entry named"
tamper tail "DELETE FROM log WHERE seq = (SELECT max(seq) FROM log)"
expect 1 "log --check: newest removed" "$B" log --check --db "$W/tail.db"
has "newest entries were removed" "$W/err" "tail removal"
expect 1 "log --check --json: edited" "$B" log --check --json --db "$W/edit.db"
eq "$(py json ok <"$W/out")" False "log --check --json"

# ---- refused databases ----------------------------------------------------------------------------
sqlite3 "$MSINV_DB" ".backup '$W/newer.db'"
DB="$W/newer.db" q "PRAGMA user_version = 1000"
expect 3 "newer schema" "$B" ls --db "$W/newer.db"
has "newer" "$W/err" "newer schema"
printf 'just text, not a database at all, padded to be long enough\n' >"$W/text.db"
expect 3 "not a database" "$B" ls --db "$W/text.db"
sqlite3 "$W/other.db" "CREATE TABLE t (x)"
expect 3 "someone else's database" "$B" init --db "$W/other.db"

# ---- footprint ----------------------------------------------------------------------------------------
printf '{"ep_size": 1, "states": [{"role": "base", "state": "qwen-base"}]}\n' >"$W/plan.json"
expect 0 "footprint" "$B" footprint "$W/plan.json"
[ -s "$W/out" ] && ok || bad "footprint: no report"
expect 0 "footprint --json" "$B" footprint --json "$W/plan.json"
py json <"$W/out" >/dev/null && ok || bad "footprint --json is not JSON"
printf '{"ep_size": 1, "budget_gib": 0.000001, "states": [{"role": "base", "state": "qwen-base"}]}\n' >"$W/tight.json"
expect 1 "footprint over budget" "$B" footprint "$W/tight.json"
printf '{"ep_size": 1, "states": [{"role": "base", "state": "nosuch"}]}\n' >"$W/unknown.json"
expect 2 "footprint of an unknown state" "$B" footprint "$W/unknown.json"

# ---- rm, gc ------------------------------------------------------------------------------------------
expect 2 "rm with a derived state" "$B" rm peft-base
has "force" "$W/err" "rm refusal says --force"
expect 0 "rm" "$B" rm peft-lora
expect 0 "rm parent" "$B" rm peft-base
expect 2 "rm again" "$B" rm peft-base
sh -c 'exit 0' &
deadpid=$!
wait $deadpid
tmpf="$W/copy/.model.safetensors.tmp-$deadpid-0badf00d"
livef="$W/copy/.model.safetensors.tmp-$$-0000beef"
: >"$tmpf"; : >"$livef"
expect 0 "gc --dry-run" "$B" gc --dry-run
has "would remove temporary $tmpf" "$W/out" "gc --dry-run lists the temporary"
has "would forget file record .*peft-E8-r4\|would forget file record .*qwen3moe-E8-r4" "$W/out" "gc --dry-run lists unused rows"
[ -f "$tmpf" ] && ok || bad "gc --dry-run removed a file"
expect 0 "gc" "$B" gc
[ ! -e "$tmpf" ] && ok || bad "gc left the dead writer's temporary"
[ -f "$livef" ] && ok || bad "gc removed a live writer's temporary"
eq "$(q 'SELECT count(*) FROM files WHERE id NOT IN (SELECT file_id FROM state_files)')" 0 "gc forgot unused file rows"
mkdir "$W/extra"
: >"$W/extra/.x.safetensors.tmp-$deadpid-1"
expect 0 "gc DIR" "$B" gc "$W/extra"
[ ! -e "$W/extra/.x.safetensors.tmp-$deadpid-1" ] && ok || bad "gc DIR"
expect 0 "log --check at the end" "$B" log --check
eq "$(q 'PRAGMA integrity_check')" ok "integrity_check at the end"

# ---- the EXAMPLES of the man pages, as written ----------------------------------------------------------
unescape() { sed -e 's/\\(dq/"/g' -e 's/\\-/-/g' -e 's/\\e/\\/g' -e 's/\\&//g'; }
sed -n '/^\.Sh EXAMPLES/,/^\.Sh /p' "$ROOT/man/msinv.1" | sed -n 's/^\.Dl //p' | unescape >"$W/examples"
[ "$(wc -l <"$W/examples")" -ge 5 ] && ok || bad "msinv(1) has examples"
n=0
# examples name fixtures as tests/...; they run in a scratch directory so
# that what they write stays out of the source tree
mkdir -p "$W/exdir" && ln -s "$ROOT/tests" "$W/exdir/tests"
while IFS= read -r line; do
	n=$((n + 1))
	if (cd "$W/exdir" && PATH="$BDIR:$PATH" MSINV_DB="$W/examples.db" sh -c "$line") >"$W/out" 2>"$W/err"; then
		ok
	else
		bad "msinv(1) example $n: $line"; sed 's/^/  /' "$W/err"
	fi
done <"$W/examples"
# ms(5): each literal block is a script
sed -n '/^\.Sh EXAMPLES/,/^\.Sh /p' "$ROOT/man/ms.5" | unescape |
	awk -v d="$W" '/^\.Bd/ { f = 1; k++; next } /^\.Ed/ { f = 0; next } f { print > (d "/ms5-" k ".sh") }'
if (cd "$ROOT" && PATH="$BDIR:$PATH" sh "$W/ms5-1.sh") >"$W/out" 2>"$W/err"; then
	eq "$(sed -n '1s/ .*//p' "$W/out")" "$(sed -n '2s/^# state sha256://p' "$W/out")" "ms(5) example: manifest by hand"
	eq "sha256:$(sed -n '1s/ .*//p' "$W/out")" "$base" "ms(5) example: the recorded digest"
else
	bad "ms(5) example 1"; cat "$W/err"
fi
cp "$W/examples.db" "$W/msinv.db"
if (cd "$W" && sh "$W/ms5-2.sh") >"$W/out" 2>"$W/err"; then
	has "qwen-base" "$W/out" "ms(5) example 2"
	has "^ok$" "$W/out" "ms(5) example 2: integrity_check"
else
	bad "ms(5) example 2"; cat "$W/err"
fi

echo "msinv_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
