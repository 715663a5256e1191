"""A cluster on etcd grows and shrinks under load: a daemon joins, one is drained, one is
killed for good, while clients accumulate and read; nothing acknowledged is lost.

Real daemons and a real etcd server (Debian's), on network-namespace hosts (each
daemon, etcd and the clients on hosts of their own, ``tests/helpers/netns.py``) and on this
machine's loopback (where clients reach daemons over shared memory, one-sided
reads included). The clients run in processes of their own
(``tests/elastic_workers.py``); ``irdma drain`` is run as an operator would. The
heartbeats' failure timeout is far beyond the test (60 s): what happens can only
come from etcd's leases and epochs.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from irdma.cli.local import free_ports, psd_command
from irdma.cluster import render_config

from . import elastic_workers as workers
from .helpers.etcd import etcd_server
from .helpers.netns import Network, netns_problem, remove_stale
from .helpers.processes import stop_process
from .nemesis.run import ETCD_HOST, start_etcd

pytestmark = pytest.mark.timeout(300)

WORKERS = str(Path(workers.__file__))
DAEMONS = ("n1", "n2", "n3")
JOINER = "n4"
WAIT = 90.0  # longest a move may take here
LOG_TIME = {**os.environ, "IRDMA_LOG_TIME": "1"}  # daemons' logs compared line by line


class Hosts:
    """Where processes run: this machine (``net`` None) or the hosts of a network."""

    def __init__(self, net: Network | None) -> None:
        self.net = net
        names = [*DAEMONS, JOINER]
        ports = free_ports("127.0.0.1", len(names)) if net is None else [7401] * len(names)
        self.ports = dict(zip(names, ports, strict=True))

    def address(self, host: str) -> str:
        return "127.0.0.1" if self.net is None else self.net.address(host)

    def run(self, host: str, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        if self.net is None:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kwargs)
        return self.net.run(host, argv, **kwargs)

    def output(self, host: str, argv: list[str], timeout: float = WAIT + 30) -> str:
        if self.net is None:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            if done.returncode:
                raise AssertionError(f"{argv} failed: {done.stderr}")
            return done.stdout
        return self.net.check_output(host, argv, timeout=timeout)


@contextlib.contextmanager
def placed(kind: str, tmp_path: Path) -> Iterator[tuple[Hosts, str]]:
    """The hosts and a running etcd's endpoint: on this machine, or on namespace hosts
    (etcd on a host of its own)."""
    if kind == "loopback":
        with etcd_server(tmp_path / "etcd") as etcd:
            yield Hosts(None), etcd.endpoint
        return
    if (problem := netns_problem()) is not None:
        pytest.fail(f"network namespaces unavailable: {problem}")
    remove_stale()
    with Network([*DAEMONS, JOINER, ETCD_HOST, "client"]) as net:
        yield Hosts(net), start_etcd(net, tmp_path)  # stopped with the network


def write_configs(hosts: Hosts, endpoint: str, directory: Path) -> tuple[Path, Path]:
    """The cluster's config (n1-n3, used by them and the clients) and the joiner's own
    (it names only itself)."""
    table = (
        f'\n[etcd]\nendpoints = ["{endpoint}"]\nprefix = "/irdma/elastic-{uuid.uuid4().hex[:8]}"\n'
        "lease_ttl = 1\nreplace_after = 2\n"
    )

    def config(names: tuple[str, ...], path: Path) -> Path:
        nodes = [
            (n, f"tcp://{hosts.address(n)}:{hosts.ports[n]}", str(directory / n), 64 << 20)
            for n in names
        ]
        text = render_config(nodes, shard_size=workers.SHARD, replicas=2, timeout=5.0,
                             extra={"failure_timeout": 60.0})  # fmt: skip
        path.write_text(text + table)
        return path

    return config(DAEMONS, directory / "cluster.toml"), config((JOINER,), directory / "n4.toml")


def worker(hosts: Hosts, config: Path, *args: str) -> dict[str, Any]:
    out = hosts.output("client", [sys.executable, WORKERS, args[0], "--config", str(config),
                                  *args[1:]])  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["netns", "loopback"])
def test_join_drain_and_kill_lose_no_acknowledged_update(kind: str, tmp_path: Path) -> None:
    with placed(kind, tmp_path) as (hosts, endpoint):
        cluster, joiner = write_configs(hosts, endpoint, tmp_path)
        daemons: dict[str, subprocess.Popen] = {}

        def start(name: str, config: Path) -> None:
            with (tmp_path / f"{name}.log").open("ab") as log:
                daemons[name] = hosts.run(name, psd_command(config, name), stdout=log,
                                          stderr=subprocess.STDOUT, env=LOG_TIME)  # fmt: skip

        stop = tmp_path / "stop"
        progress = tmp_path / "progress.json"
        load: subprocess.Popen | None = None
        try:
            for name in DAEMONS:
                start(name, cluster)
            assert worker(hosts, cluster, "wait-epoch", "--member", "n3")["ok"]
            assert worker(hosts, cluster, "setup")["ok"]
            argv = [sys.executable, WORKERS, "load", "--config", str(cluster),
                    "--stop", str(stop), "--progress", str(progress)]  # fmt: skip
            load = hosts.run("client", argv, stdout=subprocess.PIPE)

            def progressed(since: dict[str, Any] | None = None) -> dict[str, Any]:
                """The clients' progress; waits until they moved on from ``since``."""
                deadline = time.monotonic() + WAIT
                while time.monotonic() < deadline:
                    if progress.exists():
                        now = json.loads(progress.read_text())
                        assert now["errors"] == [], now["errors"]
                        if since is None or (
                            min(now["acked"]) > min(since["acked"])
                            and now["reads"] > since["reads"]
                        ):
                            return now
                    time.sleep(0.1)
                raise AssertionError(f"the clients made no progress from {since}")

            before = progressed()

            # A fourth daemon joins: copies move to it, then it becomes a member.
            start(JOINER, joiner)
            epoch = worker(hosts, cluster, "wait-epoch", "--member", JOINER)
            assert epoch["ok"], epoch
            hello = worker(hosts, cluster, "held", "--node", JOINER)
            copies = hello["shards"]["primary"] + hello["shards"]["backup"]
            fraction = copies / (workers.TOTAL_SHARDS * 2)
            assert abs(fraction - 0.25) <= 0.025, fraction
            assert hello["epoch"]["number"] == epoch["epoch"]["epoch"]
            assert hello["copies"]["received"] >= copies  # copied in, not made empty
            joined = progressed(before)  # the clients went on through the move

            # n2 is drained by the operator's command.
            argv = [sys.executable, "-m", "irdma", "drain", "n2", "--config", str(cluster)]
            out = hosts.output("client", argv)
            assert "n2: drained" in out, out
            assert "n2" not in worker(hosts, cluster, "held", "--node", "n1")["epoch"]["members"]
            drained = progressed(joined)

            # n3 dies for good: after replace_after its copies are made again elsewhere.
            daemons["n3"].kill()
            daemons["n3"].wait(10)
            epoch = worker(hosts, cluster, "wait-epoch", "--out", "n3")
            assert epoch["ok"] and epoch["epoch"]["members"] == ["n1", "n4"], epoch
            progressed(drained)

            stop.touch()
            out, _ = load.communicate(timeout=60)
            result = json.loads(out.strip().splitlines()[-1])
            assert result["errors"] == [], result["errors"]
            (tmp_path / "acked.json").write_text(json.dumps(result))
            report = worker(hosts, cluster, "check", "--acked", str(tmp_path / "acked.json"))
            assert report["ok"], report
            assert report["shards"] == workers.TOTAL_SHARDS
        finally:
            stop.touch()
            if load is not None and load.poll() is None:
                stop_process(load, 30)
            for proc in daemons.values():
                stop_process(proc, 10)
