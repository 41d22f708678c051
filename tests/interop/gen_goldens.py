"""Quantize one fixture with a real producer, through its own entry points,
on the CPU. Run inside that producer's venv (gen_goldens.sh makes them).

  gen_goldens.py ct SRC OUT   llm-compressor: oneshot with the NVFP4A16
                              scheme (weights only, no calibration data),
                              then save_pretrained(save_compressed=True)
  gen_goldens.py mo SRC OUT   Model Optimizer: mtq.quantize with
                              W4A16_NVFP4 (NVFP4 weights, activations
                              left alone), then export_hf_checkpoint

Both quantize what msconvert quantizes by default: every Linear but
lm_head and the MoE routers (mlp.gate, block_sparse_moe.gate).
"""
import sys

import torch
from transformers import AutoModelForCausalLM

ROUTERS = ["re:.*mlp\\.gate$", "re:.*block_sparse_moe\\.gate$"]


def load(src):
    return AutoModelForCausalLM.from_pretrained(src, dtype="auto", device_map="cpu")


def run_ct(src, out):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model = load(src)
    recipe = QuantizationModifier(targets="Linear", scheme="NVFP4A16",
                                  ignore=["lm_head"] + ROUTERS)
    oneshot(model=model, recipe=recipe)
    model.save_pretrained(out, save_compressed=True)


def run_mo(src, out):
    import copy

    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    model = load(src)
    # the stock config: its disabled quantizers already include lm_head and
    # the routers (*mlp.gate.*, *block_sparse_moe.gate*)
    cfg = copy.deepcopy(mtq.W4A16_NVFP4_CFG)
    # weights only: the calibration pass just runs the model once so that
    # the weight quantizers see their tensors
    ids = torch.arange(16).reshape(1, 16) % model.config.vocab_size

    def forward(m):
        with torch.no_grad():
            m(ids)

    mtq.quantize(model, cfg, forward)
    export_hf_checkpoint(model, export_dir=out)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("ct", "mo"):
        sys.exit(__doc__)
    {"ct": run_ct, "mo": run_mo}[sys.argv[1]](sys.argv[2], sys.argv[3])


if __name__ == "__main__":
    main()
