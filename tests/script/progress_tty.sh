#!/bin/sh
# Long work shows progress on stderr when stderr is a terminal, and nothing
# otherwise: msinv add, export and import run once with stderr on a
# pseudo-terminal (python's pty) and once with stderr on a pipe. The
# progress line is "msinv: WHAT DONE / TOTAL (PCT%), RATE/s" in binary
# units, ending at 100%.
. "$(dirname "$0")/lib.sh"
B=${MS_BUILD:-build}/msinv
export MSINV_DB="$W/inv.db"

if ! command -v python3 >/dev/null 2>&1; then
	echo "progress_tty: skipped (needs python3)"
	echo "progress_tty: 0 passed, 0 failed"
	exit 0
fi


# ontty OUT COMMAND...: run with stderr on a pseudo-terminal, stdout to OUT;
# what the terminal received goes to OUT.tty. Exit status of the command.
ontty() {
	_o=$1; shift
	python3 - "$_o" "$@" <<'EOF'
import os, pty, subprocess, sys
out = sys.argv[1]
master, slave = pty.openpty()
with open(out, "wb") as so:
    p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=so, stderr=slave)
os.close(slave)
got = b""
while True:
    try:
        b = os.read(master, 65536)
    except OSError:
        break
    if not b:
        break
    got += b
rc = p.wait()
open(out + ".tty", "wb").write(got)
sys.exit(rc)
EOF
}

# progress_line FILE WHAT: the terminal shows WHAT's progress, complete
progress_line() {
	tr '\r' '\n' <"$1" | sed 's/\x1b\[K//g' |
		grep -Eq "^msinv: $2 [0-9.]+ (B|KiB|MiB|GiB) / [0-9.]+ (B|KiB|MiB|GiB) \(100%\)(, [0-9.]+ (B|KiB|MiB|GiB)/s)?$"
}

"$B" init >/dev/null 2>&1 || { bad "init"; }

# add
if ontty "$W/add" "$B" add --label base "$FX/hf/qwen3moe" && progress_line "$W/add.tty" hashing &&
   grep -q '^sha256:' "$W/add" && ! grep -q 'hashing' "$W/add"; then ok; else
	bad "add on a terminal: no progress line on stderr (or it went to stdout)"; cat -v "$W/add.tty" | head -n 5
fi
"$B" rm base >/dev/null 2>&1
if "$B" add --label base "$FX/hf/qwen3moe" >"$W/out" 2>"$W/err" && [ ! -s "$W/err" ]; then ok; else
	bad "add with stderr on a pipe printed on stderr"; head -n 3 "$W/err"
fi

# export
if ontty "$W/exp" "$B" export -o "$W/b.tar.zst" base &&
   progress_line "$W/exp.tty" 'exporting \(verify, then pack\)' && [ -s "$W/b.tar.zst" ]; then ok; else
	bad "export on a terminal: no progress line"; cat -v "$W/exp.tty" | head -n 5
fi
rm -f "$W/b.tar.zst"
if "$B" export -o "$W/b.tar.zst" base >"$W/out" 2>"$W/err" && [ ! -s "$W/err" ]; then ok; else
	bad "export with stderr on a pipe printed on stderr"; head -n 3 "$W/err"
fi

# import (into a fresh inventory, so the files are hashed)
export MSINV_DB="$W/inv2.db"
"$B" init >/dev/null 2>&1
if ontty "$W/imp" "$B" import "$W/b.tar.zst" "$W/imported" && progress_line "$W/imp.tty" importing &&
   grep -q '^imported' "$W/imp"; then ok; else
	bad "import on a terminal: no progress line"; cat -v "$W/imp.tty" | head -n 5
fi
rm -rf "$W/imported"; rm -f "$W/inv2.db"*; "$B" init >/dev/null 2>&1
if "$B" import "$W/b.tar.zst" "$W/imported" >"$W/out" 2>"$W/err" && [ ! -s "$W/err" ]; then ok; else
	bad "import with stderr on a pipe printed on stderr"; head -n 3 "$W/err"
fi

# one tensor of 512 MiB (a sparse file): hashed in pieces, so the line moves
# before the end, and long enough to show a rate
export MSINV_DB="$W/inv3.db"
"$B" init >/dev/null 2>&1
python3 - "$W/big.safetensors" <<'EOF'
import json, struct, sys
n = 512 << 20
h = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + n)
EOF
if ontty "$W/big" "$B" add --jobs 2 "$W/big.safetensors" &&
   tr '\r' '\n' <"$W/big.tty" | sed 's/\x1b\[K//g' |
	grep -Eq '^msinv: hashing [0-9.]+ (B|KiB|MiB|GiB) / 512.00 MiB \(100%\), [0-9.]+ (MiB|GiB)/s$'; then ok; else
	bad "add of 512 MiB on a terminal: no complete progress line with a rate"; cat -v "$W/big.tty" | head -n 5
fi

echo "progress_tty: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
