"""Training modes and collectives across real worker processes and real daemons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from irdma.training.modes import Mode

from .helpers.cluster import Cluster, make_cluster
from .training_workers import COLLECTIVE_CASES, LR, SHAPES, case_array, gradient, initial

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 4


def run_workers(
    cluster: Cluster,
    scenario: str,
    n: int,
    mode: Mode | None = None,
    steps: int = 0,
    die_at: int | None = None,
    timeout: float = 90,
) -> tuple[str, list[tuple[int, dict | None]]]:
    """Run ``n`` worker processes; return the model name and (exit code, JSON) per rank."""
    model = f"t/{scenario}-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "tests.training_workers", scenario, model]
    argv += [
        json.dumps((mode or Mode()).to_options()),
        str(steps),
        str(die_at) if die_at is not None else "-",
    ]
    procs = []
    try:
        for rank in range(n):
            env = dict(
                os.environ, RANK=str(rank), WORLD_SIZE=str(n), IRDMA_CONFIG=str(cluster.config_path)
            )
            procs.append(
                subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
            )
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            lines = out.strip().splitlines()
            results.append((proc.returncode, json.loads(lines[-1]) if lines else None))
        return model, results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def scaled(g: np.ndarray, alpha: float) -> np.ndarray:
    out = g.copy()
    np.multiply(out, alpha, out=out, casting="same_kind")
    return out


def reference(mode: Mode, n: int, steps: int, live_until: dict[int, int] | None = None):
    """The parameters a single process computes: per step, each group's deltas
    summed in rank order, then added (the daemon's arithmetic, in one process)."""
    live_until = live_until or {}
    params = initial()
    for step in range(steps):
        for key in SHAPES:
            groups = [list(mode.members(g)) for g in range(mode.groups)]
            for members in groups:
                alive = [r for r in members if step < live_until.get(r, steps)]
                total = None
                for r in alive:
                    d = scaled(gradient(r, step, key), -LR / mode.contributors(r))
                    if total is None:
                        total = d
                    else:
                        total += d
                if total is not None:
                    params[key] += total
    return params


def stored(cluster: Cluster, model: str) -> dict[str, np.ndarray]:
    c = cluster.client()
    return {k: c.read(f"{model}/{k}") for k in SHAPES}


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = make_cluster(tmp_path_factory.mktemp("replicated"), 3, replicas=2)
    try:
        yield c
    finally:
        c.close()


@pytest.mark.parametrize("copies", ["cluster", "replicated"], ids=["one-copy", "two-copies"])
def test_sync_equals_the_single_process_reference_exactly(
    copies: str, request: pytest.FixtureRequest
) -> None:
    """With two copies, step reads must reach the primary, which alone keeps
    the step's state (a step read sent to a backup was refused: 'has not
    pushed step 0')."""
    cluster: Cluster = request.getfixturevalue(copies)
    mode = Mode.sync(WORKERS)
    model, results = run_workers(cluster, "train", WORKERS, mode, steps=4)
    assert all(code == 0 for code, _ in results), results
    got = stored(cluster, model)
    want = reference(mode, WORKERS, 4)
    for key in SHAPES:
        assert np.array_equal(got[key], want[key]), key
    info = cluster.client().stat(f"{model}/a")
    assert info.options["mode"] == "sync"
    assert info.version > 0


@pytest.mark.parametrize(
    "mode", [Mode.ssp(WORKERS, 1), Mode.hybrid(WORKERS, 2)], ids=["ssp", "hybrid"]
)
def test_step_modes_count_exactly_with_two_copies(replicated: Cluster, mode: Mode) -> None:
    steps = 10
    model, results = run_workers(replicated, "count", WORKERS, mode, steps=steps)
    assert all(code == 0 for code, _ in results), results
    assert (replicated.client().read(f"{model}/count") == WORKERS * steps).all()


def test_hybrid_groups_sum_their_steps(cluster: Cluster) -> None:
    # Inside a group the sum is ordered; across groups updates land in
    # whichever order the groups finish, so the result equals the reference
    # up to float rounding (the exact count is checked with integers below).
    mode = Mode.hybrid(WORKERS, 2)
    model, results = run_workers(cluster, "train", WORKERS, mode, steps=4)
    assert all(code == 0 for code, _ in results), results
    got = stored(cluster, model)
    want = reference(mode, WORKERS, 4)
    for key in SHAPES:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)
        assert not np.array_equal(got[key], initial()[key])


@pytest.mark.parametrize(
    "mode",
    [Mode(), Mode.ssp(WORKERS, 1), Mode.sync(WORKERS), Mode.hybrid(WORKERS, 2)],
    ids=["async", "ssp", "sync", "hybrid"],
)
def test_every_accumulate_counts_exactly_once(cluster: Cluster, mode: Mode) -> None:
    steps = 25
    model, results = run_workers(cluster, "count", WORKERS, mode, steps=steps)
    assert all(code == 0 for code, _ in results), results
    assert (cluster.client().read(f"{model}/count") == WORKERS * steps).all()


def test_collectives_equal_numpy(cluster: Cluster) -> None:
    _, results = run_workers(cluster, "collectives", WORKERS)
    assert all(code == 0 for code, _ in results), results
    for i in range(len(COLLECTIVE_CASES)):
        arrays = [case_array(r, i) for r in range(WORKERS)]
        stack = np.stack(arrays)
        for rank, (_, out) in enumerate(results):
            assert out[f"sum{i}"] == np.sum(stack, axis=0).tobytes().hex(), (i, rank)
            assert out[f"mean{i}"] == np.mean(stack, axis=0).tobytes().hex(), (i, rank)
            assert out[f"bcast{i}"] == arrays[1].tobytes().hex()
            assert out[f"gather{i}"] == (stack.tobytes().hex() if rank == 2 else None)
            for what in ("sum", "mean", "bcast"):
                assert out[f"{what}_out{i}"] == out[f"{what}{i}"], (what, i, rank)
            assert out.get(f"gather_out{i}") == (out[f"gather{i}"] if rank == 2 else None)
    # close() removed the group's tensors.
    assert not [i for i in cluster.client().list(".collectives/") if "collectives-" in i.name]


def test_a_dead_worker_in_sync_mode_is_reported_to_the_others(cluster: Cluster) -> None:
    mode = Mode.sync(WORKERS, worker_timeout=2.0, on_timeout="error")
    _, results = run_workers(cluster, "train", WORKERS, mode, steps=5, die_at=3)
    codes = [code for code, _ in results]
    assert codes == [2, 2, 2, 3], results
    for _, out in results[:3]:
        assert out["error"] == "WorkerLost"
        assert "worker(s) 3 sent nothing for 2 s" in out["message"]
        assert out["after"] < 30


def test_a_dead_worker_is_evicted_and_the_others_finish(cluster: Cluster) -> None:
    mode = Mode.sync(WORKERS, worker_timeout=2.0, on_timeout="evict")
    model, results = run_workers(cluster, "train", WORKERS, mode, steps=5, die_at=2)
    assert [code for code, _ in results] == [0, 0, 3, 0], results
    got = stored(cluster, model)
    want = reference(mode, WORKERS, 5, live_until={2: 2})
    for key in SHAPES:
        assert np.array_equal(got[key], want[key]), key
    evicted = cluster.client().stat(f"{model}/a")
    assert evicted.options["on_timeout"] == "evict"
    assert any("evicted silent worker(s) [2]" in cluster.log(n) for n in cluster.names)
