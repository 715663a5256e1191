"""psd.replication.bodies: the replication JSON bodies, typed; the same bytes as before."""

from __future__ import annotations

import pytest
from irdma_psd.replication.bodies import (
    BadBody,
    CatchupAnswer,
    CatchupQuestion,
    CopyRequest,
    Heartbeat,
    Holding,
    ShardCopyBody,
)

from irdma.protocol import TensorMeta, decode_json, encode_json


def test_a_heartbeat_is_the_bytes_daemons_exchanged_as_a_dict() -> None:
    beat = Heartbeat("n2", True, False, boot=7, seq=3, epoch=0)
    assert beat.encode() == encode_json(
        {"node": "n2", "ready": True, "handoff": False, "boot": 7, "seq": 3, "epoch": 0}
    )
    assert Heartbeat.decode(beat.encode()) == beat
    assert beat.stamp == (7, 3)


def test_a_heartbeat_says_a_resync_is_owed_only_when_one_is() -> None:
    """Absent means nothing owed: the bytes of a heartbeat owing nothing are those a
    daemon of an older release sends and reads; only JSON true says one is owed."""
    owing = Heartbeat("n2", True, False, boot=7, seq=3, epoch=0, resync=True)
    assert owing.encode() == encode_json(
        {"node": "n2", "ready": True, "handoff": False, "boot": 7, "seq": 3, "epoch": 0}
        | {"resync": True}
    )
    assert Heartbeat.decode(owing.encode()) == owing
    assert b"resync" not in Heartbeat("n2", True, boot=7, seq=3, epoch=0).encode()
    assert not Heartbeat.parse({"node": "n2", "ready": True}).resync
    assert not Heartbeat.parse({"node": "n2", "ready": True, "resync": "yes"}).resync


def test_a_heartbeat_missing_its_stamp_and_epoch_has_none() -> None:
    """A peer that leaves them out (or sends another type) reports no stamp: its report
    is believed, never compared (``Membership.heard``)."""
    beat = Heartbeat.parse({"node": "n2", "ready": 1, "boot": "x", "epoch": 2.5})
    assert beat == Heartbeat("n2", True, False, None, None, None)
    assert beat.stamp is None


@pytest.mark.parametrize(
    "body, says",
    [
        ([], "heartbeat is not a JSON object"),
        ({"node": [], "ready": True}, "heartbeat names no sending daemon"),
        ({"ready": True}, "heartbeat names no sending daemon"),
    ],
)
def test_a_heartbeat_of_the_wrong_shape_says_why(body: object, says: str) -> None:
    with pytest.raises(BadBody, match=says):
        Heartbeat.parse(body)


def test_a_heartbeat_that_is_not_json_says_so() -> None:
    with pytest.raises(BadBody, match="heartbeat: payload is not valid JSON"):
        Heartbeat.decode(b"{not json")


def test_a_catch_up_question_and_answer() -> None:
    question = CatchupQuestion("n1", 4)
    assert question.encode() == encode_json({"node": "n1", "epoch": 4})
    assert CatchupQuestion.parse(decode_json(question.encode())) == question
    with pytest.raises(BadBody, match="catch-up question names no sending daemon"):
        CatchupQuestion.parse({"node": {}})
    answer = CatchupAnswer(
        False, (Holding(5, 0, 9, 0xDEAD), Holding(5, 1, 2, 7)), ("n2", "n3"), (8, 1 << 63)
    )
    assert answer.encode() == encode_json(
        {
            "ready": False,
            "shards": [[5, 0, 9, 0xDEAD], [5, 1, 2, 7]],
            "up": ["n2", "n3"],
            "deleted": [8, 1 << 63],
        }
    )
    assert CatchupAnswer.decode(answer.encode()) == answer
    assert answer.held() == {(5, 0): (9, 0xDEAD), (5, 1): (2, 7)}
    # An answer from a daemon that does not name whom it hears: it names none.
    older = encode_json({"ready": True, "shards": [[5, 0, 9, 1]]})
    assert CatchupAnswer.decode(older).up == ()
    # Nor which tensors were deleted there: none (so nothing is dropped on its word).
    assert CatchupAnswer.decode(older).deleted == ()


@pytest.mark.parametrize(
    "body, says",
    [
        (b"[]", "catch-up answer is not a JSON object"),
        (b'{"ready": true}', "catch-up answer lists no shards"),
        (b'{"ready": true, "shards": [[1, 2, 3]]}', "each entry has 4 integers"),
        (b'{"ready": true, "shards": [[1, 2, 3, "x"]]}', "not a list of integer lists"),
        (b'{"ready": true, "shards": [], "up": "n1"}', "up is not a list of daemon names"),
        (b'{"ready": true, "shards": [], "up": [1]}', "up is not a list of daemon names"),
        (b'{"ready": true, "shards": [], "deleted": [-1]}', "deleted is not a list of tensor keys"),
        (b'{"ready": true, "shards": [], "deleted": [true]}', "deleted is not a list of tensor"),
        (b'{"ready": true, "shards": [], "deleted": {}}', "deleted is not a list of tensor keys"),
    ],
)
def test_a_catch_up_answer_of_the_wrong_shape_says_why(body: bytes, says: str) -> None:
    with pytest.raises(BadBody, match=says):
        CatchupAnswer.decode(body)


def test_a_copy_request() -> None:
    request = CopyRequest("n1", ((5, 0), (6, 3)), 0)
    assert request.encode() == encode_json({"node": "n1", "shards": [[5, 0], [6, 3]], "epoch": 0})
    assert CopyRequest.parse(decode_json(request.encode())) == request


@pytest.mark.parametrize(
    "body, says",
    [
        ({"node": [], "shards": []}, "copy request names no sending daemon"),
        ({"node": "n1"}, "copy request lists no shards"),
        # int() of an infinite float (JSON 1e400) raises OverflowError.
        ({"node": "n1", "shards": [[float("inf"), 0]]}, "not a list of integer lists"),
        ({"node": "n1", "shards": [[1]]}, "each entry has 2 integers"),
    ],
)
def test_a_copy_request_of_the_wrong_shape_says_why(body: object, says: str) -> None:
    with pytest.raises(BadBody, match=says):
        CopyRequest.parse(body)


META = TensorMeta("m/w", "float32", (100,), 256)


def test_a_shard_copy_body() -> None:
    body = ShardCopyBody(META, 9, ((11, 8), (12, 9)), (3,), (4, 4), 1 << 63)
    assert body.encode() == encode_json(
        {
            "meta": META.to_dict(),
            "version": 9,
            "txns": [[11, 8], [12, 9]],
            "steps": [3],
            "clocks": [4, 4],
            "stamp": 1 << 63,
        }
    )
    assert ShardCopyBody.decode(body.encode(), 9) == body


def test_a_shard_copy_body_with_only_its_metadata_takes_the_defaults() -> None:
    """The header's version counts; the rest may be left out."""
    body = ShardCopyBody.decode(encode_json({"meta": META.to_dict()}), 4)
    assert body == ShardCopyBody(META, 4)


@pytest.mark.parametrize(
    "rec, says",
    [
        ({}, "shard copy: 'meta'"),
        ({"meta": META.to_dict(), "stamp": -1}, "stamp -1 is not a 64-bit id"),
        ({"meta": META.to_dict(), "stamp": 1 << 64}, "is not a 64-bit id"),
        ({"meta": META.to_dict(), "stamp": 1e400}, "shard copy"),
        ({"meta": META.to_dict(), "txns": [[1, 2, 3]]}, "shard copy: txns"),
        ({"meta": META.to_dict(), "steps": ["x"]}, "shard copy: steps"),
        ({"meta": META.to_dict(), "clocks": 5}, "shard copy: clocks"),
    ],
)
def test_a_shard_copy_body_of_the_wrong_shape_says_why(rec: dict, says: str) -> None:
    with pytest.raises(BadBody, match=says):
        ShardCopyBody.decode(encode_json(rec), 1)
