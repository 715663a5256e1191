"""fuse/content.py: what file a target shows of a tensor (pure: no mount, no daemons)."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
from irdma_fuse.content import file_buffer, file_size, identity, is_raw
from irdma_fuse.paths import RAW_OPTION, Kind, Target

from irdma import TensorInfo

SHARD = 4096


def info(
    shape: tuple[int, ...] = (3, 1000), dtype: str = "float32", **options: object
) -> TensorInfo:
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return TensorInfo(
        "m/w", dtype, shape, nbytes, SHARD, -(-nbytes // SHARD), 7, 1.0, 2.0, dict(options)
    )


def test_a_typed_file_is_the_npy_numpy_writes() -> None:
    t = info()
    data, body, start = file_buffer(Target(Kind.TENSOR, t.name, typed=True), t)
    array = np.arange(3000, dtype=np.float32).reshape(3, 1000)
    body[:] = array.view(np.uint8).reshape(-1)
    assert start == 0 and len(data) == file_size(Target(Kind.TENSOR, t.name, typed=True), t)
    np.testing.assert_array_equal(np.load(io.BytesIO(data.tobytes())), array)


def test_a_raw_file_is_the_bytes_alone() -> None:
    t = info(**{RAW_OPTION: True})
    target = Target(Kind.TENSOR, t.name, typed=False)
    data, body, start = file_buffer(target, t)
    assert is_raw(t) and not is_raw(info())
    assert start == 0 and len(data) == len(body) == t.nbytes == file_size(target, t)


def test_a_shard_file_is_that_shard_and_the_last_one_is_short() -> None:
    t = info()  # 12000 bytes: shards of 4096, 4096 and 3808
    sizes = [file_size(Target(Kind.SHARD, t.name, index=i), t) for i in range(3)]
    assert sizes == [4096, 4096, 12000 - 2 * 4096]
    _, body, start = file_buffer(Target(Kind.SHARD, t.name, index=2), t)
    assert start == 2 * SHARD and len(body) == sizes[2]
    assert file_size(Target(Kind.SHARD, t.name, index=3), t) == 0  # past the end


def test_an_accumulate_file_is_empty() -> None:
    assert file_size(Target(Kind.ACCUMULATE, "m/w", typed=True), info()) == 0


def test_identity_changes_with_version_creation_and_layout_only() -> None:
    t = info()
    assert identity(replace(t, mtime=99.0)) == identity(t)
    for changed in (
        replace(t, version=8),
        replace(t, ctime=3.0),
        replace(t, dtype="float16"),
        replace(t, shape=(1000, 3)),
    ):
        assert identity(changed) != identity(t)
