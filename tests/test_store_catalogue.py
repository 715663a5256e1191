"""Tests for irdma_psd.store.catalogue: tensors by key and name, created all or
nothing, found for a request, and what a change dropped. An arena, no daemon."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from irdma_psd.arena import Arena
from irdma_psd.store import StoreError
from irdma_psd.store.blocks import Blocks
from irdma_psd.store.catalogue import Catalogue

from irdma.protocol import DTYPE_CODES, Status, TensorMeta
from irdma.training.modes import Mode

from .helpers.stores import open_arena

SHARD = 4096


@pytest.fixture
def arena() -> Iterator[Arena]:
    with open_arena(16 * SHARD) as a:
        yield a


def test_a_replace_hands_back_the_tensor_it_dropped(arena: Arena) -> None:
    cat = Catalogue(Blocks(arena), lambda key, shard: True)
    old, created, dropped = cat.create(TensorMeta("c/t", "uint8", (2 * SHARD,), SHARD))
    assert created and dropped is None
    same, created, dropped = cat.create(TensorMeta("c/t", "uint8", (2 * SHARD,), SHARD))
    assert same is old and not created and dropped is None
    new, created, dropped = cat.create(
        TensorMeta("c/t", "uint8", (3 * SHARD,), SHARD), replace=True
    )
    assert created and dropped is old and cat.tensors[new.meta.key] is new
    assert [s.version for s in new.shards.values()] == [1, 1, 0]  # above the old shards'


def test_a_create_with_no_room_changes_nothing(arena: Arena) -> None:
    cat = Catalogue(Blocks(arena), lambda key, shard: True)
    with pytest.raises(StoreError, match="arena full: creating 'c/big' shard") as ei:
        cat.create(TensorMeta("c/big", "uint8", (17 * SHARD,), SHARD))
    assert ei.value.status == Status.NO_SPACE
    assert cat.tensors == {} and arena.used == 0


def test_dropping_the_last_shard_deletes_the_tensor(arena: Arena) -> None:
    cat = Catalogue(Blocks(arena), lambda key, shard: True)
    tensor, _, _ = cat.create(TensorMeta("c/d", "uint8", (2 * SHARD,), SHARD))
    key = tensor.meta.key
    assert cat.drop_shard(key, 0) is None and list(tensor.shards) == [1]
    assert cat.drop_shard(key, 1) is tensor
    assert cat.tensors == {} and cat.keys == {} and arena.used == 0
    assert cat.drop_shard(key, 1) is None  # gone already: nothing to do


def test_span_checks_layout_dtype_shard_and_range(arena: Arena) -> None:
    cat = Catalogue(Blocks(arena), lambda key, shard: shard == 0)
    meta = TensorMeta("c/s", "float32", (2048,), SHARD)
    tensor, _, _ = cat.create(meta)
    assert cat.span(meta.key, 0, 0, SHARD, meta.layout) == (tensor, tensor.shards[0])
    cases = [
        ((meta.key, 0, 0, 4, meta.layout + 1), Status.STALE_LAYOUT),
        ((meta.key, 0, 0, 4, 0, DTYPE_CODES["int8"]), Status.DTYPE_MISMATCH),
        ((meta.key, 2, 0, 4), Status.OUT_OF_RANGE),
        ((meta.key, 1, 0, 4), Status.NOT_OWNER),
        ((meta.key, 0, SHARD - 2, 4), Status.OUT_OF_RANGE),
    ]
    for args, status in cases:
        with pytest.raises(StoreError) as ei:
            cat.span(*args)
        assert ei.value.status == status, args


def test_a_training_tensor_gets_its_coordinator_and_a_bad_mode_is_refused(arena: Arena) -> None:
    cat = Catalogue(Blocks(arena), lambda key, shard: True)
    tensor, _, _ = cat.create(
        TensorMeta("c/m", "float32", (1024,), SHARD, Mode.sync(2).to_options())
    )
    assert tensor.coord is not None and cat.info(tensor).evicted == ()
    with pytest.raises(StoreError, match="'c/x'") as ei:
        cat.create(TensorMeta("c/x", "float32", (1024,), SHARD, {"mode": "nonsense"}))
    assert ei.value.status == Status.BAD_ARGUMENT
