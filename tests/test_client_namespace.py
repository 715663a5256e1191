"""Namespace changes (irdma/client/namespace.py): create, rename and delete on every
daemon, and what they leave in the metadata cache. Real daemons."""

from __future__ import annotations

import numpy as np
import pytest

import irdma
from irdma.client import AsyncClient
from irdma.client.cache import MetaCache
from irdma.client.lookup import Lookup
from irdma.client.namespace import Namespace
from irdma.client.routing import Router
from irdma.protocol import tensor_key

from .helpers.cluster import Cluster


def namespace_of(c: AsyncClient) -> Namespace:
    cache = MetaCache()
    router = Router(c.session.in_force, c.timeout, c.session)
    return Namespace(c.session, router, cache, Lookup(c.session, router, cache))


async def test_create_rename_and_delete_keep_the_cache_true(cluster: Cluster) -> None:
    async with AsyncClient(cluster.config_path) as c:
        ns = namespace_of(c)
        meta = ns.meta_of("ns/a", (1000,), np.float32, None, None, None)
        info = await ns.create(meta, exist_ok=False, replace=False)
        assert ns.cache.get("ns/a") == info.meta == meta
        with pytest.raises(irdma.TensorExists):
            await ns.create(meta, exist_ok=False, replace=False)
        renamed = await ns.rename("ns/a", "ns/b")
        assert ns.cache.get("ns/a") is None
        assert ns.cache.get("ns/b") == renamed.meta
        assert [t.name for t in await ns.list("ns/")] == ["ns/b"]
        await ns.delete("ns/b")
        assert ns.cache.get("ns/b") is None
        assert await ns.list("ns/") == []
        with pytest.raises(irdma.TensorNotFound):
            await ns.delete("ns/b")


async def test_a_name_whose_key_a_renamed_tensor_holds_takes_a_salted_key(
    cluster: Cluster,
) -> None:
    async with AsyncClient(cluster.config_path) as c:
        ns = namespace_of(c)
        await c.write("ns/k", np.ones(10, np.float32))
        await c.rename("ns/k", "ns/moved")  # keeps tensor_key("ns/k")
        meta = ns.meta_of("ns/k", 10, np.float32, None, None, None)
        info = await ns.create(meta, exist_ok=False, replace=False)
        assert info.meta.key == tensor_key("ns/k", 1) != tensor_key("ns/k")
        assert np.array_equal(await c.read("ns/k"), np.zeros(10, np.float32))
        assert np.array_equal(await c.read("ns/moved"), np.ones(10, np.float32))
        await c.delete("ns/k")
        await c.delete("ns/moved")


async def test_a_bad_name_or_prefix_is_refused_before_anything_is_sent(cluster: Cluster) -> None:
    async with AsyncClient(cluster.config_path) as c:
        ns = namespace_of(c)
        with pytest.raises(ValueError, match="limit"):
            await ns.list("", limit=-1)
        with pytest.raises(ValueError):
            ns.meta_of("", 1, np.float32, None, None, None)


async def test_a_write_goes_by_the_cached_layout_when_it_fits_and_defines_it_else(
    cluster: Cluster,
) -> None:
    async with AsyncClient(cluster.config_path) as c:
        ns = namespace_of(c)
        arr = np.ones(100, np.float32)
        d = ns.definition("ns/d", arr)
        assert (d.cached, d.shard_size) == (None, None)
        meta = await ns.defined(d)  # nothing cached: created
        assert meta.shard_size == c.config.shard_size and ns.cache.get("ns/d") == meta
        again = ns.definition("ns/d", arr)
        assert again.cached == meta and await ns.defined(again) is again.cached  # fits: kept
        wider = ns.definition("ns/d", arr.astype(np.float64), replace=True)
        assert (await ns.defined(wider)).dtype == "float64"
        assert (await c.stat("ns/d")).dtype == "float64"
        await c.delete("ns/d")


async def test_write_keeps_the_cached_shard_size_and_write_many_asks_for_the_configs(
    cluster: Cluster,
) -> None:
    async with AsyncClient(cluster.config_path) as a, AsyncClient(cluster.config_path) as b:
        for name in ("ns/one", "ns/many"):
            await a.create(name, 100, np.float32, shard_size=256)
            await b.read(name)  # b caches float32 in shards of 256 bytes
            await a.create(name, 100, np.float64, shard_size=256, replace=True)
        # b's cached layout does not fit a float64 array: the tensor is defined
        # again, in the cached shard size for write (the one there: accepted) ...
        await b.write("ns/one", np.full(100, 2.0))
        assert (await b.stat("ns/one")).shard_size == 256
        assert np.array_equal(await a.read("ns/one"), np.full(100, 2.0))
        # ... and in the config's for write_many, which the one there is not.
        with pytest.raises(irdma.ShapeMismatch, match="shard size 256"):
            await b.write_many({"ns/many": np.full(100, 3.0)})
        await b.write_many({"ns/new": np.ones(3)})
        assert (await b.stat("ns/new")).shard_size == b.config.shard_size
        for name in ("ns/one", "ns/many", "ns/new"):
            await a.delete(name)
