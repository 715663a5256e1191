"""``irdma.client.manifests`` (no I/O): the names a model's versions live under, the
manifest that commits one, and the byte runs a reader's slice of a tensor reads."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from irdma.client.manifests import (
    Manifest,
    ManifestError,
    Part,
    TensorEntry,
    byte_runs,
    check_prefix,
    check_tensor_name,
    check_version,
    manifest_name,
    slice_shape,
    version_of_manifest,
)


def test_manifest_names_sort_as_their_numbers_and_parse_back() -> None:
    names = [manifest_name("m", v) for v in (9, 10, 100, 2)]
    assert sorted(names) == [manifest_name("m", v) for v in (2, 9, 10, 100)]
    assert [version_of_manifest("m", n) for n in names] == [9, 10, 100, 2]
    assert version_of_manifest("m", "m/@versions/12") is None  # not its digits
    assert version_of_manifest("other", names[0]) is None


def test_prefixes_and_names_may_not_use_the_versions_own_parts() -> None:
    assert check_prefix("runs/7/policy/") == "runs/7/policy"
    for bad in ("m/@3", "@versions", "", "a//b"):
        with pytest.raises(ValueError):
            check_prefix(bad)
    with pytest.raises(ValueError, match="'@'"):
        check_tensor_name("enc/@1/w")
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            check_version(bad)  # type: ignore[arg-type]


def test_a_manifest_round_trips_and_anything_else_is_not_one() -> None:
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = Manifest("m", 7, {"w": TensorEntry.of("w", w)}, committed_at=1.5, keep=3)
    back = Manifest.decode(m.encode(), "m", 7)
    assert back == m
    assert back.tensors["w"].digest == hashlib.sha256(w.tobytes()).hexdigest()
    raw = m.encode()
    with pytest.raises(ManifestError, match="not committed"):
        Manifest.decode(bytes(len(raw)), "m", 7)  # a claim: zeros
    with pytest.raises(ManifestError, match="not committed"):
        Manifest.decode(b"", "m", 7)
    with pytest.raises(ManifestError, match="says"):
        Manifest.decode(raw, "m", 8)  # stored under another number
    with pytest.raises(ManifestError):
        Manifest.decode(raw[:-3], "m", 7)
    with pytest.raises(ManifestError, match="not irdma-model-version"):
        Manifest.decode(b'{"format": "x"}', "m", 7)


def test_a_part_round_trips_and_a_malformed_one_is_named() -> None:
    p = Part({"a": TensorEntry("a", "bfloat16", (4,), "00")})
    assert Part.decode(p.encode()) == p
    with pytest.raises(ManifestError, match="part"):
        Part.decode(b"\0\0")


def test_byte_runs_of_rows_columns_and_blocks() -> None:
    # Rows of a 4x6 float32: one run.
    assert list(byte_runs((4, 6), 4, (slice(1, 3),))) == [(24, 48)]
    # Columns: a run per row.
    assert list(byte_runs((3, 6), 4, (slice(None), slice(2, 4)))) == [(8, 8), (32, 8), (56, 8)]
    # Everything: one run; nothing: none.
    assert list(byte_runs((3, 6), 4, ())) == [(0, 72)]
    assert list(byte_runs((3, 6), 4, (slice(2, 2),))) == []
    # A scalar.
    assert list(byte_runs((), 8, ())) == [(0, 8)]
    with pytest.raises(ValueError, match="step"):
        list(byte_runs((4,), 4, (slice(0, 4, 2),)))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_byte_runs_select_exactly_what_numpy_slicing_does(data: st.DataObject) -> None:
    ndim = data.draw(st.integers(1, 4))
    shape = tuple(data.draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    cut = data.draw(st.integers(0, ndim))
    index = []
    for k in range(cut):
        a = data.draw(st.integers(0, shape[k]))
        b = data.draw(st.integers(a, shape[k]))
        index.append(slice(a, b))
    dtype = data.draw(st.sampled_from(["uint8", "float16", "float32", "float64"]))
    x = np.arange(int(np.prod(shape)), dtype=np.int64).astype(dtype).reshape(shape)
    raw = x.tobytes()
    got = b"".join(raw[o : o + n] for o, n in byte_runs(shape, x.itemsize, index))
    want = x[tuple(index)]
    assert got == want.tobytes()
    assert slice_shape(shape, index) == want.shape
    runs = list(byte_runs(shape, x.itemsize, index))
    # Adjacent runs are merged: no run ends where the next starts.
    assert all(a[0] + a[1] < b[0] for a, b in itertools.pairwise(runs))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_delta_applied_to_the_old_range_gives_the_new_bit_for_bit(data: st.DataObject) -> None:
    from irdma.protocol import deltas

    dtype = data.draw(st.sampled_from(["int8", "float16", "float32", "float64", "complex128"]))
    n = data.draw(st.integers(0, 3000))
    itemsize = np.dtype(dtype).itemsize
    old = np.frombuffer(data.draw(st.binary(min_size=n * itemsize, max_size=n * itemsize)), dtype)
    new = old.copy()
    flat = new.view(np.uint8).reshape(n, itemsize) if n else new.view(np.uint8)
    for i in data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=n)) if n else []:
        flat[i, data.draw(st.integers(0, itemsize - 1))] ^= 0x40  # NaN payloads, -0.0 too
    payload = b"".join(
        bytes(b) for b in deltas.encode(old.data.cast("B"), new.data.cast("B"), itemsize)
    )
    into = bytearray(old.tobytes())
    deltas.apply(payload, memoryview(into), itemsize)
    assert bytes(into) == new.tobytes()
    changed = int((old.view(np.uint8).reshape(n, itemsize) != flat).any(axis=1).sum()) if n else 0
    # Never more than the whole range; the values of the changed elements at least.
    assert changed * itemsize <= len(payload) - deltas.HEAD.size <= max(n * itemsize, 0)


def test_a_malformed_delta_is_refused_by_name() -> None:
    from irdma.protocol import ProtocolError, deltas

    old = np.zeros(100, np.float32)
    new = old.copy()
    new[7] = 1
    good = b"".join(bytes(b) for b in deltas.encode(old.data.cast("B"), new.data.cast("B"), 4))
    into = memoryview(bytearray(old.tobytes()))
    cases = [
        (good[:10], into, 4, "no head"),
        (good[:-1], into, 4, "indices has"),
        (good, memoryview(bytearray(200)), 2, "4-byte elements for 2-byte ones"),
        (good, memoryview(bytearray(8)), 4, "past the range's 2 elements"),
    ]
    for payload, target, itemsize, why in cases:
        with pytest.raises(ProtocolError, match=why):
            deltas.apply(payload, target, itemsize)


def test_bookkeeping_names_parse_back_to_their_model_and_version() -> None:
    from irdma.client.manifests import PINS_DIR, VERSIONS_DIR, bookkeeping_of, pin_name

    assert bookkeeping_of(manifest_name("runs/7/policy", 12)) == ("runs/7/policy", VERSIONS_DIR, 12)
    assert bookkeeping_of(pin_name("p", 3, "host-1-ab")) == ("p", PINS_DIR, 3)
    for other in ("p/@3/w", "p/w", "@versions/0001", "p/@versions/x", "p/@pins/0/id"):
        assert bookkeeping_of(other) is None, other
