"""The requests daemons send each other: heartbeats, catch-up questions, forwarded
updates and whole-shard copies (the rules are ``psd.replication``'s: its heartbeats,
catch-up service and vetting)."""

from __future__ import annotations

import numpy as np

from irdma.protocol import MAX_META_PAYLOAD, NO_WORKER, Header, Status
from irdma.protocol.messages import Catchup, Ping, ReplicaUpdate, ShardCopy, SyncRequest
from irdma.transport.base import StreamBroken, StreamClosed

from .conn import Conn, Replies, payload_json
from .data_ops import DataOps
from .errors import Refusal
from .replication import Item, Replicator
from .replication.bodies import BadBody, LentBytes
from .replication.lending import LentUnreadable, LoanRevoked
from .store import PendingUpdate, Store


class PeerOps:
    """Handlers of the replication requests for one daemon."""

    def __init__(
        self, store: Store, replicator: Replicator, replies: Replies, data: DataOps
    ) -> None:
        self.store = store
        self.heartbeats = replicator.heartbeats
        self.service = replicator.service
        self.vetting = replicator.vetting
        self.replies = replies
        self.data = data  # receives a forwarded update's payload as a client's
        self.borrower = replicator.borrower  # reads a same-host primary's lent bytes
        self.copies = replicator.copies

    async def replica_update(self, conn: Conn, header: Header, msg: ReplicaUpdate) -> None:
        self.vetting.check_sender(msg.sender, msg.key, msg.shard)
        tensor = self.store.tensors.get(msg.key)
        if tensor is not None and msg.shard not in tensor.shards:
            # Placed here by a move (check_sender saw to that) and not copied yet: the
            # primary sends the whole shard instead.
            raise Refusal(
                Status.BEHIND,
                f"shard {msg.shard} of {tensor.meta.name!r} is placed here and not copied yet",
            )
        if msg.lent:
            update = await self._receive_lent(conn, msg)
        else:
            update = await self.data.receive_update(conn, msg)
        update.txn = msg.txn
        update.stamp = msg.stamp
        try:
            # The view may have moved while the payload came in.
            self.vetting.check_sender(msg.sender, msg.key, msg.shard)
        except Refusal:
            self.store.abort(update)
            raise
        if msg.held:
            version = self.store.hold_replica(update, msg.produces, msg.pushed_by, msg.pushed_step)
        else:
            step = (msg.group, msg.steps_applied) if msg.steps_applied else None
            pushed = (msg.pushed_by, msg.pushed_step) if msg.pushed_by != NO_WORKER else None
            version = self.store.commit_replica(update, msg.produces, step, pushed)
        await self.replies.reply(conn, header, [], version=version)

    async def _receive_lent(self, conn: Conn, msg: ReplicaUpdate) -> PendingUpdate:
        """A forwarded update whose bytes the primary lent from its arena: read into a
        block of this daemon's, then the loan checked (``replication.lending``).

        Refusal BEHIND when the loan was revoked before the bytes were read (the
        primary sends the shard whole), BAD_ARGUMENT when its arena cannot be read
        from here at all (it forwards bytes from then on).
        """
        if conn.payload.left != LentBytes.SIZE:
            raise Refusal(Status.BAD_FRAME, f"a lent update's body is {LentBytes.SIZE} bytes")
        try:
            lent = LentBytes.decode(await conn.payload.read_bytes(LentBytes.SIZE))
        except BadBody as exc:
            raise Refusal(Status.BAD_FRAME, str(exc)) from None
        update = self.data.begin_update(msg)
        try:
            self.borrower.read(lent, update.landing)
        except LoanRevoked as exc:
            self.store.abort(update)
            raise Refusal(Status.BEHIND, str(exc)) from None
        except LentUnreadable as exc:
            self.store.abort(update)
            raise Refusal(Status.BAD_ARGUMENT, str(exc)) from None
        except BaseException:
            self.store.abort(update)
            raise
        self.copies.borrowed += 1
        self.copies.borrowed_bytes += msg.size
        return update

    async def ping(self, conn: Conn, header: Header, msg: Ping) -> None:
        body = await payload_json(conn)
        answer = await self.heartbeats.received(body)
        await self.replies.reply(conn, header, [answer])

    async def catchup(self, conn: Conn, header: Header, msg: Catchup) -> None:
        body = await payload_json(conn)
        await self.replies.reply(conn, header, [self.service.answer(body)])

    async def sync_request(self, conn: Conn, header: Header, msg: SyncRequest) -> None:
        body = await payload_json(conn)
        items = self.service.queue_copies(body)
        # Answered by its own task once the shards are delivered: meanwhile this
        # connection serves the asker's other requests (two daemons copying from
        # each other at once would otherwise wait on each other's connection).
        conn.deferred = True
        conn.nursery.start_soon(self._answer_when_sent, conn, header, items)

    async def _answer_when_sent(self, conn: Conn, header: Header, items: list[Item]) -> None:
        try:
            try:
                await self.service.sent(items)
            except Refusal as exc:
                await self.replies.error(conn, header, exc.status, exc.message)
            else:
                await self.replies.reply(conn, header, [])
        except (StreamBroken, StreamClosed):
            pass  # the connection's task notices and cleans up

    async def sync(self, conn: Conn, header: Header, msg: ShardCopy) -> None:
        length = conn.payload.left
        if msg.meta_length > MAX_META_PAYLOAD or msg.meta_length + msg.size != length:
            raise Refusal(Status.BAD_FRAME, "shard copy: lengths do not add up")
        self.vetting.check_sender(msg.sender, msg.key, msg.shard, whole=True)
        staging = self.store.blocks.reserve(length)
        try:
            if staging is None:  # arena full: the copy waits in process memory
                buf = np.empty(length, dtype=np.uint8)
            else:
                buf = self.store.arena.view(staging, 0, length)
            await conn.payload.read_into(buf)
            self.vetting.check_sender(msg.sender, msg.key, msg.shard, whole=True)
            self.vetting.install(msg, buf.data)
        finally:
            if staging is not None:
                self.store.arena.free(staging)
        await self.replies.reply(conn, header, [], version=msg.version)
