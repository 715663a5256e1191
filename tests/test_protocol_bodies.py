"""The metadata answers' JSON bodies (``irdma/protocol/bodies.py``): the bytes they were
as plain dicts, and a clear ProtocolError for a body that is not what it says."""

from __future__ import annotations

import json

import pytest

from irdma.protocol import ProtocolError, TensorMeta, encode_json
from irdma.protocol.bodies import AttachAnswer, AttachOffer, CreateAnswer, RenameBody, StatRecord

META = TensorMeta("b/w", "float32", (3, 1 << 20), 4 << 20, {"mode": "async"})


def as_dict_before(meta: TensorMeta, **extra: object) -> dict:
    """A stat record as the daemon wrote it before it was typed (catalogue.info | extra)."""
    return {
        "meta": meta.to_dict(),
        "version": 7,
        "mtime": 1.5,
        "ctime": 1.25,
        "shards": {"0": 3, "2": 4},
    } | extra


def test_a_stat_record_is_the_bytes_it_was_and_reads_back_whole() -> None:
    record = StatRecord(META, 7, 1.5, 1.25, {2: 4, 0: 3}, node="n2")
    assert record.encode() == encode_json(as_dict_before(META, node="n2"))
    assert StatRecord.parse(record.encode()) == record
    evicting = StatRecord(META, 7, 1.5, 1.25, {0: 3, 2: 4}, evicted=(4, 9))
    assert evicting.encode() == encode_json(as_dict_before(META, evicted=[4, 9]))
    assert StatRecord.parse(evicting.encode()) == evicting


def test_a_record_without_shards_keeps_its_version_and_no_shard_map() -> None:
    older = {"meta": META.to_dict(), "version": 5}
    record = StatRecord.from_json(older)
    assert record.shards is None and record.version == 5 and record.mtime == 0.0


def test_create_answers_are_the_bytes_they_were() -> None:
    record = StatRecord(META, 7, 1.5, 1.25, {0: 3, 2: 4})
    made = CreateAnswer(record, created=True)
    assert made.encode() == encode_json(as_dict_before(META, created=True))
    assert CreateAnswer.parse(made.encode()) == made
    assert CreateAnswer().encode() == encode_json({"placed": False})
    assert not CreateAnswer.parse(encode_json({"placed": False})).placed
    assert CreateAnswer(fits=True).encode() == encode_json({"fits": True})
    assert CreateAnswer.parse(encode_json({"fits": True})) == CreateAnswer(fits=True)


def test_a_listing_parses_each_tensors_metadata_once() -> None:
    other = TensorMeta("b/x", "int8", (10,), 1 << 20)
    body = json.dumps([as_dict_before(META), as_dict_before(other)]).encode()
    known: dict[str, TensorMeta] = {}
    first = StatRecord.parse_list(body, known)
    again = StatRecord.parse_list(body, known)
    assert [r.meta.name for r in first] == ["b/w", "b/x"] and len(known) == 2
    assert all(a.meta is b.meta for a, b in zip(first, again, strict=True))


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[]", "not a JSON object"),
        (b'{"version": 1}', "no tensor metadata"),
        (b'{"meta": {"name": "b/w"}}', "metadata lacks"),
        (encode_json(as_dict_before(META, version="7")), "version '7' is not an integer"),
        (encode_json(as_dict_before(META, mtime=True)), "mtime True is not a number"),
        (encode_json(as_dict_before(META, shards=[1])), "shards is not an object"),
        (encode_json(as_dict_before(META, shards={"x": 1})), "not index: version pairs"),
        (encode_json(as_dict_before(META, evicted=["w"])), "evicted is not a list"),
        (encode_json(as_dict_before(META, node=3)), "node 3 is not a name"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_a_malformed_record_is_a_protocol_error_naming_what(body: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        StatRecord.parse(body)


def test_a_listing_that_is_not_a_list_is_refused() -> None:
    with pytest.raises(ProtocolError, match="not a JSON array"):
        StatRecord.parse_list(b"{}")
    with pytest.raises(ProtocolError, match="not a JSON object"):
        CreateAnswer.parse(b"[1]")


def test_rename_and_attach_bodies_are_the_bytes_they_were() -> None:
    assert RenameBody("a/x", "a/y").encode() == encode_json({"from": "a/x", "to": "a/y"})
    assert RenameBody.from_json({"from": "a/x", "to": "a/y"}) == RenameBody("a/x", "a/y")
    assert AttachOffer(1 << 20).encode() == encode_json({"staging": 1 << 20})
    assert AttachOffer(1 << 20, 4096).encode() == encode_json({"staging": 1 << 20, "shared": 4096})
    answer = AttachAnswer("n1", "host:ns", 1 << 30, (4096, 64), 4096)
    assert answer.encode() == encode_json(
        {"node": "n1", "host": "host:ns", "arena_size": 1 << 30, "directory": [4096, 64]}
        | {"shared": 4096}
    )
    assert AttachAnswer.parse(answer.encode()) == answer
    # A daemon without a directory or a shared region leaves the keys out.
    plain = encode_json({"node": "n1", "host": "h", "arena_size": 8192})
    assert AttachAnswer.parse(plain) == AttachAnswer("n1", "h", 8192)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"from": "a/x"}, "rename takes JSON keys"),
        ({"from": "a/x", "to": "a/y", "x": 1}, "rename takes JSON keys"),
        ({"from": "a/x", "to": ""}, "rename: "),
        (["a/x", "a/y"], "rename takes JSON keys"),
    ],
)
def test_a_bad_rename_body_is_refused_naming_why(body: object, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        RenameBody.from_json(body)


def test_attach_bodies_that_are_not_what_they_say() -> None:
    for bad in (b"{}", b"[1]", b"{x"):
        with pytest.raises(ProtocolError, match="must be JSON with 'staging'"):
            AttachOffer.parse(bad)
    with pytest.raises(ProtocolError, match="positive integer"):
        AttachOffer.parse(encode_json({"staging": -1}))
    # A shared region the daemon cannot use is no offer at all.
    assert AttachOffer.parse(encode_json({"staging": 8, "shared": "x"})).shared == 0
    for bad_answer in ({"node": "n1"}, {"node": 1, "host": "h", "arena_size": 8}):
        with pytest.raises(ProtocolError, match="malformed ATTACH answer"):
            AttachAnswer.parse(encode_json(bad_answer))
    odd = encode_json({"node": "n1", "host": "h", "arena_size": 8, "directory": [1, "x"]})
    assert AttachAnswer.parse(odd).directory is None
