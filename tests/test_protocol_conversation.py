"""The rules of a conversation, without sockets: which answer may follow which
request, what a client owes after a PINNED answer, STAGED requests, and the
accounting that lets the daemon skip an unread payload."""

from __future__ import annotations

import pytest

from irdma.protocol import LOCATION, Flag, Header, Op, ProtocolError, Status, unpack_header
from irdma.protocol.conversation import (
    PayloadLeft,
    check_answer,
    mapped_data,
    owes_release,
    release_frame,
    staged,
)
from irdma.protocol.messages import Read, Release, Update, decode_request

READ = Read(key=1, shard=0, offset=0, size=1 << 20).frame()
WRITE = Update(Op.WRITE, key=1, shard=0, offset=0, size=4096).frame(4096)


def answer(request: Header, status: int = Status.OK, flags: int = 0, length: int = 0) -> Header:
    return request.response(status, length=length, flags=flags)


LEGAL = [
    # (request, answer, connection has mapped memory)
    (READ, answer(READ, length=1 << 20), False),
    (READ, answer(READ, flags=Flag.PINNED, length=1 << 20), False),
    (READ, answer(READ, flags=Flag.PINNED | Flag.MAPPED, length=LOCATION.size), True),
    (READ, answer(READ, Status.NOT_FOUND, length=20), True),
    (WRITE, answer(WRITE), False),
    (WRITE, answer(WRITE), True),
    (WRITE, answer(WRITE, Status.NOT_OWNER, length=30), False),
]
ILLEGAL = [
    (READ, answer(WRITE), False, "answer of op"),
    (WRITE, answer(WRITE, flags=Flag.PINNED), False, "PINNED answer to op"),
    (READ, answer(READ, Status.NOT_FOUND, flags=Flag.PINNED), False, "PINNED answer"),
    (READ, answer(READ, flags=Flag.PINNED | Flag.MAPPED, length=8), False, "without mapped"),
    (READ, answer(READ, flags=Flag.MAPPED, length=8), True, "without mapped"),
    (READ, answer(READ, flags=Flag.PINNED | Flag.MAPPED, length=9), True, "MAPPED answer of 9"),
    (WRITE, answer(WRITE, flags=Flag.PINNED | Flag.MAPPED, length=8), True, "PINNED answer"),
]


@pytest.mark.parametrize(("request_", "reply", "memory"), LEGAL)
def test_legal_answers_pass(request_: Header, reply: Header, memory: bool) -> None:
    check_answer(request_.op, reply, memory=memory)


@pytest.mark.parametrize(("request_", "reply", "memory", "why"), ILLEGAL)
def test_illegal_answers_are_protocol_errors(
    request_: Header, reply: Header, memory: bool, why: str
) -> None:
    with pytest.raises(ProtocolError, match=why):
        check_answer(request_.op, reply, memory=memory)


def test_a_pinned_answer_is_owed_a_release_naming_its_request() -> None:
    pinned = answer(READ, flags=Flag.PINNED, length=1 << 20)
    assert owes_release(pinned)
    assert not owes_release(answer(READ, length=1 << 20))
    release = decode_request(unpack_header(release_frame(77)))
    assert release == Release(77)


def test_a_mapped_answer_stands_for_its_data() -> None:
    mapped = answer(READ, flags=Flag.PINNED | Flag.MAPPED, length=LOCATION.size)
    assert mapped_data(mapped).length == READ.size == 1 << 20


def test_only_writes_and_accumulates_go_staged() -> None:
    s = staged(WRITE)
    assert s.flags & Flag.STAGED and s.length == LOCATION.size
    assert decode_request(s).staged
    for request in (READ, Header(Op.WRITE_BATCH), Header(Op.CREATE)):
        with pytest.raises(ProtocolError, match="cannot be sent STAGED"):
            staged(request)


def test_payload_accounting_skips_what_a_handler_left() -> None:
    p = PayloadLeft(100)
    p.take(30)
    with pytest.raises(ProtocolError, match="reading 80 bytes of a payload with 70 left"):
        p.take(80)
    assert p.rest() == 70
    assert p.rest() == 0  # skipped once
    p.take(0)
