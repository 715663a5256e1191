"""Training in a lockstep mode goes on when a primary dies, between steps or in the
middle of one: the backup's training-mode bookkeeping follows its primary's (the
steps applied, and the pushes held for the step under way), so it takes over.

Real daemons with two copies of every shard; workers (clients in this process,
taking turns) push and pull a sync or hybrid tensor; the shard's primary is
killed with SIGKILL and the run finishes on the backup with the parameters a
fault-free run gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from irdma import Client
from irdma.protocol import tensor_key
from irdma.training.modes import Mode

from .helpers.cluster import Cluster, make_cluster

N = 4096  # float32: 16 KiB, one shard
STEPS = 6


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = make_cluster(tmp_path, 3, replicas=2, timeout=2.0)
    try:
        yield c
    finally:
        c.close()


def grad(worker: int, step: int) -> np.ndarray:
    return np.random.default_rng(1000 * worker + step).standard_normal(N).astype(np.float32)


def expected(mode: Mode) -> np.ndarray:
    """One process adding the rank-ordered sums, step after step."""
    w = np.zeros(N, np.float32)
    for step in range(STEPS):
        total = grad(0, step).copy()
        total += grad(1, step)
        w += total
    return w


@pytest.mark.parametrize("mode", [Mode.sync(2), Mode.hybrid(2, 1)], ids=["sync", "hybrid"])
def test_a_sync_run_survives_its_primary_dying_between_steps(cluster: Cluster, mode: Mode) -> None:
    c = cluster
    name = f"failover/{mode.kind}"
    primary = c.config.replicas_for(tensor_key(name), 0)[0].name
    with Client(c.config_path) as w0, Client(c.config_path) as w1:
        w0.create(name, (N,), np.float32, mode=mode)
        workers = (w0, w1)
        for step in range(STEPS):
            if step == STEPS // 2:
                c.kill(primary)  # between steps: every push of the last one was applied
            for rank, w in enumerate(workers):
                w.accumulate(name, grad(rank, step), worker=rank, step=step)
            pulled = [w.read(name, worker=rank, step=step + 1) for rank, w in enumerate(workers)]
            assert np.array_equal(pulled[0], pulled[1])
        assert np.array_equal(pulled[0], expected(mode))


def test_a_backup_restarted_mid_run_takes_over_at_the_right_step(cluster: Cluster) -> None:
    """The backup misses steps while stopped and catches up when it starts again (the
    updates its primary queued for it, or a whole-shard copy: both carry the steps
    applied); then the primary dies and it takes over. The copy's own path is
    tests/test_store_modes.py's."""
    c = cluster
    mode = Mode.sync(2)
    name = "failover/copied"
    primary, backup = (n.name for n in c.config.replicas_for(tensor_key(name), 0))
    with Client(c.config_path) as w0, Client(c.config_path) as w1:
        w0.create(name, (N,), np.float32, mode=mode)
        workers = (w0, w1)
        for step in range(STEPS):
            if step == 1:
                c.stop(backup)
            if step == 3:
                c.start(backup)  # caught up (a shard copy) before it says ready
            if step == 4:
                c.kill(primary)
            for rank, w in enumerate(workers):
                w.accumulate(name, grad(rank, step), worker=rank, step=step)
            pulled = [w.read(name, worker=rank, step=step + 1) for rank, w in enumerate(workers)]
        assert np.array_equal(pulled[0], expected(mode))
        assert np.array_equal(pulled[1], expected(mode))


def run_steps(
    workers: list[Client],
    name: str,
    steps: int,
    kill: Callable[[], None] | None = None,
    first: tuple[int, ...] = (),
) -> np.ndarray:
    """Push every worker's gradient for each step and pull the next; ``kill`` runs in
    the middle of the middle step, after the workers ``first`` pushed (acknowledged)."""
    for step in range(steps):
        order = list(range(len(workers)))
        if kill is not None and step == steps // 2:
            order = list(first) + [r for r in order if r not in first]
        for i, rank in enumerate(order):
            if kill is not None and step == steps // 2 and i == len(first):
                kill()
            workers[rank].accumulate(name, grad(rank, step), worker=rank, step=step)
        pulled = [w.read(name, worker=rank, step=step + 1) for rank, w in enumerate(workers)]
        for p in pulled[1:]:
            assert np.array_equal(p, pulled[0])
    return pulled[0]


@pytest.mark.parametrize(
    ("mode", "first"),
    [(Mode.sync(4), (0, 1)), (Mode.hybrid(4, 2), (0, 2)), (Mode.ssp(4, 1), (0, 1))],
    ids=["sync", "hybrid", "ssp"],
)
def test_a_primary_killed_mid_step_loses_no_acknowledged_push(
    cluster: Cluster, mode: Mode, first: tuple[int, ...]
) -> None:
    """Workers ``first`` pushed the step (held by the primary, acknowledged); then the
    primary is killed. The others push to the backup, which completes the step with the
    held pushes forwarded to it: the same parameters as a fault-free run, bit for bit.
    (ssp: the pushes apply at once; the backup knows the workers' clocks from them.)"""
    c = cluster
    name = f"failover/mid-{mode.kind}"
    clients = [Client(c.config_path) for _ in range(4)]
    try:
        clients[0].create("failover/free", (N,), np.float32, mode=mode)
        fault_free = run_steps(clients, "failover/free", STEPS)
        clients[0].create(name, (N,), np.float32, mode=mode)
        primary = c.config.replicas_for(tensor_key(name), 0)[0].name
        got = run_steps(clients, name, STEPS, partial(c.kill, primary), first)
        assert c.procs[primary].poll() is not None, "the primary was killed"
        assert np.array_equal(got, fault_free)
        assert any(got), "the run changed the parameters"
    finally:
        for w in clients:
            w.close()
