#!/bin/sh
# tamper.sh: bit flips in tensors and headers, digests edited in the
# database, audit log rows edited, deleted or reordered, signature files
# and signed files changed: each caught by msverify files, msinv log
# --check or msverify verify with exit 1, naming what changed
# (tests/rel/rel_tamper.py has the details).
# make test: a seeded sample of each; MS_RELIABILITY_FULL=1: every tensor,
# every header byte, every log entry, every byte of the signature file.
name=tamper
ROOT=${MS_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$ROOT" || exit 3
B=${MS_BUILD:-$ROOT/build}
if ! command -v python3 >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
	echo "$name: skipped: python3 or openssl not found"
	echo "$name: 0 passed, 0 failed"
	exit 0
fi
[ "$MS_RELIABILITY_FULL" = 1 ] && set -- --all
exec python3 tests/rel/rel_tamper.py --name "$name" --build "$B" "$@"
