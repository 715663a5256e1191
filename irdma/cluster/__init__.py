"""The cluster: its configuration, where shards live, and its membership.

- ``config``: ``ClusterConfig`` and its records (``Node``, ``Address``,
  ``EtcdSettings``), what every client and daemon holds
- ``configfile``: ``cluster.toml`` found, read, checked and written
- ``placement``: rendezvous hashing of (tensor, shard) over the members (pure)
- ``epochs``: the member list at one moment and the moves between epochs (pure)
- ``etcd``: a small etcd v3 client (its JSON gateway over HTTP/1.1, trio)
- ``registry``: membership in etcd: leases, the epoch in force, drain requests
- ``version_numbers``: model version numbers claimed and recorded in etcd
- ``in_force``: ``ConfigInForce``, the config of the epoch in force in one process
"""

from .config import (
    DEFAULT_SHARD_SIZE,
    DEFAULT_TIMEOUT,
    Address,
    ClusterConfig,
    EtcdSettings,
    Node,
)
from .configfile import (
    DEFAULT_CONFIG_PATH,
    LOG_LEVELS,
    find_config_path,
    load_config,
    parse_config,
    parse_size,
    render_config,
)
from .in_force import ConfigInForce
from .placement import rendezvous_order

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_SHARD_SIZE",
    "DEFAULT_TIMEOUT",
    "LOG_LEVELS",
    "Address",
    "ClusterConfig",
    "ConfigInForce",
    "EtcdSettings",
    "Node",
    "find_config_path",
    "load_config",
    "parse_config",
    "parse_size",
    "render_config",
    "rendezvous_order",
]
