"""Training in a lockstep mode goes on when a primary dies between steps: the backup's
training-mode bookkeeping follows its primary's, so it takes the next step's pushes.

Real daemons with two copies of every shard; two workers (two clients in this
process, taking turns) push and pull a sync tensor; the shard's primary is
killed between steps and the run finishes on the backup with the parameters a
fault-free run gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from irdma import Client
from irdma.modes import Mode
from irdma.protocol import tensor_key

from .conftest import Cluster, make_cluster

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
