#!/bin/sh
# footprint_big.sh: plan a 700B-class MoE run from headers alone.
#
# tests/gen/make_sparse_ckpt.py writes a 688B-parameter checkpoint (60
# layers x 256 experts x 3 projections of 2048 x 7168, bf16, 61 shards and
# an index) whose data are holes, so it costs a few MB of disk. The planner
# (through a small C driver over libms, and through `msinv footprint` when
# that command exists) must read only the headers, answer in seconds, and
# give the per-GPU bytes that the arithmetic below (python3, from the model's
# dimensions, independent of the library) gives, for nvfp4-both against
# nvfp4-ondemand at EP 8 and 64, both placements, a base named twice, and
# fused 3-D experts (quantized per expert, as msconvert writes them by
# default: the same bytes as the per-expert model).
MS_BUILD=${MS_BUILD:-build}
MS_ROOT=${MS_ROOT:-.}
name=footprint_big
. "$(dirname "$0")/lib.sh"
tmp=$W
finish() { echo "$name: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit $?; }

CC=${CC:-cc}
# make check-asan builds libms with clang's sanitizers: the driver must link
# the same runtime
SAN=
if [ "${MS_SANITIZED:-}" = 1 ]; then
	command -v clang >/dev/null 2>&1 && CC=clang
	SAN="-fsanitize=address,undefined"
fi
if ! command -v python3 >/dev/null 2>&1 || ! command -v "$CC" >/dev/null 2>&1; then
	echo "$name: skipped (needs python3 and a C compiler)" >&2
	finish
fi
if [ ! -f "$MS_BUILD/libms.a" ]; then
	bad "missing $MS_BUILD/libms.a (run make)"
	finish
fi

# ---- the driver: plan file in, report out, the tool's exit statuses -------------
cat >"$tmp/fpdrv.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include "ms.h"
#include "footprint.h"

int main(int argc, char **argv)
{
	struct ms_fp_plan *p = NULL;
	struct ms_fp_calc *c = NULL;
	struct ms_fp_report *r = NULL;
	struct ms_err err = { 0, "" };
	struct ms_buf b;
	int rc, json = argc > 2 && !strcmp(argv[2], "--json"), status;

	ms_buf_init(&b);
	if (argc < 2) {
		fprintf(stderr, "usage: fpdrv PLAN [--json]\n");
		return 2;
	}
	if ((rc = ms_fp_plan_load(argv[1], &p, &err)) != MS_OK ||
	    (rc = ms_fp_calc_new(p, &c, &err)) != MS_OK)
		goto out;
	for (size_t i = 0; i < p->nentries; i++)
		if ((rc = ms_fp_calc_add_path(c, i, &err)) != MS_OK)
			goto out;
	if ((rc = ms_fp_calc_finish(c, &r, &err)) != MS_OK ||
	    (rc = (json ? ms_fp_report_json : ms_fp_report_text)(r, &b, &err)) != MS_OK)
		goto out;
	fwrite(b.data, 1, b.len, stdout);
out:
	if (rc != MS_OK)
		fprintf(stderr, "fpdrv: %s\n", err.msg);
	status = rc != MS_OK ? ms_exit_code(rc) : r->over_budget ? 1 : 0;
	ms_buf_release(&b);
	ms_fp_report_free(r);
	ms_fp_calc_free(c);
	ms_fp_plan_free(p);
	return fflush(stdout) || ferror(stdout) ? 3 : status;
}
EOF
libs=$(pkg-config --libs sqlite3 libcrypto libcjson libarchive libzstd 2>/dev/null) ||
	libs="-lsqlite3 -lcrypto -lcjson -larchive -lzstd"
if "$CC" -std=c11 -D_GNU_SOURCE -O2 $SAN -I"$MS_ROOT/src" -o "$tmp/fpdrv" "$tmp/fpdrv.c" \
	"$MS_BUILD/libms.a" $libs -lpthread -lm 2>"$tmp/cc.err"; then
	ok
else
	bad "driver does not build against $MS_BUILD/libms.a: $(head -c 400 "$tmp/cc.err")"
	finish
fi

# ---- the checkpoints ------------------------------------------------------------
t0=$(date +%s)
for v in perexpert fused; do
	flag=""
	[ $v = fused ] && flag=--fused
	if python3 "$MS_ROOT/tests/gen/make_sparse_ckpt.py" --out "$tmp/$v" $flag \
		>"$tmp/$v.summary" 2>"$tmp/gen.err"; then
		ok
	else
		bad "make_sparse_ckpt $flag: $(head -c 400 "$tmp/gen.err")"
		finish
	fi
done
# 688B parameters, 1.376 TB of bf16 in 61 files, a few MB on disk
python3 - "$tmp/perexpert" "$tmp/perexpert.summary" >"$tmp/size.out" <<'EOF'
import json, os, sys
d, s = sys.argv[1], json.load(open(sys.argv[2]))
apparent = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
params = 60 * 256 * 3 * 2048 * 7168 + 60 * (2 * 7168 * 7168 + 2 * 1024 * 7168) \
    + 60 * 3 * 2048 * 7168 + 60 * 256 * 7168 + 2 * 129280 * 7168 + (2 * 60 + 1) * 7168
print("params %d apparent %d" % (s["parameters"], apparent))
assert s["parameters"] == params and params > 680e9, (s["parameters"], params)
assert s["files"] == 61 and apparent >= 2 * params
EOF
if [ $? -eq 0 ]; then ok; else bad "checkpoint size: $(cat "$tmp/size.out")"; fi
kb=$(du -sk "$tmp/perexpert" | cut -f1)
if [ "$kb" -lt 32768 ]; then ok; else bad "sparse checkpoint takes $kb KB of disk (want < 32768)"; fi

# ---- the expectations, from the dimensions alone ------------------------------------
cat >"$tmp/expect.py" <<'EOF'
# Per-GPU bytes of the generated model, from its dimensions. NVFP4 of a
# matrix [r, c]: r * ceil(c/16) blocks of 16 elements, 8 packed bytes + 1
# scale byte each, + 4 bytes of tensor scale; columnwise quantizes [c, r].
import json, sys

L, E, H, I, KV, V, BF = 60, 256, 7168, 2048, 1024, 129280, 2
GIB = 1 << 30
BUDGET = 80

def nv(r, c, col):
    if col:
        r, c = c, r
    return r * ((c + 15) // 16) * 9 + 4

REP = [(H, H), (KV, H), (KV, H), (H, H), (I, H), (I, H), (H, I)]   # attn + shared
EXPERT = [(I, H), (I, H), (H, I)]
ASIS0 = (2 * V * H + (2 * L + 1) * H + L * E * H) * BF             # embed, head, norms, routers

def layer(ep, fused, col):
    """one layer's quantized bytes on one GPU; fused 3-D experts [E, 2I, H]
    and [E, H, I] count as msconvert --experts per-expert writes them: a
    gate, an up and a down module per expert, as in the per-expert model"""
    rep = sum(nv(r, c, col) for r, c in REP)
    return rep + E // ep * sum(nv(r, c, col) for r, c in EXPERT)

def bf16_layer(ep):
    return sum(r * c for r, c in REP) * BF + E // ep * sum(r * c for r, c in EXPERT) * BF

CASES = {
    # name: (model, ep, placement, states [(role, repr)])
    "both-ep8": ("perexpert", 8, "contiguous", [("base", "nvfp4-both")]),
    "ondemand-ep8": ("perexpert", 8, "contiguous", [("base", "nvfp4-ondemand")]),
    "both-ep64": ("perexpert", 64, "round-robin", [("base", "nvfp4-both")]),
    "ondemand-ep64": ("perexpert", 64, "contiguous", [("base", "nvfp4-ondemand")]),
    "rowwise-ep8": ("perexpert", 8, "round-robin", [("base", "nvfp4-rowwise")]),
    "asis-ep8": ("perexpert", 8, "contiguous", [("base", "as-is")]),
    "twice-ep8": ("perexpert", 8, "contiguous",
                  [("base", "nvfp4-rowwise"), ("base_colwise", "nvfp4-columnwise")]),
    "fused-both-ep64": ("fused", 64, "contiguous", [("base", "nvfp4-both")]),
    "fused-ondemand-ep8": ("fused", 8, "round-robin", [("base", "nvfp4-ondemand")]),
}

def expect(case):
    model, ep, placement, states = CASES[case]
    fused = model == "fused"
    row, col = L * layer(ep, fused, 0), L * layer(ep, fused, 1)
    peak = layer(ep, fused, 1)           # every layer is the same size
    nweights = L * (len(REP) + (2 if fused else 3 * E))
    ASIS = ASIS0
    reprs = [r for _, r in states]
    if reprs == ["nvfp4-both"]:
        total, od, dupw = ASIS + row + col, ASIS + row + peak, nweights
    elif reprs == ["nvfp4-ondemand"]:
        total, od, dupw = ASIS + row + peak, ASIS + row + peak, 0
    elif reprs == ["nvfp4-rowwise"]:
        total, od, dupw = ASIS + row, ASIS + row, 0
    elif reprs == ["as-is"]:
        total = ASIS + L * bf16_layer(ep)
        od, dupw = total, 0
    else:   # the base named twice: both states carry the bf16 leftovers too
        total, od = 2 * ASIS + row + col, 2 * ASIS + row + peak
        dupw = nweights + 3 * L + 3   # + 2 norms and a router per layer, embed, norm, head
    rows = {}
    if "nvfp4-both" in reprs or "nvfp4-rowwise" in reprs or "nvfp4-ondemand" in reprs:
        rows[("base", "nvfp4-rowwise")] = row
    if "nvfp4-both" in reprs:
        rows[("base", "nvfp4-columnwise")] = col
    if "nvfp4-ondemand" in reprs:
        rows[("base", "nvfp4-columnwise-transient")] = peak
    if "nvfp4-columnwise" in reprs:
        rows[("base_colwise", "nvfp4-columnwise")] = col
    return dict(total=total, ondemand=od, dupw=dupw, rows=rows,
                over=total > BUDGET * GIB)

if sys.argv[1] == "plan":
    case, d = sys.argv[2], sys.argv[3]
    model, ep, placement, states = CASES[case]
    print(json.dumps({"name": case, "ep_size": ep, "placement": placement,
                      "budget_gib": BUDGET, "outputs": d + "/runs/" + case,
                      "states": [{"role": ro, "path": model, "repr": re}
                                 for ro, re in states]}))
elif sys.argv[1] == "cases":
    print(" ".join(CASES))
elif sys.argv[1] == "status":
    print(1 if expect(sys.argv[2])["over"] else 0)
elif sys.argv[1] == "check":
    case, got = sys.argv[2], json.load(open(sys.argv[3]))
    want, errs = expect(case), []
    def cmp(what, g, w):
        if g != w:
            errs.append("%s: got %s, want %s (%+d)" % (what, g, w, (g or 0) - w))
    cmp("total_bytes_per_gpu", got.get("total_bytes_per_gpu"), want["total"])
    if sys.argv[4:] != ["total-only"]:
        cmp("ondemand.total_bytes_per_gpu", got["ondemand"]["total_bytes_per_gpu"],
            want["ondemand"])
        cmp("duplicate_weights", got["duplicate_weights"], want["dupw"])
        cmp("over_budget", got["over_budget"], want["over"])
        rows = {(r["role"], r["layout"]): r["bytes_per_gpu"] for r in got["rows"]}
        for k, v in want["rows"].items():
            cmp("row %s %s" % k, rows.get(k), v)
    print("; ".join(errs) if errs else "ok")
    sys.exit(1 if errs else 0)
EOF

# ---- each plan: right numbers, right exit status, in seconds --------------------------
for case in $(python3 "$tmp/expect.py" cases); do
	python3 "$tmp/expect.py" plan "$case" "$tmp" >"$tmp/$case.json"
	want=$(python3 "$tmp/expect.py" status "$case")
	s=$(date +%s)
	"$tmp/fpdrv" "$tmp/$case.json" --json >"$tmp/$case.out" 2>"$tmp/$case.err"
	rc=$?
	e=$(( $(date +%s) - s ))
	if [ "$rc" -ne "$want" ]; then
		bad "$case: exit $rc, want $want: $(head -c 300 "$tmp/$case.err")"
		continue
	fi
	if res=$(python3 "$tmp/expect.py" check "$case" "$tmp/$case.out" 2>&1); then
		ok
	else
		bad "$case: $res"
	fi
	if [ "$e" -le 10 ]; then ok; else bad "$case: took $e s (want <= 10)"; fi
done

# the text report says what the JSON says
"$tmp/fpdrv" "$tmp/both-ep8.json" >"$tmp/both.txt" 2>&1
if grep -q "^duplicate: 46500 weights resident 2 times (base nvfp4-rowwise, base nvfp4-columnwise)" "$tmp/both.txt" &&
	grep -q "over by" "$tmp/both.txt"; then
	ok
else
	bad "text report: $(head -c 600 "$tmp/both.txt")"
fi

# reading the plan took only headers: the checkpoint is still all holes
kb2=$(du -sk "$tmp/perexpert" | cut -f1)
if [ "$kb2" -le "$kb" ]; then ok; else bad "disk use grew from $kb to $kb2 KB"; fi

# ---- the same through the tool, once it has the command ---------------------------
if [ -x "$MS_BUILD/msinv" ] && "$MS_BUILD/msinv" footprint --help >/dev/null 2>&1; then
	for case in both-ep8 ondemand-ep8 both-ep64; do
		want=$(python3 "$tmp/expect.py" status "$case")
		"$MS_BUILD/msinv" footprint "$tmp/$case.json" --json >"$tmp/$case.tool" 2>"$tmp/$case.terr"
		rc=$?
		if [ "$rc" -ne "$want" ]; then
			bad "msinv footprint $case: exit $rc, want $want: $(head -c 300 "$tmp/$case.terr")"
		elif res=$(python3 "$tmp/expect.py" check "$case" "$tmp/$case.tool" total-only 2>&1); then
			ok
		else
			bad "msinv footprint $case: $res"
		fi
	done
else
	echo "$name: msinv footprint not built yet; checked the library only" >&2
fi
t1=$(date +%s)
if [ $((t1 - t0)) -le 60 ]; then ok; else bad "whole script took $((t1 - t0)) s"; fi
finish
