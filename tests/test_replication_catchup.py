"""psd.replication.catchup: asking the peers, taking copies, the handoff (a real
replicator and store; peers that have no daemon or left the cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from irdma_psd.main import build_store
from irdma_psd.replication import PeerError, Replicator
from irdma_psd.replication.catchup_plan import Undecided

from irdma.cli.local import write_config
from irdma.cluster import ConfigInForce, load_config


def test_a_peer_that_left_while_its_catch_up_question_was_starting_is_skipped(
    tmp_path: Path,
) -> None:
    """Found by the nemesis (drains and replacements with etcd): a catch-up asked every
    peer that was up, and a task started for one found it gone, as the new epoch had
    just let it go; the KeyError killed the daemon. A peer that left is now one that
    does not answer."""
    path = write_config(tmp_path, 3, replicas=2, arena_size=1 << 20)
    config = load_config(path)
    in_force = ConfigInForce(config)
    node = config.node("n1")
    store = build_store(in_force, node)
    try:
        replicator = Replicator(in_force, node, store)
        # The peers up when the tasks were started; n2 has left by the time they run.
        replicator.membership.up_peers = lambda now=None: ["n2", "n3"]  # type: ignore[method-assign]
        replicator.peers.part("n2")

        async def main() -> None:
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    replicator.serve_in(nursery)  # where its connections run
                    catchup = replicator.catchup
                    await catchup.plan()  # n3 has no daemon: no answer from either
                    await catchup.handoff()
                    with pytest.raises(PeerError, match="n2 left the cluster"):
                        await catchup.fetch("n2", [(1, 0)])
                    nursery.cancel_scope.cancel()

        trio.run(main)
    finally:
        store.arena.close()


def test_a_restarted_daemon_that_heard_its_peers_then_lost_them_decides_nothing(
    tmp_path: Path,
) -> None:
    """The systemd guest's data loss, first step: n2, restarted empty, heard n1 and n3
    (so it had a majority), asked them, got no answer (busy catching up themselves),
    and by the time it planned heard neither (heartbeats late on a loaded host). It
    planned to copy nothing, handed off to nobody and served its shards empty as
    their primary. The peers it asked count as heard, and a plan needs a majority's
    answers: nothing is decided."""
    path = write_config(tmp_path, 3, replicas=2, arena_size=1 << 20)
    config = load_config(path)
    in_force = ConfigInForce(config)
    node = config.node("n2")
    store = build_store(in_force, node)
    try:
        replicator = Replicator(in_force, node, store)
        views = iter([["n1", "n3"]])  # up when asked; nobody heard afterwards

        def up_peers(now: float | None = None) -> list[str]:
            return next(views, [])

        replicator.membership.up_peers = up_peers  # type: ignore[method-assign]

        async def main() -> None:
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    replicator.serve_in(nursery)
                    decided = await replicator.catchup.plan()  # n1, n3: no daemon
                    assert isinstance(decided, Undecided), decided
                    assert decided.waiting_for == ("n1", "n3")
                    nursery.cancel_scope.cancel()

        trio.run(main)
    finally:
        store.arena.close()
