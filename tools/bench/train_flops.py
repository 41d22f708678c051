#!/usr/bin/env python3
"""train_flops.py: the FLOP count of one LoRA training step on a
Qwen3-MoE-shaped model, the one convention every row of the trainer
benchmark is measured by (train_torch.py and the results table of
bench_train_gpu.sh import it).

Forward FLOPs per sequence of S tokens, per layer:

    projections  2 * S * (hidden * heads * head_dim          q
                          + 2 * hidden * kv_heads * head_dim  k, v
                          + heads * head_dim * hidden)        o
    router       2 * S * hidden * experts
    experts      2 * S * top_k * 3 * hidden * moe_intermediate
                 (gate, up and down of the top_k experts each token
                 is routed to; the experts not chosen count nothing)
    attention    2 * 2 * heads * head_dim * S * (S + 1) / 2
                 (scores Q K^T and context P V, causal: only the
                 S (S + 1) / 2 query-key pairs at or below the diagonal,
                 one multiply-add = 2 FLOPs)

plus the lm_head, 2 * S * hidden * vocab. Left out: the LoRA factors
(at r = 16 about 2% of the expert FLOPs), norms, RoPE, SwiGLU, softmax,
routing and the loss (elementwise, not matrix work).

A training step counts 2x the forward: with the base frozen, the
backward computes the input gradients (as much matrix work as the
forward) and no weight gradients but the LoRA ones (left out as above);
activation recomputation, if a trainer does it, is not counted.

    train_flops.py CONFIG.json --batch B --seq S   prints "FLOPS_STEP <n>"
"""
import argparse
import json
import sys


def forward_flops(cfg, seq):
    """Forward FLOPs of one sequence of `seq` tokens; cfg: a config.json dict."""
    h = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    e = cfg.get("num_experts", cfg.get("num_local_experts"))
    k = cfg["num_experts_per_tok"]
    inter = cfg["moe_intermediate_size"]
    layers = cfg["num_hidden_layers"]
    vocab = cfg["vocab_size"]
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise ValueError("dense MLP layers are not counted by this formula")
    proj = 2 * seq * (h * nh * hd + 2 * h * nkv * hd + nh * hd * h)
    router = 2 * seq * h * e
    experts = 2 * seq * k * 3 * h * inter
    attn = 2 * 2 * nh * hd * seq * (seq + 1) // 2
    return layers * (proj + router + experts + attn) + 2 * seq * h * vocab


def step_flops(cfg, batch, seq):
    """FLOPs of one optimizer step (no gradient accumulation): 2x the forward."""
    return 2 * batch * forward_flops(cfg, seq)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    a = ap.parse_args()
    try:
        with open(a.config) as f:
            cfg = json.load(f)
        print("FLOPS_STEP %d" % step_flops(cfg, a.batch, a.seq))
    except (OSError, ValueError, KeyError) as e:
        print("train_flops: %s: %s" % (a.config, e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
