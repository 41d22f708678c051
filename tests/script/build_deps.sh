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

# hash.c is a leaf: hash.h needs common.h and the public header alone (the
# safetensors digests live beside the safetensors code), so hashing builds
# without file formats
CC=${CC:-cc}
if command -v "$CC" >/dev/null 2>&1; then
	deps=$(printf '#include "hash.h"\n' | "$CC" -MM -I"$ROOT/src" -x c - 2>"$W/err" |
	       tr ' \\' '\n\n' | sed -n 's|.*/src/||p' | sort | tr '\n' ' ')
	if [ "$deps" = "common.h hash.h ms.h " ]; then ok; else
		bad "hash.h includes more than common.h and ms.h: $deps"; sed 's/^/  /' "$W/err" | head -n 4
	fi
fi

# The wall: ms.h is the public interface and stands alone (no header of
# its own tree, no cJSON type); every tool compiles with nothing but a
# copy of it (and cli.h) on the include path, and a tool
# that reaches for an internal header does not
if command -v "$CC" >/dev/null 2>&1; then
	mkdir -p "$W/pub"
	cp "$ROOT/src/ms.h" "$ROOT/tools/cli.h" "$W/pub/"
	CJ=$(pkg-config --cflags libcjson)
	if grep -q '^#include "' "$ROOT/src/ms.h" || grep -Eq 'struct cJSON|cJSON \*' "$ROOT/src/ms.h"; then
		bad "ms.h includes a header of the tree or names a cJSON type"
	else ok; fi
	if printf '#include "ms.h"\n' | "$CC" -std=c11 -fsyntax-only -Wall -Werror -I"$W/pub" -x c - 2>"$W/err"
	then ok; else bad "ms.h does not compile alone"; sed 's/^/  /' "$W/err" | head -n 4; fi
	for t in "$ROOT"/tools/*.c; do
		# shellcheck disable=SC2086
		if "$CC" -std=c11 -D_GNU_SOURCE -fsyntax-only -I"$W/pub" $CJ "$t" 2>"$W/err"; then ok; else
			bad "$(basename "$t") does not build against ms.h alone"
			sed 's/^/  /' "$W/err" | head -n 4
		fi
	done
	# the check can fail: the same tool with an internal header added
	{ printf '#include "inventory.h"\n'; cat "$ROOT/tools/msverify.c"; } >"$W/pub/wall.c"
	# shellcheck disable=SC2086
	if "$CC" -std=c11 -D_GNU_SOURCE -fsyntax-only -I"$W/pub" $CJ "$W/pub/wall.c" 2>"$W/err"; then
		bad "a tool including inventory.h built against the public header"
	elif grep -q 'inventory.h' "$W/err"; then ok; else
		bad "a tool including inventory.h failed for another reason"; sed 's/^/  /' "$W/err" | head -n 4
	fi
	rm -f "$W/pub/wall.c"
fi

# make install ships the public header alone, and libms.pc points at it
if [ -n "${MS_BUILD:-}" ] && [ -f "$MS_BUILD/libms.a" ]; then
	if "$MAKE" -C "$ROOT" --no-print-directory BUILD="$MS_BUILD" DESTDIR="$W/inst" PREFIX=/usr \
		install >"$W/out" 2>"$W/err"; then
		hdrs=$(cd "$W/inst/usr/include/ms" && ls | tr '\n' ' ')
		pc=$(PKG_CONFIG_LIBDIR="$W/inst/usr/lib/pkgconfig" \
		     pkg-config --variable=includedir libms 2>&1)
		if [ "$hdrs" = "ms.h " ] && [ "$pc" = "/usr/include/ms" ]; then ok; else
			bad "make install: include/ms holds '$hdrs', libms.pc gives '$pc'"
		fi
	else
		bad "make install failed"; sed 's/^/  /' "$W/err" | tail -n 4
	fi
fi

# File names are unique across the tree: no two sources (.c, .cu) share a
# stem, so an object, a symbol in a profile or a stack trace names one file
dups=$(cd "$ROOT" && find src tools kernels tests -name '*.c' -o -name '*.cu' |
       sed 's|.*/||; s|\.[^.]*$||' | sort | uniq -d | tr '\n' ' ')
if [ -z "$dups" ]; then ok; else bad "source files sharing a stem: $dups"; fi

echo "build_deps: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
