"""A daemon's Prometheus endpoint, scraped over HTTP and parsed with prometheus_client's parser."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from irdma_psd.metrics_http import BadRequest, Request, parse_request, respond
from prometheus_client.parser import text_string_to_metric_families

from irdma import Client
from irdma.cli.local import free_ports
from irdma.cluster import load_config, parse_config
from irdma.errors import ConfigError
from irdma.protocol import HEADER_SIZE, Header, Op, Status, tensor_key, unpack_header

from .helpers.cluster import Cluster
from .helpers.wire import recv_exactly

pytestmark = pytest.mark.timeout(60)

Samples = dict[tuple[str, frozenset], float]


def write_config(
    directory: Path, *, nodes: int = 1, replicas: int = 1, metrics_port: int | None = None
) -> Path:
    """Daemons (1 MiB shards, snapshots every 1 s), each with metrics on a free loopback port.

    ``metrics_port`` sets the first daemon's metrics port.
    """
    ports = free_ports("127.0.0.1", 2 * nodes)
    if metrics_port is not None:
        ports[1] = metrics_port
    directory.mkdir(parents=True, exist_ok=True)
    text = f'shard_size = "1MiB"\nsnapshot_interval = 1\nreplicas = {replicas}\n'
    for i in range(nodes):
        name = f"n{i + 1}"
        text += (
            f'\n[[nodes]]\nname = "{name}"\naddress = "tcp://127.0.0.1:{ports[2 * i]}"\n'
            f'data_dir = "{directory / name}"\narena_size = "32MiB"\n'
            f'metrics_address = "127.0.0.1:{ports[2 * i + 1]}"\n'
        )
    path = directory / "cluster.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("metrics")
    path = write_config(directory)
    cluster = Cluster(directory, path, load_config(path))
    try:
        cluster.start("n1")
        yield cluster
    finally:
        cluster.close()


def url(cluster: Cluster, path: str = "/metrics", node: str = "n1") -> str:
    addr = cluster.config.node(node).metrics_address
    assert addr is not None
    return f"http://{addr.host}:{addr.port}{path}"


def scrape(cluster: Cluster, node: str = "n1") -> Samples:
    """Every sample of one scrape of ``node``, keyed by (name, labels)."""
    with urllib.request.urlopen(url(cluster, node=node), timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_writes_and_reads_move_the_request_and_byte_counters(daemon: Cluster) -> None:
    small = np.arange(4096, dtype=np.float32)  # 16 KiB: inline on the socket both ways
    big = np.arange(128 << 10, dtype=np.float32)  # 512 KiB: sent with sendfile
    with Client(daemon.config_path, transport="tcp") as c:
        c.create("m/small", small.shape, small.dtype)
        c.create("m/big", big.shape, big.dtype)
        before = scrape(daemon)
        c.write("m/small", small)
        c.write("m/big", big)
        assert np.array_equal(c.read("m/small"), small)
        assert np.array_equal(c.read("m/big"), big)
    after = scrape(daemon)
    tcp_write = {"op": "write", "transport": "tcp"}
    tcp_read = {"op": "read", "transport": "tcp"}
    assert delta(before, after, "irdma_requests_total", **tcp_write) == 2
    assert (
        delta(before, after, "irdma_request_bytes_total", **tcp_write) == small.nbytes + big.nbytes
    )
    assert delta(before, after, "irdma_response_bytes_total", **tcp_write) == 0
    assert delta(before, after, "irdma_requests_total", **tcp_read) == 2
    assert delta(before, after, "irdma_request_bytes_total", **tcp_read) == 0
    assert (
        delta(before, after, "irdma_response_bytes_total", **tcp_read) == small.nbytes + big.nbytes
    )
    # One latency observation per request, in a bucket and in the sum.
    assert delta(before, after, "irdma_request_duration_seconds_count", **tcp_write) == 2
    assert delta(before, after, "irdma_request_duration_seconds_bucket", le="+Inf", **tcp_read) == 2
    assert delta(before, after, "irdma_request_duration_seconds_sum", **tcp_read) > 0


def test_shm_traffic_is_labelled_shm_and_counts_staged_and_mapped_bytes(
    daemon: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = np.arange(128 << 10, dtype=np.float32)  # 512 KiB: written STAGED, read MAPPED
    with Client(daemon.config_path, transport="shm") as c:
        c.create("m/shm", x.shape, x.dtype)
        before = scrape(daemon)
        c.write("m/shm", x)
        assert np.array_equal(c.read("m/shm"), x)  # one-sided: no request at all
    assert delta(before, scrape(daemon), "irdma_requests_total", op="read", transport="shm") == 0
    monkeypatch.setenv("IRDMA_ONE_SIDED", "0")
    with Client(daemon.config_path, transport="shm") as c:
        assert np.array_equal(c.read("m/shm"), x)  # asks the daemon: MAPPED
    after = scrape(daemon)
    shm_write = {"op": "write", "transport": "shm"}
    shm_read = {"op": "read", "transport": "shm"}
    assert delta(before, after, "irdma_requests_total", **shm_write) == 1
    assert delta(before, after, "irdma_request_bytes_total", **shm_write) == x.nbytes
    assert delta(before, after, "irdma_requests_total", **shm_read) == 1
    assert delta(before, after, "irdma_response_bytes_total", **shm_read) == x.nbytes
    assert delta(before, after, "irdma_requests_total", op="write", transport="tcp") == 0


def raw_request(cluster: Cluster, header: Header) -> Header:
    """One request over a raw TCP socket; the answer's header (its payload is read and dropped)."""
    node = cluster.config.node("n1")
    with socket.create_connection((node.address.host, node.address.port), 5.0) as s:
        s.sendall(header.pack())
        answer = unpack_header(recv_exactly(s, HEADER_SIZE))
        recv_exactly(s, answer.length)
        return answer


def test_errors_are_counted_by_op_and_code(daemon: Cluster) -> None:
    before = scrape(daemon)
    missing = Header(op=Op.READ, key=tensor_key("m/missing"), size=4)
    assert raw_request(daemon, missing).status == Status.NOT_FOUND
    assert raw_request(daemon, Header(op=200)).status == Status.BAD_OP
    after = scrape(daemon)
    assert delta(before, after, "irdma_errors_total", op="read", code="NOT_FOUND") == 1
    assert delta(before, after, "irdma_errors_total", op="unknown", code="BAD_OP") == 1
    assert delta(before, after, "irdma_requests_total", op="read", transport="tcp") == 1
    assert delta(before, after, "irdma_requests_total", op="unknown", transport="tcp") == 1


def test_arena_tensors_and_shards_follow_the_store(daemon: Cluster) -> None:
    before = scrape(daemon)
    assert value(before, "irdma_arena_capacity_bytes") == 32 << 20
    with Client(daemon.config_path) as c:
        c.write("m/arena", np.zeros(3 << 18, np.float32))  # 3 MiB: 3 shards
        after = scrape(daemon)
        assert value(after, "irdma_arena_used_bytes") - value(before, "irdma_arena_used_bytes") >= (
            3 << 20
        )
        assert delta(before, after, "irdma_tensors") == 1
        assert delta(before, after, "irdma_shards", role="primary") == 3
        assert value(after, "irdma_shards", role="backup") == 0  # one copy per shard
        c.delete("m/arena")
    assert value(scrape(daemon), "irdma_tensors") == value(before, "irdma_tensors")


def test_state_and_snapshot_gauges(daemon: Cluster) -> None:
    samples = scrape(daemon)
    assert value(samples, "irdma_ready") == 1 and value(samples, "irdma_quorum") == 1
    info = [k for k in samples if k[0] == "irdma_build_info"]
    assert len(info) == 1 and ("node", "n1") in info[0][1]
    assert 0 < value(samples, "irdma_start_time_seconds") <= time.time()
    assert ("irdma_snapshot_age_seconds", frozenset()) in samples  # present before any snapshot
    deadline = time.monotonic() + 15
    while value(samples, "irdma_snapshots_written_total") < 1:  # every second in this config
        assert time.monotonic() < deadline, "no snapshot was written"
        time.sleep(0.2)
        samples = scrape(daemon)
    stamp = value(samples, "irdma_snapshot_timestamp_seconds")
    assert time.time() - 15 < stamp <= time.time()
    assert 0 <= value(samples, "irdma_snapshot_age_seconds") < 15
    assert value(samples, "irdma_snapshot_failures_total") == 0


def test_other_paths_and_methods_are_refused(daemon: Cluster) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url(daemon, "/nope"), timeout=10)
    assert err.value.code == 404
    post = urllib.request.Request(url(daemon), data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(post, timeout=10)
    assert err.value.code == 405 and err.value.headers["Allow"] == "GET, HEAD"
    head = urllib.request.Request(url(daemon), method="HEAD")
    with urllib.request.urlopen(head, timeout=10) as resp:
        assert resp.status == 200 and resp.read() == b""
    addr = daemon.config.node("n1").metrics_address
    assert addr is not None
    with socket.create_connection((addr.host, addr.port), 5.0) as s:
        s.sendall(b"garbage\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400 ")
    assert value(scrape(daemon), "irdma_ready") == 1  # still serving


def test_openmetrics_when_the_scraper_asks_for_it(daemon: Cluster) -> None:
    req = urllib.request.Request(url(daemon), headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.read().endswith(b"# EOF\n")


@pytest.mark.timeout(90)
def test_replicated_daemons_report_roles_peers_and_empty_queues(tmp_path: Path) -> None:
    path = write_config(tmp_path, nodes=3, replicas=2)
    cluster = Cluster(tmp_path, path, load_config(path))
    try:
        for name in cluster.names:
            cluster.start(name, wait=False)
        for name in cluster.names:
            cluster.wait_serving(name)
        with Client(path) as c:
            c.write("m/rep", np.zeros(5 << 18, np.float32))  # 5 MiB: 5 shards, 2 copies each
        scrapes = {name: scrape(cluster, name) for name in cluster.names}
        assert sum(value(s, "irdma_shards", role="primary") for s in scrapes.values()) == 5
        assert sum(value(s, "irdma_shards", role="backup") for s in scrapes.values()) == 5
        for name, s in scrapes.items():
            peers = [p for p in cluster.names if p != name]
            assert value(s, "irdma_ready") == 1 and value(s, "irdma_quorum") == 1
            for p in peers:
                assert value(s, "irdma_peer_up", peer=p) == 1
                assert value(s, "irdma_peer_ready", peer=p) == 1
                # The write was acknowledged, so every backup has it: nothing queued.
                assert ("irdma_replication_queue_items", frozenset({("peer", p)})) in s
                assert value(s, "irdma_replication_queue_items", peer=p) == 0
                assert value(s, "irdma_replication_lag_seconds", peer=p) == 0
    finally:
        cluster.close()


def test_a_metrics_address_in_use_leaves_the_daemon_serving(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        path = write_config(tmp_path, metrics_port=taken.getsockname()[1])
        cluster = Cluster(tmp_path, path, load_config(path))
        try:
            cluster.start("n1")
            with Client(path) as c:
                assert c.hello(cluster.config.node("n1"))["ready"]
            assert "cannot serve metrics on http://127.0.0.1:" in cluster.log("n1")
        finally:
            cluster.close()


# -- the HTTP parsing, without sockets ---------------------------------------------


def test_parse_request() -> None:
    req = parse_request(b"GET /metrics?x=1 HTTP/1.1\r\nAccept: text/plain\r\nHost: h\r\n\r\n")
    assert req == Request("GET", "/metrics", {"accept": "text/plain", "host": "h"})
    for bad in (
        b"GET /metrics\r\n\r\n",
        b"GET /metrics SPDY/3\r\n\r\n",
        b"GET / HTTP/1.1\r\nx\r\n\r\n",
    ):
        with pytest.raises(BadRequest):
            parse_request(bad)


def test_respond_routes() -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    assert respond(Request("GET", "/", {}), registry).status == 404
    assert respond(Request("PUT", "/metrics", {}), registry).status == 405
    assert respond(Request("GET", "/metrics", {}), registry).status == 200


# -- config ----------------------------------------------------------------------


def nodes_with(*metrics: object) -> dict:
    return {
        "nodes": [
            {"name": f"n{i}", "address": f"tcp://127.0.0.1:{7400 + i}", "arena_size": "1MiB"}
            | ({} if m is None else {"metrics_address": m})
            for i, m in enumerate(metrics)
        ]
    }


def test_metrics_address_is_optional_and_parsed() -> None:
    config = parse_config(nodes_with(None, "127.0.0.1:9401", "[::1]:9402"))
    assert config.nodes[0].metrics_address is None
    assert str(config.nodes[1].metrics_address) == "http://127.0.0.1:9401"
    assert config.nodes[2].metrics_address is not None
    assert config.nodes[2].metrics_address.host == "::1"


@pytest.mark.parametrize(
    ("metrics", "problem"),
    [
        ((9401,), "must be a string"),
        (("9401",), "is not of the form HOST:PORT"),
        (("http://127.0.0.1:9401",), "is not of the form HOST:PORT"),
        (("127.0.0.1:0",), "port must be 1-65535"),
        (("127.0.0.1:70000",), "port must be 1-65535"),
        (("127.0.0.1:7400",), "is the daemon address of node 'n0'"),
        ((None, "127.0.0.1:7400"), "is the daemon address of node 'n0'"),
        (("127.0.0.1:9401", "127.0.0.1:9401"), "is also the metrics address of 'n0'"),
    ],
)
def test_bad_metrics_address_is_refused_naming_the_key(metrics: tuple, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(nodes_with(*metrics))
    assert f"nodes[{len(metrics) - 1}].metrics_address" in str(err.value)
    assert problem in str(err.value)


def test_a_models_newest_version_and_its_pins_are_gauges(daemon: Cluster) -> None:
    with Client(daemon.config_path) as c:
        model = c.model("mx/policy")
        for k in range(3):
            model.commit({"w": np.full(10, k, np.float32)})
        model.draft()  # version 4 claimed, not committed: not counted
        with model.pin(1), model.pin(2), model.pin(2):
            samples = scrape(daemon)
            assert value(samples, "irdma_model_version", model="mx/policy") == 3
            assert value(samples, "irdma_model_pins", model="mx/policy") == 3
            assert value(samples, "irdma_model_oldest_pinned_version", model="mx/policy") == 1
        samples = scrape(daemon)
        assert value(samples, "irdma_model_pins", model="mx/policy") == 0
        assert value(samples, "irdma_model_oldest_pinned_version", model="mx/policy") == 0
