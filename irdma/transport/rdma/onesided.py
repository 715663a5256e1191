"""One-sided pulls over RDMA: a shard's directory slot, its bytes and the slot again,
READ with no message to the daemon.

Pulls that run at once on a connection (the pieces of one read) go out in
chains of READs, one chain at a time (``OneSidedReader.run``): a seqlock read
in three phases, each fenced behind the one before.
"""

from __future__ import annotations

import dataclasses
import enum
import struct

import numpy as np
import trio

from ...protocol.directory import (
    EMPTY,
    ONE_SIDED_ARCH,
    SERVING_WORD,
    SLOT,
    SLOT_BYTES,
    probe,
    slot_record,
)
from ...sizes import RDMA_BATCH_BYTES
from ..base import StreamClosed, for_this_task
from ..direct import TRIES as DIRECT_TRIES
from ..staging import StagingArea
from ..tcp import FramedConnection
from .link import CHUNK, SCRATCH_CELL, SCRATCH_CELLS, SEND_DEPTH, Link, Posted, Remote

# A scratch cell (``link.SCRATCH_CELL`` bytes) holds the slot (64 bytes at 0),
# its seq word before and after (8 bytes each at SEQ_BEFORE and SEQ_AFTER) and,
# for the first pull of a chain, the directory's header slot (at HEADER_AT).
SEQ_BEFORE, SEQ_AFTER, HEADER_AT = 64, 72, 128
SEQ_BYTES = 8
SEQ_WORD = struct.Struct("<Q")


class Retry(enum.Enum):
    """A one-sided pull to send again (the shard changed or moved); an enum so
    that the type checker can tell the sentinel from an answer."""

    RETRY = enum.auto()


RETRY = Retry.RETRY


def fenced(piece: tuple[int, int, int, int], fence: int) -> tuple[int, int, int, int]:
    """A work request (local, remote, length, flags) that starts once every READ
    posted before it has completed."""
    local, remote, length, flags = piece
    return local, remote, length, flags | fence


def chunks(n: int) -> int:
    """Work requests that READ ``n`` bytes (at most CHUNK each)."""
    return max(1, -(-n // CHUNK))


@dataclasses.dataclass(eq=False, slots=True)
class Pull:
    """One one-sided pull waiting in (or answered by) a batch of READs."""

    key: int
    layout: int
    index: int
    offset: int
    n: int
    data: int  # where its bytes land in the staging area
    cell: int  # its scratch cell: the slot read before, after, and (first of a batch) the header
    min_version: int
    slot: int = 0
    block: int = 0
    tries: int = 0
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    answer: tuple[int, int, int] | Retry | None = None
    # Why its chain failed: always an Exception (never the loop's own Cancelled,
    # which belongs to the loop's task and would cancel the reader's scope).
    error: Exception | None = None


@dataclasses.dataclass(eq=False, slots=True)
class Chain:
    """One-sided pulls posted as one chain of READs."""

    pulls: list[Pull]
    posted: Posted


class OneSidedReader:
    """The one-sided pulls of one connection: queued by the readers, sent in chains of
    READs by ``run`` (one of the connection's background loops), answered from the
    directory words each chain READ."""

    def __init__(
        self, link: Link, remote: Remote, staging: StagingArea, peer: str, timeout: float
    ) -> None:
        self.link = link
        self.remote = remote
        self.staging = staging
        self.peer = peer
        self.timeout = timeout
        # Each pull READs the directory words into a cell of the link's scratch room.
        self._cells = [link.scratch_at + i * SCRATCH_CELL for i in range(SCRATCH_CELLS)]
        self._cells_free = trio.Semaphore(SCRATCH_CELLS)
        # Each shard's directory slot and block offset, as last seen.
        self._slots: dict[tuple[int, int], tuple[int, int]] = {}
        # Pulls queued for the next chain of READs (``run`` sends them), and the
        # event that wakes it when one is queued.
        self._batch: list[Pull] = []
        self._queued = trio.Event()
        self._ended = False
        # How the reads went (as DirectReader counts them).
        self.batches = 0  # chains of READs the pulls went out in
        self.reads = 0
        self.retries = 0
        self.contended = 0
        self.pulled_bytes = 0

    async def read(
        self,
        conn: FramedConnection,
        key: int,
        layout: int,
        index: int,
        offset: int,
        out: np.ndarray,
        min_version: int = 0,
    ) -> tuple[int, int, int] | None:
        """One-sided: READ the shard's directory slot, its bytes and the slot again,
        with no message to the daemon.

        Pulls that run at once on this connection (the pieces of one read) go
        out in chains of READs (``run``): the header and every slot, then all
        the bytes, then every slot again, one fence before each phase. Small
        pulls share a chain; a large one has its own, so its bytes are copied
        out while the next chain's are in flight. Returns (version, stamp,
        previous copy's stamp) with the bytes in ``out``, or None when the
        daemon must answer (see ``DirectReader.read``).
        """
        if self.remote.directory is None or not ONE_SIDED_ARCH:
            return None
        n = len(out)
        staging = self.staging
        if n > staging.allocator.capacity // 2:
            return None  # more than a pull may hold of the staging area: ask the daemon
        async with self._cells_free:
            cell = self._cells.pop()
            try:
                local = await staging.take(n, conn)
                try:
                    got = await self._read_direct(
                        key, layout, index, offset, n, local, cell, min_version
                    )
                    if got is not None:
                        # From the staging area's own view: the connection may have
                        # failed (the link closed) since the READs completed; their
                        # bytes are whole, and the memory stays while views of it do.
                        np.copyto(out, staging.view[local : local + n])
                    return got
                except BaseException as exc:
                    conn.abandon(exc)
                    raise
                finally:
                    staging.give(local, n, conn)
            finally:
                self._cells.append(cell)

    async def _read_direct(
        self,
        key: int,
        layout: int,
        index: int,
        offset: int,
        n: int,
        data: int,
        cell: int,
        min_version: int,
    ) -> tuple[int, int, int] | None:
        """Queue one pull for the next chain and wait for its answer (the bytes land at
        ``data`` of the staging area, the slot words in ``cell`` of the scratch room)."""
        where = (key, index)
        pull = Pull(key, layout, index, offset, n, data, cell, min_version)
        while pull.tries < DIRECT_TRIES:
            known = self._slots.get(where)
            if known is None:
                known = await self._find_slot(key, index, layout, cell)
                if known is None:
                    return None
                self._slots[where] = known
            pull.slot, pull.block = known
            pull.done = trio.Event()
            if self._ended:
                raise StreamClosed(f"RDMA to {self.peer}: the connection's pulls stopped")
            self._batch.append(pull)
            self._queued.set()
            # The bytes may still be on their way into ``data``: this waits for
            # the chain (bounded by its timeout) even if the caller is cancelled.
            with trio.CancelScope(shield=True):
                await pull.done.wait()
            if pull.error is not None:
                raise for_this_task(pull.error)
            if pull.answer is not RETRY:
                return pull.answer
        self.contended += 1
        return None

    def stop(self) -> None:
        """The link closed: ``run`` sees it and ends, failing the pulls still queued."""
        self._queued.set()

    async def run(self) -> None:
        """Send the queued one-sided pulls, one chain of READs at a time; answer each.

        One chain at a time: a fenced chain never waits behind another's READs.
        When a chain completes, the next one is posted before the finished
        pulls are woken, so their bytes are copied out of the staging area
        while the next chain's READs are in flight. A chain that fails or times
        out fails the connection; the pulls still queued then fail too.
        """
        link = self.link
        sending: Chain | None = None
        chain: Chain | None = None
        try:
            while not link.closed:
                if sending is None:
                    if not self._batch:
                        self._queued = trio.Event()
                        await self._queued.wait()
                        continue
                    await trio.lowlevel.checkpoint()  # the other pieces of the read queue up
                    sending = await self._post_batch(self._next_batch())
                    continue
                chain, sending = sending, None
                error = await self._settle(chain)
                try:
                    if error is None and self._batch:
                        sending = await self._post_batch(self._next_batch())
                finally:
                    for p in chain.pulls:
                        p.done.set()
                if error is not None:
                    raise error
        finally:
            self._ended = True
            closed = StreamClosed(f"RDMA to {self.peer}: the connection's pulls stopped")
            for c in (chain, sending):
                self._batch += c.pulls if c is not None else []
            for p in self._batch:
                if not p.done.is_set():
                    p.error = p.error or closed
                    p.done.set()
            self._batch.clear()

    def _next_batch(self) -> list[Pull]:
        """The queued pulls that go out in the next chain: small ones together, up to
        RDMA_BATCH_BYTES and the send queue's depth; a larger one alone, so its
        bytes are handed on (copied out) while the next chain's are in flight."""
        batch = [self._batch.pop(0)]
        # The header, then per pull its seq twice, its slot and its bytes.
        nbytes, wrs = batch[0].n, 1 + 3 + chunks(batch[0].n)
        while self._batch:
            p = self._batch[0]
            if nbytes + p.n > RDMA_BATCH_BYTES or wrs + 3 + chunks(p.n) > SEND_DEPTH:
                break
            batch.append(self._batch.pop(0))
            nbytes, wrs = nbytes + p.n, wrs + 3 + chunks(p.n)
        return batch

    async def _post_batch(self, batch: list[Pull]) -> Chain:
        """Post one chain of READs for ``batch``, a seqlock read in three phases, each
        fenced behind the one before: the directory header and every slot's seq word;
        then every slot and all their bytes; then every seq word again.

        The seq word is READ alone, before and after: one RDMA READ has no order
        inside it (soft-RoCE's responder is a memcpy that may copy the seq word
        last), so a 64-byte slot READ can pair a new seq with older words; the slot
        and the bytes READ between two equal, even seq words are one version.

        A pull larger than RDMA_BATCH_BYTES (alone in its batch) first READs the
        header, its seq and its slot and waits for them, then posts its bytes where
        the slot says they are: a shard written since the last read is in another
        block, and reading the kept one would waste a whole transfer.
        """
        link, remote = self.link, self.remote
        assert remote.directory is not None
        table_at, header_slot = remote.directory
        base = remote.arena_addr
        fence = link.e.IBV_SEND_FENCE
        read = link.e.IBV_WR_RDMA_READ
        header = (batch[0].cell + HEADER_AT, base + table_at + header_slot * SLOT_BYTES)
        slots = [base + table_at + p.slot * SLOT_BYTES for p in batch]
        seqs = [(header[0], header[1], SLOT_BYTES, 0)]
        seqs += [(p.cell + SEQ_BEFORE, a, SEQ_BYTES, 0) for p, a in zip(batch, slots, strict=True)]
        images = [(p.cell, a, SLOT_BYTES, 0) for p, a in zip(batch, slots, strict=True)]
        again = [(p.cell + SEQ_AFTER, a, SEQ_BYTES, 0) for p, a in zip(batch, slots, strict=True)]
        try:
            large = len(batch) == 1 and batch[0].n > RDMA_BATCH_BYTES
            if large:
                p = batch[0]
                first = [*seqs, fenced(images[0], fence)]
                await link.chain(read, first, remote.arena_rkey, 2 * SLOT_BYTES, self.timeout)
                rec = slot_record(link.buffer.view[p.cell : p.cell + SLOT_BYTES])
                if rec is not None and rec.names(p.key, p.index, p.layout):
                    p.block = rec.offset
                    self._slots[(p.key, p.index)] = (p.slot, rec.offset)
            data = [
                (p.data + o, base + p.block + p.offset + o, min(CHUNK, p.n - o), 0)
                for p in batch
                for o in range(0, p.n, CHUNK)
            ]
            middle = data if large else [fenced(images[0], fence), *images[1:], *data]
            pieces = [*([] if large else seqs), *middle, fenced(again[0], fence), *again[1:]]
            posted = await link.post(read, pieces, remote.arena_rkey)
        except BaseException as exc:
            # The pulls' readers get an Exception of their own to raise; this task's
            # cancellation (the connection failing) goes on up this task only.
            failure = (
                exc
                if isinstance(exc, Exception)
                else StreamClosed(f"RDMA to {self.peer}: the connection's pulls stopped")
            )
            for p in batch:
                p.error = failure
                p.done.set()
            raise
        return Chain(batch, posted)

    async def _settle(self, chain: Chain) -> Exception | None:
        """Wait for a chain and judge each of its pulls (their ``done`` is the caller's
        to set); the error it failed with, if it did (each pull has it too)."""
        assert self.remote.directory is not None
        try:
            await self.link.wait(chain.posted, sum(p.n for p in chain.pulls), self.timeout)
        except Exception as exc:
            for p in chain.pulls:
                p.error = exc
            return exc
        self.batches += 1
        view = self.link.buffer.view
        serving = SLOT.unpack_from(view.data, chain.pulls[0].cell + HEADER_AT)[SERVING_WORD] == 1
        for p in chain.pulls:
            p.answer = self._judge(p, serving, self.remote.directory[0], view)
        return None

    def _judge(
        self, p: Pull, serving: bool, table_at: int, view: np.ndarray
    ) -> tuple[int, int, int] | Retry | None:
        """What a pull's READs say: its answer, None (ask the daemon) or RETRY."""
        if not serving:
            return None  # the daemon would refuse the read now: let it say why
        where = (p.key, p.index)
        first = slot_record(view[p.cell : p.cell + SLOT_BYTES])
        (before,) = SEQ_WORD.unpack_from(view.data, p.cell + SEQ_BEFORE)
        (after,) = SEQ_WORD.unpack_from(view.data, p.cell + SEQ_AFTER)
        p.tries += 1
        if first is None or not before == first.seq == after:
            self.retries += 1
            return RETRY  # the daemon changed the shard meanwhile (or was, at the start)
        if not first.names(p.key, p.index, p.layout):
            self._slots.pop(where, None)  # freed, reused, or the tensor recreated
            return RETRY
        if first.offset != p.block:
            self._slots[where] = (p.slot, first.offset)  # moved: read it there
            self.retries += 1
            return RETRY
        if p.block + p.offset + p.n > table_at or first.version < p.min_version:
            return None
        self.reads += 1
        self.pulled_bytes += p.n
        return first.version, first.stamp, first.prev

    async def _find_slot(
        self, key: int, index: int, layout: int, local: int
    ) -> tuple[int, int] | None:
        """The shard's slot and block offset, probing the daemon's directory by RDMA READ
        (one slot at a time into the read's scratch cell; only on a cache miss)."""
        link, remote = self.link, self.remote
        assert remote.directory is not None
        table_at, slots = remote.directory
        view = link.buffer.view
        for slot in probe(key, index, slots):
            addr = remote.arena_addr + table_at + slot * SLOT_BYTES
            piece = [(local, addr, SLOT_BYTES, 0)]
            await link.chain(
                link.e.IBV_WR_RDMA_READ, piece, remote.arena_rkey, SLOT_BYTES, self.timeout
            )
            rec = slot_record(view[local : local + SLOT_BYTES])
            if rec is None:
                continue  # changing: it may be this one; probing on costs little
            if rec.names(key, index, layout):
                return slot, rec.offset
            if rec.state == EMPTY:
                return None
        return None
