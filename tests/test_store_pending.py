"""Tests for irdma_psd.store.pending: an update staged, its payload widened or
copied in, and its staging given back. An arena, no daemon."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from irdma_psd.store import Store
from irdma_psd.store.pending import stage

from irdma import narrowing
from irdma.protocol import Op, TensorMeta

from .helpers.stores import open_store


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store() as s:
        yield s


def test_staging_is_in_the_arena_and_given_back_once(store: Store) -> None:
    meta = TensorMeta("p/t", "float32", (1024,), 4096)
    tensor, _ = store.create(meta)
    used = store.arena.used
    u = stage(store.blocks, Op.WRITE, tensor, tensor.shards[0], 0, 4096, 1.0)
    assert u.staging is not None and u.heap is None and store.arena.used == used + 4096
    assert u.whole_shard and u.landing is u.buffer
    u.release(store.arena)
    u.release(store.arena)  # twice is harmless
    assert u.staging is None and store.arena.used == used


def test_a_full_arena_stages_in_process_memory(store: Store) -> None:
    meta = TensorMeta("p/f", "uint8", (4096,), 4096)
    tensor, _ = store.create(meta)
    rest = store.arena.alloc(store.arena.allocator.free_bytes)
    u = stage(store.blocks, Op.WRITE, tensor, tensor.shards[0], 16, 32, 1.0)
    assert u.staging is None and u.heap is not None and len(u.buffer) == 32
    assert not u.whole_shard
    store.arena.free(rest)


def test_a_narrowed_payload_is_widened_into_the_buffer(store: Store) -> None:
    meta = TensorMeta("p/n", "float32", (1024,), 4096)
    tensor, _ = store.create(meta)
    f16 = narrowing.wire_code("float16")
    u = stage(store.blocks, Op.ACCUMULATE, tensor, tensor.shards[0], 0, 16, 1.0, f16)
    assert u.narrow is not None and len(u.landing) == 8  # four float16s
    u.landing[:] = np.array([1.0, 2.0, -0.5, 4.0], dtype=np.float16).view(np.uint8)
    u.widen()
    assert u.narrow is None and u.buffer.view(np.float32).tolist() == [1.0, 2.0, -0.5, 4.0]
    u.release(store.arena)


def test_a_payload_left_in_the_clients_memory_is_copied_in(store: Store) -> None:
    meta = TensorMeta("p/m", "uint8", (4096,), 4096)
    tensor, _ = store.create(meta)
    u = stage(store.blocks, Op.ACCUMULATE, tensor, tensor.shards[0], 0, 4, 1.0)
    client = np.array([9, 8, 7, 6], dtype=np.uint8)
    u.source = client
    u.materialize()
    client[:] = 0  # the client's memory changes after the answer: the update keeps its bytes
    assert u.source is None and u.buffer.tolist() == [9, 8, 7, 6]
    u.release(store.arena)
