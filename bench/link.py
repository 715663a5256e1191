#!/usr/bin/env python3
"""irdma against the link: iperf3 over loopback and irdma on the same machine, one run.

Starts ``irdma local`` (N daemons on loopback) and an iperf3 server, then
alternates rounds of iperf3 (one stream) and irdma read/write of one tensor
(default 256 MiB), so drift in the machine's speed hits both alike. Prints
medians and the ratio irdma / iperf3, plus numpy copy speed of the same size
(memory's limit), small-tensor latency, and how much memory the client added
beyond the arrays it was given (the client may hold at most one extra copy).

    python bench/link.py [--size 256MiB] [--nodes 3] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import trio

# A sibling script (bench/ is on sys.path when this runs as a script).
from compare import iperf3_round

from irdma.cli.bench import run as irdma_bench
from irdma.cli.local import free_ports
from irdma.client import AsyncClient
from irdma.cluster import parse_size


def numpy_copy(size: int, rounds: int) -> float:
    src = np.random.default_rng(0).random(size // 4, dtype=np.float32)
    dst = np.empty_like(src)
    dst[:] = 0
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return src.nbytes / statistics.median(times) / 1e9


def maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def start_local(directory: Path, nodes: int, arena: str) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "irdma",
            "local",
            "--nodes",
            str(nodes),
            "--dir",
            str(directory),
            "--arena",
            arena,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if not line:
        proc.kill()
        raise SystemExit("irdma local did not start")
    return proc, Path(line)


async def irdma_rounds(config: Path, size: int, rounds: int) -> list[dict]:
    results = []
    async with AsyncClient(config, timeout=60) as client:
        for _ in range(rounds):
            results.append(await irdma_bench(client, size=size, repeat=3, latency_iters=500))
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iperf-seconds", type=float, default=3.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    size = parse_size(args.size)
    if not shutil.which("iperf3"):
        raise SystemExit("iperf3 is not installed (apt-get install iperf3)")
    arena = f"{max(64, 3 * size // args.nodes // (1 << 20) + 64)}MiB"
    tmp = Path(tempfile.mkdtemp(prefix="irdma-bench-"))
    port = free_ports("127.0.0.1", 1)[0]
    iperf = subprocess.Popen(
        ["iperf3", "-s", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    local, config = start_local(tmp, args.nodes, arena)
    try:
        time.sleep(0.5)
        link, ours = [], []
        rss_before = maxrss_bytes()
        for _ in range(args.rounds):
            link.append(iperf3_round(port, args.iperf_seconds))
            ours.extend(trio.run(irdma_rounds, config, size, 1))
        # The bench holds two arrays of `size` (data and out); beyond that is the client's.
        client_extra = max(0, maxrss_bytes() - rss_before - 2 * size)
        mem = numpy_copy(size, 5)
    finally:
        local.send_signal(signal.SIGTERM)
        iperf.terminate()
        local.wait(20)
        iperf.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in ours)

    link_gbps = statistics.median(link)
    result = {
        "size_bytes": size,
        "nodes": args.nodes,
        "rounds": args.rounds,
        "iperf3_GBps": link_gbps,
        "numpy_copy_GBps": mem,
        "irdma_read_GBps": med("read_GBps"),
        "irdma_write_GBps": med("write_GBps"),
        "irdma_accumulate_GBps": med("accumulate_GBps"),
        "read_ratio_to_iperf3": med("read_GBps") / link_gbps,
        "write_ratio_to_iperf3": med("write_GBps") / link_gbps,
        "read_4KiB_us_median": med("read_4KiB_us_median"),
        "write_4KiB_us_median": med("write_4KiB_us_median"),
        "client_extra_memory_bytes": client_extra,
        "client_extra_memory_fraction_of_tensor": client_extra / size,
        "iperf3_rounds_GBps": link,
        "irdma_read_rounds_GBps": [r["read_GBps"] for r in ours],
        "irdma_write_rounds_GBps": [r["write_GBps"] for r in ours],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    mib = size / (1 << 20)
    print(
        f"irdma vs the link, {mib:.0f} MiB tensor, {args.nodes} daemons on loopback, "
        f"median of {args.rounds} interleaved rounds (GB/s = 1e9 B/s)"
    )
    print(f"{'what':<34}{'result':>14}{'ratio':>10}")
    print("-" * 58)
    rows = [
        ("iperf3, 1 stream (the link)", f"{link_gbps:.2f} GB/s", "1.00"),
        ("numpy copy (memory)", f"{mem:.2f} GB/s", f"{mem / link_gbps:.2f}"),
        (
            "irdma read",
            f"{result['irdma_read_GBps']:.2f} GB/s",
            f"{result['read_ratio_to_iperf3']:.2f}",
        ),
        (
            "irdma write",
            f"{result['irdma_write_GBps']:.2f} GB/s",
            f"{result['write_ratio_to_iperf3']:.2f}",
        ),
        (
            "irdma accumulate",
            f"{result['irdma_accumulate_GBps']:.2f} GB/s",
            f"{result['irdma_accumulate_GBps'] / link_gbps:.2f}",
        ),
        ("irdma 4 KiB read round trip", f"{result['read_4KiB_us_median']:.0f} us", ""),
        ("irdma 4 KiB write round trip", f"{result['write_4KiB_us_median']:.0f} us", ""),
        (
            "client memory beyond its arrays",
            f"{client_extra / (1 << 20):.1f} MiB",
            f"{client_extra / size:.2f}",
        ),
    ]
    for what, res, ratio in rows:
        print(f"{what:<34}{res:>14}{ratio:>10}")
    print(
        "targets: read and write >= 0.90 of iperf3; 4 KiB read < 150 us; "
        "client extra memory <= 1.00 x tensor"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
