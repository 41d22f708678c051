#!/usr/bin/env python3
"""NVFP4 oracle: an independent numpy + ml_dtypes implementation of the
three recipes of NVFP4.md (modelopt, compressed-tensors, te), used to check
msconvert's output byte for byte.

It shares no code with the C codec: rounding to E4M3, bfloat16 and E2M1 is
done by ml_dtypes casts, block maxima by numpy reductions, and the tensor
selection, fused groups and on-disk names are re-derived here from the
spec.

    nvfp4_oracle.py gen OUT.safetensors [--seed N]
        random bf16 weights with Hugging Face MoE names, never zero,
        with exact ties, sizes that are not multiples of 16, extremes
    nvfp4_oracle.py check SRC QUANTIZED --recipe R --block B --layout L
                          [--format F] [--no-fuse]
        quantize SRC here and compare every tensor of QUANTIZED (a file or
        a directory) byte for byte; also load QUANTIZED with the
        safetensors package
    nvfp4_oracle.py check-deq QUANTIZED DEQUANTIZED [--dtype bf16|f32]
        decode QUANTIZED here and compare with msconvert dequantize
    nvfp4_oracle.py bench SRC [--recipe R] [--repeat N]
        quantize every 2-D tensor of SRC and print "oracle <bytes> <seconds>"
        (CPU seconds, best of N)

Exit status: 0 equal, 1 a difference (printed), 2 usage or bad input.
"""
import argparse
import json
import os
import re
import struct
import sys
import time

import ml_dtypes
import numpy as np

F32 = np.float32
E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
E2M1 = ml_dtypes.float4_e2m1fn
FLT_MIN = np.finfo(np.float32).tiny
FLT_MAX = np.finfo(np.float32).max

# safetensors' numpy backend looks the fp8 dtype up on numpy itself
if not hasattr(np, "float8_e4m3fn"):
    np.float8_e4m3fn = E4M3

DTYPES = {"BF16": (BF16, 2), "F16": (np.float16, 2), "F32": (np.float32, 4),
          "U8": (np.uint8, 1), "F8_E4M3": (E4M3, 1)}


# ---- safetensors, read by hand (the package is checked separately) ---------

def st_read(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        data[name] = (info["dtype"], tuple(info["shape"]), blob[8 + n + b:8 + n + e])
    return data, meta


def st_write(path, tensors, meta=None):
    header, off, chunks = {}, 0, []
    if meta:
        header["__metadata__"] = meta
    for name, arr, dt in tensors:
        raw = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        chunks.append(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def as_f32(dtype, shape, raw):
    t, _ = DTYPES[dtype]
    return np.frombuffer(raw, dtype=t).reshape(shape).astype(np.float32)


def open_set(path):
    """Every tensor of a file or of a checkpoint directory, with metadata."""
    files = [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if f.endswith(".safetensors") and not f.startswith("."))
    tensors, metas = {}, {}
    for f in files:
        d, m = st_read(f)
        for k, v in d.items():
            if k in tensors:
                raise SystemExit(f"tensor {k} twice")
            tensors[k] = v
            metas[k] = m
    return tensors, metas, files


# ---- the recipes ----------------------------------------------------------------

def e4m3_bytes(x):
    return np.asarray(x, dtype=F32).astype(E4M3).view(np.uint8)


def e4m3_values(b):
    return np.asarray(b, dtype=np.uint8).view(E4M3).astype(F32)


def e2m1_codes(q):
    """Nearest E2M1 (ml_dtypes: ties to even, saturating) with the sign bit
    of the producers' `q < 0` test (so -0.0 gives code 0)."""
    q = np.asarray(q, dtype=F32)
    mag = np.minimum(np.abs(q), F32(6)).astype(E2M1).view(np.uint8) & 7
    return (mag | np.where(q < 0, 8, 0)).astype(np.uint8)


SRC_NP = {"BF16": BF16, "F16": np.float16, "F32": np.float32}


def round_src(x, dt):
    """float32 x rounded to the source dtype dt and back (torch computes an
    operation on bf16 or f16 tensors in float32 and rounds the result)."""
    return np.asarray(x, dtype=F32).astype(SRC_NP[dt]).astype(F32)


def tensor_scale(recipe, amax, dt="BF16"):
    """((weight_scale_2, weight_global_scale), what the block step needs).
    Each recipe computes both stored forms its own way: the multiplier S
    for Model Optimizer names, the divisor 1/S for compressed-tensors, whose
    generate_gparam computes 2688 / amax as amax.reciprocal() * 2688 in the
    weight's dtype dt."""
    amax = F32(amax)
    with np.errstate(divide="ignore", over="ignore"):
        if recipe == "modelopt":
            ws2 = amax / F32(2688)
            # NVFP4.md leaves ws2 == 0 undefined (0/0): quantize as for amax 1
            work = ws2 if ws2 != 0 else F32(1) / F32(2688)
            inv = F32(1) / ws2
            return (ws2, inv if np.isfinite(inv) else F32(1)), work
        if recipe == "compressed-tensors":
            tiny = F32(2.0 ** -14) if dt == "F16" else F32(FLT_MIN)
            r = round_src(F32(1) / max(amax, tiny), dt)
            gs = F32(round_src(r * F32(2688), dt))
            if not np.isfinite(gs):
                gs = F32(1)
            return (F32(1) / gs, gs), gs
        s_enc = F32(2688) / amax if amax != 0 else F32(1)
        if s_enc == 0 or not np.isfinite(s_enc):
            s_enc = F32(1)
        s_dec = F32(1) / s_enc
        return (s_dec, s_enc), (s_enc, s_dec)


def quantize(w, recipe, block, amax, dt="BF16"):
    """w: float32 [R, C] (values of dtype dt). Returns packed uint8
    [R, Cp/2], scales [R, Cp/16]."""
    R, C = w.shape
    Cp = -(-C // 16) * 16
    x = np.zeros((R, Cp), dtype=F32)
    x[:, :C] = w
    nb = Cp // 16
    blocks = x.reshape(R, nb, 16)
    bamax = np.abs(blocks).max(axis=2) if R and nb else np.zeros((R, nb), F32)
    if block == "2d" and R:
        Rp = -(-R // 16) * 16
        t = np.zeros((Rp, nb), dtype=F32)
        t[:R] = bamax
        tile = t.reshape(Rp // 16, 16, nb).max(axis=1)
        bamax = np.repeat(tile, 16, axis=0)[:R]
    stored, k = tensor_scale(recipe, amax, dt)
    if recipe == "modelopt":
        ws2 = k
        pbs = bamax / (F32(6) * ws2)
        pbs = np.where(pbs == 0, F32(1), pbs)
        s8 = e4m3_bytes(np.clip(pbs, F32(2.0 ** -9), F32(448)))
        d = e4m3_values(s8) * ws2
        q = blocks / d[:, :, None]
    elif recipe == "compressed-tensors":
        gs = k
        pre = gs * round_src(bamax / F32(6), dt)
        s8 = e4m3_bytes(np.clip(pre, F32(0), F32(448)))
        s8 = np.where(e4m3_values(s8) == 0, np.uint8(0x20), s8)
        d = e4m3_values(s8) / gs
        q = np.clip(blocks / d[:, :, None], F32(-6), F32(6))
    else:
        s_enc, s_dec = k
        s8 = e4m3_bytes(np.minimum(bamax * (s_enc * (F32(1) / F32(6))), F32(448)))
        # a zero scale divides by zero and a huge inverse overflows to Inf:
        # both are the recipe's arithmetic, and saturate to code 7
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            inv = np.minimum(F32(1) / (e4m3_values(s8) * s_dec), F32(FLT_MAX))
            q = blocks * inv[:, :, None]
    codes = e2m1_codes(q).reshape(R, Cp)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, s8.astype(np.uint8), stored


def decode(packed, scales, rows, cols, tscale, divide):
    lut = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], F32)
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    codes[:, 0::2] = packed & 15
    codes[:, 1::2] = packed >> 4
    s = e4m3_values(scales)
    f = s / F32(tscale) if divide else s * F32(tscale)
    v = lut[codes] * np.repeat(f, 16, axis=1)
    return v[:rows, :cols]


# ---- selection, groups, names -------------------------------------------------

LINEAR = re.compile(r"(self_attn\.[qkvo]_proj|mlp\.experts\.\d+\.(gate|up|down)_proj|"
                    r"block_sparse_moe\.experts\.\d+\.w[123]|mlp\.(gate|up|down)_proj|"
                    r"shared_experts?\.(gate|up|down)_proj)\.weight$")


def selected(name, dtype, shape):
    return dtype in ("BF16", "F16", "F32") and len(shape) == 2 and bool(LINEAR.search(name))


def group_key(name):
    m = re.match(r"(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj|w1|w3)\.weight$", name)
    if not m:
        return None
    kind = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gu",
            "up_proj": "gu", "w1": "w13", "w3": "w13"}[m.group(2)]
    return m.group(1) + "/" + kind


NAMES = {
    "modelopt": {"rowwise": (".weight", ".weight_scale"),
                 "columnwise": (".weight_colwise", ".weight_colwise_scale"),
                 "tscale": (".weight_scale_2", ())},
    "compressed-tensors": {"rowwise": (".weight_packed", ".weight_scale"),
                           "columnwise": (".weight_packed_colwise", ".weight_scale_colwise"),
                           "tscale": (".weight_global_scale", (1,))},
}


def fail(msgs, text):
    msgs.append(text)
    if len(msgs) <= 20:
        print("oracle: " + text, file=sys.stderr)


def check_with_package(files, want, msgs):
    """The real safetensors package must load every output file and see the
    tensors parsed here."""
    from safetensors import safe_open
    seen = 0
    for path in files:
        with safe_open(path, framework="np") as f:
            for k in f.keys():
                arr = f.get_tensor(k)
                seen += 1
                dt, shape, raw = want[k]
                if tuple(arr.shape) != shape or arr.tobytes() != raw:
                    fail(msgs, f"safetensors package reads tensor {k} of {path} differently")
    if seen != len(want):
        fail(msgs, f"safetensors package saw {seen} tensors, expected {len(want)}")


def cmd_check(a):
    src, _, _ = open_set(a.src)
    out, metas, files = open_set(a.quantized)
    fmt = a.format or ("compressed-tensors" if a.recipe == "compressed-tensors" else "modelopt")
    names = NAMES[fmt]
    layouts = ["rowwise", "columnwise"] if a.layout == "both" else [a.layout]
    msgs, expected = [], set()
    sel = {n: v for n, v in src.items() if selected(n, v[0], v[1])}
    amax = {n: float(np.abs(as_f32(*v)).max()) if np.prod(v[1]) else 0.0 for n, v in sel.items()}
    gmax = {}
    if not a.no_fuse:
        keys = {}
        for n in sel:
            k = group_key(n)
            if k:
                keys.setdefault(k, []).append(n)
        for members in keys.values():
            if len(members) > 1:
                m = max(amax[n] for n in members)
                for n in members:
                    gmax[n] = m
    for name, (dt, shape, raw) in src.items():
        if name not in sel:
            expected.add(name)
            if name not in out or out[name] != (dt, shape, raw):
                fail(msgs, f"tensor {name} is not copied unchanged")
            continue
        p = name[:-len(".weight")]
        w = as_f32(dt, shape, raw)
        tamax = gmax.get(name, amax[name])
        for lay in layouts:
            mat = w if lay == "rowwise" else np.ascontiguousarray(w.T)
            packed, scales, stored = quantize(mat, a.recipe, a.block, tamax, dt)
            pn, sn = p + names[lay][0], p + names[lay][1]
            expected.update((pn, sn))
            for n, arr, want_dt in ((pn, packed, "U8"), (sn, scales, "F8_E4M3")):
                got = out.get(n)
                if got is None:
                    fail(msgs, f"missing tensor {n}")
                elif got[0] != want_dt or got[1] != arr.shape:
                    fail(msgs, f"tensor {n}: {got[0]} {list(got[1])}, expected {want_dt} {list(arr.shape)}")
                elif got[2] != arr.tobytes():
                    diff = np.frombuffer(got[2], np.uint8) != arr.reshape(-1)
                    fail(msgs, f"tensor {n}: {int(diff.sum())} of {diff.size} bytes differ "
                               f"(first at byte {int(np.argmax(diff))})")
        tn, tshape = p + names["tscale"][0], names["tscale"][1]
        expected.add(tn)
        got = out.get(tn)
        value = stored[0 if fmt == "modelopt" else 1]
        want = np.array(value, dtype=F32).reshape(tshape)
        if got is None or got[0] != "F32" or got[1] != tshape or got[2] != want.tobytes():
            fail(msgs, f"tensor {tn}: expected F32 {list(tshape)} {float(value)!r}")
        meta = metas.get(tn, {}).get("msinv.nvfp4")
        entry = json.loads(meta)["tensors"].get(p) if meta else None
        if not entry or entry["shape"] != list(shape) or entry["dtype"] != dt:
            fail(msgs, f"metadata of {p} does not record shape {list(shape)} and dtype {dt}")
    for n in out:
        if n not in expected:
            fail(msgs, f"unexpected tensor {n}")
    want = {k: v for k, v in out.items()}
    check_with_package(files, want, msgs)
    q = sum(1 for _ in sel)
    if msgs:
        print(f"oracle: {len(msgs)} differences ({a.recipe}, {a.block}, {a.layout}, {fmt})")
        return 1
    print(f"oracle: {q} weights equal ({a.recipe}, {a.block}, {a.layout}, {fmt})")
    return 0


def cmd_check_deq(a):
    q, metas, _ = open_set(a.quantized)
    d, _, files = open_set(a.dequantized)
    msgs, n = [], 0
    for name in q:
        for fmt, names in NAMES.items():
            pn, sn = names["rowwise"]
            tn = names["tscale"][0]
            if not name.endswith(sn) or name.endswith("_colwise_scale"):
                continue
            p = name[:-len(sn)]
            if p + pn not in q or p + tn not in q or q[p + pn][0] != "U8":
                continue
            meta = metas[name].get("msinv.nvfp4")
            rows, cols = json.loads(meta)["tensors"][p]["shape"]
            packed = np.frombuffer(q[p + pn][2], np.uint8).reshape(q[p + pn][1])
            scales = np.frombuffer(q[name][2], np.uint8).reshape(q[name][1])
            ts = np.frombuffer(q[p + tn][2], F32)[0]
            v = decode(packed, scales, rows, cols, ts, fmt == "compressed-tensors")
            want = v.astype(BF16) if a.dtype == "bf16" else v
            got = d.get(p + ".weight")
            n += 1
            if got is None or got[2] != want.tobytes():
                fail(msgs, f"dequantized {p}.weight differs")
    check_with_package(files, d, msgs)
    if msgs or n == 0:
        print(f"oracle: {len(msgs)} differences in {n} weights")
        return 1
    print(f"oracle: {n} dequantized weights equal")
    return 0


def cmd_gen(a):
    rng = np.random.default_rng(a.seed)
    tensors = []

    def add(name, shape, kind="normal"):
        n = int(np.prod(shape))
        mag = np.exp2(rng.uniform(-8, 2, n)).astype(F32) * (1 + rng.random(n, dtype=F32))
        if kind == "ties":
            # Exact ties in every recipe: tensor amax 2688 (6 * 448) makes
            # the tensor scale 1; a block whose maximum is 6*s with s a
            # power of two gets block scale s, and s times an E2M1
            # threshold lands exactly on it.
            rows, cols = shape
            s = np.exp2(rng.integers(-6, 3, (rows, cols // 16))).astype(F32)
            s[0, 0] = 448
            t = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6], F32)
            m = t[rng.integers(0, 8, (rows, cols // 16, 16))]
            m[:, :, 0] = 6
            mag = (m * s[:, :, None]).reshape(-1)
        elif kind == "wide":
            mag = np.exp2(rng.uniform(-60, 40, n)).astype(F32)
        v = np.where(rng.random(n) < 0.5, -mag, mag).astype(F32)
        v = np.where(v == 0, F32(1), v)
        tensors.append((name, v.astype(BF16).reshape(shape), "BF16"))

    add("model.embed_tokens.weight", (40, 32))
    for layer in range(2):
        b = f"model.layers.{layer}"
        add(f"{b}.input_layernorm.weight", (48,))
        add(f"{b}.self_attn.q_proj.weight", (48, 48))
        add(f"{b}.self_attn.k_proj.weight", (16, 48), "ties")
        add(f"{b}.self_attn.v_proj.weight", (16, 48))
        add(f"{b}.self_attn.o_proj.weight", (48, 40), "wide")
        add(f"{b}.mlp.gate.weight", (4, 48))
        for e in range(3):
            add(f"{b}.mlp.experts.{e}.gate_proj.weight", (24, 48), "ties" if e == 1 else "normal")
            add(f"{b}.mlp.experts.{e}.up_proj.weight", (24, 48))
            add(f"{b}.mlp.experts.{e}.down_proj.weight", (48, 24), "wide" if e == 2 else "normal")
    add("model.layers.0.mlp.experts.9.down_proj.weight", (33, 17))
    add("model.norm.weight", (48,))
    add("lm_head.weight", (40, 48))
    st_write(a.out, tensors, {"format": "pt"})
    return 0


def cmd_bench(a):
    src, _, _ = open_set(a.src)
    mats = [as_f32(*v) for v in src.values() if len(v[1]) == 2 and v[0] in ("BF16", "F16", "F32")]
    nbytes = sum(len(v[2]) for v in src.values() if len(v[1]) == 2 and v[0] in ("BF16", "F16", "F32"))
    best = None
    for _ in range(a.repeat):
        # CPU seconds, as the C benchmark's one-thread runs
        t0 = time.process_time()
        for m in mats:
            quantize(m, a.recipe, "1d", float(np.abs(m).max()))
        dt = time.process_time() - t0
        best = dt if best is None else min(best, dt)
    print(f"oracle {nbytes} {best:.6f}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("out")
    g.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("check")
    c.add_argument("src")
    c.add_argument("quantized")
    c.add_argument("--recipe", required=True, choices=["modelopt", "compressed-tensors", "te"])
    c.add_argument("--block", default="1d", choices=["1d", "2d"])
    c.add_argument("--layout", default="rowwise", choices=["rowwise", "columnwise", "both"])
    c.add_argument("--format", choices=["modelopt", "compressed-tensors"])
    c.add_argument("--no-fuse", action="store_true")
    d = sub.add_parser("check-deq")
    d.add_argument("quantized")
    d.add_argument("dequantized")
    d.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    b = sub.add_parser("bench")
    b.add_argument("src")
    b.add_argument("--recipe", default="modelopt", choices=["modelopt", "compressed-tensors", "te"])
    b.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    return {"gen": cmd_gen, "check": cmd_check, "check-deq": cmd_check_deq, "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
