"""An in-process fuzzing harness for psd's frame parser and request handlers.

One ``Server`` (the real one, with its real ``Store`` and arena) serves each
fuzz input on a fresh ``socketpair``: the input's bytes go in, the write side
is shut, and the daemon's replies are read until it closes its end. Nothing
is mocked between the socket and the store, so the path under test is the
one a TCP or shm peer reaches; the shm session (MAPPED reads, STAGED writes)
is a real mapping of a sealed memfd, as ``ShmListener`` would attach.

After every input the harness checks (``Outcome.problems``):

- the daemon closed its end within ``hang_timeout`` of the input's end
  (a hang otherwise), and logged no internal error (an exception that
  escaped a handler: a crash of that connection);
- every reply is a well-formed response frame with a known status, whole,
  and an OK answer that should carry JSON carries valid JSON;
- no tensor changed unless an OK reply says it was updated (the request's
  key, or a batch entry's), nothing is pinned once the connection is gone,
  and the arena holds exactly the shards plus the deltas held for training
  steps (no staging block leaked);
- a fresh connection still gets HELLO and a byte-exact read answered.

Then the store is put back to the baseline tensors, so inputs do not depend
on one another.

Two clusters: one copy per shard (n1 of n1, n2), where replication messages
are refused; and two copies (n1 of n1, n2, n3), where n1 is ready with n2 up
and ready and n3 down, so it serves clients as the primary of some shards
and takes forwarded updates and shard copies from n2 as the backup of
others. There n2 and n3 are stand-ins on loopback that answer every frame
OK, so n1's real forwarding (``Replicator``'s senders) runs to completion.

``shape_input`` makes raw fuzzer bytes structure-aware (real magic and
version, keys that name existing tensors); ``seed_inputs`` are valid and
near-valid requests for every op, the corpus a fuzzer starts from.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import tempfile
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trio
from irdma_psd.arena import Arena
from irdma_psd.membership import PeerState
from irdma_psd.replication import Replicator
from irdma_psd.server import Server
from irdma_psd.shm import ShmSession
from irdma_psd.store import Store

from irdma.cluster import Address, ClusterConfig, ConfigInForce, Node
from irdma.protocol import (
    BATCH_OPS,
    ENTRY,
    ENTRY_SIZE,
    HEADER_SIZE,
    LOCATION,
    MAGIC,
    MAX_ERROR_MESSAGE,
    PROTOCOL_VERSION,
    BatchEntry,
    Flag,
    Header,
    Op,
    ProtocolError,
    Status,
    TensorMeta,
    decode_json,
    encode_json,
    pack_entries,
    tensor_key,
    unpack_header,
)
from irdma.transport.base import StreamBroken, StreamClosed
from irdma.transport.shm import make_staging
from irdma.transport.tcp import FramedSocket, to_stdlib

ME = "n1"
OTHER = "n2"
THIRD = "n3"  # down, in the replicated cluster
SHARD_SIZE = 4096
STAGING_SIZE = 1 << 20
# Tensors every input finds in place: every dtype width, several shards (some
# held by the other node), a zero-size one, one large enough for zero-copy
# (sendfile, or MAPPED over shm) reads, and each training mode.
BASELINE: list[tuple[str, str, tuple[int, ...], int, dict[str, Any]]] = [
    ("f32", "float32", (3000,), SHARD_SIZE, {}),
    # Replicated: shard 0 has n2 as primary and n1 as backup (takes copies from n2).
    ("backup", "float32", (100,), SHARD_SIZE, {}),
    ("u8", "uint8", (9000,), SHARD_SIZE, {}),
    ("i16", "int16", (64,), SHARD_SIZE, {}),
    ("i64", "int64", (16,), SHARD_SIZE, {}),
    ("bool", "bool", (10,), SHARD_SIZE, {}),
    ("c64", "complex64", (8,), SHARD_SIZE, {}),
    ("f16", "float16", (33,), SHARD_SIZE, {}),
    ("empty", "float64", (0,), SHARD_SIZE, {}),
    ("big", "float32", (65536,), 256 << 10, {}),
    (
        "sync",
        "float32",
        (16,),
        SHARD_SIZE,
        {"mode": "sync", "workers": 2, "worker_timeout": 0.05, "on_timeout": "evict"},
    ),
    (
        "ssp",
        "float64",
        (8,),
        SHARD_SIZE,
        {"mode": "ssp", "workers": 2, "slack": 1, "worker_timeout": 0.05},
    ),
    ("hybrid", "float32", (8,), SHARD_SIZE, {"mode": "hybrid", "workers": 4, "groups": 2}),
    ("set", "float32", (4,), SHARD_SIZE, {"mode": "sync", "workers": 1, "apply": "set"}),
]
# Names seeds create (and the harness deletes again after each input).
NEW_NAMES = ("fz/new", "fz/new/deeper")
# A header or batch-entry key below this, in a shaped input, stands for
# entry ``key % len(keys)`` of the harness's key table.
KEY_INDEX_LIMIT = 256

# Byte offsets of header fields (see irdma.protocol.HEADER).
_OP, _FLAGS, _SHARD, _KEY, _LENGTH, _LAYOUT = 5, 6, 12, 24, 48, 72
_Q = struct.Struct("<Q")
_I = struct.Struct("<I")

# JSON bodies the daemon is answered with on OK (checked to decode).
_JSON_ANSWERS = frozenset({Op.HELLO, Op.CREATE, Op.STAT, Op.LIST, Op.PING, Op.CATCHUP})
_MUTATING = frozenset({Op.CREATE, Op.DELETE, Op.WRITE, Op.ACCUMULATE, Op.SYNC})


@dataclass
class Outcome:
    """What one input did and every problem found with it (empty: all well)."""

    replies: list[Header] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    hang: bool = False
    crash: bool = False  # an exception escaped a handler (logged as an internal error)
    changed: bool = False  # some tensor changed (by an accepted request)


class _Capture(logging.Handler):
    """Collects psd's error records (an escaped exception is logged at ERROR)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _golden(name: str, nbytes: int) -> bytes:
    seed = zlib.crc32(name.encode())
    return np.random.default_rng(seed).bytes(nbytes)


class Harness:
    """One psd server (node n1), fed inputs in-process; ``replicated``: two copies per shard.

    Use it inside ``async with harness.serving():`` (the replicated
    cluster's stand-in peers and forwarding tasks run there).
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        replicated: bool = False,
        arena_size: int = 8 << 20,
        hang_timeout: float = 5.0,
        probe_every: int = 1,
    ) -> None:
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="irdma-fuzz-")
            data_dir = Path(self._tmp.name)
        self.replicated = replicated
        names = (ME, OTHER, THIRD) if replicated else (ME, OTHER)
        # The replicated cluster's peers: loopback listeners that answer OK.
        self._peer_listeners: list[socket.socket] = []
        ports = [1] * len(names)
        if replicated:
            for i in (1, 2):
                listener = socket.socket()
                listener.bind(("127.0.0.1", 0))
                listener.listen(16)
                self._peer_listeners.append(listener)
                ports[i] = listener.getsockname()[1]
        nodes = tuple(
            Node(name, Address("tcp", "127.0.0.1", port), data_dir / name, arena_size)
            for name, port in zip(names, ports, strict=True)
        )
        # timeout/4 is how long a read waits for a training step: keep it short.
        self.config = ClusterConfig(
            nodes=nodes,
            shard_size=SHARD_SIZE,
            timeout=0.2,
            replicas=2 if replicated else 1,
            failure_timeout=2.0,
        )
        self.node = nodes[0]
        arena = Arena(arena_size, name="irdma-fuzz-arena")
        in_force = ConfigInForce(self.config)
        self.store = Store(
            arena, lambda key, shard: in_force.config.holds(ME, key, shard), replicated=replicated
        )
        self.server = Server(
            in_force, self.node, self.store, Replicator(in_force, self.node, self.store)
        )
        self.hang_timeout = hang_timeout
        self.probe_every = probe_every
        self.inputs = 0
        staging_fd = make_staging(STAGING_SIZE)
        try:
            with os.fdopen(os.dup(staging_fd), "r+b") as f:
                f.write(_golden("staging", STAGING_SIZE))
            self.session = ShmSession(staging_fd, STAGING_SIZE, "fuzz")
        finally:
            os.close(staging_fd)
        self.metas: dict[int, TensorMeta] = {}
        self.golden: dict[int, bytes] = {}
        for short, dtype, shape, shard_size, options in BASELINE:
            name = self._held_name(short, backup=short == "backup" and replicated)
            meta = TensorMeta(name, dtype, shape, shard_size, options)
            self.metas[meta.key] = meta
            self.golden[meta.key] = _golden(meta.name, meta.nbytes)
            self._restore(meta)
        self.names = {
            short: m for (short, *_), m in zip(BASELINE, self.metas.values(), strict=True)
        }
        self.keys: list[int] = [
            *self.metas,
            *(tensor_key(n) for n in NEW_NAMES),
            0,
            1,
        ]
        self.baseline = self.fingerprint()
        self._reset_membership()
        self._log = logging.getLogger("psd")
        self._capture = _Capture()
        self._saved = (self._log.propagate, self._log.level)
        self._log.addHandler(self._capture)
        self._log.propagate = False  # routine warnings (garbage frames) are not printed
        self._log.setLevel(logging.WARNING)

    def close(self) -> None:
        self._log.removeHandler(self._capture)
        self._log.propagate, level = self._saved
        self._log.setLevel(level)
        self.session.close()
        self.store.arena.close()
        for listener in self._peer_listeners:
            listener.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- baseline ------------------------------------------------------------

    def _held_name(self, short: str, backup: bool = False) -> str:
        """A name for ``short`` whose shard 0 this node holds (placement is by hash).

        ``backup``: as the backup of n2; else as a primary with no live backup
        or with n2 as backup (never n3's backup: n3 is down, so that shard
        would have n1 as its acting primary anyway).
        """
        for i in range(1000):
            name = f"fz/{short}.{i}"
            order = [n.name for n in self.config.replicas_for(tensor_key(name), 0)]
            wanted = order == [OTHER, ME] if backup else order[0] == ME
            if wanted:
                return name
        raise AssertionError("no name places shard 0 here")

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Run what the inputs need besides the server: the replicated cluster's peers."""
        if not self.replicated:
            yield
            return
        replicator = self.server.replicator
        async with trio.open_nursery() as nursery:
            for listener in self._peer_listeners:
                sock = trio.socket.from_stdlib_socket(listener.dup())
                nursery.start_soon(_answer_everything_ok, sock)
            replicator.serve_in(nursery)
            for peer in replicator.peers.values():
                nursery.start_soon(replicator.forwarding.run, peer)
            try:
                yield
            finally:
                with trio.CancelScope(shield=True):
                    for peer in replicator.peers.values():
                        await peer.link.aclose()
                        peer.queue.skip_all()
                replicator.serve_in(None)
                nursery.cancel_scope.cancel()

    def _reset_membership(self) -> None:
        """Peers forgotten; replicated: n2 up and ready, n3 down, n1 ready with quorum."""
        m = self.server.membership
        for name in m.peers:
            m.peers[name] = PeerState()
        if self.replicated:
            m.heard(OTHER, ready=True)
            m.became_ready()
            self.server.replicator.catchup.asked.clear()

    def _restore(self, meta: TensorMeta) -> None:
        """Put a baseline tensor back: its metadata, version 0, its golden bytes."""
        if meta.key in self.store.tensors:
            self.store.delete(meta.key)
        tensor, _ = self.store.create(meta)
        data = self.golden[meta.key]
        for index, shard in tensor.shards.items():
            start, n = meta.shard_span(index)
            view = self.store.arena.view(shard.block, 0, n)
            view[:] = np.frombuffer(data, np.uint8, n, start)

    def fingerprint(self) -> dict[int, tuple]:
        """Per tensor: metadata and, per local shard, (version, CRC-32 of its bytes)."""
        out = {}
        arena = self.store.arena
        for key, t in self.store.tensors.items():
            shards = tuple(
                (i, s.version, zlib.crc32(arena.view(s.block, 0, s.nbytes)))
                for i, s in sorted(t.shards.items())
            )
            out[key] = (t.meta, shards)  # TensorMeta compares by value
        return out

    def reset(self, touched: set[int], now: dict[int, tuple] | None = None) -> None:
        """Back to the baseline: inputs' tensors deleted, changed ones restored, peers forgotten.

        ``touched`` tensors in a training mode are restored even if unchanged
        (their step bookkeeping may have moved); ``now`` is a fresh fingerprint.
        """
        if now is None:
            now = self.fingerprint()
        for key in list(self.store.tensors):
            if key not in self.metas:
                self.store.delete(key)
        for key, meta in self.metas.items():
            coord = key in touched and meta.options.get("mode")
            if coord or now.get(key) != self.baseline[key]:
                self._restore(meta)
        for peer in self.server.replicator.peers.values():
            peer.queue.skip_all()
        self.store.take_commits()

    # -- inputs --------------------------------------------------------------

    def key_of(self, short: str) -> int:
        return self.names[short].key

    def shape_input(self, data: bytes) -> tuple[bytes, bool]:
        """Turn raw fuzzer bytes into (stream, over shm?).

        Byte 0 is a control byte: bit 0 serves the stream as a shm client;
        bit 4 is left to the caller (which harness: see ``bench/fuzz.py``);
        bit 1 walks the stream frame by frame and writes the real magic and
        protocol version into each header (so mutations reach the handlers,
        not only the magic check); with bit 1, bit 2 also maps small keys
        (and layouts) to the harness's tensors, in headers and batch
        entries, and bit 3 cuts a length running past the end to fit.
        Without bit 1 the rest is sent as it is.
        """
        if not data:
            return b"", False
        ctl, body = data[0], bytearray(data[1:])
        if ctl & 2:
            self._fix_frames(body, map_keys=bool(ctl & 4), fit=bool(ctl & 8))
        return bytes(body), bool(ctl & 1)

    def _map_key(self, body: bytearray, at: int) -> None:
        (k,) = _Q.unpack_from(body, at)
        if k < KEY_INDEX_LIMIT:
            _Q.pack_into(body, at, self.keys[k % len(self.keys)])

    def _fix_frames(self, body: bytearray, *, map_keys: bool, fit: bool) -> None:
        metas = list(self.metas.values())
        p = 0
        while p + HEADER_SIZE <= len(body):
            body[p : p + 4] = MAGIC
            body[p + 4] = PROTOCOL_VERSION
            rest = len(body) - p - HEADER_SIZE
            (length,) = _Q.unpack_from(body, p + _LENGTH)
            if fit and length > rest:
                length = rest
                _Q.pack_into(body, p + _LENGTH, length)
            if map_keys:
                self._map_key(body, p + _KEY)
                (layout,) = _Q.unpack_from(body, p + _LAYOUT)
                if 0 < layout < KEY_INDEX_LIMIT:
                    _Q.pack_into(body, p + _LAYOUT, metas[layout % len(metas)].layout)
                if body[p + _OP] in BATCH_OPS:
                    (count,) = _I.unpack_from(body, p + _SHARD)
                    n = min(count, min(length, rest) // ENTRY_SIZE)
                    for i in range(n):
                        self._map_key(body, p + HEADER_SIZE + i * ENTRY_SIZE)
            if length > rest:
                break
            p += HEADER_SIZE + length

    # -- running one input ---------------------------------------------------

    async def run(self, data: bytes) -> Outcome:
        """Feed one raw fuzzer input (see ``shape_input``); check; reset."""
        stream, shm = self.shape_input(data)
        return await self.run_stream(stream, shm=shm)

    async def run_stream(self, stream: bytes, *, shm: bool = False) -> Outcome:
        """Serve ``stream`` on a fresh connection; check everything; reset the store."""
        out = Outcome()
        self._capture.records.clear()
        self._reset_membership()
        raw = await self._exchange(stream, shm, out)
        if out.hang:
            out.problems.append(f"hang: the daemon did not finish within {self.hang_timeout} s")
        allowed = check_replies(raw, out)
        for rec in self._capture.records:
            out.crash = True
            text = rec.getMessage()
            if rec.exc_info and rec.exc_info[1] is not None:
                exc = rec.exc_info[1]
                while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                    exc = exc.exceptions[0]
                text += f": {type(exc).__name__}: {exc}"
            out.problems.append(f"internal error: {text}")
        touched = {k for k in self.keys if _Q.pack(k) in stream}
        # Shard copies a SYNC_REQUEST queued for the stand-in peer are sent (and their
        # blocks pinned) by the replicator's sender, which outlives the connection that
        # asked: they are the replicator's, not the connection's, so let them go first.
        with trio.move_on_after(self.hang_timeout) as flushing:
            await self.server.replicator.forwarding.flush()
        if flushing.cancelled_caught:
            out.problems.append(f"hang: shard copies not sent within {self.hang_timeout} s")
        now = self.fingerprint()
        self._check_store(now, allowed, touched, out)
        self.reset(touched | allowed, now)
        self.inputs += 1
        if self.probe_every and self.inputs % self.probe_every == 0:
            await self._probe(out)
        return out

    async def _exchange(self, stream: bytes, shm: bool, out: Outcome) -> bytearray:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        received = bytearray()
        with trio.move_on_after(self.hang_timeout) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    self.server.handle_connection, theirs, "fuzz", self.session if shm else None
                )
                nursery.start_soon(_recv_all, ours, received)
                await _send_all(ours, stream)
                with contextlib.suppress(OSError):  # the daemon closed first
                    ours.shutdown(socket.SHUT_WR)
        out.hang = scope.cancelled_caught
        ours.close()
        theirs.close()
        return received

    def _check_store(
        self, now: dict[int, tuple], allowed: set[int], touched: set[int], out: Outcome
    ) -> None:
        for key in set(now) | set(self.baseline):
            if now.get(key) == self.baseline.get(key):
                continue
            out.changed = True
            meta = self.metas.get(key)
            in_mode = meta is not None and "mode" in meta.options
            if key in allowed or (in_mode and key in touched):
                continue  # an accepted update (or a training step it completed)
            name = meta.name if meta else f"key {key:#x}"
            out.problems.append(f"tensor {name} changed with no accepted update to it")
        used = 0
        for t in self.store.tensors.values():
            for s in t.shards.values():
                used += s.block.size
                if s.block.pins:
                    out.problems.append(
                        f"{t.meta.name} shard {s.index} still pinned {s.block.pins}x "
                        "after its connection closed"
                    )
            if t.coord is not None:
                used += sum(u.staging.size for u in t.coord.held() if u.staging is not None)
        if used != self.store.arena.used:
            out.problems.append(
                f"arena has {self.store.arena.used} bytes in use, tensors and held "
                f"deltas account for {used} (a leaked or doubly freed block)"
            )

    async def _probe(self, out: Outcome) -> None:
        """A fresh connection: HELLO and a read of the first baseline tensor, byte-exact."""
        meta = next(iter(self.metas.values()))
        frames = (
            Header(op=Op.HELLO, request_id=1).pack()
            + Header(op=Op.READ, request_id=2, key=meta.key, size=64, layout=meta.layout).pack()
        )
        probe = Outcome()
        raw = await self._exchange(frames, False, probe)
        expect = self.golden[meta.key][:64]
        ok = not probe.hang and len(raw) > HEADER_SIZE
        if ok:
            hello_length = unpack_header(raw[:HEADER_SIZE]).length
            ok = len(raw) == 2 * HEADER_SIZE + hello_length + 64 and raw[-64:] == expect
        if not ok:
            out.problems.append("the daemon no longer answers HELLO and a read correctly")

    # -- seeds ---------------------------------------------------------------

    def seed_inputs(self) -> Iterator[bytes]:
        """Valid and near-valid inputs for every op (control byte included)."""
        for stream, shm in self.seed_streams():
            yield bytes([0b1110 | shm | self.replicated << 4]) + stream

    def _idx(self, short: str) -> int:
        """The key-table index standing for a baseline tensor in a shaped input."""
        return list(self.metas).index(self.key_of(short))

    def seed_streams(self) -> Iterator[tuple[bytes, bool]]:
        f32 = self.names["f32"]
        big = self.names["big"]
        k = self._idx
        new = self.keys.index(tensor_key(NEW_NAMES[0]))

        def frame(op: int, payload: bytes = b"", **fields: Any) -> bytes:
            return Header(op=op, length=len(payload), **fields).pack() + payload

        create = encode_json(
            {"name": NEW_NAMES[0], "dtype": "float32", "shape": [2, 3], "shard_size": 4096}
        )
        yield frame(Op.HELLO), False
        yield frame(Op.LIST, b"fz/"), False
        yield frame(Op.STAT, key=k("f32")), False
        yield frame(Op.CREATE, create, key=new) + frame(Op.DELETE, key=new), False
        yield frame(Op.CREATE, create, key=new, flags=Flag.EXCLUSIVE), False
        new2 = self.keys.index(tensor_key(NEW_NAMES[1]))
        for options in (
            {"mode": "sync", "workers": 2, "worker_timeout": 1.5, "on_timeout": "evict"},
            {"mode": "hybrid", "workers": 4, "groups": 2, "apply": "add"},
            {"user": {"a": [1, [2, [3, {"b": None}]]]}, "raw": True},
        ):
            body = encode_json(
                {"name": NEW_NAMES[1], "dtype": "int32", "shape": [8], "shard_size": 16}
                | {"options": options}
            )
            yield frame(Op.CREATE, body, key=new2), False
        for short, *_ in BASELINE:
            meta = self.names[short]
            body = encode_json(meta.to_dict())
            yield frame(Op.CREATE, body, key=k(short), flags=Flag.REPLACE), False
            n = meta.shard_span(0)[1]
            yield frame(Op.READ, key=k(short), size=n, dtype=meta.dtype_code), False
            yield frame(Op.WRITE, b"\x01" * n, key=k(short), size=n), False
            yield frame(Op.ACCUMULATE, b"\x00" * n, key=k(short), size=n, alpha=2.0), False
            # Narrowed (float16, bfloat16 wire codes): refused unless the tensor is a wider float.
            for wire in (10, 15):
                yield (
                    frame(Op.ACCUMULATE, b"\x3c" * (n // 2), key=k(short), size=n, wire=wire),
                    False,
                )
                yield frame(Op.READ, key=k(short), size=n, wire=wire), False
        for shm in (False, True):
            yield (
                frame(Op.READ, key=k("big"), size=big.nbytes, request_id=7)
                + frame(Op.RELEASE, request_id=7),
                shm,
            )
            loc = LOCATION.pack(4096)
            yield frame(Op.WRITE, loc, key=k("f32"), size=64, flags=Flag.STAGED), shm
        entries = [
            BatchEntry(k("f32"), 0, 0, 16),
            BatchEntry(k("u8"), 0, 8, 8),
            BatchEntry(k("i64"), 0, 0, 8, alpha=3.0),
        ]
        head = pack_entries(entries)
        yield frame(Op.READ_BATCH, head, shard=3), False
        yield frame(Op.WRITE_BATCH, head + b"\x02" * 32, shard=3), False
        yield frame(Op.ACCUMULATE_BATCH, head + b"\x00" * 32, shard=3, txn=5), False
        yield frame(Op.ACCUMULATE_BATCH, head + b"\x00" * 32, shard=3, wire=15), False
        yield frame(Op.READ_BATCH, head, shard=3, wire=10), False
        yield frame(Op.WRITE_BATCH, head + b"\x02" * 30, shard=3), False  # does not add up
        for short in ("sync", "ssp", "hybrid", "set"):
            n = self.names[short].shard_span(0)[1]
            for worker in (0, 1):
                yield (
                    frame(Op.ACCUMULATE, b"\x00" * n, key=k(short), size=n, worker=worker, step=0)
                    + frame(Op.READ, key=k(short), size=n, worker=worker, step=1),
                    False,
                )
        # Replication traffic, as n2 (worker 1 names the sender): copies of
        # the shard n1 is n2's backup of, in the replicated cluster.
        backup = self.names["backup"]
        ping = encode_json({"node": OTHER, "ready": True, "boot": 1, "seq": 1, "handoff": True})
        yield frame(Op.PING, ping), False
        yield frame(Op.CATCHUP, encode_json({"node": OTHER})), False
        yield frame(Op.SYNC_REQUEST, encode_json({"node": OTHER, "shards": []})), False
        asked = [[backup.key, 0], [f32.key, 0]]
        yield frame(Op.SYNC_REQUEST, encode_json({"node": OTHER, "shards": asked})), False
        sync_meta = encode_json({"meta": backup.to_dict(), "version": 3, "txns": [[1, 2]]})
        n = backup.shard_span(0)[1]
        yield (
            frame(
                Op.SYNC,
                sync_meta + b"\x03" * n,
                key=k("backup"),
                offset=len(sync_meta),
                size=n,
                version=3,
                worker=1,
            ),
            False,
        )
        for op in (Op.WRITE, Op.ACCUMULATE):
            yield (
                frame(
                    op,
                    b"\x04" * 16,
                    key=k("backup"),
                    size=16,
                    flags=Flag.REPLICA,
                    worker=1,
                    version=1,
                ),
                False,
            )
        yield frame(Op.READ, key=k("f32"), shard=1, size=16, version=1, layout=f32.layout), False
        yield b"GET / HTTP/1.1\r\n\r\n", False


def check_replies(raw: bytes | bytearray, out: Outcome) -> set[int]:
    """Check the replies' framing; return the keys an OK answer says were updated."""
    allowed: set[int] = set()
    p = 0
    while p < len(raw):
        if len(raw) - p < HEADER_SIZE:
            out.problems.append(f"reply cut inside a header ({len(raw) - p} bytes)")
            break
        try:
            h = unpack_header(raw[p : p + HEADER_SIZE])
        except ProtocolError as exc:
            out.problems.append(f"reply is not a frame: {exc}")
            break
        out.replies.append(h)
        payload = raw[p + HEADER_SIZE : p + HEADER_SIZE + h.length]
        p += HEADER_SIZE + h.length
        if len(payload) < h.length:
            out.problems.append(f"reply to op {h.op} cut short: {len(payload)} of {h.length}")
            break
        echoed = h.proto == PROTOCOL_VERSION or h.status == Status.BAD_VERSION
        if not h.is_response or not echoed:
            out.problems.append(f"reply to op {h.op} is not a response: {h}")
        if h.status not in Status._value2member_map_:
            out.problems.append(f"reply to op {h.op} has unknown status {h.status}")
        if h.status != Status.OK:
            if h.length > MAX_ERROR_MESSAGE:
                out.problems.append(f"error message of {h.length} bytes")
            continue
        if h.op in _JSON_ANSWERS:
            try:
                decode_json(payload)
            except ProtocolError as exc:
                out.problems.append(f"OK answer to op {h.op} is not JSON: {exc}")
        if h.op in _MUTATING:
            allowed.add(h.key)
        elif h.op in (Op.WRITE_BATCH, Op.ACCUMULATE_BATCH):
            for i in range(len(payload) // ENTRY_SIZE):
                key, _o, _l, _v, _a, _s, status, _d = ENTRY.unpack_from(payload, i * ENTRY_SIZE)
                if status == Status.OK:
                    allowed.add(key)
    return allowed


async def _answer_everything_ok(listener: trio.socket.SocketType) -> None:
    """A stand-in peer daemon: takes every forwarded update and shard copy."""
    with listener:
        async with trio.open_nursery() as nursery:
            while True:
                sock, _ = await listener.accept()
                nursery.start_soon(_answer_ok, FramedSocket(to_stdlib(sock), "stand-in peer"))


async def _answer_ok(stream: FramedSocket) -> None:
    try:
        while (header := await stream.recv_header()) is not None:
            await stream.skip(header.length)
            await stream.send_all([header.response(Status.OK).pack()])
    except (StreamBroken, StreamClosed, ProtocolError):
        pass
    finally:
        stream.close()


async def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        except OSError:
            return  # the daemon closed its end: the rest is not read
        view = view[n:]


async def _recv_all(sock: socket.socket, into: bytearray) -> None:
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        except OSError:
            return
        if not chunk:
            return
        into += chunk
