#!/bin/sh
# tools/kemu (the kernels' CPU emulator, make check-kernels-emu): the cheap
# half that make test can afford. The transforms of kernels/ggemm.cu,
# flash.cu and router.cu leave no device code a host compiler
# cannot take (asm, <<<>>>, __shared__), have one kemu_launch per launch
# and compile against the runtime's shim (the first two with mma.h's
# wrappers inlined; router.cu, CUDA cores only, includes no mma.h); bad
# arguments and a mutation that does not apply are refused before anything
# is built, never reported CAUGHT. (The emulated runs themselves take
# minutes.)
. "$(dirname "$0")/lib.sh"
T=$ROOT/tools/kemu/kemu_transform.py
R=$ROOT/tools/kemu/run.sh

for k in ggemm flash router; do
	expect 0 python3 "$T" "$ROOT/kernels/$k.cu" "$ROOT/kernels/mma.h" "$W/$k.cpp"
	hasnt 'asm volatile' "$W/$k.cpp" "$k: inline asm left"
	hasnt '<<<' "$W/$k.cpp" "$k: launch left"
	hasnt '__shared__' "$W/$k.cpp" "$k: __shared__ left"
	launches=$(grep -c '<<<' "$ROOT/kernels/$k.cu")
	rewritten=$(grep -c 'kemu_launch(' "$W/$k.cpp")
	[ "$launches" -gt 0 ] && [ "$launches" -eq "$rewritten" ] && ok ||
		bad "$k: $launches launches, $rewritten rewritten"
	case $k in ggemm | flash)
		for call in kemu_mma kemu_ldmatrix kemu_cp_async kemu_cp_commit kemu_cp_wait; do
			has "$call(" "$W/$k.cpp" "$k: mma.h wrapper"
		done
		;;
	esac
	if command -v "${CXX:-g++}" >/dev/null; then
		expect 0 "${CXX:-g++}" -std=c++17 -fsyntax-only -Wno-unknown-pragmas \
			-I"$ROOT/tools/kemu" -I"$ROOT/src" -I"$ROOT/kernels" "$W/$k.cpp"
	else
		bad "no C++ compiler for the transformed kernel"
	fi
done

# bad arguments: one line, exit 2
expect 2 python3 "$T" "$ROOT/kernels/ggemm.cu"
one_line "transform usage"

# run.sh: usage is exit 2; a mutation whose OLD is not in the kernel is
# exit 3 (no verdict), decided before anything is built
expect 2 env BUILD="$W/b" sh "$R" --mutate only-old
expect 2 env BUILD="$W/b" sh "$R" --bogus
expect 2 env BUILD="$W/b" sh "$R" --kernel nosuch
for k in ggemm flash; do
	expect 3 env BUILD="$W/b" sh "$R" --kernel $k --mutate 'no such text in the kernel' x
	one_line "$k: mutation that does not apply"
	hasnt CAUGHT "$W/out" "$k: mutation that does not apply"
done
[ ! -e "$W/b/kemu/kemu_runtime.o" ] && ok || bad "built before the mutation was checked"

echo "$t_name: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
