"""irdma.training.collectives.Group against real daemons, members as threads of one test."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import numpy as np

from irdma import Client
from irdma.sizes import PARALLEL_COPY_MIN
from irdma.training.collectives import Group

from .helpers.cluster import Cluster


def test_close_tolerates_rank_0_deleting_before_a_member_reads_the_last_barrier(
    cluster: Cluster,
) -> None:
    """Rank 0 leaves the last barrier once everyone pushed, and deletes the
    group; a member whose barrier read comes later finds the tensor gone,
    which means everyone arrived (seen in deploy/demo.sh with two copies)."""
    name = f"close-{uuid.uuid4().hex[:8]}"
    errors: list[BaseException] = []
    with Client(cluster.config_path) as c0, Client(cluster.config_path) as c1:
        g0 = Group(c0, name, rank=0, world_size=2)
        g1 = Group(c1, name, rank=1, world_size=2)
        slow_read = c1.read
        rank0_closed = threading.Event()

        def late_read(*args, **kwargs):  # member 1 reads only after rank 0 has closed
            assert rank0_closed.wait(30), "rank 0 did not finish close()"
            return slow_read(*args, **kwargs)

        c1.read = late_read  # type: ignore[method-assign]

        def member(g: Group) -> None:
            try:
                g.close()
            except BaseException as exc:
                errors.append(exc)
            finally:
                if g.rank == 0:
                    rank0_closed.set()

        threads = [threading.Thread(target=member, args=(g,)) for g in (g0, g1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a member hung in close()"
        assert errors == []
        assert not c0.list(f".collectives/{name}/")


def run_members(config_path, name: str, size: int, body: Callable[[Group], object]) -> list[object]:
    """Run ``body(group)`` in ``size`` member threads, each with its own Client;
    return each member's result in rank order (re-raising a member's error)."""
    results: list[object] = [None] * size
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            with Client(config_path) as c:
                results[rank] = body(Group(c, name, rank=rank, world_size=size))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a member hung"
    if errors:
        raise errors[0]
    return results


def test_large_gathers_land_in_place_as_the_parts_change_shape(cluster: Cluster) -> None:
    """Parts are read straight into the result (large ones copied on two
    threads); a slot redefined with another shape between its uses is read
    as it is now (the root's cached layout of it is stale), and the root's
    own part is never pushed."""
    n = PARALLEL_COPY_MIN // 4
    shapes = [(n,), (n + 1,), (2, n // 2 + 3), (n,)]  # slot 0 used with 3 shapes
    name = f"gather-{uuid.uuid4().hex[:8]}"

    def part(rank: int, call: int) -> np.ndarray:
        return np.full(shapes[call], rank * 10 + call, np.float32)

    def body(g: Group) -> list[bool]:
        same = []
        for call, shape in enumerate(shapes):
            out = np.empty((3, *shape), np.float32) if g.rank == 1 else None
            got = g.gather(part(g.rank, call), root=1, out=out)
            if g.rank == 1:
                same.append(got is out and np.array_equal(got, [part(r, call) for r in range(3)]))
        left = [i.name for i in g.client.list(g.prefix + "/gather/")]
        g.close()
        return [*same, not any(t.endswith("/1") for t in left)]

    results = run_members(cluster.config_path, name, 3, body)
    assert results[1] == [True] * (len(shapes) + 1)
    assert results[0] == results[2] == [True]  # nor does any member see one


def test_collectives_refuse_an_out_that_does_not_fit(cluster: Cluster) -> None:
    """A wrong ``out`` is a ValueError naming shapes and dtypes, raised before
    anything moves; the group goes on working after it. (Checks every member
    makes alike: a root-only error, as gather's, leaves the others waiting, as
    in MPI; that one is shown in a group of one.)"""
    name = f"out-{uuid.uuid4().hex[:8]}"
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)

    def body(g: Group) -> list[str]:
        seen = []
        calls = [
            lambda: g.allreduce(arr, out=np.empty((3, 4), np.float64)),
            lambda: g.allreduce(arr, op="mean", out=np.empty(12, np.float32)),
            lambda: g.allreduce(arr, out=np.empty((4, 3), np.float32).T),
        ]
        if g.size == 1:
            calls.append(lambda: g.gather(arr, root=0, out=np.empty((3, 4), np.float32)))
        for call in calls:
            try:
                call()
            except ValueError as exc:
                seen.append(str(exc).split(";")[0])
        seen.append(str(g.allreduce(arr, out=np.empty((3, 4), np.float32)).sum()))
        g.close()
        return seen

    refused = [
        "out has shape (3, 4) and dtype float64",
        "out has shape (12,) and dtype float32",
        "out must be a writeable C-contiguous array",
    ]
    total = float(arr.sum())
    assert run_members(cluster.config_path, name, 2, body) == [[*refused, str(2 * total)]] * 2
    alone = run_members(cluster.config_path, name + "-1", 1, body)
    assert alone == [[*refused, "out has shape (3, 4) and dtype float32", str(total)]]
