"""Byte ranges of a tensor, cut at its shard boundaries."""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol import TensorMeta


@dataclass(frozen=True, slots=True)
class Piece:
    """The part of a byte range that lies in one shard."""

    shard: int
    shard_offset: int
    length: int
    buf_offset: int


def shard_pieces(meta: TensorMeta, offset: int, size: int) -> list[Piece]:
    """Split bytes ``[offset, offset+size)`` of a tensor at shard boundaries."""
    if offset < 0 or size < 0 or offset + size > meta.nbytes:
        raise ValueError(
            f"bytes [{offset}, {offset + size}) are outside {meta.name!r} ({meta.nbytes} bytes)"
        )
    if size == 0:
        shard = min(offset // meta.shard_size, meta.num_shards - 1)
        return [Piece(shard, offset - shard * meta.shard_size, 0, 0)]
    pieces = []
    pos = offset
    end = offset + size
    while pos < end:
        shard = pos // meta.shard_size
        start = shard * meta.shard_size
        n = min(end, start + meta.shard_size) - pos
        pieces.append(Piece(shard, pos - start, n, pos - offset))
        pos += n
    return pieces
