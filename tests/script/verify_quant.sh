#!/bin/sh
# msverify quant finds the source of a quantized state in the inventory
# (its quantize edge) when given a path or a state, checks every weight
# against it, and says so loudly when there is none: never "ok" for a
# check that compared nothing (exit 1 under --strict).
. "$(dirname "$0")/lib.sh"
tmp=$W
# expect CODE CMD...: stdout in $tmp/out, stderr in $tmp/err
expect() {
	want=$1; shift
	"$@" >"$tmp/out" 2>"$tmp/err"
	got=$?
	if [ "$got" -eq "$want" ]; then ok; else bad "exit $got (want $want): $*"; sed 's/^/  /' "$tmp/out" "$tmp/err"; fi
}
has() { # FILE RE
	if grep -qE "$2" "$1"; then ok; else bad "$1 lacks '$2':"; sed 's/^/  /' "$1"; fi
}
hasnt() { # FILE RE
	if grep -qE "$2" "$1"; then bad "$1 has '$2':"; sed 's/^/  /' "$1"; else ok; fi
}
# set_scales FILE TENSOR BYTE: overwrite every byte of TENSOR in place
set_scales() {
	python3 - "$@" <<'EOF'
import json, struct, sys
f, name, byte = sys.argv[1], sys.argv[2], int(sys.argv[3], 16)
with open(f, "r+b") as fh:
    n = struct.unpack("<Q", fh.read(8))[0]
    h = json.loads(fh.read(n))
    b, e = h[name]["data_offsets"]
    fh.seek(8 + n + b)
    fh.write(bytes([byte]) * (e - b))
EOF
}
cd "$tmp" || exit 3
DB="$tmp/db"
expect 0 "$B/msinv" init --db "$DB"
expect 0 "$B/msconvert" quantize "$FX/hf/qwen3moe" -o q --db "$DB"
D=$(awk '{print $2}' "$tmp/out")

# registered: the source comes from the quantize edge, by path or state
expect 0 "$B/msverify" quant q --db "$DB"
has "$tmp/out" '^ok	56 weights	56 checks'
expect 0 "$B/msverify" quant "$D" --db "$DB" --strict
has "$tmp/out" '^ok	'

# every block scale of one weight set to 448 in place: found through the
# path's registration (the bytes no longer have the recorded digest)
W=model.layers.1.mlp.experts.3.down_proj
set_scales q/model.safetensors "$W.weight_scale" 7e
expect 1 "$B/msverify" quant q --db "$DB"
has "$tmp/out" "^FAIL	$W	rowwise	relative error"
hasnt "$tmp/out" '^ok'
has "$tmp/err" "^msverify: 'q': 1 check failed"
expect 1 "$B/msverify" quant q --db "$DB" --json
python3 - "$tmp/out" "$W" <<'EOF' && ok || bad "json of a failed check"
import json, sys
j = json.load(open(sys.argv[1]))
bad = [t["weight"] for t in j["tensors"] if t["result"] == "fail"]
assert bad == [sys.argv[2]], bad
assert j["failed"] == 1 and j["source"].endswith("qwen3moe"), j
EOF

# no inventory, or a path nobody registered: loud on stderr, never "ok",
# exit 0 by default and 1 under --strict
cp -r "$FX/hf/qwen3moe" src
expect 0 "$B/msconvert" quantize src -o lone --no-register
expect 0 "$B/msverify" quant lone --db "$DB"
has "$tmp/out" '^UNCHECKED	56 weights	no source'
hasnt "$tmp/out" '^ok'
has "$tmp/err" "^msverify: warning: 'lone': no source to check the decoded values against \(no state of '.*' is recorded at 'lone'; pass --source\): not verified$"
expect 1 "$B/msverify" quant lone --db "$DB" --strict
has "$tmp/err" "^msverify: 'lone': no source"
expect 1 "$B/msverify" quant lone --db "$tmp/none" --strict
has "$tmp/err" "no inventory at"
expect 0 "$B/msverify" quant lone --db "$tmp/none" --json
python3 - "$tmp/out" <<'EOF' && ok || bad "json without a source"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["source"] is None and j["no_source"], j
assert {t["result"] for t in j["tensors"]} == {"unchecked"}, j
EOF
# a source given by hand is used, and catches the same damage
set_scales lone/model.safetensors "$W.weight_scale" 7e
expect 1 "$B/msverify" quant lone --source src --strict
has "$tmp/out" "^FAIL	$W	rowwise"

# the quantize edge's parameters must match what the files hold
expect 0 "$B/msconvert" quantize src -o q2 --db "$DB" --block 2d --layout both
expect 0 "$B/msverify" quant q2 --db "$DB" --strict
python3 - q2/model.safetensors <<'EOF' && ok || bad "rewrite metadata"
import json, struct, sys
f = sys.argv[1]
blob = bytearray(open(f, "rb").read())
n = struct.unpack("<Q", blob[:8])[0]
h = blob[8:8 + n].decode()
h2 = h.replace('"block\\":\\"2d\\"', '"block\\":\\"1d\\"')
assert h2 != h and len(h2) == len(h)
blob[8:8 + n] = h2.encode()
open(f, "wb").write(blob)
EOF
expect 1 "$B/msverify" quant q2 --db "$DB"
has "$tmp/out" "1d blocks, the quantize edge records 2d"

echo "verify_quant: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
