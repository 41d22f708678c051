#!/usr/bin/env python3
"""rel_gen.py: a mid-sized synthetic Qwen3-MoE checkpoint for the
reliability tests (crash consistency, concurrency).

gen_ckpt.py makes benchmark-sized checkpoints (a gigabyte at least, random
bytes that include NaN and Inf); the crash tests need something between the
fixtures and that: tens of megabytes, so that a kill lands in the middle of
a write, with finite BF16 values, so that msconvert quantizes it, and with
per-expert tensors and a config.json, so that msshard splits it.

Layout (as save_pretrained writes it): shards model-0000K-of-0000N with
model.safetensors.index.json (one model.safetensors when it fits in one
shard), config.json. Values are BF16 with magnitudes around 2^-7 .. 2^-4
and random signs; the bytes are deterministic for a given --seed. Only the
standard library is used.

    python3 tests/rel/rel_gen.py OUTDIR [--mb 64] [--shard-mb 32] [--seed 0]
"""
import argparse
import json
import os
import random
import struct
import sys

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 1024, 8, 2, 128
EXPERTS, MOE_INTER, VOCAB = 8, 256, 1024


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
    n = 2
    for d in shape:
        n *= d
    return n


def plan(total):
    t = [("model.embed_tokens.weight", [VOCAB, HIDDEN])]
    tail = [("model.norm.weight", [HIDDEN]), ("lm_head.weight", [VOCAB, HIDDEN])]
    size = sum(nbytes(s) for _, s in t + tail)
    layers = 0
    while True:
        lt = layer_tensors(layers)
        t += lt
        size += sum(nbytes(s) for _, s in lt)
        layers += 1
        if size >= total:
            break
    return t + tail, layers


# BF16 high byte: keep the random sign, pick an exponent so that every
# value is finite and small (0x3c..0x3d: 2^-7 .. 2^-4).
HIGH = bytes((b & 0x80) | (0x3c + (b & 1)) for b in range(256))


def values(rng, n):
    raw = bytearray(rng.randbytes(n))
    raw[1::2] = bytes(raw[1::2]).translate(HIGH)
    return raw


def write_shard(path, tensors, rng):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        n = nbytes(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, shape in tensors:
            f.write(values(rng, nbytes(shape)))
    os.replace(tmp, path)
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--mb", type=float, default=64, help="total size in MiB")
    ap.add_argument("--shard-mb", type=float, default=32, help="shard size in MiB")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.mb <= 0 or a.shard_mb <= 0:
        sys.exit("rel_gen.py: --mb and --shard-mb must be positive")
    rng = random.Random(a.seed)
    tensors, layers = plan(int(a.mb * 2**20))
    shards, cur, cur_size = [], [], 0
    for t in tensors:
        if cur and cur_size + nbytes(t[1]) > a.shard_mb * 2**20:
            shards.append(cur)
            cur, cur_size = [], 0
        cur.append(t)
        cur_size += nbytes(t[1])
    shards.append(cur)
    os.makedirs(a.outdir, exist_ok=True)
    weight_map, total = {}, 0
    for i, sh in enumerate(shards):
        name = ("model.safetensors" if len(shards) == 1 else
                "model-%05d-of-%05d.safetensors" % (i + 1, len(shards)))
        total += write_shard(os.path.join(a.outdir, name), sh, rng)
        for n, _ in sh:
            weight_map[n] = name
    if len(shards) > 1:
        with open(os.path.join(a.outdir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
                      f, indent=2, sort_keys=True)
    config = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "dtype": "bfloat16", "hidden_size": HIDDEN, "head_dim": HEAD_DIM,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": layers, "num_experts": EXPERTS,
        "num_experts_per_tok": 2, "moe_intermediate_size": MOE_INTER,
        "intermediate_size": 2 * MOE_INTER, "vocab_size": VOCAB,
        "decoder_sparse_step": 1, "mlp_only_layers": [],
        "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
    }
    with open(os.path.join(a.outdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    print("%s: %d layers, %d tensors, %d bytes in %d file(s)"
          % (a.outdir, layers, len(tensors), total, len(shards)))


if __name__ == "__main__":
    main()
