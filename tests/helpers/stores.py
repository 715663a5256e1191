"""In-process arenas and stores (no daemon), closed afterwards, and what tests
read back from a store."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from irdma_psd.arena import Arena
from irdma_psd.store import Commit, Store

from irdma.protocol import Op

ARENA_SIZE = 1 << 20


def everything(key: int, shard: int) -> bool:
    """An ``owns`` for a store that holds every shard."""
    return True


def even(key: int, shard: int) -> bool:
    """An ``owns`` for a store that holds the even shards."""
    return shard % 2 == 0


@contextmanager
def open_arena(capacity: int = ARENA_SIZE) -> Iterator[Arena]:
    """An arena of ``capacity`` bytes, closed when the block ends."""
    arena = Arena(capacity)
    try:
        yield arena
    finally:
        arena.close()


@contextmanager
def open_store(
    capacity: int = ARENA_SIZE,
    owns: Callable[[int, int], bool] = everything,
    clock: Callable[[], float] = time.monotonic,
    *,
    replicated: bool = False,
) -> Iterator[Store]:
    """A store over an arena of its own, closed when the block ends."""
    with open_arena(capacity) as arena:
        yield Store(arena, owns, clock, replicated=replicated)


def shard_bytes(store: Store, key: int, index: int) -> bytes:
    """What ``store`` holds for shard ``index`` of tensor ``key``."""
    shard = store.tensors[key].shards[index]
    return store.arena.view(shard.block, 0, shard.nbytes).tobytes()


def commit(key: int, shard: int, version: int) -> Commit:
    """An update applied here as the shard's primary (4 bytes written at offset 0)."""
    return Commit(key, shard, Op.WRITE, 0, 1.0, 0, 0, np.zeros(4, np.uint8), 0, version)
