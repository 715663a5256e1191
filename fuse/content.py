"""What file a target shows of a tensor: its size, its header and extent, the
memory its bytes are read into, and what identifies its content.

Writers (``files``) and readers' shared snapshots (``snapshot``) both build
files from a tensor this way.
"""

from __future__ import annotations

import numpy as np

from irdma import TensorInfo

from .buffers import BufferPool
from .npyfile import header_for
from .paths import RAW_OPTION, Kind, Target


def take(pool: BufferPool | None, size: int, shared: bool = False) -> np.ndarray:
    """``size`` bytes of uninitialised memory, from ``pool`` if there is one (from its
    shared memory with ``shared``: memory that will be pushed)."""
    return pool.take(size, shared) if pool is not None else np.empty(size, dtype=np.uint8)


def identity(info: TensorInfo) -> tuple:
    """What identifies a file's content: versions restart when a tensor is
    redefined, so the creation time and layout go with the version."""
    return (info.version, info.ctime, info.dtype, info.shape)


def is_raw(info: TensorInfo) -> bool:
    return bool(info.options.get(RAW_OPTION))


def file_size(target: Target, info: TensorInfo) -> int:
    """Size of the file a target shows for a tensor."""
    if target.kind == Kind.ACCUMULATE:
        return 0
    header, _, length = extent(target, info)
    return len(header) + length


def extent(target: Target, info: TensorInfo) -> tuple[bytes, int, int]:
    """(file header, first tensor byte, number of tensor bytes) the file shows."""
    if target.kind == Kind.SHARD:
        start = target.index * info.shard_size
        return b"", start, max(0, min(info.shard_size, info.nbytes - start))
    header = header_for(info.dtype, info.shape) if target.typed else b""
    return header, 0, info.nbytes


def file_buffer(
    target: Target, info: TensorInfo, pool: BufferPool | None = None, shared: bool = False
) -> tuple[np.ndarray, np.ndarray, int]:
    """Memory for a file's bytes with its header filled in: (whole file, the
    tensor bytes part of it, first tensor byte)."""
    header, start, length = extent(target, info)
    data = take(pool, len(header) + length, shared)
    data[: len(header)] = np.frombuffer(header, dtype=np.uint8)
    return data, data[len(header) :], start
