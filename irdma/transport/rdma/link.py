"""The verbs side of one connection: its queue pair, registered buffer and send-queue room,
and what the daemon's RDMA_CONNECT answer said of its side."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import trio

from ...protocol import RDMA_ANSWER_KEYS
from ..base import StreamBroken, StreamTimeout
from ..shm import directory_of
from ..verbs import Endpoint, PinnedBuffer
from .completions import Completions

log = logging.getLogger("irdma")

# Largest single work request; longer transfers are chains of these.
CHUNK = 1 << 20
SEND_DEPTH = 256
CQ_DEPTH = 2 * SEND_DEPTH
# One-sided pulls in flight per connection, each with a cell of the registered
# buffer for the directory words it READs (``onesided``): they do not take room
# from the staging area, which then holds whole shards for the bytes.
SCRATCH_CELLS = 64
SCRATCH_CELL = 3 * 64


@dataclasses.dataclass(slots=True)
class Remote:
    """What the daemon's RDMA_CONNECT answer gave this connection."""

    arena_addr: int
    arena_rkey: int
    arena_size: int
    staging_addr: int
    staging_rkey: int
    staging_size: int

    # Where the shard directory is in the arena (offset, slots), if the daemon has one.
    directory: tuple[int, int] | None = None

    @classmethod
    def from_answer(cls, answer: dict[str, Any]) -> Remote:
        # Six ints for the six int fields; mypy cannot count a starred generator.
        remote = cls(*(int(answer[k]) for k in RDMA_ANSWER_KEYS[2:]))  # type: ignore[arg-type]
        remote.directory = directory_of(answer, remote.arena_size)
        return remote


@dataclasses.dataclass(eq=False, slots=True)
class Posted:
    """A chain of work requests posted and not yet waited for."""

    wr_id: int
    done: trio.Event
    count: int  # its work requests, holding room in the send queue until waited for


class Link:
    """The verbs side of one connection: endpoint, queue pair, buffer, completions."""

    def __init__(self, endpoint: Endpoint, staging_size: int, peer: str) -> None:
        e = endpoint.e
        self.endpoint = endpoint
        self.e = e
        self.peer = peer
        self.channel = endpoint.completion_channel()
        self.cq = endpoint.completion_queue(CQ_DEPTH, self.channel)
        self.qp = endpoint.queue_pair(self.cq, SEND_DEPTH)
        # The staging area (pushes land at the same offset in the daemon's), then
        # room for the directory words one-sided pulls READ, from ``scratch_at``.
        self.buffer: PinnedBuffer = endpoint.buffer(
            staging_size + SCRATCH_CELLS * SCRATCH_CELL, e.IBV_ACCESS_LOCAL_WRITE
        )
        self.scratch_at = staging_size
        self.local = endpoint.local_info(self.qp)
        self.completions = Completions(self.cq, self.channel, peer)
        self.slots = trio.Semaphore(SEND_DEPTH)
        self.remote: Remote | None = None
        self.closed = False

    async def transfer(
        self, opcode: int, local: int, remote_addr: int, rkey: int, nbytes: int, timeout: float
    ) -> None:
        """Move ``nbytes`` between ``local`` (offset in our buffer) and ``remote_addr``."""
        pieces = [
            (local + o, remote_addr + o, min(CHUNK, nbytes - o), 0) for o in range(0, nbytes, CHUNK)
        ]
        await self.chain(opcode, pieces, rkey, nbytes, timeout)

    async def chain(
        self,
        opcode: int,
        pieces: Sequence[tuple[int, int, int, int]],
        rkey: int,
        nbytes: int,
        timeout: float,
    ) -> None:
        """Post (local offset, remote address, length, send flags) work requests as one
        chain, only the last signalled (completions arrive in order, so it stands for
        the whole chain), and wait for it."""
        await self.wait(await self.post(opcode, pieces, rkey), nbytes, timeout)

    async def post(
        self, opcode: int, pieces: Sequence[tuple[int, int, int, int]], rkey: int
    ) -> Posted:
        """Post a chain (as ``chain``) without waiting; ``wait`` for it afterwards, always
        (it gives the chain's room in the send queue back)."""
        from pyverbs.wr import SGE, SendWR

        await self.take_room(len(pieces))
        wr_id, done = self.completions.expect()
        posted = Posted(wr_id, done, len(pieces))
        try:
            if self.closed or self.completions.failure is not None:
                raise StreamBroken(f"RDMA to {self.peer}: queue pair closed or failed")
            wrs: list[Any] = []
            after = None
            # Built last to first: each names the next.
            for i, (local, remote, length, flags) in reversed(list(enumerate(pieces))):
                last = i == len(pieces) - 1
                wr = SendWR(
                    wr_id=wr_id,
                    opcode=opcode,
                    num_sge=1,
                    sg=[SGE(self.buffer.addr + local, length, self.buffer.lkey)],
                    send_flags=flags | (self.e.IBV_SEND_SIGNALED if last else 0),
                    **({"next_wr": after} if after is not None else {}),
                )
                wr.set_wr_rdma(rkey, remote)
                wrs.append(wr)
                after = wr
            try:
                self.qp.post_send(wrs[-1])
            except Exception as exc:
                raise StreamBroken(f"posting an RDMA transfer failed: {exc}") from exc
        except BaseException:
            self._done_with(posted)
            raise
        return posted

    async def take_room(self, n: int) -> None:
        """Take ``n`` places in the send queue, all or none: cancelled while it is
        full, it gives back those it took (``_done_with`` gives back the rest)."""
        taken = 0
        try:
            for _ in range(n):
                await self.slots.acquire()
                taken += 1
        except BaseException:
            for _ in range(taken):
                self.slots.release()
            raise

    async def wait(self, posted: Posted, nbytes: int, timeout: float) -> None:
        """Wait for a posted chain to complete; raise if it failed or timed out."""
        try:
            with trio.move_on_after(timeout) as scope:
                await posted.done.wait()
            if scope.cancelled_caught:
                raise StreamTimeout(f"RDMA transfer of {nbytes} bytes took over {timeout:g} s")
            if self.completions.failure is not None:
                raise StreamBroken(str(self.completions.failure)) from self.completions.failure
        finally:
            self._done_with(posted)

    def _done_with(self, posted: Posted) -> None:
        if posted.count:
            self.completions.forget(posted.wr_id)
            for _ in range(posted.count):
                self.slots.release()
            posted.count = 0

    def close(self) -> None:
        """Destroy the verbs resources; every later use raises instead of touching them."""
        if self.closed:
            return
        self.closed = True
        self.completions.close()
        # Queue pair first: nothing may write our buffer once it is unmapped.
        for obj in (self.qp, self.cq, self.channel):
            try:
                obj.close()
            except Exception as exc:  # closing is best effort; the process keeps going
                log.debug("closing RDMA resource: %s", exc)
        self.buffer.close()
        self.endpoint.close()
