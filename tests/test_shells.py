"""The two shells of the client's core: the blocking Client runs in the calling thread.

Real daemons (64 KiB shards, so a 1 MB tensor spans all three of them).
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio

from irdma import Client
from irdma.client import AsyncClient
from irdma.client.shells import BlockingShell, drive, gather_under_trio, take_turns
from irdma.cluster import Node
from irdma.errors import DaemonTimeout
from irdma.protocol import tensor_key
from irdma.transport.base import StreamTimeout
from irdma.transport.blocking import BlockingConnection, BlockingWaits, Busy, Nap, Sent, _yield
from irdma.transport.select import may_use_rdma
from irdma.transport.tcp import FramedSocket

from .helpers.cluster import Cluster, make_cluster

N = 250_000  # float32: ~1 MB, 15 shards of 64 KiB


def test_drive_runs_a_coroutine_that_never_suspends_and_refuses_one_that_does() -> None:
    async def plain(x: int) -> int:
        return x + 1

    assert drive(plain(1)) == 2
    with pytest.raises(RuntimeError, match="tried to suspend"):
        drive(trio.sleep(0))

    async def sends(conn: str) -> str:  # outside a fan-out its answer is read at once
        await _yield(Sent(conn))  # type: ignore[arg-type]
        return conn

    assert drive(sends("a")) == "a"


class FakeConn:
    """What a BlockingConnection's request does around its socket, as take_turns sees it:
    wait while another request holds it, send (yield Sent), read the answer."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log
        self.busy = False

    async def request(self, what: str) -> str:
        while self.busy:
            await _yield(Busy(self))  # type: ignore[arg-type]
        self.busy = True
        try:
            self.log.append(f"send {what}")
            await _yield(Sent(self))  # type: ignore[arg-type]
            self.log.append(f"answer {what}")
            return what.upper()
        finally:
            self.busy = False


def test_take_turns_sends_to_every_connection_before_reading_an_answer() -> None:
    """One request in flight per connection; a connection's next request is sent
    as soon as its answer is read, before the other connections' answers."""
    log: list[str] = []
    a, b = FakeConn("a", log), FakeConn("b", log)
    calls = [partial(conn.request, f"{conn.name}{i}") for i in range(2) for conn in (a, b)]
    assert drive(take_turns(calls)) == ["A0", "B0", "A1", "B1"]
    assert log == [
        "send a0", "send b0",  # both daemons work at once
        "answer a0", "send a1",  # a's next request right after its answer
        "answer b0", "send b1",
        "answer a1", "answer b1",
    ]  # fmt: skip


def test_take_turns_closes_the_others_when_a_call_fails() -> None:
    """The first error is raised; a call whose answer was pending is closed (a
    real connection then fails: its answer was never read)."""
    log: list[str] = []
    a, b = FakeConn("a", log), FakeConn("b", log)
    closed: list[str] = []

    async def pending() -> None:
        try:
            await a.request("slow")
        except GeneratorExit:
            closed.append("slow")
            raise

    async def fails() -> None:
        await b.request("b")
        raise ValueError("bad shard")

    with pytest.raises(ValueError, match="bad shard"):
        drive(take_turns([fails, pending]))
    assert closed == ["slow"] and "answer slow" not in log


def test_take_turns_resumes_a_waiter_whose_connection_a_nested_fan_out_freed() -> None:
    """A connection held and let go inside a nested fan-out wakes nobody in the
    outer one; its waiter there is resumed once nothing else can go on
    (seen: gather's reads, each with a stat fan-out inside)."""
    log: list[str] = []
    a = FakeConn("a", log)

    async def inner() -> list[str]:
        return await take_turns([partial(a.request, "inner")])

    out = drive(take_turns([partial(a.request, "held"), inner, partial(a.request, "waits")]))
    assert out == ["HELD", ["INNER"], "WAITS"]
    assert log == [
        "send held", "answer held", "send inner", "answer inner", "send waits", "answer waits"
    ]  # fmt: skip


def test_take_turns_inside_a_call_passes_a_wait_for_an_outer_connection_up() -> None:
    """A fan-out inside one call of another, waiting for a connection an outer
    call holds, lets the outer fan-out read that answer first (no deadlock)."""
    log: list[str] = []
    a, b = FakeConn("a", log), FakeConn("b", log)

    async def inner() -> list[str]:
        return await take_turns([partial(a.request, "inner-a"), partial(b.request, "inner-b")])

    out = drive(take_turns([partial(a.request, "outer-a"), inner]))
    assert out == ["OUTER-A", ["INNER-A", "INNER-B"]]
    assert log.index("answer outer-a") < log.index("send inner-a")
    assert log.index("send inner-b") < log.index("answer outer-a")  # b was not held


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_calls_run_in_the_calling_thread_with_no_loop_thread(
    cluster: Cluster, transport: str
) -> None:
    x = np.arange(N, dtype=np.float32)
    before = {t.ident for t in threading.enumerate()}
    with Client(cluster.config_path, transport=transport) as c:
        assert isinstance(c.async_client.session.shell, BlockingShell)
        c.write(f"shell/{transport}", x)
        c.accumulate(f"shell/{transport}", x, alpha=0.5)
        assert np.array_equal(c.read(f"shell/{transport}"), x * 1.5)
        small = c.read_bytes(f"shell/{transport}", 8, 16)
        assert np.array_equal(np.frombuffer(small, np.float32), x[2:6] * 1.5)
        during = {t.ident for t in threading.enumerate()}
        conns = list(c.async_client.session.conns.values())
    # No thread was started to serve the calls: they ran in this one.
    assert during == before
    assert conns and all(isinstance(k, BlockingConnection) for k in conns)
    assert {k.transport for k in conns} == {transport}
    assert all(k.broken for k in conns)  # closed with the client


def test_each_thread_gets_its_own_connections_and_sums_stay_exact(cluster: Cluster) -> None:
    with Client(cluster.config_path) as c:
        c.write("shell/threads", np.zeros(N, np.int64))
        conns: dict[int, list[int]] = {}
        errors: list[BaseException] = []

        def worker(k: int) -> None:
            try:
                for _ in range(10):
                    c.accumulate("shell/threads", np.full(N, k + 1, np.int64))
                conns[k] = [id(v) for v in c.async_client.session.conns.values()]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert np.array_equal(c.read("shell/threads"), np.full(N, 10 * (1 + 2 + 3 + 4)))
    ids = [i for k in conns.values() for i in k]
    assert len(conns) == 4 and len(ids) == len(set(ids)), conns


async def test_a_blocking_client_works_from_inside_trio(cluster: Cluster) -> None:
    """Called inside a trio run, the blocking client's fan-out needs no loop of its own."""
    x = np.arange(N, dtype=np.float32) - 7
    with Client(cluster.config_path) as c:
        c.write("shell/in-trio", x)
        assert np.array_equal(c.read("shell/in-trio"), x)
    async with AsyncClient(cluster.config_path) as ac:
        assert np.array_equal(await ac.read("shell/in-trio"), x)


def test_a_paused_daemon_is_a_timeout_then_the_client_reconnects(fresh_cluster: Cluster) -> None:
    c = fresh_cluster
    x = np.arange(N, dtype=np.float32)
    with Client(c.config_path) as client:
        client.write("shell/paused", x)
        c.signal("n1", signal.SIGSTOP)
        try:
            with pytest.raises(DaemonTimeout, match="n1"):
                client.write("shell/paused", x)  # reads need no daemon CPU (one-sided)
        finally:
            c.signal("n1", signal.SIGCONT)
        # The timed-out connection was dropped; a new one serves.
        assert np.array_equal(client.read("shell/paused"), x)


def test_rdma_may_be_used_only_where_asked_for_or_a_device_exists(cluster: Cluster) -> None:
    nodes = cluster.config.nodes
    assert may_use_rdma(nodes, "rdma")
    assert not may_use_rdma(nodes, "tcp") and not may_use_rdma(nodes, "shm")


def test_the_shards_of_one_call_use_the_threads_own_connections(cluster: Cluster) -> None:
    """The shards of one call go over the thread's own connections, which stay open
    and in use for the small calls after it (no reconnect)."""
    x = np.arange(N, dtype=np.float32)
    with Client(cluster.config_path, transport="tcp") as c:
        c.write("shell/loan", x)
        for node in cluster.config.nodes:  # one connection per daemon, made by small calls
            c.hello(node)
        before = dict(c.async_client.session.conns)
        sockets = {name: conn.stream.sock.fileno() for name, conn in before.items()}
        for _ in range(3):
            assert np.array_equal(c.read("shell/loan"), x)  # 15 shards over 3 daemons
            c.accumulate("shell/loan", x)
            c.accumulate("shell/loan", -x)
        assert c.read_bytes("shell/loan", 0, 8) == x[:2].tobytes()
        after = dict(c.async_client.session.conns)
        assert after == before
        assert not any(conn.broken for conn in after.values())
        assert {name: conn.stream.sock.fileno() for name, conn in after.items()} == sockets


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_calls_shards_are_in_flight_on_several_daemons_at_once(
    cluster: Cluster, transport: str
) -> None:
    """A many-shard call sends to the other daemons before it reads an answer:
    counted at each send, the thread's connections with a request pending."""
    x = np.arange(N, dtype=np.float32)
    with Client(cluster.config_path, transport=transport) as c:
        c.write(f"shell/inflight-{transport}", x)  # connections made, layout known
        conns = list(c.async_client.session.conns.values())
        seen: list[list[bool]] = []
        for conn in conns:
            send = conn.stream.send_all

            async def counted(buffers, send=send, conn=conn):  # type: ignore[no-untyped-def]
                seen.append([k.busy for k in conns])
                return await send(buffers)

            conn.stream.send_all = counted  # type: ignore[method-assign]
        c.write(f"shell/inflight-{transport}", x + 1)
        c.accumulate(f"shell/inflight-{transport}", x)
        assert np.array_equal(c.read(f"shell/inflight-{transport}"), 2 * x + 1)
    assert len(conns) == 3 and seen
    assert max(sum(s) for s in seen) == 3


def test_take_turns_reads_whichever_socket_is_ready_and_times_out_a_silent_one() -> None:
    """Real sockets: a request waiting on a peer that has sent nothing yet does not
    hold up one whose bytes came (the first peer writes only once the second's
    read is done); a peer that never writes gets StreamTimeout at the deadline,
    which is raised, and the rest of the fan-out is closed."""
    waits = BlockingWaits(timeout=0.5)
    pairs = [socket.socketpair() for _ in range(2)]
    log: list[str] = []
    try:
        for ours, _ in pairs:
            ours.setblocking(False)
        first, second = (
            FramedSocket(ours, peer, waits) for (ours, _), peer in zip(pairs, "ab", strict=True)
        )

        async def read(stream: FramedSocket) -> bytes:
            got = bytes(await stream.recv_bytes(4))
            log.append(f"{stream.peer} {got.decode()}")
            return got

        async def peers() -> None:
            pairs[1][1].send(b"bbbb")
            while "b bbbb" not in log:
                await _yield(Nap(time.monotonic()))  # the reads go on
            pairs[0][1].send(b"aaaa")

        out = drive(take_turns([partial(read, first), partial(read, second), peers]))
        assert out == [b"aaaa", b"bbbb", None]
        assert log == ["b bbbb", "a aaaa"]
        log.clear()
        pairs[1][1].send(b"more")
        with pytest.raises(StreamTimeout, match=r"no answer within 0\.5 s"):
            drive(take_turns([partial(read, first), partial(read, second)]))
        assert log == ["b more"]
    finally:
        for pair in pairs:
            for s in pair:
                s.close()


def _shard_counts(client: Client, name: str, shards: int) -> Counter[str]:
    config = client.config
    return Counter(config.primary_for(tensor_key(name), i).name for i in range(shards))


def test_the_other_daemons_answers_are_read_while_one_daemon_is_paused(
    fresh_cluster: Cluster,
) -> None:
    """The shards of one read are in flight on every daemon together, and each answer
    is read as it arrives: with one daemon paused (SIGSTOP) before the read, every
    shard on the other two is answered and read while it is still paused; only
    then does the test (on seeing that, from inside the read) let it go on."""
    c = fresh_cluster
    x = np.arange(N, dtype=np.float32)
    name = "shell/paused-one"
    paused = "n1"
    with Client(c.config_path, transport="tcp") as client:
        client.write(name, x)  # connections to every daemon made, layout known
        shards = -(-x.nbytes // client.config.shard_size)
        want = _shard_counts(client, name, shards)
        assert len(want) == 3 and all(k >= 2 for k in want.values()), want
        answers: list[str] = []
        resumed: list[int] = []
        for node_name, conn in client.async_client.session.conns.items():
            exchange = conn.exchange

            async def counted(*args, node_name=node_name, exchange=exchange):  # type: ignore[no-untyped-def]
                reply = await exchange(*args)
                answers.append(node_name)
                others = Counter(a for a in answers if a != paused)
                if not resumed and all(others[n] >= k for n, k in want.items() if n != paused):
                    resumed.append(len(answers))
                    c.signal(paused, signal.SIGCONT)
                return reply

            conn.exchange = counted  # type: ignore[method-assign]
        c.signal(paused, signal.SIGSTOP)
        try:
            got = client.read(name)
        finally:
            c.signal(paused, signal.SIGCONT)
    assert np.array_equal(got, x)
    # Every shard of the other two daemons was read before the paused one answered.
    assert resumed == [sum(k for n, k in want.items() if n != paused)], (resumed, answers)
    assert answers[resumed[0] :] == [paused] * want[paused]


@pytest.fixture
def replicated_cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Three daemons, two copies of each shard (2 s client timeout)."""
    c = make_cluster(tmp_path, replicas=2, timeout=2.0)
    try:
        yield c
    finally:
        c.close()


def test_requests_that_wait_for_one_connect_share_it_when_the_daemon_is_killed(
    replicated_cluster: Cluster,
) -> None:
    """A read whose connections all broke: every shard asks for its daemon's
    connection at once. The connect to one daemon is held open (its ``_open``
    waits, letting the read's other requests run) until a second shard asks
    for that daemon; then the daemon is killed with SIGKILL and the connect
    goes on and fails. Both shards get that failure once and fail over to the
    other copy: one connect at a time per daemon, nothing replaced, and the
    read returns the tensor."""
    c = replicated_cluster
    x = np.arange(N, dtype=np.float32) * 3
    name = "shell/killed-while-connecting"
    victim = "n2"
    with Client(c.config_path, transport="tcp") as client:
        client.write(name, x)
        shell = client.async_client.session.shell
        assert isinstance(shell, BlockingShell)
        asked: Counter[str] = Counter()
        opening: Counter[str] = Counter()  # connects under way, by daemon
        most: Counter[str] = Counter()  # the most under way at once
        killed: list[int] = []
        connection, open_ = shell.connection, shell._open

        async def counted(node: Node) -> BlockingConnection:
            asked[node.name] += 1
            return await connection(node)

        async def delayed(node: Node) -> BlockingConnection:
            opening[node.name] += 1
            most[node.name] = max(most[node.name], opening[node.name])
            try:
                if node.name == victim and not killed:
                    first = asked[victim]
                    while asked[victim] == first:  # until another shard asks for it
                        await shell.sleep(0)  # the read's other requests run meanwhile
                    killed.append(asked[victim])
                    c.kill(victim)
                return await open_(node)
            finally:
                opening[node.name] -= 1

        shell.connection = counted  # type: ignore[method-assign]
        shell._open = delayed  # type: ignore[method-assign]
        for conn in client.async_client.session.conns.values():
            conn.close()  # as if each daemon had dropped it
        got = client.read(name)
        conns = dict(client.async_client.session.conns)
        live = [k for k in shell._all if not k.broken]
    assert np.array_equal(got, x)
    assert killed and killed[0] >= 2  # a second shard asked while the connect waited
    # One connect at a time to each daemon, the killed one included.
    assert most == {"n1": 1, "n2": 1, "n3": 1}, most
    # Nothing replaced or leaked: the only connections open are the thread's own.
    assert sorted(map(id, live)) == sorted(id(conns[n]) for n in ("n1", "n3")), (live, conns)
    assert victim not in conns or conns[victim].broken


async def test_a_gather_raises_when_a_call_gives_neither_result_nor_error() -> None:
    """A call that raises another task's Cancelled (as an RDMA pull handed one did)
    is swallowed by the gather's nursery, which takes it for its own: the gather
    says so instead of returning a result that is not there."""
    foreign: trio.Cancelled | None = None
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.sleep(1)
        except trio.Cancelled as exc:
            foreign = exc
    assert foreign is not None

    async def handed_a_cancellation() -> int:
        await trio.sleep(0)
        raise foreign

    async def fine() -> int:
        await trio.sleep(0)
        return 1

    with pytest.raises(RuntimeError, match="neither a result nor an error"):
        await gather_under_trio([handed_a_cancellation, fine])
