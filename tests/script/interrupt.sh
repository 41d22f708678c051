#!/bin/sh
# interrupt.sh: the writing commands (msconvert quantize, msshard split,
# msinv import, export, add) stopped by SIGINT, SIGTERM or SIGHUP while they
# work exit 128 + the signal with one line on stderr, leave no staging and
# no output, and register nothing; a writer killed with SIGKILL leaves
# staging that `msinv gc` without a directory argument finds
# (tests/rel/rel_interrupt.py has the details).
name=interrupt
ROOT=${MS_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$ROOT" || exit 3
B=${MS_BUILD:-$ROOT/build}
if ! command -v python3 >/dev/null 2>&1; then
	echo "$name: skipped: python3 not found"
	echo "$name: 0 passed, 0 failed"
	exit 0
fi
exec python3 tests/rel/rel_interrupt.py --name "$name" --build "$B" --mb 32
