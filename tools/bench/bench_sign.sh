#!/bin/sh
# bench_sign.sh: time `model_signing sign key` (the reference, from .venv)
# against `msverify sign` on the same model directories of random files,
# with the page cache warm so that both measure hashing and signing, not
# the disk. Two directories: a checkpoint (a few large shards) and a tree
# of many small files, where per-file overhead shows.
#   MS_BENCH_GB           size of the checkpoint in GB (default 1)
#   MS_BENCH_FILES        number of shards it is split into (default 8)
#   MS_BENCH_SMALL_FILES  number of 16 KiB files in the tree (default 20000;
#                         0 skips it)
#   MS_BENCH_REPS         runs of each tool; the best is kept (default 3)
#   BUILD                 build directory holding msverify (default build)
# Prints both times and their ratio for each; exit 0, or 3 when something
# is missing or a tool fails.
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MSV=$ROOT/$BUILD/msverify
REF=$ROOT/.venv/bin/model_signing
GB=${MS_BENCH_GB:-1}
NFILES=${MS_BENCH_FILES:-8}
NSMALL=${MS_BENCH_SMALL_FILES:-20000}
REPS=${MS_BENCH_REPS:-3}

[ -x "$MSV" ] || { echo "bench_sign: no $MSV (run make)" >&2; exit 3; }
if [ ! -x "$REF" ] || ! "$REF" --help >/dev/null 2>&1; then
	echo "bench_sign: no working model_signing in .venv (run make venv)" >&2
	exit 3
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ms-bench-sign-XXXXXX") || exit 3
trap 'rm -rf "$tmp"' EXIT
m=$tmp/model
mkdir -p "$m/sub"

# GB split over NFILES large files, plus small files as a checkpoint has.
per=$(awk -v g="$GB" -v n="$NFILES" 'BEGIN { printf "%d", g * 1e9 / n }')
i=0
while [ $i -lt "$NFILES" ]; do
	openssl rand -out "$m/model-$(printf %05d $i).safetensors" "$per" || exit 3
	i=$((i + 1))
done
for f in config.json generation_config.json tokenizer.json sub/extra.json; do
	openssl rand -out "$m/$f" 4096 || exit 3
done
openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/key.pem" 2>/dev/null || exit 3
openssl pkey -in "$tmp/key.pem" -pubout -out "$tmp/key.pub" || exit 3

now() { date +%s.%N; }

best() { # command...: best wall time of REPS runs, in seconds
	b=""
	r=0
	while [ $r -lt "$REPS" ]; do
		rm -f "$tmp/out.sig"
		t0=$(now)
		"$@" >/dev/null 2>"$tmp/err" || { echo "bench_sign: failed: $* : $(cat "$tmp/err")" >&2; exit 3; }
		t1=$(now)
		b=$(awk -v a="$t0" -v z="$t1" -v b="$b" 'BEGIN { t = z - a; if (b == "" || t < b) b = t; printf "%.3f", b }')
		r=$((r + 1))
	done
	echo "$b"
}

run() { # name dir
	d=$2
	find "$d" -type f -exec cat {} + >/dev/null
	t_ref=$(best "$REF" sign key "$d" --private_key "$tmp/key.pem" --signature "$tmp/out.sig")
	t_ms=$(best "$MSV" sign --key "$tmp/key.pem" -o "$tmp/out.sig" "$d")
	# Both must cover the same bytes: msverify verifies the reference's.
	rm -f "$tmp/ref.sig"
	"$REF" sign key "$d" --private_key "$tmp/key.pem" --signature "$tmp/ref.sig" >/dev/null 2>&1 &&
		"$MSV" verify --sig "$tmp/ref.sig" --pub "$tmp/key.pub" "$d" >/dev/null ||
		{ echo "bench_sign: msverify does not verify the reference signature" >&2; exit 3; }
	bytes=$(du -sb "$d" | cut -f1)
	files=$(find "$d" -type f | wc -l)
	awk -v name="$1" -v r="$t_ref" -v s="$t_ms" -v b="$bytes" -v n="$files" -v c="$(nproc)" 'BEGIN {
		printf "bench_sign: %s: %.2f GB in %d files, %d CPUs, best of runs\n", name, b / 1e9, n, c
		printf "bench_sign: %s: model_signing sign key  %8.3f s  %7.2f GB/s\n", name, r, b / 1e9 / r
		printf "bench_sign: %s: msverify sign           %8.3f s  %7.2f GB/s\n", name, s, b / 1e9 / s
		printf "bench_sign: %s: ratio %.2fx\n", name, r / s
	}'
}

run checkpoint "$m"
rm -rf "$m"
if [ "$NSMALL" -gt 0 ]; then
	tree=$tmp/tree
	mkdir -p "$tree/a" "$tree/b/c"
	openssl rand -out "$tmp/blob" $((NSMALL * 16384)) || exit 3
	(cd "$tree/a" && split -a 6 -b 16384 "$tmp/blob" part-) || exit 3
	rm -f "$tmp/blob"
	run small-files "$tree"
fi
