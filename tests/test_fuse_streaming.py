"""Large files through the mount: reads streamed in by chunks, writes pushed while written."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio
from irdma_fuse.npyfile import NpyLayout
from irdma_fuse.outflow import CHUNK, IN_FLIGHT, Outflow
from numpy.lib import format as npformat

from irdma import AsyncClient, Client, TensorNotFound

from .helpers.cluster import Cluster, make_cluster
from .helpers.mounts import start_mount
from .helpers.payloads import npy_bytes

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
# Several of the mount's 4 MiB chunks (the test cluster's shards are 64 KiB).
N = 10 * MIB // 4


def test_large_file_reads_every_way(cluster: Cluster, mount: Path, tmp_path: Path) -> None:
    d = mount / "big-read"
    d.mkdir()
    x = np.random.default_rng(0).random(N, dtype=np.float32)
    with Client(cluster.config_path) as c:
        c.write("big-read/x", x)
    expected = npy_bytes(x)
    assert np.array_equal(np.load(d / "x.npy"), x)
    subprocess.run(
        ["dd", f"if={d / 'x.npy'}", f"of={tmp_path / 'x.npy'}", "bs=4M", "status=none"],
        check=True,
        timeout=60,
    )
    assert (tmp_path / "x.npy").read_bytes() == expected
    assert np.array_equal(np.load(d / "x.npy", mmap_mode="r"), x)
    # Reads that start in the middle, cross chunk boundaries, run past the end.
    with open(d / "x.npy", "rb", buffering=0) as f:
        for off in (len(expected) - 100, 4 * MIB - 5, 128, 9 * MIB + 1, 0):
            assert os.pread(f.fileno(), 3 * MIB, off) == expected[off : off + 3 * MIB]


def test_an_open_reader_keeps_a_large_file_while_this_mount_rewrites_it(mount: Path) -> None:
    d = mount / "big-keep"
    d.mkdir()
    old = np.zeros(N, np.float32)
    np.save(d / "w.npy", old)
    with open(d / "w.npy", "rb") as reader:
        np.save(d / "w.npy", np.ones(N, np.float32))  # pushed while the reader streams in
        assert np.array_equal(np.load(reader), old)
    assert np.array_equal(np.load(d / "w.npy"), np.ones(N, np.float32))


@contextlib.contextmanager
def written_and_open(path: Path, data: bytes) -> Iterator[None]:
    """``data`` written to a new ``path`` in 1 MiB writes; closed on leaving."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for off in range(0, len(data), MIB):
            os.write(fd, data[off : off + MIB])
        yield
    finally:
        os.close(fd)


def test_sequential_write_is_pushed_before_close(cluster: Cluster, tmp_path: Path) -> None:
    """Without shared memory, complete chunks are pushed while the writer writes."""
    m = start_mount(cluster, tmp_path / "mnt", "--shared-memory", "0")
    try:
        d = m.path / "big-push"
        d.mkdir()
        # A write returns once at most IN_FLIGHT chunk pushes are under way, so
        # after IN_FLIGHT + 3 chunks the first ones are on the daemons, file still open.
        x = np.random.default_rng(1).random((IN_FLIGHT + 3) * CHUNK // 4, dtype=np.float32)
        with written_and_open(d / "x.npy", npy_bytes(x)):
            with Client(cluster.config_path) as c:
                head = bytes(c.read_bytes("big-push/x", 0, 2 * CHUNK))
            assert head == x.tobytes()[: 2 * CHUNK]
        with Client(cluster.config_path) as c:
            assert np.array_equal(c.read("big-push/x"), x)
        os.unlink(d / "x.npy")  # the module's daemons have room for a few such files only
    finally:
        m.unmount()


def test_with_shared_memory_a_sequential_write_is_pushed_at_close(
    cluster: Cluster, mount: Path
) -> None:
    """From shared memory the daemons copy a push straight out of the writer's
    buffer: the file goes whole at close, and nothing of it before."""
    d = mount / "shared-push"
    d.mkdir()
    x = np.random.default_rng(6).random((IN_FLIGHT + 3) * CHUNK // 4, dtype=np.float32)
    with (
        written_and_open(d / "x.npy", npy_bytes(x)),
        Client(cluster.config_path) as c,
        pytest.raises(TensorNotFound),
    ):
        c.stat("shared-push/x")
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("shared-push/x"), x)
    os.unlink(d / "x.npy")


@pytest.mark.parametrize("existing", [None, "same", "other"])
def test_np_save_of_a_large_array(cluster: Cluster, mount: Path, existing: str | None) -> None:
    d = mount / f"big-save-{existing}"
    d.mkdir()
    x = np.random.default_rng(2).standard_normal(N).astype(np.float32)
    if existing == "same":
        np.save(d / "w.npy", np.full(N, 7, np.float32))
    elif existing == "other":
        np.save(d / "w.npy", np.arange(1000))
    np.save(d / "w.npy", x)
    assert np.array_equal(np.load(d / "w.npy"), x)
    with Client(cluster.config_path) as c:
        info = c.stat(f"{d.name}/w")
        assert (info.dtype, info.shape) == ("float32", (N,))
        assert np.array_equal(c.read(f"{d.name}/w"), x)


def test_large_write_that_goes_back_over_what_was_pushed(mount: Path) -> None:
    d = mount / "big-back"
    d.mkdir()
    x = np.random.default_rng(3).random(N, dtype=np.float32)
    data = bytearray(npy_bytes(x))
    with open(d / "x.npy", "wb", buffering=0) as f:
        f.write(data)
        f.seek(128 + 4)  # into the first chunk, long since pushed
        f.write(np.float32(-5).tobytes())
    x[1] = -5
    assert np.array_equal(np.load(d / "x.npy"), x)


def test_large_header_first_file_over_an_existing_one_is_zero_filled(mount: Path) -> None:
    d = mount / "big-hdr"
    d.mkdir()
    np.save(d / "w.npy", np.full(N, 3, np.float32))  # same layout, non-zero
    m = npformat.open_memmap(d / "w.npy", mode="w+", dtype=np.float32, shape=(N,))
    del m  # nothing written through the map: the file is the header, then zeros
    assert np.array_equal(np.load(d / "w.npy"), np.zeros(N, np.float32))
    with open(d / "w.npy", "wb") as f:  # half of it written: the rest is zeros
        f.write(npy_bytes(np.ones(N, np.float32))[: 128 + 4 * (N // 2)])
    expected = np.zeros(N, np.float32)
    expected[: N // 2] = 1
    assert np.array_equal(np.load(d / "w.npy"), expected)


def test_large_npy_longer_than_its_header_says_is_refused(mount: Path) -> None:
    d = mount / "big-long"
    d.mkdir()
    with pytest.raises(OSError) as ei, open(d / "w.npy", "wb") as f:
        f.write(npy_bytes(np.ones(N, np.float32)) + b"trailing")
    assert ei.value.errno == errno.EINVAL


def test_in_place_sequential_rewrite_of_a_raw_file(cluster: Cluster, mount: Path) -> None:
    d = mount / "big-raw"
    d.mkdir()
    (d / "blob").write_bytes(bytes(10 * MIB))
    payload = os.urandom(10 * MIB)
    with open(d / "blob", "r+b", buffering=0) as f:
        for off in range(0, len(payload), MIB):
            f.write(payload[off : off + MIB])
    assert (d / "blob").read_bytes() == payload
    with Client(cluster.config_path) as c:
        assert bytes(c.read("big-raw/blob")) == payload


def test_unlink_of_a_large_file_being_written(mount: Path) -> None:
    """A writer still open on a removed file stores it at close, as before pushes
    went out while it wrote."""
    d = mount / "big-unlink"
    d.mkdir()
    data = npy_bytes(np.ones(N, np.float32))
    with open(d / "w.npy", "wb", buffering=0) as f:
        f.write(data[: 6 * MIB])
        os.unlink(d / "w.npy")
        f.write(data[6 * MIB :])
    assert np.array_equal(np.load(d / "w.npy"), np.ones(N, np.float32))


def test_unmount_while_a_large_write_is_being_pushed(cluster: Cluster, tmp_path: Path) -> None:
    """SIGTERM with a large .npy open and its chunks on their way: all of it is stored."""
    m = start_mount(cluster, tmp_path / "mnt")
    try:
        (m.path / "big-um").mkdir()
        x = np.arange(3 * CHUNK // 4, dtype=np.float32)
        np.save(tmp_path / "x.npy", x)
        code = (
            "import os, sys, time\n"
            f"data = open({str(tmp_path / 'x.npy')!r}, 'rb').read()\n"
            f"fd = os.open({str(m.path / 'big-um' / 'x.npy')!r}, os.O_WRONLY | os.O_CREAT)\n"
            "for off in range(0, len(data), 1 << 20):\n"
            "    os.write(fd, data[off : off + (1 << 20)])\n"
            "print('written', flush=True); time.sleep(60)\n"
        )
        writer = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert writer.stdout is not None and writer.stderr is not None
            line = writer.stdout.readline().strip()
            assert line == "written", writer.stderr.read() if writer.poll() is not None else ""
            m.unmount()  # while the file is still open in the writer
        finally:
            writer.kill()
            writer.wait()
            for stream in (writer.stdout, writer.stderr):
                if stream is not None:
                    stream.close()
    finally:
        m.unmount()
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("big-um/x"), x)


def test_a_large_save_that_does_not_fit_leaves_the_old_file(tmp_path: Path) -> None:
    """np.save of an array the cluster has no room for, over an existing file: the
    save fails with ENOSPC and the file keeps its old bytes (the background pushes
    never write into the old tensor once its replacement was refused)."""
    c = make_cluster(tmp_path / "cluster", arena_size=16 * MIB)
    m = start_mount(c, tmp_path / "mnt")
    try:
        old = np.random.default_rng(3).random(2 * MIB, dtype=np.float32)  # 8 MiB
        np.save(m.path / "f.npy", old)
        with pytest.raises(OSError) as err:
            np.save(m.path / "f.npy", np.ones(15 * MIB, np.float32))  # 60 MiB
        assert err.value.errno == errno.ENOSPC
        assert np.array_equal(np.load(m.path / "f.npy"), old)
        with Client(c.config_path) as client:
            assert np.array_equal(client.read("f"), old)
    finally:
        m.unmount()
        c.close()


def test_writes_answered_side_by_side_define_the_tensor_once(cluster: Cluster) -> None:
    """Two writes that each complete a chunk before the tensor is defined: the
    second waits for the first's create instead of sending its own (every
    create of a replace asks each daemon twice)."""
    layout = NpyLayout(np.dtype(np.float32), (4 * CHUNK // 4,), 128)
    data = np.random.default_rng(5).integers(0, 256, 128 + layout.nbytes, dtype=np.uint8)
    creates = 0

    async def main() -> None:
        nonlocal creates
        async with AsyncClient(cluster.config_path) as client:
            real = client.create

            async def counted(*args: object, **kwargs: object) -> object:
                nonlocal creates
                creates += 1
                return await real(*args, **kwargs)

            client.create = counted  # type: ignore[method-assign]
            flow = Outflow.plan("side-by-side", layout, cluster.config.shard_size, define=True)
            assert flow is not None
            async with trio.open_nursery() as nursery:
                for written in (128 + 2 * CHUNK, 128 + 3 * CHUNK):
                    nursery.start_soon(flow.advance, nursery, client, data, written)
            await flow.drain()
            got = await client.read("side-by-side")
            assert got.shape == layout.shape
            body = data[128 : 128 + 3 * CHUNK]
            assert got.view(np.uint8)[: 3 * CHUNK].tobytes() == body.tobytes()

    trio.run(main)
    assert creates == 1
