"""The mount's operations, as every FUSE session serves them.

``Filesystem`` composes the roles (``InodeTable``, ``OpenFiles``,
``AttributeTable``, ``Resolver``, ``FileOps``, ``Directories``, ``Renames``,
``Xattrs``) and answers each filesystem call in the session's own terms:
inode numbers, names as bytes, attributes as ``Attributes``. It knows no FUSE
library: ``ops.IrdmaOperations`` (pyfuse3) and ``kernel.adapter`` (irdma's
own session on /dev/fuse) both decode a request, call it, and encode its
answer. Failures are raised as ``FsError`` or irdma's errors; ``answer``
turns any of them into the errno the session replies with, logging what
needs logging (one mapping: ``errors.errno_for``).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
from dataclasses import dataclass

from irdma import SharedRegion
from irdma.errors import ClientClosed, DaemonUnavailable, IrdmaError

from . import paths
from .attributes import Attributes, AttributeTable, Changes
from .backend import Backend
from .buffers import BufferPool
from .directories import Directories
from .errors import FsError, errno_for
from .fileops import FileOps
from .files import Handle
from .handles import Opened, OpenFiles
from .inodes import InodeTable
from .paths import NAME_MAX
from .renames import Renames
from .resolve import Resolver
from .xattrs import Xattrs

log = logging.getLogger("irdma.fuse")

BLOCK = 4096  # statfs's block size
FILES = 1 << 20  # statfs's file counts: no limit of the mount's own


@dataclass(frozen=True)
class Statfs:
    """What statfs answers (counts in ``bsize`` blocks)."""

    blocks: int
    bfree: int
    bavail: int
    files: int
    ffree: int
    bsize: int = BLOCK
    frsize: int = BLOCK
    namemax: int = NAME_MAX


def answer(op: str, exc: Exception) -> int:
    """The errno a failed call ``op`` answers for ``exc``; logs I/O errors, refusals
    and faults of ours (a fault costs its call, never the mount)."""
    if isinstance(exc, FsError):  # the call's answer, decided by its role
        return exc.errno
    if isinstance(exc, IrdmaError | ValueError):
        code = errno_for(exc)
        if code in (errno.EIO, errno.ETIMEDOUT, errno.EPERM) or isinstance(
            exc, DaemonUnavailable | ClientClosed
        ):
            log.error("%s: %s", op, exc)
        elif code == errno.EINVAL:
            log.warning("%s: refused: %s", op, exc)
        return code
    log.error("%s: internal error, answered EIO: %s", op, exc, exc_info=exc)
    return errno.EIO


class Filesystem:
    """The mount's filesystem over its roles; ``backend.client`` is set once the trio
    loop runs."""

    def __init__(
        self,
        *,
        direct_io: bool = False,
        uid: int | None = None,
        gid: int | None = None,
        shared: SharedRegion | None = None,
        keep_memory: int = 0,
    ) -> None:
        # Memory for large files' bytes (in ``shared``, if given: the daemons copy
        # pushes straight from it), reused once nothing uses it.
        self.backend = Backend(BufferPool(shared=shared))
        self.inodes = InodeTable()
        # Readers' files no open holds, kept (within ``keep_memory``) so the page
        # cache can serve the next open of the same version.
        self.files: OpenFiles[Attributes] = OpenFiles(direct_io=direct_io, keep_limit=keep_memory)
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

    @staticmethod
    def _changeable(*changed: str) -> None:
        """EROFS for a change under a model's versions (immutable once committed)."""
        if any(paths.read_only(p) for p in changed):
            raise FsError(errno.EROFS)

    async def flush_all(self) -> None:
        """Push every handle with unsaved writes (before unmounting)."""
        await self.fileops.flush_all()

    # -- lookups and attributes --------------------------------------------------

    async def lookup(self, parent: int, name: bytes) -> Attributes:
        path = self._child(parent, name)
        await self.renames.settled(path)
        return await self.attrs.lookup(path, self.resolver.resolve)

    async def getattr(self, inode: int) -> Attributes:
        path = self.inodes.path(inode)
        frozen = self.renames.frozen(path)
        if frozen is not None:
            return frozen
        await self.renames.settled(path)
        return await self.attrs.current(path, self.resolver.resolve)

    def drop_setid(self, inode: int) -> None:
        """Clear the set-user-id and set-group-id bits of ``inode``'s mode (a write,
        truncate or open with O_TRUNC by a caller without CAP_FSETID)."""
        self.attrs.drop_setid(self.inodes.path(inode))

    async def setattr(self, inode: int, changes: Changes, fh: int | None) -> Attributes:
        path = self.inodes.path(inode)
        self._changeable(path)
        return await self.fileops.setattr(path, fh, changes)

    # -- directories ------------------------------------------------------------

    async def opendir(self, inode: int) -> int:
        return await self.dirs.open(self.inodes.path(inode))

    def dir_entries(self, fh: int) -> list[tuple[str, Attributes]]:
        """The listing an opendir took, read by index (entry i's offset is i + 1)."""
        return self.files.dir_entries(fh)

    def releasedir(self, fh: int) -> None:
        self.files.close_dir(fh)

    async def mkdir(self, parent: int, name: bytes, mode: int) -> Attributes:
        path = self._child(parent, name)
        self._changeable(path)
        made = await self.dirs.make(path, mode)
        self.attrs.entries_changed(path, paths.parent(path))  # made now, in its parent
        return dataclasses.replace(made, **self.attrs.times_of(path))

    async def rmdir(self, parent: int, name: bytes) -> None:
        path = self._child(parent, name)
        self._changeable(path)
        await self.dirs.remove(path)
        self.attrs.forget(path)
        self.attrs.entries_changed(paths.parent(path))

    # -- files --------------------------------------------------------------------

    async def unlink(self, parent: int, name: bytes) -> None:
        path = self._child(parent, name)
        self._changeable(path)
        await self.fileops.unlink(path)
        self.attrs.entries_changed(paths.parent(path))

    async def open(self, inode: int, flags: int) -> Opened:
        await self.renames.settled(self.inodes.path(inode))
        path = self.inodes.path(inode)  # a rename may have moved it meanwhile
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
            self._changeable(path)
        return await self.fileops.open(path, flags)

    async def create(
        self, parent: int, name: bytes, mode: int, flags: int
    ) -> tuple[Opened, Attributes]:
        path = self._child(parent, name)
        self._changeable(path)
        created = await self.fileops.create(path, mode, flags)
        self.attrs.entries_changed(paths.parent(path))
        return created

    async def read(self, fh: int, off: int, size: int) -> memoryview:
        return await self.fileops.read(fh, off, size)

    async def write(self, fh: int, off: int, data: bytes | memoryview) -> int:
        return await self.fileops.write(fh, off, data)

    async def flush(self, fh: int) -> None:
        await self.fileops.flush(fh)

    async def release(self, fh: int) -> Handle | None:
        """Close ``fh`` (pushing what it wrote); the handle it was, None if none."""
        handle = self.files.close(fh)
        if handle is None:
            return None
        self.renames.closed(handle.path)
        await self.fileops.closed(handle)
        return handle

    # -- rename ---------------------------------------------------------------------

    async def rename(
        self,
        parent_old: int,
        name_old: bytes,
        parent_new: int,
        name_new: bytes,
        *,
        noreplace: bool,
        exchange: bool,
    ) -> None:
        old, new = self._child(parent_old, name_old), self._child(parent_new, name_new)
        self._changeable(old, new)
        await self.renames.rename(old, new, noreplace=noreplace, exchange=exchange)
        self.attrs.entries_changed(paths.parent(old), paths.parent(new))

    # -- extended attributes and statfs -------------------------------------------

    async def getxattr(self, inode: int, name: bytes) -> bytes:
        return await self.xattrs.get(inode, os.fsdecode(name))

    async def listxattr(self, inode: int) -> list[bytes]:
        return [os.fsencode(k) for k in await self.xattrs.all(inode)]

    def setxattr(self, name: bytes) -> None:
        self.xattrs.set(os.fsdecode(name))

    def removexattr(self, name: bytes) -> None:
        self.xattrs.remove(os.fsdecode(name))

    async def statfs(self) -> Statfs:
        usage = await self.xattrs.usage()
        free = (usage.total - usage.used) // BLOCK
        return Statfs(usage.total // BLOCK, free, free, FILES, FILES)
