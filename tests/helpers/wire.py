"""Raw frames over a blocking socket, with no client machinery: HELLO, the AUTH
handshake, whole frames."""

from __future__ import annotations

import socket

from irdma.auth import ClientHandshake, cluster_secret
from irdma.cluster import ClusterConfig
from irdma.protocol import HEADER_SIZE, Header, Op, decode_json, unpack_header


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
