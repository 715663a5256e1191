"""The history of a nemesis run: every operation's invocation and completion, every fault.

As in Jepsen, a client writes an ``invoke`` record before it sends an operation and
exactly one completion after: ``ok`` (acknowledged), ``fail`` (certainly not
applied: every attempt was refused before anything was applied, or none was sent)
or ``info`` (ambiguous: a timeout or a connection lost after sending; it may or may
not have been applied). An invoke with no completion is ambiguous too. The nemesis
writes ``fault`` records. Each process appends JSON lines to a file of its own
(flushed per line, so a crash keeps what came before); ``merge`` joins them by time.
Times are CLOCK_MONOTONIC seconds: one clock for every process on the machine,
whatever its network namespace.

A completion carries what each shard of the operation did (``shards``), because a
tensor's shards are separate requests that can each end differently:
``outcome`` (ok/fail/info), the ``version`` the daemon answered with, and for reads
what was read (counters: slots that changed since this client's previous read of
the shard; registers: the value).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

NEMESIS = -1  # the process number of fault records
COMPLETIONS = ("ok", "fail", "info")


@dataclass
class Record:
    """One line of a history."""

    type: str  # invoke | ok | fail | info | fault
    process: int  # the client's number; NEMESIS for faults
    index: int  # the process's operation (or fault) number
    f: str  # acc | read | write | rreg; a fault's kind
    time: float
    tensor: str = ""
    value: int = 0  # acc: the slot; write: the value written
    shards: dict[int, dict[str, Any]] = field(default_factory=dict)
    error: str = ""
    detail: dict[str, Any] = field(default_factory=dict)  # faults: targets, phase

    def to_json(self) -> str:
        out = {k: v for k, v in asdict(self).items() if v or k in ("process", "index", "time")}
        return json.dumps(out, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Record:
        raw = json.loads(line)
        known = {f.name for f in fields(cls)}
        rec = cls(**{k: v for k, v in raw.items() if k in known})
        rec.shards = {int(k): v for k, v in rec.shards.items()}
        return rec


@dataclass
class Op:
    """An operation: its invocation paired with its completion."""

    process: int
    index: int
    f: str
    tensor: str
    value: int
    start: float
    end: float | None  # None: never completed (ambiguous)
    type: str  # ok | fail | info
    shards: dict[int, dict[str, Any]]
    error: str = ""
    unexpected: bool = False  # the client raised something other than an IrdmaError
    where: str = ""  # its traceback
    detail: dict[str, Any] = field(default_factory=dict)  # commit, vread: version, values

    @property
    def name(self) -> str:
        return f"c{self.process}#{self.index}"

    def outcome(self, shard: int) -> str:
        """ok, fail or info for one shard of the operation."""
        if self.type == "ok":
            return "ok"
        got = self.shards.get(shard)
        return got["outcome"] if got else ("fail" if self.type == "fail" else "info")

    def describe(self, origin: float = 0.0) -> str:
        end = "never" if self.end is None else f"{self.end - origin:+.3f}"
        what = f"{self.f} {self.tensor} {self.value}"
        tail = f" ({self.error[:160]})" if self.error else ""
        return f"{self.name} {what}: {self.start - origin:+.3f} .. {end} {self.type}{tail}"


class HistoryWriter:
    """Appends records to one process's file, a line at a time."""

    def __init__(self, path: Path | str) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 (closed by close())

    def write(self, record: Record) -> None:
        self._file.write(record.to_json() + "\n")

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(paths: Iterable[Path]) -> list[Record]:
    """Every record of the given files, ordered by time (a torn last line is skipped)."""
    records = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            try:
                records.append(Record.from_json(line))
            except (json.JSONDecodeError, TypeError):
                continue  # a process killed mid-line
    records.sort(key=lambda r: r.time)
    return records


def merge(paths: Iterable[Path], out: Path) -> list[Record]:
    """Join per-process files into one history file (for post-mortem); return the records."""
    records = load(paths)
    out.write_text("".join(r.to_json() + "\n" for r in records))
    return records


def pair(records: Iterable[Record]) -> list[Op]:
    """The operations of a history, in invocation order."""
    open_ops: dict[tuple[int, int], Record] = {}
    ops: dict[tuple[int, int], Op] = {}
    for r in records:
        key = (r.process, r.index)
        if r.type == "invoke":
            open_ops[key] = r
        elif r.type in COMPLETIONS and key in open_ops:
            inv = open_ops.pop(key)
            ops[key] = Op(
                r.process, r.index, inv.f, inv.tensor, inv.value, inv.time, r.time, r.type,
                r.shards, r.error, bool(r.detail.get("unexpected")), r.detail.get("traceback", ""),
                r.detail,
            )  # fmt: skip
    for key, inv in open_ops.items():
        ops[key] = Op(inv.process, inv.index, inv.f, inv.tensor, inv.value, inv.time, None,
                      "info", {}, "no completion recorded")  # fmt: skip
    return sorted(ops.values(), key=lambda o: o.start)


def faults(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if r.type == "fault"]
