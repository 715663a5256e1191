"""The rdma transport with real daemons on a real verbs device (soft-RoCE in the guest)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import trio

from irdma import Client
from irdma.client import AsyncClient
from irdma.errors import IrdmaError
from irdma.protocol import tensor_key
from irdma.sizes import RDMA_BATCH_BYTES
from irdma.transport.base import StreamBroken
from irdma.transport.rdma import RdmaPath

from ..helpers.cluster import Cluster
from ..helpers.rdma import SHARD, fresh

pytestmark = pytest.mark.usefixtures("rdma_device")

# (dtype, elements): 4 KiB; three shards and part of a fourth; 64 MiB.
CASES = [
    (np.int64, 512),
    (np.int32, (3 * SHARD + 12_344) // 4),
    (np.float32, 16 << 20),
]


def connections(client: Client | AsyncClient) -> list:
    inner = client.async_client if isinstance(client, Client) else client
    return list(inner.session.conns.values())


def data_segments(conn) -> tuple[int, int]:
    """TCP segments carrying data in and out on a connection's socket (Linux tcp_info:
    tcpi_data_segs_in, tcpi_data_segs_out; pure ACKs are not counted)."""
    info = conn.stream.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("<II", info, 152)


@pytest.mark.parametrize(("dtype", "n"), CASES, ids=["4KiB", "3.01shards", "64MiB"])
def test_write_read_accumulate(rdma_cluster: Cluster, dtype: type, n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.integers(-1000, 1000, n).astype(dtype)
    d = rng.integers(-50, 50, n).astype(dtype)
    name = f"rw/{np.dtype(dtype).name}-{n}"
    with Client(rdma_cluster.config_path, transport="rdma") as c:
        c.write(name, x, replace=True)
        assert np.array_equal(c.read(name), x)
        c.accumulate(name, d)
        c.accumulate(name, d, alpha=2.0)
        want = x + 3 * d
        assert np.array_equal(c.read(name), want)
        if x.nbytes > SHARD + 4096:
            # A range across a shard boundary, written then read.
            patch = rng.integers(0, 256, 8192, dtype=np.uint8)
            c.write_bytes(name, SHARD - 4096, patch)
            want.view(np.uint8)[SHARD - 4096 : SHARD + 4096] = patch
            got = np.frombuffer(c.read_bytes(name, SHARD - 5000, 10_000), dtype=np.uint8)
            assert np.array_equal(got, want.view(np.uint8)[SHARD - 5000 : SHARD + 5000])
            # Random bytes may spell NaNs in a float tensor: compare bytes.
            assert np.array_equal(c.read(name).view(np.uint8), want.view(np.uint8))
        conns = connections(c)
        assert conns and {k.transport for k in conns} == {"rdma"}
        # Every byte went by RDMA READ and WRITE, not through the socket.
        assert sum(k.bulk.pulled_bytes for k in conns) >= 2 * x.nbytes
        assert sum(k.bulk.pushed_bytes for k in conns) >= 3 * x.nbytes


WORKER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from irdma import Client
    config, name, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with Client(config, transport="rdma") as c:
        one = np.ones(n, dtype=np.int64)
        for _ in range(rounds):
            c.accumulate(name, one)
    """
)


def test_concurrent_clients_sum_exactly(rdma_cluster: Cluster) -> None:
    n = (2 * SHARD + 4096) // 8  # spans three shards on both daemons
    rounds, workers = 25, 4
    with Client(rdma_cluster.config_path, transport="rdma") as c:
        c.write("sum/t", np.zeros(n, dtype=np.int64), replace=True)
        sizes = [str(n), str(rounds)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(rdma_cluster.config_path), "sum/t", *sizes]
            )
            for _ in range(workers)
        ]
        try:
            codes = [p.wait(timeout=240) for p in procs]
        finally:
            for p in procs:
                p.kill()
        assert codes == [0] * workers
        assert np.array_equal(c.read("sum/t"), np.full(n, workers * rounds, dtype=np.int64))


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from irdma import Client
    config, shards, size, writes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    per = size // 4
    with Client(config, transport="rdma") as c:
        for k in range(1, writes + 1):
            c.write("torn/t", np.repeat(np.arange(shards, dtype=np.int32) * 0 + k, per))
    """
)


def test_readers_never_see_a_torn_shard(rdma_cluster: Cluster) -> None:
    """A writer rewrites every shard with one value after another; each pulled shard is uniform."""
    shards = 4
    with Client(rdma_cluster.config_path, transport="rdma") as c:
        c.write("torn/t", np.zeros(shards * SHARD // 4, dtype=np.int32), replace=True)
        sizes = [str(shards), str(SHARD), "60"]
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(rdma_cluster.config_path), *sizes]
        )
        seen: set[int] = set()
        reads = 0
        try:
            deadline = time.monotonic() + 240
            while writer.poll() is None and time.monotonic() < deadline:
                got = c.read("torn/t").reshape(shards, -1)
                reads += 1
                for row in got:
                    assert (row == row[0]).all(), f"torn shard: values {np.unique(row)[:5]}"
                    seen.add(int(row[0]))
                # A whole-tensor write is one write for readers: never two in one read.
                assert (got == got[0, 0]).all(), f"two writes in one read: {np.unique(got)}"
            assert writer.wait(timeout=30) == 0
        finally:
            writer.kill()
        assert reads > 0 and len(seen) >= 2, (reads, seen)
        assert sum(k.bulk.direct_reads for k in connections(c)) > 0


def test_reads_are_one_sided(rdma_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads READ the directory slot and the bytes: no MAPPED answer, no daemon CPU."""
    x = np.arange(3 * SHARD // 4, dtype=np.float32)
    with Client(rdma_cluster.config_path, transport="rdma") as c:
        c.write("one/x", x, replace=True)
        assert np.array_equal(c.read("one/x"), x)
        conns = connections(c)
        before = [data_segments(k) for k in conns]
        assert np.array_equal(c.read("one/x"), x)  # slots known now: one chain per daemon
        # The repeat pull sent no TCP message and got none: the daemons were not asked.
        assert [data_segments(k) for k in conns] == before
        assert sum(k.bulk.direct_reads for k in conns) == 6
        assert sum(k.bulk.mapped_pulls for k in conns) == 0
        c.delete("one/x")
        y = np.arange(3 * SHARD // 8, dtype=np.int64)  # same name, another layout
        c.write("one/x", y)
        assert np.array_equal(c.read("one/x"), y)
    monkeypatch.setenv("IRDMA_ONE_SIDED", "0")
    with Client(rdma_cluster.config_path, transport="rdma") as c:
        assert np.array_equal(c.read("one/x"), y)
        conns = connections(c)
        assert sum(k.bulk.direct_reads for k in conns) == 0
        assert sum(k.bulk.mapped_pulls for k in conns) == 3


def test_the_pieces_of_one_read_go_out_in_one_batch(rdma_cluster: Cluster) -> None:
    """A read's shards on one daemon are READ together (header and slots, then all the
    bytes, then the slots again): fewer chains than shards, and the bytes right."""
    x = np.arange(12 * SHARD // 4, dtype=np.float32)  # twelve shards over three daemons
    with Client(rdma_cluster.config_path, transport="rdma") as c:
        c.write("one/batched", x, replace=True)
        for _ in range(3):
            assert np.array_equal(c.read("one/batched"), x)
        conns = connections(c)
        reads = sum(k.bulk.direct_reads for k in conns)
        batches = sum(k.bulk.direct_batches for k in conns)
        assert reads == 36 and sum(k.bulk.mapped_pulls for k in conns) == 0
        assert batches < reads, (batches, reads)


def test_large_shards_are_read_one_sided_each_in_its_own_batch(
    rdma_device: str, tmp_path: Path
) -> None:
    """Shards larger than RDMA_BATCH_BYTES are READ one-sided too (no MAPPED answer,
    no TCP message once their slots are known), each in a chain of its own so its
    bytes are handed on while the next one's are in flight; after a rewrite (new
    blocks) each is read once, where its slot says, not first at the old block."""
    shard = 4 << 20
    assert shard > RDMA_BATCH_BYTES
    cluster = fresh(tmp_path, rdma_device, nodes=1, arena_size=256 << 20, shard_size=shard)
    try:
        x = np.random.default_rng(7).standard_normal(8 * shard // 4).astype(np.float32)
        with Client(cluster.config_path, transport="rdma") as c:
            c.write("big", x)
            assert np.array_equal(c.read("big"), x)
            conns = connections(c)
            before = [data_segments(k) for k in conns]
            for _ in range(2):
                assert np.array_equal(c.read("big"), x)
            assert [data_segments(k) for k in conns] == before
            reads = sum(k.bulk.direct_reads for k in conns)
            assert reads == 24 and sum(k.bulk.mapped_pulls for k in conns) == 0
            assert sum(k.bulk.direct_batches for k in conns) == reads
            y = x + 1
            c.write("big", y)
            assert np.array_equal(c.read("big"), y)
            assert sum(k.bulk.direct_reads for k in conns) == reads + 8
            assert sum(k.bulk.direct_retries for k in conns) == 0
    finally:
        cluster.close()


ACCUMULATOR = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from irdma import Client
    config, n = sys.argv[1], int(sys.argv[2])
    with Client(config, transport="rdma") as c:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            c.accumulate("one/acc", np.ones(n, dtype=np.int64))
    """
)


def test_one_sided_reads_during_accumulates_are_whole(rdma_cluster: Cluster) -> None:
    """The slot's seq caught the daemon changing a shard under a READ (retries seen),
    and every shard read is one version anyway."""
    n = 4 * SHARD // 8
    with Client(rdma_cluster.config_path, transport="rdma") as c:
        c.write("one/acc", np.zeros(n, dtype=np.int64), replace=True)
        proc = subprocess.Popen(
            [sys.executable, "-c", ACCUMULATOR, str(rdma_cluster.config_path), str(n)]
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                got = c.read("one/acc").reshape(4, -1)
                assert (got == got[:, :1]).all(), "a shard mixed two versions"
                conns = connections(c)
                if sum(k.bulk.direct_retries + k.bulk.direct_contended for k in conns) >= 2:
                    break
                assert time.monotonic() < deadline and proc.poll() is None, "no READ met a change"
        finally:
            proc.kill()
            proc.wait()


def test_a_killed_daemon_gives_an_error_not_a_hang(rdma_device: str, tmp_path: Path) -> None:
    cluster = fresh(tmp_path, rdma_device, nodes=1, arena_size=256 << 20, shard_size=SHARD)
    try:
        reader = textwrap.dedent(
            """
            import sys
            import numpy as np
            from irdma import Client
            from irdma.errors import IrdmaError
            with Client(sys.argv[1], transport="rdma", timeout=3.0) as c:
                c.write("big", np.ones(16 << 20, dtype=np.float32))
                print("READY", flush=True)
                try:
                    while True:
                        c.read("big")
                except IrdmaError as exc:
                    print("ERROR", type(exc).__name__, exc, flush=True)
            """
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", reader, str(cluster.config_path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "READY"
            time.sleep(0.5)  # reads of 64 MiB are under way
            os.kill(cluster.pid("n1"), signal.SIGKILL)
            out, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 0
        assert out.startswith("ERROR"), out
    finally:
        cluster.close()


async def test_forged_stale_and_out_of_range_keys_are_refused(rdma_cluster: Cluster) -> None:
    """Keys or addresses the daemon did not give this connection change and reveal nothing."""
    victim = np.arange(SHARD // 8, dtype=np.int64)
    async with AsyncClient(rdma_cluster.config_path, transport="rdma") as c:
        await c.write("keys/victim", victim, replace=True)
        node = c.config.primary_for(tensor_key("keys/victim"), 0)

        async def link():  # type: ignore[no-untyped-def]
            conn = await c.session.connection(node)
            assert isinstance(conn.bulk, RdmaPath) and conn.bulk.link is not None
            return conn, conn.bulk.link

        # Where the victim's shard sits in the daemon's arena, seen on a real pull
        # (a one-sided one: slot, bytes, slot in one chain of READs).
        conn, lk = await link()
        seen: list[int] = []
        real = lk.post

        async def record(opcode, pieces, rkey):  # type: ignore[no-untyped-def]
            seen.extend(remote for _, remote, length, _ in pieces if length == victim.nbytes)
            return await real(opcode, pieces, rkey)

        lk.post = record  # type: ignore[method-assign]
        assert np.array_equal(await c.read("keys/victim"), victim)
        lk.post = real  # type: ignore[method-assign]
        where = seen[-1]
        stale = lk.remote
        assert stale is not None
        e = lk.e
        attempts = [
            ("forged arena key", e.IBV_WR_RDMA_READ, stale.arena_addr, stale.arena_rkey ^ 0x5A5A),
            ("past the arena", e.IBV_WR_RDMA_READ, stale.arena_addr + stale.arena_size, None),
            ("write with the read-only arena key", e.IBV_WR_RDMA_WRITE, where, None),
            (
                "past the staging area",
                e.IBV_WR_RDMA_WRITE,
                stale.staging_addr + stale.staging_size,
                "staging",
            ),
            ("a closed connection's staging key", e.IBV_WR_RDMA_WRITE, stale.staging_addr, "old"),
        ]
        lk.buffer.view[:4096] = 0xEE
        for what, opcode, addr, key in attempts:
            conn, lk = await link()
            assert lk.remote is not None
            rkey = {
                None: lk.remote.arena_rkey,
                "staging": lk.remote.staging_rkey,
                "old": stale.staging_rkey,
            }.get(key, key)  # type: ignore[call-overload]
            if key == "old":
                assert lk.remote.staging_rkey != stale.staging_rkey
            with trio.fail_after(30), pytest.raises(StreamBroken, match="failed"):
                await lk.transfer(opcode, 0, addr, rkey, 4096, 10.0)
                pytest.fail(f"{what}: the daemon let it through")
            assert conn.broken, what
            # The daemon still serves, and the victim is as it was.
            assert np.array_equal(await c.read("keys/victim"), victim), what


def run_psd(cluster_dir: Path, config_text: str, *wrapper: str) -> subprocess.CompletedProcess:
    config = cluster_dir / "cluster.toml"
    config.write_text(config_text)
    return subprocess.run(
        [*wrapper, sys.executable, "-m", "irdma_psd.main", "--config", str(config), "--node", "n1"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_node(tmp_path: Path, ip: str, top: str = "", arena: str = "64MiB") -> str:
    return (
        f"{top}[[nodes]]\nname = 'n1'\naddress = 'rdma://{ip}:7499'\n"
        f"data_dir = '{tmp_path / 'n1'}'\narena_size = '{arena}'\n"
    )


def test_memlock_too_small_names_the_fix(rdma_device: str, tmp_path: Path) -> None:
    # Without CAP_IPC_LOCK the memlock limit applies, as for a service user.
    done = run_psd(
        tmp_path,
        one_node(tmp_path, rdma_device),
        "prlimit",
        "--memlock=65536:65536",
        "setpriv",
        "--bounding-set=-ipc_lock",
        "--inh-caps=-ipc_lock",
    )
    assert done.returncode == 1, done.stderr
    assert "RLIMIT_MEMLOCK" in done.stderr and "LimitMEMLOCK=infinity" in done.stderr
    assert "ulimit -l unlimited" in done.stderr


def test_wrong_gid_index_says_so(rdma_device: str, tmp_path: Path) -> None:
    done = run_psd(tmp_path, one_node(tmp_path, rdma_device, "rdma_gid_index = 0\n"))
    assert done.returncode == 1, done.stderr
    assert "rdma_gid_index 0" in done.stderr and "not the RoCE v2 GID of" in done.stderr


def test_mtu_larger_than_the_port_says_so(rdma_device: str, tmp_path: Path) -> None:
    # rxe1 sits on a netdev with MTU 1500: its active MTU is 1024.
    small = os.environ.get("IRDMA_RDMA_SMALL_MTU_IP", "198.18.1.1")
    done = run_psd(tmp_path, one_node(tmp_path, small, "rdma_mtu = 4096\n"))
    assert done.returncode == 1, done.stderr
    assert "rdma_mtu 4096 is larger than the active MTU 1024" in done.stderr


def test_small_mtu_device_still_serves(rdma_device: str, tmp_path: Path) -> None:
    """Without rdma_mtu, both sides use the port's active MTU (1024 on rxe1)."""
    small = os.environ.get("IRDMA_RDMA_SMALL_MTU_IP", "198.18.1.1")
    cluster = fresh(tmp_path, small, nodes=1, arena_size=64 << 20, shard_size=SHARD)
    try:
        x = np.arange(3 * SHARD // 4, dtype=np.float32)
        with Client(cluster.config_path, transport="rdma") as c:
            c.write("m", x)
            assert np.array_equal(c.read("m"), x)
            assert {k.transport for k in connections(c)} == {"rdma"}
        assert "MTU 1024" in cluster.log("n1")
    finally:
        cluster.close()


def test_shm_address_clients_still_use_rdma_when_forced(rdma_cluster: Cluster) -> None:
    """IRDMA_TRANSPORT=rdma wins over same-host shared memory."""
    x = np.arange(1000, dtype=np.float64)
    with Client(rdma_cluster.config_path, transport="rdma") as c:
        c.write("forced/x", x, replace=True)
        assert np.array_equal(c.read("forced/x"), x)
        assert {k.transport for k in connections(c)} == {"rdma"}
    with pytest.raises(IrdmaError):
        Client(rdma_cluster.config_path, transport="carrier-pigeon")
