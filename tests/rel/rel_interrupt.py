#!/usr/bin/env python3
"""rel_interrupt.py: the writing commands stopped by a signal, and `msinv gc`
after one killed outright.

A checkpoint of tens of megabytes (rel_gen.py) is the input. Each writing
command (msconvert quantize, msshard split, msinv import, msinv export,
msinv add) is started and sent SIGINT, SIGTERM or SIGHUP while it works:
as soon as its staging appears beside the output (for add, which stages
nothing, half-way through a clean run's time). Then, without running gc:

  - the exit status is 128 + the signal, and stderr is one line
    '<tool>: interrupted by SIG...';
  - no temporary is left anywhere under the trial directory or beside the
    input, and no output;
  - the inventory holds the states it held before, and passes its checks
    (msverify files, log --check, integrity_check).

A run that ended before the signal reached it is retried with the signal
sent sooner (it says nothing about cleanup).

Then a writer killed with SIGKILL while staging: `msinv gc` without a
directory argument must remove what it left, both for an output written in
the inventory's directory and for one written beside the registered input
(the parent of a recorded state's directory).

    python3 tests/rel/rel_interrupt.py --build DIR [--mb MB]
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rel_common as rc  # noqa: E402

SIGS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
SIGNAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


def tool(build, *argv, cwd=None):
    r, out, err = rc.run([os.path.join(build, argv[0])] + list(argv[1:]), cwd=cwd)
    if r != 0:
        raise RuntimeError("'%s' exit %d: %s" % (" ".join(argv), r, err.strip()))
    return out


# what writers stage in: ".<name>.tmp-<pid>-<hex>" (every output), an output
# --force replaced waiting at ".<name>.replaced-<pid>-<hex>", and what imports
# staged in before ".<name>.import-<pid>-<hex>"
TEMP_RE = re.compile(r"^\..+\.(tmp|import|replaced)-[0-9]+-[0-9a-f]+$")


def staged(dirs, top_only=False):
    """Temporaries under any of dirs (files and staging directories, the
    latter with a trailing '/'); top_only: directly in dirs."""
    found = []
    for top in dirs:
        for d, subdirs, files in os.walk(top):
            found += [os.path.join(d, f) for f in files if TEMP_RE.match(f)]
            found += [os.path.join(d, x) + "/" for x in subdirs if TEMP_RE.match(x)]
            if top_only:
                break
    return sorted(found)


def start_and_signal(full, cwd, watch, sig, fallback_delay, timeout=60):
    """Start full, send sig once a temporary shows under watch (or after
    fallback_delay seconds when watch is empty); returns (rc, stderr,
    signalled)."""
    p = subprocess.Popen(full, cwd=cwd, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.time()
    sent = False
    while p.poll() is None and time.time() - t0 < timeout:
        if (watch and staged(watch)) or (not watch and time.time() - t0 >= fallback_delay):
            p.send_signal(sig)  # the child we started, by its pid
            sent = True
            break
        time.sleep(0.0005)
    err = p.communicate(timeout=timeout)[1].decode("utf-8", "replace")
    return p.returncode, err, sent


def setup(suite, build, name, inp, bundle_from=None):
    work = os.path.join(suite.tmp, name)
    os.makedirs(work)
    tool(build, "msinv", "init", "--db", "inv.db", cwd=work)
    if bundle_from is None:
        tool(build, "msinv", "add", "--db", "inv.db", "--label", "input", inp, cwd=work)
    return work


def interrupt_cases(suite, build, inp, bundle):
    cases = [
        ("msconvert quantize", ["msconvert", "quantize", inp, "-o", "out", "--device", "cpu",
                                "--db", "inv.db"], "out", True),
        ("msshard split", ["msshard", "split", inp, "-o", "out", "--ep-size", "2",
                           "--db", "inv.db"], "out", True),
        ("msinv import", ["msinv", "import", "--db", "inv.db", bundle, "out"], "out", False),
        ("msinv export", ["msinv", "export", "--db", "inv.db", "-o", "out.tar.zst", "input"],
         "out.tar.zst", True),
        ("msinv add", ["msinv", "add", "--db", "inv.db", "--label", "again", inp],
         None, False),
    ]
    for k, (name, argv, out, registered_input) in enumerate(cases):
        for j, sig in enumerate(SIGS):
            if j > 0 and name in ("msinv export", "msinv add"):
                continue  # one signal is enough for these
            work = setup(suite, build, "%s-%d" % (name.replace(" ", "-"), sig), inp,
                         bundle_from=None if registered_input else bundle)
            full = [os.path.join(build, argv[0])] + argv[1:]
            if out is None:
                # add stages nothing: the signal goes half-way through a
                # clean run, timed in a directory of its own
                timing = setup(suite, build, "add-timing-%d" % sig, inp, bundle_from=bundle)
                t0 = time.time()
                tool(build, *argv, cwd=timing)
                T = time.time() - t0
            st_before = rc.states(build, "inv.db", cwd=work)
            what = "%s, %s" % (name, SIGNAMES[sig])
            r = err = None
            sent = False
            for attempt in range(6):
                delay = T / 2 / (attempt + 1) if out is None else 0
                r, err, sent = start_and_signal(full, work, [work] if out else [], sig, delay)
                if r != 0:
                    break
                if out is None:
                    # add registered the state: forget it, try sooner
                    tool(build, "msinv", "rm", "--db", "inv.db", "again", cwd=work)
                    continue
                # finished before the signal: undo and try again sooner
                if out and os.path.exists(os.path.join(work, out)):
                    break
            if r == 0:
                suite.note("interrupt: %s: finished before the signal in every attempt; skipped"
                           % what)
                continue
            probs = []
            if not sent:
                probs.append("no signal was sent")
            if r != 128 + sig:
                probs.append("exit %d (want %d)" % (r, 128 + sig))
            lines = err.splitlines()
            want = "%s: interrupted by %s" % (argv[0], SIGNAMES[sig])
            if len(lines) != 1 or not lines[0].startswith(want):
                probs.append("stderr %r (want one line '%s...')" % (err.strip()[:200], want))
            left = staged([work, inp, os.path.dirname(inp)])
            if left:
                probs.append("staging left: " + ", ".join(left[:4]))
            if out and os.path.exists(os.path.join(work, out)):
                probs.append("output '%s' exists" % out)
            st = rc.states(build, "inv.db", cwd=work)
            if st != st_before:
                probs.append("inventory states changed: %s -> %s" % (st_before, st))
            probs += rc.inventory_problems(build, "inv.db", cwd=work)
            if name == "msinv add":
                r2, o2, _ = rc.run([os.path.join(build, "msinv"), "show", "--db", "inv.db",
                                    "again"], cwd=work)
                if r2 == 0:
                    probs.append("label 'again' registered")
            suite.check(not probs, "%s: %s" % (what, "; ".join(probs)))
            suite.note("interrupt: %s: exit %s, %s" % (what, r, "ok" if not probs else "FAILED"))


def kill9_gc(suite, build, inp):
    """A quantize killed with SIGKILL while staging, its output (a) in the
    inventory's directory, (b) beside the registered input; then gc with no
    directory argument."""
    for where in ("db-dir", "beside-input"):
        work = setup(suite, build, "kill9-" + where, inp)
        out = "out" if where == "db-dir" else os.path.join(os.path.dirname(inp), "out-k9")
        watch = [work] if where == "db-dir" else [os.path.dirname(inp)]
        full = [os.path.join(build, "msconvert"), "quantize", inp, "-o", out, "--device",
                "cpu", "--db", "inv.db"]
        r, err, sent = start_and_signal(full, work, watch, signal.SIGKILL, 0)
        probs = []
        left = staged(watch, top_only=True)
        if r != -signal.SIGKILL or not left:
            suite.note("interrupt: kill -9 (%s): exit %s, staging %s: not killed while staging"
                       % (where, r, left))
            probs.append("the writer was not killed while staging (exit %s)" % r)
        g, gout, gerr = rc.run([os.path.join(build, "msinv"), "gc", "--db", "inv.db"], cwd=work)
        if g != 0:
            probs.append("gc exit %d: %s" % (g, gerr.strip()))
        after = staged(watch)
        if after:
            probs.append("left after gc without arguments: " + ", ".join(after[:4]))
        for t in left:
            if t.rstrip("/") not in gout:
                probs.append("gc did not name %s" % t)
        suite.check(not probs, "kill -9 (%s), gc without DIR: %s" % (where, "; ".join(probs)))
        suite.note("interrupt: kill -9 (%s): %d temporaries, %d after gc" %
                   (where, len(left), len(after)))


def run_all(suite, a):
    build = os.path.abspath(a.build)
    inp = os.path.join(suite.tmp, "input")
    r, out, err = rc.run([sys.executable, os.path.join(os.path.dirname(__file__), "rel_gen.py"),
                          inp, "--mb", str(a.mb), "--shard-mb", str(max(a.mb / 3, 1)),
                          "--seed", str(rc.SEED)])
    if not suite.check(r == 0, "rel_gen.py exit %d: %s" % (r, err.strip())):
        return
    bundle = os.path.join(suite.tmp, "in.tar.zst")
    db = os.path.join(suite.tmp, "export.db")
    tool(build, "msinv", "init", "--db", db)
    tool(build, "msinv", "add", "--db", db, "--label", "big", inp)
    tool(build, "msinv", "export", "--db", db, "-o", bundle, "big")
    interrupt_cases(suite, build, inp, bundle)
    kill9_gc(suite, build, inp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--mb", type=float, default=32)
    ap.add_argument("--name", default="interrupt")
    a = ap.parse_args()
    suite = rc.Suite(a.name)
    return suite.guard(run_all, suite, a)


if __name__ == "__main__":
    sys.exit(main())
