#!/usr/bin/env python3
"""bench_torch.py: the PyTorch eager peer of the GPU quantizer.

A straightforward torch implementation of the modelopt NVFP4 recipe
(NVFP4.md), 1x16 blocks, rowwise and columnwise (the transposed copy
quantized from the high-precision source), on one GPU, as an engineer would
write it without a custom kernel: float32 intermediates, the E4M3 scale via
torch.float8_e4m3fn, the E2M1 code by comparisons, nibbles packed with
shifts.

    bench_torch.py [--rows R] [--cols C] [--check DIR] [--load FILE]

--check DIR compares its bytes with the case bench_gpu --dump wrote there
(so the timing below is of an equivalent computation) and prints
"TORCH_CHECK ...". Then it times rowwise + columnwise on a random bf16
[R, C] weight (median of 7 runs after 2 warm-ups, CUDA events) and prints
"TORCH_MS <ms>". --load FILE times safetensors.torch.load_file(FILE,
device="cuda") (the plain load most code uses; median of 5 after one
warm-up) and prints "TORCH_LOAD_MS <ms>".
"""
import argparse
import os
import sys
import time

import torch


def quantize_modelopt(w):
    """w: bf16 [R, C] on the GPU, C % 16 == 0 -> (packed u8 [R, C/2], scales u8 [R, C/16])."""
    rows, cols = w.shape
    x = w.float()
    amax = x.abs().amax()
    # a tensor, not a Python number: ATen divides by a CPU scalar as a
    # multiplication by its reciprocal, which is not the recipe's division
    ws2 = amax / torch.tensor(2688.0, device=w.device)
    ws2 = torch.where(ws2 == 0, torch.full_like(ws2, 1.0 / 2688.0), ws2)
    k1 = 6.0 * ws2
    blocks = x.view(rows, cols // 16, 16)
    bamax = blocks.abs().amax(dim=-1)
    pbs = bamax / k1
    pbs = torch.where(pbs == 0, torch.ones_like(pbs), pbs).clamp(2.0 ** -9, 448.0)
    s8 = pbs.to(torch.float8_e4m3fn)
    factor = s8.float() * ws2
    q = blocks / factor.unsqueeze(-1)
    a = q.abs()
    code = ((a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75)
            + (a > 2.5) + (a >= 3.5) + (a > 5.0))
    code = code | ((q < 0).to(torch.uint8) << 3)
    code = code.view(rows, cols)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    return packed, s8.view(torch.uint8)


def both_layouts(w):
    return quantize_modelopt(w), quantize_modelopt(w.t().contiguous())


def check(d):
    with open(os.path.join(d, "meta.txt")) as f:
        rows, cols, _ = f.read().split()
    rows, cols = int(rows), int(cols)

    def load(name, dtype, shape):
        with open(os.path.join(d, name), "rb") as f:
            buf = bytearray(f.read())
        return torch.frombuffer(buf, dtype=dtype).view(*shape).cuda()

    w = load("x.bf16", torch.bfloat16, (rows, cols))
    (p, s), (pt, st) = both_layouts(w)
    ours = [load("packed.u8", torch.uint8, (rows, cols // 2)),
            load("scales.u8", torch.uint8, (rows, cols // 16)),
            load("packed_t.u8", torch.uint8, (cols, rows // 2)),
            load("scales_t.u8", torch.uint8, (cols, rows // 16))]
    diff = sum(int((a != b).sum()) for a, b in zip([p, s, pt, st], ours))
    total = sum(t.numel() for t in ours)
    if diff == 0:
        return f"Its bytes equal ours on a [{rows}, {cols}] check case."
    return f"Its bytes differ from ours in {diff} of {total} on a [{rows}, {cols}] check case."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--cols", type=int, default=32768)
    ap.add_argument("--check")
    ap.add_argument("--load")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_torch: no CUDA device", file=sys.stderr)
        return 3
    if args.check:
        print("TORCH_CHECK " + check(args.check), flush=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    w = (torch.randn(args.rows, args.cols, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    for _ in range(2):
        both_layouts(w)
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        both_layouts(w)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    print(f"TORCH_MS {times[len(times) // 2]:.3f}", flush=True)
    del w
    torch.cuda.empty_cache()
    if args.load:
        from safetensors.torch import load_file
        times = []
        for i in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            d = load_file(args.load, device="cuda")
            torch.cuda.synchronize()
            if i:
                times.append((time.perf_counter() - t0) * 1e3)
            del d
            torch.cuda.empty_cache()
        times.sort()
        print(f"TORCH_LOAD_MS {times[len(times) // 2]:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
