"""Authentication: the secret file, the sans-IO handshake, and real daemons that require it.

No secret, a wrong secret, a replayed handshake and an exposed secret file
are each refused, with a clear error and nothing else sent; the right
secret works over TCP and shm, and replication links authenticate too.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import irdma
from irdma.auth import (
    CLIENT_LABEL,
    MIN_SECRET,
    AuthRefused,
    ClientHandshake,
    DaemonHandshake,
    cluster_secret,
    load_secret,
    proof,
)
from irdma.cli.local import psd_command, write_config
from irdma.cluster import ClusterConfig, load_config
from irdma.errors import AuthFailed, ConfigError
from irdma.protocol import (
    AUTH_NONCE,
    HEADER_SIZE,
    PROTOCOL_VERSION,
    AuthStep,
    Header,
    Op,
    Status,
    encode_json,
    tensor_key,
    unpack_header,
)

from .helpers.cluster import Cluster, make_cluster, write_secret
from .helpers.wire import hello, raw_authenticate, recv_frame

pytestmark = pytest.mark.timeout(90)

SECRET = b"4f1c0e7d9a2b3c5e6f708192a3b4c5d6"
OTHER = b"0000000000000000ffffffffffffffff"
VALUE = np.arange(40_000, dtype=np.float32)  # 160 KB: three 64 KiB shards


def with_secret(config_path: Path, directory: Path, secret: bytes | None) -> Path:
    """A copy of a cluster config with another secret file (or none)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        line for line in config_path.read_text().splitlines() if not line.startswith("secret_file")
    ]
    if secret is not None:
        path = write_secret(directory / "secret", secret)
        lines.insert(0, f'secret_file = "{path}"')
    out = directory / "cluster.toml"
    out.write_text("\n".join(lines) + "\n")
    return out


def open_raw(config: ClusterConfig, name: str) -> socket.socket:
    node = config.node(name)
    return socket.create_connection((node.address.host, node.address.port), 5.0)


def recv_all(s: socket.socket) -> bytes:
    """Everything the daemon sends until it closes the connection."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def logged(cluster: Cluster, pattern: str) -> bool:
    return any(re.search(pattern, cluster.log(n)) for n in cluster.names)


def wait_for(predicate, seconds: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


# -- the secret file ----------------------------------------------------------


def test_a_secret_file_is_read_without_surrounding_whitespace(tmp_path: Path) -> None:
    path = write_secret(tmp_path / "s", b"  " + SECRET + b"\n")
    assert load_secret(path) == SECRET


def test_a_group_readable_secret_file_is_accepted(tmp_path: Path) -> None:
    # Workers of another user share the secret through a group.
    assert load_secret(write_secret(tmp_path / "s", SECRET, 0o640)) == SECRET


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o666])
def test_a_secret_file_open_to_every_user_is_refused(tmp_path: Path, mode: int) -> None:
    path = write_secret(tmp_path / "s", SECRET, mode)
    with pytest.raises(ConfigError, match=rf"{path}.*every user.*{mode:04o}.*chmod 600 {path}"):
        load_secret(path)


def test_a_missing_secret_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'nope'} does not exist.*chmod 600"):
        load_secret(tmp_path / "nope")


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"", "empty"), (b"\n\n", "empty"), (b"short\n", "only 5 bytes")],
)
def test_an_empty_or_short_secret_is_refused(tmp_path: Path, content: bytes, problem: str) -> None:
    path = write_secret(tmp_path / "s", content)
    with pytest.raises(ConfigError, match=f"{problem}.*at least {MIN_SECRET}"):
        load_secret(path)


def test_a_directory_is_not_a_secret_file(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_secret(tmp_path / "d")


def test_no_secret_file_means_no_secret(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, 1, arena_size=1 << 20))
    assert cluster_secret(config) is None


# -- the handshake, without I/O -------------------------------------------------


def split(frame: bytes) -> tuple[Header, bytes]:
    return unpack_header(frame[:HEADER_SIZE]), frame[HEADER_SIZE:]


def answer(request: Header, payload: bytes, status: Status = Status.OK) -> tuple[Header, bytes]:
    return request.response(status, length=len(payload)), payload


def run_handshake(client: ClientHandshake, daemon: DaemonHandshake) -> None:
    """Both sides of a handshake; raises what either side raises."""
    header, payload = split(client.challenge())
    daemon.check(header)
    proof = client.answer_challenge(*answer(header, daemon.receive(header, payload)))
    header, payload = split(proof)
    daemon.check(header)
    client.finish(*answer(header, daemon.receive(header, payload)))


def test_the_same_secret_authenticates_both_sides() -> None:
    daemon = DaemonHandshake(SECRET)
    run_handshake(ClientHandshake(SECRET, "n1"), daemon)
    assert daemon.done


def test_a_client_with_another_secret_is_refused() -> None:
    daemon = DaemonHandshake(SECRET)
    client = ClientHandshake(OTHER, "n1")
    header, payload = split(client.challenge())
    reply = daemon.receive(header, payload)
    # The client sees that the daemon's proof is not under its secret...
    with pytest.raises(AuthFailed, match="n1 has another secret: its proof does not match"):
        client.answer_challenge(*answer(header, reply))
    # ...and a proof made under another secret is refused by the daemon.
    wrong = proof(OTHER, CLIENT_LABEL, client.nonce, reply[:AUTH_NONCE])
    with pytest.raises(AuthRefused, match="wrong secret"):
        daemon.receive(Header(op=Op.AUTH, shard=AuthStep.PROOF, length=len(wrong)), wrong)
    assert not daemon.done


def test_a_recorded_handshake_does_not_pass_on_another_connection() -> None:
    client = ClientHandshake(SECRET, "n1")
    recorded: list[bytes] = [client.challenge()]
    first = DaemonHandshake(SECRET)
    header, payload = split(recorded[0])
    recorded.append(client.answer_challenge(*answer(header, first.receive(header, payload))))
    # Replayed to a new connection: the daemon's nonce differs, so the proof does not match.
    second = DaemonHandshake(SECRET)
    for frame in recorded[:1]:
        second.receive(*split(frame))
    with pytest.raises(AuthRefused, match="replayed"):
        second.receive(*split(recorded[1]))
    assert not second.done


def test_a_daemon_proof_cannot_pass_for_a_client_proof() -> None:
    """A peer that reflects the daemon's own proof back gets nowhere (labels differ)."""
    daemon = DaemonHandshake(SECRET)
    nonce = bytes(AUTH_NONCE)
    header = Header(op=Op.AUTH, shard=AuthStep.CHALLENGE, length=AUTH_NONCE)
    reply = daemon.receive(header, nonce)
    reflected = reply[AUTH_NONCE:]
    proof_header = Header(op=Op.AUTH, shard=AuthStep.PROOF, length=len(reflected))
    with pytest.raises(AuthRefused, match="wrong secret"):
        daemon.receive(proof_header, reflected)


@pytest.mark.parametrize(
    ("header", "match", "status"),
    [
        (
            Header(op=Op.READ),
            "no secret given: .* sent READ without authenticating first",
            Status.AUTH_FAILED,
        ),
        (
            Header(op=Op.ATTACH, length=20),
            "sent ATTACH without authenticating first",
            Status.AUTH_FAILED,
        ),
        (Header(op=99), "sent op 99 without authenticating first", Status.AUTH_FAILED),
        (Header(op=Op.AUTH, shard=AuthStep.PROOF, length=32), "out of order", Status.AUTH_FAILED),
        (
            Header(op=Op.AUTH, shard=AuthStep.CHALLENGE, length=1 << 30),
            "carries 32 bytes",
            Status.AUTH_FAILED,
        ),
        (Header(op=Op.AUTH, shard=1, length=32, flags=1), "got a response", Status.AUTH_FAILED),
        (
            Header(op=Op.AUTH, shard=1, length=32, proto=PROTOCOL_VERSION + 1),
            "protocol version",
            Status.BAD_VERSION,
        ),
    ],
)
def test_the_daemon_refuses_anything_but_the_next_step(
    header: Header, match: str, status: Status
) -> None:
    with pytest.raises(AuthRefused, match=match) as info:
        DaemonHandshake(SECRET).check(header)
    assert info.value.status == status


def test_a_refusal_or_an_unauthenticating_daemon_is_a_clear_client_error() -> None:
    client = ClientHandshake(SECRET, "n1 (tcp://127.0.0.1:1)")
    header, _ = split(client.challenge())
    with pytest.raises(AuthFailed, match=r"n1 \(tcp://127.0.0.1:1\) refused authentication: no"):
        client.answer_challenge(*answer(header, b"no", Status.AUTH_FAILED))
    with pytest.raises(AuthFailed, match=r"does not authenticate connections.*secret_file"):
        client.answer_challenge(*answer(header, b"unknown op 18", Status.BAD_OP))
    with pytest.raises(AuthFailed, match="malformed"):
        client.answer_challenge(*answer(header, b"x" * 10))


# -- real daemons ------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three daemons that require SECRET (2 s timeout, also the handshake's time limit)."""
    c = make_cluster(tmp_path_factory.mktemp("secured"), timeout=2.0, secret=SECRET)
    try:
        with c.client() as client:
            client.write("auth/w", VALUE)
        yield c
    finally:
        c.close()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_the_right_secret_reads_and_writes(secured: Cluster, transport: str) -> None:
    with irdma.Client(secured.config_path, transport=transport) as client:
        assert np.array_equal(client.read("auth/w"), VALUE)
        client.write(f"auth/{transport}", VALUE * 2)
        client.accumulate(f"auth/{transport}", VALUE)
        assert np.array_equal(client.read(f"auth/{transport}"), VALUE * 3)
        assert {i.name for i in client.list("auth/")} >= {"auth/w", f"auth/{transport}"}


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_client_without_the_secret_is_refused(
    secured: Cluster, tmp_path: Path, transport: str
) -> None:
    config = with_secret(secured.config_path, tmp_path, None)
    with (
        irdma.Client(config, transport=transport) as client,
        pytest.raises(
            AuthFailed,
            match=r"refused the connection: no secret given: .* sent \w+ without authenticating.*"
            r"set secret_file in the cluster config",
        ) as info,
    ):
        client.read("auth/w")
    assert re.match(r"daemon n\d \((tcp://127.0.0.1:\d+|shm)\) refused", str(info.value))
    # Refused by the daemon, logged with the peer's address (shm: its pid and uid).
    peer = r"127\.0\.0\.1:\d+" if transport == "tcp" else r"shm pid \d+ \(uid \d+\)"
    assert wait_for(
        lambda: logged(secured, rf"refused {peer}: no secret given: .* sent \w+ without")
    )


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_client_with_a_wrong_secret_is_refused_and_logged(
    secured: Cluster, tmp_path: Path, transport: str
) -> None:
    config = with_secret(secured.config_path, tmp_path, OTHER)
    with (
        irdma.Client(config, transport=transport) as client,
        pytest.raises(AuthFailed, match="has another secret: its proof does not match"),
    ):
        client.read("auth/w")
    # The client gave up on seeing the daemon's proof; the daemon logged who it was.
    peer = r"127\.0\.0\.1:\d+" if transport == "tcp" else r"shm pid \d+ \(uid \d+\)"
    assert wait_for(
        lambda: logged(
            secured, rf"WARNING n\d: {peer} closed the connection before authenticating \(it may"
        )
    )


def test_a_wrong_proof_is_refused_with_the_peer_address_logged(secured: Cluster) -> None:
    with open_raw(secured.config, "n1") as s:
        port = s.getsockname()[1]
        daemon_view = ClientHandshake(OTHER, "n1")  # only for its nonce
        s.sendall(daemon_view.challenge())
        header, payload = recv_frame(s)
        assert header.status == Status.OK
        # Prove with another secret (skipping the check of the daemon's proof).
        wrong = proof(OTHER, CLIENT_LABEL, daemon_view.nonce, payload[:AUTH_NONCE])
        s.sendall(Header(op=Op.AUTH, shard=AuthStep.PROOF, length=len(wrong)).pack() + wrong)
        header, reason = recv_frame(s)
        assert header.status == Status.AUTH_FAILED
        assert b"wrong secret" in reason
        assert recv_all(s) == b""  # closed, nothing else
    assert wait_for(lambda: f"refused 127.0.0.1:{port}: wrong secret" in secured.log("n1"))


def test_a_replayed_handshake_is_refused(secured: Cluster) -> None:
    with open_raw(secured.config, "n2") as s:
        recorded = raw_authenticate(s, SECRET)
    with open_raw(secured.config, "n2") as s:
        port = s.getsockname()[1]
        s.sendall(recorded[0])
        header, _ = recv_frame(s)
        assert header.status == Status.OK  # a fresh daemon nonce
        s.sendall(recorded[1])
        header, reason = recv_frame(s)
        assert header.status == Status.AUTH_FAILED
        assert b"replayed" in reason
        s.sendall(Header(op=Op.LIST).pack())  # not answered
        assert recv_all(s) == b""
    assert wait_for(lambda: f"refused 127.0.0.1:{port}: wrong secret" in secured.log("n2"))


@pytest.mark.parametrize(
    "frame",
    [
        Header(op=Op.LIST, length=5).pack() + b"auth/",
        Header(op=Op.HELLO).pack(),
        Header(op=Op.READ, key=tensor_key("auth/w"), size=4096).pack(),
        Header(op=Op.PING, length=2).pack() + encode_json({}),
    ],
    ids=["list", "hello", "read", "ping"],
)
def test_an_unauthenticated_request_gets_the_reason_and_no_data(
    secured: Cluster, frame: bytes
) -> None:
    for name in secured.names:
        with open_raw(secured.config, name) as s:
            s.sendall(frame)
            data = recv_all(s)
        header = unpack_header(data[:HEADER_SIZE])
        assert header.status == Status.AUTH_FAILED
        assert header.length == len(data) - HEADER_SIZE  # the reason, and nothing after it
        reason = data[HEADER_SIZE:].decode()
        assert reason.startswith("no secret given: ") and "secret_file" in reason
        assert "auth/w" not in reason and "n1" not in reason


def test_a_silent_connection_is_closed_after_the_time_limit(secured: Cluster) -> None:
    with open_raw(secured.config, "n3") as s:
        s.settimeout(10)
        port = s.getsockname()[1]
        started = time.monotonic()
        assert recv_all(s) == b""
        assert 1.5 < time.monotonic() - started < 8
    assert wait_for(
        lambda: f"refused 127.0.0.1:{port}: did not authenticate within 2 s" in secured.log("n3")
    )


def test_daemons_listen_only_on_their_configured_address(secured: Cluster) -> None:
    for node in secured.config.nodes:
        assert node.address.host == "127.0.0.1"
        # Another loopback address of this host reaches a daemon bound to 0.0.0.0, not this one.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", node.address.port), 2.0).close()
        socket.create_connection((node.address.host, node.address.port), 2.0).close()


def test_a_daemon_refuses_to_start_with_a_world_readable_secret(tmp_path: Path) -> None:
    path = write_config(tmp_path, 1, arena_size=1 << 20, shard_size=64 << 10)
    config = with_secret(path, tmp_path / "exposed", SECRET)
    secret = tmp_path / "exposed" / "secret"
    secret.chmod(0o644)
    done = subprocess.run(
        psd_command(config, "n1"), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2
    assert f"secret file {secret} is accessible to every user" in done.stderr
    assert f"chmod 600 {secret}" in done.stderr
    with pytest.raises(ConfigError, match="every user"):
        irdma.Client(config)


def test_a_client_with_a_secret_refuses_a_daemon_without_one(tmp_path: Path) -> None:
    open_cluster = make_cluster(tmp_path / "open", 1, timeout=2.0)
    try:
        config = with_secret(open_cluster.config_path, tmp_path / "client", SECRET)
        for transport in ("tcp", "shm"):
            with (
                irdma.Client(config, transport=transport) as client,
                pytest.raises(AuthFailed, match="has no secret_file in its config"),
            ):
                client.list("")
    finally:
        open_cluster.close()


# -- replication links -------------------------------------------------------------


def test_replicas_keep_replicating_with_a_secret(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, 3, replicas=2, timeout=2.0, secret=SECRET)
    try:
        client = c.client()
        client.write("rep/w", VALUE)
        primary = c.config.primary_for(tensor_key("rep/w"), 0).name
        c.kill(primary)
        assert np.array_equal(client.read("rep/w"), VALUE)  # from the backup's copy
        client.accumulate("rep/w", VALUE)
        assert np.array_equal(client.read("rep/w"), VALUE * 2)
        for name in c.names:
            assert "refused" not in c.log(name), c.log(name)
            assert "cannot link" not in c.log(name), c.log(name)
    finally:
        c.close()


def test_a_daemon_with_another_secret_cannot_join(tmp_path: Path) -> None:
    path = write_config(tmp_path, 3, replicas=2, arena_size=16 << 20, shard_size=64 << 10)
    good = with_secret(path, tmp_path / "good", SECRET)
    bad = with_secret(path, tmp_path / "bad", OTHER)
    c = Cluster(tmp_path, good, load_config(good))
    try:
        c.start("n1", wait=False)
        c.start("n2", wait=False)
        c.config_path = bad
        c.start("n3", wait=False)
        c.config_path = good
        for name in c.names:
            c.wait_ready(name)
        c.wait_serving("n1")
        # The majority serves; the outsider is down in its view, and it never gets ready.
        assert wait_for(
            lambda: hello(c.config, "n1")["view"] == {"n1": "ready", "n2": "ready", "n3": "down"}
        )
        # n1 may see n3 down (it never heard from it) before its own first link
        # attempt has failed and been logged: wait for the log lines, not a view.
        assert wait_for(lambda: "cannot link to n3" in c.log("n1")), c.log("n1")
        assert wait_for(lambda: "cannot link to n1" in c.log("n3")), c.log("n3")
        assert "has another secret: its proof does not match" in c.log("n3")
        assert not hello(load_config(bad), "n3")["ready"]
    finally:
        c.close()
