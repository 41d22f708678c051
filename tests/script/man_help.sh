#!/bin/sh
# The --help text of every tool lists exactly the command lines of the
# SYNOPSIS of its man page, and every "TOOL CMD --help" prints its line.
# The man page is rendered with groff -mdoc, so what is compared is what a
# reader sees.
B=${MS_BUILD:-build}
pass=0; fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

norm() { sed -e 's/[[:space:]][[:space:]]*/ /g' -e 's/ \.\.\./.../g' -e 's/^ //' -e 's/ $//'; }

for page in man/*.1; do
	tool=$(basename "$page" .1)
	[ -x "$B/$tool" ] || continue
	groff -mdoc -Tascii -P-c -P-b -P-u "$page" 2>"$tmp/groff.err" |
		sed -n '/^SYNOPSIS/,/^[A-Z]/p' | sed '1d;$d' |
		awk -v t="$tool" '
			$1 == t { if (cur != "") print cur; cur = $0; next }
			/^[[:space:]]*$/ { next }
			{ cur = cur " " $0 }
			END { if (cur != "") print cur }' | norm | sort >"$tmp/man"
	"$B/$tool" --help | sed -n "s/^  \($tool .*\)/\1/p" | norm | sort >"$tmp/help"
	if [ -s "$tmp/help" ] && cmp -s "$tmp/man" "$tmp/help"; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL $tool: --help and the SYNOPSIS of $page differ:"
		diff "$tmp/help" "$tmp/man" | sed 's/^/  /'
	fi
	if [ -s "$tmp/groff.err" ]; then
		fail=$((fail + 1)); echo "FAIL $page: groff warnings:"; cat "$tmp/groff.err"
	fi
	# each subcommand's own --help
	sed 's/^[^ ]* \([^ ]*\).*/\1/' "$tmp/help" | sort -u | while read -r cmd; do
		out=$("$B/$tool" "$cmd" --help)
		line=$(grep "^$tool $cmd" "$tmp/help" | head -n 1)
		echo "$out" | norm | grep -qxF "usage: $line" || echo "FAIL $tool $cmd --help: '$out'"
	done >"$tmp/sub"
	if [ -s "$tmp/sub" ]; then fail=$((fail + 1)); cat "$tmp/sub"; else pass=$((pass + 1)); fi
done
echo "man_help: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
