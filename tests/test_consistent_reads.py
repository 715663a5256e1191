"""One-sided reads and whole-tensor writes, with real daemons and a real mount.

A same-host client reads shards straight out of the daemon's arena after a
version check (no message to the daemon); a whole-tensor write is one write
for every reader: all its shards, or all of the write before, never a mix.
"""

from __future__ import annotations

import io
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from irdma_fuse.attributes import ATTR_TIMEOUT, OPEN_ATTR_REUSE

import irdma
from irdma import Client
from irdma.client.shells import drive
from irdma.client.stamps import StampClock
from irdma.protocol import Op, tensor_key
from irdma.protocol.directory import SERVING_WORD
from irdma.protocol.messages import Update
from irdma.transport.direct import DirectReader

from .helpers.cluster import Cluster, make_cluster, name_on
from .helpers.mounts import start_mount

pytestmark = pytest.mark.timeout(180)

SHARD = 64 << 10  # the cluster fixture's shard size
N = 5 * SHARD // 4  # float32: five shards, spread over the three daemons


def readers_of(client: Client) -> list:
    """The one-sided readers of a client's connections (the calling thread's)."""
    return [
        c.bulk.directory
        for c in client.async_client.session.conns.values()
        if c.bulk.directory is not None
    ]


def uniform(y: np.ndarray) -> bool:
    return bool((y == y.flat[0]).all())


class Rewriter:
    """A thread rewriting one tensor whole with 1, 2, 3, ... until stopped."""

    def __init__(self, client: Client, name: str, n: int) -> None:
        self.client, self.name, self.n = client, name, n
        self.done = 0  # writes acknowledged
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.client.write(self.name, np.full(self.n, self.done + 1, np.float32))
                self.done += 1
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Rewriter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        assert self.error is None, self.error


# -- one-sided reads --------------------------------------------------------------------


def test_a_same_host_read_asks_no_daemon(cluster: Cluster) -> None:
    x = np.arange(N, dtype=np.float32)
    with Client(cluster.config_path) as c:
        c.write("one/x", x)
        assert np.array_equal(c.read("one/x"), x)
        readers = readers_of(c)
        assert readers and sum(r.reads for r in readers) == 5
        assert sum(r.bytes for r in readers) == x.nbytes
        assert sum(c.bulk.mapped_bytes for c in c.async_client.session.conns.values()) == 0
        small = np.arange(10, dtype=np.int64)
        c.write("one/small", small)
        assert np.array_equal(c.read("one/small"), small)
        assert sum(r.reads for r in readers_of(c)) == 6


SMALL = SHARD // 4  # float32 values of a one-shard tensor


def test_a_small_read_of_a_known_tensor_skips_the_general_path(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a client knows a one-shard tensor, Client.read copies it straight out of
    the arena (AsyncClient.read_now): no coroutine, no message to the daemon."""
    x = np.arange(SMALL, dtype=np.float32)
    with Client(cluster.config_path) as c:
        c.write("now/x", x)
        assert np.array_equal(c.read("now/x"), x)  # layout learnt, connection attached
        before = sum(r.reads for r in readers_of(c))

        def general(*args: object, **kwargs: object) -> None:
            raise AssertionError("the general read path ran")

        monkeypatch.setattr(c.async_client, "read", general)
        out = np.empty_like(x)
        assert c.read("now/x", out) is out and np.array_equal(out, x)
        assert np.array_equal(c.read("now/x"), x)
        assert sum(r.reads for r in readers_of(c)) == before + 2
        monkeypatch.undo()
        # What it cannot take goes the usual way, which says what is wrong.
        with pytest.raises(irdma.DtypeMismatch):
            c.read("now/x", np.empty(SMALL, np.float64))
        frozen = np.empty_like(x)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="writeable"):
            c.read("now/x", frozen)


def test_a_small_tensor_recreated_or_deleted_is_read_as_it_is_now(cluster: Cluster) -> None:
    with Client(cluster.config_path) as reader, Client(cluster.config_path) as writer:
        writer.write("now/re", np.arange(SMALL, dtype=np.float32))
        reader.read("now/re")
        writer.delete("now/re")
        with pytest.raises(irdma.TensorNotFound):
            reader.read("now/re")
        y = np.arange(SMALL // 2, dtype=np.int64)  # another layout, still one shard
        writer.write("now/re", y)
        assert np.array_equal(reader.read("now/re"), y)
        writer.delete("now/re")
        z = np.full(SMALL // 2, 7, np.int64)  # the same layout again
        writer.write("now/re", z)
        assert np.array_equal(reader.read("now/re"), z)


def test_read_many_copies_same_host_tensors_one_sided(cluster: Cluster) -> None:
    arrays = {
        "one/many/a": np.arange(N, dtype=np.float32),  # five shards
        "one/many/b": np.arange(7, dtype=np.int16),
        "one/many/c": np.ones((3, 3)),
    }
    with Client(cluster.config_path) as c:
        c.write_many(arrays)
        got = c.read_many(arrays)
        for name, x in arrays.items():
            assert np.array_equal(got[name], x) and got[name].dtype == x.dtype
        assert sum(r.reads for r in readers_of(c)) == 7


def test_one_sided_reads_can_be_turned_off(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IRDMA_ONE_SIDED", "0")
    x = np.arange(N, dtype=np.float32)
    with Client(cluster.config_path) as c:
        c.write("one/off", x)
        assert np.array_equal(c.read("one/off"), x)
        assert sum(r.reads for r in readers_of(c)) == 0


def test_not_one_sided_over_tcp(cluster: Cluster) -> None:
    x = np.arange(N, dtype=np.float32)
    with Client(cluster.config_path, transport="tcp") as c:
        c.write("one/tcp", x)
        assert np.array_equal(c.read("one/tcp"), x)
        assert readers_of(c) == []


def test_one_sided_with_replicas_follows_the_daemons_gates(tmp_path: Path) -> None:
    """With replicas, reads are one-sided from any up-to-date replica; a daemon that
    lost the majority says so in its directory, and is asked (NO_QUORUM) instead."""
    x = np.arange(N, dtype=np.float32)
    replicated = make_cluster(tmp_path / "r", replicas=2, timeout=2.0)
    try:
        with Client(replicated.config_path) as c:
            c.write("one/r", x)
            assert np.array_equal(c.read("one/r"), x)
            assert sum(r.reads for r in readers_of(c)) == 5
            # Two of three daemons stopped: the third cannot reach a majority.
            for name in ("n1", "n2"):
                replicated.signal(name, signal.SIGSTOP)
            try:
                alone = next(
                    k
                    for n, k in c.async_client.session.conns.items()
                    if n == "n3" and k.bulk.directory
                )
                deadline = time.monotonic() + 30
                while alone.bulk.directory.header[SERVING_WORD] == 1:
                    assert time.monotonic() < deadline, "n3 never noticed it is alone"
                    time.sleep(0.05)
                # n3 holds shards of one/r (replicas 2 of 3): a read of them asks it.
                reads = alone.bulk.directory.reads
                with pytest.raises(irdma.IrdmaError):
                    c.read("one/r")
                assert alone.bulk.directory.reads == reads
            finally:
                for name in ("n1", "n2"):
                    replicated.signal(name, signal.SIGCONT)
    finally:
        replicated.close()


def test_a_recreated_tensor_is_read_as_it_is_now(cluster: Cluster) -> None:
    with Client(cluster.config_path) as reader, Client(cluster.config_path) as writer:
        writer.write("one/re", np.arange(N, dtype=np.float32))
        reader.read("one/re")  # slots found and kept
        writer.delete("one/re")
        with pytest.raises(irdma.TensorNotFound):
            reader.read("one/re")
        y = np.arange(2 * N, dtype=np.int64)  # same name, another layout
        writer.write("one/re", y)
        assert np.array_equal(reader.read("one/re"), y)
        writer.delete("one/re")
        z = np.full(2 * N, 7, np.int64)  # the same layout again, new slots
        writer.write("one/re", z)
        assert np.array_equal(reader.read("one/re"), z)


@pytest.mark.parametrize("n", [N, SMALL], ids=["five shards", "one shard"])
def test_reads_during_continuous_accumulates_are_never_torn(cluster: Cluster, n: int) -> None:
    """Every shard a reader gets is one version: the seqlock caught the daemon
    changing it (retries seen) and the read came out whole anyway (one shard:
    through ``read_now``, the blocking client's path without a coroutine)."""
    name = f"one/acc-{n}"
    w = cluster.client()
    w.write(name, np.zeros(n, np.float32))
    stop = threading.Event()
    errors: list[BaseException] = []

    def accumulate() -> None:
        try:
            while not stop.is_set():
                w.accumulate(name, np.ones(n, np.float32))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=accumulate)
    t.start()
    try:
        with Client(cluster.config_path) as r:
            for _ in range(50_000):
                y = r.read(name).reshape(-1, SMALL)
                assert (y == y[:, :1]).all(), "a shard mixed two versions"
                if sum(d.retries for d in readers_of(r)) >= 3:
                    break
            else:
                pytest.fail("the reads never overlapped an accumulate")
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors


def test_a_large_read_copies_on_two_threads_and_stays_whole(cluster: Cluster) -> None:
    """Reads of 8 MiB and more copy their shards on two threads; with accumulates
    running, every shard is still one version (the race shown by retries)."""
    n = (12 << 20) // 4  # 192 shards of 64 KiB
    w = cluster.client()
    w.write("one/large", np.zeros(n, np.float32))
    stop = threading.Event()

    def accumulate() -> None:
        while not stop.is_set():
            w.accumulate("one/large", np.ones(n, np.float32))

    with Client(cluster.config_path) as r:
        assert np.array_equal(r.read("one/large"), np.zeros(n, np.float32))
        assert r.async_client.one_sided.copier._pool is not None  # the second thread copied
        assert sum(d.reads for d in readers_of(r)) == 192
        t = threading.Thread(target=accumulate)
        t.start()
        try:
            for _ in range(2000):
                y = r.read("one/large").reshape(192, -1)
                assert (y == y[:, :1]).all(), "a shard mixed two versions"
                if sum(d.retries for d in readers_of(r)) >= 3:
                    break
            else:
                pytest.fail("no read overlapped an accumulate")
        finally:
            stop.set()
            t.join(60)


@pytest.mark.parametrize("n", [N, SMALL], ids=["five shards", "one shard"])
def test_a_dead_daemon_is_not_read_from_its_memory(fresh_cluster: Cluster, n: int) -> None:
    c = fresh_cluster.client()
    name = name_on(fresh_cluster.config, "n1", "one/dead-")
    c.write(name, np.arange(n, dtype=np.float32))
    c.read(name)
    fresh_cluster.kill("n1")
    with pytest.raises(irdma.DaemonUnavailable, match="n1"):
        c.read(name)


# -- whole-tensor writes ------------------------------------------------------------------


@pytest.fixture(params=["one-sided", "shm", "tcp"])
def reader(request, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    if request.param == "shm":
        monkeypatch.setenv("IRDMA_ONE_SIDED", "0")
    transport = "tcp" if request.param == "tcp" else "shm"
    with Client(cluster.config_path, transport=transport) as c:
        yield c


def record_one_sided_pieces(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[int, int], object]:
    """Each one-sided piece's last answer, by (shard, offset): (version, stamp, previous
    stamp) or None, and the first value copied; for a failure's message (the record
    asked for when a mix was seen once and never reproduced)."""
    record: dict[tuple[int, int], object] = {}
    real = DirectReader.read

    def read(
        self: DirectReader,
        key: int,
        layout: int,
        index: int,
        offset: int,
        out: np.ndarray,
        min_version: int = 0,
    ) -> tuple[int, int, int] | None:
        got = real(self, key, layout, index, offset, out, min_version)
        record[index, offset] = (got, out[:4].view(np.float32).tolist())
        return got

    monkeypatch.setattr(DirectReader, "read", read)
    return record


def test_a_whole_tensor_write_is_atomic_for_readers(
    cluster: Cluster, reader: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers see all shards of one write or all of the one before, while a writer
    rewrites the tensor whole; reads that met two writes were reconciled."""
    pieces = record_one_sided_pieces(monkeypatch)
    # A name of its own: the one-sided and shm cases share a transport, and a
    # client's id() can be reused once the one before it is gone.
    name = f"atomic/{reader.async_client.transport}-{uuid.uuid4().hex}"
    w = cluster.client()
    w.write(name, np.zeros(N, np.float32))
    seen: set[float] = set()
    with Rewriter(w, name, N) as writer:
        for _ in range(20_000):
            y = reader.read(name)
            assert uniform(y), (
                f"shards of two writes: {np.unique(y)}; first value of each shard "
                f"{y.reshape(-1, SHARD // 4)[:, 0].tolist()}; one-sided pieces "
                f"(shard, offset) -> ((version, stamp, prev), first values): {pieces}; "
                f"reads reconciled {reader.async_client.contention.reads_reconciled}"
            )
            pieces.clear()
            seen.add(float(y[0]))
            # Three of the rewriter's values (not the first zeros): at least three
            # of its writes were applied, and the last of them is acknowledged by
            # the time the rewriter is stopped and joined.
            if reader.async_client.contention.reads_reconciled >= 3 and len(seen - {0.0}) >= 3:
                break
        else:
            pytest.fail(
                f"reads never met a write: {reader.async_client.contention.reads_reconciled}"
            )
    assert writer.done >= 3


def test_a_writer_stopped_half_way_leaves_the_write_before(cluster: Cluster) -> None:
    """Shards 0 and 1 of a new write arrive, the rest never do: readers get the old
    tensor whole (the daemons kept the previous copies)."""
    old = np.arange(N, dtype=np.float32)
    with Client(cluster.config_path) as c:
        c.write("atomic/half", old)
        core = c.async_client
        meta = c.stat("atomic/half").meta
        stamp = StampClock().next()
        for shard in (0, 1):
            new = np.full(SHARD // 4, -1, np.float32)
            msg = Update(Op.WRITE, meta.key, shard, 0, SHARD, layout=meta.layout, stamp=stamp)
            drive(core.router.on_replicas(meta.key, shard, msg, [new], length=SHARD, update=True))
        for transport in ("shm", "tcp"):
            with Client(cluster.config_path, transport=transport) as r:
                assert np.array_equal(r.read("atomic/half"), old)
                assert r.async_client.contention.reads_reconciled == 1
        # The rest of the write arrives: the new write, whole.
        c.write("atomic/half", np.full(N, -1, np.float32))
        assert uniform(c.read("atomic/half"))


def test_ranges_read_one_after_another_make_one_version(cluster: Cluster) -> None:
    """read_range(at=) reads later ranges from the write the first came from."""
    with Client(cluster.config_path) as c:
        c.write("atomic/ranges", np.full(N, 1, np.float32))
        first = np.empty(2 * SHARD, np.uint8)
        stamp = c.read_range("atomic/ranges", 0, first)
        c.write("atomic/ranges", np.full(N, 2, np.float32))
        rest = np.empty(N * 4 - 2 * SHARD, np.uint8)
        assert c.read_range("atomic/ranges", 2 * SHARD, rest, at=stamp) == stamp
        assert uniform(rest.view(np.float32)) and rest.view(np.float32)[0] == 1
        c.write("atomic/ranges", np.full(N, 3, np.float32))  # two writes on: kept a while
        assert c.read_range("atomic/ranges", 2 * SHARD, rest, at=stamp) == stamp
        assert rest.view(np.float32)[0] == 1
        # Every daemon needs the room: the copies kept for readers are given back.
        hit: set[str] = set()
        for i in range(100):
            name = f"atomic/huge-{i}"
            node = cluster.config.primary_for(tensor_key(name), 0).name
            if node not in hit:
                hit.add(node)
                with pytest.raises(irdma.ArenaFull):
                    c.create(name, (64 << 20) // 4, np.float32, shard_size=64 << 20)
        assert len(hit) == 3
        with pytest.raises(irdma.TornRead, match="rewritten twice"):
            c.read_range("atomic/ranges", 2 * SHARD, rest, at=stamp)
        assert uniform(c.read("atomic/ranges"))


@pytest.mark.timeout(240)
def test_the_mount_serves_one_write_whole(cluster: Cluster, tmp_path: Path) -> None:
    """np.load through the mount while a client rewrites the tensor whole: every load
    is one write (the file spans three of the mount's 4 MiB chunks)."""
    n = 3 * (4 << 20) // 4
    w = cluster.client()
    w.write("atomic/big", np.zeros(n, np.float32))
    m = start_mount(cluster, tmp_path / "mnt")
    try:
        overlapped = 0
        with Rewriter(w, "atomic/big", n) as writer:
            for _ in range(200):
                before = writer.done
                y = np.load(m.path / "atomic" / "big.npy")
                assert uniform(y), f"a load mixed writes: {np.unique(y)[:5]}"
                overlapped += writer.done > before
                if overlapped >= 3:
                    break
            else:
                pytest.fail("no load overlapped a write")
    finally:
        m.unmount()


@pytest.mark.timeout(120)
def test_an_open_the_page_cache_serves_keeps_its_version_when_the_kernel_drops_pages(
    cluster: Cluster, tmp_path: Path
) -> None:
    """An open of an unchanged file is served by the page cache (keep_cache). The
    tensor is rewritten while it is open and, once the mount's reuse of the open's
    attributes runs out, the kernel sees the new mtime and drops the cached pages
    (auto_inval_data): the rest of the open's reads reach the mount, and must come
    from the version the open saw, not the new one."""
    n = 3 * (4 << 20) // 4  # three of the mount's chunks
    w = cluster.client()
    w.write("atomic/cached", np.full(n, 1, np.float32))
    m = start_mount(cluster, tmp_path / "mnt")
    try:
        path = m.path / "atomic" / "cached.npy"
        assert uniform(np.load(path))  # the page cache now holds write 1
        with open(path, "rb") as f:  # unchanged since: the page cache serves it
            head = f.read(4 << 20)
            w.write("atomic/cached", np.full(n, 2, np.float32))
            time.sleep(OPEN_ATTR_REUSE + 2 * ATTR_TIMEOUT)
            rest = f.read()
        data = np.frombuffer(head + rest, np.uint8)
        y = np.lib.format.read_array(io.BytesIO(data.tobytes()))
        assert uniform(y), f"one open read two writes: {np.unique(y)}"
    finally:
        m.unmount()
