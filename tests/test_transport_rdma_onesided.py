"""One-sided RDMA pulls (irdma/transport/rdma/onesided.py: the pull loop, its chains of
READs and how their answers are judged), against a scripted responder.

The real verbs run in tests/rdma, in a soft-RoCE guest. What these tests need
no real device lets a test choose: the order in which one READ copies the
words of a directory slot while the daemon rewrites it, and a post still in
progress when the connection fails. So the link here executes the chains
``OneSidedReader`` posts against an arena laid out by the daemon's own directory
code (``psd/directory.py``), one work request after another (the strongest
order a fenced chain has), and the test says when the daemon writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import trio
from irdma_psd.directory import Directory

from irdma.protocol.directory import MIN_SLOTS, SLOT_BYTES, directory_bytes
from irdma.sizes import STAGING_ALIGN
from irdma.transport.base import StreamClosed
from irdma.transport.rdma.link import SCRATCH_CELL, Remote
from irdma.transport.rdma.onesided import RETRY, OneSidedReader, Pull
from irdma.transport.staging import StagingArea

BLOCK = 4096
BLOCKS = 8
TABLE_AT = BLOCKS * BLOCK
KEY, LAYOUT, INDEX = 0x1234, 0x77, 0
STAGING = 4 * BLOCK  # the local buffer: staging (the bytes land at 0), then scratch cells
CELL = STAGING


@dataclass
class ScriptedLink:
    """A verbs link whose READs copy from ``arena`` one work request at a time.

    ``torn``: called once, in the middle of the first READ of ``torn_at`` (after
    its other words, before its seq word): the daemon writing while a READ
    copies the seq word last, as soft-RoCE's memcpy may. ``hold``: posts wait
    for it (a post still in progress, e.g. waiting for send-queue room).
    """

    arena: np.ndarray
    torn_at: int = -1
    torn: Callable[[], None] | None = None
    hold: trio.Event | None = None
    posting: trio.Event = field(default_factory=trio.Event)
    buffer: SimpleNamespace = field(init=False)
    e = SimpleNamespace(IBV_SEND_FENCE=1 << 20, IBV_WR_RDMA_READ=4)
    closed: bool = False
    scratch_at = STAGING

    def __post_init__(self) -> None:
        self.local = np.zeros(STAGING + 4 * SCRATCH_CELL, np.uint8)
        self.buffer = SimpleNamespace(view=self.local)

    def _read(self, local: int, remote: int, length: int) -> None:
        dst, src = self.local[local : local + length], self.arena[remote : remote + length]
        if remote == self.torn_at and length == SLOT_BYTES and self.torn is not None:
            dst[8:] = src[8:]  # every word but the seq...
            torn, self.torn = self.torn, None
            torn()  # ...the daemon writes...
            dst[:8] = src[:8]  # ...and the seq word last
        else:
            dst[:] = src

    async def post(self, opcode: int, pieces: list[tuple[int, int, int, int]], rkey: int):
        self.posting.set()
        if self.hold is not None:
            await self.hold.wait()
        return pieces

    async def wait(self, posted, nbytes: int, timeout: float) -> None:
        for local, remote, length, _flags in posted:
            self._read(local, remote, length)
        await trio.lowlevel.checkpoint()

    async def chain(self, opcode, pieces, rkey, nbytes, timeout) -> None:
        await self.wait(await self.post(opcode, pieces, rkey), nbytes, timeout)


class Daemon:
    """One shard's copies in an arena, published through the daemon's directory code."""

    def __init__(self) -> None:
        self.arena = np.zeros(TABLE_AT + directory_bytes(MIN_SLOTS), np.uint8)
        self.directory = Directory(self.arena, TABLE_AT, MIN_SLOTS)
        self.directory.set_serving(True)
        self.slot = self.directory.place(KEY, LAYOUT, INDEX)
        self.version = 0
        self.block = -1

    def write(self, block: int) -> None:
        """A whole-tensor write into ``block``: its bytes say its version and stamp."""
        self.version += 1
        self.arena[block * BLOCK : (block + 1) * BLOCK] = self.version
        self.block = block
        self.directory.publish(self.slot, block * BLOCK, 0, self.version, 100 + self.version)

    def remote(self) -> Remote:
        r = Remote(0, 0, len(self.arena), 0, 0, STAGING)
        r.directory = (TABLE_AT, MIN_SLOTS)
        return r


def reader_for(link: ScriptedLink, daemon: Daemon) -> OneSidedReader:
    staging = StagingArea(link.local[:STAGING], STAGING_ALIGN, "scripted buffer")
    return OneSidedReader(link, daemon.remote(), staging, "scripted", 1.0)  # type: ignore[arg-type]


def pull_for(daemon: Daemon, block: int) -> Pull:
    return Pull(KEY, LAYOUT, INDEX, 0, BLOCK, 0, CELL, 0, slot=daemon.slot, block=block * BLOCK)


async def read_block(reader: OneSidedReader) -> object:
    """A one-sided read of the whole shard through the reader's pull loop."""
    return await reader._read_direct(KEY, LAYOUT, INDEX, 0, BLOCK, 0, CELL, 0)


async def judged(reader: OneSidedReader, pull: Pull) -> object:
    chain = await reader._post_batch([pull])
    assert await reader._settle(chain) is None
    return pull.answer


async def test_a_slot_read_torn_by_three_writes_is_read_again() -> None:
    """Blocks recur (a shard cycles through three), so a slot READ whose seq word was
    copied after three writes can name the block the reader expects, with the first
    write's version and stamp, while that block holds the fourth's bytes. The seq word
    READ alone before and after the slot catches it; one slot READ checked against
    the next could not (both have the newest seq)."""
    daemon = Daemon()
    daemon.write(0)  # version 1 in block 0: what the reader read last

    def three_writes() -> None:
        for block in (1, 2, 0):  # the third lands in block 0 again
            daemon.write(block)

    link = ScriptedLink(daemon.arena, TABLE_AT + daemon.slot * SLOT_BYTES, three_writes)
    reader = reader_for(link, daemon)
    pull = pull_for(daemon, 0)
    answer = await judged(reader, pull)
    got = int(link.local[0])  # every byte of the block says its version
    if answer is not RETRY:
        version, stamp, _ = answer  # type: ignore[misc]
        assert (version, stamp) == (got, 100 + got), (
            f"accepted version {version} (stamp {stamp}) with the bytes of version {got}"
        )
    # Read again, nothing in the way: the newest version, whole.
    pull.done = trio.Event()
    assert await judged(reader, pull) == (4, 104, 0)
    assert int(link.local[0]) == 4


async def test_an_untouched_slot_is_accepted_at_once() -> None:
    daemon = Daemon()
    daemon.write(3)
    reader = reader_for(ScriptedLink(daemon.arena), daemon)
    assert await judged(reader, pull_for(daemon, 3)) == (1, 101, 0)
    assert reader.retries == 0


async def test_a_slot_changing_at_the_start_is_read_again() -> None:
    """A seq word that is odd when READ alone (the daemon mid-change) never passes."""
    daemon = Daemon()
    daemon.write(1)
    daemon.directory.begin(daemon.slot)  # odd: the shard is changing in place
    reader = reader_for(ScriptedLink(daemon.arena), daemon)
    assert await judged(reader, pull_for(daemon, 1)) is RETRY


async def test_a_failed_connection_fails_its_pulls_with_their_own_error() -> None:
    """The connection fails (its loops are cancelled) while the pull loop is posting a
    chain: the reader gets a StreamClosed of its own, never the loop's Cancelled,
    and the reader's own scope and sibling tasks go on."""
    daemon = Daemon()
    daemon.write(0)
    link = ScriptedLink(daemon.arena, hold=trio.Event())  # the post never finishes
    reader = reader_for(link, daemon)
    reader._slots[(KEY, INDEX)] = (daemon.slot, 0)
    loop = trio.CancelScope()
    sibling_ran = False

    async def pull_loop() -> None:
        with loop:
            await reader.run()

    async def sibling() -> None:
        nonlocal sibling_ran
        await link.posting.wait()
        loop.cancel()  # what FramedConnection._fail does to its loops
        await trio.sleep(0)
        sibling_ran = True

    failed: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pull_loop)
        nursery.start_soon(sibling)
        try:
            await read_block(reader)
        except StreamClosed as exc:
            failed = exc
    # A foreign Cancelled raised here would have been swallowed by this nursery
    # (it takes it for its own cancellation) and the read would seem to return.
    assert isinstance(failed, StreamClosed) and "pulls stopped" in str(failed)
    assert sibling_ran
    # A pull queued after the loop ended fails at once instead of waiting for ever.
    with pytest.raises(StreamClosed):
        await read_block(reader)


async def test_a_pull_loop_whose_link_closed_first_ends_its_pulls() -> None:
    """A pull loop that starts after its link closed (the set-up failed, or the
    connection, before the loop ran) still marks its pulls ended: a pull queued
    then fails at once instead of waiting for ever."""
    daemon = Daemon()
    daemon.write(0)
    link = ScriptedLink(daemon.arena)
    link.closed = True
    reader = reader_for(link, daemon)
    reader.stop()
    await reader.run()
    assert reader._ended
    reader._slots[(KEY, INDEX)] = (daemon.slot, 0)
    with pytest.raises(StreamClosed):
        await read_block(reader)
