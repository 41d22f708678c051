#!/usr/bin/env python3
"""gen_hostile_archives.py: write the seed corpus of the bundle import fuzz
target, tests/fuzz/corpus/bundle/.

One valid bundle of a tiny state (one F32 safetensors file and a
config.json) and, beside it, the archives an import must refuse: names that
escape (absolute, ".."), links, devices, a FIFO, a duplicate, an unlisted
and a missing member, the manifest out of place, members larger than
declared, and manifests that lie (a member digest, the state digest, tensor
bytes). Everything is built here, independently of the C code: the
safetensors bytes, the tensor, header and state digests (the canonical
state manifest of checkpoint.h), the tar stream (Python's tarfile) and its
zstd compression (the `zstandard` module when installed, else the zstd
program). A few are also written as plain tar streams (NAME.tar), which
the fuzz target compresses itself: the fuzzer mutates those far better than
compressed bytes. Output is deterministic; every file stays under a few KiB.

    python3 tests/gen/gen_hostile_archives.py [OUTDIR]
        (default tests/fuzz/corpus/bundle)
"""
import copy
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile


def sha(b):
    return hashlib.sha256(b).hexdigest()


def tiny_state():
    """A safetensors file with one F32 [2, 2] tensor, and its manifest."""
    data = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 2],
                               "data_offsets": [0, len(data)]}},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    st = struct.pack("<Q", len(header)) + header + data
    config = b'{"model_type": "tiny"}\n'
    tensor = sha(data)
    canonical = "msinv-state-v1\nw\tF32\t[2,2]\t%s\n" % tensor
    state = "sha256:" + sha(canonical.encode())
    files = {"tiny.safetensors": st, "config.json": config}
    manifest = {
        "format": "msinv-manifest-v1",
        "state": state,
        "kind": "base",
        "label": "tiny",
        "files": [{
            "path": "tiny.safetensors", "size": len(st),
            "header_sha256": sha(st[:8 + len(header)]), "sha256": sha(st),
            "tensors": [{"name": "w", "dtype": "F32", "shape": [2, 2],
                         "offset": 8 + len(header), "bytes": len(data),
                         "sha256": tensor}]}],
        "configs": [{"path": "config.json", "sha256": sha(config)}],
        "bundle": {
            "format": "msinv-bundle-v1",
            "members": [{"path": p, "size": len(b), "sha256": sha(b)}
                        for p, b in files.items()],
            "total_bytes": sum(len(b) for b in files.values()),
            "kind": "base", "label": "tiny", "layout": None,
            "ep_size": None, "ep_rank": None, "experts": None},
    }
    return files, manifest


def entry(name, kind="file", data=b"", link=""):
    ti = tarfile.TarInfo(name)
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    ti.mode = 0o644
    ti.type = {"file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE,
               "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE,
               "chardev": tarfile.CHRTYPE, "dir": tarfile.DIRTYPE}[kind]
    ti.linkname = link
    if kind == "chardev":
        ti.devmajor, ti.devminor = 1, 3
    ti.size = len(data) if kind == "file" else 0
    return ti, (data if kind == "file" else None)


def tar_bytes(entries):
    """The tar stream up to its end-of-archive blocks (no record padding)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for ti, data in entries:
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue().rstrip(b"\0")
    return raw + b"\0" * (-len(raw) % 512 + 1024)


def zstd(raw):
    try:
        import zstandard
        return zstandard.ZstdCompressor(level=19).compress(raw)
    except ImportError:
        if not shutil.which("zstd"):
            sys.exit("gen_hostile_archives: needs the zstandard module or the zstd program")
        return subprocess.run(["zstd", "-q", "-19", "-c"], input=raw,
                              stdout=subprocess.PIPE, check=True).stdout


def manifest_bytes(m):
    return json.dumps(m, indent="\t").encode()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/bundle"
    os.makedirs(out, exist_ok=True)
    files, manifest = tiny_state()
    genuine = [entry("MANIFEST.json", data=manifest_bytes(manifest))] + \
        [entry(p, data=b) for p, b in files.items()]
    cases = {}

    def add(name, entries, raw_too=False):
        raw = tar_bytes(entries)
        cases[name + ".tar.zst"] = zstd(raw)
        if raw_too:
            cases[name + ".tar"] = raw

    def lie(edit, replace=None):
        m = copy.deepcopy(manifest)
        edit(m)
        ents = [entry("MANIFEST.json", data=manifest_bytes(m))]
        for p, b in files.items():
            ents.append(entry(p, data=replace.get(p, b) if replace else b))
        return ents

    add("valid", genuine, raw_too=True)
    cases["truncated.tar.zst"] = zstd(tar_bytes(genuine))[:-40]
    evil = b"evil\n"
    add("absolute", genuine + [entry("/ms-fz-evil", data=evil)])
    add("dotdot", genuine + [entry("../evil", data=evil)], raw_too=True)
    add("dot-component", genuine + [entry("./config.json", data=files["config.json"])])
    add("symlink", [genuine[0], entry("tiny.safetensors", "symlink", link="/etc/passwd"),
                    genuine[2]], raw_too=True)
    add("hardlink", genuine + [entry("hard", "hardlink", link="tiny.safetensors")])
    add("fifo", genuine + [entry("fifo", "fifo")])
    add("chardev", genuine + [entry("null", "chardev")])
    add("dir-not-implied", genuine + [entry("zzz", "dir")])
    add("duplicate", genuine + [genuine[2]])
    add("unlisted", genuine + [entry("extra.safetensors", data=evil)])
    add("missing", genuine[:2])
    add("manifest-second", [genuine[1], genuine[0], genuine[2]])
    add("larger", [genuine[0], entry("tiny.safetensors", data=files["tiny.safetensors"] + b"x" * 64),
                   genuine[2]])

    def member_sha(m):
        m["bundle"]["members"][0]["sha256"] = "0" * 64
        m["files"][0]["sha256"] = "0" * 64
    add("lie-member-sha", lie(member_sha))

    def state(m):
        m["state"] = "sha256:" + "1" * 64
    add("lie-state", lie(state))

    flipped = bytearray(files["tiny.safetensors"])
    flipped[-1] ^= 1
    flipped = bytes(flipped)

    def tensor(m):
        m["bundle"]["members"][0]["sha256"] = sha(flipped)
        m["files"][0]["sha256"] = sha(flipped)
    add("lie-tensor-bytes", lie(tensor, {"tiny.safetensors": flipped}), raw_too=True)

    # regress-*: the corpus minimization keeps these whatever their coverage
    for name, data in sorted(cases.items()):
        with open(os.path.join(out, "regress-hostile-" + name), "wb") as f:
            f.write(data)
    print("gen_hostile_archives: %d archives in %s" % (len(cases), out))


if __name__ == "__main__":
    main()
