"""Worker processes for tests/test_training.py: ``python -m tests.training_workers SCENARIO``.

Each reads its rank from RANK/WORLD_SIZE (as under torchrun), connects to the
cluster in $IRDMA_CONFIG, runs one scenario and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from irdma import Client
from irdma.errors import IrdmaError
from irdma.training.collectives import Group
from irdma.training.modes import Mode, worker_identity
from irdma.training.worker import Worker

SHAPES = {"a": (40_000,), "b": (3, 5)}  # "a" spans shards on several daemons
LR = 0.1


def gradient(rank: int, step: int, key: str) -> np.ndarray:
    rng = np.random.default_rng([rank, step, len(key), ord(key[0])])
    return rng.standard_normal(SHAPES[key]).astype(np.float32)


def initial() -> dict[str, np.ndarray]:
    return {
        k: np.linspace(-1, 1, int(np.prod(s)), dtype=np.float32).reshape(s)
        for k, s in SHAPES.items()
    }


def train(client: Client, model: str, mode: Mode, steps: int, die_at: int | None) -> dict:
    """Pull, push a known gradient, repeat; die (exit 3) before pushing step ``die_at``."""
    ident = worker_identity()
    w = Worker(client, model, mode)
    w.init(initial())
    w.pull(0)
    for step in range(steps):
        if ident.rank == die_at and step == die_at:
            sys.stdout.flush()
            os._exit(3)
        w.push({k: gradient(ident.rank, step, k) for k in SHAPES}, step, LR)
        w.pull(step + 1)
    return {"rank": ident.rank, "steps": steps}


def count(client: Client, model: str, mode: Mode, steps: int) -> dict:
    """Accumulate ones ``steps`` times (int64: the count must be exact)."""
    ident = worker_identity()
    g = Group(client, f"{model}/g")
    name = f"{model}/count"
    if ident.rank == 0:
        client.create(name, (64,), np.int64, mode=mode)
    g.barrier()
    for step in range(steps):
        client.read(name, worker=ident.rank, step=step)
        client.accumulate(name, np.ones(64, np.int64), worker=ident.rank, step=step)
    g.barrier()
    return {"rank": ident.rank}


COLLECTIVE_CASES = [
    ((1000,), "float32"),
    ((7, 3), "float64"),
    ((5,), "int32"),
    ((70_000,), "float32"),  # several shards on several daemons
    ((), "int64"),
    ((9,), "float16"),
    ((4, 4), "uint8"),
]


def case_array(rank: int, i: int) -> np.ndarray:
    shape, dtype = COLLECTIVE_CASES[i]
    values = np.random.default_rng([rank, i]).standard_normal(shape) * 100
    return (np.abs(values) if dtype.startswith("u") else values).astype(dtype)


def collectives(client: Client, model: str) -> dict:
    ident = worker_identity()
    g = Group(client, model)
    out = {}
    for i in range(len(COLLECTIVE_CASES)):
        arr = case_array(ident.rank, i)
        s = g.allreduce(arr)
        out[f"sum{i}"] = s.tobytes().hex()
        out[f"mean{i}"] = g.allreduce(arr, op="mean").tobytes().hex()
        out[f"bcast{i}"] = g.broadcast(arr if ident.rank == 1 else None, root=1).tobytes().hex()
        gathered = g.gather(arr, root=2)
        out[f"gather{i}"] = None if gathered is None else gathered.tobytes().hex()
        # The same into given arrays, which are what comes back.
        mean_dtype = np.float64 if arr.dtype.kind in "iu" else arr.dtype
        into = {
            "sum": np.empty_like(s),
            "mean": np.empty(arr.shape, mean_dtype),
            "bcast": np.empty_like(arr),
            "gather": np.empty((ident.world_size, *arr.shape), arr.dtype),
        }
        got = {
            "sum": g.allreduce(arr, out=into["sum"]),
            "mean": g.allreduce(arr, op="mean", out=into["mean"]),
            "bcast": g.broadcast(arr if ident.rank == 1 else None, root=1, out=into["bcast"]),
            "gather": g.gather(arr, root=2, out=into["gather"]),
        }
        for what, array in got.items():
            if array is not None:
                assert array is into[what], what
                out[f"{what}_out{i}"] = array.tobytes().hex()
    g.close()
    return out


def main() -> int:
    scenario, model = sys.argv[1], sys.argv[2]
    mode = Mode.from_options(json.loads(sys.argv[3])) if len(sys.argv) > 3 else Mode()
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    die_at = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] != "-" else None
    started = time.monotonic()
    try:
        with Client() as client:
            if scenario == "train":
                result = train(client, model, mode, steps, die_at)
            elif scenario == "count":
                result = count(client, model, mode, steps)
            else:
                result = collectives(client, model)
    except IrdmaError as exc:
        print(
            json.dumps(
                {
                    "error": type(exc).__name__,
                    "message": str(exc),
                    "after": time.monotonic() - started,
                }
            )
        )
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
