"""RDMA verbs resources for the rdma transport: device lookup, memory, queue pairs.

Built the way rdma-core's own pyverbs tests build them: an ``Endpoint``
(device context, protection domain, port and GID), then completion queues,
memory regions and RC queue pairs, each from one method; connecting a queue
pair is an explicit exchange of ``QpInfo`` (QP number, PSN, GID) followed by
INIT -> RTR -> RTS. Verbs failures become ``VerbsError`` with the step that
failed and the original error kept as its cause.

Devices and GIDs are found through sysfs rather than pyverbs, so a host's
RDMA setup can be inspected (and the choice explained) without opening it.
Only RoCE v2 GIDs that map an IPv4 address are used: they are routable, and
the one for the address a daemon listens on names its device and port.
"""

from __future__ import annotations

import contextlib
import ipaddress
import mmap
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .verbs_compat import VerbsUnavailable, load

SYSFS = Path("/sys/class/infiniband")
ROCE_V2 = "RoCE v2"
# ibv_mtu enum values and their sizes in bytes.
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
MTU_ENUM = {size: code for code, size in MTU_BYTES.items()}
PORT_ACTIVE = 4
WC_REMOTE_ACCESS_ERROR = 10
# Outstanding RDMA READs per queue pair, as initiator and as target.
RD_ATOMIC_MAX = 16
PSN_MASK = 0xFFFFFF
# Completion status names (ibv_wc_status), for error messages.
WC_STATUS = {
    0: "success",
    1: "local length error",
    2: "local QP operation error",
    4: "local protection error",
    5: "work request flushed",
    9: "remote invalid request",
    10: "remote access error",
    11: "remote operation error",
    12: "transport retry counter exceeded",
    13: "RNR retry counter exceeded",
}


class VerbsError(Exception):
    """A verbs call failed; the message names the step, the cause is the pyverbs error."""


class NoDevice(VerbsUnavailable):
    """No RDMA device here serves the address asked for."""


@dataclass(frozen=True, slots=True)
class GidEntry:
    """One entry of a port's GID table (from sysfs)."""

    device: str
    port: int
    index: int
    gid: str  # eight groups of four hex digits, as pyverbs prints it
    kind: str  # "RoCE v2", "IB/RoCE v1"
    netdev: str


@dataclass(frozen=True, slots=True)
class QpInfo:
    """What one side of a queue pair tells the other to connect it."""

    qpn: int
    psn: int
    gid: str

    def to_json(self) -> dict[str, Any]:
        return {"qpn": self.qpn, "psn": self.psn, "gid": self.gid}

    @classmethod
    def from_json(cls, obj: Any) -> QpInfo:
        try:
            qpn, psn, gid = int(obj["qpn"]), int(obj["psn"]), str(obj["gid"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"queue pair info needs qpn, psn and gid: {exc}") from None
        if not 0 < qpn < 1 << 24 or not 0 <= psn <= PSN_MASK:
            raise ValueError(f"queue pair number {qpn} or PSN {psn} out of range")
        ipv4_of(gid)  # a RoCE v2 IPv4-mapped GID, or ValueError
        return cls(qpn, psn, gid)


def roce_gid(ip: str) -> str:
    """The RoCE v2 GID of an IPv4 address (IPv4-mapped IPv6, fully written out)."""
    return ipaddress.IPv6Address(f"::ffff:{ipaddress.IPv4Address(ip)}").exploded


def ipv4_of(gid: str) -> str:
    """The IPv4 address inside an IPv4-mapped GID; ValueError for any other GID."""
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        mapped = None
    if mapped is None:
        raise ValueError(f"GID {gid!r} is not an IPv4-mapped RoCE v2 GID")
    return str(mapped)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def gid_table(sysfs: Path = SYSFS) -> list[GidEntry]:
    """Every non-empty GID of every port of every RDMA device on this host."""
    entries = []
    for dev in sorted(sysfs.glob("*")):
        for port_dir in sorted((dev / "ports").glob("*")):
            for gid_file in sorted((port_dir / "gids").glob("*"), key=lambda p: int(p.name)):
                gid = _read(gid_file)
                if not gid or int(gid.replace(":", ""), 16) == 0:
                    continue
                i = gid_file.name
                entries.append(
                    GidEntry(
                        device=dev.name,
                        port=int(port_dir.name),
                        index=int(i),
                        gid=gid,
                        kind=_read(port_dir / "gid_attrs" / "types" / i),
                        netdev=_read(port_dir / "gid_attrs" / "ndevs" / i),
                    )
                )
    return entries


def find_gid(ip: str, sysfs: Path = SYSFS, index: int | None = None) -> GidEntry:
    """The RoCE v2 GID entry for ``ip`` (or the configured ``index`` on that device).

    Raises NoDevice when no device has a GID for ``ip``, and VerbsError when
    ``index`` is given but is not a RoCE v2 GID of that address.
    """
    try:
        want = roce_gid(ip)
    except ValueError:
        raise NoDevice(f"{ip} is not an IPv4 address (RoCE v2 needs one)") from None
    table = gid_table(sysfs)
    if not table:
        raise NoDevice(f"no RDMA device on this host ({sysfs} is empty or absent)")
    matches = [g for g in table if g.gid == want and g.kind == ROCE_V2]
    if not matches:
        raise NoDevice(
            f"no RDMA device has a RoCE v2 GID for {ip} (GIDs here: "
            + ", ".join(f"{g.device}:{g.port}[{g.index}] {g.gid} {g.kind}" for g in table)
            + ")"
        )
    if index is None:
        return matches[0]
    chosen = [g for g in table if g.device == matches[0].device and g.index == index]
    if not chosen or chosen[0].gid != want or chosen[0].kind != ROCE_V2:
        have = f"{chosen[0].gid} ({chosen[0].kind})" if chosen else "empty"
        raise VerbsError(
            f"rdma_gid_index {index} on {matches[0].device} is {have}, not the RoCE v2 "
            f"GID of {ip}; use index {matches[0].index} or leave rdma_gid_index unset"
        )
    return chosen[0]


@contextlib.contextmanager
def verbs_errors(what: str) -> Iterator[None]:
    """Turn a pyverbs failure into VerbsError naming ``what``, keeping the cause."""
    try:
        yield
    except VerbsError:
        raise
    except Exception as exc:
        # PyverbsRDMAError, PyverbsError and PyverbsUserError all derive from
        # Exception; anything else raised here is a verbs failure too.
        raise VerbsError(f"{what}: {exc}") from exc


class PinnedBuffer:
    """Page-aligned memory, registered once, with a numpy view of it."""

    def __init__(self, endpoint: Endpoint, size: int, access: int) -> None:
        self._map = mmap.mmap(-1, size)
        self.view = np.frombuffer(self._map, dtype=np.uint8)
        self.addr = self.view.ctypes.data
        try:
            self.mr = endpoint.register(self.addr, size, access, f"{size}-byte buffer")
        except BaseException:
            self.view = None  # type: ignore[assignment]
            self._map.close()
            raise

    @property
    def lkey(self) -> int:
        return int(self.mr.lkey)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.mr.close()
        self.view = None  # type: ignore[assignment]
        with contextlib.suppress(BufferError):
            self._map.close()


class Endpoint:
    """An open RDMA device port: context, protection domain, port attributes and GID."""

    def __init__(self, gid: GidEntry, *, mtu: int | None = None) -> None:
        self.e = load()
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.gid = gid
        self.name = f"{gid.device}:{gid.port}"
        with verbs_errors(f"opening RDMA device {gid.device}"):
            self.ctx = Context(name=gid.device)
        try:
            with verbs_errors(f"querying {self.name}"):
                port = self.ctx.query_port(gid.port)
                dev = self.ctx.query_device()
                self.pd = PD(self.ctx)
            if int(port.state) != PORT_ACTIVE:
                raise VerbsError(
                    f"port {gid.port} of {gid.device} is not active (state {port.state}): "
                    f"check its netdev {gid.netdev or '?'} is up"
                )
            self.active_mtu = MTU_BYTES.get(int(port.active_mtu), 1024)
            if mtu is not None and mtu > self.active_mtu:
                raise VerbsError(
                    f"rdma_mtu {mtu} is larger than the active MTU {self.active_mtu} of "
                    f"{self.name}: raise the MTU of {gid.netdev or 'its netdev'} "
                    f"(9000 gives 4096) or lower rdma_mtu"
                )
            self.mtu = mtu or self.active_mtu
            self.max_msg = int(port.max_msg_sz)
            self.rd_atomic = max(1, min(RD_ATOMIC_MAX, int(dev.max_qp_init_rd_atom)))
            self.dest_rd_atomic = max(1, min(RD_ATOMIC_MAX, int(dev.max_qp_rd_atom)))
        except BaseException:
            self.ctx.close()
            raise

    def register(self, addr: int, size: int, access: int, what: str) -> Any:
        """A memory region over ``size`` bytes at ``addr`` (the caller keeps the memory alive)."""
        from pyverbs.mr import MR

        try:
            with verbs_errors(f"registering {what} with {self.name}"):
                return MR(self.pd, size, access, address=addr)
        except VerbsError as exc:
            problem = memlock_problem(size)
            if problem is None and "Errno 12" not in str(exc):
                raise
            raise VerbsError(f"{exc} ({problem or 'out of locked memory'})") from exc.__cause__

    def buffer(self, size: int, access: int) -> PinnedBuffer:
        return PinnedBuffer(self, size, access)

    def completion_queue(self, depth: int, channel: Any = None) -> Any:
        from pyverbs.cq import CQ

        with verbs_errors(f"creating a completion queue on {self.name}"):
            return CQ(self.ctx, depth, None, channel, 0)

    def completion_channel(self) -> Any:
        from pyverbs.cq import CompChannel

        with verbs_errors(f"creating a completion channel on {self.name}"):
            return CompChannel(self.ctx)

    def queue_pair(self, cq: Any, send_depth: int, recv_depth: int = 1) -> Any:
        from pyverbs.qp import QP, QPCap, QPInitAttr

        cap = QPCap(max_send_wr=send_depth, max_recv_wr=recv_depth, max_send_sge=1, max_recv_sge=1)
        attr = QPInitAttr(qp_type=self.e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0)
        with verbs_errors(f"creating a queue pair on {self.name}"):
            return QP(self.pd, attr)

    def local_info(self, qp: Any) -> QpInfo:
        return QpInfo(int(qp.qp_num), secrets.randbits(24), self.gid.gid)

    def connect(self, qp: Any, local: QpInfo, remote: QpInfo, access: int, mtu: int) -> None:
        """Take ``qp`` through INIT, RTR and RTS towards ``remote``, as perftest does.

        ``mtu`` is the path MTU both sides agreed on (at most either's active MTU).
        """
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        attr = QPAttr()
        attr.qp_access_flags = access
        attr.port_num = self.gid.port
        attr.pkey_index = 0
        with verbs_errors(f"queue pair {local.qpn} to INIT"):
            qp.to_init(attr)
        route = GlobalRoute(dgid=GID(remote.gid), sgid_index=self.gid.index, hop_limit=64)
        attr.ah_attr = AHAttr(port_num=self.gid.port, is_global=1, gr=route, dlid=0)
        attr.path_mtu = MTU_ENUM[mtu]
        attr.dest_qp_num = remote.qpn
        attr.rq_psn = remote.psn
        attr.max_dest_rd_atomic = self.dest_rd_atomic
        attr.min_rnr_timer = 12
        with verbs_errors(
            f"queue pair {local.qpn} to RTR (peer QP {remote.qpn} at GID {remote.gid}, MTU {mtu})"
        ):
            qp.to_rtr(attr)
        attr.timeout = 14  # 4.096 us * 2**14 = 67 ms per try
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.sq_psn = local.psn
        attr.max_rd_atomic = self.rd_atomic
        with verbs_errors(f"queue pair {local.qpn} to RTS"):
            qp.to_rts(attr)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.pd.close()
        with contextlib.suppress(Exception):
            self.ctx.close()


def memlock_problem(nbytes: int) -> str | None:
    """Why registering ``nbytes`` would fail here (RLIMIT_MEMLOCK), or None if it can work."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= nbytes:
        return None
    if _has_cap_ipc_lock():
        return None  # the limit does not apply
    return (
        f"RLIMIT_MEMLOCK is {soft} bytes but {nbytes} bytes must be registered: "
        "set LimitMEMLOCK=infinity in the systemd unit, or run `ulimit -l unlimited` "
        "(or raise memlock in /etc/security/limits.conf) before starting psd"
    )


def _has_cap_ipc_lock() -> bool:
    CAP_IPC_LOCK = 14
    for line in _read(Path("/proc/self/status")).splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    return False
