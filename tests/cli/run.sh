#!/bin/sh
# Golden CLI cases (as zstd's cli-tests): each directory under
# tests/cli/cases holds
#   cmd      one shell command line, run in a fresh scratch directory with
#            the tools first on PATH, MSINV_DB=inv.db there and the bundled
#            fixtures at ./fx
#   status   the exit status it must end with
#   stdout   what it must print on stdout, byte for byte
#   stderr   and on stderr
# The scratch directory's path is written "." in what is compared, so the
# files hold no path of the machine they were made on. They pin the
# user-facing messages of the tools' commonest errors: a change to one is a
# change to a golden file, seen in review.
#   sh tests/cli/run.sh            check every case
#   sh tests/cli/run.sh --update   rewrite stdout, stderr and status from
#                                  what the tools print now (then review
#                                  the diff)
#   sh tests/cli/run.sh CASE...    only these cases
ROOT=${MS_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
B=${MS_BUILD:-$ROOT/build}
FX=${MS_FIXTURES:-$ROOT/tests/fixtures}
B=$(cd "$B" && pwd) || exit 3
FX=$(cd "$FX" && pwd) || exit 3
update=0
if [ "$1" = --update ]; then update=1; shift; fi
pass=0; fail=0
T=$(mktemp -d "${TMPDIR:-/tmp}/cli.XXXXXX") || exit 3
trap 'rm -rf "$T"' EXIT

cases=$*
[ -n "$cases" ] || cases=$(cd "$ROOT/tests/cli/cases" && ls)
for c in $cases; do
	d="$ROOT/tests/cli/cases/$c"
	if [ ! -f "$d/cmd" ]; then
		echo "FAIL $c: no such case"; fail=$((fail + 1)); continue
	fi
	w="$T/$c"
	mkdir "$w" && ln -s "$FX" "$w/fx" || exit 3
	wp=$(cd "$w" && pwd -P)
	(cd "$w" && PATH="$B:$PATH" MSINV_DB=inv.db sh -c "$(cat "$d/cmd")") \
		>"$T/out.raw" 2>"$T/err.raw"
	st=$?
	for s in out err; do
		sed -e "s|$wp|.|g" -e "s|$w|.|g" "$T/$s.raw" >"$T/$s"
	done
	if [ "$update" = 1 ]; then
		cp "$T/out" "$d/stdout"; cp "$T/err" "$d/stderr"; echo "$st" >"$d/status"
		echo "updated $c"; pass=$((pass + 1)); continue
	fi
	why=""
	[ "$st" = "$(cat "$d/status")" ] || why="exit $st, want $(cat "$d/status")"
	cmp -s "$T/out" "$d/stdout" || why="${why:+$why; }stdout differs"
	cmp -s "$T/err" "$d/stderr" || why="${why:+$why; }stderr differs"
	if [ -z "$why" ]; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL $c: $why"
		diff "$d/stdout" "$T/out" | sed 's/^/  stdout /' | head -n 10
		diff "$d/stderr" "$T/err" | sed 's/^/  stderr /' | head -n 10
	fi
done
echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
