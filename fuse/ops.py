"""pyfuse3's adapter: each handler decodes pyfuse3's types, calls ``Filesystem``, replies.

The operations themselves are ``filesystem.Filesystem`` (shared with irdma's
own session, ``kernel.adapter``), over role objects that know nothing of the
FUSE session. They raise ``FsError`` or irdma's errors; ``fuse_errors`` turns
both into the ``FUSEError`` pyfuse3 replies with (``filesystem.answer``: one
mapping). Attributes are never cached by the kernel for long
(``ATTR_TIMEOUT``) so every lookup sees the daemons' current state;
page-cache contents are kept across opens while a file's version does not
change (``keep_cache``).
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from irdma import SharedRegion

from .attributes import Attributes, Changes
from .filesystem import Filesystem, answer
from .handles import Opened

P = ParamSpec("P")
R = TypeVar("R")


def fuse_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Translate errors raised by a handler into FUSEError(errno), logging I/O errors."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:
            raise pyfuse3.FUSEError(answer(fn.__name__, exc)) from exc

    return wrapper


def entry(a: Attributes) -> pyfuse3.EntryAttributes:
    """``a`` as pyfuse3 replies with it."""
    out = pyfuse3.EntryAttributes()
    out.st_ino = a.st_ino
    out.generation = a.generation
    out.entry_timeout = a.entry_timeout
    out.attr_timeout = a.attr_timeout
    out.st_mode = a.st_mode
    out.st_nlink = a.st_nlink
    out.st_uid, out.st_gid = a.st_uid, a.st_gid
    out.st_size = a.st_size
    out.st_blksize = a.st_blksize
    out.st_blocks = a.st_blocks
    out.st_atime_ns, out.st_mtime_ns, out.st_ctime_ns = a.atime_ns, a.mtime_ns, a.ctime_ns
    return out


def file_info(opened: Opened) -> pyfuse3.FileInfo:
    return pyfuse3.FileInfo(fh=opened.fh, direct_io=opened.direct_io, keep_cache=opened.keep_cache)


class IrdmaOperations(pyfuse3.Operations):
    """The mount's filesystem under pyfuse3. ``backend.client`` is set once the trio
    loop runs."""

    enable_writeback_cache = False

    def __init__(
        self,
        *,
        direct_io: bool = False,
        uid: int | None = None,
        gid: int | None = None,
        shared: SharedRegion | None = None,
        keep_memory: int = 0,
    ) -> None:
        super().__init__()
        self.fs = Filesystem(
            direct_io=direct_io, uid=uid, gid=gid, shared=shared, keep_memory=keep_memory
        )
        self.backend = self.fs.backend

    async def flush_all(self) -> None:
        """Push every handle with unsaved writes (before unmounting)."""
        await self.fs.flush_all()

    # -- lookups and attributes --------------------------------------------------

    @fuse_errors
    async def lookup(self, parent_inode, name, ctx=None):
        return entry(await self.fs.lookup(parent_inode, name))

    @fuse_errors
    async def getattr(self, inode, ctx=None):
        return entry(await self.fs.getattr(inode))

    async def forget(self, inode_list):
        pass  # inode numbers stay assigned to their paths for the mount's life

    @fuse_errors
    async def setattr(self, inode, attr, fields, fh, ctx):
        changes = Changes(
            mode=attr.st_mode if fields.update_mode else None,
            size=attr.st_size if fields.update_size else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
        )
        return entry(await self.fs.setattr(inode, changes, fh))

    # -- directories ------------------------------------------------------------

    @fuse_errors
    async def opendir(self, inode, ctx):
        return await self.fs.opendir(inode)

    @fuse_errors
    async def readdir(self, fh, start_id, token):
        entries = self.fs.dir_entries(fh)
        for i in range(start_id, len(entries)):
            name, attrs = entries[i]
            if not pyfuse3.readdir_reply(token, os.fsencode(name), entry(attrs), i + 1):
                break

    async def releasedir(self, fh):
        self.fs.releasedir(fh)

    @fuse_errors
    async def mkdir(self, parent_inode, name, mode, ctx):
        return entry(await self.fs.mkdir(parent_inode, name, mode))

    @fuse_errors
    async def rmdir(self, parent_inode, name, ctx):
        await self.fs.rmdir(parent_inode, name)

    # -- files --------------------------------------------------------------------

    @fuse_errors
    async def unlink(self, parent_inode, name, ctx):
        await self.fs.unlink(parent_inode, name)

    @fuse_errors
    async def open(self, inode, flags, ctx):
        return file_info(await self.fs.open(inode, flags))

    @fuse_errors
    async def create(self, parent_inode, name, mode, flags, ctx):
        opened, attrs = await self.fs.create(parent_inode, name, mode, flags)
        return file_info(opened), entry(attrs)

    @fuse_errors
    async def read(self, fh, off, size):
        return await self.fs.read(fh, off, size)

    @fuse_errors
    async def write(self, fh, off, buf):
        return await self.fs.write(fh, off, buf)

    @fuse_errors
    async def flush(self, fh):
        await self.fs.flush(fh)

    @fuse_errors
    async def fsync(self, fh, datasync):
        await self.fs.flush(fh)

    async def release(self, fh):
        await self.fs.release(fh)

    # -- rename, links ------------------------------------------------------------

    @fuse_errors
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        await self.fs.rename(
            parent_inode_old,
            name_old,
            parent_inode_new,
            name_new,
            noreplace=bool(flags & pyfuse3.RENAME_NOREPLACE),
            exchange=bool(flags & pyfuse3.RENAME_EXCHANGE),
        )

    async def symlink(self, parent_inode, name, target, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)  # not supported: POSIX says EPERM

    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)

    async def readlink(self, inode, ctx):
        raise pyfuse3.FUSEError(errno.EINVAL)

    # -- extended attributes and statfs -------------------------------------------

    @fuse_errors
    async def getxattr(self, inode, name, ctx):
        return await self.fs.getxattr(inode, name)

    @fuse_errors
    async def listxattr(self, inode, ctx):
        return await self.fs.listxattr(inode)

    @fuse_errors
    async def setxattr(self, inode, name, value, ctx):
        self.fs.setxattr(name)

    @fuse_errors
    async def removexattr(self, inode, name, ctx):
        self.fs.removexattr(name)

    @fuse_errors
    async def statfs(self, ctx):
        got = await self.fs.statfs()
        s = pyfuse3.StatvfsData()
        s.f_bsize, s.f_frsize = got.bsize, got.frsize
        s.f_blocks, s.f_bfree, s.f_bavail = got.blocks, got.bfree, got.bavail
        s.f_files, s.f_ffree, s.f_favail = got.files, got.ffree, got.ffree
        s.f_namemax = got.namemax
        return s
