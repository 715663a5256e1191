"""psd.replication.catchup_plan: which shards a catch-up copies from whom (pure, no daemons)."""

from __future__ import annotations

from collections.abc import Callable

from irdma_psd.replication.catchup_plan import Plan, Report, Undecided, plan

# Every shard of tensor 1 and 2 is placed on n1, n2, n3 in that order unless a test says.
ORDER = ("n1", "n2", "n3")


def replicas(order: tuple[str, ...] = ORDER) -> Callable[[int, int], tuple[str, ...]]:
    return lambda key, index: order


def primary(name: str | None) -> Callable[[int, int], str | None]:
    return lambda key, index: name


def test_a_served_shard_is_copied_from_its_acting_primary_only() -> None:
    """n1 catches up; n2 (the acting primary) and n3 are ready. n3's copy is newer than
    n2's report (say a forward n2 sent n3 was counted there first), yet n2's is taken:
    a backup's copy may lag forwards the primary already sent here."""
    mine = {(1, 0): (3, 0xAA)}
    reports = {
        "n2": Report(True, {(1, 0): (5, 0xBB)}),
        "n3": Report(True, {(1, 0): (6, 0xCC)}),
    }
    decided = plan("n1", mine, reports, replicas(), primary("n2"))
    assert decided == Plan({"n2": [(1, 0)]}, [])


def test_nothing_is_copied_where_the_primary_holds_the_same_copy() -> None:
    mine = {(1, 0): (5, 0xBB)}
    reports = {"n2": Report(True, {(1, 0): (5, 0xBB)})}
    assert plan("n1", mine, reports, replicas(), primary("n2")) == Plan({}, [])


def test_the_same_version_with_other_bytes_is_copied() -> None:
    mine = {(1, 0): (5, 0x01)}
    reports = {"n2": Report(True, {(1, 0): (5, 0x02)})}
    assert plan("n1", mine, reports, replicas(), primary("n2")) == Plan({"n2": [(1, 0)]}, [])


def test_a_shard_deleted_while_this_daemon_was_away_is_dropped() -> None:
    """The primary answered without it, and says the tensor was deleted (a tombstone)."""
    mine = {(1, 0): (5, 0xBB), (2, 0): (1, 0x11)}
    reports = {"n2": Report(True, {(2, 0): (1, 0x11)}, deleted=frozenset({1}))}
    assert plan("n1", mine, reports, replicas(), primary("n2")) == Plan({}, [(1, 0)])


def test_a_shard_its_primary_lost_is_given_to_it_not_dropped() -> None:
    """The systemd guest's second failure: the primary answered ready without the shard
    and without a tombstone (it restarted empty and took its role back before this
    daemon had caught up). Its answer is no word that the tensor was deleted: this
    copy, the only one left, goes to the primary instead of being dropped."""
    mine = {(1, 0): (5, 0xBB), (2, 0): (1, 0x11)}
    reports = {"n2": Report(True, {(2, 0): (1, 0x11)})}
    decided = plan("n1", mine, reports, replicas(), primary("n2"))
    assert decided == Plan({}, [], {"n2": [(1, 0)]})


def test_a_lost_shard_is_given_from_the_newest_copy() -> None:
    """Two copies survive the primary's loss: the newer (n3's) is taken here first, and
    given next round; the older is never given."""
    mine = {(1, 0): (5, 0xBB)}
    reports = {"n2": Report(True, {}), "n3": Report(False, {(1, 0): (7, 0xCC)})}
    decided = plan("n1", mine, reports, replicas(), primary("n2"))
    assert decided == Plan({"n3": [(1, 0)]}, [])
    now = {(1, 0): (7, 0xCC)}
    assert plan("n1", now, reports, replicas(), primary("n2")) == Plan({}, [], {"n2": [(1, 0)]})


def test_nothing_is_decided_without_answers_from_a_majority() -> None:
    """The systemd guest's first step to losing data: n2, restarted empty, asked n1 and
    n3 while they were busy catching up; neither answered, and by the time it planned
    it heard neither (heartbeats late). With no report and nobody heard there was
    nothing to wait for: it planned to copy nothing and served its shards empty."""
    decided = plan("n2", {}, {}, placed(PAIRS), primary(None), heard=[], quorum=2)
    assert isinstance(decided, Undecided)
    assert decided.why == "only 1 of the 2 daemons a decision needs answered (no peer)"
    reports = {"n1": Report(False, {(2, 0): (1, 0x11)}, frozenset({"n1"}))}
    decided = plan("n2", {}, reports, placed(PAIRS), primary(None), heard=[], quorum=2)
    assert decided == Plan({"n1": [(2, 0)]}, [])


def test_it_waits_while_the_acting_primary_did_not_answer_ready() -> None:
    """Views differ for a moment: the primary this daemon sees is not among the ready
    replicas that answered. Nothing is decided, and nothing to say in the log."""
    mine = {(1, 0): (3, 0xAA)}
    reports = {"n3": Report(True, {(1, 0): (6, 0xCC)})}
    decided = plan("n1", mine, reports, replicas(), primary("n2"))
    assert isinstance(decided, Undecided)
    assert decided.waiting_for == ()
    assert "acting primary (n2)" in decided.why
    assert isinstance(plan("n1", mine, reports, replicas(), primary(None)), Undecided)


def test_with_nobody_serving_it_waits_for_every_replica() -> None:
    """The whole cluster starting: no ready replica, and n3 has not answered."""
    mine = {(1, 0): (3, 0xAA)}
    reports = {"n2": Report(False, {(1, 0): (4, 0xBB)})}
    decided = plan("n1", mine, reports, replicas(), primary(None))
    assert isinstance(decided, Undecided)
    assert decided.waiting_for == ("n3",)
    assert "n3" in decided.why and "tensor 0x1" in decided.why


def test_with_nobody_serving_it_the_highest_version_wins() -> None:
    mine = {(1, 0): (3, 0xAA), (2, 0): (9, 0x99)}
    reports = {
        "n2": Report(False, {(1, 0): (4, 0xBB), (2, 0): (2, 0x22)}),
        "n3": Report(False, {(1, 0): (7, 0xCC)}),
    }
    decided = plan("n1", mine, reports, replicas(), primary(None))
    # Tensor 2's newest copy is this daemon's own: nothing to copy for it.
    assert decided == Plan({"n3": [(1, 0)]}, [])


def test_a_shard_this_daemon_lacks_is_copied() -> None:
    reports = {"n2": Report(True, {(1, 0): (2, 0x12), (1, 1): (1, 0x34)})}
    decided = plan("n1", {}, reports, replicas(), primary("n2"))
    assert decided == Plan({"n2": [(1, 0), (1, 1)]}, [])
    assert isinstance(decided, Plan) and decided.copies == 2


def test_only_the_shards_the_filter_accepts_are_considered() -> None:
    """A move's gains: just the shards this daemon gains are copied, and a shard that
    would block the decision is not looked at."""
    reports = {
        "n2": Report(True, {(1, 0): (2, 0x12)}),
        "n3": Report(True, {(2, 0): (1, 0x34)}),
    }

    def acting(key: int, index: int) -> str | None:
        return "n2" if key == 1 else "n9"  # tensor 2's primary did not answer

    decided = plan("n1", {}, reports, replicas(), acting, only=lambda key, index: key == 1)
    assert decided == Plan({"n2": [(1, 0)]}, [])
    assert isinstance(plan("n1", {}, reports, replicas(), acting), Undecided)


def test_copies_are_grouped_by_source_in_shard_order() -> None:
    """Each shard from its own acting primary; a source's shards in (key, index) order."""
    reports = {
        "n2": Report(True, {(2, 1): (1, 1), (1, 0): (1, 1)}),
        "n3": Report(True, {(1, 1): (1, 1)}),
    }

    def acting(key: int, index: int) -> str:
        return "n3" if (key, index) == (1, 1) else "n2"

    decided = plan("n1", {}, reports, replicas(), acting)
    assert decided == Plan({"n2": [(1, 0), (2, 1)], "n3": [(1, 1)]}, [])


def test_this_daemon_not_placed_first_still_counts_only_the_others() -> None:
    """n1 is the last replica: its own name never becomes a source."""
    mine = {(1, 0): (1, 0x1)}
    reports = {"n2": Report(False, {(1, 0): (1, 0x1)}), "n3": Report(False, {})}
    decided = plan("n1", mine, reports, replicas(("n2", "n3", "n1")), primary(None))
    assert decided == Plan({}, [])


def placed(pairs: dict[tuple[int, int], tuple[str, str]]) -> Callable[[int, int], tuple[str, ...]]:
    return lambda key, index: pairs[key, index]


# n2 restarted empty (a SIGKILL under systemd): shard (1, 0) is placed on n2 and n3,
# shard (2, 0) on n2 and n1; n1 and n3 hold them at version 1.
PAIRS = {(1, 0): ("n2", "n3"), (2, 0): ("n2", "n1")}


def test_a_restarted_daemon_waits_for_a_daemon_its_peers_hear() -> None:
    """The systemd guest's failure: n2 came back empty, heard n3 before n1, planned with
    n3's answer alone, copied (1, 0), called itself caught up and served (2, 0) as its
    primary without it ("shards behind": n1 at 1, n2 none). n3's answer says it hears
    n1: nothing is decided until n1 answered too."""
    reports = {"n3": Report(True, {(1, 0): (1, 0xCC)}, frozenset({"n1", "n3"}))}
    decided = plan("n2", {}, reports, placed(PAIRS), primary("n3"), heard=["n3"])
    assert decided == Undecided("n1 may hold shards placed here and did not answer", ("n1",))


def test_a_daemon_heard_here_that_did_not_answer_is_waited_for() -> None:
    reports = {"n3": Report(True, {(1, 0): (1, 0xCC)}, frozenset({"n3"}))}
    decided = plan("n2", {}, reports, placed(PAIRS), primary("n3"), heard=["n1", "n3"])
    assert isinstance(decided, Undecided) and decided.waiting_for == ("n1",)


def test_once_every_daemon_heard_answered_each_shard_comes_from_its_primary() -> None:
    up = frozenset({"n1", "n3"})
    reports = {
        "n3": Report(True, {(1, 0): (1, 0xCC)}, up),
        "n1": Report(True, {(2, 0): (1, 0x11)}, up),
    }

    def acting(key: int, index: int) -> str:
        return {1: "n3", 2: "n1"}[key]

    decided = plan("n2", {}, reports, placed(PAIRS), acting, heard=["n1", "n3"])
    assert decided == Plan({"n3": [(1, 0)], "n1": [(2, 0)]}, [])


def test_a_daemon_nobody_hears_is_not_waited_for() -> None:
    """n1 is down for everyone: the shards n2 shares with it wait for it (the whole
    cluster starting rule) only where n2 knows of them; the rest goes on."""
    reports = {"n3": Report(True, {(1, 0): (1, 0xCC)}, frozenset({"n3"}))}
    decided = plan("n2", {}, reports, placed(PAIRS), primary("n3"), heard=["n3"])
    assert decided == Plan({"n3": [(1, 0)]}, [])
