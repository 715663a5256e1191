"""The store's blocks in the arena: allocation, pins, copies kept for readers,
and publishing where each shard is.

Consistency rule: a reader pins the block it sends from. An update applies in
place only when nothing pins the shard's block; otherwise it builds a new
block and swaps it in (copy-on-write), so bytes being sent never change under
a reader. Readers that pin nothing (a same-host client copying out of its
mapping of the arena, an RDMA READ) check the shard's directory slot instead
(``psd/directory.py``): every change to a shard's bytes, block, version or
stamp happens between a ``begin`` and a ``publish`` of its slot, and a block
replaced meanwhile is freed only once the slot names its successor.

Copies kept for readers of older whole-tensor writes (``copies``) use free
arena room only: when an allocation finds none, the older copies no reader's
lease holds (``leases``) are freed, then such previous ones, then held ones
too (a lease never costs a write).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable

import numpy as np

from irdma.protocol import Status
from irdma.protocol.messages import wire_stamp

from ..arena import Arena, ArenaFullError, Block
from ..errors import StoreError
from . import copies
from .leases import Leases
from .records import Shard


class Blocks:
    """The arena's blocks as the store uses them, and the directory naming them."""

    def __init__(self, arena: Arena, clock: Callable[[], float] = time.monotonic) -> None:
        self.arena = arena
        self.directory = arena.directory
        self._clock = clock
        # Readers' leases on whole-tensor writes: the copies they hold are kept.
        self.leases = Leases(clock)
        # Shards keeping copies of older writes, so the arena can take them back.
        self.prevs: dict[tuple[int, int], Shard] = {}
        # Blocks replaced during the update being applied: freed once the
        # directory names their successors (readers of them then retry).
        self._replaced: list[Block] = []

    def pin(self, block: Block) -> Block:
        block.pins += 1
        return block

    def unpin(self, block: Block) -> None:
        block.pins -= 1
        if block.retired and block.pins == 0:
            self.arena.free(block)

    def retire(self, block: Block) -> None:
        """Free ``block`` once nothing pins it."""
        block.retired = True
        if block.pins == 0:
            self.arena.free(block)

    def alloc(self, nbytes: int, what: str) -> Block:
        """A block, or StoreError (NO_SPACE) naming ``what`` it was for."""
        try:
            return self.alloc_or_reclaim(nbytes)
        except ArenaFullError as exc:
            raise StoreError(Status.NO_SPACE, f"arena full: {what}: {exc}") from None

    def zeroed(self, nbytes: int, what: str) -> Block:
        """A zero-filled block (freed blocks hold old bytes)."""
        block = self.alloc(nbytes, what)
        self.arena.view(block)[:] = 0
        return block

    def alloc_or_reclaim(self, nbytes: int) -> Block:
        """A block, taking back the previous copies of whole-tensor writes if need be."""
        try:
            return self.arena.alloc(nbytes)
        except ArenaFullError:
            if not self.prevs:
                raise
        # What no reader holds first, older copies before previous ones.
        for let_go in (self.drop_older, self._drop_free_prevs):
            if let_go():
                try:
                    return self.arena.alloc(nbytes)
                except ArenaFullError:
                    pass
        self.drop_prevs()  # held ones too: a lease never costs a write
        return self.arena.alloc(nbytes)

    def reserve(self, nbytes: int) -> Block | None:
        """A staging block for incoming bytes, or None when the arena has no room."""
        try:
            return self.alloc_or_reclaim(nbytes)
        except ArenaFullError:
            return None

    def drop_older(self) -> bool:
        """Free the copies kept beyond each shard's previous one that no lease
        holds; whether any were."""
        freed = False
        for (key, _), shard in list(self.prevs.items()):
            for block in copies.let_go_older(shard, self.leases.held(key)):
                self.retire(block)
                freed = True
            self._kept(key, shard)
        return freed

    def _drop_free_prevs(self) -> bool:
        """Free the previous copies no lease holds; whether any were."""
        freed = False
        for (key, _), shard in list(self.prevs.items()):
            block = copies.let_go_prev(shard, self.leases.held(key))
            if block is not None:
                self.retire(block)
                self.directory.set_prev(shard.slot, 0)  # see ``forget_copies``
                freed = True
            self._kept(key, shard)
        return freed

    def _kept(self, key: int, shard: Shard) -> None:
        if not copies.keeps_any(shard):
            self.prevs.pop((key, shard.index), None)

    def trim(self, keys: set[int]) -> None:
        """Free the older copies of tensors ``keys`` past keeping now that no lease
        holds them (a lease on them ended)."""
        now = self._clock()
        for (key, _), shard in list(self.prevs.items()):
            if key in keys:
                for block in copies.trim(shard, now, self.leases.held(key)):
                    self.retire(block)
                self._kept(key, shard)

    def drop_prevs(self) -> None:
        """Free every copy kept for readers of an older whole-tensor write."""
        for key, index in list(self.prevs):
            self.forget_copies(key, self.prevs[(key, index)])

    def forget_copies(self, key: int, shard: Shard) -> None:
        """Free the shard's kept copies of older whole-tensor writes."""
        self.prevs.pop((key, shard.index), None)
        had = shard.prev is not None
        for block in copies.let_go_all(shard):
            self.retire(block)
        if had:
            # Readers take the previous copy's stamp from the slot: one that is
            # gone must not send them after it (a round asking for STAMP_GONE).
            self.directory.set_prev(shard.slot, 0)

    def keep_previous(self, key: int, shard: Shard, block: Block, stamp: int) -> None:
        """Make ``block`` the shard's copy of whole-tensor write ``stamp``, the
        current one kept for its readers (see ``copies``)."""
        held = self.leases.held(key)
        self._replaced += copies.keep_previous(shard, block, stamp, self._clock(), held)
        self.prevs[(key, shard.index)] = shard

    def swap(self, shard: Shard, block: Block) -> None:
        """Make ``block`` the shard's; the old one is freed by ``publish``."""
        self._replaced.append(shard.block)
        shard.block = block

    def copy_on_write(self, shard: Shard) -> Block:
        """A new block holding the shard's bytes, to change while readers pin its own."""
        new = self.alloc(shard.nbytes, f"copy-on-write of shard {shard.index}")
        self.arena.view(new, 0, shard.nbytes)[:] = self.arena.view(shard.block, 0, shard.nbytes)
        return new

    def overwrite(self, shard: Shard, data: np.ndarray, what: str) -> None:
        """Replace all of the shard's bytes with ``data`` (a new block if its own is
        pinned), inside a ``begin`` of its slot that ``publish`` ends."""
        if shard.block.pins:
            block = self.alloc(shard.nbytes, what)
            self.arena.view(block, 0, shard.nbytes)[:] = data
            self.directory.begin(shard.slot)
            self.swap(shard, block)
        else:
            self.directory.begin(shard.slot)
            self.arena.view(shard.block, 0, shard.nbytes)[:] = data

    def place(self, key: int, layout: int, shard: Shard) -> None:
        """Give a new shard its directory slot and publish it."""
        shard.slot = self.directory.place(key, layout, shard.index)
        self.publish(shard)

    def publish(self, shard: Shard) -> None:
        """Tell the directory where the shard is now (its block, version, stamp), then
        free the blocks it replaced. Call after changing any of them."""
        prev = wire_stamp(shard.prev_stamp) if shard.prev is not None else 0
        self.directory.publish(
            shard.slot, shard.block.offset, prev, shard.version, wire_stamp(shard.stamp)
        )
        replaced, self._replaced = self._replaced, []
        for block in replaced:
            self.retire(block)

    def settle(self, shard: Shard) -> None:
        """End a ``begin`` of the shard's slot that changed nothing (nothing was swapped out)."""
        self.directory.settle(shard.slot)
        self._replaced.clear()

    def forget(self, key: int, shard: Shard) -> None:
        """Free a shard's slot and memory (a reader of the slot sees it freed first)."""
        self.directory.free(shard.slot)
        shard.slot = -1
        self.retire(shard.block)
        self.forget_copies(key, shard)

    def checksum(self, shard: Shard) -> int:
        """CRC-32 of a shard's bytes: tells two copies at one version apart."""
        return zlib.crc32(self.arena.view(shard.block, 0, shard.nbytes).data)
