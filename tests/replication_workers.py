"""Client processes for the replication tests (run inside a network namespace).

``accumulate``: a stream of accumulates for ``--seconds``; each adds a
distinct whole number, so a lost or doubled update shows in the sum. Prints
one JSON line: the acknowledged sum, the ack times and any failures.

``replicas``: every replica's copy of every shard of a tensor, read from
each daemon directly (no failover), as sha256 digests with versions.

``training``: a read / accumulate loop checking every read against the
expected value (for shaped, lossy links).

``wait-quorum``: wait until a daemon says it has lost (or regained) quorum.
``wait-primaries``: wait until a daemon took over shards (its HELLO's count).
``wait-peer``: wait until a daemon sees a peer in a state (its HELLO's view), and
with ``--settled`` owes it no resync.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable

import numpy as np
import trio

from irdma import Client
from irdma.client import AsyncClient
from irdma.client.sinks import IntoSink
from irdma.errors import IrdmaError
from irdma.protocol import Header, Op


def accumulate(args: argparse.Namespace) -> None:
    acked = 0.0
    times: list[float] = []
    failures: list[str] = []
    # Every operation as [value, invoked, completed, outcome]: if a sum comes out wrong,
    # the difference names the lost or doubled values and this says when they ran.
    history: list[list] = []
    with Client(args.config) as client:
        info = client.stat(args.tensor)
        ones = np.ones(info.shape, dtype=info.dtype)
        end = time.monotonic() + args.seconds
        i = 0
        while time.monotonic() < end:
            value = float(args.base + i)
            i += 1
            invoked = time.monotonic()
            try:
                client.accumulate(args.tensor, ones, alpha=value)
            except IrdmaError as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                history.append([value, invoked, time.monotonic(), type(exc).__name__])
                continue
            acked += value
            times.append(time.monotonic())
            history.append([value, invoked, times[-1], "ok"])
    report = {"acked": acked, "count": len(times), "times": times, "failures": failures}
    print(json.dumps(report | {"history": history}))


async def _replicas(args: argparse.Namespace) -> dict[str, dict[str, list]]:
    out: dict[str, dict[str, list]] = {}
    async with AsyncClient(args.config) as client:
        info = await client.stat(args.tensor)
        meta = info.meta
        key = meta.key  # not the name's own once renamed
        for index in range(meta.num_shards):
            _, nbytes = meta.shard_span(index)
            copies: dict[str, list] = {}
            for node in client.config.replicas_for(key, index):
                buf = bytearray(nbytes)
                header = Header(op=Op.READ, key=key, shard=index, size=nbytes)
                try:
                    reply = await client.session.request(
                        node, header, sink=IntoSink(memoryview(buf))
                    )
                except IrdmaError as exc:
                    copies[node.name] = ["error", f"{type(exc).__name__}: {exc}"]
                    continue
                first = float(np.frombuffer(buf, dtype=info.dtype, count=1)[0])
                copies[node.name] = [reply.header.version, hashlib.sha256(buf).hexdigest(), first]
            out[str(index)] = copies
    return out


def replicas(args: argparse.Namespace) -> None:
    print(json.dumps(trio.run(_replicas, args)))


def training(args: argparse.Namespace) -> None:
    """Pull, check, push: the loop a worker runs, with exact expected values."""
    errors: list[str] = []
    with Client(args.config) as client:
        info = client.stat(args.tensor)
        expected = client.read(args.tensor)
        delta = np.ones(info.shape, dtype=info.dtype)
        for step in range(args.steps):
            got = client.read(args.tensor)
            if not np.array_equal(got, expected):
                errors.append(f"step {step}: read differs from the expected value")
                expected = got
            client.accumulate(args.tensor, delta, alpha=0.5)
            expected = expected + 0.5
        final = client.read(args.tensor)
        if not np.array_equal(final, expected):
            errors.append("final read differs from the expected value")
    print(json.dumps({"steps": args.steps, "errors": errors}))


def wait_ready(args: argparse.Namespace) -> None:
    """Wait until every named daemon answers HELLO and says it is ready (caught up)."""
    from irdma.cluster import load_config

    config = load_config(args.config)
    names = args.nodes.split(",") if args.nodes else [n.name for n in config.nodes]
    deadline = time.monotonic() + args.timeout
    last: dict[str, str] = {}

    async def check(client: AsyncClient, name: str) -> bool:
        try:
            info = await client.hello(config.node(name))
        except IrdmaError as exc:
            last[name] = str(exc)
            return False
        last[name] = json.dumps(info.get("view"))
        return bool(info.get("ready"))

    async def run() -> bool:
        async with AsyncClient(config, timeout=1.0) as client:
            while time.monotonic() < deadline:
                if all([await check(client, n) for n in names]):
                    return True
                await trio.sleep(0.05)
        return False

    if not trio.run(run):
        print(json.dumps({"ready": False, "last": last}))
        sys.exit(1)
    print(json.dumps({"ready": True}))


def _wait_hello(args: argparse.Namespace, done: Callable[[dict], bool]) -> None:
    """Ask a daemon for HELLO until ``done(answer)``; print the last answer (exit 1 if
    --timeout passes first)."""
    from irdma.cluster import load_config

    config = load_config(args.config)
    node = config.node(args.node)
    deadline = time.monotonic() + args.timeout
    last: object = None

    async def run() -> bool:
        nonlocal last
        async with AsyncClient(config, timeout=1.0) as client:
            while time.monotonic() < deadline:
                try:
                    last = await client.hello(node)
                except IrdmaError as exc:
                    last = str(exc)
                if isinstance(last, dict) and done(last):
                    return True
                await trio.sleep(0.05)
        return False

    ok = trio.run(run)
    print(json.dumps({"ok": ok, "last": last}))
    if not ok:
        sys.exit(1)


def wait_quorum(args: argparse.Namespace) -> None:
    """Wait until a daemon's HELLO says it has (or, with --lost, has not) quorum."""
    _wait_hello(args, lambda hello: hello.get("quorum") is (not args.lost))


def wait_primaries(args: argparse.Namespace) -> None:
    """Wait until a daemon is the acting primary of more than --above shards (it took
    over a peer's)."""
    _wait_hello(args, lambda hello: hello["shards"]["primary"] > args.above)


def wait_peer(args: argparse.Namespace) -> None:
    """Wait until a daemon's HELLO shows --peer in --state (ready, catching-up, down) and,
    with --settled, no resync owed to it (a daemon that does not say owes none)."""

    def done(hello: dict) -> bool:
        owed = hello["replication"].get(args.peer, {}).get("resync", False)
        return hello["view"].get(args.peer) == args.state and not (args.settled and owed)

    _wait_hello(args, done)


def try_write(args: argparse.Namespace) -> None:
    """Accumulate ones ``--times`` times; print what happened (for a partition's sides)."""
    with Client(args.config, timeout=args.timeout) as client:
        try:
            info = client.stat(args.tensor)
            if args.go:
                # Started and connected: the write goes the moment the test says.
                print("ready", flush=True)
                while not os.path.exists(args.go):
                    time.sleep(0.005)
            for _ in range(args.times):
                if args.first is not None:
                    # Only shard 0, so the answer comes from its replicas alone.
                    client.write_bytes(args.tensor, 0, np.float64(args.first).tobytes())
                else:
                    client.accumulate(args.tensor, np.ones(info.shape, dtype=info.dtype))
        except IrdmaError as exc:
            print(json.dumps({"ok": False, "error": type(exc).__name__, "message": str(exc)}))
            return
    print(json.dumps({"ok": True}))


def write(args: argparse.Namespace) -> None:
    with Client(args.config) as client:
        client.write(args.tensor, np.full(args.count, args.value, dtype=np.float64))
    print(json.dumps({"ok": True}))


async def _holdings(args: argparse.Namespace) -> dict[str, list[str]]:
    async with AsyncClient(args.config) as client:
        return {
            node.name: sorted(r.meta.name for r in await client.holdings(node, args.prefix))
            for node in client.config.nodes
        }


def holdings(args: argparse.Namespace) -> None:
    """The names of the tensors each daemon holds shards of, under a prefix."""
    print(json.dumps(trio.run(_holdings, args)))


def rename(args: argparse.Namespace) -> None:
    with Client(args.config) as client:
        client.rename(args.tensor, args.to, replace=True)
    print(json.dumps({"ok": True}))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("accumulate")
    a.add_argument("--config", required=True)
    a.add_argument("--tensor", required=True)
    a.add_argument("--seconds", type=float, required=True)
    a.add_argument("--base", type=int, required=True)
    r = sub.add_parser("replicas")
    r.add_argument("--config", required=True)
    r.add_argument("--tensor", required=True)
    t = sub.add_parser("training")
    t.add_argument("--config", required=True)
    t.add_argument("--tensor", required=True)
    t.add_argument("--steps", type=int, required=True)
    w = sub.add_parser("wait-ready")
    w.add_argument("--config", required=True)
    w.add_argument("--nodes", default="")
    w.add_argument("--timeout", type=float, default=30.0)
    tw = sub.add_parser("try-write")
    tw.add_argument("--config", required=True)
    tw.add_argument("--tensor", required=True)
    tw.add_argument("--timeout", type=float, default=2.0)
    tw.add_argument("--times", type=int, default=1)
    tw.add_argument("--first", type=float, help="write this float64 as element 0 instead")
    tw.add_argument("--go", help="write only once this file exists")
    q = sub.add_parser("wait-quorum")
    q.add_argument("--config", required=True)
    q.add_argument("--node", required=True)
    q.add_argument("--lost", action="store_true", help="wait until it has lost quorum")
    q.add_argument("--timeout", type=float, default=30.0)
    wp = sub.add_parser("wait-primaries")
    wp.add_argument("--config", required=True)
    wp.add_argument("--node", required=True)
    wp.add_argument("--above", type=int, required=True)
    wp.add_argument("--timeout", type=float, default=30.0)
    wv = sub.add_parser("wait-peer")
    wv.add_argument("--config", required=True)
    wv.add_argument("--node", required=True)
    wv.add_argument("--peer", required=True)
    wv.add_argument("--state", required=True, choices=["ready", "catching-up", "down"])
    wv.add_argument("--settled", action="store_true", help="and it owes the peer no resync")
    wv.add_argument("--timeout", type=float, default=30.0)
    wr = sub.add_parser("write")
    wr.add_argument("--config", required=True)
    wr.add_argument("--tensor", required=True)
    wr.add_argument("--count", type=int, required=True)
    wr.add_argument("--value", type=float, required=True)
    hd = sub.add_parser("holdings")
    hd.add_argument("--config", required=True)
    hd.add_argument("--prefix", default="")
    rn = sub.add_parser("rename")
    rn.add_argument("--config", required=True)
    rn.add_argument("--tensor", required=True)
    rn.add_argument("--to", required=True)
    args = parser.parse_args()
    commands = {
        "accumulate": accumulate,
        "replicas": replicas,
        "rename": rename,
        "holdings": holdings,
        "training": training,
        "wait-ready": wait_ready,
        "wait-quorum": wait_quorum,
        "wait-primaries": wait_primaries,
        "wait-peer": wait_peer,
        "try-write": try_write,
        "write": write,
    }
    commands[args.cmd](args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
