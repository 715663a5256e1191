"""Real FUSE mounts of a cluster, each served by an ``irdma mount --foreground`` process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .cluster import READY_TIMEOUT, Cluster
from .processes import stop_process


@dataclass
class Mount:
    """A real FUSE mount of a cluster, served by an `irdma mount --foreground` process."""

    path: Path
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def unmount(self) -> None:
        """SIGTERM the mount process (it pushes pending writes), then make sure it is gone."""
        stop_process(self.proc, 20)
        if is_mounted(self.path):  # a dead mount: os.path.ismount says False for those
            subprocess.run(["fusermount3", "-u", "-z", str(self.path)], check=False)


def is_mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point according to /proc/mounts (works for dead mounts)."""
    target = str(path.absolute())
    with open("/proc/mounts") as f:
        return any(line.split()[1] == target for line in f)


def mount_command(config: Path, *args: str) -> list[str]:
    """The ``irdma mount`` command line for a cluster config."""
    return [sys.executable, "-m", "irdma", "--config", str(config), "mount", *args]


# The FUSE session the mounts of a test run use unless a test names one:
# IRDMA_TEST_MOUNT_SESSION=pyfuse3 runs the mount tests against pyfuse3.
SESSION_ENV = "IRDMA_TEST_MOUNT_SESSION"


def default_session() -> str:
    """The FUSE session mounts use where a test names none (irdma mount's default)."""
    return os.environ.get(SESSION_ENV, "own")


def start_mount(cluster: Cluster, path: Path, *extra: str, session: str | None = None) -> Mount:
    """``irdma mount --foreground`` of ``cluster`` at ``path``, up and serving.

    ``session``: "own" or "pyfuse3" (default: $IRDMA_TEST_MOUNT_SESSION, else own).
    """
    extra = ("--session", session or default_session(), *extra)
    path.mkdir(parents=True, exist_ok=True)
    log_path = path.parent / f"{path.name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            mount_command(cluster.config_path, str(path), "--foreground", *extra),
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    m = Mount(path, proc, log_path)
    deadline = time.monotonic() + READY_TIMEOUT
    while not os.path.ismount(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            m.unmount()
            raise RuntimeError(f"mount of {path} failed: {m.log()}")
        time.sleep(0.05)
    return m
