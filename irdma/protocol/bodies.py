"""JSON bodies, one frozen dataclass each, built and parsed here as ``messages``
does for frames: a daemon's stat record of a tensor (STAT, RENAME, each item of
LIST), the answer to CREATE, RENAME's request, and the shared-memory handshake
(ATTACH's offer and answer). The bytes on the wire are what they were when
these were plain dicts. (HELLO's answer is a self-description for people and
tools, handed to callers as the dict it is; the replication bodies are in
``irdma_psd.replication.bodies``.)

A body that does not follow its shape raises ``ProtocolError`` naming what is
wrong (a daemon of another release, or a damaged answer), never a KeyError
from deep inside a caller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .frame import (
    ATTACH_KEYS,
    RENAME_KEYS,
    ProtocolError,
    TensorMeta,
    decode_json,
    encode_json,
    validate_name,
)


def _number(d: dict[str, Any], key: str, kind: type, default: Any, what: str) -> Any:
    v = d.get(key, default)
    # JSON numbers: an int where a float is asked is fine, a bool never is.
    ok = isinstance(v, int | float) if kind is float else isinstance(v, int)
    if not ok or isinstance(v, bool) or (kind is float and not math.isfinite(v)):
        kind_name = "a number" if kind is float else "an integer"
        raise ProtocolError(f"{what}: {key} {v!r} is not {kind_name}")
    return kind(v)


@dataclass(frozen=True, slots=True)
class StatRecord:
    """One daemon's record of a tensor: what it is and the shards this daemon holds.

    ``shards`` maps shard index to version (None: a daemon that did not say,
    whose ``version`` is then its count); ``node`` names the answering daemon
    (STAT, RENAME); ``evicted``: the workers a training mode evicted.
    """

    meta: TensorMeta
    version: int
    mtime: float = 0.0
    ctime: float = 0.0
    shards: dict[int, int] | None = None
    node: str | None = None
    evicted: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "meta": self.meta.to_dict(),
            "version": self.version,
            "mtime": self.mtime,
            "ctime": self.ctime,
        }
        if self.shards is not None:
            out["shards"] = {str(i): v for i, v in sorted(self.shards.items())}
        if self.evicted is not None:
            out["evicted"] = list(self.evicted)
        if self.node is not None:
            out["node"] = self.node
        return out

    def encode(self) -> bytes:
        return encode_json(self.to_json())

    @classmethod
    def from_json(cls, d: Any, known: dict[str, TensorMeta] | None = None) -> StatRecord:
        """Parse a decoded record. ``known``: metadata parsed already, by the JSON of
        its ``meta`` (a listing of many daemons parses each tensor's once)."""
        what = "stat record"
        if not isinstance(d, dict):
            raise ProtocolError(f"{what} is not a JSON object")
        raw = d.get("meta")
        if not isinstance(raw, dict):
            raise ProtocolError(f"{what} has no tensor metadata")
        meta = None
        memo = encode_json(raw).decode() if known is not None else ""
        if known is not None:
            meta = known.get(memo)
        if meta is None:
            try:
                meta = TensorMeta.from_dict(raw)
            except ValueError as exc:
                raise ProtocolError(f"{what}: {exc}") from None
            if known is not None:
                known[memo] = meta
        shards = d.get("shards")
        if shards is not None:
            if not isinstance(shards, dict):
                raise ProtocolError(f"{what}: shards is not an object")
            try:
                shards = {int(i): int(v) for i, v in shards.items()}
            except (TypeError, ValueError):
                raise ProtocolError(f"{what}: shards are not index: version pairs") from None
        evicted = d.get("evicted")
        if evicted is not None:
            if not isinstance(evicted, list) or not all(
                isinstance(w, int) and not isinstance(w, bool) for w in evicted
            ):
                raise ProtocolError(f"{what}: evicted is not a list of worker ids")
            evicted = tuple(evicted)
        node = d.get("node")
        if node is not None and not isinstance(node, str):
            raise ProtocolError(f"{what}: node {node!r} is not a name")
        return cls(
            meta=meta,
            version=_number(d, "version", int, 0, what),
            mtime=_number(d, "mtime", float, 0.0, what),
            ctime=_number(d, "ctime", float, 0.0, what),
            shards=shards,
            node=node,
            evicted=evicted,
        )

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> StatRecord:
        """A STAT or RENAME answer's body."""
        return cls.from_json(decode_json(data))

    @classmethod
    def parse_list(
        cls, data: bytes | bytearray | memoryview, known: dict[str, TensorMeta] | None = None
    ) -> list[StatRecord]:
        """A LIST answer's body: one record per tensor."""
        items = decode_json(data)
        if not isinstance(items, list):
            raise ProtocolError("a listing is not a JSON array")
        known = {} if known is None else known
        return [cls.from_json(item, known) for item in items]


@dataclass(frozen=True, slots=True)
class CreateAnswer:
    """A daemon's answer to CREATE: the tensor's record where it keeps shards of it
    (``created``: made by this request, else found as asked), no record where it
    keeps none; for a check (``fits``), whether the new layout fits."""

    record: StatRecord | None = None
    created: bool = False
    fits: bool = False

    @property
    def placed(self) -> bool:
        """Whether this daemon keeps shards of the tensor."""
        return self.record is not None

    def encode(self) -> bytes:
        if self.fits:
            return encode_json({"fits": True})
        if self.record is None:
            return encode_json({"placed": False})
        return encode_json(self.record.to_json() | {"created": self.created})

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> CreateAnswer:
        d = decode_json(data)
        if not isinstance(d, dict):
            raise ProtocolError("create answer is not a JSON object")
        if d.get("fits"):
            return cls(fits=True)
        if not d.get("placed", True):
            return cls()
        return cls(StatRecord.from_json(d), created=bool(d.get("created")))


@dataclass(frozen=True, slots=True)
class RenameBody:
    """RENAME's request body: the tensor's name now and the name it takes."""

    old: str
    new: str

    def encode(self) -> bytes:
        return encode_json(dict(zip(RENAME_KEYS, (self.old, self.new), strict=True)))

    @classmethod
    def from_json(cls, body: Any) -> RenameBody:
        if not isinstance(body, dict) or set(body) != set(RENAME_KEYS):
            raise ProtocolError(f"rename takes JSON keys {list(RENAME_KEYS)}")
        try:
            old, new = (validate_name(body[k]) for k in RENAME_KEYS)
        except ValueError as exc:
            raise ProtocolError(f"rename: {exc}") from None
        return cls(old, new)


def _positive(value: Any) -> int:
    """A size a body gives, or 0 where it gives none that is a positive integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True, slots=True)
class AttachOffer:
    """ATTACH's request body: the size of the client's staging memory (its memfd goes
    alongside) and of its shared region (the second memfd; 0 without one)."""

    staging: int
    shared: int = 0

    def encode(self) -> bytes:
        return encode_json(
            {"staging": self.staging} | ({"shared": self.shared} if self.shared else {})
        )

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> AttachOffer:
        try:
            body = decode_json(data)
            staging = body["staging"]
        except (ProtocolError, KeyError, TypeError):
            raise ProtocolError("ATTACH body must be JSON with 'staging'") from None
        if not _positive(staging):
            raise ProtocolError("staging size must be a positive integer")
        # An offer the daemon cannot use is ignored: writes then go through staging.
        return cls(staging, _positive(body.get("shared")))


@dataclass(frozen=True, slots=True)
class AttachAnswer:
    """A daemon's answer to ATTACH: who and where it is, its arena's size (the memfd
    alongside), where the shard directory is in it (offset, slots; None: a daemon
    without one, or one that gave no pair of integers), and the size of the client's
    shared region if it mapped it (0: not mapped, writes stage)."""

    node: str
    host: str
    arena_size: int
    directory: tuple[int, int] | None = None
    shared: int = 0

    def encode(self) -> bytes:
        body: dict[str, Any] = {"node": self.node, "host": self.host, "arena_size": self.arena_size}
        if self.directory is not None:
            body["directory"] = list(self.directory)
        if self.shared:
            body["shared"] = self.shared
        return encode_json(body)

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> AttachAnswer:
        body = decode_json(data)
        if not isinstance(body, dict) or any(k not in body for k in ATTACH_KEYS):
            raise ProtocolError("malformed ATTACH answer")
        node, host, size = (body[k] for k in ATTACH_KEYS)
        if not isinstance(node, str) or not isinstance(host, str) or not _positive(size):
            raise ProtocolError("malformed ATTACH answer")
        return cls(
            node, host, size, directory_pair(body.get("directory")), _positive(body.get("shared"))
        )


def directory_pair(where: Any) -> tuple[int, int] | None:
    """A shard directory's (offset, slots) as a body gives it, if it is two integers."""
    if isinstance(where, list) and len(where) == 2 and all(type(x) is int for x in where):
        return where[0], where[1]
    return None
