#!/usr/bin/env python3
"""Train a LeNet-style CNN on scikit-learn's handwritten digits through irdma.

N worker processes (launched with RANK/WORLD_SIZE set, as torchrun does)
train one model held by the daemons, in a training mode (async, sync, ssp,
hybrid), either through the irdma client (``--via client``: pull and push
with ``irdma.pytorch.ParameterServerOptimizer``) or through the mount with
file I/O only (``--via mount``: ``np.load`` of
``<model>/.worker/<rank>/<step>/<tensor>.npy`` pulls, ``np.save`` to the
same path pushes the worker's gradient). The data is ``load_digits`` (1797
8x8 images shipped inside scikit-learn), split 80/20 with a fixed seed.

Without ``--config`` it starts its own cluster (``irdma local``, 3 daemons)
and, for ``--via mount``, its own mount. Run as root for the mount.

    python bench/train_digits.py --workers 4 --mode sync --via client --epochs 30 [--json]
    python bench/train_digits.py --matrix            # every mode x 1,2,4 workers x both ways
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("async", "sync", "ssp", "hybrid")
BATCH = 32
SEED = 0


# -- the model and the data (imported lazily: the launcher needs no torch) --------


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    order = np.random.default_rng(SEED).permutation(len(x))
    x, y = x[order], y[order].astype(np.int64)
    cut = int(len(x) * 0.8)
    return x[:cut], y[:cut], x[cut:], y[cut:]


def make_model():
    import torch
    from torch import nn

    class LeNet(nn.Module):
        """Two conv+pool stages and two dense layers, as LeNet-5, sized for 8x8 input."""

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
            self.fc1 = nn.Linear(32 * 2 * 2, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
            x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
            return self.fc2(torch.relu(self.fc1(x.flatten(1))))

    torch.manual_seed(SEED)
    return LeNet()


def mode_for(kind: str, workers: int, slack: int, groups: int | None, timeout: float):
    from irdma.training.modes import Mode

    if kind == "async":
        return Mode()
    if kind == "sync":
        return Mode.sync(workers, worker_timeout=timeout)
    if kind == "ssp":
        return Mode.ssp(workers, slack, worker_timeout=timeout)
    return Mode.hybrid(workers, groups or max(1, workers // 2), worker_timeout=timeout)


def step_rate(lr: float, contributors: int) -> float:
    """The SGD rate of a step that averages ``contributors`` workers' gradients (sync and
    hybrid; 1 otherwise): ``lr`` times the square root of their number.

    The mean of n gradients has 1/n of one gradient's noise variance: sqrt(n) times the
    rate keeps the update's noise as one worker's. The linear rule (n times) put the
    rate at 0.8 for 4 workers, more than this model's plain SGD bears: late in
    training the updates oscillate, growing two- to threefold a step, until one kills
    most ReLUs and the model predicts one class (test accuracy 0.119, chance).
    """
    return lr * math.sqrt(contributors)


def accuracy(model, x: np.ndarray, y: np.ndarray) -> float:
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        pred = model(torch.from_numpy(x).to(device)).argmax(1).cpu().numpy()
    return float((pred == y).mean())


def rank_device(kind: str):
    """``cpu``, or ``cuda``: the GPU of this rank's LOCAL_RANK (several ranks may share one)."""
    import torch

    if kind == "cpu":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.device("cuda", local % torch.cuda.device_count())


# -- one worker process --------------------------------------------------------------


def run_worker(args: argparse.Namespace) -> int:
    import torch
    from torch import nn

    from irdma import Client
    from irdma.pytorch import ParameterServerOptimizer
    from irdma.training.modes import worker_identity
    from irdma.training.worker import Worker

    torch.set_num_threads(1)
    ident = worker_identity()  # RANK / WORLD_SIZE from the launcher
    rank, n = ident.rank, ident.world_size
    x_train, y_train, _, _ = load_data()
    per = len(x_train) // n  # equal shares: every worker takes the same number of steps
    xs = torch.from_numpy(x_train[rank * per : (rank + 1) * per])
    ys = torch.from_numpy(y_train[rank * per : (rank + 1) * per])
    model = make_model()
    loss_fn = nn.CrossEntropyLoss()
    mode = mode_for(args.mode, n, args.slack, args.groups, args.worker_timeout)
    rng = np.random.default_rng(SEED + rank)
    lr = step_rate(args.lr, mode.contributors(rank))
    with contextlib.ExitStack() as stack:
        if args.via == "client":
            client = stack.enter_context(Client(args.config))
            worker = Worker(client, args.model, mode, rank=rank, world_size=n)
            opt = ParameterServerOptimizer(model, worker, lr)
            opt.init()
        else:  # files only: no client in this process
            files = MountFiles(Path(args.mount) / args.model, rank, model, mode.contributors(rank))
            files.pull(0)
        start = time.perf_counter()
        step = 0
        for _ in range(args.epochs):
            order = rng.permutation(per)
            for i in range(0, per - BATCH + 1, BATCH):
                idx = torch.from_numpy(order[i : i + BATCH])
                model.zero_grad(set_to_none=False)
                loss_fn(model(xs[idx]), ys[idx]).backward()
                if args.via == "client":
                    opt.step()
                else:
                    files.push(step, lr)
                    files.pull(step + 1)
                step += 1
        seconds = time.perf_counter() - start
        if args.via == "client":
            worker.close()
    print(json.dumps({"rank": rank, "seconds": seconds, "steps": step}), flush=True)
    return 0


class MountFiles:
    """A worker's pulls and pushes as .npy files in the mount, nothing else."""

    def __init__(self, model_dir: Path, rank: int, model, contributors: int) -> None:
        self.dir = model_dir
        self.rank = rank
        self.model = model
        self.contributors = contributors
        self.params = dict(model.named_parameters())

    def _path(self, step: int, key: str) -> Path:
        return self.dir / ".worker" / str(self.rank) / str(step) / f"{key}.npy"

    def pull(self, step: int) -> None:
        import torch

        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(torch.from_numpy(np.load(self._path(step, k))))

    def push(self, step: int, lr: float) -> None:
        alpha = -lr / self.contributors
        for k, p in self.params.items():
            np.save(self._path(step, k), alpha * p.grad.numpy())


# -- the launcher ----------------------------------------------------------------------


def start_cluster(tmp: Path):
    from link import start_local

    return start_local(tmp / "cluster", 3, "256MiB")


def start_mount(config: Path, where: Path) -> subprocess.Popen:
    """``irdma mount`` of the cluster at ``where`` (made here), once it is mounted."""
    from fuse import start_mount as run_mount  # bench/fuse.py

    command = [sys.executable, "-m", "irdma", "--config", str(config), "mount", str(where)]
    return run_mount([*command, "--foreground"], where, "irdma mount")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def one_run(args: argparse.Namespace, config: Path, mount: Path | None) -> dict:
    """Train once with ``args.workers`` processes; return the figures."""
    from irdma import Client

    # A top-level directory per run: a path walk in the mount lists only this run.
    model_name = f"digits-{args.mode}-{args.workers}-{args.via}-{uuid.uuid4().hex[:8]}"
    n = args.workers
    x_train, y_train, x_test, y_test = load_data()
    if args.via == "mount":
        # The model is created, in its mode, by whoever sets up the job (here
        # through the client; its mode shows in `irdma stat`); the workers then
        # use nothing but files. The initial values go in through the mount.
        model = make_model()
        mode = mode_for(args.mode, n, args.slack, args.groups, args.worker_timeout)
        with Client(config) as client:
            for k, p in model.named_parameters():
                arr = p.detach().numpy()
                client.create(f"{model_name}/{k}", arr.shape, arr.dtype, mode=mode)
        assert mount is not None
        for k, p in model.named_parameters():
            np.save(mount / model_name / f"{k}.npy", p.detach().numpy())
    cmd = [sys.executable, __file__, "--worker", "--config", str(config), "--model", model_name]
    cmd += ["--mode", args.mode, "--via", args.via, "--epochs", str(args.epochs)]
    cmd += ["--lr", str(args.lr), "--slack", str(args.slack)]
    cmd += ["--worker-timeout", str(args.worker_timeout)]
    if args.groups:
        cmd += ["--groups", str(args.groups)]
    if mount is not None:
        cmd += ["--mount", str(mount)]
    procs = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n))
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    reports = []
    failed = []
    for rank, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=args.run_timeout)
        if proc.returncode != 0:
            failed.append(rank)
            continue
        reports.append(json.loads(out.strip().splitlines()[-1]))
    if failed:
        raise SystemExit(f"worker(s) {failed} failed ({args.mode}, {n} workers, {args.via})")
    import torch

    from irdma import Client

    model = make_model()
    with Client(config) as client, torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(torch.from_numpy(client.read(f"{model_name}/{k}")))
        info = client.stat(f"{model_name}/fc2.weight")
    seconds = max(r["seconds"] for r in reports)
    return {
        "mode": args.mode,
        "workers": n,
        "via": args.via,
        "epochs": args.epochs,
        "steps_per_worker": reports[0]["steps"],
        "test_accuracy": accuracy(model, x_test, y_test),
        "train_accuracy": accuracy(model, x_train, y_train),
        "seconds_per_epoch": seconds / args.epochs,
        "tensor_mode": info.options.get("mode", "async"),
    }


def print_table(rows: list[dict]) -> None:
    print(f"{'mode':8} {'workers':>7} {'via':7} {'test acc':>9} {'s/epoch':>8}")
    for r in rows:
        print(
            f"{r['mode']:8} {r['workers']:>7} {r['via']:7} "
            f"{r['test_accuracy']:>9.3f} {r['seconds_per_epoch']:>8.3f}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mode", choices=MODES, default="sync")
    ap.add_argument("--via", choices=("client", "mount"), default="client")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument(
        "--lr",
        type=float,
        default=0.2,
        help="SGD rate of one worker's gradient (sync, hybrid: x sqrt(group size) for its mean)",
    )
    ap.add_argument("--slack", type=int, default=2, help="ssp: steps a worker may run ahead")
    ap.add_argument("--groups", type=int, default=None, help="hybrid: groups (workers // 2)")
    ap.add_argument("--worker-timeout", type=float, default=60.0)
    ap.add_argument("--run-timeout", type=float, default=900.0)
    ap.add_argument("--config", help="an existing cluster (default: start irdma local)")
    ap.add_argument("--mount", help="an existing mount of that cluster (for --via mount)")
    ap.add_argument("--matrix", action="store_true", help="every mode x 1,2,4 workers x both ways")
    ap.add_argument("--ways", default="client,mount", help="--matrix: which ways (client,mount)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return run_worker(args)

    # SIGTERM unwinds like Ctrl-C, so the cluster and mount started here stop too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="irdma-digits-"))
    local = mount_proc = None
    try:
        config = Path(args.config) if args.config else None
        if config is None:
            local, config = start_cluster(tmp)
        needs_mount = ("mount" in args.ways) if args.matrix else args.via == "mount"
        mount = Path(args.mount) if args.mount else None
        if needs_mount and mount is None:
            mount = tmp / "mnt"
            mount_proc = start_mount(config, mount)
        rows = []
        cells = (
            [(m, n, v) for v in args.ways.split(",") for m in MODES for n in (1, 2, 4)]
            if args.matrix
            else [(args.mode, args.workers, args.via)]
        )
        for m, n, v in cells:
            run_args = argparse.Namespace(**{**vars(args), "mode": m, "workers": n, "via": v})
            row = one_run(run_args, config, mount)
            rows.append(row)
            if not args.json:
                print(
                    f"{m} x{n} via {v}: test accuracy {row['test_accuracy']:.3f}, "
                    f"{row['seconds_per_epoch']:.3f} s/epoch",
                    flush=True,
                )
        if args.json:
            print(json.dumps(rows if args.matrix else rows[0]))
        else:
            print()
            print_table(rows)
        return 0
    finally:
        stop(mount_proc)
        stop(local)
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)


if __name__ == "__main__":
    sys.exit(main())
