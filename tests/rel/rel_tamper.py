#!/usr/bin/env python3
"""rel_tamper.py: tamper evidence. Each change an attacker or a bad disk
could make must be caught by the command meant to catch it, with exit 1
and a message naming what changed:

  - a bit flipped in a tensor's bytes      -> msverify files names the tensor
  - a bit flipped in a safetensors header  -> msverify files names the file
  - tensors.digest / states.digest /
    files.header_digest edited in SQLite   -> msverify files names the tensor,
                                              the state or the file
  - an audit log row edited, deleted or
    reordered, or the head edited          -> msinv log --check names the entry
  - a bit flipped in a signature file      -> msverify verify fails, unless
                                              the signed bytes (DSSE payload,
                                              payload type, signatures) are
                                              untouched
  - a model file changed after signing     -> msverify verify names the file

Each case starts from the untouched files, and the untouched state is
checked to pass first, so a detection is the change's doing. The layout of
the files is read here with the standard library (the safetensors header,
the bundle JSON), not taken from the tools under test.

    python3 tests/rel/rel_tamper.py --build DIR [--all]
"""
import argparse
import json
import os
import random
import shutil
import sqlite3
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rel_common as rc  # noqa: E402


def st_layout(path):
    """(header length, header bytes, [(name, absolute begin, end)])."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = f.read(n)
    j = json.loads(h)
    ts = [(k, 8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
          for k, v in j.items() if k != "__metadata__"]
    return n, h, sorted(ts, key=lambda t: t[1])


def flip(path, off, bit):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ bit]))


class Bench:
    def __init__(self, suite, build):
        self.suite, self.build = suite, build
        self.dir = os.path.join(suite.tmp, "t")
        self.keep = os.path.join(suite.tmp, "pristine")
        os.makedirs(self.dir)

    def tool(self, *argv):
        return rc.run([os.path.join(self.build, argv[0])] + list(argv[1:]), cwd=self.dir)

    def save(self):
        if os.path.exists(self.keep):
            shutil.rmtree(self.keep)
        shutil.copytree(self.dir, self.keep)

    def reset(self):
        """Back to the saved state, in place (the inventory records these
        paths)."""
        for d, _, files in os.walk(self.keep):
            for f in files:
                src = os.path.join(d, f)
                dst = os.path.join(self.dir, os.path.relpath(src, self.keep))
                shutil.copyfile(src, dst)
        for s in ("-wal", "-shm"):
            p = os.path.join(self.dir, "inv.db" + s)
            if os.path.exists(p) and not os.path.exists(os.path.join(self.keep, "inv.db" + s)):
                os.unlink(p)

    def expect(self, what, argv, code, names):
        r, out, err = self.tool(*argv)
        text = out + err
        miss = [n for n in names if n not in text]
        ok = r == code and not miss
        self.suite.check(ok, "%s: %s exit %d (want %d)%s: %s" % (
            what, " ".join(argv[:2]), r, code,
            (", does not name " + ", ".join(repr(m) for m in miss)) if miss else "",
            text.strip().replace("\n", " | ")[:300]))
        return ok


def sql(db, script):
    con = sqlite3.connect(db)
    try:
        con.executescript(script)
        con.commit()
    finally:
        con.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--all", action="store_true",
                    help="every tensor, every header byte, every log entry, every "
                         "signature byte (default: a seeded sample)")
    ap.add_argument("--name", default="tamper")
    a = ap.parse_args()
    suite = rc.Suite(a.name)
    return suite.guard(run_all, suite, a)


def run_all(suite, a):
    b = Bench(suite, os.path.abspath(a.build))
    rng = random.Random(rc.SEED)
    counts = {}

    def count(k):
        counts[k] = counts.get(k, 0) + 1

    shutil.copytree(os.path.join(rc.FIXTURES, "hf", "qwen3moe-sharded"),
                    os.path.join(b.dir, "m"))
    for argv in (["msinv", "init", "--db", "inv.db"],
                 ["msinv", "add", "--db", "inv.db", "--label", "base", "m"]):
        r, out, err = b.tool(*argv)
        if not suite.check(r == 0, "setup %s: %s" % (" ".join(argv), err.strip())):
            return
    b.save()
    files = sorted(f for f in os.listdir(os.path.join(b.dir, "m")) if f.endswith(".safetensors"))
    verify = ["msverify", "files", "--db", "inv.db"]
    if not b.expect("untouched", verify, 0, []):
        return

    # ---- tensor bytes -------------------------------------------------------
    cases = []
    for f in files:
        _, _, ts = st_layout(os.path.join(b.dir, "m", f))
        cases += [(f, t) for t in ts if t[2] > t[1]]
    if not a.all:
        cases = rng.sample(cases, min(8, len(cases)))
    for f, (name, beg, end) in cases:
        b.reset()
        flip(os.path.join(b.dir, "m", f), rng.randrange(beg, end), 1 << rng.randrange(8))
        b.expect("tensor %s flipped" % name, verify, 1, [name, "digest mismatch"])
        count("tensor bit flips")

    # ---- headers --------------------------------------------------------------
    f = files[0]
    path = os.path.join(b.dir, "m", f)
    n, h, ts = st_layout(path)

    def at(sub, k=1):
        i = h.find(sub)
        assert i >= 0, sub
        return 8 + i + k
    named = [("length prefix", 0), ("opening brace", 8), ("tensor name", at(b'"lm_head')),
             ("dtype", at(b"BF16", 2)), ("shape", at(b"[256", 1)),
             ("data offsets", at(b"32768")), ("metadata", at(b'"pt"')),
             ("padding", 8 + n - 1)]
    if a.all:
        named += [("header byte %d" % i, i) for i in range(8 + n) if i not in
                  {o for _, o in named}]
    for what, off in named:
        for bit in ((0x01, 0x20) if not what.startswith("header byte") else (1 << rng.randrange(8),)):
            b.reset()
            flip(path, off, bit)
            b.expect("header %s (byte %d ^ 0x%02x)" % (what, off, bit), verify, 1, [f])
            count("header bit flips")

    # ---- the database -----------------------------------------------------------
    db = os.path.join(b.dir, "inv.db")
    tname = ts[len(ts) // 2][0]
    b.reset()
    sql(db, "UPDATE tensors SET digest = '%s' || substr(digest, 3) WHERE name = '%s';"
        % ("00", tname))
    b.expect("tensors.digest of %s edited" % tname, verify, 1, [tname])
    count("database edits")
    b.reset()
    sql(db, "UPDATE tensors SET digest = 'ff' || substr(digest, 3) WHERE name = '%s';" % tname)
    b.expect("tensors.digest of %s edited (ff)" % tname, verify, 1, [tname])
    count("database edits")
    b.reset()
    sql(db, "UPDATE states SET digest = 'sha256:00' || substr(digest, 10);")
    b.expect("states.digest edited", verify, 1, ["base"])
    count("database edits")
    b.reset()
    sql(db, "UPDATE files SET header_digest = '00' || substr(header_digest, 3) "
        "WHERE path LIKE '%%%s';" % f)
    b.expect("files.header_digest edited", verify, 1, [f])
    count("database edits")

    # ---- the audit log ------------------------------------------------------------
    b.reset()
    for _ in range(3):  # a few more entries (each verification is one)
        b.tool(*verify)
    b.save()
    con = sqlite3.connect(db)
    nlog = con.execute("SELECT max(seq) FROM log").fetchone()[0]
    con.close()
    check = ["msinv", "log", "--check", "--db", "inv.db"]
    b.expect("log untouched", check, 0, [])
    # the triggers stop a plain edit; an attacker with the shell drops them
    b.reset()
    try:
        sql(db, "UPDATE log SET detail = '{}' WHERE seq = 2;")
        blocked = False
    except sqlite3.DatabaseError:
        blocked = True
    suite.check(blocked, "the log's append-only triggers did not stop an UPDATE")
    unlock = "DROP TRIGGER IF EXISTS log_no_update; DROP TRIGGER IF EXISTS log_no_delete; "
    seqs = range(1, nlog + 1) if a.all else sorted({1, 2, nlog // 2 + 1, nlog})
    for k in seqs:
        for col, val in (("detail", "'{\"tampered\":1}'"), ("at", "'2000-01-01T00:00:00.000000Z'"),
                         ("action", "'rm'")):
            b.reset()
            sql(db, unlock + "UPDATE log SET %s = %s WHERE seq = %d;" % (col, val, k))
            b.expect("log entry %d %s edited" % (k, col), check, 1, ["entry %d" % k])
            count("log edits")
            if not a.all:
                break
        b.reset()
        sql(db, unlock + "DELETE FROM log WHERE seq = %d;" % k)
        b.expect("log entry %d deleted" % k, check, 1,
                 ["entry %d" % (k - 1 if k == nlog else k)])
        count("log deletions")
    pairs = range(1, nlog) if a.all else [1, nlog - 1]
    for k in pairs:
        b.reset()
        sql(db, unlock + "UPDATE log SET seq = 1000000 WHERE seq = %d; "
            "UPDATE log SET seq = %d WHERE seq = %d; "
            "UPDATE log SET seq = %d WHERE seq = 1000000;" % (k, k, k + 1, k + 1))
        b.expect("log entries %d and %d swapped" % (k, k + 1), check, 1, ["entry %d" % k])
        count("log reorders")
    b.reset()
    sql(db, "UPDATE log_head SET hash = '00' || substr(hash, 3);")
    b.expect("log head hash edited", check, 1, ["head"])
    count("log edits")

    # ---- signatures ------------------------------------------------------------------
    b.reset()
    key, pub, sig = (os.path.join(b.dir, x) for x in ("key.pem", "key.pub", "m.sig"))
    r1, _, e1 = rc.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout",
                        "-out", key])
    r2, _, e2 = rc.run(["openssl", "pkey", "-in", key, "-pubout", "-out", pub])
    if not suite.check(r1 == 0 and r2 == 0, "openssl key generation: %s %s" % (e1, e2)):
        return
    r, out, err = b.tool("msverify", "sign", "--key", key, "-o", sig, "m")
    if not suite.check(r == 0, "msverify sign exit %d: %s" % (r, err.strip())):
        return
    vcmd = ["msverify", "verify", "--sig", sig, "--pub", pub, "m"]
    b.expect("signature untouched", vcmd, 0, [])
    b.save()
    with open(sig, "rb") as fh:
        orig = fh.read()
    env = json.loads(orig)["dsseEnvelope"]

    def signed_part(raw):
        """What the signature covers, or None when the file no longer
        parses: the payload, its type and the signatures."""
        try:
            e = json.loads(raw)["dsseEnvelope"]
            return (e["payload"], e["payloadType"],
                    [s["sig"] for s in e["signatures"]])
        except (ValueError, KeyError, TypeError):
            return None

    B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def b64_swap(c):
        return B64[(B64.index(c) + 1 + rng.randrange(62)) % 64]

    targets = []
    sv = env["signatures"][0]["sig"]
    pv = env["payload"]
    si, pi = orig.find(sv.encode()), orig.find(pv.encode())
    # a character of the signature or the payload, replaced by another
    # base64 character: the file stays well formed, only the bytes change
    for region, start, val in (("signature", si, sv), ("payload", pi, pv)):
        idx = [i for i, c in enumerate(val) if c in B64]
        # the last characters may carry padding bits a decoder ignores
        idx = [i for i in idx if i < len(val.rstrip("=")) - 2]
        for i in (idx if a.all else rng.sample(idx, min(6, len(idx)))):
            targets.append(("%s char %d" % (region, i), start + i,
                            b64_swap(val[i]).encode()))
    for what, off, new in targets:
        raw = bytearray(orig)
        raw[off:off + 1] = new
        with open(sig, "wb") as fh:
            fh.write(raw)
        b.expect("signature file: %s changed" % what, vcmd, 1, [])
        count("signature edits")
    # any single-bit flip anywhere: must fail unless the signed part is intact
    positions = range(len(orig)) if a.all else rng.sample(range(len(orig)), 40)
    for off in positions:
        raw = bytearray(orig)
        raw[off] ^= 1 << rng.randrange(8)
        with open(sig, "wb") as fh:
            fh.write(raw)
        r, out, err = b.tool(*vcmd)
        intact = signed_part(bytes(raw)) == signed_part(orig)
        suite.check(r != 0 or intact,
                    "signature file byte %d flipped: verify exit 0 though the signed part changed"
                    % off)
        suite.check(r in (0, 1, 2), "signature file byte %d flipped: exit %d" % (off, r))
        count("signature bit flips")
    with open(sig, "wb") as fh:
        fh.write(orig)
    for f in files + ["config.json"]:
        b.reset()
        p = os.path.join(b.dir, "m", f)
        flip(p, os.path.getsize(p) - 2, 0x04)
        b.expect("%s changed after signing" % f, vcmd, 1, [f])
        count("signed file edits")

    for k in sorted(counts):
        suite.note("tamper: %s: %d" % (k, counts[k]))


if __name__ == "__main__":
    sys.exit(main())
