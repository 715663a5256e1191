"""First-fit allocation of page-aligned (or otherwise aligned) extents of a range.

Used for the daemon's arena and for a shm client's staging memory.
"""

from __future__ import annotations

import bisect

PAGE = 4096


class ArenaFullError(Exception):
    """No free extent is large enough for the request."""


def round_up(n: int, to: int = PAGE) -> int:
    return -(-n // to) * to


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
