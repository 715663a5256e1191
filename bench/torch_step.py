#!/usr/bin/env python3
"""Time per training step with N processes: irdma's DDP hook and DistributedOptimizer
against DDP on Gloo, with and without compression, and the bytes sent per step.

    python bench/torch_step.py                                  # digits CNN, 4 processes
    python bench/torch_step.py --model resnet50 --steps 20      # ResNet-50-sized gradients
    python bench/torch_step.py --model resnet50 --size-scale 0.01 --steps 2 --warmup 1  # smoke

Starts ``irdma local`` (``--nodes`` daemons) unless ``--config`` is given,
then runs each system in turn: N processes launched as torchrun would
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) train the model for
``--warmup`` + ``--steps`` steps of SGD with momentum; each times its
measured steps. Reported per system: the median step time of the slowest
rank (ms); the payload bytes one rank sent plus received per step through
irdma (counted by irdma.torch); the bytes per step through the host's
loopback (/proc/net/dev ``lo``, all processes: Gloo's traffic, and irdma's
when it goes over TCP rather than shared memory; other users of the host
add to it, so run it on a quiet machine); and for Gloo, what a ring
allreduce moves per rank, 2 (N-1)/N x the gradient's bytes each way.

Models: ``digits``, the LeNet-style CNN of bench/train_digits.py (13k
parameters, batches of 32 random 8x8 images per rank); ``resnet50``, a
module with ResNet-50's 161 parameter tensors (25.6 M float32, 102 MB;
``--size-scale`` shrinks each) whose loss is a fixed random linear function
of them, so a step is the gradient exchange and the optimizer's update.

Systems (``--systems``, comma-separated; default all): ddp-gloo,
ddp-gloo-fp16 (torch's fp16_compress_hook), ddp-irdma, ddp-irdma-fp16,
ddp-irdma-bf16, ddp-irdma-topk, opt-irdma, opt-irdma-fp16, opt-irdma-bf16,
opt-irdma-topk (top-k sends ``--topk-ratio`` of each tensor).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

SYSTEMS = (
    "ddp-gloo",
    "ddp-gloo-fp16",
    "ddp-irdma",
    "ddp-irdma-fp16",
    "ddp-irdma-bf16",
    "ddp-irdma-topk",
    "opt-irdma",
    "opt-irdma-fp16",
    "opt-irdma-bf16",
    "opt-irdma-topk",
)
BATCH = 32


def resnet50_numels() -> list[int]:
    """Element counts of ResNet-50's parameters (torchvision's layout, 25,557,032 in all)."""
    out = [64 * 3 * 7 * 7, 64, 64]  # conv1, bn1
    inplanes = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            out += [inplanes * width, width, width]  # conv1 1x1, bn1
            out += [width * width * 9, width, width]  # conv2 3x3, bn2
            out += [width * width * 4, width * 4, width * 4]  # conv3 1x1, bn3
            if b == 0:
                out += [inplanes * width * 4, width * 4, width * 4]  # downsample conv, bn
            inplanes = width * 4
    return [*out, 2048 * 1000, 1000]  # fc


# -- one worker process ------------------------------------------------------------------


def build_model(args: argparse.Namespace):
    import torch
    from torch import nn

    if args.model == "digits":
        from train_digits import make_model

        return make_model()

    class GradientsOnly(nn.Module):
        """ResNet-50's parameter tensors; the loss is sum(w_i * p_i), so grad p_i = w_i."""

        def __init__(self, scale: float) -> None:
            super().__init__()
            g = torch.Generator().manual_seed(0)
            sizes = [max(1, int(n * scale)) for n in resnet50_numels()]
            self.weights = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in sizes)
            # Not buffers: DDP would broadcast those before every forward pass.
            self.w = [torch.randn(n, generator=g) for n in sizes]

        def forward(self, x):
            loss = x.sum() * 0
            for p, w in zip(self.weights, self.w, strict=True):
                loss = loss + (p * w).sum()
            return loss

    return GradientsOnly(args.size_scale)


def loopback_bytes() -> int:
    """Bytes sent through ``lo`` so far (each is received there too: counted once)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])
    return 0


def run_worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn

    import irdma.torch
    from irdma.torch import BF16, FP16, NONE, Compression
    from irdma.training.modes import worker_identity

    torch.set_num_threads(1)
    me = worker_identity()
    system = args.system
    compression = {"fp16": FP16, "bf16": BF16, "topk": Compression.topk(args.topk_ratio)}.get(
        system.rsplit("-", 1)[-1], NONE
    )
    model = build_model(args)
    state = None
    if system.startswith("ddp"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        model = DistributedDataParallel(model)
        if system.startswith("ddp-irdma"):
            state = irdma.torch.HookState(compression=compression, name=args.job)
            model.register_comm_hook(state, irdma.torch.allreduce_hook)
        elif system == "ddp-gloo-fp16":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = irdma.torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            model.named_parameters(),
            compression=compression,
            name=args.job,
        )
        state = opt
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(me.rank)
    x = torch.randn(BATCH, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)

    def step() -> None:
        opt.zero_grad()
        out = model(x)
        (loss_fn(out, y) if args.model == "digits" else out).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    sent0 = state.traffic.total() if state is not None else 0
    lo0 = loopback_bytes()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    lo = loopback_bytes() - lo0
    irdma_bytes = (state.traffic.total() - sent0) if state is not None else 0
    if state is not None:
        state.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(
        json.dumps(
            {
                "rank": me.rank,
                "step_ms": statistics.median(times) * 1000,
                "irdma_bytes": irdma_bytes / args.steps,
                "lo_bytes": lo / args.steps,
                "grad_bytes": grad_bytes,
            }
        ),
        flush=True,
    )
    return 0


# -- the launcher ----------------------------------------------------------------------


def one_system(args: argparse.Namespace, config: Path, system: str, port: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--system",
        system,
        "--job",
        f"ts-{uuid.uuid4().hex[:8]}",
    ]
    cmd += ["--model", args.model, "--size-scale", str(args.size_scale)]
    cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    cmd += ["--topk-ratio", str(args.topk_ratio)]
    procs = []
    n = args.workers
    try:
        for rank in range(n):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(n),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                IRDMA_CONFIG=str(config),
            )
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        reports = []
        for rank, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=args.run_timeout)
            if proc.returncode != 0:
                raise SystemExit(f"{system}: rank {rank} failed (exit {proc.returncode})")
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    grad = reports[0]["grad_bytes"]
    return {
        "system": system,
        "workers": n,
        "model": args.model,
        "step_ms": max(r["step_ms"] for r in reports),
        "irdma_bytes_per_rank": statistics.mean(r["irdma_bytes"] for r in reports),
        "loopback_bytes": reports[0]["lo_bytes"],
        # Sent and received: a ring allreduce moves 2 (N-1)/N of the gradient each way.
        "ring_bytes_per_rank": 4 * (n - 1) / n * grad * (0.5 if system == "ddp-gloo-fp16" else 1),
        "gradient_bytes": grad,
    }


def print_table(rows: list[dict]) -> None:
    print(
        f"{'system':16} {'ms/step':>9} {'irdma B/step/rank':>18} {'lo B/step':>12} "
        f"{'ring B/step/rank':>17}"
    )
    for r in rows:
        ring = f"{r['ring_bytes_per_rank']:.3g}" if "gloo" in r["system"] else "-"
        irdma = f"{r['irdma_bytes_per_rank']:.3g}" if "irdma" in r["system"] else "-"
        print(
            f"{r['system']:16} {r['step_ms']:>9.2f} {irdma:>18} {r['loopback_bytes']:>12.3g} "
            f"{ring:>17}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--model", choices=("digits", "resnet50"), default="digits")
    ap.add_argument(
        "--size-scale", type=float, default=1.0, help="resnet50: fraction of each tensor"
    )
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--topk-ratio", type=float, default=0.01)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--arena", default="1GiB", help="per daemon")
    ap.add_argument("--run-timeout", type=float, default=900.0)
    ap.add_argument("--config", help="an existing cluster (default: start irdma local)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return run_worker(args)
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")

    from link import start_local
    from train_digits import stop

    from irdma.cli.local import free_ports

    # SIGTERM unwinds like Ctrl-C, so the cluster started here stops too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="irdma-torch-step-"))
    local = None
    try:
        config = Path(args.config) if args.config else None
        if config is None:
            local, config = start_local(tmp / "cluster", args.nodes, args.arena)
        rows = []
        for system in systems:
            row = one_system(args, config, system, free_ports("127.0.0.1", 1)[0])
            rows.append(row)
            if not args.json:
                print(f"{system}: {row['step_ms']:.2f} ms/step", file=sys.stderr, flush=True)
        if args.json:
            print(json.dumps(rows))
        else:
            print(
                f"{args.model} ({rows[0]['gradient_bytes'] / 1e6:.3g} MB of gradients), "
                f"{args.workers} processes, median of {args.steps} steps after {args.warmup}"
            )
            print_table(rows)
        return 0
    finally:
        stop(local)
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)


if __name__ == "__main__":
    sys.exit(main())
