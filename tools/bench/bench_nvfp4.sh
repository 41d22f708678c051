#!/bin/sh
# bench_nvfp4.sh: NVFP4 quantize and dequantize throughput on the CPU, in
# GB/s of bf16 input: the reference codec against the fast path (SIMD,
# threads) and against the numpy oracle (tests/oracle/nvfp4_oracle.py), all
# on the same tensors, in one run.
#
#   MS_BENCH_NVFP4_MB=256 sh tools/bench/bench_nvfp4.sh   (BUILD=dir)
#
# bench_nvfp4.c is built by make bench-bins. It writes the
# random bf16 tensors it times to $TMPDIR; the oracle then quantizes the
# same file (modelopt, 1D, rowwise, the work the "fast1" line measured).
# Targets: the fast path >= 1 GB/s of bf16 input per core, and >= 20x the
# numpy oracle on one core. MS_BENCH_STRICT=1 makes a missed target exit 1.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BUILD=${MS_BUILD:-$ROOT/${BUILD:-build}}
MB=${MS_BENCH_NVFP4_MB:-256}
[ -f "$BUILD/libms.a" ] || { echo "bench_nvfp4: no $BUILD/libms.a (make first)" >&2; exit 3; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-nvfp4.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
BIN=$BUILD/bench/bench_nvfp4
[ -x "$BIN" ] || { echo "bench_nvfp4: no $BIN (make bench-bins first)" >&2; exit 3; }
"$BIN" "$tmp/w.safetensors" "$MB" | tee "$tmp/out"
set -- $(sed -n 's/^RESULT fast1 //p' "$tmp/out")
fast1=$1 bytes=$2
status=0
gbs=$(awk -v b="$bytes" -v t="$fast1" 'BEGIN { printf "%.2f", b / t / 1e9 }')
echo "fast path, one core: $gbs GB/s of bf16 input (target >= 1)"
awk -v g="$gbs" 'BEGIN { exit !(g >= 1) }' || status=1
PY=.venv/bin/python
if [ -x "$PY" ] && "$PY" -c "import numpy, ml_dtypes" 2>/dev/null; then
	set -- $("$PY" tests/oracle/nvfp4_oracle.py bench "$tmp/w.safetensors" --repeat 1)
	oracle=$3
	ratio=$(awk -v o="$oracle" -v t="$fast1" 'BEGIN { printf "%.1f", o / t }')
	echo "numpy oracle, one core: $(awk -v b="$bytes" -v t="$oracle" 'BEGIN { printf "%.3f", b / t / 1e9 }') GB/s; fast path $ratio x the oracle (target >= 20)"
	awk -v r="$ratio" 'BEGIN { exit !(r >= 20) }' || status=1
else
	echo "numpy oracle: skipped (no venv; make venv)"
fi
if [ "$status" -ne 0 ]; then
	echo "bench_nvfp4: a target was missed"
	[ "${MS_BENCH_STRICT:-0}" = 1 ] && exit 1
fi
exit 0
