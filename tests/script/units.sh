#!/bin/sh
# Sizes in text output use one convention (ms_bytes_str): exact bytes below
# 1 KiB, else binary units with two decimals; --json gives exact bytes. No
# decimal GB/MB/kB anywhere in what msinv and msverify print.
. "$(dirname "$0")/lib.sh"
export MSINV_DB="$W/inv.db"


# sizes FILE WHAT: every size in FILE is "N B" or "N.NN XiB", none decimal
sizes() {
	if grep -Eq '[0-9] ?(kB|KB|MB|GB|TB)\b' "$1"; then
		bad "$2: decimal units"; grep -E '[0-9] ?(kB|KB|MB|GB|TB)\b' "$1" | head -n 3; return
	fi
	if grep -Eq '[0-9]\.[0-9] (KiB|MiB|GiB|TiB)|[0-9]\.[0-9]{3,} (KiB|MiB|GiB|TiB)' "$1"; then
		bad "$2: binary units without exactly two decimals"; head -n 3 "$1"; return
	fi
	ok
}

"$B/msinv" init >/dev/null
"$B/msinv" add --label base "$FX/hf/qwen3moe" >/dev/null || bad "add"
"$B/msinv" show base >"$W/show" && grep -q '^bytes  *314112 (306.75 KiB)$' "$W/show" && ok ||
	bad "show: bytes line is not 'exact (binary)'"
sizes "$W/show" "msinv show"
"$B/msinv" dup >"$W/dup" && sizes "$W/dup" "msinv dup"
# 315.16 KiB: the weights, config.json and generation_config.json (every file of the state)
if "$B/msverify" files base >"$W/vf" && grep -Eq '^ok	base	1 files	69 tensors	315.16 KiB	' "$W/vf"; then ok; else
	bad "msverify files: size not in KiB"; cat "$W/vf"
fi
sizes "$W/vf" "msverify files"
(cd "$FX/plans" && "$OLDPWD/$B/msinv" footprint qwen3moe-whatif.json) >"$W/fp" 2>&1
sizes "$W/fp" "msinv footprint"
# --json: exact byte counts
"$B/msinv" ls --json >"$W/ls.json" && grep -q '"bytes":[[:space:]]*314112' "$W/ls.json" && ok ||
	bad "ls --json: bytes not exact"

echo "units: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
