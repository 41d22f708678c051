#!/usr/bin/env python3
"""The adapter mstrain trained, loaded by PEFT: its logits against ours.

    peft_logits.py BASE QUANT ADAPTER OURS.f32 BATCH SEQ [--device cuda]

BASE is the bf16 checkpoint, QUANT msconvert's NVFP4 (2D blocks) copy of it,
decoded here in Python (train_golden.py's decoder, independent of the C
codec) into a transformers model (float32, eager attention); ADAPTER is the
adapter/ directory of an mstrain checkpoint, loaded with
peft.PeftModel.from_pretrained as any PEFT adapter is. The ids are
(i * 131 + 7 + (i // SEQ) * 17) % vocab, the formula t_train_gpu uses;
OURS holds mstrain's model's float32 logits [BATCH, SEQ, vocab] for them.
Prints the largest difference; exit 0 when below 1e-4, 1 when not, 2 on a
bad input.
"""
import argparse
import os
import sys

import numpy as np
import torch
import transformers
import peft

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_golden import quant_modules, set_weights  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("quant")
    ap.add_argument("adapter")
    ap.add_argument("ours")
    ap.add_argument("batch", type=int)
    ap.add_argument("seq", type=int)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    # float32 products on the GPU, not TF32: the comparison is of functions
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = transformers.AutoModelForCausalLM.from_pretrained(
        a.base, dtype=torch.float32, attn_implementation="eager")
    n = set_weights(model, "", quant_modules(a.quant))
    pm = peft.PeftModel.from_pretrained(model, a.adapter).to(a.device).eval()
    V = model.config.vocab_size
    i = torch.arange(a.batch * a.seq)
    ids = ((i * 131 + 7 + (i // a.seq) * 17) % V).reshape(a.batch, a.seq)
    with torch.no_grad():
        lg = pm(input_ids=ids.to(a.device)).logits.float().cpu().numpy()
    ours = np.fromfile(a.ours, dtype="<f4")
    if ours.size != lg.size:
        print(f"peft_logits: {a.ours}: {ours.size} floats, PEFT gave {lg.size}", file=sys.stderr)
        return 2
    d = float(np.max(np.abs(ours.reshape(lg.shape) - lg)))
    lora = sum(1 for k, _ in pm.named_parameters() if "lora_" in k)
    print(f"peft_logits: {n} NVFP4 modules, {lora} LoRA tensors loaded by PEFT "
          f"{peft.__version__} (transformers {transformers.__version__}, torch "
          f"{torch.__version__}, {a.device}); logits max |ours - PEFT| {d:.3g}")
    return 0 if d < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
