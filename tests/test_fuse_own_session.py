"""irdma's own FUSE session (``irdma mount --session own``), for real: /dev/fuse,
mount(2), passthrough reads from memfds, real daemons.

The mount tests of test_fuse_ops.py and others run against this session too
with IRDMA_TEST_MOUNT_SESSION=own (tests/helpers/mounts.py); these are the
session's own promises.
"""

from __future__ import annotations

import io
import mmap
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio
from irdma_fuse.kernel.backing import Backings
from irdma_fuse.paths import file_candidates

from irdma import AsyncClient, Client
from irdma.errors import TensorNotFound
from irdma.training.modes import Mode

from .helpers.cluster import Cluster
from .helpers.mounts import Mount, is_mounted, start_mount


@pytest.fixture
def own(cluster: Cluster, tmp_path: Path) -> Iterator[Mount]:
    """The module's cluster mounted with the own session; always unmounted."""
    m = start_mount(cluster, tmp_path / "mnt", session="own")
    try:
        yield m
    finally:
        m.unmount()


def getfattr(path: Path) -> str:
    return subprocess.run(
        ["getfattr", "-d", str(path)], capture_output=True, text=True, timeout=60, check=True
    ).stdout


def test_files_are_listed_read_written_renamed_and_removed(cluster: Cluster, own: Mount) -> None:
    mnt = own.path
    x = np.random.default_rng(1).standard_normal((300, 500)).astype(np.float32)
    with Client(cluster.config_path) as c:
        c.write("own1/x", x)
    assert sorted(os.listdir(mnt / "own1")) == ["x.npy"]
    assert os.stat(mnt / "own1" / "x.npy").st_size == 128 + x.nbytes
    assert np.array_equal(np.load(mnt / "own1" / "x.npy"), x)
    assert np.array_equal(np.load(mnt / "own1" / "x.npy", mmap_mode="r"), x)
    buf = io.BytesIO()
    np.save(buf, x)
    assert (mnt / "own1" / "x.npy").read_bytes() == buf.getvalue()  # a plain read
    # Written through the mount, read by the client.
    y = np.arange(100_000, dtype=np.int64)
    np.save(mnt / "own1" / "y.npy", y)
    payload = os.urandom(300_000)
    (mnt / "own1" / "ckpt.pt").write_bytes(payload)
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("own1/y"), y)
    assert (mnt / "own1" / "ckpt.pt").read_bytes() == payload
    (mnt / "own1" / "empty.cfg").write_bytes(b"")
    assert (mnt / "own1" / "empty.cfg").read_bytes() == b""  # nothing to map: still opens
    assert 'user.irdma.dtype="float32"' in getfattr(mnt / "own1" / "x.npy")
    assert 'user.irdma.shape="300,500"' in getfattr(mnt / "own1" / "x.npy")
    os.rename(mnt / "own1" / "y.npy", mnt / "own1" / "z.npy")
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("own1/z"), y)
    os.unlink(mnt / "own1" / "x.npy")
    assert sorted(os.listdir(mnt / "own1")) == ["ckpt.pt", "empty.cfg", "z.npy"]
    (mnt / "own1" / "sub").mkdir()
    os.rmdir(mnt / "own1" / "sub")
    assert "passthrough on" in own.log()


READ_WITHOUT_THE_MOUNT = """
import os, sys
fd = int(sys.argv[1])
sys.stdout.buffer.write(b"".join(iter(lambda: os.read(fd, 1 << 20), b"")))
"""


def test_reads_and_mmap_of_an_open_file_never_reach_the_mount(cluster: Cluster, own: Mount) -> None:
    """Passthrough: the kernel reads the memfd itself. With the mount process stopped,
    a reader of a file opened before reads and maps it whole (through the mount
    it would wait for the stopped process forever)."""
    x = np.arange(3 << 20, dtype=np.float32)  # 12 MiB
    with Client(cluster.config_path) as c:
        c.write("own2/x", x)
    path = own.path / "own2" / "x.npy"
    fd = os.open(path, os.O_RDONLY)
    try:
        own.proc.send_signal(signal.SIGSTOP)
        try:
            got = subprocess.run(
                [sys.executable, "-c", READ_WITHOUT_THE_MOUNT, str(fd)],
                pass_fds=(fd,),
                capture_output=True,
                timeout=60,  # a read that reached the stopped mount would never end
            )
        finally:
            own.proc.send_signal(signal.SIGCONT)
    finally:
        os.close(fd)
    assert got.returncode == 0, got.stderr.decode()
    assert np.array_equal(np.load(io.BytesIO(got.stdout)), x)


# Writes 12 MiB less 4 KiB of its stdin to the descriptor, says so, and waits for a line
# before it exits: its exit closes the descriptor, and a writer's close goes to the
# mount (FLUSH), which must not be stopped then.
WRITE_WITHOUT_THE_MOUNT = """
import os, sys
fd = int(sys.argv[1])
view = memoryview(sys.stdin.buffer.read((12 << 20) - 4096))
while view:
    view = view[os.write(fd, view[: 1 << 20]) :]
print("written", flush=True)
sys.stdin.readline()
"""


def test_writes_of_a_new_raw_file_never_reach_the_mount(cluster: Cluster, own: Mount) -> None:
    """Passthrough for writers: the kernel writes a new raw file opened for writing
    only into its backing file itself. With the mount process stopped, a writer of a
    file opened before writes it whole (through the mount it would wait for the
    stopped process forever); the size is the backing file's; the close pushes it."""
    payload = os.urandom(12 << 20)
    (own.path / "own10").mkdir()
    path = own.path / "own10" / "ckpt.pt"
    name = file_candidates("own10/ckpt.pt")[0].name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITE_WITHOUT_THE_MOUNT, str(fd)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        pass_fds=(fd,),
    )
    assert writer.stdin is not None and writer.stdout is not None
    try:
        # The first write asks the mount whether the file has privileges to drop
        # (the security.capability xattr); the kernel then remembers it has none.
        os.write(fd, payload[:4096])
        own.proc.send_signal(signal.SIGSTOP)
        try:
            writer.stdin.write(payload[4096:] + bytes(4096))
            writer.stdin.flush()
            # A write that reached the stopped mount would never end.
            ready, _, _ = select.select([writer.stdout], [], [], 60)
            said = writer.stdout.readline() if ready else b""
        finally:
            own.proc.send_signal(signal.SIGCONT)
        assert said == b"written\n"
        assert os.fstat(fd).st_size == len(payload)
        with Client(cluster.config_path) as c, pytest.raises(TensorNotFound):
            c.stat(name)  # pushed at a close (the writer's own, as it exits), not before
        writer.stdin.write(b"\n")
        writer.stdin.close()
        assert writer.wait(60) == 0
    finally:
        writer.kill()
        writer.wait(60)
        writer.stdin.close()
        writer.stdout.close()
        os.close(fd)
    with Client(cluster.config_path) as c:
        assert bytes(c.read_bytes(name, 0, len(payload))) == payload
    assert path.read_bytes() == payload


def test_a_passthrough_writer_is_pushed_at_fsync_and_again_after_later_writes(
    cluster: Cluster, own: Mount
) -> None:
    """The session sees no write of a passthrough writer: it pushes at fsync and at
    close when the backing file changed since it last looked. A write in place
    right after an fsync (same size, within a clock tick) still gets pushed."""
    (own.path / "own11").mkdir()
    path = own.path / "own11" / "w.bin"
    name = file_candidates("own11/w.bin")[0].name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"a" * 4096)
        os.fsync(fd)
        with Client(cluster.config_path) as c:
            assert bytes(c.read_bytes(name, 0, 4096)) == b"a" * 4096
        os.pwrite(fd, b"b" * 10, 100)
    finally:
        os.close(fd)
    want = b"a" * 100 + b"b" * 10 + b"a" * (4096 - 110)
    with Client(cluster.config_path) as c:
        assert bytes(c.read_bytes(name, 0, 4096)) == want
    assert path.read_bytes() == want
    assert "Traceback" not in own.log()


def test_a_writer_opened_for_reading_too_is_served_by_the_mount(
    cluster: Cluster, own: Mount
) -> None:
    """An open for reading and writing may map the file shared and write through the
    map after close; a passthrough map would outlive the open, so it is not
    passthrough: writes through the map reach the daemons when it is unmapped."""
    (own.path / "own12").mkdir()
    path = own.path / "own12" / "m.bin"
    name = file_candidates("own12/m.bin")[0].name
    with open(path, "w+b") as f:
        f.truncate(1 << 20)
        mapped = mmap.mmap(f.fileno(), 1 << 20)
    mapped[:5] = b"hello"  # after the close
    mapped.close()
    with Client(cluster.config_path) as c:
        assert bytes(c.read_bytes(name, 0, 5)) == b"hello"


@pytest.mark.timeout(120)
def test_files_opened_for_direct_io_can_be_mapped(cluster: Cluster, tmp_path: Path) -> None:
    """With --direct-io an open for reading and writing bypasses the page cache (no
    passthrough for writers); the session asks the kernel for
    FUSE_DIRECT_IO_ALLOW_MMAP, so a shared mapping of it works (np.memmap and
    np.load(mmap_mode=...) map shared; without the flag the kernel refuses with
    ENODEV)."""
    x = np.arange(1 << 20, dtype=np.float32)
    with Client(cluster.config_path) as c:
        c.write("dio/x", x)
    m = start_mount(cluster, tmp_path / "mnt", "--direct-io", session="own")
    try:
        path = m.path / "dio" / "x.npy"
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            assert np.array_equal(np.load(io.BytesIO(mapped[:])), x)
    finally:
        m.unmount()


def test_an_open_keeps_its_version_whole_while_the_tensor_is_rewritten(
    cluster: Cluster, own: Mount
) -> None:
    """Close-to-open: the version an open took is the one it reads whole, however
    often the tensor is rewritten after; the next open gets the newest."""
    n = 1 << 20
    path = own.path / "own3" / "t.npy"
    with Client(cluster.config_path) as c:
        c.write("own3/t", np.zeros(n, np.float32))
        with open(path, "rb") as f:
            for value in (1.0, 2.0, 3.0, 4.0):
                c.write("own3/t", np.full(n, value, np.float32))
            assert np.array_equal(np.load(f), np.zeros(n, np.float32))
    assert np.array_equal(np.load(path), np.full(n, 4.0, np.float32))


OPEN_UNTIL_SIGNALLED = """
import signal, sys
class Signalled(Exception):
    pass
def stop(signum, frame):
    raise Signalled
signal.signal(signal.SIGUSR1, stop)
try:
    open(sys.argv[1], "rb")
    print("opened")
except Signalled:
    print("interrupted")
"""


def test_a_signal_interrupts_a_request_waiting_in_the_mount(cluster: Cluster, own: Mount) -> None:
    """INTERRUPT cancels the request's handler: a pull that waits for a step no
    other worker reached returns EINTR to a signalled caller (whose handler then
    runs), and the mount goes on serving; the step's pull works once it may go."""
    model = "own7"
    with Client(cluster.config_path) as c:
        c.create(f"{model}/w", (8,), np.float32, mode=Mode.sync(2))
        steps = own.path / model / ".worker"
        np.save(steps / "0" / "0" / "w.npy", np.ones(8, np.float32))  # worker 0's step 0
        # Worker 0's pull of step 1 waits for worker 1's push of step 0.
        child = subprocess.Popen(
            [sys.executable, "-c", OPEN_UNTIL_SIGNALLED, str(steps / "0" / "1" / "w.npy")],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            wchan = Path(f"/proc/{child.pid}/wchan")
            while wchan.read_text() != "request_wait_answer":  # waiting for the mount
                assert child.poll() is None, "the pull ended without waiting"
                time.sleep(0.01)
            child.send_signal(signal.SIGUSR1)
            out, _ = child.communicate(timeout=60)  # an uninterrupted pull waits forever
        finally:
            child.kill()
            child.wait()
        assert out.strip() == "interrupted"
        assert sorted(os.listdir(own.path / model)) == ["w.npy"]  # still serving
        np.save(steps / "1" / "0" / "w.npy", np.ones(8, np.float32))  # worker 1's step 0
        assert np.array_equal(np.load(steps / "0" / "1" / "w.npy"), np.full(8, 2, np.float32))
    assert "Traceback" not in own.log()


def test_unmount_leaves_nothing_behind(cluster: Cluster, tmp_path: Path) -> None:
    """SIGTERM with a file open: the process ends cleanly, the mount is gone, and
    the same directory mounts again at once."""
    with Client(cluster.config_path) as c:
        c.write("own4/t", np.ones(1000))
    m = start_mount(cluster, tmp_path / "mnt", session="own")
    try:
        f = open(m.path / "own4" / "t.npy", "rb")  # noqa: SIM115 (held over the unmount)
        assert np.load(f).sum() == 1000
        m.unmount()
        f.close()
        assert m.proc.returncode == 0, m.log()
        assert not is_mounted(m.path)
        assert "Traceback" not in m.log() and "ERROR" not in m.log()
    finally:
        m.unmount()
    again = start_mount(cluster, tmp_path / "mnt", session="own")
    try:
        assert np.load(again.path / "own4" / "t.npy").sum() == 1000
    finally:
        again.unmount()


async def test_an_open_during_rewrites_loads_one_version_whole(cluster: Cluster) -> None:
    """A load that meets three whole rewrites half-way (the daemons no longer hold
    the write its first half came from: TornRead) reads the tensor again and serves
    the newest version whole: an open never fails because a writer is fast."""
    n = 3 << 20  # float32, 12 MiB
    async with AsyncClient(cluster.config_path) as c:
        await c.write("own5/rw", np.zeros(n, np.float32), replace=True)
        read_bytes, calls = c.read_bytes, []

        async def meets_rewrites(name, offset, size, out=None):  # type: ignore[no-untyped-def]
            calls.append(offset)
            if len(calls) == 1:  # the first read of the tensor is overtaken half-way
                half = size // 2
                stamp = await c.read_range(name, offset, out[:half])
                for value in (1.0, 2.0, 3.0):
                    await c.write(name, np.full(n, value, np.float32))
                await c.read_range(name, offset + half, out[half:], stamp)  # TornRead
            return await read_bytes(name, offset, size, out)

        c.read_bytes = meets_rewrites  # type: ignore[method-assign]
        backings = Backings(lambda: c)
        target = file_candidates("own5/rw.npy")[0]
        info, snap = await backings.take("own5/rw.npy", target, await c.stat("own5/rw"))
        assert len(calls) == 2  # read again, once
        assert snap.data is not None
        got = np.load(io.BytesIO(snap.data.tobytes()))
        assert np.array_equal(got, np.full(n, 3.0, np.float32))
        assert info.version == (await c.stat("own5/rw")).version
        backings.close()


async def test_backing_files_are_shared_by_version_and_bounded(cluster: Cluster) -> None:
    n = 1 << 18  # float32, 1 MiB files
    async with AsyncClient(cluster.config_path) as c:
        for name in ("a", "b", "c"):
            await c.write(f"own6/{name}", np.zeros(n, np.float32))
        dropped: list[int] = []
        backings = Backings(lambda: c, limit=(n * 4 + 128) * 3 // 2)  # room for one and a half
        backings.unregister = dropped.append

        async def take(name: str):  # type: ignore[no-untyped-def]
            t = file_candidates(f"own6/{name}.npy")[0]
            return (await backings.take(t.name, t, await c.stat(f"own6/{name}")))[1]

        def close(snap) -> None:  # type: ignore[no-untyped-def]
            snap.refs -= 1  # as OpenFiles.close counts it down
            backings.released(snap)

        a1, a2 = await take("a"), await take("a")
        assert a1 is a2 and a1.refs == 2  # one version, one backing file
        backing_a = backings.of(a1)
        assert backing_a is not None
        backing_a.backing_id = 7  # as the session registers it for a passthrough open
        b = await take("b")
        assert len(backings) == 2  # over the limit, but both are held: none goes
        close(a1)
        assert dropped == [] and len(backings) == 2  # still held by the other open
        close(a2)
        assert dropped == [7]  # no open holds it: its id goes...
        assert (
            len(backings) == 1 and backings.of(b) is not None
        )  # ...and so does it, over the limit
        await c.write("own6/b", np.ones(n, np.float32))  # a new version: a file of its own
        b2 = await take("b")
        assert b2 is not b and b2.data is not None and b2.data[-4:].view(np.float32)[0] == 1.0
        close(b)
        close(b2)
        await trio.lowlevel.checkpoint()
        assert backings.used <= backings.limit
        backings.close()


# Maps a file read-only (as a passthrough reader's np.load(mmap_mode="r") does), says
# so, and at a line on stdin prints the sum of its float32 body.
MAP_AND_WAIT = """
import mmap, sys
import numpy as np
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
print("mapped", flush=True)
sys.stdin.readline()
print(float(np.frombuffer(m, dtype=np.float32, offset=128).sum()), flush=True)
"""


async def test_a_released_backing_file_nothing_maps_is_reused_for_a_new_version(
    cluster: Cluster,
) -> None:
    """A new version is loaded into a kept file no open holds (its pages are there
    already), but never into one a reader's map still shows: that map keeps its
    version whole."""
    n = 5 << 20  # float32: 20 MiB files, reused (REUSE_MIN)
    async with AsyncClient(cluster.config_path) as c:
        await c.write("own13/r", np.zeros(n, np.float32))
        backings = Backings(lambda: c)
        backings.unregister = lambda _id: None
        t = file_candidates("own13/r.npy")[0]

        async def take(backing_id: int):  # type: ignore[no-untyped-def]
            snap = (await backings.take(t.name, t, await c.stat("own13/r")))[1]
            b = backings.of(snap)
            assert b is not None
            b.backing_id = backing_id  # as the session registers it for a passthrough open
            return snap, b.fd

        def close(snap) -> None:  # type: ignore[no-untyped-def]
            snap.refs -= 1  # as OpenFiles.close counts it down
            backings.released(snap)

        first, fd1 = await take(7)
        mapper = subprocess.Popen(
            [sys.executable, "-c", MAP_AND_WAIT, f"/proc/{os.getpid()}/fd/{fd1}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert mapper.stdout is not None and mapper.stdin is not None
            assert mapper.stdout.readline() == "mapped\n"
            close(first)
            await c.write("own13/r", np.ones(n, np.float32))
            second, fd2 = await take(8)
            assert fd2 != fd1  # the first is mapped elsewhere: a new file
            mapper.stdin.write("\n")
            mapper.stdin.flush()
            assert float(mapper.stdout.readline()) == 0.0  # the map still shows version 1
        finally:
            mapper.kill()
            mapper.communicate(timeout=60)
        close(second)
        await c.write("own13/r", np.full(n, 2.0, np.float32))
        third, fd3 = await take(9)
        assert fd3 == fd1  # nothing maps it now: reused, the least recently used first
        assert third.data is not None
        assert np.array_equal(third.data[128:].view(np.float32), np.full(n, 2.0, np.float32))
        close(third)
        backings.close()


NOBODY = 65534
# Run as user nobody: the imports first, as root (the interpreter and the virtualenv
# may sit where that user cannot read), then the privileges dropped for good.
AS_NOBODY = f"""
import os, sys
import numpy as np
import irdma.cli.main, irdma_fuse.mount, irdma_fuse.kernel.session, irdma_fuse.ops
import encodings.idna, irdma.transport.select, irdma.transport.tcp
os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})
"""
MOUNT_AS_NOBODY = AS_NOBODY + "sys.exit(irdma.cli.main.main(sys.argv[1:]))\n"
USE_AS_NOBODY = (
    AS_NOBODY
    + """
mnt = sys.argv[1]
x = np.load(os.path.join(mnt, "user1", "x.npy"))
np.save(os.path.join(mnt, "user1", "y.npy"), x * 2)
print(float(x.sum()), os.stat(os.path.join(mnt, "user1", "x.npy")).st_uid)
"""
)


@pytest.fixture
def fuse_for_users() -> Iterator[None]:
    """/dev/fuse open to every user, as udev makes it on a Debian host (0666): fusermount3
    opens it as the user. Containers often make it 0600; its mode is put back after."""
    mode = os.stat("/dev/fuse").st_mode & 0o777
    os.chmod("/dev/fuse", 0o666)
    try:
        yield
    finally:
        os.chmod("/dev/fuse", mode)


@pytest.fixture
def nobodys(cluster: Cluster, fuse_for_users: None) -> Iterator[Path]:
    """A directory with the cluster's config and an empty mount point that user nobody
    owns (under /tmp: pytest's own directories are closed to other users)."""
    d = Path("/tmp") / f"irdma-user-mount-{os.getpid()}"
    d.mkdir(mode=0o755)
    try:
        (d / "cluster.toml").write_bytes(cluster.config_path.read_bytes())
        (d / "mnt").mkdir()
        os.chown(d / "mnt", NOBODY, NOBODY)
        yield d
    finally:
        if is_mounted(d / "mnt"):
            subprocess.run(["fusermount3", "-u", "-z", str(d / "mnt")], check=False)
        shutil.rmtree(d, ignore_errors=True)


def test_a_user_mounts_through_fusermount3_and_unmounts(cluster: Cluster, nobodys: Path) -> None:
    """Not root: the session mounts through fusermount3's descriptor handoff, serves
    reads itself (passthrough needs CAP_SYS_ADMIN) and writes, and fusermount3
    unmounts it at SIGTERM."""
    x = np.arange(50_000, dtype=np.float32)
    with Client(cluster.config_path) as c:
        c.write("user1/x", x)
    mnt = nobodys / "mnt"
    argv = ["--config", str(nobodys / "cluster.toml"), "mount", str(mnt), "--foreground"]
    argv += ["--session", "own", "--shared-memory", "0"]
    log_path = nobodys / "mount.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", MOUNT_AS_NOBODY, *argv],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            cwd="/",
        )
    try:
        deadline = time.monotonic() + 60
        while not is_mounted(mnt):
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        with open("/proc/mounts") as f:
            entry = next(line.split() for line in f if line.split()[1] == str(mnt))
        assert entry[0] == "irdma" and entry[2] == "fuse.irdma", entry
        assert "user_id=65534" in entry[3], entry
        used = subprocess.run(
            [sys.executable, "-c", USE_AS_NOBODY, str(mnt)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
        )
        assert used.returncode == 0, used.stderr + log_path.read_text()
        total, owner = used.stdout.split()
        assert float(total) == float(x.sum()) and int(owner) == NOBODY
        with Client(cluster.config_path) as c:
            assert np.array_equal(c.read("user1/y"), x * 2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()
        assert not is_mounted(mnt)
        log = log_path.read_text()
        assert "passthrough on" not in log and "Traceback" not in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_user_mounting_where_they_may_not_is_told_why(cluster: Cluster, nobodys: Path) -> None:
    """fusermount3's refusal reaches the user with the mount point named; nothing is
    left mounted."""
    theirs = nobodys / "roots"
    theirs.mkdir(mode=0o755)  # root's: nobody may not mount on it
    argv = ["--config", str(nobodys / "cluster.toml"), "mount", str(theirs), "--foreground"]
    done = subprocess.run(
        [sys.executable, "-c", MOUNT_AS_NOBODY, *argv, "--session", "own"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert done.returncode == 1, done.stderr
    assert f"cannot mount {theirs}" in done.stderr and "fusermount3" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not is_mounted(theirs)
