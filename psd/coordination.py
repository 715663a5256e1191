"""The training-mode rules of one tensor on one daemon, without I/O.

A ``Coordinator`` decides, per local shard, when a worker's accumulate is
applied (at once, or held until its whole group has pushed the step) and
whether a worker's read for a step may proceed. It also keeps when each
worker was last heard from, so a worker that fell silent while others wait
for it can be reported lost or evicted. The store applies what it returns;
the server turns "not ready" into waiting. The modes are described in
``irdma.training.modes``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from irdma.protocol import Status
from irdma.training.modes import Mode

from .errors import StoreError

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class _Lockstep(Generic[T]):
    """Per group: steps applied so far, and the contributions held for the next one."""

    applied: list[int]
    pending: list[dict[int, T]]


@dataclass(eq=False)
class Coordinator(Generic[T]):
    """The rules of ``mode`` for the local shards of one tensor called ``name``.

    Contributions (``T``: whatever the store holds a pushed delta in) are
    returned to the caller, in worker order, when they are to be applied.
    """

    name: str
    mode: Mode
    shards: Iterable[int]
    evicted: set[int] = field(default_factory=set)
    last_seen: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._steps: dict[int, _Lockstep[T]] = {}
        self._clocks: dict[int, list[int]] = {}
        for index in self.shards:
            self.add_shard(index)

    def add_shard(self, index: int) -> None:
        """Keep the rules for one more local shard (placed here by a move), from step 0:
        the copy that follows brings its steps and clocks."""
        m = self.mode
        if m.steps_in_lockstep:
            self._steps[index] = _Lockstep([0] * m.groups, [{} for _ in range(m.groups)])
        elif m.kind == "ssp":
            self._clocks[index] = [0] * m.workers

    # -- workers --------------------------------------------------------------

    def _live(self, workers: Iterable[int]) -> list[int]:
        return [w for w in workers if w not in self.evicted]

    def check_worker(self, worker: int, now: float) -> None:
        """Refuse a worker outside the mode's ranks or already evicted; note that it is alive."""
        if not 0 <= worker < self.mode.workers:
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"worker {worker} is outside 0..{self.mode.workers - 1} of {self.name!r} "
                f"({self.mode.describe()})",
            )
        if worker in self.evicted:
            raise StoreError(
                Status.EVICTED,
                f"worker {worker} was evicted from {self.name!r} after "
                f"{self.mode.worker_timeout:g} s of silence while others waited for it",
            )
        self.last_seen[worker] = now

    # -- pushes ---------------------------------------------------------------

    def push(self, shard: int, worker: int, step: int, item: T, now: float) -> list[T] | None:
        """Worker ``worker``'s delta for ``step``; return the deltas to apply now, or None."""
        self.check_worker(worker, now)
        m = self.mode
        if m.kind == "ssp":
            clocks = self._clocks[shard]
            clocks[worker] = max(clocks[worker], step + 1)
            return [item]
        if not m.steps_in_lockstep:
            return [item]
        state = self._steps[shard]
        group = m.group_of(worker)
        at = state.applied[group]
        if step != at:
            when = "was already applied" if step < at else "is ahead"
            raise StoreError(
                Status.BAD_STEP,
                f"worker {worker} pushed step {step} of {self.name!r} shard {shard}, which "
                f"{when}: its group is at step {at} (read step {at} before pushing it)",
            )
        pending = state.pending[group]
        if worker in pending:
            raise StoreError(
                Status.BAD_STEP,
                f"worker {worker} already pushed step {step} of {self.name!r} shard {shard}",
            )
        pending[worker] = item
        return self._complete(state, group)

    def _complete(self, state: _Lockstep[T], group: int) -> list[T] | None:
        pending = state.pending[group]
        live = self._live(self.mode.members(group))
        if not pending or any(w not in pending for w in live):
            return None
        items = [pending[w] for w in sorted(pending)]
        state.pending[group] = {}
        state.applied[group] += 1
        return items

    # -- reads ----------------------------------------------------------------

    def blockers(self, shard: int, worker: int, clock: int) -> list[int]:
        """The live workers a read by ``worker`` for step ``clock`` waits for ([] = go).

        Raises StoreError when the read could never proceed (it waits
        for a step this worker has not pushed, or for one beyond the next).
        """
        m = self.mode
        if m.kind == "ssp":
            clocks = self._clocks[shard]
            need = clock - m.slack
            if clocks[worker] < need:
                raise StoreError(
                    Status.BAD_STEP,
                    f"worker {worker} reads step {clock} of {self.name!r} but has pushed only "
                    f"{clocks[worker]} steps (slack {m.slack})",
                )
            return [w for w in self._live(range(m.workers)) if clocks[w] < need]
        if not m.steps_in_lockstep:
            return []
        state = self._steps[shard]
        group = m.group_of(worker)
        at = state.applied[group]
        if clock <= at:
            return []
        pending = state.pending[group]
        if clock > at + 1 or worker not in pending:
            raise StoreError(
                Status.BAD_STEP,
                f"worker {worker} reads step {clock} of {self.name!r} shard {shard}, but its "
                f"group is at step {at} and it has "
                + ("pushed step " if worker in pending else "not pushed step ")
                + f"{at}",
            )
        return [w for w in self._live(m.members(group)) if w not in pending]

    def lost(self, blockers: list[int], now: float) -> list[int]:
        """The blockers silent for the mode's worker_timeout (a never-seen one starts now)."""
        out = []
        for w in blockers:
            seen = self.last_seen.setdefault(w, now)
            if now - seen >= self.mode.worker_timeout:
                out.append(w)
        return out

    def evict(self, workers: Iterable[int]) -> dict[int, list[tuple[int, list[T]]]]:
        """Evict ``workers``; return, per shard, the (group, held deltas) steps that apply now."""
        self.evicted.update(workers)
        done: dict[int, list[tuple[int, list[T]]]] = {}
        for shard, state in self._steps.items():
            for group in range(self.mode.groups):
                items = self._complete(state, group)
                if items:
                    done.setdefault(shard, []).append((group, items))
        return done

    # -- a backup following its primary ------------------------------------------

    def hold(self, shard: int, worker: int, step: int, item: T) -> T | None:
        """A backup holds ``item``, a push its primary holds for ``step``, without
        completing the step (the primary's sum of it arrives as an update of its
        own); return the item it replaces (to release), if any.

        Raises StoreError (BEHIND) when this copy is not at that step: it missed
        updates, and the primary sends the whole shard instead.
        """
        state = self._steps.get(shard)
        if state is None or not 0 <= worker < self.mode.workers:
            raise StoreError(
                Status.BAD_ARGUMENT,
                f"a held push of worker {worker} for {self.name!r} shard {shard} "
                f"({self.mode.describe()})",
            )
        group = self.mode.group_of(worker)
        at = state.applied[group]
        if step != at:
            raise StoreError(
                Status.BEHIND,
                f"{self.name!r} shard {shard}: a held push for step {step}, this copy's "
                f"group is at step {at}",
            )
        old = state.pending[group].get(worker)
        state.pending[group][worker] = item
        return old

    def held_from(self, shard: int, worker: int) -> T | None:
        """The push ``worker`` made for its group's current step, held (None if none)."""
        state = self._steps.get(shard)
        if state is None or not 0 <= worker < self.mode.workers:
            return None
        return state.pending[self.mode.group_of(worker)].get(worker)

    def held_on(self, shard: int) -> list[tuple[int, int, T]]:
        """(worker, step, push) for every push held on ``shard``, in worker order."""
        state = self._steps.get(shard)
        if state is None:
            return []
        out = []
        for group, pending in enumerate(state.pending):
            out += [(w, state.applied[group], pending[w]) for w in pending]
        return sorted(out, key=lambda held: held[0])

    def release_held(self, shard: int) -> list[T]:
        """Forget the pushes held on ``shard`` (a whole-shard copy brings its primary's)."""
        state = self._steps.get(shard)
        if state is None:
            return []
        out = [item for pending in state.pending for item in pending.values()]
        state.pending = [{} for _ in state.pending]
        return out

    def clocks(self, shard: int) -> list[int]:
        """Steps pushed per worker on ``shard`` (ssp; empty otherwise)."""
        return list(self._clocks.get(shard, []))

    def follow_clocks(self, shard: int, clocks: dict[int, int]) -> None:
        """A backup learns workers' ssp clocks (worker -> steps pushed) from its primary."""
        mine = self._clocks.get(shard)
        if mine is None:
            return
        for worker, clock in clocks.items():
            if 0 <= worker < len(mine):
                mine[worker] = max(mine[worker], clock)

    # -- bookkeeping ------------------------------------------------------------

    def follow(self, shard: int, group: int, applied: int) -> list[T]:
        """A backup learns its primary applied ``applied`` steps of ``group`` on ``shard``.

        Held contributions of the steps now applied are returned (to release):
        the primary's sum of them arrived as an update of its own.
        """
        state = self._steps.get(shard)
        if state is None or not 0 <= group < self.mode.groups or applied <= state.applied[group]:
            return []
        state.applied[group] = applied
        released = list(state.pending[group].values())
        state.pending[group] = {}
        return released

    def applied_steps(self, shard: int) -> list[int]:
        """Steps applied per group on ``shard`` (empty outside lockstep modes)."""
        state = self._steps.get(shard)
        return list(state.applied) if state else []

    def step(self, shard: int, worker: int = 0) -> int:
        """Steps applied to ``shard`` for the group of ``worker`` (lockstep modes)."""
        state = self._steps.get(shard)
        return state.applied[self.mode.group_of(worker)] if state else 0

    def held(self) -> list[T]:
        """Every delta still held (to release when the tensor goes away)."""
        return [item for s in self._steps.values() for p in s.pending for item in p.values()]
