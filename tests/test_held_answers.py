"""When a primary answers an update (``psd/held_answers.py``): the peek that tells
whether the client sent its next request already. (Answers deferred until the
backups hold an update are shown with real daemons in test_replication_pipeline.)"""

from __future__ import annotations

import socket

import trio
from irdma_psd.conn import Conn
from irdma_psd.held_answers import more_waiting

from irdma.transport.tcp import FramedSocket


async def test_the_peek_sees_the_next_request_and_leaves_it_to_be_read() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    with a, b:
        async with trio.open_nursery() as nursery:
            conn = Conn(FramedSocket(a, "client"), nursery)
            assert not more_waiting(conn)  # idle: the update is answered in place
            b.sendall(b"next request")
            assert more_waiting(conn)
            assert more_waiting(conn)  # peeking twice reads nothing
            assert a.recv(64) == b"next request"
            assert not more_waiting(conn)


async def test_a_connection_the_client_closed_has_nothing_waiting() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    with a:
        b.close()
        async with trio.open_nursery() as nursery:
            assert not more_waiting(Conn(FramedSocket(a, "client"), nursery))
