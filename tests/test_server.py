"""psd's frame handling, driven with raw sockets: malformed and hostile input.

Every case checks that the daemon keeps serving and that no stored tensor
changed (a canary tensor is read back byte for byte).
"""

from __future__ import annotations

import errno
import socket
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from irdma import Client
from irdma.protocol import (
    ENTRY_SIZE,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    PROTOCOL_VERSION,
    BatchEntry,
    Flag,
    Header,
    Op,
    Status,
    TensorMeta,
    encode_json,
    pack_entries,
    tensor_key,
    unpack_entries,
)

from .helpers.cluster import Cluster
from .helpers.wire import hello, recv_frame

CANARY = "canary/w"
VICTIM = "fuzz/victim"  # random frames may change this one; never the canary


@pytest.fixture(scope="module")
def canary(cluster: Cluster) -> np.ndarray:
    x = np.arange(40_000, dtype=np.float32)  # 160 KB: on several daemons
    with Client(cluster.config_path) as c:
        c.write(CANARY, x)
        c.write(VICTIM, x)
    return x


def assert_intact(cluster: Cluster, canary: np.ndarray) -> None:
    with Client(cluster.config_path) as c:
        assert np.array_equal(c.read(CANARY), canary), "a rejected request changed data"
        for name in cluster.names:
            c.hello(cluster.config.node(name))  # every daemon still answers


_opened: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets():
    """Every raw socket a test opens is closed after it, pass or fail."""
    try:
        yield
    finally:
        for s in _opened:
            s.close()
        _opened.clear()


def connect(cluster: Cluster, node: str) -> socket.socket:
    a = cluster.config.node(node).address
    s = socket.create_connection((a.host, a.port), timeout=5)
    _opened.append(s)
    return s


def closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def canary_shard0(cluster: Cluster) -> tuple[str, int]:
    key = tensor_key(CANARY)
    return cluster.config.primary_for(key, 0).name, key


def test_garbage_closes_the_connection_only(cluster: Cluster, canary: np.ndarray) -> None:
    s = connect(cluster, "n1")
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 100)
    assert closed_by_peer(s)
    s.close()
    assert_intact(cluster, canary)


def test_wrong_protocol_version(cluster: Cluster, canary: np.ndarray) -> None:
    s = connect(cluster, "n1")
    s.sendall(Header(op=Op.HELLO, proto=PROTOCOL_VERSION + 7).pack())
    h, msg = recv_frame(s)
    assert h.status == Status.BAD_VERSION and b"protocol version" in msg
    assert closed_by_peer(s)
    assert_intact(cluster, canary)


def test_unknown_op_keeps_the_connection(cluster: Cluster, canary: np.ndarray) -> None:
    s = connect(cluster, "n1")
    s.sendall(Header(op=200, request_id=5, length=10).pack() + b"x" * 10)
    h, msg = recv_frame(s)
    assert (h.status, h.request_id) == (Status.BAD_OP, 5) and b"unknown op" in msg
    s.sendall(Header(op=Op.HELLO, request_id=6).pack())
    h, _ = recv_frame(s)
    assert (h.status, h.request_id) == (Status.OK, 6)
    assert_intact(cluster, canary)


def test_oversized_payload(cluster: Cluster, canary: np.ndarray) -> None:
    s = connect(cluster, "n1")
    s.sendall(Header(op=Op.WRITE, length=1 << 62, size=1 << 62).pack())
    h, _ = recv_frame(s)
    assert h.status == Status.TOO_LARGE
    assert closed_by_peer(s)
    assert_intact(cluster, canary)


def test_response_flag_in_a_request(cluster: Cluster, canary: np.ndarray) -> None:
    s = connect(cluster, "n1")
    s.sendall(Header(op=Op.HELLO, flags=Flag.RESPONSE).pack())
    h, _ = recv_frame(s)
    assert h.status == Status.BAD_FRAME
    assert_intact(cluster, canary)


@pytest.mark.parametrize(
    "change,status",
    [
        ({"shard": 10_000}, Status.OUT_OF_RANGE),
        ({"offset": 1 << 40}, Status.OUT_OF_RANGE),
        ({"size": 1 << 40}, Status.OUT_OF_RANGE),
        ({"offset": (1 << 64) - 1, "size": 2}, Status.OUT_OF_RANGE),
        ({"key": 12345}, Status.NOT_FOUND),
        ({"dtype": 12}, Status.DTYPE_MISMATCH),  # float64, the canary is float32
        ({"layout": 77}, Status.STALE_LAYOUT),
    ],
)
def test_bad_read_fields(cluster: Cluster, canary: np.ndarray, change, status) -> None:
    node, key = canary_shard0(cluster)
    s = connect(cluster, node)
    fields = {"op": Op.READ, "key": key, "shard": 0, "offset": 0, "size": 16} | change
    s.sendall(Header(**fields).pack())
    h, msg = recv_frame(s)
    assert h.status == status, msg
    s.sendall(Header(op=Op.READ, key=key, shard=0, size=16).pack())  # still serving us
    h, data = recv_frame(s)
    assert h.status == Status.OK and data == canary[:4].tobytes()
    assert_intact(cluster, canary)


@pytest.mark.parametrize(
    "op,change,status",
    [
        (Op.WRITE, {"shard": 10_000}, Status.OUT_OF_RANGE),
        (Op.WRITE, {"offset": 70_000}, Status.OUT_OF_RANGE),
        (Op.WRITE, {"dtype": 3}, Status.DTYPE_MISMATCH),
        (Op.ACCUMULATE, {"offset": 2}, Status.BAD_ARGUMENT),  # not element aligned
        (Op.ACCUMULATE, {"alpha": float("nan")}, Status.BAD_ARGUMENT),
        (Op.ACCUMULATE, {"alpha": float("inf")}, Status.BAD_ARGUMENT),
        (Op.WRITE, {"size": 8}, Status.BAD_FRAME),  # size and payload disagree
        (Op.WRITE, {"key": 99}, Status.NOT_FOUND),
    ],
)
def test_bad_updates_change_nothing(cluster: Cluster, canary: np.ndarray, op, change, status):
    node, key = canary_shard0(cluster)
    s = connect(cluster, node)
    payload = b"\xff" * 16
    fields = {"op": op, "key": key, "size": 16, "length": 16} | change
    s.sendall(Header(**fields).pack() + payload)
    h, msg = recv_frame(s)
    assert h.status == status, msg
    s.sendall(Header(op=Op.HELLO, request_id=9).pack())
    assert recv_frame(s)[0].request_id == 9  # the refused payload was drained
    assert_intact(cluster, canary)


def test_truncated_write_changes_nothing(cluster: Cluster, canary: np.ndarray) -> None:
    node, key = canary_shard0(cluster)
    s = connect(cluster, node)
    n = 64 << 10
    s.sendall(Header(op=Op.WRITE, key=key, size=n, length=n).pack() + b"\xee" * (n // 2))
    s.close()  # half a shard, then gone
    assert_intact(cluster, canary)


def test_truncated_batch_changes_nothing(cluster: Cluster, canary: np.ndarray) -> None:
    node, key = canary_shard0(cluster)
    before = hello(cluster.config, node)["arena_used"]
    entries = [BatchEntry(key, 0, 0, 16), BatchEntry(key, 0, 16, 16)]
    s = connect(cluster, node)
    s.sendall(
        Header(op=Op.ACCUMULATE_BATCH, shard=2, length=2 * ENTRY_SIZE + 32).pack()
        + pack_entries(entries)
        + b"\x01" * 20
    )
    # Both entries have taken arena room (the first is whole, the second half in)
    # when the connection goes: the daemon must give both back.
    s.close()
    assert_intact(cluster, canary)
    assert_arena_returns_to(cluster, node, before)


def assert_arena_returns_to(cluster: Cluster, node: str, used: int) -> None:
    """The daemon's arena is back at ``used`` bytes once it has seen the connection
    close (it handles that in the connection's own task: wait for it, boundedly)."""
    deadline = time.monotonic() + 10
    while (now := hello(cluster.config, node)["arena_used"]) != used:
        assert time.monotonic() < deadline, f"arena at {now} bytes, not {used}: blocks leaked"
        time.sleep(0.02)


def test_batch_lengths_that_do_not_add_up(cluster: Cluster, canary: np.ndarray) -> None:
    node, key = canary_shard0(cluster)
    s = connect(cluster, node)
    entries = pack_entries([BatchEntry(key, 0, 0, 1000)])
    s.sendall(
        Header(op=Op.WRITE_BATCH, shard=1, length=len(entries) + 8).pack() + entries + b"\0" * 8
    )
    h, msg = recv_frame(s)
    assert h.status == Status.BAD_FRAME, msg
    s.sendall(Header(op=Op.READ_BATCH, shard=1000, length=ENTRY_SIZE).pack() + entries)
    h, msg = recv_frame(s)
    assert h.status == Status.BAD_FRAME, msg
    assert_intact(cluster, canary)


def test_batch_reports_each_entry(cluster: Cluster, canary: np.ndarray) -> None:
    node, key = canary_shard0(cluster)
    s = connect(cluster, node)
    entries = [BatchEntry(key, 0, 0, 8), BatchEntry(1, 0, 0, 8), BatchEntry(key, 0, 1 << 30, 8)]
    s.sendall(
        Header(op=Op.READ_BATCH, shard=3, length=3 * ENTRY_SIZE).pack() + pack_entries(entries)
    )
    h, data = recv_frame(s)
    assert h.status == Status.OK
    answers = unpack_entries(data, 3)
    assert [a.status for a in answers] == [Status.OK, Status.NOT_FOUND, Status.OUT_OF_RANGE]
    assert data[3 * ENTRY_SIZE :] == canary[:2].tobytes()


def test_bad_create_metadata(cluster: Cluster, canary: np.ndarray) -> None:
    s = connect(cluster, "n1")
    cases = [
        b"not json",
        encode_json([1, 2]),
        encode_json({"name": "x", "dtype": "float32", "shape": [-1], "shard_size": 4096}),
        encode_json({"name": "x", "dtype": "object", "shape": [1], "shard_size": 4096}),
        encode_json({"name": "../x", "dtype": "float32", "shape": [1], "shard_size": 4096}),
        encode_json({"name": "x", "dtype": "float32", "shape": [1], "shard_size": 3}),
    ]
    for body in cases:
        s.sendall(Header(op=Op.CREATE, key=tensor_key("x"), length=len(body)).pack() + body)
        h, msg = recv_frame(s)
        assert h.status == Status.BAD_ARGUMENT, (body, msg)
    meta = TensorMeta("y", "float32", (4,), 4096)
    body = encode_json(meta.to_dict())
    s.sendall(Header(op=Op.CREATE, key=tensor_key("other"), length=len(body)).pack() + body)
    assert recv_frame(s)[0].status == Status.BAD_ARGUMENT  # key does not match the name
    assert_intact(cluster, canary)


def test_list_prefix_must_be_utf8(cluster: Cluster, canary: np.ndarray) -> None:
    s = connect(cluster, "n1")
    s.sendall(Header(op=Op.LIST, length=2).pack() + b"\xff\xfe")
    assert recv_frame(s)[0].status == Status.BAD_ARGUMENT
    assert_intact(cluster, canary)


frame_fields = st.fixed_dictionaries(
    {
        "op": st.integers(0, 255),
        "flags": st.integers(0, 0xFFFF),
        "status": st.integers(0, 0xFFFF),
        "dtype": st.integers(0, 20),
        "shard": st.integers(0, 2**32 - 1),
        "request_id": st.integers(0, 2**64 - 1),
        "offset": st.one_of(st.integers(0, 1 << 20), st.integers(0, 2**64 - 1)),
        "size": st.one_of(st.integers(0, 1 << 20), st.integers(0, 2**64 - 1)),
        "version": st.integers(0, 2**64 - 1),
        "alpha": st.floats(allow_nan=True, allow_infinity=True),
        "layout": st.integers(0, 2**64 - 1),
        "worker": st.one_of(st.integers(0, 8), st.integers(0, 2**32 - 1)),
        "step": st.one_of(st.integers(0, 8), st.integers(0, 2**64 - 1)),
        "txn": st.one_of(st.just(0), st.integers(0, 2**64 - 1)),
        "wire": st.one_of(st.just(0), st.sampled_from([10, 11, 15]), st.integers(0, 2**16 - 1)),
        "stamp": st.one_of(st.just(0), st.just(1), st.integers(0, 2**64 - 1)),
    }
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fields=frame_fields, use_key=st.booleans(), payload=st.binary(max_size=600))
def test_random_frames_never_hurt(cluster, canary, fields, use_key, payload) -> None:
    """Hypothesis-made frames with real magic and version: answered or closed, never a crash."""
    node, key = canary_shard0(cluster)
    if fields["op"] in (
        Op.WRITE,
        Op.ACCUMULATE,
        Op.WRITE_BATCH,
        Op.ACCUMULATE_BATCH,
        Op.CREATE,
        Op.DELETE,
    ):
        key = tensor_key(VICTIM)  # a valid update may change it; the canary must not
    raw = HEADER.pack(
        MAGIC,
        PROTOCOL_VERSION,
        fields["op"],
        fields["flags"],
        fields["status"],
        fields["dtype"],
        fields["shard"],
        fields["request_id"],
        key if use_key else fields["layout"],
        fields["offset"],
        fields["size"],
        len(payload),
        fields["version"],
        fields["alpha"],
        fields["layout"],
        fields["worker"],
        fields["wire"],
        0,
        fields["step"],
        fields["txn"],
        fields["stamp"],
    )
    s = connect(cluster, node)
    try:
        s.sendall(raw + payload)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(5)
        while s.recv(65536):
            pass
    except OSError as exc:
        # The daemon may close at once on a frame it cannot trust.
        if exc.errno not in (errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN):
            raise
    finally:
        s.close()
    assert_intact(cluster, canary)


def test_release_of_unknown_id_is_harmless(cluster: Cluster, canary: np.ndarray) -> None:
    s = connect(cluster, "n1")
    s.sendall(b"".join(Header(op=Op.RELEASE, request_id=i).pack() for i in range(100)))
    s.sendall(Header(op=Op.HELLO, request_id=1).pack())
    assert recv_frame(s)[0].status == Status.OK
    assert_intact(cluster, canary)


def test_header_struct_is_what_the_daemon_parses(cluster: Cluster) -> None:
    s = connect(cluster, "n2")
    s.sendall(Header(op=Op.HELLO, request_id=0xDEADBEEF).pack())
    h, data = recv_frame(s)
    assert h.request_id == 0xDEADBEEF and h.is_response and b'"node":"n2"' in data
    assert struct.calcsize("<4sBBHHHIQQQQQQdQIIQQQ") == HEADER_SIZE
