"""The data path (irdma/client/datapath.py): one call's plan run piece by piece, and a
whole-tensor write that every piece of a read then names. Real daemons."""

from __future__ import annotations

import numpy as np
import pytest

import irdma
from irdma.client import AsyncClient
from irdma.client.datapath import DataPath
from irdma.client.onesided import OneSidedReader
from irdma.client.routing import Router
from irdma.narrowing import wire_code
from irdma.protocol import Op

from .helpers.cluster import Cluster

N = 100_000  # float32: 7 shards of 64 KiB


def data_path_of(c: AsyncClient) -> DataPath:
    router = Router(c.session.in_force, c.timeout, c.session)
    return DataPath(c.session, router, OneSidedReader(c.session, router))


async def test_a_whole_write_is_one_stamp_on_every_piece(cluster: Cluster) -> None:
    for transport in ("tcp", "shm"):
        async with AsyncClient(cluster.config_path, transport=transport) as c:
            await c.create("dp/w", N, np.float32, exist_ok=True)
            meta = (await c.stat("dp/w")).meta
            data = data_path_of(c)
            x = np.arange(N, dtype=np.float32)
            wrote = await data.move(Op.WRITE, meta, 0, memoryview(x.view(np.uint8)))
            assert len(wrote) == meta.num_shards
            assert len({s.stamp for s in wrote}) == 1 and wrote[0].stamp > 1
            out = np.empty(N, np.float32)
            read = await data.move(Op.READ, meta, 0, memoryview(out.view(np.uint8)))
            assert {s.stamp for s in read} == {wrote[0].stamp}
            assert np.array_equal(out, x)
            await c.delete("dp/w")


async def test_a_range_across_shards_moves_piece_by_piece(cluster: Cluster) -> None:
    async with AsyncClient(cluster.config_path) as c:
        await c.write("dp/r", np.zeros(N, np.float32))
        meta = (await c.stat("dp/r")).meta
        data = data_path_of(c)
        offset, patch = 65_000, np.full(20_000, 7, np.uint8)  # spans shards 0 and 1
        served = await data.move(Op.WRITE, meta, offset, memoryview(patch))
        assert len(served) == 2 and all(s.stamp == 0 for s in served)  # not a whole write
        back = bytearray(len(patch))
        await data.move(Op.READ, meta, offset, memoryview(back))
        assert bytes(back) == patch.tobytes()
        await c.delete("dp/r")


async def test_values_travel_narrowed_where_the_planner_lets_them(cluster: Cluster) -> None:
    async with AsyncClient(cluster.config_path) as c:
        x = np.linspace(0, 1, N, dtype=np.float32)
        await c.write("dp/n", x)
        meta = (await c.stat("dp/n")).meta
        data = data_path_of(c)
        out = np.empty(N, np.float32)
        await data.read_array(meta, out, wire_code("float16"))
        assert np.array_equal(out, x.astype(np.float16).astype(np.float32))
        await data.accumulate_array(meta, np.ones(N, np.float32), 2.0, wire_code("bfloat16"))
        await data.read_array(meta, out, 0)
        assert np.allclose(out, x + 2, atol=1e-6)
        await c.delete("dp/n")


async def test_a_read_fills_out_or_a_new_array_and_stops_at_the_tensors_end(
    cluster: Cluster,
) -> None:
    async with AsyncClient(cluster.config_path) as c:
        x = np.arange(N, dtype=np.float32)
        await c.write("dp/o", x)
        meta = (await c.stat("dp/o")).meta
        data = data_path_of(c)
        assert np.array_equal(await data.read_whole(meta, None, 0), x)
        out = np.empty(N, np.float32)
        assert await data.read_whole(meta, out, 0) is out and np.array_equal(out, x)
        with pytest.raises(irdma.DtypeMismatch, match="dp/o"):
            await data.read_whole(meta, np.empty(N, np.float64), 0)
        tail = await data.read_bytes(meta, meta.nbytes - 8, 100, None)  # cut at the end
        assert bytes(tail) == x[-2:].tobytes()
        into = bytearray(12)
        assert len(await data.read_bytes(meta, 4, 8, into)) == 8 and into[:8] == x[1:3].tobytes()
        served = await data.move(Op.WRITE, meta, 0, memoryview(x.view(np.uint8)))
        part = bytearray(70_000)  # spans shards 0 and 1
        assert await data.read_range(meta, 8, part, 0) == served[0].stamp
        assert bytes(part) == x.view(np.uint8)[8 : 8 + 70_000].tobytes()
        await c.delete("dp/o")
