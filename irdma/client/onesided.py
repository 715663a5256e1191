"""The one-sided reader: reads copied straight out of a daemon's arena, no message to it.

Over shared memory the arena is mapped here and a read copies from it after
checking the shard's directory slot (``transport.direct.DirectReader``); over
RDMA the connection READs the slot, the bytes and the slot again. Whether a
read may be one-sided is decided here once per read (``allowed``); whether a
connection can do it is its bulk path's answer (``BulkPath.read_direct``,
None where it cannot), so nothing is probed per read. A read one-sided copy
could not serve (None) is asked of the daemon the usual way, which also says
what went wrong.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

import numpy as np

from ..cluster import Node
from ..errors import DtypeMismatch, ShapeMismatch
from ..protocol import NO_WORKER, TensorMeta
from ..training.modes import Mode
from ..transport.base import StreamBroken, StreamClosed, StreamTimeout
from ..transport.direct import Copier
from .agreement import Served
from .arrays import check_out
from .ranges import Piece, shard_pieces
from .routing import Router, several_copies
from .session import Conn, Session

# ``IRDMA_ONE_SIDED=0``: every read asks the daemon.
ENV = "IRDMA_ONE_SIDED"


class OneSidedReader:
    """One client's one-sided reads (see the module docstring)."""

    def __init__(self, session: Session, router: Router) -> None:
        self.session = session
        self.router = router
        self.enabled = os.environ.get(ENV, "1") != "0"
        # Copies of a large read's shards on two threads.
        self.copier = Copier()

    def close(self) -> None:
        self.copier.close()

    def allowed(self, meta: TensorMeta, wid: int) -> bool:
        """Whether reads of this tensor may copy straight out of a daemon's arena.

        Not for a training pull that may have to wait for its step. With
        replicas, the daemon's own gates (caught up, in the majority) are in
        its directory's serving word, and read-your-writes is the version check.
        """
        if not self.enabled:
            return False
        if wid == NO_WORKER:
            return True
        # A training pull goes to the primary (only it keeps the step's state).
        return (
            not several_copies(self.session.config)
            and Mode.from_options(meta.options).kind == "async"
        )

    async def read(
        self, meta: TensorMeta, p: Piece, view: memoryview, choice: list[Node] | None = None
    ) -> Served | None:
        """Copy the piece out of its daemon's arena (mapped over shm, or by RDMA READ),
        where the connection's bulk path can. With replicas, from the replica the
        read would ask first (``choice``), no older than this client saw."""
        found = await self._connection(meta, p, choice)
        if found is None:
            return None
        conn, seen = found
        out = np.frombuffer(view, dtype=np.uint8)
        args = (meta.key, meta.layout, p.shard, p.shard_offset, out, seen)
        try:
            got = await conn.bulk.read_direct(conn, *args)  # type: ignore[arg-type]
        except (StreamBroken, StreamClosed, StreamTimeout):
            return None  # the connection is given up; asked the usual way, it says why
        return None if got is None else self._served(meta, p.shard, got)

    async def read_whole(self, meta: TensorMeta, buf: memoryview, wid: int) -> bool:
        """Read a whole tensor one-sided, shard by shard (per shard, as a batch is);
        False when any shard must be asked for (the caller then asks for all)."""
        if not self.allowed(meta, wid):
            return False
        for p in shard_pieces(meta, 0, meta.nbytes):
            view = buf[p.buf_offset : p.buf_offset + p.length]
            if await self.read(meta, p, view) is None:
                return False
        return True

    async def copy(
        self,
        meta: TensorMeta,
        pieces: list[Piece],
        buf: memoryview,
        choice: dict[int, list[Node]],
    ) -> dict[int, Served]:
        """Copy the pieces that are in same-host arenas on two threads (``Copier``);
        return what each copied piece is, by shard."""
        jobs: list[tuple[int, Callable[[], tuple[int, int, int] | None]]] = []
        for p in pieces:
            found = await self._connection(meta, p, choice.get(p.shard))
            if found is None:
                continue
            conn, seen = found
            reader = conn.bulk.directory
            if reader is None:
                continue
            out = np.frombuffer(buf[p.buf_offset : p.buf_offset + p.length], dtype=np.uint8)
            args = (meta.key, meta.layout, p.shard, p.shard_offset, out, seen)
            jobs.append((p.shard, partial(reader.read, *args)))
        results = self.copier.run([call for _, call in jobs])
        copied = {}
        for (shard, _), got in zip(jobs, results, strict=True):
            if got is not None:
                copied[shard] = self._served(meta, shard, got)
        return copied

    def read_now(self, meta: TensorMeta, out: np.ndarray | None) -> np.ndarray | None:
        """``AsyncClient.read_now``: a one-shard tensor copied into ``out`` (or a new
        array) without awaiting anything, from a daemon this thread is already
        attached to over shared memory; None when that does not hold or the
        daemon must be asked (the usual read then says what went wrong)."""
        if meta.num_shards != 1 or not self.allowed(meta, NO_WORKER):
            return None
        if out is None:
            out = np.empty(meta.shape, dtype=meta.np_dtype)
        else:
            try:
                check_out(meta, out)
            except (DtypeMismatch, ShapeMismatch, ValueError):
                return None  # the usual read raises it
        node, seen = self._node(meta, 0)
        conn = self.session.conns.get(node.name)
        if conn is None:
            return None
        reader = conn.bulk.directory
        if reader is None or conn.broken or not conn.daemon_alive():
            return None
        got = reader.read(meta.key, meta.layout, 0, 0, out.reshape(-1).view(np.uint8), seen)
        if got is None:
            return None
        self._served(meta, 0, got)
        return out

    async def _connection(
        self, meta: TensorMeta, p: Piece, choice: list[Node] | None
    ) -> tuple[Conn, int] | None:
        """The connection a one-sided read of ``p`` goes over, and the least version the
        shard may have there; None when that daemon cannot be reached or trusted now
        (asked the usual way, the read says what went wrong)."""
        node, seen = self._node(meta, p.shard, choice)
        try:
            conn = await self.session.connection(node)
        except (StreamBroken, StreamClosed, StreamTimeout):
            return None
        return (conn, seen) if conn.daemon_alive() else None

    def _node(
        self, meta: TensorMeta, shard: int, choice: list[Node] | None = None
    ) -> tuple[Node, int]:
        """The daemon a one-sided read of ``shard`` copies from, and the least version
        the shard may have there: with replicas, the replica the read would ask
        first (``choice``), no older than this client saw."""
        if several_copies(self.session.config):
            node = (choice or self.router.candidates(meta.key, shard, False))[0]
            return node, self.router.seen(meta.key, shard)
        return self.session.config.primary_for(meta.key, shard), 0

    def _served(self, meta: TensorMeta, shard: int, got: tuple[int, int, int]) -> Served:
        """A one-sided read's answer; with replicas, its version is what this client saw."""
        if several_copies(self.session.config):
            self.router.saw(meta.key, shard, got[0], update=False)
        return Served(*got)
