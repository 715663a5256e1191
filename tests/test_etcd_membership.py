"""Daemons whose liveness comes from etcd leases (``[etcd]``), with a real etcd server.

The heartbeats' failure timeout is set far beyond the tests' patience (60 s),
so what the tests see (a killed primary replaced, a daemon without its lease
refusing updates) can only come from the leases.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio

import irdma
from irdma import Client
from irdma.cli.local import write_config
from irdma.cluster.epochs import Epoch
from irdma.cluster.etcd import Etcd
from irdma.cluster.registry import Registry
from irdma.protocol import tensor_key

from .helpers.cluster import Cluster, make_cluster
from .helpers.etcd import EtcdServer, etcd_server
from .helpers.wire import hello

pytestmark = pytest.mark.timeout(180)

N = 4096  # int64: 32 KiB, one shard


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_server(tmp_path_factory.mktemp("etcd") / "data") as s:
        yield s


def start_leased(server: EtcdServer, directory: Path, lease_ttl: int) -> Cluster:
    """Three daemons, two copies of each shard, membership in etcd under a fresh prefix.
    Clients give up on a request after 5 s plus two lease TTLs."""
    prefix = f"/irdma/test-{uuid.uuid4().hex[:8]}"
    body = f'endpoints = ["{server.endpoint}"]\nprefix = "{prefix}"\nlease_ttl = {lease_ttl}'
    return make_cluster(
        directory, 3, replicas=2, timeout=5.0, etcd=body, extra={"failure_timeout": 60.0}
    )


@pytest.fixture
def leased(server: EtcdServer, tmp_path: Path) -> Iterator[Cluster]:
    c = start_leased(server, tmp_path, lease_ttl=1)
    try:
        yield c
    finally:
        c.close()


def registry(cluster: Cluster) -> Registry:
    settings = cluster.config.etcd
    assert settings is not None
    return Registry.of(settings, timeout=5.0)


def registered(cluster: Cluster) -> set[str]:
    return set(trio.run(registry(cluster).members)[0])


def test_daemons_register_and_a_stopped_one_leaves_at_once(
    server: EtcdServer, tmp_path: Path
) -> None:
    """SIGTERM: the daemon revokes its lease on the way out (a 60 s lease would keep
    its registration a minute otherwise)."""
    c = start_leased(server, tmp_path, lease_ttl=60)
    try:
        assert registered(c) == {"n1", "n2", "n3"}
        c.stop("n2")
        assert registered(c) == {"n1", "n3"}
        # irdma status says so too.
        out = irdma_cli(c, "status")
        assert "not registered (down as the others see it): n2" in out, out
        assert "epoch 1: members n1, n2, n3" in out, out  # n2 is down, not replaced yet
        by_node = {r["node"]: r for r in json.loads(irdma_cli(c, "status", "--json"))}
        assert by_node["n1"]["registered"] is True and by_node["n2"]["registered"] is False
        assert by_node["n1"]["epoch"] == {
            "number": 1,
            "members": ["n1", "n2", "n3"],
            "target": None,
            "settled": True,
        }
    finally:
        c.close()


def irdma_cli(cluster: Cluster, *args: str) -> str:
    cmd = [sys.executable, "-m", "irdma", *args, "--config", str(cluster.config_path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout


def test_a_killed_primary_is_replaced_once_its_lease_expires(leased: Cluster) -> None:
    """Accumulates go on through a kill -9 of the shard's primary: its lease expires
    after 1 s and the backup takes over, well within the client's patience (5 s plus
    two TTLs; heartbeats alone would take 60 s, and the accumulate would fail). Every
    acknowledged accumulate is counted once."""
    name = "leased/count"
    primary = leased.config.replicas_for(tensor_key(name), 0)[0].name
    acked = 0
    errors: list[BaseException] = []
    killed = threading.Event()
    done = threading.Event()

    def accumulate() -> None:
        nonlocal acked
        try:
            with Client(leased.config_path) as c:
                while not done.is_set():
                    c.accumulate(name, np.ones(N, np.int64))
                    acked += 1
                    if acked == 50:
                        killed.wait(30)
        except BaseException as exc:
            errors.append(exc)

    with Client(leased.config_path) as c:
        c.create(name, (N,), np.int64)
        t = threading.Thread(target=accumulate)
        t.start()
        try:
            while acked < 50 and t.is_alive():
                time.sleep(0.01)
            leased.kill(primary)
            killed.set()
            target = acked + 50
            while acked < target and t.is_alive():
                time.sleep(0.01)
        finally:
            done.set()
            t.join(60)
        assert errors == [], errors
        assert primary not in registered(leased)
        assert (c.read(name) == acked).all(), (c.read(name)[:3], acked)


def test_a_daemon_that_loses_its_lease_refuses_updates_until_it_is_back(
    leased: Cluster,
) -> None:
    """Its lease revoked (as if etcd expired it), a daemon stops serving at once, then
    registers under a new lease, catches up and serves again."""
    reg = registry(leased)
    name = "leased/solo"
    with Client(leased.config_path) as c:
        c.write(name, np.arange(N, dtype=np.int64))

        async def revoke_n1() -> None:
            key = reg.member_key("n1")
            kv = await reg.etcd.get(key)
            assert kv is not None and kv.lease
            await reg.etcd.revoke(kv.lease)

        trio.run(revoke_n1)
        # Back: registered again under a new lease, caught up, ready.
        deadline = time.monotonic() + 60
        while not (hello(leased.config, "n1").get("ready") and "n1" in registered(leased)):
            assert time.monotonic() < deadline, "n1 did not come back: " + leased.log("n1")[-2000:]
            time.sleep(0.05)
        assert (c.read(name) == np.arange(N)).all()
        log = leased.log("n1")
        assert "not serving until registered again and caught up" in log, log[-2000:]
        # It stopped being ready and caught up again (once at start, once after).
        assert log.count("caught up (") == 2, log[-2000:]


def test_an_etcd_table_needs_endpoints(tmp_path: Path) -> None:
    from irdma.cluster import parse_config

    base = {"nodes": [{"name": "n1", "address": "tcp://127.0.0.1:7401", "arena_size": "1MiB"}]}
    with pytest.raises(irdma.errors.ConfigError, match=r"etcd\.endpoints: a list"):
        parse_config({**base, "etcd": {}})
    with pytest.raises(irdma.errors.ConfigError, match="must be http://host:port"):
        parse_config({**base, "etcd": {"endpoints": ["https://x:1"]}})
    with pytest.raises(irdma.errors.ConfigError, match=r"etcd\.lease_ttl"):
        parse_config({**base, "etcd": {"endpoints": ["http://x:1"], "lease_ttl": 0}})
    config = parse_config({**base, "etcd": {"endpoints": ["http://x:2379"]}})
    assert config.etcd is not None and config.etcd.prefix == "/irdma/default"


def test_drain_names_what_it_cannot_do(server: EtcdServer, tmp_path: Path) -> None:
    """irdma drain: only with [etcd]; only a member; --cancel of a node not drained."""
    static = write_config(tmp_path / "static", 2)
    out = run_cli("drain", "n1", "--config", str(static))
    assert out.returncode == 2 and "needs membership in etcd" in out.stderr, out.stderr
    path = write_config(tmp_path / "etcd", 2)
    prefix = f"/irdma/test-{uuid.uuid4().hex[:8]}"
    path.write_text(path.read_text() + f'\n[etcd]\nendpoints = ["{server.endpoint}"]\n'
                    f'prefix = "{prefix}"\n')  # fmt: skip
    out = run_cli("drain", "n1", "--config", str(path))
    assert out.returncode == 1 and "not a member" in out.stderr, out.stderr
    registry = Registry(Etcd([server.endpoint]), prefix)
    assert trio.run(registry.propose, Epoch(1, ("n1", "n2"), 1), 0)
    out = run_cli("drain", "n9", "--config", str(path))
    assert out.returncode == 1 and "n9 is not a member" in out.stderr, out.stderr
    out = run_cli("drain", "n2", "--config", str(path), "--no-wait")
    assert out.returncode == 0 and "drain requested at epoch 1" in out.stdout, out.stdout
    assert trio.run(registry.state).drained == {"n2"}
    out = run_cli("drain", "n2", "--cancel", "--config", str(path))
    assert "drain withdrawn" in out.stdout and trio.run(registry.state).drained == set()
    out = run_cli("drain", "n2", "--cancel", "--config", str(path))
    assert "was not being drained" in out.stdout


def run_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "irdma", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


class HeldFirstRequestTo:
    """The router's session, with its first request to ``node`` held at the door
    until ``release`` is set (the request chosen, not yet stamped or sent)."""

    def __init__(self, session, node: str) -> None:
        self.session, self.node = session, node
        self.held, self.release = trio.Event(), trio.Event()
        self.sent_to: list[str] = []

    async def request(self, node, header, payload=(), sink=None):
        if node.name == self.node and not self.held.is_set():
            self.held.set()
            await self.release.wait()
        self.sent_to.append(node.name)
        return await self.session.request(node, header, payload, sink)

    def now(self) -> float:
        return self.session.now()

    async def sleep(self, seconds: float) -> None:
        await self.session.sleep(seconds)


def placed_apart(cluster: Cluster, joiner: str, address: str) -> str:
    """A tensor name whose shard 0, once ``joiner`` is a member, has it as its primary:
    neither of the shard's replicas of today is its primary then."""
    from irdma.cluster.configfile import load_config

    after = load_config(cluster.config_path)
    members = (*cluster.names, joiner)
    after = after.following(Epoch(1, members, after.replicas, addresses=((joiner, address),)))
    assert after is not None
    for i in range(10_000):
        name = f"moved/t{i}"
        if after.replicas_for(tensor_key(name), 0)[0].name == joiner:
            return name
    raise AssertionError(f"no name places shard 0 on {joiner} first")


async def test_a_request_placed_before_an_epoch_change_goes_where_the_new_one_places_it(
    leased: Cluster,
) -> None:
    """An accumulate chose its replicas under one epoch (a daemon had joined since the
    client last heard); before its first request left, the client moved to the new
    epoch (another call met the change). The request carries the new epoch, so the
    daemons judge it by the new placement: the old primary and the old backup refuse it
    (NOT_OWNER), and it must go on to the joiner, its primary now, not fail once its
    patience is spent (seen in CI, test_elastic, 2026-11-27: 'n1 is not the primary of
    shard 5 (primary: n4)')."""
    from irdma.cli.local import psd_command
    from irdma.cluster import render_config
    from irdma.cluster.registry import current_epoch

    from .helpers.etcd import free_port

    joiner, port = "n4", free_port()
    address = f"tcp://127.0.0.1:{port}"
    name = placed_apart(leased, joiner, address)
    old = [n.name for n in leased.config.replicas_for(tensor_key(name), 0)]
    settings = leased.config.etcd
    assert settings is not None
    own = leased.dir / f"{joiner}.toml"  # the joiner's config names only itself
    etcd_table = leased.config_path.read_text().split("[etcd]", 1)[1]
    own.write_text(
        render_config(
            [(joiner, address, str(leased.dir / joiner), 64 << 20)],
            shard_size=leased.config.shard_size,
            replicas=2,
            timeout=5.0,
            extra={"failure_timeout": 60.0},
        )
        + "\n[etcd]"
        + etcd_table
    )
    async with irdma.AsyncClient(leased.config_path) as c:
        await c.create(name, (N,), np.int64)
        await c.accumulate(name, np.ones(N, np.int64))
        router = c.router
        held = HeldFirstRequestTo(router.requests, old[0])
        router.requests = held
        outcome: list[object] = []

        async def accumulate() -> None:
            try:
                await c.accumulate(name, np.ones(N, np.int64))
                outcome.append("acked")
            except Exception as exc:  # handed on as a value, asserted below
                outcome.append(exc)

        # The joiner comes in; this client, which has not sent anything since, is
        # still at the epoch it connected at.
        with (leased.dir / f"{joiner}.log").open("ab") as log:
            leased.procs[joiner] = subprocess.Popen(
                psd_command(own, joiner), stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )
        with trio.fail_after(120):
            while joiner not in (epoch := await current_epoch(settings, 5.0)).members:
                await trio.sleep(0.1)
        assert c.config.epoch is not None and joiner not in c.config.epoch.members
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accumulate)
            await held.held.wait()  # placed by the old epoch: its first request to old[0]
            # The client moves to the new epoch, as when another call meets a daemon at it.
            assert c.session.in_force.adopt(epoch)
            held.release.set()
        assert outcome == ["acked"], (outcome, held.sent_to)
        assert held.sent_to[0] == old[0] and held.sent_to[-1] == joiner, held.sent_to
        assert (await c.read(name) == 2).all()


def test_a_client_given_only_etcd_finds_the_daemons_in_the_stored_epoch(
    leased: Cluster, tmp_path: Path
) -> None:
    """A config with ``[etcd]`` and no ``[[nodes]]``: the client adopts the epoch stored
    in etcd before its first request (``ConfigInForce.adopt_stored_epoch``)."""
    with Client(leased.config_path) as c:
        c.write("only/etcd", np.arange(N))
    settings = leased.config.etcd
    assert settings is not None
    path = tmp_path / "etcd-only.toml"
    endpoints = json.dumps(list(settings.endpoints))
    path.write_text(f'[etcd]\nendpoints = {endpoints}\nprefix = "{settings.prefix}"\n')
    with Client(path, timeout=5.0) as c:
        assert c.config.epoch is not None
        assert sorted(n.name for n in c.config.nodes) == sorted(leased.names)
        assert (c.read("only/etcd") == np.arange(N)).all()
