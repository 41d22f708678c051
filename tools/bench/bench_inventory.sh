#!/bin/sh
# bench_inventory.sh: what the database costs.
#   1. `msinv add` of a generated checkpoint against `msinv inspect
#      --digests` of the same files (target: add >= 0.9x the speed);
#   2. re-add of the unchanged files against that add (target < 1%);
#   3. `ls` and `show --tensors` on an inventory holding >= 100,000 tensors
#      (target: well under a second).
# MS_BENCH_GB (default 4) sizes the checkpoint; it is written under $TMPDIR
# and removed at the end. The page cache is warmed first so that both tools
# hash from memory; each step takes the best of MS_BENCH_RUNS (default 3).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD;; esac
GB=${MS_BENCH_GB:-4}
W=$(mktemp -d "${TMPDIR:-/tmp}/ms-bench-inv.XXXXXX")
trap 'rm -rf "$W"' EXIT

. "$ROOT/tools/bench/lib.sh"

python3 "$ROOT/tools/scripts/gen_ckpt.py" "$W/ckpt" --gb "$GB" >/dev/null
cat "$W"/ckpt/*.safetensors >/dev/null
bytes=$(cat "$W"/ckpt/*.safetensors | wc -c)

t_inspect=$(best "$BUILD/msinv" inspect --digests "$W/ckpt")
add_fresh() { rm -f "$W"/inv.db*; "$BUILD/msinv" init --db "$W/inv.db" >/dev/null &&
	"$BUILD/msinv" add --db "$W/inv.db" "$W/ckpt"; }
t_add=$(best add_fresh)
t_readd=$(best "$BUILD/msinv" add --db "$W/inv.db" "$W/ckpt")

# 100,000+ tensors: 50 small states of 2,048 tensors each
python3 - "$W/many" <<'PY'
import json, os, struct, sys
root = sys.argv[1]
for s in range(50):
    d = os.path.join(root, "s%02d" % s)
    os.makedirs(d)
    header, data = {}, bytearray()
    for i in range(2048):
        blob = struct.pack("<I", s * 4096 + i) * 4
        header["model.layers.%d.mlp.experts.%d.up_proj.weight" % (i // 64, i % 64)] = {
            "dtype": "F32", "shape": [4], "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
PY
"$BUILD/msinv" init --db "$W/many.db" >/dev/null
for d in "$W"/many/s*; do "$BUILD/msinv" add --db "$W/many.db" "$d" >/dev/null; done
ntensors=$(sqlite3 "$W/many.db" 'SELECT count(*) FROM tensors')
last=$("$BUILD/msinv" ls --db "$W/many.db" | tail -n 1 | cut -f 1)
t_ls=$(best "$BUILD/msinv" ls --db "$W/many.db")
t_show=$(best "$BUILD/msinv" show --db "$W/many.db" --tensors "$last")

gbs() { echo "scale=2; $bytes / $1 / 1000000000" | bc -l; }
printf 'checkpoint: %s bytes; inventory of %s tensors\n' "$bytes" "$ntensors"
printf '%-34s %8.3f s  %6s GB/s\n' "msinv inspect --digests" "$t_inspect" "$(gbs "$t_inspect")"
printf '%-34s %8.3f s  %6s GB/s\n' "msinv add (fresh inventory)" "$t_add" "$(gbs "$t_add")"
printf '%-34s %8.3f s\n' "msinv add again (unchanged)" "$t_readd"
printf '%-34s %8.3f s\n' "msinv ls ($ntensors tensors)" "$t_ls"
printf '%-34s %8.3f s\n' "msinv show --tensors (2048)" "$t_show"
printf 'ratio add / inspect speed: %.2f (target >= 0.9)\n' "$(echo "$t_inspect / $t_add" | bc -l)"
printf 'ratio re-add / add time: %.4f (target < 0.01)\n' "$(echo "$t_readd / $t_add" | bc -l)"
