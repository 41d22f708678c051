#!/usr/bin/env python3
"""tree_oracle.py: an independent computation of the chunk-tree digests
msinv records (ms(5), "Tree digests"), with Python's hashlib and sqlite3
only: nothing of libms is used.

  tree_oracle.py gen OUT.safetensors [--seed N] [--prefix P]
      a safetensors file of U8 tensors whose sizes sit on and around the
      64 KiB chunk boundary (0, 1, 65535, 65536, 65537, ...) and span many
      chunks, random bytes; the header written by hand
  tree_oracle.py check DB [--all] [--none] [--without NAME] [--source S]
      for every tensor the inventory records: read its bytes from its file
      (path and offset from the database), compute the tree here, and
      compare with the recorded tree digest (keyed by the plain SHA-256,
      which is recomputed too). --all: every tensor must have one;
      --none: no tensor may have one; --without NAME: that tensor must have
      none (its bytes no longer match, so no tree may be recorded for
      them); --source S: every tree row says S.
Exit 0 when everything agrees, 1 on a difference (printed), 2 on bad use.
"""
import argparse
import hashlib
import json
import os
import random
import sqlite3
import struct
import sys

TAG = b"msinv-tree-v1\n"
SIZES = [0, 1, 65535, 65536, 65537, 200003, (1 << 20) + 3, 5 * (1 << 20) + 17, 4096]


def tree(data, log2=16):
    size = 1 << log2
    msg = TAG + bytes([log2]) + struct.pack("<Q", len(data))
    for i in range(0, len(data), size):
        msg += hashlib.sha256(data[i:i + size]).digest()
    return hashlib.sha256(msg).hexdigest()


def gen(path, seed, prefix):
    rnd = random.Random(seed)
    header, blobs, off = {}, [], 0
    for i, n in enumerate(SIZES):
        b = rnd.randbytes(n)
        header["%s.t%d" % (prefix, i)] = {"dtype": "U8", "shape": [n], "data_offsets": [off, off + n]}
        blobs.append(b)
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def check(db, want_all, want_none, without, source):
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT f.path, t.name, t.byte_offset, t.nbytes, t.digest, td.tree, td.chunk_log2, "
        "td.nbytes, td.source FROM tensors t JOIN files f ON f.id = t.file_id "
        "LEFT JOIN tree_digests td ON td.digest = t.digest AND td.chunk_log2 = 16").fetchall()
    bad, ntrees = 0, 0
    for path, name, offset, nbytes, digest, rec, log2, tnb, src in rows:
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(nbytes)
        plain = hashlib.sha256(data).hexdigest()
        if rec is None:
            if want_all and name != without:
                print("tensor %s in %s: no tree digest recorded" % (name, path))
                bad += 1
            continue
        ntrees += 1
        if want_none:
            print("tensor %s: a tree digest is recorded (expected none)" % name)
            bad += 1
        if name == without:
            print("tensor %s: a tree digest is recorded for bytes that changed" % name)
            bad += 1
        if source and src != source:
            print("tensor %s: tree source %s, expected %s" % (name, src, source))
            bad += 1
        if tnb != nbytes:
            print("tensor %s: tree row says %d bytes, tensor %d" % (name, tnb, nbytes))
            bad += 1
        # the row is keyed by the plain digest: where the bytes still have
        # it, the tree must be theirs
        if plain == digest and tree(data) != rec:
            print("tensor %s in %s: tree %s, hashlib says %s" % (name, path, rec, tree(data)))
            bad += 1
    print("checked %d tensors, %d tree digests" % (len(rows), ntrees))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("out")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--prefix", default="model")
    c = sub.add_parser("check")
    c.add_argument("db")
    c.add_argument("--all", action="store_true")
    c.add_argument("--none", action="store_true")
    c.add_argument("--without")
    c.add_argument("--source")
    a = ap.parse_args()
    if a.cmd == "gen":
        gen(a.out, a.seed, a.prefix)
        return 0
    return check(a.db, a.all, a.none, a.without, a.source)


if __name__ == "__main__":
    sys.exit(main())
