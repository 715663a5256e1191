#!/usr/bin/env python3
"""The mount's small operations, both sessions against tmpfs: one run, one cluster.

Starts ``irdma local`` (3 daemons) and ``irdma mount`` twice (pyfuse3, and
``--session own``), then times, in interleaved rounds on each mount and on a
tmpfs directory (the kernel's own filesystem, what no FUSE filesystem beats):

- ``os.stat`` of a 4 KB ``.npy`` file, and of a name that does not exist;
- ``open`` + ``close`` of it for reading;
- creating a new empty file (``open(O_CREAT | O_EXCL)`` + ``close``);
- ``np.save`` and ``np.load`` of it;
- ``os.stat`` and ``np.load`` of a file in a directory of ``--many`` tensors
  (a lookup must not cost more in a larger directory), and ``ls -l`` of
  that directory (one ``readdir`` and a ``stat`` of every entry).

Prints the median of each in ms, as a multiple of tmpfs's, and the own
session's time over pyfuse3's. Run as root (FUSE), on a quiet machine.

    python bench/fuse_small.py [--calls 40] [--rounds 3] [--many 10000] [--json]
"""

from __future__ import annotations

import argparse
import itertools
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

from fuse import Target, irdma_mount, run_timed, stop, timed  # bench/fuse.py

SMALL = np.arange(1024, dtype=np.float32)  # 4 KiB of data, a 4224-byte file
MOUNTS = {"pyfuse3": (), "own": ("--session", "own")}
LISTINGS = 1  # ls -l of the big directory per round (each lists every entry)


def median_ms(fn: Callable[[], object], calls: int) -> float:
    return statistics.median(timed(fn) for _ in range(calls)) * 1e3


def create(directory: Path, numbers: itertools.count) -> Callable[[], None]:
    def make() -> None:
        path = directory / f"new-{next(numbers)}.bin"
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))

    return make


def operations(root: Path, numbers: itertools.count) -> dict[str, Callable[[], object]]:
    f, many = root / "small" / "s.npy", root / "many" / "t7.npy"
    return {
        "stat": lambda: os.stat(f),
        "stat missing": lambda: os.path.exists(root / "small" / "missing.npy"),
        "open+close": lambda: os.close(os.open(f, os.O_RDONLY)),
        "create": create(root / "new", numbers),
        "np.save": lambda: np.save(f, SMALL),
        "np.load": lambda: np.load(f),
        "stat in big dir": lambda: os.stat(many),
        "np.load in big dir": lambda: np.load(many),
    }


def fill(root: Path, many: int, client: Client | None) -> None:
    """The files each round uses: a small one, and a directory of ``many``."""
    for d in ("small", "new"):
        (root / d).mkdir(exist_ok=True)
    np.save(root / "small" / "s.npy", SMALL)
    if client is None:  # tmpfs
        (root / "many").mkdir(exist_ok=True)
        for i in range(many):
            np.save(root / "many" / f"t{i}.npy", SMALL[:16])
    else:  # the client is quicker at many tensors than a mount
        client.write_many({f"bench/many/t{i}": SMALL[:16] for i in range(many)})


def measure(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="irdma-fusesmall-"))
    shm = Path(tempfile.mkdtemp(prefix="irdma-fusesmall-", dir="/dev/shm"))
    local, config = start_local(tmp, 3, "256MiB")
    res: dict[str, list[float]] = {}
    targets: list[Target] = []
    try:
        for name, extra in MOUNTS.items():
            targets.append(irdma_mount(config, tmp / f"mnt-{name}", name, *extra))
        roots = {t.name: t.files("") for t in targets} | {"tmpfs": shm}
        with Client(config) as client:  # both mounts show the same files
            fill(roots["own"], args.many, client)
        fill(roots["tmpfs"], args.many, None)
        numbers = itertools.count()
        for r in range(1 + args.rounds):  # the first round is not counted
            for where, root in roots.items():
                for op, fn in operations(root, numbers).items():
                    ms = median_ms(fn, args.calls)
                    if r:
                        res.setdefault(f"{where} {op}", []).append(ms)
                ls = ["ls", "-l", str(root / "many")]
                listed = statistics.median(run_timed(ls) for _ in range(LISTINGS))
                if r:
                    res.setdefault(f"{where} ls -l", []).append(listed * 1e3)
                for new in (root / "new").iterdir():
                    new.unlink()
    finally:
        for t in targets:
            stop(t)
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
    ap.add_argument("--many", type=int, default=10000, help="tensors in the big directory")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    ms = result["ms"]
    print(
        f"irdma mount small operations vs tmpfs, 3 daemons, {args.many} tensors in the big "
        f"directory, median of {args.calls} calls ({LISTINGS} for ls -l), median of "
        f"{args.rounds} rounds"
    )
    ops = [*operations(Path(), itertools.count()), "ls -l"]
    for op in ops:
        py, own, tmpfs = (ms[f"{w} {op}"] for w in ("pyfuse3", "own", "tmpfs"))
        print(
            f"  {op:<20} pyfuse3 {py:8.3f} ms ({py / tmpfs:6.1f}x tmpfs)   own {own:8.3f} ms "
            f"({own / tmpfs:6.1f}x tmpfs)   tmpfs {tmpfs:7.3f} ms   own / pyfuse3 {own / py:5.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
