#!/bin/sh
# msverify policy names what a served copy is made of: after --register,
# a copy with one flipped byte is still reported against the base and the
# adapter it was made of (the registered policy is named as what it
# resembles, not as its part); and a served directory in vLLM's fused
# parameter names (experts.w13_weight [E, 2I, H] = gate_proj then up_proj
# of each expert, experts.w2_weight [E, H, I] = down_proj, qkv_proj =
# q_proj, k_proj, v_proj stacked; Mixtral's w1/w3/w2; a dense MLP's
# gate_up_proj), written from the fixtures' bytes, is matched slice by
# slice against the inventoried tensors instead of showing as unknown; a
# changed slice is named.
. "$(dirname "$0")/lib.sh"
export MSINV_DB="$W/inv.db"

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
# fuse.py SRC DST GATE UP DOWN: write SRC's tensors as vLLM holds them:
# FusedMoE w13 [E, 2I, H] (expert e = GATE then UP), w2 [E, H, I] (DOWN);
# QKVParallelLinear qkv_proj (q, k, v stacked); MergedColumnParallelLinear
# gate_up_proj (a dense MLP's gate_proj then up_proj)
cat >fuse.py <<'EOF'
import json, re, struct, sys
src, dst, gate, up, down = sys.argv[1:6]
d = open(src, "rb").read()
n = struct.unpack("<Q", d[:8])[0]
h = json.loads(d[8:8 + n]); h.pop("__metadata__", None)
b = lambda k: d[8 + n + h[k]["data_offsets"][0]:8 + n + h[k]["data_offsets"][1]]
out, used = {}, set()
moes = sorted({m.group(1) for k in h for m in [re.match(r"(.*)\.experts\.\d+\.", k)] if m})
for p in moes:
    E = len({k for k in h if re.match(re.escape(p) + r"\.experts\.\d+\.%s\.weight$" % gate, k)})
    g = h["%s.experts.0.%s.weight" % (p, gate)]["shape"]
    dn = h["%s.experts.0.%s.weight" % (p, down)]["shape"]
    w13 = ["%s.experts.%d.%s.weight" % (p, e, x) for e in range(E) for x in (gate, up)]
    w2 = ["%s.experts.%d.%s.weight" % (p, e, down) for e in range(E)]
    out[p + ".experts.w13_weight"] = (h[w13[0]]["dtype"], [E, 2 * g[0], g[1]], b"".join(map(b, w13)))
    out[p + ".experts.w2_weight"] = (h[w2[0]]["dtype"], [E] + dn, b"".join(map(b, w2)))
    used |= set(w13) | set(w2)
for k in list(h):
    m = re.match(r"(.*)\.q_proj\.weight$", k)
    if m:
        qkv = [m.group(1) + ".%s_proj.weight" % x for x in "qkv"]
        out[m.group(1) + ".qkv_proj.weight"] = (h[k]["dtype"], [sum(h[x]["shape"][0] for x in qkv),
                                                 h[k]["shape"][1]], b"".join(map(b, qkv)))
        used |= set(qkv)
    m = re.match(r"(.*)\.gate_proj\.weight$", k)
    if m and k not in used:
        gu = [m.group(1) + ".gate_proj.weight", m.group(1) + ".up_proj.weight"]
        out[m.group(1) + ".gate_up_proj.weight"] = (h[k]["dtype"], [2 * h[k]["shape"][0], h[k]["shape"][1]],
                                                    b"".join(map(b, gu)))
        used |= set(gu)
for k in h:
    if k not in used:
        out[k] = (h[k]["dtype"], h[k]["shape"], b(k))
hd, off, body = {}, 0, []
for k in sorted(out):
    dt, sh, by = out[k]
    hd[k] = {"dtype": dt, "shape": sh, "data_offsets": [off, off + len(by)]}
    off += len(by); body.append(by)
hb = json.dumps(hd, separators=(",", ":")).encode(); hb += b" " * (-len(hb) % 8)
open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(body))
EOF
mkdir vllm && cp "$P/base/config.json" vllm/
python3 fuse.py "$P/base/model.safetensors" vllm/model.safetensors gate_proj up_proj down_proj || bad "fuse.py"
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

# Mixtral: w1 (gate) and w3 (up) in w13, w2 in w2_weight, under block_sparse_moe
expect 0 "$B/msinv" add --label mixtral "$FX/hf/mixtral"
mkdir mixtral && cp "$FX/hf/mixtral/config.json" mixtral/
python3 fuse.py "$FX/hf/mixtral/model.safetensors" mixtral/model.safetensors w1 w3 w2 || bad "fuse.py mixtral"
expect 0 "$B/msverify" policy mixtral
has "^unfused	model.layers.1.block_sparse_moe.experts.w13_weight" "$W/out" "mixtral w13 sliced"
has "^part.*	mixtral	base	.*	[0-9]* of [0-9]* tensors$" "$W/out" "the fused Mixtral copy is the whole checkpoint"
has "^identified" "$W/out" "mixtral identified"

# a dense MLP's gate_up_proj (gate_proj rows first, then up_proj)
mkdir dense && python3 - dense/model.safetensors <<'EOF'
import json, random, struct, sys
rng = random.Random(7)
t = {"model.layers.0.mlp.gate_proj.weight": [24, 16], "model.layers.0.mlp.up_proj.weight": [24, 16],
     "model.layers.0.mlp.down_proj.weight": [16, 24]}
hd, off, body = {}, 0, []
for k in sorted(t):
    by = bytes(rng.randrange(256) for _ in range(t[k][0] * t[k][1] * 2))
    hd[k] = {"dtype": "BF16", "shape": t[k], "data_offsets": [off, off + len(by)]}
    off += len(by); body.append(by)
hb = json.dumps(hd, separators=(",", ":")).encode(); hb += b" " * (-len(hb) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(body))
EOF
expect 0 "$B/msinv" add --label dense dense
mkdir dense-served && python3 fuse.py dense/model.safetensors dense-served/model.safetensors gate_proj up_proj down_proj || bad "fuse.py dense"
expect 0 "$B/msverify" policy dense-served
has "^unfused	model.layers.0.mlp.gate_up_proj.weight" "$W/out" "gate_up_proj sliced"
has "^identified" "$W/out" "dense identified"

echo "policy_fused: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
