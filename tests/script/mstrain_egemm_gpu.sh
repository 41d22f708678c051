#!/bin/sh
# mstrain_egemm_gpu.sh (make test-gpu): the expert GEMM modes of
# `mstrain --device cuda` end to end, under msinv launch, on the bundled
# Qwen3-MoE's NVFP4 copy: per-expert, grouped and fused train the same
# plan; fused's losses, learning rates and gradient norms are grouped's
# bit for bit (the same bf16 weights through the same products), grouped's
# are per-expert's to float rounding (other summation orders); each run's
# profile names its mode; fused saves grouped's adapter, byte for byte
# (one state in the inventory);
# fused with columnwise on demand, and fused on a model whose sizes are not
# multiples of 32, are refused with exit 2 and the reason, nothing
# registered. Skipped without a GPU.
. "$(dirname "$0")/lib.sh"
nvidia-smi -L >/dev/null 2>&1 || skip "no GPU"
export MSINV_DB="$W/inv.db"


FXA=$(cd "$FX" && pwd)
base=$FXA/train/qwen3moe/base
[ -d "$base" ] || base=$FXA/hf/qwen3moe
cd "$W" || exit 3
cp -r "$base" base && cp -r "$FXA/train/qwen3moe/quant" quant &&
	cp -r "$FXA/train/qwen3moe-var/base" vbase && cp -r "$FXA/train/qwen3moe-var/quant" vquant ||
	exit 3
expect 0 msinv init
for s in base quant vbase vquant; do expect 0 msinv add --label "$s" "$s"; done

for m in per-expert grouped fused; do
	gpu_plan "$m.json" base quant
	expect 0 msinv launch --plan "$m.json" -- mstrain train --plan "$m.json" --device cuda \
		--expert-gemm "$m" --metrics "m-$m.jsonl" --profile "p-$m.json"
	python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["expert_gemm"] != sys.argv[2])' \
		"p-$m.json" "$m" && ok || bad "$m: the profile does not name the mode"
	[ "$(wc -l <"m-$m.jsonl")" -eq 6 ] && ok || bad "$m: not 6 steps of metrics"
done
losses m-grouped.jsonl >l-grouped
losses m-fused.jsonl >l-fused
cmp -s l-grouped l-fused && ok || bad "fused and grouped trained differently"
python3 -c '
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
d = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print("grouped vs per-expert: losses within %.3g relative" % d)
sys.exit(d > 1e-3)' m-per-expert.jsonl m-grouped.jsonl && ok ||
	bad "grouped and per-expert losses differ by more than float rounding"
# the same training makes the same adapter bytes: one state, registered by
# the grouped run and found again by the fused one
cmp -s runs/grouped/step-000006/adapter/adapter_model.safetensors \
	runs/fused/step-000006/adapter/adapter_model.safetensors && ok ||
	bad "fused and grouped saved different adapters"
[ "$(inv_query "SELECT COUNT(*) FROM states WHERE label = 'grouped-step6'")" = 1 ] && ok ||
	bad "the grouped run registered no adapter"

# refused at the build, one line, exit 2, nothing registered
n0=$(inv_query "SELECT COUNT(*) FROM states")
[ "$n0" -ge 5 ] && ok || bad "the inventory cannot be read ('$n0' states)"
gpu_plan od.json base quant
expect 2 msinv launch --plan od.json -- mstrain train --plan od.json --device cuda \
	--expert-gemm fused --colwise on-demand
has "colwise resident" "$W/err" "fused with columnwise on demand"
gpu_plan var.json vbase vquant
expect 2 msinv launch --plan var.json -- mstrain train --plan var.json --device cuda \
	--expert-gemm fused
has "multiples of 32" "$W/err" "fused on sizes that are not multiples of 32"
[ "$(inv_query "SELECT COUNT(*) FROM states")" = "$n0" ] && ok || bad "a refused run registered a state"
echo "$t_name: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
