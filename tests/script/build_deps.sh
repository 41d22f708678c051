#!/bin/sh
# A plain `make` on a machine without the -dev packages names the packages
# to install (and the apt-get line) before compiling anything, instead of
# failing on a missing header. A missing library is simulated with
# PKG_CONFIG_LIBDIR pointing at a copy of the .pc files that lacks it, a
# missing pkg-config with a PATH that does not have it.
ROOT=${MS_ROOT:-$(pwd)}
. "$(dirname "$0")/lib.sh"


MAKE=$(command -v make)
# each make below stands for a user's plain `make`: under `make -j2 test`
# the parent's jobserver is not passed down to this script, and a make that
# inherits its MAKEFLAGS warns that it is unavailable
unset MAKEFLAGS MFLAGS MAKELEVEL
if [ -z "$MAKE" ] || ! command -v pkg-config >/dev/null 2>&1 ||
   ! pkg-config --exists sqlite3 libcrypto libcjson libarchive libzstd; then
	echo "build_deps: skipped (needs make, pkg-config and the libraries)"
	echo "build_deps: 0 passed, 0 failed"
	exit 0
fi

mkdir -p "$W/pc" "$W/bin"
for p in sqlite3 libcrypto libarchive libzstd; do cp "$(pkg-config --path $p)" "$W/pc/"; done

# libcjson missing: the check names libcjson-dev and the apt-get line, and
# compiles nothing
PKG_CONFIG_LIBDIR="$W/pc" "$MAKE" -C "$ROOT" --no-print-directory BUILD="$W/b1" \
	>"$W/out" 2>"$W/err"
rc=$?
if [ $rc -ne 0 ] && grep -q 'sudo apt-get install libcjson-dev$' "$W/err" &&
   grep -q "make deps" "$W/err" && ! grep -q 'cjson.h' "$W/err" &&
   [ -z "$(find "$W/b1" -name '*.o' 2>/dev/null)" ]; then ok; else
	bad "missing libcjson: exit $rc, expected a failure naming libcjson-dev before compiling"
	sed 's/^/  /' "$W/err" | head -n 8
fi

# two missing: both named, sorted, once
rm "$W/pc/libzstd.pc"
PKG_CONFIG_LIBDIR="$W/pc" "$MAKE" -C "$ROOT" --no-print-directory BUILD="$W/b2" all \
	>"$W/out" 2>"$W/err"
rc=$?
if [ $rc -ne 0 ] && grep -q 'sudo apt-get install libcjson-dev libzstd-dev$' "$W/err"; then ok; else
	bad "missing libcjson and libzstd: exit $rc"; sed 's/^/  /' "$W/err" | head -n 8
fi

# no pkg-config at all: it is named with every library package
ln -s "$(command -v sh)" "$W/bin/sh"
PATH="$W/bin" "$MAKE" -C "$ROOT" --no-print-directory BUILD="$W/b3" pkgcheck \
	>"$W/out" 2>"$W/err"
rc=$?
if [ $rc -ne 0 ] && grep -q 'sudo apt-get install libarchive-dev libcjson-dev libsqlite3-dev libssl-dev libzstd-dev pkg-config$' "$W/err"; then ok; else
	bad "no pkg-config: exit $rc"; sed 's/^/  /' "$W/err" | head -n 8
fi

# everything present: the check is silent and succeeds
if "$MAKE" -C "$ROOT" --no-print-directory BUILD="$W/b4" pkgcheck >"$W/out" 2>"$W/err" &&
   [ ! -s "$W/err" ] && [ ! -s "$W/out" ]; then ok; else
	bad "all libraries present: the check failed or printed"; sed 's/^/  /' "$W/err" | head -n 8
fi

# hash.c is a leaf: hash.h needs common.h alone (the safetensors digests
# live beside the safetensors code), so hashing builds without file formats
CC=${CC:-cc}
if command -v "$CC" >/dev/null 2>&1; then
	deps=$(printf '#include "hash.h"\n' | "$CC" -MM -I"$ROOT/src" -x c - 2>"$W/err" |
	       tr ' \\' '\n\n' | sed -n 's|.*/src/||p' | sort | tr '\n' ' ')
	if [ "$deps" = "common.h hash.h " ]; then ok; else
		bad "hash.h includes more than common.h: $deps"; sed 's/^/  /' "$W/err" | head -n 4
	fi
fi

echo "build_deps: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
