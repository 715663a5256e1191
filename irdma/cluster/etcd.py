"""A small, typed etcd v3 client for trio, over etcd's JSON gateway (HTTP/1.1 + h11).

Why not a client from PyPI: the maintained ones (python-etcd3-async, aetcd,
etcetra, async-etcd3gw) run on asyncio (grpcio or aiohttp), and irdma's
daemons and clients run on trio; etcd3gw is blocking and watches in a
thread. etcd serves every v3 call as JSON at ``/v3/...`` on its client port
(the gRPC gateway, on by default since 3.4), so this module speaks that: h11
does the HTTP framing (sans-IO, as irdma's own protocol), trio the sockets.

What irdma needs, and only that: get / get a prefix, put (with a lease),
delete, a compare-and-swap transaction, leases (grant, keep alive, revoke)
and a watch of a prefix from a revision. Keys and values are bytes (the
gateway carries them base64-encoded); numbers arrive as JSON strings
(int64 in proto3 JSON) and are turned into ints here. Each call opens its
own connection to the first endpoint that answers (etcd calls are rare on
irdma's paths: membership changes, lease renewals, model version numbers); a
watch keeps one open. The blocking ``Client`` runs no trio: its calls go over
plain sockets through the same h11 framing (``blocking_post``).
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal
from urllib.parse import urlsplit

import h11
import trio

from ..errors import IrdmaError

# Most bytes one answer may have (a member list is a few KiB; a bound keeps a
# wrong server from making us allocate much).
MAX_ANSWER = 16 << 20
READ_SIZE = 65536
# HTTP statuses that say the server cannot serve now (overloaded, timing out,
# shutting down): another endpoint, or a later try, may.
UNAVAILABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class EtcdError(IrdmaError):
    """etcd could not be reached, or refused a request."""


class EtcdUnavailable(EtcdError):
    """No etcd endpoint answered."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int  # times the key was written since it was created
    lease: int  # 0: none


@dataclass(frozen=True, slots=True)
class Event:
    kind: Literal["put", "delete"]
    kv: KeyValue  # for a delete: the key and the revision it was deleted at


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction: ``key``'s ``target`` compared with ``value``."""

    key: bytes
    target: Literal["VERSION", "CREATE", "MOD", "VALUE", "LEASE"]
    result: Literal["EQUAL", "GREATER", "LESS", "NOT_EQUAL"]
    value: int | bytes

    def to_json(self) -> dict[str, Any]:
        field = {
            "VERSION": "version",
            "CREATE": "create_revision",
            "MOD": "mod_revision",
            "VALUE": "value",
            "LEASE": "lease",
        }[self.target]
        value = _b64(self.value) if isinstance(self.value, bytes) else str(self.value)
        return {"key": _b64(self.key), "target": self.target, "result": self.result, field: value}


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": _b64(self.key), "value": _b64(self.value)}
        if self.lease:
            body["lease"] = str(self.lease)
        return {"request_put": body}


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes
    prefix: bool = False

    def to_json(self) -> dict[str, Any]:
        body = {"key": _b64(self.key)}
        if self.prefix:
            body["range_end"] = _b64(prefix_end(self.key))
        return {"request_delete_range": body}


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    ttl: int  # seconds granted


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range that holds every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # the whole key space


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(raw.get("key")),
        value=_unb64(raw.get("value")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        version=int(raw.get("version", 0)),
        lease=int(raw.get("lease", 0)),
    )


def _revision(answer: dict[str, Any]) -> int:
    return int(answer.get("header", {}).get("revision", 0))


class Etcd:
    """Calls to an etcd cluster at ``endpoints`` ("http://host:port"), each within ``timeout``,
    made by ``post`` (``trio_post``, or ``blocking_post`` outside trio)."""

    def __init__(
        self, endpoints: Sequence[str], timeout: float = 5.0, post: Post | None = None
    ) -> None:
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint")
        self.endpoints = [self._address(e) for e in endpoints]
        self.timeout = timeout
        # How one call reaches etcd: trio's sockets unless the caller runs no trio.
        self.post = post or trio_post

    @staticmethod
    def _address(endpoint: str) -> tuple[str, int]:
        url = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"etcd endpoint {endpoint!r}: expected http://host:port")
        return url.hostname, url.port or 2379

    # -- keys ---------------------------------------------------------------------

    async def get(self, key: bytes) -> KeyValue | None:
        answer = await self.call("/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (sorted) and the revision they were read at."""
        body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        answer = await self.call("/v3/kv/range", body)
        return [_kv(raw) for raw in answer.get("kvs") or []], _revision(answer)

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Write ``key``; return the revision the write made."""
        answer = await self.call("/v3/kv/put", Put(key, value, lease).to_json()["request_put"])
        return _revision(answer)

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        """Delete ``key`` (every key under it, with ``prefix``); return how many were."""
        answer = await self.call(
            "/v3/kv/deleterange", Delete(key, prefix).to_json()["request_delete_range"]
        )
        return int(answer.get("deleted", 0))

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> tuple[bool, int]:
        """If every ``compare`` holds, do ``success``, else ``failure``, atomically;
        return (whether they held, the revision after)."""
        body = {
            "compare": [c.to_json() for c in compare],
            "success": [op.to_json() for op in success],
            "failure": [op.to_json() for op in failure],
        }
        answer = await self.call("/v3/kv/txn", body)
        return bool(answer.get("succeeded", False)), _revision(answer)

    # -- leases -------------------------------------------------------------------

    async def grant(self, ttl: int) -> Lease:
        answer = await self.call("/v3/lease/grant", {"TTL": str(ttl)})
        if answer.get("error"):
            raise EtcdError(f"etcd refused a lease of {ttl} s: {answer['error']}")
        return Lease(int(answer["ID"]), int(answer["TTL"]))

    async def keep_alive(self, lease: int) -> int:
        """Renew ``lease``; return its new TTL in seconds (0: it had expired)."""
        answer = await self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", answer).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """End ``lease`` now: the keys attached to it are deleted."""
        await self.call("/v3/lease/revoke", {"ID": str(lease)})

    # -- watching -------------------------------------------------------------------

    def watch(self, prefix: bytes, start_revision: int) -> Watch:
        """The changes under ``prefix`` from ``start_revision`` on, as an async context
        manager that iterates over batches of events (one per etcd message)::

            async with etcd.watch(b"/irdma/", rev + 1) as changes:
                async for events in changes:
                    ...

        A broken connection raises EtcdUnavailable (watch again from the
        revision after the last event seen); a ``start_revision`` etcd has
        compacted away raises EtcdError (read the prefix again, then watch).
        """
        create = {
            "key": _b64(prefix),
            "range_end": _b64(prefix_end(prefix)),
            "start_revision": str(start_revision),
        }
        return Watch(self, prefix, {"create_request": create})

    # -- HTTP -----------------------------------------------------------------------

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the first endpoint that answers; its JSON answer."""
        problems = []
        for host, port in self.endpoints:
            conn = h11.Connection(h11.CLIENT)
            request = request_bytes(conn, host, port, path, body)
            try:
                status, data = await self.post(host, port, conn, request, self.timeout)
                return _answer(path, status, data)
            except (OSError, trio.TooSlowError, h11.ProtocolError, EtcdUnavailable) as exc:
                problems.append(f"{host}:{port}: {exc or type(exc).__name__}")
        raise EtcdUnavailable(f"no etcd endpoint answered {path}: " + "; ".join(problems))


# One HTTP exchange: (host, port, the h11 connection that made the request, the
# request's bytes, the timeout) -> (status, body). ``trio_post`` under trio;
# ``blocking_post`` for a caller that runs no trio (the blocking ``Client``).
Post = Callable[[str, int, h11.Connection, bytes, float], Awaitable[tuple[int, bytes]]]


def request_bytes(
    conn: h11.Connection, host: str, port: int, path: str, body: dict[str, Any]
) -> bytes:
    """A POST of ``body`` as JSON to ``path``, as ``conn`` frames it."""
    payload = json.dumps(body).encode()
    headers = [
        ("Host", f"{host}:{port}"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(payload))),
    ]
    out = conn.send(h11.Request(method="POST", target=path, headers=headers))
    return out + conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage())


async def read_answer(
    conn: h11.Connection, receive: Callable[[], Awaitable[bytes]]
) -> tuple[int, bytes]:
    """The status and body of the answer ``receive`` brings, as ``conn`` parses it."""
    status = 0
    data = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await receive())
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            data += event.data
            if len(data) > MAX_ANSWER:
                raise EtcdError(f"etcd answer over {MAX_ANSWER} bytes")
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, bytes(data)


def _answer(path: str, status: int, data: bytes) -> dict[str, Any]:
    if status in UNAVAILABLE_STATUSES:
        raise EtcdUnavailable(f"etcd {path}: HTTP {status}")
    try:
        answer = json.loads(data) if data else {}
    except ValueError:
        raise EtcdError(f"etcd {path}: HTTP {status}, not JSON: {data[:200]!r}") from None
    if status != 200:
        raise EtcdError(f"etcd {path}: HTTP {status}: {answer.get('error', data[:200])}")
    return answer


async def trio_post(
    host: str, port: int, conn: h11.Connection, request: bytes, timeout: float
) -> tuple[int, bytes]:
    """One exchange over a trio stream, within ``timeout``."""
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(request)
            return await read_answer(conn, partial(stream.receive_some, READ_SIZE))


async def blocking_post(
    host: str, port: int, conn: h11.Connection, request: bytes, timeout: float
) -> tuple[int, bytes]:
    """One exchange over a plain socket (each wait within ``timeout``): it blocks the
    calling thread and never suspends, as the blocking client's requests do."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(request)

        async def receive() -> bytes:
            return sock.recv(READ_SIZE)

        return await read_answer(conn, receive)


class Watch:
    """An open watch: batches of events as etcd streams them, one JSON message per line."""

    PATH = "/v3/watch"

    def __init__(self, etcd: Etcd, prefix: bytes, body: dict[str, Any]) -> None:
        self.etcd, self.prefix, self.body = etcd, prefix, body
        self._stream: trio.SocketStream | None = None
        self._conn = h11.Connection(h11.CLIENT)
        self._pending = bytearray()

    async def __aenter__(self) -> Watch:
        problems = []
        for host, port in self.etcd.endpoints:
            try:
                with trio.fail_after(self.etcd.timeout):
                    self._stream = await trio.open_tcp_stream(host, port)
                    self._conn = h11.Connection(h11.CLIENT)
                    request = request_bytes(self._conn, host, port, self.PATH, self.body)
                    await self._stream.send_all(request)
                return self
            except (OSError, trio.TooSlowError) as exc:
                await self.aclose()
                problems.append(f"{host}:{port}: {exc or type(exc).__name__}")
        raise EtcdUnavailable(f"no etcd endpoint answered {self.PATH}: " + "; ".join(problems))

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> list[Event]:
        while True:
            line = await self._line()
            if "error" in line:
                raise EtcdError(f"etcd watch of {self.prefix!r} failed: {line['error']}")
            result = line.get("result") or {}
            if int(result.get("compact_revision", 0) or 0):
                raise EtcdError(
                    f"etcd watch of {self.prefix!r}: history compacted up to "
                    f"{result['compact_revision']}; read it again"
                )
            if result.get("canceled"):
                raise EtcdError(f"etcd canceled the watch of {self.prefix!r}")
            events = [
                Event("delete" if raw.get("type") == "DELETE" else "put", _kv(raw["kv"]))
                for raw in result.get("events") or []
            ]
            if events:
                return events

    async def _line(self) -> dict[str, Any]:
        """The next JSON message of the stream."""
        if self._stream is None:
            raise EtcdUnavailable(f"the etcd watch of {self.prefix!r} is closed")
        try:
            while True:
                end = self._pending.find(b"\n")
                if end >= 0:
                    line = bytes(self._pending[:end])
                    del self._pending[: end + 1]
                    if line.strip():
                        return json.loads(line)
                    continue
                event = self._conn.next_event()
                if event is h11.NEED_DATA:
                    self._conn.receive_data(await self._stream.receive_some(READ_SIZE))
                elif isinstance(event, h11.Response):
                    if event.status_code in UNAVAILABLE_STATUSES:
                        # e.g. 408 from a server stopping before the watch began
                        raise EtcdUnavailable(f"etcd {self.PATH}: HTTP {event.status_code}")
                    if event.status_code != 200:
                        raise EtcdError(f"etcd {self.PATH}: HTTP {event.status_code}")
                elif isinstance(event, h11.Data):
                    self._pending += event.data
                    if len(self._pending) > MAX_ANSWER:
                        raise EtcdError(f"etcd message over {MAX_ANSWER} bytes")
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    raise EtcdUnavailable(f"etcd ended the watch of {self.prefix!r}")
        except (OSError, trio.BrokenResourceError, h11.ProtocolError) as exc:
            raise EtcdUnavailable(f"the etcd watch of {self.prefix!r} broke: {exc}") from exc
