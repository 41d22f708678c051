#!/bin/sh
# Many writers on one inventory, and writers killed at random moments.
#
#  1. 16 concurrent `msinv add` of 16 different checkpoints (copies of a
#     fixture, one data byte changed in each): every add succeeds, all 16
#     states are recorded, PRAGMA integrity_check is ok, the log chain holds.
#  2. 16 concurrent adds of the same checkpoint: one state, one copy.
#  3. kill -9 of `msinv add` of a bigger generated file at random moments,
#     20 trials: after each, integrity_check is ok, the chain holds, every
#     state is whole (files, tensors, log entry), and every recorded state
#     verifies: its tensor digests and state digest recomputed from the bytes
#     on disk with python's hashlib.
. "$(dirname "$0")/lib.sh"
B=${MS_BUILD:-build}/msinv
export MSINV_DB="$W/inv.db"

check() { # description, command...
	d=$1; shift
	if "$@" >"$W/out" 2>&1; then ok; else bad "$d"; sed 's/^/  /' "$W/out" | head -n 20; fi
}
q() { sqlite3 "$MSINV_DB" "$1"; }

if ! command -v sqlite3 >/dev/null 2>&1 || ! command -v python3 >/dev/null 2>&1; then
	echo "msinv_concurrency: skipped (needs sqlite3 and python3)"
	echo "msinv_concurrency: 0 passed, 0 failed"
	exit 0
fi

# Set byte at offset (decimal) of a file to value (0..255), in place.
poke() {
	printf "$(printf '\\%03o' "$3")" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

# ---- 1. sixteen writers, sixteen states --------------------------------------------
"$B" init >/dev/null || { bad "init"; exit 1; }
src="$FX/hf/qwen3moe/model.safetensors"
size=$(wc -c <"$src")
i=0
while [ $i -lt 16 ]; do
	mkdir -p "$W/c$i"
	cp "$src" "$W/c$i/model.safetensors"
	poke "$W/c$i/model.safetensors" $((size - 1)) $((i + 1))
	i=$((i + 1))
done
i=0
while [ $i -lt 16 ]; do
	"$B" add --label "copy-$i" "$W/c$i" >"$W/add$i.out" 2>"$W/add$i.err" &
	eval "p$i=\$!"
	i=$((i + 1))
done
i=0; errs=0
while [ $i -lt 16 ]; do
	eval "wait \$p$i" || { errs=$((errs + 1)); cat "$W/add$i.err"; }
	i=$((i + 1))
done
[ $errs -eq 0 ] && ok || bad "$errs of 16 concurrent adds failed"
[ "$(cat "$W"/add*.out | sort -u | wc -l)" -eq 16 ] && ok || bad "16 distinct digests printed"
[ "$(q 'SELECT count(*) FROM states')" = 16 ] && ok || bad "16 states recorded"
[ "$(q "SELECT count(*) FROM log WHERE action = 'add'")" = 16 ] && ok || bad "16 add entries in the log"
[ "$(q 'PRAGMA integrity_check')" = ok ] && ok || bad "integrity_check after concurrent adds"
[ "$(q 'PRAGMA foreign_key_check' | wc -l)" -eq 0 ] && ok || bad "foreign_key_check after concurrent adds"
check "log --check after concurrent adds" "$B" log --check
# each label names the digest its own add printed
i=0; mism=0
while [ $i -lt 16 ]; do
	[ "$(q "SELECT digest FROM states WHERE label = 'copy-$i'")" = "$(cat "$W/add$i.out")" ] || mism=$((mism + 1))
	i=$((i + 1))
done
[ $mism -eq 0 ] && ok || bad "$mism labels name another state"

# ---- 2. sixteen writers, one state ------------------------------------------------------
export MSINV_DB="$W/same.db"
"$B" init >/dev/null
i=0
while [ $i -lt 16 ]; do
	"$B" add "$FX/hf/qwen3moe-sharded" >"$W/same$i.out" 2>"$W/same$i.err" &
	eval "p$i=\$!"
	i=$((i + 1))
done
i=0; errs=0
while [ $i -lt 16 ]; do
	eval "wait \$p$i" || { errs=$((errs + 1)); cat "$W/same$i.err"; }
	i=$((i + 1))
done
[ $errs -eq 0 ] && ok || bad "$errs of 16 concurrent adds of one state failed"
[ "$(cat "$W"/same*.out | sort -u | wc -l)" -eq 1 ] && ok || bad "one digest printed"
[ "$(q 'SELECT count(*) FROM states')" = 1 ] && ok || bad "one state recorded"
[ "$(q 'SELECT count(DISTINCT copy) FROM state_files')" = 1 ] && ok || bad "one copy recorded"
[ "$(q 'SELECT count(*) FROM files')" = 2 ] && ok || bad "two file rows recorded"
check "log --check after concurrent identical adds" "$B" log --check

# ---- 3. killed writers -------------------------------------------------------------------------
export MSINV_DB="$W/kill.db"
"$B" init >/dev/null
# 3000 tensors of 4 KiB: long enough to be killed while hashing or while the
# transaction inserts the tensor rows
python3 - "$W/big.safetensors" <<'EOF'
import json, struct, sys
n, sz = 3000, 4096
hdr, off = {}, 0
for i in range(n):
    hdr["model.layers.%d.mlp.experts.%d.w1.weight" % (i // 64, i % 64)] = {
        "dtype": "BF16", "shape": [32, 64], "data_offsets": [off, off + sz]}
    off += sz
h = json.dumps(hdr, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for i in range(n):
        f.write(struct.pack("<I", i) * (sz // 4))
EOF
bsize=$(wc -c <"$W/big.safetensors")
# how long an add takes here, to spread the kills over it
"$B" init --db "$W/timing.db" >/dev/null
t0=$(date +%s%N)
"$B" add --db "$W/timing.db" "$W/big.safetensors" >/dev/null
t1=$(date +%s%N)
span_us=$(( (t1 - t0) / 1000 ))
[ $span_us -gt 0 ] || span_us=100000
trial=0; killed=0
while [ $trial -lt 20 ]; do
	f="$W/k$trial.safetensors"
	cp "$W/big.safetensors" "$f"
	poke "$f" $((bsize - 1)) $((trial + 1))
	delay_us=$(awk -v s="$trial" -v span="$span_us" 'BEGIN { srand(s * 7919 + 17); printf "%d", rand() * span * 1.2 }')
	"$B" add --label "trial-$trial" "$f" >/dev/null 2>&1 &
	pid=$!
	sleep "$(awk -v u="$delay_us" 'BEGIN { printf "%.6f", u / 1000000 }')"
	kill -9 $pid 2>/dev/null && killed=$((killed + 1))
	wait $pid 2>/dev/null
	[ "$(q 'PRAGMA integrity_check')" = ok ] && ok || bad "trial $trial: integrity_check"
	if "$B" log --check >"$W/out" 2>&1; then ok; else bad "trial $trial: log --check"; cat "$W/out"; fi
	# whole or nothing: the state, its files, every tensor row, its log entry
	n=$(q "SELECT count(*) FROM states WHERE label = 'trial-$trial'")
	if [ "$n" = 1 ]; then
		whole=$(q "SELECT (SELECT count(*) FROM state_files sf JOIN states s ON s.id = sf.state_id WHERE s.label = 'trial-$trial') = 1
			AND (SELECT count(*) FROM tensors t JOIN state_files sf ON sf.file_id = t.file_id JOIN states s ON s.id = sf.state_id WHERE s.label = 'trial-$trial') = 3000
			AND (SELECT count(*) FROM log l JOIN states s ON s.digest = l.subject WHERE s.label = 'trial-$trial' AND l.action = 'add') = 1")
		[ "$whole" = 1 ] && ok || bad "trial $trial: state recorded in part"
	else
		[ "$(q "SELECT count(*) FROM files WHERE path LIKE '%/k$trial.safetensors'")" = 0 ] && ok ||
			bad "trial $trial: files of an unrecorded state left behind"
		rm -f "$f"
	fi
	trial=$((trial + 1))
done
echo "msinv_concurrency: $killed of 20 adds killed, $(q 'SELECT count(*) FROM states') recorded whole"
# every recorded state verifies against the bytes on disk
"$B" ls --json >"$W/ls.json"
python3 - "$B" "$W/ls.json" <<'EOF' >"$W/verify.out" 2>&1
import hashlib, json, subprocess, sys
b, ls = sys.argv[1], json.load(open(sys.argv[2]))
bad = 0
for s in ls:
    show = json.loads(subprocess.check_output([b, "show", "--tensors", "--json", s["state"]]))
    lines = []
    for f in show["files"]:
        data = open(f["path"], "rb").read()
        for t in f["tensors"]:
            d = hashlib.sha256(data[t["offset"]:t["offset"] + t["bytes"]]).hexdigest()
            if d != t["sha256"]:
                print("tensor", t["name"], "of", s["state"], "does not verify"); bad += 1
            lines.append("%s\t%s\t[%s]\t%s\n" % (t["name"], t["dtype"], ",".join(map(str, t["shape"])), d))
    lines.sort(key=lambda l: l.split("\t")[0].encode())
    m = "msinv-state-v1\n" + "".join(lines)
    if "sha256:" + hashlib.sha256(m.encode()).hexdigest() != s["state"]:
        print("state", s["state"], "does not verify"); bad += 1
print("verified", len(ls), "states")
sys.exit(1 if bad else 0)
EOF
if [ $? -eq 0 ]; then ok; else bad "recorded states verify"; cat "$W/verify.out"; fi

echo "msinv_concurrency: $pass passed, $fail failed"
[ $fail -eq 0 ]
