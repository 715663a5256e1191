"""The rdma transport's parts that need no device, and its fallback on a host without one.

Real verbs run in tests/rdma (inside a soft-RoCE guest); these run anywhere.
"""

from __future__ import annotations

import logging
import resource
import socket
from pathlib import Path

import numpy as np
import pytest
from irdma_psd.rdma import STAGING_MAX, ConnectRequest

from irdma import Client
from irdma.protocol import HEADER_SIZE, Header, Op, Status, decode_json, encode_json, unpack_header
from irdma.transport import verbs
from irdma.transport.verbs import (
    GidEntry,
    NoDevice,
    QpInfo,
    VerbsError,
    find_gid,
    gid_table,
    ipv4_of,
    memlock_problem,
    roce_gid,
)

from .helpers.cluster import Cluster, make_cluster
from .helpers.wire import recv_exactly

GID1 = "0000:0000:0000:0000:0000:ffff:c612:0001"  # 198.18.0.1


def fake_sysfs(root: Path, device: str, gids: list[tuple[str, str, str]]) -> Path:
    """A /sys/class/infiniband tree: one port with GIDs (gid, type, netdev) at indexes 0..n."""
    port = root / device / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    for i, (gid, kind, netdev) in enumerate(gids):
        (port / "gids" / str(i)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")
        (port / "gid_attrs" / "ndevs" / str(i)).write_text(netdev + "\n")
    # An empty slot, as real tables have.
    (port / "gids" / str(len(gids))).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    return root


def rxe_sysfs(tmp_path: Path) -> Path:
    return fake_sysfs(
        tmp_path / "ib",
        "rxe0",
        [
            ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1", "rxe_if"),
            ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "RoCE v2", "rxe_if"),
            ("0000:0000:0000:0000:0000:ffff:c612:0001", "IB/RoCE v1", "rxe_if"),
            (GID1, "RoCE v2", "rxe_if"),
        ],
    )


def test_roce_gid_and_back() -> None:
    assert roce_gid("198.18.0.1") == GID1
    assert ipv4_of(GID1) == "198.18.0.1"
    with pytest.raises(ValueError, match="not an IPv4-mapped"):
        ipv4_of("fe80:0000:0000:0000:0000:00ff:fe00:0001")
    with pytest.raises(ValueError):
        roce_gid("::1")


def test_gid_table_reads_sysfs(tmp_path: Path) -> None:
    table = gid_table(rxe_sysfs(tmp_path))
    assert len(table) == 4  # the empty slot is left out
    assert table[3] == GidEntry("rxe0", 1, 3, GID1, "RoCE v2", "rxe_if")


def test_find_gid_takes_the_roce_v2_ipv4_gid(tmp_path: Path) -> None:
    sysfs = rxe_sysfs(tmp_path)
    assert find_gid("198.18.0.1", sysfs).index == 3
    assert find_gid("198.18.0.1", sysfs, index=3).index == 3


def test_find_gid_explains_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(NoDevice, match="no RDMA device on this host"):
        find_gid("198.18.0.1", tmp_path / "absent")
    sysfs = rxe_sysfs(tmp_path)
    with pytest.raises(NoDevice, match=r"no RDMA device has a RoCE v2 GID for 10\.0\.0\.1") as ei:
        find_gid("10.0.0.1", sysfs)
    assert "rxe0:1[3]" in str(ei.value)  # lists what there is
    with pytest.raises(NoDevice, match="not an IPv4 address"):
        find_gid("::1", sysfs)


@pytest.mark.parametrize("index", [0, 1, 2, 9])
def test_a_wrong_gid_index_says_which_one_to_use(tmp_path: Path, index: int) -> None:
    with pytest.raises(VerbsError, match=f"rdma_gid_index {index} on rxe0 is .*use index 3"):
        find_gid("198.18.0.1", rxe_sysfs(tmp_path), index=index)


def test_qp_info_validation() -> None:
    info = QpInfo(17, 5, GID1)
    assert QpInfo.from_json(info.to_json()) == info
    for bad in (
        None,
        {"qpn": 17, "psn": 5},
        {"qpn": 0, "psn": 5, "gid": GID1},
        {"qpn": 17, "psn": 1 << 24, "gid": GID1},
        {"qpn": 17, "psn": 5, "gid": "fe80::1"},
        {"qpn": "x", "psn": 5, "gid": GID1},
    ):
        with pytest.raises(ValueError):
            QpInfo.from_json(bad)


def test_connect_request_validation() -> None:
    good = {"qp": QpInfo(17, 5, GID1).to_json(), "mtu": 4096, "staging": 8 << 20}
    assert ConnectRequest.parse(good).staging == 8 << 20
    for change, problem in (
        ({"mtu": 9000}, "mtu 9000"),
        ({"staging": STAGING_MAX + 1}, "outside"),
        ({"staging": 0}, "outside"),
        ({"staging": "lots"}, "integer"),
        ({"qp": {"qpn": 1}}, "qpn, psn and gid"),
    ):
        with pytest.raises(ValueError, match=problem):
            ConnectRequest.parse(good | change)
    with pytest.raises(ValueError, match="JSON object"):
        ConnectRequest.parse([1, 2])


def test_memlock_problem_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (64 << 10, 64 << 10))
    monkeypatch.setattr(verbs, "_has_cap_ipc_lock", lambda: False)
    problem = memlock_problem(1 << 30)
    assert problem is not None
    assert "LimitMEMLOCK=infinity" in problem and "ulimit -l unlimited" in problem
    assert memlock_problem(4096) is None
    monkeypatch.setattr(verbs, "_has_cap_ipc_lock", lambda: True)
    assert memlock_problem(1 << 30) is None  # the limit does not bind CAP_IPC_LOCK
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY,) * 2)
    monkeypatch.setattr(verbs, "_has_cap_ipc_lock", lambda: False)
    assert memlock_problem(1 << 40) is None


@pytest.fixture(scope="module")
def rdma_address_cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Daemons with rdma:// addresses on a host without RDMA."""
    cluster = make_cluster(tmp_path_factory.mktemp("rdma-fallback"), 2, scheme="rdma")
    try:
        yield cluster
    finally:
        cluster.close()


def test_rdma_address_without_a_device_falls_back_to_tcp_with_one_warning(
    rdma_address_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    x = np.arange(50_000, dtype=np.float32)
    with (
        caplog.at_level(logging.WARNING, logger="irdma"),
        Client(rdma_address_cluster.config_path) as c,
    ):
        c.write("fallback/x", x, replace=True)
        assert np.array_equal(c.read("fallback/x"), x)
        transports = {c.async_client.transport_of(n) for n in c.config.nodes}
    # rdma:// means "not shm": same-host clients take TCP when RDMA cannot be had.
    assert transports <= {"tcp", None} and "tcp" in transports
    warnings = [r.getMessage() for r in caplog.records if "RDMA not used" in r.getMessage()]
    assert warnings and all("no RDMA device" in w for w in warnings), warnings
    # One line per connection, not per request.
    assert len(warnings) <= len(rdma_address_cluster.names)
    for name in rdma_address_cluster.names:
        assert "no RDMA, serving TCP and shm only" in rdma_address_cluster.log(name)


def test_daemon_without_rdma_refuses_rdma_connect(rdma_address_cluster: Cluster) -> None:
    node = rdma_address_cluster.config.nodes[0]
    body = encode_json({"qp": QpInfo(17, 5, GID1).to_json(), "mtu": 4096, "staging": 1 << 20})
    with socket.create_connection((node.address.host, node.address.port), 5.0) as s:
        s.sendall(Header(op=Op.RDMA_CONNECT, length=len(body)).pack() + body)
        header = unpack_header(recv_exactly(s, HEADER_SIZE))
        message = recv_exactly(s, header.length)
        assert header.status == Status.BAD_OP
        assert b"serves no RDMA" in message
        # The connection still serves.
        s.sendall(Header(op=Op.HELLO).pack())
        header = unpack_header(recv_exactly(s, HEADER_SIZE))
        assert decode_json(recv_exactly(s, header.length))["node"] == node.name
