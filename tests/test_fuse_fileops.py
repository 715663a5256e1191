"""fuse/fileops.py: files created, written, read, truncated and unlinked over real
daemons, with no FUSE session."""

from __future__ import annotations

import errno
import io
import os

import numpy as np
import pytest
import trio
import trio.testing
from irdma_fuse.attributes import Changes
from irdma_fuse.errors import FsError

from irdma.errors import TensorNotFound

from .helpers.cluster import Cluster
from .helpers.fuse_roles import mount_roles, release
from .helpers.payloads import npy_bytes


async def test_a_created_file_is_stored_at_flush_and_read_back(cluster: Cluster) -> None:
    x = np.arange(40_000, dtype=np.float32)  # spans shards on every daemon
    async with mount_roles(cluster.config_path) as r:
        await r.dirs.make("fo", 0o755)
        opened, attrs = await r.fileops.create("fo/x.npy", 0o640, os.O_WRONLY)
        assert attrs.st_size == 0 and opened.direct_io
        data = npy_bytes(x)
        assert await r.fileops.write(opened.fh, 0, data) == len(data)
        assert (await r.resolver.resolve("fo/x.npy")).info is None  # not stored yet
        await r.fileops.flush(opened.fh)
        np.testing.assert_array_equal(await r.backend.c.read("fo/x"), x)
        await release(r, opened.fh)
        reading = await r.fileops.open("fo/x.npy", os.O_RDONLY)
        got = bytes(await r.fileops.read(reading.fh, 0, len(data) + 10))
        assert got == data
        await release(r, reading.fh)


async def test_a_bad_npy_header_is_refused_at_the_write(cluster: Cluster) -> None:
    async with mount_roles(cluster.config_path) as r:
        await r.dirs.make("hdr", 0o755)
        opened, _ = await r.fileops.create("hdr/bad.npy", 0o644, os.O_WRONLY)
        with pytest.raises(ValueError, match=r"hdr/bad\.npy"):  # BadNpy: EINVAL
            await r.fileops.write(opened.fh, 0, b"not an npy header at all" * 8)


async def test_truncate_and_unlink_change_the_stored_file(cluster: Cluster) -> None:
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        await c.write("fo/raw", np.frombuffer(b"0123456789", np.uint8), options={"raw": True})
        attrs = await r.fileops.setattr("fo/raw", None, Changes(size=4))
        assert attrs.st_size == 4
        assert bytes(await c.read("fo/raw")) == b"0123"
        with pytest.raises(FsError) as caught:
            await r.fileops.setattr("fo", None, Changes(size=0))
        assert caught.value.errno == errno.EISDIR
        await r.fileops.unlink("fo/raw")
        with pytest.raises(TensorNotFound):
            await c.stat("fo/raw")
        with pytest.raises(FsError) as caught:
            await r.fileops.unlink("fo")
        assert caught.value.errno == errno.EISDIR


async def test_a_change_here_waits_for_a_snapshot_of_the_old_content_streaming_in(
    cluster: Cluster,
) -> None:
    x = np.arange(1 << 16, dtype=np.float32)  # 256 KiB: several chunks of 64 KiB shards
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        await c.write("qu/w", x, replace=True)
        # The reader's stream is held at its first chunk until the test lets it go.
        streaming, go = trio.Event(), trio.Event()
        read_range, stat, delete = c.read_range, c.stat, c.delete

        async def held(*args, **kwargs):  # type: ignore[no-untyped-def]
            streaming.set()
            await go.wait()
            return await read_range(*args, **kwargs)

        c.read_range = held  # type: ignore[method-assign]
        reading = await r.fileops.open("qu/w.npy", os.O_RDONLY)
        await streaming.wait()
        # From here, the unlink's lookup says when it is done, and its delete
        # records whether the stream was still held.
        resolved = trio.Event()
        deletes_while_held: list[bool] = []

        async def told_stat(name: str, **kwargs):  # type: ignore[no-untyped-def]
            info = await stat(name, **kwargs)
            resolved.set()
            return info

        async def told_delete(name: str) -> None:
            deletes_while_held.append(not go.is_set())
            await delete(name)

        c.stat, c.delete = told_stat, told_delete  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(r.fileops.unlink, "qu/w.npy")
            await resolved.wait()
            await trio.testing.wait_all_tasks_blocked()  # the unlink went as far as it may
            go.set()
        assert deletes_while_held == [False]  # it waited for the open's content to be whole
        got = bytes(await r.fileops.read(reading.fh, 0, 1 << 20))
        np.testing.assert_array_equal(np.load(io.BytesIO(got)), x)  # the reader kept it
        with pytest.raises(TensorNotFound):
            await stat("qu/w")
        await release(r, reading.fh)


async def test_an_open_is_served_the_write_it_began_however_often_it_is_rewritten(
    cluster: Cluster,
) -> None:
    """The mount streams a file in chunks, the first alone and the rest from the same
    whole write (fuse/snapshot.py). Rewritten three times and more before the rest is
    read, that write would be gone from the daemons (each shard keeps its previous
    copy and one older): the open's lease on it keeps it, so the open reads the
    version it began, whole. This is the failure
    `test_consistent_reads.py::test_the_mount_serves_one_write_whole` met under load
    (3 runs in 30 under two busy loops: EIO), made to happen every time."""
    n = 3 << 20  # float32: 12 MiB, three of the mount's 4 MiB chunks
    x = np.zeros(n, dtype=np.float32)
    async with mount_roles(cluster.config_path) as r:
        c = r.backend.c
        await c.write("qu/rewritten", x, replace=True)
        # Every chunk after the first is held until the tensor was rewritten five times.
        first, go = trio.Event(), trio.Event()
        read_range = c.read_range
        seen: dict[int, tuple[int, int, float]] = {}  # offset: (stamp asked, got, value)

        async def held(name, offset, out, at=0):  # type: ignore[no-untyped-def]
            if offset != 0:
                await go.wait()
            got = await read_range(name, offset, out, at)
            values = np.frombuffer(out, np.float32)
            assert np.all(values == values[0]), f"chunk at {offset} mixes writes"
            seen[offset] = (at, got, float(values[0]))
            first.set()
            return got

        c.read_range = held  # type: ignore[method-assign]
        reading = await r.fileops.open("qu/rewritten.npy", os.O_RDONLY)
        await first.wait()
        head = bytes(await r.fileops.read(reading.fh, 0, 4096))  # the first chunk: served
        assert np.load(io.BytesIO(head + bytes(n * 4 + 128 - len(head)))).size == n
        for value in (1.0, 2.0, 3.0, 4.0, 5.0):
            await c.write("qu/rewritten", np.full(n, value, np.float32))
        go.set()
        got = bytearray()
        while len(got) < n * 4 + 128:
            part = await r.fileops.read(reading.fh, len(got), 1 << 20)
            assert part, "the file ended early"
            got += part
        np.testing.assert_array_equal(np.load(io.BytesIO(bytes(got))), x)  # whole, as opened
        await release(r, reading.fh)
        # Every chunk was read from the write the first came from, and the rewrites
        # landed: the daemons hold the last one.
        stamp = seen[0][1]
        assert sorted(seen) == [0, 4 << 20, 8 << 20]
        assert all(at == stamp and got == stamp for at, got, _ in list(seen.values())[1:])
        assert {value for _, _, value in seen.values()} == {0.0}
        np.testing.assert_array_equal(await c.read("qu/rewritten"), np.full(n, 5.0, np.float32))
