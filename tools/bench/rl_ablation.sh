#!/bin/sh
# rl_ablation.sh: the CPU regulariser ablation of RL-ABLATION.md. Runs
# build/bench/rl_ablation (GRPO on the bundled qwen3moe checkpoint, copy
# task) for each regulariser setting x two learning rates x two seeds,
# writes each run's metrics to OUT/<name>.jsonl and prints the markdown
# table; with PYTHON (a python with matplotlib) it draws OUT/curves.png.
#
#   sh tools/bench/rl_ablation.sh OUT [STEPS [KEY=VALUE ...]]
#
# KEY=VALUE pairs go to every run (rl_ablation.c's keys: model=, quant=,
# device=cuda, r=, ... for the GPU ablation of RL-ABLATION-GPU.md);
# BUILD (default build) is where bench/rl_ablation is; LRS the learning
# rates (default "1e-2 3e-2"; the curves take the last and the first).
set -eu
out=${1:?usage: rl_ablation.sh OUT [STEPS [KEY=VALUE ...]]}
steps=${2:-120}
[ $# -ge 2 ] && shift 2 || shift $#
extra="$*"
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$root/$build;; esac
bin=$build/bench/rl_ablation
lrs=${LRS:-1e-2 3e-2}
hi=${lrs##* }
lo=${lrs%% *}
mkdir -p "$out"
# the shared settings; the monitor's rule: regulariser share over 1 for 5 steps
common="steps=$steps temp=0.25 format=1 prompts=4 group=4 n=2 max_new=3 reg_share=1 window=5"
echo "| regulariser | lr | seed | reward, first 5 steps | reward, last 5 steps | steps to collapse (event) | events |"
echo "|---|---|---|---|---|---|---|"
for reg in none kl=5 kl=1 ent=1; do
	for lr in $lrs; do
		for seed in 0 1; do
			name=$(echo "$reg-lr$lr-seed$seed" | tr -d '=')
			set -- $common lr=$lr seed=$seed $extra
			[ "$reg" = none ] || set -- "$@" $reg
			res=$("$bin" "$root/tests/fixtures" "$out/$name.jsonl" "$@")
			first=$(echo "$res" | sed 's/.*first=\([^ ]*\).*/\1/')
			last=$(echo "$res" | sed 's/.*last=\([^ ]*\).*/\1/')
			coll=$(echo "$res" | sed 's/.*collapse_step=\([^ ]*\).*/\1/')
			ev=$(echo "$res" | sed 's/.*events=\([^ ]*\).*/\1/')
			[ "$coll" = 0 ] && coll=-
			echo "| $reg | $lr | $seed | $first | $last | $coll | $ev |"
		done
	done
done
if [ -n "${PYTHON:-}" ]; then
	"$PYTHON" "$root/tools/scripts/rl_curves.py" "$out/curves.png" \
		"$out/none-lr$hi-seed0.jsonl" "$out/kl5-lr$hi-seed0.jsonl" \
		"$out/kl5-lr$lo-seed1.jsonl" "$out/ent1-lr$hi-seed0.jsonl"
fi
