#!/bin/sh
# fuzz.sh: build the fuzz targets with libFuzzer + ASan + UBSan and run one.
#
#   sh tools/scripts/fuzz.sh TARGET [SECONDS] [JOBS]
#       TARGET   safetensors, index, ... (tests/fuzz/fz_TARGET.c)
#       SECONDS  total run time (default 60)
#       JOBS     parallel fuzzing processes (default 1)
#   sh tools/scripts/fuzz.sh build         build every target, run nothing
#   sh tools/scripts/fuzz.sh minimize TARGET
#       merge the committed corpus into a minimal set (by coverage)
#
# libms is built into build-fuzz with -fsanitize=fuzzer-no-link (coverage
# without libFuzzer's main), and each target links with -fsanitize=fuzzer. New inputs go to
# build-fuzz/corpus/TARGET first; at the end they are merged into
# tests/fuzz/corpus/TARGET (only those that add coverage), so the committed
# corpus stays small. Crashes are written to build-fuzz/crashes/TARGET/;
# every one found must become a fixture (tests/fixtures/bad) and stay in
# the corpus (as tests/fuzz/corpus/TARGET/regress-<what>) as a regression
# test.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
B=build-fuzz
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

# The core parsers and what they call: built alone when the whole library
# does not build (a half-finished module elsewhere in src/ must not stop a
# fuzzing run of the parsers).
LIBSRC="src/common.c src/fsutil.c src/hash.c src/safetensors.c src/checkpoint.c"

build() {
	mkdir -p $B/fz-obj
	cflags="-std=c11 -D_GNU_SOURCE -pthread -O1 -g -Wall -Wextra -Isrc $(pkg-config --cflags libcjson)"
	libs="$(pkg-config --libs sqlite3 libcrypto libcjson libarchive libzstd) -lpthread -lm"
	if make --no-print-directory BUILD=$B CC=clang OPT=-O1 \
	     EXTRA_CFLAGS="-fsanitize=fuzzer-no-link $SAN" $B/libms.a >$B/make.log 2>&1; then
		lib=$B/libms.a
	else
		echo "fuzz: libms does not build (see $B/make.log); core parsers only" >&2
		objs=""
		for src in $LIBSRC; do
			o=$B/fz-obj/$(basename "$src" .c).o
			clang $cflags -fsanitize=fuzzer-no-link $SAN -c -o "$o" "$src"
			objs="$objs $o"
		done
		rm -f $B/fz-core.a
		ar rcs $B/fz-core.a $objs
		lib=$B/fz-core.a
	fi
	for src in tests/fuzz/fz_*.c; do
		n=$(basename "$src" .c)
		clang $cflags -fsanitize=fuzzer $SAN -o "$B/$n" "$src" $lib $libs 2>$B/$n.log ||
			echo "fuzz: $n does not build (see $B/$n.log)" >&2
	done
}

# Tokens of the formats (libFuzzer dictionary syntax), so mutations speak
# JSON and safetensors.
dict() { # target
	cat <<'DICT'
"{"
"}"
"["
"]"
":"
","
"\""
"\\u0000"
"\\ud800"
"\\udc00"
"\\\""
"18446744073709551615"
"18446744073709551616"
"9007199254740993"
"1e3"
"1.0"
"-1"
"00"
"\x00\x00\x00\x00\x00\x00\x00\x00"
"\xff\xff\xff\xff\xff\xff\xff\xff"
"\xc0\x80"
"\xed\xa0\x80"
"\xf4\x90\x80\x80"
DICT
	case $1 in
	safetensors) words="__metadata__ dtype shape data_offsets BOOL F4 F6_E2M3 F6_E3M2 U8 I8
		F8_E5M2 F8_E4M3 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ I16 U16 F16 BF16 I32 U32 F32
		C64 F64 I64 U64 format pt";;
	index) words="weight_map metadata total_size model-00001-of-00002.safetensors
		model-00002-of-00002.safetensors ../x.safetensors /x.safetensors a/b.safetensors
		.. . .safetensors model.layers.0.mlp.experts.0.up_proj.weight
		model.layers.0.mlp.experts.1.up_proj.weight outside nested";;
	esac
	for k in $words; do printf '"\\"%s\\""\n' "$k"; done
}

# Merge the corpus into the inputs that add coverage. Files named
# regress-* are regression inputs (each a crash once found) and are always
# kept whatever their coverage.
minimize() { # target
	c=tests/fuzz/corpus/$1
	tmp=$B/minimize-$1
	rm -rf "$tmp" "$tmp.keep"; mkdir -p "$tmp" "$tmp.keep"
	for f in "$c"/regress-*; do [ -f "$f" ] && mv "$f" "$tmp.keep/"; done
	$B/fz_$1 -set_cover_merge=1 "$tmp" "$c" $B/corpus/$1 2>$B/merge-$1.log
	rm -f "$c"/*
	# content-addressed names: the same input is never committed twice
	for f in "$tmp"/*; do
		[ -f "$f" ] || continue
		cp "$f" "$c/$(sha1sum "$f" | cut -c1-16)"
	done
	for f in "$tmp.keep"/*; do [ -f "$f" ] && mv "$f" "$c/"; done
	rm -rf "$tmp" "$tmp.keep"
	echo "fuzz: $1 corpus: $(ls "$c" | wc -l) files, $(cat "$c"/* | wc -c) bytes"
}

case "${1:-}" in
build)
	build; exit 0;;
minimize)
	[ $# -eq 2 ] || { echo "usage: fuzz.sh minimize TARGET" >&2; exit 2; }
	build; mkdir -p $B/corpus/$2; minimize "$2"; exit 0;;
''|-*)
	echo "usage: fuzz.sh TARGET [SECONDS] [JOBS] | build | minimize TARGET" >&2
	exit 2;;
*)
	[ -f tests/fuzz/fz_$1.c ] || { echo "fuzz.sh: no target tests/fuzz/fz_$1.c" >&2; exit 2; };;
esac

t=$1; secs=${2:-60}; jobs=${3:-1}
case "$secs$jobs" in *[!0-9]*) echo "fuzz.sh: SECONDS and JOBS are integers" >&2; exit 2;; esac
build
[ -x $B/fz_$t ] || exit 3
mkdir -p $B/corpus/$t $B/crashes/$t
opts="-max_total_time=$secs -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix=$B/crashes/$t/ -print_final_stats=1"
dict $t >$B/$t.dict
opts="$opts -dict=$B/$t.dict"
rc=0
if [ "$jobs" -gt 1 ]; then
	# -fork keeps going after a crash and restarts the workers
	$B/fz_$t $opts -fork="$jobs" -ignore_crashes=1 $B/corpus/$t tests/fuzz/corpus/$t \
	  2>$B/fuzz-$t.log || rc=$?
else
	$B/fz_$t $opts $B/corpus/$t tests/fuzz/corpus/$t 2>$B/fuzz-$t.log || rc=$?
fi
grep -E '^(stat::|#[0-9]+.*DONE)|SUMMARY|Done [0-9]+ runs' $B/fuzz-$t.log | tail -n 12 || true
n=$(ls $B/crashes/$t | wc -l)
echo "fuzz: $t: exit $rc, $n crash artifacts in $B/crashes/$t (log: $B/fuzz-$t.log)"
minimize "$t"
[ "$n" -eq 0 ] && [ $rc -eq 0 ]
