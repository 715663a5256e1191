"""Tensors and shards held by one daemon, and the rules that change them.

No I/O here: the server decodes frames and calls these methods, so every
rule (validation, write, accumulate, versions, arena accounting) is testable
with plain numpy.

Consistency rule: a reader pins the block it sends from. An update applies in
place only when nothing pins the shard's block; otherwise it builds a new
block and swaps it in (copy-on-write), so bytes being sent never change under
a reader. Updates are received into a staging buffer first and applied
synchronously, so a broken connection never leaves a half-written shard.
Readers that pin nothing (a same-host client copying out of its mapping of
the arena, an RDMA READ) check the shard's directory slot instead
(``psd/directory.py``): every change to a shard's bytes, block, version or
stamp happens between a ``begin`` and a ``publish`` of its slot.

Whole-tensor writes: a write of whole shards carrying a ``stamp`` (one id
for every shard of one ``Client.write``) keeps the shard's previous copy
(``prev``) instead of overwriting it, so a reader that got some shards of
the previous write can still get the rest of that write (``copy_for``).
Copies older than that stay for ``OLDER_COPIES_KEPT`` seconds, at most
``OLDER_COPIES_MAX`` of them (``older``),
so a reader streaming a tensor that is rewritten back to back (the mount)
can finish the version it began. They use free arena room only: when an
allocation finds none, the older copies are freed, then the previous ones.
"""

from __future__ import annotations

import builtins
import dataclasses
import heapq
import math
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from irdma import narrowing
from irdma.dtypes import COMPUTE, is_narrow_float
from irdma.protocol import DTYPE_ANY, DTYPE_NAMES, NO_WORKER, Op, Status, TensorMeta
from irdma.protocol.messages import UNSTAMPED, wire_stamp
from irdma.sizes import ACCUMULATE_PIECE
from irdma.training.modes import Mode

from .arena import Arena, ArenaFullError, Block
from .coordination import Coordinator
from .errors import StoreError

# Recent update ids remembered per shard, so a client retrying an update
# (after a timeout or a failover) has it applied once. Retries come within a
# client timeout, so a bounded window suffices.
RECENT_TXNS = 1024
# How long a shard keeps copies older than its previous one (while the arena
# has room): what a reader streaming a tensor rewritten back to back has to
# finish the version it began.
OLDER_COPIES_KEPT = 5.0
# And at most this many of them. A tensor rewritten back to back otherwise keeps
# every copy of the last 5 s, so each write lands in arena room that no process
# has touched yet, and first touches (the daemon's, then every one-sided
# reader's) cost more than the copies: a 64 MiB write of 4 MiB shards took
# 134-169 ms instead of 12-19, and reads were 60-76 ms in some runs. With one
# older copy (prev and one more) each shard cycles through three blocks: writes
# 13-20 ms, reads 11-14 ms (3 daemons over shm).
OLDER_COPIES_MAX = 1
# Stamps a shard remembers having had (to tell a copy that is gone from one
# that has not arrived yet).
STAMPS_SEEN = 64


@dataclass(eq=False, slots=True)
class Shard:
    index: int
    nbytes: int
    block: Block
    version: int = 0
    mtime: float = 0.0
    # txn -> the version its update produced (insertion order = age).
    recent: dict[int, int] = field(default_factory=dict)
    # The whole-tensor write the bytes come from (0: none), and the copy the
    # one before it left (its block, stamp and version), while kept.
    stamp: int = 0
    prev: Block | None = None
    prev_stamp: int = 0
    prev_version: int = 0
    # Copies before ``prev``, oldest first: (stamp, block, version, replaced at).
    older: list[tuple[int, Block, int, float]] = field(default_factory=list)
    # The last stamps this shard had, kept or not: a read asking for one it
    # never had is early (the write is on its way), not late.
    stamps_seen: deque[int] = field(default_factory=lambda: deque(maxlen=STAMPS_SEEN))
    slot: int = -1  # its directory slot (-1: none; reads go through the daemon)

    def remember(self, txn: int, version: int) -> None:
        if txn:
            self.recent[txn] = version
            if len(self.recent) > RECENT_TXNS:
                del self.recent[next(iter(self.recent))]


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


@dataclass(eq=False, slots=True)
class Tensor:
    meta: TensorMeta
    shards: dict[int, Shard]
    ctime: float = field(default_factory=time.time)
    # The training-mode rules (None for async tensors: every update applies at once).
    coord: Coordinator[PendingUpdate] | None = None

    @property
    def version(self) -> int:
        """Sum of the local shards' versions: grows with every update applied here."""
        return sum(s.version for s in self.shards.values())

    @property
    def mtime(self) -> float:
        return max((s.mtime for s in self.shards.values()), default=self.ctime)


@dataclass(eq=False, slots=True)
class PendingUpdate:
    """A validated write or accumulate waiting for its payload in ``buffer``."""

    op: Op
    tensor: Tensor
    shard: Shard
    offset: int
    size: int
    alpha: float
    staging: Block | None  # in the arena, or None when ``heap`` is used
    heap: np.ndarray | None
    buffer: np.ndarray  # uint8, exactly ``size`` bytes, where the payload goes
    txn: int = 0  # the client's update id (0: none)
    stamp: int = 0  # a whole-tensor write's id (0: none); see the module docstring
    replicate: bool = True  # False for updates a backup receives from its primary
    # With a wire dtype (irdma.narrowing): the payload lands here, narrower,
    # and ``store.received`` widens it into ``buffer``.
    wire: int = 0
    narrow: np.ndarray | None = None
    # An accumulate's payload where the client left it (its staged or shared
    # memory, mapped here), not copied into ``buffer``: applied straight from
    # there (``accumulate_from``) while the client waits for the answer.
    source: np.ndarray | None = None

    @property
    def landing(self) -> np.ndarray:
        """Where the payload's bytes are received (``buffer`` unless narrowed)."""
        return self.buffer if self.narrow is None else self.narrow


def accumulate_into(target: np.ndarray, delta: np.ndarray, alpha: float) -> None:
    """``target += alpha * delta`` in place, the parameter-server update rule.

    ``delta`` is scratch and is overwritten. The arithmetic is the same as
    ``accumulate_copy`` so both give bit-identical results.
    """
    if is_narrow_float(target.dtype):
        _narrow_update(target, target, delta, alpha)
        return
    _scale(delta, alpha)
    with np.errstate(over="ignore", invalid="ignore"):
        np.add(target, delta, out=target)


def accumulate_from(target: np.ndarray, source: np.ndarray, alpha: float) -> None:
    """``target += alpha * source`` in place, leaving ``source`` (read-only memory)
    as it is: bit-identical to ``accumulate_into``, in pieces small enough to
    stay in cache, so each byte of ``source`` and ``target`` crosses memory
    once instead of being copied, scaled and added in three passes."""
    if alpha == 1.0 and not is_narrow_float(target.dtype):
        with np.errstate(over="ignore", invalid="ignore"):
            np.add(target, source, out=target)
        return
    step = max(1, ACCUMULATE_PIECE // max(1, source.itemsize))
    scratch = np.empty(min(step, len(source)), dtype=source.dtype)
    for lo in range(0, len(source), step):
        hi = min(lo + step, len(source))
        piece = scratch[: hi - lo]
        np.copyto(piece, source[lo:hi])
        accumulate_into(target[lo:hi], piece, alpha)


def accumulate_copy(target: np.ndarray, delta: np.ndarray, alpha: float) -> None:
    """``delta = target + alpha * delta``: the same update, written into ``delta``."""
    if is_narrow_float(target.dtype):
        _narrow_update(delta, target, delta, alpha)
        return
    _scale(delta, alpha)
    with np.errstate(over="ignore", invalid="ignore"):
        np.add(target, delta, out=delta)


def _scale(delta: np.ndarray, alpha: float) -> None:
    """``delta *= alpha`` in delta's dtype (overflow gives inf, as IEEE arithmetic does)."""
    if alpha == 1.0:
        return
    if is_narrow_float(delta.dtype):
        delta[...] = delta.astype(COMPUTE) * alpha
        return
    with np.errstate(over="ignore", invalid="ignore"):
        if delta.dtype.kind in "iu":
            np.multiply(delta, int(alpha), out=delta, casting="unsafe")
        else:
            np.multiply(delta, alpha, out=delta, casting="same_kind")


def _narrow_update(out: np.ndarray, target: np.ndarray, delta: np.ndarray, alpha: float) -> None:
    """``out = target + alpha * delta`` for bfloat16 or float8: in float32, rounded
    back once (their own arithmetic would round alpha and every step), as a
    narrowed wire's delta is summed at the tensor's precision."""
    wide = delta.astype(COMPUTE)
    with np.errstate(over="ignore", invalid="ignore"):
        if alpha != 1.0:
            np.multiply(wide, alpha, out=wide)
        np.add(wide, target.astype(COMPUTE), out=wide)
        out[...] = wide


def check_alpha(dtype: np.dtype, alpha: float) -> None:
    """Raise StoreError if ``alpha`` cannot scale a delta of ``dtype``."""
    if dtype.kind == "b":
        raise StoreError(Status.DTYPE_MISMATCH, "bool tensors cannot be accumulated")
    if not math.isfinite(alpha):
        raise StoreError(Status.BAD_ARGUMENT, f"alpha {alpha} is not finite")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if alpha != int(alpha) or not info.min <= int(alpha) <= info.max:
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"alpha {alpha} must be an integer within {dtype} for an integer tensor",
            )


class Store:
    """The tensors one daemon holds, with their shards in ``arena``.

    ``owns(key, shard)`` says whether this daemon holds that shard (placement
    comes from the cluster config; the store does not compute it).
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
        self.owns = owns
        self.clock = clock
        self.tensors: dict[int, Tensor] = {}
        # Each tensor's key by its name (a renamed tensor's key is not its name's).
        self.keys: dict[str, int] = {}
        # With replicas, every update applied here as a primary is recorded
        # for the replicator, which forwards it to the backups in this order.
        self.replicated = replicated
        self.commits: list[Commit] = []
        # Called after anything a waiting read may depend on changed (a
        # training step applied, a worker evicted, a tensor gone).
        self.on_change: Callable[[], None] = _nothing
        self.directory = arena.directory
        # Shards holding a previous copy, so the arena can take them back.
        self.prevs: dict[tuple[int, int], Shard] = {}
        # Blocks replaced during the update being applied: freed once the
        # directory names their successors (readers of them then retry).
        self._replaced: list[Block] = []

    # -- blocks -------------------------------------------------------------

    def pin(self, block: Block) -> Block:
        block.pins += 1
        return block

    def unpin(self, block: Block) -> None:
        block.pins -= 1
        if block.retired and block.pins == 0:
            self.arena.free(block)

    def _retire(self, block: Block) -> None:
        block.retired = True
        if block.pins == 0:
            self.arena.free(block)

    def _alloc(self, nbytes: int, what: str) -> Block:
        try:
            return self._alloc_or_reclaim(nbytes)
        except ArenaFullError as exc:
            raise StoreError(Status.NO_SPACE, f"arena full: {what}: {exc}") from None

    def _alloc_or_reclaim(self, nbytes: int) -> Block:
        """A block, taking back the previous copies of whole-tensor writes if need be."""
        try:
            return self.arena.alloc(nbytes)
        except ArenaFullError:
            if not self.prevs:
                raise
        if any(s.older for s in self.prevs.values()):
            self.drop_older()
            try:
                return self.arena.alloc(nbytes)
            except ArenaFullError:
                pass
        self.drop_prevs()
        return self.arena.alloc(nbytes)

    def drop_older(self) -> None:
        """Free the copies kept beyond each shard's previous one."""
        for shard in self.prevs.values():
            for _, block, _, _ in shard.older:
                self._retire(block)
            shard.older.clear()

    def drop_prevs(self) -> None:
        """Free every copy kept for readers of an older whole-tensor write."""
        for key, index in list(self.prevs):
            self._forget_prev(key, self.prevs[(key, index)])

    def _forget_prev(self, key: int, shard: Shard) -> None:
        """Free the shard's kept copies of older whole-tensor writes."""
        self.prevs.pop((key, shard.index), None)
        if shard.prev is not None:
            self._retire(shard.prev)
        for _, block, _, _ in shard.older:
            self._retire(block)
        shard.older.clear()
        had = shard.prev is not None
        shard.prev, shard.prev_stamp, shard.prev_version = None, 0, 0
        if had:
            # Readers take the previous copy's stamp from the slot: one that is
            # gone must not send them after it (a round asking for STAMP_GONE).
            self.directory.set_prev(shard.slot, 0)

    def reserve(self, nbytes: int) -> Block | None:
        """A staging block for incoming bytes, or None when the arena has no room."""
        try:
            return self._alloc_or_reclaim(nbytes)
        except ArenaFullError:
            return None

    def publish(self, shard: Shard) -> None:
        """Tell the directory where the shard is now (its block, version, stamp), then
        free the blocks it replaced. Call after changing any of them."""
        prev = wire_stamp(shard.prev_stamp) if shard.prev is not None else 0
        self.directory.publish(
            shard.slot, shard.block.offset, prev, shard.version, wire_stamp(shard.stamp)
        )
        replaced, self._replaced = self._replaced, []
        for block in replaced:
            self._retire(block)

    # -- metadata ops -------------------------------------------------------

    def create(
        self, meta: TensorMeta, *, replace: bool = False, exclusive: bool = False
    ) -> tuple[Tensor, bool]:
        """Create the local shards of ``meta``; return (tensor, created).

        Creating a tensor that exists with the same layout is a no-op
        (unless ``exclusive``). A different layout is refused unless
        ``replace``. All local shards are allocated, or none; the tensor
        replaced is dropped only once they are.
        """
        key = meta.key
        mode, old, kept = self._admit(meta, replace, exclusive)
        if kept:
            assert old is not None  # kept: the tensor there already is the one asked for
            return old, False
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
            shard.slot = self.directory.place(key, meta.layout, shard.index)
            self.publish(shard)
        coord: Coordinator[PendingUpdate] | None = (
            None if mode.kind == "async" else Coordinator(meta.name, mode, list(shards))
        )
        tensor = Tensor(meta, shards, coord=coord)
        self.tensors[key] = tensor
        self.keys[meta.name] = key
        return tensor, True

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
        for shard in tensor.shards.values():
            self.directory.begin(shard.slot)
            self.directory.relabel(shard.slot, meta.layout)
            shard.version += 1
            self.publish(shard)
        return tensor

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
                self.arena.free(shard.block)

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
        try:
            for index in range(meta.num_shards):
                if self.owns(meta.key, index):
                    _, nbytes = meta.shard_span(index)
                    block = self._alloc(nbytes, f"creating {meta.name!r} shard {index}")
                    if zero:
                        self.arena.view(block)[:] = 0
                    shards[index] = Shard(index, nbytes, block)
        except StoreError:
            for s in shards.values():
                self.arena.free(s.block)
            raise
        return shards

    def delete(self, key: int, name: str | None = None) -> TensorMeta:
        """Delete the tensor at ``key`` (only if it is called ``name``, when given)."""
        tensor = self.tensors.get(key)
        if tensor is None or (name is not None and tensor.meta.name != name):
            what = f"tensor {name!r}" if name is not None else "tensor"
            raise StoreError(Status.NOT_FOUND, f"no {what} with key {key:#018x} here")
        del self.tensors[key]
        if self.keys.get(tensor.meta.name) == key:
            del self.keys[tensor.meta.name]
        self._drop(tensor)
        return tensor.meta

    def _drop(self, tensor: Tensor) -> None:
        """Free a deleted or replaced tensor's blocks and any deltas held for its steps."""
        for s in tensor.shards.values():
            self._forget_shard(tensor.meta.key, s)
        if tensor.coord is not None:
            for update in tensor.coord.held():
                self.abort(update)
            self.on_change()  # reads waiting on it now fail with NOT_FOUND

    def _forget_shard(self, key: int, shard: Shard) -> None:
        """Free a shard's slot and memory (a reader of the slot sees it freed first)."""
        self.directory.free(shard.slot)
        shard.slot = -1
        self._retire(shard.block)
        self._forget_prev(key, shard)

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

    def info(self, tensor: Tensor) -> dict[str, Any]:
        """The stat record of a tensor as this daemon sees it."""
        out = {
            "meta": tensor.meta.to_dict(),
            "version": tensor.version,
            "mtime": tensor.mtime,
            "ctime": tensor.ctime,
            "shards": {str(i): s.version for i, s in sorted(tensor.shards.items())},
        }
        if tensor.coord is not None:
            out["evicted"] = sorted(tensor.coord.evicted)
        return out

    def list(self, prefix: str = "", limit: int = 0) -> list[dict[str, Any]]:
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

    # -- data ops -----------------------------------------------------------

    def shard(self, key: int, index: int, layout: int = 0, dtype: int = DTYPE_ANY) -> Shard:
        """The local shard ``index`` of a tensor, after checking layout and dtype."""
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
        return shard

    @staticmethod
    def check_range(tensor: Tensor, shard: Shard, offset: int, size: int) -> None:
        if offset > shard.nbytes or size > shard.nbytes - offset:
            raise StoreError(
                Status.OUT_OF_RANGE,
                f"bytes [{offset}, {offset + size}) are outside shard {shard.index} of "
                f"{tensor.meta.name!r} ({shard.nbytes} bytes)",
            )

    def read_shard(
        self, key: int, index: int, offset: int, size: int, layout: int = 0, dtype: int = 0
    ) -> Shard:
        """Validate a read of bytes ``[offset, offset+size)``; return the shard."""
        shard = self.shard(key, index, layout, dtype)
        self.check_range(self.tensors[key], shard, offset, size)
        return shard

    def read_view(
        self, key: int, index: int, offset: int, size: int, layout: int = 0, dtype: int = 0
    ) -> tuple[Shard, np.ndarray]:
        """Validate a read; return the shard and a view of the bytes (not pinned yet)."""
        shard = self.read_shard(key, index, offset, size, layout, dtype)
        return shard, self.arena.view(shard.block, offset, size)

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
        in that narrower dtype (``update.landing``), widened by ``received``.
        """
        shard = self.shard(key, index, layout, dtype)
        tensor = self.tensors[key]
        self.check_range(tensor, shard, offset, size)
        holder = self.wire_holder(tensor, wire, offset, size) if wire else None
        if op == Op.ACCUMULATE:
            dt = tensor.meta.np_dtype
            check_alpha(dt, alpha)
            if offset % dt.itemsize or size % dt.itemsize:
                raise StoreError(
                    Status.BAD_ARGUMENT,
                    f"accumulate range [{offset}, {offset + size}) is not aligned to "
                    f"{dt} elements of {dt.itemsize} bytes",
                )
        staging: Block | None
        heap: np.ndarray | None = None
        try:
            staging = self._alloc_or_reclaim(size)
            buffer = self.arena.view(staging, 0, size)
        except ArenaFullError:
            # Fall back to process memory for the payload; the update may still
            # apply in place. The payload size is bounded by the frame limit.
            staging = None
            heap = np.empty(size, dtype=np.uint8)
            buffer = heap
        update = PendingUpdate(op, tensor, shard, offset, size, alpha, staging, heap, buffer)
        if holder is not None:
            update.wire = wire
            update.narrow = np.empty(narrowing.wire_nbytes(tensor.meta.np_dtype, wire, size), "u1")
        return update

    @staticmethod
    def wire_holder(tensor: Tensor, wire: int, offset: int, size: int) -> np.dtype:
        """Check that bytes ``[offset, offset+size)`` of ``tensor`` may travel as ``wire``."""
        dt = tensor.meta.np_dtype
        try:
            holder = narrowing.check(dt, wire)
        except ValueError as exc:
            raise StoreError(Status.BAD_ARGUMENT, f"{tensor.meta.name!r}: {exc}") from None
        if offset % dt.itemsize or size % dt.itemsize:
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"range [{offset}, {offset + size}) of {tensor.meta.name!r} is not whole "
                f"{dt} elements, so it cannot travel as another dtype",
            )
        return holder

    def stored_nbytes(self, key: int, wire: int, wire_nbytes: int) -> int:
        """Tensor bytes of ``wire_nbytes`` bytes of elements in the ``wire`` dtype."""
        tensor = self.get(key)
        holder = self.wire_holder(tensor, wire, 0, 0)
        if wire_nbytes % holder.itemsize:
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"{wire_nbytes} bytes are not whole {narrowing.WIRE_NAMES[wire]} elements",
            )
        return wire_nbytes // holder.itemsize * tensor.meta.np_dtype.itemsize

    def received(self, update: PendingUpdate) -> None:
        """The payload is in: widen a narrowed one into the update's buffer."""
        if update.narrow is not None:
            dt = update.tensor.meta.np_dtype
            holder = narrowing.check(dt, update.wire)
            narrowing.widen_into(update.narrow.view(holder), update.wire, update.buffer.view(dt))
            update.narrow = None

    def read_narrowed(self, key: int, offset: int, view: np.ndarray, wire: int) -> memoryview:
        """A read ``view`` (at byte ``offset`` of its shard) narrowed to ``wire``, as new bytes."""
        tensor = self.tensors[key]
        self.wire_holder(tensor, wire, offset, len(view))
        return narrowing.narrow(view.view(tensor.meta.np_dtype), wire).data

    @staticmethod
    def materialize(update: PendingUpdate) -> None:
        """Copy a payload still in the client's memory into the update's own buffer
        (before anything keeps or changes it past the client's answer)."""
        if update.source is not None:
            np.copyto(update.buffer, update.source)
            update.source = None

    def abort(self, update: PendingUpdate) -> None:
        update.source = None
        if update.staging is not None:
            self.arena.free(update.staging)
            update.staging = None

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
        if self.tensors.get(update.tensor.meta.key) is not update.tensor or (
            update.tensor.shards.get(shard.index) is not shard
        ):
            self.abort(update)
            raise StoreError(
                Status.NOT_FOUND,
                f"tensor {update.tensor.meta.name!r} was deleted or replaced during the update",
            )
        if update.stamp and not (update.op == Op.WRITE and self._whole_shard(update)):
            self.abort(update)
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"a whole-tensor write's stamp needs a WRITE of all of shard {shard.index} "
                f"of {update.tensor.meta.name!r}",
            )
        # Backups apply the update as received (accumulate scales the delta
        # in place), so keep a copy of it for them first.
        payload: np.ndarray | None = None
        if self.replicated and update.replicate:
            self.materialize(update)
            payload = update.buffer.copy()
        if update.op == Op.WRITE:
            self.materialize(update)  # only accumulates are applied from where they lie
        # Readers that pin nothing retry while the slot says "changing".
        self.directory.begin(shard.slot)
        try:
            if update.stamp:
                self._commit_stamped(update)
            elif update.op == Op.WRITE:
                self._commit_write(update)
            else:
                self._commit_accumulate(update)
        except BaseException:
            self.directory.settle(shard.slot)
            self._replaced.clear()  # nothing was swapped out
            raise
        finally:
            self.abort(update)  # frees staging unless it became the shard's block
        shard.version += 1
        shard.mtime = time.time()
        shard.remember(update.txn, shard.version)
        self.publish(shard)
        if payload is not None:
            meta = update.tensor.meta
            self.commits.append(
                Commit(
                    meta.key,
                    shard.index,
                    update.op,
                    update.offset,
                    update.alpha,
                    meta.layout,
                    meta.dtype_code,
                    payload,
                    update.txn,
                    shard.version,
                    *(step or (0, 0)),
                    stamp=update.stamp,
                    pushed_by=pushed[0] if pushed else NO_WORKER,
                    pushed_step=pushed[1] if pushed else 0,
                )
            )
        return shard.version

    def _forward_held(self, update: PendingUpdate, worker: int, step: int) -> None:
        """A push held for its lockstep step goes to the backups too (acknowledged once
        they have it), so a backup taking over mid-step has every acknowledged push."""
        if self.replicated and update.replicate:
            self.commits.append(held_commit(update, worker, step, update.shard.version))

    def take_commits(self) -> builtins.list[Commit]:
        """The updates applied since the last call, oldest first."""
        out, self.commits = self.commits, []
        return out

    # -- replication ---------------------------------------------------------

    def applied(self, update: PendingUpdate, worker: int = NO_WORKER) -> int | None:
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
        self._check_on_top(update, version - 1)
        tensor, index = update.tensor, update.shard.index
        done = self.commit(update)
        if step is not None:
            self.follow_steps(tensor, index, {step[0]: step[1]})
        if pushed is not None and tensor.coord is not None:
            tensor.coord.follow_clocks(index, {pushed[0]: pushed[1] + 1})
        return done

    def hold_replica(self, update: PendingUpdate, version: int, worker: int, step: int) -> int:
        """Hold a push the shard's primary holds for ``step`` (its shard at ``version``),
        as the primary does: if this copy takes over, the step completes with it."""
        self._check_on_top(update, version)
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
            self.abort(update)
            raise
        if replaced is not None and replaced is not update:
            self.abort(replaced)
        return update.shard.version

    def _check_on_top(self, update: PendingUpdate, version: int) -> None:
        """A forwarded update goes on top of ``version``; BEHIND (nothing kept) if not."""
        if update.shard.version != version:
            have = update.shard.version
            self.abort(update)
            raise StoreError(
                Status.BEHIND,
                f"shard {update.shard.index} of {update.tensor.meta.name!r} is at version "
                f"{have}, the update is for {version}",
            )

    def follow_steps(self, tensor: Tensor, index: int, applied: dict[int, int]) -> None:
        """Advance this copy's coordinator to the primary's applied steps (group -> count),
        so it can take over the tensor's training mode where the primary left it."""
        if tensor.coord is None:
            return
        shard = tensor.shards[index]
        for group, count in applied.items():
            for held in tensor.coord.follow(index, group, count):
                # In the primary's sum: a retry of it is answered, not held again.
                shard.remember(held.txn, shard.version)
                self.abort(held)

    def applied_steps(self, tensor: Tensor, index: int) -> builtins.list[int]:
        """The steps applied per group of a lockstep tensor's shard ([] otherwise)."""
        return tensor.coord.applied_steps(index) if tensor.coord is not None else []

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
            self.delete(meta.key)
            tensor = None
        if tensor is None or not tensor.meta.same_layout(meta):
            tensor, _ = self.create(meta, replace=True)
        shard = tensor.shards.get(index)
        if shard is None:  # placed here since the tensor was (a move): make room for it
            shard = self._add_shard(tensor, index)
        if data.nbytes != shard.nbytes:
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"shard {index} of {meta.name!r} is {shard.nbytes} bytes, got {data.nbytes}",
            )
        if shard.block.pins:
            block = self._alloc(shard.nbytes, f"copy of shard {index} of {meta.name!r}")
            self.arena.view(block, 0, shard.nbytes)[:] = data
            self.directory.begin(shard.slot)
            self._swap(shard, block)
        else:
            self.directory.begin(shard.slot)
            self.arena.view(shard.block, 0, shard.nbytes)[:] = data
        shard.version = version
        shard.mtime = time.time()
        shard.recent = dict(txns)
        # The copy replaces whatever this one was: no older write's copy is kept.
        shard.stamp = stamp
        self._forget_prev(meta.key, shard)
        self.publish(shard)
        if tensor.coord is not None:
            for held in tensor.coord.release_held(index):
                self.abort(held)
            if steps:
                self.follow_steps(tensor, index, dict(enumerate(steps)))
            if clocks:
                tensor.coord.follow_clocks(index, dict(enumerate(clocks)))
        return shard

    def clocks(self, tensor: Tensor, index: int) -> builtins.list[int]:
        """The ssp clocks (steps pushed per worker) of a tensor's shard ([] otherwise)."""
        return tensor.coord.clocks(index) if tensor.coord is not None else []

    def held_on(self, tensor: Tensor, index: int) -> builtins.list[tuple[int, int, PendingUpdate]]:
        """(worker, step, push) held for a lockstep step on a tensor's shard."""
        return tensor.coord.held_on(index) if tensor.coord is not None else []

    def _add_shard(self, tensor: Tensor, index: int) -> Shard:
        """A new, zero-filled local shard of an existing tensor."""
        _, nbytes = tensor.meta.shard_span(index)
        block = self._alloc(nbytes, f"copying {tensor.meta.name!r} shard {index}")
        self.arena.view(block)[:] = 0
        shard = Shard(index, nbytes, block)
        shard.slot = self.directory.place(tensor.meta.key, tensor.meta.layout, index)
        self.publish(shard)
        tensor.shards[index] = shard
        if tensor.coord is not None:
            tensor.coord.add_shard(index)
        return shard

    def drop_shard(self, key: int, index: int) -> None:
        """Forget a local shard the cluster no longer has (deleted while this daemon was away)."""
        tensor = self.tensors.get(key)
        if tensor is None or index not in tensor.shards:
            return
        self._forget_shard(key, tensor.shards.pop(index))
        if not tensor.shards:
            self.delete(key)

    def checksum(self, shard: Shard) -> int:
        """CRC-32 of a shard's bytes: tells two copies at one version apart."""
        return zlib.crc32(self.arena.view(shard.block, 0, shard.nbytes).data)

    def _whole_shard(self, update: PendingUpdate) -> bool:
        return update.offset == 0 and update.size == update.shard.nbytes

    def _swap(self, shard: Shard, block: Block) -> None:
        """Make ``block`` the shard's; the old one is freed by ``_publish``."""
        self._replaced.append(shard.block)
        shard.block = block

    def _commit_stamped(self, update: PendingUpdate) -> None:
        """A whole-tensor write's shard: new bytes in a new block, the old kept as ``prev``."""
        shard = update.shard
        key = update.tensor.meta.key
        if update.staging is not None:
            block, update.staging = update.staging, None
        else:
            try:
                block = self._alloc_or_reclaim(shard.nbytes)
            except ArenaFullError:
                # No room for two copies: write over this one (no previous
                # copy is kept; a reader that needs it reads again).
                self._forget_prev(key, shard)
                self._commit_write(update)
                shard.stamp = update.stamp
                shard.stamps_seen.append(update.stamp)
                return
            self.arena.view(block, 0, update.size)[:] = update.buffer
        now = time.monotonic()
        if shard.prev is not None:
            shard.older.append((shard.prev_stamp, shard.prev, shard.prev_version, now))
        while shard.older and (
            now - shard.older[0][3] > OLDER_COPIES_KEPT or len(shard.older) > OLDER_COPIES_MAX
        ):
            self._replaced.append(shard.older.pop(0)[1])
        shard.prev, shard.prev_stamp, shard.prev_version = shard.block, shard.stamp, shard.version
        shard.stamps_seen.append(update.stamp)
        shard.block = block
        shard.stamp = update.stamp
        self.prevs[(key, shard.index)] = shard

    def copy_for(self, shard: Shard, stamp: int) -> tuple[Block, int]:
        """The block and version of the shard's copy from whole-tensor write ``stamp``
        as a read asks for it (0: the current copy; UNSTAMPED: the copy from before
        any whole-tensor write); STAMP_GONE when it is no longer kept here."""
        want = 0 if stamp == UNSTAMPED else stamp
        if not stamp or want == shard.stamp:
            return shard.block, shard.version
        if shard.prev is not None and shard.prev_stamp == want:
            return shard.prev, shard.prev_version
        for older_stamp, block, version, _ in reversed(shard.older):
            if older_stamp == want:
                return block, version
        if want and want not in shard.stamps_seen:
            raise StoreError(
                Status.STAMP_PENDING,
                f"shard {shard.index} has not received write {stamp:#x} yet",
            )
        raise StoreError(
            Status.STAMP_GONE,
            f"shard {shard.index} no longer holds the copy of write {stamp:#x} "
            "(rewritten since); read the tensor again",
        )

    def _cow_copy(self, shard: Shard) -> Block:
        new = self._alloc(shard.nbytes, f"copy-on-write of shard {shard.index}")
        self.arena.view(new, 0, shard.nbytes)[:] = self.arena.view(shard.block, 0, shard.nbytes)
        return new

    def _commit_write(self, update: PendingUpdate) -> None:
        shard = update.shard
        if update.staging is not None and self._whole_shard(update):
            self._swap(shard, update.staging)  # the staged bytes become the shard
            update.staging = None
            return
        if shard.block.pins:
            new = self._cow_copy(shard)
            self.arena.view(new, update.offset, update.size)[:] = update.buffer
            self._swap(shard, new)
        else:
            self.arena.view(shard.block, update.offset, update.size)[:] = update.buffer
        return

    def _commit_accumulate(self, update: PendingUpdate) -> None:
        shard = update.shard
        dt = update.tensor.meta.np_dtype
        if update.source is not None and not shard.block.pins:
            target = self.arena.view(shard.block, update.offset, update.size).view(dt)
            accumulate_from(target, update.source.view(dt), update.alpha)
            update.source = None
            return
        self.materialize(update)
        delta = update.buffer.view(dt)
        if not shard.block.pins:
            target = self.arena.view(shard.block, update.offset, update.size).view(dt)
            accumulate_into(target, delta, update.alpha)
            return
        if update.staging is not None and self._whole_shard(update):
            current = self.arena.view(shard.block, 0, update.size).view(dt)
            accumulate_copy(current, delta, update.alpha)
            self._swap(shard, update.staging)
            update.staging = None
            return
        new = self._cow_copy(shard)
        target = self.arena.view(new, update.offset, update.size).view(dt)
        accumulate_into(target, delta, update.alpha)
        self._swap(shard, new)

    # -- training modes -------------------------------------------------------

    def push(self, update: PendingUpdate, worker: int = NO_WORKER, step: int = 0) -> int:
        """Apply (or, in a lockstep mode, hold) a received update; return the shard's version.

        ``worker`` and ``step`` say whose gradient for which training step
        the update is; they matter only for tensors with a training mode.
        """
        coord = update.tensor.coord
        if coord is None or update.op == Op.WRITE:
            return self.commit(update)
        self.materialize(update)  # it may be held for its step, past the client's answer
        mode = coord.mode
        name = update.tensor.meta.name
        if worker == NO_WORKER:
            if mode.steps_in_lockstep:
                self.abort(update)
                raise StoreError(
                    Status.BAD_ARGUMENT,
                    f"tensor {name!r} is in {mode.kind} mode for {mode.workers} workers: "
                    "an accumulate must name its worker and step",
                )
            return self.commit(update)
        if mode.steps_in_lockstep and not self._whole_shard(update):
            self.abort(update)
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"tensor {name!r} is in {mode.kind} mode: an accumulate must cover whole shards",
            )
        try:
            items = coord.push(update.shard.index, worker, step, update, self.clock())
        except StoreError:
            self.abort(update)
            raise
        if mode.kind == "ssp":  # applied at once, with its worker's clock for the backups
            version = self.commit(update, pushed=(worker, step))
            self.on_change()  # reads waiting on this worker's clock
            return version
        if items is None:
            self._forward_held(update, worker, step)
            return update.shard.version
        group = mode.group_of(worker)
        version = self._apply_step(
            items, mode, group, coord.step(update.shard.index, worker), last=update
        )
        self.on_change()
        return version

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
        _scale(total, first.alpha)
        for other in items[1:]:
            accumulate_into(total, other.buffer.view(dt), other.alpha)
            self.abort(other)
        first.alpha = 1.0
        if mode.apply == "set":
            first.op = Op.WRITE
        version = self.commit(first, (group, applied))
        for txn in txns:
            first.shard.remember(txn, version)
        return version

    def waits_for(
        self, key: int, index: int, worker: int, step: int, layout: int = 0
    ) -> builtins.list[int]:
        """The workers a read of shard ``index`` by ``worker`` for ``step`` waits for.

        [] means the read may go now. Anonymous reads (NO_WORKER) and async
        tensors never wait. Raises StoreError if the read could never go.
        """
        tensor = self.get(key, layout)
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
        tensor = self.get(key)
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
        self.on_change()
        return lost


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


def _nothing() -> None:
    pass
