#!/bin/sh
# The Python package (python/) over libms.so, with pytest (tests/python/):
# builds libms.so, installs the package from a copy into the test venv
# .venv, runs the suite against this build's library (MSINV_LIBMS) and
# reports pytest's counts (skipped tests are listed with their reason).
#   sh tests/script/python.sh        the numpy path (and torch when importable)
#   sh tests/script/python.sh gpu    the CUDA and PEFT tests only (make test-gpu)
# torch, transformers and peft are not in the test venv (large, and
# optional for the package): MS_PYTHON names another interpreter that has
# them (with pytest, numpy, safetensors), which then runs the suite with
# the package on PYTHONPATH; the GPU tier falls back to python3 when the
# venv has no torch and python3 has. Skipped (0 passed, 0 failed) without
# a usable interpreter, and under the sanitizers (a sanitized library
# cannot be loaded into an interpreter built without them). MS_PREBUILT=1:
# the build directory's libms.so as it is, not rebuilt (binaries made on
# another machine).
B=${MS_BUILD:-build}
ROOT=${MS_ROOT:-.}
PY=$ROOT/.venv/bin/python
if [ -n "$MS_SANITIZED" ]; then
	echo "python: skipped: a sanitized libms.so is not loadable into python"
	echo "python: 0 passed, 0 failed"
	exit 0
fi
usable() { "$1" -c "import numpy, pytest, safetensors${2:+, $2}" 2>/dev/null; }
other=""
if [ -n "${MS_PYTHON:-}" ]; then
	other=$MS_PYTHON
elif [ "${1:-}" = gpu ] && ! usable "$PY" torch && usable python3 torch; then
	other=python3
fi
[ -n "$other" ] && PY=$other
if [ ! -x "$(command -v "$PY")" ] || ! usable "$PY"; then
	echo "python: skipped: no python test environment (make venv)"
	echo "python: 0 passed, 0 failed"
	exit 0
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/python.XXXXXX"); trap 'rm -rf "$W"' EXIT
fail_setup() { echo "python: $1"; sed 's/^/  /' "$W/log" | tail -n 20; echo "python: 0 passed, 1 failed"; exit 1; }

# MS_PREBUILT: the build directory holds binaries made on another machine
# (a GPU host without the -dev packages): use its libms.so as it is
if [ -n "${MS_PREBUILT:-}" ]; then
	[ -e "$B/libms.so.0" ] || { echo "no $B/libms.so.0" >"$W/log"; fail_setup "MS_PREBUILT: no library"; }
else
	make -C "$ROOT" --no-print-directory -s BUILD="$B" shlib >"$W/log" 2>&1 || fail_setup "make shlib failed"
fi
cp -r "$ROOT/python" "$W/pkg" && rm -rf "$W/pkg/build" "$W/pkg"/*.egg-info "$W/pkg"/msinv/libms.so*
if [ -n "$other" ]; then
	PYTHONPATH="$W/pkg${PYTHONPATH:+:$PYTHONPATH}"; export PYTHONPATH
else
	"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps "$W/pkg" \
		>"$W/log" 2>&1 || fail_setup "pip install failed"
fi

sel=""
[ "${1:-}" = gpu ] && sel="-k cuda or peft"
MSINV_LIBMS="$B/libms.so.0" "$PY" -m pytest -q -rs -p no:cacheprovider ${sel:+"$sel"} \
	"$ROOT/tests/python" >"$W/log" 2>&1
rc=$?
last=$(grep -E '^=* *[0-9]+ (passed|failed|skipped|errors?|deselected)' "$W/log" | tail -n 1)
num() { echo "$last" | grep -oE "[0-9]+ $1" | cut -d' ' -f1; }
p=$(num passed); f=$(num failed); e=$(num 'errors?'); s=$(num skipped)
f=$(( ${f:-0} + ${e:-0} ))
if [ "$f" -ne 0 ] || [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
	cat "$W/log"
	[ "$f" -eq 0 ] && f=1
fi
grep '^SKIPPED' "$W/log"
[ -n "$s" ] && echo "python: $s skipped"
echo "python: ${p:-0} passed, $f failed"
[ "$f" -eq 0 ]
