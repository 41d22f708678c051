#!/usr/bin/env python3
"""Build the tiny PEFT LoRA fixtures under tests/fixtures/peft/ with the
ecosystem's own libraries (torch, transformers, peft, safetensors) and
random weights, each with PEFT's own per-expert deltas as the truth file.

  qwen3moe-E6-r3          transformers >= 5 (fused experts): Qwen3-MoE with
                          6 experts, LoRA r=3 on q_proj/v_proj (target_modules)
                          and on the fused expert parameters (target_parameters),
                          layer 1's down_proj at r=2 through rank_pattern.
  mixtral-perexpert-E6-r3 transformers < 5 (one module per expert): Mixtral
                          with 6 experts, LoRA r=3 on q_proj/v_proj and on
                          every expert's w1/w2/w3 (target_modules).

Each fixture directory holds base/ (save_pretrained, bf16), adapter/
(PEFT save_pretrained), peft_delta_truth.safetensors and a README.md. Truth
keys are "<module path>::<parameter name>"; values are PEFT's
get_delta_weight (scaling included), float32: [E, out, in] for a fused
wrapper, [out, in] for a per-expert module.

A fixture needs its transformers generation, so run the script once in an
environment of each (it builds what its transformers can and says what it
skipped):
  python3 -m venv /some/venv && /some/venv/bin/pip install torch transformers peft safetensors
  /some/venv/bin/python tests/gen/gen_peft_fixtures.py --out tests/fixtures/peft

PEFT wraps a module's parameters in the order the module declares them
(gate_up_proj innermost), and saves target_parameters from a set, so their
saved order depends on the string hash seed. The script pins
PYTHONHASHSEED (re-executing itself) to a seed whose saved order is the
REVERSE of the nesting: readers that trust that order get caught.
"""
import argparse
import json
import os
import shutil
import sys

HASH_SEED = "1"

if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
    os.environ["PYTHONHASHSEED"] = HASH_SEED
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

E = 6
R = 3
ALPHA = 5
SEED = 1234


def versions():
    return "torch %s, transformers %s, peft %s" % (
        torch.__version__.split("+")[0], transformers.__version__, peft.__version__)


def major(v):
    return int(v.split(".")[0])


def fresh(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def save_base(model, path):
    base = model.to(torch.bfloat16)
    base.save_pretrained(path)
    model.to(torch.float32)


def save_adapter(pm, path):
    pm.save_pretrained(path)
    # PEFT writes a model card; the fixture keeps only what loaders read
    card = os.path.join(path, "README.md")
    if os.path.exists(card):
        os.remove(card)


def truth_of(pm, want):
    out = {}
    for name, mod in pm.named_modules():
        if not want(name, mod):
            continue
        pname = getattr(mod, "parameter_name", None) or "weight"
        with torch.no_grad():
            out["%s::%s" % (name, pname)] = mod.get_delta_weight("default").float().contiguous()
    return out


def readme(path, title, body):
    with open(os.path.join(path, "README.md"), "w") as f:
        f.write("# %s\n\n%s\n\nMade by tests/gen/gen_peft_fixtures.py with %s.\n"
                % (title, body.strip(), versions()))


def qwen3moe_fused(out):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(SEED)
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         moe_intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         num_experts=E, num_experts_per_tok=2, max_position_embeddings=64)
    model = Qwen3MoeForCausalLM(cfg).float()
    d = os.path.join(out, "qwen3moe-E6-r3")
    fresh(d)
    save_base(model, os.path.join(d, "base"))
    lcfg = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=["q_proj", "v_proj"],
                      target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                      rank_pattern={"model.layers.1.mlp.experts.down_proj": 2},
                      init_lora_weights=False)
    pm = get_peft_model(model, lcfg)
    save_adapter(pm, os.path.join(d, "adapter"))
    truth = truth_of(pm, lambda n, m: hasattr(m, "parameter_name"))
    save_file(truth, os.path.join(d, "peft_delta_truth.safetensors"))
    with open(os.path.join(d, "adapter", "adapter_config.json")) as f:
        order = json.load(f)["target_parameters"]
    nesting = "\n".join("- `%s` adapts `%s`" % tuple(k.split("::")) for k in sorted(truth))
    readme(d, "qwen3moe-E6-r3", """
A tiny Qwen3-MoE (2 layers, hidden 32, expert intermediate 16, %d experts,
fused 3-D experts in memory, per-expert tensors in base/) with a PEFT LoRA
adapter: r=%d, lora_alpha=%d on q_proj and v_proj (target_modules) and on the
fused expert parameters (target_parameters), with rank_pattern giving
layer 1's down_proj r=2. E=%d is not a power of two and r=%d differs from E.

The adapter's target_parameters are saved in the order
%s, the reverse of PEFT's
nesting (innermost = the parameter the module declares first):

%s

So neither the names nor that order say which parameter a fused LoRA pair
adapts; the shapes and the declaration order do.

peft_delta_truth.safetensors: for each fused wrapper, PEFT's own
get_delta_weight, [E, out, in] float32, scaling included; keys are
"<module path>::<parameter name>".
""" % (E, R, ALPHA, E, R, order, nesting))
    print("wrote %s (target_parameters saved as %s)" % (d, order))


def mixtral_per_expert(out):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(SEED)
    cfg = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=16,
                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=16, num_local_experts=E, num_experts_per_tok=2,
                        max_position_embeddings=64)
    model = MixtralForCausalLM(cfg).float()
    d = os.path.join(out, "mixtral-perexpert-E6-r3")
    fresh(d)
    save_base(model, os.path.join(d, "base"))
    lcfg = LoraConfig(r=R, lora_alpha=ALPHA,
                      target_modules=["q_proj", "v_proj", "w1", "w2", "w3"],
                      init_lora_weights=False)
    pm = get_peft_model(model, lcfg)
    save_adapter(pm, os.path.join(d, "adapter"))
    truth = truth_of(pm, lambda n, m: ".experts." in n and hasattr(m, "lora_A")
                     and hasattr(m, "get_delta_weight"))
    save_file(truth, os.path.join(d, "peft_delta_truth.safetensors"))
    readme(d, "mixtral-perexpert-E6-r3", """
A tiny Mixtral (2 layers, hidden 32, expert intermediate 16, %d experts, one
module per expert: block_sparse_moe.experts.<e>.w1/w2/w3) with a PEFT LoRA
adapter: r=%d, lora_alpha=%d on q_proj, v_proj and every expert's w1, w2, w3
(target_modules), so each expert has its own lora_A [r, in] and lora_B
[out, r].

peft_delta_truth.safetensors: for each expert module, PEFT's own
get_delta_weight, [out, in] float32, scaling included; keys are
"<module path>::weight".
""" % (E, R, ALPHA))
    print("wrote %s" % d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/fixtures/peft",
                    help="directory that receives the fixture directories")
    ap.add_argument("--which", default="all",
                    choices=["all", "qwen3moe-E6-r3", "mixtral-perexpert-E6-r3"])
    args = ap.parse_args()
    fused = major(transformers.__version__) >= 5
    made = 0
    if args.which in ("all", "qwen3moe-E6-r3"):
        if fused:
            qwen3moe_fused(args.out)
            made += 1
        else:
            print("skipped qwen3moe-E6-r3: needs transformers >= 5 (fused experts), have %s"
                  % transformers.__version__)
    if args.which in ("all", "mixtral-perexpert-E6-r3"):
        if not fused:
            mixtral_per_expert(args.out)
            made += 1
        else:
            print("skipped mixtral-perexpert-E6-r3: needs transformers < 5 (one module per "
                  "expert), have %s" % transformers.__version__)
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
