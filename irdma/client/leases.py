"""A reader's lease on one whole-tensor write of a tensor (LEASE): the daemons
keep that write's copies while the reader reads it in ranges, however often
the tensor is rewritten meanwhile (``psd/store/leases.py``).

``ReadLease.take`` asks every daemon holding a copy of some shard (each
replica: reads are spread over them, and a backup that takes over must hold
it too) to hold *every* copy it keeps now or replaces from now on, before
the reader reads anything; ``keep`` narrows the lease to the write the
reader's first range came from; a task renews it every third of its length
until ``release``. A daemon that cannot be reached, does not hold the
tensor, or is older than leases (BAD_OP) is passed over: a read it serves
then fails as without a lease (TornRead once the write is gone), never
mixes. trio only (the mount's reader); the lease's length is the config's
``read_lease``.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from functools import partial

import trio

from ..cluster import Node
from ..errors import ArenaFull, BadRequest, DaemonUnavailable, IrdmaError, TensorNotFound
from ..protocol import Status, TensorMeta
from ..protocol.messages import Lease
from .lookup import nodes_holding
from .routing import new_txn
from .session import Session

log = logging.getLogger("irdma.client")

# A lease is renewed this many times per its length: two renewals may be lost
# (a slow daemon, a busy client) before it runs out.
RENEWALS_PER_LEASE = 3


def lease_id() -> int:
    """A lease id no other reader has: drawn as update ids are (``routing.new_txn``:
    64 bits from the OS, never the process's seeded ``random``; never 0)."""
    return new_txn()


@dataclass(eq=False)
class ReadLease:
    """One reader's lease on tensor ``meta`` at every daemon holding a copy of it."""

    session: Session
    meta: TensorMeta
    seconds: float
    lease_id: int = field(default_factory=lease_id)
    stamp: int = 0  # the write held (as reads carry it); 0: every copy
    _renewing: trio.CancelScope = field(default_factory=trio.CancelScope)

    @classmethod
    async def take(cls, session: Session, meta: TensorMeta, nursery: trio.Nursery) -> ReadLease:
        """Hold every copy of ``meta``'s shards from now on; renewed in ``nursery``
        until ``release``."""
        lease = cls(session, meta, session.config.read_lease)
        await lease._ask(lease.seconds)
        nursery.start_soon(lease._renew)
        return lease

    async def keep(self, stamp: int) -> None:
        """Hold only whole-tensor write ``stamp`` (as a read returned it) from now on.
        Never raises: where it cannot narrow, the lease still holds every copy."""
        self.stamp = stamp
        await self._try(self.seconds, "narrowed")

    async def release(self) -> None:
        """Stop renewing and let the daemons go of what the lease held (bounded by
        the client's timeout, even while being cancelled). Never raises: where it
        cannot, the lease runs out."""
        self._renewing.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(self.session.timeout):
            await self._try(0, "released")

    async def _try(self, seconds: float, what: str) -> None:
        try:
            await self._ask(seconds)
        except IrdmaError as exc:  # the reads say what it costs
            log.warning("lease on %s not %s: %s", self.meta.name, what, exc)

    async def _renew(self) -> None:
        with self._renewing:
            while True:
                await trio.sleep(self.seconds / RENEWALS_PER_LEASE)
                await self._try(self.seconds, "renewed")

    async def _ask(self, seconds: float) -> None:
        ms = max(1, round(seconds * 1000)) if seconds > 0 else 0  # 0 releases
        msg = Lease(self.meta.key, self.lease_id, self.stamp, ms)
        nodes = nodes_holding(self.session.config, self.meta)
        await self.session.gather(partial(self._ask_one, node, msg) for node in nodes)

    async def _ask_one(self, node: Node, msg: Lease) -> None:
        with contextlib.suppress(DaemonUnavailable, TensorNotFound):
            try:
                await self.session.request(node, msg.frame())
            except (ArenaFull, BadRequest) as exc:
                if exc.status not in (Status.NO_SPACE, Status.BAD_OP):
                    raise
                # Too many leases there, or a daemon from before them: reads
                # from it get what they got without one.
                log.debug("%s: no lease on %s: %s", node.name, self.meta.name, exc)
