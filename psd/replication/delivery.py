"""Sending one queued item to a peer: a forwarded update (REPLICA_UPDATE), or a shard
whole (SYNC) followed by the lockstep pushes this daemon holds for it.

The order items go in, retries and acknowledgement are ``forwarding``'s; this
module builds the messages and says how the peer answered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from irdma.protocol import Header, Status
from irdma.protocol.messages import ReplicaUpdate, ShardCopy

from ..store import Commit, Store, held_commit
from .bodies import LentBytes, ShardCopyBody
from .lending import Lender
from .links import Link, PeerError, Refused

# The rate a peer that is up takes and sends bytes at, at the least (bytes per
# second): a request's timeout is the failure timeout plus its bytes at this rate.
MODEST_RATE = 100e6


@dataclass(slots=True)
class CopyCounts:
    """Whole shards this daemon sent to peers and installed from them, since it started
    (catch-up after a restart, a backup found behind, a move of epochs)."""

    sent: int = 0
    sent_bytes: int = 0
    received: int = 0
    received_bytes: int = 0
    # Forwarded updates whose bytes a same-host peer read out of the sender's
    # arena (``lending``): lent by this daemon, and borrowed from its primaries.
    lent: int = 0
    lent_bytes: int = 0
    borrowed: int = 0
    borrowed_bytes: int = 0


class Delivery:
    """Sends updates and whole shards from ``store`` to peers, as daemon ``sender``."""

    def __init__(
        self,
        store: Store,
        sender: int,
        failure_timeout: float,
        copies: CopyCounts,
        *,
        lend: bool = True,
    ) -> None:
        self.store = store
        self.sender = sender  # how messages name this daemon (``vetting.sender_id``)
        self.failure_timeout = failure_timeout
        self.copies = copies
        self.lender = Lender(store.arena, enabled=lend)

    def budget(self, nbytes: int) -> float:
        """How long a peer that is up may take to answer a request of ``nbytes``."""
        return self.failure_timeout + nbytes / MODEST_RATE

    def update_request(
        self, c: Commit, lent: LentBytes | None = None
    ) -> tuple[Header, list[np.ndarray | bytes]]:
        """The REPLICA_UPDATE that forwards one update: its header and payload (with
        ``lent``, where its bytes lie in this daemon's arena instead of the bytes)."""
        if lent is not None:
            body = lent.encode()
            return self._replica_update(c, lent=True).frame(len(body)), [body]
        return self._replica_update(c).frame(c.payload.nbytes), [c.payload]

    def _replica_update(self, c: Commit, *, lent: bool = False) -> ReplicaUpdate:
        return ReplicaUpdate(
            c.op,
            c.key,
            c.shard,
            c.offset,
            c.payload.nbytes,
            c.alpha,
            c.layout,
            c.dtype,
            produces=c.version,
            sender=self.sender,
            txn=c.txn,
            group=c.group,
            steps_applied=c.steps_applied,
            stamp=c.stamp,
            pushed_by=c.pushed_by,
            pushed_step=c.pushed_step,
            held=c.held,
            lent=lent,
        )

    async def update(self, link: Link, c: Commit) -> tuple[int, bytes]:
        """Forward one update and wait for the answer: the peer's status and, for a
        refusal, why."""
        header, payload = self.update_request(c)
        reply, text = await link.request(header, payload, timeout=self.budget(c.payload.nbytes))
        return reply.status, text

    async def shard(self, link: Link, key: int, index: int) -> int | None:
        """Send a shard whole, then the pushes held for its lockstep step; the version
        sent (None: deleted here meanwhile, so not sent).

        Raises Refused when the peer does not take it from this daemon, PeerError
        when it fails otherwise.
        """
        store = self.store
        tensor = store.tensors.get(key)
        shard = tensor.shards.get(index) if tensor is not None else None
        if tensor is None or shard is None:
            return None  # deleted here meanwhile: nothing to send
        block = store.pin(shard.block)
        copied = shard.version
        try:
            body = ShardCopyBody(
                tensor.meta,
                shard.version,
                tuple(shard.recent.items()),
                tuple(store.applied_steps(tensor, index)),
                tuple(store.clocks(tensor, index)),
                shard.stamp,
            ).encode()
            data: np.ndarray = store.arena.view(block, 0, shard.nbytes)
            header = ShardCopy(
                key, index, shard.version, len(body), shard.nbytes, sender=self.sender
            ).frame(len(body) + shard.nbytes)
            reply, text = await link.request(header, [body, data], timeout=self.budget(data.nbytes))
        finally:
            store.unpin(block)
        if reply.status != Status.OK:
            error = Refused if reply.status == Status.NOT_OWNER else PeerError
            raise error(
                f"{link.node.name} refused shard {index} of {tensor.meta.name!r}: "
                f"{Status(reply.status).name}: {text.decode(errors='replace')}"
            )
        self.copies.sent += 1
        self.copies.sent_bytes += shard.nbytes
        # The copy let go of the pushes the peer held for the step: send ours.
        for worker, step, held in store.held_on(tensor, index):
            if store.tensors.get(key) is not tensor:
                return copied  # replaced meanwhile: its own copy follows
            # Held since the copy: later ones are queued behind it.
            status, _ = await self.update(link, held_commit(held, worker, step, copied))
            if status not in (Status.OK, Status.BEHIND):
                raise PeerError(
                    f"{link.node.name} refused a held push of worker {worker} to shard "
                    f"{index} of {tensor.meta.name!r}: {Status(status).name}"
                )
        return copied
