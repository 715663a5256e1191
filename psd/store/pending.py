"""Staging a pending update (``records.PendingUpdate``): room for its payload,
in the arena where there is some, else in process memory."""

from __future__ import annotations

import numpy as np

from irdma import narrowing
from irdma.protocol import Op

from ..arena import ArenaFullError, Block
from .blocks import Blocks
from .records import PendingUpdate, Shard, Tensor


def stage(
    blocks: Blocks,
    op: Op,
    tensor: Tensor,
    shard: Shard,
    offset: int,
    size: int,
    alpha: float,
    wire: int = 0,
) -> PendingUpdate:
    """An update of bytes ``[offset, offset+size)`` of ``shard`` (checked already),
    with room for its payload: ``size`` bytes, or their narrower ``wire`` form."""
    staging: Block | None
    heap: np.ndarray | None = None
    try:
        staging = blocks.alloc_or_reclaim(size)
        buffer = blocks.arena.view(staging, 0, size)
    except ArenaFullError:
        # Fall back to process memory for the payload; the update may still
        # apply in place. The payload size is bounded by the frame limit.
        staging = None
        heap = np.empty(size, dtype=np.uint8)
        buffer = heap
    update = PendingUpdate(op, tensor, shard, offset, size, alpha, staging, heap, buffer)
    if wire:
        update.wire = wire
        update.narrow = np.empty(narrowing.wire_nbytes(tensor.meta.np_dtype, wire, size), "u1")
    return update
