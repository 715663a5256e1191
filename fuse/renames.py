"""Renames of files and directories, and the files they replace while open.

A rename changes the tensors' names on the daemons (their bytes stay where
they are); open handles, inode numbers and modes follow the files. While a
rename is in progress, lookups and opens of either name wait (``settled``),
so this mount's readers see the target's old content or the new, whole. A
file a rename replaces while it is open is kept for its handles, as a local
filesystem keeps an unlinked file (``_orphan``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
from typing import Any

import trio

from irdma import TensorInfo
from irdma.errors import TensorNotFound

from . import paths
from .attributes import Attributes, AttributeTable
from .backend import Backend
from .errors import FsError
from .fileops import FileOps
from .files import FileBuffer, Handle, load, push
from .handles import OpenFiles
from .inodes import InodeTable
from .paths import DIR_MARKER, Kind, Target
from .resolve import Resolved, Resolver


class Renames:
    """Renames in progress, and replaced files kept for their open handles."""

    def __init__(
        self,
        backend: Backend,
        inodes: InodeTable,
        files: OpenFiles[Any],
        attrs: AttributeTable,
        resolver: Resolver,
        fileops: FileOps,
    ) -> None:
        self._backend = backend
        self._inodes = inodes
        self._files = files
        self._attrs = attrs
        self._resolver = resolver
        self._fileops = fileops
        self._renaming: dict[str, trio.Event] = {}  # both names of a rename in progress
        # Files replaced by a rename while open: their attributes as they were.
        self._orphans: dict[str, Attributes] = {}
        self._orphan_numbers = itertools.count(1)

    async def settled(self, path: str) -> None:
        """Wait while ``path`` is the source or target of a rename in progress."""
        while (event := self._renaming.get(path)) is not None:
            await event.wait()

    def frozen(self, path: str) -> Attributes | None:
        """The attributes of a replaced file kept for its open handles, if ``path`` is one."""
        return self._orphans.get(path)

    def closed(self, path: str) -> None:
        """A handle on ``path`` was closed: a replaced file none holds any more goes."""
        if path in self._orphans and not self._files.on(path):
            del self._orphans[path]

    async def rename(self, old: str, new: str, *, noreplace: bool, exchange: bool) -> None:
        """Rename ``old`` to ``new``, replacing what is there unless ``noreplace``
        (EEXIST); ``exchange`` is not supported (EINVAL)."""
        if exchange:
            raise FsError(errno.EINVAL)
        src = await self._resolver.resolve(old)
        dst = await self._resolver.find(new)
        if dst is not None and noreplace:
            raise FsError(errno.EEXIST)
        # Lookups and opens of either name wait until the rename is done, so
        # this mount's readers see the target's old content or the new, whole.
        done = trio.Event()
        self._renaming[old] = self._renaming[new] = done
        try:
            if src.target.kind == Kind.DIR:
                await self._rename_dir(src, new, dst)
            elif src.target.kind == Kind.TENSOR:
                if dst is not None and dst.target.is_dir:
                    raise FsError(errno.EISDIR)
                await self._rename_file(src, new, dst)
            else:
                raise FsError(errno.EPERM)
            self._attrs.moved(self._inodes.move(old, new))
        finally:
            del self._renaming[old], self._renaming[new]
            done.set()

    async def _rename_file(self, src: Resolved, new: str, dst: Resolved | None) -> None:
        """Give the file's tensor the new name; open handles follow the file, and
        those open on the replaced file keep it (see ``_orphan``).

        A stored file is renamed on the daemons (its bytes stay where they are;
        a writer's pending data is pushed to it first). A file never stored yet
        (a new temporary with all its data still here) is pushed straight to
        the new name, one push either way. A rename between a ``.npy`` and a
        raw name changes what the bytes are, so it stores the file's bytes
        under the new name and deletes the old one.
        """
        t = paths.parse(new)
        if t is None or t.kind != Kind.DIR:
            raise FsError(errno.EPERM)
        target = paths.file_candidates(new)[0]
        if dst is not None:
            await self._orphan(dst)
        writer = self._files.writer(src.path)
        stored = src.info is not None or (
            writer is not None and writer.outflow is not None and not writer.outflow.define
        )
        if stored and target.typed == src.target.typed:
            if writer is not None:
                await self._fileops.push(writer)  # the rest of its data, to the name it has now
            await self._files.quiesce(src.target.name)  # this mount's readers have it whole
            info: TensorInfo | None = await self._backend.c.rename(
                src.target.name, target.name, replace=True
            )
        else:
            info = await self._store_as(src, target, writer, stored)
        if writer is not None:
            writer.dirty.clear()
            writer.redefine = False
            writer.info = info
            self._files.drop_pending(src.path)
        for h in self._files.on(src.path):
            h.path, h.target = new, target
            if h is not writer and h.writable:
                h.info = info
        self._files.move_snapshot(src.path, new, target.name)
        self._fileops.changed(src.path)
        self._fileops.changed(new)

    async def _store_as(
        self, src: Resolved, target: Target, writer: Handle | None, stored: bool
    ) -> TensorInfo | None:
        """Store the file's bytes under ``target`` and drop the old name (a rename the
        daemons cannot do by name alone); the new tensor's info."""
        c, buffers = self._backend.c, self._backend.buffers
        if writer is not None:
            assert writer.buf is not None
            data = writer.buf
            # Its background pushes went to the old name: done with them (the
            # whole file goes to the new name), and the old name is deleted.
            stored = await self._fileops.stop_outflow(writer) or stored
        else:
            _, loaded = await load(c, src.target, src.info, buffers, shared=True)
            data = FileBuffer.holding(loaded, buffers)
        moved = Handle(src.path, target, True, buf=data, redefine=True)
        await push(c, moved)
        if stored and target.name != src.target.name:
            await self._files.quiesce(src.target.name)
            with contextlib.suppress(TensorNotFound):
                await c.delete(src.target.name)
        return moved.info

    async def _orphan(self, dst: Resolved) -> None:
        """Keep the file a rename replaces for the handles open on it, as a local
        filesystem keeps an unlinked file: readers go on reading the old content
        (loaded now if they have read nothing yet) at its old size, and writers
        write to a file that no longer has a name, so their data never comes back.

        The handles and the inode move to a path no lookup can produce, whose
        attributes are frozen as they were (the kernel asks for them before
        reads, and keeps one size per inode).
        """
        replaced = self._files.on(dst.path)
        if not replaced:
            return
        for h in replaced:
            if h.snapshot is not None and not h.snapshot.started and h.info is not None:
                self._backend.stream_in(h.snapshot, h.target, h.info)
        await self._files.quiesce(dst.target.name)
        orphan = f"{dst.path}\0replaced-{next(self._orphan_numbers)}"
        self._orphans[orphan] = self._attrs.of(dst)
        self._inodes.detach(dst.path, orphan)
        for h in replaced:
            h.path = orphan
            h.detached = h.writable
        self._files.drop_snapshot(dst.path)

    async def _rename_dir(self, src: Resolved, new: str, dst: Resolved | None) -> None:
        t = paths.parse(new)
        if t is None or t.kind != Kind.DIR:
            raise FsError(errno.EPERM)
        c = self._backend.c
        if dst is not None:
            if not dst.target.is_dir:
                raise FsError(errno.ENOTDIR)
            marker = paths.join(dst.target.name, DIR_MARKER)
            if any(i.name != marker for i in await c.list(dst.target.name + "/", limit=2)):
                raise FsError(errno.ENOTEMPTY)
        if (new + "/").startswith(src.path + "/"):
            raise FsError(errno.EINVAL)  # into itself
        inside = self._files.under(src.path)
        for h in [*inside, *self._files.pending_handles()]:
            if h.path.startswith(src.path + "/"):
                await self._fileops.push(h)  # what is written inside moves with the directory
        old_prefix = src.target.name + "/"
        for info in await c.list(old_prefix):
            name = t.name + "/" + info.name[len(old_prefix) :]
            await self._files.quiesce(info.name)  # this mount's readers have it whole
            await c.rename(info.name, name, replace=True)
        for h in inside:
            h.path = new + h.path[len(src.path) :]
            h.target = paths.moved_target(h.target, h.path)
