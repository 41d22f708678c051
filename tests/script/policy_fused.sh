#!/bin/sh
# msverify policy names what a served copy is made of: after --register,
# a copy with one flipped byte is still reported against the base and the
# adapter it was made of (the registered policy is named as what it
# resembles, not as its part); and a served directory in vLLM's fused
# parameter names (experts.w13_weight [E, 2I, H] = gate_proj then up_proj
# of each expert, experts.w2_weight [E, H, I] = down_proj, qkv_proj =
# q_proj, k_proj, v_proj stacked), written from the fixture's bytes, is
# matched slice by slice against the inventoried per-expert tensors
# instead of showing as unknown; a changed slice is named.
B=${MS_BUILD:-build}
FX=${MS_FIXTURES:-tests/fixtures}
pass=0; fail=0
W=$(mktemp -d "${TMPDIR:-/tmp}/policy-fused.XXXXXX"); trap 'rm -rf "$W"' EXIT
export MSINV_DB="$W/inv.db"

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
expect() { # CODE CMD...
	want=$1; shift
	"$@" >"$W/out" 2>"$W/err"
	got=$?
	if [ "$got" -eq "$want" ]; then ok; else bad "exit $got (want $want): $*"; sed 's/^/  /' "$W/err"; fi
}
has() { grep -q -- "$1" "$2" && ok || { bad "$3: no '$1' in $2"; sed 's/^/  /' "$2"; }; }
hasnt() { if grep -q -- "$1" "$2"; then bad "$3: '$1' in $2"; sed 's/^/  /' "$2"; else ok; fi; }
flip() { python3 - "$1" "$2" "$3" <<'EOF'
import json, struct, sys
path, name, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    off = 8 + n + h[name]["data_offsets"][0] + at
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 1]))
EOF
}

cd "$W" || exit 3
P="$FX/peft/qwen3moe-E8-r4"
expect 0 "$B/msinv" init
expect 0 "$B/msinv" add --label base "$P/base"
expect 0 "$B/msinv" add --label lora --parent base --op train "$P/adapter"

# ---- a registered policy does not hide its constituents ----
mkdir served && cp -r "$P/base" served/base && cp -r "$P/adapter" served/adapter
expect 0 "$B/msverify" policy --register --label v1 served/base served/adapter
has "^part.*	base	base	" "$W/out" "registered from base"
flip served/base/model.safetensors model.layers.1.self_attn.o_proj.weight 10
expect 1 "$B/msverify" policy served/base served/adapter
has "^part.*	base	base	.*(partial)" "$W/out" "the changed copy is named against the base"
has "^part.*	lora	adapter	" "$W/out" "and against the adapter"
hasnt "^part.*	v1	policy" "$W/out" "the registered policy is not a part"
has "^resembles.*	v1	policy	.* of .* tensors" "$W/out" "the registered policy is named as what it resembles"
has "^mismatch	model.layers.1.self_attn.o_proj.weight	part base records other bytes" "$W/out" "the flipped tensor is named against the base"
expect 1 "$B/msverify" policy --json served/base served/adapter
python3 - "$W/out" <<'EOF' && ok || bad "--json: parts are the constituents, the policy is under resembles"
import json, sys
d = json.load(open(sys.argv[1]))
assert [p.get("label") for p in d["parts"]] == ["base", "lora"], d["parts"]
assert [p.get("label") for p in d["resembles"]] == ["v1"], d["resembles"]
assert [u["tensor"] for u in d["unaccounted"]] == ["model.layers.1.self_attn.o_proj.weight"]
EOF

# ---- vLLM's fused parameter names, from the fixture's bytes ----
mkdir vllm && cp "$P/base/config.json" vllm/
python3 - "$P/base/model.safetensors" vllm/model.safetensors <<'EOF'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
d = open(src, "rb").read()
n = struct.unpack("<Q", d[:8])[0]
h = json.loads(d[8:8 + n]); h.pop("__metadata__", None)
b = lambda k: d[8 + n + h[k]["data_offsets"][0]:8 + n + h[k]["data_offsets"][1]]
out = {}
layers = sorted({int(k.split(".")[2]) for k in h if k.startswith("model.layers.")})
for k in h:
    if ".mlp.experts." in k or ".self_attn.q_proj." in k or ".self_attn.k_proj." in k or ".self_attn.v_proj." in k:
        continue
    out[k] = (h[k]["dtype"], h[k]["shape"], b(k))
for L in layers:
    p = "model.layers.%d." % L
    E = len({k.split(".")[5] for k in h if k.startswith(p + "mlp.experts.")})
    g = h[p + "mlp.experts.0.gate_proj.weight"]["shape"]
    dn = h[p + "mlp.experts.0.down_proj.weight"]["shape"]
    # FusedMoE: w13 [E, 2I, H], expert e = gate_proj (w1) then up_proj (w3); w2 [E, H, I]
    out[p + "mlp.experts.w13_weight"] = ("BF16", [E, 2 * g[0], g[1]], b"".join(
        b(p + "mlp.experts.%d.gate_proj.weight" % e) + b(p + "mlp.experts.%d.up_proj.weight" % e) for e in range(E)))
    out[p + "mlp.experts.w2_weight"] = ("BF16", [E] + dn, b"".join(
        b(p + "mlp.experts.%d.down_proj.weight" % e) for e in range(E)))
    # QKVParallelLinear: q, k, v stacked along the output dimension
    q, kk, v = (h[p + "self_attn.%s_proj.weight" % x]["shape"] for x in "qkv")
    out[p + "self_attn.qkv_proj.weight"] = ("BF16", [q[0] + kk[0] + v[0], q[1]], b"".join(
        b(p + "self_attn.%s_proj.weight" % x) for x in "qkv"))
hd, off, body = {}, 0, []
for k in sorted(out):
    dt, sh, by = out[k]
    hd[k] = {"dtype": dt, "shape": sh, "data_offsets": [off, off + len(by)]}
    off += len(by); body.append(by)
hb = json.dumps(hd, separators=(",", ":")).encode(); hb += b" " * (-len(hb) % 8)
open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(body))
EOF
expect 0 "$B/msverify" policy vllm
has "^part.*	base	base	.*	[0-9]* of [0-9]* tensors$" "$W/out" "the fused copy is the whole base"
has "^unfused	model.layers.0.mlp.experts.w13_weight" "$W/out" "w13 sliced"
has "^unfused	model.layers.1.mlp.experts.w2_weight" "$W/out" "w2 sliced"
has "^unfused	model.layers.0.self_attn.qkv_proj.weight" "$W/out" "qkv sliced"
has "^identified" "$W/out" "identified"
hasnt "^unknown" "$W/out" "no fused name is unknown"
# expert 3's up_proj half of layer 0's w13: bytes [3*2*32*64 + 32*64]*2 on
flip vllm/model.safetensors model.layers.0.mlp.experts.w13_weight $(( (3 * 2 * 32 * 64 + 32 * 64) * 2 + 6 ))
expect 1 "$B/msverify" policy vllm
has "^mismatch	model.layers.0.mlp.experts.3.up_proj.weight	part base records other bytes under this name (slice of 'model.layers.0.mlp.experts.w13_weight')" "$W/out" "the changed slice is named"
[ "$(grep -c '^mismatch' "$W/out")" -eq 1 ] && ok || bad "only the changed slice is a mismatch"
expect 1 "$B/msverify" policy --json vllm
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); u=d["unaccounted"]; assert len(u)==1 and u[0]["slice_of"]=="model.layers.0.mlp.experts.w13_weight" and u[0]["status"]=="mismatch"' "$W/out" && ok || bad "--json names the slice"
# a state inventoried in the engine's own layout matches as is, unsliced
# (vllm2: the unchanged fused copy, the flip above undone)
cp -r vllm vllm2 && flip vllm2/model.safetensors model.layers.0.mlp.experts.w13_weight $(( (3 * 2 * 32 * 64 + 32 * 64) * 2 + 6 ))
expect 0 "$B/msinv" add --label served-fused vllm2
expect 0 "$B/msverify" policy vllm2
hasnt "^unfused" "$W/out" "an inventoried fused layout is not sliced"

echo "policy_fused: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
