"""Write the tiny fixtures the producers' goldens start from that the
repository did not already have, with transformers' own save_pretrained and
random weights (seeded):

  deepseekv3/       DeepSeek-V3 (multi-latent attention: q_a_proj,
                    kv_a_proj_with_mqa, ...; one dense layer, one MoE layer
                    with a shared expert), bf16
  qwen3moe-fused/   Qwen3-MoE saved with save_original_format=False: the
                    experts as fused 3-D tensors (mlp.experts.gate_up_proj
                    [E, 2I, H], mlp.experts.down_proj [E, H, I]), bf16

Usage: make_fixtures.py OUTDIR   (run in the llm-compressor venv)
"""
import os
import sys

import torch
from transformers import (AutoModelForCausalLM, DeepseekV3Config,
                          Qwen3MoeConfig)


def save(cfg, out, seed, **kw):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    # from_config initialises with std 0.02; make the magnitudes differ per
    # tensor so that tensor scales differ and fused groups matter
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(model.named_parameters())):
            if p.dim() >= 2:
                p.mul_(0.5 + (i % 7) * 0.25)
    model.generation_config.do_sample = False
    model.save_pretrained(out, **kw)


def main():
    root = sys.argv[1]
    ds = DeepseekV3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=2, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
        n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
        kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, v_head_dim=16,
        qk_nope_head_dim=16, max_position_embeddings=128,
        routed_scaling_factor=2.5, bos_token_id=0, eos_token_id=1)
    ds.architectures = ["DeepseekV3ForCausalLM"]
    save(ds, os.path.join(root, "deepseekv3"), 3)
    qw = Qwen3MoeConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=8,
        num_experts_per_tok=2, max_position_embeddings=128)
    qw.architectures = ["Qwen3MoeForCausalLM"]
    save(qw, os.path.join(root, "qwen3moe-fused"), 4, save_original_format=False)


if __name__ == "__main__":
    main()
