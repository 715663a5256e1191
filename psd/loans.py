"""Loans of arena bytes to same-host backups: a table of tokens in the arena's memfd.

A primary forwarding a large update to a backup on its own host sends where the
bytes lie in its arena instead of the bytes (``replication.lending``). The backup
reads them through the arena's memfd, then reads the loan's token: only if the
token is still the one it was sent did it read the lent bytes. The primary
revokes a loan (its word no longer the token) before the block can be freed,
so a backup that was slow to read (a link that failed, a peer declared down)
sees the revocation, never another update's bytes taken for this one. It is
the directory's seqlock argument (``irdma/protocol/directory.py``): the
backup's loads of the bytes come before its load of the token, and the
primary's store to the token before its stores to a reused block.

Each loan takes the next word of a ring: a loan still out when the ring comes
round again reads as revoked, which costs that forward a whole-shard copy and
never a wrong one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Words in the loan table: more than the forwards a primary can have in flight
# to all its peers at once (``pipeline.WINDOW_ITEMS`` a peer), so the ring does
# not come round on a loan still out.
LOANS = 4096
LOAN_BYTES = LOANS * 8


@dataclass(eq=False, slots=True)
class Loan:
    """One lent extent's token and where it is in the arena's memfd."""

    table: Loans
    word: int  # the token's byte offset in the memfd
    token: int

    def revoke(self) -> None:
        self.table.revoke(self)


class Loans:
    """The token table at byte ``offset`` of the arena mapping ``buf``."""

    def __init__(self, buf: np.ndarray, offset: int) -> None:
        self.offset = offset
        self.table = buf[offset : offset + LOAN_BYTES].view(np.uint64)
        self._next = 0
        self._token = 0

    def lend(self) -> Loan:
        """A new loan, its token in the table until ``revoke``."""
        index = self._next
        self._next = (index + 1) % LOANS
        self._token += 1  # never 0: a revoked word reads 0
        self.table[index] = self._token
        return Loan(self, self.offset + index * 8, self._token)

    def revoke(self, loan: Loan) -> None:
        """The loan's bytes may change from now on: its token is gone from the table.
        Call before the block it lent is freed or written."""
        index = (loan.word - self.offset) // 8
        if int(self.table[index]) == loan.token:
            self.table[index] = 0

    def out(self, loan: Loan) -> bool:
        """Whether ``loan`` is still out (its token in its word)."""
        return int(self.table[(loan.word - self.offset) // 8]) == loan.token
