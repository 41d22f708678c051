"""The ctypes binding of libms.so: finding the library, the signatures of
the functions the package calls, and the error mapping.

The library is found, in order, at the path in MSINV_LIBMS, beside this
file (a libms.so* copied into the package), or through the system loader
(libms.so.0 installed by `make install`). Its ABI number (ms_py_abi) and
the size of struct ms_err must be the ones this file mirrors, so a
mismatched library is refused at import rather than misread later.
"""
import ctypes
import ctypes.util
import glob
import os

from .errors import MsError, error_for

ABI = 1
SHA256_LEN = 32
MAX_RANK = 8
STATE_DIGEST_LEN = 7 + 64 + 1
HOST, CUDA = 0, 1


class Err(ctypes.Structure):
    """struct ms_err (ms.h)."""
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 1024)]


def _candidates():
    env = os.environ.get("MSINV_LIBMS")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "libms.so*")))
    system = ctypes.util.find_library("ms")
    return found + ([system] if system else []) + ["libms.so.0"]


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
            if os.environ.get("MSINV_LIBMS"):
                break
    raise ImportError("msinv: libms.so not found (set MSINV_LIBMS to its path, "
                      "or `make install`): " + "; ".join(errors))


lib = _load()

P = ctypes.c_void_p
C = ctypes.c_char_p
I = ctypes.c_int
U32 = ctypes.c_uint32
U64 = ctypes.c_uint64
SZ = ctypes.c_size_t
ERR = ctypes.POINTER(Err)


def _sig(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


_sig("ms_py_abi", I)
_sig("ms_py_version", C)
_sig("ms_py_err_size", SZ)
if lib.ms_py_abi() != ABI or lib.ms_py_err_size() != ctypes.sizeof(Err):
    raise ImportError("msinv: libms.so at %s has ABI %d, this package needs %d"
                      % (lib._name, lib.ms_py_abi(), ABI))

_sig("ms_exit_code", I, I)
_sig("ms_free", None, P)
_sig("ms_dtype_name", C, I)
_sig("ms_inv_open", I, C, ctypes.c_uint, ctypes.POINTER(P), ERR)
_sig("ms_inv_close", None, P)
_sig("ms_inv_resolve", I, P, C, ctypes.c_char * STATE_DIGEST_LEN, ERR)
_sig("ms_py_inv_states_json", I, P, C, ctypes.POINTER(P), ERR)
_sig("ms_py_inv_state_json", I, P, C, ctypes.POINTER(P), ERR)
_sig("ms_py_set_from_inv", I, P, C, ctypes.POINTER(P), ERR)
_sig("ms_py_set_from_manifest", I, C, ctypes.POINTER(P), ERR)
_sig("ms_py_set_from_inv_file", I, P, C, ctypes.POINTER(P), ERR)
_sig("ms_py_set_from_file", I, C, SZ, ctypes.POINTER(C), P, ctypes.POINTER(P), ERR)
_sig("ms_py_set_from_ep", I, C, U32, U32, ctypes.POINTER(P), ERR)
_sig("ms_py_set_from_unsharded", I, C, C, U32, U32, C, ctypes.POINTER(P), ERR)
_sig("ms_py_set_free", None, P)
_sig("ms_py_set_count", SZ, P)
_sig("ms_py_set_tensor", I, P, SZ, ctypes.POINTER(C), ctypes.POINTER(ctypes.c_int32),
     ctypes.POINTER(U32), ctypes.POINTER(U64), ctypes.POINTER(U64), P)
_sig("ms_py_set_state", C, P)
_sig("ms_py_set_nfiles", SZ, P)
_sig("ms_py_set_file", C, P, SZ)
_sig("ms_py_set_ep", I, P, ctypes.POINTER(U32), ctypes.POINTER(U32), ctypes.POINTER(U32),
     ctypes.POINTER(U32), ctypes.POINTER(ctypes.POINTER(U32)), ctypes.POINTER(C))
_sig("ms_py_set_load", I, P, ctypes.POINTER(P), I, ERR)
_sig("ms_py_set_load_arena", I, P, I, I, ctypes.POINTER(U64), ctypes.POINTER(P), ERR)
_sig("ms_py_arena_base", P, P)
_sig("ms_py_arena_release", None, P)
_sig("ms_py_arenas_live", U64)
_sig("ms_py_dlpack_new", P, P, U64, U32, ctypes.POINTER(ctypes.c_int64), ctypes.c_uint8,
     ctypes.c_uint8, ctypes.c_int32)
_sig("ms_py_dlpack_delete", None, P)
_sig("ms_py_state_digest", I, SZ, ctypes.POINTER(C), ctypes.POINTER(ctypes.c_int32),
     ctypes.POINTER(U32), ctypes.POINTER(U64), P, ctypes.c_char * STATE_DIGEST_LEN, ERR)
_sig("ms_py_sha256_many", I, SZ, ctypes.POINTER(ctypes.c_void_p),
     ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, I, ERR)
_sig("ms_gpu_available", I)


def check(rc, err):
    """Raise the exception of a failed call (rc != 0) with its message."""
    if rc != 0:
        msg = err.msg.decode("utf-8", "replace") or "libms error %d" % rc
        raise error_for(rc, msg, lib.ms_exit_code(rc))


def take_json(p):
    """A JSON text the library allocated: decoded, then freed."""
    try:
        return ctypes.string_at(p).decode("utf-8")
    finally:
        lib.ms_free(p)


def fs(path):
    """A path argument as the C library wants it."""
    return os.fsencode(os.fspath(path))


DTYPES = {}  # "BF16" -> enum value
for _i in range(64):
    _n = lib.ms_dtype_name(_i)
    if _n is None:
        break
    DTYPES[_n.decode()] = _i
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

__all__ = ["lib", "check", "Err", "MsError"]
