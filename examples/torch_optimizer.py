#!/usr/bin/env python3
"""Any torch.optim optimizer across processes with irdma.torch.DistributedOptimizer.

    pip install -e '.[torch,train]'
    export IRDMA_CONFIG=$(irdma local --dir /tmp/irdma --background)
    torchrun --nproc-per-node 4 examples/torch_optimizer.py [--compression bf16] [--epochs 30]

No torch.distributed: rank and world size come from the launcher's
environment (torchrun here; mpirun and srun work the same), the gradients'
sums from the daemons. Adam's state stays in each process. Every rank
trains on its quarter of scikit-learn's digits (the 80/20 split of
bench/train_digits.py); rank 0 prints the test accuracy at the end, 0.97 to
0.98 after 30 epochs with any of none, fp16, bf16 (exit status 1 under
--min-accuracy, default 0.95).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

import irdma.torch
from irdma.training.modes import worker_identity

# The model and the data of bench/train_digits.py (one definition for bench, tests, examples).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from train_digits import accuracy, load_data, make_model, rank_device


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--compression", default="none", help="none, fp16, bf16 or topk:RATIO")
    ap.add_argument("--min-accuracy", type=float, default=0.95)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (each rank its LOCAL_RANK's GPU)")
    args = ap.parse_args()

    torch.set_num_threads(1)  # one core per rank; torchrun starts several per host
    me = worker_identity()  # RANK / WORLD_SIZE (or mpirun's, or Slurm's)
    x_train, y_train, x_test, y_test = load_data()
    per = len(x_train) // me.world_size
    device = rank_device(args.device)
    xs = torch.from_numpy(x_train[me.rank * per : (me.rank + 1) * per]).to(device)
    ys = torch.from_numpy(y_train[me.rank * per : (me.rank + 1) * per]).to(device)

    model = make_model().to(device)  # on a GPU, irdma moves the gradients itself
    opt = irdma.torch.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=args.lr),
        model.named_parameters(),
        compression=irdma.torch.Compression.parse(args.compression),
    )
    opt.broadcast_parameters()  # every rank starts from rank 0's weights

    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(me.rank)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(per, generator=generator)
        for i in range(0, per - args.batch + 1, args.batch):
            idx = order[i : i + args.batch].to(device)
            opt.zero_grad()
            loss = loss_fn(model(xs[idx]), ys[idx])
            loss.backward()  # buckets of gradients leave as they are ready
            opt.step()  # waits for the sums, then Adam steps here
        if me.rank == 0 and (epoch + 1) % 10 == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}", flush=True)
    seconds = time.perf_counter() - started
    traffic = opt.traffic
    opt.close()  # waits for every rank, removes the job's tensors from the daemons

    if me.rank != 0:
        return 0
    acc = accuracy(model, x_test, y_test)
    print(
        f"DistributedOptimizer(Adam, {args.compression}), {me.world_size} ranks, "
        f"{args.epochs} epochs: test accuracy {acc:.3f} in {seconds:.1f} s; rank 0 sent "
        f"{traffic.sent / 1e6:.1f} MB, received {traffic.received / 1e6:.1f} MB"
    )
    return 0 if acc >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
