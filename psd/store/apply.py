"""Applying a fully received update to its shard: a write, an accumulate, or a
whole-tensor write's shard (which keeps the copy it replaces for readers).

Updates are received into a staging buffer first and applied here
synchronously, so a broken connection never leaves a half-written shard. An
update applies in place only where nothing pins the shard's block, else to a
copy swapped in (``blocks``); the arithmetic is ``rules``'.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import numpy as np

from irdma.protocol import Op, Status

from ..arena import ArenaFullError, Block
from ..errors import StoreError
from . import copies, replica_log, rules
from .blocks import Blocks
from .catalogue import Catalogue
from .outbox import Outbox
from .records import PendingUpdate


class Applier:
    """Applies pending updates to the catalogue's shards, recording them for the backups."""

    def __init__(self, blocks: Blocks, catalogue: Catalogue, outbox: Outbox) -> None:
        self.blocks = blocks
        self.catalogue = catalogue
        self.outbox = outbox

    def release(self, update: PendingUpdate) -> None:
        update.release(self.blocks.arena)

    def commit(
        self,
        update: PendingUpdate,
        step: tuple[int, int] | None = None,
        pushed: tuple[int, int] | None = None,
    ) -> int:
        """Apply a fully received update; return the shard's new version.

        ``step``: (group, steps applied) of a lockstep step's sum; ``pushed``:
        (worker, step) of an ssp worker's push. Both go to the backups with it.

        Raises StoreError (NO_SPACE) only when copy-on-write needs a block and
        the arena has none; nothing changes then.
        """
        shard = update.shard
        if self.catalogue.tensors.get(update.tensor.meta.key) is not update.tensor or (
            update.tensor.shards.get(shard.index) is not shard
        ):
            self.release(update)
            raise StoreError(
                Status.NOT_FOUND,
                f"tensor {update.tensor.meta.name!r} was deleted or replaced during the update",
            )
        if update.stamp and not (update.op == Op.WRITE and update.whole_shard):
            self.release(update)
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"a whole-tensor write's stamp needs a WRITE of all of shard {shard.index} "
                f"of {update.tensor.meta.name!r}",
            )
        # Backups apply the update as received: its bytes are kept for them
        # (``_for_backups``).
        payload: np.ndarray | None = None
        kept: Block | None = None  # the staging block that holds ``payload``
        if self.outbox.wants(update):
            update.materialize()
            payload, kept = self._for_backups(update)
        if update.op == Op.WRITE:
            update.materialize()  # only accumulates are applied from where they lie
        # Readers that pin nothing retry while the slot says "changing".
        self.blocks.directory.begin(shard.slot)
        applied = stolen = False
        try:
            if update.stamp:
                self._stamped(update)
            elif update.op == Op.WRITE:
                self._write(update)
            else:
                self._accumulate(update)
            applied = True
        except BaseException:
            self.blocks.settle(shard)
            raise
        finally:
            if applied and kept is not None and update.staging is kept:
                update.staging, stolen = None, True  # kept for the backups: freed once forwarded
            self.release(update)  # frees staging unless it became the shard's block
        shard.version += 1
        shard.mtime = time.time()
        replica_log.remember(shard, update.txn, shard.version)
        self.blocks.publish(shard)
        if payload is not None:
            release = None if kept is None else self._keeper(kept, stolen)
            self.outbox.applied(update, payload, shard.version, step, pushed, release)
        return shard.version

    def _for_backups(self, update: PendingUpdate) -> tuple[np.ndarray, Block | None]:
        """The update's bytes as the backups need them, and the staging block they lie in
        if they are kept there (None: a copy).

        No copy where the staged bytes survive the update as they are: a write
        only reads them (or makes them the shard's block), and an accumulate onto
        a block nobody pins reads them as its source (``rules.accumulate_from``)
        instead of scaling them in place. Otherwise (bytes outside the arena, an
        accumulate onto a pinned block, which scales or sums into them) a copy.
        """
        staging = update.staging
        if staging is None or update.narrow is not None:
            return update.buffer.copy(), None
        if update.op == Op.WRITE:
            return update.buffer, staging
        if update.shard.block.pins:
            return update.buffer.copy(), None
        update.source = update.buffer  # read, not scaled: the backups get it as received
        return update.buffer, staging

    def _keeper(self, block: Block, staging: bool) -> Callable[[], None]:
        """How a block kept for the backups is given back once forwarded: freed if it
        is still staging, unpinned if it became the shard's (or a copy's) block."""
        if staging:
            return partial(self.blocks.arena.free, block)
        self.blocks.pin(block)  # unchanged while pinned: a later update copies first
        return partial(self.blocks.unpin, block)

    def _stamped(self, update: PendingUpdate) -> None:
        """A whole-tensor write's shard: new bytes in a new block, the old kept as ``prev``."""
        shard = update.shard
        key = update.tensor.meta.key
        blocks = self.blocks
        if update.staging is not None:
            block, update.staging = update.staging, None
        else:
            try:
                block = blocks.alloc_or_reclaim(shard.nbytes)
            except ArenaFullError:
                # No room for two copies: write over this one (no previous
                # copy is kept; a reader that needs it reads again).
                blocks.forget_copies(key, shard)
                self._write(update)
                copies.stamped_in_place(shard, update.stamp)
                return
            blocks.arena.view(block, 0, update.size)[:] = update.buffer
        blocks.keep_previous(key, shard, block, update.stamp)

    def _write(self, update: PendingUpdate) -> None:
        shard = update.shard
        blocks = self.blocks
        if update.staging is not None and update.whole_shard:
            blocks.swap(shard, update.staging)  # the staged bytes become the shard
            update.staging = None
            return
        if shard.block.pins:
            new = blocks.copy_on_write(shard)
            blocks.arena.view(new, update.offset, update.size)[:] = update.buffer
            blocks.swap(shard, new)
        else:
            blocks.arena.view(shard.block, update.offset, update.size)[:] = update.buffer

    def _accumulate(self, update: PendingUpdate) -> None:
        shard = update.shard
        blocks = self.blocks
        dt = update.tensor.meta.np_dtype
        if update.source is not None and not shard.block.pins:
            target = blocks.arena.view(shard.block, update.offset, update.size).view(dt)
            rules.accumulate_from(target, update.source.view(dt), update.alpha)
            update.source = None
            return
        update.materialize()
        delta = update.buffer.view(dt)
        if not shard.block.pins:
            target = blocks.arena.view(shard.block, update.offset, update.size).view(dt)
            rules.accumulate_into(target, delta, update.alpha)
            return
        if update.staging is not None and update.whole_shard:
            current = blocks.arena.view(shard.block, 0, update.size).view(dt)
            rules.accumulate_copy(current, delta, update.alpha)
            blocks.swap(shard, update.staging)
            update.staging = None
            return
        new = blocks.copy_on_write(shard)
        target = blocks.arena.view(new, update.offset, update.size).view(dt)
        rules.accumulate_into(target, delta, update.alpha)
        blocks.swap(shard, new)
