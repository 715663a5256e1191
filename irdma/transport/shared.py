"""Client memory that same-host daemons read directly: writes from it skip staging.

A shm write normally copies its bytes into the connection's staging memory,
and the daemon copies them from there into its arena: two copies. A client
made with shared memory (``AsyncClient(..., shared_memory=...)``) owns one
more memfd, a ``SharedRegion``. Every same-host daemon maps it read-only at
ATTACH, after the staging memory, so an offset past the staging area names
a place in it. Arrays handed out here (``AsyncClient.shared_empty``) live in
that memfd; a write whose bytes lie in it is sent STAGED at that offset
without a copy, and the daemon copies them straight into its arena: one
copy, as a write from memory registered with NIXL or UCX.

The rules are those of any such buffer (MPI's ``Isend``, a NIXL transfer):
- Until the write returns, its bytes are the write's: changing them changes
  what is stored.
- A write that fails with its connection (a timeout, a daemon gone) may
  still be applied by that daemon later, from whatever the memory holds by
  then. Its room is then "in doubt": once its array is dropped, the room is
  never handed out again (this process's other data never lands in a tensor
  that way), and ``in_doubt`` tells a pool not to reuse the array.

Rooms go back when nothing refers to their array any more (every view
keeps it), and their pages go back to the system then.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

from ..extents import PAGE, Allocator, ArenaFullError, round_up
from .unix import map_shared


def sealed_memfd(name: str, size: int) -> int:
    """A memfd of ``size`` bytes that can never shrink.

    A daemon maps it; a file cut shorter under a mapping makes the reader
    fault (SIGBUS), so daemons take only memory sealed against that.
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


class SharedMemoryFull(MemoryError):
    """The region has no free room of the size asked for."""


class _Room:
    """One allocation: the array's base, so every view keeps it (and the room) alive."""

    __slots__ = ("__array_interface__", "__weakref__", "nbytes", "offset")

    def __init__(self, region: SharedRegion, offset: int, nbytes: int) -> None:
        self.offset = offset
        self.nbytes = nbytes
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (region.address + offset, False),
            "version": 3,
        }


class SharedRegion:
    """A memfd of ``size`` bytes mapped writable here, cut into rooms for arrays.

    Thread-safe: rooms are taken and given back from any thread (the mount
    takes them in its FUSE loop and its mover pushes them in another).
    """

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"shared memory size must be positive, not {size}")
        self.size = round_up(size, PAGE)
        self.fd = sealed_memfd("irdma-shared", self.size)
        self._map, self.view = map_shared(self.fd, self.size, writable=True)
        self.address: int = self.view.__array_interface__["data"][0]
        self._allocator = Allocator(self.size, PAGE)
        # Re-entrant: a room's finalizer may run during a collection that
        # happens while this thread holds the lock.
        self._lock = threading.RLock()
        self._rooms: dict[int, int] = {}  # offset -> size, rooms handed out
        self._starts: list[int] = []  # their offsets, sorted
        self._doubt: set[int] = set()  # offsets of rooms a failed write may still read
        weakref.finalize(self, os.close, self.fd)

    @property
    def used(self) -> int:
        """Bytes of rooms handed out (or kept back as in doubt)."""
        return self._allocator.used

    def empty(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of uninitialised uint8 memory in the region; SharedMemoryFull if
        no room is free for it."""
        with self._lock:
            try:
                offset = self._allocator.alloc(nbytes)
            except ArenaFullError as exc:
                raise SharedMemoryFull(f"shared memory: {exc}") from None
            size = round_up(max(nbytes, 1), PAGE)
            self._rooms[offset] = size
            bisect.insort(self._starts, offset)
        room = _Room(self, offset, nbytes)
        weakref.finalize(room, self._give_back, offset)
        return np.asarray(room)

    def offset_of(self, buf: Any) -> int | None:
        """Where ``buf`` (any contiguous buffer) starts in the region, if all of it is
        inside; None otherwise."""
        try:
            a = np.frombuffer(buf, dtype=np.uint8)
        except (TypeError, ValueError):  # not contiguous, or not a buffer
            return None
        offset = a.__array_interface__["data"][0] - self.address
        if offset >= 0 and offset + len(a) <= self.size:
            return offset
        return None

    def doubt(self, offset: int) -> None:
        """A write of bytes at ``offset`` failed with its connection: keep its room
        from ever being handed out again."""
        with self._lock:
            start = self._room_at(offset)
            if start is not None:
                self._doubt.add(start)

    def in_doubt(self, array: np.ndarray) -> bool:
        """Whether a failed write may still read ``array``'s room (do not reuse it)."""
        offset = self.offset_of(array)
        if offset is None:
            return False
        with self._lock:
            return self._room_at(offset) in self._doubt

    def _room_at(self, offset: int) -> int | None:
        """The start of the room handed out that holds ``offset``, if any (lock held)."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        start = self._starts[i]
        return start if offset < start + self._rooms[start] else None

    def _give_back(self, offset: int) -> None:
        with self._lock:
            if offset in self._doubt:
                return  # kept: a daemon may still read it
            size = self._rooms.pop(offset)
            del self._starts[bisect.bisect_left(self._starts, offset)]
            self._allocator.free(offset, size)
            # Its pages go back to the system; a later room starts from zeros.
            with contextlib.suppress(OSError, ValueError):
                self._map.madvise(mmap.MADV_REMOVE, offset, size)
