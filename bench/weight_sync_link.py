#!/usr/bin/env python3
"""Weight sync where bytes cost: a reader behind a rate-limited link.

``examples/weight_sync.py`` measures on one host, where a full read runs at
memory or loopback speed. Here each party is a network-namespace host
(``tests/helpers/netns.py``, as root): three daemons (one copy of each shard),
a trainer, and a reader whose link is shaped to ``--rate`` (tbf, both
directions). The trainer publishes the example's bf16 MLP each AdamW step
(lr 1e-6); then the reader, 1, 3 and 8 versions behind, times a sync (only
the changed elements, checked), a full read of the version (checked), and a
torch.distributed broadcast of the same state dict from the trainer over Gloo,
through the same link. Prints the table and, with ``--json``, the figures.

    sudo python bench/weight_sync_link.py [--rate 1gbit] [--steps 9] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from irdma.cluster import render_config  # noqa: E402
from tests.helpers.netns import HOST_IF, Network  # noqa: E402

PORT = 7400
GLOO_PORT = 29511
ME = str(Path(__file__).resolve())
PREFIX = "wsl/policy"
DAEMONS = ["h1", "h2", "h3"]


# -- the workers (each runs inside its namespace) ------------------------------------


def publish(args: argparse.Namespace) -> dict:
    """The trainer: ``--steps`` AdamW steps, each published as a version."""
    import torch
    from weight_sync import make_model, model_bytes, train_step

    from irdma import Client
    from irdma.torch import publish_state_dict

    master = make_model(args.layers, args.width, torch.float32)
    published = make_model(args.layers, args.width, torch.bfloat16)
    opt = torch.optim.AdamW(master.parameters(), lr=1e-6)
    with Client(args.config, transport="tcp") as c:
        publish_state_dict(c, PREFIX, published, keep=args.steps + 1)
        for _ in range(args.steps):
            train_step(master, published, opt, args.width)
            last = publish_state_dict(c, PREFIX, published, keep=args.steps + 1)
    return {"last": last, "model_bytes": model_bytes(published)}


def measure(args: argparse.Namespace) -> dict:
    """The reader: for 1, 3 and 8 versions behind, a sync against a full read."""
    from irdma import Client

    rows = []
    with Client(args.config, transport="tcp") as c:
        model = c.model(PREFIX)
        last = model.latest()
        for lag in (1, 3, 8):
            syncs, reads, moved = [], [], 0
            for _ in range(args.rounds):
                have = model.read(last - lag)
                t0 = time.perf_counter()
                moved = model.pull(have, last).bytes_read
                syncs.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                model.read(last)
                reads.append(time.perf_counter() - t0)
            rows.append(
                {
                    "behind": lag,
                    "bytes": moved,
                    "sync_s": statistics.median(syncs),
                    "full_read_s": statistics.median(reads),
                }
            )
    return {"rows": rows}


def gloo(args: argparse.Namespace) -> dict:
    """One side of a Gloo broadcast of the model's bf16 state dict (rank 0: the source)."""
    import torch
    import torch.distributed as dist
    from weight_sync import broadcast_times, make_model

    dist.init_process_group(
        "gloo", init_method=f"tcp://{args.master}:{GLOO_PORT}", rank=args.rank, world_size=2
    )
    tensors = list(make_model(args.layers, args.width, torch.bfloat16).state_dict().values())
    times = broadcast_times(tensors, args.rounds)
    dist.destroy_process_group()
    return {"broadcast_s": statistics.median(times)}


# -- the driver ----------------------------------------------------------------------


def run_worker(net: Network, host: str, op: str, args: argparse.Namespace, **kw: str) -> dict:
    # Gloo binds the interface GLOO_SOCKET_IFNAME names, not the namespace's loopback.
    argv = ["env", f"GLOO_SOCKET_IFNAME={HOST_IF}", sys.executable, ME, "--worker", op]
    argv += ["--config", str(args.config)]
    argv += ["--layers", str(args.layers), "--width", str(args.width)]
    argv += ["--steps", str(args.steps), "--rounds", str(args.rounds)]
    for k, v in kw.items():
        argv += [f"--{k}", str(v)]
    return json.loads(net.check_output(host, argv, timeout=900).splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="1gbit", help="the reader's link (tbf)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=9, help="versions published after the first")
    ap.add_argument("--rounds", type=int, default=3, help="timings per figure (median)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--master", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        fn = {"publish": publish, "measure": measure, "gloo": gloo}[args.worker]
        print(json.dumps(fn(args)))
        return 0
    if args.steps < 8:
        ap.error("--steps must be at least 8 (a reader 8 versions behind)")
    with tempfile.TemporaryDirectory() as d, Network([*DAEMONS, "trainer", "reader"]) as net:
        tmp = Path(d)
        nodes = [(h, f"tcp://{net.address(h)}:{PORT}", str(tmp / h), 512 << 20) for h in DAEMONS]
        args.config = tmp / "cluster.toml"
        args.config.write_text(render_config(nodes, replicas=1, timeout=10.0))
        daemons = [
            net.run(h, [sys.executable, "-m", "irdma_psd.main", "--config", str(args.config),
                        "--node", h, "--log-level", "WARNING"], log=tmp / f"{h}.log")
            for h in DAEMONS
        ]  # fmt: skip
        try:
            time.sleep(2)  # the daemons listen (the trainer's client retries meanwhile too)
            net.shape("reader", rate=args.rate)
            trained = run_worker(net, "trainer", "publish", args)
            measured = run_worker(net, "reader", "measure", args)
            source = net.run(
                "trainer",
                [sys.executable, ME, "--worker", "gloo", "--config", str(args.config),
                 "--layers", str(args.layers), "--width", str(args.width),
                 "--rounds", str(args.rounds), "--rank", "0",
                 "--master", net.address("trainer")],
                stdout=subprocess.DEVNULL,
                env={"GLOO_SOCKET_IFNAME": HOST_IF},
            )  # fmt: skip
            broadcast = run_worker(
                net, "reader", "gloo", args, rank="1", master=net.address("trainer")
            )["broadcast_s"]
            source.wait(120)
        finally:
            for p in daemons:
                p.terminate()
            for p in daemons:
                p.wait(30)
    full = trained["model_bytes"]
    result = {"rate": args.rate, "model_bytes": full, "gloo_broadcast_s": broadcast, **measured}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"reader behind a {args.rate} link; model {full / 2**20:.1f} MiB of bf16")
    print(f"{'behind':>6}  {'bytes moved':>11}  {'of full':>7}  {'sync':>9}  {'full read':>9}  "
          f"{'Gloo bcast':>10}  {'sync/full':>9}  {'sync/Gloo':>9}")  # fmt: skip
    for r in measured["rows"]:
        print(
            f"{r['behind']:>6}  {r['bytes'] / 2**10:>8.0f} KiB  {r['bytes'] / full:>7.3f}  "
            f"{r['sync_s'] * 1e3:>7.1f}ms  {r['full_read_s'] * 1e3:>7.1f}ms  "
            f"{broadcast * 1e3:>8.1f}ms  {r['sync_s'] / r['full_read_s']:>9.2f}  "
            f"{r['sync_s'] / broadcast:>9.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
