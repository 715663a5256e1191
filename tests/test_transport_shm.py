"""The shm transport against real daemons: choice, correctness, never torn, who may attach.

The cluster here has 1 MiB shards, so reads take the MAPPED path (256 KiB
and up) and writes the STAGED one (64 KiB and up), as well as the inline
paths for small pieces.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from irdma import Client, SharedRegion
from irdma.client import AsyncClient
from irdma.cluster import load_config
from irdma.errors import ConfigError, DaemonUnavailable, IrdmaError
from irdma.protocol import (
    LOCATION,
    Flag,
    Header,
    Op,
    Status,
    encode_json,
    tensor_key,
)
from irdma.transport import select
from irdma.transport.base import StreamBroken
from irdma.transport.shm import SharedMemory, make_staging
from irdma.transport.tcp import FramedConnection
from irdma.transport.unix import socket_path

from .helpers.cluster import Cluster, make_cluster
from .helpers.wire import raw_unix, recv_frame

SHARD = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = make_cluster(tmp_path_factory.mktemp("shm"), 3, shard_size=SHARD, arena_size=128 << 20)
    try:
        yield c
    finally:
        c.close()


def kinds(client: Client | AsyncClient) -> set[str]:
    inner = client if isinstance(client, AsyncClient) else client.async_client
    return {conn.transport for conn in inner.session.conns.values()}


@pytest.mark.parametrize("transport", ["auto", "shm", "tcp"])
@pytest.mark.parametrize("nbytes", [4096, 200_000, 3 * SHARD + 12_345, 9 * SHARD])
def test_read_write_accumulate_round_trip(cluster: Cluster, transport: str, nbytes: int) -> None:
    n = nbytes // 4
    x = np.random.default_rng(nbytes).standard_normal(n).astype(np.float32)
    name = f"rt/{transport}/{nbytes}"
    with Client(cluster.config_path, transport=transport) as c:
        c.write(name, x)
        assert np.array_equal(c.read(name), x)
        c.accumulate(name, x, alpha=2.0)
        assert np.array_equal(c.read(name), x + 2.0 * x)
        # A partial write across a shard boundary.
        part = np.full(min(n, SHARD // 2), 7.0, dtype=np.float32)
        start = max(0, min(n - len(part), SHARD // 4 - 100))
        c.write_bytes(name, start * 4, part)
        want = x + 2.0 * x
        want[start : start + len(part)] = 7.0
        assert np.array_equal(c.read(name), want)
        used = kinds(c)
        conns = list(c.async_client.session.conns.values())
        # Read out of the arena: MAPPED answers, or one-sided with no answer at all.
        mapped = sum(
            getattr(k.bulk, "mapped_bytes", 0) + getattr(k.bulk, "direct_bytes", 0) for k in conns
        )
        staged = sum(getattr(k.bulk, "staged_bytes", 0) for k in conns)
    expected = {"tcp": {"tcp"}}.get(transport, {"shm"})
    assert used == expected
    if transport != "tcp" and nbytes >= SHARD:
        # Whole shards went through shared memory, not the socket.
        assert mapped >= 3 * SHARD and staged >= 2 * SHARD, (mapped, staged)


def test_environment_variable_forces_the_transport(cluster: Cluster, monkeypatch) -> None:
    x = np.arange(SHARD, dtype=np.float32)
    for value, want in (("tcp", "tcp"), ("shm", "shm")):
        monkeypatch.setenv("IRDMA_TRANSPORT", value)
        with Client(cluster.config_path) as c:
            c.write("env/x", x)
            assert np.array_equal(c.read("env/x"), x)
            assert kinds(c) == {want}
    monkeypatch.setenv("IRDMA_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ConfigError, match="carrier-pigeon"):
        Client(cluster.config_path)
    # Forced rdma on a host without a device fails naming why, never falls back.
    monkeypatch.setenv("IRDMA_TRANSPORT", "rdma")
    with Client(cluster.config_path) as c, pytest.raises(IrdmaError, match="rdma transport"):
        c.read("env/x")


def test_a_reader_never_sees_a_torn_shard(cluster: Cluster) -> None:
    """A writer sets whole shards to one value after another; every read is uniform per shard."""
    shards = 4
    name = "torn/x"
    n = shards * SHARD // 4
    with Client(cluster.config_path, transport="shm") as c:
        c.write(name, np.zeros(n, dtype=np.float32))

    async def run() -> int:
        reads = 0
        async with (
            AsyncClient(cluster.config_path, transport="shm") as writer,
            AsyncClient(cluster.config_path, transport="shm") as reader,
        ):
            done = trio.Event()

            async def write_loop() -> None:
                for v in range(1, 121):
                    await writer.write(name, np.full(n, float(v), dtype=np.float32))
                done.set()

            async def read_loop() -> None:
                nonlocal reads
                out = np.empty(n, dtype=np.float32)
                while not done.is_set():
                    await reader.read(name, out=out)
                    for s in np.split(out, shards):
                        assert s.min() == s.max(), f"torn shard: {s.min()} .. {s.max()}"
                    reads += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(write_loop)
                nursery.start_soon(read_loop)
        return reads

    reads = trio.run(run)
    assert reads > 0
    print(f"{reads} reads during 120 writes, none torn")


def test_many_clients_accumulate_exactly(cluster: Cluster) -> None:
    name = "acc/x"
    n = 2 * SHARD // 4 + 1000
    with Client(cluster.config_path) as c:
        c.write(name, np.zeros(n, dtype=np.float64))
    code = (
        "import sys, numpy as np\n"
        "from irdma import Client\n"
        "with Client(sys.argv[1], transport='shm') as c:\n"
        "    for i in range(20):\n"
        "        c.accumulate('acc/x', np.full(int(sys.argv[2]), float(sys.argv[3])))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(cluster.config_path), str(n), str(k)])
        for k in (1, 2, 3, 4)
    ]
    try:
        assert [p.wait(60) for p in procs] == [0, 0, 0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read(name), np.full(n, 20.0 * (1 + 2 + 3 + 4)))


# -- who may attach ------------------------------------------------------------


def test_socket_is_private_to_the_daemons_user_and_group(cluster: Cluster) -> None:
    for node in cluster.config.nodes:
        path = socket_path(node.data_dir)
        assert path.is_socket()
        assert path.stat().st_mode & 0o777 == 0o660


NOBODY = 65534


@pytest.fixture
def public_config(cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    """The cluster's config where user nobody can read it."""
    d = Path("/tmp") / f"irdma-public-{os.getpid()}"
    d.mkdir(mode=0o755, exist_ok=True)
    cfg = d / "cluster.toml"
    shutil.copy(cluster.config_path, cfg)
    cfg.chmod(0o644)
    try:
        yield cfg
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_as_nobody(config: Path, transport: str) -> dict:
    # Privileges are dropped after the imports: the interpreter may live
    # where that user cannot read (a pyenv under /root).
    code = (
        "import json, os, sys, numpy as np\n"
        "from irdma import Client\n"
        "import encodings.idna, irdma.transport.select, irdma.transport.shm\n"
        f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
        "try:\n"
        "    with Client(sys.argv[1], transport=sys.argv[2]) as c:\n"
        "        c.read('auth/x')\n"
        "        kinds = sorted({k.transport for k in c.async_client.session.conns.values()})\n"
        "        print(json.dumps({'ok': True, 'kinds': kinds}))\n"
        "except Exception as exc:\n"
        "    print(json.dumps({'ok': False, 'error': f'{type(exc).__name__}: {exc}'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(config), transport],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_another_user_gets_no_mapping(cluster: Cluster, public_config: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    with Client(cluster.config_path) as c:
        c.write("auth/x", np.ones(SHARD // 2, dtype=np.float32))
    forced = run_as_nobody(public_config, "shm")
    assert not forced["ok"] and "shm transport" in forced["error"], forced
    assert "Permission denied" in forced["error"], forced
    # Automatic choice: such a client still works, over TCP.
    auto = run_as_nobody(public_config, "auto")
    assert auto == {"ok": True, "kinds": ["tcp"]}, auto


def test_staging_memory_that_could_shrink_is_refused(cluster: Cluster) -> None:
    """Cut shorter under the daemon's mapping, it would crash the daemon (SIGBUS)."""
    unsealed = os.memfd_create("unsealed")
    sealed = make_staging(1 << 20)
    try:
        os.ftruncate(unsealed, 1 << 20)
        body = encode_json({"staging": 1 << 20})
        frame = Header(op=Op.ATTACH, length=len(body)).pack() + body
        with raw_unix(cluster) as s:
            socket.send_fds(s, [frame], [unsealed])
            h, msg = recv_frame(s)
            assert h.status == Status.BAD_ARGUMENT and b"sealed against shrinking" in msg
        with raw_unix(cluster) as s:
            socket.send_fds(s, [frame], [sealed])
            h, msg = recv_frame(s)
            assert h.status == Status.OK, msg
        with pytest.raises(OSError):
            os.ftruncate(sealed, 4096)  # the seal holds for the client too
    finally:
        os.close(unsealed)
        os.close(sealed)
    with Client(cluster.config_path, transport="shm") as c:  # the daemon still serves
        c.write("sealed/x", np.ones(10, dtype=np.float32))


def test_attach_without_a_staging_descriptor_is_refused(cluster: Cluster) -> None:
    with raw_unix(cluster) as s:
        body = encode_json({"staging": 1 << 20})
        s.sendall(Header(op=Op.ATTACH, length=len(body)).pack() + body)
        h, msg = recv_frame(s)
        assert h.status == Status.BAD_ARGUMENT and b"no staging descriptor" in msg
    with raw_unix(cluster) as s:
        s.sendall(Header(op=Op.HELLO).pack())
        h, msg = recv_frame(s)
        assert h.status == Status.BAD_ARGUMENT and b"expected ATTACH first" in msg
    with raw_unix(cluster) as s:
        s.sendall(b"garbage" * 40)
        with contextlib.suppress(ConnectionResetError):  # dropped with our bytes unread
            assert s.recv(1) == b""  # dropped, and the daemon goes on
    with Client(cluster.config_path, transport="shm") as c:
        c.write("after/x", np.ones(10, dtype=np.float32))


def staged_header(meta: Any) -> Header:
    """A STAGED write of a whole first shard of the tensor ``meta`` describes."""
    return Header(
        op=Op.WRITE,
        key=meta.key,
        shard=0,
        size=SHARD,
        length=LOCATION.size,
        layout=meta.layout,
        dtype=meta.dtype_code,
        flags=Flag.STAGED,
    )


def test_staged_data_out_of_range_or_over_tcp_changes_nothing(cluster: Cluster) -> None:
    name = "staged/x"
    x = np.arange(SHARD // 4, dtype=np.float32)
    with Client(cluster.config_path, transport="shm") as c:
        c.write(name, x)
        meta = c.stat(name).meta
        primary = c.config.replicas_for(tensor_key(name), 0)[0]

        async def forge(conn_kind: str, region: SharedRegion | None = None) -> tuple[int, bytes]:
            async with AsyncClient(
                cluster.config_path, transport=conn_kind, shared_memory=region
            ) as ac:
                conn = await ac.session.connection(primary)
                # Past the end of the 16 MiB staging area; with a region, from
                # inside it past its end.
                where = 1 << 40
                if region is not None:
                    assert conn.bulk.shared is region
                    where = conn.bulk.shared_at + region.size - 4096
                # The framed exchange itself: past the bulk path, which would stage.
                reply = await conn.exchange(staged_header(meta), [LOCATION.pack(where)])
                return reply.header.status, reply.data

        status, msg = trio.run(forge, "shm")
        assert status == Status.OUT_OF_RANGE and b"staging area" in msg
        status, msg = trio.run(forge, "shm", SharedRegion(1 << 20))
        assert status == Status.OUT_OF_RANGE and b"shared region" in msg
        status, msg = trio.run(forge, "tcp")
        assert status == Status.BAD_FRAME and b"shm or rdma connection" in msg
        assert np.array_equal(c.read(name), x)


@pytest.mark.parametrize("with_region", [False, True], ids=["staging", "shared-region"])
def test_attach_and_detach_leak_no_descriptors(cluster: Cluster, with_region: bool) -> None:
    pid = cluster.procs["n1"].pid
    node = cluster.config.node("n1")
    # With a shared region, its descriptor goes along and is mapped too.
    region = SharedRegion(4 << 20) if with_region else None

    def fds() -> int:
        return len(os.listdir(f"/proc/{pid}/fd"))

    async def attach_many() -> None:
        for _ in range(20):
            async with AsyncClient(cluster.config_path, transport="shm", shared_memory=region) as c:
                await c.hello(node)
                assert c.session.conns[node.name].bulk.shared is region

    trio.run(attach_many)
    before = fds()
    trio.run(attach_many)
    # The daemon closes a connection when it notices the hang-up: allow it a moment.
    deadline = time.monotonic() + 10
    while (after := fds()) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after <= before, f"daemon descriptors grew from {before} to {after}"


def test_forced_shm_names_the_problem_when_the_daemon_is_elsewhere(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, 1)
    try:
        path = socket_path(c.config.node("n1").data_dir)
        assert path.is_socket()
        c.stop("n1")
        assert not path.exists(), "the socket outlived its daemon"
        with (
            pytest.raises(DaemonUnavailable, match="shm transport: no daemon socket"),
            Client(c.config_path, transport="shm", timeout=2) as client,
        ):
            client.stat("x")
    finally:
        c.close()


def test_long_data_dir_paths_work(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    c = make_cluster(deep, 1)
    try:
        assert len(str(socket_path(c.config.node("n1").data_dir))) > 108
        x = np.arange(SHARD, dtype=np.float32)
        with Client(c.config_path, transport="shm") as client:
            client.write("long/x", x)
            assert np.array_equal(client.read("long/x"), x)
            assert kinds(client) == {"shm"}
    finally:
        c.close()


def test_shm_connection_class_is_what_auto_picks(cluster: Cluster) -> None:
    async def pick() -> type:
        async with AsyncClient(cluster.config_path) as c:
            return type((await c.session.connection(cluster.config.node("n2"))).bulk)

    assert trio.run(pick) is SharedMemory


def test_shm_addresses_ask_for_shared_memory(tmp_path: Path) -> None:
    base = make_cluster(tmp_path / "first", 1)
    base.close()  # only its config is needed, rewritten below
    path = tmp_path / "cluster.toml"
    path.write_text(base.config_path.read_text().replace("tcp://", "shm://"))
    c = Cluster(tmp_path, path, load_config(path))
    try:
        c.start("n1")
        assert c.config.node("n1").address.scheme == "shm"
        x = np.arange(SHARD, dtype=np.float32)
        with Client(path) as client:  # auto: the address decides
            client.write("addr/x", x)
            assert kinds(client) == {"shm"}
        with Client(path, transport="tcp") as client:  # forcing still wins (debugging)
            assert np.array_equal(client.read("addr/x"), x)
            assert kinds(client) == {"tcp"}
    finally:
        c.close()


def tcp_connects(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ports clients of this test open TCP connections to, as they open them.

    A spy on the two places a client connects over TCP (the blocking client's
    open_tcp and the trio client's FramedConnection.open); each still connects.
    """
    ports: list[int] = []
    blocking_open = select.open_tcp
    trio_open = FramedConnection.open

    async def spy_blocking(host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        ports.append(port)
        return await blocking_open(host, port, *args, **kwargs)

    async def spy_trio(cls: type, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        ports.append(port)
        return await trio_open(host, port, *args, **kwargs)

    monkeypatch.setattr(select, "open_tcp", spy_blocking)
    monkeypatch.setattr(FramedConnection, "open", classmethod(spy_trio))
    return ports


def test_a_hung_daemon_costs_one_timeout_not_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused daemon takes unix connections but never answers ATTACH; the client
    must not then try it again over TCP (that doubled the wait and ran past the
    failover deadline), but go on to the shard's other replica."""
    c = make_cluster(tmp_path, 3, replicas=2, shard_size=SHARD)
    try:
        x = np.arange(SHARD // 2, dtype=np.float32)
        with Client(c.config_path) as client:
            client.write("hung/x", x)
        primary = c.config.replicas_for(tensor_key("hung/x"), 0)[0]
        connects = tcp_connects(monkeypatch)
        c.signal(primary.name, signal.SIGSTOP)
        try:
            with Client(c.config_path, timeout=2) as client:
                assert np.array_equal(client.read("hung/x"), x)
                client.accumulate("hung/x", np.ones_like(x))
                assert np.array_equal(client.read("hung/x"), x + 1)
        finally:
            c.signal(primary.name, signal.SIGCONT)
        assert primary.address.port not in connects, connects
    finally:
        c.close()


def test_staging_of_a_failed_request_is_never_reused(cluster: Cluster, monkeypatch) -> None:
    """A request that fails after sending may still be applied by the daemon from
    its staged bytes; another request must not overwrite them."""
    node = cluster.config.node("n1")
    payload = np.ones(SHARD // 4, dtype=np.float32)
    header = Header(op=Op.WRITE, key=1, size=payload.nbytes, length=payload.nbytes)

    async def broken_after_send(self, header, payload=(), sink=None):
        self._fail(StreamBroken("failed after the frame went out"))
        raise StreamBroken("failed after the frame went out")

    async def run() -> tuple[int, str]:
        async with AsyncClient(cluster.config_path, transport="shm") as c:
            conn = await c.session.connection(node)
            assert isinstance(conn.bulk, SharedMemory)
            monkeypatch.setattr(FramedConnection, "exchange", broken_after_send)
            with pytest.raises(StreamBroken):
                await conn.request(header, [payload])
            kept = conn.bulk.staging.used
            with pytest.raises(StreamBroken) as again:  # no new staging on a dead connection
                await conn.request(header, [payload])
            return kept, str(again.value)

    kept, message = trio.run(run)
    assert kept >= payload.nbytes
    assert "failed" in message
