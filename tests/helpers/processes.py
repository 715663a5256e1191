"""Processes a test started, or looks for: stopped for sure, found by command line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path


def stop_process(proc: subprocess.Popen, grace: float, *, wake: bool = False) -> None:
    """SIGTERM ``proc`` (after SIGCONT with ``wake``: a paused process cannot handle
    it), wait up to ``grace`` seconds, then SIGKILL it; nothing if it has exited."""
    if proc.poll() is not None:
        return
    if wake:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def processes_with(match: Callable[[list[bytes]], bool]) -> list[int]:
    """PIDs of the processes whose command line (its arguments, from /proc) ``match``es."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if match(argv):
            pids.append(int(entry.name))
    return pids
