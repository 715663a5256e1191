"""irdma_fuse.paths: what a mount path means (pure functions, no mount, no daemons)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from irdma_fuse.paths import (
    ACCUMULATE,
    DIR_MARKER,
    NPY,
    RESERVED,
    SHARDS,
    Kind,
    Target,
    entry_name,
    file_candidates,
    join,
    parse,
)

# -- parse: root and plain paths ------------------------------------------------


@pytest.mark.parametrize("path", ["", "/", "//", "///"])
def test_parse_root(path: str) -> None:
    assert parse(path) == Target(Kind.ROOT)


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("m", "m"),
        ("m/", "m"),
        ("/m", "m"),
        ("a/b/c", "a/b/c"),
        ("a//b///c/", "a/b/c"),
        ("m/w.npy", "m/w.npy"),  # a file or a directory: the caller asks the daemons
        ("m/ckpt.pt", "m/ckpt.pt"),
        (".hidden/x", ".hidden/x"),
        ("...", "..."),
        ("m/.shardsx", "m/.shardsx"),  # only the exact component is special
        ("m/x.shards", "m/x.shards"),
        ("m/.irdma-dirx", "m/.irdma-dirx"),
    ],
)
def test_parse_plain_path_is_a_dir_candidate(path: str, name: str) -> None:
    assert parse(path) == Target(Kind.DIR, name)


@pytest.mark.parametrize(
    "path",
    [
        DIR_MARKER,
        f"m/{DIR_MARKER}",
        f"a/b/{DIR_MARKER}",
        f"m/{DIR_MARKER}/x",
        f"m/{DIR_MARKER}/{SHARDS}/w/0",  # the marker comes first: nothing behind it
        f"m/{DIR_MARKER}/{ACCUMULATE}/w.npy",
        ".",
        "..",
        "a/./b",
        "a/../b",
        "a/..",
    ],
)
def test_parse_reserved_marker_and_dots_are_none(path: str) -> None:
    assert parse(path) is None


# -- parse: .shards -------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (SHARDS, Target(Kind.SHARDS_DIR, "")),
        (f"{SHARDS}/", Target(Kind.SHARDS_DIR, "")),
        (f"m/{SHARDS}", Target(Kind.SHARDS_DIR, "m")),
        (f"a/b/{SHARDS}", Target(Kind.SHARDS_DIR, "a/b")),
        (f"{SHARDS}/w", Target(Kind.SHARD_TENSOR_DIR, "w")),
        (f"m/{SHARDS}/w", Target(Kind.SHARD_TENSOR_DIR, "m/w")),
        (f"m/{SHARDS}/w.npy", Target(Kind.SHARD_TENSOR_DIR, "m/w.npy")),
        (f"m/{SHARDS}/w/0", Target(Kind.SHARD, "m/w", index=0)),
        (f"m/{SHARDS}/w/7", Target(Kind.SHARD, "m/w", index=7)),
        (f"m/{SHARDS}/w/10", Target(Kind.SHARD, "m/w", index=10)),
        (f"{SHARDS}/w/123456789", Target(Kind.SHARD, "w", index=123456789)),
        (f"a/b/{SHARDS}/w/3/", Target(Kind.SHARD, "a/b/w", index=3)),
    ],
)
def test_parse_shards_forms(path: str, expected: Target) -> None:
    assert parse(path) == expected


@pytest.mark.parametrize(
    "index",
    [
        "00",
        "01",
        "007",
        "-1",
        "+1",
        "1.0",
        "1e3",
        "x",
        "0x1",
        " 1",
        "1 ",
        "one",
        "²",  # str.isdigit() is True for superscripts, int() refuses them
        "١",  # an Arabic-Indic digit one: int() accepts it (another name for shard 1)
        "１",  # a fullwidth digit one
    ],
)
def test_parse_shard_index_not_canonical_decimal_is_none(index: str) -> None:
    """Only ASCII decimal without leading zeros names a shard: one name per shard."""
    assert parse(f"m/{SHARDS}/w/{index}") is None


@pytest.mark.parametrize(
    "path",
    [
        f"m/{SHARDS}/w/0/x",
        f"m/{SHARDS}/w/0/0",
        f"m/{SHARDS}/w/x/0",
        f"{SHARDS}/a/b/c",
    ],
)
def test_parse_shards_too_deep_is_none(path: str) -> None:
    assert parse(path) is None


@given(st.integers(min_value=0, max_value=10**12))
def test_parse_shard_index_round_trip(index: int) -> None:
    assert parse(f"d/{SHARDS}/t/{index}") == Target(Kind.SHARD, "d/t", index=index)


index_chars = st.one_of(
    st.sampled_from("0123456789"),
    st.characters(categories=["Nd", "No"]),  # other scripts' digits, superscripts
    st.characters(blacklist_characters="/"),
)


@given(st.text(alphabet=index_chars, min_size=1, max_size=6))
def test_parse_shard_index_only_canonical_ascii(index: str) -> None:
    """Fuzzed index components: a SHARD exactly for 0 or [1-9][0-9]*, else None."""
    canonical = index.isascii() and index.isdigit() and (index == "0" or index[0] != "0")
    target = parse(f"d/{SHARDS}/t/{index}")
    if canonical:
        assert target == Target(Kind.SHARD, "d/t", index=int(index))
    else:
        assert target is None


# -- parse: .accumulate -----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (ACCUMULATE, Target(Kind.ACCUMULATE_DIR, "")),
        (f"m/{ACCUMULATE}", Target(Kind.ACCUMULATE_DIR, "m")),
        (f"a/b/{ACCUMULATE}/", Target(Kind.ACCUMULATE_DIR, "a/b")),
        (f"{ACCUMULATE}/w.npy", Target(Kind.ACCUMULATE, "w", typed=True)),
        (f"m/{ACCUMULATE}/w.npy", Target(Kind.ACCUMULATE, "m/w", typed=True)),
        (f"m/{ACCUMULATE}/x.npy.npy", Target(Kind.ACCUMULATE, "m/x.npy", typed=True)),
        (f"m/{ACCUMULATE}/a.npy", Target(Kind.ACCUMULATE, "m/a", typed=True)),
    ],
)
def test_parse_accumulate_forms(path: str, expected: Target) -> None:
    assert parse(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        f"m/{ACCUMULATE}/{NPY}",  # empty stem
        f"m/{ACCUMULATE}/w",
        f"m/{ACCUMULATE}/w.pt",
        f"m/{ACCUMULATE}/w.NPY",
        f"m/{ACCUMULATE}/w.npyx",
        f"m/{ACCUMULATE}/w.npy/x",
        f"m/{ACCUMULATE}/sub/w.npy",
        f"m/{ACCUMULATE}/{SHARDS}/w/0",
    ],
)
def test_parse_accumulate_invalid_is_none(path: str) -> None:
    assert parse(path) is None


def test_target_is_dir() -> None:
    dirs = {
        Kind.ROOT,
        Kind.DIR,
        Kind.SHARDS_DIR,
        Kind.SHARD_TENSOR_DIR,
        Kind.ACCUMULATE_DIR,
        Kind.WORKER_DIR,
    }
    for kind in Kind:
        assert Target(kind, "x").is_dir == (kind in dirs), kind


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("m/.worker", Target(Kind.WORKER_DIR, "m")),
        ("m/.worker/3", Target(Kind.WORKER_DIR, "m")),
        ("m/.worker/3/17", Target(Kind.WORKER_DIR, "m")),
        ("m/.worker/3/17/w.npy", Target(Kind.STEP, "m/w", typed=True, worker=3, step=17)),
        ("a/b/.worker/0/0/l1/w.npy", Target(Kind.STEP, "a/b/l1/w", typed=True, worker=0, step=0)),
        ("m/.worker/0/0/l1", Target(Kind.WORKER_DIR, "m/l1")),
        (".worker/1/2/w.npy", Target(Kind.STEP, "w", typed=True, worker=1, step=2)),
        ("m/.worker/x", None),
        ("m/.worker/01/2", None),
        ("m/.worker/1/-2", None),
        ("m/.worker/1/2/.shards/w.npy", None),
        ("m/.worker/1/2/../w.npy", None),
    ],
)
def test_parse_worker_paths(path: str, expected: Target | None) -> None:
    assert parse(path) == expected


def test_join() -> None:
    assert join("", "w") == "w"
    assert join("m", "w") == "m/w"
    assert join("a/b", "c.npy") == "a/b/c.npy"


# -- file_candidates ------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "m/w.npy",
            [Target(Kind.TENSOR, "m/w", typed=True), Target(Kind.TENSOR, "m/w.npy")],
        ),
        ("w.npy", [Target(Kind.TENSOR, "w", typed=True), Target(Kind.TENSOR, "w.npy")]),
        (
            "/a/b/w.npy/",
            [Target(Kind.TENSOR, "a/b/w", typed=True), Target(Kind.TENSOR, "a/b/w.npy")],
        ),
        (
            "m/x.npy.npy",
            [Target(Kind.TENSOR, "m/x.npy", typed=True), Target(Kind.TENSOR, "m/x.npy.npy")],
        ),
        ("m/ckpt.pt", [Target(Kind.TENSOR, "m/ckpt.pt")]),
        ("m/config.json", [Target(Kind.TENSOR, "m/config.json")]),
        ("m/w.NPY", [Target(Kind.TENSOR, "m/w.NPY")]),
        ("m/w", [Target(Kind.TENSOR, "m/w")]),
        ("m/.npy", [Target(Kind.TENSOR, "m/.npy")]),  # no stem: only a raw file
        (NPY, [Target(Kind.TENSOR, NPY)]),
        ("", []),
        ("/", []),
    ],
)
def test_file_candidates(path: str, expected: list[Target]) -> None:
    assert file_candidates(path) == expected


def test_file_candidates_raw_is_untyped_tensor() -> None:
    for cand in file_candidates("m/ckpt.pt") + file_candidates("m/w.npy")[1:]:
        assert cand.kind == Kind.TENSOR
        assert not cand.typed
        assert not cand.is_dir


# -- entry_name -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("tensor", "raw", "prefix", "expected"),
    [
        ("m/w", False, "m", "w.npy"),  # typed: .npy added
        ("m/w.npy", True, "m", "w.npy"),  # raw: the name as it is
        ("m/ckpt.pt", True, "m", "ckpt.pt"),
        ("m/w", True, "m", "w"),
        ("m/w.npy", False, "m", "w.npy.npy"),
        ("w", False, "", "w.npy"),
        ("w.bin", True, "", "w.bin"),
        ("a/b/c", False, "a", "b/"),  # deeper: the subdirectory
        ("a/b/c", True, "a", "b/"),
        ("a/b/c/d", False, "a", "b/"),
        ("a/b/c", False, "", "a/"),
        ("a/b/c", False, "a/b", "c.npy"),
        (f"m/x/{DIR_MARKER}", False, "m", "x/"),  # an empty subdirectory shows
        (f"m/{DIR_MARKER}", False, "m", None),  # the marker is hidden
        (f"m/{DIR_MARKER}", True, "m", None),
        (DIR_MARKER, False, "", None),
        ("other/w", False, "m", None),  # outside the prefix
        ("mm/w", False, "m", None),  # the prefix ends at a '/'
        ("m", False, "m", None),  # the directory itself
        ("a/w", False, "a/b", None),
    ],
)
def test_entry_name(tensor: str, raw: bool, prefix: str, expected: str | None) -> None:
    assert entry_name(tensor, raw, prefix) == expected


# -- properties -----------------------------------------------------------------

component = (
    st.text(
        alphabet=st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=12,
    )
    .filter(lambda s: s not in (".", "..") and s not in RESERVED)
    .filter(lambda s: s != NPY)
)
directory = st.lists(component, max_size=3).map("/".join)


@given(directory, component)
def test_typed_entry_round_trips_through_file_candidates(d: str, base: str) -> None:
    name = join(d, base)
    entry = entry_name(name, False, d)
    assert entry == base + NPY
    path = join(d, entry)
    assert parse(path) == Target(Kind.DIR, path)
    cands = file_candidates(path)
    assert cands[0] == Target(Kind.TENSOR, name, typed=True)
    assert cands[-1] == Target(Kind.TENSOR, path, typed=False)


@given(directory, component)
def test_raw_entry_round_trips_through_file_candidates(d: str, base: str) -> None:
    name = join(d, base)
    entry = entry_name(name, True, d)
    assert entry == base
    path = join(d, entry)
    assert parse(path) == Target(Kind.DIR, path)
    cands = file_candidates(path)
    # The raw candidate is always there, and last: a typed guess (if any) is tried first.
    assert cands[-1] == Target(Kind.TENSOR, name, typed=False)
    assert len(cands) == (2 if base.endswith(NPY) else 1)


@given(directory, component, component, st.booleans())
def test_deeper_tensor_shows_as_subdirectory(d: str, sub: str, base: str, raw: bool) -> None:
    name = join(join(d, sub), base)
    assert entry_name(name, raw, d) == sub + "/"
    assert parse(join(d, sub)) == Target(Kind.DIR, join(d, sub))


@given(directory, component, component, st.booleans())
def test_tensor_outside_prefix_has_no_entry(d: str, other: str, base: str, raw: bool) -> None:
    prefix = join(d, "p")
    name = join(join(d, "p" + other), base)  # shares the prefix's characters, not its '/'
    assert entry_name(name, raw, prefix) is None
