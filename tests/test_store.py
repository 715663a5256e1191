"""Tests for irdma_psd.store: tensors, shards, updates and copy-on-write."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from irdma_psd.arena import PAGE, Arena, Block, round_up
from irdma_psd.store import Store, StoreError
from irdma_psd.store.rules import accumulate_copy, accumulate_from, accumulate_into, check_alpha

from irdma.protocol import DTYPE_CODES, Op, Status, TensorMeta, tensor_key
from irdma.sizes import ACCUMULATE_PIECE

from .helpers.payloads import rand_bytes
from .helpers.stores import even, everything, open_arena, shard_bytes

# -- helpers -----------------------------------------------------------------


@pytest.fixture
def arena() -> Iterator[Arena]:
    with open_arena() as a:
        yield a


def fill(arena: Arena, leave: int = 0) -> list[Block]:
    """Allocate all free arena space but ``leave`` bytes (contiguous, at the end)."""
    blocks = []
    while arena.allocator.free_bytes > leave:
        n = min(arena.allocator.largest_free, arena.allocator.free_bytes - leave)
        blocks.append(arena.alloc(n))
    assert arena.allocator.free_bytes == leave
    return blocks


def all_bytes(store: Store) -> dict[tuple[int, int], bytes]:
    return {(k, i): shard_bytes(store, k, i) for k, t in store.tensors.items() for i in t.shards}


def versions(store: Store) -> dict[tuple[int, int], int]:
    return {(k, i): s.version for k, t in store.tensors.items() for i, s in t.shards.items()}


def as_u8(data: bytes | np.ndarray) -> np.ndarray:
    if isinstance(data, bytes):
        return np.frombuffer(data, dtype=np.uint8)
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def write(store: Store, key: int, index: int, offset: int, data: bytes | np.ndarray) -> int:
    raw = as_u8(data)
    u = store.begin_update(Op.WRITE, key, index, offset, raw.nbytes)
    u.buffer[:] = raw
    return store.commit(u)


def accumulate(
    store: Store,
    key: int,
    index: int,
    offset: int,
    delta: np.ndarray,
    alpha: float = 1.0,
    *,
    from_source: bool = False,
) -> int:
    """An accumulate whose payload is copied in, or (``from_source``) left where the
    client put it, read-only, as a shm daemon leaves a staged one."""
    raw = as_u8(delta)
    u = store.begin_update(Op.ACCUMULATE, key, index, offset, raw.nbytes, alpha=alpha)
    if from_source:
        source = raw.copy()
        source.flags.writeable = False
        u.source = source
    else:
        u.buffer[:] = raw
    return store.commit(u)


# -- StoreError --------------------------------------------------------------


def test_store_error_carries_status() -> None:
    e = StoreError(Status.NO_SPACE, "full")
    assert e.status == Status.NO_SPACE
    assert e.message == "full"
    assert str(e) == "full"


# -- create ------------------------------------------------------------------


def test_create_allocates_only_owned_shards(arena: Arena) -> None:
    calls: list[tuple[int, int]] = []

    def owns(key: int, shard: int) -> bool:
        calls.append((key, shard))
        return shard % 2 == 0

    store = Store(arena, owns)
    meta = TensorMeta("t", "float32", (10001,), 8192)  # 40004 bytes: 5 shards, last 7236
    tensor, created = store.create(meta)
    assert created
    assert tensor.meta is meta
    assert sorted(tensor.shards) == [0, 2, 4]
    assert calls == [(meta.key, i) for i in range(5)]
    assert [tensor.shards[i].nbytes for i in (0, 2, 4)] == [8192, 8192, 7236]
    assert tensor.shards[4].block.size == round_up(7236)
    assert arena.used == 3 * 8192
    assert tensor.version == 0
    assert store.tensors[meta.key] is tensor
    offsets = sorted(s.block.offset for s in tensor.shards.values())
    assert len(set(offsets)) == 3

    odd = Store(Arena(1 << 20), lambda key, shard: shard % 2 == 1)
    try:
        t2, _ = odd.create(meta)
        assert sorted(t2.shards) == [1, 3]
        assert odd.arena.used == 2 * 8192
    finally:
        odd.arena.close()


def test_create_zero_fills_reused_block(arena: Arena) -> None:
    dirty = arena.alloc(3 * PAGE)
    arena.view(dirty)[:] = 0xAB
    arena.free(dirty)
    store = Store(arena, everything)
    tensor, _ = store.create(TensorMeta("t", "uint8", (3 * PAGE - 100,), 3 * PAGE))
    block = tensor.shards[0].block
    assert block.offset == dirty.offset  # the dirty block really was reused
    assert not arena.view(block).any()  # the whole block, even past nbytes


def test_create_zero_fills_after_delete(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "uint8", (PAGE,), PAGE)
    store.create(meta)
    # Two partial writes apply in place, so the shard's own block gets dirty.
    write(store, meta.key, 0, 0, b"\xff" * (PAGE - 1))
    write(store, meta.key, 0, PAGE - 1, b"\xff")
    block = store.tensors[meta.key].shards[0].block
    offset = block.offset
    assert arena.view(block).tobytes() == b"\xff" * PAGE
    store.delete(meta.key)
    store.create(meta)
    assert store.tensors[meta.key].shards[0].block.offset == offset
    assert shard_bytes(store, meta.key, 0) == bytes(PAGE)


def test_create_idempotent_with_same_layout(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "int32", (3000,), 4096)
    tensor, created = store.create(meta)
    assert created
    write(store, meta.key, 1, 0, rand_bytes(4096))
    before = all_bytes(store)
    used = arena.used
    for again in (
        TensorMeta("t", "int32", (3000,), 4096, {"note": "other options"}),
        TensorMeta("t", "int32", (3000,), 4096),
    ):
        t2, created2 = store.create(again)
        assert t2 is tensor
        assert not created2
        # replace with the same layout keeps the data too.
        t3, created3 = store.create(again, replace=True)
        assert t3 is tensor
        assert not created3
    assert arena.used == used
    assert all_bytes(store) == before
    assert store.tensors[meta.key].shards[1].version == 1


def test_check_create_says_what_create_would_and_changes_nothing(arena: Arena) -> None:
    store = Store(arena, everything)
    old = TensorMeta("t", "float32", (1000,), 4096)
    store.create(old)
    write(store, old.key, 0, 0, np.ones(1000, np.float32))
    before, used = all_bytes(store), arena.used
    bigger = TensorMeta("t", "float32", (300_000,), 4096)  # 1.2 MB: more than the arena
    with pytest.raises(StoreError) as ei:
        store.check_create(bigger, replace=True)
    assert ei.value.status == Status.NO_SPACE
    with pytest.raises(StoreError) as ei:
        store.check_create(TensorMeta("t", "float64", (1000,), 4096))
    assert ei.value.status == Status.DTYPE_MISMATCH
    store.check_create(TensorMeta("t", "float32", (2000,), 4096), replace=True)  # fits
    store.check_create(old)  # kept as it is
    assert all_bytes(store) == before and arena.used == used
    assert store.tensors[old.key].meta == old


def test_create_exclusive(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "float32", (100,), 4096)
    tensor, created = store.create(meta, exclusive=True)
    assert created
    used = arena.used
    for m in (meta, TensorMeta("t", "float64", (100,), 4096)):
        with pytest.raises(StoreError) as ei:
            store.create(m, exclusive=True)
        assert ei.value.status == Status.EXISTS
        with pytest.raises(StoreError) as ei:
            store.create(m, exclusive=True, replace=True)
        assert ei.value.status == Status.EXISTS
    assert store.tensors[meta.key] is tensor
    assert arena.used == used


@pytest.mark.parametrize(
    ("other", "status"),
    [
        (TensorMeta("t", "int32", (64, 64), 8192), Status.DTYPE_MISMATCH),
        (TensorMeta("t", "float64", (64, 64), 8192), Status.DTYPE_MISMATCH),
        (TensorMeta("t", "int32", (8, 8), 8192), Status.DTYPE_MISMATCH),
        (TensorMeta("t", "float32", (64, 65), 8192), Status.SHAPE_MISMATCH),
        (TensorMeta("t", "float32", (4096,), 8192), Status.SHAPE_MISMATCH),
        (TensorMeta("t", "float32", (64, 64), 4096), Status.SHAPE_MISMATCH),
    ],
)
def test_create_different_layout_refused(arena: Arena, other: TensorMeta, status: Status) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "float32", (64, 64), 8192)
    tensor, _ = store.create(meta)
    write(store, meta.key, 0, 0, rand_bytes(8192))
    before = all_bytes(store)
    used = arena.used
    with pytest.raises(StoreError) as ei:
        store.create(other)
    assert ei.value.status == status
    assert store.tensors[meta.key] is tensor
    assert tensor.meta is meta
    assert arena.used == used
    assert all_bytes(store) == before


def test_create_replace_retires_old_blocks(arena: Arena) -> None:
    store = Store(arena, everything)
    old = TensorMeta("t", "float32", (2048,), 4096)  # 2 shards of one page
    store.create(old)
    write(store, old.key, 0, 0, rand_bytes(4096, 1))
    write(store, old.key, 1, 0, rand_bytes(4096, 2))
    assert arena.used == 2 * PAGE
    new = TensorMeta("t", "int16", (10000,), 8192)  # 20000 bytes: 8192 + 8192 + 3616
    tensor, created = store.create(new, replace=True)
    assert created
    assert tensor.meta is new
    assert store.tensors[new.key] is tensor
    assert sorted(tensor.shards) == [0, 1, 2]
    assert arena.used == 8192 + 8192 + PAGE  # the old blocks were freed
    for i in range(3):
        assert not any(shard_bytes(store, new.key, i))
    with pytest.raises(StoreError) as ei:
        store.catalogue.get(new.key, old.layout)
    assert ei.value.status == Status.STALE_LAYOUT
    assert store.catalogue.get(new.key, new.layout) is tensor


def test_a_replaced_shard_goes_on_from_the_old_ones_version(arena: Arena) -> None:
    store = Store(arena, everything)
    old = TensorMeta("t", "float32", (1024,), 4096)  # 1 shard
    store.create(old)
    for n in range(3):
        write(store, old.key, 0, 0, rand_bytes(4096, n))
    assert store.tensors[old.key].shards[0].version == 3
    new = TensorMeta("t", "int16", (4096,), 4096)  # 2 shards: shard 1 is new to the key
    tensor, _ = store.create(new, replace=True)
    assert {i: s.version for i, s in tensor.shards.items()} == {0: 4, 1: 0}
    assert store.catalogue.info(tensor).shards == {0: 4, 1: 0}


def test_create_replace_keeps_pinned_old_block_until_unpin(arena: Arena) -> None:
    store = Store(arena, everything)
    old = TensorMeta("t", "uint8", (PAGE,), PAGE)
    t_old, _ = store.create(old)
    write(store, old.key, 0, 0, b"\x11" * PAGE)
    block = store.pin(t_old.shards[0].block)
    view = arena.view(block)
    store.create(TensorMeta("t", "uint8", (2 * PAGE,), 2 * PAGE), replace=True)
    assert arena.used == PAGE + 2 * PAGE
    assert block.retired
    assert view.tobytes() == b"\x11" * PAGE
    store.unpin(block)
    assert arena.used == 2 * PAGE


def test_create_all_or_nothing(arena: Arena) -> None:
    store = Store(arena, everything)
    fill(arena, leave=2 * PAGE)
    used = arena.used
    meta = TensorMeta("t", "uint8", (3 * PAGE,), PAGE)  # 3 shards, room for 2
    with pytest.raises(StoreError) as ei:
        store.create(meta)
    assert ei.value.status == Status.NO_SPACE
    assert "shard 2" in ei.value.message
    assert arena.used == used
    assert meta.key not in store.tensors
    # Nothing leaked: the two pages are still free and contiguous.
    assert arena.alloc(2 * PAGE).size == 2 * PAGE


def test_failed_replace_keeps_old_tensor(arena: Arena) -> None:
    store = Store(arena, everything)
    old = TensorMeta("t", "uint8", (PAGE,), PAGE)
    tensor, _ = store.create(old)
    write(store, old.key, 0, 0, b"\x42" * PAGE)
    fill(arena, leave=PAGE)
    used = arena.used
    with pytest.raises(StoreError) as ei:
        store.create(TensorMeta("t", "uint8", (2 * PAGE,), PAGE), replace=True)
    assert ei.value.status == Status.NO_SPACE
    assert arena.used == used
    assert store.tensors[old.key] is tensor
    assert tensor.meta is old
    assert shard_bytes(store, old.key, 0) == b"\x42" * PAGE


def test_create_zero_size_tensor(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("z", "float32", (0, 5), 4096)
    tensor, created = store.create(meta)
    assert created
    assert list(tensor.shards) == [0]
    assert tensor.shards[0].nbytes == 0
    assert arena.used == 0
    assert write(store, meta.key, 0, 0, b"") == 1
    assert accumulate(store, meta.key, 0, 0, np.zeros(0, np.float32), 2.0) == 2
    assert arena.used == 0
    store.delete(meta.key)
    assert arena.used == 0


def test_create_key_collision(arena: Arena) -> None:
    store = Store(arena, everything)
    a = TensorMeta("a", "uint8", (10,), 4096)
    b = TensorMeta("b", "uint8", (10,), 4096)
    store.create(a)
    # Simulate a 64-bit key collision: "a" is stored under "b"'s key. The
    # create is refused as MOVED (the client then places "b" by a salted key).
    store.tensors[b.key] = store.tensors.pop(a.key)
    with pytest.raises(StoreError, match="holds tensor 'a'") as ei:
        store.create(b)
    assert ei.value.status == Status.MOVED


# -- delete, get, list, info -------------------------------------------------


def test_delete(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "float32", (3000,), 4096)
    store.create(meta)
    assert arena.used == 3 * PAGE
    assert store.delete(meta.key) == meta
    assert meta.key not in store.tensors
    assert arena.used == 0
    for fn in (store.delete, store.catalogue.get):
        with pytest.raises(StoreError) as ei:
            fn(meta.key)
        assert ei.value.status == Status.NOT_FOUND


def test_delete_pinned_frees_on_unpin(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "uint8", (2 * PAGE,), PAGE)
    tensor, _ = store.create(meta)
    block = store.pin(store.pin(tensor.shards[1].block))
    store.delete(meta.key)
    assert arena.used == PAGE
    store.unpin(block)
    assert arena.used == PAGE
    store.unpin(block)
    assert arena.used == 0


def test_get_checks_layout(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "float32", (10,), 4096)
    tensor, _ = store.create(meta)
    assert store.catalogue.get(meta.key) is tensor
    assert store.catalogue.get(meta.key, 0) is tensor
    assert store.catalogue.get(meta.key, meta.layout) is tensor
    for other in (
        TensorMeta("t", "float64", (10,), 4096),
        TensorMeta("t", "float32", (11,), 4096),
        TensorMeta("t", "float32", (10,), 8192),
    ):
        with pytest.raises(StoreError) as ei:
            store.catalogue.get(meta.key, other.layout)
        assert ei.value.status == Status.STALE_LAYOUT
    with pytest.raises(StoreError) as ei:
        store.catalogue.get(tensor_key("nope"))
    assert ei.value.status == Status.NOT_FOUND


def test_list_and_info(arena: Arena) -> None:
    hidden = tensor_key("a/y")

    def owns(key: int, shard: int) -> bool:
        return key != hidden and shard % 2 == 0

    store = Store(arena, owns)
    for name in ("b/z", "a/y", "a/x", "a/w"):
        store.create(TensorMeta(name, "uint8", (3 * PAGE,), PAGE))
    assert [d.meta.name for d in store.catalogue.list("a/")] == ["a/w", "a/x"]
    assert [d.meta.name for d in store.catalogue.list()] == ["a/w", "a/x", "b/z"]
    assert store.catalogue.list("c/") == []
    # A limit gives the first by name (of those this daemon holds shards of).
    assert [d.meta.name for d in store.catalogue.list("", limit=2)] == ["a/w", "a/x"]
    assert [d.meta.name for d in store.catalogue.list("a/", limit=1)] == ["a/w"]
    assert [d.meta.name for d in store.catalogue.list("b/", limit=5)] == ["b/z"]
    key = tensor_key("a/x")
    write(store, key, 0, 0, b"x")
    write(store, key, 0, 1, b"y")
    write(store, key, 2, 0, b"z")
    info = store.catalogue.info(store.tensors[key])
    assert info.meta == TensorMeta("a/x", "uint8", (3 * PAGE,), PAGE)
    assert info.shards == {0: 2, 2: 1}
    assert info.version == 3
    assert info.mtime >= info.ctime


def test_read_view(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "uint8", (2 * PAGE,), PAGE)
    store.create(meta)
    data = rand_bytes(PAGE)
    write(store, meta.key, 1, 0, data)
    shard, view = store.read_view(meta.key, 1, 10, 20)
    assert shard is store.tensors[meta.key].shards[1]
    assert view.tobytes() == data[10:30]
    with pytest.raises(StoreError) as ei:
        store.read_view(meta.key, 1, PAGE - 5, 6)
    assert ei.value.status == Status.OUT_OF_RANGE


# -- begin_update validation -------------------------------------------------

F32 = TensorMeta("f", "float32", (5000,), 8192)  # shards 0, 1 (8192 bytes), 2 (3616 bytes)
BOOL = TensorMeta("b", "bool", (100,), 4096)
I32 = TensorMeta("i", "int32", (100,), 4096)
U8 = TensorMeta("u", "uint8", (100,), 4096)
I8 = TensorMeta("s", "int8", (100,), 4096)
W, A = Op.WRITE, Op.ACCUMULATE
I32_CODE = DTYPE_CODES["int32"]
STALE = TensorMeta("f", "float32", (5001,), 8192).layout

BAD_UPDATES = [
    # (tensor, op, shard, offset, size, keywords, status)
    ("missing", W, 0, 0, 4, {}, Status.NOT_FOUND),
    ("missing", A, 0, 0, 4, {}, Status.NOT_FOUND),
    ("f", W, 3, 0, 4, {}, Status.OUT_OF_RANGE),
    ("f", A, 100, 0, 4, {}, Status.OUT_OF_RANGE),
    ("f", W, 1, 0, 4, {}, Status.NOT_OWNER),
    ("f", A, 1, 0, 4, {}, Status.NOT_OWNER),
    ("f", W, 2, 3600, 20, {}, Status.OUT_OF_RANGE),
    ("f", W, 2, 0, 3617, {}, Status.OUT_OF_RANGE),
    ("f", W, 0, 0, 8193, {}, Status.OUT_OF_RANGE),
    ("f", W, 0, 8193, 0, {}, Status.OUT_OF_RANGE),
    ("f", A, 0, 8188, 8, {}, Status.OUT_OF_RANGE),
    ("f", W, 0, 0, 4, {"dtype": I32_CODE}, Status.DTYPE_MISMATCH),
    ("f", A, 0, 0, 4, {"dtype": DTYPE_CODES["float64"]}, Status.DTYPE_MISMATCH),
    ("f", W, 0, 0, 4, {"layout": STALE}, Status.STALE_LAYOUT),
    ("f", A, 0, 2, 8, {}, Status.BAD_ARGUMENT),
    ("f", A, 0, 0, 6, {}, Status.BAD_ARGUMENT),
    ("f", A, 2, 1, 3, {}, Status.BAD_ARGUMENT),
    ("f", A, 0, 0, 8, {"alpha": math.nan}, Status.BAD_ARGUMENT),
    ("f", A, 0, 0, 8, {"alpha": math.inf}, Status.BAD_ARGUMENT),
    ("f", A, 0, 0, 8, {"alpha": -math.inf}, Status.BAD_ARGUMENT),
    ("b", A, 0, 0, 10, {}, Status.DTYPE_MISMATCH),
    ("i", A, 0, 0, 8, {"alpha": 0.5}, Status.BAD_ARGUMENT),
    ("i", A, 0, 0, 8, {"alpha": -1.25}, Status.BAD_ARGUMENT),
    ("i", A, 0, 0, 8, {"alpha": math.nan}, Status.BAD_ARGUMENT),
    ("i", A, 0, 0, 8, {"alpha": 2.0**31}, Status.BAD_ARGUMENT),
    ("u", A, 0, 0, 8, {"alpha": -1.0}, Status.BAD_ARGUMENT),
    ("u", A, 0, 0, 8, {"alpha": 256.0}, Status.BAD_ARGUMENT),
    ("s", A, 0, 0, 8, {"alpha": 128.0}, Status.BAD_ARGUMENT),
    ("s", A, 0, 0, 8, {"alpha": -129.0}, Status.BAD_ARGUMENT),
]


def populated_store(arena: Arena) -> Store:
    store = Store(arena, even)
    for i, meta in enumerate((F32, BOOL, I32, U8, I8)):
        tensor, _ = store.create(meta)
        for index, shard in tensor.shards.items():
            write(store, meta.key, index, 0, rand_bytes(shard.nbytes, 10 * i + index))
    return store


@pytest.mark.parametrize(("name", "op", "index", "offset", "size", "kw", "status"), BAD_UPDATES)
def test_begin_update_refuses(
    arena: Arena, name: str, op: Op, index: int, offset: int, size: int, kw: dict, status: Status
) -> None:
    store = populated_store(arena)
    before = all_bytes(store)
    vers = versions(store)
    used = arena.used
    with pytest.raises(StoreError) as ei:
        store.begin_update(op, tensor_key(name), index, offset, size, **kw)
    assert ei.value.status == status, ei.value.message
    assert arena.used == used
    assert all_bytes(store) == before
    assert versions(store) == vers


@pytest.mark.parametrize(
    ("name", "op", "kw"),
    [
        ("b", W, {}),  # bool tensors can be written, just not accumulated
        ("f", W, {"alpha": math.nan}),  # a write ignores alpha
        ("i", A, {"alpha": -3.0}),
        ("u", A, {"alpha": 255.0}),
        ("s", A, {"alpha": -128.0}),
        ("f", A, {"alpha": 1e30, "dtype": DTYPE_CODES["float32"], "layout": F32.layout}),
    ],
)
def test_begin_update_accepts(arena: Arena, name: str, op: Op, kw: dict) -> None:
    store = populated_store(arena)
    used = arena.used
    u = store.begin_update(op, tensor_key(name), 0, 0, 8, **kw)
    assert len(u.buffer) == 8
    assert u.buffer.dtype == np.uint8
    assert arena.used == used + PAGE  # staging
    store.abort(u)
    assert arena.used == used


BAD = Status.BAD_ARGUMENT


@pytest.mark.parametrize(
    ("dtype", "alpha", "status"),
    [
        ("bool", 1.0, Status.DTYPE_MISMATCH),
        ("float32", math.nan, BAD),
        ("float64", math.inf, BAD),
        ("complex64", -math.inf, BAD),
        ("float16", 1e3, None),
        ("complex128", -0.5, None),
        ("int64", 2.0**62, None),
        ("int64", 0.5, BAD),
        ("uint64", 2.0**63, None),
        ("uint64", 2.0**64, BAD),
        ("uint16", 65535.0, None),
        ("uint16", 65536.0, BAD),
        ("int16", -32768.0, None),
        ("int16", -32769.0, BAD),
        ("int8", math.nan, BAD),
    ],
)
def test_check_alpha(dtype: str, alpha: float, status: Status | None) -> None:
    if status is None:
        check_alpha(np.dtype(dtype), alpha)
    else:
        with pytest.raises(StoreError) as ei:
            check_alpha(np.dtype(dtype), alpha)
        assert ei.value.status == status


# -- write -------------------------------------------------------------------


def test_write_whole_shard(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "uint8", (3 * PAGE,), 2 * PAGE)  # shards of 8192 and 4096 bytes
    store.create(meta)
    used = arena.used
    for index, n in ((0, 2 * PAGE), (1, PAGE)):
        data = rand_bytes(n, index)
        assert write(store, meta.key, index, 0, data) == 1
        assert shard_bytes(store, meta.key, index) == data
        assert arena.used == used
    # The other shard is untouched by a write to one.
    assert shard_bytes(store, meta.key, 0) == rand_bytes(2 * PAGE, 0)


def test_write_partial(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "uint8", (2 * PAGE,), 2 * PAGE)
    tensor, _ = store.create(meta)
    base = rand_bytes(2 * PAGE, 1)
    write(store, meta.key, 0, 0, base)
    block = tensor.shards[0].block
    unpinned_view = arena.view(block)
    used = arena.used
    patch = b"hello, shard"
    assert write(store, meta.key, 0, 100, patch) == 2
    expected = base[:100] + patch + base[100 + len(patch) :]
    assert shard_bytes(store, meta.key, 0) == expected
    # Unpinned: applied in place, in the same block.
    assert tensor.shards[0].block is block
    assert unpinned_view.tobytes() == expected
    assert arena.used == used
    # Writing the very last byte and an empty range are fine too.
    write(store, meta.key, 0, 2 * PAGE - 1, b"!")
    write(store, meta.key, 0, 2 * PAGE, b"")
    assert shard_bytes(store, meta.key, 0)[-1:] == b"!"


# -- accumulate --------------------------------------------------------------


def small_values(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
    """Values whose sums and scaled sums are exact in every tested dtype."""
    rng = np.random.default_rng(seed)
    if dtype.kind == "c":
        return (rng.integers(-100, 100, n) + 1j * rng.integers(-100, 100, n)).astype(dtype)
    return rng.integers(-100, 100, n).astype(dtype)


@pytest.mark.parametrize(
    ("dtype", "alpha"),
    [
        ("float32", 0.5),
        ("float32", 1.0),
        ("float64", -2.0),
        ("int32", -3.0),
        ("int32", 1.0),
        ("complex64", 2.0),
        ("complex64", -0.25),
    ],
)
def test_accumulate(arena: Arena, dtype: str, alpha: float) -> None:
    store = Store(arena, everything)
    dt = np.dtype(dtype)
    n_elems = 3000
    per_shard = 1024
    meta = TensorMeta("t", dtype, (n_elems,), per_shard * dt.itemsize)
    store.create(meta)
    init = small_values(dt, n_elems, 1)
    for s in range(meta.num_shards):
        write(store, meta.key, s, 0, init[s * per_shard : (s + 1) * per_shard])
    used = arena.used

    def shard_array(index: int) -> np.ndarray:
        return np.frombuffer(shard_bytes(store, meta.key, index), dtype=dt)

    # Whole shard 1.
    d1 = small_values(dt, per_shard, 2)
    assert accumulate(store, meta.key, 1, 0, d1, alpha) == 2
    expected1 = init[per_shard : 2 * per_shard] + (d1 * dt.type(alpha)).astype(dt)
    np.testing.assert_array_equal(shard_array(1), expected1)
    # Part of the short last shard, twice.
    d2 = small_values(dt, 100, 3)
    lo = 10 * dt.itemsize
    accumulate(store, meta.key, 2, lo, d2, alpha)
    assert accumulate(store, meta.key, 2, lo, d2, alpha) == 3
    expected2 = init[2 * per_shard :].copy()
    expected2[10:110] += 2 * (d2 * dt.type(alpha)).astype(dt)
    np.testing.assert_array_equal(shard_array(2), expected2)
    # Shard 0 untouched; no memory kept.
    np.testing.assert_array_equal(shard_array(0), init[:per_shard])
    assert arena.used == used


def test_accumulate_int_wraps(arena: Arena) -> None:
    store = Store(arena, everything)
    meta = TensorMeta("t", "int8", (4,), 4096)
    store.create(meta)
    write(store, meta.key, 0, 0, np.array([100, -100, 0, 1], np.int8))
    accumulate(store, meta.key, 0, 0, np.array([50, -50, 127, 2], np.int8), 2.0)
    got = np.frombuffer(shard_bytes(store, meta.key, 0), np.int8)
    assert got.tolist() == [-56, 56, -2, 5]


float32_arrays = hnp.arrays(np.float32, st.integers(0, 64), elements=st.floats(width=32))
alphas = st.one_of(st.just(1.0), st.floats(width=32, allow_nan=False, allow_infinity=False))


@settings(max_examples=200, deadline=None)
@given(st.data(), alphas)
def test_accumulate_into_and_copy_bit_identical(data: st.DataObject, alpha: float) -> None:
    target = data.draw(float32_arrays)
    delta = data.draw(hnp.arrays(np.float32, target.shape, elements=st.floats(width=32)))
    with np.errstate(all="ignore"):
        t1, d1 = target.copy(), delta.copy()
        accumulate_into(t1, d1, alpha)
        t2, d2 = target.copy(), delta.copy()
        accumulate_copy(t2, d2, alpha)
        reference = target + delta * np.float32(alpha)
    assert t1.dtype == d2.dtype == np.float32
    assert t1.view(np.uint32).tolist() == d2.view(np.uint32).tolist()
    np.testing.assert_array_equal(t1, reference)
    # accumulate_copy leaves the target alone.
    assert t2.view(np.uint32).tolist() == target.view(np.uint32).tolist()


@pytest.mark.parametrize("alpha", [1.0, 0.5, -3.0])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_accumulate_from_leaves_its_source_and_matches_accumulate_into(
    dtype: str, alpha: float
) -> None:
    """Applied from read-only memory in pieces: the same bits as a scaled copy added."""
    dt = np.dtype(dtype)
    n = 3 * ACCUMULATE_PIECE // dt.itemsize + 17  # several pieces and a short one
    rng = np.random.default_rng(7)
    # Arbitrary bit patterns (floats: normals, subnormals, infinities, NaNs).
    bits = np.dtype(f"u{dt.itemsize}")
    target = rng.integers(0, np.iinfo(bits).max, n, dtype=bits, endpoint=True).view(dt)
    source = rng.integers(0, np.iinfo(bits).max, n, dtype=bits, endpoint=True).view(dt)
    source.flags.writeable = False
    kept = source.copy()
    with np.errstate(all="ignore"):
        t1 = target.copy()
        accumulate_from(t1, source, alpha)
        t2 = target.copy()
        accumulate_into(t2, source.copy(), alpha)
    assert t1.tobytes() == t2.tobytes()
    assert source.tobytes() == kept.tobytes()


def random_float32(n: int, seed: int) -> np.ndarray:
    """Arbitrary bit patterns: normals, subnormals, infinities and NaNs."""
    return np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint32).view(np.float32)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32), alphas)
def test_store_accumulate_paths_bit_identical(seed: int, alpha: float) -> None:
    """Unpinned (in place), pinned whole shard (into staging) and pinned partial
    (copy-on-write) accumulates must store the same bits."""
    n = PAGE // 4
    init = random_float32(n, seed)
    delta = random_float32(n, seed + 1)
    results = accumulated_on_every_path(init, delta, alpha)
    with np.errstate(all="ignore"):
        expected = (init + delta * np.float32(alpha)).tobytes()
    assert results == [expected] * 6


def accumulated_on_every_path(init: np.ndarray, delta: np.ndarray, alpha: float) -> list[bytes]:
    """The shard bytes ``init`` becomes after accumulating ``delta`` (one page) on each
    store path: unpinned (in place), pinned whole shard (into staging) and pinned
    partial (copy-on-write, two halves), each from a received payload and from the
    client's memory: six results."""
    n = len(init)
    arena = Arena(16 * PAGE)
    try:
        store = Store(arena, everything)
        results = []
        with np.errstate(all="ignore"):
            cases = [("a", False, False), ("b", True, False), ("c", True, True)]
            for (name, pinned, split), source in itertools.product(cases, (False, True)):
                meta = TensorMeta(f"{name}{source}", init.dtype.name, (n,), PAGE)
                tensor, _ = store.create(meta)
                write(store, meta.key, 0, 0, init)
                if pinned:
                    store.pin(tensor.shards[0].block)
                if split:  # two halves: each is a partial (copy-on-write) update
                    halves = ((0, delta[: n // 2]), (PAGE // 2, delta[n // 2 :]))
                else:
                    halves = ((0, delta),)
                for offset, part in halves:
                    accumulate(store, meta.key, 0, offset, part, alpha, from_source=source)
                results.append(shard_bytes(store, meta.key, 0))
        return results
    finally:
        arena.close()


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_narrow_floats_accumulate_in_float32_rounded_once(dtype: str) -> None:
    """bfloat16 and float8: ``target + alpha * delta`` taken in float32 and
    rounded back once, on every path (in place, from the client's memory,
    pinned whole shard, pinned part), not in the narrow type's own arithmetic."""
    dt = np.dtype(dtype)
    n = PAGE // dt.itemsize
    bits = np.dtype(f"u{dt.itemsize}")
    rng = np.random.default_rng(11)
    init = rng.integers(0, np.iinfo(bits).max, n, dtype=bits, endpoint=True).view(dt)
    delta = rng.integers(0, np.iinfo(bits).max, n, dtype=bits, endpoint=True).view(dt)
    alpha = 0.3
    results = accumulated_on_every_path(init, delta, alpha)
    with np.errstate(all="ignore"):
        wide = init.astype(np.float32) + delta.astype(np.float32) * np.float32(alpha)
        expected = wide.astype(dt).tobytes()
        own_arithmetic = (init + delta * alpha).tobytes()
    assert results == [expected] * 6
    assert expected != own_arithmetic  # the rule is not what ml_dtypes' ufuncs give


# -- pins and copy-on-write --------------------------------------------------


@pytest.fixture
def cow(arena: Arena) -> tuple[Store, TensorMeta]:
    store = Store(arena, everything)
    meta = TensorMeta("t", "float32", (3 * PAGE // 4,), 2 * PAGE)  # shards of 8192 and 4096
    store.create(meta)
    write(store, meta.key, 0, 0, np.arange(2 * PAGE // 4, dtype=np.float32))
    write(store, meta.key, 1, 0, np.arange(PAGE // 4, dtype=np.float32))
    return store, meta


COW_CASES = ["write-whole", "write-part", "acc-whole", "acc-part"]


def apply(store: Store, meta: TensorMeta, case: str) -> np.ndarray:
    """Apply ``case`` to shard 0; return the float32 values shard 0 must then hold."""
    n = 2 * PAGE // 4
    old = np.arange(n, dtype=np.float32)
    new = old.copy()
    if case == "write-whole":
        new = np.full(n, 7.0, np.float32)
        write(store, meta.key, 0, 0, new)
    elif case == "write-part":
        new[10:20] = -1.0
        write(store, meta.key, 0, 40, new[10:20])
    elif case == "acc-whole":
        accumulate(store, meta.key, 0, 0, np.ones(n, np.float32), 3.0)
        new += 3.0
    else:
        accumulate(store, meta.key, 0, 400, np.ones(50, np.float32), -2.0)
        new[100:150] -= 2.0
    return new


@pytest.mark.parametrize("case", COW_CASES)
def test_pinned_update_is_copy_on_write(cow: tuple[Store, TensorMeta], case: str) -> None:
    store, meta = cow
    arena = store.arena
    shard = store.tensors[meta.key].shards[0]
    base = arena.used
    old_block = store.pin(shard.block)
    old_view = arena.view(old_block, 0, shard.nbytes).view(np.float32)
    old_values = old_view.copy()
    expected = apply(store, meta, case)
    # The reader's view still shows the old bytes; the shard has the new ones.
    np.testing.assert_array_equal(old_view, old_values)
    assert shard.block is not old_block
    assert old_block.retired
    got = np.frombuffer(shard_bytes(store, meta.key, 0), np.float32)
    np.testing.assert_array_equal(got, expected)
    assert shard.version == 2
    # The old block stays allocated while pinned, and is freed on unpin.
    assert arena.used == base + old_block.size
    store.unpin(old_block)
    assert arena.used == base
    # Shard 1 was not involved.
    np.testing.assert_array_equal(
        np.frombuffer(shard_bytes(store, meta.key, 1), np.float32),
        np.arange(PAGE // 4, dtype=np.float32),
    )


@pytest.mark.parametrize("case", COW_CASES)
def test_unpinned_update_keeps_memory(cow: tuple[Store, TensorMeta], case: str) -> None:
    store, meta = cow
    base = store.arena.used
    expected = apply(store, meta, case)
    got = np.frombuffer(shard_bytes(store, meta.key, 0), np.float32)
    np.testing.assert_array_equal(got, expected)
    assert store.arena.used == base


def test_pins_count(cow: tuple[Store, TensorMeta]) -> None:
    store, meta = cow
    base = store.arena.used
    shard = store.tensors[meta.key].shards[0]
    block = store.pin(store.pin(shard.block))
    assert block.pins == 2
    apply(store, meta, "write-part")
    store.unpin(block)
    assert store.arena.used == base + block.size
    store.unpin(block)
    assert store.arena.used == base
    # Pin and unpin without an update: nothing is freed.
    live = store.pin(shard.block)
    store.unpin(live)
    assert not live.retired
    assert store.arena.used == base
    assert shard.block is live


# -- commit, abort, versions -------------------------------------------------


def test_versions_increase_by_one_per_commit(cow: tuple[Store, TensorMeta]) -> None:
    store, meta = cow
    tensor = store.tensors[meta.key]
    assert tensor.shards[0].version == 1
    mtime = tensor.shards[0].mtime
    got = [
        write(store, meta.key, 0, 0, b"\0" * 8),
        accumulate(store, meta.key, 0, 0, np.ones(4, np.float32)),
        write(store, meta.key, 0, 8, b"\1" * 8),
        accumulate(store, meta.key, 0, 4, np.ones(1, np.float32)),
    ]
    assert got == [2, 3, 4, 5]
    assert tensor.shards[0].version == 5
    assert tensor.shards[1].version == 1
    assert tensor.version == 6
    assert tensor.shards[0].mtime >= mtime
    assert store.catalogue.info(tensor).shards == {0: 5, 1: 1}


def test_abort_frees_staging(cow: tuple[Store, TensorMeta]) -> None:
    store, meta = cow
    arena = store.arena
    before = all_bytes(store)
    base = arena.used
    u = store.begin_update(Op.WRITE, meta.key, 0, 0, 2 * PAGE)
    assert u.staging is not None
    assert arena.used == base + 2 * PAGE
    u.buffer[:] = 0xEE
    store.abort(u)
    assert arena.used == base
    store.abort(u)  # twice is harmless
    assert arena.used == base
    assert all_bytes(store) == before
    assert store.tensors[meta.key].shards[0].version == 1


def test_commit_after_delete(cow: tuple[Store, TensorMeta]) -> None:
    store, meta = cow
    arena = store.arena
    for op in (Op.WRITE, Op.ACCUMULATE):
        store.create(meta)
        u = store.begin_update(op, meta.key, 0, 0, 16)
        u.buffer[:] = 0
        assert arena.used == 3 * PAGE + PAGE
        store.delete(meta.key)
        assert arena.used == PAGE  # only the staging is left
        with pytest.raises(StoreError) as ei:
            store.commit(u)
        assert ei.value.status == Status.NOT_FOUND
        assert arena.used == 0


def test_commit_after_replace(cow: tuple[Store, TensorMeta]) -> None:
    store, meta = cow
    u = store.begin_update(Op.WRITE, meta.key, 0, 0, 16)
    u.buffer[:] = 0xFF
    before = store.tensors[meta.key].shards[0].version
    new, _ = store.create(TensorMeta("t", "float32", (PAGE // 4,), PAGE), replace=True)
    with pytest.raises(StoreError) as ei:
        store.commit(u)
    assert ei.value.status == Status.NOT_FOUND
    assert store.arena.used == PAGE
    assert shard_bytes(store, meta.key, 0) == bytes(PAGE)
    assert new.shards[0].version == before + 1  # the replace's own step; the commit added none


# -- arena pressure ----------------------------------------------------------


@pytest.mark.parametrize("case", COW_CASES)
def test_staging_falls_back_to_heap(cow: tuple[Store, TensorMeta], case: str) -> None:
    store, meta = cow
    arena = store.arena
    fill(arena)
    used = arena.used
    shard = store.tensors[meta.key].shards[0]
    block = shard.block
    u = store.begin_update(Op.WRITE, meta.key, 0, 0, 8)
    assert u.staging is None
    assert u.heap is not None
    assert u.buffer is u.heap
    assert not np.shares_memory(u.buffer, arena.buf)
    store.abort(u)
    expected = apply(store, meta, case)
    # Unpinned: applied in place, without any arena memory.
    got = np.frombuffer(shard_bytes(store, meta.key, 0), np.float32)
    np.testing.assert_array_equal(got, expected)
    assert shard.block is block
    assert shard.version == 2
    assert arena.used == used


@pytest.mark.parametrize("case", COW_CASES)
@pytest.mark.parametrize("leave", [0, PAGE])
def test_copy_on_write_without_space(cow: tuple[Store, TensorMeta], case: str, leave: int) -> None:
    """A pinned shard needs a new block; with none free the update fails cleanly.

    With ``leave`` = one page the staging of a partial update still fits in the
    arena (and must be freed again); otherwise it goes to the heap."""
    store, meta = cow
    arena = store.arena
    fill(arena, leave=leave)
    used = arena.used
    shard = store.tensors[meta.key].shards[0]
    block = store.pin(shard.block)
    before = all_bytes(store)
    with pytest.raises(StoreError) as ei:
        apply(store, meta, case)
    assert ei.value.status == Status.NO_SPACE
    assert arena.used == used
    assert shard.block is block
    assert not block.retired
    assert shard.version == 1
    assert all_bytes(store) == before
    store.unpin(block)
    assert arena.used == used  # the shard's block is live, not freed


# -- rename ------------------------------------------------------------------


def test_rename_keeps_key_bytes_and_ctime_and_moves_the_name(arena: Arena) -> None:
    store = Store(arena, everything)
    a = TensorMeta("m/a", "uint8", (3 * 4096,), 4096)
    tensor, _ = store.create(a)
    for i in range(3):
        write(store, a.key, i, 0, rand_bytes(4096, i))
    before, was = all_bytes(store), versions(store)
    used, ctime = arena.used, tensor.ctime
    renamed = store.rename(a.key, "m/a", "m/b")
    assert renamed is tensor and renamed.meta.name == "m/b" and renamed.meta.key == a.key
    assert renamed.meta.place == a.key and renamed.ctime == ctime
    assert all_bytes(store) == before and arena.used == used  # nothing copied
    assert versions(store) == {k: v + 1 for k, v in was.items()}
    assert store.catalogue.named("m/b") is tensor
    with pytest.raises(StoreError) as ei:
        store.catalogue.named("m/a")
    assert ei.value.status == Status.NOT_FOUND
    # Renamed back to its own name, it is an ordinary tensor again.
    assert store.rename(a.key, "m/b", "m/a").meta == a


def test_rename_of_a_name_not_at_that_key_is_not_found(arena: Arena) -> None:
    store = Store(arena, everything)
    a = TensorMeta("m/a", "uint8", (10,), 4096)
    store.create(a)
    for key, old in [(a.key, "m/other"), (tensor_key("m/other"), "m/a")]:
        with pytest.raises(StoreError) as ei:
            store.rename(key, old, "m/b")
        assert ei.value.status == Status.NOT_FOUND
    assert store.catalogue.named("m/a").meta == a


def test_a_create_meeting_a_renamed_tensor_is_refused_as_moved(arena: Arena) -> None:
    store = Store(arena, everything)
    a = TensorMeta("m/a", "uint8", (10,), 4096)
    store.create(a)
    store.rename(a.key, "m/a", "m/b")
    # "m/a" again: its own key is held by "m/b".
    with pytest.raises(StoreError, match="holds tensor 'm/b'") as ei:
        store.catalogue.check_moved(TensorMeta("m/a", "uint8", (10,), 4096))
    assert ei.value.status == Status.MOVED
    # "m/b" at its own key: the name is held under "m/a"'s key.
    with pytest.raises(StoreError, match="placed by key") as ei:
        store.catalogue.check_moved(TensorMeta("m/b", "uint8", (10,), 4096))
    assert ei.value.status == Status.MOVED
    # At a salted key, "m/a" is a tensor of its own beside "m/b".
    salted = TensorMeta("m/a", "uint8", (10,), 4096, place=tensor_key("m/a", 1))
    store.catalogue.check_moved(salted)
    store.create(salted)
    assert (
        store.catalogue.named("m/a").meta == salted
        and store.catalogue.named("m/b").meta.key == a.key
    )


def test_delete_by_name_spares_a_tensor_renamed_to_the_key(arena: Arena) -> None:
    store = Store(arena, everything)
    a = TensorMeta("m/a", "uint8", (10,), 4096)
    store.create(a)
    store.rename(a.key, "m/a", "m/b")
    with pytest.raises(StoreError) as ei:
        store.delete(a.key, "m/a")
    assert ei.value.status == Status.NOT_FOUND
    assert store.delete(a.key, "m/b").name == "m/b"
    assert store.tensors == {} and store.keys == {}


def test_install_of_a_renamed_copy_replaces_the_copy_under_the_old_name(arena: Arena) -> None:
    """A replica down during a rename catches up: the primary's copy carries the new name."""
    store = Store(arena, everything)
    a = TensorMeta("m/a", "uint8", (4096,), 4096)
    store.create(a)
    write(store, a.key, 0, 0, rand_bytes(4096, 1))
    b = TensorMeta("m/b", "uint8", (4096,), 4096, place=a.key)
    data = as_u8(rand_bytes(4096, 2))
    store.install_shard(b, 0, 7, data, {})
    assert store.catalogue.named("m/b").meta == b and "m/a" not in store.keys
    assert shard_bytes(store, a.key, 0) == data.tobytes()
