#!/bin/sh
# bench_verify.sh: `msverify files` throughput against `openssl dgst
# -sha256` over the same checkpoint (target >= 1.8x on 2 cores: msverify
# hashes the tensors of every file in parallel, openssl one file at a time
# on one core). MS_BENCH_GB (default 4) sizes the generated checkpoint
# under $TMPDIR; the page cache is warmed first; best of MS_BENCH_RUNS.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD;; esac
GB=${MS_BENCH_GB:-4}
W=$(mktemp -d "${TMPDIR:-/tmp}/ms-bench-verify.XXXXXX")
trap 'rm -rf "$W"' EXIT

. "$ROOT/tools/bench/lib.sh"

python3 "$ROOT/tools/scripts/gen_ckpt.py" "$W/ckpt" --gb "$GB" >/dev/null
"$BUILD/msinv" init --db "$W/inv.db" >/dev/null
"$BUILD/msinv" add --db "$W/inv.db" --label bench "$W/ckpt" >/dev/null
cat "$W"/ckpt/*.safetensors >/dev/null
bytes=$(cat "$W"/ckpt/*.safetensors | wc -c)
t_ms=$(best "$BUILD/msverify" files --db "$W/inv.db" bench)
t_os=$(best sh -c "openssl dgst -sha256 '$W'/ckpt/*.safetensors")
printf 'checkpoint: %s bytes\n' "$bytes"
printf '%-28s %8.3f s  %6.2f GB/s\n' "msverify files" "$t_ms" "$(echo "$bytes / $t_ms / 1000000000" | bc -l)"
printf '%-28s %8.3f s  %6.2f GB/s\n' "openssl dgst -sha256" "$t_os" "$(echo "$bytes / $t_os / 1000000000" | bc -l)"
printf 'ratio msverify / openssl: %.2f (target >= 1.8 on 2 cores)\n' "$(echo "$t_os / $t_ms" | bc -l)"
