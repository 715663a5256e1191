"""Many tensors in one frame per daemon: the batched forms of read, write and accumulate.

A batch is cut into frames of at most ``BATCH_BYTES`` of payload and
``BATCH_ENTRIES`` entries, one stream of frames per daemon, run
concurrently. An entry a replica refuses with a failover status (or whose
daemon vanished) is retried on its own through the router, so replicas and
read-your-writes behave as for single requests.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from functools import partial

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
from ..ranges import shard_pieces
from ..sinks import BatchReadSink, IntoSink
from .cache import MetaCache
from .routing import Router, asks_primary, new_txn, worker_field
from .session import Session

# Payload budget of one batch frame (the daemon accepts at least 64 MiB).
BATCH_BYTES = 32 << 20
BATCH_ENTRIES = 4096


class Batches:
    """Runs batch ops for one client: frames go through ``session``, entries
    refused by a replica fail over through ``router``, and a tensor's cached
    metadata is dropped from ``cache`` when a daemon says it changed."""

    def __init__(self, router: Router, session: Session, cache: MetaCache) -> None:
        self.router = router
        self.session = session
        self.cache = cache

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
        to_primary = asks_primary(update, worker_field(worker, step))
        load: dict[str, int] | None = None if to_primary else {}
        held = narrowing.holder(wire).itemsize if wire else 0
        for meta, buf in items:
            itemsize = meta.np_dtype.itemsize
            size = len(buf) // held * itemsize if wire else len(buf)
            for p in shard_pieces(meta, 0, size):
                node = self.router.candidates(meta.key, p.shard, to_primary, load)[0]
                if load is not None:
                    load[node.name] = load.get(node.name, 0) + p.length
                if wire:
                    start, n = p.buf_offset // itemsize * held, p.length // itemsize * held
                else:
                    start, n = p.buf_offset, p.length
                entry = BatchEntry(
                    meta.key,
                    p.shard,
                    p.shard_offset,
                    n,
                    # For reads: the least version a replica may answer with.
                    version=0 if update else self.router.seen(meta.key, p.shard),
                    alpha=alpha,
                    dtype=meta.dtype_code,
                )
                per_node[node.name].append((entry, buf[start : start + n]))
        names = {m.key: m.name for m, _ in items}
        calls = []
        for node_name, work in per_node.items():
            node = self.router.config.node(node_name)
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
        txn = new_txn() if op != Op.READ_BATCH and self.router.fails_over else 0
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
