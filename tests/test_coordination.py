"""psd.coordination: the rules of each training mode, without I/O."""

from __future__ import annotations

import pytest
from irdma_psd.coordination import Coordinator
from irdma_psd.errors import StoreError

from irdma.protocol import Status
from irdma.training.modes import Mode


def coord(mode: Mode, shards=(0, 1)) -> Coordinator[str]:
    return Coordinator("m/w", mode, list(shards))


def refused(status: Status, fn, *args, match: str | None = None) -> None:
    with pytest.raises(StoreError, match=match) as info:
        fn(*args)
    assert info.value.status == status


def test_async_applies_every_push_and_never_waits() -> None:
    c = coord(Mode())
    assert c.push(0, 0, 0, "a", 0.0) == ["a"]
    assert c.push(0, 0, 0, "b", 0.0) == ["b"]
    assert c.blockers(0, 0, 99) == []


def test_sync_holds_until_every_worker_pushed_then_returns_worker_order() -> None:
    c = coord(Mode.sync(3))
    assert c.push(0, 2, 0, "g2", 0.0) is None
    assert c.push(0, 0, 0, "g0", 0.0) is None
    assert c.blockers(0, 0, 1) == [1]  # worker 0 pushed; waits for worker 1
    assert c.push(0, 1, 0, "g1", 0.0) == ["g0", "g1", "g2"]
    assert c.step(0) == 1
    assert c.blockers(0, 0, 1) == []
    # Shards are independent: shard 1 is still at step 0.
    assert c.step(1) == 0
    refused(Status.BAD_STEP, c.blockers, 1, 0, 1, match="not pushed step 0")


def test_sync_refuses_pushes_for_the_wrong_step() -> None:
    c = coord(Mode.sync(2))
    refused(Status.BAD_STEP, c.push, 0, 0, 1, "x", 0.0, match="is ahead")
    c.push(0, 0, 0, "a", 0.0)
    refused(Status.BAD_STEP, c.push, 0, 0, 0, "again", 0.0, match="already pushed")
    c.push(0, 1, 0, "b", 0.0)
    refused(Status.BAD_STEP, c.push, 0, 1, 0, "late", 0.0, match="already applied")


def test_sync_reads_that_could_never_go_are_refused() -> None:
    c = coord(Mode.sync(2))
    assert c.blockers(0, 0, 0) == []  # step 0 is there from the start
    refused(Status.BAD_STEP, c.blockers, 0, 0, 1, match="not pushed step 0")
    c.push(0, 0, 0, "a", 0.0)
    refused(Status.BAD_STEP, c.blockers, 0, 0, 2, match="group is at step 0")


def test_workers_outside_the_mode_are_refused() -> None:
    c = coord(Mode.sync(2))
    refused(Status.BAD_ARGUMENT, c.push, 0, 2, 0, "x", 0.0, match="outside 0..1")


def test_ssp_waits_only_beyond_the_slack() -> None:
    c = coord(Mode.ssp(3, 1), shards=(0,))
    # Everyone at clock 0: a read for step 1 is within the slack.
    assert c.blockers(0, 0, 1) == []
    assert c.push(0, 0, 0, "a", 0.0) == ["a"]  # applied at once
    assert c.push(0, 0, 1, "b", 0.0) == ["b"]
    # Worker 0 finished 2 steps; step 2 needs everyone at clock >= 1.
    assert c.blockers(0, 0, 2) == [1, 2]
    c.push(0, 1, 0, "c", 0.0)
    assert c.blockers(0, 0, 2) == [2]
    c.push(0, 2, 0, "d", 0.0)
    assert c.blockers(0, 0, 2) == []
    refused(Status.BAD_STEP, c.blockers, 0, 1, 3, match="pushed only 1 steps")


def test_hybrid_groups_step_independently() -> None:
    c = coord(Mode.hybrid(4, 2), shards=(0,))
    assert c.push(0, 0, 0, "a0", 0.0) is None
    assert c.push(0, 1, 0, "a1", 0.0) == ["a0", "a1"]  # group 0 done; group 1 untouched
    assert c.step(0, worker=0) == 1 and c.step(0, worker=2) == 0
    assert c.push(0, 0, 1, "b0", 0.0) is None  # group 0 moves ahead of group 1
    assert c.push(0, 3, 0, "c3", 0.0) is None
    assert c.blockers(0, 3, 1) == [2]  # waits for its own group only
    assert c.push(0, 2, 0, "c2", 0.0) == ["c2", "c3"]


def test_silent_workers_are_lost_after_the_timeout() -> None:
    c = coord(Mode.sync(3, worker_timeout=10))
    c.push(0, 0, 0, "a", 100.0)
    c.push(0, 1, 0, "b", 100.0)
    blockers = c.blockers(0, 0, 1)
    assert blockers == [2]
    assert c.lost(blockers, 105.0) == []  # never seen: the grace starts now
    assert c.lost(blockers, 114.9) == []
    assert c.lost(blockers, 115.0) == [2]
    c.check_worker(2, 116.0)  # heard from again
    assert c.lost(blockers, 120.0) == []


def test_eviction_applies_held_steps_and_locks_the_worker_out() -> None:
    c = coord(Mode.sync(3))
    c.push(0, 0, 0, "a", 0.0)
    c.push(0, 1, 0, "b", 0.0)
    c.push(1, 0, 0, "x", 0.0)
    done = c.evict([2])
    assert done == {0: [(0, ["a", "b"])]}  # group 0's step; shard 1 still waits for worker 1
    assert c.blockers(0, 0, 1) == []
    refused(Status.EVICTED, c.push, 1, 2, 0, "late", 0.0, match="evicted")
    assert c.push(1, 1, 0, "y", 0.0) == ["x", "y"]
    assert c.held() == []


def test_a_backup_follows_the_steps_its_primary_applied() -> None:
    """A backup's coordinator holds nothing it applies itself: it is told which steps
    the primary applied (with their sums), releases what it held for them, and can
    then take pushes for the next step, as the primary would."""
    c = coord(Mode.hybrid(4, 2))
    assert c.push(0, 0, 0, "a", 0.0) is None  # held, as on the primary
    assert c.follow(0, 0, 1) == ["a"]  # group 0 applied step 0 on the primary
    assert c.applied_steps(0) == [1, 0]
    assert c.follow(0, 0, 1) == []  # told again (a resent copy): nothing changes
    assert c.push(0, 1, 1, "b", 0.0) is None  # step 1 is the next one now
    refused(Status.BAD_STEP, c.push, 0, 0, 0, "late", 0.0, match="already applied")
    assert c.follow(0, 1, 3) == [] and c.applied_steps(0) == [1, 3]
    assert c.follow(0, 5, 9) == []  # no such group: ignored


def test_held_lists_what_is_pending() -> None:
    c = coord(Mode.hybrid(4, 2))
    c.push(0, 0, 0, "a", 0.0)
    c.push(1, 3, 0, "b", 0.0)
    assert sorted(c.held()) == ["a", "b"]
