#!/usr/bin/env python3
"""What a second copy costs: writes and accumulates with one copy and with two, side by side.

    python bench/forwarding.py [--size 256MiB] [--repeat 5] [--small-ops 500]
                               [--transports shm,tcp] [--json out.json]

Starts two clusters of three local daemons (4 MiB shards), one keeping one copy
of each shard and one keeping two, and measures both in this one run with the
same client code (so the ratio holds on a shared, noisy machine): large write
and accumulate throughput (median of ``--repeat``) with the async client (as
``irdma bench``) and the blocking one (as ``bench/compare.py``), and single 4 KiB
writes and accumulates timed one by one (median and p99), and the daemons' CPU
time per MiB of each large op (steady where wall time is not, on a machine
shared with other work). Over shm, also large ops of an array already in the
client's shared memory (``Client.shared_empty``: no staging copy). Prints each
figure for R=1 and R=2 and R=2's share of R=1's speed (throughput) or its time
(latency) or CPU over R=1's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from irdma.cluster import parse_size  # noqa: E402
from tests.helpers.cluster import make_cluster  # noqa: E402

SMALL = 4096


def _median_rate(nbytes: int, seconds: list[float]) -> float:
    return nbytes / statistics.median(seconds) / 1e9


def _lat(times: list[float]) -> list[float]:
    times = sorted(times)
    return [statistics.median(times) * 1e6, times[int(len(times) * 0.99)] * 1e6]


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes have used so far (/proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def large_blocking(
    out: dict[str, Any], label: str, c: Any, data: np.ndarray, repeat: int, pids: list[int]
) -> None:
    """Time ``repeat`` large writes and accumulates of ``data`` by the blocking
    client ``c`` into ``out``, with the daemons' CPU per MiB."""
    for op, fn in (
        ("write", lambda: c.write("big", data)),
        ("accumulate", lambda: c.accumulate("big", data, alpha=0.0)),
    ):
        times = []
        cpu = cpu_seconds(pids)
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[f"{label} {op} GB/s"] = _median_rate(data.nbytes, times)
        mib = repeat * data.nbytes / (1 << 20)
        out[f"{label} {op} daemon CPU ms/MiB"] = (cpu_seconds(pids) - cpu) * 1e3 / mib


def worker(config: str, size: int, repeat: int, small_ops: int, pids: list[int]) -> dict[str, Any]:
    """Runs in a subprocess (transport from $IRDMA_TRANSPORT): the figures of one cluster.

    Besides wall time, the daemons' CPU time per MiB of each large op: what the
    copies cost the machine, which a shared machine's load does not change."""
    import trio

    from irdma import AsyncClient, Client

    data = np.random.default_rng(1).random(size // 4, dtype=np.float32)
    tiny = np.arange(SMALL // 4, dtype=np.float32)
    out: dict[str, Any] = {}

    async def run_async() -> None:
        async with AsyncClient(config, timeout=300) as c:
            await c.write("big", data)
            await c.write("tiny", tiny)
            for op, fn in (
                ("write", lambda: c.write("big", data)),
                ("accumulate", lambda: c.accumulate("big", data, alpha=0.0)),
            ):
                times = []
                cpu = cpu_seconds(pids)
                for _ in range(repeat):
                    t = time.perf_counter()
                    await fn()
                    times.append(time.perf_counter() - t)
                out[f"async {op} GB/s"] = _median_rate(data.nbytes, times)
                mib = repeat * data.nbytes / (1 << 20)
                out[f"async {op} daemon CPU ms/MiB"] = (cpu_seconds(pids) - cpu) * 1e3 / mib
            for op, fn in (
                ("write", lambda: c.write("tiny", tiny)),
                ("accumulate", lambda: c.accumulate("tiny", tiny, alpha=0.0)),
            ):
                times = []
                for _ in range(small_ops):
                    t = time.perf_counter()
                    await fn()
                    times.append(time.perf_counter() - t)
                out[f"async 4KiB {op} us"] = _lat(times)

    trio.run(run_async)
    with Client(config, timeout=300) as c:
        large_blocking(out, "blocking", c, data, repeat, pids)
        for op, bfn in (
            ("write", lambda: c.write("tiny", tiny)),
            ("accumulate", lambda: c.accumulate("tiny", tiny, alpha=0.0)),
        ):
            times = []
            for _ in range(small_ops):
                t = time.perf_counter()
                bfn()
                times.append(time.perf_counter() - t)
            out[f"blocking 4KiB {op} us"] = _lat(times)
        c.delete("big")
        c.delete("tiny")
    if os.environ.get("IRDMA_TRANSPORT") == "shm":
        # The array already in the client's shared memory (``shared_empty``): no
        # staging copy, so each copy a daemon makes is one of the op's only copies.
        with Client(config, timeout=300, shared_memory=data.nbytes + (64 << 20)) as c:
            shared = c.shared_empty(data.shape, data.dtype)
            shared[:] = data
            c.write("big", shared)
            large_blocking(out, "shared-memory", c, shared, repeat, pids)
            c.delete("big")
    return out


def measure(
    config: Path, pids: list[int], transport: str, args: argparse.Namespace
) -> dict[str, Any]:
    env = {**os.environ, "IRDMA_TRANSPORT": transport}
    cmd = [sys.executable, __file__, "--worker", str(config)]
    cmd += ["--pids", ",".join(map(str, pids))]
    cmd += ["--size", str(args.size), "--repeat", str(args.repeat)]
    cmd += ["--small-ops", str(args.small_ops)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--small-ops", type=int, default=500)
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--pids", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.size = parse_size(str(args.size))
    if args.worker:
        pids = [int(p) for p in args.pids.split(",") if p]
        print(json.dumps(worker(args.worker, args.size, args.repeat, args.small_ops, pids)))
        return 0
    # Each daemon holds up to 2/3 of the tensor with two copies, and copy-on-write
    # keeps the old blocks until readers let go: room for twice that.
    arena = max(256 << 20, int(args.size * 4 / 3) + (128 << 20))
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="irdma-fwd-") as tmp:
        clusters = {}
        try:
            for r in (1, 2):
                clusters[r] = make_cluster(
                    Path(tmp) / f"r{r}", 3, arena_size=arena, shard_size=4 << 20, replicas=r
                )
            for transport in args.transports.split(","):
                for r in (1, 2):
                    c = clusters[r]
                    pids = [c.pid(n) for n in c.names]
                    results[f"{transport} R={r}"] = measure(c.config_path, pids, transport, args)
        finally:
            for c in clusters.values():
                c.close()
    for transport in args.transports.split(","):
        one, two = results[f"{transport} R=1"], results[f"{transport} R=2"]
        print(f"-- {transport} ({args.size >> 20} MiB, 3 daemons)")
        for key in one:
            a, b = one[key], two[key]
            if "CPU" in key:
                print(f"{key:<36} R=1 {a:6.2f}  R=2 {b:6.2f}  R=2/R=1 {b / a:.2f}x")
            elif isinstance(a, list):
                print(
                    f"{key:<36} R=1 {a[0]:7.0f} us (p99 {a[1]:6.0f})  "
                    f"R=2 {b[0]:7.0f} us (p99 {b[1]:6.0f})  R=2/R=1 time {b[0] / a[0]:.2f}x"
                )
            else:
                print(f"{key:<36} R=1 {a:6.2f} GB/s  R=2 {b:6.2f} GB/s  R=2/R=1 {b / a:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
