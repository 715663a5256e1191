"""psd.replication.forwarding: what an update's acknowledgement waits for, and which
backups its forwards are queued for (a real replicator and store, no daemons)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
import trio.testing
from irdma_psd.errors import Refusal
from irdma_psd.main import build_store
from irdma_psd.replication import Item, Replicator
from irdma_psd.store import Store

from irdma.cli.local import write_config
from irdma.cluster import ConfigInForce, load_config

from .helpers.clock import Clock
from .helpers.stores import commit


def test_an_update_queued_before_a_loss_of_readiness_is_never_acknowledged(
    tmp_path: Path,
) -> None:
    """Found by tests/test_elastic.py: a primary applied an update, a backup refused the
    forward (it saw the next epoch), the primary gave up being ready, caught up at
    once (it had nothing to catch up on) and, ready again when the wait ended,
    acknowledged the update no copy kept. The wait remembers the loss."""
    path = write_config(tmp_path, 3, replicas=2, arena_size=1 << 20)
    path.write_text(path.read_text() + '\n[etcd]\nendpoints = ["http://127.0.0.1:9"]\n')
    config = load_config(path)
    in_force = ConfigInForce(config)
    node = config.node("n1")
    store = build_store(in_force, node)
    try:
        replicator = Replicator(in_force, node, store)
        replicator.membership.holds_lease_until(time.monotonic() + 60)
        replicator.membership.ready = True  # as after catching up

        async def main() -> None:
            forwarding = replicator.forwarding
            delivered = Item(1, 0, None, losses=forwarding.losses)
            delivered.delivered = True
            delivered.done.set()
            await forwarding.wait([delivered])  # delivered: acknowledged
            skipped = Item(1, 0, None, losses=forwarding.losses)
            replicator.membership.lose()  # a refusal made it give up being ready...
            skipped.done.set()
            replicator.membership.ready = True  # ...and it is ready again already
            with pytest.raises(Refusal, match="not acknowledged"):
                await forwarding.wait([skipped])
            refused = Item(1, 0, None, losses=forwarding.losses)
            refused.refused = True
            refused.done.set()
            with pytest.raises(Refusal, match="not acknowledged"):
                await forwarding.wait([refused])

        trio.run(main)
    finally:
        store.arena.close()


def test_forwards_are_queued_in_order_for_the_backups_that_are_up(tmp_path: Path) -> None:
    """Three copies of every shard, n1 primary: each update goes to n2 and n3 while they
    are registered, in the order applied; one that leaves holds no acknowledgement up."""
    path = write_config(tmp_path, 3, replicas=3, arena_size=1 << 20)
    path.write_text(path.read_text() + '\n[etcd]\nendpoints = ["http://127.0.0.1:9"]\n')
    config = load_config(path)
    in_force = ConfigInForce(config)
    node = config.node("n1")
    store = build_store(in_force, node)
    try:
        replicator = Replicator(in_force, node, store)
        m, forwarding = replicator.membership, replicator.forwarding
        m.holds_lease_until(time.monotonic() + 60)
        m.saw_registered(frozenset({"n2", "n3"}))
        m.became_ready()

        async def main() -> None:
            first, second = commit(1, 0, 1), commit(1, 0, 2)
            items = forwarding.forward([first, second])
            assert len(items) == 4
            for name in ("n2", "n3"):
                queued = list(replicator.peers[name].queue)
                assert [i.commit for i in queued] == [first, second]
            m.saw_registered(frozenset({"n2"}))  # n3 left: its forwards are let go
            assert len(replicator.peers["n3"].queue) == 0
            assert sum(i.done.is_set() and not i.delivered for i in items) == 2
            waited: list[str] = []

            async def acknowledge() -> None:
                await forwarding.wait(items)
                waited.append("acknowledged")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(acknowledge)
                await trio.testing.wait_all_tasks_blocked()
                assert waited == []  # n2 has neither yet
                queue = replicator.peers["n2"].queue
                for _ in range(2):
                    item = await queue.first()
                    item.delivered = True
                    queue.done(item)
            assert waited == ["acknowledged"]

        trio.run(main)
    finally:
        store.arena.close()


def ready_primary_of_a_shard_on_n2(
    in_force: ConfigInForce, store: Store
) -> tuple[Replicator, Clock, int]:
    """n1's replicator, ready, hearing n2 and n3 on a fake clock, and a key whose shard 0
    is placed on n1 then n2."""
    config = in_force.config
    replicator = Replicator(in_force, config.node("n1"), store)
    m = replicator.membership
    clock = Clock()
    m.clock = clock
    m.heard("n2", True)
    m.heard("n3", True)
    m.became_ready()
    key = next(
        k for k in range(1, 1000) if [n.name for n in config.replicas_for(k, 0)] == ["n1", "n2"]
    )
    return replicator, clock, key


def test_a_forward_in_flight_when_its_backup_went_down_owes_it_a_resync(tmp_path: Path) -> None:
    """The forward being sent when its backup is declared down fails and is given up
    (acknowledged without it) before the tick lets go of the rest of the queue, which
    is then empty: the sending task itself notes the resync owed. (n2's address has no
    daemon: its link fails as a silent one's does, at once.)"""
    config = load_config(write_config(tmp_path, 3, replicas=2, arena_size=1 << 20))
    in_force = ConfigInForce(config)
    store = build_store(in_force, config.node("n1"))
    try:
        replicator, clock, key = ready_primary_of_a_shard_on_n2(in_force, store)
        m, forwarding = replicator.membership, replicator.forwarding
        (item,) = forwarding.forward([commit(key, 0, 1)])  # for n2
        # n2 silent past the failure timeout, n3 heard all along (the tick not run yet).
        while clock.now <= config.failure_timeout:
            clock.now += config.heartbeat
            m.heard("n3", True)
        assert not m.up("n2") and m.ready

        async def main() -> None:
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    replicator.serve_in(nursery)
                    nursery.start_soon(forwarding.run, replicator.peers["n2"])
                    await item.done.wait()
                    nursery.cancel_scope.cancel()

        trio.run(main)
        assert not item.delivered and len(replicator.peers["n2"].queue) == 0
        assert forwarding.debts.owes("n2") and not forwarding.debts.owes("n3")
    finally:
        store.arena.close()


def test_a_primary_resumed_after_a_pause_owes_nothing_to_the_peers_it_stopped_hearing(
    tmp_path: Path,
) -> None:
    """Seen in the nemesis with the cores busy (seed 1618600898): a primary resumed after
    SIGSTOP found its forward to a backup timed out and the backup 'down' (it had heard
    nobody for the pause), and said it owed it a resync; the backup, which had taken
    the primary's shards over meanwhile, gave up being ready. A daemon that has no
    majority is not acknowledging anything: it gives up being ready and owes nothing."""
    config = load_config(write_config(tmp_path, 3, replicas=2, arena_size=1 << 20))
    in_force = ConfigInForce(config)
    store = build_store(in_force, config.node("n1"))
    try:
        replicator, clock, key = ready_primary_of_a_shard_on_n2(in_force, store)
        m, forwarding = replicator.membership, replicator.forwarding
        (item,) = forwarding.forward([commit(key, 0, 1)])
        clock.now += config.failure_timeout + 0.01  # paused: it heard nobody since
        forwarding.let_go_of_down_peers()  # the tick, first thing after the pause
        assert item.done.is_set() and not m.ready
        assert not forwarding.debts.owes("n2")
        assert forwarding.forward([commit(key, 0, 2)]) == []  # none up; not acknowledged
        assert not forwarding.debts.owes("n2")
    finally:
        store.arena.close()
