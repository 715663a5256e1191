"""`irdma mount --foreground` as irdma-mount.service runs it: READY=1 once mounted, STOPPING=1."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .helpers.cluster import Cluster
from .helpers.mounts import is_mounted, mount_command

pytestmark = pytest.mark.timeout(60)


def test_ready_once_mounted_then_stopping(cluster: Cluster, tmp_path: Path) -> None:
    name = f"irdma-test-{secrets.token_hex(8)}"
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(b"\0" + name.encode())
    manager.settimeout(20)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cluster.client().write(f"{name}/w", np.zeros(4, np.float32))
    proc = subprocess.Popen(
        mount_command(cluster.config_path, str(mnt), "--foreground"),
        env={**os.environ, "NOTIFY_SOCKET": "@" + name},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        ready = manager.recv(4096).decode()
        assert ready == f"READY=1\nSTATUS=serving {mnt}"
        assert is_mounted(mnt)  # already mounted when READY arrives
        assert os.listdir(mnt / name) == ["w.npy"]  # and served: the cluster's tensors
        proc.send_signal(signal.SIGTERM)
        assert manager.recv(4096).decode().startswith("STOPPING=1\n")
        assert proc.wait(20) == 0
        assert not is_mounted(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        assert proc.stderr is not None
        proc.stderr.close()
        manager.close()
