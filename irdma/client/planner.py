"""The planner: what one call moves, decided before anything is sent (no I/O).

A call (a read, write or accumulate of one tensor, or a batch of many) is
turned into a plan: the pieces of the tensor it covers, cut at shard
boundaries (``ranges.shard_pieces``); where each piece's bytes lie in the
caller's buffer, in the wire dtype when the values travel narrowed
(``Slice``); the stamp of a whole-tensor write; the update id each request
carries; and, for reads, the replica each piece starts at, spread by load
(``Spread``). The single path (``datapath.DataPath``) and the batched path
(``batching.Batches``) both plan here, so each of these is decided once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from .. import narrowing
from ..cluster import Node
from ..errors import DtypeMismatch
from ..protocol import Op, Status, TensorMeta
from .ranges import Piece, shard_pieces
from .routing import new_txn
from .stamps import StampClock


def wire_for(meta: TensorMeta, code: int) -> int:
    """The wire dtype ``meta``'s values travel in for a call asking for ``code``:
    0 where that is the tensor's own dtype (nothing to narrow). DtypeMismatch
    when the tensor cannot travel as it (not a wider float)."""
    if not code or narrowing.WIRE_NAMES[code] == meta.dtype:
        return 0
    try:
        narrowing.check(meta.np_dtype, code)
    except ValueError as exc:
        raise DtypeMismatch(f"{meta.name!r}: {exc}", Status.DTYPE_MISMATCH) from None
    return code


def batch_wire(metas: Iterable[TensorMeta], code: int) -> int:
    """One wire dtype goes for a whole batch: every tensor must be a wider float.
    Returns ``code`` (0: none asked)."""
    if code:
        for meta in metas:
            if not wire_for(meta, code):
                raise DtypeMismatch(
                    f"{meta.name!r} is {meta.dtype} already; a batch with wire "
                    f"{narrowing.WIRE_NAMES[code]} needs wider float tensors",
                    Status.DTYPE_MISMATCH,
                )
    return code


@dataclass(frozen=True, slots=True)
class Slice:
    """One piece of a call and its bytes in the caller's buffer: ``length`` bytes
    from ``start`` (wire bytes where the values travel narrowed; the piece
    still counts the tensor's bytes)."""

    piece: Piece
    start: int
    length: int

    @property
    def shard(self) -> int:
        return self.piece.shard


def slices(meta: TensorMeta, offset: int, buf_len: int, wire: int = 0) -> list[Slice]:
    """The pieces of a call moving a buffer of ``buf_len`` bytes at ``offset`` of the
    tensor (``offset`` counts the tensor's bytes; the buffer holds wire values
    with a ``wire`` dtype), each with where its bytes are in the buffer."""
    if not wire:
        return [Slice(p, p.buf_offset, p.length) for p in shard_pieces(meta, offset, buf_len)]
    held = narrowing.check(meta.np_dtype, wire).itemsize
    itemsize = meta.np_dtype.itemsize
    pieces = shard_pieces(meta, offset, buf_len // held * itemsize)
    return [Slice(p, p.buf_offset // itemsize * held, p.length // itemsize * held) for p in pieces]


def whole_write_stamp(op: Op, meta: TensorMeta, cut: list[Slice], clock: StampClock) -> int:
    """A fresh stamp from ``clock`` for a write of the whole tensor over several shards
    (one write for its readers: every shard carries it, see psd's store); 0 otherwise."""
    if op != Op.WRITE or len(cut) < 2:
        return 0
    return clock.next() if sum(s.piece.length for s in cut) == meta.nbytes else 0


def update_txn(fails_over: bool) -> int:
    """The id an update request carries: daemons that replicate apply an update
    retried with the same id once (0: none, they do not need one)."""
    return new_txn() if fails_over else 0


class Replicas(Protocol):
    """The replica order of a shard, as the router gives it (``Router.candidates``)."""

    def candidates(
        self, key: int, shard: int, update: bool, load: dict[str, int] | None = None
    ) -> list[Node]: ...


@dataclass
class Spread:
    """The replica each piece of one call starts at.

    Requests that go to the primary (updates, a training step's reads) start
    where the router says. Other reads start at the least loaded replica, by
    bytes already given to each daemon by the same call, so a call's pieces
    spread evenly even where placement put more of them on one daemon.
    """

    replicas: Replicas
    to_primary: bool
    load: dict[str, int] = field(default_factory=dict)

    def order(self, key: int, piece: Piece) -> list[Node]:
        """The replicas of ``piece``'s shard in the order to try them."""
        if self.to_primary:
            return self.replicas.candidates(key, piece.shard, True, None)
        order = self.replicas.candidates(key, piece.shard, False, self.load)
        first = order[0].name
        self.load[first] = self.load.get(first, 0) + piece.length
        return order
