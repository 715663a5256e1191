"""psd.membership: the rules that decide who is up, ready and primary (a fake clock, no I/O)."""

from __future__ import annotations

from irdma_psd.membership import Membership, MembershipListener

from irdma.cli.local import write_config
from irdma.cluster import ClusterConfig, ConfigInForce, load_config
from irdma.protocol import tensor_key

from .helpers.clock import Clock


class Record(MembershipListener):
    """What a listener was told, each with what ``seen()`` returned then."""

    def __init__(self, m: Membership, seen) -> None:
        self.lost: list = []
        self.ready: list = []
        self.changes: list = []
        self._seen = seen
        m.listen(self)

    def membership_lost(self) -> None:
        self.lost.append(self._seen())

    def became_ready(self) -> None:
        self.ready.append(self._seen())

    def peers_changed(self) -> None:
        self.changes.append(self._seen())


def config(tmp_path, nodes: int = 3, replicas: int = 2) -> ClusterConfig:
    return load_config(write_config(tmp_path, nodes, replicas=replicas))


def test_a_peer_is_down_after_failure_timeout_of_silence(tmp_path) -> None:
    cfg = config(tmp_path)
    clock = Clock()
    m = Membership(ConfigInForce(cfg), "n1", clock)
    assert not m.up("n2")  # never heard of
    m.heard("n2", ready=True)
    clock.now = cfg.failure_timeout - 0.01
    assert m.up("n2") and m.peer_ready("n2")
    clock.now = cfg.failure_timeout + 0.01
    assert not m.up("n2") and not m.peer_ready("n2")


def test_quorum_needs_a_majority_heard_within_the_lease(tmp_path) -> None:
    cfg = config(tmp_path, nodes=5)
    clock = Clock()
    m = Membership(ConfigInForce(cfg), "n1", clock)
    m.heard("n2")
    assert not m.has_quorum()  # 2 of 5
    m.heard("n3")
    assert m.has_quorum()  # 3 of 5
    # The lease is shorter than the failure timeout: the cut-off side
    # stops before the others declare it down.
    clock.now = m.lease + 0.01
    assert not m.has_quorum()
    assert m.up("n2")


def test_a_daemon_cut_off_past_the_grace_is_not_ready_and_says_so(tmp_path) -> None:
    cfg = config(tmp_path)
    clock = Clock()
    m = Membership(ConfigInForce(cfg), "n1", clock)
    told = Record(m, lambda: clock.now)
    m.heard("n2", ready=True)
    m.became_ready()
    clock.now = m.grace + m.lease + 0.01  # e.g. SIGSTOP for that long
    # The first message after the pause must not hide the pause.
    m.heard("n2", ready=True)
    assert not m.ready and told.lost == [clock.now]


def test_catching_up_done_is_told_at_once_with_the_state_already_ready(tmp_path) -> None:
    """The server rewrites its directory's serving word when told, so a client told
    "ready" by HELLO never finds the word still unset."""
    m = Membership(ConfigInForce(config(tmp_path)), "n1", Clock())
    told = Record(m, lambda: m.ready)
    assert not m.ready
    m.became_ready()
    assert told.ready == [True]


def test_a_daemon_cut_off_past_the_grace_is_not_ready_even_while_its_lease_ran(
    tmp_path,
) -> None:
    """Counted from its last contact with a majority, not from when its lease last
    held: healed after the grace but before the peers' failure timeout (when they may
    already have taken its shards over), it must catch up, not serve as primary."""
    cfg = config(tmp_path)
    clock = Clock()
    m = Membership(ConfigInForce(cfg), "n1", clock)
    told = Record(m, lambda: clock.now)
    m.heard("n2", ready=True)
    m.heard("n3", ready=True)
    m.became_ready()
    while clock.now < m.grace + 0.01:  # cut off; the heartbeat tick keeps observing
        clock.now += cfg.heartbeat / 2
        m.observe()
    assert clock.now < cfg.failure_timeout
    m.heard("n2", ready=True)  # healed
    assert not m.ready and len(told.lost) == 1


def test_acting_primary_is_the_first_ready_replica(tmp_path) -> None:
    cfg = config(tmp_path)
    clock = Clock()
    key = tensor_key("m/w")
    first, second = (n.name for n in cfg.replicas_for(key, 0))
    me = next(n.name for n in cfg.nodes if n.name not in (first, second))
    m = Membership(ConfigInForce(cfg), me, clock)
    m.heard(first, ready=True)
    m.heard(second, ready=True)
    assert m.acting_primary(key, 0).name == first
    m.heard(first, ready=False)  # catching up after a pause
    assert m.acting_primary(key, 0).name == second
    clock.now = cfg.failure_timeout + 0.01
    assert m.acting_primary(key, 0) is None


def test_a_late_heartbeat_cannot_undo_a_newer_state(tmp_path) -> None:
    cfg = config(tmp_path)
    m = Membership(ConfigInForce(cfg), "n1", Clock())
    m.heard("n2", ready=True, stamp=(7, 5))  # the handoff: ready
    m.heard("n2", ready=False, stamp=(7, 4))  # built earlier, delivered later
    assert m.peer_ready("n2")
    m.heard("n2", ready=False, stamp=(7, 6))  # a newer report counts
    assert not m.peer_ready("n2")
    m.heard("n2", ready=True, stamp=(8, 1))  # restarted: a new boot counts whatever its seq
    assert m.peer_ready("n2")


def test_one_copy_per_shard_needs_no_membership(tmp_path) -> None:
    cfg = config(tmp_path, replicas=1)
    m = Membership(ConfigInForce(cfg), "n1", Clock())
    assert m.ready and m.has_quorum()


def leased_config(tmp_path) -> ClusterConfig:
    path = write_config(tmp_path, 3, replicas=2)
    path.write_text(path.read_text() + '\n[etcd]\nendpoints = ["http://127.0.0.1:2379"]\n')
    return load_config(path)


def test_with_etcd_a_peer_is_up_while_registered_whatever_the_heartbeats(tmp_path) -> None:
    cfg = leased_config(tmp_path)
    clock = Clock()
    m = Membership(ConfigInForce(cfg), "n1", clock)
    m.heard("n3", ready=True)  # a ping alone does not make it up
    assert not m.up("n3")
    told = Record(m, lambda: m.registered)
    m.saw_registered(frozenset({"n1", "n2"}))
    assert m.up("n2") and not m.up("n3")
    clock.now = 10 * cfg.failure_timeout  # no heartbeat for ages: still up
    assert m.up("n2")
    m.saw_registered(frozenset({"n1", "n2"}))  # the same: no change reported
    assert told.changes == [frozenset({"n1", "n2"})]


def test_with_etcd_a_daemon_resumed_past_its_lease_refuses_before_anything_runs(
    tmp_path,
) -> None:
    """The check is against the clock, not a flag a task clears: a daemon stopped
    (SIGSTOP) past its lease's deadline refuses its first update after SIGCONT."""
    cfg = leased_config(tmp_path)
    clock = Clock()
    m = Membership(ConfigInForce(cfg), "n1", clock)
    told = Record(m, lambda: clock.now)
    assert not m.has_quorum()  # not registered yet
    m.holds_lease_until(2.0)
    m.became_ready()
    clock.now = 1.9
    assert m.has_quorum() and m.ready
    clock.now = 2.0  # e.g. resumed after a pause, before any renewal ran
    assert not m.has_quorum()
    assert not m.ready and told.lost == [2.0]
