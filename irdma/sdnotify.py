"""The systemd notify protocol (``sd_notify``): readiness, status and watchdog messages.

A service started with ``Type=notify`` finds a datagram socket in
``$NOTIFY_SOCKET`` and sends it newline-separated ``KEY=VALUE`` lines:
``READY=1`` once it serves, ``STATUS=...`` for ``systemctl status``,
``WATCHDOG=1`` at least every ``$WATCHDOG_USEC`` microseconds, ``STOPPING=1``
when it begins to shut down, ``RELOADING=1`` around a reload. An address that
starts with ``@`` is in the abstract namespace (a leading NUL byte).

Written here instead of depending on a library: the protocol is one datagram
per message and fits in this module, while the maintained binding
(``systemd-python``) needs libsystemd's headers and a compiler to install.
Without ``$NOTIFY_SOCKET`` (not under systemd) every call does nothing.

Sends never block the caller: the socket is non-blocking and a message the
service manager cannot take at once is dropped with a log line, so a stuck
manager cannot stall a daemon's event loop.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

import trio

log = logging.getLogger("irdma.sdnotify")


class NotifyError(Exception):
    """``$NOTIFY_SOCKET`` or ``$WATCHDOG_USEC`` has a value this module cannot use."""


def socket_address(value: str) -> str | bytes:
    """The ``sendto`` address for a ``$NOTIFY_SOCKET`` value; raises NotifyError."""
    if value.startswith("@"):
        return b"\0" + os.fsencode(value[1:])
    if value.startswith("/"):
        return value
    # systemd >= 254 may also name an AF_VSOCK address (vsock:CID:PORT), for VMs.
    raise NotifyError(f"NOTIFY_SOCKET={value!r}: only unix socket paths and @abstract names work")


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds within which the manager wants a ``WATCHDOG=1``, or None if it wants none.

    Read from ``$WATCHDOG_USEC``; ``$WATCHDOG_PID``, when set, must be this
    process (the variables were meant for it, not inherited from a parent).
    Raises NotifyError for a value that is not a positive integer.
    """
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        raise NotifyError(f"WATCHDOG_USEC={usec!r} is not a number of microseconds") from None
    if value <= 0:
        raise NotifyError(f"WATCHDOG_USEC={usec!r} must be positive")
    return value / 1e6


class Notifier:
    """Messages to the service manager at ``address`` (None: not under systemd, do nothing).

    Raises NotifyError for an address that is not a unix socket path or @name.
    """

    def __init__(self, address: str | None) -> None:
        self.address = address
        self._sock: socket.socket | None = None
        self._target: str | bytes | None = None
        if address:
            self._target = socket_address(address)
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """The notifier ``$NOTIFY_SOCKET`` names (a disabled one, with a warning, if unusable)."""
        env = os.environ if environ is None else environ
        try:
            return cls(env.get("NOTIFY_SOCKET") or None)
        except NotifyError as exc:
            log.warning("%s; not notifying the service manager", exc)
            return cls(None)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; return whether it was sent.

        A failed send (manager gone, queue full) is logged, not raised: losing
        a status line must not stop the service.
        """
        if self._sock is None or self._target is None:  # both set, or neither
            return False
        text = "\n".join(f"{k}={_one_line(v)}" for k, v in fields.items())
        try:
            self._sock.sendto(text.encode(), self._target)
        except OSError as exc:
            log.warning("cannot notify the service manager at %s: %s", self.address, exc)
            return False
        log.debug("notify: %s", text.replace("\n", " "))
        return True

    def ready(self, status: str | None = None) -> bool:
        """The service is up and serves."""
        return self.notify(READY=1, **_status(status))

    def status(self, status: str) -> bool:
        """A one-line state for ``systemctl status``."""
        return self.notify(STATUS=status)

    def reloading(self, status: str | None = None) -> bool:
        """A reload began; ``ready()`` ends it (``Type=notify-reload`` requires the timestamp)."""
        stamp = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify(RELOADING=1, MONOTONIC_USEC=stamp, **_status(status))

    def stopping(self, status: str | None = None) -> bool:
        """The service is shutting down."""
        return self.notify(STOPPING=1, **_status(status))

    def watchdog(self) -> bool:
        """Tell the manager the service is alive (within ``WatchdogSec``)."""
        return self.notify(WATCHDOG=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def keep_alive(notifier: Notifier, interval: float | None) -> None:
    """Send ``WATCHDOG=1`` every ``interval / 2`` seconds until cancelled.

    Runs as a task in the event loop it vouches for: when that loop hangs
    (a blocking call, SIGSTOP), the pings stop and the manager restarts the
    service. With no interval or no notifier it returns at once.
    """
    if interval is None or not notifier.enabled:
        return
    while True:
        notifier.watchdog()
        await trio.sleep(interval / 2)


def _status(status: str | None) -> dict[str, str]:
    return {} if status is None else {"STATUS": status}


def _one_line(value: str | int) -> str:
    # A newline would start another KEY=VALUE assignment.
    return str(value).replace("\n", " ")
