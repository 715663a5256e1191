"""The other daemons this one replicates with: for each, its link, its forward queue
and the scope of its tasks; peers join and leave as epochs change."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import trio

from irdma.cluster import Node

from .links import Dialer, Link, PeerError
from .queues import ForwardQueue


@dataclass(eq=False)
class Peer:
    """One other daemon: the link to it and what waits to be sent over it."""

    node: Node
    link: Link
    queue: ForwardQueue = field(default_factory=ForwardQueue)
    # Forwards sent to it whose answers are not in yet (``pipeline``).
    in_flight: int = 0
    # The boot id of the kernel it runs on, as its heartbeats say (None: not heard,
    # or an older release): large forwards are lent to it when it is this one's.
    kernel: str | None = None
    # False once it could not read lent bytes at all (``lending.LentUnreadable``).
    borrows: bool = True
    # Its heartbeat and forwarding tasks (ended when it leaves the cluster).
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    @property
    def name(self) -> str:
        return self.node.name


class Peers(Mapping[str, Peer]):
    """The peers by name (every daemon of the config's nodes but this one, and those an
    epoch left out until this daemon settled on it)."""

    def __init__(self, nodes: tuple[Node, ...], me: str, dialer: Dialer) -> None:
        self.me = me
        self.dialer = dialer
        self._by_name = {n.name: self._new(n) for n in nodes if n.name != me}

    def _new(self, node: Node) -> Peer:
        return Peer(node, Link(node, self.dialer))

    def __getitem__(self, name: str) -> Peer:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def named(self, name: str) -> Peer:
        """The peer of that name. Tasks started for the peers up a moment ago find
        one that left the cluster meanwhile gone: PeerError."""
        peer = self._by_name.get(name)
        if peer is None:
            raise PeerError(f"{name} left the cluster")
        return peer

    def is_peer(self, name: object) -> bool:
        """Whether a name from a message body is another daemon's (a list is no name)."""
        return isinstance(name, str) and name in self._by_name

    def follow(self, nodes: tuple[Node, ...]) -> list[Peer]:
        """The config's nodes changed: a peer whose address changed is parted and
        joins anew; new ones join. The peers that joined (their tasks to start)."""
        joined = []
        for node in nodes:
            if node.name == self.me:
                continue
            peer = self._by_name.get(node.name)
            if peer is not None and peer.node.address != node.address:
                self.part(node.name)
                peer = None
            if peer is None:
                self._by_name[node.name] = peer = self._new(node)
                joined.append(peer)
        return joined

    def part(self, name: str) -> None:
        """A peer left the cluster (or moved): stop its tasks, let go of its queue."""
        peer = self._by_name.pop(name, None)
        if peer is None:
            return
        peer.scope.cancel()
        peer.queue.skip_all()
        peer.link.abandon(f"{name} left the cluster")

    def cut_off(self, why: str) -> None:
        """This daemon gave up being ready: nothing queued or in flight goes out."""
        for peer in self._by_name.values():
            peer.queue.skip_all()
            peer.link.abandon(why, reset=True)
