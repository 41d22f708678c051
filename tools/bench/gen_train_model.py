#!/usr/bin/env python3
"""gen_train_model.py: the generated Qwen3-MoE-shaped checkpoint of the
trainer benchmark, written by transformers itself (Qwen3MoeConfig,
Qwen3MoeForCausalLM, save_pretrained: bf16 safetensors and config.json).

The weights are the model's own initialisation with initializer_range
0.02 (every projection, expert, router and embedding drawn from
normal(0, 0.02), norms 1) from a fixed seed, so the logits are small and
the loss finite. The defaults are the benchmark's model (about 5.1 B
parameters, 10.3 GB in bf16); every dimension has a flag, so a tiny one
can be made on a CPU. It is built on the GPU when there is one (the
initialisation of 5 B parameters on a CPU takes minutes).

    gen_train_model.py OUT [--hidden N] [--layers N] ... [--device auto|cpu|cuda]
                       [--max-shard-size 5GB]

Prints "PARAMS <n>" (all parameters) and "ACTIVE_PARAMS <n>" (those one
token's forward multiplies by: the top-k experts only).
"""
import argparse
import os
import sys

import torch
import transformers


def build_config(a):
    return transformers.Qwen3MoeConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim, num_experts=a.experts, num_experts_per_tok=a.top_k,
        moe_intermediate_size=a.moe_inter,
        # unused (no dense layer) but saved; the expert width keeps it sane
        intermediate_size=a.moe_inter * a.top_k,
        norm_topk_prob=True, mlp_only_layers=[], decoder_sparse_step=1,
        tie_word_embeddings=False, attention_bias=False, rms_norm_eps=1e-6,
        max_position_embeddings=a.max_pos, initializer_range=0.02,
        rope_parameters={"rope_type": "default", "rope_theta": a.rope_theta})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--moe-inter", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--max-pos", type=int, default=4096)
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-shard-size", default="5GB",
                    help="safetensors shard size, as save_pretrained takes it (default 5GB, "
                    "the size checkpoints are published in)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    a = ap.parse_args()
    if a.top_k > a.experts:
        ap.error("--top-k %d exceeds --experts %d" % (a.top_k, a.experts))
    if a.heads % a.kv_heads:
        ap.error("--heads %d is not a multiple of --kv-heads %d" % (a.heads, a.kv_heads))
    if os.path.exists(a.out) and os.listdir(a.out):
        print("gen_train_model: %s: exists and is not empty" % a.out, file=sys.stderr)
        return 2
    dev = a.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    elif dev == "cuda" and not torch.cuda.is_available():
        print("gen_train_model: --device cuda: torch sees no CUDA device", file=sys.stderr)
        return 3
    cfg = build_config(a)
    torch.manual_seed(a.seed)
    # made in bf16 on the device directly: no float32 copy of the whole
    # model (20 GB at the default size) on the host
    with torch.device(dev):
        model = transformers.Qwen3MoeForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    e = cfg.num_experts
    expert = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    active = n - expert + expert * cfg.num_experts_per_tok // e
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        print("gen_train_model: non-finite initial weights in %s" % bad[0], file=sys.stderr)
        return 3
    model.save_pretrained(a.out, max_shard_size=a.max_shard_size)
    print("PARAMS %d" % n)
    print("ACTIVE_PARAMS %d" % active)
    print("gen_train_model: %s: %.3f B parameters (%.3f B active per token), bf16, built on %s"
          % (a.out, n / 1e9, active / 1e9, dev), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
