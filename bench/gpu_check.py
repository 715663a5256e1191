#!/usr/bin/env python3
"""The GPU check of irdma's CUDA paths (issue 39): one script, one GPU, under 8 minutes.

On a machine with python3, torch (CUDA), numpy and safetensors, and the
wheels ``bench/gpu_wheels.sh`` put in ``.gpu-wheels/`` (irdma's other
dependencies and the digits data; no network needed), from the repository root:

    python3 bench/gpu_check.py [--json results.json] [--epochs 40]

It installs the wheels into ``.gpu-site/`` (irdma itself runs from this
tree), starts ``irdma local`` (3 daemons), and then:

1. round-trips CUDA tensors of 4 KiB to 256 MiB through ``write``, ``read``
   (``out=`` a CUDA tensor) and ``accumulate``, checking the bytes, and
   reports GB/s next to a plain ``tensor.cpu()`` / ``.cuda()`` of the same
   bytes; then bfloat16, strided, batched, ``__cuda_array_interface__`` and
   state-dict cases;
2. trains the digits CNN on the GPU with 2 and 4 processes sharing it,
   through ``DistributedOptimizer`` and through the DDP hook, against one
   process fed the union of the workers' batches (accuracy within 0.5
   points) and against DDP on Gloo with the same data (first step's
   parameters, accuracy);
3. prints the step time of a larger model with the gradients overlapped
   with the backward pass (25 MiB buckets) and without (one bucket, sent
   after the backward pass), and with no communication at all.

Exits 1 if a check fails. ``--device cpu --quick`` runs the same code on
the CPU with small sizes (a smoke test of the script itself).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".gpu-wheels"
SITE = ROOT / ".gpu-site"
DIGITS_BATCH = 64
DIGITS_LR = 0.04
ACCURACY_POINTS = 0.5  # how far the data-parallel accuracy may be from one process's
SIZES = [(4 << 10) * 4**i for i in range(9)]  # 4 KiB .. 256 MiB
QUICK_SIZES = [4 << 10, 256 << 10, 4 << 20]


# -- getting irdma importable without a network ------------------------------------------


def ensure_irdma() -> None:
    """Import irdma, or install the carried wheels into .gpu-site and run again."""
    try:
        import ml_dtypes  # noqa: F401
        import trio  # noqa: F401

        import irdma  # noqa: F401

        return
    except ImportError:
        if os.environ.get("IRDMA_GPU_SITE") == "1":
            raise  # installed already and still missing: say what
    wheels = sorted(WHEELS.glob("*.whl"))
    if not wheels:
        sys.exit(f"no wheels in {WHEELS}: run sh bench/gpu_wheels.sh first (with a network)")
    shutil.rmtree(SITE, ignore_errors=True)
    SITE.mkdir()
    pip = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet"]
    got = subprocess.run([*pip, "--target", str(SITE), *map(str, wheels)], check=False)
    if got.returncode != 0:  # no pip: a wheel is a zip of what goes in site-packages
        print("gpu_check: pip failed; unpacking the wheels instead", flush=True)
        for w in wheels:
            with zipfile.ZipFile(w) as z:
                z.extractall(SITE)
    for name, src in (("irdma", "irdma"), ("irdma_psd", "psd"), ("irdma_fuse", "fuse")):
        link = SITE / name
        if link.exists() or link.is_symlink():
            shutil.rmtree(link) if link.is_dir() and not link.is_symlink() else link.unlink()
        link.symlink_to(ROOT / src)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p
    )
    os.environ["IRDMA_GPU_SITE"] = "1"
    os.execv(sys.executable, [sys.executable, *sys.argv])


# -- the cluster -------------------------------------------------------------------------


@contextlib.contextmanager
def local_cluster(directory: Path, arena: str):
    argv = [sys.executable, "-m", "irdma", "local", "--dir", str(directory), "--background"]
    got = subprocess.run(
        [*argv, "--nodes", "3", "--arena", arena], capture_output=True, text=True, check=False
    )
    if got.returncode != 0:
        sys.exit(f"irdma local did not start:\n{got.stderr}")
    config = got.stdout.strip().splitlines()[-1]
    try:
        yield config
    finally:
        subprocess.run(
            [sys.executable, "-m", "irdma", "local", "--stop", "--dir", str(directory)],
            check=False,
            capture_output=True,
        )


# -- 1. round trips ------------------------------------------------------------------------


def timed(fn, sync, reps: int) -> float:
    """The best of ``reps`` runs of ``fn`` (with the device synchronised), in seconds."""
    best = float("inf")
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def round_trips(config: str, device: str, sizes: list[int], failures: list[str]) -> list[dict]:
    import torch

    from irdma import Client

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    with Client(config, shared_memory="1GiB") as c:
        for nbytes in sizes:
            n = nbytes // 4
            a = torch.randn(n, device=device)
            b = torch.randn(n, device=device)
            out = torch.empty_like(a)
            name = f"gpucheck/rt/{nbytes}"
            reps = max(2, min(10, (64 << 20) // nbytes))
            t_write = timed(lambda: c.write(name, a), sync, reps)  # noqa: B023
            t_read = timed(lambda: c.read(name, out=out), sync, reps)  # noqa: B023
            same = torch.equal(out.view(torch.int32), a.view(torch.int32))
            c.write(name, a)
            t0 = time.perf_counter()
            c.accumulate(name, b)
            t_acc = time.perf_counter() - t0
            c.read(name, out=out)
            summed = torch.equal(out.view(torch.int32), (a + b).view(torch.int32))
            t_d2h = timed(lambda: a.cpu(), sync, reps)  # noqa: B023
            host = a.cpu()
            t_h2d = timed(lambda: host.to(device), sync, reps)  # noqa: B023
            c.delete(name)
            gb = nbytes / 1e9
            row = {
                "bytes": nbytes,
                "write_GBps": gb / t_write,
                "read_GBps": gb / t_read,
                "accumulate_GBps": gb / t_acc,
                "cpu_copy_GBps": gb / t_d2h,
                "cuda_copy_GBps": gb / t_h2d,
                "read_identical": same,
                "accumulate_identical": summed,
            }
            rows.append(row)
            print(
                f"  {nbytes:>10} B  write {row['write_GBps']:7.2f}  read {row['read_GBps']:7.2f}"
                f"  accumulate {row['accumulate_GBps']:7.2f} GB/s   tensor.cpu() "
                f"{row['cpu_copy_GBps']:7.2f}  .{device}() {row['cuda_copy_GBps']:7.2f} GB/s"
                f"   bytes {'identical' if same and summed else 'DIFFER'}",
                flush=True,
            )
            if not (same and summed):
                failures.append(f"round trip of {nbytes} B: read {same}, accumulate {summed}")
    return rows


def other_cases(config: str, device: str, failures: list[str]) -> None:
    """bfloat16, strided, batched, __cuda_array_interface__ and state dicts on the device."""
    import torch

    from irdma import Client
    from irdma.torch import pull_state_dict, push_state_dict

    def check(what: str, ok: bool) -> None:
        print(f"  {what}: {'ok' if ok else 'FAILED'}", flush=True)
        if not ok:
            failures.append(what)

    with Client(config, shared_memory="256MiB") as c:
        x = torch.randn(1000, 300, device=device).to(torch.bfloat16)
        c.write("gpucheck/bf16", x)
        out = torch.empty_like(x)
        c.read("gpucheck/bf16", out=out)
        check("bfloat16 round trip", torch.equal(out.view(torch.int16), x.view(torch.int16)))
        s = torch.randn(300, 500, device=device).t()
        c.write("gpucheck/strided", s)
        holder = torch.zeros(500, 600, device=device)
        c.read("gpucheck/strided", out=holder[:, ::2])
        check(
            "strided write and strided out",
            torch.equal(holder[:, ::2], s) and not holder[:, 1::2].any().item(),
        )
        many = {f"gpucheck/many/{i}": torch.randn(100 * (i + 1), device=device) for i in range(8)}
        c.write_many(many)
        c.accumulate_many({n: torch.ones_like(t) for n, t in many.items()})
        outs = {n: torch.empty_like(t) for n, t in many.items()}
        c.read_into(outs)
        check(
            "write_many, accumulate_many, read_into",
            all(torch.equal(outs[n], t + 1) for n, t in many.items()),
        )
        if device == "cuda":

            class CudaArray:  # what CuPy and Numba arrays offer
                def __init__(self, t: torch.Tensor) -> None:
                    self.t = t
                    self.__cuda_array_interface__ = t.__cuda_array_interface__

            y = torch.randn(4096, device=device)
            c.write("gpucheck/cai", CudaArray(y))
            landing = CudaArray(torch.empty_like(y))
            c.read("gpucheck/cai", out=landing)
            check("__cuda_array_interface__", torch.equal(landing.t, y))
        from irdma.training.collectives import Group

        g = Group(c, "gpucheck-group", rank=0, world_size=1)
        z = torch.randn(300, 7, device=device)
        landed = torch.empty_like(z)
        g.allreduce(z, out=landed)
        check("allreduce of a device tensor into one", torch.equal(landed, z))
        g.close()
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.BatchNorm1d(1024))
        model.to(device)
        push_state_dict(c, "gpucheck/state", model)
        want = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            for v in model.state_dict().values():
                v.zero_()
        pull_state_dict(c, "gpucheck/state", model)
        check(
            "state dict straight into the device's tensors",
            all(
                torch.equal(v, want[k]) and v.device == want[k].device
                for k, v in model.state_dict().items()
            ),
        )


# -- 2. the digits, data-parallel -----------------------------------------------------------


def digits_model():
    sys.path.insert(0, str(ROOT / "bench"))
    from train_digits import make_model  # seeds torch: every rank starts the same

    return make_model()


def rank_batches(n_train: int, rank: int, world: int, epochs: int):
    """The index batches rank ``rank`` trains on, step by step (as tests/torch_workers.py)."""
    import numpy as np

    per = n_train // world
    rng = np.random.default_rng(rank)
    for _ in range(epochs):
        order = rng.permutation(per) + rank * per
        for i in range(0, per - DIGITS_BATCH + 1, DIGITS_BATCH):
            yield order[i : i + DIGITS_BATCH]


def digits_worker(kind: str, world: int, epochs: int, out: Path, device: str, port: int) -> dict:
    """One rank's training (``kind``: opt, ddp-irdma, ddp-gloo; single: one process fed
    every rank's batch of each step together)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    import irdma.torch as it
    from irdma.training.modes import worker_identity

    COMPRESSIONS = {"none": it.NONE, "fp16": it.FP16, "topk": it.Compression.topk(0.1)}
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    data = np.load(WHEELS / "digits.npz")
    xs = torch.from_numpy(data["x_train"]).to(device)
    ys = torch.from_numpy(data["y_train"]).to(device)
    rank = 0 if kind == "single" else worker_identity().rank
    # Every world size takes the same number of steps: the epochs are per two workers.
    epochs = max(1, epochs * world // 2)
    loss_fn = torch.nn.CrossEntropyLoss()
    model = digits_model().to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=DIGITS_LR, momentum=0.9)
    if kind == "single":
        ranks = [rank_batches(len(xs), r, world, epochs) for r in range(world)]
        steps = [np.concatenate(group) for group in zip(*ranks, strict=True)]
    else:
        steps = list(rank_batches(len(xs), rank, world, epochs))
    opt, trainer, state = sgd, model, None
    if kind.startswith("opt"):
        compression = COMPRESSIONS[kind.partition("-")[2] or "none"]
        opt = it.DistributedOptimizer(
            sgd, model.named_parameters(), compression=compression, name=f"digits-{port}"
        )
        opt.broadcast_parameters()
    elif kind.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        trainer = DDP(model, device_ids=[0] if device == "cuda" else None)
        if kind == "ddp-irdma":
            state = it.HookState(name=f"digits-{port}")
            trainer.register_comm_hook(state, it.allreduce_hook)
    schedule = torch.optim.lr_scheduler.LambdaLR(sgd, lambda s: 1 - s / len(steps))
    first = None
    started = time.perf_counter()
    for i, idx in enumerate(steps):
        at = torch.from_numpy(idx).to(device)
        opt.zero_grad()
        loss_fn(trainer(xs[at]), ys[at]).backward()
        opt.step()
        schedule.step()
        if i == 0:
            first = {k: v.detach().cpu() for k, v in model.named_parameters()}
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    if kind.startswith("opt"):
        opt.close()
    if state is not None:
        state.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    with torch.no_grad():
        x_test = torch.from_numpy(data["x_test"]).to(device)
        pred = model(x_test).argmax(1).cpu().numpy()
    acc = float((pred == data["y_test"]).mean())
    if rank == 0:
        torch.save(
            {"first": first, "last": {k: v.detach().cpu() for k, v in model.named_parameters()}},
            out.with_suffix(".pt"),
        )
    return {"rank": rank, "accuracy": acc, "step_ms": 1000 * seconds / len(steps)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config: str, kind: str, world: int, args: argparse.Namespace, tmp: Path) -> dict:
    """``world`` worker processes (one for ``single``) of ``kind``; rank 0's result."""
    port = free_port()
    out = tmp / f"{kind}-{world}"
    procs = []
    for rank in range(1 if kind == "single" else world):
        env = dict(os.environ, IRDMA_CONFIG=config, RANK=str(rank), WORLD_SIZE=str(world))
        env.update(LOCAL_RANK=str(rank), IRDMA_JOB_ID=f"gpucheck-{port}")
        argv = [sys.executable, __file__, "--worker", kind, "--world", str(world)]
        argv += ["--epochs", str(args.epochs), "--device", args.device, "--port", str(port)]
        argv += ["--out", str(out.with_name(f"{out.name}.{rank}.json"))]
        procs.append(subprocess.Popen(argv, env=env))
    codes = [p.wait(timeout=240) for p in procs]
    if any(codes):
        raise RuntimeError(f"{kind} x{world}: workers exited with {codes}")
    return json.loads(out.with_name(f"{out.name}.0.json").read_text())


def digits(config: str, args: argparse.Namespace, tmp: Path, failures: list[str]) -> dict:
    import torch

    results: dict = {}
    for world in (2, 4):
        single = launch(config, "single", world, args, tmp)
        kinds = ["opt", "ddp-irdma", "ddp-gloo"] + (["opt-fp16", "opt-topk"] if world == 2 else [])
        got = {k: launch(config, k, world, args, tmp) for k in kinds}
        ref = single["accuracy"]
        if ref < 0.9 and not args.quick:
            failures.append(f"digits x{world}: one process reached only {ref} (not trained)")
        for k, r in got.items():
            print(
                f"  {world} processes, {k:9}: accuracy {100 * r['accuracy']:.2f} % "
                f"(one process {100 * ref:.2f} %), {r['step_ms']:.2f} ms a step",
                flush=True,
            )
        for k in ("opt", "ddp-irdma", "opt-fp16")[: 3 if world == 2 else 2]:
            if abs(got[k]["accuracy"] - ref) * 100 > ACCURACY_POINTS:
                failures.append(f"digits {k} x{world}: {got[k]['accuracy']} against {ref}")
        hook = torch.load(tmp / f"ddp-irdma-{world}.0.pt")
        gloo = torch.load(tmp / f"ddp-gloo-{world}.0.pt")
        first = max((hook["first"][k] - gloo["first"][k]).abs().max().item() for k in gloo["first"])
        last = max((hook["last"][k] - gloo["last"][k]).abs().max().item() for k in gloo["last"])
        print(
            f"  {world} processes, DDP hook against DDP on Gloo: parameters differ by at most "
            f"{first:.2e} after the first step, {last:.2e} after the last",
            flush=True,
        )
        if first > 1e-5:
            failures.append(f"ddp hook x{world}: first step differs from Gloo's by {first}")
        if abs(got["ddp-irdma"]["accuracy"] - got["ddp-gloo"]["accuracy"]) * 100 > ACCURACY_POINTS:
            failures.append(f"ddp hook x{world}: accuracy off Gloo's")
        results[world] = {"single": single, **got, "first_diff": first, "last_diff": last}
    return results


# -- 3. overlap ------------------------------------------------------------------------------


def overlap_worker(kind: str, device: str, port: int) -> dict:
    """Step times of an MLP of 8 layers of 2048x2048 (128 MiB of gradients), batch 4096."""
    import torch

    import irdma.torch as it

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    torch.manual_seed(0)
    width, depth, batch = (2048, 8, 4096) if device == "cuda" else (256, 4, 64)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-4)
    opt = sgd
    if kind != "local":
        bucket = 25 << 20 if kind == "overlap" else 1 << 40
        opt = it.DistributedOptimizer(
            sgd, model.named_parameters(), bucket_bytes=bucket, name=f"overlap-{port}"
        )
    x = torch.randn(batch, width, device=device)
    times = []
    for i in range(13):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()  # timing only: not on irdma's path
        if i >= 3:
            times.append(time.perf_counter() - t0)
    if kind != "local":
        opt.close()
    return {"step_ms": 1000 * sorted(times)[len(times) // 2]}


def overlap(config: str, args: argparse.Namespace, tmp: Path) -> dict:
    got = {}
    for kind in ("local", "overlap", "no-overlap"):
        world = 1 if kind == "local" else 2
        r = launch(config, kind, world, args, tmp)
        got[kind] = r["step_ms"]
        what = {"local": "no communication", "overlap": "25 MiB buckets during backward"}
        print(
            f"  {kind:10}: {r['step_ms']:8.2f} ms a step (median; "
            f"{what.get(kind, 'one bucket after backward')}, {world} process(es))",
            flush=True,
        )
    return got


# -- main ------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="small sizes and 8 epochs")
    ap.add_argument("--epochs", type=int, default=40, help="epochs of two workers")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.epochs = min(args.epochs, 8)
    ensure_irdma()
    if args.worker:
        out = Path(args.out)
        if args.worker in ("local", "overlap", "no-overlap"):
            result = overlap_worker(args.worker, args.device, args.port)
        else:
            result = digits_worker(
                args.worker, args.world, args.epochs, out, args.device, args.port
            )
        out.write_text(json.dumps(result))
        return 0

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device (run with --device cpu for a smoke test)")
    print(
        f"torch {torch.__version__}, device {args.device}"
        + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""),
        flush=True,
    )
    failures: list[str] = []
    results: dict = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="irdma-gpu-") as tmpdir:
        tmp = Path(tmpdir)
        with local_cluster(tmp / "cluster", "2GiB") as config:
            print("1. round trips (GB/s; best of several)", flush=True)
            results["round_trips"] = round_trips(
                config, args.device, QUICK_SIZES if args.quick else SIZES, failures
            )
            other_cases(config, args.device, failures)
            print(f"2. digits, {args.epochs} epochs", flush=True)
            results["digits"] = digits(config, args, tmp, failures)
            print("3. step time with and without overlap", flush=True)
            results["overlap"] = overlap(config, args, tmp)
    results["failures"] = failures
    results["seconds"] = time.perf_counter() - started
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    print(
        f"{'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'} "
        f"({results['seconds']:.0f} s)",
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
