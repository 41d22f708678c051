"""msinv: verified and EP-aware loading of inventoried model weight states,
over libms.so (ctypes; numpy required, torch optional).

    import msinv
    with msinv.Inventory("msinv.db") as inv:
        base = inv.load("qwen3moe-base", framework="torch")
    shard = msinv.load_ep_rank("adapter-ep4/", ep_size=4, rank=2, framework="torch")

Every load hashes the bytes it hands over in the same pass and raises
MsCheckError (naming the tensor) before anything is returned if one
differs from the record. Inside a run started by `msinv launch`, loads of
states the gate did not verify raise MsGateError.
"""
from ._core import (EPRank, Gate, Inventory, NUMPY_DTYPES, arenas_live, gate,
                    gpu_available, load_ep_rank, load_file, load_into_peft,
                    load_manifest, load_role, load_state, load_state_dlpack_host,
                    state_digest, tensor_digest, tensor_digests, write_digest_map)
from ._lib import lib as _lib
from .errors import (MsCheckError, MsDatabaseError, MsError, MsExistsError,
                     MsGateError, MsInvalidError, MsIOError, MsNoDeviceError,
                     MsNoMemoryError, MsNotFoundError)

__version__ = _lib.ms_py_version().decode()

__all__ = ["EPRank", "Gate", "Inventory", "NUMPY_DTYPES", "arenas_live", "gate",
           "gpu_available", "load_ep_rank", "load_file", "load_into_peft",
           "load_manifest", "load_role", "load_state", "load_state_dlpack_host",
           "state_digest", "tensor_digest", "tensor_digests", "write_digest_map",
           "MsCheckError", "MsDatabaseError", "MsError", "MsExistsError",
           "MsGateError", "MsInvalidError", "MsIOError", "MsNoDeviceError",
           "MsNoMemoryError", "MsNotFoundError"]
