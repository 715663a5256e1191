"""Snapshots of one daemon's shards in its data directory.

A snapshot is cut without stopping the daemon: in one synchronous step (no
``await``) every tensor's metadata and every local shard's version, mtime
and block are recorded, and each block is pinned. Pinned blocks never change
in place (updates copy-on-write, see store/blocks.py), so a worker thread can then
stream those exact bytes to disk while the event loop keeps serving. Each
block is unpinned as soon as its bytes are written, so copy-on-write holds
extra arena memory only for the shards still waiting to be written.

File format, version 1 (integers little-endian)::

    preamble  16 bytes: magic b"IRDMSNAP", u32 format version, u32 flags (0)
    data      the shard bytes, back to back, in header order
    header    JSON (UTF-8): seq, created, and per tensor its TensorMeta.to_dict(),
              ctime and shards (index, version, mtime, nbytes, offset in the
              file, crc32 of the bytes, txns: the shard's window of recent
              update ids as [txn, version] pairs, so a client's retry of an
              update acknowledged before a restart is still applied once;
              files written before it was kept have none), and deleted: the keys
              of tensors deleted here that the daemon remembers (tombstones, see
              store/catalogue.py; absent from older files)
    trailer   32 bytes: u64 header offset, u64 header length, u32 crc32 of the
              header, u32 crc32 of the preceding 20 trailer bytes, b"IRDMSEND"

The header goes last so the shard bytes stream straight from the arena to
the file, checksummed on the way: nothing is buffered and nothing is read
twice. A reader starts from the trailer, so a truncated or half-written file
(its trailer missing) is detected before anything else is trusted.

Checksums are zlib.crc32: it runs at several GB/s and releases the GIL on
large buffers (2 cores: one serves, one checksums), catches every error
burst of up to 32 bits and random corruption with probability 1 - 2**-32.
The threats are torn writes, truncation and bit rot in a 0700 directory,
not tampering, so a cryptographic hash would only cost throughput.

Writes are atomic: the file is written as ``snapshot.irdma.tmp``, fsynced,
renamed over ``snapshot.irdma`` and the directory fsynced; a failed write
(a full disk, say) removes the temporary file and leaves the previous
snapshot as it was.

Not in a snapshot: deltas a lockstep training mode holds for a step not yet
complete, and the coordinators' worker clocks; a restored tensor starts its
training-mode bookkeeping afresh (its data and versions are those of the cut).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import math
import os
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import trio

from irdma.protocol import Status, TensorMeta
from irdma.training.modes import Mode

from .arena import Block, round_up
from .errors import StoreError
from .store import Store, Tensor
from .store.replica_log import RECENT_TXNS

log = logging.getLogger("psd")

SNAPSHOT_FILE = "snapshot.irdma"
TMP_SUFFIX = ".tmp"
CORRUPT_INFIX = ".corrupt-"

MAGIC = b"IRDMSNAP"
END_MAGIC = b"IRDMSEND"
FORMAT_VERSION = 1
PREAMBLE = struct.Struct("<8sII")  # magic, format version, flags
TRAILER_FIELDS = struct.Struct("<QQI")  # header offset, header length, header crc32
TRAILER = struct.Struct("<QQII8s")  # the fields, their crc32, end magic
assert PREAMBLE.size == 16 and TRAILER.size == 32

# Bytes per write/read/checksum call: large enough that syscalls do not
# matter, small enough that a cancelled snapshot stops soon.
CHUNK = 8 << 20
# The verify pass reads through one reusable buffer of this size.
VERIFY_BUFFER = 1 << 20


class SnapshotError(Exception):
    """A snapshot that cannot be written or must not be used.

    The message names the file and the problem.
    """


@dataclass(frozen=True)
class SnapshotInfo:
    path: Path
    tensors: int
    shards: int
    nbytes: int  # shard data bytes
    created: float  # unix time the snapshot was cut
    seq: int  # increases with every snapshot this data dir has had


@dataclass(slots=True)
class SnapshotHistory:
    """What this process knows of one data dir's snapshots (for HELLO and metrics)."""

    last: SnapshotInfo | None = None  # the newest one written or loaded
    written: int = 0
    failed: int = 0


_histories: dict[str, SnapshotHistory] = {}


def snapshot_history(data_dir: Path) -> SnapshotHistory:
    """The snapshot history of ``data_dir`` in this process (empty until a load or write)."""
    return _histories.setdefault(os.path.abspath(data_dir), SnapshotHistory())


# -- writing -------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _CutShard:
    index: int
    version: int
    mtime: float
    nbytes: int
    view: np.ndarray  # the pinned block's bytes
    slot: int  # where its block sits in the list of pinned blocks
    txns: list[list[int]]  # the shard's recent [txn, version] pairs, oldest first
    stamp: int  # the whole-tensor write its bytes come from (0: none)


@dataclass(eq=False, slots=True)
class _CutTensor:
    meta: dict[str, Any]
    ctime: float
    shards: list[_CutShard]


# One lock per data directory, so two snapshots of it never share the temp file.
_dir_locks: dict[str, trio.Lock] = {}


async def write_snapshot(store: Store, data_dir: Path) -> SnapshotInfo:
    """Write a consistent snapshot of ``store`` to ``data_dir/snapshot.irdma``.

    Raises SnapshotError (naming the file and the OS error) if it cannot be
    written; the previous snapshot is then untouched.
    """
    data_dir = Path(data_dir)
    lock = _dir_locks.setdefault(os.path.abspath(data_dir), trio.Lock())
    async with lock:
        pinned: list[Block | None] = []

        def release(slot: int) -> None:
            block = pinned[slot]
            if block is not None:
                pinned[slot] = None
                store.unpin(block)

        def release_from_thread(slot: int) -> None:
            trio.from_thread.run_sync(release, slot)

        history = snapshot_history(data_dir)
        try:
            created = time.time()
            tensors = _cut(store, pinned)  # synchronous: the image of this instant
            deleted = list(store.deleted)
            info = await trio.to_thread.run_sync(
                _write_file, data_dir, tensors, created, release_from_thread, deleted
            )
        except SnapshotError:
            history.failed += 1
            raise
        else:
            history.last = info
            history.written += 1
            return info
        finally:
            for slot in range(len(pinned)):
                release(slot)


def _cut(store: Store, pinned: list[Block | None]) -> list[_CutTensor]:
    """Record every tensor and local shard, pinning the shards' blocks into ``pinned``."""
    out = []
    for tensor in sorted(store.tensors.values(), key=lambda t: t.meta.name):
        shards = []
        for index, shard in sorted(tensor.shards.items()):
            pinned.append(store.pin(shard.block))
            view = store.arena.view(shard.block, 0, shard.nbytes)
            txns = [[t, v] for t, v in shard.recent.items()]
            cut = _CutShard(
                index,
                shard.version,
                shard.mtime,
                shard.nbytes,
                view,
                len(pinned) - 1,
                txns,
                shard.stamp,
            )
            shards.append(cut)
        out.append(_CutTensor(tensor.meta.to_dict(), tensor.ctime, shards))
    return out


def _write_file(
    data_dir: Path,
    tensors: list[_CutTensor],
    created: float,
    release: Callable[[int], None],
    deleted: list[int],
) -> SnapshotInfo:
    """Write the cut to disk (in a worker thread); ``release(slot)`` unpins a written block."""
    path = data_dir / SNAPSHOT_FILE
    tmp = data_dir / (SNAPSHOT_FILE + TMP_SUFFIX)
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SnapshotError(
            f"cannot write snapshot {path}: cannot create {data_dir}: {exc.strerror}"
        ) from None
    seq = _next_seq(data_dir)
    nshards = nbytes = 0
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            with open(fd, "wb", buffering=0, closefd=False) as f:
                _write_all(f, PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0))
                pos = PREAMBLE.size
                entries = []
                for t in tensors:
                    shard_entries = []
                    for s in t.shards:
                        crc = 0
                        data = s.view.data
                        for start in range(0, s.nbytes, CHUNK):
                            trio.from_thread.check_cancelled()
                            chunk = data[start : start + CHUNK]
                            crc = zlib.crc32(chunk, crc)
                            _write_all(f, chunk)
                        del data
                        release(s.slot)
                        shard_entries.append(
                            {
                                "index": s.index,
                                "version": s.version,
                                "mtime": s.mtime,
                                "nbytes": s.nbytes,
                                "offset": pos,
                                "crc32": crc,
                                "txns": s.txns,
                                "stamp": s.stamp,
                            }
                        )
                        pos += s.nbytes
                        nshards += 1
                        nbytes += s.nbytes
                    entries.append({"meta": t.meta, "ctime": t.ctime, "shards": shard_entries})
                header = json.dumps(
                    {
                        "seq": seq,
                        "created": created,
                        "tensors": entries,
                        "shards": nshards,
                        "nbytes": nbytes,
                        "deleted": deleted,
                    },
                    separators=(",", ":"),
                ).encode()
                _write_all(f, header)
                hcrc = zlib.crc32(header)
                tcrc = zlib.crc32(TRAILER_FIELDS.pack(pos, len(header), hcrc))
                _write_all(f, TRAILER.pack(pos, len(header), hcrc, tcrc, END_MAGIC))
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:  # an OSError, or the caller was cancelled
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise SnapshotError(
                f"cannot write snapshot {path} (via {tmp.name}): {_strerror(exc)}; "
                "the previous snapshot is unchanged"
            ) from None
        raise
    try:
        _fsync_dir(data_dir)
    except OSError as exc:
        raise SnapshotError(
            f"snapshot {path} was written, but syncing {data_dir} failed: {_strerror(exc)}"
        ) from None
    return SnapshotInfo(path, len(tensors), nshards, nbytes, created, seq)


def _write_all(f: BinaryIO, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:  # FileIO returns None only for non-blocking files; never here
            raise OSError(0, "write made no progress")
        view = view[n:]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _next_seq(data_dir: Path) -> int:
    """One more than the highest seq any snapshot here had (moved-aside ones too)."""
    seq = 0
    candidates = [data_dir / SNAPSHOT_FILE, *data_dir.glob(SNAPSHOT_FILE + CORRUPT_INFIX + "*")]
    for candidate in candidates:
        # A missing file, or one whose header is unreadable, cannot tell us a seq.
        with contextlib.suppress(SnapshotError):
            seq = max(seq, read_snapshot_header(candidate)["seq"])
    return seq + 1


def _strerror(exc: OSError) -> str:
    return exc.strerror or str(exc)


# -- reading -------------------------------------------------------------------


class _Corrupt(Exception):
    """The file is not a usable snapshot; the message says exactly why."""


@dataclass(eq=False, slots=True)
class _ShardEntry:
    index: int
    version: int
    mtime: float
    nbytes: int
    offset: int
    crc32: int
    txns: dict[int, int]  # recent update ids -> the versions they produced
    stamp: int = 0  # the whole-tensor write its bytes come from (0: none)


@dataclass(eq=False, slots=True)
class _TensorEntry:
    meta: TensorMeta
    ctime: float
    shards: list[_ShardEntry]


@dataclass(eq=False, slots=True)
class _Parsed:
    header: dict[str, Any]
    tensors: list[_TensorEntry]
    info: SnapshotInfo


def read_snapshot_header(path: Path) -> dict:
    """The decoded header of the snapshot at ``path``, verified (the shard data is not read).

    Raises SnapshotError naming the file and the problem; the file is left as is.
    """
    path = Path(path)
    try:
        with open(path, "rb", buffering=0) as f:
            return _parse(f, path).header
    except _Corrupt as exc:
        raise SnapshotError(f"snapshot {path}: {exc}") from None
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {_strerror(exc)}") from None


def load_snapshot(store: Store, data_dir: Path) -> SnapshotInfo | None:
    """Restore ``data_dir/snapshot.irdma`` into ``store``; None if there is no snapshot.

    The whole file is verified before the store changes. A corrupt file is
    renamed to ``snapshot.irdma.corrupt-<unix time>`` (kept, never deleted)
    and SnapshotError raised; so it is, with the file left in place, for an
    arena too small to hold the snapshot's shards here. Tensors a failed
    load created are removed again, so the store is as it was.

    Meant for a daemon starting up, before it serves: a tensor the store
    already has with the same layout gets the snapshot's bytes and versions.
    """
    path = Path(data_dir) / SNAPSHOT_FILE
    try:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {_strerror(exc)}") from None
    with f:
        try:
            parsed = _parse(f, path)
            _verify_data(f, parsed)
        except _Corrupt as exc:
            raise _move_aside(path, str(exc)) from None
        except OSError as exc:
            raise SnapshotError(f"cannot read snapshot {path}: {_strerror(exc)}") from None
        _restore(store, f, parsed, path)
    snapshot_history(data_dir).last = parsed.info
    return parsed.info


def _parse(f: io.FileIO, path: Path) -> _Parsed:
    """Check preamble, trailer, lengths and header checksum; decode and check the header."""
    size = os.fstat(f.fileno()).st_size
    if size == 0:
        raise _Corrupt("the file is empty")
    pre = _read_exact(f, 0, min(size, PREAMBLE.size))
    head = pre[: len(MAGIC)]
    if head != MAGIC[: len(head)]:
        raise _Corrupt(f"wrong magic {head!r}, not {MAGIC!r}: not an irdma snapshot")
    if len(pre) < PREAMBLE.size:
        raise _Corrupt(f"truncated: the file is {size} bytes, shorter than its preamble")
    _, version, flags = PREAMBLE.unpack(pre)
    if version != FORMAT_VERSION:
        raise _Corrupt(f"unknown format version {version} (this daemon reads {FORMAT_VERSION})")
    if flags != 0:
        raise _Corrupt(f"unknown flags {flags:#x} in the preamble")
    if size < PREAMBLE.size + TRAILER.size:
        raise _Corrupt(f"truncated: the file is {size} bytes, too short to hold a trailer")
    trailer = _read_exact(f, size - TRAILER.size, TRAILER.size)
    hoffset, hlen, hcrc, tcrc, end = TRAILER.unpack(trailer)
    if end != END_MAGIC:
        raise _Corrupt(
            f"no end marker: the file ({size} bytes) is truncated or was not completely written"
        )
    if zlib.crc32(trailer[: TRAILER_FIELDS.size]) != tcrc:
        raise _Corrupt("trailer checksum mismatch")
    if hoffset < PREAMBLE.size or hoffset + hlen + TRAILER.size != size:
        raise _Corrupt(
            f"file length {size} does not match the trailer "
            f"(header of {hlen} bytes at offset {hoffset})"
        )
    raw = _read_exact(f, hoffset, hlen)
    if zlib.crc32(raw) != hcrc:
        raise _Corrupt("header checksum mismatch")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Corrupt(f"header is not valid JSON: {exc}") from None
    tensors, info = _check_header(header, path, data_end=hoffset)
    return _Parsed(header, tensors, info)


def _check_header(
    header: Any, path: Path, data_end: int
) -> tuple[list[_TensorEntry], SnapshotInfo]:
    if not isinstance(header, dict):
        raise _Corrupt("header is not a JSON object")
    seq = _int(header, "seq", "", lo=1)
    created = _num(header, "created", "")
    raw_tensors = header.get("tensors")
    if not isinstance(raw_tensors, list):
        raise _Corrupt("header: 'tensors' must be a list")
    tensors: list[_TensorEntry] = []
    names: dict[int, str] = {}
    spans: list[tuple[int, int, str]] = []
    for i, raw in enumerate(raw_tensors):
        if not isinstance(raw, dict):
            raise _Corrupt(f"header: tensor entry {i} is not an object")
        try:
            meta = TensorMeta.from_dict(raw.get("meta"))
            Mode.from_options(meta.options)
        except (ValueError, TypeError) as exc:
            raise _Corrupt(f"header: tensor entry {i}: {exc}") from None
        what = f"tensor {meta.name!r}"
        if meta.key in names:
            raise _Corrupt(f"header: {what} has the key of {names[meta.key]!r} (listed twice?)")
        names[meta.key] = meta.name
        ctime = _num(raw, "ctime", f"{what}: ")
        raw_shards = raw.get("shards")
        if not isinstance(raw_shards, list):
            raise _Corrupt(f"header: {what}: 'shards' must be a list")
        shards: list[_ShardEntry] = []
        seen: set[int] = set()
        for j, rs in enumerate(raw_shards):
            if not isinstance(rs, dict):
                raise _Corrupt(f"header: {what}: shard entry {j} is not an object")
            index = _int(rs, "index", f"{what} shard entry {j}: ", hi=meta.num_shards)
            where = f"shard {index} of {meta.name!r}"
            if index in seen:
                raise _Corrupt(f"header: {where} is listed twice")
            seen.add(index)
            entry = _ShardEntry(
                index=index,
                version=_int(rs, "version", f"{where}: "),
                mtime=_num(rs, "mtime", f"{where}: "),
                nbytes=_int(rs, "nbytes", f"{where}: "),
                offset=_int(rs, "offset", f"{where}: ", lo=PREAMBLE.size),
                crc32=_int(rs, "crc32", f"{where}: ", hi=1 << 32),
                txns=_txns(rs, f"{where}: "),
                stamp=_int(rs, "stamp", f"{where}: ", hi=1 << 64) if "stamp" in rs else 0,
            )
            expect = meta.shard_span(index)[1]
            if entry.nbytes != expect:
                raise _Corrupt(
                    f"header: {where} has {entry.nbytes} bytes, its layout says {expect}"
                )
            if entry.offset + entry.nbytes > data_end:
                raise _Corrupt(
                    f"header: {where} at [{entry.offset}, {entry.offset + entry.nbytes}) "
                    f"runs past the shard data, which ends at {data_end}"
                )
            spans.append((entry.offset, entry.offset + entry.nbytes, where))
            shards.append(entry)
        tensors.append(_TensorEntry(meta, ctime, shards))
    deleted = header.get("deleted", [])
    if not isinstance(deleted, list) or not all(
        isinstance(k, int) and 0 <= k < 1 << 64 for k in deleted
    ):
        raise _Corrupt("header: 'deleted' must be a list of tensor keys")
    spans.sort()
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise _Corrupt(f"header: {a} and {b} overlap in the file")
    nshards = len(spans)
    nbytes = sum(end - start for start, end, _ in spans)
    if header.get("shards", nshards) != nshards or header.get("nbytes", nbytes) != nbytes:
        raise _Corrupt(
            f"header: says {header.get('shards')} shards of {header.get('nbytes')} bytes, "
            f"lists {nshards} of {nbytes}"
        )
    return tensors, SnapshotInfo(path, len(tensors), nshards, nbytes, created, seq)


def _txns(d: dict[str, Any], what: str) -> dict[int, int]:
    """A shard's txn window: [txn, version] pairs, oldest first (absent before they were kept)."""
    raw = d.get("txns", [])
    if not isinstance(raw, list) or len(raw) > RECENT_TXNS:
        raise _Corrupt(f"header: {what}'txns' must be a list of at most {RECENT_TXNS} pairs")
    out: dict[int, int] = {}
    for pair in raw:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)
            or not (0 < pair[0] < 1 << 64 and 0 <= pair[1] < 1 << 64)
        ):
            raise _Corrupt(f"header: {what}bad txn entry {pair!r}")
        out[pair[0]] = pair[1]
    return out


def _int(d: dict[str, Any], key: str, what: str, lo: int = 0, hi: int | None = None) -> int:
    value = d.get(key)
    if type(value) is not int or value < lo or (hi is not None and value >= hi):
        bound = f"in [{lo}, {hi})" if hi is not None else f">= {lo}"
        raise _Corrupt(f"header: {what}{key!r} must be an integer {bound}, not {value!r}")
    return value


def _num(d: dict[str, Any], key: str, what: str) -> float:
    value = d.get(key)
    if (type(value) is not int and type(value) is not float) or not math.isfinite(value):
        raise _Corrupt(f"header: {what}{key!r} must be a finite number, not {value!r}")
    return float(value)


def _read_exact(f: io.FileIO, offset: int, n: int) -> bytes:
    f.seek(offset)
    buf = bytearray(n)
    got = _readinto_exact(f, memoryview(buf))
    if got < n:
        raise _Corrupt(f"truncated: {n} bytes expected at offset {offset}, {got} there")
    return bytes(buf)


def _readinto_exact(f: io.FileIO, view: memoryview) -> int:
    """Fill ``view`` from the current position; return how many bytes were there."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got : got + CHUNK])
        if not n:
            break
        got += n
    return got


def _verify_data(f: io.FileIO, parsed: _Parsed) -> None:
    """Check every shard's checksum, through one small buffer (nothing changes yet)."""
    buf = memoryview(bytearray(VERIFY_BUFFER))
    entries = [(s, t.meta.name) for t in parsed.tensors for s in t.shards]
    for s, name in sorted(entries, key=lambda e: e[0].offset):
        f.seek(s.offset)
        crc = 0
        left = s.nbytes
        while left:
            n = f.readinto(buf[: min(left, len(buf))])
            if not n:
                raise _Corrupt(f"shard {s.index} of {name!r}: truncated")
            crc = zlib.crc32(buf[:n], crc)
            left -= n
        if crc != s.crc32:
            raise _Corrupt(f"shard {s.index} of {name!r}: checksum mismatch")


def _move_aside(path: Path, problem: str) -> SnapshotError:
    """Rename a corrupt snapshot to snapshot.irdma.corrupt-<time>; return the error to raise."""
    stamp = int(time.time())
    n = 0
    while True:
        kept = path.with_name(f"{path.name}{CORRUPT_INFIX}{stamp}" + (f".{n}" if n else ""))
        if not kept.exists():  # never replace an earlier kept file
            break
        n += 1
    try:
        os.rename(path, kept)
    except OSError as exc:
        return SnapshotError(
            f"snapshot {path} is corrupt: {problem} (moving it aside to {kept.name} "
            f"failed: {_strerror(exc)})"
        )
    with contextlib.suppress(OSError):  # the rename happened; only its durability is unsure
        _fsync_dir(path.parent)
    log.error("snapshot %s is corrupt (%s); kept as %s", path, problem, kept)
    return SnapshotError(f"snapshot {kept} (moved aside from {path.name}) is corrupt: {problem}")


def _restore(store: Store, f: io.FileIO, parsed: _Parsed, path: Path) -> None:
    """Create the snapshot's tensors, then copy in the shards this store holds."""
    free = store.arena.allocator.free_bytes
    created: list[Tensor] = []
    targets = []
    skipped = 0
    try:
        for t in parsed.tensors:
            try:
                tensor, new = store.create(t.meta)
            except StoreError as exc:
                if exc.status == Status.NO_SPACE:
                    raise SnapshotError(_no_space(store, parsed, t.meta, path, free)) from None
                raise SnapshotError(f"snapshot {path}: cannot restore: {exc.message}") from None
            if new:
                created.append(tensor)
                tensor.ctime = t.ctime
            for s in t.shards:
                shard = tensor.shards.get(s.index)
                if shard is None:
                    skipped += 1  # placement changed: another daemon holds it now
                    continue
                if shard.block.pins:
                    raise SnapshotError(
                        f"snapshot {path}: cannot restore shard {s.index} of "
                        f"{t.meta.name!r} while it is being read; load snapshots at start"
                    )
                targets.append((s, shard, t.meta.name))
        for s, shard, name in targets:
            view = store.arena.view(shard.block, 0, s.nbytes).data
            f.seek(s.offset)
            try:
                got = _readinto_exact(f, view)
            except OSError as exc:
                raise SnapshotError(f"cannot read snapshot {path}: {_strerror(exc)}") from None
            if got != s.nbytes or zlib.crc32(view) != s.crc32:
                raise SnapshotError(
                    f"snapshot {path}: shard {s.index} of {name!r} changed while it was loaded"
                )
        for s, shard, _ in targets:
            shard.version = s.version
            shard.mtime = s.mtime
            # A retry of an update acknowledged before the restart is recognised.
            shard.recent = dict(s.txns)
            shard.stamp = s.stamp
            store.blocks.publish(shard)
    except BaseException:
        for tensor in created:
            if store.tensors.get(tensor.meta.key) is tensor:
                store.delete(tensor.meta.key, tombstone=False)
        raise
    for key in parsed.header.get("deleted", []):
        if key not in store.tensors:
            store.catalogue.note_deleted(key)
    info = parsed.info
    log.info(
        "restored snapshot %s (seq %d): %d tensors, %d of its %d shards (%d not held here)",
        path,
        info.seq,
        info.tensors,
        len(targets),
        info.shards,
        skipped,
    )


def _local_bytes(store: Store, meta: TensorMeta) -> int:
    """Arena bytes the shards of ``meta`` this store owns take."""
    return sum(
        round_up(meta.shard_span(i)[1]) for i in range(meta.num_shards) if store.owns(meta.key, i)
    )


def _no_space(store: Store, parsed: _Parsed, meta: TensorMeta, path: Path, free: int) -> str:
    need = _local_bytes(store, meta)
    total = sum(_local_bytes(store, t.meta) for t in parsed.tensors)
    return (
        f"snapshot {path}: the arena is too small: tensor {meta.name!r} needs {need} bytes "
        f"for its shards held here, the whole snapshot needs {total} bytes here, and the "
        f"arena has {free} of {store.arena.capacity} bytes free"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m irdma_psd.snapshot FILE``: the names of the tensors a snapshot holds,
    as a JSON list (``irdma local`` asks, before it changes the number of daemons)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m irdma_psd.snapshot SNAPSHOT_FILE", file=sys.stderr)
        return 2
    try:
        header = read_snapshot_header(Path(args[0]))
    except SnapshotError as exc:
        print(f"psd: {exc}", file=sys.stderr)
        return 1
    print(json.dumps([t["meta"]["name"] for t in header["tensors"]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
