"""What the file calls do with the daemons: open, create, read, write, push at
flush and close, truncate, unlink.

Readers share a snapshot per version, streamed in from open (close-to-open);
writers get a buffer of their own, pushed at flush and close (and complete
shards while they write, ``outflow``). A change made through this mount
waits for this mount's snapshots of the old content streaming in
(``OpenFiles.quiesce``), so it never mixes into one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from typing import Any, Protocol

from irdma import TensorInfo

from . import paths
from .attributes import Attributes, AttributeTable, Changes
from .backend import Backend
from .content import file_size
from .errors import FsError
from .files import FileBuffer, Handle, load, plan_outflow, push
from .handles import Opened, OpenFiles
from .paths import Kind, Target
from .resolve import Resolved, Resolver
from .snapshot import Snapshot

log = logging.getLogger("irdma.fuse")


class WholeVersions(Protocol):
    """Where a session that serves readers from whole loaded versions gets them
    (``kernel.backing.Backings``)."""

    async def take(
        self, path: str, target: Target, info: TensorInfo
    ) -> tuple[TensorInfo, Snapshot]: ...


class FileOps:
    """Files opened, written and pushed through the mount.

    ``whole``: set by a session whose readers of a tensor's file get its version
    whole at open (irdma's own session, for passthrough); otherwise readers
    share a snapshot streamed in as it is read.
    """

    def __init__(
        self, backend: Backend, files: OpenFiles[Any], attrs: AttributeTable, resolver: Resolver
    ) -> None:
        self._backend = backend
        self._files = files
        self._attrs = attrs
        self._resolver = resolver
        self.whole: WholeVersions | None = None

    def changed(self, path: str) -> None:
        """``path``'s content changed here: what is kept about the old one goes."""
        self._attrs.forget(path)
        self._files.forget(path)

    async def open_handle(
        self, path: str, res: Resolved, *, writable: bool, truncate: bool
    ) -> Handle:
        """A handle on what ``res`` is (not registered yet): a writer's buffer (loaded
        unless truncated), a step's pull, or a share of the readers' snapshot."""
        t = res.target
        c, buffers = self._backend.c, self._backend.buffers
        handle = Handle(path, t, writable, info=res.info)
        if t.kind == Kind.ACCUMULATE:
            if not writable:
                raise FsError(errno.EACCES)
            handle.buf = FileBuffer(pool=buffers)
            handle.checks_header = True
            return handle
        if t.kind == Kind.STEP:
            if writable:  # a push: the gradient for this step, written whole
                handle.buf = FileBuffer(pool=buffers)
                handle.checks_header = True
                return handle
            # A pull: waits for the step, then is this open's own content.
            info, data = await load(c, t, res.info, buffers)
            self._resolver.keep_step_info(t.name, info)
            handle.info = info
            handle.snapshot = Snapshot.of(data, info, refs=1)
            return handle
        if writable:
            if truncate or res.info is None:
                # Rewriting a file mostly keeps its size: room for that up front.
                expected = file_size(t, res.info) if res.info is not None else 0
                handle.buf = FileBuffer(capacity=expected, pool=buffers)
                handle.redefine = t.kind != Kind.SHARD
                handle.dirty.append((0, 0))
                handle.checks_header = t.typed and t.kind == Kind.TENSOR
            else:
                info, data = await load(c, t, res.info, buffers, shared=True)
                handle.info = info
                handle.buf = FileBuffer.holding(data, buffers)  # loaded for this writer alone
            return handle
        info = res.info if res.info is not None else await c.stat(t.name)
        if self.whole is not None and t.kind == Kind.TENSOR:
            info, handle.snapshot = await self.whole.take(path, t, info)
        else:
            handle.snapshot = self._files.snapshot_for(path, info)
        handle.info = info
        return handle

    async def open(self, path: str, flags: int) -> Opened:
        pending = self._files.pending(path)
        if pending is not None:  # a second open of a file being created here
            return self._files.register(pending, flags)
        res = await self._resolver.resolve(path)
        if res.target.is_dir:
            raise FsError(errno.EISDIR)
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        handle = await self.open_handle(
            path, res, writable=writable, truncate=bool(flags & os.O_TRUNC)
        )
        opened = self._files.register(handle, flags)
        snap = handle.snapshot
        info = handle.info  # set wherever a snapshot is
        if snap is not None and not snap.started and info is not None:
            # Fix its content now, at open (close-to-open), not at a first read
            # that may come after an update; reads are answered as the chunks
            # they need arrive. An open the page cache serves holds the snapshot
            # that filled it (``OpenFiles.register``): started already, and the
            # pages the kernel drops are read again from it, never from a newer
            # version.
            self._backend.stream_in(snap, handle.target, info)
        return opened

    async def create(self, path: str, mode: int, flags: int) -> tuple[Opened, Attributes]:
        t = paths.parse(path)
        if t is None:
            raise FsError(errno.EPERM)
        if t.kind in (Kind.ACCUMULATE, Kind.STEP):
            res = await self._resolver.resolve(path)  # ENOENT unless the tensor exists
            handle = await self.open_handle(path, res, writable=True, truncate=True)
            return self._files.register(handle, flags), self._attrs.of(res)
        if t.kind != Kind.DIR:  # .shards entries cannot be created
            raise FsError(errno.EPERM)
        parent = path.rpartition("/")[0]
        above = paths.parse(parent)  # a directory: the parent of a DIR path ('' the root)
        assert above is not None
        if not await self._resolver.dir_exists(above.name):
            raise FsError(errno.ENOENT)
        target = paths.file_candidates(path)[0]  # .npy: typed; anything else: raw bytes
        handle = Handle(
            path,
            target,
            True,
            buf=FileBuffer(pool=self._backend.buffers),
            redefine=True,
            checks_header=target.typed,
        )
        self._files.add_pending(handle)
        self._attrs.set_mode(path, mode)
        self.changed(path)
        return self._files.register(handle, flags), self._attrs.of(Resolved(path, target))

    async def read(self, fh: int, off: int, size: int) -> memoryview:
        handle = self._files.get(fh)
        snap = handle.snapshot
        if snap is not None:
            await snap.wait(off, size)
        return handle.read(off, size)

    def _check_size(self, size: int) -> None:
        """EFBIG for a file larger than every daemon's arena together could hold."""
        room = sum(n.arena_size for n in self._backend.c.config.nodes)
        if room and size > room:
            raise FsError(errno.EFBIG)

    async def write(self, fh: int, off: int, buf: bytes | memoryview) -> int:
        handle = self.place(fh, off, buf)
        await self.flow(handle)
        return len(buf)

    def place(self, fh: int, off: int, buf: bytes | memoryview) -> Handle:
        """The part of a write that does not wait: checks, and the bytes into the
        writer's buffer. A session that calls it as requests arrive (the own
        session) places writes in the order the kernel sent them; ``flow`` is
        the rest, to await where ``flows`` says there is any."""
        handle = self._files.get(fh)
        if not handle.writable:
            raise FsError(errno.EBADF)
        self._check_size(off + len(buf))
        handle.write(off, buf)
        if not handle.planned:
            plan_outflow(handle, self._backend.c.config.shard_size)
        return handle

    @staticmethod
    def flows(handle: Handle) -> bool:
        """Whether a write ``place`` took still has pushes to make (``flow``)."""
        return handle.outflow is not None and handle.buf is not None

    def landing(self, fh: int, off: int, size: int) -> memoryview | None:
        """Where the bytes of a write of up to ``size`` at ``off`` through ``fh`` may
        be read in from the kernel, so that ``place`` need not copy them (see
        ``FileBuffer.landing``); None if nowhere."""
        handle = self._files.find(fh)
        if handle is None or not handle.writable or handle.buf is None:
            return None
        return handle.buf.landing(off, size)

    async def flow(self, handle: Handle) -> None:
        """Push what a writer's outflow has complete behind it."""
        if handle.outflow is not None and handle.buf is not None:
            # Complete shards behind the writer go now, not all at close (after
            # the snapshots of the old content streaming in, as for any push).
            if handle.outflow.sent == 0:
                await self._files.quiesce(handle.target.name)
            await handle.outflow.advance(
                self._backend.n,
                self._backend.c,
                handle.buf.array,
                handle.written_to,
                self._backend.mover,
            )

    async def push(self, handle: Handle) -> None:
        """Store what ``handle`` wrote and not yet stored."""
        if not handle.is_dirty:
            return
        await self._files.quiesce(handle.target.name)
        await push(self._backend.c, handle)
        self._files.drop_pending(handle.path)
        self.changed(handle.path)

    async def flush(self, fh: int) -> None:
        await self.push(self._files.get(fh))

    async def closed(self, handle: Handle) -> None:
        """``handle`` was closed (``OpenFiles.close``): push what it wrote, unless it
        is still open under another number. Errors are logged: close has no
        one to tell (flush already did)."""
        self._attrs.drop_open(handle.path)
        if handle.is_dirty and not self._files.is_open(handle):
            try:
                await self.push(handle)
            except Exception as exc:  # release cannot report errors; flush already did
                log.error("dropping unsaved writes to %s: %s", handle.path, exc)
                self._files.drop_pending(handle.path)

    async def flush_all(self) -> None:
        """Push every handle with unsaved writes (before unmounting)."""
        for handle in self._files.all():
            try:
                await self.push(handle)
            except Exception as exc:
                log.error("could not push %s at unmount: %s", handle.path, exc)

    async def stop_outflow(self, handle: Handle) -> bool:
        """End a writer's background pushes (their errors no longer matter: the
        caller pushes the whole file); whether they stored anything."""
        flow, handle.outflow = handle.outflow, None
        if flow is None:
            return False
        handle.redefine = True  # what they left is not known: the whole file goes
        with contextlib.suppress(Exception):
            await flow.drain()
        return not flow.define  # the tensor was defined under the old name

    async def unlink(self, path: str) -> None:
        res = await self._resolver.resolve(path)
        if res.target.is_dir:
            raise FsError(errno.EISDIR)
        if res.target.kind != Kind.TENSOR:
            raise FsError(errno.EPERM)
        self._files.drop_pending(path)
        for h in self._files.on(path):
            await self.stop_outflow(h)  # a writer still open stores the file at close
        if res.info is not None:
            await self._files.quiesce(res.target.name)  # open readers keep what they opened
            await self._backend.c.delete(res.target.name)
        self.changed(path)

    async def setattr(self, path: str, fh: int | None, changes: Changes) -> Attributes:
        self._attrs.drop_open(path)
        res = await self._resolver.resolve(path)
        if not self._attrs.may_own(changes):
            raise FsError(errno.EPERM)
        if changes.mode is not None:
            self._attrs.set_mode(path, changes.mode)
        if changes.size is not None:
            if res.target.is_dir:
                raise FsError(errno.EISDIR)
            self._check_size(changes.size)
            handle = self._files.find(fh)
            if handle is not None and handle.writable:
                handle.truncate(changes.size)
            else:
                handle = await self.open_handle(path, res, writable=True, truncate=False)
                handle.truncate(changes.size)
                await push(self._backend.c, handle)
            res = await self._resolver.resolve(path)
        if changes.mtime_ns is not None or changes.atime_ns is not None:
            version = None if res.target.is_dir else res.info.version if res.info else None
            if res.target.is_dir or version is not None:
                self._attrs.set_times(
                    path, version, atime_ns=changes.atime_ns, mtime_ns=changes.mtime_ns
                )
        return self._attrs.of(res)
