"""Raw frames over a blocking socket, with no client machinery: HELLO, the AUTH
handshake, whole frames; a raw connection to a daemon's same-host socket."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from irdma.auth import ClientHandshake, cluster_secret
from irdma.cluster import ClusterConfig
from irdma.protocol import HEADER_SIZE, Header, Op, decode_json, unpack_header
from irdma.transport.unix import short_address, socket_path

if TYPE_CHECKING:  # cluster.py imports this module (hello)
    from .cluster import Cluster


def hello(config: ClusterConfig, name: str) -> dict:
    """One daemon's HELLO answer, over a raw socket (no client machinery)."""
    node = config.node(name)
    with socket.create_connection((node.address.host, node.address.port), 2.0) as s:
        secret = cluster_secret(config)
        if secret is not None:
            raw_authenticate(s, secret)
        s.sendall(Header(op=Op.HELLO).pack())
        head = recv_exactly(s, HEADER_SIZE)
        header = unpack_header(head)
        return decode_json(recv_exactly(s, header.length))


def recv_frame(s: socket.socket) -> tuple[Header, bytes]:
    """One whole frame from a raw socket."""
    header = unpack_header(recv_exactly(s, HEADER_SIZE))
    return header, recv_exactly(s, header.length)


def raw_authenticate(s: socket.socket, secret: bytes) -> list[bytes]:
    """The AUTH handshake over a blocking socket (irdma.auth is sans-IO); the frames sent."""
    handshake = ClientHandshake(secret, "daemon")
    sent = [handshake.challenge()]
    s.sendall(sent[0])
    sent.append(handshake.answer_challenge(*recv_frame(s)))
    s.sendall(sent[1])
    handshake.finish(*recv_frame(s))
    return sent


def recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("daemon closed the connection")
        buf += chunk
    return bytes(buf)


def raw_unix(cluster: Cluster, node: str = "n1") -> socket.socket:
    """A blocking connection to ``node``'s same-host (unix) socket, 5 s timeout."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    with short_address(socket_path(cluster.config.node(node).data_dir)) as address:
        s.connect(address)
    return s
