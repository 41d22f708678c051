"""Load msconvert's outputs with the real loaders (run in the llm-compressor
venv: transformers + compressed-tensors).

  load_check.py ct OURS GOLDEN DEQUANTIZED
      OURS (msconvert quantize --recipe compressed-tensors) and GOLDEN
      (llm-compressor's) load with transformers; their logits on a fixed
      input must be equal (GOLDEN "-": not compared). OURS is then decompressed, module by module, by
      compressed-tensors' own NVFP4PackedCompressor: every weight must equal
      DEQUANTIZED (msconvert dequantize of OURS, bf16) bit for bit.
  load_check.py config DIR
      DIR/config.json loads with transformers' AutoConfig (strict config
      classes refuse an int where a float is declared).
Exit 0 when every check holds, 1 otherwise.
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM


def logits(path, **kw):
    m = AutoModelForCausalLM.from_pretrained(path, device_map="cpu", **kw)
    m.eval()
    ids = torch.arange(24).reshape(2, 12) % m.config.vocab_size
    with torch.no_grad():
        return m, m(ids).logits.float()


def check_ct(ours, golden, deq):
    bad = 0
    same = "not compared"
    # for the record, not a check: how far the loader's run of OURS is from
    # the dequantized weights run in bf16 (transformers 5.17 with
    # compressed-tensors 0.19 drops weight_global_scale of fused experts,
    # so MoE models land far off, the producers' checkpoints alike)
    _, lq = logits(ours)
    _, ld = logits(deq)
    print(f"load_check: {ours}: max |logits - logits of the dequantized checkpoint| "
          f"{float((lq - ld).abs().max()):.4g}")
    if golden != "-":
        la = lq
        _, lb = logits(golden)
        same = torch.equal(la, lb)
        if not same:
            print(f"logits differ: max |diff| {float((la - lb).abs().max())}")
            bad += 1
    # compressed-tensors' own decompressor, module by module (transformers'
    # dequantize=True path drops weight_global_scale of fused experts, so
    # it is not the reference here)
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig

    cfg = json.load(open(os.path.join(ours, "config.json")))["quantization_config"]
    scheme = QuantizationConfig.model_validate(cfg).config_groups["group_0"]
    packed, want = {}, {}
    for d, into in ((ours, packed), (deq, want)):
        for f in os.listdir(d):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(d, f), "pt") as fh:
                    for k in fh.keys():
                        into[k] = fh.get_tensor(k)
    sd = {}
    for k in packed:
        if k.endswith(".weight_packed"):
            p = k[:-len(".weight_packed")]
            local = {n: packed[p + "." + n] for n in ("weight_packed", "weight_scale",
                                                       "weight_global_scale")}
            sd[p + ".weight"] = NVFP4PackedCompressor.decompress(local, scheme)["weight"]
    n = 0
    for k, v in sd.items():
        if k in want:
            n += 1
            if not torch.equal(v.to(torch.bfloat16), want[k]):
                print(f"{k}: compressed-tensors' decompression differs from msconvert dequantize")
                bad += 1
    if n == 0:
        print("no decompressed weight compared")
        bad += 1
    print(f"load_check: {ours}: logits equal to the golden's: {same}; "
          f"{n} decompressed weights compared")
    return bad


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "ct":
        return 1 if check_ct(*sys.argv[2:]) else 0
    if len(sys.argv) == 3 and sys.argv[1] == "config":
        AutoConfig.from_pretrained(sys.argv[2])
        json.load(open(os.path.join(sys.argv[2], "config.json")))
        print(f"load_check: {sys.argv[2]}/config.json loads")
        return 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
