"""Compare msconvert's output with a producer's golden checkpoint.

  compare_golden.py OURS GOLDEN SOURCE {ct|mo}

OURS: msconvert quantize's output directory; GOLDEN: the producer's;
SOURCE: the high-precision fixture both came from. Checked:
  - the same set of tensors; those of quantized modules (packed, block
    scales, tensor scale) with the golden's dtype, shape and bytes, the
    others with SOURCE's bytes (the producers reload the model, and save
    some buffers in the dtype the model keeps them in: DeepSeek's
    e_score_correction_bias in f32; printed as a note);
  - llm-compressor renames Mixtral's experts (w1/w3/w2 become
    gate_proj/up_proj/down_proj: transformers 5 fuses them on load and
    llm-compressor splits them again with those names); msconvert keeps the
    checkpoint's names, which vLLM's Mixtral loader reads, and the golden's
    names are mapped back (a note);
  - the same set of quantized modules;
  - the quantization config fields loaders read (config.json's
    quantization_config; for Model Optimizer also hf_quant_config.json),
    ignore / exclude_modules compared as sets;
  - every other value of config.json exactly as in SOURCE (number types
    included: 1.0 stays a float), and every other JSON file byte for byte.
Prints one line per difference and exits 1 when there is any, 0 when
everything checked is equal, 2 on bad input.
"""
import json
import os
import re
import sys

MIXTRAL_RENAMED = re.compile(r"(.*\.block_sparse_moe\.experts\.\d+\.)(gate_proj|up_proj|down_proj)(\..*)$")
MIXTRAL_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}

CT_WEIGHT_KEYS = ["num_bits", "type", "symmetric", "group_size", "strategy",
                  "dynamic", "observer", "scale_dtype", "actorder",
                  "block_structure"]


def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        path = os.path.join(d, f)
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            hdr = json.loads(fh.read(n))
            base = 8 + n
            for k, v in hdr.items():
                if k == "__metadata__":
                    continue
                a, b = v["data_offsets"]
                fh.seek(base + a)
                out[k] = (v["dtype"], tuple(v["shape"]), fh.read(b - a))
    if not out:
        sys.stderr.write(f"compare_golden: no safetensors file in {d}\n")
        sys.exit(2)
    return out


def typed(v):
    """A JSON value with its number types made explicit."""
    if isinstance(v, dict):
        return {k: typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [typed(x) for x in v]
    if isinstance(v, float):
        return ("float", repr(v))
    return (type(v).__name__, v)


def load_json(path):
    with open(path) as f:
        return json.load(f)


def modules(ts, fmt):
    sfx = ".weight_packed" if fmt == "ct" else ".weight_scale_2"
    return {k[:-len(sfx)] for k in ts if k.endswith(sfx)}


def main():
    if len(sys.argv) != 5 or sys.argv[4] not in ("ct", "mo"):
        sys.exit(__doc__)
    ours, golden, source, fmt = sys.argv[1:]
    bad, notes = [], set()
    a, b, src = tensors(ours), tensors(golden), tensors(source)
    renamed = {}
    for k in list(b):
        m = MIXTRAL_RENAMED.match(k)
        if m and k not in a:
            mk = m.group(1) + MIXTRAL_NAMES[m.group(2)] + m.group(3)
            if mk in a:
                renamed[mk] = k
                b[mk] = b.pop(k)
                notes.add("golden: Mixtral experts renamed w1/w3/w2 -> gate_proj/up_proj/down_proj "
                          "(mapped back)")
    mb = modules(b, fmt)
    for k in sorted(set(a) | set(b)):
        if k not in a:
            bad.append(f"tensor {renamed.get(k, k)}: in the golden, not in ours")
        elif k not in b:
            bad.append(f"tensor {k}: in ours, not in the golden")
        elif k in src and not any(k.startswith(m + ".") for m in mb):
            # not part of a quantized module: copied from the source
            if a[k] != src[k]:
                bad.append(f"tensor {k}: not copied unchanged from the source")
            elif a[k][1] != b[k][1]:
                bad.append(f"tensor {k}: ours {list(a[k][1])}, golden {list(b[k][1])}")
            elif a[k] != b[k]:
                notes.add(f"golden: {k} saved as {b[k][0]} (source {src[k][0]})")
        elif a[k][:2] != b[k][:2]:
            bad.append(f"tensor {k}: ours {a[k][0]} {list(a[k][1])}, golden {b[k][0]} {list(b[k][1])}")
        elif a[k][2] != b[k][2]:
            x, y = a[k][2], b[k][2]
            nd = sum(1 for i in range(len(x)) if x[i] != y[i])
            bad.append(f"tensor {k}: {nd} of {len(x)} bytes differ")
    ma = modules(a, fmt)
    if ma != mb:
        bad.append(f"quantized modules differ: only ours {sorted(ma - mb)}, only golden {sorted(mb - ma)}")
    ca = load_json(os.path.join(ours, "config.json"))
    cb = load_json(os.path.join(golden, "config.json"))
    cs = load_json(os.path.join(source, "config.json"))
    qa, qb = ca.pop("quantization_config", None), cb.pop("quantization_config", None)
    if qa is None or qb is None:
        bad.append("config.json: quantization_config missing "
                   + ("in ours" if qa is None else "in the golden"))
        qa, qb = qa or {}, qb or {}
    cs.pop("quantization_config", None)
    if typed(ca) != typed(cs):
        for k in sorted(set(ca) | set(cs)):
            if typed(ca.get(k)) != typed(cs.get(k)):
                bad.append(f"config.json: {k} is {json.dumps(ca.get(k))} in ours, "
                           f"{json.dumps(cs.get(k))} in the source")
    if fmt == "ct":
        for k in ("format", "quant_method", "quantization_status", "version",
                  "kv_cache_scheme"):
            if qa.get(k) != qb.get(k):
                bad.append(f"quantization_config.{k}: ours {qa.get(k)!r}, golden {qb.get(k)!r}")
        if set(qa.get("ignore") or []) != set(qb.get("ignore") or []):
            bad.append(f"quantization_config.ignore: ours {sorted(qa.get('ignore') or [])}, "
                       f"golden {sorted(qb.get('ignore') or [])}")
        ga = (qa.get("config_groups") or {}).get("group_0") or {}
        gb = (qb.get("config_groups") or {}).get("group_0") or {}
        for k in ("format", "targets", "input_activations", "output_activations"):
            if ga.get(k) != gb.get(k):
                bad.append(f"config_groups.group_0.{k}: ours {ga.get(k)!r}, golden {gb.get(k)!r}")
        wa, wb = ga.get("weights") or {}, gb.get("weights") or {}
        for k in CT_WEIGHT_KEYS:
            if wa.get(k) != wb.get(k):
                bad.append(f"config_groups.group_0.weights.{k}: ours {wa.get(k)!r}, golden {wb.get(k)!r}")
    else:
        for k in ("quant_method", "quant_algo", "kv_cache_quant_algo"):
            if qa.get(k) != qb.get(k):
                bad.append(f"quantization_config.{k}: ours {qa.get(k)!r}, golden {qb.get(k)!r}")
        if set(qa.get("ignore") or []) != set(qb.get("ignore") or []):
            bad.append(f"quantization_config.ignore: ours {sorted(qa.get('ignore') or [])}, "
                       f"golden {sorted(qb.get('ignore') or [])}")
        ha = load_json(os.path.join(ours, "hf_quant_config.json"))["quantization"]
        hb = load_json(os.path.join(golden, "hf_quant_config.json"))["quantization"]
        for k in ("quant_algo", "group_size", "kv_cache_quant_algo"):
            if ha.get(k) != hb.get(k):
                bad.append(f"hf_quant_config.json quantization.{k}: ours {ha.get(k)!r}, golden {hb.get(k)!r}")
        if set(ha.get("exclude_modules") or []) != set(hb.get("exclude_modules") or []):
            bad.append(f"hf_quant_config.json exclude_modules: ours {sorted(ha.get('exclude_modules') or [])}, "
                       f"golden {sorted(hb.get('exclude_modules') or [])}")
    for f in sorted(os.listdir(source)):
        if f.endswith(".json") and f not in ("config.json", "model.safetensors.index.json"):
            p = os.path.join(ours, f)
            if not os.path.exists(p):
                bad.append(f"{f}: not copied")
            elif open(p, "rb").read() != open(os.path.join(source, f), "rb").read():
                bad.append(f"{f}: not copied byte for byte")
    for line in sorted(notes):
        print("note: " + line)
    for line in bad:
        print(line)
    print(f"compare_golden: {len(a)} tensors, {len(ma)} quantized modules, "
          f"{len(bad)} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
