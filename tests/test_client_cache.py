"""The client's metadata cache (irdma/client/cache.py). Pure."""

from __future__ import annotations

from irdma.client.cache import MetaCache
from irdma.protocol import TensorMeta


def test_metadata_is_kept_by_name_until_dropped() -> None:
    cache = MetaCache()
    m = TensorMeta("c/a", "float32", (4,), 4096)
    assert cache.get("c/a") is None and "c/a" not in cache
    cache.put(m)
    assert cache.get("c/a") is m and "c/a" in cache
    # Under another name: a tensor renamed to it.
    cache.put(m, "c/b")
    assert cache.get("c/b") is m
    assert cache.drop("c/a") is m
    assert cache.get("c/a") is None and cache.drop("c/a") is None
    assert cache.get("c/b") is m
