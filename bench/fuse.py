#!/usr/bin/env python3
"""The mount against the client: the same 256 MiB tensor, the same cluster, one run.

Starts ``irdma local`` and ``irdma mount`` (default, page-cache mode) and
measures, in interleaved rounds: the client's read and write; ``np.save`` and
``np.load`` through the mount; ``dd`` with 4 MiB blocks in and out of the
mount; and a re-read of an unchanged file (served by the page cache) against
a plain memory copy. The same steps also run against ``fuse_ceiling.py``
(pyfuse3 serving one file from memory, with the same options): what any
pyfuse3 filesystem can reach here. Prints medians and ratios against the
client and against that ceiling. Run as root (FUSE).

    python bench/fuse.py [--size 256MiB] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
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

from irdma.client import AsyncClient
from irdma.cluster import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parent))
from link import start_local


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def dd(src: Path, dst: Path) -> float:
    return timed(
        lambda: subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=4M", "status=none"], check=True)
    )


def start_mount(command: list[str], where: Path, what: str) -> subprocess.Popen:
    """Run a FUSE server and wait (30 s at most) until ``where`` is mounted."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not where.is_mount():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"{what} did not come up")
        time.sleep(0.05)
    return proc


def mount(config: Path, where: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "irdma.cli", "--config", str(config), "mount", str(where)]
    return start_mount([*command, "--foreground"], where, "irdma mount")


def mount_ceiling(where: Path, capacity: int) -> subprocess.Popen:
    script = Path(__file__).with_name("fuse_ceiling.py")
    command = [sys.executable, str(script), str(where), "--capacity", str(capacity)]
    return start_mount(command, where, "the pyfuse3 ceiling mount")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    size = parse_size(args.size)
    tmp = Path(tempfile.mkdtemp(prefix="irdma-fusebench-"))
    shm = Path(tempfile.mkdtemp(prefix="irdma-fusebench-", dir="/dev/shm"))
    arena = f"{max(64, 3 * size // 3 // (1 << 20) + 64)}MiB"
    local, config = start_local(tmp, 3, arena)
    mnt = tmp / "mnt"
    mnt.mkdir()
    fuse = mount(config, mnt)
    ceil = tmp / "ceiling"
    ceil.mkdir()
    ceiling = mount_ceiling(ceil, 2 * size + (1 << 20))
    res: dict[str, list[float]] = {
        k: []
        for k in (
            "client_write",
            "client_read",
            "np_save",
            "np_load",
            "dd_write",
            "dd_read",
            "page_cache_reread",
            "memory_copy",
            "ceiling_np_save",
            "ceiling_np_load",
            "ceiling_dd_write",
            "ceiling_dd_read",
        )
    }
    try:
        (mnt / "bench").mkdir()
        rng = np.random.default_rng(0)
        arrays = [rng.random(size // 4, dtype=np.float32) for _ in range(2)]
        out = np.empty_like(arrays[0])
        local_npy = shm / "x.npy"
        np.save(local_npy, arrays[1])

        async def client_round() -> tuple[float, float]:
            async with AsyncClient(config, timeout=60) as c:
                await c.write("bench/c", arrays[0])
                t = time.perf_counter()
                await c.write("bench/c", arrays[1])
                w = time.perf_counter() - t
                t = time.perf_counter()
                await c.read("bench/c", out=out)
                return w, time.perf_counter() - t

        for r in range(args.rounds):
            w, rd = trio.run(client_round)
            res["client_write"].append(w)
            res["client_read"].append(rd)
            a = arrays[r % 2]
            res["np_save"].append(timed(lambda a=a: np.save(mnt / "bench" / "f.npy", a)))
            res["np_load"].append(timed(lambda: np.load(mnt / "bench" / "f.npy")))
            res["dd_write"].append(dd(local_npy, mnt / "bench" / "g.npy"))
            np.save(mnt / "bench" / "g.npy", arrays[(r + 1) % 2])  # new version: cold cache
            res["dd_read"].append(dd(mnt / "bench" / "g.npy", Path("/dev/null")))
            res["page_cache_reread"].append(dd(mnt / "bench" / "g.npy", Path("/dev/null")))
            # The same on the pyfuse3 ceiling (keep_cache off: every open is cold).
            res["ceiling_np_save"].append(timed(lambda a=a: np.save(ceil / "data.npy", a)))
            res["ceiling_np_load"].append(timed(lambda: np.load(ceil / "data.npy")))
            res["ceiling_dd_write"].append(dd(local_npy, ceil / "data.npy"))
            res["ceiling_dd_read"].append(dd(ceil / "data.npy", Path("/dev/null")))
            dst = np.empty_like(a)
            dst[:] = 0
            res["memory_copy"].append(timed(lambda a=a, dst=dst: np.copyto(dst, a)))
    finally:
        for proc in (fuse, ceiling):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        local.send_signal(signal.SIGTERM)
        local.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)

    gbps = {k: size / statistics.median(v) / 1e9 for k, v in res.items()}
    ratios = {
        "np_load/client_read": gbps["np_load"] / gbps["client_read"],
        "dd_read/client_read": gbps["dd_read"] / gbps["client_read"],
        "np_save/client_write": gbps["np_save"] / gbps["client_write"],
        "dd_write/client_write": gbps["dd_write"] / gbps["client_write"],
        "page_cache_reread/memory_copy": gbps["page_cache_reread"] / gbps["memory_copy"],
        # What the mount reaches of what pyfuse3 can give at all on this machine.
        "np_load/ceiling_np_load": gbps["np_load"] / gbps["ceiling_np_load"],
        "dd_read/ceiling_dd_read": gbps["dd_read"] / gbps["ceiling_dd_read"],
        "np_save/ceiling_np_save": gbps["np_save"] / gbps["ceiling_np_save"],
        "dd_write/ceiling_dd_write": gbps["dd_write"] / gbps["ceiling_dd_write"],
        # The most the target ratio could be, were the mount as fast as pyfuse3 itself.
        "ceiling_dd_read/client_read": gbps["ceiling_dd_read"] / gbps["client_read"],
        "ceiling_dd_write/client_write": gbps["ceiling_dd_write"] / gbps["client_write"],
    }
    if args.json:
        print(
            json.dumps(
                {"size_bytes": size, "GBps": gbps, "ratios": ratios, "rounds": args.rounds},
                indent=2,
            )
        )
        return 0
    print(
        f"mount vs client, {size / (1 << 20):.0f} MiB, 3 daemons, page-cache mode, "
        f"median of {args.rounds} rounds (GB/s = 1e9 B/s)"
    )
    for k, v in gbps.items():
        print(f"  {k:<20} {v:6.2f} GB/s")
    for k, v in ratios.items():
        print(f"  {k:<30} {v:5.2f}")
    print("targets: mount read and write >= 0.70 of the client; page-cache re-read near memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
