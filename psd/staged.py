"""What the server asks of a connection with one-sided memory (shm or rdma).

Such a connection has staging memory the client writes and the daemon reads
STAGED updates from, and the daemon answers reads of at least ``mapped_min``
bytes MAPPED (where the bytes are) instead of sending them.
"""

from __future__ import annotations

import numpy as np

from irdma.protocol import Status

from .errors import StoreError


class StagedMemory:
    """A client's staging memory as the daemon sees it: ``view``."""

    transport = "tcp"
    mapped_min = 0

    def __init__(self, view: np.ndarray) -> None:
        self.view = view

    def read_staged(self, offset: int, size: int, into: np.ndarray) -> None:
        """Copy ``size`` staged bytes at ``offset`` into ``into``; OUT_OF_RANGE past the end."""
        if offset + size > len(self.view):
            raise StoreError(
                Status.OUT_OF_RANGE,
                f"staged data [{offset}, {offset + size}) is outside the "
                f"{len(self.view)}-byte staging area",
            )
        np.copyto(into[:size], self.view[offset : offset + size])

    def close(self) -> None:
        """Let go of the memory (when the connection ends)."""
