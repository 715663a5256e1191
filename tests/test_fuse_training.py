"""Training through the mount with file I/O only: <model>/.worker/<rank>/<step>/<t>.npy."""

from __future__ import annotations

import errno
import os
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from irdma.training.modes import Mode

from .helpers.cluster import Cluster


def model_name() -> str:
    return f"ft/{uuid.uuid4().hex[:8]}"


def step_file(mount: Path, model: str, rank: int, step: int, tensor: str = "w") -> Path:
    return mount / model / ".worker" / str(rank) / str(step) / f"{tensor}.npy"


def grad(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng([rank, step]).standard_normal(50_000).astype(np.float32)


def test_sync_training_by_np_load_and_np_save(cluster: Cluster, mount: Path) -> None:
    model = model_name()
    c = cluster.client()
    c.create(f"{model}/w", (50_000,), np.float32, mode=Mode.sync(2))  # shards on 3 daemons
    steps = 3
    seen: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []

    def worker(rank: int) -> None:
        try:
            for step in range(steps):
                seen[rank, step] = np.load(step_file(mount, model, rank, step))
                np.save(step_file(mount, model, rank, step), grad(rank, step))
            seen[rank, steps] = np.load(step_file(mount, model, rank, steps))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    expected = np.zeros(50_000, np.float32)
    for step in range(steps + 1):
        # Both workers pulled exactly the parameters of the step, never a mix.
        assert np.array_equal(seen[0, step], expected)
        assert np.array_equal(seen[1, step], expected)
        if step < steps:
            expected = expected + (grad(0, step) + grad(1, step))
    assert np.array_equal(c.read(f"{model}/w"), expected)


def test_async_pushes_apply_at_once(cluster: Cluster, mount: Path) -> None:
    model = model_name()
    c = cluster.client()
    c.write(f"{model}/w", np.ones(10, np.float64))
    np.save(step_file(mount, model, 0, 0), np.full(10, 2.0))
    assert (np.load(step_file(mount, model, 0, 1)) == 3.0).all()
    assert (c.read(f"{model}/w") == 3.0).all()


def test_step_files_are_not_listed_and_the_mode_shows(cluster: Cluster, mount: Path) -> None:
    model = model_name()
    cluster.client().create(f"{model}/w", (4,), np.float32, mode=Mode.ssp(3, 2))
    assert os.listdir(mount / model) == ["w.npy"]
    assert os.listdir(mount / model / ".worker" / "0" / "5") == []
    mode = os.getxattr(mount / model / "w.npy", "user.irdma.mode").decode()
    assert mode.startswith("ssp workers=3 slack=2")


def test_refused_pulls_and_pushes_name_an_errno(cluster: Cluster, mount: Path) -> None:
    model = model_name()
    c = cluster.client()
    c.create(f"{model}/w", (8,), np.float32, mode=Mode.sync(2))
    before = c.stat(f"{model}/w")
    with pytest.raises(OSError) as info:  # step 1 before pushing step 0: could never go
        np.load(step_file(mount, model, 0, 1))
    assert info.value.errno == errno.EINVAL
    with pytest.raises(OSError) as info:  # there is no worker 5 of 2
        np.save(step_file(mount, model, 5, 0), np.ones(8, np.float32))
    assert info.value.errno == errno.EINVAL
    with pytest.raises(OSError) as info:  # a gradient of the wrong dtype
        np.save(step_file(mount, model, 0, 0), np.ones(8, np.float64))
    assert info.value.errno == errno.EINVAL
    with pytest.raises(OSError) as info:  # not a .npy file at all
        step_file(mount, model, 0, 0).write_bytes(b"not numpy")
    assert info.value.errno == errno.EINVAL
    with pytest.raises(FileNotFoundError):
        np.load(step_file(mount, model, 0, 0, tensor="nothing"))
    after = c.stat(f"{model}/w")
    assert after.version == before.version and not c.read(f"{model}/w").any()


def test_a_silent_worker_times_out_a_pull(cluster: Cluster, mount: Path) -> None:
    model = model_name()
    c = cluster.client()
    c.create(f"{model}/w", (8,), np.float32, mode=Mode.sync(2, worker_timeout=1.0))
    np.save(step_file(mount, model, 0, 0), np.ones(8, np.float32))
    with pytest.raises(OSError) as info:  # worker 1 never pushes step 0
        np.load(step_file(mount, model, 0, 1))
    assert info.value.errno == errno.ETIMEDOUT
