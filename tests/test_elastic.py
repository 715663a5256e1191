"""A cluster on etcd grows and shrinks under load: a daemon joins, one is drained, one is
killed for good, while clients accumulate and read; nothing acknowledged is lost.

Real daemons, a real etcd server (Debian's), the ``irdma drain`` command as an
operator runs it. The heartbeats' failure timeout is far beyond the test (60 s):
what happens can only come from etcd's leases and epochs.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import trio

from irdma import AsyncClient, Client
from irdma.cluster import load_config
from irdma.epochs import Epoch
from irdma.local import psd_command, write_config
from irdma.protocol import Header, Op
from irdma.registry import Registry
from irdma.sinks import IntoSink

from .conftest import Cluster, hello, make_cluster
from .etcd_server import EtcdServer, etcd_server

pytestmark = pytest.mark.timeout(300)

SHARD = 4096  # bytes: many shards, so the fraction moved is measured on thousands
BULK = 40  # tensors written once and checked at the end
BULK_SHARDS = 50
COUNTERS = 2  # tensors every client accumulates ones into
COUNTER_SHARDS = 8
ELEMS = SHARD // 8  # int64 per shard
WAIT = 90.0  # longest a move may take here


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_server(tmp_path_factory.mktemp("etcd") / "data") as s:
        yield s


def etcd_table(server: EtcdServer) -> str:
    prefix = f"/irdma/elastic-{uuid.uuid4().hex[:8]}"
    return (
        f'endpoints = ["{server.endpoint}"]\nprefix = "{prefix}"\nlease_ttl = 1\nreplace_after = 2'
    )


def epoch_now(registry: Registry) -> Epoch:
    epoch, _ = trio.run(registry.epoch)
    assert epoch is not None
    return epoch


def wait_epoch(registry: Registry, done: Callable[[Epoch], bool], what: str) -> Epoch:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        epoch = epoch_now(registry)
        if done(epoch):
            return epoch
        time.sleep(0.1)
    raise AssertionError(f"no epoch with {what} after {WAIT} s: {epoch_now(registry)}")


def start_joiner(cluster: Cluster, etcd: str, name: str) -> None:
    """Start daemon ``name`` from a config of its own (it names only itself and etcd)."""
    directory = cluster.dir / name
    path = write_config(directory, 1, arena_size=64 << 20, shard_size=SHARD, timeout=5.0,
                        extra={"failure_timeout": 60.0})  # fmt: skip
    # Two copies of each shard, as the cluster it joins keeps (one node alone could not
    # without [etcd], so written after the check).
    text = path.read_text().replace('name = "n1"', f'name = "{name}"')
    text = text.replace("replicas = 1", "replicas = 2")
    path.write_text(text + f"\n[etcd]\n{etcd}\n")
    log = open(cluster.dir / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
    cluster.procs[name] = subprocess.Popen(
        psd_command(path, name), stdout=log, stderr=log, stdin=subprocess.DEVNULL
    )
    log.close()


def copies_held(cluster: Cluster, name: str, epoch: Epoch | None = None) -> int:
    """Shard copies daemon ``name`` holds (its HELLO); ``epoch`` says where a daemon
    the test's config does not name is."""
    config = load_config(cluster.config_path)
    if epoch is not None:
        config.adopt(epoch)
    shards = hello(config, name)["shards"]
    return shards["primary"] + shards["backup"]


async def read_copies(config_path: Path, names: list[str]) -> dict[tuple[str, int], dict]:
    """Every replica's bytes of every shard (sha256 and version), asked of each replica."""
    out: dict[tuple[str, int], dict] = {}
    async with AsyncClient(config_path, timeout=5.0, transport="tcp") as client:
        for name in names:
            meta = (await client.stat(name)).meta
            for index in range(meta.num_shards):
                _, nbytes = meta.shard_span(index)
                copies = {}
                for node in client.config.replicas_for(meta.key, index):
                    buf = bytearray(nbytes)
                    header = Header(op=Op.READ, key=meta.key, shard=index, size=nbytes)
                    reply = await client._request(node, header, sink=IntoSink(memoryview(buf)))
                    copies[node.name] = (reply.header.version, hashlib.sha256(buf).hexdigest())
                out[(name, index)] = copies
    return out


def test_join_drain_and_kill_lose_no_acknowledged_update(
    server: EtcdServer, tmp_path: Path
) -> None:
    etcd = etcd_table(server)
    cluster = make_cluster(tmp_path, 3, replicas=2, shard_size=SHARD, timeout=5.0, etcd=etcd,
                           extra={"failure_timeout": 60.0})  # fmt: skip
    settings = cluster.config.etcd
    assert settings is not None
    registry = Registry.of(settings, timeout=5.0)
    acked = [0] * 2
    reads = [0]
    errors: list[BaseException] = []
    stop = threading.Event()
    rng = np.random.default_rng(7)
    bulk = {f"bulk/{i}": rng.integers(0, 1 << 62, BULK_SHARDS * ELEMS) for i in range(BULK)}
    counters = [f"count/{i}" for i in range(COUNTERS)]
    try:
        with Client(cluster.config_path) as c:
            for name, data in bulk.items():
                c.write(name, data)
            for name in counters:
                c.create(name, (COUNTER_SHARDS * ELEMS,), np.int64)

        def accumulate(slot: int) -> None:
            try:
                with Client(cluster.config_path) as c:
                    ones = np.ones(COUNTER_SHARDS * ELEMS, np.int64)
                    while not stop.is_set():
                        c.accumulate(counters[slot], ones)
                        acked[slot] += 1
            except BaseException as exc:
                errors.append(exc)

        def read() -> None:
            try:
                with Client(cluster.config_path) as c:
                    while not stop.is_set():
                        for name in counters:
                            values = c.read(name)
                            # One accumulate adds 1 to every element: a read sees each
                            # shard at some count, never beyond what was acknowledged
                            # and in flight.
                            assert values.min() >= 0
                        reads[0] += 1
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=accumulate, args=(i,)) for i in range(2)]
        workers.append(threading.Thread(target=read))
        for t in workers:
            t.start()
        try:
            first = epoch_now(registry)
            assert first.members == ("n1", "n2", "n3") and first.target is None

            # A fourth daemon joins: copies move to it, then it becomes a member.
            start_joiner(cluster, etcd, "n4")
            joined = wait_epoch(
                registry, lambda e: "n4" in e.members and e.target is None, "n4 a member"
            )
            total = (BULK * BULK_SHARDS + COUNTERS * COUNTER_SHARDS) * 2
            fraction = copies_held(cluster, "n4", joined) / total
            assert abs(fraction - 0.25) <= 0.025, fraction
            during_join = (list(acked), reads[0])

            # n2 is drained by the operator's command.
            out = subprocess.run(
                [sys.executable, "-m", "irdma.cli", "drain", "n2",
                 "--config", str(cluster.config_path)],
                capture_output=True, text=True, timeout=WAIT,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            assert "n2: drained" in out.stdout, out.stdout
            drained = epoch_now(registry)
            assert "n2" not in drained.names
            assert copies_held(cluster, "n2") == 0

            # n3 dies for good: after replace_after its copies are made again elsewhere.
            cluster.kill("n3")
            final = wait_epoch(
                registry, lambda e: "n3" not in e.names and e.target is None, "n3 replaced"
            )
            assert final.members == ("n1", "n4")
            time.sleep(0.5)  # the clients go on a little on the final members
        finally:
            stop.set()
            for t in workers:
                t.join(60)
        assert errors == [], errors
        # The clients worked all along: updates and reads during every phase.
        assert during_join[0][0] > 0 and during_join[1] > 0
        assert acked[0] > during_join[0][0] and reads[0] > during_join[1]

        with Client(cluster.config_path) as c:
            for slot, name in enumerate(counters):
                values = c.read(name)
                assert (values == acked[slot]).all(), (name, np.unique(values), acked[slot])
            for name, data in bulk.items():
                assert (c.read(name) == data).all(), name
        copies = trio.run(read_copies, cluster.config_path, [*bulk, *counters])
        for (name, index), held in copies.items():
            assert len(held) == 2, (name, index, held)
            assert len(set(held.values())) == 1, (name, index, held)
    finally:
        cluster.close()
