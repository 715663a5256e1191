"""bench/compare.py and bench/star.py, CI-sized: they run, measure every irdma
transport for real, and say plainly when a peer is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.timeout(240)
def test_compare_measures_both_transports_and_memory(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    run = subprocess.run(
        [
            *(sys.executable, str(BENCH / "compare.py"), "--sizes", "4KiB,8MiB", "--rounds", "1"),
            *("--only", "limits,irdma", "--json", str(out), "--png", str(tmp_path / "c.png")),
            *("--replicas", "1,2"),
        ],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {(r["system"], r["op"], r["size"]): r for r in report["rows"]}
    for transport in ("tcp", "shm"):
        for op in ("read", "write", "accumulate"):
            row = rows[(f"irdma {transport}", op, 8 << 20)]
            assert row["gbps"] > 0, row
    assert rows[("irdma shm", "read", 8 << 20)]["detail"] == "shm"
    # Writes from the client's shared memory, measured beside the plain ones.
    for op in ("read", "write", "accumulate"):
        assert rows[("irdma shm shared", op, 8 << 20)]["gbps"] > 0
    # Small ops: single round trips, median and p99, on one copy and on two.
    for system in ("irdma tcp", "irdma shm", "irdma tcp R=2", "irdma shm R=2"):
        for op in ("read", "write", "accumulate"):
            row = rows[(system, op, 4096)]
            assert 0 < row["seconds"] <= row["p99"], row
    # Large ones on two copies too, each against the same op on one.
    for transport in ("tcp", "shm"):
        for op in ("write", "accumulate"):
            row = rows[(f"irdma {transport} R=2", op, 8 << 20)]
            assert row["gbps"] > 0 and row["refs"][0]["ref"] == "R=1", row
            assert row["refs"][0]["ratio"] > 0, row
    assert {m["what"].split(",")[0] for m in report["memory"]} >= {"daemon n1"}
    print(run.stdout)


@pytest.mark.timeout(240)
def test_star_runs_irdma_on_both_transports(tmp_path: Path) -> None:
    out = tmp_path / "star.json"
    run = subprocess.run(
        [
            *(sys.executable, str(BENCH / "star.py"), "--models", "resnet-50"),
            *("--size-scale", "0.02", "--workers", "2", "--iterations", "1"),
            *("--systems", "irdma-tcp,irdma-shm,irdma-shm-shared", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "n/a" not in run.stdout, run.stdout
    assert "irdma shm" in run.stdout and "irdma tcp" in run.stdout
    assert "irdma shm shared" in run.stdout
    print(run.stdout)
