"""irdma: a sharded parameter server for distributed deep learning.

Workers use ``irdma.Client`` (blocking) or ``irdma.AsyncClient`` (trio) to
create, read, write and accumulate tensors held by ``psd`` daemons.
"""

from . import mounts, spawn
from .client import AsyncClient, Client, ReadLease, TensorInfo, manifests
from .cluster import ClusterConfig, load_config, parse_size
from .dtypes import npy_header
from .errors import (
    ArenaFull,
    AuthFailed,
    ClientClosed,
    ConfigError,
    DaemonError,
    DaemonTimeout,
    DaemonUnavailable,
    DigestMismatch,
    DtypeMismatch,
    IrdmaError,
    OutOfRange,
    ShapeMismatch,
    TensorExists,
    TensorNotFound,
    TornRead,
    VersionGone,
    VersionNotFound,
    VersionsWentBack,
)
from .names import DIR_MARKER
from .protocol import MAX_NAME_BYTES
from .sdnotify import Notifier
from .training.modes import Mode, describe_options
from .transport.shared import SharedMemoryFull, SharedRegion

__version__ = "0.1.0"

__all__ = [
    "DIR_MARKER",
    "MAX_NAME_BYTES",
    "ArenaFull",
    "AsyncClient",
    "AuthFailed",
    "Client",
    "ClientClosed",
    "ClusterConfig",
    "ConfigError",
    "DaemonError",
    "DaemonTimeout",
    "DaemonUnavailable",
    "DigestMismatch",
    "DtypeMismatch",
    "IrdmaError",
    "Mode",
    "Notifier",
    "OutOfRange",
    "ReadLease",
    "ShapeMismatch",
    "SharedMemoryFull",
    "SharedRegion",
    "TensorExists",
    "TensorInfo",
    "TensorNotFound",
    "TornRead",
    "VersionGone",
    "VersionNotFound",
    "VersionsWentBack",
    "describe_options",
    "load_config",
    "manifests",
    "mounts",
    "npy_header",
    "parse_size",
    "spawn",
]
