"""Large forwards lent to a same-host backup (psd.replication.lending, psd.loans): the
backup reads the bytes out of the primary's arena, then the loan; a loan revoked
before the read ends is refused, never taken for the bytes lent. Unit tests on a
real arena in this process, then real daemons."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from irdma_psd.arena import Arena
from irdma_psd.loans import LOANS, Loans
from irdma_psd.replication import lending
from irdma_psd.replication.bodies import BadBody, LentBytes
from irdma_psd.replication.lending import LEND_MIN, Borrower, Lender, LentUnreadable, LoanRevoked

from irdma import Client

from .helpers.cluster import make_cluster
from .helpers.stores import open_arena
from .helpers.wire import hello
from .test_replication_pipeline import copies, on_n1_then_n2

SIZE = 16 * LEND_MIN


def lent_block(arena: Arena, fill: int) -> np.ndarray:
    view = arena.view(arena.alloc(SIZE), 0, SIZE)
    view[:] = fill
    return view


# -- the loan table ------------------------------------------------------------


def test_a_loan_is_out_until_revoked_and_a_reused_word_keeps_the_new_loan() -> None:
    with open_arena() as arena:
        loans = arena.loans
        first = loans.lend()
        assert loans.out(first) and first.token != 0
        first.revoke()
        assert not loans.out(first)
        old = loans.lend()
        for _ in range(LOANS - 1):
            loans.lend()
        new = loans.lend()  # the ring came round: the old loan's word is the new one's
        assert new.word == old.word and new.token != old.token
        assert not loans.out(old) and loans.out(new)
        old.revoke()  # revoking the old one leaves the new one out
        assert loans.out(new)


def test_the_loan_table_lies_in_the_arena_memfd_after_the_directory() -> None:
    with open_arena() as arena:
        assert isinstance(arena.loans, Loans)
        assert arena.loans.offset >= arena.directory.offset
        loan = arena.loans.lend()
        assert int.from_bytes(os.pread(arena.fd, 8, loan.word), "little") == loan.token


def test_offset_of_finds_views_of_the_arena_only() -> None:
    with open_arena() as arena:
        block = arena.alloc(SIZE)
        assert arena.offset_of(arena.view(block, 4096, 8192)) == block.offset + 4096
        assert arena.offset_of(np.zeros(SIZE, np.uint8)) is None
        assert arena.offset_of(arena.view(block)[::2]) is None  # not contiguous


# -- lending and borrowing ------------------------------------------------------


def test_a_backup_reads_lent_bytes_through_the_arena_memfd() -> None:
    with open_arena() as arena:
        payload = lent_block(arena, 7)
        lent = Lender(arena).lend(payload)
        assert lent is not None
        _loan, body = lent
        into = np.zeros(SIZE, np.uint8)
        Borrower().read(LentBytes.decode(body.encode()), into)
        assert np.array_equal(into, payload)
        assert body.pid == os.getpid() and body.nbytes == SIZE


def test_small_payloads_and_bytes_outside_the_arena_are_not_lent() -> None:
    with open_arena() as arena:
        lender = Lender(arena)
        assert lender.lend(lent_block(arena, 1)[: LEND_MIN - 1]) is None
        assert lender.lend(np.zeros(SIZE, np.uint8)) is None


def test_a_loan_revoked_before_the_read_is_refused() -> None:
    with open_arena() as arena:
        payload = lent_block(arena, 7)
        lent = Lender(arena).lend(payload)
        assert lent is not None
        loan, body = lent
        loan.revoke()
        payload[:] = 9  # the block reused by another update
        with pytest.raises(LoanRevoked, match="took back"):
            Borrower().read(body, np.zeros(SIZE, np.uint8))


def test_a_loan_revoked_while_the_bytes_are_read_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The primary revokes and rewrites the block between the backup's copy of the bytes
    and its read of the token (a late backup, its link given up meanwhile): the bytes
    copied are the new ones for all the backup knows, and the token says so."""
    with open_arena() as arena:
        payload = lent_block(arena, 7)
        lent = Lender(arena).lend(payload)
        assert lent is not None
        loan, body = lent
        into = np.zeros(SIZE, np.uint8)
        real_copyto = np.copyto

        def copy_while_the_primary_moves_on(dst: np.ndarray, src: np.ndarray) -> None:
            half = SIZE // 2
            real_copyto(dst[:half], src[:half])
            loan.revoke()
            payload[:] = 9
            real_copyto(dst[half:], src[half:])

        monkeypatch.setattr(lending.np, "copyto", copy_while_the_primary_moves_on)
        with pytest.raises(LoanRevoked):
            Borrower().read(body, into)
        assert into[0] == 7 and into[-1] == 9  # it did copy a mix: the loan caught it


def test_a_mapping_is_kept_while_its_arena_is_open_and_pruned_after() -> None:
    borrower = Borrower()
    arena = Arena(1 << 20)
    try:
        lent = Lender(arena).lend(lent_block(arena, 5))
        assert lent is not None
        borrower.read(lent[1], np.zeros(SIZE, np.uint8))
        borrower.prune()
        assert len(borrower._arenas) == 1  # still open in its daemon: kept
    finally:
        arena.close()
    borrower.prune()
    assert borrower._arenas == {}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"boot": b"\x00" * 16}, "another host"),
        ({"ino": 1}, "not the sender's arena"),
        ({"fd": 10_000}, "cannot open"),
        ({"offset": 1 << 40}, "outside the sender's arena"),
        ({"nbytes": SIZE - 1}, "bytes lent for an update of"),
    ],
)
def test_lent_bytes_that_cannot_be_read_here_say_why(change: dict, reason: str) -> None:
    with open_arena() as arena:
        lent = Lender(arena).lend(lent_block(arena, 7))
        assert lent is not None
        body = lent[1]
        fields = {f: getattr(body, f) for f in LentBytes.__dataclass_fields__} | change
        with pytest.raises(LentUnreadable, match=reason):
            Borrower().read(LentBytes(**fields), np.zeros(SIZE, np.uint8))


def test_a_lent_body_of_the_wrong_size_or_sign_is_refused() -> None:
    body = LentBytes(b"\x01" * 16, 1, 3, 4, 5, 6, 7, 8, 9)
    assert LentBytes.decode(body.encode()) == body
    with pytest.raises(BadBody, match="bytes, not"):
        LentBytes.decode(body.encode()[:-1])
    with pytest.raises(BadBody, match="negative"):
        LentBytes.decode(LentBytes(b"\x01" * 16, -1, 3, 4, 5, 6, 7, 8, 9).encode())


# -- with daemons ---------------------------------------------------------------


@pytest.mark.timeout(120)
def test_with_lend_forwards_false_every_forward_carries_its_bytes(tmp_path: Path) -> None:
    """The config's switch (for hosts that must not share memory, and benchmarks that
    stand namespaces in for hosts): nothing is lent, the copies still agree."""
    shard = 16 * LEND_MIN
    cluster = make_cluster(
        tmp_path,
        3,
        replicas=2,
        shard_size=shard,
        extra={"heartbeat": 0.2, "lend_forwards": False},
    )
    try:
        (name,) = on_n1_then_n2(cluster, "sent/", 1)
        with Client(cluster.config_path) as c:
            for i in range(20):  # heartbeats have long said n2 shares n1's kernel
                c.write(name, np.full(shard // 4, float(i), np.float32))
                c.accumulate(name, np.ones(shard // 4, np.float32))
        assert hello(cluster.config, "n1")["copies"]["lent"] == 0
        assert hello(cluster.config, "n2")["copies"]["borrowed"] == 0
        held = copies(cluster, name, shard)
        assert held["n1"] == held["n2"], held
    finally:
        cluster.close()


@pytest.mark.timeout(120)
def test_same_host_backups_read_large_forwards_from_the_primary_and_end_identical(
    tmp_path: Path,
) -> None:
    """Writes and accumulates of large shards with two copies on one host: the backup
    reads every forward out of the primary's arena (the counters say so on both
    sides), none needed a whole-shard copy, and both copies hold the same bytes."""
    shard = 16 * LEND_MIN
    elements = shard // 4
    cluster = make_cluster(tmp_path, 3, replicas=2, shard_size=shard, extra={"heartbeat": 0.2})
    try:
        names = on_n1_then_n2(cluster, "lent/", 3)
        # Heartbeats tell n1 that n2 shares its host before the first forward.
        deadline = 50
        while hello(cluster.config, "n1")["copies"]["lent"] == 0 and deadline:
            with Client(cluster.config_path) as c:
                c.write(names[0], np.zeros(elements, np.float32))
            deadline -= 1
        before = hello(cluster.config, "n1")["copies"]["lent"]
        assert before > 0, "n1 never lent a forward to n2"
        with Client(cluster.config_path) as c:
            for i, name in enumerate(names):
                c.write(name, np.arange(elements, dtype=np.float32) + i)
                c.accumulate(name, np.full(elements, 0.5, np.float32))
                c.accumulate(name, np.full(elements, 0.25, np.float32))
        primary = hello(cluster.config, "n1")["copies"]
        backup = hello(cluster.config, "n2")["copies"]
        assert primary["lent"] == before + 3 * len(names)
        assert backup["borrowed"] == primary["lent"]
        assert backup["borrowed_bytes"] == primary["lent_bytes"]
        assert primary["sent"] == 0  # each applied on top: no whole-shard copy
        for i, name in enumerate(names):
            held = copies(cluster, name, shard)
            assert held["n1"] == held["n2"], held
            with Client(cluster.config_path) as c:
                expected = np.arange(elements, dtype=np.float32) + i + 0.75
                assert np.array_equal(c.read(name), expected)
    finally:
        cluster.close()
