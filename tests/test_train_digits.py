"""Convergence, CI-sized: bench/train_digits.py with 2 worker processes reaches 0.90 on digits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers.cluster import Cluster

pytest.importorskip("torch", reason="torch is not installed (deploy/setup.sh installs it)")
pytest.importorskip("sklearn", reason="scikit-learn is not installed (the 'train' extra)")

PROGRAM = Path(__file__).resolve().parent.parent / "bench" / "train_digits.py"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_two_workers_learn_digits(cluster: Cluster, mode: str) -> None:
    argv = [sys.executable, str(PROGRAM), "--config", str(cluster.config_path)]
    argv += ["--workers", "2", "--mode", mode, "--via", "client", "--epochs", "25", "--json"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["mode"] == mode and result["workers"] == 2
    assert result["tensor_mode"] == mode
    assert result["test_accuracy"] >= 0.90, result
    assert result["seconds_per_epoch"] > 0
