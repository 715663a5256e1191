"""What the mount's roles reach the daemons with, set once the trio loop runs.

The client, the nursery readers' snapshots stream in, the mover that copies
their bytes in its own thread, and the pool of memory for large files. The
roles hold this record, not the FUSE session: they run under whichever
session hands them requests.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

import trio

from irdma import AsyncClient, TensorInfo

from .buffers import BufferPool
from .errors import FsError
from .mover import Mover
from .paths import Target
from .snapshot import Snapshot


@dataclass(eq=False)
class Backend:
    """The mount's links to the daemons; ``client`` is set once the trio loop runs."""

    buffers: BufferPool = field(default_factory=BufferPool)
    client: AsyncClient | None = None
    # Where snapshots stream in (set with the client, once the trio loop runs).
    nursery: trio.Nursery | None = None
    # Moves streamed reads' and background pushes' bytes in its own thread.
    mover: Mover | None = None

    @property
    def c(self) -> AsyncClient:
        """The client; EIO before the mount has one (or after it closed)."""
        if self.client is None:
            raise FsError(errno.EIO)
        return self.client

    @property
    def n(self) -> trio.Nursery:
        if self.nursery is None:
            raise FsError(errno.EIO)
        return self.nursery

    def stream_in(self, snap: Snapshot, target: Target, info: TensorInfo) -> None:
        """Begin streaming ``snap`` in from the daemons (by the mover, into pooled memory)."""
        snap.start(self.n, self.c, target, info, self.mover, self.buffers)
