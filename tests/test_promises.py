"""Promises the README makes about retries, read-your-writes and waiting pulls,
checked against real daemons with raw frames (built from the typed messages).

- exactly once: an ACCUMULATE retried with the same txn, to the primary or to
  the backup that took over after a failover, is applied once; the window of
  remembered txns is 1024 updates per shard;
- read-your-writes: a READ naming a version above a backup's copy is answered
  BEHIND (the client then asks the primary);
- waiting pulls: a pull for a step not reached is answered NOT_READY within the
  daemon's poll (it never holds a request past it), so a client whose pull
  waits longer than its own timeout still gets its answer.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio
from irdma_psd.store.replica_log import RECENT_TXNS

from irdma import AsyncClient, Client
from irdma.protocol import HEADER_SIZE, Header, Op, Status, tensor_key, unpack_header
from irdma.protocol.messages import Read, Update
from irdma.training.modes import Mode

from .helpers.cluster import Cluster, make_cluster
from .helpers.wire import hello, recv_exactly

TENSOR = "promises/w"
N = 1024  # float32 elements: 4 KiB, one shard
KEY = tensor_key(TENSOR)


class Raw:
    """One raw connection to one daemon: a frame out, its answer back."""

    def __init__(self, c: Cluster, node: str) -> None:
        a = c.config.node(node).address
        self.sock = socket.create_connection((a.host, a.port), timeout=10)

    def ask(self, header: Header, payload: bytes = b"") -> tuple[Header, bytes]:
        self.sock.sendall(header.pack() + payload)
        reply = unpack_header(recv_exactly(self.sock, HEADER_SIZE))
        return reply, recv_exactly(self.sock, reply.length)

    def close(self) -> None:
        self.sock.close()


def accumulate(raw: Raw, txn: int, value: float = 1.0) -> Header:
    data = np.full(N, value, np.float32).tobytes()
    update = Update(Op.ACCUMULATE, KEY, 0, 0, len(data), txn=txn)
    reply, text = raw.ask(update.frame(len(data)), data)
    assert reply.status == Status.OK, text
    return reply


def copy_on(c: Cluster, node: str, min_version: int = 0) -> tuple[Header, bytes]:
    raw = Raw(c, node)
    try:
        return raw.ask(Read(KEY, 0, 0, N * 4, min_version=min_version).frame())
    finally:
        raw.close()


def roles(c: Cluster) -> tuple[str, str]:
    primary, backup = (n.name for n in c.config.replicas_for(KEY, 0))
    return primary, backup


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[Cluster]:
    c = make_cluster(tmp_path, 3, replicas=2, timeout=2.0)
    try:
        with c.client() as client:
            client.write(TENSOR, np.zeros(N, np.float32))
        yield c
    finally:
        c.close()


def test_a_retried_accumulate_is_applied_once(replicated: Cluster) -> None:
    c = replicated
    primary, backup = roles(c)
    raw = Raw(c, primary)
    try:
        first = accumulate(raw, txn=0xABC)
        again = accumulate(raw, txn=0xABC)  # a retry: answered, not applied
        other = accumulate(raw, txn=0xABD)  # another update: applied
    finally:
        raw.close()
    assert again.version == first.version
    assert other.version == first.version + 1
    for node in (primary, backup):
        reply, data = copy_on(c, node)
        assert reply.version == other.version, node
        assert np.array_equal(np.frombuffer(data, np.float32), np.full(N, 2.0)), node


def test_a_retry_after_failover_is_applied_once_by_the_new_primary(replicated: Cluster) -> None:
    c = replicated
    primary, backup = roles(c)
    raw = Raw(c, primary)
    try:
        first = accumulate(raw, txn=77)
    finally:
        raw.close()
    c.kill(primary)  # the acknowledgement may have been lost with it: the client retries
    deadline = time.monotonic() + 30
    while hello(c.config, backup)["view"].get(primary) != "down":
        assert time.monotonic() < deadline, hello(c.config, backup)
        time.sleep(0.05)
    raw = Raw(c, backup)
    try:
        retry = accumulate(raw, txn=77)
    finally:
        raw.close()
    assert retry.version == first.version
    reply, data = copy_on(c, backup)
    assert reply.version == first.version
    assert np.array_equal(np.frombuffer(data, np.float32), np.full(N, 1.0))


def test_the_txn_window_is_the_last_1024_updates(replicated: Cluster) -> None:
    c = replicated
    primary, _ = roles(c)
    raw = Raw(c, primary)
    try:
        start = accumulate(raw, txn=1, value=0.0).version
        for txn in range(2, RECENT_TXNS + 2):  # 1024 newer updates
            accumulate(raw, txn=txn, value=0.0)
        top = start + RECENT_TXNS
        assert accumulate(raw, txn=2, value=0.0).version == start + 1  # remembered
        # The oldest fell out of the window: a retry that late is a new update.
        assert accumulate(raw, txn=1, value=0.0).version == top + 1
    finally:
        raw.close()


def test_a_backup_behind_what_the_client_saw_answers_behind(replicated: Cluster) -> None:
    c = replicated
    primary, backup = roles(c)
    raw = Raw(c, primary)
    try:
        version = accumulate(raw, txn=5).version
    finally:
        raw.close()
    reply, _ = copy_on(c, backup, min_version=version)
    assert reply.status == Status.OK and reply.version == version
    reply, text = copy_on(c, backup, min_version=version + 1)
    assert reply.status == Status.BEHIND, text
    # The primary is never behind: it has every acknowledged update.
    reply, _ = copy_on(c, primary, min_version=version + 1)
    assert reply.status == Status.OK


# -- waiting pulls ------------------------------------------------------------------


@pytest.fixture
def cluster2s(tmp_path: Path) -> Iterator[Cluster]:
    """One daemon, a 2 s client timeout: its poll (how long a pull waits) is 0.5 s."""
    c = make_cluster(tmp_path, 1, timeout=2.0)
    try:
        yield c
    finally:
        c.close()


def test_a_pull_for_a_step_not_reached_is_answered_not_ready(cluster2s: Cluster) -> None:
    with Client(cluster2s.config_path) as client:
        client.create("pull/w", (N,), np.float32, mode=Mode.sync(2))
    key = tensor_key("pull/w")
    data = np.ones(N, np.float32).tobytes()
    raw = Raw(cluster2s, "n1")
    try:
        push = Update(Op.ACCUMULATE, key, 0, 0, len(data), worker=0, step=0)
        assert raw.ask(push.frame(len(data)), data)[0].status == Status.OK
        # Worker 1 has not pushed step 0: the pull for step 1 cannot be answered yet.
        reply, text = raw.ask(Read(key, 0, 0, len(data), worker=0, step=1).frame())
        assert reply.status == Status.NOT_READY, text
        assert b"not reached" in text
    finally:
        raw.close()


async def test_a_pull_waiting_longer_than_the_client_timeout_still_succeeds(
    cluster2s: Cluster,
) -> None:
    """Worker 1 pushes only after twice the client timeout: worker 0's pull, asked
    again after each NOT_READY, gets the step's sum rather than a timeout."""
    timeout = cluster2s.config.timeout
    async with AsyncClient(cluster2s.config_path) as w0, AsyncClient(cluster2s.config_path) as w1:
        await w0.create("pull/late", (N,), np.float32, mode=Mode.sync(2))
        await w0.accumulate("pull/late", np.ones(N, np.float32), worker=0, step=0)
        order: list[str] = []

        async def late_push() -> None:
            await trio.sleep(2 * timeout)
            # Noted before the push goes out: the daemon may answer the waiting pull
            # (completing the step) before this task hears its own answer.
            order.append("pushing")
            await w1.accumulate("pull/late", np.full(N, 2.0, np.float32), worker=1, step=0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(late_push)
            got = await w0.read("pull/late", worker=0, step=1)
            order.append("pulled")
        assert order == ["pushing", "pulled"]  # answered after the late push, not before
        assert np.array_equal(got, np.full(N, 3.0, np.float32))
