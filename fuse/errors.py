"""What a filesystem call answers when it fails: an errno, decided in one place.

The roles raise ``FsError`` where the FUSE spec names the answer (EISDIR,
ENOTDIR, ENOTEMPTY, ...) and let irdma's errors through; ``errno_for`` is the
one mapping from those to errno. Neither depends on the FUSE session that
carries the answer to the kernel (the facade, ``ops.fuse_errors``, does).
"""

from __future__ import annotations

import errno

from irdma.errors import (
    ArenaFull,
    BadRequest,
    DtypeMismatch,
    OutOfRange,
    ShapeMismatch,
    TensorExists,
    TensorNotFound,
    WorkerEvicted,
    WorkerLost,
)

from .npyfile import BadNpy

# "No such attribute": Linux has no ENOATTR; libfuse and pyfuse3 answer ENODATA.
ENOATTR = getattr(errno, "ENOATTR", errno.ENODATA)


class FsError(Exception):
    """A filesystem call's failure as the errno it answers (no logging: it is the
    call's ordinary answer, as ENOENT for a name that is not there)."""

    def __init__(self, code: int) -> None:
        super().__init__(code, errno.errorcode.get(code, str(code)))
        self.errno = code


def errno_for(exc: BaseException) -> int:
    """The errno a filesystem call reports for an irdma error."""
    if isinstance(exc, FsError):
        return exc.errno
    if isinstance(exc, TensorNotFound):
        return errno.ENOENT
    if isinstance(exc, TensorExists):
        return errno.EEXIST
    if isinstance(exc, ArenaFull):
        return errno.ENOSPC
    if isinstance(exc, WorkerLost):  # a pull waited for a worker that fell silent
        return errno.ETIMEDOUT
    if isinstance(exc, WorkerEvicted):
        return errno.EPERM
    if isinstance(
        exc, BadNpy | DtypeMismatch | ShapeMismatch | BadRequest | OutOfRange | ValueError
    ):
        return errno.EINVAL
    return errno.EIO
