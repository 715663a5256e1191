#!/usr/bin/env python3
"""DistributedDataParallel on Gloo, its gradient buckets summed by irdma: the digits CNN.

    pip install -e '.[torch,train]'
    export IRDMA_CONFIG=$(irdma local --dir /tmp/irdma --background)
    torchrun --nproc-per-node 4 examples/torch_ddp.py [--compression fp16] [--epochs 30]

Every rank trains on its quarter of scikit-learn's digits (the 80/20 split
of bench/train_digits.py); rank 0 prints the test accuracy at the end,
0.97 to 0.98 after 30 epochs with any of none, fp16, bf16 (exit status 1
under --min-accuracy, default 0.95). The only irdma lines are the two that
make the hook state and register it, and the state's close() at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import irdma.torch

# The model and the data of bench/train_digits.py (one definition for bench, tests, examples).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from train_digits import accuracy, load_data, make_model, rank_device


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--compression", default="none", help="none, fp16, bf16 or topk:RATIO")
    ap.add_argument("--min-accuracy", type=float, default=0.95)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (each rank its LOCAL_RANK's GPU)")
    args = ap.parse_args()

    torch.set_num_threads(1)  # one core per rank; torchrun starts several per host
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    x_train, y_train, x_test, y_test = load_data()
    per = len(x_train) // world
    device = rank_device(args.device)
    xs = torch.from_numpy(x_train[rank * per : (rank + 1) * per]).to(device)
    ys = torch.from_numpy(y_train[rank * per : (rank + 1) * per]).to(device)

    gpus = [device] if device.type == "cuda" else None
    model = DistributedDataParallel(make_model().to(device), device_ids=gpus)
    state = irdma.torch.HookState(compression=irdma.torch.Compression.parse(args.compression))
    model.register_comm_hook(state, irdma.torch.allreduce_hook)

    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(per, generator=generator)
        for i in range(0, per - args.batch + 1, args.batch):
            idx = order[i : i + args.batch].to(device)
            opt.zero_grad()
            loss = loss_fn(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
        if rank == 0 and (epoch + 1) % 10 == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}", flush=True)
    seconds = time.perf_counter() - started
    traffic = state.traffic
    state.close()  # waits for every rank, removes the job's tensors from the daemons
    dist.destroy_process_group()

    if rank != 0:
        return 0
    acc = accuracy(model.module, x_test, y_test)
    print(
        f"DDP + irdma hook ({args.compression}), {world} ranks, {args.epochs} epochs: "
        f"test accuracy {acc:.3f} in {seconds:.1f} s; rank 0 sent {traffic.sent / 1e6:.1f} MB, "
        f"received {traffic.received / 1e6:.1f} MB"
    )
    return 0 if acc >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
