"""fuse/directories.py: mkdir, listings and rmdir over real daemons (no mount)."""

from __future__ import annotations

import errno
import os
import stat

import numpy as np
import pytest
from irdma_fuse.errors import FsError
from irdma_fuse.paths import RAW_OPTION

from irdma import DIR_MARKER

from .helpers.cluster import Cluster
from .helpers.fuse_roles import mount_roles


async def test_a_listing_shows_tensors_files_and_directories_not_the_reserved(
    cluster: Cluster,
) -> None:
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        made = await r.dirs.make("ls", 0o700)
        assert stat.S_ISDIR(made.st_mode) and stat.S_IMODE(made.st_mode) == 0o700
        await c.write("ls/w", np.zeros(3, np.float32), replace=True)
        await c.write("ls/raw.bin", np.zeros(5, np.uint8), options={RAW_OPTION: True})
        await c.write("ls/sub/deep", np.zeros(2, np.int8), replace=True)
        await r.fileops.create("ls/new.npy", 0o644, os.O_WRONLY)  # being created here
        fh = await r.dirs.open("ls")
        entries = dict(r.files.dir_entries(fh))
        assert sorted(entries) == ["new.npy", "raw.bin", "sub", "w.npy"]  # no marker
        assert entries["w.npy"].st_size == 128 + 12 and entries["raw.bin"].st_size == 5
        assert stat.S_ISDIR(entries["sub"].st_mode)
        shards = dict(await r.dirs.list(await r.resolver.resolve("ls/.shards")))
        assert sorted(shards) == ["raw.bin", "w"] and stat.S_ISDIR(shards["w"].st_mode)
        with pytest.raises(FsError) as caught:
            await r.dirs.open("ls/w.npy")
        assert caught.value.errno == errno.ENOTDIR


async def test_mkdir_and_rmdir_answer_as_the_spec_says(cluster: Cluster) -> None:
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        await r.dirs.make("rm", 0o755)
        await c.write("rm/w", np.zeros(3, np.float32), replace=True)
        for call, code in [
            (lambda: r.dirs.make("rm", 0o755), errno.EEXIST),
            (lambda: r.dirs.make("rm/.shards", 0o755), errno.EPERM),
            (lambda: r.dirs.remove("rm"), errno.ENOTEMPTY),
            (lambda: r.dirs.remove("rm/w.npy"), errno.ENOTDIR),
        ]:
            with pytest.raises(FsError) as caught:
                await call()
            assert caught.value.errno == code
        await c.delete("rm/w")
        await r.fileops.create("rm/pending.npy", 0o644, os.O_WRONLY)
        with pytest.raises(FsError) as caught:
            await r.dirs.remove("rm")  # a file is being created in it
        assert caught.value.errno == errno.ENOTEMPTY
        r.files.drop_pending("rm/pending.npy")
        assert [i.name for i in await c.list("rm/")] == [f"rm/{DIR_MARKER}"]
        await r.dirs.remove("rm")
        assert await c.list("rm/") == []
        assert await r.resolver.find("rm") is None
