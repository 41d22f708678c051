#!/usr/bin/env python3
"""rel_fault.py: the fault-injection sweep (SQLite's OOM and I/O error tests
applied to the writing commands).

For each scenario (one representative run of a writing command) and each
fault kind (alloc, read, write, fsync, rename), N runs from 1: the Nth call
of that kind fails (common.c ms_fault; a failed write first writes half its
chunk, as a filling disk does). MS_FAULT_LOG tells whether the run reached
the Nth call; the sweep ends at the first N it did not reach, which proves
every call of that kind in the run was failed once. After each trial:

  - the command ended cleanly: exit 3 and exactly one line on stderr
    "<tool>: ...", or exit 0 with the same result as a run without faults
    (a fault that was survived). Every fault is an I/O or memory failure:
    exit 2 would report it as bad input, exit 1 as a difference found;
  - nothing partial is visible: the work directory holds exactly what it
    held before (no output, no temporary), or exactly what a clean run
    leaves;
  - no leak and no memory error: under AddressSanitizer (detect_leaks=1)
    when the build has it, and under valgrind --leak-check=full for a
    sample of trials otherwise;
  - with an inventory: no state appeared or vanished unless the command
    succeeded, every registered state verifies (msverify files), the log
    chain holds (msinv log --check) and PRAGMA integrity_check is ok.

SQLite's own allocations and file I/O do not go through ms_malloc or
fsutil, so they are not failed here; the crash tests cover the database.

    python3 tests/rel/rel_fault.py --build DIR [--scenario NAME]...
        [--kinds alloc,read,...] [--persist] [--valgrind-every K]
        [--alloc-stride K] [--jobs N] [--messages FILE]
    (a scenario may name its own kinds, and a stride for one:
     --scenario quantize-file:alloc/64,write,fsync)
"""
import argparse
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rel_common as rc  # noqa: E402

KINDS = ["alloc", "read", "write", "fsync", "rename"]


class Scenario:
    """A representative run: setup(ctx) fills the work directory (cwd) and
    returns the argv (tool first, without the build path)."""

    def __init__(self, name, setup, inventory, need=None, info=None):
        self.name, self.setup, self.inventory = name, setup, inventory
        self.need = need  # (tool, subcommand) that must exist
        # stderr lines the command prints while it works (not errors)
        self.info = re.compile(info) if info else None


def fx(*p):
    return os.path.join(rc.FIXTURES, *p)


# ---- scenarios ---------------------------------------------------------------

def s_add_small(ctx):
    ctx.copy(fx("dtypes", "one_f32.safetensors"), "one_f32.safetensors")
    ctx.tool("msinv", "init", "--db", "inv.db")
    return ["msinv", "add", "--db", "inv.db", "--jobs", "1", "one_f32.safetensors"]


def s_add_sharded(ctx):
    ctx.copy(fx("hf", "qwen3moe-sharded"), "base")
    ctx.tool("msinv", "init", "--db", "inv.db")
    return ["msinv", "add", "--db", "inv.db", "--jobs", "1", "--label", "base", "base"]


def s_add_adapter(ctx):
    ctx.copy(fx("peft", "qwen3moe-E6-r3", "base"), "base")
    ctx.copy(fx("peft", "qwen3moe-E6-r3", "adapter"), "adapter")
    ctx.tool("msinv", "init", "--db", "inv.db")
    ctx.tool("msinv", "add", "--db", "inv.db", "--label", "base", "base")
    return ["msinv", "add", "--db", "inv.db", "--jobs", "1", "--label", "lora",
            "--parent", "base", "--op", "train", "--params", '{"step":1}', "adapter"]


def s_quant_file(ctx):
    ctx.copy(fx("hf", "qwen3moe", "model.safetensors"), "in.safetensors")
    ctx.tool("msinv", "init", "--db", "inv.db")
    return ["msconvert", "quantize", "in.safetensors", "-o", "out.safetensors",
            "--device", "cpu", "--jobs", "1", "--db", "inv.db"]


def s_quant_dir(ctx):
    ctx.copy(fx("hf", "qwen3moe-sharded"), "in")
    ctx.tool("msinv", "init", "--db", "inv.db")
    # the input already registered: the usual case, and the add of the
    # input is swept by add-sharded
    ctx.tool("msinv", "add", "--db", "inv.db", "in")
    return ["msconvert", "quantize", "in", "-o", "out", "--device", "cpu",
            "--jobs", "1", "--layout", "both", "--db", "inv.db"]


def s_quant_fused(ctx):
    # fused 3-D experts written per expert (views of the slices)
    ctx.copy(fx("hf", "qwen3moe-stacked"), "in")
    ctx.tool("msinv", "init", "--db", "inv.db")
    return ["msconvert", "quantize", "in", "-o", "out", "--device", "cpu",
            "--jobs", "1", "--db", "inv.db"]


def s_quant_fused3d(ctx):
    # fused 3-D experts kept fused ([E, ...] tensors made whole)
    ctx.copy(fx("hf", "qwen3moe-stacked", "model.safetensors"), "in.safetensors")
    ctx.tool("msinv", "init", "--db", "inv.db")
    return ["msconvert", "quantize", "in.safetensors", "-o", "out.safetensors",
            "--experts", "fused", "--device", "cpu", "--jobs", "1", "--db", "inv.db"]


def s_split(ctx):
    ctx.copy(fx("peft", "qwen3moe-E6-r3", "adapter"), "adapter")
    ctx.tool("msinv", "init", "--db", "inv.db")
    return ["msshard", "split", "adapter", "-o", "shards", "--ep-size", "2", "--db", "inv.db"]


def s_reshard(ctx):
    ctx.copy(fx("peft", "qwen3moe-E6-r3", "adapter"), "adapter")
    ctx.tool("msinv", "init", "--db", "inv.db")
    ctx.tool("msshard", "split", "adapter", "-o", "ep2", "--ep-size", "2", "--db", "inv.db")
    return ["msshard", "reshard", "ep2", "-o", "ep3", "--ep-size", "3", "--db", "inv.db"]


def s_import(ctx):
    ctx.copy(fx("hf", "qwen3moe"), "base")
    ctx.tool("msinv", "init", "--db", "src.db")
    ctx.tool("msinv", "add", "--db", "src.db", "--label", "base", "base")
    ctx.tool("msinv", "export", "--db", "src.db", "-o", "base.tar.zst", "base")
    for name in ("base", "src.db", "src.db-wal", "src.db-shm"):
        ctx.remove(name)
    ctx.tool("msinv", "init", "--db", "inv.db")
    return ["msinv", "import", "--db", "inv.db", "--jobs", "1", "base.tar.zst", "imported"]


def s_launch(ctx):
    ctx.copy(fx("hf", "qwen3moe"), "base")
    ctx.tool("msinv", "init", "--db", "inv.db")
    ctx.tool("msinv", "add", "--db", "inv.db", "--label", "base", "base")
    ctx.write("plan.json",
              '{"name": "gate", "ep_size": 1, "states": [{"role": "base", "state": "base"}]}\n')
    return ["msinv", "launch", "--db", "inv.db", "--plan", "plan.json", "--", "true"]


def s_train(ctx):
    # two steps of LoRA on the NVFP4 base, one checkpoint at the end: the
    # checkpoint directory and its registration are all or nothing
    ctx.copy(fx("peft", "qwen3moe-E8-r4", "base"), "base")
    ctx.tool("msinv", "init", "--db", "inv.db")
    ctx.tool("msinv", "add", "--db", "inv.db", "--label", "base", "base")
    ctx.tool("msconvert", "quantize", "base", "-o", "q", "--block", "2d", "--layout", "both",
             "--device", "cpu", "--db", "inv.db")
    ctx.write("plan.json",
              '{"ep_size": 1, "outputs": "runs", "states": [{"role": "base", "state": "base"},'
              ' {"role": "quantized", "path": "q"}], "train": {"lora": {"r": 2, "targets":'
              ' ["experts", "q_proj"]}, "batch": 2, "seq_len": 8, "steps": 2, "seed": 3,'
              ' "label": "fault"}}\n')
    return ["mstrain", "train", "--db", "inv.db", "--plan", "plan.json"]


SCENARIOS = {
    "add-small": Scenario("msinv add (one tensor)", s_add_small, True),
    "add-sharded": Scenario("msinv add (2 shards + index)", s_add_sharded, True),
    "add-adapter": Scenario("msinv add (adapter, parent)", s_add_adapter, True),
    "quantize-file": Scenario("msconvert quantize (file)", s_quant_file, True,
                              ("msconvert", "quantize")),
    "quantize-dir": Scenario("msconvert quantize (sharded dir, both)", s_quant_dir,
                             True, ("msconvert", "quantize")),
    "quantize-fused": Scenario("msconvert quantize (fused experts, per-expert)",
                               s_quant_fused, True, ("msconvert", "quantize")),
    "quantize-fused3d": Scenario("msconvert quantize (fused experts, --experts fused)",
                                 s_quant_fused3d, True, ("msconvert", "quantize")),
    "split": Scenario("msshard split", s_split, True, ("msshard", "split")),
    "reshard": Scenario("msshard reshard", s_reshard, True, ("msshard", "reshard")),
    "import": Scenario("msinv import", s_import, True, ("msinv", "import")),
    "launch": Scenario("msinv launch", s_launch, True, ("msinv", "launch"),
                       info=r"^msinv: .* verified \(|^msinv: run [0-9]+: starting "),
    "train": Scenario("mstrain train", s_train, True, ("mstrain", "train"),
                      info=r"^mstrain: step [0-9]+/|^mstrain: checkpoint step "),
}


class Ctx:
    """A scenario's setup, in its work directory (sweeps run in threads, so
    nothing here may depend on the process's current directory)."""

    def __init__(self, build, cwd):
        self.build, self.cwd = build, cwd

    def copy(self, src, name):
        dst = os.path.join(self.cwd, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst)
        else:
            shutil.copy(src, dst)

    def write(self, name, text):
        with open(os.path.join(self.cwd, name), "w") as f:
            f.write(text)

    def remove(self, name):
        p = os.path.join(self.cwd, name)
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.unlink(p)

    def tool(self, *argv):
        r, out, err = rc.run([os.path.join(self.build, argv[0])] + list(argv[1:]),
                             cwd=self.cwd)
        if r != 0:
            raise RuntimeError("setup '%s' exit %d: %s" % (" ".join(argv), r, err.strip()))
        return out


def sanitized(build):
    """Was the build made with AddressSanitizer?"""
    try:
        with open(os.path.join(build, "msinv"), "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


FRAME_RE = re.compile(r"#\d+ 0x[0-9a-f]+ in (\S+) ((?:src|tools)/[^ :]+:\d+)")


def where(err):
    """The first frame of each sanitizer report that is ours and not the
    allocator's (common.c): where a leaked block was made, or the bad access."""
    seen = []
    for block in err.split("\n\n"):
        for fn, loc in FRAME_RE.findall(block):
            if not loc.startswith("src/common.c"):
                if (fn, loc) not in seen:
                    seen.append((fn, loc))
                break
    return "".join(" | at %s %s" % fl for fl in seen[:3])


def sweep(suite, build, key, sc, kinds, persist, vg_every, asan, summary, messages=None,
          strides=None):
    base = os.path.join(suite.tmp, key)
    work, pristine = os.path.join(base, "w"), os.path.join(base, "p")
    os.makedirs(work)
    try:
        argv = sc.setup(Ctx(build, work))
    except (RuntimeError, OSError) as e:
        suite.check(False, "%s: setup failed: %s" % (sc.name, e))
        return
    shutil.copytree(work, pristine, symlinks=True)
    tool = argv[0]
    cmd = [os.path.join(build, tool)] + argv[1:]
    before = rc.snapshot(work)
    db = "inv.db" if sc.inventory else None
    st_before = rc.states(build, db, cwd=work) if db else None
    # the reference: the same run without a fault
    r, out, err = rc.run(cmd, cwd=work)
    if not suite.check(r == 0, "%s: clean run exit %d: %s" % (sc.name, r, err.strip())):
        return
    ref = rc.snapshot(work)
    st_ref = rc.states(build, db, cwd=work) if db else None
    flog = os.path.join(base, "fault.log")
    asan_env = {"ASAN_OPTIONS": "detect_leaks=1:exitcode=99:abort_on_error=0"}
    for kind in kinds:
        n, t0, codes, msgs, survived, vg_runs = 0, time.time(), {}, {}, 0, 0
        limit = 200000
        # a stride samples the allocation calls (1, 1+K, 1+2K, ...): the
        # fast tier's way through long runs; 1 fails every call once
        step = (strides or {}).get(kind, 1)
        n = 1 - step
        while n < limit:
            n += step
            rc.restore(pristine, work)
            if os.path.exists(flog):
                os.unlink(flog)
            env = {"MS_FAULT_" + kind.upper(): str(n), "MS_FAULT_LOG": flog}
            if persist:
                env["MS_FAULT_PERSIST"] = "1"
            if asan:
                env.update(asan_env)
            # valgrind is slow: a sample of the allocation trials (where
            # leaks hide: the error paths), and the clean run below
            use_vg = (not asan and vg_every and kind == "alloc"
                      and shutil.which("valgrind") and (n - 1) // step % vg_every == vg_every - 1)
            what = "%s %s N=%d%s" % (sc.name, kind, n, " persist" if persist else "")
            run_cmd = cmd
            vglog = os.path.join(base, "vg.log")
            if use_vg:
                run_cmd = ["valgrind", "-q", "--leak-check=full",
                           "--errors-for-leak-kinds=definite,indirect",
                           "--error-exitcode=99", "--log-file=" + vglog] + cmd
                vg_runs += 1
            try:
                r, out, err = rc.run(run_cmd, cwd=work, env=env, timeout=120)
            except Exception as e:  # a hang is a failure, not the end of the suite
                suite.check(False, "%s: %s" % (what, e))
                continue
            hit = os.path.exists(flog) and os.path.getsize(flog) > 0
            probs = []
            if r < 0 or r >= 128:
                probs.append("crashed (exit %d)" % r)
            if r == 99 or "Sanitizer" in err:
                probs.append("sanitizer: " + " | ".join(
                    l for l in err.splitlines() if "ERROR" in l or "SUMMARY" in l)[:300]
                    + where(err))
            if use_vg and os.path.exists(vglog) and os.path.getsize(vglog):
                with open(vglog) as f:
                    probs.append("valgrind: " + f.read().strip().replace("\n", " | ")[:400])
            snap = rc.snapshot(work)
            tmp_left = rc.temps(work)
            if tmp_left:
                probs.append("temporaries left: " + ", ".join(
                    os.path.relpath(t, work) for t in tmp_left[:4]))
            if r == 0:
                d = rc.snapshot_diff(ref, snap)
                if d:
                    probs.append("exit 0 but output differs from a clean run (%s)" % d)
                if db and rc.states(build, db, cwd=work) != st_ref:
                    probs.append("exit 0 but the states differ from a clean run")
                if hit:
                    survived += 1
            elif 0 < r < 128 and r != 99:
                if sc.info:
                    err = "".join(l + "\n" for l in err.splitlines() if not sc.info.search(l))
                if not rc.one_line_error(err, tool):
                    probs.append("stderr is not one '%s: ' line: %r" % (tool, err[:300]))
                if hit and r != 3:
                    probs.append("exit %d from a failed %s (want 3): %s"
                                 % (r, kind, err.strip()[:300]))
                d = rc.snapshot_diff(before, snap)
                if d:
                    probs.append("partial output after a failure (%s)" % d)
                if db and rc.states(build, db, cwd=work) != st_before:
                    probs.append("failed, yet the inventory's states changed")
                codes[r] = codes.get(r, 0) + 1
                m = "exit %d: %s" % (r, err.strip().split(": ", 1)[-1])
                msgs[m] = msgs.get(m, 0) + 1
            if db and os.path.exists(os.path.join(work, db)):
                probs += rc.inventory_problems(build, db, cwd=work)
            if not hit and r != 0:
                probs.append("the fault was not reached, yet exit %d: %s" % (r, err.strip()))
            suite.check(not probs, "%s: %s" % (what, "; ".join(probs)))
            if not hit:
                break
        if not asan and vg_every and kind == "alloc" and shutil.which("valgrind"):
            rc.restore(pristine, work)
            vglog = os.path.join(base, "vg.log")
            r, out, err = rc.run(["valgrind", "-q", "--leak-check=full",
                                  "--errors-for-leak-kinds=definite,indirect",
                                  "--error-exitcode=99", "--log-file=" + vglog] + cmd,
                                 cwd=work, timeout=600)
            vg_runs += 1
            log = open(vglog).read().strip() if os.path.exists(vglog) else ""
            suite.check(r == 0 and not log, "%s: clean run under valgrind exit %d: %s"
                        % (sc.name, r, log.replace("\n", " | ")[:400]))
        secs = time.time() - t0
        line = ("%s | %s%s | N reached %d (%d call%s failed once%s) | exits %s | survived %d"
                " | valgrind %d | %.1f s" % (
                    sc.name, kind, " persist" if persist else "", n,
                    (n - 1 + step - 1) // step, "" if n - 1 == step else "s",
                    ", every %dth" % step if step > 1 else "",
                    ",".join("%d:%d" % kv for kv in sorted(codes.items())) or "-",
                    survived, vg_runs, secs))
        summary.append(line)
        if msgs and messages:
            with suite.lock, open(messages, "a") as f:
                for m, c in sorted(msgs.items(), key=lambda kv: -kv[1]):
                    f.write("%s | %s%s | %d | %s\n" % (sc.name, kind, " persist" if persist
                                                       else "", c, m))
        if msgs:
            top = sorted(msgs.items(), key=lambda kv: -kv[1])[:4]
            line += "\nfault:   messages: " + " || ".join("%dx %s" % (c, m[:300]) for m, c in top)
        suite.note("fault: " + line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="a fault-injection build")
    ap.add_argument("--scenario", action="append", metavar="NAME[:KIND,...]",
                    help="one of %s; the kinds default to --kinds" % ", ".join(SCENARIOS))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--persist", action="store_true",
                    help="also sweep alloc with MS_FAULT_PERSIST=1")
    ap.add_argument("--valgrind-every", type=int, default=0,
                    help="without ASan: run every Kth trial under valgrind")
    ap.add_argument("--jobs", type=int, default=1,
                    help="sweeps run at once (each scenario and kind is one sweep)")
    ap.add_argument("--alloc-stride", type=int, default=1, metavar="K",
                    help="fail allocation 1, 1+K, 1+2K, ... (a sample; default every one);"
                    " a scenario may give its own: --scenario import:alloc/64,read")
    ap.add_argument("--name", default="fault_injection")
    ap.add_argument("--messages", metavar="FILE",
                    help="append every distinct error line of the failed trials, with its"
                    " exit status and count, to FILE (the messages an operator would see)")
    a = ap.parse_args()
    suite = rc.Suite(a.name)
    build = os.path.abspath(a.build)
    asan = sanitized(build)
    kinds = [k for k in a.kinds.split(",") if k]
    summary = []
    print("fault: build %s%s" % (build, " (AddressSanitizer, detect_leaks=1)" if asan else ""))
    if not asan and a.valgrind_every and not shutil.which("valgrind"):
        print("fault: valgrind not found: no leak check in this run")
    return suite.guard(run_all, suite, a, build, asan, kinds, summary)


def run_all(suite, a, build, asan, kinds, summary):
    tasks = []
    for spec in a.scenario or ["add-small"]:
        key, _, only = spec.partition(":")
        if key not in SCENARIOS:
            rc.die("rel_fault.py: unknown scenario '%s'" % key)
        sc = SCENARIOS[key]
        sk = [k for k in only.split(",") if k] if only else kinds
        strides = {"alloc": max(1, a.alloc_stride)}
        for k in list(sk):
            name, _, st = k.partition("/")
            if st:
                strides[name] = max(1, int(st))
                sk[sk.index(k)] = name
            if name not in KINDS:
                rc.die("rel_fault.py: unknown fault kind '%s'" % name)
        if sc.need and not rc.has_tool(build, *sc.need):
            suite.note("fault: %s: skipped, '%s %s' does not exist in this build"
                       % (sc.name, sc.need[0], sc.need[1]))
            continue
        if a.jobs <= 1:
            tasks.append((key, sc, sk, False, strides))
        else:  # one sweep per kind, so that the long ones spread
            tasks += [("%s-%s" % (key, k), sc, [k], False, strides) for k in sk]
        if a.persist and "alloc" in sk:
            tasks.append((key + "-persist", sc, ["alloc"], True, strides))
    # the longest first: allocation sweeps of the big scenarios
    if a.jobs > 1:
        tasks.sort(key=lambda t: ("alloc" not in t[2], not t[3]))
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futs = [pool.submit(sweep, suite, build, key, sc, sk, persist, a.valgrind_every,
                            asan, summary, a.messages, strides)
                for key, sc, sk, persist, strides in tasks]
        for f in futs:
            f.result()


if __name__ == "__main__":
    sys.exit(main())
