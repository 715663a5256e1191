"""A client process for the ``irdma local`` supervision tests.

``accumulate``: adds distinct whole numbers (``--base``, ``--base + 1``, ...)
to a tensor until ``--stop`` exists, so a lost or doubled update shows in
the sum. Each outcome is one flushed line on stdout, which the test reads
as it goes (to order the fault after progress, not after a sleep):
``ok VALUE TIME`` or ``failed VALUE ERROR``, then ``done``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from irdma import Client
from irdma.errors import IrdmaError


def accumulate(args: argparse.Namespace) -> None:
    stop = Path(args.stop)
    with Client(args.config) as client:
        info = client.stat(args.tensor)
        ones = np.ones(info.shape, dtype=info.dtype)
        value = args.base
        while not stop.exists():
            try:
                client.accumulate(args.tensor, ones, alpha=float(value))
            except IrdmaError as exc:
                print(f"failed {value} {type(exc).__name__}: {exc}", flush=True)
            else:
                print(f"ok {value} {time.monotonic()}", flush=True)
            value += 1
    print("done", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("accumulate")
    a.add_argument("--config", required=True)
    a.add_argument("--tensor", required=True)
    a.add_argument("--base", type=int, required=True)
    a.add_argument("--stop", required=True, help="stop once this file exists")
    args = parser.parse_args()
    accumulate(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
