#!/bin/sh
# msconvert against the independent numpy + ml_dtypes oracle
# (tests/oracle/nvfp4_oracle.py): random bf16 weights made in python, never
# zero, with exact ties, widely spread magnitudes and sizes that are not
# multiples of 16; every recipe, 1D and 2D, both layouts, both on-disk
# flavors (--pad-ragged: the sizes that are not multiples of 16 are
# quantized padded, which is what the oracle checks; by default they are
# left as they are, see golden_interop.sh); dequantize decoded by the
# oracle; each output loaded with the
# real safetensors package. Skipped (0 passed, 0 failed) without the venv.
. "$(dirname "$0")/lib.sh"
tmp=$W
PY=$ROOT/.venv/bin/python
ORACLE=$ROOT/tests/oracle/nvfp4_oracle.py
if [ ! -x "$PY" ] || ! "$PY" -c "import numpy, ml_dtypes, safetensors" 2>/dev/null; then
	echo "nvfp4_oracle: skipped: no python oracle environment (make venv)"
	echo "nvfp4_oracle: 0 passed, 0 failed"
	exit 0
fi

run() { # label, command...
	label=$1; shift
	if "$@" >"$tmp/log" 2>&1; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1)); echo "FAIL: $label"; sed 's/^/  /' "$tmp/log" | head -n 25
	fi
}

SRC=$tmp/src.safetensors
run "generate" "$PY" "$ORACLE" gen "$SRC" --seed 7
for r in modelopt compressed-tensors te; do
	for b in 1d 2d; do
		o=$tmp/q-$r-$b.safetensors
		run "quantize $r $b" "$B/msconvert" quantize "$SRC" -o "$o" --recipe "$r" --block "$b" --layout both --pad-ragged
		run "oracle $r $b" "$PY" "$ORACLE" check "$SRC" "$o" --recipe "$r" --block "$b" --layout both
	done
done
# the other flavor's names (and its form of the tensor scale), no fusing
for r in modelopt te; do
	o=$tmp/ct-$r.safetensors
	run "quantize $r as compressed-tensors" "$B/msconvert" quantize "$SRC" -o "$o" --recipe "$r" --format compressed-tensors --layout columnwise --pad-ragged
	run "oracle $r as compressed-tensors" "$PY" "$ORACLE" check "$SRC" "$o" --recipe "$r" --format compressed-tensors --layout columnwise
done
o=$tmp/mo-ct.safetensors
run "quantize compressed-tensors as modelopt" "$B/msconvert" quantize "$SRC" -o "$o" --recipe compressed-tensors --format modelopt --no-fuse-scales --pad-ragged
run "oracle compressed-tensors as modelopt" "$PY" "$ORACLE" check "$SRC" "$o" --recipe compressed-tensors --format modelopt --no-fuse
# a real Hugging Face checkpoint directory
run "quantize qwen3moe" "$B/msconvert" quantize "$FX/hf/qwen3moe" -o "$tmp/qwen" --recipe te --block 2d
run "oracle qwen3moe" "$PY" "$ORACLE" check "$FX/hf/qwen3moe/model.safetensors" "$tmp/qwen" --recipe te --block 2d
# dequantize, decoded here
for d in bf16 f32; do
	run "dequantize $d" "$B/msconvert" dequantize "$tmp/q-compressed-tensors-1d.safetensors" -o "$tmp/dq-$d.safetensors" --dtype "$d"
	run "oracle dequantize $d" "$PY" "$ORACLE" check-deq "$tmp/q-compressed-tensors-1d.safetensors" "$tmp/dq-$d.safetensors" --dtype "$d"
done
run "dequantize modelopt" "$B/msconvert" dequantize "$tmp/q-modelopt-2d.safetensors" -o "$tmp/dq-mo.safetensors"
run "oracle dequantize modelopt" "$PY" "$ORACLE" check-deq "$tmp/q-modelopt-2d.safetensors" "$tmp/dq-mo.safetensors"
echo "nvfp4_oracle: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
