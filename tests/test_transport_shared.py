"""A client's shared region: rooms for arrays, and writes from them that skip staging.

The region's bookkeeping is checked on its own; the writes against real
daemons (1 MiB shards, so pieces of 64 KiB and more go STAGED), counting
the bytes each path moved: a write from shared memory puts nothing in
staging.
"""

from __future__ import annotations

import gc
import os
import socket

import numpy as np
import pytest
import trio

from irdma import Client, SharedMemoryFull, SharedRegion
from irdma.client import AsyncClient
from irdma.errors import ConfigError
from irdma.protocol import Header, Op, Status, decode_json, encode_json
from irdma.transport.base import StreamBroken
from irdma.transport.shm import SharedMemory, make_staging
from irdma.transport.tcp import FramedConnection

from . import test_transport_shm
from .helpers.cluster import Cluster
from .helpers.wire import raw_unix, recv_frame
from .test_transport_shm import SHARD

MIB = 1 << 20
# The same cluster fixture as the shm tests (3 daemons, 1 MiB shards), one per module.
cluster = test_transport_shm.cluster


def shm_memories(client: Client | AsyncClient) -> list[SharedMemory]:
    inner = client if isinstance(client, AsyncClient) else client.async_client
    return [c.bulk for c in inner.session.conns.values() if isinstance(c.bulk, SharedMemory)]


# -- the region on its own ----------------------------------------------------


def test_rooms_are_arrays_in_the_region_until_nothing_refers_to_them() -> None:
    region = SharedRegion(8 * MIB)
    a = region.empty(3 * MIB)
    assert len(a) == 3 * MIB and region.offset_of(a) == 0
    a[:] = 7
    assert region.view[0] == 7  # the same memory the daemons map
    view = a[MIB:].view(np.float32)  # anything derived from it keeps the room
    assert region.offset_of(view) == MIB
    del a
    gc.collect()
    assert region.used == 3 * MIB
    b = region.empty(MIB)
    assert region.offset_of(b) == 3 * MIB  # not over the room still in use
    del view
    gc.collect()
    assert region.used == MIB
    c = region.empty(2 * MIB)
    assert region.offset_of(c) == 0
    assert not c.any()  # a room given back lost its pages: it starts from zeros


def test_a_full_region_says_so() -> None:
    region = SharedRegion(4 * MIB)
    kept = region.empty(3 * MIB)
    with pytest.raises(SharedMemoryFull, match="no free extent"):
        region.empty(2 * MIB)
    assert len(kept) == 3 * MIB


def test_buffers_outside_the_region_or_scattered_have_no_offset() -> None:
    region = SharedRegion(4 * MIB)
    inside = region.empty(MIB)
    assert region.offset_of(np.empty(MIB, np.uint8)) is None
    assert region.offset_of(b"bytes") is None
    assert region.offset_of(inside[::2]) is None  # not contiguous: cannot be named by an offset
    assert region.offset_of(memoryview(inside)[10:20]) == 10


def test_a_room_a_failed_write_may_read_is_never_handed_out_again() -> None:
    region = SharedRegion(4 * MIB)
    a = region.empty(MIB)
    b = region.empty(MIB)
    region.doubt(MIB + 100)  # a write of b's bytes failed with its connection
    assert region.in_doubt(b) and not region.in_doubt(a)
    del a, b
    gc.collect()
    assert region.used == MIB  # b's room stays taken
    fresh = [region.empty(MIB) for _ in range(3)]
    assert MIB not in [region.offset_of(x) for x in fresh]


# -- against daemons ----------------------------------------------------------


# (bytes written, bytes of them in pieces large enough for staging: smaller
# pieces go inline over the socket, from shared memory or not)
@pytest.mark.parametrize(
    ("nbytes", "staged"), [(200_000, 200_000), (3 * SHARD + 12_344, 3 * SHARD)]
)
def test_writes_from_shared_memory_are_not_staged(
    cluster: Cluster, nbytes: int, staged: int
) -> None:
    name = f"shared/{nbytes}"
    with Client(cluster.config_path, transport="shm", shared_memory="64MiB") as c:
        x = c.shared_empty(nbytes // 4, np.float32)
        x[:] = np.random.default_rng(nbytes).standard_normal(len(x))
        c.write(name, x)
        assert np.array_equal(c.read(name), x)
        c.accumulate(name, x, alpha=2.0)
        assert np.array_equal(c.read(name), x + 2.0 * x)
        memories = shm_memories(c)
        assert memories and all(m.shared is not None for m in memories)
        assert sum(m.shared_bytes for m in memories) == 2 * staged
        assert sum(m.staged_bytes for m in memories) == 0
        c.write(name, np.array(x))  # ordinary memory: staged as before
        assert sum(m.staged_bytes for m in memories) == staged


def test_the_async_client_writes_from_shared_memory_too(cluster: Cluster) -> None:
    async def run() -> tuple[int, int]:
        async with AsyncClient(cluster.config_path, transport="shm", shared_memory=16 * MIB) as c:
            x = c.shared_empty((512, 1024), np.float32)
            x[:] = 3.0
            await c.write("shared/async", x)
            assert np.array_equal(await c.read("shared/async"), x)
            memories = shm_memories(c)
            return sum(m.shared_bytes for m in memories), sum(m.staged_bytes for m in memories)

    shared, staged = trio.run(run)
    assert (shared, staged) == (2 * MIB, 0)


def test_a_client_without_shared_memory_says_how_to_get_it(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c, pytest.raises(ConfigError, match="shared_memory"):
        c.shared_empty(10)
    with pytest.raises(ConfigError, match="shared_memory"):
        Client(cluster.config_path, shared_memory="lots")


def test_a_region_the_daemon_cannot_map_safely_is_not_used(cluster: Cluster) -> None:
    """Memory that could shrink under the daemon's mapping would crash it (SIGBUS):
    the daemon attaches without it, and writes go through staging."""
    staging = make_staging(MIB)
    unsealed = os.memfd_create("unsealed")
    sealed = make_staging(MIB)
    try:
        os.ftruncate(unsealed, MIB)
        body = encode_json({"staging": MIB, "shared": MIB})
        frame = Header(op=Op.ATTACH, length=len(body)).pack() + body
        for region_fd, taken in ((unsealed, False), (sealed, True)):
            with raw_unix(cluster) as s:
                socket.send_fds(s, [frame], [staging, region_fd])
                h, msg = recv_frame(s)
                assert h.status == Status.OK, msg
                assert ("shared" in decode_json(msg)) == taken
    finally:
        for fd in (staging, unsealed, sealed):
            os.close(fd)


def test_a_write_that_fails_with_its_connection_leaves_its_room_in_doubt(
    cluster: Cluster, monkeypatch
) -> None:
    node = cluster.config.node("n1")

    async def broken_after_send(self, header, payload=(), sink=None):
        self._fail(StreamBroken("failed after the frame went out"))
        raise StreamBroken("failed after the frame went out")

    async def run() -> tuple[bool, bool]:
        async with AsyncClient(cluster.config_path, transport="shm", shared_memory=4 * MIB) as c:
            sent = c.shared_empty(SHARD // 4, np.float32)
            other = c.shared_empty(SHARD // 4, np.float32)
            conn = await c.session.connection(node)
            header = Header(op=Op.WRITE, key=1, size=sent.nbytes, length=sent.nbytes)
            monkeypatch.setattr(FramedConnection, "exchange", broken_after_send)
            with pytest.raises(StreamBroken):
                await conn.request(header, [sent])
            assert c.shared is not None
            return c.shared.in_doubt(sent), c.shared.in_doubt(other)

    assert trio.run(run) == (True, False)
