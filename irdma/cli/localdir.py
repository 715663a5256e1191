"""What ``irdma local`` keeps in its directory, and the rules that protect it.

- ``local.lock``: held (flock) by the running ``irdma local`` and inherited by
  its daemons, so a second instance on the same directory refuses instead of
  rewriting the config and the daemons' sockets under the first; the file
  names the holder's pid, its daemons' and their restarts (``irdma status``
  shows them).
- ``secret``: the cluster's random secret (mode 0600), named by the config,
  kept across restarts so copies of the config stay valid.
- ``cluster.toml``: the ports of the last run, reused by the next one, so a
  config copied elsewhere stays valid across restarts.
- ``nK/snapshot.irdma``: each daemon's data. Placement depends on the number of
  daemons, so a restart with another ``--nodes`` would hide tensors; it is
  refused while any snapshot holds data.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..auth import load_secret
from ..cluster import ClusterConfig, load_config
from ..errors import ConfigError, IrdmaError
from ..spawn import python_module
from .supervisor import DaemonRecord

LOCK_FILE = "local.lock"
CONFIG_FILE = "cluster.toml"
SNAPSHOT_FILE = "snapshot.irdma"  # psd's name for a data dir's snapshot
SECRET_FILE = "secret"


class DirectoryInUse(IrdmaError):
    """Another ``irdma local`` (or the daemons it left) runs on this directory."""


@dataclass
class Holder:
    """Who holds a directory's lock, as it wrote into the lock file."""

    pid: int | None = None
    daemons: dict[str, int] = field(default_factory=dict)
    supervised: dict[str, DaemonRecord] = field(default_factory=dict)

    def describe(self, directory: Path) -> str:
        stop = f"irdma local --stop --dir {directory}"
        if self.pid is not None and pid_alive(self.pid):
            return (
                f"{directory} is in use by irdma local (pid {self.pid}); stop it first "
                f"(Ctrl-C in its terminal, or {stop}), or use another --dir"
            )
        live = [f"{n} (pid {p})" for n, p in self.daemons.items() if pid_alive(p)]
        gone = f" (pid {self.pid}) has exited but" if self.pid is not None else ""
        return (
            f"{directory} is in use: its irdma local{gone} its daemons still run: "
            f"{', '.join(live) or 'unknown pids'}; stop them with {stop}"
        )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_holder(directory: Path) -> Holder:
    try:
        raw = json.loads((directory / LOCK_FILE).read_text() or "{}")
    except (OSError, ValueError):
        return Holder()
    return Holder(
        raw.get("pid"),
        {str(k): int(v) for k, v in raw.get("daemons", {}).items()},
        {r["name"]: DaemonRecord.from_dict(r) for r in raw.get("supervised", [])},
    )


def supervision(directory: Path) -> dict[str, DaemonRecord]:
    """The running ``irdma local``'s record of each daemon in ``directory`` (pid, state,
    restarts); empty when no ``irdma local`` holds the directory."""
    if not is_locked(directory):
        return {}
    return read_holder(directory).supervised


class DirLock:
    """The exclusive lock on an ``irdma local`` directory (see the module doc)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise DirectoryInUse naming who has it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirectoryInUse(read_holder(self.directory).describe(self.directory)) from None
        self.fd = fd
        self.record({})

    def record(self, daemons: dict[str, int], supervised: Sequence[DaemonRecord] = ()) -> None:
        """Write this process's pid, its daemons' and their supervision records into the
        lock file."""
        assert self.fd is not None
        data = json.dumps(
            {
                "pid": os.getpid(),
                "daemons": daemons,
                "supervised": [r.to_dict() for r in supervised],
            }
        ).encode()
        # One write of the whole record: a reader (irdma status) may see the file
        # empty for a moment (read_holder takes that as no record), never half of one.
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the lock goes once every daemon holding it has exited too
            self.fd = None


def is_locked(directory: Path) -> bool:
    """Whether some process holds the directory's lock right now."""
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# -- secret --------------------------------------------------------------------


def ensure_secret(directory: Path) -> Path:
    """``directory/secret``: created with a random 256-bit secret (mode 0600) if missing,
    else kept (copies of the config name it). Raises ConfigError if the file there is
    unusable (too open, too short), as the daemons would."""
    path = directory / SECRET_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    load_secret(path)
    return path


# -- ports ---------------------------------------------------------------------


def previous_config(directory: Path) -> ClusterConfig | None:
    """The config the last run wrote in ``directory``, if any."""
    path = directory / CONFIG_FILE
    if not path.exists():
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        raise ConfigError(
            f"{exc} (irdma local reuses its ports and data; fix the file or remove it "
            "to choose new ports)"
        ) from None


def port_free(host: str, port: int) -> bool:
    """Whether a daemon could listen on ``host:port`` now (SO_REUSEADDR, as trio's
    listeners set it, so the last run's connections in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def stable_ports(
    previous: ClusterConfig | None, host: str, nodes: int, fresh: list[int]
) -> tuple[list[int], list[str]]:
    """Ports for ``nodes`` daemons: the last run's where they are still free.

    ``fresh`` are free ports to take the rest from. Returns the ports and a
    warning for each stored port that another program holds now.
    """
    old: dict[str, int] = {}
    if previous is not None:
        old = {n.name: n.address.port for n in previous.nodes if n.address.host == host}
    spare = [p for p in fresh if p not in old.values()]
    ports, warnings = [], []
    for i in range(nodes):
        name = f"n{i + 1}"
        port = old.get(name)
        if port is not None and not port_free(host, port):
            new = spare.pop(0)
            warnings.append(
                f"{name}'s port {port} is taken by another program now; it moves to {new} "
                "(configs copied from the last run need the new cluster.toml)"
            )
            port = new
        elif port is None:
            port = spare.pop(0)
        ports.append(port)
    return ports, warnings


# -- data ----------------------------------------------------------------------


def tensors_held(data_dir: Path) -> list[str] | None:
    """Names of the tensors in a data dir's snapshot ([] if none; None if it cannot be read).

    psd reads its own format (``python -m irdma_psd.snapshot``), run as a command
    as the daemons are: irdma does not import the daemon's package.
    """
    path = data_dir / SNAPSHOT_FILE
    if not path.exists():
        return []
    proc = subprocess.run(
        python_module("irdma_psd.snapshot", str(path)),
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        names = json.loads(proc.stdout) if proc.returncode == 0 else None
    except ValueError:
        return None
    return names if isinstance(names, list) else None


def check_node_count(directory: Path, previous: ClusterConfig | None, nodes: int) -> None:
    """Refuse another ``--nodes`` than the last run's while any daemon's snapshot holds data.

    Every client finds a shard by hashing over the daemons there are, so with
    fewer daemons the tensors on the missing ones are gone from view, and with
    more, the shards placement moves to the new daemons are not found.
    """
    if previous is None or len(previous.nodes) == nodes:
        return
    before = len(previous.nodes)
    # Fewer daemons: only the left-out ones' shards move (rendezvous hashing);
    # more: shards of every daemon may move to the new ones.
    at_risk = previous.nodes[nodes:] if nodes < before else previous.nodes
    held = {n.name: tensors_held(n.data_dir) for n in at_risk}
    holding = {n: t for n, t in held.items() if t is None or t}
    if not holding:
        return
    parts = [
        f"{n}: {'unreadable snapshot' if t is None else f'{len(t)} tensors'}"
        for n, t in holding.items()
    ]
    if nodes < before:
        effect = (
            f"--nodes {nodes} would leave out {', '.join(holding)} and hide the tensors "
            "placed there"
        )
    else:
        effect = (
            f"with --nodes {nodes}, the shards that placement moves to the new daemons "
            "would not be found"
        )
    raise ConfigError(
        f"{directory} holds data on its {before} daemons ({'; '.join(parts)}); "
        f"{effect}. Start it with --nodes {before} (irdma get can copy the tensors out "
        f"first), or remove {directory} for a new, empty cluster"
    )


def stop_holder(directory: Path) -> list[int]:
    """SIGTERM the ``irdma local`` holding ``directory`` (or, if it is gone, its
    daemons); the pids signalled."""
    import signal

    holder = read_holder(directory)
    targets = []
    if holder.pid is not None and pid_alive(holder.pid):
        targets = [holder.pid]
    else:
        targets = [p for p in holder.daemons.values() if pid_alive(p)]
    for pid in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return targets
