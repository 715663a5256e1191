"""The mount's roles built over a real client, with no FUSE session (tests of
fuse/resolve.py, fileops.py, renames.py, directories.py, xattrs.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio
from irdma_fuse.attributes import Attributes, AttributeTable
from irdma_fuse.backend import Backend
from irdma_fuse.directories import Directories
from irdma_fuse.fileops import FileOps
from irdma_fuse.handles import OpenFiles
from irdma_fuse.inodes import InodeTable
from irdma_fuse.renames import Renames
from irdma_fuse.resolve import Resolver
from irdma_fuse.xattrs import Xattrs

from irdma import AsyncClient


@dataclass
class Roles:
    backend: Backend
    inodes: InodeTable
    files: OpenFiles[Attributes]
    resolver: Resolver
    attrs: AttributeTable
    fileops: FileOps
    dirs: Directories
    renames: Renames
    xattrs: Xattrs


@asynccontextmanager
async def mount_roles(config_path: Path) -> AsyncIterator[Roles]:
    """The roles as the mount composes them, over a client of the cluster."""
    async with AsyncClient(config_path) as client, trio.open_nursery() as nursery:
        backend = Backend(client=client, nursery=nursery)
        inodes, files = InodeTable(), OpenFiles[Attributes]()
        resolver = Resolver(backend, files)
        attrs = AttributeTable(inodes, files, uid=0, gid=0)
        fileops = FileOps(backend, files, attrs, resolver)
        yield Roles(
            backend,
            inodes,
            files,
            resolver,
            attrs,
            fileops,
            Directories(backend, files, attrs, resolver),
            Renames(backend, inodes, files, attrs, resolver, fileops),
            Xattrs(backend, inodes, resolver),
        )
        nursery.cancel_scope.cancel()


async def release(r: Roles, fh: int) -> None:
    """Close ``fh`` as the mount's release does (pushing what it wrote)."""
    handle = r.files.close(fh)
    assert handle is not None, f"{fh} was not open"
    r.renames.closed(handle.path)
    await r.fileops.closed(handle)
