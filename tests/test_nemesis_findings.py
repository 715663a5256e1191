"""Failures the nemesis found (tests/test_nemesis.py), reproduced without a cluster.

- A daemon that dies while a client attaches to it over its unix socket (the shm
  handshake every "auto" connection tries first) reached the caller as a raw
  ``ConnectionResetError``: no ``DaemonUnavailable``, so no failover to another
  replica (seen in 3 of 12 nemesis runs, killed or restarted daemons). Fixed:
  the handshake's I/O errors are ``StreamBroken``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from irdma import Client
from irdma.cluster import render_config
from irdma.errors import DaemonUnavailable
from irdma.transport.unix import socket_path


@contextlib.contextmanager
def dies_during_attach(path: Path) -> Iterator[None]:
    """A unix socket at ``path`` that accepts each connection and closes it with the
    client's ATTACH frame unread: the client's read then fails with ECONNRESET, as
    when a daemon is killed mid-handshake."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.recv(1, socket.MSG_PEEK)  # the ATTACH frame arrived; not read

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        server.close()


@pytest.mark.timeout(30)
def test_a_daemon_dying_during_the_shm_handshake_is_unavailable(tmp_path: Path) -> None:
    data = tmp_path / "n1"
    data.mkdir()
    with socket.socket() as s:  # a TCP port nothing listens on: the fallback fails too
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "cluster.toml"
    config.write_text(render_config([("n1", f"tcp://127.0.0.1:{port}", str(data), 1 << 20)]))
    with (
        dies_during_attach(socket_path(data)),
        Client(config, timeout=2.0) as client,
        pytest.raises(DaemonUnavailable),
    ):
        client.stat("t")
