"""Replication, failover, rejoin and snapshots with each daemon on a host of its own.

Every host is a network namespace (``tests/helpers/netns.py``): four daemons with
two copies of each shard, and the clients on a fifth host. Faults are real:
``kill -9``, SIGSTOP, a host cut off from the switch, shaped lossy links,
a corrupt snapshot file. Every scenario checks exact data: sums of the
acknowledged updates, and sha256 digests of every replica's copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from irdma.cli.local import psd_command
from irdma.cluster import ClusterConfig, load_config, render_config
from irdma.protocol import tensor_key

from .helpers.netns import NetnsUnavailable, Network, netns_problem

if (_problem := netns_problem()) is not None:
    pytest.skip(f"network namespaces unavailable: {_problem}", allow_module_level=True)

WORKERS = str(Path(__file__).with_name("replication_workers.py"))
HOSTS = ["h1", "h2", "h3", "h4"]
PORT = 7400
SHAPE = (40000,)  # float64: 5 shards of 64 KiB over the 4 hosts


@dataclass
class NetCluster:
    """psd daemons, one per namespace host, and a client host to run workers on."""

    net: Network
    dir: Path
    config_path: Path
    config: ClusterConfig
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str) -> None:
        self.procs[name] = self.net.run(
            name, psd_command(self.config_path, name), log=self.dir / f"{name}.log"
        )

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-4000:]}" for n in self.procs)

    def worker(self, *args: str, host: str = "client", timeout: float = 120) -> dict:
        """Run a replication_workers command on a host; its JSON answer."""
        argv = [sys.executable, WORKERS, args[0], "--config", str(self.config_path), *args[1:]]
        try:
            out = self.net.check_output(host, argv, timeout=timeout)
        except subprocess.CalledProcessError as exc:
            raise AssertionError(f"{args[0]} failed: {exc}\n{self.logs()}") from None
        return json.loads(out.strip().splitlines()[-1])

    def spawn(self, *args: str) -> subprocess.Popen:
        argv = [sys.executable, WORKERS, args[0], "--config", str(self.config_path), *args[1:]]
        return self.net.run("client", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait_ready(self, nodes: list[str] | None = None, timeout: float = 40) -> None:
        args = ["wait-ready", "--timeout", str(timeout)]
        if nodes:
            args += ["--nodes", ",".join(nodes)]
        self.worker(*args, timeout=timeout + 30)

    def stop(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.kill()
        proc.wait(10)

    def copies(self, tensor: str) -> dict[str, dict[str, list]]:
        return self.worker("replicas", "--tensor", tensor)

    def primary(self, tensor: str, shard: int = 0) -> str:
        return self.config.primary_for(tensor_key(tensor), shard).name


def digest(value: float, shape: tuple[int, ...] = SHAPE, index: int = 0) -> str:
    """sha256 of shard ``index`` of a float64 tensor filled with ``value``."""
    data = np.full(shape, value, dtype=np.float64).reshape(-1).view(np.uint8)
    return hashlib.sha256(data[index * 65536 : (index + 1) * 65536]).hexdigest()


def build(tmp_path: Path, **extra: float) -> Iterator[NetCluster]:
    try:
        net = Network([*HOSTS, "client"])
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces unavailable: {exc}")
    try:
        nodes = [(h, f"tcp://{net.address(h)}:{PORT}", str(tmp_path / h), 64 << 20) for h in HOSTS]
        settings = {"heartbeat": 0.2, "failure_timeout": 1.0} | extra
        timeout = settings.pop("timeout", 3.0)
        path = tmp_path / "cluster.toml"
        path.write_text(
            render_config(nodes, shard_size=64 << 10, replicas=2, timeout=timeout, extra=settings)
        )
        cluster = NetCluster(net, tmp_path, path, load_config(path))
        for h in HOSTS:
            cluster.start(h)
        cluster.wait_ready()
        yield cluster
    finally:
        net.close()


@pytest.fixture
def netcluster(tmp_path: Path) -> Iterator[NetCluster]:
    yield from build(tmp_path)


def run_stream(c: NetCluster, tensor: str, seconds: float, fault) -> tuple[float, list[dict]]:
    """Three clients accumulate for ``seconds`` while ``fault()`` runs; (acked sum, results)."""
    c.worker("write", "--tensor", tensor, "--count", str(SHAPE[0]), "--value", "0")
    procs = [
        c.spawn(
            "accumulate",
            "--tensor",
            tensor,
            "--seconds",
            str(seconds),
            "--base",
            str(1 + k * 1_000_000),
        )
        for k in range(3)
    ]
    try:
        fault()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=seconds + 60)
            assert p.returncode == 0, f"worker failed: {err.decode()}\n{c.logs()}"
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r in results:
        assert r["failures"] == [], f"{r['failures'][:3]}\n{c.logs()}"
    return sum(r["acked"] for r in results), results


def explain(copies: dict, total: float, results: list[dict], fault_at: float) -> str:
    """Why the copies differ from ``total``: which acknowledged values were lost or doubled,
    when those operations ran relative to the fault, and the operations around it.

    Values are distinct whole numbers per client, so a difference that equals one value
    names the operation; the history's times are the workers' monotonic clock, as is
    ``fault_at`` (same machine).
    """
    ops = {op[0]: op for r in results for op in r["history"]}
    lines = [f"\nexpected {total}; fault at t=0 (monotonic {fault_at:.3f})"]
    for index, per_node in copies.items():
        for node, (version, _sha, *rest) in per_node.items():
            if not rest or rest[0] == total:
                continue
            diff = rest[0] - total
            op = ops.get(abs(diff))
            what = "doubled" if diff > 0 else "lost"
            when = (
                f"{what} op {op[0]:.0f}: invoked {op[1] - fault_at:+.3f} s, "
                f"completed {op[2] - fault_at:+.3f} s, {op[3]}"
                if op
                else "no single operation has that value"
            )
            lines.append(f"shard {index} on {node} v{version}: {rest[0]} (diff {diff:+}); {when}")
    near = sorted(
        (op for op in ops.values() if op[2] - fault_at > -0.5 and op[1] - fault_at < 3.0),
        key=lambda op: op[1],
    )
    lines += [
        f"  op {op[0]:.0f}: {op[1] - fault_at:+.3f} .. {op[2] - fault_at:+.3f} {op[3]}"
        for op in near[:60]
    ]
    return "\n".join(lines)


def resumed_after(results: list[dict], at: float) -> float:
    """Seconds from ``at`` until every client had an update acknowledged again."""
    return max(min(t for t in r["times"] if t > at) - at for r in results)


def assert_copies(
    copies: dict, value: float, *, live: set[str], both: bool = True, context: str = ""
) -> None:
    """Every live replica of every shard holds exactly ``value`` everywhere.

    ``context`` is added to a failure's message (the history that explains it).
    """
    for index, per_node in copies.items():
        want = digest(value, index=int(index))
        seen = {n: v for n, v in per_node.items() if n in live}
        assert seen, f"shard {index}: no live replica answered: {per_node}"
        if both:
            assert len(seen) == len(per_node), f"shard {index}: a replica is missing: {per_node}"
        for node, (version, sha, *_) in seen.items():
            assert sha == want, (
                f"shard {index} on {node} (version {version}) differs; all copies: {copies}"
                f"{context}"
            )
        versions = {v for v, *_ in seen.values()}
        assert len(versions) == 1, f"shard {index}: replicas at versions {seen}{context}"


@pytest.mark.timeout(180)
def test_kill_9_primary_loses_and_doubles_nothing(netcluster: NetCluster) -> None:
    c = netcluster
    victim = c.primary("s1/t")
    killed_at: list[float] = []

    def fault() -> None:
        time.sleep(3)
        killed_at.append(time.monotonic())
        c.kill(victim)

    total, results = run_stream(c, "s1/t", 8, fault)
    live = set(HOSTS) - {victim}
    copies = c.copies("s1/t")
    why = explain(copies, total, results, killed_at[0]) + f"\nvictim {victim}\n{c.logs()}"
    assert_copies(copies, total, live=live, both=False, context=why)
    resumed = resumed_after(results, killed_at[0])
    print(f"writes resumed {resumed:.2f} s after kill -9 of {victim} (target 2 s)")
    # Rejoin: the restarted daemon catches up to the same bytes.
    c.start(victim)
    c.wait_ready()
    copies = c.copies("s1/t")
    why = explain(copies, total, results, killed_at[0]) + f"\nvictim {victim}\n{c.logs()}"
    assert_copies(copies, total, live=set(HOSTS), context=why)
    assert "caught up" in c.log(victim)


@pytest.mark.timeout(180)
def test_sigstop_daemon_fails_over_then_rejoins(netcluster: NetCluster) -> None:
    c = netcluster
    victim = c.primary("s2/t")

    def fault() -> None:
        time.sleep(2)
        os.kill(c.procs[victim].pid, signal.SIGSTOP)
        time.sleep(4)
        os.kill(c.procs[victim].pid, signal.SIGCONT)

    total, _ = run_stream(c, "s2/t", 9, fault)
    c.wait_ready()
    assert_copies(c.copies("s2/t"), total, live=set(HOSTS))
    assert "catching up before serving again" in c.log(victim), c.log(victim)


@pytest.mark.timeout(180)
def test_partitioned_host_refuses_writes_and_converges(netcluster: NetCluster) -> None:
    c = netcluster
    victim = c.primary("s3/t")
    c.worker("write", "--tensor", "s3/t", "--count", str(SHAPE[0]), "--value", "1")
    c.net.partition(victim)
    try:
        # The cut-off daemon notices it hears no majority (asked from its own side).
        c.worker("wait-quorum", "--node", victim, "--lost", host=victim)
        # The minority side: a client next to the cut-off daemon cannot write.
        # (It writes the value element 0 already has, so nothing would change.)
        alone = c.worker("try-write", "--tensor", "s3/t", "--first", "1", host=victim)
        assert not alone["ok"] and alone["error"] in ("NoQuorum", "Recovering"), alone
        # The majority side goes on.
        majority = c.worker("try-write", "--tensor", "s3/t", "--times", "5", "--timeout", "5")
        assert majority["ok"], majority
    finally:
        c.net.heal(victim)
    c.wait_ready()
    assert_copies(c.copies("s3/t"), 6.0, live=set(HOSTS))
    print(f"minority side answered: {alone['error']}: {alone['message'][:200]}")


@pytest.mark.timeout(180)
def test_a_primary_cut_off_mid_update_does_not_acknowledge_what_its_backup_lacks(
    netcluster: NetCluster,
) -> None:
    """A write reaches the primary just as it is cut off from every other host: it
    applies it, but cannot forward it, and loses its majority before it would answer.
    It must not acknowledge it then: the majority side goes on without the write, and
    the cut-off daemon replaces its copy with theirs when it comes back."""
    c = netcluster
    victim = c.primary("s7/t")
    backup = c.config.replicas_for(tensor_key("s7/t"), 0)[1].name
    c.worker("write", "--tensor", "s7/t", "--count", str(SHAPE[0]), "--value", "1")
    primaries = c.worker("wait-primaries", "--node", backup, "--above", "-1")["last"]
    go = c.dir / "go"
    argv = [sys.executable, WORKERS, "try-write", "--config", str(c.config_path)]
    argv += ["--tensor", "s7/t", "--first", "5", "--timeout", "10", "--go", str(go)]
    writer = c.net.run(victim, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == b"ready\n", writer.stderr.read().decode()
        c.net.partition(victim)
        go.touch()  # within the victim's lease: it still takes the write
        out, err = writer.communicate(timeout=60)
        # The majority side takes the shard over before the cut ends, so nothing the
        # cut-off daemon sent that is still on the wire can land after it.
        above = str(primaries["shards"]["primary"])
        c.worker("wait-primaries", "--node", backup, "--above", above)
    finally:
        c.net.heal(victim)
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0, err.decode()
    answer = json.loads(out.decode().strip().splitlines()[-1])
    c.wait_ready()
    copies = c.copies("s7/t")
    firsts = {node: rest[0] for node, (_v, _sha, *rest) in copies["0"].items()}
    logs = f"\nanswer {answer}\ncopies {copies}\n{c.logs()}"
    assert len(set(firsts.values())) == 1, f"replicas differ: {firsts}{logs}"
    if answer["ok"]:
        assert set(firsts.values()) == {5.0}, f"acknowledged write lost: {firsts}{logs}"
    print(f"the cut-off primary answered {answer}; replicas hold {firsts}")


@pytest.mark.timeout(180)
def test_a_backup_its_primary_went_on_without_catches_up_before_the_primary_dies(
    netcluster: NetCluster,
) -> None:
    """The primary stops hearing its backup while the backup hears a majority (seen in
    the nemesis under CPU load; here the link between their hosts is cut, and both still
    reach the other two). The primary declares the backup down and acknowledges updates
    without it; the backup stays ready, stale. The link heals with no further update
    of the shard, and the primary dies. The backup used to take over with its stale copy
    (the acknowledged updates lost); now the primary owes it a resync and says so in its
    heartbeats, so it catches up as soon as it hears the primary again.

    A link cut one way only is no better a model: the daemons talk over TCP, which
    needs both directions, so either way both stop hearing each other."""
    c = netcluster
    tensor = "s8/t"  # 1,000 float64: one shard
    primary, backup = (n.name for n in c.config.replicas_for(tensor_key(tensor), 0))
    c.worker("write", "--tensor", tensor, "--count", "1000", "--value", "0")
    c.net.cut_link(primary, backup)
    try:
        c.worker("wait-peer", "--node", primary, "--peer", backup, "--state", "down")
        acked = c.worker("try-write", "--tensor", tensor, "--times", "5", "--timeout", "10")
        assert acked["ok"], f"{acked}\n{c.logs()}"
        # The backup heard a majority all along: still ready, serving its stale copy.
        stale = c.copies(tensor)["0"][backup]
        assert stale[2] == 0.0, f"the backup got the updates during the cut: {stale}"
    finally:
        c.net.restore_link(primary, backup)
    # The link works again and the cluster looks whole: the primary sees the backup ready
    # and owes it nothing (a release without resyncs never says it owes anything).
    c.worker("wait-peer", "--node", primary, "--peer", backup, "--state", "ready", "--settled")
    c.wait_ready([backup])
    c.kill(primary)
    live = set(HOSTS) - {primary}
    c.wait_ready(sorted(live))
    # The backup takes the shard over: one more update goes through it.
    more = c.worker("try-write", "--tensor", tensor, "--times", "1", "--timeout", "10")
    assert more["ok"], f"{more}\n{c.logs()}"
    copies = c.copies(tensor)
    assert copies["0"][backup][2] == 6.0, (
        f"acknowledged updates lost: 5 acknowledged while the backup was cut off, then 1 "
        f"through it; it holds {copies['0'][backup]}\n{c.logs()}"
    )
    assert "owes it a resync" in c.log(backup), c.log(backup)


@pytest.mark.timeout(180)
def test_restart_of_every_daemon_keeps_every_byte(netcluster: NetCluster) -> None:
    c = netcluster
    for i in range(3):
        c.worker("write", "--tensor", f"s4/t{i}", "--count", str(SHAPE[0]), "--value", str(i + 0.5))
    before = {i: c.copies(f"s4/t{i}") for i in range(3)}
    for h in HOSTS:
        c.stop(h)
    for h in HOSTS:
        # The final snapshot on SIGTERM (not "no snapshot in ...", which also says snapshot).
        assert re.search(rf"{h}: snapshot \d+ written \(", c.log(h)), c.log(h)
        assert (c.dir / h / "snapshot.irdma").exists()
        c.start(h)
    c.wait_ready()
    for h in HOSTS:
        assert re.search(rf"{h}: loaded snapshot \d+ ", c.log(h)), c.log(h)
    for i in range(3):
        assert c.copies(f"s4/t{i}") == before[i]
        assert_copies(before[i], i + 0.5, live=set(HOSTS))


@pytest.mark.timeout(180)
def test_corrupt_snapshot_is_refused_and_replaced_from_a_replica(
    netcluster: NetCluster,
) -> None:
    c = netcluster
    c.worker("write", "--tensor", "s5/t", "--count", str(SHAPE[0]), "--value", "7")
    victim = c.primary("s5/t")
    c.stop(victim)
    snap = c.dir / victim / "snapshot.irdma"
    raw = bytearray(snap.read_bytes())
    raw[len(raw) // 3] ^= 0xFF  # inside the shard data
    snap.write_bytes(bytes(raw))
    c.start(victim)
    c.wait_ready()
    log = c.log(victim)
    assert "checksum mismatch" in log, log
    kept = list((c.dir / victim).glob("snapshot.irdma.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == bytes(raw)
    assert_copies(c.copies("s5/t"), 7.0, live=set(HOSTS))


@pytest.mark.timeout(180)
def test_a_replica_down_during_a_rename_comes_back_with_the_new_name(
    netcluster: NetCluster,
) -> None:
    """The rename replaces "b" while a daemon holding both is stopped; back with its
    snapshot of "a" and the old "b", it catches up to the renamed tensor and drops
    the replaced one."""
    c = netcluster
    c.worker("write", "--tensor", "s7/a", "--count", str(SHAPE[0]), "--value", "3")
    c.worker("write", "--tensor", "s7/b", "--count", str(SHAPE[0]), "--value", "1")
    victim = c.primary("s7/a")
    assert "s7/b" in c.worker("holdings", "--prefix", "s7/")[victim]
    c.stop(victim)
    c.worker("rename", "--tensor", "s7/a", "--to", "s7/b")
    c.start(victim)
    c.wait_ready()
    assert re.search(rf"{victim}: loaded snapshot \d+ ", c.log(victim)), c.log(victim)
    assert_copies(c.copies("s7/b"), 3.0, live=set(HOSTS))
    held = c.worker("holdings", "--prefix", "s7/")
    assert all(names in ([], ["s7/b"]) for names in held.values()), held
    assert held[victim] == ["s7/b"]


@pytest.fixture
def lossy_cluster(tmp_path: Path) -> Iterator[NetCluster]:
    # 100 ms each way on every host link: 400 ms host-to-host round trips,
    # so failure detection is set well above them.
    yield from build(tmp_path, heartbeat=0.5, failure_timeout=5.0, timeout=15.0)


@pytest.mark.timeout(300)
def test_training_loop_over_delayed_lossy_links(lossy_cluster: NetCluster) -> None:
    c = lossy_cluster
    c.worker("write", "--tensor", "s6/t", "--count", "4000", "--value", "0")
    for h in [*HOSTS, "client"]:
        c.net.shape(h, delay_ms=100, loss_pct=1)
    try:
        out = c.worker("training", "--tensor", "s6/t", "--steps", "6", timeout=240)
    finally:
        for h in [*HOSTS, "client"]:
            with contextlib.suppress(Exception):
                c.net.shape(h)
    assert out["errors"] == [], out
