"""The tensors a nemesis run works on, and how an accumulate names its operation.

**Counters** (``nemesis/acc<k>``, int64) take accumulates. Every accumulate has a
*slot* of its own: a delta that is zero everywhere except one element, which it
increases by ``8 ** digit``. Each element holds 21 slots, one per octal digit
(bit 63 stays clear), so a counter's bytes say, for every operation, how many times
it was applied: 0, 1, or more (a double shows as digit 2). A lost or doubled update
is named exactly, not inferred from a sum.

**A model** (``nemesis/model``, four int64 tensors) takes commits of versions
(``irdma.client.versions``): every tensor of a commit is filled with one value,
unique to the operation, so a read of a version shows which commit it holds, and
whether it holds one commit whole.

**Registers** (``nemesis/reg<k>``, int64) take whole-tensor writes: every element of
the write is the same value, unique to the operation, so each shard read shows which
write it holds (or that it is torn). Each register has one writer (client ``k``,
modulo the clients), or with ``shared`` every client writes the first of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIGITS = 21  # octal digits per int64 element that never reach the sign bit
SHARD_SIZE = 16 << 10  # bytes: counters have 4 shards, registers 2
ACC_ELEMENTS = 8192
REG_ELEMENTS = 4096
COUNTERS = [f"nemesis/acc{k}" for k in range(3)]
MODEL = "nemesis/model"
MODEL_TENSORS = [f"layer{k}" for k in range(4)]
MODEL_ELEMENTS = 1024
MODEL_KEEP = 8
REGISTERS = [f"nemesis/reg{k}" for k in range(4)]
ELEMENTS_PER_SHARD = SHARD_SIZE // 8


@dataclass(frozen=True)
class SlotPlan:
    """Which slots of each counter belong to which client (disjoint ranges)."""

    clients: int

    @property
    def per_client(self) -> int:
        return ACC_ELEMENTS * DIGITS // self.clients

    def slot(self, client: int, nth: int) -> int | None:
        """The slot of ``client``'s ``nth`` accumulate on one counter (None: all used)."""
        if nth >= self.per_client:
            return None
        return client * self.per_client + nth


def element_of(slot: int) -> int:
    return slot // DIGITS


def shard_of(slot: int) -> int:
    """The counter shard that holds the slot."""
    return element_of(slot) // ELEMENTS_PER_SHARD


def delta_for(slot: int) -> np.ndarray:
    """The accumulate's delta: 8 ** digit at the slot's element, zero elsewhere."""
    delta = np.zeros(ACC_ELEMENTS, dtype=np.int64)
    delta[element_of(slot)] = 1 << (3 * (slot % DIGITS))
    return delta


def decode(values: np.ndarray, first_element: int = 0) -> tuple[dict[int, int], list[int]]:
    """The slots a run of counter elements holds: ({slot: times applied}, bad elements).

    ``first_element`` is the index of ``values[0]`` in the tensor. An element with
    its sign bit set cannot come from any set of slots applied fewer than 8 times
    each: it is returned as bad.
    """
    counts = counts_array(values)
    base = first_element * DIGITS
    slots = {int(base + i): int(counts[i]) for i in np.flatnonzero(counts)}
    u = values.astype(np.int64, copy=False).view(np.uint64)
    bad = [int(first_element + i) for i in np.flatnonzero(u >> np.uint64(63))]
    return slots, bad


def counts_array(values: np.ndarray) -> np.ndarray:
    """Per-slot counts of a run of counter elements, as one flat uint8 array."""
    u = values.astype(np.int64, copy=False).view(np.uint64)
    digits = np.stack([(u >> np.uint64(3 * d)) & np.uint64(7) for d in range(DIGITS)], axis=1)
    return digits.reshape(-1).astype(np.uint8)


def register_for(client: int, shared: bool) -> str:
    """The register a client writes: its own, or (shared) the one all clients write."""
    return REGISTERS[0] if shared else REGISTERS[client % len(REGISTERS)]


def register_value(client: int, index: int) -> int:
    """The value a register write fills its tensor with: unique to the operation."""
    return (client + 1) << 32 | (index + 1)


def register_writer(value: int) -> tuple[int, int] | None:
    """(client, op index) of the write that filled a register with ``value``; None for 0."""
    if value == 0:
        return None
    return (value >> 32) - 1, (value & 0xFFFFFFFF) - 1
