#!/bin/sh
# rl_ablation_gpu.sh: the GPU regulariser ablation of RL-ABLATION-GPU.md.
# In OUT: a generated Qwen3-MoE-shaped model (gen_train_model.py: hidden
# 1024, 8 layers, 8 heads / 2 KV heads of 128, 32 experts top-4, expert
# ffn 512, vocabulary 256 so that the synthetic tasks' symbols are drawn
# often enough to be rewarded; 0.42 B parameters), its NVFP4 copy
# (msconvert on the GPU, 2D blocks), then rl_ablation.sh's runs with
# device=cuda on it (bf16 GEMMs, rollouts decoded on the device), the
# table on standard output and each run's metrics in OUT/runs.
#
#   BUILD=dir sh tools/bench/rl_ablation_gpu.sh OUT [STEPS]
#
# PYTHON: an interpreter with torch and transformers (default python3).
# LRS: the learning rates (default "1e-3 3e-3": this model's LoRA moves
# its logits far more per step than the bundled one's, and at 1e-2 with
# temperature 0.25 the policy turns deterministic within 5 steps).
set -eu
out=${1:?usage: rl_ablation_gpu.sh OUT [STEPS]}
steps=${2:-120}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$root/$build;; esac
PY=${PYTHON:-python3}
mkdir -p "$out"
if [ ! -f "$out/model/config.json" ]; then
	"$PY" "$root/tools/bench/gen_train_model.py" "$out/model" --hidden 1024 --layers 8 \
		--heads 8 --kv-heads 2 --head-dim 128 --experts 32 --top-k 4 --moe-inter 512 \
		--vocab 256 --max-pos 256 >&2
fi
if [ ! -d "$out/quant" ]; then
	"$build/msconvert" quantize "$out/model" -o "$out/quant" --block 2d --layout rowwise \
		--device cuda >&2
fi
# (the curves are drawn apart: the interpreter with torch need not have
# matplotlib)
PYTHON= LRS=${LRS:-1e-3 3e-3} BUILD=$build sh "$root/tools/bench/rl_ablation.sh" "$out/runs" "$steps" \
	model="$out/model" quant="$out/quant" device=cuda temp=1.0
