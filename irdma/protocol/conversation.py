"""The rules of a conversation on one connection, without I/O.

A client sends requests (``messages``), each with a request id unique on
its connection, and the daemon answers each once, in any order:

- an answer echoes its request's op and id; anything else is a broken peer;
- a READ answered ``PINNED`` holds daemon memory until the client sends
  ``RELEASE`` with the request's id (at once after taking the bytes);
- ``MAPPED`` (the payload is a ``LOCATION`` in the daemon's arena, not the
  data) answers only a READ, only on a connection with shared or RDMA
  memory, and is always ``PINNED``;
- a WRITE or ACCUMULATE may be sent ``STAGED`` (its payload a ``LOCATION``
  in the connection's staging memory) only on such a connection;
- a request's payload is ``length`` bytes after its frame; whatever its
  handler does not read (a refused request, an op that ignores it) is
  skipped before the next frame (``PayloadLeft``).

The transports and the daemon call these; none of them restates a rule.
"""

from __future__ import annotations

from .frame import LOCATION, Flag, Header, Op, ProtocolError, Status
from .messages import Release

_PINNED, _MAPPED, _STAGED = int(Flag.PINNED), int(Flag.MAPPED), int(Flag.STAGED)
_READ, _OK = int(Op.READ), int(Status.OK)
# Requests whose data may be placed in staging memory instead of the frame.
STAGEABLE = frozenset({Op.WRITE, Op.ACCUMULATE})


def check_answer(request_op: int, answer: Header, *, memory: bool) -> None:
    """Raise ProtocolError unless ``answer`` may answer a request of ``request_op``
    (``memory``: the connection has shared or RDMA memory attached)."""
    if answer.op != request_op:
        raise ProtocolError(f"answer of op {answer.op} to a request of op {request_op}")
    flags = answer.flags
    if flags & _PINNED and (request_op != _READ or answer.status != _OK):
        raise ProtocolError(f"PINNED answer to op {request_op} with status {answer.status}")
    if flags & _MAPPED:
        if not memory or not flags & _PINNED or request_op != _READ:
            raise ProtocolError("MAPPED answer on a connection without mapped memory")
        if answer.length != LOCATION.size:
            raise ProtocolError(f"MAPPED answer of {answer.length} bytes")


def owes_release(answer: Header) -> bool:
    """Whether the client must send RELEASE for ``answer`` once its bytes are taken."""
    return bool(answer.flags & _PINNED)


def release_frame(request_id: int) -> bytes:
    """The RELEASE frame for the pinned answer to ``request_id``."""
    return Release(request_id).frame().pack()


def mapped_data(answer: Header) -> Header:
    """A MAPPED answer as the data it stands for: ``size`` bytes, read from the arena."""
    return answer._replace(length=answer.size)


def staged(request: Header) -> Header:
    """``request`` with its data placed in staging memory: the payload becomes a LOCATION."""
    if request.op not in STAGEABLE:
        raise ProtocolError(f"op {request.op} cannot be sent STAGED")
    return request._replace(flags=request.flags | _STAGED, length=LOCATION.size)


class PayloadLeft:
    """How much of one request's payload is still unread (the daemon's side)."""

    __slots__ = ("left",)

    def __init__(self, length: int) -> None:
        self.left = length

    def take(self, n: int) -> None:
        """Account for reading ``n`` more bytes; a handler never reads past the payload."""
        if n > self.left:
            # A handler bug, not the peer's: it asked for more than the frame has.
            raise ProtocolError(f"reading {n} bytes of a payload with {self.left} left")
        self.left -= n

    def rest(self) -> int:
        """The bytes to skip before the next frame (and none after)."""
        n, self.left = self.left, 0
        return n
