"""A connection's staging memory, shared by its concurrent requests (shm and rdma).

Each request takes room first-fit, copies its payload in, and gives the room
back after its answer. A request that finds no room waits until another
gives some back. On a broken connection nothing is handed out and nothing is
given back for reuse: the daemon may still apply a frame it has buffered
from those bytes, or the NIC still be moving them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import trio

from ..extents import Allocator, ArenaFullError
from .base import Buffer, StreamBroken

if TYPE_CHECKING:
    from .tcp import Exchanger


class StagingArea:
    """Room in ``view`` (staging memory of ``what``), handed out to requests."""

    def __init__(self, view: np.ndarray, align: int, what: str) -> None:
        self.view = view
        self.allocator = Allocator(len(view), align)
        self.what = what
        self._given_back = trio.Event()

    @property
    def used(self) -> int:
        """Bytes held by requests (or kept from reuse after a failure)."""
        return self.allocator.used

    async def take(self, nbytes: int, conn: Exchanger) -> int:
        """Room for ``nbytes``; waits while other requests of ``conn`` hold it."""
        capacity = self.allocator.capacity
        if nbytes > capacity:
            raise StreamBroken(f"{nbytes} bytes do not fit the {capacity}-byte {self.what}")
        while True:
            if conn.broken:
                raise StreamBroken(f"connection to {conn.stream.peer} failed")
            try:
                return self.allocator.alloc(nbytes)
            except ArenaFullError:
                await self._given_back.wait()

    def fill(self, offset: int, payload: Sequence[Buffer]) -> None:
        """Copy ``payload``'s buffers one after another into the room at ``offset``."""
        pos = offset
        for buf in payload:
            src = np.frombuffer(buf, dtype=np.uint8)
            np.copyto(self.view[pos : pos + len(src)], src)
            pos += len(src)

    def give(self, offset: int, nbytes: int, conn: Exchanger) -> None:
        """Return the room (unless ``conn`` broke) and wake every waiter to try again."""
        if not conn.broken:
            self.allocator.free(offset, nbytes)
        self._given_back.set()
        self._given_back = trio.Event()
