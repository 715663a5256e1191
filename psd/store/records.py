"""The store's records: a tensor held here, its local shards, and an update
pending on one of them.

A pending update is *staged* (``pending.stage``: room reserved for its payload,
in the arena or else in process memory), then either *committed*
(``apply.Applier.commit``; a lockstep push may be held for its step first) or
*released* (``PendingUpdate.release``: its staging given back). ``widen`` and
``materialize`` move its payload into its own buffer: from a narrower wire
dtype, or from the client's memory where an accumulate was left to be applied
from.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from irdma import narrowing
from irdma.protocol import Op, TensorMeta

from ..arena import Arena, Block
from ..coordination import Coordinator

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
    # txn -> the version its update produced (insertion order = age); see
    # ``replica_log``.
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
    stamp: int = 0  # a whole-tensor write's id (0: none); see ``copies``
    replicate: bool = True  # False for updates a backup receives from its primary
    # With a wire dtype (irdma.narrowing): the payload lands here, narrower,
    # and ``widen`` widens it into ``buffer``.
    wire: int = 0
    narrow: np.ndarray | None = None
    # An accumulate's payload where the client left it (its staged or shared
    # memory, mapped here), not copied into ``buffer``: applied straight from
    # there (``rules.accumulate_from``) while the client waits for the answer.
    source: np.ndarray | None = None

    @property
    def landing(self) -> np.ndarray:
        """Where the payload's bytes are received (``buffer`` unless narrowed)."""
        return self.buffer if self.narrow is None else self.narrow

    @property
    def whole_shard(self) -> bool:
        """Whether the update covers all of its shard."""
        return self.offset == 0 and self.size == self.shard.nbytes

    def widen(self) -> None:
        """The payload is in: widen a narrowed one into ``buffer``."""
        if self.narrow is not None:
            dt = self.tensor.meta.np_dtype
            holder = narrowing.check(dt, self.wire)
            narrowing.widen_into(self.narrow.view(holder), self.wire, self.buffer.view(dt))
            self.narrow = None

    def materialize(self) -> None:
        """Copy a payload still in the client's memory into ``buffer`` (before
        anything keeps or changes it past the client's answer)."""
        if self.source is not None:
            np.copyto(self.buffer, self.source)
            self.source = None

    def release(self, arena: Arena) -> None:
        """Give back the staging (unless it became the shard's block) and the
        client's memory: the update is over, applied or not."""
        self.source = None
        if self.staging is not None:
            arena.free(self.staging)
            self.staging = None
