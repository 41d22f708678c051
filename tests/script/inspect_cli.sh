#!/bin/sh
# inspect_cli.sh: `msinv inspect` on every bundled fixture, its digests
# checked against computations that do not use our code:
#   - header digest: sha256 of the first 8+N bytes (N read with od, the
#     bytes cut with head, hashed with `openssl dgst -sha256`);
#   - --file-digests: sha256sum;
#   - tensor digests: a Python oracle (hashlib) that parses the header
#     itself, plus one tensor per file cut with tail/head for openssl;
#   - sharded and unsharded fixtures give the same "# state" line;
#   - --json parses (jq, else python3 -m json.tool) and agrees with the text;
#   - a Hugging Face cache snapshot (links into blobs/<sha256>) passes, and
#     one with a wrong blob name is exit 1;
#   - files our writer made (for every dtype) load in the Python safetensors
#     package with the same bytes (skipped without .venv).
MS_BUILD=${MS_BUILD:-build}
MS_FIXTURES=${MS_FIXTURES:-tests/fixtures}
MS_ROOT=${MS_ROOT:-.}
MSINV=$MS_BUILD/msinv
. "$(dirname "$0")/lib.sh"
tmp=$W

check() { # description, command...
	d=$1; shift
	if "$@"; then ok; else bad "$d"; fi
}
sha() { openssl dgst -sha256 -r | cut -c1-64; }

if [ ! -x "$MSINV" ]; then
	echo "inspect_cli: no $MSINV" >&2
	echo "inspect_cli: 0 passed, 1 failed"
	exit 1
fi
have_py=0; command -v python3 >/dev/null 2>&1 && have_py=1
json_ok() { # file
	if command -v jq >/dev/null 2>&1; then jq -e . "$1" >/dev/null 2>&1
	else python3 -m json.tool "$1" >/dev/null 2>&1; fi
}

# The oracle: parse each safetensors header independently and compare every
# digest msinv printed (JSON) with hashlib over the same byte ranges; the
# text output must agree with the JSON. Arguments: pairs of JSON and text
# files. Prints, for each file, its last non-empty tensor as
# "<file> <offset> <bytes> <sha256>" for the openssl cross-check.
cat >"$tmp/oracle.py" <<'PY'
import hashlib, json, struct, sys
errors = 0
def bad(path, msg):
    global errors
    errors += 1
    print("oracle: %s: %s" % (path, msg), file=sys.stderr)
args = sys.argv[1:]
for jpath, tpath in zip(args[0::2], args[1::2]):
    out = json.load(open(jpath))
    (f,) = out["files"]
    path = f["path"]
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    if f["header_sha256"] != hashlib.sha256(blob[:8 + n]).hexdigest():
        bad(path, "header digest")
    if f["sha256"] != hashlib.sha256(blob).hexdigest():
        bad(path, "file digest")
    if f["size"] != len(blob) or f["header_bytes"] != 8 + n:
        bad(path, "size")
    names = sorted((k for k in header if k != "__metadata__"), key=lambda s: s.encode())
    if [t["name"] for t in out["tensors"]] != names:
        bad(path, "tensor names or order")
    if f.get("metadata", {}) != header.get("__metadata__", {}):
        bad(path, "metadata")
    for t in out["tensors"]:
        e = header.get(t["name"])
        if e is None:
            continue
        b, en = e["data_offsets"]
        if t["dtype"] != e["dtype"] or t["shape"] != e["shape"] or t["bytes"] != en - b:
            bad(path, "tensor %r dtype/shape/size" % t["name"])
        if t["offset"] != 8 + n + b:
            bad(path, "tensor %r offset" % t["name"])
        if t["sha256"] != hashlib.sha256(blob[8 + n + b:8 + n + en]).hexdigest():
            bad(path, "tensor %r digest" % t["name"])
    # the text output: one line per tensor, the digest last, then the state
    want = ["%s\t%s" % (t["name"], t["sha256"]) for t in out["tensors"]]
    want.append("# state " + out["state_digest"])
    got = []
    for line in open(tpath, encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("# state "):
            got.append(line)
        elif not line.startswith("#"):
            cols = line.split("\t")
            got.append(cols[0] + "\t" + cols[-1])
    if got != want:
        bad(path, "text and --json differ")
    nonempty = [t for t in out["tensors"] if t["bytes"]]
    if nonempty:
        t = nonempty[-1]
        print(path, t["offset"], t["bytes"], t["sha256"])
sys.exit(1 if errors else 0)
PY

# ---- every fixture ---------------------------------------------------------
find "$MS_FIXTURES" -name '*.safetensors' ! -path '*/bad/*' | sort >"$tmp/files"
nfix=$(wc -l <"$tmp/files")
check "found only $nfix fixtures" [ "$nfix" -ge 20 ]
i=0; pairs=""
while read -r f; do
	i=$((i + 1))
	if ! "$MSINV" inspect --file-digests --json "$f" >"$tmp/j$i" 2>"$tmp/e"; then
		bad "$f: exit $? ($(cat "$tmp/e"))"
		continue
	fi
	check "$f: stderr not empty" [ ! -s "$tmp/e" ]
	check "$f: --json does not parse" json_ok "$tmp/j$i"
	"$MSINV" inspect --file-digests "$f" >"$tmp/t$i" 2>/dev/null
	pairs="$pairs $tmp/j$i $tmp/t$i"
	# header: N from the first 8 bytes (little-endian), then openssl
	n=$(od -An -t u8 -N 8 "$f" | tr -d ' ')
	want=$(head -c $((8 + n)) "$f" | sha)
	check "$f: header digest" grep -qx "# header sha256 $want" "$tmp/t$i"
	want=$(sha256sum "$f" | cut -c1-64)
	check "$f: file digest" grep -qx "# file sha256 $want" "$tmp/t$i"
done <"$tmp/files"
if [ "$have_py" = 1 ]; then
	# shellcheck disable=SC2086
	python3 "$tmp/oracle.py" $pairs >"$tmp/last"
	check "tensor digests against the Python oracle" [ $? -eq 0 ]
	# one tensor per file cut out with tail/head and hashed by openssl
	while read -r f off len digest; do
		got=$(tail -c +$((off + 1)) "$f" | head -c "$len" | sha)
		check "$f: tensor at $off ($len bytes) by openssl" [ "$got" = "$digest" ]
	done <"$tmp/last"
	check "openssl cross-checks: $(wc -l <"$tmp/last")" [ "$(wc -l <"$tmp/last")" -ge 20 ]
else
	echo "inspect_cli: no python3; tensor digests checked by openssl only in the cases below" >&2
fi

# ---- identity does not depend on sharding ------------------------------------
for m in qwen3moe mixtral; do
	a=$("$MSINV" inspect --digests "$MS_FIXTURES/hf/$m" | grep '^# state ')
	b=$("$MSINV" inspect --digests "$MS_FIXTURES/hf/$m-sharded" | grep '^# state ')
	c=$("$MSINV" inspect --digests --jobs 1 "$MS_FIXTURES/hf/$m-sharded/model.safetensors.index.json" | grep '^# state ')
	check "$m: sharded state differs ($a / $b)" [ -n "$a" ] && [ "$a" = "$b" ] && [ "$b" = "$c" ]
	# and the tensor lines are the same, whichever thread count hashed them
	"$MSINV" inspect --digests --jobs 1 "$MS_FIXTURES/hf/$m" | grep -v '^#' >"$tmp/a"
	"$MSINV" inspect --digests --jobs 7 "$MS_FIXTURES/hf/$m-sharded" | grep -v '^#' >"$tmp/b"
	check "$m: tensor lines differ" cmp -s "$tmp/a" "$tmp/b"
done
# a different state has a different digest
a=$("$MSINV" inspect --digests "$MS_FIXTURES/hf/qwen3moe" | grep '^# state ')
b=$("$MSINV" inspect --digests "$MS_FIXTURES/hf/mixtral" | grep '^# state ')
check "different models, same state" [ "$a" != "$b" ]

# ---- a Hugging Face cache snapshot ---------------------------------------------
mkcache() { # dir, wrong
	mkdir -p "$1/blobs" "$1/snapshots/rev0"
	for f in "$MS_FIXTURES"/hf/mixtral-sharded/*; do
		h=$(sha256sum "$f" | cut -c1-64)
		# the wrong name: a valid digest, of other bytes
		case "$2:$f" in 1:*00002-of-00002*) h=$(echo "not $h" | sha256sum | cut -c1-64);; esac
		cp "$f" "$1/blobs/$h"
		ln -s "../../blobs/$h" "$1/snapshots/rev0/$(basename "$f")"
	done
}
mkcache "$tmp/hub/models--t--good" 0
mkcache "$tmp/hub/models--t--bad" 1
"$MSINV" inspect --file-digests "$tmp/hub/models--t--good/snapshots/rev0" >"$tmp/o" 2>"$tmp/e"
check "cache snapshot: exit $? ($(cat "$tmp/e"))" [ $? -eq 0 ]
a=$(grep '^# state ' "$tmp/o")
b=$("$MSINV" inspect --digests "$MS_FIXTURES/hf/mixtral-sharded" | grep '^# state ')
check "cache snapshot: state differs" [ -n "$a" ] && [ "$a" = "$b" ]
"$MSINV" inspect --digests "$tmp/hub/models--t--bad/snapshots/rev0" >/dev/null 2>&1
check "wrong blob name without --file-digests: exit $?" [ $? -eq 0 ]
"$MSINV" inspect --file-digests "$tmp/hub/models--t--bad/snapshots/rev0" >"$tmp/o" 2>"$tmp/e"
rc=$?
check "wrong blob name: exit $rc (want 1)" [ $rc -eq 1 ]
check "wrong blob name: stderr '$(cat "$tmp/e")'" [ "$(wc -l <"$tmp/e")" -eq 1 ]
check "wrong blob name: message" grep -q "model-00002-of-00002.safetensors'.*does not match its blob name" "$tmp/e"

# ---- command line ----------------------------------------------------------------
"$MSINV" >/dev/null 2>&1; check "no command: exit $?" [ $? -eq 2 ]
"$MSINV" inspect >/dev/null 2>"$tmp/e"; rc=$?
check "no path: exit $rc" [ $rc -eq 2 ]
check "no path: usage line" grep -q '^usage: msinv inspect ' "$tmp/e"
"$MSINV" inspect --bogus x >/dev/null 2>"$tmp/e"; rc=$?
check "unknown option: exit $rc" [ $rc -eq 2 ]
check "unknown option: message" grep -q "unknown option '--bogus'" "$tmp/e"
"$MSINV" inspect --jobs x "$MS_FIXTURES/hf/mixtral" >/dev/null 2>&1
check "bad --jobs: exit $?" [ $? -eq 2 ]
"$MSINV" inspect "$tmp/nonexistent" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "missing path: exit $rc" [ $rc -eq 2 ]
check "missing path: one line naming it" [ "$(wc -l <"$tmp/e")" -eq 1 ] && grep -q nonexistent "$tmp/e"
"$MSINV" inspect --help >"$tmp/o" 2>&1; rc=$?
check "--help: exit $rc" [ $rc -eq 0 ]
check "--help: synopsis" grep -qx 'usage: msinv inspect \[--digests\] \[--file-digests\] \[--jobs N\] \[--json\] PATH\.\.\.' "$tmp/o"
if [ -w /dev/full ]; then
	"$MSINV" inspect --digests "$MS_FIXTURES/hf/qwen3moe" >/dev/full 2>/dev/null
	check "full stdout: exit $? (want 3)" [ $? -eq 3 ]
fi

# ---- what our writer makes, read by the Python safetensors package -----------------
PY=$MS_ROOT/.venv/bin/python
if [ -x "$PY" ] && "$PY" -c 'import safetensors' 2>/dev/null && [ -x "$MS_BUILD/tests/t_safetensors" ]; then
	mkdir -p "$tmp/w"
	MS_ST_WRITE_DIR="$tmp/w" MS_FIXTURES="$MS_FIXTURES" "$MS_BUILD/tests/t_safetensors" writer_roundtrip >"$tmp/o" 2>&1
	check "writer round trip: $(tail -n 3 "$tmp/o")" grep -q ' 1 passed, 0 failed' "$tmp/o"
	nw=$(find "$tmp/w" -name 'rt_*.safetensors' | wc -l)
	check "writer files: $nw (want 23)" [ "$nw" -eq 23 ]
	args=""
	for f in "$tmp"/w/rt_*.safetensors; do
		"$MSINV" inspect --digests --json "$f" >"$f.json" 2>"$tmp/e" || bad "$f: $(cat "$tmp/e")"
		args="$args $f $f.json"
	done
	# shellcheck disable=SC2086
	"$PY" - $args <<'PY'
import hashlib, json, os, sys
import safetensors
args, errors = sys.argv[1:], 0
for path, jpath in zip(args[0::2], args[1::2]):
    try:
        mine = json.load(open(jpath))
        got = safetensors.deserialize(open(path, "rb").read())  # validates everything
        assert len(got) == len(mine["tensors"]), "tensor count"
        ours = {t["name"]: t for t in mine["tensors"]}
        for name, t in got:
            o = ours[name]
            assert t["dtype"] == o["dtype"], (name, t["dtype"], o["dtype"])
            assert list(t["shape"]) == o["shape"], (name, t["shape"], o["shape"])
            assert hashlib.sha256(bytes(t["data"])).hexdigest() == o["sha256"], name
        # metadata survives, escapes included
        with safetensors.safe_open(path, framework="numpy") as f:
            meta = f.metadata()
        assert meta["format"] == "pt" and meta['writer "test"\n'] == "t_safetensors\t\\", meta
    except Exception as e:
        errors += 1
        print("python safetensors: %s: %r" % (os.path.basename(path), e), file=sys.stderr)
sys.exit(1 if errors else 0)
PY
	check "python safetensors reads what our writer wrote" [ $? -eq 0 ]
	# numeric dtypes numpy knows: the values themselves
	"$PY" - "$tmp/w/rt_all.safetensors" <<'PY'
import sys, numpy as np
from safetensors import safe_open
raw = open(sys.argv[1], "rb").read()
with safe_open(sys.argv[1], framework="numpy") as f:
    for name, dt in [("t.F32", np.float32), ("t.I64", np.int64), ("t.U16", np.uint16),
                     ("t.F16", np.float16), ("t.BOOL", np.bool_), ("t.C64", np.complex64)]:
        a = f.get_tensor(name)
        assert a.dtype == dt and a.shape == (4, 6), name
        # the values numpy reads are the bytes at the place our header says
        assert a.tobytes() in raw, name
    assert f.get_tensor("scalar").item() == 3.5
PY
	check "numpy values of the writer's tensors" [ $? -eq 0 ]
else
	echo "inspect_cli: skipping the Python safetensors checks (no .venv with safetensors; run make venv)" >&2
fi

echo "inspect_cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
