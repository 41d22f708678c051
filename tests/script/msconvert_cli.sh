#!/bin/sh
# msconvert from the command line, on the bundled Hugging Face fixtures:
# names, dtypes and shapes of every recipe/format/layout; the printed state
# digest recomputed here; sharded input = unsharded input; dequantize within
# bound; 2D transpose exact through files; the refusals (1D transpose
# without source, existing output, bad input, CUDA) with their exit codes;
# --dry-run writes nothing; a command that fails after writing (its
# registration refused) leaves the directory as it was and registers
# nothing; --force replaces a whole output of its kind only. Checks use python3's standard library only.
. "$(dirname "$0")/lib.sh"
tmp=$W
MSC="$B/msconvert"


# expect CODE CMD...: run, keep stdout/stderr in $tmp/out, $tmp/err
expect() {
	want=$1; shift
	"$@" >"$tmp/out" 2>"$tmp/err"
	got=$?
	if [ "$got" -eq "$want" ]; then ok; else bad "exit $got (want $want): $*"; sed 's/^/  /' "$tmp/err"; fi
}

# one_line: stderr is exactly one line starting "msconvert: " and matching RE
one_line() {
	if [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "^msconvert: " "$tmp/err" && grep -qE "$1" "$tmp/err"; then
		ok
	else
		bad "stderr is not one line matching '$1':"; sed 's/^/  /' "$tmp/err"
	fi
}

# usage_err RE: the error line, then the usage line
usage_err() {
	if [ "$(wc -l <"$tmp/err")" -eq 2 ] && head -n 1 "$tmp/err" | grep -qE "^msconvert: $1" &&
	   sed -n 2p "$tmp/err" | grep -q "^usage: msconvert "; then
		ok
	else
		bad "usage error is not '$1' + usage:"; sed 's/^/  /' "$tmp/err"
	fi
}

py() { python3 - "$@"; }

# The state digest of a checkpoint, computed from the files here: the
# canonical manifest of checkpoint.h, hashed.
PYLIB='
import hashlib, json, os, struct, sys
def tensors(path):
    files = [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
    out = {}
    for f in files:
        blob = open(f, "rb").read()
        n = struct.unpack("<Q", blob[:8])[0]
        h = json.loads(blob[8:8 + n])
        meta = h.pop("__metadata__", {})
        for k, v in h.items():
            b, e = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], blob[8 + n + b:8 + n + e], os.path.basename(f), meta)
    return out
def digest(path):
    t = tensors(path)
    m = "msinv-state-v1\n" + "".join(
        "%s\t%s\t[%s]\t%s\n" % (k, t[k][0], ",".join(map(str, t[k][1])), hashlib.sha256(t[k][2]).hexdigest())
        for k in sorted(t, key=lambda s: s.encode()))
    return "sha256:" + hashlib.sha256(m.encode()).hexdigest()
def bf16(raw):
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack("<%dH" % (len(raw) // 2), raw)]
'

# digest_ok OUT: stdout is "<verb> <digest> OUT" with the digest of OUT
digest_ok() {
	line=$(cat "$tmp/out")
	d=$(py "$1" <<EOF
$PYLIB
print(digest(sys.argv[1]))
EOF
)
	case "$line" in
	*" $d $1") ok ;;
	*) bad "printed '$line', recomputed $d" ;;
	esac
}

# names_ok OUT FORMAT LAYOUT: the tensors of one quantized module and the
# ones left alone
names_ok() {
	if py "$@" <<EOF
$PYLIB
out, fmt, lay = sys.argv[1:4]
t = tensors(out)
p = "model.layers.1.mlp.experts.3.down_proj"   # W [64, 32]
row = {"modelopt": (".weight", ".weight_scale"), "compressed-tensors": (".weight_packed", ".weight_scale")}[fmt]
col = {"modelopt": (".weight_colwise", ".weight_colwise_scale"),
       "compressed-tensors": (".weight_packed_colwise", ".weight_scale_colwise")}[fmt]
ts = {"modelopt": (".weight_scale_2", []), "compressed-tensors": (".weight_global_scale", [1])}[fmt]
want = {p + ts[0]: ("F32", ts[1])}
if lay in ("rowwise", "both"):
    want[p + row[0]] = ("U8", [64, 16]); want[p + row[1]] = ("F8_E4M3", [64, 2])
if lay in ("columnwise", "both"):
    want[p + col[0]] = ("U8", [32, 32]); want[p + col[1]] = ("F8_E4M3", [32, 4])
for n, (dt, sh) in want.items():
    assert n in t and t[n][0] == dt and t[n][1] == sh, (n, t.get(n, [None])[:2])
mod = [k for k in t if k.startswith(p)]
assert sorted(mod) == sorted(want), mod
for keep in ("lm_head.weight", "model.embed_tokens.weight", "model.layers.0.mlp.gate.weight",
             "model.norm.weight", "model.layers.0.input_layernorm.weight"):
    assert t[keep][0] == "BF16", keep
m = json.loads(t[p + ts[0]][4]["msinv.nvfp4"])
assert m["tensors"][p]["shape"] == [64, 32] and m["format"] == fmt, m
assert t[p + ts[0]][4]["format"] == "pt"
EOF
	then ok; else bad "names of $*"; fi
}

Q=$FX/hf/qwen3moe
QS=$FX/hf/qwen3moe-sharded
MX=$FX/hf/mixtral

[ -x "$MSC" ] || { echo "msconvert_cli: 0 passed, 1 failed (no $MSC)"; exit 1; }

# ---- every recipe, format and layout -----------------------------------------
for r in modelopt compressed-tensors te; do
	for f in modelopt compressed-tensors; do
		for l in rowwise columnwise both; do
			o=$tmp/q-$r-$f-$l
			expect 0 "$MSC" quantize "$Q" -o "$o" --recipe "$r" --format "$f" --layout "$l" --jobs 2
			digest_ok "$o"
			names_ok "$o" "$f" "$l"
		done
	done
done

# configuration files of the two flavors
if py "$tmp" <<'EOF'
import json, os, sys
d = sys.argv[1]
h = json.load(open(os.path.join(d, "q-modelopt-modelopt-rowwise", "hf_quant_config.json")))
# weights only: Model Optimizer's W4A16_NVFP4 ("NVFP4" declares activations)
assert h["producer"]["name"] == "modelopt" and h["quantization"]["quant_algo"] == "W4A16_NVFP4"
assert "model.embed_tokens" in h["quantization"]["exclude_modules"]
assert h["quantization"]["group_size"] == 16
assert "lm_head" in h["quantization"]["exclude_modules"]
assert "model.layers.0.mlp.gate" in h["quantization"]["exclude_modules"]
c = json.load(open(os.path.join(d, "q-modelopt-modelopt-rowwise", "config.json")))
assert c["quantization_config"]["quant_method"] == "modelopt" and c["model_type"] == "qwen3_moe"
c = json.load(open(os.path.join(d, "q-compressed-tensors-compressed-tensors-rowwise", "config.json")))
q = c["quantization_config"]
assert q["quant_method"] == "compressed-tensors" and q["format"] == "nvfp4-pack-quantized"
w = q["config_groups"]["group_0"]["weights"]
assert w["group_size"] == 16 and w["strategy"] == "tensor_group" and w["num_bits"] == 4
assert "lm_head" in q["ignore"] and "model.embed_tokens" not in q["ignore"]
assert w["observer"] == "memoryless_minmax" and w["scale_dtype"] == "torch.float8_e4m3fn"
assert q["version"] == "0.19.0"
assert c["quantization_config"]["quant_method"] == "compressed-tensors"
assert not os.path.exists(os.path.join(d, "q-compressed-tensors-compressed-tensors-rowwise", "hf_quant_config.json"))
assert os.path.exists(os.path.join(d, "q-te-modelopt-rowwise", "generation_config.json"))
EOF
then ok; else bad "configuration files"; fi

# compressed-tensors' global scale is generate_gparam's 2688 / amax on a bf16
# weight: amax.reciprocal() * 2688, each rounded to bf16; amax the group's
# (q/k/v)
if py "$tmp/q-compressed-tensors-compressed-tensors-rowwise" "$Q" <<EOF
$PYLIB
q, src = tensors(sys.argv[1]), tensors(sys.argv[2])
L = "model.layers.0.self_attn."
amax = max(max(abs(v) for v in bf16(src[L + p + ".weight"][2])) for p in ("q_proj", "k_proj", "v_proj"))
def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]
def to_bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000
    return struct.unpack("<f", struct.pack("<I", u))[0]
def gparam(a):
    return to_bf16(f32(to_bf16(f32(1.0 / a)) * 2688.0))
for p in ("q_proj", "k_proj", "v_proj"):
    gs = struct.unpack("<f", q[L + p + ".weight_global_scale"][2])[0]
    assert gs == gparam(amax) and gs != f32(2688.0 / amax), (gs, 2688.0 / amax)
o = struct.unpack("<f", q[L + "o_proj.weight_global_scale"][2])[0]
oa = max(abs(v) for v in bf16(src[L + "o_proj.weight"][2]))
assert o == gparam(oa)
EOF
then ok; else bad "compressed-tensors global scales"; fi

# Mixtral: w1/w3 of one expert share a tensor scale; --no-fuse-scales not
expect 0 "$MSC" quantize "$MX" -o "$tmp/mx"
expect 0 "$MSC" quantize "$MX" -o "$tmp/mx-nofuse" --no-fuse-scales
if py "$tmp/mx" "$tmp/mx-nofuse" <<EOF
$PYLIB
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
E = "model.layers.0.block_sparse_moe.experts.%d.%s.weight_scale_2"
diff = 0
for e in range(8):
    assert a[E % (e, "w1")][2] == a[E % (e, "w3")][2]
    diff += b[E % (e, "w1")][2] != b[E % (e, "w3")][2]
assert diff > 0
EOF
then ok; else bad "mixtral fused w1/w3"; fi

# ---- sharded input: same tensors as unsharded, the shards mirrored -----------
expect 0 "$MSC" quantize "$QS" -o "$tmp/qs"
digest_ok "$tmp/qs"
expect 0 "$MSC" quantize "$Q" -o "$tmp/qu"
if [ "$(cut -d' ' -f2 "$tmp/out")" = "$(py "$tmp/qs" <<EOF
$PYLIB
print(digest(sys.argv[1]))
EOF
)" ]; then ok; else bad "sharded and unsharded give different states"; fi
if py "$tmp/qs" "$QS" "$tmp/qu" <<EOF
$PYLIB
out, src, un = sys.argv[1:4]
idx = json.load(open(os.path.join(out, "model.safetensors.index.json")))
t, s, u = tensors(out), tensors(src), tensors(un)
assert set(idx["weight_map"]) == set(t) == set(u)
assert idx["metadata"]["total_size"] == sum(len(v[2]) for v in t.values())
for k, f in idx["weight_map"].items():
    assert t[k][3] == f, (k, f)
    assert t[k][2] == u[k][2], k
# each quantized module stays in the shard its source came from
for k, v in s.items():
    if k in t:
        assert t[k][3] == v[3], k
assert sorted(set(f for f in idx["weight_map"].values())) == sorted(
    f for f in os.listdir(src) if f.endswith(".safetensors"))
EOF
then ok; else bad "sharded output index and bytes"; fi

# ---- dequantize: within bound of the source ----------------------------------
expect 0 "$MSC" dequantize "$tmp/qu" -o "$tmp/dq"
digest_ok "$tmp/dq"
expect 0 "$MSC" dequantize "$tmp/q-te-compressed-tensors-columnwise" -o "$tmp/dq-col" --dtype f32
if py "$tmp/dq" "$Q" "$tmp/dq-col" <<EOF
$PYLIB
import math
d, s, c = tensors(sys.argv[1]), tensors(sys.argv[2]), tensors(sys.argv[3])
assert set(d) == set(s) == set(c)
n = 0
for k, v in s.items():
    assert d[k][0] == "BF16" and d[k][1] == v[1], k
    if "msinv.nvfp4" in str(d[k][4]):
        raise AssertionError("metadata kept")
    if d[k][2] == v[2]:
        continue
    n += 1
    x, y = bf16(v[2]), bf16(d[k][2])
    z = [struct.unpack("<f", c[k][2][4 * i:4 * i + 4])[0] for i in range(len(x))]
    for got in (y, z):
        err = math.sqrt(sum((a - b) ** 2 for a, b in zip(x, got)) / sum(a * a for a in x))
        assert 0 < err < 0.15, (k, err)
assert n == 56, n
cfg = json.load(open(os.path.join(sys.argv[1], "config.json")))
assert "quantization_config" not in cfg
assert not os.path.exists(os.path.join(sys.argv[1], "hf_quant_config.json"))
EOF
then ok; else bad "dequantize round trip"; fi

# ---- transpose ------------------------------------------------------------------
for r in modelopt compressed-tensors te; do
	expect 0 "$MSC" quantize "$Q" -o "$tmp/t2r-$r" --block 2d --recipe "$r"
	expect 0 "$MSC" quantize "$Q" -o "$tmp/t2c-$r" --block 2d --recipe "$r" --layout columnwise
	direct=$(cut -d' ' -f2 "$tmp/out")
	expect 0 "$MSC" transpose "$tmp/t2r-$r" -o "$tmp/t2rc-$r"
	if [ "$(cut -d' ' -f2 "$tmp/out")" = "$direct" ] && cmp -s "$tmp/t2c-$r/model.safetensors" "$tmp/t2rc-$r/model.safetensors"; then
		ok; else bad "2d transpose of $r differs from columnwise quantization"; fi
	expect 0 "$MSC" transpose "$tmp/t2rc-$r" -o "$tmp/t2rcr-$r"
	if cmp -s "$tmp/t2r-$r/model.safetensors" "$tmp/t2rcr-$r/model.safetensors"; then
		ok; else bad "2d transpose back of $r differs"; fi
done
expect 2 "$MSC" transpose "$tmp/qu" -o "$tmp/t1"
one_line "1d blocks.*--source"
[ -e "$tmp/t1" ] && bad "failed transpose left output" || ok
expect 0 "$MSC" transpose "$tmp/qu" -o "$tmp/t1" --source "$Q"
expect 0 "$MSC" quantize "$Q" -o "$tmp/t1-direct" --layout columnwise
if cmp -s "$tmp/t1/model.safetensors" "$tmp/t1-direct/model.safetensors"; then ok; else bad "1d transpose with source"; fi
# a source that is not the original is refused
expect 2 "$MSC" transpose "$tmp/qu" -o "$tmp/t1-bad" --source "$tmp/dq"
one_line "not the source|does not reproduce"

# ---- refusals -------------------------------------------------------------------
expect 2 "$MSC" quantize "$Q" -o "$tmp/qu"
one_line "already exists"
expect 0 "$MSC" quantize "$Q" -o "$tmp/qu" --force --recipe te
expect 2 "$MSC" quantize "$tmp/qu" -o "$tmp/qq"
one_line "already quantized"
expect 2 "$MSC" quantize "$Q" -o "$tmp/x" --recipe fp4
expect 2 "$MSC" quantize "$Q" -o "$tmp/x" --bogus
usage_err "unknown option '--bogus'"
expect 2 "$MSC" quantize "$Q"
usage_err "missing -o OUT"
expect 2 "$MSC" quantize "$Q" -o "$tmp/x" --include '['
one_line "include pattern"
expect 2 "$MSC" quantize "$Q" -o "$tmp/x" --include 'layernorm'
one_line "tensor 'model.layers.0.input_layernorm.weight'"
[ -e "$tmp/x" ] && bad "refused quantize left output" || ok
head -c 1000 "$Q/model.safetensors" >"$tmp/trunc.safetensors"
expect 2 "$MSC" quantize "$tmp/trunc.safetensors" -o "$tmp/x.safetensors"
one_line "trunc.safetensors"
# a NaN in a weight: the tensor and the first bad element
py "$Q/model.safetensors" "$tmp/nan.safetensors" <<'EOF'
import json, struct, sys
blob = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", blob[:8])[0]
h = json.loads(blob[8:8 + n])
b = h["model.layers.1.self_attn.o_proj.weight"]["data_offsets"][0]
for i in (77, 300):
    blob[8 + n + b + 2 * i:8 + n + b + 2 * i + 2] = struct.pack("<H", 0x7fc0)
open(sys.argv[2], "wb").write(blob)
EOF
expect 2 "$MSC" quantize "$tmp/nan.safetensors" -o "$tmp/x.safetensors"
one_line "tensor 'model.layers.1.self_attn.o_proj.weight' in '.*nan.safetensors': non-finite value \(nan\) at element 77"
[ -e "$tmp/x.safetensors" ] && bad "failed quantize left output" || ok
expect 0 "$MSC" quantize "$tmp/nan.safetensors" -o "$tmp/x.safetensors" --allow-nonfinite
# an input tensor named like a companion the plan would add
py "$tmp/dup.safetensors" <<'EOF'
import json, struct, sys
w = struct.pack("<256f", *([0.5] * 256))
h = {"m.self_attn.o_proj.weight": {"dtype": "F32", "shape": [16, 16], "data_offsets": [0, 1024]},
     "m.self_attn.o_proj.weight_scale_2": {"dtype": "F32", "shape": [], "data_offsets": [1024, 1028]}}
j = json.dumps(h).encode()
j += b" " * (-len(j) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(j)) + j + w + struct.pack("<f", 1.0))
EOF
expect 2 "$MSC" quantize "$tmp/dup.safetensors" -o "$tmp/dup-out.safetensors"
one_line "two tensors named 'm.self_attn.o_proj.weight_scale_2'"
[ -e "$tmp/dup-out.safetensors" ] && bad "refused quantize left output" || ok
expect 3 "$MSC" quantize "$Q" -o "$tmp/x2" --device cuda
one_line "CUDA"
expect 0 "$MSC" quantize "$Q" -o "$tmp/x2" --device cpu
expect 2 "$MSC" dequantize "$Q" -o "$tmp/x3"
one_line "no nvfp4 weights"

# ---- selection ------------------------------------------------------------------
expect 0 "$MSC" quantize "$Q" -o "$tmp/sel" --exclude 'self_attn' --include '^lm_head'
if py "$tmp/sel" <<EOF
$PYLIB
t = tensors(sys.argv[1])
assert t["lm_head.weight"][0] == "U8" and "lm_head.weight_scale" in t
assert t["model.layers.0.self_attn.q_proj.weight"][0] == "BF16"
assert t["model.layers.0.mlp.experts.0.up_proj.weight"][0] == "U8"
EOF
then ok; else bad "--include/--exclude"; fi

# ---- dry run --------------------------------------------------------------------
expect 0 "$MSC" quantize "$QS" -o "$tmp/dry" --dry-run --layout both
[ -e "$tmp/dry" ] && bad "--dry-run wrote $tmp/dry" || ok
grep -q "^quantize	model.layers.0.mlp.experts.0.down_proj.weight	BF16	\[64,32\]	4096	->" "$tmp/out" && ok || bad "dry-run plan line"
grep -q "^# 56 quantized, 13 copied, 18 fused groups, 2 files" "$tmp/out" && ok || bad "dry-run totals: $(tail -n 1 "$tmp/out")"

# ---- stats ----------------------------------------------------------------------
expect 0 "$MSC" stats "$tmp/q-modelopt-modelopt-both" --source "$Q" --json
if py "$tmp/out" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert len(s["tensors"]) == 112
t = s["total"]
assert 0.05 < t["rel_err"] < 0.15 and 0 < t["saturated_share"] < 0.1, t
assert sum(t["scale_exponents"]) == sum(sum(x["scale_exponents"]) for x in s["tensors"])
assert {x["layout"] for x in s["tensors"]} == {"rowwise", "columnwise"}
EOF
then ok; else bad "stats --json"; fi
expect 0 "$MSC" stats "$tmp/qs"
grep -q "^total	56	" "$tmp/out" && ok || bad "stats total line"

# ---- registration in an inventory -----------------------------------------------
MSI="$B/msinv"
expect 0 "$MSI" init --db "$tmp/inv.db"
expect 0 "$MSC" quantize "$FX/hf/qwen3moe" -o "$tmp/qreg" --block 2d --layout both --db "$tmp/inv.db"
qd=$(awk '{print $2}' "$tmp/out")
expect 0 "$MSI" show --db "$tmp/inv.db" --json "$qd"
python3 - "$tmp/out" <<'PY' && ok || bad "registered quantized state with its quantize edge"
import json, sys
s = json.load(open(sys.argv[1]))
text = json.dumps(s)
assert '"quantized"' in text and '"quantize"' in text and '"2d"' in text, text[:400]
PY
expect 0 "$MSI" log --db "$tmp/inv.db" --check
# MSINV_DB selects the inventory; --no-register writes the files only
expect 0 env MSINV_DB="$tmp/inv.db" "$MSC" dequantize "$tmp/qreg" -o "$tmp/dreg"
expect 0 "$MSI" ls --db "$tmp/inv.db"
[ "$(wc -l <"$tmp/out")" -eq 3 ] && ok || bad "dequantize output registered ($(wc -l <"$tmp/out") states)"
expect 0 env MSINV_DB="$tmp/inv.db" "$MSC" dequantize --no-register "$tmp/qreg" -o "$tmp/dreg2"
expect 0 "$MSI" ls --db "$tmp/inv.db"
[ "$(wc -l <"$tmp/out")" -eq 3 ] && ok || bad "--no-register registered something"
# a missing inventory fails before anything is written
expect 2 "$MSC" quantize "$FX/hf/qwen3moe" -o "$tmp/qnodb" --db "$tmp/none.db"
one_line "no inventory|none.db"
[ ! -e "$tmp/qnodb" ] && ok || bad "output written although the inventory was missing"

# ---- all or nothing: a failed command leaves the directory as it was ----
# a registration that fails (a trigger refuses quantized states): no output,
# and not even the input registered
expect 0 "$MSI" init --db "$tmp/fail.db"
sqlite3 "$tmp/fail.db" "CREATE TRIGGER no_quantized BEFORE INSERT ON states WHEN NEW.kind = 'quantized' BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END;"
expect 3 "$MSC" quantize "$Q/model.safetensors" -o "$tmp/qfail.safetensors" --db "$tmp/fail.db"
one_line "refused by a trigger"
[ ! -e "$tmp/qfail.safetensors" ] && ok || bad "failed registration left the output"
[ "$(sqlite3 "$tmp/fail.db" "SELECT count(*) FROM states")" = 0 ] && ok || bad "failed command registered its input"
expect 3 "$MSC" quantize "$FX/hf/qwen3moe-sharded" -o "$tmp/qfaild" --db "$tmp/fail.db"
[ ! -e "$tmp/qfaild" ] && ok || bad "failed registration left the output directory"
# with --force the output replaced comes back
expect 0 "$MSC" quantize "$Q/model.safetensors" -o "$tmp/qkeep.safetensors" --no-register
cp "$tmp/qkeep.safetensors" "$tmp/qkeep.orig"
expect 3 "$MSC" quantize "$Q/model.safetensors" -o "$tmp/qkeep.safetensors" --block 2d --force --db "$tmp/fail.db"
cmp -s "$tmp/qkeep.safetensors" "$tmp/qkeep.orig" && ok || bad "a failed --force did not put the old output back"
expect 0 "$MSC" quantize "$FX/hf/qwen3moe-sharded" -o "$tmp/qkeepd" --no-register
(cd "$tmp/qkeepd" && cksum ./*) >"$tmp/qkeepd.sums"
expect 3 "$MSC" quantize "$FX/hf/qwen3moe-sharded" -o "$tmp/qkeepd" --block 2d --force --db "$tmp/fail.db"
(cd "$tmp/qkeepd" && cksum ./*) | cmp -s - "$tmp/qkeepd.sums" && ok ||
	bad "a failed --force did not put the old directory back"
[ "$(sqlite3 "$tmp/fail.db" "SELECT count(*) FROM states")" = 0 ] && ok || bad "failed --force registered something"
# --force replaces a directory as a whole, and only one of files
echo stale >"$tmp/qkeepd/stale.txt"
expect 0 "$MSC" quantize "$FX/hf/qwen3moe-sharded" -o "$tmp/qkeepd" --force --no-register
[ ! -e "$tmp/qkeepd/stale.txt" ] && [ -e "$tmp/qkeepd/model.safetensors.index.json" ] && ok ||
	bad "--force did not replace the directory as a whole"
mkdir -p "$tmp/qsub/keep"
expect 2 "$MSC" quantize "$FX/hf/qwen3moe-sharded" -o "$tmp/qsub" --force --no-register
one_line "holds 'keep', which is not a file"
[ -d "$tmp/qsub/keep" ] && ok || bad "--force took a directory holding a directory"
expect 2 "$MSC" quantize "$Q/model.safetensors" -o "$tmp/qsub" --force --no-register
one_line "is not a file"

# ---- help -----------------------------------------------------------------------
expect 0 "$MSC" --help
expect 0 "$MSC" quantize --help
grep -q "^usage: msconvert quantize IN -o OUT" "$tmp/out" && ok || bad "quantize --help"

# nothing left behind by the refused and failed runs
if [ -z "$(find "$tmp" -name '*.tmp-*')" ]; then ok; else bad "temporary files left: $(find "$tmp" -name '*.tmp-*')"; fi

echo "msconvert_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
