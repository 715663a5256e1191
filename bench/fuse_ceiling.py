#!/usr/bin/env python3
"""What pyfuse3 itself delivers here: one file served from memory, nothing else.

The ceiling for any pyfuse3 filesystem on this machine, measured in the same
run as the irdma mount (``bench/fuse.py`` starts it): the same mount options
and read-ahead as ``irdma mount``, a preallocated buffer behind one file named
``data.npy`` that reads slice and writes copy into, and ``keep_cache`` off so
every open reads through FUSE, as a cold open of a changed tensor does.
``--direct-io`` opens the file with direct I/O (no page cache: each read()
and write() reaches the server in requests of up to max_read/max_write).

The request sizes the kernel actually sends are the negotiated ones in
practice (pyfuse3 does not show the INIT reply): on SIGTERM the server
prints, as one JSON line on stdout, the largest read and write request seen,
the number of each, the read-ahead of the mount's bdi and
``fs.fuse.max_pages_limit``.

    python bench/fuse_ceiling.py MOUNTPOINT [--capacity 1GiB] [--direct-io]
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import stat
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyfuse3
import trio
from irdma_fuse.mount import raise_read_ahead

from irdma.cluster import parse_size

FILE_INODE = pyfuse3.ROOT_INODE + 1
NAME = b"data.npy"
MAX_PAGES_LIMIT = Path("/proc/sys/fs/fuse/max_pages_limit")


@dataclass
class Requests:
    """What the kernel sent: the largest request of each kind and how many."""

    max_read: int = 0
    max_write: int = 0
    reads: int = 0
    writes: int = 0
    read_ahead_kb: int | None = None
    max_pages_limit: int | None = None


class MemoryFile(pyfuse3.Operations):
    """A directory holding one file, kept in a preallocated buffer."""

    def __init__(self, capacity: int, direct_io: bool) -> None:
        super().__init__()
        self.buf = bytearray(capacity)
        self.view = memoryview(self.buf)
        self.size = 0
        self.mtime = time.time_ns()
        self.direct_io = direct_io
        self.seen = Requests()

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.st_uid, a.st_gid = os.getuid(), os.getgid()
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.mtime
        a.attr_timeout = a.entry_timeout = 0
        if inode == pyfuse3.ROOT_INODE:
            a.st_mode, a.st_nlink = stat.S_IFDIR | 0o755, 2
        else:
            a.st_mode, a.st_nlink, a.st_size = stat.S_IFREG | 0o644, 1, self.size
        a.st_blksize = 1 << 20
        return a

    async def getattr(self, inode, ctx=None):  # type: ignore[no-untyped-def]
        if inode not in (pyfuse3.ROOT_INODE, FILE_INODE):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(inode)

    async def lookup(self, parent_inode, name, ctx=None):  # type: ignore[no-untyped-def]
        if parent_inode != pyfuse3.ROOT_INODE or name != NAME:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(FILE_INODE)

    async def opendir(self, inode, ctx):  # type: ignore[no-untyped-def]
        return inode

    async def readdir(self, fh, start_id, token):  # type: ignore[no-untyped-def]
        if start_id == 0:
            pyfuse3.readdir_reply(token, NAME, self._attr(FILE_INODE), 1)

    async def open(self, inode, flags, ctx):  # type: ignore[no-untyped-def]
        if inode != FILE_INODE:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & os.O_TRUNC:
            self.size = 0
        return pyfuse3.FileInfo(fh=inode, keep_cache=False, direct_io=self.direct_io)

    async def setattr(self, inode, attr, fields, fh, ctx):  # type: ignore[no-untyped-def]
        if fields.update_size:
            if attr.st_size > len(self.buf):
                raise pyfuse3.FUSEError(errno.EFBIG)
            self.size = attr.st_size
        self.mtime = time.time_ns()
        return self._attr(inode)

    async def read(self, fh, off, size):  # type: ignore[no-untyped-def]
        self.seen.reads += 1
        self.seen.max_read = max(self.seen.max_read, size)
        return self.view[off : min(off + size, self.size)]

    async def write(self, fh, off, buf):  # type: ignore[no-untyped-def]
        self.seen.writes += 1
        self.seen.max_write = max(self.seen.max_write, len(buf))
        end = off + len(buf)
        if end > len(self.buf):
            raise pyfuse3.FUSEError(errno.EFBIG)
        self.view[off:end] = buf
        self.size = max(self.size, end)
        self.mtime = time.time_ns()
        return len(buf)

    async def flush(self, fh):  # type: ignore[no-untyped-def]
        return None

    async def release(self, fh):  # type: ignore[no-untyped-def]
        return None

    async def releasedir(self, fh):  # type: ignore[no-untyped-def]
        return None


async def serve(mountpoint: Path, capacity: int, direct_io: bool) -> Requests:
    ops = MemoryFile(capacity, direct_io)
    options = set(pyfuse3.default_options) | {"fsname=fuse-ceiling"}
    pyfuse3.init(ops, str(mountpoint), options)
    try:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        pyfuse3.terminate()
                        return

            nursery.start_soon(stop_on_signal)

            async def tune() -> None:
                # Concurrently: the stat in there is answered by pyfuse3.main.
                ops.seen.read_ahead_kb = await trio.to_thread.run_sync(raise_read_ahead, mountpoint)

            nursery.start_soon(tune)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()
    finally:
        pyfuse3.close(unmount=True)
    with contextlib.suppress(OSError):
        ops.seen.max_pages_limit = int(MAX_PAGES_LIMIT.read_text())
    return ops.seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mountpoint", type=Path)
    ap.add_argument("--capacity", default="1GiB")
    ap.add_argument("--direct-io", action="store_true")
    args = ap.parse_args()
    seen = trio.run(serve, args.mountpoint, parse_size(args.capacity), args.direct_io)
    print(json.dumps(asdict(seen)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
