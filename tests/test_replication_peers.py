"""psd.replication.peers and .queues: the peers by name, each with its forward queue
(no daemons)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing
from irdma_psd.replication import Item, PeerError
from irdma_psd.replication.links import Dialer
from irdma_psd.replication.peers import Peers
from irdma_psd.replication.queues import ForwardQueue

from irdma.cli.local import write_config
from irdma.cluster import Address, load_config

from .helpers.stores import commit


def peers(tmp_path: Path) -> Peers:
    cfg = load_config(write_config(tmp_path, 3, replicas=2))
    return Peers(cfg.nodes, "n1", Dialer("n1", None, 1.0))


async def test_a_queue_is_sent_in_order_and_drained() -> None:
    queue = ForwardQueue()
    first, second = queue.put(Item(1, 0, None)), queue.put(Item(1, 1, None))
    assert await queue.first() is first and len(queue) == 2
    drained = trio.Event()

    async def drain() -> None:
        await queue.drain()
        drained.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        queue.done(first)
        await trio.testing.wait_all_tasks_blocked()
        assert first.done.is_set() and not drained.is_set()  # the second is still out
        assert await queue.first() is second
        queue.done(second)
    assert drained.is_set() and len(queue) == 0


async def test_the_first_item_is_waited_for() -> None:
    queue = ForwardQueue()
    got: list[Item] = []

    async def take() -> None:
        got.append(await queue.first())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        item = queue.put(Item(2, 0, None))
    assert got == [item]


def test_skipping_wakes_every_waiter_without_delivering() -> None:
    queue = ForwardQueue()
    items = [queue.put(Item(1, i, None)) for i in range(3)]
    queue.skip_all()
    assert len(queue) == 0
    assert all(i.done.is_set() and not i.delivered for i in items)


def test_peers_are_the_other_daemons(tmp_path: Path) -> None:
    p = peers(tmp_path)
    assert list(p) == ["n2", "n3"]
    assert p.is_peer("n2") and not p.is_peer("n1") and not p.is_peer(["n2"])
    assert p.named("n3").name == "n3"


def test_a_peer_that_left_is_a_peer_error_and_its_queue_is_let_go(tmp_path: Path) -> None:
    p = peers(tmp_path)
    item = p["n2"].queue.put(Item(1, 0, None))
    scope = p["n2"].scope
    p.part("n2")
    assert item.done.is_set() and not item.delivered
    assert scope.cancel_called
    with pytest.raises(PeerError, match="n2 left the cluster"):
        p.named("n2")
    p.part("n2")  # parting again changes nothing


def test_a_peer_whose_address_changed_joins_anew(tmp_path: Path) -> None:
    p = peers(tmp_path)
    cfg = load_config(write_config(tmp_path / "again", 3, replicas=2))
    n2, n3 = p["n2"], p["n3"]
    moved = replace(cfg.node("n3"), address=Address("tcp", "127.0.0.1", 1))
    nodes = (cfg.node("n1"), n2.node, moved, replace(cfg.node("n2"), name="n4"))
    joined = p.follow(nodes)
    assert [peer.name for peer in joined] == ["n3", "n4"]
    assert p["n2"] is n2 and p["n3"] is not n3 and n3.scope.cancel_called


def test_cut_off_lets_go_of_every_queue(tmp_path: Path) -> None:
    p = peers(tmp_path)
    items = [p[name].queue.put(Item(1, 0, None)) for name in p]
    p.cut_off("n1 lost its majority")
    assert all(i.done.is_set() and not i.delivered for i in items)
    assert list(p) == ["n2", "n3"]  # still peers: only what was queued is gone


def test_what_is_taken_to_send_stays_within_the_window_of_bytes() -> None:
    """Items are taken oldest first while their bytes fit the room left (one at least),
    and whatever is not done goes again after a failure, in order."""
    queue = ForwardQueue()
    items = [
        queue.put(Item(1, i, replace(commit(1, i, 1), payload=np.zeros(100, np.uint8))))
        for i in range(4)
    ]
    assert queue.take_unsent(10, 250) == items[:2]
    assert queue.take_unsent(10, 50) == [items[2]]  # one at least, even past the room
    queue.done(items[0])
    queue.resend()
    assert queue.take_unsent(10, 1000) == items[1:]
