#!/bin/sh
# train_peft_gpu.sh (make test-gpu): an adapter trained by
# `mstrain --device cuda` under msinv launch loads in PEFT on the GPU and
# gives our model's logits: mstrain trains the bundled Qwen3-MoE on its
# NVFP4 copy for a few steps; t_train_gpu --peft-logits writes the logits
# of the GPU model warm-started from that checkpoint's adapter/;
# tests/oracle/peft_logits.py decodes the same NVFP4 state in Python into
# transformers, loads the adapter with peft.PeftModel.from_pretrained and
# compares (float32 both, 1e-4). Skipped without a GPU or without torch,
# transformers and peft (MS_PYTHON, default python3).
. "$(dirname "$0")/lib.sh"
nvidia-smi -L >/dev/null 2>&1 || skip "no GPU"
PY=${MS_PYTHON:-python3}
"$PY" -c 'import torch, transformers, peft' 2>/dev/null || skip "$PY cannot import torch, transformers and peft"
FXA=$(cd "$FX" && pwd)
ROOTA=$(cd "$ROOT" && pwd)
BA=$(cd "$B" && pwd)
base=$FXA/train/qwen3moe/base
[ -d "$base" ] || base=$FXA/hf/qwen3moe
export MSINV_DB="$W/inv.db"
cd "$W" || exit 3
cp -r "$base" base && cp -r "$FXA/train/qwen3moe/quant" quant || exit 3
expect 0 msinv init
expect 0 msinv add --label base base
expect 0 msinv add --label quant quant
cat >plan.json <<'P'
{"ep_size": 1, "outputs": "runs/peft",
 "states": [{"role": "base", "state": "base"}, {"role": "quantized", "state": "quant"}],
 "train": {"lora": {"r": 4, "alpha": 8,
                    "targets": ["experts", "q_proj", "k_proj", "v_proj", "o_proj"]},
           "optimizer": {"lr": 1e-2, "weight_decay": 0.0, "clip": 1.0, "warmup": 0},
           "batch": 4, "seq_len": 16, "steps": 4, "seed": 1,
           "data": {"task": "copy"}, "checkpoint_every": 0, "label": "peft"}}
P
expect 0 msinv launch --plan plan.json -- mstrain train --plan plan.json --device cuda --gpu-f32
ad=runs/peft/step-000004/adapter
[ -f "$ad/adapter_model.safetensors" ] && [ -f "$ad/adapter_config.json" ] && ok ||
	bad "no PEFT adapter in $ad"
MS_FIXTURES=$FXA
export MS_FIXTURES
expect 0 "$BA/tests/t_train_gpu" --peft-logits "$ad" ours.f32
expect 0 "$PY" "$ROOTA/tests/oracle/peft_logits.py" base quant "$ad" ours.f32 2 16
cat "$W/out"
echo "$t_name: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
