#!/bin/sh
# tools/scripts/rl_curves.py: bad metrics input is one line naming the file
# and line, exit 2, and no PNG; with matplotlib importable (the test venv,
# python3, or MS_RL_PYTHON), a PNG of two runs with an event marker is
# drawn from a small metrics file.
. "$(dirname "$0")/lib.sh"
S=$ROOT/tools/scripts/rl_curves.py

PY=python3
for p in "${MS_RL_PYTHON:-}" "$ROOT/.venv/bin/python" python3; do
	[ -n "$p" ] && "$p" -c "import matplotlib" 2>/dev/null && { PY=$p; break; }
done

for s in 1 2 3 4 5 6; do
	echo "{\"step\":$s,\"reward_mean\":0.$s,\"reg_share\":0.5,\"kl\":0.0$s,\"entropy\":5.5}"
done >"$W/healthy.jsonl"
for s in 1 2 3 4 5 6; do
	echo "{\"step\":$s,\"reward_mean\":0.03,\"reg_share\":4.0,\"kl\":0.2,\"entropy\":5.5}"
done >"$W/kl5.jsonl"
echo '{"event":{"rule":"reg_share","step":5,"window":5,"value":4.0,"threshold":1}}' >>"$W/kl5.jsonl"

# bad input: a line that is not JSON, a field missing, no metrics at all
printf '{"step":1,"reward_mean":0.1,"reg_share":1,"kl":0}\nnot json\n' >"$W/bad1.jsonl"
printf '{"step":1,"reward_mean":0.1,"kl":0}\n' >"$W/bad2.jsonl"
: >"$W/empty.jsonl"
for f in bad1:2 bad2:1 empty:; do
	n=${f%%:*}; line=${f#*:}
	"$PY" "$S" "$W/$n.png" "$W/healthy.jsonl" "$W/$n.jsonl" 2>"$W/err"
	rc=$?
	want="$W/$n.jsonl${line:+:$line}"
	if [ $rc -eq 2 ] && [ "$(wc -l <"$W/err")" -eq 1 ] && grep -q "$want" "$W/err" &&
		[ ! -e "$W/$n.png" ]; then ok; else
		bad "$n: rc $rc, want 2 and one line naming $want"; cat "$W/err"
	fi
done
"$PY" "$S" "$W/x.png" "$W/nonexistent.jsonl" 2>"$W/err"
[ $? -eq 2 ] && grep -q nonexistent "$W/err" && ok || bad "missing file not refused"

if "$PY" -c "import matplotlib" 2>/dev/null; then
	if "$PY" "$S" "$W/c.png" "$W/healthy.jsonl" "$W/kl5.jsonl" &&
		[ "$(head -c 8 "$W/c.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] &&
		[ "$(wc -c <"$W/c.png")" -gt 10000 ]; then ok; else
		bad "no PNG drawn"
	fi
else
	echo "rl_curves: matplotlib not importable: the drawing itself not checked"
fi
echo "rl_curves: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
