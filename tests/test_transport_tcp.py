"""irdma.transport.tcp's FramedSocket on a real loopback connection."""

from __future__ import annotations

import socket

import numpy as np
import trio
import trio.testing

from irdma.transport.tcp import LOWAT_MIN, FramedSocket


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection (unix sockets ignore SO_RCVLOWAT in poll)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        b = socket.create_connection(listener.getsockname())
        a, _ = listener.accept()
    for s in (a, b):
        s.setblocking(False)
    return a, b


async def test_a_payload_whose_tail_arrives_late_is_received_whole() -> None:
    """The receive low-water mark must never ask for more than is still to come.

    The bulk of a payload arrives, then (after the receiver went back to
    waiting) a tail shorter than the smallest low-water mark. A mark left
    over from the bulk would wait for bytes that never come: a deadlock
    seen under irdma's collectives.
    """
    a, b = tcp_pair()
    receiver = FramedSocket(a, "receiver")
    tail = LOWAT_MIN // 2
    n = (3 << 20) + tail
    data = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    got = np.zeros(n, dtype=np.uint8)
    bulk_sent = trio.Event()

    async def send() -> None:
        sender = FramedSocket(b, "sender")
        await sender.send_all([data[: n - tail]])
        bulk_sent.set()
        # Every other task blocked: the receiver has read all the bulk and waits again.
        await trio.testing.wait_all_tasks_blocked()
        await sender.send_all([data[n - tail :]])

    with trio.move_on_after(10) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            await receiver.recv_exactly_into(memoryview(got))
    a.close()
    b.close()
    assert not scope.cancelled_caught, "the receiver waited for bytes that never came"
    assert bulk_sent.is_set() and np.array_equal(got, data)
