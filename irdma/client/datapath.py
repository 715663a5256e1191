"""The data path: runs one call's plan, piece by piece, and makes a read whole.

The planner (``planner``) cuts the call into slices and decides its stamp,
update ids and replica choice; each slice then goes one-sided where it can
(``onesided.OneSidedReader``) or as a request through the router, which
fails over between replicas; a read whose pieces come from two whole-tensor
writes is made to agree on one (``agreement``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from .. import narrowing
from ..cluster import Node
from ..errors import DaemonError, StaleStamp
from ..protocol import Op, Status, TensorMeta
from ..protocol.messages import Read, Update, served_stamps
from ..sizes import PARALLEL_COPY_MIN
from ..transport.base import Buffer
from .agreement import Runner, Served, agree, settle_at
from .arrays import byte_view, check_out, narrowed_delta
from .onesided import OneSidedReader
from .planner import Slice, Spread, slices, update_txn, whole_write_stamp, wire_for
from .ranges import Piece
from .routing import Router, asks_primary, several_copies, worker_field
from .session import Session
from .sinks import IntoSink
from .stamps import StampClock

Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Contention:
    """How often one client's whole-tensor calls met other writers, since it was made."""

    # Reads of several shards that met two whole-tensor writes and read pieces
    # again to get one (write/read contention).
    reads_reconciled: int = 0
    # Whole-tensor writes stamped again and written to every shard again because
    # a shard held a later one (write/write contention).
    writes_restamped: int = 0
    # Shards those writes had reached before they were stamped again: each was
    # written twice, so its version went up once more than the write count says.
    pieces_rewritten: int = 0


class DataPath:
    """Moves bytes between a caller's buffer and a tensor's shards for one client."""

    def __init__(self, session: Session, router: Router, reader: OneSidedReader) -> None:
        self.session = session
        self.router = router
        self.reader = reader
        # How reads of several shards are made to agree on one whole-tensor write.
        self.runner = Runner(session.gather, session.sleep, session.now, session.timeout)
        # Reads of several shards that met two whole-tensor writes and read
        # pieces again to get one (a measure of write/read contention).
        self.reads_reconciled = 0
        # Whole-tensor writes stamped and written again because a shard held a
        # later one (a measure of write/write contention).
        self.stamps = StampClock()  # this client's whole-write stamps
        self.writes_restamped = 0
        # Their pieces applied before the refusal and written again (each bumped
        # its shard's version once more).
        self.pieces_rewritten = 0

    @property
    def contention(self) -> Contention:
        return Contention(self.reads_reconciled, self.writes_restamped, self.pieces_rewritten)

    async def read_array(
        self,
        meta: TensorMeta,
        arr: np.ndarray,
        code: int,
        progress: Progress | None = None,
        worker: int | None = None,
        step: int = 0,
    ) -> None:
        """Read the whole tensor into ``arr`` (checked against it), its values on the
        wire in dtype ``code`` where the planner lets them travel narrowed."""
        wire = wire_for(meta, code)
        if not wire:
            view = byte_view(arr)
            await self.move(Op.READ, meta, 0, view, progress=progress, worker=worker, step=step)
            return
        held = np.empty(arr.size, dtype=narrowing.check(meta.np_dtype, wire))
        await self.move(
            Op.READ,
            meta,
            0,
            byte_view(held),
            progress=progress,
            worker=worker,
            step=step,
            wire=wire,
        )
        narrowing.widen_into(held, wire, arr.reshape(-1))

    async def read_whole(
        self,
        meta: TensorMeta,
        out: np.ndarray | None,
        code: int,
        progress: Progress | None = None,
        worker: int | None = None,
        step: int = 0,
    ) -> np.ndarray:
        """``AsyncClient.read``: the whole tensor into ``out`` (checked against it) or
        into a new array; that array."""
        arr = out
        if arr is None:
            arr = np.empty(meta.shape, dtype=meta.np_dtype)
        else:
            check_out(meta, arr)
        await self.read_array(meta, arr, code, progress, worker, step)
        return arr

    async def read_bytes(
        self, meta: TensorMeta, offset: int, size: int, out: Buffer | None
    ) -> memoryview:
        """``AsyncClient.read_bytes``: bytes ``[offset, offset+size)``, into ``out`` if
        given, cut at the tensor's end."""
        n = max(0, min(size, meta.nbytes - offset))
        buf = memoryview(out if out is not None else bytearray(n)).cast("B")[:n]
        await self.move(Op.READ, meta, offset, buf)
        return buf

    async def read_range(self, meta: TensorMeta, offset: int, out: Buffer, at: int) -> int:
        """``AsyncClient.read_range``: ``out`` filled from ``offset`` (up to the tensor's
        end); the stamp of the whole-tensor write the bytes come from (0: none)."""
        buf = memoryview(out).cast("B")
        n = max(0, min(len(buf), meta.nbytes - offset))
        served = await self.move(Op.READ, meta, offset, buf[:n], at=at)
        return served[0].stamp if served else 0

    async def accumulate_array(
        self,
        meta: TensorMeta,
        arr: np.ndarray,
        alpha: float,
        code: int,
        progress: Progress | None = None,
        worker: int | None = None,
        step: int = 0,
    ) -> None:
        """``tensor += alpha * arr``, the delta on the wire in dtype ``code`` where the
        planner lets it travel narrowed (the wire dtype decided once, here)."""
        wire = wire_for(meta, code)
        data = narrowed_delta(meta, arr, wire)
        await self.move(
            Op.ACCUMULATE,
            meta,
            0,
            byte_view(data),
            alpha=alpha,
            progress=progress,
            worker=worker,
            step=step,
            wire=wire,
        )

    async def move(
        self,
        op: Op,
        meta: TensorMeta,
        offset: int,
        buf: memoryview,
        *,
        alpha: float = 1.0,
        progress: Progress | None = None,
        worker: int | None = None,
        step: int = 0,
        wire: int = 0,
        at: int = 0,
    ) -> list[Served]:
        """Move ``buf`` to or from bytes at ``offset`` of a tensor; return each piece's answer.

        ``worker`` and ``step`` name a training worker's step (see ``irdma.training.modes``).
        With a ``wire`` dtype, ``buf`` holds the values in that dtype
        (``irdma.narrowing``) while ``offset`` still counts the tensor's bytes.
        A read of several shards gets them all from one whole-tensor write;
        with ``at``, from that write (TornRead if a daemon no longer has it).
        """
        wid = worker_field(worker, step)
        cut = slices(meta, offset, len(buf), wire)
        direct = op == Op.READ and not wire and self.reader.allowed(meta, wid)
        if direct and len(cut) == 1:
            # The most common small read: one piece, one-sided, nothing else to set up.
            got = await self.reader.read(meta, cut[0].piece, buf)
            if got is not None and (not at or got.stamp == at):
                if progress is not None:
                    progress(len(buf))
                return [got]
            direct = False  # tried: the daemon answers it
        update = op != Op.READ
        # Reads: choose each shard's replica so the bytes spread evenly
        # (reads for a training step go to the primary: Router.on_replicas).
        choice: dict[int, list[Node]] = {}
        if not asks_primary(update, wid) and several_copies(self.session.config):
            spread = Spread(self.router, to_primary=False)
            choice = {s.shard: spread.order(meta.key, s.piece) for s in cut}
        stamp = whole_write_stamp(op, meta, cut, self.stamps)
        by_shard = {s.shard: s for s in cut}
        # A large one-sided read copies its shards on two threads first; what
        # they could not copy goes the usual way below.
        copied: dict[int, Served] = {}
        if direct and len(cut) > 1 and len(buf) >= PARALLEL_COPY_MIN:
            copied = await self.reader.copy(meta, [s.piece for s in cut], buf, choice)

        async def one(p: Piece, want: int = 0, floor: bool = True) -> Served:
            """Move one piece; ``want``: re-read it from that whole-tensor write's copy,
            no older than this client saw unless ``floor`` is off (an explicit ``at``)."""
            s = by_shard[p.shard]
            view = buf[s.start : s.start + s.length]
            if op != Op.READ:
                applied = await self._update(op, meta, s, view, alpha, wire, wid, step, stamp)
                if progress is not None and p.shard not in moved:
                    moved.add(p.shard)  # a whole write written again counts once
                    progress(s.length)
                return applied
            if direct and not want:
                got = copied.pop(p.shard, None) or await self.reader.read(
                    meta, p, view, choice.get(p.shard)
                )
                if got is not None:
                    if progress is not None:
                        progress(s.length)
                    return got
            read = Read(
                meta.key,
                p.shard,
                p.shard_offset,
                p.length,
                # A kept copy must not be older than what this client saw.
                min_version=self.router.seen(meta.key, p.shard) if want and floor else 0,
                layout=meta.layout,
                dtype=meta.dtype_code,
                wire=wire,
                worker=wid,
                step=step,
                stamp=want,
            )
            reply = await self.router.on_replicas(
                meta.key,
                p.shard,
                read,
                sink=IntoSink(view, None if want else progress),
                update=False,
                # An older write's copy says nothing about what this client saw.
                track=not want,
                candidates=choice.get(p.shard),
            )
            return Served(reply.header.version, *served_stamps(reply.header))

        pieces = [s.piece for s in cut]
        moved: set[int] = set()  # shards whose progress was reported
        if len(pieces) == 1:  # most small requests: no fan-out to set up
            served = [await one(pieces[0])]
        else:
            kept = await self.session.gather(partial(_refusal_kept, one, p) for p in pieces)
            deadline = self.session.now() + self.session.timeout
            while stamp and (later := _outrun(kept)) and self.session.now() < deadline:
                # A shard holds a later whole write: this one goes after it, on
                # every shard (those it reached too), or they would end with
                # different writes (see ``stamps``).
                stamp = self.stamps.next(after=later)
                self.writes_restamped += 1
                self.pieces_rewritten += sum(isinstance(s, Served) for s in kept)
                kept = await self.session.gather(partial(_refusal_kept, one, p) for p in pieces)
            if stamp and _outrun(kept):
                raise StaleStamp(
                    f"tensor {meta.name!r}: later whole-tensor writes from other clients "
                    f"kept reaching some of its shards first for {self.session.timeout:g} s; "
                    "this write is not applied everywhere: write it again",
                    Status.STALE_STAMP,
                )
            refused = [s for s in kept if isinstance(s, DaemonError)]
            if refused:
                raise refused[0]
            served = kept
        if stamp:
            # Read-your-writes for the whole write, and the floor for reads of
            # kept copies of older writes (with one replica too).
            for p, got in zip(pieces, served, strict=True):
                self.router.saw(meta.key, p.shard, got.version, update=True)
        if at:
            return await settle_at(meta.name, at, pieces, served, one, self.runner)
        if op == Op.READ and len({s.stamp for s in served}) > 1:
            self.reads_reconciled += 1
            return await agree(meta.name, pieces, served, one, self.runner)
        return served

    async def _update(
        self,
        op: Op,
        meta: TensorMeta,
        s: Slice,
        view: memoryview,
        alpha: float,
        wire: int,
        wid: int,
        step: int,
        stamp: int,
    ) -> Served:
        """Write or accumulate one slice at the shard's primary, failing over."""
        p = s.piece
        change = Update(
            op,
            meta.key,
            p.shard,
            p.shard_offset,
            p.length,
            alpha,
            meta.layout,
            meta.dtype_code,
            wire,
            wid,
            step,
            txn=update_txn(self.router.fails_over),
            stamp=stamp,
        )
        reply = await self.router.on_replicas(
            # A whole-tensor write's versions count as seen once all of it is
            # in (``move``): one that fails half-way leaves the write before it.
            meta.key,
            p.shard,
            change,
            [view],
            length=s.length,
            update=True,
            track=not stamp,
        )
        return Served(reply.header.version, stamp, 0)


def _outrun(kept: list[Served | DaemonError]) -> int:
    """The latest stamp shards named in refusing a whole write because they hold a
    later one, when that is every refusal (0: none, or others too)."""
    refused = [s for s in kept if isinstance(s, DaemonError)]
    if not refused or not all(isinstance(r, StaleStamp) for r in refused):
        return 0
    return max(r.held for r in refused if isinstance(r, StaleStamp))


async def _refusal_kept(
    one: Callable[[Piece], Awaitable[Served]], p: Piece
) -> Served | DaemonError:
    """``one(p)``, or the daemon's refusal of it as a value: a refused piece (a stale
    layout, say) must not cancel its siblings, whose connections (shared with
    the client's other calls) a cancelled request would have to drop."""
    try:
        return await one(p)
    except DaemonError as exc:
        return exc
