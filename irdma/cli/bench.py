"""``irdma bench``: read, write and accumulate throughput and small-tensor latency.

Measured with the async client in this process against the configured
cluster. Throughput is the median of ``repeat`` runs of one tensor of
``size`` bytes (float32); latency is the median and 99th percentile of
round trips on a 4 KiB tensor. The table says how many copies of each shard
the cluster keeps: with two, every write and accumulate waits for the backup.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from typing import Any

import numpy as np

from ..client import AsyncClient

SMALL_BYTES = 4096


def _median_rate(nbytes: int, seconds: list[float]) -> float:
    return nbytes / statistics.median(seconds) / 1e9


async def _timed(fn: Any, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - t)
    return times


async def run(
    client: AsyncClient, size: int = 256 << 20, repeat: int = 5, latency_iters: int = 2000
) -> dict[str, Any]:
    """Run the benchmark; return the figures as a dict (GB/s = 1e9 bytes/s)."""
    prefix = f"_bench/{os.getpid()}"
    big, small = f"{prefix}/big", f"{prefix}/small"
    n = max(1, size // 4)
    data = np.random.default_rng(1).random(n, dtype=np.float32)
    out = np.empty_like(data)
    nbytes = data.nbytes
    try:
        await client.write(big, data)  # creates it and warms the daemons' arenas
        write_t = await _timed(lambda: client.write(big, data), repeat)
        read_t = await _timed(lambda: client.read(big, out=out), repeat)
        if not np.array_equal(out, data):
            raise AssertionError("bench read back different bytes than it wrote")
        acc_t = await _timed(lambda: client.accumulate(big, data, alpha=0.0), repeat)

        tiny = np.arange(SMALL_BYTES // 4, dtype=np.float32)
        tiny_out = np.empty_like(tiny)
        await client.write(small, tiny)
        await client.read(small, out=tiny_out)
        read_lat = await _timed(lambda: client.read(small, out=tiny_out), latency_iters)
        write_lat = await _timed(lambda: client.write(small, tiny), latency_iters)
        acc_lat = await _timed(lambda: client.accumulate(small, tiny, alpha=0.0), latency_iters)
    finally:
        for name in (big, small):
            with contextlib.suppress(Exception):
                await client.delete(name)
    return {
        "size_bytes": nbytes,
        "repeat": repeat,
        "nodes": len(client.config.nodes),
        "replicas": client.config.replicas,
        "write_GBps": _median_rate(nbytes, write_t),
        "read_GBps": _median_rate(nbytes, read_t),
        "accumulate_GBps": _median_rate(nbytes, acc_t),
        "read_4KiB_us_median": statistics.median(read_lat) * 1e6,
        "read_4KiB_us_p99": float(np.percentile(read_lat, 99)) * 1e6,
        "write_4KiB_us_median": statistics.median(write_lat) * 1e6,
        "write_4KiB_us_p99": float(np.percentile(write_lat, 99)) * 1e6,
        "accumulate_4KiB_us_median": statistics.median(acc_lat) * 1e6,
        "accumulate_4KiB_us_p99": float(np.percentile(acc_lat, 99)) * 1e6,
    }


def format_table(r: dict[str, Any]) -> str:
    mib = r["size_bytes"] / (1 << 20)
    rows = [
        ("write", f"{mib:.0f} MiB", f"{r['write_GBps']:.2f} GB/s"),
        ("read", f"{mib:.0f} MiB", f"{r['read_GBps']:.2f} GB/s"),
        ("accumulate", f"{mib:.0f} MiB", f"{r['accumulate_GBps']:.2f} GB/s"),
        (
            "read",
            "4 KiB",
            f"{r['read_4KiB_us_median']:.0f} us median, {r['read_4KiB_us_p99']:.0f} us p99",
        ),
        (
            "write",
            "4 KiB",
            f"{r['write_4KiB_us_median']:.0f} us median, {r['write_4KiB_us_p99']:.0f} us p99",
        ),
        (
            "accumulate",
            "4 KiB",
            f"{r['accumulate_4KiB_us_median']:.0f} us median, "
            f"{r['accumulate_4KiB_us_p99']:.0f} us p99",
        ),
    ]
    lines = [f"{'op':<11} {'size':>9}  result", "-" * 48]
    lines += [f"{op:<11} {size:>9}  {res}" for op, size, res in rows]
    copies = "1 copy" if r["replicas"] == 1 else f"{r['replicas']} copies"
    lines.append(f"({r['nodes']} daemons, {copies} of each shard, median of {r['repeat']} runs)")
    return "\n".join(lines)
