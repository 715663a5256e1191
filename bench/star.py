#!/usr/bin/env python3
"""Star emulation from the Soft Memory Box paper: irdma against an MPI star and Gloo.

One parameter server and N workers. Each iteration is the model's compute
time from the paper's table, scaled by ``--compute-scale`` and taken as a
sleep, plus moving the model's bytes (float32): a worker pulls the whole
model and pushes a gradient of the same size, which the server adds in.
Reported per model, N and system: the communication time per iteration
beyond compute (wall time of an iteration minus the compute time; per
iteration the slowest worker counts), median over ``--iterations`` after
``--warmup`` iterations.

Systems:

- ``irdma-tcp``, ``irdma-shm``: an ``irdma local`` cluster (``--nodes``
  daemons, each arena 1.5 x the largest model); N worker processes, forced
  onto a transport with ``IRDMA_TRANSPORT``; per iteration
  ``read(model, out=buf)``, sleep, ``accumulate(model, grad, alpha=-lr)``
  (async mode: no wait on other workers). A transport that fails gives
  ``n/a (<error>)`` rows.
- ``mpi``: mpi4py point to point, rank 0 the server: it Sends the model to
  each worker, then Recvs each gradient and adds it with numpy; workers Recv,
  sleep, Send. Started with ``mpirun --allow-run-as-root --oversubscribe``.
- ``gloo``: torch.distributed on CPU, N processes, no server: sleep, then
  ``all_reduce`` of the gradient.

Models (paper: size, compute per iteration on one GPU; MB = 10^6 bytes):
Inception-v1 51 MB 189 ms, ResNet-50 121 MB 233 ms, Inception-ResNet-v2
214 MB 296 ms, VGG16 528 MB 190 ms (run at ``--vgg-fraction`` of its size).

    python bench/star.py                      # all models, N = 1,2,4, 3 iterations
    python bench/star.py --workers 1,2,4,8 --iterations 5
    python bench/star.py --models resnet-50 --workers 4 --systems irdma-tcp,mpi
    python bench/star.py --size-scale 0.02 --iterations 1 --json /tmp/star.json  # smoke test

Flags:
  --models M,...        inception-v1, resnet-50, inception-resnet-v2, vgg16 or all (default)
  --workers N,...       worker counts (default 1,2,4)
  --systems S,...       irdma-tcp, irdma-shm, irdma-shm-shared, mpi, gloo or all
                        (default; -shared: gradients in the workers' shared memory)
  --iterations K        measured iterations per run (default 3)
  --warmup K            iterations dropped first (default 1)
  --compute-scale F     paper compute time x F is slept (default 0.1)
  --vgg-fraction F      VGG16 runs at F x 528 MB (default 0.5)
  --size-scale F        every model at F x its size, for quick tests (default 1.0)
  --nodes K             irdma daemons (default 3)
  --lr F                the workers' step size; alpha = -lr (default 0.01)
  --timeout S           seconds allowed for one launch (one system, one N; default 300)
  --json PATH           where the results go as JSON (default bench/results/star.json)

The headline is ResNet-50 with 4 workers: irdma's communication time over
MPI's (the paper's 5.2x is a ratio of 0.19; target <= 0.2).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

MB = 10**6
MIB = 1 << 20
BENCH = Path(__file__).resolve().parent
DEFAULT_JSON = BENCH / "results" / "star.json"
SYSTEMS = {
    "irdma-tcp": "irdma tcp",
    "irdma-shm": "irdma shm",
    # The gradient in the worker's shared memory (Client.shared_empty): no staging copy.
    "irdma-shm-shared": "irdma shm shared",
    "mpi": "MPI star",
    "gloo": "Gloo allreduce",
}
HEADLINE_MODEL = "resnet-50"
HEADLINE_WORKERS = 4
TARGET_RATIO = 0.2
ARENA_FACTOR = 1.5
# Generous: several workers' whole-model transfers share 2 cores.
CLIENT_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class Model:
    key: str
    name: str
    paper_mb: int
    compute_ms: int


MODELS = {
    m.key: m
    for m in (
        Model("inception-v1", "Inception-v1", 51, 189),
        Model("resnet-50", "ResNet-50", 121, 233),
        Model("inception-resnet-v2", "Inception-ResNet-v2", 214, 296),
        Model("vgg16", "VGG16", 528, 190),
    )
}


@dataclass(frozen=True, slots=True)
class Settings:
    """What every process of a run needs to agree on (passed to workers as flags)."""

    models: tuple[str, ...]
    iterations: int
    warmup: int
    compute_scale: float
    vgg_fraction: float
    size_scale: float
    lr: float

    def nbytes(self, key: str) -> int:
        frac = self.size_scale * (self.vgg_fraction if key == "vgg16" else 1.0)
        return max(4, int(MODELS[key].paper_mb * MB * frac) // 4 * 4)

    def compute_s(self, key: str) -> float:
        return MODELS[key].compute_ms / 1000 * self.compute_scale

    def flags(self) -> list[str]:
        return [
            "--models",
            ",".join(self.models),
            "--iterations",
            str(self.iterations),
            "--warmup",
            str(self.warmup),
            "--compute-scale",
            repr(self.compute_scale),
            "--vgg-fraction",
            repr(self.vgg_fraction),
            "--size-scale",
            repr(self.size_scale),
            "--lr",
            repr(self.lr),
        ]


# -- the timed loop every worker runs ------------------------------------------------


def timed_iterations(settings: Settings, key: str, step: Callable[[float], None]) -> list[float]:
    """Warm-up plus measured iterations of ``step(compute_s)``; each one's time beyond compute."""
    compute = settings.compute_s(key)
    comm = []
    for i in range(settings.warmup + settings.iterations):
        t0 = time.perf_counter()
        step(compute)
        wall = time.perf_counter() - t0
        if i >= settings.warmup:
            comm.append(wall - compute)
    return comm


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def emit_error(exc: BaseException) -> None:
    emit({"error": f"{type(exc).__name__}: {exc}".strip().rstrip(":")})


def grad_for(nbytes: int) -> np.ndarray:
    # A constant keeps the model's values bounded over many accumulates.
    return np.full(nbytes // 4, 1e-3, dtype=np.float32)


def touched(nbytes: int) -> np.ndarray:
    # Touched up front, so page faults of a fresh array do not count as communication.
    return np.zeros(nbytes // 4, dtype=np.float32)


# -- irdma worker ---------------------------------------------------------------------


def irdma_worker(args: argparse.Namespace, settings: Settings) -> int:
    from irdma.client import Client
    from irdma.training.collectives import Group

    largest = max(settings.nbytes(k) for k in settings.models)
    shared = 2 * largest if args.shared else None
    try:
        with Client(args.config, timeout=CLIENT_TIMEOUT, shared_memory=shared) as client:
            group = Group(client, args.group, rank=args.rank, world_size=args.world)
            for key in settings.models:
                irdma_model(client, group, args, settings, key)
            group.close()
    except Exception as exc:  # reported as the row's n/a, not a traceback
        emit_error(exc)
        return 1
    return 0


def irdma_model(
    client: Any, group: Any, args: argparse.Namespace, settings: Settings, key: str
) -> None:
    name = f"star/{args.group}/{key}"
    nbytes = settings.nbytes(key)
    if args.rank == 0:
        client.write(name, np.zeros(nbytes // 4, dtype=np.float32), replace=True)
    buf, grad = touched(nbytes), grad_for(nbytes)
    if args.shared:
        shared = client.shared_empty(len(grad))
        shared[:] = grad
        grad = shared
    alpha = -settings.lr
    group.barrier()

    def step(compute: float) -> None:
        client.read(name, out=buf)
        time.sleep(compute)
        client.accumulate(name, grad, alpha=alpha)

    comm = timed_iterations(settings, key, step)
    group.barrier()
    if args.rank == 0:
        client.delete(name)  # room in the arenas for the next model
    emit({"model": key, "rank": args.rank, "comm": comm, "connections": connection_kinds(client)})


def connection_kinds(client: Any) -> list[str]:
    # Which connection classes the client really used: shows whether
    # IRDMA_TRANSPORT took effect (private attribute, diagnostic only).
    session = getattr(getattr(client, "_client", None), "session", None)
    conns = session.conns if session is not None else {}
    return sorted({type(c).__name__ for c in conns.values()})


# -- MPI star -------------------------------------------------------------------------


def mpi_worker(args: argparse.Namespace, settings: Settings) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    try:
        for key in settings.models:
            mpi_model(comm, settings, key)
    except Exception as exc:  # one rank failing must stop every rank
        emit_error(exc)
        sys.stdout.flush()
        comm.Abort(1)
    return 0


def mpi_model(comm: Any, settings: Settings, key: str) -> None:
    nbytes = settings.nbytes(key)
    rank, workers = comm.Get_rank(), comm.Get_size() - 1
    comm.Barrier()
    if rank == 0:
        mpi_server(comm, settings, nbytes, workers)
        comm_times: list[float] = []
    else:
        # Scaled by -lr up front, so the server's update is one numpy add (MPI's cheapest).
        model, grad = touched(nbytes), grad_for(nbytes) * np.float32(-settings.lr)

        def step(compute: float) -> None:
            comm.Recv(model, source=0, tag=1)
            time.sleep(compute)
            comm.Send(grad, dest=0, tag=2)

        comm_times = timed_iterations(settings, key, step)
    # Worker ranks' times go to rank 0, so one process prints the results.
    gathered = comm.gather(comm_times, root=0)
    if rank == 0:
        for r in range(1, workers + 1):
            emit({"model": key, "rank": r - 1, "comm": gathered[r]})


def mpi_server(comm: Any, settings: Settings, nbytes: int, workers: int) -> None:
    from mpi4py import MPI

    model, incoming = touched(nbytes), touched(nbytes)
    for _ in range(settings.warmup + settings.iterations):
        for w in range(1, workers + 1):
            comm.Send(model, dest=w, tag=1)
        for _ in range(workers):
            # Gradients arrive in the order workers finish, as a server would take them.
            comm.Recv(incoming, source=MPI.ANY_SOURCE, tag=2)
            model += incoming


# -- Gloo allreduce -------------------------------------------------------------------


def gloo_worker(args: argparse.Namespace, settings: Settings) -> int:
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.port}",
            rank=args.rank,
            world_size=args.world,
        )
        try:
            for key in settings.models:
                gloo_model(dist, torch, args.rank, settings, key)
        finally:
            dist.destroy_process_group()
    except Exception as exc:  # reported as the row's n/a
        emit_error(exc)
        return 1
    return 0


def gloo_model(dist: Any, torch: Any, rank: int, settings: Settings, key: str) -> None:
    grad = torch.full((settings.nbytes(key) // 4,), 1e-3, dtype=torch.float32)
    dist.barrier()

    def step(compute: float) -> None:
        time.sleep(compute)
        dist.all_reduce(grad)

    emit({"model": key, "rank": rank, "comm": timed_iterations(settings, key, step)})


# -- launching and collecting ---------------------------------------------------------


@dataclass(slots=True)
class Launch:
    """The outcome of one launch: result lines per model, or the error that stopped it."""

    records: list[dict[str, Any]]
    error: str | None


def run_processes(
    cmds: list[list[str]], env: dict[str, str], timeout: float, logdir: Path
) -> Launch:
    """Run the commands together; stop the rest as soon as one fails."""
    procs: list[subprocess.Popen[str]] = []
    logs = [logdir / f"proc{i}-{uuid.uuid4().hex[:6]}.err" for i in range(len(cmds))]
    try:
        for cmd, log in zip(cmds, logs, strict=True):
            with open(log, "w") as err:
                procs.append(
                    subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
                )
        error = wait_all(procs, timeout)
        records, reported = [], None
        for p in procs:
            out = p.stdout.read() if p.stdout else ""
            for line in out.splitlines():
                if line.startswith("{"):
                    rec = json.loads(line)
                    if "error" in rec:
                        reported = reported or rec["error"]
                    else:
                        records.append(rec)
        if error and not reported:
            reported = f"{error}: {last_line(logs)}"
        return Launch(records, reported)
    finally:
        stop(procs)


def wait_all(procs: list[subprocess.Popen[str]], timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            return f"exit status {next(c for c in codes if c not in (None, 0))}"
        if all(c == 0 for c in codes):
            return None
        if time.monotonic() > deadline:
            return f"timed out after {timeout:g} s"
        time.sleep(0.1)


def stop(procs: list[subprocess.Popen[str]], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; close their pipes."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stdout:
            p.stdout.close()


def last_line(logs: list[Path]) -> str:
    for log in logs:
        with contextlib.suppress(OSError):
            lines = [x for x in log.read_text().splitlines() if x.strip()]
            if lines:
                return lines[-1].strip()
    return "no output"


def worker_cmd(mode: str, settings: Settings, *extra: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), mode, *settings.flags(), *extra]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # The transport is chosen per launch; one set in the caller's shell must not leak in.
    env.pop("IRDMA_TRANSPORT", None)
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    return env


# `irdma local`'s own runner (start, wait until ready, print the config path,
# stop on SIGTERM), on a config written here.
LOCAL_RUNNER = (
    "import sys, trio; from pathlib import Path; from irdma.cli.local import run_local; "
    "sys.exit(trio.run(run_local, Path(sys.argv[1])))"
)


@contextlib.contextmanager
def irdma_cluster(nodes: int, arena_bytes: int, directory: Path) -> Iterator[Path]:
    """Daemons on loopback as ``irdma local`` runs them; yields the config path."""
    from irdma.cli.local import write_config

    # No periodic snapshots: writing a large model to disk mid-run would be
    # timed as communication.
    config = write_config(
        directory,
        nodes,
        arena_size=max(64, math.ceil(arena_bytes / MIB)) * MIB,
        extra={"snapshot_interval": 0},
    )
    log_path = directory / "local.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", LOCAL_RUNNER, str(config)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=child_env(),  # the daemons and the readiness check use the default transport
        )
        try:
            if not (proc.stdout.readline().strip() if proc.stdout else ""):
                raise RuntimeError(f"irdma local did not start: {last_line([log_path])}")
            yield config
        finally:
            stop([proc], grace=30)  # the daemons write a final snapshot


def run_irdma(
    transport: str,
    workers: list[int],
    settings: Settings,
    args: argparse.Namespace,
    tmp: Path,
    shared: bool = False,
) -> dict[int, Launch]:
    arena = ARENA_FACTOR * max(settings.nbytes(k) for k in settings.models)
    out: dict[int, Launch] = {}
    try:
        where = tmp / f"cluster-{transport}{'-shared' if shared else ''}"
        with irdma_cluster(args.nodes, int(arena), where) as config:
            for n in workers:
                group = f"star-{transport}-{n}-{uuid.uuid4().hex[:8]}"
                cmds = [
                    worker_cmd(
                        "--irdma-worker",
                        settings,
                        *("--config", str(config), "--group", group),
                        *("--rank", str(r), "--world", str(n)),
                        *(["--shared"] if shared else []),
                    )
                    for r in range(n)
                ]
                env = child_env(IRDMA_TRANSPORT=transport)
                out[n] = run_processes(cmds, env, args.timeout, tmp)
    except RuntimeError as exc:
        return {n: Launch([], str(exc)) for n in workers}
    return out


def run_mpi(
    workers: list[int], settings: Settings, args: argparse.Namespace, tmp: Path
) -> dict[int, Launch]:
    missing = not_installed("mpi4py", "mpirun")
    if missing:
        return {n: Launch([], missing) for n in workers}
    out = {}
    for n in workers:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n + 1)]
        cmd += worker_cmd("--mpi-worker", settings)
        out[n] = run_processes([cmd], child_env(), args.timeout, tmp)
    return out


def run_gloo(
    workers: list[int], settings: Settings, args: argparse.Namespace, tmp: Path
) -> dict[int, Launch]:
    from irdma.cli.local import free_ports

    missing = not_installed("torch", None)
    if missing:
        return {n: Launch([], missing) for n in workers}
    out = {}
    for n in workers:
        port = free_ports("127.0.0.1", 1)[0]
        cmds = [
            worker_cmd(
                "--gloo-worker", settings, "--rank", str(r), "--world", str(n), "--port", str(port)
            )
            for r in range(n)
        ]
        out[n] = run_processes(cmds, child_env(GLOO_SOCKET_IFNAME="lo"), args.timeout, tmp)
    return out


def not_installed(module: str, program: str | None) -> str | None:
    if importlib.util.find_spec(module) is None:
        return f"not installed ({module})"
    if program and shutil.which(program) is None:
        return f"not installed ({program})"
    return None


# -- results --------------------------------------------------------------------------


def summarize(system: str, launches: dict[int, Launch], settings: Settings) -> list[dict[str, Any]]:
    """One row per model and N: the median over iterations of the slowest worker's time."""
    rows = []
    for n, launch in launches.items():
        for key in settings.models:
            recs = [r for r in launch.records if r["model"] == key]
            row: dict[str, Any] = {"model": key, "workers": n, "system": system}
            if len(recs) == n:
                per_iter = [max(c) for c in zip(*(r["comm"] for r in recs), strict=True)]
                row |= {
                    "status": "ok",
                    "comm_s": statistics.median(per_iter),
                    "comm_per_iteration_s": per_iter,
                    "comm_per_worker_s": [r["comm"] for r in sorted(recs, key=lambda r: r["rank"])],
                }
                if "connections" in recs[0]:
                    row["connections"] = recs[0]["connections"]
            else:
                row |= {"status": status_text(launch.error), "comm_s": None}
            rows.append(row)
    return rows


def status_text(error: str | None) -> str:
    if error and error.startswith("not installed"):
        return error
    return f"n/a ({error or 'no result'})"


def add_ratios(rows: list[dict[str, Any]]) -> None:
    mpi = {
        (r["model"], r["workers"]): r["comm_s"]
        for r in rows
        if r["system"] == SYSTEMS["mpi"] and r["comm_s"]
    }
    for r in rows:
        base = mpi.get((r["model"], r["workers"]))
        r["ratio_to_mpi"] = r["comm_s"] / base if base and r["comm_s"] is not None else None


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    found = {
        r["system"]: r["ratio_to_mpi"]
        for r in rows
        if r["model"] == HEADLINE_MODEL
        and r["workers"] == HEADLINE_WORKERS
        and r["system"].startswith("irdma")
    }
    return {"model": HEADLINE_MODEL, "workers": HEADLINE_WORKERS, "target": TARGET_RATIO} | {
        "irdma_over_mpi": found
    }


def print_table(rows: list[dict[str, Any]], settings: Settings, head: dict[str, Any]) -> None:
    print(
        f"star emulation: compute = paper time x {settings.compute_scale:g} (a sleep), "
        f"VGG16 at {settings.vgg_fraction:g} x 528 MB, sizes x {settings.size_scale:g}; "
        f"comm = wall - compute per iteration (slowest worker), "
        f"median of {settings.iterations} after {settings.warmup} warm-up"
    )
    print(
        f"{'model':<21}{'MB':>8}{'compute ms':>12}{'N':>4}  {'system':<16}"
        f"{'comm s/iter':>14}{'ratio to MPI':>14}"
    )
    print("-" * 89)
    for r in rows:
        key = r["model"]
        ratio = f"{r['ratio_to_mpi']:.2f}" if r["ratio_to_mpi"] is not None else "-"
        # A failed row shows its reason in full, left-aligned, instead of the two figures.
        figures = (
            f"{r['comm_s']:>14.4f}{ratio:>14}" if r["comm_s"] is not None else f"  {r['status']}"
        )
        print(
            f"{MODELS[key].name:<21}{settings.nbytes(key) / MB:>8.1f}"
            f"{settings.compute_s(key) * 1000:>12.1f}{r['workers']:>4}  {r['system']:<16}"
            f"{figures}"
        )
    print(headline_text(head))


def headline_text(head: dict[str, Any]) -> str:
    what = f"headline: {MODELS[HEADLINE_MODEL].name} size, {HEADLINE_WORKERS} workers"
    if not head["irdma_over_mpi"]:
        return f"{what}: not run"
    parts = [
        f"{system} / MPI = {ratio:.2f}" if ratio is not None else f"{system} / MPI = n/a"
        for system, ratio in head["irdma_over_mpi"].items()
    ]
    return f"{what}: {', '.join(parts)} (target <= {TARGET_RATIO}, the paper's 5.2x)"


# -- command line ---------------------------------------------------------------------


def parse_list(text: str, choices: list[str]) -> list[str]:
    items = choices if text == "all" else [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in choices]
    if bad or not items:
        raise SystemExit(f"{text!r}: choose from {', '.join(choices)} or all")
    return items


def parse_workers(text: str) -> list[int]:
    try:
        workers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        workers = []
    if not workers or min(workers) < 1:
        raise SystemExit(f"--workers {text!r}: expected worker counts such as 1,2,4")
    return workers


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="all")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--systems", default="all")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--compute-scale", type=float, default=0.1)
    ap.add_argument("--vgg-fraction", type=float, default=0.5)
    ap.add_argument("--size-scale", type=float, default=1.0)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    # Internal: how the script starts its own worker processes.
    for flag in ("--irdma-worker", "--mpi-worker", "--gloo-worker", "--shared"):
        ap.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in ("--rank", "--world", "--port"):
        ap.add_argument(flag, type=int, default=0, help=argparse.SUPPRESS)
    for flag in ("--config", "--group"):
        ap.add_argument(flag, help=argparse.SUPPRESS)
    return ap


def settings_from(args: argparse.Namespace) -> Settings:
    if args.iterations < 1 or args.warmup < 0:
        raise SystemExit("--iterations must be >= 1 and --warmup >= 0")
    return Settings(
        models=tuple(parse_list(args.models, list(MODELS))),
        iterations=args.iterations,
        warmup=args.warmup,
        compute_scale=args.compute_scale,
        vgg_fraction=args.vgg_fraction,
        size_scale=args.size_scale,
        lr=args.lr,
    )


def run_all(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    workers = parse_workers(args.workers)
    systems = parse_list(args.systems, list(SYSTEMS))
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="irdma-star-"))
    try:
        for system in systems:
            if system.startswith("irdma-"):
                transport = system.removeprefix("irdma-").removesuffix("-shared")
                shared = system.endswith("-shared")
                launches = run_irdma(transport, workers, settings, args, tmp, shared)
            elif system == "mpi":
                launches = run_mpi(workers, settings, args, tmp)
            else:
                launches = run_gloo(workers, settings, args, tmp)
            rows += summarize(SYSTEMS[system], launches, settings)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    order = list(SYSTEMS.values())
    rows.sort(
        key=lambda r: (settings.models.index(r["model"]), r["workers"], order.index(r["system"]))
    )
    add_ratios(rows)
    return {
        "settings": asdict(settings),
        "models": {
            k: {
                "paper_mb": MODELS[k].paper_mb,
                "paper_compute_ms": MODELS[k].compute_ms,
                "bytes": settings.nbytes(k),
                "compute_s": settings.compute_s(k),
            }
            for k in settings.models
        },
        "workers": workers,
        "nodes": args.nodes,
        "rows": rows,
        "headline": headline(rows),
    }


def main() -> int:
    args = build_parser().parse_args()
    settings = settings_from(args)
    if args.irdma_worker:
        return irdma_worker(args, settings)
    if args.mpi_worker:
        return mpi_worker(args, settings)
    if args.gloo_worker:
        return gloo_worker(args, settings)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the daemons and workers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run_all(args, settings)
    print_table(result["rows"], settings, result["headline"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
