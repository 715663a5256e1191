#!/usr/bin/env python3
"""irdma against the machine's limits and against its peers: one run, one table.

    python bench/compare.py [--sizes 4KiB,1MiB,64MiB,256MiB] [--rounds 5] [--procs 2,4]
                            [--only limits,redis,irdma,mpi,gloo,group]
                            [--json bench/results/compare.json] [--png bench/results/compare.png]
    python bench/compare.py --from-json bench/results/compare.json [--png out.png]

Install the peers first with ``sudo bench/setup.sh``; a peer that is missing
gets one row saying how to install it and the rest still runs.

Everything runs on loopback and is started here, then stopped, even on Ctrl-C:
an iperf3 server, ``irdma local`` (3 daemons), a redis-server, ``mpirun`` and
torch.distributed (Gloo) processes. Measured, at each size:

- limits: iperf3, one stream (the link); ``np.copyto`` into a touched array (memory)
- irdma read / write / accumulate, one client per transport, forced with
  ``IRDMA_TRANSPORT=tcp|shm`` in a subprocess (a transport the client cannot
  give makes its rows "n/a (<error>)")
- Redis GET / SET (redis-py, hiredis when installed)
- MPI (OpenMPI + mpi4py) Bcast / Gather / Allreduce, Gloo broadcast / gather / allreduce,
  and irdma's own Group broadcast / gather / allreduce, with each of --procs processes

Time per op is the median over --rounds of (round time / ops in the round);
small sizes run many ops per round. For collectives a round's time is the
slowest member's, each round starting at a barrier. GB/s = size / time per op
(10^9 B/s; for collectives, size is one member's buffer). ``ratio`` is irdma's
GB/s over the reference named beside it (> 1: irdma is faster): tcp against
iperf3, shm against the numpy copy, sizes up to 64 KiB against Redis GET (read)
or SET (write, accumulate), collectives against Gloo and MPI with the same op
and process count. Every irdma size runs again on a cluster keeping two copies
(``--replicas``; rows "irdma tcp R=2"), compared first with the same op on one
copy.

The chart (--png) has one panel per family the run measured (small requests,
large transfers, each collective) and one fixed colour per system, named in
its legend. ``--from-json`` prints the table and draws the chart again from a
saved --json file without measuring.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

SCRIPT = Path(__file__).resolve()
DEFAULT_SIZES = "4KiB,1MiB,64MiB,256MiB"
RESULTS = SCRIPT.parent / "results"
NODES = 3
# Sizes up to this are latency-bound: compared with Redis, not with the link.
LATENCY_MAX = 64 << 10
# The cluster's shard size (irdma's default): the unit of a transport's copies.
SHARD_BYTES = 4 << 20
SHARD_ELEMENTS = SHARD_BYTES // 4
# Small sizes run several ops per round so one round is long enough to time.
ROUND_BYTES = 16 << 20
# Small ops are also timed one by one, this many of each, for median and p99.
LATENCY_OPS = 2000
MAX_OPS_PER_ROUND = 200
SETUP_HINT = "or run bench/setup.sh as root"
INSTALL = {
    "iperf3": f"apt-get install iperf3 ({SETUP_HINT})",
    "redis-server": f"apt-get install redis-server ({SETUP_HINT})",
    "redis": f"pip install redis hiredis ({SETUP_HINT})",
    "mpirun": f"apt-get install openmpi-bin libopenmpi-dev ({SETUP_HINT})",
    "mpi4py": f"pip install mpi4py ({SETUP_HINT})",
    "torch": "pip install torch (the CPU build; deploy/setup.sh does it)",
    "matplotlib": f"pip install matplotlib ({SETUP_HINT})",
}
PEERS = ("limits", "redis", "irdma", "mpi", "gloo", "group")
COLLECTIVES = ("broadcast", "gather", "allreduce")
# irdma's ops warm up until they have touched all the arena room they cycle
# through: a whole-tensor write lands in a new block, so a shard may be in up
# to three (the current copy, the previous and one older, psd/store/copies.py), and
# a collective uses two slots in turn. A first touch of a daemon's memory runs
# at about 1 GB/s on these machines, slower than a copy; MPI, Gloo and Redis
# reuse their buffers from the first call.
ARENA_WARMUP = 6


@dataclass
class Row:
    """One line of the table: a measurement, or a note saying why there is none."""

    system: str
    op: str
    size: int  # bytes per op (per member for collectives); 0: not size-bound (iperf3)
    procs: int = 1
    seconds: float | None = None  # median time per op
    gbps: float | None = None
    p99: float | None = None  # 99th percentile of single ops (small sizes only)
    note: str = ""
    detail: str = ""  # which library or connection classes served it (JSON only)
    # irdma reads: how many were one-sided, how many were handed to the daemon (JSON only)
    one_sided: dict[str, int] | None = None
    refs: list[dict[str, Any]] = field(default_factory=list)  # [{"ref": label, "ratio": x}]


# -- timing (used by every worker alike) -----------------------------------------------


def ops_per_round(size: int) -> int:
    return max(1, min(MAX_OPS_PER_ROUND, ROUND_BYTES // max(1, size)))


def timed_rounds(
    fn: Callable[[], Any], sync: Callable[[], Any], size: int, rounds: int, warmup: int = 1
) -> list:
    """Seconds per op of each round; ``warmup`` ops first, ``sync`` before each round."""
    for _ in range(warmup):
        fn()
    n = ops_per_round(size)
    times = []
    for _ in range(rounds):
        sync()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n)
    return times


async def timed_rounds_async(fn: Callable[[], Awaitable[Any]], size: int, rounds: int) -> list:
    await fn()
    n = ops_per_round(size)
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            await fn()
        times.append((time.perf_counter() - t) / n)
    return times


def nothing() -> None:
    """The sync step of a single process: none needed."""


def op_latencies(fn: Callable[[], Any], size: int) -> list[float] | None:
    """[median, p99] of single ops timed one by one, for sizes up to LATENCY_MAX
    (round trips: what a worker waits for each small pull or push)."""
    if size > LATENCY_MAX:
        return None
    times = []
    for _ in range(LATENCY_OPS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return [statistics.median(times), times[int(len(times) * 0.99)]]


def result(
    op: str, size: int, seconds: list[float], latency: list[float] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"op": op, "size": size, "seconds": seconds}
    if latency is not None:
        out["latency"] = latency
    return out


def float_array(size: int, value: float | None = None) -> np.ndarray:
    n = size // 4
    if value is None:
        return np.random.default_rng(1).random(n, dtype=np.float32)
    return np.full(n, value, dtype=np.float32)


def copy_into(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    np.copyto(dst, src)
    return dst


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


# -- workers: each runs in its own process and reports JSON ----------------------------


def irdma_worker(args: argparse.Namespace) -> dict[str, Any]:
    """read / write / accumulate with one blocking Client (transport from $IRDMA_TRANSPORT):
    what a training script calls, and what redis-py is compared with."""
    from irdma.client import Client

    results = []
    baseline = private_bytes()
    extra = 0  # the client's own memory beyond the two arrays it was given
    shared = args.shared_memory or None
    with Client(Path(args.config), timeout=300, shared_memory=shared) as client:
        for size in args.sizes:
            name = f"_compare/{os.getpid()}/{size}"
            data, out = float_array(size), np.empty(size // 4, dtype=np.float32)
            if shared:  # the data in the client's shared memory: writes skip staging
                data = copy_into(client.shared_empty(len(data)), data)
            ops = {
                "write": partial(client.write, name, data),  # the first write creates it
                "read": partial(client.read, name, out=out),
                "accumulate": partial(client.accumulate, name, data),
            }
            try:
                for op, fn in ops.items():
                    times = timed_rounds(fn, nothing, size, args.rounds, ARENA_WARMUP)
                    results.append(result(op, size, times, op_latencies(fn, size)))
                    if op == "read" and not np.array_equal(out, data):
                        raise AssertionError(f"read back other bytes than written ({size} B)")
                    extra = max(extra, private_bytes() - baseline - data.nbytes - out.nbytes)
            finally:
                with contextlib.suppress(Exception):
                    client.delete(name)
        # Which transports served us: tells whether the transport was honoured.
        conns = client.async_client.session.conns.values()
        kinds = sorted({c.transport for c in conns})
        readers = [r for c in conns if (r := getattr(c.bulk, "directory", None)) is not None]
    memory = {"extra_bytes": extra, "largest_tensor": max(args.sizes)}
    one_sided = {
        "reads": sum(r.reads for r in readers),
        "handed_to_daemon": sum(r.contended for r in readers),
    }
    return {"results": results, "connections": kinds, "memory": memory, "one_sided": one_sided}


def private_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process's own (anonymous) pages, not shared mappings."""
    return status_kib(pid, "RssAnon") << 10


def status_kib(pid: int | str, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def mpi_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Bcast / Gather / Allreduce with mpi4py's buffer methods (run under mpirun)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    args.rank = rank
    results = []
    for size in args.sizes:
        buf, total = float_array(size, rank + 1), np.empty(size // 4, dtype=np.float32)
        # The root's receive buffer only while gathering: at 256 MiB x 4 it is 1 GiB.
        recv = np.empty(n * buf.size, dtype=np.float32) if rank == 0 else None
        ops = {
            "broadcast": partial(comm.Bcast, buf, root=0),
            "gather": partial(comm.Gather, buf, recv, root=0),
            "allreduce": partial(comm.Allreduce, buf, total, op=MPI.SUM),
        }
        for op, fn in ops.items():
            results.append(result(op, size, timed_rounds(fn, comm.Barrier, size, args.rounds)))
        del ops, recv
    # The version string ends in a NUL and goes on with build details.
    library = MPI.Get_library_version().split(",")[0].strip("\0 \n")
    return {"results": results, "library": library}


def gloo_worker(args: argparse.Namespace) -> dict[str, Any]:
    """broadcast / gather / all_reduce with torch.distributed's Gloo backend on CPU."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=args.worker_timeout),
    )
    try:
        results = []
        for size in args.sizes:
            # all_reduce works in place: zeros stay zeros instead of growing to inf.
            part = torch.from_numpy(float_array(size, args.rank + 1))
            # The root's receive tensors only while gathering, as for MPI.
            rows = [torch.empty_like(part) for _ in range(args.world)] if args.rank == 0 else None
            ops = {
                "broadcast": partial(dist.broadcast, torch.from_numpy(float_array(size, 1)), 0),
                "gather": partial(dist.gather, part, rows, dst=0),
                "allreduce": partial(dist.all_reduce, torch.zeros(size // 4)),
            }
            for op, fn in ops.items():
                results.append(result(op, size, timed_rounds(fn, dist.barrier, size, args.rounds)))
            del ops, rows
    finally:
        dist.destroy_process_group()
    return {"results": results, "library": f"torch {torch.__version__}"}


def group_worker(args: argparse.Namespace) -> dict[str, Any]:
    """irdma's Group broadcast / gather / allreduce, one Client per process."""
    from irdma.client import Client
    from irdma.training.collectives import Group

    results = []
    shared = args.shared_memory or None
    with Client(Path(args.config), timeout=300, shared_memory=shared) as client:
        for size in args.sizes:
            arr = float_array(size, args.rank + 1)
            if shared:  # what each process sends, in its shared memory (as MPI_Alloc_mem)
                arr = copy_into(client.shared_empty(arr.size), arr)
            # Results into arrays kept across calls, as MPI's receive buffers are.
            outs = {
                "broadcast": np.empty_like(arr),
                "gather": np.empty((args.world, arr.size), arr.dtype) if args.rank == 0 else None,
                "allreduce": np.empty_like(arr),
            }
            for op in COLLECTIVES:
                # A new group per op and size, closed after, so the daemons hold
                # at most one collective's tensors at a time.
                group = Group(
                    client,
                    f"{args.group_name}-{op}-{size}",
                    rank=args.rank,
                    world_size=args.world,
                    timeout=args.worker_timeout,
                )
                fn = partial(getattr(group, op), arr, out=outs[op])
                try:
                    times = timed_rounds(fn, group.barrier, size, args.rounds, ARENA_WARMUP)
                    results.append(result(op, size, times))
                finally:
                    group.close()
        kinds = sorted({c.transport for c in client.async_client.session.conns.values()})
    return {"results": results, "connections": kinds}


WORKERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "irdma_worker": irdma_worker,
    "mpi_worker": mpi_worker,
    "gloo_worker": gloo_worker,
    "group_worker": group_worker,
}


def run_worker(args: argparse.Namespace, kind: str) -> int:
    """Run one worker; its JSON (or {"error": ...}) goes to stdout or to --out/<rank>.json."""
    try:
        report = WORKERS[kind](args)
        code = 0
    except Exception as exc:
        report, code = {"error": error_text(exc)}, 1
    text = json.dumps(report)
    if args.out:
        Path(args.out, f"{args.rank}.json").write_text(text)
    else:
        print(text, flush=True)
    return code


# -- starting and stopping what the run needs ------------------------------------------


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Stop ``proc`` politely, then for sure."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start(stack: contextlib.ExitStack, cmd: list[str], **kwargs: Any) -> subprocess.Popen:
    """Popen whose stop is registered on ``stack`` before anything else can fail."""
    kwargs.setdefault("stdout", subprocess.DEVNULL)
    kwargs.setdefault("stderr", subprocess.DEVNULL)
    proc = subprocess.Popen(cmd, **kwargs)
    stack.callback(stop, proc)
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{proc.args[0]} is not listening on port {port}")


def worker_cmd(kind: str, args: argparse.Namespace, **extra: Any) -> list[str]:
    cmd = [sys.executable, str(SCRIPT), f"--{kind.replace('_', '-')}"]
    cmd += ["--sizes", ",".join(map(str, args.sizes)), "--rounds", str(args.rounds)]
    cmd += ["--worker-timeout", str(args.worker_timeout)]
    for key, value in extra.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def tail(path: Path) -> str:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    return lines[-1][:200] if lines else ""


def run_ranks(
    cmds: list[list[str]], out: Path, env: dict[str, str], timeout: float, ranks: int = 0
) -> list[dict[str, Any]]:
    """Start the commands, wait for all; the reports of ``ranks`` (default: one per
    command) from ``out``. Raises RuntimeError with the first error a rank reported
    (or the longest last line of stderr)."""
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for i, cmd in enumerate(cmds):
            with open(out / f"proc{i}.err", "w") as err:
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err))
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout:.0f} s") from None
    finally:
        for proc in procs:
            stop(proc, signal.SIGKILL)
    return read_reports(out, ranks or len(cmds), procs)


def read_reports(out: Path, n: int, procs: list[subprocess.Popen]) -> list[dict[str, Any]]:
    reports = []
    for rank in range(n):
        path = out / f"{rank}.json"
        report = json.loads(path.read_text()) if path.exists() else {}
        if "error" in report:
            raise RuntimeError(f"rank {rank}: {report['error']}")
        if "results" not in report:
            errs = [tail(p) for p in sorted(out.glob("proc*.err"))]
            codes = [p.returncode for p in procs]
            raise RuntimeError(f"rank {rank} reported nothing (exit {codes}): {max(errs, key=len)}")
        reports.append(report)
    return reports


def merge_ranks(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per op and size: each round's slowest member, then the median over rounds."""
    merged = []
    for entries in zip(*(r["results"] for r in reports), strict=True):
        rounds = [max(ts) for ts in zip(*(e["seconds"] for e in entries), strict=True)]
        merged.append({**entries[0], "seconds": rounds})
    return merged


def rows_from(
    system: str, results: list[dict[str, Any]], procs: int = 1, detail: str = ""
) -> list[Row]:
    rows = []
    for r in results:
        sec = statistics.median(r["seconds"])
        p99 = None
        if "latency" in r:  # small ops: the median of single round trips
            sec, p99 = r["latency"]
        gbps = r["size"] / sec / 1e9
        rows.append(Row(system, r["op"], r["size"], procs, sec, gbps, p99, detail=detail))
    return rows


def detail_of(report: dict[str, Any]) -> str:
    """What served a worker (library version, connection classes), for the JSON."""
    return report.get("library") or ", ".join(report.get("connections", []))


def missing(system: str, what: str) -> list[Row]:
    return [Row(system, "*", 0, note=f"not installed: {INSTALL[what]}")]


def failed(system: str, exc: BaseException | str, procs: int = 1) -> list[Row]:
    # Our own RuntimeErrors carry the worker's error already, with its type.
    text = str(exc) if isinstance(exc, str | RuntimeError) else error_text(exc)
    return [Row(system, "*", 0, procs, note=f"n/a ({text})")]


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


# -- the peers, measured from the main process -----------------------------------------


def iperf3_round(port: int, seconds: float) -> float:
    """One iperf3 client run, one stream; receiver GB/s."""
    out = subprocess.run(
        ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-J"],
        capture_output=True,
        text=True,
        timeout=seconds + 30,
    )
    report = json.loads(out.stdout or "{}")
    if "error" in report or out.returncode:
        raise RuntimeError(f"iperf3: {report.get('error', out.stderr.strip())}")
    return report["end"]["sum_received"]["bits_per_second"] / 8e9


def measure_iperf3(stack: contextlib.ExitStack, args: argparse.Namespace) -> list[Row]:
    if not shutil.which("iperf3"):
        return missing("iperf3", "iperf3")
    port = free_port()
    server = start(stack, ["iperf3", "-s", "-p", str(port)])
    try:
        wait_port(port, server)
        rates = [iperf3_round(port, args.iperf_seconds) for _ in range(args.rounds)]
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return failed("iperf3", exc)
    finally:
        stop(server)
    return [Row("iperf3", "stream", 0, gbps=statistics.median(rates))]


def copy_by_shard(dst: np.ndarray, src: np.ndarray) -> None:
    for start in range(0, len(src), SHARD_ELEMENTS):
        np.copyto(dst[start : start + SHARD_ELEMENTS], src[start : start + SHARD_ELEMENTS])


def measure_numpy(args: argparse.Namespace) -> list[Row]:
    """One copy of the whole size, and the same bytes copied a shard at a time.

    glibc copies with non-temporal stores only above a threshold (114 MiB
    on these machines), about twice as fast; a transport that copies shard
    by shard (shm) gets the speed of the second row at best.
    """
    rows = []
    for size in args.sizes:
        src = float_array(size)
        dst = np.zeros_like(src)  # touched, so page faults are not timed
        times = timed_rounds(partial(np.copyto, dst, src), nothing, size, args.rounds)
        rows += rows_from("numpy", [result("copy", size, times)])
        if size > SHARD_BYTES:
            times = timed_rounds(partial(copy_by_shard, dst, src), nothing, size, args.rounds)
            rows += rows_from("numpy", [result("copy by shard", size, times)])
    return rows


def measure_redis(stack: contextlib.ExitStack, tmp: Path, args: argparse.Namespace) -> list[Row]:
    if not shutil.which("redis-server"):
        return missing("redis", "redis-server")
    if not has_module("redis"):
        return missing("redis", "redis")
    import redis

    port = free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    cmd += ["--appendonly", "no", "--dir", str(tmp), "--proto-max-bulk-len", "512mb"]
    server = start(stack, cmd)
    try:
        wait_port(port, server)
        r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=300)
        results = []
        for size in args.sizes:
            value = float_array(size).tobytes()
            for op, fn in (("SET", partial(r.set, "k", value)), ("GET", partial(r.get, "k"))):
                times = timed_rounds(fn, nothing, size, args.rounds)
                results.append(result(op, size, times, op_latencies(fn, size)))
            if r.get("k") != value:
                raise AssertionError(f"redis GET returned other bytes ({size} B)")
            r.delete("k")
        r.close()
    except Exception as exc:
        return failed("redis", exc)
    finally:
        stop(server)
    hiredis = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "no hiredis"
    return rows_from(f"redis ({hiredis})", results, detail=f"redis-py {redis.__version__}")


def start_cluster(
    stack: contextlib.ExitStack, tmp: Path, args: argparse.Namespace, replicas: int = 1
) -> Path:
    """``irdma local`` with NODES daemons and arenas that hold the largest collective."""
    biggest = max(args.sizes)
    # Group.gather keeps two slots of one tensor per member; shards hash unevenly
    # over the daemons, hence the 1.5.
    need = biggest * 2 * max(args.procs) if "group" in args.only else biggest
    # Each daemon holds its share of every copy, and a replicated update's bytes are
    # kept until its backups have them.
    if replicas > 1:
        need = max(need, biggest * (replicas + 1))
    arena = f"{int(1.5 * need / NODES) // (1 << 20) + 128}MiB"
    directory = tmp / f"cluster-r{replicas}"
    cmd = [sys.executable, "-m", "irdma", "local", "--nodes", str(NODES)]
    cmd += ["--dir", str(directory), "--arena", arena, "--replicas", str(replicas)]
    proc = start(stack, cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if not line:
        raise RuntimeError(f"irdma local did not start (exit {proc.poll()})")
    return Path(line)


def transport_env(transport: str) -> dict[str, str]:
    return {**os.environ, "IRDMA_TRANSPORT": transport}


def check_transport(transport: str, kinds: list[str]) -> None:
    # A client that ignores IRDMA_TRANSPORT would silently measure tcp as shm.
    if kinds and set(kinds) != {transport}:
        raise RuntimeError(
            f"IRDMA_TRANSPORT={transport} was not honoured: connections were {kinds}"
        )


def measure_irdma(
    config: Path,
    transport: str,
    args: argparse.Namespace,
    memory: list[dict[str, Any]],
    system: str = "",
    one_sided: bool = True,
    shared_memory: int = 0,
) -> list[Row]:
    system = system or f"irdma {transport}"
    env = transport_env(transport)
    if not one_sided:
        env["IRDMA_ONE_SIDED"] = "0"
    try:
        out = subprocess.run(
            worker_cmd("irdma_worker", args, config=config, shared_memory=shared_memory),
            env=env,
            capture_output=True,
            text=True,
            timeout=args.worker_timeout,
        )
    except subprocess.TimeoutExpired:
        return failed(system, f"timed out after {args.worker_timeout:.0f} s")
    lines = out.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        report = {}
    if "results" not in report:
        stderr = out.stderr.strip().splitlines()
        return failed(system, report.get("error") or (stderr[-1] if stderr else "no output"))
    try:
        check_transport(transport, report.get("connections", []))
    except RuntimeError as exc:
        return failed(system, str(exc))
    if mem := report.get("memory"):
        memory.append(
            {
                "what": f"{system} client, beyond its arrays",
                "bytes": mem["extra_bytes"],
                "limit": mem["largest_tensor"],
                "limit_is": "one copy of the largest tensor",
            }
        )
    rows = rows_from(system, report["results"], detail=detail_of(report))
    for row in rows:
        if row.op == "read":
            row.one_sided = report.get("one_sided")
    return rows


def daemon_memory(config: Path) -> list[dict[str, Any]]:
    """Each daemon's peak resident size (VmHWM) against its arena plus 10%."""
    from irdma.cluster import load_config

    out = []
    cfg = load_config(config)
    for node in cfg.nodes:
        pids = subprocess.run(
            ["pgrep", "-f", f"irdma_psd.main --config {config} --node {node.name}$"],
            capture_output=True,
            text=True,
        ).stdout.split()
        if pids:
            out.append(
                {
                    "what": f"daemon {node.name}, peak resident",
                    "bytes": status_kib(pids[0], "VmHWM") << 10,
                    "limit": int(node.arena_size * 1.1),
                    "limit_is": "arena + 10%",
                }
            )
    return out


def measure_mpi(tmp: Path, args: argparse.Namespace) -> list[Row]:
    if not shutil.which("mpirun"):
        return missing("mpi", "mpirun")
    if not has_module("mpi4py"):
        return missing("mpi", "mpi4py")
    rows = []
    for n in args.procs:
        out = tmp / f"mpi-{n}"
        # One command: mpirun starts the ranks; --bind-to none as for the other peers.
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
        cmd += ["-np", str(n), *worker_cmd("mpi_worker", args, out=out)]
        try:
            reports = run_ranks([cmd], out, dict(os.environ), args.worker_timeout, ranks=n)
        except RuntimeError as exc:
            rows += failed("mpi", exc, n)
            continue
        rows += rows_from("mpi", merge_ranks(reports), n, detail_of(reports[0]))
    return rows


def measure_gloo(tmp: Path, args: argparse.Namespace) -> list[Row]:
    if not has_module("torch"):
        return missing("gloo", "torch")
    rows = []
    # Loopback only; one intra-op thread, since up to 4 ranks share 2 cores and
    # collectives gain nothing from torch's thread pool.
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    for n in args.procs:
        out, port = tmp / f"gloo-{n}", free_port()
        cmds = [
            worker_cmd("gloo_worker", args, rank=r, world=n, port=port, out=out) for r in range(n)
        ]
        try:
            reports = run_ranks(cmds, out, env, args.worker_timeout)
        except RuntimeError as exc:
            rows += failed("gloo", exc, n)
            continue
        rows += rows_from("gloo", merge_ranks(reports), n, detail_of(reports[0]))
    return rows


def measure_group(
    config: Path, tmp: Path, transport: str, args: argparse.Namespace, shared: bool = False
) -> list[Row]:
    """The collectives over ``transport``; with ``shared``, each process's input array
    is in its client's shared memory (writes of it skip staging)."""
    suffix = "-shared" if shared else ""
    system = f"irdma group {transport}" + (" shared" if shared else "")
    room = 2 * max(args.sizes) + (64 << 20) if shared else 0
    rows = []
    for n in args.procs:
        out = tmp / f"group-{transport}-{n}{suffix}"
        name = f"compare-{os.getpid()}-{transport}-{n}{suffix}"
        cmds = [
            worker_cmd(
                "group_worker",
                args,
                config=config,
                rank=r,
                world=n,
                group_name=name,
                out=out,
                shared_memory=room,
            )
            for r in range(n)
        ]
        try:
            reports = run_ranks(cmds, out, transport_env(transport), args.worker_timeout)
            check_transport(transport, reports[0].get("connections", []))
        except RuntimeError as exc:
            rows += failed(system, exc, n)
            continue
        rows += rows_from(system, merge_ranks(reports), n, detail_of(reports[0]))
    return rows


def measure_all(args: argparse.Namespace, memory: list[dict[str, Any]]) -> list[Row]:
    """Every row of the table; memory figures of the irdma runs go to ``memory``."""
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="irdma-compare-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        if "limits" in args.only:
            rows += measure_iperf3(stack, args) + measure_numpy(args)
        if "redis" in args.only:
            rows += measure_redis(stack, tmp, args)
        if "mpi" in args.only:
            rows += measure_mpi(tmp, args)
        if "gloo" in args.only:
            rows += measure_gloo(tmp, args)
        if not {"irdma", "group"} & set(args.only):
            return rows
        try:
            config = start_cluster(stack, tmp, args)
        except (RuntimeError, OSError) as exc:
            return rows + failed("irdma", exc)
        if "irdma" in args.only:
            for transport in args.transports:
                rows += measure_irdma(config, transport, args, memory)
                if transport == "shm":
                    # Reads asking the daemon, as before one-sided reads: the difference.
                    system = "irdma shm via daemon"
                    rows += measure_irdma(config, transport, args, [], system, one_sided=False)
                    # Writes of arrays in the client's shared memory: no staging copy.
                    room = 2 * max(args.sizes) + (64 << 20)
                    system = "irdma shm shared"
                    rows += measure_irdma(config, transport, args, [], system, shared_memory=room)
        if "group" in args.only:
            for transport in args.transports:
                rows += measure_group(config, tmp, transport, args)
                if transport == "shm":
                    rows += measure_group(config, tmp, transport, args, shared=True)
        memory += daemon_memory(config)
        if "irdma" in args.only:
            rows += measure_replicated(stack, tmp, args)
    return rows


def measure_replicated(
    stack: contextlib.ExitStack, tmp: Path, args: argparse.Namespace
) -> list[Row]:
    """Every size again on a cluster with each of ``--replicas`` (above 1): what
    forwarding every update to the backups costs a round trip (small sizes) and
    throughput (large ones), each row beside the same op with one copy."""
    rows: list[Row] = []
    for replicas in (r for r in args.replicas if r > 1):
        try:
            config = start_cluster(stack, tmp, args, replicas)
        except (RuntimeError, OSError) as exc:
            rows += failed(f"irdma R={replicas}", exc)
            continue
        for transport in args.transports:
            system = f"irdma {transport} R={replicas}"
            # Their memory says nothing next to the one-copy run's.
            rows += measure_irdma(config, transport, args, [], system)
    return rows


# -- references and ratios -------------------------------------------------------------


def references(row: Row) -> list[tuple[tuple[str, str, int, int], str]]:
    """The rows ``row`` is compared with: ((system, op, size, procs), label). A row with
    more copies ("irdma tcp R=2") is compared with the same op with one copy first."""
    if row.system.startswith(("irdma tcp", "irdma shm")):
        system, _, replicas = row.system.partition(" R=")
        refs = [((system, row.op, row.size, 1), "R=1")] if replicas else []
        if row.size <= LATENCY_MAX:
            op = "GET" if row.op == "read" else "SET"
            return [*refs, (("redis", op, row.size, 1), f"redis {op}")]
        if system == "irdma tcp":
            return [*refs, (("iperf3", "stream", 0, 1), "iperf3")]
        refs.append((("numpy", "copy", row.size, 1), "numpy copy"))
        if row.size > SHARD_BYTES:
            refs.append((("numpy", "copy by shard", row.size, 1), "numpy copy by shard"))
        return refs
    if row.system.startswith("irdma group"):
        peers = ("gloo", "mpi")
        return [((peer, row.op, row.size, row.procs), peer) for peer in peers]
    return []


def system_key(system: str) -> str:
    """A system without its detail in brackets: "redis (hiredis)" is "redis"."""
    return system.split(" (")[0]


def add_ratios(rows: list[Row]) -> None:
    # Keyed without the "(hiredis)" detail, so references need not know it.
    measured = {(system_key(r.system), r.op, r.size, r.procs): r for r in rows if r.gbps}
    for row in rows:
        if not row.gbps:
            continue
        for key, label in references(row):
            ref = measured.get(key)
            row.refs.append({"ref": label, "ratio": row.gbps / ref.gbps if ref else None})


# -- output ----------------------------------------------------------------------------


def human_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def human_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.3f} s"


def human_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"  # small ratios keep two digits


def table_cells(row: Row) -> list[str]:
    """The nine columns, or four and a note when there are no figures."""
    size = human_size(row.size) if row.size else "-"
    procs = str(row.procs) if row.procs > 1 else "-"
    if row.note:
        return [row.system, row.op, size, procs, row.note]
    refs = "; ".join(r["ref"] for r in row.refs)
    ratios = "; ".join(human_ratio(r["ratio"]) for r in row.refs)
    figures = [human_time(row.seconds), human_time(row.p99), f"{row.gbps:.3g}", refs, ratios]
    return [row.system, row.op, size, procs, *figures]


def format_table(rows: list[Row]) -> str:
    head = ["system", "op", "size", "procs", "time/op", "p99", "GB/s", "reference", "ratio"]
    cells = [table_cells(r) for r in rows]
    # Notes run past the figures' columns, so only the first four count them.
    widths = [
        max([len(h)] + [len(c[i]) for c in cells if i < 4 or len(c) == len(head)])
        for i, h in enumerate(head)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("-" * len(lines[0]))
    for c in cells:
        line = "  ".join(x.ljust(w) for x, w in zip(c, widths, strict=False))
        lines.append(line.rstrip())
    return "\n".join(lines)


def sort_key(row: Row) -> tuple:
    """Point-to-point rows as measured; collectives by op, processes, size, system
    (a collective peer's note first in its section)."""
    if row.op in COLLECTIVES:
        return (1, COLLECTIVES.index(row.op), row.procs, row.size)
    if row.system in ("mpi", "gloo") or row.system.startswith("irdma group"):
        return (1, -1)
    return (0,)


def write_json(
    rows: list[Row], path: Path, args: argparse.Namespace, memory: list[dict[str, Any]]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "nodes": NODES,
        "rounds": args.rounds,
        "sizes": args.sizes,
        "procs": args.procs,
        "transports": args.transports,
        "GBps": "size / median time per op, 1e9 bytes/s",
        "ratio": "irdma GB/s / reference GB/s (> 1: irdma faster)",
    }
    body = {"meta": meta, "rows": [asdict(r) for r in rows], "memory": memory}
    path.write_text(json.dumps(body, indent=2))


# -- the chart -------------------------------------------------------------------------

# One colour per system, the same in every chart and run, and no two systems
# alike (tests/test_bench_compare_chart.py checks): a legend then names each
# bar's system once for the whole figure. A system's key drops the detail in
# brackets ("redis (hiredis)" is "redis").
SYSTEM_COLOURS = {
    "iperf3": "#000000",
    "numpy": "#7f7f7f",
    "redis": "#d62728",
    "mpi": "#8c564b",
    "gloo": "#e377c2",
    "irdma tcp": "#1f77b4",
    "irdma shm": "#2ca02c",
    "irdma shm via daemon": "#98df8a",
    "irdma shm shared": "#17becf",
    "irdma rdma": "#9467bd",
    "irdma tcp R=2": "#aec7e8",
    "irdma shm R=2": "#bcbd22",
    "irdma rdma R=2": "#c5b0d5",
    "irdma group tcp": "#ff7f0e",
    "irdma group shm": "#ffbb78",
    "irdma group shm shared": "#8c6d31",
    "irdma group rdma": "#393b79",
}
# For systems the mapping does not name (another replica count, say), in order
# of name; none of these is in SYSTEM_COLOURS.
SPARE_COLOURS = ("#f7b6d2", "#9edae5", "#637939", "#843c39", "#7b4173", "#5254a3", "#e7ba52")
SMALL = "small requests"
LARGE = "large transfers"
# The chart's panels, in order: one per family of rows, drawn only when measured.
FAMILIES = (SMALL, LARGE, *COLLECTIVES)
# Point-to-point ops in the order their bars are drawn; Redis's GET and SET
# stand beside irdma's read and write, as the table compares them.
OP_ORDER = ("read", "write", "accumulate", "copy", "copy by shard", "stream")
OP_AS = {"GET": "read", "SET": "write"}


def system_colours(systems: Iterable[str]) -> dict[str, str]:
    """Each system's colour: fixed for those SYSTEM_COLOURS names, the others a
    spare colour each, by name; ValueError when there are more than spares."""
    keys = sorted({system_key(s) for s in systems})
    others = [k for k in keys if k not in SYSTEM_COLOURS]
    if len(others) > len(SPARE_COLOURS):
        raise ValueError(f"{len(others)} systems without a colour of their own: {others}")
    spare = dict(zip(others, SPARE_COLOURS, strict=False))
    return {s: SYSTEM_COLOURS.get(system_key(s)) or spare[system_key(s)] for s in systems}


def system_rank(system: str) -> tuple[int, str]:
    """Bars and legend entries in SYSTEM_COLOURS' order, the others after, by name."""
    order = list(SYSTEM_COLOURS)
    key = system_key(system)
    return (order.index(key) if key in order else len(order), system)


def family_of(row: Row) -> str:
    if row.op in COLLECTIVES:
        return row.op
    return SMALL if 0 < row.size <= LATENCY_MAX else LARGE


def panels(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """The chart's panels: each family with measured rows, and those rows."""
    measured = [r for r in rows if r.gbps and not r.note]
    found = [(f, [r for r in measured if family_of(r) == f]) for f in FAMILIES]
    return [(f, rs) for f, rs in found if rs]


def category_of(row: Row) -> tuple[tuple[int, int, str], str]:
    """Where a row's bar stands in its panel: (sort key, tick label)."""
    if row.op in COLLECTIVES:
        return (row.size, row.procs, ""), f"{human_size(row.size)} x{row.procs}"
    if row.system == "iperf3":
        return (-1, 0, ""), "link\n(iperf3)"
    op = OP_AS.get(row.op, row.op)
    rank = OP_ORDER.index(op) if op in OP_ORDER else len(OP_ORDER)
    return (row.size, rank, op), f"{op}\n{human_size(row.size)}"


def bar_value(family: str, row: Row) -> float:
    """Small requests in microseconds per op (their table compares times);
    the rest in GB/s."""
    return (row.seconds or 0) * 1e6 if family == SMALL else row.gbps or 0


def draw_panel(ax: Any, family: str, rows: list[Row], colours: dict[str, str]) -> None:
    """Bars by category; each category holds only the systems measured there."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    cats: dict[tuple[int, int, str], tuple[str, list[Row]]] = {}
    for r in rows:
        key, label = category_of(r)
        cats.setdefault(key, (label, []))[1].append(r)
    width = 0.8 / max(len(rs) for _, rs in cats.values())
    for x, key in enumerate(sorted(cats)):
        rs = sorted(cats[key][1], key=lambda r: system_rank(r.system))
        for i, r in enumerate(rs):
            xs = x + (i - (len(rs) - 1) / 2) * width
            bar = ax.bar(xs, bar_value(family, r), width, color=colours[r.system])
            ax.bar_label(bar, fmt=lambda v: f"{v:.3g}" if v < 1000 else f"{v:.0f}", fontsize=6)
    ax.set_xticks(range(len(cats)), [cats[k][0] for k in sorted(cats)], fontsize=8)
    ax.set_yscale("log")
    # Plain numbers at 1, 2 and 5 of each decade ("20", not "2 x 10^1"), so a
    # panel that spans less than a decade still reads.
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.margins(y=0.15)
    if family == SMALL:
        ax.set_ylabel("us per op (log; lower is faster)")
        ax.set_title(f"{family} (<= {human_size(LATENCY_MAX)}), median time per op")
    else:
        ax.set_ylabel("GB/s (log)")
        per = " (size per member x processes)" if family in COLLECTIVES else ", per op"
        ax.set_title(f"{family}{per}")
    ax.grid(axis="y", which="both", alpha=0.3)


def write_png(rows: list[Row], path: Path) -> str:
    if not has_module("matplotlib"):
        return f"no chart: {INSTALL['matplotlib']}"
    found = panels(rows)
    if not found:
        return "no chart: nothing was measured"
    drawn = [r.system for _, rs in found for r in rs]
    try:
        colours = system_colours(drawn)
    except ValueError as exc:
        return f"no chart: {exc}"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(found), 1, figsize=(13, 1.2 + 3.8 * len(found)), squeeze=False)
    for ax, (family, rs) in zip(axes[:, 0], found, strict=True):
        draw_panel(ax, family, rs, colours)
    names = sorted(set(drawn), key=system_rank)
    handles = [Patch(color=colours[n], label=n) for n in names]
    fig.legend(handles=handles, loc="upper center", ncol=min(6, len(names)), fontsize=8)
    legend_rows = -(-len(names) // 6)
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.25 + 0.25 * legend_rows) / fig.get_figheight()))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return f"chart: {path}"


# -- command line ----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from irdma.cluster import parse_size

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"default {DEFAULT_SIZES}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--procs", default="2,4", help="process counts for collectives")
    ap.add_argument("--transports", default="tcp,shm", help="irdma transports (default tcp,shm)")
    ap.add_argument(
        "--replicas",
        default="1,2",
        help="replica counts; every size is measured again at each above 1, against one "
        "copy (default 1,2)",
    )
    ap.add_argument("--only", default=",".join(PEERS), help=f"subset of {','.join(PEERS)}")
    ap.add_argument("--iperf-seconds", type=float, default=2.0)
    ap.add_argument("--worker-timeout", type=float, default=1800.0)
    ap.add_argument("--json", type=Path, default=RESULTS / "compare.json")
    ap.add_argument("--png", type=Path, default=RESULTS / "compare.png")
    ap.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="measure nothing: print the table and draw --png from FILE, a previous --json",
    )
    hidden = argparse.SUPPRESS  # the options the script passes to its own workers
    kinds = ap.add_mutually_exclusive_group()
    for kind in WORKERS:
        kinds.add_argument(f"--{kind.replace('_', '-')}", action="store_true", help=hidden)
    for name, typ in (
        ("config", str),
        ("out", str),
        ("group-name", str),
        ("port", int),
        ("shared-memory", int),
    ):
        ap.add_argument(f"--{name}", type=typ, help=hidden)
    ap.add_argument("--rank", type=int, default=0, help=hidden)
    ap.add_argument("--world", type=int, default=1, help=hidden)
    args = ap.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    if any(s < 4 or s % 4 for s in args.sizes):
        ap.error("sizes must be positive multiples of 4 bytes (float32 arrays)")
    args.procs = [int(p) for p in args.procs.split(",") if p]
    args.transports = [t for t in args.transports.split(",") if t]
    args.replicas = [int(r) for r in args.replicas.split(",") if r]
    args.only = [p for p in args.only.split(",") if p]
    if unknown := set(args.only) - set(PEERS):
        ap.error(f"--only: unknown {sorted(unknown)}; choose from {','.join(PEERS)}")
    return args


def on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # so the finally blocks stop what was started


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for kind in WORKERS:
        if getattr(args, kind):
            return run_worker(args, kind)
    if args.from_json:
        return replay(args)
    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.monotonic()
    memory: list[dict[str, Any]] = []
    try:
        rows = measure_all(args, memory)
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    add_ratios(rows)
    rows.sort(key=sort_key)
    print_report(
        rows,
        memory,
        f"irdma vs limits and peers, loopback, {os.cpu_count()} cores, {NODES} daemons, "
        f"median of {args.rounds} rounds, {time.monotonic() - started:.0f} s",
    )
    write_json(rows, args.json, args, memory)
    print(f"json: {args.json}; {write_png(rows, args.png)}")
    return 0


def print_report(rows: list[Row], memory: list[dict[str, Any]], headline: str) -> None:
    print(headline)
    print("GB/s = size / time per op (1e9 B/s); ratio = irdma GB/s / reference GB/s (> 1: faster)")
    print(
        f"references: R=2 -> R=1 first, tcp -> iperf3, shm -> numpy copy, "
        f"<= {human_size(LATENCY_MAX)} -> Redis GET (read) / SET (write, accumulate), "
        "collectives -> Gloo; MPI"
    )
    print(format_table(rows))
    for m in memory:
        print(
            f"memory: {m['what']}: {m['bytes'] / 2**20:.0f} MiB "
            f"({m['bytes'] / m['limit']:.2f} of {m['limit_is']}, {m['limit'] / 2**20:.0f} MiB)"
        )


def load_run(path: Path) -> tuple[list[Row], list[dict[str, Any]], dict[str, Any]]:
    """A previous run's rows, memory figures and meta, as ``--json`` wrote them;
    ValueError saying what is wrong with the file."""
    try:
        body = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("rows"), list):
        raise ValueError(f"{path} has no list of rows (is it a bench/compare.py --json file?)")
    rows = []
    for i, r in enumerate(body["rows"]):
        try:
            rows.append(Row(**r))
        except TypeError as exc:
            raise ValueError(f"{path}: row {i} is not a compare.py row: {exc}") from exc
    return rows, body.get("memory", []), body.get("meta", {})


def replay(args: argparse.Namespace) -> int:
    """``--from-json``: the table and the chart of a previous run, nothing measured."""
    try:
        rows, memory, meta = load_run(args.from_json)
    except ValueError as exc:
        print(f"--from-json: {exc}", file=sys.stderr)
        return 2
    print_report(
        rows,
        memory,
        f"irdma vs limits and peers, from {args.from_json} (measured {meta.get('when', '?')}, "
        f"{meta.get('cores', '?')} cores, {meta.get('nodes', '?')} daemons, "
        f"median of {meta.get('rounds', '?')} rounds)",
    )
    print(write_png(rows, args.png))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
