"""Large byte buffers kept for reuse: memory the mount has already touched.

Every large open (a snapshot streamed in for readers, a writer's buffer)
needs memory the size of the file. Fresh memory costs more than the copy
into it: the kernel faults each page in and zeroes it, and with transparent
huge pages it may first compact memory to find them (a 256 MiB buffer took
0.1-0.6 s to fill here on a fresh mount, against 26 ms once warm). The pool
keeps the arrays it handed out and hands one out again once nothing uses it.

Nothing is given back by hand: an array is free when the pool's own
references are the only ones left (every slice, view and memoryview of it,
in any thread, holds a reference to it), so a buffer still being read,
pushed or served is never handed out twice. Free arrays beyond the budget,
and those unused for ``IDLE`` seconds, are let go.

With a shared region (``irdma.SharedRegion``), writers' arrays are taken
from it: the same-host daemons map it, so a writer's buffer is pushed
without a copy into staging (one copy of every byte less per write). An array a
failed push may still be read from (``SharedRegion.in_doubt``) is never
handed out again.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from irdma import SharedMemoryFull, SharedRegion

MIN_SIZE = 4 << 20  # smaller buffers come from the allocator: cheap and quickly reused
BUDGET = 1 << 30  # bytes of free arrays kept at most
IDLE = 30.0  # seconds a free array is kept unused
# The mount's shared region: address space only (pages are taken as buffers
# are filled, and given back when they are let go); larger files than fit
# take ordinary memory, pushed through staging.
SHARED_SIZE = 16 << 30

# References to an array the pool holds while it checks it: its list entry,
# the loop's variable and getrefcount's own argument.
_POOL_REFS = 3


@dataclass
class BufferPool:
    """Reusable uint8 arrays; ``take`` gives a view of one of at least the size asked."""

    budget: int = BUDGET
    min_size: int = MIN_SIZE
    idle: float = IDLE
    shared: SharedRegion | None = None
    _arrays: list[np.ndarray] = field(default_factory=list)
    _used: dict[int, float] = field(default_factory=dict)  # id(array) -> last handed out

    def take(self, size: int, shared: bool = False) -> np.ndarray:
        """``size`` bytes of uninitialised memory (a view of a pooled array); with
        ``shared``, from the shared region if there is one and it has room (a
        writer's buffer, pushed from there without a copy). Readers' buffers
        are ordinary memory: the region's pages are not huge pages, and
        copies out of them to the kernel ran slower."""
        if size < self.min_size:
            return np.empty(size, dtype=np.uint8)
        shared = shared and self.shared is not None
        now = time.monotonic()
        self.trim(now)
        best: np.ndarray | None = None
        for a in self._arrays:
            # An array twice the size would hold memory the caller never uses.
            fits = size <= len(a) <= 2 * size and (best is None or len(a) < len(best))
            if fits and sys.getrefcount(a) == _POOL_REFS and self.holds_shared(a) == shared:
                best = a
        if best is not None and shared and self.shared is not None and self.shared.in_doubt(best):
            self._drop(best)  # a daemon may still read it: never reused
            best = None
        if best is None:
            best = self._new(size, shared)
            self._arrays.append(best)
        self._used[id(best)] = now
        return best[:size]

    def trim(self, now: float | None = None) -> None:
        """Let go of free arrays unused for ``idle`` seconds, and of the least
        recently used free ones while free arrays exceed the budget."""
        now = time.monotonic() if now is None else now
        free = [a for a in self._arrays if sys.getrefcount(a) == _POOL_REFS]
        free.sort(key=lambda a: self._used[id(a)])
        total = sum(len(a) for a in free)
        for a in free:
            if now - self._used[id(a)] < self.idle and total <= self.budget:
                break
            total -= len(a)
            self._drop(a)

    def holds_shared(self, array: np.ndarray) -> bool:
        """Whether ``array`` lies in the shared region."""
        return self.shared is not None and self.shared.offset_of(array) is not None

    def _new(self, size: int, shared: bool) -> np.ndarray:
        if shared and self.shared is not None:
            try:
                return self.shared.empty(size)
            except SharedMemoryFull:
                pass  # ordinary memory: pushed through staging
        return np.empty(size, dtype=np.uint8)

    def _drop(self, array: np.ndarray) -> None:
        self._arrays = [a for a in self._arrays if a is not array]
        del self._used[id(array)]

    @property
    def held(self) -> int:
        """Bytes of the arrays the pool keeps (free or in use)."""
        return sum(len(a) for a in self._arrays)
