#!/usr/bin/env python3
"""A short data-parallel training run through irdma (parameter-server style).

N worker processes fit a linear model to their own shard of synthetic data:
each step a worker pulls the weights, computes its gradient and pushes it
with ``accumulate(w, grad, alpha=-lr/N)``; the daemons apply the updates
(asynchronous, Hogwild-style). The run fails (exit 1) unless the weights
converge to the ones that generated the data. It also says how the pulls
went: one-sided (copied out of a same-host daemon's memory after a version
check), and how many of those met the tensor changing under them so often
(an accumulate from another worker) that they asked the daemon instead.

    python bench/train_linear.py [--config FILE] [--workers 2] [--steps 200]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

import numpy as np

from irdma import Client

FEATURES = 256
SAMPLES_PER_WORKER = 2000


def true_weights() -> np.ndarray:
    return np.random.default_rng(1234).standard_normal(FEATURES).astype(np.float32)


def worker(
    config: str | None, rank: int, workers: int, steps: int, lr: float, counts: mp.Queue
) -> None:
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((SAMPLES_PER_WORKER, FEATURES)).astype(np.float32)
    y = x @ true_weights() + 0.01 * rng.standard_normal(SAMPLES_PER_WORKER).astype(np.float32)
    w = np.empty(FEATURES, np.float32)
    with Client(config) as client:
        for _ in range(steps):
            client.read("train/linear/w", out=w)
            grad = x.T @ (x @ w - y) / SAMPLES_PER_WORKER
            client.accumulate("train/linear/w", grad, alpha=-lr / workers)
        conns = client.async_client.session.conns.values()
        readers = [r for c in conns if (r := getattr(c.bulk, "directory", None)) is not None]
        counts.put(
            (
                sum(r.reads for r in readers),
                sum(r.retries for r in readers),
                sum(r.contended for r in readers),
            )
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="cluster config (default: $IRDMA_CONFIG)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()
    with Client(args.config) as client:
        client.write("train/linear/w", np.zeros(FEATURES, np.float32), replace=True)
        t = time.perf_counter()
        ctx = mp.get_context("spawn")
        counts = ctx.Queue()
        procs = [
            ctx.Process(
                target=worker, args=(args.config, r, args.workers, args.steps, args.lr, counts)
            )
            for r in range(args.workers)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        seconds = time.perf_counter() - t
        if any(p.exitcode for p in procs):
            print("train_linear: a worker failed", file=sys.stderr)
            return 1
        pulls = [counts.get(timeout=10) for _ in procs]
        w = client.read("train/linear/w")
    error = float(np.linalg.norm(w - true_weights()) / np.linalg.norm(true_weights()))
    updates = args.workers * args.steps
    print(
        f"train_linear: {args.workers} workers x {args.steps} steps in {seconds:.2f} s "
        f"({updates / seconds:.0f} pushes/s); relative weight error {error:.4f}"
    )
    one_sided, retries, asked = (sum(c[i] for c in pulls) for i in range(3))
    print(
        f"train_linear: {updates} pulls: {one_sided} one-sided, {asked} asked the daemon after "
        f"repeated changes ({retries} version checks failed in all)"
    )
    if error > 0.01:
        print("train_linear: did not converge", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
