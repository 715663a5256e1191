"""``irdma doctor``: check a host for what breaks RDMA and FUSE setups, and say how to fix it.

One line per check, ``OK``, ``WARN`` or ``FAIL``, with the fix for the last
two; the exit status is 1 when anything FAILs. The checks, by topic:

- **rdma**: each RDMA device port is ACTIVE (``/sys/class/infiniband``); a
  RoCE port has a RoCE v2 GID mapping an IPv4 address (``::ffff:a.b.c.d``,
  what the rdma transport uses) and the node addresses on this host have
  one; the RDMA MTU the netdev's MTU allows (``ibv_devinfo``'s active_mtu
  when installed) and the config's ``rdma_mtu``; ``/dev/infiniband/uverbsN``
  exists and the daemon's user may open it.
- **memlock**: RLIMIT_MEMLOCK (or CAP_IPC_LOCK) of each daemon configured on
  this host, read from the running daemon, else this shell's, against its
  ``arena_size`` (RDMA registers the whole arena).
- **fuse**: ``/dev/fuse``, ``fusermount3`` (setuid root unless root),
  ``user_allow_other`` for ``--allow-other``, the kernel (the mount's own
  session needs Linux 5.17; passthrough, Linux 6.9 and root), and pyfuse3
  where the kernel is older (the fallback).
- **daemons**: every daemon of the config answers HELLO within the timeout.

Where it looks (``Host``) is injectable, so tests build a fake ``/sys``.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib.util
import json
import os
import pwd
import resource
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from ..client import AsyncClient
from ..cluster import ClusterConfig, Node, find_config_path, load_config
from ..errors import ConfigError, IrdmaError
from ..transport import verbs

TOPICS = ("rdma", "memlock", "fuse", "daemons")
DEFAULT_TIMEOUT = 2.0
SERVICE_USER = "irdma"  # deploy/psd@.service runs the daemons as this user
CAP_IPC_LOCK = 14
# Bytes of RoCE v2 headers around an RDMA payload in one Ethernet frame (GRH,
# UDP, BTH, extended headers, ICRC): what the kernel subtracts from the
# netdev's MTU before picking the largest RDMA MTU that fits.
ROCE_OVERHEAD = 96
RDMA_MTUS = (4096, 2048, 1024, 512, 256)


class Level(enum.IntEnum):
    OK = 0
    WARN = 1
    FAIL = 2


@dataclass(frozen=True, slots=True)
class Finding:
    """The result of one check: a level, what was checked, what was found, the fix."""

    level: Level
    topic: str
    subject: str
    detail: str
    fix: str | None = None

    def line(self) -> str:
        text = f"{self.level.name:<4} {self.topic:<7} {self.subject}: {self.detail}"
        return f"{text}; fix: {self.fix}" if self.fix else text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"level": self.level.name}


@dataclass(frozen=True)
class Host:
    """Where the checks look, so tests can point them at a fake tree."""

    sysfs: Path = Path("/sys")
    dev: Path = Path("/dev")
    proc: Path = Path("/proc")
    fuse_conf: Path = Path("/etc/fuse.conf")
    ibv_devinfo: str | None = field(default_factory=lambda: shutil.which("ibv_devinfo"))
    fusermount: str | None = field(default_factory=lambda: shutil.which("fusermount3"))
    euid: int = field(default_factory=os.geteuid)
    kernel: str = field(default_factory=lambda: os.uname().release)

    @property
    def infiniband(self) -> Path:
        return self.sysfs / "class" / "infiniband"


# -- rdma --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Port:
    device: str
    number: int
    state: str  # "ACTIVE", "DOWN", "INIT", ...
    phys_state: str  # "LinkUp", "Disabled", "Polling", ...
    link_layer: str  # "Ethernet" (RoCE) or "InfiniBand"

    @property
    def name(self) -> str:
        return f"{self.device} port {self.number}"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _after_colon(text: str) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"`` (sysfs writes the number, then the name)."""
    return text.split(":", 1)[1].strip() if ":" in text else text


def _numbered(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def read_ports(host: Host) -> list[Port]:
    """Every port of every RDMA device in ``/sys/class/infiniband``."""
    if not host.infiniband.is_dir():
        return []
    ports = []
    for dev in sorted(host.infiniband.iterdir()):
        for p in _numbered(dev / "ports"):
            ports.append(
                Port(
                    device=dev.name,
                    number=int(p.name),
                    state=_after_colon(_read(p / "state")) or "unknown",
                    phys_state=_after_colon(_read(p / "phys_state")) or "unknown",
                    link_layer=_read(p / "link_layer") or "unknown",
                )
            )
    return ports


def parse_ibv_devinfo(text: str) -> dict[tuple[str, int], int]:
    """``(device, port) -> active MTU in bytes`` from ``ibv_devinfo`` output."""
    out: dict[tuple[str, int], int] = {}
    device, port = "", 0
    for raw in text.splitlines():
        key, _, value = raw.strip().partition(":")
        value = value.strip()
        if key == "hca_id":
            device = value
        elif key == "port" and value.isdigit():
            port = int(value)
        elif key == "active_mtu" and device and port:
            with contextlib.suppress(ValueError):
                out[(device, port)] = int(value.split()[0])
    return out


def active_mtus(host: Host) -> dict[tuple[str, int], int]:
    if not host.ibv_devinfo:
        return {}
    try:
        result = subprocess.run(
            [host.ibv_devinfo], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_ibv_devinfo(result.stdout)


def roce_mtu(netdev_mtu: int) -> int:
    """The RDMA MTU a RoCE port gets from its netdev's MTU."""
    room = netdev_mtu - ROCE_OVERHEAD
    return next((m for m in RDMA_MTUS if m <= room), 256)


def node_ips(node: Node) -> set[str]:
    """The IPv4 addresses a node's host name stands for (empty if it does not resolve)."""
    try:
        infos = socket.getaddrinfo(node.address.host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return set()
    return {str(info[4][0]) for info in infos}


def is_local(ip: str) -> bool:
    """Whether ``ip`` is an address of this host (in this network namespace)."""
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True


def local_nodes(config: ClusterConfig) -> list[Node]:
    return [n for n in config.nodes if any(is_local(ip) for ip in node_ips(n))]


def check_rdma(host: Host, config: ClusterConfig | None) -> list[Finding]:
    ports = read_ports(host)
    if not ports:
        rdma_nodes = [n.name for n in config.nodes if n.address.scheme == "rdma"] if config else []
        return [
            Finding(
                Level.FAIL if rdma_nodes else Level.WARN,
                "rdma",
                "devices",
                f"no RDMA device ({host.infiniband} is empty or absent); "
                + (
                    f"nodes {', '.join(rdma_nodes)} are configured as rdma://"
                    if rdma_nodes
                    else "clients use TCP or shared memory"
                ),
                "load the driver of the RDMA NIC, or for soft-RoCE: modprobe rdma_rxe && "
                "rdma link add rxe0 type rxe netdev ETH (apt install rdma-core)",
            )
        ]
    findings: list[Finding] = []
    any_active = any(p.state == "ACTIVE" for p in ports)
    gids = verbs.gid_table(host.infiniband)
    mtus = active_mtus(host)
    for port in ports:
        findings.append(_port_state(port, any_active))
        if port.state != "ACTIVE":
            continue  # its GIDs and MTU do not matter until it is up
        own = [g for g in gids if g.device == port.device and g.port == port.number]
        if port.link_layer == "Ethernet":
            findings.append(_roce_gids(port, own))
        findings.extend(_mtu(host, port, own, mtus, config))
    findings.extend(_uverbs(host, sorted({p.device for p in ports})))
    if config is not None:
        findings.extend(_node_gids(host, config))
    return findings


def _port_state(port: Port, any_active: bool) -> Finding:
    detail = f"{port.state} ({port.phys_state}, {port.link_layer})"
    if port.state == "ACTIVE":
        return Finding(Level.OK, "rdma", port.name, detail)
    if port.link_layer == "InfiniBand" and port.state in ("INIT", "ARMED"):
        fix = "no subnet manager on the fabric: run opensm on one host (apt install opensm)"
    elif port.phys_state in ("Disabled", "Polling", "unknown"):
        fix = "check the cable and switch port; for RoCE or rxe: ip link set ETH up"
    else:
        fix = "check the link (ibstat, ip link) until the port is ACTIVE"
    # A second, uncabled port of a NIC is common: only fail when nothing is up.
    return Finding(Level.WARN if any_active else Level.FAIL, "rdma", port.name, detail, fix)


def _roce_gids(port: Port, gids: list[verbs.GidEntry]) -> Finding:
    v4 = [g for g in gids if _ipv4(g.gid)]
    v2 = [g for g in v4 if g.kind == verbs.ROCE_V2]
    netdevs = sorted({g.netdev for g in gids if g.netdev}) or ["ETH"]
    if v2:
        listed = ", ".join(f"[{g.index}] {_ipv4(g.gid)} on {g.netdev or '?'}" for g in v2)
        return Finding(Level.OK, "rdma", f"{port.name} GIDs", f"RoCE v2 for {listed}")
    if v4:
        return Finding(
            Level.FAIL,
            "rdma",
            f"{port.name} GIDs",
            "IPv4 GIDs are RoCE v1 only (not routable; the rdma transport uses RoCE v2)",
            f"enable RoCE v2: cma_roce_mode -d {port.device} -p {port.number} -m 2, "
            "and check the NIC firmware supports it",
        )
    return Finding(
        Level.FAIL,
        "rdma",
        f"{port.name} GIDs",
        "no GID maps an IPv4 address (the kernel adds one per address of the netdev)",
        f"give {netdevs[0]} an IPv4 address: ip addr add A.B.C.D/NN dev {netdevs[0]}",
    )


def _ipv4(gid: str) -> str | None:
    try:
        return verbs.ipv4_of(gid)
    except ValueError:
        return None


def _mtu(
    host: Host,
    port: Port,
    gids: list[verbs.GidEntry],
    mtus: dict[tuple[str, int], int],
    config: ClusterConfig | None,
) -> list[Finding]:
    netdevs = sorted({g.netdev for g in gids if g.netdev})
    netdev_mtu = {n: int(m) for n in netdevs if (m := _read(host.sysfs / "class/net" / n / "mtu"))}
    subject = f"{port.name} MTU"
    active = mtus.get((port.device, port.number))
    how = "ibv_devinfo"
    if active is None and netdev_mtu:
        active = roce_mtu(min(netdev_mtu.values()))
        how = "from the netdev MTU"
    if active is None:
        return []  # InfiniBand without ibv_devinfo: nothing to go on
    where = ", ".join(f"{n} {m}" for n, m in netdev_mtu.items())
    detail = f"RDMA MTU {active} ({how}{'; ' + where if where else ''})"
    out = []
    if active >= 4096:
        out.append(Finding(Level.OK, "rdma", subject, detail))
    else:
        ndev = netdevs[0] if netdevs else "ETH"
        out.append(
            Finding(
                Level.WARN,
                "rdma",
                subject,
                detail + ": messages go in small packets",
                f"jumbo frames for 4096: ip link set dev {ndev} mtu 9000, the same on every "
                "host and the switch (and in the network config, to persist)",
            )
        )
    if config is not None and config.rdma_mtu and config.rdma_mtu > active:
        out.append(
            Finding(
                Level.FAIL,
                "rdma",
                subject,
                f"the config's rdma_mtu {config.rdma_mtu} is larger than the active MTU {active}",
                "lower rdma_mtu (or leave it unset) or raise the netdev MTU",
            )
        )
    return out


def _service_identity() -> tuple[str, int, set[int]]:
    """Who opens the devices: the service user if it exists, else whoever runs this."""
    try:
        pw = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        return (
            f"uid {os.geteuid()}",
            os.geteuid(),
            {os.getegid(), *os.getgroups()},
        )
    groups = {pw.pw_gid}
    with contextlib.suppress(OSError):
        groups.update(os.getgrouplist(pw.pw_name, pw.pw_gid))
    return f"user {SERVICE_USER}", pw.pw_uid, groups


def can_read_write(path: Path, uid: int, gids: set[int]) -> bool:
    """Whether ``uid`` (in ``gids``) may open ``path`` read-write by its mode bits."""
    st = path.stat()
    if uid == 0:
        return True
    if st.st_uid == uid:
        need = stat.S_IRUSR | stat.S_IWUSR
    elif st.st_gid in gids:
        need = stat.S_IRGRP | stat.S_IWGRP
    else:
        need = stat.S_IROTH | stat.S_IWOTH
    return st.st_mode & need == need


def _uverbs(host: Host, devices: list[str]) -> list[Finding]:
    """Each device's /dev/infiniband/uverbsN: present, and open to the daemon's user."""
    by_device = {
        _read(d / "ibdev"): d.name
        for d in sorted((host.sysfs / "class/infiniband_verbs").glob("uverbs*"))
    }
    who, uid, gids = _service_identity()
    out = []
    for device in devices:
        name = by_device.get(device)
        path = host.dev / "infiniband" / name if name else None
        if path is None or not path.exists():
            out.append(
                Finding(
                    Level.FAIL,
                    "rdma",
                    f"{device} verbs",
                    f"no {path or '/dev/infiniband/uverbsN'} for {device}",
                    "modprobe ib_uverbs (rdma-core loads it at boot: apt install rdma-core)",
                )
            )
        elif not can_read_write(path, uid, gids):
            out.append(
                Finding(
                    Level.FAIL,
                    "rdma",
                    f"{device} verbs",
                    f"{path} (mode {stat.S_IMODE(path.stat().st_mode):04o}) is not "
                    f"read-write for {who}",
                    f"rdma-core's udev rules make it 0666; or chmod 0666 {path}",
                )
            )
        else:
            out.append(Finding(Level.OK, "rdma", f"{device} verbs", f"{path} open to {who}"))
    return out


def _node_gids(host: Host, config: ClusterConfig) -> list[Finding]:
    """The node addresses on this host have the RoCE v2 GID the transport will pick."""
    out = []
    for node in local_nodes(config):
        for ip in sorted(node_ips(node)):
            if not is_local(ip):
                continue
            try:
                entry = verbs.find_gid(ip, host.infiniband, config.rdma_gid_index)
            except (verbs.NoDevice, verbs.VerbsError) as exc:
                level = Level.FAIL if node.address.scheme == "rdma" else Level.WARN
                out.append(
                    Finding(
                        level,
                        "rdma",
                        f"node {node.name} ({ip})",
                        str(exc),
                        "bring up RDMA on the netdev with this address (for rxe: rdma link "
                        "add rxe0 type rxe netdev ETH)",
                    )
                )
            else:
                out.append(
                    Finding(
                        Level.OK,
                        "rdma",
                        f"node {node.name} ({ip})",
                        f"RoCE v2 GID [{entry.index}] on {entry.device} port {entry.port}",
                    )
                )
    return out


# -- memlock -------------------------------------------------------------------------


def memlock_of(proc: Path, pid: int | str) -> tuple[int | None, bool] | None:
    """(RLIMIT_MEMLOCK soft limit, None if unlimited; CAP_IPC_LOCK?) of a process, or None."""
    limits = _read(proc / str(pid) / "limits")
    status = _read(proc / str(pid) / "status")
    if not limits or not status:
        return None
    soft: int | None = None
    for line in limits.splitlines():
        if line.startswith("Max locked memory"):
            value = line[len("Max locked memory") :].split()[0]
            soft = None if value == "unlimited" else int(value)
            break
    cap = False
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            cap = bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    return soft, cap


def check_memlock(
    host: Host, config: ClusterConfig, pids: dict[str, int], rdma: bool
) -> list[Finding]:
    nodes = local_nodes(config)
    if not nodes:
        return [
            Finding(Level.OK, "memlock", "nodes", f"no node of {config.path} has an address here")
        ]
    out = []
    for node in nodes:
        pid = pids.get(node.name)
        found = memlock_of(host.proc, pid) if pid else None
        running = found is not None
        if found is not None:
            whose = f"psd {node.name} (pid {pid})"
        else:
            whose = f"psd {node.name} (not running here: this shell's limit)"
            found = memlock_of(host.proc, "self") or (_own_memlock(), False)
        soft, cap = found
        arena = _size(node.arena_size)
        if soft is None or soft >= node.arena_size or cap:
            limit = _size(soft) + (" (lifted by CAP_IPC_LOCK)" if cap and soft is not None else "")
            out.append(Finding(Level.OK, "memlock", whose, f"limit {limit}, arena {arena}"))
            continue
        out.append(
            Finding(
                # A running daemon that cannot lock its arena breaks RDMA now;
                # psd@.service raises the limit of one that is not running yet.
                Level.FAIL if rdma and running else Level.WARN,
                "memlock",
                whose,
                f"RLIMIT_MEMLOCK {_size(soft)} < arena {arena}"
                + ("" if rdma else " (only RDMA registers it; TCP and shm do not)"),
                f"run it as psd@{node.name}.service (LimitMEMLOCK=infinity); by hand: "
                "ulimit -l unlimited, or a memlock line in /etc/security/limits.d/",
            )
        )
    return out


def _own_memlock() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def _size(n: float | None) -> str:
    if n is None:
        return "unlimited"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# -- fuse -----------------------------------------------------------------------------


def check_fuse(host: Host) -> list[Finding]:
    out = [_dev_fuse(host), _fusermount(host)]
    if host.euid != 0:
        allowed = any(
            line.strip() == "user_allow_other" for line in _read(host.fuse_conf).splitlines()
        )
        out.append(
            Finding(Level.OK, "fuse", host.fuse_conf.as_posix(), "user_allow_other is set")
            if allowed
            else Finding(
                Level.WARN,
                "fuse",
                host.fuse_conf.as_posix(),
                "no user_allow_other: `irdma mount --allow-other` is refused for non-root users",
                f"add a line user_allow_other to {host.fuse_conf}",
            )
        )
    out.append(_fuse_kernel(host))
    return out


# The own session's FUSE protocol (7.36) and passthrough (7.40) came with these.
OWN_SESSION_KERNEL = (5, 17)
PASSTHROUGH_KERNEL = (6, 9)


def _fuse_kernel(host: Host) -> Finding:
    """Whether the mount's own session can run on this kernel, and with passthrough;
    where it cannot, whether pyfuse3 (the fallback) is installed."""
    version = _kernel_version(host.kernel)
    subject = f"Linux {host.kernel}"
    if version >= PASSTHROUGH_KERNEL:
        if host.euid == 0:
            return Finding(Level.OK, "fuse", subject, "mount: own session, passthrough")
        return Finding(
            Level.OK,
            "fuse",
            subject,
            "mount: own session; passthrough needs root (CAP_SYS_ADMIN), so this user's "
            "mounts serve file data themselves",
        )
    if version >= OWN_SESSION_KERNEL:
        return Finding(
            Level.OK, "fuse", subject, "mount: own session; no passthrough before Linux 6.9"
        )
    if importlib.util.find_spec("pyfuse3") is not None:
        return Finding(
            Level.WARN,
            "fuse",
            subject,
            "older than Linux 5.17: mount with `irdma mount --session pyfuse3` (installed)",
        )
    return Finding(
        Level.FAIL,
        "fuse",
        subject,
        "older than Linux 5.17: the mount's own session cannot run, and pyfuse3 (the "
        "fallback) is not installed",
        "pip install 'irdma[fuse]' (builds against libfuse3-dev and pkg-config), then "
        "irdma mount --session pyfuse3",
    )


def _kernel_version(release: str) -> tuple[int, int]:
    """(major, minor) of a kernel release string such as "6.18.0-1-amd64"."""
    parts = release.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def _dev_fuse(host: Host) -> Finding:
    path = host.dev / "fuse"
    try:
        st = path.stat()
    except OSError:
        return Finding(
            Level.FAIL,
            "fuse",
            str(path),
            "missing",
            "modprobe fuse (in a container: pass the device, e.g. --device /dev/fuse)",
        )
    if not stat.S_ISCHR(st.st_mode):
        return Finding(
            Level.FAIL, "fuse", str(path), "is not a character device", f"rm {path}; modprobe fuse"
        )
    dev = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    if not os.access(path, os.R_OK | os.W_OK):
        return Finding(
            Level.FAIL,
            "fuse",
            str(path),
            f"device {dev} is not read-write for uid {host.euid}",
            f"chmod 0666 {path} (its usual mode), or mount as root",
        )
    return Finding(Level.OK, "fuse", str(path), f"device {dev}, read-write for uid {host.euid}")


def _fusermount(host: Host) -> Finding:
    if not host.fusermount:
        return Finding(
            Level.WARN if host.euid == 0 else Level.FAIL,
            "fuse",
            "fusermount3",
            "not found"
            + (
                " (root mounts without it, but unmounting by hand uses it)"
                if host.euid == 0
                else ""
            ),
            "apt install fuse3",
        )
    st = os.stat(host.fusermount)
    if host.euid == 0:
        return Finding(Level.OK, "fuse", host.fusermount, "present (root mounts directly)")
    if st.st_uid == 0 and st.st_mode & stat.S_ISUID:
        return Finding(Level.OK, "fuse", host.fusermount, "setuid root")
    return Finding(
        Level.FAIL,
        "fuse",
        host.fusermount,
        "not setuid root: non-root users cannot mount",
        f"chmod u+s {host.fusermount} (owner root), or mount as root",
    )


# -- daemons ---------------------------------------------------------------------------


async def check_daemons(
    config: ClusterConfig, timeout: float
) -> tuple[list[Finding], dict[str, int]]:
    """HELLO to every daemon at once; the findings, and the pids of those that answered."""
    answers: dict[str, dict[str, Any] | Exception] = {}
    via: dict[str, str | None] = {}
    async with AsyncClient(config, timeout=timeout) as client:
        # The daemons in force: a config naming only etcd has them from its epoch.
        config = client.config
        here = {n.name for n in local_nodes(config)}

        async def hello(node: Node) -> None:
            try:
                answers[node.name] = await client.hello(node)
                via[node.name] = client.transport_of(node)
            except IrdmaError as exc:
                answers[node.name] = exc

        # Each request is bounded by the client timeout; this bounds connecting too.
        with trio.move_on_after(2 * timeout + 1):
            async with trio.open_nursery() as nursery:
                for node in config.nodes:
                    nursery.start_soon(hello, node)
    findings, pids = [], {}
    for node in config.nodes:
        subject = f"{node.name} {node.address}"
        answer = answers.get(node.name)
        if isinstance(answer, dict):
            pids[node.name] = int(answer.get("pid", 0)) or 0
            detail = f"answers (pid {answer.get('pid')}, via {via.get(node.name) or '?'})"
            if answer.get("ready", True):
                findings.append(Finding(Level.OK, "daemons", subject, detail))
            else:
                findings.append(
                    Finding(
                        Level.WARN,
                        "daemons",
                        subject,
                        detail + " but is still catching up from its replicas",
                        "wait; if it stays so, check that a majority of the daemons is up",
                    )
                )
            continue
        reason = str(answer) if answer is not None else f"no answer within {2 * timeout + 1:g} s"
        unit = f"psd@{node.name}"
        fix = (
            f"systemctl start {unit} (journalctl -u {unit} says why it stopped)"
            if node.name in here
            else f"on its host: systemctl status {unit}; and let TCP port "
            f"{node.address.port} through any firewall between here and there"
        )
        findings.append(Finding(Level.FAIL, "daemons", subject, reason, fix))
    return findings, {k: v for k, v in pids.items() if v}


# -- running ---------------------------------------------------------------------------


async def run_checks(
    host: Host,
    config: ClusterConfig | None,
    topics: Iterable[str] = TOPICS,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[Finding]:
    """Every check of ``topics``, in the order of TOPICS (daemons and memlock need a config)."""
    topics = set(topics)
    findings: list[Finding] = []
    daemon_findings: list[Finding] = []
    pids: dict[str, int] = {}
    if config is not None and topics & {"daemons", "memlock"}:
        try:
            daemon_findings, pids = await check_daemons(config, timeout)
        except ConfigError as exc:  # a secret file that cannot be used
            daemon_findings = [
                Finding(Level.FAIL, "daemons", "client", str(exc), "fix the config's secret_file")
            ]
    if "rdma" in topics:
        findings += check_rdma(host, config)
    if "memlock" in topics and config is not None:
        rdma = bool(read_ports(host)) or any(n.address.scheme == "rdma" for n in config.nodes)
        findings += check_memlock(host, config, pids, rdma)
    if "fuse" in topics:
        findings += check_fuse(host)
    if "daemons" in topics:
        findings += daemon_findings
    return findings


def load(path: str | None) -> tuple[ClusterConfig | None, Finding | None]:
    """The config, or None and a finding saying why (FAIL if it exists but is wrong)."""
    where = find_config_path(path)
    if not path and not where.exists():
        return None, Finding(
            Level.WARN,
            "config",
            str(where),
            "no cluster config: memlock and daemon checks skipped",
            "pass --config FILE or set IRDMA_CONFIG",
        )
    try:
        return load_config(path), None
    except ConfigError as exc:
        return None, Finding(Level.FAIL, "config", str(where), str(exc), "correct the config")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--skip",
        action="append",
        choices=TOPICS,
        default=[],
        help="leave out a group of checks (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per check")


def run(args: argparse.Namespace) -> int:
    """The ``irdma doctor`` command: print the findings; 1 if any FAILs, else 0."""
    config, problem = load(args.config)
    topics = [t for t in TOPICS if t not in args.skip]
    timeout = args.timeout or DEFAULT_TIMEOUT
    findings = ([problem] if problem else []) + trio.run(
        run_checks, Host(), config, topics, timeout
    )
    if args.json:
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        for f in findings:
            print(f.line())
        counts = {lvl: sum(f.level == lvl for f in findings) for lvl in Level}
        print(
            f"irdma doctor: {len(findings)} checks, {counts[Level.FAIL]} FAIL, "
            f"{counts[Level.WARN]} WARN",
            file=sys.stderr,
        )
    return 1 if any(f.level == Level.FAIL for f in findings) else 0
