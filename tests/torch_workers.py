"""Worker processes for tests/test_torch.py: ``python -m tests.torch_workers SCENARIO ...``.

Each reads its rank from RANK/WORLD_SIZE (as under torchrun), connects to
the cluster in $IRDMA_CONFIG, runs one scenario, writes what it trained to
``OUT/<variant>-<rank>.pt`` and prints one JSON line.

- ``optimizer NAME OUT STEPS``: every variant of ``VARIANTS`` in turn through
  ``DistributedOptimizer``, on batches that differ per rank and step; ranks
  start from different weights, which ``broadcast_parameters`` must mend.
- ``ddp NAME OUT STEPS PORT``: DDP on Gloo, with and without irdma's hook
  (and torch's fp16 hook against irdma's fp16).
- ``digits NAME OUT EPOCHS DATA``: the digits CNN trained to convergence with
  each compression in ``DIGITS``; rank 0 reports the test accuracy.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from irdma.torch import (
    BF16,
    FP16,
    NONE,
    Compression,
    DistributedOptimizer,
    HookState,
    allreduce_hook,
)
from irdma.training.modes import worker_identity

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from train_digits import make_model  # the LeNet-style CNN of the benchmark

BATCH = 6
LOSS = nn.CrossEntropyLoss()


def adam(params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.01)


def adamw(params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def sgd(params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


@dataclass(frozen=True)
class Variant:
    """One DistributedOptimizer run of the ``optimizer`` scenario (and its reference)."""

    optimizer: Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
    compression: Compression | dict[str, Compression] = NONE
    passes: int = 1  # backward passes per step
    op: str = "average"
    # Odd ranks leave fc2 out of the loss on odd steps: its gradient is None there.
    unused: bool = False
    bucket_bytes: int = 25 << 20  # the default: all of this model in one bucket


VARIANTS = {
    "adam": Variant(adam),
    "adam-fp16": Variant(adam, FP16, bucket_bytes=0),  # a bucket per parameter
    "adam-bf16": Variant(adam, BF16),
    "adam-topk": Variant(adam, Compression.topk(0.2)),
    "adamw-mixed": Variant(
        adamw,
        {"conv1.weight": FP16, "fc1.weight": Compression.topk(0.1), "fc2.bias": BF16},
    ),
    "sgd-sum-accumulate": Variant(sgd, NONE, passes=2, op="sum"),
    "adam-unused": Variant(adam, unused=True, bucket_bytes=10_000),
}


def forward(model: nn.Module, x: torch.Tensor, skip_fc2: bool = False) -> torch.Tensor:
    """The model's logits; with ``skip_fc2``, fc1's first ten outputs instead."""
    if not skip_fc2:
        return model(x)
    h = torch.max_pool2d(torch.relu(model.conv1(x)), 2)
    h = torch.max_pool2d(torch.relu(model.conv2(h)), 2)
    return torch.relu(model.fc1(h.flatten(1)))[:, :10]


def skips_fc2(spec: Variant, rank: int, step: int) -> bool:
    return spec.unused and rank % 2 == 1 and step % 2 == 1


def batch(rank: int, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1_000_000 * rank + 1000 * step + micro)
    return torch.randn(BATCH, 1, 8, 8, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def perturb(model: nn.Module, rank: int) -> None:
    """Different weights on every rank (rank 0 keeps make_model's)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * rank)


def save(out: Path, variant: str, rank: int, model: nn.Module) -> None:
    torch.save(
        {k: v.detach().clone() for k, v in model.named_parameters()}, out / f"{variant}-{rank}.pt"
    )


def optimizer_scenario(name: str, out: Path, steps: int) -> dict:
    rank = worker_identity().rank
    traffic = {}
    for variant, spec in VARIANTS.items():
        model = make_model()
        perturb(model, rank)
        opt = DistributedOptimizer(
            spec.optimizer(model.parameters()),
            model.named_parameters(),
            compression=spec.compression,
            backward_passes_per_step=spec.passes,
            op=spec.op,
            bucket_bytes=spec.bucket_bytes,
            name=f"{name}-{variant}",
        )
        opt.broadcast_parameters()
        start = (opt.traffic.sent, opt.traffic.received)
        for step in range(steps):
            opt.zero_grad()
            for micro in range(spec.passes):
                x, y = batch(rank, step, micro)
                LOSS(forward(model, x, skips_fc2(spec, rank, step)), y).backward()
            opt.step()
        traffic[variant] = [opt.traffic.sent - start[0], opt.traffic.received - start[1]]
        opt.close()
        save(out, variant, rank, model)
    return {"rank": rank, "traffic": traffic}


DDP_VARIANTS = ("gloo", "irdma", "gloo-fp16", "irdma-fp16", "irdma-bf16")


def ddp_scenario(name: str, out: Path, steps: int, port: int) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    ident = worker_identity()
    rank = ident.rank
    sent = {}
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ident.world_size
    )
    try:
        for variant in DDP_VARIANTS:
            model = make_model()
            perturb(model, rank)  # DDP's construction broadcasts rank 0's
            # Small buckets: several per step, and rebuilt after the first one.
            ddp = DDP(model, bucket_cap_mb=0.01)
            state = None
            if variant.startswith("irdma"):
                compression = {"irdma": NONE, "irdma-fp16": FP16, "irdma-bf16": BF16}[variant]
                state = HookState(compression=compression, name=f"{name}-{variant}")
                ddp.register_comm_hook(state, allreduce_hook)
            elif variant == "gloo-fp16":
                ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
            opt = sgd(ddp.parameters())
            for step in range(steps):
                opt.zero_grad()
                x, y = batch(rank, step)
                LOSS(ddp(x), y).backward()
                opt.step()
            if state is not None:
                sent[variant] = state.traffic.sent
                state.close()
            save(out, variant, rank, model)
    finally:
        dist.destroy_process_group()
    return {"rank": rank, "sent": sent}


DIGITS = {"none": NONE, "fp16": FP16, "bf16": BF16}
DIGITS_BATCH = 64
DIGITS_LR = 0.04


def digits_scenario(name: str, out: Path, epochs: int, data: Path) -> dict:
    """SGD with momentum, the rate decaying linearly to zero: the runs end settled, so
    what compression changes shows rather than where the last steps happened to land."""
    ident = worker_identity()
    rank, world = ident.rank, ident.world_size
    arrays = np.load(data)
    per = len(arrays["x_train"]) // world
    xs = torch.from_numpy(arrays["x_train"][rank * per : (rank + 1) * per])
    ys = torch.from_numpy(arrays["y_train"][rank * per : (rank + 1) * per])
    steps = epochs * (per // DIGITS_BATCH)
    result: dict = {"rank": rank}
    for variant, compression in DIGITS.items():
        model = make_model()
        opt = DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=DIGITS_LR, momentum=0.9),
            model.named_parameters(),
            compression=compression,
            name=f"{name}-{variant}",
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / steps)
        rng = np.random.default_rng(rank)
        started = time.perf_counter()
        for _ in range(epochs):
            order = rng.permutation(per)
            for i in range(0, per - DIGITS_BATCH + 1, DIGITS_BATCH):
                idx = torch.from_numpy(order[i : i + DIGITS_BATCH])
                opt.zero_grad()
                LOSS(model(xs[idx]), ys[idx]).backward()
                opt.step()
                schedule.step()
        result[f"seconds-{variant}"] = time.perf_counter() - started
        result[f"sent-{variant}"] = opt.traffic.sent
        opt.close()
        with torch.no_grad():
            pred = model(torch.from_numpy(arrays["x_test"])).argmax(1).numpy()
        result[variant] = float((pred == arrays["y_test"]).mean())
    return result


def main() -> int:
    torch.set_num_threads(1)  # the same arithmetic as the test's single-process reference
    scenario, name, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if scenario == "optimizer":
        result = optimizer_scenario(name, out, int(sys.argv[4]))
    elif scenario == "ddp":
        result = ddp_scenario(name, out, int(sys.argv[4]), int(sys.argv[5]))
    else:
        result = digits_scenario(name, out, int(sys.argv[4]), Path(sys.argv[5]))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
