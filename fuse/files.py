"""Open files: buffers for writers and pushing them, and whole consistent loads.

Writers get their own buffer (a writer that does not truncate starts from a
consistent copy: ``load`` checks the version before and after, and reads
again if a writer got in between); what they wrote is pushed at
flush/close: only the changed byte ranges when the layout is unchanged,
otherwise the whole file (which may redefine the tensor). Readers share a
``snapshot.Snapshot`` per version, streamed in as it is read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from irdma import AsyncClient, TensorInfo
from irdma.errors import DtypeMismatch, OutOfRange, ShapeMismatch, StaleLayout, TensorNotFound

from .buffers import BufferPool
from .content import file_buffer, file_size, identity, is_raw, take
from .npyfile import BadNpy, NpyLayout, check_start, header_for, parse_header, parse_npy
from .outflow import Outflow, merged
from .paths import RAW_OPTION, Kind, Target

if TYPE_CHECKING:
    from .snapshot import Snapshot

log = logging.getLogger("irdma.fuse")

SNAPSHOT_RETRIES = 8
# Writes that reach into the first bytes of a .npy file have its header checked
# at once; numpy's headers are 128 bytes for ordinary shapes, a few KiB at most.
HEADER_CHECK_LIMIT = 1 << 16
GROW_MIN = 16 << 20


async def load(
    client: AsyncClient,
    target: Target,
    known: TensorInfo | None = None,
    pool: BufferPool | None = None,
    shared: bool = False,
) -> tuple[TensorInfo, np.ndarray]:
    """A consistent copy of a file's bytes: every byte from the same tensor version.

    ``known`` is a stat the caller just made; it stands for the first "before"
    reading instead of asking the daemons again. The memory comes from ``pool``
    if given (from its shared memory with ``shared``: a writer's copy).
    """
    if target.kind == Kind.STEP:
        return await _pull(client, target, known, pool)
    for _ in range(SNAPSHOT_RETRIES):
        info = known if known is not None else await client.stat(target.name)
        known = None
        data, body, start = file_buffer(target, info, pool, shared)
        await client.read_bytes(target.name, start, len(body), out=body)
        after = await client.stat(target.name)
        if identity(after) == identity(info):
            return info, data
    log.warning("%s changes faster than it can be read; serving the last copy", target.name)
    return info, data


async def _pull(
    client: AsyncClient, target: Target, known: TensorInfo | None, pool: BufferPool | None
) -> tuple[TensorInfo, np.ndarray]:
    """A training worker's pull of a tensor for a step, as a .npy file.

    It waits as the tensor's training mode says; what it returns is the
    mode's guarantee (sync: exactly the step's parameters), not one version.
    """
    info = known if known is not None else await client.stat(target.name)
    try:
        return info, await _pull_as(client, target, info, pool)
    except (ShapeMismatch, DtypeMismatch):  # ``known`` is out of date: redefined since
        info = await client.stat(target.name)
        return info, await _pull_as(client, target, info, pool)


async def _pull_as(
    client: AsyncClient, target: Target, info: TensorInfo, pool: BufferPool | None
) -> np.ndarray:
    data, body, _ = file_buffer(target, info, pool)
    out = body.view(info.meta.np_dtype).reshape(info.shape)
    await client.read(target.name, out, worker=target.worker, step=target.step)
    return data


class FileBuffer:
    """A writer's copy of a file: bytes that grow four-fold.

    (A bytearray grown write by write reallocates and copies: 84 us per
    128 KiB write here, against 18 us into preallocated memory.)
    """

    def __init__(
        self,
        initial: bytes | bytearray | memoryview | np.ndarray = b"",
        capacity: int = 0,
        pool: BufferPool | None = None,
    ) -> None:
        """``capacity``: the size the file will likely reach (a rewrite of a
        file of that size), so a sequential write never regrows and copies.
        The memory comes from ``pool`` if given."""
        src = np.frombuffer(initial, dtype=np.uint8) if len(initial) else None
        self.length = 0 if src is None else len(src)
        self._pool = pool
        self._a = take(pool, max(self.length, capacity, 1 << 16), shared=True)
        if src is not None:
            self._a[: self.length] = src

    @classmethod
    def holding(cls, data: np.ndarray, pool: BufferPool | None = None) -> FileBuffer:
        """A buffer whose content is ``data`` itself (uint8; not copied: the caller
        gives it up), for a file loaded whole just before."""
        buf = cls.__new__(cls)
        buf._a, buf.length, buf._pool = data, len(data), pool
        return buf

    def __len__(self) -> int:
        return self.length

    def _reserve(self, size: int) -> None:
        if size > len(self._a):
            # Grown 4-fold, to 16 MiB at least: a file of unknown size written
            # sequentially is copied a third of its size in all, not all of it
            # (untouched memory costs nothing until written).
            grown = take(self._pool, max(size, 4 * len(self._a), GROW_MIN), shared=True)
            grown[: self.length] = self._a[: self.length]
            self._a = grown

    def write(self, off: int, data: bytes | memoryview) -> None:
        end = off + len(data)
        self._reserve(end)
        if off > self.length:
            self._a[self.length : off] = 0  # a hole reads as zeros
        src = np.frombuffer(data, dtype=np.uint8)
        if _address(src) != _address(self._a) + off:  # else landed in place (``landing``)
            self._a[off:end] = src
        self.length = max(self.length, end)

    def landing(self, off: int, size: int) -> memoryview | None:
        """Memory where a write of up to ``size`` bytes at ``off`` could be read in
        straight from the kernel (``kernel.landing``), so ``write`` need not copy
        it: the room past the file's end, as far as the buffer reaches. None
        where there is none, or where bytes of the file lie (a request that is
        not that write may be read into it too)."""
        if off < self.length or off >= len(self._a):
            return None
        return self._a[off : off + size].data

    def reserve(self, size: int) -> None:
        """Make room for a file of ``size`` bytes now, so writing it never regrows."""
        self._reserve(size)

    @property
    def array(self) -> np.ndarray:
        """The memory behind the file (it is replaced when the file outgrows it)."""
        return self._a

    @property
    def shared(self) -> bool:
        """Whether the memory is in the mount's shared region (pushed without a copy)."""
        return self._pool is not None and self._pool.holds_shared(self._a)

    def resize(self, size: int) -> None:
        self._reserve(size)
        if size > self.length:
            self._a[self.length : size] = 0
        self.length = size

    def read(self, off: int, size: int) -> memoryview:
        # pyfuse3 copies the reply to the kernel before anything can change
        # the buffer again, so a view is enough.
        return self._a[off : min(off + size, self.length)].data

    def view(self) -> memoryview:
        return self._a[: self.length].data

    def written_outside(self) -> bool:
        """Whether the bytes changed since the last call other than through this
        object (a backing file the kernel writes: ``kernel.backing.WrittenFile``)."""
        return False


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@dataclass(eq=False)
class Handle:
    """One open file."""

    path: str
    target: Target
    writable: bool
    snapshot: Snapshot | None = None  # readers
    buf: FileBuffer | None = None  # writers: the whole file as it will be
    dirty: list[tuple[int, int]] = field(default_factory=list)
    redefine: bool = False  # size changed, truncated or new: push the whole file
    info: TensorInfo | None = None  # the tensor as it was when opened (None: new file)
    cached: bool = False  # served through the kernel page cache (not direct I/O)
    # A new .npy file (created, truncated, an accumulate or a push) has its header
    # checked as it is written, so a bad one fails the write() itself; rewrites
    # of an existing file are checked at close, as they may pass through a bad
    # header on the way to a good one.
    checks_header: bool = False
    header_end: int = 0  # the header's length once checked (0: not yet)
    # The file was replaced by a rename while this writer had it open: like a
    # write to an unlinked file, what it writes is never stored.
    detached: bool = False
    written_to: int = 0  # how far writes cover the file from offset 0 without a gap
    outflow: Outflow | None = None  # pushes complete shards while a writer writes
    planned: bool = False  # whether an outflow was considered (once per writer)

    def read(self, off: int, size: int) -> memoryview:
        """The bytes at ``off``: a view, no copy (pyfuse3 hands it to the kernel at once).

        For a reader, the caller has waited for them (``Snapshot.wait``)."""
        if self.buf is not None:
            return self.buf.read(off, size)
        assert self.snapshot is not None and self.snapshot.data is not None
        return self.snapshot.data[off : off + size].data

    def size(self) -> int:
        if self.buf is not None:
            return len(self.buf)
        if self.snapshot is not None and self.snapshot.data is not None:
            return len(self.snapshot.data)
        return 0

    def write(self, off: int, data: bytes | memoryview) -> int:
        """Take a write into the buffer; BadNpy (EINVAL) leaves the buffer as it was."""
        assert self.buf is not None
        if self.checks_header and self.header_end == 0 and off < HEADER_CHECK_LIMIT:
            self._check_header_after(off, data)
        end = off + len(data)
        if end > len(self.buf):
            self.redefine = True
        self.buf.write(off, data)
        if off <= self.written_to:
            self.written_to = max(self.written_to, end)
        if self.outflow is not None:
            self.outflow.wrote(off, end)
        if self.dirty and self.dirty[-1][1] == off:  # sequential writes: one range
            self.dirty[-1] = (self.dirty[-1][0], end)
        else:
            self.dirty.append((off, end))
        return len(data)

    def _check_header_after(self, off: int, data: bytes | memoryview) -> None:
        """Refuse a write that makes the start of a new .npy file impossible.

        Only the bytes written from offset 0 without a gap count: a write past
        a gap may be followed by the writer filling it, and is judged at close.
        """
        if off > contiguous_end(self.dirty):
            return
        extent = min(contiguous_end([*self.dirty, (off, off + len(data))]), HEADER_CHECK_LIMIT)
        assert self.buf is not None
        start = bytearray(self.buf.view()[:extent])
        start[len(start) :] = bytes(extent - len(start))
        start[off:extent] = data[: max(0, extent - off)]
        try:
            self.header_end = check_start(start) or 0
        except BadNpy as exc:
            raise BadNpy(f"{self.path}: {exc}") from None

    def truncate(self, size: int) -> None:
        assert self.buf is not None
        self.checks_header = False  # zeros may stand where the header will go: judged at close
        if self.outflow is not None:
            self.outflow.broken = True
        self.buf.resize(size)
        self.redefine = True
        self.dirty.append((0, size))

    @property
    def is_dirty(self) -> bool:
        if self.buf is not None and self.buf.written_outside():
            self.redefine = True  # written where no write was seen: the whole file goes
        return not self.detached and (bool(self.dirty) or self.redefine)


def contiguous_end(ranges: list[tuple[int, int]]) -> int:
    """How far the byte ranges cover the file from offset 0 without a gap."""
    out = merged(ranges)
    return out[0][1] if out and out[0][0] == 0 else 0


async def push(client: AsyncClient, handle: Handle) -> None:
    """Store what a writer wrote. Raises BadNpy (EINVAL) and irdma errors; nothing
    stored changes when the content is refused."""
    if not handle.is_dirty or handle.buf is None or handle.detached:
        return
    t = handle.target
    data = handle.buf.view()
    try:
        if handle.outflow is not None and await _finish_outflow(client, handle, data):
            pass
        elif t.kind == Kind.ACCUMULATE:
            await client.accumulate(t.name, parse_npy(data))
        elif t.kind == Kind.STEP:
            await client.accumulate(t.name, parse_npy(data), worker=t.worker, step=t.step)
        elif t.kind == Kind.SHARD:
            await _push_shard(client, handle, data)
        elif t.typed:
            await _push_npy(client, handle, data)
        else:
            await _push_raw(client, handle, data)
    except BadNpy as exc:  # the mount's log is where the reason goes: name the file
        raise BadNpy(f"{handle.path}: {exc}") from None
    handle.dirty.clear()
    handle.redefine = False
    handle.info = (
        await _stat_or_none(client, t.name) if t.kind not in (Kind.ACCUMULATE, Kind.STEP) else None
    )


def layout_of(handle: Handle, data: memoryview) -> NpyLayout:
    """The tensor a writer's bytes make: the .npy header's, or raw bytes."""
    if handle.target.typed:
        return parse_header(data)
    return NpyLayout(np.dtype(np.uint8), (len(data),), 0)


def plan_outflow(handle: Handle, shard_size: int) -> None:
    """Give a writer an outflow once its layout is known: a new .npy file when its
    header has been checked, or an in-place rewrite of a stored file."""
    t = handle.target
    if handle.planned or t.kind != Kind.TENSOR or handle.buf is None:
        return
    if handle.checks_header and handle.header_end:
        layout = parse_header(handle.buf.view()[: handle.header_end])
        handle.buf.reserve(layout.header_len + layout.nbytes)  # never regrown while written
        options: dict = {}
        define = True
    elif handle.info is not None and not handle.redefine and not handle.checks_header:
        info = handle.info
        header = header_for(info.dtype, info.shape) if t.typed else b""
        layout = NpyLayout(np.dtype(info.dtype), info.shape, len(header))
        if not t.typed:
            layout = NpyLayout(np.dtype(np.uint8), (info.nbytes,), 0)
        shard_size, options, define = info.shard_size, {}, False
    else:
        return
    handle.planned = True
    if handle.buf.shared:
        # The daemons copy a push straight out of shared memory, so pushing
        # the file whole at close costs what a client's write of it does.
        # Pushing chunks while the writer writes made the copies compete
        # for the cores and the memory bus instead (2 cores: 91-104 ms per
        # 256 MiB np.save, against 77-81 pushed at close).
        return
    handle.outflow = Outflow.plan(t.name, layout, shard_size, define=define, options=options)


async def _finish_outflow(client: AsyncClient, handle: Handle, data: memoryview) -> bool:
    """Complete a writer's background pushes; False if the whole file must be pushed."""
    flow = handle.outflow
    assert flow is not None
    try:
        layout = layout_of(handle, data)
        if len(data) - layout.header_len > layout.nbytes:
            raise BadNpy(
                f".npy header says {layout.nbytes} bytes of data for {layout.dtype} "
                f"{layout.shape}, the file has {len(data) - layout.header_len}"
            )
        done = await flow.finish(client, data, layout, handle.dirty)
    except BaseException:
        handle.outflow = None
        handle.redefine = True  # what the background pushes left is unknown
        raise
    handle.outflow = None
    if not done:
        handle.redefine = True
    return done


async def _stat_or_none(client: AsyncClient, name: str) -> TensorInfo | None:
    try:
        return await client.stat(name)
    except TensorNotFound:
        return None


LAYOUT_CHANGED = (TensorNotFound, OutOfRange, StaleLayout, ShapeMismatch, DtypeMismatch)


async def _unchanged_since_open(client: AsyncClient, handle: Handle) -> bool:
    """Whether the stored tensor still has the layout the writer opened (so changed
    ranges can go in place); a size change elsewhere means the whole file is pushed."""
    assert handle.info is not None
    try:
        now = await client.stat(handle.target.name)
    except TensorNotFound:
        return False
    old = handle.info
    return (now.ctime, now.dtype, now.shape) == (old.ctime, old.dtype, old.shape)


async def _push_ranges(
    client: AsyncClient, name: str, data: memoryview, ranges, skip: int, base: int
) -> None:
    """Write dirty ``ranges`` of ``data`` (file offsets) to tensor bytes ``base + off - skip``."""
    for start, end in merged(ranges):
        start = max(start, skip)
        if end > start:
            await client.write_bytes(name, base + start - skip, data[start:end])


async def _push_npy(client: AsyncClient, handle: Handle, data: memoryview) -> None:
    layout = parse_header(data)  # BadNpy if the header is not valid
    info = handle.info
    same_layout = (
        info is not None
        and not is_raw(info)
        and np.dtype(info.dtype) == layout.dtype.newbyteorder("<")
        and info.shape == layout.shape
        and layout.dtype.byteorder != ">"
        and layout.header_len == len(header_for(info.dtype, info.shape))
    )
    name = handle.target.name
    if same_layout and not handle.redefine:
        try:
            await _push_ranges(client, name, data, handle.dirty, layout.header_len, 0)
            return
        except TensorNotFound:
            pass  # deleted meanwhile: store the whole file as a new tensor
    arr = parse_npy(data, zero_fill=True)
    if same_layout:
        # Rewritten whole (np.save over the file) with the layout it had: a
        # whole-tensor write in place, as a replace of the same layout would
        # do, without defining the tensor again on every daemon.
        try:
            await client.write(name, arr)
            return
        except LAYOUT_CHANGED:
            pass  # redefined or deleted meanwhile: replace it
    await client.write(name, arr, replace=True)


async def _push_raw(client: AsyncClient, handle: Handle, data: memoryview) -> None:
    info = handle.info
    if (
        info is not None
        and not handle.redefine
        and info.nbytes == len(data)
        and await _unchanged_since_open(client, handle)
    ):
        try:
            await _push_ranges(client, handle.target.name, data, handle.dirty, 0, 0)
            return
        except LAYOUT_CHANGED:
            pass
    arr = np.frombuffer(data, dtype=np.uint8)
    await client.write(handle.target.name, arr, replace=True, options={RAW_OPTION: True})


async def _push_shard(client: AsyncClient, handle: Handle, data: memoryview) -> None:
    info = handle.info
    assert info is not None
    expected = file_size(handle.target, info)
    if len(data) != expected:
        raise BadNpy(
            f"shard {handle.target.index} of {handle.target.name!r} is {expected} bytes; "
            f"a shard file cannot change size (got {len(data)})"
        )
    base = handle.target.index * info.shard_size
    await _push_ranges(client, handle.target.name, data, handle.dirty, 0, base)
