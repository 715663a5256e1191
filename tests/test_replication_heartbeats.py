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
from irdma.cluster import load_config
from irdma.protocol import Status


@pytest.fixture
def replicator(tmp_path: Path) -> Iterator[Replicator]:
    config = load_config(write_config(tmp_path, 3, replicas=2, arena_size=1 << 20))
    node = config.node("n1")
    store = build_store(config, node)
    try:
        yield Replicator(config, node, store)
    finally:
        store.arena.close()


def beat(ready: bool, seq: int, handoff: bool = False) -> dict:
    return {"node": "n2", "ready": ready, "handoff": handoff, "boot": 5, "seq": seq, "epoch": 0}


async def test_a_heartbeat_says_this_daemons_state_in_order(replicator: Replicator) -> None:
    first = Heartbeat.decode(replicator.heartbeats.body())
    second = Heartbeat.decode(replicator.heartbeats.body())
    assert (first.node, first.ready, first.epoch) == ("n1", False, 0)
    assert second.boot == first.boot and second.seq == first.seq + 1
    with replicator.heartbeats.announcing():  # a handoff: ready said before acted on
        assert Heartbeat.decode(replicator.heartbeats.body()).ready
    assert not Heartbeat.decode(replicator.heartbeats.body()).ready


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
