"""The irdma wire format: frames, in one place and without any I/O (sans-IO, as h11).

Every message is one fixed 112-byte little-endian header, optionally followed
by a payload of ``header.length`` bytes. Requests and responses share the
header; a response has ``FLAG_RESPONSE`` set, echoes the request id, and
carries a status. Transports only move these bytes; parsing and validation
live here so that every transport (tcp, shm, rdma) and the daemon agree.

Batch ops carry ``count`` ``BatchEntry`` records (48 bytes each) at the start
of the payload, followed by the entries' data back to back.
"""

from __future__ import annotations

import enum
import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

# Registers bfloat16 and the float8 dtypes with numpy, by name (DTYPE_CODES).
from .. import dtypes as _dtypes  # noqa: F401

MAGIC = b"IRDM"
PROTOCOL_VERSION = 9

# magic, protocol version, op, flags, status, dtype, shard (or entry count),
# request id, tensor key, offset, size (bytes of tensor data the op covers),
# length (payload bytes after the header), version, alpha, layout (the
# fingerprint of the tensor's dtype, shape and shard size the client assumes;
# 0 means unchecked), worker (the rank of the training worker sending it, or
# NO_WORKER), wire (the dtype code the payload's values travel in when it is
# narrower than the tensor's, see WIRE_NAMES; 0: as stored), epoch (16
# bits: the tag of the cluster epoch a client routed the request with,
# ``irdma.cluster.epochs.epoch_tag``; 0: not routed by an epoch; a daemon of another
# epoch answers STALE_EPOCH), step (the worker's training step: an
# accumulate is its gradient for that step, a read waits until the tensor's
# training mode lets that step proceed), txn (the client's id of one logical
# update, the same on every retry, so a retried update is applied once; 0 for
# none), stamp (the id of one whole-tensor write, the same on all its shards,
# so readers can tell two writes apart, and ordered, so every shard keeps the
# later of two; 0: none; in a read, the copy wanted; in a read's answer, the
# copy served; in a STALE_STAMP answer, the later write's). In a read, version is the least
# version the client will accept (a replica behind it answers BEHIND). In a
# REPLICA update and in SYNC, worker is the index of the sending daemon in the
# cluster's node list (a receiver takes copies only from the daemon it sees as
# the shard's acting primary).
HEADER = struct.Struct("<4sBBHHHIQQQQQQdQIHHQQQ")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 112
NO_WORKER = 0xFFFFFFFF
# Where the request id sits, so a connection can stamp it into a packed header.
REQUEST_ID = struct.Struct("<Q")
REQUEST_ID_OFFSET = 16

# key, offset, length, version, alpha, shard, status, dtype.
ENTRY = struct.Struct("<QQQQdIHH")
ENTRY_SIZE = ENTRY.size
assert ENTRY_SIZE == 48

# Error responses carry a short human-readable message (or, for STALE_EPOCH, the
# epoch record: about 60 bytes per daemon, so a thousand fit); bound it so a
# hostile daemon cannot make a client allocate much.
MAX_ERROR_MESSAGE = 64 << 10
# Metadata payloads (create, list and stat answers) are JSON; bounded too.
MAX_META_PAYLOAD = 16 << 20
# A tensor name's limit: PATH_MAX, so any path the kernel gives the mount names
# a tensor (a name was 1024 bytes at most before; older daemons refuse longer).
MAX_NAME_BYTES = 4096
MAX_DIMS = 32
# Tensor options are stored and sent back in every stat, list and snapshot:
# nesting near the interpreter's recursion limit would decode here and fail
# to encode (or decode) there, so it is bounded.
MAX_OPTION_DEPTH = 32
# Bounds work per create (one placement per shard): 1 Mi shards is 4 TiB at
# the default shard size.
MAX_SHARDS = 1 << 20


class Op(enum.IntEnum):
    HELLO = 1
    CREATE = 2
    DELETE = 3
    LIST = 4
    STAT = 5
    READ = 6
    WRITE = 7
    ACCUMULATE = 8
    READ_BATCH = 9
    WRITE_BATCH = 10
    ACCUMULATE_BATCH = 11
    # Client to daemon, no answer: the payload of a pinned response has been
    # taken out of the socket, so the daemon may reuse the memory it came from.
    RELEASE = 12
    # Daemon to daemon (replication): a heartbeat carrying the sender's state.
    PING = 13
    # Primary to backup: a whole shard (with the tensor's metadata) replacing
    # the backup's copy, when the backup is behind or missed updates.
    SYNC = 14
    # Recovering daemon to a peer: which shards (and versions) the peer holds
    # that the asker is a replica of.
    CATCHUP = 15
    # Recovering daemon to a peer: push these shards to me (as SYNC frames).
    SYNC_REQUEST = 16
    # Same-host client to daemon, first frame on the daemon's unix socket
    # (shm transport): JSON {"staging": bytes}, with the client's staging
    # memfd passed alongside (SCM_RIGHTS). The answer is JSON ATTACH_KEYS with
    # a read-only fd of the daemon's arena passed alongside.
    ATTACH = 17
    # Either side to a daemon with a secret: the handshake that must come
    # before any other op on a connection (see AUTH FRAMES below).
    AUTH = 18
    # Client to daemon on a TCP connection (rdma transport): set up an RC
    # queue pair. JSON RDMA_CONNECT_KEYS in both directions (see below). After
    # an OK answer, reads on this connection are answered MAPPED (the client
    # RDMA READs the bytes from the registered arena) and writes may be
    # STAGED (the client has RDMA WRITten them into its staging area).
    RDMA_CONNECT = 19
    # Client to daemon: give the tensor at ``key`` another name (RENAME_KEYS,
    # JSON). Its shards stay where they are: the key is where a tensor is
    # placed, the name only how it is found. Answer: this daemon's stat record
    # of it (JSON), or NOT_FOUND if it holds no tensor of that old name there.
    RENAME = 20
    # Client to daemon: a reader's lease on the copies of one whole-tensor write
    # of the tensor at ``key`` (``messages.Lease``): kept past the daemon's rules
    # for older copies until released or run out; the same lease id renews it,
    # narrows it to one write, or (a lease of 0) releases it. Answer: OK, the
    # granted lease in ms as ``version``. A daemon from before leases answers
    # BAD_OP: its reader gets what it got then (TornRead once the write is gone).
    LEASE = 21
    # Client to daemon: bytes [offset, offset+size) of shard ``shard`` of the
    # tensor at ``key`` (a model version b) as what changed since the same range
    # of the tensor at ``txn`` (version a of the same tensor, on the same daemons:
    # ``version_group``). Answer: OK with the changes (``deltas``: indices or a
    # bitmap and the new values, or the whole range when that is no larger) and
    # b's shard version; NOT_FOUND if this daemon holds no such shard of a (a
    # pruned version): the reader reads the range whole.
    DIFF = 22


# The payload of a MAPPED answer or a STAGED request: one byte offset.
LOCATION = struct.Struct("<Q")
# What an ATTACH answer says: the daemon's node name, the host identity
# (boot id and network namespace: a client elsewhere must not use shm), and
# the arena memfd's size in bytes; and, from daemons that have one, where the
# shard directory sits in it: "directory": [byte offset, slots]
# (``protocol/directory.py``).
ATTACH_KEYS = ("node", "host", "arena_size")
# RENAME request: the tensor's name now and the name it takes.
RENAME_KEYS = ("from", "to")
# RDMA_CONNECT request: the client's queue pair {"qpn", "psn", "gid"} (gid:
# a RoCE v2 IPv4-mapped GID), its MTU in bytes, and the staging size it wants.
RDMA_CONNECT_KEYS = ("qp", "mtu", "staging")
# RDMA_CONNECT answer: the daemon's queue pair, the path MTU both use, the
# arena's address, read-only rkey and size, and the staging area's address,
# write-only rkey and size (a block of the arena, for this connection only).
RDMA_ANSWER_KEYS = (
    "qp",
    "mtu",
    "arena_addr",
    "arena_rkey",
    "arena_size",
    "staging_addr",
    "staging_rkey",
    "staging_size",
)

# AUTH FRAMES: mutual HMAC-SHA256 challenge-response over the cluster's shared
# secret (``irdma.auth`` computes and checks them). A daemon whose config has
# a ``secret_file`` answers any other op on a connection that has not passed
# it with AUTH_FAILED (a reason as the payload, no data) and closes it.
# ``shard`` carries the step:
#   1 CHALLENGE  request: the client's fresh nonce (AUTH_NONCE bytes);
#                answer: the daemon's fresh nonce, then the daemon's proof
#                HMAC(secret, "irdma-auth-v1 daemon" | client nonce | daemon nonce).
#   2 PROOF      request: the client's proof
#                HMAC(secret, "irdma-auth-v1 client" | client nonce | daemon nonce);
#                answer: OK, no payload. The connection is authenticated.
# A recorded handshake is useless on another connection: the daemon's nonce
# is new each time. Refusals answer AUTH_FAILED with the reason as text.
AUTH_NONCE = 32
AUTH_PROOF = 32  # SHA-256


class AuthStep(enum.IntEnum):
    CHALLENGE = 1
    PROOF = 2


BATCH_OPS = frozenset({Op.READ_BATCH, Op.WRITE_BATCH, Op.ACCUMULATE_BATCH})
# Ops whose request payload is data the daemon stores (the rest carry JSON or nothing).
DATA_OPS = frozenset({Op.WRITE, Op.ACCUMULATE, Op.WRITE_BATCH, Op.ACCUMULATE_BATCH})


class Flag(enum.IntFlag):
    NONE = 0
    RESPONSE = 1
    # The response payload was sent zero-copy from daemon memory: the client
    # must answer with RELEASE once it has received the payload.
    PINNED = 2
    # CREATE: replace an existing tensor of another dtype or shape.
    REPLACE = 4
    # CREATE: fail if the tensor exists at all.
    EXCLUSIVE = 8
    # WRITE / ACCUMULATE from a shard's primary to a backup: ``version`` is the
    # version the update produces; the backup applies it only on top of the
    # version before it.
    REPLICA = 16
    # READ answer on a shm or rdma connection: the payload is LOCATION (the data's
    # byte offset in the daemon's arena, pinned until RELEASE), not the data.
    MAPPED = 32
    # WRITE / ACCUMULATE on a shm or rdma connection: the payload is LOCATION
    # (where the data sits in the connection's staging memory), not the data.
    # With REPLICA: the payload says where the bytes lie in the sending daemon's
    # arena, lent to a backup on its host (psd/replication/lending.py).
    STAGED = 64
    # REPLICA ACCUMULATE: a training worker's push, forwarded so a backup that
    # takes over knows it; ``step`` carries the push's step << 16 | its worker
    # (ranks < MAX_WORKERS = 2**16).
    PUSHED = 128
    # PUSHED, held by the primary until its lockstep step is complete: the
    # backup holds it too, not applied; ``version`` is the shard version it sits
    # on (nothing is produced).
    HELD = 256
    # CREATE: only check that this daemon would create (or keep) the tensor now:
    # its layout against what exists, and room for its shards. Nothing changes.
    CHECK = 512


class Status(enum.IntEnum):
    OK = 0
    BAD_FRAME = 1
    BAD_VERSION = 2
    BAD_OP = 3
    BAD_ARGUMENT = 4
    NOT_FOUND = 5
    EXISTS = 6
    DTYPE_MISMATCH = 7
    SHAPE_MISMATCH = 8
    OUT_OF_RANGE = 9
    NO_SPACE = 10
    TOO_LARGE = 11
    NOT_OWNER = 12
    INTERNAL = 13
    # The tensor was redefined (dtype, shape or shard size) since the client
    # cached its layout: re-read the metadata and retry.
    STALE_LAYOUT = 14
    # A read for a training step that is not reached yet, after the daemon
    # waited as long as it waits per request: ask again.
    NOT_READY = 15
    # A worker the request waits for fell silent for the mode's worker_timeout.
    WORKER_LOST = 16
    # The requesting worker was evicted for silence; it may not push or wait.
    EVICTED = 17
    # An accumulate for a step the tensor is not at (already applied, ahead,
    # or pushed twice).
    BAD_STEP = 18
    # The daemon is catching up after a restart or partition and does not
    # serve this shard yet: ask another replica.
    RECOVERING = 19
    # The daemon cannot reach a majority of the cluster (the minority side of
    # a partition): it refuses updates rather than letting replicas diverge.
    NO_QUORUM = 20
    # A backup that has not yet received an update the client saw
    # acknowledged (or a forwarded update not on top of its version): ask
    # the primary (which re-sends the whole shard).
    BEHIND = 21
    # The connection did not authenticate (no secret, wrong secret, a replayed
    # handshake, or an op before AUTH); the payload says which. Closed after.
    AUTH_FAILED = 22
    # A read asked for the copy of a shard made by one whole-tensor write
    # (its stamp) and this daemon no longer has it: read the tensor again.
    STAMP_GONE = 23
    # A read asked for the copy of a whole-tensor write this shard has not
    # received yet (the write is still on its way): read it again shortly.
    STAMP_PENDING = 24
    # The request was routed with another epoch than the daemon's (a daemon
    # joined or left): the payload is the daemon's epoch record (JSON,
    # ``irdma.cluster.epochs.Epoch``); route again with it.
    STALE_EPOCH = 25
    # CREATE: the name is held under another key (a tensor renamed to it), or
    # the key under another name (a tensor renamed from it): find the tensor
    # by its name, then create at its key, or at another key for the name.
    MOVED = 26
    # A WRITE of a whole-tensor write whose stamp is not later than the stamp of
    # the whole write the shard holds: the answer's ``stamp`` is that one. The
    # writer stamps its write above it and writes every shard again, so all
    # shards end with the same write (``irdma.client.stamps``).
    STALE_STAMP = 27


# Stored dtypes. Always little-endian on the wire and in the arena.
DTYPE_CODES: dict[str, int] = {
    "bool": 1,
    "int8": 2,
    "uint8": 3,
    "int16": 4,
    "uint16": 5,
    "int32": 6,
    "uint32": 7,
    "int64": 8,
    "uint64": 9,
    "float16": 10,
    "float32": 11,
    "float64": 12,
    "complex64": 13,
    "complex128": 14,
    # Added later (the codes above keep their numbers): the ml_dtypes floats
    # (irdma.dtypes). bfloat16 has the code the wire dtype bfloat16 had first.
    "bfloat16": 15,
    "float8_e4m3fn": 16,
    "float8_e5m2": 17,
}
DTYPE_NAMES: dict[int, str] = {code: name for name, code in DTYPE_CODES.items()}
# dtype code 0 in a header means "not stated"; the daemon then skips the check.
DTYPE_ANY = 0
# Dtypes a float tensor's values may travel in, narrower than stored
# (``irdma.narrowing`` converts): the header's ``wire`` field, with the codes
# of the stored dtypes. A bfloat16 value is the upper 16 bits of a float32.
# With a wire dtype, ``size`` (and a batch entry's length) still counts the
# tensor's bytes; the payload is that many elements in the wire dtype.
WIRE_BFLOAT16 = DTYPE_CODES["bfloat16"]
WIRE_NAMES: dict[int, str] = {
    DTYPE_CODES["float16"]: "float16",
    DTYPE_CODES["float32"]: "float32",
    WIRE_BFLOAT16: "bfloat16",
}


class ProtocolError(Exception):
    """A frame or payload that does not follow the wire format."""


def dtype_code(dtype: Any) -> int:
    """The wire code of a numpy dtype; raises ValueError for unsupported ones."""
    dt = np.dtype(dtype)
    name = dt.newbyteorder("<").name if dt.byteorder == ">" else dt.name
    try:
        return DTYPE_CODES[name]
    except KeyError:
        raise ValueError(unsupported_dtype(dt)) from None


def unsupported_dtype(dtype: Any) -> str:
    """The error for a dtype irdma does not store: which it is, and which it does."""
    return f"unsupported dtype {dtype}; irdma stores {', '.join(DTYPE_CODES)}"


def dtype_from_code(code: int) -> np.dtype:
    """The little-endian numpy dtype of a wire code; raises ValueError if unknown."""
    try:
        return np.dtype(DTYPE_NAMES[code]).newbyteorder("<")
    except KeyError:
        raise ValueError(f"unknown dtype code {code}") from None


# A model version's tensors (``policy/@7/w``: a name with one ``@<number>``
# part, ``irdma.client.manifests``) are placed by their group (``policy/@/w``),
# so every version of one tensor has its shards on the same daemons and one
# daemon can compare two versions (DIFF). Their keys carry the mark in their top
# bits, then a hash of the group, then the version's low bits; placement takes
# such a key without the version's bits (``placement_key``), any other key whole.
GROUP_MARK = 0xD1FF5E
GROUP_MARK_SHIFT = 40
GROUP_VERSION_BITS = 16
_GROUP_HASH_MASK = (1 << (GROUP_MARK_SHIFT - GROUP_VERSION_BITS)) - 1
_VERSION_MASK = (1 << GROUP_VERSION_BITS) - 1


def version_group(name: str) -> tuple[str, int] | None:
    """(group, version) of a model version's tensor name (``("policy/@/w", 7)`` for
    ``policy/@7/w``); None for any other name."""
    if "/@" not in name:
        return None
    parts = name.split("/")
    for i, part in enumerate(parts):
        if len(part) > 1 and part[0] == "@" and part[1:].isdigit() and int(part[1:]) > 0:
            return "/".join([*parts[:i], "@", *parts[i + 1 :]]), int(part[1:])
    return None


def placement_key(key: int) -> int:
    """What placement hashes for ``key``: a version tensor's group (its key without
    the version's bits), any other key as it is."""
    if key >> GROUP_MARK_SHIFT == GROUP_MARK:
        return key & ~_VERSION_MASK
    return key


def tensor_key(name: str, salt: int = 0) -> int:
    """The 64-bit key a tensor of that name is placed by, the same in every process.

    Salt 0 is the name's own key. A tensor renamed keeps the key it had, so
    a new tensor of the old name finds that key taken and takes the first
    free salted key instead (``TensorMeta.place``). A model version's tensor
    has a grouped key (``version_group``) unless salted.
    """
    if not salt:
        grouped = version_group(name)
        if grouped is not None:
            group, version = grouped
            h = int.from_bytes(hashlib.blake2b(group.encode(), digest_size=8).digest(), "little")
            return (
                (GROUP_MARK << GROUP_MARK_SHIFT)
                | ((h & _GROUP_HASH_MASK) << GROUP_VERSION_BITS)
                | (version & _VERSION_MASK)
            )
    raw = name.encode() if not salt else f"{name}\0{salt}".encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


def validate_name(name: str) -> str:
    """Check a tensor name (``model/layer.weight``); return it or raise ValueError."""
    if not isinstance(name, str) or not name:
        raise ValueError("tensor name must be a non-empty string")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. "\udc80" from JSON) cannot be hashed by tensor_key.
        raise ValueError("tensor name is not valid UTF-8 (contains a lone surrogate)") from None
    if len(raw) > MAX_NAME_BYTES:
        raise ValueError(f"tensor name is {len(raw)} bytes, over {MAX_NAME_BYTES}")
    if "\0" in name:
        raise ValueError("tensor name contains a NUL character")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(
                f"tensor name {name!r} has an empty, '.' or '..' component; "
                "use names like 'model/layer.weight'"
            )
    return name


class Header(NamedTuple):
    """The fixed header of every frame, as its fields (see HEADER for the bytes).

    A NamedTuple rather than a frozen dataclass: one is built for every frame
    sent and received, and a tuple is four times cheaper to make. Which
    fields mean what for each request kind is ``messages``' business.
    """

    op: int
    request_id: int = 0
    key: int = 0
    shard: int = 0
    offset: int = 0
    size: int = 0
    length: int = 0
    version: int = 0
    alpha: float = 1.0
    layout: int = 0
    flags: int = 0
    status: int = 0
    dtype: int = DTYPE_ANY
    proto: int = PROTOCOL_VERSION
    worker: int = NO_WORKER
    step: int = 0
    txn: int = 0
    wire: int = 0
    stamp: int = 0
    epoch: int = 0

    @property
    def is_response(self) -> bool:
        return bool(self.flags & 1)  # Flag.RESPONSE; int math, enum ops are slow

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC,
            self.proto,
            self.op,
            self.flags,
            self.status,
            self.dtype,
            self.shard,
            self.request_id,
            self.key,
            self.offset,
            self.size,
            self.length,
            self.version,
            self.alpha,
            self.layout,
            self.worker,
            self.wire,
            self.epoch,
            self.step,
            self.txn,
            self.stamp,
        )

    def response(
        self,
        status: int = Status.OK,
        *,
        length: int = 0,
        flags: int = 0,
        version: int | None = None,
    ) -> Header:
        """The response header for this request (its fields echoed, payload ``length``)."""
        return Header(
            self.op,
            self.request_id,
            self.key,
            self.shard,
            self.offset,
            self.size,
            length,
            self.version if version is None else version,
            self.alpha,
            self.layout,
            Flag.RESPONSE | flags,
            int(status),
            self.dtype,
            self.proto,
            self.worker,
            self.step,
            self.txn,
            self.wire,
            self.stamp,
        )


def pack_response(
    request: Header,
    status: int = 0,
    length: int = 0,
    flags: int = 0,
    version: int | None = None,
    stamp: int | None = None,
    txn: int | None = None,
) -> bytes:
    """``request.response(...).pack()`` without building the response Header (the
    daemon answers every request: this is on its hot path)."""
    r = request
    return HEADER.pack(
        MAGIC,
        r.proto,
        r.op,
        1 | flags,  # Flag.RESPONSE
        status,
        r.dtype,
        r.shard,
        r.request_id,
        r.key,
        r.offset,
        r.size,
        length,
        r.version if version is None else version,
        r.alpha,
        r.layout,
        r.worker,
        r.wire,
        0,
        r.step,
        r.txn if txn is None else txn,
        r.stamp if stamp is None else stamp,
    )


def pack_header(**fields: Any) -> bytes:
    return Header(**fields).pack()


def unpack_header(data: bytes | bytearray | memoryview) -> Header:
    """Parse a 112-byte header; raises ProtocolError for a bad magic (garbage).

    Only the framing is checked here; op, version and field values are
    checked by whoever handles the frame, so they can answer with a status.
    """
    if len(data) != HEADER_SIZE:
        raise ProtocolError(f"header is {len(data)} bytes, expected {HEADER_SIZE}")
    (
        magic,
        proto,
        op,
        flags,
        status,
        dtype,
        shard,
        rid,
        key,
        offset,
        size,
        length,
        version,
        alpha,
        layout,
        worker,
        wire,
        epoch,
        step,
        txn,
        stamp,
    ) = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    return Header(
        op=op,
        request_id=rid,
        key=key,
        shard=shard,
        offset=offset,
        size=size,
        length=length,
        version=version,
        alpha=alpha,
        layout=layout,
        flags=flags,
        status=status,
        dtype=dtype,
        proto=proto,
        worker=worker,
        step=step,
        txn=txn,
        wire=wire,
        stamp=stamp,
        epoch=epoch,
    )


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One sub-request (or its answer) inside a batch op."""

    key: int
    shard: int = 0
    offset: int = 0
    length: int = 0
    version: int = 0
    alpha: float = 1.0
    status: int = Status.OK
    dtype: int = DTYPE_ANY

    def pack(self) -> bytes:
        return ENTRY.pack(
            self.key,
            self.offset,
            self.length,
            self.version,
            self.alpha,
            self.shard,
            self.status,
            self.dtype,
        )


def pack_entries(entries: list[BatchEntry]) -> bytes:
    return b"".join(e.pack() for e in entries)


def unpack_entries(data: bytes | bytearray | memoryview, count: int) -> list[BatchEntry]:
    """Parse ``count`` entries from the start of a batch payload."""
    need = count * ENTRY_SIZE
    if len(data) < need:
        raise ProtocolError(f"batch of {count} entries needs {need} bytes, got {len(data)}")
    out = []
    for i in range(count):
        key, offset, length, version, alpha, shard, status, dtype = ENTRY.unpack_from(
            data, i * ENTRY_SIZE
        )
        out.append(BatchEntry(key, shard, offset, length, version, alpha, status, dtype))
    return out


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """What a tensor is: its name, element type, shape and how it is cut into shards."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    shard_size: int
    options: dict[str, Any] = field(default_factory=dict)
    # The key the tensor is placed by when it is not its name's own (0): it was
    # renamed (and kept its shards where they were) or created while another
    # tensor held its name's key (see ``tensor_key``).
    place: int = 0
    # Derived once (hashing on every request showed up in profiles).
    key: int = field(init=False, repr=False, compare=False)
    layout: int = field(init=False, repr=False, compare=False)
    np_dtype: np.dtype = field(init=False, repr=False, compare=False)
    nbytes: int = field(init=False, repr=False, compare=False)
    num_shards: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_name(self.name)
        if self.dtype not in DTYPE_CODES:
            raise ValueError(unsupported_dtype(repr(self.dtype)))
        if len(self.shape) > MAX_DIMS:
            raise ValueError(f"shape has {len(self.shape)} dimensions, over {MAX_DIMS}")
        if _nesting(self.options) > MAX_OPTION_DEPTH:
            raise ValueError(f"options are nested more than {MAX_OPTION_DEPTH} levels deep")
        if any((not isinstance(d, int)) or isinstance(d, bool) or d < 0 for d in self.shape):
            raise ValueError(f"shape {self.shape} must be non-negative integers")
        itemsize = np.dtype(self.dtype).itemsize
        if (
            not isinstance(self.shard_size, int)
            or isinstance(self.shard_size, bool)
            or self.shard_size <= 0
            or self.shard_size % itemsize
        ):
            raise ValueError(
                f"shard size {self.shard_size} must be a positive multiple of the "
                f"item size {itemsize}"
            )
        if not isinstance(self.place, int) or isinstance(self.place, bool):
            raise ValueError(f"place {self.place!r} must be an integer key")
        if not 0 <= self.place < 1 << 64:
            raise ValueError(f"place {self.place} is not a 64-bit key")
        own = tensor_key(self.name)
        if self.place == own:
            object.__setattr__(self, "place", 0)
        object.__setattr__(self, "key", self.place or own)
        # Fingerprint of name, dtype, shape and shard size: requests carry it so
        # a daemon can tell a client whose cached layout is stale (redefined, or
        # renamed: a reader of the old name must not read on). Never 0.
        shape = ",".join(map(str, self.shape))
        text = f"{self.dtype}|{shape}|{self.shard_size}|{self.name}"
        object.__setattr__(self, "layout", tensor_key(text) | 1)
        dt = np.dtype(self.dtype).newbyteorder("<")
        nbytes = dt.itemsize
        for d in self.shape:
            nbytes *= d
        object.__setattr__(self, "np_dtype", dt)
        object.__setattr__(self, "nbytes", nbytes)
        # A zero-size tensor still has shard 0.
        num_shards = max(1, -(-nbytes // self.shard_size))
        if num_shards > MAX_SHARDS:
            raise ValueError(
                f"{nbytes} bytes in shards of {self.shard_size} is {num_shards} shards, "
                f"over {MAX_SHARDS}; use a larger shard size"
            )
        object.__setattr__(self, "num_shards", num_shards)

    @property
    def dtype_code(self) -> int:
        return DTYPE_CODES[self.dtype]

    def shard_span(self, index: int) -> tuple[int, int]:
        """(byte offset in the tensor, byte length) of shard ``index``."""
        if not 0 <= index < self.num_shards:
            raise ValueError(f"shard {index} out of range 0..{self.num_shards - 1}")
        start = index * self.shard_size
        return start, max(0, min(self.shard_size, self.nbytes - start))

    def same_layout(self, other: TensorMeta) -> bool:
        return (self.dtype, self.shape, self.shard_size) == (
            other.dtype,
            other.shape,
            other.shard_size,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "shard_size": self.shard_size,
            "options": self.options,
        }
        if self.place:
            out["place"] = self.place
        return out

    @staticmethod
    def key_of(d: dict[str, Any]) -> int:
        """The key a stat record's ``meta`` places its tensor by (without checking
        the rest of it, as ``from_dict`` does)."""
        return int(d.get("place") or tensor_key(d["name"]))

    @classmethod
    def from_dict(cls, d: Any) -> TensorMeta:
        """Build from decoded JSON; raises ValueError naming what is wrong."""
        if not isinstance(d, dict):
            raise ValueError("tensor metadata must be a JSON object")
        try:
            shape = d["shape"]
            if not isinstance(shape, list):
                raise ValueError("shape must be a list")
            options = d.get("options", {})
            if not isinstance(options, dict):
                raise ValueError("options must be an object")
            return cls(
                name=d["name"],
                dtype=d["dtype"],
                shape=tuple(shape),
                shard_size=d["shard_size"],
                options=options,
                place=d.get("place", 0),
            )
        except KeyError as exc:
            raise ValueError(f"tensor metadata lacks {exc.args[0]!r}") from None
        except TypeError as exc:
            raise ValueError(f"bad tensor metadata: {exc}") from None


def _nesting(value: Any) -> int:
    """How deep lists and dicts nest in ``value`` (without recursing itself)."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list | tuple):
            depth += 1
            if depth > MAX_OPTION_DEPTH:
                return depth
            deepest = max(deepest, depth)
            stack.extend((x, depth) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def encode_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_json(data: bytes | bytearray | memoryview) -> Any:
    """Decode a JSON payload; raises ProtocolError if it is not valid JSON."""
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # RecursionError: nested deeper than the interpreter's stack (b"[" * 100_000).
        raise ProtocolError(f"payload is not valid JSON: {exc}") from None
