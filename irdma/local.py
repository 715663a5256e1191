"""``irdma local``: N daemons on loopback with a generated config, in the foreground.

The embedded default for trying irdma and for tests: it writes
``DIR/cluster.toml``, starts one ``psd`` process per node, waits until every
daemon answers, prints the config path on stdout, and stops the daemons
cleanly on Ctrl-C, SIGTERM or SIGHUP (or stops the rest if one of them dies).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import subprocess
import sys
from pathlib import Path

import trio

from .client import AsyncClient
from .cluster import DEFAULT_TIMEOUT, ClusterConfig, load_config, parse_size, render_config
from .errors import ConfigError, IrdmaError

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


def free_ports(host: str, n: int) -> list[int]:
    """``n`` TCP ports free on ``host`` right now (held open together, so distinct)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_config(
    directory: Path,
    nodes: int,
    *,
    replicas: int = 1,
    arena_size: int = 1 << 30,
    shard_size: int = 4 << 20,
    host: str = "127.0.0.1",
    ports: list[int] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    extra: dict[str, float] | None = None,
    scheme: str = "tcp",
) -> Path:
    """Write ``directory/cluster.toml`` for ``nodes`` daemons on ``host``; return its path.

    ``scheme`` is the addresses' transport: tcp, shm or rdma.
    """
    if nodes < 1:
        raise ConfigError("--nodes must be at least 1")
    directory.mkdir(parents=True, exist_ok=True)
    ports = ports or free_ports(host, nodes)
    hostpart = f"[{host}]" if ":" in host else host
    entries = [
        (f"n{i + 1}", f"{scheme}://{hostpart}:{ports[i]}", str(directory / f"n{i + 1}"), arena_size)
        for i in range(nodes)
    ]
    path = directory / "cluster.toml"
    path.write_text(
        render_config(
            entries, shard_size=shard_size, replicas=replicas, timeout=timeout, extra=extra
        )
    )
    load_config(path)  # validate what we wrote
    return path


def psd_command(config_path: Path, node: str) -> list[str]:
    return [sys.executable, "-m", "irdma_psd.main", "--config", str(config_path), "--node", node]


async def wait_ready(config: ClusterConfig, procs: dict[str, trio.Process]) -> None:
    """Wait until every daemon answers HELLO as ready; raise if one exits or time runs out.

    With replicas, a daemon is ready once it has caught up from its peers.
    """
    with trio.move_on_after(READY_TIMEOUT) as scope:
        async with AsyncClient(config, timeout=1.0) as client:
            for node in config.nodes:
                while True:
                    proc = procs[node.name]
                    if proc.returncode is not None:
                        raise IrdmaError(
                            f"daemon {node.name} exited with status {proc.returncode} "
                            "before it was ready (see its log above)"
                        )
                    try:
                        if (await client.hello(node)).get("ready", True):
                            break
                    except IrdmaError:
                        pass
                    await trio.sleep(0.05)
    if scope.cancelled_caught:
        raise IrdmaError(f"daemons did not answer within {READY_TIMEOUT:g} s")


async def stop_all(procs: dict[str, trio.Process]) -> None:
    """SIGTERM every daemon, then SIGKILL what is still running after a grace period."""
    for proc in procs.values():
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(STOP_TIMEOUT):
        for proc in procs.values():
            await proc.wait()
    for proc in procs.values():
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def run_local(config_path: Path) -> int:
    config = load_config(config_path)
    procs: dict[str, trio.Process] = {}
    try:
        # SIGHUP too (its terminal closed): psd takes SIGHUP as "reload", so
        # the daemons would outlive this command otherwise.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            for node in config.nodes:
                node.data_dir.mkdir(parents=True, exist_ok=True)
                procs[node.name] = await trio.lowlevel.open_process(
                    psd_command(config_path, node.name), stdin=subprocess.DEVNULL
                )
            await wait_ready(config, procs)
            print(config_path, flush=True)
            print(
                f"irdma local: {len(procs)} daemons ready; export IRDMA_CONFIG={config_path}; "
                "Ctrl-C stops them",
                file=sys.stderr,
                flush=True,
            )
            async with trio.open_nursery() as nursery:
                exited: list[str] = []

                async def watch(name: str, proc: trio.Process) -> None:
                    await proc.wait()
                    exited.append(name)
                    nursery.cancel_scope.cancel()

                for name, proc in procs.items():
                    nursery.start_soon(watch, name, proc)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break
            if exited:
                print(f"irdma local: daemon {exited[0]} exited; stopping the rest", file=sys.stderr)
                return 1
            return 0
    finally:
        with trio.CancelScope(shield=True):
            await stop_all(procs)


def main(args: argparse.Namespace) -> int:
    path = write_config(
        Path(args.dir).resolve(),
        args.nodes,
        replicas=args.replicas,
        arena_size=parse_size(args.arena),
        shard_size=parse_size(args.shard_size),
        host=args.host,
    )
    return trio.run(run_local, path)
