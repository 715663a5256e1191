"""One nemesis run end to end, for ``tests/test_nemesis.py`` and ``bench/nemesis.py``.

Daemons on hosts ``d1..dN`` (network namespaces, ``tests/helpers/netns.py``), two copies of
every shard; client processes and a monitor on host ``client``. The clients run for
``seconds`` while the nemesis applies its schedule; then everything is healed, the
cluster given time to become ready, every replica's copy read, and the histories
merged (``history.jsonl``) and checked. Every process and namespace goes with the
``Network``, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from irdma.cli.local import psd_command
from irdma.cluster import render_config

from ..helpers.netns import Network
from . import history
from .checker import Report, check
from .faults import SYMMETRIC, Fault, Nemesis, schedule
from .workload import SHARD_SIZE

WORKERS = str(Path(__file__).with_name("workers.py"))
PORT = 7400
CLIENT_HOST = "client"
ETCD_HOST = "etcd"


@dataclass
class RunConfig:
    seed: int
    seconds: float  # how long clients work and the nemesis injects faults
    daemons: int = 5
    clients: int = 4
    kinds: Sequence[str] = SYMMETRIC
    think: float = 0.01  # longest pause of a client between operations
    # Of accumulates, reads, writes, register reads, model commits, model version reads.
    weights: tuple[float, ...] = (5, 3, 1, 1, 1, 1)
    shared_registers: bool = False  # every client writes one register (else one writer each)
    # Membership in etcd (an etcd member on a host of its own, out of the nemesis's
    # reach): daemons are up while their 1 s leases are, not by heartbeats.
    etcd: bool = False
    # Processes spinning on the CPU while the clients run: races that hide on an
    # idle machine (a task preempted between two steps) show under contention.
    busy: int = 0


@dataclass
class RunResult:
    config: RunConfig
    report: Report
    faults: list[Fault]
    history: Path
    dir: Path
    logs: dict[str, str] = field(default_factory=dict)

    def explain(self) -> str:
        """The seed, the faults applied and the checker's findings (for a failure)."""
        lines = [f"seed {self.config.seed}; history {self.history}"]
        lines += [f"  fault {i}: {f.describe()}" for i, f in enumerate(self.faults)]
        lines.append(self.report.summary())
        return "\n".join(lines)


class NemesisCluster:
    """The daemons and helper processes of one run (the nemesis's ``Target``)."""

    def __init__(self, net: Network, workdir: Path, daemons: int, etcd: str | None = None) -> None:
        self.net = net
        self.dir = workdir
        self.hosts = [f"d{i + 1}" for i in range(daemons)]
        nodes = [
            (h, f"tcp://{net.address(h)}:{PORT}", str(workdir / h), 64 << 20) for h in self.hosts
        ]
        self.config_path = workdir / "cluster.toml"
        text = render_config(
            nodes,
            shard_size=SHARD_SIZE,
            replicas=2,
            timeout=2.0,
            extra={"heartbeat": 0.2, "failure_timeout": 1.0},
        )
        if etcd is not None:
            text += (
                f'\n[etcd]\nendpoints = ["{etcd}"]\nprefix = "/irdma/nemesis"\n'
                "lease_ttl = 1\nreplace_after = 2\n"
            )
        self.config_path.write_text(text)
        self.procs: dict[str, subprocess.Popen] = {}
        self.monitor: subprocess.Popen | None = None

    # -- processes -------------------------------------------------------------

    def start(self, host: str) -> None:
        proc = self.procs.get(host)
        if proc is not None and proc.poll() is None:
            return
        self.procs[host] = self.net.run(
            host, psd_command(self.config_path, host), log=self.dir / f"{host}.log"
        )

    def kill(self, host: str) -> None:
        proc = self.procs[host]
        proc.kill()
        proc.wait(10)

    def pause(self, host: str) -> None:
        os.kill(self.procs[host].pid, signal.SIGSTOP)

    def resume(self, host: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.procs[host].pid, signal.SIGCONT)

    def partition(self, host: str) -> None:
        self.net.partition(host)

    def heal(self, host: str) -> None:
        self.net.heal(host)

    def cut_link(self, a: str, b: str) -> None:
        self.net.cut_link(a, b)

    def restore_link(self, a: str, b: str) -> None:
        self.net.restore_link(a, b)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for host, proc in self.procs.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"psd {host} did not stop within 30 s of SIGTERM") from None

    def start_all(self) -> None:
        for host in self.hosts:
            self.start(host)

    def drain(self, host: str) -> None:
        self._cli("drain", host, "--no-wait")

    def undrain(self, host: str) -> None:
        self._cli("drain", host, "--cancel")

    def _cli(self, *args: str) -> None:
        argv = [sys.executable, "-m", "irdma", *args, "--config", str(self.config_path)]
        self.net.check_output(CLIENT_HOST, argv, timeout=30)

    def heal_everything(self) -> None:
        """Undo any fault still in force (idempotent)."""
        for host in self.hosts:
            if host in self.procs:
                self.resume(host)
            self.net.heal(host)
            for other in self.hosts:
                if other > host:
                    self.net.restore_link(host, other)
            self.start(host)

    # -- helpers in the client host ----------------------------------------------

    def worker(self, *args: str, timeout: float = 120) -> dict[str, Any]:
        argv = [sys.executable, WORKERS, args[0], "--config", str(self.config_path), *args[1:]]
        out = self.net.check_output(CLIENT_HOST, argv, timeout=timeout)
        return json.loads(out.strip().splitlines()[-1])

    def spawn(self, *args: str, log: Path) -> subprocess.Popen:
        argv = [sys.executable, WORKERS, args[0], "--config", str(self.config_path), *args[1:]]
        return self.net.run(CLIENT_HOST, argv, log=log)

    def start_monitor(self) -> None:
        argv = [sys.executable, WORKERS, "monitor", "--config", str(self.config_path)]
        self.monitor = self.net.run(
            CLIENT_HOST, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        _readline(self.monitor, 60)

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        assert self.monitor is not None and self.monitor.stdin is not None
        self.monitor.stdin.write(f"ready {timeout}\n")
        self.monitor.stdin.flush()
        return json.loads(_readline(self.monitor, timeout + 30))

    def logs(self, tail: int = 6000) -> dict[str, str]:
        out = {}
        for path in sorted(self.dir.glob("*.log")):
            out[path.stem] = path.read_text(errors="replace")[-tail:]
        return out


def start_etcd(net: Network, workdir: Path, timeout: float = 30) -> str:
    """One etcd member on the etcd host (it goes with the network); its client URL."""
    binary = shutil.which("etcd")
    if binary is None:
        raise RuntimeError("etcd is not installed (deploy/setup.sh installs etcd-server)")
    addr = net.address(ETCD_HOST)
    client, peer = f"http://{addr}:2379", f"http://{addr}:2380"
    argv = [binary, "--name", "nemesis", "--data-dir", str(workdir / "etcd-data")]
    argv += ["--listen-client-urls", client, "--advertise-client-urls", client]
    argv += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
    argv += ["--initial-cluster", f"nemesis={peer}"]
    argv += ["--heartbeat-interval", "50", "--election-timeout", "500"]
    proc = net.run(ETCD_HOST, argv, log=workdir / "etcd.log")
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"etcd exited: {(workdir / 'etcd.log').read_text()[-2000:]}")
        health = [sys.executable, "-c", HEALTH, f"{client}/health"]
        with contextlib.suppress(Exception):
            if net.check_output(ETCD_HOST, health, timeout=5).strip() == "ok":
                return client
        if time.monotonic() > deadline:
            raise RuntimeError(f"etcd did not answer within {timeout:g} s")
        time.sleep(0.2)


HEALTH = (
    "import sys, urllib.request; "
    "print('ok' if b'\"true\"' in urllib.request.urlopen(sys.argv[1], timeout=2).read() else 'no')"
)


@contextlib.contextmanager
def busy_cores(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU for the block's duration, killed after it
    whatever happens (each also ends by itself after an hour, if this one is killed)."""
    spin = "import time\nend = time.monotonic() + 3600\nwhile time.monotonic() < end: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """One line from a helper's stdout, or RuntimeError after ``timeout`` (never hangs)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise RuntimeError(f"helper pid {proc.pid} said nothing for {timeout:g} s")
        line = proc.stdout.readline()
    finally:
        sel.close()
    if not line:
        raise RuntimeError(f"helper pid {proc.pid} exited (status {proc.poll()})")
    return line


def _wait_for_files(paths: list[Path], procs: list[subprocess.Popen], timeout: float) -> None:
    """Wait until every client said it is ready (a file each); fail if one exited."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        dead = [p.returncode for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"clients not ready (exit statuses {dead}): {paths}")
        time.sleep(0.05)


def run(config: RunConfig, workdir: Path, log: Callable[[str], None] = print) -> RunResult:
    """Build the cluster, run clients and the nemesis, heal, read the copies, check."""
    workdir.mkdir(parents=True, exist_ok=True)
    faults = schedule(config.seed, [f"d{i + 1}" for i in range(config.daemons)], config.kinds)
    hosts = [*(f"d{i + 1}" for i in range(config.daemons)), CLIENT_HOST]
    with Network([*hosts, ETCD_HOST] if config.etcd else hosts) as net:
        endpoint = start_etcd(net, workdir) if config.etcd else None
        cluster = NemesisCluster(net, workdir, config.daemons, endpoint)
        cluster.start_all()
        cluster.start_monitor()
        state = cluster.wait_ready(60)
        if not state.get("ready"):
            raise RuntimeError(f"the cluster did not start: {state}\n{cluster.logs()}")
        cluster.worker("setup")
        files = [workdir / f"client{i}.jsonl" for i in range(config.clients)]
        go = workdir / "go"
        clients = [
            cluster.spawn(
                "client",
                *("--process", str(i), "--clients", str(config.clients)),
                *("--seed", str(config.seed), "--go", str(go)),
                *("--history", str(files[i]), "--think", str(config.think)),
                *("--weights", ",".join(map(str, config.weights))),
                *(["--shared-registers"] if config.shared_registers else []),
                log=workdir / f"client{i}.log",
            )
            for i in range(config.clients)
        ]
        _wait_for_files([Path(f"{f}.ready") for f in files], clients, timeout=120)
        until = time.monotonic() + config.seconds
        tmp = go.with_suffix(".tmp")
        tmp.write_text(repr(until))
        tmp.rename(go)  # whole, at once: clients read it as soon as it exists
        nemesis_file = workdir / "nemesis.jsonl"
        with history.HistoryWriter(nemesis_file) as writer:
            nemesis = Nemesis(cluster, writer, log)
            with busy_cores(config.busy):
                nemesis.run(faults, until=until)
                for proc in clients:
                    # Bounded: an operation gives up within its timeout plus failover time.
                    proc.wait(max(0.0, until - time.monotonic()) + 120)
            cluster.heal_everything()
            final = cluster.wait_ready(90)
            if final.get("lent") is not None:
                log(f"forwards lent to a backup since each daemon started: {final['lent']}")
            writer.write(
                history.Record(
                    "fault",
                    history.NEMESIS,
                    len(nemesis.applied),
                    "heal",
                    time.monotonic(),
                    detail={
                        "phase": "ready" if final.get("ready") else "stuck",
                        "last": final.get("last"),
                    },
                )
            )
        bad_exit = {f"client{i}": p.returncode for i, p in enumerate(clients) if p.returncode}
        copies = None
        if final.get("ready"):
            cluster.worker("copies", "--out", str(workdir / "copies.json"))
            copies = json.loads((workdir / "copies.json").read_text())
        records = history.merge([*files, nemesis_file], workdir / "history.jsonl")
        report = check(records, copies)
        for name, code in bad_exit.items():
            report.add("client-crashed", f"{name} exited with status {code}")
        logs = cluster.logs()
    return RunResult(config, report, nemesis.applied, workdir / "history.jsonl", workdir, logs)
