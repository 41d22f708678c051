#!/bin/sh
# crash_consistency.sh: kill -9 the writing commands (msinv add, msconvert
# quantize, msshard split, msinv import) at random moments of a run over a
# generated checkpoint of tens of megabytes, then check the inventory
# (integrity_check, log --check, msverify files), that no output file is
# torn, that `msinv gc` leaves no temporary, and that the command run again
# gives the clean result; msconvert, msshard and msinv import must leave
# their output whole or absent and registered wholly or not at all
# (tests/rel/rel_crash.py has the details).
# make test: 10 kills per command on a ~20 MB checkpoint;
# MS_RELIABILITY_FULL=1: 50 kills per command on a ~100 MB one.
name=crash_consistency
ROOT=${MS_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$ROOT" || exit 3
B=${MS_BUILD:-$ROOT/build}
if ! command -v python3 >/dev/null 2>&1; then
	echo "$name: skipped: python3 not found"
	echo "$name: 0 passed, 0 failed"
	exit 0
fi
if [ "$MS_RELIABILITY_FULL" = 1 ]; then
	set -- --trials 50 --mb 96
else
	set -- --trials 10 --mb 16
fi
exec python3 tests/rel/rel_crash.py --name "$name" --build "$B" "$@"
