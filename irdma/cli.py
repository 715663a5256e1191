"""The ``irdma`` command: run a local cluster, move tensors, inspect and benchmark.

irdma local --nodes 3 --dir /tmp/irdma     start daemons on loopback (foreground)
irdma put NAME FILE                        .npy, or every array of a .npz/.safetensors
irdma get NAME -o FILE                     .npy, or every tensor under NAME/ to .npz/.safetensors
irdma ls [PREFIX] [-l]
irdma stat NAME [--json]
irdma rm NAME [-r]
irdma status [--json]
irdma bench [--size 256MiB] [--json]
irdma doctor [--skip TOPIC] [--json]       what breaks RDMA, FUSE, memlock, daemons here
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import trio

from . import bench as benchmod
from . import doctor as doctormod
from . import local as localmod
from . import status as statusmod
from .client import AsyncClient, TensorInfo
from .cluster import load_config, parse_size
from .errors import ConfigError, IrdmaError, TensorNotFound
from .modes import describe_options

PROGRESS_MIN_BYTES = 4 << 20


def _progress(total: int, desc: str) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """A tqdm byte counter for transfers over a few MB (shown only on a terminal)."""
    if total < PROGRESS_MIN_BYTES:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        leave=False,
        disable=None,
    )
    return bar.update, bar.close


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays in a .npy, .npz or .safetensors file, keyed by name ('' for .npy)."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return {"": np.load(path, allow_pickle=False)}
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    if suffix == ".safetensors":
        from safetensors.numpy import load_file

        return dict(load_file(str(path)))
    raise ValueError(f"{path}: unknown file type {suffix!r} (use .npy, .npz or .safetensors)")


def _save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        np.savez(path, **arrays)
    elif suffix == ".safetensors":
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path))
    else:
        raise ValueError(f"{path}: unknown file type {suffix!r} (use .npy, .npz or .safetensors)")


async def cmd_put(client: AsyncClient, args: argparse.Namespace) -> int:
    arrays = _load_arrays(Path(args.file))
    total = sum(a.nbytes for a in arrays.values())
    update, close = _progress(total, f"put {args.name}")
    try:
        for key, arr in arrays.items():
            name = f"{args.name}/{key}" if key else args.name
            await client.write(name, arr, replace=args.replace, progress=update)
            if not update:
                print(f"{name}\t{arr.dtype}\t{list(arr.shape)}")
    finally:
        close()
    if update:
        print(f"put {len(arrays)} tensor(s), {_human(total)}")
    return 0


async def cmd_get(client: AsyncClient, args: argparse.Namespace) -> int:
    out = Path(args.output)
    if out.suffix.lower() == ".npy":
        info = await client.stat(args.name)
        update, close = _progress(info.nbytes, f"get {args.name}")
        try:
            arr = await client.read(args.name, progress=update)
        finally:
            close()
        np.save(out, arr, allow_pickle=False)
        return 0
    prefix = args.name.rstrip("/") + "/"
    infos = await client.list(prefix)
    if not infos:
        raise TensorNotFound(f"no tensors under {prefix!r}")
    total = sum(i.nbytes for i in infos)
    update, close = _progress(total, f"get {prefix}")
    try:
        arrays = {i.name[len(prefix) :]: await client.read(i.name, progress=update) for i in infos}
    finally:
        close()
    _save_arrays(out, arrays)
    return 0


def _info_row(i: TensorInfo) -> str:
    shape = "x".join(map(str, i.shape)) or "scalar"
    return f"{i.name}\t{i.dtype}\t{shape}\t{_human(i.nbytes)}\tv{i.version}"


async def cmd_ls(client: AsyncClient, args: argparse.Namespace) -> int:
    infos = await client.list(args.prefix)
    if args.json:
        print(json.dumps([i.to_dict() for i in infos], indent=2))
        return 0
    for i in infos:
        print(_info_row(i) if args.long else i.name)
    return 0


async def cmd_stat(client: AsyncClient, args: argparse.Namespace) -> int:
    info = await client.stat(args.name)
    d = info.to_dict()
    d["mode"] = describe_options(info.options)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    d["mtime"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.mtime))
    d["ctime"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.ctime))
    width = max(map(len, d))
    for k, v in d.items():
        print(f"{k:<{width}}  {v}")
    return 0


async def cmd_rm(client: AsyncClient, args: argparse.Namespace) -> int:
    if args.recursive:
        prefix = args.name.rstrip("/") + "/"
        infos = await client.list(prefix)
        if not infos:
            raise TensorNotFound(f"no tensors under {prefix!r}")
        for i in infos:
            await client.delete(i.name)
        return 0
    await client.delete(args.name)
    return 0


async def cmd_status(client: AsyncClient, args: argparse.Namespace) -> int:
    """One row per daemon (see ``irdma.status``); exit 1 if any is down."""
    rows = await statusmod.gather(client)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        print(statusmod.render(rows, client.config))
    return 0 if all(r.up for r in rows) else 1


async def cmd_bench(client: AsyncClient, args: argparse.Namespace) -> int:
    result = await benchmod.run(
        client, size=parse_size(args.size), repeat=args.repeat, latency_iters=args.latency_iters
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(benchmod.format_table(result))
    return 0


CLIENT_COMMANDS = {
    "put": cmd_put,
    "get": cmd_get,
    "ls": cmd_ls,
    "stat": cmd_stat,
    "rm": cmd_rm,
    "status": cmd_status,
    "bench": cmd_bench,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="irdma",
        description="irdma parameter server: tensors on psd daemons.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument(
        "--config", help="cluster config (default: $IRDMA_CONFIG, then /etc/irdma/cluster.toml)"
    )
    p.add_argument("--timeout", type=float, help="seconds to wait for a daemon")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("local", help="run N daemons on loopback in the foreground")
    s.add_argument("--nodes", type=int, default=3)
    s.add_argument("--replicas", type=int, default=1)
    s.add_argument("--dir", required=True, help="directory for the config and data dirs")
    s.add_argument("--arena", default="1GiB", help="arena size per daemon (default 1GiB)")
    s.add_argument("--shard-size", default="4MiB")
    s.add_argument("--host", default="127.0.0.1")

    s = sub.add_parser("put", help="store a .npy/.npz/.safetensors file")
    s.add_argument("name")
    s.add_argument("file")
    s.add_argument("--replace", action="store_true", help="allow a new dtype or shape")

    s = sub.add_parser("get", help="fetch tensors into a .npy/.npz/.safetensors file")
    s.add_argument("name")
    s.add_argument("-o", "--output", required=True)

    s = sub.add_parser("ls", help="list tensors")
    s.add_argument("prefix", nargs="?", default="")
    s.add_argument("-l", "--long", action="store_true")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("stat", help="show a tensor's metadata")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("rm", help="delete a tensor (or -r every tensor under NAME/)")
    s.add_argument("name")
    s.add_argument("-r", "--recursive", action="store_true")

    s = sub.add_parser("status", help="show every daemon; exit 1 if any is down")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser(
        "doctor", help="check this host for what breaks RDMA and FUSE; exit 1 on any FAIL"
    )
    doctormod.add_arguments(s)
    s.set_defaults(run=doctormod.run)

    s = sub.add_parser("bench", help="read/write/accumulate throughput and latency")
    s.add_argument("--size", default="256MiB", help="tensor size for throughput")
    s.add_argument("--repeat", type=int, default=5)
    s.add_argument("--latency-iters", type=int, default=2000)
    s.add_argument("--json", action="store_true")
    add_plugin_commands(sub)
    return p


def add_plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands other irdma packages provide (``irdma mount`` from irdma_fuse).

    They register through the ``irdma.commands`` entry point group, so this
    package never imports them.
    """
    for ep in entry_points(group="irdma.commands"):
        try:
            ep.load()(sub)
        except Exception as exc:  # a broken plugin must not break the other commands
            print(f"irdma: command {ep.name!r} unavailable: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "local":
            return localmod.main(args)
        if getattr(args, "run", None) is not None:
            return args.run(args)
        config = load_config(args.config)

        async def run() -> int:
            async with AsyncClient(config, timeout=args.timeout) as client:
                return await CLIENT_COMMANDS[args.command](client, args)

        return trio.run(run)
    except ConfigError as exc:
        print(f"irdma: {exc}", file=sys.stderr)
        return 2
    except (IrdmaError, ValueError, OSError) as exc:
        print(f"irdma: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
