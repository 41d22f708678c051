#!/usr/bin/env python3
"""train_report.py: the results table of the trainer benchmark
(bench_train_gpu.sh), from what the runs left in one directory:

    config.json              the model's (for the FLOP count)
    m-resident.jsonl         mstrain --metrics, one line per step
    m-on-demand.jsonl
    m-grouped.jsonl          (colwise resident, --expert-gemm grouped)
    m-fused.jsonl            (colwise resident, --expert-gemm fused)
    prof-resident.json       mstrain --profile (optional): {"step_ms",
    prof-on-demand.json      "kernels": [{"name", "ms", "calls"}],
    prof-grouped.json
    prof-fused.json
                             "colwise_ms", "base_bytes", "peak_bytes"}
    torch.txt                train_torch.py's output (optional)
    smi-<run>.csv            nvidia-smi sampled through a run (optional):
                             SM clock, its maximum, power, power limit
                             (MHz, W, no units) and the active throttle
                             reasons' bit mask; <run> a mode or torch
    footprint-<mode>.json    msinv footprint --json (optional)

A row is written only for a run that finished and left its numbers: a
missing or failed run is a line that says so, never a number. Our step
time is the median of the steps after the first --skip (warm-up); tokens/s
is batch x seq_len over that median, the same count train_torch.py uses;
TFLOP/s counts train_flops.step_flops for every row.

    train_report.py DIR --batch B --seq S --skip 2 --peak 782 --device NAME
                    --date DATE --versions TEXT --out FILE.md
"""
import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_flops  # noqa: E402

MODES = ("resident", "on-demand", "flash", "grouped", "fused")
# what each run is: its colwise mode, and for the others what differs
RUN_NAME = {"resident": "colwise resident", "on-demand": "colwise on-demand",
            "flash": "colwise resident, the project's flash attention",
            "grouped": "colwise resident, grouped expert GEMMs",
            "fused": "colwise resident, grouped expert GEMMs decoding NVFP4 inside"}
RUN_ARGS = {"resident": "", "on-demand": "", "flash": " --attention flash",
            "grouped": " --expert-gemm grouped", "fused": " --expert-gemm fused"}
GIB = float(1 << 30)


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def metrics(path, skip):
    """(median step seconds after the first `skip` steps, steps used, last loss) or None."""
    try:
        with open(path) as f:
            rows = [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        return None
    rows = [r for r in rows if r.get("step", 0) > skip]
    if not rows:
        return None
    return statistics.median(r["seconds"] for r in rows), len(rows), rows[-1]["loss"]


def torch_lines(path):
    """{"TORCH_EAGER": {...}, "TORCH_COMPILE": {...} or "failed: ...", "VERSIONS": {...}}"""
    out = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for l in lines:
        key, _, rest = l.partition(" ")
        if key not in ("TORCH_EAGER", "TORCH_COMPILE", "VERSIONS", "LORA"):
            continue
        if rest.startswith(("failed:", "skipped:")):
            out[key] = rest
            continue
        out[key] = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
    return out


# the trainer's host functions that launch one kernel (their call stands
# where a launch statement would): the kernel each launches (norm_rope and
# rope_norm_bwd: the family, its register form or its shared-memory one)
LAUNCHERS = {"rms_fwd": "k_rms", "rms_in": "k_rms", "rms_bwd": "k_rms_bwd",
             "norm_rope": "k_norm_rope", "rope_norm_bwd": "k_rope_norm_bwd"}


# nvidia-smi's clocks_throttle_reasons bits that slow the clock under
# load (nvml's clocksThrottleReason*): the software power cap, and the
# slowdowns that come from the hardware or from heat
SMI_POWER_CAP = 0x4
SMI_SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80


def smi_samples(path):
    """(clock MHz, max clock MHz, power W, limit W, reasons) of each sample
    of an nvidia-smi CSV with numbers in every field; None: no file"""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = []
    for ln in lines:
        v = [x.strip() for x in ln.split(",")]
        if len(v) != 5:
            continue
        try:
            out.append((float(v[0]), float(v[1]), float(v[2]), float(v[3]), int(v[4], 16)))
        except ValueError:
            continue
    return out


def smi_row(name, samples):
    """one row of the clock table: the samples under load only (power at
    least 40% of the limit: the run's loading and verifying are not the
    step's conditions); None where there are none"""
    busy = [x for x in samples if x[3] > 0 and x[2] >= 0.4 * x[3]]
    if not busy:
        return None
    clk = sorted(x[0] for x in busy)
    pw = sorted(x[2] for x in busy)
    n = len(busy)
    cap = sum(1 for x in busy if x[4] & SMI_POWER_CAP)
    slow = sum(1 for x in busy if x[4] & SMI_SLOWDOWN)
    return ("| %s | %d | %d (%d-%d) | %d | %.0f (%.0f) | %.0f | %d of %d | %d of %d |"
            % (name, n, clk[n // 2], clk[0], clk[-1], max(x[1] for x in busy), pw[n // 2],
               pw[-1], busy[0][3], cap, n, slow, n))


def site_label(site, src):
    """A launch site "launch at train.cu:N" as "k_name (train.cu:N)": the
    kernel of the launch statement above line N of src (its LK() follows
    the launch), no further up than the check of the launch before it,
    where src has one; any other site as it is."""
    pre = "launch at train.cu:"
    if not site.startswith(pre) or not src:
        return site
    try:
        n = int(site[len(pre):])
    except ValueError:
        return site
    for i in range(min(n, len(src)) - 1, max(n - 14, 0) - 1, -1):
        if i < n - 1 and "LK();" in src[i]:
            break
        m = re.search(r"\b(k_\w+)(<[^<>]*>)?<<<", src[i])
        if m:
            return "%s (train.cu:%d)" % (m.group(1), n)
        m = re.search(r"\b(%s)\(" % "|".join(LAUNCHERS), src[i])
        if m:
            return "%s (train.cu:%d)" % (LAUNCHERS[m.group(1)], n)
    return site


def gib(n):
    return "%.1f" % (n / GIB) if n is not None else "–"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--peak", type=float, default=782.0)
    ap.add_argument("--device", required=True)
    ap.add_argument("--mstrain-device", default="cuda")
    ap.add_argument("--date", required=True)
    ap.add_argument("--versions", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default=" ".join(MODES),
                    help="our runs this bench was asked for (one of the rest without "
                         "metrics in DIR is noted as not run, not as failed)")
    a = ap.parse_args()
    d = a.dir
    cfg = load_json(os.path.join(d, "config.json"))
    if cfg is None:
        print("train_report: %s/config.json: cannot be read" % d, file=sys.stderr)
        return 3
    flops = train_flops.step_flops(cfg, a.batch, a.seq)
    tokens = a.batch * a.seq
    notes = []
    rows = []  # (name, ms, peak bytes or None)

    ours = {}
    ran = a.modes.split()
    for m in MODES:
        r = metrics(os.path.join(d, "m-%s.jsonl" % m), a.skip)
        if r is None and m not in ran:
            notes.append("ours, %s: not run (MS_BENCH_MODES)" % m)
            continue
        prof = load_json(os.path.join(d, "prof-%s.json" % m))
        if r is None:
            notes.append("ours, %s: no timed step (the run failed or left fewer than %d steps): "
                         "row left out" % (m, a.skip + 1))
            continue
        if prof is None:
            notes.append("ours, %s: no profile (mstrain --profile absent or not written): "
                         "no peak memory, kernel table or base bytes" % m)
        ours[m] = (r, prof)
        extra = "median of %d steps after %d warm-up, last loss %.4f" % (r[1], a.skip, r[2])
        if prof and prof.get("attention"):
            extra += ", attention: %s" % prof["attention"]
        rows.append(("ours, %s (mstrain --device %s%s)" % (RUN_NAME[m], a.mstrain_device,
                                                           RUN_ARGS[m]),
                     r[0] * 1e3, prof.get("peak_bytes") if prof else None, extra))

    t = torch_lines(os.path.join(d, "torch.txt"))
    eager_ms = None
    for key, name in (("TORCH_EAGER", "PyTorch eager, transformers + PEFT, grouped_mm"),
                      ("TORCH_COMPILE", "torch.compile of the same (mode default)")):
        v = t.get(key)
        if v is None:
            notes.append("%s: not run (no PyTorch with the device here, or it failed before "
                         "this row): row left out" % name)
            continue
        if isinstance(v, str):
            notes.append("%s: %s" % (name, v))
            continue
        ms = float(v["ms"])
        pk = int(v["peak_alloc"]) if v.get("peak_alloc", "na") != "na" else None
        extra = "median of %s steps, loss %s" % (v.get("steps", "?"), v.get("loss", "?"))
        if "compile_s" in v:
            extra += ", warm-up incl. compilation %s s" % v["compile_s"]
        if pk is not None:
            extra += ", reserved %s GiB" % gib(int(v["peak_reserved"]))
        rows.append((name, ms, pk, extra))
        if key == "TORCH_EAGER":
            eager_ms = ms

    L = []
    L.append("# Trainer benchmark: the LoRA step, mstrain against PyTorch")
    L.append("")
    L.append("Written by `tools/bench/bench_train_gpu.sh` (`make bench-train-gpu`).")
    L.append("")
    L.append("- device: %s" % a.device)
    L.append("- date: %s" % a.date)
    if a.versions:
        L.append("- versions: %s" % a.versions)
    tv = t.get("VERSIONS")
    if isinstance(tv, dict):
        L.append("- PyTorch side: torch %s, transformers %s, peft %s, CUDA %s"
                 % (tv.get("torch"), tv.get("transformers"), tv.get("peft"), tv.get("cuda")))
    L.append("- model: generated Qwen3-MoE (tools/bench/gen_train_model.py): hidden %d, "
             "%d layers, %d heads / %d KV heads of %d, %d experts top-%d, expert ffn %d, "
             "vocab %d; %s"
             % (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                cfg["num_key_value_heads"], cfg.get("head_dim") or 0,
                cfg.get("num_experts", cfg.get("num_local_experts")),
                cfg["num_experts_per_tok"], cfg["moe_intermediate_size"], cfg["vocab_size"],
                "NVFP4 base (2D blocks) for ours, the bf16 checkpoint for PyTorch"))
    L.append("- step: batch %d x %d tokens (%d tokens), LoRA r=16 alpha=32 on the experts "
             "and q/v, AdamW; both sides on the same uniformly random token ids "
             "(gen_train_data.py), every token but the first a target; mstrain %d steps"
             % (a.batch, a.seq, tokens, a.steps))
    L.append("- FLOPs per step: %.4g (2x the forward, causal attention: "
             "tools/bench/train_flops.py); %% of a bf16 matrix peak of %g TFLOP/s"
             % (flops, a.peak))
    L.append("")
    if rows:
        L.append("| run | ms / step | tokens/s | vs torch eager | TFLOP/s | % of bf16 peak "
                 "| peak memory (GiB) | |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---|")
        for name, ms, pk, extra in rows:
            tf = flops / (ms / 1e3) / 1e12
            ratio = "%.2fx" % (eager_ms / ms) if eager_ms else "–"
            L.append("| %s | %.1f | %.0f | %s | %.1f | %.1f%% | %s | %s |"
                     % (name, ms, tokens / (ms / 1e3), ratio, tf, 100 * tf / a.peak, gib(pk),
                        extra))
        L.append("")
        L.append("vs torch eager: its step time over the row's (tokens/s ratio). Peak "
                 "memory: torch.cuda.max_memory_allocated for PyTorch; the profile's "
                 "peak_bytes for ours.")
        L.append("")
    else:
        L.append("No run finished: no table.")
        L.append("")
    if notes:
        L.append("Left out:")
        L.append("")
        for n in notes:
            L.append("- %s" % n)
        L.append("")

    # the clock each run was given (nvidia-smi sampled through it)
    smi = []
    for m in MODES:
        sm = smi_samples(os.path.join(d, "smi-%s.csv" % m))
        if m in ours and sm:
            smi.append(smi_row("ours, %s" % m, sm))
    sm = smi_samples(os.path.join(d, "smi-torch.csv"))
    if sm and any(k in t and not isinstance(t[k], str) for k in ("TORCH_EAGER", "TORCH_COMPILE")):
        smi.append(smi_row("PyTorch (its eager and compiled runs together)", sm))
    smi = [r for r in smi if r]
    if smi:
        L.append("## The GPU's clock and power in each run")
        L.append("")
        L.append("nvidia-smi every 100 ms through each run, the samples under load only "
                 "(power at least 40% of the limit). nvidia-smi's power is averaged over "
                 "its own window; the clock and the throttle reasons are the sample's. "
                 "Power cap: the software power cap among the active throttle reasons; "
                 "slowdown: a hardware, thermal or power-brake slowdown.")
        L.append("")
        L.append("| run | samples | SM clock MHz: median (min-max) | max clock MHz | "
                 "power W: median (max) | limit W | power cap | slowdown |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        L.extend(smi)
        L.append("")
    # the on-demand transpose, the base bytes of each mode
    prof = {m: ours[m][1] for m in ours if ours[m][1]}
    if "on-demand" in prof:
        p = prof["on-demand"]
        step_ms = p.get("step_ms") or ours["on-demand"][0][0] * 1e3
        if p.get("colwise_ms") is not None and step_ms:
            L.append("## The on-demand transpose")
            L.append("")
            if p.get("colwise_stream") == "decode":
                # the decode ahead: the transposes run on the decode stream,
                # beside the main stream's work; what the step lost to them
                # is at most the main stream's wait for that stream
                w = p.get("decode_wait_ms") or 0.0
                L.append("Building the columnwise copy of each layer (exact transpose "
                         "kernel) took %.2f ms a step on the decode stream, beside the "
                         "main stream's work (%.1f%% of the %.1f ms step, had it run in "
                         "line); the main stream waited %.2f ms a step in all for that "
                         "stream's transposes and decodes: %.1f%% of the step."
                         % (p["colwise_ms"], 100 * p["colwise_ms"] / step_ms, step_ms, w,
                            100 * w / step_ms))
            else:
                L.append("Building the columnwise copy of each layer (exact transpose "
                         "kernel) took %.2f ms of a %.1f ms step: %.1f%%."
                         % (p["colwise_ms"], step_ms, 100 * p["colwise_ms"] / step_ms))
            L.append("")
    fps = {m: load_json(os.path.join(d, "footprint-%s.json" % m)) for m in MODES}
    if prof or any(isinstance(f, dict) for f in fps.values()):
        L.append("## Memory of each mode")
        L.append("")
        L.append("Measured by mstrain --profile: the NVFP4 base bytes it allocated "
                 "(codes and scales, both layouts), the peak of everything it allocated, "
                 "and what cudaMemGetInfo saw the device lose to those allocations; "
                 "predicted: `msinv footprint --json` on the same plan, its trainer "
                 "part for that colwise mode (the whole GPU trainer: NVFP4, float "
                 "weights, LoRA with gradients and AdamW, activations, scratch).")
        L.append("")
        L.append("| run | NVFP4 base bytes | peak allocated | cudaMemGetInfo | "
                 "msinv footprint | footprint / allocated | footprint / cudaMemGetInfo |")
        L.append("|---|---:|---:|---:|---:|---:|---:|")
        for m in MODES:
            p = prof.get(m) or {}
            # msinv footprint predicts the per-expert GEMMs of each colwise
            # mode: the grouped run has no prediction of its own
            f = fps[m] if isinstance(fps[m], dict) and m in ("resident", "on-demand") else {}
            tr = f.get("trainer") if isinstance(f.get("trainer"), dict) else {}
            base, peak = p.get("base_bytes"), p.get("peak_bytes")
            meas = (p.get("mem") or {}).get("measured")
            pred = (tr.get(m) or {}).get("total")
            if base is None and peak is None and pred is None:
                continue
            fmt = lambda n: "%d (%.2f GiB)" % (n, n / GIB) if n is not None else "–"
            ratio = lambda a, b: "%.4f" % (a / b) if a is not None and b else "–"
            L.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                m, fmt(base), fmt(peak), fmt(meas), fmt(pred), ratio(pred, peak),
                ratio(pred, meas)))
        if all(prof.get(m, {}).get("base_bytes") for m in ("resident", "on-demand")):
            L.append("")
            L.append("NVFP4 base bytes, on-demand / resident: %.3f (the bound: <= 0.52)"
                     % (prof["on-demand"]["base_bytes"] / prof["resident"]["base_bytes"]))
        L.append("")
    for m in MODES:
        if m not in prof or not prof[m].get("kernels"):
            continue
        p = prof[m]
        step_ms = p.get("step_ms") or ours[m][0][0] * 1e3
        ks = sorted(p["kernels"], key=lambda k: -k["ms"])
        # the decode stream's phases run beside the main stream's: summed
        # apart (their share is of the step they overlap)
        total = sum(k["ms"] for k in p["kernels"] if k.get("stream", "main") == "main")
        side = sum(k["ms"] for k in p["kernels"] if k.get("stream", "main") != "main")
        L.append("## Where the time goes: %s (mstrain --profile)" % RUN_NAME[m])
        L.append("")
        line = ("Top 15 of %d kernels by time per step; the step: %.1f ms, all kernels: "
                "%.1f ms (%.1f%%)." % (len(ks), step_ms, total, 100 * total / step_ms))
        if side:
            line = ("Top 15 of %d kernels by time per step; the step: %.1f ms, the main "
                    "stream's kernels: %.1f ms (%.1f%%); beside them, the decode stream's "
                    "(the next layer's weights decoded while this one runs): %.1f ms."
                    % (len(ks), step_ms, total, 100 * total / step_ms, side))
        L.append(line)
        L.append("")
        L.append("| kernel | ms / step | GPU idle in it | calls | share of step |")
        L.append("|---|---:|---:|---:|---:|")
        for k in ks[:15]:
            L.append("| `%s` | %.2f | %.2f | %d | %.1f%% |" % (
                k["name"].replace("|", "\\|"), k["ms"], k.get("idle_ms", 0), k["calls"],
                100 * k["ms"] / step_ms))
        L.append("")
    # the per-launch profile (bench_train_gpu.sh's short run under
    # MS_PROFILE_SITES), where there is one
    sp = os.path.join(a.dir, "prof-sites.json")
    if os.path.exists(sp):
        with open(sp) as f:
            p = json.load(f)
        ss = sorted(p.get("sites", []), key=lambda k: -k["ms"])
        if ss:
            total = sum(k["ms"] for k in ss)
            steps = max(p.get("steps", 1), 1)
            L.append("## Where the time goes, launch by launch: colwise resident "
                     "(mstrain --profile, MS_PROFILE_SITES)")
            L.append("")
            L.append("Top 30 of %d launch sites by GPU time per step (a short run of its own: "
                     "an event after every launch; its step %.1f ms, the sites' sum %.1f ms). "
                     "A site is a kernel launch in kernels/train.cu (the kernel, and the line "
                     "of the check after its launch), a GEMM "
                     "shape (M x N x K, row-major, cuBLAS) or a library call; each interval "
                     "between two events is counted to the launch it ends with. GPU idle: "
                     "the part of that time the GPU had finished the work before and the "
                     "host had not yet queued the launch (the host's clock at each event "
                     "against the GPU's, aligned so that no event runs before it is queued)."
                     % (len(ss), p.get("step_ms", 0), total))
            L.append("")
            L.append("| site | ms / step | GPU idle in it | launches / step | share |")
            L.append("|---|---:|---:|---:|---:|")
            try:
                with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                       "kernels", "train.cu")) as f:
                    src = f.read().splitlines()
            except OSError:
                src = None
            for k in ss[:30]:
                L.append("| `%s` | %.3f | %.3f | %.0f | %.1f%% |" % (
                    site_label(k["site"], src).replace("|", "\\|"), k["ms"],
                    k.get("idle_ms", 0), k["calls"] / steps, 100 * k["ms"] / total))
            L.append("")
    with open(a.out, "w") as f:
        f.write("\n".join(L))
    return 0


if __name__ == "__main__":
    sys.exit(main())
