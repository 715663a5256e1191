"""``irdma local`` owns its directory (a lock, stable ports, data and a secret kept,
background runs) and supervises its daemons: a killed one is restarted and catches up."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from irdma import Client, load_config
from irdma.cli import localdir
from irdma.cli.local import LOG_FILE
from irdma.errors import AuthFailed, DaemonUnavailable
from irdma.protocol import tensor_key

from .helpers.processes import processes_with
from .test_cli import daemons_using, irdma

ARGS = ("--arena", "16MiB", "--shard-size", "64KiB")
WORKERS = str(Path(__file__).with_name("local_workers.py"))


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


# -- the README's quick start, from any directory ---------------------------------

IRDMA = str(Path(sys.executable).with_name("irdma"))  # the console script a user runs


def test_the_quick_start_works_from_a_directory_holding_irdma_folders(tmp_path: Path) -> None:
    """`cd /tmp && irdma local --dir /tmp/irdma --background`: the daemons, the
    supervisor and the mount must import the installed package, not the folders
    named irdma/, psd/ and fuse/ in the current directory."""
    for folder in ("irdma", "psd", "fuse"):
        (tmp_path / folder).mkdir()
    directory = tmp_path / "irdma"  # the cluster's directory is one of them
    mnt = tmp_path / "params"
    mnt.mkdir()
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    env.pop("IRDMA_CONFIG", None)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [IRDMA, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )

    try:
        started = run("local", "--nodes", "3", "--dir", str(directory), "--background", *ARGS)
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == str(directory / "cluster.toml")
        env["IRDMA_CONFIG"] = started.stdout.strip()
        status = run("status")
        assert status.returncode == 0, status.stdout + status.stderr
        np.save(tmp_path / "w.npy", np.arange(4.0))
        assert run("put", "qs/w", str(tmp_path / "w.npy")).returncode == 0
        mounted = run("mount", str(mnt))
        assert mounted.returncode == 0, mounted.stderr
        try:
            assert np.array_equal(np.load(mnt / "qs" / "w.npy"), np.arange(4.0))
        finally:
            subprocess.run(["fusermount3", "-u", str(mnt)], check=False, timeout=60)
        # By default the mount logs to one file per mountpoint in the user's state dir.
        log = tmp_path / "state" / "irdma" / f"mount-{str(mnt)[1:].replace('/', '-')}.log"
        assert f"log {log};" in mounted.stderr
        wait_gone([int(re.search(r"\(pid (\d+),", mounted.stderr)[1])])  # it has logged all
        assert f"serving {mnt}" in log.read_text()
        # The log of a background run says how to stop it; it has no terminal for Ctrl-C.
        text = (directory / LOG_FILE).read_text()
        assert f"irdma local --stop --dir {directory} stops them" in text and "Ctrl-C" not in text
    finally:
        run("local", "--dir", str(directory), "--stop")
        leftovers = supervisors(directory) + daemons_using(str(directory / "cluster.toml"))
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_gone(leftovers)


# -- security by default -------------------------------------------------------


def test_the_config_names_a_secret_and_another_secret_is_refused(
    local_dir: Path, tmp_path: Path
) -> None:
    config = Path(start(local_dir, "--nodes", "2").stdout.strip())
    secret = load_config(config).secret_file
    assert secret == local_dir / "secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    with Client(config) as c:  # the config's secret, no extra step
        c.write("sec/x", np.arange(3.0))
    other = tmp_path / "other-secret"
    other.write_text(secrets.token_hex(32))
    other.chmod(0o600)
    forged = tmp_path / "forged.toml"
    forged.write_text(config.read_text().replace(str(secret), str(other)))
    with Client(forged) as c, pytest.raises(AuthFailed, match="has another secret"):
        c.read("sec/x")
    # A restart keeps the secret, so configs copied from the last run still work.
    before = secret.read_bytes()
    irdma(None, "local", "--dir", str(local_dir), "--stop")
    start(local_dir, "--nodes", "2")
    assert secret.read_bytes() == before
    with Client(config) as c:
        assert np.array_equal(c.read("sec/x"), np.arange(3.0))


def test_status_names_a_refused_secret_and_each_daemons_pid(
    local_dir: Path, tmp_path: Path
) -> None:
    config = Path(start(local_dir, "--nodes", "2").stdout.strip())
    secret = load_config(config).secret_file
    other = tmp_path / "other-secret"
    other.write_text(secrets.token_hex(32))
    other.chmod(0o600)
    forged = tmp_path / "forged.toml"
    forged.write_text(config.read_text().replace(str(secret), str(other)))
    proc = irdma(None, "--config", str(forged), "status", check=False)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert [line.split()[3] for line in lines[1:3]] == ["refused", "refused"]  # not down
    assert lines[3].startswith("n1, n2: up, and refuses this client: it has another secret")
    assert len(lines) == 4  # the reason once, not on every row
    rows = json.loads(irdma(None, "status", "--json", env={"IRDMA_CONFIG": str(config)}).stdout)
    pids = {r["node"]: r["pid"] for r in rows}
    assert pids == {n: daemon_pid(local_dir, n) for n in ("n1", "n2")}
    text = irdma(None, "status", env={"IRDMA_CONFIG": str(config)}).stdout.splitlines()
    assert [line.split()[4] for line in text[1:3]] == [str(pids["n1"]), str(pids["n2"])]


def test_insecure_names_no_secret_and_says_so(local_dir: Path) -> None:
    proc = start(local_dir, "--nodes", "1", "--insecure")
    config = Path(proc.stdout.strip())
    assert "WARNING: --insecure" in proc.stderr and "every tensor" in proc.stderr
    assert load_config(config).secret_file is None
    with Client(config) as c:
        c.write("open/x", np.arange(3.0))


# -- supervision ---------------------------------------------------------------

TENSOR = "sup/t"
SHAPE = (40000,)  # float64: 5 shards of 64 KiB over the daemons


@dataclass
class Worker:
    """A local_workers.py accumulate process; its outcomes are lines in ``out``."""

    proc: subprocess.Popen
    out: Path

    def lines(self) -> list[str]:
        text = self.out.read_text() if self.out.exists() else ""
        return text.splitlines()[: text.count("\n")]  # complete lines only

    def acked(self) -> list[tuple[float, float]]:
        """(value, monotonic time) of every acknowledged accumulate."""
        oks = (ln.split() for ln in self.lines() if ln.startswith("ok "))
        return [(float(v), float(t)) for _, v, t in oks]

    def failures(self) -> list[str]:
        return [ln for ln in self.lines() if ln.startswith("failed")]


def spawn_worker(config: Path, base: int, stop: Path, out: Path) -> Worker:
    argv = [sys.executable, WORKERS, "accumulate", "--config", str(config)]
    argv += ["--tensor", TENSOR, "--base", str(base), "--stop", str(stop)]
    with open(out, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
    return Worker(proc, out)


def wait_for(condition: Callable[[], object], what: str, seconds: float = 60) -> object:
    """Poll ``condition`` until it is truthy; its value. Fails naming ``what`` otherwise."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        time.sleep(0.05)
    return value


def status_rows(config: Path) -> dict[str, dict]:
    proc = irdma(None, "status", "--json", check=False, env={"IRDMA_CONFIG": str(config)})
    return {r["node"]: r for r in json.loads(proc.stdout)}


def daemon_pid(directory: Path, name: str) -> int:
    return localdir.read_holder(directory).daemons[name]


@pytest.mark.timeout(150)
def test_a_killed_daemon_is_restarted_and_no_acknowledged_update_is_lost(
    local_dir: Path, tmp_path: Path
) -> None:
    config = Path(start(local_dir, "--nodes", "4", "--replicas", "2").stdout.strip())
    with Client(config) as c:
        c.write(TENSOR, np.zeros(SHAPE))
    victim = load_config(config).primary_for(tensor_key(TENSOR), 0).name
    stop = tmp_path / "stop"
    workers = [
        spawn_worker(config, base, stop, tmp_path / f"w{k}.out")
        for k, base in enumerate((1, 1_000_001))
    ]
    try:
        wait_for(lambda: all(len(w.acked()) >= 20 for w in workers), "both workers under way")
        old_pid = daemon_pid(local_dir, victim)
        os.kill(old_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        marks = [len(w.acked()) for w in workers]

        def back() -> dict | None:
            row = status_rows(config)[victim]
            ok = row["up"] and row["ready"] and row["pid"] != old_pid and row["restarts"] == 1
            return row if ok else None

        wait_for(back, f"{victim} restarted and caught up (irdma status)")
        wait_for(
            lambda: all(len(w.acked()) >= m + 20 for w, m in zip(workers, marks, strict=True)),
            "both workers acknowledged again after the kill",
        )
    finally:
        stop.touch()
        for w in workers:
            try:
                w.proc.wait(60)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
    assert [w.failures() for w in workers] == [[], []]
    assert all(w.lines()[-1] == "done" for w in workers)
    total = sum(v for w in workers for v, _ in w.acked())
    with Client(config) as c:
        got = c.read(TENSOR)
    assert np.array_equal(got, np.full(SHAPE, total)), f"sum {got[0]} != acknowledged {total}"

    # Every copy at the same version once the writes stop; only the victim restarted.
    def converged() -> dict[str, dict] | None:
        rows = status_rows(config)
        return rows if all(r["skew"] == 0 for r in rows.values()) else None

    rows = wait_for(converged, "replicas at the same versions")
    assert {n: (r["up"], r["restarts"]) for n, r in rows.items()} == {
        n: (True, int(n == victim)) for n in rows
    }
    log = (local_dir / LOG_FILE).read_text()
    assert f"daemon {victim} killed by SIGKILL; restarting it" in log, log
    assert f"daemon {victim} is back" in log and "caught up from its replicas" in log, log
    resumed = max(min(t for _, t in w.acked() if t > killed_at) - killed_at for w in workers)
    print(f"writes resumed {resumed:.2f} s after kill -9 of {victim} (target 2 s)")


@contextlib.contextmanager
def paused(pid: int) -> Iterator[None]:
    """The process stopped (SIGSTOP) inside the block: irdma local cannot restart a daemon
    before the test has looked at the gap."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_with_one_copy_a_dead_daemons_shards_are_unavailable_until_it_is_back(
    local_dir: Path,
) -> None:
    config = Path(start(local_dir, "--nodes", "2").stdout.strip())
    x = np.arange(40000, dtype=np.float64)
    with Client(config) as c:
        c.write(TENSOR, x)
    irdma(None, "local", "--dir", str(local_dir), "--stop")  # the snapshot holds x now
    start(local_dir, "--nodes", "2")
    victim = load_config(config).primary_for(tensor_key(TENSOR), 0).name
    [supervisor] = supervisors(local_dir)
    old_pid = daemon_pid(local_dir, victim)
    with paused(supervisor):
        os.kill(old_pid, signal.SIGKILL)
        wait_gone([old_pid])
        with Client(config) as c, pytest.raises(DaemonUnavailable, match=f"daemon {victim}"):
            c.read(TENSOR)
    wait_for(lambda: status_rows(config)[victim]["up"], f"{victim} restarted")
    with Client(config) as c:
        assert np.array_equal(c.read(TENSOR), x)  # back from its snapshot
    log = (local_dir / LOG_FILE).read_text()
    assert f"daemon {victim} is back" in log and "from its snapshot" in log, log


def test_a_daemon_that_keeps_crashing_is_given_up_on(local_dir: Path) -> None:
    config = Path(start(local_dir, "--nodes", "2").stdout.strip())
    victim = load_config(config).nodes[1]
    [supervisor] = supervisors(local_dir)
    old_pid = daemon_pid(local_dir, victim.name)
    # Another program takes the daemon's port while irdma local is paused, so every
    # restart fails at once ("cannot serve on ...").
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with paused(supervisor):
            os.kill(old_pid, signal.SIGKILL)
            wait_gone([old_pid])
            squatter.bind((victim.address.host, victim.address.port))
            squatter.listen()
        log = local_dir / LOG_FILE
        wait_for(lambda: "giving up on it" in log.read_text(), "irdma local gave up")
        text = log.read_text()
        assert f"daemon {victim.name} exited with status 1; it crashed 5 times in a row" in text
        row = status_rows(config)[victim.name]
        assert not row["up"] and row["supervisor"] == "failed"
        # Every restart met the squatter; the kill -9 was the first fast crash if it came
        # within 10 s of the daemon's start, so 4 or 5 restarts.
        assert text.count(f"cannot serve on {victim.address}") == row["restarts"] in (4, 5), text
        assert "gave up after 5 fast crashes" in row["error"]
        # The other daemon still serves, and a stop still stops everything cleanly.
        assert status_rows(config)["n1"]["up"]
    assert irdma(None, "local", "--dir", str(local_dir), "--stop").returncode == 0
    assert daemons_using(str(config)) == []
