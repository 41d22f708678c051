#!/bin/sh
# concurrency.sh: 16 `msinv add` processes on one inventory while readers
# loop over ls, show and `msverify files` (no busy error, nothing lost, the
# log and the database sound), and two writers of one output at once (one
# wins, the other refuses, the output is a single run's)
# (tests/rel/rel_concurrency.py has the details).
# make test: one round, 3 races per output kind;
# MS_RELIABILITY_FULL=1: 5 rounds, 20 races.
name=concurrency
ROOT=${MS_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$ROOT" || exit 3
B=${MS_BUILD:-$ROOT/build}
if ! command -v python3 >/dev/null 2>&1; then
	echo "$name: skipped: python3 not found"
	echo "$name: 0 passed, 0 failed"
	exit 0
fi
if [ "$MS_RELIABILITY_FULL" = 1 ]; then
	set -- --rounds 5 --races 20
else
	set -- --rounds 1 --races 3
fi
exec python3 tests/rel/rel_concurrency.py --name "$name" --build "$B" --writers 16 "$@"
