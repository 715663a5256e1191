"""The faults of a nemesis run: a schedule drawn from a seed, and the nemesis applying it.

One fault at a time, as in Jepsen's etcd tests: start it, hold it, undo it, wait
until every daemon is ready again, pause, next. One at a time because the promise
being tested (docs/semantics.md) is that an acknowledged update survives while one
replica of its shard that had it survives: a kill -9 while another replica of the
same shard is still catching up may lose updates by design.

- ``kill``: ``kill -9`` of a daemon, restarted after the hold (snapshot, catch-up);
- ``pause``: SIGSTOP of a daemon, SIGCONT after the hold;
- ``partition``: a daemon's host cut off from every other host, then healed;
- ``restart-all``: every daemon stopped with SIGTERM (final snapshots) and started;
- ``link``: the link between two daemon hosts broken while both still reach every
  other host (asymmetric; not covered by the replication design, see the README);
- ``link-kill``: as ``link``, and the first of the two is killed with ``kill -9`` at
  the end of the hold (then restarted, then the link restored): what the other one
  missed while cut off is then only on the killed daemon.
- ``drain`` (membership in etcd): ``irdma drain`` of a daemon (its copies move to the
  others), withdrawn at the end of the hold (it joins again: copies move back), the
  move it started perhaps not finished;
- ``replace`` (membership in etcd): ``kill -9`` of a daemon held past its lease and
  ``replace_after``, so its copies are made again on the others; restarted, it joins.

After an elastic fault the cluster counts as recovered once every daemon is a member
of one settled epoch with no move under way.

The schedule is a pure function of the seed, so a failing run's faults can be
replayed; which operations they meet still depends on timing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .history import NEMESIS, HistoryWriter, Record

SYMMETRIC = ("kill", "pause", "partition", "restart-all")
ASYMMETRIC = ("link", "link-kill")
ELASTIC = ("drain", "replace")
# ``replace`` holds past lease_ttl + replace_after of the nemesis's etcd config (1 + 2 s).
REPLACE_HOLD = (3.5, 5.0)
RECOVERY_TIMEOUT = 90.0  # seconds the cluster gets to be ready again after a fault


@dataclass(frozen=True)
class Fault:
    kind: str
    targets: tuple[str, ...]
    hold: float  # seconds the fault lasts
    gap: float  # quiet seconds after recovery, before the next fault

    def describe(self) -> str:
        return (
            f"{self.kind} {','.join(self.targets) or 'all'} hold {self.hold:g}s gap {self.gap:g}s"
        )


def schedule(
    seed: int, hosts: Sequence[str], kinds: Sequence[str], count: int = 500
) -> list[Fault]:
    """``count`` faults drawn from ``random.Random(seed)``: the same seed, the same list."""
    rng = random.Random(seed)
    out: list[Fault] = []
    if not kinds:
        return out  # a run without faults
    for _ in range(count):
        kind = rng.choice(list(kinds))
        if kind == "restart-all":
            targets: tuple[str, ...] = ()
            hold = round(rng.uniform(0.2, 1.5), 2)
        elif kind in ASYMMETRIC:
            targets = tuple(rng.sample(list(hosts), 2))
            hold = round(rng.uniform(1.0, 5.0), 2)
        elif kind == "replace":
            targets = (rng.choice(list(hosts)),)
            hold = round(rng.uniform(*REPLACE_HOLD), 2)
        else:
            targets = (rng.choice(list(hosts)),)
            hold = round(rng.uniform(0.5, 4.0), 2)
        out.append(Fault(kind, targets, hold, round(rng.uniform(0.5, 2.0), 2)))
    return out


class Target(Protocol):
    """What the nemesis acts on (``run.NemesisCluster``)."""

    def kill(self, host: str) -> None: ...
    def start(self, host: str) -> None: ...
    def pause(self, host: str) -> None: ...
    def resume(self, host: str) -> None: ...
    def partition(self, host: str) -> None: ...
    def heal(self, host: str) -> None: ...
    def cut_link(self, a: str, b: str) -> None: ...
    def restore_link(self, a: str, b: str) -> None: ...
    def stop_all(self) -> None: ...
    def start_all(self) -> None: ...
    def drain(self, host: str) -> None: ...
    def undrain(self, host: str) -> None: ...
    def wait_ready(self, timeout: float) -> dict[str, Any]: ...


class Nemesis:
    """Applies a schedule to a cluster until a deadline, recording each step."""

    def __init__(self, target: Target, history: HistoryWriter, log: Any = print) -> None:
        self.target = target
        self.history = history
        self.log = log
        self.applied: list[Fault] = []

    def _record(self, index: int, fault: Fault, phase: str, **extra: Any) -> None:
        detail = {"phase": phase, "targets": list(fault.targets)} | extra
        self.history.write(Record("fault", NEMESIS, index, fault.kind, time.monotonic(),
                                  detail=detail))  # fmt: skip

    def run(self, faults: Sequence[Fault], until: float) -> bool:
        """Apply faults in order while each can end before ``until``; False if the
        cluster did not recover from one (the rest of the run is then skipped)."""
        for index, fault in enumerate(faults):
            if time.monotonic() + fault.hold > until:
                break
            self._record(index, fault, "start", hold=fault.hold)
            self.log(f"nemesis #{index}: {fault.describe()}")
            self._start(fault)
            time.sleep(fault.hold)
            self._end(fault)
            self._record(index, fault, "end")
            self.applied.append(fault)
            state = self.target.wait_ready(RECOVERY_TIMEOUT)
            if not state.get("ready"):
                self._record(index, fault, "stuck", last=state.get("last"))
                self.log(f"nemesis #{index}: no recovery: {state}")
                return False
            self._record(index, fault, "ready", waited=round(state.get("waited", 0.0), 3))
            time.sleep(max(0.0, min(fault.gap, until - time.monotonic())))
        return True

    def _start(self, fault: Fault) -> None:
        t = self.target
        if fault.kind == "kill":
            t.kill(fault.targets[0])
        elif fault.kind == "pause":
            t.pause(fault.targets[0])
        elif fault.kind == "partition":
            t.partition(fault.targets[0])
        elif fault.kind == "restart-all":
            t.stop_all()
        elif fault.kind in ASYMMETRIC:
            t.cut_link(*fault.targets)
        elif fault.kind == "drain":
            t.drain(fault.targets[0])
        elif fault.kind == "replace":
            t.kill(fault.targets[0])
        else:
            raise ValueError(f"unknown fault {fault.kind!r}")

    def _end(self, fault: Fault) -> None:
        t = self.target
        if fault.kind == "kill":
            t.start(fault.targets[0])
        elif fault.kind == "pause":
            t.resume(fault.targets[0])
        elif fault.kind == "partition":
            t.heal(fault.targets[0])
        elif fault.kind == "restart-all":
            t.start_all()
        elif fault.kind == "link":
            t.restore_link(*fault.targets)
        elif fault.kind == "link-kill":
            t.kill(fault.targets[0])
            t.start(fault.targets[0])
            t.restore_link(*fault.targets)
        elif fault.kind == "drain":
            t.undrain(fault.targets[0])
        elif fault.kind == "replace":
            t.start(fault.targets[0])
