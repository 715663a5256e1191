"""The requests about tensors rather than their bytes (HELLO, CREATE, DELETE, STAT,
LIST), and the connection set-up ones that reach dispatch (RDMA_CONNECT, a late AUTH)."""

from __future__ import annotations

import logging
from dataclasses import replace

from irdma.cluster import ConfigInForce, Node
from irdma.protocol import (
    MAX_META_PAYLOAD,
    MAX_NAME_BYTES,
    Header,
    ProtocolError,
    Status,
    TensorMeta,
    encode_json,
    validate_name,
)
from irdma.protocol.bodies import CreateAnswer, RenameBody
from irdma.protocol.messages import (
    Auth,
    Create,
    Delete,
    Hello,
    ListTensors,
    RdmaConnect,
    Rename,
    Stat,
)
from irdma.transport.verbs import VerbsError

from .conn import Conn, Replies, payload_json
from .errors import Refusal
from .membership import Membership
from .rdma import ConnectRequest, RdmaService
from .state import StateReader
from .store import Store, Tensor

log = logging.getLogger("psd")


class MetaOps:
    """Handlers of the metadata and set-up requests for one daemon."""

    def __init__(
        self,
        in_force: ConfigInForce,
        node: Node,
        store: Store,
        state: StateReader,
        membership: Membership,
        replies: Replies,
        *,
        max_payload: int,
        rdma: RdmaService | None,
        secret: bytes | None,
    ) -> None:
        self.in_force = in_force
        self.node = node
        self.store = store
        self.state = state
        self.membership = membership
        self.replies = replies
        self.max_payload = max_payload
        self.rdma = rdma
        self.secret = secret

    async def hello(self, conn: Conn, header: Header, msg: Hello) -> None:
        # Any payload is ignored (skipped by dispatch).
        # node, version, protocol, pid, ready, tensors, shards, arena, snapshot,
        # replication: see state.DaemonState.hello.
        info = self.state.read().hello() | {
            "shard_size": self.in_force.config.shard_size,
            "max_payload": self.max_payload,
            "view": self.membership.describe(),
        }
        await self.replies.reply(conn, header, [encode_json(info)])

    async def create(self, conn: Conn, header: Header, msg: Create) -> None:
        raw = await payload_json(conn)
        try:
            meta = TensorMeta.from_dict(raw)
        except ValueError as exc:
            raise Refusal(Status.BAD_ARGUMENT, f"bad tensor metadata: {exc}") from None
        if meta.key != msg.key:
            raise Refusal(Status.BAD_ARGUMENT, "header key does not match the tensor's key")
        # Every daemon is asked, so one holding the name under another key
        # (renamed to it) says so even where it holds none of this key's shards.
        self.store.catalogue.check_moved(meta)
        self.store.catalogue.mode_of(meta)  # refused alike by every daemon, placed or not
        if not self.store.catalogue.owns_any(meta):
            await self.replies.reply(conn, header, [CreateAnswer().encode()])
            return
        if msg.check:
            self.store.check_create(meta, replace=msg.replace, exclusive=msg.exclusive)
            await self.replies.reply(conn, header, [CreateAnswer(fits=True).encode()])
            return
        tensor, created = self.store.create(meta, replace=msg.replace, exclusive=msg.exclusive)
        answer = CreateAnswer(self.store.catalogue.info(tensor), created=created)
        await self.replies.reply(conn, header, [answer.encode()], version=tensor.version)

    async def delete(self, conn: Conn, header: Header, msg: Delete) -> None:
        name = await _payload_name(conn) if conn.payload.left else None
        self.store.delete(msg.key, name)
        await self.replies.reply(conn, header, [])

    async def stat(self, conn: Conn, header: Header, msg: Stat) -> None:
        if conn.payload.left:
            tensor = self.store.catalogue.named(await _payload_name(conn))
        else:
            tensor = self.store.catalogue.get(msg.key)
        await self._answer_record(conn, header, tensor)

    async def rename(self, conn: Conn, header: Header, msg: Rename) -> None:
        try:
            body = RenameBody.from_json(await payload_json(conn))
        except ProtocolError as exc:
            raise Refusal(Status.BAD_ARGUMENT, str(exc)) from None
        tensor = self.store.rename(msg.key, body.old, body.new)
        await self._answer_record(conn, header, tensor)

    async def _answer_record(self, conn: Conn, header: Header, tensor: Tensor) -> None:
        """Answer with this daemon's stat record of ``tensor``, naming this daemon."""
        record = replace(self.store.catalogue.info(tensor), node=self.node.name)
        await self.replies.reply(conn, header, [record.encode()], version=tensor.version)

    async def list(self, conn: Conn, header: Header, msg: ListTensors) -> None:
        prefix = await _payload_text(conn, "list prefix")
        data = encode_json([r.to_json() for r in self.store.catalogue.list(prefix, msg.limit)])
        if len(data) > MAX_META_PAYLOAD:
            raise Refusal(Status.TOO_LARGE, "listing is too large; use a longer prefix")
        await self.replies.reply(conn, header, [data])

    async def rdma_connect(self, conn: Conn, header: Header, msg: RdmaConnect) -> None:
        raw = await payload_json(conn)
        if self.rdma is None:
            raise Refusal(Status.BAD_OP, f"{self.node.name} serves no RDMA (see its log)")
        if conn.memory is not None:
            raise Refusal(Status.BAD_ARGUMENT, f"connection already uses {conn.transport}")
        try:
            request = ConnectRequest.parse(raw)
        except ValueError as exc:
            raise Refusal(Status.BAD_ARGUMENT, str(exc)) from None
        try:
            session, answer = self.rdma.accept(request, conn.stream.peer)
        except VerbsError as exc:
            log.warning("%s: RDMA setup for %s failed: %s", self.node.name, conn.stream.peer, exc)
            raise Refusal(Status.BAD_ARGUMENT, f"RDMA setup failed: {exc}") from None
        conn.memory = session
        await self.replies.reply(conn, header, [encode_json(answer)])

    async def auth(self, conn: Conn, header: Header, msg: Auth) -> None:
        """AUTH past the gate: this daemon has no secret, or the connection passed already."""
        if self.secret is None:
            raise Refusal(
                Status.AUTH_FAILED,
                f"{self.node.name} has no secret_file in its config, so it cannot prove it "
                "belongs to the cluster; give every daemon and client the same secret_file",
            )
        raise Refusal(Status.AUTH_FAILED, "this connection is authenticated already")

    # One handler per message kind (irdma.protocol.messages).


async def _payload_text(conn: Conn, what: str) -> str:
    """A request's payload that is a name or a prefix (UTF-8, at most a name's size)."""
    if conn.payload.left > MAX_NAME_BYTES:
        raise Refusal(Status.BAD_ARGUMENT, f"{what} is too long")
    raw = await conn.payload.read_bytes(conn.payload.left)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Refusal(Status.BAD_ARGUMENT, f"{what} is not UTF-8") from None


async def _payload_name(conn: Conn) -> str:
    """A request's payload that is a tensor name."""
    try:
        return validate_name(await _payload_text(conn, "tensor name"))
    except ValueError as exc:
        raise Refusal(Status.BAD_ARGUMENT, f"bad tensor name: {exc}") from None
