"""Many tensors in one frame per daemon: the batched forms of read, write and accumulate.

Each tensor is cut into pieces and its replicas chosen by the planner
(``planner.slices``, ``planner.Spread``), as a single call's are. A batch
is cut into frames of at most ``BATCH_BYTES`` of payload and
``BATCH_ENTRIES`` entries, one stream of frames per daemon, run
concurrently. An entry a replica refuses with a failover status (or whose
daemon vanished) is retried on its own through the router, so replicas and
read-your-writes behave as for single requests.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from functools import partial

import numpy as np

from .. import narrowing
from ..cluster import Node
from ..errors import FAILOVER_STATUSES, DaemonError, DaemonUnavailable, error_for_status
from ..protocol import (
    ENTRY_SIZE,
    BatchEntry,
    Op,
    Status,
    TensorMeta,
    dtype_from_code,
    pack_entries,
    unpack_entries,
)
from ..protocol.messages import Read, ReadBatch, Update, UpdateBatch, batch_entry_txn
from .arrays import byte_view, narrowed_delta
from .cache import MetaCache
from .onesided import OneSidedReader
from .planner import Spread, batch_wire, slices, update_txn
from .routing import Router, asks_primary, worker_field
from .session import Session
from .sinks import BatchReadSink, IntoSink

# Payload budget of one batch frame (the daemon accepts at least 64 MiB).
BATCH_BYTES = 32 << 20
BATCH_ENTRIES = 4096


class Batches:
    """Runs batch ops for one client: frames go through ``session``, entries
    refused by a replica fail over through ``router``, and a tensor's cached
    metadata is dropped from ``cache`` when a daemon says it changed."""

    def __init__(
        self, router: Router, session: Session, cache: MetaCache, reader: OneSidedReader
    ) -> None:
        self.router = router
        self.session = session
        self.cache = cache
        self.reader = reader

    async def read_arrays(
        self, metas: dict[str, TensorMeta], code: int, worker: int | None, step: int
    ) -> dict[str, np.ndarray]:
        """``AsyncClient.read_many`` of the tensors ``metas`` describes, their values
        on the wire in dtype ``code`` (0: as stored)."""
        out = {n: np.empty(m.shape, dtype=m.np_dtype) for n, m in metas.items()}
        if not code:
            items = [(metas[n], byte_view(a)) for n, a in out.items()]
            wid = worker_field(worker, step)
            # Same-host tensors are copied one-sided; the batches carry the rest.
            items = [it for it in items if not await self.reader.read_whole(*it, wid)]
            if items:
                await self.run(Op.READ_BATCH, items, worker=worker, step=step)
            return out
        batch_wire(metas.values(), code)
        held = {n: np.empty(a.size, narrowing.holder(code)) for n, a in out.items()}
        items = [(metas[n], byte_view(h)) for n, h in held.items()]
        await self.run(Op.READ_BATCH, items, worker=worker, step=step, wire=code)
        for n, h in held.items():
            narrowing.widen_into(h, code, out[n].reshape(-1))
        return out

    async def accumulate_arrays(
        self,
        metas: dict[str, TensorMeta],
        arrs: dict[str, np.ndarray],
        alpha: float,
        code: int,
        worker: int | None,
        step: int,
    ) -> None:
        """``AsyncClient.accumulate_many``: one wire dtype for the whole call."""
        batch_wire(metas.values(), code)
        data = {n: narrowed_delta(metas[n], a, code) for n, a in arrs.items()}
        items = [(metas[n], byte_view(a)) for n, a in data.items()]
        await self.run(Op.ACCUMULATE_BATCH, items, alpha, worker, step, wire=code)

    async def run(
        self,
        op: Op,
        items: list[tuple[TensorMeta, memoryview]],
        alpha: float = 1.0,
        worker: int | None = None,
        step: int = 0,
        wire: int = 0,
    ) -> None:
        """Send many tensors' shards as batch frames, one stream of frames per daemon.

        With a ``wire`` dtype each buffer holds its tensor's values in that
        dtype, and each entry's length counts those wire bytes.
        """
        per_node: dict[str, list[tuple[BatchEntry, memoryview]]] = defaultdict(list)
        update = op != Op.READ_BATCH
        spread = Spread(self.router, asks_primary(update, worker_field(worker, step)))
        for meta, buf in items:
            for s in slices(meta, 0, len(buf), wire):
                p = s.piece
                node = spread.order(meta.key, p)[0]
                entry = BatchEntry(
                    meta.key,
                    p.shard,
                    p.shard_offset,
                    s.length,
                    # For reads: the least version a replica may answer with.
                    version=0 if update else self.router.seen(meta.key, p.shard),
                    alpha=alpha,
                    dtype=meta.dtype_code,
                )
                per_node[node.name].append((entry, buf[s.start : s.start + s.length]))
        names = {m.key: m.name for m, _ in items}
        calls = []
        for node_name, work in per_node.items():
            node = self.router.in_force.config.node(node_name)
            for chunk in frames_of(work):
                calls.append(partial(self._frame, op, node, chunk, names, worker, step, wire))
        await self.session.gather(calls)

    async def _frame(
        self,
        op: Op,
        node: Node,
        chunk: list[tuple[BatchEntry, memoryview]],
        names: dict[int, str],
        worker: int | None = None,
        step: int = 0,
        wire: int = 0,
    ) -> None:
        wid = worker_field(worker, step)
        entries = [e for e, _ in chunk]
        views = [v for _, v in chunk]
        head = pack_entries(entries)
        # Entry i of an update batch is update txn + i, on retries too.
        txn = update_txn(self.router.fails_over) if op != Op.READ_BATCH else 0
        try:
            if op == Op.READ_BATCH:
                sink = BatchReadSink(views)
                hdr = ReadBatch(len(entries), wire, wid, step).frame(len(head))
                await self.session.request(node, hdr, [head], sink)
                answers = sink.entries
            else:
                length = len(head) + sum(len(v) for v in views)
                hdr = UpdateBatch(op, len(entries), wire, wid, step, txn).frame(length)
                reply = await self.session.request(node, hdr, [head, *views], None)
                answers = unpack_entries(reply.data, len(entries))
        except (DaemonUnavailable, DaemonError) as exc:
            if not self.router.fails_over or (
                isinstance(exc, DaemonError) and exc.status not in FAILOVER_STATUSES
            ):
                raise
            if isinstance(exc, DaemonUnavailable):
                self.router.failed(node)
            answers = [
                BatchEntry(e.key, e.shard, e.offset, 0, status=Status.NOT_OWNER) for e in entries
            ]
        redo = []
        for i, a in enumerate(answers):
            if a.status == Status.OK:
                if self.router.fails_over:
                    self.router.saw(a.key, a.shard, a.version, op != Op.READ_BATCH)
                continue
            if self.router.fails_over and a.status in FAILOVER_STATUSES:
                redo.append(i)
                continue
            if a.status in (Status.NOT_FOUND, Status.STALE_LAYOUT):
                self.cache.drop(names.get(a.key, ""))
            raise error_for_status(
                a.status, f"{node.name}: {names.get(a.key, hex(a.key))!r} shard {a.shard}"
            )
        if redo:
            # Those entries go one by one, failing over to other replicas.
            await self.session.gather(
                partial(self._redo_entry, op, entries[i], views[i], wid, step, txn, i, wire)
                for i in redo
            )

    async def _redo_entry(
        self,
        op: Op,
        e: BatchEntry,
        view: memoryview,
        wid: int,
        step: int,
        txn: int,
        index: int,
        wire: int,
    ) -> None:
        single = {Op.READ_BATCH: Op.READ, Op.WRITE_BATCH: Op.WRITE}.get(op, Op.ACCUMULATE)
        update = single != Op.READ
        size = e.length
        if wire:  # a single op's size counts the tensor's bytes, its length the wire's
            size = e.length // narrowing.holder(wire).itemsize * dtype_from_code(e.dtype).itemsize
        if update:
            change = Update(
                single,
                e.key,
                e.shard,
                e.offset,
                size,
                e.alpha,
                dtype=e.dtype,
                wire=wire,
                worker=wid,
                step=step,
                txn=batch_entry_txn(txn, index),
            )
            await self.router.on_replicas(
                e.key, e.shard, change, [view], length=e.length, update=True
            )
        else:
            read = Read(
                e.key, e.shard, e.offset, size, dtype=e.dtype, wire=wire, worker=wid, step=step
            )
            await self.router.on_replicas(e.key, e.shard, read, sink=IntoSink(view), update=False)


def frames_of(
    work: list[tuple[BatchEntry, memoryview]],
) -> Iterable[list[tuple[BatchEntry, memoryview]]]:
    chunk: list[tuple[BatchEntry, memoryview]] = []
    size = 0
    for entry, view in work:
        if chunk and (size + len(view) + ENTRY_SIZE > BATCH_BYTES or len(chunk) >= BATCH_ENTRIES):
            yield chunk
            chunk, size = [], 0
        chunk.append((entry, view))
        size += len(view) + ENTRY_SIZE
    if chunk:
        yield chunk
