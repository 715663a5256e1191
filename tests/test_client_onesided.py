"""The one-sided reader (irdma/client/onesided.py): when a read copies straight out of a
daemon's arena, and that it then sends the daemon nothing. Real daemons."""

from __future__ import annotations

import numpy as np
import pytest

from irdma.client import AsyncClient
from irdma.client.onesided import ENV
from irdma.client.ranges import shard_pieces
from irdma.protocol import NO_WORKER, TensorMeta
from irdma.training.modes import Mode

from .helpers.cluster import Cluster


async def test_a_read_over_shared_memory_copies_without_asking(cluster: Cluster) -> None:
    x = np.arange(50_000, dtype=np.float32)
    async with AsyncClient(cluster.config_path, transport="shm") as c:
        await c.write("os/x", x)
        meta = (await c.stat("os/x")).meta
        reader = c.one_sided
        assert reader.allowed(meta, NO_WORKER)
        p = shard_pieces(meta, 0, meta.nbytes)[1]
        out = bytearray(p.length)
        got = await reader.read(meta, p, memoryview(out))
        assert got is not None and got.version >= 1
        node = c.config.primary_for(meta.key, p.shard)
        directory = c.session.conns[node.name].bulk.directory
        assert directory is not None and directory.reads >= 1
        assert np.array_equal(
            np.frombuffer(out, np.float32), x[p.buf_offset // 4 :][: p.length // 4]
        )
        whole = np.empty_like(x)
        assert await reader.read_whole(meta, memoryview(whole.view(np.uint8)), NO_WORKER)
        assert np.array_equal(whole, x)
        assert reader.read_now(meta, None) is None  # several shards: read the usual way
        await c.delete("os/x")


async def test_over_tcp_the_connection_says_the_daemon_must_be_asked(cluster: Cluster) -> None:
    async with AsyncClient(cluster.config_path, transport="tcp") as c:
        await c.write("os/t", np.ones(100, np.float32))
        meta = (await c.stat("os/t")).meta
        p = shard_pieces(meta, 0, meta.nbytes)[0]
        assert await c.one_sided.read(meta, p, memoryview(bytearray(p.length))) is None
        assert c.one_sided.read_now(meta, None) is None
        await c.delete("os/t")


async def test_one_shard_is_read_now_without_awaiting(cluster: Cluster) -> None:
    x = np.arange(100, dtype=np.float32)
    async with AsyncClient(cluster.config_path, transport="shm") as c:
        await c.write("os/now", x)
        meta = (await c.stat("os/now")).meta
        got = c.one_sided.read_now(meta, None)
        assert got is not None and np.array_equal(got, x)
        # An out of another shape is left to the usual read (which says why).
        assert c.one_sided.read_now(meta, np.empty(5, np.float32)) is None
        await c.delete("os/now")


def test_which_reads_may_be_one_sided(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    c = AsyncClient(cluster.config_path)
    sync = TensorMeta("os/s", "float32", (4,), 4096, Mode("sync").to_options())
    free = TensorMeta("os/a", "float32", (4,), 4096, Mode().to_options())
    assert c.one_sided.allowed(sync, NO_WORKER)
    # A training pull may have to wait for its step: only in async mode is it one-sided.
    assert not c.one_sided.allowed(sync, 0)
    assert c.one_sided.allowed(free, 0)
    monkeypatch.setenv(ENV, "0")
    assert not AsyncClient(cluster.config_path).one_sided.allowed(free, NO_WORKER)
