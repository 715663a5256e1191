"""Vetting what peers send: whose forwarded updates and whole shards this daemon takes,
and installing a whole shard once taken.

A daemon takes forwarded updates and shard copies only from a peer it sees as
up and ready (and never for a shard it is the acting primary of), or, while
catching up, from the peer it asked. A primary that was paused or cut off and
comes back with stale queued updates is refused, drops them, and catches up
like any rejoining daemon. Copies travel only between daemons of one epoch.
"""

from __future__ import annotations

import zlib
from collections.abc import Container, Iterable

import numpy as np

from irdma.cluster import ClusterConfig, ConfigInForce
from irdma.protocol import Status
from irdma.protocol.messages import ShardCopy

from ..errors import Refusal
from ..membership import Membership
from ..store import Store
from .bodies import BadBody, ShardCopyBody
from .delivery import CopyCounts


def sender_id(config: ClusterConfig, name: str) -> int:
    """How replication messages name their sender: its index in the node list, or
    (with etcd, where the list changes) a 31-bit hash of its name."""
    if config.etcd is not None:
        return zlib.crc32(name.encode()) & 0x7FFFFFFF
    return [n.name for n in config.nodes].index(name)


def sender_name(config: ClusterConfig, peers: Iterable[str], sender: int) -> str | None:
    """The daemon a message names as its sender (among ``peers`` with etcd); None: no
    daemon this one knows."""
    if config.etcd is not None:
        return next((p for p in peers if sender_id(config, p) == sender), None)
    names = [n.name for n in config.nodes]
    return names[sender] if 0 <= sender < len(names) else None


def epoch_number(config: ClusterConfig) -> int:
    """The number of the epoch this daemon follows (0: a static node list)."""
    return config.epoch.number if config.epoch is not None else 0


def refuse_unless_replicated(config: ClusterConfig, what: str) -> None:
    """With one copy per shard no daemon sends replication messages: refuse them.

    (Nothing would deliver the shards a copy request queues, so it would wait
    forever; a heartbeat would make a forged copy look sent by a peer.)
    """
    if not config.replicated:
        raise Refusal(
            Status.BAD_OP,
            f"{what} refused: this cluster keeps one copy of each shard (replicas = 1), "
            "so its daemons exchange no replication messages",
        )


def check_same_epoch(config: ClusterConfig, me: str, asker: str, theirs: int | None) -> None:
    """Copies go only between daemons of one epoch: under another, the asker and this
    daemon disagree on who forwards which updates to whom. Refusal (RECOVERING)."""
    if config.etcd is None:
        return
    mine = epoch_number(config)
    if theirs != mine:
        raise Refusal(Status.RECOVERING, f"{me} is at epoch {mine}, {asker} at {theirs}; ask again")


class Vetting:
    """Decides whether a forwarded update or a shard copy is taken, and installs copies."""

    def __init__(
        self,
        in_force: ConfigInForce,
        me: str,
        store: Store,
        membership: Membership,
        peers: Iterable[str],
        asked: Container[str],
        copies: CopyCounts,
    ) -> None:
        self.in_force = in_force
        self.me = me
        self.store = store
        self.membership = membership
        self.peers = peers
        self.asked = asked  # the peers this daemon asked for copies while catching up
        self.copies = copies

    def check_sender(self, sender_index: int, key: int, shard: int, *, whole: bool = False) -> None:
        """Refuse a forwarded update or shard copy from a daemon that is not in charge of it.

        Taken: from a peer this daemon sees as up and ready, for a shard it
        is not the acting primary of; while catching up, from the peer it
        asked for copies; and a whole shard this daemon lacks (never deleted
        here) from any replica that is up. Anything else is a stale primary's leftover: Refusal
        (NOT_OWNER), or BAD_ARGUMENT for a sender no daemon is.
        """
        refuse_unless_replicated(self.in_force.config, "copy")
        m, me, config = self.membership, self.me, self.in_force.config
        sender = sender_name(config, self.peers, sender_index)
        if sender is None and config.epoch is not None:
            # A daemon this epoch left out, with updates queued from before: refused, so
            # it drops them rather than retry.
            raise Refusal(
                Status.NOT_OWNER,
                f"copy from daemon #{sender_index}, not one of epoch {config.epoch.number}",
            )
        if sender is None or sender == me:
            raise Refusal(Status.BAD_ARGUMENT, f"copy from unknown daemon #{sender_index}")
        if not config.holds(me, key, shard):
            raise Refusal(
                Status.NOT_OWNER, f"{me} keeps no copy of shard {shard} of tensor {key:#x}"
            )
        if not config.holds(sender, key, shard):
            raise Refusal(
                Status.NOT_OWNER, f"{sender} is not a replica of shard {shard} of tensor {key:#x}"
            )
        if not m.ready:
            if sender in self.asked or m.peer_ready(sender):
                return
            raise Refusal(
                Status.NOT_OWNER,
                f"{me} is catching up and takes copies only from ready replicas, not {sender}",
            )
        if whole and m.up(sender) and self._lost(key, shard):
            # A replica gives back a shard this daemon serves without holding: it
            # restarted empty while that copy was away (catchup_plan). Nothing here
            # to overwrite, and the tensor was not deleted here.
            return
        primary = m.acting_primary(key, shard)
        if whole and m.leased and (primary is None or primary.name != sender):
            # A whole shard replaces what is here: only from the primary, whose forwards
            # this copy may already hold (a backup's copy may lag them).
            raise Refusal(
                Status.NOT_OWNER,
                f"{me} takes whole copies of shard {shard} of tensor {key:#x} "
                f"from {primary.name if primary else 'its primary'}, not {sender}",
            )
        if m.peer_ready(sender) and (primary is None or primary.name != me):
            return
        raise Refusal(
            Status.NOT_OWNER,
            f"{me} takes shard {shard} of tensor {key:#x} from "
            f"{primary.name if primary else 'no ready replica'}, not {sender}",
        )

    def _lost(self, key: int, shard: int) -> bool:
        """Whether this daemon lacks a shard placed on it, and never saw it deleted."""
        tensor = self.store.tensors.get(key)
        held = tensor is not None and shard in tensor.shards
        return not held and not self.store.was_deleted(key)

    def install(self, copy: ShardCopy, payload: memoryview) -> None:
        """Apply a shard copy (SYNC) ``check_sender`` took: replace the local copy of a
        shard with the primary's. Refusal (BAD_ARGUMENT) for a malformed one."""
        meta_len = copy.meta_length
        try:
            body = ShardCopyBody.decode(payload[:meta_len], copy.version)
        except BadBody as exc:
            raise Refusal(Status.BAD_ARGUMENT, f"bad {exc}") from None
        if body.meta.key != copy.key:
            # check_sender vetted the sender for copy.key's shard, not this one.
            raise Refusal(Status.BAD_ARGUMENT, "shard copy: header key does not match its tensor")
        data = np.frombuffer(payload[meta_len:], dtype=np.uint8)
        self.store.install_shard(
            body.meta,
            copy.shard,
            copy.version,
            data,
            dict(body.txns),
            list(body.steps),
            body.stamp,
            list(body.clocks),
        )
        self.copies.received += 1
        self.copies.received_bytes += data.nbytes
