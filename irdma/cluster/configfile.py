"""Cluster configuration (TOML) and shard placement.

Example::

    shard_size = "4MiB"      # bytes per shard (int or "4MiB")
    replicas = 1             # copies of each shard
    timeout = 10.0           # seconds a client waits for a daemon
    heartbeat = 0.2          # seconds between daemons' heartbeats (replicas > 1)
    failure_timeout = 1.0    # a daemon silent this long is taken as down
    snapshot_interval = 60   # seconds between snapshots to data_dir (0: only on stop)
    read_lease = 10.0        # seconds a reader's lease on a write lasts unless renewed
    lend_forwards = true     # a backup on the primary's kernel copies large updates out of
                             # its memory; false: sent over the network, as between hosts
    log_level = "INFO"       # psd's log level (psd --log-level wins; SIGHUP re-reads it)
    secret_file = "/etc/irdma/secret"  # connections prove it (irdma.auth); set in production
    rdma_gid_index = 1       # optional; default: the RoCE v2 GID of each address
    rdma_mtu = 4096          # optional; default: the smaller active MTU of the two ports

    [[nodes]]
    name = "n1"
    address = "tcp://127.0.0.1:7401"
    data_dir = "/var/lib/irdma/n1"
    arena_size = "1GiB"
    metrics_address = "127.0.0.1:9401"   # optional: Prometheus text at http://HOST:PORT/metrics

    [etcd]                   # optional: a daemon is up while its etcd lease is
    endpoints = ["http://10.0.0.1:2379"]
    prefix = "/irdma/prod"   # default /irdma/default
    lease_ttl = 2            # seconds; a daemon that stops renewing is down after it
    replace_after = 30       # seconds down before its shards are copied elsewhere

An address is ``tcp://``, ``shm://`` (same-host clients must use shared
memory) or ``rdma://`` (clients use RDMA verbs, set up over the daemon's TCP
port, and fall back to TCP with a warning where there is no device).

``metrics_address`` is HOST:PORT (an IPv6 host in brackets), with no
scheme; it must differ from every node's daemon address and from every
other node's metrics address. Absent, the daemon serves no metrics.

The config is found via ``--config``, then ``$IRDMA_CONFIG``, then
``/etc/irdma/cluster.toml``. ``$IRDMA_ETCD_ENDPOINTS`` (comma-separated
``http://host:port``) sets ``[etcd] endpoints``, adding the table if the file
has none. Placement is rendezvous (highest random weight)
hashing of (tensor key, shard index) over the node names, so every client and
daemon computes the same replica list without a lookup service.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .config import (
    DEFAULT_ETCD_PREFIX,
    DEFAULT_FAILURE_TIMEOUT,
    DEFAULT_HEARTBEAT,
    DEFAULT_LEASE_TTL,
    DEFAULT_READ_LEASE,
    DEFAULT_REPLACE_AFTER,
    DEFAULT_SHARD_SIZE,
    DEFAULT_SNAPSHOT_INTERVAL,
    DEFAULT_TIMEOUT,
    Address,
    ClusterConfig,
    EtcdSettings,
    Node,
)

DEFAULT_CONFIG_PATH = Path("/etc/irdma/cluster.toml")
# Comma-separated etcd endpoints: the config's [etcd] endpoints (an [etcd] table with
# its defaults if the file has none). The systemd units pass it through.
ETCD_ENDPOINTS_ENV = "IRDMA_ETCD_ENDPOINTS"
RDMA_MTUS = (256, 512, 1024, 2048, 4096)
_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
}


def parse_size(value: Any) -> int:
    """Parse a byte size: an int, or a string such as ``"4MiB"``, ``"1 GiB"``, ``"512k"``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size {value} is negative")
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*([A-Za-z]*)\s*", value)
        if m and m.group(3).lower() in _UNITS:
            unit = _UNITS[m.group(3).lower()]
            frac = m.group(2) or ""
            # Exact integer arithmetic (floats lose whole bytes above 2**53).
            n = (int(m.group(1) + frac) * unit) // 10 ** len(frac)
            if (int(m.group(1) + frac) * unit) % 10 ** len(frac):
                raise ValueError(f"size {value!r} is not a whole number of bytes")
            return n
    raise ValueError(f"expected a size such as 4096 or '4MiB', got {value!r}")


def find_config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``explicit``, else ``$IRDMA_CONFIG``, else ``/etc/irdma/cluster.toml``."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("IRDMA_CONFIG")
    if env:
        return Path(env)
    return DEFAULT_CONFIG_PATH


def load_config(path: str | os.PathLike[str] | None = None) -> ClusterConfig:
    """Load and validate a cluster config; raises ConfigError naming file, key and problem."""
    p = find_config_path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        if path:
            hint = ""
        elif os.environ.get("IRDMA_CONFIG"):
            hint = " (named by IRDMA_CONFIG)"
        else:
            hint = " (pass --config or set IRDMA_CONFIG)"
        raise ConfigError(f"{p}: config file not found{hint}") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    endpoints = os.environ.get(ETCD_ENDPOINTS_ENV, "").strip()
    if endpoints:
        # Set by a unit or a job's environment: membership in etcd without editing the file.
        table = raw.setdefault("etcd", {})
        if isinstance(table, dict):
            table["endpoints"] = [e.strip() for e in endpoints.split(",") if e.strip()]
    return parse_config(raw, p)


_TOP_KEYS = {
    "nodes",
    "shard_size",
    "replicas",
    "timeout",
    "heartbeat",
    "failure_timeout",
    "snapshot_interval",
    "read_lease",
    "lend_forwards",
    "secret_file",
    "log_level",
    "rdma_gid_index",
    "rdma_mtu",
    "etcd",
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_NODE_KEYS = {"name", "address", "data_dir", "arena_size", "metrics_address"}


def parse_config(raw: dict[str, Any], path: Path | None = None) -> ClusterConfig:
    """Validate a decoded config dict (see ``load_config``)."""
    where = str(path) if path else "config"

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{where}: {key}: {problem}")

    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise fail(sorted(unknown)[0], f"unknown key (known: {', '.join(sorted(_TOP_KEYS))})")
    nodes_raw = raw.get("nodes")
    if "etcd" in raw and nodes_raw is None:
        nodes_raw = []  # a client's config: the nodes come from etcd's epoch
    elif not isinstance(nodes_raw, list) or not nodes_raw:
        raise fail("nodes", "at least one [[nodes]] table is required (or an [etcd] table)")
    nodes: list[Node] = []
    seen_names: set[str] = set()
    seen_addrs: set[tuple[str, int]] = set()
    for i, n in enumerate(nodes_raw):
        k = f"nodes[{i}]"
        if not isinstance(n, dict):
            raise fail(k, "must be a table")
        unknown = set(n) - _NODE_KEYS
        if unknown:
            raise fail(f"{k}.{sorted(unknown)[0]}", "unknown key")
        for req in ("name", "address", "arena_size"):
            if req not in n:
                raise fail(f"{k}.{req}", "missing")
        name = n["name"]
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise fail(f"{k}.name", f"{name!r} must be 1-64 letters, digits, '_', '.' or '-'")
        if name in seen_names:
            raise fail(f"{k}.name", f"duplicate node name {name!r}")
        seen_names.add(name)
        try:
            addr = Address.parse(str(n["address"]))
        except ValueError as exc:
            raise fail(f"{k}.address", str(exc)) from None
        if (addr.host, addr.port) in seen_addrs:
            raise fail(f"{k}.address", f"{addr} is used by another node")
        seen_addrs.add((addr.host, addr.port))
        try:
            arena = parse_size(n["arena_size"])
        except ValueError as exc:
            raise fail(f"{k}.arena_size", str(exc)) from None
        if arena < 1 << 20:
            raise fail(f"{k}.arena_size", f"{arena} bytes is under the 1 MiB minimum")
        data_dir = n.get("data_dir", f"/var/lib/irdma/{name}")
        if not isinstance(data_dir, str):
            raise fail(f"{k}.data_dir", "must be a path string")
        metrics = None
        if "metrics_address" in n:
            try:
                metrics = parse_metrics_address(n["metrics_address"])
            except ValueError as exc:
                raise fail(f"{k}.metrics_address", str(exc)) from None
        nodes.append(Node(name, addr, _resolve(Path(data_dir), path), arena, metrics))
    _check_metrics_addresses(nodes, fail)
    try:
        shard_size = parse_size(raw.get("shard_size", DEFAULT_SHARD_SIZE))
    except ValueError as exc:
        raise fail("shard_size", str(exc)) from None
    if shard_size < 4096 or shard_size % 4096:
        raise fail("shard_size", f"{shard_size} must be a multiple of 4096 (a page), at least 4096")
    replicas = raw.get("replicas", 1)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise fail("replicas", f"{replicas!r} must be a positive integer")
    if replicas > len(nodes) and "etcd" not in raw:
        raise fail("replicas", f"{replicas} replicas need at least {replicas} nodes")
    timeout = _seconds(raw, "timeout", DEFAULT_TIMEOUT, fail)
    heartbeat = _seconds(raw, "heartbeat", DEFAULT_HEARTBEAT, fail)
    failure_timeout = _seconds(raw, "failure_timeout", DEFAULT_FAILURE_TIMEOUT, fail)
    if failure_timeout < 2 * heartbeat:
        raise fail(
            "failure_timeout",
            f"{failure_timeout} s must be at least two heartbeats ({2 * heartbeat} s)",
        )
    snapshot_interval = _seconds(
        raw, "snapshot_interval", DEFAULT_SNAPSHOT_INTERVAL, fail, zero_ok=True
    )
    read_lease = _seconds(raw, "read_lease", DEFAULT_READ_LEASE, fail)
    lend_forwards = raw.get("lend_forwards", True)
    if not isinstance(lend_forwards, bool):
        raise fail("lend_forwards", f"{lend_forwards!r} must be true or false")
    secret = raw.get("secret_file")
    if secret is not None and not isinstance(secret, str):
        raise fail("secret_file", "must be a path string")
    log_level = raw.get("log_level")
    if log_level is not None and (
        not isinstance(log_level, str) or log_level.upper() not in LOG_LEVELS
    ):
        raise fail("log_level", f"{log_level!r} must be one of {', '.join(LOG_LEVELS)}")
    gid_index = raw.get("rdma_gid_index")
    if gid_index is not None and (
        not isinstance(gid_index, int) or isinstance(gid_index, bool) or not 0 <= gid_index < 256
    ):
        raise fail("rdma_gid_index", f"{gid_index!r} must be a GID table index (0-255)")
    rdma_mtu = raw.get("rdma_mtu")
    if rdma_mtu is not None and rdma_mtu not in RDMA_MTUS:
        raise fail("rdma_mtu", f"{rdma_mtu!r} must be one of {', '.join(map(str, RDMA_MTUS))}")
    etcd = _etcd_settings(raw.get("etcd"), fail) if "etcd" in raw else None
    return ClusterConfig(
        nodes=tuple(nodes),
        shard_size=shard_size,
        replicas=replicas,
        timeout=timeout,
        heartbeat=heartbeat,
        failure_timeout=failure_timeout,
        snapshot_interval=snapshot_interval,
        read_lease=read_lease,
        lend_forwards=lend_forwards,
        secret_file=_resolve(Path(secret), path) if secret else None,
        log_level=log_level.upper() if log_level else None,
        rdma_gid_index=gid_index,
        rdma_mtu=rdma_mtu,
        etcd=etcd,
        path=path,
    )


_ETCD_KEYS = {"endpoints", "prefix", "lease_ttl", "replace_after"}


def _etcd_settings(raw: Any, fail: Any) -> EtcdSettings:
    """The ``[etcd]`` table: endpoints (required), prefix, lease_ttl."""
    if not isinstance(raw, dict):
        raise fail("etcd", "must be a table ([etcd])")
    unknown = set(raw) - _ETCD_KEYS
    if unknown:
        raise fail(
            f"etcd.{sorted(unknown)[0]}", f"unknown key (known: {', '.join(sorted(_ETCD_KEYS))})"
        )
    endpoints = raw.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        raise fail("etcd.endpoints", "a list of at least one http://host:port is required")
    for e in endpoints:
        if not isinstance(e, str) or not re.fullmatch(r"http://[^/\s:]+(:\d{1,5})?/?", e):
            raise fail("etcd.endpoints", f"{e!r} must be http://host:port")
    prefix = raw.get("prefix", DEFAULT_ETCD_PREFIX)
    if not isinstance(prefix, str) or not re.fullmatch(r"/[A-Za-z0-9_./-]*[^/]", prefix):
        raise fail("etcd.prefix", f"{prefix!r} must be a key path like /irdma/prod")
    ttl = raw.get("lease_ttl", DEFAULT_LEASE_TTL)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= 3600:
        raise fail("etcd.lease_ttl", f"{ttl!r} must be whole seconds, 1 to 3600")
    replace_after = _seconds(
        raw, "replace_after", DEFAULT_REPLACE_AFTER, lambda k, m: fail(f"etcd.{k}", m)
    )
    return EtcdSettings(tuple(endpoints), prefix, ttl, replace_after)


def parse_metrics_address(value: Any) -> Address:
    """A node's ``metrics_address``: "HOST:PORT" (IPv6 in brackets), port 1-65535.

    Raises ValueError naming the problem.
    """
    if not isinstance(value, str):
        raise ValueError(f"{value!r} must be a string such as '127.0.0.1:9401'")
    m = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:/\[\]\s]+):(\d+)", value)
    if not m:
        raise ValueError(
            f"{value!r} is not of the form HOST:PORT (no scheme, e.g. '127.0.0.1:9401')"
        )
    port = int(m.group(2))
    if not 0 < port < 65536:
        raise ValueError(f"{value!r}: port must be 1-65535")
    return Address("http", m.group(1).strip("[]"), port)


def _check_metrics_addresses(nodes: list[Node], fail: Any) -> None:
    """A metrics address may not be a daemon's address or another node's metrics address."""
    daemons = {(n.address.host, n.address.port): n.name for n in nodes}
    seen: dict[tuple[str, int], str] = {}
    for i, n in enumerate(nodes):
        if n.metrics_address is None:
            continue
        where = (n.metrics_address.host, n.metrics_address.port)
        key = f"nodes[{i}].metrics_address"
        if where in daemons:
            raise fail(
                key, f"{where[0]}:{where[1]} is the daemon address of node {daemons[where]!r}"
            )
        if where in seen:
            raise fail(key, f"{where[0]}:{where[1]} is also the metrics address of {seen[where]!r}")
        seen[where] = n.name


def _seconds(
    raw: dict[str, Any], key: str, default: float, fail: Any, *, zero_ok: bool = False
) -> float:
    value = raw.get(key, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not (value >= 0 if zero_ok else value > 0) or value != value:
        what = "a non-negative" if zero_ok else "a positive"
        raise fail(key, f"{value!r} must be {what} number of seconds")
    return float(value)


def _resolve(p: Path, config_path: Path | None) -> Path:
    """A relative path in a config means relative to the config file's folder."""
    if p.is_absolute() or config_path is None:
        return p
    return config_path.parent / p


def render_config(
    nodes: list[tuple[str, str, str, int]],
    shard_size: int = DEFAULT_SHARD_SIZE,
    replicas: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    extra: dict[str, float | bool] | None = None,
) -> str:
    """TOML text for a cluster of (name, address, data_dir, arena_size) nodes.

    ``extra`` adds top-level numeric or boolean keys (heartbeat, lend_forwards, ...).
    """
    lines = [f"shard_size = {shard_size}", f"replicas = {replicas}", f"timeout = {timeout}"]
    lines += [
        f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in (extra or {}).items()
    ]
    lines.append("")
    for name, address, data_dir, arena in nodes:
        lines += [
            "[[nodes]]",
            f'name = "{name}"',
            f'address = "{address}"',
            f'data_dir = "{data_dir}"',
            f"arena_size = {arena}",
            "",
        ]
    return "\n".join(lines)
