#!/usr/bin/env python3
"""train_torch.py: the PyTorch reference of the trainer benchmark, one LoRA
training step as the fastest stock stack runs it: transformers 5 with the
grouped_mm experts implementation (torch.nn.functional.grouped_mm over the
fused [experts, out, in] weights, the library's default, set explicitly
here so a fallback cannot pass unnoticed) and SDPA attention, in bf16;
PEFT LoRA r=16 alpha=32 dropout 0 on the fused experts (target_parameters
mlp.experts.gate_up_proj and mlp.experts.down_proj) and on q_proj/v_proj
(target_modules); torch.optim.AdamW on the LoRA parameters; batches of
token ids, labels = ids (the causal LM loss): consecutive batches of the
sequences of --data (the JSONL file mstrain trains on, gen_train_data.py),
else one batch of random ids (fixed seed).

Warm-up steps first, then each timed step is synchronized and the median
taken (the per-step times are printed too). Then the same with
torch.compile of the model (mode default), if it compiles; if it does
not, one line says why.

    train_torch.py MODEL [--device cuda|cpu] [--batch 4] [--seq 2048] [--data FILE]
                   [--steps 10] [--warmup 3] [--peak 782] [--no-compile]

Machine-readable lines (on stdout):

    VERSIONS torch=.. transformers=.. peft=.. cuda=.. device=..
    TORCH_EAGER ms=.. tok_s=.. tflops=.. peak_share=.. peak_alloc=.. peak_reserved=.. loss=..
    TORCH_COMPILE ms=.. ... compile_s=..      or   TORCH_COMPILE failed: <why>
                                               or   TORCH_COMPILE skipped: --no-compile

ms is the median step in milliseconds; peak_alloc / peak_reserved are
torch.cuda.max_memory_allocated / max_memory_reserved in bytes over the
warm-up and the timed steps (weights included), "na" on the CPU; tflops
counts train_flops.step_flops (2x the forward; see train_flops.py);
peak_share is tflops / --peak. Exit 0; 1 when the eager step failed (the
reason on stderr); 2 on bad usage; 3 when the environment cannot run it.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_flops  # noqa: E402


def one_line(e):
    s = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
    return s[:300]


def read_data(path, seq, vocab):
    """The sequences of a gen_train_data.py file, or a one-line reason."""
    rows = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                ids = json.loads(line)["input_ids"]
                if len(ids) != seq or not all(isinstance(i, int) and 0 <= i < vocab for i in ids):
                    return "%s:%d: not %d token ids below %d" % (path, n, seq, vocab)
                rows.append(ids)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return "%s: %s" % (path, one_line(e))
    return rows


def sync(dev):
    import torch
    if dev == "cuda":
        torch.cuda.synchronize()


def run(name, model, params, batches, a, flops, warmup):
    """Warm up and time a.steps optimizer steps, step k on batches[k % n];
    print NAME's line."""
    import torch
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    k = [0]

    def step():
        ids = batches[k[0] % len(batches)]
        k[0] += 1
        opt.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        return out.loss.detach()

    if a.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(warmup):
        loss = step()
    sync(a.device)
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        sync(a.device)
        times.append((time.perf_counter() - t0) * 1e3)
    lossv = float(loss)
    if not (lossv == lossv and abs(lossv) != float("inf")):
        raise RuntimeError("the loss is not finite (%r)" % lossv)
    ms = statistics.median(times)
    tok_s = a.batch * a.seq / (ms / 1e3)
    tflops = flops / (ms / 1e3) / 1e12
    if a.device == "cuda":
        pa = str(torch.cuda.max_memory_allocated())
        pr = str(torch.cuda.max_memory_reserved())
    else:
        pa = pr = "na"
    extra = " compile_s=%.1f" % warm_s if name == "TORCH_COMPILE" else ""
    print("%s ms=%.3f tok_s=%.1f tflops=%.2f peak_share=%.4f peak_alloc=%s peak_reserved=%s "
          "loss=%.6f steps=%d%s" % (name, ms, tok_s, tflops, tflops / a.peak, pa, pr, lossv,
                                    a.steps, extra))
    print("%s_STEPS_MS %s" % (name, " ".join("%.3f" % t for t in times)))
    sys.stdout.flush()
    del opt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", help="JSONL of gen_train_data.py (default: one batch of "
                    "random ids from --seed)")
    ap.add_argument("--peak", type=float, default=782.0,
                    help="bf16 matrix peak of the device, TFLOP/s (default 782)")
    ap.add_argument("--recompile-limit", type=int, default=0,
                    help="torch._dynamo recompile limit for the compiled run (default: torch's)")
    ap.add_argument("--compile-warmup", type=int, default=5,
                    help="warm-up steps of the compiled run (default 5)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile run")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.batch < 1 or a.seq < 2 or a.peak <= 0:
        ap.error("--steps, --batch, --seq and --peak must be positive")
    try:
        with open(os.path.join(a.model, "config.json")) as f:
            cfg = json.load(f)
        flops = train_flops.step_flops(cfg, a.batch, a.seq)
    except (OSError, ValueError, KeyError) as e:
        print("train_torch: %s: %s" % (a.model, one_line(e)), file=sys.stderr)
        return 2
    try:
        import torch
        import transformers
        import peft
    except ImportError as e:
        print("train_torch: %s" % one_line(e), file=sys.stderr)
        return 3
    if a.device == "cuda" and not torch.cuda.is_available():
        print("train_torch: --device cuda: torch sees no CUDA device", file=sys.stderr)
        return 3
    devname = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    print("VERSIONS torch=%s transformers=%s peft=%s cuda=%s device=%s"
          % (torch.__version__, transformers.__version__, peft.__version__,
             torch.version.cuda, devname.replace(" ", "_")))
    print("FLOPS_STEP %d" % flops)
    sys.stdout.flush()

    model = transformers.AutoModelForCausalLM.from_pretrained(
        a.model, dtype=torch.bfloat16, device_map=a.device,
        attn_implementation="sdpa", experts_implementation="grouped_mm")
    impl = model.config._experts_implementation
    if impl != "grouped_mm":
        print("train_torch: the experts implementation is %r, not grouped_mm" % impl,
              file=sys.stderr)
        return 3
    lcfg = peft.LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0,
        target_modules=["q_proj", "v_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    pm = peft.get_peft_model(model, lcfg)
    pm.train()
    params = [p for p in pm.parameters() if p.requires_grad]
    ntrain = sum(p.numel() for p in params)
    print("LORA params=%d tensors=%d dtype=%s experts_implementation=%s attn=%s"
          % (ntrain, len(params), params[0].dtype, impl, model.config._attn_implementation))
    if a.data:
        rows = read_data(a.data, a.seq, cfg["vocab_size"])
        if isinstance(rows, str):
            print("train_torch: %s" % rows, file=sys.stderr)
            return 2
        if len(rows) < a.batch:
            print("train_torch: %s: %d sequences, fewer than a batch of %d"
                  % (a.data, len(rows), a.batch), file=sys.stderr)
            return 2
        t = torch.tensor(rows, dtype=torch.long)
        batches = [t[j * a.batch:(j + 1) * a.batch].to(a.device)
                   for j in range(len(rows) // a.batch)]
    else:
        g = torch.Generator().manual_seed(a.seed)
        batches = [torch.randint(0, cfg["vocab_size"], (a.batch, a.seq), generator=g).to(a.device)]

    try:
        run("TORCH_EAGER", pm, params, batches, a, flops, a.warmup)
    except Exception as e:  # an out-of-memory or a library error: one line, exit 1
        print("TORCH_EAGER failed: %s" % one_line(e))
        print("train_torch: eager step: %s" % one_line(e), file=sys.stderr)
        return 1
    if a.no_compile:
        print("TORCH_COMPILE skipped: --no-compile")
        return 0
    try:
        # PEFT's expert LoRA (ParamWrapper) registers a parametrization
        # on the experts module at every forward and removes it after, and
        # each registration makes a new class: dynamo's type guards fail
        # and the PEFT frames recompile at every step until the recompile
        # limit (8) makes them run eager, which is their steady state. A
        # raised limit (--recompile-limit) only recompiles them for longer.
        # Hence the longer warm-up: the timed steps are the steady state.
        if a.recompile_limit:
            torch._dynamo.config.recompile_limit = a.recompile_limit
        cm = torch.compile(pm)
        run("TORCH_COMPILE", cm, params, batches, a, flops, max(a.warmup, a.compile_warmup))
    except Exception as e:
        print("TORCH_COMPILE failed: %s" % one_line(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
