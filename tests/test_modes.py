"""irdma.training.modes: validation, groups, storage in options, worker identity."""

from __future__ import annotations

import pytest

from irdma.training.modes import ASYNC, Mode, describe_options, worker_identity


def test_async_is_the_default_and_needs_no_options() -> None:
    assert Mode.from_options({}) == ASYNC
    assert Mode.from_options({"raw": True}) == ASYNC
    assert ASYNC.to_options() == {"mode": "async"}
    assert not ASYNC.steps_in_lockstep


@pytest.mark.parametrize(
    "mode",
    [
        Mode.sync(4),
        Mode.ssp(3, 2),
        Mode.hybrid(6, 3, worker_timeout=5, on_timeout="evict"),
        Mode.sync(2, apply="set"),
        ASYNC,
    ],
)
def test_options_round_trip(mode: Mode) -> None:
    assert Mode.from_options(mode.to_options()) == mode
    assert mode.kind in mode.describe()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "bsp"}, "unknown training mode"),
        ({"kind": "sync", "workers": 0}, "workers must be between"),
        ({"kind": "sync", "workers": True}, "workers must be an integer"),
        ({"kind": "ssp", "workers": 2, "slack": -1}, "slack must be >= 0"),
        ({"kind": "sync", "workers": 2, "slack": 1}, "slack only applies to ssp"),
        ({"kind": "hybrid", "workers": 2, "groups": 3}, "groups must be between"),
        ({"kind": "sync", "workers": 4, "groups": 2}, "groups only apply to hybrid"),
        ({"kind": "sync", "workers": 2, "worker_timeout": 0}, "worker_timeout"),
        ({"kind": "sync", "workers": 2, "worker_timeout": float("nan")}, "worker_timeout"),
        ({"kind": "sync", "workers": 2, "on_timeout": "retry"}, "on_timeout"),
        ({"kind": "async", "apply": "set"}, "apply='set' needs sync"),
        ({"kind": "sync", "workers": 2, "apply": "max"}, "apply must be"),
    ],
)
def test_bad_modes_are_refused_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Mode(**kwargs)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="mode must be a string"):
        Mode.from_options({"mode": 3})
    with pytest.raises(ValueError, match="workers must be an integer"):
        Mode.from_options({"mode": "sync", "workers": "4"})


@pytest.mark.parametrize(("workers", "groups"), [(4, 2), (5, 2), (7, 3), (6, 6), (3, 1)])
def test_groups_partition_the_workers_contiguously(workers: int, groups: int) -> None:
    mode = Mode.hybrid(workers, groups)
    seen = []
    for g in range(groups):
        members = list(mode.members(g))
        assert members, "every group has a member"
        assert all(mode.group_of(w) == g for w in members)
        assert all(mode.contributors(w) == len(members) for w in members)
        seen += members
    assert seen == list(range(workers))


def test_contributors() -> None:
    assert Mode.sync(4).contributors(3) == 4
    assert Mode.ssp(4, 1).contributors(0) == 1
    assert ASYNC.contributors(0) == 1


def test_describe_options() -> None:
    assert describe_options({}) == "async"
    assert describe_options(Mode.ssp(3, 2).to_options()).startswith("ssp workers=3 slack=2")
    assert describe_options({"mode": "bsp"}).startswith("unknown (unknown training mode")


def test_worker_identity_from_launchers() -> None:
    assert worker_identity(environ={"RANK": "2", "WORLD_SIZE": "4"}) == (worker_identity(2, 4))
    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3"}
    assert worker_identity(environ=ompi).rank == 1
    assert worker_identity(environ=ompi).world_size == 3
    # torchrun's variables win over mpirun's; explicit arguments over both.
    both = {"RANK": "0", "WORLD_SIZE": "2", **ompi}
    assert worker_identity(environ=both).world_size == 2
    assert worker_identity(rank=1, environ=both).rank == 1


def test_worker_identity_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="RANK/WORLD_SIZE"):
        worker_identity(environ={})
    with pytest.raises(ValueError, match="not integers"):
        worker_identity(environ={"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="outside"):
        worker_identity(environ={"RANK": "2", "WORLD_SIZE": "2"})
