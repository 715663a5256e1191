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

from .conftest import Cluster


def namespace_of(c: AsyncClient) -> Namespace:
    cache = MetaCache()
    router = Router(c.config, c.timeout, c.session)
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
