"""The client's session (irdma/client/session.py): connections, and the one place a
stream's failure or a daemon's refusal becomes an irdma error. Real daemons."""

from __future__ import annotations

import signal

import pytest

import irdma
from irdma.client import AsyncClient
from irdma.protocol import Status, tensor_key
from irdma.protocol.messages import Hello, Stat

from .helpers.cluster import Cluster


async def test_a_request_is_answered_and_the_connection_kept(cluster: Cluster) -> None:
    async with AsyncClient(cluster.config_path, transport="tcp") as c:
        node = c.config.nodes[0]
        assert c.session.transport_of(node) is None  # not connected yet
        reply = await c.session.request(node, Hello().frame())
        assert reply.header.status == Status.OK
        conn = c.session.conns[node.name]
        assert c.session.transport_of(node) == "tcp"
        await c.session.request(node, Hello().frame())
        assert c.session.conns[node.name] is conn


async def test_a_refusal_becomes_the_error_for_its_status(cluster: Cluster) -> None:
    async with AsyncClient(cluster.config_path) as c:
        node = c.config.nodes[0]
        with pytest.raises(irdma.TensorNotFound, match=node.name):
            await c.session.request(node, Stat(tensor_key("session/none")).frame())


async def test_a_dead_daemon_is_unavailable_and_says_there_is_one_copy(
    fresh_cluster: Cluster,
) -> None:
    async with AsyncClient(fresh_cluster.config_path) as c:
        node = c.config.node("n2")
        await c.session.request(node, Hello().frame())
        fresh_cluster.kill("n2")
        with pytest.raises(irdma.DaemonUnavailable, match="unavailable until it is back"):
            await c.session.request(node, Hello().frame())


async def test_a_paused_daemon_times_out(fresh_cluster: Cluster) -> None:
    async with AsyncClient(fresh_cluster.config_path, transport="tcp") as c:
        node = c.config.node("n1")
        await c.session.request(node, Hello().frame())
        fresh_cluster.signal("n1", signal.SIGSTOP)
        try:
            with pytest.raises(irdma.DaemonTimeout, match="n1"):
                await c.session.request(node, Hello().frame())
        finally:
            fresh_cluster.signal("n1", signal.SIGCONT)


async def test_a_request_after_close_is_client_closed(cluster: Cluster) -> None:
    c = AsyncClient(cluster.config_path)
    node = c.config.nodes[0]
    with pytest.raises(irdma.ClientClosed):
        await c.session.request(node, Hello().frame())
    async with c:
        await c.session.request(node, Hello().frame())
    assert c.closed
    with pytest.raises(irdma.ClientClosed):
        await c.session.request(node, Hello().frame())
