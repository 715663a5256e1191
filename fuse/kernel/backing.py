"""Files held whole in backing files, for the kernel to read and write directly
(passthrough). The files are made by ``tmpfs.BackingFiles`` (a private
huge-page tmpfs as root, else memfds).

Readers (``Backings``): a file opened for reading is loaded once, whole, into a
backing file: one version, read as a whole-tensor read is
(``AsyncClient.read_bytes`` of every byte: all shards from one write), again
if the daemons no longer hold the write it began with (``TornRead``) or the
layout changed meanwhile, so an open never fails because a writer is fast.
The opens of one unchanged version share it (``Snapshot.refs`` counts them).
The session registers it with the kernel (a backing id) while an open holds
it and drops the id when none does; the file itself is kept for the next
open of that version, within ``limit`` bytes, the least recently used going
first and never one held. Where the kernel does not read it directly, the
session answers READ from the same memory (``Snapshot.of``).

Writers (``WrittenFile``): a new raw file opened for writing only is written
by the kernel into a backing file of its own, pushed at fsync and close. A
writer's file of ``REUSE_MIN`` bytes or more is kept after its last close,
emptied with its memory still allocated (``BackingFiles.emptied``), for the
next writer (``Backings.writer_file``), within the same ``limit``.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import trio

from irdma import AsyncClient, TensorInfo, TornRead

from ..content import extent, identity
from ..files import FileBuffer
from ..paths import Target
from ..snapshot import Snapshot
from .tmpfs import BackingFiles

log = logging.getLogger("irdma.fuse")

MEMFD_NAME_MAX = 249  # memfd_create(2): NAME_MAX less its "memfd:" prefix
LOAD_TRIES = 8  # reads of a file that keeps changing layout before giving up
DEFAULT_LIMIT = 4 << 30  # bytes of unheld backing files kept for later opens
# Smaller files are made new for each load: their fresh pages cost little, and
# the check that nothing maps a kept one reads every process's maps.
REUSE_MIN = 16 << 20


@dataclass(eq=False)
class Backing:
    """One version of one file, whole, in a backing file."""

    key: tuple
    fd: int
    memory: mmap.mmap | None  # None: an empty file
    snapshot: Snapshot  # refs: the opens holding it
    info: TensorInfo
    size: int
    backing_id: int = 0  # registered with the kernel (0: not now)
    # Registered once: a reader may have mapped it (a passthrough map is a map of
    # this file, and outlives the open).
    exposed: bool = False

    def close(self) -> None:
        self.snapshot.data = None  # the array viewing the map goes before the map
        _discard(self.memory, self.fd)


def _key(target: Target, info: TensorInfo) -> tuple:
    return (target.name, target.typed, identity(info))


class Backings:
    """The backing files of readers' files, by version; ``unregister`` drops a
    backing id."""

    def __init__(
        self,
        client: Callable[[], AsyncClient],
        limit: int = DEFAULT_LIMIT,
        files: BackingFiles | None = None,
    ) -> None:
        self._client = client
        self.limit = limit
        # Where the files are made (memfds unless the session's own tmpfs is given).
        self.files = files if files is not None else BackingFiles(private_tmpfs=False)
        self._entries: OrderedDict[tuple, Backing] = OrderedDict()  # oldest use first
        self._by_snapshot: dict[int, Backing] = {}
        self._loading: dict[tuple, trio.Event] = {}
        # Writers' files kept for the next writer, emptied: (descriptor, bytes of
        # memory kept), the most recently kept last.
        self._spares: list[tuple[int, int]] = []
        self.unregister: Callable[[int], None] | None = None

    @property
    def used(self) -> int:
        readers = sum(b.size for b in self._entries.values())
        return readers + sum(size for _, size in self._spares)

    def writer_file(self, name: str) -> int:
        """A descriptor of an empty file for a writer's new content: the writer's
        file kept last (its memory allocated: ``writer_closed``), else a new
        one (``name``: a memfd's name)."""
        if self._spares:
            return self._spares.pop()[0]
        return self.files.new(name)

    def writer_closed(self, fd: int, exposed: bool) -> None:
        """A writer's file, pushed and closed for good: kept for the next writer if
        it is large, else closed. ``exposed``: an open other than the writer's
        shared it, and may have mapped it (then kept only if nothing maps it:
        with no open left, no new map can be made)."""
        size = os.fstat(fd).st_blocks * 512
        if size < REUSE_MIN or (exposed and mapped_elsewhere(fd)):
            os.close(fd)
            return
        kept = self.files.emptied(fd)
        if not kept:
            os.close(fd)
            return
        self._spares.append((fd, kept))
        self._trim()

    def __len__(self) -> int:
        return len(self._entries)

    async def take(
        self, path: str, target: Target, info: TensorInfo
    ) -> tuple[TensorInfo, Snapshot]:
        """The whole file ``target`` of ``info``'s version (or, if it changed while
        loading, the version loaded), held by one more open."""
        key = _key(target, info)
        while (b := self._entries.get(key)) is None and key in self._loading:
            await self._loading[key].wait()  # another open is loading this version
        if b is None:
            done = self._loading[key] = trio.Event()
            try:
                b = await self._load(target, info)
            finally:
                del self._loading[key]
                done.set()
            old = self._entries.pop(b.key, None)
            if old is not None and old.snapshot.refs == 0:
                self._drop(old)
            self._entries[b.key] = b
            self._by_snapshot[id(b.snapshot)] = b
        self._entries.move_to_end(b.key)
        b.snapshot.refs += 1
        self._trim()
        return b.info, b.snapshot

    def of(self, snapshot: Snapshot | None) -> Backing | None:
        """The backing file behind ``snapshot`` (None: not one of these)."""
        return self._by_snapshot.get(id(snapshot)) if snapshot is not None else None

    def released(self, snapshot: Snapshot | None) -> None:
        """An open of ``snapshot`` was closed (its refs already counted down): a
        version no open holds loses its backing id, and may go to keep the limit."""
        b = self.of(snapshot)
        if b is None or b.snapshot.refs > 0:
            return
        if b.backing_id:
            b.exposed = True
            if self.unregister is not None:
                self.unregister(b.backing_id)
        b.backing_id = 0
        if self._entries.get(b.key) is not b:  # replaced by a newer load of its key
            self._drop(b)
        self._trim()

    def close(self) -> None:
        """Drop every backing file (the session is over)."""
        for b in list(self._entries.values()):
            self._drop(b)
        self._entries.clear()
        for fd, _ in self._spares:
            os.close(fd)
        self._spares.clear()

    def _trim(self) -> None:
        while self._spares and self.used > self.limit:  # the longest kept first
            os.close(self._spares.pop(0)[0])
        for b in list(self._entries.values()):  # least recently used first
            if self.used <= self.limit:
                return
            if b.snapshot.refs == 0:
                del self._entries[b.key]
                self._drop(b)

    def _drop(self, b: Backing) -> None:
        self._by_snapshot.pop(id(b.snapshot), None)
        b.close()

    def _reusable(self, size: int) -> int:
        """The descriptor of a kept file no open holds, of ``size`` bytes up to twice
        that, that nothing maps any more, taken out of the cache for a new load; -1
        if none. Its pages are allocated already: fresh pages cost more than the
        copy into them (the kernel zeroes each one; in a VM whose balloon reports
        free memory, the host faults it in again)."""
        if size < REUSE_MIN:
            return -1
        for b in list(self._entries.values()):  # least recently used first
            if b.snapshot.refs or b.backing_id or not size <= b.size <= 2 * size:
                continue
            if b.exposed and mapped_elsewhere(b.fd):
                continue  # a reader's map still shows this version: never rewritten
            del self._entries[b.key]
            self._by_snapshot.pop(id(b.snapshot), None)
            b.snapshot.data = None
            if b.memory is not None:
                _closed(b.memory)  # a view still held keeps the old map until freed
            return b.fd
        return -1

    async def _load(self, target: Target, info: TensorInfo) -> Backing:
        c = self._client()
        for _ in range(LOAD_TRIES):
            header, start, length = extent(target, info)
            size = len(header) + length
            fd = self._reusable(size)
            if fd < 0:
                fd = self.files.new(memfd_name(target.name))
            memory: mmap.mmap | None = None
            kept = False
            try:
                os.ftruncate(fd, size)
                if size:
                    memory = mmap.mmap(fd, size)
                    data = np.frombuffer(memory, dtype=np.uint8)
                else:  # mmap refuses length 0: an empty file has nothing to map
                    data = np.empty(0, dtype=np.uint8)
                data[: len(header)] = np.frombuffer(header, dtype=np.uint8)
                if length:  # an empty tensor has no bytes to ask for
                    await c.read_bytes(target.name, start, length, out=data[len(header) :])
                after = await c.stat(target.name)
                if (after.ctime, after.dtype, after.shape) == (info.ctime, info.dtype, info.shape):
                    snap = Snapshot.of(data, info)
                    kept = True
                    return Backing(_key(target, info), fd, memory, snap, info, size)
                # Redefined meanwhile: the header would not describe the bytes.
                info = after
            except TornRead as exc:
                # The write the read began with is gone (rewritten twice meanwhile):
                # the tensor as it is now, read again.
                log.info("%s: %s; reading it again", target.name, exc)
                info = await c.stat(target.name)
            finally:
                if not kept:
                    _discard(memory, fd)
        raise TornRead(f"{target.name} changed layout {LOAD_TRIES} times while it was read")


def mapped_elsewhere(fd: int) -> bool:
    """Whether a process other than this one maps the file ``fd`` (its device and
    inode in some /proc/PID/maps). A released backing file can gain no new map
    (no open can reach it), so a file none maps now never will again. Processes
    in other PID namespaces than the mount's are not seen."""
    st = os.fstat(fd)
    needle = f" {os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino} "
    me = str(os.getpid())
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit() or entry.name == me:
                continue
            try:
                with open(f"/proc/{entry.name}/maps") as f:
                    if needle in f.read():
                        return True
            except OSError:  # gone meanwhile
                continue
    return False


def memfd_name(tensor: str) -> str:
    """A backing file's name (shown in /proc only): the tensor's, cut to what
    memfd_create(2) takes (249 bytes), on a character boundary."""
    raw = f"irdma:{tensor}".encode()[:MEMFD_NAME_MAX]
    return raw.decode(errors="ignore")


def _closed(m: mmap.mmap) -> bool:
    """Close ``m`` unless a view of it is still held; whether it was closed."""
    try:
        m.close()
    except BufferError:
        return False
    return True


def _discard(memory: mmap.mmap | None, fd: int) -> None:
    """Unmap and close a backing file; a view of it still held elsewhere (a reply
    being written, an exception's frames) keeps the map until it is freed."""
    if memory is not None:
        _closed(memory)
    os.close(fd)


class WrittenFile(FileBuffer):
    """A writer's file in a backing file the kernel writes itself (passthrough).

    No WRITE reaches the session, so what the file holds is read from the
    backing file when it is pushed: its length from ``fstat``, its bytes
    through a map made then. Whether the kernel wrote since the last look is
    its change time (``written_outside``): tmpfs gives a write after a
    ``stat`` a newer change time (multigrain timestamps, Linux 6.13), so no
    write is missed however soon it follows. Requests that do reach the
    session (a truncate, a write through an open that is not passthrough)
    go to the file too.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._pool = None
        self.backing_id = 0  # registered with the kernel (0: not now)
        self.exposed = False  # an open other than the writer's used it (it may map it)
        # Maps of the file at the sizes it had; one a view still holds stays open.
        self._maps: list[mmap.mmap] = []
        self._a = np.empty(0, dtype=np.uint8)
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int]:
        st = os.fstat(self.fd)
        return st.st_ctime_ns, st.st_size

    def written_outside(self) -> bool:
        stamp = self._stamp()
        changed, self._seen = stamp != self._seen, stamp
        return changed

    @property
    def length(self) -> int:
        return os.fstat(self.fd).st_size

    @length.setter
    def length(self, value: int) -> None:
        os.ftruncate(self.fd, value)

    def __len__(self) -> int:
        return self.length

    def _reserve(self, size: int) -> None:
        pass  # the file grows as it is written

    def landing(self, off: int, size: int) -> memoryview | None:
        return None  # the kernel writes the file itself

    @property
    def array(self) -> np.ndarray:
        size = self.length
        if len(self._a) != size:
            self._a = np.empty(0, dtype=np.uint8)
            self._maps = [m for m in self._maps if not _closed(m)]  # those no view holds go
            if size:
                self._maps.append(mmap.mmap(self.fd, size))
                self._a = np.frombuffer(self._maps[-1], dtype=np.uint8)
        return self._a

    def write(self, off: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, off)
            view, off = view[n:], off + n

    def resize(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def read(self, off: int, size: int) -> memoryview:
        return self.array[off : off + size].data

    def view(self) -> memoryview:
        return self.array.data

    def release(self) -> int:
        """Unmap the file (a view still held keeps its map until freed); its
        descriptor, which the caller now owns."""
        self._a = np.empty(0, dtype=np.uint8)
        for m in self._maps:
            _closed(m)  # one a view still holds goes when the view does
        self._maps.clear()
        fd, self.fd = self.fd, -1
        return fd
