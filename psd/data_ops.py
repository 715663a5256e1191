"""The data requests: reads (and pulls that wait for a training step), writes and
accumulates, one shard or a batch at a time."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from time import perf_counter

import numpy as np
import trio

from irdma.cluster import Node
from irdma.protocol import (
    ENTRY_SIZE,
    LOCATION,
    NO_WORKER,
    BatchEntry,
    Flag,
    Header,
    Op,
    Status,
    pack_entries,
    unpack_entries,
)
from irdma.protocol.messages import (
    Read,
    ReadBatch,
    Release,
    ReplicaUpdate,
    Update,
    UpdateBatch,
    batch_entry_txn,
    read_answer,
    wire_stamp,
)
from irdma.sizes import ZERO_COPY_MIN
from irdma.transport.base import StreamBroken, StreamClosed, acquire_soon

from .admission import Admission
from .arena import Block
from .conn import Conn, Replies, no_payload
from .errors import Refusal
from .held_answers import HeldAnswers
from .metrics import RequestMetrics
from .replication import Forwarding, Item
from .store import PendingUpdate, Store, copies

log = logging.getLogger("psd")


async def staged_location(conn: Conn) -> int:
    """Where a STAGED update's data sits in the client's staging memory."""
    if conn.memory is None or conn.payload.left != LOCATION.size:
        raise Refusal(
            Status.BAD_FRAME,
            "STAGED data needs a shm or rdma connection and an 8-byte location"
            if conn.memory is None
            else f"STAGED location is {conn.payload.left} bytes, not {LOCATION.size}",
        )
    (offset,) = LOCATION.unpack(await conn.payload.read_bytes(LOCATION.size))
    return offset


async def batch_entries(conn: Conn, msg: ReadBatch | UpdateBatch) -> list[BatchEntry]:
    need = msg.count * ENTRY_SIZE
    if need > conn.payload.left:
        raise Refusal(Status.BAD_FRAME, f"{msg.count} entries need {need} bytes of payload")
    return unpack_entries(await conn.payload.read_bytes(need), msg.count)


class DataOps:
    """Handlers of the data requests for one daemon's store."""

    def __init__(
        self,
        node: Node,
        store: Store,
        admission: Admission,
        forwarding: Forwarding,
        replies: Replies,
        metrics: RequestMetrics,
        *,
        poll: float,
        max_payload: int,
    ) -> None:
        self.node = node
        self.store = store
        self.admission = admission
        self.forwarding = forwarding  # to the backups
        # Answers updates once their copies hold them.
        self.held = HeldAnswers(forwarding, replies, metrics)
        self.replies = replies
        self.metrics = metrics
        # Longest a read waits for a training step before it is answered NOT_READY.
        self.poll = poll
        self.max_payload = max_payload
        self._changed = trio.Event()
        store.add_waiters(self)

    def wake(self) -> None:
        """Wake every read waiting for a training step; each re-checks its own condition."""
        self._changed.set()
        self._changed = trio.Event()

    def forward(self) -> list[Item]:
        """Queue what was just applied for the backups (call with no await in between)."""
        commits = self.store.take_commits()
        return self.forwarding.forward(commits) if commits else []

    async def read(self, conn: Conn, header: Header, msg: Read) -> None:
        no_payload(conn, msg)
        self.admission.check_ready()
        if msg.worker != NO_WORKER and self.store.waits_for(
            msg.key, msg.shard, msg.worker, msg.step, msg.layout
        ):
            conn.deferred = True
            conn.nursery.start_soon(
                self._wait_then,
                conn,
                header,
                msg,
                {msg.key: [msg.shard]},
                partial(self._read_now, conn, header, msg),
            )
            return
        await self._read_now(conn, header, msg)

    async def _wait_then(
        self,
        conn: Conn,
        header: Header,
        msg: Read | ReadBatch,
        shards: dict[int, list[int]],
        answer: Callable[[], Awaitable[None]],
    ) -> None:
        """Answer a read once its training step is reached, or NOT_READY after ``poll``.

        Runs in its own task, so the connection serves other requests
        (the pushes this read may be waiting for among them) meanwhile.
        ``shards`` maps tensor keys to the shards the read waits on.
        """
        started = perf_counter()
        try:
            try:
                if await self._wait_for_step(msg.worker, msg.step, shards):
                    await answer()
                else:
                    await self.replies.error(
                        conn,
                        header,
                        Status.NOT_READY,
                        f"step {msg.step} not reached within {self.poll:g} s; ask again",
                    )
            except Refusal as exc:
                await self.replies.error(conn, header, exc.status, exc.message)
        except (StreamBroken, StreamClosed):
            pass  # the connection task notices and cleans up
        finally:
            self.metrics.series(header.op, conn.transport).observe(perf_counter() - started)

    def _still_waiting(self, worker: int, step: int, shards: dict[int, list[int]]) -> bool:
        return any(
            self.store.waits_for(key, s, worker, step) for key, ss in shards.items() for s in ss
        )

    async def _wait_for_step(self, worker: int, step: int, shards: dict[int, list[int]]) -> bool:
        """Wait until no shard's read waits for anyone; False if ``poll`` ran out first.

        When it runs out, workers silent past the mode's timeout are
        reported (Refusal WORKER_LOST) or evicted, per the mode.
        """
        with trio.move_on_after(self.poll):
            while True:
                changed = self._changed
                if not self._still_waiting(worker, step, shards):
                    return True
                await changed.wait()
        for key, ss in shards.items():
            for s in ss:
                lost = self.store.expire(key, s, worker, step)
                self.forward()  # a step applied without the evicted workers
                if lost:
                    log.warning(
                        "%s: evicted silent worker(s) %s from tensor %s",
                        self.node.name,
                        lost,
                        self.store.tensors[key].meta.name,
                    )
        return not self._still_waiting(worker, step, shards)

    async def _read_now(self, conn: Conn, header: Header, msg: Read) -> None:
        _, shard = self.store.catalogue.span(
            msg.key, msg.shard, msg.offset, msg.size, msg.layout, msg.dtype
        )
        # The current copy, or the one a whole-tensor write's reader asks for.
        block, version = copies.copy_for(shard, msg.stamp)
        if msg.stamp and version < msg.min_version:
            # An older write's copy, older than what the client saw acknowledged
            # (its own later write): it would break read-your-writes.
            raise Refusal(
                Status.STAMP_GONE,
                f"shard {shard.index}'s copy of write {msg.stamp:#x} is version {version}, "
                f"older than the {msg.min_version} the client saw",
            )
        stamp = wire_stamp(shard.stamp) if block is shard.block else msg.stamp
        stamps = (stamp, wire_stamp(shard.prev_stamp) if shard.prev else 0)
        view = self.store.arena.view(block, msg.offset, msg.size)
        self.admission.check_fresh(msg.key, msg.min_version, version, shard.index)
        if msg.wire:
            # Narrowed: new bytes, sent inline (nothing in the arena to map or pin).
            narrowed = self.store.read_narrowed(msg.key, msg.offset, view, msg.wire)
            await self.replies.reply(conn, header, [narrowed], version=version, stamps=stamps)
            return
        block = self.store.pin(block)
        rid = msg.request_id
        if conn.memory is not None and msg.size >= conn.memory.mapped_min and rid not in conn.pins:
            # Same host: say where the bytes are; the pin keeps them there
            # (an update writes a new block) until the client's RELEASE.
            conn.pins[rid] = block
            where = LOCATION.pack(block.offset + msg.offset)
            flags = Flag.PINNED | Flag.MAPPED
            frame = read_answer(header, len(where), flags, version, *stamps)
            self.metrics.series(msg.op, conn.transport).sent += msg.size
            await conn.send([frame, where])
            return
        if msg.size >= ZERO_COPY_MIN and rid not in conn.pins:
            # The kernel keeps referring to these pages until the client has
            # received them; the pin holds the block until it says RELEASE.
            conn.pins[rid] = block
            frame = read_answer(header, msg.size, Flag.PINNED, version, *stamps)
            self.metrics.series(msg.op, conn.transport).sent += msg.size
            await acquire_soon(conn.send_lock)
            try:
                await conn.stream.send_all([frame])
                await conn.stream.sendfile(self.store.arena.fd, block.offset + msg.offset, msg.size)
            finally:
                conn.send_lock.release()
            return
        try:
            await self.replies.reply(conn, header, [view], version=version, stamps=stamps)
        finally:
            self.store.unpin(block)

    async def release(self, conn: Conn, header: Header, msg: Release) -> None:
        block = conn.pins.pop(msg.request_id, None)
        if block is not None:
            self.store.unpin(block)

    def begin_update(self, msg: Update | ReplicaUpdate, wire: int = 0) -> PendingUpdate:
        """Validate the update a message makes and stage room for its payload."""
        return self.store.begin_update(
            msg.op,
            msg.key,
            msg.shard,
            msg.offset,
            msg.size,
            alpha=msg.alpha,
            layout=msg.layout,
            dtype=msg.dtype,
            wire=wire,
        )

    async def receive_update(
        self, conn: Conn, msg: Update | ReplicaUpdate, *, wire: int = 0, staged: bool = False
    ) -> PendingUpdate:
        """Validate an update and take in its payload (inline or STAGED); not applied yet."""
        location = await staged_location(conn) if staged else None
        update = self.begin_update(msg, wire)
        try:
            landing = update.landing
            if location is None:
                if conn.payload.left != len(landing):
                    raise Refusal(
                        Status.BAD_FRAME,
                        f"payload is {conn.payload.left} bytes but the op covers {len(landing)}",
                    )
                await conn.payload.read_into(landing)
            else:
                assert conn.memory is not None
                if msg.op == Op.ACCUMULATE and update.narrow is None:
                    # Applied straight from the client's memory before the answer
                    # (or copied first where it must be kept: update.materialize).
                    update.source = conn.memory.staged(location, len(landing))
                else:
                    conn.memory.read_staged(location, len(landing), landing)
                self.metrics.series(msg.op, conn.transport).received += len(landing)
            update.widen()
        except BaseException:
            self.store.abort(update)
            raise
        return update

    async def update(self, conn: Conn, header: Header, msg: Update) -> None:
        self.admission.check_primary(msg.key, msg.shard)
        update = await self.receive_update(conn, msg, wire=msg.wire, staged=msg.staged)
        update.txn = msg.txn
        update.stamp = msg.stamp
        # The connection was idle while the payload came in: check again.
        try:
            self.admission.check_primary(msg.key, msg.shard)
        except Refusal:
            self.store.abort(update)
            raise
        version, retried = self._apply_once(update, msg.worker, msg.step)
        items = self.forward()
        retries = [(msg.key, msg.shard)] if retried else []
        answer = partial(self.replies.reply, conn, header, [], version=version)
        await self.held.answer(conn, header, items, retries, answer, msg.size)

    def _abort_all(self, updates: list[PendingUpdate | Refusal]) -> None:
        """Give back the blocks of pending updates that will not be applied."""
        for u in updates:
            if isinstance(u, PendingUpdate):
                self.store.abort(u)

    def _apply_once(self, update: PendingUpdate, worker: int, step: int) -> tuple[int, bool]:
        """Apply a client's update unless its txn was applied before: (version, was a retry).

        A retry is not applied twice; its caller answers it only after
        ``Forwarding.confirm``, once every other copy surely has the original.
        """
        done = self.store.applied(update, worker)
        if done is not None:
            self.store.abort(update)
            return done, True
        return self.store.push(update, worker, step), False

    async def read_batch(self, conn: Conn, header: Header, msg: ReadBatch) -> None:
        entries = await batch_entries(conn, msg)
        if conn.payload.left:
            raise Refusal(Status.BAD_FRAME, "a read batch carries only its entries")
        self.admission.check_ready()
        if msg.worker != NO_WORKER:
            # One training step for the whole batch: wait on the entries that
            # wait (all belong to tensors of one model, pulled together).
            waiting: dict[int, list[int]] = {}
            for e in entries:
                if self._entry_waits(msg, e):
                    waiting.setdefault(e.key, []).append(e.shard)
            if waiting:
                answer = partial(self._read_batch_now, conn, header, msg, entries)
                conn.deferred = True
                conn.nursery.start_soon(self._wait_then, conn, header, msg, waiting, answer)
                return
        await self._read_batch_now(conn, header, msg, entries)

    def _entry_waits(self, msg: ReadBatch, e: BatchEntry) -> bool:
        try:
            return bool(self.store.waits_for(e.key, e.shard, msg.worker, msg.step))
        except Refusal as exc:
            if exc.status == Status.NOT_FOUND:
                return False  # answered per entry by the read
            raise

    async def _read_batch_now(
        self, conn: Conn, header: Header, msg: ReadBatch, entries: list[BatchEntry]
    ) -> None:
        answers: list[BatchEntry] = []
        views = []
        blocks: list[Block] = []
        total = len(entries) * ENTRY_SIZE
        view: np.ndarray | memoryview  # the stored bytes, or new ones narrowed to the wire
        try:
            for e in entries:
                try:
                    shard, view = self.store.read_view(
                        e.key, e.shard, e.offset, self._entry_range(msg.wire, e), dtype=e.dtype
                    )
                    if msg.wire:
                        view = self.store.read_narrowed(e.key, e.offset, view, msg.wire)
                except Refusal as exc:
                    answers.append(BatchEntry(e.key, e.shard, e.offset, 0, status=exc.status))
                    continue
                if self.admission.behind(e.key, e.shard, e.version, shard.version):
                    answers.append(BatchEntry(e.key, e.shard, e.offset, 0, status=Status.BEHIND))
                    continue
                total += len(view)
                if total > self.max_payload:
                    raise Refusal(
                        Status.TOO_LARGE, f"batch answer over the {self.max_payload} byte limit"
                    )
                if not msg.wire:
                    blocks.append(self.store.pin(shard.block))
                views.append(view)
                answers.append(BatchEntry(e.key, e.shard, e.offset, e.length, shard.version))
            await self.replies.reply(conn, header, [pack_entries(answers), *views])
        finally:
            for block in blocks:
                self.store.unpin(block)

    def _entry_range(self, wire: int, e: BatchEntry) -> int:
        """The tensor bytes a batch entry covers: its length, or more if narrowed.

        With a wire dtype an entry's length counts wire bytes (what follows
        it in the frame), so a frame can be cut without knowing the tensor.
        """
        return self.store.stored_nbytes(e.key, wire, e.length) if wire else e.length

    async def update_batch(self, conn: Conn, header: Header, msg: UpdateBatch) -> None:
        op = msg.single
        entries = await batch_entries(conn, msg)
        if sum(e.length for e in entries) != conn.payload.left:
            raise Refusal(Status.BAD_FRAME, "batch entry lengths do not add up to the payload")
        # Receive everything before applying anything: a batch cut short by a
        # broken connection changes nothing.
        updates: list[PendingUpdate | Refusal] = []
        try:
            for e in entries:
                try:
                    self.admission.check_primary(e.key, e.shard)
                    upd = self.store.begin_update(
                        op,
                        e.key,
                        e.shard,
                        e.offset,
                        self._entry_range(msg.wire, e),
                        alpha=e.alpha,
                        dtype=e.dtype,
                        wire=msg.wire,
                    )
                except Refusal as exc:
                    await conn.payload.skip(e.length)  # this entry is refused, not the batch
                    updates.append(exc)
                    continue
                updates.append(upd)
                await conn.payload.read_into(upd.landing)
                upd.widen()
        except BaseException:
            # A batch cut short (a broken connection, a bad frame): every entry
            # begun so far gives its block back.
            self._abort_all(updates)
            raise
        answers = []
        retried: list[tuple[int, int]] = []
        for i, (e, u) in enumerate(zip(entries, updates, strict=True)):
            if isinstance(u, Refusal):
                answers.append(BatchEntry(e.key, e.shard, e.offset, 0, status=u.status))
                continue
            u.txn = batch_entry_txn(msg.txn, i)
            try:
                self.admission.check_primary(e.key, e.shard)
                version, again = self._apply_once(u, msg.worker, msg.step)
                if again:
                    retried.append((e.key, e.shard))
            except Refusal as exc:
                self.store.abort(u)
                answers.append(BatchEntry(e.key, e.shard, e.offset, 0, status=exc.status))
                continue
            except BaseException:
                self._abort_all(updates[i:])  # those not applied yet
                raise
            answers.append(BatchEntry(e.key, e.shard, e.offset, e.length, version))
        answer = partial(self.replies.reply, conn, header, [pack_entries(answers)])
        await self.held.answer(conn, header, self.forward(), retried, answer, header.length)
