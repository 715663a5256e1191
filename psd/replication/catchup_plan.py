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
  without the shard, a local copy is dropped only if the primary says the
  tensor was deleted (its tombstones); otherwise the primary lost it (it
  restarted empty while this copy was away) and is given this one, the highest
  version among the replicas that answered (taken from the one that has it
  first, where that is not this daemon).
- A shard nobody serves (the whole cluster is starting): the highest version
  among all its replicas wins, once every replica has answered.
- A shard is copied only where the chosen copy is another daemon's and
  differs from the local one (version or checksum).
- Nothing is decided until every daemon heard from (here, or by any peer
  that answered) has answered: a shard only a silent daemon shares with
  this one is in no report. Nor until a majority of the cluster (this
  daemon among it) has answered: a daemon that restarted empty and heard
  nobody for a moment would otherwise find nothing to copy and serve its
  shards empty as their primary.
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
    deleted: frozenset[int] = frozenset()  # keys of tensors deleted there


@dataclass(frozen=True, slots=True)
class Plan:
    """Shards to copy, by the peer to copy them from; local shards to drop (their
    tensors deleted); local shards to give their acting primary, which lacks them."""

    fetch: dict[str, list[ShardId]] = field(default_factory=dict)
    drop: list[ShardId] = field(default_factory=list)
    give: dict[str, list[ShardId]] = field(default_factory=dict)

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
    quorum: int = 1,
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
    them as primary, empty). ``quorum``: how many daemons, this one included,
    must have answered (a majority of the cluster).
    """
    expected = set(heard)
    for report in reports.values():
        expected |= report.up
    silent = tuple(sorted(expected - set(reports) - {me}))
    if silent:
        return Undecided(
            f"{', '.join(silent)} may hold shards placed here and did not answer", silent
        )
    if 1 + len(reports) < quorum:
        return Undecided(
            f"only {1 + len(reports)} of the {quorum} daemons a decision needs answered "
            f"({', '.join(sorted(reports)) or 'no peer'})"
        )
    wanted = set(mine)
    for report in reports.values():
        wanted |= set(report.held)
    fetch: dict[str, list[ShardId]] = {}
    drop: list[ShardId] = []
    give: dict[str, list[ShardId]] = {}
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
                if key in reports[src].deleted:
                    if (key, index) in mine:
                        drop.append((key, index))
                elif (key, index) in mine:
                    best = _best(me, mine, reports, others, key, index)
                    if best == me:
                        give.setdefault(src, []).append((key, index))
                    else:  # another replica's copy is newer: take it first, give it next
                        fetch.setdefault(best, []).append((key, index))
                continue
        else:
            missing = tuple(n for n in others if n not in reports)
            if missing:
                return Undecided(
                    f"shard {index} of tensor {key:#x} waits for replica(s) "
                    f"{', '.join(missing)} to decide which copy is current",
                    missing,
                )
            src = _best(me, mine, reports, others, key, index)
            theirs = mine[key, index] if src == me else reports[src].held[key, index]
        if src != me and mine.get((key, index)) != theirs:
            fetch.setdefault(src, []).append((key, index))
    return Plan(fetch, drop, give)


def _best(
    me: str,
    mine: Mapping[ShardId, Holding],
    reports: Mapping[str, Report],
    others: Sequence[str],
    key: int,
    index: int,
) -> str:
    """The daemon holding the highest version of a shard among this one and the replicas
    in ``others`` that answered (this one on a tie; at least one holds it)."""
    candidates = [(me, mine.get((key, index)))] + [
        (n, reports[n].held.get((key, index))) for n in others if n in reports
    ]
    have = [(n, h) for n, h in candidates if h is not None]
    return max(have, key=lambda c: c[1][0])[0]
