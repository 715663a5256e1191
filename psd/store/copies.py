"""The copies a shard keeps for readers of older whole-tensor writes: which to
keep, which to let go, and which one a read asks for. Pure: blocks kept or let
go are returned, and ``blocks.Blocks`` frees them.

A write of whole shards carrying a ``stamp`` (one id for every shard of one
``Client.write``) keeps the shard's previous copy (``prev``) instead of
overwriting it, so a reader that got some shards of the previous write can
still get the rest of that write (``copy_for``). Copies older than that stay
for ``OLDER_COPIES_KEPT`` seconds, at most ``OLDER_COPIES_MAX`` of them
(``older``), so a reader streaming a tensor that is rewritten back to back
(the mount) can finish the version it began.
"""

from __future__ import annotations

from irdma.protocol import Status
from irdma.protocol.messages import UNSTAMPED

from ..arena import Block
from ..errors import StoreError
from .records import Shard

# How long a shard keeps copies older than its previous one (while the arena
# has room): what a reader streaming a tensor rewritten back to back has to
# finish the version it began.
OLDER_COPIES_KEPT = 5.0
# And at most this many of them. A tensor rewritten back to back otherwise keeps
# every copy of the last 5 s, so each write lands in arena room that no process
# has touched yet, and first touches (the daemon's, then every one-sided
# reader's) cost more than the copies: a 64 MiB write of 4 MiB shards took
# 134-169 ms instead of 12-19, and reads were 60-76 ms in some runs. With one
# older copy (prev and one more) each shard cycles through three blocks: writes
# 13-20 ms, reads 11-14 ms (3 daemons over shm).
OLDER_COPIES_MAX = 1


def keep_previous(shard: Shard, block: Block, stamp: int, now: float) -> list[Block]:
    """Make ``block`` (whole-tensor write ``stamp``) the shard's copy, keeping the
    current one as ``prev``; return the older copies now past keeping."""
    gone: list[Block] = []
    if shard.prev is not None:
        shard.older.append((shard.prev_stamp, shard.prev, shard.prev_version, now))
    while shard.older and (
        now - shard.older[0][3] > OLDER_COPIES_KEPT or len(shard.older) > OLDER_COPIES_MAX
    ):
        gone.append(shard.older.pop(0)[1])
    shard.prev, shard.prev_stamp, shard.prev_version = shard.block, shard.stamp, shard.version
    shard.stamps_seen.append(stamp)
    shard.block = block
    shard.stamp = stamp
    return gone


def stamped_in_place(shard: Shard, stamp: int) -> None:
    """Whole-tensor write ``stamp`` went over the shard's only copy (no room for two)."""
    shard.stamp = stamp
    shard.stamps_seen.append(stamp)


def let_go_older(shard: Shard) -> list[Block]:
    """Forget the copies kept beyond the shard's previous one; return their blocks."""
    gone = [block for _, block, _, _ in shard.older]
    shard.older.clear()
    return gone


def let_go_all(shard: Shard) -> list[Block]:
    """Forget every copy the shard keeps of older writes; return their blocks."""
    gone = [shard.prev] if shard.prev is not None else []
    gone += let_go_older(shard)
    shard.prev, shard.prev_stamp, shard.prev_version = None, 0, 0
    return gone


def copy_for(shard: Shard, stamp: int) -> tuple[Block, int]:
    """The block and version of the shard's copy from whole-tensor write ``stamp``
    as a read asks for it (0: the current copy; UNSTAMPED: the copy from before
    any whole-tensor write); STAMP_GONE when it is no longer kept here."""
    want = 0 if stamp == UNSTAMPED else stamp
    if not stamp or want == shard.stamp:
        return shard.block, shard.version
    if shard.prev is not None and shard.prev_stamp == want:
        return shard.prev, shard.prev_version
    for older_stamp, block, version, _ in reversed(shard.older):
        if older_stamp == want:
            return block, version
    if want and want not in shard.stamps_seen:
        raise StoreError(
            Status.STAMP_PENDING,
            f"shard {shard.index} has not received write {stamp:#x} yet",
        )
    raise StoreError(
        Status.STAMP_GONE,
        f"shard {shard.index} no longer holds the copy of write {stamp:#x} "
        "(rewritten since); read the tensor again",
    )
