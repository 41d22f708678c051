#!/bin/sh
# bench_python.sh: the verified load from Python (msinv.load_file into
# numpy arrays, python/) against the same load as a C program does it
# (bench_vload: ms_st_open, a malloc per tensor, ms_load_verified), on one
# generated safetensors file of MS_BENCH_GB GB (default 1).
#
#   MS_BENCH_GB=1 sh tools/bench/bench_python.sh     (BUILD=dir for the build)
#
# The binding does no per-byte work in Python (ctypes hands the library
# one pointer per tensor, the library reads, hashes and copies), so the
# target is a ratio python/C of at most 1.05. The two run alternately,
# MS_BENCH_RUNS rounds (default 5), from the page cache (the file is read
# once before timing), each timing only the load (not the interpreter's
# start); the best of each counts, by wall time and by CPU seconds (all
# threads of the process: the cost, which other work on a shared machine
# disturbs far less than the wall time). MS_BENCH_THREADS sets the
# threads (default 0: one per CPU). MS_BENCH_STRICT=1 makes a wall-time
# ratio over 1.05 exit 1.
# Needs the test venv with the package installed (make python).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD;; esac
GB=${MS_BENCH_GB:-1}
RUNS=${MS_BENCH_RUNS:-5}
THREADS=${MS_BENCH_THREADS:-0}
PY=$ROOT/.venv/bin/python
TMPDIR=${TMPDIR:-/tmp}
for f in "$BUILD/bench/bench_vload" "$BUILD/msinv" "$BUILD/libms.so.0" "$PY"; do
	[ -e "$f" ] || { echo "bench_python: no $f (make python bench-bins)" >&2; exit 3; }
done
MSINV_LIBMS=$BUILD/libms.so.0 "$PY" -c "import msinv" ||
	{ echo "bench_python: the msinv package is not installed (make python)" >&2; exit 3; }

W=$(mktemp -d "$TMPDIR/bench-python.XXXXXX"); trap 'rm -rf "$W"' EXIT
python3 "$ROOT/tools/scripts/gen_ckpt.py" "$W/ckpt" --gb "$GB" --shard-gb "$((GB + 1))" >/dev/null
FILE=$(ls "$W"/ckpt/*.safetensors | head -n 1)
"$BUILD/msinv" inspect --digests --json "$FILE" >"$W/inspect.json"
cat "$FILE" >/dev/null
cat >"$W/load.py" <<'PYEOF'
import json, sys, time
import msinv
path, digests, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = {t["name"]: t["sha256"] for t in json.load(open(digests))["tensors"]}
t0, c0 = time.perf_counter(), time.process_time()
out = msinv.load_file(path, d, threads=threads)
s, c = time.perf_counter() - t0, time.process_time() - c0
print("RESULT python %.6f %d %.6f" % (s, sum(a.nbytes for a in out.values()), c))
PYEOF

best_c=""; best_py=""; cpu_c=""; cpu_py=""; bytes=0
less() { [ -z "$2" ] || [ "$(echo "$1 < $2" | bc -l)" = 1 ]; }
r=0
while [ $r -lt "$RUNS" ]; do
	line=$("$BUILD/bench/bench_vload" "$FILE" 1 "$THREADS" | grep '^RESULT c')
	c=$(echo "$line" | awk '{ print $3 }'); cc=$(echo "$line" | awk '{ print $5 }')
	line=$(MSINV_LIBMS=$BUILD/libms.so.0 "$PY" "$W/load.py" "$FILE" "$W/inspect.json" "$THREADS" | grep '^RESULT python')
	p=$(echo "$line" | awk '{ print $3 }'); bytes=$(echo "$line" | awk '{ print $4 }')
	pc=$(echo "$line" | awk '{ print $5 }')
	echo "round $((r + 1)): C $c s ($cc CPU s), python $p s ($pc CPU s)"
	if less "$c" "$best_c"; then best_c=$c; fi
	if less "$p" "$best_py"; then best_py=$p; fi
	if less "$cc" "$cpu_c"; then cpu_c=$cc; fi
	if less "$pc" "$cpu_py"; then cpu_py=$pc; fi
	r=$((r + 1))
done
ratio=$(echo "scale=3; $best_py / $best_c" | bc -l)
cratio=$(echo "scale=3; $cpu_py / $cpu_c" | bc -l)
gbs=$(echo "scale=2; $bytes / $best_c / 1000000000" | bc -l)
echo "verified load of $bytes bytes, $THREADS threads (0: one per CPU), $(nproc) CPUs:"
echo "  wall: C $best_c s ($gbs GB/s), python $best_py s: ratio python/C $ratio (target <= 1.05)"
echo "  CPU:  C $cpu_c s, python $cpu_py s: ratio python/C $cratio"
if [ "${MS_BENCH_STRICT:-0}" = 1 ] && [ "$(echo "$ratio > 1.05" | bc -l)" = 1 ]; then
	exit 1
fi
