"""fuse/attributes.py: attributes built from what a path is, and the short-lived
answers kept, on a clock the test moves (pure: no mount, no daemons; what the
daemons would answer is a table the test changes)."""

from __future__ import annotations

import errno
import stat
from dataclasses import replace

import pytest
from irdma_fuse.attributes import (
    ATTR_TIMEOUT,
    LOOKUP_FAILURE_REUSE,
    OPEN_ATTR_REUSE,
    WORKER_DIR_TIMEOUT,
    AttributeTable,
    Changes,
)
from irdma_fuse.errors import FsError
from irdma_fuse.files import FileBuffer, Handle
from irdma_fuse.handles import OpenFiles
from irdma_fuse.inodes import InodeTable
from irdma_fuse.paths import Kind, Target
from irdma_fuse.resolve import Resolved

from irdma import TensorInfo
from irdma.errors import DaemonUnavailable

from .helpers.clock import Clock

W = Target(Kind.TENSOR, "m/w", typed=False)
INFO = TensorInfo("m/w", "uint8", (1000,), 1000, 4096, 1, 3, 5.0, 1.0, {"raw": True})
START_NS = 7_000_000_000


class Daemons:
    """What each path is on the daemons now; ``down`` makes every ask fail."""

    def __init__(self) -> None:
        self.paths: dict[str, Resolved] = {"m/w": Resolved("m/w", W, INFO)}
        self.down = False

    async def resolve(self, path: str) -> Resolved:
        if self.down:
            raise DaemonUnavailable("n1", "127.0.0.1:1", "refused")
        if path not in self.paths:
            raise FsError(errno.ENOENT)
        return self.paths[path]


def table() -> tuple[AttributeTable, OpenFiles[object], InodeTable, Clock]:
    clock, inodes, files = Clock(100.0), InodeTable(), OpenFiles[object]()
    attrs = AttributeTable(inodes, files, uid=1000, gid=100, clock=clock, wall_ns=lambda: START_NS)
    return attrs, files, inodes, clock


def test_a_file_shows_its_tensor_and_a_directory_the_mounts_start() -> None:
    attrs, _, inodes, _ = table()
    f = attrs.of(Resolved("m/w", W, INFO))
    assert f.st_ino == inodes.ino("m/w") and stat.S_ISREG(f.st_mode)
    assert stat.S_IMODE(f.st_mode) == 0o644 and f.st_size == 1000 and f.st_blocks == 2
    assert f.mtime_ns == 5_000_000_000 and (f.st_uid, f.st_gid) == (1000, 100)
    assert f.entry_timeout == 0 and f.attr_timeout == ATTR_TIMEOUT
    d = attrs.of(Resolved("m", Target(Kind.DIR, "m")))
    assert stat.S_ISDIR(d.st_mode) and d.st_nlink == 2 and d.mtime_ns == START_NS
    assert d.entry_timeout == ATTR_TIMEOUT
    acc = attrs.of(Resolved("m/.accumulate/w.npy", Target(Kind.ACCUMULATE, "m/w"), INFO))
    assert stat.S_IMODE(acc.st_mode) == 0o200  # written to, never read
    worker = attrs.of(Resolved("m/.worker/0/1", Target(Kind.WORKER_DIR, "m")))
    assert worker.entry_timeout == worker.attr_timeout == WORKER_DIR_TIMEOUT


def test_a_file_being_written_here_shows_the_writers_size_and_now() -> None:
    attrs, files, _, _ = table()
    writer = Handle("m/w", W, True, buf=FileBuffer(b"x" * 10))
    writer.dirty.append((0, 10))
    files.register(writer)
    a = attrs.of(Resolved("m/w", W, INFO))
    assert a.st_size == 10 and a.mtime_ns == START_NS


def test_modes_and_times_set_here_are_shown_and_follow_renames() -> None:
    attrs, _, _, _ = table()
    attrs.set_mode("m/w", stat.S_IFREG | 0o600)
    attrs.set_times("m/w", INFO.version, atime_ns=None, mtime_ns=123)
    a = attrs.of(Resolved("m/w", W, INFO))
    assert stat.S_IMODE(a.st_mode) == 0o600 and a.mtime_ns == 123
    newer = replace(INFO, version=INFO.version + 1)  # changed since: its own time again
    assert attrs.of(Resolved("m/w", W, newer)).mtime_ns == 5_000_000_000
    attrs.forget("m/w")
    assert attrs.of(Resolved("m/w", W, INFO)).mtime_ns == 5_000_000_000
    attrs.moved([("m/w", "m/v")])
    assert stat.S_IMODE(attrs.of(Resolved("m/v", W, INFO)).st_mode) == 0o600
    assert stat.S_IMODE(attrs.of(Resolved("m/w", W, INFO)).st_mode) == 0o644


def test_a_write_without_cap_fsetid_drops_the_set_id_bits_and_keeps_the_rest() -> None:
    attrs, _, _, _ = table()
    attrs.set_mode("m/w", stat.S_IFREG | 0o6755)
    attrs.drop_setid("m/w")
    assert stat.S_IMODE(attrs.of(Resolved("m/w", W, INFO)).st_mode) == 0o755
    attrs.drop_setid("m/other")  # a mode never set has no set-id bits to drop
    assert stat.S_IMODE(attrs.of(Resolved("m/other", W, INFO)).st_mode) == 0o644


async def test_a_file_open_only_for_reading_is_answered_from_memory_a_while() -> None:
    attrs, files, _, clock = table()
    daemons = Daemons()
    assert (await attrs.current("m/w", daemons.resolve)).st_size == 1000
    bigger = replace(INFO, nbytes=2000, shape=(2000,))
    daemons.paths["m/w"] = Resolved("m/w", W, bigger)
    assert (await attrs.current("m/w", daemons.resolve)).st_size == 2000  # not open: asks
    files.register(Handle("m/w", W, False, info=bigger))
    assert (await attrs.current("m/w", daemons.resolve)).st_size == 2000
    daemons.paths["m/w"] = Resolved("m/w", W, INFO)
    clock.now += OPEN_ATTR_REUSE / 2
    assert (await attrs.current("m/w", daemons.resolve)).st_size == 2000  # kept
    clock.now += OPEN_ATTR_REUSE / 2
    assert (await attrs.current("m/w", daemons.resolve)).st_size == 1000  # too old: asks
    daemons.paths["m/w"] = Resolved("m/w", W, bigger)
    attrs.drop_open("m/w")  # closed, or changed here
    assert (await attrs.current("m/w", daemons.resolve)).st_size == 2000


async def test_a_file_open_for_writing_is_never_answered_from_memory() -> None:
    attrs, files, _, _ = table()
    daemons = Daemons()
    files.register(Handle("m/w", W, False, info=INFO))
    files.register(Handle("m/w", W, True, buf=FileBuffer()))  # clean: the daemons hold it
    assert (await attrs.current("m/w", daemons.resolve)).st_size == 1000
    daemons.paths["m/w"] = Resolved("m/w", W, replace(INFO, nbytes=3000, shape=(3000,)))
    assert (await attrs.current("m/w", daemons.resolve)).st_size == 3000


async def test_a_lookup_that_found_no_daemon_is_answered_so_for_a_second() -> None:
    attrs, _, _, clock = table()
    daemons = Daemons()
    daemons.down = True
    with pytest.raises(DaemonUnavailable):
        await attrs.lookup("m/w", daemons.resolve)
    daemons.down = False
    clock.now += LOOKUP_FAILURE_REUSE / 2
    with pytest.raises(FsError) as caught:
        await attrs.lookup("m/w", daemons.resolve)  # not asked again
    assert caught.value.errno == errno.EIO
    clock.now += LOOKUP_FAILURE_REUSE / 2
    assert (await attrs.lookup("m/w", daemons.resolve)).st_size == 1000


async def test_a_lookup_that_found_nothing_is_not_kept() -> None:
    attrs, _, _, _ = table()
    daemons = Daemons()
    with pytest.raises(FsError):
        await attrs.lookup("m/new", daemons.resolve)
    daemons.paths["m/new"] = Resolved("m/new", W, INFO)
    assert (await attrs.lookup("m/new", daemons.resolve)).st_size == 1000


def test_only_the_owner_shown_may_be_set() -> None:
    attrs, _, _, _ = table()
    assert attrs.may_own(Changes()) and attrs.may_own(Changes(uid=1000, gid=100))
    assert attrs.may_own(Changes(uid=-1, gid=0xFFFFFFFF))  # "unchanged" as chown passes it
    assert not attrs.may_own(Changes(uid=0)) and not attrs.may_own(Changes(gid=5))
