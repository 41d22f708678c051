#!/bin/sh
# bench_shard.sh: msshard reshard against cp -r of the same bytes.
#
#   MS_BENCH_GB=1 sh tools/bench/bench_shard.sh      (BUILD=dir for the tools)
#
# Generates a LoRA adapter of about MS_BENCH_GB gigabytes (default 4) with
# fused expert LoRA (PEFT target_parameters: 128 experts, r=16, hidden 2048,
# expert intermediate 768, float32) under $TMPDIR, splits it for EP=8 (not
# timed) and reads it once so that the page cache holds it, then times,
# MS_BENCH_RUNS times each (default 2; the best counts):
#   msshard reshard EP=8 -> EP=16   checks every input byte against the
#                                   manifest's digests, regroups the fused
#                                   B columns, writes and fsyncs 16 shards
#                                   with their digests and a manifest in a
#                                   staging directory, renames it into place
#   cp -r of the EP=8 set + sync    the same bytes copied, and on disk
#                                   (msshard's outputs are on disk when it
#                                   returns)
# and prints both throughputs, their ratio (target: reshard >= 0.8x cp) and
# the CPU seconds (user + system) each spent (cp's leave out the kernel's
# writeback threads, which write its bytes to disk; an fsync makes
# msshard's own threads do that work).
#
# What bounds the ratio: cp copies inside the kernel and the disk writes
# back meanwhile; reshard must SHA-256 every byte twice (the input for its
# check, the output for the new shards' digests) besides copying it, so on
# a machine with few CPUs the hashing alone takes about as long as cp. The
# line "SHA-256 floor" gives that time: 2 x the bytes at the SHA-256 rate
# of one CPU (measured here through Python's hashlib, which is OpenSSL's,
# as msshard's) on all CPUs, and the ratio no implementation that hashes
# every byte twice can beat on this machine.
#
# On a machine shared with other work, MS_BENCH_NICE=-10 (as root) runs the
# timed commands at that priority; the CPU seconds are the cost whatever
# the load. Scratch space: about 3 x MS_BENCH_GB under $TMPDIR (checked).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD;; esac
GB=${MS_BENCH_GB:-4}
RUNS=${MS_BENCH_RUNS:-2}
M="$BUILD/msshard"
TMPDIR=${TMPDIR:-/tmp}
[ -x "$M" ] || { echo "bench_shard: $M not built (make BUILD=$BUILD all)" >&2; exit 3; }
command -v python3 >/dev/null || { echo "bench_shard: python3 needed to generate the adapter" >&2; exit 3; }
need_kb=$(awk -v g="$GB" 'BEGIN { printf "%d", 3 * g * 1e9 / 1024 + 65536 }')
avail_kb=$(df -Pk "$TMPDIR" | awk 'NR == 2 { print $4 }')
if [ "$avail_kb" -lt "$need_kb" ]; then
	echo "bench_shard: $TMPDIR has $((avail_kb / 1024)) MiB free, need $((need_kb / 1024)); lower MS_BENCH_GB" >&2
	exit 3
fi
tmp=$(mktemp -d "$TMPDIR/msbench.XXXXXX") || exit 3
ag_old=""
cleanup() {
	if [ -n "$ag_old" ]; then echo "$ag_old" >/proc/$$/autogroup 2>/dev/null || true; fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 3' INT TERM

python3 - "$tmp/adapter" "$GB" <<'EOF' || exit 3
import json, os, struct, sys

out, gb = sys.argv[1], float(sys.argv[2])
E, R, H, I = 128, 16, 2048, 768
per_layer = E * R * (2 * H + 3 * I) * 4 + 4 * R * H * 4
layers = max(1, round(gb * 1e9 / per_layer))
tensors = []
for l in range(layers):
    p = "base_model.model.model.layers.%d." % l
    tensors += [
        (p + "mlp.experts.base_layer.lora_A.weight", [E * R, H]),
        (p + "mlp.experts.base_layer.lora_B.weight", [2 * I, R * E]),
        (p + "mlp.experts.lora_A.weight", [E * R, I]),
        (p + "mlp.experts.lora_B.weight", [H, R * E]),
        (p + "self_attn.q_proj.lora_A.weight", [R, H]),
        (p + "self_attn.q_proj.lora_B.weight", [H, R]),
    ]
header, off = {"__metadata__": {"format": "pt"}}, 0
for name, shape in tensors:
    n = shape[0] * shape[1] * 4
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
    off += n
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
os.makedirs(out)
# Bytes that differ everywhere (so no layer can be deduplicated), made
# fast: a random block with a running counter stamped into every 4 KiB.
block = bytearray(os.urandom(1 << 24))
with open(os.path.join(out, "adapter_model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    left, k = off, 0
    while left:
        for i in range(0, len(block), 4096):
            block[i:i + 8] = struct.pack("<Q", k)
            k += 1
        n = min(left, len(block))
        f.write(block[:n])
        left -= n
cfg = {"peft_type": "LORA", "r": R, "lora_alpha": 2 * R, "rank_pattern": {},
       "target_modules": ["q_proj"],
       "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}
with open(os.path.join(out, "adapter_config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
print("bench_shard: adapter of %.2f GB (%d layers, %d experts, r=%d)" % (off / 1e9, layers, E, R))
EOF

"$M" split "$tmp/adapter" -o "$tmp/ep8" --ep-size 8 >/dev/null || exit 3
rm -rf "$tmp/adapter"
bytes=0
for f in "$tmp/ep8"/*; do bytes=$((bytes + $(wc -c <"$f"))); done
# both commands read from the page cache: the comparison is of the work
# each does with the bytes, and of the writing to disk
cat "$tmp/ep8"/* >/dev/null
sync

# MS_BENCH_NICE=-10 (root only): see above. With autogroup scheduling a
# nice value only counts inside its session, so the session's autogroup
# gets it too (and its old value back at exit).
NICE=""
if [ -n "${MS_BENCH_NICE:-}" ]; then
	NICE="nice -n $MS_BENCH_NICE"
	if [ -w /proc/$$/autogroup ]; then
		ag_old=$(sed -n 's/.* nice //p' /proc/$$/autogroup)
		echo "$MS_BENCH_NICE" >/proc/$$/autogroup 2>/dev/null || ag_old=""
	fi
fi

# timed CMD...: "<wall s> <cpu s>" of one run (cpu: user + system, when
# /usr/bin/time exists; else 0)
timed() {
	if [ -x /usr/bin/time ]; then
		$NICE /usr/bin/time -f "%e %U %S" -o "$tmp/time" "$@" >/dev/null || exit 3
		awk '{ printf "%.3f %.3f", $1, $2 + $3 }' "$tmp/time"
	else
		s=$(date +%s.%N)
		$NICE "$@" >/dev/null || exit 3
		e=$(date +%s.%N)
		echo "$s $e" | awk '{ printf "%.3f 0", $2 - $1 }'
	fi
}
faster() { echo "$1 $2" | awk '{ print ($1 < $2) }'; }

best_r=""; best_c=""; cpu_r=0; cpu_c=0
load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
i=0
while [ "$i" -lt "$RUNS" ]; do
	i=$((i + 1))
	rm -rf "$tmp/cp" "$tmp/ep16"; sync
	# shellcheck disable=SC2046
	set -- $(timed sh -c 'cp -r "$1" "$2" && sync' sh "$tmp/ep8" "$tmp/cp")
	if [ -z "$best_c" ] || [ "$(faster "$1" "$best_c")" = 1 ]; then best_c=$1; cpu_c=$2; fi
	rm -rf "$tmp/cp"; sync
	# shellcheck disable=SC2046
	set -- $(timed "$M" reshard "$tmp/ep8" -o "$tmp/ep16" --ep-size 16)
	if [ -z "$best_r" ] || [ "$(faster "$1" "$best_r")" = 1 ]; then best_r=$1; cpu_r=$2; fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
# SHA-256 on one CPU, as msshard's (OpenSSL through hashlib)
sha=$(python3 -c '
import hashlib, time
b = bytes(range(256)) * (1 << 18)
best = 1e9
for _ in range(3):
    t = time.perf_counter(); hashlib.sha256(b).digest(); best = min(best, time.perf_counter() - t)
print("%.0f" % (len(b) / best))')
ncpu=$(getconf _NPROCESSORS_ONLN)
floor=$(echo "$bytes $sha $ncpu" | awk '{ printf "%.3f", 2 * $1 / ($2 * $3) }')

printf 'bench_shard: %s bytes, best of %s runs, %s CPUs, load average %s before, %s after%s\n' \
	"$bytes" "$RUNS" "$ncpu" "$load" "$load_after" "${NICE:+; timed at nice $MS_BENCH_NICE}"
line() { # label, wall s, cpu s
	awk -v l="$1" -v t="$2" -v c="$3" -v b="$bytes" 'BEGIN {
		printf "bench_shard: %-26s %6.2f s  %8.1f MB/s   cpu %6.2f s\n", l, t, b / t / 1e6, c }'
}
line "cp -r + sync" "$best_c" "$cpu_c"
line "reshard 8 -> 16" "$best_r" "$cpu_r"
echo "$bytes $sha $ncpu $floor $best_c" | awk '{
	printf "bench_shard: SHA-256 floor: 2 x %.2f GB at %.0f MB/s per CPU on %d CPUs = %.2f s (at best %.2fx cp)\n",
		$1 / 1e9, $2 / 1e6, $3, $4, $5 / $4 }'
ratio=$(echo "$best_c $best_r" | awk '{ printf "%.2f", $1 / $2 }')
printf 'bench_shard: reshard throughput / cp throughput = %sx (target >= 0.8x)\n' "$ratio"
