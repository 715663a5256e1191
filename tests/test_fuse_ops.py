"""The FUSE mount, for real (/dev/fuse), driven with numpy and ordinary tools."""

from __future__ import annotations

import contextlib
import errno
import mmap
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from irdma import Client
from irdma.training.modes import Mode

from .helpers.cluster import Cluster
from .helpers.mounts import Mount, mount_command, start_mount


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check)


def errno_of(fn) -> int:
    try:
        fn()
    except OSError as exc:
        return exc.errno
    raise AssertionError("no error")


def test_np_save_load_and_client_agree(cluster: Cluster, mount: Path) -> None:
    (mount / "npy").mkdir()
    x = np.random.default_rng(0).standard_normal((300, 500)).astype(np.float32)  # 600 KB
    np.save(mount / "npy" / "w.npy", x)
    assert np.array_equal(np.load(mount / "npy" / "w.npy"), x)
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("npy/w"), x)
        c.write("npy/from_client", np.arange(10, dtype=np.int16))
    y = np.load(mount / "npy" / "from_client.npy")
    assert y.dtype == np.int16 and np.array_equal(y, np.arange(10))
    # The file is a valid .npy: byte-identical to what numpy writes.
    import io

    buf = io.BytesIO()
    np.save(buf, x)
    assert (mount / "npy" / "w.npy").read_bytes() == buf.getvalue()


def test_mmap_readers(mount: Path) -> None:
    x = np.arange(200_000, dtype=np.float64)
    (mount / "mm").mkdir()
    np.save(mount / "mm" / "x.npy", x)
    m = np.load(mount / "mm" / "x.npy", mmap_mode="r")
    assert np.array_equal(m, x)
    del m
    with (
        open(mount / "mm" / "x.npy", "rb") as f,
        mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm,
    ):
        assert mm[-8:] == x[-1:].tobytes()


def test_raw_files_any_format(mount: Path) -> None:
    (mount / "raw").mkdir()
    payload = os.urandom(300_000)
    (mount / "raw" / "ckpt.pt").write_bytes(payload)
    (mount / "raw" / "config.json").write_text('{"lr": 0.1}')
    assert (mount / "raw" / "ckpt.pt").read_bytes() == payload
    assert (mount / "raw" / "config.json").read_text() == '{"lr": 0.1}'
    assert sorted(os.listdir(mount / "raw")) == ["ckpt.pt", "config.json"]


def test_torch_save_and_load(mount: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is the optional 'torch' extra")
    (mount / "pt").mkdir()
    sd = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(4)}
    torch.save(sd, mount / "pt" / "ckpt.pt")
    back = torch.load(mount / "pt" / "ckpt.pt")
    assert all(torch.equal(back[k], v) for k, v in sd.items())


def test_cp_dd_cat_rsync(mount: Path, tmp_path: Path) -> None:
    src = tmp_path / "src.npy"
    x = np.random.default_rng(1).random(100_000, dtype=np.float32)
    np.save(src, x)
    (mount / "tools").mkdir()
    run("cp", str(src), str(mount / "tools" / "a.npy"))
    assert (mount / "tools" / "a.npy").read_bytes() == src.read_bytes()
    run("dd", f"if={src}", f"of={mount / 'tools' / 'b.npy'}", "bs=1M", "status=none")
    run("dd", f"if={mount / 'tools' / 'b.npy'}", f"of={tmp_path / 'b.out'}", "bs=4M", "status=none")
    assert (tmp_path / "b.out").read_bytes() == src.read_bytes()
    cat = subprocess.run(["cat", str(mount / "tools" / "a.npy")], capture_output=True, check=True)
    assert cat.stdout == src.read_bytes()
    # rsync a directory in and out again: the same files, byte for byte.
    d = tmp_path / "model"
    d.mkdir()
    np.save(d / "w.npy", x)
    (d / "meta.json").write_text("{}")
    run("rsync", "-a", f"{d}/", f"{mount / 'synced'}/")
    run("rsync", "-a", f"{mount / 'synced'}/", f"{tmp_path / 'back'}/")
    assert sorted(os.listdir(tmp_path / "back")) == ["meta.json", "w.npy"]
    assert (tmp_path / "back" / "w.npy").read_bytes() == (d / "w.npy").read_bytes()


def test_ls_stat_sizes_and_mtime(mount: Path) -> None:
    (mount / "st").mkdir()
    x = np.zeros((10, 10), np.float32)
    np.save(mount / "st" / "z.npy", x)
    st = os.stat(mount / "st" / "z.npy")
    assert st.st_size == 128 + 400  # 128-byte header (64-aligned) + data
    assert st.st_uid == os.getuid()
    out = run("ls", "-l", str(mount / "st")).stdout
    assert "z.npy" in out and " 528 " in out
    # Set mtime far in the past (as touch -d does); a write must move it to the daemons'
    # time of the write. (Comparing with the first write's mtime could not fail: equal
    # passes, and two writes may fall in one clock tick.)
    old = 1_000_000_000  # 1970-01-01T00:00:01
    os.utime(mount / "st" / "z.npy", ns=(old, old))
    assert os.stat(mount / "st" / "z.npy").st_mtime_ns == old
    np.save(mount / "st" / "z.npy", x + 1)
    assert os.stat(mount / "st" / "z.npy").st_mtime_ns > old


def test_xattrs(cluster: Cluster, mount: Path) -> None:
    (mount / "xa").mkdir()
    np.save(mount / "xa" / "w.npy", np.zeros((100, 1000), np.float32))  # 400 KB: 7 shards
    out = run("getfattr", "-d", str(mount / "xa" / "w.npy")).stdout
    assert 'user.irdma.dtype="float32"' in out
    assert 'user.irdma.shape="100,1000"' in out
    assert 'user.irdma.shards="7"' in out
    assert "user.irdma.version=" in out
    shard = mount / "xa" / ".shards" / "w" / "3"
    out = run("getfattr", "-d", str(shard)).stdout
    from irdma.protocol import tensor_key

    primary = cluster.config.primary_for(tensor_key("xa/w"), 3).name
    assert f'user.irdma.primary="{primary}"' in out and "user.irdma.replicas=" in out
    res = run(
        "setfattr", "-n", "user.irdma.dtype", "-v", "int8", str(mount / "xa" / "w.npy"), check=False
    )
    assert res.returncode != 0 and "not permitted" in res.stderr.lower()


def test_stat_right_after_a_stat_sees_another_clients_change(cluster: Cluster, mount: Path) -> None:
    # The kernel may keep attributes a little while (ATTR_TIMEOUT), but every
    # path lookup asks the mount: a stat by path is never an old answer.
    (mount / "fresh").mkdir()
    np.save(mount / "fresh" / "a.npy", np.zeros(10, np.float32))
    with Client(cluster.config_path) as client:
        for n in (20, 30, 40):
            assert os.stat(mount / "fresh" / "a.npy").st_size == 128 + 4 * (n - 10)
            client.write("fresh/a", np.zeros(n, np.float32), replace=True)
            assert os.stat(mount / "fresh" / "a.npy").st_size == 128 + 4 * n


@contextlib.contextmanager
def lone_daemon_mount(tmp_path: Path, **cluster: Any) -> Iterator[tuple[Cluster, Mount]]:
    """A mount of a one-daemon cluster of its own (``make_cluster`` options), for
    tests that stop the daemon or fill its arena."""
    from .helpers.cluster import make_cluster

    c = make_cluster(tmp_path / "c", nodes=1, **cluster)
    try:
        m = start_mount(c, tmp_path / "mnt")
        try:
            yield c, m
        finally:
            m.unmount()
    finally:
        c.close()


def test_other_xattrs_are_answered_without_the_daemons(tmp_path: Path) -> None:
    # The kernel asks for security.capability before every write to a file
    # opened without direct I/O; that must not cost a round trip to the daemons.
    with lone_daemon_mount(tmp_path, timeout=2.0) as (c, m):
        np.save(m.path / "x.npy", np.zeros(10))
        fd = os.open(m.path / "x.npy", os.O_RDONLY)
        try:
            assert os.getxattr(fd, "user.irdma.dtype") == b"float64"
            c.kill("n1")
            assert errno_of(lambda: os.getxattr(fd, "security.capability")) == errno.ENODATA
            assert errno_of(lambda: os.getxattr(fd, "user.irdma.dtype")) == errno.EIO
        finally:
            os.close(fd)


def test_shard_files(cluster: Cluster, mount: Path) -> None:
    (mount / "sh").mkdir()
    x = np.arange(50_000, dtype=np.float32)  # 200 KB: 4 shards of 64 KiB
    np.save(mount / "sh" / "x.npy", x)
    assert sorted(os.listdir(mount / "sh" / ".shards" / "x")) == ["0", "1", "2", "3"]
    raw = x.tobytes()
    for i in range(4):
        assert (mount / "sh" / ".shards" / "x" / str(i)).read_bytes() == raw[i * 65536 :][:65536]
    # Writing a shard file updates that shard only.
    new = np.full(65536 // 4, -1, np.float32)
    with open(mount / "sh" / ".shards" / "x" / "1", "r+b") as f:
        f.write(new.tobytes())
    x[16384:32768] = -1
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("sh/x"), x)
    assert errno_of(lambda: (mount / "sh" / ".shards" / "x" / "9").read_bytes()) == errno.ENOENT
    assert errno_of(lambda: os.unlink(mount / "sh" / ".shards" / "x" / "0")) == errno.EPERM


def _push_gradient(mount: str, k: int, n: int) -> None:
    for _ in range(5):
        np.save(os.path.join(mount, "acc", ".accumulate", "w.npy"), np.full(n, k, np.float64))


def test_accumulate_path_from_several_processes(mount: Path) -> None:
    (mount / "acc").mkdir()
    n = 20_000
    np.save(mount / "acc" / "w.npy", np.zeros(n, np.float64))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_push_gradient, args=(str(mount), k, n)) for k in (1, 2, 3, 4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert np.array_equal(np.load(mount / "acc" / "w.npy"), np.full(n, 5 * (1 + 2 + 3 + 4.0)))


def test_accumulate_wrong_dtype_is_refused(mount: Path) -> None:
    (mount / "acc2").mkdir()
    np.save(mount / "acc2" / "w.npy", np.zeros(4, np.float32))
    with pytest.raises(OSError) as ei:
        np.save(mount / "acc2" / ".accumulate" / "w.npy", np.ones(4, np.float64))
    assert ei.value.errno == errno.EINVAL
    assert np.array_equal(np.load(mount / "acc2" / "w.npy"), np.zeros(4, np.float32))


def test_invalid_npy_is_rejected_and_nothing_changes(mount: Path) -> None:
    (mount / "bad").mkdir()
    x = np.arange(5.0)
    np.save(mount / "bad" / "w.npy", x)
    with pytest.raises(OSError) as ei, open(mount / "bad" / "w.npy", "wb") as f:
        f.write(b"this is not a numpy file at all")
    assert ei.value.errno == errno.EINVAL
    assert np.array_equal(np.load(mount / "bad" / "w.npy"), x)


def test_changed_header_redefines_the_tensor(cluster: Cluster, mount: Path) -> None:
    (mount / "re").mkdir()
    np.save(mount / "re" / "w.npy", np.zeros((4, 4), np.float32))
    np.save(mount / "re" / "w.npy", np.ones(7, np.int64))
    with Client(cluster.config_path) as c:
        info = c.stat("re/w")
    assert info.dtype == "int64" and info.shape == (7,)


def test_a_rewrite_of_the_same_layout_keeps_the_tensor(cluster: Cluster, mount: Path) -> None:
    # np.save over a file with the layout it has writes the tensor in place:
    # same tensor (creation time, training mode), new bytes, a new version.
    with Client(cluster.config_path) as c:
        c.write("same/w", np.zeros(1000, np.float32), mode=Mode.ssp(3, 2))
        before = c.stat("same/w")
        np.save(mount / "same" / "w.npy", np.arange(1000, dtype=np.float32))
        after = c.stat("same/w")
        assert np.array_equal(c.read("same/w"), np.arange(1000, dtype=np.float32))
    assert after.ctime == before.ctime and after.options == before.options
    assert after.version > before.version
    assert os.getxattr(mount / "same" / "w.npy", "user.irdma.mode").decode().startswith("ssp")


def test_partial_write_updates_only_those_bytes(cluster: Cluster, mount: Path) -> None:
    (mount / "pw").mkdir()
    x = np.arange(100_000, dtype=np.float32)
    np.save(mount / "pw" / "x.npy", x)
    header = 128
    fd = os.open(mount / "pw" / "x.npy", os.O_RDWR)
    try:
        os.pwrite(fd, np.float32(-7).tobytes(), header + 4 * 70_000)
    finally:
        os.close(fd)
    x[70_000] = -7
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("pw/x"), x)


def test_reader_keeps_its_snapshot(mount: Path) -> None:
    (mount / "snap").mkdir()
    np.save(mount / "snap" / "v.npy", np.zeros(100_000, np.float32))
    with open(mount / "snap" / "v.npy", "rb") as old_reader:
        np.save(mount / "snap" / "v.npy", np.ones(100_000, np.float32))
        old = np.load(old_reader)
    assert np.array_equal(old, np.zeros(100_000, np.float32))  # whole, old version
    assert np.array_equal(np.load(mount / "snap" / "v.npy"), np.ones(100_000, np.float32))


def test_two_mounts_see_each_others_writes(cluster: Cluster, mount: Path, tmp_path: Path) -> None:
    other = start_mount(cluster, tmp_path / "second")
    try:
        (mount / "two").mkdir()
        np.save(mount / "two" / "a.npy", np.arange(3))
        assert np.array_equal(np.load(other.path / "two" / "a.npy"), np.arange(3))
        np.save(other.path / "two" / "a.npy", np.arange(3) * 10)
        assert np.array_equal(np.load(mount / "two" / "a.npy"), np.arange(3) * 10)
        os.unlink(other.path / "two" / "a.npy")
        assert not (mount / "two" / "a.npy").exists()
    finally:
        other.unmount()


def test_open_sees_a_new_version_while_an_old_reader_holds_the_file(
    cluster: Cluster, mount: Path
) -> None:
    """getattr answers are reused while a file is open for reading; open never uses them."""
    path = mount / "held" / "w.npy"
    path.parent.mkdir()
    np.save(path, np.zeros(1000))
    with open(path, "rb") as old:
        old.read()
        os.stat(path)  # cached for the open reader
        with Client(cluster.config_path) as c:
            c.write("held/w", np.ones(5000), replace=True)  # another writer, new size
        assert np.array_equal(np.load(path), np.ones(5000))  # a fresh open sees it
        time.sleep(0.6)  # past OPEN_ATTR_REUSE
        assert os.stat(path).st_size == np.ones(5000).nbytes + 128
        old.seek(0)
        assert np.array_equal(np.load(old), np.zeros(1000))  # the old open keeps its version


def test_mkdir_rmdir_rename(mount: Path) -> None:
    (mount / "d1" / "sub").mkdir(parents=True)
    assert (mount / "d1" / "sub").is_dir()
    assert errno_of(lambda: (mount / "d1").mkdir()) == errno.EEXIST
    np.save(mount / "d1" / "sub" / "t.npy", np.arange(4))
    assert errno_of(lambda: os.rmdir(mount / "d1" / "sub")) == errno.ENOTEMPTY
    os.rename(mount / "d1" / "sub" / "t.npy", mount / "d1" / "u.npy")
    assert np.array_equal(np.load(mount / "d1" / "u.npy"), np.arange(4))
    assert not (mount / "d1" / "sub" / "t.npy").exists()
    os.rmdir(mount / "d1" / "sub")
    assert not (mount / "d1" / "sub").exists()
    # Rename over an existing file replaces it.
    np.save(mount / "d1" / "v.npy", np.zeros(2))
    os.rename(mount / "d1" / "u.npy", mount / "d1" / "v.npy")
    assert np.array_equal(np.load(mount / "d1" / "v.npy"), np.arange(4))
    # A directory replaces an empty one (its marker alone), not one with files.
    (mount / "full").mkdir()
    np.save(mount / "full" / "a.npy", np.zeros(1))
    assert errno_of(lambda: os.rename(mount / "d1", mount / "full")) == errno.ENOTEMPTY
    (mount / "empty").mkdir()
    os.rename(mount / "full", mount / "empty")
    assert np.array_equal(np.load(mount / "empty" / "a.npy"), np.zeros(1))
    # Directories move with their tensors.
    run("mv", str(mount / "d1"), str(mount / "d2"))
    assert np.array_equal(np.load(mount / "d2" / "v.npy"), np.arange(4))
    assert not (mount / "d1").exists()
    shutil.rmtree(mount / "d2")
    assert not (mount / "d2").exists()


def test_open_flags(mount: Path) -> None:
    d = mount / "flags"
    d.mkdir()
    path = str(d / "f.bin")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
    os.write(fd, b"abc")
    os.close(fd)
    assert errno_of(lambda: os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)) == errno.EEXIST
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"def")
    os.close(fd)
    assert Path(path).read_bytes() == b"abcdef"
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"x")
    os.close(fd)
    assert Path(path).read_bytes() == b"x"
    os.truncate(path, 5)
    assert Path(path).read_bytes() == b"x\0\0\0\0"
    with open(path, "r+b") as f:
        f.truncate(2)
    assert Path(path).read_bytes() == b"x\0"
    os.chmod(path, 0o600)
    assert os.stat(path).st_mode & 0o777 == 0o600
    os.utime(path, ns=(1_000_000_000, 2_000_000_000))
    assert os.stat(path).st_mtime_ns == 2_000_000_000


def test_errnos(mount: Path) -> None:
    d = mount / "err"
    d.mkdir()
    np.save(d / "t.npy", np.zeros(3))
    assert errno_of(lambda: (d / "missing.npy").read_bytes()) == errno.ENOENT
    assert errno_of(lambda: os.listdir(d / "t.npy")) == errno.ENOTDIR
    assert errno_of(lambda: d.read_bytes()) == errno.EISDIR
    assert errno_of(lambda: os.unlink(d)) in (errno.EISDIR, errno.EPERM)
    assert errno_of(lambda: os.rmdir(d / "t.npy")) == errno.ENOTDIR
    assert errno_of(lambda: os.rmdir(d)) == errno.ENOTEMPTY
    assert errno_of(lambda: os.symlink("t.npy", d / "link")) == errno.EPERM
    assert errno_of(lambda: os.link(d / "t.npy", d / "hard")) == errno.EPERM
    assert errno_of(lambda: os.mknod(d / "fifo")) == errno.EPERM
    if os.getuid() == 0:
        assert errno_of(lambda: os.chown(d / "t.npy", 12345, 12345)) == errno.EPERM
    assert errno_of(lambda: (mount / "no" / "dir" / "x.bin").write_bytes(b"x")) == errno.ENOENT


@pytest.mark.parametrize("session", ["pyfuse3", "own"])
def test_posix_corners_names_paths_and_times(
    cluster: Cluster, tmp_path: Path, session: str
) -> None:
    """Names of 255 bytes and paths to 4085 (ENAMETOOLONG past them), EFBIG past
    the arenas, and access, modification and change times kept apart (a
    directory's moving with its entries), in both sessions."""
    m = start_mount(cluster, tmp_path / "mnt", session=session)
    try:
        d = m.path / f"px-{session}"
        d.mkdir()
        longest = "é" * 127 + "a"  # 255 bytes, 128 characters
        (d / longest).write_bytes(b"x")
        assert os.listdir(d) == [longest] and (d / longest).read_bytes() == b"x"
        assert errno_of(lambda: (d / (longest + "b")).write_bytes(b"x")) == errno.ENAMETOOLONG
        assert errno_of(lambda: os.stat(d / ("c" * 256))) == errno.ENAMETOOLONG
        # A path of 3000 bytes is a tensor's name; one past 4096 bytes (made below a
        # working directory, as the kernel allows) is refused by name.
        deep = d.joinpath(*(["d" * 250] * 12))
        deep.mkdir(parents=True)
        np.save(deep / "w.npy", np.arange(4))
        assert (np.load(deep / "w.npy") == np.arange(4)).all()
        here = os.getcwd()
        try:
            os.chdir(deep)
            further = "/".join(["e" * 250] * 4)  # the path is now about 4020 bytes
            os.makedirs(further)
            os.chdir(further)
            assert errno_of(lambda: os.mkdir("f" * 250)) == errno.ENAMETOOLONG
            # A directory whose path from the mount's root is PATH_MAX bytes is made
            # (its marker tensor's name fits); one byte more is refused by name.
            room = 4085 - len(os.fsencode(os.path.relpath(os.getcwd(), m.path))) - 1
            os.mkdir("g" * room)
            os.rmdir("g" * room)
            assert errno_of(lambda: os.mkdir("g" * (room + 1))) == errno.ENAMETOOLONG
        finally:
            os.chdir(here)
        # Larger than every arena together: EFBIG, and the file is kept.
        (d / "s.bin").write_bytes(b"abc")
        assert errno_of(lambda: os.truncate(d / "s.bin", 10**15)) == errno.EFBIG
        assert (d / "s.bin").read_bytes() == b"abc"
        # Times: each as set, and a change time of when they were set.
        f = d / "t.bin"
        f.write_bytes(b"abc")
        before = time.time_ns()
        os.utime(f, ns=(1_000_000_000, 2_000_000_000))
        st = os.stat(f)
        assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000, 2_000_000_000)
        assert st.st_ctime_ns >= before - 1_000_000_000  # now, not the time set
        os.utime(f, ns=(3_000_000_000, 2_000_000_000))
        assert os.stat(f).st_atime_ns == 3_000_000_000
        os.utime(d, ns=(4_000_000_000, 5_000_000_000))  # a directory's too
        st = os.stat(d)
        assert (st.st_atime_ns, st.st_mtime_ns) == (4_000_000_000, 5_000_000_000)
        f.write_bytes(b"new")  # a new write: its own time again
        st = os.stat(f)
        assert st.st_mtime_ns > 2_000_000_000 and st.st_atime_ns == st.st_mtime_ns
        # A directory's modification and change times move with its entries.
        sub = d / "sub"
        seen = {d: os.stat(d).st_mtime_ns}
        for change, changed in (
            (lambda: sub.mkdir(), [d]),
            (lambda: (d / "g.bin").write_bytes(b"g"), [d]),
            (lambda: os.rename(d / "g.bin", d / "h.bin"), [d]),
            (lambda: os.rename(d / "h.bin", sub / "h.bin"), [d, sub]),
            (lambda: os.unlink(sub / "h.bin"), [sub]),
            (lambda: os.rmdir(sub), [d]),
        ):
            seen |= {p: os.stat(p).st_mtime_ns for p in (d, sub) if p.exists()}
            change()
            for p in changed:
                st = os.stat(p)
                assert st.st_mtime_ns > seen[p] and st.st_ctime_ns == st.st_mtime_ns
        assert os.stat(d / "t.bin").st_mtime_ns < os.stat(d).st_mtime_ns  # its own stays
    finally:
        m.unmount()


def test_enospc_when_the_arena_is_full(tmp_path: Path) -> None:
    with lone_daemon_mount(tmp_path, arena_size=2 << 20) as (_, m):
        with pytest.raises(OSError) as ei:
            np.save(m.path / "big.npy", np.zeros(4 << 20, np.uint8))
        assert ei.value.errno == errno.ENOSPC
        st = os.statvfs(m.path)
        assert st.f_blocks * st.f_frsize == 2 << 20


def test_eio_when_daemons_are_gone(tmp_path: Path) -> None:
    with lone_daemon_mount(tmp_path, timeout=2.0) as (c, m):
        np.save(m.path / "x.npy", np.zeros(10))
        c.kill("n1")
        assert errno_of(lambda: np.load(m.path / "x.npy")) == errno.EIO
        assert "unavailable" in m.log()


def test_unmount_with_a_file_open_pushes_the_data(cluster: Cluster, tmp_path: Path) -> None:
    m = start_mount(cluster, tmp_path / "mnt")
    try:
        (m.path / "um").mkdir()
        code = (
            "import sys, time, numpy as np\n"
            f"f = open({str(m.path / 'um' / 'late.bin')!r}, 'wb')\n"
            "f.write(b'pushed at unmount'); f.flush()\n"
            "print('written', flush=True); time.sleep(30)\n"
        )
        writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert writer.stdout.readline().strip() == "written"
            m.unmount()  # SIGTERM while the file is still open in the writer
        finally:
            writer.kill()
            writer.wait()
            writer.stdout.close()
    finally:
        m.unmount()
    with Client(cluster.config_path) as c:
        assert bytes(c.read("um/late.bin")) == b"pushed at unmount"


def test_mount_refuses_bad_mountpoints(cluster: Cluster, tmp_path: Path, mount: Path) -> None:
    def irdma_mount(*args: str) -> subprocess.CompletedProcess:
        return run(*mount_command(cluster.config_path, *args), check=False)

    r = irdma_mount(str(tmp_path / "nope"))
    assert r.returncode == 1 and "does not exist" in r.stderr
    (tmp_path / "file").write_text("x")
    r = irdma_mount(str(tmp_path / "file"))
    assert r.returncode == 1 and "not a directory" in r.stderr
    r = irdma_mount(str(mount))
    assert r.returncode == 1 and "already mounted" in r.stderr


def test_mount_refuses_when_no_daemon_answers(tmp_path: Path) -> None:
    from irdma.cli.local import write_config

    cfg = write_config(tmp_path / "c", 2, arena_size=4 << 20)  # written, never started
    (tmp_path / "mnt").mkdir()
    r = run(*mount_command(cfg, str(tmp_path / "mnt")), check=False)
    assert r.returncode == 1 and "no daemon" in r.stderr
    assert not os.path.ismount(tmp_path / "mnt")


def test_background_mount_and_fusermount_unmount(cluster: Cluster, tmp_path: Path) -> None:
    mnt = tmp_path / "bg"
    mnt.mkdir()
    log = tmp_path / "bg.log"  # not the default, under /var/log for root
    r = run(*mount_command(cluster.config_path, str(mnt), "--log", str(log)), check=False)
    try:
        assert r.returncode == 0, r.stderr
        assert os.path.ismount(mnt)
        (mnt / "bgdir").mkdir()
        np.save(mnt / "bgdir" / "x.npy", np.arange(3))
    finally:
        run("fusermount3", "-u", str(mnt), check=False)
    import time

    deadline = time.monotonic() + 10
    while os.path.ismount(mnt) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.ismount(mnt)
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("bgdir/x"), np.arange(3))
