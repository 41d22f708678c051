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
# ratio over 1.05 exit 1. Last, the same steps as msinv.load_file taken
# one by one in one process: the time the binding spends outside the
# library's load call (opening and describing the set, the numpy buffers,
# the dtype views), the part of the ratio a busy machine cannot blur.
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
cat >"$W/parts.py" <<'PYEOF'
import ctypes, json, sys, time
import numpy as np
import msinv
from msinv import _core
from msinv._lib import Err, lib
path, digests, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = {t["name"]: t["sha256"] for t in json.load(open(digests))["tensors"]}
best = None
for _ in range(3):
    t0 = time.perf_counter()
    names = (ctypes.c_char_p * len(d))(*[k.encode() for k in d])
    raw = b"".join(bytes.fromhex(v) for v in d.values())
    s = _core._Set(lib.ms_py_set_from_file, path.encode(), len(d), names, raw)
    bufs = [np.empty(t[3], dtype=np.uint8) for t in s.tensors]
    ptrs = (ctypes.c_void_p * len(bufs))(*[b.ctypes.data for b in bufs])
    t1 = time.perf_counter()
    err = Err()
    if lib.ms_py_set_load(s._h, ptrs, threads, ctypes.byref(err)):
        sys.exit(err.msg.decode())
    t2 = time.perf_counter()
    out = {t[0]: _core._np_view(b, t[1], t[2]) for t, b in zip(s.tensors, bufs)}
    s.close()
    t3 = time.perf_counter()
    outside, call = (t1 - t0) + (t3 - t2), t2 - t1
    if best is None or outside < best[0]:
        best = (outside, call)
    del out, bufs
print("RESULT parts %.6f %.6f %d" % (best[0], best[1], len(d)))
PYEOF
parts=$(MSINV_LIBMS=$BUILD/libms.so.0 "$PY" "$W/parts.py" "$FILE" "$W/inspect.json" "$THREADS" | grep '^RESULT parts')
outside=$(echo "$parts" | awk '{ print $3 }'); call=$(echo "$parts" | awk '{ print $4 }')
ntensors=$(echo "$parts" | awk '{ print $5 }')
ratio=$(echo "scale=3; $best_py / $best_c" | bc -l)
cratio=$(echo "scale=3; $cpu_py / $cpu_c" | bc -l)
gbs=$(echo "scale=2; $bytes / $best_c / 1000000000" | bc -l)
echo "verified load of $bytes bytes, $THREADS threads (0: one per CPU), $(nproc) CPUs:"
echo "  wall: C $best_c s ($gbs GB/s), python $best_py s: ratio python/C $ratio (target <= 1.05)"
echo "  CPU:  C $cpu_c s, python $cpu_py s: ratio python/C $cratio"
pct=$(echo "scale=3; 100 * $outside / $call" | bc -l)
echo "  binding work outside the library call: $outside s beside a $call s call ($pct%, $ntensors tensors)"
if [ "${MS_BENCH_STRICT:-0}" = 1 ] && [ "$(echo "$ratio > 1.05" | bc -l)" = 1 ]; then
	exit 1
fi
