"""fuse/errors.py: the one mapping from errors to errno (pure)."""

from __future__ import annotations

import errno

import pytest
from irdma_fuse.errors import ENOATTR, FsError, errno_for
from irdma_fuse.npyfile import BadNpy

from irdma.errors import (
    ArenaFull,
    DaemonUnavailable,
    TensorExists,
    TensorNotFound,
    WorkerEvicted,
    WorkerLost,
)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (FsError(errno.ENOTEMPTY), errno.ENOTEMPTY),
        (TensorNotFound("m/w"), errno.ENOENT),
        (TensorExists("m/w"), errno.EEXIST),
        (ArenaFull("full"), errno.ENOSPC),
        (WorkerLost("gone"), errno.ETIMEDOUT),
        (WorkerEvicted("out"), errno.EPERM),
        (BadNpy("header"), errno.EINVAL),
        (ValueError("bad name"), errno.EINVAL),
        (DaemonUnavailable("n1", "127.0.0.1:1", "refused"), errno.EIO),
        (RuntimeError("ours"), errno.EIO),
    ],
)
def test_each_error_answers_its_errno(exc: BaseException, code: int) -> None:
    assert errno_for(exc) == code


def test_fs_error_names_its_errno() -> None:
    exc = FsError(errno.EISDIR)
    assert exc.errno == errno.EISDIR and "EISDIR" in str(exc)
    assert ENOATTR == errno.ENODATA  # what libfuse answers on Linux
