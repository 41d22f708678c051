"""The PEFT warm start, rank by rank (needs torch, transformers and peft;
run by test_msinv.test_peft_rank_by_rank_equals_unsharded).

The unsharded model: the fixture's Qwen3-MoE config with the adapter
loaded by msinv.load_into_peft (which must give back exactly the file's
tensors). For each EP rank: the same config with only that rank's experts
(what an EP rank's local module holds), the rank's tensors from
msinv.load_ep_rank loaded into it. Equal means: for every fused-expert
LoRA pair and every local expert le with global id g, the rank model's
delta B_le @ A_le equals the unsharded model's B_g @ A_g (A rows e*r+k, B
columns k*E+e: the PEFT packing), and every other adapter tensor is
identical on every rank.
"""
import os

import numpy as np

import msinv
from conftest import FX, inspect

SRC = os.path.join(FX, "peft", "qwen3moe-E8-r4")


def _model(num_experts, torch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(os.path.join(SRC, "base"))
    cfg.num_local_experts = num_experts
    if hasattr(cfg, "num_experts"):
        cfg.num_experts = num_experts
    cfg.num_experts_per_tok = min(cfg.num_experts_per_tok, num_experts)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    return get_peft_model(model, LoraConfig.from_pretrained(os.path.join(SRC, "adapter")))


def _state(model):
    from peft.utils import get_peft_model_state_dict
    return {k: v.detach().cpu().float().numpy() for k, v in get_peft_model_state_dict(model).items()}


def _pairs(sd):
    """(A name, B name) of the fused-expert LoRA pairs."""
    return [(k, k.replace("lora_A", "lora_B")) for k in sd
            if (".experts.lora_A" in k or ".experts.base_layer.lora_A" in k)
            and k.replace("lora_A", "lora_B") in sd]


def _delta(a, b, e, n_exp, r):
    rows = a[e * r:(e + 1) * r]
    cols = b[:, [k * n_exp + e for k in range(r)]]
    return cols @ rows


def check_peft_ep(tmp_path, torch, ep_size=4):
    adapter = os.path.join(SRC, "adapter")
    path = os.path.join(adapter, "adapter_model.safetensors")
    full_tensors = msinv.load_file(path, {k: t["sha256"] for k, t in inspect(path)[0].items()})
    full = _model(8, torch)
    msinv.load_into_peft(full, {k: torch.from_numpy(np.array(v)) for k, v in full_tensors.items()})
    full_sd = _state(full)
    for k, v in full_tensors.items():
        assert np.array_equal(full_sd[k], np.asarray(v, dtype=np.float32)), k
    r = 4
    for rank in range(ep_size):
        got = msinv.load_ep_rank(adapter, ep_size, rank, framework="torch", tmpdir=str(tmp_path))
        local = _model(len(got.experts), torch)
        msinv.load_into_peft(local, got)
        sd = _state(local)
        pairs = _pairs(sd)
        assert pairs, "no fused-expert LoRA pair found"
        for a, b in pairs:
            for le, g in enumerate(got.experts):
                want = _delta(full_sd[a], full_sd[b], g, 8, r)
                have = _delta(sd[a], sd[b], le, len(got.experts), r)
                assert np.array_equal(want, have), (a, rank, g)
        for k in sd:
            if ".experts." not in k:
                assert np.array_equal(sd[k], full_sd[k]), k

