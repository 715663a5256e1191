#!/usr/bin/env python3
"""Replication's costs and scaling, with each daemon on a namespace host of its own.

Three measurements, all in one run (as root; hosts from ``tests/netns.py``):

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
from tests.netns import Network  # noqa: E402

PORT = 7400
ME = str(Path(__file__).resolve())


# -- the worker side (runs inside the client's namespace) ------------------------------


def worker(args: argparse.Namespace) -> None:
    from irdma import Client

    size = parse_size(args.size)
    with Client(args.config) as client:
        if args.op == "ready":
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if all(client.hello(n).get("ready") for n in client.config.nodes):
                        break
                except Exception:
                    pass
                time.sleep(0.05)
            print(json.dumps({"ok": True}))
            return
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
        print(json.dumps({"mbps": size / statistics.median(times) / 1e6}))


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
        self, net: Network, hosts: list[str], replicas: int, tmp: Path, shard_size: int
    ) -> None:
        self.net = net
        self.hosts = hosts
        tmp.mkdir(parents=True, exist_ok=True)
        nodes = [(h, f"tcp://{net.address(h)}:{PORT}", str(tmp / h), 512 << 20) for h in hosts]
        self.path = tmp / f"cluster-{len(hosts)}-{replicas}.toml"
        self.path.write_text(
            render_config(nodes, shard_size=shard_size, replicas=replicas, timeout=5.0)
        )
        self.config = load_config(self.path)
        self.procs = {
            h: net.run(
                h,
                [sys.executable, "-m", "irdma_psd.main", "--config", str(self.path),
                 "--node", h, "--log-level", "WARNING"],
                log=tmp / f"{h}.log",
            )
            for h in hosts
        }  # fmt: skip
        self.run("ready")

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
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.worker:
        if args.worker == "stream":
            stream(args)
        else:
            args.op = args.worker
            worker(args)
        return

    hosts = ["h1", "h2", "h3", "h4"]
    shard = parse_size(args.shard_size)
    results: dict = {"rate": args.rate, "size": args.size, "shard_size": shard}
    with tempfile.TemporaryDirectory() as d, Network([*hosts, "client"]) as net:
        tmp = Path(d)
        # 1. read scaling over shaped links
        for h in hosts:
            net.shape(h, rate=args.rate)
        results["iperf3_one_link_mbps"] = iperf(net, "h1")
        scaling: dict[str, float] = {}
        balance: dict[str, float] = {}
        for n, r in ((1, 1), (2, 1), (4, 1), (2, 2), (4, 2)):
            c = Cluster(net, hosts[:n], r, tmp / f"s{n}-{r}", shard)
            try:
                scaling[f"{n}/{r}"] = c.run("read", size=args.size, rounds=args.rounds)["mbps"]
                # With one copy, the daemon with the most shards sets the pace.
                count = parse_size(args.size) // shard
                per = [0] * n
                for i in range(count):
                    per[hosts.index(c.config.primary_for(tensor_key("bench/t"), i).name)] += 1
                balance[f"{n}/{r}"] = (count / n) / max(per) if r == 1 else 1.0
            finally:
                c.stop()
        one = scaling["1/1"]
        results["read_mbps"] = scaling
        results["placement_balance"] = balance
        results["read_scaling"] = {k: v / (int(k.split("/")[0]) * one) for k, v in scaling.items()}
        for h in hosts:
            net.shape(h)
        # 2. R=2 against R=1, unshaped
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
        results["r1_mbps"], results["r2_mbps"] = cost[1], cost[2]
        results["r2_over_r1"] = {op: cost[2][op] / cost[1][op] for op in cost[1]}
        # 3. failover after SIGKILL of the primary
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
        results["failover_s"] = gaps
    if args.json:
        print(json.dumps(results, indent=2))
        return
    one = results["iperf3_one_link_mbps"]
    print(f"links shaped to {args.rate}; iperf3 through one link: {one:.0f} MB/s")
    print(f"{'daemons':>8} {'copies':>7} {'read MB/s':>10} {'/ (N x one)':>12} "
          f"{'/ (N x iperf3)':>15} {'placement balance':>18}")  # fmt: skip
    for k, v in results["read_mbps"].items():
        n, r = (int(x) for x in k.split("/"))
        bal = results["placement_balance"][k]
        print(f"{n:>8} {r:>7} {v:>10.0f} {results['read_scaling'][k]:>12.2f} "
              f"{v / (n * one):>15.2f} {bal:>18.2f}")  # fmt: skip
    print(f"\n{'op':>12} {'R=1 MB/s':>10} {'R=2 MB/s':>10} {'R=2 / R=1':>10}")
    for op in results["r1_mbps"]:
        r1, r2 = results["r1_mbps"][op], results["r2_mbps"][op]
        print(f"{op:>12} {r1:>10.0f} {r2:>10.0f} {r2 / r1:>10.2f}")
    gaps = results["failover_s"]
    print(f"\nwrites resumed after kill -9 of the primary: {', '.join(f'{g:.2f}' for g in gaps)} s"
          f" (median {statistics.median(gaps):.2f} s, target 2 s)")  # fmt: skip


if __name__ == "__main__":
    main()
