"""The package's API over libms: the inventory (read only), verified
loading into numpy arrays or torch tensors, EP-aware loading, digests of
tensors held in memory, and the launch gate's environment."""
import ctypes
import json
import os
import re
import shutil
import tempfile

import numpy as np

from . import _dlpack
from ._lib import (CUDA, DTYPE_NAMES, DTYPES, HOST, MAX_RANK, SHA256_LEN,
                   STATE_DIGEST_LEN, Err, check, fs, lib, take_json)
from .errors import MsGateError, MsInvalidError

try:
    import ml_dtypes as _mld
except ImportError:  # bf16 and fp8 then come back as raw unsigned views
    _mld = None


# ---- dtypes ------------------------------------------------------------------

def _np_dtypes():
    d = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
         "U16": np.uint16, "F16": np.float16, "I32": np.int32, "U32": np.uint32,
         "F32": np.float32, "C64": np.complex64, "F64": np.float64,
         "I64": np.int64, "U64": np.uint64}
    extra = {"BF16": ("bfloat16", np.uint16), "F8_E5M2": ("float8_e5m2", np.uint8),
             "F8_E4M3": ("float8_e4m3fn", np.uint8), "F8_E8M0": ("float8_e8m0fnu", np.uint8),
             "F8_E4M3FNUZ": ("float8_e4m3fnuz", np.uint8),
             "F8_E5M2FNUZ": ("float8_e5m2fnuz", np.uint8)}
    for name, (attr, raw) in extra.items():
        d[name] = getattr(_mld, attr, raw) if _mld is not None else raw
    return {k: np.dtype(v) for k, v in d.items()}


NUMPY_DTYPES = _np_dtypes()
# the other way, for digests of arrays (raw uint16/uint8 views say U16/U8)
_FROM_NUMPY = {}
for _k, _v in NUMPY_DTYPES.items():
    _FROM_NUMPY.setdefault(_v, _k)


def _torch():
    import torch
    return torch


def _torch_dtypes(torch):
    names = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
             "F16": "float16", "BF16": "bfloat16", "I32": "int32", "U32": "uint32",
             "F32": "float32", "C64": "complex64", "F64": "float64", "I64": "int64",
             "U64": "uint64", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
             "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
             "F8_E5M2FNUZ": "float8_e5m2fnuz"}
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


def _dtype_of(x):
    """The safetensors dtype name of an array or tensor."""
    if type(x).__module__.startswith("torch"):
        torch = _torch()
        for k, v in _torch_dtypes(torch).items():
            if x.dtype == v:
                return k
        raise MsInvalidError("msinv: torch dtype %s has no safetensors name" % x.dtype)
    dt = np.dtype(x.dtype)
    if dt in _FROM_NUMPY:
        return _FROM_NUMPY[dt]
    raise MsInvalidError("msinv: numpy dtype %s has no safetensors name" % dt)


# ---- the inventory ---------------------------------------------------------------

def _default_db():
    return os.environ.get("MSINV_DB") or "msinv.db"


class Inventory:
    """An inventory database, for reading: states, their files, and loads.

    Opened as the tools open it (a missing file is MsNotFoundError; an
    older schema is migrated as any tool would); this class only reads."""

    def __init__(self, path=None):
        self.path = os.fspath(path) if path is not None else _default_db()
        self._h = ctypes.c_void_p()
        err = Err()
        check(lib.ms_inv_open(fs(self.path), 0, ctypes.byref(self._h), ctypes.byref(err)), err)

    def close(self):
        if self._h:
            lib.ms_inv_close(self._h)
            self._h = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        if not self._h:
            raise ValueError("msinv: inventory is closed")
        return self._h

    def resolve(self, ref):
        """The full state digest of a digest, unique prefix or label."""
        out = (ctypes.c_char * STATE_DIGEST_LEN)()
        err = Err()
        check(lib.ms_inv_resolve(self._handle(), ref.encode(), out, ctypes.byref(err)), err)
        return out.value.decode()

    def states(self, kind=None):
        """Every state (of kind: base, quantized, adapter, adapter_shard,
        policy), oldest first, as dicts."""
        p = ctypes.c_void_p()
        err = Err()
        check(lib.ms_py_inv_states_json(self._handle(), kind.encode() if kind else None,
                                        ctypes.byref(p), ctypes.byref(err)), err)
        return json.loads(take_json(p))

    def show(self, ref):
        """One state with its files and configuration files."""
        p = ctypes.c_void_p()
        err = Err()
        check(lib.ms_py_inv_state_json(self._handle(), ref.encode(), ctypes.byref(p),
                                       ctypes.byref(err)), err)
        return json.loads(take_json(p))

    def files(self, ref, copy=None):
        """Paths of a state's safetensors files (every copy, or one)."""
        return [f["path"] for f in self.show(ref)["files"]
                if copy is None or f["copy"] == copy]

    def states_at(self, path):
        """The states with a copy under path (a file or a directory), as
        show() gives them, oldest first: what a path on disk holds."""
        real = os.path.realpath(path)
        out = []
        for st in self.states():
            info = self.show(st["digest"])
            if any(f["path"] == real or f["path"].startswith(real.rstrip("/") + "/")
                   for f in info["files"]):
                out.append(info)
        return out

    def load(self, ref, **kw):
        """load_state(ref, inventory=self, **kw)."""
        return load_state(ref, inventory=self, **kw)


# ---- load sets ---------------------------------------------------------------------

class _Set:
    """A list of tensors with the digests they must have (pyapi.h)."""

    def __init__(self, make, *args):
        self._h = ctypes.c_void_p()
        err = Err()
        check(make(*args, ctypes.byref(self._h), ctypes.byref(err)), err)
        try:
            self.state = lib.ms_py_set_state(self._h).decode()
            self.tensors = []
            for i in range(lib.ms_py_set_count(self._h)):
                name = ctypes.c_char_p()
                dt = ctypes.c_int32()
                nd = ctypes.c_uint32()
                shape = (ctypes.c_uint64 * MAX_RANK)()
                nb = ctypes.c_uint64()
                dig = (ctypes.c_uint8 * SHA256_LEN)()
                lib.ms_py_set_tensor(self._h, i, ctypes.byref(name), ctypes.byref(dt),
                                     ctypes.byref(nd), shape, ctypes.byref(nb), dig)
                self.tensors.append((name.value.decode(), DTYPE_NAMES[dt.value],
                                     tuple(shape[:nd.value]), nb.value, bytes(dig).hex()))
            self.files = [lib.ms_py_set_file(self._h, i).decode()
                          for i in range(lib.ms_py_set_nfiles(self._h))]
        except BaseException:
            self.close()
            raise

    def close(self):
        if self._h:
            lib.ms_py_set_free(self._h)
            self._h = ctypes.c_void_p()

    def __del__(self):
        self.close()

    def load(self, framework="numpy", device="cpu", threads=0):
        if framework not in ("numpy", "torch"):
            raise ValueError("msinv: framework is 'numpy' or 'torch'")
        dev = str(device)
        if dev.startswith("cuda"):
            if dev not in ("cuda", "cuda:0"):
                # the library allocates on device 0 of the process
                raise ValueError("msinv: device loads go to cuda:0 (select the GPU with "
                                 "CUDA_VISIBLE_DEVICES)")
            if framework != "torch":
                raise ValueError("msinv: device loads are handed to torch (framework='torch')")
            return self._load_arena(CUDA, threads)
        if dev != "cpu":
            raise ValueError("msinv: device is 'cpu' or 'cuda'")
        if framework == "torch":
            torch = _torch()
            bufs = [torch.empty(t[3], dtype=torch.uint8) for t in self.tensors]
            ptrs = [b.data_ptr() for b in bufs]
        else:
            bufs = [np.empty(t[3], dtype=np.uint8) for t in self.tensors]
            ptrs = [b.ctypes.data for b in bufs]
        arr = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        err = Err()
        check(lib.ms_py_set_load(self._h, arr, int(threads), ctypes.byref(err)), err)
        view = _torch_view if framework == "torch" else _np_view
        return {t[0]: view(b, t[1], t[2]) for t, b in zip(self.tensors, bufs)}

    def _load_arena(self, device, threads, framework="torch"):
        n = len(self.tensors)
        offsets = (ctypes.c_uint64 * max(1, n))()
        arena = ctypes.c_void_p()
        err = Err()
        check(lib.ms_py_set_load_arena(self._h, device, int(threads), offsets,
                                       ctypes.byref(arena), ctypes.byref(err)), err)
        try:
            kind = _dlpack.KDLCUDA if device == CUDA else _dlpack.KDLCPU
            out = {}
            for i, t in enumerate(self.tensors):
                holder = _dlpack.Holder(_dlpack.capsule(arena, offsets[i], t[3]), (kind, 0))
                if framework == "torch":
                    torch = _torch()
                    out[t[0]] = _torch_view(torch.from_dlpack(holder), t[1], t[2])
                else:
                    out[t[0]] = _np_view(np.from_dlpack(holder), t[1], t[2])
            return out
        finally:
            # every tensor holds its own reference now
            lib.ms_py_arena_release(arena)


def _np_view(buf, dtype, shape):
    dt = NUMPY_DTYPES.get(dtype)
    if dt is None:  # F4 and F6 pack several elements a byte: raw bytes
        return buf
    return buf.view(dt).reshape(shape)


def _torch_view(buf, dtype, shape):
    dt = _torch_dtypes(_torch()).get(dtype)
    if dt is None:
        return buf
    return buf.view(dt).reshape(shape)


# ---- the launch gate's environment -------------------------------------------------

def _role_key(role):
    return re.sub(r"[^A-Z0-9]", "_", role.upper())


class Gate:
    """What `msinv launch` verified before starting this process (gate.h)."""

    def __init__(self, env):
        self.run = int(env["MSINV_RUN"])
        self.db = env.get("MSINV_DB")
        self.plan = env.get("MSINV_PLAN")
        self.plan_digest = env.get("MSINV_PLAN_DIGEST")
        self.ep_size = int(env["MSINV_EP_SIZE"]) if env.get("MSINV_EP_SIZE") else None
        self.states = {k[len("MSINV_STATE_"):]: v for k, v in env.items()
                       if k.startswith("MSINV_STATE_")}
        self.paths = {k[len("MSINV_PATH_"):]: v for k, v in env.items()
                      if k.startswith("MSINV_PATH_")}

    def allows(self, digest):
        return digest in self.states.values()

    def digest(self, role):
        key = _role_key(role)
        if key not in self.states:
            raise MsGateError("msinv: role '%s' is not in the launch plan (roles: %s)"
                              % (role, ", ".join(sorted(self.states)) or "none"), 1)
        return self.states[key]


def gate():
    """The Gate of this process when `msinv launch` started it, else None."""
    if not os.environ.get("MSINV_RUN"):
        return None
    return Gate(os.environ)


def _gate_check(what, *digests):
    g = gate()
    if g is not None and not any(d and g.allows(d) for d in digests):
        raise MsGateError("msinv: %s: state %s was not verified by the launch gate "
                          "(run %d)" % (what, digests[0], g.run), 1)


def _with_set(s, what, framework, device, threads, *also):
    try:
        _gate_check(what, s.state, *also)
        return s.load(framework, device, threads)
    finally:
        s.close()


# ---- loading ------------------------------------------------------------------------

def load_state(ref, inventory=None, framework="numpy", device="cpu", threads=0):
    """The tensors of an inventoried state (digest, prefix or label), read
    from its first copy whose files exist and verified against the record:
    {name: array}. A difference is MsCheckError naming the tensor."""
    inv = inventory if inventory is not None else Inventory()
    try:
        s = _Set(lib.ms_py_set_from_inv, inv._handle(), ref.encode())
    finally:
        if inventory is None:
            inv.close()
    return _with_set(s, ref, framework, device, threads)


def load_role(role, framework="numpy", device="cpu", threads=0):
    """Inside a launched run: the state the gate verified for role."""
    g = gate()
    if g is None:
        raise MsGateError("msinv: not inside a run started by `msinv launch` (no MSINV_RUN)", 1)
    with Inventory(g.db) as inv:
        return load_state(g.digest(role), inventory=inv, framework=framework,
                          device=device, threads=threads)


def load_manifest(path, framework="numpy", device="cpu", threads=0):
    """The state a manifest (`msinv export`) describes, verified against it."""
    s = _Set(lib.ms_py_set_from_manifest, fs(path))
    return _with_set(s, os.fspath(path), framework, device, threads)


def _read_digest_map(digests):
    if isinstance(digests, (str, bytes, os.PathLike)):
        with open(digests, "rb") as f:
            digests = json.load(f)
        digests = digests.get("tensors", digests)
    return dict(digests)


def load_file(path, digests=None, inventory=None, framework="numpy", device="cpu",
              threads=0):
    """One safetensors file, verified: against digests (a {name: hex}
    mapping or the path of a digest map), or else against the inventory
    state that records this file (inventory: an Inventory or a path; by
    default MSINV_DB; a file no state records is MsNotFoundError)."""
    if digests is None:
        return _load_recorded_file(path, inventory, framework, device, threads)
    d = _read_digest_map(digests)
    names = (ctypes.c_char_p * max(1, len(d)))(*[k.encode() for k in d])
    try:
        raw = b"".join(bytes.fromhex(v) for v in d.values())
    except (ValueError, TypeError, AttributeError):
        raise MsInvalidError("msinv: digests must be 64 hex digits", 2)
    if len(raw) != SHA256_LEN * len(d):
        raise MsInvalidError("msinv: digests must be 64 hex digits", 2)
    s = _Set(lib.ms_py_set_from_file, fs(path), len(d), names, raw)
    return _with_set(s, os.fspath(path), framework, device, threads)


def _load_recorded_file(path, inventory, framework, device, threads):
    own = not isinstance(inventory, Inventory)
    inv = inventory if not own else Inventory(inventory)
    try:
        s = _Set(lib.ms_py_set_from_inv_file, inv._handle(), fs(path))
    finally:
        if own:
            inv.close()
    return _with_set(s, os.fspath(path), framework, device, threads)


# ---- EP-aware loading -----------------------------------------------------------------

class EPRank:
    """One EP rank's tensors (per-expert tensors under their global names;
    fused and grouped tensors holding the local experts in local order)."""

    def __init__(self, s, tensors):
        r, n, e, ne = (ctypes.c_uint32() for _ in range(4))
        ids = ctypes.POINTER(ctypes.c_uint32)()
        src = ctypes.c_char_p()
        lib.ms_py_set_ep(s._h, ctypes.byref(r), ctypes.byref(n), ctypes.byref(e),
                         ctypes.byref(ne), ctypes.byref(ids), ctypes.byref(src))
        self.rank, self.ep_size, self.num_experts = r.value, n.value, e.value
        self.experts = [ids[i] for i in range(ne.value)]
        self.source_digest = src.value.decode()
        self.state_digest = s.state
        self.shard_path = s.files[0] if s.files else None
        self.tensors = tensors

    def __repr__(self):
        return "EPRank(rank=%d, ep_size=%d, experts=%s, tensors=%d)" % (
            self.rank, self.ep_size, self.experts, len(self.tensors))


def _is_shard_set(path):
    p = os.fspath(path)
    return p.endswith("ep_manifest.json") or os.path.isfile(os.path.join(p, "ep_manifest.json"))


def load_ep_rank(path, ep_size, rank, placement=None, framework="numpy", device="cpu",
                 threads=0, tmpdir=None):
    """Exactly rank's tensors for a run of ep_size ranks. path is a shard
    set (directory or its ep_manifest.json: a set of another EP size, a
    wrong placement or a duplicated expert block is refused, MsInvalidError
    or MsCheckError), or an unsharded adapter or checkpoint, which is split
    (as `msshard split --placement placement`) into a temporary directory
    under tmpdir first. Returns an EPRank."""
    tmp = None
    try:
        if _is_shard_set(path):
            if placement is not None:
                raise ValueError("msinv: a shard set carries its placement")
            s = _Set(lib.ms_py_set_from_ep, fs(path), int(ep_size), int(rank))
        else:
            tmp = tempfile.mkdtemp(prefix="msinv-ep-", dir=tmpdir)
            s = _Set(lib.ms_py_set_from_unsharded, fs(path), fs(os.path.join(tmp, "set")),
                     int(ep_size), int(rank), fs(placement) if placement else None)
        try:
            info = EPRank(s, None)
            # Under the gate: the shard's own state, or, when this call
            # split the adapter itself, the adapter's (its digest was then
            # computed from the bytes just split). A shard set's manifest
            # names its source too, but ties the fused slices to it only
            # through digests it states itself, so that alone is not enough.
            if tmp:
                _gate_check(os.fspath(path), s.state, info.source_digest)
            else:
                _gate_check(os.fspath(path), s.state)
            info.tensors = s.load(framework, device, threads)
        finally:
            s.close()
        return info
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def load_into_peft(model, tensors, adapter_name="default"):
    """Load an adapter's tensors (a dict, or an EPRank) into a PEFT model,
    fused-expert LoRA parameters included: every tensor must land on a
    parameter of the same shape, and every LoRA parameter of the adapter
    must be given (otherwise MsInvalidError and the model is unchanged)."""
    import torch
    from peft import set_peft_model_state_dict
    from peft.utils import get_peft_model_state_dict

    if isinstance(tensors, EPRank):
        tensors = tensors.tensors
    sd = {k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v)))
          for k, v in tensors.items()}
    want = get_peft_model_state_dict(model, adapter_name=adapter_name)
    missing = sorted(set(want) - set(sd))
    extra = sorted(set(sd) - set(want))
    if missing or extra:
        raise MsInvalidError("msinv: adapter does not fit the model: %s" % (
            "missing %s" % missing[:3] if missing else "unexpected %s" % extra[:3]), 2)
    for k, v in sd.items():
        if tuple(want[k].shape) != tuple(v.shape):
            raise MsInvalidError("msinv: tensor '%s': shape %s, the model's parameter is %s"
                                 % (k, tuple(v.shape), tuple(want[k].shape)), 2)
    result = set_peft_model_state_dict(model, sd, adapter_name=adapter_name)
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise MsInvalidError("msinv: tensors not loaded: %s" % unexpected[:3], 2)
    return model


# ---- digests of tensors in memory -----------------------------------------------------

def _buffer(x):
    """(pointer, nbytes, keep-alive) of an array's or tensor's bytes."""
    if type(x).__module__.startswith("torch"):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        return t.data_ptr(), t.numel() * t.element_size(), t
    a = np.ascontiguousarray(x)
    return a.ctypes.data, a.nbytes, a


def tensor_digests(tensors, threads=0):
    """{name: hex SHA-256 of the tensor's bytes} for a dict of arrays or
    tensors, hashed by the library in parallel (no per-byte Python). A
    CUDA tensor is copied to host memory first."""
    names = list(tensors)
    bufs = [_buffer(tensors[k]) for k in names]
    k = max(1, len(names))
    out = (ctypes.c_uint8 * (SHA256_LEN * k))()
    ptrs = (ctypes.c_void_p * k)(*[p for p, _, _ in bufs])
    lens = (ctypes.c_uint64 * k)(*[n for _, n, _ in bufs])
    err = Err()
    check(lib.ms_py_sha256_many(len(names), ptrs, lens, out, int(threads),
                                ctypes.byref(err)), err)
    raw = bytes(out)
    return {k: raw[SHA256_LEN * i:SHA256_LEN * (i + 1)].hex() for i, k in enumerate(names)}


def tensor_digest(x):
    """The hex SHA-256 of one array's or tensor's bytes."""
    return tensor_digests({"t": x}, threads=1)["t"]


def state_digest(tensors, dtypes=None, shapes=None, threads=0):
    """The state digest ("sha256:...") of a dict of arrays or tensors, the
    one `msinv inspect --digests` and the inventory give the same tensors.
    dtypes / shapes ({name: "BF16"} / {name: shape}) override what the
    arrays say: a raw uint16 view of BF16 (numpy without ml_dtypes), or the
    packed bytes of F4/F6."""
    dtypes = dtypes or {}
    shapes = shapes or {}
    digests = tensor_digests(tensors, threads)
    names = list(tensors)
    n = len(names)
    c_names = (ctypes.c_char_p * max(1, n))(*[k.encode() for k in names])
    c_dt = (ctypes.c_int32 * max(1, n))()
    c_nd = (ctypes.c_uint32 * max(1, n))()
    c_sh = (ctypes.c_uint64 * (MAX_RANK * max(1, n)))()
    for i, k in enumerate(names):
        dt = dtypes.get(k) or _dtype_of(tensors[k])
        if dt not in DTYPES:
            raise MsInvalidError("msinv: tensor '%s': unknown dtype '%s'" % (k, dt), 2)
        shape = tuple(shapes.get(k, tensors[k].shape))
        if len(shape) > MAX_RANK:
            raise MsInvalidError("msinv: tensor '%s': rank over %d" % (k, MAX_RANK), 2)
        c_dt[i], c_nd[i] = DTYPES[dt], len(shape)
        for j, d in enumerate(shape):
            c_sh[MAX_RANK * i + j] = int(d)
    raw = b"".join(bytes.fromhex(digests[k]) for k in names)
    out = (ctypes.c_char * STATE_DIGEST_LEN)()
    err = Err()
    check(lib.ms_py_state_digest(n, c_names, c_dt, c_nd, c_sh, raw, out, ctypes.byref(err)),
          err)
    return out.value.decode()


def write_digest_map(tensors, path, threads=0):
    """Write {"tensors": {name: hex}} (from a dict of arrays/tensors, or of
    hex digests) to path, the tensor map `msverify policy` reads to tell
    which inventoried states a serving engine holds. The file name must end
    in .json and not contain "index" (msverify would read it as a
    checkpoint index). Written to a temporary file and renamed."""
    p = os.fspath(path)
    if not p.endswith(".json") or "index" in os.path.basename(p):
        raise ValueError("msinv: a digest map's name ends in .json and has no 'index'")
    if all(isinstance(v, str) for v in tensors.values()):
        digests = dict(tensors)
    else:
        digests = tensor_digests(tensors, threads)
    tmp = "%s.tmp-%d" % (p, os.getpid())
    with open(tmp, "w") as f:
        json.dump({"tensors": dict(sorted(digests.items()))}, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return digests


def gpu_available():
    """1 when the library has CUDA and a device answers."""
    return bool(lib.ms_gpu_available())


def arenas_live():
    """Arenas (device or host loads handed over by DLPack) not yet freed."""
    return lib.ms_py_arenas_live()


def load_state_dlpack_host(ref, inventory=None, threads=0):
    """load_state into one host arena handed to numpy by DLPack (the same
    path as CUDA loads, on the CPU): mostly for tests of the ownership."""
    inv = inventory if inventory is not None else Inventory()
    try:
        s = _Set(lib.ms_py_set_from_inv, inv._handle(), ref.encode())
    finally:
        if inventory is None:
            inv.close()
    try:
        _gate_check(ref, s.state)
        return s._load_arena(HOST, threads, framework="numpy")
    finally:
        s.close()
