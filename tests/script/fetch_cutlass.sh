#!/bin/sh
# tools/fetch_cutlass.sh, the build's fetch of CUTLASS's headers for
# kernels/xgemm.cu: whatever goes wrong (no Python to download with, a
# wheel whose SHA-256 is not the pinned one), it says so in one line,
# leaves no directory behind and exits 0, so that the build goes on
# without CUTLASS; headers already there are used as they are, without a
# download. (The download itself is what every build with the network
# does.)
. "$(dirname "$0")/lib.sh"
F=$ROOT/tools/fetch_cutlass.sh

# no Python: one line, exit 0, nothing left
expect 0 env PYTHON="$W/none" sh "$F" "$W/c1"
one_line "no python"
has 'built without CUTLASS' "$W/err" "no python: the consequence named"
if [ ! -e "$W/c1" ] && [ ! -e "$W/c1.tmp" ]; then ok; else bad "no python: a directory left behind"; fi

# a download that is not the pinned wheel: refused by its SHA-256
mkdir -p "$W/bin"
cat >"$W/bin/py" <<'PY'
#!/bin/sh
# pip download stand-in: writes a wheel of the right name and wrong bytes
while [ $# -gt 0 ]; do [ "$1" = -d ] && d=$2; shift; done
echo tampered >"$d/nvidia_cutlass-4.2.0.0-py3-none-any.whl"
PY
chmod +x "$W/bin/py"
expect 0 env PYTHON="$W/bin/py" sh "$F" "$W/c2"
one_line "tampered wheel"
has 'not the pinned' "$W/err" "tampered wheel: the SHA-256 named"
if [ ! -e "$W/c2" ] && [ ! -e "$W/c2.tmp" ]; then ok; else bad "tampered wheel: a directory left behind"; fi

# headers already there: used, nothing downloaded, nothing said
mkdir -p "$W/c3/include/cutlass" && : >"$W/c3/include/cutlass/cutlass.h"
expect 0 env PYTHON="$W/none" sh "$F" "$W/c3"
if [ ! -s "$W/err" ] && [ -f "$W/c3/include/cutlass/cutlass.h" ]; then ok; else
	bad "headers present: it printed or changed them"
fi

echo "$t_name: $pass passed, $fail failed"
