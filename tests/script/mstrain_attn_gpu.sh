#!/bin/sh
# mstrain_attn_gpu.sh (make test-gpu): the attention choices of `mstrain
# --device cuda` end to end, under msinv launch, on the bundled Qwen3-MoE's
# NVFP4 copy: --attention cudnn and flash train the same plan; each run's
# profile names the attention it ran (cuDNN with its version); auto runs
# cuDNN's where it loads, bit for bit the cudnn run (the same kernels);
# cuDNN's losses are flash's to bf16 rounding (cuDNN rounds its outputs to
# bf16, and sums in another order); with cuDNN, columnwise on demand saves
# the resident run's adapter byte for byte (cuDNN's deterministic
# backward), and the decode ahead the bits of a decode in line (MS_DECODE_AHEAD=0);
# MS_PROFILE_SITES trains the same and its profile's sites add
# up to the phases. Skipped without a GPU; where cuDNN does not load, auto is
# checked to fall back to flash and to say why, and --attention cudnn to
# be refused with exit 3.
. "$(dirname "$0")/lib.sh"
nvidia-smi -L >/dev/null 2>&1 || skip "no GPU"
export MSINV_DB="$W/inv.db"

# the profile's FIELD
pfield() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$1" "$2"; }

FXA=$(cd "$FX" && pwd)
base=$FXA/train/qwen3moe/base
[ -d "$base" ] || base=$FXA/hf/qwen3moe
cd "$W" || exit 3
cp -r "$base" base && cp -r "$FXA/train/qwen3moe/quant" quant || exit 3
expect 0 msinv init
for s in base quant; do expect 0 msinv add --label "$s" "$s"; done

run() { # NAME [mstrain options]
	n=$1
	shift
	gpu_plan "$n.json" base quant
	msinv launch --plan "$n.json" -- mstrain train --plan "$n.json" --device cuda \
		--metrics "m-$n.jsonl" --profile "p-$n.json" "$@" >"$W/out" 2>"$W/err"
}

run auto
rc=$?
if [ $rc -ne 0 ]; then
	bad "auto: exit $rc"
	cat "$W/err"
fi
if ! pfield p-auto.json attention | grep -q '^cudnn 9\.'; then
	# no cuDNN here: auto must have said why and run flash; cudnn is refused
	[ "$(pfield p-auto.json attention)" = flash ] && ok || bad "auto without cuDNN did not run flash"
	[ -n "$(pfield p-auto.json attention_no_cudnn)" ] && ok || bad "auto without cuDNN said no reason"
	expect 3 msinv launch --plan auto.json -- mstrain train --plan auto.json --device cuda \
		--attention cudnn
	has "attention cudnn" "$W/err" "--attention cudnn without cuDNN"
	echo "$t_name: cuDNN does not load here: $(pfield p-auto.json attention_no_cudnn)"
	echo "$t_name: $pass passed, $fail failed"
	[ "$fail" -eq 0 ]
	exit
fi
ok
expect 0 run cudnn --attention cudnn
expect 0 run flash --attention flash
expect 0 run ondemand --attention cudnn --colwise on-demand
case $(pfield p-cudnn.json attention) in "cudnn 9."*) ok ;; *) bad "cudnn: the profile names '$(pfield p-cudnn.json attention)'" ;; esac
[ "$(pfield p-flash.json attention)" = flash ] && ok || bad "flash: the profile names '$(pfield p-flash.json attention)'"
[ "$(wc -l <m-cudnn.jsonl)" -eq 6 ] && ok || bad "cudnn: not 6 steps of metrics"
losses m-auto.jsonl >l-auto
losses m-cudnn.jsonl >l-cudnn
losses m-ondemand.jsonl >l-ondemand
cmp -s l-auto l-cudnn && ok || bad "auto and cudnn trained differently"
cmp -s l-cudnn l-ondemand && ok || bad "cudnn: on-demand and resident losses differ"
cmp -s runs/cudnn/step-000006/adapter/adapter_model.safetensors \
	runs/ondemand/step-000006/adapter/adapter_model.safetensors && ok ||
	bad "cudnn: on-demand and resident saved different adapters"
# the decode ahead (the default where there is more than one layer): each
# layer's weights decoded on a stream of their own while the layer before
# runs; MS_DECODE_AHEAD=0 decodes in line: the same bits, and a profile
# with no phase on that stream
export MS_DECODE_AHEAD=0
expect 0 run inline --attention cudnn --colwise on-demand
unset MS_DECODE_AHEAD
losses m-inline.jsonl >l-inline
cmp -s l-ondemand l-inline && ok || bad "the decode ahead and in line trained differently"
cmp -s runs/ondemand/step-000006/adapter/adapter_model.safetensors \
	runs/inline/step-000006/adapter/adapter_model.safetensors && ok ||
	bad "the decode ahead and in line saved different adapters"
[ "$(pfield p-ondemand.json colwise_stream)" = decode ] &&
	[ "$(pfield p-inline.json colwise_stream)" = main ] && ok ||
	bad "the transposes' stream: '$(pfield p-ondemand.json colwise_stream)' ahead, '$(pfield p-inline.json colwise_stream)' in line"
python3 -c '
import json, sys
a, b = (json.load(open(f))["kernels"] for f in sys.argv[1:3])
side = {k["name"] for k in a if k.get("stream") == "decode"}
print("decode stream phases: %s" % ", ".join(sorted(side)))
sys.exit(not ({"columnwise transpose (on demand, decode stream)",
               "decode NVFP4 rowwise (decode stream)",
               "decode NVFP4 columnwise (decode stream)"} <= side and
              any(k["name"] == "wait for the decode stream" for k in a) and
              all(k.get("stream") == "main" for k in b) and
              not any(k["name"] == "wait for the decode stream" for k in b)))
' p-ondemand.json p-inline.json && ok || bad "the decode stream's phases in the profiles"
python3 -c '
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
d = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print("cudnn vs flash: losses within %.3g relative" % d)
sys.exit(d > 1e-2)' m-cudnn.jsonl m-flash.jsonl && ok ||
	bad "cudnn and flash losses differ by more than bf16 rounding"

# MS_PROFILE_SITES: the same training, and the profile's time by launch
# site adding up to its time by phase, naming cuDNN's calls, GEMM shapes
# and the trainer's own launches; absent without it. The profile is over
# the 4 steps after the 2 of warm-up; MS_PROFILE_TIMELINE writes the third
# step's events, the GPU's never before the host's; each site's GPU idle
# within its time
export MS_PROFILE_SITES=1 MS_PROFILE_TIMELINE=$W/timeline.tsv
expect 0 run sites --attention cudnn
unset MS_PROFILE_SITES MS_PROFILE_TIMELINE
[ "$(pfield p-sites.json steps)" = 4 ] && [ "$(pfield p-sites.json warmup_steps_left_out)" = 2 ] &&
	ok || bad "the profile is not over the 4 steps after the warm-up's 2"
python3 -c '
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
h = [float(r[1]) for r in rows]
g = [float(r[2]) for r in rows]
print("timeline: %d events, %.3f ms on the host, %.3f on the GPU" % (len(rows), h[-1], g[-1]))
sys.exit(not (len(rows) > 100 and h == sorted(h) and g == sorted(g) and
              all(y >= x - 1e-3 for x, y in zip(h, g)) and all(r[4] for r in rows[1:])))
' "$W/timeline.tsv" && ok || bad "MS_PROFILE_TIMELINE: no step of events, or the GPU before the host"
python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["sites"]
sys.exit(not (s and all(0 <= x["idle_ms"] <= x["ms"] + 1e-6 and x["host_ms"] >= 0 for x in s)))
' p-sites.json && ok || bad "a site whose GPU idle is not within its time"
losses m-sites.jsonl >l-sites
cmp -s l-cudnn l-sites && ok || bad "MS_PROFILE_SITES changed the training"
python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
s, k = p.get("sites", []), p["kernels"]
# the phases of the decode stream run beside the launches of the main one
ts = sum(x["ms"] for x in s)
tk = sum(x["ms"] for x in k if x.get("stream", "main") == "main")
names = " ".join(x["site"] for x in s)
print("sites: %d, %.3f ms a step against the phases %.3f" % (len(s), ts, tk))
sys.exit(not (s and abs(ts - tk) <= 0.01 * tk and "cuDNN SDPA forward" in names and
              "cuDNN SDPA backward" in names and "GEMM " in names and "train.cu:" in names))
' p-sites.json && ok || bad "MS_PROFILE_SITES: the sites do not add up to the phases or miss a kind"
# the folded gate/up LoRA's dU and gB from one pass (fold_du_gb), not the
# two launches it falls back to where a shape is not covered
python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["sites"]
sys.exit(not any(x["site"] == "grouped weight gradient with dU (bf16)" for x in s))
' p-sites.json && ok || bad "MS_PROFILE_SITES: no launch of gate/up's dU with gB (fold_du_gb fell back)"
[ -z "$(pfield p-cudnn.json sites)" ] && ok || bad "a profile without MS_PROFILE_SITES lists sites"

echo "$t_name: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
