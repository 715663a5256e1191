"""Pushing a sequential writer's data while it writes, whole shards at a time.

A writer of a .npy file whose header is known (checked as it arrived, or the
stored tensor's for an in-place rewrite) has the tensor's layout long before
it closes: each run of complete shards behind the write position is pushed
in the background, a few at once, so ``close()`` only waits for the last
ones instead of pushing the whole file after the last write.

What the background pushes cannot know is left to the close: a write that
lands behind what was already sent (``broken``), or a header that changed,
makes the close push the whole file as before. A file shorter than its
header says is the start of the tensor, the rest zeros (as a sparse file
reads): the close pushes the zeros.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import trio

from irdma import AsyncClient

from .mover import Mover
from .npyfile import NpyLayout

log = logging.getLogger("irdma.fuse")

CHUNK = 4 << 20  # bytes per background push (rounded to whole shards)
IN_FLIGHT = 16  # background pushes at once (64 MiB); a writer ahead of them waits
MIN_SIZE = 2 * CHUNK  # smaller files: the close pushes them whole


@dataclass(eq=False)
class Outflow:
    """The background pushes of one writer."""

    name: str
    layout: NpyLayout  # the tensor the file's bytes become
    header: int  # file offset of the tensor's first byte
    chunk: int
    define: bool  # create (or redefine) the tensor before the first push
    new: bool = False  # the file is written from scratch (else: in place, changed ranges)
    options: dict = field(default_factory=dict)
    sent: int = 0  # tensor bytes pushed or being pushed, from byte 0
    broken: bool = False  # a write landed in what was sent: the close pushes all
    error: Exception | None = None
    _inflight: int = 0
    _idle: trio.Event = field(default_factory=trio.Event)
    _limit: trio.Semaphore = field(default_factory=lambda: trio.Semaphore(IN_FLIGHT))
    # One create at a time: writes answered side by side wait for the first one's.
    _defining: trio.Lock = field(default_factory=trio.Lock)

    @classmethod
    def plan(
        cls,
        name: str,
        layout: NpyLayout,
        shard_size: int,
        *,
        define: bool,
        options: dict | None = None,
    ) -> Outflow | None:
        """An outflow for a file of this layout, or None if it is too small to need one."""
        if layout.nbytes < MIN_SIZE:
            return None
        chunk = max(shard_size, CHUNK // shard_size * shard_size)
        return cls(name, layout, layout.header_len, chunk, define, define, dict(options or {}))

    def wrote(self, off: int, end: int) -> None:
        """Note a write of file bytes ``[off, end)``."""
        if off < self.header + self.sent:
            self.broken = True

    async def advance(
        self,
        nursery: trio.Nursery,
        client: AsyncClient,
        data: np.ndarray,
        written_to: int,
        mover: Mover | None = None,
    ) -> None:
        """Start pushing each complete chunk below file offset ``written_to`` (by
        ``mover`` in its own thread if given, else by ``client``).

        ``data`` is the writer's buffer; a chunk's bytes are final once the
        writer is past them (a later write there sets ``broken``). Waits while
        IN_FLIGHT pushes are under way, so a writer does not outrun the daemons.
        """
        if self.broken or self.error is not None:
            return
        ready = min(written_to - self.header, self.layout.nbytes)
        while ready - self.sent >= self.chunk:
            if self.define:
                await self._define(client)
                if self.broken:
                    return  # refused, here or in another write: the close pushes all
            await self._limit.acquire()
            lo = self.sent
            self.sent += self.chunk
            view = data[self.header + lo : self.header + self.sent]
            self._inflight += 1
            self._idle = trio.Event() if self._idle.is_set() else self._idle
            nursery.start_soon(self._push, mover or client, lo, view)

    async def _define(self, client: AsyncClient) -> None:
        # A tensor of the same layout is kept as it is (its bytes are
        # overwritten); another layout is replaced.
        async with self._defining:
            if not self.define or self.broken:
                return  # defined by another write meanwhile, or refused
            try:
                await client.create(
                    self.name,
                    self.layout.shape,
                    self.layout.dtype.newbyteorder("<"),
                    replace=True,
                    exist_ok=True,
                    options=self.options,
                )
            except BaseException:
                # Refused (no room, ...): the name still holds the old tensor, so
                # no chunk may be pushed under it. The close pushes the whole file
                # (and reports why that fails too).
                self.broken = True
                raise
            self.define = False

    async def _push(self, client: AsyncClient | Mover, lo: int, view: np.ndarray) -> None:
        try:
            await client.write_bytes(self.name, lo, view)
        except Exception as exc:  # reported by the close (flush), like any push error
            if self.error is None:
                self.error = exc
        finally:
            self._limit.release()
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def drain(self) -> None:
        """Wait for the pushes under way; raise the first error any of them had."""
        if self._inflight:
            await self._idle.wait()
        if self.error is not None:
            error, self.error = self.error, None
            self.broken = True  # what was sent is unknown: the close pushes all
            raise error

    async def finish(
        self,
        client: AsyncClient,
        data: memoryview,
        layout: NpyLayout,
        dirty: list[tuple[int, int]],
    ) -> bool:
        """Push what the background pushes did not: the rest of a new file, or the
        changed ranges (file offsets ``dirty``) past them of one rewritten in place.
        False if the close must push the whole file instead (a write behind them,
        or another layout)."""
        await self.drain()
        if self.broken or layout != self.layout:
            return False
        if self.define:
            await self._define(client)
        body = data[self.header :]
        end = min(len(body), layout.nbytes)
        if not self.new:
            for lo, hi in merged(dirty):
                lo, hi = max(lo - self.header, self.sent), min(hi - self.header, end)
                if hi > lo:
                    await client.write_bytes(self.name, lo, body[lo:hi])
            return True
        if end > self.sent:
            await client.write_bytes(self.name, self.sent, body[self.sent : end])
        if end < layout.nbytes:  # shorter than the header says: the rest is zeros
            lo = max(end, self.sent)
            await client.write_bytes(self.name, lo, bytes(layout.nbytes - lo))
        return True


def merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Byte ranges sorted, overlapping and touching ones joined."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
