"""DIFF: what changed in a range of a model version's tensor since an older version.

Both versions of a tensor are on this daemon (``irdma.protocol.frame``
places a model version's tensors by their group), so the comparison is two
views of the arena and the answer is only the elements that differ
(``irdma.protocol.deltas``). A version's tensors are written before its
commit and never after, so neither range changes while it is compared.
The bytes answered are counted as every op's are (``irdma_response_bytes``
with ``op="diff"``).
"""

from __future__ import annotations

from irdma.protocol import Header, Status, deltas
from irdma.protocol.messages import Diff

from .conn import Conn, Replies, no_payload
from .errors import Refusal, StoreError
from .store import Store


class DiffOps:
    """The DIFF handler."""

    def __init__(self, store: Store, replies: Replies) -> None:
        self.store = store
        self.replies = replies

    async def diff(self, conn: Conn, header: Header, msg: Diff) -> None:
        no_payload(conn, msg)
        catalogue = self.store.catalogue
        tensor, shard = catalogue.span(msg.key, msg.shard, msg.offset, msg.size, msg.layout)
        try:
            older, old_shard = catalogue.span(msg.against, msg.shard, msg.offset, msg.size)
        except StoreError as exc:
            raise Refusal(
                Status.NOT_FOUND,
                f"the version {tensor.meta.name!r} is compared with is not here: {exc}",
            ) from None
        if not older.meta.same_layout(tensor.meta):
            raise Refusal(
                Status.BAD_ARGUMENT,
                f"{tensor.meta.name!r} and {older.meta.name!r} differ in dtype, shape or "
                "shard size: only versions of one tensor compare",
            )
        itemsize = tensor.meta.np_dtype.itemsize
        if msg.offset % itemsize or msg.size % itemsize:
            raise Refusal(
                Status.BAD_ARGUMENT,
                f"bytes [{msg.offset}, {msg.offset + msg.size}) do not cut at "
                f"{itemsize}-byte elements",
            )
        new = self.store.arena.view(shard.block, msg.offset, msg.size)
        old = self.store.arena.view(old_shard.block, msg.offset, msg.size)
        # Computed at once (no wait in between), so the buffers are copies or views
        # of blocks that stay until the answer is sent: the answer copies them out.
        answer = [bytes(b) for b in deltas.encode(old.data, new.data, itemsize)]
        await self.replies.reply(conn, header, answer, version=shard.version)
