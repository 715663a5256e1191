"""A reader's snapshot of a file, served while it streams in.

The tensor is read in chunks of whole shards, several in flight at once, in
file order; a read() waits only for the chunks it covers, so the kernel gets
the first bytes of a large file after one chunk's round trip instead of after
the whole load, and pulling the next chunks overlaps with answering it.

Consistency: the snapshot is of the version the open saw (its stat); this
mount's own writes to the tensor wait until snapshots being filled are
complete (``OpenFiles.quiesce``), so they never mix into one. A
whole-tensor write from elsewhere while a file streams in does not mix in
either: the first chunk is read alone, and every later chunk is read from
the same write (``AsyncClient.read_range``), which a lease keeps on the
daemons however often the tensor is rewritten meanwhile
(``AsyncClient.lease``: taken before the first chunk, holding every copy,
narrowed to the first chunk's write, renewed while the file streams in,
released at its end; tests/test_fuse_fileops.py). Only a write that needs
the arena room a held copy takes (or a replica that came back empty of older
copies) makes the open's reads fail (EIO, TornRead), never mix. Accumulates
and partial writes from elsewhere are per shard, as for any reader; a
version that moved is logged when the stream is complete (close-to-open
promises the next open the new version, which it gets).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import trio

from irdma import AsyncClient, ClientClosed, ReadLease, TensorInfo

from .buffers import BufferPool
from .content import file_buffer, identity
from .mover import Mover
from .paths import Target

log = logging.getLogger("irdma.fuse")

CHUNK = 4 << 20  # bytes per request to the daemons (rounded to whole shards)
IN_FLIGHT = 16  # chunks requested at once: ~64 MiB ahead of the reader


@dataclass(eq=False)
class Snapshot:
    """Immutable content of one version of a file, shared by the readers of that version."""

    identity: tuple
    data: np.ndarray | None = None  # the whole file, filled chunk by chunk
    refs: int = 0
    target_name: str = ""
    _header: int = 0
    _chunk: int = CHUNK
    _ready: list[trio.Event] = field(default_factory=list)
    _error: Exception | None = None
    _filled: trio.Event = field(default_factory=trio.Event)

    @classmethod
    def of(cls, data: np.ndarray, info: TensorInfo, refs: int = 0) -> Snapshot:
        """A snapshot whose content is already here (a training pull)."""
        snap = cls(identity(info), data, refs, info.name)
        snap._filled.set()
        return snap

    @property
    def started(self) -> bool:
        return self.data is not None

    @property
    def whole(self) -> bool:
        """Filled without an error: it can serve any read of its version."""
        return self._filled.is_set() and self._error is None and self.data is not None

    @property
    def nbytes(self) -> int:
        return 0 if self.data is None else self.data.nbytes

    def start(
        self,
        nursery: trio.Nursery,
        client: AsyncClient,
        target: Target,
        info: TensorInfo,
        mover: Mover | None = None,
        pool: BufferPool | None = None,
    ) -> None:
        """Begin filling from the daemons in the background (once); the chunks are
        read by ``mover`` (in its own thread) if given, else by ``client``. The
        memory comes from ``pool`` if given."""
        if self.data is not None:
            return
        self.target_name = target.name
        data, body, start = file_buffer(target, info, pool)
        self.data = data
        self._header = len(data) - len(body)
        shard = max(1, info.shard_size)
        self._chunk = max(shard, CHUNK // shard * shard)
        n = -(-len(body) // self._chunk)
        self._ready = [trio.Event() for _ in range(n)]
        nursery.start_soon(self._fill, client, mover or client, target, info, body, start)

    async def _fill(
        self,
        client: AsyncClient,
        mover: AsyncClient | Mover,
        target: Target,
        info: TensorInfo,
        body: np.ndarray,
        start: int,
    ) -> None:
        limit = trio.Semaphore(IN_FLIGHT)
        # The whole-tensor write the first chunk came from: every later chunk
        # is read from that write too, even if the tensor is rewritten meanwhile.
        stamp = 0

        async def one(i: int) -> None:
            nonlocal stamp
            try:
                lo = i * self._chunk
                part = body[lo : lo + self._chunk]
                got = await mover.read_range(target.name, start + lo, part, stamp)
                stamp = stamp or got
            except Exception as exc:  # the readers waiting for it get the error
                if self._error is None:
                    self._error = exc
            except BaseException:
                self._stopped()  # before its readers wake to a chunk not filled
                raise
            finally:
                limit.release()
                self._ready[i].set()

        async def chunks(lease: ReadLease | None) -> None:
            """Every chunk, the first alone; nothing raised but cancellation."""
            if self._ready:
                await limit.acquire()
                await one(0)  # alone: the others follow its write
            if lease is not None and stamp:
                await lease.keep(stamp)  # that write, no other, from now on
            async with trio.open_nursery() as nursery:
                for i in range(1, len(self._ready)):
                    await limit.acquire()
                    if self._error is not None:
                        for event in self._ready[i:]:
                            event.set()
                        break
                    nursery.start_soon(one, i)

        try:
            # A lease on the tensor while it streams in: the daemons keep the
            # write the chunks come from, however often it is rewritten meanwhile.
            async with trio.open_nursery() as renewing:
                lease = None
                if len(self._ready) > 1:
                    try:
                        lease = await client.lease(target.name, renewing)
                    except Exception as exc:  # the chunks' reads say what it costs
                        log.warning("%s streamed without a lease: %s", target.name, exc)
                try:
                    await chunks(lease)
                finally:
                    if lease is not None:
                        await lease.release()
            if self._error is None:
                after = await client.stat(target.name)
                if identity(after) != identity(info):
                    log.warning(
                        "%s changed while it was being read: an open of it may have "
                        "seen parts of two versions",
                        target.name,
                    )
        except Exception as exc:
            if self._error is None:
                self._error = exc
        except BaseException:
            self._stopped()
            raise
        finally:
            for event in self._ready:
                event.set()
            self._filled.set()

    def _stopped(self) -> None:
        """The fill was cancelled (the mount is ending): its readers get an error of
        their own, never the fill task's Cancelled, and never a chunk left unfilled."""
        if self._error is None:
            self._error = ClientClosed("the mount stopped before the file was read whole")

    async def wait(self, off: int, size: int) -> None:
        """Wait until file bytes ``[off, off+size)`` are here; raise the fill's error."""
        assert self.data is not None
        if self._filled.is_set():  # complete (or given whole: a pull)
            if self._error is not None:
                raise self._error
            return
        lo = max(0, off - self._header) // self._chunk
        hi = -(-max(0, min(off + size, len(self.data)) - self._header) // self._chunk)
        for i in range(lo, hi):
            await self._ready[i].wait()
        if self._error is not None:
            raise self._error

    async def wait_filled(self) -> None:
        """Wait until the fill is over (done or failed); at once if it never started."""
        if self.data is not None:
            await self._filled.wait()
