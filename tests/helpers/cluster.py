"""Daemons started from a generated config, on loopback (or a given address);
tests may stop, kill or pause them. ``make_cluster`` starts them and waits."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from irdma import Client
from irdma.cli.local import psd_command, write_config
from irdma.cluster import ClusterConfig, load_config
from irdma.protocol import tensor_key

from .wire import hello

# How long a daemon may take to start listening (the soft-RoCE guest, under
# emulation, sets more).
READY_TIMEOUT = float(os.environ.get("IRDMA_TEST_READY_TIMEOUT", "20"))


@dataclass
class Cluster:
    """Daemons started from a generated config; tests may stop, kill or pause them."""

    dir: Path
    config_path: Path
    config: ClusterConfig
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    clients: list[Client] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.config.nodes]

    def start(self, name: str, *, wait: bool = True) -> None:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            psd_command(self.config_path, name),
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        self.procs[name] = proc
        if wait:
            self.wait_serving(name)

    def wait_serving(self, name: str) -> None:
        """Wait until the daemon listens and, with replicas, has caught up (HELLO says ready)."""
        self.wait_ready(name)
        if self.config.replicas == 1:
            return
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"psd {name} exited: {self.log(name)}")
            with contextlib.suppress(Exception):
                if hello(self.config, name).get("ready"):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"psd {name} did not catch up in {READY_TIMEOUT} s: {self.log(name)}")

    def wait_ready(self, name: str) -> None:
        node = self.config.node(name)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"psd {name} exited: {self.log(name)}")
            try:
                socket.create_connection((node.address.host, node.address.port), 0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"psd {name} not ready after {READY_TIMEOUT} s: {self.log(name)}")

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.procs[name].pid, sig)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.kill()
        proc.wait(10)

    def stop(self, name: str) -> int:
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        return proc.wait(10)

    def client(self, **kwargs) -> Client:
        c = Client(self.config_path, **kwargs)
        self.clients.append(c)
        return c

    def close(self) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                c.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)  # a paused daemon cannot handle SIGTERM
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def write_secret(path: Path, secret: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(secret)
    path.chmod(mode)
    return path


def name_on(config: ClusterConfig, node: str, prefix: str) -> str:
    """A tensor name under ``prefix`` whose shard 0 has ``node`` as its primary."""
    for i in range(10_000):
        name = f"{prefix}{i}"
        if config.primary_for(tensor_key(name), 0).name == node:
            return name
    raise AssertionError(f"no name under {prefix!r} places shard 0 on {node}")


def make_cluster(
    directory: Path,
    nodes: int = 3,
    *,
    arena_size: int = 64 << 20,
    shard_size: int = 64 << 10,
    timeout: float = 10.0,
    replicas: int = 1,
    extra: dict[str, float | bool] | None = None,
    secret: bytes | None = None,
    host: str = "127.0.0.1",
    scheme: str = "tcp",
    etcd: str | None = None,
) -> Cluster:
    """Start daemons for a generated config; ``secret`` makes them require it (``secret_file``);
    ``etcd`` is an ``[etcd]`` table's body (membership in etcd)."""
    path = write_config(
        directory,
        nodes,
        arena_size=arena_size,
        shard_size=shard_size,
        timeout=timeout,
        replicas=replicas,
        extra=extra,
        host=host,
        scheme=scheme,
    )
    if secret is not None:
        secret_path = write_secret(directory / "secret", secret)
        path.write_text(f'secret_file = "{secret_path}"\n' + path.read_text())
    if etcd is not None:
        path.write_text(path.read_text() + f"\n[etcd]\n{etcd}\n")
    cluster = Cluster(directory, path, load_config(path))
    try:
        for name in cluster.names:
            cluster.start(name, wait=replicas == 1)
        for name in cluster.names:
            cluster.wait_serving(name)
    except BaseException:
        cluster.close()
        raise
    return cluster
