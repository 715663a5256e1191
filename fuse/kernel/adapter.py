"""The own session's answers: each decoded request to ``Filesystem``, its reply encoded.

``Adapter.answer`` is the one place a request meets the filesystem; it
returns the reply's body parts or raises (the session turns an exception
into an errno reply with ``filesystem.answer``). Opens are where the kernel's
rules for passthrough apply (``Modes``): a backing file per inode at a time,
and never beside opens the page cache serves.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..attributes import Changes
from ..errors import FsError
from ..files import FileBuffer, Handle
from ..filesystem import Filesystem
from ..handles import Opened
from ..paths import Kind
from . import abi, replies
from . import requests as rq
from .abi import OpenFlag, SetattrValid
from .backing import Backing, Backings, WrittenFile, memfd_name

log = logging.getLogger("irdma.fuse")

Body = list[replies.Buffer]


@dataclass
class _Inode:
    """What the kernel holds open on one inode: passthrough opens and which backing
    file they use, and the others (page cache or direct I/O)."""

    backing: Backing | WrittenFile | None = None
    passthrough: int = 0
    other: int = 0


@dataclass
class Modes:
    """How each inode's opens are served, as the kernel requires: a passthrough
    open only where no other open is, or others of the same backing file; any
    other open beside passthrough ones bypasses the page cache (direct I/O)."""

    inodes: dict[int, _Inode] = field(default_factory=dict)
    opens: dict[int, tuple[int, bool]] = field(default_factory=dict)  # fh -> (ino, pt)

    def may_pass(self, ino: int, backing: Backing | WrittenFile) -> bool:
        st = self.inodes.get(ino)
        return st is None or (st.other == 0 and st.backing in (None, backing))

    def busy(self, ino: int) -> bool:
        """Whether ``ino`` has passthrough opens (other opens must be direct I/O)."""
        st = self.inodes.get(ino)
        return st is not None and st.passthrough > 0

    def opened(self, fh: int, ino: int, backing: Backing | WrittenFile | None) -> None:
        st = self.inodes.setdefault(ino, _Inode())
        if backing is not None:
            st.backing, st.passthrough = backing, st.passthrough + 1
        else:
            st.other += 1
        self.opens[fh] = (ino, backing is not None)

    def closed(self, fh: int) -> None:
        got = self.opens.pop(fh, None)
        if got is None:
            return
        ino, passthrough = got
        st = self.inodes[ino]
        if passthrough:
            st.passthrough -= 1
            if st.passthrough == 0:
                st.backing = None
        else:
            st.other -= 1
        if st.passthrough == 0 and st.other == 0:
            del self.inodes[ino]


class Adapter:
    """Answers the requests of one connection with ``fs``.

    ``backings`` (with ``register``: a backing file's id from the kernel) is set
    where opens for reading get whole versions; ``passthrough`` where the kernel
    agreed to read them itself.
    """

    def __init__(
        self,
        fs: Filesystem,
        backings: Backings | None = None,
        register: Callable[[int], int] | None = None,
    ) -> None:
        self.fs = fs
        self.backings = backings
        self.register = register
        self.passthrough = False  # set at INIT
        self.modes = Modes()

    async def answer(self, req: rq.Request) -> Body:
        """The reply body for ``req`` (not a WRITE: ``place_write``); raises FsError,
        irdma's errors, or a fault."""
        fs = self.fs
        match req:
            case rq.Lookup(nodeid=parent, name=name):
                self._fresh_inode(parent, name)
                return [replies.entry(await fs.lookup(parent, name))]
            case rq.Getattr(nodeid=ino):
                return [replies.attr_out(await fs.getattr(ino))]
            case rq.Setattr():
                if req.valid & SetattrValid.KILL_SUIDGID:
                    fs.drop_setid(req.nodeid)
                return [replies.attr_out(await fs.setattr(req.nodeid, _changes(req), _fh(req)))]
            case rq.Opendir(nodeid=ino):
                return [replies.open_out(await fs.opendir(ino))]
            case rq.Readdir(fh=fh, offset=offset, size=size, plus=plus):
                return [replies.dirents(fs.dir_entries(fh), offset, size, plus)]
            case rq.Releasedir(fh=fh):
                fs.releasedir(fh)
                return []
            case rq.Fsyncdir():
                return []
            case rq.Mkdir(nodeid=parent, name=name, mode=mode, umask=umask):
                return [replies.entry(await fs.mkdir(parent, name, mode & ~umask))]
            case rq.Rmdir(nodeid=parent, name=name):
                await fs.rmdir(parent, name)
                return []
            case rq.Unlink(nodeid=parent, name=name):
                await fs.unlink(parent, name)
                return []
            case rq.Open(nodeid=ino, flags=flags):
                if req.kill_suidgid:
                    fs.drop_setid(ino)
                return [await self._open(ino, await fs.open(ino, flags), flags)]
            case rq.Create(nodeid=parent, name=name, flags=flags, mode=mode, umask=umask):
                opened, attrs = await fs.create(parent, name, mode & ~umask, flags)
                return [replies.entry(attrs), await self._open(attrs.st_ino, opened, flags)]
            case rq.Read(fh=fh, offset=offset, size=size):
                return [await fs.read(fh, offset, size)]
            case rq.Flush(fh=fh) | rq.Fsync(fh=fh):
                await fs.flush(fh)
                return []
            case rq.Release(fh=fh):
                self.modes.closed(fh)
                handle = await fs.release(fh)  # a writer's file is pushed here
                if handle is not None and self.backings is not None:
                    self.backings.released(handle.snapshot)
                if handle is not None and not fs.files.is_open(handle):
                    self._written_closed(handle)
                return []
            case rq.Rename(nodeid=parent, name=name, newdir=newdir, newname=newname, flags=f):
                await fs.rename(
                    parent,
                    name,
                    newdir,
                    newname,
                    noreplace=bool(f & abi.RENAME_NOREPLACE),
                    exchange=bool(f & abi.RENAME_EXCHANGE),
                )
                return []
            case rq.Symlink() | rq.Link() | rq.Mknod():
                raise _errno(errno.EPERM)  # not supported: POSIX says EPERM
            case rq.Readlink():
                raise _errno(errno.EINVAL)
            case rq.Getxattr(nodeid=ino, name=name, size=size):
                return [_sized(await fs.getxattr(ino, name), size)]
            case rq.Listxattr(nodeid=ino, size=size):
                return [_sized(replies.xattr_names(await fs.listxattr(ino)), size)]
            case rq.Setxattr(name=name):
                fs.setxattr(name)
                return []
            case rq.Removexattr(name=name):
                fs.removexattr(name)
                return []
            case rq.Statfs():
                return [replies.statfs_out(await fs.statfs())]
            case rq.Access():
                return []  # default_permissions: the kernel checks modes itself
        raise _errno(errno.ENOSYS)

    def place_write(self, req: rq.Write) -> Handle:
        """Take a WRITE's bytes into its file now (the session calls it as WRITEs
        arrive; ``FileOps.flow`` is what may be left to wait for); raises as
        ``answer`` does."""
        if req.kill_suidgid:
            self.fs.drop_setid(req.nodeid)
        return self.fs.fileops.place(req.fh, req.offset, req.data)

    def _fresh_inode(self, parent: int, name: bytes) -> None:
        """A new lookup of a path whose inode has passthrough opens gets a new inode:
        the kernel allows one backing file per inode and no open beside it that is
        not passthrough with that file, so a newer version or a writer opens another
        inode (the old one keeps serving the opens made with it)."""
        try:
            path = self.fs.inodes.child(parent, os.fsdecode(name))
        except FsError:
            return  # the lookup answers it
        ino = self.fs.inodes.find(path)
        if ino is not None and self.modes.busy(ino):
            self.fs.inodes.renumber(path)

    async def _open(self, ino: int, opened: Opened, flags: int) -> bytes:
        """``fuse_open_out`` for an open ``fs`` registered: passthrough where the
        handle reads a backing file the kernel may use, or writes a new file,
        else as registered."""
        handle = self.fs.files.get(opened.fh)
        backing = self.backings.of(handle.snapshot) if self.backings is not None else None
        written = self._written_file(ino, handle, flags)
        if written is not None:
            if not written.backing_id:
                assert self.register is not None
                written.backing_id = self.register(written.fd)
            self.modes.opened(opened.fh, ino, written)
            # FLUSH stays: a writer's close pushes its file and reports the outcome.
            return replies.open_out(opened.fh, OpenFlag.PASSTHROUGH, written.backing_id)
        if (
            backing is not None
            and self.passthrough
            and self.register is not None
            and self.modes.may_pass(ino, backing)
        ):
            if not backing.backing_id:
                backing.backing_id = self.register(backing.fd)
            self.modes.opened(opened.fh, ino, backing)
            # A reader's close has nothing to push: no FLUSH round trip per close.
            passing = OpenFlag.PASSTHROUGH | OpenFlag.NOFLUSH
            return replies.open_out(opened.fh, passing, backing.backing_id)
        self.modes.opened(opened.fh, ino, None)
        out = OpenFlag(0)
        if opened.direct_io or self.modes.busy(ino):
            out |= OpenFlag.DIRECT_IO
        if opened.keep_cache:
            out |= OpenFlag.KEEP_CACHE
        return replies.open_out(opened.fh, out)

    def _written_file(self, ino: int, handle: Handle, flags: int) -> WrittenFile | None:
        """The backing file a writer's open writes through passthrough, made now for a
        new or truncated raw file (not .npy) opened for writing only: its whole
        content comes from the writer. None where the open is served here:
        another open of the inode, a file that keeps content it had, a .npy
        (its header is checked as it is written, so ``echo garbage > x.npy``
        fails at the write, which no shell checks at close), a shard, an
        accumulate or a step, an open for reading and writing.

        Never for an open that can map the file writable: a passthrough map is
        a map of the backing file, which outlives the open (the kernel releases
        the open at close, not at munmap), so writes through it after the close
        would never be pushed. An open for writing only cannot be mapped."""
        if not (self.passthrough and self.register is not None and self.backings is not None):
            return None
        access = flags & os.O_ACCMODE
        buf = handle.buf
        if isinstance(buf, WrittenFile):  # a second open of a file being written
            if access == os.O_RDWR or not self.modes.may_pass(ino, buf):
                return None
            buf.exposed = True
            return buf
        if (
            access != os.O_WRONLY
            or not handle.writable
            or handle.detached
            or handle.target.kind != Kind.TENSOR
            or handle.target.typed  # a .npy's header is checked as it is written
            or type(buf) is not FileBuffer
            or len(buf) != 0
            or not handle.redefine
            or ino in self.modes.inodes  # other opens: not beside them
        ):
            return None
        handle.buf = WrittenFile(self.backings.writer_file(memfd_name(handle.target.name)))
        return handle.buf

    def _written_closed(self, handle: Handle) -> None:
        """A writer's last open is closed (its file pushed): its backing file goes,
        or is kept for the next writer."""
        buf = handle.buf
        if not isinstance(buf, WrittenFile) or self.backings is None:
            return
        if buf.backing_id and self.backings.unregister:
            self.backings.unregister(buf.backing_id)
        buf.backing_id = 0
        self.backings.writer_closed(buf.release(), buf.exposed)


def _errno(code: int) -> FsError:
    return FsError(code)


def _fh(req: rq.Setattr) -> int | None:
    return req.fh if req.valid & SetattrValid.FH else None


def _changes(req: rq.Setattr) -> Changes:
    v = SetattrValid(req.valid)
    mtime = atime = None
    if v & SetattrValid.MTIME_NOW:
        mtime = time.time_ns()
    elif v & SetattrValid.MTIME:
        mtime = req.mtime_ns
    if v & SetattrValid.ATIME_NOW:
        atime = time.time_ns()
    elif v & SetattrValid.ATIME:
        atime = req.atime_ns
    return Changes(
        mode=req.mode if v & SetattrValid.MODE else None,
        size=req.size if v & SetattrValid.SIZE else None,
        uid=req.uid_to if v & SetattrValid.UID else None,
        gid=req.gid_to if v & SetattrValid.GID else None,
        mtime_ns=mtime,
        atime_ns=atime,
    )


def _sized(value: bytes, size: int) -> bytes:
    """An xattr answer: its size when asked with 0, ERANGE when it does not fit."""
    if size == 0:
        return replies.xattr_size(len(value))
    if len(value) > size:
        raise _errno(errno.ERANGE)
    return value
