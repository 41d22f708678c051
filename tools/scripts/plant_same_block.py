#!/usr/bin/env python3
"""Plant the failure msinv exists for, in an EP shard set: rank 1 holds the
expert block of rank 0 (same tensor names, shapes, metadata and manifest;
rank 0's bytes), as when a warm start that ignored expert parallelism made
every rank load the same block. Used by the demo and the tests.

usage: plant_same_block.py SHARD_DIR [RANK_FROM RANK_TO]
"""
import glob
import json
import os
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    return data[: 8 + n], json.loads(data[8 : 8 + n]), data[8 + n :]


def main():
    d = sys.argv[1]
    src, dst = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) == 4 else (0, 1)
    files = sorted(glob.glob(os.path.join(d, "*-ep*-of-*.safetensors")))
    if len(files) <= max(src, dst):
        sys.exit("plant_same_block: no shard pair %d/%d in %s" % (src, dst, d))
    _, hs, ds = read(files[src])
    head, hd, dd = read(files[dst])
    out = bytearray(dd)
    # per-expert tensors carry global ids in their names: the k-th local
    # expert of one rank stands for the k-th of the other
    ids_s = hs.get("__metadata__", {}).get("msinv.ep.experts", "").split(",")
    ids_d = hd.get("__metadata__", {}).get("msinv.ep.experts", "").split(",")
    to_src = {}
    if len(ids_s) == len(ids_d):
        to_src = {".experts.%s." % d: ".experts.%s." % s for s, d in zip(ids_s, ids_d)}
    for name, info in hd.items():
        if name == "__metadata__":
            continue
        src_name = name
        for d, s in to_src.items():
            if d in name:
                src_name = name.replace(d, s)
                break
        other = hs.get(src_name)
        if not other or other["shape"] != info["shape"] or other["dtype"] != info["dtype"]:
            sys.exit("plant_same_block: shards differ in tensor %s" % name)
        b, e = info["data_offsets"]
        sb, se = other["data_offsets"]
        out[b:e] = ds[sb:se]
    tmp = files[dst] + ".plant"
    with open(tmp, "wb") as f:
        f.write(head + bytes(out))
    os.replace(tmp, files[dst])
    print("planted: %s now holds the expert bytes of %s"
          % (os.path.basename(files[dst]), os.path.basename(files[src])))


if __name__ == "__main__":
    main()
