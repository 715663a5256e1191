"""Tests for irdma_psd.store.records: what a tensor's record says of its shards."""

from __future__ import annotations

from irdma_psd.arena import Block
from irdma_psd.store import Shard, Tensor

from irdma.protocol import TensorMeta


def test_a_tensors_version_and_mtime_come_from_its_local_shards() -> None:
    meta = TensorMeta("r/t", "uint8", (8192,), 4096)
    tensor = Tensor(meta, {}, ctime=5.0)
    assert (tensor.version, tensor.mtime) == (0, 5.0)  # no shard here: its creation
    tensor.shards = {
        0: Shard(0, 4096, Block(0, 4096), version=3, mtime=7.0),
        1: Shard(1, 4096, Block(4096, 4096), version=4, mtime=6.0),
    }
    assert (tensor.version, tensor.mtime) == (7, 7.0)


def test_a_shard_remembers_only_its_last_stamps() -> None:
    shard = Shard(0, 4096, Block(0, 4096))
    for stamp in range(1, 200):
        shard.stamps_seen.append(stamp)
    assert 1 not in shard.stamps_seen and 199 in shard.stamps_seen
