"""The send-queue room of an RDMA link (irdma/transport/rdma/link.py); its verbs
run in tests/rdma, in a soft-RoCE guest."""

from __future__ import annotations

import trio
import trio.testing

from irdma.transport.rdma.link import Link


async def test_a_post_cancelled_while_the_send_queue_is_full_gives_its_room_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = object.__new__(Link)  # only its send-queue room: no verbs here
    link.slots = trio.Semaphore(4)
    with trio.move_on_after(5) as waited:  # a chain of 6 waits for room that never comes
        await link.take_room(6)
    assert waited.cancelled_caught
    assert link.slots.value == 4
    await link.take_room(4)  # all of it is there to take
    assert link.slots.value == 0
