#!/usr/bin/env python3
"""How fast a large one-sided read can copy shards out of an arena, by strategy.

    python bench/copies.py [--size 256MiB] [--shard 4MiB] [--rounds 7]

A one-sided read of a large tensor copies it shard by shard out of the
daemon's arena (the shards are not next to each other there). Measured in
one run, each the median of --rounds, as GB/s and as a ratio to one
``np.copyto`` of the whole size (glibc switches to non-temporal stores for
copies above its threshold, about 3/4 of the last-level cache per thread):

- ``one copy``: the reference, one ``np.copyto`` of ``size`` bytes;
- ``by shard``: ``size / shard`` copies of ``shard`` bytes, in order (what a
  read does today);
- ``by shard, 2 threads``: the same copies split over two threads (numpy
  releases the GIL while it copies);
- ``by shard, non-temporal``: the shard copies in a process started with
  ``GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=<shard>``, so glibc
  uses non-temporal stores for them too.

The destination is touched first (as a caller's array is), the source is a
shuffled set of shard-sized blocks of one larger buffer (as an arena is).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(text: str) -> int:
    for unit, mult in UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


def arena_blocks(size: int, shard: int) -> tuple[np.ndarray, list[int]]:
    """A buffer twice ``size`` and the shuffled offsets of ``size / shard`` blocks in it."""
    arena = np.ones(2 * size, np.uint8)
    offsets = [2 * i * shard for i in range(size // shard)]
    np.random.default_rng(0).shuffle(offsets)
    return arena, offsets


def timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def by_shard(dst: np.ndarray, arena: np.ndarray, offsets: list[int], shard: int) -> None:
    for i, off in enumerate(offsets):
        np.copyto(dst[i * shard : (i + 1) * shard], arena[off : off + shard])


def by_shard_threads(dst: np.ndarray, arena: np.ndarray, offsets: list[int], shard: int) -> None:
    half = len(offsets) // 2

    def part(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            off = offsets[i]
            np.copyto(dst[i * shard : (i + 1) * shard], arena[off : off + shard])

    t = threading.Thread(target=part, args=(0, half))
    t.start()
    part(half, len(offsets))
    t.join()


def measure(size: int, shard: int, rounds: int, only_shard: bool) -> dict[str, float]:
    dst = np.ones(size, np.uint8)
    arena, offsets = arena_blocks(size, shard)
    out = {"by shard": timed(lambda: by_shard(dst, arena, offsets, shard), rounds)}
    if only_shard:
        return out
    src = np.ones(size, np.uint8)
    out["one copy"] = timed(lambda: np.copyto(dst, src), rounds)
    out["by shard, 2 threads"] = timed(lambda: by_shard_threads(dst, arena, offsets, shard), rounds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--shard", default="4MiB")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only-shard", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    size, shard = parse_size(args.size), parse_size(args.shard)
    results = measure(size, shard, args.rounds, args.only_shard)
    if args.only_shard:
        print(json.dumps(results))
        return
    env = {**os.environ, "GLIBC_TUNABLES": f"glibc.cpu.x86_non_temporal_threshold={shard}"}
    child = subprocess.run(
        [
            sys.executable,
            __file__,
            "--size",
            args.size,
            "--shard",
            args.shard,
            "--rounds",
            str(args.rounds),
            "--only-shard",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    results["by shard, non-temporal"] = json.loads(child.stdout)["by shard"]
    ref = results["one copy"]
    print(f"{args.size} in {args.shard} pieces, median of {args.rounds}")
    print(f"{'strategy':28} {'GB/s':>7} {'x one copy':>11}")
    for name in ("one copy", "by shard", "by shard, 2 threads", "by shard, non-temporal"):
        t = results[name]
        print(f"{name:28} {size / t / 1e9:7.2f} {ref / t:11.2f}")


if __name__ == "__main__":
    main()
