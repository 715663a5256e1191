"""The emulated multi-host network (tests/helpers/netns.py), checked with real traffic
between hosts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers.netns import NetnsUnavailable, Network, netns_problem, remove_stale, shaper_problem

if (_problem := netns_problem()) is not None:
    pytest.skip(f"network namespaces unavailable: {_problem}", allow_module_level=True)

PORT = 7000

# argv: PORT. Echoes every connection until the peer closes it.
ECHO_SERVER = """
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
def echo(c):
    with c:
        while data := c.recv(1 << 16):
            c.sendall(data)
while True:
    threading.Thread(target=echo, args=(s.accept()[0],), daemon=True).start()
"""

# argv: HOST PORT TIMEOUT RETRY_FOR PINGS SIZE. Prints one JSON line: whether it connected
# (retrying for RETRY_FOR s), the round trips of PINGS 4-byte echoes and the time to echo
# SIZE bytes.
ECHO_CLIENT = """
import json, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
timeout, retry_for, pings, size = float(sys.argv[3]), float(sys.argv[4]), *map(int, sys.argv[5:7])
deadline = time.monotonic() + retry_for
while True:
    try:
        c = socket.create_connection((host, port), timeout)
        break
    except OSError as e:
        if time.monotonic() >= deadline:
            print(json.dumps({"ok": False, "error": repr(e)}))
            sys.exit()
        time.sleep(0.05)
c.settimeout(30)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(pings):
    t = time.monotonic()
    c.sendall(b"ping")
    got = b""
    while len(got) < 4:
        got += c.recv(4)
    rtts.append(time.monotonic() - t)
t = time.monotonic()
c.sendall(b"x" * size)
got = 0
while got < size:
    got += len(c.recv(1 << 20))
print(json.dumps({"ok": True, "rtts": rtts, "transfer": time.monotonic() - t}))
"""


def echo_server(net: Network, host: str, log: Path) -> subprocess.Popen:
    return net.run(host, [sys.executable, "-c", ECHO_SERVER, str(PORT)], log=log)


def echo(
    net: Network,
    src: str,
    dst: str,
    *,
    timeout: float = 0.5,
    retry_for: float = 0.0,
    pings: int = 0,
    size: int = 0,
) -> dict:
    """Run the echo client in host src against dst's server; its JSON report."""
    argv = [sys.executable, "-c", ECHO_CLIENT, net.address(dst), str(PORT)]
    argv += [str(timeout), str(retry_for), str(pings), str(size)]
    return json.loads(net.check_output(src, argv, timeout=60))


def reachable(net: Network, src: str, dst: str, retry_for: float = 0.0) -> bool:
    return echo(net, src, dst, retry_for=retry_for)["ok"]


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def gone(pid: int) -> bool:
    """No such process, or only a zombie (an orphan init has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.fixture(scope="module", autouse=True)
def _no_stale() -> None:
    remove_stale()


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Network]:
    """Hosts a, b and c; an echo server on a."""
    with Network(["a", "b", "c"]) as n:
        echo_server(n, "a", tmp_path / "echo.log")
        assert reachable(n, "b", "a", retry_for=10), (tmp_path / "echo.log").read_text()
        yield n


SHAPERS = [
    pytest.param(s, marks=pytest.mark.skipif(bool(why), reason=f"shaper {s}: {why}"))
    for s in ("relay", "netem")
    for why in [shaper_problem(s)]
]


@pytest.mark.timeout(30)
def test_hosts_talk_tcp_and_root_namespace_sees_nothing(net: Network) -> None:
    assert [net.address(h) for h in net.hosts] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
    report = echo(net, "c", "a", pings=3, size=1 << 20)
    assert report["ok"] and len(report["rtts"]) == 3
    out = net.check_output("b", ["ip", "-o", "-4", "addr", "show", "dev", "eth0"])
    assert "198.18.0.2/24" in out

    root_addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True)
    root_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    for h in net.hosts:
        assert f"{net.address(h)}/" not in root_addrs.stdout
    for port in ("v0-a", "v1-b", "v2-c", "br0"):
        assert f" {port}:" not in root_links.stdout and f" {port}@" not in root_links.stdout
    assert {net.namespace(h) for h in net.hosts} | {net.switch_ns} <= namespaces()


@pytest.mark.timeout(30)
def test_partition_cuts_a_host_off_and_heal_restores_it(net: Network) -> None:
    net.partition("a")
    assert not reachable(net, "b", "a")
    assert not reachable(net, "a", "b")  # both ways (b runs no server, but a gets no RST)
    net.run("c", [sys.executable, "-c", ECHO_SERVER, str(PORT)])
    assert reachable(net, "b", "c", retry_for=10)  # the others still talk
    net.heal("a")
    assert reachable(net, "b", "a", retry_for=5)
    assert reachable(net, "a", "c", retry_for=5)


@pytest.mark.timeout(30)
def test_cut_link_breaks_one_path_and_restore_link_mends_it(net: Network) -> None:
    net.run("c", [sys.executable, "-c", ECHO_SERVER, str(PORT)])
    assert reachable(net, "b", "c", retry_for=10)
    net.cut_link("a", "b")
    assert not reachable(net, "b", "a")
    assert not reachable(net, "a", "b")
    assert reachable(net, "b", "c") and reachable(net, "a", "c")  # both still reach c
    net.restore_link("a", "b")
    assert reachable(net, "b", "a", retry_for=5)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shaper", SHAPERS)
def test_shape_delays_both_directions_and_unshape_removes_it(shaper: str, tmp_path: Path) -> None:
    with Network(["a", "b"], shaper=shaper) as n:
        echo_server(n, "a", tmp_path / "echo.log")
        assert reachable(n, "b", "a", retry_for=10)
        n.shape("a", delay_ms=50)
        assert min(echo(n, "b", "a", pings=3)["rtts"]) >= 0.095  # 50 ms out + 50 ms back
        n.shape("a", delay_ms=20, rate="1gbit")  # replaces, does not add
        assert min(echo(n, "b", "a", pings=3)["rtts"]) >= 0.038
        n.shape("a")
        # Functional, not a speed check: the 40 ms the shaping adds are gone.
        assert min(echo(n, "b", "a", pings=3)["rtts"]) < 0.038


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shaper", SHAPERS)
def test_shape_rate_and_loss(shaper: str, tmp_path: Path) -> None:
    with Network(["a", "b"], shaper=shaper) as n:
        echo_server(n, "a", tmp_path / "echo.log")
        assert reachable(n, "b", "a", retry_for=10)
        n.shape("a", rate="8mbit")
        # 256 KiB each way at 8 Mbit/s is 0.26 s; the bucket's burst is 16 KiB.
        assert echo(n, "b", "a", size=256 << 10)["transfer"] >= 0.2
        n.shape("a", loss_pct=100)
        assert not reachable(n, "b", "a")
        n.shape("a")
        assert reachable(n, "b", "a", retry_for=5)


@pytest.mark.timeout(30)
def test_close_kills_everything_and_deletes_the_namespaces(tmp_path: Path) -> None:
    n = Network(["a", "b"], shaper="relay")
    names = {n.namespace("a"), n.namespace("b"), n.switch_ns}
    assert names <= namespaces()
    plain = n.run("a", ["sleep", "600"])
    stopped = n.run("b", ["sleep", "600"])
    os.kill(stopped.pid, signal.SIGSTOP)
    pidfile = tmp_path / "escaped.pid"  # a daemon that left our process group
    n.run("a", ["sh", "-c", f"setsid sleep 600 & echo $! > {pidfile}; wait"])
    n.shape("a", delay_ms=1)  # starts a relay process too
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    escaped = int(pidfile.read_text())
    relay = n._hosts["a"].relay
    assert relay is not None and relay.poll() is None

    n.close()
    assert plain.returncode == -signal.SIGKILL
    assert stopped.returncode == -signal.SIGKILL
    assert relay.returncode is not None
    assert gone(escaped)
    assert not names & namespaces()
    n.close()  # again: nothing to do, no error


@pytest.mark.timeout(30)
def test_close_runs_after_an_exception_in_the_with_block() -> None:
    with pytest.raises(RuntimeError, match="boom"), Network(["a"]) as n:
        proc = n.run("a", ["sleep", "600"])
        names = {n.namespace("a"), n.switch_ns}
        raise RuntimeError("boom")
    assert proc.returncode == -signal.SIGKILL
    assert not names & namespaces()


@pytest.mark.timeout(30)
def test_failed_construction_cleans_up_what_it_built() -> None:
    prefix = f"irt{os.getpid()}x{uuid.uuid4().hex[:6]}"
    squatter = f"{prefix}-b"  # someone else's namespace where host b's would go
    subprocess.run(["ip", "netns", "add", squatter], check=True)
    try:
        with pytest.raises(NetnsUnavailable, match="File exists"):
            Network(["a", "b", "c"], prefix=prefix)
        left = {ns for ns in namespaces() if ns.startswith(prefix)}
        assert left == {squatter}  # ours (sw, a) gone, the squatter's untouched
    finally:
        subprocess.run(["ip", "netns", "del", squatter], check=True)


@pytest.mark.timeout(30)
def test_remove_stale_deletes_namespaces_of_dead_creators_only() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"irt{dead.pid}n0-x", f"irt{os.getpid()}n999-y"
    for ns in (stale, live):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    leftover = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "600"])
    try:
        deadline = time.monotonic() + 10
        while (
            str(leftover.pid)
            not in subprocess.run(
                ["ip", "netns", "pids", stale], capture_output=True, text=True
            ).stdout.split()
        ):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        remove_stale()
        assert stale not in namespaces()
        assert live in namespaces()
        assert leftover.wait(10) == -signal.SIGKILL
    finally:
        leftover.kill()
        leftover.wait()
        for ns in (stale, live):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
