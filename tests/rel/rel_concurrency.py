#!/usr/bin/env python3
"""rel_concurrency.py: many processes on one inventory, and two writers of
one output.

Part 1, the inventory under load: 16 `msinv add` processes start together,
each registering its own copy of a fixture (one byte of tensor data changed
per copy, so each is a distinct state), while readers loop over `msinv ls`,
`msinv show` and `msverify files` (which also writes: it records each
verification). Every command must exit 0 and never show SQLITE_BUSY or
"database is locked"; at the end the inventory holds the original state and
the 16 new ones, PRAGMA integrity_check is ok, `msinv log --check` passes,
the log has one add entry per state, and every state verifies.

Part 2, one output, two writers: two `msconvert quantize` runs to the same
output file start together. One must win (exit 0), the other refuse (exit 2
saying the output exists or that another writer won); the output is one
complete file equal to a single run's, and no temporary is left.

Part 3, the same for a directory output (`msshard split` twice to one
directory): one wins, the other refuses, the directory is the single run's.

    python3 tests/rel/rel_concurrency.py --build DIR [--rounds N]
        [--writers 16] [--races N]
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rel_common as rc  # noqa: E402

BUSY = re.compile(r"busy|locked", re.I)


def data_start(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    return 8 + n


def flip_copy(src, dst, k):
    """Copy src to dst with byte k of the tensor data inverted."""
    with open(src, "rb") as f:
        b = bytearray(f.read())
    off = data_start(src) + 4096 + 7 * k
    b[off] ^= 0xFF
    with open(dst, "wb") as f:
        f.write(b)


class Readers:
    """Reader loops in threads, each running one command until stopped."""

    def __init__(self, cmds, cwd):
        self.cmds, self.cwd = cmds, cwd
        self.stop = threading.Event()
        self.runs, self.bad = 0, []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, args=(c,)) for c in cmds]

    def loop(self, cmd):
        while not self.stop.is_set():
            r, out, err = rc.run(cmd, cwd=self.cwd, timeout=120)
            with self.lock:
                self.runs += 1
                if r != 0 or BUSY.search(err):
                    self.bad.append("%s exit %d: %s" % (" ".join(
                        os.path.basename(c) for c in cmd[:2]), r, err.strip()[:200]))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def inventory_round(suite, build, rnd, nwriters, summary):
    base = os.path.join(suite.tmp, "inv-%d" % rnd)
    os.makedirs(base)
    src = os.path.join(rc.FIXTURES, "hf", "qwen3moe", "model.safetensors")
    orig = os.path.join(base, "orig")
    os.makedirs(orig)
    shutil.copy(src, orig)
    for k in range(nwriters):
        d = os.path.join(base, "c%02d" % k)
        os.makedirs(d)
        flip_copy(src, os.path.join(d, "model.safetensors"), k)
    msinv, msverify = os.path.join(build, "msinv"), os.path.join(build, "msverify")
    r, _, err = rc.run([msinv, "init", "--db", "inv.db"], cwd=base)
    r2, out, err2 = rc.run([msinv, "add", "--db", "inv.db", "--label", "orig", "orig"], cwd=base)
    if not suite.check(r == 0 and r2 == 0, "round %d: setup: %s %s" % (rnd, err, err2)):
        return
    readers = [[msinv, "ls", "--db", "inv.db"],
               [msinv, "show", "--db", "inv.db", "orig"],
               [msverify, "files", "--db", "inv.db"]]
    t0 = time.time()
    with Readers(readers, base) as rd:
        procs = [subprocess.Popen([msinv, "add", "--db", "inv.db", "c%02d" % k], cwd=base,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) for k in range(nwriters)]
        results = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            results.append((p.returncode, out.decode(), err.decode()))
        # let the readers overlap the end of the writes too
        time.sleep(0.05)
    secs = time.time() - t0
    bad_w = ["c%02d exit %d: %s" % (k, r, e.strip()[:200])
             for k, (r, o, e) in enumerate(results) if r != 0 or BUSY.search(e)]
    suite.check(not bad_w, "round %d: writers: %s" % (rnd, "; ".join(bad_w)))
    suite.check(not rd.bad, "round %d: readers (%d of %d runs failed): %s"
                % (rnd, len(rd.bad), rd.runs, "; ".join(rd.bad[:5])))
    digests = {o.strip() for r, o, e in results if r == 0}
    st = rc.states(build, "inv.db", cwd=base) or []
    suite.check(len(digests) == nwriters and len(st) == nwriters + 1
                and digests <= set(st),
                "round %d: %d distinct digests printed, %d states recorded (want %d and %d)"
                % (rnd, len(digests), len(st), nwriters, nwriters + 1))
    r, out, err = rc.run([msinv, "log", "--db", "inv.db", "--json"], cwd=base)
    adds = 0
    if r == 0:
        try:
            entries = json.loads(out)
            if isinstance(entries, dict):
                entries = entries.get("entries", [])
            adds = sum(1 for e in entries if e.get("action") == "add")
        except ValueError:
            adds = -1
    suite.check(adds == nwriters + 1, "round %d: %d add entries in the log (want %d)"
                % (rnd, adds, nwriters + 1))
    probs = rc.inventory_problems(build, "inv.db", cwd=base)
    suite.check(not probs, "round %d: %s" % (rnd, "; ".join(probs)))
    line = ("inventory round %d | %d writers, %d reader runs | %d states | %.2f s"
            % (rnd, nwriters, rd.runs, len(st), secs))
    summary.append(line)
    suite.note("concurrency: " + line)


def race(suite, build, what, argv, out, base, rounds, summary):
    """Two identical writers of one output, started together, rounds times."""
    ref_dir = os.path.join(base, "ref")
    os.makedirs(ref_dir)
    r, _, err = rc.run(argv(os.path.join(ref_dir, out)), cwd=base)
    if not suite.check(r == 0, "%s: single run exit %d: %s" % (what, r, err.strip())):
        return
    ref = rc.snapshot(ref_dir)
    ways = {}
    for i in range(rounds):
        d = os.path.join(base, "race-%d" % i)
        os.makedirs(d)
        target = os.path.join(d, out)
        procs = [subprocess.Popen(argv(target), cwd=base, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(2)]
        res = []
        for p in procs:
            o, e = p.communicate(timeout=300)
            res.append((p.returncode, e.decode()))
        codes = sorted(r for r, _ in res)
        probs = []
        if codes != [0, 2]:
            probs.append("exits %s (want one 0 and one 2): %s"
                         % (codes, " | ".join(e.strip()[:200] for _, e in res)))
        else:
            loser = [e for r, e in res if r == 2][0]
            m = re.search(r"another writer won|exists", loser)
            if not m:
                probs.append("the loser does not say why: %r" % loser.strip()[:200])
            else:
                ways[m.group(0)] = ways.get(m.group(0), 0) + 1
            if len(loser.strip().splitlines()) != 1:
                probs.append("the loser's stderr is not one line: %r" % loser[:300])
        diff = rc.snapshot_diff(ref, rc.snapshot(d))
        if diff:
            probs.append("output is not a single run's (%s)" % diff)
        left = rc.temps(d)
        if left:
            probs.append("temporaries left: " + ", ".join(left[:3]))
        suite.check(not probs, "%s race %d: %s" % (what, i + 1, "; ".join(probs)))
        shutil.rmtree(d)
    line = "%s | %d races | loser said: %s" % (
        what, rounds, ", ".join("'%s' %d" % kv for kv in sorted(ways.items())) or "-")
    summary.append(line)
    suite.note("concurrency: " + line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--races", type=int, default=3)
    ap.add_argument("--name", default="concurrency")
    a = ap.parse_args()
    suite = rc.Suite(a.name)
    return suite.guard(run_all, suite, a)


def run_all(suite, a):
    build = os.path.abspath(a.build)
    summary = []
    for rnd in range(1, a.rounds + 1):
        inventory_round(suite, build, rnd, a.writers, summary)
    # a single-file input big enough that the two writers overlap
    big = os.path.join(suite.tmp, "big")
    r, out, err = rc.run([sys.executable, os.path.join(os.path.dirname(__file__), "rel_gen.py"),
                          big, "--mb", "16", "--shard-mb", "1024", "--seed", str(rc.SEED)])
    if not suite.check(r == 0, "rel_gen.py exit %d: %s" % (r, err.strip())):
        return
    if rc.has_tool(build, "msconvert", "quantize"):
        base = os.path.join(suite.tmp, "quantize")
        os.makedirs(base)
        race(suite, build, "msconvert quantize (file)",
             lambda o: [os.path.join(build, "msconvert"), "quantize",
                        os.path.join(big, "model.safetensors"), "-o", o, "--device", "cpu"],
             "q.safetensors", base, a.races, summary)
    else:
        suite.note("concurrency: msconvert quantize: skipped, not in this build")
    if rc.has_tool(build, "msshard", "split"):
        base = os.path.join(suite.tmp, "split")
        os.makedirs(base)
        race(suite, build, "msshard split (directory)",
             lambda o: [os.path.join(build, "msshard"), "split", big, "-o", o,
                        "--ep-size", "2"],
             "shards", base, a.races, summary)
    else:
        suite.note("concurrency: msshard split: skipped, not in this build")


if __name__ == "__main__":
    sys.exit(main())
