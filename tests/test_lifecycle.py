"""psd under a stand-in service manager: a real daemon with $NOTIFY_SOCKET and $WATCHDOG_USEC.

The test owns the notify socket (an abstract name, as systemd may use), so it
sees exactly what systemd would: READY, STATUS, WATCHDOG, RELOADING, STOPPING.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from irdma_psd.lifecycle import Lifecycle, log_level_for
from irdma_psd.snapshot import SNAPSHOT_FILE, read_snapshot_header

from irdma import Client
from irdma.cli.local import psd_command, write_config
from irdma.cluster import load_config, parse_config
from irdma.errors import ConfigError
from irdma.sdnotify import Notifier

from .helpers.processes import stop_process

pytestmark = pytest.mark.timeout(90)

WATCHDOG_USEC = 400_000  # pings every 0.2 s
WAIT = 20.0


@dataclass
class Manager:
    """The service manager's side: the notify socket and what arrived on it."""

    sock: socket.socket
    address: str
    seen: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def open(cls) -> Manager:
        name = f"irdma-test-{secrets.token_hex(8)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(b"\0" + name.encode())
        return cls(sock, "@" + name)

    def next(self, timeout: float) -> dict[str, str] | None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096).decode()
        except TimeoutError:
            return None
        msg = dict(line.split("=", 1) for line in data.split("\n"))
        self.seen.append(msg)
        return msg

    def wait_for(self, key: str, timeout: float = WAIT) -> dict[str, str]:
        """The first message with ``key`` (every message before it is kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            msg = self.next(left)
            if msg is not None and key in msg:
                return msg
        raise AssertionError(f"no {key} within {timeout} s; got {self.seen}")

    def collect(self, seconds: float) -> list[dict[str, str]]:
        """Everything that arrives within ``seconds``."""
        out = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            msg = self.next(left)
            if msg is not None:
                out.append(msg)
        return out

    def drain(self) -> None:
        while self.next(0.01) is not None:
            pass

    def close(self) -> None:
        self.sock.close()


@dataclass
class Daemon:
    proc: subprocess.Popen
    log_path: Path
    config_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc, 15, wake=True)


def set_log_level(config_path: Path, level: str) -> None:
    lines = [x for x in config_path.read_text().splitlines() if not x.startswith("log_level")]
    config_path.write_text(f'log_level = "{level}"\n' + "\n".join(lines) + "\n")


@pytest.fixture
def manager() -> Iterator[Manager]:
    m = Manager.open()
    try:
        yield m
    finally:
        m.close()


@pytest.fixture
def start(tmp_path: Path, manager: Manager) -> Iterator[Callable[..., Daemon]]:
    """Start a node of a generated cluster as systemd would (NOTIFY_SOCKET, WATCHDOG_USEC)."""
    daemons: list[Daemon] = []
    configs: dict[tuple[int, int, float], Path] = {}

    def _start(
        name: str = "n1",
        *,
        nodes: int = 1,
        replicas: int = 1,
        notify: bool = True,
        snapshot_interval: float = 60,
    ):
        key = (nodes, replicas, snapshot_interval)
        if key not in configs:
            configs[key] = write_config(
                tmp_path / f"c{nodes}r{replicas}s{snapshot_interval}",
                nodes,
                replicas=replicas,
                arena_size=32 << 20,
                shard_size=64 << 10,
                timeout=5.0,
                extra={"snapshot_interval": snapshot_interval},
            )
            set_log_level(configs[key], "INFO")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
        if notify:
            env |= {"NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": str(WATCHDOG_USEC)}
        log_path = configs[key].parent / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                psd_command(configs[key], name),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        d = Daemon(proc, log_path, configs[key])
        daemons.append(d)
        return d

    try:
        yield _start
    finally:
        for d in daemons:
            d.stop()


def stopped(pid: int) -> bool:
    """Whether the process is in the stopped state (SIGSTOP took effect)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def test_ready_only_once_the_daemon_answers(start: Callable[..., Daemon], manager: Manager):
    d = start()
    ready = manager.wait_for("READY")
    # Whatever came first said it was loading; nothing said ready or serving.
    assert manager.seen[0]["STATUS"].startswith("loading snapshot from ")
    assert all("READY" not in m for m in manager.seen[:-1])
    node = load_config(d.config_path).nodes[0]
    assert ready == {"READY": "1", "STATUS": f"serving on {node.address}"}
    # The first request after READY is answered: no retry, no wait.
    with Client(d.config_path, timeout=2.0) as c:
        c.write("m/w", np.arange(1000, dtype=np.float32))
        np.testing.assert_array_equal(c.read("m/w"), np.arange(1000, dtype=np.float32))


def test_watchdog_pings_stop_while_the_daemon_is_paused(
    start: Callable[..., Daemon], manager: Manager
):
    d = start()
    manager.wait_for("READY")
    # Pings arrive (their period is checked on a virtual clock in test_sdnotify).
    for _ in range(3):
        manager.wait_for("WATCHDOG")
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 5
        while not stopped(d.proc.pid):
            assert time.monotonic() < deadline, "SIGSTOP did not take effect"
            time.sleep(0.01)
        manager.drain()  # what was sent before it stopped
        assert manager.collect(1.0) == []  # a hung event loop sends nothing
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    manager.wait_for("WATCHDOG", timeout=2.0)  # and resumes


def test_sigterm_says_stopping_and_leaves_a_snapshot(
    start: Callable[..., Daemon], manager: Manager
):
    d = start()
    manager.wait_for("READY")
    with Client(d.config_path, timeout=2.0) as c:
        c.write("m/w", np.ones(50_000, np.float32))
    data_dir = load_config(d.config_path).nodes[0].data_dir
    assert not (data_dir / SNAPSHOT_FILE).exists()  # snapshot_interval 60 s: none yet
    d.proc.send_signal(signal.SIGTERM)
    stopping = manager.wait_for("STOPPING")
    assert stopping["STATUS"] == "stopping: writing the final snapshot"
    assert d.proc.wait(15) == 0
    header = read_snapshot_header(data_dir / SNAPSHOT_FILE)
    assert header["seq"] >= 1
    assert "snapshot 1 written" in d.log()


def test_sighup_reloads_the_log_level_from_the_config(
    start: Callable[..., Daemon], manager: Manager
):
    d = start()
    manager.wait_for("READY")
    manager.collect(0.5)
    assert " DEBUG " not in d.log()  # INFO: the pings are not logged

    set_log_level(d.config_path, "DEBUG")
    d.proc.send_signal(signal.SIGHUP)
    reloading = manager.wait_for("RELOADING")
    assert int(reloading["MONOTONIC_USEC"]) > 0
    assert manager.wait_for("READY")["STATUS"].startswith("serving on ")
    wait_until(lambda: "DEBUG notify: WATCHDOG=1" in d.log(), "debug lines after SIGHUP")
    assert "SIGHUP: log level DEBUG" in d.log()

    set_log_level(d.config_path, "WARNING")
    d.proc.send_signal(signal.SIGHUP)
    manager.wait_for("RELOADING")
    manager.wait_for("READY")
    wait_until(lambda: "SIGHUP: log level WARNING" in d.log(), "the WARNING reload line")
    manager.collect(0.6)  # three pings at WARNING: none logged
    after = d.log().split("SIGHUP: log level WARNING", 1)[1]
    assert " DEBUG " not in after and " INFO " not in after
    assert d.proc.poll() is None  # SIGHUP no longer ends the daemon


def test_status_follows_catching_up_then_serving(start: Callable[..., Daemon], manager: Manager):
    # Two nodes, two copies: alone, n1 cannot reach a majority and catches up.
    start("n1", nodes=2, replicas=2)
    ready = manager.wait_for("READY")
    assert ready["STATUS"] == "catching up from replicas"
    start("n2", nodes=2, replicas=2, notify=False)
    deadline = time.monotonic() + WAIT
    while True:
        msg = manager.wait_for("STATUS", timeout=max(0.1, deadline - time.monotonic()))
        if msg["STATUS"].startswith("serving on "):
            break


def test_status_says_snapshotting_while_it_does(start: Callable[..., Daemon], manager: Manager):
    start(snapshot_interval=0.3)
    serving = manager.wait_for("READY")["STATUS"]
    assert manager.wait_for("STATUS") == {"STATUS": f"{serving}; snapshotting"}
    assert manager.wait_for("STATUS") == {"STATUS": serving}


def wait_until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


# -- Lifecycle without a daemon ------------------------------------------------------


@pytest.fixture
def lifecycle_parts(tmp_path: Path, manager: Manager):
    path = write_config(tmp_path, 1, arena_size=1 << 20)
    set_log_level(path, "INFO")
    config = load_config(path)
    levels: list[str] = []
    notifier = Notifier(manager.address)
    yield config, notifier, levels
    notifier.close()


def test_reload_with_a_broken_config_keeps_the_level(
    lifecycle_parts, manager: Manager, caplog: pytest.LogCaptureFixture
):
    config, notifier, levels = lifecycle_parts
    lc = Lifecycle(config.nodes[0], config, notifier=notifier, set_level=levels.append)
    lc.started(True)
    assert config.path is not None
    set_log_level(config.path, "LOUD")
    with caplog.at_level(logging.ERROR, logger="psd"):
        lc.reload()
    assert levels == []
    assert "log_level" in caplog.text and "unchanged" in caplog.text
    # The manager still hears the reload end.
    assert manager.wait_for("RELOADING")
    assert manager.wait_for("READY")


def test_log_level_on_the_command_line_wins(lifecycle_parts, manager: Manager):
    config, notifier, levels = lifecycle_parts
    assert log_level_for(None, config) == "INFO"
    assert log_level_for("debug", config) == "DEBUG"
    lc = Lifecycle(
        config.nodes[0], config, cli_log_level="ERROR", notifier=notifier, set_level=levels.append
    )
    set_log_level(config.path, "DEBUG")
    lc.reload()
    assert levels == []


def test_status_line_shows_an_activity(lifecycle_parts, manager: Manager):
    config, notifier, _ = lifecycle_parts
    lc = Lifecycle(config.nodes[0], config, notifier=notifier)
    assert lc.describe() == "starting"
    lc.started(False)
    assert manager.wait_for("READY")["STATUS"] == "catching up from replicas"
    lc.set_serving(True)
    with lc.activity("snapshotting"):
        pass
    statuses = [m["STATUS"] for m in manager.collect(0.2)]
    address = config.nodes[0].address
    assert statuses == [
        f"serving on {address}",
        f"serving on {address}; snapshotting",
        f"serving on {address}",
    ]


def test_log_level_key_in_the_config(tmp_path: Path) -> None:
    nodes = [{"name": "a", "address": "127.0.0.1:7", "arena_size": "1MiB"}]
    assert parse_config({"nodes": nodes}).log_level is None
    assert parse_config({"nodes": nodes, "log_level": "debug"}).log_level == "DEBUG"
    with pytest.raises(ConfigError, match="log_level: 'LOUD' must be one of DEBUG, INFO"):
        parse_config({"nodes": nodes, "log_level": "LOUD"})
