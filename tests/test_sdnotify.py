"""irdma.sdnotify against real AF_UNIX datagram sockets (paths and abstract names)."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from irdma.sdnotify import Notifier, NotifyError, keep_alive, socket_address, watchdog_interval

pytestmark = pytest.mark.timeout(30)


def time_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Receiver:
    """The service manager's end: a bound datagram socket."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(2.0)

    def recv(self) -> dict[str, str]:
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.split("\n"))

    def pending(self) -> list[dict[str, str]]:
        """Every datagram already queued, without waiting."""
        out = []
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    data = self.sock.recv(4096).decode()
                except BlockingIOError:
                    return out
                out.append(dict(line.split("=", 1) for line in data.split("\n")))
        finally:
            self.sock.settimeout(2.0)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def path_receiver(tmp_path: Path) -> Iterator[tuple[Receiver, str]]:
    path = str(tmp_path / "notify")
    r = Receiver(path)
    try:
        yield r, path
    finally:
        r.close()


@pytest.fixture
def abstract_receiver() -> Iterator[tuple[Receiver, str]]:
    name = f"irdma-test-{secrets.token_hex(8)}"
    r = Receiver(b"\0" + name.encode())
    try:
        yield r, "@" + name
    finally:
        r.close()


def test_ready_status_stopping_on_a_path_socket(path_receiver: tuple[Receiver, str]) -> None:
    r, path = path_receiver
    with Notifier.from_environ({"NOTIFY_SOCKET": path}) as n:
        assert n.enabled
        assert n.ready("serving on tcp://127.0.0.1:7401")
        assert r.recv() == {"READY": "1", "STATUS": "serving on tcp://127.0.0.1:7401"}
        assert n.status("serving; snapshotting")
        assert r.recv() == {"STATUS": "serving; snapshotting"}
        assert n.watchdog()
        assert r.recv() == {"WATCHDOG": "1"}
        assert n.stopping("stopping: writing the final snapshot")
        assert r.recv() == {"STOPPING": "1", "STATUS": "stopping: writing the final snapshot"}


def test_abstract_socket_address(abstract_receiver: tuple[Receiver, str]) -> None:
    r, name = abstract_receiver
    assert socket_address(name) == b"\0" + name[1:].encode()
    with Notifier(name) as n:
        assert n.ready()
        assert r.recv() == {"READY": "1"}
        assert n.watchdog()
        assert r.recv() == {"WATCHDOG": "1"}


def test_reloading_carries_a_monotonic_timestamp(path_receiver: tuple[Receiver, str]) -> None:
    r, path = path_receiver
    with Notifier(path) as n:
        before = time_usec()
        n.reloading("reloading the log level")
        msg = r.recv()
    assert msg["RELOADING"] == "1"
    assert msg["STATUS"] == "reloading the log level"
    assert before <= int(msg["MONOTONIC_USEC"]) <= time_usec()


def test_a_newline_cannot_start_another_assignment(path_receiver: tuple[Receiver, str]) -> None:
    r, path = path_receiver
    with Notifier(path) as n:
        n.status("line one\nREADY=1")
    assert r.recv() == {"STATUS": "line one READY=1"}


def test_without_notify_socket_nothing_is_sent() -> None:
    n = Notifier.from_environ({})
    assert not n.enabled
    assert not n.ready("x")
    assert not n.watchdog()
    n.close()


def test_an_unusable_notify_socket_disables_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="irdma.sdnotify"):
        n = Notifier.from_environ({"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not n.enabled
    assert "only unix socket paths" in caplog.text
    with pytest.raises(NotifyError):
        Notifier("relative/path")


def test_a_manager_that_went_away_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gone"
    Receiver(str(path)).close()
    os.unlink(path)
    with Notifier(str(path)) as n, caplog.at_level(logging.WARNING, logger="irdma.sdnotify"):
        assert not n.ready()
    assert "cannot notify the service manager" in caplog.text


def test_watchdog_interval_from_the_environment() -> None:
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "3000000"}) == 3.0
    mine = str(os.getpid())
    assert watchdog_interval({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": mine}) == 0.5
    # Meant for another process (inherited from a parent): not ours to answer.
    assert watchdog_interval({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "1"}) is None
    for bad in ("soon", "0", "-5"):
        with pytest.raises(NotifyError):
            watchdog_interval({"WATCHDOG_USEC": bad})


async def test_keep_alive_pings_every_half_interval(
    path_receiver: tuple[Receiver, str], autojump_clock: trio.testing.MockClock
) -> None:
    r, path = path_receiver
    with Notifier(path) as n:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_alive, n, 2.0)
            await trio.sleep(4.5)  # pings at 0, 1, 2, 3, 4
            nursery.cancel_scope.cancel()
    assert r.pending() == [{"WATCHDOG": "1"}] * 5


async def test_keep_alive_without_interval_or_socket_returns(
    path_receiver: tuple[Receiver, str],
) -> None:
    r, path = path_receiver
    with Notifier(path) as n:
        await keep_alive(n, None)
    await keep_alive(Notifier(None), 1.0)
    assert r.pending() == []
