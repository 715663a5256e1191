"""The resyncs this daemon owes its peers: a backup it declared down while it
acknowledged updates without it (queued items dropped, or updates applied while it
was down) holds a stale copy, and may not know it.

With heartbeats (no etcd), a backup that this daemon stops hearing can keep
hearing a majority and stay ready: it never gives up being ready, so nothing
makes it catch up, and if this primary dies it takes over with its stale copy.
So this daemon owes it a resync, and says so in every heartbeat to it
(``Heartbeat.resync``): the backup gives up being ready and catches up. The
debt is settled by that catch-up's handoff, but only if the backup asked this
daemon what it holds after the debt was last incurred: a debt incurred
meanwhile (the backup declared down again while catching up) is not covered by
copies it chose before, and the handoff is refused (the backup plans again).

Nothing here does I/O: ``forwarding`` incurs, ``catchup_service`` notes the
questions, ``heartbeats`` tells the peer and settles.
"""

from __future__ import annotations

import logging

log = logging.getLogger("psd")


class Debts:
    """Which peers this daemon owes a resync, and whether a handoff settles it."""

    def __init__(self, me: str) -> None:
        self.me = me
        # Debts and catch-up questions in the order they happened: a debt is covered
        # by a catch-up whose question came after it.
        self._count = 0
        self._owed: dict[str, int] = {}  # peer -> when its debt was last incurred
        self._asked: dict[str, int] = {}  # peer -> when its last question was answered

    def incur(self, peer: str, why: str) -> None:
        """``peer`` lacks what this daemon did while it saw it down (``why``)."""
        if peer not in self._owed:
            log.warning("%s: owes %s a resync: %s", self.me, peer, why)
        self._count += 1
        self._owed[peer] = self._count

    def asked(self, peer: str) -> None:
        """``peer`` is told what this daemon holds now (a catch-up question): the
        copies it chooses from that answer cover every debt incurred before."""
        self._count += 1
        self._asked[peer] = self._count

    def owes(self, peer: str) -> bool:
        return peer in self._owed

    def settle(self, peer: str) -> None:
        """``peer`` handed off (caught up): its debt is cleared if its catch-up asked
        after the debt was last incurred."""
        owed = self._owed.get(peer)
        if owed is None:
            return
        if self._asked.get(peer, 0) < owed:
            log.info(
                "%s: %s handed off, but was owed a resync after its catch-up asked; "
                "it catches up again",
                self.me,
                peer,
            )
            return
        del self._owed[peer]
        log.info("%s: %s caught up; no resync owed to it", self.me, peer)
