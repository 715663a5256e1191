"""The client side of ``tests/test_elastic.py``, run as processes on the client's host
(a network namespace, or this machine): load, waits on epochs, the final checks.

Each subcommand prints one JSON line last. ``load`` runs until its stop file exists
and keeps ``--progress`` current (acknowledged accumulates and reads so far).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import trio

from irdma import AsyncClient, Client
from irdma.client.sinks import IntoSink
from irdma.cluster import load_config
from irdma.cluster.epochs import Epoch
from irdma.cluster.registry import Registry
from irdma.protocol import Header, Op

SHARD = 4096  # bytes: many shards, so the fraction moved is measured on thousands
ELEMS = SHARD // 8  # int64 per shard
BULK = 40  # tensors written once and checked at the end
BULK_SHARDS = 50
COUNTERS = 2  # tensors the clients accumulate ones into
COUNTER_SHARDS = 8
COUNTER_NAMES = [f"count/{i}" for i in range(COUNTERS)]
TOTAL_SHARDS = BULK * BULK_SHARDS + COUNTERS * COUNTER_SHARDS


def bulk_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {f"bulk/{i}": rng.integers(0, 1 << 62, BULK_SHARDS * ELEMS) for i in range(BULK)}


def setup(args: argparse.Namespace) -> dict[str, Any]:
    with Client(args.config) as c:
        for name, data in bulk_data().items():
            c.write(name, data)
        for name in COUNTER_NAMES:
            c.create(name, (COUNTER_SHARDS * ELEMS,), np.int64)
    return {"ok": True}


def load(args: argparse.Namespace) -> dict[str, Any]:
    """Two accumulating clients and one reader until the stop file appears."""
    acked = [0] * COUNTERS
    reads = [0]
    errors: list[str] = []
    stop = Path(args.stop)

    def accumulate(slot: int) -> None:
        try:
            with Client(args.config) as c:
                ones = np.ones(COUNTER_SHARDS * ELEMS, np.int64)
                while not stop.exists():
                    c.accumulate(COUNTER_NAMES[slot], ones)
                    acked[slot] += 1
        except BaseException as exc:
            errors.append(f"accumulate {slot}: {type(exc).__name__}: {exc}")

    def read() -> None:
        try:
            with Client(args.config) as c:
                while not stop.exists():
                    for name in COUNTER_NAMES:
                        if c.read(name).min() < 0:
                            errors.append(f"read {name}: a negative count")
                    reads[0] += 1
        except BaseException as exc:
            errors.append(f"read: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=accumulate, args=(i,)) for i in range(COUNTERS)]
    threads.append(threading.Thread(target=read))
    for t in threads:
        t.start()
    progress = Path(args.progress)
    while any(t.is_alive() for t in threads):
        tmp = progress.with_suffix(".tmp")
        tmp.write_text(json.dumps({"acked": acked, "reads": reads[0], "errors": errors}))
        tmp.replace(progress)
        time.sleep(0.1)
    for t in threads:
        t.join()
    return {"acked": acked, "reads": reads[0], "errors": errors}


async def _epoch(config_path: str) -> Epoch | None:
    config = load_config(config_path)
    assert config.etcd is not None
    epoch, _ = await Registry.of(config.etcd, 5.0).epoch()
    return epoch


def wait_epoch(args: argparse.Namespace) -> dict[str, Any]:
    """Until the epoch has ``--member`` as a member, or ``--out`` in neither list, with
    no move under way."""
    deadline = time.monotonic() + args.timeout
    while True:
        epoch = trio.run(_epoch, args.config)  # None until the first daemon writes it
        done = (
            epoch is not None
            and epoch.target is None
            and (
                (args.member is not None and args.member in epoch.members)
                or (args.out is not None and args.out not in epoch.names)
            )
        )
        if done or time.monotonic() > deadline:
            record = json.loads(epoch.to_json()) if epoch is not None else None
            return {"ok": done, "epoch": record}
        time.sleep(0.1)


async def _hello(config_path: str, node: str) -> dict[str, Any]:
    config = load_config(config_path)
    epoch = await _epoch(config_path)
    assert epoch is not None
    config = config.following(epoch) or config
    async with AsyncClient(config, timeout=5.0) as client:
        return await client.hello(config.node(node))


def held(args: argparse.Namespace) -> dict[str, Any]:
    """A daemon's HELLO: its shard copies by role, the epoch it follows, its copy counts."""
    return trio.run(_hello, args.config, args.node)


async def _copies(config_path: str) -> dict[str, dict[str, list]]:
    """Every replica's (version, sha256) of every shard, asked of each replica."""
    out: dict[str, dict[str, list]] = {}
    names = [*bulk_data(), *COUNTER_NAMES]
    async with AsyncClient(config_path, timeout=5.0, transport="tcp") as client:
        for name in names:
            meta = (await client.stat(name)).meta
            for index in range(meta.num_shards):
                _, nbytes = meta.shard_span(index)
                copies = {}
                for node in client.config.replicas_for(meta.key, index):
                    buf = bytearray(nbytes)
                    header = Header(op=Op.READ, key=meta.key, shard=index, size=nbytes)
                    reply = await client.session.request(
                        node, header, sink=IntoSink(memoryview(buf))
                    )
                    copies[node.name] = [reply.header.version, hashlib.sha256(buf).hexdigest()]
                out[f"{name}#{index}"] = copies
    return out


def check(args: argparse.Namespace) -> dict[str, Any]:
    """Counters equal to the acknowledged accumulates, bulk data intact, and two
    byte-identical copies of every shard on the final members."""
    acked = json.loads(Path(args.acked).read_text())["acked"]
    problems = []
    with Client(args.config) as c:
        for slot, name in enumerate(COUNTER_NAMES):
            values = c.read(name).reshape(COUNTER_SHARDS, ELEMS)
            for index, shard in enumerate(values):
                if not (shard == acked[slot]).all():
                    found = np.unique(shard)[:5].tolist()
                    problems.append(f"{name} shard {index}: {found} != {acked[slot]}")
        for name, data in bulk_data().items():
            if not (c.read(name) == data).all():
                problems.append(f"{name}: bytes changed")
    copies = trio.run(_copies, args.config)
    for shard, held in copies.items():
        if len(held) != 2 or len({tuple(v) for v in held.values()}) != 1:
            problems.append(f"{shard}: copies {held}")
    return {"ok": not problems, "problems": problems[:20], "shards": len(copies)}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("setup", "load", "wait-epoch", "held", "check"):
        p = sub.add_parser(name)
        p.add_argument("--config", required=True)
        if name == "load":
            p.add_argument("--stop", required=True)
            p.add_argument("--progress", required=True)
        if name == "wait-epoch":
            p.add_argument("--member")
            p.add_argument("--out")
            p.add_argument("--timeout", type=float, default=90.0)
        if name == "held":
            p.add_argument("--node", required=True)
        if name == "check":
            p.add_argument("--acked", required=True)
    args = parser.parse_args()
    run = {"setup": setup, "load": load, "wait-epoch": wait_epoch, "held": held, "check": check}
    print(json.dumps(run[args.cmd](args)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
