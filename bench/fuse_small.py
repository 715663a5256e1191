#!/usr/bin/env python3
"""The mount's small operations, against tmpfs: one run, one cluster.

Starts ``irdma local`` (3 daemons) and ``irdma mount``, then times, in
interleaved rounds on the mount and on a tmpfs directory (the kernel's own
filesystem, what no FUSE filesystem beats):

- ``os.stat`` of a 4 KB ``.npy`` file, and of a name that does not exist;
- ``open`` + ``close`` of it for reading;
- ``np.save`` and ``np.load`` of it;
- ``os.stat`` and ``np.load`` of a file in a directory of ``--many`` tensors
  (a lookup must not cost more in a larger directory).

Prints the median of each in ms and as a multiple of tmpfs's. Run as root
(FUSE), on a quiet machine.

    python bench/fuse_small.py [--calls 40] [--rounds 3] [--many 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from irdma import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from link import start_local

from fuse import irdma_mount, stop, timed  # bench/fuse.py

SMALL = np.arange(1024, dtype=np.float32)  # 4 KiB of data, a 4224-byte file


def median_ms(fn: Callable[[], object], calls: int) -> float:
    return statistics.median(timed(fn) for _ in range(calls)) * 1e3


def operations(root: Path) -> dict[str, Callable[[], object]]:
    f, many = root / "small" / "s.npy", root / "many" / "t7.npy"
    return {
        "stat": lambda: os.stat(f),
        "stat missing": lambda: os.path.exists(root / "small" / "missing.npy"),
        "open+close": lambda: os.close(os.open(f, os.O_RDONLY)),
        "np.save": lambda: np.save(f, SMALL),
        "np.load": lambda: np.load(f),
        "stat in big dir": lambda: os.stat(many),
        "np.load in big dir": lambda: np.load(many),
    }


def fill(root: Path, many: int, client: Client | None) -> None:
    """The files each round uses: a small one, and a directory of ``many``."""
    (root / "small").mkdir(exist_ok=True)
    np.save(root / "small" / "s.npy", SMALL)
    if client is None:  # tmpfs
        (root / "many").mkdir(exist_ok=True)
        for i in range(many):
            np.save(root / "many" / f"t{i}.npy", SMALL[:16])
    else:  # the client is quicker at a thousand tensors than the mount
        for i in range(many):
            client.write(f"bench/many/t{i}", SMALL[:16])


def measure(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="irdma-fusesmall-"))
    shm = Path(tempfile.mkdtemp(prefix="irdma-fusesmall-", dir="/dev/shm"))
    local, config = start_local(tmp, 3, "64MiB")
    res: dict[str, list[float]] = {}
    target = None
    try:
        target = irdma_mount(config, tmp / "mnt")
        roots = {"mount": target.files(""), "tmpfs": shm}
        with Client(config) as client:
            fill(roots["mount"], args.many, client)
        fill(roots["tmpfs"], args.many, None)
        for r in range(1 + args.rounds):  # the first round is not counted
            for where, root in roots.items():
                for op, fn in operations(root).items():
                    ms = median_ms(fn, args.calls)
                    if r:
                        res.setdefault(f"{where} {op}", []).append(ms)
    finally:
        if target is not None:
            stop(target)
        local.send_signal(signal.SIGTERM)
        local.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    ms = {k: statistics.median(v) for k, v in res.items()}
    return {"many": args.many, "calls": args.calls, "rounds": args.rounds, "ms": ms}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=40, help="calls per median")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--many", type=int, default=1000, help="tensors in the big directory")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    ms = result["ms"]
    print(
        f"irdma mount small operations vs tmpfs, 3 daemons, {args.many} tensors in the big "
        f"directory, median of {args.calls} calls, median of {args.rounds} rounds"
    )
    for op in operations(Path()):
        mount, tmpfs = ms[f"mount {op}"], ms[f"tmpfs {op}"]
        print(f"  {op:<20} mount {mount:7.3f} ms   tmpfs {tmpfs:7.3f} ms   {mount / tmpfs:7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
