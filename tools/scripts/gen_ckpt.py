#!/usr/bin/env python3
"""gen_ckpt.py: write a large synthetic Hugging Face MoE checkpoint, for
benchmarks.

The layout follows a Qwen3-MoE model saved by save_pretrained: per-expert
tensors model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight, a router
(mlp.gate.weight), attention projections with q/k norms, layer norms,
embeddings and lm_head, all BF16, in shards of about --shard-gb with a
model.safetensors.index.json. Tensor sizes are mixed on purpose (from 256
bytes to over 100 MiB) so a hasher has to balance small and large work.
Layers are added until the total reaches --gb.

The bytes are random (a block from os.urandom, reused at shifting offsets so
tensors differ) and written in large chunks; nothing is compressible and
writing runs at disk speed. The output is deterministic for a given --seed.

    python3 tools/scripts/gen_ckpt.py OUTDIR [--gb 4] [--shard-gb 1] [--seed 0]
"""
import argparse
import json
import os
import random
import struct
import sys

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, MOE_INTER, VOCAB = 64, 768, 32768
BF16 = 2


def layer_tensors(n):
    p = "model.layers.%d." % n
    t = [
        (p + "input_layernorm.weight", [HIDDEN]),
        (p + "post_attention_layernorm.weight", [HIDDEN]),
        (p + "self_attn.q_proj.weight", [HEADS * HEAD_DIM, HIDDEN]),
        (p + "self_attn.k_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
        (p + "self_attn.v_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
        (p + "self_attn.o_proj.weight", [HIDDEN, HEADS * HEAD_DIM]),
        (p + "self_attn.q_norm.weight", [HEAD_DIM]),
        (p + "self_attn.k_norm.weight", [HEAD_DIM]),
        (p + "mlp.gate.weight", [EXPERTS, HIDDEN]),
    ]
    for e in range(EXPERTS):
        q = p + "mlp.experts.%d." % e
        t += [(q + "gate_proj.weight", [MOE_INTER, HIDDEN]),
              (q + "up_proj.weight", [MOE_INTER, HIDDEN]),
              (q + "down_proj.weight", [HIDDEN, MOE_INTER])]
    return t


def nbytes(shape):
    n = BF16
    for d in shape:
        n *= d
    return n


def plan(total_bytes):
    tensors = [("model.embed_tokens.weight", [VOCAB, HIDDEN])]
    tail = [("model.norm.weight", [HIDDEN]), ("lm_head.weight", [VOCAB, HIDDEN])]
    size = sum(nbytes(s) for _, s in tensors + tail)
    n = 0
    while True:
        lt = layer_tensors(n)
        ls = sum(nbytes(s) for _, s in lt)
        if n > 0 and size + ls / 2 > total_bytes:
            break
        tensors += lt
        size += ls
        n += 1
    return tensors + tail, n


class Source:
    """Random bytes in big chunks: one random block, read at shifting offsets."""

    def __init__(self, seed, block=64 << 20):
        rnd = random.Random(seed)
        self.block = rnd.randbytes(block) + os.urandom(0)
        self.block2 = self.block + self.block
        self.pos = 0
        self.step = 4093

    def take(self, n):
        out = []
        while n:
            k = min(n, len(self.block))
            out.append(self.block2[self.pos:self.pos + k])
            self.pos = (self.pos + self.step) % len(self.block)
            n -= k
        return out


def write_shard(path, tensors, src):
    header, off = {}, 0
    for name, shape in tensors:
        n = nbytes(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape in tensors:
            for chunk in src.take(nbytes(shape)):
                f.write(chunk)
    os.rename(path + ".tmp", path)
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--gb", type=float, default=4.0, help="total size in GB (1e9 bytes)")
    ap.add_argument("--shard-gb", type=float, default=1.0, help="shard size in GB")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.gb <= 0 or a.shard_gb <= 0:
        ap.error("sizes must be positive")
    tensors, nlayers = plan(a.gb * 1e9)
    # shards in order, each up to shard-gb (a tensor never straddles two)
    shards, cur, cur_size = [], [], 0
    for t in tensors:
        n = nbytes(t[1])
        if cur and cur_size + n > a.shard_gb * 1e9:
            shards.append(cur)
            cur, cur_size = [], 0
        cur.append(t)
        cur_size += n
    shards.append(cur)
    os.makedirs(a.outdir, exist_ok=True)
    src = Source(a.seed)
    weight_map, total = {}, 0
    for i, ts in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        total += write_shard(os.path.join(a.outdir, name), ts, src)
        for t, _ in ts:
            weight_map[t] = name
    with open(os.path.join(a.outdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    print("gen_ckpt: %s: %d layers x %d experts, %d tensors, %d shards, %.2f GB"
          % (a.outdir, nlayers, EXPERTS, len(tensors), len(shards), total / 1e9))


if __name__ == "__main__":
    sys.exit(main())
