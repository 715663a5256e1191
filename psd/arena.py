"""The daemon's memory arena: one shared-memory file, carved into page-aligned blocks.

The arena is a memfd mapped once at start. Every shard lives inside it, so
the whole arena can be registered for RDMA once, mapped by same-host clients,
and sent with ``sendfile`` without copying through user space. Past the
``capacity`` bytes of blocks, the memfd holds the shard directory
(``psd/directory.py``), so a client that maps the arena can also find where
each shard is and check that it is reading one version of it; after the
directory, the tokens of bytes lent to same-host backups (``psd/loans.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from dataclasses import dataclass

import numpy as np

from irdma.extents import PAGE, Allocator, ArenaFullError, round_up
from irdma.protocol.directory import directory_bytes, slots_for

from .directory import Directory
from .loans import LOAN_BYTES, Loans

__all__ = ["PAGE", "Allocator", "Arena", "ArenaFullError", "Block", "round_up"]


@dataclass(eq=False, slots=True)
class Block:
    """A page-aligned extent of the arena.

    ``pins`` counts readers that may still be copying out of it (a send in
    progress, or a zero-copy send the client has not released yet); a
    ``retired`` block is returned to the allocator once nothing pins it.
    """

    offset: int
    size: int
    pins: int = 0
    retired: bool = False


class Arena:
    """A memfd of ``capacity`` bytes of blocks and the shard directory after them,
    reserved up front and mapped read-write (``size`` bytes in all)."""

    def __init__(self, capacity: int, name: str = "irdma-arena") -> None:
        capacity = round_up(capacity)
        slots = slots_for(capacity, PAGE)
        loans_at = capacity + round_up(directory_bytes(slots))
        size = loans_at + round_up(LOAN_BYTES)
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            # Reserve the memory now, so a host without it fails at start
            # rather than on some later write.
            os.posix_fallocate(self.fd, 0, size)
            # Never cut shorter under a mapping (a same-host backup maps it too).
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.capacity = capacity
        self.size = size
        self.buf = np.frombuffer(self._map, dtype=np.uint8)
        self.allocator = Allocator(capacity)
        self.directory = Directory(self.buf, capacity, slots)
        self.loans = Loans(self.buf, loans_at)
        self._base = self.buf.ctypes.data
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)  # how a same-host backup knows it

    def offset_of(self, array: np.ndarray) -> int | None:
        """Where ``array``'s bytes start in the arena, if it is a contiguous view of it."""
        if not array.flags.c_contiguous:
            return None
        offset = array.ctypes.data - self._base
        return offset if offset >= 0 and offset + array.nbytes <= self.capacity else None

    @property
    def used(self) -> int:
        return self.allocator.used

    def alloc(self, nbytes: int) -> Block:
        """A block of at least ``nbytes``; raises ArenaFullError. Zero bytes take no memory."""
        if nbytes == 0:
            return Block(0, 0)
        size = round_up(nbytes)
        return Block(self.allocator.alloc(size), size)

    def free(self, block: Block) -> None:
        if block.size:
            self.allocator.free(block.offset, block.size)

    def view(self, block: Block, start: int = 0, length: int | None = None) -> np.ndarray:
        """The block's bytes (a uint8 view into the arena, no copy)."""
        end = block.size if length is None else start + length
        if not 0 <= start <= end <= block.size:
            raise ValueError(f"range [{start}, {end}) outside block of {block.size}")
        return self.buf[block.offset + start : block.offset + end]

    def close(self) -> None:
        self.buf = None  # type: ignore[assignment]
        self.directory.table = None  # type: ignore[assignment]
        # A view still alive keeps the mapping; it goes with the process then.
        with contextlib.suppress(BufferError):
            self._map.close()
        os.close(self.fd)
