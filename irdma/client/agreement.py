"""One whole-tensor write for every piece of a read: the client's reconciling rules.

Each piece of a read is answered with the stamp of the whole-tensor write
its bytes come from and the stamp of the copy its shard keeps from before
(``Served``). A read whose pieces name two writes met a rewrite and reads
pieces again (``agree``); a read that must come from one named write reads
the pieces that are not from it from that write's kept copy (``settle_at``).

The rule that keeps the caller's buffer whole: ``served[i]`` always says
what bytes are now in piece ``i``'s part of the buffer. Every piece read
again is recorded as soon as it is in, even when the attempt it belongs to
fails as a whole (other pieces could not be had from that write), because
its bytes have already replaced the old ones in the buffer.

No I/O here: the caller passes how to read one piece again (``Reread``) and
how to run calls (``Runner``), so the rules are tested with a model of the
daemons (``tests/test_agreement.py``). How many rounds, for how long and with
what pauses are the retry policy's (``retry.AGREE_TRIES``, ``AGREE_CHASE``,
``agree_pause``; the client timeout).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from ..errors import StampGone, StampPending, TornRead
from .ranges import Piece
from .retry import AGREE_CHASE, AGREE_TRIES, agree_pause


class Served(NamedTuple):
    """One piece of a read or update as answered: the shard's version, the stamp of
    the whole-tensor write its bytes come from, and of the copy before it (0: none)."""

    version: int
    stamp: int
    prev: int


# Read one piece again into its part of the caller's buffer: (piece, the write
# wanted (0: the shard as it is now), whether this client's read-your-writes
# floor applies). Raises StampPending when the shard has not received that
# write yet, StampGone when it no longer keeps it.
Reread = Callable[[Piece, int, bool], Awaitable[Served]]


@dataclass(frozen=True, slots=True)
class Runner:
    """How the rules run: calls side by side, pauses and the deadline's clock."""

    gather: Callable[[list[Callable[[], Awaitable[Any]]]], Awaitable[list[Any]]]
    sleep: Callable[[float], Awaitable[None]]
    now: Callable[[], float]
    timeout: float


def _record(served: list[Served], indices: list[int], got: list[Served | None]) -> None:
    """Note the pieces read again (None: not had); their bytes are in the buffer now."""
    for i, s in zip(indices, got, strict=True):
        if s is not None:
            served[i] = s


async def agree(
    name: str, pieces: list[Piece], served: list[Served], one: Reread, run: Runner
) -> list[Served]:
    """Make a read of several shards come from one whole-tensor write.

    Pieces from two writes (a rewrite ran during the read) are read again.
    First, for a few rounds, those a write in progress has not reached yet
    (their stamp is another piece's previous one), as they are now: the
    writer is reaching them. Then, since a writer rewriting without pause
    can stay ahead of that, the others from the copy of one write, which
    the daemons keep for a while: a write every piece has or had, those
    the pieces say they still have first. ``TornRead`` when no write can
    be had whole before the client timeout, or after ``AGREE_TRIES``
    rounds that got nowhere.
    """
    served = list(served)

    async def now_(i: int) -> Served:
        return await one(pieces[i], 0, True)

    async def at(i: int, target: int) -> Served | None:
        try:
            return await one(pieces[i], target, True)
        except (StampGone, StampPending):
            return None

    deadline = run.now() + run.timeout
    chased = stuck = 0
    while stuck < AGREE_TRIES and run.now() < deadline:
        stamps = Counter(s.stamp for s in served)
        if len(stamps) == 1:
            return served
        superseded = {s.prev for s in served if s.prev}
        behind = [i for i, s in enumerate(served) if s.stamp in superseded]
        if behind and chased < AGREE_CHASE:
            chased += 1
            again = await run.gather([partial(now_, i) for i in behind])
            if again == [served[i] for i in behind]:
                await run.sleep(agree_pause(chased))  # the writer is not there yet
            _record(served, behind, again)
            continue
        kept = {t for t in stamps if all(t in (s.stamp, s.prev) for s in served)}
        for target in sorted(stamps, key=lambda t: (t not in kept, -stamps[t])):
            redo = [i for i, s in enumerate(served) if s.stamp != target]
            got = await run.gather([partial(at, i, target) for i in redo])
            _record(served, redo, got)
            if all(s.stamp == target for s in served):
                return served
        # No write to be had whole from these: look at every piece again.
        stuck += 1
        everything = list(range(len(pieces)))
        _record(served, everything, await run.gather([partial(now_, i) for i in everything]))
    raise TornRead(
        f"tensor {name!r}: its shards kept coming from different whole-tensor "
        "writes (rewritten faster than it can be read, or a writer stopped half-way "
        "and the older copies were taken back for room); read it again, or write it "
        "whole again"
    )


async def settle_at(
    name: str, at: int, pieces: list[Piece], served: list[Served], one: Reread, run: Runner
) -> list[Served]:
    """Get every piece from whole-tensor write ``at``: from its copy where the shard
    moved on, or, where the write has not reached the shard yet, once it has."""
    served = list(served)

    async def from_copy(i: int) -> Served | None:
        try:
            # Asked for by name: that write, even if this client wrote since.
            return await one(pieces[i], at, False)
        except StampPending:
            return None  # on its way: looked at again below

    deadline = run.now() + run.timeout
    redo = [i for i, s in enumerate(served) if s.stamp != at]
    pause = 0
    while redo:
        try:
            got = await run.gather([partial(from_copy, i) for i in redo])
        except StampGone:
            raise TornRead(
                f"tensor {name!r} was rewritten twice while it was being read: "
                "the rest of the write the read began with is gone; read it again"
            ) from None
        _record(served, redo, got)
        redo = [i for i in redo if served[i].stamp != at]
        if not redo:
            break
        if run.now() >= deadline:
            raise TornRead(
                f"tensor {name!r}: the write the read began with never reached "
                f"some of its shards within {run.timeout:g} s (its writer stopped "
                "half-way?); read it again"
            )
        pause += 1
        await run.sleep(agree_pause(pause))
    return served
