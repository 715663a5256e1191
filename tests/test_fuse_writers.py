"""Real writers on the mount: atomic saves by rename, header-first .npy files, fio."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npformat

import irdma
from irdma import Client

from .helpers.cluster import Cluster
from .helpers.payloads import npy_bytes
from .helpers.whole_reads import WholeReads

pytestmark = pytest.mark.timeout(120)

SIZES = [0, 10, 300_000, 3 << 20]  # empty, one shard, several, several MiB


def atomic_save(target: Path, payload: bytes) -> None:
    """Write a temporary file, rename it over ``target`` while still open, then close
    (what serialization libraries do for an atomic save)."""
    tmp = target.with_name(f".tmp-{target.name}")  # a .npy name stays one: typed, like it
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()  # into the mount's buffer: still not pushed (no close, no fsync)
        os.replace(tmp, target)
    assert not tmp.exists()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("existing", [False, True], ids=["new", "over-existing"])
def test_rename_of_an_open_raw_file(
    cluster: Cluster, mount: Path, size: int, existing: bool
) -> None:
    d = mount / f"ren-raw-{size}-{existing}"
    d.mkdir()
    if existing:
        (d / "ckpt.pt").write_bytes(b"old content" * 1000)
    payload = os.urandom(size)
    atomic_save(d / "ckpt.pt", payload)
    assert (d / "ckpt.pt").read_bytes() == payload
    assert sorted(os.listdir(d)) == ["ckpt.pt"]
    with Client(cluster.config_path) as c:
        assert bytes(c.read(f"{d.name}/ckpt.pt")) == payload
        names = [i.name for i in c.list(d.name + "/")]
        assert f"{d.name}/.tmp-ckpt.pt" not in names and f"{d.name}/ckpt.pt" in names


# 12 MiB: pushed while written (several 4 MiB chunks) before the rename moves it.
@pytest.mark.parametrize("size", [*SIZES, 12 << 20])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "over-existing"])
def test_rename_of_an_open_npy_file(
    cluster: Cluster, mount: Path, size: int, existing: bool
) -> None:
    d = mount / f"ren-npy-{size}-{existing}"
    d.mkdir()
    if existing:
        np.save(d / "w.npy", np.arange(1000, dtype=np.int64))
    x = np.random.default_rng(size).random(size // 4, dtype=np.float32)
    atomic_save(d / "w.npy", npy_bytes(x))
    assert np.array_equal(np.load(d / "w.npy"), x)
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read(f"{d.name}/w"), x)
        assert [i.name for i in c.list(d.name + "/") if "tmp" in i.name] == []


def test_writes_after_the_rename_reach_the_new_name(cluster: Cluster, mount: Path) -> None:
    d = mount / "ren-more"
    d.mkdir()
    with open(d / "tmp.bin", "wb") as f:
        f.write(b"a" * 200_000)
        f.flush()
        os.rename(d / "tmp.bin", d / "final.bin")
        f.write(b"b" * 100_000)
    assert (d / "final.bin").read_bytes() == b"a" * 200_000 + b"b" * 100_000
    assert not (d / "tmp.bin").exists()


def test_rename_of_a_stored_file_with_unsaved_changes(cluster: Cluster, mount: Path) -> None:
    d = mount / "ren-dirty"
    d.mkdir()
    x = np.arange(100_000, dtype=np.float32)
    np.save(d / "a.npy", x)
    with open(d / "a.npy", "r+b") as f:
        f.seek(128 + 4 * 5)
        f.write(np.float32(-1).tobytes())
        f.flush()
        os.rename(d / "a.npy", d / "b.npy")
    x[5] = -1
    assert np.array_equal(np.load(d / "b.npy"), x)
    assert sorted(os.listdir(d)) == ["b.npy"]


@pytest.mark.parametrize("name", ["w.npy", "ckpt.pt"], ids=["npy", "raw"])
def test_rename_of_a_stored_file_moves_no_bytes(cluster: Cluster, mount: Path, name: str) -> None:
    """``mv`` of a stored file is a rename on the daemons: the same tensor (created
    when it was, each shard one version on), not a copy under the new name."""
    d = mount / f"ren-stored-{name}"
    d.mkdir()
    x = np.random.default_rng(3).random(3 << 18, dtype=np.float32)  # 3 MiB: 48 shards
    if name.endswith(".npy"):
        np.save(d / name, x)
    else:
        (d / name).write_bytes(x.tobytes())
    tensor = f"{d.name}/{name.removesuffix('.npy')}"
    with Client(cluster.config_path) as c:
        before = c.stat(tensor)
        os.rename(d / name, d / f"moved-{name}")
        after = c.stat(f"{d.name}/moved-{name.removesuffix('.npy')}")
        assert after.ctime == before.ctime
        assert after.version == before.version + before.num_shards
        with pytest.raises(irdma.TensorNotFound):
            c.stat(tensor)
    assert sorted(os.listdir(d)) == [f"moved-{name}"]
    if name.endswith(".npy"):
        assert np.array_equal(np.load(d / f"moved-{name}"), x)
    else:
        assert (d / f"moved-{name}").read_bytes() == x.tobytes()


def test_a_client_reading_the_target_of_atomic_saves_sees_each_save_whole(
    cluster: Cluster, mount: Path
) -> None:
    """Saves through the mount (write a temporary, rename it over the target) while
    a client elsewhere reads the target: every read is one save, whole."""
    d = mount / "ren-client-race"
    d.mkdir()
    # 12 MiB: the temporary is pushed while written, so the rename is the daemons'.
    n = 3 << 20
    np.save(d / "w.npy", np.zeros(n, np.float32))
    with WholeReads(cluster.config_path, f"{d.name}/w") as reads:
        for k in range(1, 11):
            atomic_save(d / "w.npy", npy_bytes(np.full(n, k, np.float32)))
    assert not reads.failures, reads.failures[:3]
    assert len(set(reads.seen)) >= 3, sorted(set(reads.seen))  # the race happened
    assert np.array_equal(np.load(d / "w.npy"), np.full(n, 10, np.float32))


def test_reader_of_the_target_sees_old_or_new_whole(mount: Path) -> None:
    d = mount / "ren-reader"
    d.mkdir()
    old = np.zeros(400_000, np.float32)
    new = np.ones(300_000, np.float32)
    np.save(d / "w.npy", old)
    # One open has read nothing yet, the other half of the file, when the rename comes.
    with open(d / "w.npy", "rb") as early, open(d / "w.npy", "rb") as half:
        first = half.read(800_000)
        atomic_save(d / "w.npy", npy_bytes(new))
        assert early.read() in (npy_bytes(old), npy_bytes(new))
        assert first + half.read() == npy_bytes(old)
    assert np.array_equal(np.load(d / "w.npy"), new)


def test_a_writer_of_the_replaced_file_does_not_bring_it_back(mount: Path) -> None:
    d = mount / "ren-orphan"
    d.mkdir()
    (d / "t").write_bytes(b"old")
    with open(d / "t", "r+b") as stale:
        stale.write(b"STALE")
        stale.flush()
        atomic_save(d / "t", b"new content")
    assert (d / "t").read_bytes() == b"new content"


def test_rename_of_a_directory_with_a_file_being_written(mount: Path) -> None:
    (mount / "ren-dir").mkdir()
    with open(mount / "ren-dir" / "x.bin", "wb") as f:
        f.write(b"inside" * 10_000)
        f.flush()
        os.rename(mount / "ren-dir", mount / "ren-dir2")
        f.write(b"!")
    assert (mount / "ren-dir2" / "x.bin").read_bytes() == b"inside" * 10_000 + b"!"
    assert not (mount / "ren-dir").exists()


@pytest.mark.parametrize("shape", [(1000,), (300, 257), (0,)], ids=str)
def test_header_first_npy_filled_through_a_memmap(
    cluster: Cluster, mount: Path, shape: tuple[int, ...]
) -> None:
    d = mount / f"memmap-{'x'.join(map(str, shape))}"
    d.mkdir()
    x = np.random.default_rng(3).random(shape).astype(np.float32)
    m = npformat.open_memmap(d / "w.npy", mode="w+", dtype=np.float32, shape=shape)
    m[...] = x
    m.flush()
    del m
    assert np.array_equal(np.load(d / "w.npy"), x)
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read(f"{d.name}/w"), x)
    # And again through np.memmap over the existing file, in place.
    m = np.memmap(d / "w.npy", dtype=np.float32, mode="r+", offset=128, shape=shape)
    m[...] = x * 2
    del m
    assert np.array_equal(np.load(d / "w.npy"), x * 2)


def test_header_only_npy_is_a_zero_tensor(cluster: Cluster, mount: Path) -> None:
    d = mount / "hdr-only"
    d.mkdir()
    with open(d / "z.npy", "wb") as f:
        npformat.write_array_header_1_0(
            f, {"descr": "<f8", "fortran_order": False, "shape": (10, 10)}
        )
    assert np.array_equal(np.load(d / "z.npy"), np.zeros((10, 10)))
    assert os.stat(d / "z.npy").st_size == 128 + 800
    # Longer than the header says, or not a .npy at all: refused, nothing lost.
    for payload in (npy_bytes(np.ones(3)) + b"extra", b"not a numpy file"):
        with pytest.raises(OSError) as ei, open(d / "z.npy", "wb") as f:
            f.write(payload)
        assert ei.value.errno == errno.EINVAL
        assert np.array_equal(np.load(d / "z.npy"), np.zeros((10, 10)))


@pytest.mark.parametrize("rw", ["randwrite", "write"])
def test_fio_verify(mount: Path, tmp_path: Path, rw: str) -> None:
    """fio (installed by deploy/setup.sh) writes, then reads back and checks every block."""
    d = mount / f"fio-{rw}"
    d.mkdir()
    r = subprocess.run(
        [
            "fio",
            "--name=verify",
            f"--filename={d / 'data.bin'}",
            f"--rw={rw}",
            "--bs=4k",
            "--bsrange=4k-256k",
            "--size=8M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--ioengine=psync",
            "--verify_state_save=0",  # no state file left in the working directory
            f"--output={tmp_path / 'fio.out'}",
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    out = (tmp_path / "fio.out").read_text() if (tmp_path / "fio.out").exists() else ""
    assert r.returncode == 0, r.stderr + out
    assert "err= 0" in out
    assert os.stat(d / "data.bin").st_size == 8 << 20
