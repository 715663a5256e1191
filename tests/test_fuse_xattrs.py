"""fuse/xattrs.py: a tensor's computed extended attributes and the mount's statfs,
over real daemons (no mount)."""

from __future__ import annotations

import errno

import numpy as np
import pytest
from irdma_fuse.errors import ENOATTR, FsError
from irdma_fuse.xattrs import XATTR_PREFIX

from .helpers.cluster import Cluster
from .helpers.fuse_roles import mount_roles


async def test_a_tensor_and_its_shards_show_layout_and_placement(cluster: Cluster) -> None:
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        await c.write("xa/w", np.zeros((100, 200), np.float32), replace=True)
        ino = r.inodes.ino("xa/w.npy")
        got = await r.xattrs.all(ino)
        assert got[XATTR_PREFIX + "dtype"] == b"float32"
        assert got[XATTR_PREFIX + "shape"] == b"100,200"
        assert got[XATTR_PREFIX + "nbytes"] == b"80000"
        assert await r.xattrs.get(ino, XATTR_PREFIX + "shards") == got[XATTR_PREFIX + "shards"]
        shard = await r.xattrs.all(r.inodes.ino("xa/.shards/w/1"))
        names = shard[XATTR_PREFIX + "replicas"].decode().split(",")
        assert shard[XATTR_PREFIX + "primary"].decode() == names[0]
        assert set(names) <= {n.name for n in c.config.nodes}
        assert await r.xattrs.all(r.inodes.ino("xa")) == {}  # a directory has none


async def test_other_names_are_absent_and_none_can_be_set(cluster: Cluster) -> None:
    async with mount_roles(cluster.config_path) as r:
        await r.backend.c.write("xa/v", np.zeros(3, np.int8), replace=True)
        ino = r.inodes.ino("xa/v.npy")
        for name in ("security.capability", XATTR_PREFIX + "nothing"):
            with pytest.raises(FsError) as caught:
                await r.xattrs.get(ino, name)
            assert caught.value.errno == ENOATTR
        for call, code in [
            (lambda: r.xattrs.set(XATTR_PREFIX + "dtype"), errno.EPERM),
            (lambda: r.xattrs.set("user.other"), errno.ENOTSUP),
            (lambda: r.xattrs.remove(XATTR_PREFIX + "dtype"), errno.EPERM),
            (lambda: r.xattrs.remove("user.other"), ENOATTR),
        ]:
            with pytest.raises(FsError) as caught:
                call()
            assert caught.value.errno == code


async def test_usage_adds_up_every_daemons_arena(cluster: Cluster) -> None:
    async with mount_roles(cluster.config_path) as r:
        usage = await r.xattrs.usage()
        assert usage.total == 3 * (64 << 20)  # conftest's three 64 MiB arenas
        assert 0 <= usage.used <= usage.total
