#!/usr/bin/env python3
"""Golden values for the trainer's model: logits, loss and LoRA gradients
computed by transformers + PEFT (the versions pinned in
train_requirements.txt, CPU, float32, eager attention) on the dequantized
NVFP4 base, one directory per family under tests/fixtures/train/:

    base/      (glm4moe only: a tiny random checkpoint written by
                transformers' save_pretrained; the others use
                tests/fixtures/hf/<family>)
    quant/     the base quantized by msconvert (2D blocks), a different
               recipe/format per family
    adapter/   a PEFT LoRA adapter (attention target_modules + fused expert
               target_parameters) with random nonzero A and B, saved by
               PEFT's save_pretrained
    golden.safetensors
               ids [B, S] I32, mask [B, S] U8, logits [B, S, V] F32,
               loss_sum [1] F64 (sum of -log p over the masked-in labels),
               n_tokens [1] I64, and "grad:<PEFT key>" F32 for every LoRA
               tensor: d(loss_sum)/d(param)
    VERSIONS   (in tests/fixtures/train/) the library versions used

The NVFP4 weights are decoded here independently of the C codec: E2M1 code
table * E4M3 block scale (torch's float8_e4m3fn) * the tensor scale.

    train_golden.py --msconvert build/msconvert --out tests/fixtures/train
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import transformers
import peft
import safetensors
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAMILIES = {
    # name: (base dir, or the function that writes one, msconvert options)
    "qwen3moe": ("tests/fixtures/hf/qwen3moe", ["--recipe", "modelopt"]),
    "mixtral": ("tests/fixtures/hf/mixtral",
                ["--recipe", "compressed-tensors", "--format", "compressed-tensors"]),
    "glm4moe": ("make_glm", ["--recipe", "te"]),
    # the config branches the three above leave out
    "qwen3moe-var": ("make_qwen_var", ["--recipe", "te", "--format", "compressed-tensors"]),
    "glm4moe-var": ("make_glm_var", ["--recipe", "modelopt"]),
}

LUT = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6],
                   dtype=torch.float32)


def randomize_and_save(model, out, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.02 if p.dim() > 1 else 1.0)
                    + (1.0 if n.endswith("norm.weight") else 0.0))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.rand_like(b) * 0.1)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)


def make_qwen_var(out):
    """Qwen3-MoE with norm_topk_prob, a dense layer (mlp_only_layers), tied
    embeddings and attention biases."""
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=48, intermediate_size=40,
        moe_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, num_experts=6, num_experts_per_tok=3,
        norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1,
        attention_bias=True, tie_word_embeddings=True, rms_norm_eps=1e-6,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    torch.manual_seed(99)
    randomize_and_save(transformers.Qwen3MoeForCausalLM(cfg), out, 4321)


def make_glm_var(out):
    """GLM-4-MoE without norm_topk_prob, q/k norm or biases; one group,
    full rotary, two shared experts, no dense layer, tied embeddings."""
    cfg = transformers.Glm4MoeConfig(
        vocab_size=128, hidden_size=48, intermediate_size=64,
        moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, n_routed_experts=4,
        n_shared_experts=2, num_experts_per_tok=2, n_group=1, topk_group=1,
        routed_scaling_factor=1.5, norm_topk_prob=False, first_k_dense_replace=0,
        use_qk_norm=False, attention_bias=False, tie_word_embeddings=True,
        max_position_embeddings=64, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 1.0})
    torch.manual_seed(98)
    randomize_and_save(transformers.Glm4MoeForCausalLM(cfg), out, 8765)


def make_glm(out):
    cfg = transformers.Glm4MoeConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96,
        moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        first_k_dense_replace=1, use_qk_norm=True, attention_bias=True,
        max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5})
    torch.manual_seed(1234)
    model = transformers.Glm4MoeForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.02 if p.dim() > 1 else 1.0)
                    + (1.0 if n.endswith("norm.weight") else 0.0))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.rand_like(b) * 0.1)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)


def decode(packed, scales, tscale, divide, rows, cols):
    p = packed.to(torch.int64)
    codes = torch.stack([p & 15, p >> 4], dim=-1).reshape(p.shape[0], -1)
    s = scales.view(torch.float8_e4m3fn).to(torch.float32)
    f = s / tscale if divide else s * tscale
    v = LUT[codes] * f.repeat_interleave(16, dim=1)
    return v[:rows, :cols]


def quant_modules(qdir):
    """{module prefix: float32 [out, in]} decoded from msconvert's output."""
    t = {}
    for f in sorted(os.listdir(qdir)):
        if f.endswith(".safetensors"):
            t.update(load_file(os.path.join(qdir, f)))
    meta = {}
    with open(os.path.join(qdir, "model.safetensors"), "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        hdr = json.loads(fh.read(n))
        meta = json.loads(hdr["__metadata__"]["msinv.nvfp4"])
    assert meta["block"] == "2d", meta
    out = {}
    for p, info in meta["tensors"].items():
        rows, cols = info["shape"]
        if p + ".weight_packed" in t:
            packed, ts, div = t[p + ".weight_packed"], t[p + ".weight_global_scale"], True
        else:
            packed, ts, div = t[p + ".weight"], t[p + ".weight_scale_2"], False
        out[p] = decode(packed, t[p + ".weight_scale"], ts.to(torch.float32).reshape(()),
                        div, rows, cols)
    return out


def set_weights(model, family, deq):
    """Put the decoded projections into the transformers model (fused 3D
    experts in transformers 5)."""
    params = dict(model.named_parameters())
    used = 0
    for p, w in deq.items():
        parts = p.split(".")
        if ".experts." in p:
            layer, e, proj = int(parts[2]), int(parts[5]), parts[6]
            ex = params[f"model.layers.{layer}.mlp.experts.gate_up_proj"]
            dn = params[f"model.layers.{layer}.mlp.experts.down_proj"]
            F = dn.shape[2]
            with torch.no_grad():
                if proj in ("gate_proj", "w1"):
                    ex[e, :F].copy_(w)
                elif proj in ("up_proj", "w3"):
                    ex[e, F:].copy_(w)
                elif proj in ("down_proj", "w2"):
                    dn[e].copy_(w)
                else:
                    raise SystemExit(f"unexpected module {p}")
        else:
            with torch.no_grad():
                params[p + ".weight"].copy_(w)
        used += 1
    return used


def run_family(name, base_rel, qopts, args, versions):
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    if base_rel.startswith("make_"):
        base = os.path.join(out, "base")
        shutil.rmtree(base, ignore_errors=True)
        globals()[base_rel](base)
    else:
        base = os.path.join(ROOT, base_rel)
    qdir = os.path.join(out, "quant")
    shutil.rmtree(qdir, ignore_errors=True)
    subprocess.run([args.msconvert, "quantize", base, "-o", qdir, "--block", "2d",
                    "--no-register", "--force"] + qopts, check=True,
                   stdout=subprocess.DEVNULL)
    deq = quant_modules(qdir)

    model = transformers.AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.float32, attn_implementation="eager")
    n = set_weights(model, name, deq)
    print(f"{name}: {n} NVFP4 modules decoded", file=sys.stderr)

    lcfg = peft.LoraConfig(
        r=3 if name.endswith("-var") else 4, lora_alpha=8, lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        init_lora_weights=True)
    pm = peft.get_peft_model(model, lcfg)
    torch.manual_seed(7)
    with torch.no_grad():
        for n_, p in pm.named_parameters():
            if "lora_" in n_:
                p.copy_(torch.randn_like(p) * 0.2)
    adir = os.path.join(out, "adapter")
    shutil.rmtree(adir, ignore_errors=True)
    pm.save_pretrained(adir)
    # the base path as the repository names it, not as this machine does
    acfg = os.path.join(adir, "adapter_config.json")
    with open(acfg) as f:
        c = json.load(f)
    c["base_model_name_or_path"] = os.path.relpath(base, ROOT)
    with open(acfg, "w") as f:
        f.write(json.dumps(c, indent=2, sort_keys=True))
    # PEFT's model card says nothing the tests use
    if os.path.exists(os.path.join(adir, "README.md")):
        os.remove(os.path.join(adir, "README.md"))

    g = torch.Generator().manual_seed(11)
    B, S = 2, 9
    V = model.config.vocab_size
    ids = torch.randint(0, V, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.uint8)
    mask[0, 3] = 0
    mask[1, 1:3] = 0
    labels = ids.clone()
    labels[mask == 0] = -100
    pm.train()
    outp = pm(input_ids=ids)
    logits = outp.logits
    lg = logits[:, :-1].reshape(-1, V)
    lab = labels[:, 1:].reshape(-1)
    loss = torch.nn.functional.cross_entropy(lg.double(), lab, ignore_index=-100,
                                             reduction="sum")
    loss.backward()
    gold = {"ids": ids.to(torch.int32).contiguous(), "mask": mask.contiguous(),
            "logits": logits.detach().contiguous(),
            "loss_sum": loss.detach().reshape(1).to(torch.float64),
            "n_tokens": (lab != -100).sum().reshape(1).to(torch.int64)}
    saved = set(load_file(os.path.join(adir, "adapter_model.safetensors")).keys())
    for n_, p in pm.named_parameters():
        if "lora_" not in n_:
            continue
        key = n_.replace(".default", "")
        assert key in saved, (key, sorted(saved)[:4])
        gold["grad:" + key] = p.grad.detach().contiguous()
    save_file(gold, os.path.join(out, "golden.safetensors"))
    print(f"{name}: loss_sum {loss.item():.6f} over {int(gold['n_tokens'])} labels, "
          f"{len(gold) - 5} gradients", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--msconvert", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", action="append")
    args = ap.parse_args()
    torch.set_num_threads(2)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "peft": peft.__version__, "safetensors": safetensors.__version__,
                "numpy": np.__version__}
    for name, (base, qopts) in FAMILIES.items():
        if args.family and name not in args.family:
            continue
        run_family(name, base, qopts, args, versions)
    with open(os.path.join(args.out, "VERSIONS"), "w") as fh:
        for k, v in versions.items():
            fh.write(f"{k} {v}\n")


if __name__ == "__main__":
    main()
