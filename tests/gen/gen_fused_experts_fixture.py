#!/usr/bin/env python3
"""Make tests/fixtures/hf/qwen3moe-stacked from tests/fixtures/hf/qwen3moe.

transformers 5 holds Qwen3-MoE experts fused in memory (its
Qwen3MoeExperts: gate_up_proj [E, 2I, H] with gate in rows [0, I) and up in
rows [I, 2I), down_proj [E, H, I], each expert slice a linear weight
[out, in]) but saves them per expert; several published MoE checkpoints
ship the fused layout. This stacks the per-expert tensors of the saved
fixture into that layout, so every fused value is a known per-expert value:
    gate_up_proj[e] = concat(experts.e.gate_proj.weight, experts.e.up_proj.weight)
    down_proj[e]    = experts.e.down_proj.weight
Everything else (attention, router, norms, embeddings, config files) is
copied unchanged. Needs numpy, ml_dtypes and safetensors (the test venv).

    python3 tests/gen/gen_fused_experts_fixture.py SRC_DIR OUT_DIR
"""
import os
import re
import shutil
import sys

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, for safetensors)
import numpy as np
from safetensors.numpy import load_file, save_file


def main():
    src, out = sys.argv[1], sys.argv[2]
    t = load_file(os.path.join(src, "model.safetensors"))
    pat = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    experts = {}
    fused = {}
    for name, v in t.items():
        m = pat.match(name)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = v
        else:
            fused[name] = v
    for base, per in experts.items():
        ids = sorted(per)
        assert ids == list(range(len(ids))), (base, ids)
        fused[base + ".gate_up_proj"] = np.ascontiguousarray(np.stack(
            [np.concatenate([per[e]["gate_proj"], per[e]["up_proj"]], axis=0) for e in ids]))
        fused[base + ".down_proj"] = np.ascontiguousarray(np.stack([per[e]["down_proj"] for e in ids]))
    os.makedirs(out, exist_ok=True)
    save_file(fused, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    for f in sorted(os.listdir(src)):
        if not f.endswith(".safetensors"):
            shutil.copyfile(os.path.join(src, f), os.path.join(out, f))


if __name__ == "__main__":
    main()
