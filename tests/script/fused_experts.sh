#!/bin/sh
# Fused 3-D expert tensors (transformers 5's layout, the qwen3moe-stacked
# fixture: the qwen3moe fixture's experts stacked into gate_up_proj
# [E, 2I, H] and down_proj [E, H, I]) are quantized: per expert (the
# default) the output is the very state quantizing the per-expert
# checkpoint gives; fused (--experts fused) it holds the same bytes
# stacked, one tensor scale per expert. msverify quant checks both against
# the fused source, and the footprint planner counts what is written.
. "$(dirname "$0")/lib.sh"
tmp=$W
expect() {
	want=$1; shift
	"$@" >"$tmp/out" 2>"$tmp/err"
	got=$?
	if [ "$got" -eq "$want" ]; then ok; else bad "exit $got (want $want): $*"; sed 's/^/  /' "$tmp/out" "$tmp/err"; fi
}
has() { # FILE RE
	if grep -qE "$2" "$1"; then ok; else bad "$1 lacks '$2':"; sed 's/^/  /' "$1"; fi
}
one_line() { # RE: stderr is one line "msconvert: ..." matching RE
	if [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qE "^msconvert: .*$1" "$tmp/err"; then ok; else
		bad "stderr is not one line matching '$1':"; sed 's/^/  /' "$tmp/err"; fi
}
py() { python3 - "$@"; }
HDR='
import json, struct, sys
def header(path):
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    h = json.loads(blob[8:8 + n])
    meta = h.pop("__metadata__", {})
    return h, meta, blob, 8 + n
def data(path):
    h, meta, blob, base = header(path)
    return {k: (v["dtype"], v["shape"], blob[base + v["data_offsets"][0]:base + v["data_offsets"][1]]) for k, v in h.items()}, meta
'
cd "$tmp" || exit 3
F="$FX/hf/qwen3moe-stacked"
DB="$tmp/db"
expect 0 "$B/msinv" init --db "$DB"

# ---- per expert (default): the state of the per-expert checkpoint, quantized
expect 0 "$B/msconvert" quantize "$F" -o pe --db "$DB"
pe=$(awk '{print $2}' "$tmp/out")
expect 0 "$B/msconvert" quantize "$FX/hf/qwen3moe" -o ref --no-register
ref=$(awk '{print $2}' "$tmp/out")
if [ -n "$pe" ] && [ "$pe" = "$ref" ]; then ok; else bad "per-expert state $pe differs from quantized qwen3moe $ref"; fi
py pe/model.safetensors <<EOF && ok || bad "per-expert names"
$HDR
h, meta, _, _ = header(sys.argv[1])
assert not [k for k, v in h.items() if len(v["shape"]) == 3], "3-d tensors left"
assert h["model.layers.1.mlp.experts.7.gate_proj.weight"]["dtype"] == "U8"
assert h["model.layers.1.mlp.experts.7.up_proj.weight_scale"]["shape"] == [32, 4]
assert h["model.layers.1.mlp.experts.7.down_proj.weight"]["shape"] == [64, 16]
assert h["model.layers.0.mlp.experts.0.gate_proj.weight_scale_2"]["shape"] == []
EOF

# ---- fused: the same bytes stacked, one tensor scale per expert
expect 0 "$B/msconvert" quantize "$F" -o fu --experts fused --db "$DB"
py fu/model.safetensors ref/model.safetensors <<EOF && ok || bad "fused layout against the per-expert bytes"
$HDR
fu, meta = data(sys.argv[1])
ref, _ = data(sys.argv[2])
for L in (0, 1):
    m = "model.layers.%d.mlp.experts." % L
    assert fu[m + "gate_up_proj"][:2] == ("U8", [8, 64, 32]), fu[m + "gate_up_proj"][:2]
    assert fu[m + "gate_up_proj_weight_scale"][:2] == ("F8_E4M3", [8, 64, 4])
    assert fu[m + "gate_up_proj_weight_scale_2"][:2] == ("F32", [8])
    assert fu[m + "down_proj"][:2] == ("U8", [8, 64, 16])
    assert fu[m + "down_proj_weight_scale"][:2] == ("F8_E4M3", [8, 64, 2])
    assert fu[m + "down_proj_weight_scale_2"][:2] == ("F32", [8])
    for e in range(8):
        p = m + "%d." % e
        gu = fu[m + "gate_up_proj"][2][e * 64 * 32:(e + 1) * 64 * 32]
        assert gu == ref[p + "gate_proj.weight"][2] + ref[p + "up_proj.weight"][2], (L, e)
        gs = fu[m + "gate_up_proj_weight_scale"][2][e * 64 * 4:(e + 1) * 64 * 4]
        assert gs == ref[p + "gate_proj.weight_scale"][2] + ref[p + "up_proj.weight_scale"][2]
        ts = fu[m + "gate_up_proj_weight_scale_2"][2][4 * e:4 * e + 4]
        assert ts == ref[p + "gate_proj.weight_scale_2"][2] == ref[p + "up_proj.weight_scale_2"][2]
        assert fu[m + "down_proj"][2][e * 64 * 16:(e + 1) * 64 * 16] == ref[p + "down_proj.weight"][2]
        assert fu[m + "down_proj_weight_scale"][2][e * 128:(e + 1) * 128] == ref[p + "down_proj.weight_scale"][2]
        assert fu[m + "down_proj_weight_scale_2"][2][4 * e:4 * e + 4] == ref[p + "down_proj.weight_scale_2"][2]
md = json.loads(meta["msinv.nvfp4"])
assert md["tensors"]["model.layers.0.mlp.experts.gate_up_proj"]["shape"] == [8, 64, 64], md
assert not [k for k in fu if fu[k][0] == "BF16" and len(fu[k][1]) == 3]
EOF

# ---- msverify quant: both checked against the fused source they came from
expect 0 "$B/msverify" quant pe --db "$DB" --strict
has "$tmp/out" '^ok	56 weights	56 checks'
expect 0 "$B/msverify" quant fu --db "$DB" --strict
has "$tmp/out" '^ok	40 weights	40 checks'
# one expert's block scales of the fused tensor set to 448 in place
py fu/model.safetensors <<EOF && ok || bad "tamper"
$HDR
h, meta, blob, base = header(sys.argv[1])
b, e = h["model.layers.0.mlp.experts.gate_up_proj_weight_scale"]["data_offsets"]
with open(sys.argv[1], "r+b") as f:
    f.seek(base + b + 3 * 64 * 4)
    f.write(b"\x7e" * (64 * 4))
EOF
expect 1 "$B/msverify" quant fu --db "$DB"
has "$tmp/out" '^FAIL	model\.layers\.0\.mlp\.experts\.3\.gate_up_proj	rowwise	relative error'
if [ "$(grep -c '^FAIL	model' "$tmp/out")" -eq 1 ]; then ok; else bad "one failure expected"; cat "$tmp/out"; fi
expect 0 "$B/msconvert" stats pe --source "$F"
has "$tmp/out" '^model\.layers\.1\.mlp\.experts\.7\.up_proj	rowwise	\[32,64\].*	0\.[0-9]'

# ---- selection, other flavors and layouts, refusals
expect 0 "$B/msconvert" quantize "$F" -o inc --include experts --exclude self_attn --no-register
py inc/model.safetensors <<EOF && ok || bad "--include experts"
$HDR
h, _, _, _ = header(sys.argv[1])
assert h["model.layers.0.self_attn.q_proj.weight"]["dtype"] == "BF16"
assert h["model.layers.0.mlp.experts.5.down_proj.weight"]["dtype"] == "U8"
EOF
expect 0 "$B/msconvert" quantize "$F" -o ct --format compressed-tensors --layout both --block 2d --db "$DB"
expect 0 "$B/msverify" quant ct --db "$DB" --strict
has "$tmp/out" '^ok	56 weights	112 checks'
expect 2 "$B/msconvert" quantize "$F" -o x1 --experts fused --format compressed-tensors --no-register
one_line "'model\.layers\.0\.mlp\.experts\.down_proj'.*--experts fused is written in the modelopt format only"
expect 2 "$B/msconvert" quantize "$F" -o x2 --experts fused --layout both --no-register
one_line "--experts fused writes the rowwise layout only"
expect 2 "$B/msconvert" quantize "$F" -o x3 --experts fused --no-fuse-scales --no-register
one_line "gate_up_proj'.*--no-fuse-scales"
expect 2 "$B/msconvert" quantize "$F" -o x4 --experts stacked --no-register
has "$tmp/err" "unknown expert layout 'stacked'"
cp -r "$F" fsrc
expect 0 "$B/msconvert" quantize fsrc -o fu2 --experts fused --no-register
# dequantize: the fused output decodes to the fused layout, slice for
# slice what the per-expert output decodes to
expect 0 "$B/msconvert" dequantize pe -o dq --no-register
expect 0 "$B/msconvert" dequantize fu2 -o fdq --dtype f32 --no-register
expect 0 "$B/msconvert" dequantize pe -o dq32 --dtype f32 --no-register
py fdq/model.safetensors dq32/model.safetensors <<EOF && ok || bad "fused dequantize against per-expert"
$HDR
f, _ = data(sys.argv[1])
p, _ = data(sys.argv[2])
assert not [k for k in f if "weight_scale" in k]
for L in (0, 1):
    m = "model.layers.%d.mlp.experts." % L
    assert f[m + "gate_up_proj"][:2] == ("F32", [8, 64, 64]) and f[m + "down_proj"][:2] == ("F32", [8, 64, 32])
    for e in range(8):
        assert f[m + "gate_up_proj"][2][e * 64 * 64 * 4:(e + 1) * 64 * 64 * 4] == \
            p[m + "%d.gate_proj.weight" % e][2] + p[m + "%d.up_proj.weight" % e][2]
        assert f[m + "down_proj"][2][e * 64 * 32 * 4:(e + 1) * 64 * 32 * 4] == p[m + "%d.down_proj.weight" % e][2]
EOF
expect 2 "$B/msconvert" transpose fu2 -o x5 --source "$F" --no-register
one_line "fused 3-d nvfp4 experts cannot be transposed"
# 1D columnwise copies of the per-expert output need the high-precision
# source: the fused one serves, giving what the per-expert source gives
expect 0 "$B/msconvert" transpose pe -o pe-col --source "$F" --no-register
a=$(awk '{print $2}' "$tmp/out")
expect 0 "$B/msconvert" transpose ref -o ref-col --source "$FX/hf/qwen3moe" --no-register
b=$(awk '{print $2}' "$tmp/out")
if [ -n "$a" ] && [ "$a" = "$b" ]; then ok; else bad "transposed with the fused source: $a, with the per-expert one: $b"; fi
expect 0 "$B/msverify" quant pe-col --source "$F" --strict
has "$tmp/out" '^ok	56 weights	56 checks'
# a NaN in expert 5's slice: refused before anything is written, naming it
cp -r "$F" nan
py nan/model.safetensors <<EOF && ok || bad "plant a NaN"
$HDR
h, meta, blob, base = header(sys.argv[1])
b, e = h["model.layers.0.mlp.experts.gate_up_proj"]["data_offsets"]
with open(sys.argv[1], "r+b") as f:
    f.seek(base + b + (5 * 64 * 64 + 32 * 64 + 70) * 2)
    f.write(b"\xc0\x7f")
EOF
expect 2 "$B/msconvert" quantize nan -o x6 --experts fused --no-register
one_line "tensor 'model\.layers\.0\.mlp\.experts\.gate_up_proj' in '.*', expert 5: .*2118"
expect 2 "$B/msconvert" quantize nan -o x7 --no-register
one_line "tensor 'model\.layers\.0\.mlp\.experts\.5\.up_proj\.weight' in '.*'.*70"
for x in x1 x2 x3 x4 x5 x6 x7; do [ -e "$x" ] && bad "$x written"; done

# experts stored as [in, out] (down_proj [E, I, H], as some checkpoints
# ship them): config.json's hidden_size tells, refused rather than
# quantized along the output dimension
cp -r "$F" tr
py tr/model.safetensors <<EOF && ok || bad "rewrite a shape"
$HDR
f = sys.argv[1]
blob = bytearray(open(f, "rb").read())
n = struct.unpack("<Q", blob[:8])[0]
h = json.loads(blob[8:8 + n])
h["model.layers.1.mlp.experts.down_proj"]["shape"] = [8, 32, 64]
hb = json.dumps(h, separators=(",", ":")).encode()
hb += b" " * (n - len(hb))
assert len(hb) == n
blob[8:8 + n] = hb
open(f, "wb").write(blob)
EOF
expect 2 "$B/msconvert" quantize tr -o x8 --no-register
one_line "tensor 'model\.layers\.1\.mlp\.experts\.down_proj' in '.*': shape \[8, 32, 64\] is not \[E, H, I\] with hidden_size 64"
[ -e x8 ] && bad "x8 written"

# ---- the footprint planner counts what is written
for m in per-expert fused; do
	printf '{"ep_size": 2, "states": [{"role": "w", "path": "%s", "repr": "nvfp4-rowwise", "experts": "%s"}]}\n' "$F" "$m" >"plan-$m.json"
done
printf '{"ep_size": 2, "states": [{"role": "w", "path": "%s"}]}\n' "$tmp/pe" >plan-pe.json
printf '{"ep_size": 2, "states": [{"role": "w", "path": "%s"}]}\n' "$tmp/fu2" >plan-fu.json
tot() { "$B/msinv" footprint --json "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["total_bytes_per_gpu"])'; }
a=$(tot plan-per-expert.json); b=$(tot plan-pe.json); c=$(tot plan-fused.json); d=$(tot plan-fu.json)
if [ -n "$a" ] && [ "$a" = "$b" ]; then ok; else bad "planned per-expert $a, written $b"; fi
if [ -n "$c" ] && [ "$c" = "$d" ]; then ok; else bad "planned fused $c, written $d"; fi
# the difference is the tensor scale gate and up no longer share: 4 B per expert, layer, over 2 ranks
if [ -n "$a" ] && [ $((a - c)) -eq $((8 * 2 * 4 / 2)) ]; then ok; else bad "per-expert $a vs fused $c"; fi
printf '{"ep_size": 2, "states": [{"role": "w", "path": "%s", "experts": "stacked"}]}\n' "$F" >plan-bad.json
expect 2 "$B/msinv" footprint plan-bad.json
has "$tmp/err" "states\[0\]\.experts.*unknown expert layout 'stacked'"

echo "fused_experts: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
