"""Name resolution (irdma/client/lookup.py): which tensor a name stands for now.
Real daemons; the lookup runs on a client's session with a router and cache of its own."""

from __future__ import annotations

import numpy as np
import pytest

import irdma
from irdma.client import AsyncClient
from irdma.client.cache import MetaCache
from irdma.client.datapath import DataPath
from irdma.client.lookup import Lookup, merged_version
from irdma.client.onesided import OneSidedReader
from irdma.client.routing import Router
from irdma.protocol import TensorMeta, tensor_key
from irdma.protocol.bodies import StatRecord

from .helpers.cluster import Cluster


def lookup_of(c: AsyncClient) -> Lookup:
    return Lookup(c.session, Router(c.session.in_force, c.timeout, c.session), MetaCache())


async def test_a_tensor_renamed_to_a_name_is_found_by_it(cluster: Cluster) -> None:
    async with AsyncClient(cluster.config_path) as c:
        await c.write("lk/a", np.arange(40_000, dtype=np.float32))
        await c.rename("lk/a", "lk/b")
        lookup = lookup_of(c)
        found = await lookup.find("lk/b")
        assert found is not None and found.name == "lk/b"
        assert found.key == tensor_key("lk/a") != tensor_key("lk/b")  # it kept its key
        assert await lookup.find("lk/a") is None
        info = await lookup.stat("lk/b")
        assert lookup.cache.get("lk/b") == info.meta == found
        assert info.shape == (40_000,)
        assert (await lookup.stat("lk/b", everywhere=True)).meta == info.meta
        await c.delete("lk/b")


async def test_a_missing_name_is_not_found_and_not_cached(cluster: Cluster) -> None:
    async with AsyncClient(cluster.config_path) as c:
        lookup = lookup_of(c)
        for everywhere in (False, True):
            with pytest.raises(irdma.TensorNotFound, match="lk/none"):
                await lookup.stat("lk/none", everywhere=everywhere)
        assert lookup.cache.get("lk/none") is None


async def test_holdings_are_one_daemons_records_with_their_shard_versions(
    cluster: Cluster,
) -> None:
    async with AsyncClient(cluster.config_path) as c:
        await c.write("lk/held", np.arange(100_000, dtype=np.float32))  # 7 shards
        lookup = lookup_of(c)
        shards = 0
        for node in c.config.nodes:
            records = await lookup.holdings(node, "lk/held")
            shards += sum(len(r.shards or {}) for r in records)
        assert shards == (await c.stat("lk/held")).num_shards
        await c.delete("lk/held")


def test_a_version_sums_the_newest_copy_of_each_shard() -> None:
    meta = TensorMeta("lk/v", "float32", (3 << 20,), 1 << 20)
    records = [
        StatRecord(meta, 8, shards={0: 3, 1: 5}),
        StatRecord(meta, 4, shards={0: 4}),
        StatRecord(meta, 2),  # a daemon that did not say which shards
    ]
    assert merged_version(records) == 4 + 5 + 2


async def test_a_data_call_with_a_stale_layout_runs_again_with_the_fresh_one(
    cluster: Cluster,
) -> None:
    cfg = cluster.config_path
    async with AsyncClient(cfg) as a, AsyncClient(cfg, transport="tcp") as b:
        await a.write("lk/s", np.ones(10, np.float32))
        router = Router(b.session.in_force, b.timeout, b.session)
        lookup = Lookup(b.session, router, MetaCache())
        data = DataPath(b.session, router, OneSidedReader(b.session, router))
        seen: list[tuple[int, ...]] = []

        async def read(meta: TensorMeta) -> np.ndarray:
            seen.append(meta.shape)
            return await data.read_whole(meta, None, 0)

        assert np.array_equal(await lookup.with_fresh_meta("lk/s", read), np.ones(10))
        await a.write("lk/s", np.full(20, 2, np.float32), replace=True)
        got = await lookup.with_fresh_meta("lk/s", read)  # the cached (10,) is stale
        assert seen == [(10,), (10,), (20,)]
        assert np.array_equal(got, np.full(20, 2, np.float32))
        await a.delete("lk/s")


async def test_a_cached_layout_an_out_array_does_not_fit_is_dropped(cluster: Cluster) -> None:
    async with AsyncClient(cluster.config_path) as c:
        await c.write("lk/o", np.ones(10, np.float32))
        lookup = lookup_of(c)
        meta = await lookup.meta_for("lk/o")
        lookup.drop_unless_fits("lk/o", np.empty(10, np.float32))
        assert lookup.cache.get("lk/o") == meta
        lookup.drop_unless_fits("lk/o", np.empty(10, np.float64))
        assert lookup.cache.get("lk/o") is None
        lookup.drop_unless_fits("lk/o", np.empty(5, np.float32))  # none cached: no error
        await c.delete("lk/o")
