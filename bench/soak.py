#!/usr/bin/env python3
"""Soak: many clients of mixed ops for a long time; daemon and mount memory must stay flat.

Starts its own cluster (``--nodes`` psd daemons on loopback, two copies of
every shard, 1 MiB shards, metrics on a loopback port each, a snapshot every
``--snapshot-interval`` s) and one FUSE mount of it, then runs ``--clients``
processes for ``--duration`` seconds. Each client has a seeded RNG and its
own tensors, so every read is checked byte for byte against what it last
wrote. It picks, op by op: writes that redefine a tensor (4 KiB..8 MiB,
mixed dtypes and shapes), overwrites, partial ``write_bytes``, reads (whole,
into ``out=``, partial ``read_bytes``), ``accumulate`` and
``accumulate_many`` into shared integer-valued tensors (int64, int32,
float64: exact arithmetic, every delta counted), ``write_many`` /
``read_many``, ``stat``, ``list``, delete and re-create, and about a fifth
through the mount with file I/O only (``np.save``, ``np.load``, cat-like
reads, ``.accumulate/`` writes, ``listdir``, ``rm``, and cross-reads of
what the other path wrote). Even-numbered clients use TCP, odd ones
``auto`` (shared memory on this host). Any exception or mismatch is an
error; the first ones are printed with details.

Every ``--interval`` s it samples the resident memory (VmRSS and its
anonymous part, RssAnon, from /proc/PID/status) of each daemon and of the
mount process, the arena use from the metrics, and the ops so far. At the
end: the curve, growth from the 2-minute mark (a third of the run, if
shorter) to the end with a verdict, ops and errors by kind, the exact check
of the shared sums (through the client and the mount), the daemons' own
request and error counters, replica skew (``irdma status``), and warnings
in the daemon and mount logs. Writes ``bench/results/soak.json`` and
``soak.png`` (with matplotlib) and the logs to ``bench/results/soak-logs/``.
The checks: no client error, exact sums, VmRSS and RssAnon of every daemon
and the mount flat (at most 5 MiB or 5 % of growth), every replica in sync
at the end; exit status 1 if any fails. ``--skip`` leaves op kinds out (to
soak the rest while a known bug is open). Run as root (FUSE).

    python bench/soak.py [--duration 600] [--clients 16] [--nodes 3] [--seed 0]
                         [--skip KIND,...] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from irdma import Client
from irdma.cli.local import free_ports, psd_command
from irdma.cluster import load_config, parse_size
from irdma.errors import IrdmaError, TensorNotFound

IRDMA = [sys.executable, "-m", "irdma"]
RESULTS = Path(__file__).resolve().parent / "results"
MIB = 1 << 20
SHARD_SIZE = 1 << 20
MIN_BYTES, MAX_BYTES = 4 << 10, 8 << 20
OWN_TENSORS = 4  # soak/c<i>/t<k>: written, redefined, deleted by client i only
BATCH_TENSORS = 4  # soak/c<i>/b<k>: small, fixed layout, for write_many/read_many
MOUNT_FILES = 3  # soak/m<i>/f<k>.npy: written through the mount by client i only
DTYPES = [
    "float32",
    "float64",
    "float16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "complex64",
    "bool",
]
# Shared tensors every client adds into: exact because deltas are small integers.
ACCUMULATORS = {
    "soak/shared/acc_i64": ("int64", (96, 4096)),  # 3 MiB: 3 shards
    "soak/shared/acc_i32": ("int32", (300_000,)),  # 1.2 MiB: 2 shards
    "soak/shared/acc_f64": ("float64", (256, 256)),  # 512 KiB: 1 shard
}
# Op mix (relative weights). fs_* go through the mount with plain file I/O.
OPS = {
    "write": 8,  # a new random layout and content (replace=True)
    "overwrite": 10,  # same layout, new content
    "write_bytes": 5,  # a random byte range
    "read": 14,
    "read_out": 5,
    "read_bytes": 4,
    "accumulate": 12,
    "accumulate_many": 4,
    "write_many": 4,
    "read_many": 5,
    "stat": 6,
    "list": 3,
    "delete_recreate": 3,
    "fs_save": 5,
    "fs_load": 5,
    "fs_cat": 3,
    "fs_accumulate": 3,
    "fs_listdir": 2,
    "fs_delete_recreate": 1,
    "fs_cross_read": 3,  # the client reads a mount-written tensor, or the mount a client one
}
FIRST_ERRORS = 5  # kept per client, with tracebacks
FLAT_MIB, FLAT_FRACTION = 5.0, 0.05  # flat: grew by at most 5 MiB or 5 %, whichever is more
RSS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


# -- helpers ----------------------------------------------------------------------------


def same(got: np.ndarray, want: np.ndarray) -> str | None:
    """None if ``got`` is ``want`` (dtype, shape, every byte); else what differs."""
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    a = np.ascontiguousarray(got).reshape(-1).view(np.uint8)
    b = np.ascontiguousarray(want).reshape(-1).view(np.uint8)
    if not np.array_equal(a, b):
        bad = np.flatnonzero(a != b)
        return f"{bad.size} of {a.size} bytes differ, first at byte {int(bad[0])}"
    return None


def random_array(rng: np.random.Generator, nbytes: int | None = None) -> np.ndarray:
    """Random content of a random dtype and shape, ``nbytes`` (log-uniform 4 KiB..8 MiB)."""
    if nbytes is None:
        nbytes = int(math.exp(rng.uniform(math.log(MIN_BYTES), math.log(MAX_BYTES))))
    dt = np.dtype(DTYPES[rng.integers(len(DTYPES))])
    return fill(rng, dt, layout(rng, max(1, nbytes // dt.itemsize)))


def layout(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    cols = int(rng.choice([1, 8, 64, 512]))
    if cols == 1 or n < 2 * cols:
        return (n,)
    if rng.random() < 0.3:
        return (n // cols, 2, cols // 2)
    return (n // cols, cols)


def fill(rng: np.random.Generator, dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Random bytes (so NaN payloads and every bit pattern too); bools are 0 or 1."""
    size = math.prod(shape)
    if dt == np.bool_:
        return rng.integers(0, 2, size, dtype=np.uint8).astype(bool).reshape(shape)
    return np.frombuffer(rng.bytes(size * dt.itemsize), dtype=dt).reshape(shape).copy()


def zero_sums() -> dict[str, np.ndarray]:
    """Running sums of the deltas added to each accumulator (int64, or float64: exact)."""
    return {
        name: np.zeros(shape, np.float64 if dtype == "float64" else np.int64)
        for name, (dtype, shape) in ACCUMULATORS.items()
    }


def small_ints(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-100, 101, shape).astype(dtype)


def proc_memory(pid: int) -> dict[str, float] | None:
    """VmRSS, RssAnon, RssFile, RssShmem of a process in MiB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if key in RSS_FIELDS:
            out[key] = int(rest.split()[0]) / 1024
    return out or None


def scrape(host: str, port: int) -> dict[tuple[str, frozenset], float]:
    """One scrape of a daemon's /metrics, keyed by (sample name, labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


# -- one client process -----------------------------------------------------------------


class SoakClient:
    def __init__(
        self,
        idx: int,
        config: str,
        mnt: Path,
        seed: int,
        skip: list[str],
        ops: Any,
        errs: Any,
        stop: Any,
    ) -> None:
        self.idx = idx
        self.rng = np.random.default_rng([seed, idx])
        self.transport = "tcp" if idx % 2 == 0 else "auto"
        self.c = Client(config, transport=self.transport)
        self.mnt = mnt
        self.shared_ops, self.shared_errs, self.stop = ops, errs, stop
        self.own = {f"soak/c{idx}/t{k}": random_array(self.rng) for k in range(OWN_TENSORS)}
        self.batch = {
            f"soak/c{idx}/b{k}": random_array(self.rng, int(self.rng.integers(4 << 10, 64 << 10)))
            for k in range(BATCH_TENSORS)
        }
        self.fdir = mnt / "soak" / f"m{idx}"
        self.files = {f"f{k}": random_array(self.rng) for k in range(MOUNT_FILES)}
        self.sums = zero_sums()
        self.acc_counts: Counter[str] = Counter()  # accumulates applied, by accumulator
        self.acc_failed = 0  # accumulates that raised: whether they applied is unknown
        self.ops: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.slowest: dict[str, float] = defaultdict(float)
        self.first_errors: list[dict[str, Any]] = []
        kinds = [k for k in OPS if k not in skip]
        self.kinds = kinds
        weights = np.array([OPS[k] for k in kinds], float)
        self.p = weights / weights.sum()

    # bookkeeping

    def run_op(self, kind: str, fn: Any) -> None:
        t = time.monotonic()
        problem, detail = None, None
        try:
            problem = fn()
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            detail = traceback.format_exc(limit=6)
            if kind in ("accumulate", "accumulate_many", "fs_accumulate"):
                self.acc_failed += 1
        took = time.monotonic() - t
        self.ops[kind] += 1
        self.seconds[kind] += took
        self.slowest[kind] = max(self.slowest[kind], took)
        self.shared_ops[self.idx] += 1
        if problem is not None:
            self.errors[kind] += 1
            self.shared_errs[self.idx] += 1
            if len(self.first_errors) < FIRST_ERRORS:
                self.first_errors.append(
                    {
                        "client": self.idx,
                        "kind": kind,
                        "problem": str(problem)[:500],
                        "traceback": detail,
                        "at": time.time(),
                    }
                )

    def pick(self, names: dict[str, Any]) -> str:
        keys = list(names)
        return keys[self.rng.integers(len(keys))]

    def fpath(self, f: str) -> Path:
        return self.fdir / f"{f}.npy"

    # setup and the end

    def init(self) -> None:
        def go() -> None:
            for name, arr in self.own.items():
                self.c.write(name, arr, replace=True)
            self.c.write_many(self.batch)
            self.fdir.mkdir(parents=True, exist_ok=True)
            for f, arr in self.files.items():
                np.save(self.fpath(f), arr)

        self.run_op("init", go)

    def final_verify(self) -> None:
        def go() -> str | None:
            for name, want in self.own.items():
                if (bad := same(self.c.read(name), want)) is not None:
                    return f"{name}: {bad}"
            got = self.c.read_many(self.batch)
            for name, want in self.batch.items():
                if (bad := same(got[name], want)) is not None:
                    return f"{name}: {bad}"
            for f, want in self.files.items():
                if (bad := same(np.load(self.fpath(f)), want)) is not None:
                    return f"{self.fpath(f)}: {bad}"
            return None

        self.run_op("final_verify", go)

    def loop(self, deadline: float) -> None:
        while time.monotonic() < deadline and not self.stop.is_set():
            kind = self.kinds[self.rng.choice(len(self.kinds), p=self.p)]
            self.run_op(kind, getattr(self, f"op_{kind}"))

    # client ops

    def op_write(self) -> str | None:
        name = self.pick(self.own)
        arr = random_array(self.rng)
        self.c.write(name, arr, replace=True)
        self.own[name] = arr
        return None

    def op_overwrite(self) -> str | None:
        name = self.pick(self.own)
        old = self.own[name]
        arr = fill(self.rng, old.dtype, old.shape)
        self.c.write(name, arr)
        self.own[name] = arr
        return None

    def op_write_bytes(self) -> str | None:
        name = self.pick(self.own)
        arr = self.own[name]
        raw = arr.reshape(-1).view(np.uint8)
        off = int(self.rng.integers(raw.size))
        n = int(self.rng.integers(1, min(raw.size - off, 1 << 20) + 1))
        if arr.dtype == np.bool_:
            data = self.rng.integers(0, 2, n, dtype=np.uint8).tobytes()
        else:
            data = self.rng.bytes(n)
        self.c.write_bytes(name, off, data)
        raw[off : off + n] = np.frombuffer(data, np.uint8)
        return None

    def op_read(self) -> str | None:
        name = self.pick(self.own)
        bad = same(self.c.read(name), self.own[name])
        return None if bad is None else f"{name}: {bad}"

    def op_read_out(self) -> str | None:
        name = self.pick(self.own)
        want = self.own[name]
        out = np.empty_like(want)
        self.c.read(name, out=out)
        bad = same(out, want)
        return None if bad is None else f"{name}: {bad}"

    def op_read_bytes(self) -> str | None:
        name = self.pick(self.own)
        raw = self.own[name].reshape(-1).view(np.uint8)
        off = int(self.rng.integers(raw.size))
        n = int(self.rng.integers(1, min(raw.size - off, 2 << 20) + 1))
        got = bytes(self.c.read_bytes(name, off, n))
        if got != raw[off : off + n].tobytes():
            return f"{name}[{off}:{off + n}]: bytes differ"
        return None

    def _delta(self, name: str) -> tuple[np.ndarray, int]:
        dtype, shape = ACCUMULATORS[name]
        return small_ints(self.rng, dtype, shape), int(self.rng.choice([1, -1, 2, 3]))

    def _counted(self, name: str, delta: np.ndarray, alpha: int) -> None:
        self.sums[name] += alpha * delta.astype(self.sums[name].dtype)
        self.acc_counts[name] += 1

    def op_accumulate(self) -> str | None:
        name = self.pick(ACCUMULATORS)
        delta, alpha = self._delta(name)
        a: float = float(alpha) if delta.dtype.kind == "f" else alpha
        self.c.accumulate(name, delta, alpha=a)
        self._counted(name, delta, alpha)
        return None

    def op_accumulate_many(self) -> str | None:
        names = [n for n in ACCUMULATORS if n != "soak/shared/acc_f64"]  # one alpha: integers
        alpha = int(self.rng.choice([1, -1, 2]))
        deltas = {n: small_ints(self.rng, *ACCUMULATORS[n]) for n in names}
        self.c.accumulate_many(deltas, alpha=alpha)
        for n, d in deltas.items():
            self._counted(n, d, alpha)
        return None

    def op_write_many(self) -> str | None:
        new = {n: fill(self.rng, a.dtype, a.shape) for n, a in self.batch.items()}
        self.c.write_many(new)
        self.batch.update(new)
        return None

    def op_read_many(self) -> str | None:
        names = [n for n in self.batch if self.rng.random() < 0.7] or [self.pick(self.batch)]
        got = self.c.read_many(names)
        for n in names:
            if (bad := same(got[n], self.batch[n])) is not None:
                return f"{n}: {bad}"
        return None

    def op_stat(self) -> str | None:
        name = self.pick(self.own | self.batch)
        want = (self.own | self.batch)[name]
        info = self.c.stat(name)
        got = (info.dtype, tuple(info.shape), info.nbytes)
        if got != (want.dtype.name, want.shape, want.nbytes):
            return f"{name}: stat says {got}, wrote {want.dtype} {want.shape}"
        return None

    def op_list(self) -> str | None:
        got = {i.name for i in self.c.list(f"soak/c{self.idx}/")}
        want = set(self.own) | set(self.batch)
        return None if got == want else f"list: {sorted(got ^ want)} differ"

    def op_delete_recreate(self) -> str | None:
        name = self.pick(self.own)
        self.c.delete(name)
        try:
            self.c.stat(name)
            return f"{name}: still there after delete"
        except TensorNotFound:
            pass
        arr = random_array(self.rng)
        self.c.write(name, arr)
        self.own[name] = arr
        return None

    # mount ops (file I/O only)

    def op_fs_save(self) -> str | None:
        f = self.pick(self.files)
        arr = random_array(self.rng)
        np.save(self.fpath(f), arr)
        self.files[f] = arr
        return None

    def op_fs_load(self) -> str | None:
        f = self.pick(self.files)
        bad = same(np.load(self.fpath(f)), self.files[f])
        return None if bad is None else f"{self.fpath(f)}: {bad}"

    def op_fs_cat(self) -> str | None:
        f = self.pick(self.files)
        buf = io.BytesIO()
        with open(self.fpath(f), "rb", buffering=0) as fh:
            while chunk := fh.read(1 << 20):
                buf.write(chunk)
        buf.seek(0)
        bad = same(np.load(buf), self.files[f])
        return None if bad is None else f"cat {self.fpath(f)}: {bad}"

    def op_fs_accumulate(self) -> str | None:
        name = self.pick(ACCUMULATORS)
        dtype, shape = ACCUMULATORS[name]
        delta = small_ints(self.rng, dtype, shape)
        d, _, base = name.rpartition("/")
        np.save(self.mnt / d / ".accumulate" / f"{base}.npy", delta)
        self._counted(name, delta, 1)
        return None

    def op_fs_listdir(self) -> str | None:
        got = set(os.listdir(self.fdir))
        want = {f"{f}.npy" for f in self.files}
        return None if got == want else f"listdir {self.fdir}: {sorted(got ^ want)} differ"

    def op_fs_delete_recreate(self) -> str | None:
        f = self.pick(self.files)
        os.remove(self.fpath(f))
        if self.fpath(f).exists():
            return f"{self.fpath(f)}: still there after rm"
        arr = random_array(self.rng)
        np.save(self.fpath(f), arr)
        self.files[f] = arr
        return None

    def op_fs_cross_read(self) -> str | None:
        if self.rng.random() < 0.5:
            f = self.pick(self.files)
            name = f"soak/m{self.idx}/{f}"
            bad = same(self.c.read(name), self.files[f])
            return None if bad is None else f"client read of {name}: {bad}"
        name = self.pick(self.own)
        path = self.mnt / f"{name}.npy"
        bad = same(np.load(path), self.own[name])
        return None if bad is None else f"np.load {path}: {bad}"

    def result(self) -> dict[str, Any]:
        return {
            "client": self.idx,
            "transport": self.transport,
            "ops": dict(self.ops),
            "errors": dict(self.errors),
            "seconds": dict(self.seconds),
            "slowest": dict(self.slowest),
            "first_errors": self.first_errors,
            "accumulates": dict(self.acc_counts),
            "accumulates_failed": self.acc_failed,
        }


def client_main(
    idx: int,
    config: str,
    mnt: str,
    seed: int,
    skip: list[str],
    out_dir: str,
    ops: Any,
    errs: Any,
    ready: Any,
    go: Any,
    stop: Any,
    deadline: Any,
) -> None:
    """One client process: set up, wait for the start, loop until the deadline, report."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    out = Path(out_dir)
    client = None
    try:
        client = SoakClient(idx, config, Path(mnt), seed, skip, ops, errs, stop)
        client.init()
        ready.release()
        if go.wait(120):
            client.loop(deadline.value)
            client.final_verify()
        np.savez(out / f"c{idx}.npz", **{n.replace("/", "."): s for n, s in client.sums.items()})
        (out / f"c{idx}.json").write_text(json.dumps(client.result()))
    except BaseException:
        (out / f"c{idx}.crash").write_text(traceback.format_exc())
        ready.release()
        raise
    finally:
        if client is not None:
            client.c.close()


# -- the cluster and the mount ----------------------------------------------------------


class Rig:
    """Daemons and a mount in a temp dir; ``close`` always unmounts and stops them."""

    def __init__(self, nodes: int, arena: int, snapshot_interval: float) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="irdma-soak-"))
        self.daemons: dict[str, subprocess.Popen] = {}
        self.mount: subprocess.Popen | None = None
        self.mnt = self.dir / "mnt"
        ports = free_ports("127.0.0.1", 2 * nodes)
        text = (
            f'shard_size = "{SHARD_SIZE}"\nreplicas = {min(2, nodes)}\n'
            f"snapshot_interval = {snapshot_interval}\n"
        )
        self.metrics: dict[str, tuple[str, int]] = {}
        for i in range(nodes):
            name = f"n{i + 1}"
            text += (
                f'\n[[nodes]]\nname = "{name}"\naddress = "tcp://127.0.0.1:{ports[2 * i]}"\n'
                f'data_dir = "{self.dir / name}"\narena_size = {arena}\n'
                f'metrics_address = "127.0.0.1:{ports[2 * i + 1]}"\n'
            )
            self.metrics[name] = ("127.0.0.1", ports[2 * i + 1])
        self.config_path = self.dir / "cluster.toml"
        self.config_path.write_text(text)
        self.config = load_config(self.config_path)

    def log(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def start(self) -> None:
        for node in self.config.nodes:
            node.data_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log(node.name), "ab") as log:
                # A session of their own: Ctrl-C reaches this script only, which stops
                # the clients first, then the mount, then the daemons.
                self.daemons[node.name] = subprocess.Popen(
                    psd_command(self.config_path, node.name),
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        deadline = time.monotonic() + 60
        with Client(self.config_path, timeout=2.0) as c:
            for node in self.config.nodes:
                while True:
                    proc = self.daemons[node.name]
                    if proc.poll() is not None:
                        raise RuntimeError(f"psd {node.name} exited: {self.tail(node.name)}")
                    with contextlib.suppress(IrdmaError):
                        if c.hello(node).get("ready", True):
                            break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"psd {node.name} not ready in 60 s")
                    time.sleep(0.1)
        self.mnt.mkdir()
        with open(self.log("mount"), "ab") as log:
            self.mount = subprocess.Popen(
                [*IRDMA, "--config", str(self.config_path), "mount", str(self.mnt), "--foreground"],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while not os.path.ismount(self.mnt):
            if self.mount.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"irdma mount did not come up: {self.tail('mount')}")
            time.sleep(0.05)

    def tail(self, name: str, n: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log(name).read_text(errors="replace")[-n:]
        return ""

    def pids(self) -> dict[str, int]:
        out = {name: p.pid for name, p in self.daemons.items()}
        if self.mount is not None:
            out["mount"] = self.mount.pid
        return out

    def mounted(self) -> bool:
        target = str(self.mnt.absolute())
        with open("/proc/mounts") as f:
            return any(line.split()[1] == target for line in f)

    def close(self, keep_logs: Path | None) -> None:
        if self.mount is not None:
            stop(self.mount, 30)
        if self.mounted():  # a dead mount: unmount it lazily
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], check=False, timeout=30)
        for p in self.daemons.values():  # SIGTERM all, then wait: they snapshot in parallel
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.daemons.values():
            stop(p, 60)
        if keep_logs is not None:
            shutil.rmtree(keep_logs, ignore_errors=True)
            keep_logs.mkdir(parents=True, exist_ok=True)
            for log in self.dir.glob("*.log"):
                shutil.copy(log, keep_logs / log.name)
        if not self.mounted():
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"soak: {self.mnt} is still mounted; left {self.dir}", file=sys.stderr)


def stop(proc: subprocess.Popen, timeout: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        print(f"soak: pid {proc.pid} ignored SIGTERM for {timeout:g} s; killing", file=sys.stderr)
        proc.kill()
        proc.wait(10)


# -- the run ----------------------------------------------------------------------------


def sample(rig: Rig, t: float, ops: Any, errs: Any, workers: list) -> dict[str, Any]:
    mem = {name: proc_memory(pid) for name, pid in rig.pids().items()}
    clients = [proc_memory(w.pid) for w in workers if w.pid is not None]
    arena = {}
    for name, (host, port) in rig.metrics.items():
        try:
            arena[name] = scrape(host, port).get(("irdma_arena_used_bytes", frozenset()), None)
        except Exception:
            arena[name] = None
    return {
        "t": round(t, 1),
        "memory_mib": mem,
        "clients_max_anon_mib": max((m["RssAnon"] for m in clients if m), default=None),
        "arena_used_bytes": arena,
        "ops": int(sum(ops)),
        "errors": int(sum(errs)),
    }


def bounded(fn: Any, timeout: float) -> Any:
    """``fn()`` in a thread (file I/O on a hung mount blocks); its result or what went wrong."""
    box: list[Any] = [f"no answer within {timeout:g} s"]

    def go() -> None:
        try:
            box[0] = fn()
        except Exception as exc:
            box[0] = repr(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout)
    return box[0]


def daemon_counters(rig: Rig) -> dict[str, Any]:
    """Requests by op and errors by (op, code), summed over the daemons, and per daemon."""
    requests: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    per_node = {}
    for name, (host, port) in rig.metrics.items():
        try:
            s = scrape(host, port)
        except Exception as exc:
            per_node[name] = {"scrape_error": repr(exc)}
            continue
        node = {"requests": 0, "errors": 0, "snapshots": 0, "snapshot_failures": 0}
        for (metric, labels), v in s.items():
            lab = dict(labels)
            if metric == "irdma_requests_total":
                requests[lab["op"]] += int(v)
                node["requests"] += int(v)
            elif metric == "irdma_errors_total":
                errors[f"{lab['op']}/{lab['code']}"] += int(v)
                node["errors"] += int(v)
        node["snapshots"] = int(s.get(("irdma_snapshots_written_total", frozenset()), 0))
        node["snapshot_failures"] = int(s.get(("irdma_snapshot_failures_total", frozenset()), 0))
        per_node[name] = node
    return {"requests": dict(requests), "errors": dict(errors), "per_node": per_node}


def cluster_status(rig: Rig) -> dict[str, Any]:
    try:
        res = subprocess.run(
            [*IRDMA, "--config", str(rig.config_path), "status", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        rows = json.loads(res.stdout)
    except Exception as exc:
        return {"error": repr(exc)}
    return {
        "exit": res.returncode,
        "nodes": {r["node"]: {"up": r["up"], "skew": r.get("skew")} for r in rows},
    }


def log_problems(logs: Path, names: list[str]) -> dict[str, Any]:
    """Warnings, errors and tracebacks in the daemons' and the mount's logs (kept in ``logs``)."""
    out = {}
    for name in names:
        try:
            lines = (logs / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError as exc:
            out[name] = {"lines": 0, "warnings_or_errors": 0, "first": [f"unreadable: {exc}"]}
            continue
        bad = [ln for ln in lines if " WARNING " in ln or " ERROR " in ln or "Traceback" in ln]
        out[name] = {"lines": len(lines), "warnings_or_errors": len(bad), "first": bad[:5]}
    return out


def check_sums(rig: Rig, out_dir: Path, clients: int) -> dict[str, Any]:
    """The shared accumulators against the sum of every client's counted deltas."""
    want = zero_sums()
    missing = []
    for i in range(clients):
        path = out_dir / f"c{i}.npz"
        if not path.exists():
            missing.append(i)
            continue
        with np.load(path) as z:
            for n in want:
                want[n] += z[n.replace("/", ".")]
    result: dict[str, Any] = {"clients_missing": missing, "tensors": {}}
    with Client(rig.config_path) as c:
        for n, (dtype, _) in ACCUMULATORS.items():
            expect = want[n].astype(dtype)
            via_client = c.read(n)
            got = bounded(lambda n=n: np.load(rig.mnt / f"{n}.npy"), 60)
            mount_ok = same(got, expect) is None if isinstance(got, np.ndarray) else got
            result["tensors"][n] = {
                "client_read_exact": same(via_client, expect) is None,
                "mount_read_exact": mount_ok,
                "expected_abs_sum": float(np.abs(want[n]).sum()),
            }
    result["ok"] = not missing and all(
        t["client_read_exact"] is True and t["mount_read_exact"] is True
        for t in result["tensors"].values()
    )
    return result


def collect(out_dir: Path, clients: int) -> list[dict[str, Any]]:
    """Each client's report; a client without one is marked missing (with its crash, if any)."""
    out = []
    for i in range(clients):
        path, crash = out_dir / f"c{i}.json", out_dir / f"c{i}.crash"
        if path.exists():
            out.append(json.loads(path.read_text()))
        else:
            why = crash.read_text()[-3000:] if crash.exists() else None
            out.append({"client": i, "missing": True, "crash": why})
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ops = ctx.RawArray("q", args.clients)
    errs = ctx.RawArray("q", args.clients)
    ready = ctx.Semaphore(0)
    go, stop_ev = ctx.Event(), ctx.Event()
    deadline = ctx.RawValue("d", 0.0)
    out_dir = Path(tempfile.mkdtemp(prefix="irdma-soak-results-"))
    rig = Rig(args.nodes, args.arena, args.snapshot_interval)
    workers: list = []
    samples: list[dict[str, Any]] = []
    report: dict[str, Any] = {"interrupted": False}
    t0 = time.monotonic()
    try:
        rig.start()
        print(
            f"soak: {args.nodes} daemons (pids {list(rig.pids().values())[:-1]}), mount pid "
            f"{rig.mount.pid if rig.mount else None} at {rig.mnt}; starting {args.clients} clients",
            file=sys.stderr,
        )
        with Client(rig.config_path) as c:
            for n, (dtype, shape) in ACCUMULATORS.items():
                c.create(n, shape, dtype)
        shared = (ops, errs, ready, go, stop_ev, deadline)
        for i in range(args.clients):
            w = ctx.Process(
                target=client_main,
                args=(
                    i,
                    str(rig.config_path),
                    str(rig.mnt),
                    args.seed,
                    args.skip,
                    str(out_dir),
                    *shared,
                ),
                name=f"soak-client-{i}",
            )
            w.start()
            workers.append(w)
        setup_deadline = time.monotonic() + 120
        for _ in workers:
            if not ready.acquire(timeout=max(0.1, setup_deadline - time.monotonic())):
                raise RuntimeError("clients did not finish setting up within 120 s")
        t0 = time.monotonic()
        deadline.value = t0 + args.duration
        go.set()
        print(f"soak: running for {args.duration:g} s", file=sys.stderr)
        try:
            next_t = 0.0
            while any(w.is_alive() for w in workers):
                now = time.monotonic() - t0
                if now >= next_t and now <= args.duration + 1:
                    s = sample(rig, now, ops, errs, workers)
                    samples.append(s)
                    next_t += args.interval
                    print(progress_line(s, samples), file=sys.stderr)
                if now > args.duration + 180:
                    print("soak: clients still running 180 s after the end", file=sys.stderr)
                    break
                time.sleep(min(1.0, max(0.05, next_t - now)))
        except KeyboardInterrupt:
            report["interrupted"] = True
            print("soak: interrupted; stopping the clients", file=sys.stderr)
            stop_ev.set()
        for w in workers:
            w.join(max(1.0, t0 + args.duration + 200 - time.monotonic()))
        for w in workers:
            if w.is_alive():
                print(f"soak: {w.name} did not finish; terminating it", file=sys.stderr)
                w.terminate()
                w.join(10)
        end = sample(rig, time.monotonic() - t0, ops, errs, workers)
        end["after_clients"] = True
        samples.append(end)
        report["sums"] = check_sums(rig, out_dir, args.clients)
        report["daemon_metrics"] = daemon_counters(rig)
        report["status"] = cluster_status(rig)
    finally:
        stop_ev.set()
        for w in workers:
            if w.is_alive():
                w.terminate()
                w.join(10)
            if w.is_alive():
                w.kill()
                w.join(10)
        # Stopped first, so their shutdown (final snapshots, the last pushes) is in the logs.
        rig.close(RESULTS / "soak-logs")
        report["logs"] = log_problems(RESULTS / "soak-logs", [*rig.daemons, "mount"])
        report["clients"] = collect(out_dir, args.clients)
        shutil.rmtree(out_dir, ignore_errors=True)
    report["samples"] = samples
    report["elapsed_s"] = time.monotonic() - t0
    return report


def progress_line(s: dict[str, Any], samples: list[dict[str, Any]]) -> str:
    mem = " ".join(
        f"{k}={m['VmRSS']:.0f}/{m['RssAnon']:.0f}" if m else f"{k}=gone"
        for k, m in s["memory_mib"].items()
    )
    rate = ""
    if len(samples) > 1:
        prev = samples[-2]
        rate = f" {(s['ops'] - prev['ops']) / max(1e-9, s['t'] - prev['t']):.0f} ops/s"
    return f"soak: t={s['t']:.0f}s RSS/anon MiB {mem}; ops {s['ops']}{rate}; errors {s['errors']}"


# -- the report -------------------------------------------------------------------------


def growth(samples: list[dict[str, Any]], proc: str, field: str, mark: float) -> dict | None:
    """Growth from the mark to the end of the load: medians of (up to) 3 samples at each end."""
    pts = [
        (s["t"], s["memory_mib"][proc][field])
        for s in samples
        if not s.get("after_clients") and s["memory_mib"].get(proc)
    ]
    after = [p for p in pts if p[0] >= mark]
    if len(after) < 2:
        return None
    k = max(1, min(3, len(after) // 2))  # the two windows never overlap
    base = statistics.median(v for _, v in after[:k])
    end = statistics.median(v for _, v in after[-k:])
    ts, vs = zip(*after, strict=True)
    slope = float(np.polyfit(ts, vs, 1)[0]) * 60 if len(after) >= 3 else None
    limit = max(FLAT_MIB, FLAT_FRACTION * base)
    return {
        "from_t": after[0][0],
        "to_t": after[-1][0],
        "base_mib": base,
        "end_mib": end,
        "growth_mib": end - base,
        "growth_fraction": (end - base) / base if base else None,
        "slope_mib_per_min": slope,
        "max_mib": max(vs),
        "limit_mib": limit,
        "flat": end - base <= limit,
    }


def summarize(args: argparse.Namespace, report: dict[str, Any]) -> dict[str, Any]:
    clients = report["clients"]
    ops: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    slowest: dict[str, float] = {}
    first: list[dict] = []
    for c in clients:
        ops.update(c.get("ops", {}))
        errors.update(c.get("errors", {}))
        seconds.update(c.get("seconds", {}))
        for k, v in c.get("slowest", {}).items():
            slowest[k] = max(slowest.get(k, 0.0), v)
        first.extend(c.get("first_errors", []))
    missing = [c["client"] for c in clients if c.get("missing")]
    samples = report["samples"]
    mark = min(120.0, args.duration / 3)
    procs = list(samples[0]["memory_mib"]) if samples else []
    rss = {
        p: {f: growth(samples, p, f, mark) for f in ("VmRSS", "RssAnon", "RssShmem")} for p in procs
    }
    flat_vm = all(g["VmRSS"] and g["VmRSS"]["flat"] for g in rss.values()) and bool(rss)
    flat_anon = all(g["RssAnon"] and g["RssAnon"]["flat"] for g in rss.values()) and bool(rss)
    total_errors = sum(errors.values()) + len(missing)
    checks = {
        "zero_client_errors": total_errors == 0,
        "exact_sums": bool(report.get("sums", {}).get("ok")),
        "rss_flat": flat_vm,
        "anon_rss_flat": flat_anon,
        "replicas_in_sync": all(
            n.get("up") and n.get("skew") in (0, None)
            for n in report.get("status", {}).get("nodes", {}).values()
        )
        and "nodes" in report.get("status", {}),
    }
    return {
        "args": vars(args),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "interrupted": report["interrupted"],
        "elapsed_s": report["elapsed_s"],
        "ops_by_kind": dict(sorted(ops.items())),
        "errors_by_kind": dict(sorted(errors.items())),
        "mean_ms_by_kind": {k: 1000 * seconds[k] / ops[k] for k in sorted(ops) if ops[k]},
        "slowest_s_by_kind": dict(sorted(slowest.items())),
        "total_ops": sum(ops.values()),
        "total_errors": total_errors,
        "clients_missing": missing,
        "first_errors": first[:20],
        "crashes": [c["crash"] for c in clients if c.get("crash")],
        "accumulates": {
            "applied": sum(sum(c.get("accumulates", {}).values()) for c in clients),
            "raised": sum(c.get("accumulates_failed", 0) for c in clients),
        },
        "sums": report.get("sums"),
        "daemon_metrics": report.get("daemon_metrics"),
        "status": report.get("status"),
        "logs": report.get("logs"),
        "rss_mark_s": mark,
        "rss_growth": rss,
        "checks": checks,
        "ok": all(checks.values()) and not report["interrupted"],
        "samples": samples,
    }


def print_report(s: dict[str, Any]) -> None:
    a = s["args"]
    print(
        f"soak: {a['clients']} clients, {a['nodes']} daemons (2 copies, {a['arena'] // MIB} MiB "
        f"arenas), one mount, {s['elapsed_s']:.0f} s"
        + (" (INTERRUPTED)" if s["interrupted"] else "")
    )
    samples = s["samples"]
    procs = list(samples[0]["memory_mib"]) if samples else []
    print("\nmemory in MiB (VmRSS/RssAnon); arena in use over all daemons; largest client RssAnon:")
    head = f"{'t (s)':>7} " + "".join(f"{p:>12}" for p in procs)
    print(head + f"{'arena':>8}{'client':>8}{'ops/s':>8}{'errors':>8}")
    prev = None
    for x in samples:
        row = f"{x['t']:>7.0f}" + ("*" if x.get("after_clients") else " ")
        for p in procs:
            m = x["memory_mib"].get(p)
            row += f"{m['VmRSS']:>7.0f}/{m['RssAnon']:<4.0f}" if m else f"{'gone':>12}"
        used = [v for v in x["arena_used_bytes"].values() if v is not None]
        row += f"{sum(used) / MIB:>8.0f}" if used else f"{'?':>8}"
        cl = x.get("clients_max_anon_mib")
        row += f"{cl:>8.0f}" if cl is not None else f"{'-':>8}"
        if prev is None or x.get("after_clients"):
            row += f"{'':>8}"
        else:
            row += f"{(x['ops'] - prev['ops']) / max(1e-9, x['t'] - prev['t']):>8.0f}"
        print(row + f"{x['errors']:>8}")
        prev = x
    print("  (* after the clients stopped)")
    print(
        f"\ngrowth from t={s['rss_mark_s']:.0f} s to the end of the load (median of up to 3 "
        f"samples at each end; flat: at most {FLAT_MIB:g} MiB or {FLAT_FRACTION:.0%}):"
    )
    for p, g in s["rss_growth"].items():
        for field, x in g.items():
            if x is None:
                print(f"  {p:<6} {field:<8} not enough samples after the mark")
                continue
            slope = (
                "" if x["slope_mib_per_min"] is None else f", {x['slope_mib_per_min']:+.2f} MiB/min"
            )
            print(
                f"  {p:<6} {field:<8} {x['base_mib']:7.1f} -> {x['end_mib']:7.1f} MiB "
                f"({x['growth_mib']:+.1f} MiB, {100 * (x['growth_fraction'] or 0):+.1f}%{slope}; "
                f"max {x['max_mib']:.0f}): {'flat' if x['flat'] else 'NOT FLAT'}"
                + (
                    " (shared memory mapped: arenas; shown, not a check)"
                    if field == "RssShmem"
                    else ""
                )
            )
    print("\nclient ops by kind (errors, mean ms, slowest s):")
    for k, n in s["ops_by_kind"].items():
        e = s["errors_by_kind"].get(k, 0)
        print(
            f"  {k:<20}{n:>8}{e:>6} err{s['mean_ms_by_kind'].get(k, 0):>9.1f} ms"
            f"{s['slowest_s_by_kind'].get(k, 0):>8.2f} s"
        )
    print(f"  {'total':<20}{s['total_ops']:>8}{s['total_errors']:>6} err")
    if s["clients_missing"]:
        print(f"  clients that reported nothing: {s['clients_missing']}")
    for i, e in enumerate(s["first_errors"][:10]):
        print(f"  ERROR client {e['client']} {e['kind']}: {e['problem']}")
        if e.get("traceback") and i < 3:
            print("    " + e["traceback"].strip().replace("\n", "\n    "))
    for crash in s["crashes"][:3]:
        print("  CRASH " + crash.strip().replace("\n", "\n    "))
    acc = s["accumulates"]
    sums = s.get("sums") or {}
    print(
        f"\nexact sums: {acc['applied']} accumulates counted ({acc['raised']} raised): "
        + ("EXACT" if sums.get("ok") else "MISMATCH")
    )
    for n, t in (sums.get("tensors") or {}).items():
        print(f"  {n}: client read {t['client_read_exact']}, mount read {t['mount_read_exact']}")
    dm = s.get("daemon_metrics") or {}
    if dm:
        reqs = dm.get("requests", {})
        by_op = ", ".join(f"{k} {v}" for k, v in sorted(reqs.items()))
        print(f"\ndaemons' metrics: {sum(reqs.values())} requests ({by_op})")
        errs = dm.get("errors", {})
        print(
            "  answered with an error status (NOT_FOUND, BEHIND, STALE_LAYOUT are also "
            "ordinary answers clients act on; informational): "
            + (", ".join(f"{k} {v}" for k, v in sorted(errs.items())) if errs else "none")
        )
        for node, x in dm.get("per_node", {}).items():
            print(f"  {node}: {x}")
    st = s.get("status") or {}
    print(f"\nirdma status at the end: {st.get('nodes', st)}")
    for name, x in (s.get("logs") or {}).items():
        print(f"log {name}: {x['lines']} lines, {x['warnings_or_errors']} warnings/errors")
        for ln in x["first"]:
            print(f"    {ln[:200]}")
    print("\nchecks: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in s["checks"].items()))
    print("verdict: " + ("PASS" if s["ok"] else "FAIL"))


def plot(s: dict[str, Any], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"plot skipped: matplotlib is not installed ({exc}); pip install matplotlib"
    samples = [x for x in s["samples"] if not x.get("after_clients")]
    if len(samples) < 2:
        return "plot skipped: fewer than 2 samples"
    t = [x["t"] for x in samples]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for i, p in enumerate(samples[0]["memory_mib"]):
        color = f"C{i}"
        for field, style in (("VmRSS", "-"), ("RssAnon", "--")):
            v = [(x["memory_mib"].get(p) or {}).get(field, math.nan) for x in samples]
            ax1.plot(t, v, style, color=color, label=f"{p} {field}")
    ax1.axvline(s["rss_mark_s"], color="grey", lw=0.8, ls=":")
    ax1.set_ylabel("MiB")
    ax1.set_title("resident memory of the daemons and the mount")
    ax1.legend(fontsize=7, ncol=4)
    rates = [
        (b["ops"] - a["ops"]) / max(1e-9, b["t"] - a["t"]) for a, b in itertools.pairwise(samples)
    ]
    ax2.plot(t[1:], rates, color="C0", label="client ops/s")
    ax2.set_ylabel("ops/s")
    ax2.set_xlabel("seconds")
    used = [sum(v for v in x["arena_used_bytes"].values() if v is not None) / MIB for x in samples]
    ax3 = ax2.twinx()
    ax3.plot(t, used, color="C1", label="arena in use, MiB (all daemons)")
    ax3.set_ylabel("arena MiB")
    for ax in (ax1, ax2, ax3):
        ax.set_ylim(bottom=0)
    ax2.legend(loc="upper left", fontsize=7)
    ax3.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot: {path}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load (600)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arena", default="512MiB", help="arena per daemon (512MiB)")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--snapshot-interval", type=float, default=60.0)
    ap.add_argument(
        "--skip", default="", help="op kinds to leave out, comma-separated (e.g. fs_cross_read)"
    )
    ap.add_argument("--json", action="store_true", help="print the JSON report, not the table")
    args = ap.parse_args()
    args.skip = [k for k in args.skip.split(",") if k]
    if unknown := [k for k in args.skip if k not in OPS]:
        ap.error(f"--skip: unknown op kinds {unknown}; known: {', '.join(OPS)}")
    if len(args.skip) == len(OPS):
        ap.error("--skip leaves no op kinds")
    args.arena = parse_size(args.arena)
    if args.nodes < 2:
        ap.error("--nodes must be at least 2 (two copies of every shard)")
    if os.geteuid() != 0 and not os.access("/dev/fuse", os.R_OK | os.W_OK):
        print("soak: /dev/fuse is not usable by this user; run as root", file=sys.stderr)
    # SIGTERM ends the run like Ctrl-C does: the finally clauses stop everything.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    report = run(args)
    s = summarize(args, report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(s, indent=2, default=str))
    note = plot(s, RESULTS / "soak.png")
    if args.json:
        print(json.dumps(s, indent=2, default=str))
    else:
        print_report(s)
        print(f"\njson: {RESULTS / 'soak.json'}; logs: {RESULTS / 'soak-logs'}/")
    print(f"soak: {note}", file=sys.stderr if args.json else sys.stdout)
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
