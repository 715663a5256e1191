"""``irdma status``'s comparisons and table, on made-up daemon answers (no daemons)."""

from __future__ import annotations

import pytest

from irdma.cli.status import NodeStatus, human_age, render, replica_skew, version_skew
from irdma.cli.supervisor import FAILED, RESTARTING, DaemonRecord
from irdma.cluster import parse_config
from irdma.protocol import TensorMeta, tensor_key
from irdma.protocol.bodies import StatRecord

pytestmark = pytest.mark.timeout(10)

CONFIG = parse_config(
    {
        "replicas": 2,
        "nodes": [
            {"name": f"n{i}", "address": f"tcp://127.0.0.1:{7400 + i}", "arena_size": "1MiB"}
            for i in (1, 2, 3)
        ],
    }
)


def records(name: str, shards: dict[int, int]) -> list[StatRecord]:
    meta = TensorMeta(name, "float32", (1 << 20,), 1 << 20)
    return [StatRecord(meta, sum(shards.values()), shards=shards)]


def holders(name: str, shard: int) -> list[str]:
    return [n.name for n in CONFIG.replicas_for(tensor_key(name), shard)]


def test_replicas_at_the_same_version_have_no_skew() -> None:
    a, b = holders("w", 0)
    assert replica_skew(CONFIG, {a: records("w", {0: 5}), b: records("w", {0: 5})}) == {
        a: 0,
        b: 0,
    }


def test_an_older_or_missing_copy_counts_as_behind() -> None:
    a, b = holders("w", 0)
    (other,) = {"n1", "n2", "n3"} - {a, b}
    older = replica_skew(CONFIG, {a: records("w", {0: 7}), b: records("w", {0: 5})})
    assert older == {a: 0, b: 1}
    missing = replica_skew(CONFIG, {a: records("w", {0: 7}), b: [], other: []})
    assert missing == {a: 0, b: 1, other: 0}  # ``other`` is not a replica of the shard


def test_version_skew_names_who_runs_what() -> None:
    rows = [
        NodeStatus("n1", "a", up=True, hello={"version": "0.1.0"}),
        NodeStatus("n2", "b", up=True, hello={"version": "0.2.0"}),
        NodeStatus("n3", "c", up=False, error="refused"),
    ]
    assert version_skew(rows) == "irdma versions differ: 0.1.0 on n1; 0.2.0 on n2"
    assert version_skew(rows[:1]) is None


def test_render_lines_up_columns_and_ends_a_down_row_with_why() -> None:
    hello = {
        "version": "0.1.0",
        "ready": True,
        "quorum": True,
        "tensors": 3,
        "shards": {"primary": 12, "backup": 4},
        "arena_used": 3 << 20,
        "arena_size": 1 << 30,
        "snapshot": {"created": 0.0, "seq": 2, "age": 125.0},
    }
    rows = [
        NodeStatus("n1", "tcp://h1:1", up=True, transport="tcp", hello=hello, skew=2),
        NodeStatus("n2", "tcp://h2:1", error="daemon n2 is unavailable: refused"),
    ]
    hello["pid"] = 4242
    rows[1].cause = "refused"
    lines = render(rows, CONFIG).splitlines()
    assert lines[0].startswith("NODE") and lines[0].index("SKEW") == len(lines[0]) - 4
    cells = lines[1].split()
    assert cells[:8] == ["n1", "tcp://h1:1", "tcp", "up", "4242", "0.1.0", "3", "12/4"]
    assert cells[8:] == ["3.0", "MiB", "/", "1.0", "GiB", "2m", "ago", "2"]
    # A down row has the table's columns, unknown ones "-"; why it is down comes after.
    assert lines[2].split() == ["n2", "tcp://h2:1", "-", "down", *["-"] * 7]
    assert len(lines[2]) == len(lines[0])
    assert lines[3] == "n2: refused"


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0s ago"), (59, "59s ago"), (60, "1m ago"), (7200, "2h ago")]
)
def test_human_age(seconds: float, text: str) -> None:
    assert human_age(seconds) == text


def test_a_supervised_cluster_shows_restarts_and_why_a_daemon_is_down() -> None:
    hello = {
        "version": "0.1.0",
        "tensors": 1,
        "shards": {"primary": 1, "backup": 1},
        "arena_used": 0,
        "arena_size": 1 << 20,
    }
    restarting = DaemonRecord("n2", state=RESTARTING, restarts=2, last_exit="killed by SIGKILL")
    failed = DaemonRecord("n3", state=FAILED, restarts=4, fast_crashes=5)
    failed.last_exit = "exited with status 1"
    rows = [
        NodeStatus("n1", "tcp://h1:1", up=True, transport="tcp", hello=hello, skew=0),
        NodeStatus("n2", "tcp://h2:1", error="refused", supervised=restarting),
        NodeStatus("n3", "tcp://h3:1", error="refused", supervised=failed),
    ]
    rows[0].supervised = DaemonRecord("n1")
    lines = render(rows, CONFIG).splitlines()
    assert lines[0].split()[:6] == ["NODE", "ADDRESS", "VIA", "STATE", "PID", "RESTARTS"]
    assert lines[1].split()[3:6] == ["up", "-", "0"]
    assert lines[2].split()[3:6] == ["restarting", "-", "2"]
    assert lines[3].split()[3:6] == ["failed", "-", "4"]
    assert lines[4:] == [
        "n2: killed by SIGKILL; irdma local is restarting it",
        "n3: exited with status 1; irdma local gave up after 5 fast crashes",
    ]
    assert rows[2].to_dict() | {"error": "x"} == {
        "node": "n3",
        "address": "tcp://h3:1",
        "up": False,
        "restarts": 4,
        "supervisor": FAILED,
        "state": "failed",
        "error": "x",
        "transport": None,
        "pid": None,
    }


def test_daemons_down_for_one_reason_share_one_line_below_the_table() -> None:
    rows = [NodeStatus(f"n{i}", f"tcp://h{i}:1", error=f"daemon n{i} ...") for i in (1, 2, 3)]
    for r in rows:
        r.cause = "connection refused: nothing listens at its address (not started, or stopped)"
    rows[2].refused, rows[2].cause = True, "has another secret: its proof does not match"
    lines = render(rows, CONFIG).splitlines()
    assert [line.split()[3] for line in lines[1:4]] == ["down", "down", "refused"]
    assert lines[4:] == [
        "n1, n2: connection refused: nothing listens at its address (not started, or stopped)",
        "n3: up, and refuses this client: it has another secret: its proof does not match",
    ]


def test_without_irdma_local_there_is_no_restarts_column() -> None:
    rows = [NodeStatus("n1", "tcp://h1:1", error="refused")]
    assert "RESTARTS" not in render(rows, CONFIG)
    assert "restarts" not in rows[0].to_dict()
