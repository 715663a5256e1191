"""Replies to the kernel, encoded: a dataclass (or a few numbers) in, bytes out.

Each function returns the reply's body; ``message`` puts the header in front
(``[header, body...]``, for one ``writev``: a READ's bytes are never copied
into a reply buffer).
"""

from __future__ import annotations

import math
import stat
from collections.abc import Sequence
from typing import Any

from ..attributes import Attributes
from ..filesystem import Statfs
from . import abi

Buffer = Any  # bytes, or a memoryview of a file's bytes (the buffer protocol)


def message(unique: int, body: Sequence[Buffer] = (), error: int = 0) -> list[Buffer]:
    """A whole reply: the header, then ``body`` (nothing with an ``error``: the errno,
    positive, as errno.ENOENT)."""
    parts = [] if error else list(body)
    length = abi.OUT_HEADER.size + sum(memoryview(p).nbytes for p in parts)
    return [abi.OUT_HEADER.pack(length, -error, unique), *parts]


def _split(seconds: float) -> tuple[int, int]:
    """Seconds as the kernel's (seconds, nanoseconds) pair."""
    frac, whole = math.modf(max(0.0, seconds))
    return int(whole), int(frac * 1e9)


def attr(a: Attributes) -> bytes:
    """``fuse_attr``: sizes, times (access, modification, change), mode, owner."""
    asec, ansec = divmod(a.atime_ns, 10**9)
    msec, mnsec = divmod(a.mtime_ns, 10**9)
    csec, cnsec = divmod(a.ctime_ns, 10**9)
    return abi.ATTR.pack(
        a.st_ino,
        a.st_size,
        a.st_blocks,
        asec,
        msec,
        csec,
        ansec,
        mnsec,
        cnsec,
        a.st_mode,
        a.st_nlink,
        a.st_uid,
        a.st_gid,
        0,  # rdev
        a.st_blksize,
        0,  # flags
    )


def entry(a: Attributes) -> bytes:
    """``fuse_entry_out``: a lookup's answer (node id = inode number)."""
    entry_s, entry_ns = _split(a.entry_timeout)
    attr_s, attr_ns = _split(a.attr_timeout)
    head = abi.ENTRY_OUT_HEAD.pack(a.st_ino, a.generation, entry_s, attr_s, entry_ns, attr_ns)
    return head + attr(a)


def attr_out(a: Attributes) -> bytes:
    """``fuse_attr_out``: a getattr's or setattr's answer."""
    attr_s, attr_ns = _split(a.attr_timeout)
    return abi.ATTR_OUT_HEAD.pack(attr_s, attr_ns, 0) + attr(a)


def open_out(fh: int, flags: int = 0, backing_id: int = 0) -> bytes:
    """``fuse_open_out`` (``flags``: abi.OpenFlag; ``backing_id`` with PASSTHROUGH)."""
    return abi.OPEN_OUT.pack(fh, flags, backing_id)


def write_out(size: int) -> bytes:
    return abi.WRITE_OUT.pack(size, 0)


def statfs_out(s: Statfs) -> bytes:
    return abi.KSTATFS.pack(
        s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namemax, s.frsize, 0
    )


def xattr_size(size: int) -> bytes:
    """``fuse_getxattr_out``: the size a getxattr/listxattr with size 0 asks for."""
    return abi.GETXATTR_OUT.pack(size, 0)


def _pad(n: int) -> int:
    return -n % 8


def dirents(
    entries: Sequence[tuple[str | bytes, Attributes]], start: int, size: int, plus: bool
) -> bytes:
    """``fuse_dirent``s (``fuse_direntplus``es with ``plus``) of ``entries[start:]``,
    as many whole ones as fit in ``size`` bytes; entry i's offset is i + 1."""
    out = bytearray()
    for i in range(start, len(entries)):
        name, a = entries[i]
        raw = name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")
        record = abi.DIRENT_HEAD.pack(a.st_ino, i + 1, len(raw), stat.S_IFMT(a.st_mode) >> 12)
        record += raw + bytes(_pad(len(raw)))
        if plus:
            record = entry(a) + record
        if len(out) + len(record) > size:
            break
        out += record
    return bytes(out)


def xattr_names(names: Sequence[bytes]) -> bytes:
    """A listxattr's answer: each name NUL-terminated."""
    return b"".join(n + b"\0" for n in names)
