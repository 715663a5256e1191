"""The processes of a nemesis run that talk to the daemons (run inside a namespace host).

``setup``: create the tensors (all zeros).
``client``: one client process, an ``irdma.Client`` of its own, doing accumulates,
counter reads, register writes and register reads for ``--seconds``, recording each
operation (``history``). Which daemon answered each shard, and with which version,
comes from a wrapper around the client's router: the public calls hide retries.
``monitor``: answers ``ready SECONDS`` lines on stdin (every daemon ready and in its
majority?) with one JSON line, for the nemesis between faults.
``copies``: every replica's copy of every shard, read from each daemon directly.

    python tests/nemesis/workers.py client --config C --process 0 --clients 4 ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root holds ``tests``
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import trio

from irdma import AsyncClient, Client
from irdma.client.sinks import IntoSink
from irdma.cluster import load_config
from irdma.errors import DaemonError, IrdmaError, VersionNotFound
from irdma.protocol import Header, Op, Status, tensor_key
from tests.nemesis.history import HistoryWriter, Record
from tests.nemesis.workload import (
    ACC_ELEMENTS,
    COUNTERS,
    ELEMENTS_PER_SHARD,
    MODEL,
    MODEL_ELEMENTS,
    MODEL_KEEP,
    MODEL_TENSORS,
    REG_ELEMENTS,
    REGISTERS,
    SlotPlan,
    counts_array,
    decode,
    delta_for,
    register_for,
    register_value,
)

# Refusals a daemon gives before it applies anything (psd/admission.py). NO_QUORUM is
# not one: a primary also answers it after applying, when its backups did not get it.
REFUSED_BEFORE_APPLYING = {Status.NOT_OWNER, Status.RECOVERING}
KINDS = ["acc", "read", "write", "rreg", "commit", "vread"]
# The hosts are network namespaces on one machine, and a daemon's unix socket sits in
# its data directory, which every namespace sees: "auto" would first try shared
# memory through it (and be refused: another namespace). A client on another host
# has no such socket to try, so the clients here go straight to TCP, as it would.
TRANSPORT = "tcp"


@dataclass
class Attempt:
    """One request the router sent for an operation, and how it ended."""

    node: str
    key: int
    shard: int
    status: str  # "ok", a status name, "lost" (no answer) or "error"
    version: int = 0
    # A whole-tensor write's stamp (0: none). A write refused somewhere for a later
    # one is stamped again and sent to every shard again: two answers with two
    # stamps are that rewrite, not one update applied twice.
    stamp: int = 0


class Recorder:
    """Wraps a client's router so every attempt of every request is seen."""

    def __init__(self, client: Client) -> None:
        router = client.async_client.router
        # The router's requests go through this (its ``routing.Requests``).
        self._inner = router.requests
        router.requests = self
        self.attempts: list[Attempt] = []

    def now(self) -> float:
        return self._inner.now()

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)

    async def request(self, node: Any, header: Header, payload: Any = (), sink: Any = None) -> Any:
        attempt = Attempt(node.name, header.key, header.shard, "error", stamp=header.stamp)
        self.attempts.append(attempt)
        try:
            reply = await self._inner.request(node, header, payload, sink)
        except DaemonError as exc:
            attempt.status = Status(exc.status).name
            raise
        except IrdmaError:
            attempt.status = "lost"
            raise
        attempt.status = "ok"
        attempt.version = reply.header.version
        return reply


def shard_outcomes(attempts: list[Attempt], key: int, shards: int) -> dict[int, dict[str, Any]]:
    """What each shard of one operation did, from the attempts the router made."""
    by_shard: dict[int, list[Attempt]] = defaultdict(list)
    for a in attempts:
        if a.key == key:
            by_shard[a.shard].append(a)
    out: dict[int, dict[str, Any]] = {}
    for shard in range(shards):
        tries = by_shard.get(shard, [])
        oks = [a for a in tries if a.status == "ok"]
        if oks:
            rec: dict[str, Any] = {"outcome": "ok", "version": oks[-1].version}
            # Sent again as a new update (a fresh txn) under the same stamp: applied
            # twice? (Under a new stamp it is the write's rewrite, see ``Attempt``.)
            applied = max(Counter(a.stamp for a in oks).values())
            if applied > 1:
                rec["applied"] = applied
            if len({a.stamp for a in oks}) > 1:
                rec["restamped"] = len({a.stamp for a in oks}) - 1
        elif all(a.status in {s.name for s in REFUSED_BEFORE_APPLYING} for a in tries):
            rec = {"outcome": "fail"}  # refused everywhere, or never sent
        else:
            rec = {"outcome": "info"}
        if len(tries) > 1 or (tries and not oks):
            rec["tries"] = [f"{a.node}:{a.status}" for a in tries]
        out[shard] = rec
    return out


class ClientProcess:
    """One client's operations and their records."""

    def __init__(self, args: argparse.Namespace, client: Client, history: HistoryWriter) -> None:
        self.process = args.process
        self.client = client
        self.history = history
        self.recorder = Recorder(client)
        self.rng = random.Random(f"{args.seed}:{args.process}")
        self.weights = [float(x) for x in args.weights.split(",")]
        self.weights += [0.0] * (len(KINDS) - len(self.weights))  # kinds not named: none
        self.model = client.model(MODEL, keep=MODEL_KEEP)
        self.shared = args.shared_registers
        self.plan = SlotPlan(args.clients)
        self.used = dict.fromkeys(COUNTERS, 0)
        # Per (counter, shard): the slot counts this client last read (diffs are recorded).
        self.seen: dict[tuple[str, int], np.ndarray] = {}
        self.index = 0

    def step(self) -> None:
        f = self.rng.choices(KINDS, self.weights)[0]
        if f in ("commit", "vread"):
            self._version_op(f)
            return
        if f == "acc":
            tensor = self.rng.choice(COUNTERS)
            slot = self.plan.slot(self.process, self.used[tensor])
            if slot is None:
                f = "read"  # this client used every slot of the counter
            else:
                self.used[tensor] += 1
                self._run(
                    "acc", tensor, slot, lambda: self.client.accumulate(tensor, delta_for(slot))
                )
                return
        if f == "read":
            tensor = self.rng.choice(COUNTERS)
            out = np.zeros(ACC_ELEMENTS, dtype=np.int64)
            self._run("read", tensor, 0, lambda: self.client.read(tensor, out=out), out)
        elif f == "write":
            tensor = register_for(self.process, self.shared)
            value = register_value(self.process, self.index)
            data = np.full(REG_ELEMENTS, value, dtype=np.int64)
            self._run("write", tensor, value, lambda: self.client.write(tensor, data))
        else:
            tensor = REGISTERS[0] if self.shared else self.rng.choice(REGISTERS)
            out = np.zeros(REG_ELEMENTS, dtype=np.int64)
            self._run("rreg", tensor, 0, lambda: self.client.read(tensor, out=out), out)

    def _run(self, f: str, tensor: str, value: int, call: Any, out: Any = None) -> None:
        index = self.index
        self.index += 1
        self.history.write(
            Record("invoke", self.process, index, f, time.monotonic(), tensor, value)
        )
        self.recorder.attempts = []
        error, unexpected, where = "", False, ""
        try:
            call()
        except IrdmaError as exc:
            error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a client bug: recorded, and judged by the checker
            error, unexpected = f"{type(exc).__name__}: {exc}", True
            where = traceback.format_exc(limit=-12)
        end = time.monotonic()
        elements = ACC_ELEMENTS if tensor in COUNTERS else REG_ELEMENTS
        nshards = -(-elements // ELEMENTS_PER_SHARD)
        shards = shard_outcomes(self.recorder.attempts, tensor_key(tensor), nshards)
        if out is not None:
            self._contents(f, tensor, out, shards)
        if not error:
            kind = "ok"
        elif all(s["outcome"] == "fail" for s in shards.values()):
            kind = "fail"
        else:
            kind = "info"
        detail = {"unexpected": True, "traceback": where} if unexpected else {}
        self.history.write(
            Record(kind, self.process, index, f, end, tensor, value, shards, error, detail)
        )

    def _version_op(self, f: str) -> None:
        """A commit of a version (every tensor filled with this operation's value), or
        a read of the latest version (its number, and the values its tensors hold)."""
        index = self.index
        self.index += 1
        value = register_value(self.process, index) if f == "commit" else 0
        self.history.write(Record("invoke", self.process, index, f, time.monotonic(), MODEL, value))
        error, unexpected, where, kind = "", False, "", "ok"
        detail: dict[str, Any] = {}
        try:
            if f == "commit":
                data = {t: np.full(MODEL_ELEMENTS, value, np.int64) for t in MODEL_TENSORS}
                detail["version"] = self.model.commit(data)
            else:
                snap = self.model.read()
                values = np.unique(np.concatenate([snap.arrays[t] for t in MODEL_TENSORS]))
                detail["version"] = snap.version
                detail["values"] = [int(v) for v in values[:4]]
                detail["tensors"] = sorted(snap.arrays)
        except VersionNotFound as exc:  # nothing committed yet: a read that found none
            error, kind = f"{type(exc).__name__}: {exc}", "fail"
        except IrdmaError as exc:  # a commit may have happened: ambiguous
            error, kind = f"{type(exc).__name__}: {exc}", "info"
        except Exception as exc:  # a client bug: recorded, and judged by the checker
            error, unexpected, kind = f"{type(exc).__name__}: {exc}", True, "info"
            where = traceback.format_exc(limit=-12)
        if unexpected:
            detail |= {"unexpected": True, "traceback": where}
        self.history.write(
            Record(kind, self.process, index, f, time.monotonic(), MODEL, value, {}, error, detail)
        )

    def _contents(
        self, f: str, tensor: str, out: np.ndarray, shards: dict[int, dict[str, Any]]
    ) -> None:
        """Add what each shard read successfully held to its record."""
        for shard, rec in shards.items():
            if rec["outcome"] != "ok":
                continue
            lo = shard * ELEMENTS_PER_SHARD
            values = out[lo : lo + ELEMENTS_PER_SHARD]
            if f == "rreg":
                distinct = np.unique(values)
                rec["value" if len(distinct) == 1 else "values"] = (
                    int(distinct[0]) if len(distinct) == 1 else [int(v) for v in distinct[:4]]
                )
                continue
            counts = counts_array(values)
            before = self.seen.get((tensor, shard))
            if before is None:
                before = np.zeros_like(counts)
            changed = np.flatnonzero(counts != before)
            base = lo * 21
            rec["add"] = [[int(base + i), int(counts[i])] for i in changed if counts[i]]
            rec["del"] = [int(base + i) for i in changed if not counts[i]]
            _, bad = decode(values, lo)
            if bad:
                rec["bad"] = bad[:8]
            self.seen[(tensor, shard)] = counts


def _retry(what: str, call: Any, tries: int = 40) -> Any:
    """A setup call that may meet a daemon still catching up: bounded retries."""
    for attempt in range(tries):
        try:
            return call()
        except IrdmaError as exc:
            if attempt == tries - 1:
                raise RuntimeError(f"{what}: {exc}") from exc
            time.sleep(0.25)
    return None


def setup(args: argparse.Namespace) -> None:
    with Client(args.config, transport=TRANSPORT) as client:
        for name in COUNTERS:
            _retry(name, lambda n=name: client.write(n, np.zeros(ACC_ELEMENTS, np.int64)))
        for name in REGISTERS:
            _retry(name, lambda n=name: client.write(n, np.zeros(REG_ELEMENTS, np.int64)))
    print(json.dumps({"ok": True}))


def _wait_for_go(go: Path, ready: Path, timeout: float = 120.0) -> float:
    """Say this client is ready, wait until every client is; return when to stop.

    The go file holds the CLOCK_MONOTONIC time at which the run ends (one clock for
    every process here), so all clients stop together with the nemesis.
    """
    ready.touch()
    deadline = time.monotonic() + timeout
    while not go.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {go} within {timeout:g} s")
        time.sleep(0.02)
    return float(go.read_text())


def client_main(args: argparse.Namespace) -> None:
    # Every client seeds Python's random alike, as training scripts do on every rank
    # (seed_everything): nothing irdma makes unique may come from it (update ids,
    # stamps). The client's own choices come from its own generator (ClientProcess).
    random.seed(args.seed)
    with Client(args.config, transport=TRANSPORT) as client, HistoryWriter(args.history) as history:
        for name in COUNTERS + REGISTERS:
            _retry(name, lambda n=name: client.stat(n))  # metadata cached before the clock starts
        proc = ClientProcess(args, client, history)
        end = _wait_for_go(Path(args.go), Path(args.history + ".ready"))
        while time.monotonic() < end:
            proc.step()
            time.sleep(proc.rng.uniform(0, args.think))
    print(json.dumps({"ok": True, "ops": proc.index}))


async def _all_ready(config_path: str, timeout: float) -> dict[str, Any]:
    """Wait until every daemon says it is ready and hears its majority."""
    config = load_config(config_path)
    started = time.monotonic()
    last: dict[str, str] = {}
    lent: dict[str, int] = {}  # forwards each daemon lent a backup since it started
    epochs: set[int | None] = set()
    async with AsyncClient(config, timeout=1.0, transport=TRANSPORT) as client:
        while True:
            for node in config.nodes:
                try:
                    hello = await client.hello(node)
                except IrdmaError as exc:
                    last[node.name] = type(exc).__name__
                    continue
                ok = hello.get("ready") and hello.get("quorum")
                lent[node.name] = int(hello.get("copies", {}).get("lent", 0))
                epoch = hello.get("epoch")
                if ok and config.etcd is not None:
                    # After a drain or a replacement: every daemon a member of one
                    # settled epoch, no move under way.
                    ok = (
                        epoch is not None
                        and epoch["settled"]
                        and epoch["target"] is None
                        and set(epoch["members"]) == {n.name for n in config.nodes}
                    )
                    epochs.add(epoch["number"] if epoch else None)
                last[node.name] = "ready" if ok else json.dumps(epoch or hello.get("view"))
            agreed = len(epochs) <= 1
            epochs.clear()
            if (
                agreed
                and all(v == "ready" for v in last.values())
                and len(last) == len(config.nodes)
            ):
                return {"ready": True, "waited": time.monotonic() - started, "lent": lent}
            if time.monotonic() - started > timeout:
                return {"ready": False, "waited": time.monotonic() - started, "last": last}
            await trio.sleep(0.05)


def monitor(args: argparse.Namespace) -> None:
    print(json.dumps({"started": True}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["ready"]:
            print(json.dumps(trio.run(_all_ready, args.config, float(words[1]))), flush=True)
        elif words[:1] == ["quit"]:
            return


async def _copies(config_path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with AsyncClient(config_path, timeout=5.0, transport=TRANSPORT) as client:
        for name in COUNTERS + REGISTERS:
            meta = (await client.stat(name)).meta
            per_shard: dict[str, Any] = {}
            for index in range(meta.num_shards):
                _, nbytes = meta.shard_span(index)
                copies: dict[str, Any] = {}
                for node in client.config.replicas_for(meta.key, index):
                    buf = bytearray(nbytes)
                    header = Header(op=Op.READ, key=meta.key, shard=index, size=nbytes)
                    try:
                        reply = await client.session.request(
                            node, header, sink=IntoSink(memoryview(buf))
                        )
                    except IrdmaError as exc:
                        copies[node.name] = {"error": f"{type(exc).__name__}: {exc}"}
                        continue
                    values = np.frombuffer(buf, dtype=np.int64)
                    copy: dict[str, Any] = {
                        "version": reply.header.version,
                        "sha256": hashlib.sha256(buf).hexdigest(),
                    }
                    if name in COUNTERS:
                        slots, bad = decode(values, index * ELEMENTS_PER_SHARD)
                        copy["slots"] = sorted(slots.items())
                        copy["bad"] = bad[:8]
                    else:
                        copy["values"] = [int(v) for v in np.unique(values)[:4]]
                    copies[node.name] = copy
                per_shard[str(index)] = copies
            out[name] = per_shard
    return out


def copies(args: argparse.Namespace) -> None:
    Path(args.out).write_text(json.dumps(trio.run(_copies, args.config)))
    print(json.dumps({"ok": True}))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("setup", "client", "monitor", "copies"):
        p = sub.add_parser(name)
        p.add_argument("--config", required=True)
        if name == "client":
            p.add_argument("--process", type=int, required=True)
            p.add_argument("--clients", type=int, required=True)
            p.add_argument("--seed", type=int, required=True)
            p.add_argument("--go", required=True, help="file holding when the run ends")
            p.add_argument("--history", required=True)
            p.add_argument("--think", type=float, default=0.01, help="longest pause between ops")
            p.add_argument(
                "--weights", default="5,3,1,1", help="of acc, read, write, rreg, commit, vread"
            )
            p.add_argument("--shared-registers", action="store_true", help="all write reg0")
        if name == "copies":
            p.add_argument("--out", required=True)
    args = parser.parse_args()
    {"setup": setup, "client": client_main, "monitor": monitor, "copies": copies}[args.cmd](args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
