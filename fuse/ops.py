"""pyfuse3 operations over the irdma client: each handler decodes, calls, replies.

The work is done by role objects that know nothing of the FUSE session:
``InodeTable`` (inodes), ``OpenFiles`` (handles), ``AttributeTable``
(attributes), ``Resolver`` (what a path is), ``FileOps`` (file calls),
``Directories``, ``Renames`` and ``Xattrs`` (with statfs). They raise
``FsError`` or irdma's errors; ``fuse_errors`` turns both into the
``FUSEError`` pyfuse3 replies with (``errors.errno_for``: one mapping).
Attributes are never cached by the kernel for long (``ATTR_TIMEOUT``) so
every lookup sees the daemons' current state; page-cache contents are kept
across opens while a file's version does not change (``keep_cache``).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from irdma import SharedRegion
from irdma.errors import ClientClosed, DaemonUnavailable, IrdmaError

from .attributes import Attributes, AttributeTable, Changes
from .backend import Backend
from .buffers import BufferPool
from .directories import Directories
from .errors import FsError, errno_for
from .fileops import FileOps
from .handles import Opened, OpenFiles
from .inodes import InodeTable
from .renames import Renames
from .resolve import Resolver
from .xattrs import Xattrs

log = logging.getLogger("irdma.fuse")
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
        except FsError as exc:  # the call's answer, decided by its role
            raise pyfuse3.FUSEError(exc.errno) from None
        except (IrdmaError, ValueError) as exc:
            code = errno_for(exc)
            if code in (errno.EIO, errno.ETIMEDOUT, errno.EPERM) or isinstance(
                exc, DaemonUnavailable | ClientClosed
            ):
                log.error("%s: %s", fn.__name__, exc)
            elif code == errno.EINVAL:
                log.warning("%s: refused: %s", fn.__name__, exc)
            raise pyfuse3.FUSEError(code) from exc
        except Exception as exc:
            # A fault of ours must cost this call, not the whole mount.
            log.exception("%s: internal error, answered EIO: %s", fn.__name__, exc)
            raise pyfuse3.FUSEError(errno.EIO) from exc

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
    out.st_atime_ns = out.st_mtime_ns = out.st_ctime_ns = a.time_ns
    return out


def file_info(opened: Opened) -> pyfuse3.FileInfo:
    return pyfuse3.FileInfo(fh=opened.fh, direct_io=opened.direct_io, keep_cache=opened.keep_cache)


class IrdmaOperations(pyfuse3.Operations):
    """The mount's filesystem. ``backend.client`` is set once the trio loop runs."""

    enable_writeback_cache = False

    def __init__(
        self,
        *,
        direct_io: bool = False,
        uid: int | None = None,
        gid: int | None = None,
        shared: SharedRegion | None = None,
    ) -> None:
        super().__init__()
        # Memory for large files' bytes (in ``shared``, if given: the daemons copy
        # pushes straight from it), reused once nothing uses it.
        self.backend = Backend(BufferPool(shared=shared))
        self.inodes = InodeTable()
        self.files: OpenFiles[Attributes] = OpenFiles(direct_io=direct_io)
        self.resolver = Resolver(self.backend, self.files)
        self.attrs = AttributeTable(
            self.inodes,
            self.files,
            uid=os.getuid() if uid is None else uid,
            gid=os.getgid() if gid is None else gid,
        )
        self.fileops = FileOps(self.backend, self.files, self.attrs, self.resolver)
        self.dirs = Directories(self.backend, self.files, self.attrs, self.resolver)
        self.renames = Renames(
            self.backend, self.inodes, self.files, self.attrs, self.resolver, self.fileops
        )
        self.xattrs = Xattrs(self.backend, self.inodes, self.resolver)

    def _child(self, parent: int, name: bytes) -> str:
        return self.inodes.child(parent, os.fsdecode(name))

    async def flush_all(self) -> None:
        """Push every handle with unsaved writes (before unmounting)."""
        await self.fileops.flush_all()

    # -- lookups and attributes --------------------------------------------------

    @fuse_errors
    async def lookup(self, parent_inode, name, ctx=None):
        path = self._child(parent_inode, name)
        await self.renames.settled(path)
        return entry(await self.attrs.lookup(path, self.resolver.resolve))

    @fuse_errors
    async def getattr(self, inode, ctx=None):
        path = self.inodes.path(inode)
        frozen = self.renames.frozen(path)
        if frozen is not None:
            return entry(frozen)
        await self.renames.settled(path)
        return entry(await self.attrs.current(path, self.resolver.resolve))

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
        )
        return entry(await self.fileops.setattr(self.inodes.path(inode), fh, changes))

    # -- directories ------------------------------------------------------------

    @fuse_errors
    async def opendir(self, inode, ctx):
        return await self.dirs.open(self.inodes.path(inode))

    @fuse_errors
    async def readdir(self, fh, start_id, token):
        entries = self.files.dir_entries(fh)
        for i in range(start_id, len(entries)):
            name, attrs = entries[i]
            if not pyfuse3.readdir_reply(token, os.fsencode(name), entry(attrs), i + 1):
                break

    async def releasedir(self, fh):
        self.files.close_dir(fh)

    @fuse_errors
    async def mkdir(self, parent_inode, name, mode, ctx):
        return entry(await self.dirs.make(self._child(parent_inode, name), mode))

    @fuse_errors
    async def rmdir(self, parent_inode, name, ctx):
        await self.dirs.remove(self._child(parent_inode, name))

    # -- files --------------------------------------------------------------------

    @fuse_errors
    async def unlink(self, parent_inode, name, ctx):
        await self.fileops.unlink(self._child(parent_inode, name))

    @fuse_errors
    async def open(self, inode, flags, ctx):
        await self.renames.settled(self.inodes.path(inode))
        path = self.inodes.path(inode)  # a rename may have moved it meanwhile
        return file_info(await self.fileops.open(path, flags))

    @fuse_errors
    async def create(self, parent_inode, name, mode, flags, ctx):
        opened, attrs = await self.fileops.create(self._child(parent_inode, name), mode, flags)
        return file_info(opened), entry(attrs)

    @fuse_errors
    async def read(self, fh, off, size):
        return await self.fileops.read(fh, off, size)

    @fuse_errors
    async def write(self, fh, off, buf):
        return await self.fileops.write(fh, off, buf)

    @fuse_errors
    async def flush(self, fh):
        await self.fileops.flush(fh)

    @fuse_errors
    async def fsync(self, fh, datasync):
        await self.fileops.flush(fh)

    async def release(self, fh):
        handle = self.files.close(fh)
        if handle is None:
            return
        self.renames.closed(handle.path)
        await self.fileops.closed(handle)

    # -- rename, links ------------------------------------------------------------

    @fuse_errors
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        await self.renames.rename(
            self._child(parent_inode_old, name_old),
            self._child(parent_inode_new, name_new),
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
        return await self.xattrs.get(inode, os.fsdecode(name))

    @fuse_errors
    async def listxattr(self, inode, ctx):
        return [os.fsencode(k) for k in await self.xattrs.all(inode)]

    @fuse_errors
    async def setxattr(self, inode, name, value, ctx):
        self.xattrs.set(os.fsdecode(name))

    @fuse_errors
    async def removexattr(self, inode, name, ctx):
        self.xattrs.remove(os.fsdecode(name))

    @fuse_errors
    async def statfs(self, ctx):
        usage = await self.xattrs.usage()
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = usage.total // 4096
        s.f_bfree = s.f_bavail = (usage.total - usage.used) // 4096
        s.f_files = s.f_ffree = s.f_favail = 1 << 20
        s.f_namemax = 255
        return s
