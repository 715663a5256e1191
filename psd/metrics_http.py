"""Serving a daemon's metrics over HTTP: GET /metrics, from the daemon's own event loop.

prometheus_client's ``start_http_server`` runs a thread; the daemon keeps
to trio instead, and the job is small: read one request head, answer with
``generate_latest`` (or OpenMetrics, when the scraper's Accept header asks
for it), close the connection. Prometheus reconnects for every scrape when
a target closes, which at one scrape every few seconds costs nothing.

Parsing is sans-IO (``parse_request``, ``respond``): bytes in, a response
out, testable without sockets. Anything but GET or HEAD of /metrics is
answered 404, 405 or 400; a client that sends more than ``MAX_HEAD`` bytes
of head, or takes longer than ``READ_TIMEOUT`` to send it, is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from irdma.cluster import Address

from .metrics import daemon_registry

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger("psd")

PATH = "/metrics"
MAX_HEAD = 8192
READ_TIMEOUT = 10.0


class BadRequest(Exception):
    """The request head is not HTTP the endpoint understands; the message says why."""


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # without any query string
    headers: dict[str, str]  # names lower-cased


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    reason: str
    content_type: str
    body: bytes
    extra: tuple[tuple[str, str], ...] = ()

    def encode(self, *, head_only: bool = False) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status} {self.reason}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in self.extra),
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + self.body


def parse_request(head: bytes) -> Request:
    """Parse a request head (up to and including the blank line); raises BadRequest."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover (latin-1 decodes any byte)
        raise BadRequest("request head is not text") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"bad request line {lines[0][:100]!r}")
    method, target, _ = parts
    headers = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"bad header line {line[:100]!r}")
        headers[name.lower()] = value.strip()
    return Request(method, target.split("?", 1)[0], headers)


def _text(status: int, reason: str, message: str, *extra: tuple[str, str]) -> Response:
    return Response(status, reason, "text/plain; charset=utf-8", message.encode() + b"\n", extra)


def respond(request: Request, registry: Collector) -> Response:
    """The answer to one request: the metrics, or why not."""
    if request.path != PATH:
        return _text(404, "Not Found", f"not found; metrics are at {PATH}")
    if request.method not in ("GET", "HEAD"):
        return _text(405, "Method Not Allowed", "only GET and HEAD", ("Allow", "GET, HEAD"))
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(200, "OK", content_type, encoder(registry))


class MetricsEndpoint:
    """Serves ``registry`` at http://ADDRESS/metrics until cancelled."""

    def __init__(
        self, address: Address, registry: Collector, *, timeout: float = READ_TIMEOUT
    ) -> None:
        self.address = address
        self.registry = registry
        self.timeout = timeout
        self.port = address.port

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, then answer scrapes; raises OSError if the address cannot be bound."""
        listeners = await trio.open_tcp_listeners(self.address.port, host=self.address.host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("metrics at http://%s:%d%s", _host(self.address.host), self.port, PATH)
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        peer = _peer(stream)
        try:
            with trio.move_on_after(self.timeout):
                await self._answer(stream, peer)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the scraper hung up
        except Exception:  # a fault here must not take the daemon down
            log.exception("metrics: request from %s failed", peer)
        finally:
            await stream.aclose()

    async def _answer(self, stream: trio.SocketStream, peer: str) -> None:
        try:
            head = await read_head(stream.receive_some)
            if head is None:
                return
            request = parse_request(head)
        except BadRequest as exc:
            log.info("metrics: bad request from %s: %s", peer, exc)
            await stream.send_all(_text(400, "Bad Request", str(exc)).encode())
            return
        try:
            response = respond(request, self.registry)
        except Exception:
            log.exception("metrics: collecting failed")
            response = _text(500, "Internal Server Error", "collecting metrics failed; see the log")
        await stream.send_all(response.encode(head_only=request.method == "HEAD"))


async def read_head(receive: Callable[[int], Awaitable[bytes | bytearray]]) -> bytes | None:
    """Bytes up to and including the first blank line; None if the peer sent nothing.

    Raises BadRequest for a head over ``MAX_HEAD`` bytes or cut short.
    """
    buf = bytearray()
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            return bytes(buf[: end + 4])
        if len(buf) > MAX_HEAD:
            raise BadRequest(f"request head over {MAX_HEAD} bytes")
        chunk = await receive(4096)
        if not chunk:
            if buf:
                raise BadRequest("connection closed inside the request head")
            return None
        buf += chunk


async def start_metrics(nursery: trio.Nursery, server: Server) -> MetricsEndpoint | None:
    """Serve ``server``'s metrics at its node's ``metrics_address``, if it has one.

    An address that cannot be bound is logged and the daemon goes on
    serving tensors without metrics (the scraper reports the target down).
    """
    address = server.node.metrics_address
    if address is None:
        return None
    endpoint = MetricsEndpoint(address, daemon_registry(server.metrics, server.state))
    try:
        await nursery.start(endpoint.serve)
    except OSError as exc:
        log.error(
            "%s: cannot serve metrics on %s: %s", server.node.name, address, exc.strerror or exc
        )
        return None
    return endpoint


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _peer(stream: trio.SocketStream) -> str:
    try:
        addr = stream.socket.getpeername()
    except OSError:
        return "?"
    return f"{_host(addr[0])}:{addr[1]}"
