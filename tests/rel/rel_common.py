"""rel_common.py: what the reliability tests (tests/script/fault_injection.sh,
crash_consistency.sh, concurrency.sh, tamper.sh) share: where the tools
are, running them, the inventory checks every trial ends with, snapshots of
a directory tree, and the "<name>: N passed, N failed" count.

Only the standard library: these tests run where the Python oracles'
virtual environment does not exist.

Environment (set by tests/run.sh): MS_BUILD (the directory with the tools),
MS_FIXTURES, MS_ROOT; MS_RELIABILITY_FULL=1 selects the full trial counts;
MS_RELIABILITY_KEEP=1 keeps the scratch directory; MS_RELIABILITY_SEED fixes
the random seed (default: a fixed one, so a failure reproduces).
"""
import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading

ROOT = os.environ.get("MS_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.environ.get("MS_FIXTURES") or os.path.join(ROOT, "tests", "fixtures")
FULL = os.environ.get("MS_RELIABILITY_FULL") == "1"
SEED = int(os.environ.get("MS_RELIABILITY_SEED", "20250131"))

# ".<name>.tmp-<pid>-<hex>": the temporaries of ms_afile (fsutil.h)
TEMP_RE = re.compile(r"^\..+\.tmp-[0-9]+-[0-9a-f]+$")
# the inventory's own files, which every trial is allowed to change
DB_NAMES = ("inv.db", "inv.db-wal", "inv.db-shm", "inv.db-journal")


def build_dir():
    b = os.environ.get("MS_BUILD") or os.path.join(ROOT, "build")
    return os.path.abspath(b)


class Suite:
    """Counts cases; prints failures as they happen and the total at the
    end."""

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = 0
        self.notes = []
        self.lock = threading.Lock()  # checks may come from several threads
        base = tempfile.mkdtemp(prefix="ms-rel-%s-" % name)
        self.tmp = base

    def check(self, ok, what):
        with self.lock:
            if ok:
                self.passed += 1
            else:
                self.failed += 1
                print("FAIL %s: %s" % (self.name, what), flush=True)
        return ok

    def note(self, line):
        with self.lock:
            self.notes.append(line)
            print(line, flush=True)

    def guard(self, fn, *args):
        """Run fn(*args); an exception in the harness itself is a failed
        case, and the count line is still printed."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 (any harness error is a failure)
            import traceback
            traceback.print_exc()
            self.check(False, "harness error: %r" % (e,))
        return self.finish()

    def finish(self):
        if os.environ.get("MS_RELIABILITY_KEEP") == "1":
            print("%s: scratch kept in %s" % (self.name, self.tmp))
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        print("%s: %d passed, %d failed" % (self.name, self.passed, self.failed),
              flush=True)
        return 1 if self.failed else 0


def run(argv, cwd=None, env=None, timeout=300, stdin=None):
    """Run argv; returns (rc, stdout, stderr) as text. A signal is -N."""
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run(argv, cwd=cwd, env=e, timeout=timeout,
                       stdin=subprocess.DEVNULL if stdin is None else stdin,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


def integrity(db, cwd=None):
    """PRAGMA integrity_check through the sqlite3 shell when there is one
    (what an operator would run), else through Python's sqlite3. A relative
    db is relative to cwd (opening it elsewhere would create an empty file
    there)."""
    if cwd and not os.path.isabs(db):
        db = os.path.join(cwd, db)
    if shutil.which("sqlite3"):
        rc, out, err = run(["sqlite3", db, "PRAGMA integrity_check"])
        return out.strip() if rc == 0 else "sqlite3 exit %d: %s" % (rc, err.strip())
    con = sqlite3.connect(db)
    try:
        return "\n".join(r[0] for r in con.execute("PRAGMA integrity_check"))
    finally:
        con.close()


def inventory_problems(build, db, cwd=None):
    """The three checks after every trial: the registered states verify,
    the audit log chain holds, SQLite finds the file sound. Returns a list
    of problems (empty when all hold)."""
    probs = []
    rc, out, err = run([os.path.join(build, "msverify"), "files", "--db", db], cwd=cwd)
    if rc != 0:
        probs.append("msverify files exit %d: %s" % (rc, (err or out).strip()[:300]))
    rc, out, err = run([os.path.join(build, "msinv"), "log", "--check", "--db", db], cwd=cwd)
    if rc != 0:
        probs.append("msinv log --check exit %d: %s" % (rc, (err or out).strip()[:300]))
    ic = integrity(db, cwd)
    if ic != "ok":
        probs.append("integrity_check: %s" % ic[:300])
    return probs


def states(build, db, cwd=None):
    """The state digests of the inventory, sorted (None when ls fails)."""
    rc, out, _ = run([os.path.join(build, "msinv"), "ls", "--db", db], cwd=cwd)
    if rc != 0:
        return None
    return sorted(l.split("\t")[0] for l in out.splitlines() if l.strip())


def temps(top):
    """Temporaries of interrupted writes under top: files, and directories
    a writer stages a whole output in (listed with a trailing '/')."""
    found = []
    for d, dirs, files in os.walk(top):
        found += [os.path.join(d, f) for f in files if TEMP_RE.match(f)]
        found += [os.path.join(d, x) + "/" for x in dirs if TEMP_RE.match(x)]
    return sorted(found)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def snapshot(top, skip=DB_NAMES):
    """{relative path: (size, sha256)} of every file under top, and every
    directory as (None, None); the inventory's files are left out."""
    snap = {}
    for d, dirs, files in os.walk(top):
        rel = os.path.relpath(d, top)
        if rel != ".":
            snap[rel + "/"] = (None, None)
        for f in files:
            if f in skip:
                continue
            p = os.path.join(d, f)
            r = os.path.normpath(os.path.join(rel, f))
            if os.path.islink(p):
                snap[r] = ("link", os.readlink(p))
            else:
                snap[r] = (os.path.getsize(p), sha256_file(p))
    return snap


def snapshot_diff(before, after):
    """One line saying what differs between two snapshots ('' if equal)."""
    added = sorted(set(after) - set(before))
    gone = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    parts = []
    if added:
        parts.append("new: " + ", ".join(added[:6]))
    if gone:
        parts.append("removed: " + ", ".join(gone[:6]))
    if changed:
        parts.append("changed: " + ", ".join(changed[:6]))
    return "; ".join(parts)


def restore(pristine, work):
    """Make work a fresh copy of pristine (the same path every trial, so the
    absolute paths an inventory recorded stay valid)."""
    if os.path.exists(work):
        shutil.rmtree(work)
    shutil.copytree(pristine, work, symlinks=True)


def one_line_error(err, tool):
    """The error contract: exactly one line on stderr, '<tool>: ...'."""
    lines = [l for l in err.splitlines()]
    return len(lines) == 1 and lines[0].startswith(tool + ": ")


def has_tool(build, tool, cmd):
    """Does the tool exist in this build and know the subcommand?"""
    p = os.path.join(build, tool)
    if not os.access(p, os.X_OK):
        return False
    rc, out, err = run([p, "--help"])
    return rc == 0 and re.search(r"\b%s %s\b" % (re.escape(tool), re.escape(cmd)), out + err) is not None


def die(msg):
    print(msg, file=sys.stderr)
    sys.exit(2)
