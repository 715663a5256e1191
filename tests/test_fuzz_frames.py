"""Fuzzing psd's frame parser and request handlers: the short, bounded pass CI runs.

Three layers, each with hypothesis-made input:

- the sans-IO parsers in ``irdma.protocol`` (and the option and metadata
  checks behind them), in-process: only the documented exceptions escape;
- the daemon's real request handlers, in-process (``tests/helpers/fuzz_harness.py``:
  a ``Server`` on a socketpair, in a one-copy and a two-copy cluster), with
  structure-aware frames and raw bytes: no hang, no escaped exception, well-
  formed replies, no tensor changed without an accepted update, nothing
  pinned or leaked, and the daemon still answers;
- real ``psd`` daemons on loopback over TCP and over the shm unix socket:
  replies are error statuses or a closed connection within a deadline, every
  daemon still answers, and protected tensors (which no generated frame may
  legally change) stay byte-for-byte and version-for-version the same.

The long campaign (a million inputs and more, coverage-guided with atheris)
is ``bench/fuzz.py``, over the same harness.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
from collections.abc import Iterator

import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from irdma import Client
from irdma.protocol import (
    ENTRY_SIZE,
    HEADER_SIZE,
    MAGIC,
    PROTOCOL_VERSION,
    BatchEntry,
    Flag,
    Header,
    Op,
    ProtocolError,
    Status,
    TensorMeta,
    decode_json,
    encode_json,
    pack_entries,
    tensor_key,
    unpack_entries,
    unpack_header,
)
from irdma.training.modes import Mode
from irdma.transport.shm import make_staging
from irdma.transport.unix import recv_fds_frame, send_fds_frame, short_address, socket_path

from .helpers.cluster import Cluster
from .helpers.fuzz_harness import OTHER, Harness, Outcome, check_replies

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)
SMALL = st.integers(0, 5000)
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["\ud800", "a\udc80b"])  # lone surrogates: valid JSON, not UTF-8
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
DTYPES = st.sampled_from(["float32", "float64", "int8", "uint64", "bool", "complex64", "object"])
NAMES = st.sampled_from(["fz/new", "fuzz/scratch/a", "a/../b", "", "x" * 1100, "\udc80", "a\0b"])
OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "mode": st.sampled_from(["async", "sync", "ssp", "hybrid", "bogus"]) | JSON,
        "workers": st.integers(-2, 10) | JSON,
        "slack": st.integers(-1, 3) | JSON,
        "groups": st.integers(0, 4) | JSON,
        "worker_timeout": st.floats(allow_nan=True) | st.integers() | JSON,
        "on_timeout": st.sampled_from(["error", "evict"]) | JSON,
        "apply": st.sampled_from(["add", "set"]) | JSON,
    },
)
META_DICTS = st.fixed_dictionaries(
    {},
    optional={
        "name": NAMES | JSON,
        "dtype": DTYPES | JSON,
        "shape": st.lists(st.integers(-1, 3000) | st.integers(), max_size=4) | JSON,
        "shard_size": st.sampled_from([1, 3, 4096, 2**62]) | st.integers() | JSON,
        "options": OPTIONS | JSON,
    },
)


# -- the sans-IO parsers ----------------------------------------------------------


@pytest.mark.timeout(60)
@settings(SETTINGS)
@given(data=st.binary(max_size=2 * HEADER_SIZE) | st.binary(min_size=100, max_size=110))
@example(data=MAGIC + bytes(HEADER_SIZE - 4))
def test_unpack_header_raises_only_protocol_error(data: bytes) -> None:
    try:
        h = unpack_header(data)
    except ProtocolError:
        assert len(data) != HEADER_SIZE or data[:4] != MAGIC
        return
    assert len(data) == HEADER_SIZE and data[:4] == MAGIC
    again = h.pack()  # every field survives; the 4 reserved bytes are written as 0
    alpha = slice(64, 72)
    if math.isnan(h.alpha):
        again = again[: alpha.start] + data[alpha] + again[alpha.stop :]
    assert again == data[:84] + bytes(4) + data[88:]


@pytest.mark.timeout(60)
@settings(SETTINGS)
@given(data=st.binary(max_size=5 * ENTRY_SIZE), count=st.integers(0, 8) | U32)
def test_unpack_entries_raises_only_protocol_error(data: bytes, count: int) -> None:
    try:
        entries = unpack_entries(data, count)
    except ProtocolError:
        assert len(data) < count * ENTRY_SIZE
        return
    assert len(entries) == count
    assert pack_entries(entries) == data[: count * ENTRY_SIZE] or any(
        math.isnan(e.alpha) for e in entries
    )


@pytest.mark.timeout(60)
@settings(SETTINGS)
@given(data=st.binary(max_size=200) | JSON.map(encode_json))
@example(data=b"[" * 100_000)  # deeper than the interpreter's recursion limit
@example(data=b'{"a":' * 50_000)
@example(data=b"\xff\xfe")
def test_decode_json_raises_only_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_json(data)


@pytest.mark.timeout(60)
@settings(SETTINGS)
@given(value=META_DICTS | JSON)
@example(value={"name": "a", "dtype": "float32", "shape": [2], "shard_size": 8, "options": 5})
@example(
    value={
        "name": "a",
        "dtype": "float32",
        "shape": [2],
        "shard_size": 8,
        "options": {"mode": "sync", "workers": 2, "worker_timeout": 10**400},
    }
)
@example(
    value={
        "name": "a",
        "dtype": "float32",
        "shape": [2],
        "shard_size": 8,
        "options": {"x": decode_json(b"[" * 100 + b"]" * 100)},
    }
)
def test_tensor_metadata_from_any_json_raises_only_value_error(value) -> None:
    """What CREATE and SYNC bodies go through: ValueError (BAD_ARGUMENT) or a usable meta."""
    try:
        meta = TensorMeta.from_dict(value)
        Mode.from_options(meta.options)
    except ValueError:
        return
    encode_json(meta.to_dict())  # stored metadata can always be sent back
    assert meta.num_shards >= 1


@pytest.mark.timeout(60)
@settings(SETTINGS)
@given(options=OPTIONS)
@example(options={"mode": "ssp", "workers": 2, "slack": 1, "worker_timeout": 10**400})
@example(options={"mode": "sync", "workers": 2, "worker_timeout": -(10**400)})
def test_mode_options_raise_only_value_error(options) -> None:
    try:
        mode = Mode.from_options(options)
    except ValueError:
        return
    mode.describe()


# -- frames: structure-aware generation --------------------------------------------


def _json_body(draw: st.DrawFn, op: int, names: list[str]) -> bytes:
    node = st.sampled_from(["n1", "n2", "n3", OTHER, "nobody"]) | JSON
    if op == Op.CREATE:
        meta = draw(
            st.builds(
                lambda name, extra: (
                    {
                        "name": name,
                        "dtype": "float32",
                        "shape": [4],
                        "shard_size": 4096,
                    }
                    | extra
                ),
                st.sampled_from(names) | NAMES,
                META_DICTS,
            )
        )
        return encode_json(meta)
    if op in (Op.PING, Op.CATCHUP):
        return encode_json(
            draw(
                st.fixed_dictionaries(
                    {"node": node},
                    optional={"ready": JSON, "handoff": JSON, "boot": JSON, "seq": JSON},
                )
            )
        )
    shards = st.lists(st.tuples(U64 | st.integers(0, 3), st.integers(0, 4)), max_size=3)
    return encode_json({"node": draw(node), "shards": draw(shards | JSON)})


@st.composite
def frames(draw: st.DrawFn, keys: list[int], layouts: list[int], names: list[str]) -> bytes:
    """One frame: valid header structure, fields and payload drawn per op."""
    op = draw(st.sampled_from([int(op) for op in Op]) | st.integers(0, 255))
    key = draw(st.sampled_from(keys) | U64)
    fields = {
        "op": op,
        "key": key,
        "flags": draw(
            st.just(0) | st.sampled_from([int(f) for f in Flag]) | st.integers(0, 0xFFFF)
        ),
        "shard": draw(st.integers(0, 4) | U32),
        "offset": draw(st.integers(0, 64) | SMALL | U64),
        "dtype": draw(st.just(0) | st.integers(0, 15) | st.integers(0, 0xFFFF)),
        "alpha": draw(st.just(1.0) | st.floats()),
        "layout": draw(st.just(0) | st.sampled_from(layouts) | U64),
        "worker": draw(st.just(0xFFFFFFFF) | st.integers(0, 3) | U32),
        "step": draw(st.integers(0, 3) | U64),
        "txn": draw(st.just(0) | U64),
        "version": draw(st.just(0) | st.integers(0, 3) | U64),
        "request_id": draw(st.integers(0, 3) | U64),
    }
    if op in (Op.WRITE, Op.ACCUMULATE):
        payload = draw(st.binary(max_size=64))
        fields["size"] = draw(st.just(len(payload)) | st.integers(0, 64) | U64)
    elif op == Op.READ:
        payload = b""
        fields["size"] = draw(st.integers(0, 4096) | st.just(256 << 10) | U64)
    elif op in (Op.READ_BATCH, Op.WRITE_BATCH, Op.ACCUMULATE_BATCH):
        entries = draw(
            st.lists(
                st.builds(
                    BatchEntry,
                    key=st.sampled_from(keys) | U64,
                    shard=st.integers(0, 3) | U32,
                    offset=st.integers(0, 64) | U64,
                    length=st.integers(0, 32) | U64,
                    alpha=st.just(1.0) | st.floats(),
                    dtype=st.just(0) | st.integers(0, 15),
                    version=st.just(0) | U64,
                ),
                max_size=4,
            )
        )
        fields["shard"] = draw(st.just(len(entries)) | st.integers(0, 6) | U32)
        data = b"".join(b"\x01" * min(e.length, 32) for e in entries)
        if op == Op.READ_BATCH:
            data = b""
        payload = pack_entries(entries) + draw(st.just(data) | st.binary(max_size=40))
    elif op in (Op.CREATE, Op.PING, Op.CATCHUP, Op.SYNC_REQUEST):
        not_json = draw(st.integers(0, 9)) == 0
        payload = draw(st.binary(max_size=40)) if not_json else _json_body(draw, op, names)
    elif op == Op.SYNC:
        meta = draw(META_DICTS | st.sampled_from(names).map(lambda n: {"name": n}))
        head = encode_json({"meta": meta, "txns": draw(JSON)})
        data = draw(st.binary(max_size=48))
        fields["offset"] = draw(st.just(len(head)) | st.integers(0, 200) | U64)
        fields["size"] = draw(st.just(len(data)) | st.integers(0, 64))
        payload = head + data
    elif op == Op.LIST:
        payload = draw(st.sampled_from([b"", b"fz/", b"fuzz/"]) | st.binary(max_size=8))
    else:
        payload = draw(st.binary(max_size=32))
    length = draw(
        st.just(len(payload))
        | st.integers(0, len(payload))  # the rest is taken for the next frame
        | st.integers(len(payload), len(payload) + 300)  # truncated: waits for EOF
        | U64  # huge: refused unread
    )
    return Header(length=length, **fields).pack() + payload


def streams(keys: list[int], layouts: list[int], names: list[str]) -> st.SearchStrategy[bytes]:
    structured = st.lists(frames(keys, layouts, names), min_size=1, max_size=4).map(b"".join)
    raw = st.binary(max_size=400)
    with_magic = st.binary(min_size=HEADER_SIZE - 5, max_size=300).map(
        lambda b: MAGIC + bytes([PROTOCOL_VERSION]) + b
    )
    return structured | structured | raw | with_magic


# -- the daemon's handlers, in-process ---------------------------------------------


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Harness]]:
    made = [
        Harness(tmp_path_factory.mktemp(f"fuzz-{r}"), replicated=r, hang_timeout=10.0)
        for r in (False, True)
    ]
    try:
        yield made
    finally:
        for h in made:
            h.close()


def _harness_streams() -> st.SearchStrategy[bytes]:
    # Keys are drawn from a table of indexes; shape_input maps them to tensors.
    idx = list(range(20))
    return streams(idx, list(range(1, 20)), ["fz/new", "fz/new/deeper", "fz/f32.0"])


async def _serve(harness: Harness, stream: bytes, shm: bool) -> Outcome:
    async with harness.serving():
        with trio.fail_after(30):
            return await harness.run_stream(stream, shm=shm)


@pytest.mark.timeout(120)
@settings(SETTINGS, max_examples=400)
@given(
    stream=_harness_streams(),
    replicated=st.booleans(),
    shm=st.booleans(),
    map_keys=st.booleans(),
)
def test_handlers_survive_any_frames(
    harnesses: list[Harness], stream: bytes, replicated: bool, shm: bool, map_keys: bool
) -> None:
    harness = harnesses[replicated]
    if map_keys:  # key and layout fields below 256 name the harness's tensors
        stream, _ = harness.shape_input(bytes([0b0110]) + stream)
    outcome = trio.run(_serve, harness, stream, shm)
    assert not outcome.problems, outcome.problems


@pytest.mark.timeout(120)
def test_every_seed_is_served_cleanly(harnesses: list[Harness]) -> None:
    """The long campaign's corpus: valid requests of every op, in both clusters."""

    async def main() -> None:
        for harness in harnesses:
            async with harness.serving():
                for seed in harness.seed_inputs():
                    outcome = await harness.run(seed)
                    assert not outcome.problems, (seed[:200], outcome.problems)

    trio.run(main)


def _frame(op: int, payload: bytes = b"", **fields) -> bytes:
    return Header(op=op, length=len(payload), **fields).pack() + payload


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "make, status",
    [
        # ATTACH is the shm handshake's first frame: on a serving connection it
        # raised KeyError in dispatch (no handler) and dropped the connection.
        (lambda h: _frame(Op.ATTACH, b"{}"), Status.BAD_OP),
        # A JSON body nested past the recursion limit escaped as RecursionError.
        (lambda h: _frame(Op.CREATE, b"[" * 100_000, key=tensor_key("x")), Status.BAD_ARGUMENT),
        # A worker_timeout too large for a float escaped as OverflowError.
        (
            lambda h: _frame(
                Op.CREATE,
                encode_json(
                    {
                        "name": "fz/new",
                        "dtype": "float32",
                        "shape": [2],
                        "shard_size": 4096,
                        "options": {"mode": "sync", "workers": 2, "worker_timeout": 10**400},
                    }
                ),
                key=tensor_key("fz/new"),
            ),
            Status.BAD_ARGUMENT,
        ),
        # Options nested deep enough to fail being sent back in stat, list or
        # a snapshot are refused when the tensor is created.
        (
            lambda h: _frame(
                Op.CREATE,
                b'{"name":"fz/new","dtype":"float32","shape":[2],"shard_size":4096,'
                b'"options":{"x":' + b"[" * 40 + b"]" * 40 + b"}}",
                key=tensor_key("fz/new"),
            ),
            Status.BAD_ARGUMENT,
        ),
        # An error message quoting a lone surrogate from the request could not
        # be encoded: UnicodeEncodeError instead of the answer.
        (
            lambda h: _frame(
                Op.CREATE,
                b'{"name":"fz/new","dtype":"float32","shape":[2],"shard_size":"\\ud800"}',
                key=tensor_key("fz/new"),
            ),
            Status.BAD_ARGUMENT,
        ),
    ],
    ids=[
        "attach-mid-connection",
        "json-depth",
        "huge-worker-timeout",
        "deep-options",
        "surrogate-in-error-message",
    ],
)
def test_regressions_answered_with_a_status(harnesses: list[Harness], make, status) -> None:
    harness = harnesses[0]
    outcome = trio.run(_serve, harness, make(harness), False)
    assert not outcome.problems, outcome.problems
    assert [r.status for r in outcome.replies] == [status]


@pytest.mark.timeout(60)
def test_one_copy_daemons_refuse_replication_messages(harnesses: list[Harness]) -> None:
    """With replicas = 1 no daemon replicates: such messages were taken before.

    A forged heartbeat made "n2" look up, so a SYNC naming n2 as sender
    passed the sender check and re-created (zeroed) a tensor of the same name
    before being refused; a sync request queued shards nobody delivers and
    waited forever.
    """
    harness = harnesses[0]
    f32 = harness.names["f32"]
    ping = _frame(Op.PING, encode_json({"node": OTHER, "ready": True}))
    held_by_other = next(k for k in range(1, 10_000) if harness.config.holds(OTHER, k, 0))
    meta = TensorMeta(f32.name, "float32", (10,), 4096)
    body = encode_json({"meta": meta.to_dict()})
    sync = _frame(Op.SYNC, body + bytes(40), key=held_by_other, offset=len(body), size=40, worker=1)
    request = _frame(Op.SYNC_REQUEST, encode_json({"node": OTHER, "shards": [[f32.key, 0]]}))
    replica = _frame(Op.WRITE, bytes(16), key=f32.key, size=16, flags=Flag.REPLICA, worker=1)
    catchup = _frame(Op.CATCHUP, encode_json({"node": OTHER}))
    outcome = trio.run(_serve, harness, ping + sync + request + replica + catchup, False)
    assert not outcome.problems, outcome.problems
    assert [r.status for r in outcome.replies] == [Status.BAD_OP] * 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "op, body",
    [
        # A node "name" that is a list or an object raised TypeError (unhashable).
        (Op.PING, {"node": [], "ready": True}),
        (Op.CATCHUP, {"node": {}}),
        (Op.SYNC_REQUEST, {"node": [], "shards": []}),
        # int() of an infinite float (JSON 1e400) raised OverflowError.
        (Op.SYNC_REQUEST, {"node": OTHER, "shards": [[float("inf"), 0]]}),
    ],
    ids=["ping-list", "catchup-object", "sync-request-list", "sync-request-inf"],
)
def test_replication_bodies_of_the_wrong_shape_are_refused(
    harnesses: list[Harness], op: Op, body: dict
) -> None:
    outcome = trio.run(_serve, harnesses[1], _frame(op, encode_json(body)), False)
    assert not outcome.problems, outcome.problems
    assert [r.status for r in outcome.replies] == [Status.BAD_ARGUMENT]


@pytest.mark.timeout(60)
def test_a_shard_copy_is_checked_before_it_changes_anything(harnesses: list[Harness]) -> None:
    """Replicated: a copy from n2 must be for the shard its header names, and fit it.

    A copy whose metadata named another tensor was installed into that one
    (bypassing the sender check, which is made for the header's shard); a
    copy for a shard not placed here re-created the tensor before being refused.
    """
    harness = harnesses[1]
    backup, f32 = harness.names["backup"], harness.names["f32"]

    def sync(meta: TensorMeta, key: int, shard: int = 0, nbytes: int = 400) -> bytes:
        body = encode_json({"meta": meta.to_dict()})
        return _frame(
            Op.SYNC,
            body + bytes(nbytes),
            key=key,
            shard=shard,
            offset=len(body),
            size=nbytes,
            version=1,
            worker=1,
        )

    reshaped = TensorMeta(f32.name, "float32", (100,), 4096)
    wide = TensorMeta(backup.name, "float32", (100 * 1024,), 400)  # 1024 shards
    other_shard = next(
        i
        for i in range(1, wide.num_shards)
        if harness.config.holds(OTHER, backup.key, i)
        and not harness.config.holds("n1", backup.key, i)
    )
    streams = [
        sync(reshaped, backup.key),  # n2 may send backup's shard, not f32's
        sync(wide, backup.key, other_shard),  # not placed here
        sync(backup, backup.key, 0, 16),  # the wrong size
        # Metadata that is not JSON raised ProtocolError out of the handler.
        _frame(Op.SYNC, b"{not json" + bytes(8), key=backup.key, offset=9, size=8, worker=1),
    ]
    for stream in streams:
        outcome = trio.run(_serve, harness, stream, False)
        assert not outcome.problems, outcome.problems
        assert [r.status for r in outcome.replies] in (
            [Status.BAD_ARGUMENT],
            [Status.NOT_OWNER],
        ), outcome.replies
        assert not outcome.changed
    good = trio.run(_serve, harness, sync(backup, backup.key), False)
    assert not good.problems and good.changed and good.replies[0].status == Status.OK


# -- real daemons over TCP and the shm unix socket -------------------------------------

PROTECTED = {
    "fuzz/protected/w": np.arange(40_000, dtype=np.float32),  # 160 KB: every daemon
    "fuzz/protected/u8": np.arange(5000, dtype=np.uint8),
    "fuzz/protected/i64": np.arange(64, dtype=np.int64) - 7,
}
SCRATCH = ["fuzz/scratch/a", "fuzz/scratch/b"]


@pytest.fixture(scope="module")
def protected(cluster: Cluster) -> Iterator[Client]:
    c = Client(cluster.config_path)
    try:
        for name, x in PROTECTED.items():
            c.write(name, x)
        for name in SCRATCH:
            c.write(name, np.zeros(3000, np.float32))
        yield c
    finally:
        c.close()


def _state(c: Client) -> dict[str, tuple[bytes, int]]:
    return {name: (c.read(name).tobytes(), c.stat(name).version) for name in PROTECTED}


async def _exchange(cluster: Cluster, node: str, stream: bytes, shm: bool) -> bytes:
    """Send ``stream`` on a fresh connection, end it, and read until the daemon closes."""
    if shm:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with short_address(socket_path(cluster.config.node(node).data_dir)) as address:
            await sock.connect(address)
        staging = make_staging(1 << 20)
        try:
            body = encode_json({"staging": 1 << 20})
            await send_fds_frame(
                sock, Header(op=Op.ATTACH, length=len(body)).pack() + body, [staging]
            )
            header, _, fds = await recv_fds_frame(sock)
        finally:
            os.close(staging)
        for fd in fds:
            os.close(fd)
        assert header.status == Status.OK
    else:
        a = cluster.config.node(node).address
        sock = trio.socket.socket()
        await sock.connect((a.host, a.port))
    received = bytearray()

    async def receive() -> None:
        while True:
            try:
                chunk = await sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            received.extend(chunk)

    with sock:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            try:
                await _send(sock, stream)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the daemon closed first (garbage, another version, too large)
    return bytes(received)


async def _send(sock: trio.socket.SocketType, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[await sock.send(view) :]


async def _fuzz_real(cluster: Cluster, node: str, stream: bytes, shm: bool) -> list[str]:
    """The stream to one daemon, then HELLO to every daemon; the problems found."""
    out = Outcome()
    with trio.fail_after(20):  # a daemon that hangs fails here
        raw = await _exchange(cluster, node, stream, shm)
        check_replies(raw, out)
        for name in cluster.names:
            hello = await _exchange(cluster, name, Header(op=Op.HELLO).pack(), False)
            if len(hello) < HEADER_SIZE or unpack_header(hello[:HEADER_SIZE]).status != Status.OK:
                out.problems.append(f"{name} does not answer HELLO")
    return out.problems


def _real_streams(cluster: Cluster) -> st.SearchStrategy[tuple[bytes, str, bool]]:
    keys = [tensor_key(n) for n in [*PROTECTED, *SCRATCH]]
    names = [*PROTECTED, *SCRATCH]
    return st.tuples(streams(keys, [0, 1], names), st.sampled_from(cluster.names), st.booleans())


def _assert_intact(cluster: Cluster, c: Client, before: dict) -> None:
    assert _state(c) == before, "a request that was not accepted changed a protected tensor"
    for name in cluster.names:
        assert "internal error" not in cluster.log(name), cluster.log(name)[-3000:]


def _protect(stream: bytes) -> bytes:
    """Point every mutating frame of a generated stream at a scratch tensor.

    A valid update may change what it names; protected tensors must change
    only through accepted requests, and the generated ones are not allowed to.
    """
    out = bytearray(stream)
    protected = {tensor_key(n).to_bytes(8, "little") for n in PROTECTED}
    scratch = tensor_key(SCRATCH[0]).to_bytes(8, "little")
    for k in protected:  # in headers, batch entries, anywhere: only reads are spared
        start = 0
        while (i := out.find(k, start)) >= 0:
            head = out.rfind(MAGIC, 0, i)
            op = out[head + 5] if head >= 0 and head + 5 < len(out) else 0
            if op not in (Op.READ, Op.READ_BATCH, Op.STAT, Op.RELEASE):
                out[i : i + 8] = scratch
            start = i + 8
    return bytes(out)


@pytest.mark.timeout(120)
@settings(SETTINGS, max_examples=100)
@given(data=st.data())
def test_real_daemons_survive_generated_frames(
    cluster: Cluster, protected: Client, data: st.DataObject
) -> None:
    stream, node, shm = data.draw(_real_streams(cluster))
    before = _state(protected)
    problems = trio.run(_fuzz_real, cluster, node, _protect(stream), shm)
    assert not problems, problems
    _assert_intact(cluster, protected, before)


# Each makes a valid update of a protected tensor invalid in one way.
BREAKERS = {
    "dtype": lambda m, f: f | {"dtype": 12 if m.dtype != "float64" else 11},
    "offset": lambda m, f: f | {"offset": m.shard_span(f["shard"])[1] + 8},
    "shard": lambda m, f: f | {"shard": m.num_shards},
    "layout": lambda m, f: f | {"layout": m.layout ^ 2},
    "size": lambda m, f: f | {"size": f["size"] + 1},
    "alpha": lambda m, f: f | {"op": Op.ACCUMULATE, "alpha": float("nan")},
    "staged-on-tcp": lambda m, f: f | {"flags": Flag.STAGED},
    "replica": lambda m, f: f | {"flags": Flag.REPLICA, "worker": 1},
    "payload": lambda m, f: f | {"length": f["length"] + 1_000_000},  # cut short by EOF
}


@pytest.mark.timeout(120)
@settings(SETTINGS, max_examples=60)
@given(
    name=st.sampled_from(sorted(PROTECTED)),
    breaker=st.sampled_from(sorted(BREAKERS)),
    op=st.sampled_from([Op.WRITE, Op.ACCUMULATE]),
    shm=st.booleans(),
    fill=st.integers(1, 255),
)
def test_rejected_updates_to_protected_tensors_change_nothing(
    cluster: Cluster, protected: Client, name: str, breaker: str, op: Op, shm: bool, fill: int
) -> None:
    meta = protected.stat(name)
    tm = TensorMeta(name, meta.dtype, meta.shape, meta.shard_size)
    shard = 0
    n = min(64, tm.shard_span(shard)[1])
    fields = {"op": op, "key": tm.key, "shard": shard, "size": n, "length": n, "dtype": 0}
    fields = BREAKERS[breaker](tm, fields)
    node = cluster.config.primary_for(tm.key, shard).name
    stream = Header(**fields).pack() + bytes([fill]) * n
    before = _state(protected)
    problems = trio.run(_fuzz_real, cluster, node, stream, shm)
    assert not problems, problems
    _assert_intact(cluster, protected, before)


@pytest.mark.timeout(60)
def test_a_batch_with_inconsistent_entries_changes_nothing(
    cluster: Cluster, protected: Client
) -> None:
    key = tensor_key("fuzz/protected/w")
    node = cluster.config.primary_for(key, 0).name
    entries = [BatchEntry(key, 0, 0, 16), BatchEntry(key, 0, 16, 16)]
    cases = [
        (3, entries, 32),  # one entry more than the payload holds
        (2, entries, 20),  # entry lengths do not add up to the payload
        (2, entries, 10**6),  # cut short by the end of the stream
        (1 << 20, entries, 32),  # a count far past the payload
    ]
    before = _state(protected)
    for count, es, data_len in cases:
        head = pack_entries(es)
        frame = Header(op=Op.WRITE_BATCH, shard=count, length=len(head) + data_len).pack()
        stream = frame + head + b"\x07" * min(data_len, 32)
        problems = trio.run(_fuzz_real, cluster, node, stream, False)
        assert not problems, problems
    _assert_intact(cluster, protected, before)
