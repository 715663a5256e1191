"""Forwards to a backup in flight together (psd.replication.pipeline), with real daemons:
many sent before the first is answered, applied in order, none lost when the
backup dies with them in flight. A paused backup (SIGSTOP) holds the answers
back; the primary's HELLO says how many are in flight to it."""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import trio
from irdma_psd.held_answers import DEFER_MIN

from irdma import Client
from irdma.client import AsyncClient
from irdma.client.sinks import IntoSink
from irdma.protocol import Header, Op, tensor_key

from .helpers.cluster import Cluster, make_cluster
from .helpers.wire import hello

SHARD = 64 << 10
ELEMENTS = SHARD // 4  # float32
# Large enough that the primary always takes in the next request while forwarding one.
LARGE = DEFER_MIN
IN_FLIGHT = 6
TOTAL = IN_FLIGHT * (IN_FLIGHT + 1) / 2  # of the pushers' deltas 1..6
# A backup paused this long is still up to its primary: the test's pauses end well before.
SETTINGS = {"heartbeat": 0.5, "failure_timeout": 30.0}


def on_n1_then_n2(cluster: Cluster, prefix: str, count: int) -> list[str]:
    """Tensor names whose one shard has n1 as its primary and n2 as its backup."""
    names = []
    for i in range(10_000):
        name = f"{prefix}{i}"
        if [n.name for n in cluster.config.replicas_for(tensor_key(name), 0)] == ["n1", "n2"]:
            names.append(name)
            if len(names) == count:
                return names
    raise AssertionError("not enough names placed on n1 then n2")


def in_flight(cluster: Cluster) -> int:
    return int(hello(cluster.config, "n1")["replication"]["n2"]["in_flight"])


def wait_for(what: str, condition: Callable[[], bool], seconds: float = 20.0) -> None:
    """Until ``condition`` holds (a state another process reaches; asked again, not timed)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g} s"
        time.sleep(0.02)


def copies(cluster: Cluster, name: str, size: int = SHARD) -> dict[str, tuple[int, str]]:
    """(version, sha256) of a one-shard tensor of ``size`` bytes on each of its replicas,
    asked of each daemon."""

    async def ask() -> dict[str, tuple[int, str]]:
        out = {}
        async with AsyncClient(cluster.config_path) as client:
            key = (await client.stat(name)).meta.key
            for node in cluster.config.replicas_for(key, 0):
                buf = bytearray(size)
                header = Header(op=Op.READ, key=key, shard=0, size=size)
                reply = await client.session.request(node, header, sink=IntoSink(memoryview(buf)))
                out[node.name] = (reply.header.version, hashlib.sha256(buf).hexdigest())
        return out

    return trio.run(ask)


class Pushers:
    """Clients in threads of their own, the i-th to accumulate i + 1 into its name once
    told (a delta of its own: bytes that went to the wrong update would show); each
    looks the tensor up first, so the pushes need only the primary."""

    def __init__(self, cluster: Cluster, names: list[str]) -> None:
        self.done: list[str] = []
        self._ready = threading.Barrier(len(names) + 1)
        self._go = threading.Event()
        self._threads = [
            threading.Thread(target=self._push, args=(cluster, n, i + 1.0))
            for i, n in enumerate(names)
        ]
        for t in self._threads:
            t.start()
        self._ready.wait(60)

    def _push(self, cluster: Cluster, name: str, value: float) -> None:
        with Client(cluster.config_path, timeout=60) as c:
            c.stat(name)
            self._ready.wait(60)
            self._go.wait(60)
            c.accumulate(name, np.full(ELEMENTS, value, np.float32))
        self.done.append(name)

    def go(self) -> None:
        self._go.set()

    def join(self) -> None:
        self._go.set()  # even if the test failed before it said go
        for t in self._threads:
            t.join(90)


@pytest.mark.timeout(180)
def test_updates_of_one_shard_go_to_a_paused_backup_together_and_apply_in_order(
    tmp_path: Path,
) -> None:
    """Six accumulates of one shard (1 to 6), from six clients, while its backup is paused: the
    primary sends all six before any answer comes, none is acknowledged meanwhile, and
    once the backup resumes it applies each on top of the one before (no whole-shard
    copy was needed), so both copies end equal, with every update once."""
    cluster = make_cluster(tmp_path, 3, replicas=2, shard_size=SHARD, extra=SETTINGS)
    try:
        (name,) = on_n1_then_n2(cluster, "one/", 1)
        with Client(cluster.config_path) as c:
            c.write(name, np.zeros(ELEMENTS, np.float32))
        pushers = Pushers(cluster, [name] * IN_FLIGHT)
        cluster.signal("n2", signal.SIGSTOP)
        try:
            pushers.go()
            wait_for("six forwards in flight", lambda: in_flight(cluster) == IN_FLIGHT)
            assert pushers.done == []  # the backup holds none of them yet: none acknowledged
        finally:
            cluster.signal("n2", signal.SIGCONT)
            pushers.join()
        assert len(pushers.done) == IN_FLIGHT
        with Client(cluster.config_path) as c:
            assert np.array_equal(c.read(name), np.full(ELEMENTS, TOTAL, np.float32))
        held = copies(cluster, name)
        assert held["n1"] == held["n2"] and held["n1"][0] == 1 + IN_FLIGHT, held
        assert hello(cluster.config, "n1")["copies"]["sent"] == 0  # each applied on top
        assert in_flight(cluster) == 0
    finally:
        cluster.close()


@pytest.mark.timeout(180)
def test_large_writes_on_one_connection_stream_to_the_backup_while_they_arrive(
    tmp_path: Path,
) -> None:
    """Large writes (a shard each, n1 then n2 its replicas) from one async client, sent
    at once over its one connection to n1: while the backup is paused, the primary
    keeps taking in the next write and forwards it, so every forward is in flight
    together rather than one at a time behind the connection."""
    cluster = make_cluster(tmp_path, 3, replicas=2, shard_size=LARGE, extra=SETTINGS)
    try:
        names = on_n1_then_n2(cluster, "big/", IN_FLIGHT)
        data = {n: np.full(LARGE // 4, float(i + 1), np.float32) for i, n in enumerate(names)}

        async def write_all() -> None:
            async with AsyncClient(cluster.config_path, timeout=60) as c:
                async with trio.open_nursery() as nursery:
                    for n, arr in data.items():
                        nursery.start_soon(c.write, n, np.zeros_like(arr))
                cluster.signal("n2", signal.SIGSTOP)
                async with trio.open_nursery() as nursery:
                    for n, arr in data.items():
                        nursery.start_soon(c.write, n, arr)
                    try:
                        await trio.to_thread.run_sync(
                            wait_for,
                            "every write's forward in flight",
                            lambda: in_flight(cluster) == IN_FLIGHT,
                        )
                    finally:
                        cluster.signal("n2", signal.SIGCONT)

        trio.run(write_all)
        for n, arr in data.items():
            held = copies(cluster, n, LARGE)
            assert held["n1"] == held["n2"], held
            assert held["n1"][1] == hashlib.sha256(arr.tobytes()).hexdigest()
    finally:
        cluster.close()


@pytest.mark.timeout(240)
def test_a_backup_killed_with_forwards_in_flight_loses_no_acknowledged_update(
    tmp_path: Path,
) -> None:
    """The backup is killed (SIGKILL) while six forwards to it are in flight: the
    primary acknowledges them once it declares the backup down, owing it a resync;
    the backup restarts empty, catches up, and holds every update once."""
    settings = {"heartbeat": 0.5, "failure_timeout": 10.0}
    cluster = make_cluster(tmp_path, 3, replicas=2, shard_size=SHARD, extra=settings)
    try:
        (name,) = on_n1_then_n2(cluster, "kill/", 1)
        with Client(cluster.config_path) as c:
            c.write(name, np.zeros(ELEMENTS, np.float32))
        pushers = Pushers(cluster, [name] * IN_FLIGHT)
        cluster.signal("n2", signal.SIGSTOP)
        try:
            pushers.go()
            wait_for("six forwards in flight", lambda: in_flight(cluster) == IN_FLIGHT)
        finally:
            cluster.kill("n2")
            pushers.join()
        assert len(pushers.done) == IN_FLIGHT  # acknowledged without the dead backup
        assert hello(cluster.config, "n1")["replication"]["n2"]["resync"]
        cluster.start("n2")
        wait_for("n2 caught up", lambda: copies(cluster, name)["n2"] == copies(cluster, name)["n1"])
        expected = np.full(ELEMENTS, TOTAL, np.float32)
        assert copies(cluster, name)["n2"][1] == hashlib.sha256(expected.tobytes()).hexdigest()
    finally:
        cluster.close()
