#!/bin/sh
# Tree digests (ms(5), "Tree digests") against an independent computation
# in Python's hashlib (tests/oracle/tree_oracle.py): msinv add records a
# tree for every tensor, each equal to the oracle's over the bytes in the
# file; an inventory made before schema 0002 opens, migrates and gains its
# trees when msverify files verifies it; a tensor whose bytes changed gains
# none (a tree of a corrupted copy never becomes the truth); msverify files
# --device without a GPU is an environment error, not a silent CPU check.
. "$(dirname "$0")/lib.sh"
ROOT=${MS_ROOT:-$(pwd)}
ORACLE=$ROOT/tests/oracle/tree_oracle.py
PY=python3
[ -x "$ROOT/.venv/bin/python" ] && PY=$ROOT/.venv/bin/python
if ! "$PY" -c "import hashlib, sqlite3" 2>/dev/null; then
	echo "tree_oracle: skipped: no python3 with hashlib and sqlite3"
	echo "tree_oracle: 0 passed, 0 failed"
	exit 0
fi
export MSINV_DB="$W/inv.db"

run() { # label, expected exit status, command...
	label=$1; want=$2; shift 2
	"$@" >"$W/log" 2>&1
	got=$?
	if [ "$got" -eq "$want" ]; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1)); echo "FAIL: $label (exit $got, expected $want)"; sed 's/^/  /' "$W/log" | head -n 20
	fi
}

sql() { # db, statement: through python's sqlite3, not the library
	"$PY" -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.commit()' "$1" "$2"
}

mkdir -p "$W/a" "$W/b"
run "generate" 0 "$PY" "$ORACLE" gen "$W/a/model.safetensors" --seed 11
run "generate another" 0 "$PY" "$ORACLE" gen "$W/b/model.safetensors" --seed 12 --prefix b
run "init" 0 "$B/msinv" init
run "add" 0 "$B/msinv" add "$W/a"
run "every tensor has the oracle's tree (add)" 0 "$PY" "$ORACLE" check "$W/inv.db" --all --source add

# an inventory from before tree digests: schema 0001-0002, no trees
run "add the second state" 0 "$B/msinv" add "$W/b"
cp "$W/inv.db" "$W/old.db"
run "make it an old database" 0 sql "$W/old.db" \
	"DROP TRIGGER tree_digests_no_update; DROP TABLE tree_digests; PRAGMA user_version = 2;"
run "the old database opens and migrates" 0 env MSINV_DB="$W/old.db" "$B/msinv" ls
run "schema version 3 after opening" 0 "$PY" -c \
	'import sqlite3, sys; v = sqlite3.connect(sys.argv[1]).execute("PRAGMA user_version").fetchone()[0]; sys.exit(v != 3)' "$W/old.db"
run "no trees yet" 0 "$PY" "$ORACLE" check "$W/old.db" --none
# a flipped byte in one tensor of b, then verify everything
"$PY" - "$W/b/model.safetensors" <<'PYEOF'
import json, struct, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    off = 8 + n + h["b.t7"]["data_offsets"][0] + 3 * 65536 + 5
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 1]))
PYEOF
run "verify: the changed tensor fails" 1 env MSINV_DB="$W/old.db" "$B/msverify" files
run "verified tensors gained the oracle's trees, the changed one none" 0 \
	"$PY" "$ORACLE" check "$W/old.db" --all --without b.t7 --source verify
run "a tree is never edited" 1 sql "$W/old.db" "UPDATE tree_digests SET source = 'load';"
run "the audit chain holds" 0 env MSINV_DB="$W/old.db" "$B/msinv" log --check

# --device needs a GPU: without one it says so (exit 3), it never falls
# back to a CPU check that prints ok
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	run "--device without a gpu" 3 "$B/msverify" files --device
	if grep -q "gpu" "$W/log"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: --device message"; cat "$W/log"; fi
fi
run "--device with --manifest is bad usage" 2 "$B/msverify" files --device --manifest "$W/none.json"
echo "tree_oracle: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
