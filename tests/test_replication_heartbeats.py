"""psd.replication.heartbeats: what a heartbeat says and how one is answered (a real
replicator and store, its peers never started: no daemons)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from irdma_psd.errors import Refusal
from irdma_psd.main import build_store
from irdma_psd.replication import Replicator
from irdma_psd.replication.bodies import Heartbeat

from irdma.cli.local import write_config
from irdma.cluster import ClusterConfig, ConfigInForce, load_config
from irdma.protocol import Header, Op, Status, decode_json

from .helpers.clock import Clock
from .helpers.stores import commit


@pytest.fixture
def replicator(tmp_path: Path) -> Iterator[Replicator]:
    config = load_config(write_config(tmp_path, 3, replicas=2, arena_size=1 << 20))
    in_force = ConfigInForce(config)
    node = config.node("n1")
    store = build_store(in_force, node)
    try:
        yield Replicator(in_force, node, store)
    finally:
        store.arena.close()


def beat(ready: bool, seq: int, handoff: bool = False) -> dict:
    return {"node": "n2", "ready": ready, "handoff": handoff, "boot": 5, "seq": seq, "epoch": 0}


async def test_a_heartbeat_says_this_daemons_state_in_order(replicator: Replicator) -> None:
    first = Heartbeat.decode(replicator.heartbeats.body("n2"))
    second = Heartbeat.decode(replicator.heartbeats.body("n2"))
    assert (first.node, first.ready, first.epoch) == ("n1", False, 0)
    assert second.boot == first.boot and second.seq == first.seq + 1
    with replicator.heartbeats.announcing():  # a handoff: ready said before acted on
        assert Heartbeat.decode(replicator.heartbeats.body("n2")).ready
    assert not Heartbeat.decode(replicator.heartbeats.body("n2")).ready


async def test_a_late_heartbeat_does_not_undo_a_newer_one(replicator: Replicator) -> None:
    answer = await replicator.heartbeats.received(beat(True, seq=2))
    assert Heartbeat.decode(answer).node == "n1"
    assert replicator.membership.peer_ready("n2")
    await replicator.heartbeats.received(beat(False, seq=1))  # built before seq 2
    assert replicator.membership.peer_ready("n2")
    await replicator.heartbeats.received(beat(False, seq=3))
    assert not replicator.membership.peer_ready("n2")


async def test_a_handoff_is_answered_once_what_was_queued_for_the_peer_is_out(
    replicator: Replicator,
) -> None:
    await replicator.heartbeats.received(beat(False, seq=1))  # n2 is up, catching up
    (item,) = replicator.forwarding.send_whole("n2", [(1, 0)])
    answers: list[bytes] = []

    async def hand_off() -> None:
        answers.append(await replicator.heartbeats.received(beat(True, 2, handoff=True)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hand_off)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == []  # the shard queued for n2 is not out yet
        item.delivered = True
        replicator.peers["n2"].queue.done(item)
    assert len(answers) == 1 and Heartbeat.decode(answers[0]).node == "n1"


@pytest.mark.parametrize(
    "body, says",
    [
        ({"node": "n9", "ready": True}, "heartbeat from an unknown node 'n9'"),
        ({"node": "n1", "ready": True}, "heartbeat from an unknown node 'n1'"),
        ({"node": ["n2"]}, "heartbeat names no sending daemon"),
        ("n2", "heartbeat is not a JSON object"),
    ],
)
async def test_a_heartbeat_not_from_a_peer_is_refused(
    replicator: Replicator, body: object, says: str
) -> None:
    with pytest.raises(Refusal, match=says) as caught:
        await replicator.heartbeats.received(body)
    assert caught.value.status == Status.BAD_ARGUMENT


# -- a resync owed: the primary went on without a backup that stayed ready -------------


def placed(config: ClusterConfig, first: str, second: str) -> tuple[int, int]:
    """A shard whose replicas are ``first`` then ``second``."""
    key = next(k for k in range(1, 1000) if names(config, k) == [first, second])
    return key, 0


def names(config: ClusterConfig, key: int) -> list[str]:
    return [n.name for n in config.replicas_for(key, 0)]


def declare_n2_down(replicator: Replicator, clock: Clock) -> None:
    """n2 goes silent past the failure timeout while n3 keeps n1's majority; the tick
    lets go of what was queued for n2."""
    config = replicator.in_force.config
    until = clock.now + config.failure_timeout + 0.01
    while clock.now < until:
        clock.now = min(until, clock.now + config.heartbeat)
        replicator.membership.heard("n3", True)
    assert not replicator.membership.up("n2") and replicator.membership.has_quorum()
    replicator.forwarding.let_go_of_down_peers()


def primary_with_n2_up(replicator: Replicator) -> Clock:
    clock = Clock()
    m = replicator.membership
    m.clock = clock
    m.heard("n2", True)
    m.heard("n3", True)
    m.became_ready()
    return clock


def says_resync(answer: bytes) -> bool:
    return Heartbeat.decode(answer).resync


async def test_a_backup_whose_forwards_were_dropped_is_told_until_its_catch_up_covers_them(
    replicator: Replicator,
) -> None:
    """The nemesis under CPU load: the primary heard its backup too late, declared it
    down and dropped its queue, acknowledging without it; the backup kept a majority
    and stayed ready, stale. The primary's heartbeats to it say it is owed a resync
    until a catch-up that asked after the drop hands off."""
    clock = primary_with_n2_up(replicator)
    forwarding, heartbeats = replicator.forwarding, replicator.heartbeats
    (item,) = forwarding.forward([commit(*placed(replicator.in_force.config, "n1", "n2"), 7)])
    assert not says_resync(heartbeats.body("n2"))  # queued: nothing owed yet
    declare_n2_down(replicator, clock)
    assert item.done.is_set() and not item.delivered  # acknowledged without n2
    assert says_resync(heartbeats.body("n2"))
    assert not says_resync(heartbeats.body("n3"))
    # n2 is heard again (its link healed): the answer to its heartbeat says so too.
    assert says_resync(await heartbeats.received(beat(True, seq=1)))
    # n2 caught up and hands off: its catch-up asked n1 after the drop, so that settles it.
    replicator.service.answer({"node": "n2", "epoch": 0})
    assert not says_resync(await heartbeats.received(beat(True, seq=2, handoff=True)))
    assert not says_resync(heartbeats.body("n2"))


async def test_updates_applied_while_a_backup_is_down_owe_it_a_resync(
    replicator: Replicator,
) -> None:
    clock = primary_with_n2_up(replicator)
    declare_n2_down(replicator, clock)
    assert not says_resync(replicator.heartbeats.body("n2"))  # it missed nothing
    assert (
        replicator.forwarding.forward([commit(*placed(replicator.in_force.config, "n1", "n2"), 1)])
        == []
    )
    assert says_resync(replicator.heartbeats.body("n2"))


async def test_a_handoff_does_not_settle_a_resync_owed_after_its_catch_up_asked(
    replicator: Replicator,
) -> None:
    """The backup asked what the primary holds, then was declared down again while it
    copied, and the primary acknowledged an update without it: the copies it chose do
    not have it, so its handoff is answered with the resync still owed."""
    clock = primary_with_n2_up(replicator)
    shard = placed(replicator.in_force.config, "n1", "n2")
    forwarding, heartbeats = replicator.forwarding, replicator.heartbeats
    forwarding.forward([commit(*shard, 1)])
    declare_n2_down(replicator, clock)
    replicator.service.answer({"node": "n2", "epoch": 0})  # n2 catching up: up again
    declare_n2_down(replicator, clock)
    assert forwarding.forward([commit(*shard, 2)]) == []
    assert says_resync(await heartbeats.received(beat(True, seq=1, handoff=True)))
    replicator.service.answer({"node": "n2", "epoch": 0})  # it plans again
    assert not says_resync(await heartbeats.received(beat(True, seq=2, handoff=True)))


async def test_a_ready_daemon_told_it_is_owed_a_resync_gives_up_being_ready(
    replicator: Replicator,
) -> None:
    m = replicator.membership
    m.heard("n2", True)
    m.heard("n3", True)
    m.became_ready()
    await replicator.heartbeats.received(beat(True, seq=2) | {"resync": True})
    assert not m.ready
    assert "n2 acknowledged updates without it" in m.why_lost
    m.became_ready()  # caught up
    # A heartbeat n2 built before the one it answered the handoff with is not believed.
    await replicator.heartbeats.received(beat(True, seq=3))
    await replicator.heartbeats.received(beat(True, seq=1) | {"resync": True})
    assert m.ready


class Wire:
    """A link to another replicator in this process: a PING or CATCHUP is handed to
    its handler and the answer comes back (the links over TCP: test_replication)."""

    def __init__(self, other: Replicator) -> None:
        self.other = other

    async def request(
        self, header: Header, payload: list[bytes], *, timeout: float
    ) -> tuple[Header, bytes]:
        body = decode_json(b"".join(payload))
        if header.op == Op.PING:
            answer = await self.other.heartbeats.received(body)
        else:
            assert header.op == Op.CATCHUP, header
            answer = self.other.service.answer(body)
        return Header(op=header.op, status=Status.OK), answer

    def abandon(self, why: str, *, reset: bool = False) -> None:
        pass  # no connection to let go of


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Replicator, Replicator]]:
    """n1 and n2 of one cluster of three, each pinging the other over a ``Wire``."""
    config = load_config(write_config(tmp_path, 3, replicas=2, arena_size=1 << 20))
    in_force = ConfigInForce(config)
    nodes = [config.node(name) for name in ("n1", "n2")]
    stores = [build_store(in_force, node) for node in nodes]
    try:
        n1, n2 = (
            Replicator(in_force, node, store) for node, store in zip(nodes, stores, strict=True)
        )
        n1.peers["n2"].link = Wire(n2)  # type: ignore[assignment]
        n2.peers["n1"].link = Wire(n1)  # type: ignore[assignment]
        yield n1, n2
    finally:
        for store in stores:
            store.arena.close()


async def test_a_backup_learns_of_its_resync_from_its_own_heartbeat_and_hands_off_after(
    pair: tuple[Replicator, Replicator],
) -> None:
    """n1, primary, went on without n2; n2 hears of it in the answer to its own ping,
    gives up being ready, and its handoff is taken only once it asked n1 after that."""
    primary, backup = pair
    clock = primary_with_n2_up(primary)
    for name in ("n1", "n3"):
        backup.membership.heard(name, True)
    backup.membership.became_ready()
    primary.forwarding.forward([commit(*placed(primary.in_force.config, "n1", "n2"), 3)])
    declare_n2_down(primary, clock)
    to_primary = backup.peers["n1"]
    assert await backup.heartbeats.ping(to_primary)
    assert not backup.membership.ready  # it catches up
    # A handoff before its catch-up asked n1 anything is not taken.
    assert not await backup.heartbeats.ping(to_primary, handoff=True)
    async with trio.open_nursery() as nursery:
        backup.serve_in(nursery)  # where its link to n3 would run (n3 has no daemon)
        await backup.catchup.plan()  # asks n1 what it holds
        nursery.cancel_scope.cancel()
    with backup.heartbeats.announcing():
        assert await backup.heartbeats.ping(to_primary, handoff=True)
    assert not primary.forwarding.debts.owes("n2")
