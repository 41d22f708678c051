"""Exceptions mirroring the library's return codes (ms.h). Each carries
the library's one-line message and its code; exit_code is the status the
command-line tools would exit with (0 ok, 1 check failed, 2 bad input,
3 I/O or environment)."""


class MsError(Exception):
    """Any failure reported by libms."""
    code = 0

    def __init__(self, message, code=None, exit_code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.exit_code = exit_code if exit_code is not None else _EXIT.get(self.code, 3)


class MsCheckError(MsError):
    """MS_ECHECK: a check ran and found a difference (a digest mismatch)."""
    code = 1


class MsInvalidError(MsError, ValueError):
    """MS_EINVAL: bad input (a malformed file, a wrong EP size)."""
    code = 2


class MsIOError(MsError, OSError):
    """MS_EIO: an I/O or environment failure."""
    code = 3


class MsNoMemoryError(MsError, MemoryError):
    """MS_ENOMEM: an allocation failed."""
    code = 4


class MsNotFoundError(MsError, LookupError):
    """MS_ENOTFOUND: the named object does not exist."""
    code = 5


class MsExistsError(MsError):
    """MS_EEXIST: the output exists."""
    code = 6


class MsDatabaseError(MsError):
    """MS_EDB: the inventory database failed or is not an inventory."""
    code = 7


class MsNoDeviceError(MsError):
    """MS_ENODEV: no GPU where one was demanded."""
    code = 8


class MsGateError(MsCheckError):
    """Inside a run started by `msinv launch`: a load of something the gate
    did not verify (raised by this package, code MS_ECHECK)."""


_EXIT = {0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 2, 6: 2, 7: 3, 8: 3}
_BY_CODE = {c.code: c for c in (MsCheckError, MsInvalidError, MsIOError, MsNoMemoryError,
                                MsNotFoundError, MsExistsError, MsDatabaseError,
                                MsNoDeviceError)}


def error_for(code, message, exit_code=None):
    cls = _BY_CODE.get(code, MsError)
    return cls(message, code, exit_code)
