"""Tests for irdma.protocol: the sans-IO wire format."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from irdma.protocol import (
    DTYPE_CODES,
    ENTRY_SIZE,
    HEADER_SIZE,
    MAGIC,
    MAX_DIMS,
    MAX_NAME_BYTES,
    MAX_SHARDS,
    PROTOCOL_VERSION,
    REQUEST_ID,
    REQUEST_ID_OFFSET,
    WIRE_BFLOAT16,
    BatchEntry,
    Flag,
    Header,
    Op,
    ProtocolError,
    Status,
    TensorMeta,
    decode_json,
    dtype_code,
    dtype_from_code,
    encode_json,
    pack_entries,
    pack_header,
    pack_response,
    tensor_key,
    unpack_entries,
    unpack_header,
    validate_name,
)
from irdma.protocol.messages import ReadBatch, batch_count

U8 = st.integers(0, 2**8 - 1)
U16 = st.integers(0, 2**16 - 1)
U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
FINITE = st.floats(allow_nan=False)

headers = st.builds(
    Header,
    op=U8,
    request_id=U64,
    key=U64,
    shard=U32,
    offset=U64,
    size=U64,
    length=U64,
    version=U64,
    alpha=FINITE,
    layout=U64,
    flags=U16,
    status=U16,
    dtype=U16,
    proto=U8,
    worker=U32,
    step=U64,
    txn=U64,
    wire=U16,
    stamp=U64,
    epoch=U16,
)

entries = st.builds(
    BatchEntry,
    key=U64,
    shard=U32,
    offset=U64,
    length=U64,
    version=U64,
    alpha=FINITE,
    status=U16,
    dtype=U16,
)


# -- sizes -------------------------------------------------------------------


def test_struct_sizes() -> None:
    assert HEADER_SIZE == 112
    assert ENTRY_SIZE == 48
    assert len(Header(op=Op.HELLO).pack()) == 112
    assert len(BatchEntry(key=1).pack()) == 48


# -- header ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(headers)
def test_header_round_trip(h: Header) -> None:
    data = h.pack()
    assert len(data) == HEADER_SIZE
    assert data[:4] == MAGIC
    assert unpack_header(data) == h
    assert unpack_header(bytearray(data)) == h
    assert unpack_header(memoryview(data)) == h


@settings(max_examples=50, deadline=None)
@given(headers, st.sampled_from([math.nan, math.inf, -math.inf, -0.0]))
def test_header_round_trip_special_alpha(h: Header, alpha: float) -> None:
    data = Header(op=h.op, key=h.key, alpha=alpha).pack()
    back = unpack_header(data)
    assert back.pack() == data
    assert struct.pack("<d", back.alpha) == struct.pack("<d", alpha)


def test_header_is_little_endian_with_fixed_layout() -> None:
    data = pack_header(op=Op.READ, request_id=0x0102030405060708, shard=7, alpha=2.0)
    assert data[0:4] == b"IRDM"
    assert data[4] == PROTOCOL_VERSION
    assert data[5] == Op.READ
    # shard (u32) at 12, request id (u64) at 16.
    assert data[12:16] == (7).to_bytes(4, "little")
    assert data[16:24] == bytes([8, 7, 6, 5, 4, 3, 2, 1])
    # alpha (f64) at 64, layout (u64) at 72.
    assert struct.unpack_from("<d", data, 64)[0] == 2.0


@settings(max_examples=50, deadline=None)
@given(headers, U64)
def test_request_id_can_be_stamped_into_packed_header(h: Header, rid: int) -> None:
    data = bytearray(h.pack())
    assert REQUEST_ID.unpack_from(data, REQUEST_ID_OFFSET)[0] == h.request_id
    REQUEST_ID.pack_into(data, REQUEST_ID_OFFSET, rid)
    back = unpack_header(data)
    assert back.request_id == rid
    assert back == h._replace(request_id=rid)


def test_header_defaults() -> None:
    h = unpack_header(Header(op=Op.HELLO).pack())
    assert h.proto == PROTOCOL_VERSION
    assert h.alpha == 1.0
    assert h.dtype == 0
    assert h.layout == 0
    assert not h.is_response


@pytest.mark.parametrize("bad", [b"XRDM", b"irdm", b"\0\0\0\0", b"MDRI"])
def test_header_bad_magic(bad: bytes) -> None:
    data = bad + Header(op=Op.HELLO).pack()[4:]
    with pytest.raises(ProtocolError, match="magic"):
        unpack_header(data)


@pytest.mark.parametrize("n", [0, 1, 4, 64, 79, 81, 160])
def test_header_wrong_length(n: int) -> None:
    data = (Header(op=Op.HELLO).pack() * 3)[:n]
    with pytest.raises(ProtocolError, match=str(n)):
        unpack_header(data)


def test_header_response() -> None:
    req = Header(op=Op.READ, request_id=42, key=9, shard=3, length=100, version=5, alpha=0.5)
    resp = req.response(Status.NOT_FOUND)
    assert resp.is_response
    assert resp.flags & Flag.RESPONSE
    assert resp.status == Status.NOT_FOUND
    assert resp.request_id == 42
    assert resp.key == 9
    assert resp.length == 0
    assert resp.shard == 3
    assert resp.version == 5
    assert resp.alpha == 0.5
    assert (resp.op, resp.dtype, resp.proto) == (req.op, req.dtype, req.proto)
    ok = req.response(length=5, flags=Flag.PINNED, version=7)
    assert ok.status == Status.OK
    assert ok.flags == Flag.RESPONSE | Flag.PINNED
    assert ok.length == 5
    assert ok.version == 7
    assert unpack_header(ok.pack()) == ok
    # A response to a response stays a response; the request itself is unchanged.
    assert ok.response().is_response
    assert not req.is_response


def test_pack_response_is_the_packed_response_header() -> None:
    req = Header(
        op=Op.READ,
        request_id=7,
        key=3,
        shard=2,
        offset=9,
        size=4096,
        version=11,
        alpha=0.25,
        layout=5,
        dtype=11,
        worker=1,
        step=4,
        txn=99,
    )
    for status, length, flags, version in (
        (Status.OK, 4096, 0, 12),
        (Status.OK, 8, Flag.PINNED | Flag.MAPPED, None),
        (Status.NOT_FOUND, 17, 0, None),
    ):
        want = req.response(status, length=length, flags=flags, version=version).pack()
        assert pack_response(req, status, length, flags, version) == want


def test_a_batch_answer_echoes_its_count_in_the_shard_field() -> None:
    h = unpack_header(ReadBatch(count=17).frame(0).response().pack())
    assert batch_count(h) == 17


# -- batch entries -----------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(entries, max_size=20))
def test_entries_round_trip(es: list[BatchEntry]) -> None:
    data = pack_entries(es)
    assert len(data) == ENTRY_SIZE * len(es)
    assert unpack_entries(data, len(es)) == es
    # Entries sit at the start of the payload; data after them is ignored.
    assert unpack_entries(memoryview(data + b"payload bytes"), len(es)) == es


def test_entry_defaults() -> None:
    (e,) = unpack_entries(BatchEntry(key=5).pack(), 1)
    assert e == BatchEntry(key=5, shard=0, offset=0, length=0, version=0, alpha=1.0)
    assert e.status == Status.OK
    assert e.dtype == 0


@pytest.mark.parametrize(("count", "have"), [(1, 0), (1, 47), (2, 95), (3, 96)])
def test_entries_short_payload(count: int, have: int) -> None:
    data = pack_entries([BatchEntry(key=i) for i in range(count)])[:have]
    with pytest.raises(ProtocolError, match=f"{count} entries"):
        unpack_entries(data, count)


def test_entries_fewer_than_available() -> None:
    es = [BatchEntry(key=i, shard=i) for i in range(3)]
    assert unpack_entries(pack_entries(es), 2) == es[:2]
    assert unpack_entries(b"", 0) == []


# -- names and keys ----------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/a",
        "a/",
        "a//b",
        ".",
        "..",
        "a/./b",
        "a/../b",
        "a\0b",
        "x" * (MAX_NAME_BYTES + 1),
        "é" * (MAX_NAME_BYTES // 2 + 1),  # under the limit in characters, over in bytes
        "a\udc80",  # lone surrogate: cannot be hashed into a key
        5,
        None,
        b"abc",
    ],
)
def test_bad_names_rejected(name: object) -> None:
    with pytest.raises(ValueError):
        validate_name(name)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TensorMeta(name, "float32", (4,), 16)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name", ["a", "model/layer.weight", "a.b/c..d/.e", "x" * MAX_NAME_BYTES, "ü/日本"]
)
def test_good_names_accepted(name: str) -> None:
    assert validate_name(name) == name
    assert TensorMeta(name, "float32", (4,), 16).name == name


def test_tensor_key_is_stable_64_bit() -> None:
    # A fixed value: every process and every version must agree on keys.
    assert tensor_key("model/layer.weight") == 0xDAC403692872F327
    keys = {tensor_key(f"t{i}") for i in range(1000)}
    assert len(keys) == 1000
    assert all(0 <= k < 2**64 for k in keys)
    assert TensorMeta("a/b", "uint8", (1,), 1).key == tensor_key("a/b")


# -- TensorMeta validation ---------------------------------------------------


@pytest.mark.parametrize(
    "dtype", ["float128", "object", "str", "<f4", "f4", "int", "", "float8_e4m3fnuz"]
)
def test_meta_unsupported_dtype(dtype: str) -> None:
    with pytest.raises(ValueError, match="dtype"):
        TensorMeta("t", dtype, (4,), 64)


@pytest.mark.parametrize(
    "shape",
    [(-1,), (4, -2), (1.0,), (2, 2.5), (True,), (3, False), ("3",), (None,), (np.int64(3),)],
)
def test_meta_bad_dims(shape: tuple) -> None:
    with pytest.raises(ValueError, match="shape"):
        TensorMeta("t", "float32", shape, 64)


def test_meta_dims_limit() -> None:
    assert TensorMeta("t", "float32", (1,) * MAX_DIMS, 64).nbytes == 4
    with pytest.raises(ValueError, match="dimensions"):
        TensorMeta("t", "float32", (1,) * (MAX_DIMS + 1), 64)


@pytest.mark.parametrize(
    ("dtype", "shard_size"),
    [
        ("float32", 0),
        ("float32", -4),
        ("float32", 6),
        ("float64", 4),
        ("complex128", 24),
        ("int16", 3),
        ("float32", 4.0),
        ("float32", "4096"),
        ("float32", None),
        ("uint8", True),
    ],
)
def test_meta_bad_shard_size(dtype: str, shard_size: object) -> None:
    with pytest.raises(ValueError, match="shard size"):
        TensorMeta("t", dtype, (4,), shard_size)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("dtype", "shard_size"), [("uint8", 1), ("float64", 8), ("complex128", 32)]
)
def test_meta_smallest_shard_size(dtype: str, shard_size: int) -> None:
    assert TensorMeta("t", dtype, (4,), shard_size).shard_size == shard_size


def test_meta_properties() -> None:
    m = TensorMeta("w", "float64", (3, 5), 32)
    assert m.nbytes == 3 * 5 * 8
    assert m.num_shards == 4  # 120 bytes in 32-byte shards
    assert m.np_dtype == np.dtype("<f8")
    assert m.dtype_code == DTYPE_CODES["float64"]
    assert m.shard_span(3) == (96, 24)


# -- to_dict / from_dict -----------------------------------------------------


def test_meta_dict_round_trip() -> None:
    m = TensorMeta("a/b", "int16", (2, 3, 0), 64, {"init": "zeros"})
    d = m.to_dict()
    assert d == {
        "name": "a/b",
        "dtype": "int16",
        "shape": [2, 3, 0],
        "shard_size": 64,
        "options": {"init": "zeros"},
    }
    back = TensorMeta.from_dict(decode_json(encode_json(d)))
    assert back == m
    assert back.layout == m.layout


def test_meta_from_dict_options_optional() -> None:
    m = TensorMeta.from_dict({"name": "t", "dtype": "uint8", "shape": [3], "shard_size": 1})
    assert m.options == {}
    assert m.shape == (3,)


GOOD = {"name": "t", "dtype": "float32", "shape": [4, 4], "shard_size": 64, "options": {}}


@pytest.mark.parametrize("missing", ["name", "dtype", "shape", "shard_size"])
def test_meta_from_dict_missing_key(missing: str) -> None:
    d = {k: v for k, v in GOOD.items() if k != missing}
    with pytest.raises(ValueError, match=missing):
        TensorMeta.from_dict(d)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("name", 5),
        ("name", None),
        ("name", ["t"]),
        ("dtype", 11),
        ("dtype", ["float32"]),
        ("dtype", {"x": 1}),
        ("shape", 16),
        ("shape", "4,4"),
        ("shape", {"0": 4}),
        ("shape", [4, "4"]),
        ("shape", [4, 1.5]),
        ("shape", [[4], 4]),
        ("shape", [4, None]),
        ("shard_size", "64"),
        ("shard_size", 64.0),
        ("shard_size", None),
        ("shard_size", [64]),
        ("options", []),
        ("options", "x"),
    ],
)
def test_meta_from_dict_wrong_types(key: str, value: object) -> None:
    with pytest.raises(ValueError):
        TensorMeta.from_dict(GOOD | {key: value})


@pytest.mark.parametrize("d", [None, [], "meta", 5, [("name", "t")]])
def test_meta_from_dict_not_an_object(d: object) -> None:
    with pytest.raises(ValueError, match="object"):
        TensorMeta.from_dict(d)


def test_meta_from_dict_accepts_good() -> None:
    assert TensorMeta.from_dict(GOOD) == TensorMeta("t", "float32", (4, 4), 64)


# -- shard spans -------------------------------------------------------------

DTYPES = sorted(DTYPE_CODES)


@st.composite
def metas(draw: st.DrawFn) -> TensorMeta:
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 40), max_size=4)))
    itemsize = np.dtype(dtype).itemsize
    # At most MAX_SHARDS shards (a larger count is refused by TensorMeta: 40**4
    # items in shards of one item would be 2.56 million).
    fewest = max(1, -(-int(np.prod(shape, dtype=np.int64)) // MAX_SHARDS))
    shard_size = itemsize * draw(st.integers(fewest, max(fewest, 200)))
    return TensorMeta("t", dtype, shape, shard_size)


@settings(max_examples=200, deadline=None)
@given(metas())
def test_shard_spans_cover_tensor(m: TensorMeta) -> None:
    n = int(np.prod(m.shape, dtype=np.int64)) * np.dtype(m.dtype).itemsize
    assert m.nbytes == n
    spans = [m.shard_span(i) for i in range(m.num_shards)]
    if n == 0:
        assert spans == [(0, 0)]
    else:
        assert m.num_shards == -(-n // m.shard_size)
        pos = 0
        for start, length in spans:
            assert start == pos
            assert 0 < length <= m.shard_size
            pos += length
        assert pos == n
        # Every shard but the last is full.
        assert all(length == m.shard_size for _, length in spans[:-1])
    for bad in (-1, m.num_shards, m.num_shards + 5):
        with pytest.raises(ValueError, match="out of range"):
            m.shard_span(bad)


def test_zero_size_tensor_has_one_empty_shard() -> None:
    for shape in [(0,), (3, 0, 2), (0, 0)]:
        m = TensorMeta("z", "float32", shape, 4096)
        assert m.nbytes == 0
        assert m.num_shards == 1
        assert m.shard_span(0) == (0, 0)


def test_scalar_tensor() -> None:
    m = TensorMeta("s", "complex64", (), 8)
    assert m.nbytes == 8
    assert m.num_shards == 1
    assert m.shard_span(0) == (0, 8)


# -- layout fingerprint ------------------------------------------------------


def test_layout_changes_with_each_field() -> None:
    base = TensorMeta("t", "float32", (4, 6), 16)
    variants = [
        TensorMeta("t", "int32", (4, 6), 16),
        TensorMeta("t", "float32", (6, 4), 16),
        TensorMeta("t", "float32", (24,), 16),
        TensorMeta("t", "float32", (4, 6, 1), 16),
        TensorMeta("t", "float32", (4, 6), 32),
    ]
    layouts = {base.layout} | {v.layout for v in variants}
    assert len(layouts) == 1 + len(variants)
    for v in variants:
        assert not base.same_layout(v)
    # Options are not part of the layout. The name is (a reader holding a
    # renamed tensor's old name must be told it is stale), yet the same dtype,
    # shape and shard size under another name is the same layout to a create.
    assert TensorMeta("t", "float32", (4, 6), 16, {"x": 1}).layout == base.layout
    same = TensorMeta("other/name", "float32", (4, 6), 16, {"x": 1}, place=base.key)
    assert same.layout != base.layout and same.key == base.key
    assert base.same_layout(same)


def test_layout_does_not_confuse_shapes() -> None:
    a = TensorMeta("t", "uint8", (1, 23), 1)
    b = TensorMeta("t", "uint8", (12, 3), 1)
    assert a.layout != b.layout


@settings(max_examples=200, deadline=None)
@given(metas())
def test_layout_never_zero(m: TensorMeta) -> None:
    assert m.layout != 0
    assert 0 < m.layout < 2**64
    assert m.layout == TensorMeta(m.name, m.dtype, m.shape, m.shard_size).layout


# -- dtype codes -------------------------------------------------------------


@pytest.mark.parametrize("name", DTYPES)
def test_dtype_code_round_trip(name: str) -> None:
    code = DTYPE_CODES[name]
    dt = np.dtype(name)
    assert dtype_code(dt) == code
    assert dtype_code(name) == code
    assert dtype_code(dt.type) == code
    assert dtype_code(dt.newbyteorder(">")) == code
    assert dtype_code(dt.newbyteorder("<")) == code
    back = dtype_from_code(code)
    assert back == dt.newbyteorder("<")
    assert back.byteorder in ("<", "|", "=")
    assert dtype_code(back) == code


def test_dtype_codes_distinct_and_nonzero() -> None:
    codes = list(DTYPE_CODES.values())
    assert len(set(codes)) == len(codes)
    assert 0 not in codes


def test_dtype_codes_keep_their_numbers() -> None:
    """Codes are only added: peers of an older version read the same types."""
    first = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
    first += ["float16", "float32", "float64", "complex64", "complex128"]
    added = ["bfloat16", "float8_e4m3fn", "float8_e5m2"]
    assert {name: code for code, name in enumerate(first + added, start=1)} == DTYPE_CODES
    # The wire dtype bfloat16 (a narrowed float32) kept its code as a stored one.
    assert DTYPE_CODES["bfloat16"] == WIRE_BFLOAT16


def test_the_narrow_floats_are_stored_by_name() -> None:
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        meta = TensorMeta("t", name, (2, 3), 60)
        assert meta.np_dtype == dtype_from_code(meta.dtype_code)
        assert meta.np_dtype.name == name and meta.nbytes == 6 * meta.np_dtype.itemsize


def test_an_unsupported_dtype_names_itself_and_the_supported_ones() -> None:
    with pytest.raises(ValueError) as info:
        dtype_code("float8_e4m3fnuz")
    assert "float8_e4m3fnuz" in str(info.value)
    for name in DTYPE_CODES:
        assert name in str(info.value)


@pytest.mark.parametrize(
    "dtype",
    [object, str, bytes, "U4", "S3", [("a", "<i4"), ("b", "<f8")], "datetime64[s]", "V8"],
)
def test_dtype_code_unsupported(dtype: object) -> None:
    with pytest.raises(ValueError, match="unsupported"):
        dtype_code(dtype)


@pytest.mark.parametrize("code", [0, 18, 99, 2**16 - 1, -1])
def test_dtype_from_code_unknown(code: int) -> None:
    with pytest.raises(ValueError, match="unknown"):
        dtype_from_code(code)


# -- JSON payloads -----------------------------------------------------------


@pytest.mark.parametrize("obj", [{}, [], {"a": [1, 2.5, None, True, "ü"]}, "x", 0])
def test_json_round_trip(obj: object) -> None:
    data = encode_json(obj)
    assert isinstance(data, bytes)
    assert decode_json(data) == obj
    assert decode_json(bytearray(data)) == obj
    assert decode_json(memoryview(data)) == obj


@pytest.mark.parametrize("garbage", [b"", b"{", b"{'a': 1}", b"\xff\xfe\x00", b"[1,]", b"nope"])
def test_decode_json_garbage(garbage: bytes) -> None:
    with pytest.raises(ProtocolError, match="JSON"):
        decode_json(garbage)
