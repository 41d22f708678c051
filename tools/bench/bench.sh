#!/bin/sh
# make bench: every CPU benchmark, each a ratio against a reference run in
# the same script (machines are noisy; absolute times are not targets).
# MS_BENCH_GB sets the size of generated checkpoints (default 4).
# Scratch data goes to $TMPDIR (default /tmp): it needs about 3x that size.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 3
export MS_BUILD="$ROOT/${BUILD:-build}" MS_ROOT="$ROOT" MS_FIXTURES="$ROOT/tests/fixtures"
status=0
for b in hash inventory nvfp4 shard verify sign python; do
	s=tools/bench/bench_$b.sh
	[ -f "$s" ] || continue
	echo "== $b"
	sh "$s" || status=1
	echo
done
exit $status
