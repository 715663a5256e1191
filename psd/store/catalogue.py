"""The catalogue of tensors one daemon holds: by key and by name, created,
replaced, renamed and deleted all or nothing, and found for a request
(checking its layout, dtype, shard and byte range)."""

from __future__ import annotations

import builtins
import dataclasses
import heapq
from collections.abc import Callable
from operator import attrgetter

from irdma.protocol import DTYPE_ANY, DTYPE_NAMES, Status, TensorMeta
from irdma.protocol.bodies import StatRecord
from irdma.training.modes import Mode

from ..coordination import Coordinator
from ..errors import StoreError
from .blocks import Blocks
from .records import PendingUpdate, Shard, Tensor

# How many deleted tensors' keys a daemon remembers (a few hundred KiB at most, sent
# whole in catch-up answers). A replica away for more deletes than this keeps the
# copies of the oldest ones (and offers them to a primary that lacks them): a
# deleted tensor may come back, nothing written is lost.
TOMBSTONES_KEPT = 4096


class Catalogue:
    """The tensors held here, with their shards' blocks in ``blocks``.

    ``owns(key, shard)`` says whether this daemon holds that shard (placement
    comes from the cluster config; the store does not compute it).
    """

    def __init__(self, blocks: Blocks, owns: Callable[[int, int], bool]) -> None:
        self.blocks = blocks
        self.owns = owns
        self.tensors: dict[int, Tensor] = {}
        # Each tensor's key by its name (a renamed tensor's key is not its name's).
        self.keys: dict[str, int] = {}
        # Keys of tensors a client deleted here, oldest first (tombstones). A replica
        # that was away drops its copy of a tensor only on its primary's word that it
        # was deleted, never because the primary lacks it: that primary may have
        # restarted empty, and its peers' copies are then the only ones left.
        self.deleted: dict[int, None] = {}

    # -- changes ------------------------------------------------------------

    def create(
        self, meta: TensorMeta, *, replace: bool = False, exclusive: bool = False
    ) -> tuple[Tensor, bool, Tensor | None]:
        """Create the local shards of ``meta``; return (tensor, created, the tensor
        it replaced or None).

        Creating a tensor that exists with the same layout is a no-op
        (unless ``exclusive``). A different layout is refused unless
        ``replace``. All local shards are allocated, or none; the tensor
        replaced is dropped only once they are.
        """
        key = meta.key
        mode, old, kept = self._admit(meta, replace, exclusive)
        if kept:
            assert old is not None  # kept: the tensor there already is the one asked for
            return old, False, None
        shards = self._alloc_shards(meta)
        if old is not None:
            # Versions go on above the old tensor's, shard by shard (a shard's
            # replicas are the same daemons under any layout of its key, so they
            # agree): a reader that saw the old shard is not taken back, and a
            # replica that missed the replace is behind, not ahead.
            for index, shard in shards.items():
                before = old.shards.get(index)
                shard.version = before.version + 1 if before is not None else 0
            self._drop(old)
        for shard in shards.values():
            self.blocks.place(key, meta.layout, shard)
        coord: Coordinator[PendingUpdate] | None = (
            None if mode.kind == "async" else Coordinator(meta.name, mode, list(shards))
        )
        tensor = Tensor(meta, shards, coord=coord)
        self.tensors[key] = tensor
        self.keys[meta.name] = key
        self.deleted.pop(key, None)
        return tensor, True, old

    def check_create(
        self, meta: TensorMeta, *, replace: bool = False, exclusive: bool = False
    ) -> None:
        """Raise what ``create`` would raise now (a layout refused, no room); change
        nothing stored (copies kept for readers of older writes may be given back
        for the room, as any allocation does).

        A client replacing a tensor asks every daemon this first, so one with
        no room does not leave the old tensor only where it refused.
        """
        _, _, kept = self._admit(meta, replace, exclusive)
        if not kept:
            for shard in self._alloc_shards(meta, zero=False).values():
                self.blocks.arena.free(shard.block)

    def check_moved(self, meta: TensorMeta) -> None:
        """Refuse (MOVED) a client's create of ``meta`` where its name is held here
        under another key, or its key under another name: the client then finds
        the tensor by name and creates at the key it has (or at a free one)."""
        elsewhere = self.keys.get(meta.name)
        if elsewhere is not None and elsewhere != meta.key:
            raise StoreError(
                Status.MOVED, f"tensor {meta.name!r} is placed by key {elsewhere:#018x} here"
            )
        there = self.tensors.get(meta.key)
        if there is not None and there.meta.name != meta.name:
            raise StoreError(
                Status.MOVED,
                f"key {meta.key:#018x} of {meta.name!r} holds tensor {there.meta.name!r} here",
            )

    @staticmethod
    def mode_of(meta: TensorMeta) -> Mode:
        """The training mode ``meta``'s options name; BAD_ARGUMENT if they name none."""
        try:
            return Mode.from_options(meta.options)
        except ValueError as exc:
            raise StoreError(Status.BAD_ARGUMENT, f"tensor {meta.name!r}: {exc}") from None

    def owns_any(self, meta: TensorMeta) -> bool:
        """Whether this daemon is placed to hold some shard of ``meta``."""
        return any(self.owns(meta.key, i) for i in range(meta.num_shards))

    def rename(self, key: int, old: str, new: str) -> Tensor:
        """Give the tensor at ``key`` called ``old`` the name ``new``; its shards stay.

        Each local shard's version goes up by one, so a replica that missed
        the rename (down meanwhile) is behind and gets the shard whole, with
        the new name, when it catches up. The layout fingerprint covers the
        name, so a reader still holding the old name's layout (one-sided,
        through the directory, or asking) is told it is stale.
        """
        tensor = self.tensors.get(key)
        if tensor is None or tensor.meta.name != old:
            raise StoreError(Status.NOT_FOUND, f"no tensor {old!r} at key {key:#018x} here")
        if new == old:
            return tensor
        meta = tensor.meta = dataclasses.replace(tensor.meta, name=new, place=key)
        if tensor.coord is not None:
            tensor.coord.name = new
        if self.keys.get(old) == key:
            del self.keys[old]
        self.keys[new] = key
        directory = self.blocks.directory
        for shard in tensor.shards.values():
            directory.begin(shard.slot)
            directory.relabel(shard.slot, meta.layout)
            shard.version += 1
            self.blocks.publish(shard)
        return tensor

    def delete(self, key: int, name: str | None = None, *, tombstone: bool = True) -> Tensor:
        """Delete the tensor at ``key`` (only if it is called ``name``, when given).

        ``tombstone``: a client's delete, remembered (``deleted``) so replicas
        that missed it drop their copies; not when this daemon merely stops
        keeping the tensor (its last shard dropped, a rename's leftover).
        """
        tensor = self.tensors.get(key)
        if tensor is None or (name is not None and tensor.meta.name != name):
            what = f"tensor {name!r}" if name is not None else "tensor"
            raise StoreError(Status.NOT_FOUND, f"no {what} with key {key:#018x} here")
        del self.tensors[key]
        if self.keys.get(tensor.meta.name) == key:
            del self.keys[tensor.meta.name]
        self._drop(tensor)
        if tombstone:
            self.note_deleted(key)
        return tensor

    def note_deleted(self, key: int) -> None:
        """Remember that the tensor at ``key`` was deleted (here, or on a primary's word),
        forgetting the oldest such record beyond ``TOMBSTONES_KEPT``."""
        self.deleted.pop(key, None)
        self.deleted[key] = None
        while len(self.deleted) > TOMBSTONES_KEPT:
            del self.deleted[next(iter(self.deleted))]

    def add_shard(self, tensor: Tensor, index: int) -> Shard:
        """A new, zero-filled local shard of an existing tensor."""
        _, nbytes = tensor.meta.shard_span(index)
        block = self.blocks.zeroed(nbytes, f"copying {tensor.meta.name!r} shard {index}")
        shard = Shard(index, nbytes, block)
        self.blocks.place(tensor.meta.key, tensor.meta.layout, shard)
        tensor.shards[index] = shard
        if tensor.coord is not None:
            tensor.coord.add_shard(index)
        return shard

    def drop_shard(self, key: int, index: int) -> Tensor | None:
        """Forget a local shard; return its tensor if that deleted it (its last shard)."""
        tensor = self.tensors.get(key)
        if tensor is None or index not in tensor.shards:
            return None
        self.blocks.forget(key, tensor.shards.pop(index))
        return self.delete(key, tombstone=False) if not tensor.shards else None

    def _admit(
        self, meta: TensorMeta, replace: bool, exclusive: bool
    ) -> tuple[Mode, Tensor | None, bool]:
        """Check ``meta`` against what exists under its key: (its mode, the tensor
        there or None, whether that tensor is kept as it is: the same layout)."""
        mode = self.mode_of(meta)
        old = self.tensors.get(meta.key)
        if old is None:
            return mode, None, False
        if old.meta.name != meta.name:
            raise StoreError(
                Status.MOVED,
                f"key {meta.key:#018x} of {meta.name!r} holds tensor {old.meta.name!r} here",
            )
        if exclusive:
            raise StoreError(Status.EXISTS, f"tensor {meta.name!r} exists")
        if old.meta.same_layout(meta):
            old_mode = Mode.from_options(old.meta.options)
            if "mode" in meta.options and mode != old_mode:
                raise StoreError(
                    Status.EXISTS,
                    f"tensor {meta.name!r} exists in mode "
                    f"{old_mode.describe()}, not {mode.describe()} "
                    "(replace it to change the mode)",
                )
            return mode, old, True
        if not replace:
            if old.meta.dtype != meta.dtype:
                raise StoreError(
                    Status.DTYPE_MISMATCH,
                    f"tensor {meta.name!r} is {old.meta.dtype}, not {meta.dtype} "
                    "(replace it to change the dtype)",
                )
            raise StoreError(
                Status.SHAPE_MISMATCH,
                f"tensor {meta.name!r} has shape {old.meta.shape} and shard size "
                f"{old.meta.shard_size}, not {meta.shape} / {meta.shard_size} "
                "(replace it to change them)",
            )
        return mode, old, False

    def _alloc_shards(self, meta: TensorMeta, zero: bool = True) -> dict[int, Shard]:
        """Blocks for the shards of ``meta`` this daemon owns, all or none (zero-filled:
        freed blocks hold old bytes)."""
        shards: dict[int, Shard] = {}
        blocks = self.blocks
        try:
            for index in range(meta.num_shards):
                if self.owns(meta.key, index):
                    _, nbytes = meta.shard_span(index)
                    what = f"creating {meta.name!r} shard {index}"
                    block = blocks.zeroed(nbytes, what) if zero else blocks.alloc(nbytes, what)
                    shards[index] = Shard(index, nbytes, block)
        except StoreError:
            for s in shards.values():
                blocks.arena.free(s.block)
            raise
        return shards

    def _drop(self, tensor: Tensor) -> None:
        """Free a deleted or replaced tensor's blocks and any deltas held for its steps."""
        for s in tensor.shards.values():
            self.blocks.forget(tensor.meta.key, s)
        if tensor.coord is not None:
            for update in tensor.coord.held():
                update.release(self.blocks.arena)

    # -- lookups ------------------------------------------------------------

    def get(self, key: int, layout: int = 0) -> Tensor:
        tensor = self.tensors.get(key)
        if tensor is None:
            raise StoreError(Status.NOT_FOUND, f"no tensor with key {key:#018x} here")
        if layout and layout != tensor.meta.layout:
            raise StoreError(
                Status.STALE_LAYOUT,
                f"tensor {tensor.meta.name!r} was redefined: now {tensor.meta.dtype} "
                f"{tensor.meta.shape}",
            )
        return tensor

    def named(self, name: str) -> Tensor:
        """The tensor called ``name`` here, whatever its key."""
        key = self.keys.get(name)
        tensor = self.tensors.get(key) if key is not None else None
        if tensor is None or tensor.meta.name != name:
            raise StoreError(Status.NOT_FOUND, f"no tensor {name!r} here")
        return tensor

    def info(self, tensor: Tensor) -> StatRecord:
        """The stat record of a tensor as this daemon sees it."""
        return StatRecord(
            meta=tensor.meta,
            version=tensor.version,
            mtime=tensor.mtime,
            ctime=tensor.ctime,
            shards={i: s.version for i, s in sorted(tensor.shards.items())},
            evicted=tuple(sorted(tensor.coord.evicted)) if tensor.coord is not None else None,
        )

    def list(self, prefix: str = "", limit: int = 0) -> builtins.list[StatRecord]:
        """Stat records of the tensors this daemon holds shards of, by name; only
        the first ``limit`` of them if it is not 0.

        The client merges the records of every daemon, so a tensor's listed
        version is the sum over all its shards, as ``stat`` reports it. (A
        tensor among the first ``limit`` of all daemons together is among the
        first ``limit`` of each daemon holding it, so a merged limited listing
        is whole.)
        """
        held = [t for t in self.tensors.values() if t.shards and t.meta.name.startswith(prefix)]
        by_name = attrgetter("meta.name")
        chosen = heapq.nsmallest(limit, held, key=by_name) if limit else sorted(held, key=by_name)
        return [self.info(t) for t in chosen]

    def shard(
        self, key: int, index: int, layout: int = 0, dtype: int = DTYPE_ANY
    ) -> tuple[Tensor, Shard]:
        """A tensor's local shard ``index``, after checking layout and dtype."""
        tensor = self.get(key, layout)
        if dtype != DTYPE_ANY and dtype != tensor.meta.dtype_code:
            raise StoreError(
                Status.DTYPE_MISMATCH,
                f"tensor {tensor.meta.name!r} is {tensor.meta.dtype}, request says "
                f"{DTYPE_NAMES.get(dtype, f'dtype code {dtype}')}",
            )
        if index >= tensor.meta.num_shards:
            raise StoreError(
                Status.OUT_OF_RANGE,
                f"tensor {tensor.meta.name!r} has {tensor.meta.num_shards} shards, "
                f"no shard {index}",
            )
        shard = tensor.shards.get(index)
        if shard is None:
            raise StoreError(
                Status.NOT_OWNER, f"shard {index} of {tensor.meta.name!r} is not held here"
            )
        return tensor, shard

    def span(
        self, key: int, index: int, offset: int, size: int, layout: int = 0, dtype: int = 0
    ) -> tuple[Tensor, Shard]:
        """A tensor's local shard ``index``, after also checking that bytes
        ``[offset, offset+size)`` are inside it."""
        tensor, shard = self.shard(key, index, layout, dtype)
        if offset > shard.nbytes or size > shard.nbytes - offset:
            raise StoreError(
                Status.OUT_OF_RANGE,
                f"bytes [{offset}, {offset + size}) are outside shard {shard.index} of "
                f"{tensor.meta.name!r} ({shard.nbytes} bytes)",
            )
        return tensor, shard
