#!/bin/sh
# malformed.sh: every file of the malformed-input corpus (tests/fixtures/bad,
# made by tests/gen/gen_bad_corpus.py) is refused by `msinv inspect`
# with exit 2, nothing on stdout, and exactly one line on stderr that names
# the file and contains the fragment EXPECTED.tsv gives for it. The corpus
# itself must be what the generator makes, and every file in it must have
# an expectation.
MS_BUILD=${MS_BUILD:-build}
MS_FIXTURES=${MS_FIXTURES:-tests/fixtures}
BAD=$MS_FIXTURES/bad
MSINV=$MS_BUILD/msinv
. "$(dirname "$0")/lib.sh"
tmp=$W


if [ ! -x "$MSINV" ] || [ ! -f "$BAD/EXPECTED.tsv" ]; then
	echo "malformed: missing $MSINV or $BAD/EXPECTED.tsv" >&2
	echo "malformed: 0 passed, 1 failed"
	exit 1
fi

tab=$(printf '\t')
ncases=0
while IFS="$tab" read -r name frag; do
	case $name in ''|'#'*) continue;; esac
	ncases=$((ncases + 1))
	path=$BAD/$name
	if [ ! -e "$path" ]; then
		bad "$name: listed in EXPECTED.tsv but missing"
		continue
	fi
	"$MSINV" inspect "$path" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	lines=$(wc -l <"$tmp/err")
	why=""
	[ $rc -eq 2 ] || why="$why exit $rc (want 2);"
	[ -s "$tmp/out" ] && why="$why output on stdout;"
	# exactly one line, and it ends with a newline
	[ "$lines" -eq 1 ] && [ "$(wc -c <"$tmp/err")" -eq "$(head -n 1 "$tmp/err" | wc -c)" ] ||
		why="$why $lines lines on stderr (want 1);"
	grep -qF -- "$path" "$tmp/err" || why="$why error does not name '$path';"
	grep -qF -- "$frag" "$tmp/err" || why="$why error lacks '$frag';"
	grep -q '^msinv: ' "$tmp/err" || why="$why error does not start with 'msinv: ';"
	if [ -z "$why" ]; then
		ok
	else
		bad "$name:$why stderr: $(head -c 400 "$tmp/err")"
	fi
done <"$BAD/EXPECTED.tsv"

# the corpus is large enough and every file or case directory is expected
if [ "$ncases" -ge 30 ]; then ok; else bad "only $ncases cases (want at least 30)"; fi
missing=0
for f in "$BAD"/* "$BAD"/index/*; do
	n=${f#"$BAD"/}
	case $n in EXPECTED.tsv|index) continue;; esac
	if ! cut -f1 "$BAD/EXPECTED.tsv" | grep -qxF -- "$n"; then
		bad "$n is in the corpus but not in EXPECTED.tsv"
		missing=1
	fi
done
[ $missing -eq 0 ] && ok

# the committed corpus is exactly what the generator makes
if command -v python3 >/dev/null 2>&1 && [ -n "$MS_ROOT" ]; then
	if python3 "$MS_ROOT/tests/gen/gen_bad_corpus.py" "$tmp/gen" >/dev/null &&
	   diff -r "$tmp/gen" "$BAD" >"$tmp/diff" 2>&1; then
		ok
	else
		bad "tests/fixtures/bad differs from gen_bad_corpus.py output: $(head -n 5 "$tmp/diff")"
	fi
fi

echo "malformed: $pass passed, $fail failed"
[ $fail -eq 0 ]
