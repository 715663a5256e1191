"""fuse/inodes.py: path <-> inode numbers (pure: no mount, no daemons)."""

from __future__ import annotations

import errno

import pyfuse3
import pytest
from irdma_fuse.errors import FsError
from irdma_fuse.inodes import ROOT_INODE, InodeTable


def test_the_root_is_fuses_root_and_paths_keep_their_numbers() -> None:
    table = InodeTable()
    assert ROOT_INODE == pyfuse3.ROOT_INODE and table.path(ROOT_INODE) == ""
    a, b = table.ino("m"), table.ino("m/w.npy")
    assert len({ROOT_INODE, a, b}) == 3
    assert table.ino("m") == a and table.path(b) == "m/w.npy"


def test_an_unknown_number_is_enoent() -> None:
    with pytest.raises(FsError) as caught:
        InodeTable().path(99)
    assert caught.value.errno == errno.ENOENT


@pytest.mark.parametrize("name", ["a/b", ".", ".."])
def test_a_child_name_must_be_one_entry(name: str) -> None:
    table = InodeTable()
    with pytest.raises(FsError) as caught:
        table.child(table.ino("m"), name)
    assert caught.value.errno == errno.EINVAL


def test_a_child_is_joined_to_its_parent() -> None:
    table = InodeTable()
    assert table.child(ROOT_INODE, "m") == "m"
    assert table.child(table.ino("m"), "w.npy") == "m/w.npy"


def test_a_rename_moves_the_numbers_of_the_directory_and_all_under_it() -> None:
    table = InodeTable()
    d, f, other = table.ino("a"), table.ino("a/x/f"), table.ino("ab")
    moved = table.move("a", "b")
    assert sorted(moved) == [("a", "b"), ("a/x/f", "b/x/f")]
    assert table.ino("b") == d and table.ino("b/x/f") == f and table.path(f) == "b/x/f"
    assert table.path(other) == "ab"  # a name that only starts alike stays
    assert table.ino("a") not in (d, f, other)  # the old name is new again


def test_a_replaced_file_keeps_its_number_under_its_hidden_name() -> None:
    table = InodeTable()
    old, new = table.ino("m/old"), table.ino("m/new")
    table.detach("m/new", "m/new\0replaced-1")  # open on the file the rename replaces
    table.move("m/old", "m/new")
    assert table.path(new) == "m/new\0replaced-1"
    assert table.ino("m/new") == old and table.path(old) == "m/new"
