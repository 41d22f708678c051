#!/usr/bin/env python3
"""Write tests/fixtures/peft/qwen3moe-E16-r3-fused: a tiny Qwen3-MoE base
(1 layer, hidden 16, expert intermediate 8, 16 experts, per-expert tensors
as save_pretrained writes them) and a LoRA adapter on its fused expert
parameters only (PEFT target_parameters, r=3): fused A [E*r, in] with row
e*r+k, fused B [out, r*E] with column k*E+e, the shapes and names PEFT 0.21
saves (the innermost wrapper, experts.base_layer, adapts gate_up_proj).

With no attention LoRA, nothing in the adapter's shapes says r: its 48
rows are 16 experts at r=3 and "12" at r=4. Only the base's expert count
tells them apart, which the tests check.

Standard library only; the values are seeded pseudo-random float32.

usage: gen_fused_lora_fixture.py OUT_DIR
"""
import json
import os
import random
import struct
import sys

E, R, H, I, ALPHA = 16, 3, 16, 8, 6


def tensor(rng, shape):
    n = 1
    for d in shape:
        n *= d
    return ("F32", shape, struct.pack("<%df" % n, *(rng.uniform(-0.5, 0.5) for _ in range(n))))


def save(path, tensors):
    header, off, body = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        dt, shape, data = tensors[name]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        body.append(data)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(body))


def main():
    out = sys.argv[1]
    rng = random.Random(16003)
    os.makedirs(os.path.join(out, "base"), exist_ok=True)
    os.makedirs(os.path.join(out, "adapter"), exist_ok=True)
    base = {"model.layers.0.mlp.gate.weight": tensor(rng, [E, H])}
    for e in range(E):
        p = "model.layers.0.mlp.experts.%d." % e
        base[p + "gate_proj.weight"] = tensor(rng, [I, H])
        base[p + "up_proj.weight"] = tensor(rng, [I, H])
        base[p + "down_proj.weight"] = tensor(rng, [H, I])
    save(os.path.join(out, "base", "model.safetensors"), base)
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": H, "moe_intermediate_size": I, "num_hidden_layers": 1,
        "num_experts": E, "num_experts_per_tok": 2, "dtype": "float32",
    }
    with open(os.path.join(out, "base", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    m = "base_model.model.model.layers.0.mlp.experts."
    adapter = {
        # gate_up_proj [2I, H]: A [E*r, H], B [2I, r*E]
        m + "base_layer.lora_A.weight": tensor(rng, [E * R, H]),
        m + "base_layer.lora_B.weight": tensor(rng, [2 * I, R * E]),
        # down_proj [H, I]: A [E*r, I], B [H, r*E]
        m + "lora_A.weight": tensor(rng, [E * R, I]),
        m + "lora_B.weight": tensor(rng, [H, R * E]),
    }
    save(os.path.join(out, "adapter", "adapter_model.safetensors"), adapter)
    acfg = {
        "peft_type": "LORA", "peft_version": "0.21.2", "base_model_name_or_path": None,
        "r": R, "lora_alpha": ALPHA, "lora_dropout": 0.0, "bias": "none",
        "rank_pattern": {}, "alpha_pattern": {}, "target_modules": None,
        "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        "fan_in_fan_out": False, "inference_mode": True, "use_dora": False,
        "use_rslora": False, "task_type": None,
    }
    with open(os.path.join(out, "adapter", "adapter_config.json"), "w") as f:
        json.dump(acfg, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
