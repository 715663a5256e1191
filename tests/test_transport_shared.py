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
import time
from collections.abc import Iterator

import numpy as np
import pytest
import trio

from irdma import Client, SharedMemoryFull, SharedRegion
from irdma.client import AsyncClient
from irdma.errors import ConfigError
from irdma.protocol import LOCATION, Flag, Header, Op, Status, decode_json, encode_json, tensor_key
from irdma.transport.base import StreamBroken
from irdma.transport.shm import SharedMemory, make_staging
from irdma.transport.tcp import FramedConnection

from .conftest import Cluster, make_cluster
from .test_transport_shm import raw_unix, read_reply

SHARD = 1 << 20
MIB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = make_cluster(tmp_path_factory.mktemp("shared"), 3, shard_size=SHARD, arena_size=128 << 20)
    try:
        yield c
    finally:
        c.close()


def shm_memories(client: Client | AsyncClient) -> list[SharedMemory]:
    inner = client if isinstance(client, AsyncClient) else client._client
    return [c.bulk for c in inner._conns.values() if isinstance(c.bulk, SharedMemory)]


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
                h, msg = read_reply(s)
                assert h.status == Status.OK, msg
                assert ("shared" in decode_json(msg)) == taken
    finally:
        for fd in (staging, unsealed, sealed):
            os.close(fd)


def test_staged_offsets_past_the_region_change_nothing(cluster: Cluster) -> None:
    name = "shared/range"
    x = np.arange(SHARD // 4, dtype=np.float32)
    with Client(cluster.config_path, transport="shm") as c:
        c.write(name, x)
        meta = c.stat(name).meta
        primary = c.config.replicas_for(tensor_key(name), 0)[0]

    async def forge() -> tuple[int, bytes]:
        async with AsyncClient(cluster.config_path, transport="shm", shared_memory=MIB) as ac:
            conn = await ac._connection(primary)
            memory = conn.bulk
            assert isinstance(memory, SharedMemory) and memory.shared is not None
            header = Header(
                op=Op.WRITE,
                key=meta.key,
                shard=0,
                size=SHARD,
                length=LOCATION.size,
                layout=meta.layout,
                dtype=meta.dtype_code,
                flags=Flag.STAGED,
            )
            # Starts in the region, ends past it: the framed exchange itself.
            where = memory.shared_at + memory.shared.size - 4096
            reply = await conn.exchange(header, [LOCATION.pack(where)])
            return reply.header.status, reply.data

    status, msg = trio.run(forge)
    assert status == Status.OUT_OF_RANGE and b"shared region" in msg
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read(name), x)


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
            conn = await c._connection(node)
            header = Header(op=Op.WRITE, key=1, size=sent.nbytes, length=sent.nbytes)
            monkeypatch.setattr(FramedConnection, "exchange", broken_after_send)
            with pytest.raises(StreamBroken):
                await conn.request(header, [sent])
            assert c.shared is not None
            return c.shared.in_doubt(sent), c.shared.in_doubt(other)

    assert trio.run(run) == (True, False)


def test_attaching_with_a_region_leaks_no_descriptors(cluster: Cluster) -> None:
    pid = cluster.procs["n2"].pid
    node = cluster.config.node("n2")
    region = SharedRegion(4 * MIB)

    def fds() -> int:
        return len(os.listdir(f"/proc/{pid}/fd"))

    async def attach_many() -> None:
        for _ in range(10):
            async with AsyncClient(cluster.config_path, transport="shm", shared_memory=region) as c:
                await c.hello(node)
                assert c._conns[node.name].bulk.shared is region

    trio.run(attach_many)
    before = fds()
    trio.run(attach_many)
    # The daemon closes a connection when it notices the hang-up: allow it a moment.
    deadline = time.monotonic() + 10
    while (after := fds()) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after <= before, f"daemon descriptors grew from {before} to {after}"
