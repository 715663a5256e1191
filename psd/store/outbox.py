"""What the shard's backups must apply too: each update applied here as a
primary (and each push held for a lockstep step), in order, until the
replicator takes them (``take``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from irdma.protocol import NO_WORKER, Op

from .records import PendingUpdate


@dataclass(eq=False, slots=True)
class Commit:
    """An update applied here that a shard's backups must apply too, in this order."""

    key: int
    shard: int
    op: Op
    offset: int
    alpha: float
    layout: int
    dtype: int
    payload: np.ndarray  # the update's bytes as received (before any scaling)
    txn: int
    version: int  # the version the update produced
    # A lockstep training step's sum: its group, and the steps that group has
    # applied with it (0: not a step), so the backups' coordinators follow.
    group: int = 0
    steps_applied: int = 0
    stamp: int = 0  # the whole-tensor write it is part of (0: none)
    # A training worker's push (ssp, or held for a lockstep step: ``held``, and
    # ``version`` is then the shard's version it sits on), so the backups'
    # coordinators know it too and one of them can take over mid-step.
    pushed_by: int = NO_WORKER
    pushed_step: int = 0
    held: bool = False
    # Gives back the memory ``payload`` lies in (an arena block the store kept for
    # the backups rather than copy it), once every forward of it is over.
    release: Callable[[], None] | None = None
    holders: int = 0  # forwards of it not over yet

    def hold(self, forwards: int) -> None:
        """``forwards`` copies of it are queued for backups (0: none, given back now)."""
        self.holders += forwards
        if not self.holders:
            self.let_go()

    def let_go(self) -> None:
        """One forward of it is over (delivered or given up, and no send reading it)."""
        self.holders = max(0, self.holders - 1)
        if not self.holders and self.release is not None:
            release, self.release = self.release, None
            release()


def held_commit(update: PendingUpdate, worker: int, step: int, version: int) -> Commit:
    """A push held for lockstep ``step`` as forwarded to a backup, on top of shard
    ``version`` (its bytes copied: the step's sum scales the held one in place)."""
    meta = update.tensor.meta
    return Commit(
        meta.key,
        update.shard.index,
        update.op,
        update.offset,
        update.alpha,
        meta.layout,
        meta.dtype_code,
        update.buffer.copy(),
        update.txn,
        version,
        pushed_by=worker,
        pushed_step=step,
        held=True,
    )


class Outbox:
    """The commits waiting for the replicator (none are kept without replicas)."""

    def __init__(self, replicated: bool) -> None:
        self.replicated = replicated
        self.commits: list[Commit] = []

    def wants(self, update: PendingUpdate) -> bool:
        """Whether the backups must get ``update`` (not one forwarded to this copy)."""
        return self.replicated and update.replicate

    def applied(
        self,
        update: PendingUpdate,
        payload: np.ndarray,
        version: int,
        step: tuple[int, int] | None,
        pushed: tuple[int, int] | None,
        release: Callable[[], None] | None = None,
    ) -> None:
        """``update`` (its bytes as received: ``payload``, in memory ``release`` gives
        back once forwarded) produced ``version``."""
        meta = update.tensor.meta
        self.commits.append(
            Commit(
                meta.key,
                update.shard.index,
                update.op,
                update.offset,
                update.alpha,
                meta.layout,
                meta.dtype_code,
                payload,
                update.txn,
                version,
                *(step or (0, 0)),
                stamp=update.stamp,
                pushed_by=pushed[0] if pushed else NO_WORKER,
                pushed_step=pushed[1] if pushed else 0,
                release=release,
            )
        )

    def held(self, update: PendingUpdate, worker: int, step: int) -> None:
        """A push held for its lockstep step goes to the backups too (acknowledged once
        they have it), so a backup taking over mid-step has every acknowledged push."""
        if self.wants(update):
            self.commits.append(held_commit(update, worker, step, update.shard.version))

    def take(self) -> list[Commit]:
        """The updates applied since the last call, oldest first."""
        out, self.commits = self.commits, []
        return out
