"""The mount's buffer pool: memory handed out again only once nothing uses it."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from irdma_fuse.buffers import MIN_KEPT, BufferPool

from irdma import Client

from .conftest import Cluster

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20


def test_a_free_array_is_handed_out_again() -> None:
    pool = BufferPool(64 * MIB)
    a = pool.take(8 * MIB)
    a[:] = 1  # its pages are touched now
    address = a.ctypes.data
    del a
    b = pool.take(6 * MIB)
    assert pool.reused == 1 and b.ctypes.data == address and len(b) == 6 * MIB


def hold(a: np.ndarray, holder: str) -> object:
    if holder == "array":
        return a
    if holder == "slice":
        return a[100:200]
    if holder == "memoryview":
        return memoryview(a[5:])
    return a[12:][20:].view(np.float32)  # a view of a view


@pytest.mark.parametrize("holder", ["array", "slice", "memoryview", "view of a view"])
def test_an_array_anything_refers_to_is_not_handed_out(holder: str) -> None:
    pool = BufferPool(64 * MIB)
    a = pool.take(8 * MIB)
    held = hold(a, holder)
    address = a.ctypes.data
    del a
    b = pool.take(8 * MIB)
    assert b.ctypes.data != address and pool.reused == 0
    del held, b
    assert pool.take(8 * MIB).ctypes.data == address  # free now: handed out again


def test_the_pool_keeps_at_most_its_bytes_and_no_small_arrays() -> None:
    pool = BufferPool(20 * MIB)
    arrays = [pool.take(8 * MIB) for _ in range(3)]
    assert pool.kept_bytes == 16 * MIB  # the third did not fit beside two in use
    del arrays
    pool.take(8 * MIB)
    assert pool.kept_bytes <= 20 * MIB
    small = pool.take(MIN_KEPT - 1)
    assert pool.kept_bytes <= 20 * MIB and small.base is None


def test_a_much_larger_array_is_not_used_for_a_small_file() -> None:
    pool = BufferPool(256 * MIB)
    big = pool.take(64 * MIB)
    address = big.ctypes.data
    del big
    assert pool.take(4 * MIB).ctypes.data != address  # it would waste 60 MiB
    assert pool.take(40 * MIB).ctypes.data == address


def test_files_read_and_written_one_after_another_keep_their_bytes(
    cluster: Cluster, mount: Path
) -> None:
    """Large files opened while others are open and after they closed (so their
    memory is reused): every read sees its own file's bytes."""
    d = mount / "pool"
    d.mkdir()
    rng = np.random.default_rng(7)
    xs = [rng.random(3 * MIB // 4, dtype=np.float32) for _ in range(4)]
    with Client(cluster.config_path) as c:
        for i, x in enumerate(xs[:2]):
            c.write(f"pool/x{i}", x)
    with open(d / "x0.npy", "rb") as held:  # open while the others come and go
        first = held.read(MIB)
        for i in (2, 3):
            np.save(d / f"x{i}.npy", xs[i])  # a writer's buffer
            assert np.array_equal(np.load(d / "x1.npy"), xs[1])  # a reader's
            assert np.array_equal(np.load(d / f"x{i}.npy"), xs[i])
        rest = held.read()
    assert np.array_equal(np.load(io.BytesIO(first + rest)), xs[0])
    with Client(cluster.config_path) as c:
        for i, x in enumerate(xs):
            assert np.array_equal(c.read(f"pool/x{i}"), x)
    # A read-write open starts from the stored bytes, in reused memory too.
    with open(d / "x3.npy", "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(np.float32(-1).tobytes())
    xs[3][-1] = -1
    assert np.array_equal(np.load(d / "x3.npy"), xs[3])
