#!/usr/bin/env python3
"""Replication's costs and scaling, with each daemon on a namespace host of its own.

Three measurements, all in one run (as root; hosts from ``tests/helpers/netns.py``):

1. **Read scaling.** 1, 2 and 4 daemons, each on a host whose link is
   shaped to ``--rate`` (tbf, both directions); one client on an unshaped
   host reads a tensor spread over all of them, with one copy per shard and
   with two (reads then spread over both copies). Prints the aggregate read
   rate and its ratio to N x the one-daemon rate (target 0.9). iperf3
   through one shaped link gives the link's own limit.
2. **The cost of R=2.** Write and accumulate throughput of 4 daemons on
   unshaped links with one copy and with two, and the ratio.
3. **Failover.** A stream of accumulates while the primary of the shard is
   killed with SIGKILL: the longest wait between two acknowledged writes
   around the kill (target 2 s), over ``--kills`` kills.
4. **A daemon joins** (membership in etcd, an etcd member on a host of its
   own). Three daemons with two copies of each shard on shaped links; the
   read rate; a fourth daemon starts: how long until it is a member (its
   copies moved, the epoch switched) and how many bytes moved; the read
   rate again. Both rates against N x the one-daemon rate of (1) (target
   0.9 once the move is done).

Reads of one tensor scale with the daemon that holds the most of its shards
(rendezvous placement is not perfectly even), so the placement's balance is
printed next to the scaling.

    python bench/replication.py [--rate 400mbit] [--size 64MiB] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from irdma.cluster import load_config, parse_size, render_config  # noqa: E402
from irdma.protocol import tensor_key  # noqa: E402
from tests.helpers.netns import Network  # noqa: E402
from tests.nemesis.run import ETCD_HOST, start_etcd  # noqa: E402

PORT = 7400
ME = str(Path(__file__).resolve())


# -- the worker side (runs inside the client's namespace) ------------------------------


def worker(args: argparse.Namespace) -> None:
    """Throughput of one op on one tensor, through ``AsyncClient`` or (``--api blocking``)
    the blocking ``Client``: both ask every daemon at once, so the figure is the
    cluster's aggregate."""
    if args.api == "blocking" and args.op in ("read", "write", "accumulate"):
        print(json.dumps(blocking_worker(args)))
        return
    import trio

    from irdma import AsyncClient

    async def run() -> dict:
        size = parse_size(args.size)
        async with AsyncClient(args.config) as client:
            if args.op == "ready":
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    try:
                        if all([(await client.hello(n)).get("ready") for n in client.config.nodes]):
                            break
                    except Exception:
                        pass
                    await trio.sleep(0.05)
                return {"ok": True}
            arr = np.random.default_rng(1).random(size // 8)
            await client.write("bench/t", arr, replace=True)
            out = np.empty_like(arr)
            times = []
            for _ in range(args.rounds):
                t = time.perf_counter()
                if args.op == "read":
                    await client.read("bench/t", out=out)
                elif args.op == "write":
                    await client.write("bench/t", arr)
                else:
                    await client.accumulate("bench/t", arr)
                times.append(time.perf_counter() - t)
            return {"mbps": size / statistics.median(times) / 1e6}

    print(json.dumps(trio.run(run)))


def blocking_worker(args: argparse.Namespace) -> dict:
    """``worker``'s measurement through the blocking ``Client``."""
    from irdma import Client

    size = parse_size(args.size)
    with Client(args.config) as client:
        arr = np.random.default_rng(1).random(size // 8)
        client.write("bench/t", arr, replace=True)
        out = np.empty_like(arr)
        times = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            if args.op == "read":
                client.read("bench/t", out=out)
            elif args.op == "write":
                client.write("bench/t", arr)
            else:
                client.accumulate("bench/t", arr)
            times.append(time.perf_counter() - t)
    return {"mbps": size / statistics.median(times) / 1e6}


def wait_join(args: argparse.Namespace) -> None:
    """Until ``--node`` is a member with no move under way; when (CLOCK_MONOTONIC, one
    clock for every namespace), and the bytes of whole shards the daemons received."""
    import trio

    from irdma import AsyncClient
    from irdma.cluster.registry import Registry

    config = load_config(args.config)
    assert config.etcd is not None
    registry = Registry.of(config.etcd, 5.0)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        epoch, _ = trio.run(registry.epoch)
        if epoch is not None and args.node in epoch.members and epoch.target is None:
            break
        time.sleep(0.02)
    at = time.monotonic()
    config = config.following(epoch) or config

    async def received() -> int:
        async with AsyncClient(config, timeout=5.0) as client:
            return sum([(await client.hello(n))["copies"]["received_bytes"]
                        for n in config.nodes])  # fmt: skip

    print(json.dumps({"at": at, "epoch": epoch.number, "received": trio.run(received)}))


def stream(args: argparse.Namespace) -> None:
    """Accumulate for ``--seconds``; print the ack times."""
    from irdma import Client

    with Client(args.config) as client:
        ones = np.ones(1024)
        client.write("bench/f", np.zeros(1024), replace=True)
        times = []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            client.accumulate("bench/f", ones)
            times.append(time.monotonic())
    print(json.dumps({"times": times}))


# -- the driver -----------------------------------------------------------------------


class Cluster:
    def __init__(
        self,
        net: Network,
        hosts: list[str],
        replicas: int,
        tmp: Path,
        shard_size: int,
        etcd: str | None = None,
    ) -> None:
        self.net = net
        self.hosts = hosts
        self.tmp = tmp
        self.shard_size, self.replicas = shard_size, replicas
        # With etcd, membership lives there (the first daemon writes epoch 1 from this list).
        self.etcd = (
            f'\n[etcd]\nendpoints = ["{etcd}"]\nprefix = "/irdma/bench"\nlease_ttl = 2\n'
            if etcd is not None
            else ""
        )
        tmp.mkdir(parents=True, exist_ok=True)
        self.path = self._config(hosts, f"cluster-{len(hosts)}-{replicas}.toml")
        self.config = load_config(self.path)
        self.procs: dict[str, subprocess.Popen] = {}
        for h in hosts:
            self.start(h, self.path)
        self.run("ready")

    def _config(self, hosts: list[str], name: str) -> Path:
        nodes = [(h, f"tcp://{self.net.address(h)}:{PORT}", str(self.tmp / h), 512 << 20)
                 for h in hosts]  # fmt: skip
        path = self.tmp / name
        # Namespaces stand in for hosts here: nothing is lent between them (one kernel
        # would let a backup copy a forward out of its primary's memory).
        text = render_config(
            nodes,
            shard_size=self.shard_size,
            replicas=self.replicas,
            timeout=5.0,
            extra={"lend_forwards": False},
        )
        path.write_text(text + self.etcd)
        return path

    def start(self, host: str, config: Path) -> None:
        self.procs[host] = self.net.run(
            host,
            [sys.executable, "-m", "irdma_psd.main", "--config", str(config),
             "--node", host, "--log-level", "WARNING"],
            log=self.tmp / f"{host}.log",
        )  # fmt: skip

    def join(self, host: str) -> Path:
        """Start ``host`` from a config naming only itself (and etcd)."""
        config = self._config([host], f"{host}.toml")
        self.start(host, config)
        return config

    def run(self, op: str, **kw: str) -> dict:
        argv = [sys.executable, ME, "--worker", op, "--config", str(self.path)]
        for k, v in kw.items():
            argv += [f"--{k}", str(v)]
        return json.loads(self.net.check_output("client", argv, timeout=600).splitlines()[-1])

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            p.wait(30)


def iperf(net: Network, server: str, seconds: float = 3) -> float:
    srv = net.run(server, ["iperf3", "-s", "-1", "-p", "5201"], stdout=subprocess.DEVNULL)
    time.sleep(0.3)
    try:
        out = net.check_output(
            "client", ["iperf3", "-c", net.address(server), "-p", "5201", "-t", str(seconds),
                       "-J", "-R"],
        )  # fmt: skip
    finally:
        srv.wait(10)
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 8e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker")
    parser.add_argument("--config")
    parser.add_argument("--op")
    parser.add_argument("--size", default="64MiB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--rate", default="400mbit")
    parser.add_argument("--shard-size", default="1MiB")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--node")
    parser.add_argument("--api", choices=("async", "blocking"), default="async")
    parser.add_argument(
        "--parts", default="1,2,3,4", help="which measurements (1: scaling ... 4: join)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.worker:
        if args.worker == "stream":
            stream(args)
        elif args.worker == "wait-join":
            wait_join(args)
        else:
            args.op = args.worker
            worker(args)
        return

    hosts = ["h1", "h2", "h3", "h4"]
    shard = parse_size(args.shard_size)
    parts = {int(p) for p in args.parts.split(",")}
    results: dict = {"rate": args.rate, "size": args.size, "shard_size": shard}
    with tempfile.TemporaryDirectory() as d, Network([*hosts, "client", ETCD_HOST]) as net:
        tmp = Path(d)
        for h in hosts:
            net.shape(h, rate=args.rate)
        results["iperf3_one_link_mbps"] = iperf(net, "h1")
        if 1 in parts or 4 in parts:
            results |= read_scaling(net, hosts, tmp, shard, args, full=1 in parts)
        if 4 in parts:
            results["join"] = join(net, hosts, tmp, shard, args, results["read_mbps"]["1/1"])
        for h in hosts:
            net.shape(h)
        if 2 in parts:
            results |= replication_cost(net, hosts, tmp, shard, args)
        if 3 in parts:
            results["failover_s"] = failover(net, hosts, tmp, shard, args)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    report(results, args)


def read_scaling(
    net: Network, hosts: list[str], tmp: Path, shard: int, args: argparse.Namespace, full: bool
) -> dict:
    """Read rates of 1, 2 and 4 daemons with one and two copies (only 1/1 unless ``full``),
    through ``AsyncClient`` and (``full``) through the blocking ``Client``."""
    scaling: dict[str, float] = {}
    blocking: dict[str, float] = {}
    balance: dict[str, float] = {}
    for n, r in ((1, 1), (2, 1), (4, 1), (2, 2), (4, 2)) if full else ((1, 1),):
        c = Cluster(net, hosts[:n], r, tmp / f"s{n}-{r}", shard)
        try:
            scaling[f"{n}/{r}"] = c.run("read", size=args.size, rounds=args.rounds)["mbps"]
            if full:
                got = c.run("read", size=args.size, rounds=args.rounds, api="blocking")
                blocking[f"{n}/{r}"] = got["mbps"]
            # With one copy, the daemon with the most shards sets the pace.
            count = parse_size(args.size) // shard
            per = [0] * n
            for i in range(count):
                per[hosts.index(c.config.primary_for(tensor_key("bench/t"), i).name)] += 1
            balance[f"{n}/{r}"] = (count / n) / max(per) if r == 1 else 1.0
        finally:
            c.stop()
    one = scaling["1/1"]
    result = {
        "read_mbps": scaling,
        "placement_balance": balance,
        "read_scaling": {k: v / (int(k.split("/")[0]) * one) for k, v in scaling.items()},
    }
    if blocking:
        one = blocking["1/1"]
        result["blocking_read_mbps"] = blocking
        result["blocking_read_scaling"] = {
            k: v / (int(k.split("/")[0]) * one) for k, v in blocking.items()
        }
    return result


def join(
    net: Network, hosts: list[str], tmp: Path, shard: int, args: argparse.Namespace, one: float
) -> dict:
    """Three daemons (two copies, membership in etcd), reads; a fourth joins; reads again."""
    (tmp / "join").mkdir(parents=True, exist_ok=True)
    endpoint = start_etcd(net, tmp / "join")
    c = Cluster(net, hosts[:3], 2, tmp / "join", shard, etcd=endpoint)
    try:
        before = c.run("read", size=args.size, rounds=args.rounds)["mbps"]
        started = time.monotonic()
        c.join(hosts[3])
        done = c.run("wait-join", node=hosts[3])
        after = c.run("read", size=args.size, rounds=args.rounds)["mbps"]
    finally:
        c.stop()
    return {
        "before_mbps": before,
        "after_mbps": after,
        "before_scaling": before / (3 * one),
        "after_scaling": after / (4 * one),
        "move_s": done["at"] - started,
        "moved_bytes": done["received"],
        "data_bytes": 2 * parse_size(args.size),
    }


def replication_cost(
    net: Network, hosts: list[str], tmp: Path, shard: int, args: argparse.Namespace
) -> dict:
    """Write, accumulate and read throughput of 4 daemons with one copy and with two."""
    cost = {}
    for r in (1, 2):
        c = Cluster(net, hosts, r, tmp / f"r{r}", shard)
        try:
            cost[r] = {
                op: c.run(op, size=args.size, rounds=args.rounds)["mbps"]
                for op in ("write", "accumulate", "read")
            }
        finally:
            c.stop()
    return {
        "r1_mbps": cost[1],
        "r2_mbps": cost[2],
        "r2_over_r1": {op: cost[2][op] / cost[1][op] for op in cost[1]},
    }


def failover(
    net: Network, hosts: list[str], tmp: Path, shard: int, args: argparse.Namespace
) -> list[float]:
    """The longest wait between acknowledged accumulates around a kill -9 of the primary."""
    gaps = []
    for k in range(args.kills):
        c = Cluster(net, hosts, 2, tmp / f"f{k}", shard)
        try:
            victim = c.config.primary_for(tensor_key("bench/f"), 0).name
            argv = [sys.executable, ME, "--worker", "stream", "--config", str(c.path),
                    "--seconds", str(args.seconds)]  # fmt: skip
            proc = net.run("client", argv, stdout=subprocess.PIPE)
            time.sleep(args.seconds / 3)
            killed = time.monotonic()
            c.procs[victim].kill()
            out, _ = proc.communicate(timeout=args.seconds + 60)
            times = json.loads(out.decode().splitlines()[-1])["times"]
            # The longest wait between acknowledgements from just before the
            # kill on (an ack in flight at the kill may arrive after it).
            around = [t for t in times if t > killed - 0.5]
            gaps.append(max(b - a for a, b in itertools.pairwise(around)))
        finally:
            c.stop()
    return gaps


def report(results: dict, args: argparse.Namespace) -> None:
    one = results["iperf3_one_link_mbps"]
    print(f"links shaped to {args.rate}; iperf3 through one link: {one:.0f} MB/s")
    if "read_scaling" in results and len(results["read_mbps"]) > 1:
        print("reads through AsyncClient and through the blocking Client, each against "
              "N x its own one-daemon rate")  # fmt: skip
        print(f"{'daemons':>8} {'copies':>7} {'async MB/s':>11} {'/ (N x one)':>12} "
              f"{'Client MB/s':>12} {'/ (N x one)':>12} "
              f"{'async / (N x iperf3)':>21} {'placement balance':>18}")  # fmt: skip
        for k, v in results["read_mbps"].items():
            n, r = (int(x) for x in k.split("/"))
            bal = results["placement_balance"][k]
            b = results["blocking_read_mbps"][k]
            print(f"{n:>8} {r:>7} {v:>11.0f} {results['read_scaling'][k]:>12.2f} "
                  f"{b:>12.0f} {results['blocking_read_scaling'][k]:>12.2f} "
                  f"{v / (n * one):>21.2f} {bal:>18.2f}")  # fmt: skip
    if "r1_mbps" in results:
        print(f"\n{'op':>12} {'R=1 MB/s':>10} {'R=2 MB/s':>10} {'R=2 / R=1':>10}")
        for op in results["r1_mbps"]:
            r1, r2 = results["r1_mbps"][op], results["r2_mbps"][op]
            print(f"{op:>12} {r1:>10.0f} {r2:>10.0f} {r2 / r1:>10.2f}")
    if "failover_s" in results:
        gaps = results["failover_s"]
        print(f"\nwrites resumed after kill -9 of the primary: "
              f"{', '.join(f'{g:.2f}' for g in gaps)} s"
              f" (median {statistics.median(gaps):.2f} s, target 2 s)")  # fmt: skip
    if "join" in results:
        j = results["join"]
        single = results["read_mbps"]["1/1"]
        print(
            f"\na 4th daemon joins 3 (two copies, etcd); one daemon alone reads {single:.0f} MB/s"
        )
        print(f"{'':>14} {'read MB/s':>10} {'/ (N x one)':>12}")
        print(f"{'before (N=3)':>14} {j['before_mbps']:>10.0f} {j['before_scaling']:>12.2f}")
        print(f"{'after (N=4)':>14} {j['after_mbps']:>10.0f} {j['after_scaling']:>12.2f}"
              "   (target 0.9)")  # fmt: skip
        print(f"the move: {j['moved_bytes'] / 2**20:.1f} MiB of {j['data_bytes'] / 2**20:.0f} MiB "
              f"of copies ({j['moved_bytes'] / j['data_bytes']:.2f}; ideal 0.25) "
              f"in {j['move_s']:.2f} s from the start of psd to the switch")  # fmt: skip


if __name__ == "__main__":
    main()
