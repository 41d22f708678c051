#!/bin/sh
# run.sh [--kernel ggemm|flash|router] [--mutate OLD NEW]: a
# kernel test of tests/unit/ on the CPU, against its kernel in kernels/
# rewritten for the kemu emulator (README.md beside this script), under
# AddressSanitizer and UBSan. Everything is built from the tree into
# $BUILD/kemu/ (BUILD defaults to build).
#
# --kernel ggemm (the default): t_ggemm_gpu.c against ggemm.cu.
# --kernel router: t_router_gpu.c against router.cu.
# --kernel flash: t_flash_gpu.c against flash.cu, its shape list replaced
# by KEMU_SHAPES (C initialisers of struct shape {S, hd, nh, nkv, B}; a
# few small shapes by default, as the test's own list takes hours under
# emulation; KEMU_SHAPES=all keeps the test's list).
#
# Plain: builds, runs, exits 0 when every case passed and 1 otherwise; the
# last line is the test's "N passed, N failed". Exit 3: the build failed.
#
# --mutate OLD NEW: replaces the first OLD in a temporary copy of the
# kernel (the tree is never written) and runs the test against it; prints
# "CAUGHT: ..." and exits 0 when the test fails, crashes or hangs
# (KEMU_TIMEOUT seconds, default 900), "MISSED: ..." and exits 1 when it
# passes. Exit 3 when the mutant does not build or OLD is not in the
# file: a mutant that never ran proves nothing, so it is not CAUGHT.
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KEMU=$ROOT/tools/kemu
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
OUT=$BUILD/kemu
CXX=${CXX:-g++}
CC_=${CC:-cc}
# -fno-sanitize-recover: undefined behaviour stops the test, as in make check-asan
FLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
INC="-I$KEMU/include -I$KEMU -I$ROOT/src -I$ROOT/kernels -I$ROOT/tests/unit"

usage() {
	echo "usage: run.sh [--kernel ggemm|flash|router] [--mutate OLD NEW]" >&2
	exit 2
}

name=ggemm
mutate=0
while [ $# -gt 0 ]; do
	case $1 in
	--kernel)
		[ $# -ge 2 ] || usage
		case $2 in ggemm | flash | router) name=$2 ;; *) usage ;; esac
		shift 2
		;;
	--mutate)
		[ $# -ge 3 ] || usage
		mutate=1
		old=$2
		new=$3
		shift 3
		;;
	*) usage ;;
	esac
done
test_name=t_${name}_gpu

mkdir -p "$OUT" || exit 3

# the kernel: the tree's, or a mutant in a directory of its own, made
# first so a mutation that does not apply is refused before any build
if [ $mutate = 1 ]; then
	work=$(mktemp -d "$OUT/mutant.XXXXXX") || exit 3
	# the log outlives the mutant, to show how it was caught
	trap 'mv "$work/${name}_kemu.log" "$work.log" 2>/dev/null; rm -rf "$work"' EXIT
	python3 - "$ROOT/kernels/$name.cu" "$work/$name.cu" "$old" "$new" <<'PY' || exit 3
import sys
src, dst, old, new = sys.argv[1:]
with open(src) as f:
    text = f.read()
if old not in text:
    sys.stderr.write('run.sh: %r is not in kernels/%s\n' % (old, dst.split('/')[-1]))
    sys.exit(3)
with open(dst, 'w') as f:
    f.write(text.replace(old, new, 1))
PY
	kernel=$work/$name.cu
	dir=$work
else
	kernel=$ROOT/kernels/$name.cu
	dir=$OUT
fi

# the flags are a dependency of every object: changing them rebuilds
flags_stamp=$OUT/flags
[ "$(cat "$flags_stamp" 2>/dev/null)" = "$CXX $CC_ $FLAGS" ] ||
	echo "$CXX $CC_ $FLAGS" >"$flags_stamp" || exit 3

# stale OBJ DEP...: OBJ is missing or older than one of DEP
stale() {
	obj=$1
	shift
	[ -f "$obj" ] || return 0
	for dep in "$@"; do
		[ "$dep" -nt "$obj" ] && return 0
	done
	return 1
}

# compile OBJ COMPILER ARGS...: written under a temporary name, then
# renamed, so runs side by side (several mutants) never see half an object
compile() {
	obj=$1
	shift
	"$@" -o "$obj.tmp.$$" && mv "$obj.tmp.$$" "$obj"
}

headers="$KEMU/kemu_shim.h $ROOT/src/ms.h $ROOT/kernels/sdpa.h $ROOT/kernels/xgemm.h $flags_stamp"
if stale "$OUT/kemu_runtime.o" "$KEMU/kemu_runtime.cpp" $headers; then
	compile "$OUT/kemu_runtime.o" $CXX -std=c++17 $FLAGS $INC \
		-c "$KEMU/kemu_runtime.cpp" || exit 3
fi
if stale "$OUT/nvfp4.o" "$ROOT/src/nvfp4.c" "$ROOT/src/nvfp4.h" "$ROOT/src/ms.h" \
	"$flags_stamp"; then
	compile "$OUT/nvfp4.o" $CC_ -std=c11 -D_GNU_SOURCE $FLAGS -I"$ROOT/src" \
		-c "$ROOT/src/nvfp4.c" || exit 3
fi
# the test: the tree's, or for flash a copy with the shape list replaced
# (an object of its own), rewritten only when it changes so the object
# stays fresh
test_src=$ROOT/tests/unit/$test_name.c
if [ $name = flash ] && [ "${KEMU_SHAPES:-}" != all ]; then
	shapes=${KEMU_SHAPES:-"{1, 16, 4, 2, 1}, {7, 64, 4, 4, 2}, {70, 128, 4, 2, 1}, {130, 16, 4, 2, 2},
		{200, 32, 2, 1, 1},"}
	shaped=$OUT/${test_name}_shapes.c
	python3 - "$test_src" "$shaped.new.$$" "$shapes" <<'PY' || exit 3
import sys
src, dst, shapes = sys.argv[1:]
with open(src) as f:
    text = f.read()
head = 'static const struct shape sh[] = {'
if text.count(head) != 1:
    sys.stderr.write('run.sh: no single shape list (%s) in %s\n' % (head, src))
    sys.exit(3)
start = text.index(head) + len(head)
end = text.index('};', start)
with open(dst, 'w') as f:
    f.write(text[:start] + shapes + '\n\t' + text[end:])
PY
	cmp -s "$shaped.new.$$" "$shaped" && rm "$shaped.new.$$" || mv "$shaped.new.$$" "$shaped"
	test_src=$shaped
fi
test_deps="$test_src $ROOT/tests/unit/test_gpu.h $ROOT/tests/unit/test_bf16.h
	$ROOT/tests/unit/test_rng.h
	$ROOT/kernels/$name.h $KEMU/include/cuda_runtime.h $KEMU/include/cublas_v2.h
	$ROOT/src/ms.h $ROOT/kernels/sdpa.h $ROOT/kernels/xgemm.h $ROOT/src/train/model.h
	$flags_stamp"
test_obj=$OUT/$(basename "$test_src" .c).o
if stale "$test_obj" $test_deps; then
	compile "$test_obj" $CC_ -std=c11 -D_GNU_SOURCE $FLAGS -DMS_HAVE_CUDA=1 $INC \
		-c "$test_src" || exit 3
fi

python3 "$KEMU/kemu_transform.py" "$kernel" "$ROOT/kernels/mma.h" "$dir/${name}_kemu.cpp" ||
	exit 3
# -Wno-unknown-pragmas: the kernel's #pragma unroll means nothing to the host compiler
compile "$dir/${name}_kemu.o" $CXX -std=c++17 $FLAGS -Wno-unknown-pragmas $INC \
	-c "$dir/${name}_kemu.cpp" || exit 3
# nvfp4.o: the reference decoder t_ggemm_gpu checks the NVFP4 B against
compile "$dir/t_${name}_kemu" $CXX $FLAGS "$test_obj" "$OUT/kemu_runtime.o" \
	"$dir/${name}_kemu.o" "$OUT/nvfp4.o" -lpthread -lm -ldl || exit 3

bin=$dir/t_${name}_kemu
log=$dir/${name}_kemu.log
if [ $mutate = 1 ]; then
	MS_TEST_GPU=1 timeout "${KEMU_TIMEOUT:-900}" "$bin" >"$log" 2>&1
	rc=$?
	if [ $rc = 0 ] && tail -n 1 "$log" | grep -q ' 0 failed$'; then
		echo "MISSED: $old -> $new"
		exit 1
	fi
	case $rc in
	124) why="timed out" ;;
	0 | 1) why=$(tail -n 1 "$log") ;;
	*) why="exit $rc" ;;
	esac
	echo "CAUGHT: $old -> $new ($why; log $work.log)"
	exit 0
fi

# MS_TEST_GPU: a missing device is a failure, not a skip
MS_TEST_GPU=1 "$bin" >"$log" 2>&1
rc=$?
cat "$log"
summary=$(grep ' passed, [0-9]* failed$' "$log" | tail -n 1)
if [ $rc = 0 ] && [ -n "$summary" ] && echo "$summary" | grep -q ' 0 failed$'; then
	# the sanitizers may report after the summary; it still ends the output
	[ "$(tail -n 1 "$log")" = "$summary" ] || echo "$summary"
	exit 0
fi
# a crash leaves no summary line; the last line must still say it failed
[ -n "$summary" ] && [ $rc = 1 ] || summary="$test_name.c: 0 passed, 1 failed (exit $rc)"
[ "$(tail -n 1 "$log")" = "$summary" ] || echo "$summary"
exit 1
