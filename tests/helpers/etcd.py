"""A real etcd server for tests: Debian's etcd-server, one member, in a temp dir.

Started on free loopback ports (or on an address inside a network namespace),
waited for until it answers, and stopped (SIGTERM, then SIGKILL) however the
test ends. ``deploy/setup.sh`` installs the package.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from .processes import stop_process

START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    """One etcd member listening on ``host``:``client_port`` (the ``endpoint``)."""

    def __init__(
        self, data_dir: Path, host: str = "127.0.0.1", prefix: list[str] | None = None
    ) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed (deploy/setup.sh installs etcd-server)")
        self.data_dir = data_dir
        self.host = host
        self.client_port, self.peer_port = free_port(), free_port()
        self.endpoint = f"http://{host}:{self.client_port}"
        peer = f"http://{host}:{self.peer_port}"
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.command = [
            *(prefix or []),  # e.g. ip netns exec NAME
            binary,
            "--name",
            "test",
            "--data-dir",
            str(data_dir),
            "--listen-client-urls",
            self.endpoint,
            "--advertise-client-urls",
            self.endpoint,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"test={peer}",
            # Quick elections (one member): leases and restarts settle fast.
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
        ]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log()}")
            if self.healthy():
                return
            time.sleep(0.1)
        raise RuntimeError(f"etcd did not answer within {START_TIMEOUT:g} s: {self.log()}")

    def healthy(self) -> bool:
        url = f"{self.endpoint}/health"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=1) as a:
            return b'"true"' in a.read()
        return False

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


@contextlib.contextmanager
def etcd_server(data_dir: Path, **kwargs) -> Iterator[EtcdServer]:
    server = EtcdServer(data_dir, **kwargs)
    try:
        server.start()
        yield server
    finally:
        server.stop()
