# lib.sh: what the script tests share (as git's t/test-lib.sh). A test
# sources it first:
#
#	. "$(dirname "$0")/lib.sh"
#
# and gets:
#   B, FX, ROOT   the build directory (MS_BUILD), the fixtures (MS_FIXTURES)
#                 and the source tree (MS_ROOT), as tests/run.sh exports them;
#                 the tools in B come first on PATH
#   W             a scratch directory of its own, removed when the test exits
#   pass, fail    the counts; ok and bad MESSAGE count one case each
#   skip REASON   says why the test cannot run here and exits "0 passed,
#                 0 failed" (never silently)
#   expect CODE CMD...  runs CMD, stdout in $W/out and stderr in $W/err, and
#                 checks its exit status (git's test_must_fail: a failure is
#                 a status, never a bare `!`)
#   has PATTERN FILE WHAT, hasnt PATTERN FILE WHAT   grep in a file
#   one_line [WHAT]  stderr ($W/err) is exactly one line
#   inv_query SQL  rows of the inventory $MSINV_DB (Python's sqlite3)
#   gpu_plan FILE BASE QUANT  a small mstrain plan for the GPU trainer's
#                 tests (6 steps of the copy task, 4 x 16 tokens, LoRA r 4 on
#                 the experts and q/v) over the states BASE and QUANT, its
#                 label and outputs from FILE's name
#   losses FILE   mstrain's metrics lines without their timings
# and ends with its own totals line, "NAME: N passed, N failed", which
# tests/run.sh reads. A test whose helper checks more than these (msinv_cli's
# expect also checks the one-line message) defines its own after sourcing.
# Tests that exec a Python driver (fault_injection, crash_consistency, ...)
# do not source it: the driver keeps the counts and its own scratch space.
t_name=$(basename "$0" .sh)
B=${MS_BUILD:-build}
FX=${MS_FIXTURES:-tests/fixtures}
ROOT=${MS_ROOT:-.}
pass=0; fail=0
W=$(mktemp -d "${TMPDIR:-/tmp}/$t_name.XXXXXX") || exit 3
# removed by its own name: a test may point W elsewhere later
t_scratch=$W
trap 'rm -rf "$t_scratch"' EXIT
if [ -d "$B" ]; then PATH="$(cd "$B" && pwd):$PATH"; export PATH; fi

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
skip() {
	echo "$t_name: skipped: $*"
	echo "$t_name: 0 passed, 0 failed"
	exit 0
}
expect() { # CODE CMD...
	_want=$1; shift
	"$@" >"$W/out" 2>"$W/err"
	_got=$?
	if [ "$_got" -eq "$_want" ]; then ok; else
		bad "exit $_got (want $_want): $*"; tail -n 5 "$W/err" | sed 's/^/  /'; fi
}
has() { # PATTERN FILE WHAT
	if grep -q -- "$1" "$2"; then ok; else
		bad "$3: no '$1' in $2"; tail -n 5 "$2" | sed 's/^/  /'; fi
}
hasnt() { # PATTERN FILE WHAT
	if grep -q -- "$1" "$2"; then bad "$3: '$1' in $2"; tail -n 5 "$2" | sed 's/^/  /'; else
		ok; fi
}
one_line() { # [WHAT]
	if [ "$(wc -l <"$W/err")" -eq 1 ]; then ok; else
		bad "${1:+$1: }stderr is not one line"; cat "$W/err"; fi
}
inv_query() { # SQL: rows of $MSINV_DB, fields joined by '|', through Python's
	# sqlite3 (GPU hosts often lack the sqlite3 CLI)
	python3 -c 'import sqlite3, sys
for r in sqlite3.connect(sys.argv[1]).execute(sys.argv[2]):
    print("|".join(map(str, r)))' "$MSINV_DB" "$1"
}

gpu_plan() { # FILE BASE QUANT
	cat >"$1" <<P
{"ep_size": 1, "outputs": "runs/$(basename "$1" .json)",
 "states": [{"role": "base", "state": "$2"}, {"role": "quantized", "state": "$3"}],
 "train": {"lora": {"r": 4, "alpha": 8, "targets": ["experts", "q_proj", "v_proj"]},
           "optimizer": {"lr": 1e-2, "weight_decay": 0.0, "clip": 1.0, "warmup": 0},
           "batch": 4, "seq_len": 16, "steps": 6, "seed": 1,
           "data": {"task": "copy"}, "checkpoint_every": 0,
           "label": "$(basename "$1" .json)"}}
P
}
losses() { sed 's/,"seconds":[^,]*,"tokens_per_s":[^}]*//' "$1"; }
