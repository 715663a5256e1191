"""What must hold of a nemesis run: its history and the final copies of every shard.

Each operation names itself in the data (``workload``): an accumulate owns one slot
of a counter, a write fills a register with a value of its own. So the checker
proves, per operation and not only per sum:

- **final counters** (every replica's copy): every acknowledged accumulate applied
  exactly once, every definitely failed one not at all, every ambiguous one once or
  not at all; no slot that no operation owns. With distinct slots this is the sum
  of the acknowledged updates plus a subset of the ambiguous ones, none lost, none
  doubled.
- **replicas byte-identical** after healing: the same version and sha256 on every
  replica of every shard, at or above every version acknowledged for the shard.
- **final registers**: each shard holds one write's value; no write acknowledged
  after that write had completed (it would be lost).
- **reads** (each client's, replayed in its order): no slot applied twice, none of
  a failed operation, none invoked after the read ended, nothing torn, a whole
  register from one write (whole-tensor writes are atomic for readers); read-your-
  writes (a read after the client's own acknowledged update sees that update, by
  content and by version); an update a client once read never disappears from
  its later reads, and its read versions never go back past a version, once that
  update or version was acknowledged before the later read began.
- **versions**: a client's acknowledged updates of a shard get increasing versions,
  and no version of a shard is acknowledged for two different operations (two
  primaries handing out the same version).
- **model versions** (commits and reads of the latest version): a read holds one
  commit whole (every tensor the same operation's value), a commit that was
  invoked before the read ended, under the number that commit got; no number is
  given to two commits; and the latest number never goes down: a read returns at
  least the number of every commit acknowledged, and of every read completed,
  before it began.
- **recovery**: the cluster became ready again after every fault.

What is not promised (docs/semantics.md) is counted as an *observation*, not a
violation: a read that saw an update before it was acknowledged (a primary applies
an update before its backups have it), and a later read without it: the update
was rolled back, or it was acknowledged only after the later read began.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .history import NEMESIS, Op, Record, faults, pair
from .workload import COUNTERS, REGISTERS, shard_of

SHOWN_PER_KIND = 12  # violations of one kind spelled out in a summary


@dataclass
class Violation:
    kind: str
    message: str


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    ops: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    faults: Counter = field(default_factory=Counter)
    observations: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, kind: str, message: str) -> None:
        self.violations.append(Violation(kind, message))

    def summary(self) -> str:
        lines = []
        for f in ("acc", "read", "write", "rreg", "commit", "vread"):
            c = self.ops.get(f, Counter())
            lines.append(f"  {f:6} ok={c['ok']} fail={c['fail']} info={c['info']}")
        lines.append("faults: " + (", ".join(f"{k}={n}" for k, n in sorted(self.faults.items()))))
        by_kind = Counter(v.kind for v in self.violations)
        lines.append(f"violations: {len(self.violations)}")
        for kind, n in sorted(by_kind.items()):
            lines.append(f"  {kind}: {n}")
            shown = [v for v in self.violations if v.kind == kind][:SHOWN_PER_KIND]
            lines += [f"    {v.message}" for v in shown]
        if self.observations:
            lines.append("observations (not promised): ")
            lines += [f"  {k}: {n}" for k, n in sorted(self.observations.items())]
        return "ops:\n" + "\n".join(lines)


class _Context:
    """Indexes of a history, and how to describe an operation next to the faults."""

    def __init__(self, records: list[Record]) -> None:
        self.origin = records[0].time if records else 0.0
        self.ops = pair(r for r in records if r.process != NEMESIS)
        self.faults = [r for r in faults(records) if r.detail.get("phase") == "start"]
        self.fault_times = [r.time for r in self.faults]
        self.slots: dict[tuple[str, int], Op] = {}
        self.writes: dict[tuple[str, int], Op] = {}
        for op in self.ops:
            if op.f == "acc":
                self.slots[(op.tensor, op.value)] = op
            elif op.f == "write":
                self.writes[(op.tensor, op.value)] = op

    def describe(self, op: Op) -> str:
        """The operation, and the last fault that started before it."""
        text = op.describe(self.origin)
        i = bisect.bisect_right(self.fault_times, op.start) - 1
        if i >= 0:
            f = self.faults[i]
            targets = ",".join(f.detail.get("targets", []))
            text += f" [after fault #{f.index} {f.f} {targets} at {f.time - self.origin:+.3f}]"
        return text


def check(records: list[Record], copies: dict[str, Any] | None) -> Report:
    """Judge a history and the final copies (``workers copies``; None: not read)."""
    ctx = _Context(records)
    report = Report()
    for op in ctx.ops:
        report.ops[op.f][op.type] += 1
        if op.unexpected:
            report.add("client-error", ctx.describe(op) + (f"\n{op.where}" if op.where else ""))
    for r in faults(records):
        if r.detail.get("phase") == "start":
            report.faults[r.f] += 1
        if r.detail.get("phase") == "stuck":
            report.add("no-recovery", f"fault #{r.index} {r.f}: {r.detail.get('last')}")
    acked = _acked_versions(ctx, report)
    _check_reads(ctx, report, acked)
    _check_model_versions(ctx, report)
    if copies is None:
        report.add("final-unreadable", "the final copies could not be read")
    else:
        _check_final(ctx, report, copies, acked)
    return report


def _check_model_versions(ctx: _Context, report: Report) -> None:
    """The model's commits and reads (see the module doc)."""
    commits = {op.value: op for op in ctx.ops if op.f == "commit"}
    number_of: dict[int, tuple[int, Op]] = {}  # version -> (value, the op that showed it)

    def numbered(version: int, value: int, op: Op) -> None:
        held = number_of.setdefault(version, (value, op))
        if held[0] != value:
            report.add(
                "version-twice",
                f"version {version} holds {held[0]:#x} ({ctx.describe(held[1])}) "
                f"and {value:#x} ({ctx.describe(op)})",
            )

    for op in ctx.ops:
        if op.f == "commit" and op.type == "ok":
            numbered(int(op.detail["version"]), op.value, op)
    # Operations that fix a floor for reads that begin after they end.
    floors = sorted(
        (
            (op.end, int(op.detail["version"]), op)
            for op in ctx.ops
            if op.f in ("commit", "vread") and op.type == "ok" and op.end is not None
        ),
        key=lambda t: t[0],
    )
    # In order of their start, as ``pair`` gives operations.
    reads = [op for op in ctx.ops if op.f == "vread" and op.type == "ok"]
    i, floor, floor_op = 0, 0, None
    for op in reads:
        while i < len(floors) and floors[i][0] < op.start:
            if floors[i][1] > floor:
                floor, floor_op = floors[i][1], floors[i][2]
            i += 1
        version, values = int(op.detail["version"]), op.detail.get("values", [])
        if len(values) != 1:
            report.add("version-mixed", f"{ctx.describe(op)}: version {version} holds {values}")
            continue
        writer = commits.get(values[0])
        if writer is None:
            report.add("version-unknown", f"{ctx.describe(op)}: {values[0]:#x} from no commit")
        elif writer.start > (op.end or math.inf):
            report.add("version-future", f"{ctx.describe(op)} read {ctx.describe(writer)}")
        else:
            numbered(version, values[0], op)
        if version < floor:
            assert floor_op is not None
            report.add(
                "version-went-back",
                f"{ctx.describe(op)} read version {version} after {ctx.describe(floor_op)} "
                f"had ended with version {floor}",
            )


def _updates(op: Op) -> Iterable[tuple[int, dict[str, Any]]]:
    """(shard, result) of each shard an update applied and acknowledged."""
    if op.f in ("acc", "write"):
        for shard, rec in op.shards.items():
            if rec.get("outcome") == "ok":
                yield shard, rec


Acked = dict[tuple[str, int], list[tuple[int, float]]]


def _acked_versions(ctx: _Context, report: Report) -> Acked:
    """Acknowledged (version, time of the acknowledgement) per (tensor, shard), sorted by
    version; checks versions are never reused."""
    owner: dict[tuple[str, int, int], Op] = {}
    last: dict[tuple[int, str, int], tuple[int, Op]] = {}
    out: Acked = defaultdict(list)
    for op in ctx.ops:
        for shard, rec in _updates(op):
            version = rec["version"]
            if rec.get("applied", 1) > 1:
                report.add("sent-twice", f"shard {shard} applied {rec['applied']} times: "
                           f"{ctx.describe(op)}")  # fmt: skip
            key = (op.tensor, shard, version)
            other = owner.setdefault(key, op)
            if other is not op:
                report.add(
                    "version-reused",
                    f"{op.tensor} shard {shard} version {version} acknowledged twice: "
                    f"{ctx.describe(other)} AND {ctx.describe(op)}",
                )
            prev = last.get((op.process, op.tensor, shard))
            if prev is not None and version <= prev[0]:
                report.add(
                    "non-monotonic-update",
                    f"{op.tensor} shard {shard}: version {version} after the client's "
                    f"{prev[0]}: {ctx.describe(op)} after {ctx.describe(prev[1])}",
                )
            last[(op.process, op.tensor, shard)] = (version, op)
            out[(op.tensor, shard)].append((version, op.end))
    for versions in out.values():
        versions.sort()
    return out


def _acked_between(acked: Acked, key: tuple[str, int], low: int, high: int,
                   before: float) -> bool:  # fmt: skip
    """Whether a version in (low, high] of the shard was acknowledged before ``before``.

    An acknowledgement that came later is concurrent with a read that began earlier:
    the read may be ordered before it, so going back past that version then is the
    unpromised case of reading an update before it is acknowledged."""
    versions = acked.get(key, [])
    i = bisect.bisect_right(versions, (low, math.inf))
    return any(end < before for v, end in versions[i:] if v <= high)


@dataclass
class _ClientView:
    """What one client has seen, replayed in its order."""

    state: dict[tuple[str, int], dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    pending: dict[tuple[str, int], list[Op]] = field(default_factory=lambda: defaultdict(list))
    acked_version: dict[tuple[str, int], int] = field(default_factory=dict)
    read_version: dict[tuple[str, int], tuple[int, Op]] = field(default_factory=dict)
    last_write: dict[tuple[str, int], Op] = field(default_factory=dict)


def _check_reads(ctx: _Context, report: Report, acked: Acked) -> None:
    by_process: dict[int, list[Op]] = defaultdict(list)
    for op in ctx.ops:
        by_process[op.process].append(op)
    for ops in by_process.values():
        view = _ClientView()
        for op in sorted(ops, key=lambda o: o.index):
            for shard, rec in _updates(op):
                key = (op.tensor, shard)
                view.acked_version[key] = max(view.acked_version.get(key, 0), rec["version"])
                if op.f == "write":
                    view.last_write[key] = op
            if op.f == "acc" and op.outcome(shard_of(op.value)) == "ok":
                view.pending[(op.tensor, shard_of(op.value))].append(op)
            if op.f == "rreg" and op.type == "ok":
                _check_whole_write(ctx, report, op)
            if op.f in ("read", "rreg"):
                for shard, rec in op.shards.items():
                    if rec.get("outcome") == "ok":
                        _check_read(ctx, report, acked, view, op, shard, rec)


def _check_read(
    ctx: _Context,
    report: Report,
    acked: Acked,
    view: _ClientView,
    op: Op,
    shard: int,
    rec: dict[str, Any],
) -> None:
    key = (op.tensor, shard)
    version = rec["version"]
    own = view.acked_version.get(key, 0)
    if version < own:
        report.add(
            "read-your-writes",
            f"{op.tensor} shard {shard} read at version {version} after the client's update "
            f"was acknowledged at {own}: {ctx.describe(op)}",
        )
    before = view.read_version.get(key)
    if before is not None and version < before[0]:
        if _acked_between(acked, key, version, before[0], op.start):
            report.add(
                "non-monotonic-read",
                f"{op.tensor} shard {shard} read at version {version} after the client read "
                f"{before[0]}, and a version between was acknowledged: {ctx.describe(op)} "
                f"after {ctx.describe(before[1])}",
            )
        else:
            report.observations["version went back after reading an unacknowledged update"] += 1
    view.read_version[key] = (version, op)
    if op.f == "read":
        _check_counter_read(ctx, report, view, op, shard, rec)
    else:
        _check_register_read(ctx, report, view, op, shard, rec)


def _check_counter_read(
    ctx: _Context, report: Report, view: _ClientView, op: Op, shard: int, rec: dict[str, Any]
) -> None:
    key = (op.tensor, shard)
    state = view.state[key]
    for element in rec.get("bad", []):
        report.add("corrupt-read", f"element {element} is no sum of slots: {ctx.describe(op)}")
    for slot, count in rec.get("add", []):
        state[slot] = count
        owner = ctx.slots.get((op.tensor, slot))
        if owner is None:
            report.add("phantom-read", f"slot {slot} that no operation owns: {ctx.describe(op)}")
        elif count > 1:
            report.add("doubled-read", f"{ctx.describe(owner)} seen {count} times by "
                       f"{ctx.describe(op)}")  # fmt: skip
        elif owner.outcome(shard) == "fail":
            report.add("failed-read", f"{ctx.describe(owner)} failed but was seen by "
                       f"{ctx.describe(op)}")  # fmt: skip
        elif op.end is not None and owner.start > op.end:
            report.add("future-read", f"{ctx.describe(owner)} seen by the earlier "
                       f"{ctx.describe(op)}")  # fmt: skip
    for slot in rec.get("del", []):
        state.pop(slot, None)
        owner = ctx.slots.get((op.tensor, slot))
        # Missing is a loss only if acknowledged before this read began.
        if owner is not None and _ends(owner, shard) < op.start:
            report.add("lost-read", f"acknowledged {ctx.describe(owner)} was read before, "
                       f"then missing from {ctx.describe(op)}")  # fmt: skip
        else:
            report.observations["read an update before its acknowledgement, then missed it"] += 1
    for mine in view.pending.pop(key, []):
        if mine.value not in state:
            report.add("read-your-writes", f"own acknowledged {ctx.describe(mine)} missing "
                       f"from {ctx.describe(op)}")  # fmt: skip


def _check_whole_write(ctx: _Context, report: Report, op: Op) -> None:
    """A whole-tensor write is atomic for readers: a successful read of a register
    holds one write in every shard (docs/semantics.md), never a mix."""
    values = {rec.get("value") for rec in op.shards.values()}
    if len(values) > 1:
        report.add("mixed-read", f"shards from writes {sorted(map(str, values))}: "
                   f"{ctx.describe(op)}")  # fmt: skip


def _check_register_read(
    ctx: _Context, report: Report, view: _ClientView, op: Op, shard: int, rec: dict[str, Any]
) -> None:
    if "values" in rec:
        report.add("torn-read", f"shard {shard} holds {rec['values']}: {ctx.describe(op)}")
        return
    value = rec["value"]
    writer = ctx.writes.get((op.tensor, value))
    if value and writer is None:
        report.add("phantom-read", f"value {value:#x} nobody wrote: {ctx.describe(op)}")
        return
    if writer is not None and writer.outcome(shard) == "fail":
        report.add("failed-read", f"{ctx.describe(writer)} failed but {ctx.describe(op)} saw it")
    if writer is not None and op.end is not None and writer.start > op.end:
        report.add("future-read", f"{ctx.describe(writer)} seen by the earlier {ctx.describe(op)}")
    mine = view.last_write.get((op.tensor, shard))
    if mine is not None and writer is not mine and _precedes(writer, mine, shard):
        report.add(
            "read-your-writes",
            f"shard {shard} holds {_writer_name(writer)} although the client's own "
            f"{ctx.describe(mine)} came after it: {ctx.describe(op)}",
        )


def _ends(op: Op | None, shard: int) -> float:
    """When a write's effect on a shard surely happened (-inf: the initial zeros;
    inf: ambiguous, it may land any time)."""
    if op is None:
        return -math.inf
    if op.outcome(shard) != "ok" or op.end is None:
        return math.inf
    return op.end


def _precedes(a: Op | None, b: Op, shard: int) -> bool:
    """Whether write ``a`` surely took effect before write ``b`` was invoked."""
    return _ends(a, shard) < b.start


def _writer_name(op: Op | None) -> str:
    return "the initial zeros" if op is None else op.name


def _check_final(
    ctx: _Context,
    report: Report,
    copies: dict[str, Any],
    acked: Acked,
) -> None:
    ok_slots: dict[tuple[str, int], list[Op]] = defaultdict(list)
    for op in ctx.ops:
        if op.f == "acc" and op.outcome(shard_of(op.value)) == "ok":
            ok_slots[(op.tensor, shard_of(op.value))].append(op)
    for tensor, shards in copies.items():
        for shard_text, per_node in shards.items():
            shard = int(shard_text)
            _check_replicas(ctx, report, tensor, shard, per_node, acked)
            for node, copy in per_node.items():
                if "error" in copy:
                    continue
                where = f"{tensor} shard {shard} on {node} (v{copy['version']})"
                if tensor in COUNTERS:
                    _check_final_counter(ctx, report, tensor, shard, copy, where, ok_slots)
                elif tensor in REGISTERS:
                    _check_final_register(ctx, report, tensor, shard, copy, where)


def _check_replicas(
    ctx: _Context,
    report: Report,
    tensor: str,
    shard: int,
    per_node: dict[str, Any],
    acked: Acked,
) -> None:
    broken = {n: c["error"] for n, c in per_node.items() if "error" in c}
    if broken:
        report.add("final-unreadable", f"{tensor} shard {shard}: {broken}")
    good = {n: c for n, c in per_node.items() if "error" not in c}
    if len({(c["version"], c["sha256"]) for c in good.values()}) > 1:
        text = ", ".join(f"{n} v{c['version']} {c['sha256'][:12]}" for n, c in good.items())
        if tensor in COUNTERS:
            sets = {n: {s for s, _ in c["slots"]} for n, c in good.items()}
            union = set().union(*sets.values())
            for n, s in sets.items():
                missing = sorted(union - s)
                if missing:
                    names = [
                        ctx.slots[(tensor, m)].name for m in missing if (tensor, m) in ctx.slots
                    ]
                    text += f"; {n} lacks {len(missing)} slot(s) {names[:6]}"
        report.add("replicas-differ", f"{tensor} shard {shard}: {text}")
    top = max((v for v, _ in acked.get((tensor, shard), [])), default=0)
    for n, c in good.items():
        if c["version"] < top:
            report.add("version-regressed", f"{tensor} shard {shard} on {n} is at version "
                       f"{c['version']}, below the acknowledged {top}")  # fmt: skip


def _check_final_counter(
    ctx: _Context,
    report: Report,
    tensor: str,
    shard: int,
    copy: dict[str, Any],
    where: str,
    ok_slots: dict[tuple[str, int], list[Op]],
) -> None:
    held = dict((int(s), int(n)) for s, n in copy["slots"])
    for element in copy.get("bad", []):
        report.add("corrupt", f"{where}: element {element} is no sum of slots")
    for slot, count in held.items():
        owner = ctx.slots.get((tensor, slot))
        if owner is None or shard_of(slot) != shard:
            report.add("phantom", f"{where}: slot {slot} that no operation owns")
        elif count > 1:
            report.add("doubled", f"{where}: applied {count} times: {ctx.describe(owner)}")
        elif owner.outcome(shard) == "fail":
            report.add("failed-applied", f"{where}: definitely failed but applied: "
                       f"{ctx.describe(owner)}")  # fmt: skip
    for op in ok_slots.get((tensor, shard), []):
        if op.value not in held:
            report.add("lost", f"{where}: acknowledged but missing: {ctx.describe(op)}")


def _check_final_register(
    ctx: _Context, report: Report, tensor: str, shard: int, copy: dict[str, Any], where: str
) -> None:
    values = copy["values"]
    if len(values) != 1:
        report.add("torn", f"{where}: holds {values}")
        return
    value = values[0]
    writer = ctx.writes.get((tensor, value))
    if value and writer is None:
        report.add("phantom", f"{where}: value {value:#x} nobody wrote")
        return
    if writer is not None and writer.outcome(shard) == "fail":
        report.add("failed-applied", f"{where}: definitely failed but holds {ctx.describe(writer)}")
    end = _ends(writer, shard)
    later = [
        op
        for (t, _), op in ctx.writes.items()
        if t == tensor and op.outcome(shard) == "ok" and op.start > end
    ]
    if later:
        last = max(later, key=lambda o: o.start)
        report.add(
            "lost-write",
            f"{where}: holds {_writer_name(writer)}, but {len(later)} write(s) acknowledged "
            f"after it had completed, the last {ctx.describe(last)}",
        )
