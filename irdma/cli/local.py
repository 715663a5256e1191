"""``irdma local``: N daemons on loopback with a generated config.

The embedded default for trying irdma and for tests: it writes
``DIR/cluster.toml``, starts one ``psd`` process per node, waits until every
daemon answers, prints the config path on stdout, and stops the daemons
cleanly on Ctrl-C, SIGTERM or SIGHUP. In between it supervises them: a
daemon that dies is restarted (``irdma.cli.supervisor``). ``--background`` runs
the same in a detached process and returns once the daemons answer;
``--stop`` stops it. The directory is locked, its ports, data and secret
are kept for the next start (``irdma.cli.localdir``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from functools import partial
from pathlib import Path

import trio

from ..client import AsyncClient
from ..cluster import (
    DEFAULT_TIMEOUT,
    ClusterConfig,
    Node,
    load_config,
    parse_config,
    parse_size,
    render_config,
)
from ..errors import ConfigError, IrdmaError
from ..spawn import python_module
from . import localdir
from .supervisor import FAILED, STOPPED, DaemonRecord, RestartPolicy, supervise

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
LOG_FILE = "local.log"  # a --background run's output
INSECURE_WARNING = (
    "WARNING: --insecure: no secret, the daemons accept every connection; any user of "
    "this host can read, change and delete every tensor of this cluster"
)

DESCRIPTION = """\
Run N psd daemons on this host, on loopback, with a config written to DIR/cluster.toml
(printed on stdout once every daemon answers). Ctrl-C, SIGTERM or SIGHUP stops them.
A daemon that dies is restarted (from its snapshot, then catching up from its replicas);
one that crashes 5 times in a row within 10 s of starting is given up on.

Connections are authenticated with a random secret kept in DIR/secret (mode 0600) and
named in the config, so every client using the config proves it; --insecure turns
that off (any local user could then read and change every tensor).

The directory is the cluster: a second irdma local on it is refused; a restart reuses
its ports and loads each daemon's snapshot (written when stopped, and every 60 s), so
the tensors are kept; a restart with another --nodes is refused while it holds data.

  irdma local --nodes 3 --dir /tmp/irdma                 in the foreground
  export IRDMA_CONFIG=$(irdma local --dir /tmp/irdma --background)
  irdma local --dir /tmp/irdma --stop
"""


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
    extra: dict[str, float | bool] | None = None,
    scheme: str = "tcp",
    secret_file: Path | None = None,
) -> Path:
    """Write ``directory/cluster.toml`` for ``nodes`` daemons on ``host``; return its path.

    ``scheme`` is the addresses' transport: tcp, shm or rdma. ``secret_file``
    is named in the config (an absolute path, so a copy of the config works
    from any directory on this host).
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
    text = render_config(
        entries, shard_size=shard_size, replicas=replicas, timeout=timeout, extra=extra
    )
    if secret_file is not None:
        # A top-level key, so before the [[nodes]] tables; JSON's string escapes are TOML's.
        text = f"secret_file = {json.dumps(str(secret_file.resolve()))}\n{text}"
    parse_config(tomllib.loads(text), path)  # validate it before it replaces a good one
    path.write_text(text)
    return path


def psd_command(config_path: Path, node: str) -> list[str]:
    return python_module("irdma_psd.main", "--config", str(config_path), "--node", node)


async def serving(client: AsyncClient, node: Node) -> bool:
    """Whether ``node`` answers HELLO and is ready (with replicas: caught up)."""
    try:
        return bool((await client.hello(node)).get("ready", True))
    except IrdmaError:
        return False


async def wait_ready(config: ClusterConfig, procs: dict[str, trio.Process]) -> None:
    """Wait until every daemon answers HELLO as ready; raise if one exits or time runs out.

    With replicas, a daemon is ready once it has caught up from its peers.
    """
    with trio.move_on_after(READY_TIMEOUT) as scope:
        async with AsyncClient(config, timeout=1.0) as client:
            for node in config.nodes:
                while not await serving(client, node):
                    proc = procs[node.name]
                    if proc.returncode is not None:
                        raise IrdmaError(
                            f"daemon {node.name} exited with status {proc.returncode} "
                            "before it was ready (see its log above)"
                        )
                    await trio.sleep(0.05)
    if scope.cancelled_caught:
        raise IrdmaError(f"daemons did not answer within {READY_TIMEOUT:g} s")


async def report_back(config: ClusterConfig, record: DaemonRecord, proc: trio.Process) -> None:
    """Say when a restarted daemon serves again (with replicas: once it has caught up)."""
    node = config.node(record.name)
    try:
        client = AsyncClient(config, timeout=1.0)
    except IrdmaError as exc:  # e.g. the secret file was removed: supervision goes on
        say(f"cannot ask daemon {record.name} whether it is back: {exc}")
        return
    async with client:
        while proc.returncode is None:
            if await serving(client, node):
                how = "caught up from its replicas" if config.replicas > 1 else "from its snapshot"
                say(
                    f"daemon {record.name} is back (pid {proc.pid}, restart {record.restarts}): "
                    f"serving, {how}"
                )
                return
            await trio.sleep(0.1)


def say(message: str) -> None:
    print(f"irdma local: {message}", file=sys.stderr, flush=True)


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


async def run_local(
    config_path: Path,
    lock: localdir.DirLock | None = None,
    ready_fd: int | None = None,
    policy: RestartPolicy = RestartPolicy(),  # noqa: B008 (frozen)
) -> int:
    """Run and supervise the daemons of ``config_path`` until a signal, or until every
    daemon has stopped for good; the exit status (0 after a signal).

    ``lock``: the directory's lock, handed down to the daemons so it stays
    held while any of them runs; its file records the daemons' pids and
    restarts (``irdma status`` reads them). ``ready_fd``: written the config
    path and closed once every daemon answers (how ``--background`` learns it).
    """
    config = load_config(config_path)
    procs: dict[str, trio.Process] = {}  # the running process of each daemon
    records = {n.name: DaemonRecord(n.name) for n in config.nodes}
    keep = (lock.fd,) if lock is not None and lock.fd is not None else ()

    async def start(name: str) -> trio.Process:
        return await trio.lowlevel.open_process(
            psd_command(config_path, name), stdin=subprocess.DEVNULL, pass_fds=keep
        )

    def save() -> None:
        if lock is not None:
            lock.record({n: p.pid for n, p in procs.items()}, list(records.values()))

    def changed(record: DaemonRecord, proc: trio.Process | None) -> None:
        if proc is None:
            procs.pop(record.name, None)
        else:
            procs[record.name] = proc
        save()

    try:
        # SIGHUP too (its terminal closed): psd takes SIGHUP as "reload", so
        # the daemons would outlive this command otherwise.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            started_at = trio.current_time()
            for node in config.nodes:
                node.data_dir.mkdir(parents=True, exist_ok=True)
                procs[node.name] = await start(node.name)
                records[node.name].started(procs[node.name].pid)
            save()
            await wait_ready(config, procs)
            print(config_path, flush=True)
            # A background run (it has a ready fd) has no terminal to press Ctrl-C in.
            how = "Ctrl-C" if ready_fd is None else f"irdma local --stop --dir {config_path.parent}"
            say(
                f"{len(procs)} daemons ready; export IRDMA_CONFIG={config_path}; "
                f"{how} stops them (their tensors are kept in {config_path.parent})"
            )
            if ready_fd is not None:
                os.write(ready_fd, f"{config_path}\n".encode())
                os.close(ready_fd)
            async with trio.open_nursery() as nursery:

                async def watch(name: str) -> None:
                    await supervise(
                        records[name],
                        procs[name],
                        partial(start, name),
                        started_at=started_at,
                        policy=policy,
                        changed=changed,
                        log=say,
                        back=partial(report_back, config),
                    )
                    if all(r.state in (STOPPED, FAILED) for r in records.values()):
                        nursery.cancel_scope.cancel()

                for name in list(procs):
                    nursery.start_soon(watch, name)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break
            if all(r.state in (STOPPED, FAILED) for r in records.values()):
                say("every daemon has stopped for good; exiting")
                return 1
            return 0
    finally:
        with trio.CancelScope(shield=True):
            await stop_all(procs)


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--dir", required=True, metavar="DIR", help="directory for the config and the daemons' data"
    )
    s.add_argument("--nodes", type=int, default=3, metavar="N", help="number of daemons")
    s.add_argument("--replicas", type=int, default=1, metavar="R", help="copies of each shard")
    s.add_argument("--arena", default="1GiB", metavar="SIZE", help="memory per daemon")
    s.add_argument("--shard-size", default="4MiB", metavar="SIZE", help="bytes per shard")
    s.add_argument("--host", default="127.0.0.1", metavar="ADDR", help="address to listen on")
    s.add_argument(
        "--insecure",
        action="store_true",
        help="no secret: the daemons accept every connection (any local user can read "
        "and change every tensor)",
    )
    mode = s.add_mutually_exclusive_group()
    mode.add_argument(
        "--background",
        action="store_true",
        help=f"run detached, return once ready (output in DIR/{LOG_FILE})",
    )
    mode.add_argument(
        "--stop", action="store_true", help="stop the irdma local running on --dir, then exit"
    )
    # Internal: the pipe a --background parent waits on.
    s.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    if args.stop:
        return stop(directory)
    if args.nodes < 1:
        raise ConfigError("--nodes must be at least 1")
    if args.background:
        return background(args, directory)
    lock = localdir.DirLock(directory)
    lock.acquire()
    try:
        previous = localdir.previous_config(directory)
        localdir.check_node_count(directory, previous, args.nodes)
        ports, warnings = localdir.stable_ports(
            previous, args.host, args.nodes, free_ports(args.host, args.nodes)
        )
        for warning in warnings:
            say(warning)
        secret = None if args.insecure else localdir.ensure_secret(directory)
        if args.insecure:
            say(INSECURE_WARNING)
        path = write_config(
            directory,
            args.nodes,
            replicas=args.replicas,
            arena_size=parse_size(args.arena),
            shard_size=parse_size(args.shard_size),
            host=args.host,
            ports=ports,
            secret_file=secret,
        )
        return trio.run(run_local, path, lock, args.ready_fd)
    finally:
        lock.release()


def background(args: argparse.Namespace, directory: Path) -> int:
    """Start ``irdma local`` detached (its own session, output in DIR/local.log);
    print the config path once every daemon answers."""
    if localdir.is_locked(directory):
        raise localdir.DirectoryInUse(localdir.read_holder(directory).describe(directory))
    directory.mkdir(parents=True, exist_ok=True)
    argv = python_module("irdma", "local", "--dir", str(directory))
    argv += ["--nodes", str(args.nodes), "--replicas", str(args.replicas)]
    argv += ["--arena", args.arena, "--shard-size", args.shard_size, "--host", args.host]
    if args.insecure:
        argv.append("--insecure")
        say(INSECURE_WARNING)  # here too: the detached run's warning goes to its log
    log_path = directory / LOG_FILE
    read_end, write_end = os.pipe()
    try:
        with open(log_path, "ab") as log:
            child = subprocess.Popen(
                [*argv, "--ready-fd", str(write_end)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(write_end,),
                start_new_session=True,  # Ctrl-C in the caller's terminal is not for it
            )
    finally:
        os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as ready:
            line = ready.readline().decode().strip()  # EOF if it exits before ready
    except BaseException:
        child.terminate()
        raise
    if not line:
        status = child.wait()
        sys.stderr.write(_tail(log_path))
        print(f"irdma local: did not start (see {log_path})", file=sys.stderr)
        return status or 1
    print(line, flush=True)
    print(
        f"irdma local: running in the background (pid {child.pid}, log {log_path}); "
        f"export IRDMA_CONFIG={line}; stop it with irdma local --stop --dir {directory}",
        file=sys.stderr,
    )
    return 0


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"{line}\n" for line in text)


def stop(directory: Path) -> int:
    """Stop the ``irdma local`` running on ``directory`` and wait until it has."""
    if not localdir.is_locked(directory):
        print(f"irdma local: nothing runs on {directory}", file=sys.stderr)
        return 0
    pids = localdir.stop_holder(directory)
    deadline = time.monotonic() + STOP_TIMEOUT + 5
    while localdir.is_locked(directory):
        if time.monotonic() > deadline:
            raise IrdmaError(
                f"irdma local on {directory} still runs {STOP_TIMEOUT + 5:g} s after SIGTERM "
                f"(pids {', '.join(map(str, pids))})"
            )
        time.sleep(0.05)
    print(f"irdma local: stopped the cluster in {directory}", file=sys.stderr)
    return 0
