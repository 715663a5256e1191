"""Memory for open files' bytes, handed out again once nothing uses it.

A new array's pages are touched for the first time as a file's bytes land
in them, and a first touch costs more than a copy here: the kernel zeroes
and maps each 4 KiB page, about 1.8 GB/s on these machines against more
than 10 GB/s for a copy, so a 256 MiB file spent ~140 ms faulting in the
buffer it was streamed into or written to. The pool keeps the arrays it
handed out, up to ``KEEP`` bytes in all, and hands one out again once
nothing refers to it any more (the file closed, its pushes and streamed
reads done, no reply being sent from it). CPython's reference count says
so, and it counts every slice, view and memoryview made from the array,
so an array is never handed out while anything could still read or write
it.
"""

from __future__ import annotations

import sys

import numpy as np

# Bytes of arrays the pool keeps for reuse (free or in use), and the smallest
# array it keeps: small files are cheap to fault in and would crowd it.
KEEP = 512 << 20
MIN_KEPT = 1 << 20


class BufferPool:
    """Byte arrays for files, reused once free. One per mount, used from its FUSE thread."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._kept: list[np.ndarray] = []  # least recently handed out first
        self.reused = 0  # arrays handed out again (their pages already touched)

    def take(self, size: int) -> np.ndarray:
        """A uint8 array of ``size`` bytes, its content undefined (as ``np.empty``)."""
        if size < MIN_KEPT:
            return np.empty(size, dtype=np.uint8)
        best = -1
        for i in range(len(self._kept)):  # (a loop variable would hold a reference)
            n = len(self._kept[i])
            # Not wasting more than half of it, and the smallest such.
            fits = size <= n <= 2 * size and (best < 0 or n < len(self._kept[best]))
            if fits and self._free(i):
                best = i
        if best >= 0:
            array = self._kept.pop(best)
            self._kept.append(array)
            self.reused += 1
            return array[:size]
        array = np.empty(size, dtype=np.uint8)
        self._keep(array)
        return array

    def _free(self, i: int) -> bool:
        # The list's reference and getrefcount's argument: nothing else holds it.
        return sys.getrefcount(self._kept[i]) == 2

    def _keep(self, array: np.ndarray) -> None:
        if len(array) > self.keep:
            return
        self._kept.append(array)
        total = sum(len(a) for a in self._kept)
        i = 0
        while total > self.keep and i < len(self._kept) - 1:
            if self._free(i):
                total -= len(self._kept.pop(i))
            else:
                i += 1
        if total > self.keep:  # the rest are in use: this one is not kept
            self._kept.pop()

    @property
    def kept_bytes(self) -> int:
        return sum(len(a) for a in self._kept)
