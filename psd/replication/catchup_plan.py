"""The catch-up decision, a pure function: which shards to copy from whom, which to drop.

Given what this daemon holds, what each peer that answered reports (ready or
not, and the shards it holds), where each shard is placed and which replica
acts as its primary now, ``plan`` says which peer to copy each shard from and
which local shards the cluster no longer has. Nothing here does I/O or keeps
state: ``catchup.CatchUp`` asks the peers and takes the copies.

The rules:

- A shard some replica is serving (a ready peer holds it): its acting
  primary's copy is current by construction (every acknowledged update is on
  it, and it forwards what follows here), so that copy and no other is taken;
  a backup's may lag forwards the primary already sent here and would
  overwrite them. If the acting primary is not among the ready peers that
  answered (views differ for a moment), nothing is decided yet. If it answered
  without the shard, the shard was deleted: a local copy is dropped.
- A shard nobody serves (the whole cluster is starting): the highest version
  among all its replicas wins, once every replica has answered.
- A shard is copied only where the chosen copy is another daemon's and
  differs from the local one (version or checksum).
- Nothing is decided until every daemon heard from (here, or by any peer
  that answered) has answered: a shard only a silent daemon shares with
  this one is in no report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .bodies import ShardId

# A shard copy as a daemon holds it: (version, CRC-32 of its bytes).
Holding = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Report:
    """One peer's answer to a catch-up question (``up``: the daemons it hears now)."""

    ready: bool
    held: Mapping[ShardId, Holding]
    up: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Plan:
    """Shards to copy, by the peer to copy them from; local shards to drop."""

    fetch: dict[str, list[ShardId]] = field(default_factory=dict)
    drop: list[ShardId] = field(default_factory=list)

    @property
    def copies(self) -> int:
        return sum(len(shards) for shards in self.fetch.values())


@dataclass(frozen=True, slots=True)
class Undecided:
    """No plan now (try again after a pause): why, and the replicas it waits for
    (worth saying in the log; empty where views differ only for a moment)."""

    why: str
    waiting_for: tuple[str, ...] = ()


def plan(
    me: str,
    mine: Mapping[ShardId, Holding],
    reports: Mapping[str, Report],
    replicas: Callable[[int, int], Sequence[str]],
    acting_primary: Callable[[int, int], str | None],
    only: Callable[[int, int], bool] | None = None,
    heard: Iterable[str] = (),
) -> Plan | Undecided:
    """Decide a catch-up.

    ``mine``: the local shards; ``reports``: the peers that answered, by name;
    ``replicas(key, index)``: the shard's replicas in placement order (``me``
    among them or not); ``acting_primary(key, index)``: the replica serving it
    as this daemon sees it (None: none); ``only``: consider just the shards it
    accepts (a move's gains).

    ``heard``: the peers this daemon hears now. Every one of them, and every
    daemon an answering peer hears, must have answered: shards placed here
    that only a silent one holds appear in no report, and a daemon that just
    restarted empty would call itself current without them (and then serve
    them as primary, empty).
    """
    expected = set(heard)
    for report in reports.values():
        expected |= report.up
    silent = tuple(sorted(expected - set(reports) - {me}))
    if silent:
        return Undecided(
            f"{', '.join(silent)} may hold shards placed here and did not answer", silent
        )
    wanted = set(mine)
    for report in reports.values():
        wanted |= set(report.held)
    fetch: dict[str, list[ShardId]] = {}
    drop: list[ShardId] = []
    for key, index in sorted(wanted):
        if only is not None and not only(key, index):
            continue
        others = [n for n in replicas(key, index) if n != me]
        ready = [n for n in others if n in reports and reports[n].ready]
        theirs: Holding | None
        if ready:
            primary = acting_primary(key, index)
            if primary is None or primary not in ready:
                return Undecided(
                    f"shard {index} of tensor {key:#x}: its acting primary "
                    f"({primary or 'none'}) is not among the ready replicas that answered"
                )
            src = primary
            theirs = reports[src].held.get((key, index))
            if theirs is None:
                if (key, index) in mine:
                    drop.append((key, index))
                continue
        else:
            missing = tuple(n for n in others if n not in reports)
            if missing:
                return Undecided(
                    f"shard {index} of tensor {key:#x} waits for replica(s) "
                    f"{', '.join(missing)} to decide which copy is current",
                    missing,
                )
            candidates = [(me, mine.get((key, index)))] + [
                (n, reports[n].held.get((key, index))) for n in others
            ]
            have = [(n, h) for n, h in candidates if h is not None]
            src, theirs = max(have, key=lambda c: c[1][0])
        if src != me and mine.get((key, index)) != theirs:
            fetch.setdefault(src, []).append((key, index))
    return Plan(fetch, drop)
