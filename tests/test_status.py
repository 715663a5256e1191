"""``irdma status``'s comparisons and table, on made-up daemon answers (no daemons)."""

from __future__ import annotations

import pytest

from irdma.cluster import parse_config
from irdma.protocol import tensor_key
from irdma.status import NodeStatus, human_age, render, replica_skew, version_skew
from irdma.supervisor import FAILED, RESTARTING, DaemonRecord

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


def records(name: str, shards: dict[int, int]) -> list[dict]:
    return [{"meta": {"name": name}, "shards": {str(i): v for i, v in shards.items()}}]


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
    lines = render(rows, CONFIG).splitlines()
    assert lines[0].startswith("NODE") and lines[0].index("SKEW") == len(lines[0]) - 4
    cells = lines[1].split()
    assert cells[:7] == ["n1", "tcp://h1:1", "tcp", "up", "0.1.0", "3", "12/4"]
    assert cells[7:] == ["3.0", "MiB", "/", "1.0", "GiB", "2m", "ago", "2"]
    assert lines[2].split()[:4] == ["n2", "tcp://h2:1", "-", "DOWN"]
    assert lines[2].endswith("daemon n2 is unavailable: refused")


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
    assert lines[0].split()[:5] == ["NODE", "ADDRESS", "VIA", "STATE", "RESTARTS"]
    assert lines[1].split()[3:5] == ["up", "0"]
    assert lines[2].split()[3:5] == ["DOWN", "2"]
    assert lines[2].endswith("killed by SIGKILL; irdma local is restarting it")
    assert lines[3].endswith("exited with status 1; irdma local gave up after 5 fast crashes")
    assert rows[2].to_dict() | {"error": "x"} == {
        "node": "n3",
        "address": "tcp://h3:1",
        "up": False,
        "restarts": 4,
        "supervisor": FAILED,
        "error": "x",
        "transport": None,
    }


def test_without_irdma_local_there_is_no_restarts_column() -> None:
    rows = [NodeStatus("n1", "tcp://h1:1", error="refused")]
    assert "RESTARTS" not in render(rows, CONFIG)
    assert "restarts" not in rows[0].to_dict()
