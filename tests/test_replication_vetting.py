"""psd.replication.vetting: whose forwarded updates and shard copies a daemon takes
(a real store and membership, a fake clock, no daemons)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from irdma_psd.errors import Refusal
from irdma_psd.main import build_store
from irdma_psd.membership import Membership
from irdma_psd.replication import CopyCounts
from irdma_psd.replication.vetting import (
    Vetting,
    check_same_epoch,
    refuse_unless_replicated,
    sender_id,
    sender_name,
)

from irdma.cli.local import write_config
from irdma.cluster import ClusterConfig, ConfigInForce, load_config
from irdma.protocol import Status

from .helpers.clock import Clock


def config(tmp_path: Path, replicas: int = 2, etcd: bool = False) -> ClusterConfig:
    path = write_config(tmp_path, 3, replicas=replicas, arena_size=1 << 20)
    if etcd:
        path.write_text(path.read_text() + '\n[etcd]\nendpoints = ["http://127.0.0.1:9"]\n')
    return load_config(path)


def shard_placed(cfg: ClusterConfig, order: tuple[str, ...]) -> tuple[int, int]:
    """A (key, shard) whose replicas are ``order``, in that order."""
    for key in range(1, 10_000):
        if tuple(n.name for n in cfg.replicas_for(key, 0)) == order:
            return key, 0
    raise AssertionError(f"no shard placed on {order}")


class Setup:
    def __init__(self, cfg: ClusterConfig) -> None:
        self.config = cfg
        self.clock = Clock()
        in_force = ConfigInForce(cfg)
        self.membership = Membership(in_force, "n1", self.clock)
        self.store = build_store(in_force, cfg.node("n1"))
        self.asked: set[str] = set()
        self.vetting = Vetting(
            in_force, "n1", self.store, self.membership, ["n2", "n3"], self.asked, CopyCounts()
        )

    def refused(self, status: Status, sender: str, key: int, shard: int, whole: bool = False):
        with pytest.raises(Refusal) as caught:
            self.vetting.check_sender(sender_id(self.config, sender), key, shard, whole=whole)
        assert caught.value.status == status, caught.value
        return caught.value

    def taken(self, sender: str, key: int, shard: int, whole: bool = False) -> None:
        self.vetting.check_sender(sender_id(self.config, sender), key, shard, whole=whole)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(config(tmp_path))
    try:
        yield s
    finally:
        s.store.arena.close()


def test_senders_are_named_by_their_place_in_the_node_list(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert [sender_id(cfg, n) for n in ("n1", "n2", "n3")] == [0, 1, 2]
    assert sender_name(cfg, ["n2", "n3"], 2) == "n3"
    assert sender_name(cfg, ["n2", "n3"], 3) is None


def test_with_etcd_senders_are_named_by_a_hash_of_their_name(tmp_path: Path) -> None:
    """The node list changes from epoch to epoch: an index would name another daemon."""
    cfg = config(tmp_path, etcd=True)
    ids = {n: sender_id(cfg, n) for n in ("n1", "n2", "n3")}
    assert len(set(ids.values())) == 3 and all(0 <= i < 1 << 31 for i in ids.values())
    assert sender_name(cfg, ["n2", "n3"], ids["n3"]) == "n3"
    assert sender_name(cfg, ["n2"], ids["n3"]) is None  # not a peer (any more)


def test_one_copy_per_shard_refuses_replication_messages(tmp_path: Path) -> None:
    with pytest.raises(Refusal, match="keeps one copy of each shard") as caught:
        refuse_unless_replicated(config(tmp_path, replicas=1), "heartbeat")
    assert caught.value.status == Status.BAD_OP


def test_copies_go_only_between_daemons_of_one_epoch(tmp_path: Path) -> None:
    check_same_epoch(config(tmp_path), "n1", "n2", None)  # no etcd: no epochs
    cfg = config(tmp_path, etcd=True)  # no epoch adopted yet: number 0
    check_same_epoch(cfg, "n1", "n2", 0)
    with pytest.raises(Refusal, match="n1 is at epoch 0, n2 at 3") as caught:
        check_same_epoch(cfg, "n1", "n2", 3)
    assert caught.value.status == Status.RECOVERING


def test_a_sender_that_is_no_daemon_or_this_one_is_a_bad_argument(setup: Setup) -> None:
    key, shard = shard_placed(setup.config, ("n2", "n1"))
    with pytest.raises(Refusal, match="unknown daemon #7"):
        setup.vetting.check_sender(7, key, shard)
    setup.refused(Status.BAD_ARGUMENT, "n1", key, shard)


def test_a_copy_of_a_shard_not_kept_here_or_not_the_senders_is_refused(setup: Setup) -> None:
    setup.membership.heard("n2", ready=True)
    setup.membership.heard("n3", ready=True)
    elsewhere = shard_placed(setup.config, ("n2", "n3"))
    error = setup.refused(Status.NOT_OWNER, "n2", *elsewhere)
    assert "n1 keeps no copy" in str(error)
    not_theirs = shard_placed(setup.config, ("n1", "n2"))
    error = setup.refused(Status.NOT_OWNER, "n3", *not_theirs)
    assert "n3 is not a replica" in str(error)


def test_while_catching_up_copies_come_from_ready_replicas_or_the_one_asked(
    setup: Setup,
) -> None:
    key, shard = shard_placed(setup.config, ("n2", "n1"))
    setup.membership.heard("n2", ready=False)
    assert not setup.membership.ready
    error = setup.refused(Status.NOT_OWNER, "n2", key, shard, whole=True)
    assert "catching up" in str(error)
    setup.asked.add("n2")  # it asked n2 for its copies
    setup.taken("n2", key, shard, whole=True)
    setup.asked.clear()
    setup.membership.heard("n2", ready=True)
    setup.taken("n2", key, shard)


def test_a_ready_daemon_takes_a_shard_only_from_its_ready_primary(setup: Setup) -> None:
    m = setup.membership
    m.heard("n2", ready=True)
    m.heard("n3", ready=True)
    m.became_ready()
    theirs = shard_placed(setup.config, ("n2", "n1"))
    setup.taken("n2", *theirs)
    setup.taken("n2", *theirs, whole=True)
    # This daemon is the acting primary of a shard: nobody else forwards it updates.
    mine = shard_placed(setup.config, ("n1", "n2"))
    error = setup.refused(Status.NOT_OWNER, "n2", *mine)
    assert "from n1, not n2" in str(error)
    # A primary that went quiet past the failure timeout is no longer taken from: this
    # daemon (ready, hearing n3 all along) is the shard's acting primary now.
    step = setup.config.heartbeat
    while setup.clock.now <= setup.config.failure_timeout:
        setup.clock.now += step
        m.heard("n3", ready=True)
    assert m.ready and not m.up("n2")
    error = setup.refused(Status.NOT_OWNER, "n2", *theirs)
    assert "from n1, not n2" in str(error)
