"""fuse/resolve.py: what a path is, asked of real daemons (no mount)."""

from __future__ import annotations

import errno

import numpy as np
import pytest
from irdma_fuse.errors import FsError
from irdma_fuse.files import FileBuffer, Handle
from irdma_fuse.paths import RAW_OPTION, Kind, Target

from irdma.errors import TensorNotFound

from .helpers.cluster import Cluster
from .helpers.fuse_roles import mount_roles


async def test_names_resolve_to_typed_tensors_raw_files_and_directories(
    cluster: Cluster,
) -> None:
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        await c.write("res/w", np.arange(10, dtype=np.float32), replace=True)
        await c.write("res/notes.txt", np.frombuffer(b"hi", np.uint8), options={RAW_OPTION: True})
        w = await r.resolver.resolve("res/w.npy")
        assert w.target == Target(Kind.TENSOR, "res/w", typed=True)
        assert w.info is not None and w.info.shape == (10,)
        raw = await r.resolver.resolve("res/notes.txt")
        assert raw.target.kind == Kind.TENSOR and not raw.target.typed
        d = await r.resolver.resolve("res")
        assert d.target.is_dir and d.info is None
        shard = await r.resolver.resolve("res/.shards/w/0")
        assert shard.target.kind == Kind.SHARD and shard.info is not None
        for nothing in ("res/w", "res/missing.npy", "res/.shards/w/1", "nowhere"):
            with pytest.raises(FsError) as caught:
                await r.resolver.resolve(nothing)
            assert caught.value.errno == errno.ENOENT, nothing
            assert await r.resolver.find(nothing) is None


async def test_a_file_being_created_here_is_answered_without_the_daemons(
    cluster: Cluster,
) -> None:
    async with mount_roles(cluster.config_path) as r:
        target = Target(Kind.TENSOR, "res/new", typed=True)
        r.files.add_pending(Handle("res/new.npy", target, True, buf=FileBuffer()))
        found = await r.resolver.resolve("res/new.npy")
        assert found.target == target and found.info is None
        with pytest.raises(TensorNotFound):  # the daemons have no such tensor yet
            await r.backend.c.stat("res/new")
