"""The ``irdma`` command, run as a user would, against real daemons."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from irdma import Client
from irdma import __version__ as irdma_version

from .helpers.cluster import Cluster, make_cluster
from .helpers.processes import processes_with


def irdma(
    cluster: Cluster | None,
    *args: str,
    check: bool = True,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env or {}))
    if cluster is not None:
        env["IRDMA_CONFIG"] = str(cluster.config_path)
    proc = subprocess.run(
        [sys.executable, "-m", "irdma", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"irdma {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def test_npy_round_trip(cluster: Cluster, tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((300, 700)).astype(np.float32)  # spans shards
    np.save(tmp_path / "in.npy", x)
    irdma(cluster, "put", "cli/w", str(tmp_path / "in.npy"))
    irdma(cluster, "get", "cli/w", "-o", str(tmp_path / "out.npy"))
    assert np.array_equal(np.load(tmp_path / "out.npy"), x)
    assert (tmp_path / "in.npy").read_bytes() == (tmp_path / "out.npy").read_bytes()


def test_npz_round_trip(cluster: Cluster, tmp_path: Path) -> None:
    arrays = {"w": np.arange(10.0), "b": np.ones((2, 3), np.int16), "s": np.array(3.5)}
    np.savez(tmp_path / "m.npz", **arrays)
    irdma(cluster, "put", "npz", str(tmp_path / "m.npz"))
    ls = irdma(cluster, "ls", "npz/").stdout.split()
    assert ls == ["npz/b", "npz/s", "npz/w"]
    irdma(cluster, "get", "npz", "-o", str(tmp_path / "back.npz"))
    with np.load(tmp_path / "back.npz") as z:
        assert set(z.files) == set(arrays)
        for k, v in arrays.items():
            assert np.array_equal(z[k], v) and z[k].dtype == v.dtype


def test_safetensors_round_trip(cluster: Cluster, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    arrays = {
        "layer.weight": np.random.default_rng(1).random((64, 64), dtype=np.float32),
        "layer.bias": np.zeros(64, np.float16),
    }
    save_file(arrays, str(tmp_path / "m.safetensors"))
    irdma(cluster, "put", "st", str(tmp_path / "m.safetensors"))
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read("st/layer.weight"), arrays["layer.weight"])
    irdma(cluster, "get", "st", "-o", str(tmp_path / "back.safetensors"))
    back = load_file(str(tmp_path / "back.safetensors"))
    for k, v in arrays.items():
        assert np.array_equal(back[k], v)


def test_put_refuses_a_new_layout_without_replace(cluster: Cluster, tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(4, np.float32))
    np.save(tmp_path / "b.npy", np.zeros(5, np.float64))
    irdma(cluster, "put", "lay/x", str(tmp_path / "a.npy"))
    proc = irdma(cluster, "put", "lay/x", str(tmp_path / "b.npy"), check=False)
    assert proc.returncode == 1 and "float32" in proc.stderr and "replace" in proc.stderr
    irdma(cluster, "put", "--replace", "lay/x", str(tmp_path / "b.npy"))
    info = json.loads(irdma(cluster, "stat", "lay/x", "--json").stdout)
    assert info["dtype"] == "float64" and info["shape"] == [5]


def test_stat_ls_rm(cluster: Cluster, tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((3, 4), np.int32))
    irdma(cluster, "put", "srm/a", str(tmp_path / "a.npy"))
    irdma(cluster, "put", "srm/sub/b", str(tmp_path / "a.npy"))
    out = irdma(cluster, "stat", "srm/a").stdout
    assert "int32" in out and "[3, 4]" in out
    rows = json.loads(irdma(cluster, "ls", "srm/", "--json").stdout)
    assert [r["name"] for r in rows] == ["srm/a", "srm/sub/b"]
    assert "3x4" in irdma(cluster, "ls", "-l", "srm/").stdout
    irdma(cluster, "rm", "-r", "srm")
    gone = irdma(cluster, "ls", "srm/", check=False)
    assert gone.returncode == 1 and gone.stdout == ""
    assert gone.stderr == "irdma: no tensor is named or starts with 'srm/'\n"


def test_errors_are_one_clear_line(cluster: Cluster, tmp_path: Path) -> None:
    proc = irdma(cluster, "stat", "does/not/exist", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "irdma: no tensor named 'does/not/exist'"
    proc = irdma(cluster, "put", "x", str(tmp_path / "missing.npy"), check=False)
    assert proc.returncode == 1 and "missing.npy" in proc.stderr
    proc = irdma(cluster, "put", "x", str(tmp_path / "file.txt"), check=False)
    assert proc.returncode == 1 and "file.txt: irdma cannot read '.txt' files" in proc.stderr
    assert ".npy (one tensor), .npz, .safetensors" in proc.stderr  # what it can read
    proc = irdma(None, "--config", str(tmp_path / "nope.toml"), "ls", check=False)
    assert proc.returncode == 2 and "nope.toml: config file not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_status_and_bench_json(cluster: Cluster) -> None:
    rows = json.loads(irdma(cluster, "status", "--json").stdout)
    assert [r["node"] for r in rows] == cluster.names and all(r["up"] for r in rows)
    assert {r["transport"] for r in rows} == {"shm"}  # every daemon runs on this host
    text = irdma(cluster, "status").stdout
    assert text.splitlines()[0].split()[:3] == ["NODE", "ADDRESS", "VIA"] and " shm " in text
    tcp = json.loads(irdma(cluster, "status", "--json", env={"IRDMA_TRANSPORT": "tcp"}).stdout)
    assert {r["transport"] for r in tcp} == {"tcp"}
    res = json.loads(
        irdma(
            cluster, "bench", "--size", "1MiB", "--repeat", "2", "--latency-iters", "20", "--json"
        ).stdout
    )
    for key in ("read_GBps", "write_GBps", "accumulate_GBps", "read_4KiB_us_median"):
        assert res[key] > 0
    assert res["accumulate_4KiB_us_median"] > 0
    assert res["replicas"] == cluster.config.replicas
    with Client(cluster.config_path) as c:
        assert not c.list("_bench/")  # cleaned up


@pytest.fixture
def unsnapshotted(tmp_path: Path) -> Iterator[Cluster]:
    """Daemons that write snapshots only when stopped: a status of them says "never"
    however long the tests before took (the module's cluster snapshots every 60 s)."""
    c = make_cluster(tmp_path, extra={"snapshot_interval": 0})
    try:
        yield c
    finally:
        c.close()


def test_status_columns_with_one_copy(unsnapshotted: Cluster) -> None:
    cluster = unsnapshotted
    x = np.zeros(100_000, np.float32)  # 400 KB in 64 KiB shards: 7 shards over the daemons
    with Client(cluster.config_path) as c:
        c.write("cli-status/w", x)
    rows = json.loads(irdma(cluster, "status", "--json").stdout)
    for r in rows:
        assert r["version"] == irdma_version and r["ready"] and r["quorum"]
        assert r["shards"]["backup"] == 0  # one copy: every shard is its daemon's own
        assert r["snapshot"] is None  # none written yet (only when stopped)
        assert r["skew"] is None  # nothing to compare
    assert sum(r["shards"]["primary"] for r in rows) >= 7
    lines = irdma(cluster, "status").stdout.splitlines()
    assert lines[0].split() == [
        *("NODE", "ADDRESS", "VIA", "STATE", "PID", "VERSION", "TENSORS", "SHARDS", "P/B"),
        *("ARENA", "USED", "SNAPSHOT", "SKEW"),
    ]
    for line, r in zip(lines[1:], rows, strict=True):
        cells = line.split()
        assert cells[0] == r["node"] and cells[3] == "up" and cells[5] == irdma_version
        assert cells[4] == str(r["pid"]) == str(cluster.pid(r["node"]))
        assert cells[7] == f"{r['shards']['primary']}/0"
        assert cells[-2:] == ["never", "-"]


@pytest.mark.timeout(120)
def test_status_with_replicas_shows_roles_snapshots_and_skew(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, replicas=2, extra={"heartbeat": 0.1, "failure_timeout": 0.5})
    try:
        x = np.arange(200_000, dtype=np.float32)  # 800 KB in 64 KiB shards: 13 shards
        with cluster.client() as c:
            c.write("cli-rep/w", x)
            c.accumulate("cli-rep/w", np.ones_like(x))
        rows = json.loads(irdma(cluster, "status", "--json").stdout)
        assert all(r["up"] and r["ready"] for r in rows)
        # Each shard has one acting primary and one backup, all replicas current.
        assert sum(r["shards"]["primary"] for r in rows) == 13
        assert sum(r["shards"]["backup"] for r in rows) == 13
        assert [r["skew"] for r in rows] == [0, 0, 0]
        # A daemon stopped cleanly leaves a snapshot, and reports it once back.
        assert cluster.stop("n2") == 0
        cluster.start("n2")
        rows = {r["node"]: r for r in json.loads(irdma(cluster, "status", "--json").stdout)}
        assert rows["n2"]["snapshot"]["seq"] >= 1 and 0 <= rows["n2"]["snapshot"]["age"] < 60
        assert rows["n1"]["snapshot"] is None
        text = irdma(cluster, "status").stdout
        n2 = next(line for line in text.splitlines() if line.startswith("n2 "))
        assert n2.split()[-2] == "ago" and n2.split()[-3].endswith("s")  # e.g. "3s ago"
        assert n2.split()[-1] == "0"  # caught up again: no shard behind
    finally:
        cluster.close()


def test_status_exits_1_when_a_daemon_is_down(fresh_cluster: Cluster) -> None:
    fresh_cluster.kill("n3")
    proc = irdma(fresh_cluster, "status", check=False)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    down = next(line for line in lines if line.startswith("n3 "))
    assert down.split()[3] == "down"
    # Why, once, below the table: nothing listens at a killed daemon's port.
    assert lines[4] == (
        "n3: connection refused: nothing listens at its address (not started, or stopped)"
    )
    rows = json.loads(irdma(fresh_cluster, "status", "--json", check=False).stdout)
    assert [r["up"] for r in rows] == [True, True, False]
    assert [r["state"] for r in rows] == ["up", "up", "down"]
    assert "unavailable" in rows[2]["error"] and "shards" not in rows[2]


def daemons_using(config: str) -> list[int]:
    """PIDs of psd processes started with ``--config config`` (read from /proc)."""
    return processes_with(lambda argv: b"irdma_psd.main" in argv and config.encode() in argv)


def test_local_starts_and_stops_cleanly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "irdma",
            "local",
            "--nodes",
            "2",
            "--dir",
            str(tmp_path),
            "--arena",
            "16MiB",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()  # printed once every daemon answers
        assert line == str(tmp_path / "cluster.toml")
        with Client(line) as c:
            c.write("local/x", np.arange(5))
            assert c.read("local/x").sum() == 10
        assert len(daemons_using(line)) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        deadline = time.monotonic() + 10
        while daemons_using(line) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert daemons_using(line) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_local_refuses_more_replicas_than_nodes(tmp_path: Path) -> None:
    proc = irdma(
        None, "local", "--nodes", "2", "--replicas", "3", "--dir", str(tmp_path), check=False
    )
    assert proc.returncode == 2 and "3 replicas need at least 3 nodes" in proc.stderr


@pytest.mark.parametrize("bad", ["nodes = 3", "[[nodes]]\nname='a'\naddress='tcp://x:1'\n"])
def test_bad_config_names_file_and_key(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(bad)
    proc = irdma(None, "--config", str(path), "status", check=False)
    assert proc.returncode == 2
    assert str(path) in proc.stderr and "nodes" in proc.stderr


def test_stat_shows_the_training_mode(cluster: Cluster) -> None:
    from irdma.training.modes import Mode

    cluster.client().create("cli-mode/w", (4,), np.float32, mode=Mode.hybrid(4, 2))
    out = irdma(cluster, "stat", "cli-mode/w").stdout
    assert "hybrid workers=4 groups=2" in out
    info = json.loads(irdma(cluster, "stat", "cli-mode/w", "--json").stdout)
    assert info["options"]["mode"] == "hybrid" and info["mode"].startswith("hybrid")
    cluster.client().write("cli-mode/plain", np.ones(2))
    assert json.loads(irdma(cluster, "stat", "cli-mode/plain", "--json").stdout)["mode"] == "async"


# Its own cluster: before the module cluster's status tests it would delay them past
# the first snapshot (60 s), which test_status_columns_with_one_copy expects not yet.
@pytest.mark.timeout(120)
def test_a_replaced_tensors_version_goes_on_above_the_old_one(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "cluster", replicas=2)
    try:
        np.save(tmp_path / "a.npy", np.arange(200_000, dtype=np.float32))  # 13 shards
        np.save(tmp_path / "b.npy", np.arange(5, dtype=np.float64))  # 1 shard
        for _ in range(3):
            irdma(cluster, "put", "ver/x", str(tmp_path / "a.npy"))
        with cluster.client() as reader:
            assert reader.read("ver/x")[7] == 7  # it has seen the old versions
            old = reader.stat("ver/x").version
            assert old == 3 * 13
            irdma(cluster, "put", "--replace", "ver/x", str(tmp_path / "b.npy"))
            # Shard 0 went from 3 to 4 (the replace) and 5 (the write): not back to 1.
            assert reader.stat("ver/x").version == 5
            assert np.array_equal(reader.read("ver/x"), np.arange(5, dtype=np.float64))
            irdma(cluster, "put", "--replace", "ver/x", str(tmp_path / "a.npy"))
            # Shard 0: 6 and 7; shards 1-12, new to this layout, start at 0 and the write
            # makes them 1 (they go on from the old ones' only where the old layout had them).
            assert reader.stat("ver/x").version == 7 + 12
        # Both copies of every shard agree on the versions they continued from.
        rows = json.loads(irdma(cluster, "status", "--json").stdout)
        assert [r["skew"] for r in rows] == [0, 0, 0]
    finally:
        cluster.close()
