#!/bin/sh
# The test runner: every unit binary, every CLI case, every fuzz corpus
# replay and every script test, each a line "<name>: N passed, N failed";
# the last line is the total. Exit 1 when anything failed.
#   sh tests/run.sh        all CPU tiers
#   sh tests/run.sh gpu    the GPU tier (unit tests whose name has "gpu",
#                          the script tests tests/script/*_gpu.sh,
#                          the Python package's CUDA and PEFT tests)
# BUILD names the build directory (default build).
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 3
export MS_FIXTURES="$ROOT/tests/fixtures" MS_BUILD="$ROOT/$BUILD" MS_ROOT="$ROOT"
TMPDIR=${TMPDIR:-/tmp}; export TMPDIR
pass=0; fail=0; failed=""
tier=${1:-cpu}

count() { # name, output file
	line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$2" | tail -n 1)
	p=$(echo "$line" | sed -n 's/.* \([0-9][0-9]*\) passed.*/\1/p')
	f=$(echo "$line" | sed -n 's/.* \([0-9][0-9]*\) failed.*/\1/p')
	[ -n "$p" ] || p=0
	[ -n "$f" ] || f=1
	pass=$((pass + p)); fail=$((fail + f))
	[ "$f" -eq 0 ] || failed="$failed $1"
}

run() { # name, command...
	name=$1; shift
	out=$(mktemp)
	"$@" >"$out" 2>&1
	rc=$?
	if [ $rc -ne 0 ] && ! grep -qE '[0-9]+ passed, [1-9][0-9]* failed' "$out"; then
		# crashed or exited non-zero without saying which case: count it
		echo "$name: exited $rc" >>"$out"
		echo "$name: 0 passed, 1 failed" >>"$out"
	fi
	if [ -n "$VERBOSE" ] || ! grep -qE ' 0 failed$' "$out"; then cat "$out"; else grep -E 'passed, [0-9]+ failed' "$out" | tail -n 1; fi
	count "$name" "$out"
	rm -f "$out"
}

if [ "$tier" = gpu ]; then
	for t in "$BUILD"/tests/t_*gpu*; do [ -x "$t" ] && run "$(basename "$t")" "$t"; done
	# the script tests that need the device (mstrain --device cuda with PEFT)
	for s in tests/script/*_gpu.sh; do
		[ -f "$s" ] && run "$(basename "$s" .sh)" sh "$s"
	done
	# the Python package's device load (DLPack into torch) and PEFT helper
	run python_gpu sh tests/script/python.sh gpu
else
	for t in "$BUILD"/tests/t_*; do
		case "$t" in *gpu*) continue;; esac
		[ -x "$t" ] && run "$(basename "$t")" "$t"
	done
	for t in "$BUILD"/tests/replay_*; do
		[ -x "$t" ] || continue
		n=$(basename "$t"); c=tests/fuzz/corpus/${n#replay_fz_}
		run "$n" "$t" "$c"
	done
	[ -f tests/cli/run.sh ] && run cli sh tests/cli/run.sh
	for s in tests/script/*.sh; do
		# lib.sh is what the tests share, not a test; *_gpu.sh are the
		# GPU tier's
		case "$s" in tests/script/lib.sh|*_gpu.sh) continue;; esac
		[ -f "$s" ] && run "$(basename "$s" .sh)" sh "$s"
	done
fi
echo
[ -n "$failed" ] && echo "failing:$failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
