"""The tensors one daemon holds: ``Store`` composes the parts that keep and change them.

No I/O here: the server decodes frames and calls these methods, so every
rule (validation, write, accumulate, versions, arena accounting) is testable
with plain numpy. The parts, each of one role:

- ``records``: Shard, Tensor, and PendingUpdate (an update staged, then
  committed or released);
- ``blocks``: the arena's blocks, pins, copy-on-write, the directory's slots,
  and (with ``copies``) the copies kept for readers of older whole-tensor writes,
  past their rules where a reader's lease holds them (``leases``);
- ``catalogue``: the tensors by key and name, created, renamed, deleted, found;
- ``rules``: how a write or accumulate is applied, and the dtype rules;
- ``pending``: staging an update (room for its payload);
- ``apply``: applying a received update to its shard;
- ``replica_log``: the txns a shard applied (a retry is applied once), and
  whether a forwarded update sits on top of this copy;
- ``outbox``: the updates the backups must apply too;
- ``steps``: training workers' pushes, held or applied per the tensor's mode.

Callers use a part directly where that is clearer (``store.catalogue.named``,
``store.blocks.reserve``); the methods here are the ones that take several
parts, or tell the ``Waiters`` added that something a waiting read depends on
changed.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from irdma.protocol import DTYPE_ANY, NO_WORKER, Op, Status, TensorMeta

from ..arena import Arena, Block
from ..errors import StoreError
from . import replica_log, rules
from .apply import Applier
from .blocks import Blocks
from .catalogue import Catalogue
from .outbox import Commit, Outbox
from .pending import stage
from .records import PendingUpdate, Shard, Tensor
from .steps import Steps


class Waiters(Protocol):
    """Reads waiting for what the store changes (``psd/data_ops.py``)."""

    def wake(self) -> None:
        """Something a waiting read may depend on changed (a training step applied,
        a worker evicted, a training tensor gone): each read re-checks its condition."""


class Store:
    """The tensors one daemon holds, with their shards in ``arena``.

    ``owns(key, shard)`` says whether this daemon holds that shard (placement
    comes from the cluster config; the store does not compute it). With
    ``replicated``, every update applied here as a primary is recorded for the
    replicator, which forwards it to the backups in this order.
    """

    def __init__(
        self,
        arena: Arena,
        owns: Callable[[int, int], bool],
        clock: Callable[[], float] = time.monotonic,
        *,
        replicated: bool = False,
    ) -> None:
        self.arena = arena
        self.clock = clock
        self.blocks = Blocks(arena, clock)
        self.directory = self.blocks.directory
        self.catalogue = Catalogue(self.blocks, owns)
        self.outbox = Outbox(replicated)
        self.applier = Applier(self.blocks, self.catalogue, self.outbox)
        self.steps = Steps(self.catalogue, self.applier, self.outbox, clock)
        self.owns = owns
        self.tensors = self.catalogue.tensors
        self.keys = self.catalogue.keys
        self._waiters: list[Waiters] = []

    def add_waiters(self, waiters: Waiters) -> None:
        """Wake ``waiters`` whenever something a waiting read depends on changes."""
        self._waiters.append(waiters)

    def _wake(self) -> None:
        for waiters in self._waiters:
            waiters.wake()

    # -- the catalogue's changes (a training tensor dropped wakes its readers) --

    def create(
        self, meta: TensorMeta, *, replace: bool = False, exclusive: bool = False
    ) -> tuple[Tensor, bool]:
        """Create the local shards of ``meta``; return (tensor, created). See
        ``Catalogue.create``."""
        tensor, created, dropped = self.catalogue.create(meta, replace=replace, exclusive=exclusive)
        self._dropped(dropped)
        return tensor, created

    def check_create(
        self, meta: TensorMeta, *, replace: bool = False, exclusive: bool = False
    ) -> None:
        """Raise what ``create`` would raise now; change nothing stored."""
        self.catalogue.check_create(meta, replace=replace, exclusive=exclusive)

    def delete(self, key: int, name: str | None = None, *, tombstone: bool = True) -> TensorMeta:
        """Delete the tensor at ``key`` (only if it is called ``name``, when given);
        ``tombstone``: remember it (a client's delete, see ``Catalogue.delete``)."""
        tensor = self.catalogue.delete(key, name, tombstone=tombstone)
        self._dropped(tensor)
        return tensor.meta

    def rename(self, key: int, old: str, new: str) -> Tensor:
        """Give the tensor at ``key`` called ``old`` the name ``new``; its shards stay."""
        return self.catalogue.rename(key, old, new)

    def drop_shard(self, key: int, index: int) -> None:
        """Forget a local shard this daemon no longer keeps (no tombstone: see
        ``drop_deleted`` for a tensor deleted while this daemon was away)."""
        self._dropped(self.catalogue.drop_shard(key, index))

    def drop_deleted(self, key: int, index: int) -> None:
        """Forget a local shard of a tensor deleted while this daemon was away, and
        remember the delete (this daemon may be the shard's primary next)."""
        self.drop_shard(key, index)
        self.catalogue.note_deleted(key)

    @property
    def deleted(self) -> tuple[int, ...]:
        """The keys of the tensors deleted here that this daemon remembers, oldest first."""
        return tuple(self.catalogue.deleted)

    def was_deleted(self, key: int) -> bool:
        return key in self.catalogue.deleted

    def _dropped(self, tensor: Tensor | None) -> None:
        if tensor is not None and tensor.coord is not None:
            self._wake()  # reads waiting on it now fail with NOT_FOUND

    # -- reads ----------------------------------------------------------------

    def read_view(
        self, key: int, index: int, offset: int, size: int, layout: int = 0, dtype: int = 0
    ) -> tuple[Shard, np.ndarray]:
        """Validate a read; return the shard and a view of the bytes (not pinned yet)."""
        _, shard = self.catalogue.span(key, index, offset, size, layout, dtype)
        return shard, self.arena.view(shard.block, offset, size)

    def read_narrowed(self, key: int, offset: int, view: np.ndarray, wire: int) -> memoryview:
        """A read ``view`` (at byte ``offset`` of its shard) narrowed to ``wire``, as new bytes."""
        return rules.narrowed(self.tensors[key].meta, offset, view, wire)

    def stored_nbytes(self, key: int, wire: int, wire_nbytes: int) -> int:
        """Tensor bytes of ``wire_nbytes`` bytes of elements in the ``wire`` dtype."""
        return rules.stored_nbytes(self.catalogue.get(key).meta, wire, wire_nbytes)

    def pin(self, block: Block) -> Block:
        return self.blocks.pin(block)

    # -- readers' leases on whole-tensor writes (``leases``) -------------------

    def lease(self, lease_id: int, key: int, stamp: int, seconds: float) -> float:
        """Hold tensor ``key``'s copies of write ``stamp`` (0: every copy) for a
        reader, for ``seconds`` (capped); renews or changes lease ``lease_id``.
        Returns the seconds granted; NOT_FOUND if no shard of ``key`` is here."""
        self.catalogue.get(key)
        granted, changed = self.blocks.leases.grant(lease_id, key, stamp, seconds)
        if changed is not None:
            self.blocks.trim({changed})
        return granted

    def release_lease(self, lease_id: int) -> None:
        """End lease ``lease_id`` (none such: nothing to do); what it alone held goes."""
        key = self.blocks.leases.release(lease_id)
        if key is not None:
            self.blocks.trim({key})

    def expire_leases(self) -> None:
        """End the leases that ran out; what they alone held goes."""
        keys = self.blocks.leases.expire()
        if keys:
            self.blocks.trim(keys)

    def unpin(self, block: Block) -> None:
        self.blocks.unpin(block)

    # -- updates --------------------------------------------------------------

    def begin_update(
        self,
        op: Op,
        key: int,
        index: int,
        offset: int,
        size: int,
        *,
        alpha: float = 1.0,
        layout: int = 0,
        dtype: int = DTYPE_ANY,
        wire: int = 0,
    ) -> PendingUpdate:
        """Validate a write or accumulate and reserve staging for its payload.

        With a ``wire`` dtype the payload is ``size`` bytes' worth of elements
        in that narrower dtype (``update.landing``), widened by ``update.widen``.
        """
        tensor, shard = self.catalogue.span(key, index, offset, size, layout, dtype)
        if wire:
            rules.wire_holder(tensor.meta, wire, offset, size)
        if op == Op.ACCUMULATE:
            rules.check_accumulate(tensor.meta, offset, size, alpha)
        return stage(self.blocks, op, tensor, shard, offset, size, alpha, wire)

    def abort(self, update: PendingUpdate) -> None:
        """The update will not be applied: give back what it holds."""
        update.release(self.arena)

    def commit(
        self,
        update: PendingUpdate,
        step: tuple[int, int] | None = None,
        pushed: tuple[int, int] | None = None,
    ) -> int:
        """Apply a fully received update; return the shard's new version (see
        ``Applier.commit``)."""
        return self.applier.commit(update, step, pushed)

    def push(self, update: PendingUpdate, worker: int = NO_WORKER, step: int = 0) -> int:
        """Apply (or, in a lockstep mode, hold) a client's update; return the shard's version.

        ``worker`` and ``step`` say whose gradient for which training step
        the update is; they matter only for tensors with a training mode.
        A shard of a whole-tensor write not later than the one the shard holds
        is refused (STALE_STAMP, ``rules.check_later``); a backup never checks
        this: it applies its primary's updates in the primary's order.
        """
        if update.stamp:
            try:
                rules.check_later(
                    update.tensor.meta, update.shard.index, update.shard.stamp, update.stamp
                )
            except StoreError:
                self.abort(update)
                raise
        version, changed = self.steps.push(update, worker, step)
        if changed:
            self._wake()
        return version

    def waits_for(
        self, key: int, index: int, worker: int, step: int, layout: int = 0
    ) -> builtins.list[int]:
        """The workers a read of shard ``index`` by ``worker`` for ``step`` waits for."""
        return self.steps.waits_for(key, index, worker, step, layout)

    def expire(self, key: int, index: int, worker: int, step: int) -> builtins.list[int]:
        """After a read waited: handle the workers it waits for that fell silent
        (``Steps.expire``); readers are woken if some were evicted."""
        lost = self.steps.expire(key, index, worker, step)
        if lost:
            self._wake()
        return lost

    def take_commits(self) -> builtins.list[Commit]:
        """The updates applied since the last call, oldest first."""
        return self.outbox.take()

    # -- what a backup gets from its primary ----------------------------------

    def applied(self, update: PendingUpdate, worker: int = NO_WORKER) -> int | None:
        """The version a retried update (same txn) already produced here, or None."""
        return replica_log.applied(update, worker)

    def commit_replica(
        self,
        update: PendingUpdate,
        version: int,
        step: tuple[int, int] | None = None,
        pushed: tuple[int, int] | None = None,
    ) -> int:
        """Apply an update forwarded by the shard's primary, which gave it ``version``.

        It must sit on top of this copy's version; otherwise this copy missed
        updates (BEHIND) and the primary sends the whole shard instead. With
        ``step`` (group, steps applied) it is a lockstep step's sum, with
        ``pushed`` (worker, step) an ssp worker's push, and this copy's
        training-mode bookkeeping follows the primary's.
        """
        update.replicate = False
        self._on_top(update, version - 1)
        tensor, index = update.tensor, update.shard.index
        done = self.applier.commit(update)
        self.steps.follow(
            tensor,
            index,
            {step[0]: step[1]} if step is not None else None,
            {pushed[0]: pushed[1] + 1} if pushed is not None else None,
        )
        return done

    def hold_replica(self, update: PendingUpdate, version: int, worker: int, step: int) -> int:
        """Hold a push the shard's primary holds for ``step`` (its shard at ``version``),
        as the primary does: if this copy takes over, the step completes with it."""
        self._on_top(update, version)
        self.steps.hold(update, worker, step)
        return update.shard.version

    def _on_top(self, update: PendingUpdate, version: int) -> None:
        try:
            replica_log.check_on_top(update, version)
        except StoreError:
            update.release(self.arena)  # nothing kept
            raise

    def install_shard(
        self,
        meta: TensorMeta,
        index: int,
        version: int,
        data: np.ndarray,
        txns: dict[int, int],
        steps: builtins.list[int] | None = None,
        stamp: int = 0,
        clocks: builtins.list[int] | None = None,
    ) -> Shard:
        """Replace this copy of a shard with the primary's (creating the tensor if needed).

        ``steps`` (lockstep) and ``clocks`` (ssp) are the primary's training-mode
        bookkeeping; pushes held here are let go (the primary sends the ones it
        holds right after the copy). Everything is checked before the tensor is
        (re)created: a refused copy changes nothing.
        """
        if not (0 <= index < meta.num_shards and self.owns(meta.key, index)):
            raise StoreError(
                Status.NOT_OWNER, f"shard {index} of {meta.name!r} is not placed on this daemon"
            )
        if data.nbytes != meta.shard_span(index)[1]:
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"shard {index} of {meta.name!r} is {meta.shard_span(index)[1]} bytes, "
                f"got {data.nbytes}",
            )
        tensor = self.tensors.get(meta.key)
        if tensor is not None and tensor.meta.name != meta.name:
            # Renamed while this copy was away: the primary's is the tensor now.
            self._dropped(self.catalogue.delete(meta.key, tombstone=False))
            tensor = None
        if tensor is None or not tensor.meta.same_layout(meta):
            tensor, _ = self.create(meta, replace=True)
        shard = tensor.shards.get(index)
        if shard is None:  # placed here since the tensor was (a move): make room for it
            shard = self.catalogue.add_shard(tensor, index)
        if data.nbytes != shard.nbytes:
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"shard {index} of {meta.name!r} is {shard.nbytes} bytes, got {data.nbytes}",
            )
        self.blocks.overwrite(shard, data, f"copy of shard {index} of {meta.name!r}")
        shard.version = version
        shard.mtime = time.time()
        shard.recent = dict(txns)
        # The copy replaces whatever this one was: no older write's copy is kept.
        shard.stamp = stamp
        self.blocks.forget_copies(meta.key, shard)
        self.blocks.publish(shard)
        self.steps.let_go(tensor, index)
        self.steps.follow(
            tensor,
            index,
            dict(enumerate(steps)) if steps else None,
            dict(enumerate(clocks)) if clocks else None,
        )
        return shard

    # -- what the replicator reads of a shard ---------------------------------

    def checksum(self, shard: Shard) -> int:
        """CRC-32 of a shard's bytes: tells two copies at one version apart."""
        return self.blocks.checksum(shard)

    def applied_steps(self, tensor: Tensor, index: int) -> builtins.list[int]:
        """The steps applied per group of a lockstep tensor's shard ([] otherwise)."""
        return tensor.coord.applied_steps(index) if tensor.coord is not None else []

    def clocks(self, tensor: Tensor, index: int) -> builtins.list[int]:
        """The ssp clocks (steps pushed per worker) of a tensor's shard ([] otherwise)."""
        return tensor.coord.clocks(index) if tensor.coord is not None else []

    def held_on(self, tensor: Tensor, index: int) -> builtins.list[tuple[int, int, PendingUpdate]]:
        """(worker, step, push) held for a lockstep step on a tensor's shard."""
        return tensor.coord.held_on(index) if tensor.coord is not None else []
