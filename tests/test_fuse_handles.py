"""fuse/handles.py: open handles, files being created, directory handles, and which
opens the page cache serves (pure: no mount, no daemons)."""

from __future__ import annotations

import errno
import os
from dataclasses import replace

import numpy as np
import pytest
from irdma_fuse.errors import FsError
from irdma_fuse.files import FileBuffer, Handle
from irdma_fuse.handles import OpenFiles
from irdma_fuse.paths import Kind, Target
from irdma_fuse.snapshot import Snapshot

from irdma import TensorInfo

W = Target(Kind.TENSOR, "m/w", typed=True)
V1 = TensorInfo("m/w", "float32", (4,), 16, 4096, 1, 1, 1.0, 1.0)
V2 = replace(V1, version=2)


def reader(files: OpenFiles[str], info: TensorInfo = V1, path: str = "m/w.npy") -> Handle:
    handle = Handle(path, W, False, info=info)
    handle.snapshot = files.snapshot_for(path, info)
    return handle


def writer(path: str = "m/w.npy", dirty: bool = True) -> Handle:
    handle = Handle(path, W, True, buf=FileBuffer(b"x"))
    if dirty:
        handle.dirty.append((0, 1))
    return handle


def test_readers_of_one_version_share_its_snapshot_and_the_page_cache() -> None:
    files: OpenFiles[str] = OpenFiles()
    first, second = reader(files), reader(files)
    assert first.snapshot is second.snapshot and first.snapshot.refs == 2
    a = files.register(first)
    b = files.register(second)
    assert a.fh != b.fh and not a.direct_io and not b.direct_io
    assert not a.keep_cache  # the cache held nothing of this version yet
    assert b.keep_cache  # the first open filled it with the same content
    assert files.get(a.fh) is first and files.on("m/w.npy") == [first, second]


def test_a_newer_version_beside_an_older_open_bypasses_the_page_cache() -> None:
    files: OpenFiles[str] = OpenFiles()
    old = files.register(reader(files, V1))
    new_handle = reader(files, V2)
    assert new_handle.snapshot is not None and new_handle.snapshot.refs == 1  # its own
    new = files.register(new_handle)
    assert not old.direct_io and new.direct_io
    assert new.keep_cache  # the older open's pages stay


def test_writers_and_step_files_and_direct_io_mounts_skip_the_page_cache() -> None:
    files: OpenFiles[str] = OpenFiles()
    assert files.register(writer(), os.O_WRONLY).direct_io
    step = Handle("m/.worker/0/1/w.npy", Target(Kind.STEP, "m/w", typed=True), False, info=V1)
    step.snapshot = Snapshot.of(np.zeros(16, np.uint8), V1, refs=1)
    assert files.register(step).direct_io
    direct: OpenFiles[str] = OpenFiles(direct_io=True)
    assert direct.register(reader(direct)).direct_io


def filled(handle: Handle, info: TensorInfo = V1) -> Handle:
    """``handle`` with its snapshot read whole (as the open's stream leaves it)."""
    assert handle.snapshot is not None
    whole = Snapshot.of(np.zeros(4096, np.uint8), info)
    handle.snapshot.data, handle.snapshot._filled = whole.data, whole._filled
    return handle


def test_a_changed_file_is_not_served_from_the_page_cache_again() -> None:
    files: OpenFiles[str] = OpenFiles(keep_limit=1 << 20)
    first = filled(reader(files))
    files.close(files.register(first).fh)
    again_handle = reader(files)
    assert again_handle.snapshot is first.snapshot  # kept: no open held it
    again = files.register(again_handle)
    assert again.keep_cache  # unchanged since the first open filled the cache
    files.close(again.fh)
    files.forget("m/w.npy")  # changed through the mount
    assert not files.register(reader(files)).keep_cache


def test_the_page_cache_is_kept_only_for_a_snapshot_the_mount_still_holds() -> None:
    """The kernel drops cached pages when it sees the file change, and the open's
    reads then reach the mount: an open is served from the cache only if it holds
    the snapshot that filled it. One not kept (past the limit, or never filled
    whole) makes the next open of the same version read afresh, cache dropped."""
    files: OpenFiles[str] = OpenFiles(keep_limit=4096)
    files.close(files.register(filled(reader(files))).fh)
    files.close(files.register(filled(reader(files, path="m/x.npy"), V1)).fh)
    # The limit holds one: m/w.npy, used least recently, went.
    w = reader(files)
    assert not files.register(w).keep_cache
    assert files.register(reader(files, path="m/x.npy")).keep_cache
    assert files.kept_bytes == 0  # m/x.npy is held again: off the kept list
    files.forget("m/x.npy")
    unfilled: OpenFiles[str] = OpenFiles(keep_limit=1 << 20)
    unfilled.close(unfilled.register(reader(unfilled)).fh)  # its stream never completed
    assert not unfilled.register(reader(unfilled)).keep_cache
    nothing_kept: OpenFiles[str] = OpenFiles()
    nothing_kept.close(nothing_kept.register(filled(reader(nothing_kept))).fh)
    assert not nothing_kept.register(reader(nothing_kept)).keep_cache


def test_closing_the_last_reader_drops_the_shared_snapshot() -> None:
    files: OpenFiles[str] = OpenFiles()
    first, second = reader(files), reader(files)
    a, b = files.register(first).fh, files.register(second).fh
    assert files.close(a) is first and files.close(a) is None
    assert first.snapshot is not None and first.snapshot.refs == 1
    files.close(b)
    assert first.snapshot.refs == 0
    # Never filled whole (and nothing is kept by default): a new reader starts afresh.
    assert reader(files).snapshot is not first.snapshot
    with pytest.raises(FsError) as caught:
        files.get(a)
    assert caught.value.errno == errno.EBADF


def test_the_writer_of_a_path_is_the_file_being_created_or_a_dirty_handle() -> None:
    files: OpenFiles[str] = OpenFiles()
    assert files.writer("m/w.npy") is None
    clean = writer(dirty=False)
    files.register(clean)
    assert files.writer("m/w.npy") is None and not files.only_readers("m/w.npy")
    dirty = writer()
    files.register(dirty)
    assert files.writer("m/w.npy") is dirty
    created = writer("m/new.npy")
    files.add_pending(created)
    assert files.writer("m/new.npy") is created and files.pending("m/new.npy") is created
    assert list(files.pending_in("m")) == [("m/new.npy", created)]
    assert files.pending_under("m") and not files.pending_under("m/new.npy")
    files.drop_pending("m/new.npy")
    assert files.writer("m/new.npy") is None


def test_a_handle_registered_twice_stays_open_until_both_close() -> None:
    files: OpenFiles[str] = OpenFiles()
    created = writer("m/new.npy")
    a, b = files.register(created).fh, files.register(created).fh
    files.close(a)
    assert files.is_open(created)
    files.close(b)
    assert not files.is_open(created)


def test_directory_handles_hold_their_listing_until_released() -> None:
    files: OpenFiles[str] = OpenFiles()
    fh = files.open_dir([("a", "attrs of a"), ("b", "attrs of b")])
    assert files.register(reader(files)).fh != fh  # one series of numbers
    assert files.dir_entries(fh) == [("a", "attrs of a"), ("b", "attrs of b")]
    files.close_dir(fh)
    assert files.dir_entries(fh) == []
