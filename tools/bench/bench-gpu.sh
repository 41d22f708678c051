#!/bin/sh
# bench-gpu.sh (make bench-gpu): the GPU codec and the verified load on the
# GPU of this machine. Runs tools/bench/bench_gpu.c (built by make
# bench-bins), checks correctness (every timed kernel against the CPU reference
# on a slice; the PyTorch peer's bytes against ours), times, prints a table
# and writes tools/bench/RESULTS-gpu.md with the date and the device.
#
#   BUILD=dir sh tools/bench/bench-gpu.sh
#
# MS_BENCH_ROWS / MS_BENCH_COLS: the weight (default 32768 x 32768 bf16,
# 2 GiB); MS_BENCH_VLOAD_MB: the safetensors file for the load benchmark
# (default 3072 MB, written under $TMPDIR and removed; a second file of one
# 2 GiB tensor and 256 small ones beside it); MS_BENCH_CONVERT_GB:
# the checkpoint of the msconvert end-to-end run (default 4, 0 skips it).
# PYTHON: the
# interpreter with torch (default python3); without torch and a GPU the
# PyTorch rows (the eager quantizer, safetensors.torch.load_file) are left
# out. Exit 0, 1 when an output differed, 3 on failure.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 3
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD;; esac
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)}
if [ -z "$NVCC" ]; then
	echo "bench-gpu: no nvcc, so this build has no GPU support" >&2
	exit 3
fi
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
[ -f "$BUILD/libms.a" ] || { echo "bench-gpu: no $BUILD/libms.a (make first)" >&2; exit 3; }
# the programs are built by the Makefile (make bench-bins), with the same
# compile and link lines as the tools
for p in bench_gpu profile_quant; do
	[ -x "$BUILD/bench/$p" ] || { echo "bench-gpu: no $BUILD/bench/$p (make bench-bins first)" >&2; exit 3; }
done
BIN=$BUILD/bench/bench_gpu
# profile_quant is the one-launch driver for a profiler (tools/bench/NOTES.md): built, not run
ROWS=${MS_BENCH_ROWS:-32768}
COLS=${MS_BENCH_COLS:-32768}
VMB=${MS_BENCH_VLOAD_MB:-3072}
PY=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench-gpu.XXXXXX") || exit 3
trap 'rm -rf "$TMP"' EXIT INT TERM

"$BIN" --dump "$TMP" || exit 3
"$BIN" --make-vload "$TMP/vload.safetensors" --vload-mb "$VMB" \
	--make-vload2 "$TMP/vload2.safetensors" || exit 3
TMS=0
TLMS=0
TCHK="(no torch with CUDA here: the PyTorch peer was not run)"
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	if "$PY" tools/bench/bench_torch.py --check "$TMP" --rows "$ROWS" --cols "$COLS" \
		--load "$TMP/vload.safetensors" >"$TMP/torch.txt"; then
		TMS=$(sed -n 's/^TORCH_MS //p' "$TMP/torch.txt")
		TLMS=$(sed -n 's/^TORCH_LOAD_MS //p' "$TMP/torch.txt")
		TCHK=$(sed -n 's/^TORCH_CHECK //p' "$TMP/torch.txt")
	else
		TCHK="(the PyTorch peer failed)"
	fi
fi
"$BIN" --rows "$ROWS" --cols "$COLS" --torch-ms "${TMS:-0}" --torch-check "$TCHK" \
	--vload-file "$TMP/vload.safetensors" --torch-load-ms "${TLMS:-0}" \
	--vload2-file "$TMP/vload2.safetensors" \
	--out tools/bench/RESULTS-gpu.md
status=$?
# msconvert end to end on a generated checkpoint, appended to the results
# (MS_BENCH_CONVERT_GB=0 leaves it out)
CGB=${MS_BENCH_CONVERT_GB:-4}
if [ "$CGB" != 0 ]; then
	if MS_BENCH_GB=$CGB BUILD=$BUILD sh tools/bench/bench_convert_gpu.sh >"$TMP/convert.txt" 2>&1; then
		cst=ok
	else
		cst=failed
		status=1
	fi
	{
		echo
		echo "## msconvert end to end (tools/bench/bench_convert_gpu.sh, $cst)"
		echo
		echo "A generated bf16 Qwen3-MoE-style checkpoint of about $CGB GB (finite"
		echo "weights, per-expert tensors, 1 GB shards) quantized to NVFP4 rowwise +"
		echo "columnwise (modelopt, 1D) on each device; the input read once first."
		echo
		echo '```'
		cat "$TMP/convert.txt"
		echo '```'
	} >>tools/bench/RESULTS-gpu.md
fi
echo
cat tools/bench/RESULTS-gpu.md
exit $status
