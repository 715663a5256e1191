"""Training steps: the accumulates of tensors with a training mode, applied at
once (ssp, with the worker's clock) or held until the worker's group has pushed
the step (sync, hybrid) and applied as one sum; the reads that wait for them;
and the workers that fell silent. The rules are ``psd/coordination.py``'s;
this applies what they return."""

from __future__ import annotations

import builtins
from collections.abc import Callable

from irdma.protocol import NO_WORKER, Op, Status
from irdma.training.modes import Mode

from ..errors import StoreError
from . import replica_log, rules
from .apply import Applier
from .catalogue import Catalogue
from .outbox import Outbox
from .records import PendingUpdate, Tensor


class Steps:
    """Applies (or holds) the pushes of training workers."""

    def __init__(
        self,
        catalogue: Catalogue,
        applier: Applier,
        outbox: Outbox,
        clock: Callable[[], float],
    ) -> None:
        self.catalogue = catalogue
        self.applier = applier
        self.outbox = outbox
        self.clock = clock

    def push(self, update: PendingUpdate, worker: int, step: int) -> tuple[int, bool]:
        """Apply (or, in a lockstep mode, hold) a received update: (the shard's
        version, whether a read waiting for a step may go now)."""
        coord = update.tensor.coord
        release = self.applier.release
        if coord is None or update.op == Op.WRITE:
            return self.applier.commit(update), False
        update.materialize()  # it may be held for its step, past the client's answer
        mode = coord.mode
        name = update.tensor.meta.name
        if worker == NO_WORKER:
            if mode.steps_in_lockstep:
                release(update)
                raise StoreError(
                    Status.BAD_ARGUMENT,
                    f"tensor {name!r} is in {mode.kind} mode for {mode.workers} workers: "
                    "an accumulate must name its worker and step",
                )
            return self.applier.commit(update), False
        if mode.steps_in_lockstep and not update.whole_shard:
            release(update)
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"tensor {name!r} is in {mode.kind} mode: an accumulate must cover whole shards",
            )
        try:
            items = coord.push(update.shard.index, worker, step, update, self.clock())
        except StoreError:
            release(update)
            raise
        if mode.kind == "ssp":  # applied at once, with its worker's clock for the backups
            return self.applier.commit(update, pushed=(worker, step)), True
        if items is None:
            self.outbox.held(update, worker, step)
            return update.shard.version, False
        group = mode.group_of(worker)
        applied = coord.step(update.shard.index, worker)
        return self._apply_step(items, mode, group, applied, last=update), True

    def _apply_step(
        self,
        items: builtins.list[PendingUpdate],
        mode: Mode,
        group: int,
        applied: int,
        last: PendingUpdate | None = None,
    ) -> int:
        """Sum held deltas in worker order and apply them as one update (or set, for apply=set).

        ``last`` is the push that completed the step: the sum goes to the backups
        under its txn (they hold the others, forwarded when they were held), and
        every push's txn is remembered here, so a retry of any of them is answered.
        """
        first = items[0]
        txns = [u.txn for u in items]
        if last is not None:
            first.txn = last.txn
        dt = first.tensor.meta.np_dtype
        total = first.buffer.view(dt)
        rules.scale(total, first.alpha)
        for other in items[1:]:
            rules.accumulate_into(total, other.buffer.view(dt), other.alpha)
            self.applier.release(other)
        first.alpha = 1.0
        if mode.apply == "set":
            first.op = Op.WRITE
        version = self.applier.commit(first, (group, applied))
        for txn in txns:
            replica_log.remember(first.shard, txn, version)
        return version

    def waits_for(
        self, key: int, index: int, worker: int, step: int, layout: int = 0
    ) -> builtins.list[int]:
        """The workers a read of shard ``index`` by ``worker`` for ``step`` waits for.

        [] means the read may go now. Anonymous reads (NO_WORKER) and async
        tensors never wait. Raises StoreError if the read could never go.
        """
        tensor = self.catalogue.get(key, layout)
        coord = tensor.coord
        if coord is None or worker == NO_WORKER or index not in tensor.shards:
            return []
        coord.check_worker(worker, self.clock())
        return coord.blockers(index, worker, step)

    def expire(self, key: int, index: int, worker: int, step: int) -> builtins.list[int]:
        """After a read waited: handle the workers it waits for that fell silent.

        Per the mode's ``on_timeout``: raise WORKER_LOST naming them, or
        evict them (applying any step they held up) and return them.
        """
        tensor = self.catalogue.get(key)
        coord = tensor.coord
        if coord is None or worker == NO_WORKER:
            return []
        blockers = coord.blockers(index, worker, step)
        lost = coord.lost(blockers, self.clock())
        if not lost:
            return []
        mode = coord.mode
        if mode.on_timeout == "error":
            raise StoreError(
                Status.WORKER_LOST,
                f"tensor {tensor.meta.name!r}: worker(s) {', '.join(map(str, lost))} sent nothing "
                f"for {mode.worker_timeout:g} s while worker {worker} waits for step {step} "
                f"({mode.describe()})",
            )
        for index, steps in coord.evict(lost).items():
            for group, items in steps:
                applied = coord.applied_steps(index)[group]
                self._apply_step(items, mode, group, applied)
        return lost

    def hold(self, update: PendingUpdate, worker: int, step: int) -> None:
        """Hold a push its primary holds for ``step``, as the primary does."""
        coord = update.tensor.coord
        try:
            if coord is None:
                raise StoreError(
                    Status.BAD_ARGUMENT,
                    f"tensor {update.tensor.meta.name!r} has no training mode here to hold "
                    f"a push of worker {worker} in",
                )
            replaced = coord.hold(update.shard.index, worker, step, update)
        except StoreError:
            self.applier.release(update)
            raise
        if replaced is not None and replaced is not update:
            self.applier.release(replaced)

    def follow(
        self,
        tensor: Tensor,
        index: int,
        applied: dict[int, int] | None = None,
        clocks: dict[int, int] | None = None,
    ) -> None:
        """Advance this copy's coordinator to the primary's applied steps (group ->
        count) and ssp clocks (worker -> steps pushed), so it can take over the
        tensor's training mode where the primary left it."""
        coord = tensor.coord
        if coord is None:
            return
        shard = tensor.shards[index]
        for group, count in (applied or {}).items():
            for held in coord.follow(index, group, count):
                # In the primary's sum: a retry of it is answered, not held again.
                replica_log.remember(shard, held.txn, shard.version)
                self.applier.release(held)
        if clocks:
            coord.follow_clocks(index, clocks)

    def let_go(self, tensor: Tensor, index: int) -> None:
        """Let go of the pushes held on a shard replaced by its primary's copy."""
        if tensor.coord is not None:
            for held in tensor.coord.release_held(index):
                self.applier.release(held)
