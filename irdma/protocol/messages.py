"""Typed messages: one frozen dataclass per request kind, each field with one meaning.

The frame header (``frame.Header``) is one fixed struct for every op, so
some of its fields mean different things by op (a batch's entry count sits
in ``shard``, a SYNC's metadata length in ``offset``, a replica update's
sender in ``worker``). Nothing above this module reads those fields: the
daemon decodes each request frame into its message (``decode_request``)
and the client builds frames from messages (``message.frame(length)``).
Payloads are not part of a message: they follow the frame, ``length``
bytes, and are read (or skipped, ``conversation``) by whoever handles it.

No I/O here, as in ``frame``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Self

from .frame import DTYPE_ANY, NO_WORKER, Flag, Header, Op, ProtocolError, Status, pack_response

_REPLACE, _EXCLUSIVE, _REPLICA, _STAGED, _PUSHED, _HELD, _CHECK = (
    int(Flag.REPLACE),
    int(Flag.EXCLUSIVE),
    int(Flag.REPLICA),
    int(Flag.STAGED),
    int(Flag.PUSHED),
    int(Flag.HELD),
    int(Flag.CHECK),
)


class BadRequest(ProtocolError):
    """A request frame that decodes to no message; ``status`` is the answer."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- metadata ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Bare:
    """A request whose meaning is its op and its payload (JSON, a prefix, or none)."""

    request_id: int = 0
    op: ClassVar[Op]

    def frame(self, length: int = 0) -> Header:
        return Header(op=self.op, request_id=self.request_id, length=length)

    @classmethod
    def decode(cls, h: Header) -> Self:
        return cls(h.request_id)


@dataclass(frozen=True, slots=True)
class Hello(_Bare):
    """What a daemon is and holds (answer: JSON). Any payload is ignored."""

    op: ClassVar[Op] = Op.HELLO


@dataclass(frozen=True, slots=True)
class Create:
    """Define a tensor; the payload is its ``TensorMeta`` as JSON."""

    key: int
    replace: bool = False  # replace a tensor of another dtype or shape
    exclusive: bool = False  # fail if the tensor exists at all
    request_id: int = 0
    check: bool = False  # only say whether it would be created (or kept) now
    op: ClassVar[Op] = Op.CREATE

    def frame(self, length: int = 0) -> Header:
        flags = (
            (_REPLACE if self.replace else 0)
            | (_EXCLUSIVE if self.exclusive else 0)
            | (_CHECK if self.check else 0)
        )
        return Header(
            op=Op.CREATE, request_id=self.request_id, key=self.key, flags=flags, length=length
        )

    @classmethod
    def decode(cls, h: Header) -> Create:
        return cls(
            h.key,
            bool(h.flags & _REPLACE),
            bool(h.flags & _EXCLUSIVE),
            h.request_id,
            bool(h.flags & _CHECK),
        )


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete the tensor at ``key``; a payload (a name, UTF-8) deletes it only if it
    still has that name (a tensor renamed meanwhile is another file)."""

    key: int
    request_id: int = 0
    op: ClassVar[Op] = Op.DELETE

    def frame(self, length: int = 0) -> Header:
        return Header(op=Op.DELETE, request_id=self.request_id, key=self.key, length=length)

    @classmethod
    def decode(cls, h: Header) -> Delete:
        return cls(h.key, h.request_id)


@dataclass(frozen=True, slots=True)
class Stat:
    """The stat record of the tensor at ``key``; with a payload (a name, UTF-8), of
    the tensor of that name whatever its key (one renamed, or at a salted key)."""

    key: int
    request_id: int = 0
    op: ClassVar[Op] = Op.STAT

    def frame(self, length: int = 0) -> Header:
        return Header(op=Op.STAT, request_id=self.request_id, key=self.key, length=length)

    @classmethod
    def decode(cls, h: Header) -> Stat:
        return cls(h.key, h.request_id)


@dataclass(frozen=True, slots=True)
class Rename:
    """Give the tensor at ``key`` another name; the payload is JSON RENAME_KEYS."""

    key: int
    request_id: int = 0
    op: ClassVar[Op] = Op.RENAME

    def frame(self, length: int = 0) -> Header:
        return Header(op=Op.RENAME, request_id=self.request_id, key=self.key, length=length)

    @classmethod
    def decode(cls, h: Header) -> Rename:
        return cls(h.key, h.request_id)


@dataclass(frozen=True, slots=True)
class ListTensors:
    """The tensors under a prefix; the payload is the prefix (UTF-8).

    ``limit`` (in the header's size field; 0: no limit) asks for only the
    first that many by name: whether a directory exists is one record, not
    a listing of everything in it.
    """

    limit: int = 0
    request_id: int = 0
    op: ClassVar[Op] = Op.LIST

    def frame(self, length: int = 0) -> Header:
        return Header(op=self.op, request_id=self.request_id, size=self.limit, length=length)

    @classmethod
    def decode(cls, h: Header) -> ListTensors:
        return cls(h.size, h.request_id)


# -- data -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Read:
    """Bytes ``[offset, offset+size)`` of one shard (a pull, with ``worker``)."""

    key: int
    shard: int
    offset: int
    size: int
    min_version: int = 0  # a replica behind this answers BEHIND
    layout: int = 0  # the layout fingerprint the client assumes (0: unchecked)
    dtype: int = DTYPE_ANY
    wire: int = 0  # answer narrowed to this dtype (irdma.narrowing); 0: as stored
    worker: int = NO_WORKER  # a training worker's pull for ``step``
    step: int = 0
    # The copy made by this whole-tensor write (0: the current one); a daemon
    # that no longer holds it answers STAMP_GONE.
    stamp: int = 0
    request_id: int = 0
    op: ClassVar[Op] = Op.READ

    def frame(self, length: int = 0) -> Header:
        return Header(
            Op.READ,
            self.request_id,
            self.key,
            self.shard,
            self.offset,
            self.size,
            length,
            self.min_version,
            1.0,
            self.layout,
            0,
            0,
            self.dtype,
            worker=self.worker,
            step=self.step,
            wire=self.wire,
            stamp=self.stamp,
        )

    @classmethod
    def decode(cls, h: Header) -> Read:
        return cls(
            h.key,
            h.shard,
            h.offset,
            h.size,
            h.version,
            h.layout,
            h.dtype,
            h.wire,
            h.worker,
            h.step,
            h.stamp,
            h.request_id,
        )


# A copy's stamp as reads name it: a shard never written whole by a stamped
# write has stamp 0 in the daemon; on the wire that copy is UNSTAMPED, since
# 0 means "the current copy" in a request and "none kept" in an answer.
# Clients never make stamps 0 or 1 (``irdma.client.stamps.StampClock``).
UNSTAMPED = 1


def wire_stamp(stamp: int) -> int:
    """A copy's stamp as a read request or answer carries it."""
    return stamp or UNSTAMPED


def read_answer(
    request: Header, length: int, flags: int, version: int, stamp: int, prev_stamp: int
) -> bytes:
    """The packed answer to a READ: the served copy's version and whole-write stamp
    (``wire_stamp``), and in ``txn`` the stamp of the shard's previous copy still
    held (0: none)."""
    return pack_response(request, 0, length, flags, version, stamp=stamp, txn=prev_stamp)


def served_stamps(answer: Header) -> tuple[int, int]:
    """(stamp of the copy a READ answer carries, stamp of the previous copy still held)."""
    return answer.stamp, answer.txn


@dataclass(frozen=True, slots=True)
class Update:
    """A client's WRITE or ACCUMULATE (``tensor[offset:] (+)= alpha * data``) of one shard.

    The payload is the data (``size`` bytes, fewer if narrowed to ``wire``),
    or with ``staged`` an 8-byte ``LOCATION`` in the connection's staging memory.
    """

    op: Op
    key: int
    shard: int
    offset: int
    size: int
    alpha: float = 1.0
    layout: int = 0
    dtype: int = DTYPE_ANY
    wire: int = 0
    worker: int = NO_WORKER  # a training worker's push for ``step``
    step: int = 0
    txn: int = 0  # the same on every retry, so a retried update is applied once
    staged: bool = False
    # A WRITE of whole shards that is part of one whole-tensor write: its id,
    # the same on every shard (0: none). The daemon keeps the shard's previous
    # copy, so a reader can get every shard of one write.
    stamp: int = 0
    request_id: int = 0

    def frame(self, length: int) -> Header:
        return Header(
            self.op,
            self.request_id,
            self.key,
            self.shard,
            self.offset,
            self.size,
            length,
            0,
            self.alpha,
            self.layout,
            _STAGED if self.staged else 0,
            0,
            self.dtype,
            worker=self.worker,
            step=self.step,
            txn=self.txn,
            wire=self.wire,
            stamp=self.stamp,
        )

    @classmethod
    def decode(cls, h: Header) -> Update:
        if h.stamp and h.op != Op.WRITE:
            raise BadRequest(Status.BAD_FRAME, "only a WRITE carries a whole-tensor stamp")
        return cls(
            Op(h.op),
            h.key,
            h.shard,
            h.offset,
            h.size,
            h.alpha,
            h.layout,
            h.dtype,
            h.wire,
            h.worker,
            h.step,
            h.txn,
            bool(h.flags & _STAGED),
            h.stamp,
            h.request_id,
        )


@dataclass(frozen=True, slots=True)
class ReplicaUpdate:
    """A primary's update forwarded to a backup, applied only on top of ``produces - 1``.

    A training worker's push (``pushed_by``) carries its worker and step, so
    the backup's training-mode bookkeeping (ssp clocks, held deltas) follows
    the primary's; a ``held`` one is not applied but held for its lockstep
    step, on top of version ``produces`` itself. A ``lent`` one (flag STAGED)
    carries where its bytes lie in the sender's arena instead of the bytes (a
    backup on the sender's host: ``psd/replication/lending.py``).
    """

    op: Op  # WRITE or ACCUMULATE
    key: int
    shard: int
    offset: int
    size: int
    alpha: float
    layout: int
    dtype: int
    produces: int  # the version the update produces (held: the version it sits on)
    sender: int  # the sending daemon's index in the cluster's node list
    txn: int = 0
    # A lockstep training step's sum: its group and the steps that group has
    # applied with it (0: not a step); the backup's coordinator follows.
    group: int = 0
    steps_applied: int = 0
    stamp: int = 0  # the whole-tensor write it is part of (0: none)
    request_id: int = 0
    pushed_by: int = NO_WORKER  # the training worker whose push it is
    pushed_step: int = 0  # and the step it is that worker's gradient for
    held: bool = False  # held for its lockstep step, not applied
    lent: bool = False  # the payload is where the bytes lie in the sender's arena

    def __post_init__(self) -> None:
        pushed = self.pushed_by != NO_WORKER
        if pushed and (self.op != Op.ACCUMULATE or self.steps_applied or self.stamp):
            raise ValueError("a forwarded push is an accumulate, not a step's sum or a write")
        if self.held and not pushed:
            raise ValueError("a held update is a worker's push")

    def frame(self, length: int) -> Header:
        flags = _REPLICA | (_STAGED if self.lent else 0)
        if self.pushed_by != NO_WORKER:
            flags |= _PUSHED | (_HELD if self.held else 0)
            step = self.pushed_step << 16 | self.pushed_by
        else:
            step = self.steps_applied << 16 | self.group  # groups < 2**16 (MAX_WORKERS)
        return Header(
            self.op,
            self.request_id,
            self.key,
            self.shard,
            self.offset,
            self.size,
            length,
            self.produces,
            self.alpha,
            self.layout,
            flags,
            0,
            self.dtype,
            worker=self.sender,
            step=step,
            txn=self.txn,
            stamp=self.stamp,
        )

    @classmethod
    def decode(cls, h: Header) -> ReplicaUpdate:
        if h.wire:
            raise BadRequest(Status.BAD_FRAME, "a replica update is not narrowed")
        pushed = bool(h.flags & _PUSHED)
        if h.flags & _HELD and not pushed:
            raise BadRequest(Status.BAD_FRAME, "HELD without PUSHED on a replica update")
        if pushed and (h.op != Op.ACCUMULATE or h.stamp):
            raise BadRequest(Status.BAD_FRAME, "a forwarded push is an accumulate")
        low, high = h.step & 0xFFFF, h.step >> 16
        return cls(
            Op(h.op),
            h.key,
            h.shard,
            h.offset,
            h.size,
            h.alpha,
            h.layout,
            h.dtype,
            h.version,
            h.worker,
            h.txn,
            0 if pushed else low,
            0 if pushed else high,
            h.stamp,
            h.request_id,
            low if pushed else NO_WORKER,
            high if pushed else 0,
            bool(h.flags & _HELD),
            bool(h.flags & _STAGED),
        )


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """``count`` reads; the payload is their ``BatchEntry`` records."""

    count: int
    wire: int = 0  # every entry narrowed; entry lengths count wire bytes
    worker: int = NO_WORKER
    step: int = 0
    request_id: int = 0
    op: ClassVar[Op] = Op.READ_BATCH

    def frame(self, length: int) -> Header:
        return Header(
            op=Op.READ_BATCH,
            request_id=self.request_id,
            shard=self.count,
            length=length,
            worker=self.worker,
            step=self.step,
            wire=self.wire,
        )

    @classmethod
    def decode(cls, h: Header) -> ReadBatch:
        return cls(h.shard, h.wire, h.worker, h.step, h.request_id)


@dataclass(frozen=True, slots=True)
class UpdateBatch:
    """``count`` writes or accumulates: their entries, then their data back to back.

    Entry ``i`` is update ``txn + i`` (0: none), the same on a retry.
    """

    op: Op  # WRITE_BATCH or ACCUMULATE_BATCH
    count: int
    wire: int = 0
    worker: int = NO_WORKER
    step: int = 0
    txn: int = 0
    request_id: int = 0

    def frame(self, length: int) -> Header:
        return Header(
            op=self.op,
            request_id=self.request_id,
            shard=self.count,
            length=length,
            worker=self.worker,
            step=self.step,
            txn=self.txn,
            wire=self.wire,
        )

    @classmethod
    def decode(cls, h: Header) -> UpdateBatch:
        return cls(Op(h.op), h.shard, h.wire, h.worker, h.step, h.txn, h.request_id)

    @property
    def single(self) -> Op:
        """The op of one of its entries sent alone."""
        return Op.WRITE if self.op == Op.WRITE_BATCH else Op.ACCUMULATE


def batch_entry_txn(txn: int, index: int) -> int:
    """The update id of entry ``index`` of a batch sent as update ``txn`` (0: none).

    The one rule both sides follow, on retries too: entry i is ``txn + i``,
    wrapping at 64 bits and never 0 (which would mean "no id").
    """
    if not txn:
        return 0
    return (txn + index) % (1 << 64) or 1


def batch_count(answer: Header) -> int:
    """The entry count a batch's answer echoes (0 from daemons that do not say)."""
    return answer.shard


@dataclass(frozen=True, slots=True)
class Release:
    """The pinned answer to request ``request_id`` has been taken: its memory is free."""

    request_id: int
    op: ClassVar[Op] = Op.RELEASE

    def frame(self, length: int = 0) -> Header:
        return Header(op=Op.RELEASE, request_id=self.request_id, length=length)

    @classmethod
    def decode(cls, h: Header) -> Release:
        return cls(h.request_id)


@dataclass(frozen=True, slots=True)
class Lease:
    """A reader's lease ``lease_id`` on tensor ``key``'s copies of whole-tensor write
    ``stamp`` (as reads name it: ``UNSTAMPED`` for the copy from before any; 0:
    every copy the daemon holds now or replaces while the lease lasts, for a
    reader that has not chosen its write yet), for ``ms`` milliseconds from now;
    ``ms`` 0 releases it. The same ``lease_id`` again renews or narrows it."""

    key: int
    lease_id: int
    stamp: int = 0
    ms: int = 0
    request_id: int = 0
    op: ClassVar[Op] = Op.LEASE

    def frame(self, length: int = 0) -> Header:
        return Header(
            op=Op.LEASE,
            request_id=self.request_id,
            key=self.key,
            size=self.ms,
            length=length,
            txn=self.lease_id,
            stamp=self.stamp,
        )

    @classmethod
    def decode(cls, h: Header) -> Lease:
        if not h.txn:
            raise BadRequest(Status.BAD_ARGUMENT, "a lease needs a lease id (0 is none)")
        return cls(h.key, h.txn, h.stamp, h.size, h.request_id)


@dataclass(frozen=True, slots=True)
class Diff:
    """Bytes ``[offset, offset+size)`` of one shard of tensor ``key`` as the changes
    since the same range of tensor ``against`` (``Op.DIFF``, ``protocol.deltas``)."""

    key: int
    shard: int
    offset: int
    size: int
    against: int
    layout: int = 0  # the layout fingerprint the client assumes (0: unchecked)
    request_id: int = 0
    op: ClassVar[Op] = Op.DIFF

    def frame(self, length: int = 0) -> Header:
        return Header(
            op=Op.DIFF,
            request_id=self.request_id,
            key=self.key,
            shard=self.shard,
            offset=self.offset,
            size=self.size,
            length=length,
            layout=self.layout,
            txn=self.against,
        )

    @classmethod
    def decode(cls, h: Header) -> Diff:
        if not h.txn:
            raise BadRequest(Status.BAD_ARGUMENT, "a DIFF needs the key of the version to compare")
        return cls(h.key, h.shard, h.offset, h.size, h.txn, h.layout, h.request_id)


def lease_granted(answer: Header) -> float:
    """Seconds a LEASE answer says the daemon keeps the lease (0: released)."""
    return answer.version / 1000


# -- between daemons ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ping(_Bare):
    """A daemon's heartbeat; the payload is its state as JSON."""

    op: ClassVar[Op] = Op.PING


@dataclass(frozen=True, slots=True)
class Catchup(_Bare):
    """A recovering daemon asks which of its shards the peer holds (JSON payload)."""

    op: ClassVar[Op] = Op.CATCHUP


@dataclass(frozen=True, slots=True)
class SyncRequest(_Bare):
    """A recovering daemon asks the peer to push these shards (JSON payload) as copies."""

    op: ClassVar[Op] = Op.SYNC_REQUEST


@dataclass(frozen=True, slots=True)
class ShardCopy:
    """A whole shard replacing a backup's copy (SYNC): ``meta_length`` bytes of JSON
    (the tensor's metadata and txn window), then the shard's bytes."""

    key: int
    shard: int
    version: int
    meta_length: int
    size: int  # the shard's bytes, after the metadata
    sender: int  # the sending daemon's index in the cluster's node list
    request_id: int = 0
    op: ClassVar[Op] = Op.SYNC

    def frame(self, length: int) -> Header:
        return Header(
            op=Op.SYNC,
            request_id=self.request_id,
            key=self.key,
            shard=self.shard,
            offset=self.meta_length,
            size=self.size,
            length=length,
            version=self.version,
            worker=self.sender,
        )

    @classmethod
    def decode(cls, h: Header) -> ShardCopy:
        return cls(h.key, h.shard, h.version, h.offset, h.size, h.worker, h.request_id)


# -- connection set-up -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Auth:
    """One step of the AUTH handshake (see ``frame``'s AUTH FRAMES)."""

    step: int
    request_id: int = 0
    op: ClassVar[Op] = Op.AUTH

    def frame(self, length: int = 0) -> Header:
        return Header(op=Op.AUTH, request_id=self.request_id, shard=self.step, length=length)

    @classmethod
    def decode(cls, h: Header) -> Auth:
        return cls(h.shard, h.request_id)


@dataclass(frozen=True, slots=True)
class Attach(_Bare):
    """The first frame on a daemon's unix socket (shm): JSON, with the staging memfd."""

    op: ClassVar[Op] = Op.ATTACH


@dataclass(frozen=True, slots=True)
class RdmaConnect(_Bare):
    """Set up an RC queue pair for this TCP connection (JSON both ways)."""

    op: ClassVar[Op] = Op.RDMA_CONNECT


Request = (
    Hello
    | Create
    | Delete
    | Stat
    | Rename
    | ListTensors
    | Read
    | Update
    | ReplicaUpdate
    | ReadBatch
    | UpdateBatch
    | Release
    | Lease
    | Diff
    | Ping
    | Catchup
    | SyncRequest
    | ShardCopy
    | Auth
    | Attach
    | RdmaConnect
)

_DECODERS: dict[Op, Callable[[Header], Request]] = {
    Op.HELLO: Hello.decode,
    Op.CREATE: Create.decode,
    Op.DELETE: Delete.decode,
    Op.STAT: Stat.decode,
    Op.RENAME: Rename.decode,
    Op.LIST: ListTensors.decode,
    Op.READ: Read.decode,
    Op.READ_BATCH: ReadBatch.decode,
    Op.WRITE_BATCH: UpdateBatch.decode,
    Op.ACCUMULATE_BATCH: UpdateBatch.decode,
    Op.RELEASE: Release.decode,
    Op.LEASE: Lease.decode,
    Op.DIFF: Diff.decode,
    Op.PING: Ping.decode,
    Op.CATCHUP: Catchup.decode,
    Op.SYNC_REQUEST: SyncRequest.decode,
    Op.SYNC: ShardCopy.decode,
    Op.AUTH: Auth.decode,
    Op.ATTACH: Attach.decode,
    Op.RDMA_CONNECT: RdmaConnect.decode,
}
_DECODERS_BY_CODE = {int(op): fn for op, fn in _DECODERS.items()}
_UPDATES = (int(Op.WRITE), int(Op.ACCUMULATE))


def decode_request(h: Header) -> Request:
    """The message a request frame carries; BadRequest (BAD_OP, BAD_FRAME) if none.

    Flags that do not belong to the op are refused here, so a handler never
    sees a REPLICA read or a STAGED create.
    """
    op = h.op
    flags = h.flags
    if op in _UPDATES:
        if flags & _REPLICA:
            if flags & ~(_REPLICA | _PUSHED | _HELD | _STAGED):
                raise BadRequest(Status.BAD_FRAME, f"flags {flags:#x} on a replica update")
            return ReplicaUpdate.decode(h)
        if flags & ~_STAGED:
            raise BadRequest(Status.BAD_FRAME, f"flags {flags:#x} on {Op(op).name}")
        return Update.decode(h)
    decode = _DECODERS_BY_CODE.get(op)
    if decode is None:
        raise BadRequest(Status.BAD_OP, f"unknown op {op}")
    allowed = (_REPLACE | _EXCLUSIVE | _CHECK) if op == Op.CREATE else 0
    if flags & ~allowed:
        raise BadRequest(Status.BAD_FRAME, f"flags {flags:#x} on {Op(op).name}")
    return decode(h)
