#!/usr/bin/env python3
"""rel_crash.py: crash consistency of the writing commands under kill -9.

A checkpoint of tens of megabytes (rel_gen.py) is the input, so a kill
lands in the middle of hashing, writing or committing. For each command a
clean run gives the reference result and its duration T; then each trial
starts the command from the same starting point and sends SIGKILL after a
delay drawn uniformly from [0, T) by a seeded RNG. After each kill:

  - PRAGMA integrity_check is ok, `msinv log --check` passes and every
    registered state verifies (`msverify files`);
  - every state the inventory holds was there before or is one a clean
    run registers (and it verifies);
  - no output file is torn: each file present is byte-equal to the
    reference's;
  - `msinv gc` removes every temporary the killed writer left, and none
    remains after it;
  - the command run again gives the reference result: with --force where
    it writes files (msconvert, msshard); msinv import is run again as it
    was, and must adopt a directory the killed run left complete but
    unregistered ("adopted"), or refuse one already registered (exit 2),
    or import anew.

msconvert, msshard split and msinv import publish a whole output (a file,
or a directory renamed into place at once) and register it as one step
(inventory batches; msshard registers every shard in the same one): after
a kill the output is absent or complete, and registered wholly or not at
all. Output present but unregistered is the one state in between (killed
after the rename, before the commit): counted ("unregistered outputs"),
and the rerun must cope with it. A partial directory, or part of the work
registered (some shards but not all), fails the trial.

    python3 tests/rel/rel_crash.py --build DIR [--trials N] [--mb MB]
"""
import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rel_common as rc  # noqa: E402


class Cmd:
    """argv(ctx) -> argv with the tool name first; out: the output path
    relative to the trial directory (None: the inventory is the output);
    force: the flag that lets a rerun replace a leftover output; adopts: a
    rerun registers an output left complete and unregistered."""

    def __init__(self, name, argv, out, force, need=None, prepare=None, adopts=False):
        self.name, self.argv, self.out, self.force = name, argv, out, force
        self.need, self.prepare, self.adopts = need, prepare, adopts


def tool(build, *argv, cwd=None):
    r, out, err = rc.run([os.path.join(build, argv[0])] + list(argv[1:]), cwd=cwd)
    if r != 0:
        raise RuntimeError("'%s' exit %d: %s" % (" ".join(argv), r, err.strip()))
    return out


def prepare_import(build, base, inp):
    """A bundle of the input state, made once."""
    bundle = os.path.join(base, "in.tar.zst")
    if not os.path.exists(bundle):
        db = os.path.join(base, "export.db")
        tool(build, "msinv", "init", "--db", db)
        tool(build, "msinv", "add", "--db", db, "--label", "big", inp)
        tool(build, "msinv", "export", "--db", db, "-o", bundle, "big")
    return bundle


def commands(inp):
    return [
        Cmd("msinv add", lambda c: ["msinv", "add", "--db", "inv.db", "--label", "big", inp],
            None, None),
        Cmd("msconvert quantize",
            lambda c: ["msconvert", "quantize", inp, "-o", "out", "--device", "cpu",
                       "--db", "inv.db"],
            "out", "--force", ("msconvert", "quantize")),
        Cmd("msshard split",
            lambda c: ["msshard", "split", inp, "-o", "out", "--ep-size", "2", "--db", "inv.db"],
            "out", "--force", ("msshard", "split")),
        Cmd("msinv import",
            lambda c: ["msinv", "import", "--db", "inv.db", c["bundle"], "out"],
            "out", None, ("msinv", "import"), prepare_import, adopts=True),
    ]


def crash_trials(suite, build, cmd, inp, trials, rng, summary):
    base = os.path.join(suite.tmp, cmd.name.replace(" ", "-"))
    work, pristine = os.path.join(base, "w"), os.path.join(base, "p")
    os.makedirs(work)
    ctx = {}
    try:
        if cmd.prepare:
            ctx["bundle"] = cmd.prepare(build, base, inp)
        tool(build, "msinv", "init", "--db", "inv.db", cwd=work)
        if cmd.out is not None and cmd.prepare is None:
            # the input is registered, as in a real workflow; its state
            # must keep verifying whatever happens to the writer
            tool(build, "msinv", "add", "--db", "inv.db", "--label", "input", inp, cwd=work)
    except RuntimeError as e:
        suite.check(False, "%s: setup: %s" % (cmd.name, e))
        return
    shutil.copytree(work, pristine)
    argv = cmd.argv(ctx)
    full = [os.path.join(build, argv[0])] + argv[1:]
    st_before = rc.states(build, "inv.db", cwd=work)
    start = rc.snapshot(work)
    durs = []
    for _ in range(3):
        rc.restore(pristine, work)
        t0 = time.time()
        r, out, err = rc.run(full, cwd=work)
        durs.append(time.time() - t0)
        if not suite.check(r == 0, "%s: clean run exit %d: %s" % (cmd.name, r, err.strip())):
            return
    # the fastest clean run: a kill drawn below it lands while it runs
    T = min(durs)
    ref = rc.snapshot(work)
    st_ref = rc.states(build, "inv.db", cwd=work)
    killed = partial_dirs = torn = partial_reg = unregistered = adopted = 0
    t_start = time.time()
    for i in range(trials):
        rc.restore(pristine, work)
        delay = rng.uniform(0, T)
        what = "%s trial %d (kill after %.1f ms of %.1f)" % (cmd.name, i + 1, delay * 1e3, T * 1e3)
        p = subprocess.Popen(full, cwd=work, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(delay)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)  # the child we started, by its pid
            killed += 1
        p.wait()
        p.stderr.close()
        probs = []
        if p.returncode not in (0, -signal.SIGKILL):
            probs.append("exit %d before the kill" % p.returncode)
        probs += rc.inventory_problems(build, "inv.db", cwd=work)
        st = rc.states(build, "inv.db", cwd=work)
        # every state registered is one a clean run registers (and verifies:
        # checked above), and all of them or none
        if st is None or not set(st_before) <= set(st) <= set(st_ref):
            probs.append("inventory states %s are not between before %s and after %s"
                         % (st, st_before, st_ref))
        elif st not in (st_before, st_ref):
            partial_reg += 1
            probs.append("part of the work registered: states %s, before %s, after %s"
                         % (st, st_before, st_ref))
        if cmd.out is not None:
            snap = rc.snapshot(os.path.join(work, cmd.out)) if os.path.exists(
                os.path.join(work, cmd.out)) else {}
            refo = {k[len(cmd.out) + 1:]: v for k, v in ref.items()
                    if k.startswith(cmd.out + "/") and not k.endswith("/")}
            for k, v in snap.items():
                if rc.TEMP_RE.match(os.path.basename(k)) or k.endswith("/"):
                    continue
                if refo.get(k) != v:
                    probs.append("torn output file %s/%s" % (cmd.out, k))
                    torn += 1
            present = {k for k in snap if not k.endswith("/")
                       and not rc.TEMP_RE.match(os.path.basename(k))}
            if present and present != set(refo):
                partial_dirs += 1
                probs.append("partial output: %d of the %d files of %s"
                             % (len(present & set(refo)), len(refo), cmd.out))
            registered = st is not None and st == st_ref and st_ref != st_before
            if registered and present != set(refo):
                probs.append("registered, but %s is not all there" % cmd.out)
            if present == set(refo) and st == st_before and st_ref != st_before:
                unregistered += 1
        # where the output goes and its parent, where a writer may stage it
        dirs = [work] + ([os.path.join(work, cmd.out)] if cmd.out and os.path.isdir(
            os.path.join(work, cmd.out)) else [])
        r, out, err = rc.run([os.path.join(build, "msinv"), "gc", "--db", "inv.db"] + dirs,
                             cwd=work)
        if r != 0:
            probs.append("msinv gc exit %d: %s" % (r, err.strip()))
        left = rc.temps(work) + rc.temps(inp)
        if left:
            probs.append("temporaries left after gc: " + ", ".join(left[:4]))
        # whatever the writer staged its output in, under any name: what is
        # neither in the starting point nor in a clean run's result
        stray = sorted(k for k in rc.snapshot(work) if k not in start and k not in ref
                       and not any(k.startswith(os.path.relpath(t, work)) for t in left))
        if stray:
            probs.append("left after gc: " + ", ".join(stray[:4]))
        # recovery: the same command again completes and gives the reference
        again = full + ([cmd.force] if cmd.force else [])
        left_out = cmd.out is not None and os.path.exists(os.path.join(work, cmd.out))
        want = 0
        if left_out and cmd.adopts:
            # complete and registered: refused as existing (the work is
            # done); complete, unregistered: adopted
            want = 2 if st == st_ref and st_ref != st_before else 0
        elif left_out and cmd.force is None:
            # a command without --force must refuse a leftover output; then
            # the operator removes it and runs again
            r, out, err = rc.run(full, cwd=work)
            if r != 2:
                probs.append("rerun over a leftover output exit %d (want 2): %s"
                             % (r, err.strip()))
            shutil.rmtree(os.path.join(work, cmd.out))
        r, out, err = rc.run(again, cwd=work)
        if left_out and cmd.adopts and r == 0:
            if not out.startswith("adopted\t"):
                probs.append("rerun over an unregistered output did not adopt it: %r"
                             % out.strip())
            adopted += 1
        if r != want:
            probs.append("rerun exit %d (want %d): %s" % (r, want, err.strip()))
        else:
            d = rc.snapshot_diff(ref, rc.snapshot(work))
            if d:
                probs.append("rerun result differs from a clean run (%s)" % d)
            if rc.states(build, "inv.db", cwd=work) != st_ref:
                probs.append("rerun: the inventory's states differ from a clean run")
            probs += ["after rerun: " + x for x in
                      rc.inventory_problems(build, "inv.db", cwd=work)]
        suite.check(not probs, "%s: %s" % (what, "; ".join(probs)))
    line = ("%s | %d trials | killed mid-run %d | clean run %.0f ms | torn files %d"
            " | partial directories %d | partial registrations %d | unregistered outputs %d"
            " (adopted on rerun %d) | %.1f s" % (
                cmd.name, trials, killed, T * 1e3, torn, partial_dirs, partial_reg,
                unregistered, adopted, time.time() - t_start))
    summary.append(line)
    suite.note("crash: " + line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--mb", type=float, default=96)
    ap.add_argument("--only", action="append", help="command names to run")
    ap.add_argument("--name", default="crash_consistency")
    a = ap.parse_args()
    suite = rc.Suite(a.name)
    return suite.guard(run_all, suite, a)


def run_all(suite, a):
    build = os.path.abspath(a.build)
    rng = random.Random(rc.SEED)
    inp = os.path.join(suite.tmp, "input")
    r, out, err = rc.run([sys.executable, os.path.join(os.path.dirname(__file__), "rel_gen.py"),
                          inp, "--mb", str(a.mb), "--shard-mb", str(max(a.mb / 3, 1)),
                          "--seed", str(rc.SEED)])
    if not suite.check(r == 0, "rel_gen.py exit %d: %s" % (r, err.strip())):
        return
    print("crash: input %s" % out.strip().replace(suite.tmp + "/", ""))
    summary = []
    for cmd in commands(inp):
        if a.only and cmd.name not in a.only:
            continue
        if cmd.need and not rc.has_tool(build, *cmd.need):
            suite.note("crash: %s: skipped, '%s %s' does not exist in this build"
                       % (cmd.name, cmd.need[0], cmd.need[1]))
            continue
        crash_trials(suite, build, cmd, inp, a.trials, rng, summary)


if __name__ == "__main__":
    sys.exit(main())
