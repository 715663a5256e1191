"""Serving a peer's catch-up: what this daemon holds for it (CATCHUP), and the shards it
asks for, sent whole after everything queued for it before (SYNC_REQUEST)."""

from __future__ import annotations

from typing import Any

from irdma.cluster import ConfigInForce
from irdma.protocol import Status

from ..errors import Refusal
from ..membership import Membership
from ..store import Store
from .bodies import BadBody, CatchupAnswer, CatchupQuestion, CopyRequest, Holding
from .forwarding import Forwarding
from .peers import Peers
from .queues import Item
from .vetting import check_same_epoch, refuse_unless_replicated


class CatchUpService:
    """Answers the catch-up questions and copy requests of peers."""

    def __init__(
        self,
        in_force: ConfigInForce,
        me: str,
        store: Store,
        membership: Membership,
        peers: Peers,
        forwarding: Forwarding,
    ) -> None:
        self.in_force = in_force
        self.me = me
        self.store = store
        self.membership = membership
        self.peers = peers
        self.forwarding = forwarding

    def answer(self, body: Any) -> bytes:
        """What a catching-up peer needs to know: are we ready, and what do we hold for it.

        Raises Refusal: BAD_ARGUMENT for a question not from a peer, RECOVERING
        when the asker must ask again (not seen registered, or another epoch).
        """
        refuse_unless_replicated(self.in_force.config, "catch-up")
        try:
            question = CatchupQuestion.parse(body)
        except BadBody as exc:
            raise Refusal(Status.BAD_ARGUMENT, str(exc)) from None
        asker = question.node
        if not self.peers.is_peer(asker):
            raise Refusal(Status.BAD_ARGUMENT, f"catch-up from unknown node {asker!r}")
        if self.membership.leased and asker not in self.membership.registered:
            # Updates go only to registered peers: answered before this daemon sees
            # the asker's registration, the asker would miss the ones in between.
            raise Refusal(
                Status.RECOVERING,
                f"{self.me} does not see {asker} registered in etcd yet; ask again",
            )
        check_same_epoch(self.in_force.config, self.me, asker, question.epoch)
        # From now on updates are forwarded to it, so nothing falls between
        # this answer and the copies it asks for.
        self.membership.heard(asker)
        self.forwarding.let_go_of_down_peers()
        self.forwarding.debts.asked(asker)  # the copies it takes now cover what it lacked
        up = (self.me, *self.membership.up_peers())
        answer = CatchupAnswer(
            self.membership.ready, self.holdings_for(asker), up, self.store.deleted
        )
        return answer.encode()

    def holdings_for(self, asker: str) -> tuple[Holding, ...]:
        """Every local shard ``asker`` is a replica of."""
        return tuple(
            Holding(key, index, shard.version, self.store.checksum(shard))
            for key, tensor in self.store.tensors.items()
            for index, shard in tensor.shards.items()
            if self.in_force.config.holds(asker, key, index)
        )

    def queue_copies(self, body: Any) -> list[Item]:
        """Queue the shards a peer asked for (after what was queued for it before).

        Raises Refusal: BAD_ARGUMENT for a request that is malformed or not from
        a peer, RECOVERING when the asker follows another epoch.
        """
        refuse_unless_replicated(self.in_force.config, "sync request")
        try:
            request = CopyRequest.parse(body)
        except BadBody as exc:
            raise Refusal(Status.BAD_ARGUMENT, f"bad sync request: {exc}") from None
        asker = request.node
        if not self.peers.is_peer(asker):
            raise Refusal(Status.BAD_ARGUMENT, f"unknown node {asker!r}")
        check_same_epoch(self.in_force.config, self.me, asker, request.epoch)
        self.membership.heard(asker)
        return self.forwarding.send_whole(asker, request.shards)

    async def sent(self, items: list[Item]) -> None:
        """Wait until the shards queued for a copy request were delivered; Refusal
        (RECOVERING) when one was not."""
        await self.forwarding.wait(items)
        if not all(item.delivered for item in items):
            raise Refusal(
                Status.RECOVERING,
                f"{self.me} could not send every shard asked for; ask again",
            )
