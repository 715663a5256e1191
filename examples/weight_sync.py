#!/usr/bin/env python3
"""Trainer-to-inference weight sync through model versions.

    pip install -e '.[torch]'
    export IRDMA_CONFIG=$(irdma local --dir /tmp/irdma --background)
    python examples/weight_sync.py [--layers 8] [--width 1024] [--steps 12] [--json out.json]

A trainer keeps fp32 master weights of a small MLP, takes AdamW steps at an
RL-like learning rate (1e-6), and publishes the bf16 copy as a new version
of model ``ws/policy`` every step (irdma.torch.publish_state_dict). Reader
processes follow it while it trains (irdma.torch.StateFollower), each with
its own layout: one holds the whole model, two are the tensor-parallel
halves of every layer (rows of the first half of the weights). Each sync
moves only the elements that changed since the version the reader holds,
and each whole tensor is checked against the commit's digest.

Then, from one process, with nothing else running: for a reader 1, 3 and 8
versions behind, the bytes a sync moves as a fraction of the full model and
its time, against a full read of the version and against a torch.distributed
broadcast of the same state dict over Gloo (two processes on this host).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch
from torch import nn

from irdma import Client, VersionNotFound
from irdma.torch import StateFollower, publish_state_dict

PREFIX = "ws/policy"


def make_model(layers: int, width: int, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    body: list[nn.Module] = []
    for _ in range(layers):
        body += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*body).to(dtype)


def train_step(
    master: nn.Module, published: nn.Module, opt: torch.optim.Optimizer, width: int
) -> list[torch.Tensor]:
    """One AdamW step on the fp32 master weights, then their bf16 copy into ``published``;
    the fraction of each tensor's elements that changed."""
    loss = master(torch.randn(64, width)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    changed = []
    with torch.no_grad():
        for dst, src in zip(published.parameters(), master.parameters(), strict=True):
            new = src.to(torch.bfloat16)
            changed.append((new.view(torch.int16) != dst.view(torch.int16)).float().mean())
            dst.copy_(new)
    return changed


def model_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def tp_slices(module: nn.Module, rank: int) -> dict[str, tuple[slice, ...]]:
    """Rank ``rank`` of 2's rows of every weight and bias (a column-parallel layout)."""
    out = {}
    for name, t in module.state_dict().items():
        half = t.shape[0] // 2
        out[name] = (slice(rank * half, (rank + 1) * half),)
    return out


def follower(
    config: str, transport: str | None, layers: int, width: int, rank: int | None, last: int, q: Any
) -> None:
    """A reader process: follow every version up to ``last``, report bytes per sync."""
    module = make_model(layers, width, torch.bfloat16)
    slices = None
    if rank is not None:
        slices = tp_slices(module, rank)
        for name, p in module.named_parameters():
            p.data = p.data[slices[name]].clone()
    with Client(config, transport=transport) as c:
        f = StateFollower(c, PREFIX, module, slices=slices)
        moved: list[int] = []
        while f.version < last:
            try:
                before = f.version
                f.sync(at_least=f.version + 1)
                if before:
                    moved.append(f.last_bytes)
            except VersionNotFound:  # not committed yet: wait for the trainer
                time.sleep(0.01)
        q.put((rank, model_bytes(module), moved))


def broadcast_times(tensors: list[torch.Tensor], rounds: int) -> list[float]:
    """Seconds each of ``rounds`` broadcasts of ``tensors`` from rank 0 took, between
    barriers (in a process group already made)."""
    import torch.distributed as dist

    times = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for t in tensors:
            dist.broadcast(t, src=0)
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return times


def gloo_broadcast(rank: int, port: int, layers: int, width: int, rounds: int, q: Any) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    module = make_model(layers, width, torch.bfloat16)
    times = broadcast_times(list(module.state_dict().values()), rounds)
    if rank == 1:
        q.put(statistics.median(times))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12, help="versions published (at least 9)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--rounds", type=int, default=5, help="timings per figure (median)")
    ap.add_argument("--transport", help="tcp, shm or rdma (default: the fastest the host has)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    config = os.environ.get("IRDMA_CONFIG")
    if not config:
        print("set IRDMA_CONFIG (irdma local prints it)", file=sys.stderr)
        return 2
    if args.steps < 9:
        ap.error("--steps must be at least 9 (a reader 8 versions behind)")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    master = make_model(args.layers, args.width, torch.float32)
    published = make_model(args.layers, args.width, torch.bfloat16)
    full = model_bytes(published)
    opt = torch.optim.AdamW(master.parameters(), lr=args.lr)
    with Client(config, transport=args.transport) as c:
        for info in c.list(PREFIX + "/"):  # a fresh model each run
            c.delete(info.name)
        first = publish_state_dict(c, PREFIX, published, keep=args.steps + 1)
        last = first + args.steps
        readers = [
            ctx.Process(
                target=follower, args=(config, args.transport, args.layers, args.width, r, last, q)
            )
            for r in (None, 0, 1)
        ]
        for p in readers:
            p.start()
        changed, publishes = [], []
        for _ in range(args.steps):
            changed += train_step(master, published, opt, args.width)
            t0 = time.perf_counter()
            publish_state_dict(c, PREFIX, published, keep=args.steps + 1)
            publishes.append(time.perf_counter() - t0)
        follow = [q.get(timeout=600) for _ in readers]
        for p in readers:
            p.join(60)
        print(
            f"model: {full / 2**20:.1f} MiB of bf16, {len(published.state_dict())} tensors; "
            f"elements changed per step: {100 * float(torch.stack(changed).mean()):.2f}%; "
            f"a commit took {statistics.median(publishes) * 1e3:.0f} ms (median)"
        )
        for rank, mine, moved in sorted(follow, key=lambda f: (f[0] is not None, f[0] or 0)):
            who = "whole model" if rank is None else f"tensor-parallel rank {rank} of 2"
            per = statistics.median(moved) if moved else 0
            print(
                f"follower ({who}): {len(moved)} syncs, median {per / 2**10:.0f} KiB "
                f"= {per / mine:.3f} of its {mine / 2**20:.1f} MiB"
            )

        # Figures from this process alone.
        model = c.model(PREFIX)
        rows = []
        for lag in (1, 3, 8):
            syncs, unchecked, reads, moved = [], [], [], 0
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                have = model.read(last - lag)
                reads.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                snap = model.pull(have, last)
                syncs.append(time.perf_counter() - t0)
                moved = snap.bytes_read
                have = model.read(last - lag)
                t0 = time.perf_counter()
                model.pull(have, last, check=False)
                unchecked.append(time.perf_counter() - t0)
            rows.append(
                {
                    "behind": lag,
                    "bytes": moved,
                    "fraction": moved / full,
                    "sync_s": statistics.median(syncs),
                    "sync_unchecked_s": statistics.median(unchecked),
                    "full_read_s": statistics.median(reads),
                }
            )
    port = free_port()
    procs = [
        ctx.Process(target=gloo_broadcast, args=(r, port, args.layers, args.width, args.rounds, q))
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    gloo = q.get(timeout=600)
    for p in procs:
        p.join(60)
    print()
    print("(sync and full read check every tensor's SHA-256; 'unchecked' is a sync without)")
    print(
        f"{'behind':>6}  {'bytes moved':>11}  {'of full':>7}  {'sync':>8}  {'unchecked':>9}  "
        f"{'full read':>9}  {'Gloo bcast':>10}  {'sync/full':>9}  {'sync/Gloo':>9}"
    )
    for r in rows:
        print(
            f"{r['behind']:>6}  {r['bytes'] / 2**10:>8.0f} KiB  {r['fraction']:>7.3f}  "
            f"{r['sync_s'] * 1e3:>6.1f}ms  {r['sync_unchecked_s'] * 1e3:>7.1f}ms  "
            f"{r['full_read_s'] * 1e3:>7.1f}ms  {gloo * 1e3:>8.1f}ms  "
            f"{r['sync_s'] / r['full_read_s']:>9.2f}  {r['sync_s'] / gloo:>9.2f}"
        )
    print("digests: every whole tensor of every sync matched its commit")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "model_bytes": full,
                    "rows": rows,
                    "gloo_broadcast_s": gloo,
                    "commit_s": statistics.median(publishes),
                    "followers": follow,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
