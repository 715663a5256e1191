"""The copies a shard keeps for readers of older whole-tensor writes: which to
keep, which to let go, and which one a read asks for. Pure: blocks kept or let
go are returned, and ``blocks.Blocks`` frees them.

A write of whole shards carrying a ``stamp`` (one id for every shard of one
``Client.write``) keeps the shard's previous copy (``prev``) instead of
overwriting it, so a reader that got some shards of the previous write can
still get the rest of that write (``copy_for``). Copies older than that stay
for ``OLDER_COPIES_KEPT`` seconds, at most ``OLDER_COPIES_MAX`` of them
(``older``), so a reader streaming a tensor that is rewritten back to back
can usually finish the version it began. A copy a reader's lease holds
(``leases``: the mount's streamed reads take one) is kept past both rules,
until the lease ends or a write needs its arena room.
"""

from __future__ import annotations

from irdma.protocol import Status
from irdma.protocol.messages import UNSTAMPED

from ..arena import Block
from ..errors import StoreError
from .leases import NOTHING_HELD, Held
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


def keep_previous(
    shard: Shard, block: Block, stamp: int, now: float, held: Held = NOTHING_HELD
) -> list[Block]:
    """Make ``block`` (whole-tensor write ``stamp``) the shard's copy, keeping the
    current one as ``prev``; return the older copies now past keeping (those
    ``held`` by readers' leases are kept)."""
    if shard.prev is not None:
        shard.older.append((shard.prev_stamp, shard.prev, shard.prev_version, now))
    gone = trim(shard, now, held)
    shard.prev, shard.prev_stamp, shard.prev_version = shard.block, shard.stamp, shard.version
    shard.stamps_seen.append(stamp)
    shard.block = block
    shard.stamp = stamp
    return gone


def stamped_in_place(shard: Shard, stamp: int) -> None:
    """Whole-tensor write ``stamp`` went over the shard's only copy (no room for two)."""
    shard.stamp = stamp
    shard.stamps_seen.append(stamp)


def trim(shard: Shard, now: float, held: Held = NOTHING_HELD) -> list[Block]:
    """Forget the older copies past keeping (more than OLDER_COPIES_MAX, or older
    than OLDER_COPIES_KEPT) that no lease holds; return their blocks."""
    free = [copy for copy in shard.older if copy[0] not in held]
    young = free[max(0, len(free) - OLDER_COPIES_MAX) :]
    kept = {id(copy) for copy in young if now - copy[3] <= OLDER_COPIES_KEPT}
    gone = [copy[1] for copy in free if id(copy) not in kept]
    shard.older = [copy for copy in shard.older if copy[0] in held or id(copy) in kept]
    return gone


def let_go_older(shard: Shard, held: Held = NOTHING_HELD) -> list[Block]:
    """Forget the copies kept beyond the shard's previous one that no lease holds;
    return their blocks."""
    gone = [block for stamp, block, _, _ in shard.older if stamp not in held]
    shard.older = [copy for copy in shard.older if copy[0] in held]
    return gone


def let_go_prev(shard: Shard, held: Held = NOTHING_HELD) -> Block | None:
    """Forget the shard's previous copy unless a lease holds it; return its block."""
    if shard.prev is None or shard.prev_stamp in held:
        return None
    block = shard.prev
    shard.prev, shard.prev_stamp, shard.prev_version = None, 0, 0
    return block


def keeps_any(shard: Shard) -> bool:
    """Whether the shard keeps any copy of an older write."""
    return shard.prev is not None or bool(shard.older)


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
