"""Authentication: the cluster's shared secret and the AUTH handshake, without any I/O.

A cluster config with ``secret_file`` makes every daemon require that each
connection (client to daemon, daemon to daemon, TCP and same-host) proves
it knows the secret before any other op: a mutual HMAC-SHA256
challenge-response with a fresh nonce from each side (frames in
``irdma.protocol``, under AUTH FRAMES). The daemon's nonce is new for every
connection, so a recorded handshake cannot be replayed; the client checks
the daemon's proof too, so a process that does not know the secret cannot
pose as a daemon. Without ``secret_file`` nothing is authenticated (for a
single trusted host; production configs should set one).

What the handshake does not do: encrypt or sign the traffic after it. On a
network others can tap or inject into, run the cluster over a private
network or a VPN (WireGuard, IPsec).

The secret file holds at least ``MIN_SECRET`` bytes (leading and trailing
whitespace ignored, so a trailing newline does not matter), for example
``openssl rand -hex 32 > /etc/irdma/secret && chmod 600 /etc/irdma/secret``.
It must not be accessible to every user: a file with any permission for
"other" is refused. Mode 0600 (or 0640 with a group shared by the daemons'
and the workers' users) is right.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .cluster import ClusterConfig
from .errors import AuthFailed, ConfigError
from .protocol import (
    AUTH_NONCE,
    AUTH_PROOF,
    MAX_ERROR_MESSAGE,
    PROTOCOL_VERSION,
    AuthStep,
    Header,
    Op,
    Status,
)
from .protocol.messages import Auth

MIN_SECRET = 16
MAX_SECRET = 64 << 10
# Domain separation: a daemon's proof can never pass for a client's.
DAEMON_LABEL = b"irdma-auth-v1 daemon\0"
CLIENT_LABEL = b"irdma-auth-v1 client\0"
# Longest answer a client reads during the handshake (nonce and proof, or a reason).
MAX_ANSWER = max(AUTH_NONCE + AUTH_PROOF, MAX_ERROR_MESSAGE)


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """Read the shared secret from ``path``.

    Raises ConfigError naming the file and the fix when it is missing,
    unreadable, not a regular file, accessible to every user, empty or
    shorter than ``MIN_SECRET`` bytes.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ConfigError(
            f"secret file {p} does not exist; create it with "
            f"'openssl rand -hex 32 > {p} && chmod 600 {p}'"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read secret file {p}: {exc.strerror or exc} (the daemons' and the "
            "workers' users need read access: mode 0600, or 0640 with a shared group)"
        ) from None
    try:
        # Checked on the open file, so it is the file that is read.
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"secret file {p} is not a regular file")
        if st.st_mode & 0o007:
            raise ConfigError(
                f"secret file {p} is accessible to every user "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); run 'chmod 600 {p}'"
            )
        data = b""
        while len(data) <= MAX_SECRET and (chunk := os.read(fd, MAX_SECRET + 1 - len(data))):
            data += chunk
    except OSError as exc:
        raise ConfigError(f"cannot read secret file {p}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    secret = data.strip()
    if len(data) > MAX_SECRET:
        raise ConfigError(f"secret file {p} is over {MAX_SECRET} bytes; is it the right file?")
    if len(secret) < MIN_SECRET:
        what = "empty" if not secret else f"only {len(secret)} bytes"
        raise ConfigError(
            f"secret file {p} is {what}; a secret needs at least {MIN_SECRET} bytes "
            f"(e.g. 'openssl rand -hex 32 > {p}')"
        )
    return secret


def cluster_secret(config: ClusterConfig) -> bytes | None:
    """The secret named by the config's ``secret_file``; None when it names none.

    Raises ConfigError as ``load_secret`` does.
    """
    return None if config.secret_file is None else load_secret(config.secret_file)


def new_nonce() -> bytes:
    return secrets.token_bytes(AUTH_NONCE)


def proof(secret: bytes, label: bytes, client_nonce: bytes, daemon_nonce: bytes) -> bytes:
    """HMAC-SHA256 of one side's label and both nonces under the secret."""
    return hmac.new(secret, label + client_nonce + daemon_nonce, hashlib.sha256).digest()


def _frame(step: AuthStep, payload: bytes) -> bytes:
    return Auth(step).frame(len(payload)).pack() + payload


@dataclass
class ClientHandshake:
    """The connecting side (a client, or a daemon reaching a peer).

    ``challenge()`` gives the first frame to send; ``answer_challenge`` takes
    the daemon's answer and gives the PROOF frame; ``finish`` takes the answer
    to that. Each raises AuthFailed naming ``peer`` when the daemon refuses or
    fails to prove it knows the secret.
    """

    secret: bytes
    peer: str
    nonce: bytes = field(default_factory=new_nonce)

    def challenge(self) -> bytes:
        return _frame(AuthStep.CHALLENGE, self.nonce)

    def answer_challenge(self, header: Header, payload: bytes) -> bytes:
        self._check_answer(header, payload)
        if len(payload) != AUTH_NONCE + AUTH_PROOF:
            raise AuthFailed(f"daemon {self.peer} sent a malformed AUTH answer")
        daemon_nonce, got = payload[:AUTH_NONCE], payload[AUTH_NONCE:]
        want = proof(self.secret, DAEMON_LABEL, self.nonce, daemon_nonce)
        if not hmac.compare_digest(want, got):
            raise AuthFailed(
                f"daemon {self.peer} has another secret: its proof does not match this "
                "process's secret_file (or it is not a daemon of this cluster)"
            )
        return _frame(AuthStep.PROOF, proof(self.secret, CLIENT_LABEL, self.nonce, daemon_nonce))

    def finish(self, header: Header, payload: bytes) -> None:
        self._check_answer(header, payload)
        if payload:
            raise AuthFailed(f"daemon {self.peer} sent a malformed AUTH answer")

    def _check_answer(self, header: Header, payload: bytes) -> None:
        if header.op != Op.AUTH or not header.is_response:
            raise AuthFailed(f"daemon {self.peer} answered AUTH with op {header.op}")
        if header.status == Status.OK:
            return
        reason = bytes(payload).decode("utf-8", "replace")
        if header.status == Status.AUTH_FAILED:
            raise AuthFailed(f"daemon {self.peer} refused authentication: {reason}")
        raise AuthFailed(
            f"daemon {self.peer} does not authenticate connections ({reason}); "
            "set the same secret_file in its config"
        )


class AuthRefused(Exception):
    """Why a daemon refuses a connection's handshake (sent back with ``status``)."""

    def __init__(self, reason: str, status: Status = Status.AUTH_FAILED) -> None:
        super().__init__(reason)
        self.status = status


@dataclass
class DaemonHandshake:
    """The daemon's side: ``check`` each header, then ``receive`` its payload.

    ``receive`` returns the answer's payload; once ``done``, the connection is
    authenticated. Both raise AuthRefused with the reason to send back.
    """

    secret: bytes
    nonce: bytes = field(default_factory=new_nonce)
    client_nonce: bytes | None = None
    done: bool = False

    def check(self, header: Header) -> None:
        """Refuse a frame before its payload is read (so no large payload is taken in)."""
        if header.proto != PROTOCOL_VERSION:
            raise AuthRefused(
                f"protocol version {header.proto} not supported (daemon speaks {PROTOCOL_VERSION})",
                Status.BAD_VERSION,
            )
        if header.is_response:
            raise AuthRefused("expected a request, got a response")
        if header.op != Op.AUTH:
            try:
                name = Op(header.op).name
            except ValueError:
                name = f"op {header.op}"
            # Said for a user whose config names no secret: the op is a detail.
            raise AuthRefused(
                "no secret given: this daemon requires the cluster's secret, and the "
                f"connection sent {name} without authenticating first "
                "(set secret_file in the cluster config)"
            )
        step = AuthStep.CHALLENGE if self.client_nonce is None else AuthStep.PROOF
        got = Auth.decode(header).step
        if got != step:
            raise AuthRefused(f"AUTH step {got} out of order (expected {step})")
        want = AUTH_NONCE if step == AuthStep.CHALLENGE else AUTH_PROOF
        if header.length != want:
            raise AuthRefused(f"AUTH step {step} carries {want} bytes, not {header.length}")

    def receive(self, header: Header, payload: bytes) -> bytes:
        self.check(header)
        if self.client_nonce is None:
            self.client_nonce = bytes(payload)
            return self.nonce + proof(self.secret, DAEMON_LABEL, self.client_nonce, self.nonce)
        want = proof(self.secret, CLIENT_LABEL, self.client_nonce, self.nonce)
        if not hmac.compare_digest(want, bytes(payload)):
            raise AuthRefused("wrong secret (or a handshake replayed from another connection)")
        self.done = True
        return b""
