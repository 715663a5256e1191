"""``irdma status``: the cluster at a glance, one row per daemon.

Each daemon is asked for its HELLO record (state, version, shards by role,
arena use, last snapshot) and, with replicas, for the versions of the shards
it holds (a LIST), all daemons at once. From the versions comes the skew
column: how many of the shards a daemon should hold are older than, or
missing next to, the newest copy another replica reported. It is read at
one moment, not atomically across daemons: under writes a backup may show a
shard or two behind for the moment an update takes to be forwarded.

For a cluster run by ``irdma local`` (the config sits in its locked
directory), the RESTARTS column says how often it restarted each daemon,
and a down daemon's row says whether it is being restarted or was given up.

Below the rows, the models (``irdma.client.versions``) the daemons hold the
bookkeeping of: the latest version, the oldest a reader pins and how far
behind that is, and with ``[etcd]`` the newest commit etcd recorded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from ..client import AsyncClient
from ..cluster import Address, ClusterConfig, Node
from ..cluster.etcd import EtcdError
from ..cluster.registry import ClusterState, Registry
from ..cluster.version_numbers import VersionNumbers
from ..errors import AuthFailed, DaemonTimeout, IrdmaError
from ..protocol.bodies import StatRecord
from . import localdir
from .supervisor import FAILED, RESTARTING, STOPPED, DaemonRecord


@dataclass
class NodeStatus:
    """One row: a daemon as this host sees it."""

    node: str
    address: str
    up: bool = False
    error: str | None = None  # why it is down
    transport: str | None = None  # how this host reaches it: shm, tcp or rdma
    hello: dict[str, Any] | None = None
    holdings: list[StatRecord] | None = None  # its LIST records (with replicas)
    skew: int | None = None  # shards behind another replica; None: not known or no replicas
    supervised: DaemonRecord | None = None  # irdma local's record of it, if it runs one
    # With [etcd]: whether it is registered there now (its lease alive); None: no etcd,
    # or etcd could not be asked (``etcd_error`` says why).
    registered: bool | None = None
    etcd_error: str | None = None
    refused: bool = False  # it answered, and refused this client's secret
    cause: str | None = None  # why it is down, in words that do not name it (rows share them)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "address": self.address, "up": self.up}
        epoch = (self.hello or {}).get("epoch")
        if epoch is not None:
            out["epoch"] = epoch  # the epoch it follows: number, members, target, settled
            out["copies"] = (self.hello or {}).get("copies")
        if self.registered is not None or self.etcd_error is not None:
            out["registered"] = self.registered
        if self.supervised is not None:
            out |= {"restarts": self.supervised.restarts, "supervisor": self.supervised.state}
        out["state"] = self.state
        if not self.up:
            return out | {"error": self.down_reason(), "transport": None, "pid": self.pid}
        h = self.hello or {}
        return out | {
            "transport": self.transport,
            "pid": self.pid,
            "version": h.get("version"),
            # With replicas: False while it catches up from its peers.
            "ready": h.get("ready", True),
            "quorum": h.get("quorum", True),
            "tensors": h.get("tensors"),
            "shards": h.get("shards"),
            "arena_used": h.get("arena_used"),
            "arena_size": h.get("arena_size"),
            "snapshot": h.get("snapshot"),
            "skew": self.skew,
            # The models whose bookkeeping it holds: newest version, pins, oldest pinned.
            "models": h.get("models", []),
        }

    @property
    def state(self) -> str:
        """One word: up, syncing, minority; else refused (a secret it does not take),
        restarting, failed, stopped (irdma local's word) or down."""
        if self.up:
            h = self.hello or {}
            if not h.get("quorum", True):
                return "minority"
            return "up" if h.get("ready", True) else "syncing"
        r = self.supervised
        if r is not None and r.state in SUPERVISOR_STATES:
            return SUPERVISOR_STATES[r.state]
        return "refused" if self.refused else "down"

    @property
    def pid(self) -> int | None:
        """Its process id: from its answer, else from irdma local's record."""
        pid = (self.hello or {}).get("pid")
        if pid is None and self.supervised is not None:
            pid = self.supervised.pid
        return pid

    def down_reason(self, cause: str | None = None) -> str:
        """Why the daemon is down: irdma local's word when it supervises it, else the error
        (or ``cause``, the error's words without the daemon's name)."""
        cause = cause or self.error or ""
        r = self.supervised
        if r is not None and r.state == RESTARTING:
            return f"{r.last_exit}; irdma local is restarting it"
        if r is not None and r.state == FAILED:
            return f"{r.last_exit}; irdma local gave up after {r.fast_crashes} fast crashes"
        if r is not None and r.state == STOPPED:
            return f"{r.last_exit}; irdma local does not restart a clean exit"
        if r is not None and r.restarts:
            return f"starting again after {r.last_exit} (restart {r.restarts}): {cause}"
        if self.refused:
            return f"up, and refuses this client: it {cause}"
        return cause

    def explanation(self) -> str:
        """``down_reason`` in words the rows it applies to can share."""
        return self.down_reason(self.cause)


SUPERVISOR_STATES = {RESTARTING: "restarting", FAILED: "failed", STOPPED: "stopped"}


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, its causes and contexts, and what exception groups among them hold."""
    out: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if e in out:
            continue
        out.append(e)
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        if isinstance(e, BaseExceptionGroup):
            todo += list(e.exceptions)
    return out


def short_cause(exc: IrdmaError, timeout: float) -> str:
    """Why a daemon did not answer ``irdma status``, without its name or address."""
    if isinstance(exc, AuthFailed):
        # "daemon n1 (tcp://...) has another secret: ..." -> "has another secret: ..."
        text = str(exc)
        return text.split(") ", 1)[1] if text.startswith("daemon ") and ") " in text else text
    if isinstance(exc, DaemonTimeout):
        return f"no answer within {timeout:g} s (hung, overloaded or unreachable)"
    if any(isinstance(e, ConnectionRefusedError) for e in _chain(exc)):
        return "connection refused: nothing listens at its address (not started, or stopped)"
    return str(exc)


async def gather(client: AsyncClient) -> list[NodeStatus]:
    """Ask every daemon at once; a daemon that cannot be reached is a row marked down.

    With ``[etcd]`` the daemons are the epoch's (read from etcd first), and any
    daemon registered but not in it yet (joining, or drained) has a row too."""
    config = client.config
    cluster: ClusterState | None = None
    etcd_error: str | None = None
    if config.etcd is not None:
        try:
            cluster = await Registry.of(config.etcd, config.timeout).state()
        except EtcdError as exc:
            etcd_error = str(exc)
        else:
            if cluster.epoch is not None:
                config = config.following(cluster.epoch) or config
    nodes = {n.name: n for n in config.nodes}
    for name, record in sorted((cluster.members if cluster else {}).items()):
        if name not in nodes:
            with contextlib.suppress(ValueError):
                nodes[name] = Node(name, Address.parse(record.address), Path("-"), 0)
    rows = [NodeStatus(n.name, str(n.address)) for n in nodes.values()]
    for row in rows:
        if cluster is not None:
            row.registered = row.node in cluster.members
        row.etcd_error = etcd_error

    async def ask(row: NodeStatus) -> None:
        node = nodes[row.node]
        try:
            row.hello = await client.hello(node)
        except IrdmaError as exc:
            row.error = str(exc)
            row.refused = isinstance(exc, AuthFailed)
            row.cause = short_cause(exc, client.timeout)
            return
        row.up = True
        row.transport = client.transport_of(node)
        if config.replicas > 1:
            try:
                row.holdings = await client.holdings(node)
            except IrdmaError:
                row.holdings = None  # skew unknown for this one

    async with trio.open_nursery() as nursery:
        for row in rows:
            nursery.start_soon(ask, row)
    if config.path is not None:
        records = localdir.supervision(config.path.parent)
        for row in rows:
            row.supervised = records.get(row.node)
    if config.replicas > 1:
        answered = {r.node: r.holdings for r in rows if r.holdings is not None}
        for node, behind in replica_skew(config, answered).items():
            next(r for r in rows if r.node == node).skew = behind
    return rows


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """One model over the daemons that answered (and etcd, with ``[etcd]``)."""

    model: str
    latest: int  # the newest version whose manifest a daemon holds (0: none)
    oldest_pinned: int  # the oldest version a reader pins (0: none)
    recorded: int | None  # the newest commit etcd recorded (None: no etcd, or not read)

    @property
    def lag(self) -> int | None:
        """Versions the slowest pinning reader is behind the latest (None: no pins)."""
        return self.latest - self.oldest_pinned if self.oldest_pinned else None


async def recorded_versions(config: ClusterConfig) -> dict[str, int] | None:
    """Each model's newest commit as etcd records it; None without ``[etcd]`` or
    when etcd does not answer (the daemons' figures stand alone then)."""
    if config.etcd is None:
        return None
    try:
        found = await VersionNumbers.of(config.etcd, config.timeout).models()
    except EtcdError:
        return None
    return {m.model: m.committed for m in found}


def model_status(rows: list[NodeStatus], recorded: dict[str, int] | None) -> list[ModelStatus]:
    """The models the answering daemons (and etcd) know of, by name."""
    latest: dict[str, int] = {}
    pinned: dict[str, int] = {}
    for r in rows:
        for m in (r.hello or {}).get("models", []):
            name = m["model"]
            latest[name] = max(latest.get(name, 0), m["newest"])
            if m["oldest_pinned"]:
                pinned[name] = min(pinned.get(name, m["oldest_pinned"]), m["oldest_pinned"])
    names = sorted(set(latest) | set(recorded or {}))
    return [
        ModelStatus(
            n,
            latest.get(n, 0),
            pinned.get(n, 0),
            None if recorded is None else recorded.get(n, 0),
        )
        for n in names
    ]


def render_models(models: list[ModelStatus]) -> list[str]:
    """The models' table (no lines when there are none)."""
    if not models:
        return []
    with_etcd = any(m.recorded is not None for m in models)
    headings = ["MODEL", "LATEST", *(["ETCD"] if with_etcd else []), "OLDEST PINNED", "LAG"]
    table = [headings]
    for m in models:
        table.append(
            [
                m.model,
                str(m.latest or "-"),
                *([str(m.recorded or "-")] if with_etcd else []),
                str(m.oldest_pinned or "-"),
                "-" if m.lag is None else str(m.lag),
            ]
        )
    return aligned(table, right=set(headings[1:]))


def aligned(table: list[list[str]], right: set[str]) -> list[str]:
    """A table (its first row the headings) as lines, each column as wide as its widest
    cell, the columns headed by a name in ``right`` aligned right."""
    headings = table[0]
    widths = [max(len(cells[i]) for cells in table) for i in range(len(headings))]
    return [
        "  ".join(
            c.rjust(widths[i]) if headings[i] in right else c.ljust(widths[i])
            for i, c in enumerate(cells)
        ).rstrip()
        for cells in table
    ]


def replica_skew(config: ClusterConfig, holdings: dict[str, list[StatRecord]]) -> dict[str, int]:
    """Per daemon in ``holdings``: shards it should hold that are behind the newest copy.

    ``holdings`` maps node names to their LIST records. A shard counts when
    the daemon's version is lower than the highest any daemon reported, or
    when placement gives the daemon a copy it does not have.
    """
    newest: dict[tuple[int, int], int] = {}
    held: dict[str, dict[tuple[int, int], int]] = {}
    for node, records in holdings.items():
        mine = held[node] = {}
        for rec in records:
            key = rec.meta.key  # a renamed tensor's is not its name's
            for index, version in (rec.shards or {}).items():
                shard = (key, index)
                mine[shard] = version
                if version > newest.get(shard, -1):
                    newest[shard] = version
    out = {}
    for node, mine in held.items():
        behind = 0
        for shard, version in newest.items():
            have = mine.get(shard)
            if have is None:
                behind += config.holds(node, shard[0], shard[1])
            else:
                behind += have < version
        out[node] = behind
    return out


def version_skew(rows: list[NodeStatus]) -> str | None:
    """A line naming which daemons run which irdma version, when they differ; else None."""
    by_version: dict[str, list[str]] = {}
    for r in rows:
        if r.up:
            by_version.setdefault(str((r.hello or {}).get("version", "?")), []).append(r.node)
    if len(by_version) < 2:
        return None
    parts = [f"{v} on {', '.join(nodes)}" for v, nodes in sorted(by_version.items())]
    return "irdma versions differ: " + "; ".join(parts)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def human_age(seconds: float) -> str:
    """``42s ago``, ``5m ago``, ``3h ago``, ``2d ago``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


HEADINGS = (
    "NODE",
    "ADDRESS",
    "VIA",
    "STATE",
    "PID",
    "VERSION",
    "TENSORS",
    "SHARDS P/B",
    "ARENA USED",
    "SNAPSHOT",
    "SKEW",
)


def _cells(r: NodeStatus, replicated: bool, supervised: bool) -> list[str]:
    """A row's cells ("-" where a daemon that did not answer leaves them unknown)."""
    lead = [r.node, r.address, r.transport or "-", r.state, str(r.pid or "-")]
    restarts = [str(r.supervised.restarts) if r.supervised else "-"] if supervised else []
    if not r.up:
        return [*lead, *restarts, *["-"] * (len(HEADINGS) - len(lead))]
    h = r.hello or {}
    shards = h.get("shards")
    snap = h.get("snapshot")
    # "-": one copy per shard, nothing to compare; "?": its versions could not be listed.
    skew = "-" if not replicated else "?" if r.skew is None else str(r.skew)
    return [
        *lead,
        *restarts,
        str(h.get("version", "?")),
        str(h.get("tensors", "?")),
        f"{shards['primary']}/{shards['backup']}" if shards else "?",
        f"{human_bytes(h['arena_used'])} / {human_bytes(h['arena_size'])}",
        human_age(snap["age"]) if snap else "never",
        skew,
    ]


def render(
    rows: list[NodeStatus], config: ClusterConfig, models: list[ModelStatus] | None = None
) -> str:
    """The table, columns as wide as their widest cell, then why the daemons that are not
    up are not: one line per explanation, naming the daemons it applies to; then the
    models' table, if any (``model_status``).

    RESTARTS (after PID) only when ``irdma local`` supervises the daemons.
    """
    supervised = any(r.supervised is not None for r in rows)
    headings = list(HEADINGS)
    if supervised:
        headings.insert(headings.index("PID") + 1, "RESTARTS")
    table = [headings] + [_cells(r, config.replicas > 1, supervised) for r in rows]
    lines = aligned(table, right={"PID", "RESTARTS", "TENSORS", "SHARDS P/B", "SKEW"})
    why: dict[str, list[str]] = {}
    for r in rows:
        if not r.up:
            why.setdefault(r.explanation(), []).append(r.node)
    lines += [f"{', '.join(nodes)}: {text}" for text, nodes in why.items()]
    skew = version_skew(rows)
    if skew:
        lines.append(skew)
    if config.etcd is not None:
        lines.append(etcd_line(rows, config))
    if models:
        lines += ["", *render_models(models)]
    return "\n".join(lines)


def etcd_line(rows: list[NodeStatus], config: ClusterConfig) -> str:
    """Who is registered in etcd (up, as the daemons see each other), or why not known."""
    assert config.etcd is not None
    where = f"etcd {config.etcd.prefix}"
    errors = [r.etcd_error for r in rows if r.etcd_error]
    if errors:
        return f"{where}: cannot say who is registered: {errors[0]}"
    missing = [r.node for r in rows if not r.registered]
    line = (
        f"{where}: every daemon registered"
        if not missing
        else f"{where}: not registered (down as the others see it): {', '.join(missing)}"
    )
    epoch = config.epoch
    if epoch is None:
        return line + "\nepoch: none yet"
    line += f"\nepoch {epoch.number}: members {', '.join(epoch.members)}"
    if epoch.target is not None:
        line += f"; moving to {', '.join(epoch.target)} (copying)"
    outside = [r.node for r in rows if r.node not in epoch.names]
    if outside:
        line += f"; registered outside it: {', '.join(outside)}"
    return line
