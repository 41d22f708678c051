#!/bin/sh
# tools/fetch_headers.sh, the build's fetch of the header-only libraries
# the kernels build against (CUTLASS for kernels/xgemm.cu, the cuDNN
# frontend for kernels/sdpa.cpp): whatever goes wrong (no Python to
# download with, a wheel whose SHA-256 is not the pinned one), it says so
# in one line naming what the build does without it, leaves no directory
# behind and exits 0; headers already there are used as they are, without
# a download; a package it does not know is a usage error. (The download
# itself is what every build with the network does.)
. "$(dirname "$0")/lib.sh"
F=$ROOT/tools/fetch_headers.sh

mkdir -p "$W/bin"
for spec in "cutlass nvidia_cutlass-4.2.0.0-py3-none-any.whl cutlass/cutlass.h CUTLASS" \
	"cudnn-frontend nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl cudnn_frontend.h flash"; do
	set -- $spec
	pkg=$1 whl=$2 check=$3 word=$4

	# no Python: one line, exit 0, nothing left
	expect 0 env PYTHON="$W/none" sh "$F" "$pkg" "$W/$pkg-1"
	one_line "$pkg: no python"
	has "$word" "$W/err" "$pkg: no python: the consequence named"
	if [ ! -e "$W/$pkg-1" ] && [ ! -e "$W/$pkg-1.tmp" ]; then ok; else
		bad "$pkg: no python: a directory left behind"
	fi

	# a download that is not the pinned wheel: refused by its SHA-256
	cat >"$W/bin/py" <<PY
#!/bin/sh
# pip download stand-in: writes a wheel of the right name and wrong bytes
while [ \$# -gt 0 ]; do [ "\$1" = -d ] && d=\$2; shift; done
echo tampered >"\$d/$whl"
PY
	chmod +x "$W/bin/py"
	expect 0 env PYTHON="$W/bin/py" sh "$F" "$pkg" "$W/$pkg-2"
	one_line "$pkg: tampered wheel"
	has 'not the pinned' "$W/err" "$pkg: tampered wheel: the SHA-256 named"
	if [ ! -e "$W/$pkg-2" ] && [ ! -e "$W/$pkg-2.tmp" ]; then ok; else
		bad "$pkg: tampered wheel: a directory left behind"
	fi

	# headers already there: used, nothing downloaded, nothing said
	mkdir -p "$(dirname "$W/$pkg-3/include/$check")" && : >"$W/$pkg-3/include/$check"
	expect 0 env PYTHON="$W/none" sh "$F" "$pkg" "$W/$pkg-3"
	if [ ! -s "$W/err" ] && [ -f "$W/$pkg-3/include/$check" ]; then ok; else
		bad "$pkg: headers present: it printed or changed them"
	fi
done

# a package it does not fetch: exit 2, one line naming the choices
expect 2 sh "$F" cub "$W/c4"
one_line "unknown package"
has 'not cutlass or cudnn-frontend' "$W/err" "unknown package: the choices named"

echo "$t_name: $pass passed, $fail failed"
