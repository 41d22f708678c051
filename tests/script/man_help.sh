#!/bin/sh
# The --help text of every tool lists exactly the command lines of the
# SYNOPSIS of its man page, and every "TOOL CMD --help" prints its line
# and its options: those of the SYNOPSIS line, each with a description and
# each described in the page, and none the page lists for the command
# missing.
# The man page is rendered with groff -mdoc, so what is compared is what a
# reader sees.
. "$(dirname "$0")/lib.sh"
tmp=$W

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
	# each subcommand's --help lists its options, described, as git's -h
	# does: the same options as the SYNOPSIS line, each documented in the
	# page, and every option the page lists under the command (.It Fl) is
	# in --help
	sed -n '/^\.Sh DESCRIPTION/,$p' "$page" >"$tmp/body"
	sed 's/^[^ ]* \([^ ]*\).*/\1/' "$tmp/help" | sort -u | while read -r cmd; do
		"$B/$tool" "$cmd" --help | sed -n '/^options:$/,/^$/p' | grep '^  -' >"$tmp/optlines"
		sed 's/^  \([^ ]*\).*/\1/' "$tmp/optlines" | sort -u >"$tmp/hopts"
		grep "^$tool $cmd " "$tmp/man" | head -n 1 | tr ' ' '\n' |
			sed -e 's/^\[*//' -e 's/[]|.]*$//' | grep -E '^--?[A-Za-z]' | sort -u >"$tmp/sopts"
		if ! cmp -s "$tmp/hopts" "$tmp/sopts"; then
			echo "FAIL $tool $cmd --help: options differ from the SYNOPSIS of $page:"
			diff "$tmp/hopts" "$tmp/sopts" | sed 's/^/  /'
		fi
		grep -vE '^  [^ ].*[^ ]   *[^ ]' "$tmp/optlines" | sed "s|^|FAIL $tool $cmd --help: option without a description: |"
		while read -r o; do
			grep -qE "Fl ${o#-}( |\$)" "$tmp/body" ||
				echo "FAIL $page: $tool $cmd $o is not described (no 'Fl ${o#-}' after SYNOPSIS)"
		done <"$tmp/hopts"
		awk -v c="$cmd" '
			$0 == ".Ss " c || $0 == ".It Cm " c { on = 1; next }
			on && (/^\.Ss / || /^\.Sh / || /^\.It Cm /) { on = 0 }
			on && /^\.It Fl / { for (i = 2; i <= NF; i++) if ($(i - 1) == "Fl") print "-" $i }' \
			"$page" | sort -u >"$tmp/mopts"
		comm -23 "$tmp/mopts" "$tmp/hopts" | sed "s|^|FAIL $tool $cmd --help: missing an option $page lists: |"
	done >"$tmp/opts"
	if [ -s "$tmp/opts" ]; then fail=$((fail + 1)); cat "$tmp/opts"; else pass=$((pass + 1)); fi
done
echo "man_help: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
