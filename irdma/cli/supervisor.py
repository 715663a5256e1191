"""Keeping ``irdma local``'s daemons running: restart on failure, give up on a crash loop.

Like systemd's ``Restart=on-failure``: a daemon that exits with an error
or is killed by a signal is started again after a short delay; one that
exits cleanly (status 0: someone sent it SIGTERM) is left stopped. A
restarted daemon loads its snapshot and, with replicas, catches up from
its peers before it serves (psd does both on every start), so a restart
is the same command as the first start.

A crash within ``fast`` seconds of starting counts against the daemon;
after ``burst`` of them in a row the supervisor gives up on it (systemd's
start limit), because restarting a daemon that cannot start (its port is
taken, its config is wrong) only fills the log. The delay doubles with
each fast crash so a loop does not spin. A run longer than ``fast``
resets the count.

The policy (``DaemonRecord.exited``) is a plain function of exit codes and
durations; ``supervise`` is the trio loop around it.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import trio


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart a daemon and when to stop trying."""

    burst: int = 5  # fast crashes in a row before giving up
    fast: float = 10.0  # seconds: a crash sooner than this after starting is "fast"
    first_delay: float = 0.1  # before the first restart (systemd's RestartSec default)
    max_delay: float = 5.0


RUNNING = "running"
RESTARTING = "restarting"
STOPPED = "stopped"  # exited cleanly: not restarted (on-failure)
FAILED = "failed"  # crashed too often too fast: given up


def describe_exit(returncode: int) -> str:
    """``killed by SIGKILL`` or ``exited with status 1``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


@dataclass
class DaemonRecord:
    """One supervised daemon, as ``irdma status`` shows it (kept in the lock file)."""

    name: str
    pid: int | None = None
    state: str = RUNNING
    restarts: int = 0
    fast_crashes: int = 0
    last_exit: str | None = None  # how it last ended, e.g. "killed by SIGKILL"

    def exited(self, returncode: int, ran_for: float, policy: RestartPolicy) -> float | None:
        """Record an exit after ``ran_for`` seconds; the delay before restarting, or None
        when it stays down (a clean exit, or the crash limit reached)."""
        self.pid = None
        self.last_exit = describe_exit(returncode)
        if returncode == 0:
            self.state = STOPPED
            return None
        self.fast_crashes = self.fast_crashes + 1 if ran_for < policy.fast else 0
        if self.fast_crashes >= policy.burst:
            self.state = FAILED
            return None
        self.state = RESTARTING
        if self.fast_crashes == 0:
            return policy.first_delay
        return min(policy.first_delay * 2 ** (self.fast_crashes - 1), policy.max_delay)

    def started(self, pid: int) -> None:
        self.pid = pid
        self.state = RUNNING

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DaemonRecord:
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in raw.items() if k in fields})


async def supervise(
    record: DaemonRecord,
    proc: trio.Process,
    start: Callable[[], Awaitable[trio.Process]],
    *,
    started_at: float,
    policy: RestartPolicy,
    changed: Callable[[DaemonRecord, trio.Process | None], None],
    log: Callable[[str], None],
    back: Callable[[DaemonRecord, trio.Process], Awaitable[None]],
) -> None:
    """Wait for ``proc`` to exit and restart it by ``start()`` until the policy says stop.

    ``started_at``: when ``proc`` was started (``trio.current_time()``), so
    its first crash is judged fast or not by how long it really ran.
    ``changed`` is called with the record and the current process (None
    while there is none) after every change; ``back`` runs for each restart
    (in the background) to report when the daemon serves again. Returns
    when the daemon stays down; cancel it to stop supervising (the caller
    stops the process).
    """
    async with trio.open_nursery() as nursery:
        while True:
            code = await proc.wait()
            delay = record.exited(code, trio.current_time() - started_at, policy)
            changed(record, None)
            if record.state == STOPPED:
                log(
                    f"daemon {record.name} {record.last_exit}; not restarted (a clean exit: "
                    "it was stopped on purpose). Restart irdma local to bring it back"
                )
                return
            if delay is None:
                log(
                    f"daemon {record.name} {record.last_exit}; it crashed {record.fast_crashes} "
                    f"times in a row, each within {policy.fast:g} s of starting: giving up on "
                    "it (its output is above). The other daemons keep running; fix the cause "
                    "and restart irdma local"
                )
                return
            log(
                f"daemon {record.name} {record.last_exit}; restarting it in {delay:g} s "
                f"(restart {record.restarts + 1})"
            )
            await trio.sleep(delay)
            started_at = trio.current_time()
            proc = await start()
            record.restarts += 1
            record.started(proc.pid)
            changed(record, proc)
            nursery.start_soon(back, record, proc)
