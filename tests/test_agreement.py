"""The rules that make a read of several shards come from one whole-tensor write.

``irdma.client.agreement`` is driven here by a model of the daemons: every shard
keeps its current copy, the previous one and at most one older (as
``psd/store/copies.py`` does, with older copies sometimes taken back for room), and
a writer rewrites the tensor whole, reaching the shards one by one, while a
read reconciles. The model's buffer records which write's bytes each piece
holds, so a read that returns with its pieces' answers agreeing while the
buffer mixes two writes is caught (the bug behind the "shards of two
writes" failures in ``tests/test_consistent_reads.py``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from irdma.client.agreement import Runner, Served, agree, settle_at
from irdma.client.ranges import Piece
from irdma.client.shells import drive
from irdma.errors import StampGone, StampPending, TornRead

pytestmark = pytest.mark.timeout(120)


@dataclass
class ShardModel:
    """What one daemon keeps of one shard: its copies by stamp, newest last."""

    copies: list[int] = field(default_factory=lambda: [1])
    received: set[int] = field(default_factory=lambda: {1})

    @property
    def stamp(self) -> int:
        return self.copies[-1]

    @property
    def prev(self) -> int:
        return self.copies[-2] if len(self.copies) > 1 else 0


class Daemons:
    """Shards rewritten whole by a writer that reaches them one at a time.

    Every piece read moves the writer on by a random number of shards. The
    buffer holds, per piece, the stamp of the write whose bytes it holds.
    """

    def __init__(self, rng: random.Random, shards: int) -> None:
        self.rng = rng
        self.shards = [ShardModel() for _ in range(shards)]
        self.buffer = [0] * shards
        self.next_write = 2
        self.pending: list[int] = []  # shards the write in progress has yet to reach
        self.partial_failures = 0  # attempts at one write where some pieces came, some not

    def _advance(self) -> None:
        for _ in range(self.rng.choice([0, 0, 1, 1, 2, 3])):
            if not self.pending:
                self.pending = self.rng.sample(range(len(self.shards)), len(self.shards))
                self.stamp = self.next_write
                self.next_write += 1
            shard = self.shards[self.pending.pop()]
            shard.copies.append(self.stamp)
            shard.received.add(self.stamp)
            # The current copy, the previous one, at most one older; the older
            # one is sometimes taken back for room.
            del shard.copies[:-3]
            if len(shard.copies) == 3 and self.rng.random() < 0.3:
                del shard.copies[0]

    async def one(self, piece: Piece, want: int, floor: bool) -> Served:
        self._advance()
        shard = self.shards[piece.shard]
        got = want or shard.stamp
        if got not in shard.copies:
            if got not in shard.received:
                raise StampPending(f"shard {piece.shard} has not received {got}")
            raise StampGone(f"shard {piece.shard} no longer holds {got}")
        self.buffer[piece.shard] = got
        return Served(got, got, shard.prev)

    def runner(self) -> Runner:
        clock = [0.0]

        async def gather(calls):
            # In an order of their own, as concurrent calls may finish; results
            # in the callers' order, or the first error once all have run.
            order = self.rng.sample(range(len(calls)), len(calls))
            results: list = [None] * len(calls)
            error = None
            for i in order:
                try:
                    results[i] = await calls[i]()
                except (StampGone, StampPending) as exc:
                    error = error or exc
            if error is not None:
                raise error
            return results

        async def sleep(seconds: float) -> None:
            clock[0] += seconds

        def now() -> float:
            clock[0] += 1e-4
            return clock[0]

        return Runner(gather, sleep, now, timeout=10.0)


def pieces_of(shards: int) -> list[Piece]:
    return [Piece(i, 0, 1, i) for i in range(shards)]


@pytest.mark.parametrize("seed", range(40))
def test_a_reconciled_read_holds_one_write_in_every_piece(seed: int) -> None:
    rng = random.Random(seed)
    reconciled = torn = 0
    for _ in range(200):
        daemons = Daemons(rng, rng.randint(2, 6))
        pieces = pieces_of(len(daemons.shards))
        first = [drive(daemons.one(p, 0, True)) for p in pieces]
        if len({s.stamp for s in first}) == 1:
            continue
        reconciled += 1
        try:
            served = drive(agree("t", pieces, first, daemons.one, daemons.runner()))
        except TornRead:
            torn += 1
            continue
        stamps = {s.stamp for s in served}
        assert len(stamps) == 1, f"answers from two writes: {served}"
        assert daemons.buffer == [stamps.pop()] * len(pieces), (
            f"the answers agree but the bytes mix writes: {daemons.buffer}, {served}"
        )
    # The model reached what it is for: reads that met writes, most of them made whole.
    assert reconciled > 20 and torn < reconciled // 2, (reconciled, torn)


@pytest.mark.parametrize("seed", range(10))
def test_a_read_at_one_write_holds_that_write_in_every_piece(seed: int) -> None:
    rng = random.Random(seed)
    settled = 0
    for _ in range(200):
        daemons = Daemons(rng, rng.randint(2, 6))
        pieces = pieces_of(len(daemons.shards))
        first = drive(daemons.one(pieces[0], 0, True))
        rest = [drive(daemons.one(p, 0, True)) for p in pieces[1:]]
        try:
            served = drive(
                settle_at("t", first.stamp, pieces, [first, *rest], daemons.one, daemons.runner())
            )
        except TornRead:
            continue
        settled += 1
        assert daemons.buffer == [first.stamp] * len(pieces), (daemons.buffer, served)
    assert settled > 50


def test_a_read_that_cannot_agree_says_torn() -> None:
    """A writer that stopped half-way and whose older copies are gone: TornRead."""

    class Stuck(Daemons):
        def _advance(self) -> None:
            pass

    daemons = Stuck(random.Random(0), 2)
    daemons.shards[0] = ShardModel(copies=[3], received={1, 2, 3})
    daemons.shards[1] = ShardModel(copies=[2], received={1, 2})
    pieces = pieces_of(2)
    first = [drive(daemons.one(p, 0, True)) for p in pieces]
    with pytest.raises(TornRead, match="different whole-tensor writes"):
        drive(agree("t", pieces, first, daemons.one, daemons.runner()))
