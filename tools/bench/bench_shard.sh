#!/bin/sh
# bench_shard.sh: msshard reshard against cp -r of the same bytes.
#
# Generates a LoRA adapter of about MS_BENCH_GB gigabytes (default 4) with
# fused expert LoRA (PEFT target_parameters: 128 experts, r=16, hidden 2048,
# expert intermediate 768, float32) under $TMPDIR, splits it for EP=8
# (not timed), then times
#   msshard reshard EP=8 -> EP=16   (verifies every input digest, writes and
#                                    fsyncs 16 shards and a manifest)
#   cp -r of the EP=8 set           (the same bytes; then sync, since msshard's
#                                    outputs are on disk when it returns)
# and prints both throughputs and their ratio (target: reshard >= 0.8x cp).
# cp copies inside the kernel on one CPU; reshard hashes every byte twice
# (the input against the manifest, the output for its digests) on all CPUs,
# so the ratio depends on the number of idle CPUs: the line says how many.
#   MS_BENCH_GB=0.5 sh tools/bench/bench_shard.sh      a quick run
# BUILD names the build directory (default build); MS_BENCH_RUNS the number
# of timed runs of each (default 2; the best counts).
BUILD=${BUILD:-build}
GB=${MS_BENCH_GB:-4}
RUNS=${MS_BENCH_RUNS:-2}
M="$BUILD/msshard"
[ -x "$M" ] || { echo "bench_shard: $M not built (make BUILD=$BUILD all)" >&2; exit 3; }
command -v python3 >/dev/null || { echo "bench_shard: python3 needed to generate the adapter" >&2; exit 3; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/msbench.XXXXXX") || exit 3
trap 'rm -rf "$tmp"' EXIT INT TERM

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
sync

now() { date +%s.%N; }
best_reshard=""; best_cp=""
i=0
while [ "$i" -lt "$RUNS" ]; do
	i=$((i + 1))
	rm -rf "$tmp/cp" "$tmp/ep16"; sync
	t0=$(now); cp -r "$tmp/ep8" "$tmp/cp" && sync; t1=$(now)
	c=$(echo "$t1 - $t0" | bc -l)
	rm -rf "$tmp/cp"; sync
	t0=$(now); "$M" reshard "$tmp/ep8" -o "$tmp/ep16" --ep-size 16 >/dev/null || exit 3; t1=$(now)
	r=$(echo "$t1 - $t0" | bc -l)
	if [ -z "$best_cp" ] || [ "$(echo "$c < $best_cp" | bc -l)" -eq 1 ]; then best_cp=$c; fi
	if [ -z "$best_reshard" ] || [ "$(echo "$r < $best_reshard" | bc -l)" -eq 1 ]; then best_reshard=$r; fi
done
mbs() { echo "scale=1; $bytes / $1 / 1000000" | bc -l; }
printf 'bench_shard: %s bytes, best of %s runs, %s CPUs, load average %s\n' "$bytes" "$RUNS" \
	"$(getconf _NPROCESSORS_ONLN)" "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
printf 'bench_shard: cp -r + sync        %6.2f s  %8s MB/s\n' "$best_cp" "$(mbs "$best_cp")"
printf 'bench_shard: reshard 8 -> 16     %6.2f s  %8s MB/s\n' "$best_reshard" "$(mbs "$best_reshard")"
ratio=$(echo "scale=2; $best_cp / $best_reshard" | bc -l)
printf 'bench_shard: reshard throughput / cp throughput = %sx (target >= 0.8x)\n' "$ratio"
