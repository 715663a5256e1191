"""Heartbeats: every ``heartbeat`` seconds this daemon pings each peer with its state,
and records what each peer says of itself (``Membership``).

A heartbeat carries (boot, seq) so a late one cannot undo a newer state. A
*handoff* is the heartbeat of a peer that caught up and takes its shards back:
it is answered only once everything queued for that peer was delivered, so
the peer starts serving with every update this daemon applied for it.

A heartbeat to a peer this daemon owes a resync (``debts``: it acknowledged
updates without it) says so; a ready peer told so gives up being ready and
catches up, and its handoff settles the debt. A handoff answered with the debt
still owed was not taken (the peer plans its catch-up again).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from irdma.cluster import ConfigInForce
from irdma.protocol import Status
from irdma.protocol.messages import Ping

from ..errors import Refusal
from ..membership import Membership
from .bodies import BadBody, Heartbeat
from .forwarding import Forwarding
from .lending import kernel
from .links import PeerError
from .peers import Peer, Peers
from .vetting import epoch_number, refuse_unless_replicated


class Heartbeats:
    """This daemon's heartbeats to its peers, and its answers to theirs."""

    def __init__(
        self,
        in_force: ConfigInForce,
        me: str,
        membership: Membership,
        peers: Peers,
        forwarding: Forwarding,
    ) -> None:
        self.in_force = in_force
        self.me = me
        self.membership = membership
        self.peers = peers
        self.forwarding = forwarding
        # Which run of this daemon says so, and how many times it did: a late
        # heartbeat cannot undo a newer state (``Membership.heard``).
        self._boot = secrets.randbits(63)
        self._seq = 0
        self._announcing = False
        self._kernel = kernel()  # peers on the same one are lent large forwards

    @contextmanager
    def announcing(self) -> Iterator[None]:
        """During a handoff: heartbeats report ready before this daemon acts on it."""
        self._announcing = True
        try:
            yield
        finally:
            self._announcing = False

    def body(self, to: str, handoff: bool = False) -> bytes:
        """This daemon's state, as its heartbeats to peer ``to`` carry it."""
        self.membership.observe()  # a daemon resumed after a pause says so at once
        self._seq += 1
        return Heartbeat(
            self.me,
            self.membership.ready or self._announcing,
            handoff,
            self._boot,
            self._seq,
            epoch_number(self.in_force.config),
            resync=self.forwarding.debts.owes(to),
            kernel=self._kernel,
        ).encode()

    async def received(self, body: Any) -> bytes:
        """A peer's heartbeat arrived; the answer (this daemon's state).

        Raises Refusal: BAD_OP with one copy per shard, BAD_ARGUMENT for a body
        that is not a heartbeat of a peer.
        """
        refuse_unless_replicated(self.in_force.config, "heartbeat")
        try:
            beat = Heartbeat.parse(body)
        except BadBody as exc:
            raise Refusal(Status.BAD_ARGUMENT, str(exc)) from None
        if not self.peers.is_peer(beat.node):
            raise Refusal(Status.BAD_ARGUMENT, f"heartbeat from an unknown node {beat.node!r}")
        self.peers[beat.node].kernel = beat.kernel
        believed = self.membership.heard(beat.node, beat.ready, stamp=beat.stamp, epoch=beat.epoch)
        if believed and beat.resync:
            self._owed_resync(beat.node)
        if beat.handoff:
            await self.forwarding.drain(beat.node)
            self.forwarding.debts.settle(beat.node)
        return self.body(beat.node)

    async def run(self, peer: Peer) -> None:
        """Ping ``peer`` every heartbeat, until cancelled."""
        interval = self.in_force.config.heartbeat
        while True:
            started = trio.current_time()
            await self.ping(peer)
            await trio.sleep_until(started + interval)

    async def ping(self, peer: Peer, timeout: float | None = None, handoff: bool = False) -> bool:
        """Send ``peer`` this daemon's state and record the one it answers with; whether
        it answered (a handoff: and took it; not while it still owes this daemon a
        resync)."""
        body = self.body(peer.name, handoff)
        try:
            header, data = await peer.link.request(
                Ping().frame(len(body)),
                [body],
                timeout=timeout or self.in_force.config.failure_timeout,
            )
        except PeerError:
            return False
        if header.status != Status.OK:
            return False
        try:
            reply = Heartbeat.decode(data)
        except BadBody:
            return True  # it answered, without a state this daemon can read
        peer.kernel = reply.kernel
        believed = self.membership.heard(
            peer.name, reply.ready, stamp=reply.stamp, epoch=reply.epoch
        )
        if believed and reply.resync:
            self._owed_resync(peer.name)
            return not handoff
        return True

    def _owed_resync(self, peer: str) -> None:
        """``peer`` says it acknowledged updates without this daemon (it saw it down):
        this daemon's copies may be stale, so a ready one catches up. (One not ready
        is catching up already; its handoff tells whether that settles it.)"""
        self.membership.lose(
            f"{peer} acknowledged updates without it while it saw it down (it owes it a resync)"
        )
