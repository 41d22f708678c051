#!/bin/sh
# msverify ep reports every fault of a shard set, not the first: several
# faults planted at once in one set (a swap of two experts within a rank,
# the same block across ranks, a missing expert, a duplicated expert, a
# misplaced expert, bytes of no expert) are all reported, each with its own
# description, one stderr line each and one entry each in --json (which
# prints a document on failure too); a swap in a fused LoRA is a swap.
. "$(dirname "$0")/lib.sh"
unset MSINV_DB

lines() { [ "$(wc -l <"$2")" -eq "$1" ] && ok || { bad "$3: $(wc -l <"$2") lines, want $1"; cat "$2"; }; }

# st.py FILE OP ARGS: rewrite one safetensors file (standard library only)
#   swap T1 T2          exchange the bytes of two tensors of one shape
#   copy T1 T2 [FROM]   T2 gets T1's bytes (T1 read from FROM if given)
#   drop T              remove tensor T
#   add T FROM          add tensor T with its bytes in file FROM
#   flip T              flip one bit of T
#   swaprows T ROW1 ROW2 NROWS   swap row blocks (fused lora_A slices)
#   swapcols T C1 C2 STRIDE      swap columns c1+k*stride and c2+k*stride
cat >"$W/st.py" <<'EOF'
import json, struct, sys
ES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}
def load(p):
    d = open(p, "rb").read()
    n = struct.unpack("<Q", d[:8])[0]
    h = json.loads(d[8:8 + n])
    meta = h.pop("__metadata__", None)
    t = {k: [v["dtype"], v["shape"], bytearray(d[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])]
         for k, v in h.items()}
    return meta, t
def save(p, meta, t):
    h, off, body = {}, 0, b""
    if meta is not None:
        h["__metadata__"] = meta
    for k in sorted(t):
        dt, sh, b = t[k]
        h[k] = {"dtype": dt, "shape": sh, "data_offsets": [off, off + len(b)]}
        off += len(b); body += bytes(b)
    hb = json.dumps(h, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + body)
p, op, a = sys.argv[1], sys.argv[2], sys.argv[3:]
meta, t = load(p)
if op == "swap":
    t[a[0]][2], t[a[1]][2] = t[a[1]][2], t[a[0]][2]
elif op == "copy":
    src = load(a[2])[1] if len(a) > 2 else t
    t[a[1]][2] = bytearray(src[a[0]][2])
elif op == "drop":
    del t[a[0]]
elif op == "add":
    t[a[0]] = load(a[1])[1][a[0]]
elif op == "flip":
    t[a[0]][2][0] ^= 1
elif op in ("swaprows", "swapcols"):
    dt, sh, b = t[a[0]]
    es = ES[dt]
    if op == "swaprows":
        r1, r2, nr = int(a[1]), int(a[2]), int(a[3])
        rb = sh[1] * es
        x, y = b[r1 * rb:(r1 + nr) * rb], b[r2 * rb:(r2 + nr) * rb]
        b[r1 * rb:(r1 + nr) * rb], b[r2 * rb:(r2 + nr) * rb] = y, x
    else:
        c1, c2, stride = int(a[1]), int(a[2]), int(a[3])
        for row in range(sh[0]):
            for k in range(sh[1] // stride):
                i, j = (row * sh[1] + c1 + k * stride) * es, (row * sh[1] + c2 + k * stride) * es
                b[i:i + es], b[j:j + es] = b[j:j + es], b[i:i + es]
save(p, meta, t)
EOF
st() { python3 "$W/st.py" "$@" || bad "st.py $*"; }

# per-expert checkpoint, 8 experts on 4 ranks (rank r holds 2r, 2r+1)
expect 0 "$B/msshard" split "$FX/hf/qwen3moe" -o "$W/ck" --ep-size 4
S="$W/ck"; R0="$S/model-ep00000-of-00004.safetensors"; R1="$S/model-ep00001-of-00004.safetensors"
R2="$S/model-ep00002-of-00004.safetensors"; R3="$S/model-ep00003-of-00004.safetensors"
L0=model.layers.0.mlp.experts; L1=model.layers.1.mlp.experts
st "$R1" swap $L0.2.gate_proj.weight $L0.3.gate_proj.weight        # swap within rank 1
st "$R2" drop $L0.4.up_proj.weight                                  # expert 4 missing
st "$R3" add $L0.0.down_proj.weight "$R0"                           # expert 0 also on rank 3
st "$R3" add $L1.5.gate_proj.weight "$R2"                           # expert 5 moved ...
st "$R2" drop $L1.5.gate_proj.weight                                # ... from rank 2 to 3
st "$R3" flip $L1.6.down_proj.weight                                # bytes of no expert
st "$R0" copy $L1.7.up_proj.weight $L1.1.up_proj.weight "$R3"       # rank 0 holds rank 3's block
expect 1 "$B/msverify" ep "$S"
lines 6 "$W/err" "one line per fault"
has "experts 2 and 3 of rank 1 are swapped" "$W/err" "swap within a rank"
has "$L0.4.up_proj.weight.*missing: expert 4 is placed on rank 2" "$W/err" "missing expert"
has "$L0.0.down_proj.weight.*expert 0 is duplicated: rank 3 holds it besides its own rank 0" "$W/err" "duplicate expert"
has "$L1.5.gate_proj.weight.*expert 5 is misplaced: it is on rank 3, but the placement puts it on rank 2" "$W/err" "wrong placement"
has "$L1.6.down_proj.weight.*expert 6 of .*digest does not match the manifest" "$W/err" "digest mismatch"
has "$L1.1.up_proj.weight.*rank 0 .* holds the bytes of global expert 7 (rank 3) as expert 1" "$W/err" "same block across ranks"
if grep "swapped" "$W/err" | grep -q "every rank loaded the same block"; then bad "a swap described as the same block"; else ok; fi
has "^FAIL.*6 faults" "$W/out" "summary counts the faults"
expect 1 "$B/msverify" ep --json "$S"
python3 - "$W/out" <<'EOF' && ok || bad "--json lists every fault"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["result"] == "fail", d["result"]
kinds = sorted(f["kind"] for f in d["faults"])
assert kinds == ["digest", "duplicate", "misplaced", "missing", "same-block", "swap"], kinds
by = {f["kind"]: f for f in d["faults"]}
assert by["swap"]["rank"] == 1 and {by["swap"]["expert"], by["swap"]["other_expert"]} == {2, 3}
assert by["same-block"]["rank"] == 0 and by["same-block"]["expert"] == 1
assert by["same-block"]["other_expert"] == 7 and by["same-block"]["other_rank"] == 3
assert by["misplaced"]["rank"] == 3 and by["misplaced"]["other_rank"] == 2
assert by["missing"]["expert"] == 4 and by["duplicate"]["expert"] == 0
assert all(f["message"] and f["tensor"] for f in d["faults"])
EOF

# fused LoRA (PEFT target_parameters), 8 experts on 4 ranks, r=4: swap the
# two local experts of rank 1 in one wrapper's A (rows) and B (columns)
expect 0 "$B/msshard" split "$FX/peft/qwen3moe-E8-r4/adapter" -o "$W/fu" --ep-size 4
F1="$W/fu/adapter_model-ep00001-of-00004.safetensors"
A=$(python3 - "$F1" <<'EOF'
import json, struct, sys
d = open(sys.argv[1], "rb").read(); h = json.loads(d[8:8 + struct.unpack("<Q", d[:8])[0]])
print(sorted(k for k in h if k.startswith("base_model.model.model.layers.0.") and k.endswith("experts.lora_A.weight"))[0])
EOF
)
st "$F1" swaprows "$A" 0 4 4
st "$F1" swapcols "$(echo "$A" | sed 's/lora_A/lora_B/')" 0 1 2
expect 1 "$B/msverify" ep "$W/fu"
lines 2 "$W/err" "fused: one line per swapped tensor"
has "lora_A.weight' in .*experts 2 and 3 of rank 1 are swapped" "$W/err" "fused A swap"
has "lora_B.weight' in .*experts 2 and 3 of rank 1 are swapped" "$W/err" "fused B swap"
if grep -q "same block" "$W/err"; then bad "fused swap described as the same block"; else ok; fi

# --json prints a document when the set cannot be checked at all (exit 2)
rm "$W/fu/adapter_model-ep00002-of-00004.safetensors"
expect 2 "$B/msverify" ep --json "$W/fu"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["result"]=="error" and d["exit"]==2 and "missing" in d["error"]' "$W/out" && ok || bad "--json on bad input"

# ---- running out of memory part way (fault-injection build) ----
# every allocation in turn (sampled): the report is whole (exit 1, every
# fault) or one line (exit 3), never a report cut short or a crash
fault_build() { # DIR: a fault build? (it logs the failures it injects)
	[ -x "$1/msverify" ] || return 1
	MS_FAULT_ALLOC=1 MS_FAULT_LOG="$W/probe.log" "$1/msshard" plan --experts 2 --ep-size 1 >/dev/null 2>&1
	[ -s "$W/probe.log" ]
}
FB=""
if fault_build "$B"; then FB=$B
elif fault_build "$ROOT/build-fault" &&
	[ -z "$(cd "$ROOT" && find src/shard*.c src/shard*.h src/pool.c tools/msverify.c -newer build-fault/msverify 2>/dev/null)" ]; then
	FB="$ROOT/build-fault"
fi
if [ -n "$FB" ]; then
	expect 0 "$B/msshard" split "$FX/hf/qwen3moe" -o "$W/oom" --ep-size 4
	python3 "$ROOT/tools/scripts/plant_same_block.py" "$W/oom" >/dev/null
	for mode in text json; do
		opt=""; [ $mode = json ] && opt=--json
		n=1; reached=0
		while [ $n -lt 1000000 ]; do
			rm -f "$W/fault.log"
			MS_FAULT_ALLOC=$n MS_FAULT_LOG="$W/fault.log" "$FB/msverify" ep $opt "$W/oom" >"$W/out" 2>"$W/err"
			rc=$?
			[ -s "$W/fault.log" ] || break
			reached=$n
			case $rc in
			3) [ "$(wc -l <"$W/err")" -eq 1 ] && ok || { bad "$mode MS_FAULT_ALLOC=$n: exit 3 with $(wc -l <"$W/err") lines"; tail -2 "$W/err"; };;
			1) [ "$(wc -l <"$W/err")" -eq 12 ] && ok || bad "$mode MS_FAULT_ALLOC=$n: exit 1 with $(wc -l <"$W/err") lines, want 12";;
			*) bad "$mode MS_FAULT_ALLOC=$n: exit $rc";;
			esac
			n=$((n + 1 + n / 8))
		done
		[ "$reached" -ge 1 ] && ok || bad "$mode: MS_FAULT_ALLOC never reached"
	done
else
	echo "verify_ep_faults: no fault-injection build (make fault): the out-of-memory cases were skipped"
fi

echo "verify_ep_faults: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
