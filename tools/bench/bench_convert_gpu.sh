#!/bin/sh
# bench_convert_gpu.sh: msconvert quantize end to end on a generated
# checkpoint (MS_BENCH_GB, default 4), --device cpu against --device cuda,
# both layouts, and where the time goes: reading the input (page cache
# warm vs cold is not controllable here, so the input is read once first),
# the conversion, and writing the output (fsync included). The outputs must
# have the same state digest. Run it on a machine with a GPU.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD;; esac
GB=${MS_BENCH_GB:-4}
W=$(mktemp -d "${TMPDIR:-/tmp}/ms-bench-conv.XXXXXX")
trap 'rm -rf "$W"' EXIT
# finite bf16 weights (random bytes would hold NaNs, which quantize refuses)
python3 "$ROOT/tests/rel/rel_gen.py" "$W/in" --mb "$(awk -v g="$GB" 'BEGIN { printf "%d", g * 1000 }')" --shard-mb 1000 >/dev/null
bytes=$(cat "$W"/in/*.safetensors | wc -c)
s=$(date +%s.%N); cat "$W"/in/*.safetensors >/dev/null; e=$(date +%s.%N)
t_read=$(awk -v a="$s" -v b="$e" 'BEGIN { print b - a }')
s=$(date +%s.%N); cp -r "$W/in" "$W/copy"; sync; e=$(date +%s.%N)
t_copy=$(awk -v a="$s" -v b="$e" 'BEGIN { print b - a }')
for d in cpu cuda; do
	s=$(date +%s.%N)
	"$BUILD/msconvert" quantize "$W/in" -o "$W/q-$d" --layout both --device $d --no-register >"$W/$d.out"
	e=$(date +%s.%N)
	eval "t_$d=$(awk -v a="$s" -v b="$e" 'BEGIN { print b - a }')"
	cut -d' ' -f2 "$W/$d.out" >"$W/$d.digest"
done
cmp -s "$W/cpu.digest" "$W/cuda.digest" && same=yes || same=NO
printf 'input: %s bytes of bf16 (%s)\n' "$bytes" "$(nproc) CPUs"
printf '%-40s %8.3f s %7.2f GB/s\n' "read the input (page cache)" "$t_read" "$(awk -v n="$bytes" -v t="$t_read" 'BEGIN { print n / t / 1e9 }')"
printf '%-40s %8.3f s %7.2f GB/s\n' "cp -r + sync (disk write ceiling)" "$t_copy" "$(awk -v n="$bytes" -v t="$t_copy" 'BEGIN { print n / t / 1e9 }')"
printf '%-40s %8.3f s %7.2f GB/s\n' "msconvert quantize --device cpu" "$t_cpu" "$(awk -v n="$bytes" -v t="$t_cpu" 'BEGIN { print n / t / 1e9 }')"
printf '%-40s %8.3f s %7.2f GB/s\n' "msconvert quantize --device cuda" "$t_cuda" "$(awk -v n="$bytes" -v t="$t_cuda" 'BEGIN { print n / t / 1e9 }')"
printf 'same state digest on both devices: %s (%s)\n' "$same" "$(cat "$W/cuda.digest")"
[ "$same" = yes ]
