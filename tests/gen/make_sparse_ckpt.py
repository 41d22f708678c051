#!/usr/bin/env python3
"""make_sparse_ckpt.py: write a sharded safetensors checkpoint of a large
mixture-of-experts model in which only the headers hold bytes.

Every shard is a valid safetensors file (8-byte header length, JSON header
padded with spaces to 8, then the data buffer), but the data buffer is a hole
made by truncate: a 700B-parameter checkpoint of 1.4 TB costs a few MB of
disk. Tools that plan from headers alone (msinv footprint) read such a
checkpoint like the real one; anything that reads tensor bytes sees zeros.

Layout (Hugging Face names, DeepSeek/Qwen-MoE style):
  model.embed_tokens.weight                        [vocab, hidden]
  model.layers.L.input_layernorm.weight            [hidden]
  model.layers.L.post_attention_layernorm.weight   [hidden]
  model.layers.L.self_attn.{q,o}_proj.weight       [hidden, hidden]
  model.layers.L.self_attn.{k,v}_proj.weight       [kv, hidden]
  model.layers.L.mlp.gate.weight                   [experts, hidden]  (router)
  model.layers.L.mlp.shared_experts.{gate,up}_proj.weight  [inter, hidden]
  model.layers.L.mlp.shared_experts.down_proj.weight       [hidden, inter]
  model.layers.L.mlp.experts.E.{gate,up}_proj.weight       [inter, hidden]
  model.layers.L.mlp.experts.E.down_proj.weight            [hidden, inter]
    (with --fused: mlp.experts.gate_up_proj [experts, 2*inter, hidden] and
     mlp.experts.down_proj [experts, hidden, inter])
  model.norm.weight                                [hidden]
  lm_head.weight                                   [vocab, hidden]
one shard per --layers-per-file layers, the embeddings and head in the last,
and model.safetensors.index.json. The defaults make a 688B-parameter model
(60 layers x 256 experts x 3 projections of 2048 x 7168, bf16).

Usage: make_sparse_ckpt.py --out DIR [--layers N] [--experts N] [--hidden N]
       [--inter N] [--kv N] [--vocab N] [--dtype BF16] [--layers-per-file N]
       [--fused] [--force]
Prints a JSON summary (files, tensors, parameters, apparent bytes).
"""
import argparse
import json
import os
import struct
import sys

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


def layer_tensors(layer, a):
    p = "model.layers.%d." % layer
    h, i, kv, e = a.hidden, a.inter, a.kv, a.experts
    out = [
        (p + "input_layernorm.weight", [h]),
        (p + "post_attention_layernorm.weight", [h]),
        (p + "self_attn.q_proj.weight", [h, h]),
        (p + "self_attn.k_proj.weight", [kv, h]),
        (p + "self_attn.v_proj.weight", [kv, h]),
        (p + "self_attn.o_proj.weight", [h, h]),
        (p + "mlp.gate.weight", [e, h]),
        (p + "mlp.shared_experts.gate_proj.weight", [i, h]),
        (p + "mlp.shared_experts.up_proj.weight", [i, h]),
        (p + "mlp.shared_experts.down_proj.weight", [h, i]),
    ]
    if a.fused:
        out.append((p + "mlp.experts.gate_up_proj", [e, 2 * i, h]))
        out.append((p + "mlp.experts.down_proj", [e, h, i]))
    else:
        for x in range(e):
            q = p + "mlp.experts.%d." % x
            out.append((q + "gate_proj.weight", [i, h]))
            out.append((q + "up_proj.weight", [i, h]))
            out.append((q + "down_proj.weight", [h, i]))
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def write_shard(path, tensors, dtype, force):
    """Header only; the data buffer is a hole. Returns the data size."""
    header = {}
    off = 0
    size = DTYPE_BYTES[dtype]
    for name, shape in tensors:
        nb = numel(shape) * size
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    if os.path.exists(path) and not force:
        sys.exit("make_sparse_ckpt: '%s' exists (use --force)" % path)
    tmp = path + ".tmp-%d" % os.getpid()
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.truncate(8 + len(text) + off)
        f.flush()
        st = os.fstat(f.fileno())
    # A filesystem without holes would have written the zeros: stop before
    # the next shard fills the disk.
    if st.st_blocks * 512 > 8 + len(text) + (1 << 20):
        os.unlink(tmp)
        sys.exit("make_sparse_ckpt: '%s': the filesystem does not keep holes "
                 "(%d bytes allocated); use another TMPDIR" % (path, st.st_blocks * 512))
    os.rename(tmp, path)
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--kv", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--dtype", default="BF16", choices=sorted(DTYPE_BYTES))
    ap.add_argument("--layers-per-file", type=int, default=1)
    ap.add_argument("--fused", action="store_true")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    for k in ("layers", "experts", "hidden", "inter", "kv", "vocab", "layers_per_file"):
        if getattr(a, k) < 1 or getattr(a, k) > 1 << 20:
            ap.error("--%s must be from 1 to %d" % (k.replace("_", "-"), 1 << 20))

    os.makedirs(a.out, exist_ok=True)
    groups = [list(range(s, min(s + a.layers_per_file, a.layers)))
              for s in range(0, a.layers, a.layers_per_file)]
    nfiles = len(groups) + 1
    weight_map = {}
    total = params = ntensors = 0
    for k in range(nfiles):
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, nfiles)
        if k < len(groups):
            tensors = [t for layer in groups[k] for t in layer_tensors(layer, a)]
        else:
            tensors = [("model.embed_tokens.weight", [a.vocab, a.hidden]),
                       ("model.norm.weight", [a.hidden]),
                       ("lm_head.weight", [a.vocab, a.hidden])]
        total += write_shard(os.path.join(a.out, fname), tensors, a.dtype, a.force)
        for name, shape in tensors:
            weight_map[name] = fname
            params += numel(shape)
            ntensors += 1

    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    config = {"architectures": ["SparseMoeForCausalLM"], "model_type": "sparse_moe",
              "hidden_size": a.hidden, "moe_intermediate_size": a.inter,
              "num_hidden_layers": a.layers, "n_routed_experts": a.experts,
              "vocab_size": a.vocab, "torch_dtype": a.dtype.lower()}
    for name, obj in (("model.safetensors.index.json", index), ("config.json", config)):
        path = os.path.join(a.out, name)
        if os.path.exists(path) and not a.force:
            sys.exit("make_sparse_ckpt: '%s' exists (use --force)" % path)
        with open(path + ".tmp", "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
        os.rename(path + ".tmp", path)
    json.dump({"files": nfiles, "tensors": ntensors, "parameters": params,
               "data_bytes": total}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
