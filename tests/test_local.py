"""``irdma local`` owns its directory: a lock, stable ports, data kept, background runs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from irdma import Client, load_config

from .conftest import processes_with
from .test_cli import daemons_using, irdma

ARGS = ("--arena", "16MiB", "--shard-size", "64KiB")


def ports(config: Path) -> list[int]:
    return [n.address.port for n in load_config(config).nodes]


def supervisors(directory: Path) -> list[int]:
    """PIDs of `irdma local` processes running on ``directory`` (read from /proc)."""

    def ours(argv: list[bytes]) -> bool:
        on_dir = b"local" in argv and b"--dir" in argv and str(directory).encode() in argv
        return on_dir and b"--stop" not in argv

    return [pid for pid in processes_with(ours) if pid != os.getpid()]


def wait_gone(pids: list[int], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def local_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory for `irdma local`; whatever runs on it is stopped afterwards."""
    directory = tmp_path / "local"
    try:
        yield directory
    finally:
        irdma(None, "local", "--dir", str(directory), "--stop", check=False)
        leftovers = supervisors(directory) + daemons_using(str(directory / "cluster.toml"))
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        wait_gone(leftovers)


def start(directory: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`irdma local --background`: returns once every daemon answers."""
    return irdma(None, "local", "--dir", str(directory), "--background", *ARGS, *args, check=check)


def test_background_start_and_stop(local_dir: Path) -> None:
    proc = start(local_dir, "--nodes", "2")
    config = Path(proc.stdout.strip())
    assert config == local_dir / "cluster.toml"
    with Client(config) as c:
        c.write("bg/x", np.arange(5))
    assert len(daemons_using(str(config))) == 2
    assert irdma(None, "local", "--dir", str(local_dir), "--stop").returncode == 0
    assert daemons_using(str(config)) == []  # --stop returns once they are gone


def test_a_second_instance_on_the_same_dir_is_refused(local_dir: Path) -> None:
    config = Path(start(local_dir, "--nodes", "2").stdout.strip())
    [first] = supervisors(local_dir)
    before = config.read_bytes()
    sockets = sorted(local_dir.glob("n*/psd.sock"))
    assert len(sockets) == 2
    proc = irdma(None, "local", "--dir", str(local_dir), "--nodes", "3", *ARGS, check=False)
    assert proc.returncode == 1
    assert f"in use by irdma local (pid {first})" in proc.stderr
    assert f"irdma local --stop --dir {local_dir}" in proc.stderr
    proc = start(local_dir, "--nodes", "2", check=False)
    assert proc.returncode == 1 and f"pid {first}" in proc.stderr
    # The first cluster is untouched: same config, its sockets, it answers.
    assert config.read_bytes() == before
    assert sorted(local_dir.glob("n*/psd.sock")) == sockets
    with Client(config) as c:
        c.write("lock/x", np.ones(3))
        assert c.read("lock/x").sum() == 3


def test_ports_and_data_are_kept_across_restarts(local_dir: Path) -> None:
    config = Path(start(local_dir, "--nodes", "3").stdout.strip())
    first = ports(config)
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)  # 7 shards
    with Client(config) as c:
        c.write("keep/x", x)
    irdma(None, "local", "--dir", str(local_dir), "--stop")
    start(local_dir, "--nodes", "3")
    assert ports(config) == first
    with Client(config) as c:
        assert np.array_equal(c.read("keep/x"), x)


def test_restart_with_other_nodes_is_refused_while_data_would_hide(local_dir: Path) -> None:
    config = Path(start(local_dir, "--nodes", "3").stdout.strip())
    x = np.arange(200_000, dtype=np.float32)  # 13 shards of 64 KiB: every daemon has some
    with Client(config) as c:
        c.write("nodes/x", x)
    irdma(None, "local", "--dir", str(local_dir), "--stop")
    before = config.read_bytes()
    for nodes in ("2", "4"):
        proc = start(local_dir, "--nodes", nodes, check=False)
        assert proc.returncode == 2, proc.stderr
        assert "Start it with --nodes 3" in proc.stderr and f"--nodes {nodes}" in proc.stderr
        assert config.read_bytes() == before
    assert "would leave out n3" in start(local_dir, "--nodes", "2", check=False).stderr
    start(local_dir, "--nodes", "3")
    with Client(config) as c:
        assert np.array_equal(c.read("nodes/x"), x)


def test_an_empty_cluster_may_change_its_size(local_dir: Path) -> None:
    start(local_dir, "--nodes", "2")
    irdma(None, "local", "--dir", str(local_dir), "--stop")
    config = Path(start(local_dir, "--nodes", "3").stdout.strip())
    assert len(load_config(config).nodes) == 3


def test_daemons_left_by_a_killed_irdma_local_keep_the_dir(local_dir: Path) -> None:
    config = Path(start(local_dir, "--nodes", "2").stdout.strip())
    [first] = supervisors(local_dir)
    daemons = daemons_using(str(config))
    os.kill(first, signal.SIGKILL)
    wait_gone([first])
    proc = irdma(None, "local", "--dir", str(local_dir), "--nodes", "2", *ARGS, check=False)
    assert proc.returncode == 1
    assert "its daemons still run" in proc.stderr
    assert all(f"pid {p}" in proc.stderr for p in daemons)
    irdma(None, "local", "--dir", str(local_dir), "--stop")
    assert daemons_using(str(config)) == []


def test_foreground_output_says_the_data_is_kept(local_dir: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "irdma", "local", "--dir", str(local_dir), "--nodes", "1", *ARGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == str(local_dir / "cluster.toml")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert f"their tensors are kept in {local_dir}" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
