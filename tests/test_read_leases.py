"""A reader's lease on one whole-tensor write (irdma/client/leases.py, LEASE, the
daemons' psd/store/leases.py), against real daemons: ranges read at the write's
stamp make up that write however often the tensor is rewritten meanwhile, the
copies go at release, and with replicas a backup that takes over mid-stream
still serves it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trio

from irdma import AsyncClient, TornRead
from irdma.protocol import tensor_key

from .helpers.cluster import Cluster, make_cluster

N = 1 << 16  # float32: 256 KiB, four of the test cluster's 64 KiB shards
SHARD = (64 << 10) // 4


async def test_a_leased_write_is_read_whole_after_rewrites_and_let_go_at_release(
    cluster: Cluster,
) -> None:
    x = np.arange(N, dtype=np.float32)
    async with AsyncClient(cluster.config_path) as c, trio.open_nursery() as nursery:
        await c.write("ls/w", x, replace=True)
        lease = await c.lease("ls/w", nursery)  # before the first range: every copy
        head = np.empty(SHARD, np.float32)
        stamp = await c.read_range("ls/w", 0, head)
        await lease.keep(stamp)
        for value in range(1, 6):  # five rewrites: each shard keeps two copies unheld
            await c.write("ls/w", np.full(N, value, np.float32))
        rest = np.empty(N - SHARD, np.float32)
        assert await c.read_range("ls/w", SHARD * 4, rest, at=stamp) == stamp
        np.testing.assert_array_equal(np.concatenate([head, rest]), x)
        await lease.release()
        # Released: the daemons let the write go at once, no further write needed.
        with pytest.raises(TornRead):
            await c.read_range("ls/w", SHARD * 4, rest, at=stamp)
        np.testing.assert_array_equal(await c.read("ls/w"), np.full(N, 5, np.float32))


async def test_a_backup_taking_over_mid_stream_serves_the_leased_write(tmp_path: Path) -> None:
    """Every replica holds the lease (the reader asks each), and a backup applies its
    primary's whole writes as the primary does, keeping the held copy: when the
    primary of a shard dies mid-stream, its backup serves the rest of the write."""
    cluster = make_cluster(tmp_path, replicas=2, timeout=2.0)
    try:
        x = np.arange(N, dtype=np.float32)
        async with AsyncClient(cluster.config_path) as c, trio.open_nursery() as nursery:
            await c.write("lf/w", x, replace=True)
            lease = await c.lease("lf/w", nursery)
            head = np.empty(SHARD, np.float32)
            stamp = await c.read_range("lf/w", 0, head)
            await lease.keep(stamp)
            for value in range(1, 5):
                await c.write("lf/w", np.full(N, value, np.float32))
            victim = c.config.replicas_for(tensor_key("lf/w"), 1)[0].name
            cluster.kill(victim)  # the primary of the next shard the stream reads
            rest = np.empty(N - SHARD, np.float32)
            assert await c.read_range("lf/w", SHARD * 4, rest, at=stamp) == stamp
            np.testing.assert_array_equal(np.concatenate([head, rest]), x)
            await lease.release()
    finally:
        cluster.close()
