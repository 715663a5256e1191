"""``irdma.cli.supervisor``'s restart policy, on exit codes and run times (no processes)."""

from __future__ import annotations

import signal

import pytest

from irdma.cli.supervisor import (
    FAILED,
    RESTARTING,
    STOPPED,
    DaemonRecord,
    RestartPolicy,
    describe_exit,
)

pytestmark = pytest.mark.timeout(10)

POLICY = RestartPolicy(burst=5, fast=10.0, first_delay=0.1, max_delay=1.0)


def test_a_crash_after_a_long_run_is_restarted_after_the_first_delay() -> None:
    r = DaemonRecord("n1", pid=42)
    assert r.exited(-signal.SIGKILL, ran_for=60.0, policy=POLICY) == 0.1
    assert (r.state, r.pid, r.fast_crashes) == (RESTARTING, None, 0)
    assert r.last_exit == "killed by SIGKILL"


def test_fast_crashes_back_off_then_give_up() -> None:
    r = DaemonRecord("n1")
    delays = [r.exited(1, ran_for=0.5, policy=POLICY) for _ in range(4)]
    assert delays == [0.1, 0.2, 0.4, 0.8]
    assert r.state == RESTARTING
    assert r.exited(1, ran_for=0.5, policy=POLICY) is None
    assert (r.state, r.fast_crashes, r.last_exit) == (FAILED, 5, "exited with status 1")


def test_the_delay_is_capped() -> None:
    r = DaemonRecord("n1")
    policy = RestartPolicy(burst=10, fast=10.0, first_delay=0.1, max_delay=1.0)
    delays = [r.exited(1, ran_for=0.0, policy=policy) for _ in range(9)]
    assert delays[-1] == 1.0 and max(delays) == 1.0


def test_a_long_run_resets_the_count_of_fast_crashes() -> None:
    r = DaemonRecord("n1")
    for _ in range(4):
        r.exited(1, ran_for=0.5, policy=POLICY)
    r.started(7)
    assert r.exited(-signal.SIGSEGV, ran_for=30.0, policy=POLICY) == 0.1
    assert r.fast_crashes == 0
    assert r.exited(1, ran_for=0.5, policy=POLICY) == 0.1  # one fast crash: not given up


def test_a_clean_exit_is_not_restarted() -> None:
    r = DaemonRecord("n1", pid=42)
    assert r.exited(0, ran_for=0.5, policy=POLICY) is None
    assert (r.state, r.last_exit) == (STOPPED, "exited with status 0")


def test_the_record_round_trips_through_a_dict() -> None:
    r = DaemonRecord("n2", pid=5, restarts=3, last_exit="killed by SIGKILL")
    assert DaemonRecord.from_dict(r.to_dict() | {"from_a_newer_version": 1}) == r


@pytest.mark.parametrize(
    ("code", "text"),
    [(-9, "killed by SIGKILL"), (-15, "killed by SIGTERM"), (2, "exited with status 2")],
)
def test_describe_exit(code: int, text: str) -> None:
    assert describe_exit(code) == text
