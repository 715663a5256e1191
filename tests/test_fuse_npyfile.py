"""irdma_fuse.npyfile: .npy headers we serve, and .npy files written to us."""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from irdma_fuse.npyfile import (
    BadNpy,
    NpyLayout,
    check_start,
    header_for,
    parse_header,
    parse_npy,
)
from numpy.lib import format as npformat

from irdma.protocol import DTYPE_CODES

from .helpers.payloads import npy_bytes, same_array

# The dtypes numpy.save itself records (bfloat16 and float8 need irdma's headers).
DTYPES = [name for name in DTYPE_CODES if not name.startswith(("bfloat", "float8"))]
SHAPES = [
    (),
    (0,),
    (1,),
    (7,),
    (3, 4),
    (0, 5),
    (5, 0),
    (2, 3, 4),
    (1, 1, 1, 1),
    (3, 0, 2),
    (65536,),
    (1000, 10),
]


class _HeaderOnly:
    """A file object that keeps np.save's first write (the header) and refuses the data."""

    class Stop(Exception):
        pass

    def __init__(self) -> None:
        self.header: bytes | None = None

    def write(self, data: bytes) -> int:
        if self.header is not None:
            raise self.Stop
        self.header = bytes(data)
        return len(data)


def np_save_header(dtype: str | np.dtype, shape: tuple[int, ...]) -> bytes:
    """The header np.save writes for a C-order array of ``dtype`` and ``shape``, without
    allocating it (a broadcast view stands in; np.save stops after the header)."""
    arr = np.broadcast_to(np.zeros((), dtype=dtype), shape)
    sink = _HeaderOnly()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Stored array in format 2.0"
        with contextlib.suppress(_HeaderOnly.Stop):
            np.save(sink, arr)  # type: ignore[arg-type]
    assert sink.header is not None
    return sink.header


def random_array(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return np.frombuffer(rng.bytes(n), dtype=dtype).reshape(shape).copy()


# -- header_for ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_header_for_equals_np_save(dtype: str, shape: tuple[int, ...]) -> None:
    data = npy_bytes(random_array(dtype, shape))
    header = header_for(dtype, shape)
    assert data[: len(header)] == header
    assert len(data) == len(header) + np.dtype(dtype).itemsize * int(np.prod(shape))
    assert len(header) % 64 == 0
    assert header[:8] == b"\x93NUMPY\x01\x00"
    assert header.endswith(b"\n")


@pytest.mark.parametrize(
    "shape",
    [
        (2**40,),
        (2**30, 2**30 - 1),
        (10**9, 10**9, 1),
        (1,) * 32,
        (2,) * 32,
        (1,) * 64,  # numpy's largest ndim
        (3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5),
    ],
    ids=str,
)
def test_header_for_big_shapes_equals_np_save(shape: tuple[int, ...]) -> None:
    header = header_for("float32", shape)
    assert header == np_save_header("float32", shape)
    assert len(header) % 64 == 0


def test_header_for_stored_little_endian() -> None:
    """Tensors are stored little-endian: the served header says so whatever was asked."""
    expected = np_save_header("<f4", (3,))
    for name in ("float32", "<f4", ">f4", "=f4"):
        assert header_for(name, (3,)) == expected
    assert b"'<f8'" in header_for(">f8", (2, 2))
    assert b"'|u1'" in header_for("uint8", (5,))


def test_header_for_format_2_0() -> None:
    """Format 2.0 is needed only for headers over 65535 bytes. No numeric dtype and no
    shape (at most 64 dims) gets there; a dtype with thousands of fields does, which is
    the one way to check that header_for picks 2.0 exactly as np.save does."""
    dtype = ",".join(["<f4"] * 6000)
    header = header_for(dtype, (1,))
    assert header[:8] == b"\x93NUMPY\x02\x00"
    assert len(header) > 65535
    assert len(header) % 64 == 0
    assert header == np_save_header(np.dtype(dtype), (1,))


@given(
    st.sampled_from(DTYPES),
    st.lists(st.integers(min_value=0, max_value=2**14), max_size=4).map(tuple),
)
def test_header_for_matches_np_save_and_parses_back(dtype: str, shape: tuple[int, ...]) -> None:
    header = header_for(dtype, shape)
    assert header == np_save_header(dtype, shape)
    assert len(header) % 64 == 0
    layout = parse_header(header)
    assert layout == NpyLayout(np.dtype(dtype), shape, len(header))


# -- parse_header / parse_npy: round trips ------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_parse_npy_round_trip(dtype: str, shape: tuple[int, ...]) -> None:
    arr = random_array(dtype, shape, seed=len(shape))
    data = npy_bytes(arr)
    layout = parse_header(data)
    assert layout.dtype == arr.dtype
    assert layout.shape == shape
    assert layout.header_len == len(header_for(dtype, shape))
    assert layout.nbytes == arr.nbytes
    assert same_array(parse_npy(data), arr)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if np.dtype(d).itemsize > 1])
def test_parse_npy_big_endian(dtype: str) -> None:
    arr = random_array(dtype, (4, 3), seed=3).astype(np.dtype(dtype).newbyteorder(">"))
    data = npy_bytes(arr)
    assert b"'>" in data[:128]
    layout = parse_header(data)
    assert layout.dtype == arr.dtype
    assert layout.dtype.byteorder == ">"
    assert layout.nbytes == arr.nbytes
    out = parse_npy(data)
    assert same_array(out, arr)
    np.testing.assert_array_equal(out.astype(dtype), arr.astype(dtype))


def test_parse_npy_from_a_c_order_copy_of_a_view() -> None:
    """np.save of a non-contiguous view writes C order: accepted."""
    base = np.arange(60, dtype=np.int32).reshape(6, 10)
    view = base[::2, 1::3]
    assert same_array(parse_npy(npy_bytes(view)), np.ascontiguousarray(view))


def test_parse_npy_fortran_order_1d_is_accepted() -> None:
    """A 1-D array has one layout; a header saying fortran_order for it is fine."""
    arr = np.arange(5, dtype=np.float64)
    buf = io.BytesIO()
    npformat.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": True, "shape": (5,)})
    data = buf.getvalue() + arr.tobytes()
    assert same_array(parse_npy(data), arr)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_parse_npy_every_format_version(version: tuple[int, int]) -> None:
    arr = random_array("float32", (5, 7), seed=9)
    buf = io.BytesIO()
    npformat.write_array(buf, arr, version=version)
    data = buf.getvalue()
    assert data[6:8] == bytes(version)
    layout = parse_header(data)
    assert (layout.dtype, layout.shape) == (arr.dtype, arr.shape)
    assert same_array(parse_npy(data), arr)


def test_parse_npy_is_a_view_of_a_writable_buffer() -> None:
    arr = np.arange(6, dtype=np.int16)
    data = bytearray(npy_bytes(arr))
    out = parse_npy(data)
    header_len = parse_header(data).header_len
    data[header_len] = 0x7F
    assert out[0] == 0x7F


def test_parse_header_accepts_header_without_data() -> None:
    """parse_header reads the header only; the data length is parse_npy's check."""
    data = npy_bytes(np.zeros((100, 3), dtype=np.float64))
    header = header_for("float64", (100, 3))
    layout = parse_header(header)
    assert layout == NpyLayout(np.dtype("float64"), (100, 3), len(header))
    assert layout.nbytes == len(data) - len(header)


# -- rejections ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello world, not a numpy file at all" * 4,
        b"\x93NUMPY",
        b"\x93NUMPY\x01\x00",
        b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'",
        b"\x93NUMPY\x09\x00\x10\x00" + b" " * 16,  # unknown version
        b"PK\x03\x04" + bytes(200),  # a .npz (zip) is not a .npy
        bytes(256),
    ],
    ids=lambda d: repr(d[:16]),
)
def test_parse_rejects_garbage(data: bytes) -> None:
    with pytest.raises(BadNpy):
        parse_header(data)
    with pytest.raises(BadNpy):
        parse_npy(data)


@pytest.mark.parametrize("cut", [1, 7, 8, 9, 10, 20, 50, 127])
def test_parse_rejects_truncated_header(cut: int) -> None:
    data = npy_bytes(np.zeros(3, dtype=np.float32))
    assert len(header_for("float32", (3,))) == 128
    with pytest.raises(BadNpy):
        parse_header(data[:cut])
    with pytest.raises(BadNpy):
        parse_npy(data[:cut])


def test_parse_rejects_malformed_header_dict() -> None:
    for text in [
        "{'descr': '<f4', 'fortran_order': False}",  # no shape
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'extra': 1}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3.0,)}",
        "{'descr': '<f4', 'fortran_order': 'no', 'shape': (3,)}",
        "{'descr': 'not a dtype', 'fortran_order': False, 'shape': (3,)}",
        "[1, 2, 3]",
        "__import__('os')",
    ]:
        with pytest.raises(BadNpy):
            parse_header(raw_header(text))


def raw_header(text: str) -> bytes:
    """A version 1.0 header holding ``text`` as its dict, padded to 128 bytes."""
    body = text.encode() + b" " * (117 - len(text)) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


@pytest.mark.parametrize("shape", [(-1,), (-2, -3), (4, -1), (-4, -6)], ids=str)
def test_parse_rejects_negative_dimension(shape: tuple[int, ...]) -> None:
    """A negative dimension is not a shape: no layout (negative nbytes) and no reshape."""
    header = raw_header(f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape!r}, }}")
    assert len(header) == 128
    n = abs(int(np.prod(shape))) * 4
    with pytest.raises(BadNpy):
        parse_header(header)
    with pytest.raises(BadNpy):
        parse_npy(header + bytes(n))


@pytest.mark.parametrize("delta", [-100, -1, 1, 64])
@pytest.mark.parametrize("shape", [(10,), (0,), (), (4, 5)], ids=str)
def test_parse_npy_rejects_wrong_data_length(delta: int, shape: tuple[int, ...]) -> None:
    arr = random_array("float32", shape, seed=1)
    data = npy_bytes(arr)
    if delta < 0 and -delta > arr.nbytes:
        delta = -arr.nbytes if arr.nbytes else 1
    wrong = data[: len(data) + delta] if delta < 0 else data + bytes(delta)
    assert len(wrong) != len(data)
    parse_header(wrong)  # the header itself is fine
    with pytest.raises(BadNpy, match="bytes"):
        parse_npy(wrong)


def test_parse_npy_rejects_missing_data() -> None:
    data = npy_bytes(np.ones((8, 8), dtype=np.float32))
    with pytest.raises(BadNpy):
        parse_npy(data[: len(header_for("float32", (8, 8)))])


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (5, 2)], ids=str)
def test_parse_rejects_fortran_order(shape: tuple[int, ...]) -> None:
    arr = np.asfortranarray(random_array("float64", shape, seed=2))
    data = npy_bytes(arr)
    assert b"'fortran_order': True" in data[:128]
    with pytest.raises(BadNpy, match="Fortran"):
        parse_header(data)
    with pytest.raises(BadNpy, match="Fortran"):
        parse_npy(data)


def test_parse_rejects_object_dtype() -> None:
    data = npy_bytes(np.array([1, "a", None], dtype=object), allow_pickle=True)
    with pytest.raises(BadNpy):
        parse_header(data)
    with pytest.raises(BadNpy):
        parse_npy(data)


@pytest.mark.parametrize(
    "dtype",
    [
        [("a", "<i4"), ("b", "<f8")],
        [("x", "<f4", (3,))],
        [("a", "<i4"), ("o", "O")],
        [("u", "u1")],
    ],
    ids=str,
)
def test_parse_rejects_structured_dtype(dtype) -> None:
    arr = np.zeros(4, dtype=dtype)
    data = npy_bytes(arr, allow_pickle=True)
    with pytest.raises(BadNpy):
        parse_header(data)
    with pytest.raises(BadNpy):
        parse_npy(data)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_check_start_is_patient_until_the_header_is_whole(version: tuple[int, int]) -> None:
    """Every prefix of a valid header is right so far; the whole one gives its length."""
    buf = io.BytesIO()
    npformat.write_array(buf, np.zeros((3, 5), np.float32), version=version)
    header = buf.getvalue()[: parse_header(buf.getvalue()).header_len]
    for cut in range(len(header)):
        assert check_start(header[:cut]) is None
    assert check_start(header) == len(header)
    assert check_start(header + bytes(60)) == len(header)


@pytest.mark.parametrize(
    "data",
    [b"g", b"garbage\n", b"\x93NUMPZ", b"\x93NUMPY\x07\x00", b"PK\x03\x04", bytes(9)],
    ids=repr,
)
def test_check_start_refuses_what_cannot_begin_a_npy(data: bytes) -> None:
    with pytest.raises(BadNpy):
        check_start(data)


def test_check_start_refuses_a_whole_bad_header() -> None:
    with pytest.raises(BadNpy):
        check_start(raw_header("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }"))
