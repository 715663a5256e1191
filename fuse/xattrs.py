"""Extended attributes (``user.irdma.*``: a tensor's layout and placement, read
only) and statfs (the daemons' arenas, added up)."""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass

import trio

from irdma import describe_options
from irdma.errors import IrdmaError

from .backend import Backend
from .errors import ENOATTR, FsError
from .inodes import InodeTable
from .paths import Kind
from .resolve import Resolver

log = logging.getLogger("irdma.fuse")

XATTR_PREFIX = "user.irdma."


@dataclass(frozen=True)
class Usage:
    """The space of the daemons that answered, in bytes."""

    total: int
    used: int


class Xattrs:
    """The computed extended attributes of the mount's files, and its statfs."""

    def __init__(self, backend: Backend, inodes: InodeTable, resolver: Resolver) -> None:
        self._backend = backend
        self._inodes = inodes
        self._resolver = resolver

    async def all(self, inode: int) -> dict[str, bytes]:
        """Every extended attribute of file ``inode`` (none for a directory)."""
        res = await self._resolver.resolve(self._inodes.path(inode))
        info = res.info
        if info is None:
            return {}
        out = {
            "dtype": info.dtype,
            "shape": ",".join(map(str, info.shape)),
            "version": str(info.version),
            "shards": str(info.num_shards),
            "shard_size": str(info.shard_size),
            "nbytes": str(info.nbytes),
        }
        if "mode" in info.options:
            out["mode"] = describe_options(info.options)
        if res.target.kind == Kind.SHARD:
            config = self._backend.c.config
            replicas = config.replicas_for(info.meta.key, res.target.index)
            out["replicas"] = ",".join(n.name for n in replicas)
            out["primary"] = replicas[0].name
        return {XATTR_PREFIX + k: v.encode() for k, v in out.items()}

    async def get(self, inode: int, name: str) -> bytes:
        """Attribute ``name`` of file ``inode``; ENOATTR if it has none by that name."""
        if not name.startswith(XATTR_PREFIX):
            # The kernel asks for security.capability before every write to
            # a file (to clear it): answered here, not by asking the daemons.
            raise FsError(ENOATTR)
        value = (await self.all(inode)).get(name)
        if value is None:
            raise FsError(ENOATTR)
        return value

    def set(self, name: str) -> None:
        """Setting any attribute fails: ours are computed (EPERM), others unsupported."""
        if name.startswith(XATTR_PREFIX):
            raise FsError(errno.EPERM)  # computed, read-only
        raise FsError(errno.ENOTSUP)

    def remove(self, name: str) -> None:
        """Removing any attribute fails: ours are computed (EPERM), others absent."""
        if name.startswith(XATTR_PREFIX):
            raise FsError(errno.EPERM)
        raise FsError(ENOATTR)

    async def usage(self) -> Usage:
        """The arenas of every daemon that answers (one that does not is logged)."""
        total = used = 0
        c = self._backend.c

        async def one(node) -> None:
            nonlocal total, used
            try:
                hello = await c.hello(node)
            except IrdmaError as exc:
                log.error("statfs: %s", exc)
                return
            total += hello["arena_size"]
            used += hello["arena_used"]

        async with trio.open_nursery() as nursery:
            for node in c.config.nodes:
                nursery.start_soon(one, node)
        return Usage(total, used)
