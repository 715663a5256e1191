"""Exceptions, named by their cause (as trio does).

- ``ConfigError``: the cluster configuration is wrong.
- ``DaemonError`` and its subclasses: a daemon refused a request with a status.
- ``DaemonUnavailable``: the daemon could not be reached or the connection broke.
- ``DaemonTimeout``: the daemon did not answer within the client's timeout.
- ``ClientClosed``: the client was closed by its owner.
- ``AuthFailed``: this process and a daemon could not authenticate each other.
"""

from __future__ import annotations

from .protocol import Status


class IrdmaError(Exception):
    """Base class of every irdma error."""


class ConfigError(IrdmaError):
    """The cluster configuration is missing or invalid."""


class ClientClosed(IrdmaError):
    """The client (or one of its connections) was closed by us."""


class DaemonUnavailable(IrdmaError):
    """A daemon could not be reached, or the connection to it broke."""

    def __init__(self, node: str, address: str, reason: str, *, single_copy: bool = False) -> None:
        # With one copy of each shard there is no replica to fail over to: say so.
        alone = (
            "; the cluster keeps one copy of each shard (replicas = 1), so the shards "
            "on this daemon are unavailable until it is back"
            if single_copy
            else ""
        )
        super().__init__(f"daemon {node} at {address} is unavailable: {reason}{alone}")
        self.node = node
        self.address = address


class DaemonTimeout(DaemonUnavailable):
    """A daemon did not answer within the client timeout (down, hung or overloaded)."""

    def __init__(self, node: str, address: str, timeout: float) -> None:
        IrdmaError.__init__(self, f"daemon {node} at {address} did not answer within {timeout:g} s")
        self.node = node
        self.address = address
        self.timeout = timeout


class DaemonError(IrdmaError):
    """A daemon answered a request with an error status."""

    status: Status = Status.INTERNAL

    def __init__(self, message: str, status: Status | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class BadRequest(DaemonError):
    status = Status.BAD_ARGUMENT


class TensorNotFound(DaemonError, KeyError):
    status = Status.NOT_FOUND

    def __str__(self) -> str:  # KeyError would add quotes
        return str(self.args[0])


class TensorExists(DaemonError):
    status = Status.EXISTS


class TensorMoved(TensorExists):
    """A create met its name held under another key, or its key under another
    name (a tensor was renamed). ``AsyncClient.create`` handles it (finds the
    tensor by name, or takes another key); it reaches a caller only when no
    free key was found."""

    status = Status.MOVED


class DtypeMismatch(DaemonError, TypeError):
    status = Status.DTYPE_MISMATCH


class ShapeMismatch(DaemonError, ValueError):
    status = Status.SHAPE_MISMATCH


class OutOfRange(DaemonError, IndexError):
    status = Status.OUT_OF_RANGE


class ArenaFull(DaemonError):
    status = Status.NO_SPACE


class RequestTooLarge(DaemonError):
    status = Status.TOO_LARGE


class StaleLayout(DaemonError):
    """The tensor was redefined since the client cached its layout."""

    status = Status.STALE_LAYOUT


class ProtocolMismatch(DaemonError):
    status = Status.BAD_VERSION


class NotReady(DaemonError):
    """A training step is not reached yet (the client asks again; seen only internally)."""

    status = Status.NOT_READY


class WorkerLost(DaemonError):
    """A worker this one waits for (sync, ssp, hybrid) fell silent past the mode's timeout."""

    status = Status.WORKER_LOST


class WorkerEvicted(DaemonError):
    """This worker was evicted from a tensor's training group for silence."""

    status = Status.EVICTED


class StepMismatch(DaemonError, ValueError):
    """An accumulate for a step the tensor is not at (applied already, ahead, or twice)."""

    status = Status.BAD_STEP


class NotOwner(DaemonError):
    """The daemon does not hold the shard, or is not its primary now (ask another replica)."""

    status = Status.NOT_OWNER


class Recovering(DaemonError):
    """The daemon is catching up from its replicas and does not serve the shard yet."""

    status = Status.RECOVERING


class NoQuorum(DaemonError):
    """The daemon cannot reach a majority of the cluster, so it refuses updates."""

    status = Status.NO_QUORUM


class Behind(DaemonError):
    """A backup has not yet received an update this client saw acknowledged."""

    status = Status.BEHIND


class StampGone(DaemonError):
    """A daemon no longer holds the copy of a shard from the whole-tensor write a
    consistent read asked for (the tensor was rewritten twice meanwhile)."""

    status = Status.STAMP_GONE


class StampPending(DaemonError):
    """A shard has not yet received the whole-tensor write a consistent read asked for."""

    status = Status.STAMP_PENDING


class StaleStamp(DaemonError):
    """A shard holds a later whole-tensor write than the one sent (``held`` is its
    stamp): the client stamps its write above it and writes every shard again."""

    status = Status.STALE_STAMP
    held: int = 0


class TornRead(DaemonError):
    """A read of several shards could not get them all from one whole-tensor write:
    the tensor kept being rewritten, or a writer stopped half-way and the
    copies of the write before it were taken back for room."""

    status = Status.STAMP_GONE


class StaleEpoch(DaemonError):
    """The request was routed with another cluster epoch than the daemon's (a
    daemon joined or left); the client takes the daemon's epoch and routes again."""

    status = Status.STALE_EPOCH


class AuthFailed(DaemonError):
    """This process and a daemon could not authenticate each other.

    A missing or wrong secret on either side, a daemon that refused the
    connection before authentication, or a daemon that could not prove it
    knows the cluster's secret. Never retried on another replica: every
    daemon of a cluster has the same secret.
    """

    status = Status.AUTH_FAILED


_BY_STATUS: dict[int, type[DaemonError]] = {
    Status.BAD_FRAME: BadRequest,
    Status.BAD_OP: BadRequest,
    Status.BAD_ARGUMENT: BadRequest,
    Status.NOT_FOUND: TensorNotFound,
    Status.EXISTS: TensorExists,
    Status.MOVED: TensorMoved,
    Status.DTYPE_MISMATCH: DtypeMismatch,
    Status.SHAPE_MISMATCH: ShapeMismatch,
    Status.OUT_OF_RANGE: OutOfRange,
    Status.NO_SPACE: ArenaFull,
    Status.TOO_LARGE: RequestTooLarge,
    Status.BAD_VERSION: ProtocolMismatch,
    Status.STALE_LAYOUT: StaleLayout,
    Status.NOT_READY: NotReady,
    Status.WORKER_LOST: WorkerLost,
    Status.EVICTED: WorkerEvicted,
    Status.BAD_STEP: StepMismatch,
    Status.NOT_OWNER: NotOwner,
    Status.RECOVERING: Recovering,
    Status.NO_QUORUM: NoQuorum,
    Status.BEHIND: Behind,
    Status.AUTH_FAILED: AuthFailed,
    Status.STAMP_GONE: StampGone,
    Status.STAMP_PENDING: StampPending,
    Status.STALE_EPOCH: StaleEpoch,
    Status.STALE_STAMP: StaleStamp,
}

# Statuses that mean "this replica cannot do it now, another one may": a
# client with replicas tries the next one.
FAILOVER_STATUSES = frozenset(
    {Status.NOT_OWNER, Status.RECOVERING, Status.NO_QUORUM, Status.BEHIND, Status.STALE_EPOCH}
)


def error_for_status(status: int, message: str) -> DaemonError:
    """The exception a client raises for a daemon's error status."""
    try:
        st = Status(status)
    except ValueError:
        return DaemonError(f"unknown status {status}: {message}")
    cls = _BY_STATUS.get(st, DaemonError)
    return cls(message, st)


class VersionNotFound(IrdmaError, LookupError):
    """A model version asked for is not committed (not yet, or its writer died
    before the commit), or the model has no committed version at all."""


class VersionGone(VersionNotFound):
    """A model version was committed and has since been pruned (older than the
    versions the model keeps, and not pinned)."""


class VersionsWentBack(IrdmaError):
    """The newest committed version the daemons show is older than one this client
    already saw: its manifest is unreachable (its daemons down), never a newer
    version taken back."""


class DigestMismatch(IrdmaError):
    """A tensor read from a model version does not match the digest its manifest
    keeps: the bytes were changed after the commit, or damaged."""
