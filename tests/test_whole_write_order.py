"""Concurrent whole-tensor writes converge on one write, on every shard and replica.

Each shard's primary orders the writes it receives by itself: two clients'
whole writes of one tensor can reach shard 0 as A then B and shard 1 as B
then A. Without an order between writes, shard 0 ended with B and shard 1
with A for good; readers got one write only while the copies kept from
before lasted, then ``TornRead`` on every read. The race is made to happen
every time by holding A's shard 1 until B has finished.

Whole writes are ordered by their stamps now (``irdma.client.stamps``): a
shard refuses a write older than the one it holds, and its writer stamps it
again and writes every shard again.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio

import irdma
from irdma import AsyncClient, Client
from irdma.client.routing import new_txn
from irdma.client.stamps import StampClock
from irdma.protocol import HEADER_SIZE, Op, Status, tensor_key, unpack_header
from irdma.protocol.messages import Read, Update, served_stamps

from .helpers.cluster import Cluster, make_cluster
from .helpers.wire import recv_exactly

pytestmark = pytest.mark.timeout(120)

SHARD = 64 << 10  # make_cluster's shard size
N = 2 * SHARD // 4  # float32: two shards
NAME = "order/w"
KEY = tensor_key(NAME)


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[Cluster]:
    c = make_cluster(tmp_path, 3, replicas=2)
    try:
        yield c
    finally:
        c.close()


def held_back(client: AsyncClient, shard: int, until: trio.Event) -> None:
    """The client's first piece of a whole write to ``shard`` waits for ``until``."""
    real = client.router.on_replicas

    async def on_replicas(key: int, index: int, msg: object, *args: object, **kw: object):
        if isinstance(msg, Update) and msg.stamp and index == shard:
            await until.wait()
        return await real(key, index, msg, *args, **kw)

    client.router.on_replicas = on_replicas  # type: ignore[method-assign]


def reported(client: AsyncClient, shard: int, done: trio.Event) -> None:
    """``done`` is set once the client's whole-write piece of ``shard`` was answered."""
    real = client.router.on_replicas

    async def on_replicas(key: int, index: int, msg: object, *args: object, **kw: object):
        try:
            return await real(key, index, msg, *args, **kw)
        finally:
            if isinstance(msg, Update) and msg.stamp and index == shard:
                done.set()

    client.router.on_replicas = on_replicas  # type: ignore[method-assign]


async def opposite_orders(config: Path) -> tuple[int, int]:
    """A reaches shard 0, then B all of the tensor, then A reaches shard 1; the
    writes A and B stamped again."""
    async with AsyncClient(config) as a, AsyncClient(config) as b:
        a_on_0, b_done = trio.Event(), trio.Event()
        reported(a, 0, a_on_0)
        held_back(a, 1, b_done)

        async def write_b() -> None:
            await a_on_0.wait()
            await b.write(NAME, np.full(N, 2, np.float32))
            b_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_b)
            await a.write(NAME, np.full(N, 1, np.float32))
        return a.contention.writes_restamped, b.contention.writes_restamped


def copy_on(cluster: Cluster, node: str, shard: int) -> tuple[int, int, float]:
    """(version, stamp, first value) of ``node``'s copy of ``shard``, asked of it alone."""
    a = cluster.config.node(node).address
    with socket.create_connection((a.host, a.port), timeout=10) as s:
        s.sendall(Read(KEY, shard, 0, SHARD).frame().pack())
        reply = unpack_header(recv_exactly(s, HEADER_SIZE))
        data = recv_exactly(s, reply.length)
    assert reply.status == Status.OK, data
    values = np.frombuffer(data, np.float32)
    assert (values == values[0]).all(), f"{node}'s shard {shard} is not one write"
    return reply.version, served_stamps(reply)[0], float(values[0])


def give_back_kept_copies(c: Client, cluster: Cluster) -> None:
    """Make every daemon need all its room: the copies kept for readers go."""
    hit: set[str] = set()
    for i in range(1000):
        name = f"order/huge-{i}"
        nodes = {n.name for n in cluster.config.replicas_for(tensor_key(name), 0)}
        if not nodes <= hit:
            hit |= nodes
            with pytest.raises(irdma.ArenaFull):
                c.create(name, (64 << 20) // 4, np.float32, shard_size=64 << 20)
        if len(hit) == len(cluster.names):
            return
    raise AssertionError(f"no names placed on every daemon: {hit}")


def test_whole_writes_in_opposite_orders_converge_on_one(replicated: Cluster) -> None:
    cluster = replicated
    with Client(cluster.config_path) as c:
        c.write(NAME, np.zeros(N, np.float32))
    # B was stamped after A, so it is the later write: shard 1, holding it, refuses
    # A, which is stamped again after B and written to both shards again.
    assert trio.run(opposite_orders, cluster.config_path) == (1, 0)
    # Every copy of every shard holds the same write (one stamp, one value).
    copies = {
        (node.name, shard): copy_on(cluster, node.name, shard)
        for shard in range(2)
        for node in cluster.config.replicas_for(KEY, shard)
    }
    assert len({(stamp, value) for _, stamp, value in copies.values()}) == 1, copies
    # And stays readable whole once the copies kept from before are gone.
    with Client(cluster.config_path) as c:
        give_back_kept_copies(c, cluster)
        got = c.read(NAME)
    assert np.unique(got).tolist() == [1.0], np.unique(got)


def test_a_write_from_a_clock_behind_is_refused_then_wins(replicated: Cluster) -> None:
    """Another machine's clock ran an hour ahead: its whole write holds the shards. A
    later write from here (stamped by a clock behind it) is refused with that
    write's stamp, stamped after it, and written again: it is not lost."""
    cluster = replicated
    with Client(cluster.config_path) as c:
        c.write(NAME, np.zeros(N, np.float32))
        meta = c.stat(NAME).meta
        ahead = StampClock(lambda: time.time() + 3600).next()
        for shard in range(2):
            a = cluster.config.primary_for(KEY, shard).address
            with socket.create_connection((a.host, a.port), timeout=10) as s:
                for stamp, value in ((ahead, 5.0), (StampClock().next(), 3.0)):
                    write = Update(
                        Op.WRITE,
                        KEY,
                        shard,
                        0,
                        SHARD,
                        layout=meta.layout,
                        txn=new_txn(),
                        stamp=stamp,
                    )
                    data = np.full(SHARD // 4, value, np.float32).tobytes()
                    s.sendall(write.frame(SHARD).pack() + data)
                    reply = unpack_header(recv_exactly(s, HEADER_SIZE))
                    text = recv_exactly(s, reply.length)
                # The second, older, is refused with the stamp of the one held.
                assert (reply.status, reply.stamp) == (Status.STALE_STAMP, ahead), text
        c.write(NAME, np.full(N, 3, np.float32))
        assert c.async_client.contention.writes_restamped == 1
        assert np.unique(c.read(NAME)).tolist() == [3.0]
    for shard in range(2):
        for node in cluster.config.replicas_for(KEY, shard):
            _, stamp, value = copy_on(cluster, node.name, shard)
            assert value == 3.0 and stamp > ahead
