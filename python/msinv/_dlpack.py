"""Zero-copy hand-over of an arena (one allocation holding every tensor of
a load) as DLPack capsules.

The DLManagedTensor and its deleter are C (pyapi.c): the deleter drops the
tensor's reference on the arena, and the arena is freed (cudaFree or free)
when the last reference goes, exactly once, on whatever thread the
consumer frees its tensor. This file only wraps the pointer in a PyCapsule
named "dltensor", whose destructor calls the deleter if no consumer ever
took the capsule (a consumer renames it "used_dltensor" and owns it).
"""
import ctypes

from ._lib import lib

_NAME = b"dltensor"
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

_DESTRUCTOR_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _destroy(capsule):
    # only an unconsumed capsule still owns its tensor
    if _api.PyCapsule_IsValid(capsule, _NAME):
        lib.ms_py_dlpack_delete(_api.PyCapsule_GetPointer(capsule, _NAME))


_destructor = _DESTRUCTOR_T(_destroy)  # kept alive as long as the module
_DESTRUCTOR_P = ctypes.cast(_destructor, ctypes.c_void_p)

KDLCPU, KDLCUDA = 1, 2


def capsule(arena, offset, nbytes, device_id=0):
    """A capsule of a 1-D uint8 tensor of nbytes at offset in arena. It
    holds a reference on the arena."""
    shape = (ctypes.c_int64 * 1)(nbytes)
    managed = lib.ms_py_dlpack_new(arena, offset, 1, shape, 1, 8, device_id)
    if not managed:
        raise MemoryError("msinv: out of memory")
    try:
        return _api.PyCapsule_New(managed, _NAME, _DESTRUCTOR_P)
    except BaseException:
        lib.ms_py_dlpack_delete(managed)
        raise


class Holder:
    """The DLPack protocol around one capsule (what numpy.from_dlpack and
    torch.from_dlpack take)."""

    def __init__(self, cap, device):
        self._cap = cap
        self._device = device

    def __dlpack__(self, stream=None, **kwargs):
        cap, self._cap = self._cap, None
        if cap is None:
            raise BufferError("msinv: the capsule was already consumed")
        return cap

    def __dlpack_device__(self):
        return self._device
