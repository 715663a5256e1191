"""Fixtures: real psd daemons on loopback, always torn down."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from irdma import Client
from irdma.auth import ClientHandshake, cluster_secret
from irdma.cli.local import psd_command, write_config
from irdma.cluster import ClusterConfig, load_config
from irdma.protocol import HEADER_SIZE, Header, Op, decode_json, tensor_key, unpack_header

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


def stop_process(proc: subprocess.Popen, grace: float, *, wake: bool = False) -> None:
    """SIGTERM ``proc`` (after SIGCONT with ``wake``: a paused process cannot handle
    it), wait up to ``grace`` seconds, then SIGKILL it; nothing if it has exited."""
    if proc.poll() is not None:
        return
    if wake:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def hello(config: ClusterConfig, name: str) -> dict:
    """One daemon's HELLO answer, over a raw socket (no client machinery)."""
    node = config.node(name)
    with socket.create_connection((node.address.host, node.address.port), 2.0) as s:
        secret = cluster_secret(config)
        if secret is not None:
            raw_authenticate(s, secret)
        s.sendall(Header(op=Op.HELLO).pack())
        head = recv_exactly(s, HEADER_SIZE)
        header = unpack_header(head)
        return decode_json(recv_exactly(s, header.length))


def recv_frame(s: socket.socket) -> tuple[Header, bytes]:
    """One whole frame from a raw socket."""
    header = unpack_header(recv_exactly(s, HEADER_SIZE))
    return header, recv_exactly(s, header.length)


def raw_authenticate(s: socket.socket, secret: bytes) -> list[bytes]:
    """The AUTH handshake over a blocking socket (irdma.auth is sans-IO); the frames sent."""
    handshake = ClientHandshake(secret, "daemon")
    sent = [handshake.challenge()]
    s.sendall(sent[0])
    sent.append(handshake.answer_challenge(*recv_frame(s)))
    s.sendall(sent[1])
    handshake.finish(*recv_frame(s))
    return sent


def processes_with(match: Callable[[list[bytes]], bool]) -> list[int]:
    """PIDs of the processes whose command line (its arguments, from /proc) ``match``es."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if match(argv):
            pids.append(int(entry.name))
    return pids


def write_secret(path: Path, secret: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(secret)
    path.chmod(mode)
    return path


def recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("daemon closed the connection")
        buf += chunk
    return bytes(buf)


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
    extra: dict[str, float] | None = None,
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three daemons shared by a test module (64 KiB shards, so tensors span them all)."""
    c = make_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three daemons for one test that may kill or pause them (2 s client timeout)."""
    c = make_cluster(tmp_path, timeout=2.0)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def client(cluster: Cluster) -> Iterator[Client]:
    c = Client(cluster.config_path)
    try:
        yield c
    finally:
        c.close()


@dataclass
class Mount:
    """A real FUSE mount of a cluster, served by an `irdma mount --foreground` process."""

    path: Path
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def unmount(self) -> None:
        """SIGTERM the mount process (it pushes pending writes), then make sure it is gone."""
        stop_process(self.proc, 20)
        if is_mounted(self.path):  # a dead mount: os.path.ismount says False for those
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], check=False)


def is_mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point according to /proc/mounts (works for dead mounts)."""
    target = str(path.absolute())
    with open("/proc/mounts") as f:
        return any(line.split()[1] == target for line in f)


def mount_command(config: Path, *args: str) -> list[str]:
    """The ``irdma mount`` command line for a cluster config."""
    return [sys.executable, "-m", "irdma", "--config", str(config), "mount", *args]


def start_mount(cluster: Cluster, path: Path, *extra: str) -> Mount:
    path.mkdir(parents=True, exist_ok=True)
    log_path = path.parent / f"{path.name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            mount_command(cluster.config_path, str(path), "--foreground", *extra),
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    m = Mount(path, proc, log_path)
    deadline = time.monotonic() + READY_TIMEOUT
    while not os.path.ismount(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            m.unmount()
            raise RuntimeError(f"mount of {path} failed: {m.log()}")
        time.sleep(0.05)
    return m


@pytest.fixture
def mount(cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    """The module's cluster mounted at a fresh directory; always unmounted."""
    m = start_mount(cluster, tmp_path / "mnt")
    try:
        yield m.path
    finally:
        m.unmount()
