"""The JSON bodies daemons send each other for replication, one frozen dataclass each.

Each is built (``encode``) and read (``parse`` from decoded JSON, ``decode``
from bytes) here and nowhere else, so no other module reads them by string
key. The bytes are those of the untyped dicts they replace: the same keys, in
the same order. A body that is not what its message carries raises
``BadBody``, whose text says what is wrong.

- ``Heartbeat``: a PING and its answer (the sender's state);
- ``CatchupQuestion`` / ``CatchupAnswer``: CATCHUP, what a catching-up daemon
  asks each peer and what the peer holds for it (``Holding``s);
- ``CopyRequest``: SYNC_REQUEST, the shards a daemon asks a peer to send whole;
- ``ShardCopyBody``: the metadata that leads a SYNC (a whole shard's copy);
- ``LentBytes``: the body of a REPLICA_UPDATE sent STAGED to a backup on the
  sender's host: where the update's bytes lie in the sender's arena, and the
  loan that says they still do (``psd/loans.py``). Fixed-size binary, not
  JSON: it rides with every large forward.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Self

from irdma.protocol import ProtocolError, TensorMeta, decode_json, encode_json

# A shard of a tensor: (tensor key, shard index).
ShardId = tuple[int, int]


class BadBody(ValueError):
    """A replication body that is not what its message carries."""


def _object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadBody(f"{what} is not a JSON object")
    return body


def _name(body: dict[str, Any], what: str) -> str:
    node = body.get("node")
    if not isinstance(node, str):
        raise BadBody(f"{what} names no sending daemon (node {node!r})")
    return node


def _optional_int(value: Any) -> int | None:
    # What a daemon of this release writes is an int; anything else counts as unsaid.
    return value if isinstance(value, int) else None


def _ints(values: Any, width: int, what: str) -> list[tuple[int, ...]]:
    """A JSON list of ``width``-long lists of integers, as tuples."""
    try:
        rows = [tuple(int(v) for v in row) for row in values]
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(1e400)
        raise BadBody(f"{what} is not a list of integer lists") from None
    if any(len(row) != width for row in rows):
        raise BadBody(f"{what}: each entry has {width} integers")
    return rows


def _decode(data: bytes | bytearray | memoryview, what: str) -> Any:
    try:
        return decode_json(data)
    except ProtocolError as exc:
        raise BadBody(f"{what}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A daemon's state as its heartbeats (and their answers) carry it.

    ``boot`` and ``seq`` order the reports of one run of the sender (a late
    one cannot undo a newer one); ``epoch`` is the number of the epoch it
    follows (0 without etcd). A peer of an older release may leave out what it
    does not know: then None. ``resync``: the sender owes the receiver a resync
    (it acknowledged updates without it, ``debts``); written only when true, so
    a peer of an older release reads the same bytes it always did and an
    absent field means nothing is owed.
    """

    node: str
    ready: bool
    handoff: bool = False  # the sender caught up and takes its shards back
    boot: int | None = None
    seq: int | None = None
    epoch: int | None = None
    resync: bool = False
    # The boot id of the kernel the sender runs on: a primary lends large forwards
    # to a backup on its own kernel (``lending``). None: unsaid.
    kernel: str | None = None

    @property
    def stamp(self) -> tuple[int, int] | None:
        if self.boot is None or self.seq is None:
            return None
        return self.boot, self.seq

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "node": self.node,
            "ready": self.ready,
            "handoff": self.handoff,
            "boot": self.boot,
            "seq": self.seq,
            "epoch": self.epoch,
        }
        if self.resync:
            body["resync"] = True
        if self.kernel is not None:
            body["kernel"] = self.kernel
        return encode_json(body)

    @classmethod
    def parse(cls, body: Any) -> Self:
        rec = _object(body, "heartbeat")
        return cls(
            node=_name(rec, "heartbeat"),
            ready=bool(rec.get("ready")),
            handoff=bool(rec.get("handoff")),
            boot=_optional_int(rec.get("boot")),
            seq=_optional_int(rec.get("seq")),
            epoch=_optional_int(rec.get("epoch")),
            resync=rec.get("resync") is True,
            kernel=k if isinstance(k := rec.get("kernel"), str) else None,
        )

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Self:
        return cls.parse(_decode(data, "heartbeat"))


@dataclass(frozen=True, slots=True)
class CatchupQuestion:
    """CATCHUP: a daemon catching up asks a peer what it holds for it."""

    node: str
    epoch: int | None

    def encode(self) -> bytes:
        return encode_json({"node": self.node, "epoch": self.epoch})

    @classmethod
    def parse(cls, body: Any) -> Self:
        rec = _object(body, "catch-up question")
        return cls(_name(rec, "catch-up question"), _optional_int(rec.get("epoch")))


@dataclass(frozen=True, slots=True)
class Holding:
    """One shard a daemon holds: its version and the CRC-32 of its bytes."""

    key: int
    shard: int
    version: int
    crc: int

    @property
    def id(self) -> ShardId:
        return self.key, self.shard


@dataclass(frozen=True, slots=True)
class CatchupAnswer:
    """What a peer tells a catching-up daemon: whether it is ready, and the shards it
    holds that the asker is a replica of."""

    ready: bool
    holdings: tuple[Holding, ...]
    # The daemons the answering one hears from now (it among them): the asker must
    # have every one of them answer before it decides (catchup_plan). Absent from
    # an older daemon's answer: none named.
    up: tuple[str, ...] = ()
    # The keys of tensors deleted there (tombstones): the only word on which the asker
    # drops a copy its primary lacks. Absent from an older daemon's answer: none.
    deleted: tuple[int, ...] = ()

    def held(self) -> dict[ShardId, tuple[int, int]]:
        """(version, crc) by shard."""
        return {h.id: (h.version, h.crc) for h in self.holdings}

    def encode(self) -> bytes:
        return encode_json(
            {
                "ready": self.ready,
                "shards": [[h.key, h.shard, h.version, h.crc] for h in self.holdings],
                "up": list(self.up),
                "deleted": list(self.deleted),
            }
        )

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Self:
        rec = _object(_decode(data, "catch-up answer"), "catch-up answer")
        if "shards" not in rec:
            raise BadBody("catch-up answer lists no shards")
        rows = _ints(rec["shards"], 4, "catch-up answer's shards")
        up = rec.get("up", [])
        if not isinstance(up, list) or not all(isinstance(n, str) for n in up):
            raise BadBody("catch-up answer's up is not a list of daemon names")
        deleted = rec.get("deleted", [])
        if not isinstance(deleted, list) or not all(
            isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 1 << 64 for k in deleted
        ):
            raise BadBody("catch-up answer's deleted is not a list of tensor keys")
        return cls(
            bool(rec.get("ready")),
            tuple(Holding(*row) for row in rows),
            tuple(up),
            tuple(deleted),
        )


@dataclass(frozen=True, slots=True)
class CopyRequest:
    """SYNC_REQUEST: the shards a daemon asks a peer to send it whole."""

    node: str
    shards: tuple[ShardId, ...]
    epoch: int | None

    def encode(self) -> bytes:
        return encode_json(
            {"node": self.node, "shards": [list(s) for s in self.shards], "epoch": self.epoch}
        )

    @classmethod
    def parse(cls, body: Any) -> Self:
        rec = _object(body, "copy request")
        if "shards" not in rec:
            raise BadBody("copy request lists no shards")
        rows = _ints(rec["shards"], 2, "copy request's shards")
        shards = tuple((key, shard) for key, shard in rows)
        return cls(_name(rec, "copy request"), shards, _optional_int(rec.get("epoch")))


@dataclass(frozen=True, slots=True)
class ShardCopyBody:
    """The metadata before a whole shard's bytes (SYNC): the tensor, the shard's
    version, its recent txns (txn -> version they produced), the lockstep steps
    applied per group, the ssp clocks, and the stamp of its last update."""

    meta: TensorMeta
    version: int
    txns: tuple[tuple[int, int], ...] = ()
    steps: tuple[int, ...] = ()
    clocks: tuple[int, ...] = ()
    stamp: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.stamp < 1 << 64:
            raise BadBody(f"shard copy: stamp {self.stamp} is not a 64-bit id")

    def encode(self) -> bytes:
        return encode_json(
            {
                "meta": self.meta.to_dict(),
                "version": self.version,
                "txns": [[t, v] for t, v in self.txns],
                "steps": list(self.steps),
                "clocks": list(self.clocks),
                "stamp": self.stamp,
            }
        )

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, version: int) -> Self:
        """``version``: the frame header's, which counts (the body's repeats it)."""
        rec = _object(_decode(data, "shard copy"), "shard copy")
        try:
            meta = TensorMeta.from_dict(rec["meta"])
            stamp = int(rec.get("stamp", 0))
        except (ProtocolError, ValueError, KeyError, TypeError, OverflowError) as exc:
            raise BadBody(f"shard copy: {exc!s}") from None
        txns = _ints(rec.get("txns", []), 2, "shard copy: txns")
        return cls(
            meta,
            version,
            tuple((t, v) for t, v in txns),
            _flat_ints(rec.get("steps", []), "shard copy: steps"),
            _flat_ints(rec.get("clocks", []), "shard copy: clocks"),
            stamp,
        )


def _flat_ints(values: Iterable[Any], what: str) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in values)
    except (TypeError, ValueError, OverflowError):
        raise BadBody(f"{what} is not a list of integers") from None


_LENT = struct.Struct("<16s8q")


@dataclass(frozen=True, slots=True)
class LentBytes:
    """Where a forwarded update's bytes lie in its sender's arena, lent until revoked.

    ``boot`` (the kernel's boot id), ``pid`` and ``fd`` say how a process on the
    same host opens the arena (``/proc/<pid>/fd/<fd>``); ``dev`` and ``ino``
    which file it must turn out to be (a pid reused since opens another);
    ``offset`` and ``nbytes`` the bytes; ``word`` and ``token`` the loan.
    """

    boot: bytes
    pid: int
    fd: int
    dev: int
    ino: int
    offset: int
    nbytes: int
    word: int
    token: int

    SIZE = _LENT.size

    def encode(self) -> bytes:
        return _LENT.pack(
            self.boot,
            self.pid,
            self.fd,
            self.dev,
            self.ino,
            self.offset,
            self.nbytes,
            self.word,
            self.token,
        )

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Self:
        if len(data) != _LENT.size:
            raise BadBody(f"a lent update's body is {_LENT.size} bytes, not {len(data)}")
        body = cls(*_LENT.unpack(data))
        if min(body.pid, body.fd, body.offset, body.nbytes, body.word) < 0:
            raise BadBody("a lent update's body has a negative pid, descriptor or offset")
        return body
