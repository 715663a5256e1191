"""What the server asks of a connection with one-sided memory (shm or rdma).

Such a connection has staging memory the client writes and the daemon reads
STAGED updates from, and the daemon answers reads of at least ``mapped_min``
bytes MAPPED (where the bytes are) instead of sending them.
"""

from __future__ import annotations

import numpy as np

from irdma.protocol import Status

from .errors import Refusal


class StagedMemory:
    """A client's staging memory as the daemon sees it: ``view``, and after it (in
    STAGED offsets) the client's shared region ``shared`` if it has one."""

    transport = "tcp"
    mapped_min = 0

    def __init__(self, view: np.ndarray, shared: np.ndarray | None = None) -> None:
        self.view = view
        self.shared = shared

    def read_staged(self, offset: int, size: int, into: np.ndarray) -> None:
        """Copy ``size`` staged bytes at ``offset`` into ``into``; OUT_OF_RANGE as ``staged``."""
        np.copyto(into[:size], self.staged(offset, size))

    def staged(self, offset: int, size: int) -> np.ndarray:
        """The ``size`` staged bytes at ``offset``, where they lie (read-only); OUT_OF_RANGE
        past the end of the staging area, or of the shared region for offsets past
        the staging area."""
        memory, at, what = self.view, offset, "staging area"
        if offset >= len(self.view) and self.shared is not None:
            memory, at, what = self.shared, offset - len(self.view), "shared region"
        if at + size > len(memory):
            raise Refusal(
                Status.OUT_OF_RANGE,
                f"staged data [{offset}, {offset + size}) is outside the {len(memory)}-byte {what}",
            )
        return memory[at : at + size]

    def close(self) -> None:
        """Let go of the memory (when the connection ends)."""
