"""Shared fixtures of the Python package's tests: where the build and the
fixtures are (MS_BUILD, MS_FIXTURES, as tests/run.sh sets them), a helper
that runs a tool, and a small inventory holding the PEFT fixture's base
and adapter."""
import json
import os
import shutil
import subprocess

import pytest

ROOT = os.environ.get("MS_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("MS_BUILD") or os.path.join(ROOT, "build")
FX = os.environ.get("MS_FIXTURES") or os.path.join(ROOT, "tests", "fixtures")


def tool(*args, check=True, env=None):
    """Run build/<tool> args...; returns the CompletedProcess."""
    e = dict(os.environ)
    e.pop("MSINV_RUN", None)
    if env:
        e.update(env)
    p = subprocess.run([os.path.join(BUILD, args[0])] + [str(a) for a in args[1:]],
                       capture_output=True, text=True, env=e)
    if check and p.returncode != 0:
        raise AssertionError("%s exited %d: %s" % (args, p.returncode, p.stderr))
    return p


def inspect(path):
    """msinv inspect --digests --json: {name: tensor record} and the state."""
    out = json.loads(tool("msinv", "inspect", "--digests", "--json", path).stdout)
    return {t["name"]: t for t in out["tensors"]}, out["state_digest"]


@pytest.fixture
def fx():
    return FX


@pytest.fixture
def inv(tmp_path):
    """An inventory with the PEFT fixture's base ("base") and adapter
    ("lora"), copied under tmp_path; yields (db path, tmp_path)."""
    shutil.copytree(os.path.join(FX, "peft", "qwen3moe-E8-r4", "base"), tmp_path / "base")
    shutil.copytree(os.path.join(FX, "peft", "qwen3moe-E8-r4", "adapter"), tmp_path / "adapter")
    db = tmp_path / "inv.db"
    env = {"MSINV_DB": str(db)}
    tool("msinv", "init", env=env)
    tool("msinv", "add", "--label", "base", tmp_path / "base", env=env)
    tool("msinv", "add", "--label", "lora", "--parent", "base", "--op", "train",
         tmp_path / "adapter", env=env)
    return db, tmp_path


def flip(path, name, at=0):
    """Flip one bit of tensor name's bytes in a safetensors file."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        h = json.loads(f.read(n))
        off = 8 + n + h[name]["data_offsets"][0] + at
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 1]))


def raw_tensors(path):
    """{name: bytes} of a safetensors file, read by offsets (an oracle
    independent of the library and of numpy's dtypes)."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    h = json.loads(data[8:8 + n])
    return {k: data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in h.items() if k != "__metadata__"}
