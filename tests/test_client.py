"""The client against three real daemons on loopback."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import trio

import irdma
from irdma import AsyncClient, Client
from irdma.protocol import HEADER_SIZE, Header, Op, Status, decode_json, tensor_key, unpack_header

from .helpers.cluster import Cluster, make_cluster, name_on
from .helpers.wire import recv_exactly

DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]
SHAPES = [(), (0,), (1,), (7,), (3, 5), (100_001,), (17, 33, 9), (0, 4)]


def sample(shape: tuple[int, ...], dtype: type, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_every_dtype(client: Client, dtype: type) -> None:
    for i, shape in enumerate(SHAPES):
        name = f"rt/{np.dtype(dtype).name}/{i}"
        x = sample(shape, dtype, i)
        client.write(name, x)
        y = client.read(name)
        assert y.dtype == x.dtype and y.shape == x.shape
        assert np.array_equal(x, y)
        info = client.stat(name)
        assert info.shape == shape and info.dtype == np.dtype(dtype).name
        assert info.nbytes == x.nbytes


def test_tensor_spans_every_daemon(cluster: Cluster, client: Client) -> None:
    x = np.arange(3_000_000, dtype=np.float32)  # 12 MB, 64 KiB shards: 184 shards
    client.write("span/w", x)
    meta = client.stat("span/w")
    holders = {
        cluster.config.primary_for(tensor_key("span/w"), s).name for s in range(meta.num_shards)
    }
    assert holders == set(cluster.names)
    out = np.empty_like(x)
    assert client.read("span/w", out=out) is out
    assert np.array_equal(out, x)


def test_big_endian_and_non_contiguous_input(client: Client) -> None:
    x = np.arange(1000, dtype=">i4").reshape(10, 100)[:, ::3]
    client.write("layout/x", x)
    y = client.read("layout/x")
    assert y.dtype == np.dtype("<i4")
    assert np.array_equal(y, x)


def test_read_bytes_and_write_bytes_across_shards(client: Client) -> None:
    x = np.arange(100_000, dtype=np.uint8)
    client.write("bytes/x", x)
    raw = bytes(client.read_bytes("bytes/x", 65_000, 2_000))  # crosses a 64 KiB boundary
    assert raw == x[65_000:67_000].tobytes()
    client.write_bytes("bytes/x", 65_530, b"\xff" * 20)
    x[65_530:65_550] = 255
    assert np.array_equal(client.read("bytes/x"), x)


def test_write_with_other_layout_needs_replace(client: Client) -> None:
    client.write("lay/t", np.zeros(10, np.float32))
    with pytest.raises(irdma.DtypeMismatch):
        client.write("lay/t", np.zeros(10, np.float64))
    with pytest.raises(irdma.ShapeMismatch):
        client.write("lay/t", np.zeros(11, np.float32))
    assert np.array_equal(client.read("lay/t"), np.zeros(10, np.float32))
    client.write("lay/t", np.ones((2, 3), np.int16), replace=True)
    assert np.array_equal(client.read("lay/t"), np.ones((2, 3), np.int16))


def test_stale_layout_is_revalidated(cluster: Cluster, client: Client) -> None:
    client.write("stale/t", np.arange(200_000, dtype=np.float32))
    assert client.read("stale/t").shape == (200_000,)
    other = cluster.client()
    other.write("stale/t", np.arange(50, dtype=np.int64), replace=True)
    y = client.read("stale/t")  # the first client's cached layout is stale
    assert y.dtype == np.int64 and np.array_equal(y, np.arange(50))


def test_a_read_into_out_of_a_redefined_tensors_new_shape_reads_it(
    cluster: Cluster, client: Client
) -> None:
    """``out`` that does not fit the cached layout is checked against a fresh
    one before the read is refused: another process may have redefined it."""
    client.write("stale/out", np.arange(100_000, dtype=np.float32))
    assert client.read("stale/out").shape == (100_000,)  # layout cached
    cluster.client().write("stale/out", np.arange(30_000, dtype=np.int64), replace=True)
    out = np.empty(30_000, np.int64)
    assert client.read("stale/out", out) is out
    assert np.array_equal(out, np.arange(30_000))
    with pytest.raises(irdma.ShapeMismatch):  # a real mismatch is still one
        client.read("stale/out", np.empty(7, np.int64))


def test_read_into_fills_each_array_and_names_a_missing_tensor(client: Client) -> None:
    a, b = np.arange(100_000, dtype=np.float32), np.arange(7, dtype=np.int16)
    client.write("into/a", a)
    client.write("into/b", b)
    outs = {"into/a": np.empty_like(a), "into/b": np.empty_like(b)}
    client.read_into(outs)
    assert np.array_equal(outs["into/a"], a) and np.array_equal(outs["into/b"], b)
    with pytest.raises(irdma.TensorNotFound, match="into/none"):
        client.read_into({"into/a": outs["into/a"], "into/none": np.empty(3)})


def test_create_errors_and_exist_ok(client: Client) -> None:
    info = client.create("cr/a", (4, 4), np.float64)
    assert info.version == 0 and np.array_equal(client.read("cr/a"), np.zeros((4, 4)))
    with pytest.raises(irdma.TensorExists):
        client.create("cr/a", (4, 4), np.float64)
    client.create("cr/a", (4, 4), np.float64, exist_ok=True)
    with pytest.raises(irdma.ShapeMismatch):
        client.create("cr/a", (5,), np.float64, exist_ok=True)
    with pytest.raises(ValueError):
        client.create("bad//name", (1,))
    with pytest.raises(ValueError):
        client.write("cr/obj", np.array(["a"], dtype=object))


def test_accumulate_with_alpha(client: Client) -> None:
    w = np.arange(300_000, dtype=np.float64)
    client.write("acc/w", w)
    d = np.full_like(w, 0.5)
    client.accumulate("acc/w", d, alpha=-2.0)
    assert np.array_equal(client.read("acc/w"), w - 1.0)
    client.write("acc/i", np.zeros(10, np.int32))
    client.accumulate("acc/i", np.arange(10, dtype=np.int32), alpha=3)
    assert np.array_equal(client.read("acc/i"), 3 * np.arange(10))
    with pytest.raises(irdma.DaemonError):
        client.accumulate("acc/i", np.ones(10, np.int32), alpha=0.5)
    with pytest.raises(irdma.DtypeMismatch):
        client.accumulate("acc/i", np.ones(10, np.float32))
    with pytest.raises(irdma.ShapeMismatch):
        client.accumulate("acc/i", np.ones(11, np.int32))
    assert np.array_equal(client.read("acc/i"), 3 * np.arange(10))


def test_unknown_tensor(client: Client) -> None:
    for call in (
        lambda: client.read("no/such"),
        lambda: client.stat("no/such"),
        lambda: client.delete("no/such"),
        lambda: client.accumulate("no/such", np.ones(1)),
    ):
        with pytest.raises(irdma.TensorNotFound, match="no/such"):
            call()


def test_list_and_delete(client: Client) -> None:
    for i in range(5):
        client.write(f"ls/m/t{i}", np.full(70_000, i, np.float32))  # spans daemons
    names = [i.name for i in client.list("ls/m/")]
    assert names == [f"ls/m/t{i}" for i in range(5)]
    infos = {i.name: i for i in client.list("ls/")}
    assert infos["ls/m/t3"].shape == (70_000,)
    # Listed versions sum over every shard on every daemon, as stat does.
    assert infos["ls/m/t3"].version == client.stat("ls/m/t3").version == 5  # 5 shards
    assert infos["ls/m/t3"].num_shards == 5
    # The first ones by name: whole records, though each daemon sends only
    # its own first ones.
    firsts = client.list("ls/", limit=2)
    assert [i.name for i in firsts] == ["ls/m/t0", "ls/m/t1"]
    assert [i.version for i in firsts] == [infos["ls/m/t0"].version, infos["ls/m/t1"].version]
    assert [i.name for i in client.list("ls/m/t4", limit=3)] == ["ls/m/t4"]
    assert client.list("ls/none/", limit=1) == []
    with pytest.raises(ValueError, match="limit"):
        client.list("ls/", limit=-1)
    client.delete("ls/m/t3")
    assert "ls/m/t3" not in [i.name for i in client.list("ls/")]
    with pytest.raises(irdma.TensorNotFound):
        client.read("ls/m/t3")


def test_versions_grow_with_updates(client: Client) -> None:
    client.write("ver/x", np.zeros(100, np.float32))
    v1 = client.stat("ver/x").version
    client.accumulate("ver/x", np.ones(100, np.float32))
    v2 = client.stat("ver/x").version
    client.write("ver/x", np.ones(100, np.float32))
    assert v1 < v2 < client.stat("ver/x").version


def test_batched_forms(client: Client) -> None:
    arrays = {f"batch/t{i}": sample((i * 10 + 1,), np.float32, i) for i in range(50)}
    arrays["batch/big"] = sample((200_000,), np.float64, 99)  # spans shards too
    client.write_many(arrays)
    got = client.read_many(list(arrays))
    for k, v in arrays.items():
        assert np.array_equal(got[k], v), k
    deltas = {k: np.ones_like(v) for k, v in arrays.items()}
    client.accumulate_many(deltas, alpha=2.0)
    got = client.read_many(list(arrays))
    for k, v in arrays.items():
        assert np.array_equal(got[k], v + 2), k
    with pytest.raises(irdma.TensorNotFound):
        client.read_many(["batch/t1", "batch/missing"])


def test_concurrent_accumulators_sum_exactly(cluster: Cluster) -> None:
    """Threads with their own clients and async tasks push at once; no update is lost."""
    n = 200_000
    setup = cluster.client()
    setup.write("conc/sum", np.zeros(n, np.int64))
    rounds, workers = 20, 4

    def worker(k: int) -> None:
        c = Client(cluster.config_path)
        try:
            for r in range(rounds):
                c.accumulate("conc/sum", np.full(n, k + 1, np.int64), alpha=1 + r % 2)
        finally:
            c.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()

    async def async_pushers() -> None:
        async with AsyncClient(cluster.config_path) as ac, trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(ac.accumulate, "conc/sum", np.full(n, 1000, np.int64))

    trio.run(async_pushers)
    for t in threads:
        t.join()
    per_worker = sum(1 + r % 2 for r in range(rounds))
    expected = sum((k + 1) * per_worker for k in range(workers)) + 5 * 1000
    assert np.array_equal(setup.read("conc/sum"), np.full(n, expected, np.int64))


def test_reader_never_sees_a_torn_shard(cluster: Cluster) -> None:
    """Writers replace whole tensors of one value; every shard a reader gets is uniform."""
    n = 1 << 20  # 4 MiB of float32 over 64 shards
    w = cluster.client()
    w.write("torn/x", np.zeros(n, np.float32))
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        v = 0
        while not stop.is_set():
            v += 1
            w.write("torn/x", np.full(n, v, np.float32))
            w.accumulate("torn/x", np.ones(n, np.float32))

    t = threading.Thread(target=writer)
    t.start()
    seen: set[float] = set()
    reads = 0
    try:
        r = cluster.client()
        shard_elems = (64 << 10) // 4
        # At least 30 reads, and on until they saw two values: only then did reads
        # overlap writes (else a uniform answer proves nothing).
        while reads < 30 or len(seen) < 2:
            assert reads < 3000 and t.is_alive(), f"reads never overlapped writes: {seen}"
            y = r.read("torn/x").reshape(-1, shard_elems)
            reads += 1
            uniform = (y == y[:, :1]).all(axis=1)
            if not uniform.all():
                errors.append(f"torn shards: {np.flatnonzero(~uniform)[:5]}")
            seen.update(np.unique(y[:, 0]).tolist())
    finally:
        stop.set()
        t.join()
    assert not errors


def test_arena_full_is_a_clear_error_and_changes_nothing(tmp_path) -> None:
    c = make_cluster(tmp_path, nodes=1, arena_size=2 << 20, shard_size=64 << 10)
    try:
        client = c.client()
        client.write("full/a", np.ones(256 << 10, np.uint8))
        with pytest.raises(irdma.ArenaFull, match="arena full"):
            client.write("full/b", np.ones(4 << 20, np.uint8))
        with pytest.raises(irdma.TensorNotFound):
            client.stat("full/b")  # nothing left behind
        assert np.array_equal(client.read("full/a"), np.ones(256 << 10, np.uint8))
        client.write("full/c", np.full(512 << 10, 7, np.uint8))  # space was not leaked
        assert client.read("full/c")[0] == 7
    finally:
        c.close()


def test_a_create_one_daemon_refuses_leaves_nothing_on_the_others(tmp_path) -> None:
    """One daemon is full, the others take their shards: every daemon has answered
    before the create is undone, so none keeps the tensor or its room."""
    c = make_cluster(tmp_path, nodes=3, arena_size=4 << 20, shard_size=64 << 10)
    try:
        full = name_on(c.config, "n1", "fill/")

        async def main() -> None:
            async with AsyncClient(c.config_path) as client:
                # n1 keeps room for less than its third of the tensor below.
                await client.create(full, 3 << 20, np.uint8, shard_size=4 << 20)
                for _ in range(10):
                    with pytest.raises(irdma.ArenaFull, match="n1: arena full"):
                        await client.create("big", 6 << 20, np.uint8)
                    with pytest.raises(irdma.TensorNotFound):
                        await client.stat("big")
                    assert [i.name for i in await client.list("")] == [full]
                # n2 and n3 still have all of their room.
                for node in ("n2", "n3"):
                    name = name_on(c.config, node, f"room/{node}/")
                    await client.create(name, 3 << 20, np.uint8, shard_size=4 << 20)

        trio.run(main)
    finally:
        c.close()


def test_a_replace_one_daemon_has_no_room_for_keeps_the_old_tensor(tmp_path) -> None:
    """A tensor spread over three daemons is replaced by a larger one that one daemon
    has no room for: the replace fails and the old tensor is there, whole."""
    c = make_cluster(tmp_path, nodes=3, arena_size=4 << 20, shard_size=64 << 10)
    try:
        full = name_on(c.config, "n1", "fill/")
        old = np.arange(1 << 18, dtype=np.float32)  # 1 MiB over all three daemons
        with Client(c.config_path) as client:
            client.create(full, 2 << 20, np.uint8, shard_size=4 << 20)
            client.write("model", old)
            # 6 MiB: n1 (2 MiB filled) has no room for its part, n2 and n3 have. (12 MiB
            # filled all three, and which refusal came first was the fan-out's order.)
            with pytest.raises(irdma.ArenaFull, match="n1: arena full"):
                client.write("model", np.ones(3 << 19, np.float32), replace=True)
            assert np.array_equal(client.read("model"), old)
        with Client(c.config_path) as other:
            assert other.stat("model").shape == old.shape
            assert np.array_equal(other.read("model"), old)
    finally:
        c.close()


def test_daemon_down_is_a_clear_error(fresh_cluster: Cluster) -> None:
    client = fresh_cluster.client()
    x = np.arange(500_000, dtype=np.float32)
    client.write("down/x", x)
    fresh_cluster.kill("n2")
    with pytest.raises(irdma.DaemonUnavailable, match="n2"):
        client.read("down/x")
    with pytest.raises(irdma.DaemonUnavailable, match="n2"):
        fresh_cluster.client().read("down/x")
    # One copy of each shard: the error says there is no other to ask.
    with pytest.raises(irdma.DaemonUnavailable, match="unavailable until it is back"):
        client.read("down/x")


def test_hung_daemon_times_out(fresh_cluster: Cluster) -> None:
    import signal

    client = fresh_cluster.client()  # timeout 2 s from the fixture's config
    x = np.arange(500_000, dtype=np.float32)
    client.write("hung/x", x)
    fresh_cluster.signal("n1", signal.SIGSTOP)
    try:
        # A read from a same-host daemon needs none of its CPU (one-sided):
        # a paused daemon's shards are read from its memory, unchanged.
        assert np.array_equal(client.read("hung/x"), x)
        t = time.monotonic()
        with pytest.raises(irdma.DaemonTimeout, match="n1"):
            client.write("hung/x", x)  # an update needs the daemon
        # Bounded: the timeout plus the watchdog tick, never a hang.
        assert time.monotonic() - t < 10
    finally:
        fresh_cluster.signal("n1", signal.SIGCONT)
    assert np.array_equal(client.read("hung/x"), x)  # reconnects once it answers again


def test_daemon_killed_mid_transfer(fresh_cluster: Cluster) -> None:
    client = fresh_cluster.client()
    x = np.arange(8 << 20, dtype=np.float32)  # 32 MiB: long enough to kill during it
    client.write("mid/x", x)
    reading, done = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def reader() -> None:
        # Reads until one fails (bounded): the kill below comes while it reads,
        # whatever the machine's speed (a fixed number of reads could all end
        # before it).
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                client.read("mid/x")
                reading.set()
            outcome.append(None)
        except BaseException as exc:  # recorded for the assertion below
            outcome.append(exc)
        finally:
            reading.set()
            done.set()

    t = threading.Thread(target=reader)
    t.start()
    assert reading.wait(20), "the first read did not end"
    fresh_cluster.kill("n3")
    assert done.wait(30), "reader hung after the daemon died"
    t.join()
    assert isinstance(outcome[0], irdma.DaemonUnavailable)


def test_client_without_config_uses_env(cluster: Cluster, monkeypatch) -> None:
    monkeypatch.setenv("IRDMA_CONFIG", str(cluster.config_path))
    with Client() as c:
        c.write("env/x", np.ones(3))
        assert c.read("env/x").sum() == 3
    with pytest.raises(irdma.ClientClosed):
        c.read("env/x")


def raw_list(cluster: Cluster, name: str, prefix: str) -> list[dict]:
    """What one daemon holds under ``prefix`` (LIST over a raw socket)."""
    node = cluster.config.node(name)
    body = prefix.encode()
    with socket.create_connection((node.address.host, node.address.port), 5.0) as s:
        s.sendall(Header(op=Op.LIST, length=len(body)).pack() + body)
        header = unpack_header(recv_exactly(s, HEADER_SIZE))
        assert header.status == Status.OK
        return decode_json(recv_exactly(s, header.length))


@pytest.fixture(scope="module")
def two_copies(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    cluster = make_cluster(tmp_path_factory.mktemp("two-copies"), 3, replicas=2)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.parametrize("how", ["delete", "replace"])
def test_a_tensor_recreated_by_another_client_reads_at_once(two_copies: Cluster, how: str) -> None:
    """Versions start again when another process recreates a tensor: readers follow the primary."""
    shard = 64 << 10
    x = np.arange(4 * shard // 8, dtype=np.float64)
    with Client(two_copies.config_path, timeout=3.0) as a, Client(two_copies.config_path) as b:
        a.write(f"again/{how}", x, replace=True)
        for _ in range(4):  # a sees versions well above what a new tensor starts at
            a.accumulate(f"again/{how}", np.ones_like(x))
        assert np.array_equal(a.read(f"again/{how}"), x + 4)
        y = x[::-1].copy()
        if how == "delete":
            b.delete(f"again/{how}")
            b.write(f"again/{how}", y)
        else:  # redefined: another dtype
            y = y.astype(np.float32)
            b.write(f"again/{how}", y, replace=True)
        # Answered by the primary, not refused by every copy as behind.
        assert np.array_equal(a.read(f"again/{how}"), y)


def test_replacing_with_fewer_shards_leaves_no_old_copy(two_copies: Cluster) -> None:
    shard = 64 << 10
    with Client(two_copies.config_path) as c:
        c.write("shrink/t", np.ones(12 * shard // 4, dtype=np.float32))  # 12 shards: every daemon
        c.write("shrink/t", np.zeros(100, dtype=np.int8), replace=True)  # 1 shard: 2 daemons
        key = tensor_key("shrink/t")
        holders = {n.name for n in c.config.replicas_for(key, 0)}
        for node in c.config.nodes:
            held = [t["meta"]["name"] for t in raw_list(two_copies, node.name, "shrink/")]
            assert ("shrink/t" in held) == (node.name in holders), (node.name, held)
        assert np.array_equal(c.read("shrink/t"), np.zeros(100, dtype=np.int8))
