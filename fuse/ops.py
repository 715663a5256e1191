"""pyfuse3 operations over the irdma client: each handler decodes, calls, replies.

irdma errors become errno in one place (``errno_for``); handlers stay short.
Attributes are never cached by the kernel (timeouts 0) so every lookup sees
the daemons' current state; page-cache contents are kept across opens while
a file's version does not change (``keep_cache``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import numpy as np
import pyfuse3
import trio

from irdma import AsyncClient, SharedRegion, TensorInfo, describe_options
from irdma.errors import (
    ArenaFull,
    BadRequest,
    ClientClosed,
    DaemonUnavailable,
    DtypeMismatch,
    IrdmaError,
    OutOfRange,
    ShapeMismatch,
    TensorExists,
    TensorNotFound,
    WorkerEvicted,
    WorkerLost,
)

from . import paths
from .buffers import BufferPool
from .content import file_size, identity, is_raw
from .files import FileBuffer, Handle, load, plan_outflow, push
from .mover import Mover
from .npyfile import BadNpy
from .paths import DIR_MARKER, NPY, Kind, Target
from .snapshot import Snapshot

log = logging.getLogger("irdma.fuse")
P = ParamSpec("P")
R = TypeVar("R")

XATTR_PREFIX = "user.irdma."
WORKER_DIR_TIMEOUT = 300.0
# How long the kernel may use the attributes a lookup or getattr returned
# before asking again. A path is looked up afresh on every access
# (entry_timeout 0), so this only spares the getattr the kernel sends right
# after a lookup (a stat, a permission check) and bounds how old an fstat()
# of an open file may be.
ATTR_TIMEOUT = 0.05
# How old a getattr answer for a file held open only for reading may be.
OPEN_ATTR_REUSE = 0.5
# How long a lookup that failed because a daemon did not answer is answered
# from memory. The kernel asks twice for one path (revalidating its cached
# entry fails, so it drops the entry and looks the name up afresh), and each
# ask would otherwise wait the whole client timeout again.
LOOKUP_FAILURE_REUSE = 1.0


def errno_for(exc: BaseException) -> int:
    """The errno a filesystem call reports for an irdma error."""
    if isinstance(exc, TensorNotFound):
        return errno.ENOENT
    if isinstance(exc, TensorExists):
        return errno.EEXIST
    if isinstance(exc, ArenaFull):
        return errno.ENOSPC
    if isinstance(exc, WorkerLost):  # a pull waited for a worker that fell silent
        return errno.ETIMEDOUT
    if isinstance(exc, WorkerEvicted):
        return errno.EPERM
    if isinstance(
        exc, BadNpy | DtypeMismatch | ShapeMismatch | BadRequest | OutOfRange | ValueError
    ):
        return errno.EINVAL
    return errno.EIO


def fuse_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Translate irdma errors raised by a handler into FUSEError(errno), logging I/O errors."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
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


@dataclass
class Resolved:
    """A path with what it is now: a target, and the tensor behind it if any."""

    path: str
    target: Target
    info: TensorInfo | None = None


class IrdmaOperations(pyfuse3.Operations):
    """The mount's filesystem. ``client`` is set once the trio loop runs."""

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
        self.client: AsyncClient | None = None
        # Where snapshots stream in (set with the client, once the trio loop runs).
        self.nursery: trio.Nursery | None = None
        # Moves streamed reads' and background pushes' bytes in its own thread.
        self.mover: Mover | None = None
        # Memory for large files' bytes (in ``shared``, if given: the daemons copy
        # pushes straight from it), reused once nothing uses it.
        self.buffers = BufferPool(shared=shared)
        self.direct_io = direct_io
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self._paths: dict[int, str] = {pyfuse3.ROOT_INODE: ""}
        self._inos: dict[str, int] = {"": pyfuse3.ROOT_INODE}
        self._next_ino = pyfuse3.ROOT_INODE + 1
        self._handles: dict[int, Handle] = {}
        self._next_fh = 1
        self._snapshots: dict[str, Snapshot] = {}
        # Identity of the content the kernel page cache holds for a path.
        self._cached_identity: dict[str, tuple] = {}
        self._pending: dict[str, Handle] = {}  # created, not yet pushed
        self._renaming: dict[str, trio.Event] = {}  # both names of a rename in progress
        # Files replaced by a rename while open: their attributes as they were.
        self._orphans: dict[str, pyfuse3.EntryAttributes] = {}
        self._modes: dict[str, int] = {}
        self._mtimes: dict[str, tuple[int, int]] = {}  # path -> (version, ns)
        self._dir_handles: dict[int, list[tuple[str, pyfuse3.EntryAttributes]]] = {}
        # Layouts of tensors pulled and pushed through .worker paths.
        self._step_infos: dict[str, TensorInfo] = {}
        # getattr answers for files held open for reading: path -> (when, attrs).
        self._open_attrs: dict[str, tuple[float, pyfuse3.EntryAttributes]] = {}
        # Lookups that failed on an unreachable daemon: path -> (when, errno).
        self._lookup_failures: dict[str, tuple[float, int]] = {}
        self._start_ns = time.time_ns()

    # -- inodes and attributes -------------------------------------------------

    def _ino(self, path: str) -> int:
        ino = self._inos.get(path)
        if ino is None:
            ino = self._next_ino
            self._next_ino += 1
            self._inos[path] = ino
            self._paths[ino] = path
        return ino

    def _path(self, ino: int) -> str:
        try:
            return self._paths[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _child(self, parent: int, name: bytes) -> str:
        text = os.fsdecode(name)
        if "/" in text or text in (".", ".."):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return paths.join(self._path(parent), text)

    @property
    def _n(self) -> trio.Nursery:
        if self.nursery is None:
            raise pyfuse3.FUSEError(errno.EIO)
        return self.nursery

    async def _quiesce(self, name: str) -> None:
        """Wait until snapshots of tensor ``name`` streaming in are complete, so a
        change made through this mount never mixes into one."""
        snaps = {id(h.snapshot): h.snapshot for h in self._handles.values() if h.snapshot}
        for snap in [*snaps.values(), *self._snapshots.values()]:
            if snap.target_name == name:
                await snap.wait_filled()

    @property
    def _c(self) -> AsyncClient:
        if self.client is None:
            raise pyfuse3.FUSEError(errno.EIO)
        return self.client

    def _attrs(self, res: Resolved) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = self._ino(res.path)
        a.generation = 0
        a.entry_timeout = 0  # every path lookup asks: close-to-open
        a.attr_timeout = ATTR_TIMEOUT
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_blksize = 1 << 20
        t = res.target
        if t.kind == Kind.WORKER_DIR:
            # Virtual directories that never change: let the kernel keep them.
            a.entry_timeout = a.attr_timeout = WORKER_DIR_TIMEOUT
        elif t.is_dir:
            # Every path walks through its directories: a burst of opens in one
            # asks whether it exists once per ATTR_TIMEOUT, not once per open.
            # (One removed elsewhere is seen that much later; files in it are
            # looked up afresh all the same.)
            a.entry_timeout = ATTR_TIMEOUT
        if t.is_dir:
            a.st_mode = stat.S_IFDIR | self._modes.get(res.path, 0o755)
            a.st_nlink = 2
            a.st_size = 0
            ns = self._start_ns
        else:
            default = 0o200 if t.kind == Kind.ACCUMULATE else 0o644
            a.st_mode = stat.S_IFREG | self._modes.get(res.path, default)
            a.st_nlink = 1
            writer = self._pending.get(res.path) or self._writer(res.path)
            if writer is not None:
                a.st_size = writer.size()  # what this mount's open writer holds
                ns = time.time_ns()
            else:
                assert res.info is not None
                a.st_size = file_size(t, res.info)
                ns = int(res.info.mtime * 1e9)
                override = self._mtimes.get(res.path)
                if override and override[0] == res.info.version:
                    ns = override[1]
        a.st_blocks = -(-a.st_size // 512)
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = ns
        return a

    def _writer(self, path: str) -> Handle | None:
        """An open handle on ``path`` with unsaved writes, if any."""
        for h in self._handles.values():
            if h.path == path and h.writable and h.is_dirty:
                return h
        return None

    async def _stat(self, name: str) -> TensorInfo | None:
        try:
            # Lookups often find nothing (a new file, the other candidate name):
            # one round trip to every daemon either way.
            return await self._c.stat(name, everywhere=True)
        except TensorNotFound:
            return None
        except ValueError:  # not a valid tensor name: nothing can be there
            return None

    async def _dir_exists(self, prefix: str) -> bool:
        if not prefix:
            return True
        # One record at most: a directory's size must not make every path
        # through it cost a listing of all it holds.
        return bool(await self._c.list(prefix + "/", limit=1))

    async def resolve(self, path: str) -> Resolved:
        """What ``path`` is now; raises FUSEError(ENOENT) if nothing."""
        if path in self._pending:
            return Resolved(path, self._pending[path].target)
        t = paths.parse(path)
        if t is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if t.kind == Kind.ROOT:
            return Resolved(path, t)
        if t.kind == Kind.WORKER_DIR:
            # Virtual: the kernel resolved the model directory above it, and a
            # pull or push opens a new step directory every step (no listing).
            return Resolved(path, t)
        if t.kind in (Kind.SHARDS_DIR, Kind.ACCUMULATE_DIR):
            if await self._dir_exists(t.name):
                return Resolved(path, t)
        elif t.kind == Kind.STEP:
            # Pulls and pushes need only the layout, not the current version:
            # keep it per tensor (a pull that finds it changed fetches it again).
            info = self._step_infos.get(t.name) or await self._stat(t.name)
            if info is not None:
                self._step_infos[t.name] = info
                return Resolved(path, t, info)
        elif t.kind in (Kind.SHARD_TENSOR_DIR, Kind.SHARD, Kind.ACCUMULATE):
            info = await self._stat(t.name)
            if info is not None and (t.kind != Kind.SHARD or t.index < info.num_shards):
                return Resolved(path, t, info)
        else:  # a plain path: a typed tensor, a raw file or a directory
            # A .npy name is most likely its typed tensor: asked alone first
            # (one message per daemon). A name that is not a tensor costs a
            # round trip to every daemon (a tensor renamed to it may be
            # anywhere), so the other candidates and the directory are then
            # asked together. A name without .npy is a raw file or, far more
            # often (every path walks through its directories), a directory:
            # both are asked at once.
            rest = paths.file_candidates(path)
            if rest[0].typed:
                first, *rest = rest
                info = await self._stat(first.name)
                if info is not None and is_raw(info) != first.typed:
                    return Resolved(path, first, info)
            asks: list[Callable[[], Awaitable[Any]]] = [
                *(functools.partial(self._stat, c.name) for c in rest),
                functools.partial(self._dir_exists, t.name),
            ]
            *infos, is_dir = await _all_at_once(asks)
            for cand, info in zip(rest, infos, strict=True):
                if info is not None and is_raw(info) != cand.typed:
                    return Resolved(path, cand, info)
            if is_dir:
                return Resolved(path, t)
        raise pyfuse3.FUSEError(errno.ENOENT)

    # -- lookups ----------------------------------------------------------------

    @fuse_errors
    async def lookup(self, parent_inode, name, ctx=None):
        path = self._child(parent_inode, name)
        await self._settled(path)
        now = time.monotonic()
        failed = self._lookup_failures.get(path)
        if failed is not None and now - failed[0] < LOOKUP_FAILURE_REUSE:
            raise pyfuse3.FUSEError(failed[1])  # logged when it happened
        try:
            res = await self.resolve(path)
        except (DaemonUnavailable, ClientClosed) as exc:
            self._remember_lookup_failure(path, time.monotonic(), errno_for(exc))
            raise
        self._lookup_failures.pop(path, None)
        return self._attrs(res)

    def _remember_lookup_failure(self, path: str, when: float, code: int) -> None:
        # Old entries go as new ones come, so the table stays as small as the
        # set of paths that failed in the last LOOKUP_FAILURE_REUSE seconds.
        for p in [
            p for p, (t, _) in self._lookup_failures.items() if when - t >= LOOKUP_FAILURE_REUSE
        ]:
            del self._lookup_failures[p]
        self._lookup_failures[path] = (when, code)

    @fuse_errors
    async def getattr(self, inode, ctx=None):
        path = self._path(inode)
        if path in self._orphans:
            return self._orphans[path]
        await self._settled(path)
        writer = self._pending.get(path) or self._writer(path)
        if writer is not None:
            # What this mount's writer holds is the file (its size, now as
            # its time): nothing to ask the daemons. The kernel asks before
            # each write to a file opened with O_TRUNC.
            return self._attrs(Resolved(path, writer.target))
        # The kernel asks before read()s of a cached file once the attributes
        # are ATTR_TIMEOUT old; while the file is open only for reading, an
        # answer up to OPEN_ATTR_REUSE old serves. open() itself always asks
        # the daemons.
        now = time.monotonic()
        cached = self._open_attrs.get(path)
        if cached is not None and now - cached[0] < OPEN_ATTR_REUSE and self._only_readers(path):
            return cached[1]
        attrs = self._attrs(await self.resolve(path))
        if self._only_readers(path):
            self._open_attrs[path] = (now, attrs)
        else:
            self._open_attrs.pop(path, None)
        return attrs

    def _only_readers(self, path: str) -> bool:
        handles = [h for h in self._handles.values() if h.path == path]
        return bool(handles) and not any(h.writable for h in handles)

    async def forget(self, inode_list):
        pass  # inode numbers stay assigned to their paths for the mount's life

    @fuse_errors
    async def setattr(self, inode, attr, fields, fh, ctx):
        path = self._path(inode)
        self._open_attrs.pop(path, None)
        res = await self.resolve(path)
        if fields.update_uid and attr.st_uid not in (self.uid, -1, 0xFFFFFFFF):
            raise pyfuse3.FUSEError(errno.EPERM)
        if fields.update_gid and attr.st_gid not in (self.gid, -1, 0xFFFFFFFF):
            raise pyfuse3.FUSEError(errno.EPERM)
        if fields.update_mode:
            self._modes[path] = stat.S_IMODE(attr.st_mode)
        if fields.update_size:
            if res.target.is_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
            handle = self._handles.get(fh) if fh is not None else None
            if handle is not None and handle.writable:
                handle.truncate(attr.st_size)
            else:
                handle = await self._open_handle(path, res, writable=True, truncate=False)
                handle.truncate(attr.st_size)
                await push(self._c, handle)
            res = await self.resolve(path)
        if fields.update_mtime and res.info is not None:
            self._mtimes[path] = (res.info.version, attr.st_mtime_ns)
        return self._attrs(res)

    # -- directories ------------------------------------------------------------

    @fuse_errors
    async def opendir(self, inode, ctx):
        res = await self.resolve(self._path(inode))
        if not res.target.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        entries = await self._list_dir(res)
        fh = self._next_fh
        self._next_fh += 1
        self._dir_handles[fh] = entries
        return fh

    async def _list_dir(self, res: Resolved) -> list[tuple[str, pyfuse3.EntryAttributes]]:
        t = res.target
        prefix = t.name
        out: dict[str, pyfuse3.EntryAttributes] = {}
        if t.kind == Kind.SHARD_TENSOR_DIR:
            assert res.info is not None
            for i in range(res.info.num_shards):
                p = paths.join(res.path, str(i))
                out[str(i)] = self._attrs(
                    Resolved(p, Target(Kind.SHARD, t.name, index=i), res.info)
                )
            return list(out.items())
        infos = await self._c.list(prefix + "/" if prefix else "")
        for info in infos:
            entry = paths.entry_name(info.name, is_raw(info), prefix)
            if entry is None:
                continue
            if entry.endswith("/"):
                name = entry[:-1]
                if name in paths.RESERVED or t.kind in (Kind.ACCUMULATE_DIR, Kind.WORKER_DIR):
                    continue
                if t.kind == Kind.SHARDS_DIR:
                    continue
                p = paths.join(res.path, name)
                out[name] = self._attrs(Resolved(p, Target(Kind.DIR, paths.join(prefix, name))))
            elif t.kind == Kind.SHARDS_DIR:
                base = info.name.rsplit("/", 1)[-1]
                p = paths.join(res.path, base)
                out[base] = self._attrs(Resolved(p, Target(Kind.SHARD_TENSOR_DIR, info.name), info))
            elif t.kind == Kind.WORKER_DIR:
                continue  # opened by path only: which steps exist is the workers' business
            elif t.kind == Kind.ACCUMULATE_DIR:
                if is_raw(info):
                    continue
                base = info.name.rsplit("/", 1)[-1] + NPY
                p = paths.join(res.path, base)
                out[base] = self._attrs(
                    Resolved(p, Target(Kind.ACCUMULATE, info.name, typed=True), info)
                )
            else:
                p = paths.join(res.path, entry)
                tgt = Target(Kind.TENSOR, info.name, typed=not is_raw(info))
                out[entry] = self._attrs(Resolved(p, tgt, info))
        if t.kind in (Kind.ROOT, Kind.DIR):
            for p, handle in self._pending.items():
                parent, _, base = p.rpartition("/")
                if parent == res.path and base not in out:
                    out[base] = self._attrs(Resolved(p, handle.target))
        return sorted(out.items())

    @fuse_errors
    async def readdir(self, fh, start_id, token):
        entries = self._dir_handles.get(fh, [])
        for i in range(start_id, len(entries)):
            name, attrs = entries[i]
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attrs, i + 1):
                break

    async def releasedir(self, fh):
        self._dir_handles.pop(fh, None)

    @fuse_errors
    async def mkdir(self, parent_inode, name, mode, ctx):
        path = self._child(parent_inode, name)
        t = paths.parse(path)
        if t is None or t.kind != Kind.DIR:
            raise pyfuse3.FUSEError(errno.EPERM)  # inside .shards/.accumulate, or reserved
        try:
            await self.resolve(path)
        except pyfuse3.FUSEError:
            pass
        else:
            raise pyfuse3.FUSEError(errno.EEXIST)
        await self._c.create(paths.join(t.name, DIR_MARKER), (0,), np.uint8, exist_ok=True)
        self._modes[path] = stat.S_IMODE(mode)
        return self._attrs(Resolved(path, t))

    @fuse_errors
    async def rmdir(self, parent_inode, name, ctx):
        path = self._child(parent_inode, name)
        res = await self.resolve(path)
        if res.target.kind != Kind.DIR:
            raise pyfuse3.FUSEError(errno.ENOTDIR if not res.target.is_dir else errno.EPERM)
        # Two records tell: the directory's marker and anything else.
        inside = await self._c.list(res.target.name + "/", limit=2)
        marker = paths.join(res.target.name, DIR_MARKER)
        if any(i.name != marker for i in inside):
            raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        if any(p.startswith(path + "/") for p in self._pending):
            raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        with contextlib.suppress(TensorNotFound):
            await self._c.delete(marker)

    # -- files --------------------------------------------------------------------

    @fuse_errors
    async def unlink(self, parent_inode, name, ctx):
        path = self._child(parent_inode, name)
        res = await self.resolve(path)
        if res.target.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if res.target.kind != Kind.TENSOR:
            raise pyfuse3.FUSEError(errno.EPERM)
        self._pending.pop(path, None)
        for h in self._open_handles(path):
            await self._stop_outflow(h)  # a writer still open stores the file at close
        if res.info is not None:
            await self._quiesce(res.target.name)  # open readers keep what they opened
            await self._c.delete(res.target.name)
        self._forget_content(path)

    def _forget_content(self, path: str) -> None:
        self._open_attrs.pop(path, None)
        self._cached_identity.pop(path, None)
        self._mtimes.pop(path, None)

    async def _open_handle(
        self, path: str, res: Resolved, *, writable: bool, truncate: bool
    ) -> Handle:
        t = res.target
        handle = Handle(path, t, writable, info=res.info)
        if t.kind == Kind.ACCUMULATE:
            if not writable:
                raise pyfuse3.FUSEError(errno.EACCES)
            handle.buf = FileBuffer(pool=self.buffers)
            handle.checks_header = True
            return handle
        if t.kind == Kind.STEP:
            if writable:  # a push: the gradient for this step, written whole
                handle.buf = FileBuffer(pool=self.buffers)
                handle.checks_header = True
                return handle
            # A pull: waits for the step, then is this open's own content.
            info, data = await load(self._c, t, res.info, self.buffers)
            self._step_infos[t.name] = info
            handle.info = info
            handle.snapshot = Snapshot.of(data, info, refs=1)
            return handle
        if writable:
            if truncate or res.info is None:
                # Rewriting a file mostly keeps its size: room for that up front.
                expected = file_size(t, res.info) if res.info is not None else 0
                handle.buf = FileBuffer(capacity=expected, pool=self.buffers)
                handle.redefine = t.kind != Kind.SHARD
                handle.dirty.append((0, 0))
                handle.checks_header = t.typed and t.kind == Kind.TENSOR
            else:
                info, data = await load(self._c, t, res.info, self.buffers, shared=True)
                handle.info = info
                handle.buf = FileBuffer.holding(data, self.buffers)  # loaded for this writer alone
            return handle
        info = res.info if res.info is not None else await self._c.stat(t.name)
        snap = self._snapshots.get(path)
        if snap is None or snap.identity != identity(info):
            snap = Snapshot(identity(info))  # streamed in from open, or the first read
            self._snapshots[path] = snap
        snap.refs += 1
        handle.snapshot = snap
        handle.info = info
        return handle

    def _stream_in(self, snap: Snapshot, target: Target, info: TensorInfo) -> None:
        """Begin streaming ``snap`` in from the daemons (by the mover, into pooled memory)."""
        snap.start(self._n, self._c, target, info, self.mover, self.buffers)

    def _open_handles(self, path: str) -> list[Handle]:
        return [h for h in self._handles.values() if h.path == path]

    def _file_info(self, handle: Handle, flags: int = os.O_RDONLY) -> pyfuse3.FileInfo:
        """Register an open handle and choose how the kernel caches it.

        The page cache is per file, not per open, so it can only serve opens
        that all see the same content. An open whose content differs from
        another open handle's (a newer version, or any writer beside others)
        bypasses the page cache (direct I/O) so every open keeps its own
        snapshot; otherwise the cache is kept while the content is unchanged.
        """
        others = self._open_handles(handle.path)
        ident = identity(handle.info) if handle.snapshot is not None and handle.info else None
        shared = all(
            not handle.writable
            and not o.writable
            and o.snapshot is not None
            and o.info is not None
            and identity(o.info) == ident
            for o in others
        )
        # A step file's content is a pull made for this open alone. An open for
        # writing only cannot be mapped (mmap needs a readable descriptor), so
        # its writes skip the page cache: whole max_write requests, no page copy.
        write_only = (flags & os.O_ACCMODE) == os.O_WRONLY
        direct = self.direct_io or not shared or handle.target.kind == Kind.STEP or write_only
        keep = False
        if direct and others:
            # Do not invalidate: the page cache still serves the other opens.
            keep = True
        elif not direct and ident is not None:
            keep = self._cached_identity.get(handle.path) == ident
            self._cached_identity[handle.path] = ident
        elif not direct:
            self._cached_identity.pop(handle.path, None)  # a writer fills the cache
        handle.cached = not direct
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        return pyfuse3.FileInfo(fh=fh, direct_io=direct, keep_cache=keep)

    @fuse_errors
    async def open(self, inode, flags, ctx):
        await self._settled(self._path(inode))
        path = self._path(inode)  # a rename may have moved it meanwhile
        if path in self._pending:  # a second open of a file being created here
            return self._file_info(self._pending[path], flags)
        res = await self.resolve(path)
        if res.target.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        handle = await self._open_handle(
            path, res, writable=writable, truncate=bool(flags & os.O_TRUNC)
        )
        fi = self._file_info(handle, flags)
        snap = handle.snapshot
        info = handle.info  # set wherever a snapshot is
        if snap is not None and not snap.started and not fi.keep_cache and info is not None:
            # Every read of this open reaches us: fix its content now, at open
            # (close-to-open), not at a first read that may come after an update;
            # reads are answered as the chunks they need arrive. Opens the page
            # cache already serves start only if a read reaches us.
            self._stream_in(snap, handle.target, info)
        return fi

    @fuse_errors
    async def create(self, parent_inode, name, mode, flags, ctx):
        path = self._child(parent_inode, name)
        t = paths.parse(path)
        if t is None:
            raise pyfuse3.FUSEError(errno.EPERM)
        if t.kind in (Kind.ACCUMULATE, Kind.STEP):
            res = await self.resolve(path)  # ENOENT unless the tensor exists
            handle = await self._open_handle(path, res, writable=True, truncate=True)
            return self._file_info(handle, flags), self._attrs(res)
        if t.kind != Kind.DIR:  # .shards entries cannot be created
            raise pyfuse3.FUSEError(errno.EPERM)
        parent = path.rpartition("/")[0]
        above = paths.parse(parent)  # a directory: the parent of a DIR path ('' the root)
        assert above is not None
        if not await self._dir_exists(above.name):
            raise pyfuse3.FUSEError(errno.ENOENT)
        target = paths.file_candidates(path)[0]  # .npy: typed; anything else: raw bytes
        handle = Handle(
            path,
            target,
            True,
            buf=FileBuffer(pool=self.buffers),
            redefine=True,
            checks_header=target.typed,
        )
        self._pending[path] = handle
        self._modes[path] = stat.S_IMODE(mode)
        self._forget_content(path)
        return self._file_info(handle, flags), self._attrs(Resolved(path, target))

    @fuse_errors
    async def read(self, fh, off, size):
        handle = self._handle(fh)
        snap = handle.snapshot
        if snap is not None:
            if not snap.started:
                # The page cache was to serve this open and lost pages: the
                # version now, whole (if it changed since the open: the newer).
                info = await self._c.stat(handle.target.name)
                self._stream_in(snap, handle.target, info)
            await snap.wait(off, size)
        return handle.read(off, size)

    @fuse_errors
    async def write(self, fh, off, buf):
        handle = self._handle(fh)
        if not handle.writable:
            raise pyfuse3.FUSEError(errno.EBADF)
        n = handle.write(off, buf)
        if not handle.planned:
            plan_outflow(handle, self._c.config.shard_size)
        if handle.outflow is not None and handle.buf is not None:
            # Complete shards behind the writer go now, not all at close (after
            # the snapshots of the old content streaming in, as for any push).
            if handle.outflow.sent == 0:
                await self._quiesce(handle.target.name)
            await handle.outflow.advance(
                self._n, self._c, handle.buf.array, handle.written_to, self.mover
            )
        return n

    def _handle(self, fh: int) -> Handle:
        try:
            return self._handles[fh]
        except KeyError:
            raise pyfuse3.FUSEError(errno.EBADF) from None

    async def _push(self, handle: Handle) -> None:
        if not handle.is_dirty:
            return
        await self._quiesce(handle.target.name)
        await push(self._c, handle)
        self._pending.pop(handle.path, None)
        self._forget_content(handle.path)

    @fuse_errors
    async def flush(self, fh):
        await self._push(self._handle(fh))

    @fuse_errors
    async def fsync(self, fh, datasync):
        await self._push(self._handle(fh))

    async def release(self, fh):
        handle = self._handles.pop(fh, None)
        if handle is None:
            return
        self._open_attrs.pop(handle.path, None)
        if handle.path in self._orphans and not self._open_handles(handle.path):
            del self._orphans[handle.path]
        if handle.snapshot is not None:
            handle.snapshot.refs -= 1
            if handle.snapshot.refs == 0 and self._snapshots.get(handle.path) is handle.snapshot:
                del self._snapshots[handle.path]
        if handle.is_dirty and handle not in self._handles.values():
            try:
                await self._push(handle)
            except Exception as exc:  # release cannot report errors; flush already did
                log.error("dropping unsaved writes to %s: %s", handle.path, exc)
                self._pending.pop(handle.path, None)

    async def flush_all(self) -> None:
        """Push every handle with unsaved writes (before unmounting)."""
        for handle in list(self._handles.values()):
            try:
                await self._push(handle)
            except Exception as exc:
                log.error("could not push %s at unmount: %s", handle.path, exc)

    # -- rename, links ------------------------------------------------------------

    @fuse_errors
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        old = self._child(parent_inode_old, name_old)
        new = self._child(parent_inode_new, name_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        src = await self.resolve(old)
        try:
            dst: Resolved | None = await self.resolve(new)
        except pyfuse3.FUSEError:
            dst = None
        if dst is not None and flags & pyfuse3.RENAME_NOREPLACE:
            raise pyfuse3.FUSEError(errno.EEXIST)
        # Lookups and opens of either name wait until the rename is done, so
        # this mount's readers see the target's old content or the new, whole.
        done = trio.Event()
        self._renaming[old] = self._renaming[new] = done
        try:
            if src.target.kind == Kind.DIR:
                await self._rename_dir(src, new, dst)
            elif src.target.kind == Kind.TENSOR:
                if dst is not None and dst.target.is_dir:
                    raise pyfuse3.FUSEError(errno.EISDIR)
                await self._rename_file(src, new, dst)
            else:
                raise pyfuse3.FUSEError(errno.EPERM)
            self._move_inodes(old, new)
        finally:
            del self._renaming[old], self._renaming[new]
            done.set()

    async def _settled(self, path: str) -> None:
        """Wait while ``path`` is the source or target of a rename in progress."""
        while (event := self._renaming.get(path)) is not None:
            await event.wait()

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
            raise pyfuse3.FUSEError(errno.EPERM)
        target = paths.file_candidates(new)[0]
        if dst is not None:
            await self._orphan(dst)
        writer = self._pending.get(src.path) or self._writer(src.path)
        stored = src.info is not None or (
            writer is not None and writer.outflow is not None and not writer.outflow.define
        )
        if stored and target.typed == src.target.typed:
            if writer is not None:
                await self._push(writer)  # the rest of its data, to the name it has now
            await self._quiesce(src.target.name)  # this mount's readers have it whole
            info: TensorInfo | None = await self._c.rename(
                src.target.name, target.name, replace=True
            )
        else:
            info = await self._store_as(src, target, writer, stored)
        if writer is not None:
            writer.dirty.clear()
            writer.redefine = False
            writer.info = info
            self._pending.pop(src.path, None)
        for h in self._open_handles(src.path):
            h.path, h.target = new, target
            if h is not writer and h.writable:
                h.info = info
        snap = self._snapshots.pop(src.path, None)
        if snap is not None:
            snap.target_name = target.name
            self._snapshots[new] = snap
        self._forget_content(src.path)
        self._forget_content(new)

    async def _store_as(
        self, src: Resolved, target: Target, writer: Handle | None, stored: bool
    ) -> TensorInfo | None:
        """Store the file's bytes under ``target`` and drop the old name (a rename the
        daemons cannot do by name alone); the new tensor's info."""
        if writer is not None:
            assert writer.buf is not None
            data = writer.buf
            # Its background pushes went to the old name: done with them (the
            # whole file goes to the new name), and the old name is deleted.
            stored = await self._stop_outflow(writer) or stored
        else:
            _, loaded = await load(self._c, src.target, src.info, self.buffers, shared=True)
            data = FileBuffer.holding(loaded, self.buffers)
        moved = Handle(src.path, target, True, buf=data, redefine=True)
        await push(self._c, moved)
        if stored and target.name != src.target.name:
            await self._quiesce(src.target.name)
            with contextlib.suppress(TensorNotFound):
                await self._c.delete(src.target.name)
        return moved.info

    async def _stop_outflow(self, handle: Handle) -> bool:
        """End a writer's background pushes (their errors no longer matter: the
        caller pushes the whole file); whether they stored anything."""
        flow, handle.outflow = handle.outflow, None
        if flow is None:
            return False
        handle.redefine = True  # what they left is not known: the whole file goes
        with contextlib.suppress(Exception):
            await flow.drain()
        return not flow.define  # the tensor was defined under the old name

    async def _orphan(self, dst: Resolved) -> None:
        """Keep the file a rename replaces for the handles open on it, as a local
        filesystem keeps an unlinked file: readers go on reading the old content
        (loaded now if they have read nothing yet) at its old size, and writers
        write to a file that no longer has a name, so their data never comes back.

        The handles and the inode move to a path no lookup can produce, whose
        attributes are frozen as they were (the kernel asks for them before
        reads, and keeps one size per inode).
        """
        replaced = self._open_handles(dst.path)
        if not replaced:
            return
        for h in replaced:
            if h.snapshot is not None and not h.snapshot.started and h.info is not None:
                self._stream_in(h.snapshot, h.target, h.info)
        await self._quiesce(dst.target.name)
        orphan = f"{dst.path}\0replaced-{self._next_fh}"
        self._next_fh += 1
        self._orphans[orphan] = self._attrs(dst)
        ino = self._inos.get(dst.path)
        if ino is not None:
            self._paths[ino] = orphan
        for h in replaced:
            h.path = orphan
            h.detached = h.writable
        self._snapshots.pop(dst.path, None)

    async def _rename_dir(self, src: Resolved, new: str, dst: Resolved | None) -> None:
        t = paths.parse(new)
        if t is None or t.kind != Kind.DIR:
            raise pyfuse3.FUSEError(errno.EPERM)
        if dst is not None:
            if not dst.target.is_dir:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            marker = paths.join(dst.target.name, DIR_MARKER)
            if any(i.name != marker for i in await self._c.list(dst.target.name + "/", limit=2)):
                raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        if (new + "/").startswith(src.path + "/"):
            raise pyfuse3.FUSEError(errno.EINVAL)  # into itself
        inside = [h for h in self._handles.values() if h.path.startswith(src.path + "/")]
        for h in [*inside, *self._pending.values()]:
            if h.path.startswith(src.path + "/"):
                await self._push(h)  # what is written inside moves with the directory
        old_prefix = src.target.name + "/"
        for info in await self._c.list(old_prefix):
            name = t.name + "/" + info.name[len(old_prefix) :]
            await self._quiesce(info.name)  # this mount's readers have it whole
            await self._c.rename(info.name, name, replace=True)
        for h in inside:
            h.path = new + h.path[len(src.path) :]
            h.target = paths.moved_target(h.target, h.path)

    def _move_inodes(self, old: str, new: str) -> None:
        for path in [p for p in self._inos if p == old or p.startswith(old + "/")]:
            ino = self._inos.pop(path)
            moved = new + path[len(old) :]
            # The replaced file's inode keeps a path (an open of it racing with
            # the rename then gets the new content, not ENOENT).
            self._inos[moved] = ino
            self._paths[ino] = moved
            if path in self._modes:
                self._modes[moved] = self._modes.pop(path)

    async def symlink(self, parent_inode, name, target, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)  # not supported: POSIX says EPERM

    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        raise pyfuse3.FUSEError(errno.EPERM)

    async def readlink(self, inode, ctx):
        raise pyfuse3.FUSEError(errno.EINVAL)

    # -- extended attributes and statfs -------------------------------------------

    async def _xattrs(self, inode: int) -> dict[str, bytes]:
        res = await self.resolve(self._path(inode))
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
            config = self._c.config
            replicas = config.replicas_for(info.meta.key, res.target.index)
            out["replicas"] = ",".join(n.name for n in replicas)
            out["primary"] = replicas[0].name
        return {XATTR_PREFIX + k: v.encode() for k, v in out.items()}

    @fuse_errors
    async def getxattr(self, inode, name, ctx):
        name = os.fsdecode(name)
        if not name.startswith(XATTR_PREFIX):
            # The kernel asks for security.capability before every write to
            # a file (to clear it): answered here, not by asking the daemons.
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        value = (await self._xattrs(inode)).get(name)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @fuse_errors
    async def listxattr(self, inode, ctx):
        return [os.fsencode(k) for k in await self._xattrs(inode)]

    @fuse_errors
    async def setxattr(self, inode, name, value, ctx):
        if os.fsdecode(name).startswith(XATTR_PREFIX):
            raise pyfuse3.FUSEError(errno.EPERM)  # computed, read-only
        raise pyfuse3.FUSEError(errno.ENOTSUP)

    @fuse_errors
    async def removexattr(self, inode, name, ctx):
        if os.fsdecode(name).startswith(XATTR_PREFIX):
            raise pyfuse3.FUSEError(errno.EPERM)
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    @fuse_errors
    async def statfs(self, ctx):
        total = used = 0

        async def one(node) -> None:
            nonlocal total, used
            try:
                hello = await self._c.hello(node)
            except IrdmaError as exc:
                log.error("statfs: %s", exc)
                return
            total += hello["arena_size"]
            used += hello["arena_used"]

        async with trio.open_nursery() as nursery:
            for node in self._c.config.nodes:
                nursery.start_soon(one, node)
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = total // 4096
        s.f_bfree = s.f_bavail = (total - used) // 4096
        s.f_files = s.f_ffree = s.f_favail = 1 << 20
        s.f_namemax = 255
        return s


async def _all_at_once(calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Each call's result, the calls run together; the first one's error is raised as
    it is (not in an exception group) once all have ended, so none is cut short.

    (The client's gathers cancel the others at the first error, and a cancelled
    request drops a connection the client's other calls share; the mount may
    not import them either: ``tests/test_layering.py``.)
    """
    results: list[Any] = [None] * len(calls)
    errors: list[Exception | None] = [None] * len(calls)

    async def run(i: int) -> None:
        try:
            results[i] = await calls[i]()
        except Exception as exc:
            errors[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(len(calls)):
            nursery.start_soon(run, i)
    for exc in errors:
        if exc is not None:
            raise exc
    return results
