#!/bin/sh
# fault_injection.sh: fail the Nth allocation, read, write (half a chunk,
# then ENOSPC), fsync or rename of a writing command, for every N until the
# run no longer reaches an Nth call, and check that each trial ends with one
# clear error, no leak, no partial output and a sound inventory
# (tests/rel/rel_fault.py says exactly what is checked).
#
# make test: the whole sweep of `msinv add` on the smallest fixture, of
# `msconvert quantize` to one file (write, fsync, rename), of `msinv import`
# (read, write, fsync, rename), of `msinv launch` (read) and of `mstrain
# train` (two steps and a checkpoint: read, write, fsync, rename), with every
# 64th allocation of the last four failed (every 128th for mstrain, whose
# model build allocates thousands of times), in the fault-injection build (made
# here with `make fault` unless MS_BUILD is one), a sample of the allocation
# trials under valgrind.
# MS_RELIABILITY_FULL=1: every writing command, every kind, allocation
# failures one-shot and persistent, in a fault build with AddressSanitizer
# (detect_leaks=1) made here in build-fault-asan.
name=fault_injection
ROOT=${MS_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$ROOT" || exit 3
B=${MS_BUILD:-$ROOT/build}

skip() {
	echo "$name: skipped: $1"
	echo "$name: 0 passed, 0 failed"
	exit 0
}
broken() {
	echo "$name: $1"
	echo "$name: 0 passed, 1 failed"
	exit 1
}

command -v python3 >/dev/null 2>&1 || skip "python3 not found"
command -v nm >/dev/null 2>&1 || skip "nm not found (binutils)"

# a sub-make must not inherit the jobserver of a `make test` above us
submake() {
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory \
		-j"$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)" "$@"
}

# The fault build is the one whose library has the fault counters.
is_fault_build() {
	nm "$1/msinv" 2>/dev/null | grep -q ' fault_counters$'
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if [ "$MS_RELIABILITY_FULL" = 1 ]; then
	FB=$ROOT/build-fault-asan
	# without nvcc: the CUDA runtime and AddressSanitizer's shadow memory
	# do not mix, and no kernel runs on these paths
	submake BUILD=build-fault-asan NVCC= OPT=-O1 \
		EXTRA_CFLAGS="-DMS_FAULT_INJECTION -fsanitize=address -fno-omit-frame-pointer" \
		EXTRA_LDLIBS=-fsanitize=address all >"$log" 2>&1 ||
		{ tail -n 20 "$log"; broken "building the AddressSanitizer fault tree failed"; }
	is_fault_build "$FB" || broken "$FB is not a fault-injection build"
	exec python3 tests/rel/rel_fault.py --name "$name" --build "$FB" --persist \
		--jobs "$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)" \
		--scenario add-small --scenario add-sharded --scenario add-adapter \
		--scenario quantize-file --scenario quantize-dir \
		--scenario quantize-fused --scenario quantize-fused3d \
		--scenario split --scenario reshard --scenario import --scenario launch \
		--scenario train
fi

if is_fault_build "$B"; then
	FB=$B
else
	submake fault >"$log" 2>&1 || { tail -n 20 "$log"; broken "make fault failed"; }
	FB=$ROOT/build-fault
	is_fault_build "$FB" || broken "make fault did not make a fault-injection build"
fi
exec python3 tests/rel/rel_fault.py --name "$name" --build "$FB" --valgrind-every 16 \
	--scenario add-small --scenario quantize-file:alloc/64,write,fsync,rename \
	--scenario quantize-fused3d:alloc/32,write --scenario quantize-fused:alloc/256,rename \
	--scenario import:alloc/64,read,write,fsync,rename --scenario launch:alloc/64,read \
	--scenario train:alloc/128,read,write,fsync,rename
