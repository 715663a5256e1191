"""The replica log: which update ids (txns) a shard has applied, so a client's
retry (after a timeout or a failover) is applied once, and whether an update
forwarded by the shard's primary sits on top of this copy. Pure decisions over
a shard's records."""

from __future__ import annotations

from irdma.protocol import NO_WORKER, Status

from ..errors import StoreError
from .records import PendingUpdate, Shard

# Recent update ids remembered per shard, so a client retrying an update
# (after a timeout or a failover) has it applied once. Retries come within a
# client timeout, so a bounded window suffices.
RECENT_TXNS = 1024


def remember(shard: Shard, txn: int, version: int) -> None:
    """Record that update ``txn`` (0: none) produced ``version`` of ``shard``."""
    if txn:
        shard.recent[txn] = version
        if len(shard.recent) > RECENT_TXNS:
            del shard.recent[next(iter(shard.recent))]


def applied(update: PendingUpdate, worker: int = NO_WORKER) -> int | None:
    """The version a retried update (same txn) already produced here, or None.

    A training push still held for its step counts as applied (at the
    shard's version): its retry is not held twice.
    """
    if not update.txn:
        return None
    done = update.shard.recent.get(update.txn)
    coord = update.tensor.coord
    if done is None and coord is not None and worker != NO_WORKER:
        held = coord.held_from(update.shard.index, worker)
        if held is not None and held.txn == update.txn:
            return update.shard.version
    return done


def check_on_top(update: PendingUpdate, version: int) -> None:
    """Raise BEHIND unless a forwarded update goes on top of ``version`` of its shard
    (this copy missed updates: the primary sends the whole shard instead)."""
    have = update.shard.version
    if have != version:
        raise StoreError(
            Status.BEHIND,
            f"shard {update.shard.index} of {update.tensor.meta.name!r} is at version "
            f"{have}, the update is for {version}",
        )
