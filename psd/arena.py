"""The daemon's memory arena: one shared-memory file, carved into page-aligned blocks.

The arena is a memfd mapped once at start. Every shard lives inside it, so
the whole arena can be registered for RDMA once, mapped by same-host clients,
and sent with ``sendfile`` without copying through user space.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
from dataclasses import dataclass

import numpy as np

PAGE = 4096


class ArenaFullError(Exception):
    """No free extent is large enough for the request."""


def round_up(n: int, to: int = PAGE) -> int:
    return -(-n // to) * to


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


class Allocator:
    """First-fit allocator over ``[0, capacity)`` with page-aligned extents.

    Free extents are kept sorted by offset and merged with their neighbours on
    free, so freed space is reused and does not fragment into pieces.
    """

    def __init__(self, capacity: int, align: int = PAGE) -> None:
        if capacity <= 0 or capacity % align:
            raise ValueError(f"capacity {capacity} must be a positive multiple of {align}")
        self.capacity = capacity
        self.align = align
        self._starts: list[int] = [0]
        self._sizes: list[int] = [capacity]
        self.used = 0

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    @property
    def largest_free(self) -> int:
        return max(self._sizes, default=0)

    def alloc(self, nbytes: int) -> int:
        """Reserve ``nbytes`` (rounded up to the alignment); return its offset."""
        need = round_up(max(nbytes, 1), self.align)
        for i, size in enumerate(self._sizes):
            if size >= need:
                start = self._starts[i]
                if size == need:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] = start + need
                    self._sizes[i] = size - need
                self.used += need
                return start
        raise ArenaFullError(
            f"no free extent of {need} bytes (free {self.free_bytes} of {self.capacity}, "
            f"largest extent {self.largest_free})"
        )

    def free(self, offset: int, nbytes: int) -> None:
        """Return an extent given out by ``alloc`` (same offset and size)."""
        size = round_up(max(nbytes, 1), self.align)
        i = bisect.bisect_left(self._starts, offset)
        prev_end = self._starts[i - 1] + self._sizes[i - 1] if i > 0 else 0
        if offset < prev_end or (i < len(self._starts) and offset + size > self._starts[i]):
            raise ValueError(f"double or overlapping free of [{offset}, {offset + size})")
        self.used -= size
        if i > 0 and prev_end == offset:  # merge with the extent before
            i -= 1
            self._sizes[i] += size
        else:
            self._starts.insert(i, offset)
            self._sizes.insert(i, size)
        nxt = i + 1
        if nxt < len(self._starts) and self._starts[i] + self._sizes[i] == self._starts[nxt]:
            self._sizes[i] += self._sizes[nxt]
            del self._starts[nxt], self._sizes[nxt]


class Arena:
    """A memfd of ``capacity`` bytes, reserved up front and mapped read-write."""

    def __init__(self, capacity: int, name: str = "irdma-arena") -> None:
        capacity = round_up(capacity)
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, capacity)
            # Reserve the memory now, so a host without it fails at start
            # rather than on some later write.
            os.posix_fallocate(self.fd, 0, capacity)
            self._map = mmap.mmap(self.fd, capacity)
        except BaseException:
            os.close(self.fd)
            raise
        self.capacity = capacity
        self.buf = np.frombuffer(self._map, dtype=np.uint8)
        self.allocator = Allocator(capacity)

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
        # A view still alive keeps the mapping; it goes with the process then.
        with contextlib.suppress(BufferError):
            self._map.close()
        os.close(self.fd)
