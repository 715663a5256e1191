"""An emulated network of hosts on one machine, for multi-host tests.

Each host is a network namespace with one interface, ``eth0``, cabled by a
veth pair to a bridge that lives in a namespace of its own (the "switch"), so
building, shaping, partitioning and deleting the network never touches the
root namespace's interfaces, routes or firewall. Addresses come from
198.18.0.0/15 (RFC 2544 benchmarking, never routed), so they cannot clash with
a real network.

Shaping uses ``tc netem`` where the kernel has it. Some kernels (minimal VM
kernels without modules) have no netem; there delay and loss are done by a
small relay process per shaped host that carries the host's frames between
two tap devices (``tc mirred`` steers the link's traffic through it), and a
rate alone by ``tbf``. Both give the same behaviour as netem on both ends of
the host's link, the relay at a lower packet rate.

Run as a script (``python netns.py relay ...``) this file is that relay; it
uses only the standard library for that reason.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import fnmatch
import functools
import heapq
import ipaddress
import itertools
import json
import os
import random
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CommandError",
    "NetnsUnavailable",
    "Network",
    "netem_available",
    "netns_problem",
    "remove_stale",
    "shaper_problem",
]

PREFIX = "irt"  # every default namespace name starts with this, then the creator's pid
ALLOWED = ipaddress.ip_network("198.18.0.0/15")
SWITCH_BRIDGE = "br0"
HOST_IF = "eth0"
HOST_TAP = "shp0"  # the host end of the shaping relay, in the host namespace
RELAY_TXQUEUELEN = 10000  # frames the kernel queues for the relay before dropping
KILL_WAIT = 10.0

_counter = itertools.count()
_open_networks: weakref.WeakSet[Network] = weakref.WeakSet()


class NetnsUnavailable(Exception):
    """Namespaces (or the requested shaping) cannot be built here; the message says why."""


class CommandError(subprocess.CalledProcessError):
    """A failed command whose message includes its stderr (CalledProcessError's omits it)."""

    def __str__(self) -> str:
        err = self.stderr
        if isinstance(err, bytes):
            err = err.decode(errors="replace")
        tail = f": {err.strip()}" if err and err.strip() else ""
        return f"{super().__str__()}{tail}"


def _run(argv: list[str], timeout: float = 30) -> str:
    """Run a command in the root namespace's process context (``ip``/``tc`` on named namespaces)."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise NetnsUnavailable(f"{argv[0]} not found on PATH") from e
    if p.returncode != 0:
        raise CommandError(p.returncode, argv, p.stdout, p.stderr)
    return p.stdout


def _try(argv: list[str]) -> bool:
    """Run a command whose failure is expected and harmless (deleting what may not exist)."""
    try:
        _run(argv)
    except (CommandError, subprocess.TimeoutExpired):
        return False
    return True


@dataclass(frozen=True)
class _Probe:
    problem: str | None
    netem: bool = False
    tun: bool = False


@functools.cache
def _probe() -> _Probe:
    """Build a throwaway namespace with a bridge and a veth pair once; try netem on it."""
    if os.geteuid() != 0:
        return _Probe("network namespaces need root (euid is not 0)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return _Probe(f"`{tool}` not on PATH (install iproute2)")
    ns = f"{PREFIX}{os.getpid()}probe{next(_counter)}"
    try:
        _run(["ip", "netns", "add", ns])
    except (CommandError, subprocess.TimeoutExpired) as e:
        return _Probe(f"cannot create a network namespace: {e}")
    try:
        _run(["ip", "-n", ns, "link", "add", "name", "br0", "type", "bridge"])
        _run(["ip", "-n", ns, "link", "add", "name", "pa", "type", "veth", "peer", "name", "pb"])
        _run(["ip", "-n", ns, "link", "set", "dev", "lo", "up"])
        _run(["tc", "-n", ns, "qdisc", "add", "dev", "pa", "root", "tbf", "rate", "1gbit",
              "burst", "64k", "latency", "100ms"])  # fmt: skip
    except (CommandError, subprocess.TimeoutExpired) as e:
        return _Probe(f"cannot build a bridge, veth pair or tbf qdisc in a namespace: {e}")
    else:
        netem = _try(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])
        tun = _try(["ip", "-n", ns, "tuntap", "add", "dev", "tp", "mode", "tap"])
        return _Probe(None, netem=netem, tun=tun)
    finally:
        _try(["ip", "netns", "del", ns])


def netns_problem() -> str | None:
    """Why namespaces cannot be built here, or None if they can (checked once, then cached)."""
    return _probe().problem


def netem_available() -> bool:
    """Whether the kernel has ``tc netem`` (else shaping falls back to the userspace relay)."""
    return _probe().netem


def shaper_problem(shaper: str) -> str | None:
    """Why Network(shaper=...) cannot delay or drop packets here, or None if it can."""
    if problem := netns_problem():
        return problem
    if shaper in ("netem", "auto") and netem_available():
        return None
    if shaper == "netem":
        return "the kernel has no tc netem (sch_netem)"
    if not _probe().tun:
        return "no tc netem and no usable /dev/net/tun for the shaping relay"
    return None


def _ns_pids(ns: str) -> list[int]:
    try:
        out = _run(["ip", "netns", "pids", ns])
    except (CommandError, subprocess.TimeoutExpired):
        return []
    return [int(x) for x in out.split() if x.isdigit()]


def _kill_ns_processes(ns: str) -> None:
    """SIGKILL whatever still runs in a namespace (escaped daemons), so it can really go away."""
    me = os.getpid()
    deadline = time.monotonic() + KILL_WAIT
    while (pids := [p for p in _ns_pids(ns) if p != me]) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _list_namespaces() -> list[str]:
    try:
        out = _run(["ip", "netns", "list"])
    except (CommandError, subprocess.TimeoutExpired, NetnsUnavailable):
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(prefix_glob: str = f"{PREFIX}*") -> None:
    """Delete namespaces left by crashed runs: names matching the glob whose creator pid is gone.

    The pid is the first run of digits in the name (default prefixes are ``irt<pid>n<k>``);
    names without one are left alone, as are those of live processes (other test runs).
    """
    for ns in _list_namespaces():
        if not fnmatch.fnmatchcase(ns, prefix_glob):
            continue
        m = re.match(r"\D*(\d+)", ns)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        _kill_ns_processes(ns)
        _try(["ip", "netns", "del", ns])


_RATE_UNITS = {
    "": 1,
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "tbps": 8e12,
}


def parse_rate(rate: str) -> int:
    """Bits per second from a tc rate ("1gbit", "100mbit", "10mbps" = bytes/s, "800000")."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", rate)
    if m is None or m.group(2).lower() not in _RATE_UNITS:
        raise ValueError(f"bad rate {rate!r}: expected e.g. '1gbit', '100mbit', '10mbps'")
    bits = int(float(m.group(1)) * _RATE_UNITS[m.group(2).lower()])
    if bits <= 0:
        raise ValueError(f"rate must be positive: {rate!r}")
    return bits


@dataclass(frozen=True)
class Shaping:
    """What a host's link does to traffic, in each direction."""

    delay_ms: float = 0
    loss_pct: float = 0
    rate_bits: int | None = None

    @property
    def active(self) -> bool:
        return bool(self.delay_ms or self.loss_pct or self.rate_bits)


@dataclass
class _Host:
    name: str
    index: int
    ns: str
    address: str
    port: str  # the switch-side veth end, in the switch namespace
    tap: str  # the switch-side relay tap, in the switch namespace
    mac: str  # eth0's, fixed (from the address) so the relay's host tap can share it
    shaping: Shaping = field(default_factory=Shaping)
    shaped_by: str | None = None  # "netem", "tbf" or "relay" while shaped
    relay: subprocess.Popen | None = None


def _ifname(name: str) -> str:
    if not 0 < len(name) <= 15 or "/" in name or name.strip() != name or " " in name:
        raise ValueError(f"bad interface name {name!r} (1..15 chars, no '/' or spaces)")
    return name


class Network:
    """Hosts as network namespaces joined by one bridge that lives in its own 'switch' namespace
    (so the root namespace is never touched).

    Host ``i`` is namespace ``{prefix}-{host}`` with ``lo`` and ``eth0`` at the ``i+1``-th
    address of ``subnet``; the switch is ``{prefix}-sw``. IPv6 is off on the links (nothing
    uses it, and it would add router solicitations and DAD to the traffic); ``::1`` stays.
    """

    def __init__(
        self,
        hosts: list[str],
        *,
        prefix: str | None = None,
        subnet: str = "198.18.0.0/24",
        shaper: str = "auto",
    ) -> None:
        """Build the network, or clean up what was built and raise.

        shaper: "netem", "relay" (userspace, for kernels without netem) or "auto" (netem
        when the kernel has it).
        """
        self.closed = False
        self._procs: list[subprocess.Popen] = []
        self._created: list[str] = []  # namespaces this object made, deleted by close()
        self._hosts: dict[str, _Host] = {}
        if shaper not in ("auto", "netem", "relay"):
            raise ValueError(f"shaper must be 'auto', 'netem' or 'relay', not {shaper!r}")
        self.shaper = shaper
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError(f"host names must be unique and at least one: {hosts!r}")
        for h in hosts:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", h) or h == "sw":
                raise ValueError(f"bad host name {h!r} (letters, digits, _ . -; not 'sw')")
        net = ipaddress.ip_network(subnet)
        if not isinstance(net, ipaddress.IPv4Network) or not net.subnet_of(ALLOWED):
            raise ValueError(f"subnet {subnet} is outside {ALLOWED} (the only range tests use)")
        if net.num_addresses - 2 < len(hosts):
            raise ValueError(f"subnet {subnet} is too small for {len(hosts)} hosts")
        if problem := netns_problem():
            raise NetnsUnavailable(problem)
        self.prefix = prefix or f"{PREFIX}{os.getpid()}n{next(_counter)}"
        self.subnet = net
        self.switch_ns = f"{self.prefix}-sw"
        for i, h in enumerate(hosts):
            self._hosts[h] = _Host(
                name=h,
                index=i,
                ns=f"{self.prefix}-{h}",
                address=str(net[i + 1]),
                port=_ifname(f"v{i}-{h}"[:15]),
                tap=_ifname(f"t{i}-{h}"[:15]),
                mac="02:00:" + ":".join(f"{b:02x}" for b in net[i + 1].packed),
            )
        _open_networks.add(self)
        try:
            self._build()
        except BaseException as e:
            self.close()
            if isinstance(e, CommandError | subprocess.TimeoutExpired):
                raise NetnsUnavailable(f"building the network failed: {e}") from e
            raise

    # -- construction ---------------------------------------------------------------

    def _add_ns(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._created.append(ns)
        # IPv6 off for interfaces created from now on (lo already exists and keeps ::1).
        self._sysctl(ns, "net.ipv6.conf.default.disable_ipv6=1")

    def _sysctl(self, ns: str, *settings: str) -> None:
        """Set sysctls inside ns, skipping absent ones (IPv6 may be compiled out)."""
        script = "".join(
            f"p=/proc/sys/{k.replace('.', '/')}; if [ -e $p ]; then echo {v} > $p; fi\n"
            for k, v in (s.split("=", 1) for s in settings)
        )
        _run(["ip", "netns", "exec", ns, "sh", "-ec", script])

    def _build(self) -> None:
        sw = self.switch_ns
        self._add_ns(sw)
        _run(["ip", "-n", sw, "link", "add", "name", SWITCH_BRIDGE, "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "dev", SWITCH_BRIDGE, "up"])
        for h in self._hosts.values():
            self._add_ns(h.ns)
            # Created from inside the switch namespace with the peer placed straight into
            # the host's, so no interface ever exists in the root namespace.
            _run(["ip", "-n", sw, "link", "add", "name", h.port, "type", "veth",
                  "peer", "name", HOST_IF, "netns", h.ns])  # fmt: skip
            _run(["ip", "-n", sw, "link", "set", "dev", h.port, "master", SWITCH_BRIDGE])
            _run(["ip", "-n", sw, "link", "set", "dev", h.port, "up"])
            _run(["ip", "-n", h.ns, "link", "set", "dev", "lo", "up"])
            _run(["ip", "-n", h.ns, "addr", "add",
                  f"{h.address}/{self.subnet.prefixlen}", "dev", HOST_IF])  # fmt: skip
            _run(["ip", "-n", h.ns, "link", "set", "dev", HOST_IF, "address", h.mac, "up"])

    # -- context manager ------------------------------------------------------------

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries ----------------------------------------------------------------------

    @property
    def hosts(self) -> list[str]:
        return list(self._hosts)

    def _host(self, host: str) -> _Host:
        if self.closed:
            raise RuntimeError("network is closed")
        try:
            return self._hosts[host]
        except KeyError:
            raise KeyError(f"no host {host!r} (hosts: {', '.join(self._hosts)})") from None

    def address(self, host: str) -> str:
        """The host's IPv4 address on eth0, e.g. "198.18.0.3"."""
        return self._host(host).address

    def namespace(self, host: str) -> str:
        """The host's namespace name (for ``ip -n``, ``ip netns exec``, ``nsenter``)."""
        return self._host(host).ns

    # -- processes --------------------------------------------------------------------

    def run(
        self,
        host: str,
        argv: list[str],
        *,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.Popen:
        """Start argv inside the host, in its own process group (so close() can kill all of it).

        env is added to os.environ (not a replacement: `ip` and the program need PATH).
        Output is appended to ``log`` if given, else inherited; popen_kwargs override.
        """
        ns = self._host(host).ns
        kwargs: dict[str, Any] = {"stdin": subprocess.DEVNULL, "start_new_session": True}
        if env is not None:
            kwargs["env"] = {**os.environ, **env}
        log_file = None
        if log is not None:
            log_file = open(log, "ab")  # noqa: SIM115 (closed below, the child keeps its copy)
            kwargs["stdout"] = log_file
            kwargs["stderr"] = subprocess.STDOUT
        kwargs.update(popen_kwargs)
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], **kwargs)
        finally:
            if log_file is not None:
                log_file.close()
        self._procs.append(proc)
        return proc

    def check_output(self, host: str, argv: list[str], timeout: float = 60) -> str:
        """Run argv inside the host and return its stdout; CommandError (stderr included) if
        it fails."""
        return _run(["ip", "netns", "exec", self._host(host).ns, *argv], timeout=timeout)

    # -- faults -------------------------------------------------------------------------

    def partition(self, host: str) -> None:
        """Cut the host off from every other host: its port leaves the switch's bridge.

        Like a partition inside the network, not a pulled cable: the host's eth0 keeps its
        carrier, so its processes see silence (timeouts), not link-down errors. (Not a
        "disabled" bridge port state: `ip link ... bridge_slave state 0` does not stick here,
        and the bridge re-enables such a port whenever its carrier comes back.)
        """
        _run(["ip", "-n", self.switch_ns, "link", "set", "dev", self._host(host).port,
              "nomaster"])  # fmt: skip

    def heal(self, host: str) -> None:
        """Undo partition(): the port rejoins the bridge (forwarding at once, STP is off)."""
        _run(["ip", "-n", self.switch_ns, "link", "set", "dev", self._host(host).port,
              "master", SWITCH_BRIDGE])  # fmt: skip

    def cut_link(self, a: str, b: str) -> None:
        """Break the path between two hosts only: each keeps reaching every other host.

        An asymmetric fault (Jepsen's "bridge"): a blackhole route for the other's
        address in each host's namespace. Packets either sends to the other are
        dropped on the way out (new connections fail, established ones go silent);
        the switch, the other hosts and ``partition``/``shape`` are not touched.
        """
        ha, hb = self._host(a), self._host(b)
        if ha is hb:
            raise ValueError(f"cannot cut the link from {a!r} to itself")
        for src, dst in ((ha, hb), (hb, ha)):
            _run(["ip", "-n", src.ns, "route", "replace", "blackhole", f"{dst.address}/32"])

    def restore_link(self, a: str, b: str) -> None:
        """Undo cut_link() (a link that was not cut is left as it is)."""
        ha, hb = self._host(a), self._host(b)
        for src, dst in ((ha, hb), (hb, ha)):
            _try(["ip", "-n", src.ns, "route", "del", "blackhole", f"{dst.address}/32"])

    def shape(
        self, host: str, *, delay_ms: float = 0, loss_pct: float = 0, rate: str | None = None
    ) -> None:
        """Delay, drop and/or rate-limit the host's traffic in both directions (on both ends
        of its link), replacing any earlier shaping; all defaults remove it.

        A round trip between a host shaped with delay_ms=d and an unshaped one takes 2*d more.
        """
        h = self._host(host)
        if delay_ms < 0 or not 0 <= loss_pct <= 100:
            raise ValueError("delay_ms must be >= 0 and loss_pct in [0, 100]")
        want = Shaping(delay_ms, loss_pct, parse_rate(rate) if rate else None)
        how = self._how(want)
        if how == "relay" and h.shaped_by == "relay":
            self._relay_set(h, want)  # same relay, new parameters, no gap in the link
        else:
            self._unshape(h)
            if how == "netem":
                args = ["netem", "limit", "100000"]
                if want.delay_ms:
                    args += ["delay", f"{want.delay_ms}ms"]
                if want.loss_pct:
                    args += ["loss", f"{want.loss_pct}%"]
                if want.rate_bits:
                    args += ["rate", f"{want.rate_bits}bit"]
                self._root_qdisc(h, args)
            elif how == "tbf":
                assert want.rate_bits
                burst = max(want.rate_bits // 8 // 100, 16 << 10)  # 10 ms worth
                self._root_qdisc(h, ["tbf", "rate", f"{want.rate_bits}bit",
                                     "burst", str(burst), "latency", "200ms"])  # fmt: skip
            elif how == "relay":
                self._start_relay(h, want)
            h.shaped_by = how
        h.shaping = want

    def _how(self, want: Shaping) -> str | None:
        if not want.active:
            return None
        if self.shaper == "netem" or (self.shaper == "auto" and netem_available()):
            if problem := shaper_problem("netem"):
                raise NetnsUnavailable(problem)
            return "netem"
        if not (want.delay_ms or want.loss_pct):
            return "tbf"
        if problem := shaper_problem("relay"):
            raise NetnsUnavailable(problem)
        return "relay"

    def _root_qdisc(self, h: _Host, args: list[str]) -> None:
        _run(["tc", "-n", h.ns, "qdisc", "replace", "dev", HOST_IF, "root", *args])
        _run(["tc", "-n", self.switch_ns, "qdisc", "replace", "dev", h.port, "root", *args])

    def _unshape(self, h: _Host) -> None:
        if h.shaped_by in ("netem", "tbf"):
            _try(["tc", "-n", h.ns, "qdisc", "del", "dev", HOST_IF, "root"])
            _try(["tc", "-n", self.switch_ns, "qdisc", "del", "dev", h.port, "root"])
        elif h.shaped_by == "relay":
            # Steer traffic back onto the veth first, then stop the relay (its taps go with it).
            _try(["tc", "-n", h.ns, "qdisc", "del", "dev", HOST_IF, "clsact"])
            _try(["tc", "-n", self.switch_ns, "qdisc", "del", "dev", h.port, "clsact"])
            if h.relay is not None:
                self._kill(h.relay)
                self._procs.remove(h.relay)  # reaped: its pid must not be signalled again
                h.relay = None
        h.shaped_by = None
        h.shaping = Shaping()

    def _start_relay(self, h: _Host, want: Shaping) -> None:
        sw = self.switch_ns
        argv = ["ip", "netns", "exec", sw, sys.executable, "-I", "-u", os.path.abspath(__file__),
                "relay", f"/run/netns/{h.ns}", HOST_TAP, h.tap]  # fmt: skip
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._procs.append(proc)
        h.relay = proc
        h.shaped_by = "relay"  # so a failure below is undone by _unshape
        try:
            try:
                _expect(proc, "ready")
            except RuntimeError as e:
                raise NetnsUnavailable(f"the shaping relay did not start: {e}") from e
            self._relay_set(h, want)
            # The host tap gets eth0's MAC: frames the relay writes there are classified
            # against the tap's address, and the IP layer drops ones "for another host".
            _run(["ip", "-n", h.ns, "link", "set", "dev", HOST_TAP, "address", h.mac])
            for ns, tap in ((h.ns, HOST_TAP), (sw, h.tap)):
                _run(["ip", "-n", ns, "link", "set", "dev", tap,
                      "txqueuelen", str(RELAY_TXQUEUELEN), "up"])  # fmt: skip
            # Frames leaving eth0 go to the relay's host tap; what the relay writes to its
            # switch tap enters the switch as if received on the host's port; and back.
            # Both ways out of the relay first, so no frame is lost while this is set up.
            links = ((h.ns, HOST_IF, HOST_TAP), (sw, h.port, h.tap))
            for ns, link, tap in links:
                for dev in (link, tap):
                    _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "clsact"])
                _run(["tc", "-n", ns, "filter", "add", "dev", tap, "ingress", "protocol", "all",
                      "prio", "1", "u32", "match", "u32", "0", "0",
                      "action", "mirred", "ingress", "redirect", "dev", link])  # fmt: skip
            for ns, link, tap in links:
                _run(["tc", "-n", ns, "filter", "add", "dev", link, "egress", "protocol", "all",
                      "prio", "1", "u32", "match", "u32", "0", "0",
                      "action", "mirred", "egress", "redirect", "dev", tap])  # fmt: skip
        except BaseException:
            self._unshape(h)
            raise

    def _relay_set(self, h: _Host, want: Shaping) -> None:
        assert h.relay is not None and h.relay.stdin is not None
        msg = {"delay": want.delay_ms / 1e3, "loss": want.loss_pct / 100, "rate": want.rate_bits}
        try:
            h.relay.stdin.write(json.dumps(msg).encode() + b"\n")
            h.relay.stdin.flush()
        except OSError as e:
            raise RuntimeError(f"shaping relay for {h.name} is gone: {e}") from e
        _expect(h.relay, "ok")

    # -- teardown ---------------------------------------------------------------------

    def _kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL the process group (after SIGCONT, in case a test stopped it) and reap it."""
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(KILL_WAIT)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def close(self) -> None:
        """Kill every process started here and in the namespaces, delete the namespaces.

        Safe to call twice and after a failed constructor.
        """
        self.closed = True
        procs, self._procs = self._procs, []
        for proc in procs:
            self._kill(proc)
        created, self._created = self._created, []
        for ns in reversed(created):  # hosts first: deleting a host removes its veth pair
            _kill_ns_processes(ns)
            _try(["ip", "netns", "del", ns])
        # One that outlived _kill's wait (seen once under load: a SIGKILLed daemon still
        # there after 10 s) is gone once its namespace's processes are: reap it, or its
        # Popen warns "still running" when collected, in whichever test runs then.
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(KILL_WAIT)
        _open_networks.discard(self)


def _expect(proc: subprocess.Popen, word: str, timeout: float = 10) -> None:
    """Read one line from the relay; anything but ``word`` (a traceback, EOF) is an error."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    buf = b""
    deadline = time.monotonic() + timeout
    try:
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise RuntimeError(f"shaping relay: no {word!r} after {timeout} s: {buf!r}")
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
    finally:
        sel.close()
    if buf.strip() != word.encode():
        raise RuntimeError(f"shaping relay failed: {buf.decode(errors='replace').strip()}")


@atexit.register
def _close_all() -> None:
    """Tests that forget close() (or die in a fixture) do not leave namespaces behind."""
    for net in list(_open_networks):
        with contextlib.suppress(Exception):
            net.close()


# -- the shaping relay (run as a script in the switch namespace) ------------------------

_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_CLONE_NEWNET = 0x40000000
_RELAY_LIMIT = 100_000  # frames held at once per direction, like netem's limit


def _open_tap(name: str) -> int:
    """Create and attach a tap device in the current namespace (it goes when the fd closes)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", name.encode(), _IFF_TAP | _IFF_NO_PI))
    return fd


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _relay_main(host_ns: str, host_tap: str, switch_tap: str) -> None:
    """Carry frames between a host's tap and the switch's, each direction delayed, thinned
    and paced like netem (rate: serialise at `rate` bits/s, then add the delay)."""
    switch_tap_fd = _open_tap(switch_tap)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    _setns(host_ns)
    host_tap_fd = _open_tap(host_tap)  # stays in the host namespace once attached
    _setns(f"/proc/self/fd/{home}")  # back to the switch, where `ip netns pids` finds us
    os.close(home)
    print("ready", flush=True)
    delay, loss, rate = 0.0, 0.0, None
    peer = {host_tap_fd: switch_tap_fd, switch_tap_fd: host_tap_fd}
    busy_until = dict.fromkeys(peer, 0.0)
    held = dict.fromkeys(peer, 0)
    heap: list[tuple[float, int, int, bytes]] = []
    seq = itertools.count()
    sel = selectors.DefaultSelector()
    for fd in peer:
        sel.register(fd, selectors.EVENT_READ)
    sel.register(0, selectors.EVENT_READ)
    stdin = b""
    while True:
        timeout = max(0.0, heap[0][0] - time.monotonic()) if heap else None
        for key, _ in sel.select(timeout):
            fd = key.fd
            if fd == 0:
                data = os.read(0, 65536)
                if not data:
                    return  # the test process is gone
                stdin += data
                while b"\n" in stdin:
                    line, stdin = stdin.split(b"\n", 1)
                    p = json.loads(line)
                    delay, loss, rate = p["delay"], p["loss"], p["rate"]
                    print("ok", flush=True)
                continue
            for _ in range(256):
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if (loss and random.random() < loss) or held[fd] >= _RELAY_LIMIT:
                    continue
                t = time.monotonic()
                if rate:
                    t = busy_until[fd] = max(t, busy_until[fd]) + len(frame) * 8 / rate
                heapq.heappush(heap, (t + delay, next(seq), fd, frame))
                held[fd] += 1
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _, _, fd, frame = heapq.heappop(heap)
            held[fd] -= 1
            with contextlib.suppress(OSError):  # e.g. the switch port is partitioned
                os.write(peer[fd], frame)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "relay":
        _relay_main(*sys.argv[2:])
    else:
        sys.exit(f"usage: {sys.argv[0]} relay HOST_NS_PATH HOST_TAP SWITCH_TAP")
