"""fuse/renames.py: renames over real daemons, with no FUSE session: handles,
inode numbers and modes follow the file; a replaced open file is kept."""

from __future__ import annotations

import errno
import io
import os
import stat

import numpy as np
import pytest
import trio
import trio.testing
from irdma_fuse.errors import FsError

from irdma.errors import TensorNotFound

from .helpers.cluster import Cluster
from .helpers.fuse_roles import mount_roles, release


async def test_a_renamed_file_keeps_its_number_mode_and_open_readers(cluster: Cluster) -> None:
    x = np.arange(1000, dtype=np.int32)
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        await c.write("rn/a", x, replace=True)
        ino = r.attrs.of(await r.resolver.resolve("rn/a.npy")).st_ino
        r.attrs.set_mode("rn/a.npy", 0o600)
        reading = await r.fileops.open("rn/a.npy", os.O_RDONLY)
        await r.renames.rename("rn/a.npy", "rn/b.npy", noreplace=False, exchange=False)
        assert r.files.get(reading.fh).path == "rn/b.npy"
        moved = r.attrs.of(await r.resolver.resolve("rn/b.npy"))
        assert moved.st_ino == ino and stat.S_IMODE(moved.st_mode) == 0o600
        np.testing.assert_array_equal(await c.read("rn/b"), x)
        with pytest.raises(TensorNotFound):
            await c.stat("rn/a")
        await release(r, reading.fh)


async def test_a_file_replaced_while_open_is_kept_for_its_reader(cluster: Cluster) -> None:
    old, new = np.zeros(500, np.float64), np.ones(300, np.float64)
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        await c.write("rn/target", old, replace=True)
        await c.write("rn/source", new, replace=True)
        reading = await r.fileops.open("rn/target.npy", os.O_RDONLY)
        size = r.attrs.of(await r.resolver.resolve("rn/target.npy")).st_size
        await r.renames.rename("rn/source.npy", "rn/target.npy", noreplace=False, exchange=False)
        hidden = r.files.get(reading.fh).path
        assert hidden != "rn/target.npy"
        frozen = r.renames.frozen(hidden)
        assert frozen is not None and frozen.st_size == size  # its old size, as it was
        got = bytes(await r.fileops.read(reading.fh, 0, size))
        assert np.load(io.BytesIO(got)).shape == (500,)  # the old content
        np.testing.assert_array_equal(await c.read("rn/target"), new)
        await release(r, reading.fh)
        assert r.renames.frozen(hidden) is None  # gone with its last handle


async def test_refused_renames_answer_their_errno(cluster: Cluster) -> None:
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        await c.write("rn/p", np.zeros(4, np.uint8), replace=True)
        await c.write("rn/q", np.zeros(4, np.uint8), replace=True)
        await r.dirs.make("rn/d", 0o755)
        for old, new, kw, code in [
            ("rn/p.npy", "rn/q.npy", {"noreplace": True, "exchange": False}, errno.EEXIST),
            ("rn/p.npy", "rn/q.npy", {"noreplace": False, "exchange": True}, errno.EINVAL),
            ("rn/p.npy", "rn/d", {"noreplace": False, "exchange": False}, errno.EISDIR),
            ("rn/d", "rn/d/inside", {"noreplace": False, "exchange": False}, errno.EINVAL),
            ("rn/d", "rn/p.npy", {"noreplace": False, "exchange": False}, errno.ENOTDIR),
        ]:
            with pytest.raises(FsError) as caught:
                await r.renames.rename(old, new, **kw)
            assert caught.value.errno == code, (old, new, kw)


async def test_lookups_of_either_name_wait_until_a_rename_is_done(cluster: Cluster) -> None:
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        await c.write("rn/slow", np.zeros(4, np.uint8), replace=True)
        # The daemons' rename is held until the test lets it go.
        reached, go = trio.Event(), trio.Event()
        rename = c.rename

        async def held_rename(old: str, new: str, *, replace: bool = False):  # type: ignore[no-untyped-def]
            reached.set()
            await go.wait()
            return await rename(old, new, replace=replace)

        c.rename = held_rename  # type: ignore[method-assign]
        settled = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: r.renames.rename(
                    "rn/slow.npy", "rn/fast.npy", noreplace=False, exchange=False
                )
            )
            await reached.wait()  # the rename is under way, on the daemons

            async def look(path: str) -> None:
                await r.renames.settled(path)
                settled.append(path)

            nursery.start_soon(look, "rn/slow.npy")
            nursery.start_soon(look, "rn/fast.npy")
            nursery.start_soon(look, "rn/other.npy")
            await trio.testing.wait_all_tasks_blocked()
            assert settled == ["rn/other.npy"]
            go.set()
        assert sorted(settled) == ["rn/fast.npy", "rn/other.npy", "rn/slow.npy"]
        assert (await r.resolver.resolve("rn/fast.npy")).info is not None
