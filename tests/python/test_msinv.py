"""The Python package over libms.so: digests equal the C tools', loads are
verified (tamper refused), bad files are exceptions and never a crash, EP
loading equals msshard's output rank by rank, the digest map is what
msverify policy reads, the launch gate's environment is honoured, and the
DLPack hand-over frees its memory exactly once."""
import gc
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file as st_load, save_file as st_save

import msinv
from conftest import BUILD, FX, ROOT, flip, inspect, raw_tensors, tool

DTYPES = sorted(glob.glob(os.path.join(FX, "dtypes", "*.safetensors")))
SUBBYTE = ("F4", "F6_E2M3", "F6_E3M2")


def raw(a):
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


# ---- the binding itself ---------------------------------------------------------

def test_version_and_errors():
    assert msinv.__version__ == "0.1.0"
    assert issubclass(msinv.MsCheckError, msinv.MsError)
    assert issubclass(msinv.MsGateError, msinv.MsCheckError)
    assert issubclass(msinv.MsInvalidError, ValueError)
    e = msinv.MsNotFoundError("x")
    assert (e.code, e.exit_code) == (5, 2)


def test_missing_library_is_an_import_error(tmp_path):
    env = dict(os.environ, MSINV_LIBMS=str(tmp_path / "nowhere.so"))
    p = subprocess.run([sys.executable, "-c", "import msinv"], env=env,
                       capture_output=True, text=True)
    assert p.returncode != 0 and "libms.so not found" in p.stderr


# ---- digests --------------------------------------------------------------------

@pytest.mark.parametrize("path", DTYPES, ids=os.path.basename)
def test_load_file_equals_safetensors_and_digests_equal_c(path):
    rec, state = inspect(path)
    digests = {k: t["sha256"] for k, t in rec.items()}
    got = msinv.load_file(path, digests)
    want = raw_tensors(path)
    assert set(got) == set(want)
    for k in want:
        assert raw(got[k]) == want[k], k
        if rec[k]["dtype"] not in SUBBYTE:
            assert got[k].shape == tuple(rec[k]["shape"]), k
    # per-tensor and state digests computed from memory equal the C tool's
    assert msinv.tensor_digests(got) == digests
    over_dt = {k: t["dtype"] for k, t in rec.items() if t["dtype"] in SUBBYTE}
    over_sh = {k: t["shape"] for k, t in rec.items() if t["dtype"] in SUBBYTE}
    assert msinv.state_digest(got, dtypes=over_dt, shapes=over_sh) == state


def test_bf16_dtype_is_ml_dtypes_bfloat16():
    import ml_dtypes
    path = os.path.join(FX, "dtypes", "one_bf16.safetensors")
    rec, _ = inspect(path)
    got = msinv.load_file(path, {k: t["sha256"] for k, t in rec.items()})
    assert got["bf16"].dtype == np.dtype(ml_dtypes.bfloat16)


def test_state_digest_of_checkpoint_equals_c():
    path = os.path.join(FX, "hf", "qwen3moe", "model.safetensors")
    rec, state = inspect(path)
    tensors = msinv.load_file(path, {k: t["sha256"] for k, t in rec.items()})
    assert msinv.state_digest(tensors) == state
    # one changed element changes the state
    k = sorted(tensors)[0]
    tensors[k] = tensors[k].copy()
    tensors[k].reshape(-1).view(np.uint8)[0] ^= 1
    assert msinv.state_digest(tensors) != state


def test_state_digest_refuses_duplicates_and_bad_dtypes():
    with pytest.raises(msinv.MsInvalidError):
        msinv.state_digest({"a": np.zeros(2, np.float32)}, dtypes={"a": "F33"})
    with pytest.raises(msinv.MsInvalidError):
        msinv.state_digest({"a": np.zeros(2, np.float32)}, shapes={"a": [1] * 9})


# ---- the inventory ----------------------------------------------------------------

def test_inventory_list_show_resolve(inv):
    db, tmp = inv
    with msinv.Inventory(db) as i:
        states = i.states()
        assert {s["label"] for s in states} == {"base", "lora"}
        assert [s["label"] for s in i.states("adapter")] == ["lora"]
        base = i.resolve("base")
        assert base.startswith("sha256:") and i.resolve(base[:12]) == base
        show = i.show("base")
        assert show["digest"] == base and show["kind"] == "base"
        assert i.files("base") == [os.path.realpath(tmp / "base" / "model.safetensors")]
        assert any(c["name"] == "config.json" for c in show["configs"])
        # a path on disk resolves to the states it holds
        assert [x["digest"] for x in i.states_at(tmp / "base")] == [base]
        assert [x["label"] for x in i.states_at(tmp / "adapter" / "adapter_model.safetensors")] == ["lora"]
        assert [x["label"] for x in i.states_at(tmp)] == ["base", "lora"]
        assert i.states_at(tmp / "nowhere") == []
        with pytest.raises(msinv.MsNotFoundError) as e:
            i.resolve("nosuchlabel")
        assert e.value.exit_code == 2 and "nosuchlabel" in e.value.message
        with pytest.raises(msinv.MsInvalidError):
            i.states("nokind")


def test_inventory_missing_is_not_found(tmp_path):
    with pytest.raises(msinv.MsNotFoundError):
        msinv.Inventory(tmp_path / "none.db")


def test_load_state_verified(inv):
    db, tmp = inv
    with msinv.Inventory(db) as i:
        got = i.load("base")
        digest = i.resolve("base")
    want = st_load(str(tmp / "base" / "model.safetensors"))
    assert set(got) == set(want)
    assert all(raw(got[k]) == raw(want[k]) for k in want)
    assert msinv.state_digest(got) == digest
    # the default inventory is MSINV_DB
    os.environ["MSINV_DB"] = str(db)
    try:
        assert set(msinv.load_state("lora")) == set(st_load(str(tmp / "adapter" / "adapter_model.safetensors")))
    finally:
        del os.environ["MSINV_DB"]


def test_load_manifest(inv):
    db, tmp = inv
    m = tmp / "base" / "state.json"
    tool("msinv", "export-manifest", "--db", db, "-o", m, "base")
    with msinv.Inventory(db) as i:
        digest = i.resolve("base")
    got = msinv.load_manifest(m)
    want = raw_tensors(str(tmp / "base" / "model.safetensors"))
    assert set(got) == set(want) and all(raw(got[k]) == want[k] for k in want)
    assert msinv.state_digest(got) == digest
    # the copy elsewhere, verified against the manifest: refused once changed
    shutil.copytree(tmp / "base", tmp / "elsewhere")
    flip(tmp / "elsewhere" / "model.safetensors", sorted(want)[1])
    with pytest.raises(msinv.MsCheckError) as e:
        msinv.load_manifest(tmp / "elsewhere" / "state.json")
    assert sorted(want)[1] in e.value.message
    # a manifest whose digests do not give its state is refused before loading
    text = json.loads(m.read_text())
    t0 = text["files"][0]["tensors"][0]
    t0["sha256"] = "0" * 64
    m.write_text(json.dumps(text))
    with pytest.raises(msinv.MsError):
        msinv.load_manifest(m)


def test_load_recorded_file(inv):
    db, tmp = inv
    path = tmp / "adapter" / "adapter_model.safetensors"
    got = msinv.load_file(path, inventory=str(db))
    assert set(got) == set(st_load(str(path)))
    with pytest.raises(msinv.MsNotFoundError):
        msinv.load_file(os.path.join(FX, "dtypes", "one_f32.safetensors"), inventory=str(db))
    # a file of a multi-file state: its tensors only, checked against the record
    shutil.copytree(os.path.join(FX, "hf", "qwen3moe-sharded"), tmp / "sharded")
    tool("msinv", "add", "--label", "sharded", tmp / "sharded", env={"MSINV_DB": str(db)})
    first = sorted(glob.glob(str(tmp / "sharded" / "*.safetensors")))[0]
    got = msinv.load_file(first, inventory=str(db))
    want = raw_tensors(first)
    assert set(got) == set(want) and all(raw(got[k]) == want[k] for k in want)
    flip(first, sorted(want)[-1])
    with pytest.raises(msinv.MsCheckError):
        msinv.load_file(first, inventory=str(db))


# ---- tamper refused -----------------------------------------------------------------

def test_tamper_refused_state(inv):
    db, tmp = inv
    path = tmp / "base" / "model.safetensors"
    name = sorted(st_load(str(path)))[3]
    flip(path, name, at=5)
    with msinv.Inventory(db) as i:
        with pytest.raises(msinv.MsCheckError) as e:
            i.load("base")
    assert e.value.code == 1 and e.value.exit_code == 1
    assert name in e.value.message and "digest mismatch" in e.value.message


def test_tamper_refused_file(tmp_path):
    src = os.path.join(FX, "dtypes", "all.safetensors")
    rec, _ = inspect(src)
    path = tmp_path / "all.safetensors"
    shutil.copy(src, path)
    flip(path, "f32", at=1)
    with pytest.raises(msinv.MsCheckError) as e:
        msinv.load_file(path, {k: t["sha256"] for k, t in rec.items()})
    assert "'f32'" in e.value.message


def test_layout_change_refused(inv):
    db, tmp = inv
    path = tmp / "adapter" / "adapter_model.safetensors"
    t = st_load(str(path))
    k = sorted(t)[0]
    t["renamed." + k] = t.pop(k)  # same bytes, another name
    st_save(t, str(path))
    with msinv.Inventory(db) as i:
        with pytest.raises(msinv.MsCheckError) as e:
            i.load("lora")
    assert "missing" in e.value.message or "not in the record" in e.value.message


def test_digest_map_must_cover_the_file():
    path = os.path.join(FX, "dtypes", "all.safetensors")
    rec, _ = inspect(path)
    d = {k: t["sha256"] for k, t in rec.items()}
    d.pop("f32")
    with pytest.raises(msinv.MsInvalidError) as e:
        msinv.load_file(path, d)
    assert "'f32'" in e.value.message and "no expected digest" in e.value.message
    d["f32"] = "00" * 32
    d["extra"] = "00" * 32
    with pytest.raises(msinv.MsInvalidError):
        msinv.load_file(path, d)
    with pytest.raises(msinv.MsInvalidError):
        msinv.load_file(path, {"f32": "zz"})


# ---- the bad-file corpus: exceptions, never a crash --------------------------------------

def _expected():
    out = {}
    with open(os.path.join(FX, "bad", "EXPECTED.tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, frag = line.rstrip("\n").split("\t", 1)
            out[name] = frag
    return out


BAD = _expected()


@pytest.mark.parametrize("name", sorted(n for n in BAD if n.endswith(".safetensors")))
def test_bad_corpus(name):
    with pytest.raises(msinv.MsError) as e:
        msinv.load_file(os.path.join(FX, "bad", name), {})
    assert e.value.code in (2, 3)
    assert BAD[name] in e.value.message


# ---- EP-aware loading ---------------------------------------------------------------------

ADAPTERS = [("peft/qwen3moe-E8-r4/adapter", 4, "contiguous"),
            ("peft/qwen3moe-E6-r3/adapter", 3, "round-robin"),
            ("peft/mixtral-perexpert-E6-r3/adapter", 2, "contiguous")]


@pytest.mark.parametrize("src,n,placement", ADAPTERS, ids=lambda v: str(v))
def test_ep_rank_equals_msshard(tmp_path, src, n, placement):
    out = tmp_path / "set"
    tool("msshard", "split", os.path.join(FX, src), "-o", out, "--ep-size", n,
         "--placement", placement, "--no-register")
    for r in range(n):
        shard = glob.glob(str(out / ("*-ep%05d-of-%05d.safetensors" % (r, n))))[0]
        want = st_load(shard)
        for where, kw in ((out, {}), (out / "ep_manifest.json", {}),
                          (os.path.join(FX, src), {"placement": placement})):
            got = msinv.load_ep_rank(where, n, r, tmpdir=str(tmp_path), **kw)
            assert got.rank == r and got.ep_size == n
            assert set(got.tensors) == set(want)
            assert all(raw(got.tensors[k]) == raw(want[k]) for k in want)
            with open(shard, "rb") as f:
                meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
            assert got.experts == [int(x) for x in meta["msinv.ep.experts"].split(",")]
    # the temporary splits are gone
    assert sorted(os.listdir(tmp_path)) == ["set"]


def test_ep_refusals(tmp_path):
    src = os.path.join(FX, "peft", "qwen3moe-E8-r4", "adapter")
    out = tmp_path / "set"
    tool("msshard", "split", src, "-o", out, "--ep-size", 4, "--no-register")
    with pytest.raises(msinv.MsError) as e:
        msinv.load_ep_rank(out, 8, 0)
    assert "made for EP size 4" in e.value.message and "--ep-size 8" in e.value.message
    with pytest.raises(msinv.MsError):
        msinv.load_ep_rank(out, 4, 4)
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    subprocess.run([sys.executable, os.path.join(ROOT, "tools",
                                                 "scripts", "plant_same_block.py"), str(bad)],
                   check=True, capture_output=True)
    with pytest.raises(msinv.MsCheckError) as e:
        msinv.load_ep_rank(bad, 4, 1)
    assert "same expert block" in e.value.message
    # a shard whose metadata places other experts than the manifest does
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    shard = glob.glob(str(moved / "*-ep00001-of-00004.safetensors"))[0]
    with open(shard, "rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
    meta["msinv.ep.experts"] = ",".join(reversed(meta["msinv.ep.experts"].split(",")))
    st_save(st_load(shard), shard, metadata=meta)
    with pytest.raises(msinv.MsError) as e:
        msinv.load_ep_rank(moved, 4, 1)
    assert e.value.code in (1, 2) and "expert" in e.value.message
    assert set(msinv.load_ep_rank(moved, 4, 0).tensors)  # the other ranks still load
    # an E not divisible by the EP size, unsharded
    with pytest.raises(msinv.MsInvalidError):
        msinv.load_ep_rank(src, 3, 0, tmpdir=str(tmp_path))


# ---- the digest map msverify policy reads --------------------------------------------------

def test_digest_map_identifies_policy(inv):
    db, tmp = inv
    with msinv.Inventory(db) as i:
        served = dict(i.load("base"))
        served.update(i.load("lora"))
    m = tmp / "served.json"
    msinv.write_digest_map(served, m)
    p = tool("msverify", "policy", "--db", db, m, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    # a weight sync that changed one tensor: not identified
    k = sorted(served)[0]
    served[k] = served[k].copy()
    served[k].reshape(-1)[0] += 1
    msinv.write_digest_map(served, m)
    p = tool("msverify", "policy", "--db", db, m, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    with pytest.raises(ValueError):
        msinv.write_digest_map(served, tmp / "index.json")


# ---- the launch gate ---------------------------------------------------------------------------

GATED = r"""
import sys, msinv
g = msinv.gate()
assert g is not None and g.run >= 1 and g.plan_digest.startswith("sha256:")
base = msinv.load_role("base")
assert msinv.state_digest(base) == g.digest("base")
try:
    msinv.load_state("other")
except msinv.MsGateError as e:
    print("refused:", e.message)
else:
    sys.exit("loaded a state the gate did not verify")
try:
    msinv.load_file(sys.argv[1], sys.argv[2])
except msinv.MsGateError:
    print("refused file")
else:
    sys.exit("loaded a file the gate did not verify")
try:
    msinv.load_role("nosuchrole")
except msinv.MsGateError:
    print("refused role")
# EP: the verified adapter, split here for the run's EP size, loads
r = msinv.load_ep_rank(g.paths["LORA"], 2, 1, tmpdir=sys.argv[4])
assert r.source_digest == g.digest("lora") and r.experts == [4, 5, 6, 7], r
# a shard set made elsewhere, on its manifest's word alone: refused
try:
    msinv.load_ep_rank(sys.argv[3], 2, 1)
except msinv.MsGateError:
    print("refused shard set")
"""


def test_gate_environment(inv):
    db, tmp = inv
    env = {"MSINV_DB": str(db)}
    other = os.path.join(FX, "dtypes", "one_f32.safetensors")
    shutil.copy(other, tmp / "other.safetensors")
    tool("msinv", "add", "--label", "other", tmp / "other.safetensors", env=env)
    rec, _ = inspect(other)
    with open(tmp / "other.json", "w") as f:
        json.dump({k: t["sha256"] for k, t in rec.items()}, f)
    tool("msshard", "split", tmp / "adapter", "-o", tmp / "ep2", "--ep-size", 2,
         "--no-register")
    (tmp / "plan.json").write_text(json.dumps(
        {"ep_size": 1, "states": [{"role": "base", "state": "base"},
                                  {"role": "lora", "state": "lora"}]}))
    (tmp / "gated.py").write_text(GATED)
    p = tool("msinv", "launch", "--plan", tmp / "plan.json", "--", sys.executable,
             tmp / "gated.py", tmp / "other.safetensors", tmp / "other.json",
             tmp / "ep2", tmp, env=env, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "refused: msinv: other: state sha256:" in p.stdout
    assert "refused file" in p.stdout and "refused role" in p.stdout
    assert "refused shard set" in p.stdout


def test_not_gated_without_run():
    assert msinv.gate() is None or os.environ.get("MSINV_RUN")
    with pytest.raises(msinv.MsGateError):
        if not os.environ.get("MSINV_RUN"):
            msinv.load_role("base")


# ---- DLPack ownership (host arena: the same path as a device load) ------------------------

def test_dlpack_host_arena_freed_once(inv):
    db, tmp = inv
    live = msinv.arenas_live()
    with msinv.Inventory(db) as i:
        got = msinv.load_state_dlpack_host("base", inventory=i)
        want = i.load("base")
    assert msinv.arenas_live() == live + 1
    assert all(raw(got[k]) == raw(want[k]) for k in want)
    keep = got[sorted(got)[0]]
    del got
    gc.collect()
    assert msinv.arenas_live() == live + 1  # one tensor still uses it
    del keep
    gc.collect()
    assert msinv.arenas_live() == live


def test_dlpack_unconsumed_capsule_frees(inv):
    from msinv import _dlpack
    from msinv._lib import lib, Err, HOST
    import ctypes
    db, _ = inv
    live = msinv.arenas_live()
    with msinv.Inventory(db) as i:
        s = msinv._core._Set(lib.ms_py_set_from_inv, i._handle(), b"lora")
    offsets = (ctypes.c_uint64 * len(s.tensors))()
    arena = ctypes.c_void_p()
    err = Err()
    assert lib.ms_py_set_load_arena(s._h, HOST, 1, offsets, ctypes.byref(arena), ctypes.byref(err)) == 0
    caps = [_dlpack.capsule(arena, offsets[k], s.tensors[k][3]) for k in range(len(s.tensors))]
    lib.ms_py_arena_release(arena)
    s.close()
    assert msinv.arenas_live() == live + 1
    del caps
    gc.collect()
    assert msinv.arenas_live() == live


def test_tampered_arena_load_allocates_nothing(inv):
    db, tmp = inv
    flip(tmp / "base" / "model.safetensors", sorted(st_load(str(tmp / "base" / "model.safetensors")))[0])
    live = msinv.arenas_live()
    with msinv.Inventory(db) as i:
        with pytest.raises(msinv.MsCheckError):
            msinv.load_state_dlpack_host("base", inventory=i)
    assert msinv.arenas_live() == live


# ---- devices and torch -----------------------------------------------------------------------

@pytest.mark.skipif(msinv.gpu_available(), reason="a GPU is present")
def test_cuda_without_gpu_is_no_device(inv):
    db, _ = inv
    with msinv.Inventory(db) as i:
        with pytest.raises(msinv.MsNoDeviceError) as e:
            i.load("base", framework="torch", device="cuda")
    assert e.value.exit_code == 3
    with pytest.raises(ValueError):
        msinv.load_file(os.path.join(FX, "dtypes", "one_f32.safetensors"), {}, device="cuda")
    with pytest.raises(ValueError):
        with msinv.Inventory(db) as i:
            i.load("base", framework="torch", device="cuda:1")


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        pytest.skip("torch is not importable: the torch path is not tested here")


def test_torch_cpu(inv):
    torch = _torch()
    db, _ = inv
    with msinv.Inventory(db) as i:
        t = i.load("base", framework="torch")
        n = i.load("base")
        digest = i.resolve("base")
    assert all(isinstance(v, torch.Tensor) for v in t.values())
    assert all(raw(t[k].view(torch.uint8).numpy()) == raw(n[k]) for k in n)
    assert msinv.state_digest(t) == digest
    # the DLPack hand-over into torch (what a CUDA load does), on a host arena
    from msinv._lib import HOST, lib
    live = msinv.arenas_live()
    with msinv.Inventory(db) as i:
        s = msinv._core._Set(lib.ms_py_set_from_inv, i._handle(), b"base")
    h = s._load_arena(HOST, 0, framework="torch")
    s.close()
    assert msinv.arenas_live() == live + 1
    assert all(torch.equal(h[k], t[k]) for k in t)
    view = h[sorted(h)[0]][:1]
    del h
    gc.collect()
    assert msinv.arenas_live() == live + 1  # a view keeps the arena
    del view
    gc.collect()
    assert msinv.arenas_live() == live


@pytest.mark.skipif(not os.environ.get("MS_TEST_GPU"), reason="CUDA path runs in make test-gpu")
def test_torch_cuda(inv):
    torch = _torch()
    db, tmp = inv
    live = msinv.arenas_live()
    with msinv.Inventory(db) as i:
        g = i.load("base", framework="torch", device="cuda")
        c = i.load("base", framework="torch")
        digest = i.resolve("base")
    assert all(v.is_cuda for v in g.values())
    assert all(torch.equal(g[k].cpu().view(torch.uint8), c[k].view(torch.uint8)) for k in c)
    assert msinv.state_digest(g) == digest
    assert msinv.arenas_live() == live + 1
    del g
    gc.collect()
    assert msinv.arenas_live() == live
    flip(tmp / "base" / "model.safetensors", sorted(c)[0])
    with msinv.Inventory(db) as i:
        with pytest.raises(msinv.MsCheckError):
            i.load("base", framework="torch", device="cuda")
    assert msinv.arenas_live() == live


def test_peft_rank_by_rank_equals_unsharded(tmp_path):
    torch = _torch()
    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        pytest.skip("peft/transformers are not importable: the PEFT helper is not tested here")
    from peft_check import check_peft_ep
    check_peft_ep(tmp_path, torch)


# ---- the shared library and its installation ------------------------------------------------

def test_shared_library_exports_the_api_only():
    so = os.path.join(BUILD, "libms.so.0")
    dyn = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libms.so.0]" in dyn
    syms = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True,
                          check=True).stdout.split("\n")
    names = [l.split()[-1].split("@")[0] for l in syms if l.strip()]
    assert "ms_py_set_load" in names and "ms_inv_open" in names
    assert [n for n in names if not n.startswith("ms_") and n != "LIBMS_0"] == []
    # exactly the public header's functions: the verified-load engine
    # (vload.h) and the staging helpers (stage.h) are internal, reached
    # through ms_py_set_load and the writers
    with open(os.path.join(ROOT, "src", "ms.h")) as f:
        header = f.read()
    for n in names:
        assert n == "LIBMS_0" or re.search(r"\b%s\(" % n, header), n
    assert "ms_load_verified_gpu" not in names and "ms_stage_open" not in names


def test_make_install(tmp_path):
    p = subprocess.run(["make", "-C", ROOT, "--no-print-directory", "-s", "BUILD=" + BUILD,
                        "install", "DESTDIR=" + str(tmp_path), "PREFIX=/usr"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lib = tmp_path / "usr" / "lib"
    assert os.readlink(lib / "libms.so") == "libms.so.0"
    assert os.readlink(lib / "libms.so.0") == "libms.so.0.1.0"
    pc = (lib / "pkgconfig" / "libms.pc").read_text()
    assert os.listdir(tmp_path / "usr" / "include" / "ms") == ["ms.h"]
    assert "Version: 0.1.0" in pc and "-lms" in pc
    env = dict(os.environ, MSINV_LIBMS=str(lib / "libms.so.0"))
    p = subprocess.run([sys.executable, "-c", "import msinv; print(msinv._lib._name)"],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0 and str(lib) in p.stdout, p.stderr
