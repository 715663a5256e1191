"""The mount's open things: file handles, files created here and not yet
pushed, directory handles, and readers' shared snapshots. Tables only, no I/O.

Which opens the kernel page cache may serve is decided here, when a handle
is registered (``register``): the page cache is per file, not per open, so it
can only serve opens that all see the same content. And only while the mount
still holds that content (the snapshot whose reads filled the cache, held by
the open): the kernel drops a file's cached pages whenever it learns that the
file changed (a getattr or lookup showing a new mtime, auto_inval_data), and
the reads of an open it was serving then reach the mount, which must answer
them from the version the open saw, never the newer one. A snapshot no open
holds is kept for the next open of its version, within ``keep_limit`` bytes,
least recently used first.
"""

from __future__ import annotations

import errno
import os
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from irdma import TensorInfo

from .content import identity
from .errors import FsError
from .files import Handle
from .paths import Kind
from .snapshot import Snapshot

E = TypeVar("E")


@dataclass(frozen=True)
class Opened:
    """A registered open, as the kernel is told: its number and how it caches."""

    fh: int
    direct_io: bool
    keep_cache: bool


class OpenFiles(Generic[E]):
    """Open handles by number and by path; ``E`` is a directory listing's entry."""

    def __init__(self, *, direct_io: bool = False, keep_limit: int = 0) -> None:
        self.direct_io = direct_io  # every open bypasses the page cache
        # Bytes of snapshots no open holds, kept so the page cache can serve the next
        # open of their version (``--backing-memory``).
        self.keep_limit = keep_limit
        self._handles: dict[int, Handle] = {}
        self._next_fh = 1
        self._pending: dict[str, Handle] = {}  # created, not yet pushed
        self._dir_handles: dict[int, list[tuple[str, E]]] = {}
        self._snapshots: dict[str, Snapshot] = {}  # readers' content, one per path
        # Those no open holds, oldest first (each also in ``_snapshots``), and their bytes.
        self._kept: OrderedDict[str, Snapshot] = OrderedDict()
        self._kept_bytes = 0
        # The snapshot whose reads filled the kernel page cache of a path.
        self._cache_source: dict[str, Snapshot] = {}

    # -- file handles -----------------------------------------------------------

    def get(self, fh: int) -> Handle:
        """The handle open as ``fh``; EBADF if none."""
        try:
            return self._handles[fh]
        except KeyError:
            raise FsError(errno.EBADF) from None

    def find(self, fh: int | None) -> Handle | None:
        return self._handles.get(fh) if fh is not None else None

    def all(self) -> list[Handle]:
        """Every open handle (one registered twice appears twice)."""
        return list(self._handles.values())

    def on(self, path: str) -> list[Handle]:
        """The handles open on ``path``."""
        return [h for h in self._handles.values() if h.path == path]

    def under(self, path: str) -> list[Handle]:
        """The handles open on files inside directory ``path``."""
        return [h for h in self._handles.values() if h.path.startswith(path + "/")]

    def is_open(self, handle: Handle) -> bool:
        """Whether ``handle`` is still registered (under any number)."""
        return handle in self._handles.values()

    def writer(self, path: str) -> Handle | None:
        """What holds ``path``'s content here: the file being created, or an open
        handle with unsaved writes; None if the daemons hold it."""
        pending = self._pending.get(path)
        if pending is not None:
            return pending
        for h in self._handles.values():
            if h.path == path and h.writable and h.is_dirty:
                return h
        return None

    def only_readers(self, path: str) -> bool:
        """Whether ``path`` is open, and only for reading."""
        handles = self.on(path)
        return bool(handles) and not any(h.writable for h in handles)

    def register(self, handle: Handle, flags: int = os.O_RDONLY) -> Opened:
        """Register an open handle and choose how the kernel caches it.

        An open whose content differs from another open handle's (a newer
        version, or any writer beside others) bypasses the page cache (direct
        I/O) so every open keeps its own snapshot; otherwise the cache is kept
        while the content is unchanged.
        """
        others = self.on(handle.path)
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
            # The cache is kept only for the snapshot that filled it, which this
            # open now holds: the pages the kernel drops are read again from it.
            keep = self._cache_source.get(handle.path) is handle.snapshot
            assert handle.snapshot is not None
            self._cache_source[handle.path] = handle.snapshot
        elif not direct:
            self._cache_source.pop(handle.path, None)  # a writer fills the cache
        handle.cached = not direct
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        return Opened(fh, direct, keep)

    def close(self, fh: int) -> Handle | None:
        """Unregister ``fh``; its handle (None if it was not open). A snapshot no
        handle holds any more is dropped."""
        handle = self._handles.pop(fh, None)
        if handle is None:
            return None
        snap = handle.snapshot
        if snap is not None:
            snap.refs -= 1
            if snap.refs == 0 and self._snapshots.get(handle.path) is snap:
                if snap.whole and self._cache_source.get(handle.path) is snap:
                    self._keep(handle.path, snap)
                else:
                    del self._snapshots[handle.path]
        return handle

    def _keep(self, path: str, snap: Snapshot) -> None:
        """Keep a snapshot no open holds for the next open of its version, within
        ``keep_limit`` (the least recently used go first)."""
        self._kept[path] = snap
        self._kept_bytes += snap.nbytes
        while self._kept and self._kept_bytes > self.keep_limit:
            old_path, old = self._kept.popitem(last=False)
            self._kept_bytes -= old.nbytes
            self._let_go(old_path, old)

    @property
    def kept_bytes(self) -> int:
        """Bytes of the snapshots kept while no open holds them."""
        return self._kept_bytes

    def _unkeep(self, path: str) -> Snapshot | None:
        """Take ``path``'s kept snapshot off the kept list (held again, or dropped)."""
        kept = self._kept.pop(path, None)
        if kept is not None:
            self._kept_bytes -= kept.nbytes
        return kept

    def _let_go(self, path: str, snap: Snapshot) -> None:
        """``snap`` is no longer kept: the next open of ``path`` reads afresh."""
        if self._snapshots.get(path) is snap:
            del self._snapshots[path]
        if self._cache_source.get(path) is snap:
            del self._cache_source[path]

    # -- files created here, not yet pushed -----------------------------------

    def pending(self, path: str) -> Handle | None:
        return self._pending.get(path)

    def add_pending(self, handle: Handle) -> None:
        self._pending[handle.path] = handle

    def drop_pending(self, path: str) -> None:
        self._pending.pop(path, None)

    def pending_handles(self) -> list[Handle]:
        return list(self._pending.values())

    def pending_in(self, directory: str) -> Iterable[tuple[str, Handle]]:
        """(path, handle) of the files being created directly in ``directory``."""
        for p, handle in self._pending.items():
            if p.rpartition("/")[0] == directory:
                yield p, handle

    def pending_under(self, directory: str) -> bool:
        """Whether a file is being created anywhere inside ``directory``."""
        return any(p.startswith(directory + "/") for p in self._pending)

    # -- readers' snapshots -----------------------------------------------------

    def snapshot_for(self, path: str, info: TensorInfo) -> Snapshot:
        """The snapshot a new reader of ``path`` shares (a new one if the content
        changed), counted as held by one more reader."""
        snap = self._snapshots.get(path)
        kept = self._unkeep(path)
        if snap is None or snap.identity != identity(info):
            if kept is not None:
                self._let_go(path, kept)
            snap = Snapshot(identity(info))  # streamed in from open
            self._snapshots[path] = snap
        snap.refs += 1
        return snap

    def move_snapshot(self, old: str, new: str, target_name: str) -> None:
        """``old``'s shared snapshot is now ``new``'s, of tensor ``target_name``."""
        snap = self._snapshots.pop(old, None)
        kept = self._unkeep(old)
        self._cache_source.pop(old, None)
        if snap is not None and kept is None:
            snap.target_name = target_name
            self._snapshots[new] = snap

    def drop_snapshot(self, path: str) -> None:
        """New readers of ``path`` get a snapshot of their own."""
        self._snapshots.pop(path, None)
        self._unkeep(path)

    async def quiesce(self, name: str) -> None:
        """Wait until snapshots of tensor ``name`` streaming in are complete, so a
        change made through this mount never mixes into one."""
        snaps = {id(h.snapshot): h.snapshot for h in self._handles.values() if h.snapshot}
        for snap in [*snaps.values(), *self._snapshots.values()]:
            if snap.target_name == name:
                await snap.wait_filled()

    def forget(self, path: str) -> None:
        """``path``'s content changed: what the page cache holds of it is stale."""
        self._cache_source.pop(path, None)
        kept = self._unkeep(path)
        if kept is not None:
            self._let_go(path, kept)

    # -- directory handles -------------------------------------------------------

    def open_dir(self, entries: list[tuple[str, E]]) -> int:
        """Keep a directory's listing for the reads of one opendir; its number."""
        fh = self._next_fh
        self._next_fh += 1
        self._dir_handles[fh] = entries
        return fh

    def dir_entries(self, fh: int) -> list[tuple[str, E]]:
        return self._dir_handles.get(fh, [])

    def close_dir(self, fh: int) -> None:
        self._dir_handles.pop(fh, None)
