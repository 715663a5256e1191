"""psd.replication.links: one request at a time to a peer, every failure a PeerError
(real sockets on loopback, stand-in peers)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing
from irdma_psd.replication import PeerError
from irdma_psd.replication.links import Dialer, Link

from irdma.cli.local import write_config
from irdma.cluster import Address, Node, load_config
from irdma.protocol.messages import Ping


def node_at(tmp_path: Path, port: int) -> Node:
    cfg = load_config(write_config(tmp_path, 2, replicas=2))
    return replace(cfg.node("n2"), address=Address("tcp", "127.0.0.1", port))


async def test_a_peer_nobody_listens_for_is_a_peer_error(tmp_path: Path) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()  # the port is free: nothing answers there
    async with trio.open_nursery() as nursery:
        link = Link(node_at(tmp_path, port), Dialer("n1", None, 5.0, nursery))
        with pytest.raises(PeerError, match="n2"):
            await link.request(Ping().frame(2), [b"{}"], timeout=5.0)


async def test_a_peer_that_does_not_answer_in_time_is_a_peer_error_and_dialed_again(
    tmp_path: Path,
) -> None:
    """A late answer must not be taken for the next request's: the connection is
    closed, and the next request opens another."""
    accepted: list[trio.SocketStream] = []
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def hold(stream: trio.SocketStream) -> None:
        accepted.append(stream)  # read nothing, answer nothing
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, hold, listeners)
        link = Link(node_at(tmp_path, port), Dialer("n1", None, 5.0, nursery))
        for tries in (1, 2):
            with pytest.raises(PeerError, match=r"no answer within 0\.2 s"):
                await link.request(Ping().frame(2), [b"{}"], timeout=0.2)
            await trio.testing.wait_all_tasks_blocked()
            assert len(accepted) == tries
        await link.aclose()
        nursery.cancel_scope.cancel()
